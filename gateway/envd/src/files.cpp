// envd's REST /files (GET: a file's bytes; POST: multipart/form-data or application/octet-stream
// uploads, X-Metadata-* as user.e2b.* xattrs), each a short Python program run in the sandbox's
// jail as the kernel's uid, as the filesystem RPCs are (filesystem.cpp). gzip both ways
// (gzip.hpp): GET with Accept-Encoding: gzip is compressed as it is read; a POST with
// Content-Encoding: gzip inflates to at most the body limit (413 past it). Errors are JSON
// {"code": <HTTP status>, "message"} with E2B's statuses (404, 400, 413, 507).
#include <fcntl.h>
#include <poll.h>
#include <strings.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "call.hpp"
#include "cellgate/envd/envd_api.hpp"
#include "cellgate/envd/gzip.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/kernel/jail_command.hpp"

namespace cellgate::envd {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kFileTimeout = std::chrono::seconds(120);
constexpr std::size_t kHighWater = 1u << 20;
constexpr std::size_t kMaxParts = 64;

// argv[1]: the path. Errors: one JSON line on stderr, exit 2; else the bytes on stdout.
constexpr const char* kReader = R"PY(
import json, os, shutil, sys
try:
    p = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(sys.argv[1])))
    f = open(p, 'rb')
    if not os.path.isfile(p):
        raise IsADirectoryError('not a regular file: ' + p)
except FileNotFoundError:
    sys.stderr.write(json.dumps({'code': 404, 'message': 'file not found: ' + sys.argv[1]})); sys.exit(2)
except (OSError, ValueError) as e:
    sys.stderr.write(json.dumps({'code': 400, 'message': str(e)})); sys.exit(2)
shutil.copyfileobj(f, sys.stdout.buffer, 1 << 16)
)PY";

// argv[1]: the path, argv[2]: the metadata (JSON object). stdin: the content.
constexpr const char* kWriter = R"PY(
import errno, json, os, shutil, sys
try:
    p = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(sys.argv[1])))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 16)
    meta = json.loads(sys.argv[2])
    if meta:
        for key in os.listxattr(p):
            if key.startswith('user.e2b.'):
                os.removexattr(p, key)
        for k, v in meta.items():
            os.setxattr(p, 'user.e2b.' + k, v.encode())
    sys.stdout.write(json.dumps({'name': os.path.basename(p), 'type': 'file', 'path': p}))
except OSError as e:
    code = 507 if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else 400
    sys.stdout.write(json.dumps({'code': code, 'message': str(e)}))
)PY";

std::string header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string() : std::string(it->value());
}

http::Response rest_error(const http::Request& req, int status, const std::string& message) {
  return unary_response(req, status, json{{"code", status}, {"message", message}}.dump());
}

// The error a program in the jail reported ({"code": <status>, "message"}), read as hostile:
// a status outside 400–599 or a field of another type is `otherwise`'s.
http::Response reported_error(const http::Request& req, const json& e, int otherwise) {
  int status = otherwise;
  if (e.contains("code") && e["code"].is_number_integer()) {
    const auto code = e["code"].get<long long>();
    status = code >= 400 && code <= 599 ? static_cast<int>(code) : otherwise;
  }
  const bool text = e.contains("message") && e["message"].is_string();
  return rest_error(req, status, text ? e["message"].get<std::string>() : "the operation failed");
}

struct Upload {
  std::string path;
  std::string_view data;
};

// One file per part named "file" whose filename is its path; linear, bounded by the body.
Result<std::vector<Upload>> parse_multipart(std::string_view content_type, std::string_view body,
                                            const std::string& query_path) {
  const auto b = content_type.find("boundary=");
  if (b == std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", "multipart without a boundary");
  }
  std::string_view boundary = content_type.substr(b + 9);
  boundary = boundary.substr(0, boundary.find(';'));
  if (boundary.size() >= 2 && boundary.front() == '"' && boundary.back() == '"') {
    boundary = boundary.substr(1, boundary.size() - 2);
  }
  if (boundary.empty() || boundary.size() > 200) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", "a bad multipart boundary");
  }
  const std::string delimiter = "--" + std::string(boundary);
  std::vector<Upload> out;
  std::size_t pos = body.find(delimiter);
  while (pos != std::string_view::npos) {
    pos += delimiter.size();
    if (body.substr(pos, 2) == "--") {
      break;  // the close delimiter
    }
    const std::size_t head_end = body.find("\r\n\r\n", pos);
    if (head_end == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_request", "a multipart part has no end");
    }
    const std::string_view head = body.substr(pos, head_end - pos);
    const std::size_t data_start = head_end + 4;
    const std::size_t next = body.find("\r\n" + delimiter, data_start);
    if (next == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_request", "a multipart part is cut");
    }
    std::string filename;
    if (const auto f = head.find("filename=\""); f != std::string_view::npos) {
      const auto close = head.find('"', f + 10);
      if (close != std::string_view::npos) {
        filename = std::string(head.substr(f + 10, close - f - 10));
      }
    }
    if (head.find("name=\"file\"") != std::string_view::npos) {
      if (out.size() >= kMaxParts) {
        return make_error(ErrorCode::kInvalidArgument, "bad_request", "more than 64 files");
      }
      std::string path = query_path.empty() ? filename : query_path;
      if (path.empty()) {
        return make_error(ErrorCode::kInvalidArgument, "bad_request", "a file part has no path");
      }
      out.push_back({std::move(path), body.substr(data_start, next - data_start)});
    }
    pos = next + 2;
  }
  if (out.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", "no file in the upload");
  }
  return out;
}

// Runs `program` in the jail with `input` on stdin, its stdout collected (64 KiB at most).
Result<std::string> run_writer(const kernel::JailTarget& target, const std::string& home,
                               const std::string& user, const Upload& upload,
                               const std::string& metadata) {
  kernel::CommandRequest request;
  request.argv = {"/usr/bin/python3", "-I", "-c", kWriter, upload.path, metadata};
  request.cwd = home;
  request.env = {"HOME=" + home, "USER=" + user};
  CELLGATE_ASSIGN_OR_RETURN(auto cmd, kernel::JailCommand::start(target, request));
  ::fcntl(cmd->stdin_fd(), F_SETFL, ::fcntl(cmd->stdin_fd(), F_GETFL) | O_NONBLOCK);
  std::string out;
  std::size_t sent = 0;
  const auto deadline = Clock::now() + kFileTimeout;
  while (!cmd->exited() || cmd->stdout_fd() >= 0) {
    if (sent == upload.data.size() && cmd->stdin_fd() >= 0) {
      cmd->close_stdin();
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "timeout", "the upload took over 120 s");
    }
    pollfd fds[3] = {{cmd->stdin_fd(), POLLOUT, 0},
                     {cmd->stdout_fd(), POLLIN, 0},
                     {cmd->exited() ? -1 : cmd->control_fd(), POLLIN, 0}};
    if (::poll(fds, 3, static_cast<int>(left.count())) <= 0) {
      continue;
    }
    if (fds[0].fd >= 0 && fds[0].revents != 0) {
      const std::size_t chunk = std::min<std::size_t>(upload.data.size() - sent, 1 << 16);
      const ssize_t n = write_no_sigpipe(fds[0].fd, upload.data.data() + sent, chunk);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        cmd->close_stdin();
        sent = upload.data.size();
      }
    }
    if (fds[1].fd >= 0 && fds[1].revents != 0) {
      char buf[4096];
      const ssize_t n = ::read(fds[1].fd, buf, sizeof buf);
      if (n <= 0) {
        cmd->close_output(fds[1].fd);
      } else if (out.size() < (64 << 10)) {
        out.append(buf, static_cast<std::size_t>(n));
      }
    }
    if (fds[2].fd >= 0 && fds[2].revents != 0) {
      cmd->read_control();
    }
  }
  return out;
}

}  // namespace

void EnvdApi::files(http::Request req, std::shared_ptr<http::Exchange> ex,
                    const SandboxTarget& sandbox, const std::string& path) {
  if (req.method() == http::Verb::get) {
    return options_.offload([this, req = std::move(req), ex, kernel_id = sandbox.kernel_id,
                             path]() mutable { read_file(req, ex, kernel_id, path); });
  }
  if (req.method() != http::Verb::post) {
    return ex->reply(rest_error(req, 405, "GET or POST"));
  }
  const std::string encoding = header(req, "Content-Encoding");
  const bool gzipped = strcasecmp(encoding.c_str(), "gzip") == 0;
  if (!encoding.empty() && !gzipped && strcasecmp(encoding.c_str(), "identity") != 0) {
    return ex->reply(rest_error(
        req, 400, "Content-Encoding '" + encoding.substr(0, 64) + "' is not supported (gzip is)"));
  }
  json metadata = json::object();
  for (const auto& field : req) {
    const std::string name(field.name_string());
    if (name.size() > 11 && strncasecmp(name.c_str(), "X-Metadata-", 11) == 0) {
      metadata[name.substr(11)] = std::string(field.value());
    }
  }
  options_.offload([this, req = std::move(req), ex, kernel_id = sandbox.kernel_id, path, gzipped,
                    metadata = metadata.dump()]() mutable {
    // A gzip body inflates here, to at most the listener's body limit: a bomb stops there.
    std::string inflated;
    if (gzipped) {
      auto plain = gunzip(req.body(), options_.max_upload_bytes);
      if (!plain) {
        return ex->reply(rest_error(req,
                                    plain.error().code == ErrorCode::kResourceExhausted ? 413 : 400,
                                    plain.error().message));
      }
      inflated = std::move(plain).value();
    }
    const std::string_view body = gzipped ? std::string_view(inflated) : req.body();
    const std::string type = header(req, "Content-Type");
    std::vector<Upload> uploads;
    if (type.rfind("multipart/form-data", 0) == 0) {
      auto parsed = parse_multipart(type, body, path);
      if (!parsed) {
        return ex->reply(rest_error(req, 400, parsed.error().message));
      }
      uploads = std::move(parsed).value();
    } else {
      if (path.empty()) {
        return ex->reply(rest_error(req, 400, "an octet-stream upload needs ?path="));
      }
      uploads.push_back({path, body});
    }
    auto target = options_.jail_of(kernel_id);
    if (!target) {
      return ex->reply(rest_error(req, 502, target.error().message));
    }
    json written = json::array();
    for (const auto& upload : uploads) {
      auto out = run_writer(*target, options_.home, options_.user, upload, metadata);
      if (!out) {
        return ex->reply(rest_error(req, 500, out.error().message));
      }
      const json answer = http::parse_json(*out);
      if (!answer.is_object()) {
        return ex->reply(rest_error(req, 500, "the upload gave no answer"));
      }
      if (answer.contains("code")) {
        return ex->reply(reported_error(req, answer, 500));
      }
      written.push_back(answer);
    }
    ex->reply(unary_response(req, 200, written.dump()));
  });
}

void EnvdApi::read_file(const http::Request& req, const std::shared_ptr<http::Exchange>& ex,
                        const std::string& kernel_id, const std::string& path) {
  if (path.empty()) {
    return ex->reply(rest_error(req, 400, "?path= is required"));
  }
  auto target = options_.jail_of(kernel_id);
  if (!target) {
    return ex->reply(rest_error(req, 502, target.error().message));
  }
  kernel::CommandRequest request;
  request.argv = {"/usr/bin/python3", "-I", "-c", kReader, path};
  request.cwd = options_.home;
  request.env = {"HOME=" + options_.home, "USER=" + options_.user};
  auto cmd = kernel::JailCommand::start(*target, request);
  if (!cmd) {
    return ex->reply(rest_error(req, 500, cmd.error().message));
  }
  (*cmd)->close_stdin();
  // The status waits for the first bytes or the end: a missing file says so on stderr.
  bool begun = false;
  // Accept-Encoding: gzip: compressed as it is read, one chunk at a time (the SDK's gzip: true).
  std::optional<GzipWriter> gzip;
  if (accepts_gzip(header(req, "Accept-Encoding"))) {
    gzip.emplace();
  }
  std::string err;
  const auto deadline = Clock::now() + kFileTimeout;
  auto begin = [&] {
    if (!begun) {
      http::Response head{http::Status::ok, req.version()};
      head.set(http::Field::server, "cellgate");
      head.set(http::Field::content_type, "application/octet-stream");
      if (gzip) {
        head.set(http::Field::content_encoding, "gzip");
      }
      head.keep_alive(req.keep_alive());
      ex->begin(std::move(head));
      begun = true;
    }
  };
  std::string buf(1 << 16, '\0');
  while (!(*cmd)->exited() || (*cmd)->stdout_fd() >= 0 || (*cmd)->stderr_fd() >= 0) {
    if (Clock::now() >= deadline) {
      break;
    }
    if (begun && ex->unsent() > kHighWater) {
      if (!ex->write(std::string())) {
        return;  // the client left: the command is killed with its handle
      }
      ::usleep(10000);  // until the client catches up
      continue;
    }
    pollfd fds[3] = {{(*cmd)->stdout_fd(), POLLIN, 0},
                     {(*cmd)->stderr_fd(), POLLIN, 0},
                     {(*cmd)->exited() ? -1 : (*cmd)->control_fd(), POLLIN, 0}};
    if (::poll(fds, 3, 1000) <= 0) {
      continue;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) {
        continue;
      }
      const ssize_t n = ::read(fds[i].fd, buf.data(), buf.size());
      if (n <= 0) {
        (*cmd)->close_output(fds[i].fd);
      } else if (i == 1) {
        err.append(buf.data(), std::min<std::size_t>(static_cast<std::size_t>(n), 4096));
      } else {
        begin();
        const std::string_view chunk(buf.data(), static_cast<std::size_t>(n));
        if (!ex->write(gzip ? gzip->add(chunk) : std::string(chunk))) {
          return;
        }
      }
    }
    if (fds[2].fd >= 0 && fds[2].revents != 0) {
      (*cmd)->read_control();
    }
  }
  if (!begun) {
    const auto& ended = (*cmd)->exited();
    if (ended && ended->exit_code == 2) {
      const json e = http::parse_json(err);
      if (e.is_object()) {
        return ex->reply(reported_error(req, e, 400));
      }
    }
    if (!ended || ended->exit_code != 0) {
      return ex->reply(rest_error(req, 500, "the file could not be read"));
    }
    begin();
  }
  if (!(*cmd)->exited() || (*cmd)->exited()->exit_code != 0) {
    return ex->abort();  // cut short: the client must not take it for the whole file
  }
  if (gzip) {
    ex->write(gzip->finish());
  }
  ex->end();
}

}  // namespace cellgate::envd
