// ResolvedIndex: linear source positions with the result's batch shape.
#include "tensordict/resolved_index.hpp"

#include "tensor_dict_internal.hpp"

#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {

namespace {

//! positions.index(index) with torch's rules; c10 errors become IndexError / TypeError
at::Tensor index_positions(const at::Tensor& positions, const Index& index) {
  if (index.empty()) return positions;
  // a bare-int index of a 0-dim batch and similar are torch's own errors
  const int64_t consumed = count_indexed_dims(index);
  if (consumed > positions.dim()) {
    throw IndexError("too many indices for a batch of dimension " + std::to_string(positions.dim()) + " (got " +
                     std::to_string(consumed) + ")");
  }
  try {
    at::Tensor r = positions.index(index);
    return r.is_alias_of(positions) ? r : r.contiguous();
  } catch (const c10::IndexError& e) {
    throw IndexError(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    const std::string w = e.what_without_backtrace();
    if (w.find("tensors used as indices must be") != std::string::npos) throw TypeError(w);
    throw IndexError(w);
  }
}

}  // namespace

ResolvedIndex ResolvedIndex::identity(const BatchSize& source_batch) {
  for (auto s : source_batch)
    if (s < 0) throw ValueError("ResolvedIndex: the batch " + detail::shape_list(source_batch) + " has a negative size");
  return ResolvedIndex(source_batch, at::arange(detail::prod(source_batch), at::kLong).view(source_batch));
}

ResolvedIndex ResolvedIndex::resolve(const BatchSize& source_batch, const Index& index) {
  ResolvedIndex id = identity(source_batch);
  return ResolvedIndex(source_batch, index_positions(id.positions_, index));
}

ResolvedIndex ResolvedIndex::compose(const Index& index) const {
  return ResolvedIndex(source_, index_positions(positions_, index));
}

BatchSize ResolvedIndex::result_batch() const { return BatchSize(positions_.sizes().begin(), positions_.sizes().end()); }

std::vector<int64_t> ResolvedIndex::rows() const {
  const int64_t per_row = source_.empty() ? 1 : detail::prod(BatchSize(source_.begin() + 1, source_.end()));
  at::Tensor r = positions_.reshape({-1}).contiguous();
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
  at::Tensor flat = positions_.reshape({-1}).contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  if (p[0] % per_row != 0) return std::nullopt;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] != p[0] + i) return std::nullopt;
  return std::make_pair(p[0] / per_row, n / per_row);
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

bool ResolvedIndex::operator==(const ResolvedIndex& o) const {
  return source_ == o.source_ && positions_.sizes() == o.positions_.sizes() && at::equal(positions_, o.positions_);
}

}  // namespace tensordict
