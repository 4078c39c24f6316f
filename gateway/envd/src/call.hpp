// Internal: one envd call as the RPCs see it, and the answers they share (envd_api.cpp,
// filesystem.cpp).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/envd/connect.hpp"
#include "cellgate/envd/envd_api.hpp"
#include "cellgate/http/message.hpp"

namespace cellgate::envd {

struct EnvdApi::Call {
  http::Request req;
  std::shared_ptr<http::Exchange> exchange;
  SandboxTarget sandbox;
  nlohmann::json body;  // the request message
};

inline http::Response unary_response(const http::Request& req, int status, std::string body) {
  http::Response res{static_cast<http::Status>(status), req.version()};
  res.set(http::Field::server, "cellgate");
  res.set(http::Field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

inline http::Response unary_error(const http::Request& req, const Error& error) {
  const ConnectError ce = connect_error(error);
  return unary_response(req, http_status(ce.code), error_json(ce));
}

inline http::Response stream_head(const http::Request& req) {
  http::Response head{http::Status::ok, req.version()};
  head.set(http::Field::server, "cellgate");
  head.set(http::Field::content_type, "application/connect+json");
  head.keep_alive(req.keep_alive());
  return head;
}

// A streaming call that fails before its first message: 200, then the end of the stream with
// the error (Connect's streaming calls carry errors there).
inline void stream_error(http::Exchange& ex, const http::Request& req, const Error& error) {
  ex.begin(stream_head(req));
  ex.write(end_of_stream(connect_error(error)));
  ex.end();
}

// The filesystem program (filesystem.cpp): argv[1] the operation, argv[2] its arguments as
// JSON; and an error it reported ({"code", "message"}) as ours.
const char* filesystem_program();
Error filesystem_error(const nlohmann::json& error);

// write(2) to a pipe whose reader is gone raises SIGPIPE, which would end the gateway (it does
// not ignore it; its sockets use MSG_NOSIGNAL). Held for this thread and consumed, as the
// launcher's StatusSink does: the write then fails with EPIPE.
inline ssize_t write_no_sigpipe(int fd, const char* data, std::size_t size) {
  sigset_t pipe_only, previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
  const ssize_t n = ::write(fd, data, size);
  const int saved = errno;
  const timespec none{0, 0};
  while (::sigtimedwait(&pipe_only, nullptr, &none) == SIGPIPE) {
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = saved;
  return n;
}

}  // namespace cellgate::envd
