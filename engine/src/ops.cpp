// TensorDict leaf-wise operations: the apply family, zero_ / masked_fill / where, arithmetic with
// TensorDicts, tensors and scalars, comparisons, all/any, sum/mean and equal().
//
// Non-tensor leaves (NonTensorData / NonTensorStack) never go through a tensor function:
//  * apply / arithmetic / where / masked_fill carry them over unchanged (re-batched when the batch
//    size changes, as upstream's NonTensorData._apply_nest does);
//  * comparisons with a scalar, and ordering comparisons between TensorDicts, leave them out of the
//    result (upstream returns an empty NonTensorData there, which is neutral for all()/any());
//    eq / ne between two TensorDicts compare their values and give a bool tensor of their batch shape;
//  * batch reductions (all(dim), any(dim), sum, mean) keep a non-tensor leaf that holds one value for
//    the whole batch (NonTensorData, or a NonTensorStack whose elements are all equal) with the
//    reduced batch size, and drop a NonTensorStack holding different values (it has no single value);
//  * all() / any() without dim ignore them.
#include <algorithm>
#include <set>
#include <sstream>

#include <ATen/MemoryOverlap.h>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "torch_errors.hpp"
#include "tree_visitor.hpp"

namespace tensordict {
namespace {

namespace tree = detail::tree;

using detail::current_torch_message;
using detail::dtype_str;
using detail::shape_str;

// ---------------------------------------------------------------------------------------------- helpers
BatchSize sizes_of(const at::Tensor& t) { return BatchSize(t.sizes().begin(), t.sizes().end()); }

BatchSize concat(BatchSize a, at::IntArrayRef b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string keys_str(const std::vector<NestedKey>& keys) {
  std::string s = "[";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i].repr();
  return s + "]";
}

//! inserts `value` into a level being built by the tree visitor after the usual checks (batch prefix,
//! device); the error names the key
void put_checked(TensorDictImpl& level, const tree::KeyPath& at, const Entry& value, const char* op) {
  try {
    level.entries.emplace_back(at.name(), detail::prepare_value(level, at.name(), value));
  } catch (const BatchSizeError& e) {
    throw BatchSizeError(std::string(op) + ": the result for key " + at.full().repr() + " does not fit the batch size: " +
                         e.message());
  } catch (...) {  // e.g. moving the result to the TensorDict's device failed
    throw RuntimeError(std::string(op) + ": cannot store the result for key " + at.full().repr() + ": " +
                       current_torch_message());
  }
}

//! a non-tensor entry of a level whose batch size goes from `old_nd` dims to `new_bs`; nullopt when it
//! cannot follow (a NonTensorStack holding different values)
std::optional<Entry> rebatch_non_tensor(const Entry& e, size_t old_nd, const BatchSize& new_bs) {
  BatchSize own = e.shape();
  BatchSize target = new_bs;
  if (own.size() > old_nd) target.insert(target.end(), own.begin() + static_cast<long>(old_nd), own.end());
  if (target == own) return e;
  if (e.is_non_tensor_data()) return Entry(NonTensorData(e.non_tensor_data().value(), target));
  const NonTensorStack& s = e.non_tensor_stack();
  if (s.all_equal()) return Entry(NonTensorData(s.at(0), target));
  return std::nullopt;
}

//! every tensor leaf with its path (the tree visitor's leaf walk; the key is built only when asked)
template <class F>
void for_each_leaf(const TensorDictImpl& impl, F&& f) {
  tree::for_each_tensor(impl, f);
}

//! the full key of a path (keys of writes collected before they are committed are NestedKeys already)
NestedKey key_of(const tree::KeyPath& p) { return p.full(); }
const NestedKey& key_of(const NestedKey& k) { return k; }

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
void check_batch_mask(const TensorDict& td, const at::Tensor& m, const char* op, const char* what) {
  if (!m.defined()) throw ValueError(std::string(op) + ": the " + what + " is an undefined tensor");
  if (m.scalar_type() != at::kBool) {
    throw TypeError(std::string(op) + ": expected a boolean " + what + " (torch.bool), got a tensor with dtype " +
                    dtype_str(m.scalar_type()));
  }
  const BatchSize& bs = td.batch_size();
  if (m.dim() > static_cast<int64_t>(bs.size())) {
    throw BatchSizeError(std::string(op) + ": the " + what + " of shape " + shape_str(m.sizes()) +
                         " has more dims than the batch size " + shape_str(bs) +
                         " (expand_as_right requires the destination tensor to have less dimensions than the "
                         "input tensor, got tensor.ndimension()=" +
                         std::to_string(m.dim()) + " and dest.ndimension()=" + std::to_string(bs.size()) + ")");
  }
  for (int64_t i = 0; i < m.dim(); ++i) {
    if (m.size(i) != bs[static_cast<size_t>(i)] && m.size(i) != 1) {
      throw BatchSizeError(std::string(op) + ": the " + what + " of shape " + shape_str(m.sizes()) +
                           " does not fit the batch size " + shape_str(bs) + " (dim " + std::to_string(i) +
                           " is " + std::to_string(m.size(i)) + ", expected " +
                           std::to_string(bs[static_cast<size_t>(i)]) +
                           " or 1; tensor shape is incompatible with dest shape)");
    }
  }
}

//! the mask viewed with trailing singleton dims so that it broadcasts over `leaf`, on its device
at::Tensor right_view(const at::Tensor& m, const at::Tensor& leaf) {
  std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
  shape.resize(static_cast<size_t>(std::max<int64_t>(leaf.dim(), m.dim())), 1);
  at::Tensor v = m.reshape(shape);
  if (v.device() != leaf.device()) v = v.to(leaf.device());
  return v;
}

//! numpy/torch broadcasting of two shapes (aligned on the right); nullopt when incompatible
std::optional<BatchSize> broadcast_shapes(const BatchSize& a, const BatchSize& b) {
  size_t n = std::max(a.size(), b.size());
  BatchSize out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

//! td expanded to batch size `bs` (stride-0 views; bs is a broadcast of td's batch size)
TensorDict expand_to(const TensorDict& td, const BatchSize& bs) {
  if (td.batch_size() == bs) return td;
  const size_t nd = td.batch_size().size();
  return detail::map_batch(
      td, bs, [&](const at::Tensor& t) { return t.expand(concat(bs, t.sizes().slice(nd))); }, false);
}

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
  const TensorDictImpl& s = *td.impl();
  std::vector<const TensorDictImpl*> levels;
  for (const auto& o : others) levels.push_back(o.impl().get());
  TransformVisitor<std::remove_reference_t<Fn>> v(batch_map, fn, policy, op);
  return tree::rebuild(s, batch_map(s.batch_size), v, levels);
}

BatchSize same_batch(const BatchSize& bs) { return bs; }

TensorDict maybe_lock(TensorDict out, const TensorDict& like) {
  if (like.is_locked()) out.lock_();
  return out;
}

// ---------------------------------------------------------------------------------------------- apply
struct ApplyCall {
  const LeafFn* unary = nullptr;
  const MultiLeafFn* multi = nullptr;
  const NamedLeafFn* named = nullptr;
  const NamedMultiLeafFn* named_multi = nullptr;
  ApplyOptions opts;
  bool inplace = false;
  const char* op = "apply";
  //! in-place: (full key, destination leaf, value) collected first, written once all are valid
  std::vector<std::tuple<NestedKey, at::Tensor, at::Tensor>> writes;
};

[[noreturn]] void missing_in_other(const NestedKey& full, size_t i, const TensorDictImpl& where, const char* op) {
  std::string existing;
  for (size_t j = 0; j < where.entries.size(); ++j) existing += (j ? ", " : "") + where.entries[j].first;
  throw KeyError(std::string(op) + ": key " + full.repr() + " not found in TensorDict with keys [" + existing +
                 "] (others[" + std::to_string(i) +
                 "]); every key of self must be in the others unless ApplyOptions().default_value(...) is given");
}

//! the tree visitor's (parallel) rebuild for the apply family: fn on every tensor leaf with the matching
//! leaves of the others; in place, the writes are collected (and no result level is filled)
struct ApplyVisitor : tree::RebuildVisitor {
  ApplyCall& c;
  //! the others' levels of the levels being walked (innermost last): the KeyError lists their keys
  std::vector<std::vector<const TensorDictImpl*>> levels;
  explicit ApplyVisitor(ApplyCall& call) : c(call) {}

  void enter(const tree::KeyPath&, const TensorDictImpl&, const std::vector<const TensorDictImpl*>& others) {
    levels.push_back(others);
  }
  void leave(const tree::KeyPath&) { levels.pop_back(); }
  TensorDict make_level(const tree::KeyPath&, const TensorDictImpl& src, BatchSize nb) {
    const ApplyOptions& o = c.opts;
    TensorDict result;
    if (!c.inplace) result = detail::make_empty(src, std::move(nb));
    if (!c.inplace && o.batch_size()) {
      for (auto d : *o.batch_size())
        if (d < 0) throw BatchSizeError(std::string(c.op) + ": batch size " + shape_str(*o.batch_size()) + " has a negative dimension");
    }
    return result;
  }
  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) {
    return c.opts.batch_size() ? *c.opts.batch_size() : own;
  }
  //! every other has the key, unless a default value is given
  void check_others(const tree::KeyPath& at, const tree::Matched& m) {
    for (size_t i = 0; i < m.size(); ++i)
      if (!m[i] && !c.opts.default_value()) missing_in_other(at.full(), i, *levels.back()[i], c.op);
  }
  const TensorDictImpl* descend(const tree::KeyPath& at, const TensorDict& child, const tree::Matched& m) {
    check_others(at, m);
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] && !m[i]->is_tensordict()) {
        throw TypeError(std::string(c.op) + ": key " + at.full().repr() + " is a TensorDict in self but a " +
                        Entry::kind_name(m[i]->kind()) + " in others[" + std::to_string(i) + "]");
      }
    }
    if (!child.is_dense() && c.unary && m.empty()) return nullptr;  // another node kind applies itself
    return child.impl().get();
  }
  std::vector<const TensorDictImpl*> descend_others(const tree::KeyPath&, const TensorDictImpl& child,
                                                    const tree::Matched& m) {
    std::vector<const TensorDictImpl*> out(m.size(), nullptr);
    if (child.entries.empty()) return out;  // nothing to match: the others' levels are not read
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i]) out[i] = m[i]->tensordict().impl().get();
    return out;
  }
  std::optional<TensorDict> other_node(const tree::KeyPath&, const TensorDict& sub, const BatchSize&,
                                       const tree::Matched&) {
    TensorDict child = sub;
    if (c.inplace) {
      child.apply_(*c.unary);
      return child;
    }
    return child.apply(*c.unary, ApplyOptions().keep_empty(c.opts.keep_empty()));
  }
  std::optional<TensorDict> sub_result(const tree::KeyPath&, const TensorDict&, TensorDict out, bool any) {
    if (c.inplace || (!c.opts.keep_empty() && !any)) return std::nullopt;
    return out;
  }
  at::Tensor tensor(const tree::KeyPath& at, const at::Tensor& leaf, const tree::Matched& m) {
    check_others(at, m);
    const ApplyOptions& o = c.opts;
    at::Tensor out;
    try {
      if (c.named) {
        out = (*c.named)(o.nested_keys() ? at.full() : NestedKey(at.name()), leaf);
      } else if (c.multi || c.named_multi) {
        std::vector<at::Tensor> args;
        args.reserve(m.size() + 1);
        args.push_back(leaf);
        for (size_t i = 0; i < m.size(); ++i) {
          if (!m[i]) {
            args.push_back(*o.default_value());
          } else if (m[i]->is_tensor()) {
            args.push_back(m[i]->tensor());
          } else {
            throw TypeError(std::string(c.op) + ": key " + at.full().repr() + " is a Tensor in self but a " +
                            Entry::kind_name(m[i]->kind()) + " in others[" + std::to_string(i) + "]");
          }
        }
        out = c.multi ? (*c.multi)(args) : (*c.named_multi)(o.nested_keys() ? at.full() : NestedKey(at.name()), args);
      } else {
        out = (*c.unary)(leaf);
      }
    } catch (...) {
      throw RuntimeError(std::string(c.op) + ": fn failed on key " + at.full().repr() + ": " + current_torch_message());
    }
    // upstream: returning None drops the key (apply_: leaves it alone)
    if (out.defined() && c.inplace) c.writes.emplace_back(at.full(), leaf, out);
    return out;
  }
  std::optional<Entry> non_tensor(const tree::KeyPath& at, const Entry& e, const TensorDictImpl& src,
                                  const BatchSize& nb, const tree::Matched& m) {
    check_others(at, m);
    if (c.inplace) return std::nullopt;
    auto carried = rebatch_non_tensor(e, src.batch_size.size(), nb);
    if (!carried) {
      throw BatchSizeError(std::string(c.op) + ": the NonTensorStack at key " + at.full().repr() + " of batch size " +
                           shape_str(e.shape()) + " holds different values and cannot take the batch size " +
                           shape_str(nb));
    }
    return carried;
  }
  void put(TensorDictImpl& out, const tree::KeyPath& at, Entry&& value) {
    if (!c.inplace) put_checked(out, at, value, c.op);
  }
};

TensorDict run_apply(const TensorDict& self, const std::vector<TensorDict>& others, ApplyCall& c) {
  for (size_t i = 0; i < others.size(); ++i)
    if (!others[i].defined()) throw ValueError(std::string(c.op) + ": others[" + std::to_string(i) + "] is undefined");
  if (c.opts.default_value() && !c.opts.default_value()->defined()) {
    throw ValueError(std::string(c.op) + ": the default value is an undefined tensor");
  }
  const TensorDictImpl& s = *self.impl();
  std::vector<const TensorDictImpl*> levels(others.size(), nullptr);
  if (!s.entries.empty()) {  // nothing to match: the others' levels are not read
    for (size_t i = 0; i < others.size(); ++i) levels[i] = others[i].impl().get();
  }
  ApplyVisitor v(c);
  BatchSize nb = c.opts.batch_size() ? *c.opts.batch_size() : s.batch_size;
  TensorDict r = tree::rebuild(s, std::move(nb), v, levels);
  if (c.inplace) return self;
  if (c.opts.propagate_lock() && self.is_locked()) r.lock_();
  return r;
}

void commit_writes(ApplyCall& c) {
  for (const auto& w : c.writes) {
    const NestedKey& key = std::get<0>(w);
    const at::Tensor& dest = std::get<1>(w);
    const at::Tensor& value = std::get<2>(w);
    if (dest.is_same(value)) continue;
    check_writable(dest, key, c.op);
    std::optional<BatchSize> b = broadcast_shapes(sizes_of(dest), sizes_of(value));
    if (!b || *b != sizes_of(dest)) {
      throw BatchSizeError(std::string(c.op) + ": the result for key " + key.repr() + " has shape " +
                           shape_str(value.sizes()) + ", which cannot be copied into the leaf of shape " +
                           shape_str(dest.sizes()));
    }
  }
  for (const auto& w : c.writes) {
    const at::Tensor& dest = std::get<1>(w);
    const at::Tensor& value = std::get<2>(w);
    if (dest.is_same(value)) continue;
    backends::reserve_for_store(dest);  // a memmap leaf: a full disk is a BackendError, not a SIGBUS
    try {
      at::Tensor(dest).copy_(value);
    } catch (...) {
      throw RuntimeError(std::string(c.op) + ": copy into key " + std::get<0>(w).repr() + " failed: " +
                         current_torch_message());
    }
  }
}

// ---------------------------------------------------------------------------------------------- arithmetic
//! RSub / RDiv: the reflected forms (other - td, other / td)
enum class Bin { Add, Sub, Mul, Div, RSub, RDiv };

const char* bin_name(Bin op) {
  switch (op) {
    case Bin::Add: return "add";
    case Bin::Sub: return "sub";
    case Bin::Mul: return "mul";
    case Bin::Div: return "div";
    case Bin::RSub: return "rsub";
    case Bin::RDiv: return "rdiv";
  }
  return "?";
}

//! the left operand of a reflected op: a tensor as it is, a scalar as a wrapped number (Python's `2 - t`
//! promotes like `t - 2`)
at::Tensor left_operand(const at::Tensor& b, const at::Tensor&) { return b; }
at::Tensor left_operand(const at::Scalar& b, const at::Tensor& like) {
  at::Tensor t = at::scalar_to_tensor(b, like.device());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

//! other / leaf: torch's Tensor.__rtruediv__ is reciprocal() * other for a number
at::Tensor rdiv_leaf(const at::Tensor& a, const at::Tensor& b) { return at::div(b, a); }
at::Tensor rdiv_leaf(const at::Tensor& a, const at::Scalar& b) { return at::mul(at::reciprocal(a), b); }

template <typename Other>
at::Tensor bin(Bin op, const at::Tensor& a, const Other& b) {
  switch (op) {
    case Bin::Add: return at::add(a, b);
    case Bin::Sub: return at::sub(a, b);
    case Bin::Mul: return at::mul(a, b);
    case Bin::Div: return at::div(a, b);
    case Bin::RSub: return at::sub(left_operand(b, a), a);
    case Bin::RDiv: return rdiv_leaf(a, b);
  }
  return at::Tensor();
}

//! tensor leaf keys (nested) of td
std::set<NestedKey> leaf_keys(const TensorDict& td) {
  std::set<NestedKey> out;
  for_each_leaf(*td.impl(), [&](const tree::KeyPath& k, const at::Tensor&) { out.insert(k.full()); });
  return out;
}

//! TD-TD pointwise ops need the same tensor leaves on both sides
void check_same_leaves(const TensorDict& a, const TensorDict& b, const char* op) {
  if (!b.defined()) throw ValueError(std::string(op) + ": the other TensorDict is undefined");
  std::set<NestedKey> ka = leaf_keys(a), kb = leaf_keys(b);
  if (ka == kb) return;
  std::vector<NestedKey> only_a, only_b;
  std::set_difference(ka.begin(), ka.end(), kb.begin(), kb.end(), std::back_inserter(only_a));
  std::set_difference(kb.begin(), kb.end(), ka.begin(), ka.end(), std::back_inserter(only_b));
  throw KeyError(std::string(op) + ": the two TensorDicts must have the same keys; keys only in self: " +
                 keys_str(only_a) + ", keys only in other: " + keys_str(only_b));
}

BatchSize broadcast_batch(const BatchSize& a, const BatchSize& b, const char* op, const char* what) {
  auto r = broadcast_shapes(a, b);
  if (!r) {
    throw BatchSizeError(std::string(op) + ": cannot broadcast " + what + " of shape " + shape_str(b) +
                         " with the batch size " + shape_str(a) +
                         " (shapes are aligned on the right, as torch.broadcast_shapes)");
  }
  return *r;
}

TensorDict binary_td(const TensorDict& self, const TensorDict& other, Bin op) {
  if (!detail::is_dense_tree(self) || !detail::is_dense_tree(other)) return binary_td(detail::dense_tree(self), detail::dense_tree(other), op);
  const char* name = bin_name(op);
  check_same_leaves(self, other, name);
  BatchSize bs = broadcast_batch(self.batch_size(), other.batch_size(), name, "the other TensorDict's batch size");
  TensorDict a = expand_to(self, bs);
  TensorDict b = expand_to(other, bs);
  TensorDict out = transform(
      a, same_batch,
      [&](const tree::KeyPath& k, const at::Tensor& x, const tree::Matched& y) {
        // b has the same tensor leaves (checked above): its leaf comes from the parallel walk
        return bin(op, x, y[0] && y[0]->is_tensor() ? y[0]->tensor() : b.get(k.full()));
      },
      NonTensorPolicy::Carry, name, {b});
  return maybe_lock(out, self);
}

TensorDict binary_tensor(const TensorDict& self, const at::Tensor& other, Bin op) {
  if (!detail::is_dense_tree(self)) return binary_tensor(detail::dense_tree(self), other, op);
  const char* name = bin_name(op);
  if (!other.defined()) throw ValueError(std::string(name) + ": the other tensor is undefined");
  if (other.dim() == 0) {
    TensorDict out = transform(
        self, same_batch, [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return bin(op, x, other); },
        NonTensorPolicy::Carry, name);
    return maybe_lock(out, self);
  }
  // broadcast left to the batch dims (numpy rules against the batch size), then right to each leaf
  BatchSize bs = broadcast_batch(self.batch_size(), sizes_of(other), name, "a tensor");
  TensorDict a = expand_to(self, bs);
  const size_t nd = bs.size();
  TensorDict out = transform(
      a, same_batch,
      [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) {
        BatchSize shape = sizes_of(other);
        shape.resize(shape.size() + static_cast<size_t>(x.dim()) - nd, 1);
        at::Tensor o = other.reshape(shape);
        if (o.device() != x.device()) o = o.to(x.device());
        return bin(op, x, o);
      },
      NonTensorPolicy::Carry, name);
  return maybe_lock(out, self);
}

TensorDict binary_scalar(const TensorDict& self, const at::Scalar& other, Bin op) {
  if (!detail::is_dense_tree(self)) return binary_scalar(detail::dense_tree(self), other, op);
  TensorDict out = transform(
      self, same_batch, [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return bin(op, x, other); },
      NonTensorPolicy::Carry, bin_name(op));
  return maybe_lock(out, self);
}

// ---------------------------------------------------------------------------------------------- comparisons
enum class Cmp { Eq, Ne, Lt, Le, Gt, Ge };

const char* cmp_name(Cmp op) {
  switch (op) {
    case Cmp::Eq: return "eq";
    case Cmp::Ne: return "ne";
    case Cmp::Lt: return "lt";
    case Cmp::Le: return "le";
    case Cmp::Gt: return "gt";
    case Cmp::Ge: return "ge";
  }
  return "?";
}

template <typename Other>
at::Tensor cmp(Cmp op, const at::Tensor& a, const Other& b) {
  switch (op) {
    case Cmp::Eq: return at::eq(a, b);
    case Cmp::Ne: return at::ne(a, b);
    case Cmp::Lt: return at::lt(a, b);
    case Cmp::Le: return at::le(a, b);
    case Cmp::Gt: return at::gt(a, b);
    case Cmp::Ge: return at::ge(a, b);
  }
  return at::Tensor();
}

//! the per-element values of a non-tensor leaf, flat in C order over `bs`
std::vector<JsonValue> non_tensor_values(const Entry& e, const BatchSize& bs) {
  if (e.is_non_tensor_data()) return std::vector<JsonValue>(static_cast<size_t>(detail::prod(bs)), e.non_tensor_data().value());
  return e.non_tensor_stack().values();
}

//! eq / ne of two non-tensor leaves: a bool tensor of their batch shape
at::Tensor compare_non_tensor(Cmp op, const Entry& a, const Entry& b, const NestedKey& key,
                              const std::optional<at::Device>& device) {
  BatchSize bs = a.shape();
  if (b.shape() != bs) {
    throw BatchSizeError(std::string(cmp_name(op)) + ": the non-tensor leaves at key " + key.repr() +
                         " have different batch sizes: " + shape_str(bs) + " and " + shape_str(b.shape()));
  }
  auto opts = at::TensorOptions().dtype(at::kBool).device(device ? *device : at::Device(at::kCPU));
  if (a.is_non_tensor_data() && b.is_non_tensor_data()) {
    bool eq = a.non_tensor_data().value() == b.non_tensor_data().value();
    return at::full(bs, op == Cmp::Eq ? eq : !eq, opts);
  }
  std::vector<JsonValue> va = non_tensor_values(a, bs), vb = non_tensor_values(b, bs);
  at::Tensor out = at::empty(bs, at::TensorOptions().dtype(at::kBool));
  bool* p = out.data_ptr<bool>();
  for (size_t i = 0; i < va.size(); ++i) p[i] = (va[i] == vb[i]) == (op == Cmp::Eq);
  return device ? out.to(*device) : out;
}

std::string key_set_str(const TensorDictImpl& impl) {
  std::vector<std::string> ks;
  for (const auto& kv : impl.entries) ks.push_back("'" + kv.first + "'");
  std::sort(ks.begin(), ks.end());
  std::string s = "{";
  for (size_t i = 0; i < ks.size(); ++i) s += (i ? ", " : "") + ks[i];
  return ks.empty() ? "set()" : s + "}";
}

//! the tree visitor's parallel rebuild for TD-vs-TD comparisons: the key sets must match at every level
struct CompareVisitor : tree::RebuildVisitor {
  Cmp op;
  explicit CompareVisitor(Cmp o) : op(o) {}

  void enter(const tree::KeyPath& at, const TensorDictImpl& a, const std::vector<const TensorDictImpl*>& others) {
    const TensorDictImpl& b = *others[0];
    bool same = a.entries.size() == b.entries.size();
    for (const auto& kv : a.entries)
      if (!b.find(kv.first)) same = false;
    if (!same) {
      throw KeyError(std::string(cmp_name(op)) + ": keys in tensordicts mismatch" +
                     (at.is_root() ? std::string() : " at " + at.full().repr()) + ", got " + key_set_str(a) + " and " +
                     key_set_str(b));
    }
  }
  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return own; }
  void check_kinds(const tree::KeyPath& at, Entry::Kind x, const Entry& y) {
    if (x != y.kind()) {
      throw TypeError(std::string(cmp_name(op)) + ": cannot compare a " + Entry::kind_name(x) + " with a " +
                      Entry::kind_name(y.kind()) + " at key " + at.full().repr());
    }
  }
  std::optional<Entry> non_tensor(const tree::KeyPath& at, const Entry& x, const TensorDictImpl& src, const BatchSize&,
                                  const tree::Matched& m) {
    const Entry& y = *m[0];
    if (y.is_non_tensor()) {
      if (op == Cmp::Eq || op == Cmp::Ne) return Entry(compare_non_tensor(op, x, y, at.full(), src.device));
      return std::nullopt;  // ordering of non-tensor values: left out, as upstream's empty result
    }
    check_kinds(at, x.kind(), y);
    return std::nullopt;
  }
  const TensorDictImpl* descend(const tree::KeyPath& at, const TensorDict& sub, const tree::Matched& m) {
    check_kinds(at, Entry::Kind::TensorDict, *m[0]);
    return sub.impl().get();
  }
  at::Tensor tensor(const tree::KeyPath& at, const at::Tensor& x, const tree::Matched& m) {
    check_kinds(at, Entry::Kind::Tensor, *m[0]);
    try {
      return cmp(op, x, m[0]->tensor());
    } catch (...) {
      throw RuntimeError(std::string(cmp_name(op)) + ": key " + at.full().repr() + ": " + current_torch_message());
    }
  }
  void put(TensorDictImpl& out, const tree::KeyPath& at, Entry&& value) { put_checked(out, at, value, cmp_name(op)); }
};

TensorDict compare_td(const TensorDict& self, const TensorDict& other, Cmp op) {
  CompareVisitor v(op);
  const TensorDictImpl& a = *self.impl();
  return tree::rebuild(a, a.batch_size, v, {other.impl().get()});
}

TensorDict compare_td_top(const TensorDict& self, const TensorDict& other, Cmp op) {
  if (!detail::is_dense_tree(self) || !detail::is_dense_tree(other)) return compare_td_top(detail::dense_tree(self), detail::dense_tree(other), op);
  if (!other.defined()) throw ValueError(std::string(cmp_name(op)) + ": the other TensorDict is undefined");
  return compare_td(self, other, op);
}

//! td < t: t broadcast on the left to the batch dims, then on the right to each leaf (as arithmetic)
TensorDict compare_tensor(const TensorDict& self, const at::Tensor& other, Cmp op) {
  if (!detail::is_dense_tree(self)) return compare_tensor(detail::dense_tree(self), other, op);
  const char* name = cmp_name(op);
  if (!other.defined()) throw ValueError(std::string(name) + ": the other tensor is undefined");
  BatchSize bs = other.dim() == 0 ? self.batch_size() : broadcast_batch(self.batch_size(), sizes_of(other), name, "a tensor");
  TensorDict a = expand_to(self, bs);
  const size_t nd = bs.size();
  return transform(
      a, same_batch,
      [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) {
        if (other.dim() == 0) return cmp(op, x, other);
        BatchSize shape = sizes_of(other);
        shape.resize(shape.size() + static_cast<size_t>(x.dim()) - nd, 1);
        at::Tensor o = other.reshape(shape);
        if (o.device() != x.device()) o = o.to(x.device());
        return cmp(op, x, o);
      },
      NonTensorPolicy::Drop, name);
}

TensorDict compare_scalar(const TensorDict& self, const at::Scalar& other, Cmp op) {
  if (!detail::is_dense_tree(self)) return compare_scalar(detail::dense_tree(self), other, op);
  return transform(
      self, same_batch, [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return cmp(op, x, other); },
      NonTensorPolicy::Drop, cmp_name(op));
}

// ---------------------------------------------------------------------------------------------- reductions
//! the batch dims a reduction acts on, sorted and unique; an out-of-range dim is an error of `code`
//! (upstream: RuntimeError in all / any, torch's IndexError in sum / mean)
std::vector<int64_t> reduce_dims(const TensorDict& td, const std::vector<int64_t>& dims_in, const char* op,
                                 ErrorCode code = ErrorCode::Index) {
  const int64_t nd = td.batch_dims();
  std::vector<int64_t> dims;
  for (int64_t dim : dims_in) {
    if (dim >= nd || dim < -nd) {
      throw_error(code, std::string(op) + ": dim must be greater than or equal to -tensordict.batch_dims and "
                        "smaller than tensordict.batch_dims, got dim=" + std::to_string(dim) + " for batch_size " +
                        shape_str(td.batch_size()));
    }
    const int64_t d = dim < 0 ? dim + nd : dim;
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      throw RuntimeError(std::string(op) + ": dim " + std::to_string(d) + " appears multiple times in the list of dims");
    }
    dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

BatchMap reduce_batch(const std::vector<int64_t>& dims, bool keepdim) {
  return [dims, keepdim](const BatchSize& bs) {
    BatchSize out = bs;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      if (keepdim) {
        out[static_cast<size_t>(*it)] = 1;
      } else {
        out.erase(out.begin() + *it);
      }
    }
    return out;
  };
}



TensorDict all_any_dim(const TensorDict& self, int64_t dim, bool is_all) {
  if (!detail::is_dense_tree(self)) return all_any_dim(detail::dense_tree(self), dim, is_all);
  const char* op = is_all ? "all" : "any";
  std::vector<int64_t> dims = reduce_dims(self, {dim}, op, ErrorCode::Runtime);
  const int64_t d = dims[0];
  return transform(
      self, reduce_batch(dims, false),
      [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return is_all ? x.all(d) : x.any(d); },
      NonTensorPolicy::CarryOrDrop, op);
}

bool all_any(const TensorDict& self, bool is_all) {
  if (!detail::is_dense_tree(self)) return all_any(detail::dense_tree(self), is_all);
  bool result = is_all;
  for_each_leaf(*self.impl(), [&](const tree::KeyPath& k, const at::Tensor& t) {
    if (result != is_all) return;
    bool v = is_all;
    try {
      v = is_all ? t.all().item().toBool() : t.any().item().toBool();
    } catch (...) {
      throw RuntimeError(std::string(is_all ? "all" : "any") + ": key " + k.full().repr() + ": " + current_torch_message());
    }
    if (v != is_all) result = v;
  });
  return result;
}

//! the tree visitor's two-tree walk for equal: stops at the first difference; a sub-TensorDict of another node
//! kind on either side compares with TensorDict::equal
struct EqualVisitor : tree::WalkVisitor {
  tree::Step visit(const tree::KeyPath&, const Entry& x, const tree::Matched& m) {
    const Entry* y = m[0];
    if (!y) return tree::Step::Stop;
    if (x.is_non_tensor() && y->is_non_tensor()) {
      if (x.shape() != y->shape()) return tree::Step::Stop;
      return non_tensor_values(x, x.shape()) == non_tensor_values(*y, y->shape()) ? tree::Step::Next : tree::Step::Stop;
    }
    if (x.kind() != y->kind()) return tree::Step::Stop;
    if (x.is_tensordict()) {
      const TensorDict tx = x.tensordict(), ty = y->tensordict();
      if (!tx.is_dense() || !ty.is_dense()) return tx.equal(ty) ? tree::Step::Next : tree::Step::Stop;
      return same_shape(*tx.impl(), *ty.impl()) ? tree::Step::Enter : tree::Step::Stop;
    }
    const at::Tensor& t = x.tensor();
    const at::Tensor& u = y->tensor();
    if (t.scalar_type() != u.scalar_type() || t.device() != u.device() || !t.sizes().equals(u.sizes())) {
      return tree::Step::Stop;
    }
    return at::equal(t, u) ? tree::Step::Next : tree::Step::Stop;
  }
  static bool same_shape(const TensorDictImpl& a, const TensorDictImpl& b) {
    return a.batch_size == b.batch_size && a.entries.size() == b.entries.size();
  }
  //! both sides are dense nodes here (checked in visit)
  const TensorDictImpl* level(const TensorDict& sub) { return tree::level_of(sub, tree::Descend::DenseOnly); }
};

bool equal_impl(const TensorDictImpl& a, const TensorDictImpl& b) {
  if (!EqualVisitor::same_shape(a, b)) return false;
  EqualVisitor v;
  return tree::walk(a, {&b}, v);
}

}  // namespace

// ================================================================================================ apply family
TensorDict TensorDict::apply(const LeafFn& fn, const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).apply(fn, options));
  if (!fn) throw ValueError("apply: fn is empty");
  if (detail::is_remote(*this)) return contiguous().apply(fn, options);  // a remote node: on its dense form
  if (auto* lz = detail::lazy_node(*this)) {  // member by member: a lazy stack again (upstream test_stack_apply)
    if (options.batch_size()) throw NotImplementedError("apply with batch_size on a LazyStackedTensorDict");
    std::vector<TensorDict> out;
    for (const auto& m : lz->members) out.push_back(m.apply(fn, options));
    return detail::make_lazy(std::move(out), lz->stack_dim);
  }
  ApplyCall c;
  c.unary = &fn;
  c.opts = options;
  return run_apply(*this, {}, c);
}

TensorDict TensorDict::apply(const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                             const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).apply(fn, others, options));
  if (!fn) throw ValueError("apply: fn is empty");
  if (detail::is_remote(*this)) return contiguous().apply(fn, others, options);  // a remote node: on its dense form
  ApplyCall c;
  c.multi = &fn;
  c.opts = options;
  return run_apply(*this, others, c);
}

TensorDict& TensorDict::apply_(const LeafFn& fn) {
  if (!fn) throw ValueError("apply_: fn is empty");
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.apply_(fn);
    detail::write_back(*this, dense);
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {
    for (auto& m : lz->members) m.apply_(fn);
    return *this;
  }
  ApplyCall c;
  c.unary = &fn;
  c.inplace = true;
  c.op = "apply_";
  run_apply(*this, {}, c);
  commit_writes(c);
  return *this;
}

TensorDict& TensorDict::apply_(const MultiLeafFn& fn, const std::vector<TensorDict>& others) {
  if (!fn) throw ValueError("apply_: fn is empty");
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.apply_(fn, others);
    detail::write_back(*this, dense);
    return *this;
  }
  ApplyCall c;
  c.multi = &fn;
  c.inplace = true;
  c.op = "apply_";
  run_apply(*this, others, c);
  commit_writes(c);
  return *this;
}

TensorDict TensorDict::named_apply(const NamedLeafFn& fn, const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).named_apply(fn, options));
  if (!is_dense()) return contiguous().named_apply(fn, options);  // another node kind: on its dense form
  if (!fn) throw ValueError("named_apply: fn is empty");
  ApplyCall c;
  c.named = &fn;
  c.opts = options;
  c.op = "named_apply";
  return run_apply(*this, {}, c);
}

TensorDict TensorDict::named_apply(const NamedMultiLeafFn& fn, const std::vector<TensorDict>& others,
                                   const ApplyOptions& options) const {
  if (!is_dense()) return contiguous().named_apply(fn, others, options);  // another node kind: on its dense form
  if (!fn) throw ValueError("named_apply: fn is empty");
  std::vector<TensorDict> os;
  for (const auto& o : others) os.push_back(o.defined() && !o.is_dense() ? o.contiguous() : o);
  ApplyCall c;
  c.named_multi = &fn;
  c.opts = options;
  c.op = "named_apply";
  return run_apply(*this, os, c);
}

// ================================================================================================ fills
TensorDict& TensorDict::zero_() {
  if (!detail::is_dense_tree(*this) && !detail::lazy_node(*this)) {  // a node of another kind below: its own apply_
    return apply_([](const at::Tensor& t) { return at::zeros_like(t); });
  }
  if (auto* lz = detail::lazy_node(*this)) {
    for (auto& m : lz->members) m.zero_();
    return *this;
  }
  for_each_leaf(*d(), [](const tree::KeyPath& k, const at::Tensor& t) { check_writable(t, k, "zero_"); });
  for_each_leaf(*d(), [](const tree::KeyPath& k, const at::Tensor& t) {
    try {
      at::Tensor(t).zero_();
    } catch (...) {
      throw RuntimeError("zero_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
  return *this;
}

TensorDict TensorDict::masked_fill(const at::Tensor& mask, const at::Scalar& value) const {
  if (!is_dense()) return contiguous().masked_fill(mask, value);  // another node kind: on its dense form
  check_batch_mask(*this, mask, "masked_fill", "mask");
  TensorDict out = clone();
  out.masked_fill_(mask, value);
  return out;
}

TensorDict& TensorDict::masked_fill_(const at::Tensor& mask, const at::Scalar& value) {
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.masked_fill_(mask, value);
    detail::write_back(*this, dense);
    return *this;
  }
  if (detail::lazy_node(*this)) return index_put_({mask.to(at::kBool)}, value);
  check_batch_mask(*this, mask, "masked_fill_", "mask");
  for_each_leaf(*d(), [](const tree::KeyPath& k, const at::Tensor& t) { check_writable(t, k, "masked_fill_"); });
  for_each_leaf(*d(), [&](const tree::KeyPath& k, const at::Tensor& t) {
    try {
      at::Tensor(t).masked_fill_(right_view(mask, t), value);
    } catch (...) {
      throw RuntimeError("masked_fill_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
  return *this;
}

namespace {
//! the tree visitor's parallel rebuild for where(cond, self, other): other's keys must all be in self
struct WhereVisitor : tree::RebuildVisitor {
  const at::Tensor& cond;
  explicit WhereVisitor(const at::Tensor& c) : cond(c) {}

  void enter(const tree::KeyPath& at, const TensorDictImpl& s, const std::vector<const TensorDictImpl*>& others) {
    for (const auto& kv : others[0]->entries) {
      if (!s.find(kv.first)) {
        throw KeyError("where: Key " + (at.full() + NestedKey(kv.first)).repr() +
                       " of other not found in self and no pad value provided.");
      }
    }
  }
  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return own; }
  const Entry& other_of(const tree::KeyPath& at, Entry::Kind x, const tree::Matched& m) {
    if (!m[0]) throw KeyError("where: Key " + at.full().repr() + " not found in other and no pad value provided.");
    if (x != Entry::Kind::NonTensorData && x != Entry::Kind::NonTensorStack && x != m[0]->kind()) {
      throw TypeError("where: key " + at.full().repr() + " is a " + Entry::kind_name(x) + " in self but a " +
                      Entry::kind_name(m[0]->kind()) + " in other");
    }
    return *m[0];
  }
  std::optional<Entry> non_tensor(const tree::KeyPath& at, const Entry& x, const TensorDictImpl&, const BatchSize&,
                                  const tree::Matched& m) {
    other_of(at, x.kind(), m);
    return x;
  }
  const TensorDictImpl* descend(const tree::KeyPath& at, const TensorDict& sub, const tree::Matched& m) {
    other_of(at, Entry::Kind::TensorDict, m);
    return sub.impl().get();
  }
  std::vector<const TensorDictImpl*> descend_others(const tree::KeyPath&, const TensorDictImpl&, const tree::Matched& m) {
    return {m[0]->tensordict().impl().get()};
  }
  at::Tensor tensor(const tree::KeyPath& at, const at::Tensor& x, const tree::Matched& m) {
    const Entry& y = other_of(at, Entry::Kind::Tensor, m);
    try {
      return at::where(right_view(cond, x), x, y.tensor());
    } catch (...) {
      throw RuntimeError("where: key " + at.full().repr() + ": " + current_torch_message());
    }
  }
  void put(TensorDictImpl& out, const tree::KeyPath& at, Entry&& value) { put_checked(out, at, value, "where"); }
};

}  // namespace

TensorDict TensorDict::where(const at::Tensor& condition, const TensorDict& other) const {
  if (!is_dense()) return contiguous().where(condition, other);  // another node kind: on its dense form
  check_batch_mask(*this, condition, "where", "condition");
  if (!other.defined()) throw ValueError("where: the other TensorDict is undefined");
  WhereVisitor v(condition);
  const TensorDictImpl& s = *impl();
  return detail::tree::rebuild(s, s.batch_size, v, {other.impl().get()});
}

TensorDict TensorDict::where(const at::Tensor& condition, const at::Scalar& other) const {
  if (!is_dense()) return contiguous().where(condition, other);  // another node kind: on its dense form
  check_batch_mask(*this, condition, "where", "condition");
  TensorDict out = transform(
      *this, same_batch,
      [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return at::where(right_view(condition, x), x, other); },
      NonTensorPolicy::Carry, "where");
  return maybe_lock(out, *this);
}

// ================================================================================================ arithmetic
TensorDict TensorDict::add(const TensorDict& other) const { return binary_td(*this, other, Bin::Add); }
TensorDict TensorDict::add(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::Add); }
TensorDict TensorDict::add(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::Add); }
TensorDict TensorDict::sub(const TensorDict& other) const { return binary_td(*this, other, Bin::Sub); }
TensorDict TensorDict::sub(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::Sub); }
TensorDict TensorDict::sub(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::Sub); }
TensorDict TensorDict::mul(const TensorDict& other) const { return binary_td(*this, other, Bin::Mul); }
TensorDict TensorDict::mul(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::Mul); }
TensorDict TensorDict::mul(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::Mul); }
TensorDict TensorDict::div(const TensorDict& other) const { return binary_td(*this, other, Bin::Div); }
TensorDict TensorDict::div(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::Div); }
TensorDict TensorDict::div(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::Div); }

TensorDict& TensorDict::add_(const TensorDict& other) {
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.add_(other);
    detail::write_back(*this, dense);
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {  // member by member, other split along the stack dim
    std::vector<TensorDict> parts = other.unbind(lz->stack_dim);
    if (parts.size() != lz->members.size()) {
      throw BatchSizeError("add_: the other TensorDict has batch size " + detail::shape_str(other.batch_size()) +
                           ", the lazy stack " + detail::shape_str(batch_size()));
    }
    for (size_t i = 0; i < parts.size(); ++i) lz->members[i].add_(parts[i]);
    return *this;
  }
  check_same_leaves(*this, other, "add_");
  BatchSize bs = broadcast_batch(batch_size(), other.batch_size(), "add_", "the other TensorDict's batch size");
  if (bs != batch_size()) {
    throw BatchSizeError("add_: the other TensorDict's batch size " + shape_str(other.batch_size()) +
                         " does not broadcast to this batch size " + shape_str(batch_size()) +
                         " (an in-place result cannot change the batch size)");
  }
  TensorDict b = expand_to(other, bs);
  for_each_leaf(*d(), [&](const tree::KeyPath& k, const at::Tensor& x) {
    check_writable(x, k, "add_");
    at::Tensor y = b.get(k.full());
    auto s = broadcast_shapes(sizes_of(x), sizes_of(y));
    if (!s || *s != sizes_of(x)) {
      throw BatchSizeError("add_: the other leaf at key " + k.full().repr() + " of shape " + shape_str(y.sizes()) +
                           " does not broadcast to the leaf of shape " + shape_str(x.sizes()));
    }
    check_castable(at::result_type(x, y), x, k, "add_");
  });
  for_each_leaf(*d(), [&](const tree::KeyPath& k, const at::Tensor& x) {
    try {
      at::Tensor(x).add_(b.get(k.full()));
    } catch (...) {
      throw RuntimeError("add_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
  return *this;
}

namespace {
void scalar_inplace(TensorDict& td, const at::Scalar& s, const char* op, bool is_add) {
  for_each_leaf(*td.impl(), [&](const tree::KeyPath& k, const at::Tensor& x) {
    check_writable(x, k, op);
    check_castable(at::result_type(x, s), x, k, op);
  });
  for_each_leaf(*td.impl(), [&](const tree::KeyPath& k, const at::Tensor& x) {
    try {
      if (is_add) {
        at::Tensor(x).add_(s);
      } else {
        at::Tensor(x).mul_(s);
      }
    } catch (...) {
      throw RuntimeError(std::string(op) + ": key " + k.full().repr() + ": " + current_torch_message());
    }
  });
}
}  // namespace

TensorDict& TensorDict::add_(const at::Scalar& other) {
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.add_(other);
    detail::write_back(*this, dense);
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {
    for (auto& m : lz->members) m.add_(other);
    return *this;
  }
  scalar_inplace(*this, other, "add_", true);
  return *this;
}

TensorDict& TensorDict::mul_(const at::Scalar& other) {
  if (detail::is_remote(*this)) {  // a remote node: on its dense form, written back in one request
    TensorDict dense = contiguous();
    dense.mul_(other);
    detail::write_back(*this, dense);
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {
    for (auto& m : lz->members) m.mul_(other);
    return *this;
  }
  scalar_inplace(*this, other, "mul_", false);
  return *this;
}

TensorDict TensorDict::rsub(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::RSub); }
TensorDict TensorDict::rsub(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::RSub); }
TensorDict TensorDict::rdiv(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::RDiv); }
TensorDict TensorDict::rdiv(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::RDiv); }

namespace {
//! an in-place op as upstream's (torch's) rules: `result` (self op other, computed out of place) must keep
//! self's batch size and be castable to every leaf's dtype; then it is copied into the leaves (any node kind)
TensorDict& write_result(TensorDict& self, const TensorDict& result, const char* op) {
  if (result.batch_size() != self.batch_size()) {
    throw RuntimeError(std::string(op) + ": output with batch size " + shape_str(self.batch_size()) +
                       " doesn't match the broadcast batch size " + shape_str(result.batch_size()));
  }
  const TensorDict dense = detail::dense_tree(self);
  std::vector<std::pair<NestedKey, at::Tensor>> writes;
  for_each_leaf(*result.impl(), [&](const tree::KeyPath& k, const at::Tensor& r) {
    const at::Tensor x = dense.get(k.full());
    check_writable(x, k, op);
    check_castable(r.scalar_type(), x, k, op);
    if (!r.sizes().equals(x.sizes())) {
      throw RuntimeError(std::string(op) + ": output with shape " + shape_str(x.sizes()) + " of key " + k.full().repr() +
                         " doesn't match the broadcast shape " + shape_str(r.sizes()));
    }
    writes.emplace_back(k.full(), r);
  });
  for (const auto& w : writes) self.set_(w.first, w.second);
  return self;
}
}  // namespace

TensorDict& TensorDict::add_(const at::Tensor& other) { return write_result(*this, add(other), "add_"); }
TensorDict& TensorDict::sub_(const TensorDict& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::sub_(const at::Tensor& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::sub_(const at::Scalar& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::mul_(const TensorDict& other) { return write_result(*this, mul(other), "mul_"); }
TensorDict& TensorDict::mul_(const at::Tensor& other) { return write_result(*this, mul(other), "mul_"); }
TensorDict& TensorDict::div_(const TensorDict& other) { return write_result(*this, div(other), "div_"); }
TensorDict& TensorDict::div_(const at::Tensor& other) { return write_result(*this, div(other), "div_"); }
TensorDict& TensorDict::div_(const at::Scalar& other) { return write_result(*this, div(other), "div_"); }

// ================================================================================================ comparisons
TensorDict TensorDict::eq(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Eq); }
TensorDict TensorDict::eq(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Eq); }
TensorDict TensorDict::eq(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Eq); }
TensorDict TensorDict::ne(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Ne); }
TensorDict TensorDict::ne(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Ne); }
TensorDict TensorDict::ne(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Ne); }
TensorDict TensorDict::lt(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Lt); }
TensorDict TensorDict::lt(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Lt); }
TensorDict TensorDict::lt(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Lt); }
TensorDict TensorDict::le(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Le); }
TensorDict TensorDict::le(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Le); }
TensorDict TensorDict::le(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Le); }
TensorDict TensorDict::gt(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Gt); }
TensorDict TensorDict::gt(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Gt); }
TensorDict TensorDict::gt(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Gt); }
TensorDict TensorDict::ge(const TensorDict& other) const { return compare_td_top(*this, other, Cmp::Ge); }
TensorDict TensorDict::ge(const at::Scalar& other) const { return compare_scalar(*this, other, Cmp::Ge); }
TensorDict TensorDict::ge(const at::Tensor& other) const { return compare_tensor(*this, other, Cmp::Ge); }

// ================================================================================================ reductions
bool TensorDict::all() const { return all_any(*this, true); }
bool TensorDict::any() const { return all_any(*this, false); }
TensorDict TensorDict::all(int64_t dim) const { return all_any_dim(*this, dim, true); }
TensorDict TensorDict::any(int64_t dim) const { return all_any_dim(*this, dim, false); }

namespace {
enum class Red { Sum, Mean };
const char* red_name(Red r) { return r == Red::Sum ? "sum" : "mean"; }

//! one leaf reduced over `dims` (nullopt: every dim of the leaf, upstream v0.14 without dim). mean of an
//! integer leaf raises as torch.mean does
at::Tensor reduce_leaf(Red r, const at::Tensor& x, const std::optional<std::vector<int64_t>>& dims, bool keepdim) {
  if (!dims) {
    std::vector<int64_t> all(static_cast<size_t>(x.dim()));
    for (int64_t i = 0; i < x.dim(); ++i) all[static_cast<size_t>(i)] = i;
    if (all.empty()) return r == Red::Sum ? at::sum(x) : at::mean(x);
    return r == Red::Sum ? at::sum(x, all, keepdim) : at::mean(x, all, keepdim);
  }
  if (dims->empty()) {  // nothing to reduce (torch would read an empty dim list as "every dim")
    if (r == Red::Mean && !at::isFloatingType(x.scalar_type()) && !at::isComplexType(x.scalar_type())) at::mean(x);
    return x.clone();
  }
  return r == Red::Sum ? at::sum(x, *dims, keepdim) : at::mean(x, *dims, keepdim);
}

TensorDict reduce_td(const TensorDict& self, Red r, const std::optional<std::vector<int64_t>>& dims_in, bool keepdim) {
  std::optional<std::vector<int64_t>> dims;
  if (dims_in) dims = reduce_dims(self, *dims_in, red_name(r));
  BatchMap bm;
  if (dims) {
    bm = reduce_batch(*dims, keepdim);
  } else {
    bm = [keepdim](const BatchSize& bs) { return keepdim ? BatchSize(bs.size(), 1) : BatchSize{}; };
  }
  return transform(
      self, bm, [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return reduce_leaf(r, x, dims, keepdim); },
      NonTensorPolicy::CarryOrDrop, red_name(r));
}

//! upstream reduce=True: the leaves, reduced over the batch dims `dims` (all of them when unset), with their
//! remaining feature elements put together and reduced into one tensor of the reduced batch shape
at::Tensor reduce_all_leaves(const TensorDict& self_in, Red r, const std::optional<std::vector<int64_t>>& dims_in,
                             bool keepdim) {
  const TensorDict self = detail::dense_tree(self_in);
  const BatchSize& bs = self.batch_size();
  std::vector<int64_t> all(bs.size());
  for (size_t i = 0; i < bs.size(); ++i) all[i] = static_cast<int64_t>(i);
  const std::vector<int64_t> dims = dims_in ? reduce_dims(self, *dims_in, red_name(r)) : all;
  const BatchSize out_bs = reduce_batch(dims, keepdim)(bs);
  const int64_t nd = static_cast<int64_t>(bs.size());
  std::vector<at::Tensor> parts;
  for_each_leaf(*self.impl(), [&](const tree::KeyPath& k, const at::Tensor& x) {
    try {
      // batch dims kept in front, every other element of the leaf (reduced dims and features) flattened last
      std::vector<int64_t> perm;
      for (int64_t i = 0; i < nd; ++i)
        if (std::find(dims.begin(), dims.end(), i) == dims.end()) perm.push_back(i);
      for (int64_t i = 0; i < x.dim(); ++i)
        if (std::find(perm.begin(), perm.end(), i) == perm.end()) perm.push_back(i);
      BatchSize shape = out_bs;
      shape.push_back(-1);
      at::Tensor y = x.permute(perm).reshape(shape);
      if (r == Red::Mean && !at::isFloatingType(y.scalar_type()) && !at::isComplexType(y.scalar_type())) {
        at::mean(y);  // torch's error for an integer leaf
      }
      parts.push_back(y);
    } catch (const Error&) {
      throw;
    } catch (...) {
      throw RuntimeError(std::string(red_name(r)) + "(reduce=true): key " + k.full().repr() + ": " + current_torch_message());
    }
  });
  if (parts.empty()) throw RuntimeError(std::string(red_name(r)) + "(reduce=true): the TensorDict has no tensor leaf");
  try {
    at::Tensor cat = at::cat(parts, -1);
    return r == Red::Sum ? cat.sum(-1) : cat.mean(-1);
  } catch (...) {
    throw RuntimeError(std::string(red_name(r)) + "(reduce=true): " + current_torch_message());
  }
}
}  // namespace

TensorDict TensorDict::sum(std::optional<int64_t> dim, bool keepdim) const {
  if (!is_dense()) return contiguous().sum(dim, keepdim);  // another node kind: on its dense form
  return reduce_td(*this, Red::Sum, dim ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{*dim}) : std::nullopt, keepdim);
}
TensorDict TensorDict::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  if (!is_dense()) return contiguous().sum(dims, keepdim);
  return reduce_td(*this, Red::Sum, dims, keepdim);
}
TensorDict TensorDict::mean(std::optional<int64_t> dim, bool keepdim) const {
  if (!is_dense()) return contiguous().mean(dim, keepdim);  // another node kind: on its dense form
  return reduce_td(*this, Red::Mean, dim ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{*dim}) : std::nullopt, keepdim);
}
TensorDict TensorDict::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  if (!is_dense()) return contiguous().mean(dims, keepdim);
  return reduce_td(*this, Red::Mean, dims, keepdim);
}
at::Tensor TensorDict::sum_reduce(const std::optional<std::vector<int64_t>>& dims, bool keepdim) const {
  return reduce_all_leaves(is_dense() ? *this : contiguous(), Red::Sum, dims, keepdim);
}
at::Tensor TensorDict::mean_reduce(const std::optional<std::vector<int64_t>>& dims, bool keepdim) const {
  return reduce_all_leaves(is_dense() ? *this : contiguous(), Red::Mean, dims, keepdim);
}

bool TensorDict::equal(const TensorDict& other) const {
  if (!other.defined()) return false;
  if (!dense_ || !other.is_dense()) {
    if (batch_size() != other.batch_size()) return false;
    auto* a = detail::lazy_node(*this);
    auto* b = detail::lazy_node(other);
    if (a && b && a->stack_dim == b->stack_dim && a->members.size() == b->members.size()) {
      for (size_t i = 0; i < a->members.size(); ++i)
        if (!a->members[i].equal(b->members[i])) return false;
      return true;
    }
    try {
      return contiguous().equal(other.contiguous());
    } catch (const Error&) {
      return false;  // ragged members that do not densify: not equal to anything dense
    }
  }
  return equal_impl(*d(), *other.impl());
}

// ================================================================================================ operators
TensorDict operator+(const TensorDict& a, const TensorDict& b) { return a.add(b); }
TensorDict operator-(const TensorDict& a, const TensorDict& b) { return a.sub(b); }
TensorDict operator*(const TensorDict& a, const TensorDict& b) { return a.mul(b); }
TensorDict operator/(const TensorDict& a, const TensorDict& b) { return a.div(b); }
TensorDict operator+(const TensorDict& a, const at::Scalar& b) { return a.add(b); }
TensorDict operator-(const TensorDict& a, const at::Scalar& b) { return a.sub(b); }
TensorDict operator*(const TensorDict& a, const at::Scalar& b) { return a.mul(b); }
TensorDict operator/(const TensorDict& a, const at::Scalar& b) { return a.div(b); }
TensorDict operator+(const TensorDict& a, const at::Tensor& b) { return a.add(b); }
TensorDict operator-(const TensorDict& a, const at::Tensor& b) { return a.sub(b); }
TensorDict operator*(const TensorDict& a, const at::Tensor& b) { return a.mul(b); }
TensorDict operator/(const TensorDict& a, const at::Tensor& b) { return a.div(b); }
TensorDict operator+(const at::Scalar& a, const TensorDict& b) { return b.add(a); }
TensorDict operator-(const at::Scalar& a, const TensorDict& b) { return b.rsub(a); }
TensorDict operator*(const at::Scalar& a, const TensorDict& b) { return b.mul(a); }
TensorDict operator/(const at::Scalar& a, const TensorDict& b) { return b.rdiv(a); }
TensorDict operator+(const at::Tensor& a, const TensorDict& b) { return b.add(a); }
TensorDict operator-(const at::Tensor& a, const TensorDict& b) { return b.rsub(a); }
TensorDict operator*(const at::Tensor& a, const TensorDict& b) { return b.mul(a); }
TensorDict operator/(const at::Tensor& a, const TensorDict& b) { return b.rdiv(a); }
TensorDict& operator+=(TensorDict& a, const TensorDict& b) { return a.add_(b); }
TensorDict& operator-=(TensorDict& a, const TensorDict& b) { return a.sub_(b); }
TensorDict& operator*=(TensorDict& a, const TensorDict& b) { return a.mul_(b); }
TensorDict& operator/=(TensorDict& a, const TensorDict& b) { return a.div_(b); }
TensorDict& operator+=(TensorDict& a, const at::Tensor& b) { return a.add_(b); }
TensorDict& operator-=(TensorDict& a, const at::Tensor& b) { return a.sub_(b); }
TensorDict& operator*=(TensorDict& a, const at::Tensor& b) { return a.mul_(b); }
TensorDict& operator/=(TensorDict& a, const at::Tensor& b) { return a.div_(b); }
TensorDict& operator+=(TensorDict& a, const at::Scalar& b) { return a.add_(b); }
TensorDict& operator-=(TensorDict& a, const at::Scalar& b) { return a.sub_(b); }
TensorDict& operator*=(TensorDict& a, const at::Scalar& b) { return a.mul_(b); }
TensorDict& operator/=(TensorDict& a, const at::Scalar& b) { return a.div_(b); }
TensorDict operator==(const TensorDict& a, const TensorDict& b) { return a.eq(b); }
TensorDict operator!=(const TensorDict& a, const TensorDict& b) { return a.ne(b); }
TensorDict operator<(const TensorDict& a, const TensorDict& b) { return a.lt(b); }
TensorDict operator<=(const TensorDict& a, const TensorDict& b) { return a.le(b); }
TensorDict operator>(const TensorDict& a, const TensorDict& b) { return a.gt(b); }
TensorDict operator>=(const TensorDict& a, const TensorDict& b) { return a.ge(b); }
TensorDict operator==(const TensorDict& a, const at::Scalar& b) { return a.eq(b); }
TensorDict operator!=(const TensorDict& a, const at::Scalar& b) { return a.ne(b); }
TensorDict operator<(const TensorDict& a, const at::Scalar& b) { return a.lt(b); }
TensorDict operator<=(const TensorDict& a, const at::Scalar& b) { return a.le(b); }
TensorDict operator>(const TensorDict& a, const at::Scalar& b) { return a.gt(b); }
TensorDict operator>=(const TensorDict& a, const at::Scalar& b) { return a.ge(b); }
TensorDict operator==(const TensorDict& a, const at::Tensor& b) { return a.eq(b); }
TensorDict operator!=(const TensorDict& a, const at::Tensor& b) { return a.ne(b); }
TensorDict operator<(const TensorDict& a, const at::Tensor& b) { return a.lt(b); }
TensorDict operator<=(const TensorDict& a, const at::Tensor& b) { return a.le(b); }
TensorDict operator>(const TensorDict& a, const at::Tensor& b) { return a.gt(b); }
TensorDict operator>=(const TensorDict& a, const at::Tensor& b) { return a.ge(b); }

}  // namespace tensordict
