// Internal: `serve --seed NOTEBOOK` in the jupyter-websocket mode (Kernel Gateway's seed_uri):
// the notebook's code cells run, in order, in a new kernel before any client sees it.
//
// Thread-safety: pure functions; blocking (never on a loop or I/O thread).
#pragma once

#include <chrono>
#include <string>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

// True when `spec` is seeded: a seed is configured and its language is the kernelspec's
// (case-insensitively; a seed without a language seeds every kernel), as Kernel Gateway seeds
// only kernels of the seed notebook's language.
bool seeds(const SeedOptions& seed, const kernel::KernelSpec& spec);

// Runs each cell in turn on `connection`, each within `timeout`, without history. The first cell
// that fails (an error reply, a dead kernel, the timeout) is kFailedPrecondition "seed_failed",
// naming the cell and the kernel's error.
Result<void> seed_kernel(const SeedOptions& seed, kernel::KernelConnection& connection,
                         const std::string& kernel_id, std::chrono::milliseconds timeout);

}  // namespace cellgate::kernels
