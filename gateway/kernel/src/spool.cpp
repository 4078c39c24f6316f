#include "cellgate/kernel/spool.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {
namespace {

using Clock = std::chrono::steady_clock;

Error unavailable(const std::string& what) {
  return make_error(ErrorCode::kUnavailable, "spool", "the launcher's iopub spool: " + what);
}

// Reads into `out` until it holds `want` bytes (or, want == 0, a line) or the deadline passes.
Result<void> read_some(int fd, std::string& out, std::size_t want, Clock::time_point deadline) {
  char buf[65536];
  for (;;) {
    if (want == 0 ? out.find('\n') != std::string::npos : out.size() >= want) {
      return {};
    }
    if (out.size() > kMaxSpoolReplyBytes) {
      return unavailable("the reply is larger than " + std::to_string(kMaxSpoolReplyBytes));
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0) {
      return unavailable("no reply in time");
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) {
      return unavailable("the launcher closed the connection mid-reply");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        continue;
      }
      return errno_error(ErrorCode::kUnavailable, "spool", "read(spool socket)", errno);
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
}

std::uint32_t u32_at(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  }
  return v;
}

// Connects to the launcher's spool socket and sends one request line.
Result<UniqueFd> send_request(const std::string& socket_path, const nlohmann::json& request) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof addr.sun_path) {
    return unavailable("no socket");
  }
  socket_path.copy(addr.sun_path, socket_path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return errno_error(ErrorCode::kUnavailable, "spool", "connect('" + socket_path + "')", errno);
  }
  const std::string line = request.dump() + "\n";
  if (::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(line.size())) {
    return errno_error(ErrorCode::kUnavailable, "spool", "send(spool socket)", errno);
  }
  return fd;
}

}  // namespace

Result<bool> hold_spool(const std::string& socket_path, bool hold,
                        std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd fd, send_request(socket_path, nlohmann::json{{"hold", hold}}));
  std::string in;
  CELLGATE_TRY(read_some(fd.get(), in, 0, deadline));
  const auto reply = nlohmann::json::parse(in.substr(0, in.find('\n')), nullptr, false);
  if (!reply.is_object() || !reply.contains("held") || !reply["held"].is_boolean()) {
    return unavailable("a bad reply to a hold: " +
                       in.substr(0, std::min<std::size_t>(in.size(), 200)));
  }
  return reply["held"].get<bool>();
}

Result<SpooledIopub> fetch_spool(const std::string& socket_path, const std::string& after,
                                 std::chrono::milliseconds timeout, bool head_only) {
  const auto deadline = Clock::now() + timeout;
  nlohmann::json request = nlohmann::json::object();
  if (!after.empty()) {
    request["after"] = after;
  }
  if (head_only) {
    request["head_only"] = true;
  }
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd fd, send_request(socket_path, request));
  std::string in;
  CELLGATE_TRY(read_some(fd.get(), in, 0, deadline));
  const std::size_t eol = in.find('\n');
  const auto head = nlohmann::json::parse(in.substr(0, eol), nullptr, false);
  if (!head.is_object() || !head.contains("count") || !head["count"].is_number_unsigned() ||
      !head.contains("bytes") || !head["bytes"].is_number_unsigned()) {
    return unavailable("a bad reply: " + in.substr(0, std::min<std::size_t>(eol, 200)));
  }
  const auto count = head["count"].get<std::uint64_t>();
  const auto bytes = head["bytes"].get<std::uint64_t>();
  if (bytes > kMaxSpoolReplyBytes) {
    return unavailable("a reply of " + std::to_string(bytes) + " bytes");
  }
  in.erase(0, eol + 1);
  if (bytes > 0) {  // (read_some's `want` 0 means "a line": a head-only reply has no body)
    CELLGATE_TRY(read_some(fd.get(), in, bytes, deadline));
  }
  SpooledIopub out;
  auto flag = [&](const char* key) {
    auto it = head.find(key);
    return it != head.end() && it->is_boolean() && it->get<bool>();
  };
  out.found = flag("found");
  if (auto it = head.find("dropped"); it != head.end() && it->is_number_unsigned()) {
    out.dropped = it->get<std::uint64_t>();
  }
  out.dropped_exact = flag("dropped_exact");
  std::size_t at = 0;
  auto need = [&](std::size_t n) { return at + n <= bytes; };
  for (std::uint64_t m = 0; m < count; ++m) {
    if (!need(4)) {
      return unavailable("a truncated reply");
    }
    const std::uint32_t frames = u32_at(in, at);
    at += 4;
    if (frames > kMaxSpoolFrames) {
      return unavailable("a message of " + std::to_string(frames) + " frames");
    }
    std::vector<std::string> msg;
    msg.reserve(frames);
    for (std::uint32_t f = 0; f < frames; ++f) {
      if (!need(4) || !need(4 + std::size_t{u32_at(in, at)})) {
        return unavailable("a truncated reply");
      }
      const std::uint32_t len = u32_at(in, at);
      msg.emplace_back(in, at + 4, len);
      at += 4 + len;
    }
    out.messages.push_back(std::move(msg));
  }
  return out;
}

}  // namespace cellgate::kernel
