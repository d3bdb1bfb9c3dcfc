#include "tensordict/non_tensor.hpp"

#include "tensordict/errors.hpp"

namespace tensordict {
namespace {
int64_t prod(const BatchSize& bs) {
  int64_t n = 1;
  for (auto s : bs) n *= s;
  return n;
}
std::string bs_str(const BatchSize& bs) {
  std::string s = "[";
  for (size_t i = 0; i < bs.size(); ++i) s += (i ? ", " : "") + std::to_string(bs[i]);
  return s + "]";
}
JsonValue nest(const std::vector<JsonValue>& flat, const BatchSize& bs, size_t dim, int64_t& pos) {
  if (dim == bs.size()) return flat[pos++];
  JsonValue::Array arr;
  arr.reserve(bs[dim]);
  for (int64_t i = 0; i < bs[dim]; ++i) arr.push_back(nest(flat, bs, dim + 1, pos));
  return JsonValue(std::move(arr));
}
void flatten_nested(const JsonValue& v, int64_t depth, BatchSize& bs, size_t dim, std::vector<JsonValue>& out) {
  if (static_cast<int64_t>(dim) == depth) {
    out.push_back(v);
    return;
  }
  if (!v.is_array()) throw ValueError("NonTensorStack: expected a list at nesting level " + std::to_string(dim));
  int64_t n = static_cast<int64_t>(v.as_array().size());
  if (bs.size() <= dim) {
    bs.push_back(n);
  } else if (bs[dim] != n) {
    throw ValueError("NonTensorStack: ragged nested lists (" + std::to_string(bs[dim]) + " vs " + std::to_string(n) +
                     " at level " + std::to_string(dim) + ")");
  }
  for (const auto& e : v.as_array()) flatten_nested(e, depth, bs, dim + 1, out);
}
}  // namespace

NonTensorStack::NonTensorStack(std::vector<JsonValue> values, BatchSize batch_size)
    : values_(std::make_shared<std::vector<JsonValue>>(std::move(values))), batch_size_(std::move(batch_size)) {
  if (static_cast<int64_t>(values_->size()) != prod(batch_size_)) {
    throw ValueError("NonTensorStack: " + std::to_string(values_->size()) + " values do not fill batch size " +
                     bs_str(batch_size_));
  }
}

NonTensorStack NonTensorStack::filled(const JsonValue& value, BatchSize batch_size) {
  std::vector<JsonValue> v(static_cast<size_t>(prod(batch_size)), value);
  return NonTensorStack(std::move(v), std::move(batch_size));
}

NonTensorStack NonTensorStack::from_nested(const JsonValue& nested, int64_t depth) {
  BatchSize bs;
  std::vector<JsonValue> flat;
  flatten_nested(nested, depth, bs, 0, flat);
  while (static_cast<int64_t>(bs.size()) < depth) bs.push_back(0);
  return NonTensorStack(std::move(flat), std::move(bs));
}

const JsonValue& NonTensorStack::at(int64_t flat) const {
  if (flat < 0 || flat >= numel()) throw IndexError("NonTensorStack position " + std::to_string(flat) + " out of range");
  return values()[static_cast<size_t>(flat)];
}

JsonValue NonTensorStack::tolist() const {
  int64_t pos = 0;
  if (prod(batch_size_) == 0 && !batch_size_.empty()) {
    // an empty leading dim gives [] regardless of deeper dims
    return nest(values(), BatchSize(batch_size_.begin(), batch_size_.begin() + 1), 0, pos);
  }
  return nest(values(), batch_size_, 0, pos);
}

bool NonTensorStack::all_equal() const {
  if (values().empty()) return false;
  for (const auto& v : values())
    if (v != values().front()) return false;
  return true;
}

at::Tensor NonTensorStack::positions() const {
  return at::arange(numel(), at::kLong).view(batch_size_);
}

NonTensorStack NonTensorStack::remap(const std::function<at::Tensor(const at::Tensor&)>& fn) const {
  at::Tensor pos = fn(positions()).contiguous();
  BatchSize bs(pos.sizes().begin(), pos.sizes().end());
  std::vector<JsonValue> out;
  out.reserve(static_cast<size_t>(pos.numel()));
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < pos.numel(); ++i) out.push_back(values()[static_cast<size_t>(p[i])]);
  return NonTensorStack(std::move(out), std::move(bs));
}

void NonTensorStack::assign(const std::function<at::Tensor(const at::Tensor&)>& select,
                            const std::vector<JsonValue>& values) {
  at::Tensor pos = select(positions()).contiguous();
  if (values.size() != 1 && static_cast<int64_t>(values.size()) != pos.numel()) {
    throw ValueError("NonTensorStack: cannot write " + std::to_string(values.size()) + " values into " +
                     std::to_string(pos.numel()) + " positions");
  }
  // copy-on-write: only copy the values when another stack shares them
  if (!values_ || values_.use_count() > 1) {
    values_ = std::make_shared<std::vector<JsonValue>>(values_ ? *values_ : std::vector<JsonValue>{});
  }
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < pos.numel(); ++i) (*values_)[static_cast<size_t>(p[i])] = values.size() == 1 ? values[0] : values[i];
}

}  // namespace tensordict
