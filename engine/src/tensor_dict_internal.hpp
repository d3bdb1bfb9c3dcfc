#pragma once
//! Internal to engine/: the TensorDict implementation object and helpers shared by the engine's sources.
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <tuple>
#include <utility>
#include <vector>

#include "tensordict/node.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/typed_schema.hpp"

namespace tensordict {

namespace detail {
struct ViewOrigin;
}

//! The dense node: leaves are at::Tensors (in memory, memory-mapped or in shared memory).
struct TensorDictImpl : Node {
  //! entries in insertion order
  std::vector<std::pair<std::string, Entry>> entries;
  bool is_memmap = false;
  bool is_shared = false;
  //! memmap: the directory this TensorDict is stored in (empty when anonymous / not memmap)
  std::string memmap_prefix;
  //! a view (td[idx]) of a memmap TensorDict saved to a directory or of a shared one: where it comes from,
  //! so that StorageSpec::of reopens it as that view (spec_internal.hpp); null otherwise, and after any
  //! non-batch operation (clone, apply, to: a new node)
  std::shared_ptr<const detail::ViewOrigin> origin;
  //! the Python class recorded on disk for a tensorclass ("<class '__main__.Pair'>"); empty for a plain
  //! TensorDict. Kept so that re-writing produces the same layout (tensorclass records, formats §1.7).
  std::string type_repr;
  //! tensorclass records: the non-tensor fields stored in the class's meta.json, and its pickle, verbatim
  std::optional<JsonValue> class_fields;
  std::optional<JsonValue::Bytes> class_pickle;
  //! consolidate(): the one uint8 storage every leaf of the tree is a view into, and this level's metadata
  //! record (upstream's _consolidated); null when not consolidated. unlock() drops it, as upstream
  struct Consolidated {
    at::Tensor storage;
    JsonValue metadata;
  };
  std::shared_ptr<const Consolidated> consolidated;

  TensorDictImpl* dense_node() override { return this; }
  const std::vector<std::pair<std::string, Entry>>* own_entries() const override { return &entries; }
  std::string type_name() const override { return "TensorDict"; }
  NodeCaps caps() const override;
  std::vector<std::string> keys() const override;
  std::optional<EntryMeta> meta(const std::string& key) const override;
  std::vector<std::pair<std::string, EntryMeta>> metas() const override;
  std::optional<Entry> read(const std::string& key) const override;
  using Node::read;
  void put(const std::string& key, const Entry& value) override { put_entry(key, value); }
  bool erase(const std::string& key) override;
  std::shared_ptr<Node> index(const Index& index) const override;
  std::vector<std::shared_ptr<Node>> child_nodes() const override;
  TensorDict to_dense() const override;
  void write(const Index& index, const TensorDict& value) override;
  void unlock() override;
  //! memmap saved to a directory, shared, or a view of one with its "index" (spec_index.cpp)
  std::string storage_spec() const override;

  // the operations' dense fast paths (Node's defaults run these on a store's dense_view())
  std::vector<std::pair<std::string, Entry>> read_all() const override { return entries; }
  void set_entry(const NestedKey& key, const Entry& value, bool inplace) override;
  void update_entry(const NestedKey& key, const Entry& value) override;
  void del_entry(const NestedKey& key) override;
  void rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) override;
  void clear(TensorDict& self) override;
  void fill(TensorDict& self, const NestedKey& key, const at::Scalar& value) override;
  void set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index) override;
  void set_batch_size(TensorDict& self, BatchSize batch_size) override;
  int64_t bytes(const TensorDict& self) const override;
  TensorDict empty(const TensorDict& self, bool recurse) const override;
  TensorDict select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict,
                    bool inplace) const override;
  TensorDict exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const override;
  TensorDict flatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const override;
  TensorDict unflatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const override;
  TensorDict clone(const TensorDict& self, bool recurse) const override;
  TensorDict to(const TensorDict& self, at::Device device) const override;
  TensorDict view(const TensorDict& self, BatchSize shape) const override;
  TensorDict reshape(const TensorDict& self, BatchSize shape) const override;
  TensorDict flatten(const TensorDict& self, int64_t start_dim, int64_t end_dim) const override;
  TensorDict unflatten(const TensorDict& self, int64_t dim, BatchSize sizes) const override;
  TensorDict squeeze(const TensorDict& self, std::optional<int64_t> dim) const override;
  TensorDict unsqueeze(const TensorDict& self, int64_t dim) const override;
  TensorDict permute(const TensorDict& self, std::vector<int64_t> dims) const override;
  TensorDict transpose(const TensorDict& self, int64_t dim0, int64_t dim1) const override;
  TensorDict expand(const TensorDict& self, BatchSize shape) const override;
  std::vector<TensorDict> unbind(const TensorDict& self, int64_t dim) const override;
  std::vector<TensorDict> split(const TensorDict& self, std::vector<int64_t> split_sizes, int64_t dim) const override;
  TensorDict contiguous(const TensorDict& self) const override;
  TensorDict to_tensordict(const TensorDict& self) const override;
  TensorDict dense_form(const TensorDict& self) const override { return self; }
  void index_put_(TensorDict& self, const Index& index, const TensorDict& value) override;
  void put_row(TensorDict& self, int64_t row, const TensorDict& value) override;
  void index_put_(TensorDict& self, const Index& index, const at::Tensor& value) override;
  void index_put_(TensorDict& self, const Index& index, const at::Scalar& value) override;
  void memmap_(TensorDict& self, const std::string& prefix, const MemmapOptions& options) override;
  TensorDict memmap(const TensorDict& self, const std::string& prefix, const MemmapOptions& options) const override;
  TensorDict memmap_like(const TensorDict& self, const std::string& prefix,
                         const MemmapOptions& options) const override;
  void share_memory_(TensorDict& self) override;
  bool equal(const TensorDict& self, const TensorDict& other) const override;
  TensorDict apply(const TensorDict& self, const LeafFn& fn, const ApplyOptions& options) const override;
  TensorDict apply(const TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                   const ApplyOptions& options) const override;
  void apply_(TensorDict& self, const LeafFn& fn) override;
  void apply_(TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others) override;
  TensorDict named_apply(const TensorDict& self, const NamedLeafFn& fn, const ApplyOptions& options) const override;
  TensorDict named_apply(const TensorDict& self, const NamedMultiLeafFn& fn, const std::vector<TensorDict>& others,
                         const ApplyOptions& options) const override;
  void zero_(TensorDict& self) override;
  TensorDict masked_fill(const TensorDict& self, const at::Tensor& mask, const at::Scalar& value) const override;
  void masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value) override;
  TensorDict where(const TensorDict& self, const at::Tensor& condition, const TensorDict& other) const override;
  TensorDict where(const TensorDict& self, const at::Tensor& condition, const at::Scalar& other) const override;
  void add_(TensorDict& self, const TensorDict& other) override;
  void add_(TensorDict& self, const at::Scalar& other) override;
  void mul_(TensorDict& self, const at::Scalar& other) override;
  TensorDict reduce(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                    bool keepdim) const override;
  at::Tensor reduce_leaves(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                           bool keepdim) const override;

  Entry* find(const std::string& key) {
    for (auto& kv : entries)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  const Entry* find(const std::string& key) const {
    for (auto& kv : entries)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  //! replaces or appends (keeps the position of an existing key)
  void put_entry(const std::string& key, Entry value) {
    if (Entry* e = find(key)) {
      *e = std::move(value);
    } else {
      entries.emplace_back(key, std::move(value));
    }
  }
  bool erase_entry(const std::string& key) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->first == key) {
        entries.erase(it);
        return true;
      }
    }
    return false;
  }
};

namespace detail {

//! the typed node over `source` (tensordict/typed_schema.hpp); `source` itself when schema is null
std::shared_ptr<Node> make_typed_node(std::shared_ptr<Node> source, std::shared_ptr<const TypedSchema> schema);
//! the source under any typed nodes, and the outermost schema (null when `node` is not typed)
std::pair<std::shared_ptr<Node>, std::shared_ptr<const TypedSchema>> unwrap_typed_node(std::shared_ptr<Node> node);
//! `out` under the schema of `like` (upstream's _wrap_td: results of ops keep the typed class, unvalidated)
inline TensorDict keep_type(const TensorDict& like, TensorDict out) {
  if (like.typed_schema() && out.defined()) return out.with_schema(like.typed_schema());
  return out;
}
inline std::vector<TensorDict> keep_type(const TensorDict& like, std::vector<TensorDict> out) {
  if (like.typed_schema())
    for (auto& t : out) t = keep_type(like, std::move(t));
  return out;
}

std::string shape_str(at::IntArrayRef shape);          //!< "torch.Size([3, 4])"
std::string shape_list(at::IntArrayRef shape);         //!< "[3, 4]"
std::string dtype_str(at::ScalarType dtype);          //!< "torch.float32" (defined in repr.cpp)
int64_t prod(at::IntArrayRef shape);
//! dim in [-ndim, ndim) (or [-ndim-1, ndim] with allow_end) -> [0, ndim); IndexError otherwise
int64_t normalize_dim(int64_t dim, int64_t ndim, bool allow_end = false);

//! a new TensorDict with the same device (and no keys) and the given batch size
//! an in-place op run over several TensorDicts in turn (a lazy stack's members, upstream's order; the sub-TensorDicts
//! of other node kinds apply_ reaches): one that refuses it (a fn that throws, another shape) puts the ones before it back from copies taken before each (the last keeps none): the
//! project's rule, nothing half-written survives a failure. `save(m)` copies what op changes, `restore(m, copy)`
//! puts it back
template <class Save, class Op, class Restore>
void on_each_member(std::vector<TensorDict>& members, Save save, Op op, Restore restore) {
  std::vector<TensorDict> saved;
  saved.reserve(members.size());
  size_t done = 0;
  try {
    for (auto& m : members) {
      if (done + 1 < members.size()) saved.push_back(save(m));
      op(m);
      ++done;
    }
  } catch (...) {
    for (size_t i = done; i-- > 0;) {
      try {
        restore(members[i], saved[i]);
      } catch (...) {  // the member refuses its own values back: nothing more to do
      }
    }
    throw;
  }
}

//! on_each_member with whole copies: clone() before, update_() to put back
template <class Op>
void on_each_or_put_back(std::vector<TensorDict>& tds, Op op) {
  on_each_member(
      tds, [](const TensorDict& t) { return t.clone(); }, op, [](TensorDict& t, const TensorDict& copy) { t.update_(copy); });
}

TensorDict make_empty(const TensorDictImpl& like, BatchSize batch_size);
//! `value` can be written in place into the key `m` describes: its kind, and a tensor broadcast to the key's shape
//! (a shape with -1, a lazy stack's ragged dim, is not checked): TypeError / BatchSizeError otherwise
void check_copy_into(const EntryMeta& m, const Entry& value, const NestedKey& key);
//! leaf[index] = value for each (leaf, value, key) of a TensorDict of `batch`, planned as td[idx] = value is
//! (indexing_write.cpp): nothing is written when one of them refuses
void put_leaves_at(const BatchSize& batch, const Index& index,
                   const std::vector<std::tuple<at::Tensor, at::Tensor, std::string>>& leaves);
//! the meta of a value held in memory; a tensor's shared / memmap flags from its storage, or from its owner
//! (a memmap or shared TensorDict) when given
EntryMeta entry_meta(const Entry& e, bool owner_memmap = false, bool owner_shared = false);
//! repr's flags of a tensor: is_shared, and whether it is a MemoryMappedTensor (defined in repr.cpp)
void tensor_storage_flags(const at::Tensor& t, bool owner_memmap, bool owner_shared, bool* shared, bool* memmap);
//! the meta of a nested key through any node kinds (no data read); nullopt when a level is missing or a leaf
std::optional<EntryMeta> meta_at(const TensorDict& td, const NestedKey& key);
//! the keys keys(options) lists with their metas, without reading data (options.sort() is not applied)
std::vector<std::pair<NestedKey, EntryMeta>> key_metas(const TensorDict& td, const KeysOptions& options);
//! the node of td, or ValueError naming `what` for an undefined handle
Node& node_of(const TensorDict& td, const char* what);
//! the dense level the dense algorithms work on: td's dense node or a store's dense view (a node over its
//! own storage, kept alive by the node); NotImplementedError naming the node's type for any other node
std::shared_ptr<TensorDictImpl> impl_of(const TensorDict& td);
//! LockedError with upstream's text when td is locked (the node-generic paths)
void check_node_unlocked(const TensorDict& td);
//! LockedError (upstream's text) when `node` is locked
void check_node_unlocked(const Node& node);
[[noreturn]] void missing_in_node(const NestedKey& key, const TensorDict& where);
//! LockedError with upstream's text when locked
//! LockedError when impl is locked; hot callers test `impl.locked` first so that `what` is built only then
void check_unlocked(const TensorDictImpl& impl, const std::string& what);
//! converts a value for insertion into `impl` at `key`: Dicts become TensorDicts, non-tensors get the
//! batch size, tensors are moved to the device; checks the batch prefix (BatchSizeError otherwise)
Entry prepare_value(const TensorDictImpl& impl, const std::string& key, const Entry& value);
//! walks a nested key to the TensorDict holding its last part; creates missing levels when `create`
//! (KeyError when a level exists and is not a TensorDict); returns nullptr if missing and !create;
//! NotImplementedError when a level on the way is another node kind (dense_walk tells instead)
TensorDictImpl* walk(TensorDictImpl* root, const NestedKey& key, bool create);
//! a nested key whose level `part` is a leaf (of kind `kind`): KeyError when setting, ValueError when reading
//! (upstream's classes)
[[noreturn]] void through_leaf(const NestedKey& key, const std::string& part, const char* kind, bool set);
//! KeyError text for a missing key
[[noreturn]] void throw_missing_key(const NestedKey& key, const TensorDictImpl& where);

//! applies a batch-dim op to every entry: `fn` transforms a tensor whose leading dims are the old batch
//! dims (it must leave the trailing dims alone); sub-TensorDicts get new_batch + their extra batch dims;
//! NonTensorStacks are remapped through their position tensor. keep_flags: lock/memmap/shared survive.
TensorDict map_batch(const TensorDict& td, const BatchSize& new_batch,
                     const std::function<at::Tensor(const at::Tensor&)>& fn, bool keep_flags);

//! true when td and every sub-TensorDict below it are dense nodes (or have a dense view)
bool is_dense_tree(const TensorDict& td);
//! td when is_dense_tree(td), else a copy of its structure (leaves shared) in which every node of another
//! kind is replaced by its dense form (contiguous()): what read-only dense algorithms walk
TensorDict dense_tree(const TensorDict& td);
//! self[...] = dense (every leaf of dense, one write request to self's node)
void write_back(const TensorDict& self, const TensorDict& dense);

//! propagates the lock to children (registering `parent` as a locked parent)
void lock_children(const std::shared_ptr<Node>& parent);
//! true when `node` holds a sub-node anywhere below that is `target`
bool contains_node(const Node& node, const Node* target);

}  // namespace detail
}  // namespace tensordict
