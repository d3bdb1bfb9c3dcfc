#pragma once
//! Builder-style option objects (libtorch's TORCH_ARG idiom): `KeysOptions().include_nested(true)`.
#include <optional>
#include <string>
#include <vector>

#define TD_ARG(T, name)                                  \
 public:                                                 \
  auto name(const T& new_##name)->decltype(*this) {      \
    this->name##_ = new_##name;                          \
    return *this;                                        \
  }                                                      \
  const T& name() const noexcept { return this->name##_; } \
                                                         \
 private:                                                \
  T name##_

namespace tensordict {

struct KeysOptions {
  //! also list keys inside sub-TensorDicts (children before their parent, as upstream)
  TD_ARG(bool, include_nested) = false;
  //! only leaves (tensors); non-tensor leaves too when non_tensor_leaves is on
  TD_ARG(bool, leaves_only) = false;
  //! with leaves_only: count NonTensorData/NonTensorStack as leaves (upstream's is_leaf_nontensor)
  TD_ARG(bool, non_tensor_leaves) = false;
  //! sort keys (nested keys sorted by their joined path)
  TD_ARG(bool, sort) = false;
};

struct UpdateOptions {
  TD_ARG(bool, clone) = false;    //!< clone the incoming tensors
  TD_ARG(bool, inplace) = false;  //!< copy into existing leaves (allowed on a locked TensorDict)
  TD_ARG(bool, ignore_lock) = false;
  TD_ARG(std::optional<std::vector<std::string>>, keys_to_update) = std::nullopt;  //!< joined with "."
};

struct FromDictOptions {
  TD_ARG(std::optional<std::vector<int64_t>>, batch_size) = std::nullopt;
  TD_ARG(std::optional<int64_t>, batch_dims) = std::nullopt;
  TD_ARG(bool, auto_batch_size) = false;
};

}  // namespace tensordict
