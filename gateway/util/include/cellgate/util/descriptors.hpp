// How close the process is to its descriptor limit (RLIMIT_NOFILE), so that running out is a
// clear refusal at the edge — a 503 for a new connection, an error for a kernel start — and not
// a failure deep inside a library that cannot report it.
//
//   if (near_descriptor_limit(socket.native_handle())) { refuse(...); }
//   CELLGATE_TRY(require_free_descriptors(kKernelDescriptors, "starting a kernel"));
//
// Thread-safety: functions without shared state; the answers are snapshots.
#pragma once

#include <cstddef>

#include "cellgate/result.hpp"

namespace cellgate {

// The soft RLIMIT_NOFILE (a large number when unlimited).
std::size_t descriptor_limit();

// Descriptors kept free for what is not a client connection (kernel sockets and pipes, files):
// 1/16 of the limit, at least 32, at most 256.
std::size_t descriptor_headroom();

// Whether a descriptor just opened as `fd` leaves less than descriptor_headroom() free. Cheap
// enough for every accept: descriptors are allocated lowest free number first, so every number
// below `fd` is in use, and only numbers below the limit can be allocated.
bool near_descriptor_limit(int fd);

// Open descriptors now (counted in /proc/self/fd).
std::size_t descriptors_open();

// Descriptor numbers still free below the limit: what the process can still open (the kernel
// allocates numbers, not a count; descriptors above a lowered limit stay open but take none).
std::size_t descriptors_free();

// kResourceExhausted, naming `what` and the counts, when fewer than `needed` descriptors are free.
Result<void> require_free_descriptors(std::size_t needed, const char* what);

}  // namespace cellgate
