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

//! set(key, value, SetOptions().inplace(true)): copy into the existing leaf when there is one (upstream inplace=True)
struct SetOptions {
  TD_ARG(bool, inplace) = false;
};

//! select / split_keys: `strict` (a missing key is a KeyError), `inplace` (self keeps the selection / the rest)
struct SelectOptions {
  TD_ARG(bool, strict) = true;
  TD_ARG(bool, inplace) = false;
};

//! exclude: `inplace` drops the keys from self
struct ExcludeOptions {
  TD_ARG(bool, inplace) = false;
};

//! rename_key_: `safe` makes an existing new key a KeyError
struct RenameOptions {
  TD_ARG(bool, safe) = false;
};

//! flatten_keys / unflatten_keys
struct FlattenKeysOptions {
  TD_ARG(std::string, separator) = ".";
  TD_ARG(bool, inplace) = false;
};

//! clone: `recurse` (false: a structure-only copy sharing the leaves, upstream copy())
struct CloneOptions {
  TD_ARG(bool, recurse) = true;
};

//! empty: `recurse` keeps the sub-TensorDict skeleton
struct EmptyOptions {
  TD_ARG(bool, recurse) = false;
};

struct FromDictOptions {
  TD_ARG(std::optional<std::vector<int64_t>>, batch_size) = std::nullopt;
  TD_ARG(std::optional<int64_t>, batch_dims) = std::nullopt;
  TD_ARG(bool, auto_batch_size) = false;
};

}  // namespace tensordict
