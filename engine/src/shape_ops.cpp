// TensorDict shape ops on the batch dims: view, reshape, flatten, unflatten, squeeze, unsqueeze, permute,
// transpose, expand, unbind, split, chunk, contiguous. Every leaf gets the same torch op with its feature
// dims carried along; sub-TensorDicts get it too (their extra batch dims preserved); results are views
// wherever torch gives views. Lock and memmap/shared flags survive (upstream test_shared_inheritance).
#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "torch_errors.hpp"
#include "tree_visitor.hpp"

namespace tensordict {

using detail::shape_list;
using detail::shape_str;

namespace {

using TensorFn = std::function<at::Tensor(const at::Tensor&)>;
using MultiFn = std::function<std::vector<at::Tensor>(const at::Tensor&)>;

//! dim in [-n, n) (n = ndim, or ndim + 1 with allow_end) -> [0, n); otherwise an error of `code` naming the op
//! (IndexError as torch, unless upstream raises another class: RuntimeError in unsqueeze, ValueError in
//! permute / transpose)
int64_t norm_dim(const char* op, int64_t dim, const BatchSize& bs, bool allow_end = false,
                 ErrorCode code = ErrorCode::Index) {
  const int64_t nd = static_cast<int64_t>(bs.size());
  const int64_t hi = allow_end ? nd + 1 : nd;
  if (hi == 0) {
    throw_error(code, std::string(op) + ": a TensorDict with batch_size " + shape_str(bs) +
                          " has no batch dimension (got dim=" + std::to_string(dim) + ")");
  }
  if (dim < -hi || dim >= hi) {
    throw_error(code, std::string(op) + ": dimension out of range (expected to be in range of [" +
                          std::to_string(-hi) + ", " + std::to_string(hi - 1) + "] for a TensorDict with batch_size " +
                          shape_str(bs) + ", but got " + std::to_string(dim) + ")");
  }
  return dim < 0 ? dim + hi : dim;
}

//! `batch` followed by the dims of t after its first `nd`
std::vector<int64_t> with_feat(const BatchSize& batch, const at::Tensor& t, int64_t nd) {
  std::vector<int64_t> s(batch);
  auto sz = t.sizes();
  s.insert(s.end(), sz.begin() + nd, sz.end());
  return s;
}

//! resolves one -1 in `sizes` so that they multiply to `numel` (torch's infer_size); RuntimeError otherwise
BatchSize infer_sizes(const char* op, BatchSize sizes, int64_t numel, const std::string& of_what) {
  int64_t known = 1;
  int64_t infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      if (infer >= 0) {
        throw RuntimeError(std::string(op) + ": only one dimension can be inferred, got shape " + shape_list(sizes));
      }
      infer = static_cast<int64_t>(i);
    } else if (sizes[i] < 0) {
      throw RuntimeError(std::string(op) + ": invalid shape dimension " + std::to_string(sizes[i]) + " in " +
                         shape_list(sizes));
    } else {
      known *= sizes[i];
    }
  }
  if (infer >= 0) {
    if (known == 0) {
      throw RuntimeError(std::string(op) + ": cannot reshape " + of_what + " of " + std::to_string(numel) +
                         " elements into shape " + shape_list(sizes) +
                         " because the unspecified dimension size -1 can be any value and is ambiguous");
    }
    if (numel % known == 0) sizes[static_cast<size_t>(infer)] = numel / known;
  }
  if (detail::prod(sizes) != numel || (infer >= 0 && sizes[static_cast<size_t>(infer)] < 0)) {
    throw RuntimeError(std::string(op) + ": shape " + shape_list(sizes) + " is invalid for " + of_what + " of " +
                       std::to_string(numel) + " elements");
  }
  return sizes;
}

//! view's new shape, with upstream's error classes: a shape holding a negative size goes through
//! _infer_size_impl (AssertionError when it does not fit); a shape of sizes alone goes to torch's view
//! (RuntimeError when the element counts differ)
BatchSize view_sizes(BatchSize shape, int64_t numel, const BatchSize& bs) {
  const bool inferred = std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s < 0; });
  try {
    return infer_sizes("view", std::move(shape), numel, "a TensorDict of batch_size " + shape_str(bs));
  } catch (const RuntimeError& e) {
    if (inferred) throw AssertionError(e.message());
    throw;
  }
}

//! upstream: torch.unflatten's RuntimeError for empty sizes
void check_unflatten_sizes(const BatchSize& sizes) {
  if (sizes.empty()) throw RuntimeError("unflatten: sizes must be non-empty");
}

//! map_batch, turning a torch failure into a RuntimeError that names the offending leaf
TensorDict guarded_map(const char* op, const TensorDict& td, const BatchSize& new_batch, const TensorFn& fn,
                       bool keep_flags) {
  try {
    return detail::map_batch(td, new_batch, fn, keep_flags);
  } catch (const c10::Error& err) {
    for (const auto& kv : td.items(KeysOptions().include_nested(true).leaves_only(true))) {
      const at::Tensor& t = kv.second.tensor();
      try {
        fn(t);
      } catch (const c10::Error& leaf_err) {
        throw RuntimeError(std::string(op) + " to batch_size " + shape_str(new_batch) + ": the leaf " +
                           kv.first.repr() + " of shape " + shape_str(t.sizes()) + " and strides " +
                           shape_list(t.strides()) + " cannot be transformed (" +
                           detail::torch_message(leaf_err, detail::TorchText::FirstLine) + ")");
      }
    }
    throw RuntimeError(std::string(op) + " to batch_size " + shape_str(new_batch) + " failed: " +
                       detail::torch_message(err, detail::TorchText::FirstLine));
  }
}

//! result of map_batch without the memmap/shared flags but locked like td (upstream's propagate_lock)
TensorDict map_keep_lock(const char* op, const TensorDict& td, const BatchSize& new_batch, const TensorFn& fn) {
  TensorDict out = guarded_map(op, td, new_batch, fn, /*keep_flags=*/false);
  if (td.is_locked()) out.lock_();
  return out;
}

//! the tree visitor's rebuild for map_batch_multi: the rebuild makes output 0, the visitor builds outputs
//! 1..n-1 alongside (one stack of levels per depth), from the same fn call per leaf
struct MultiVisitor : detail::tree::RebuildVisitor {
  //! the levels of outputs 1..n-1 at one depth, and the source level's batch dims
  struct Levels {
    std::vector<TensorDict> outs;
    size_t old_nd = 0;
  };
  const std::vector<BatchSize>& new_batches;
  const MultiFn& fn;
  bool keep_flags;
  size_t n;
  std::vector<Levels> stack;  //!< innermost last
  Levels done;                //!< the levels of the sub-level just rebuilt
  MultiVisitor(const std::vector<BatchSize>& nbs, const MultiFn& f, bool k)
      : new_batches(nbs), fn(f), keep_flags(k), n(nbs.size()) {}

  TensorDictImpl& level(size_t i) { return *static_cast<TensorDictImpl*>(stack.back().outs[i - 1].node().get()); }
  void check_parts(const std::vector<at::Tensor>& parts, const std::string& key) {
    if (parts.size() != n) {
      throw RuntimeError("splitting the entry '" + key + "' gave " + std::to_string(parts.size()) +
                         " parts, expected " + std::to_string(n));
    }
  }
  TensorDict make_level(const detail::tree::KeyPath&, const TensorDictImpl& src, BatchSize nb0) {
    Levels l;
    l.old_nd = src.batch_size.size();
    for (size_t i = 1; i < n; ++i) {
      BatchSize nb = stack.empty() ? new_batches[i]
                                   : detail::tree::child_batch(level(i).batch_size, stack.back().old_nd, src.batch_size);
      l.outs.push_back(detail::make_empty(src, std::move(nb)));
      static_cast<TensorDictImpl*>(l.outs.back().node().get())->entries.reserve(src.entries.size());
    }
    stack.push_back(std::move(l));
    return detail::make_empty(src, std::move(nb0));
  }
  void leave(const detail::tree::KeyPath&) {
    done = std::move(stack.back());
    stack.pop_back();
  }
  at::Tensor tensor(const detail::tree::KeyPath& at, const at::Tensor& t, const detail::tree::Matched&) {
    std::vector<at::Tensor> parts = fn(t);
    check_parts(parts, at.name());
    for (size_t i = 1; i < n; ++i) level(i).entries.emplace_back(at.name(), Entry(std::move(parts[i])));
    return n ? std::move(parts[0]) : at::Tensor();
  }
  std::optional<Entry> non_tensor(const detail::tree::KeyPath& at, const Entry& e, const TensorDictImpl& src,
                                  const BatchSize& nb0, const detail::tree::Matched&) {
    const size_t old_nd = src.batch_size.size();
    if (e.is_non_tensor_data()) {
      const NonTensorData& d = e.non_tensor_data();
      for (size_t i = 1; i < n; ++i) {
        level(i).entries.emplace_back(
            at.name(), Entry(NonTensorData(d.value(), detail::tree::child_batch(level(i).batch_size, old_nd, d.batch_size()))));
      }
      return Entry(NonTensorData(d.value(), detail::tree::child_batch(nb0, old_nd, d.batch_size())));
    }
    const NonTensorStack& s = e.non_tensor_stack();
    std::vector<at::Tensor> parts = fn(s.positions());
    check_parts(parts, at.name());
    std::vector<Entry> out;
    for (size_t i = 0; i < n; ++i) {
      at::Tensor p = parts[i].contiguous();
      std::vector<JsonValue> vals;
      vals.reserve(static_cast<size_t>(p.numel()));
      const int64_t* pp = p.data_ptr<int64_t>();
      for (int64_t j = 0; j < p.numel(); ++j) vals.push_back(s.values()[static_cast<size_t>(pp[j])]);
      Entry v(NonTensorStack(std::move(vals), BatchSize(p.sizes().begin(), p.sizes().end())));
      if (i == 0) {
        out.push_back(std::move(v));
      } else {
        level(i).entries.emplace_back(at.name(), std::move(v));
      }
    }
    return n ? std::optional<Entry>(std::move(out[0])) : std::nullopt;
  }
  const TensorDictImpl* descend(const detail::tree::KeyPath&, const TensorDict& sub, const detail::tree::Matched&) {
    return detail::impl_of(sub).get();
  }
  std::optional<TensorDict> sub_result(const detail::tree::KeyPath& at, const TensorDict& sub, TensorDict out0, bool) {
    const TensorDictImpl& src = *detail::impl_of(sub);
    for (size_t i = 1; i < n; ++i) level(i).entries.emplace_back(at.name(), Entry(finish(src, done.outs[i - 1])));
    return finish(src, std::move(out0));
  }
  TensorDict finish(const TensorDictImpl& src, TensorDict r) {
    if (keep_flags) {
      TensorDictImpl& o = *static_cast<TensorDictImpl*>(r.node().get());
      o.is_memmap = src.is_memmap;
      o.is_shared = src.is_shared;
      if (src.locked) r.lock_();
    }
    return r;
  }
};

//! the multi-output twin of map_batch: fn splits a tensor whose leading dims are the old batch dims into
//! new_batches.size() tensors (unbind, split); sub-TensorDicts and non-tensors follow
std::vector<TensorDict> map_batch_multi(const TensorDict& td_in, const std::vector<BatchSize>& new_batches,
                                        const MultiFn& fn, bool keep_flags) {
  const TensorDict td = detail::dense_tree(td_in);  // other node kinds below: on their dense form
  const TensorDictImpl& src = *detail::impl_of(td);
  if (new_batches.empty()) return {};
  MultiVisitor v(new_batches, fn, keep_flags);
  TensorDict first = detail::tree::rebuild(src, new_batches[0], v);
  std::vector<TensorDict> result;
  result.reserve(new_batches.size());
  result.push_back(v.finish(src, std::move(first)));
  for (auto& o : v.done.outs) result.push_back(v.finish(src, std::move(o)));
  return result;
}

// ============================================================================ lazy stacks
// upstream's LazyStackedTensorDict shape ops: every member gets the op on its own batch dims (the stack dim
// taken out) and the result is a lazy stack again, its stack dim moved (upstream _lazy.py _unsqueeze,
// _squeeze, _permute, _transpose, _view, split / chunk). Members' results are their own views, so writes
// through the result reach the members; ragged members stay ragged. An op that would merge or split the
// stack dim itself runs on the dense form (the members must then stack).

//! a lazy stack along `stack_dim` of op(member) for every member, locked when `self` is
TensorDict restack(const TensorDict& self, const LazyStackNode& lz, int64_t stack_dim,
                   const std::function<TensorDict(const TensorDict&)>& op) {
  std::vector<TensorDict> out;
  out.reserve(lz.members.size());
  for (const auto& m : lz.members) out.push_back(op(m));
  TensorDict r = detail::make_lazy(std::move(out), stack_dim);
  if (self.is_locked() && !r.is_locked()) r.lock_();
  return r;
}

//! batch dim d (not the stack dim) of the stack -> the same dim of a member
int64_t member_dim(int64_t d, int64_t stack_dim) { return d < stack_dim ? d : d - 1; }

//! the lazy form of view / reshape to `shape` (already inferred): when the dims before the stack dim and the
//! stack dim itself are kept, each member takes the rest; nullopt otherwise
std::optional<TensorDict> lazy_view(const TensorDict& self, const LazyStackNode& lz, const BatchSize& bs,
                                    const BatchSize& shape, bool reshape) {
  const size_t s = static_cast<size_t>(lz.stack_dim);
  if (shape.size() <= s) return std::nullopt;
  for (size_t i = 0; i <= s; ++i)
    if (shape[i] != bs[i]) return std::nullopt;
  BatchSize mshape(shape.begin(), shape.end());
  mshape.erase(mshape.begin() + static_cast<int64_t>(s));
  return restack(self, lz, lz.stack_dim, [&](const TensorDict& m) {
    return reshape ? m.reshape(mshape) : m.view(mshape);
  });
}

}  // namespace

// ============================================================================ view / reshape / flatten
TensorDict LazyStackNode::view(const TensorDict& self, BatchSize shape) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    if (shape == bs) return self;
    if (std::find(bs.begin(), bs.end(), -1) == bs.end()) {
      shape = view_sizes(std::move(shape), self.numel(), bs);
      if (shape == bs) return self;
      if (auto r = lazy_view(self, *lz, bs, shape, false)) return *r;
    }
  }
  return Node::view(self, shape);
}

TensorDict TensorDictImpl::view(const TensorDict& self, BatchSize shape) const {
  const BatchSize& bs = batch_size;
  shape = view_sizes(std::move(shape), self.numel(), bs);
  if (shape == bs) return self;
  const int64_t nd = self.batch_dims();
  return guarded_map("view", self, shape,
                     [&](const at::Tensor& t) { return t.view(with_feat(shape, t, nd)); }, true);
}

TensorDict LazyStackNode::reshape(const TensorDict& self, BatchSize shape) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    if (shape == bs) return self;
    if (std::find(bs.begin(), bs.end(), -1) == bs.end()) {
      shape = infer_sizes("reshape", std::move(shape), self.numel(), "a TensorDict of batch_size " + shape_str(bs));
      if (shape == bs) return self;
      if (auto r = lazy_view(self, *lz, bs, shape, true)) return *r;
    }
  }
  return Node::reshape(self, shape);
}

TensorDict TensorDictImpl::reshape(const TensorDict& self, BatchSize shape) const {
  const BatchSize& bs = batch_size;
  shape = infer_sizes("reshape", std::move(shape), self.numel(), "a TensorDict of batch_size " + shape_str(bs));
  if (shape == bs) return self;
  const int64_t nd = self.batch_dims();
  return guarded_map("reshape", self, shape,
                     [&](const at::Tensor& t) { return t.reshape(with_feat(shape, t, nd)); }, true);
}

TensorDict LazyStackNode::flatten(const TensorDict& self, int64_t start_dim, int64_t end_dim) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    const int64_t s = norm_dim("flatten", start_dim, bs);
    const int64_t e = norm_dim("flatten", end_dim, bs);
    const int64_t sd = lz->stack_dim;
    if (s <= e && e < sd) {  // before the stack dim: it moves left by the dims merged
      return restack(self, *lz, sd - (e - s), [s, e](const TensorDict& m) { return m.flatten(s, e); });
    }
    if (s <= e && s > sd) return restack(self, *lz, sd, [s, e](const TensorDict& m) { return m.flatten(s - 1, e - 1); });
    if (s == e) return self;
  }
  return Node::flatten(self, start_dim, end_dim);
}

TensorDict TensorDictImpl::flatten(const TensorDict& self, int64_t start_dim, int64_t end_dim) const {
  const BatchSize& bs = batch_size;
  const int64_t s = norm_dim("flatten", start_dim, bs);
  const int64_t e = norm_dim("flatten", end_dim, bs);
  if (s > e) {
    throw ValueError("flatten: start_dim cannot come after end_dim (got start_dim=" + std::to_string(start_dim) +
                     ", end_dim=" + std::to_string(end_dim) + " for batch_size " + shape_str(bs) + ")");
  }
  if (s == e) return self;  // like torch.flatten: nothing to merge
  BatchSize nb(bs.begin(), bs.begin() + s);
  nb.push_back(detail::prod(at::IntArrayRef(bs).slice(static_cast<size_t>(s), static_cast<size_t>(e - s + 1))));
  nb.insert(nb.end(), bs.begin() + e + 1, bs.end());
  return guarded_map("flatten", self, nb, [s, e](const at::Tensor& t) { return t.flatten(s, e); }, true);
}

TensorDict LazyStackNode::unflatten(const TensorDict& self, int64_t dim, BatchSize sizes) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    const int64_t d = norm_dim("unflatten", dim, bs);
    const int64_t sd = lz->stack_dim;
    check_unflatten_sizes(sizes);
    if (d < sd) {
      const int64_t grown = static_cast<int64_t>(sizes.size()) - 1;
      return restack(self, *lz, sd + grown, [&](const TensorDict& m) { return m.unflatten(d, sizes); });
    }
    if (d > sd) return restack(self, *lz, sd, [&](const TensorDict& m) { return m.unflatten(d - 1, sizes); });
  }
  return Node::unflatten(self, dim, sizes);
}

TensorDict TensorDictImpl::unflatten(const TensorDict& self, int64_t dim, BatchSize sizes) const {
  const BatchSize& bs = batch_size;
  const int64_t d = norm_dim("unflatten", dim, bs);
  check_unflatten_sizes(sizes);
  sizes = infer_sizes("unflatten", std::move(sizes), bs[static_cast<size_t>(d)],
                      "batch dim " + std::to_string(d) + " of batch_size " + shape_str(bs));
  BatchSize nb(bs.begin(), bs.begin() + d);
  nb.insert(nb.end(), sizes.begin(), sizes.end());
  nb.insert(nb.end(), bs.begin() + d + 1, bs.end());
  const int64_t nd = self.batch_dims();
  // torch.unflatten is a view
  return guarded_map("unflatten", self, nb, [&](const at::Tensor& t) { return t.view(with_feat(nb, t, nd)); }, true);
}

// ============================================================================ squeeze / unsqueeze
TensorDict LazyStackNode::squeeze(const TensorDict& self, std::optional<int64_t> dim_opt) const {
  if (!members.empty() && !dim_opt) {
    const BatchSize bs = self.batch_size();
    TensorDict r = self;  // every singleton dim, last first (the stack dim too: its one member)
    for (int64_t i = static_cast<int64_t>(bs.size()) - 1; i >= 0; --i)
      if (bs[static_cast<size_t>(i)] == 1) r = r.squeeze(i);
    return r;
  }
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const int64_t dim = *dim_opt;
    const BatchSize bs = self.batch_size();
    const int64_t d = norm_dim("squeeze", dim, bs);
    const int64_t sd = lz->stack_dim;
    if (bs[static_cast<size_t>(d)] != 1) return self;  // like torch: a non-singleton dim is left alone
    if (d == sd) {  // a stack of one: its member (upstream returns tensordicts[0])
      TensorDict m = lz->members[0];
      return m;
    }
    return restack(self, *lz, d < sd ? sd - 1 : sd, [&](const TensorDict& m) { return m.squeeze(member_dim(d, sd)); });
  }
  return Node::squeeze(self, dim_opt);
}

TensorDict TensorDictImpl::squeeze(const TensorDict& self, std::optional<int64_t> dim_opt) const {
  if (dim_opt) {
    const int64_t dim = *dim_opt;
    const BatchSize& bs = batch_size;
    if (bs.empty()) {  // like a 0-dim tensor: dims -1 and 0 are accepted and change nothing
      if (dim < -1 || dim > 0) norm_dim("squeeze", dim, bs);
      return self;
    }
    const int64_t d = norm_dim("squeeze", dim, bs);
    if (bs[static_cast<size_t>(d)] != 1) return self;  // like torch: a non-singleton dim is left alone
    BatchSize nb = bs;
    nb.erase(nb.begin() + d);
    return guarded_map("squeeze", self, nb, [d](const at::Tensor& t) { return t.squeeze(d); }, true);
  }
  const BatchSize& bs = batch_size;
  std::vector<int64_t> dims;
  BatchSize nb;
  for (size_t i = 0; i < bs.size(); ++i) {
    if (bs[i] == 1) {
      dims.push_back(static_cast<int64_t>(i));
    } else {
      nb.push_back(bs[i]);
    }
  }
  if (dims.empty()) return self;
  return guarded_map("squeeze", self, nb,
                     [&](const at::Tensor& t) {
                       at::Tensor r = t;
                       for (auto it = dims.rbegin(); it != dims.rend(); ++it) r = r.squeeze(*it);
                       return r;
                     },
                     true);
}

TensorDict LazyStackNode::unsqueeze(const TensorDict& self, int64_t dim) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const int64_t d = norm_dim("unsqueeze", dim, self.batch_size(), /*allow_end=*/true, ErrorCode::Runtime);
    const int64_t sd = lz->stack_dim;
    if (d <= sd) return restack(self, *lz, sd + 1, [d](const TensorDict& m) { return m.unsqueeze(d); });
    return restack(self, *lz, sd, [d](const TensorDict& m) { return m.unsqueeze(d - 1); });
  }
  return Node::unsqueeze(self, dim);
}

TensorDict TensorDictImpl::unsqueeze(const TensorDict& self, int64_t dim) const {
  const BatchSize& bs = batch_size;
  const int64_t d = norm_dim("unsqueeze", dim, bs, /*allow_end=*/true, ErrorCode::Runtime);
  BatchSize nb = bs;
  nb.insert(nb.begin() + d, 1);
  return guarded_map("unsqueeze", self, nb, [d](const at::Tensor& t) { return t.unsqueeze(d); }, true);
}

// ============================================================================ permute / transpose / expand
namespace {
//! dims of permute checked against bs (ValueError as upstream) and normalized; a permutation of the first k
//! dims (k <= batch dims) is accepted, like upstream
std::vector<int64_t> checked_permutation(std::vector<int64_t> dims, const BatchSize& bs) {
  const size_t nd = bs.size();
  if (dims.size() > nd) {
    throw ValueError("permute: got " + std::to_string(dims.size()) + " dims " + shape_list(dims) +
                     " for a TensorDict with " + std::to_string(nd) + " batch dims (batch_size " + shape_str(bs) + ")");
  }
  for (auto& d : dims) d = norm_dim("permute", d, bs, false, ErrorCode::Value);
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != static_cast<int64_t>(i)) {
      std::vector<int64_t> want(dims.size());
      for (size_t j = 0; j < want.size(); ++j) want[j] = static_cast<int64_t>(j);
      throw ValueError("permute: cannot compute the permutation, got dims=" + shape_list(dims) +
                       " but expected a permutation of " + shape_list(want) + " (batch_size " + shape_str(bs) + ")");
    }
  }
  return dims;
}

//! a lazy stack permuted by `dims` (checked, normalized): the members get the permutation without the stack
//! dim, the stack dim goes where `dims` puts it
TensorDict lazy_permute(const TensorDict& self, const LazyStackNode& lz, std::vector<int64_t> dims, size_t nd) {
  for (size_t i = dims.size(); i < nd; ++i) dims.push_back(static_cast<int64_t>(i));
  const int64_t sd = lz.stack_dim;
  int64_t new_sd = 0;
  std::vector<int64_t> mdims;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == sd) {
      new_sd = static_cast<int64_t>(i);
    } else {
      mdims.push_back(member_dim(dims[i], sd));
    }
  }
  return restack(self, lz, new_sd, [&](const TensorDict& m) { return m.permute(mdims); });
}
}  // namespace

TensorDict LazyStackNode::permute(const TensorDict& self, std::vector<int64_t> dims) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    dims = checked_permutation(std::move(dims), bs);
    bool identity = true;
    for (size_t i = 0; i < dims.size(); ++i) identity = identity && dims[i] == static_cast<int64_t>(i);
    if (identity) return self;
    return lazy_permute(self, *lz, std::move(dims), bs.size());
  }
  return Node::permute(self, dims);
}

TensorDict TensorDictImpl::permute(const TensorDict& self, std::vector<int64_t> dims) const {
  const BatchSize& bs = batch_size;
  dims = checked_permutation(std::move(dims), bs);
  bool identity = true;
  for (size_t i = 0; i < dims.size(); ++i) identity = identity && dims[i] == static_cast<int64_t>(i);
  if (identity) return self;
  BatchSize nb = bs;
  for (size_t i = 0; i < dims.size(); ++i) nb[i] = bs[static_cast<size_t>(dims[i])];
  return guarded_map("permute", self, nb,
                     [&](const at::Tensor& t) {
                       std::vector<int64_t> full = dims;
                       for (int64_t i = static_cast<int64_t>(dims.size()); i < t.dim(); ++i) full.push_back(i);
                       return t.permute(full);
                     },
                     true);
}

TensorDict LazyStackNode::transpose(const TensorDict& self, int64_t dim0, int64_t dim1) const {
  if (!members.empty()) {
    const LazyStackNode* lz = this;
    const BatchSize bs = self.batch_size();
    const int64_t d0 = norm_dim("transpose", dim0, bs, false, ErrorCode::Value);
    const int64_t d1 = norm_dim("transpose", dim1, bs, false, ErrorCode::Value);
    if (d0 == d1) return self;
    std::vector<int64_t> dims(bs.size());
    for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
    std::swap(dims[static_cast<size_t>(d0)], dims[static_cast<size_t>(d1)]);
    return lazy_permute(self, *lz, std::move(dims), bs.size());
  }
  return Node::transpose(self, dim0, dim1);
}

TensorDict TensorDictImpl::transpose(const TensorDict& self, int64_t dim0, int64_t dim1) const {
  const BatchSize& bs = batch_size;
  const int64_t d0 = norm_dim("transpose", dim0, bs, false, ErrorCode::Value);
  const int64_t d1 = norm_dim("transpose", dim1, bs, false, ErrorCode::Value);
  if (d0 == d1) return self;
  BatchSize nb = bs;
  std::swap(nb[static_cast<size_t>(d0)], nb[static_cast<size_t>(d1)]);
  return guarded_map("transpose", self, nb, [d0, d1](const at::Tensor& t) { return t.transpose(d0, d1); }, true);
}

TensorDict TensorDictImpl::expand(const TensorDict& self, BatchSize shape) const {
  const BatchSize& bs = batch_size;
  const size_t nd = bs.size();
  if (shape.size() < nd) {
    throw RuntimeError("expand: the number of sizes provided (" + std::to_string(shape.size()) +
                       ") must be greater or equal to the number of batch dimensions in the TensorDict (" +
                       std::to_string(nd) + "), got shape " + shape_list(shape) + " for batch_size " + shape_str(bs));
  }
  const size_t offset = shape.size() - nd;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < offset) {
      if (shape[i] < 0) {
        throw RuntimeError("expand: the expanded size " + std::to_string(shape[i]) +
                           " isn't allowed in a leading, non-existing dimension " + std::to_string(i) + " (shape " +
                           shape_list(shape) + ", batch_size " + shape_str(bs) + ")");
      }
      continue;
    }
    const int64_t old = bs[i - offset];
    if (shape[i] == -1) {
      shape[i] = old;
    } else if (shape[i] < 0) {
      throw RuntimeError("expand: invalid size " + std::to_string(shape[i]) + " at dimension " + std::to_string(i) +
                         " of " + shape_list(shape));
    } else if (old != 1 && old != shape[i]) {
      throw RuntimeError("expand: the expanded size of the TensorDict (" + std::to_string(shape[i]) +
                         ") must match the existing size (" + std::to_string(old) + ") at non-singleton dimension " +
                         std::to_string(i) + ". Target sizes: " + shape_list(shape) + ". batch_size: " + shape_str(bs));
    }
  }
  const int64_t ond = static_cast<int64_t>(nd);
  // upstream propagates the lock but not the memmap/shared flags (stride-0 views are not the stored data)
  return map_keep_lock("expand", self, shape,
                       [&](const at::Tensor& t) { return t.expand(with_feat(shape, t, ond)); });
}

// ============================================================================ unbind / split / chunk
std::vector<TensorDict> TensorDict::unbind(int64_t dim) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).unbind(dim));
  return detail::node_of(*this, "unbind").unbind(*this, dim);
}

std::vector<TensorDict> Node::unbind(const TensorDict& self, int64_t dim) const {
  if (auto view = dense_view()) return view->unbind(self, dim);  // a store: on its storage
  return self.contiguous().unbind(dim);                           // on its dense form
}

std::vector<TensorDict> LazyStackNode::unbind(const TensorDict& self, int64_t dim) const {
  const int64_t dd = detail::normalize_dim(dim, self.batch_dims());
  if (dd == stack_dim) return members;  // the members themselves (upstream test_unbind_lazystack)
  const int64_t md = dd < stack_dim ? dd : dd - 1;
  const int64_t sd = dd < stack_dim ? stack_dim - 1 : stack_dim;
  std::vector<std::vector<TensorDict>> parts;
  for (const auto& m : members) parts.push_back(m.unbind(md));
  const size_t count = parts.empty() ? 0 : parts[0].size();
  for (const auto& p : parts) {
    if (p.size() != count) {
      throw RuntimeError("unbind: the members of the lazy stack differ in size along dim " + std::to_string(dim));
    }
  }
  std::vector<TensorDict> out;
  for (size_t j = 0; j < count; ++j) {
    std::vector<TensorDict> col;
    for (auto& p : parts) col.push_back(p[j]);
    out.push_back(detail::make_lazy(std::move(col), sd));
  }
  return out;
}

std::vector<TensorDict> TensorDictImpl::unbind(const TensorDict& self, int64_t dim) const {
  const BatchSize& bs = batch_size;
  const int64_t d = norm_dim("unbind", dim, bs);
  BatchSize nb = bs;
  nb.erase(nb.begin() + d);
  std::vector<BatchSize> nbs(static_cast<size_t>(bs[static_cast<size_t>(d)]), nb);
  return map_batch_multi(self, nbs, [d](const at::Tensor& t) { return t.unbind(d); }, true);
}

std::vector<TensorDict> TensorDict::split(int64_t split_size, int64_t dim) const {
  const BatchSize bs = batch_size();
  if (bs.empty()) throw RuntimeError("split: TensorDict with empty batch size is not splittable");
  const int64_t d = norm_dim("split", dim, bs);
  const int64_t n = bs[static_cast<size_t>(d)];
  if (n < 0) return contiguous().split(split_size, dim);  // a ragged dim (a lazy stack's): on the dense form
  if (split_size < 0) {
    throw RuntimeError("split expects split_size be non-negative, but got split_size=" + std::to_string(split_size));
  }
  if (split_size == 0 && n != 0) {
    throw RuntimeError("split: split_size can only be 0 if dimension size is 0, but got dimension size of " +
                       std::to_string(n) + " (batch_size " + shape_str(bs) + ", dim " + std::to_string(d) + ")");
  }
  std::vector<int64_t> sizes;
  if (n == 0) {
    sizes.push_back(0);
  } else {
    for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  }
  return split(sizes, d);
}

std::vector<TensorDict> TensorDict::split(std::vector<int64_t> split_sizes, int64_t dim) const {
  return detail::node_of(*this, "split").split(*this, std::move(split_sizes), dim);
}

std::vector<TensorDict> Node::split(const TensorDict& self, std::vector<int64_t> split_sizes, int64_t dim) const {
  return self.contiguous().split(split_sizes, dim);  // on its dense form
}

namespace {
//! split's checks of split_sizes against the batch; the normalized dim
int64_t checked_split(const BatchSize& bs, const std::vector<int64_t>& split_sizes, int64_t dim) {
  if (bs.empty()) throw RuntimeError("split: TensorDict with empty batch size is not splittable");
  const int64_t d = norm_dim("split", dim, bs);
  const int64_t n = bs[static_cast<size_t>(d)];
  int64_t total = 0;
  for (auto s : split_sizes) {
    if (s < 0) {
      throw RuntimeError("split expects split_sizes to have only non-negative entries, but got split_sizes=" +
                         shape_list(split_sizes));
    }
    total += s;
  }
  if (total != n) {
    throw RuntimeError("Split method expects split_size to sum exactly to " + std::to_string(n) +
                       " (tensor's size at dimension " + std::to_string(d) + "), but got split_size=" +
                       shape_list(split_sizes));
  }
  return d;
}
}  // namespace

//! a lazy stack splits without densifying (upstream): along the stack dim into lazy stacks of its members,
//! across it member by member; a ragged dim (-1) or an empty part runs on the dense form
std::vector<TensorDict> LazyStackNode::split(const TensorDict& self, std::vector<int64_t> split_sizes,
                                             int64_t dim) const {
  const BatchSize bs = self.batch_size();
  const bool lazy = !members.empty() && (bs.empty() || bs[static_cast<size_t>(norm_dim("split", dim, bs))] >= 0) &&
                    std::find(split_sizes.begin(), split_sizes.end(), 0) == split_sizes.end();
  if (!lazy) return Node::split(self, std::move(split_sizes), dim);
  const int64_t d = checked_split(bs, split_sizes, dim);
  const int64_t sd = stack_dim;
  std::vector<TensorDict> out;
  if (d == sd) {  // consecutive members, each part a lazy stack of its own
    size_t at = 0;
    for (auto size : split_sizes) {
      std::vector<TensorDict> part(members.begin() + static_cast<int64_t>(at),
                                   members.begin() + static_cast<int64_t>(at) + size);
      at += static_cast<size_t>(size);
      out.push_back(detail::make_lazy(std::move(part), sd));
    }
  } else {  // every member split along its dim; part j stacks the members' parts j
    std::vector<std::vector<TensorDict>> parts;
    for (const auto& m : members) parts.push_back(m.split(split_sizes, member_dim(d, sd)));
    for (size_t j = 0; j < split_sizes.size(); ++j) {
      std::vector<TensorDict> col;
      for (auto& p : parts) col.push_back(p[j]);
      out.push_back(detail::make_lazy(std::move(col), sd));
    }
  }
  for (auto& t : out)
    if (self.is_locked() && !t.is_locked()) t.lock_();
  return out;
}

std::vector<TensorDict> TensorDictImpl::split(const TensorDict& self, std::vector<int64_t> split_sizes,
                                              int64_t dim) const {
  const BatchSize& bs = batch_size;
  const int64_t d = checked_split(bs, split_sizes, dim);
  std::vector<BatchSize> nbs;
  nbs.reserve(split_sizes.size());
  for (auto s : split_sizes) {
    BatchSize nb = bs;
    nb[static_cast<size_t>(d)] = s;
    nbs.push_back(std::move(nb));
  }
  return map_batch_multi(self, nbs,
                         [&](const at::Tensor& t) { return at::split_with_sizes(t, split_sizes, d); }, true);
}

std::vector<TensorDict> TensorDict::chunk(int64_t chunks, int64_t dim) const {
  if (chunks < 1) throw ValueError("chunks must be a strictly positive integer, got " + std::to_string(chunks) + ".");
  const BatchSize bs = batch_size();
  if (bs.empty()) throw RuntimeError("chunk: TensorDict with empty batch size is not splittable");
  const int64_t d = norm_dim("chunk", dim, bs);
  const int64_t n = bs[static_cast<size_t>(d)];
  if (n < 0) return contiguous().chunk(chunks, dim);  // a ragged dim (a lazy stack's): on the dense form
  return split(std::max<int64_t>(1, (n + chunks - 1) / chunks), d);
}

TensorDict TensorDict::to_tensordict() const {
  if (typed_) return with_schema(nullptr).to_tensordict();  // a plain TensorDict, whatever wrapped it
  return detail::node_of(*this, "to_tensordict").to_tensordict(*this);
}

TensorDict Node::to_tensordict(const TensorDict& self) const {
  if (dense_view()) return self.clone();  // a store: a copy of its storage
  return self.contiguous();               // a new dense TensorDict already
}

TensorDict TensorDictImpl::to_tensordict(const TensorDict& self) const { return self.clone(); }

TensorDict TensorDict::contiguous() const { return detail::node_of(*this, "contiguous").contiguous(*this); }

TensorDict Node::contiguous(const TensorDict& self) const {
  if (auto view = dense_view()) return view->contiguous(self);  // a store: its storage's leaves
  return to_dense();
}

TensorDict LazyStackNode::contiguous(const TensorDict&) const { return detail::lazy_contiguous(*this); }

TensorDict TensorDictImpl::contiguous(const TensorDict& self) const {
  return map_keep_lock("contiguous", self, batch_size, [](const at::Tensor& t) { return t.contiguous(); });
}

}  // namespace tensordict
