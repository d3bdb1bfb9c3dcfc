// Structure is metadata (issue 34, item 1): on every zoo member, the structural questions (contains, every
// keys option, is_empty, repr, describe, Node::meta, a failing set and a failing index_put_ dtype check) read
// no data. Counted twice: the store statistics of the HDF5 and Redis members (row reads and writes their
// store actor ran), and a counting wrapper node over every member, which counts every value its handle
// reads (a leaf, a batched read, the dense form) while the handle's generic paths answer the questions.
#include <atomic>
#include <memory>
#include <sstream>

#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"
#include "keys_options.hpp"
#include "tensordict/describe.hpp"

using namespace tensordict;
using conformance::for_each_member;
using conformance::Member;

namespace {

//! a node that forwards to `inner` and counts the data its handle reads; sub-TensorDicts are wrapped too
class CountingNode : public Node {
 public:
  CountingNode(std::shared_ptr<Node> inner, std::shared_ptr<std::atomic<int64_t>> reads)
      : inner_(std::move(inner)), reads_(std::move(reads)) {
    batch_size = inner_->batch_size;
    device = inner_->device;
    locked = inner_->locked;
  }
  std::string type_name() const override { return inner_->type_name(); }
  NodeCaps caps() const override { return inner_->caps(); }
  std::vector<std::string> keys() const override { return inner_->keys(); }
  std::optional<EntryMeta> meta(const std::string& key) const override { return inner_->meta(key); }
  std::vector<std::pair<std::string, EntryMeta>> metas() const override { return inner_->metas(); }
  std::optional<Entry> read(const std::string& key) const override {
    std::optional<Entry> e = inner_->read(key);
    if (e && e->is_tensordict()) return Entry(wrap(e->tensordict().node()));  // a level: a handle, no data
    if (e) ++*reads_;
    return e;
  }
  std::vector<Entry> read(const std::vector<std::string>& keys, const Index& index) const override {
    ++*reads_;
    return inner_->read(keys, index);
  }
  void put(const std::string& key, const Entry& value) override { inner_->put(key, value); }
  bool erase(const std::string& key) override { return inner_->erase(key); }
  std::shared_ptr<Node> index(const Index& index) const override { return wrap(inner_->index(index)).node(); }
  std::vector<std::shared_ptr<Node>> child_nodes() const override { return inner_->child_nodes(); }
  TensorDict to_dense() const override {
    ++*reads_;
    return inner_->to_dense();
  }
  void write(const Index& index, const TensorDict& value) override { inner_->write(index, value); }

  TensorDict wrap(std::shared_ptr<Node> n) const { return TensorDict(std::shared_ptr<Node>(std::make_shared<CountingNode>(std::move(n), reads_))); }

 private:
  std::shared_ptr<Node> inner_;
  std::shared_ptr<std::atomic<int64_t>> reads_;
};

//! row reads and writes the store actor of td ran (HDF5, Redis); 0 for the other node kinds
int64_t store_calls(const TensorDict& td) {
  try {
    return PersistentTensorDict(td).store_stats().calls;
  } catch (const TypeError&) {
  }
  try {
    return TensorDictStore(td).store_stats().calls;
  } catch (const TypeError&) {
  }
  return 0;
}

std::vector<std::string> joined(std::vector<NestedKey> keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.join("."));
  std::sort(out.begin(), out.end());
  return out;
}

//! every structural question, answers checked against the dense reference (read before, not counted);
//! `failing_set`: also a set of a value whose shape does not fit (the wrapper's node would take it as is)
void structural_questions(const TensorDict& td, const TensorDict& ref, bool failing_set) {
  for (const auto& o : testutil::every_keys_option()) BOOST_TEST(joined(td.keys(o)) == joined(ref.keys(o)));
  for (const auto& k : ref.keys(KeysOptions().include_nested(true))) BOOST_TEST(td.contains(k), k.repr());
  BOOST_TEST(!td.contains("missing"));
  BOOST_TEST(!td.contains(NestedKey{"missing", "a"}));
  BOOST_TEST(!td.contains(NestedKey{"a", "x"}));  // through a leaf
  BOOST_TEST(!td.is_empty());
  const std::optional<EntryMeta> a = td.node()->meta("a");
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST((a->kind == EntryMeta::Kind::Tensor));
  BOOST_TEST((a->dtype == at::kFloat));
  BOOST_TEST(a->shape == BatchSize(ref.get("a").sizes().begin(), ref.get("a").sizes().end()));
  BOOST_TEST((a->device == at::Device(at::kCPU)));
  BOOST_TEST((td.node()->meta("c")->dtype == at::kLong));
  BOOST_TEST(!td.node()->meta("missing").has_value());
  std::ostringstream os;
  os << td;
  BOOST_TEST(os.str().find("batch_size=torch.Size([4, 3, 2, 1])") != std::string::npos, os.str());
  BOOST_TEST(os.str().find("a: ") != std::string::npos, os.str());
  const JsonValue d = describe(td, false);
  BOOST_TEST(d.find("leaves")->as_array().size() ==
             td.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true)).size());
  if (failing_set) {
    TensorDict w = td;
    BOOST_CHECK_THROW(w.set("a", at::zeros({3})), Error);  // batch dims that do not fit (or a lock)
  }
  TensorDict w = td;
  BOOST_CHECK_THROW(w.index_put_({at::tensor({0, 2}, at::kLong)}, at::zeros({}, at::kDouble)), RuntimeError);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(metadata)

BOOST_AUTO_TEST_CASE(structure_reads_no_store_data) {
  for_each_member([](const Member&, const TensorDict& td, const TensorDict& ref) {
    const int64_t before = store_calls(td);
    structural_questions(td, ref, /*failing_set=*/true);
    BOOST_TEST(store_calls(td) - before == 0, "row reads / writes of the store for structural questions");
  });
}

BOOST_AUTO_TEST_CASE(structure_through_the_node_interface_reads_no_value) {
  for_each_member([](const Member&, const TensorDict& td, const TensorDict& ref) {
    auto reads = std::make_shared<std::atomic<int64_t>>(0);
    TensorDict counted(std::shared_ptr<Node>(std::make_shared<CountingNode>(td.node(), reads)));
    BOOST_TEST((counted.node()->dense_node() == nullptr));
    const int64_t before = store_calls(td);
    structural_questions(counted, ref, /*failing_set=*/false);
    BOOST_TEST(reads->load() == 0, "values read through the node interface for structural questions");
    BOOST_TEST(store_calls(td) - before == 0);
    BOOST_TEST(counted.get("a").equal(ref.get("a")));  // the wrapper does count a value read
    BOOST_TEST(reads->load() > 0);
  });
}

BOOST_AUTO_TEST_CASE(remote_structure_is_cached_until_refresh) {
  // a Redis store keeps the structure it listed for the handle's life: a key another handle adds shows
  // after refresh(), and nothing is read for the question
  const auto opts = conformance::redis();
  TensorDictStore a = TensorDictStore::from_tensordict(zoo::plain({4}, 7), opts);
  TensorDictStore b = TensorDictStore::from_store(a.td_id(), opts);
  b.set("added", at::ones({4, 2}));
  b.set(NestedKey{"sub", "x"}, at::ones({4}));
  BOOST_TEST(!a.contains("added"));
  a.node()->refresh();
  BOOST_TEST(a.contains("added"));
  BOOST_TEST(a.contains(NestedKey{"sub", "x"}));
  BOOST_TEST(a.node()->meta("added")->shape == BatchSize({4, 2}));
  BOOST_TEST(a.get("added").equal(at::ones({4, 2})));
  // a view of an HDF5 file sees a key its parent handle adds, with its shape under the view's index
  const std::string file = conformance::fresh_dir("h5meta") + ".h5";
  PersistentTensorDict h = PersistentTensorDict::from_dict(zoo::plain({4}, 9), file);
  h.set("added", at::ones({4}));
  TensorDict view = h.index({at::indexing::Slice(0, 2)});
  h.set("later", at::ones({4, 3}));
  BOOST_TEST(view.node()->meta("added")->shape == BatchSize({2}));
  BOOST_TEST(view.node()->meta("later")->shape == BatchSize({2, 3}));
}

BOOST_AUTO_TEST_SUITE_END()
