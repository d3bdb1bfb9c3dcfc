// Upstream parity (issue 15), the behaviours that need a particular structure (sub-TensorDicts, empty levels,
// several TensorDicts): key order and structure ops, apply's filter_empty, named_apply with others,
// split_keys(default=), index assignment converting a tensor for a sub-TensorDict. The generic ones run over
// every node kind in tests/conformance/test_parity.cpp.
#include <boost/test/unit_test.hpp>

#include "engine/zoo.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;
using namespace at::indexing;

namespace {

std::vector<std::string> names(const std::vector<NestedKey>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.join("."));
  return out;
}

//! a: [4, 3], sub: {x: [4, 3], y: [4]}, b: [4]
TensorDict sample() {
  return TensorDict(Dict{{"a", at::zeros({4, 3})},
                         {"sub", Dict{{"x", at::zeros({4, 3})}, {"y", at::zeros({4})}}},
                         {"b", at::zeros({4})}},
                    {4});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(parity)

BOOST_AUTO_TEST_CASE(test_setitem_tensor_into_a_sub_tensordict) {
  // upstream _set_at_str: td[0] = {"sub": tensor} writes the tensor into every leaf of the sub-TensorDict
  TensorDict td = sample();
  TensorDict value(Dict{{"a", at::ones({3})}, {"sub", at::full({}, 2.0)}, {"b", at::ones({})}}, {});
  td.index_put_({0}, value);
  BOOST_TEST(td.get({"sub", "x"}).index({0}).eq(2).all().item<bool>());
  BOOST_TEST(td.get({"sub", "x"}).index({1}).eq(0).all().item<bool>());
  BOOST_TEST(td.get({"sub", "y"}).index({0}).item<float>() == 2.0f);
  BOOST_TEST(td.get("a").index({0}).eq(1).all().item<bool>());
  // the tensor must broadcast to each leaf of the sub-TensorDict at the index ("y" is [4]: a [3] does not fit)
  TensorDict bad(Dict{{"sub", at::ones({3})}}, {});
  TensorDict only_x(Dict{{"a", at::zeros({4, 3})}, {"sub", Dict{{"x", at::zeros({4, 3})}}}}, {4});
  only_x.index_put_({Slice(1, 3)}, bad);
  BOOST_TEST(only_x.get({"sub", "x"}).index({Slice(1, 3)}).eq(1).all().item<bool>());
  BOOST_CHECK_THROW(td.index_put_({0}, bad), RuntimeError);  // a [3] into "y"[0] (a scalar), as torch
}

BOOST_AUTO_TEST_CASE(test_rename_key_moves_it_to_the_end) {
  // upstream rename_key_: the entry is popped and set again
  TensorDict td = sample();
  td.rename_key_("a", "z");
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"sub", "b", "z"}));
  td.rename_key_({"sub", "x"}, {"sub", "w"});
  BOOST_TEST(names(td.get_td("sub").keys()) == std::vector<std::string>({"y", "w"}));
}

BOOST_AUTO_TEST_CASE(test_key_order_after_update) {
  // upstream TensorDictBase.update walks other.items() (its top level, in its order): a key that exists keeps its
  // place (a sub-TensorDict on both sides is updated recursively, a leaf or a sub-TensorDict replaced by
  // _set_str keeps its dict slot), a new key (leaf or sub-TensorDict) is appended in other's order. keys(True)
  // lists a sub-TensorDict after its own keys (_TensorDictKeysView._iter_helper: post-order).
  TensorDict td = sample();  // a, sub{x, y}, b
  TensorDict other(Dict{{"c", Dict{{"z", at::ones({4})}}},
                        {"sub", Dict{{"w", at::ones({4})}, {"x", at::ones({4, 3})}}},
                        {"a", at::ones({4, 3})},
                        {"d", at::ones({4})}},
                   {4});
  td.update(other);
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"a", "sub", "b", "c", "d"}));
  BOOST_TEST(names(td.get_td("sub").keys()) == std::vector<std::string>({"x", "y", "w"}));
  BOOST_TEST(names(td.keys(KeysOptions().include_nested(true))) ==
             std::vector<std::string>({"a", "sub.x", "sub.y", "sub.w", "sub", "b", "c.z", "c", "d"}));
  BOOST_TEST(names(td.keys(KeysOptions().include_nested(true).leaves_only(true))) ==
             std::vector<std::string>({"a", "sub.x", "sub.y", "sub.w", "b", "c.z", "d"}));
  BOOST_TEST(td.get({"sub", "x"}).eq(1).all().item<bool>());
  BOOST_TEST(td.get({"sub", "y"}).eq(0).all().item<bool>());
  // a leaf replaced by a sub-TensorDict, and a sub-TensorDict replaced by a leaf, keep their slots
  td.update(TensorDict(Dict{{"b", Dict{{"q", at::ones({4})}}}, {"sub", at::ones({4})}}, {4}));
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"a", "sub", "b", "c", "d"}));
  BOOST_TEST(td.get_entry("sub").is_tensor());
  BOOST_TEST(td.get_entry("b").is_tensordict());
  // a nested key of other whose level is missing creates the level at the end (_set_tuple / _create_nested_str)
  td.update(TensorDict(Dict{{NestedKey{"e", "f"}, at::ones({4})}, {"a", at::zeros({4, 3})}}, {4}));
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"a", "sub", "b", "c", "d", "e"}));
}

BOOST_AUTO_TEST_CASE(test_key_order_after_nested_rename) {
  // upstream TensorDict.rename_key_: _set_str / _set_tuple(new_key, get(old_key)), then del_(old_key): the new key
  // goes where a set puts it (end of its level, a missing level created at the end of its parent), the old
  // slot disappears; an existing new_key (safe=False) is overwritten in its slot
  TensorDict td = sample();  // a, sub{x, y}, b
  td.set({"sub", "z"}, at::zeros({4}));
  td.rename_key_({"sub", "x"}, {"sub", "x2"});
  BOOST_TEST(names(td.get_td("sub").keys()) == std::vector<std::string>({"y", "z", "x2"}));
  td.rename_key_({"sub", "y"}, "y");  // out of the level: appended to the root
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"a", "sub", "b", "y"}));
  BOOST_TEST(names(td.get_td("sub").keys()) == std::vector<std::string>({"z", "x2"}));
  td.rename_key_("a", {"new", "a"});  // into a missing level: the level is created at the end
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"sub", "b", "y", "new"}));
  td.rename_key_("sub", "sub2");  // a sub-TensorDict moves as a whole, its keys in their order
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"b", "y", "new", "sub2"}));
  BOOST_TEST(names(td.keys(KeysOptions().include_nested(true))) ==
             std::vector<std::string>({"b", "y", "new.a", "new", "sub2.z", "sub2.x2", "sub2"}));
  td.set("y", at::full({4}, 3.0));
  td.rename_key_("y", "b");  // onto an existing key (safe=false): b keeps its slot and takes y's value
  BOOST_TEST(names(td.keys()) == std::vector<std::string>({"b", "new", "sub2"}));
  BOOST_TEST(td.get("b").eq(3).all().item<bool>());
  td.rename_key_({"sub2", "z"}, {"new", "z"});  // from one level into another existing one
  BOOST_TEST(names(td.get_td("new").keys()) == std::vector<std::string>({"a", "z"}));
  BOOST_TEST(names(td.get_td("sub2").keys()) == std::vector<std::string>({"x2"}));
}

BOOST_AUTO_TEST_CASE(test_flatten_keys_drops_empty_sub_tensordicts) {
  TensorDict td = sample();
  td.set("empty", TensorDict(BatchSize{4}));
  TensorDict f = td.flatten_keys();
  BOOST_TEST(names(f.keys()) == std::vector<std::string>({"a", "sub.x", "sub.y", "b"}));
  TensorDict g = td.clone();
  g.flatten_keys(FlattenKeysOptions().inplace(true));
  BOOST_TEST(!g.contains("empty"));
}

BOOST_AUTO_TEST_CASE(test_apply_filter_empty_default) {
  // upstream's default: a sub-TensorDict whose leaves were all dropped (fn returned None) is dropped too
  TensorDict td = sample();
  auto drop_sub = [](const NestedKey& k, const at::Tensor& t) { return k.size() > 1 ? at::Tensor() : t + 1; };
  TensorDict r = td.named_apply(drop_sub, ApplyOptions().nested_keys(true));
  BOOST_TEST(names(r.keys()) == std::vector<std::string>({"a", "b"}));
  TensorDict kept = td.named_apply(drop_sub, ApplyOptions().nested_keys(true).keep_empty(true));
  BOOST_TEST(names(kept.keys()) == std::vector<std::string>({"a", "sub", "b"}));
  BOOST_TEST(kept.get_td("sub").keys().empty());
}

BOOST_AUTO_TEST_CASE(test_select_not_strict_keeps_the_existing_parent) {
  TensorDict td = sample();
  TensorDict s = td.select({{"sub", "missing"}, "a"}, SelectOptions().strict(false));
  BOOST_TEST(names(s.keys()) == std::vector<std::string>({"sub", "a"}));
  BOOST_TEST(s.get_td("sub").keys().empty());
  BOOST_TEST(s.get_td("sub").batch_size() == BatchSize({4}));
  TensorDict none = td.select({{"nope", "missing"}}, SelectOptions().strict(false));
  BOOST_TEST(none.keys().empty());
  BOOST_CHECK_THROW(td.select({{"sub", "missing"}}), KeyError);
}

BOOST_AUTO_TEST_CASE(test_split_keys_default) {
  TensorDict td = sample();
  // upstream uses the default only with strict=False (test_split_keys in tests/conformance/test_parity_keys.cpp)
  auto parts = td.split_keys({{"a", "missing"}, {{"sub", "y"}}}, Entry(at::full({4}, 7.0)), SelectOptions().strict(false));
  BOOST_REQUIRE(parts.size() == 3u);
  BOOST_TEST(parts[0].get("missing").equal(at::full({4}, 7.0)));
  BOOST_TEST(parts[0].contains("a"));
  BOOST_TEST(parts[1].contains({"sub", "y"}));
  BOOST_TEST(parts[2].contains("b"));
  BOOST_TEST(parts[2].contains({"sub", "x"}));
  BOOST_TEST(!parts[2].contains("a"));
  BOOST_CHECK_THROW(td.split_keys({{"missing"}}), KeyError);
}

BOOST_AUTO_TEST_CASE(test_named_apply_with_others) {
  TensorDict td = sample();
  TensorDict other = td.apply([](const at::Tensor& t) { return t + 3; });
  TensorDict r = td.named_apply(
      [](const NestedKey& k, const std::vector<at::Tensor>& v) {
        return k.back() == "b" ? at::Tensor() : v[0] + v[1] * 2;
      },
      {other});
  BOOST_TEST(r.get("a").eq(6).all().item<bool>());
  BOOST_TEST(r.get({"sub", "x"}).eq(6).all().item<bool>());
  BOOST_TEST(!r.contains("b"));
  TensorDict missing(Dict{{"a", at::zeros({4, 3})}}, {4});
  BOOST_CHECK_THROW(td.named_apply([](const NestedKey&, const std::vector<at::Tensor>& v) { return v[0]; }, {missing}),
                    KeyError);
}

BOOST_AUTO_TEST_CASE(test_update_keys_to_update_nested) {
  TensorDict td = sample();
  TensorDict other = td.apply([](const at::Tensor& t) { return t + 1; });
  td.update_(other, {"sub"});
  BOOST_TEST(td.get({"sub", "x"}).eq(1).all().item<bool>());
  BOOST_TEST(td.get({"sub", "y"}).eq(1).all().item<bool>());
  BOOST_TEST(td.get("a").eq(0).all().item<bool>());
  TensorDict extra(Dict{{"new", at::zeros({4})}}, {4});
  BOOST_CHECK_THROW(td.update_(extra, {"new"}), KeyError);
  td.update_(extra, {"a"});  // "new" is not to be updated: nothing happens
  BOOST_TEST(!td.contains("new"));
}

BOOST_AUTO_TEST_CASE(test_preallocated_non_tensor_gets_the_full_batch_size) {
  // upstream: buf[0] = row (row batch [3]) preallocates a non-tensor leaf of batch [*buf.batch_size, 3]
  TensorDict buf(BatchSize{10});
  TensorDict row(Dict{{"x", at::ones({3})}, {"s", "txt"}}, {3});
  buf.index_put_({0}, row);
  BOOST_TEST(buf.get("x").sizes() == at::IntArrayRef({10, 3}));
  BOOST_TEST(buf.get_entry("s").shape() == BatchSize({10, 3}));
  BOOST_TEST(buf.get_non_tensor("s") == JsonValue("txt"));
  // the batch size setter keeps a child's longer batch size when it starts with the new one
  TensorDict t(Dict{{"x", at::zeros({3, 2})}, {"s", "v"}}, {3});
  t.set_batch_size({});
  BOOST_TEST(t.get_entry("s").shape() == BatchSize({3}));
  t.set_batch_size({3, 2});
  BOOST_TEST(t.get_entry("s").shape() == BatchSize({3, 2}));
}

BOOST_AUTO_TEST_CASE(test_index_collapses_equal_non_tensors) {
  // upstream: selected values all equal -> a NonTensorData
  TensorDict td(Dict{{"x", at::zeros({4})}}, {4});
  td.set("s", NonTensorStack({JsonValue("a"), JsonValue("a"), JsonValue("b"), JsonValue("a")}, {4}));
  BOOST_TEST(td.index({Slice(0, 2)}).get_entry("s").is_non_tensor_data());
  BOOST_TEST(td.index({at::tensor({0, 3}, at::kLong)}).get_entry("s").is_non_tensor_data());
  BOOST_TEST(td.index({0}).get_non_tensor("s") == JsonValue("a"));
  BOOST_TEST(td.index({Slice(1, 3)}).get_entry("s").is_non_tensor_stack());
  TensorDict a(Dict{{"x", at::zeros({2})}}, {2});
  a.set("s", NonTensorStack({JsonValue(1), JsonValue(1)}, {2}));
  // stacking keeps a NonTensorStack (upstream's default, capture_non_tensor_stack off); indexing it collapses
  TensorDict s = stack({a, a}, 0);
  BOOST_TEST(s.get_entry("s").is_non_tensor_stack());
  BOOST_TEST(s.index({1}).get_entry("s").is_non_tensor_data());
  BOOST_TEST(s.index({1}).get_entry("s").shape() == BatchSize({2}));
}

BOOST_AUTO_TEST_CASE(test_zero_dim_full_slices) {
  TensorDict td(Dict{{"a", at::arange(3)}}, {});
  BOOST_TEST(td.index({Slice()}).is_same(td));
  td.index_put_({Slice()}, TensorDict(Dict{{"a", at::full({3}, 4, at::kLong)}}, {}));
  BOOST_TEST(td.get("a").eq(4).all().item<bool>());
}

BOOST_AUTO_TEST_SUITE_END()
