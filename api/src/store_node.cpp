// The node of a store-backed TensorDict (Store::tensordict()): reads and row writes on the store's current
// snapshot (views of the storage, no actor hop); new keys through the store actor.
#include <mutex>

#include "tensordict/node.hpp"
#include "tensordict/store.hpp"

namespace tensordict {

namespace {

class StoreNode : public Node {
 public:
  //! the root of the store
  explicit StoreNode(Store store) : store_(std::move(store)) {
    TensorDict v = store_.td();
    batch_size = v.batch_size();
    device = v.device();
    pending_ = TensorDict(batch_size, device);
  }
  //! the level `prefix` (it may not exist yet: its first leaf creates it)
  StoreNode(Store store, NestedKey prefix, const TensorDict& parent_view)
      : store_(std::move(store)), prefix_(std::move(prefix)) {
    std::optional<Entry> e = store_.td().get_entry_opt(prefix_);
    TensorDict v = e && e->is_tensordict() ? e->tensordict() : parent_view;
    batch_size = v.batch_size();
    device = v.device();
    pending_ = TensorDict(batch_size, device);
  }

  std::string type_name() const override { return "TensorDict"; }
  NodeCaps caps() const override {
    NodeCaps c;
    c.zero_copy_views = true;
    c.add_keys = true;
    c.memmap = store_.kind() == "memmap";
    c.shared = store_.kind() == "shared";
    return c;
  }
  std::vector<std::string> keys() const override { return view().node()->keys(); }
  //! the snapshot's own metas: its leaves are in memory
  std::optional<EntryMeta> meta(const std::string& key) const override { return view().node()->meta(key); }
  std::vector<std::pair<std::string, EntryMeta>> metas() const override { return view().node()->metas(); }
  //! keys other processes added through the store actor
  void refresh() override { store_.refresh(); }
  std::optional<Entry> read(const std::string& key) const override {
    std::optional<Entry> e = view().node()->read(key);
    if (e && e->is_tensordict()) return Entry(child(key));
    return e;
  }
  using Node::read;
  void put(const std::string& key, const Entry& value) override {
    const NestedKey full = prefix_ + NestedKey(key);
    if (view().node()->read(key)) {  // an existing key: written in place (upstream's best-attempt inplace)
      store_.td().set_(full, value);
      return;
    }
    if (value.is_tensor()) {
      store_.add_key(full, value.tensor());
    } else if (value.is_tensordict() || value.is_dict()) {
      TensorDict v = value.is_tensordict() ? value.tensordict() : TensorDict(value.dict(), batch_size, device);
      for (const auto& kv : v.items(KeysOptions().include_nested(true).leaves_only(true))) {
        if (!kv.second.is_tensor()) {
          throw NotImplementedError("a store holds tensor leaves only: cannot add the non-tensor " +
                                    (full + kv.first).repr());
        }
        store_.add_key(full + kv.first, kv.second.tensor());
      }
    } else {
      throw NotImplementedError("a store holds tensor leaves only: cannot add the " +
                                std::string(Entry::kind_name(value.kind())) + " " + full.repr());
    }
  }
  bool erase(const std::string& key) override {
    throw NotImplementedError("a store cannot remove keys (" + (prefix_ + NestedKey(key)).repr() + ")");
  }
  std::shared_ptr<Node> index(const Index& index) const override { return view().index(index).node(); }
  std::vector<std::shared_ptr<Node>> child_nodes() const override { return {}; }
  TensorDict to_dense() const override { return view(); }
  void write(const Index& index, const TensorDict& value) override { view().index_put_(index, value); }
  TensorDict open_child(const std::string& key) override {
    std::optional<Entry> e = view().node()->read(key);
    if (e && !e->is_tensordict()) {
      throw KeyError("'" + key + "' is a " + std::string(Entry::kind_name(e->kind())) + ", not a TensorDict");
    }
    return child(key);  // missing: a pending level, created by its first leaf
  }
  std::shared_ptr<TensorDictImpl> dense_view() const override {
    TensorDict v = view();
    TensorDictImpl* dense = v.node()->dense_node();  // a snapshot is a dense node
    if (!dense) return nullptr;
    std::shared_ptr<TensorDictImpl> impl(v.node(), dense);
    std::lock_guard<std::mutex> lock(mu_);
    // every snapshot handed out stays alive with the node: callers hold raw pointers into it
    if (kept_.empty() || kept_.back() != impl) kept_.push_back(impl);
    return impl;
  }

 private:
  //! the snapshot's TensorDict at prefix_ (a pending level not created yet: an empty TensorDict)
  TensorDict view() const {
    TensorDict td = store_.td();
    if (prefix_.empty()) return td;
    std::optional<Entry> e = td.get_entry_opt(prefix_);
    if (e && e->is_tensordict()) return e->tensordict();
    return pending_;
  }
  TensorDict child(const std::string& key) const {
    return TensorDict(std::shared_ptr<Node>(std::make_shared<StoreNode>(store_, prefix_ + NestedKey(key), view())));
  }

  Store store_;
  NestedKey prefix_;
  TensorDict pending_;  //!< what a level not created yet reads as: empty
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<TensorDictImpl>> kept_;
};

}  // namespace

TensorDict Store::tensordict() const {
  return TensorDict(std::shared_ptr<Node>(std::make_shared<StoreNode>(*this)));
}

}  // namespace tensordict
