#pragma once
//! TensorDict: a dictionary of tensors that indexes, reshapes and stacks like one tensor.
//! A TensorDict is a cheap ref-counted handle (like torch::Tensor): copying aliases, clone() copies.
//! Thread-safety: like a torch::Tensor, concurrent reads are fine; concurrent structural changes
//! (adding/removing keys) on one TensorDict are not. Concurrent in-place writes of disjoint rows are fine.
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/keys_view.hpp"
#include "tensordict/fwd.hpp"
#include "tensordict/nested_key.hpp"
#include "tensordict/non_tensor.hpp"
#include "tensordict/options.hpp"

namespace tensordict::dist {
class Pending;
}
namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace tensordict {

//! fn for map/map_iter: gets one chunk, returns its result (undefined TensorDict = upstream's None)
using MapFn = std::function<TensorDict(const TensorDict&)>;

//! a source for construction: (key, value) pairs in order; values may themselves be Dicts (nested)
using Dict = std::vector<std::pair<NestedKey, Entry>>;
//! fn over leaves for apply: gets the leaf (and the matching leaves of `others`), returns the new leaf;
//! an undefined tensor (at::Tensor()) drops the key (upstream's "returning None")
using LeafFn = std::function<at::Tensor(const at::Tensor&)>;
using MultiLeafFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
using NamedLeafFn = std::function<at::Tensor(const NestedKey&, const at::Tensor&)>;
//! named_apply with other TensorDicts: the key, then the leaf of self followed by the matching leaves of others
using NamedMultiLeafFn = std::function<at::Tensor(const NestedKey&, const std::vector<at::Tensor>&)>;

struct MemmapOptions {
  //! threads writing leaves in parallel (0: the calling thread only)
  TD_ARG(int64_t, num_threads) = 0;
  //! allow re-writing leaves already mapped to another file
  TD_ARG(bool, copy_existing) = false;
  //! allow writing into a prefix that already holds a meta.json
  TD_ARG(bool, existsok) = true;
  //! from_schema(storage="memmap"): the directory
  TD_ARG(std::string, prefix) = "";
  //! memmap_ / memmap / save / memmap_like: fsync every leaf file and meta.json before the save is switched in,
  //! and the parent directory after (engine/README.md, "Saving memmap directories"). Off by default, as upstream
  TD_ARG(bool, durable) = false;
  //! memmap_ / memmap / memmap_like / from_schema("memmap"): record the saved TensorDict as an instance of this
  //! Python tensorclass ("pkg.mod.Pair": meta.json "_type" "<class 'pkg.mod.Pair'>", its TensorDict under
  //! _tensordict/), as a TensorClass's own save does. "" (default): the record the TensorDict carries
  TD_ARG(std::string, class_path) = "";
};

struct LoadOptions {
  //! map leaves with MAP_SHARED (writes reach the files); a leaf this process may not write is then a BackendError
  //! naming it (upstream's PermissionError). false: private copy-on-write mappings (writes never reach the files)
  TD_ARG(bool, writable) = true;
  //! read through symlinked leaf files, meta.json files and sub-directories below the prefix, wherever
  //! they point (the prefix itself may always be a symlink). Default: FormatError naming the link, since
  //! a writable load would write into the link's target. Fifos, devices and sockets are always refused.
  TD_ARG(bool, follow_symlinks) = false;
  //! skip a non-empty leaf whose file is missing, with a warning, as Python does (the key is absent).
  //! Default: FormatError naming the key and the file
  TD_ARG(bool, allow_missing) = false;
  //! receives each warning of the reader (a skipped leaf, an entry without dtype/shape, a v0.3 child);
  //! unset: written to stderr as "tensordict: warning: <text>"
  TD_ARG(std::function<void(const std::string&)>, on_warning) = nullptr;
  //! load_memmap_ only: read the saved bytes into this TensorDict's own leaves (pread, no mapping) instead of
  //! replacing its entries. Every key, dtype and shape must match both ways, and every file is checked, before
  //! a byte is written (KeyError / TypeError / ValueError / FormatError naming the key or file). Its use: weights
  //! into a module, `TensorDict::from_module(model).load_memmap_(dir, LoadOptions().inplace(true))`
  TD_ARG(bool, inplace) = false;
  //! inplace: threads that read leaves side by side (0 or 1: the calling thread)
  TD_ARG(int, num_threads) = 0;
};

//! from_schema: key -> (element shape, dtype)
using Schema = std::vector<std::pair<NestedKey, std::pair<BatchSize, at::ScalarType>>>;

struct ApplyOptions {
  //! value used when a key of self is missing in one of the others (otherwise KeyError)
  TD_ARG(std::optional<at::Tensor>, default_value) = std::nullopt;
  //! new batch size of the result (when fn changes the batch dims)
  TD_ARG(std::optional<BatchSize>, batch_size) = std::nullopt;
  //! named_apply: pass the full nested key instead of the leaf name
  TD_ARG(bool, nested_keys) = false;
  //! keep sub-TensorDicts that end up empty (upstream filter_empty=False); by default they are dropped, as
  //! upstream's default
  TD_ARG(bool, keep_empty) = false;
  //! lock the result when self is locked
  TD_ARG(bool, propagate_lock) = false;
};

struct EntryMeta;  // tensordict/node.hpp

class TensorDict {
 public:
  // ---------------------------------------------------------------- construction
  //! empty, batch_size [] and no device
  TensorDict();
  explicit TensorDict(BatchSize batch_size, std::optional<at::Device> device = std::nullopt);
  //! from (key, value) pairs; nested Dicts become TensorDicts with this batch size
  TensorDict(const Dict& source, BatchSize batch_size = {}, std::optional<at::Device> device = std::nullopt);
  //! upstream from_dict: batch_size xor batch_dims (ValueError "both"), auto_batch_size
  static TensorDict from_dict(const Dict& source, const FromDictOptions& options = {});
  //! every key gets `value` (a 0-dim tensor), batch []
  static TensorDict fromkeys(const std::vector<NestedKey>& keys, double value = 0);

  // ---------------------------------------------------------------- shape and metadata
  const BatchSize& batch_size() const;
  //! checks every leaf (RuntimeError-like BatchSizeError with upstream's text otherwise)
  void set_batch_size(BatchSize batch_size);
  int64_t batch_dims() const;
  int64_t ndim() const { return batch_dims(); }
  int64_t numel() const;   //!< product of batch_size
  int64_t size(int64_t dim) const;
  std::optional<at::Device> device() const;
  //! bytes of every tensor leaf, nested included
  int64_t bytes() const;
  bool is_empty() const;   //!< no leaf at any depth (non-tensor leaves count as leaves)
  bool defined() const { return node_ != nullptr; }
  //! number of elements along dim 0 (0 for 0-dim), upstream's len(td)
  int64_t len() const;
  //! same underlying object (Python's `is`)
  bool is_same(const TensorDict& other) const { return node_ == other.node_; }

  // ---------------------------------------------------------------- keys
  //! the keys (a std::vector<NestedKey>); keys(...).contains(key) is upstream's `key in td.keys(...)`: a
  //! TypeError for a nested key unless include_nested (td.contains(key) answers for any key)
  KeysView keys(const KeysOptions& options = {}) const;
  std::vector<Entry> values(const KeysOptions& options = {}) const;
  std::vector<std::pair<NestedKey, Entry>> items(const KeysOptions& options = {}) const;
  bool contains(const NestedKey& key) const;
  //! what `key` holds (kind, dtype, shape, device; tensordict/node.hpp) without reading its data; nullopt
  //! when missing or when a level on the way is a leaf
  std::optional<EntryMeta> meta(const NestedKey& key) const;
  //! lists the storage's structure again where the node caches it (HDF5, Redis, a Store): keys another
  //! process or handle added show after this call; no-op for in-memory TensorDicts
  void refresh();

  // ---------------------------------------------------------------- reading
  //! the tensor at key: KeyError if missing, TypeError if it is not a tensor
  at::Tensor get(const NestedKey& key) const;
  //! get of one top-level key without building a NestedKey (the hot path of td.get("obs")); same results
  at::Tensor get(const char* key) const;
  //! the tensor at key, or `default_value` when the key is missing
  at::Tensor get(const NestedKey& key, const at::Tensor& default_value) const;
  //! the sub-TensorDict at key (KeyError / TypeError)
  TensorDict get_td(const NestedKey& key) const;
  //! whatever is at key, as its wrapper (tensor, TensorDict, NonTensorData, NonTensorStack): KeyError if missing
  Entry get_entry(const NestedKey& key) const;
  std::optional<Entry> get_entry_opt(const NestedKey& key) const;
  //! upstream td["k"] for non-tensors: NonTensorData -> its value, NonTensorStack -> nested lists
  JsonValue get_non_tensor(const NestedKey& key) const;
  bool is_non_tensor(const NestedKey& key) const;
  //! get(key)[index]
  at::Tensor get_at(const NestedKey& key, const Index& index) const;
  //! upstream td[key]
  Entry operator[](const NestedKey& key) const;

  // ---------------------------------------------------------------- writing
  //! adds or replaces the value at key (no copy), creating intermediate TensorDicts; with
  //! SetOptions().inplace(true) copies into the existing leaf when there is one. Locked: only in-place works.
  TensorDict& set(const NestedKey& key, const Entry& value, const SetOptions& options = {});
  //! set of one top-level key without building a NestedKey (the hot path of td.set("obs", t)); same results
  TensorDict& set(const char* key, const Entry& value, const SetOptions& options = {});
  //! strict in-place copy into an existing leaf (KeyError if missing); allowed when locked
  TensorDict& set_(const NestedKey& key, const Entry& value);
  //! in-place write of value into get(key)[index]
  TensorDict& set_at_(const NestedKey& key, const at::Tensor& value, const Index& index);
  TensorDict& set_non_tensor(const NestedKey& key, const JsonValue& value);
  TensorDict& update(const TensorDict& other, const UpdateOptions& options = {});
  //! every key of other must exist here; copies in place
  TensorDict& update_(const TensorDict& other);
  //! update_ of the keys of other listed in keys_to_update (a key selects everything below it)
  TensorDict& update_(const TensorDict& other, const std::vector<NestedKey>& keys_to_update);
  TensorDict& update_at_(const TensorDict& other, const Index& index);
  //! removes and returns; KeyError if missing
  Entry pop(const NestedKey& key);
  Entry pop(const NestedKey& key, const Entry& default_value);
  TensorDict& del(const NestedKey& key);
  //! RenameOptions().safe(true): KeyError if new_key exists
  TensorDict& rename_key_(const NestedKey& old_key, const NestedKey& new_key, const RenameOptions& options = {});
  //! the value at key, after setting it to `default_value` when missing
  Entry setdefault(const NestedKey& key, const Entry& default_value);
  TensorDict& clear();
  //! fills the tensor at key with a scalar, in place
  TensorDict& fill_(const NestedKey& key, const at::Scalar& value);

  // ---------------------------------------------------------------- key-structure ops
  //! no copy; strict (the default): KeyError for a missing key; inplace: drops the other keys from self
  TensorDict select(const std::vector<NestedKey>& keys, const SelectOptions& options = {}) const;
  TensorDict exclude(const std::vector<NestedKey>& keys, const ExcludeOptions& options = {}) const;
  //! N+1 TensorDicts: one per key set, then the rest (inplace: the rest is self); KeyError for a key missing
  //! from self when strict
  std::vector<TensorDict> split_keys(const std::vector<std::vector<NestedKey>>& key_sets,
                                     const SelectOptions& options = {}) const;
  //! upstream split_keys(..., default=value, strict=False): a missing key gets `default_value` (an empty Entry,
  //! upstream's None: it is skipped); with strict (the default) `default_value` is ignored (a KeyError)
  std::vector<TensorDict> split_keys(const std::vector<std::vector<NestedKey>>& key_sets, const Entry& default_value,
                                     const SelectOptions& options = {}) const;
  TensorDict flatten_keys(const FlattenKeysOptions& options = {}) const;
  TensorDict flatten_keys(const std::string& separator) const { return flatten_keys(FlattenKeysOptions().separator(separator)); }
  TensorDict unflatten_keys(const FlattenKeysOptions& options = {}) const;
  TensorDict unflatten_keys(const std::string& separator) const {
    return unflatten_keys(FlattenKeysOptions().separator(separator));
  }
  //! same batch size and device, no leaves (EmptyOptions().recurse(true): keeps the sub-TensorDict skeleton)
  TensorDict empty(const EmptyOptions& options = {}) const;

  // ---------------------------------------------------------------- indexing (batch dims only)
  //! result batch size equals that of a dense tensor of shape batch_size indexed alike;
  //! td.index({}) / {Ellipsis} / {Slice()} return this very TensorDict
  TensorDict index(const Index& index) const;
  //! td[idx] = value: broadcast on the left as upstream; missing keys are preallocated (zeros of
  //! full size) and then written; existing keys are written in place
  TensorDict& index_put_(const Index& index, const TensorDict& value);
  //! td[row] = value for one integer row (upstream's `td[i] = row`): index_put_({row}, value) without building an
  //! Index, the spelling for a loop filling a buffer. A bool is not a row: index_put_({true}, value) keeps torch's
  //! meaning of a bool index, and index_put_(true, value) does not compile
  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  TensorDict& index_put_(I row, const TensorDict& value) {
    return put_row(static_cast<int64_t>(row), value);
  }
  //! every leaf's [idx] filled with the tensor (broadcast)
  TensorDict& index_put_(const Index& index, const at::Tensor& value);
  TensorDict& index_put_(const Index& index, const at::Scalar& value);

  // ---------------------------------------------------------------- shape ops (views where torch gives views)
  TensorDict view(BatchSize shape) const;
  TensorDict reshape(BatchSize shape) const;
  TensorDict flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  TensorDict unflatten(int64_t dim, BatchSize sizes) const;
  //! all size-1 batch dims
  TensorDict squeeze() const;
  TensorDict squeeze(int64_t dim) const;
  TensorDict unsqueeze(int64_t dim) const;
  TensorDict permute(std::vector<int64_t> dims) const;
  TensorDict transpose(int64_t dim0, int64_t dim1) const;
  //! stride-0 views, no allocation; shape may start with new leading dims; -1 keeps a dim
  TensorDict expand(BatchSize shape) const;
  std::vector<TensorDict> unbind(int64_t dim = 0) const;
  std::vector<TensorDict> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<TensorDict> split(std::vector<int64_t> split_sizes, int64_t dim = 0) const;
  std::vector<TensorDict> chunk(int64_t chunks, int64_t dim = 0) const;
  //! a regular in-memory TensorDict with this one's values (upstream to_tensordict): a copy, for every node
  //! kind (an HDF5 file or a Redis store: one read request)
  TensorDict to_tensordict() const;
  TensorDict contiguous() const;

  // ---------------------------------------------------------------- apply family
  TensorDict apply(const LeafFn& fn, const ApplyOptions& options = {}) const;
  TensorDict apply(const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                   const ApplyOptions& options = {}) const;
  TensorDict& apply_(const LeafFn& fn);
  TensorDict& apply_(const MultiLeafFn& fn, const std::vector<TensorDict>& others);
  TensorDict named_apply(const NamedLeafFn& fn, const ApplyOptions& options = {}) const;
  TensorDict named_apply(const NamedMultiLeafFn& fn, const std::vector<TensorDict>& others,
                         const ApplyOptions& options = {}) const;

  //! deep copy (recurse) or structure-only copy sharing the leaves; never locked
  TensorDict clone(const CloneOptions& options = {}) const;
  TensorDict copy() const { return clone(CloneOptions().recurse(false)); }
  //! a new tree of TensorDict nodes sharing every leaf and keeping the memmap / shared flags, directories
  //! and class records, unlocked at every level (lock_() it when done): adding a key to one does not show
  //! in the other. How the store actors build the next snapshot of a store's structure.
  TensorDict shallow_copy() const;
  TensorDict to(at::Device device) const;
  TensorDict to(at::ScalarType dtype) const;
  TensorDict& zero_();
  TensorDict masked_fill(const at::Tensor& mask, const at::Scalar& value) const;
  TensorDict& masked_fill_(const at::Tensor& mask, const at::Scalar& value);
  //! where(cond, self, other) leaf by leaf; cond is broadcast on the batch dims
  TensorDict where(const at::Tensor& condition, const TensorDict& other) const;
  TensorDict where(const at::Tensor& condition, const at::Scalar& other) const;

  // ---------------------------------------------------------------- arithmetic, comparison, reductions
  TensorDict add(const TensorDict& other) const;
  TensorDict add(const at::Tensor& other) const;   //!< broadcast left to the batch dims
  TensorDict add(const at::Scalar& other) const;
  TensorDict sub(const TensorDict& other) const;
  TensorDict sub(const at::Tensor& other) const;
  TensorDict sub(const at::Scalar& other) const;
  TensorDict mul(const TensorDict& other) const;
  TensorDict mul(const at::Tensor& other) const;
  TensorDict mul(const at::Scalar& other) const;
  TensorDict div(const TensorDict& other) const;
  TensorDict div(const at::Tensor& other) const;
  TensorDict div(const at::Scalar& other) const;
  //! reflected forms: other - td, other / td (upstream __rsub__ / __rtruediv__)
  TensorDict rsub(const at::Tensor& other) const;
  TensorDict rsub(const at::Scalar& other) const;
  TensorDict rdiv(const at::Tensor& other) const;
  TensorDict rdiv(const at::Scalar& other) const;
  //! in place (torch's rules: the result must keep the batch size and be castable to each leaf's dtype)
  TensorDict& add_(const TensorDict& other);
  TensorDict& add_(const at::Tensor& other);
  TensorDict& add_(const at::Scalar& other);
  TensorDict& sub_(const TensorDict& other);
  TensorDict& sub_(const at::Tensor& other);
  TensorDict& sub_(const at::Scalar& other);
  TensorDict& mul_(const TensorDict& other);
  TensorDict& mul_(const at::Tensor& other);
  TensorDict& mul_(const at::Scalar& other);
  TensorDict& div_(const TensorDict& other);
  TensorDict& div_(const at::Tensor& other);
  TensorDict& div_(const at::Scalar& other);
  //! TD of bool; TD-vs-TD needs equal key sets (KeyError)
  TensorDict eq(const TensorDict& other) const;
  TensorDict eq(const at::Scalar& other) const;
  TensorDict eq(const at::Tensor& other) const;  //!< broadcast as arithmetic
  TensorDict ne(const TensorDict& other) const;
  TensorDict ne(const at::Scalar& other) const;
  TensorDict ne(const at::Tensor& other) const;  //!< broadcast as arithmetic
  TensorDict lt(const TensorDict& other) const;
  TensorDict lt(const at::Scalar& other) const;
  TensorDict lt(const at::Tensor& other) const;  //!< broadcast as arithmetic
  TensorDict le(const TensorDict& other) const;
  TensorDict le(const at::Scalar& other) const;
  TensorDict le(const at::Tensor& other) const;  //!< broadcast as arithmetic
  TensorDict gt(const TensorDict& other) const;
  TensorDict gt(const at::Scalar& other) const;
  TensorDict gt(const at::Tensor& other) const;  //!< broadcast as arithmetic
  TensorDict ge(const TensorDict& other) const;
  TensorDict ge(const at::Scalar& other) const;
  TensorDict ge(const at::Tensor& other) const;  //!< broadcast as arithmetic
  //! over every leaf
  bool all() const;
  bool any() const;
  //! along a batch dim: a TensorDict with that dim removed
  TensorDict all(int64_t dim) const;
  TensorDict any(int64_t dim) const;
  //! dim unset: every dim of each leaf (upstream v0.14: a TensorDict of 0-dim leaves, batch []); or one batch dim
  TensorDict sum(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  //! over several batch dims (upstream dim=(0, 1))
  TensorDict sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  //! as sum; integer leaves raise as torch.mean does (RuntimeError)
  TensorDict mean(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  TensorDict mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  //! upstream reduce=True: one tensor of the reduced batch shape over every leaf's elements (dims unset: a
  //! 0-dim tensor over everything)
  at::Tensor sum_reduce(const std::optional<std::vector<int64_t>>& dims = std::nullopt, bool keepdim = false) const;
  at::Tensor mean_reduce(const std::optional<std::vector<int64_t>>& dims = std::nullopt, bool keepdim = false) const;
  //! same keys, leaves equal (torch::equal) and same batch size
  bool equal(const TensorDict& other) const;

  // ---------------------------------------------------------------- lock
  //! locks this TensorDict and every sub-TensorDict; returns *this
  TensorDict& lock_();
  //! LockedError when a locked parent still holds this TensorDict
  TensorDict& unlock_();
  bool is_locked() const;
  //! flags set by memmap_() / share_memory_() (the flag, not leaf inspection, as upstream)
  bool is_memmap() const;
  bool is_shared() const;

  // ---------------------------------------------------------------- persistence (memmap directories)
  //! writes every leaf to `prefix` in Python tensordict's directory format (meta.json per node, raw
  //! `<encoded key>.memmap` leaves) and swaps the leaves for memory-mapped tensors in place; locks.
  //! An empty prefix maps the leaves to anonymous shared memory instead. Leaves already mapped to their
  //! target file are not rewritten; leaves mapped elsewhere need copy_existing (ValueError otherwise).
  TensorDict& memmap_(const std::string& prefix = "", const MemmapOptions& options = {});
  //! memmap_ into a new TensorDict: this one is left as it is
  TensorDict memmap(const std::string& prefix = "", const MemmapOptions& options = {}) const;
  //! a new zero-filled memmap TensorDict with the same structure, shapes and dtypes (files are
  //! preallocated sparse, nothing is copied; expanded leaves get full-size files)
  TensorDict memmap_like(const std::string& prefix = "", const MemmapOptions& options = {}) const;
  //! alias of memmap (upstream's save)
  TensorDict save(const std::string& prefix, const MemmapOptions& options = {}) const;
  //! loads a directory written by Python tensordict or by memmap/save: locked and is_memmap(); leaves
  //! map the files (shared mapping when the file is writable and options.writable, else private copy-on-write).
  //! Symlinks below the prefix and missing leaf files are FormatErrors unless options allow them.
  static TensorDict load_memmap(const std::string& prefix, const LoadOptions& options = {});
  static TensorDict load(const std::string& prefix, const LoadOptions& options = {});
  //! loads `prefix` into this TensorDict (its entries are replaced by the loaded ones; with
  //! LoadOptions::inplace, the saved bytes are read into its own leaves)
  TensorDict& load_memmap_(const std::string& prefix, const LoadOptions& options = {});
  //! re-reads meta.json of this memmap TensorDict (keys added by other processes appear), with the default
  //! LoadOptions (symlinks and missing leaf files refused)
  TensorDict& memmap_refresh_();
  // make_memmap and memmap_prefix: tensordict/memmap_storage.hpp
  //! the Python class recorded on disk: "TensorDict", or a tensorclass name such as "Pair"
  std::string type_name() const;
  //! the Python class path of the tensorclass this TensorDict is a record of ("__main__.Pair", read from a
  //! directory's meta.json or a TensorClass's declaration); "" for a plain TensorDict
  std::string class_path() const;

  // ---------------------------------------------------------------- shared memory
  //! moves every leaf into shared-memory segments (named POSIX shm, one segment per TensorDict tree) and
  //! locks; ValueError on a memmap TensorDict (mutually exclusive, as upstream)
  TensorDict& share_memory_();
  // share_handle, from_share_handle and the segments' name prefix: tensordict/shared_storage.hpp

  //! the schema-driven constructor (upstream from_schema): element shapes prefixed by batch_size,
  //! zero-filled; storage "" / "none" (memory), "memmap" (needs options.prefix), "shared"
  //! upstream TensorDict.from_module: the module's parameters and buffers (in registration order), then its
  //! submodules as sub-TensorDicts by name ("0", "1", ... for a Sequential), batch size []. The leaves are new
  //! handles on the module's storage (writes to their values reach the module; a later swap into the module
  //! does not change them), with the module's requires_grad; undefined buffers are left out
  //! (tensordict/module.hpp has ModuleSwap, the `with params.to_module(module):` of C++)
  static TensorDict from_module(const torch::nn::Module& module, const FromModuleOptions& options = {});
  //! upstream td.to_module(module): writes the leaves into the module's parameters and buffers, recursively by
  //! submodule name. Every key is checked first (KeyError: a key with no parameter, buffer or submodule of that
  //! name, or, strict, a parameter or buffer with no value; TypeError: a dtype that differs or a tensor where a
  //! submodule is; ValueError: a shape or device that differs), so a mismatch leaves the module as it was. By
  //! default the module's tensors take the values' storage (set_ under no-grad: the module keeps its own tensor
  //! objects, their requires_grad and grads); `inplace` copies into their storage instead. Returns the previous
  //! values (handles on the storage they had) when return_swap, else an undefined TensorDict
  TensorDict to_module(torch::nn::Module& module, const ToModuleOptions& options = {}) const;

  // ---------------------------------------------------------------- consolidate (upstream's consolidate)
  //! a locked copy whose leaves are views into one uint8 storage, laid out as upstream lays it out (leaves in
  //! insertion order, depth first, each padded with zeros to 8 bytes), with upstream's metadata record; a
  //! consolidated TensorDict returns itself. Non-tensor leaves live in the metadata only.
  TensorDict consolidate(const ConsolidateOptions& options = {}) const;
  //! true on a result of consolidate (unlock_ drops the consolidation, as upstream)
  bool is_consolidated() const;
  //! the storage of a consolidated TensorDict (1-D uint8); undefined otherwise
  at::Tensor consolidated_storage() const;
  //! the metadata record of a consolidated TensorDict (upstream's _consolidated["metadata"]); null otherwise
  JsonValue consolidated_metadata() const;
  //! rebuilds a consolidated TensorDict from a storage and its metadata record (upstream's
  //! _rebuild_tensordict_files_consolidated): the leaves are views into `storage`. FormatError when the
  //! record does not describe the storage
  static TensorDict from_consolidated(const at::Tensor& storage, const JsonValue& metadata);
  //! reads a file written by consolidate(filename) (ours or Python's): its leaves map the file
  static TensorDict from_consolidated(const std::string& filename);

  // ---------------------------------------------------------------- distributed (tensordict/distributed.hpp)
  // upstream's send / recv / isend / irecv / init_remote / broadcast / reduce / all_reduce over a c10d process
  // group, leaf by leaf in upstream's order and tags, so that a Python rank can take part. Defined in api/
  // (link tensordict::tensordict). Failures of the group (a peer that died or did not answer within the
  // group's timeout) are DistributedErrors.
  //! sends every tensor leaf to rank `dst` (sorted keys, depth first; non-tensor leaves are not sent)
  void send(int dst, const DistOptions& options = {}) const;
  //! receives every tensor leaf from rank `src` into this TensorDict's leaves (same structure as the sender's);
  //! returns the last tag used (upstream), nullopt for a consolidated receive
  std::optional<int64_t> recv(int src, const DistOptions& options = {});
  //! send without waiting: the pending sends (wait_all / wait_any) and the last tag
  dist::Pending isend(int dst, const DistOptions& options = {}) const;
  //! recv without waiting: the leaves are written as the receives complete
  dist::Pending irecv(int src, const DistOptions& options = {});
  //! sends the structure (metadata) and then the data to `dst`, which builds the TensorDict from it with
  //! from_remote_init (upstream's init_remote)
  void init_remote(int dst, const DistOptions& options = {}) const;
  static TensorDict from_remote_init(int src, const DistOptions& options = {});
  //! upstream's broadcast: rank `src` sends its (consolidated) TensorDict, every rank returns it
  TensorDict broadcast(int src, const DistOptions& options = {}) const;
  //! upstream's reduce into rank `dst`'s leaves (sorted keys); pending when options.async_op
  dist::Pending reduce(int dst, dist::ReduceOp op = dist::ReduceOp::Sum, const DistOptions& options = {});
  //! upstream's all_reduce of every leaf (insertion order); pending when options.async_op
  dist::Pending all_reduce(dist::ReduceOp op = dist::ReduceOp::Sum, const DistOptions& options = {});
  //! upstream's all_gather: every rank's TensorDict, by rank
  std::vector<TensorDict> all_gather(const DistOptions& options = {}) const;

  static TensorDict from_schema(const Schema& schema, const BatchSize& batch_size,
                                const std::string& storage = "", const MemmapOptions& options = {});
  //! from_schema on a storage driver an upper layer registered (register_storage_driver): "h5" with H5Options,
  //! "redis" with RedisOptions (api/)
  static TensorDict from_schema(const Schema& schema, const BatchSize& batch_size, const std::string& storage,
                                const StorageOptions& options);

  // ---------------------------------------------------------------- map (parallel, see tensordict/map.hpp)
  //! upstream map: splits along options.dim(), runs fn on worker actors, restacks in order (or writes into
  //! options.out()); an undefined TensorDict when out is memmap/shared or every fn result is undefined.
  //! chunksize(0) restacks with maybe_dense_stack: a LazyStackedTensorDict when the per-element results
  //! differ in leaf shapes, keys or batch sizes (upstream test_map_unbind)
  TensorDict map(const MapFn& fn, const MapOptions& options) const;
  //! map with a function registered by name (register_map_fn): the form worker processes can run
  //! (MapOptions().worker_processes(n)); KeyError when no function has that name
  TensorDict map(const std::string& fn_name, const MapOptions& options) const;
  //! upstream map_iter: the results one by one (in chunk order, or as completed with shuffle)
  MapIter map_iter(const MapFn& fn, const MapOptions& options) const;

  // ---------------------------------------------------------------- the node behind the handle
  //! the undefined handle (upstream's None): defined() is false
  static TensorDict undefined() { return TensorDict(std::shared_ptr<Node>()); }
  //! a handle over any node (tensordict/node.hpp)
  explicit TensorDict(std::shared_ptr<Node> node);
  const std::shared_ptr<Node>& node() const { return node_; }

  // ---------------------------------------------------------------- typed wrappers (tensordict/typed.hpp)
  //! the schema of the typed wrapper this handle is (TypedTensorDict / TensorClass), or null
  const std::shared_ptr<const TypedSchema>& typed_schema() const { return typed_; }
  //! the same storage under another schema (null: a plain TensorDict); no validation, no copy
  TensorDict with_schema(std::shared_ptr<const TypedSchema> schema) const;
  //! node() wrapped with the schema when there is one: what a node that hands out this TensorDict returns
  std::shared_ptr<Node> node_with_schema() const;
  explicit TensorDict(std::shared_ptr<TensorDictImpl> impl);

 private:
  //! the typed wrappers' field getters take the untyped lookup on the dense node (no other caller)
  template <class D, class Parent>
  friend class TypedTensorDict;
  template <class D, class Parent>
  friend class TensorClass;
  bool is_dense() const { return dense_ != nullptr; }
  //! index_put_(row, value) for an integer row: its node's put_row
  TensorDict& put_row(int64_t row, const TensorDict& value);
  //! the dense node, or NotImplementedError naming `what` and the node's type
  TensorDictImpl* d(const char* what = nullptr) const;
  std::shared_ptr<Node> node_;
  TensorDictImpl* dense_ = nullptr;  //!< node_ when it is dense (the fast paths), else nullptr
  std::shared_ptr<const TypedSchema> typed_;  //!< the typed wrapper's schema, or null
};

//! the value at a key: a tensor, a sub-TensorDict, a NonTensorData, a NonTensorStack, or (only as
//! construction input) a nested Dict
class Entry {
 public:
  enum class Kind { None, Tensor, TensorDict, NonTensorData, NonTensorStack, Dict };
  Entry() = default;
  Entry(at::Tensor t);
  Entry(TensorDict td);
  Entry(NonTensorData d);
  Entry(NonTensorStack s);
  Entry(Dict d);
  Entry(const char* s);
  Entry(std::string s);
  //! a non-tensor value (broadcast over the batch when set)
  explicit Entry(JsonValue v);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  bool is_tensordict() const { return kind_ == Kind::TensorDict; }
  bool is_non_tensor_data() const { return kind_ == Kind::NonTensorData; }
  bool is_non_tensor_stack() const { return kind_ == Kind::NonTensorStack; }
  bool is_non_tensor() const { return is_non_tensor_data() || is_non_tensor_stack(); }
  bool is_dict() const { return kind_ == Kind::Dict; }
  //! typed access; TypeError naming the actual kind otherwise (tensor() inline: the row paths read it per leaf)
  const at::Tensor& tensor() const {
    if (kind_ != Kind::Tensor) [[unlikely]]
      wrong_kind(Kind::Tensor, kind_);
    return tensor_;
  }
  TensorDict tensordict() const;
  const NonTensorData& non_tensor_data() const;
  const NonTensorStack& non_tensor_stack() const;
  const Dict& dict() const;
  //! NonTensorData value or NonTensorStack nested list
  JsonValue non_tensor_value() const;
  //! leading dims that count as batch: tensor sizes, TD / non-tensor batch sizes
  BatchSize shape() const;
  static const char* kind_name(Kind k);

 private:
  [[noreturn]] static void wrong_kind(Kind want, Kind got);
  Kind kind_ = Kind::None;
  at::Tensor tensor_;
  std::shared_ptr<Node> td_;
  std::shared_ptr<const TypedSchema> typed_;  //!< a typed sub-TensorDict's schema
  NonTensorData nt_;
  NonTensorStack nts_;
  std::shared_ptr<Dict> dict_;
};

// ---------------------------------------------------------------- free functions
//! dense stack: identical batch sizes, key sets and leaf shapes; out: written in place
TensorDict stack(const std::vector<TensorDict>& tds, int64_t dim = 0,
                 std::optional<TensorDict> out = std::nullopt);
TensorDict cat(const std::vector<TensorDict>& tds, int64_t dim = 0,
               std::optional<TensorDict> out = std::nullopt);
TensorDict zeros_like(const TensorDict& td);
TensorDict ones_like(const TensorDict& td);
TensorDict empty_like(const TensorDict& td);

TensorDict operator+(const TensorDict& a, const TensorDict& b);
TensorDict operator-(const TensorDict& a, const TensorDict& b);
TensorDict operator*(const TensorDict& a, const TensorDict& b);
TensorDict operator/(const TensorDict& a, const TensorDict& b);
TensorDict operator+(const TensorDict& a, const at::Scalar& b);
TensorDict operator-(const TensorDict& a, const at::Scalar& b);
TensorDict operator*(const TensorDict& a, const at::Scalar& b);
TensorDict operator/(const TensorDict& a, const at::Scalar& b);
TensorDict operator+(const TensorDict& a, const at::Tensor& b);
TensorDict operator-(const TensorDict& a, const at::Tensor& b);
TensorDict operator*(const TensorDict& a, const at::Tensor& b);
TensorDict operator/(const TensorDict& a, const at::Tensor& b);
//! reflected: `2 - td`, `1 / td`, `t - td` ...
TensorDict operator+(const at::Scalar& a, const TensorDict& b);
TensorDict operator-(const at::Scalar& a, const TensorDict& b);
TensorDict operator*(const at::Scalar& a, const TensorDict& b);
TensorDict operator/(const at::Scalar& a, const TensorDict& b);
TensorDict operator+(const at::Tensor& a, const TensorDict& b);
TensorDict operator-(const at::Tensor& a, const TensorDict& b);
TensorDict operator*(const at::Tensor& a, const TensorDict& b);
TensorDict operator/(const at::Tensor& a, const TensorDict& b);
//! in place
TensorDict& operator+=(TensorDict& a, const TensorDict& b);
TensorDict& operator-=(TensorDict& a, const TensorDict& b);
TensorDict& operator*=(TensorDict& a, const TensorDict& b);
TensorDict& operator/=(TensorDict& a, const TensorDict& b);
TensorDict& operator+=(TensorDict& a, const at::Tensor& b);
TensorDict& operator-=(TensorDict& a, const at::Tensor& b);
TensorDict& operator*=(TensorDict& a, const at::Tensor& b);
TensorDict& operator/=(TensorDict& a, const at::Tensor& b);
TensorDict& operator+=(TensorDict& a, const at::Scalar& b);
TensorDict& operator-=(TensorDict& a, const at::Scalar& b);
TensorDict& operator*=(TensorDict& a, const at::Scalar& b);
TensorDict& operator/=(TensorDict& a, const at::Scalar& b);
//! comparisons: TD of bool
TensorDict operator==(const TensorDict& a, const TensorDict& b);
TensorDict operator!=(const TensorDict& a, const TensorDict& b);
TensorDict operator<(const TensorDict& a, const TensorDict& b);
TensorDict operator<=(const TensorDict& a, const TensorDict& b);
TensorDict operator>(const TensorDict& a, const TensorDict& b);
TensorDict operator>=(const TensorDict& a, const TensorDict& b);
TensorDict operator==(const TensorDict& a, const at::Scalar& b);
TensorDict operator!=(const TensorDict& a, const at::Scalar& b);
TensorDict operator<(const TensorDict& a, const at::Scalar& b);
TensorDict operator<=(const TensorDict& a, const at::Scalar& b);
TensorDict operator>(const TensorDict& a, const at::Scalar& b);
TensorDict operator>=(const TensorDict& a, const at::Scalar& b);
TensorDict operator==(const TensorDict& a, const at::Tensor& b);
TensorDict operator!=(const TensorDict& a, const at::Tensor& b);
TensorDict operator<(const TensorDict& a, const at::Tensor& b);
TensorDict operator<=(const TensorDict& a, const at::Tensor& b);
TensorDict operator>(const TensorDict& a, const at::Tensor& b);
TensorDict operator>=(const TensorDict& a, const at::Tensor& b);

//! upstream's repr layout: fields sorted, shapes, dtypes, batch_size, device, is_shared
std::ostream& operator<<(std::ostream& os, const TensorDict& td);
std::string repr(const TensorDict& td);
std::string repr_batch_size(const BatchSize& bs);  //!< "torch.Size([3, 4])"

//! RAII: locks in the constructor, unlocks in the destructor (if it locked)
class LockGuard {
 public:
  explicit LockGuard(TensorDict td);
  ~LockGuard();
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  TensorDict td_;
  bool was_locked_;
};
//! RAII: unlocks in the constructor, re-locks in the destructor (upstream's `with td.unlock_():`)
class UnlockGuard {
 public:
  explicit UnlockGuard(TensorDict td);
  ~UnlockGuard();
  UnlockGuard(const UnlockGuard&) = delete;
  UnlockGuard& operator=(const UnlockGuard&) = delete;

 private:
  TensorDict td_;
  bool was_locked_;
};

}  // namespace tensordict
