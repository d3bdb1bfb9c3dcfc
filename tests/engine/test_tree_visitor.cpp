// The tree visitor (engine/src/tree_visitor.hpp) through the public API: the leaf walks (zero_, all, add_,
// share_memory_, describe), the rebuilds (clone, shallow_copy, shape ops, arithmetic, reductions) and the
// parallel walks (comparisons, where, equal, TD-TD arithmetic) on nested trees with non-tensor leaves,
// empty sub-TensorDicts, a lazy stack nested in a dense TensorDict and a typed wrapper.
#include <boost/test/unit_test.hpp>

#include "engine/zoo.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/typed.hpp"

using namespace tensordict;

namespace {

struct Pt : TypedTensorDict<Pt> {
  TD_FIELDS(Pt, TD_TENSOR(x), TD_TENSOR(y))
};

//! batch [3]: a leaf, a sub-TensorDict with a longer batch [3, 2] holding a deeper level, a non-tensor
//! leaf, a NonTensorStack and an empty sub-TensorDict, in that key order
TensorDict tree() {
  TensorDict td(BatchSize{3});
  td.set("a", at::arange(6, at::kFloat).view({3, 2}));
  TensorDict sub(BatchSize{3, 2});
  sub.set("b", at::arange(6, at::kLong).view({3, 2}));
  sub.set({"deep", "c"}, at::ones({3, 2, 4}));
  td.set("sub", sub);
  td.set_non_tensor("note", JsonValue("hi"));
  td.set("stack", NonTensorStack({JsonValue(1), JsonValue(2), JsonValue(3)}, BatchSize{3}));
  td.set("empty", TensorDict(BatchSize{3}));
  return td;
}

std::vector<std::string> top_keys(const TensorDict& td) {
  std::vector<std::string> out;
  for (const auto& k : td.keys()) out.push_back(k.join());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tree_visitor)

BOOST_AUTO_TEST_CASE(rebuild_keeps_structure_key_order_and_non_tensors) {
  TensorDict td = tree();
  const std::vector<std::string> order{"a", "sub", "note", "stack", "empty"};
  for (const TensorDict& r : {td.clone(), td.clone(CloneOptions().recurse(false)), td.shallow_copy(), td.add(1), td.contiguous()}) {
    BOOST_TEST(top_keys(r) == order, boost::test_tools::per_element());
    BOOST_TEST((r.get_td("sub").batch_size() == BatchSize{3, 2}));
    BOOST_TEST((r.get_td({"sub", "deep"}).batch_size() == BatchSize{3, 2}));
    BOOST_TEST(r.get_td("empty").keys().empty());
    BOOST_TEST(r.get_non_tensor("note") == JsonValue("hi"));
    BOOST_TEST(r.is_non_tensor("stack"));
  }
  BOOST_TEST(!td.clone().get({"sub", "b"}).is_same(td.get({"sub", "b"})));
  BOOST_TEST(td.clone(CloneOptions().recurse(false)).get({"sub", "b"}).is_same(td.get({"sub", "b"})));
  BOOST_TEST(at::equal(td.add(1).get({"sub", "deep", "c"}), at::full({3, 2, 4}, 2.f)));
}

BOOST_AUTO_TEST_CASE(shape_ops_extend_longer_sub_batches) {
  TensorDict td = tree();
  TensorDict u = td.unsqueeze(0);
  BOOST_TEST((u.batch_size() == BatchSize{1, 3}));
  BOOST_TEST((u.get_td("sub").batch_size() == BatchSize{1, 3, 2}));
  BOOST_TEST((u.get_td({"sub", "deep"}).batch_size() == BatchSize{1, 3, 2}));
  BOOST_TEST((u.get_td("empty").batch_size() == BatchSize{1, 3}));
  TensorDict e = td.expand({4, 3});
  BOOST_TEST((e.get({"sub", "deep", "c"}).sizes() == at::IntArrayRef{4, 3, 2, 4}));
  TensorDict s = td.sum(0);
  BOOST_TEST((s.get_td("sub").batch_size() == BatchSize{2}));
  BOOST_TEST(at::equal(s.get({"sub", "b"}), at::tensor({6, 9}, at::kLong)));
  BOOST_TEST(s.get_non_tensor("note") == JsonValue("hi"));
  BOOST_TEST(!s.contains("stack"));  // a NonTensorStack of different values has no single value
}

BOOST_AUTO_TEST_CASE(multi_output_rebuilds_split_every_level) {
  TensorDict td = tree();
  td.lock_();
  std::vector<TensorDict> parts = td.unbind(0);
  BOOST_REQUIRE_EQUAL(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorDict& p = parts[i];
    BOOST_TEST(top_keys(p) == top_keys(td), boost::test_tools::per_element());
    BOOST_TEST(p.is_locked());
    BOOST_TEST((p.get_td("sub").batch_size() == BatchSize{2}));
    BOOST_TEST((p.get_td({"sub", "deep"}).batch_size() == BatchSize{2}));
    BOOST_TEST(at::equal(p.get({"sub", "b"}), td.get({"sub", "b"})[static_cast<int64_t>(i)]));
    BOOST_TEST(p.get_non_tensor("stack") == JsonValue(static_cast<int64_t>(i + 1)));
  }
  std::vector<TensorDict> halves = td.split(std::vector<int64_t>{1, 2}, 0);
  BOOST_TEST((halves[1].get_td({"sub", "deep"}).batch_size() == BatchSize{2, 2}));
  BOOST_TEST(halves[1].get_td("empty").keys().empty());
  BOOST_TEST(td.unbind(0).size() == 3u);
}

BOOST_AUTO_TEST_CASE(parallel_walks_match_by_key) {
  TensorDict a = tree();
  TensorDict b = a.clone();
  // other's keys in another order: matched by key, result in self's order
  TensorDict other(BatchSize{3});
  other.set("sub", b.get_td("sub"));
  other.set("a", b.get("a"));
  other.set("empty", TensorDict(BatchSize{3}));
  other.set("stack", b.get_entry("stack"));
  other.set_non_tensor("note", JsonValue("hi"));
  TensorDict sum = a.add(other);
  BOOST_TEST(top_keys(sum) == top_keys(a), boost::test_tools::per_element());
  BOOST_TEST(at::equal(sum.get({"sub", "b"}), a.get({"sub", "b"}) * 2));
  BOOST_TEST(a.eq(other).all());
  BOOST_TEST(a.equal(other));
  BOOST_TEST(!a.lt(other).any());
  b.get({"sub", "deep", "c"}).fill_(3);
  BOOST_TEST(!a.equal(b));
  BOOST_TEST(!a.eq(b).all());
  TensorDict w = a.where(at::tensor({1, 0, 1}).to(at::kBool), b);
  BOOST_TEST(at::equal(w.get({"sub", "deep", "c"}).select(0, 1), at::full({2, 4}, 3.f)));
  BOOST_TEST(at::equal(w.get({"sub", "deep", "c"}).select(0, 0), at::ones({2, 4})));
  // a key missing on one side: the errors name the nested key
  TensorDict missing = a.clone();
  missing.del({"sub", "deep", "c"});
  BOOST_CHECK_EXCEPTION(a.eq(missing), KeyError,
                        [](const KeyError& e) { return std::string(e.what()).find("('sub', 'deep')") != std::string::npos; });
  BOOST_CHECK_EXCEPTION(a.add(missing), KeyError, [](const KeyError& e) {
    return std::string(e.what()).find("('sub', 'deep', 'c')") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(leaf_walks_visit_every_tensor_with_its_key) {
  TensorDict td = tree();
  td.add_(1);
  BOOST_TEST(at::equal(td.get({"sub", "deep", "c"}), at::full({3, 2, 4}, 2.f)));
  BOOST_TEST(td.all());
  td.zero_();
  BOOST_TEST(!td.any());
  BOOST_TEST(td.get_non_tensor("note") == JsonValue("hi"));  // non-tensors untouched
  TensorDict ex = td.clone();
  ex.set({"sub", "deep", "c"}, at::ones({1, 1, 4}).expand({3, 2, 4}));
  BOOST_CHECK_EXCEPTION(ex.zero_(), RuntimeError, [](const RuntimeError& e) {
    return std::string(e.what()).find("('sub', 'deep', 'c')") != std::string::npos;
  });
  JsonValue d = describe(tree(), false);
  BOOST_TEST(zoo::leaves(tree()).size() == 3u);
  BOOST_TEST(!d.is_null());
}

BOOST_AUTO_TEST_CASE(lazy_stack_nested_in_dense) {
  TensorDict m0(Dict{{"x", at::zeros({2})}}, BatchSize{2});
  TensorDict m1(Dict{{"x", at::ones({2})}}, BatchSize{2});
  TensorDict td(BatchSize{2});
  td.set("a", at::arange(2, at::kFloat));
  td.set("lazy", LazyStackedTensorDict({m0, m1}, 1));
  BOOST_TEST((td.get_td("lazy").batch_size() == BatchSize{2, 2}));
  // clone: the lazy stack clones itself (a lazy stack again, members copied)
  TensorDict c = td.clone();
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(c.get_td("lazy")));
  BOOST_TEST(!LazyStackedTensorDict(c.get_td("lazy")).member(0).get("x").is_same(m0.get("x")));
  // rebuilds that need dense leaves run on the lazy stack's dense form
  TensorDict s = td.add(1);
  BOOST_TEST(at::equal(s.get({"lazy", "x"}), at::tensor({1.f, 2.f, 1.f, 2.f}).view({2, 2})));
  BOOST_TEST(td.equal(td.clone()));
  BOOST_TEST(td.eq(td.clone()).all());
  // index assignment reaches the lazy stack through its own node
  td.index_put_({0}, at::scalar_tensor(7.f));
  BOOST_TEST(m0.get("x")[0].item<float>() == 7.f);
  BOOST_TEST(m1.get("x")[0].item<float>() == 7.f);
}

BOOST_AUTO_TEST_CASE(typed_wrapper_keeps_schema_through_rebuilds) {
  Pt p = Pt::from_tensordict(TensorDict(Dict{{"x", at::zeros({4})}, {"y", at::ones({4})}}, BatchSize{4}));
  TensorDict outer(BatchSize{4});
  outer.set("p", p);
  BOOST_TEST(Pt::is_instance(outer.get_td("p")));
  BOOST_TEST(Pt::is_instance(outer.clone().get_td("p")));  // clone keeps the class of a typed sub-TensorDict
  BOOST_TEST(Pt::is_instance(p.clone()));
  BOOST_TEST(Pt::is_instance(p.unsqueeze(0)) == Pt::is_instance(TensorDict(p).unsqueeze(0)));
  TensorDict q = p.add(p);
  BOOST_TEST(at::equal(q.get("y"), at::full({4}, 2.f)));
  BOOST_TEST(p.equal(p.clone()));
  BOOST_TEST(p.eq(p.clone()).all());
}

BOOST_AUTO_TEST_SUITE_END()
