// DirStream: the entries of a directory, without "." and "..", closed on scope exit.
//
//   CELLGATE_ASSIGN_OR_RETURN(sys::DirStream dir, sys::DirStream::open("/proc/self/fd"));
//   while (auto entry = dir.next()) { use(entry->name, entry->type); }
//
// d_type may be DT_UNKNOWN on some filesystems; callers that need the type for sure lstat(2).
//
// Thread-safety: a value; one owner at a time.
#pragma once

#include <dirent.h>

#include <optional>
#include <string>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::sys {

class DirStream {
 public:
  struct Entry {
    std::string name;
    unsigned char type = DT_UNKNOWN;  // d_type: DT_DIR, DT_REG, DT_LNK, …
  };

  DirStream() = default;
  ~DirStream();
  DirStream(DirStream&& other) noexcept;
  DirStream& operator=(DirStream&& other) noexcept;
  DirStream(const DirStream&) = delete;
  DirStream& operator=(const DirStream&) = delete;

  static Result<DirStream> open(const std::string& path);

  // The next entry, or nullopt at the end (or on a read error, which readdir(3) reports only
  // through errno; a directory removed meanwhile simply ends).
  std::optional<Entry> next();
  // The stream's own descriptor (to skip it when listing /proc/self/fd).
  int fd() const;

 private:
  explicit DirStream(DIR* dir) : dir_(dir) {}
  DIR* dir_ = nullptr;
};

// The names in `path` (unsorted); empty when it cannot be opened.
std::vector<std::string> list_dir(const std::string& path);

}  // namespace cellgate::sys
