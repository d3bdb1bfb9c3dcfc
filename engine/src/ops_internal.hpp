#pragma once
//! Internal to engine/: what the leaf-wise operations share (ops.cpp defines the functions): checks and
//! helpers of the apply family, fills, arithmetic, comparisons and reductions, and transform(), the
//! tree visitor's rebuild of a TensorDict leaf by leaf.
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/MemoryOverlap.h>

#include "tensor_dict_internal.hpp"
#include "torch_errors.hpp"
#include "tree_visitor.hpp"

namespace tensordict::detail::ops {

// the engine's helpers the operations use (a `using namespace detail::ops` brings them along)
namespace tree = detail::tree;
using detail::current_torch_message;
using detail::dtype_str;
using detail::shape_str;

// ---------------------------------------------------------------------------------------------- helpers
inline BatchSize sizes_of(const at::Tensor& t) { return BatchSize(t.sizes().begin(), t.sizes().end()); }

//! inserts `value` into a level being built by the tree visitor after the usual checks (batch prefix,
//! device); the error names the key
void put_checked(TensorDictImpl& level, const tree::KeyPath& at, const Entry& value, const char* op);

//! a non-tensor entry of a level whose batch size goes from `old_nd` dims to `new_bs`; nullopt when it
//! cannot follow (a NonTensorStack holding different values)
std::optional<Entry> rebatch_non_tensor(const Entry& e, size_t old_nd, const BatchSize& new_bs);

//! every tensor leaf with its path (the tree visitor's leaf walk; the key is built only when asked)
template <class F>
void for_each_leaf(const TensorDictImpl& impl, F&& f) {
  tree::for_each_tensor(impl, f);
}

//! the full key of a path (keys of writes collected before they are committed are NestedKeys already)
inline NestedKey key_of(const tree::KeyPath& p) { return p.full(); }
inline const NestedKey& key_of(const NestedKey& k) { return k; }

//! in-place writes need distinct memory per element (an expanded leaf is read-only in torch)
template <class Key>
void check_writable(const at::Tensor& t, const Key& key, const char* op) {
  if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
    throw RuntimeError(std::string(op) + ": cannot write in place into key " + key_of(key).repr() + " of shape " +
                       shape_str(t.sizes()) +
                       ": more than one element of the tensor refers to a single memory location (an expanded "
                       "leaf); clone() the TensorDict first");
  }
}

//! the result dtype of an in-place op must be castable to the leaf's dtype (torch's rule)
template <class Key>
void check_castable(at::ScalarType result, const at::Tensor& t, const Key& key, const char* op) {
  if (!at::can_cast(result, t.scalar_type())) {
    throw RuntimeError(std::string(op) + ": result type " + dtype_str(result) +
                       " can't be cast to the desired output type " + dtype_str(t.scalar_type()) + " of key " +
                       key_of(key).repr());
  }
}

//! a mask / condition over the batch dims (upstream's expand_as_right rules: aligned on the left, each
//! dim equal to the batch dim or 1, trailing batch dims may be omitted)
void check_batch_mask(const TensorDict& td, const at::Tensor& m, const char* op, const char* what);

//! the mask viewed with trailing singleton dims so that it broadcasts over `leaf`, on its device
at::Tensor right_view(const at::Tensor& m, const at::Tensor& leaf);

//! numpy/torch broadcasting of two shapes (aligned on the right); nullopt when incompatible
std::optional<BatchSize> broadcast_shapes(const BatchSize& a, const BatchSize& b);

//! broadcast_shapes, or a BatchSizeError naming `op` and `what` (b is the shape of `what`)
BatchSize broadcast_batch(const BatchSize& a, const BatchSize& b, const char* op, const char* what);

//! td expanded to batch size `bs` (stride-0 views; bs is a broadcast of td's batch size)
TensorDict expand_to(const TensorDict& td, const BatchSize& bs);

// ---------------------------------------------------------------------------------------------- transform
using BatchMap = std::function<BatchSize(const BatchSize&)>;
enum class NonTensorPolicy { Carry, CarryOrDrop, Drop };

//! the tree visitor's rebuild for transform: tensor leaves through fn(path, leaf, matched leaves of the
//! other trees), each level's batch through batch_map, non-tensors by policy, results put with the checks
template <class Fn>
struct TransformVisitor : tree::RebuildVisitor {
  const BatchMap& batch_map;
  Fn& fn;
  NonTensorPolicy policy;
  const char* op;
  TransformVisitor(const BatchMap& bm, Fn& f, NonTensorPolicy p, const char* o) : batch_map(bm), fn(f), policy(p), op(o) {}

  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return batch_map(own); }
  at::Tensor tensor(const tree::KeyPath& at, const at::Tensor& t, const tree::Matched& others) {
    try {
      return fn(at, t, others);
    } catch (...) {
      throw RuntimeError(std::string(op) + ": key " + at.full().repr() + ": " + current_torch_message());
    }
  }
  std::optional<Entry> non_tensor(const tree::KeyPath& at, const Entry& e, const TensorDictImpl& src,
                                  const BatchSize& nb, const tree::Matched&) {
    if (policy == NonTensorPolicy::Drop) return std::nullopt;
    auto c = rebatch_non_tensor(e, src.batch_size.size(), nb);
    if (!c && policy == NonTensorPolicy::Carry) {
      throw BatchSizeError(std::string(op) + ": the NonTensorStack at key " + at.full().repr() + " of batch size " +
                           shape_str(e.shape()) + " holds different values and cannot follow the new batch size " +
                           shape_str(nb));
    }
    return c;
  }
  void put(TensorDictImpl& out, const tree::KeyPath& at, Entry&& value) { put_checked(out, at, value, op); }
};

//! a new TensorDict with td's structure: tensor leaves replaced by fn(path, leaf, matched) (an undefined
//! result drops the key), every level's batch size mapped by batch_map, non-tensor leaves handled by
//! `policy`; `others` (dense trees) are walked in parallel, their entries at each key given to fn
template <class Fn>
TensorDict transform(const TensorDict& td_in, const BatchMap& batch_map, Fn&& fn, NonTensorPolicy policy,
                     const char* op, const std::vector<TensorDict>& others = {}) {
  const TensorDict td = detail::dense_tree(td_in);  // other node kinds below: on their dense form
  const TensorDictImpl& s = *detail::impl_of(td);
  std::vector<const TensorDictImpl*> levels;
  for (const auto& o : others) levels.push_back(detail::impl_of(o).get());
  TransformVisitor<std::remove_reference_t<Fn>> v(batch_map, fn, policy, op);
  return tree::rebuild(s, batch_map(s.batch_size), v, levels);
}

inline BatchSize same_batch(const BatchSize& bs) { return bs; }

inline TensorDict maybe_lock(TensorDict out, const TensorDict& like) {
  if (like.is_locked()) out.lock_();
  return out;
}

}  // namespace tensordict::detail::ops
