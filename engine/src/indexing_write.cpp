// td.index_put_(idx, value) (upstream td[idx] = value): the dense node writes rows through the prepared
// index (indexing_internal.hpp) with lazy preallocation of missing keys; every node kind gets the write
// through Node::index_put_ (the lazy stack member by member, a node without a dense view in one request).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/MemoryOverlap.h>

#include "indexing_internal.hpp"
#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"

namespace tensordict {

void check_index_put_dtype(const TensorDict& td, const Index& index, const at::Tensor& value);

namespace {

using namespace detail::idx;
using detail::shape_str;

const char* const kSharedInplaceError =
    "You're attempting to update a leaf in-place with a shared tensordict, but the new value does not match "
    "the previous. If you're using NonTensorData, see the class documentation to see how to properly "
    "pre-allocate memory in shared contexts.";

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

//! dst[row(s)] = v can be a memcpy: both are contiguous CPU tensors of one dtype, v has exactly the indexed
//! shape, the rows lie in the leaf. Such a write cannot fail (past the reservation of file blocks).
bool memcpy_ok(const at::Tensor& dst, const at::Tensor& v, const Prepared& p) {
  if (p.kind != Prepared::Kind::Int && p.kind != Prepared::Kind::Slice) return false;
  // dense strided CPU tensors without a lazy bit (conj, neg, a ZeroTensor without bytes): their bytes are values
  if (!plain_keys(dst.key_set()) || !plain_keys(v.key_set())) return false;
  if (dst.scalar_type() != v.scalar_type() || c10::isQIntType(dst.scalar_type())) return false;
  if (dst.dim() == 0 || !dst.is_contiguous() || !v.is_contiguous()) return false;
  if (dst.requires_grad() || v.requires_grad()) return false;
  const auto ds = dst.sizes();
  const auto vs = v.sizes();
  const auto row_shape = ds.slice(1);
  // the rows are bounded by the leaf's own first dimension, not only by the batch size the index was prepared
  // against: a leaf resized or set_ to fewer rows behind the TensorDict's back takes torch's path (IndexError)
  if (p.kind == Prepared::Kind::Int) {
    if (!vs.equals(row_shape) || p.i < 0 || p.i >= ds[0]) return false;
  } else {
    if (vs.size() != ds.size() || vs[0] != p.sl.length || !vs.slice(1).equals(row_shape)) return false;
    const int64_t rows = p.sl.length;
    if (rows > 0 && (p.sl.start < 0 || p.sl.step < 1 || p.sl.start + (rows - 1) * p.sl.step >= ds[0])) return false;
  }
  if (!within_storage(dst.unsafeGetTensorImpl()) || !within_storage(v.unsafeGetTensorImpl())) return false;
  return !v.is_alias_of(dst);  // possible overlap: let torch sort it out
}

//! dst[row(s)] = v as memcpy, memcpy_ok being true
void copy_rows(const at::Tensor& dst, const at::Tensor& v, const Prepared& p) {
  const bool one = p.kind == Prepared::Kind::Int;
  const int64_t rows = one ? 1 : p.sl.length;
  const int64_t start = one ? p.i : p.sl.start;
  const int64_t step = one ? 1 : p.sl.step;
  const size_t esize = dst.element_size();
  int64_t row_numel = 1;
  for (auto s : dst.sizes().slice(1)) row_numel *= s;
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
}

//! dst[row(s)] = v as memcpy when memcpy_ok; false when the general path must do it
bool memcpy_rows(const at::Tensor& dst, const at::Tensor& v, const Prepared& p) {
  if (!memcpy_ok(dst, v, p)) return false;
  copy_rows(dst, v, p);
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

//! td[idx] = value with a value of no keys: upstream re-batches it to the indexed batch (whatever its own:
//! nothing to check) and writes nothing; the nodes that write their own way skip the write once the index is
//! validated, as the dense node's re-batch does
//! (a dense value's own entries are looked at, not copied: keys() built a NestedKey per key, 12% of a Redis
//! producer's row write)
bool writes_nothing(const TensorDict& value) {
  if (const auto* own = value.node()->own_entries()) return own->empty();
  return value.node()->keys().empty();
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

// ------------------------------------------------------------------------ a write planned in full
// td[idx] = value writes many leaves; a write that fails on one of them must leave every leaf as it was (the
// project's rule: nothing half-written survives a failure). Upstream's __setitem__ writes leaf by leaf and
// leaves the leaves before a failing one written. Here the whole write is planned first: keys resolved,
// values broadcast, non-tensor entries computed, new keys made (not yet attached), and each leaf write sorted
// by what can be known of it before it runs:
//  - safe: it cannot fail (the memcpy conditions, or the same rules torch applies, checked here, or a dry run
//    of the same copy on meta tensors of the same sizes and strides);
//  - fresh: into a key this write adds (nothing of the TensorDict changes if it fails: it is not attached);
//  - risky: neither (a general index, a leaf that requires grad, a write into another node kind). When more
//    than one write is risky, each but the last keeps a copy of the rows it overwrites, put back if a later
//    one fails.
// Then the reservations of file blocks (a full disk fails here), the fresh writes, the risky ones, the safe
// ones, the non-tensor entries, and last the new keys.

struct LeafWrite {
  at::Tensor dst;
  at::Tensor v;  //!< undefined for a scalar fill
  std::string key;
  bool memcpy = false;  //!< memcpy_ok held when it was verified: copied without checking again
};

//! a sub-TensorDict of another node kind (a lazy stack or a store below a dense TensorDict): it writes itself
struct OtherWrite {
  TensorDict sub;
  std::optional<TensorDict> value;
  at::Tensor tensor;  //!< td[idx] = tensor (neither: the plan's scalar)
};

struct WritePlan {
  const Prepared& p;
  const at::Scalar* scalar = nullptr;  //!< td[idx] = scalar: every leaf write fills with it
  std::vector<LeafWrite> safe, fresh, unverified;
  std::vector<OtherWrite> others;
  std::vector<std::pair<Entry*, Entry>> assigns;                  //!< non-tensor entries, replaced
  std::vector<std::tuple<TensorDictImpl*, std::string, Entry>> attaches;  //!< keys this write adds
  std::vector<TensorDict> values;  //!< broadcast values the plan points into (kept alive)
  int64_t take_max = -2;           //!< Take: the largest row (-1: none), computed once

  explicit WritePlan(const Prepared& prepared) : p(prepared) {}

  int64_t max_take_row() {
    if (take_max == -2) take_max = p.take_max;
    if (take_max == -2) take_max = p.take.numel() == 0 ? -1 : p.take.max().item<int64_t>();
    return take_max;
  }

  void add_leaf(const at::Tensor& dst, const at::Tensor& v, const std::string& key) {
    LeafWrite w{dst, v, key};
    (verified(w) ? safe : unverified).push_back(std::move(w));
  }

  void add_fill(const TensorDictImpl& sub, const at::Tensor* tensor);
  void plan_td(TensorDictImpl& dst, const BatchSize& ibs, const TensorDict& value_in, const Index& orig);
  void preallocate(TensorDictImpl& dst, const std::string& key, const Entry& ve, const BatchSize& ibs,
                   const Index& orig);
  void run();

 private:
  bool verified(LeafWrite& w);
  bool dry_run(const LeafWrite& w) const;
  void put(const LeafWrite& w) const;
};

bool writable_in_place(const at::Tensor& t) {
  return !t.requires_grad() && !(t.is_inference() && !c10::InferenceMode::is_enabled());
}

//! what torch's index_put_ of a Take index checks before it writes, checked here: dtype, the value's shape
//! (leading 1s dropped) broadcast to the indexed shape, the leaf's rows, no overlap
bool take_write_checks(const at::Tensor& t, const at::Tensor* v, int64_t rows, int64_t take_max) {
  if (t.dim() == 0 || take_max >= t.size(0) || at::has_internal_overlap(t) != at::MemOverlap::No) return false;
  if (!v) return true;
  if (v->scalar_type() != t.scalar_type() || v->is_alias_of(t)) return false;
  auto vs = v->sizes();
  while (!vs.empty() && vs.front() == 1) vs = vs.slice(1);
  std::vector<int64_t> target{rows};
  target.insert(target.end(), t.sizes().begin() + 1, t.sizes().end());
  return at::is_expandable_to(vs, target);
}

//! a scalar converts to dtype without overflow (fill_'s own check), asked once per dtype
bool scalar_fits(const at::Scalar& s, at::ScalarType dtype) {
  try {
    (void)at::scalar_tensor(s, at::TensorOptions().dtype(dtype));
    return true;
  } catch (const std::exception&) {  // c10::Error, or checked_convert's std::runtime_error
    return false;
  }
}

bool WritePlan::verified(LeafWrite& w) {
  const at::Tensor& t = w.dst;
  // torch's copy_ would write (or read) past the storage: refused before anything is written
  for (const at::Tensor* x : {&w.dst, &w.v}) {
    if (x->defined() && !within_storage(x->unsafeGetTensorImpl())) {
      throw RuntimeError("td[idx] = value: " + std::string(x == &w.dst ? "key '" : "the value of key '") + w.key +
                         "' reaches past its storage (" + std::to_string(x->unsafeGetTensorImpl()->unsafe_storage().nbytes()) +
                         " bytes for a " + std::string(c10::toString(x->scalar_type())) + " tensor of shape " +
                         shape_str(x->sizes()) + "): was it set_ to a storage of another dtype?");
    }
  }
  if (scalar) {
    if (!writable_in_place(t) || !scalar_fits(*scalar, t.scalar_type())) return false;
    if (at::has_internal_overlap(t) != at::MemOverlap::No) return false;
    switch (p.kind) {
      case Prepared::Kind::Identity: return true;
      case Prepared::Kind::Int: return t.dim() > 0 && p.i < t.size(0);
      case Prepared::Kind::Slice: return t.dim() > 0;
      case Prepared::Kind::Take: return take_write_checks(t, nullptr, 0, max_take_row());
      case Prepared::Kind::General: return false;
    }
    return false;
  }
  if (memcpy_ok(t, w.v, p)) return w.memcpy = true;
  if (p.kind == Prepared::Kind::Take && writable_in_place(t))
    return take_write_checks(t, &w.v, p.take.numel(), max_take_row());
  return false;
}

at::Tensor meta_like(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

//! the copy of a basic index (an int, a slice, all rows) run on meta tensors of the same sizes, strides and
//! dtypes: torch's own shape, broadcast, bounds and overlap checks, no bytes. False when it cannot stand in
//! for the write (autograd or inference rules, a value sharing the leaf's memory, another index); torch's
//! error, wrapped as the write wraps it, when the write would fail
bool WritePlan::dry_run(const LeafWrite& w) const {
  const at::Tensor& t = w.dst;
  if (scalar || !writable_in_place(t) || w.v.is_alias_of(t)) return false;
  if (p.kind != Prepared::Kind::Identity && p.kind != Prepared::Kind::Int && p.kind != Prepared::Kind::Slice)
    return false;
  try {
    const at::Tensor m = meta_like(t);
    const at::Tensor mv = meta_like(w.v);
    switch (p.kind) {
      case Prepared::Kind::Identity: at::indexing::copy_to(m, mv); break;
      case Prepared::Kind::Int: at::indexing::copy_to(m.select(0, p.i), mv); break;
      default: at::indexing::copy_to(m.slice(0, p.sl.start, p.sl.stop, p.sl.step), mv); break;
    }
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e, "td[idx] = value: cannot write a value of shape " + shape_str(w.v.sizes()) +
                                       " into key '" + w.key + "' of shape " + shape_str(t.sizes()));
  }
  return true;
}

void WritePlan::put(const LeafWrite& w) const {
  if (w.memcpy) {  // checked when planned
    copy_rows(w.dst, w.v, p);
    return;
  }
  if (!scalar) return put_leaf(w.dst, w.v, p, w.key);
  try {
    p.fill(w.dst, *scalar);
  } catch (const c10::Error& e) {
    detail::rethrow_torch_error(e, "td[idx] = scalar: cannot fill key '" + w.key + "'");
  } catch (const std::runtime_error& e) {  // c10::checked_convert: "value cannot be converted to type ..."
    throw RuntimeError("td[idx] = scalar: cannot fill key '" + w.key + "': " + e.what());
  }
}

//! every tensor leaf of the dense levels of `sub` gets `*tensor` (or the plan's scalar); a sub-TensorDict
//! of another node kind writes itself
void WritePlan::add_fill(const TensorDictImpl& sub, const at::Tensor* tensor) {
  detail::tree::for_each_leaf(
      sub,
      [&](const detail::tree::KeyPath& kp, const Entry& e) {
        if (!e.is_tensor()) return;
        LeafWrite w{e.tensor(), tensor ? *tensor : at::Tensor(), kp.name()};
        (verified(w) ? safe : unverified).push_back(std::move(w));
      },
      [&](const detail::tree::KeyPath&, const TensorDict& other) { others.push_back({other, std::nullopt, tensor ? *tensor : at::Tensor()}); },
      detail::tree::Descend::DenseOnly);
}

//! the new value of a non-tensor entry `de` (upstream: a NonTensorData written elsewhere becomes a stack)
std::optional<Entry> non_tensor_value(const TensorDictImpl& dst, const Entry& de, const std::string& key,
                                      const Entry& ve, const Prepared& p, const BatchSize& ibs) {
  if (!ve.is_non_tensor()) {
    throw TypeError(std::string("td[idx] = value: key '") + key + "' holds a " + Entry::kind_name(de.kind()) +
                    " but the value holds a " + Entry::kind_name(ve.kind()));
  }
  if (detail::prod(ibs) == 0) return std::nullopt;  // nothing selected
  if (de.is_non_tensor_data()) {
    const JsonValue& cur = de.non_tensor_data().value();
    bool differs = false;
    if (ve.is_non_tensor_data()) {
      differs = ve.non_tensor_data().value() != cur;
    } else {
      for (const auto& x : ve.non_tensor_stack().values()) differs = differs || x != cur;
    }
    if (!differs) return std::nullopt;
    if (dst.is_shared || dst.is_memmap) throw RuntimeError(kSharedInplaceError);
    // a NonTensorData that receives another value somewhere becomes a stack (even when locked, as upstream)
    NonTensorStack s = NonTensorStack::filled(cur, de.non_tensor_data().batch_size());
    assign_stack(s, p, ve);
    return Entry(std::move(s));
  }
  NonTensorStack s = de.non_tensor_stack();
  assign_stack(s, p, ve);
  return Entry(std::move(s));
}

//! a key of the value that dst lacks: zeros of the full size (upstream _SubTensorDict._set_str), written and
//! attached when the plan runs
void WritePlan::preallocate(TensorDictImpl& dst, const std::string& key, const Entry& ve, const BatchSize& ibs,
                            const Index& orig) {
  if (dst.locked) detail::check_unlocked(dst, "td[idx] = value would add the key '" + key + "'");
  const size_t ni = ibs.size();
  switch (ve.kind()) {
    case Entry::Kind::Tensor: {
      const at::Tensor& v = ve.tensor();
      if (!within_storage(v.unsafeGetTensorImpl()))
        throw RuntimeError("td[idx] = value: the value of key '" + key + "' reaches past its storage");
      BatchSize shape = sub_batch(dst.batch_size, BatchSize(v.sizes().begin(), v.sizes().end()), ni);
      at::Tensor t = prealloc_zeros(shape, v.options().device(dst.device ? *dst.device : v.device()));
      fresh.push_back({t, v, key});
      attaches.emplace_back(&dst, key, Entry(t));
      return;
    }
    case Entry::Kind::TensorDict: {
      TensorDict vs = ve.tensordict();
      TensorDict sub = detail::make_empty(dst, sub_batch(dst.batch_size, vs.batch_size(), ni));
      plan_td(*detail::impl_of(sub), sub_batch(ibs, vs.batch_size(), ni), vs, orig);
      attaches.emplace_back(&dst, key, Entry(sub));
      return;
    }
    case Entry::Kind::NonTensorData: {
      // expanded: every slot gets the value
      const auto& d = ve.non_tensor_data();
      attaches.emplace_back(&dst, key,
                            Entry(NonTensorData(d.value(), sub_batch(dst.batch_size, d.batch_size(), ni))));
      return;
    }
    case Entry::Kind::NonTensorStack: {
      // unwritten slots hold null (upstream's None)
      NonTensorStack s =
          NonTensorStack::filled(JsonValue(), sub_batch(dst.batch_size, ve.non_tensor_stack().batch_size(), ni));
      assign_stack(s, p, ve);
      attaches.emplace_back(&dst, key, Entry(std::move(s)));
      return;
    }
    default:
      throw TypeError(std::string("td[idx] = value: cannot preallocate key '") + key + "' from a " +
                      Entry::kind_name(ve.kind()));
  }
}

void WritePlan::plan_td(TensorDictImpl& dst, const BatchSize& ibs, const TensorDict& value_in, const Index& orig) {
  values.push_back(broadcast_value(dst, ibs, value_in.node()->dense_form(value_in), orig));
  const TensorDict& value = values.back();
  const TensorDictImpl& vimpl = *detail::impl_of(value);
  const size_t n = vimpl.entries.size();
  for (size_t j = 0; j < n; ++j) {
    const std::string& key = vimpl.entries[j].first;
    const Entry& ve = vimpl.entries[j].second;
    // same key order is the common case: try the same position first
    Entry* de = (j < dst.entries.size() && dst.entries[j].first == key) ? &dst.entries[j].second : dst.find(key);
    if (!de) {
      preallocate(dst, key, ve, ibs, orig);
      continue;
    }
    switch (de->kind()) {
      case Entry::Kind::Tensor:
        if (!ve.is_tensor()) {
          throw TypeError("td[idx] = value: key '" + key + "' holds a Tensor but the value holds a " +
                          Entry::kind_name(ve.kind()));
        }
        add_leaf(de->tensor(), ve.tensor(), key);
        break;
      case Entry::Kind::TensorDict: {
        TensorDict sub = de->tensordict();
        if (ve.is_tensor()) {
          // upstream _set_at_str: sub_td[idx] = tensor, i.e. every leaf of the sub-TensorDict filled with it
          if (!sub.node()->dense_node()) {
            others.push_back({sub, std::nullopt, ve.tensor()});
            break;
          }
          check_index_put_dtype(sub, p.as_index(), ve.tensor());
          add_fill(*detail::impl_of(sub), &ve.tensor());
          break;
        }
        if (!ve.is_tensordict()) {
          throw TypeError("td[idx] = value: key '" + key + "' holds a TensorDict but the value holds a " +
                          Entry::kind_name(ve.kind()));
        }
        if (!sub.node()->dense_node()) {  // another node kind writes itself
          others.push_back({sub, ve.tensordict(), at::Tensor()});
          break;
        }
        plan_td(*detail::impl_of(sub), sub_batch(p.batch, sub.batch_size(), p.src_dims), ve.tensordict(), orig);
        break;
      }
      case Entry::Kind::NonTensorData:
      case Entry::Kind::NonTensorStack:
        if (std::optional<Entry> e = non_tensor_value(dst, *de, key, ve, p, ibs)) assigns.emplace_back(de, std::move(*e));
        break;
      default:
        break;
    }
  }
}

void WritePlan::run() {
  // a leaf that cannot be verified by the cheap checks is dry-run when another risky write could follow it
  if (unverified.size() + others.size() > 1) {
    std::vector<LeafWrite> still;
    for (auto& w : unverified) (dry_run(w) ? safe : still).push_back(std::move(w));
    unverified = std::move(still);
  }
  // Take rows past a leaf shrunk behind the TensorDict's back: torch checks them while it writes
  if (p.kind == Prepared::Kind::Take) {
    for (const auto* list : {&safe, &unverified}) {
      for (const auto& w : *list) {
        if (w.dst.dim() > 0 && max_take_row() >= w.dst.size(0)) {
          throw IndexError("td[idx] = value: index " + std::to_string(max_take_row()) +
                           " is out of bounds for dimension 0 with size " + std::to_string(w.dst.size(0)) +
                           " (key '" + w.key + "')");
        }
      }
    }
  }
  for (const auto* list : {&safe, &unverified}) {
    for (const auto& w : *list) p.reserve(w.dst);
  }
  for (const auto& w : fresh) put(w);

  // the risky writes, each but the last keeping the rows it overwrites
  const size_t risky = unverified.size() + others.size();
  std::vector<std::function<void()>> undo;
  const Index index = p.as_index();
  try {
    size_t k = 0;
    for (const auto& w : unverified) {
      if (++k < risky) {
        at::Tensor saved = p.get(w.dst).clone();
        undo.emplace_back([this, &w, saved] { p.put(w.dst, saved); });
      }
      put(w);
    }
    for (auto& o : others) {
      if (++k < risky) {
        TensorDict saved = o.sub.index(index).clone();
        undo.emplace_back([&o, index, saved] { o.sub.index_put_(index, saved); });
      }
      if (o.value) {
        o.sub.index_put_(index, *o.value);
      } else if (o.tensor.defined()) {
        o.sub.index_put_(index, o.tensor);
      } else {
        o.sub.index_put_(index, *scalar);
      }
    }
  } catch (...) {
    // the writes before the failing one put back, last first (the failing one wrote nothing: torch checks
    // before it writes, and the Take rows are checked above)
    for (size_t u = undo.size(); u-- > 0;) {
      try {
        undo[u]();
      } catch (...) {
      }
    }
    throw;
  }
  for (const auto& w : safe) put(w);
  for (auto& [de, e] : assigns) *de = std::move(e);
  for (auto& [impl, key, e] : attaches) impl->entries.emplace_back(std::move(key), std::move(e));
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
//! `ibs`: the indexed batch (from the index resolved once by the caller)
void check_write_value(const TensorDict& td, const BatchSize& ibs, const Index& index, const TensorDict& value) {
  const BatchSize& batch = td.batch_size();
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

void check_write_value(const TensorDict& td, const Index& index, const TensorDict& value) {
  const BatchSize& batch = td.batch_size();
  check_write_value(td, only_full_slices(index) ? batch : on_write_index([&] { return getitem_batch_size(batch, index); }),
                    index, value);
}

namespace {

//! the index tensors of `index` that torch's index_put_ writes through: index tensors of one dim or more and
//! masks (a 0-dim integer tensor selects as an int)
int64_t advanced_elements(const Index& index, int64_t* masks) {
  int64_t n = 0;
  *masks = 0;
  for (const auto& e : index) {
    if (!e.is_tensor() || !e.tensor().defined()) continue;
    const bool mask = e.tensor().scalar_type() == at::kBool || e.tensor().scalar_type() == at::kByte;
    if (e.tensor().dim() > 0 || mask) ++n;
    if (mask) ++*masks;
  }
  return n;
}

//! RuntimeError unless every tensor leaf of td has `value` as dtype (read from the metas: no data)
void check_leaf_dtypes(const TensorDict& td, at::ScalarType value) {
  for (const auto& kv : detail::key_metas(td, KeysOptions().include_nested(true).leaves_only(true))) {  // no read
    const at::ScalarType dst = kv.second.dtype;
    if (dst != value) {
      throw RuntimeError("td[idx] = value: Index put requires the source and destination dtypes match, got " +
                         std::string(c10::toString(dst)) + " for the destination and " + c10::toString(value) +
                         " for the source (key " + kv.first.repr() + ")");
    }
  }
}

}  // namespace

//! torch's index_put_ rule for td[idx] = tensor with an advanced index (an index tensor or a mask): the value
//! must have each leaf's dtype (upstream's tensor[idx] = value raises "Index put requires the source and
//! destination dtypes match"). Checked on every leaf first, so that nothing is written when one refuses.
void check_index_put_dtype(const TensorDict& td, const Index& index, const at::Tensor& value) {
  int64_t masks = 0;
  if (advanced_elements(index, &masks) > 0) check_leaf_dtypes(td, value.scalar_type());
}

//! the same rule for td[idx] = scalar: upstream turns a Python scalar into a tensor (torch.as_tensor: bool,
//! int64, the default float dtype, complex) and writes it with tensor[idx] = value. With index tensors torch
//! writes through index_put_ (the dtype rule), except a lone mask, which it writes with masked_fill_ (any
//! dtype): an int with an index list, several index tensors, a multi-dim index tensor are refused on a
//! dtype mismatch, a mask (with ints and slices) converts
void check_index_put_dtype(const TensorDict& td, const Index& index, const at::Scalar& value) {
  int64_t masks = 0;
  const int64_t n = advanced_elements(index, &masks);
  if (n == 0 || (n == 1 && masks == 1)) return;
  at::ScalarType dtype = at::typeMetaToScalarType(at::get_default_dtype());
  if (value.isBoolean()) {
    dtype = at::kBool;
  } else if (value.isIntegral(/*includeBool=*/false)) {
    dtype = at::kLong;
  } else if (value.isComplex()) {
    dtype = at::toComplexType(dtype);
  }
  check_leaf_dtypes(td, dtype);
}

namespace {
//! td[idx] = tensor / scalar on a node without a resolved form: read the rows, write the value into them,
//! write them back (one request each)
template <class V>
void remote_fill(TensorDict& td, const Index& index, const V& value) {
  on_write_index([&] {
    validate_for_node(td.batch_size(), index);
    TensorDict rows = td.index(index).contiguous();
    rows.index_put_(Index{}, value);
    td.node()->write(index, rows);
  });
}

//! td[idx] = tensor / scalar on a node that resolved the index (a store): `make(dtype, shape)` is the value
//! of each tensor leaf at the selection, whose shapes and dtypes the selection's metas give (no read); every
//! leaf is made before anything is written, then the whole TensorDict goes in ONE write request
template <class Make>
void fill_resolved(Node& node, const ResolvedIndex& r, const Make& make) {
  const TensorDict sel(node.index_at(r));
  TensorDict value(sel.batch_size(), sel.device());
  for (const auto& kv : detail::key_metas(sel, KeysOptions().include_nested(true).leaves_only(true))) {
    at::Tensor leaf;
    try {
      leaf = make(kv.second.dtype, kv.second.shape);
    } catch (const c10::Error& e) {
      detail::rethrow_torch_error(e, "td[idx] = value: cannot write the value into key " + kv.first.repr() +
                                         " of indexed shape " + shape_str(kv.second.shape));
    }
    value.set(kv.first, leaf);
  }
  node.write_at(r, value);
}
}  // namespace

// each reaches its node; a node without a dense view writes itself (one request), a store runs the dense
// node's form on its view, the lazy stack splits the value per member
TensorDict& TensorDict::index_put_(const Index& index, const TensorDict& value) {
  if (!value.defined()) throw TypeError("td[idx] = value: the value is an undefined TensorDict");
  detail::node_of(*this, "index_put_").index_put_(*this, index, value);
  return *this;
}

TensorDict& TensorDict::put_row(int64_t row, const TensorDict& value) {
  if (!value.defined()) throw TypeError("td[idx] = value: the value is an undefined TensorDict");
  detail::node_of(*this, "index_put_").put_row(*this, row, value);
  return *this;
}

void Node::put_row(TensorDict& self, int64_t row, const TensorDict& value) { index_put_(self, Index{row}, value); }

TensorDict& TensorDict::index_put_(const Index& index, const at::Tensor& value) {
  if (!value.defined()) throw TypeError("td[idx] = value: the value is an undefined tensor");
  check_index_put_dtype(*this, index, value);
  detail::node_of(*this, "index_put_").index_put_(*this, index, value);
  return *this;
}

TensorDict& TensorDict::index_put_(const Index& index, const at::Scalar& value) {
  check_index_put_dtype(*this, index, value);
  detail::node_of(*this, "index_put_").index_put_(*this, index, value);
  return *this;
}

void Node::write_at(const ResolvedIndex&, const TensorDict&) {
  throw NotImplementedError("write_at (a resolved index) on a " + type_name());
}

// a node with a resolved form (a store) resolves the index once here and writes with it
void Node::index_put_(TensorDict& self, const Index& index, const TensorDict& value) {
  if (auto view = dense_view()) return view->index_put_(self, index, value);
  if (std::optional<ResolvedIndex> r = on_write_index([&] { return resolve(index); })) {
    check_write_value(self, r->result_batch(), index, value);
    if (writes_nothing(value)) return;
    return write_at(*r, value);
  }
  check_write_value(self, index, value);
  on_write_index([&] {
    validate_for_node(batch_size, index);
    if (!writes_nothing(value)) write(index, value);
  });
}

// td[idx] = tensor / scalar on a store: the value broadcast to the selected leaves and written, no read
void Node::index_put_(TensorDict& self, const Index& index, const at::Tensor& value) {
  if (auto view = dense_view()) return view->index_put_(self, index, value);
  if (std::optional<ResolvedIndex> r = on_write_index([&] { return resolve(index); })) {
    return fill_resolved(*this, *r, [&](at::ScalarType dtype, const BatchSize& shape) {
      return value.to(dtype).expand(shape);
    });
  }
  remote_fill(self, index, value);
}

void Node::index_put_(TensorDict& self, const Index& index, const at::Scalar& value) {
  if (auto view = dense_view()) return view->index_put_(self, index, value);
  if (std::optional<ResolvedIndex> r = on_write_index([&] { return resolve(index); })) {
    return fill_resolved(*this, *r, [&](at::ScalarType dtype, const BatchSize& shape) {
      return at::scalar_tensor(value, at::TensorOptions().dtype(dtype)).expand(shape);
    });
  }
  remote_fill(self, index, value);
}

void LazyStackNode::index_put_(TensorDict& self, const Index& index, const TensorDict& value) {
  check_write_value(self, index, value);
  on_write_index([&] {
    if (!writes_nothing(value)) return index_put(index, &value, nullptr, nullptr);
    validate_for_node(batch_size, index);
  });
}

void LazyStackNode::index_put_(TensorDict&, const Index& index, const at::Tensor& value) {
  on_write_index([&] {
    validate_for_node(batch_size, index);
    index_put(index, nullptr, &value, nullptr);
  });
}

void LazyStackNode::index_put_(TensorDict&, const Index& index, const at::Scalar& value) {
  on_write_index([&] {
    validate_for_node(batch_size, index);
    index_put(index, nullptr, nullptr, &value);
  });
}

namespace {
// ----------------------------------------------------------------------------------- one row, fast
// td[i] = row (a replay buffer being filled or refilled): one integer index into dense levels whose leaves are
// plain contiguous CPU tensors, a dense row value of the same keys in the same order, dtypes and row shapes. Every
// leaf is checked first (nothing written unless all pass: anything else takes the general path, which then writes
// it all), then each is one memcpy of its row and a version bump, as the general path's memcpy_rows does, without
// preparing the index, copying handles or looking keys up. 5 leaves of 64 float32: ~3,300 instructions a row
// through the general path, what callgrind counted before this path.

struct RowCopy {
  char* dst;
  const char* src;
  size_t bytes;
  const at::Tensor* dst_tensor;  //!< the leaf (in the destination's entries, alive for the call)
  bool mapped;
};

//! TensorImpl::autograd_meta_, read in place: autograd_meta() is out of line in libc10, a call through the PLT for
//! each side of each leaf of a row. The member is private; a private member is named the one way the language
//! allows without its class's consent, as an argument of an explicit template instantiation (not access-checked,
//! [temp.spec]; module.cpp names Module's members so: the tag, the template and its instantiation must share one
//! namespace, the anonymous one of each file). 1,522 -> 1,461 instructions a row (callgrind)
struct AutogradMetaTag {
  using type = std::unique_ptr<c10::AutogradMetaInterface> c10::TensorImpl::*;
  friend type member_of(AutogradMetaTag);
};
template <class Tag, typename Tag::type M>
struct PrivateMember {
  friend typename Tag::type member_of(Tag) { return M; }
};
template struct PrivateMember<AutogradMetaTag, &c10::TensorImpl::autograd_meta_>;
inline const c10::AutogradMetaInterface* autograd_meta_of(const c10::TensorImpl* t) {
  return (t->*member_of(AutogradMetaTag{})).get();
}

//! StorageImpl::size_bytes_, read in place: nbytes() carries a TORCH_CHECK (not symbolic) whose cold path, twice a
//! leaf, was 4% of a row write. A symbolic size (never on a CPU storage) reads as 0: the row takes the general path
struct StorageBytesTag {
  using type = c10::SymInt c10::StorageImpl::*;
  friend type member_of(StorageBytesTag);
};
template struct PrivateMember<StorageBytesTag, &c10::StorageImpl::size_bytes_>;
inline size_t storage_bytes(const c10::Storage& s) {
  const c10::SymInt& n = s.unsafeGetStorageImpl()->*member_of(StorageBytesTag{});
  return n.is_symbolic() ? 0 : static_cast<size_t>(n.as_int_unchecked());
}

//! a plain strided CPU tensor without autograd, conj or neg bits, of one contiguous layout, with storage. Its
//! storage through unsafe_storage(): storage() is virtual in libtorch 1.13 and was a third of this check's cost
//! (a tensor whose storage access throws has none here: a null StorageImpl, refused below). The dtype is not
//! checked here: plan_row compares the two sides' dtypes and refuses quantized ones once
inline bool plain_contiguous(const c10::TensorImpl* t) {
  if (!plain_keys(t->key_set())) return false;
  const c10::StorageImpl* st = t->unsafe_storage().unsafeGetStorageImpl();
  if (!t->is_contiguous() || st == nullptr || st->data() == nullptr) return false;
  const c10::AutogradMetaInterface* meta = autograd_meta_of(t);
  return meta == nullptr || !meta->requires_grad();
}

//! the leaves' copies of one row, on the stack for up to 16 leaves
struct RowCopies {
  RowCopy small[16];
  std::vector<RowCopy> more;
  size_t n = 0;
  //! the next copy, filled in place by the caller
  RowCopy& next() {
    if (n < 16) return small[n++];
    if (more.empty()) more.assign(small, small + 16);
    ++n;
    return more.emplace_back();
  }
  const RowCopy* begin() const { return more.empty() ? small : more.data(); }
  const RowCopy* end() const { return begin() + n; }
};

//! the `W` bytes at p as one word (an unaligned load)
template <class W>
inline W load_word(const char* p) {
  W w;
  std::memcpy(&w, p, sizeof(W));
  return w;
}

//! a == b without a call to memcmp: keys are short (the call and its PLT jump were 8% of a refill's samples, perf).
//! Keys of 4 bytes or more compare by words, the last one overlapping its predecessor (a byte loop was 8% of
//! plan_row's samples, perf); every load stays inside both keys
inline bool same_key(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n != b.size()) return false;
  const char* x = a.data();
  const char* y = b.data();
  if (n >= 8) {
    for (size_t i = 0; i + 8 < n; i += 8)
      if (load_word<uint64_t>(x + i) != load_word<uint64_t>(y + i)) return false;
    return load_word<uint64_t>(x + n - 8) == load_word<uint64_t>(y + n - 8);
  }
  if (n >= 4)
    return load_word<uint32_t>(x) == load_word<uint32_t>(y) &&
           load_word<uint32_t>(x + n - 4) == load_word<uint32_t>(y + n - 4);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return false;
  return true;
}

//! how much of a leaf's row plan_row prefetches (a larger row streams: the hardware prefetcher follows it)
constexpr size_t kPrefetchBytes = 1024;

bool plan_row(const TensorDictImpl& dst, int64_t row, const TensorDictImpl& val, RowCopies& out) {
  if (dst.entries.size() != val.entries.size()) return false;
  if (dst.device != val.device && val.device) return false;
  for (size_t j = 0; j < dst.entries.size(); ++j) {
    const auto& [dk, de] = dst.entries[j];
    const auto& [vk, ve] = val.entries[j];
    if (!same_key(dk, vk)) return false;
    if (de.is_tensor() && ve.is_tensor()) {
      const at::Tensor& dt = de.tensor();
      c10::TensorImpl* d = dt.unsafeGetTensorImpl();
      const c10::TensorImpl* v = ve.tensor().unsafeGetTensorImpl();
      if (d->dtype() != v->dtype() || !plain_contiguous(d) || !plain_contiguous(v) ||
          c10::isQIntType(at::typeMetaToScalarType(d->dtype())))
        return false;
      // the leaf's own rows bound the write: a leaf resized or set_ to fewer rows behind the TensorDict's back
      // (its batch size still says more) takes the general path, which raises torch's IndexError
      const auto ds = d->sizes();
      if (ds.empty() || row >= ds[0]) return false;
      // the row's shape: a value of one dimension is its numel (no sizes() call: most rows are vectors)
      const auto vdim = static_cast<size_t>(v->dim());
      if (ds.size() != vdim + 1) return false;
      if (vdim == 1) {
        if (ds[1] != v->numel()) return false;
      } else if (vdim > 1) {
        const auto vs = v->sizes();
        for (size_t k = 0; k < vdim; ++k)
          if (ds[k + 1] != vs[k]) return false;
      }
      const c10::Storage& dst_storage = d->unsafe_storage();
      const c10::Storage& val_storage = v->unsafe_storage();
      if (dst_storage.unsafeGetStorageImpl() == val_storage.unsafeGetStorageImpl()) return false;
      const size_t item = d->dtype().itemsize();
      const size_t bytes = static_cast<size_t>(v->numel()) * item;
      // both contiguous: the row and the value lie inside their storages (a leaf set_ to a storage of another
      // dtype does not: within_storage); one branch for both
      const bool outside =
          (static_cast<size_t>(d->storage_offset()) * item + static_cast<size_t>(row + 1) * bytes > storage_bytes(dst_storage)) |
          (static_cast<size_t>(v->storage_offset()) * item + bytes > storage_bytes(val_storage));
      if (__builtin_expect(outside, 0)) return false;
      char* base = static_cast<char*>(dst_storage.data()) + d->storage_offset() * item;
      char* to = base + static_cast<size_t>(row) * bytes;
      // ask for the row's cache lines for writing now, while the other leaves are checked: the version bump
      // after each memcpy is a locked add, which waits until the copy's stores have reached the cache; with
      // the lines still in L3 (a 12.8 MB buffer) that wait was a third of a refill (perf). One bound for the loop:
      // testing both bytes and kPrefetchBytes per line was 26 instructions a leaf (callgrind), 12% of plan_row's
      const size_t ahead = std::min(bytes, kPrefetchBytes);
      for (size_t o = 0; o < ahead; o += 128) {  // two lines a turn (past the row by 64 bytes at most: a hint)
        __builtin_prefetch(to + o, 1, 3);
        __builtin_prefetch(to + o + 64, 1, 3);
      }
      RowCopy& c = out.next();
      c.dst = to;
      c.src = static_cast<const char*>(val_storage.data()) + v->storage_offset() * item;
      c.bytes = bytes;
      c.dst_tensor = &dt;
      c.mapped = dst_storage.data_ptr().get_deleter() == &backends::detail::unmap_context;
    } else if (de.is_tensordict() && ve.is_tensordict()) {
      const TensorDictImpl* dsub = de.tensordict().node()->dense_node();
      const TensorDictImpl* vsub = ve.tensordict().node()->dense_node();
      if (!dsub || !vsub) return false;
      const BatchSize& db = dsub->batch_size;
      if (db.empty() || vsub->batch_size.size() + 1 != db.size() ||
          !std::equal(vsub->batch_size.begin(), vsub->batch_size.end(), db.begin() + 1))
        return false;
      if (!plan_row(*dsub, row, *vsub, out)) return false;
    } else {
      return false;  // non-tensors, lazy stacks, other nodes: the general path
    }
  }
  return true;
}

//! td[row] = value written by plan_row's copies; false (nothing written) when the general path must do it
[[gnu::always_inline]] inline bool put_row_fast(const TensorDictImpl& dst, int64_t row, const TensorDict& value) {
  if (dst.batch_size.empty()) return false;
  const TensorDictImpl* val = value.node()->dense_node();
  if (!val || val->typed_parts().second) return false;
  const BatchSize& db = dst.batch_size;
  const BatchSize& vb = val->batch_size;
  if (vb.size() + 1 != db.size() || !std::equal(vb.begin(), vb.end(), db.begin() + 1)) return false;
  if (row < 0) row += db[0];
  if (row < 0 || row >= db[0]) return false;  // the general path raises upstream's IndexError
  RowCopies copies;
  if (!plan_row(dst, row, *val, copies)) return false;
  // every file block the row reaches is reserved before any leaf is written: a full disk leaves the whole row as
  // it was (the general path reserves and copies leaf by leaf)
  for (const RowCopy& c : copies)
    if (c.mapped) backends::reserve_for_store(*c.dst_tensor, c.dst, static_cast<int64_t>(c.bytes));
  // the version bumps first, then the copies: nothing after the reservation can fail, so no caller sees the order.
  // A bump is a locked add, which waits until every earlier store has reached the cache: after each memcpy it
  // waited for that leaf's row (lines fetched from memory in a 1.28 GB buffer), five times a row; first, the bumps
  // wait once for the previous row's stores, which had this row's checks to drain, and this row's copies drain
  // while the caller goes on. bench_core, 5 alternations each: the 1.28 GB refill 0.726-0.752x -> 0.783-0.815x its
  // memcpy floor, in cache 0.40-0.42x -> 0.41-0.45x
  for (const RowCopy& c : copies) c.dst_tensor->unsafeGetTensorImpl()->bump_version();
  for (const RowCopy& c : copies) std::memcpy(c.dst, c.src, c.bytes);
  return true;
}
}  // namespace

namespace {
//! td[index] = value through the general path (prepared index, broadcast, missing keys preallocated), planned
//! in full before anything is written
void put_general(TensorDictImpl& dst, const Index& index, const TensorDict& value) {
  Prepared p = prepare_write(dst.batch_size, index);
  TensorDict v = value;
  if (dst.device && v.device() != dst.device) v = v.to(*dst.device);
  WritePlan plan(p);
  plan.plan_td(dst, p.batch, v, index);
  plan.run();
}
}  // namespace

void TensorDictImpl::put_row(TensorDict&, int64_t row, const TensorDict& value) {
  if (!put_row_fast(*this, row, value)) put_general(*this, Index{row}, value);
}

void TensorDictImpl::index_put_(TensorDict&, const Index& index, const TensorDict& value) {
  if (index.size() == 1 && index[0].is_integer() && put_row_fast(*this, index[0].integer(), value)) return;
  put_general(*this, index, value);
}

void detail::put_leaves_at(const BatchSize& batch, const Index& index,
                           const std::vector<std::tuple<at::Tensor, at::Tensor, std::string>>& leaves) {
  Prepared p = prepare_write(batch, index);
  WritePlan plan(p);
  for (const auto& [t, v, key] : leaves) plan.add_leaf(t, v, key);
  plan.run();
}

// td[idx] = tensor / scalar: every tensor leaf of the dense levels gets it, planned as a TensorDict value is
void TensorDictImpl::index_put_(TensorDict&, const Index& index, const at::Tensor& value) {
  Prepared p = prepare_write(batch_size, index);
  WritePlan plan(p);
  plan.add_fill(*this, &value);
  plan.run();
}

void TensorDictImpl::index_put_(TensorDict&, const Index& index, const at::Scalar& value) {
  Prepared p = prepare_write(batch_size, index);
  WritePlan plan(p);
  plan.scalar = &value;
  plan.add_fill(*this, nullptr);
  plan.run();
}

}  // namespace tensordict
