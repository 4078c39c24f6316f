#include "tools.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "cellgate/mutex.hpp"
#include "cellgate/util/text.hpp"
#include "content.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

constexpr const char* kDefaultSession = "default";
constexpr const char* kSessionPattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";

// kSessionPattern, checked by a scan: the name comes from the client, and its length is bounded
// before a character is looked at (no regex engine on client text).
bool is_session_name(const std::string& name) {
  auto alnum = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  };
  if (name.empty() || name.size() > 64 || !alnum(name.front())) {
    return false;
  }
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '_' || c == '.' || c == '-'; });
}

json session_property() {
  return {{"type", "string"},
          {"description",
           "Name of the session (a kernel that keeps its variables, imports and files between "
           "calls). Default \"default\"."},
          {"pattern", kSessionPattern}};
}

json object_schema(json properties, json required) {
  json s = {
      {"type", "object"}, {"properties", std::move(properties)}, {"additionalProperties", false}};
  if (!required.empty()) {
    s["required"] = std::move(required);
  }
  return s;
}

json annotations(bool read_only, bool destructive, bool idempotent) {
  json a = {{"readOnlyHint", read_only}, {"openWorldHint", false}};
  if (!read_only) {
    a["destructiveHint"] = destructive;
    a["idempotentHint"] = idempotent;
  }
  return a;
}

json tool_definitions() {
  const json nullable_string = {{"type", json::array({"string", "null"})}};
  json run_output = {
      {"type", "object"},
      {"properties",
       {{"session", {{"type", "string"}}},
        {"kernel_id", {{"type", "string"}}},
        {"kernel", {{"type", "string"}}},
        {"new_session", {{"type", "boolean"}}},
        {"status",
         {{"type", "string"},
          {"description", "ok, error (the code raised), timeout, aborted or dead"}}},
        {"execution_count", {{"type", json::array({"integer", "null"})}}},
        {"stdout", {{"type", "string"}}},
        {"stderr", {{"type", "string"}}},
        {"result", nullable_string},
        {"error",
         {{"type", json::array({"object", "null"})},
          {"properties",
           {{"ename", {{"type", "string"}}},
            {"evalue", {{"type", "string"}}},
            {"line", {{"type", "integer"}}}}}}},
        {"artifacts",
         {{"type", "array"},
          {"description", "images and PDFs the cell displayed, stored by SHA-256"},
          {"items", {{"type", "object"}}}}},
        {"files",
         {{"type", "array"},
          {"description", "work-dir files the cell created, changed or deleted"},
          {"items", {{"type", "object"}}}}},
        {"charts",
         {{"type", "array"},
          {"description", "the data of displayed charts, when the kernel reports it"},
          {"items", {{"type", "object"}}}}},
        {"notices", {{"type", "array"}}},
        {"state_lost", {{"type", "boolean"}}},
        {"truncated", {{"type", "object"}}},
        {"metrics", {{"type", "object"}}}}},
      {"required", json::array({"session", "status"})}};

  json file_entry = {{"type", "object"},
                     {"properties",
                      {{"name", {{"type", "string"}}},
                       {"path", {{"type", "string"}}},
                       {"type", {{"type", "string"}}},
                       {"size", {{"type", "integer"}}},
                       {"mtime", {{"type", "string"}}}}}};

  json tools = json::array();
  tools.push_back(
      {{"name", "run_code"},
       {"title", "Run code"},
       {"description",
        "Run code in a named session: a Jupyter kernel (Python unless another kernel or "
        "language is asked for) in a jail with no network. Variables, imports and files persist "
        "between calls in the same session; the session starts on first use. Answers with "
        "stdout and stderr, the value of the last expression, the error and its traceback, "
        "every displayed image (matplotlib figures) as PNG, and chart data when available. "
        "The working directory is the session's work dir (see list_files)."},
       {"inputSchema",
        object_schema({{"code", {{"type", "string"}, {"description", "The code to run."}}},
                       {"session", session_property()},
                       {"timeout",
                        {{"type", "number"},
                         {"exclusiveMinimum", 0},
                         {"description",
                          "Seconds before the cell is interrupted (default 30; the server caps "
                          "it). State is kept unless the kernel has to be restarted."}}},
                       {"kernel",
                        {{"type", "string"},
                         {"description",
                          "Kernelspec name (e.g. python3, ir); only when the session starts."}}},
                       {"language",
                        {{"type", "string"},
                         {"description",
                          "Language (e.g. python, r) when no kernel is named; only when the "
                          "session starts."}}},
                       {"stdin",
                        {{"type", "array"},
                         {"items", {{"type", "string"}}},
                         {"description", "Lines answering input(), in order."}}}},
                      json::array({"code"}))},
       {"outputSchema", run_output},
       {"annotations", annotations(false, true, false)}});
  tools.push_back(
      {{"name", "list_files"},
       {"title", "List files"},
       {"description", "List a directory of the session's work dir (the kernel's cwd)."},
       {"inputSchema", object_schema({{"session", session_property()},
                                      {"path",
                                       {{"type", "string"},
                                        {"description",
                                         "Directory relative to the work dir; default the "
                                         "work dir itself."}}}},
                                     json::array())},
       {"outputSchema",
        {{"type", "object"},
         {"properties",
          {{"session", {{"type", "string"}}},
           {"path", {{"type", "string"}}},
           {"entries", {{"type", "array"}, {"items", file_entry}}},
           {"truncated", {{"type", "boolean"}}}}},
         {"required", json::array({"session", "path", "entries"})}}},
       {"annotations", annotations(true, false, true)}});
  tools.push_back(
      {{"name", "read_file"},
       {"title", "Read a file"},
       {"description",
        "Read a file of the session's work dir: text as text, PNG/JPEG/GIF as an image, other "
        "binary files as a base64 resource."},
       {"inputSchema", object_schema({{"session", session_property()},
                                      {"path",
                                       {{"type", "string"},
                                        {"description", "File path relative to the work dir."}}}},
                                     json::array({"path"}))},
       {"annotations", annotations(true, false, true)}});
  tools.push_back(
      {{"name", "write_file"},
       {"title", "Write a file"},
       {"description",
        "Create or replace a file in the session's work dir (parent directories are made; the "
        "session starts if it has not yet)."},
       {"inputSchema",
        object_schema(
            {{"session", session_property()},
             {"path", {{"type", "string"}, {"description", "File path relative to the work dir."}}},
             {"content", {{"type", "string"}, {"description", "The file's content."}}},
             {"encoding",
              {{"type", "string"},
               {"enum", json::array({"text", "base64"})},
               {"description", "How content is encoded (default text)."}}}},
            json::array({"path", "content"}))},
       {"annotations", annotations(false, true, true)}});
  tools.push_back(
      {{"name", "restart_session"},
       {"title", "Restart a session"},
       {"description",
        "Restart the session's kernel: variables and imports are lost, work-dir files stay."},
       {"inputSchema", object_schema({{"session", session_property()}}, json::array())},
       {"annotations", annotations(false, true, false)}});
  tools.push_back(
      {{"name", "close_session"},
       {"title", "Close a session"},
       {"description", "Shut the session's kernel down; its variables and work dir are gone."},
       {"inputSchema", object_schema({{"session", session_property()}}, json::array())},
       {"annotations", annotations(false, true, true)}});
  tools.push_back(
      {{"name", "snapshot_session"},
       {"title", "Snapshot a session"},
       {"description",
        "Save the session's kernel state (variables, imports, work-dir files) while it keeps "
        "running; restore_snapshot starts a new session from it. Needs an idle session."},
       {"inputSchema", object_schema({{"session", session_property()}}, json::array())},
       {"annotations", annotations(false, false, false)}});
  tools.push_back(
      {{"name", "fork_session"},
       {"title", "Fork a session"},
       {"description",
        "Copy the session into a new session: the copy starts with the same variables, imports "
        "and work-dir files, and from then on each changes on its own (try two ideas from one "
        "state). Needs an idle session."},
       {"inputSchema",
        object_schema({{"session", session_property()},
                       {"into",
                        {{"type", "string"},
                         {"description", "Name of the new session (must not exist yet)."},
                         {"pattern", kSessionPattern}}}},
                      json::array({"into"}))},
       {"annotations", annotations(false, false, false)}});
  tools.push_back(
      {{"name", "restore_snapshot"},
       {"title", "Start a session from a snapshot"},
       {"description",
        "Start a new session whose kernel is a copy of a snapshot (snapshot_session's id)."},
       {"inputSchema",
        object_schema({{"snapshot", {{"type", "string"}, {"description", "The snapshot id."}}},
                       {"session", session_property()}},
                      json::array({"snapshot"}))},
       {"annotations", annotations(false, false, false)}});
  tools.push_back({{"name", "list_sessions"},
                   {"title", "List sessions"},
                   {"description", "The sessions open in this MCP connection, with their kernels."},
                   {"inputSchema", object_schema(json::object(), json::array())},
                   {"outputSchema",
                    {{"type", "object"},
                     {"properties",
                      {{"sessions",
                        {{"type", "array"},
                         {"items",
                          {{"type", "object"},
                           {"properties",
                            {{"name", {{"type", "string"}}},
                             {"kernel_id", {{"type", "string"}}},
                             {"kernel", {{"type", "string"}}}}}}}}}}},
                     {"required", json::array({"sessions"})}}},
                   {"annotations", annotations(true, false, true)}});
  return tools;
}

// A tool's arguments, checked against what its input schema allows; the first problem is kept
// as the tool error (the model reads it and tries again).
class Args {
 public:
  Args(const json& args, const json& schema) : args_(args) {
    for (const auto& [key, value] : args.items()) {
      if (!schema["properties"].contains(key)) {
        fail("unknown argument '" + key + "'");
      }
    }
  }
  std::string str(const std::string& name, bool required, std::string fallback = "") {
    auto it = args_.find(name);
    if (it == args_.end() || it->is_null()) {
      if (required) {
        fail("'" + name + "' (a string) is required");
      }
      return fallback;
    }
    if (!it->is_string()) {
      fail("'" + name + "' must be a string");
      return fallback;
    }
    return it->get<std::string>();
  }
  std::string session() {
    std::string name = str("session", false, kDefaultSession);
    if (!is_session_name(name)) {
      fail(
          "'session' must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or "
          "digit");
    }
    return name;
  }
  const std::string& error() const { return error_; }
  bool ok() const { return error_.empty(); }
  void fail(const std::string& e) {
    if (error_.empty()) {
      error_ = e;
    }
  }

 private:
  const json& args_;
  std::string error_;
};

const json& schema_of(const json& definitions, const std::string& name) {
  for (const auto& t : definitions) {
    if (t["name"] == name) {
      return t["inputSchema"];
    }
  }
  static const json empty = {{"properties", json::object()}};
  return empty;
}

std::string lower(std::string s) {
  for (auto& c : s) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

json tool_error(const std::string& message) {
  return text_result(message, true);
}

}  // namespace

// A tool call's cancel hook: the cell, once there is one. A cancel that comes first is kept and
// applied when the cell starts.
class Tools::Pending : public client::Cell {
 public:
  void cancel() override {
    std::shared_ptr<client::Cell> cell;
    {
      MutexLock lock(mu_);
      cancelled_ = true;
      cell = cell_;
    }
    if (cell) {
      cell->cancel();
    }
  }
  void set(std::shared_ptr<client::Cell> cell) {
    bool cancel_now = false;
    {
      MutexLock lock(mu_);
      cell_ = cell;
      cancel_now = cancelled_;
    }
    if (cancel_now && cell) {
      cell->cancel();
    }
  }
  bool cancelled() const {
    MutexLock lock(mu_);
    return cancelled_;
  }

 private:
  mutable Mutex mu_;
  bool cancelled_ CELLGATE_GUARDED_BY(mu_) = false;
  std::shared_ptr<client::Cell> cell_ CELLGATE_GUARDED_BY(mu_);
};

Tools::Tools(client::Kernels& kernels, util::Offload offload, ServerOptions options)
    : kernels_(kernels),
      offload_(std::move(offload)),
      options_(std::move(options)),
      definitions_(tool_definitions()) {}

bool Tools::has(const std::string& name) const {
  return std::any_of(definitions_.begin(), definitions_.end(),
                     [&](const json& t) { return t["name"] == name; });
}

std::shared_ptr<client::Cell> Tools::call(const std::string& name, const json& arguments,
                                          ToolCall call) {
  auto pending = std::make_shared<Pending>();
  if (name == "run_code") {
    run_code(arguments, std::move(call), pending);
    return pending;
  }
  offload_([this, name, arguments, call = std::move(call)] {
    json result;
    try {
      result = (name == "list_files" || name == "read_file" || name == "write_file")
                   ? files_tool(name, arguments, *call.conversation)
                   : session_tool(name, arguments, *call.conversation);
    } catch (const std::exception& e) {  // nlohmann's, from a value of an unexpected shape
      result = tool_error(std::string("internal error: ") + e.what());
    }
    call.done(std::move(result));
  });
  return pending;
}

Result<void> Tools::tenant_may_start(const Conversation& c) const {
  if (c.tenant.empty() || !options_.tenant_may_start) {
    return ok_result();
  }
  return options_.tenant_may_start(c.tenant);
}

void Tools::tenant_owns(const Conversation& c, const std::string& kernel_id) const {
  if (!c.tenant.empty() && options_.tenant_owns) {
    options_.tenant_owns(c.tenant, kernel_id);
  }
}

Result<std::pair<Conversation::Named, bool>> Tools::ensure(Conversation& c, const std::string& name,
                                                           bool create, const std::string& kernel,
                                                           const std::string& language) {
  MutexLock start_lock(c.start_mu);
  auto mismatch = [&](const Conversation::Named& n) -> std::string {
    if (!kernel.empty() && kernel != n.kernelspec) {
      return "session '" + name + "' runs kernel " + n.kernelspec + ", not " + kernel +
             "; close it first or use another session name";
    }
    if (!language.empty() && lower(language) != lower(n.language) &&
        !(lower(language) == "python" && lower(n.language).rfind("python", 0) == 0)) {
      return "session '" + name + "' runs " + n.language + " (" + n.kernelspec + "), not " +
             language + "; close it first or use another session name";
    }
    return "";
  };
  {
    MutexLock lock(c.mu);
    if (c.closed) {
      return make_error(ErrorCode::kFailedPrecondition, "closed", "the MCP session has ended");
    }
    if (auto it = c.sessions.find(name); it != c.sessions.end()) {
      if (auto why = mismatch(it->second); !why.empty()) {
        return make_error(ErrorCode::kInvalidArgument, "kernel_mismatch", why);
      }
      return std::make_pair(it->second, false);
    }
    if (!create) {
      return make_error(ErrorCode::kNotFound, "no_session",
                        "no session named '" + name +
                            "' (run_code or write_file starts one; list_sessions lists them)");
    }
    if (c.sessions.size() >= options_.max_sessions) {
      return make_error(ErrorCode::kResourceExhausted, "too_many_sessions",
                        "at most " + std::to_string(options_.max_sessions) +
                            " sessions at once; close_session one first");
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(client::KernelSpecs specs, kernels_.kernelspecs());
  const client::KernelSpecs::Spec* chosen = nullptr;
  std::string available;
  for (const auto& s : specs.specs) {
    available += (available.empty() ? "" : ", ") + s.name + " (" + s.language + ")";
    if (!kernel.empty()     ? s.name == kernel
        : !language.empty() ? lower(s.language) == lower(language)
                            : s.name == specs.default_name) {
      if (chosen == nullptr || s.name == specs.default_name) {
        chosen = &s;
      }
    }
  }
  if (chosen == nullptr) {
    return make_error(ErrorCode::kNotFound, "no_kernelspec",
                      (!kernel.empty()     ? "no kernel named '" + kernel + "'"
                       : !language.empty() ? "no kernel for language '" + language + "'"
                                           : std::string("no default kernel")) +
                          "; available: " + available);
  }
  Conversation::Named named{"", chosen->name, chosen->language};
  CELLGATE_TRY(tenant_may_start(c));
  CELLGATE_ASSIGN_OR_RETURN(named.kernel_id, kernels_.start(chosen->name));
  tenant_owns(c, named.kernel_id);
  bool closed = false;
  {
    MutexLock lock(c.mu);
    closed = c.closed;
    if (!closed) {
      c.sessions[name] = named;
    }
  }
  if (closed) {
    (void)kernels_.shutdown(named.kernel_id);
    return make_error(ErrorCode::kFailedPrecondition, "closed", "the MCP session has ended");
  }
  spdlog::info("mcp: session '{}' started kernel {} ({})", name, named.kernel_id, named.kernelspec);
  return std::make_pair(named, true);
}

void Tools::run_code(const json& args, ToolCall call, std::shared_ptr<Pending> pending) {
  Args a(args, schema_of(definitions_, "run_code"));
  const std::string code = a.str("code", true);
  const std::string name = a.session();
  const std::string kernel = a.str("kernel", false);
  const std::string language = a.str("language", false);
  json request = {{"code", code}};
  if (auto t = args.find("timeout"); t != args.end() && !t->is_null()) {
    if (!t->is_number() || t->get<double>() <= 0) {
      a.fail("'timeout' must be a positive number of seconds");
    } else {
      request["timeout"] = *t;
    }
  }
  if (auto s = args.find("stdin"); s != args.end() && !s->is_null()) {
    const bool lines = s->is_array() && std::all_of(s->begin(), s->end(),
                                                    [](const json& l) { return l.is_string(); });
    if (!lines) {
      a.fail("'stdin' must be an array of strings");
    } else {
      request["stdin"] = *s;
    }
  }
  if (!a.ok()) {
    call.done(tool_error(a.error()));
    return;
  }
  offload_([this, name, kernel, language, request = std::move(request), call = std::move(call),
            pending]() mutable {
    if (pending->cancelled()) {
      call.done(tool_error("cancelled before it ran"));
      return;
    }
    auto ensured = ensure(*call.conversation, name, true, kernel, language);
    if (!ensured) {
      call.done(tool_error(ensured.error().message));
      return;
    }
    auto [named, fresh] = std::move(ensured).value();
    run_in(name, std::move(request), std::move(named), fresh, "", std::move(call),
           std::move(pending), false);
  });
}

void Tools::run_in(const std::string& name, json request, Conversation::Named named, bool fresh,
                   std::string note, ToolCall call, std::shared_ptr<Pending> pending,
                   bool retried) {
  client::CellCallbacks callbacks;
  if (call.keepalive) {
    // A progress notification is written to a pipe or a socket, and a local cell's callbacks
    // run on its strand, which must not block: it goes to the offload pool.
    callbacks.on_keepalive = [tick = call.keepalive, offload = offload_] { offload(tick); };
  }
  const json request_copy = request;
  callbacks.done = [this, name, request = request_copy, named, fresh, note, call, pending,
                    retried](Result<execute::CellResult> answer) mutable {
    // Off the cell's strand: building the result (base64 images) and writing it may take time.
    offload_([this, name, request = std::move(request), named, fresh, note = std::move(note),
              call = std::move(call), pending, retried, answer = std::move(answer)]() mutable {
      if (!answer && answer.error().code == ErrorCode::kNotFound && !retried &&
          !pending->cancelled()) {
        // The kernel is gone (culled, or deleted through the Jupyter API): forget it and start
        // a fresh one under the same name, once, saying so.
        {
          MutexLock lock(call.conversation->mu);
          auto it = call.conversation->sessions.find(name);
          if (it != call.conversation->sessions.end() && it->second.kernel_id == named.kernel_id) {
            call.conversation->sessions.erase(it);
          }
        }
        auto ensured = ensure(*call.conversation, name, true, named.kernelspec, "");
        if (!ensured) {
          call.done(tool_error(ensured.error().message));
          return;
        }
        run_in(name, std::move(request), ensured->first, true,
               "session '" + name +
                   "' had lost its kernel (shut down or culled); this is a new "
                   "kernel, so earlier variables are gone",
               std::move(call), std::move(pending), true);
        return;
      }
      if (!answer) {
        call.done(tool_error(answer.error().message));
        return;
      }
      RunInfo info{name, named.kernel_id, named.kernelspec, fresh, note};
      call.done(run_code_result(*answer, info, kernels_.artifact_base()));
    });
  };
  // run_code checked the arguments; the seam clamps the timeout to its maximum.
  auto typed = execute::ExecuteRequest::from_json(request, std::numeric_limits<double>::infinity());
  if (!typed) {
    callbacks.done(std::move(typed).error());
    return;
  }
  pending->set(kernels_.execute(named.kernel_id, std::move(typed).value(), std::move(callbacks)));
}

json Tools::files_tool(const std::string& tool, const json& args, Conversation& c) {
  Args a(args, schema_of(definitions_, tool));
  const std::string name = a.session();
  if (tool == "list_files") {
    const std::string path = a.str("path", false);
    if (!a.ok()) {
      return tool_error(a.error());
    }
    auto named = ensure(c, name, false, "", "");
    if (!named) {
      return tool_error(named.error().message);
    }
    auto listing = kernels_.list_files(named->first.kernel_id, path);
    if (!listing) {
      return tool_error(listing.error().message);
    }
    std::string text;
    const json entries = listing->value("entries", json::array());
    for (const auto& e : entries) {
      const std::string type = e.value("type", std::string("file"));
      text += e.value("path", std::string()) + (type == "directory" ? "/" : "");
      if (type == "file") {
        text += "  (" + std::to_string(e.value("size", std::uint64_t{0})) + " bytes)";
      }
      text += "\n";
    }
    if (entries.empty()) {
      text = "(empty directory)\n";
    }
    if (listing->value("truncated", false)) {
      text += "(truncated: there are more entries)\n";
    }
    json structured = {{"session", name},
                       {"path", listing->value("path", path)},
                       {"entries", entries},
                       {"truncated", listing->value("truncated", false)}};
    return text_result(text, false, std::move(structured));
  }
  const std::string path = a.str("path", true);
  if (tool == "read_file") {
    if (!a.ok()) {
      return tool_error(a.error());
    }
    auto named = ensure(c, name, false, "", "");
    if (!named) {
      return tool_error(named.error().message);
    }
    auto bytes = kernels_.read_file(named->first.kernel_id, path);
    if (!bytes) {
      return tool_error(bytes.error().message);
    }
    return file_result(path, *bytes,
                       json{{"session", name}, {"path", path}, {"size", bytes->size()}});
  }
  // write_file
  std::string content = a.str("content", true);
  const std::string encoding = a.str("encoding", false, "text");
  if (encoding != "text" && encoding != "base64") {
    a.fail("'encoding' must be \"text\" or \"base64\"");
  }
  if (!a.ok()) {
    return tool_error(a.error());
  }
  if (encoding == "base64") {
    auto decoded = base64_decode(content, Base64Spaces::kAnyWhitespace);
    if (!decoded) {
      return tool_error("'content' is not valid base64: " + decoded.error().message);
    }
    content = std::move(decoded).value();
  }
  auto named = ensure(c, name, true, "", "");
  if (!named) {
    return tool_error(named.error().message);
  }
  auto entry = kernels_.write_file(named->first.kernel_id, path, content);
  if (!entry) {
    return tool_error(entry.error().message);
  }
  json structured = *entry;
  structured["session"] = name;
  return text_result(
      "wrote " + entry->value("path", path) + " (" + std::to_string(content.size()) + " bytes)",
      false, std::move(structured));
}

json Tools::session_tool(const std::string& tool, const json& args, Conversation& c) {
  Args a(args, schema_of(definitions_, tool));
  if (tool == "list_sessions") {
    if (!a.ok()) {
      return tool_error(a.error());
    }
    json sessions = json::array();
    std::string text;
    {
      MutexLock lock(c.mu);
      for (const auto& [name, n] : c.sessions) {
        sessions.push_back({{"name", name}, {"kernel_id", n.kernel_id}, {"kernel", n.kernelspec}});
        text += name + "  " + n.kernelspec + "  " + n.kernel_id + "\n";
      }
    }
    if (text.empty()) {
      text = "(no sessions; run_code starts one)\n";
    }
    return text_result(text, false, json{{"sessions", std::move(sessions)}});
  }
  const std::string name = a.session();
  if (!a.ok()) {
    return tool_error(a.error());
  }
  if (tool == "restart_session") {
    auto named = ensure(c, name, false, "", "");
    if (!named) {
      return tool_error(named.error().message);
    }
    auto restarted = kernels_.restart(named->first.kernel_id);
    if (!restarted) {
      if (restarted.error().code == ErrorCode::kNotFound) {
        MutexLock lock(c.mu);
        c.sessions.erase(name);
        return tool_error("session '" + name +
                          "' had lost its kernel (shut down or culled); "
                          "run_code starts a new one");
      }
      return tool_error(restarted.error().message);
    }
    return text_result(
        "restarted session '" + name + "': variables and imports are gone, work-dir files stay",
        false,
        json{{"session", name},
             {"kernel_id", named->first.kernel_id},
             {"kernel", named->first.kernelspec}});
  }
  if (!c.tenant.empty() && (tool == "snapshot_session" || tool == "restore_snapshot")) {
    return tool_error(
        "snapshots are the operator's: a tenant's API key cannot take or restore "
        "them here (E2B's createSnapshot can)");
  }
  if (tool == "snapshot_session") {
    auto named = ensure(c, name, false, "", "");
    if (!named) {
      return tool_error(named.error().message);
    }
    auto snap = kernels_.snapshot(named->first.kernel_id);
    if (!snap) {
      return tool_error(snap.error().message);
    }
    return text_result("snapshot " + *snap + " of session '" + name +
                           "' saved; restore_snapshot starts a session from it",
                       false, json{{"session", name}, {"snapshot", *snap}});
  }
  if (tool == "fork_session" || tool == "restore_snapshot") {
    // The new session's name: `into` for a fork, `session` for a restore.
    std::string target = name;
    std::string snapshot;
    if (tool == "fork_session") {
      target = a.str("into", true);
      if (!is_session_name(target)) {
        a.fail("'into' must be a session name: 1-64 letters, digits, '_', '-' or '.'");
      }
    } else {
      snapshot = a.str("snapshot", true);
    }
    if (!a.ok()) {
      return tool_error(a.error());
    }
    std::optional<Conversation::Named> source;
    if (tool == "fork_session") {
      auto named = ensure(c, name, false, "", "");
      if (!named) {
        return tool_error(named.error().message);
      }
      source = named->first;
    }
    MutexLock start_lock(c.start_mu);
    {
      MutexLock lock(c.mu);
      if (c.sessions.count(target) != 0) {
        return tool_error("a session named '" + target + "' is already open; choose another name");
      }
      if (c.sessions.size() >= options_.max_sessions) {
        return tool_error("at most " + std::to_string(options_.max_sessions) +
                          " sessions at once; close_session one first");
      }
    }
    Conversation::Named copy;
    if (auto may = tenant_may_start(c); !may) {
      return tool_error(may.error().message);
    }
    if (source) {
      auto ids = kernels_.fork(source->kernel_id, 1);
      if (!ids) {
        return tool_error(ids.error().message);
      }
      copy = Conversation::Named{ids->front(), source->kernelspec, source->language};
      tenant_owns(c, copy.kernel_id);
    } else {
      auto started = kernels_.start_from_snapshot(snapshot);
      if (!started) {
        return tool_error(started.error().message);
      }
      copy.kernel_id = started->id;
      copy.kernelspec = started->kernelspec;
      if (auto specs = kernels_.kernelspecs()) {
        for (const auto& spec : specs->specs) {
          if (spec.name == copy.kernelspec) {
            copy.language = spec.language;
          }
        }
      }
    }
    {
      MutexLock lock(c.mu);
      c.sessions[target] = copy;
    }
    spdlog::info("mcp: session '{}' {} (kernel {})", target,
                 source ? "forked from '" + name + "'" : "restored from snapshot " + snapshot,
                 copy.kernel_id);
    return text_result(
        source ? "session '" + target + "' is a copy of '" + name + "'"
               : "session '" + target + "' started from snapshot " + snapshot,
        false,
        json{{"session", target}, {"kernel_id", copy.kernel_id}, {"kernel", copy.kernelspec}});
  }
  // close_session: idempotent, so closing twice is not an error.
  std::optional<Conversation::Named> closing;
  {
    MutexLock start_lock(c.start_mu);
    MutexLock lock(c.mu);
    if (auto it = c.sessions.find(name); it != c.sessions.end()) {
      closing = it->second;
      c.sessions.erase(it);
    }
  }
  if (!closing) {
    return text_result("no session named '" + name + "' is open; nothing to close", false,
                       json{{"session", name}, {"closed", false}});
  }
  auto down = kernels_.shutdown(closing->kernel_id);
  if (!down && down.error().code != ErrorCode::kNotFound) {
    return tool_error("closing session '" + name + "': " + down.error().message);
  }
  spdlog::info("mcp: session '{}' closed (kernel {})", name, closing->kernel_id);
  return text_result("closed session '" + name + "'", false,
                     json{{"session", name}, {"closed", true}, {"kernel_id", closing->kernel_id}});
}

void Tools::close_all(Conversation& c) {
  std::map<std::string, Conversation::Named> sessions;
  std::map<std::string, std::shared_ptr<client::Cell>> in_flight;
  {
    MutexLock start_lock(c.start_mu);
    MutexLock lock(c.mu);
    c.closed = true;
    sessions.swap(c.sessions);
    in_flight.swap(c.in_flight);
  }
  for (auto& [id, cell] : in_flight) {
    if (cell) {  // null: a placeholder whose tool has not handed back its hook yet
      cell->cancel();
    }
  }
  for (const auto& [name, n] : sessions) {
    if (auto down = kernels_.shutdown(n.kernel_id); !down) {
      spdlog::warn("mcp: shutting down session '{}' (kernel {}): {}", name, n.kernel_id,
                   down.error().message);
    }
  }
}

}  // namespace cellgate::mcp
