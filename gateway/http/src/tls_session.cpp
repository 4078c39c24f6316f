// HttpSession and WsSession over TLS (see session_start.hpp for why this is a file).
#include "session_start.hpp"
#include "sessions.hpp"

namespace cellgate::http::detail {

void start_tls_session(Handler& handler, const HttpOptions& options, tcp::socket socket,
                       ssl::context& context, std::shared_ptr<void> slot) {
  auto session = std::make_shared<HttpSession<beast::ssl_stream<beast::tcp_stream>>>(
      handler, options, std::move(socket), context);
  session->hold(std::move(slot));
  session->run();
}

}  // namespace cellgate::http::detail
