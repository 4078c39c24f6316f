#include "session_parts.hpp"

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/write.hpp>  // operator<< of a header
#include <chrono>
#include <sstream>

#include "cellgate/http/limits.hpp"

namespace cellgate::http::detail {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;

HeadScan scan_head(std::string_view data, std::size_t max_header_bytes) {
  const auto end = data.find("\r\n\r\n");
  if (end == std::string_view::npos && data.size() <= max_header_bytes) {
    // Not a whole head yet. Bytes that cannot begin one (https:// to this port, a bare LF,
    // binary) are answered now: waiting for the CRLFCRLF such a client never sends kept it
    // in silence until the header deadline.
    if (auto start = check_head_start(data, max_header_bytes); !start) {
      return {HeadScan::Kind::kBad, start.error().message};
    }
    return {HeadScan::Kind::kPartial, {}};
  }
  const std::string_view head = data.substr(0, end);
  // A line of the head that starts with SP or HTAB (not the first: leading whitespace there
  // is a malformed request line, which Beast refuses).
  if (head.find("\n ") != std::string_view::npos || head.find("\n\t") != std::string_view::npos) {
    return {HeadScan::Kind::kBad,
            "obsolete line folding (a header line starting with a space or tab)"};
  }
  return {HeadScan::Kind::kComplete, {}};
}

ReadFailure classify_read(beast::error_code ec) {
  if (ec == bhttp::error::end_of_stream) {
    return ReadFailure::kEnd;
  }
  if (ec == bhttp::error::body_limit) {
    return ReadFailure::kBodyLimit;
  }
  if (ec == bhttp::error::header_limit) {
    return ReadFailure::kHeaderLimit;
  }
  if (ec && ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category() &&
      ec != bhttp::error::partial_message) {
    return ReadFailure::kMalformed;
  }
  return ec ? ReadFailure::kDrop : ReadFailure::kNone;
}

Response refusal(Status status, const std::string& reason, const std::string& message) {
  Request stub;
  stub.version(11);
  auto res = json_response(stub, status, {{"reason", reason}, {"message", message}});
  res.keep_alive(false);
  return res;
}

bool proves_client(Status status) {
  return status != Status::unauthorized && status != Status::forbidden &&
         status != Status::bad_request && status != Status::payload_too_large;
}

std::string chunked_head(Response head) {
  head.body().clear();
  head.chunked(true);
  std::ostringstream os;
  os << head.base();
  return os.str();
}

std::string chunk(std::string_view data) {
  std::ostringstream os;
  os << std::hex << data.size() << "\r\n";
  return os.str().append(data).append("\r\n");
}

void count_rejected(const HttpOptions& options, Status status) {
  if (options.stats) {
    options.stats->rejected.add(status == Status::payload_too_large ? "body_too_large"
                                                                    : "malformed_request");
  }
}

websocket::stream_base::timeout ws_timeouts(const HttpOptions& options) {
  websocket::stream_base::timeout timeout{};
  timeout.handshake_timeout = std::chrono::seconds(30);
  timeout.idle_timeout =
      options.ws_ping_interval > 0
          ? std::chrono::milliseconds(static_cast<long long>(options.ws_ping_interval * 3000))
          : websocket::stream_base::none();
  timeout.keep_alive_pings = options.ws_ping_interval > 0;
  return timeout;
}

void decorate_ws_handshake(websocket::response_type& res, const std::string& subprotocol) {
  res.set(bhttp::field::server, "cellgate");
  if (!subprotocol.empty()) {
    res.set(bhttp::field::sec_websocket_protocol, subprotocol);
  }
}

void count_dropped(const HttpOptions& options, const char* why) {
  if (options.stats) {
    options.stats->ws_dropped.add(why);
  }
}

}  // namespace cellgate::http::detail
