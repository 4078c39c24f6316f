// A checkpoint image's records as rebase_records() reads them before a fork or a start from a
// snapshot (kernel-launcher/checkpoint/src/rebase.cpp): images come from disk, so any bytes.
// The first byte picks the kind (c: core, f: files, h: ghost-file, g: cgroup). Invariants:
//   - no crash, no exception, whatever the bytes; nesting and lengths are bounded;
//   - a refusal is "checkpoint_image" with a message;
//   - what it writes reads back: rebasing its output again succeeds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/checkpoint/rebase.hpp"
#include "fuzz_util.hpp"

using cellgate::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const char* name = "core-1.img";
  switch (data[0]) {
    case 'f':
      name = "files.img";
      break;
    case 'h':
      name = "ghost-file-1.img";
      break;
    case 'g':
      name = "cgroup.img";
      break;
    default:
      break;
  }
  const std::string_view image(reinterpret_cast<const char*>(data) + 1, size - 1);
  cellgate::checkpoint::Rebase r{2000002, 2000005, 2000002, 2000005, "k-a", "k-bb"};
  auto out = cellgate::checkpoint::rebase_records(name, image, r);
  if (!out) {
    check(out.error().reason == "checkpoint_image" && !out.error().message.empty(),
          "a refusal without its reason or message", out.error().message);
    return 0;
  }
  auto again = cellgate::checkpoint::rebase_records(name, *out, r);
  check(again.ok(), "a rebased image that does not read back",
        again ? std::string() : again.error().message);
  return 0;
}
