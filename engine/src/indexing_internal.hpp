#pragma once
#include <algorithm>
//! Internal to engine/: an index prepared once per call against a batch size (indexing.cpp), which the reads
//! (indexing.cpp) and the writes (indexing_write.cpp) of td[idx] apply to every leaf.
#include <string>

#include "huge_page_allocator.hpp"
#include "tensor_dict_internal.hpp"
#include "torch_errors.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {
namespace detail {
namespace idx {

using at::indexing::INDEX_MAX;
using at::indexing::TensorIndex;
using detail::shape_str;

bool is_full_slice(const TensorIndex& e);
bool only_full_slices(const Index& index);
at::Tensor prealloc_zeros(at::IntArrayRef shape, const at::TensorOptions& options);
at::Tensor gather_rows(const at::Tensor& t, const at::Tensor& rows);

//! the dispatch keys of a dense strided CPU tensor, exactly as TensorImpl's constructor sets them: with autograd's
//! keys (a normal tensor) or without them (made under InferenceMode), autocast's in both. Any other key (Conjugate,
//! Negative, ZeroTensor, Python, Named, the sparse, quantized, mkldnn and nested backends, another device) makes a
//! key set differ: one compare answers them all. A set not foreseen here only sends the row to the general path
inline const c10::DispatchKeySet kPlainCpuInference =
    c10::DispatchKeySet(c10::DispatchKey::CPU) | c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::CPUBit);
inline const c10::DispatchKeySet kPlainCpu =
    kPlainCpuInference | c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::CPUBit);
inline bool plain_keys(c10::DispatchKeySet ks) { return ks == kPlainCpu || ks == kPlainCpuInference; }

//! the elements t's sizes and strides reach lie inside its storage. torch 1.13's set_(source) with a source of
//! another dtype keeps t's dtype over the source's storage: a double [5, 4] over the 80 bytes of a float [5, 4],
//! whose last rows lie past the storage. Raw writes check this; torch's own copy_ does not
inline bool within_storage(const c10::TensorImpl* t) {
  if (t->numel() == 0) return true;
  int64_t last = t->storage_offset();
  const auto sizes = t->sizes();
  const auto strides = t->strides();
  for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * std::max<int64_t>(strides[d], 0);
  const c10::StorageImpl* st = t->unsafe_storage().unsafeGetStorageImpl();
  return st != nullptr && static_cast<size_t>(last + 1) * t->dtype().itemsize() <= st->nbytes();
}

//! t.select(0, i) for i in [0, t.size(0)), made without the dispatcher when t is a normal (not inference) dense
//! CPU tensor that does not require grad and InferenceMode is off: a new TensorImpl over t's storage that shares
//! t's version counter, so an in-place write through it counts against t as a view's does (its select records
//! no graph). Others through torch's select (4 selects were most of a one-row td[i]: 13k of 15k instructions)
at::Tensor select_row(const at::Tensor& t, int64_t i);

//! an index resolved against one batch size, ready to be applied to every leaf
struct Prepared {
  enum class Kind { Identity, Int, Slice, Take, General };
  Kind kind = Kind::General;
  int64_t i = 0;       //!< Int: the row, in [0, size)
  SliceRange sl;       //!< Slice
  at::Tensor take;     //!< Take: 1-D int64 rows, bounds-checked, non-negative
  int64_t take_max = -2;  //!< Take: its largest row when known (-1: no row; -2: not known)
  Index index;         //!< General: no Ellipsis, tensors converted
  BatchSize batch;     //!< the result batch size at the top level
  size_t src_dims = 0; //!< batch dims of the indexed TensorDict (sub-TensorDicts add theirs after)
  bool preserve = true;  //!< upstream _index_preserve_data_ptr

  //! the index as libtorch's: what a sub-node of another kind is indexed with
  Index as_index() const {
    switch (kind) {
      case Kind::Identity: return {};
      case Kind::Int: return {i};
      case Kind::Slice: return {at::indexing::Slice(sl.start, sl.stop, sl.step)};
      case Kind::Take: return {take};
      case Kind::General: break;
    }
    return index;
  }

  at::Tensor get(const at::Tensor& t) const {
    switch (kind) {
      case Kind::Identity: return t;
      case Kind::Int: return select_row(t, i);
      case Kind::Slice: return t.slice(0, sl.start, sl.stop, sl.step);
      case Kind::Take: return gather_rows(t, take);
      case Kind::General: break;
    }
    return t.index(index);
  }

  //! reserves the bytes of each row along dim 0 of `t` listed in `rows` (any int64 tensor; negative rows wrap,
  //! rows out of range are left to the write's own check); a run of one row is reserved once
  static void reserve_rows(const at::Tensor& t, const at::Tensor& rows) {
    if (t.dim() == 0 || t.size(0) == 0) return;
    const int64_t row_span = backends::span_bytes(t.select(0, 0));
    const int64_t stride = t.stride(0) * static_cast<int64_t>(t.element_size());
    if (row_span <= 0 || stride < 0) return;
    const at::Tensor r = rows.to(at::kCPU, at::kLong).contiguous();
    const char* base = static_cast<const char*>(t.data_ptr());
    const int64_t* p = r.data_ptr<int64_t>();
    const int64_t n = t.size(0);
    int64_t prev = -1;
    for (int64_t k = 0; k < r.numel(); ++k) {
      const int64_t row = p[k] < 0 ? p[k] + n : p[k];
      if (row == prev || row < 0 || row >= n) continue;
      backends::reserve_for_store(t, base + row * stride, row_span);
      prev = row;
    }
  }

  //! the rows along dim 0 a general index writes (its first element that indexes dim 0: an int, a slice, an
  //! index tensor, or a mask over the leading dims: the rows where it selects anything); undefined when they
  //! cannot be told from that element
  at::Tensor general_rows(const at::Tensor& t) const {
    for (const auto& e : index) {
      if (e.is_none() || e.is_boolean()) continue;  // a new dim: the next element indexes dim 0
      if (e.is_integer()) return at::tensor({e.integer()}, at::kLong);
      if (e.is_slice()) return at::arange(t.size(0), at::kLong).slice(0, e.slice().start(), e.slice().stop(), e.slice().step());
      if (!e.is_tensor() || !e.tensor().defined()) return {};
      const at::Tensor& i = e.tensor();
      if (i.scalar_type() == at::kBool) {
        if (i.dim() == 0) return {};
        // one pass over the mask: the rows holding a selected element
        return at::nonzero(i.reshape({i.size(0), -1}).any(1)).view({-1});
      }
      return i.reshape({-1});
    }
    return {};
  }

  //! reserves the file blocks of the rows this index writes in `t`, a leaf of a memory-mapped TensorDict, so that
  //! a full disk is a BackendError before any store instead of a SIGBUS (backends' reserve_for_store). A general
  //! index (a mask over several dims, several index tensors, a slice then a mask) reserves the rows along dim 0
  //! its first element selects; a direct store into a leaf (td.get("x")[i] = v) passes here not at all
  void reserve(const at::Tensor& t) const {
    if (!backends::made_here(t) || !backends::reserves_stores(t) || t.numel() == 0) return;
    switch (kind) {
      case Kind::Identity: backends::reserve_for_store(t); return;
      case Kind::Int: backends::reserve_for_store(t.select(0, i)); return;
      case Kind::Slice:
        if (sl.length > 0) backends::reserve_for_store(t.slice(0, sl.start, sl.start + (sl.length - 1) * sl.step + 1));
        return;
      case Kind::Take: reserve_rows(t, take); return;  // each row's bytes: the first row's span, offset by the row
      case Kind::General:
        if (const at::Tensor rows = general_rows(t); rows.defined()) reserve_rows(t, rows);
        return;
    }
  }

  //! t[idx] = v with torch's broadcasting (leading 1s of v dropped, then expanded)
  void put(const at::Tensor& t, at::Tensor v) const {
    reserve(t);
    if (v.device() != t.device()) v = v.to(t.device());
    switch (kind) {
      case Kind::Identity: at::indexing::copy_to(t, v); return;
      case Kind::Int: at::indexing::copy_to(t.select(0, i), v); return;
      case Kind::Slice: at::indexing::copy_to(t.slice(0, sl.start, sl.stop, sl.step), v); return;
      case Kind::Take:
      case Kind::General: break;
    }
    // advanced indexing: torch's index_put_ refuses a value of another dtype ("Index put requires the source
    // and destination dtypes match"), as upstream's tensor[idx] = value does; basic indexing (copy_) converts
    if (kind == Kind::Take) {
      at::Tensor target = t;  // index_put_ is non-const on the handle only
      target.index_put_({TensorIndex(take)}, v);
    } else {
      at::Tensor target = t;
      target.index_put_(index, v);
    }
  }

  void fill(const at::Tensor& t, const at::Scalar& s) const {
    reserve(t);
    at::Tensor target = t;
    switch (kind) {
      case Kind::Identity: target.fill_(s); return;
      case Kind::Int: target.select(0, i).fill_(s); return;
      case Kind::Slice: target.slice(0, sl.start, sl.stop, sl.step).fill_(s); return;
      case Kind::Take: target.index_fill_(0, take, s); return;
      case Kind::General: target.index_put_(index, s); return;
    }
  }
};

//! the index resolved against `batch` once: its kind (identity, int, slice, rows, general) and result batch
Prepared prepare(const BatchSize& batch, const Index& index);
//! `indexed` followed by the dims of `own` past its first `skip` (the extra batch dims of a sub-TensorDict,
//! or the feature dims of a leaf)
BatchSize sub_batch(const BatchSize& indexed, const BatchSize& own, size_t skip);
//! upstream's errors for a malformed index, before a node of another kind indexes itself (its own checks
//! may raise other classes): the index resolved against the batch size (ragged lazy stacks are skipped)
void validate_for_node(const BatchSize& batch, const Index& index);

}  // namespace idx
}  // namespace detail
}  // namespace tensordict
