// Shared-memory allocation: the layout of tensors in one segment, allocate / share_tensors, which segment a
// tensor lives in (segment_of / handle_of), and the dtypes and extents shared memory holds.
#include <climits>
#include <set>

#include <ATen/core/grad_mode.h>

#include "shm_internal.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {
namespace shm_internal {

const char* find_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return nullptr;
}

// "" if fine; otherwise the reason. On success *nbytes = numel * itemsize.
std::string extent_problem(uint64_t offset, at::ScalarType dtype, at::IntArrayRef shape, uint64_t* nbytes) {
  if (!find_dtype_name(dtype)) return std::string("unsupported dtype ") + c10::toString(dtype);
  if (shape.size() > kMaxDims) return "more than " + std::to_string(kMaxDims) + " dims";
  uint64_t itemsize = c10::elementSize(dtype);
  uint64_t numel = 1;
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) return "negative dim " + std::to_string(d);
    if (d == 0) zero = true;
  }
  if (zero) {
    numel = 0;
  } else {
    for (int64_t d : shape)
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel)) return "byte size overflows";
  }
  uint64_t bytes = 0, end = 0;
  if (__builtin_mul_overflow(numel, itemsize, &bytes) || __builtin_add_overflow(offset, bytes, &end) ||
      end > uint64_t(INT64_MAX))
    return "byte size overflows";
  if (offset % itemsize != 0)
    return "offset " + std::to_string(offset) + " is not a multiple of the element size " +
           std::to_string(itemsize);
  *nbytes = bytes;
  return {};
}

std::string key_text(const std::vector<std::string>& key) {
  std::string s = "(";
  for (size_t i = 0; i < key.size(); ++i) s += (i ? ", '" : "'") + key[i] + "'";
  return s + ")";
}

// "" if fine
std::string key_problem(const std::vector<std::string>& key) {
  if (key.empty()) return "empty key path";
  for (const auto& k : key)
    if (k.empty()) return "empty key part in " + key_text(key);
  return {};
}

bool starts_with_batch(const std::vector<int64_t>& shape, const std::vector<int64_t>& batch) {
  if (shape.size() < batch.size()) return false;
  for (size_t i = 0; i < batch.size(); ++i)
    if (shape[i] != batch[i]) return false;
  return true;
}

}  // namespace shm_internal

using namespace shm_internal;

// =====================================================================================================
// layout and allocation

ShmLayout ShmLayout::plan(const std::vector<ShmLayoutEntry>& entries) {
  ShmLayout layout;
  std::set<std::vector<std::string>> keys;
  uint64_t cursor = 0;
  constexpr uint64_t A = ShmSegment::kAlignment;
  for (const auto& e : entries) {
    std::string problem = key_problem(e.key);
    if (!problem.empty()) throw ValueError("shm layout: " + problem);
    if (!keys.insert(e.key).second) throw ValueError("shm layout: duplicate key " + key_text(e.key));
    uint64_t nbytes = 0;
    problem = extent_problem(cursor, e.dtype, e.shape, &nbytes);
    if (!problem.empty()) throw ValueError("shm layout: " + key_text(e.key) + ": " + problem);
    layout.offsets.push_back(cursor);
    uint64_t end = cursor + nbytes;  // checked by extent_problem
    if (end > uint64_t(INT64_MAX) - A) throw ValueError("shm layout: total size overflows");
    cursor = (end + A - 1) / A * A;
  }
  layout.total_bytes = cursor == 0 ? A : cursor;
  return layout;
}

ShmAllocation allocate(const std::vector<ShmLayoutEntry>& entries, const std::vector<int64_t>& batch_size,
                       const std::string& prefix) {
  for (int64_t d : batch_size)
    if (d < 0) throw ValueError("shm allocate: negative batch dim " + std::to_string(d));
  for (const auto& e : entries)
    if (!starts_with_batch(e.shape, batch_size))
      throw ValueError("shm allocate: shape " + shape_text(e.shape) + " of " + key_text(e.key) +
                       " does not start with batch_size " + shape_text(batch_size));
  ShmLayout layout = ShmLayout::plan(entries);
  ShmAllocation out;
  out.segment = ShmSegment::create(layout.total_bytes, prefix);
  out.handle.batch_size = batch_size;
  out.handle.entries.reserve(entries.size());
  out.tensors.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    ShmTensorHandle th{out.segment->name(), layout.offsets[i], e.dtype, e.shape};
    out.tensors.push_back(out.segment->tensor_at(th.offset, th.dtype, th.shape));
    out.handle.entries.push_back({e.key, std::move(th)});
  }
  return out;
}

ShmAllocation share_tensors(const std::vector<std::vector<std::string>>& keys,
                            const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& batch_size,
                            const std::string& prefix) {
  if (keys.size() != tensors.size())
    throw ValueError("share_tensors: " + std::to_string(keys.size()) + " keys for " +
                     std::to_string(tensors.size()) + " tensors");
  std::vector<ShmLayoutEntry> entries;
  entries.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) throw TypeError("share_tensors: undefined tensor for " + key_text(keys[i]));
    if (t.layout() != at::kStrided || t.is_quantized() || t.is_nested())
      throw TypeError("share_tensors: only dense strided tensors can be shared, " + key_text(keys[i]) + " is not");
    if (!t.device().is_cpu())
      throw ValueError("share_tensors: " + key_text(keys[i]) + " is on " + t.device().str() + ", not cpu");
    if (!find_dtype_name(t.scalar_type()))
      throw TypeError(std::string("share_tensors: unsupported dtype ") + c10::toString(t.scalar_type()) +
                      " for " + key_text(keys[i]));
    entries.push_back({keys[i], t.scalar_type(), t.sizes().vec()});
  }
  ShmAllocation out = allocate(entries, batch_size, prefix);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) out.tensors[i].copy_(tensors[i]);
  return out;
}

std::shared_ptr<ShmSegment> segment_of(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided) return nullptr;
  auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (!addr) return nullptr;
  std::lock_guard<std::mutex> lock(live_mutex());
  auto& m = live_map();
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return nullptr;
  --it;
  ShmSegment* seg = it->second;
  if (addr >= it->first + seg->size() && !(addr == it->first + seg->size() && t.numel() == 0)) return nullptr;
  return seg->weak_from_this().lock();  // null if it is being destroyed
}

std::optional<ShmTensorHandle> handle_of(const at::Tensor& t) {
  auto seg = segment_of(t);
  if (!seg || !t.is_contiguous()) return std::nullopt;
  uint64_t offset = reinterpret_cast<uintptr_t>(t.data_ptr()) - reinterpret_cast<uintptr_t>(seg->data());
  ShmTensorHandle h{seg->name(), offset, t.scalar_type(), t.sizes().vec()};
  uint64_t nbytes = 0;
  if (!extent_problem(offset, h.dtype, h.shape, &nbytes).empty() || nbytes > seg->size() - offset)
    return std::nullopt;
  return h;
}

std::string dtype_name(at::ScalarType dtype) {
  if (const char* n = find_dtype_name(dtype)) return n;
  throw ValueError(std::string("unsupported dtype for shared memory: ") + c10::toString(dtype));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw ValueError("unknown dtype name '" + name + "'");
}

}  // namespace tensordict::backends
