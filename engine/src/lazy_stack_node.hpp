#pragma once
//! Internal to engine/: the lazy-stack node behind LazyStackedTensorDict.
#include <memory>
#include <string>
#include <vector>

#include "tensordict/node.hpp"

namespace tensordict {

struct LazyStackNode : Node {
  //! members by reference (a member's changes show in the stack)
  std::vector<TensorDict> members;
  int64_t stack_dim = 0;
  //! the members' common batch (-1 where they differ): what an empty stack keeps
  BatchSize member_batch;

  //! checks the members and computes the batch size
  LazyStackNode(std::vector<TensorDict> tds, int64_t stack_dim);
  //! an empty stack with the members' batch given
  LazyStackNode(BatchSize member_batch, int64_t stack_dim, std::optional<at::Device> device);
  //! recomputes batch_size / member_batch / device from the members
  void refresh();

  //! the stack node of td (LazyStackedTensorDict's own accessor), or nullptr
  static LazyStackNode* of(const TensorDict& td);

  StackMembers stack_members() const override { return {&members, stack_dim}; }
  std::string type_name() const override { return "LazyStackedTensorDict"; }
  NodeCaps caps() const override;
  //! the sorted intersection of the members' keys
  std::vector<std::string> keys() const override;
  //! from the members' metas: a tensor's shape with the stack dim, -1 where members differ (read() refuses
  //! to stack those); a sub-TensorDict is a lazy stack; a non-tensor's value when every member holds it
  std::optional<EntryMeta> meta(const std::string& key) const override;
  std::optional<Entry> read(const std::string& key) const override;
  using Node::read;
  void put(const std::string& key, const Entry& value) override;
  bool erase(const std::string& key) override;
  std::shared_ptr<Node> index(const Index& index) const override;
  std::vector<std::shared_ptr<Node>> child_nodes() const override;
  TensorDict to_dense() const override;
  void write(const Index& index, const TensorDict& value) override { index_put(index, &value, nullptr, nullptr); }
  //! ragged members: each gets a sub-TensorDict of its own batch size
  TensorDict open_child(const std::string& key) override;
  EntryMeta as_entry_meta() const override;
  std::string storage_spec() const override;  //!< {"driver": "stack", "dim", "members"} (spec_stack.cpp)

  // the operations member by member (upstream's LazyStackedTensorDict); the rest: Node's defaults
  void set_entry(const NestedKey& key, const Entry& value, bool inplace) override;
  void update_entry(const NestedKey& key, const Entry& value) override { put_inplace(key.back(), value); }
  void rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) override;
  void clear(TensorDict& self) override;
  void fill(TensorDict& self, const NestedKey& key, const at::Scalar& value) override;
  void set_batch_size(TensorDict& self, BatchSize batch_size) override;
  int64_t bytes(const TensorDict& self) const override;
  TensorDict empty(const TensorDict& self, bool recurse) const override;
  TensorDict select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict,
                    bool inplace) const override;
  TensorDict exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const override;
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
  std::vector<TensorDict> unbind(const TensorDict& self, int64_t dim) const override;
  std::vector<TensorDict> split(const TensorDict& self, std::vector<int64_t> split_sizes, int64_t dim) const override;
  TensorDict contiguous(const TensorDict& self) const override;
  void index_put_(TensorDict& self, const Index& index, const TensorDict& value) override;
  void index_put_(TensorDict& self, const Index& index, const at::Tensor& value) override;
  void index_put_(TensorDict& self, const Index& index, const at::Scalar& value) override;
  //! upstream's layout, one staged save (memmap.cpp): `prefix`/meta.json {"_type", "stack_dim"}, member i in
  //! `prefix`/<i>/; memmap_ maps the members' own leaves (dense members only) and locks the stack, memmap and
  //! memmap_like save copies (another node's member as its dense form); no prefix: anonymous shared memory
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
  void zero_(TensorDict& self) override;
  void masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value) override;
  void add_(TensorDict& self, const TensorDict& other) override;
  void add_(TensorDict& self, const at::Scalar& other) override;
  void mul_(TensorDict& self, const at::Scalar& other) override;

  //! the value unbound along the stack dim, one part per member (tensor, TensorDict or non-tensor)
  std::vector<Entry> split_value(const std::string& key, const Entry& value) const;
  //! set_ on every member (KeyError unless every member has the key)
  void put_inplace(const std::string& key, const Entry& value);
  //! td[index] = value split per member (value: TensorDict, tensor or scalar in an Entry-like holder)
  void index_put(const Index& index, const TensorDict* td_value, const at::Tensor* tensor_value,
                 const at::Scalar* scalar_value);
};

namespace detail {
//! a TensorDict over a new lazy-stack node
TensorDict make_lazy(std::vector<TensorDict> members, int64_t stack_dim);
//! the dense stack of the members (densifying lazy members); the stack error names the first misfit
TensorDict lazy_contiguous(const LazyStackNode& node);
}  // namespace detail

}  // namespace tensordict
