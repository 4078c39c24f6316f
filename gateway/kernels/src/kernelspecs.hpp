// Kernelspecs the registry offers: the standard directories, plus a built-in python3 (Debian's
// ipykernel) when none is installed. Every one runs through cellgate-kernel.
#pragma once

#include <string>
#include <vector>

#include "cellgate/kernel/connection.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

// Sorted by name; the first directory that has a name wins (jupyter's order).
std::vector<kernel::KernelSpec> list_kernelspecs();
// kNotFound when there is no such kernelspec (python3 always exists).
Result<kernel::KernelSpec> find_kernelspec(const std::string& name);

// Whether the kernelspec runs ipykernel (`… -m ipykernel_launcher|ipykernel …`): what the gateway
// knows of ipykernel and assumes of no other kernel (IPython sets itself up on the first cell,
// which the pool pays with a silent `pass`). Any other kernelspec (IRkernel, …) gets the
// generic treatment.
bool is_ipykernel(const kernel::KernelSpec& spec);

}  // namespace cellgate::kernels
