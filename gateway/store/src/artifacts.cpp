#include "cellgate/store/artifacts.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>

#include "cellgate/protocol/message.hpp"
#include "cellgate/unique_fd.hpp"
#include "cellgate/util/fs.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::store {
namespace {

constexpr std::string_view kSvg = "image/svg+xml";
constexpr std::array<std::string_view, 5> kArtifactMimes = {"image/png", "image/jpeg", "image/gif",
                                                            kSvg, "application/pdf"};

std::string describe_bytes(std::uint64_t n) {
  char buf[64];
  if (n >= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / (1 << 20));
  } else if (n >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(n) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  }
  return buf;
}

// A mime bundle value: a string, or an array of strings to concatenate (nbformat's
// multiline_string keeps each line's own "\n").
Result<std::string> join_value(const std::string& mime, const nlohmann::json& value) {
  if (value.is_string()) {
    return value.get<std::string>();
  }
  if (value.is_array()) {
    std::string joined;
    for (const auto& part : value) {
      if (!part.is_string()) {
        return make_error(ErrorCode::kInvalidArgument, "bad_artifact",
                          mime + " value is an array with a non-string element");
      }
      joined += part.get_ref<const std::string&>();
    }
    return joined;
  }
  return make_error(
      ErrorCode::kInvalidArgument, "bad_artifact",
      mime + " value must be a string or an array of strings, not " + value.type_name());
}

Result<std::string> decode_content(const std::string& mime, const nlohmann::json& value) {
  CELLGATE_ASSIGN_OR_RETURN(std::string text, join_value(mime, value));
  if (mime == kSvg) {
    return text;  // SVG travels as text: its UTF-8 bytes are the file
  }
  auto bytes = base64_decode(text);
  if (!bytes) {
    return make_error(ErrorCode::kInvalidArgument, "bad_base64",
                      mime + " value is " + bytes.error().message);
  }
  return bytes;
}

bool valid_sha(std::string_view sha) {
  if (sha.size() != 64) {
    return false;
  }
  for (char c : sha) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

// Kernel ids name a journal file, so nothing that could step out of index/.
Result<void> check_kernel_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 128 && id.front() != '.';
  for (char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.');
  }
  if (!ok) {
    return make_error(ErrorCode::kInvalidArgument, "bad_kernel_id",
                      "kernel id '" + id + "' is not usable as a file name");
  }
  return {};
}

nlohmann::json normalize_count(const nlohmann::json& execution_count) {
  return execution_count.is_number_integer() ? execution_count : nlohmann::json(nullptr);
}

Result<void> write_all(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno_error(ErrorCode::kInternal, "artifact_io", "write('" + path + "')", errno);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// The file's type from its first bytes, for content recorded before a restart.
std::string sniff_mime(std::string_view head) {
  auto starts = [&](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  if (starts("\x89PNG\r\n\x1a\n")) {
    return "image/png";
  }
  if (starts("\xff\xd8\xff")) {
    return "image/jpeg";
  }
  if (starts("GIF87a") || starts("GIF89a")) {
    return "image/gif";
  }
  if (starts("%PDF-")) {
    return "application/pdf";
  }
  std::string_view text = head;
  if (text.substr(0, 3) == "\xef\xbb\xbf") {
    text.remove_prefix(3);  // UTF-8 byte order mark
  }
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '\n' ||
                           text.front() == '\r')) {
    text.remove_prefix(1);
  }
  if (text.substr(0, 4) == "<svg" || text.substr(0, 5) == "<?xml" ||
      (text.substr(0, 1) == "<" && text.find("<svg") != std::string_view::npos)) {
    return std::string(kSvg);
  }
  return "application/octet-stream";
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) {
    return {};
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[md[i] >> 4]);
    hex.push_back(kHex[md[i] & 0xf]);
  }
  return hex;
}

nlohmann::json ArtifactRecord::to_json() const {
  nlohmann::json j = {{"kind", kind},
                      {"kernel_id", kernel_id},
                      {"execution_count", execution_count},
                      {"size", size},
                      {"created", created}};
  if (kind != "file" || !sha256.empty()) {
    j["sha256"] = sha256;
  }
  if (kind != "file" || !mime_type.empty()) {
    j["mime_type"] = mime_type;
  }
  if (kind == "file") {
    j["path"] = path;
  }
  return j;
}

ArtifactStore::ArtifactStore(std::string dir, Caps caps) : dir_(std::move(dir)), caps_(caps) {}

bool ArtifactStore::is_artifact_mime(std::string_view mime) {
  for (std::string_view m : kArtifactMimes) {
    if (m == mime) {
      return true;
    }
  }
  return false;
}

Result<ArtifactRecord> ArtifactStore::put(const std::string& kernel_id,
                                          const nlohmann::json& execution_count,
                                          const std::string& mime, const nlohmann::json& value) {
  if (!is_artifact_mime(mime)) {
    return make_error(ErrorCode::kInvalidArgument, "unsupported_mime",
                      "'" + mime + "' is not stored as an artifact");
  }
  CELLGATE_TRY(check_kernel_id(kernel_id));
  // Decoding and hashing take the time; they need no lock.
  CELLGATE_ASSIGN_OR_RETURN(std::string bytes, decode_content(mime, value));
  if (bytes.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_artifact", mime + " value is empty");
  }
  if (bytes.size() > caps_.max_artifact_bytes) {
    return make_error(ErrorCode::kResourceExhausted, "artifact_cap",
                      "this " + mime + " is " + describe_bytes(bytes.size()) +
                          ", over the cap of " + describe_bytes(caps_.max_artifact_bytes) +
                          " for one artifact; not stored");
  }
  std::string sha = sha256_hex(bytes);
  if (sha.empty()) {
    return make_error(ErrorCode::kInternal, "artifact_io", "OpenSSL could not compute SHA-256");
  }

  MutexLock lock(mu_);
  KernelIndex& index = kernels_[kernel_id];
  if (index.records.size() >= caps_.count) {
    return make_error(ErrorCode::kResourceExhausted, "artifact_cap",
                      "kernel " + kernel_id + " has reached the cap of " +
                          std::to_string(caps_.count) + " artifacts; this " + mime +
                          " was not stored");
  }
  const bool new_for_kernel = !index.mimes.contains(sha);
  if (new_for_kernel && index.bytes + bytes.size() > caps_.bytes) {
    return make_error(ErrorCode::kResourceExhausted, "artifact_cap",
                      "storing this " + mime + " (" + describe_bytes(bytes.size()) +
                          ") would take kernel " + kernel_id + "'s artifacts over the cap of " +
                          describe_bytes(caps_.bytes) + "; not stored");
  }
  CELLGATE_TRY(write_content(sha, bytes));

  ArtifactRecord record;
  record.kind = "display";
  record.sha256 = sha;
  record.mime_type = mime;
  record.size = bytes.size();
  record.kernel_id = kernel_id;
  record.execution_count = normalize_count(execution_count);
  record.created = protocol::iso8601_now();
  if (new_for_kernel) {
    index.mimes.emplace(sha, mime);
    index.bytes += bytes.size();
  }
  index.records.push_back(record);
  append_index(record);
  return record;
}

Result<ArtifactRecord> ArtifactStore::record_file(const std::string& kernel_id,
                                                  const nlohmann::json& execution_count,
                                                  std::string path, std::uint64_t size,
                                                  std::string sha256, std::string mime_type) {
  CELLGATE_TRY(check_kernel_id(kernel_id));
  MutexLock lock(mu_);
  KernelIndex& index = kernels_[kernel_id];
  if (index.records.size() >= caps_.count) {
    return make_error(ErrorCode::kResourceExhausted, "artifact_cap",
                      "kernel " + kernel_id + " has reached the cap of " +
                          std::to_string(caps_.count) + " artifacts; file " + path +
                          " was not recorded");
  }
  ArtifactRecord record;
  record.kind = "file";
  record.sha256 = std::move(sha256);
  record.mime_type = std::move(mime_type);
  record.size = size;
  record.path = std::move(path);
  record.kernel_id = kernel_id;
  record.execution_count = normalize_count(execution_count);
  record.created = protocol::iso8601_now();
  index.records.push_back(record);
  append_index(record);
  return record;
}

std::vector<ArtifactRecord> ArtifactStore::list(const std::string& kernel_id) const {
  MutexLock lock(mu_);
  auto it = kernels_.find(kernel_id);
  return it == kernels_.end() ? std::vector<ArtifactRecord>{} : it->second.records;
}

Result<std::pair<std::string, std::string>> ArtifactStore::locate(const std::string& sha) const {
  if (!valid_sha(sha)) {
    return make_error(ErrorCode::kInvalidArgument, "bad_sha",
                      "an artifact id is 64 lowercase hex digits (SHA-256)");
  }
  std::string path = dir_ + "/" + sha.substr(0, 2) + "/" + sha;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) {
      return make_error(ErrorCode::kNotFound, "no_artifact", "no artifact " + sha);
    }
    return errno_error(ErrorCode::kInternal, "artifact_io", "open('" + path + "')", errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return make_error(ErrorCode::kNotFound, "no_artifact", "no artifact " + sha);
  }
  {
    MutexLock lock(mu_);
    for (const auto& [id, index] : kernels_) {
      if (auto it = index.mimes.find(sha); it != index.mimes.end()) {
        return std::pair{std::move(path), it->second};
      }
    }
  }
  std::array<char, 512> head{};
  ssize_t n = 0;
  do {
    n = ::pread(fd.get(), head.data(), head.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return errno_error(ErrorCode::kInternal, "artifact_io", "read('" + path + "')", errno);
  }
  return std::pair{std::move(path),
                   sniff_mime(std::string_view(head.data(), static_cast<std::size_t>(n)))};
}

void ArtifactStore::forget(const std::string& kernel_id) {
  MutexLock lock(mu_);
  kernels_.erase(kernel_id);
}

// Called with mu_ held.
Result<void> ArtifactStore::write_content(const std::string& sha, std::string_view bytes) {
  const std::string shard = dir_ + "/" + sha.substr(0, 2);
  const std::string path = shard + "/" + sha;
  struct stat st {};
  // Same name, same size: the same content (dedupe). A size mismatch is a file cut short by a
  // crash before the data reached the disk; write it again.
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<std::uint64_t>(st.st_size) == bytes.size()) {
    return {};
  }
  CELLGATE_TRY(make_private_dirs(shard, "artifact_io"));
  // Content-addressed and checked by size above: no fsync needed for a torn write to heal.
  return atomic_write(path, bytes, 0600, Durability::kNone, "artifact_io");
}

// The journal is for people; a failure to append is logged, not returned,
// since the content is stored and listed in memory.
void ArtifactStore::append_index(const ArtifactRecord& record) {
  const std::string index_dir = dir_ + "/index";
  const std::string path = index_dir + "/" + record.kernel_id + ".jsonl";
  Result<void> done = make_private_dirs(index_dir, "artifact_io");
  if (done.ok()) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) {
      done = errno_error(ErrorCode::kInternal, "artifact_io", "open('" + path + "')", errno);
    } else {
      done = write_all(fd.get(), protocol::dump_json(record.to_json()) + "\n", path);
    }
  }
  if (!done.ok() && !index_warned_) {
    spdlog::warn(
        "artifact index not written (further failures are not logged until one "
        "succeeds): {}",
        done.error().describe());
  }
  index_warned_ = !done.ok();
}

}  // namespace cellgate::store
