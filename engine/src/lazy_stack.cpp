// LazyStackedTensorDict in memory: the lazy-stack node (keys, get/set, per-member index splitting,
// index assignment) and the class's member access (its memmap layout lives in memmap.cpp).
#include "tensordict/lazy_stack.hpp"

#include <algorithm>
#include <set>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/map.hpp"
#include "torch_errors.hpp"

namespace tensordict {

using at::indexing::TensorIndex;

namespace detail {

TensorDict make_lazy(std::vector<TensorDict> members, int64_t stack_dim) {
  return TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(std::move(members), stack_dim)));
}

}  // namespace detail

// ============================================================================ the node
LazyStackNode::LazyStackNode(std::vector<TensorDict> tds, int64_t dim) : members(std::move(tds)) {
  if (members.empty()) throw ValueError("LazyStackedTensorDict needs at least one member");
  for (size_t i = 0; i < members.size(); ++i) {
    if (!members[i].defined()) {
      throw ValueError("LazyStackedTensorDict: member " + std::to_string(i) + " is an undefined TensorDict");
    }
  }
  const int64_t nd = members[0].batch_dims();
  for (const auto& td : members) {
    if (td.batch_dims() != nd) {
      throw BatchSizeError("LazyStackedTensorDict: members have different numbers of batch dims (" +
                           std::to_string(nd) + " vs " + std::to_string(td.batch_dims()) + ")");
    }
    if (td.device() != members[0].device()) {
      throw ValueError("LazyStackedTensorDict: devices differ between members");
    }
  }
  stack_dim = detail::normalize_dim(dim, nd, /*allow_end=*/true);
  refresh();
}

LazyStackNode::LazyStackNode(BatchSize mb, int64_t dim, std::optional<at::Device> dev)
    : stack_dim(dim), member_batch(std::move(mb)) {
  device = dev;
  batch_size = member_batch;
  batch_size.insert(batch_size.begin() + stack_dim, 0);
}

void LazyStackNode::refresh() {
  if (members.empty()) return;
  member_batch = members[0].batch_size();
  for (const auto& td : members)
    for (size_t i = 0; i < member_batch.size(); ++i)
      if (td.batch_size()[i] != member_batch[i]) member_batch[i] = -1;
  batch_size = member_batch;
  batch_size.insert(batch_size.begin() + stack_dim, static_cast<int64_t>(members.size()));
  device = members[0].device();
}

NodeCaps LazyStackNode::caps() const {
  NodeCaps c;
  c.add_keys = true;
  c.memmap = !members.empty();
  c.shared = !members.empty();
  for (const auto& m : members) {
    c.memmap = c.memmap && m.is_memmap();
    c.shared = c.shared && m.is_shared();
  }
  return c;
}

std::vector<std::string> LazyStackNode::keys() const {
  if (members.empty()) return {};
  std::vector<std::string> common = members[0].node()->keys();
  std::sort(common.begin(), common.end());
  for (size_t i = 1; i < members.size(); ++i) {
    std::vector<std::string> k = members[i].node()->keys();
    std::sort(k.begin(), k.end());
    std::vector<std::string> keep;
    std::set_intersection(common.begin(), common.end(), k.begin(), k.end(), std::back_inserter(keep));
    common = std::move(keep);
  }
  return common;
}

std::optional<EntryMeta> LazyStackNode::meta(const std::string& key) const {
  if (members.empty()) return std::nullopt;
  std::vector<EntryMeta> parts;
  parts.reserve(members.size());
  for (const auto& m : members) {
    std::optional<EntryMeta> e = m.node()->meta(key);
    if (!e) return std::nullopt;
    parts.push_back(std::move(*e));
  }
  EntryMeta out = parts[0];
  bool held = true;
  for (const auto& p : parts) {
    if (p.is_tensordict() != out.is_tensordict() || (!p.is_tensordict() && p.kind != out.kind)) {
      throw TypeError("LazyStackedTensorDict: key '" + key + "' is a " + out.kind_name() + " in member 0 and a " +
                      p.kind_name() + " in another member");
    }
    if (p.kind == EntryMeta::Kind::Tensor) out.dtype = at::promote_types(out.dtype, p.dtype);
    held = held && p.value.has_value();
    for (size_t i = 0; i < out.shape.size() && p.shape.size() == out.shape.size(); ++i)
      if (p.shape[i] != out.shape[i]) out.shape[i] = -1;
  }
  out.shared = out.memmap = false;  // read() stacks the members into a new tensor
  switch (out.kind) {
    case EntryMeta::Kind::NonTensor:
      out.shape = batch_size;
      out.value = held ? read(key) : std::nullopt;  // the members hold their values: stacked in memory
      break;
    default:
      if (out.is_tensordict()) out.kind = EntryMeta::Kind::LazyStack;
      out.shape.insert(out.shape.begin() + std::min<int64_t>(stack_dim, static_cast<int64_t>(out.shape.size())),
                       static_cast<int64_t>(members.size()));
      break;
  }
  return out;
}

std::optional<Entry> LazyStackNode::read(const std::string& key) const {
  if (members.empty()) return std::nullopt;
  std::vector<Entry> parts;
  parts.reserve(members.size());
  for (const auto& m : members) {
    std::optional<Entry> e = m.node()->read(key);
    if (!e) return std::nullopt;
    parts.push_back(std::move(*e));
  }
  const Entry::Kind k0 = parts[0].kind();
  for (const auto& p : parts) {
    if (p.kind() != k0 && !(p.is_non_tensor() && parts[0].is_non_tensor())) {
      throw TypeError("LazyStackedTensorDict: key '" + key + "' is a " + Entry::kind_name(k0) + " in member 0 and a " +
                      Entry::kind_name(p.kind()) + " in another member");
    }
  }
  if (parts[0].is_tensor()) {
    std::vector<at::Tensor> ts;
    ts.reserve(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const at::Tensor& t = parts[i].tensor();
      if (!t.sizes().equals(parts[0].tensor().sizes())) {
        throw RuntimeError(
            "Failed to stack tensors within a tensordict. You can use nested tensors, padded tensors or return "
            "lists via specialized getters (key '" + key + "': member 0 has shape " +
            detail::shape_str(parts[0].tensor().sizes()) + ", member " + std::to_string(i) + " has shape " +
            detail::shape_str(t.sizes()) + "); read the members with tensordicts()");
      }
      ts.push_back(t);
    }
    return Entry(at::stack(ts, stack_dim));
  }
  if (parts[0].is_tensordict()) {
    std::vector<TensorDict> subs;
    subs.reserve(parts.size());
    for (const auto& p : parts) subs.push_back(p.tensordict());
    return Entry(detail::make_lazy(std::move(subs), stack_dim));
  }
  // non-tensor values: the dense stack of one-key TensorDicts gives upstream's NonTensorStack / NonTensorData
  std::vector<TensorDict> holders;
  holders.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    TensorDict h(members[i].batch_size(), members[i].device());
    h.set(key, parts[i]);
    holders.push_back(std::move(h));
  }
  return stack(holders, stack_dim).get_entry(key);
}

std::vector<Entry> LazyStackNode::split_value(const std::string& key, const Entry& value) const {
  const size_t n = members.size();
  std::vector<Entry> parts;
  parts.reserve(n);
  auto check_prefix = [&](const BatchSize& shape, const char* what) {
    bool ok = shape.size() >= batch_size.size();
    for (size_t i = 0; ok && i < batch_size.size(); ++i) ok = batch_size[i] < 0 || shape[i] == batch_size[i];
    if (!ok) {
      throw BatchSizeError(std::string("the ") + what + " " + key + " has shape " + detail::shape_str(shape) +
                           " which is incompatible with the batch-size " + detail::shape_str(batch_size) + ".");
    }
  };
  if (value.is_tensor()) {
    const at::Tensor& t = value.tensor();
    check_prefix(BatchSize(t.sizes().begin(), t.sizes().end()), "tensor");
    for (auto& p : t.unbind(stack_dim)) parts.emplace_back(p);
  } else if (value.is_tensordict() || value.is_dict()) {
    TensorDict v = value.is_tensordict() ? value.tensordict() : TensorDict(value.dict(), batch_size, device);
    check_prefix(v.batch_size(), "TensorDict");
    for (auto& p : v.unbind(stack_dim)) parts.emplace_back(p);
  } else if (value.is_non_tensor_data()) {
    for (size_t i = 0; i < n; ++i) parts.emplace_back(JsonValue(value.non_tensor_data().value()));
  } else if (value.is_non_tensor_stack()) {
    check_prefix(value.non_tensor_stack().batch_size(), "NonTensorStack");
    TensorDict holder(value.non_tensor_stack().batch_size());
    holder.set(key, value);
    for (auto& p : holder.unbind(stack_dim)) parts.push_back(p.get_entry(key));
  } else {
    throw TypeError("LazyStackedTensorDict: cannot set '" + key + "' to a " + Entry::kind_name(value.kind()));
  }
  if (parts.size() != n) {
    throw BatchSizeError("LazyStackedTensorDict: the value of '" + key + "' has " + std::to_string(parts.size()) +
                         " elements along the stack dim " + std::to_string(stack_dim) + ", the stack has " +
                         std::to_string(n) + " members");
  }
  return parts;
}

void LazyStackNode::put(const std::string& key, const Entry& value) {
  std::vector<Entry> parts = split_value(key, value);
  for (size_t i = 0; i < members.size(); ++i) members[i].set(key, parts[i]);
}

void LazyStackNode::put_inplace(const std::string& key, const Entry& value) {
  for (const auto& m : members) {
    if (!m.node()->read(key)) {
      throw KeyError("key '" + key + "' not found in LazyStackedTensorDict: setting a value in-place on a stack of "
                     "TensorDicts is only permitted if all members of the stack have this key");
    }
  }
  std::vector<Entry> parts = split_value(key, value);
  for (size_t i = 0; i < members.size(); ++i) members[i].set_(key, parts[i]);
}

bool LazyStackNode::erase(const std::string& key) {
  bool any = false;
  for (auto& m : members) {
    if (m.node()->read(key)) {
      m.del(key);
      any = true;
    }
  }
  return any;
}

std::vector<std::shared_ptr<Node>> LazyStackNode::child_nodes() const {
  std::vector<std::shared_ptr<Node>> out;
  out.reserve(members.size());
  for (const auto& m : members) out.push_back(m.node());
  return out;
}

// ============================================================================ index splitting
namespace {

//! batch dims an element consumes
int64_t consumed(const TensorIndex& e) {
  if (e.is_integer() || e.is_slice()) return 1;
  if (e.is_tensor()) {
    const auto st = e.tensor().scalar_type();
    return st == at::kBool || st == at::kByte ? std::max<int64_t>(e.tensor().dim(), 1) : 1;
  }
  return 0;
}

//! result dims an element produces
int64_t produced(const TensorIndex& e) {
  if (e.is_integer()) return 0;
  if (e.is_slice() || e.is_none() || e.is_boolean()) return 1;
  if (e.is_tensor()) {
    const auto st = e.tensor().scalar_type();
    return st == at::kBool || st == at::kByte ? 1 : e.tensor().dim();
  }
  return 0;
}

bool is_mask(const at::Tensor& t) { return t.scalar_type() == at::kBool || t.scalar_type() == at::kByte; }

//! how td[index] splits over the members
struct Plan {
  enum Kind { Member, List, Cat, Dense } kind = Dense;
  Index rest;                     //!< the members' index (pre ++ post): Member, List
  int64_t member = 0;             //!< Member
  std::vector<int64_t> sel;       //!< List: the members taken, in order
  int64_t out_dim = 0;            //!< List / Cat: the result dim the members lie along
  std::vector<Index> per_member;  //!< Cat: each member's index
  size_t mask_pos = 0;            //!< Cat: where the member's mask stands in per_member
  //! Cat: each member's result positions along out_dim (a mask spanning the stack dim interleaves members)
  std::vector<at::Tensor> positions;
};

//! the Cat plan of a mask over dims [src, src + m.dim()) that span the stack dim (axis = stack_dim - src)
void plan_spanning_mask(Plan& p, const at::Tensor& m, int64_t axis, int64_t n, const Index& pre, const Index& post) {
  p.kind = Plan::Cat;
  p.mask_pos = pre.size();
  at::Tensor owner = m.nonzero().select(1, axis);  // the member of every selected element, in torch's order
  for (int64_t i = 0; i < n; ++i) {
    Index mi = pre;
    mi.emplace_back(m.select(axis, i));
    mi.insert(mi.end(), post.begin(), post.end());
    p.per_member.push_back(std::move(mi));
    p.positions.push_back(owner.eq(i).nonzero().reshape({-1}));
  }
}

Plan plan_index(const LazyStackNode& node, const Index& index) {
  Plan p;
  const int64_t nd = static_cast<int64_t>(node.batch_size.size());
  const int64_t n = static_cast<int64_t>(node.members.size());
  Index ix = convert_ellipsis(index, nd);
  int tensors = 0;
  for (const auto& e : ix) {
    if (e.is_boolean()) return p;  // scalar bools: the dense path
    if (e.is_tensor()) ++tensors;
  }
  if (tensors > 1) return p;
  Index pre, post;
  std::optional<TensorIndex> st;
  int64_t src = 0, st_src = 0;
  for (const auto& e : ix) {
    const int64_t c = consumed(e);
    if (!st && c > 0 && src <= node.stack_dim && src + c > node.stack_dim) {
      st = e;
      st_src = src;
      src += c;
      continue;
    }
    if (!st) {
      pre.push_back(e);
      p.out_dim += produced(e);
    } else {
      post.push_back(e);
    }
    src += c;
  }
  p.rest = pre;
  p.rest.insert(p.rest.end(), post.begin(), post.end());
  if (!st) {
    // the index ends before the stack dim: the dims between pass through ahead of it
    p.out_dim += node.stack_dim - src;
    p.kind = Plan::List;
    for (int64_t i = 0; i < n; ++i) p.sel.push_back(i);
    return p;
  }
  if (st->is_integer()) {
    p.kind = Plan::Member;
    p.member = wrap_index(st->integer(), n, node.stack_dim);
    return p;
  }
  if (st->is_slice()) {
    SliceRange r = slice_range(st->slice(), n);
    p.kind = Plan::List;
    for (int64_t k = 0; k < r.length; ++k) p.sel.push_back(r.start + k * r.step);
    return p;
  }
  const at::Tensor t = st->tensor();
  if (is_mask(t) && st_src != node.stack_dim) {  // a mask from an earlier dim that spans the stack dim
    const int64_t axis = node.stack_dim - st_src;
    if (t.size(axis) != n) {
      throw IndexError("The shape of the mask " + detail::shape_list(t.sizes()) + " at index " + std::to_string(axis) +
                       " does not match the shape of the indexed tensordict " + detail::shape_list(node.batch_size));
    }
    plan_spanning_mask(p, t.to(at::kBool), axis, n, pre, post);
    return p;
  }
  if (is_mask(t)) {
    if (t.dim() == 0) return p;
    if (t.size(0) != n) {
      throw IndexError("The shape of the mask " + detail::shape_list(t.sizes()) + " at index " +
                       std::to_string(node.stack_dim) + " does not match the shape of the indexed tensordict " +
                       detail::shape_list(node.batch_size) + " at index " + std::to_string(node.stack_dim));
    }
    const at::Tensor m = t.to(at::kBool);
    if (t.dim() == 1) {
      p.kind = Plan::List;
      at::Tensor nz = m.nonzero().reshape({-1}).to(at::kLong).contiguous();
      const int64_t* d = nz.data_ptr<int64_t>();
      p.sel.assign(d, d + nz.numel());
      return p;
    }
    plan_spanning_mask(p, m, 0, n, pre, post);
    return p;
  }
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) return p;  // the dense path raises
  if (t.dim() == 0) {
    p.kind = Plan::Member;
    p.member = wrap_index(t.item<int64_t>(), n, node.stack_dim);
    return p;
  }
  if (t.dim() != 1) return p;
  p.kind = Plan::List;
  at::Tensor c = t.to(at::kLong).contiguous();
  const int64_t* d = c.data_ptr<int64_t>();
  for (int64_t k = 0; k < c.numel(); ++k) p.sel.push_back(wrap_index(d[k], n, node.stack_dim));
  return p;
}

//! member.index(rest), or the member itself when rest is empty (upstream keeps member identity)
TensorDict index_member(const TensorDict& m, const Index& rest) { return rest.empty() ? m : m.index(rest); }

}  // namespace

std::shared_ptr<Node> LazyStackNode::index(const Index& index) const {
  Plan p = plan_index(*this, index);
  TensorDict out;
  switch (p.kind) {
    case Plan::Member:
      out = index_member(members[static_cast<size_t>(p.member)], p.rest);
      break;
    case Plan::List: {
      std::vector<TensorDict> parts;
      parts.reserve(p.sel.size());
      for (int64_t i : p.sel) parts.push_back(index_member(members[static_cast<size_t>(i)], p.rest));
      if (parts.empty() && !members.empty()) {
        // nothing selected: member 0's result with an empty stack dim (keys and leaf shapes kept)
        TensorDict first = index_member(members[0], p.rest);
        Index none(static_cast<size_t>(p.out_dim), at::indexing::Slice());
        none.emplace_back(at::indexing::Slice(0, 0));
        out = first.node()->dense_form(first).unsqueeze(p.out_dim).index(none);
      } else if (parts.empty()) {
        out = TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(member_batch, p.out_dim, device)));
      } else {
        out = detail::make_lazy(std::move(parts), p.out_dim);
      }
      break;
    }
    case Plan::Cat: {
      std::vector<TensorDict> parts;
      std::vector<at::Tensor> pos;
      std::vector<NestedKey> common;
      for (const auto& k : keys()) common.emplace_back(k);
      for (size_t i = 0; i < members.size(); ++i) {
        TensorDict part = members[i].index(p.per_member[i]);
        // concatenated: the common keys (exclusive keys cannot be concatenated)
        parts.push_back(part.keys().size() == common.size() ? part : part.select(common));
        pos.push_back(p.positions[i]);
      }
      out = cat(parts, p.out_dim);
      // members interleave when the mask starts before the stack dim: back into torch's order
      at::Tensor order = at::cat(pos);
      if (!at::equal(order, at::arange(order.numel(), order.options()))) {
        Index back(static_cast<size_t>(p.out_dim), at::indexing::Slice());
        back.emplace_back(at::argsort(order));
        out = out.index(back);
      }
      break;
    }
    case Plan::Dense:
      out = TensorDict(std::const_pointer_cast<Node>(shared_from_this())).contiguous().index(index);
      break;
  }
  if (locked && !out.is_locked()) out.lock_();
  return out.node_with_schema();  // a typed member stays typed
}

namespace {
//! td[index] = value on a lazy stack for any index torch accepts on its batch (ints mixed with index lists,
//! several index tensors, ...): the selected elements as positions of the batch (torch's own indexing of an
//! arange, so the order and the indexed shape are torch's), each member's share as coordinates in its batch,
//! written with the member's own index_put_ (one index tensor per member batch dim).
//! the member writes of one td[idx] = value on a lazy stack. A member that refuses its part (a shape only it
//! has, a dtype, a locked member) must leave the members written before it as they were (the project's rule:
//! nothing half-written survives a failure; upstream writes member by member and keeps them). Each write but the
//! last keeps a copy of the member's rows it overwrites and the member's keys; rollback() puts the rows back and
//! removes the keys the write added, last member first
class MemberWrites {
 public:
  explicit MemberWrites(size_t writes) : left_(writes) {}

  template <class V>
  void put(const TensorDict& member, const Index& idx, const V& value) {
    TensorDict target = member;
    if (left_ > 1) {
      Saved s{target, idx, target.index(idx).clone(), {}};
      for (const auto& k : target.keys(KeysOptions().include_nested(true).non_tensor_leaves(true))) s.keys.insert(k.repr());
      saved_.push_back(std::move(s));
    }
    if (left_ > 0) --left_;
    target.index_put_(idx, value);
  }

  void rollback() noexcept {
    for (size_t i = saved_.size(); i-- > 0;) {
      Saved& s = saved_[i];
      try {
        std::vector<NestedKey> added;  // a new sub-TensorDict goes with its keys
        for (const auto& k : s.member.keys(KeysOptions().include_nested(true).non_tensor_leaves(true)))
          if (!s.keys.count(k.repr())) added.push_back(k);
        for (const auto& k : added)
          if (s.member.contains(k)) s.member.del(k);
        s.member.index_put_(s.idx, s.rows);
      } catch (...) {
        // the member refuses its own rows back (it was closed or locked meanwhile): nothing more to do
      }
    }
  }

 private:
  struct Saved {
    TensorDict member;
    Index idx;
    TensorDict rows;
    std::set<std::string> keys;
  };
  std::vector<Saved> saved_;
  size_t left_;  //!< writes still to come, this one included (the last keeps no copy)
};

void put_by_positions(const LazyStackNode& node, const Index& index, const TensorDict* td_value,
                      const at::Tensor* tensor_value, const at::Scalar* scalar_value, MemberWrites& writes) {
  const BatchSize& batch = node.batch_size;
  for (int64_t s : batch) {
    if (s < 0) {
      throw NotImplementedError("index assignment with the index " + index_repr(index) +
                                " on a LazyStackedTensorDict whose members differ in batch size");
    }
  }
  int64_t numel = 1;
  for (int64_t s : batch) numel *= s;
  at::Tensor pos;
  try {
    pos = at::arange(numel, at::kLong).view(batch).index(index);
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e, "td[" + index_repr(index) + "] = value on batch size " + detail::shape_str(batch));
  }
  const BatchSize selected(pos.sizes().begin(), pos.sizes().end());
  const at::Tensor flat = pos.reshape({-1});
  const int64_t count = flat.numel();
  // the coordinates of every selected element, one tensor per batch dim
  std::vector<at::Tensor> coords(batch.size());
  int64_t stride = 1;
  for (size_t d = batch.size(); d-- > 0;) {
    coords[d] = at::remainder(at::div(flat, stride, "floor"), batch[d]);
    stride *= batch[d];
  }
  const at::Tensor member_of = coords[static_cast<size_t>(node.stack_dim)];
  // the value, one row per selected element
  std::optional<TensorDict> rows;
  if (td_value) {
    TensorDict v = td_value->batch_size() == selected ? *td_value : td_value->expand(selected);
    rows = v.reshape({count});
  }
  for (size_t i = 0; i < node.members.size(); ++i) {
    const at::Tensor which = (member_of == static_cast<int64_t>(i)).nonzero().reshape({-1});
    if (which.numel() == 0) continue;
    Index at_member;
    for (size_t d = 0; d < batch.size(); ++d) {
      if (static_cast<int64_t>(d) != node.stack_dim) at_member.emplace_back(coords[d].index({which}));
    }
    TensorDict member = node.members[i];
    if (at_member.empty()) {  // 0-dim members: the (last) row for that member is the whole member
      const int64_t last = which[-1].item<int64_t>();
      if (scalar_value) {
        writes.put(member, {at::indexing::Ellipsis}, *scalar_value);
      } else if (rows) {
        writes.put(member, {at::indexing::Ellipsis}, rows->index({last}));
      } else {
        writes.put(member, {at::indexing::Ellipsis}, tensor_value->expand(selected).reshape({count}).index({last}));
      }
      continue;
    }
    if (scalar_value) {
      writes.put(member, at_member, *scalar_value);
    } else if (rows) {
      writes.put(member, at_member, rows->index({which}));
    } else {
      // a tensor: broadcast to each leaf's indexed shape (selected batch + the leaf's own dims), as torch's
      // tensor[index] = value does per leaf, then the member's rows of it
      TensorDict part(BatchSize{which.numel()}, member.device());
      for (const auto& kv : member.items(KeysOptions().include_nested(true).leaves_only(true))) {
        const at::Tensor& leaf = kv.second.tensor();
        std::vector<int64_t> shape(selected.begin(), selected.end());
        shape.insert(shape.end(), leaf.sizes().begin() + member.batch_dims(), leaf.sizes().end());
        at::Tensor v;
        try {
          v = tensor_value->expand(shape);
        } catch (const c10::Error& e) {
          detail::rethrow_torch_error(e, "td[idx] = tensor: cannot write key " + kv.first.repr());
        }
        std::vector<int64_t> flat_shape{count};
        flat_shape.insert(flat_shape.end(), shape.begin() + static_cast<long>(selected.size()), shape.end());
        part.set(kv.first, v.reshape(flat_shape).index({which}));
      }
      writes.put(member, at_member, part);
    }
  }
}
}  // namespace

namespace {
//! td[idx] = value on a lazy stack, member by member through `writes`
void put_members(LazyStackNode& node, const Plan& p, const Index& index, const TensorDict* td_value,
                 const at::Tensor* tensor_value, const at::Scalar* scalar_value, MemberWrites& writes) {
  auto& members = node.members;
  auto put = [&](const TensorDict& m, const Index& idx, const TensorDict* v) {
    const Index full = idx.empty() ? Index{at::indexing::Ellipsis} : idx;
    if (v) {
      writes.put(m, full, *v);
    } else if (tensor_value) {
      writes.put(m, full, *tensor_value);
    } else {
      writes.put(m, full, *scalar_value);
    }
  };
  switch (p.kind) {
    case Plan::Member:
      put(members[static_cast<size_t>(p.member)], p.rest, td_value);
      return;
    case Plan::List: {
      if (!td_value) {
        for (int64_t i : p.sel) put(members[static_cast<size_t>(i)], p.rest, nullptr);
        return;
      }
      // the value expanded to the indexed batch, then one part per member along the result's stack dim
      TensorDict v = *td_value;
      const int64_t want = static_cast<int64_t>(p.sel.size());
      const int64_t out_dims = v.batch_dims();
      if (out_dims <= p.out_dim || v.batch_size()[static_cast<size_t>(p.out_dim)] != want) {
        TensorDict probe = TensorDict(std::const_pointer_cast<Node>(node.shared_from_this())).index(index);
        BatchSize target = probe.batch_size();
        if (std::find(target.begin(), target.end(), -1) != target.end()) {
          throw BatchSizeError("LazyStackedTensorDict: cannot broadcast a value of batch " +
                               detail::shape_str(v.batch_size()) + " to the ragged indexed batch " +
                               detail::shape_str(target));
        }
        v = v.expand(target);
      }
      std::vector<TensorDict> parts = v.unbind(p.out_dim);
      for (size_t j = 0; j < p.sel.size(); ++j) put(members[static_cast<size_t>(p.sel[j])], p.rest, &parts[j]);
      return;
    }
    case Plan::Cat: {
      for (size_t i = 0; i < members.size(); ++i) {
        if (td_value) {
          // the member's rows of the value: its positions along the result's dim
          Index rows(static_cast<size_t>(p.out_dim), at::indexing::Slice());
          rows.emplace_back(p.positions[i]);
          TensorDict part = td_value->batch_dims() > p.out_dim ? td_value->index(rows) : *td_value;
          put(members[i], p.per_member[i], &part);
        } else {
          put(members[i], p.per_member[i], nullptr);
        }
      }
      return;
    }
    case Plan::Dense:
      put_by_positions(node, index, td_value, tensor_value, scalar_value, writes);
      return;
  }
}
}  // namespace

void LazyStackNode::index_put(const Index& index, const TensorDict* td_value, const at::Tensor* tensor_value,
                              const at::Scalar* scalar_value) {
  Plan p = plan_index(*this, index);
  const size_t count = p.kind == Plan::Member ? 1
                       : p.kind == Plan::List ? p.sel.size()
                                              : members.size();  // Cat; Dense: the members it reaches, at most
  MemberWrites writes(count);
  try {
    put_members(*this, p, index, td_value, tensor_value, scalar_value, writes);
  } catch (...) {
    writes.rollback();
    throw;
  }
}

namespace detail {

TensorDict lazy_contiguous(const LazyStackNode& node) {
  if (node.members.empty()) {
    BatchSize bs = node.member_batch;
    for (auto& s : bs) s = std::max<int64_t>(s, 0);
    bs.insert(bs.begin() + node.stack_dim, 0);
    return TensorDict(bs, node.device);
  }
  std::vector<TensorDict> dense;
  dense.reserve(node.members.size());
  // upstream: the common keys stacked, exclusive keys dropped
  std::vector<NestedKey> common;
  for (const auto& k : node.keys()) common.emplace_back(k);
  for (const auto& m : node.members) {
    TensorDict dm = m.node()->dense_form(m);
    dense.push_back(dm.keys().size() == common.size() ? dm : dm.select(common));
  }
  try {
    return stack(dense, node.stack_dim);
  } catch (...) {
    // the same error type, naming the first member that does not stack with member 0
    map_detail::CarriedError ce = map_detail::carry_current_exception(-1);
    size_t bad = 0;
    for (size_t j = 1; j < dense.size() && bad == 0; ++j) {
      try {
        stack({dense[0], dense[j]}, node.stack_dim);
      } catch (...) {
        bad = j;
      }
    }
    const std::string which =
        bad > 0 ? "member " + std::to_string(bad) + " does not stack with member 0" : "the members do not stack";
    ce.message = "LazyStackedTensorDict::contiguous: cannot densify the stack along dim " +
                 std::to_string(node.stack_dim) + " (" + which +
                 ": ragged leaf shapes or different keys; read the members with tensordicts() / member(i)): " +
                 ce.message;
    map_detail::rethrow(ce);
  }
}

}  // namespace detail

TensorDict LazyStackNode::to_dense() const { return detail::lazy_contiguous(*this); }

// ============================================================================ the class
static LazyStackNode& lazy_of(const TensorDict& td) {
  LazyStackNode* n = LazyStackNode::of(td);
  if (!n) {
    throw TypeError(std::string("expected a LazyStackedTensorDict, got a ") +
                    (td.defined() ? td.node()->type_name() : std::string("undefined TensorDict")));
  }
  return *n;
}

LazyStackedTensorDict::LazyStackedTensorDict(std::vector<TensorDict> tensordicts, int64_t stack_dim)
    : TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(std::move(tensordicts), stack_dim))) {}

LazyStackedTensorDict::LazyStackedTensorDict(const TensorDict& td) : TensorDict(td.node()) { lazy_of(td); }

bool LazyStackedTensorDict::is_lazy_stack(const TensorDict& td) {
  return td.defined() && static_cast<bool>(td.node()->stack_members());
}

const std::vector<TensorDict>& LazyStackedTensorDict::tensordicts() const { return lazy_of(*this).members; }
int64_t LazyStackedTensorDict::stack_dim() const { return lazy_of(*this).stack_dim; }
size_t LazyStackedTensorDict::size() const { return lazy_of(*this).members.size(); }

const TensorDict& LazyStackedTensorDict::member(int64_t i) const {
  const auto& tds = lazy_of(*this).members;
  const auto n = static_cast<int64_t>(tds.size());
  if (i < -n || i >= n) {
    throw IndexError("LazyStackedTensorDict: member " + std::to_string(i) + " is out of range for a stack of " +
                     std::to_string(n) + " (expected an index in [" + std::to_string(-n) + ", " +
                     std::to_string(n - 1) + "])");
  }
  return tds[static_cast<size_t>(i < 0 ? i + n : i)];
}

void LazyStackedTensorDict::insert(int64_t index, const TensorDict& td) {
  LazyStackNode& n = lazy_of(*this);
  if (n.locked) throw LockedError("Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` method and make sure the key is present.");
  if (!td.defined()) throw TypeError("Expected new value to be TensorDictBase instance but got an undefined TensorDict");
  BatchSize want = n.members.empty() ? n.member_batch : n.members[0].batch_size();
  for (const auto& m : n.members) {
    if (m.batch_size() != want) want = n.member_batch;
  }
  bool same = td.batch_dims() == static_cast<int64_t>(want.size());
  for (size_t i = 0; same && i < want.size(); ++i) same = want[i] < 0 || want[i] == td.batch_size()[i];
  if (!same) {
    throw ValueError("Batch sizes in tensordicts differs, LazyStackedTensorDict cannot be created. Got td[0].batch_size=" +
                     detail::shape_str(want) + " and td[-1].batch_size=" + detail::shape_str(td.batch_size()));
  }
  if (!n.members.empty() && td.device() != n.device) throw ValueError("LazyStackedTensorDict: devices differ");
  const auto size = static_cast<int64_t>(n.members.size());
  if (index < -size - 1 || index > size) {
    throw IndexError("LazyStackedTensorDict.insert: index " + std::to_string(index) + " is out of range for " +
                     std::to_string(size) + " members");
  }
  n.members.insert(n.members.begin() + (index < 0 ? index + size + 1 : index), td);
  n.refresh();
}

std::vector<at::Tensor> LazyStackedTensorDict::get_list(const NestedKey& key) const {
  std::vector<at::Tensor> out;
  const auto& ms = tensordicts();
  out.reserve(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    std::optional<Entry> e = ms[i].get_entry_opt(key);
    if (!e) throw KeyError("key " + key.repr() + " not found in member " + std::to_string(i) + " of the lazy stack");
    if (!e->is_tensor()) {
      throw TypeError("get_list: key " + key.repr() + " is a " + Entry::kind_name(e->kind()) + " in member " +
                      std::to_string(i) + ", not a tensor");
    }
    out.push_back(e->tensor());
  }
  return out;
}

at::Tensor LazyStackedTensorDict::get_padded(const NestedKey& key, double padding_value,
                                             const std::string& padding_side) const {
  if (padding_side != "right" && padding_side != "left") {
    throw ValueError("padding_side must be 'left' or 'right', got '" + padding_side + "'");
  }
  std::vector<at::Tensor> ts = get_list(key);
  if (ts.empty()) throw RuntimeError("get_padded: the lazy stack has no member");
  const int64_t nd = ts[0].dim();
  std::vector<int64_t> maxs(ts[0].sizes().begin(), ts[0].sizes().end());
  for (size_t i = 1; i < ts.size(); ++i) {
    if (ts[i].dim() != nd) {
      throw RuntimeError("get_padded: key " + key.repr() + " has " + std::to_string(nd) + " dims in member 0 and " +
                         std::to_string(ts[i].dim()) + " in member " + std::to_string(i));
    }
    for (int64_t d = 0; d < nd; ++d) maxs[static_cast<size_t>(d)] = std::max(maxs[static_cast<size_t>(d)], ts[i].size(d));
  }
  std::vector<at::Tensor> padded;
  padded.reserve(ts.size());
  for (const auto& t : ts) {
    at::Tensor p = at::full(maxs, padding_value, t.options());
    at::Tensor view = p;
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t extra = maxs[static_cast<size_t>(d)] - t.size(d);
      view = view.narrow(d, padding_side == "left" ? extra : 0, t.size(d));
    }
    view.copy_(t);
    padded.push_back(p);
  }
  return at::stack(padded, stack_dim());
}

void LazyStackedTensorDict::append(const TensorDict& td) { insert(static_cast<int64_t>(size()), td); }

LazyStackedTensorDict lazy_stack(const std::vector<TensorDict>& tds, int64_t dim) {
  return LazyStackedTensorDict(tds, dim);
}

TensorDict maybe_dense_stack(const std::vector<TensorDict>& tds, int64_t dim) {
  if (!tds.empty()) {
    try {
      return stack(tds, dim);  // dense when the inputs stack densely (stack keeps other node kinds lazy)
    } catch (const Error&) {
    }
  }
  return lazy_stack(tds, dim);
}

}  // namespace tensordict
