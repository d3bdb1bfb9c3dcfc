// ResolvedIndex: linear source positions with the result's batch shape.
#include "tensordict/resolved_index.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "tensor_dict_internal.hpp"

#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {

namespace {

//! every resolution of a user's index (resolve, compose) in this process: ResolvedIndex::resolutions()
std::atomic<int64_t> g_resolutions{0};

//! positions.index(index) with upstream's checks and exception classes (index_batch)
at::Tensor index_positions(const at::Tensor& positions, const Index& index) {
  if (index.empty()) return positions;
  at::Tensor r = index_batch(positions, index);
  return r.is_alias_of(positions) ? r : r.contiguous();
}

}  // namespace

ResolvedIndex ResolvedIndex::identity(const BatchSize& source_batch) {
  for (auto s : source_batch)
    if (s < 0) throw ValueError("ResolvedIndex: the batch " + detail::shape_list(source_batch) + " has a negative size");
  return ResolvedIndex(source_batch, at::arange(detail::prod(source_batch), at::kLong).view(source_batch));
}

namespace {

//! positions of `count` rows of `inner` consecutive elements, the first at `first`, `stride` apart, in a new
//! int64 tensor of `shape` (filled directly: an arange + view costs microseconds per call on the hot path)
at::Tensor strided_positions(const BatchSize& shape, int64_t first, int64_t count, int64_t stride, int64_t inner) {
  // made without the dispatcher (at::empty's dispatch was most of a one-row resolution: 4% of a Redis producer)
  const size_t bytes = static_cast<size_t>(detail::prod(shape)) * sizeof(int64_t);
  void* mem = std::malloc(std::max<size_t>(bytes, 1));
  if (!mem) throw std::bad_alloc();
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(mem, mem, &std::free, at::Device(at::kCPU)),
                   /*allocator=*/nullptr, /*resizable=*/false),
      c10::DispatchKeySet(c10::DispatchKey::CPU), caffe2::TypeMeta::Make<int64_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  int64_t* p = t.data_ptr<int64_t>();
  for (int64_t r = 0; r < count; ++r) {
    const int64_t base = first + r * stride;
    for (int64_t i = 0; i < inner; ++i) *p++ = base + i;
  }
  return t;
}

//! selections of up to this many positions are remembered per thread (32 KiB; larger ones gain little from it
//! and would stay allocated until the thread's next selection)
constexpr int64_t kRememberedPositions = 4096;

//! the last row plan of this thread (ResolvedIndex::row_plan) and the positions tensor it was computed from
struct LastPlan {
  at::Tensor positions;
  BatchSize source;
  ResolvedIndex::RowPlan plan;
};
LastPlan& last_plan() {
  thread_local LastPlan last;
  return last;
}

//! strided_positions, remembered per thread for the last arguments: a loop writing or reading the same rows
//! (`h5td[100:356] = batch` again and again) gets the same positions tensor, hence the same row plan (row_plan
//! remembers its last one) and the same row list, whose checks and selection layout the stores remember too.
//! Positions are never written while anything but these two memos holds them, so sharing them is safe. Other
//! rows of the same shape (a producer writing row after row) are written into the remembered tensor when
//! nothing else holds it any more (the ResolvedIndex it went to is gone), and the plan remembered for it is
//! dropped: a new positions tensor per row was a malloc and a TensorImpl (with its version counter) per row write
//! the remembered tensor is still what strided_positions made for `shape`: handed out through positions(), it
//! may have been set_ or resize_d by whoever held it before letting it go, and the rows are written through
//! its data pointer
bool fits_in_place(const at::Tensor& t, const BatchSize& shape) {
  const int64_t n = detail::prod(shape);
  return t.scalar_type() == at::kLong && t.sizes().equals(shape) && t.is_contiguous() &&
         static_cast<size_t>(t.storage_offset() + n) * sizeof(int64_t) <= t.storage().nbytes();
}

at::Tensor same_strided_positions(const BatchSize& shape, int64_t first, int64_t count, int64_t stride, int64_t inner) {
  struct Last {
    BatchSize shape;
    int64_t first = 0, count = -1, stride = 0, inner = 0;
    at::Tensor positions;
  };
  thread_local Last last;
  if (count * inner > kRememberedPositions) return strided_positions(shape, first, count, stride, inner);
  if (last.positions.defined() && last.first == first && last.count == count && last.stride == stride &&
      last.inner == inner && last.shape == shape)
    return last.positions;
  LastPlan& plan = last_plan();
  const bool planned = plan.positions.defined() && plan.positions.unsafeGetTensorImpl() == last.positions.unsafeGetTensorImpl();
  if (last.positions.defined() && last.shape == shape && last.positions.use_count() == (planned ? 2 : 1) &&
      last.positions.storage().use_count() == 1 && fits_in_place(last.positions, shape)) {
    if (planned) plan = LastPlan();
    int64_t* p = last.positions.data_ptr<int64_t>();
    for (int64_t r = 0; r < count; ++r) {
      const int64_t base = first + r * stride;
      for (int64_t i = 0; i < inner; ++i) *p++ = base + i;
    }
  } else {
    last.positions = at::Tensor();  // a throw below leaves no stale entry
    at::Tensor t = strided_positions(shape, first, count, stride, inner);
    last.shape = shape;
    last.positions = std::move(t);
  }
  last.first = first;
  last.count = count;
  last.stride = stride;
  last.inner = inner;
  return last.positions;
}

//! td[i] / td[a:b:s] on dim 0 (the row stores' hot path): the positions without building the whole batch's;
//! nullopt for every other index (and for a step <= 0, which torch refuses with its own message)
std::optional<at::Tensor> row_positions(const BatchSize& source, const Index& index) {
  if (index.size() != 1 || source.empty()) return std::nullopt;
  const at::indexing::TensorIndex& i = index[0];
  const int64_t n = source[0];
  const BatchSize rest(source.begin() + 1, source.end());
  const int64_t inner = detail::prod(rest);
  if (i.is_integer()) {
    int64_t k = i.integer();
    if (k < -n || k >= n) return std::nullopt;  // torch's IndexError, through the general path
    if (k < 0) k += n;
    return same_strided_positions(rest, k * inner, 1, 1, inner);
  }
  if (i.is_slice()) {
    const auto& sl = i.slice();
    const int64_t step = sl.step();
    if (step <= 0) return std::nullopt;
    auto clamp = [n](int64_t v) { return v < 0 ? std::max<int64_t>(v + n, 0) : std::min(v, n); };
    const int64_t start = clamp(sl.start()), stop = clamp(sl.stop());
    const int64_t count = stop > start ? (stop - start + step - 1) / step : 0;
    BatchSize shape = source;
    shape[0] = count;
    return same_strided_positions(shape, start * inner, count, step * inner, inner);
  }
  return std::nullopt;
}

}  // namespace

int64_t ResolvedIndex::resolutions() { return g_resolutions.load(std::memory_order_relaxed); }

ResolvedIndex ResolvedIndex::resolve(const BatchSize& source_batch, const Index& index) {
  g_resolutions.fetch_add(1, std::memory_order_relaxed);
  for (auto s : source_batch)
    if (s < 0) throw ValueError("ResolvedIndex: the batch " + detail::shape_list(source_batch) + " has a negative size");
  if (auto fast = row_positions(source_batch, index)) return ResolvedIndex(source_batch, std::move(*fast));
  ResolvedIndex id = identity(source_batch);
  return ResolvedIndex(source_batch, index_positions(id.positions_, index));
}

ResolvedIndex ResolvedIndex::compose(const Index& index) const {
  g_resolutions.fetch_add(1, std::memory_order_relaxed);
  return ResolvedIndex(source_, index_positions(positions_, index));
}

ResolvedIndex ResolvedIndex::extend(const BatchSize& extra) const {
  if (extra.empty()) return *this;
  for (auto s : extra)
    if (s < 0) throw ValueError("ResolvedIndex: the batch " + detail::shape_list(extra) + " has a negative size");
  const int64_t inner = detail::prod(extra);
  BatchSize source = source_, shape = result_batch();
  source.insert(source.end(), extra.begin(), extra.end());
  shape.insert(shape.end(), extra.begin(), extra.end());
  at::Tensor p = positions_.reshape({-1, 1}) * inner + at::arange(inner, at::kLong).view({1, -1});
  return ResolvedIndex(std::move(source), p.view(shape));
}

BatchSize ResolvedIndex::result_batch() const { return BatchSize(positions_.sizes().begin(), positions_.sizes().end()); }

std::vector<int64_t> ResolvedIndex::rows() const {
  const int64_t per_row = source_.empty() ? 1 : detail::prod(BatchSize(source_.begin() + 1, source_.end()));
  const at::Tensor r = positions_.contiguous();
  std::vector<int64_t> out(static_cast<size_t>(r.numel()));
  const int64_t* p = r.data_ptr<int64_t>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = per_row ? p[i] / per_row : 0;
  return out;
}

std::optional<std::pair<int64_t, int64_t>> ResolvedIndex::row_range() const {
  if (source_.empty()) return std::nullopt;
  const int64_t per_row = detail::prod(BatchSize(source_.begin() + 1, source_.end()));
  const int64_t n = positions_.numel();
  if (n == 0 || per_row == 0 || n % per_row != 0) return std::nullopt;
  const at::Tensor flat = positions_.contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  if (p[0] % per_row != 0) return std::nullopt;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] != p[0] + i) return std::nullopt;
  return std::make_pair(p[0] / per_row, n / per_row);
}

ResolvedIndex::RowPlan ResolvedIndex::row_plan() const {
  // the last plan of this thread, when asked again for the same positions tensor over the same source (see
  // same_strided_positions): one row list shared by the calls, so the stores' memos (RowMemo) hold
  LastPlan& last = last_plan();
  if (last.positions.defined() && last.positions.unsafeGetTensorImpl() == positions_.unsafeGetTensorImpl() &&
      last.source == source_) {
    return last.plan;
  }
  RowPlan plan = compute_row_plan();
  if (positions_.numel() > kRememberedPositions) return plan;
  last.positions = at::Tensor();
  last.plan = plan;
  last.source = source_;
  last.positions = positions_;
  return plan;
}

ResolvedIndex::RowPlan ResolvedIndex::compute_row_plan() const {
  RowPlan plan;
  if (source_.empty()) {  // a 0-dim source: one element, no rows
    plan.in_order = plan.all = true;
    return plan;
  }
  plan.per_row = detail::prod(BatchSize(source_.begin() + 1, source_.end()));
  const int64_t per_row = plan.per_row;
  const at::Tensor flat = positions_.contiguous();
  const int64_t n = flat.numel();
  const int64_t* p = flat.data_ptr<int64_t>();
  if (n == 0 || per_row == 0) {
    plan.in_order = true;
    plan.all = n == detail::prod(source_);
    return plan;
  }
  // the common cases first: whole consecutive rows in order (td[i], td[a:b], td[...])
  if (n % per_row == 0 && p[0] % per_row == 0) {
    bool run = true;
    for (int64_t i = 1; i < n && run; ++i) run = p[i] == p[0] + i;
    if (run) {
      const int64_t first = p[0] / per_row, count = n / per_row;
      std::vector<int64_t> rows(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) rows[static_cast<size_t>(i)] = first + i;
      plan.rows = std::move(rows);
      plan.in_order = true;
      plan.all = first == 0 && count == source_[0];
      return plan;
    }
  }
  std::vector<int64_t> rows(static_cast<size_t>(n));
  bool ascending = true;
  for (int64_t i = 0; i < n; ++i) {
    rows[static_cast<size_t>(i)] = p[i] / per_row;
    if (i && rows[static_cast<size_t>(i)] < rows[static_cast<size_t>(i - 1)]) ascending = false;
  }
  if (!ascending) std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  at::Tensor local = at::empty({n}, at::kLong);
  int64_t* l = local.data_ptr<int64_t>();
  bool in_order = static_cast<int64_t>(rows.size()) * per_row == n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = p[i] / per_row;
    const int64_t rank = std::lower_bound(rows.begin(), rows.end(), r) - rows.begin();
    l[i] = rank * per_row + p[i] % per_row;
    if (l[i] != i) in_order = false;
  }
  plan.rows = std::move(rows);
  plan.in_order = in_order;
  if (!in_order) plan.local = local.view(positions_.sizes());
  return plan;
}

std::string ResolvedIndex::to_json() const {
  JsonValue::Array src, shape, pos;
  for (auto s : source_) src.emplace_back(s);
  for (auto s : positions_.sizes()) shape.emplace_back(static_cast<int64_t>(s));
  at::Tensor flat = positions_.reshape({-1}).contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) pos.emplace_back(p[i]);
  return JsonValue::object({{"source", JsonValue(std::move(src))},
                            {"shape", JsonValue(std::move(shape))},
                            {"positions", JsonValue(std::move(pos))}})
      .dump();
}

ResolvedIndex ResolvedIndex::from_json(const std::string& text) {
  JsonValue v = JsonValue::parse(text);
  auto ints = [&](const char* field) {
    const JsonValue* a = v.find(field);
    if (!a || !a->is_array()) throw FormatError(std::string("ResolvedIndex: \"") + field + "\" must be an array");
    BatchSize out;
    for (const auto& x : a->as_array()) {
      if (!x.is_int()) throw FormatError(std::string("ResolvedIndex: \"") + field + "\" must hold integers");
      out.push_back(x.as_int());
    }
    return out;
  };
  BatchSize source = ints("source"), shape = ints("shape"), pos = ints("positions");
  for (auto s : source)
    if (s < 0) throw ValueError("ResolvedIndex: negative source size");
  for (auto s : shape)
    if (s < 0) throw ValueError("ResolvedIndex: negative result size");
  if (detail::prod(shape) != static_cast<int64_t>(pos.size())) {
    throw FormatError("ResolvedIndex: " + std::to_string(pos.size()) + " positions for a result of shape " +
                      detail::shape_list(shape));
  }
  const int64_t n = detail::prod(source);
  for (auto p : pos)
    if (p < 0 || p >= n) throw ValueError("ResolvedIndex: position " + std::to_string(p) + " outside the source batch " + detail::shape_list(source));
  at::Tensor t = at::tensor(pos, at::kLong).view(shape);
  return ResolvedIndex(std::move(source), std::move(t));
}

namespace {

//! the leaf's dims after the source batch; ValueError unless the leaf starts with it
BatchSize feature_dims(const BatchSize& source, const at::Tensor& leaf, const char* op) {
  const auto sizes = leaf.sizes();
  const bool fits = sizes.size() >= source.size() && std::equal(source.begin(), source.end(), sizes.begin());
  if (!fits) {
    throw ValueError(std::string("ResolvedIndex::") + op + ": a leaf of shape " + detail::shape_list(sizes) +
                     " does not start with the source batch " + detail::shape_list(source));
  }
  return BatchSize(sizes.begin() + static_cast<int64_t>(source.size()), sizes.end());
}

//! `head` followed by `tail`
BatchSize joined(BatchSize head, const BatchSize& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

}  // namespace

at::Tensor ResolvedIndex::take(const at::Tensor& leaf) const {
  const BatchSize feat = feature_dims(source_, leaf, "take");
  const BatchSize out = joined(result_batch(), feat);
  if (auto run = row_range()) return leaf.narrow(0, run->first, run->second).reshape(out);
  at::Tensor flat = leaf.reshape(joined({detail::prod(source_)}, feat));
  return flat.index_select(0, positions_.reshape({-1})).view(out);
}

void ResolvedIndex::put(const at::Tensor& leaf, const at::Tensor& value) const {
  const BatchSize feat = feature_dims(source_, leaf, "put");
  const BatchSize out = joined(result_batch(), feat);
  at::Tensor v;
  try {
    v = value.to(leaf.scalar_type()).expand(out);
  } catch (const c10::Error&) {
    throw ValueError("ResolvedIndex::put: a value of shape " + detail::shape_list(value.sizes()) +
                     " does not broadcast to the selection's shape " + detail::shape_list(out));
  }
  if (auto run = row_range()) {
    at::Tensor rows = leaf.narrow(0, run->first, run->second);
    rows.copy_(v.reshape(rows.sizes()));
    return;
  }
  const int64_t count = positions_.numel();
  if (count == 0) return;
  const at::Tensor values = v.reshape(joined({count}, feat));
  if (source_.empty()) {  // a 0-dim source: every position is its one element
    leaf.copy_(values[count - 1]);
    return;
  }
  // the linear positions unravelled into one index tensor per source dim (any strides, views included)
  std::vector<at::Tensor> per_dim(source_.size());
  at::Tensor p = positions_.reshape({-1});
  for (size_t d = source_.size(); d-- > 0;) {
    per_dim[d] = p.remainder(source_[d]);
    p = p.div(source_[d], "trunc");
  }
  c10::List<c10::optional<at::Tensor>> indices;
  for (auto& t : per_dim) indices.push_back(c10::optional<at::Tensor>(t));
  leaf.index_put_(indices, values);
}

bool ResolvedIndex::operator==(const ResolvedIndex& o) const {
  return source_ == o.source_ && positions_.sizes() == o.positions_.sizes() && at::equal(positions_, o.positions_);
}

}  // namespace tensordict
