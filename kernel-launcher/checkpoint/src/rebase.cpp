// Rebasing a checkpoint image onto another kernel identity: see rebase.hpp. A protobuf record is
// walked field by field and written again, the fields named below edited on the way; nothing
// else in it changes, byte for byte.
#include "cellgate/checkpoint/rebase.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>

#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/text.hpp"

namespace cellgate::checkpoint {
namespace {

namespace fs = std::filesystem;

// CRIU's images/magic.h: the first word of every image but the raw page ones.
constexpr std::uint32_t kCommonMagic = 0x54564319;
constexpr std::uint32_t kServiceMagic = 0x55105940;
constexpr int kMaxRecordDepth = 32;           // cgroup dirs nest; nothing else does
constexpr std::size_t kMaxImage = 64u << 20;  // the records we edit are small
constexpr std::size_t kMaxRecord = 16u << 20;

Error malformed(const std::string& name, const std::string& what) {
  return make_error(ErrorCode::kFailedPrecondition, "checkpoint_image",
                    "the image's " + name + " is malformed: " + what);
}

enum Wire : std::uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

struct Field {
  std::uint32_t number = 0;
  std::uint32_t wire = 0;
  std::uint64_t value = 0;  // kVarint
  std::string_view raw;     // kBytes: the payload; fixed: the 4 or 8 bytes
  std::string replaced;     // kBytes: the new payload when `edited`
  bool edited = false;
};

bool read_varint(std::string_view& in, std::uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in.empty()) {
      return false;
    }
    const auto byte = static_cast<std::uint8_t>(in.front());
    in.remove_prefix(1);
    out |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      return true;
    }
  }
  return false;
}

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// How a message's fields are edited: called for each field in order; it may set f.value (a
// varint) or f.replaced + f.edited (bytes). `depth` is the message's nesting.
using Visit = std::function<Result<void>(Field& f, int depth)>;

Result<std::string> rewrite(const std::string& name, std::string_view msg, const Visit& visit,
                            int depth) {
  if (depth > kMaxRecordDepth) {
    return malformed(name, "records nest deeper than " + std::to_string(kMaxRecordDepth));
  }
  std::string out;
  out.reserve(msg.size() + 16);
  while (!msg.empty()) {
    std::uint64_t key = 0;
    if (!read_varint(msg, key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) {
      return malformed(name, "a bad field key");
    }
    Field f;
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.wire = static_cast<std::uint32_t>(key & 7);
    switch (f.wire) {
      case kVarint:
        if (!read_varint(msg, f.value)) {
          return malformed(name, "a truncated number");
        }
        break;
      case kFixed64:
      case kFixed32: {
        const std::size_t n = f.wire == kFixed64 ? 8 : 4;
        if (msg.size() < n) {
          return malformed(name, "a truncated fixed field");
        }
        f.raw = msg.substr(0, n);
        msg.remove_prefix(n);
        break;
      }
      case kBytes: {
        std::uint64_t len = 0;
        if (!read_varint(msg, len) || len > msg.size()) {
          return malformed(name, "a length past the record's end");
        }
        f.raw = msg.substr(0, len);
        msg.remove_prefix(len);
        break;
      }
      default:
        return malformed(name, "an unknown wire type " + std::to_string(f.wire));
    }
    CELLGATE_TRY(visit(f, depth));
    put_varint(out, key);
    switch (f.wire) {
      case kVarint:
        put_varint(out, f.value);
        break;
      case kBytes: {
        const std::string_view payload = f.edited ? std::string_view(f.replaced) : f.raw;
        put_varint(out, payload.size());
        out.append(payload);
        break;
      }
      default:
        out.append(f.raw);
    }
  }
  return out;
}

// A submessage field edited by `visit`.
Result<void> descend(const std::string& name, Field& f, int depth, const Visit& visit) {
  if (f.wire != kBytes) {
    return malformed(name, "field " + std::to_string(f.number) + " is not a message");
  }
  CELLGATE_ASSIGN_OR_RETURN(f.replaced, rewrite(name, f.raw, visit, depth + 1));
  f.edited = true;
  return {};
}

std::uint64_t swap(std::uint64_t v, std::uint64_t from, std::uint64_t to) {
  return v == from ? to : v;
}

// A repeated uint32 field may come packed (one bytes field) or one varint per element.
Result<void> swap_ids(const std::string& name, Field& f, std::uint64_t from, std::uint64_t to) {
  if (f.wire == kVarint) {
    f.value = swap(f.value, from, to);
    return {};
  }
  if (f.wire != kBytes) {
    return malformed(name, "an id field of wire type " + std::to_string(f.wire));
  }
  std::string_view in = f.raw;
  std::string out;
  while (!in.empty()) {
    std::uint64_t v = 0;
    if (!read_varint(in, v)) {
      return malformed(name, "a truncated packed id");
    }
    put_varint(out, swap(v, from, to));
  }
  f.replaced = std::move(out);
  f.edited = true;
  return {};
}

// The path components equal to `from` become `to` ("a/k-1/b" → "a/k-2/b"; "k-10" stays).
std::string swap_component(std::string_view path, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) {
      end = path.size();
    }
    const std::string_view part = path.substr(start, end - start);
    out.append(part == from ? std::string_view(to) : part);
    if (end == path.size()) {
      break;
    }
    out.push_back('/');
    start = end + 1;
  }
  return out;
}

// images/creds.proto: uid 1, gid 2, euid 3, egid 4, suid 5, sgid 6, fsuid 7, fsgid 8, groups 14.
Visit creds_visit(const std::string& name, const Rebase& r) {
  return [&name, &r](Field& f, int) -> Result<void> {
    if (f.number >= 1 && f.number <= 8) {
      if (f.wire != kVarint) {
        return malformed(name, "a credential that is not a number");
      }
      f.value = f.number % 2 == 1 ? swap(f.value, r.from_uid, r.to_uid)
                                  : swap(f.value, r.from_gid, r.to_gid);
    } else if (f.number == 14) {
      return swap_ids(name, f, r.from_gid, r.to_gid);
    }
    return {};
  };
}

// An owner pair (uid, gid) at the given field numbers: file_perms_entry (2, 3), cgroup_perms
// (2, 3), ghost_file_entry (1, 2).
Visit owner_visit(const std::string& name, const Rebase& r, std::uint32_t uid_field,
                  std::uint32_t gid_field) {
  return [&name, &r, uid_field, gid_field](Field& f, int) -> Result<void> {
    if (f.number == uid_field || f.number == gid_field) {
      if (f.wire != kVarint) {
        return malformed(name, "an owner that is not a number");
      }
      f.value = f.number == uid_field ? swap(f.value, r.from_uid, r.to_uid)
                                      : swap(f.value, r.from_gid, r.to_gid);
    }
    return {};
  };
}

// A visit that edits the submessage at field `number` with `inner` and leaves the rest.
Visit at(const std::string& name, std::uint32_t number, Visit inner) {
  return [&name, number, inner = std::move(inner)](Field& f, int depth) -> Result<void> {
    return f.number == number ? descend(name, f, depth, inner) : Result<void>{};
  };
}

// The visit of one top-level record of the image `kind`.
Result<std::string> rebase_record(const std::string& kind, const std::string& name,
                                  std::string_view record, const Rebase& r) {
  const Visit creds = creds_visit(name, r);
  const Visit perms = owner_visit(name, r, 2, 3);
  if (kind == "core") {
    // core_entry.thread_core (5) → thread_core_entry.creds (10)
    return rewrite(name, record, at(name, 5, at(name, 10, creds)), 0);
  }
  if (kind == "files") {
    // file_entry.usk (16) → unix_sk_entry.file_perms (13)
    return rewrite(name, record, at(name, 16, at(name, 13, perms)), 0);
  }
  if (kind == "ghost-file") {
    return rewrite(name, record, owner_visit(name, r, 1, 2), 0);
  }
  if (kind == "cgroup") {
    // cgroup_entry: sets (1) → cg_set_entry.ctls (2) → cg_member_entry.path (2);
    // controllers (2) → cg_controller_entry.dirs (2) → cgroup_dir_entry: dir_name (1, a path
    // at the top, one name below), children (2, recursive), properties (3) → perms (3),
    // dir_perms (4).
    auto swap_string = [&](Field& f) -> Result<void> {
      if (f.wire != kBytes) {
        return malformed(name, "a cgroup path that is not a string");
      }
      f.replaced = swap_component(f.raw, r.from_cgroup, r.to_cgroup);
      f.edited = true;
      return {};
    };
    const Visit prop = at(name, 3, perms);
    Visit dir;
    dir = [&](Field& f, int depth) -> Result<void> {
      switch (f.number) {
        case 1:
          return swap_string(f);
        case 2:
          return descend(name, f, depth, dir);
        case 3:
          return descend(name, f, depth, prop);
        case 4:
          return descend(name, f, depth, perms);
        default:
          return {};
      }
    };
    const Visit member = [&](Field& f, int) -> Result<void> {
      return f.number == 2 ? swap_string(f) : Result<void>{};
    };
    const Visit set = at(name, 2, member);
    // `dir` refers to itself: the controller's visit calls it through a reference.
    const Visit controller = [&](Field& f, int depth) -> Result<void> {
      return f.number == 2 ? descend(name, f, depth, dir) : Result<void>{};
    };
    return rewrite(
        name, record,
        [&](Field& f, int depth) -> Result<void> {
          return f.number == 1   ? descend(name, f, depth, set)
                 : f.number == 2 ? descend(name, f, depth, controller)
                                 : Result<void>{};
        },
        0);
  }
  return make_error(ErrorCode::kInternal, "checkpoint_image", "no rebase for " + kind);
}

std::uint32_t le32(std::string_view s) {
  std::uint32_t v = 0;
  std::memcpy(&v, s.data(), 4);
  return v;
}

// The kind of image a criu/ file name is, as rebase_records() takes it; "" for the others.
std::string kind_of(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("core-") && name.size() > 9 && name.compare(name.size() - 4, 4, ".img") == 0) {
    return "core";
  }
  if (name == "files.img") {
    return "files";
  }
  if (starts("ghost-file-")) {
    return "ghost-file";
  }
  if (name == "cgroup.img") {
    return "cgroup";
  }
  return "";
}

bool refused_kind(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  return starts("ipcns-shm-") || starts("ipcns-msg-") || starts("ipcns-sem-") ||
         name == "memfd.img";
}

// The header's length: two magic words (common or service, then the image's), else one.
std::size_t header_size(std::string_view image) {
  if (image.size() >= 8 && (le32(image) == kCommonMagic || le32(image) == kServiceMagic)) {
    return 8;
  }
  return 4;
}

// Re-owns a private tmpfs's tar (CRIU's tmpfs-dev-N.tar.gz.img): unpacked into a scratch dir as
// root with numeric owners, every entry of the source's uid or gid given the copy's, packed again
// as CRIU packs it.
Result<void> rebase_tar(const std::string& in_path, const std::string& out_path, const Rebase& r) {
  std::string scratch = out_path + ".d";
  std::error_code ec;
  fs::remove_all(scratch, ec);
  if (::mkdir(scratch.c_str(), 0700) != 0) {
    return errno_error(ErrorCode::kInternal, "checkpoint_image", "mkdir('" + scratch + "')", errno);
  }
  struct Scratch {
    std::string path;
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } guard{scratch};
  auto tar = [&](const std::vector<std::string>& args) -> Result<void> {
    std::string out;
    CELLGATE_ASSIGN_OR_RETURN(int status, run_program("/bin/tar", args, {}, &out));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return make_error(ErrorCode::kFailedPrecondition, "checkpoint_image",
                        "tar on " + in_path + ": " + std::string(sys::trim(out)));
    }
    return {};
  };
  CELLGATE_TRY(tar({"--extract", "--gzip", "--no-unquote", "--no-wildcards", "--numeric-owner",
                    "--preserve-permissions", "--file", in_path, "--directory", scratch}));
  for (auto it = fs::recursive_directory_iterator(scratch, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) {
      continue;
    }
    if (st.st_uid == r.from_uid || st.st_gid == r.from_gid) {
      ::lchown(it->path().c_str(), st.st_uid == r.from_uid ? r.to_uid : st.st_uid,
               st.st_gid == r.from_gid ? r.to_gid : st.st_gid);
    }
  }
  if (ec) {
    return make_error(ErrorCode::kInternal, "checkpoint_image",
                      "walking the unpacked " + in_path + ": " + ec.message());
  }
  struct stat root {};
  if (::lstat(scratch.c_str(), &root) == 0 && root.st_uid == r.from_uid) {
    ::lchown(scratch.c_str(), r.to_uid, r.to_gid);
  }
  return tar({"--create", "--gzip", "--no-unquote", "--no-wildcards", "--one-file-system",
              "--check-links", "--preserve-permissions", "--sparse", "--numeric-owner", "--file",
              out_path, "--directory", scratch, "."});
}

}  // namespace

Result<std::string> rebase_records(const std::string& name, std::string_view image,
                                   const Rebase& r) {
  const std::string kind = kind_of(name);
  if (kind.empty()) {
    return make_error(ErrorCode::kInternal, "checkpoint_image", name + " is not rebased");
  }
  if (image.size() < 4) {
    return malformed(name, "shorter than its magic");
  }
  const std::size_t header = header_size(image);
  std::string out(image.substr(0, header));
  std::string_view rest = image.substr(header);
  while (!rest.empty()) {
    if (rest.size() < 4) {
      return malformed(name, "a truncated record size");
    }
    const std::uint32_t size = le32(rest);
    rest.remove_prefix(4);
    if (size > rest.size() || size > kMaxRecord) {
      return malformed(name, "a record past the file's end");
    }
    CELLGATE_ASSIGN_OR_RETURN(std::string record,
                              rebase_record(kind, name, rest.substr(0, size), r));
    rest.remove_prefix(size);
    const auto n = static_cast<std::uint32_t>(record.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(record);
    if (kind == "ghost-file") {
      out.append(rest);  // the file's contents follow its one record, raw
      break;
    }
  }
  return out;
}

Result<bool> rebase_image(const std::string& name, const std::string& in_path,
                          const std::string& out_path, const Rebase& r) {
  if (r.identity()) {
    return false;
  }
  if (refused_kind(name)) {
    struct stat st {};
    // An empty one is magic words only.
    if (::stat(in_path.c_str(), &st) == 0 && st.st_size > 8) {
      return make_error(ErrorCode::kFailedPrecondition, "not_copyable",
                        "the kernel holds SysV IPC objects or memfd files (" + name +
                            "), which a copy under another uid cannot be given; this kernel "
                            "cannot be forked or started from a snapshot");
    }
    return false;
  }
  if (name.rfind("tmpfs-dev-", 0) == 0 && name.find(".tar.gz") != std::string::npos) {
    CELLGATE_TRY(rebase_tar(in_path, out_path, r));
    ::chmod(out_path.c_str(), 0600);
    return true;
  }
  if (kind_of(name).empty()) {
    return false;
  }
  CELLGATE_ASSIGN_OR_RETURN(std::string image,
                            sys::read_file(in_path, kMaxImage, "checkpoint_image"));
  CELLGATE_ASSIGN_OR_RETURN(std::string rebased, rebase_records(name, image, r));
  CELLGATE_TRY(
      sys::atomic_write(out_path, rebased, 0600, sys::Durability::kNone, "checkpoint_image"));
  return true;
}

}  // namespace cellgate::checkpoint
