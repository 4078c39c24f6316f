// HttpSession and WsSession over plain TCP (see session_start.hpp for why this is a file).
#include "session_start.hpp"
#include "sessions.hpp"

namespace cellgate::http::detail {

void start_plain_session(Handler& handler, const HttpOptions& options, tcp::socket socket,
                         std::shared_ptr<void> slot) {
  auto session =
      std::make_shared<HttpSession<beast::tcp_stream>>(handler, options, std::move(socket));
  session->hold(std::move(slot));
  session->run();
}

}  // namespace cellgate::http::detail
