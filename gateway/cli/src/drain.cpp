#include "cellgate/cli/drain.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cellgate/cli/exit_codes.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/result.hpp"

namespace cellgate::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kRequestTimeout{30000};
constexpr milliseconds kPollEvery{500};
// One kernel's checkpoint, upload and restore on the other node.
constexpr milliseconds kMoveTimeout{600000};
constexpr std::size_t kMaxRuntimeAnswer = 1u << 20;

// One command to HAProxy's Runtime API ("/path/admin.sock" or "host:port"), its whole answer.
Result<std::string> runtime_api(const std::string& router, const std::string& command) {
  int fd = -1;
  if (router.find('/') != std::string::npos) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (router.size() >= sizeof addr.sun_path) {
      return make_error(ErrorCode::kInvalidArgument, "router", router + ": path too long");
    }
    std::memcpy(addr.sun_path, router.c_str(), router.size() + 1);
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      fd = -1;
    }
  } else {
    const auto colon = router.rfind(':');
    if (colon == std::string::npos) {
      return make_error(ErrorCode::kInvalidArgument, "router",
                        router + ": a router is a socket path or host:port");
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(router.substr(0, colon).c_str(), router.substr(colon + 1).c_str(), &hints,
                      &found) == 0) {
      for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
          ::close(fd);
          fd = -1;
        }
      }
      ::freeaddrinfo(found);
    }
  }
  if (fd < 0) {
    return make_error(ErrorCode::kUnavailable, "router",
                      router + ": cannot connect: " + std::strerror(errno));
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const std::string line = command + "\n";
  std::string answer;
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0 && answer.size() < kMaxRuntimeAnswer) {
      answer.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

// The file name HAProxy lists for the map whose path ends with `/name` ("show map").
std::string map_named(const std::string& show_map, const std::string& name) {
  std::size_t at = 0;
  while ((at = show_map.find('(', at)) != std::string::npos) {
    const auto close = show_map.find(')', at);
    if (close == std::string::npos) {
      break;
    }
    std::string path = show_map.substr(at + 1, close - at - 1);
    if (path == name ||
        (path.size() > name.size() &&
         path.compare(path.size() - name.size() - 1, name.size() + 1, "/" + name) == 0)) {
      return path;
    }
    at = close;
  }
  return {};
}

// Points `router` at the node tagged `tag` for each of `ids`: tags.map says the node's backend,
// override.map gets id → that backend (replacing an older entry).
Result<void> point_router(const std::string& router, const std::string& tag,
                          const std::vector<std::string>& ids) {
  CELLGATE_ASSIGN_OR_RETURN(std::string maps, runtime_api(router, "show map"));
  const std::string tags = map_named(maps, "tags.map");
  const std::string overrides = map_named(maps, "override.map");
  if (tags.empty() || overrides.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "router",
                      router + ": no tags.map and override.map (a config from cellgate-haproxy?)");
  }
  CELLGATE_ASSIGN_OR_RETURN(std::string got, runtime_api(router, "get map " + tags + " " + tag));
  // type=beg, case=…, found=yes, idx=tree, key="0002", value="be_n2", type="str"
  const auto v = got.find("value=\"");
  if (got.find("found=yes") == std::string::npos || v == std::string::npos) {
    return make_error(ErrorCode::kNotFound, "router",
                      router + ": its tags.map has no backend for node " + tag);
  }
  const std::string backend = got.substr(v + 7, got.find('"', v + 7) - (v + 7));
  for (const auto& id : ids) {
    (void)runtime_api(router, "del map " + overrides + " " + id);
    CELLGATE_ASSIGN_OR_RETURN(
        std::string added, runtime_api(router, "add map " + overrides + " " + id + " " + backend));
    if (!added.empty() && added != "\n") {
      return make_error(ErrorCode::kInternal, "router",
                        router + ": add map: " + added.substr(0, added.find('\n')));
    }
  }
  return {};
}

// Moves every kernel of the node (already draining) and tells the routers; the exit code.
int move_kernels(http::client::Client& client, const DrainOptions& options) {
  auto listed = client.request("GET", "/api/kernels?scope=local", "", kRequestTimeout);
  json kernels = listed && listed->status == 200 ? http::parse_json(listed->body) : json();
  if (!kernels.is_array()) {
    std::cerr << "cellgate drain: the node did not list its kernels\n";
    return kExitUsage;
  }
  int failed = 0;
  for (const auto& k : kernels) {
    const std::string id = k.is_object() ? k.value("id", "") : "";
    if (id.empty()) {
      continue;
    }
    json body = json::object();
    if (!options.to.empty()) {
      body["to"] = options.to;
    }
    auto answer = client.request("POST", "/api/kernels/" + id + "/move", body.dump(), kMoveTimeout);
    json moved = answer && answer->status == 200 ? http::parse_json(answer->body) : json();
    if (!moved.is_object() || !moved.contains("node")) {
      std::cerr << "cellgate drain: kernel " << id << " did not move: "
                << (!answer
                        ? answer.error().message
                        : "HTTP " + std::to_string(answer->status) + ": " + answer->error_message())
                << "\n";
      ++failed;
      continue;
    }
    const std::string tag = moved.value("node", "");
    std::vector<std::string> ids = {id};
    for (const auto& s : moved.value("sessions", json::array())) {
      if (s.is_string()) {
        ids.push_back(s.get<std::string>());
      }
    }
    std::cout << "moved kernel " << id << " to node " << tag << "\n";
    for (const auto& router : options.routers) {
      if (auto told = point_router(router, tag, ids); !told) {
        std::cerr << "cellgate drain: " << told.error().message << "\n";
        ++failed;
      }
    }
    if (options.routers.empty()) {
      std::cerr << "cellgate drain: no --router: its requests get 503 kernel_moved until a "
                   "router's override.map sends "
                << id << " to node " << tag << "\n";
    }
  }
  return failed == 0 ? kExitOk : kExitCellError;
}

}  // namespace

CLI::App* add_drain_command(CLI::App& app, DrainOptions& options) {
  auto* cmd = app.add_subcommand(
      "drain", "stop a running gateway (a cluster node) from starting kernels; its kernels run on");
  cmd->add_option("--url", options.url, "the gateway (http[s]://host:port), not the router")
      ->envname("CELLGATE_URL")
      ->required();
  cmd->add_option("--token", options.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  cmd->add_flag("--undo", options.undo, "start kernels there again");
  cmd->add_option("--wait", options.wait,
                  "wait up to this many seconds for the node's kernels to end (exit 124 if "
                  "some remain)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--move", options.move,
                "move each of its kernels to another node (checkpointed and restored there "
                "under the same id; the nodes need --move-key-file)");
  cmd->add_option("--to", options.to, "with --move: the node tag to move to (e.g. 0002)");
  cmd->add_option("--router", options.routers,
                  "with --move: a router's HAProxy Runtime API (a unix socket path or "
                  "host:port, level admin) whose override.map then sends the moved ids to "
                  "their node (repeat for each router)");
  return cmd;
}

int run_drain(const DrainOptions& options) {
  auto url = http::client::parse_url(options.url);
  if (!url) {
    std::cerr << "cellgate drain: " << url.error().message << "\n";
    return kExitUsage;
  }
  http::client::Client client(*url, options.token, "cellgate-drain");
  auto answer = client.request("POST", "/api/node/drain", json{{"drain", !options.undo}}.dump(),
                               kRequestTimeout);
  if (!answer) {
    std::cerr << "cellgate drain: " << options.url << ": " << answer.error().message << "\n";
    return kExitUsage;
  }
  if (answer->status != 200) {
    std::cerr << "cellgate drain: HTTP " << answer->status << ": " << answer->error_message()
              << "\n";
    return kExitUsage;
  }
  json state = http::parse_json(answer->body);
  if (!state.is_object()) {
    std::cerr << "cellgate drain: the gateway's answer is not JSON\n";
    return kExitUsage;
  }
  if (options.move && !options.undo) {
    const int moved = move_kernels(client, options);
    if (moved != kExitOk) {
      return moved;
    }
    if (auto node = client.request("GET", "/api/node", "", kRequestTimeout);
        node && node->status == 200) {
      if (json now = http::parse_json(node->body); now.is_object()) {
        state = std::move(now);
      }
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + milliseconds(static_cast<long long>(options.wait * 1000));
  while (!options.undo && options.wait > 0 && state.value("kernels", 0) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(kPollEvery);
    auto node = client.request("GET", "/api/node", "", kRequestTimeout);
    if (node && node->status == 200) {
      json now = http::parse_json(node->body);
      if (now.is_object()) {
        state = std::move(now);
      }
    }
  }
  const int kernels = state.value("kernels", 0);
  std::cout << (state.value("draining", false) ? "draining" : "not draining") << ", " << kernels
            << (kernels == 1 ? " kernel" : " kernels") << " running\n";
  return !options.undo && options.wait > 0 && kernels > 0 ? kExitTimeout : kExitOk;
}

}  // namespace cellgate::cli
