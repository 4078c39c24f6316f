// `cellgate exec --url`: one cell on a running gateway, streamed as NDJSON and printed as it
// arrives (POST /api/execute, or /api/kernels/{id}/execute with --kernel-id).
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cstdio>
#include <iostream>

#include "cellgate/cli/exec.hpp"
#include "cellgate/result.hpp"
#include "cellgate/http/client.hpp"

namespace cellgate::cli::detail {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using nlohmann::json;

constexpr double kNoTimeoutSeconds = 86400;  // "no limit": the gateway clamps it to its maximum

// Prints each streamed event; remembers how the cell ended.
class EventPrinter {
 public:
  explicit EventPrinter(std::string artifacts_dir) : saver_(std::move(artifacts_dir)) {}

  void feed(std::string_view bytes) {
    pending_.append(bytes);
    for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (!line.empty()) {
        handle(json::parse(line, nullptr, false));
      }
    }
  }

  int exit_code() const {
    if (!ended_) {
      std::cerr << "cellgate exec: the gateway closed the stream before the cell ended\n";
      return kExitKernelDied;
    }
    if (!failure_.empty()) {
      std::cerr << "cellgate exec: " << failure_ << "\n";
      return kExitUsage;
    }
    if (status_ == "ok") {
      return kExitOk;
    }
    if (status_ == "timeout") {
      return kExitTimeout;
    }
    if (status_ == "error") {
      return kExitCellError;
    }
    return kExitKernelDied;  // dead, aborted
  }

 private:
  void handle(const json& ev) {
    if (!ev.is_object()) {
      return;
    }
    const std::string type = ev.value("type", "");
    if (type == "stream") {
      std::FILE* out = ev.value("name", "stdout") == "stderr" ? stderr : stdout;
      const std::string text = ev.value("text", "");
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    } else if (type == "execute_result" || type == "display_data") {
      print_bundle(ev.value("data", json::object()), saver_);
    } else if (type == "error") {
      std::string tb;
      for (const auto& line : ev.value("traceback", json::array())) {
        tb += line.is_string() ? line.get<std::string>() + "\n" : "";
      }
      std::cout << std::flush;
      std::cerr << (tb.empty() ? ev.value("ename", "Error") + ": " + ev.value("evalue", "") + "\n"
                               : tb)
                << std::flush;
    } else if (type == "notice") {
      std::cerr << "cellgate: " << ev.value("message", "") << "\n";
    } else if (type == "end") {
      ended_ = true;
      if (ev.contains("answer") && ev["answer"].is_object()) {
        const json& a = ev["answer"];
        status_ = a.value("status", "error");
        if (a.contains("message") && a["message"].is_string()) {
          std::cerr << "cellgate exec: " << a["message"].get<std::string>() << "\n";
        }
      } else if (ev.contains("error") && ev["error"].is_object()) {
        failure_ = ev["error"].value("message", "the gateway could not run the cell");
      }
    }
  }

  ArtifactSaver saver_;
  std::string pending_;
  bool ended_ = false;
  std::string status_ = "error";
  std::string failure_;
};

template <class Stream>
int exchange(Stream& stream, const http::request<http::string_body>& req, EventPrinter& printer) {
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  http::read_header(stream, buffer, parser);
  const auto status = parser.get().result_int();
  std::string error_body;
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    beast::error_code ec;
    http::read_some(stream, buffer, parser, ec);
    if (ec && ec != http::error::need_buffer) {
      if (ec == http::error::end_of_stream || ec == net::error::eof) {
        break;
      }
      throw beast::system_error(ec);
    }
    const std::size_t n = sizeof(chunk) - parser.get().body().size;
    if (status == 200) {
      printer.feed(std::string_view(chunk, n));
    } else {
      error_body.append(chunk, n);
    }
  }
  if (status != 200) {
    json err = json::parse(error_body, nullptr, false);
    std::cerr << "cellgate exec: the gateway answered " << status << ": "
              << (err.is_object() ? err.value("message", error_body) : error_body) << "\n";
    return status == 404 ? kExitUsage : (status == 401 || status == 403 ? kExitUsage : kExitKernelDied);
  }
  return printer.exit_code();
}

}  // namespace

int run_remote_exec(const ExecOptions& options, const std::string& code) {
  auto url = cellgate::http::client::parse_url(options.url);
  if (!url) {
    std::cerr << "cellgate exec: " << url.error().message << "\n";
    return kExitUsage;
  }
  json body = {{"code", code},
               {"timeout", options.timeout_seconds > 0 ? options.timeout_seconds
                                                       : kNoTimeoutSeconds}};
  std::string target;
  if (options.kernel_id.empty()) {
    target = url->base + "/api/execute";
    body["kernel"] = options.kernel;
  } else {
    target = url->base + "/api/kernels/" + options.kernel_id + "/execute";
  }
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, url->host + ":" + url->port);
  req.set(http::field::user_agent, "cellgate-exec");
  req.set(http::field::accept, "application/x-ndjson");
  req.set(http::field::content_type, "application/json");
  if (!options.token.empty()) {
    req.set(http::field::authorization, "token " + options.token);
  }
  req.keep_alive(false);
  req.body() = body.dump();
  req.prepare_payload();

  EventPrinter printer(options.artifacts_dir);
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    auto endpoints = resolver.resolve(url->host, url->port);
    if (url->tls) {
      ssl::context ctx(ssl::context::tls_client);
      ctx.set_default_verify_paths();
      ctx.set_verify_mode(ssl::verify_peer);
      beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
      // SNI; OpenSSL's macro casts the old way.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
      const bool sni = SSL_set_tlsext_host_name(stream.native_handle(), url->host.c_str()) == 1;
#pragma GCC diagnostic pop
      if (!sni) {
        throw beast::system_error(static_cast<int>(::ERR_get_error()),
                                  net::error::get_ssl_category());
      }
      stream.set_verify_callback(ssl::host_name_verification(url->host));
      beast::get_lowest_layer(stream).connect(endpoints);
      stream.handshake(ssl::stream_base::client);
      return exchange(stream, req, printer);
    }
    beast::tcp_stream stream(ioc);
    stream.connect(endpoints);
    return exchange(stream, req, printer);
  } catch (const std::exception& e) {
    std::cerr << "cellgate exec: cannot talk to " << options.url << ": " << e.what() << "\n";
    return kExitUsage;
  }
}

}  // namespace cellgate::cli::detail
