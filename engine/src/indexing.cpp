// TensorDict indexing on batch dims: td.index(idx) (upstream td[idx]) and td.index_put_(idx, value)
// (upstream td[idx] = value) with lazy preallocation of missing keys. Upstream: _td.py
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

#include "huge_page_allocator.hpp"
#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"
#include "torch_errors.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {
namespace {

using at::indexing::INDEX_MAX;
using at::indexing::TensorIndex;
using detail::shape_str;

const char* const kSharedInplaceError =
    "You're attempting to update a leaf in-place with a shared tensordict, but the new value does not match "
    "the previous. If you're using NonTensorData, see the class documentation to see how to properly "
    "pre-allocate memory in shared contexts.";

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

//! an index resolved against one batch size, ready to be applied to every leaf
struct Prepared {
  enum class Kind { Identity, Int, Slice, Take, General };
  Kind kind = Kind::General;
  int64_t i = 0;       //!< Int: the row, in [0, size)
  SliceRange sl;       //!< Slice
  at::Tensor take;     //!< Take: 1-D int64 rows, bounds-checked, non-negative
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
      case Kind::Int: return t.select(0, i);
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
at::Tensor checked_rows(const at::Tensor& t, int64_t size) {
  at::Tensor c = t.contiguous();
  const int64_t* d = c.data_ptr<int64_t>();
  const int64_t n = c.numel();
  bool negative = false;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t v = d[j];
    if (v < -size || v >= size) {
      throw IndexError("index " + std::to_string(v) + " is out of bounds for dimension 0 with size " +
                       std::to_string(size));
    }
    negative |= v < 0;
  }
  if (negative) c = at::where(c < 0, c + size, c);
  return c;
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
        p.take = checked_rows(t, batch[0]);
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

// ----------------------------------------------------------------------------------- reading
//! `indexed` followed by the dims of `own` past its first `skip` (the extra batch dims of a sub-TensorDict,
//! or the feature dims of a leaf)
BatchSize sub_batch(const BatchSize& indexed, const BatchSize& own, size_t skip) {
  BatchSize b = indexed;
  if (own.size() > skip) b.insert(b.end(), own.begin() + static_cast<long>(skip), own.end());
  return b;
}

//! the tree visitor's rebuild for td[index]: every tensor (and NonTensorStack positions) through the
//! prepared index; sub-levels get the indexed batch + their extra dims; another node kind indexes itself
struct IndexVisitor : detail::tree::RebuildVisitor {
  const Prepared& p;
  explicit IndexVisitor(const Prepared& prepared) : p(prepared) {}

  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return ::tensordict::sub_batch(p.batch, own, p.src_dims); }
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
      return Entry(NonTensorData(d.value(), ::tensordict::sub_batch(p.batch, d.batch_size(), p.src_dims)));
    }
    NonTensorStack s = e.non_tensor_stack().remap([this](const at::Tensor& pos) { return p.get(pos); });
    // upstream: the selected values all equal -> a NonTensorData of the indexed batch
    if (s.all_equal()) return Entry(NonTensorData(s.at(0), s.batch_size()));
    return Entry(std::move(s));
  }
  std::optional<TensorDict> sub_result(const detail::tree::KeyPath&, const TensorDict& sub, TensorDict out, bool) {
    return finish(*sub.impl(), std::move(out));
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

// ----------------------------------------------------------------------------------- writing
//! memcpy of a large block in pieces of 256 KiB. Above its non-temporal threshold (a share of the L3) glibc's memcpy
//! switches to non-temporal stores
//! and, when source and destination sit at about the same offset in their pages (a memmap row into another
//! memmap, a page-aligned buffer into a file), to a loop that writes four pages far apart in turn. Into a
//! fresh file mapping the kernel then faults and allocates the page cache page by page instead of in large
//! folios. 245 MB written in 24 MB blocks into a fresh memmap file: whole blocks 0.07 s (2.8k faults) or,
//! page-aligned source, 0.25 s (61k faults); 256 KiB pieces 0.066 s (2.8k faults) either way, and 0.009 s
//! against 0.014 s when the pages are already there
void copy_in_pieces(char* dst, const char* src, size_t n) {
  constexpr size_t kPiece = size_t{256} << 10;
  if (n < 4 * kPiece) {
    std::memcpy(dst, src, n);
    return;
  }
  for (size_t done = 0; done < n; done += kPiece) std::memcpy(dst + done, src + done, std::min(kPiece, n - done));
}

//! dst[row(s)] = v as memcpy when both are contiguous CPU tensors of one dtype and v has exactly the
//! indexed shape; false when the general path must do it
bool memcpy_rows(const at::Tensor& dst, const at::Tensor& v, const Prepared& p) {
  if (p.kind != Prepared::Kind::Int && p.kind != Prepared::Kind::Slice) return false;
  if (dst.layout() != at::kStrided || v.layout() != at::kStrided) return false;
  if (!dst.is_cpu() || !v.is_cpu() || dst.scalar_type() != v.scalar_type()) return false;
  if (c10::isQIntType(dst.scalar_type())) return false;
  if (dst.dim() == 0 || !dst.is_contiguous() || !v.is_contiguous()) return false;
  if (dst.requires_grad() || v.requires_grad()) return false;
  if (dst.is_conj() || v.is_conj() || dst.is_neg() || v.is_neg()) return false;
  const auto ds = dst.sizes();
  const auto vs = v.sizes();
  const auto row_shape = ds.slice(1);
  int64_t rows = 1;
  int64_t start = p.i;
  int64_t step = 1;
  if (p.kind == Prepared::Kind::Int) {
    if (!vs.equals(row_shape)) return false;
  } else {
    if (vs.size() != ds.size() || vs[0] != p.sl.length || !vs.slice(1).equals(row_shape)) return false;
    rows = p.sl.length;
    start = p.sl.start;
    step = p.sl.step;
  }
  if (v.is_alias_of(dst)) return false;  // possible overlap: let torch sort it out
  const size_t esize = dst.element_size();
  int64_t row_numel = 1;
  for (auto s : row_shape) row_numel *= s;
  const size_t row_bytes = static_cast<size_t>(row_numel) * esize;
  if (rows > 0 && row_bytes > 0) {
    const size_t stride_bytes = static_cast<size_t>(dst.stride(0)) * esize;
    char* base = static_cast<char*>(dst.data_ptr()) + static_cast<size_t>(start) * stride_bytes;
    const char* src = static_cast<const char*>(v.data_ptr());
    // into a file mapping, the file blocks of the rows are reserved first (memmap_file.hpp, reserve_for_store:
    // one fallocate per 256 KiB block the first time a store reaches it, a bit test after): a full disk is a
    // BackendError before any store instead of a SIGBUS, and a large block is allocated in one call (245 MB in
    // 24 MB blocks into a fresh memmap, 0.063 s -> 0.047 s)
    if (step == 1 && (rows == 1 || stride_bytes == row_bytes)) {
      const size_t n = row_bytes * static_cast<size_t>(rows);
      if (backends::made_here(dst)) backends::reserve_for_store(dst, base, static_cast<int64_t>(n));
      copy_in_pieces(base, src, n);
    } else {
      if (backends::made_here(dst) && backends::reserves_stores(dst)) {
        for (int64_t r = 0; r < rows; ++r)
          backends::reserve_for_store(dst, base + static_cast<size_t>(r * step) * stride_bytes, static_cast<int64_t>(row_bytes));
      }
      for (int64_t r = 0; r < rows; ++r) {
        char* row = base + static_cast<size_t>(r * step) * stride_bytes;
        copy_in_pieces(row, src + static_cast<size_t>(r) * row_bytes, row_bytes);
      }
    }
  }
  dst.unsafeGetTensorImpl()->bump_version();
  return true;
}

void put_leaf(const at::Tensor& dst, const at::Tensor& v, const Prepared& p, const std::string& key) {
  if (memcpy_rows(dst, v, p)) return;
  try {
    p.put(dst, v);
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e, "td[idx] = value: cannot write a value of shape " + shape_str(v.sizes()) +
                                       " into key '" + key + "' of shape " + shape_str(dst.sizes()));
  }
}

//! every leaf key of value (nested, non-tensors included) exists in dst: the write adds no key
bool keys_exist(const TensorDict& dst, const TensorDict& value) {
  for (const auto& k : value.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true)))
    if (!dst.contains(k)) return false;
  return true;
}

//! upstream __setitem__: a value whose batch differs from the indexed batch is expanded on the left when
//! its dims are the trailing ones, else re-batched on a shallow copy (its leaves already carry the indexed
//! dims), else RuntimeError "indexed destination TensorDict batch size is ...". A value without batch dims
//! whose keys all exist is broadcast as torch broadcasts t[:2] = row (upstream's `indexed_bs[-0:]` slip
//! refuses it); one that would preallocate new keys is refused as upstream.
TensorDict broadcast_value(const TensorDictImpl& dst, const BatchSize& ibs, const TensorDict& value,
                           const Index& orig) {
  const BatchSize& vb = value.batch_size();
  if (vb == ibs) return value;
  const bool trailing = vb.size() <= ibs.size() && std::equal(vb.begin(), vb.end(), ibs.end() - static_cast<long>(vb.size()));
  auto expand = [&]() {
    const size_t nv = vb.size();
    return detail::map_batch(
        value, ibs,
        [&](const at::Tensor& t) {
          BatchSize shape = ibs;
          shape.insert(shape.end(), t.sizes().begin() + static_cast<long>(nv), t.sizes().end());
          return t.expand(shape);
        },
        false);
  };
  if (trailing && !vb.empty()) return expand();
  try {
    TensorDict c = value.copy();
    c.set_batch_size(ibs);
    return c;
  } catch (const Error&) {
    if (vb.empty() && keys_exist(TensorDict(std::const_pointer_cast<Node>(dst.shared_from_this())), value)) {
      return expand();
    }
    throw RuntimeError("indexed destination TensorDict batch size is " + shape_str(ibs) + " (batch_size = " +
                         shape_str(dst.batch_size) + ", index=" + index_repr(orig) +
                         "), which differs from the source batch size " + shape_str(vb));
  }
}

void assign_stack(NonTensorStack& s, const Prepared& p, const Entry& value) {
  auto select = [&p](const at::Tensor& pos) { return p.get(pos); };
  if (value.is_non_tensor_data()) {
    s.assign(select, {value.non_tensor_data().value()});
  } else {
    s.assign(select, value.non_tensor_stack().values());
  }
}

void put_non_tensor(const TensorDictImpl& dst, Entry& de, const std::string& key, const Entry& ve, const Prepared& p,
                    const BatchSize& ibs) {
  if (!ve.is_non_tensor()) {
    throw TypeError(std::string("td[idx] = value: key '") + key + "' holds a " + Entry::kind_name(de.kind()) +
                    " but the value holds a " + Entry::kind_name(ve.kind()));
  }
  if (detail::prod(ibs) == 0) return;  // nothing selected
  if (de.is_non_tensor_data()) {
    const JsonValue& cur = de.non_tensor_data().value();
    bool differs = false;
    if (ve.is_non_tensor_data()) {
      differs = ve.non_tensor_data().value() != cur;
    } else {
      for (const auto& x : ve.non_tensor_stack().values()) differs = differs || x != cur;
    }
    if (!differs) return;
    if (dst.is_shared || dst.is_memmap) throw RuntimeError(kSharedInplaceError);
    // a NonTensorData that receives another value somewhere becomes a stack (even when locked, as upstream)
    NonTensorStack s = NonTensorStack::filled(cur, de.non_tensor_data().batch_size());
    assign_stack(s, p, ve);
    de = Entry(std::move(s));
  } else {
    NonTensorStack s = de.non_tensor_stack();
    assign_stack(s, p, ve);
    de = Entry(std::move(s));
  }
}

void put_td(TensorDictImpl& dst, const Prepared& p, const BatchSize& ibs, const TensorDict& value_in,
            const Index& orig);

//! a key of the value that dst lacks: zeros of the full size (upstream _SubTensorDict._set_str), then written
void preallocate(TensorDictImpl& dst, const std::string& key, const Entry& ve, const Prepared& p, const BatchSize& ibs,
                 const Index& orig) {
  if (dst.locked) detail::check_unlocked(dst, "td[idx] = value would add the key '" + key + "'");
  const size_t ni = ibs.size();
  switch (ve.kind()) {
    case Entry::Kind::Tensor: {
      const at::Tensor& v = ve.tensor();
      BatchSize shape = sub_batch(dst.batch_size, BatchSize(v.sizes().begin(), v.sizes().end()), ni);
      at::Tensor t = prealloc_zeros(shape, v.options().device(dst.device ? *dst.device : v.device()));
      dst.entries.emplace_back(key, Entry(t));
      put_leaf(t, v, p, key);
      return;
    }
    case Entry::Kind::TensorDict: {
      TensorDict vs = ve.tensordict();
      TensorDict sub = detail::make_empty(dst, sub_batch(dst.batch_size, vs.batch_size(), ni));
      dst.entries.emplace_back(key, Entry(sub));
      put_td(*sub.impl(), p, sub_batch(ibs, vs.batch_size(), ni), vs, orig);
      return;
    }
    case Entry::Kind::NonTensorData: {
      // expanded: every slot gets the value
      const auto& d = ve.non_tensor_data();
      dst.entries.emplace_back(key, Entry(NonTensorData(d.value(), sub_batch(dst.batch_size, d.batch_size(), ni))));
      return;
    }
    case Entry::Kind::NonTensorStack: {
      // unwritten slots hold null (upstream's None)
      NonTensorStack s =
          NonTensorStack::filled(JsonValue(), sub_batch(dst.batch_size, ve.non_tensor_stack().batch_size(), ni));
      assign_stack(s, p, ve);
      dst.entries.emplace_back(key, Entry(std::move(s)));
      return;
    }
    default:
      throw TypeError(std::string("td[idx] = value: cannot preallocate key '") + key + "' from a " +
                      Entry::kind_name(ve.kind()));
  }
}

void put_td(TensorDictImpl& dst, const Prepared& p, const BatchSize& ibs, const TensorDict& value_in,
            const Index& orig) {
  TensorDict value = broadcast_value(dst, ibs, value_in.is_dense() ? value_in : value_in.contiguous(), orig);
  const TensorDictImpl& vimpl = *value.impl();
  const size_t n = vimpl.entries.size();
  for (size_t j = 0; j < n; ++j) {
    const std::string& key = vimpl.entries[j].first;
    const Entry& ve = vimpl.entries[j].second;
    // same key order is the common case: try the same position first
    Entry* de = (j < dst.entries.size() && dst.entries[j].first == key) ? &dst.entries[j].second : dst.find(key);
    if (!de) {
      preallocate(dst, key, ve, p, ibs, orig);
      continue;
    }
    switch (de->kind()) {
      case Entry::Kind::Tensor:
        if (!ve.is_tensor()) {
          throw TypeError("td[idx] = value: key '" + key + "' holds a Tensor but the value holds a " +
                          Entry::kind_name(ve.kind()));
        }
        put_leaf(de->tensor(), ve.tensor(), p, key);
        break;
      case Entry::Kind::TensorDict: {
        if (ve.is_tensor()) {
          // upstream _set_at_str: sub_td[idx] = tensor, i.e. every leaf of the sub-TensorDict filled with it
          TensorDict sub = de->tensordict();
          sub.index_put_(p.as_index(), ve.tensor());
          break;
        }
        if (!ve.is_tensordict()) {
          throw TypeError("td[idx] = value: key '" + key + "' holds a TensorDict but the value holds a " +
                          Entry::kind_name(ve.kind()));
        }
        TensorDict sub = de->tensordict();
        if (!sub.is_dense()) {
          sub.index_put_(p.as_index(), ve.tensordict());
          break;
        }
        put_td(*sub.impl(), p, sub_batch(p.batch, sub.batch_size(), p.src_dims), ve.tensordict(), orig);
        break;
      }
      case Entry::Kind::NonTensorData:
      case Entry::Kind::NonTensorStack:
        put_non_tensor(dst, *de, key, ve, p, ibs);
        break;
      default:
        break;
    }
  }
}

//! fn(key, leaf) for every tensor leaf of the dense levels; other(sub) for a sub-TensorDict of another node
//! kind (a lazy stack below a dense TensorDict), which writes itself
template <class F, class G>
void for_each_tensor_leaf(const TensorDictImpl& impl, const F& fn, const G& other) {
  detail::tree::for_each_leaf(
      impl,
      [&](const detail::tree::KeyPath& p, const Entry& e) {
        if (e.is_tensor()) fn(p.name(), e.tensor());
      },
      [&](const detail::tree::KeyPath&, const TensorDict& sub) {
        TensorDict s = sub;
        other(s);
      },
      detail::tree::Descend::DenseOnly);
}

}  // namespace

//! an index of a write: upstream raises RuntimeError for too many indices in td[idx] = value (IndexError on
//! reads)
template <class F>
auto on_write_index(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const IndexError& e) {
    if (e.message().rfind("too many indices", 0) == 0) throw RuntimeError(e.message());
    throw;
  }
}

Prepared prepare_write(const BatchSize& batch, const Index& index) {
  return on_write_index([&] { return prepare(batch, index); });
}

//! upstream __setitem__'s check of a TensorDict value, for nodes that write it their own way (lazy stacks):
//! the value's batch is the indexed batch, its trailing dims, or its leaves carry the indexed batch
void check_write_value(const TensorDict& td, const Index& index, const TensorDict& value) {
  const BatchSize& batch = td.batch_size();
  const BatchSize ibs =
      only_full_slices(index) ? batch : on_write_index([&] { return getitem_batch_size(batch, index); });
  const BatchSize& vb = value.batch_size();
  if (vb == ibs) return;
  if (!vb.empty() && vb.size() <= ibs.size() &&
      std::equal(vb.begin(), vb.end(), ibs.end() - static_cast<long>(vb.size()))) {
    return;
  }
  if (vb.empty() && keys_exist(td, value)) return;  // a row broadcast over existing keys (see broadcast_value)
  bool fits = true;
  for (const auto& kv : value.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    const BatchSize s = kv.second.shape();
    if (s.size() < ibs.size() || !std::equal(ibs.begin(), ibs.end(), s.begin())) fits = false;
  }
  if (fits) return;
  throw RuntimeError("indexed destination TensorDict batch size is " + shape_str(ibs) + " (batch_size = " +
                     shape_str(batch) + ", index=" + index_repr(index) +
                     "), which differs from the source batch size " + shape_str(vb));
}

//! upstream's errors for a malformed index, before a node of another kind indexes itself (its own checks
//! may raise other classes): the index resolved against the batch size (ragged lazy stacks are skipped)
void validate_for_node(const BatchSize& batch, const Index& index) {
  if (std::find(batch.begin(), batch.end(), -1) != batch.end()) return;
  (void)getitem_batch_size(batch, index);
}

//! torch's index_put_ rule for td[idx] = tensor with an advanced index (an index tensor or a mask): the value
//! must have each leaf's dtype (upstream's tensor[idx] = value raises "Index put requires the source and
//! destination dtypes match"). Checked on every leaf first, so that nothing is written when one refuses.
void check_index_put_dtype(const TensorDict& td, const Index& index, const at::Tensor& value) {
  bool advanced = false;
  for (const auto& e : index) {
    if (e.is_tensor() && e.tensor().defined() && (e.tensor().dim() > 0 || e.tensor().scalar_type() == at::kBool)) {
      advanced = true;
    }
  }
  if (!advanced) return;
  for (const auto& kv : detail::key_metas(td, KeysOptions().include_nested(true).leaves_only(true))) {  // no read
    const at::ScalarType dst = kv.second.dtype;
    if (dst != value.scalar_type()) {
      throw RuntimeError("td[idx] = value: Index put requires the source and destination dtypes match, got " +
                         std::string(c10::toString(dst)) + " for the destination and " +
                         c10::toString(value.scalar_type()) + " for the source (key " + kv.first.repr() + ")");
    }
  }
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
    if (node_ && !node_->dense_view()) validate_for_node(node_->batch_size, index);
    return TensorDict(node_ ? node_->index(index) : TensorDict::undefined().node());
  }
  Prepared p = prepare(d()->batch_size, index);
  if (p.kind == Prepared::Kind::Identity) return *this;
  try {
    BatchSize b = p.batch;
    return index_impl(*d(), p, std::move(b));
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e,
                                "td.index(" + index_repr(index) + ") on batch size " + shape_str(d()->batch_size));
  }
}

namespace {
//! td[idx] = tensor / scalar on a remote node (HDF5, Redis): read the rows, write the value into them, write
//! them back (one request each)
template <class V>
void remote_fill(TensorDict& td, const Index& index, const V& value) {
  on_write_index([&] {
    validate_for_node(td.batch_size(), index);
    TensorDict rows = td.index(index).contiguous();
    rows.index_put_(Index{}, value);
    td.node()->write(index, rows);
  });
}
}  // namespace

TensorDict& TensorDict::index_put_(const Index& index, const TensorDict& value) {
  if (!value.defined()) throw TypeError("td[idx] = value: the value is an undefined TensorDict");
  if (auto* lz = detail::lazy_node(*this)) {
    check_write_value(*this, index, value);
    on_write_index([&] { lz->index_put(index, &value, nullptr, nullptr); });
    return *this;
  }
  if (detail::is_remote(*this)) {  // a node whose leaves live elsewhere (HDF5, Redis) writes itself: one request
    check_write_value(*this, index, value);
    on_write_index([&] {
      validate_for_node(batch_size(), index);
      node_->write(index, value);
    });
    return *this;
  }
  Prepared p = prepare_write(d()->batch_size, index);
  TensorDict v = value;
  if (d()->device && v.device() != d()->device) v = v.to(*d()->device);
  put_td(*d(), p, p.batch, v, index);
  return *this;
}

TensorDict& TensorDict::index_put_(const Index& index, const at::Tensor& value) {
  if (!value.defined()) throw TypeError("td[idx] = value: the value is an undefined tensor");
  check_index_put_dtype(*this, index, value);
  if (auto* lz = detail::lazy_node(*this)) {
    on_write_index([&] {
      validate_for_node(batch_size(), index);
      lz->index_put(index, nullptr, &value, nullptr);
    });
    return *this;
  }
  if (detail::is_remote(*this)) {
    remote_fill(*this, index, value);
    return *this;
  }
  Prepared p = prepare_write(d()->batch_size, index);
  for_each_tensor_leaf(
      *d(), [&](const std::string& key, const at::Tensor& t) { put_leaf(t, value, p, key); },
      [&](TensorDict& sub) { sub.index_put_(p.as_index(), value); });
  return *this;
}

TensorDict& TensorDict::index_put_(const Index& index, const at::Scalar& value) {
  if (auto* lz = detail::lazy_node(*this)) {
    on_write_index([&] {
      validate_for_node(batch_size(), index);
      lz->index_put(index, nullptr, nullptr, &value);
    });
    return *this;
  }
  if (detail::is_remote(*this)) {
    remote_fill(*this, index, value);
    return *this;
  }
  Prepared p = prepare_write(d()->batch_size, index);
  for_each_tensor_leaf(
      *d(),
      [&](const std::string& key, const at::Tensor& t) {
        try {
          p.fill(t, value);
        } catch (const c10::Error& e) {
          detail::rethrow_torch_error(e, "td[idx] = scalar: cannot fill key '" + key + "'");
        }
      },
      [&](TensorDict& sub) { sub.index_put_(p.as_index(), value); });
  return *this;
}

}  // namespace tensordict
