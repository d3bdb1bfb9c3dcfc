// TensorDict indexing on batch dims: td.index(idx) (upstream td[idx]) and the index preparation it shares
// with td.index_put_(idx, value) (upstream td[idx] = value, indexing_write.cpp: lazy preallocation of
// missing keys). Upstream: _td.py
// TensorDict._index_tensordict, base.py __getitem__ / __setitem__, _SubTensorDict._set_str.
//
// Every index is first "prepared" once per call (Ellipsis expanded over the batch dims, index tensors
// checked and converted, the result batch size computed), then applied to every leaf. Hot shapes get
// their own kinds: a single int (select), a single slice (slice), a 1-D long index or a 1-D bool mask
// (index_select with a bounds-checked, non-negative index computed once instead of once per leaf). Row
// writes of contiguous CPU leaves of the value's dtype are plain memcpy's (no dispatcher round trip), and
// large preallocated leaves and gather results live on huge pages (huge_page_allocator.hpp).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include <c10/core/InferenceMode.h>

#include "lazy_stack_node.hpp"
#include "indexing_internal.hpp"
#include "spec_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"
#include "torch_errors.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {
namespace detail {
namespace idx {

bool is_full_slice(const TensorIndex& e) {
  return e.is_slice() && e.slice().start() == 0 && e.slice().stop() == INDEX_MAX && e.slice().step() == 1;
}

//! upstream returns the TensorDict itself for td[:], td[...], td[:, :, ...] whatever its batch dims (a 0-dim
//! TensorDict and more full slices than batch dims included): every element a full slice, at most one Ellipsis
bool only_full_slices(const Index& index) {
  if (index.empty()) return true;
  int n_ellipsis = 0;
  for (const auto& e : index) {
    if (e.is_ellipsis()) {
      ++n_ellipsis;
    } else if (!is_full_slice(e)) {
      return false;
    }
  }
  return n_ellipsis <= 1;
}

//! zeros of `shape` for a preallocated leaf: 2 MiB and more on huge pages (see huge_page_allocator.hpp)
at::Tensor prealloc_zeros(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor t = detail::huge_page_empty(shape, options, detail::kHugePageBytes, /*zeroed=*/true);
  return t.defined() ? t : at::zeros(shape, options);
}

//! rows of a gather (td[long index] / td[mask]) from 1 MiB up go to huge pages too: a fresh 4 KiB-paged
//! result costs more in first touches than the gather itself
at::Tensor gather_rows(const at::Tensor& t, const at::Tensor& rows) {
  if (t.is_cpu() && t.dim() > 0 && !t.requires_grad()) {  // out= variants do not record autograd
    auto shape = t.sizes().vec();
    shape[0] = rows.numel();
    at::Tensor out = detail::huge_page_empty(shape, t.options(), size_t{1} << 20, /*zeroed=*/false);
    if (out.defined()) return at::index_select_out(out, t, 0, rows);
  }
  return at::index_select(t, 0, rows);
}


//! upstream _check_for_invalid_index: a TensorDict without batch dims takes only None / True / 0-d bool
//! tensors (and tuples of None)
void check_zero_dim(const Index& index) {
  bool ok = !index.empty();
  for (const auto& e : index)
    if (!e.is_none()) ok = false;
  if (index.size() == 1) {
    const auto& e = index[0];
    if ((e.is_boolean() && e.boolean()) ||
        (e.is_tensor() && e.tensor().defined() && e.tensor().dim() == 0 && e.tensor().scalar_type() == at::kBool)) {
      ok = true;
    }
  }
  if (!ok) {
    throw RuntimeError("indexing a tensordict with td.batch_dims==0 is not permitted. Got index " + index_repr(index) +
                       ".");
  }
}

//! a 1-D long index over a dim of `size`: bounds checked (torch's text), negatives wrapped
at::Tensor checked_rows(const at::Tensor& t, int64_t size, int64_t* max_row) {
  at::Tensor c = t.contiguous();
  const int64_t* d = c.data_ptr<int64_t>();
  const int64_t n = c.numel();
  bool negative = false;
  int64_t most = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t v = d[j];
    if (v < -size || v >= size) {
      throw IndexError("index " + std::to_string(v) + " is out of bounds for dimension 0 with size " +
                       std::to_string(size));
    }
    negative |= v < 0;
    most = std::max(most, v < 0 ? v + size : v);
  }
  if (max_row) *max_row = most;
  if (negative) c = at::where(c < 0, c + size, c);
  return c;
}

at::Tensor select_row(const at::Tensor& t, int64_t i) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // i was checked against the batch size; a leaf resized or set_ to fewer rows behind the TensorDict's back is
  // checked against its own: torch's select raises its IndexError
  if (impl->key_set() != kPlainCpu || impl->dim() == 0 || i < 0 || i >= impl->sizes()[0] ||
      c10::InferenceMode::is_enabled() || (impl->autograd_meta() != nullptr && impl->requires_grad()) ||
      !impl->unsafe_storage())
    return t.select(0, i);
  at::Tensor out =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(impl->unsafe_storage()), impl->key_set(), impl->dtype());
  c10::TensorImpl* o = out.unsafeGetTensorImpl();
  o->set_sizes_and_strides(impl->sizes().slice(1), impl->strides().slice(1));
  o->set_storage_offset(impl->storage_offset() + i * impl->stride(0));
  o->set_version_counter(impl->version_counter());
  return out;
}

//! the fast kinds for a leading int / slice on batch dim 0 (the rest of the index selects everything)
void lead_int(Prepared& p, const at::indexing::TensorIndex& e, const BatchSize& batch) {
  p.kind = Prepared::Kind::Int;
  p.i = wrap_index(e.integer(), batch[0], 0);
  p.batch.assign(batch.begin() + 1, batch.end());
}
void lead_slice(Prepared& p, const at::indexing::TensorIndex& e, const BatchSize& batch) {
  p.kind = Prepared::Kind::Slice;
  p.sl = slice_range(e.slice(), batch[0]);
  p.batch = batch;
  p.batch[0] = p.sl.length;
}

Prepared prepare(const BatchSize& batch, const Index& index) {
  const int64_t nd = static_cast<int64_t>(batch.size());
  Prepared p;
  p.src_dims = batch.size();
  if (only_full_slices(index)) {
    p.kind = Prepared::Kind::Identity;
    p.batch = batch;
    return p;
  }
  // hot paths: a single int or slice
  if (index.size() == 1 && nd > 0) {
    const auto& e = index[0];
    if (e.is_integer()) {
      lead_int(p, e, batch);
      return p;
    }
    if (e.is_slice()) {
      if (is_full_slice(e)) {
        p.kind = Prepared::Kind::Identity;
        p.batch = batch;
        return p;
      }
      lead_slice(p, e, batch);
      p.preserve = e.slice().start() == 0;
      return p;
    }
  }
  if (index.empty() || (index.size() == 1 && index[0].is_ellipsis())) {
    p.kind = Prepared::Kind::Identity;
    p.batch = batch;
    return p;
  }
  if (nd == 0) check_zero_dim(index);
  p.preserve = index_preserves_data_ptr(index);

  // index tensors: dtype checked, 0-d integer tensors are ints (torch selects with them), int32 -> int64,
  // uint8 masks -> bool
  Index idx;
  idx.reserve(index.size());
  for (const auto& e : index) {
    if (!e.is_tensor()) {
      idx.push_back(e);
      continue;
    }
    const at::Tensor& t = e.tensor();
    if (!t.defined()) throw TypeError("an undefined tensor cannot be used as an index");
    const auto st = t.scalar_type();
    if (st != at::kLong && st != at::kInt && st != at::kBool && st != at::kByte) {
      throw TypeError(std::string("tensors used as indices must be long, int, byte or bool tensors, got a ") +
                      c10::toString(st) + " tensor in index " + index_repr(index));
    }
    if (t.dim() == 0 && (st == at::kLong || st == at::kInt)) {
      idx.emplace_back(t.item<int64_t>());
    } else if (st == at::kInt) {
      idx.emplace_back(t.to(at::kLong));
    } else if (st == at::kByte) {
      idx.emplace_back(t.to(at::kBool));
    } else {
      idx.push_back(e);
    }
  }
  idx = convert_ellipsis(idx, nd);
  if (is_full_slice_index(idx, nd)) {
    p.kind = Prepared::Kind::Identity;
    p.batch = batch;
    return p;
  }

  // one leading element followed by full slices: the fast kinds
  bool rest_full = !idx.empty() && nd > 0;
  for (size_t k = 1; k < idx.size() && rest_full; ++k) rest_full = is_full_slice(idx[k]);
  if (rest_full) {
    const auto& e = idx[0];
    if (e.is_integer()) {
      lead_int(p, e, batch);
      return p;
    }
    if (e.is_slice()) {
      lead_slice(p, e, batch);
      return p;
    }
    if (e.is_tensor() && e.tensor().device().is_cpu()) {
      const at::Tensor& t = e.tensor();
      if (t.scalar_type() == at::kLong && t.dim() == 1) {
        p.kind = Prepared::Kind::Take;
        p.take = checked_rows(t, batch[0], &p.take_max);
        p.batch = batch;
        p.batch[0] = p.take.numel();
        return p;
      }
      const int64_t k = t.dim();
      if (t.scalar_type() == at::kBool && k >= 1 && k <= nd &&
          t.sizes().equals(at::IntArrayRef(batch.data(), static_cast<size_t>(k)))) {
        // the mask becomes row indices once, instead of once per leaf
        at::Tensor nz = at::nonzero(t);  // [nnz, k]
        p.batch.assign(batch.begin() + k, batch.end());
        p.batch.insert(p.batch.begin(), nz.size(0));
        if (k == 1) {
          p.kind = Prepared::Kind::Take;
          p.take = nz.view({-1});
          p.take_max = p.take.numel() == 0 ? -1 : p.take.data_ptr<int64_t>()[p.take.numel() - 1];  // ascending
        } else {
          p.kind = Prepared::Kind::General;
          p.index.reserve(static_cast<size_t>(k));
          for (int64_t j = 0; j < k; ++j) p.index.emplace_back(nz.select(1, j));
        }
        return p;
      }
    }
  }
  p.kind = Prepared::Kind::General;
  p.batch = getitem_batch_size(batch, idx);
  p.index = std::move(idx);
  return p;
}

//! `indexed` followed by the dims of `own` past its first `skip` (the extra batch dims of a sub-TensorDict,
//! or the feature dims of a leaf)
BatchSize sub_batch(const BatchSize& indexed, const BatchSize& own, size_t skip) {
  BatchSize b = indexed;
  if (own.size() > skip) b.insert(b.end(), own.begin() + static_cast<long>(skip), own.end());
  return b;
}

//! upstream's errors for a malformed index, before a node of another kind indexes itself (its own checks
//! may raise other classes): the index resolved against the batch size (ragged lazy stacks are skipped)
void validate_for_node(const BatchSize& batch, const Index& index) {
  if (std::find(batch.begin(), batch.end(), -1) != batch.end()) return;
  (void)getitem_batch_size(batch, index);
}

}  // namespace idx
}  // namespace detail

namespace {
using namespace detail::idx;
using detail::shape_str;

//! the tree visitor's rebuild for td[index]: every tensor (and NonTensorStack positions) through the
//! prepared index; sub-levels get the indexed batch + their extra dims; another node kind indexes itself
struct IndexVisitor : detail::tree::RebuildVisitor {
  const Prepared& p;
  explicit IndexVisitor(const Prepared& prepared) : p(prepared) {}

  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return detail::idx::sub_batch(p.batch, own, p.src_dims); }
  at::Tensor tensor(const detail::tree::KeyPath&, const at::Tensor& t, const detail::tree::Matched&) { return p.get(t); }
  const TensorDictImpl* descend(const detail::tree::KeyPath&, const TensorDict& sub, const detail::tree::Matched&) {
    return detail::tree::level_of(sub, detail::tree::Descend::DenseOnly);
  }
  std::optional<TensorDict> other_node(const detail::tree::KeyPath&, const TensorDict& sub, const BatchSize&,
                                       const detail::tree::Matched&) {
    return p.kind == Prepared::Kind::Identity ? sub : sub.index(p.as_index());
  }
  std::optional<Entry> non_tensor(const detail::tree::KeyPath&, const Entry& e, const TensorDictImpl&, const BatchSize&,
                                  const detail::tree::Matched&) {
    if (e.is_non_tensor_data()) {
      const auto& d = e.non_tensor_data();
      return Entry(NonTensorData(d.value(), detail::idx::sub_batch(p.batch, d.batch_size(), p.src_dims)));
    }
    NonTensorStack s = e.non_tensor_stack().remap([this](const at::Tensor& pos) { return p.get(pos); });
    // upstream: the selected values all equal -> a NonTensorData of the indexed batch
    if (s.all_equal()) return Entry(NonTensorData(s.at(0), s.batch_size()));
    return Entry(std::move(s));
  }
  std::optional<TensorDict> sub_result(const detail::tree::KeyPath&, const TensorDict& sub, TensorDict out, bool) {
    return finish(*detail::impl_of(sub), std::move(out));
  }
  TensorDict finish(const TensorDictImpl& src, TensorDict result) {
    if (p.preserve && (src.is_memmap || src.is_shared)) {
      // upstream: a view-preserving index of a memmap / shared TensorDict is memmap / shared, and locked
      TensorDictImpl& out = *static_cast<TensorDictImpl*>(result.node().get());
      out.is_memmap = src.is_memmap;
      out.is_shared = !src.is_memmap && src.is_shared;
      result.lock_();
    }
    return result;
  }
};

TensorDict index_impl(const TensorDictImpl& src, const Prepared& p, BatchSize new_batch) {
  IndexVisitor v(p);
  return v.finish(src, detail::tree::rebuild(src, std::move(new_batch), v));
}

}  // namespace

// ============================================================================ resolved indices
std::optional<ResolvedIndex> Node::resolve(const Index&) const { return std::nullopt; }

std::shared_ptr<Node> Node::index_at(const ResolvedIndex&) const {
  throw NotImplementedError("index_at (a resolved index) on a " + type_name());
}

// ============================================================================ public API
TensorDict TensorDict::index(const Index& index) const {
  if (typed_) {  // the untyped index, then the schema put back (one handle copy, no revalidation)
    TensorDict out = with_schema(nullptr).index(index);
    if (out.defined()) out.typed_ = typed_;
    return out;
  }
  if (node_ && only_full_slices(index)) return *this;  // upstream: td[:], td[...] are td, whatever the batch
  if (!dense_) {
    if (!node_) return TensorDict::undefined();
    // a store node resolves the index once (upstream's errors included) and indexes with that
    if (std::optional<ResolvedIndex> r = node_->resolve(index)) return TensorDict(node_->index_at(*r));
    if (!node_->dense_view()) validate_for_node(node_->batch_size, index);
    return TensorDict(node_->index(index));
  }
  Prepared p = prepare(d()->batch_size, index);
  if (p.kind == Prepared::Kind::Identity) return *this;
  try {
    BatchSize b = p.batch;
    TensorDict out = index_impl(*d(), p, std::move(b));
    detail::carry_view_origin(*d(), index, out);  // a view of a memmap / shared td keeps its spec
    return out;
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e,
                                "td.index(" + index_repr(index) + ") on batch size " + shape_str(d()->batch_size));
  }
}

}  // namespace tensordict
