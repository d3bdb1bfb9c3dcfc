#pragma once
//! Builder-style option objects (libtorch's TORCH_ARG idiom): `KeysOptions().include_nested(true)`.
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <memory>
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

namespace dist {
class Group;
//! the reduction of reduce / all_reduce (c10d's ReduceOp; gloo has no average)
enum class ReduceOp : int { Sum, Product, Min, Max, BAnd, BOr, BXor };
}  // namespace dist

//! send / recv / isend / irecv / init_remote / broadcast / reduce / all_reduce (tensordict/distributed.hpp):
//! upstream's keyword arguments. The peer (dst / src) is a rank of `group`.
struct DistOptions {
  //! the process group; null: the default group (dist::init_process_group)
  TD_ARG(std::shared_ptr<dist::Group>, group) = nullptr;
  //! the tag of the first leaf; each next leaf takes the next one (upstream's init_tag)
  TD_ARG(int64_t, init_tag) = 0;
  //! tags from upstream's pseudo-random chain (int_generator) instead of init_tag, init_tag + 1, ...
  TD_ARG(bool, pseudo_rand) = false;
  //! send / recv the consolidated storage in one message (the receiver is consolidated with the same layout,
  //! e.g. by from_remote_init)
  TD_ARG(bool, consolidated) = false;
  //! reduce / all_reduce: return at once with the pending operations (upstream's async_op)
  TD_ARG(bool, async_op) = false;
  //! init_remote / from_remote_init over broadcast instead of point to point (upstream's use_broadcast)
  TD_ARG(bool, use_broadcast) = false;
  //! recv: receive every leaf into a buffer of its own first and write the TensorDict only when all arrived,
  //! so that a failed receive leaves it as it was. false: straight into the leaves (upstream; faster)
  TD_ARG(bool, staged) = true;
  //! send / recv / isend / irecv / reduce / all_reduce between our ranks: the structure (keys, dtypes, shapes)
  //! is compared before any data moves (tensordict/distributed.hpp). false: upstream's protocol exactly, what a
  //! Python rank speaks (a larger leaf than the receiver's then aborts the receiving process in gloo)
  TD_ARG(bool, checked) = true;
  //! init_remote / broadcast: the metadata as a pickle of plain data (what a Python rank's recv_object_list
  //! reads) instead of JSON (what our ranks read; from_remote_init reads both)
  TD_ARG(bool, pickle_metadata) = false;
  //! init_remote / broadcast of a TensorDict whose storage other ranks can open (a memmap directory on a shared
  //! file system, shared memory, an HDF5 file, a Redis store: tensordict/storage_spec.hpp): send its storage
  //! spec, not its data, and the receiver opens the same storage. Not with pickle_metadata (Python ranks)
  TD_ARG(bool, by_spec) = true;
};

//! consolidate (upstream's consolidate): every leaf a view into one uint8 storage
struct ConsolidateOptions {
  //! the storage is this file: [leaf bytes][metadata JSON][its length, int64] (upstream's filename)
  TD_ARG(std::string, filename) = "";
  //! the storage in shared memory (upstream's share_memory)
  TD_ARG(bool, share_memory) = false;
  //! threads that copy the leaves (0 or 1: the calling thread); the bytes are the same
  TD_ARG(int, num_threads) = 0;
  //! a preallocated 1-D uint8 CPU tensor of at least the storage's bytes to hold the storage (no allocation; the
  //! result's leaves view it); ValueError when it is too small or not such a tensor
  TD_ARG(at::Tensor, buffer) = at::Tensor();
};

}  // namespace tensordict
