// apply / apply_ / named_apply, zero_, masked_fill(_), where: over the zoo against the same op on the
// dense leaves (upstream test_apply*, test_named_apply, test_masked_fill, test_where), plus error paths.
#include <boost/test/unit_test.hpp>

#include <map>
#include <set>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

//! every tensor leaf of `got` equals fn(the same leaf of `src`), same key set
void check_leafwise(const TensorDict& got, const TensorDict& src, const std::function<at::Tensor(const at::Tensor&)>& fn,
                    const std::string& ctx) {
  BOOST_TEST_CONTEXT(ctx) {
    auto g = zoo::leaves(got);
    auto s = zoo::leaves(src);
    BOOST_REQUIRE_EQUAL(g.size(), s.size());
    for (size_t i = 0; i < g.size(); ++i) {
      BOOST_TEST(g[i].first == s[i].first);
      at::Tensor want = fn(s[i].second);
      BOOST_TEST(g[i].second.sizes() == want.sizes(), "leaf " << g[i].first);
      BOOST_TEST(g[i].second.scalar_type() == want.scalar_type(), "leaf " << g[i].first);
      BOOST_TEST(at::equal(g[i].second, want), "leaf " << g[i].first << " differs");
    }
  }
}

std::string msg(const std::exception& e) { return e.what(); }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using zoo::ptrs;

TensorDict small() {
  return TensorDict(Dict{{"a", at::arange(6, at::kFloat).view({3, 2})},
                         {"sub", Dict{{"b", at::arange(3, at::kLong)}, {"deep", Dict{{"c", at::ones({3, 4})}}}}},
                         {"s", "text"}},
                    {3});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(apply)

BOOST_AUTO_TEST_CASE(apply_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    auto before = ptrs(td);
    TensorDict out = td.apply([](const at::Tensor& x) { return x + 1; });
    check_leafwise(out, td, [](const at::Tensor& x) { return x + 1; }, kind.name);
    BOOST_TEST(out.batch_size() == td.batch_size(), kind.name);
    BOOST_TEST(!out.is_same(td));
    BOOST_TEST(!out.is_locked());
    BOOST_TEST(ptrs(td) == before, kind.name << ": apply must not write into self");
    if (td.contains("data")) {
      BOOST_TEST(out.get_non_tensor("data") == JsonValue("a string"), kind.name);
      BOOST_TEST(out.get_entry("data").shape() == td.batch_size());
    }
    if (td.contains("nested")) BOOST_TEST(out.get_td("nested").batch_size() == td.get_td("nested").batch_size());
  }
}

BOOST_AUTO_TEST_CASE(apply_undefined_result_drops_key) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict out =
        td.apply([](const at::Tensor& x) { return x.scalar_type() == at::kLong ? at::Tensor() : x * 2; });
    BOOST_TEST(!out.contains("c"), kind.name);
    BOOST_TEST(out.contains("a"), kind.name);
    if (td.contains("nested")) {
      BOOST_TEST(!out.contains({"nested", "y"}), kind.name);
      BOOST_TEST(out.get({"nested", "x"}).equal(td.get({"nested", "x"}) * 2), kind.name);
    }
  }
}

BOOST_AUTO_TEST_CASE(apply_keep_empty) {
  TensorDict td = small();
  auto drop_all = [](const at::Tensor&) { return at::Tensor(); };
  TensorDict kept = td.apply(drop_all, ApplyOptions().keep_empty(true));
  BOOST_TEST(kept.contains({"sub", "deep"}));  // upstream filter_empty=False: empty sub-TDs stay
  BOOST_TEST(kept.get_td({"sub", "deep"}).keys().empty());
  BOOST_TEST(kept.get_non_tensor("s") == JsonValue("text"));
  TensorDict filtered = td.apply(drop_all);  // upstream's default (v0.14) filters them
  BOOST_TEST(!filtered.contains("sub"));  // filter_empty=True drops the now-empty sub-TDs
  BOOST_TEST(filtered.contains("s"));      // non-tensor leaves are carried
  // an empty top level is still a TensorDict
  TensorDict empty = TensorDict({}, {3}).apply(drop_all, ApplyOptions().keep_empty(false));
  BOOST_TEST(empty.batch_size() == BatchSize({3}));
}

BOOST_AUTO_TEST_CASE(apply_batch_size_option) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict out = td.apply([](const at::Tensor& x) { return x.flatten(0, 1); },
                              ApplyOptions().batch_size(BatchSize{12, 2, 1}));
    BOOST_TEST(out.batch_size() == BatchSize({12, 2, 1}), kind.name);
    check_leafwise(out, td, [](const at::Tensor& x) { return x.flatten(0, 1); }, kind.name);
    // upstream passes batch_size down: the nested result gets the same batch size
    if (td.contains("nested")) BOOST_TEST(out.get_td("nested").batch_size() == BatchSize({12, 2, 1}), kind.name);
    if (td.contains("data")) BOOST_TEST(out.get_entry("data").shape() == BatchSize({12, 2, 1}), kind.name);
  }
  // results that do not fit the requested batch size
  TensorDict td = small();
  BOOST_CHECK_EXCEPTION(td.apply([](const at::Tensor& x) { return x; }, ApplyOptions().batch_size(BatchSize{5})),
                        BatchSizeError, [](const BatchSizeError& e) {
                          return has(msg(e), "'a'") && has(msg(e), "batch dimension mismatch");
                        });
  BOOST_CHECK_THROW(td.apply([](const at::Tensor& x) { return x; }, ApplyOptions().batch_size(BatchSize{-3})),
                    BatchSizeError);
  // a NonTensorStack holding different values cannot follow a batch change
  TensorDict st({}, {2});
  st.set("a", at::zeros({2, 3}));
  st.set("names", NonTensorStack({JsonValue("x"), JsonValue("y")}, {2}));
  BOOST_CHECK_THROW(st.apply([](const at::Tensor& x) { return x.select(0, 0); }, ApplyOptions().batch_size(BatchSize{})),
                    BatchSizeError);
  // ... but one holding a single value does
  st.set("names", NonTensorStack::filled(JsonValue("x"), {2}));
  TensorDict r = st.apply([](const at::Tensor& x) { return x.select(0, 0); }, ApplyOptions().batch_size(BatchSize{}));
  BOOST_TEST(r.get_non_tensor("names") == JsonValue("x"));
}

BOOST_AUTO_TEST_CASE(apply_with_others) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict other = td.apply([](const at::Tensor& x) { return x * 2; });
    TensorDict out = td.apply([](const std::vector<at::Tensor>& v) { return v[0] + v[1]; }, {other});
    check_leafwise(out, td, [](const at::Tensor& x) { return x + x * 2; }, kind.name);
    // two others, aligned by key (the insertion order of the others does not matter)
    TensorDict third(other.batch_size());
    auto items = other.items();
    for (auto it = items.rbegin(); it != items.rend(); ++it) third.set(it->first, it->second);
    BOOST_TEST(third.keys().front() != other.keys().front());
    TensorDict out3 = td.apply([](const std::vector<at::Tensor>& v) { return v[0] + (v[1] - v[2]); }, {other, third});
    check_leafwise(out3, td, [](const at::Tensor& x) { return x; }, kind.name + " (3 inputs)");
  }
}

BOOST_AUTO_TEST_CASE(apply_others_missing_key_and_default) {
  TensorDict td = small();
  TensorDict other = td.exclude({{"sub", "deep", "c"}});
  auto add = [](const std::vector<at::Tensor>& v) { return v[0] + v[1]; };
  BOOST_CHECK_EXCEPTION(td.apply(add, {other}), KeyError, [](const KeyError& e) {
    return has(msg(e), "('sub', 'deep', 'c')") && has(msg(e), "default_value");
  });
  TensorDict out = td.apply(add, {other}, ApplyOptions().default_value(at::full({}, 10.0)));
  BOOST_TEST(out.get({"sub", "deep", "c"}).equal(at::full({3, 4}, 11.0)));
  BOOST_TEST(out.get("a").equal(td.get("a") * 2));
  // a whole sub-TD missing in the other: every leaf below gets the default
  TensorDict no_sub = td.exclude({"sub"});
  BOOST_CHECK_THROW(td.apply(add, {no_sub}), KeyError);
  TensorDict out2 = td.apply(add, {no_sub}, ApplyOptions().default_value(at::ones({})));
  BOOST_TEST(out2.get({"sub", "b"}).equal(at::arange(3, at::kLong) + 1));
  // non-tensor keys must be in the others too (upstream looks every key up)
  BOOST_CHECK_THROW(td.apply(add, {td.exclude({"s"})}), KeyError);
  // keys only in the other are ignored
  TensorDict bigger = td.clone();
  bigger.set("extra", at::zeros({3}));
  BOOST_TEST(!td.apply(add, {bigger}).contains("extra"));
  // kind mismatches
  TensorDict swapped = td.clone();
  swapped.del("a");
  swapped.set("a", TensorDict({}, {3}));
  BOOST_CHECK_EXCEPTION(td.apply(add, {swapped}), TypeError,
                        [](const TypeError& e) { return has(msg(e), "'a'") && has(msg(e), "TensorDict"); });
  TensorDict flat_sub = td.clone();
  flat_sub.del("sub");
  flat_sub.set("sub", at::zeros({3}));
  BOOST_CHECK_THROW(td.apply(add, {flat_sub}), TypeError);
  // bad arguments
  BOOST_CHECK_THROW(td.apply(add, {TensorDict::undefined()}), ValueError);
  BOOST_CHECK_THROW(td.apply(add, {other}, ApplyOptions().default_value(at::Tensor())), ValueError);
  BOOST_CHECK_THROW(td.apply(LeafFn()), ValueError);
  BOOST_CHECK_THROW(td.apply(MultiLeafFn(), {other}), ValueError);
}

BOOST_AUTO_TEST_CASE(apply_fn_errors_are_typed) {
  TensorDict td = small();
  BOOST_CHECK_EXCEPTION(td.apply([](const at::Tensor& x) { return x.view({7, -1}); }), RuntimeError,
                        [](const RuntimeError& e) { return has(msg(e), "'a'"); });
  // a result that loses the batch dims
  BOOST_CHECK_EXCEPTION(td.apply([](const at::Tensor& x) { return x.sum(); }), BatchSizeError,
                        [](const BatchSizeError& e) { return has(msg(e), "'a'") && has(msg(e), "torch.Size([3])"); });
  // a result that cannot be moved to the TensorDict's device
  TensorDict on_cpu(Dict{{"a", at::zeros({2})}}, {2}, at::Device(at::kCPU));
  BOOST_CHECK_EXCEPTION(on_cpu.apply([](const at::Tensor& x) { return x.to(at::kMeta); }), RuntimeError,
                        [](const RuntimeError& e) { return has(msg(e), "'a'"); });
  // the library's own errors keep their type, foreign exceptions pass through untouched
  BOOST_CHECK_THROW(td.apply([](const at::Tensor&) -> at::Tensor { throw KeyError("mine"); }), KeyError);
  BOOST_CHECK_THROW(td.apply([](const at::Tensor&) -> at::Tensor { throw std::logic_error("user"); }),
                    std::logic_error);
}

BOOST_AUTO_TEST_CASE(apply_lock) {
  TensorDict td = small();
  td.lock_();
  TensorDict r = td.apply([](const at::Tensor& x) { return x.clone(); });
  BOOST_TEST(!r.is_locked());
  r.set("new", at::zeros({3}));  // an unlocked result accepts new keys
  TensorDict l = td.apply([](const at::Tensor& x) { return x.clone(); }, ApplyOptions().propagate_lock(true));
  BOOST_TEST(l.is_locked());
  BOOST_TEST(l.get_td("sub").is_locked());
  BOOST_CHECK_THROW(l.set("new", at::zeros({3})), LockedError);
  TensorDict u = small().apply([](const at::Tensor& x) { return x; }, ApplyOptions().propagate_lock(true));
  BOOST_TEST(!u.is_locked());
}

BOOST_AUTO_TEST_CASE(apply_device_result) {
  // leaves go to the result's device: to(device) of a TensorDict that has a device
  TensorDict td(Dict{{"a", at::ones({2, 3})}, {"sub", Dict{{"b", at::zeros({2})}}}}, {2}, at::Device(at::kCPU));
  TensorDict meta = td.to(at::Device(at::kMeta));
  BOOST_TEST((meta.device() == std::optional<at::Device>(at::Device(at::kMeta))));
  BOOST_TEST(meta.get("a").device().is_meta());
  BOOST_TEST(meta.get({"sub", "b"}).device().is_meta());
  BOOST_TEST(meta.get("a").sizes() == at::IntArrayRef({2, 3}));
}

BOOST_AUTO_TEST_CASE(apply_inplace_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    TensorDict td = kind.make();
    TensorDict ref = td.clone();
    auto before = ptrs(td);
    TensorDict& same = td.apply_([](const at::Tensor& x) { return x * 2; });
    BOOST_TEST(same.is_same(td));
    BOOST_TEST(ptrs(td) == before, kind.name << ": apply_ must write into the existing leaves");
    check_leafwise(td, ref, [](const at::Tensor& x) { return x * 2; }, kind.name);
    // with others (2x - x is exact in floating point)
    td.apply_([](const std::vector<at::Tensor>& v) { return v[0] - v[1]; }, {ref});
    check_leafwise(td, ref, [](const at::Tensor& x) { return x; }, kind.name + " (others)");
    // locked: in-place writes are allowed
    td.lock_();
    td.apply_([](const at::Tensor& x) { return at::zeros_like(x); });
    BOOST_TEST(!td.any(), kind.name);
    BOOST_TEST(ptrs(td) == before);
  }
}

BOOST_AUTO_TEST_CASE(apply_inplace_edge_cases) {
  TensorDict td = small();
  TensorDict ref = td.clone();
  // undefined result: the leaf stays as it is (upstream skips the write)
  td.apply_([](const at::Tensor& x) { return x.scalar_type() == at::kLong ? at::Tensor() : x + 1; });
  BOOST_TEST(td.get({"sub", "b"}).equal(ref.get({"sub", "b"})));
  BOOST_TEST(td.get("a").equal(ref.get("a") + 1));
  // fn writing in place and returning the leaf itself
  td.apply_([](const at::Tensor& x) { return at::Tensor(x).fill_(2); });
  BOOST_TEST(td.get("a").equal(at::full({3, 2}, 2.0)));
  // a result that does not fit: nothing is written at all
  TensorDict before = td.clone();
  BOOST_CHECK_EXCEPTION(td.apply_([](const at::Tensor& x) { return x.dim() == 2 && x.size(1) == 4 ? at::zeros({5}) : x + 1; }),
                        BatchSizeError, [](const BatchSizeError& e) { return has(msg(e), "('sub', 'deep', 'c')"); });
  BOOST_TEST(td.equal(before));
  // broadcastable results are copied (upstream copy_)
  td.apply_([](const at::Tensor& x) { return at::zeros({x.size(-1)}, x.options()); });
  BOOST_TEST(!td.any());
  // expanded leaves cannot be written: error, nothing written
  TensorDict ex = TensorDict(Dict{{"a", at::ones({1, 2})}, {"b", at::ones({3, 2})}}, {}).apply(
      [](const at::Tensor& x) { return x.expand({3, 2}); });
  ex.set("c", at::ones({3, 2}));
  BOOST_CHECK_EXCEPTION(ex.apply_([](const at::Tensor& x) { return x * 0; }), RuntimeError,
                        [](const RuntimeError& e) { return has(msg(e), "'a'") && has(msg(e), "expanded"); });
  BOOST_TEST(ex.get("c").equal(at::ones({3, 2})));
  // missing keys in the others
  BOOST_CHECK_THROW(td.apply_([](const std::vector<at::Tensor>& v) { return v[1]; }, {td.exclude({"a"})}), KeyError);
  BOOST_CHECK_THROW(td.apply_(LeafFn()), ValueError);
}

BOOST_AUTO_TEST_CASE(named_apply_keys) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    std::set<std::string> names, full;
    TensorDict out = td.named_apply([&](const NestedKey& k, const at::Tensor& x) {
      names.insert(k.join("."));
      return x;
    });
    td.named_apply(
        [&](const NestedKey& k, const at::Tensor& x) {
          full.insert(k.join("."));
          return x;
        },
        ApplyOptions().nested_keys(true));
    std::set<std::string> want_full, want_names;
    for (auto& kv : zoo::leaves(td)) {
      want_full.insert(kv.first);
      want_names.insert(kv.first.substr(kv.first.rfind('.') == std::string::npos ? 0 : kv.first.rfind('.') + 1));
    }
    BOOST_TEST(full == want_full, kind.name);
    BOOST_TEST(names == want_names, kind.name);
    zoo::check_equal(out, td, kind.name);
  }
  TensorDict td = small();
  TensorDict out = td.named_apply(
      [](const NestedKey& k, const at::Tensor& x) { return k == NestedKey({"sub", "b"}) ? at::Tensor() : x * 2; },
      ApplyOptions().nested_keys(true));
  BOOST_TEST(!out.contains({"sub", "b"}));
  BOOST_TEST(out.get({"sub", "deep", "c"}).equal(at::full({3, 4}, 2.0)));
  BOOST_TEST(out.get_non_tensor("s") == JsonValue("text"));
  BOOST_CHECK_THROW(td.named_apply(NamedLeafFn()), ValueError);
}

BOOST_AUTO_TEST_CASE(zero_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    if (!kind.writable) {
      TensorDict before = td.clone();
      BOOST_CHECK_THROW(td.zero_(), RuntimeError);
      BOOST_TEST(td.equal(before), kind.name << ": a failed zero_ writes nothing");
      continue;
    }
    auto before = ptrs(td);
    td.lock_();
    BOOST_TEST(td.zero_().is_same(td));
    BOOST_TEST(!td.any(), kind.name);
    BOOST_TEST(ptrs(td) == before);
    if (td.contains("data")) BOOST_TEST(td.get_non_tensor("data") == JsonValue("a string"));
  }
}

BOOST_AUTO_TEST_CASE(masked_fill_over_zoo) {
  auto gen = at::detail::createCPUGenerator(3);
  at::Tensor mask = at::rand({4, 3}, gen) > 0.5;  // over the two leading batch dims
  at::Tensor full_mask = at::rand({4, 3, 2, 1}, gen) > 0.5;
  for (const auto& kind : zoo::kinds()) {
    for (const at::Tensor& m : {mask, full_mask}) {
      TensorDict td = kind.make();
      TensorDict ref = td.clone();
      auto dense = [&](const at::Tensor& x) {
        std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
        shape.resize(static_cast<size_t>(x.dim()), 1);
        return x.masked_fill(m.view(shape), -1);
      };
      TensorDict out = td.masked_fill(m, -1);
      check_leafwise(out, ref, dense, kind.name);
      BOOST_TEST(td.equal(ref), kind.name << ": masked_fill leaves self alone");
      if (td.contains("data")) BOOST_TEST(out.get_non_tensor("data") == JsonValue("a string"));
      if (!kind.writable) continue;
      auto before = ptrs(td);
      td.lock_();
      BOOST_TEST(td.masked_fill_(m, -1).is_same(td));
      check_leafwise(td, ref, dense, kind.name + " in place");
      BOOST_TEST(ptrs(td) == before);
    }
  }
}

BOOST_AUTO_TEST_CASE(masked_fill_errors) {
  TensorDict td = zoo::plain({4, 3});
  TensorDict before = td.clone();
  BOOST_CHECK_EXCEPTION(td.masked_fill_(at::ones({4, 3}), 0), TypeError,
                        [](const TypeError& e) { return has(msg(e), "torch.float32") && has(msg(e), "boolean"); });
  BOOST_CHECK_EXCEPTION(td.masked_fill_(at::ones({4, 3, 5}, at::kBool), 0), BatchSizeError,
                        [](const BatchSizeError& e) { return has(msg(e), "torch.Size([4, 3, 5])") && has(msg(e), "torch.Size([4, 3])"); });
  BOOST_CHECK_EXCEPTION(td.masked_fill_(at::ones({3}, at::kBool), 0), BatchSizeError,
                        [](const BatchSizeError& e) { return has(msg(e), "dim 0 is 3, expected 4 or 1"); });
  BOOST_CHECK_THROW(td.masked_fill(at::ones({4, 2}, at::kBool), 0), BatchSizeError);
  BOOST_CHECK_THROW(td.masked_fill(at::Tensor(), 0), ValueError);
  BOOST_TEST(td.equal(before));
  // size-1 mask dims broadcast
  TensorDict r = td.masked_fill(at::ones({1, 3}, at::kBool), 7);
  BOOST_TEST((r.get("a") == 7).all().item<bool>());
  // a 0-dim mask on a TD with no batch dims
  TensorDict scalar_td(Dict{{"x", at::zeros({2})}}, {});
  BOOST_TEST(scalar_td.masked_fill(at::ones({}, at::kBool), 1).get("x").equal(at::ones({2})));
}

BOOST_AUTO_TEST_CASE(where_over_zoo) {
  auto gen = at::detail::createCPUGenerator(5);
  at::Tensor cond = at::rand({4, 3, 2}, gen) > 0.5;
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict other = td.apply([](const at::Tensor& x) { return -x - 1; });
    auto view = [&](const at::Tensor& x) {
      std::vector<int64_t> shape(cond.sizes().begin(), cond.sizes().end());
      shape.resize(static_cast<size_t>(x.dim()), 1);
      return cond.view(shape);
    };
    TensorDict out = td.where(cond, other);
    check_leafwise(out, td, [&](const at::Tensor& x) { return at::where(view(x), x, -x - 1); }, kind.name);
    if (td.contains("data")) BOOST_TEST(out.get_non_tensor("data") == JsonValue("a string"));
    TensorDict outs = td.where(cond, at::Scalar(0));
    check_leafwise(outs, td, [&](const at::Tensor& x) { return at::where(view(x), x, at::Scalar(0)); }, kind.name);
  }
}

BOOST_AUTO_TEST_CASE(where_errors_and_lock) {
  TensorDict td = small();
  at::Tensor cond = at::tensor({1, 0, 1}).to(at::kBool);
  TensorDict other = td.apply([](const at::Tensor& x) { return at::zeros_like(x); });
  TensorDict r = td.where(cond, other);
  BOOST_TEST(r.get("a").select(0, 1).equal(at::zeros({2})));
  BOOST_TEST(r.get("a").select(0, 2).equal(td.get("a").select(0, 2)));
  BOOST_CHECK_EXCEPTION(td.where(cond, other.exclude({{"sub", "b"}})), KeyError, [](const KeyError& e) {
    return has(msg(e), "('sub', 'b')") && has(msg(e), "no pad value");
  });
  TensorDict extra = other.clone();
  extra.set("zz", at::zeros({3}));
  BOOST_CHECK_EXCEPTION(td.where(cond, extra), KeyError, [](const KeyError& e) { return has(msg(e), "'zz'"); });
  TensorDict swapped = other.clone();
  swapped.del("a");
  swapped.set("a", TensorDict({}, {3}));
  BOOST_CHECK_THROW(td.where(cond, swapped), TypeError);
  BOOST_CHECK_THROW(td.where(at::ones({3}), other), TypeError);
  BOOST_CHECK_THROW(td.where(at::ones({2}, at::kBool), other), BatchSizeError);
  BOOST_CHECK_THROW(td.where(at::ones({3, 2}, at::kBool), at::Scalar(1)), BatchSizeError);
  BOOST_CHECK_THROW(td.where(cond, TensorDict::undefined()), ValueError);
  // lock: upstream propagates it for a scalar other, returns a fresh TD for a TensorDict other
  td.lock_();
  BOOST_TEST(td.where(cond, at::Scalar(1)).is_locked());
  BOOST_TEST(!td.where(cond, other).is_locked());
}

BOOST_AUTO_TEST_SUITE_END()
