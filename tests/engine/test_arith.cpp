// Arithmetic, comparisons, all/any, sum/mean, equal(): over the zoo against the same op on the dense
// leaves (upstream TestPointwiseOps::test_add / test_add_default / test_broadcast_tensor, test_equal*),
// plus error paths.
#include <boost/test/unit_test.hpp>

#include <map>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;

namespace {

using Dense = std::function<at::Tensor(const std::string& key, const at::Tensor&)>;

//! every tensor leaf of `got` equals fn(key, the same leaf of `src`)
void check_leafwise(const TensorDict& got, const TensorDict& src, const Dense& fn, const std::string& ctx) {
  BOOST_TEST_CONTEXT(ctx) {
    auto g = zoo::leaves(got);
    auto s = zoo::leaves(src);
    BOOST_REQUIRE_EQUAL(g.size(), s.size());
    for (size_t i = 0; i < g.size(); ++i) {
      BOOST_TEST(g[i].first == s[i].first);
      at::Tensor want = fn(s[i].first, s[i].second);
      BOOST_TEST(g[i].second.sizes() == want.sizes(), "leaf " << g[i].first);
      BOOST_TEST(g[i].second.scalar_type() == want.scalar_type(), "leaf " << g[i].first);
      BOOST_TEST(at::equal(g[i].second, want), "leaf " << g[i].first << " differs");
    }
  }
}

std::string msg(const std::exception& e) { return e.what(); }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using zoo::ptrs;

//! upstream's dummy_td_0: {"a": zeros(3, 4), "b": {"c": zeros(3, 5, int)}}, batch []
TensorDict dummy(double v) {
  return TensorDict(Dict{{"a", at::full({3, 4}, v)}, {"b", Dict{{"c", at::full({3, 5}, v, at::kInt)}}}}, {});
}

TensorDict abc(std::vector<std::string> keys, int64_t v) {
  Dict d;
  for (auto& k : keys) d.emplace_back(k, at::full({}, v));
  return TensorDict(d, {});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(arith)

BOOST_AUTO_TEST_CASE(scalar_ops_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    check_leafwise(td.add(2), td, [](auto&, const at::Tensor& x) { return x + 2; }, kind.name + " add");
    check_leafwise(td.sub(2.5), td, [](auto&, const at::Tensor& x) { return x - 2.5; }, kind.name + " sub");
    check_leafwise(td.mul(3), td, [](auto&, const at::Tensor& x) { return x * 3; }, kind.name + " mul");
    check_leafwise(td.div(4), td, [](auto&, const at::Tensor& x) { return x / 4; }, kind.name + " div");
    check_leafwise(td + 1, td, [](auto&, const at::Tensor& x) { return x + 1; }, kind.name + " +");
    check_leafwise(td - 1, td, [](auto&, const at::Tensor& x) { return x - 1; }, kind.name + " -");
    check_leafwise(td * 2, td, [](auto&, const at::Tensor& x) { return x * 2; }, kind.name + " *");
    check_leafwise(td / 2, td, [](auto&, const at::Tensor& x) { return x / 2; }, kind.name + " /");
    TensorDict r = td + 1;
    BOOST_TEST(r.batch_size() == td.batch_size());
    if (td.contains("data")) BOOST_TEST(r.get_non_tensor("data") == JsonValue("a string"));
    // a 0-dim tensor behaves like a scalar
    check_leafwise(td * at::full({}, 3.0), td, [](auto&, const at::Tensor& x) { return x * at::full({}, 3.0); },
                   kind.name + " * 0-dim");
  }
}

BOOST_AUTO_TEST_CASE(td_ops_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict other = td.apply([](const at::Tensor& x) { return x * 2 + 1; });
    auto o = [&](const std::string& k) {
      for (auto& kv : zoo::leaves(other))
        if (kv.first == k) return kv.second;
      return at::Tensor();
    };
    check_leafwise(td.add(other), td, [&](auto& k, const at::Tensor& x) { return x + o(k); }, kind.name + " add");
    check_leafwise(td - other, td, [&](auto& k, const at::Tensor& x) { return x - o(k); }, kind.name + " sub");
    check_leafwise(td * other, td, [&](auto& k, const at::Tensor& x) { return x * o(k); }, kind.name + " mul");
    check_leafwise(td / other, td, [&](auto& k, const at::Tensor& x) { return x / o(k); }, kind.name + " div");
    if (td.contains("data")) BOOST_TEST((td + other).get_non_tensor("data") == JsonValue("a string"));
  }
}

BOOST_AUTO_TEST_CASE(ordering_of_keys_does_not_matter) {  // upstream test_ordering
  TensorDict x0(Dict{{"y", at::zeros({3})}, {"x", at::ones({3})}}, {});
  TensorDict x1(Dict{{"x", at::ones({3})}, {"y", at::zeros({3})}}, {});
  BOOST_TEST(((x0 + x1).get("x") == 2).all().item<bool>());
  BOOST_TEST(((x0 * x1).get("x") == 1).all().item<bool>());
  BOOST_TEST(((x0 - x1).get("x") == 0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(lock_propagates) {  // upstream test_add / test_mul / test_div (locked)
  for (bool locked : {true, false}) {
    TensorDict td = dummy(0);
    TensorDict other = dummy(1);
    if (locked) {
      td.lock_();
      other.lock_();
    }
    BOOST_TEST(td.add(1).eq(1).all());
    BOOST_TEST(td.add(other).eq(1).all());
    TensorDict r = td + other;
    BOOST_TEST(r.is_locked() == locked);
    BOOST_TEST(r.eq(1).all());
    BOOST_TEST((td * 0).is_locked() == locked);
    BOOST_TEST((td / other).is_locked() == locked);
    BOOST_TEST((td + at::ones({})).is_locked() == locked);
    BOOST_TEST((td - at::ones({3})).is_locked() == locked);
    BOOST_TEST(dummy(2).div(2).eq(1).all());
    // comparisons and reductions give fresh, unlocked TensorDicts
    BOOST_TEST(!td.eq(other).is_locked());
    BOOST_TEST(!td.eq(0).is_locked());
  }
}

BOOST_AUTO_TEST_CASE(key_mismatch_is_key_error) {  // upstream test_add_default (no default)
  TensorDict td0 = abc({"a", "b", "c"}, 1);
  TensorDict td1 = abc({"b", "c", "d"}, 2);
  BOOST_CHECK_EXCEPTION(td0.add(td1), KeyError, [](const KeyError& e) {
    return has(msg(e), "keys only in self: ['a']") && has(msg(e), "keys only in other: ['d']");
  });
  BOOST_CHECK_THROW(td0.exclude({"a"}).add(td1), KeyError);
  BOOST_CHECK_THROW(td0.add(td1.exclude({"d"})), KeyError);
  BOOST_CHECK_THROW(td0.sub(td1), KeyError);
  BOOST_CHECK_THROW(td0 * td1, KeyError);
  BOOST_CHECK_THROW(td0 / td1, KeyError);
  BOOST_CHECK_THROW(td0.add_(td1), KeyError);
  // a tensor in one and a sub-TensorDict in the other
  TensorDict n0(Dict{{"a", at::zeros({2})}}, {});
  TensorDict n1(Dict{{"a", Dict{{"x", at::zeros({2})}}}}, {});
  BOOST_CHECK_EXCEPTION(n0 + n1, KeyError, [](const KeyError& e) { return has(msg(e), "('a', 'x')"); });
  // non-tensor leaves are not compared: they are carried from self
  TensorDict s0 = abc({"a"}, 1);
  s0.set("s", "a string");
  TensorDict s1 = abc({"a"}, 2);
  TensorDict r = s0 + s1;
  BOOST_TEST(r.get_non_tensor("s") == JsonValue("a string"));
  BOOST_TEST(r.get("a").item<int64_t>() == 3);
  BOOST_CHECK_THROW(s0.add(TensorDict::undefined()), ValueError);
}

BOOST_AUTO_TEST_CASE(broadcast_tensor) {  // upstream test_broadcast_tensor
  for (BatchSize shape : {BatchSize{4}, BatchSize{3, 4}, BatchSize{2, 3, 4}}) {
    auto gen = at::detail::createCPUGenerator(0);
    TensorDict td(Dict{{"a", at::randn({3, 4}, gen)}, {"b", at::zeros({3, 4, 5})}, {"c", at::ones({3, 4, 5, 6})}},
                  {3, 4});
    BatchSize want = shape.size() == 3 ? BatchSize{2, 3, 4} : BatchSize{3, 4};
    at::Tensor ones = at::ones(shape);
    TensorDict m = td * ones;
    BOOST_TEST(m.batch_size() == want);
    TensorDict a = td + ones;
    BOOST_TEST(a.batch_size() == want);
    TensorDict s = td - ones;
    TensorDict d = td / ones;
    for (auto& kv : zoo::leaves(td)) {
      std::vector<int64_t> full = want;
      for (int64_t i = 2; i < kv.second.dim(); ++i) full.push_back(kv.second.size(i));
      at::Tensor x = kv.second.expand(full);
      BOOST_TEST(m.get(kv.first).equal(x), kv.first);
      BOOST_TEST(a.get(kv.first).equal(x + 1), kv.first);
      BOOST_TEST(s.get(kv.first).equal(x - 1), kv.first);
      BOOST_TEST(d.get(kv.first).equal(x), kv.first);
    }
  }
  // a tensor varying along the batch dims: values go to the right rows of every leaf
  TensorDict td(Dict{{"a", at::zeros({2, 3})}, {"b", at::zeros({2, 3, 4})}, {"n", Dict{{"c", at::zeros({2, 3, 5, 6})}}}},
                {2, 3});
  td.get_td("n").set_batch_size({2, 3, 5});
  at::Tensor t = at::arange(6, at::kFloat).view({2, 3});
  TensorDict r = td + t;
  BOOST_TEST(r.get("a").equal(t));
  BOOST_TEST(r.get("b").equal(t.unsqueeze(-1).expand({2, 3, 4})));
  BOOST_TEST(r.get({"n", "c"}).equal(t.view({2, 3, 1, 1}).expand({2, 3, 5, 6})));
  BOOST_TEST(r.get_td("n").batch_size() == BatchSize({2, 3, 5}));
  // a row vector broadcasts over the last batch dim
  BOOST_TEST((td + at::arange(3, at::kFloat)).get("b").select(1, 2).eq(2).all().item<bool>());
  // new leading dims: the batch (and the nested batch, and non-tensors) grow on the left
  td.set("s", "txt");
  TensorDict g = td * at::ones({7, 1, 3});
  BOOST_TEST(g.batch_size() == BatchSize({7, 2, 3}));
  BOOST_TEST(g.get_td("n").batch_size() == BatchSize({7, 2, 3, 5}));
  BOOST_TEST(g.get_entry("s").shape() == BatchSize({7, 2, 3}));
  BOOST_TEST(g.get({"n", "c"}).sizes() == at::IntArrayRef({7, 2, 3, 5, 6}));
  // incompatible shapes
  BOOST_CHECK_EXCEPTION(td + at::ones({5}), BatchSizeError, [](const BatchSizeError& e) {
    return has(msg(e), "torch.Size([5])") && has(msg(e), "torch.Size([2, 3])");
  });
  BOOST_CHECK_THROW(td * at::ones({2}), BatchSizeError);  // aligned on the right: 2 vs 3
  BOOST_CHECK_THROW(td.div(at::Tensor()), ValueError);
}

BOOST_AUTO_TEST_CASE(td_batch_broadcast) {
  TensorDict a(Dict{{"x", at::ones({2, 3, 4})}}, {2, 3});
  TensorDict b(Dict{{"x", at::full({3, 4}, 2.0)}}, {3});
  TensorDict r = a * b;
  BOOST_TEST(r.batch_size() == BatchSize({2, 3}));
  BOOST_TEST(r.get("x").equal(at::full({2, 3, 4}, 2.0)));
  TensorDict c(Dict{{"x", at::ones({4, 4})}}, {4});
  BOOST_CHECK_THROW(a + c, BatchSizeError);
  // in place: the other's batch must broadcast to self's
  a.add_(b);
  BOOST_TEST(a.get("x").equal(at::full({2, 3, 4}, 3.0)));
  BOOST_CHECK_THROW(b.add_(a), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(inplace_over_zoo) {  // upstream test_add_ / test_mul_
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict ref = td.clone();
    if (!kind.writable) {
      BOOST_CHECK_THROW(td.add_(1), RuntimeError);
      BOOST_CHECK_THROW(td.mul_(2), RuntimeError);
      BOOST_TEST(td.equal(ref), kind.name << ": nothing written");
      continue;
    }
    auto before = ptrs(td);
    td.lock_();  // in-place arithmetic is allowed on locked TensorDicts
    BOOST_TEST(td.add_(1).is_same(td));
    check_leafwise(td, ref, [](auto&, const at::Tensor& x) { return x + 1; }, kind.name + " add_");
    BOOST_TEST(td.mul_(3).is_same(td));
    check_leafwise(td, ref, [](auto&, const at::Tensor& x) { return (x + 1) * 3; }, kind.name + " mul_");
    BOOST_TEST(td.add_(ref).is_same(td));
    check_leafwise(td, ref, [](auto&, const at::Tensor& x) { return (x + 1) * 3 + x; }, kind.name + " add_(td)");
    BOOST_TEST(ptrs(td) == before);
    if (td.contains("data")) BOOST_TEST(td.get_non_tensor("data") == JsonValue("a string"));
  }
}

BOOST_AUTO_TEST_CASE(inplace_errors_write_nothing) {
  TensorDict td(Dict{{"f", at::zeros({3})}, {"i", at::zeros({3}, at::kLong)}, {"b", at::zeros({3}, at::kBool)}}, {3});
  TensorDict before = td.clone();
  BOOST_CHECK_EXCEPTION(td.add_(0.5), RuntimeError, [](const RuntimeError& e) {
    return has(msg(e), "torch.float32") && has(msg(e), "torch.int64") && has(msg(e), "'i'");
  });
  BOOST_CHECK_THROW(td.mul_(1.5), RuntimeError);
  BOOST_TEST(td.equal(before));
  TensorDict ints = td.select({"i"}).clone();
  ints.add_(2);
  BOOST_TEST(ints.get("i").equal(at::full({3}, 2, at::kLong)));
  TensorDict other = td.apply([](const at::Tensor& x) { return x.to(at::kFloat); });
  BOOST_CHECK_THROW(td.add_(other), RuntimeError);  // float into int64/bool leaves
  BOOST_TEST(td.equal(before));
  // a leaf that would have to grow
  TensorDict small(Dict{{"f", at::zeros({3})}}, {3});
  TensorDict wide(Dict{{"f", at::zeros({3, 2})}}, {3});
  BOOST_CHECK_THROW(small.add_(wide), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(comparisons_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict other = td.apply([](const at::Tensor& x) { return x.flip(0); });
    auto o = [&](const std::string& k) {
      for (auto& kv : zoo::leaves(other))
        if (kv.first == k) return kv.second;
      return at::Tensor();
    };
    // eq / ne turn a non-tensor leaf into a bool tensor leaf (checked below): compare the others here
    auto strip = [&](const TensorDict& r) { return td.contains("data") ? r.exclude({"data"}) : r; };
    check_leafwise(strip(td.eq(other)), td, [&](auto& k, const at::Tensor& x) { return x == o(k); }, kind.name + " eq");
    check_leafwise(strip(td.ne(other)), td, [&](auto& k, const at::Tensor& x) { return x != o(k); }, kind.name + " ne");
    check_leafwise(td.lt(other), td, [&](auto& k, const at::Tensor& x) { return x < o(k); }, kind.name + " lt");
    check_leafwise(td.le(other), td, [&](auto& k, const at::Tensor& x) { return x <= o(k); }, kind.name + " le");
    check_leafwise(td.gt(other), td, [&](auto& k, const at::Tensor& x) { return x > o(k); }, kind.name + " gt");
    check_leafwise(td.ge(other), td, [&](auto& k, const at::Tensor& x) { return x >= o(k); }, kind.name + " ge");
    check_leafwise(strip(td == other), td, [&](auto& k, const at::Tensor& x) { return x == o(k); }, kind.name + " ==");
    check_leafwise(strip(td != other), td, [&](auto& k, const at::Tensor& x) { return x != o(k); }, kind.name + " !=");
    check_leafwise(td.eq(0), td, [](auto&, const at::Tensor& x) { return x == 0; }, kind.name + " eq 0");
    check_leafwise(td.ne(0), td, [](auto&, const at::Tensor& x) { return x != 0; }, kind.name + " ne 0");
    check_leafwise(td.lt(0.5), td, [](auto&, const at::Tensor& x) { return x < 0.5; }, kind.name + " lt");
    check_leafwise(td.le(0), td, [](auto&, const at::Tensor& x) { return x <= 0; }, kind.name + " le");
    check_leafwise(td.gt(0), td, [](auto&, const at::Tensor& x) { return x > 0; }, kind.name + " gt");
    check_leafwise(td.ge(-0.5), td, [](auto&, const at::Tensor& x) { return x >= -0.5; }, kind.name + " ge");
    TensorDict self_eq = td == td;
    BOOST_TEST(self_eq.all(), kind.name);
    BOOST_TEST(!(td != td).any(), kind.name);
    BOOST_TEST(self_eq.batch_size() == td.batch_size());
    if (td.contains("data")) {
      // eq / ne between TensorDicts compare non-tensor values (a bool tensor of the batch shape)
      BOOST_TEST(self_eq.get("data").equal(at::ones(td.batch_size(), at::kBool)), kind.name);
      BOOST_TEST(!td.lt(td).contains("data"));  // ordering of non-tensors: left out
      BOOST_TEST(!td.eq(0).contains("data"));   // scalar comparisons: left out
    }
  }
}

BOOST_AUTO_TEST_CASE(comparison_errors_and_non_tensors) {  // upstream test_equal*
  TensorDict td0 = abc({"a", "b"}, 1);
  BOOST_CHECK_EXCEPTION(td0 == abc({"a", "c"}, 1), KeyError, [](const KeyError& e) {
    return has(msg(e), "keys in tensordicts mismatch") && has(msg(e), "{'a', 'b'}") && has(msg(e), "{'a', 'c'}");
  });
  BOOST_CHECK_THROW(td0.lt(abc({"a"}, 1)), KeyError);
  TensorDict n0(Dict{{"a", Dict{{"x", at::zeros({2})}}}}, {});
  TensorDict n1(Dict{{"a", Dict{{"y", at::zeros({2})}}}}, {});
  BOOST_CHECK_EXCEPTION(n0 != n1, KeyError, [](const KeyError& e) { return has(msg(e), "at 'a'"); });
  TensorDict k1(Dict{{"a", at::zeros({2})}}, {});
  BOOST_CHECK_EXCEPTION(n0.eq(k1), TypeError, [](const TypeError& e) { return has(msg(e), "'a'"); });
  BOOST_CHECK_THROW(td0.ge(TensorDict::undefined()), ValueError);
  // tensor shapes that do not broadcast
  TensorDict s1(Dict{{"a", at::zeros({2})}}, {});
  TensorDict s2(Dict{{"a", at::zeros({3})}}, {});
  BOOST_CHECK_THROW(s1.eq(s2), RuntimeError);
  // non-tensor values
  TensorDict t1({}, {2});
  t1.set("s", "x");
  t1.set("st", NonTensorStack({JsonValue("p"), JsonValue("q")}, {2}));
  TensorDict t2({}, {2});
  t2.set("s", "y");
  t2.set("st", NonTensorStack({JsonValue("p"), JsonValue("z")}, {2}));
  TensorDict e = t1 == t2;
  BOOST_TEST(e.get("s").equal(at::zeros({2}, at::kBool)));
  BOOST_TEST(e.get("st").equal(at::tensor({1, 0}).to(at::kBool)));
  BOOST_TEST((t1 != t2).get("st").equal(at::tensor({0, 1}).to(at::kBool)));
  t2.set("st", "p");  // a NonTensorData against a NonTensorStack: element by element
  BOOST_TEST((t1 == t2).get("st").equal(at::tensor({1, 0}).to(at::kBool)));
  BOOST_TEST(t1.lt(t2).keys().empty());
}

BOOST_AUTO_TEST_CASE(all_any) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict ones = td.apply([](const at::Tensor& x) { return at::ones_like(x); });
    BOOST_TEST(ones.all(), kind.name);
    BOOST_TEST(ones.any(), kind.name);
    TensorDict zeros = td.apply([](const at::Tensor& x) { return at::zeros_like(x); });
    BOOST_TEST(!zeros.all(), kind.name);
    BOOST_TEST(!zeros.any(), kind.name);
    // one non-zero element somewhere deep
    TensorDict one = zeros.clone();
    at::Tensor last = zoo::leaves(one).back().second;
    last.index_put_(std::vector<at::indexing::TensorIndex>(static_cast<size_t>(last.dim()), 0), 1);
    BOOST_TEST(one.any(), kind.name);
    BOOST_TEST(!one.all(), kind.name);
  }
  BOOST_TEST(TensorDict().all());  // Python all([]) / any([])
  BOOST_TEST(!TensorDict().any());
  TensorDict only_text({}, {2});
  only_text.set("s", "x");
  BOOST_TEST(only_text.all());
  BOOST_TEST(!only_text.any());
  // leaves without data (meta) cannot be read: a typed error naming the key
  TensorDict meta = TensorDict(Dict{{"m", at::ones({2})}}, {2}).to(at::Device(at::kMeta));
  BOOST_CHECK_EXCEPTION(meta.all(), RuntimeError, [](const RuntimeError& e) { return has(msg(e), "'m'"); });
}

BOOST_AUTO_TEST_CASE(all_any_dim) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make().gt(0);
    for (int64_t dim : {0, 1, -1, -4}) {
      TensorDict a = td.all(dim);
      TensorDict y = td.any(dim);
      BatchSize want = td.batch_size();
      want.erase(want.begin() + (dim < 0 ? dim + 4 : dim));
      BOOST_TEST(a.batch_size() == want, kind.name);
      check_leafwise(a, td, [&](auto&, const at::Tensor& x) { return x.all(dim < 0 ? dim + 4 : dim); }, kind.name);
      check_leafwise(y, td, [&](auto&, const at::Tensor& x) { return x.any(dim < 0 ? dim + 4 : dim); }, kind.name);
      if (td.contains("nested")) {
        BatchSize nb = want;
        nb.push_back(2);
        BOOST_TEST(a.get_td("nested").batch_size() == nb);
      }
    }
    // upstream raises RuntimeError for a dim out of range in all / any
    BOOST_CHECK_EXCEPTION(td.all(4), RuntimeError, [](const RuntimeError& e) { return has(msg(e), "dim=4"); });
    BOOST_CHECK_THROW(td.any(-5), RuntimeError);
  }
  BOOST_CHECK_THROW(TensorDict(Dict{{"a", at::ones({2})}}, {}).all(0), RuntimeError);
}

BOOST_AUTO_TEST_CASE(sum_mean_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    // no dim (upstream v0.14): each leaf reduced over every one of its dims, batch []
    auto every = [](const at::Tensor& x) {
      std::vector<int64_t> d(static_cast<size_t>(x.dim()));
      for (int64_t i = 0; i < x.dim(); ++i) d[static_cast<size_t>(i)] = i;
      return d;
    };
    TensorDict s = td.sum();
    BOOST_TEST(s.batch_size().empty(), kind.name);
    check_leafwise(s, td, [&](auto&, const at::Tensor& x) { return x.sum(every(x)); }, kind.name + " sum");
    BOOST_CHECK_THROW(td.mean(), RuntimeError);  // integer leaves: torch.mean refuses them
    TensorDict f = td.to(at::kFloat);
    TensorDict m = f.mean();
    check_leafwise(m, f, [&](auto&, const at::Tensor& x) { return x.mean(every(x)); }, kind.name + " mean");
    TensorDict sk = td.sum(std::nullopt, true);
    BOOST_TEST(sk.batch_size() == BatchSize({1, 1, 1, 1}), kind.name);
    check_leafwise(sk, td, [&](auto&, const at::Tensor& x) { return x.sum(every(x), true); }, kind.name);
    // one batch dim
    for (int64_t dim : {0, 2, -1}) {
      int64_t d = dim < 0 ? dim + 4 : dim;
      TensorDict sd = td.sum(dim);
      BatchSize want = td.batch_size();
      want.erase(want.begin() + d);
      BOOST_TEST(sd.batch_size() == want, kind.name);
      check_leafwise(sd, td, [&](auto&, const at::Tensor& x) { return x.sum(d); }, kind.name + " sum(dim)");
      TensorDict md = f.mean(dim, true);
      want.insert(want.begin() + d, 1);
      BOOST_TEST(md.batch_size() == want, kind.name);
      check_leafwise(md, f, [&](auto&, const at::Tensor& x) { return x.mean(d, true); },
                     kind.name + " mean(dim, keepdim)");
      if (td.contains("nested")) {
        want.push_back(2);
        BOOST_TEST(md.get_td("nested").batch_size() == want, kind.name);
      }
      if (td.contains("data")) BOOST_TEST(md.get_non_tensor("data") == JsonValue("a string"));
    }
    BOOST_CHECK_THROW(td.sum(4), IndexError);
    BOOST_CHECK_THROW(td.mean(-5), IndexError);
  }
}

BOOST_AUTO_TEST_CASE(sum_mean_edge_cases) {
  // no batch dims: every dim of each leaf is still reduced (sum promotes integers to int64; mean refuses them)
  TensorDict s(Dict{{"i", at::arange(4, at::kInt)}, {"f", at::ones({2})}}, {});
  TensorDict r = s.sum();
  BOOST_TEST(r.get("i").equal(at::scalar_tensor(6, at::kLong)));
  BOOST_TEST(r.get("f").equal(at::scalar_tensor(2.0)));
  BOOST_CHECK_THROW(s.mean(), RuntimeError);
  BOOST_TEST(s.select({"f"}).mean().get("f").equal(at::scalar_tensor(1.0)));
  BOOST_CHECK_THROW(s.sum(0), IndexError);
  // bool leaves sum to counts; torch.mean refuses them
  TensorDict b(Dict{{"m", at::tensor({1, 1, 0}).to(at::kBool)}}, {3});
  BOOST_TEST(b.sum().get("m").item<int64_t>() == 2);
  BOOST_CHECK_THROW(b.mean(), RuntimeError);
  // non-tensor leaves: one value for the whole batch is kept, per-element values are dropped
  TensorDict t(Dict{{"x", at::ones({2, 3})}}, {2});
  t.set("same", NonTensorStack::filled(JsonValue(1), {2}));
  t.set("diff", NonTensorStack({JsonValue(1), JsonValue(2)}, {2}));
  t.set("data", "txt");
  TensorDict tr = t.sum();
  BOOST_TEST(tr.get_non_tensor("same") == JsonValue(1));
  BOOST_TEST(tr.get_non_tensor("data") == JsonValue("txt"));
  BOOST_TEST(!tr.contains("diff"));
  BOOST_TEST(tr.get("x").equal(at::scalar_tensor(6.0)));
}

BOOST_AUTO_TEST_CASE(equal) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    BOOST_TEST(td.equal(td), kind.name);
    BOOST_TEST(td.equal(td.clone()), kind.name);
    BOOST_TEST(!td.equal(td + 1), kind.name);
    BOOST_TEST(!td.equal(td.exclude({"a"})), kind.name);
    BOOST_TEST(!td.equal(td.apply([](const at::Tensor& x) { return x.to(at::kDouble); })), kind.name);
  }
  TensorDict a(Dict{{"x", at::zeros({2, 3})}}, {2});
  TensorDict b(Dict{{"x", at::zeros({2, 3})}}, {2, 3});
  BOOST_TEST(!a.equal(b));  // batch sizes differ
  TensorDict c = a.clone();
  c.set("s", "p");
  TensorDict d = a.clone();
  d.set("s", "q");
  BOOST_TEST(!c.equal(d));
  d.set("s", NonTensorStack::filled(JsonValue("p"), {2}));
  BOOST_TEST(c.equal(d));  // same value at every position
  BOOST_TEST(!a.equal(TensorDict::undefined()));
}

BOOST_AUTO_TEST_SUITE_END()
