// Kernels of a running `cellgate serve`, through its agent API and http's client: the only C++
// code that calls the agent API. A cell is streamed as NDJSON (ndjson.hpp) so that its events and
// the gateway's keepalives arrive while it runs. Every answer is read as hostile input:
// depth-checked before it is parsed, its size bounded.
#include <algorithm>
#include <atomic>
#include <chrono>

#include "cellgate/client/kernels.hpp"
#include "ndjson.hpp"

namespace cellgate::client {
namespace {

namespace http_client = http::client;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kRestTimeout = 30s;
constexpr auto kStartTimeout = 180s;  // a cold jailed start is inside POST /api/kernels (and
                                      // before a one-shot cell's first byte)
constexpr auto kAnswerSlack = 120s;   // past a cell's timeout: the grace period and a restart
// A REST answer (a kernel model, the kernelspecs) is a few KiB; this much is read at most.
constexpr std::size_t kRestAnswerBytes = std::size_t{16} << 20;

Error http_error(const std::string& what, const http_client::Response& res) {
  ErrorCode code = ErrorCode::kUnavailable;
  if (res.status == 401) {
    code = ErrorCode::kUnauthenticated;
  } else if (res.status == 403) {
    code = ErrorCode::kPermissionDenied;
  } else if (res.status == 404) {
    code = ErrorCode::kNotFound;
  } else if (res.status == 413) {
    code = ErrorCode::kResourceExhausted;
  } else if (res.status >= 400 && res.status < 500) {
    code = ErrorCode::kInvalidArgument;
  }
  return make_error(
      code, "http_" + std::to_string(res.status),
      what + ": the gateway answered " + std::to_string(res.status) + ": " + res.error_message());
}

Error bad_answer(const std::string& what) {
  return make_error(ErrorCode::kUnavailable, "bad_answer", what);
}

bool is_listing(const json& j) {
  return j.is_object() && j.size() == 3 && j.contains("path") && j["path"].is_string() &&
         j.contains("entries") && j["entries"].is_array() && j.contains("truncated") &&
         j["truncated"].is_boolean();
}

std::chrono::milliseconds seconds(double s) {
  // A week at most: "no limit" is a week (the gateway clamps it to its own maximum anyway).
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(std::min(s, 7 * 24 * 3600.0)));
}

// Cancels by interrupting the kernel: the gateway then answers the cell as it ended.
class RemoteCell : public Cell {
 public:
  RemoteCell(const http_client::Client& c, std::string id, util::Offload offload)
      : client_(c), id_(std::move(id)), offload_(std::move(offload)) {}
  void cancel() override {
    if (id_.empty() || done_.load() || cancelled_.exchange(true)) {
      return;
    }
    offload_([c = client_, id = id_] {
      (void)c.request("POST", "/api/kernels/" + id + "/interrupt", "", kRestTimeout,
                      "application/json", kRestAnswerBytes);
    });
  }
  void finished() { done_.store(true); }

 private:
  const http_client::Client client_;
  const std::string id_;  // "": a one-shot cell, whose kernel is not known yet
  util::Offload offload_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> done_{false};
};

class RemoteKernels : public Kernels {
 public:
  RemoteKernels(http_client::Client c, Options options, util::Offload offload)
      : client_(std::move(c)), options_(std::move(options)), offload_(std::move(offload)) {
    const auto& u = client_.url();
    const bool v6 = u.host.find(':') != std::string::npos;
    artifact_base_ = std::string(u.tls ? "https" : "http") + "://" +
                     (v6 ? "[" + u.host + "]" : u.host) + ":" + u.port + u.base + "/api/artifacts/";
  }

  Result<KernelSpecs> kernelspecs() override {
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", "/api/kernelspecs", "", kRestTimeout,
                                                        "application/json", kRestAnswerBytes));
    if (res.status != 200) {
      return http_error("GET /api/kernelspecs", res);
    }
    json body = parse_bounded(res.body);
    if (!body.is_object() || !body.contains("kernelspecs") || !body["kernelspecs"].is_object()) {
      return bad_answer("GET /api/kernelspecs: not a Jupyter gateway's answer");
    }
    KernelSpecs specs;
    for (const auto& [name, model] : body["kernelspecs"].items()) {
      std::string language;
      if (model.is_object() && model.contains("spec") && model["spec"].is_object()) {
        const auto& spec = model["spec"];
        if (auto l = spec.find("language"); l != spec.end() && l->is_string()) {
          language = l->get<std::string>();
        }
      }
      specs.specs.push_back({name, language});
    }
    const auto default_name = body.find("default");
    specs.default_name = default_name != body.end() && default_name->is_string()
                             ? default_name->get<std::string>()
                             : "python3";
    return specs;
  }

  Result<std::string> start(const std::string& kernelspec) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("POST", "/api/kernels", json{{"name", kernelspec}}.dump(),
                                  kStartTimeout, "application/json", kRestAnswerBytes));
    if (res.status != 201 && res.status != 200) {
      return http_error("starting a " + kernelspec + " kernel", res);
    }
    json model = parse_bounded(res.body);
    if (!model.is_object() || !model.contains("id") || !model["id"].is_string()) {
      return bad_answer("POST /api/kernels: the answer has no kernel id");
    }
    return model["id"].get<std::string>();
  }

  Result<void> restart(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("POST", "/api/kernels/" + id + "/restart", "", kStartTimeout,
                                  "application/json", kRestAnswerBytes));
    if (res.status != 200) {
      return http_error("restarting kernel " + id, res);
    }
    return ok_result();
  }

  Result<std::string> snapshot(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("POST", "/api/kernels/" + id + "/snapshots", "", kStartTimeout,
                                  "application/json", kRestAnswerBytes));
    if (res.status != 201) {
      return http_error("snapshotting kernel " + id, res);
    }
    json snap = parse_bounded(res.body);
    if (!snap.is_object() || !snap.contains("id") || !snap["id"].is_string()) {
      return bad_answer("POST /api/kernels/{id}/snapshots: the answer has no snapshot id");
    }
    return snap["id"].get<std::string>();
  }

  Result<Copy> start_from_snapshot(const std::string& snapshot_id) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("POST", "/api/kernels", json{{"snapshot", snapshot_id}}.dump(),
                                  kStartTimeout, "application/json", kRestAnswerBytes));
    if (res.status != 201) {
      return http_error("starting a kernel from snapshot " + snapshot_id, res);
    }
    json model = parse_bounded(res.body);
    if (!model.is_object() || !model.contains("id") || !model["id"].is_string()) {
      return bad_answer("POST /api/kernels: the answer has no kernel id");
    }
    return Copy{model["id"].get<std::string>(), model.contains("name") && model["name"].is_string()
                                                    ? model["name"].get<std::string>()
                                                    : std::string()};
  }

  Result<std::vector<std::string>> fork(const std::string& id, int count) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.request("POST", "/api/kernels/" + id + "/fork", json{{"count", count}}.dump(),
                        kStartTimeout, "application/json", kRestAnswerBytes));
    if (res.status != 201) {
      return http_error("forking kernel " + id, res);
    }
    json models = parse_bounded(res.body);
    std::vector<std::string> ids;
    for (const auto& m : models.is_array() ? models : json::array()) {
      if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) {
        return bad_answer("POST /api/kernels/{id}/fork: a copy without a kernel id");
      }
      ids.push_back(m["id"].get<std::string>());
    }
    if (ids.empty()) {
      return bad_answer("POST /api/kernels/{id}/fork: no copies in the answer");
    }
    return ids;
  }

  Result<void> shutdown(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(auto res,
                              client_.request("DELETE", "/api/kernels/" + id, "", kRestTimeout,
                                              "application/json", kRestAnswerBytes));
    if (res.status != 204 && res.status != 200) {
      return http_error("shutting down kernel " + id, res);
    }
    return ok_result();
  }

  std::shared_ptr<Cell> execute(const std::string& id, execute::ExecuteRequest request,
                                CellCallbacks callbacks) override {
    return stream(id, "/api/kernels/" + id + "/execute", body_of(request), request,
                  std::move(callbacks));
  }

  std::shared_ptr<Cell> execute_once(const std::string& kernelspec, execute::ExecuteRequest request,
                                     CellCallbacks callbacks) override {
    json body = body_of(request);
    if (!kernelspec.empty()) {
      body["kernel"] = kernelspec;
    }
    return stream("", "/api/execute", std::move(body), request, std::move(callbacks));
  }

  Result<json> list_files(const std::string& id, const std::string& dir) override {
    std::string target = "/api/kernels/" + id + "/files";
    if (!dir.empty() && dir != "." && dir != "/") {
      target += "/" + http_client::encode_path(dir);
    }
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", target, "", kRestTimeout, "",
                                                        options_.max_file_bytes + (1u << 20)));
    if (res.status != 200) {
      return http_error("listing " + (dir.empty() ? std::string("the work dir") : dir), res);
    }
    json listing = parse_bounded(res.body);
    if (!is_listing(listing)) {
      return make_error(ErrorCode::kFailedPrecondition, "not_a_directory",
                        dir + " is a file, not a directory (read_file reads it)");
    }
    return listing;
  }

  Result<std::string> read_file(const std::string& id, const std::string& path) override {
    const std::string target = "/api/kernels/" + id + "/files/" + http_client::encode_path(path);
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", target, "", kRestTimeout, "",
                                                        options_.max_file_bytes + (1u << 20)));
    if (res.status != 200) {
      return http_error("reading " + path, res);
    }
    // The files route answers a directory with its listing; a file that happens to hold exactly
    // such a listing is read as a directory, a harmless confusion.
    if (json j = parse_bounded(res.body); is_listing(j)) {
      return make_error(ErrorCode::kFailedPrecondition, "not_a_file",
                        path + " is a directory (list_files lists it)");
    }
    return std::move(res.body);
  }

  Result<json> write_file(const std::string& id, const std::string& path,
                          const std::string& bytes) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.request("PUT", "/api/kernels/" + id + "/files/" + http_client::encode_path(path),
                        bytes, kRestTimeout, "application/octet-stream", kRestAnswerBytes));
    if (res.status != 201 && res.status != 200) {
      return http_error("writing " + path, res);
    }
    json entry = parse_bounded(res.body);
    return entry.is_object() ? entry : json{{"path", path}, {"size", bytes.size()}};
  }

  // The REST API has no kernel_info: the kernelspec's language is what is known.
  Result<json> kernel_info(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("GET", "/api/kernels/" + id, "", kRestTimeout, "application/json",
                                  kRestAnswerBytes));
    if (res.status != 200) {
      return http_error("GET /api/kernels/" + id, res);
    }
    json model = parse_bounded(res.body);
    if (!model.is_object() || !model.contains("name") || !model["name"].is_string()) {
      return bad_answer("GET /api/kernels/{id}: the answer has no kernelspec name");
    }
    CELLGATE_ASSIGN_OR_RETURN(auto specs, kernelspecs());
    json info = json::object();
    for (const auto& spec : specs.specs) {
      if (spec.name == model["name"] && !spec.language.empty()) {
        info["language_info"] = {{"name", spec.language}};
      }
    }
    return info;
  }

  std::string artifact_base() const override { return artifact_base_; }

 private:
  json body_of(execute::ExecuteRequest& request) const {
    request.timeout_seconds = std::min(request.timeout_seconds, options_.max_timeout);
    return request_json(request);
  }

  std::shared_ptr<Cell> stream(const std::string& id, std::string target, json body,
                               const execute::ExecuteRequest& request, CellCallbacks callbacks) {
    auto cell = std::make_shared<RemoteCell>(client_, id, offload_);
    const auto wait = seconds(request.timeout_seconds);
    offload_([this, target = std::move(target), body = std::move(body), wait,
              callbacks = std::move(callbacks), cell] {
      auto answer = stream_cell(target, body, wait, callbacks);
      cell->finished();
      callbacks.done(std::move(answer));
    });
    return cell;
  }

  // POST …/execute with Accept: application/x-ndjson: events, then {"type":"end","answer":…}.
  Result<execute::CellResult> stream_cell(const std::string& target, const json& body,
                                          std::chrono::milliseconds wait,
                                          const CellCallbacks& callbacks) const {
    NdjsonAnswer lines([&callbacks](json event) {
      const auto type = event.find("type");
      if (type != event.end() && *type == "keepalive") {
        if (callbacks.on_keepalive) {
          callbacks.on_keepalive();
        }
      } else if (callbacks.on_event) {
        callbacks.on_event(event);
      }
    });
    http_client::StreamLimits limits;
    limits.head = kStartTimeout;
    limits.total = wait + kStartTimeout + kAnswerSlack;
    auto res = client_.stream(
        "POST", target, body.dump(), "application/x-ndjson",
        [&lines](std::string_view piece) { lines.feed(piece); }, limits);
    lines.finish();
    if (lines.ended()) {
      return lines.answer();  // the cell's end arrived; the connection may have failed after it
    }
    if (!res) {
      if (!lines.fed()) {
        return std::move(res).error();
      }
      return bad_answer("the gateway's answer ended before the cell did: " + res.error().message);
    }
    if (res->status != 200) {
      return http_error("running a cell (POST " + target + ")", *res);
    }
    return lines.answer();
  }

  const http_client::Client client_;
  const Options options_;
  util::Offload offload_;
  std::string artifact_base_;
};

}  // namespace

Result<std::unique_ptr<Kernels>> make_remote(http::client::Url url, std::string token,
                                             Options options, util::Offload offload) {
  std::string agent = options.client;  // "cellgate mcp" → the User-Agent "cellgate-mcp"
  std::replace(agent.begin(), agent.end(), ' ', '-');
  auto kernels = std::make_unique<RemoteKernels>(
      http_client::Client(std::move(url), std::move(token), std::move(agent)), std::move(options),
      std::move(offload));
  CELLGATE_TRY(kernels->kernelspecs());
  return std::unique_ptr<Kernels>(std::move(kernels));
}

}  // namespace cellgate::client
