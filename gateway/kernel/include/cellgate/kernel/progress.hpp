// Whether a kernel that does not answer heartbeats is busy or hung: a probe over its process and
// its cgroup's CPU figures, for ClientOptions::progress.
//
//   ClientOptions co;
//   co.progress = kernel::progress_probe(*process);   // nullptr when there is nothing to read
//   backend.connect(*process, std::move(co));
//
// Each call compares with the previous one (the first call only takes a sample and says
// kRunning): the kernel is running when its cgroup (or, without one, its process and the
// children it reaped) used at least 1% of a CPU since the last call, or was held at its CPU quota
// with work waiting (cpu.stat's nr_throttled grew); stalled when it used less (hung, or stopped
// by SIGSTOP); gone when the process the launcher reported (identified with its start time: a
// jailed kernel's is its jail's pid 1) or its cgroup is gone.
//
// Thread-safety: the probe holds copies of the handle's facts, never the handle, so it may
// outlive it (a connection shared by a cell can); one caller at a time (the client's I/O thread).
#pragma once

#include <functional>

#include "cellgate/kernel/kernel.hpp"

namespace cellgate::kernel {

// nullptr when the handle gives no facts to read (a fake kernel): every miss then counts.
std::function<Progress()> progress_probe(const KernelProcessHandle& process);

}  // namespace cellgate::kernel
