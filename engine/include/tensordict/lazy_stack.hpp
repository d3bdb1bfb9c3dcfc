#pragma once
//! LazyStackedTensorDict (upstream §3): a TensorDict whose node keeps a stack of member TensorDicts by
//! reference, so members may differ in leaf shapes (ragged: -1 in the batch size) or keys (exclusive keys).
//! It is a TensorDict everywhere (nested in another, indexed, applied, locked, printed); the class adds the
//! member access of upstream's LazyStackedTensorDict. In-memory parts: src/lazy_stack.cpp; persistence:
//! src/memmap.cpp.
//! - keys(): the sorted intersection of the members' keys; exclusive keys are reached through members.
//! - get(key): a new tensor, torch::stack of the members' leaves (a copy: writes to it are lost);
//!   RuntimeError "Failed to stack tensors within a tensordict" when the leaves differ in shape.
//!   A sub-TensorDict key gives a nested lazy stack of the members' sub-TensorDicts.
//! - set(key, v): v unbound along the stack dim into the members; set_ needs the key in every member.
//! - index: an int at the stack dim is the member itself; other indices are split per member (slices, index
//!   lists and masks over the stack dim give a lazy stack of indexed members; masks over the stack dim and
//!   the following dims concatenate); the rest densifies first (the members must then stack).
//! - apply / clone / to: member by member, a lazy stack again (apply with a batch_size: a dense TensorDict over
//!   the stacked leaves, as upstream); contiguous(): a dense TensorDict.
//! - shape ops (unsqueeze, squeeze, permute, transpose, split, chunk; view / reshape / flatten / unflatten
//!   keeping the stack dim): member by member, a lazy stack again with the stack dim moved; the members'
//!   results are views of the members. Merging or splitting the stack dim itself densifies.
#include <string>
#include <vector>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class LazyStackedTensorDict : public TensorDict {
 public:
  //! members must be defined, have the same number of batch dims (BatchSizeError) and the same device
  //! (ValueError); the stack dim may be negative (counted over members' dims + 1)
  explicit LazyStackedTensorDict(std::vector<TensorDict> tensordicts, int64_t stack_dim = 0);
  //! the lazy stack behind a TensorDict handle (TypeError when its node is not a lazy stack)
  explicit LazyStackedTensorDict(const TensorDict& td);
  //! true when td's node is a lazy stack
  static bool is_lazy_stack(const TensorDict& td);

  const std::vector<TensorDict>& tensordicts() const;
  int64_t stack_dim() const;
  //! number of members (the size of the stack dim)
  size_t size() const;
  //! member i (negative counts from the end), the member itself, not a copy (upstream: an int at
  //! stack_dim); IndexError out of range
  const TensorDict& member(int64_t i) const;
  const TensorDict& operator[](size_t i) const { return member(static_cast<int64_t>(i)); }
  using TensorDict::operator[];
  //! upstream get(key, as_list=True): every member's value at key (leaves of any shape), in member order;
  //! KeyError when a member lacks it, TypeError when it is not a tensor
  std::vector<at::Tensor> get_list(const NestedKey& key) const;
  //! upstream get(key, as_padded_tensor=True, padding_side=, padding_value=): the members' leaves padded to
  //! the largest size in every dim ("right": after the values, "left": before them; ValueError otherwise)
  //! and stacked along the stack dim
  at::Tensor get_padded(const NestedKey& key, double padding_value = 0.0,
                        const std::string& padding_side = "right") const;
  //! upstream append / insert: td's batch size must equal the members' (ValueError "Batch sizes in
  //! tensordicts differs"); LockedError when locked
  void append(const TensorDict& td);
  void insert(int64_t index, const TensorDict& td);

  //! writes `prefix`/meta.json ({"_type", "stack_dim"}) and every member in `prefix`/<i>/ as one staged save (a
  //! failure leaves the old save as it was); members become memory-mapped and the stack locked. TensorDict's
  //! memmap / memmap_like / save write the same layout; an empty prefix maps the members onto anonymous memory
  LazyStackedTensorDict& memmap_(const std::string& prefix, const MemmapOptions& options = {});
  static LazyStackedTensorDict load_memmap(const std::string& prefix, const LoadOptions& options = {});
};

//! upstream lazy_stack / LazyStackedTensorDict.lazy_stack: members kept by reference along `dim`
LazyStackedTensorDict lazy_stack(const std::vector<TensorDict>& tds, int64_t dim = 0);
//! upstream maybe_dense_stack: a dense stack when the members stack (same keys and leaf shapes), else a
//! lazy stack
TensorDict maybe_dense_stack(const std::vector<TensorDict>& tds, int64_t dim = 0);

//! true when the directory holds a LazyStackedTensorDict (by its meta.json _type); false when meta.json is
//! missing, unreadable, a symlink or not a regular file (load_memmap then reports why)
bool is_lazy_stack_dir(const std::string& prefix);

}  // namespace tensordict
