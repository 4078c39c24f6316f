// JailSpec JSON as the launcher receives it (kernel-launcher/src/spec_json.cpp, checked by
// jail/src/spec.cpp's validate()). The input is the text of a --spec file. Invariants:
//   - no exception leaves spec_from_json, whatever the JSON;
//   - every spec it accepts passes JailSpec::validate() (spec_from_json promises so);
//   - spec_to_json then spec_from_json gives the same spec (compared as JSON), so what the
//     gateway writes for a launcher or a zygote is read back as it meant.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "cellgate/launcher/spec_json.hpp"
#include "fuzz_util.hpp"

using cellgate::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return 0;
  }
  auto spec = cellgate::launcher::spec_from_json(j);
  if (!spec) {
    check(spec.error().code == cellgate::ErrorCode::kInvalidArgument &&
              spec.error().reason == "bad_jail_spec",
          "spec_from_json failed with another error", spec.error().describe());
    return 0;
  }
  auto valid = spec->validate();
  check(valid.ok(), "spec_from_json accepted a spec validate() refuses",
        valid ? "" : valid.error().describe());
  const nlohmann::json written = cellgate::launcher::spec_to_json(*spec);
  auto reread = cellgate::launcher::spec_from_json(written);
  check(reread.ok(), "spec_from_json refuses what spec_to_json wrote",
        (reread ? "" : reread.error().describe()) + "\n" + written.dump());
  const nlohmann::json rewritten = cellgate::launcher::spec_to_json(*reread);
  check(rewritten == written, "a spec changed in a JSON round trip",
        written.dump() + "\n---\n" + rewritten.dump());
  return 0;
}
