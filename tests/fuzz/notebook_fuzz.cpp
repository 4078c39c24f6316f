// The ipynb reader and papermill parameters (notebooks/src/notebook.cpp, parameters.cpp). The
// input is given to notebook::parse (a .ipynb) and to parameters::yaml (a -y value: a notebook's
// JSON is also a YAML flow mapping). Invariants:
//   - a notebook parse() accepts validates, and dump() of it parses again to the same JSON;
//   - after inject_parameters and clear_outputs it still validates and still round-trips, and
//     the injected cell is where Injection says, tagged "injected-parameters";
//   - every parameter yaml() yields has a valid Python name (check_name) and a non-empty value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/notebooks/notebook.hpp"
#include "cellgate/notebooks/parameters.hpp"
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
namespace notebook = cellgate::notebooks::notebook;
namespace parameters = cellgate::notebooks::parameters;

void check_round_trip(const nlohmann::json& nb, const char* when) {
  auto valid = notebook::validate(nb);
  check(valid.ok(), when, valid ? "" : valid.error().describe());
  const std::string text = notebook::dump(nb);
  auto again = notebook::parse(text);
  check(again.ok(), "dump() wrote a notebook parse() refuses",
        (again ? "" : again.error().describe()) + "\n" + text.substr(0, 2000));
  check(*again == nb, "a notebook changed in dump() and parse()", text.substr(0, 2000));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  std::vector<notebook::Parameter> params;
  if (auto from_yaml = parameters::yaml(text)) {
    for (const auto& p : *from_yaml) {
      check(parameters::check_name(p.name).ok(), "yaml() yielded a bad name", p.name);
      check(!p.python.empty(), "yaml() yielded an empty value", p.name);
    }
    params = std::move(from_yaml).value();
  }

  auto nb = notebook::parse(text);
  if (!nb) {
    check(nb.error().reason == "invalid_notebook", "parse() failed with another reason",
          nb.error().describe());
    return 0;
  }
  check_round_trip(*nb, "parse() accepted a notebook validate() refuses");
  (void)notebook::kernel_name(*nb);
  for (const auto& cell : (*nb)["cells"]) {
    (void)notebook::first_line(notebook::source_of(cell));
    if (cell.contains("outputs") && cell["outputs"].is_array()) {
      for (const auto& output : cell["outputs"]) {
        (void)notebook::artifacts_of(output);
      }
    }
  }

  params.push_back({"fuzz_alpha", "0.5"});
  const notebook::Injection at = notebook::inject_parameters(*nb, params);
  check(at.index < (*nb)["cells"].size(), "inject_parameters() gave an index past the cells");
  check(notebook::has_tag((*nb)["cells"][at.index], "injected-parameters"),
        "the cell at Injection::index is not the injected one");
  notebook::clear_outputs(*nb);
  check_round_trip(*nb, "an injected, cleared notebook does not validate");
  return 0;
}
