// `cellgate exec --url`: one cell on a running gateway, streamed as NDJSON and printed as it
// arrives (POST /api/execute, or /api/kernels/{id}/execute with --kernel-id).
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/http/limits.hpp"
#include "output.hpp"

namespace cellgate::cli::detail {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr double kNoTimeoutSeconds = 86400;  // "no limit": the gateway clamps it to its maximum
constexpr auto kHeadTimeout = 30s;           // connect, send, and the answer's headers
constexpr auto kAnswerSlack = 120s;  // past the cell's timeout: the grace period and a restart

// Prints each streamed event; remembers how the cell ended.
class EventPrinter {
 public:
  explicit EventPrinter(std::string artifacts_dir) : saver_(std::move(artifacts_dir)) {}

  void feed(std::string_view bytes) {
    fed_ = true;
    pending_.append(bytes);
    for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (!line.empty()) {
        handle(http::parse_json(line, http::kMaxKernelJsonDepth));
      }
    }
  }

  bool fed() const { return fed_; }
  bool ended() const { return ended_; }

  int exit_code() const {
    if (!ended_) {
      std::cerr << "cellgate exec: the gateway closed the stream before the cell ended\n";
      return kExitKernelDied;
    }
    if (!failure_.empty()) {
      std::cerr << "cellgate exec: " << failure_ << "\n";
      return kExitUsage;
    }
    switch (status_) {
      case execute::CellStatus::kOk:
        return kExitOk;
      case execute::CellStatus::kTimeout:
        return kExitTimeout;
      case execute::CellStatus::kError:
        return kExitCellError;
      default:
        return kExitKernelDied;  // dead, aborted
    }
  }

 private:
  void handle(const json& ev) {
    if (!ev.is_object()) {
      return;
    }
    const std::string type = ev.value("type", "");
    if (type == "stream") {
      std::FILE* out = ev.value("name", "stdout") == "stderr" ? stderr : stdout;
      const std::string text = ev.value("text", "");
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    } else if (type == "execute_result" || type == "display_data") {
      print_bundle(ev.value("data", json::object()), saver_);
    } else if (type == "error") {
      std::string tb;
      for (const auto& line : ev.value("traceback", json::array())) {
        tb += line.is_string() ? line.get<std::string>() + "\n" : "";
      }
      std::cout << std::flush;
      std::cerr << (tb.empty() ? ev.value("ename", "Error") + ": " + ev.value("evalue", "") + "\n"
                               : tb)
                << std::flush;
    } else if (type == "notice") {
      std::cerr << "cellgate: " << ev.value("message", "") << "\n";
    } else if (type == "end") {
      ended_ = true;
      auto answer = ev.contains("answer") ? execute::CellResult::from_json(ev["answer"])
                                          : Result<execute::CellResult>(Error{});
      if (answer) {
        status_ = answer->status;
        if (!answer->message.empty()) {
          std::cerr << "cellgate exec: " << answer->message << "\n";
        }
      } else if (ev.contains("error") && ev["error"].is_object()) {
        failure_ = ev["error"].value("message", "the gateway could not run the cell");
      }
    }
  }

  ArtifactSaver saver_;
  std::string pending_;
  bool fed_ = false;
  bool ended_ = false;
  execute::CellStatus status_ = execute::CellStatus::kError;
  std::string failure_;
};

}  // namespace

int run_remote_exec(const ExecOptions& options, const std::string& code) {
  auto url = http::client::parse_url(options.url);
  if (!url) {
    std::cerr << "cellgate exec: " << url.error().message << "\n";
    return kExitUsage;
  }
  const double timeout = options.timeout_seconds > 0 ? options.timeout_seconds : kNoTimeoutSeconds;
  json body = {{"code", code}, {"timeout", timeout}};
  std::string target;
  if (options.kernel_id.empty()) {
    target = "/api/execute";
    body["kernel"] = options.kernel;
  } else {
    target = "/api/kernels/" + options.kernel_id + "/execute";
  }
  http::client::StreamLimits limits;
  limits.head = kHeadTimeout;
  limits.total = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::duration<double>(timeout)) +
                 kHeadTimeout + kAnswerSlack;

  EventPrinter printer(options.artifacts_dir);
  const http::client::Client client(std::move(url).value(), options.token, "cellgate-exec");
  auto res = client.stream(
      "POST", target, body.dump(), "application/x-ndjson",
      [&printer](std::string_view piece) { printer.feed(piece); }, limits);
  if (!res) {
    if (printer.ended()) {
      return printer.exit_code();  // the cell's end arrived; the connection failed after it
    }
    std::cerr << "cellgate exec: " << res.error().message << "\n";
    return printer.fed() ? printer.exit_code() : kExitUsage;
  }
  if (res->status != 200) {
    std::cerr << "cellgate exec: the gateway answered " << res->status << ": "
              << res->error_message() << "\n";
    return res->status == 404 || res->status == 401 || res->status == 403 ? kExitUsage
                                                                          : kExitKernelDied;
  }
  return printer.exit_code();
}

}  // namespace cellgate::cli::detail
