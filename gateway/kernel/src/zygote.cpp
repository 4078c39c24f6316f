#include "cellgate/kernel/zygote.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "cellgate/kernel/process.hpp"
#include "cellgate/sys/error_text.hpp"

namespace cellgate::kernel {
namespace {

constexpr int kStatusFd = 3;  // where spawn_with_status_fd puts the status pipe
using Clock = std::chrono::steady_clock;

}  // namespace

Zygote::Zygote(ZygoteOptions options) : options_(std::move(options)) {
  MutexLock lock(mu_);
  spawn_locked();
}

Zygote::~Zygote() {
  MutexLock lock(mu_);
  if (pid_ <= 0) {
    return;
  }
  ::kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::unlink(options_.socket_path.c_str());
}

void Zygote::spawn_locked() {
  ready_ = false;
  status_buffer_.clear();
  const std::string launcher = options_.launcher_path.empty()
                                   ? executable_dir() + "/cellgate-kernel"
                                   : options_.launcher_path;
  std::vector<std::string> args = {launcher,      "--zygote",
                                   "--socket",    options_.socket_path,
                                   "--status-fd", std::to_string(kStatusFd)};
  if (!options_.preload.empty()) {
    std::string list;
    for (const auto& m : options_.preload) {
      list += (list.empty() ? "" : ",") + m;
    }
    args.insert(args.end(), {"--preload", list});
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::error("zygote: pipe2(): {}", sys::error_text(errno));
    return;
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(::fcntl(fds[1], F_DUPFD_CLOEXEC, 10));  // dup2 onto 3 must not be a no-op
  ::close(fds[1]);
  auto spawned = spawn_with_status_fd(std::move(args), {}, write_end.get(), options_.log_file);
  if (!spawned) {
    spdlog::error("zygote: {}", spawned.error().message);
    failed_ = true;
    next_start_ = Clock::now() + backoff_;
    backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(30000));
    return;
  }
  const pid_t pid = *spawned;  // with an empty environment: the zygote must hold no secret
  pid_ = pid;
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  status_fd_ = std::move(read_end);
  spdlog::info("zygote: started pid {} on {} (log {})", pid_, options_.socket_path,
               options_.log_file);
}

void Zygote::read_status_locked() {
  if (!status_fd_) {
    return;
  }
  char buf[1024];
  for (;;) {
    ssize_t n = ::read(status_fd_.get(), buf, sizeof buf);
    if (n > 0) {
      status_buffer_.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) {
      status_fd_.reset();
    }
    break;
  }
  for (auto nl = status_buffer_.find('\n'); nl != std::string::npos;
       nl = status_buffer_.find('\n')) {
    const auto j = nlohmann::json::parse(status_buffer_.substr(0, nl), nullptr, false);
    status_buffer_.erase(0, nl + 1);
    if (!j.is_object()) {
      continue;
    }
    const std::string event = j.value("event", "");
    if (event == "ready") {
      ready_ = true;
      backoff_ = std::chrono::milliseconds(1000);
      spdlog::info("zygote: ready (pid {}, preload {} ms)", pid_, j.value("preload_ms", 0));
      ready_cv_.notify_all();
    } else if (event == "exited") {
      failed_ = true;
      spdlog::error("zygote: could not start: {}; kernels start cold meanwhile",
                    j.value("message", std::string("no reason given")));
    }
  }
}

void Zygote::tick() {
  MutexLock lock(mu_);
  read_status_locked();
  if (pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      const std::string how = WIFSIGNALED(status)
                                  ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exited with " + std::to_string(WEXITSTATUS(status));
      spdlog::warn(
          "zygote: pid {} {}; its kernels run on, new ones start cold until it is back "
          "(in {} ms)",
          pid_, how, backoff_.count());
      if (!ready_) {
        failed_ = true;
      }
      pid_ = -1;
      ready_ = false;
      status_fd_.reset();
      next_start_ = Clock::now() + backoff_;
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(30000));
    }
  }
  if (pid_ <= 0 && Clock::now() >= next_start_) {
    ++restarts_;
    spawn_locked();
  }
}

std::string Zygote::ready_socket() {
  MutexLock lock(mu_);
  read_status_locked();
  return ready_ && pid_ > 0 ? options_.socket_path : std::string();
}

bool Zygote::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      MutexLock lock(mu_);
      if (ready_ && pid_ > 0) {
        return true;
      }
    }
    tick();
    UniqueLock lock(mu_);
    if (ready_ && pid_ > 0) {
      return true;
    }
    if (Clock::now() >= deadline) {
      return false;
    }
    ready_cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

bool Zygote::failed() {
  MutexLock lock(mu_);
  read_status_locked();
  return failed_;
}

pid_t Zygote::pid() {
  MutexLock lock(mu_);
  return pid_;
}

int Zygote::restarts() {
  MutexLock lock(mu_);
  return restarts_;
}

}  // namespace cellgate::kernel
