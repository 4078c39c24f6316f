// Jailed vs unjailed kernel start: what the jail costs a user waiting for a kernel.
//
// For each run it measures, from KernelProcess::start:
//   ready   - until KernelClient::wait_ready succeeds (kernel_info_reply, iopub live);
//   execute - until the execute_reply of the first cell, `print(1)`.
// Runs alternate between the modes round-robin (the order flips every round) so machine load
// hits both alike, after one discarded warm-up of each. Prints median, min and max per mode and
// the jailed/unjailed ratio of the medians.
//
//   cellgate_jail_bench [--runs N]      (default 10; jailed mode needs root)
//
// Exits 0 when every start succeeded, 1 when one failed, 2 on a usage error.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/process.hpp"

namespace {

using cellgate::Result;
using cellgate::kernel::Channel;
using cellgate::kernel::KernelClient;
using cellgate::kernel::KernelProcess;
using cellgate::kernel::KernelSpec;
using cellgate::kernel::LaunchRequest;
using cellgate::kernel::RequestEnd;
using cellgate::kernel::RequestHandlers;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = 60s;
constexpr auto kReadyTimeout = 60s;
constexpr auto kExecuteTimeout = 60s;

struct Sample {
  double ready_ms = 0;
  double execute_ms = 0;
};

struct Mode {
  std::string name;
  bool jailed = false;
  std::vector<double> ready_ms;
  std::vector<double> execute_ms;
};

struct Options {
  int runs = 10;
};

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// What the first cell's request produced, written on the client's I/O thread before `done` is
// set (the future orders it before the reader).
struct ExecuteOutcome {
  std::optional<Clock::time_point> reply_at;
  std::string status;
  std::string stdout_text;
  RequestEnd end = RequestEnd::kComplete;
};

std::string failure(const std::string& mode, const std::string& what,
                    const KernelProcess* process) {
  std::string text = mode + ": " + what;
  if (process != nullptr) {
    const std::string tail = process->log_tail(1500);
    if (!tail.empty()) {
      text += "\n--- kernel log (tail) ---\n" + tail;
    }
  }
  return text;
}

// One kernel: start, wait until ready, run `print(1)`, then the destructors kill it and clean up.
// Returns the sample or a description of what failed.
Result<Sample> measure_once(const KernelSpec& spec, const Mode& mode) {
  LaunchRequest request;
  request.spec = spec;
  request.launcher_path = std::string(CELLGATE_BIN_DIR) + "/cellgate-kernel";
  request.die_with_parent = true;
  request.start_timeout = kStartTimeout;
  if (mode.jailed) {
    request.jail = cellgate::jail::JailSpec{};
  }
  auto fail = [&](const std::string& what, const KernelProcess* process) {
    return cellgate::make_error(cellgate::ErrorCode::kInternal, "bench",
                                failure(mode.name, what, process));
  };

  const auto t0 = Clock::now();
  auto process = KernelProcess::start(std::move(request));
  if (!process) {
    return fail("start: " + process.error().describe(), nullptr);
  }
  auto client = KernelClient::connect(process.value()->connection());
  if (!client) {
    return fail("connect: " + client.error().describe(), process.value().get());
  }
  auto ready = client.value()->wait_ready(kReadyTimeout);
  if (!ready) {
    return fail("wait_ready: " + ready.error().describe(), process.value().get());
  }
  const auto t_ready = Clock::now();

  auto outcome = std::make_shared<ExecuteOutcome>();
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  RequestHandlers handlers;
  handlers.on_message = [outcome](Channel channel, const cellgate::protocol::Message& msg) {
    const std::string type = msg.msg_type();
    if (channel == Channel::kShell && type == "execute_reply" && !outcome->reply_at) {
      outcome->reply_at = Clock::now();
      outcome->status = msg.content.value("status", "");
    } else if (channel == Channel::kIopub && type == "stream" &&
               msg.content.value("name", "") == "stdout") {
      outcome->stdout_text += msg.content.value("text", "");
    }
  };
  handlers.on_end = [outcome, done](RequestEnd end) {
    outcome->end = end;
    done->set_value();
  };
  client.value()->send(Channel::kShell, "execute_request",
                       cellgate::kernel::execute_content("print(1)"), std::move(handlers));
  if (finished.wait_for(kExecuteTimeout) != std::future_status::ready) {
    return fail("no execute_reply within 60 s", process.value().get());
  }
  if (outcome->end != RequestEnd::kComplete || !outcome->reply_at) {
    return fail(std::string("execute ended: ") + cellgate::kernel::to_string(outcome->end),
                process.value().get());
  }
  if (outcome->status != "ok" || outcome->stdout_text != "1\n") {
    return fail(
        "print(1) gave status '" + outcome->status + "', stdout '" + outcome->stdout_text + "'",
        process.value().get());
  }
  return Sample{ms_since(t0, t_ready), ms_since(t0, *outcome->reply_at)};
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

void print_table(const char* metric, const std::vector<Mode>& modes, bool ready) {
  std::printf("\n%s\n", metric);
  std::printf("  %-10s %5s %10s %10s %10s\n", "mode", "runs", "median", "min", "max");
  for (const auto& mode : modes) {
    const auto& values = ready ? mode.ready_ms : mode.execute_ms;
    const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
    std::printf("  %-10s %5zu %10.1f %10.1f %10.1f\n", mode.name.c_str(), values.size(),
                median(values), *lo, *hi);
  }
  if (modes.size() == 2) {
    const double jailed = median(ready ? modes[0].ready_ms : modes[0].execute_ms);
    const double unjailed = median(ready ? modes[1].ready_ms : modes[1].execute_ms);
    std::printf("  ratio jailed/unjailed (medians): %.2f\n", jailed / unjailed);
  }
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (end == nullptr || *end != '\0' || n < 1 || n > 10000) {
        return std::nullopt;
      }
      options.runs = static_cast<int>(n);
    } else {
      return std::nullopt;
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const auto options = parse_args(argc, argv);
  if (!options) {
    std::fprintf(stderr, "usage: %s [--runs N]   (N >= 1, default 10)\n", argv[0]);
    return 2;
  }
  auto spec = cellgate::kernel::find_kernelspec("python3");
  if (!spec) {
    std::fprintf(stderr, "no python3 kernelspec: %s\n", spec.error().describe().c_str());
    return 1;
  }

  std::vector<Mode> modes;
  if (::geteuid() == 0) {
    modes.push_back({"jailed", true, {}, {}});
  } else {
    std::printf("jailed mode needs root (namespaces, cgroups, mounts): measuring unjailed only\n");
  }
  modes.push_back({"unjailed", false, {}, {}});

  std::printf(
      "kernel start, launch -> kernel_info_reply and -> first execute_reply; "
      "%d run(s) per mode after one warm-up, round-robin\n",
      options->runs);
  std::fflush(stdout);
  for (int round = -1; round < options->runs; ++round) {
    for (std::size_t k = 0; k < modes.size(); ++k) {
      // Flip the order every round so neither mode always follows the other.
      Mode& mode = modes[round % 2 == 0 ? k : modes.size() - 1 - k];
      auto sample = measure_once(*spec, mode);
      if (!sample) {
        std::fprintf(stderr, "FAILED: %s\n", sample.error().message.c_str());
        return 1;
      }
      if (round < 0) {
        continue;  // the warm-up: page cache, cgroup hierarchy, Python's bytecode caches
      }
      mode.ready_ms.push_back(sample->ready_ms);
      mode.execute_ms.push_back(sample->execute_ms);
    }
  }

  print_table("launch -> kernel_info_reply (ms)", modes, true);
  print_table("launch -> first execute_reply of print(1) (ms)", modes, false);
  return 0;
}
