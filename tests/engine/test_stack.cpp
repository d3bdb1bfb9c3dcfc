// stack / cat / zeros_like / ones_like / empty_like (upstream test_stack_onto, test_cat_td,
// test_dense_stack_tds and §1.7 / §1.15 of the API reference).
#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

using zoo::throws_with;

//! every tensor leaf of `got` equals `op` over the leaves of the same key in `ins`
void check_combined(const std::vector<TensorDict>& ins, const TensorDict& got, const BatchSize& want_bs,
                    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& op, const std::string& ctx) {
  BOOST_TEST_CONTEXT(ctx) {
    BOOST_TEST(got.batch_size() == want_bs);
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> in_leaves;
    for (const auto& td : ins) in_leaves.push_back(zoo::leaves(td));
    auto g = zoo::leaves(got);
    BOOST_REQUIRE_EQUAL(g.size(), in_leaves[0].size());
    for (size_t i = 0; i < g.size(); ++i) {
      std::vector<at::Tensor> parts;
      for (const auto& l : in_leaves) parts.push_back(l[i].second);
      at::Tensor want = op(parts);
      BOOST_TEST(g[i].first == in_leaves[0][i].first);
      BOOST_TEST(g[i].second.sizes() == want.sizes(), "leaf " << g[i].first);
      BOOST_TEST(at::equal(g[i].second, want), "leaf " << g[i].first << " differs");
    }
  }
}

std::vector<int64_t> ptrs(const TensorDict& td) {
  std::vector<int64_t> out;
  for (auto& kv : zoo::leaves(td)) out.push_back(reinterpret_cast<int64_t>(kv.second.data_ptr()));
  return out;
}

TensorDict two_level(const BatchSize& bs, int64_t seed) {
  TensorDict td = zoo::plain(bs, seed);
  BatchSize nbs = bs;
  nbs.push_back(2);
  td.set("nested", TensorDict(Dict{{"x", zoo::randn(zoo::cat_shape(nbs, {3}), seed + 10)}}, nbs));
  return td;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stack)

// ---------------------------------------------------------------------------- stack
BOOST_AUTO_TEST_CASE(stack_over_zoo) {
  for (int64_t dim : {0, 2, 4, -1, -5, -3}) {
    for (const auto& kind : zoo::kinds()) {
      TensorDict a = kind.make();
      TensorDict b = ones_like(a);
      TensorDict c = zeros_like(a);
      const int64_t d = dim < 0 ? dim + 5 : dim;
      BatchSize want = a.batch_size();
      want.insert(want.begin() + d, 3);
      std::string ctx = kind.name + " stack dim " + std::to_string(dim);
      TensorDict s = tensordict::stack({a, b, c}, dim);
      check_combined({a, b, c}, s, want, [&](const std::vector<at::Tensor>& ts) { return at::stack(ts, d); }, ctx);
      BOOST_TEST_CONTEXT(ctx) {
        if (a.contains("nested")) BOOST_TEST(s.get_td("nested").batch_size() == zoo::cat_shape(want, {2}));
        if (a.contains("data")) {
          // torch.stack of NonTensorData -> NonTensorStack; equal values -> every element equal (upstream's
          // default, capture_non_tensor_stack off: test_map_non_tensor)
          Entry e = s.get_entry("data");
          BOOST_TEST(e.is_non_tensor_stack());
          BOOST_TEST(e.shape() == want);
          BOOST_TEST(e.non_tensor_stack().all_equal());
          BOOST_TEST(e.non_tensor_stack().at(0) == JsonValue("a string"));
          // indexing it selects equal values: a NonTensorData (upstream, issue 15)
          BOOST_TEST(s.index({0}).get_entry("data").is_non_tensor_data());
        }
        BOOST_TEST(!s.is_locked());
        zoo::check_equal(s.unbind(dim)[1], b);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(stack_unbind_round_trip) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    for (int64_t dim = -4; dim < 4; ++dim) {
      BOOST_TEST_CONTEXT(kind.name << " dim " << dim) { zoo::check_equal(tensordict::stack(td.unbind(dim), dim), td); }
    }
  }
}

BOOST_AUTO_TEST_CASE(stack_result_is_a_copy) {
  TensorDict a = zoo::plain({2});
  TensorDict s = tensordict::stack({a, a}, 0);
  s.get("a").zero_();
  BOOST_TEST((a.get("a") != 0).any().item<bool>());
}

BOOST_AUTO_TEST_CASE(dense_stack_nested_tds) {
  // dense analogue of upstream test_dense_stack_tds: containers holding sub-TDs with extra batch dims
  for (int64_t stack_dim : {0, 1, 2, -1}) {
    TensorDict c0 = two_level({5, 6}, 1);
    TensorDict c1 = two_level({5, 6}, 2);
    TensorDict s = tensordict::stack({c0, c1}, stack_dim);
    const int64_t d = stack_dim < 0 ? stack_dim + 3 : stack_dim;
    BatchSize want{5, 6};
    want.insert(want.begin() + d, 2);
    check_combined({c0, c1}, s, want, [&](const std::vector<at::Tensor>& ts) { return at::stack(ts, d); },
                   "dim " + std::to_string(stack_dim));
    BOOST_TEST(s.get_td("nested").batch_size() == zoo::cat_shape(want, {2}));
  }
}

BOOST_AUTO_TEST_CASE(stack_errors) {
  TensorDict a = two_level({3, 2}, 1);
  BOOST_TEST(throws_with<RuntimeError>([] { tensordict::stack({}, 0); }, {"empty"}));  // upstream
  BOOST_TEST(throws_with<IndexError>([&] { tensordict::stack({a, a}, 3); }, {"stack", "[-3, 2]", "got 3"}));
  BOOST_CHECK_THROW(tensordict::stack({a, a}, -4), IndexError);
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::stack({a, two_level({3, 1}, 2)}, 0); },
                                         {"congruent batch sizes", "torch.Size([3, 1])", "torch.Size([3, 2])"}));
  // exclusive key sets (upstream RuntimeError "sets of keys ... are exclusive")
  TensorDict b = a.clone();
  b.del("c");
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::stack({a, b}, 0); }, {"sets of keys", "exclusive"}));
  TensorDict b2 = a.clone();
  b2.del("c");
  b2.set("z", at::zeros({3, 2}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::stack({a, b2}, 0); }, {"sets of keys", "exclusive", "'z'"}));
  TensorDict nb = a.clone();
  nb.set({"nested", "extra"}, at::zeros({3, 2, 2}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::stack({a, nb}, 0); }, {"sets of keys", "nested"}));
  // leaf shapes must be identical; the error names the key
  TensorDict s = a.clone();
  s.set("a", at::zeros({3, 2, 4}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::stack({a, s}, 0); }, {"shapes", "incompatible", "a"}));
  TensorDict ns = a.clone();
  ns.set({"nested", "x"}, at::zeros({3, 2, 2, 4}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::stack({a, ns}, 0); }, {"incompatible", "x"}));
  // sub-TDs with other extra batch dims
  TensorDict nbs = a.clone();
  nbs.set("nested", TensorDict(Dict{{"x", at::zeros({3, 2, 3, 3})}}, {3, 2, 3}));
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::stack({a, nbs}, 0); }, {"congruent", "nested"}));
  // a tensor in one, a TensorDict in the other
  TensorDict k = a.clone();
  k.del("nested");
  k.set("nested", at::zeros({3, 2}));
  BOOST_TEST(throws_with<TypeError>([&] { tensordict::stack({a, k}, 0); }, {"nested", "Tensor", "TensorDict"}));
  // undefined handle
  BOOST_CHECK_THROW(tensordict::stack({a, TensorDict::undefined()}, 0), ValueError);
}

BOOST_AUTO_TEST_CASE(stack_non_tensor_values) {
  TensorDict a(Dict{{"x", at::zeros({2})}}, {2});
  TensorDict b(Dict{{"x", at::ones({2})}}, {2});
  a.set("s", "left");
  b.set("s", "right");
  TensorDict s0 = tensordict::stack({a, b}, 0);
  using A = JsonValue::Array;
  BOOST_TEST(s0.get_entry("s").is_non_tensor_stack());
  BOOST_TEST(s0.get_non_tensor("s") == JsonValue(A{JsonValue(A{"left", "left"}), JsonValue(A{"right", "right"})}));
  TensorDict s1 = tensordict::stack({a, b}, 1);
  BOOST_TEST(s1.get_non_tensor("s") == JsonValue(A{JsonValue(A{"left", "right"}), JsonValue(A{"left", "right"})}));
  // stacks of stacks, and a NonTensorData mixed with a NonTensorStack
  TensorDict ss = tensordict::stack({s1, s1}, 0);
  BOOST_TEST(ss.get_entry("s").shape() == BatchSize({2, 2, 2}));
  BOOST_TEST(ss.get_non_tensor("s") == JsonValue(A{s1.get_non_tensor("s"), s1.get_non_tensor("s")}));
  TensorDict c(Dict{{"x", at::ones({2, 2})}}, {2, 2});
  c.set("s", "mid");
  TensorDict mixed = tensordict::stack({s1, c}, 2);
  BOOST_TEST(mixed.get_non_tensor("s") ==
             JsonValue(A{JsonValue(A{JsonValue(A{"left", "mid"}), JsonValue(A{"right", "mid"})}),
                         JsonValue(A{JsonValue(A{"left", "mid"}), JsonValue(A{"right", "mid"})})}));
  // a non-tensor against a tensor is a kind mismatch
  TensorDict t(Dict{{"x", at::ones({2})}, {"s", at::ones({2})}}, {2});
  BOOST_TEST(throws_with<TypeError>([&] { tensordict::stack({a, t}, 0); }, {"s", "NonTensorData", "Tensor"}));
}

BOOST_AUTO_TEST_CASE(stack_onto_out) {
  // upstream test_stack_onto: stack(..., out=td_out) writes in place, data_ptrs unchanged
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      TensorDict td0 = zeros_like(td);
      TensorDict td1 = ones_like(td);
      TensorDict u = td.unsqueeze(1);
      TensorDict td_out = u.expand({4, 2, 3, 2, 1}).clone();
      auto before = ptrs(td_out);
      TensorDict r = tensordict::stack({td0, td1}, 1, td_out);
      BOOST_TEST(r.is_same(td_out));
      BOOST_TEST(ptrs(td_out) == before);
      zoo::check_equal(td_out, tensordict::stack({td0, td1}, 1));
      if (td.contains("data")) BOOST_TEST(td_out.get_entry("data").shape() == BatchSize({4, 2, 3, 2, 1}));
    }
  }
}

BOOST_AUTO_TEST_CASE(stack_out_errors_leave_out_untouched) {
  TensorDict a = two_level({3}, 1);
  TensorDict b = two_level({3}, 2);
  TensorDict good = tensordict::stack({a, b}, 0);
  auto fresh = [&] { return zeros_like(good); };
  // wrong batch size
  TensorDict o1 = zeros_like(tensordict::stack({a, b, a}, 0));
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::stack({a, b}, 0, o1); },
                                         {"out.batch_size", "torch.Size([3, 3])", "torch.Size([2, 3])"}));
  // a key of the inputs missing in out
  TensorDict o2 = fresh();
  o2.del({"nested", "x"});
  BOOST_TEST(throws_with<KeyError>([&] { tensordict::stack({a, b}, 0, o2); }, {"x", "missing in out"}));
  BOOST_TEST((o2.get("a") == 0).all().item<bool>());  // validation happens before any write
  // wrong leaf shape deep inside: nothing written before the check fails
  TensorDict o3 = fresh();
  o3.get_td("nested").set("x", at::zeros({2, 3, 2, 4}));
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::stack({a, b}, 0, o3); }, {"x", "[2, 3, 2, 4]", "[2, 3, 2, 3]"}));
  BOOST_TEST((o3.get("a") == 0).all().item<bool>());
  // kind mismatch, dtype that cannot hold the result
  TensorDict o4 = fresh();
  o4.del("nested");
  o4.set("nested", at::zeros({2, 3}));
  BOOST_CHECK_THROW(tensordict::stack({a, b}, 0, o4), TypeError);
  TensorDict o5 = fresh();
  o5.set("a", at::zeros({2, 3, 5}, at::kLong));
  BOOST_TEST(throws_with<TypeError>([&] { tensordict::stack({a, b}, 0, o5); }, {"dtype", "Float", "Long"}));
  // an out dtype that can hold the result receives it in place (float -> double)
  TensorDict o8 = fresh();
  o8.set("a", at::zeros({2, 3, 5}, at::kDouble));
  void* p8 = o8.get("a").data_ptr();
  tensordict::stack({a, b}, 0, o8);
  BOOST_TEST(o8.get("a").data_ptr() == p8);
  BOOST_TEST(o8.get("a").equal(good.get("a").to(at::kDouble)));
  // extra keys in out are left alone (upstream _stack_onto_ skips them)
  TensorDict o6 = fresh();
  o6.set("extra", at::full({2, 3}, 7.0));
  tensordict::stack({a, b}, 0, o6);
  BOOST_TEST((o6.get("extra") == 7.0).all().item<bool>());
  zoo::check_equal(o6.exclude({"extra"}), good);
  // a locked out (e.g. memmap) receives the values in place
  TensorDict o7 = fresh();
  o7.lock_();
  tensordict::stack({a, b}, 0, o7);
  zoo::check_equal(o7, good);
}

// ---------------------------------------------------------------------------- cat
BOOST_AUTO_TEST_CASE(cat_over_zoo) {
  for (int64_t dim : {0, 1, 3, -1, -3}) {
    for (const auto& kind : zoo::kinds()) {
      TensorDict a = kind.make();
      TensorDict b = ones_like(a);
      const int64_t d = dim < 0 ? dim + 4 : dim;
      BatchSize want = a.batch_size();
      want[d] *= 2;
      std::string ctx = kind.name + " cat dim " + std::to_string(dim);
      TensorDict c = tensordict::cat({a, b}, dim);
      check_combined({a, b}, c, want, [&](const std::vector<at::Tensor>& ts) { return at::cat(ts, d); }, ctx);
      BOOST_TEST_CONTEXT(ctx) {
        if (a.contains("nested")) BOOST_TEST(c.get_td("nested").batch_size() == zoo::cat_shape(want, {2}));
        if (a.contains("data")) {
          BOOST_TEST(c.get_entry("data").is_non_tensor_stack());
          BOOST_TEST(c.get_entry("data").shape() == want);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(cat_split_round_trip) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    for (int64_t dim = 0; dim < 3; ++dim) {
      BOOST_TEST_CONTEXT(kind.name << " dim " << dim) {
        zoo::check_equal(tensordict::cat(td.split(1, dim), dim), td);
        zoo::check_equal(tensordict::cat(td.chunk(2, dim), dim), td);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(cat_td) {
  // upstream test_cat_td
  TensorDict td1(Dict{{"key1", at::randn({4, 5, 6})}, {"key2", at::randn({4, 5, 10})},
                      {"key3", Dict{{"key4", at::randn({4, 5, 10})}}}},
                 {4, 5});
  TensorDict td2(Dict{{"key1", at::randn({4, 10, 6})}, {"key2", at::randn({4, 10, 10})},
                      {"key3", Dict{{"key4", at::randn({4, 10, 10})}}}},
                 {4, 10});
  TensorDict td_cat = tensordict::cat({td1, td2}, 1);
  BOOST_TEST(td_cat.batch_size() == BatchSize({4, 15}));
  BOOST_TEST(td_cat.get({"key3", "key4"}).equal(at::cat({td1.get({"key3", "key4"}), td2.get({"key3", "key4"})}, 1)));
  TensorDict td_out(Dict{{"key1", at::zeros({4, 15, 6})}, {"key2", at::zeros({4, 15, 10})},
                         {"key3", Dict{{"key4", at::zeros({4, 15, 10})}}}},
                    {4, 15});
  auto before = ptrs(td_out);
  TensorDict r = tensordict::cat({td1, td2}, 1, td_out);
  BOOST_TEST(r.is_same(td_out));
  BOOST_TEST(ptrs(td_out) == before);
  BOOST_TEST(td_out.batch_size() == BatchSize({4, 15}));
  BOOST_TEST((td_out.get("key1") != 0).all().item<bool>());
  BOOST_TEST((td_out.get({"key3", "key4"}) != 0).all().item<bool>());
  zoo::check_equal(td_out, td_cat);
  // out with the wrong batch
  TensorDict bad(Dict{{"key1", at::zeros({4, 14, 6})}}, {4, 14});
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::cat({td1, td2}, 1, bad); },
                                         {"out.batch_size", "torch.Size([4, 14])", "torch.Size([4, 15])"}));
}

BOOST_AUTO_TEST_CASE(cat_errors) {
  TensorDict a = two_level({3, 2}, 1);
  // upstream: RuntimeError for an empty list and a dim out of range
  BOOST_TEST(throws_with<RuntimeError>([] { tensordict::cat({}, 0); }, {"empty"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::cat({a, a}, 2); }, {"cat", "[-2, 1]", "got 2"}));
  BOOST_CHECK_THROW(tensordict::cat({a, a}, -3), RuntimeError);
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::cat({scalar, scalar}, 0); }, {"no batch dimension"}));
  // the other batch dims must match
  BOOST_TEST(throws_with<BatchSizeError>([&] { tensordict::cat({a, two_level({3, 3}, 2)}, 0); },
                                         {"torch.Size([3, 3])", "torch.Size([3, 2])"}));
  BOOST_TEST(tensordict::cat({a, two_level({5, 2}, 2)}, 0).batch_size() == BatchSize({8, 2}));
  BOOST_CHECK_THROW(tensordict::cat({a, zoo::plain({3})}, 0), BatchSizeError);
  // strict keys
  TensorDict b = a.clone();
  b.del("b");
  BOOST_TEST(throws_with<KeyError>([&] { tensordict::cat({a, b}, 0); }, {"incompatible", "'b'"}));
  // feature shapes must match, named by key
  TensorDict f = a.clone();
  f.set({"nested", "x"}, at::zeros({3, 2, 2, 4}));
  BOOST_TEST(throws_with<RuntimeError>([&] { tensordict::cat({a, f}, 0); }, {"x", "incompatible"}));
  // out: missing key, wrong shape
  TensorDict good = tensordict::cat({a, a}, 1);
  TensorDict o = zeros_like(good);
  o.del("a");
  BOOST_CHECK_THROW(tensordict::cat({a, a}, 1, o), KeyError);
  TensorDict o2 = zeros_like(good);
  o2.set("a", at::zeros({3, 4, 6}));
  BOOST_CHECK_THROW(tensordict::cat({a, a}, 1, o2), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(cat_non_tensor) {
  TensorDict a(Dict{{"x", at::zeros({2})}}, {2});
  TensorDict b(Dict{{"x", at::ones({1})}}, {1});
  a.set("s", "left");
  b.set("s", "right");
  TensorDict c = tensordict::cat({a, b}, 0);
  using A = JsonValue::Array;
  BOOST_TEST(c.get_non_tensor("s") == JsonValue(A{"left", "left", "right"}));
  TensorDict cc = tensordict::cat({c, a}, 0);
  BOOST_TEST(cc.get_non_tensor("s") == JsonValue(A{"left", "left", "right", "left", "left"}));
}

// ---------------------------------------------------------------------------- *_like
BOOST_AUTO_TEST_CASE(like_functions) {
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      TensorDict z = zeros_like(td);
      TensorDict o = ones_like(td);
      TensorDict e = empty_like(td);
      zoo::check_leafwise(td, z, td.batch_size(), [](const at::Tensor& t) { return at::zeros_like(t); });
      zoo::check_leafwise(td, o, td.batch_size(), [](const at::Tensor& t) { return at::ones_like(t); });
      auto el = zoo::leaves(e);
      auto tl = zoo::leaves(td);
      BOOST_REQUIRE_EQUAL(el.size(), tl.size());
      for (size_t i = 0; i < el.size(); ++i) {
        BOOST_TEST(el[i].second.sizes() == tl[i].second.sizes());
        BOOST_TEST(el[i].second.dtype() == tl[i].second.dtype());
        BOOST_TEST(!el[i].second.is_alias_of(tl[i].second));
        BOOST_TEST(!zoo::leaves(z)[i].second.is_alias_of(tl[i].second));
      }
      if (td.contains("data")) BOOST_TEST(z.get_non_tensor("data") == JsonValue("a string"));
      BOOST_TEST(!z.is_locked());
    }
  }
  TensorDict td = two_level({3}, 1);
  td.lock_();
  BOOST_TEST(zeros_like(td).is_locked());
  BOOST_TEST(ones_like(td).get_td("nested").is_locked());
  BOOST_TEST(empty_like(td).is_locked());
  BOOST_TEST(zeros_like(td).get("c").dtype() == at::kLong);
}

BOOST_AUTO_TEST_SUITE_END()
