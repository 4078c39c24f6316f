// Kernels of a running `cellgate serve`, through its agent API and http's client (as
// `cellgate exec --url` and `cellgate run --url` use it). A cell is streamed as NDJSON so the
// gateway's keepalives reach the MCP client as progress while it runs.
#include <atomic>
#include <chrono>
#include <mutex>

#include "cellgate/http/limits.hpp"
#include "cellgate/mcp/kernels.hpp"

namespace cellgate::mcp {
namespace {

namespace client = http::client;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kRestTimeout = 30s;
constexpr auto kStartTimeout = 180s;  // a cold jailed start is inside POST /api/kernels
constexpr auto kAnswerSlack = 120s;   // past a cell's timeout: the grace period and a restart
constexpr auto kStreamIdle = 120s;    // the gateway sends a keepalive every few seconds

Error http_error(const std::string& what, const client::Response& res) {
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

bool is_listing(const json& j) {
  return j.is_object() && j.size() == 3 && j.contains("path") && j["path"].is_string() &&
         j.contains("entries") && j["entries"].is_array() && j.contains("truncated") &&
         j["truncated"].is_boolean();
}

// Cancels by interrupting the kernel: the gateway then answers the cell as interrupted.
class RemoteCell : public Cell {
 public:
  RemoteCell(const client::Client& c, std::string id, util::Offload offload)
      : client_(c), id_(std::move(id)), offload_(std::move(offload)) {}
  void cancel() override {
    if (done_.load() || cancelled_.exchange(true)) {
      return;
    }
    offload_([c = client_, id = id_] {
      (void)c.request("POST", "/api/kernels/" + id + "/interrupt", "", kRestTimeout);
    });
  }
  void finished() { done_.store(true); }

 private:
  const client::Client client_;
  const std::string id_;
  util::Offload offload_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> done_{false};
};

class RemoteKernels : public Kernels {
 public:
  RemoteKernels(client::Client c, KernelsOptions options, util::Offload offload)
      : client_(std::move(c)), options_(std::move(options)), offload_(std::move(offload)) {
    const auto& u = client_.url();
    const bool v6 = u.host.find(':') != std::string::npos;
    artifact_base_ = std::string(u.tls ? "https" : "http") + "://" +
                     (v6 ? "[" + u.host + "]" : u.host) + ":" + u.port + u.base + "/api/artifacts/";
  }

  Result<KernelSpecs> kernelspecs() override {
    CELLGATE_ASSIGN_OR_RETURN(auto res,
                              client_.request("GET", "/api/kernelspecs", "", kRestTimeout));
    if (res.status != 200) {
      return http_error("GET /api/kernelspecs", res);
    }
    json body = http::parse_json(res.body, http::kMaxKernelJsonDepth);
    if (!body.is_object() || !body.contains("kernelspecs") || !body["kernelspecs"].is_object()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "GET /api/kernelspecs: not a Jupyter gateway's answer");
    }
    KernelSpecs specs;
    for (const auto& [name, model] : body["kernelspecs"].items()) {
      std::string language;
      if (model.is_object() && model.contains("spec") && model["spec"].is_object()) {
        language = model["spec"].value("language", std::string());
      }
      specs.specs.push_back({name, language});
    }
    specs.default_name = body.value("default", std::string("python3"));
    return specs;
  }

  Result<std::string> start(const std::string& kernelspec) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.request("POST", "/api/kernels", json{{"name", kernelspec}}.dump(), kStartTimeout));
    if (res.status != 201 && res.status != 200) {
      return http_error("starting a " + kernelspec + " kernel", res);
    }
    json model = http::parse_json(res.body, http::kMaxKernelJsonDepth);
    if (!model.is_object() || !model.contains("id") || !model["id"].is_string()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "POST /api/kernels: the answer has no kernel id");
    }
    return model["id"].get<std::string>();
  }

  Result<void> restart(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("POST", "/api/kernels/" + id + "/restart", "", kStartTimeout));
    if (res.status != 200) {
      return http_error("restarting kernel " + id, res);
    }
    return ok_result();
  }

  Result<void> shutdown(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(auto res,
                              client_.request("DELETE", "/api/kernels/" + id, "", kRestTimeout));
    if (res.status != 204 && res.status != 200) {
      return http_error("shutting down kernel " + id, res);
    }
    return ok_result();
  }

  std::shared_ptr<Cell> execute(const std::string& id, const json& body,
                                CellCallbacks callbacks) override {
    auto cell = std::make_shared<RemoteCell>(client_, id, offload_);
    offload_([this, id, body, callbacks = std::move(callbacks), cell] {
      auto answer = stream_cell(id, body, callbacks.on_keepalive);
      cell->finished();
      callbacks.done(std::move(answer));
    });
    return cell;
  }

  Result<json> list_files(const std::string& id, const std::string& dir) override {
    std::string target = "/api/kernels/" + id + "/files";
    if (!dir.empty() && dir != "." && dir != "/") {
      target += "/" + client::encode_path(dir);
    }
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", target, "", kRestTimeout, "",
                                                        options_.max_file_bytes + (1u << 20)));
    if (res.status != 200) {
      return http_error("listing " + (dir.empty() ? std::string("the work dir") : dir), res);
    }
    json listing = http::parse_json(res.body, http::kMaxKernelJsonDepth);
    if (!is_listing(listing)) {
      return make_error(ErrorCode::kFailedPrecondition, "not_a_directory",
                        dir + " is a file, not a directory (read_file reads it)");
    }
    return listing;
  }

  Result<std::string> read_file(const std::string& id, const std::string& path) override {
    const std::string target = "/api/kernels/" + id + "/files/" + client::encode_path(path);
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", target, "", kRestTimeout, "",
                                                        options_.max_file_bytes + (1u << 20)));
    if (res.status != 200) {
      return http_error("reading " + path, res);
    }
    // The files route answers a directory with its listing; a file that happens to hold exactly
    // such a listing is read as a directory, a harmless confusion.
    if (json j = http::parse_json(res.body, http::kMaxKernelJsonDepth); is_listing(j)) {
      return make_error(ErrorCode::kFailedPrecondition, "not_a_file",
                        path + " is a directory (list_files lists it)");
    }
    return std::move(res.body);
  }

  Result<json> write_file(const std::string& id, const std::string& path,
                          const std::string& bytes) override {
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.request("PUT", "/api/kernels/" + id + "/files/" + client::encode_path(path), bytes,
                        kRestTimeout, "application/octet-stream"));
    if (res.status != 201 && res.status != 200) {
      return http_error("writing " + path, res);
    }
    json entry = http::parse_json(res.body, http::kMaxKernelJsonDepth);
    return entry.is_object() ? entry : json{{"path", path}, {"size", bytes.size()}};
  }

  std::string artifact_base() const override { return artifact_base_; }

 private:
  // POST /api/kernels/{id}/execute with Accept: application/x-ndjson: events, then
  // {"type":"end","answer":…}.
  Result<execute::CellResult> stream_cell(const std::string& id, const json& body,
                                          const std::function<void()>& on_keepalive) {
    double timeout = 30;
    if (auto t = body.find("timeout"); t != body.end() && t->is_number()) {
      timeout = std::min(t->get<double>(), options_.max_timeout);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::duration<double>(timeout)) +
                      kAnswerSlack;
    std::string pending;
    std::optional<Result<execute::CellResult>> end;
    auto on_line = [&](std::string_view line) {
      json event = http::parse_json(line, http::kMaxKernelJsonDepth);
      if (!event.is_object()) {
        return;
      }
      const std::string type = event.value("type", std::string());
      if (type == "keepalive" && on_keepalive) {
        on_keepalive();
      } else if (type == "end") {
        if (event.contains("answer") && event["answer"].is_object()) {
          end = execute::CellResult::from_json(event["answer"]);
        } else {
          std::string message = "the gateway ended the cell without an answer";
          if (auto e = event.find("error"); e != event.end() && e->is_object()) {
            message = e->value("message", message);
          }
          end = make_error(ErrorCode::kUnavailable, "no_answer", message);
        }
      }
    };
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.stream("POST", "/api/kernels/" + id + "/execute", body.dump(),
                       "application/x-ndjson",
                       [&](std::string_view piece) {
                         pending.append(piece);
                         std::size_t nl;
                         while ((nl = pending.find('\n')) != std::string::npos) {
                           on_line(std::string_view(pending).substr(0, nl));
                           pending.erase(0, nl + 1);
                         }
                       },
                       {.head = wait, .idle = kStreamIdle, .total = wait + kAnswerSlack}));
    if (res.status != 200) {
      return http_error("running a cell in kernel " + id, res);
    }
    if (!pending.empty()) {
      on_line(pending);
    }
    if (!end) {
      return make_error(ErrorCode::kUnavailable, "no_answer",
                        "the gateway's answer ended before the cell did");
    }
    return std::move(*end);
  }

  const client::Client client_;
  const KernelsOptions options_;
  util::Offload offload_;
  std::string artifact_base_;
};

}  // namespace

Result<std::unique_ptr<Kernels>> make_remote_kernels(http::client::Url url, std::string token,
                                                     KernelsOptions options,
                                                     util::Offload offload) {
  auto kernels = std::make_unique<RemoteKernels>(
      client::Client(std::move(url), std::move(token), "cellgate-mcp"), std::move(options),
      std::move(offload));
  CELLGATE_TRY(kernels->kernelspecs());
  return std::unique_ptr<Kernels>(std::move(kernels));
}

}  // namespace cellgate::mcp
