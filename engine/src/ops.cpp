// TensorDict leaf-wise operations: the apply family and zero_ / masked_fill / where here, with the helpers
// the operations share (ops_internal.hpp); arithmetic with TensorDicts, tensors and scalars in
// ops_arithmetic.cpp; comparisons and equal() in ops_compare.cpp; all/any, sum/mean in ops_reduce.cpp.
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
#include <tuple>

#include "lazy_stack_node.hpp"
#include "ops_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"

namespace tensordict {

namespace detail::ops {
namespace {

BatchSize concat(BatchSize a, at::IntArrayRef b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

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

at::Tensor right_view(const at::Tensor& m, const at::Tensor& leaf) {
  std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
  shape.resize(static_cast<size_t>(std::max<int64_t>(leaf.dim(), m.dim())), 1);
  at::Tensor v = m.reshape(shape);
  if (v.device() != leaf.device()) v = v.to(leaf.device());
  return v;
}

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

BatchSize broadcast_batch(const BatchSize& a, const BatchSize& b, const char* op, const char* what) {
  auto r = broadcast_shapes(a, b);
  if (!r) {
    throw BatchSizeError(std::string(op) + ": cannot broadcast " + what + " of shape " + shape_str(b) +
                         " with the batch size " + shape_str(a) +
                         " (shapes are aligned on the right, as torch.broadcast_shapes)");
  }
  return *r;
}

TensorDict expand_to(const TensorDict& td, const BatchSize& bs) {
  if (td.batch_size() == bs) return td;
  const size_t nd = td.batch_size().size();
  return detail::map_batch(
      td, bs, [&](const at::Tensor& t) { return t.expand(concat(bs, t.sizes().slice(nd))); }, false);
}

}  // namespace detail::ops

namespace {

using namespace detail::ops;

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
  //! in-place: the sub-TensorDicts of other node kinds (a lazy stack below), applied once every dense leaf's
  //! result is known and checked (they were applied during the visit: a later leaf's fn that threw left them
  //! changed and the dense leaves not)
  std::vector<TensorDict> deferred;
  //! the others' sub-TensorDicts at each deferred one (an apply_ with other TensorDicts)
  std::vector<std::vector<TensorDict>> deferred_others;
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
    // another node kind (not a dense node) applies itself where it can (one tree, one fn), with the others'
    // sub-TensorDicts at its key when every other has one
    const TensorDictImpl* level = tree::level_of(child, tree::Descend::DenseOnly);
    if (!level && ((c.unary && m.empty()) || (c.multi && std::all_of(m.begin(), m.end(), [](const Entry* e) { return e; }))))
      return nullptr;
    return level ? level : detail::impl_of(child).get();
  }
  std::vector<const TensorDictImpl*> descend_others(const tree::KeyPath&, const TensorDictImpl& child,
                                                    const tree::Matched& m) {
    std::vector<const TensorDictImpl*> out(m.size(), nullptr);
    if (child.entries.empty()) return out;  // nothing to match: the others' levels are not read
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i]) out[i] = detail::impl_of(m[i]->tensordict()).get();
    return out;
  }
  std::optional<TensorDict> other_node(const tree::KeyPath&, const TensorDict& sub, const BatchSize&,
                                       const tree::Matched& m) {
    TensorDict child = sub;
    std::vector<TensorDict> subs;  // a unary fn or a multi fn (descend: every other holds a TensorDict here)
    for (const Entry* e : m) subs.push_back(e->tensordict());
    if (c.inplace) {
      c.deferred.push_back(child);
      c.deferred_others.push_back(std::move(subs));
      return child;
    }
    const ApplyOptions o = ApplyOptions().keep_empty(c.opts.keep_empty());
    return c.multi ? child.apply(*c.multi, subs, o) : child.apply(*c.unary, o);
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
  const TensorDictImpl& s = *detail::impl_of(self);
  std::vector<const TensorDictImpl*> levels(others.size(), nullptr);
  if (!s.entries.empty()) {  // nothing to match: the others' levels are not read
    for (size_t i = 0; i < others.size(); ++i) levels[i] = detail::impl_of(others[i]).get();
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
  for (const auto& w : c.writes)  // a memmap leaf: a full disk is a BackendError, not a SIGBUS, before any write
    if (!std::get<1>(w).is_same(std::get<2>(w))) backends::reserve_for_store(std::get<1>(w));
  // the other node kinds below apply fn now; one that refuses puts the ones before it back (the dense writes after
  // them cannot fail once checked and reserved)
  size_t d = 0;
  detail::on_each_or_put_back(c.deferred, [&](TensorDict& sub) {
    const std::vector<TensorDict>& subs = c.deferred_others[d++];
    if (c.multi) {
      sub.apply_(*c.multi, subs);
    } else {
      sub.apply_(*c.unary);
    }
  });
  for (const auto& w : c.writes) {
    const at::Tensor& dest = std::get<1>(w);
    const at::Tensor& value = std::get<2>(w);
    if (dest.is_same(value)) continue;
    try {
      at::Tensor(dest).copy_(value);
    } catch (...) {
      throw RuntimeError(std::string(c.op) + ": copy into key " + std::get<0>(w).repr() + " failed: " +
                         current_torch_message());
    }
  }
}

}  // namespace

// ================================================================================================ apply family
// each reaches its node (node.hpp); Node's defaults are in node.cpp, the lazy stack's in lazy_stack_ops.cpp
TensorDict TensorDict::apply(const LeafFn& fn, const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).apply(fn, options));
  if (!fn) throw ValueError("apply: fn is empty");
  return detail::node_of(*this, "apply").apply(*this, fn, options);
}

TensorDict TensorDictImpl::apply(const TensorDict& self, const LeafFn& fn, const ApplyOptions& options) const {
  ApplyCall c;
  c.unary = &fn;
  c.opts = options;
  return run_apply(self, {}, c);
}

TensorDict TensorDict::apply(const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                             const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).apply(fn, others, options));
  if (!fn) throw ValueError("apply: fn is empty");
  return detail::node_of(*this, "apply").apply(*this, fn, others, options);
}

TensorDict TensorDictImpl::apply(const TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                                 const ApplyOptions& options) const {
  ApplyCall c;
  c.multi = &fn;
  c.opts = options;
  return run_apply(self, others, c);
}

TensorDict& TensorDict::apply_(const LeafFn& fn) {
  if (!fn) throw ValueError("apply_: fn is empty");
  detail::node_of(*this, "apply_").apply_(*this, fn);
  return *this;
}

void TensorDictImpl::apply_(TensorDict& self, const LeafFn& fn) {
  ApplyCall c;
  c.unary = &fn;
  c.inplace = true;
  c.op = "apply_";
  run_apply(self, {}, c);
  commit_writes(c);
}

TensorDict& TensorDict::apply_(const MultiLeafFn& fn, const std::vector<TensorDict>& others) {
  if (!fn) throw ValueError("apply_: fn is empty");
  detail::node_of(*this, "apply_").apply_(*this, fn, others);
  return *this;
}

void TensorDictImpl::apply_(TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others) {
  ApplyCall c;
  c.multi = &fn;
  c.inplace = true;
  c.op = "apply_";
  run_apply(self, others, c);
  commit_writes(c);
}

TensorDict TensorDict::named_apply(const NamedLeafFn& fn, const ApplyOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).named_apply(fn, options));
  return detail::node_of(*this, "named_apply").named_apply(*this, fn, options);
}

TensorDict TensorDictImpl::named_apply(const TensorDict& self, const NamedLeafFn& fn,
                                       const ApplyOptions& options) const {
  if (!fn) throw ValueError("named_apply: fn is empty");
  ApplyCall c;
  c.named = &fn;
  c.opts = options;
  c.op = "named_apply";
  return run_apply(self, {}, c);
}

TensorDict TensorDict::named_apply(const NamedMultiLeafFn& fn, const std::vector<TensorDict>& others,
                                   const ApplyOptions& options) const {
  return detail::node_of(*this, "named_apply").named_apply(*this, fn, others, options);
}

TensorDict TensorDictImpl::named_apply(const TensorDict& self, const NamedMultiLeafFn& fn,
                                       const std::vector<TensorDict>& others, const ApplyOptions& options) const {
  if (!fn) throw ValueError("named_apply: fn is empty");
  std::vector<TensorDict> os;
  for (const auto& o : others) os.push_back(o.defined() ? o.node()->dense_form(o) : o);
  ApplyCall c;
  c.named_multi = &fn;
  c.opts = options;
  c.op = "named_apply";
  return run_apply(self, os, c);
}

// ================================================================================================ fills
TensorDict& TensorDict::zero_() {
  detail::node_of(*this, "zero_").zero_(*this);
  return *this;
}

void TensorDictImpl::zero_(TensorDict& self) {
  if (!detail::is_dense_tree(self)) return Node::zero_(self);  // a node of another kind below: its own apply_
  for_each_leaf(*this, [](const tree::KeyPath& k, const at::Tensor& t) { check_writable(t, k, "zero_"); });
  for_each_leaf(*this, [](const tree::KeyPath& k, const at::Tensor& t) {
    try {
      at::Tensor(t).zero_();
    } catch (...) {
      throw RuntimeError("zero_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
}

TensorDict TensorDict::masked_fill(const at::Tensor& mask, const at::Scalar& value) const {
  return detail::node_of(*this, "masked_fill").masked_fill(*this, mask, value);
}

TensorDict TensorDictImpl::masked_fill(const TensorDict& self, const at::Tensor& mask, const at::Scalar& value) const {
  check_batch_mask(self, mask, "masked_fill", "mask");
  TensorDict out = self.clone();
  out.masked_fill_(mask, value);
  return out;
}

TensorDict& TensorDict::masked_fill_(const at::Tensor& mask, const at::Scalar& value) {
  detail::node_of(*this, "masked_fill_").masked_fill_(*this, mask, value);
  return *this;
}

void TensorDictImpl::masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value) {
  check_batch_mask(self, mask, "masked_fill_", "mask");
  for_each_leaf(*this, [](const tree::KeyPath& k, const at::Tensor& t) { check_writable(t, k, "masked_fill_"); });
  for_each_leaf(*this, [&](const tree::KeyPath& k, const at::Tensor& t) {
    try {
      at::Tensor(t).masked_fill_(right_view(mask, t), value);
    } catch (...) {
      throw RuntimeError("masked_fill_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
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
    return detail::impl_of(sub).get();
  }
  std::vector<const TensorDictImpl*> descend_others(const tree::KeyPath&, const TensorDictImpl&, const tree::Matched& m) {
    return {detail::impl_of(m[0]->tensordict()).get()};
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
  return detail::node_of(*this, "where").where(*this, condition, other);
}

TensorDict TensorDictImpl::where(const TensorDict& self, const at::Tensor& condition, const TensorDict& other) const {
  check_batch_mask(self, condition, "where", "condition");
  if (!other.defined()) throw ValueError("where: the other TensorDict is undefined");
  WhereVisitor v(condition);
  return detail::tree::rebuild(*this, batch_size, v, {detail::impl_of(other).get()});
}

TensorDict TensorDict::where(const at::Tensor& condition, const at::Scalar& other) const {
  return detail::node_of(*this, "where").where(*this, condition, other);
}

TensorDict TensorDictImpl::where(const TensorDict& self, const at::Tensor& condition, const at::Scalar& other) const {
  check_batch_mask(self, condition, "where", "condition");
  TensorDict out = transform(
      self, same_batch,
      [&](const tree::KeyPath&, const at::Tensor& x, const tree::Matched&) { return at::where(right_view(condition, x), x, other); },
      NonTensorPolicy::Carry, "where");
  return maybe_lock(out, self);
}

}  // namespace tensordict
