// LazyStackedTensorDict (upstream §3, test/test_lazy.py): a TensorDict whose node stacks members lazily.
// Test names follow upstream's where one exists.
#include <functional>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "engine/zoo.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/node.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;
using namespace at::indexing;
using zoo::throws_with;

namespace {

//! member i of a homogeneous stack: batch [3, 2], "a" [3,2,4] f32, "b" {"c": [3,2] i64}
TensorDict member(int64_t i) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(40 + i));
  TensorDict sub({{"c", at::randint(0, 50, {3, 2}, gen, at::kLong)}}, {3, 2});
  return TensorDict({{"a", at::randn({3, 2, 4}, gen)}, {"b", sub}}, {3, 2});
}

std::vector<TensorDict> members(int64_t n = 4) {
  std::vector<TensorDict> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(member(i));
  return out;
}

//! the dense equivalent of lazy_stack(tds, dim)
TensorDict dense_of(const std::vector<TensorDict>& tds, int64_t dim) { return stack(tds, dim); }

}  // namespace

BOOST_AUTO_TEST_SUITE(lazy_stacked)

BOOST_AUTO_TEST_CASE(test_stack) {
  std::vector<TensorDict> tds = members();
  for (int64_t dim : {0, 1, 2, -1}) {
    LazyStackedTensorDict lazy = lazy_stack(tds, dim);
    TensorDict dense = dense_of(tds, dim);
    BOOST_TEST(lazy.batch_size() == dense.batch_size());
    BOOST_TEST((lazy.node()->dense_node() == nullptr));
    BOOST_TEST(lazy.type_name() == "LazyStackedTensorDict");
    BOOST_TEST(lazy.get("a").equal(dense.get("a")));
    BOOST_TEST(lazy.get({"b", "c"}).equal(dense.get({"b", "c"})));
    BOOST_TEST(lazy.equal(dense));
    BOOST_TEST(lazy.contiguous().equal(dense));
    BOOST_TEST((lazy.contiguous().node()->dense_node() != nullptr));
  }
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  for (size_t i = 0; i < tds.size(); ++i) {
    BOOST_TEST(lazy.index({static_cast<int64_t>(i)}).is_same(tds[i]));  // tds[0] is tds_list[0]
    BOOST_TEST(lazy.tensordicts()[i].is_same(tds[i]));
  }
  // get returns a new tensor: writes to it are lost
  lazy.get("a").zero_();
  BOOST_TEST(!lazy.get("a").eq(0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(test_unbind_lazystack) {
  std::vector<TensorDict> tds = members();
  for (int64_t dim : {0, 1}) {
    LazyStackedTensorDict lazy = lazy_stack(tds, dim);
    std::vector<TensorDict> parts = lazy.unbind(dim);
    BOOST_REQUIRE(parts.size() == tds.size());
    for (size_t i = 0; i < parts.size(); ++i) BOOST_TEST(parts[i].is_same(tds[i]));
  }
  // another dim: lazy stacks of the members' parts
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict dense = dense_of(tds, 0);
  std::vector<TensorDict> cols = lazy.unbind(2);
  std::vector<TensorDict> want = dense.unbind(2);
  BOOST_REQUIRE(cols.size() == want.size());
  for (size_t j = 0; j < cols.size(); ++j) {
    BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(cols[j]));
    BOOST_TEST(cols[j].equal(want[j]));
  }
}

BOOST_AUTO_TEST_CASE(test_stack_keys) {
  TensorDict t0({{"a", at::zeros({2})}, {"b", at::ones({2, 3})}}, {2});
  TensorDict t1({{"a", at::ones({2})}, {"c", at::ones({2, 4})}}, {2});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  BOOST_TEST(lazy.keys() == std::vector<NestedKey>({NestedKey("a")}));  // the intersection
  BOOST_TEST(lazy.contains("a"));
  BOOST_TEST(!lazy.contains("b"));
  BOOST_TEST(lazy.index({1}).get("c").equal(at::ones({2, 4})));  // an exclusive key, through the member
  BOOST_CHECK_THROW(lazy.get("b"), KeyError);
  BOOST_TEST(throws_with<KeyError>([&] { lazy.set_("b", at::zeros({2, 2, 3})); },
                                   {"only permitted if all members of the stack have this key"}));
  // a ragged key: RuntimeError on get
  t0.set("r", at::zeros({2, 3}));
  t1.set("r", at::zeros({2, 5}));
  BOOST_TEST(throws_with<RuntimeError>([&] { lazy.get("r"); }, {"Failed to stack tensors within a tensordict"}));
}

BOOST_AUTO_TEST_CASE(test_strict_shape) {
  // members with different batch sizes: -1 where they differ
  TensorDict t0({{"x", at::zeros({3, 2})}}, {3});
  TensorDict t1({{"x", at::ones({5, 2})}}, {5});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  BOOST_TEST(lazy.batch_size() == BatchSize({2, -1}));
  BOOST_TEST(lazy.index({1}).is_same(t1));
  BOOST_TEST(lazy.index({1, Slice(0, 2)}).get("x").equal(at::ones({2, 2})));
  LazyStackedTensorDict at1 = lazy_stack({t0, t1}, 1);
  BOOST_TEST(at1.batch_size() == BatchSize({-1, 2}));
  BOOST_CHECK_THROW(lazy.set_batch_size({2, 3}), RuntimeError);  // "lazy representation ... not permitted"
  // members must have the same number of batch dims
  BOOST_CHECK_THROW(lazy_stack({t0, TensorDict({{"x", at::zeros({3, 2})}}, {3, 2})}, 0), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(test_lazy_indexing) {
  // every index combination gives what the dense stack gives (values and batch size)
  std::vector<TensorDict> tds = members();
  for (int64_t dim : {0, 1, 2}) {
    LazyStackedTensorDict lazy = lazy_stack(tds, dim);
    TensorDict dense = dense_of(tds, dim);
    const std::vector<Index> indices = {
        {0},
        {-1},
        {Slice(1, 3)},
        {Slice(None, None, 2)},
        {Slice(), 1},
        {Slice(), Slice(0, 1)},
        {1, 0},
        {Slice(), Slice(), 1},
        {Ellipsis, 0},
        {0, Ellipsis},
        {None},
        {Slice(), None, 1},
        {at::tensor({0, 2}, at::kLong)},
        {Slice(), at::tensor({1, 0}, at::kLong)},
        {at::tensor({1,0,1}, at::kLong).to(at::kBool)},
        {Slice(), Slice(), at::tensor({1,0}, at::kLong).to(at::kBool)},
        {at::tensor({3, 1}, at::kLong), Slice(1, 2)},
        {Slice(2, 2)},
    };
    for (const auto& idx : indices) {
      BOOST_TEST_CONTEXT("stack dim " << dim << " index " << index_repr(idx)) {
        TensorDict want;
        try {
          want = dense.index(idx);
        } catch (const Error&) {
          BOOST_CHECK_THROW(lazy.index(idx), Error);
          continue;
        }
        TensorDict got = lazy.index(idx);
        BOOST_TEST(got.batch_size() == want.batch_size());
        BOOST_TEST(got.equal(want));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(test_lazy_mask_indexing) {
  std::vector<TensorDict> tds = members();
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict dense = dense_of(tds, 0);
  // a mask over the stack dim alone: a lazy stack of the chosen members
  at::Tensor m1 = at::tensor({1,0,1,1}, at::kLong).to(at::kBool);
  TensorDict got = lazy.index({m1});
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(got));
  BOOST_TEST(LazyStackedTensorDict(got).tensordicts()[1].is_same(tds[2]));
  BOOST_TEST(got.equal(dense.index({m1})));
  // a mask over the stack dim and the next ones: concatenated
  auto gen = at::detail::createCPUGenerator(5);
  at::Tensor m2 = at::rand({4, 3}, gen) > 0.4;
  TensorDict got2 = lazy.index({m2});
  BOOST_TEST(got2.batch_size() == dense.index({m2}).batch_size());
  BOOST_TEST(got2.equal(dense.index({m2})));
  at::Tensor m3 = at::rand({4, 3, 2}, gen) > 0.5;
  BOOST_TEST(lazy.index({m3}).equal(dense.index({m3})));
  // a wrong mask size
  // a wrong mask size: torch's IndexError, as a TensorDict (upstream's lazy stack raises ValueError from its
  // zip of the members with the mask's rows)
  BOOST_CHECK_THROW(lazy.index({at::tensor({1,0}, at::kLong).to(at::kBool)}), IndexError);
}

BOOST_AUTO_TEST_CASE(test_lazy_mask_setitem) {
  for (int64_t dim : {0, 1}) {
    BOOST_TEST_CONTEXT("stack dim " << dim) {
      std::vector<TensorDict> tds = members();
      LazyStackedTensorDict lazy = lazy_stack(tds, dim);
      TensorDict dense = dense_of(tds, dim).clone();
      auto gen = at::detail::createCPUGenerator(9);
      at::Tensor mask = at::rand({dense.size(0), dense.size(1)}, gen) > 0.5;
      TensorDict zeros = zeros_like(dense.index({mask}));
      lazy.index_put_({mask}, zeros);
      dense.index_put_({mask}, zeros);
      BOOST_TEST(lazy.equal(dense));
    }
  }
}

BOOST_AUTO_TEST_CASE(test_setitem_reaches_members) {
  std::vector<TensorDict> tds = members();
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict dense = dense_of(tds, 0).clone();
  const std::vector<Index> indices = {{1}, {Slice(0, 2)}, {at::tensor({3, 0}, at::kLong)}, {Slice(), 1},
                                      {Slice(1, 3), Slice(), 0}};
  for (const auto& idx : indices) {
    BOOST_TEST_CONTEXT("index " << index_repr(idx)) {
      TensorDict value = dense.index(idx).apply([](const at::Tensor& t) { return t * 0 + 7; });
      lazy.index_put_(idx, value);
      dense.index_put_(idx, value);
      BOOST_TEST(lazy.equal(dense));
    }
  }
  // broadcast of a smaller value, a scalar and a tensor
  lazy.index_put_({Slice(0, 2)}, lazy.index({3}).index({0}));
  dense.index_put_({Slice(0, 2)}, dense.index({3}).index({0}));
  BOOST_TEST(lazy.equal(dense));
  lazy.index_put_({2}, at::Scalar(5));
  dense.index_put_({2}, at::Scalar(5));
  BOOST_TEST(lazy.equal(dense));
  // the members hold it (by reference)
  BOOST_TEST(tds[2].get("a").eq(5).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(test_set_and_set_) {
  std::vector<TensorDict> tds = members(3);
  LazyStackedTensorDict lazy = lazy_stack(tds, 1);
  // set: unbound along the stack dim into every member
  at::Tensor v = at::arange(3 * 3 * 2).reshape({3, 3, 2}).to(at::kFloat);
  lazy.set("new", v.clone());  // set stores without copying: the members' leaves would be views of v
  for (int64_t i = 0; i < 3; ++i) BOOST_TEST(tds[static_cast<size_t>(i)].get("new").equal(v.select(1, i)));
  BOOST_TEST(lazy.get("new").equal(v));
  // nested keys create sub-TensorDicts in every member
  lazy.set({"sub", "x"}, (v * 2).clone());
  BOOST_TEST(tds[1].get({"sub", "x"}).equal(v.select(1, 1) * 2));
  BOOST_TEST(lazy.get({"sub", "x"}).equal(v * 2));
  // set_: in place into every member
  at::Tensor before = tds[0].get("new");
  lazy.set_("new", v + 1);
  BOOST_TEST(tds[0].get("new").is_same(before));
  BOOST_TEST(tds[0].get("new").equal(v.select(1, 0) + 1));
  // wrong shapes
  BOOST_CHECK_THROW(lazy.set("bad", at::zeros({3, 4})), BatchSizeError);
  // non-tensor values broadcast to every member
  lazy.set_non_tensor("tag", JsonValue("hello"));
  BOOST_TEST(tds[2].get_non_tensor("tag").as_string() == "hello");
  // del / pop
  lazy.del("new");
  BOOST_TEST(!tds[0].contains("new"));
  BOOST_CHECK_THROW(lazy.del("new"), KeyError);
}

BOOST_AUTO_TEST_CASE(test_update_with_lazy) {
  std::vector<TensorDict> tds = members(2);
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict other({{"z", at::ones({2, 3, 2})}}, {2, 3, 2});
  lazy.update(other);
  BOOST_TEST(tds[1].get("z").equal(at::ones({3, 2})));
  // a dense TensorDict updated from a lazy stack
  TensorDict dense(BatchSize{2, 3, 2});
  dense.update(lazy);
  BOOST_TEST(dense.get("a").equal(lazy.get("a")));
  BOOST_TEST(dense.get({"b", "c"}).equal(lazy.get({"b", "c"})));
}

BOOST_AUTO_TEST_CASE(test_stack_apply) {
  std::vector<TensorDict> tds = members();
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict r = lazy.apply([](const at::Tensor& t) { return t + 1; });
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(r));
  BOOST_TEST(r.equal(dense_of(tds, 0).apply([](const at::Tensor& t) { return t + 1; })));
  TensorDict c = lazy.clone();
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(c));
  BOOST_TEST(c.equal(lazy));
  BOOST_TEST(!LazyStackedTensorDict(c).tensordicts()[0].is_same(tds[0]));
  lazy.apply_([](const at::Tensor& t) { return t * 0; });
  BOOST_TEST(tds[3].get("a").eq(0).all().item<bool>());
}

// upstream LazyStackedTensorDict._apply_nest: "any op that modifies the batch-size will result in a regular TensorDict"
BOOST_AUTO_TEST_CASE(apply_with_a_batch_size_gives_a_regular_tensordict) {
  std::vector<TensorDict> tds = members();
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  const BatchSize b = lazy.batch_size();
  const int64_t n = b[0] * b[1];
  const TensorDict dense = dense_of(tds, 0);
  auto flat = [](const at::Tensor& t) { return t.flatten(0, 1) * 2; };
  TensorDict r = lazy.apply(flat, ApplyOptions().batch_size(BatchSize{n, b[2]}));
  BOOST_TEST(!LazyStackedTensorDict::is_lazy_stack(r));
  BOOST_TEST((r.node()->dense_node() != nullptr));
  BOOST_TEST(r.batch_size() == BatchSize({n, b[2]}));
  BOOST_TEST(r.equal(dense.apply(flat, ApplyOptions().batch_size(BatchSize{n, b[2]}))));
  // with another TensorDict: its leaves at the same keys
  TensorDict other = dense.apply([](const at::Tensor& t) { return t * 0 + 5; });
  auto both = [](const std::vector<at::Tensor>& v) { return (v[0] + v[1]).flatten(0, 1); };
  TensorDict r2 = lazy.apply(both, {other}, ApplyOptions().batch_size(BatchSize{n, b[2]}));
  BOOST_TEST(!LazyStackedTensorDict::is_lazy_stack(r2));
  BOOST_TEST(r2.equal(dense.apply(both, {other}, ApplyOptions().batch_size(BatchSize{n, b[2]}))));
  // a batch size the results do not fit: the dense apply's BatchSizeError, the stack unchanged
  BOOST_CHECK_THROW(lazy.apply(flat, ApplyOptions().batch_size(BatchSize{n + 1})), BatchSizeError);
  BOOST_TEST(lazy.equal(dense));
}

BOOST_AUTO_TEST_CASE(test_best_intention_stack) {
  // maybe_dense_stack: dense when the members stack, lazy otherwise
  std::vector<TensorDict> tds = members(2);
  BOOST_TEST((maybe_dense_stack(tds, 0).node()->dense_node() != nullptr));
  TensorDict t0({{"a", at::zeros({2, 3})}}, {2});
  TensorDict t1({{"a", at::zeros({2, 4})}}, {2});
  TensorDict s = maybe_dense_stack({t0, t1}, 0);
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(s));
  BOOST_TEST(s.batch_size() == BatchSize({2, 2}));
}

BOOST_AUTO_TEST_CASE(test_lazy_stacked_append_and_insert) {
  std::vector<TensorDict> tds = members(2);
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  TensorDict extra = member(9);
  lazy.append(extra);
  BOOST_TEST(lazy.batch_size() == BatchSize({3, 3, 2}));
  BOOST_TEST(lazy.index({2}).is_same(extra));
  TensorDict first = member(8);
  lazy.insert(0, first);
  BOOST_TEST(lazy.size() == 4u);
  BOOST_TEST(lazy.index({0}).is_same(first));
  BOOST_TEST(throws_with<ValueError>([&] { lazy.append(TensorDict({{"a", at::zeros({4})}}, {4})); },
                                     {"Batch sizes in tensordicts differs"}));
  lazy.lock_();
  BOOST_CHECK_THROW(lazy.append(member(1)), LockedError);
}

BOOST_AUTO_TEST_CASE(lock_propagates_to_members) {
  std::vector<TensorDict> tds = members(2);
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  lazy.lock_();
  BOOST_TEST(lazy.is_locked());
  BOOST_TEST(tds[0].is_locked());
  BOOST_CHECK_THROW(lazy.set("new", at::zeros({2, 3, 2})), LockedError);
  BOOST_CHECK_THROW(tds[0].unlock_(), LockedError);  // a locked parent holds it
  lazy.set_("a", at::zeros({2, 3, 2, 4}));            // in place is allowed
  BOOST_TEST(tds[1].get("a").eq(0).all().item<bool>());
  BOOST_TEST(lazy.index({Slice(0, 1)}).is_locked());  // indexing a locked stack gives a locked result
  lazy.unlock_();
  BOOST_TEST(!tds[0].is_locked());
}

BOOST_AUTO_TEST_CASE(nested_lazy_stack_in_a_tensordict) {
  std::vector<TensorDict> tds = members(2);
  TensorDict outer({{"x", at::zeros({2, 3})}}, {2, 3});
  outer.set("lazy", lazy_stack(tds, 0));
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(outer.get_td("lazy")));
  BOOST_TEST(outer.get({"lazy", "a"}).equal(stack(tds, 0).get("a")));
  std::vector<NestedKey> keys = outer.keys(KeysOptions().include_nested(true).leaves_only(true).sort(true));
  BOOST_TEST(keys.size() == 3u);
  // indexing the outer TensorDict indexes the lazy child
  TensorDict row = outer.index({1});
  BOOST_TEST(row.get_td("lazy").is_same(tds[1]));
  BOOST_TEST(outer.index({Slice(0, 1), 2}).get({"lazy", "b", "c"}).equal(stack(tds, 0).index({Slice(0, 1), 2}).get({"b", "c"})));
  // writing through the outer TensorDict reaches the members
  outer.set({"lazy", "a"}, at::ones({2, 3, 2, 4}));
  BOOST_TEST(tds[0].get("a").eq(1).all().item<bool>());
  TensorDict value = outer.index({0}).clone().apply([](const at::Tensor& t) { return t * 0 + 3; });
  outer.index_put_({0}, value);
  BOOST_TEST(tds[0].get("a").eq(3).all().item<bool>());
  BOOST_TEST(outer.get("x")[0].eq(3).all().item<bool>());
  // apply / clone / equal recurse into it
  TensorDict plus = outer.apply([](const at::Tensor& t) { return t + 1; });
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(plus.get_td("lazy")));
  BOOST_TEST(plus.get({"lazy", "a"}).equal(outer.get({"lazy", "a"}) + 1));
  BOOST_TEST(outer.clone().equal(outer));
  // lock reaches the members through the lazy child
  outer.lock_();
  BOOST_TEST(tds[1].is_locked());
  outer.unlock_();
}

BOOST_AUTO_TEST_CASE(repr_as_upstream) {
  TensorDict t0({{"a", at::zeros({2, 3})}, {"b", at::zeros({2})}}, {2});
  TensorDict t1({{"a", at::zeros({2, 5})}}, {2});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  const std::string want =
      "LazyStackedTensorDict(\n"
      "    fields={\n"
      "        a: Tensor(shape=torch.Size([2, 2, -1]), device=cpu, dtype=torch.float32, is_shared=False)},\n"
      "    exclusive_fields={\n"
      "        0 ->\n"
      "            b: Tensor(shape=torch.Size([2]), device=cpu, dtype=torch.float32, is_shared=False)},\n"
      "    batch_size=torch.Size([2, 2]),\n"
      "    device=None,\n"
      "    is_shared=False,\n"
      "    stack_dim=0)";
  BOOST_TEST(repr(lazy) == want);
}

BOOST_AUTO_TEST_CASE(not_yet_generic_ops_raise_not_implemented) {
  LazyStackedTensorDict lazy = lazy_stack(members(2), 0);
  BOOST_TEST(throws_with<NotImplementedError>([&] { lazy.share_memory_(); }, {"LazyStackedTensorDict"}));
}

BOOST_AUTO_TEST_CASE(test_lazy_get_as_list_and_as_padded_tensor) {
  TensorDict t0({{"a", at::ones({2, 3})}}, {2});
  TensorDict t1({{"a", at::full({2, 5}, 2.f)}}, {2});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  BOOST_TEST(throws_with<RuntimeError>([&] { lazy.get("a"); }, {"Failed to stack tensors within a tensordict"}));
  std::vector<at::Tensor> parts = lazy.get_list("a");  // as_list=True
  BOOST_TEST(parts.size() == 2u);
  BOOST_TEST((parts[1].sizes() == at::IntArrayRef{2, 5}));
  at::Tensor right = lazy.get_padded("a");  // as_padded_tensor=True: padded at the end, zeros
  BOOST_TEST((right.sizes() == at::IntArrayRef{2, 2, 5}));
  BOOST_TEST(right[0][0][2].item<float>() == 1.f);
  BOOST_TEST(right[0][0][3].item<float>() == 0.f);
  at::Tensor left = lazy.get_padded("a", -1.0, "left");  // padding_side="left", padding_value=-1
  BOOST_TEST(left[0][0][0].item<float>() == -1.f);
  BOOST_TEST(left[0][0][4].item<float>() == 1.f);
  BOOST_TEST(left[1][1][0].item<float>() == 2.f);
  BOOST_TEST(throws_with<ValueError>([&] { lazy.get_padded("a", 0, "middle"); }, {"padding_side"}));
  BOOST_TEST(throws_with<KeyError>([&] { lazy.get_list("missing"); }, {"missing"}));
  // stack dim 1: padded leaves stacked along it
  LazyStackedTensorDict l1 = lazy_stack({t0, t1}, 1);
  BOOST_TEST((l1.get_padded("a").sizes() == at::IntArrayRef{2, 2, 5}));
}

BOOST_AUTO_TEST_CASE(test_lazy_cat_keeps_laziness) {
  TensorDict t0({{"a", at::zeros({2, 3})}}, {2});
  TensorDict t1({{"a", at::ones({2, 5})}}, {2});
  LazyStackedTensorDict x = lazy_stack({t0, t1}, 0);
  LazyStackedTensorDict y = lazy_stack({t1.clone(), t0.clone(), t1.clone()}, 0);
  TensorDict along = cat({x, y}, 0);  // along the stack dim: every member, lazily
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(along));
  BOOST_TEST((along.batch_size() == BatchSize{5, 2}));
  BOOST_TEST(LazyStackedTensorDict(along).member(0).is_same(t0));  // the members themselves
  TensorDict across = cat({x, x}, 1);  // member i = cat of the members i
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(across));
  BOOST_TEST((across.batch_size() == BatchSize{2, 4}));
  BOOST_TEST((LazyStackedTensorDict(across).member(1).get("a").sizes() == at::IntArrayRef{4, 5}));
  BOOST_TEST(throws_with<RuntimeError>([&] { cat({x, y}, 1); }, {"same number of members"}));
}

BOOST_AUTO_TEST_CASE(test_memmap_td_holding_a_lazy_stack) {
  fixtures::TempDir dir("lazychild");
  TensorDict t0({{"a", at::zeros({2, 3})}}, {2});
  TensorDict t1({{"a", at::ones({2, 5})}, {"only1", at::ones({2})}}, {2});
  TensorDict outer({{"x", at::arange(2)}}, {2});
  outer.set("lazy", lazy_stack({t0, t1}, 1));
  outer.memmap_(dir.path + "/td");
  BOOST_TEST(outer.is_memmap());
  BOOST_TEST(t1.is_memmap());  // the members are memory-mapped in place
  TensorDict back = TensorDict::load_memmap(dir.path + "/td");
  TensorDict lz = back.get_td("lazy");
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(lz));  // stays lazy, as upstream loads it
  LazyStackedTensorDict l(lz);
  BOOST_TEST(l.stack_dim() == 1);
  BOOST_TEST(l.member(1).get("a").sum().item<float>() == 10.f);
  BOOST_TEST(l.member(1).contains("only1"));
  BOOST_TEST(back.get("x")[1].item<int64_t>() == 1);
}

BOOST_AUTO_TEST_CASE(index_put_on_ragged_batch_with_paired_index_tensors_is_refused) {
  // members of batch [2] and [3]: two paired index tensors have no per-member split and no dense positions
  TensorDict t0({{"a", at::zeros({2})}}, {2});
  TensorDict t1({{"a", at::zeros({3})}}, {3});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  at::Tensor i = at::tensor({0, 1}, at::kLong);
  BOOST_TEST(throws_with<NotImplementedError>([&] { lazy.index_put_({i, i}, at::Scalar(1.0)); },
                                              {"differ in batch size"}));
  BOOST_TEST(t0.get("a").sum().item<float>() == 0.f);  // nothing written
  BOOST_TEST(t1.get("a").sum().item<float>() == 0.f);
}

// upstream: shape ops of a lazy stack return lazy stacks with a moved stack dim (_unsqueeze, _squeeze, _permute,
// _transpose, _view, split / chunk); values as the dense stack's, members' results are their views
BOOST_AUTO_TEST_CASE(test_shape_ops_return_lazy_stacks) {
  std::vector<TensorDict> tds = members();  // 4 members of batch [3, 2]
  struct Case {
    const char* what;
    int64_t stack_dim;
    std::function<TensorDict(const TensorDict&)> op;
    int64_t want_stack_dim;  // -1: the result is dense (the op merges or splits the stack dim)
  };
  const std::vector<Case> cases = {
      {"unsqueeze(0)", 1, [](const TensorDict& t) { return t.unsqueeze(0); }, 2},
      {"unsqueeze(1)", 1, [](const TensorDict& t) { return t.unsqueeze(1); }, 2},
      {"unsqueeze(2)", 1, [](const TensorDict& t) { return t.unsqueeze(2); }, 1},
      {"unsqueeze(-1)", 0, [](const TensorDict& t) { return t.unsqueeze(-1); }, 0},
      {"permute(2,0,1)", 1, [](const TensorDict& t) { return t.permute({2, 0, 1}); }, 2},
      {"permute(1,0)", 0, [](const TensorDict& t) { return t.permute({1, 0}); }, 1},
      {"transpose(0,1)", 1, [](const TensorDict& t) { return t.transpose(0, 1); }, 0},
      {"transpose(-1,0)", 1, [](const TensorDict& t) { return t.transpose(-1, 0); }, 1},
      {"view(3,4,2,1)", 1, [](const TensorDict& t) { return t.view({3, 4, 2, 1}); }, 1},
      {"reshape(4,6)", 0, [](const TensorDict& t) { return t.reshape({4, 6}); }, 0},
      {"reshape(-1,2)", 0, [](const TensorDict& t) { return t.reshape({-1, 2}); }, -1},
      {"flatten(1,2)", 0, [](const TensorDict& t) { return t.flatten(1, 2); }, 0},
      {"flatten(0,1)", 2, [](const TensorDict& t) { return t.flatten(0, 1); }, 1},
      {"flatten(0,2)", 2, [](const TensorDict& t) { return t.flatten(0, 2); }, -1},
      {"unflatten(2,(2,1))", 0, [](const TensorDict& t) { return t.unflatten(2, {2, 1}); }, 0},
      {"unflatten(0,(3,1))", 1, [](const TensorDict& t) { return t.unflatten(0, {3, 1}); }, 2},
      {"unflatten(stack)", 0, [](const TensorDict& t) { return t.unflatten(0, {2, 2}); }, -1},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what << " of a stack along " << c.stack_dim) {
      LazyStackedTensorDict lazy = lazy_stack(tds, c.stack_dim);
      const TensorDict got = c.op(lazy);
      const TensorDict want = c.op(dense_of(tds, c.stack_dim));
      BOOST_TEST(got.batch_size() == want.batch_size());
      BOOST_TEST(got.equal(want));
      BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(got) == (c.want_stack_dim >= 0));
      if (c.want_stack_dim < 0) continue;
      LazyStackedTensorDict l(got);
      BOOST_TEST(l.stack_dim() == c.want_stack_dim);
      BOOST_REQUIRE(l.size() == tds.size());
      for (size_t i = 0; i < tds.size(); ++i) {  // views of the members: a write through the result reaches them
        BOOST_TEST(l.member(static_cast<int64_t>(i)).get("a").is_alias_of(tds[i].get("a")));
        BOOST_TEST(l.member(static_cast<int64_t>(i)).get({"b", "c"}).is_alias_of(tds[i].get({"b", "c"})));
      }
    }
  }
  // squeeze: the stack dim of a stack of one gives its member; other singleton dims stay lazy
  TensorDict one({{"a", at::zeros({3, 1, 2})}}, {3, 1});
  LazyStackedTensorDict single = lazy_stack({one}, 0);
  BOOST_TEST(single.squeeze(0).is_same(one));
  const TensorDict sq = single.squeeze(2);
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(sq));
  BOOST_TEST(sq.batch_size() == BatchSize({1, 3}));
  BOOST_TEST(single.squeeze(1).is_same(single));  // a non-singleton dim is left alone, like torch
  const TensorDict all = single.squeeze();         // every singleton dim: the member, squeezed
  BOOST_TEST(all.batch_size() == BatchSize({3}));
  BOOST_TEST(all.get("a").is_alias_of(one.get("a")));
  LazyStackedTensorDict two = lazy_stack({one, one.clone()}, 1);
  const TensorDict sq2 = two.squeeze();
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(sq2));
  BOOST_TEST(sq2.batch_size() == BatchSize({3, 2}));
  BOOST_TEST(LazyStackedTensorDict(sq2).stack_dim() == 1);
}

BOOST_AUTO_TEST_CASE(test_split_and_chunk_lazy_stacks) {
  std::vector<TensorDict> tds = members();
  LazyStackedTensorDict lazy = lazy_stack(tds, 0);
  // along the stack dim: lazy stacks of the members themselves
  std::vector<TensorDict> halves = lazy.split(2, 0);
  BOOST_REQUIRE(halves.size() == 2);
  for (size_t h = 0; h < 2; ++h) {
    LazyStackedTensorDict part(halves[h]);
    BOOST_TEST(part.stack_dim() == 0);
    BOOST_TEST(part.member(0).is_same(tds[2 * h]));
    BOOST_TEST(part.member(1).is_same(tds[2 * h + 1]));
  }
  std::vector<TensorDict> chunks = lazy.chunk(3, 0);
  std::vector<TensorDict> want_chunks = dense_of(tds, 0).chunk(3, 0);
  BOOST_REQUIRE(chunks.size() == want_chunks.size());
  for (size_t j = 0; j < chunks.size(); ++j) BOOST_TEST(chunks[j].equal(want_chunks[j]));
  // across it: member by member, each part a lazy stack of the members' parts
  std::vector<TensorDict> cols = lazy.split(std::vector<int64_t>{1, 2}, 1);
  std::vector<TensorDict> want = dense_of(tds, 0).split(std::vector<int64_t>{1, 2}, 1);
  BOOST_REQUIRE(cols.size() == 2);
  for (size_t j = 0; j < 2; ++j) {
    BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(cols[j]));
    BOOST_TEST(cols[j].equal(want[j]));
    BOOST_TEST(LazyStackedTensorDict(cols[j]).member(3).get("a").is_alias_of(tds[3].get("a")));
  }
  BOOST_CHECK_THROW(lazy.split(std::vector<int64_t>{1, 1}, 1), RuntimeError);  // sizes must sum to the dim
  BOOST_CHECK_THROW(lazy.split(2, 5), IndexError);
}

BOOST_AUTO_TEST_CASE(shape_ops_of_ragged_lazy_stacks_stay_lazy) {
  // members of batch [3] and [5]: the dense stack does not exist, the lazy shape ops still work
  TensorDict t0({{"x", at::arange(6).view({3, 2})}}, {3});
  TensorDict t1({{"x", at::arange(10).view({5, 2})}}, {5});
  LazyStackedTensorDict lazy = lazy_stack({t0, t1}, 0);
  const TensorDict u = lazy.unsqueeze(-1);
  BOOST_TEST(u.batch_size() == BatchSize({2, -1, 1}));
  BOOST_TEST(LazyStackedTensorDict(u).member(1).get("x").is_alias_of(t1.get("x")));
  const TensorDict p = lazy.transpose(0, 1);
  BOOST_TEST(p.batch_size() == BatchSize({-1, 2}));
  BOOST_TEST(LazyStackedTensorDict(p).stack_dim() == 1);
  BOOST_TEST(LazyStackedTensorDict(p).member(1).is_same(t1));  // an identity permute of a member is itself
  std::vector<TensorDict> halves = lazy.split(1, 0);
  BOOST_TEST(halves.size() == 2);
  BOOST_TEST(LazyStackedTensorDict(halves[1]).member(0).is_same(t1));
  // ops that need the dense stack give the stack error
  BOOST_TEST(throws_with<Error>([&] { lazy.reshape({-1}); }, {"cannot densify the stack"}));
  // leaf shapes may differ when the batch does not: a view keeping the stack dim stays lazy
  TensorDict r0({{"a", at::zeros({3, 2, 4})}}, {3, 2});
  TensorDict r1({{"a", at::ones({3, 2, 7})}}, {3, 2});
  LazyStackedTensorDict ragged_leaf = lazy_stack({r0, r1}, 0);
  const TensorDict v = ragged_leaf.view({2, 6});
  BOOST_TEST(v.batch_size() == BatchSize({2, 6}));
  BOOST_TEST(LazyStackedTensorDict(v).member(1).get("a").sizes() == at::IntArrayRef({6, 7}));
}

BOOST_AUTO_TEST_CASE(shape_ops_of_a_locked_lazy_stack_are_locked_and_checked) {
  std::vector<TensorDict> tds = members(2);
  LazyStackedTensorDict lazy = lazy_stack(tds, 1);
  lazy.lock_();
  BOOST_TEST(lazy.unsqueeze(0).is_locked());
  BOOST_TEST(lazy.permute({2, 1, 0}).is_locked());
  BOOST_TEST(lazy.split(1, 1)[0].is_locked());
  BOOST_CHECK_THROW(lazy.unsqueeze(0).set("new", at::zeros({1, 3, 2, 2})), LockedError);
  // the dense ops' error classes (upstream): RuntimeError in unsqueeze, ValueError in permute / transpose
  BOOST_CHECK_THROW(lazy.unsqueeze(4), RuntimeError);
  BOOST_CHECK_THROW(lazy.permute({0, 0, 1}), ValueError);
  BOOST_CHECK_THROW(lazy.transpose(0, 3), ValueError);
  BOOST_CHECK_THROW(lazy.view({5}), RuntimeError);
  BOOST_CHECK_THROW(lazy.view({-1, 5}), AssertionError);
  BOOST_CHECK_THROW(lazy.flatten(2, 0), ValueError);
}

BOOST_AUTO_TEST_SUITE_END()
