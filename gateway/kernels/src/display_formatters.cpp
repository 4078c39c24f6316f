#include "cellgate/kernels/display_formatters.hpp"

#include "cellgate_display_py.hpp"  // generated from python/cellgate_display.py
#include "kernelspecs.hpp"

namespace cellgate::kernels {
namespace {

constexpr const char* kFileName = "cellgate_display.py";

// One IPython exec_line (run by IPKernelApp.init_code, with no parent request, before the first
// cell). All of it is inside exec(…, {}) so no name reaches the user's namespace and the line's
// value is None (nothing displayed). The file sits beside the connection file, wherever that is
// (/run/kernel in the jail, the runtime dir for an unjailed kernel). No braces: argv is expanded
// for {connection_file}; no '?', '!' or '%' that IPython's input transformers would read.
constexpr const char* kExecLine =
    "--IPKernelApp.exec_lines=exec(\""
    "import os, sys, types\\n"
    "try:\\n"
    "    from IPython import get_ipython\\n"
    "    from ipykernel.kernelapp import IPKernelApp\\n"
    "    m = sys.modules.get('_cellgate_display')\\n"
    "    if m is None:\\n"
    "        p = os.path.join(os.path.dirname(IPKernelApp.instance().abs_connection_file), "
    "'cellgate_display.py')\\n"
    "        m = types.ModuleType('_cellgate_display')\\n"
    "        m.__file__ = p\\n"
    "        with open(p) as f:\\n"
    "            exec(compile(f.read(), p, 'exec'), m.__dict__)\\n"
    "        sys.modules['_cellgate_display'] = m\\n"
    "    m.load_ipython_extension(get_ipython())\\n"
    "except Exception as e:\\n"
    "    print('cellgate: the display formatters are not loaded:', repr(e), file=sys.__stderr__)\\n"
    "\", dict())";

}  // namespace

std::string_view display_formatters_source() {
  return kCellgateDisplayPy;
}

bool add_display_formatters(kernel::LaunchRequest& request) {
  if (!is_ipykernel(request.spec)) {
    return false;
  }
  request.conn_files[kFileName] = std::string(display_formatters_source());
  request.spec.argv.emplace_back(kExecLine);
  return true;
}

}  // namespace cellgate::kernels
