#pragma once
// (internal) The one store node: a TensorDict whose leaves live in a backends::LeafStore behind its store actor
// (actors/store_client.hpp): an HDF5 file or group (PersistentTensorDict), a Redis store (TensorDictStore), a
// memmap or shared-memory store (Store::tensordict()). A node is (store, level path, resolved index): indexing
// composes the index without I/O; reads and writes of one user call become ONE request to the store covering
// every leaf, which reads whole rows along dim 0 (sorted, unique) and re-indexes them in memory. A dense store
// (memmap, shared: its leaves are in this process's memory) is read through its published snapshot instead:
// the node's keys, reads and indexing are the snapshot's (zero-copy views, no request), its dense_view() is the
// snapshot, and only what changes the structure (a new key) goes to the store.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/actors/store_client.hpp"
#include "tensordict/node.hpp"
#include "tensordict/resolved_index.hpp"

namespace tensordict {
namespace remote {

using backends::LeafPath;

//! the structure of one store as last listed: its levels (keys in order, batch size) and leaves (dtype,
//! shape); shared by every node over the store and re-listed after each structural change
class RemoteTree {
 public:
  //! lists the store. `batch`: the root batch size (nullopt: the store's recorded one, else inferred per
  //! level from the leaves' shapes as upstream's from_h5 does). `nested_batch_root`: nested levels take the
  //! root's batch (Redis; HDF5 with a given batch size) instead of their own inferred one.
  RemoteTree(std::shared_ptr<actors::StoreClient> client, std::optional<BatchSize> batch,
             std::optional<at::Device> device, std::string type_name);

  struct Level {
    BatchSize batch;
    std::vector<std::string> keys;
    //! per key: its leaf, or nullptr for a nested level (valid while the Snapshot it came from lives)
    std::vector<const backends::LeafInfo*> infos;
  };
  //! the structure as one immutable value: readers take it once per call (one lock, no copies) and look
  //! levels and leaves up in it; every change publishes a new one
  struct Snapshot {
    std::map<LeafPath, Level> levels;
    std::map<LeafPath, backends::LeafInfo> leaves;
    std::map<LeafPath, BatchSize> fixed;  //!< batch sizes decided once (at open, or by set_batch)
    BatchSize root_batch;
    const Level* level(const LeafPath& path) const;
    const backends::LeafInfo* leaf(const LeafPath& path) const;
    //! the batch size of the level at path: its own, or its nearest existing ancestor's
    BatchSize batch_of(const LeafPath& path) const;
    //! sets every level's `infos` (after a copy)
    void link();
  };
  std::shared_ptr<const Snapshot> snapshot() const;
  const std::shared_ptr<actors::StoreClient>& client() const { return client_; }
  const std::optional<at::Device>& device() const { return device_; }
  const std::string& type_name() const { return type_name_; }
  //! how the engine creates datasets in this store (h5: chunks / gzip / shuffle)
  backends::CreateOptions create_options;

  //! the level at path (nullopt when the store has none: a level whose first leaf will create it)
  std::optional<Level> level(const LeafPath& path) const;
  std::optional<backends::LeafInfo> leaf(const LeafPath& path) const;
  //! the batch size of the level at path: its own, or its nearest existing ancestor's
  BatchSize batch_of(const LeafPath& path) const;
  //! records the batch size of a level the engine creates (a sub-TensorDict put into the store)
  void set_batch(const LeafPath& path, const BatchSize& batch);
  //! lists the store again (after a structural change)
  void reload();
  //! the tensor leaves under path, depth first in key order
  std::vector<backends::LeafInfo> tensor_leaves_under(const LeafPath& path) const;

 private:
  void build(const std::vector<backends::LeafInfo>& infos);
  std::shared_ptr<actors::StoreClient> client_;
  std::optional<at::Device> device_;
  std::string type_name_;
  bool infer_ = false;
  BatchSize root_batch_;
  mutable std::mutex mu_;
  std::map<LeafPath, BatchSize> fixed_;  //!< batch sizes decided once (at open, or by set_batch)
  std::shared_ptr<const Snapshot> snap_;
};

class RemoteNode : public Node {
 public:
  RemoteNode(std::shared_ptr<RemoteTree> tree, LeafPath path, std::optional<ResolvedIndex> index);

  std::string type_name() const override { return tree_->type_name(); }
  NodeCaps caps() const override;
  std::vector<std::string> keys() const override;
  //! from the structure the tree holds (no request): shapes under this node's index, non-tensors without
  //! their values
  std::optional<EntryMeta> meta(const std::string& key) const override;
  std::vector<std::pair<std::string, EntryMeta>> metas() const override;
  //! lists the store again (keys another process or handle added); a dense store refreshes its snapshot first
  void refresh() override;
  std::optional<Entry> read(const std::string& key) const override;
  std::vector<Entry> read(const std::vector<std::string>& keys, const Index& index) const override;
  void put(const std::string& key, const Entry& value) override;
  bool erase(const std::string& key) override;
  //! the key moved in the store, in one request and without reading its data (Redis RENAME, an HDF5 link move;
  //! a view's key is its store's, as upstream's SubTensorDict renames in its source); KeyError when it is missing
  //! or (safe) when the new key exists. A dense store (memmap, shared) keeps every key it made (other processes
  //! map its leaves by key): its store refuses (NotImplementedError), as it refuses erase
  void rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) override;
  //! every key of this level erased in one request (the store's batch size and records kept; a dense store refuses)
  void clear(TensorDict& self) override;
  std::shared_ptr<Node> index(const Index& index) const override;
  //! the selection over this node's level: this node's own index composed with `index` (resolved once)
  std::optional<ResolvedIndex> resolve(const Index& index) const override;
  std::shared_ptr<Node> index_at(const ResolvedIndex& index) const override;
  void write_at(const ResolvedIndex& index, const TensorDict& value) override;
  //! get(key)[index] = value with an index on the batch dims: the value written at the selected rows of
  //! that leaf in one request, without reading (other indices: Node's read, write, write back)
  void set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index) override;
  std::vector<std::shared_ptr<Node>> child_nodes() const override { return {}; }
  TensorDict to_dense() const override;
  void write(const Index& index, const TensorDict& value) override;
  TensorDict open_child(const std::string& key) override;
  //! {"driver": "h5" | "redis", ...the store's fields} for an unindexed level ("group" names an h5 level)
  std::string storage_spec() const override;
  //! a dense store's snapshot at this level (nullptr for the others)
  std::shared_ptr<TensorDictImpl> dense_view() const override;

  const std::shared_ptr<RemoteTree>& tree() const { return tree_; }
  const LeafPath& path() const { return path_; }
  const std::optional<ResolvedIndex>& resolved() const { return index_; }

 private:
  LeafPath child_path(const std::string& key) const;
  //! the index over the level at `path` (a descendant of this level, whose batch may be longer)
  std::optional<ResolvedIndex> index_for(const RemoteTree::Snapshot& snap, const LeafPath& path) const;
  std::optional<ResolvedIndex> index_for(const LeafPath& path) const { return index_for(*tree_->snapshot(), path); }
  std::shared_ptr<RemoteNode> child(const std::string& key) const;
  //! the meta of `key` of this level in `snap`: info is its leaf (nullptr for a nested level)
  EntryMeta meta_of(const RemoteTree::Snapshot& snap, const std::string& key, const backends::LeafInfo* info) const;
  //! dense TensorDict of this node's values: every tensor leaf in ONE request
  TensorDict materialize(const std::vector<std::string>* only) const;
  //! the non-tensor at path, selected by this node's index
  Entry read_non_tensor(const LeafPath& path) const;

  //! a dense store (memmap, shared): its snapshot serves the structure, reads and indexing
  bool dense() const { return dense_; }
  //! the dense store's snapshot at this level; a level not created yet (its first leaf creates it): an empty
  //! TensorDict of its nearest existing ancestor's batch
  TensorDict dense_level() const;

  std::shared_ptr<RemoteTree> tree_;
  LeafPath path_;
  std::optional<ResolvedIndex> index_;  //!< over the level's batch; nullopt: all of it
  bool dense_ = false;
  mutable std::mutex kept_mu_;
  //! every snapshot dense_view() handed out stays alive with the node: callers hold raw pointers into it
  mutable std::vector<std::shared_ptr<TensorDictImpl>> kept_;
};

//! writes every entry of td under path (a new file / store): ONE request, then one re-listing; nested
//! levels keep td's batch sizes
void upload_all(RemoteTree& tree, const LeafPath& path, const TensorDict& td);
//! a TensorDict handle over the root (or a group) of a store
TensorDict make_remote(std::shared_ptr<RemoteTree> tree, const LeafPath& path = {});
//! the RemoteNode behind td (nullptr for other nodes)
RemoteNode* remote_node_of(const TensorDict& td);

//! ValueError unless `index` was resolved over `level` (a resolved index handed to index_at / write_at)
void check_source(const ResolvedIndex& index, const BatchSize& level, const std::string& what);

}  // namespace remote
}  // namespace tensordict
