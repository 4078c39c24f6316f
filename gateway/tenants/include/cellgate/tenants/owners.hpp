// KernelOwners: which tenant each kernel belongs to, recorded when a tenant's request starts it
// (a Jupyter or agent start, a session, an E2B sandbox). A kernel with no owner is the
// operator's: a tenant never reaches it.
//
//   owners.set(model.id, "alice");
//   if (owners.owner(id) != "alice") { … 404 … }
//
// In memory only: after a gateway restart, adopted kernels are the operator's again (an E2B
// sandbox's owner is in its own record, sandboxes/registry.hpp, and set again from it).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "cellgate/mutex.hpp"

namespace cellgate::tenants {

class KernelOwners {
 public:
  // Past this many entries, set() drops those `alive` says are gone (ended kernels).
  explicit KernelOwners(std::size_t prune_above = 4096) : prune_above_(prune_above) {}
  void set(const std::string& kernel_id, const std::string& tenant,
           const std::function<bool(const std::string&)>& alive = nullptr);
  std::optional<std::string> owner(const std::string& kernel_id) const;
  bool owned_by(const std::string& kernel_id, const std::string& tenant) const;
  // The kernels of `tenant` that `alive` says still run.
  std::size_t count(const std::string& tenant,
                    const std::function<bool(const std::string&)>& alive) const;
  void erase(const std::string& kernel_id);
  // Every kernel with an owner: kernel id → tenant.
  std::map<std::string, std::string> all() const;

 private:
  const std::size_t prune_above_;
  mutable Mutex mu_;
  std::map<std::string, std::string> owners_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::tenants
