// LazyStackedTensorDict in memory: construction, member access, batch size, keys, densification
// (its memmap layout lives in memmap.cpp).
#include "tensordict/lazy_stack.hpp"

#include "tensor_dict_internal.hpp"
#include "tensordict/map.hpp"

namespace tensordict {

LazyStackedTensorDict::LazyStackedTensorDict(std::vector<TensorDict> tensordicts, int64_t stack_dim)
    : tds_(std::move(tensordicts)), stack_dim_(stack_dim) {
  if (tds_.empty()) throw ValueError("LazyStackedTensorDict needs at least one member");
  for (size_t i = 0; i < tds_.size(); ++i) {
    if (!tds_[i].defined()) {
      throw ValueError("LazyStackedTensorDict: member " + std::to_string(i) + " is an undefined TensorDict");
    }
  }
  int64_t nd = tds_[0].batch_dims();
  for (const auto& td : tds_) {
    if (td.batch_dims() != nd) {
      throw BatchSizeError("LazyStackedTensorDict: members have different numbers of batch dims (" +
                           std::to_string(nd) + " vs " + std::to_string(td.batch_dims()) + ")");
    }
  }
  stack_dim_ = detail::normalize_dim(stack_dim, nd, /*allow_end=*/true);
}

const TensorDict& LazyStackedTensorDict::member(int64_t i) const {
  const auto n = static_cast<int64_t>(tds_.size());
  if (i < -n || i >= n) {
    throw IndexError("LazyStackedTensorDict: member " + std::to_string(i) + " is out of range for a stack of " +
                     std::to_string(n) + " (expected an index in [" + std::to_string(-n) + ", " +
                     std::to_string(n - 1) + "])");
  }
  return tds_[static_cast<size_t>(i < 0 ? i + n : i)];
}

BatchSize LazyStackedTensorDict::batch_size() const {
  BatchSize bs = tds_[0].batch_size();
  for (const auto& td : tds_)
    for (size_t i = 0; i < bs.size(); ++i)
      if (td.batch_size()[i] != bs[i]) bs[i] = -1;
  bs.insert(bs.begin() + stack_dim_, static_cast<int64_t>(tds_.size()));
  return bs;
}

std::vector<NestedKey> LazyStackedTensorDict::keys() const {
  std::vector<NestedKey> common = tds_[0].keys(KeysOptions().sort(true));
  for (const auto& td : tds_) {
    std::vector<NestedKey> keep;
    for (const auto& k : common)
      if (td.contains(k)) keep.push_back(k);
    common = std::move(keep);
  }
  return common;
}

TensorDict LazyStackedTensorDict::contiguous() const {
  try {
    return stack(tds_, stack_dim_);
  } catch (...) {
    // the same error type, naming the first member that does not stack with member 0
    map_detail::CarriedError ce = map_detail::carry_current_exception(-1);
    size_t bad = 0;
    for (size_t j = 1; j < tds_.size() && bad == 0; ++j) {
      try {
        stack({tds_[0], tds_[j]}, stack_dim_);
      } catch (...) {
        bad = j;
      }
    }
    const std::string which =
        bad > 0 ? "member " + std::to_string(bad) + " does not stack with member 0" : "the members do not stack";
    ce.message = "LazyStackedTensorDict::contiguous: cannot densify the stack along dim " +
                 std::to_string(stack_dim_) + " (" + which +
                 ": ragged leaf shapes or different keys; read the members with tensordicts() / member(i)): " +
                 ce.message;
    map_detail::rethrow(ce);
  }
}

}  // namespace tensordict
