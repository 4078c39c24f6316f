#include "cellgate/kernel/connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/unique_fd.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::kernel {
namespace {

using nlohmann::json;

Error bad_file(const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "bad_connection_file", what);
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return errno_error(ErrorCode::kNotFound, "not_found", "open('" + path + "')", errno);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
}

}  // namespace

std::string ConnectionInfo::endpoint(Channel channel) const {
  int port = 0;
  switch (channel) {
    case Channel::kShell:
      port = shell_port;
      break;
    case Channel::kControl:
      port = control_port;
      break;
    case Channel::kStdin:
      port = stdin_port;
      break;
    case Channel::kIopub:
      port = iopub_port;
      break;
    case Channel::kHeartbeat:
      port = hb_port;
      break;
  }
  // jupyter_client: tcp -> "tcp://ip:port"; ipc -> "ipc://ip-port" (ip is a path prefix).
  if (transport == "ipc") {
    return "ipc://" + ip + "-" + std::to_string(port);
  }
  return transport + "://" + ip + ":" + std::to_string(port);
}

Result<ConnectionInfo> ConnectionInfo::from_json(const json& j) {
  if (!j.is_object()) {
    return bad_file("connection info is not a JSON object");
  }
  ConnectionInfo info;
  // `field`, not `key`: that would shadow ConnectionInfo::key (clang's -Wshadow says so).
  auto get_str = [&](const char* field, std::string& out, bool required) -> Result<void> {
    auto it = j.find(field);
    if (it == j.end()) {
      return required ? Result<void>(bad_file(std::string("missing '") + field + "'"))
                      : Result<void>();
    }
    if (!it->is_string()) {
      return bad_file(std::string("'") + field + "' is not a string");
    }
    out = it->get<std::string>();
    return {};
  };
  auto get_port = [&](const char* field, int& out) -> Result<void> {
    auto it = j.find(field);
    if (it == j.end() || !it->is_number_integer()) {
      return bad_file(std::string("missing or non-integer '") + field + "'");
    }
    auto v = it->get<long long>();
    if (v < 0 || v > 65535) {
      return bad_file(std::string("'") + field + "' is out of range");
    }
    out = static_cast<int>(v);
    return {};
  };
  CELLGATE_TRY(get_str("transport", info.transport, false));
  CELLGATE_TRY(get_str("ip", info.ip, true));
  CELLGATE_TRY(get_str("key", info.key, false));
  CELLGATE_TRY(get_str("signature_scheme", info.signature_scheme, false));
  CELLGATE_TRY(get_str("kernel_name", info.kernel_name, false));
  CELLGATE_TRY(get_port("shell_port", info.shell_port));
  CELLGATE_TRY(get_port("iopub_port", info.iopub_port));
  CELLGATE_TRY(get_port("stdin_port", info.stdin_port));
  CELLGATE_TRY(get_port("control_port", info.control_port));
  CELLGATE_TRY(get_port("hb_port", info.hb_port));
  if (info.transport != "tcp" && info.transport != "ipc") {
    return bad_file("transport '" + info.transport + "' is neither tcp nor ipc");
  }
  return info;
}

Result<ConnectionInfo> ConnectionInfo::load(const std::string& path) {
  CELLGATE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    return bad_file(path + " is not valid JSON");
  }
  return from_json(j);
}

json ConnectionInfo::to_json() const {
  return json{{"transport", transport},
              {"ip", ip},
              {"shell_port", shell_port},
              {"iopub_port", iopub_port},
              {"stdin_port", stdin_port},
              {"control_port", control_port},
              {"hb_port", hb_port},
              {"key", key},
              {"signature_scheme", signature_scheme},
              {"kernel_name", kernel_name}};
}

Result<void> ConnectionInfo::save(const std::string& path) const {
  return atomic_write(path, to_json().dump(1), 0600);
}

ConnectionInfo ConnectionInfo::make_ipc(const std::string& prefix) {
  ConnectionInfo info;
  info.transport = "ipc";
  info.ip = prefix;
  info.shell_port = 1;
  info.iopub_port = 2;
  info.stdin_port = 3;
  info.control_port = 4;
  info.hb_port = 5;
  info.key = random_hex(32);
  return info;
}

Result<ConnectionInfo> ConnectionInfo::make_tcp(const std::string& ip) {
  ConnectionInfo info;
  info.transport = "tcp";
  info.ip = ip;
  info.key = random_hex(32);
  int* ports[] = {&info.shell_port, &info.iopub_port, &info.stdin_port, &info.control_port,
                  &info.hb_port};
  std::vector<UniqueFd> held;  // keep all five bound until all are chosen, so they differ
  for (int* port : ports) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    if (!fd || ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1 ||
        ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return errno_error(ErrorCode::kInternal, "no_port", "bind('" + ip + ":0')", errno);
    }
    socklen_t len = sizeof addr;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    *port = ntohs(addr.sin_port);
    held.push_back(std::move(fd));
  }
  return info;
}

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    // OpenSSL's CSPRNG only fails when it cannot seed; there is no safe fallback for a key.
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

// ---- kernelspecs -----------------------------------------------------------------------------

Result<KernelSpec> KernelSpec::load(const std::string& resource_dir, const std::string& name) {
  const std::string path = resource_dir + "/kernel.json";
  CELLGATE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  json j = json::parse(text, nullptr, false);
  auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_kernelspec", path + ": " + what);
  };
  if (j.is_discarded() || !j.is_object()) {
    return bad("not a JSON object");
  }
  KernelSpec spec;
  spec.name = name;
  spec.resource_dir = resource_dir;
  auto argv = j.find("argv");
  if (argv == j.end() || !argv->is_array() || argv->empty()) {
    return bad("'argv' must be a non-empty array of strings");
  }
  for (const auto& a : *argv) {
    if (!a.is_string()) {
      return bad("'argv' must be a non-empty array of strings");
    }
    spec.argv.push_back(a.get<std::string>());
  }
  // Untrusted files: a field of the wrong type is an error, never an exception.
  auto string_field = [&](const char* key, std::string fallback) -> Result<std::string> {
    auto it = j.find(key);
    if (it == j.end()) {
      return fallback;
    }
    if (!it->is_string()) {
      return bad(std::string("'") + key + "' must be a string");
    }
    return it->get<std::string>();
  };
  CELLGATE_ASSIGN_OR_RETURN(spec.display_name, string_field("display_name", name));
  CELLGATE_ASSIGN_OR_RETURN(spec.language, string_field("language", ""));
  CELLGATE_ASSIGN_OR_RETURN(spec.interrupt_mode, string_field("interrupt_mode", "signal"));
  if (auto env = j.find("env"); env != j.end() && env->is_object()) {
    spec.env = *env;
  }
  if (auto md = j.find("metadata"); md != j.end() && md->is_object()) {
    spec.metadata = *md;
  }
  return spec;
}

std::vector<std::string> KernelSpec::expand_argv(const std::string& connection_file) const {
  std::vector<std::string> out = argv;
  for (auto& a : out) {
    replace_all(a, "{connection_file}", connection_file);
    replace_all(a, "{resource_dir}", resource_dir);
  }
  return out;
}

std::vector<std::string> kernelspec_dirs() {
  std::vector<std::string> dirs;
  if (const char* jp = std::getenv("JUPYTER_PATH"); jp != nullptr && *jp != '\0') {
    std::stringstream ss(jp);
    for (std::string item; std::getline(ss, item, ':');) {
      if (!item.empty()) {
        dirs.push_back(item + "/kernels");
      }
    }
  }
  // The user's data dir, as jupyter_core finds it: $JUPYTER_DATA_DIR, else
  // $XDG_DATA_HOME/jupyter, else ~/.local/share/jupyter.
  const char* data_dir = std::getenv("JUPYTER_DATA_DIR");
  const char* xdg = std::getenv("XDG_DATA_HOME");
  const char* home = std::getenv("HOME");
  if (data_dir != nullptr && *data_dir != '\0') {
    dirs.push_back(std::string(data_dir) + "/kernels");
  } else if (xdg != nullptr && *xdg != '\0') {
    dirs.push_back(std::string(xdg) + "/jupyter/kernels");
  } else if (home != nullptr && *home != '\0') {
    dirs.push_back(std::string(home) + "/.local/share/jupyter/kernels");
  }
  dirs.emplace_back("/usr/local/share/jupyter/kernels");
  dirs.emplace_back("/usr/share/jupyter/kernels");
  return dirs;
}

Result<KernelSpec> find_kernelspec(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name.starts_with('.')) {
    return make_error(ErrorCode::kInvalidArgument, "bad_kernel_name",
                      "invalid kernel name '" + name + "'");
  }
  for (const auto& dir : kernelspec_dirs()) {
    std::error_code ec;
    const std::string candidate = dir + "/" + name;
    if (std::filesystem::is_regular_file(candidate + "/kernel.json", ec)) {
      return KernelSpec::load(candidate, name);
    }
  }
  return make_error(ErrorCode::kNotFound, "no_such_kernel",
                    "no kernelspec named '" + name + "' in the standard kernelspec directories");
}

}  // namespace cellgate::kernel
