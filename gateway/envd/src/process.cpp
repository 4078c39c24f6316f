// One envd process and its pump (process.hpp).
#include "process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "call.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::envd {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr std::size_t kReadBytes = 32 << 10;
constexpr auto kInputWait = std::chrono::seconds(5);
// Output still in the pipes when the command ended: read for at most this long (a background
// child that keeps the pipe open must not hold the end back).
constexpr auto kTailWait = std::chrono::milliseconds(100);

std::string event_frame(const json& event) {
  return envelope(json{{"event", event}}.dump());
}

// envd's end event, as Go's os.ProcessState reports it: "exit status 1", "signal: killed".
json end_event(const launcher::StatusEvent& ended) {
  if (ended.signal > 0) {
    const char* name = ::strsignal(ended.signal);
    std::string text = name != nullptr ? name : "signal " + std::to_string(ended.signal);
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return {{"end", {{"exitCode", -1}, {"exited", false}, {"status", "signal: " + text}}}};
  }
  return {{"end",
           {{"exitCode", ended.exit_code},
            {"exited", true},
            {"status", "exit status " + std::to_string(ended.exit_code)}}}};
}

void set_nonblocking(int fd) {
  if (fd >= 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

}  // namespace

Process::Process(std::unique_ptr<kernel::JailCommand> command, ProcessConfig config,
                 ProcessHooks hooks)
    : config_(std::move(config)), hooks_(std::move(hooks)), command_(std::move(command)) {}

std::shared_ptr<Process> Process::create(std::unique_ptr<kernel::JailCommand> command,
                                         ProcessConfig config, bool stdin_open,
                                         ProcessHooks hooks) {
  std::shared_ptr<Process> p(new Process(std::move(command), std::move(config), std::move(hooks)));
  p->wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  // Input goes through copies of the descriptors, under in_mu_, so a slow reader of its stdin
  // never holds up the pump.
  UniqueFd input;
  {
    MutexLock lock(p->mu_);
    p->pid_ = p->command_->pid();
    p->pty_ = p->command_->pty();
    if (p->pty_) {
      input.reset(::fcntl(p->command_->pty_fd(), F_DUPFD_CLOEXEC, 3));
    } else if (stdin_open) {
      input.reset(::fcntl(p->command_->stdin_fd(), F_DUPFD_CLOEXEC, 3));
    }
    p->command_->close_stdin();
  }
  set_nonblocking(input.get());
  {
    MutexLock in(p->in_mu_);
    p->input_ = std::move(input);
  }
  return p;
}

void Process::run() {
  std::thread([self = shared_from_this()] { self->pump(); }).detach();
}

Process::~Process() = default;

void Process::wake() {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof one);
}

bool Process::attach(Watcher watcher) {
  MutexLock lock(mu_);
  if (ended_) {
    return false;
  }
  if (!watcher.exchange->write(event_frame({{"start", {{"pid", pid_}}}}))) {
    return true;  // the client left already; nothing to watch for it
  }
  watcher.next_keepalive = Clock::now() + watcher.keepalive;
  watchers_.push_back(std::move(watcher));
  wake();
  return true;
}

Result<void> Process::send_input(const std::string& bytes, bool to_pty) {
  MutexLock lock(in_mu_);
  if (to_pty != pty_) {
    return make_error(ErrorCode::kInvalidArgument, "wrong_input",
                      to_pty ? "the process has no terminal"
                             : "the process has a terminal: send "
                               "its input as pty");
  }
  if (!input_) {
    return make_error(ErrorCode::kFailedPrecondition, "stdin_closed",
                      "the process's stdin is closed (or was not asked for: stdin: true)");
  }
  const auto deadline = Clock::now() + kInputWait;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write_no_sigpipe(input_.get(), bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno != EAGAIN) {
      return errno_error(ErrorCode::kFailedPrecondition, "stdin_closed", "write(stdin)", errno);
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{input_.get(), POLLOUT, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return make_error(ErrorCode::kResourceExhausted, "stdin_full",
                        "the process did not read its input within 5 s (" + std::to_string(done) +
                            " of " + std::to_string(bytes.size()) + " bytes taken)");
    }
  }
  return {};
}

Result<void> Process::close_stdin() {
  MutexLock lock(in_mu_);
  if (pty_) {
    return make_error(ErrorCode::kInvalidArgument, "wrong_input",
                      "a terminal's input is not closed this way");
  }
  input_.reset();
  return {};
}

Result<void> Process::signal(int sig) {
  MutexLock lock(mu_);
  if (ended_ || !command_) {
    return make_error(ErrorCode::kNotFound, "process_ended", "the process has ended");
  }
  return command_->signal(sig);
}

Result<void> Process::resize(kernel::PtySize size) {
  MutexLock lock(mu_);
  if (ended_ || !command_) {
    return make_error(ErrorCode::kNotFound, "process_ended", "the process has ended");
  }
  return command_->resize(size);
}

void Process::stop() {
  stopping_.store(true);
  wake();
  UniqueLock lock(done_mu_);
  done_cv_.wait(lock, [&]() CELLGATE_REQUIRES(done_mu_) { return done_; });
}

void Process::broadcast(const json& event) {
  const std::string frame = event_frame(event);
  std::erase_if(watchers_, [&](Watcher& w) { return !w.exchange->write(frame); });
}

void Process::pump() {
  int out = -1, err = -1, term = -1, control = -1;
  {
    MutexLock lock(mu_);
    out = command_->stdout_fd();
    err = command_->stderr_fd();
    term = command_->pty_fd();
    control = command_->control_fd();
  }
  set_nonblocking(out);
  set_nonblocking(err);
  set_nonblocking(term);
  std::optional<launcher::StatusEvent> ended;
  std::optional<Clock::time_point> tail_until;
  std::string buf(kReadBytes, '\0');
  for (;;) {
    const auto now = Clock::now();
    bool paused = false;
    auto next = now + std::chrono::seconds(60);
    {
      MutexLock lock(mu_);
      std::erase_if(watchers_, [&](Watcher& w) {
        if (w.deadline && now >= *w.deadline) {
          w.exchange->write(end_of_stream(
              ConnectError{"deadline_exceeded", "the stream's Connect-Timeout-Ms passed"}));
          w.exchange->end();
          return true;
        }
        if (now >= w.next_keepalive) {
          w.next_keepalive = now + w.keepalive;
          if (!w.exchange->write(event_frame({{"keepalive", json::object()}}))) {
            return true;
          }
        }
        // A client that left while we held back for it (nothing was written to notice): an
        // empty write only asks whether it is still there.
        if (!w.exchange->write(std::string())) {
          return true;
        }
        next = std::min(next, w.next_keepalive);
        if (w.deadline) {
          next = std::min(next, *w.deadline);
        }
        paused = paused || w.exchange->unsent() > kHighWater;
        return false;
      });
    }
    if (stopping_.load()) {
      break;
    }
    const bool outputs_open = out >= 0 || err >= 0 || term >= 0;
    if (ended && (!outputs_open || now >= *tail_until)) {
      break;
    }
    pollfd fds[5] = {{paused ? -1 : out, POLLIN, 0},
                     {paused ? -1 : err, POLLIN, 0},
                     {paused ? -1 : term, POLLIN, 0},
                     {ended ? -1 : control, POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    if (paused) {
      next = std::min(next, now + std::chrono::milliseconds(20));  // until the clients catch up
    }
    if (ended) {
      next = std::min(next, *tail_until);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
    if (::poll(fds, 5, static_cast<int>(std::max<long long>(wait.count(), 0) + 1)) < 0) {
      continue;
    }
    if (fds[4].revents != 0) {
      std::uint64_t drained = 0;
      (void)!::read(wake_fd_.get(), &drained, sizeof drained);
    }
    struct Output {
      int* fd;
      const char* name;
    };
    const Output outputs[3] = {{&out, "stdout"}, {&err, "stderr"}, {&term, "pty"}};
    for (int i = 0; i < 3; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) {
        continue;
      }
      const ssize_t n = ::read(*outputs[i].fd, buf.data(), buf.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        continue;
      }
      MutexLock lock(mu_);
      if (n <= 0) {  // EOF, or EIO from a terminal whose last holder closed it
        command_->close_output(*outputs[i].fd);
        *outputs[i].fd = -1;
        continue;
      }
      if (watchers_.empty()) {
        dropped_bytes_ += static_cast<std::uint64_t>(n);
        continue;
      }
      broadcast({{"data",
                  {{outputs[i].name, cellgate::base64_encode(std::string_view(
                                         buf.data(), static_cast<std::size_t>(n)))}}}});
    }
    if (fds[3].fd >= 0 && fds[3].revents != 0) {
      MutexLock lock(mu_);
      ended = command_->read_control();
      if (ended) {
        tail_until = Clock::now() + kTailWait;
      }
    }
  }
  if (!ended) {
    // stop(): the gateway is going away. Closing the control socket kills the command.
    MutexLock lock(mu_);
    command_.reset();
    launcher::StatusEvent killed;
    killed.kind = launcher::StatusEvent::Kind::kExited;
    killed.signal = SIGKILL;
    ended = killed;
  }
  finish(end_event(*ended));
}

void Process::finish(const json& end) {
  // A sandbox that is gone cuts its streams; a command that ended in a live sandbox ends them.
  const bool alive = !stopping_.load() && (!hooks_.sandbox_alive || hooks_.sandbox_alive());
  std::vector<Watcher> watchers;
  {
    MutexLock lock(mu_);
    ended_ = true;
    watchers.swap(watchers_);
    command_.reset();
    if (dropped_bytes_ > 0) {
      spdlog::debug("envd: process {} printed {} bytes nobody watched", pid_, dropped_bytes_);
    }
  }
  {
    MutexLock lock(in_mu_);
    input_.reset();
  }
  const std::string frame = event_frame(end);
  for (auto& w : watchers) {
    if (alive) {
      w.exchange->write(frame);
      w.exchange->write(end_of_stream(std::nullopt));
      w.exchange->end();
    } else {
      w.exchange->abort();
    }
  }
  if (hooks_.on_finished) {
    hooks_.on_finished();
  }
  UniqueLock lock(done_mu_);
  done_ = true;
  done_cv_.notify_all();
}

}  // namespace cellgate::envd
