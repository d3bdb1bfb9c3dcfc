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

//! TensorDict::from_module (upstream's from_module): a module's parameters and buffers as a nested TensorDict
struct FromModuleOptions {
  //! the module's state dict: detached leaves (upstream's keep_vars=False). C++ modules have no state-dict
  //! hooks, so the keys and values are those of the default path otherwise
  TD_ARG(bool, use_state_dict) = false;
  //! lock the result (upstream's lock)
  TD_ARG(bool, lock) = false;
  //! copies of the tensors instead of new handles on their storage
  TD_ARG(bool, copy) = false;
  //! leave out submodules that hold no tensor (upstream's filter_empty)
  TD_ARG(bool, filter_empty) = true;
};

//! TensorDict::to_module / ModuleSwap (upstream's to_module)
struct ToModuleOptions {
  //! copy the values into the module's tensors (their storage stays); default: the module's tensors take the
  //! values' storage (swapped in, no copy)
  TD_ARG(bool, inplace) = false;
  //! return the previous values (upstream's return_swap): handles on the storage the module's tensors had
  TD_ARG(bool, return_swap) = true;
  //! every parameter and buffer of the module needs a value (KeyError naming the first that has none); false:
  //! the TensorDict may cover part of the module
  TD_ARG(bool, strict) = true;
  //! upstream's use_state_dict: the values are loaded as load_state_dict does, copied in place
  TD_ARG(bool, use_state_dict) = false;
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
