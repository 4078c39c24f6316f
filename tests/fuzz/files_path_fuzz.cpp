// Files-path resolution (gateway/store/src/files.cpp): normalize() on a decoded URL path, then
// the WorkDir methods on the result inside a scratch root that holds a file, a directory and
// symlinks pointing out of it and back in. Invariants:
//   - normalize() is idempotent, and what it returns is relative, has no "", "." or ".."
//     component, no NUL, no leading/trailing/double slash;
//   - nothing a path names is ever outside the root: read() never returns the secret planted
//     outside it, list() never lists the outside directory, and write() creates nothing outside.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "cellgate/store/files.hpp"
#include "fuzz_util.hpp"

namespace {

namespace fs = std::filesystem;
using cellgate::fuzz::check;
using namespace cellgate::store;

constexpr std::string_view kSecret = "the secret outside the root";

// scratch/outside/secret.txt, scratch/root/{a.txt, dir/b.txt, up -> ../outside,
// abs -> <scratch>/outside, loop -> loop, in -> dir}. Made once per process.
struct Scratch {
  fs::path base;
  fs::path root;
  fs::path outside;
  Scratch() {
    std::string tmpl = (fs::temp_directory_path() / "cellgate-fuzz-files-XXXXXX").string();
    base = ::mkdtemp(tmpl.data());
    root = base / "root";
    outside = base / "outside";
    fs::create_directories(outside);
    std::ofstream(outside / "secret.txt") << kSecret;
  }
  // The root afresh for each input: a write may have replaced a symlink by a file.
  void reset() const {
    std::error_code ec;
    fs::remove_all(root, ec);
    fs::create_directories(root / "dir");
    std::ofstream(root / "a.txt") << "a";
    std::ofstream(root / "dir" / "b.txt") << "b";
    fs::create_directory_symlink("../outside", root / "up");
    fs::create_directory_symlink(outside, root / "abs");
    fs::create_symlink("loop", root / "loop");
    fs::create_directory_symlink("dir", root / "in");
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
};

void check_normalized(std::string_view input, const std::string& rel) {
  check(!rel.empty(), "normalize() returned an empty path");
  check(rel.front() != '/' && rel.back() != '/', "normalize() kept a leading or trailing slash",
        rel);
  check(rel.find('\0') == std::string::npos, "normalize() kept a NUL");
  check(rel.find("//") == std::string::npos, "normalize() kept a double slash", rel);
  std::string_view rest = rel;
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    const std::string_view part = rest.substr(0, slash);
    check(part != "." && part != ".." && !part.empty(), "normalize() kept a . or .. component",
          std::string(input) + " -> " + rel);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  }
  auto again = files::normalize(rel);
  check(again && *again == rel, "normalize() is not idempotent", rel);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Scratch scratch;
  scratch.reset();
  const auto dir = files::WorkDir::open(scratch.root.string(), ::getuid(), ::getgid());
  check(dir.ok(), "cannot open the scratch work dir (openat2 missing?)",
        dir ? "" : dir.error().describe());
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  auto rel = files::normalize(input);
  if (!rel) {
    check(rel.error().reason == "bad_path", "normalize() failed with another reason",
          rel.error().describe());
    return 0;
  }
  check_normalized(input, *rel);

  if (auto bytes = dir->read(*rel, 1 << 16)) {
    check(bytes->find(kSecret) == std::string::npos, "read() escaped the root", *rel);
  }
  if (auto listing = dir->list(*rel, 100)) {
    for (const auto& e : listing->entries) {
      check(e.name != "secret.txt", "list() escaped the root", *rel);
    }
  }
  if (auto info = dir->write(*rel, "x", 16, /*make_parents=*/true)) {
    check(info->path == *rel, "write() reports another path", info->path + " != " + *rel);
    std::error_code ec;
    for (const auto& entry : fs::recursive_directory_iterator(scratch.outside, ec)) {
      check(entry.path().filename() == "secret.txt", "write() created something outside the root",
            *rel + " made " + entry.path().string());
    }
    std::ifstream secret(scratch.outside / "secret.txt");
    std::string content((std::istreambuf_iterator<char>(secret)), std::istreambuf_iterator<char>());
    check(content == kSecret, "write() changed a file outside the root", *rel);
  }
  (void)dir->remove(*rel);
  check(fs::exists(scratch.outside / "secret.txt"), "remove() deleted a file outside the root",
        *rel);
  return 0;
}
