// Connection files (https://jupyter-client.readthedocs.io/en/stable/kernels.html#connection-files)
// and kernelspecs (https://jupyter-client.readthedocs.io/en/stable/kernels.html#kernel-specs).
//
//   auto info = ConnectionInfo::load("/run/kernel-1.json");
//   std::string shell = info->endpoint(Channel::kShell);   // "tcp://127.0.0.1:53211" or
//                                                          // "ipc:///dir/kernel-1"
//   auto conn = ConnectionInfo::make_ipc(dir + "/kernel");   // fresh key, ipc endpoints
//   conn.save(dir + "/connection.json");
//
// Thread-safety: values; no shared state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernel {

using protocol::Channel;
using protocol::to_string;

struct ConnectionInfo {
  std::string transport = "tcp";  // "tcp" or "ipc"
  std::string ip = "127.0.0.1";   // for ipc: the path prefix of the socket files
  int shell_port = 0;
  int iopub_port = 0;
  int stdin_port = 0;
  int control_port = 0;
  int hb_port = 0;
  std::string key;
  std::string signature_scheme = "hmac-sha256";
  std::string kernel_name;

  std::string endpoint(Channel channel) const;

  static Result<ConnectionInfo> from_json(const nlohmann::json& j);
  static Result<ConnectionInfo> load(const std::string& path);
  nlohmann::json to_json() const;
  // Written with owner-only permissions (it holds the key), atomically (temp file + rename).
  Result<void> save(const std::string& path) const;

  // A fresh ipc connection with a random 256-bit key; sockets are "<prefix>-<n>".
  static ConnectionInfo make_ipc(const std::string& prefix);
  // A fresh tcp connection on `ip` with five currently free ports (the kernel binds them; a
  // port taken in between makes the kernel fail to start, never connect elsewhere).
  static Result<ConnectionInfo> make_tcp(const std::string& ip = "127.0.0.1");
};

// A random hex string of `bytes` random bytes (OpenSSL RAND_bytes).
std::string random_hex(std::size_t bytes);

struct KernelSpec {
  std::string name;
  std::string resource_dir;
  std::vector<std::string> argv;  // may contain "{connection_file}"
  std::string display_name;
  std::string language;
  std::string interrupt_mode = "signal";
  nlohmann::json env = nlohmann::json::object();
  nlohmann::json metadata = nlohmann::json::object();

  static Result<KernelSpec> load(const std::string& resource_dir, const std::string& name);
  // argv with {connection_file} (and {resource_dir}) substituted.
  std::vector<std::string> expand_argv(const std::string& connection_file) const;
};

// The standard kernelspec directories, in jupyter's order of precedence: $JUPYTER_PATH entries,
// then the user's data dir ($JUPYTER_DATA_DIR, else $XDG_DATA_HOME/jupyter, else
// ~/.local/share/jupyter), /usr/local/share/jupyter, /usr/share/jupyter (each + "/kernels").
std::vector<std::string> kernelspec_dirs();
Result<KernelSpec> find_kernelspec(const std::string& name);

}  // namespace cellgate::kernel
