#pragma once
//! Internal to engine/: the TensorDict implementation object and helpers shared by the engine's sources.
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensordict/node.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/typed_schema.hpp"

namespace tensordict {

//! The dense node: leaves are at::Tensors (in memory, memory-mapped or in shared memory).
struct TensorDictImpl : Node {
  //! entries in insertion order
  std::vector<std::pair<std::string, Entry>> entries;
  bool is_memmap = false;
  bool is_shared = false;
  //! memmap: the directory this TensorDict is stored in (empty when anonymous / not memmap)
  std::string memmap_prefix;
  //! the Python class recorded on disk for a tensorclass ("<class '__main__.Pair'>"); empty for a plain
  //! TensorDict. Kept so that re-writing produces the same layout (tensorclass records, formats §1.7).
  std::string type_repr;
  //! tensorclass records: the non-tensor fields stored in the class's meta.json, and its pickle, verbatim
  std::optional<JsonValue> class_fields;
  std::optional<JsonValue::Bytes> class_pickle;

  NodeType kind() const override { return NodeType::Dense; }
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
TensorDict make_empty(const TensorDictImpl& like, BatchSize batch_size);
//! the meta of a value held in memory; a tensor's shared / memmap flags from its storage, or from its owner
//! (a memmap or shared TensorDict) when given
EntryMeta entry_meta(const Entry& e, bool owner_memmap = false, bool owner_shared = false);
//! repr's flags of a tensor: is_shared, and whether it is a MemoryMappedTensor (defined in repr.cpp)
void tensor_storage_flags(const at::Tensor& t, bool owner_memmap, bool owner_shared, bool* shared, bool* memmap);
//! the meta of a nested key through any node kinds (no data read); nullopt when a level is missing or a leaf
std::optional<EntryMeta> meta_at(const TensorDict& td, const NestedKey& key);
//! the keys keys(options) lists with their metas, without reading data (options.sort() is not applied)
std::vector<std::pair<NestedKey, EntryMeta>> key_metas(const TensorDict& td, const KeysOptions& options);
//! LockedError with upstream's text when locked
//! LockedError when impl is locked; hot callers test `impl.locked` first so that `what` is built only then
void check_unlocked(const TensorDictImpl& impl, const std::string& what);
//! converts a value for insertion into `impl` at `key`: Dicts become TensorDicts, non-tensors get the
//! batch size, tensors are moved to the device; checks the batch prefix (BatchSizeError otherwise)
Entry prepare_value(const TensorDictImpl& impl, const std::string& key, const Entry& value);
//! thrown by walk when a level is not a dense node: the caller takes its generic path
struct NotDense {};
//! walks a nested key to the TensorDict holding its last part; creates missing levels when `create`
//! (KeyError when a level exists and is not a TensorDict); returns nullptr if missing and !create
TensorDictImpl* walk(TensorDictImpl* root, const NestedKey& key, bool create);
const TensorDictImpl* walk(const TensorDictImpl* root, const NestedKey& key);
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
//! a node whose leaves live elsewhere and are reached through requests (HDF5, Redis): neither dense, nor a
//! lazy stack, nor a store with a dense view. Operations without a form of their own for it run on its
//! dense form (contiguous(): one read request); in-place ones then write the result back (one request).
bool is_remote(const TensorDict& td);
//! self[...] = dense (every leaf of dense, one write request to self's node)
void write_back(const TensorDict& self, const TensorDict& dense);

//! propagates the lock to children (registering `parent` as a locked parent)
void lock_children(const std::shared_ptr<Node>& parent);
//! true when `node` holds a sub-node anywhere below that is `target`
bool contains_node(const Node& node, const Node* target);

}  // namespace detail
}  // namespace tensordict
