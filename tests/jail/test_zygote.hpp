// The jail tests' zygote (`cellgate-kernel --zygote`), shared by every test of the binary that
// starts kernels in zygote mode (containment_test.cpp, exec_test.cpp), and the Cold/Zygote modes
// those tests are parameterized over.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"
#include "placement.hpp"

namespace cellgate::kernel {

using namespace std::chrono_literals;

// How long a zygote, a kernel start or a cell may take before the test calls it hung: a bound on a
// hang, not a speed expectation. In the systemd guest (software emulation) on a busy host a
// zygote-forked kernel's first cell took over 60 s.
inline constexpr auto kHangBound = 300s;
// In the environment the test's zygote is started with; it re-execs itself with an empty one.
inline constexpr const char* kZygoteCanaryValue = "cellgate-zygote-canary-51d0e8";

enum class Mode { kCold, kZygote };

inline std::string mode_name(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kCold ? "Cold" : "Zygote";
}
// For gtest's (and ctest's) test names: "# GetParam() = Zygote", not the bytes.
inline void PrintTo(Mode mode, std::ostream* os) {
  *os << (mode == Mode::kCold ? "Cold" : "Zygote");
}

// `cellgate-kernel --zygote` with a canary in its environment, started once per test binary
// (lazily: only when a zygote-mode test runs) and stopped by its pid at the end; it dies with the
// test process (PR_SET_PDEATHSIG) if that is killed first.
class TestZygote {
 public:
  static Result<std::unique_ptr<TestZygote>> start() {
    std::unique_ptr<TestZygote> z(new TestZygote);
    std::string pattern =
        (std::filesystem::temp_directory_path() / "cellgate-containment-zygote-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return errno_error(ErrorCode::kInternal, "zygote", "mkdtemp()", errno);
    }
    z->dir_ = pattern;
    z->socket_ = z->dir_ + "/z.sock";
    const std::string log = z->dir_ + "/zygote.log";
    const std::string launcher = cellgate::jail::testing::bin_dir() + "/cellgate-kernel";
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      return errno_error(ErrorCode::kInternal, "zygote", "pipe2()", errno);
    }
    constexpr int kStatusFd = 3;
    UniqueFd read_end(fds[0]);
    // Above the status fd: dup2 onto 3 must not be a no-op (which would keep FD_CLOEXEC).
    UniqueFd write_end(::fcntl(fds[1], F_DUPFD_CLOEXEC, 10));
    ::close(fds[1]);
    UniqueFd log_fd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!write_end || !log_fd || !null_fd) {
      return errno_error(ErrorCode::kInternal, "zygote", "fcntl() or open()", errno);
    }
    std::vector<std::string> args = {launcher,   "--zygote",    "--socket",
                                     z->socket_, "--status-fd", std::to_string(kStatusFd)};
    std::vector<std::string> env = {"PATH=/usr/bin:/bin",
                                    std::string("CELLGATE_ZYGOTE_CANARY=") + kZygoteCanaryValue};
    std::vector<char*> argv, envp;
    for (auto& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    for (auto& e : env) {
      envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    z->pid_ = ::fork();
    if (z->pid_ < 0) {
      return errno_error(ErrorCode::kInternal, "zygote", "fork()", errno);
    }
    if (z->pid_ == 0) {
      // Async-signal-safe calls only. Dies with this test process, even when it is killed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent || ::dup2(null_fd.get(), STDIN_FILENO) < 0 ||
          ::dup2(log_fd.get(), STDOUT_FILENO) < 0 || ::dup2(log_fd.get(), STDERR_FILENO) < 0 ||
          ::dup2(write_end.get(), kStatusFd) < 0) {
        ::_exit(127);
      }
      ::close_range(kStatusFd + 1, ~0U, 0);
      ::execve(launcher.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    write_end.reset();
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + kHangBound;
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{read_end.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return make_error(ErrorCode::kInternal, "zygote",
                          "not ready in " + std::to_string(kHangBound.count()) + " s: " + z->log());
      }
      char buf[512];
      const ssize_t n = ::read(read_end.get(), buf, sizeof buf);
      if (n <= 0) {
        return make_error(ErrorCode::kInternal, "zygote", "ended before ready: " + z->log());
      }
      line.append(buf, static_cast<std::size_t>(n));
    }
    const auto ready = nlohmann::json::parse(line.substr(0, line.find('\n')), nullptr, false);
    if (!ready.is_object() || ready.value("event", "") != "ready") {
      return make_error(ErrorCode::kInternal, "zygote", "did not start: " + line + z->log());
    }
    return z;
  }

  ~TestZygote() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(dir_ + "/zygote.log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

 private:
  TestZygote() = default;
  std::string dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

inline TestZygote* g_zygote = nullptr;

// The binary's zygote, started on first use.
inline Result<TestZygote*> shared_zygote() {
  if (g_zygote == nullptr) {
    CELLGATE_ASSIGN_OR_RETURN(auto z, TestZygote::start());
    g_zygote = z.release();
  }
  return g_zygote;
}

class ZygoteEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    delete g_zygote;
    g_zygote = nullptr;
  }
};
[[maybe_unused]] inline ::testing::Environment* const zygote_environment =
    ::testing::AddGlobalTestEnvironment(new ZygoteEnvironment);

}  // namespace cellgate::kernel
