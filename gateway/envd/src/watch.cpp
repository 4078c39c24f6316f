// One WatchDir stream (watch.hpp) and the RPC that starts it (EnvdApi::watch_dir).
#include "watch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <thread>

#include "call.hpp"
#include "cellgate/http/limits.hpp"

namespace cellgate::envd {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr std::size_t kMaxWatchesPerStream = 1024;  // inotify watches: directories, recursive

std::string frame(const json& message) {
  return envelope(message.dump());
}

}  // namespace

DirWatch::DirWatch(WatchHooks hooks) : hooks_(std::move(hooks)) {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
}

void DirWatch::run(std::function<Result<kernel::JailTarget>()> target,
                   kernel::CommandRequest request, http::Request req, Watcher watcher) {
  std::thread([self = shared_from_this(), target = std::move(target), request = std::move(request),
               req = std::move(req), watcher = std::move(watcher)]() mutable {
    self->serve(target, request, req, watcher);
    if (self->hooks_.on_finished) {
      self->hooks_.on_finished(self.get());
    }
    UniqueLock lock(self->done_mu_);
    self->done_ = true;
    self->done_cv_.notify_all();
  }).detach();
}

void DirWatch::stop() {
  stopping_.store(true);
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof one);
  UniqueLock lock(done_mu_);
  done_cv_.wait(lock, [&]() CELLGATE_REQUIRES(done_mu_) { return done_; });
}

void DirWatch::serve(const std::function<Result<kernel::JailTarget>()>& target,
                     const kernel::CommandRequest& request, const http::Request& req, Watcher& w) {
  http::Exchange& ex = *w.exchange;
  auto jail = target();
  if (!jail) {
    return stream_error(ex, req, jail.error());
  }
  auto started = kernel::JailCommand::start(*jail, request);
  if (!started) {
    return stream_error(ex, req, started.error());
  }
  std::unique_ptr<kernel::JailCommand> cmd = std::move(started).value();
  cmd->close_stdin();
  const int out = cmd->stdout_fd();
  ::fcntl(out, F_SETFL, ::fcntl(out, F_GETFL) | O_NONBLOCK);
  bool begun = false;
  std::optional<Error> error;  // the watcher's answer line, when it reported one
  std::string pending;
  int sent_this_second = 0;
  auto second = Clock::now();
  // One line of the watcher: a message for the stream, or its last word.
  auto line = [&](std::string_view text) {
    const json j = http::parse_json(text);
    if (!j.is_object()) {
      return;
    }
    if (j.contains("start") && !begun) {
      ex.begin(stream_head(req));
      begun = true;
      w.next_keepalive = Clock::now() + w.keepalive;
      ex.write(frame({{"start", json::object()}}));
    } else if (j.contains("filesystem") && j["filesystem"].is_object() && begun) {
      const json& e = j["filesystem"];
      const auto text_of = [&](const char* key) {
        return e.contains(key) && e[key].is_string() ? e[key].get<std::string>() : std::string();
      };
      json event = {{"name", text_of("name")}, {"type", text_of("type")}};
      if (e.contains("entry") && e["entry"].is_object()) {
        event["entry"] = e["entry"];
      }
      ++sent_this_second;
      ex.write(frame({{"filesystem", event}}));
    } else if (j.contains("error")) {
      error = filesystem_error(j["error"]);
    }
  };
  // Ends the stream with an error: in the end-of-stream message, or as the whole answer.
  auto end_with = [&](const Error& e) {
    if (!begun) {
      return stream_error(ex, req, e);
    }
    ex.write(end_of_stream(connect_error(e)));
    ex.end();
  };
  std::string buf(64 << 10, '\0');
  for (;;) {
    const auto now = Clock::now();
    if (stopping_.load()) {
      return begun ? ex.abort()
                   : stream_error(ex, req,
                                  make_error(ErrorCode::kUnavailable, "shutting_down",
                                             "the gateway is stopping"));
    }
    if (w.deadline && now >= *w.deadline) {
      return end_with(make_error(ErrorCode::kDeadlineExceeded, "deadline_exceeded",
                                 "the stream's Connect-Timeout-Ms passed"));
    }
    auto next = now + std::chrono::seconds(1);
    if (begun) {
      if (now >= w.next_keepalive) {
        w.next_keepalive = now + w.keepalive;
        ex.write(frame({{"keepalive", json::object()}}));
      }
      // The client left (SDK: handle.stop()): an empty write asks; returning kills the watcher.
      if (!ex.write(std::string())) {
        return;
      }
      next = std::min(next, w.next_keepalive);
    }
    if (w.deadline) {
      next = std::min(next, *w.deadline);
    }
    if (now - second >= std::chrono::seconds(1)) {
      second = now;
      sent_this_second = 0;
    }
    const bool paused =
        (begun && ex.unsent() > kHighWater) || sent_this_second >= kMaxEventsPerSecond;
    if (paused) {
      next = std::min(next, now + std::chrono::milliseconds(20));
    }
    if (cmd->stdout_fd() < 0 && cmd->exited()) {
      break;
    }
    pollfd fds[3] = {{paused ? -1 : cmd->stdout_fd(), POLLIN, 0},
                     {cmd->exited() ? -1 : cmd->control_fd(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
    if (::poll(fds, 3, static_cast<int>(std::max<long long>(wait.count(), 0) + 1)) < 0) {
      continue;
    }
    if (fds[2].revents != 0) {
      std::uint64_t drained = 0;
      (void)!::read(wake_fd_.get(), &drained, sizeof drained);
    }
    if (fds[0].fd >= 0 && fds[0].revents != 0) {
      const ssize_t n = ::read(fds[0].fd, buf.data(), buf.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        continue;
      }
      if (n <= 0) {
        cmd->close_output(fds[0].fd);
        line(pending);  // the last line has no newline
        pending.clear();
      } else {
        std::string_view data(buf.data(), static_cast<std::size_t>(n));
        for (std::size_t nl; (nl = data.find('\n')) != std::string_view::npos;) {
          pending.append(data.substr(0, nl));
          if (pending.size() <= kMaxLine) {
            line(pending);
          }
          pending.clear();
          data.remove_prefix(nl + 1);
        }
        pending.append(data);
        if (pending.size() > kMaxLine) {
          return end_with(make_error(ErrorCode::kResourceExhausted, "event_too_large",
                                     "a watch event exceeds 256 KiB"));
        }
      }
    }
    if (fds[1].fd >= 0 && fds[1].revents != 0) {
      cmd->read_control();
    }
  }
  // The watcher ended: its error, the watched directory gone (a clean end), or the sandbox gone.
  if (hooks_.sandbox_alive && !hooks_.sandbox_alive()) {
    return begun ? ex.abort()
                 : stream_error(ex, req,
                                make_error(ErrorCode::kUnavailable, "sandbox_gone",
                                           "the sandbox is not running"));
  }
  if (error || !begun) {
    return end_with(error ? *error
                          : make_error(ErrorCode::kInternal, "watch_failed",
                                       "the watcher ended before it started (exit " +
                                           std::to_string(cmd->exited()->exit_code) + ")"));
  }
  ex.write(end_of_stream(std::nullopt));
  ex.end();
}

void EnvdApi::watch_dir(Call& call) {
  const json path = call.body.value("path", json());
  if (!path.is_string() || path.get<std::string>().empty() ||
      path.get<std::string>().size() > 4096) {
    return stream_error(*call.exchange, call.req,
                        make_error(ErrorCode::kInvalidArgument, "bad_request",
                                   "path must be a path of at most 4096 bytes"));
  }
  const json args = {{"path", path},
                     {"recursive", call.body.value("recursive", json(false)).is_boolean() &&
                                       call.body.value("recursive", false)},
                     {"includeEntry", call.body.value("includeEntry", json(false)).is_boolean() &&
                                          call.body.value("includeEntry", false)},
                     {"maxWatches", kMaxWatchesPerStream}};
  kernel::CommandRequest request;
  request.argv = {"/usr/bin/python3", "-I", "-c", filesystem_program(), "watch", args.dump()};
  request.cwd = options_.home;
  request.env = {"HOME=" + options_.home, "USER=" + options_.user};
  Watcher watcher;
  watcher.exchange = call.exchange;
  stream_timing(call.req, watcher);
  const std::string kernel_id = call.sandbox.kernel_id;
  WatchHooks hooks;
  hooks.sandbox_alive = [this, id = call.sandbox.sandbox_id] { return sandbox_alive(id); };
  hooks.on_finished = [this, kernel_id](DirWatch* done) {
    MutexLock lock(mu_);
    auto live = watches_.find(kernel_id);
    if (live != watches_.end()) {
      live->second.erase(done);
      if (live->second.empty()) {
        watches_.erase(live);
      }
    }
  };
  auto w = std::make_shared<DirWatch>(std::move(hooks));
  {
    MutexLock lock(mu_);
    auto& live = watches_[kernel_id];
    if (live.size() >= options_.max_watches) {
      return stream_error(*call.exchange, call.req,
                          make_error(ErrorCode::kResourceExhausted, "too_many_watches",
                                     "the sandbox has " + std::to_string(options_.max_watches) +
                                         " directory watches already"));
    }
    live[w.get()] = w;
  }
  w->run([this, kernel_id] { return options_.jail_of(kernel_id); }, std::move(request),
         std::move(call.req), std::move(watcher));
}

}  // namespace cellgate::envd
