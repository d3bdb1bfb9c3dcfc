// LazyStackNode's operations (issue 34, item 2): upstream's LazyStackedTensorDict works member by member
// and returns lazy stacks; what it has no form for runs Node's defaults (node.cpp: on the dense form).
// Its shape ops are in shape_ops.cpp beside the dense ones.
#include <algorithm>
#include <string>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"

namespace tensordict {

LazyStackNode* LazyStackNode::of(const TensorDict& td) {
  return td.defined() ? dynamic_cast<LazyStackNode*>(td.node().get()) : nullptr;  // the class over its own node
}

namespace {
//! what an operation without a form for a lazy stack says (the dense-only paths' text)
[[noreturn]] void not_dense(const Node& node) {
  throw NotImplementedError("this operation is not supported on a " + node.type_name() +
                            " (dense TensorDicts only); densify it first with contiguous()");
}

}  // namespace

EntryMeta LazyStackNode::as_entry_meta() const {
  EntryMeta m = Node::as_entry_meta();
  m.kind = EntryMeta::Kind::LazyStack;
  return m;
}

TensorDict LazyStackNode::open_child(const std::string& key) {
  if (read(key) || std::find(batch_size.begin(), batch_size.end(), -1) == batch_size.end()) {
    return Node::open_child(key);
  }
  // ragged members: each gets a sub-TensorDict of its own batch size
  for (auto& m : members) m.set(NestedKey(key), Entry(TensorDict(m.batch_size(), m.device())));
  return read(key)->tensordict();
}

void LazyStackNode::set_entry(const NestedKey& key, const Entry& value, bool inplace) {
  if (inplace && meta(key.back())) return put_inplace(key.back(), value);
  detail::check_node_unlocked(*this);
  put(key.back(), value);
}

namespace {
//! torch's rule for x.add_(s) / x.mul_(s), on every member's leaves before any is written: the result type must
//! be castable to the leaf's dtype (an int leaf times 0.5 is refused). From the metadata, one check per dtype
void check_scalar_on_members(const std::vector<TensorDict>& members, const at::Scalar& s, const char* op) {
  std::vector<at::ScalarType> seen;
  for (const auto& m : members) {
    for (const auto& [k, meta] : detail::key_metas(m, KeysOptions().include_nested(true).leaves_only(true))) {
      if (meta.kind != EntryMeta::Kind::Tensor || std::find(seen.begin(), seen.end(), meta.dtype) != seen.end()) continue;
      const at::ScalarType result = at::result_type(at::empty({1}, at::TensorOptions().dtype(meta.dtype)), s);
      if (!at::can_cast(result, meta.dtype)) {
        throw RuntimeError(std::string(op) + ": result type " + std::string(c10::toString(result)) +
                           " can't be cast to the desired output type " + c10::toString(meta.dtype) + " of key " +
                           k.repr());
      }
      seen.push_back(meta.dtype);
    }
  }
}

}  // namespace

void LazyStackNode::rename_key(TensorDict&, const NestedKey& old_key, const NestedKey& new_key, bool safe) {
  detail::check_node_unlocked(*this);
  // a member that refuses (the new name taken with safe, the old one missing) renames the members before it back
  detail::on_each_member(
      members, [](const TensorDict&) { return TensorDict(); },
      [&](TensorDict& m) { m.rename_key_(old_key, new_key, RenameOptions().safe(safe)); },
      [&](TensorDict& m, const TensorDict&) { m.rename_key_(new_key, old_key); });
}

void LazyStackNode::clear(TensorDict&) {
  // upstream's clear: every key of the stack (its members' common keys) deleted from every member
  detail::check_node_unlocked(*this);
  for (const auto& k : keys()) erase(k);
}

void LazyStackNode::fill(TensorDict&, const NestedKey& key, const at::Scalar& value) {
  detail::on_each_member(
      members,
      [&](const TensorDict& m) {
        TensorDict copy(m.batch_size(), m.device());
        if (m.contains(key)) copy.set(NestedKey("v"), m.get(key).clone());
        return copy;
      },
      [&](TensorDict& m) { m.fill_(key, value); },
      [&](TensorDict& m, const TensorDict& copy) {
        if (copy.contains("v")) m.set_(key, copy.get("v"));
      });
}

void LazyStackNode::set_batch_size(TensorDict&, BatchSize) {
  throw RuntimeError("Modifying the batch size of a lazy representation of a tensordict is not permitted. Consider "
                     "instantiating the tensordict first by calling `td = td.to_tensordict()` before resetting "
                     "the batch size.");
}

int64_t LazyStackNode::bytes(const TensorDict&) const {
  int64_t n = 0;
  for (const auto& m : members) n += m.bytes();
  return n;
}

//! a lazy stack of `parts` along this stack's dim; an empty stack keeps the members' batch
static TensorDict restack_parts(const LazyStackNode& lz, std::vector<TensorDict> parts) {
  if (parts.empty()) {
    return TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(lz.member_batch, lz.stack_dim, lz.device)));
  }
  return detail::make_lazy(std::move(parts), lz.stack_dim);
}

TensorDict LazyStackNode::empty(const TensorDict&, bool recurse) const {
  std::vector<TensorDict> parts;
  for (const auto& m : members) parts.push_back(m.empty(EmptyOptions().recurse(recurse)));
  return restack_parts(*this, std::move(parts));
}

TensorDict LazyStackNode::select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict,
                                 bool inplace) const {
  if (inplace) return Node::select(self, keys, strict, inplace);
  if (strict)
    for (const auto& k : keys)
      if (!self.contains(k)) detail::missing_in_node(k, self);
  std::vector<TensorDict> parts;
  for (const auto& m : members) parts.push_back(m.select(keys, SelectOptions().strict(false)));
  return detail::make_lazy(std::move(parts), stack_dim);
}

TensorDict LazyStackNode::exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const {
  std::vector<TensorDict> parts;
  for (const auto& m : members) parts.push_back(m.exclude(keys, ExcludeOptions().inplace(inplace)));
  if (inplace) return self;
  return detail::make_lazy(std::move(parts), stack_dim);
}

TensorDict LazyStackNode::clone(const TensorDict&, bool recurse) const {
  std::vector<TensorDict> parts;
  for (const auto& m : members) parts.push_back(m.clone(CloneOptions().recurse(recurse)));
  return restack_parts(*this, std::move(parts));
}

TensorDict LazyStackNode::to(const TensorDict&, at::Device device) const {
  std::vector<TensorDict> parts;
  for (const auto& m : members) parts.push_back(m.to(device));
  return detail::make_lazy(std::move(parts), stack_dim);
}

// ============================================================================ apply, fills, in-place arithmetic
TensorDict LazyStackNode::apply(const TensorDict& self, const LeafFn& fn, const ApplyOptions& options) const {
  // member by member: a lazy stack again (upstream test_stack_apply). With a batch_size, as upstream: an op that
  // changes the batch size gives a regular TensorDict, fn applied to the stacked leaves
  if (options.batch_size()) return dense_form(self).apply(fn, options);
  std::vector<TensorDict> out;
  for (const auto& m : members) out.push_back(m.apply(fn, options));
  return detail::make_lazy(std::move(out), stack_dim);
}

//! the others of an apply with other TensorDicts split along the stack dim: member i's others (upstream unbinds
//! each other along the stack dim); BatchSizeError when one does not hold as many along it as the stack's members
static std::vector<std::vector<TensorDict>> others_by_member(const LazyStackNode& lz, const TensorDict& self,
                                                             const std::vector<TensorDict>& others, const char* op) {
  std::vector<std::vector<TensorDict>> out(lz.members.size());
  for (size_t k = 0; k < others.size(); ++k) {
    if (!others[k].defined()) throw ValueError(std::string(op) + ": others[" + std::to_string(k) + "] is undefined");
    const BatchSize& b = others[k].batch_size();
    const auto dim = static_cast<size_t>(lz.stack_dim);
    if (b.size() <= dim || b[dim] != static_cast<int64_t>(lz.members.size())) {
      throw BatchSizeError(std::string(op) + ": others[" + std::to_string(k) + "] has batch size " +
                           detail::shape_str(b) + ", the lazy stack " + detail::shape_str(self.batch_size()) +
                           " (stacked along dim " + std::to_string(lz.stack_dim) + ")");
    }
    std::vector<TensorDict> parts = others[k].unbind(lz.stack_dim);
    for (size_t i = 0; i < parts.size(); ++i) out[i].push_back(std::move(parts[i]));
  }
  return out;
}

TensorDict LazyStackNode::apply(const TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                                const ApplyOptions& options) const {
  // member by member with the others' slices: a lazy stack again (upstream _apply_nest unbinds the others); with a
  // batch_size, a regular TensorDict over the stacked leaves and the others' leaves at the same keys (upstream)
  if (options.batch_size()) return dense_form(self).apply(fn, others, options);
  const auto parts = others_by_member(*this, self, others, "apply");
  std::vector<TensorDict> out;
  for (size_t i = 0; i < members.size(); ++i) out.push_back(members[i].apply(fn, parts[i], options));
  return detail::make_lazy(std::move(out), stack_dim);
}

void LazyStackNode::apply_(TensorDict&, const LeafFn& fn) {
  detail::on_each_or_put_back(members, [&](TensorDict& m) { m.apply_(fn); });
}

void LazyStackNode::apply_(TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others) {
  // member by member; a member that refuses puts the ones before it back
  const auto parts = others_by_member(*this, self, others, "apply_");
  size_t i = 0;
  detail::on_each_or_put_back(members, [&](TensorDict& m) { m.apply_(fn, parts[i++]); });
}

void LazyStackNode::zero_(TensorDict&) {
  for (auto& m : members) m.zero_();
}

void LazyStackNode::masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value) {
  self.index_put_({mask.to(at::kBool)}, value);
}

void LazyStackNode::add_(TensorDict& self, const TensorDict& other) {
  // member by member, other split along the stack dim
  const auto parts = others_by_member(*this, self, {other}, "add_");
  size_t i = 0;
  detail::on_each_or_put_back(members, [&](TensorDict& m) { m.add_(parts[i++][0]); });
}

void LazyStackNode::add_(TensorDict&, const at::Scalar& other) {
  check_scalar_on_members(members, other, "add_");
  for (auto& m : members) m.add_(other);
}

void LazyStackNode::mul_(TensorDict&, const at::Scalar& other) {
  check_scalar_on_members(members, other, "mul_");
  for (auto& m : members) m.mul_(other);
}

void LazyStackNode::share_memory_(TensorDict&) { not_dense(*this); }

}  // namespace tensordict
