#include "cellgate/tenants/owners.hpp"

#include <algorithm>
#include <vector>

namespace cellgate::tenants {

void KernelOwners::set(const std::string& kernel_id, const std::string& tenant,
                       const std::function<bool(const std::string&)>& alive) {
  MutexLock lock(mu_);
  if (alive && owners_.size() >= prune_above_) {
    std::erase_if(owners_, [&](const auto& entry) { return !alive(entry.first); });
  }
  owners_[kernel_id] = tenant;
}

std::map<std::string, std::string> KernelOwners::all() const {
  MutexLock lock(mu_);
  return owners_;
}

std::optional<std::string> KernelOwners::owner(const std::string& kernel_id) const {
  MutexLock lock(mu_);
  if (auto it = owners_.find(kernel_id); it != owners_.end()) {
    return it->second;
  }
  return std::nullopt;
}

bool KernelOwners::owned_by(const std::string& kernel_id, const std::string& tenant) const {
  auto who = owner(kernel_id);
  return who && *who == tenant;
}

std::size_t KernelOwners::count(const std::string& tenant,
                                const std::function<bool(const std::string&)>& alive) const {
  std::vector<std::string> ids;
  {
    MutexLock lock(mu_);
    for (const auto& [id, owner] : owners_) {
      if (owner == tenant) {
        ids.push_back(id);
      }
    }
  }
  return static_cast<std::size_t>(std::count_if(ids.begin(), ids.end(), alive));
}

void KernelOwners::erase(const std::string& kernel_id) {
  MutexLock lock(mu_);
  owners_.erase(kernel_id);
}

}  // namespace cellgate::tenants
