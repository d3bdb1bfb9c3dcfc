#pragma once
//! Node: the object behind a TensorDict handle (upstream's TensorDictBase), as at::TensorImpl sits behind
//! at::Tensor. engine/ has the dense node (in-memory, memmap and shared-memory leaves: every dense fast
//! path) and the lazy-stack node; upper layers add nodes for stores (HDF5, Redis) and typed wrappers.
//! Generic algorithms use this interface; a TensorDict method that has no generic form yet raises
//! NotImplementedError naming the node's type instead of guessing.
//! Thread-safety: as a TensorDict (concurrent reads fine; structural changes need one writer).
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! Typed: a typed handle in node form (tensordict/typed_schema.hpp); TensorDict(node) unwraps it at once
enum class NodeType { Dense, LazyStack, Store, Typed };

//! what a node can do; replaces tests of is_memmap() || is_shared() in the algorithms
struct NodeCaps {
  bool zero_copy_views = false;  //!< index()/get() alias the storage (writes through a view land)
  bool add_keys = false;         //!< put() of a new key is possible (when unlocked)
  bool memmap = false;           //!< leaves are memory-mapped files
  bool shared = false;           //!< leaves live in shared memory
};

//! what a key of a level holds, read without touching its data (Node::meta): every structural question
//! (contains, keys, is_empty, repr, describe, dtype / shape checks) asks this instead of reading the value
struct EntryMeta {
  enum class Kind { Tensor, NonTensor, TensorDict, LazyStack };
  Kind kind = Kind::Tensor;
  at::ScalarType dtype = at::kFloat;  //!< Tensor only
  //! Tensor: the full shape (batch dims included; -1 where a lazy stack's members differ);
  //! TensorDict / LazyStack / NonTensor: the batch size
  BatchSize shape;
  std::optional<at::Device> device;
  bool shared = false;  //!< Tensor: its storage is shared (repr's is_shared)
  bool memmap = false;  //!< Tensor: a memory-mapped file (repr's MemoryMappedTensor)
  //! NonTensor: the NonTensorData / NonTensorStack where the node holds it (a remote node does not: nullopt)
  std::optional<Entry> value;

  bool is_tensordict() const { return kind == Kind::TensorDict || kind == Kind::LazyStack; }
  //! "Tensor", "TensorDict", "LazyStackedTensorDict", "NonTensorData" / "NonTensorStack" ("non-tensor" unheld)
  const char* kind_name() const;
};

struct TensorDictImpl;

class Node : public std::enable_shared_from_this<Node> {
 public:
  virtual ~Node() = default;
  virtual NodeType kind() const = 0;
  //! the upstream class name, for messages and repr ("TensorDict", "LazyStackedTensorDict", ...)
  virtual std::string type_name() const = 0;
  virtual NodeCaps caps() const = 0;
  //! keys of this level, in the node's order
  virtual std::vector<std::string> keys() const = 0;
  //! what `key` of this level holds (kind, dtype, shape, device) without reading its data; nullopt when
  //! missing. The default reads the value (correct, not cheap): nodes override it.
  virtual std::optional<EntryMeta> meta(const std::string& key) const;
  //! meta() of every key of this level, in keys() order (default: keys() then meta() per key)
  virtual std::vector<std::pair<std::string, EntryMeta>> metas() const;
  //! the value at a key of this level (no copy where the node has zero-copy views); nullopt when missing
  virtual std::optional<Entry> read(const std::string& key) const = 0;
  //! batched read: the values of `keys` (this level) at `index`; one request for remote nodes
  virtual std::vector<Entry> read(const std::vector<std::string>& keys, const Index& index) const;
  //! adds or replaces a key of this level; the value already fits the batch size (prepared by the caller)
  virtual void put(const std::string& key, const Entry& value) = 0;
  //! removes a key of this level; false when missing
  virtual bool erase(const std::string& key) = 0;
  //! the node td[index] is (dense: views; lazy stack: per-member split); batch dims only
  virtual std::shared_ptr<Node> index(const Index& index) const = 0;
  //! the sub-nodes the lock graph reaches (sub-TensorDicts, members)
  virtual std::vector<std::shared_ptr<Node>> child_nodes() const = 0;
  //! a dense TensorDict with this node's values: what operations without a form of their own for this node
  //! kind run on (lazy stack: the stacked members, a copy; store: a view of its storage)
  virtual TensorDict to_dense() const = 0;
  //! td[index] = value, value a TensorDict broadcast to the indexed batch (NotImplementedError by default)
  virtual void write(const Index& index, const TensorDict& value);
  //! the sub-TensorDict `key` of this level for writing, created when missing (default: an empty TensorDict
  //! put at key; a store returns a pending level that its first leaf creates)
  virtual TensorDict open_child(const std::string& key);
  //! a dense node over this node's own storage that the dense algorithms may read and write directly
  //! (a store's current snapshot); nullptr when there is none (lazy stacks). The node keeps it alive.
  virtual std::shared_ptr<TensorDictImpl> dense_view() const { return nullptr; }
  //! lists the storage's structure again where the node caches it (a remote node keeps the structure it
  //! listed for the handle's life: keys another process or handle adds show after this call); default no-op
  virtual void refresh() {}
  //! the storage spec (JSON text, tensordict/storage_spec.hpp) that reopens this node's storage in another
  //! process; empty when there is none (in-memory nodes; views of a store)
  virtual std::string storage_spec() const { return ""; }

  //! shared state of every node
  BatchSize batch_size;
  std::optional<at::Device> device;
  bool locked = false;
  //! locked nodes holding this one (a child cannot unlock while one of them lives)
  std::vector<std::weak_ptr<Node>> locked_parents;
};

}  // namespace tensordict
