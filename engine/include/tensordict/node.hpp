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

#include "tensordict/resolved_index.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

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

//! the members of a stack node (upstream's LazyStackedTensorDict: members by reference) and its stack dim;
//! `members` is null for every other node
struct StackMembers {
  const std::vector<TensorDict>* members = nullptr;
  int64_t dim = 0;
  explicit operator bool() const { return members != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  virtual ~Node() = default;
  //! the dense node itself, for the handle's fast paths (nullptr for every other node)
  virtual TensorDictImpl* dense_node() { return nullptr; }
  //! a typed handle in node form (tensordict/typed_schema.hpp) answers its source and schema, which
  //! TensorDict(node) unwraps at once; {nullptr, nullptr} for every other node
  virtual std::pair<std::shared_ptr<Node>, std::shared_ptr<const TypedSchema>> typed_parts() const { return {}; }
  //! a stack of members (the lazy stack): its members and stack dim, which the memmap layout (members in
  //! numbered directories), repr (exclusive keys) and equality (member by member) follow; {} otherwise
  virtual StackMembers stack_members() const { return {}; }
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
  //! `index` resolved ONCE per user call against this node's storage, with upstream's errors: a store node
  //! answers its selection over its level (its own view composed in), which index_at / write_at then take
  //! without resolving again (td[idx], td[idx] = value, get_at). nullopt (the default) for nodes that index
  //! otherwise (the dense node's prepared index, the lazy stack member by member)
  virtual std::optional<ResolvedIndex> resolve(const Index& index) const;
  //! the node td[index] is, from this node's resolve(index) (default: NotImplementedError)
  virtual std::shared_ptr<Node> index_at(const ResolvedIndex& index) const;
  //! td[index] = value from this node's resolve(index), value broadcast to the selection (default:
  //! NotImplementedError)
  virtual void write_at(const ResolvedIndex& index, const TensorDict& value);
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
  //! what this node is as the value of a key of its parent (kind TensorDict, its batch size and device; a
  //! lazy stack says LazyStack)
  virtual EntryMeta as_entry_meta() const;
  //! unlock_(): clears `locked` (the dense node also drops its memmap / shared flags, as upstream)
  virtual void unlock() { locked = false; }

  // ---------------------------------------------------------------- operations (issue 34, item 2)
  // Each operation of the handle reaches its node here; `self` is the handle (typed schema included) over
  // this node. Every default is written once, over the interface above: a node with a dense_view() runs
  // the dense node's form on it; otherwise the operation runs on the dense form (`self.contiguous()`: one
  // read for remote nodes) and an in-place one writes through put() / write(). The dense node overrides
  // each with its fast path, the lazy stack where it works member by member (upstream).

  //! every key of this level with its value, in keys() order (default: keys() then read() per key)
  virtual std::vector<std::pair<std::string, Entry>> read_all() const;
  //! this level's entries held in memory by the node itself, in keys() order, to look at without a copy (a
  //! row write's hot path); null when the node reads them from elsewhere (read_all then)
  virtual const std::vector<std::pair<std::string, Entry>>* own_entries() const { return nullptr; }
  //! set(key, value, inplace) at the last part of `key` (the full key, for messages) on this level:
  //! in place when `inplace` and the key exists, else added or replaced (LockedError when locked)
  virtual void set_entry(const NestedKey& key, const Entry& value, bool inplace);
  //! set_(key, value) on this level: the existing key written in place (KeyError when missing)
  virtual void update_entry(const NestedKey& key, const Entry& value);
  //! del(key) on this level (the caller checked that the key exists)
  virtual void del_entry(const NestedKey& key);
  virtual void rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe);
  virtual void clear(TensorDict& self);
  virtual void fill(TensorDict& self, const NestedKey& key, const at::Scalar& value);
  //! set_at_: get(key)[index] = value, written back where get() is a copy
  virtual void set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index);
  virtual void set_batch_size(TensorDict& self, BatchSize batch_size);
  virtual int64_t bytes(const TensorDict& self) const;
  virtual TensorDict empty(const TensorDict& self, bool recurse) const;
  virtual TensorDict select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict,
                            bool inplace) const;
  virtual TensorDict exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const;
  virtual TensorDict flatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const;
  virtual TensorDict unflatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const;
  virtual TensorDict clone(const TensorDict& self, bool recurse) const;
  virtual TensorDict to(const TensorDict& self, at::Device device) const;
  //! shape ops on the batch dims (tensordict/tensor_dict.hpp); squeeze without a dim when dim is nullopt
  virtual TensorDict view(const TensorDict& self, BatchSize shape) const;
  virtual TensorDict reshape(const TensorDict& self, BatchSize shape) const;
  virtual TensorDict flatten(const TensorDict& self, int64_t start_dim, int64_t end_dim) const;
  virtual TensorDict unflatten(const TensorDict& self, int64_t dim, BatchSize sizes) const;
  virtual TensorDict squeeze(const TensorDict& self, std::optional<int64_t> dim) const;
  virtual TensorDict unsqueeze(const TensorDict& self, int64_t dim) const;
  virtual TensorDict permute(const TensorDict& self, std::vector<int64_t> dims) const;
  virtual TensorDict transpose(const TensorDict& self, int64_t dim0, int64_t dim1) const;
  virtual TensorDict expand(const TensorDict& self, BatchSize shape) const;
  virtual std::vector<TensorDict> unbind(const TensorDict& self, int64_t dim) const;
  virtual std::vector<TensorDict> split(const TensorDict& self, std::vector<int64_t> split_sizes, int64_t dim) const;
  //! a dense TensorDict with this node's values (a store's: its view's leaves made contiguous)
  virtual TensorDict contiguous(const TensorDict& self) const;
  //! upstream to_tensordict: a new dense copy (contiguous() where that is a copy already)
  virtual TensorDict to_tensordict(const TensorDict& self) const;
  //! this node's values as a dense TensorDict for read-only algorithms: the handle itself for the dense
  //! node, self.contiguous() otherwise
  virtual TensorDict dense_form(const TensorDict& self) const;
  //! td[index] = value (a TensorDict broadcast to the indexed batch, a tensor, a scalar)
  virtual void index_put_(TensorDict& self, const Index& index, const TensorDict& value);
  //! td[row] = value for one integer row: index_put_(self, {row}, value) unless the node writes a row faster
  virtual void put_row(TensorDict& self, int64_t row, const TensorDict& value);
  virtual void index_put_(TensorDict& self, const Index& index, const at::Tensor& value);
  virtual void index_put_(TensorDict& self, const Index& index, const at::Scalar& value);
  //! memmap_ / share_memory_ in place (NotImplementedError where the leaves live in a storage); memmap /
  //! memmap_like into a new TensorDict (default: on the dense form)
  virtual void memmap_(TensorDict& self, const std::string& prefix, const MemmapOptions& options);
  virtual TensorDict memmap(const TensorDict& self, const std::string& prefix, const MemmapOptions& options) const;
  virtual TensorDict memmap_like(const TensorDict& self, const std::string& prefix,
                                 const MemmapOptions& options) const;
  virtual void share_memory_(TensorDict& self);
  //! upstream's equality of structure and values (default: the dense forms compared)
  virtual bool equal(const TensorDict& self, const TensorDict& other) const;
  //! the apply family, fills, where and the in-place arithmetic the lazy stack does member by member
  virtual TensorDict apply(const TensorDict& self, const LeafFn& fn, const ApplyOptions& options) const;
  virtual TensorDict apply(const TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                           const ApplyOptions& options) const;
  virtual void apply_(TensorDict& self, const LeafFn& fn);
  virtual void apply_(TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others);
  virtual TensorDict named_apply(const TensorDict& self, const NamedLeafFn& fn, const ApplyOptions& options) const;
  virtual TensorDict named_apply(const TensorDict& self, const NamedMultiLeafFn& fn,
                                 const std::vector<TensorDict>& others, const ApplyOptions& options) const;
  virtual void zero_(TensorDict& self);
  virtual TensorDict masked_fill(const TensorDict& self, const at::Tensor& mask, const at::Scalar& value) const;
  virtual void masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value);
  virtual TensorDict where(const TensorDict& self, const at::Tensor& condition, const TensorDict& other) const;
  virtual TensorDict where(const TensorDict& self, const at::Tensor& condition, const at::Scalar& other) const;
  virtual void add_(TensorDict& self, const TensorDict& other);
  virtual void add_(TensorDict& self, const at::Scalar& other);
  virtual void mul_(TensorDict& self, const at::Scalar& other);
  //! sum / mean over batch dims (every dim of each leaf when dims is nullopt); sum_reduce / mean_reduce
  virtual TensorDict reduce(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                            bool keepdim) const;
  virtual at::Tensor reduce_leaves(const TensorDict& self, bool mean, const std::optional<std::vector<int64_t>>& dims,
                                   bool keepdim) const;

  //! shared state of every node
  BatchSize batch_size;
  std::optional<at::Device> device;
  bool locked = false;
  //! locked nodes holding this one (a child cannot unlock while one of them lives)
  std::vector<std::weak_ptr<Node>> locked_parents;
};

}  // namespace tensordict
