// TensorDict comparisons (ops.cpp: how non-tensor leaves are handled): eq / ne / lt / le / gt / ge with
// TensorDicts, tensors and scalars, their operators, and equal().
#include <algorithm>

#include "lazy_stack_node.hpp"
#include "ops_internal.hpp"

namespace tensordict {
namespace {

using namespace detail::ops;

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
    return detail::impl_of(sub).get();
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
  const TensorDictImpl& a = *detail::impl_of(self);
  return tree::rebuild(a, a.batch_size, v, {detail::impl_of(other).get()});
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
      const TensorDictImpl* a = level(tx);
      const TensorDictImpl* b = level(ty);
      if (!a || !b) return tx.equal(ty) ? tree::Step::Next : tree::Step::Stop;  // another node kind: its own form
      return same_shape(*a, *b) ? tree::Step::Enter : tree::Step::Stop;
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
  //! the dense levels the walk enters (both sides have one when visit says Enter)
  const TensorDictImpl* level(const TensorDict& sub) { return tree::level_of(sub, tree::Descend::DenseOnly); }
};

bool equal_impl(const TensorDictImpl& a, const TensorDictImpl& b) {
  if (!EqualVisitor::same_shape(a, b)) return false;
  EqualVisitor v;
  return tree::walk(a, {&b}, v);
}

}  // namespace

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

bool TensorDict::equal(const TensorDict& other) const {
  if (!other.defined()) return false;
  return detail::node_of(*this, "equal").equal(*this, other);
}

bool Node::equal(const TensorDict& self, const TensorDict& other) const {
  if (self.batch_size() != other.batch_size()) return false;
  try {
    return self.contiguous().equal(other.contiguous());  // on the dense forms
  } catch (const Error&) {
    return false;  // ragged members that do not densify: not equal to anything dense
  }
}

bool TensorDictImpl::equal(const TensorDict& self, const TensorDict& other) const {
  const TensorDictImpl* o = other.node()->dense_node();
  if (!o) return Node::equal(self, other);  // another node kind on the right: the dense forms
  return equal_impl(*this, *o);
}

bool LazyStackNode::equal(const TensorDict& self, const TensorDict& other) const {
  // two lazy stacks of the same layout: member by member
  const StackMembers b = other.node()->stack_members();
  if (b && self.batch_size() == other.batch_size() && stack_dim == b.dim && members.size() == b.members->size()) {
    for (size_t i = 0; i < members.size(); ++i)
      if (!members[i].equal((*b.members)[i])) return false;
    return true;
  }
  return Node::equal(self, other);
}

// ================================================================================================ operators
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
