// Internal: starts one accepted connection's session. The two kinds are instantiated in two
// files of their own (plain_session.cpp, tls_session.cpp) so that the compiler builds Beast's
// templates for TCP and for TLS in parallel, and listener.cpp does not build them at all: in one
// translation unit they took six minutes of a two-core build.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/listener.hpp"

namespace cellgate::http::detail {

// `slot` is held as long as the connection is open (the listener's count of open connections).
void start_plain_session(Handler& handler, const HttpOptions& options,
                         boost::asio::ip::tcp::socket socket, std::shared_ptr<void> slot);
void start_tls_session(Handler& handler, const HttpOptions& options,
                       boost::asio::ip::tcp::socket socket, boost::asio::ssl::context& context,
                       std::shared_ptr<void> slot);

}  // namespace cellgate::http::detail
