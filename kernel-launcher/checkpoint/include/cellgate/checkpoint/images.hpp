// Where checkpoint images live, and the only way to name one: a store of image dirs under one
// root-owned directory, each referenced by an id the store made.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto store, checkpoint::ImageStore::open(state_dir + "/images",
//                                                                      budget_bytes));
//   CELLGATE_ASSIGN_OR_RETURN(std::string id, store.reserve());   // no_space past the budget
//   dump_jail({criu, pid, store.dir_of(id), …});                 // creates that dir
//   …
//   CELLGATE_ASSIGN_OR_RETURN(std::string dir, store.find(id));  // not_found for any other text
//   restore_jail({criu, dir, …});
//   store.remove(id);
//
// An image holds a kernel's whole memory and restoring one runs its processes as whatever it
// says (jail/README.md, "Checkpoints"): the store's directory is 0700 and its owner's, ids are
// 32 lowercase hex digits from getrandom(2), and find()/remove() accept nothing else, so no
// caller can make the store read or delete a path of its choosing.
//
// Thread-safety: the store holds no state but its root path; concurrent calls on different ids
// are safe, two on the same id are the caller's to order. The budget is checked at reserve():
// dumps running at once may together pass it by their own sizes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::checkpoint {

// The bytes of the regular files under `dir` (links not followed).
std::uint64_t bytes_under(const std::string& dir);

class ImageStore {
 public:
  // Creates `root` (0700) when missing; refuses one that is a symlink, not ours, or open to
  // group or others. `budget_bytes` 0: no budget.
  static Result<ImageStore> open(std::string root, std::uint64_t budget_bytes = 0);

  // A fresh id whose dir (dir_of) does not exist yet. kResourceExhausted "no_space" when the
  // images already take the budget. `prefix` (lowercase hex, up to 16 digits) replaces its
  // first digits: a gateway's node stamp (protocol/node_ids.hpp), so a router finds the node.
  Result<std::string> reserve(std::string_view prefix = {}) const;
  // The dir of an id reserve() gave (the dump creates it).
  std::string dir_of(const std::string& id) const { return root_ + "/" + id; }
  // The dir of an existing image; kNotFound ("no_image") for an unknown or malformed id.
  Result<std::string> find(const std::string& id) const;
  // Deletes the image (never following a symlink in it); kNotFound as find().
  Result<void> remove(const std::string& id) const;
  // The ids present, and the bytes they take.
  std::vector<std::string> list() const;
  std::uint64_t used_bytes() const;

  const std::string& root() const { return root_; }

  // 32 lowercase hex digits.
  static bool valid_id(const std::string& id);

 private:
  ImageStore(std::string root, std::uint64_t budget) : root_(std::move(root)), budget_(budget) {}
  std::string root_;
  std::uint64_t budget_ = 0;
};

}  // namespace cellgate::checkpoint
