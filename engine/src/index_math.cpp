// Index math on batch dims (see index_math.hpp).
#include "tensordict/index_math.hpp"

#include <sstream>

#include <ATen/ExpandUtils.h>

#include "tensordict/errors.hpp"
#include "torch_errors.hpp"

namespace tensordict {

using at::indexing::INDEX_MAX;
using at::indexing::TensorIndex;

namespace {

std::string list_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_mask_dtype(at::ScalarType t) { return t == at::kBool || t == at::kByte; }

void check_index_tensor(const at::Tensor& t) {
  if (!t.defined()) throw TypeError("an undefined tensor cannot be used as an index");
  const auto st = t.scalar_type();
  if (st != at::kLong && st != at::kInt && !is_mask_dtype(st)) {
    throw TypeError(std::string("tensors used as indices must be long, int, byte or bool tensors, got a ") +
                    c10::toString(st) + " tensor");
  }
}

bool is_full_slice(const TensorIndex& e) {
  return e.is_slice() && e.slice().start() == 0 && e.slice().stop() == INDEX_MAX && e.slice().step() == 1;
}

}  // namespace

SliceRange slice_range(const at::indexing::Slice& s, int64_t size) {
  if (s.step() <= 0) throw ValueError("step must be greater than zero (got a slice step of " +
                                      std::to_string(s.step()) + ")");
  // at::native::slice's clamping
  int64_t start = s.start();
  int64_t stop = s.stop();
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  if (start < 0) {
    start = 0;
  } else if (start >= size) {
    start = size;
  }
  if (stop < start) {
    stop = start;
  } else if (stop >= size) {
    stop = size;
  }
  SliceRange r;
  r.start = start;
  r.stop = stop;
  r.step = s.step();
  const int64_t len = stop - start;
  r.length = len == 0 ? 0 : (len - 1) / r.step + 1;
  return r;
}

int64_t wrap_index(int64_t i, int64_t size, int64_t dim) {
  if (i < -size || i >= size) {
    throw IndexError("index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(dim) +
                     " with size " + std::to_string(size));
  }
  return i < 0 ? i + size : i;
}

int64_t count_indexed_dims(const Index& index) {
  int64_t count = 0;
  for (const auto& e : index) {
    if (e.is_tensor()) {
      const auto& t = e.tensor();
      if (t.defined() && is_mask_dtype(t.scalar_type())) {
        count += t.dim();
      } else {
        count += 1;
      }
    } else if (!e.is_none() && !e.is_ellipsis() && !e.is_boolean()) {
      count += 1;
    }
  }
  return count;
}

//! upstream convert_ellipsis_to_idx: a RuntimeError
[[noreturn]] static void throw_two_ellipses(const Index& index, int64_t n) {
  throw RuntimeError("An index can only have one ellipsis at most, but it has " + std::to_string(n) + ": " +
                     index_repr(index));
}

static void check_count(const Index& index, int64_t batch_dims) {
  const int64_t n = count_indexed_dims(index);
  if (n > batch_dims) {
    throw IndexError("too many indices for tensor of dimension " + std::to_string(batch_dims) + " (the index " +
                     index_repr(index) + " indexes " + std::to_string(n) + " batch dims)");
  }
}

Index convert_ellipsis(const Index& index, int64_t batch_dims) {
  int64_t n_ellipsis = 0;
  for (const auto& e : index) n_ellipsis += e.is_ellipsis() ? 1 : 0;
  if (n_ellipsis > 1) throw_two_ellipses(index, n_ellipsis);
  check_count(index, batch_dims);
  if (n_ellipsis == 0) return index;
  const int64_t fill = batch_dims - count_indexed_dims(index);
  Index out;
  out.reserve(index.size() + static_cast<size_t>(fill));
  for (const auto& e : index) {
    if (e.is_ellipsis()) {
      for (int64_t k = 0; k < fill; ++k) out.emplace_back(at::indexing::Slice());
    } else {
      out.push_back(e);
    }
  }
  return out;
}

bool index_preserves_data_ptr(const Index& index) {
  for (const auto& e : index) {
    if (e.is_none() || e.is_ellipsis() || e.is_integer() || e.is_boolean()) continue;
    if (e.is_slice() && e.slice().start() == 0) continue;
    return false;
  }
  return true;
}

bool is_full_slice_index(const Index& index, int64_t batch_dims) {
  int64_t n = 0;
  for (const auto& e : index) {
    if (e.is_ellipsis()) continue;
    if (!is_full_slice(e)) return false;
    ++n;
  }
  return n <= batch_dims;
}

namespace {

//! upstream's checks of every element (index tensors' dtypes, at most one Ellipsis, no more indices than
//! batch dims); true when the index holds a tensor or a bool (advanced indexing)
bool check_elements(const Index& index, int64_t batch_dims) {
  bool advanced = false;
  int64_t n_ellipsis = 0;
  for (const auto& e : index) {
    if (e.is_tensor()) {
      check_index_tensor(e.tensor());
      advanced = true;
    }
    if (e.is_boolean()) advanced = true;
    if (e.is_ellipsis()) ++n_ellipsis;
  }
  if (n_ellipsis > 1) throw_two_ellipses(index, n_ellipsis);
  check_count(index, batch_dims);
  return advanced;
}

//! ints select, slices resize, None inserts a dim of 1, Ellipsis spans the dims nobody names (after
//! check_elements, for an index without tensors or bools)
BatchSize basic_batch_size(const BatchSize& batch, const Index& index) {
  const int64_t nd = static_cast<int64_t>(batch.size());
  const int64_t specified = count_indexed_dims(index);
  BatchSize out;
  out.reserve(batch.size() + index.size());
  size_t dim = 0;
  for (size_t k = 0; k < index.size(); ++k) {
    const auto& e = index[k];
    if (e.is_ellipsis()) {
      const size_t span = static_cast<size_t>(nd - specified);
      out.insert(out.end(), batch.begin() + static_cast<long>(dim), batch.begin() + static_cast<long>(dim + span));
      dim += span;
    } else if (e.is_integer()) {
      wrap_index(e.integer(), batch[dim], static_cast<int64_t>(k));
      ++dim;
    } else if (e.is_slice()) {
      out.push_back(slice_range(e.slice(), batch[dim]).length);
      ++dim;
    } else if (e.is_none()) {
      out.push_back(1);
    }
  }
  out.insert(out.end(), batch.begin() + static_cast<long>(dim), batch.end());
  return out;
}

//! upstream _getitem_batch_size broadcasts the index tensors' shapes (a mask counts as [its number of
//! True]) with torch.broadcast_shapes: false when they do not broadcast together
bool index_tensors_broadcast(const Index& index) {
  std::vector<int64_t> shape;
  bool first = true;
  for (const auto& e : index) {
    if (!e.is_tensor()) continue;
    const at::Tensor& t = e.tensor();
    std::vector<int64_t> s = is_mask_dtype(t.scalar_type()) ? std::vector<int64_t>{t.count_nonzero().item<int64_t>()}
                                                              : t.sizes().vec();
    if (first) {
      shape = std::move(s);
      first = false;
      continue;
    }
    try {
      shape = at::infer_size(shape, s);
    } catch (const c10::Error&) {
      return false;
    }
  }
  return true;
}

//! torch's error for an advanced index, in upstream's classes: torch's Value/TypeError as they are; index
//! tensors (masks included) that do not broadcast together a RuntimeError (upstream's broadcast_shapes); a
//! mask of the wrong shape on its own, and any other torch error, an IndexError naming the index (upstream
//! indexes each leaf with torch, which raises IndexError)
[[noreturn]] void throw_index_error(const c10::Error& e, const BatchSize& batch, const Index& index) {
  ErrorCode code = detail::torch_error_code(e, ErrorCode::Index);
  const std::string msg = detail::torch_message(e);
  if (msg.find("could not be broadcast") != std::string::npos ||
      (msg.find("The shape of the mask") != std::string::npos && !index_tensors_broadcast(index))) {
    throw RuntimeError("Shape mismatch: objects cannot be broadcast to a single shape (index " + index_repr(index) +
                       " on batch size " + list_str(batch) + "; " + msg + ")");
  }
  throw_error(code, code != ErrorCode::Index
                        ? msg
                        : msg + " (index " + index_repr(index) + " on batch size " + list_str(batch) + ")");
}

}  // namespace

at::Tensor index_batch(const at::Tensor& source, const Index& index) {
  const BatchSize batch(source.sizes().begin(), source.sizes().end());
  if (!check_elements(index, static_cast<int64_t>(batch.size()))) {
    (void)basic_batch_size(batch, index);  // upstream's errors for ints and slices
    return source.index(index);
  }
  Index idx;
  idx.reserve(index.size());
  for (const auto& e : index) {
    if (e.is_tensor() && e.tensor().scalar_type() == at::kInt) {
      idx.emplace_back(e.tensor().to(at::kLong));
    } else if (e.is_tensor() && e.tensor().scalar_type() == at::kByte) {
      idx.emplace_back(e.tensor().to(at::kBool));
    } else {
      idx.push_back(e);
    }
  }
  try {
    return source.index(idx);
  } catch (const c10::Error& e) {
    throw_index_error(e, batch, index);
  }
}

BatchSize common_prefix(const std::vector<BatchSize>& shapes) {
  if (shapes.empty()) return {};
  BatchSize p = shapes[0];
  for (const auto& s : shapes) {
    size_t n = 0;
    while (n < p.size() && n < s.size() && p[n] == s[n]) ++n;
    p.resize(n);
  }
  return p;
}

BatchSize getitem_batch_size(const BatchSize& batch, const Index& index) {
  if (!check_elements(index, static_cast<int64_t>(batch.size()))) return basic_batch_size(batch, index);
  // advanced indexing: let torch decide on a stride-0 dummy (only the result is allocated)
  at::Tensor dummy = at::empty({}, at::TensorOptions().dtype(at::kByte)).expand(batch);
  at::Tensor r = index_batch(dummy, index);
  return BatchSize(r.sizes().begin(), r.sizes().end());
}

bool selects_batch_dims_only(const Index& index, size_t batch_dims) {
  for (const auto& e : index) {
    if (e.is_none() || e.is_ellipsis() || e.is_boolean()) return false;
    if (e.is_tensor() && (!e.tensor().defined() || e.tensor().dim() == 0)) return false;
  }
  return count_indexed_dims(index) <= static_cast<int64_t>(batch_dims);
}

std::string index_repr(const Index& index) {
  std::ostringstream os;
  os << "(";
  for (size_t k = 0; k < index.size(); ++k) {
    const auto& e = index[k];
    if (k) os << ", ";
    if (e.is_none()) {
      os << "None";
    } else if (e.is_ellipsis()) {
      os << "Ellipsis";
    } else if (e.is_integer()) {
      os << e.integer();
    } else if (e.is_boolean()) {
      os << (e.boolean() ? "True" : "False");
    } else if (e.is_slice()) {
      const auto& s = e.slice();
      auto bound = [](int64_t v) {
        return (v == INDEX_MAX || v == at::indexing::INDEX_MIN) ? std::string("None") : std::to_string(v);
      };
      os << "slice(" << bound(s.start()) << ", " << bound(s.stop()) << ", "
         << (s.step() == 1 ? std::string("None") : std::to_string(s.step())) << ")";
    } else if (e.is_tensor()) {
      const auto& t = e.tensor();
      if (!t.defined()) {
        os << "tensor(undefined)";
      } else {
        os << "tensor(shape=" << list_str(t.sizes()) << ", dtype=" << c10::toString(t.scalar_type()) << ")";
      }
    }
  }
  if (index.size() == 1) os << ",";
  os << ")";
  return os.str();
}

}  // namespace tensordict
