// systemd's service protocol over libsystemd's sd-daemon (systemd.hpp).
#include "systemd.hpp"

#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <string>

namespace cellgate::server::systemd {
namespace {

bool is_listening_tcp(int fd) {
  return sd_is_socket_inet(fd, AF_UNSPEC, SOCK_STREAM, /*listening=*/1, /*port=*/0) > 0;
}

// Whether descriptor `fd` is the journal stream named in JOURNAL_STREAM ("dev:inode").
bool is_journal_stream(int fd) {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr || *stream == '\0') {
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return false;
  }
  const std::string expected = std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
                               std::to_string(static_cast<unsigned long long>(st.st_ino));
  return expected == stream;
}

}  // namespace

Result<ListenSockets> take_listen_sockets() {
  ListenSockets sockets;
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  if (n < 0) {
    return errno_error(ErrorCode::kInvalidArgument, "socket_activation", "sd_listen_fds", -n);
  }
  std::string problem;
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    const std::string name = names != nullptr && names[i] != nullptr ? names[i] : "";
    if (!is_listening_tcp(fd)) {
      problem = "passed socket " + std::to_string(i) + " ('" + name +
                "') is not a listening TCP socket (ListenStream= in the .socket unit)";
    } else if (name == "http" || (name == "unknown" && n == 1) || name.empty()) {
      sockets.http = fd;
    } else if (name == "e2b") {
      sockets.e2b = fd;
    } else {
      problem =
          "passed socket '" + name + "' is not one of cellgate's (FileDescriptorName=http or e2b)";
    }
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) {
      std::free(names[i]);
    }
    std::free(names);
  }
  if (!problem.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "socket_activation", problem);
  }
  return sockets;
}

void notify(const std::string& state) {
  sd_notify(/*unset_environment=*/0, state.c_str());
}

std::chrono::microseconds watchdog_interval() {
  std::uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0) {
    return std::chrono::microseconds(0);
  }
  return std::chrono::microseconds(usec / 2);
}

std::shared_ptr<spdlog::logger> journal_logger() {
  if (!is_journal_stream(STDERR_FILENO) && !is_journal_stream(STDOUT_FILENO)) {
    return nullptr;
  }
  // The journal gets the message and its priority; it adds the time and the unit itself.
  auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>("cellgate");
  auto logger = std::make_shared<spdlog::logger>("cellgate", sink);
  logger->set_pattern("%v");
  return logger;
}

}  // namespace cellgate::server::systemd
