#pragma once
//! Non-tensor leaves. NonTensorData: one JSON-like value broadcast over a batch (upstream's NonTensorData).
//! NonTensorStack: one value per batch element (upstream's NonTensorStack), kept flat in C order.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/fwd.hpp"

namespace tensordict {

class NonTensorData {
 public:
  NonTensorData() = default;
  NonTensorData(JsonValue value, BatchSize batch_size = {})
      : value_(std::move(value)), batch_size_(std::move(batch_size)) {}
  const JsonValue& value() const { return value_; }
  const BatchSize& batch_size() const { return batch_size_; }
  void set_batch_size(BatchSize bs) { batch_size_ = std::move(bs); }
  bool operator==(const NonTensorData& o) const { return value_ == o.value_ && batch_size_ == o.batch_size_; }

 private:
  JsonValue value_;
  BatchSize batch_size_;
};

class NonTensorStack {
 public:
  NonTensorStack() = default;
  //! values.size() must equal the product of batch_size (ValueError otherwise)
  NonTensorStack(std::vector<JsonValue> values, BatchSize batch_size);
  //! a stack with every element set to `value`
  static NonTensorStack filled(const JsonValue& value, BatchSize batch_size);
  //! from a nested JSON array whose nesting depth gives the batch dims (`depth` leading levels)
  static NonTensorStack from_nested(const JsonValue& nested, int64_t depth);

  const BatchSize& batch_size() const { return batch_size_; }
  const std::vector<JsonValue>& values() const {
    static const std::vector<JsonValue> kEmpty;
    return values_ ? *values_ : kEmpty;
  }
  int64_t numel() const { return values_ ? static_cast<int64_t>(values_->size()) : 0; }
  //! the element at a flat C-order position
  const JsonValue& at(int64_t flat) const;
  //! the values as nested lists, one level per batch dim (what upstream's td["k"] returns)
  JsonValue tolist() const;
  //! true when every element equals the first (and there is at least one)
  bool all_equal() const;

  //! the stack rearranged by a function of a position tensor: fn gets an int64 tensor of shape
  //! batch_size holding flat positions and returns positions of the new shape (index, view, permute ...)
  NonTensorStack remap(const std::function<at::Tensor(const at::Tensor&)>& fn) const;
  //! writes `value` at the positions fn selects (copy-on-write: other handles are not affected)
  void assign(const std::function<at::Tensor(const at::Tensor&)>& select, const std::vector<JsonValue>& values);
  //! an int64 tensor of shape batch_size holding 0..numel-1
  at::Tensor positions() const;
  bool operator==(const NonTensorStack& o) const {
    return batch_size_ == o.batch_size_ && values() == o.values();
  }

 private:
  std::shared_ptr<std::vector<JsonValue>> values_;  //!< null for a default-constructed (empty) stack
  BatchSize batch_size_;
};

}  // namespace tensordict
