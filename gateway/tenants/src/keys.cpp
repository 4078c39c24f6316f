#include "cellgate/tenants/keys.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cellgate/kernel/connection.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/unique_fd.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::tenants {
namespace {

using nlohmann::json;

constexpr std::size_t kIdDigits = 12;
constexpr std::size_t kMaxKeys = 10000;

bool lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Error bad_file(const std::string& why) {
  return make_error(ErrorCode::kInvalidArgument, "bad_keys_file", "the API keys file " + why);
}

// The file's lock (<path>.lock, flock'd exclusively) for one read-modify-write.
Result<UniqueFd> lock_keys(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty()) {
    CELLGATE_TRY(make_private_dirs(dir, "keys"));
  }
  const std::string lock = path + ".lock";
  UniqueFd fd(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "keys", "open('" + lock + "')", errno);
  }
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) {
      return errno_error(ErrorCode::kInternal, "keys", "flock('" + lock + "')", errno);
    }
  }
  return fd;
}

}  // namespace

std::string keys_path(const std::string& state_dir) {
  return state_dir + "/api-keys.json";
}

bool valid_tenant(std::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.' || name[0] == '-') {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

bool well_formed_key(std::string_view key) {
  return key.size() == kKeyPrefix.size() + kKeyHexDigits && key.starts_with(kKeyPrefix) &&
         lower_hex(key.substr(kKeyPrefix.size()));
}

std::string key_hash(std::string_view key) {
  return store::sha256_hex(key);
}

Result<std::vector<KeyRecord>> parse_keys(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    return bad_file(std::string("is not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    return bad_file("has no \"keys\" array");
  }
  std::vector<KeyRecord> keys;
  for (const auto& k : doc["keys"]) {
    if (!k.is_object()) {
      return bad_file("has a key that is not an object");
    }
    KeyRecord r;
    auto text_of = [&k](const char* name) {
      auto it = k.find(name);
      return it != k.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    r.id = text_of("id");
    r.tenant = text_of("tenant");
    r.sha256 = text_of("sha256");
    r.created = text_of("created");
    if (!valid_tenant(r.tenant) || r.sha256.size() != 64 || !lower_hex(r.sha256) ||
        r.id != r.sha256.substr(0, kIdDigits)) {
      return bad_file("has a damaged key record (id " + r.id.substr(0, 16) + ")");
    }
    keys.push_back(std::move(r));
    if (keys.size() > kMaxKeys) {
      return bad_file("has more than " + std::to_string(kMaxKeys) + " keys");
    }
  }
  return keys;
}

std::string serialize_keys(const std::vector<KeyRecord>& keys) {
  json list = json::array();
  for (const auto& k : keys) {
    list.push_back(
        {{"id", k.id}, {"tenant", k.tenant}, {"sha256", k.sha256}, {"created", k.created}});
  }
  return json{{"keys", list}}.dump(2) + "\n";
}

Result<std::vector<KeyRecord>> read_keys(const std::string& path) {
  CELLGATE_ASSIGN_OR_RETURN(auto text, sys::read_optional(path, kMaxKeysFileBytes, "keys"));
  if (!text) {
    return std::vector<KeyRecord>{};
  }
  if (text->size() >= kMaxKeysFileBytes) {
    return bad_file("is larger than " + std::to_string(kMaxKeysFileBytes) + " bytes");
  }
  return parse_keys(*text);
}

Result<std::string> create_key(const std::string& path, const std::string& tenant) {
  if (!valid_tenant(tenant)) {
    return make_error(ErrorCode::kInvalidArgument, "bad_tenant",
                      "a tenant is 1 to 64 of A-Z a-z 0-9 . _ - (not starting with . or -), "
                      "not '" +
                          tenant.substr(0, 80) + "'");
  }
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd lock, lock_keys(path));
  CELLGATE_ASSIGN_OR_RETURN(auto keys, read_keys(path));
  const std::string key = std::string(kKeyPrefix) + kernel::random_hex(kKeyHexDigits / 2);
  KeyRecord r;
  r.sha256 = key_hash(key);
  r.id = r.sha256.substr(0, kIdDigits);
  r.tenant = tenant;
  r.created = protocol::iso8601_now();
  keys.push_back(std::move(r));
  CELLGATE_TRY(sys::atomic_write(path, serialize_keys(keys), 0600));
  return key;
}

Result<std::size_t> revoke_keys(const std::string& path, const std::string& what) {
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd lock, lock_keys(path));
  CELLGATE_ASSIGN_OR_RETURN(auto keys, read_keys(path));
  const std::string hash = well_formed_key(what) ? key_hash(what) : "";
  const bool whole_tenant = what.starts_with("tenant:");
  const std::string tenant = whole_tenant ? what.substr(7) : "";
  const std::size_t before = keys.size();
  std::erase_if(keys, [&](const KeyRecord& k) {
    return whole_tenant ? k.tenant == tenant
                        : (k.id == what || (!hash.empty() && k.sha256 == hash));
  });
  const std::size_t gone = before - keys.size();
  if (gone == 0) {
    return make_error(ErrorCode::kNotFound, "no_key",
                      "no key matches '" + what.substr(0, 80) + "'");
  }
  CELLGATE_TRY(sys::atomic_write(path, serialize_keys(keys), 0600));
  return gone;
}

KeyStore::KeyStore(std::string path, std::chrono::milliseconds recheck)
    : path_(std::move(path)), recheck_(recheck) {}

void KeyStore::refresh_locked(std::chrono::milliseconds recheck) {
  const auto now = std::chrono::steady_clock::now();
  if (checked_once_ && now - checked_ < recheck) {
    return;
  }
  checked_once_ = true;
  checked_ = now;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      if (size_ != -1 || !by_hash_.empty()) {
        spdlog::info("API keys: {} is gone; no tenant key is accepted", path_);
      }
      by_hash_.clear();
      ino_ = 0;
      size_ = -1;
      mtime_ns_ = -1;
      return;
    }
    spdlog::warn("API keys: stat('{}'): {}; no tenant key is accepted", path_,
                 std::strerror(errno));
    by_hash_.clear();
    size_ = -2;  // read again once it can be
    return;
  }
  const std::int64_t mtime_ns =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (st.st_ino == ino_ && st.st_size == size_ && mtime_ns == mtime_ns_) {
    return;
  }
  ino_ = st.st_ino;
  size_ = st.st_size;
  mtime_ns_ = mtime_ns;
  by_hash_.clear();
  auto keys = read_keys(path_);
  if (!keys) {
    spdlog::error("API keys: {}; no tenant key is accepted until it is fixed",
                  keys.error().message);
    return;
  }
  for (const auto& k : *keys) {
    by_hash_[k.sha256] = k.tenant;
  }
  spdlog::info("API keys: {} key(s) read from {}", by_hash_.size(), path_);
}

std::optional<std::string> KeyStore::tenant_of(std::string_view key) {
  if (!well_formed_key(key)) {
    return std::nullopt;
  }
  const std::string hash = key_hash(key);
  MutexLock lock(mu_);
  refresh_locked(recheck_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) {
    // A key it does not know: the file is stat()ed again at once (and read only if it changed),
    // so a key just made works on its first request. A flood of bad keys costs a stat() each.
    // (Rate-limiting this by time refused a new key used within the limit of a bad one.)
    refresh_locked(std::chrono::milliseconds(0));
    it = by_hash_.find(hash);
  }
  if (it != by_hash_.end()) {
    return it->second;
  }
  return std::nullopt;
}

bool KeyStore::empty() {
  MutexLock lock(mu_);
  refresh_locked(recheck_);
  return by_hash_.empty();
}

}  // namespace cellgate::tenants
