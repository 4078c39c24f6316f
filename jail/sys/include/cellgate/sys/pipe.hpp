// Pipes and socket pairs as owned descriptor pairs.
//
//   CELLGATE_ASSIGN_OR_RETURN(sys::Pipe p, sys::make_pipe());        // O_CLOEXEC both ends
//   ::write(p.write.get(), "x", 1);
//   CELLGATE_ASSIGN_OR_RETURN(sys::SocketPair s, sys::make_socket_pair(SOCK_SEQPACKET));
//
// Both ends are close-on-exec: a child that should inherit one clears the flag (or dup2s it to a
// fixed number) itself, so nothing leaks into a kernel by default.
//
// Thread-safety: values; share one between threads only under a lock.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::sys {

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// pipe2(2) with O_CLOEXEC and `extra_flags` (O_NONBLOCK, O_DIRECT).
Result<Pipe> make_pipe(int extra_flags = 0);

// socketpair(AF_UNIX, type | SOCK_CLOEXEC); `type` is SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET,
// optionally with SOCK_NONBLOCK.
struct SocketPair {
  UniqueFd first;
  UniqueFd second;
};
Result<SocketPair> make_socket_pair(int type);

// write(2) of all of `data`, retrying EINTR and short writes; read(2) of up to `n` bytes,
// retrying EINTR (0 bytes at the end of the stream).
Result<void> write_all(int fd, const void* data, std::size_t n);
Result<std::size_t> read_some(int fd, void* data, std::size_t n);

}  // namespace cellgate::sys
