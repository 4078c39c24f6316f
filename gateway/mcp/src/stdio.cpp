#include "cellgate/mcp/stdio.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "cellgate/http/limits.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/sys/error_text.hpp"
#include "jsonrpc.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxLineBytes = std::size_t{64} << 20;  // a 16 MiB file in base64 fits

// Writes whole lines to the output, one at a time, until closed. Shared by every answer in
// flight, so it outlives serve_stdio for answers that arrive late (they are dropped).
class LineWriter {
 public:
  explicit LineWriter(int fd) : fd_(fd) {}
  void write(const json& message) {
    // dump_json never throws (invalid UTF-8 becomes U+FFFD) and escapes newlines in strings, so
    // a message is one line, as the transport requires.
    std::string line = protocol::dump_json(message);
    line += '\n';
    MutexLock lock(mu_);
    if (closed_) {
      return;
    }
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        spdlog::warn("mcp: writing to stdout failed ({}); the client is gone",
                     sys::error_text(errno));
        closed_ = true;
        return;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void close() {
    MutexLock lock(mu_);
    closed_ = true;
  }

 private:
  const int fd_;
  Mutex mu_;
  bool closed_ CELLGATE_GUARDED_BY(mu_) = false;
};

}  // namespace

int serve_stdio(Server& server, int in_fd, int out_fd, int stop_fd) {
  auto writer = std::make_shared<LineWriter>(out_fd);
  auto conversation = server.open();
  auto deliver = [&](std::string_view line) {
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      return;
    }
    json message = http::parse_json(line);
    if (message.is_discarded()) {
      writer->write(jsonrpc::error(nullptr, jsonrpc::kParseError, "Parse error: not JSON"));
      return;
    }
    Outbox out;
    out.reply = [writer](json m) { writer->write(m); };
    out.notify = out.reply;
    server.handle(conversation, message, std::move(out));
  };

  int status = 0;
  std::string buffer;
  bool skipping = false;  // inside an over-long line, until its newline
  char chunk[65536];
  for (;;) {
    pollfd fds[2] = {{in_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    const int ready = ::poll(fds, stop_fd >= 0 ? 2 : 1, -1);
    if (ready < 0) {
      if (errno == EINTR) {
        continue;
      }
      spdlog::error("mcp: poll on stdin failed: {}", sys::error_text(errno));
      status = 1;
      break;
    }
    if (stop_fd >= 0 && fds[1].revents != 0) {
      spdlog::info("mcp: stopping");
      break;
    }
    const ssize_t n = ::read(in_fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        continue;
      }
      spdlog::error("mcp: reading stdin failed: {}", sys::error_text(errno));
      status = 1;
      break;
    }
    if (n == 0) {
      if (!buffer.empty() && !skipping) {
        deliver(buffer);  // a last message without its newline
      }
      spdlog::info("mcp: end of input");
      break;
    }
    std::string_view data(chunk, static_cast<std::size_t>(n));
    while (!data.empty()) {
      const auto nl = data.find('\n');
      const std::string_view piece = data.substr(0, nl);
      if (!skipping) {
        buffer.append(piece);
      }
      if (nl == std::string_view::npos) {
        if (buffer.size() > kMaxLineBytes) {
          writer->write(jsonrpc::error(nullptr, jsonrpc::kParseError,
                                       "Parse error: a message longer than 64 MiB"));
          buffer.clear();
          buffer.shrink_to_fit();
          skipping = true;
        }
        break;
      }
      if (!skipping) {
        deliver(buffer);
      }
      buffer.clear();
      skipping = false;
      data.remove_prefix(nl + 1);
    }
  }
  server.close(*conversation);
  writer->close();
  return status;
}

}  // namespace cellgate::mcp
