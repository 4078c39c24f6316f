#include "cellgate/execute/executor.hpp"

#include <future>
#include <thread>

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "cellgate/protocol/message.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/store/files.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::execute {
namespace {

using kernels::KernelRegistry;
using kernels::ManagedKernel;
using store::ArtifactStore;
using store::AuditLog;
using store::sha256_hex;
namespace files = store::files;

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kernel::Channel;

constexpr std::size_t kSnapshotEntries = 10000;  // work-dir entries compared before and after

std::size_t bundle_size(const json& data) {
  std::size_t n = 0;
  if (data.is_object()) {
    for (const auto& [mime, value] : data.items()) {
      n += mime.size() + (value.is_string() ? value.get_ref<const std::string&>().size()
                                            : value.dump().size());
    }
  }
  return n;
}

long long to_ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// Everything one cell produced, capped as it arrives, and the events it sends on. Shared with the
// kernel client's I/O thread, which may still deliver after the answer went out.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  ExecuteLimits limits;
  std::deque<std::string> stdin_lines;
  // Weak: the handlers below run on the client's I/O thread, and must never hold its last
  // reference (its destructor would join that very thread).
  std::weak_ptr<kernel::KernelClient> client;
  std::function<void(const json&)> sink;
  ArtifactStore* store = nullptr;
  std::string kernel_id;

  std::string out[2];  // stdout, stderr
  bool out_truncated[2] = {false, false};
  bool outputs_truncated = false;
  std::size_t dropped_bytes = 0;
  std::size_t output_bytes = 0;  // display data kept
  json outputs = json::array();
  std::map<std::string, std::vector<std::size_t>> displays;  // display_id → output indices
  json result;  // null
  json error;   // null
  json artifacts = json::array();
  json notices = json::array();
  std::set<std::string> noticed;  // reasons already noticed, so each is said once
  json execution_count;           // from execute_input, for artifacts of display_data
  std::optional<json> reply;
  bool done = false;
  Clock::time_point last_keepalive = Clock::now();
  kernel::RequestEnd end = kernel::RequestEnd::kComplete;

  // Called with mu held.
  void emit(const json& event) {
    if (sink) {
      sink(event);
    }
  }

  void notice(const std::string& key, const std::string& message) {
    if (noticed.insert(key).second) {
      notices.push_back(message);
      emit(json{{"type", "notice"}, {"message", message}});
    }
  }

  bool add_output(json output) {
    if (outputs.size() >= limits.outputs) {
      outputs_truncated = true;
      dropped_bytes += output.dump().size();
      notice("outputs", "more than " + std::to_string(limits.outputs) +
                            " outputs: later ones are dropped");
      return false;
    }
    outputs.push_back(std::move(output));
    return true;
  }

  void on_stream(const json& c) {
    const int which = c.value("name", "stdout") == "stderr" ? 1 : 0;
    const std::string& text = c.contains("text") && c["text"].is_string()
                                  ? c["text"].get_ref<const std::string&>()
                                  : std::string();
    std::string& buf = out[which];
    const std::size_t room = limits.stream_bytes > buf.size() ? limits.stream_bytes - buf.size() : 0;
    const std::string kept = text.substr(0, room);
    const char* name = which == 1 ? "stderr" : "stdout";
    if (kept.size() < text.size()) {
      out_truncated[which] = true;
      dropped_bytes += text.size() - kept.size();
      notice(name, std::string(name) + " is over the per-cell limit of " +
                       std::to_string(limits.stream_bytes) + " bytes: the rest is dropped");
    }
    if (kept.empty()) {
      return;
    }
    buf += kept;
    emit(json{{"type", "stream"}, {"name", name}, {"text", kept}});
    // nbformat keeps consecutive text of one stream in one output.
    if (!outputs.empty() && outputs.back().value("output_type", "") == "stream" &&
        outputs.back().value("name", "") == name) {
      outputs.back()["text"].get_ref<std::string&>() += kept;  // no copy of what is there
    } else {
      add_output(json{{"output_type", "stream"}, {"name", name}, {"text", kept}});
    }
  }

  // Stores the bundle's images and PDFs; returns their records.
  json store_artifacts(const json& data) {
    json records = json::array();
    if (store == nullptr || !data.is_object()) {
      return records;
    }
    for (const auto& [mime, value] : data.items()) {
      if (!ArtifactStore::is_artifact_mime(mime)) {
        continue;
      }
      auto record = store->put(kernel_id, execution_count, mime, value);
      if (record) {
        records.push_back(record->to_json());
        artifacts.push_back(record->to_json());
      } else if (record.error().reason == "artifact_cap") {
        notice("artifact_cap", record.error().message);
      } else {
        notice("artifact_" + record.error().reason,
               "an " + mime + " output was not kept as an artifact: " + record.error().message);
      }
    }
    return records;
  }

  void on_bundle(const std::string& type, const json& c) {
    json data = c.value("data", json::object());
    json metadata = c.value("metadata", json::object());
    std::string display_id;
    if (auto t = c.find("transient"); t != c.end() && t->is_object()) {
      display_id = t->value("display_id", "");
    }
    const std::size_t size = bundle_size(data);
    json records = json::array();
    if (size > limits.output_bytes) {
      outputs_truncated = true;
      dropped_bytes += size;
      notice("output_bytes", "an output of " + std::to_string(size) +
                                 " bytes is over the per-output limit of " +
                                 std::to_string(limits.output_bytes) + " bytes and was dropped");
      data = json{{"text/plain", "<" + std::to_string(size) + " bytes of output dropped: over the "
                                 "per-output limit of " + std::to_string(limits.output_bytes) +
                                 " bytes>"}};
    } else {
      records = store_artifacts(data);
    }
    json event = {{"type", type}, {"data", data}, {"metadata", metadata}};
    if (type == "execute_result") {
      event["execution_count"] = c.value("execution_count", json());
    }
    if (!display_id.empty()) {
      event["display_id"] = display_id;
    }
    if (!records.empty()) {
      event["artifacts"] = records;
    }
    emit(event);
    if (type == "update_display_data") {
      // nbformat has no update: the displays it names change in place.
      for (std::size_t i : displays[display_id]) {
        if (i < outputs.size()) {
          outputs[i]["data"] = data;
          outputs[i]["metadata"] = metadata;
        }
      }
      return;
    }
    json output = {{"output_type", type == "execute_result" ? "execute_result" : "display_data"},
                   {"data", data},
                   {"metadata", metadata}};
    if (type == "execute_result") {
      output["execution_count"] = c.value("execution_count", json());
      result = data;
    }
    if (add_output(std::move(output)) && !display_id.empty()) {
      displays[display_id].push_back(outputs.size() - 1);
    }
  }

  void on_error(const json& c) {
    std::vector<std::string> traceback;
    if (auto t = c.find("traceback"); t != c.end() && t->is_array()) {
      for (const auto& line : *t) {
        if (line.is_string()) {
          traceback.push_back(strip_ansi(line.get<std::string>()));
        }
      }
    }
    error = json{{"ename", c.value("ename", "")},
                 {"evalue", c.value("evalue", "")},
                 {"traceback", traceback}};
    if (int line = failing_line(traceback); line > 0) {
      error["line"] = line;
    }
    json event = error;
    event["type"] = "error";
    emit(event);
    add_output(json{{"output_type", "error"},
                    {"ename", c.value("ename", "")},
                    {"evalue", c.value("evalue", "")},
                    {"traceback", traceback}});
  }

  void on_message(Channel channel, const protocol::Message& msg) {
    const std::string type = msg.msg_type();
    std::unique_lock lock(mu);
    if (channel == Channel::kShell && type == "execute_reply") {
      reply = msg.content;
    } else if (channel == Channel::kStdin && type == "input_request") {
      std::string answer;
      if (!stdin_lines.empty()) {
        answer = std::move(stdin_lines.front());
        stdin_lines.pop_front();
      }
      auto c = client.lock();
      lock.unlock();
      if (c) {
        c->send_input(msg, answer);
      }
    } else if (type == "execute_input") {
      execution_count = msg.content.value("execution_count", json());
    } else if (type == "stream") {
      on_stream(msg.content);
    } else if (type == "execute_result" || type == "display_data" ||
               type == "update_display_data") {
      on_bundle(type, msg.content);
    } else if (type == "error") {
      on_error(msg.content);
    } else if (type == "clear_output") {
      const bool wait = msg.content.value("wait", false);
      emit(json{{"type", "clear_output"}, {"wait", wait}});
      outputs = json::array();
      displays.clear();
    }
  }
};

// Runs `code` silently (no outputs, no history) and waits for its reply until `deadline`.
Result<void> run_silent(kernel::KernelClient& client, const std::string& code,
                        Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    return make_error(ErrorCode::kDeadlineExceeded, "timeout", "no time left before the cell");
  }
  json content = kernel::execute_content(code, false, false, true);
  content["stop_on_error"] = false;
  CELLGATE_ASSIGN_OR_RETURN(auto collected,
                            client.request(Channel::kShell, "execute_request", std::move(content),
                                           left, /*wait_for_idle=*/false));
  if (!collected.reply || collected.reply->content.value("status", "") != "ok") {
    const std::string evalue =
        collected.reply ? collected.reply->content.value("evalue", "") : std::string("no reply");
    return make_error(ErrorCode::kInternal, "setup_failed", "setting up the cell failed: " + evalue);
  }
  return ok_result();
}

// Files the kernel's own machinery keeps in its home (IPython's history, matplotlib's font
// cache, fontconfig): not what a cell made, so not reported as its files.
bool is_housekeeping(const std::string& path) {
  for (const char* prefix : {".ipython/", ".cache/", ".config/", ".local/", ".jupyter/"}) {
    if (path.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return false;
}

std::optional<files::Snapshot> snapshot_work_dir(const ManagedKernel& kernel) {
  auto dir = files::WorkDir::open(kernel.work_dir(), kernel.uid(), kernel.uid());
  if (!dir) {
    return std::nullopt;
  }
  auto snap = dir->snapshot(kSnapshotEntries);
  if (!snap || snap->truncated) {
    return std::nullopt;  // a partial walk would report what it missed as created or deleted
  }
  return std::move(snap).value();
}

}  // namespace

int failing_line(const std::vector<std::string>& traceback) {
  // IPython marks the failing line of the cell with an arrow: "----> 3 x = d['k']".
  static const std::regex arrow(R"(^-*>\s*(\d+))");
  static const std::regex cell_line(R"(Cell In\s*\[\d*\],\s*line\s+(\d+))");
  int line = 0;
  for (const auto& entry : traceback) {
    std::smatch m;
    std::istringstream lines(entry);
    for (std::string l; std::getline(lines, l);) {
      if (std::regex_search(l, m, cell_line) || std::regex_search(l, m, arrow)) {
        line = std::stoi(m[1].str());
        return line;  // the first frame is the cell itself
      }
    }
  }
  return line;
}

Result<ExecuteRequest> ExecuteRequest::from_json(const json& body, double max_timeout) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", what);
  };
  if (!body.is_object()) {
    return bad("the request body must be a JSON object");
  }
  ExecuteRequest r;
  auto code = body.find("code");
  if (code == body.end() || !code->is_string()) {
    return bad("'code' (a string) is required");
  }
  r.code = code->get<std::string>();
  if (auto t = body.find("timeout"); t != body.end() && !t->is_null()) {
    if (!t->is_number() || t->get<double>() <= 0) {
      return bad("'timeout' must be a positive number of seconds");
    }
    r.timeout_seconds = std::min(t->get<double>(), max_timeout);
  }
  if (auto s = body.find("stdin"); s != body.end() && !s->is_null()) {
    if (s->is_string()) {
      r.stdin_lines.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& line : *s) {
        if (!line.is_string()) {
          return bad("'stdin' must be a string or an array of strings");
        }
        r.stdin_lines.push_back(line.get<std::string>());
      }
    } else {
      return bad("'stdin' must be a string or an array of strings");
    }
  }
  if (auto h = body.find("store_history"); h != body.end() && !h->is_null()) {
    if (!h->is_boolean()) {
      return bad("'store_history' must be a boolean");
    }
    r.store_history = h->get<bool>();
  }
  return r;
}


Result<OneShotRequest> OneShotRequest::from_json(const json& body, double max_timeout,
                                                 std::size_t max_file_bytes) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", what);
  };
  CELLGATE_ASSIGN_OR_RETURN(auto cell, ExecuteRequest::from_json(body, max_timeout));
  OneShotRequest r;
  r.cell = std::move(cell);
  if (auto k = body.find("kernel"); k != body.end() && !k->is_null()) {
    if (!k->is_string()) {
      return bad("'kernel' must be a kernelspec name");
    }
    r.kernel_name = k->get<std::string>();
  }
  auto f = body.find("files");
  if (f == body.end() || f->is_null()) {
    return r;
  }
  if (!f->is_object()) {
    return bad("'files' must be an object from work-dir path to content");
  }
  std::size_t total = 0;
  for (const auto& [path, value] : f->items()) {
    CELLGATE_ASSIGN_OR_RETURN(std::string rel, files::normalize(path));
    std::string bytes;
    if (value.is_string()) {
      bytes = value.get<std::string>();
    } else if (value.is_object() && value.value("encoding", "") == "base64" &&
               value.contains("content") && value["content"].is_string()) {
      auto decoded = base64_decode(value["content"].get<std::string>());
      if (!decoded) {
        return bad("files['" + path + "']: the content is not valid base64");
      }
      bytes = std::move(decoded).value();
    } else {
      return bad("files['" + path + "'] must be a string, or {\"content\": ..., \"encoding\": "
                 "\"base64\"}");
    }
    total += bytes.size();
    if (total > max_file_bytes) {
      return make_error(ErrorCode::kResourceExhausted, "too_large",
                        "the files are over the limit of " + std::to_string(max_file_bytes) +
                            " bytes in all");
    }
    r.files[rel] = std::move(bytes);
  }
  return r;
}

struct Executor::Impl {
  KernelRegistry& manager_;
  ArtifactStore& artifacts_;
  AuditLog& audit_;
  ExecuteLimits limits_;
  util::Loop& loop_;
  util::Offload offload_;

  Result<json> run(const std::string& kernel_id, const ExecuteRequest& request,
                   const RunOptions& run, const std::shared_ptr<std::atomic<bool>>& cancelled_flag);
  Result<void> run_silently(const std::string& kernel_id, const std::string& code,
                            std::chrono::milliseconds timeout);
  Result<json> run_once(const OneShotRequest& request, const RunOptions& run,
                        const std::shared_ptr<std::atomic<bool>>& cancelled_flag);
};

namespace {

class FlagHandle : public CellHandle {
 public:
  void cancel() override { flag->store(true); }
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

Executor::Executor(KernelRegistry& registry, ArtifactStore& artifacts, AuditLog& audit,
                   ExecuteLimits limits, util::Loop& loop, util::Offload offload)
    : impl_(new Impl{registry, artifacts, audit, limits, loop, std::move(offload)}),
      artifacts_(artifacts),
      limits_(limits) {}

Executor::~Executor() = default;

std::shared_ptr<CellHandle> Executor::run(const std::string& kernel_id, ExecuteRequest request,
                                          RunOptions options, Done done) {
  auto handle = std::make_shared<FlagHandle>();
  impl_->offload_([impl = impl_.get(), kernel_id, request = std::move(request),
                   options = std::move(options), done = std::move(done), flag = handle->flag] {
    done(impl->run(kernel_id, request, options, flag));
  });
  return handle;
}

std::shared_ptr<CellHandle> Executor::run_once(OneShotRequest request, RunOptions options,
                                               Done done) {
  auto handle = std::make_shared<FlagHandle>();
  impl_->offload_([impl = impl_.get(), request = std::move(request), options = std::move(options),
                   done = std::move(done), flag = handle->flag] {
    done(impl->run_once(request, options, flag));
  });
  return handle;
}

void Executor::run_silently(const std::string& kernel_id, std::string code,
                            std::chrono::milliseconds timeout,
                            std::function<void(Result<void>)> done) {
  impl_->offload_([impl = impl_.get(), kernel_id, code = std::move(code), timeout,
                   done = std::move(done)] { done(impl->run_silently(kernel_id, code, timeout)); });
}

Answer Executor::run_and_wait(const std::string& kernel_id, ExecuteRequest request,
                              RunOptions options,
                              const std::shared_ptr<std::atomic<bool>>& cancelled) {
  return impl_->run(kernel_id, request, options, cancelled);
}

Result<void> Executor::run_silently_and_wait(const std::string& kernel_id, std::string code,
                                             std::chrono::milliseconds timeout) {
  return impl_->run_silently(kernel_id, code, timeout);
}

Result<json> Executor::Impl::run(const std::string& kernel_id, const ExecuteRequest& request,
                                 const RunOptions& run,
                                 const std::shared_ptr<std::atomic<bool>>& cancelled_flag) {
  CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(kernel_id));
  const auto started = Clock::now();
  const auto deadline =
      started + std::chrono::milliseconds(static_cast<long long>(request.timeout_seconds * 1000));
  auto cancelled = [&] { return cancelled_flag && cancelled_flag->load(); };

  auto collector = std::make_shared<Collector>();
  collector->limits = limits_;
  collector->sink = run.on_event;
  collector->store = &artifacts_;
  collector->kernel_id = kernel_id;
  collector->stdin_lines.assign(request.stdin_lines.begin(), request.stdin_lines.end());

  std::string status;
  std::string message;
  bool timed_out = false;
  bool state_lost = false;
  bool ran = false;
  std::optional<jail::CgroupStats> before_stats;
  std::optional<files::Snapshot> before_files;

  // One agent call at a time per kernel; waiting counts against this call's timeout.
  std::unique_lock<std::timed_mutex> turn(kernel->execution_mutex(), std::defer_lock);
  bool have_turn = turn.try_lock_for(std::chrono::milliseconds(0));
  while (!have_turn && Clock::now() < deadline && !cancelled()) {
    const auto slice = std::min<Clock::duration>(deadline - Clock::now(),
                                                 run.keepalive.count() > 0
                                                     ? Clock::duration(run.keepalive)
                                                     : Clock::duration(std::chrono::seconds(1)));
    have_turn = turn.try_lock_for(slice);
    if (!have_turn && run.keepalive.count() > 0) {
      std::lock_guard lock(collector->mu);
      collector->emit(json{{"type", "keepalive"}});
    }
  }

  auto client = kernel->client();
  if (!have_turn) {
    status = cancelled() ? "aborted" : "timeout";
    message = cancelled() ? "the client left before the cell started; it did not run"
                          : "the kernel was busy with another agent call for the whole timeout; "
                            "the cell did not run";
  } else if (!client) {
    return make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                      "kernel " + kernel_id + " is " + kernel->model().execution_state);
  } else {
    if (auto s = kernel->cgroup_stats()) {
      before_stats = *s;
    }
    before_files = snapshot_work_dir(*kernel);
    if (!request.setup_code.empty()) {
      if (auto setup = run_silent(*client, request.setup_code, deadline); !setup) {
        return setup.error();
      }
    }
    collector->client = client;
    kernel::RequestHandlers handlers;
    handlers.on_message = [collector](Channel ch, const protocol::Message& msg) {
      collector->on_message(ch, msg);
    };
    handlers.on_end = [collector](kernel::RequestEnd end) {
      std::lock_guard lock(collector->mu);
      collector->done = true;
      collector->end = end;
      collector->cv.notify_all();
    };
    json content = kernel::execute_content(request.code, !request.stdin_lines.empty(),
                                           request.store_history);
    content["stop_on_error"] = false;  // one agent call must not abort the next one
    client->send(Channel::kShell, "execute_request", std::move(content), std::move(handlers));
    ran = true;

    // Wait for the end, the deadline or the client leaving, with keepalives meanwhile.
    const auto slice = run.keepalive.count() > 0 ? run.keepalive : std::chrono::milliseconds(250);
    bool stop = false;
    {
      std::unique_lock lock(collector->mu);
      while (!collector->done) {
        if (Clock::now() >= deadline) {
          timed_out = true;
          break;
        }
        if (cancelled()) {
          stop = true;
          break;
        }
        const auto wake = std::min<Clock::time_point>(
            deadline, Clock::now() + std::min(slice, std::chrono::milliseconds(250)));
        collector->cv.wait_until(lock, wake);
        if (!collector->done && run.keepalive.count() > 0 &&
            Clock::now() - collector->last_keepalive >= run.keepalive) {
          collector->emit(json{{"type", "keepalive"}});
          collector->last_keepalive = Clock::now();
        }
      }
    }
    if (timed_out || stop) {
      // Interrupt, give the cell the grace period to stop, then restart the kernel.
      (void)manager_.interrupt(kernel_id);
      std::unique_lock lock(collector->mu);
      if (!collector->cv.wait_for(lock, limits_.grace, [&] { return collector->done; })) {
        lock.unlock();
        spdlog::warn("kernel {}: a cell did not stop {} ms after its interrupt; restarting it",
                     kernel_id, limits_.grace.count());
        (void)manager_.restart(kernel_id);
        state_lost = true;
      }
    }
    if (!request.teardown_code.empty() && !state_lost) {
      if (auto c = kernel->client()) {
        (void)run_silent(*c, request.teardown_code,
                         std::max(deadline, Clock::now()) + std::chrono::seconds(2));
      }
    }
  }

  std::lock_guard lock(collector->mu);
  if (!status.empty()) {
    // decided above: the cell never ran
  } else if (timed_out) {
    status = "timeout";
    message = state_lost ? "the cell ran past its timeout and did not stop when interrupted: the "
                           "kernel was restarted and its state is lost"
                         : "the cell ran past its timeout and was interrupted; the kernel's "
                           "state is kept";
  } else if (cancelled() && (!collector->reply || state_lost)) {
    status = "aborted";
    message = state_lost ? "the client left; the cell did not stop when interrupted, so the "
                           "kernel was restarted and its state is lost"
                         : "the client left; the cell was interrupted";
  } else if (collector->end == kernel::RequestEnd::kKernelDead || !collector->reply) {
    status = "dead";
    state_lost = true;
    message = "the kernel died while running the cell";
  } else {
    status = collector->reply->value("status", "error");
  }

  const auto wall = Clock::now() - started;
  json metrics = {{"wall_ms", to_ms(wall)}, {"cpu_ms", nullptr}, {"memory_peak_bytes", nullptr},
                  {"memory_current_bytes", nullptr}};
  if (ran) {
    if (auto after = kernel->cgroup_stats()) {
      if (before_stats && !state_lost && before_stats->cpu_usage_known &&
          after->cpu_usage_known && after->cpu_usage_usec >= before_stats->cpu_usage_usec) {
        metrics["cpu_ms"] = (after->cpu_usage_usec - before_stats->cpu_usage_usec) / 1000;
      }
      metrics["memory_peak_bytes"] = after->memory_peak_bytes;
      metrics["memory_current_bytes"] = after->memory_current_bytes;
    }
  }
  json changed = json::array();
  if (ran && before_files) {
    if (auto after = snapshot_work_dir(*kernel)) {
      for (const auto& change : files::diff(*before_files, *after)) {
        if (change.type == files::FileType::kDirectory || is_housekeeping(change.path)) {
          continue;
        }
        changed.push_back(json{{"path", change.path},
                               {"change", files::to_string(change.kind)},
                               {"type", files::to_string(change.type)},
                               {"size", change.size}});
        if (change.kind != files::ChangeKind::kDeleted && change.type == files::FileType::kFile) {
          (void)artifacts_.record_file(kernel_id, collector->execution_count, change.path,
                                        change.size);
        }
      }
    }
  }

  json answer = {
      {"status", status},
      {"execution_count",
       collector->reply ? collector->reply->value("execution_count", json()) : json()},
      {"stdout", collector->out[0]},
      {"stderr", collector->out[1]},
      {"outputs", collector->outputs},
      {"result", collector->result},
      {"error", collector->error},
      {"artifacts", collector->artifacts},
      {"files", changed},
      {"notices", collector->notices},
      {"truncated",
       {{"stdout", collector->out_truncated[0]},
        {"stderr", collector->out_truncated[1]},
        {"outputs", collector->outputs_truncated},
        {"dropped_bytes", collector->dropped_bytes}}},
      {"state_lost", state_lost},
      {"metrics", metrics}};
  if (!message.empty()) {
    answer["message"] = message;
  }
  // Nothing more reaches the caller's sink once the answer is made.
  collector->sink = nullptr;

  json audit = {{"time", protocol::iso8601(std::chrono::system_clock::now())},
                {"kernel", kernel_id},
                {"client", run.client},
                {"code_sha256", sha256_hex(request.code)},
                {"code_bytes", request.code.size()},
                {"limits",
                 {{"timeout_s", request.timeout_seconds},
                  {"stream_bytes", limits_.stream_bytes},
                  {"output_bytes", limits_.output_bytes}}},
                {"status", status},
                {"state_lost", state_lost},
                {"duration_ms", metrics["wall_ms"]},
                {"cpu_ms", metrics["cpu_ms"]},
                {"memory_peak_bytes", metrics["memory_peak_bytes"]},
                {"output_bytes",
                 {{"stdout", collector->out[0].size()},
                  {"stderr", collector->out[1].size()},
                  {"dropped", collector->dropped_bytes}}},
                {"artifacts", collector->artifacts.size()},
                {"files_changed", changed.size()}};
  if (collector->error.is_object()) {
    audit["error"] = collector->error.value("ename", "");
  }
  audit_.write(std::move(audit));
  return answer;
}

Result<void> Executor::Impl::run_silently(const std::string& kernel_id, const std::string& code,
                                          std::chrono::milliseconds timeout) {
  CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(kernel_id));
  auto client = kernel->client();
  if (!client) {
    return make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                      "kernel " + kernel_id + " is " + kernel->model().execution_state);
  }
  return run_silent(*client, code, Clock::now() + timeout);
}

Result<json> Executor::Impl::run_once(const OneShotRequest& request, const RunOptions& run,
                                      const std::shared_ptr<std::atomic<bool>>& cancelled_flag) {
  const std::string name =
      request.kernel_name.empty() ? manager_.default_kernel_name() : request.kernel_name;
  CELLGATE_ASSIGN_OR_RETURN(auto model, manager_.start(name, json::object()));
  struct Teardown {
    KernelRegistry& manager;
    ArtifactStore& artifacts;
    std::string id;
    ~Teardown() {
      (void)manager.shutdown(id);
      artifacts.forget(id);  // its artifacts stay reachable by SHA-256
    }
  } teardown{manager_, artifacts_, model.id};
  CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(model.id));
  if (!request.files.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(auto dir,
                              files::WorkDir::open(kernel->work_dir(), kernel->uid(), kernel->uid()));
    for (const auto& [path, bytes] : request.files) {
      CELLGATE_TRY(dir.write(path, bytes, bytes.size(), /*make_parents=*/true));
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(json answer, this->run(model.id, request.cell, run, cancelled_flag));
  answer["kernel_id"] = model.id;
  return answer;
}

}  // namespace cellgate::execute
