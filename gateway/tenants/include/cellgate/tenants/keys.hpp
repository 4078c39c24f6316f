// API keys and their tenants. A key has E2B's form, `e2b_` and 40 lowercase hex digits (E2B's SDK
// refuses any other before sending, docs/e2b.md), and belongs to one tenant: the E2B control
// plane, the agent API, MCP and the Jupyter routes show a request carrying it that tenant's
// sandboxes and kernels only. Keys are stored hashed (SHA-256) in <state_dir>/api-keys.json,
// mode 0600, rewritten atomically under an flock, so the file never holds a usable key.
//
//   auto key = tenants::create_key(tenants::keys_path(dir), "alice");   // `cellgate keys create`
//   tenants::KeyStore store(tenants::keys_path(dir));                   // the gateway's
//   if (auto tenant = store.tenant_of(given)) { … *tenant … }
//
// A running gateway sees a new or revoked key without a restart: KeyStore re-reads the file when
// its inode, size or mtime changed, checking at most once per `recheck` (a second by default),
// and at once for a key it does not know (a stat(); so a key just made works on its first request).
//
// Thread-safety: KeyStore's methods may be called from any thread. The file functions take the
// file's lock, so two `cellgate keys` at once never lose each other's change.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"

namespace cellgate::tenants {

inline constexpr std::string_view kKeyPrefix = "e2b_";
inline constexpr std::size_t kKeyHexDigits = 40;  // E2B's own keys' length
inline constexpr std::size_t kMaxKeysFileBytes = 4u << 20;

// One stored key: never the key itself.
struct KeyRecord {
  std::string id;       // the first 12 hex digits of its hash: what `keys list` and `revoke` name
  std::string tenant;   // [A-Za-z0-9._-]{1,64}
  std::string sha256;   // of the whole key, "e2b_" included, lowercase hex
  std::string created;  // ISO 8601 UTC
};

std::string keys_path(const std::string& state_dir);  // <state_dir>/api-keys.json
// Whether `name` can be a tenant: 1 to 64 of [A-Za-z0-9._-], not starting with '.' or '-'.
bool valid_tenant(std::string_view name);
// Whether `key` has E2B's form: e2b_ and 40 lowercase hex digits.
bool well_formed_key(std::string_view key);
std::string key_hash(std::string_view key);  // SHA-256, lowercase hex

// The file's text ↔ records. parse_keys refuses anything but {"keys": [records…]}: a damaged file
// must stop a gateway from guessing who is who (kInvalidArgument "bad_keys_file").
Result<std::vector<KeyRecord>> parse_keys(std::string_view text);
std::string serialize_keys(const std::vector<KeyRecord>& keys);

// The stored keys (none when the file does not exist).
Result<std::vector<KeyRecord>> read_keys(const std::string& path);
// Makes a key for `tenant`, stores its hash and answers the key (shown once, never stored).
Result<std::string> create_key(const std::string& path, const std::string& tenant);
// Removes the keys `what` names: a key id, a whole key, or "tenant:<name>" (all of its keys).
// kNotFound when none matched; answers how many went.
Result<std::size_t> revoke_keys(const std::string& path, const std::string& what);

class KeyStore {
 public:
  explicit KeyStore(std::string path,
                    std::chrono::milliseconds recheck = std::chrono::milliseconds(1000));
  // The tenant a key belongs to; nullopt for anything else (malformed, unknown, revoked, or the
  // file unreadable: fail closed, logged once per change).
  std::optional<std::string> tenant_of(std::string_view key);
  // Whether any key is stored (as of the last read).
  bool empty();

 private:
  // Re-reads the file if it changed, when `recheck` has passed since the last look.
  void refresh_locked(std::chrono::milliseconds recheck) CELLGATE_REQUIRES(mu_);

  const std::string path_;
  const std::chrono::milliseconds recheck_;
  Mutex mu_;
  std::chrono::steady_clock::time_point checked_ CELLGATE_GUARDED_BY(mu_){};
  bool checked_once_ CELLGATE_GUARDED_BY(mu_) = false;
  // What the file was when last read: inode, size, mtime (ns).
  ino_t ino_ CELLGATE_GUARDED_BY(mu_) = 0;
  off_t size_ CELLGATE_GUARDED_BY(mu_) = -1;
  std::int64_t mtime_ns_ CELLGATE_GUARDED_BY(mu_) = -1;
  std::map<std::string, std::string> by_hash_ CELLGATE_GUARDED_BY(mu_);  // sha256 → tenant
};

}  // namespace cellgate::tenants
