#pragma once
//! LazyStackedTensorDict: a stack of TensorDicts kept as separate members (by reference), so members may
//! differ in leaf shapes (ragged) or keys. This first version covers what persistence and td.map_lazy
//! need: members (and member access), stack_dim, batch size (-1 for ragged dims), common keys,
//! densification and the memmap format (members in `0/`, `1/`, ...). Indexing along other dims, get/set
//! and the rest of upstream §3 are future work. In-memory parts: src/lazy_stack.cpp; persistence:
//! src/memmap.cpp.
#include <string>
#include <vector>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class LazyStackedTensorDict {
 public:
  //! members must have the same number of batch dims (BatchSizeError otherwise)
  explicit LazyStackedTensorDict(std::vector<TensorDict> tensordicts, int64_t stack_dim = 0);

  const std::vector<TensorDict>& tensordicts() const { return tds_; }
  int64_t stack_dim() const { return stack_dim_; }
  //! number of members (the size of the stack dim)
  size_t size() const { return tds_.size(); }
  //! member i (negative counts from the end), the member itself, not a copy (upstream: an int at
  //! stack_dim); IndexError out of range
  const TensorDict& member(int64_t i) const;
  //! member(i)
  const TensorDict& operator[](size_t i) const { return member(static_cast<int64_t>(i)); }
  //! members' batch with their count inserted at stack_dim; dims where members differ are -1
  BatchSize batch_size() const;
  //! sorted intersection of the members' top-level keys (upstream)
  std::vector<NestedKey> keys() const;
  //! dense stack of the members; on ragged members or differing keys, the error of stack() (same type)
  //! naming the first member that does not stack with member 0
  TensorDict contiguous() const;

  //! writes `prefix`/meta.json ({"_type", "stack_dim"}) and every member in `prefix`/<i>/; members become
  //! memory-mapped and locked
  LazyStackedTensorDict& memmap_(const std::string& prefix, const MemmapOptions& options = {});
  static LazyStackedTensorDict load_memmap(const std::string& prefix, const LoadOptions& options = {});
  bool is_memmap() const;

 private:
  std::vector<TensorDict> tds_;
  int64_t stack_dim_;
};

//! true when the directory holds a LazyStackedTensorDict (by its meta.json _type); false when meta.json is
//! missing, unreadable, a symlink or not a regular file (load_memmap then reports why)
bool is_lazy_stack_dir(const std::string& prefix);

}  // namespace tensordict
