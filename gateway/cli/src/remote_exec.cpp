// `cellgate exec --url`: one cell on a running gateway through the client seam
// (cellgate/client/kernels.hpp: POST /api/execute, or /api/kernels/{id}/execute with
// --kernel-id, streamed), each event printed as it arrives.
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cellgate/client/kernels.hpp"
#include "output.hpp"

namespace cellgate::cli::detail {
namespace {

namespace net = boost::asio;
using nlohmann::json;

constexpr double kNoTimeoutSeconds = 86400;  // "no limit": the gateway clamps it to its maximum

// Prints each event of the cell as it arrives.
class EventPrinter {
 public:
  explicit EventPrinter(std::string artifacts_dir) : saver_(std::move(artifacts_dir)) {}

  void handle(const json& ev) {
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
    }
  }

 private:
  ArtifactSaver saver_;
};

// Why the cell did not run, as an exit code: the gateway refused it (a wrong token, no such
// kernel, what it could not run) or was not there: usage; it ended the stream before the cell
// did, or failed otherwise: the kernel died.
int exit_code_of(const Error& error) {
  std::cerr << "cellgate exec: " << error.message << "\n";
  const std::string& r = error.reason;
  if (r == "http_401" || r == "http_403" || r == "http_404" || r == "execute_failed") {
    return kExitUsage;
  }
  if (r.rfind("http_", 0) == 0 || r == "bad_answer") {
    return kExitKernelDied;
  }
  return kExitUsage;  // the gateway could not be reached
}

int exit_code_of(const execute::CellResult& answer) {
  if (!answer.message.empty()) {
    std::cerr << "cellgate exec: " << answer.message << "\n";
  }
  switch (answer.status) {
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

}  // namespace

int run_remote_exec(const ExecOptions& options, const std::string& code) {
  auto url = http::client::parse_url(options.url);
  if (!url) {
    std::cerr << "cellgate exec: " << url.error().message << "\n";
    return kExitUsage;
  }
  // One thread reads the cell's answer (the seam's offload); this one waits for it.
  net::thread_pool pool(1);
  util::Offload offload = [&pool](std::function<void()> fn) { net::post(pool, std::move(fn)); };
  client::Options client_options;
  client_options.client = "cellgate exec";
  auto kernels =
      client::make_remote(std::move(url).value(), options.token, client_options, offload);
  if (!kernels) {
    std::cerr << "cellgate exec: " << kernels.error().message << "\n";
    return kExitUsage;
  }
  execute::ExecuteRequest request;
  request.code = code;
  request.timeout_seconds =
      options.timeout_seconds > 0 ? options.timeout_seconds : kNoTimeoutSeconds;
  EventPrinter printer(options.artifacts_dir);
  client::WaitOptions wait;
  wait.on_event = [&printer](const json& event) { printer.handle(event); };
  wait.kernelspec = options.kernel;
  // --fork / --from-snapshot: a new kernel (kept, its id said), the cell in it.
  std::string kernel_id = options.kernel_id;
  if (!options.fork.empty()) {
    auto copies = (*kernels)->fork(options.fork, 1);
    if (!copies) {
      return exit_code_of(copies.error());
    }
    kernel_id = copies->front();
    std::cerr << "cellgate exec: kernel " << kernel_id << " (a copy of " << options.fork << ")\n";
  } else if (!options.snapshot.empty()) {
    auto copy = (*kernels)->start_from_snapshot(options.snapshot);
    if (!copy) {
      return exit_code_of(copy.error());
    }
    kernel_id = copy->id;
    std::cerr << "cellgate exec: kernel " << kernel_id << " (from snapshot " << options.snapshot
              << ")\n";
  }
  // No kernel id: a fresh kernel for this cell (POST /api/execute).
  auto answer = client::run_and_wait(**kernels, kernel_id, std::move(request), wait);
  pool.join();
  return answer ? exit_code_of(*answer) : exit_code_of(answer.error());
}

}  // namespace cellgate::cli::detail
