// The kernel's display formatters (python/cellgate_display.py): a matplotlib figure's data as
// E2B's chart, a DataFrame's columns, PIL's Image.show() as a display — what the agent API and
// the E2B endpoint return next to the PNG, because a model reads numbers, not pixels.
//
//   kernel::LaunchRequest req = …;
//   if (options.display_formatters) { add_display_formatters(req); }
//
// The module is embedded in the binary at build time (a CMake-generated header), written into
// the kernel's connection dir (the jail's /run/kernel) and run by one IPKernelApp exec_line, so
// cold kernels and the zygote's forks load it the same way, and the jail needs no new path.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "cellgate/kernel/process.hpp"

namespace cellgate::kernels {

// The MIME types the module adds to a display bundle.
inline constexpr std::string_view kChartMime = "application/vnd.cellgate.chart+json";
inline constexpr std::string_view kDataMime = "application/vnd.cellgate.data+json";
// The module's name in the kernel's sys.modules (never in the user's namespace).
inline constexpr std::string_view kDisplayModule = "_cellgate_display";

// The module's source, as built in.
std::string_view display_formatters_source();

// For an ipykernel kernelspec: the module among the request's connection-dir files and the
// exec_line that loads it appended to the argv. Other kernels are left as they are (false).
bool add_display_formatters(kernel::LaunchRequest& request);

}  // namespace cellgate::kernels
