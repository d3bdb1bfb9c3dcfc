// The one structure walk over nodes (engine/src/tree_visitor.hpp, `tree::visit`) and the stack capability
// (Node::stack_members) through the public API: keys / items / is_empty / contains / from_dict's batch
// inference walk a tree that mixes dense levels, a level of another node kind (a forwarding node that
// counts its data reads) and a lazy stack alike; repr, equal and memmap_ follow a node that answers
// stack_members(), whatever its class.
#include <atomic>
#include <memory>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "keys_options.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/node.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;

namespace {

//! forwards to `inner` (sub-TensorDicts wrapped too) and counts the leaves its read() hands out; with
//! `stack` it also answers inner's stack_members()
class Forwarding : public Node {
 public:
  Forwarding(std::shared_ptr<Node> inner, std::shared_ptr<std::atomic<int64_t>> reads, bool stack = false)
      : inner_(std::move(inner)), reads_(std::move(reads)), stack_(stack) {
    batch_size = inner_->batch_size;
    device = inner_->device;
  }
  StackMembers stack_members() const override { return stack_ ? inner_->stack_members() : StackMembers{}; }
  std::string type_name() const override { return inner_->type_name(); }
  NodeCaps caps() const override { return inner_->caps(); }
  std::vector<std::string> keys() const override { return inner_->keys(); }
  std::optional<EntryMeta> meta(const std::string& key) const override { return inner_->meta(key); }
  std::vector<std::pair<std::string, EntryMeta>> metas() const override { return inner_->metas(); }
  EntryMeta as_entry_meta() const override { return inner_->as_entry_meta(); }
  std::optional<Entry> read(const std::string& key) const override {
    std::optional<Entry> e = inner_->read(key);
    if (e && e->is_tensordict()) return Entry(wrap(e->tensordict().node()));
    if (e) ++*reads_;
    return e;
  }
  void put(const std::string& key, const Entry& value) override { inner_->put(key, value); }
  bool erase(const std::string& key) override { return inner_->erase(key); }
  std::shared_ptr<Node> index(const Index& index) const override { return inner_->index(index); }
  std::vector<std::shared_ptr<Node>> child_nodes() const override { return inner_->child_nodes(); }
  TensorDict to_dense() const override {
    ++*reads_;
    return inner_->to_dense();
  }

  TensorDict wrap(std::shared_ptr<Node> n) const {
    return TensorDict(std::shared_ptr<Node>(std::make_shared<Forwarding>(std::move(n), reads_)));
  }

 private:
  std::shared_ptr<Node> inner_;
  std::shared_ptr<std::atomic<int64_t>> reads_;
  bool stack_;
};

//! a node whose leaf "a" grows by one element at every read: a store another handle writes between two reads
class Growing : public Forwarding {
 public:
  using Forwarding::Forwarding;
  std::optional<Entry> read(const std::string& key) const override {
    if (key != "a") return Forwarding::read(key);
    return Entry(at::ones({++elements_}));
  }
  std::vector<Entry> read(const std::vector<std::string>& keys, const Index&) const override {
    std::vector<Entry> out;
    for (const auto& k : keys) out.push_back(*read(k));
    return out;
  }

 private:
  mutable int64_t elements_ = 3;
};

TensorDict forwarding(const TensorDict& td, std::shared_ptr<std::atomic<int64_t>> reads, bool stack = false) {
  return TensorDict(std::shared_ptr<Node>(std::make_shared<Forwarding>(td.node(), std::move(reads), stack)));
}

//! batch [3]: a leaf, a level {b, deep: {c}} (batch [3, 2]), a lazy stack of 3 members with a common key x
//! and a key of member 1 only, a non-tensor leaf and an empty level
TensorDict mid_level() {
  TensorDict mid(BatchSize{3, 2});
  mid.set("b", at::arange(6, at::kLong).view({3, 2}));
  mid.set({"deep", "c"}, at::ones({3, 2, 4}));
  return mid;
}
//! `ragged`: member 2's x is longer (the members do not stack densely)
std::vector<TensorDict> stack_members_of(bool ragged = false) {
  std::vector<TensorDict> m;
  for (int i = 0; i < 3; ++i) {
    m.push_back(TensorDict({{"x", at::full({ragged && i == 2 ? 3 : 2}, double(i))}}, BatchSize{}));
  }
  m[1].set("only1", at::zeros({5}));
  return m;
}
TensorDict tree(const TensorDict& mid) {
  TensorDict td(BatchSize{3});
  td.set("a", at::arange(3, at::kFloat));
  td.set("mid", mid);
  td.set("lz", lazy_stack(stack_members_of(), 0));
  td.set_non_tensor("note", JsonValue("hi"));
  td.set("empty", TensorDict(BatchSize{3}));
  return td;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(node_walk)

BOOST_AUTO_TEST_CASE(keys_walk_every_node_kind_alike_without_reading) {
  auto reads = std::make_shared<std::atomic<int64_t>>(0);
  const TensorDict dense = tree(mid_level());
  const TensorDict mixed = tree(forwarding(mid_level(), reads));  // "mid" is a level of another node kind
  BOOST_TEST((mixed.get_td("mid").node()->dense_node() == nullptr));
  // upstream's order: a sub-TensorDict's keys before its own
  const std::vector<NestedKey> want{NestedKey("a"),         NestedKey({"mid", "b"}),  NestedKey({"mid", "deep", "c"}),
                                    NestedKey({"mid", "deep"}), NestedKey("mid"),      NestedKey({"lz", "x"}),
                                    NestedKey("lz"),        NestedKey("note"),         NestedKey("empty")};
  BOOST_TEST(mixed.keys(KeysOptions().include_nested(true)) == want, boost::test_tools::per_element());
  for (const KeysOptions& o : testutil::every_keys_option()) {
    BOOST_TEST(mixed.keys(o) == dense.keys(o), boost::test_tools::per_element());
  }
  BOOST_TEST(!mixed.is_empty());
  BOOST_TEST(mixed.contains({"mid", "deep", "c"}));
  BOOST_TEST(!mixed.contains({"mid", "deep", "zz"}));
  BOOST_TEST(!mixed.contains({"mid", "b", "zz"}));  // through a leaf
  BOOST_TEST(mixed.meta({"mid", "deep", "c"})->shape == BatchSize({3, 2, 4}));
  BOOST_TEST(reads->load() == 0);  // the structure alone: no leaf of the other node was read

  // items read exactly the leaves they list, and hand out the same values as the dense tree
  const auto got = mixed.items(KeysOptions().include_nested(true).leaves_only(true));
  const auto ref = dense.items(KeysOptions().include_nested(true).leaves_only(true));
  BOOST_TEST(reads->load() == 2);  // mid.b and mid.deep.c
  BOOST_REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    BOOST_TEST(got[i].first == ref[i].first);
    BOOST_TEST(got[i].second.tensor().equal(ref[i].second.tensor()));
  }
}

BOOST_AUTO_TEST_CASE(is_empty_walks_into_every_level) {
  auto reads = std::make_shared<std::atomic<int64_t>>(0);
  TensorDict inner(BatchSize{2});
  inner.set("e", TensorDict(BatchSize{2}));
  TensorDict td(BatchSize{2});
  td.set("s", forwarding(inner, reads));
  BOOST_TEST(td.is_empty());  // levels only, through a level of another node kind
  inner.set({"e", "leaf"}, at::zeros({2}));
  BOOST_TEST(!td.is_empty());
  BOOST_TEST(reads->load() == 0);
}

BOOST_AUTO_TEST_CASE(from_dict_infers_every_level_batch) {
  Dict inner{{"c", at::zeros({4, 3, 5, 6})}};
  Dict sub{{"b", at::zeros({4, 3, 5})}, {"t", inner}};
  Dict src{{"a", at::zeros({4, 3, 2})}, {"s", sub}};
  TensorDict td = TensorDict::from_dict(src, FromDictOptions().auto_batch_size(true));
  BOOST_TEST(td.batch_size() == BatchSize({4, 3}));
  BOOST_TEST(td.get_td("s").batch_size() == BatchSize({4, 3, 5}));
  BOOST_TEST(td.get_td({"s", "t"}).batch_size() == BatchSize({4, 3, 5, 6}));
  TensorDict one = TensorDict::from_dict(src, FromDictOptions().batch_dims(1));
  BOOST_TEST(one.batch_size() == BatchSize({4}));
  BOOST_TEST(one.get_td({"s", "t"}).batch_size() == BatchSize({4, 3, 5, 6}));
  BOOST_CHECK_THROW(TensorDict::from_dict(src, FromDictOptions().batch_dims(3)), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(a_node_answering_stack_members_is_a_stack_to_the_algorithms) {
  auto reads = std::make_shared<std::atomic<int64_t>>(0);
  const TensorDict lazy = lazy_stack(stack_members_of(/*ragged=*/true), 0);
  const TensorDict fwd = forwarding(lazy, reads, /*stack=*/true);
  // repr: the lazy stack's layout (exclusive fields, stack_dim), from the members' metas
  BOOST_TEST(repr(fwd) == repr(lazy));
  BOOST_TEST(repr(fwd).find("exclusive_fields") != std::string::npos);
  // equality member by member: these members do not stack densely (the dense forms' comparison says
  // false) but each equals its counterpart
  BOOST_TEST(lazy.equal(fwd));
  // memmap_: a stack below a dense level is written in upstream's lazy-stack layout (members in 0/, 1/...)
  fixtures::TempDir dir("node-walk");
  TensorDict root(BatchSize{3});
  root.set("lz", fwd);
  root.memmap_(dir.path);
  BOOST_TEST(is_lazy_stack_dir(dir / "lz"));
  TensorDict back = TensorDict::load_memmap(dir.path);
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(back.get_td("lz")));
  BOOST_TEST(back.get_td("lz").equal(lazy));
  BOOST_TEST(LazyStackedTensorDict(back.get_td("lz")).tensordicts()[1].contains("only1"));
  BOOST_TEST(LazyStackedTensorDict(back.get_td("lz")).tensordicts()[2].get("x").size(0) == 3);
  // without the capability the same forwarding node is no stack: its repr says so
  const TensorDict plain = forwarding(lazy, reads, /*stack=*/false);
  BOOST_TEST(repr(plain).find("exclusive_fields") == std::string::npos);
}

// consolidate plans the layout from one read of the source and builds the views from another: a source that
// changed in between (a leaf grown by another handle) is refused, not viewed past the consolidated storage
BOOST_AUTO_TEST_CASE(consolidate_refuses_a_source_changed_between_its_reads) {
  auto reads = std::make_shared<std::atomic<int64_t>>(0);
  const TensorDict base({{"a", at::ones({3})}, {"b", at::zeros({2})}}, BatchSize{});
  const TensorDict td(std::shared_ptr<Node>(std::make_shared<Growing>(base.node(), reads)));
  BOOST_CHECK_THROW(td.consolidate(), RuntimeError);
}

BOOST_AUTO_TEST_SUITE_END()
