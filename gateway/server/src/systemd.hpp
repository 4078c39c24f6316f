// systemd's service protocol, as Debian's daemons speak it (libsystemd's sd-daemon):
//   - readiness and status: notify("READY=1\nSTATUS=…") under Type=notify, "STOPPING=1" on the way
//     out; nothing is sent when NOTIFY_SOCKET is unset (not under systemd);
//   - the watchdog: watchdog_interval() is half of WatchdogSec= (0: none asked); the caller pings
//     "WATCHDOG=1" from the event loop it wants watched;
//   - socket activation: take_listen_sockets() adopts the sockets a .socket unit passed
//     (FileDescriptorName=http / e2b; an unnamed single one is the HTTP port), so connections
//     made during a restart wait in the kernel's backlog instead of being refused;
//   - the journal: journal_logger() when stdout/stderr is journald's stream (JOURNAL_STREAM),
//     so each line keeps its priority (warning, error) instead of all being "info".
//
// Thread-safety: take_listen_sockets and journal_logger once, at start, before threads; notify
// from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "cellgate/result.hpp"

namespace spdlog {
class logger;
}

namespace cellgate::server::systemd {

struct ListenSockets {
  int http = -1;  // a listening TCP socket, or -1: open --ip/--port as usual
  int e2b = -1;   // the same for --e2b-port
};

// The sockets systemd passed to this process (LISTEN_FDS/LISTEN_PID, then unset). Error
// "socket_activation" (kInvalidArgument) for a socket that is not a listening TCP socket or a
// name other than http/e2b, naming it.
Result<ListenSockets> take_listen_sockets();

void notify(const std::string& state);

std::chrono::microseconds watchdog_interval();

// A logger writing to the journal with priorities when stderr or stdout is its stream, else null.
std::shared_ptr<spdlog::logger> journal_logger();

}  // namespace cellgate::server::systemd
