// TensorDict reductions (ops.cpp: how non-tensor leaves are handled): all / any (whole or along a batch
// dim), sum / mean over batch dims, and their reduce=True forms.
#include <algorithm>

#include "ops_internal.hpp"

namespace tensordict {
namespace {

using namespace detail::ops;

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
  for_each_leaf(*detail::impl_of(self), [&](const tree::KeyPath& k, const at::Tensor& t) {
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
  for_each_leaf(*detail::impl_of(self), [&](const tree::KeyPath& k, const at::Tensor& x) {
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

// ================================================================================================ reductions
bool TensorDict::all() const { return all_any(*this, true); }
bool TensorDict::any() const { return all_any(*this, false); }
TensorDict TensorDict::all(int64_t dim) const { return all_any_dim(*this, dim, true); }
TensorDict TensorDict::any(int64_t dim) const { return all_any_dim(*this, dim, false); }

// sum / mean reach the node (node.hpp): the dense node reduces its leaves; Node's default reduces the dense
// form (self.contiguous())
namespace {
std::optional<std::vector<int64_t>> one_dim(std::optional<int64_t> dim) {
  return dim ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{*dim}) : std::nullopt;
}
}  // namespace

TensorDict TensorDict::sum(std::optional<int64_t> dim, bool keepdim) const {
  return detail::node_of(*this, "sum").reduce(*this, /*mean=*/false, one_dim(dim), keepdim);
}
TensorDict TensorDict::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return detail::node_of(*this, "sum").reduce(*this, /*mean=*/false, dims, keepdim);
}
TensorDict TensorDict::mean(std::optional<int64_t> dim, bool keepdim) const {
  return detail::node_of(*this, "mean").reduce(*this, /*mean=*/true, one_dim(dim), keepdim);
}
TensorDict TensorDict::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return detail::node_of(*this, "mean").reduce(*this, /*mean=*/true, dims, keepdim);
}
at::Tensor TensorDict::sum_reduce(const std::optional<std::vector<int64_t>>& dims, bool keepdim) const {
  return detail::node_of(*this, "sum_reduce").reduce_leaves(*this, /*mean=*/false, dims, keepdim);
}
at::Tensor TensorDict::mean_reduce(const std::optional<std::vector<int64_t>>& dims, bool keepdim) const {
  return detail::node_of(*this, "mean_reduce").reduce_leaves(*this, /*mean=*/true, dims, keepdim);
}

TensorDict Node::reduce(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                        bool keepdim) const {
  const TensorDict dense = self.contiguous();  // on its dense form
  return dense.node()->reduce(dense, mean, dims, keepdim);
}
TensorDict TensorDictImpl::reduce(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                                  bool keepdim) const {
  return reduce_td(self, mean ? Red::Mean : Red::Sum, dims, keepdim);
}
at::Tensor Node::reduce_leaves(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                               bool keepdim) const {
  return reduce_all_leaves(self.contiguous(), mean ? Red::Mean : Red::Sum, dims, keepdim);  // on its dense form
}
at::Tensor TensorDictImpl::reduce_leaves(const TensorDict& self, bool mean,
                                         const std::optional<std::vector<int64_t>>& dims, bool keepdim) const {
  return reduce_all_leaves(self, mean ? Red::Mean : Red::Sum, dims, keepdim);
}

}  // namespace tensordict
