#include "node.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "cellgate/sys/file.hpp"

namespace cellgate::server {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

std::string boot_id() {
  auto text = sys::read_file("/proc/sys/kernel/random/boot_id", 128, "boot_id");
  if (!text) {
    return "";
  }
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) {
    id.pop_back();
  }
  return id;
}

std::uint16_t random_epoch(std::uint16_t unlike) {
  for (;;) {
    std::uint16_t e = 0;
    if (::getrandom(&e, sizeof e, 0) != static_cast<ssize_t>(sizeof e)) {
      e = static_cast<std::uint16_t>(unlike + 1);  // getrandom cannot fail for 2 bytes
    }
    if (e != unlike) {
      return e;
    }
  }
}

}  // namespace

Result<NodeIdentity> take_node_identity(const std::string& state_dir, std::uint16_t tag) {
  const std::string path = state_dir + "/node.json";
  const std::string boot = boot_id();
  NodeIdentity id;
  id.tag = tag;
  std::optional<std::uint16_t> last;
  if (auto text = sys::read_file(path, 4096, "node")) {
    const json j = json::parse(*text, nullptr, false);
    if (j.is_object() && j.value("epoch", -1) >= 0 && j.value("epoch", -1) <= 0xffff) {
      last = static_cast<std::uint16_t>(j.value("epoch", 0));
      if (j.value("tag", -1) == tag && !boot.empty() && j.value("boot_id", "") == boot) {
        id.epoch = *last;
        id.kept = true;
      }
    }
  }
  if (!id.kept) {
    id.epoch = random_epoch(last.value_or(0));
  }
  // Not kept (the gateway of `serve --user` may not write the state dir's top): the next run
  // takes a new epoch, which only changes what its unknown ids answer (410, not 404).
  if (auto saved = sys::atomic_write(
          path, json{{"tag", id.tag}, {"epoch", id.epoch}, {"boot_id", boot}}.dump() + "\n", 0644);
      !saved) {
    spdlog::warn("node: {} not saved ({}); the next run takes a new epoch", path,
                 saved.error().message);
  }
  return id;
}

std::string agent_line(bool draining, int room_percent) {
  if (draining || room_percent <= 0) {
    return "drain\n";
  }
  return fmt::format("ready {}%\n", std::min(room_percent, 100));
}

struct AgentCheck::Impl : std::enable_shared_from_this<Impl> {
  Impl(net::io_context& io, std::function<std::string()> l) : acceptor(io), line(std::move(l)) {}
  tcp::acceptor acceptor;
  std::function<std::string()> line;

  void accept() {
    acceptor.async_accept([self = shared_from_this()](boost::system::error_code ec,
                                                      tcp::socket socket) {
      if (ec == net::error::operation_aborted || !self->acceptor.is_open()) {
        return;
      }
      if (!ec) {
        auto s = std::make_shared<tcp::socket>(std::move(socket));
        auto text = std::make_shared<std::string>(self->line());
        net::async_write(*s, net::buffer(*text), [s, text](boost::system::error_code, std::size_t) {
          boost::system::error_code ignored;
          s->shutdown(tcp::socket::shutdown_both, ignored);
          s->close(ignored);
        });
      }
      self->accept();
    });
  }
};

AgentCheck::AgentCheck(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentCheck::~AgentCheck() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

int AgentCheck::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

Result<std::unique_ptr<AgentCheck>> AgentCheck::open(net::io_context& io, const std::string& ip,
                                                     int port, std::function<std::string()> line) {
  auto impl = std::make_shared<Impl>(io, std::move(line));
  boost::system::error_code ec;
  const auto address = net::ip::make_address(ip, ec);
  if (ec) {
    return make_error(ErrorCode::kInvalidArgument, "agent_port",
                      "--ip " + ip + " is not an address for the agent-check port");
  }
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) {
    impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    impl->acceptor.bind(ep, ec);
  }
  if (!ec) {
    impl->acceptor.listen(64, ec);
  }
  if (ec) {
    return make_error(ErrorCode::kFailedPrecondition, "agent_port",
                      fmt::format("--agent-port {}: {}", port, ec.message()));
  }
  impl->accept();
  return std::unique_ptr<AgentCheck>(new AgentCheck(std::move(impl)));
}

}  // namespace cellgate::server
