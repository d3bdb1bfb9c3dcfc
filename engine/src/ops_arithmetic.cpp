// TensorDict arithmetic (ops.cpp: how non-tensor leaves are handled): add / sub / mul / div and their
// reflected forms with TensorDicts, tensors and scalars, out of place and in place, and the operators.
#include <algorithm>
#include <iterator>
#include <set>

#include "lazy_stack_node.hpp"
#include "ops_internal.hpp"

namespace tensordict {
namespace {

using namespace detail::ops;

std::string keys_str(const std::vector<NestedKey>& keys) {
  std::string s = "[";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i].repr();
  return s + "]";
}

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
  for_each_leaf(*detail::impl_of(td), [&](const tree::KeyPath& k, const at::Tensor&) { out.insert(k.full()); });
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

void scalar_inplace(TensorDict& td, const at::Scalar& s, const char* op, bool is_add) {
  for_each_leaf(*detail::impl_of(td), [&](const tree::KeyPath& k, const at::Tensor& x) {
    check_writable(x, k, op);
    check_castable(at::result_type(x, s), x, k, op);
  });
  for_each_leaf(*detail::impl_of(td), [&](const tree::KeyPath& k, const at::Tensor& x) {
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

//! an in-place op as upstream's (torch's) rules: `result` (self op other, computed out of place) must keep
//! self's batch size and be castable to every leaf's dtype; then it is copied into the leaves (any node kind)
TensorDict& write_result(TensorDict& self, const TensorDict& result, const char* op) {
  if (result.batch_size() != self.batch_size()) {
    throw RuntimeError(std::string(op) + ": output with batch size " + shape_str(self.batch_size()) +
                       " doesn't match the broadcast batch size " + shape_str(result.batch_size()));
  }
  const TensorDict dense = detail::dense_tree(self);
  std::vector<std::pair<NestedKey, at::Tensor>> writes;
  for_each_leaf(*detail::impl_of(result), [&](const tree::KeyPath& k, const at::Tensor& r) {
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

// add_ / mul_ reach the node (node.hpp); Node's defaults are in node.cpp, the lazy stack's in lazy_stack_ops.cpp
TensorDict& TensorDict::add_(const TensorDict& other) {
  detail::node_of(*this, "add_").add_(*this, other);
  return *this;
}

void TensorDictImpl::add_(TensorDict& self, const TensorDict& other) {
  check_same_leaves(self, other, "add_");
  BatchSize bs = broadcast_batch(batch_size, other.batch_size(), "add_", "the other TensorDict's batch size");
  if (bs != batch_size) {
    throw BatchSizeError("add_: the other TensorDict's batch size " + shape_str(other.batch_size()) +
                         " does not broadcast to this batch size " + shape_str(batch_size) +
                         " (an in-place result cannot change the batch size)");
  }
  TensorDict b = expand_to(other, bs);
  for_each_leaf(*this, [&](const tree::KeyPath& k, const at::Tensor& x) {
    check_writable(x, k, "add_");
    at::Tensor y = b.get(k.full());
    auto s = broadcast_shapes(sizes_of(x), sizes_of(y));
    if (!s || *s != sizes_of(x)) {
      throw BatchSizeError("add_: the other leaf at key " + k.full().repr() + " of shape " + shape_str(y.sizes()) +
                           " does not broadcast to the leaf of shape " + shape_str(x.sizes()));
    }
    check_castable(at::result_type(x, y), x, k, "add_");
  });
  for_each_leaf(*this, [&](const tree::KeyPath& k, const at::Tensor& x) {
    try {
      at::Tensor(x).add_(b.get(k.full()));
    } catch (...) {
      throw RuntimeError("add_: key " + k.full().repr() + ": " + current_torch_message());
    }
  });
}


TensorDict& TensorDict::add_(const at::Scalar& other) {
  detail::node_of(*this, "add_").add_(*this, other);
  return *this;
}

void TensorDictImpl::add_(TensorDict& self, const at::Scalar& other) { scalar_inplace(self, other, "add_", true); }

TensorDict& TensorDict::mul_(const at::Scalar& other) {
  detail::node_of(*this, "mul_").mul_(*this, other);
  return *this;
}

void TensorDictImpl::mul_(TensorDict& self, const at::Scalar& other) { scalar_inplace(self, other, "mul_", false); }

TensorDict TensorDict::rsub(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::RSub); }
TensorDict TensorDict::rsub(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::RSub); }
TensorDict TensorDict::rdiv(const at::Tensor& other) const { return binary_tensor(*this, other, Bin::RDiv); }
TensorDict TensorDict::rdiv(const at::Scalar& other) const { return binary_scalar(*this, other, Bin::RDiv); }


TensorDict& TensorDict::add_(const at::Tensor& other) { return write_result(*this, add(other), "add_"); }
TensorDict& TensorDict::sub_(const TensorDict& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::sub_(const at::Tensor& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::sub_(const at::Scalar& other) { return write_result(*this, sub(other), "sub_"); }
TensorDict& TensorDict::mul_(const TensorDict& other) { return write_result(*this, mul(other), "mul_"); }
TensorDict& TensorDict::mul_(const at::Tensor& other) { return write_result(*this, mul(other), "mul_"); }
TensorDict& TensorDict::div_(const TensorDict& other) { return write_result(*this, div(other), "div_"); }
TensorDict& TensorDict::div_(const at::Tensor& other) { return write_result(*this, div(other), "div_"); }
TensorDict& TensorDict::div_(const at::Scalar& other) { return write_result(*this, div(other), "div_"); }

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

}  // namespace tensordict
