#include "cellgate/cli/exec.hpp"

#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <optional>
#include <variant>

#include "cellgate/engine/host.hpp"
#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/util/text.hpp"
#include "output.hpp"

namespace cellgate::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using kernel::Channel;
using nlohmann::json;

struct Delivered {
  Channel channel;
  protocol::Message msg;
};
struct Ended {
  kernel::RequestEnd end;
};
using Event = std::variant<Delivered, Ended>;

// Hands events from the client's I/O thread to the main thread, which may block on the terminal.
class EventQueue {
 public:
  void push(Event ev) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(ev));
    }
    cv_.notify_one();
  }
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) {
      return std::nullopt;
    }
    Event ev = std::move(events_.front());
    events_.pop_front();
    return ev;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

int fail(const std::string& what) {
  std::cerr << "cellgate exec: " << what << "\n";
  return kExitUsage;
}

Result<std::string> read_code(const ExecOptions& options, bool& from_stdin) {
  from_stdin = false;
  if (!options.file.empty() && options.file != "-") {
    std::ifstream in(options.file, std::ios::binary);
    if (!in) {
      return make_error(ErrorCode::kNotFound, "no_file", "cannot read " + options.file);
    }
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (!options.code.empty() && options.file.empty() && options.code != "-") {
    return options.code;
  }
  from_stdin = true;
  return std::string(std::istreambuf_iterator<char>(std::cin), {});
}

class CellPrinter {
 public:
  CellPrinter(kernel::KernelClient& client, bool allow_stdin, std::string artifacts_dir)
      : client_(client),
        allow_stdin_(allow_stdin),
        color_(::isatty(STDERR_FILENO) == 1),
        saver_(std::move(artifacts_dir)) {}

  void handle(Channel channel, const protocol::Message& msg) {
    const std::string type = msg.msg_type();
    const json& c = msg.content;
    if (channel == Channel::kShell && type == "execute_reply") {
      status_ = c.value("status", "error");
    } else if (type == "stream") {
      std::FILE* out = c.value("name", "stdout") == "stderr" ? stderr : stdout;
      const std::string text = c.value("text", "");
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    } else if (type == "execute_result" || type == "display_data") {
      detail::print_bundle(c.value("data", json::object()), saver_);
    } else if (type == "error") {
      std::string tb;
      if (auto t = c.find("traceback"); t != c.end() && t->is_array()) {
        for (const auto& line : *t) {
          if (line.is_string()) {
            tb += line.get<std::string>() + "\n";
          }
        }
      }
      if (tb.empty()) {
        tb = c.value("ename", "Error") + ": " + c.value("evalue", "") + "\n";
      }
      std::cout << std::flush;
      std::cerr << (color_ ? tb : strip_ansi(tb)) << std::flush;
    } else if (channel == Channel::kStdin && type == "input_request") {
      std::string value;
      if (allow_stdin_) {
        std::cout << c.value("prompt", "") << std::flush;
        std::getline(std::cin, value);
      }
      client_.send_input(msg, value);
    }
  }

  const std::string& status() const { return status_; }

 private:
  kernel::KernelClient& client_;
  bool allow_stdin_;
  bool color_;
  detail::ArtifactSaver saver_;
  std::string status_ = "error";
};

}  // namespace

int run_exec(const ExecOptions& options) {
  bool from_stdin = false;
  auto code = read_code(options, from_stdin);
  if (!code) {
    return fail(code.error().message);
  }
  if (!options.url.empty()) {
    return detail::run_remote_exec(options, *code);
  }
  if (!options.kernel_id.empty() || !options.fork.empty() || !options.snapshot.empty()) {
    return fail("--kernel-id, --fork and --from-snapshot need --url (a running gateway's kernel)");
  }
  auto spec = kernel::find_kernelspec(options.kernel);
  if (!spec) {
    return fail(spec.error().message);
  }
  kernel::LaunchRequest launch;
  launch.spec = std::move(spec).value();
  launch.die_with_parent = true;
  // The host's steps (engine/host.hpp), after the jail spec, whose cgroup parent is taken as
  // given.
  jail::JailSpec jail_spec;
  if (!options.no_jail && !options.jail_spec.empty()) {
    auto loaded = launcher::load_spec(options.jail_spec);
    if (!loaded) {
      return fail(loaded.error().describe());
    }
    jail_spec = std::move(loaded).value();
  }
  engine::HostOptions host;
  host.jailed = !options.no_jail;
  host.cgroup_parent = jail_spec.cgroup_parent;
  host.place_cgroups = jail_spec.cgroup_parent.empty();
  if (options.verbose) {
    host.report = [](engine::HostStep step, const std::string& line) {
      if (step == engine::HostStep::kProbe) {
        std::cerr << "cellgate exec: host: " << line << "\n";
      }
    };
  }
  auto prepared = engine::prepare_host(host);
  if (!prepared) {
    return fail(prepared.error().message);
  }
  if (!options.no_jail) {
    jail_spec.cgroup_parent = prepared->cgroup_parent;
    launch.jail = std::move(jail_spec);
  }
  auto process = kernel::KernelProcess::start(std::move(launch));
  if (!process) {
    return fail(process.error().describe());
  }
  auto& kp = *process.value();
  if (options.verbose) {
    std::cerr << "cellgate exec: kernel pid " << kp.pid()
              << (kp.jailed() ? " (jailed)" : " (unjailed)") << ", runtime " << kp.connection_file()
              << ", log " << kp.log_file() << "\n";
  }

  EventQueue events;
  kernel::ClientOptions client_options;
  auto client_result = kernel::KernelClient::connect(kp.connection(), client_options);
  if (!client_result) {
    return fail(client_result.error().describe());
  }
  auto& client = *client_result.value();
  if (auto ready = client.wait_ready(30s); !ready) {
    if (auto ended = kp.poll_exit()) {
      return fail(std::string("the kernel exited while starting (") +
                  (ended->message.empty() ? "" : ended->message + "; ") +
                  launcher::to_string(ended->reason) + "); its log ends with:\n" + kp.log_tail());
    }
    return fail(ready.error().describe());
  }

  // input() can only be answered from the terminal when the code did not come from stdin.
  const bool allow_stdin = !from_stdin;
  CellPrinter printer(client, allow_stdin, options.artifacts_dir);
  kernel::RequestHandlers handlers;
  handlers.on_message = [&events](Channel ch, const protocol::Message& msg) {
    events.push(Delivered{ch, msg});
  };
  handlers.on_end = [&events](kernel::RequestEnd end) { events.push(Ended{end}); };
  client.send(Channel::kShell, "execute_request",
              kernel::execute_content(std::move(code).value(), allow_stdin), std::move(handlers));

  std::optional<Clock::time_point> deadline;
  if (options.timeout_seconds > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options.timeout_seconds));
  }
  bool interrupted = false;
  int exit_code = kExitOk;
  for (;;) {
    auto ev = events.pop(100ms);
    if (!ev) {
      if (auto ended = kp.poll_exit()) {
        std::cerr << "cellgate exec: the kernel died (" << launcher::to_string(ended->reason)
                  << (ended->signal != 0 ? ", signal " + std::to_string(ended->signal) : "")
                  << (ended->message.empty() ? "" : ": " + ended->message) << ")\n";
        return kExitKernelDied;
      }
      if (deadline && Clock::now() > *deadline) {
        if (interrupted) {
          std::cerr << "cellgate exec: the cell did not stop after an interrupt\n";
          return kExitTimeout;
        }
        std::cerr << "cellgate exec: timeout after " << options.timeout_seconds
                  << " s; interrupting\n";
        (void)kp.signal(SIGINT);
        interrupted = true;
        *deadline = Clock::now() + 5s;
      }
      continue;
    }
    if (auto* d = std::get_if<Delivered>(&*ev)) {
      printer.handle(d->channel, d->msg);
      continue;
    }
    auto end = std::get<Ended>(*ev).end;
    if (end != kernel::RequestEnd::kComplete) {
      std::cerr << "cellgate exec: the kernel died during the cell (" << kernel::to_string(end)
                << ")\n";
      return kExitKernelDied;
    }
    exit_code = interrupted ? kExitTimeout : (printer.status() == "ok" ? kExitOk : kExitCellError);
    break;
  }
  // A polite shutdown, so the kernel can clean up; the process owner kills it otherwise.
  (void)client.request(Channel::kControl, "shutdown_request", json{{"restart", false}}, 2s, false);
  kp.wait_exit(1s);
  return exit_code;
}

}  // namespace cellgate::cli
