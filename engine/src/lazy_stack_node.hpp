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

  NodeType kind() const override { return NodeType::LazyStack; }
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

  //! keys present in some members only (upstream's exclusive_fields), sorted, per member
  std::vector<std::vector<std::string>> exclusive_keys() const;
  //! the value unbound along the stack dim, one part per member (tensor, TensorDict or non-tensor)
  std::vector<Entry> split_value(const std::string& key, const Entry& value) const;
  //! set_ on every member (KeyError unless every member has the key)
  void put_inplace(const std::string& key, const Entry& value);
  //! td[index] = value split per member (value: TensorDict, tensor or scalar in an Entry-like holder)
  void index_put(const Index& index, const TensorDict* td_value, const at::Tensor* tensor_value,
                 const at::Scalar* scalar_value);
};

namespace detail {
//! the lazy node of td, or nullptr
LazyStackNode* lazy_node(const TensorDict& td);
//! a TensorDict over a new lazy-stack node
TensorDict make_lazy(std::vector<TensorDict> members, int64_t stack_dim);
//! the dense stack of the members (densifying lazy members); the stack error names the first misfit
TensorDict lazy_contiguous(const LazyStackNode& node);
}  // namespace detail

}  // namespace tensordict
