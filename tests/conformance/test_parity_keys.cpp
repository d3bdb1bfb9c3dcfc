// Upstream parity of keys and shapes (issue 35, items 13-17): nested keys through a leaf, unflatten_keys'
// order, view / unflatten error classes, split_keys with a default, membership in a key view (test_keys_view). Each expectation
// is what Python tensordict v0.14 does (its source and the library run side by side); the generic ones run
// over every node kind of the conformance zoo. Test names follow upstream's where upstream has the test.
#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"

using namespace tensordict;
using conformance::for_each_member;
using conformance::Member;

namespace {

//! the keys of td with include_nested, joined by "." (upstream's keys(True) order)
std::vector<std::string> nested_keys(const TensorDict& td) {
  std::vector<std::string> out;
  for (const auto& k : td.keys(KeysOptions().include_nested(true))) out.push_back(k.join("."));
  return out;
}

at::Tensor zeros4() { return at::zeros({4}); }

}  // namespace

BOOST_AUTO_TEST_SUITE(parity_keys)

BOOST_AUTO_TEST_CASE(test_err_msg_missing_nested) {
  // ("a", "x") with "a" a tensor: upstream's set / set_ raise KeyError ("The entry a is already present"),
  // get / pop (with or without a default) ValueError ("Expected a TensorDictBase instance"), del_
  // AttributeError ('Tensor' object has no attribute 'del_'); `in keys(include_nested=True)` is False
  for_each_member([](const Member&, TensorDict td, const TensorDict& ref) {
    const NestedKey through{"a", "x"};
    const NestedKey deeper{"a", "x", "y"};
    const at::Tensor v = at::zeros(ref.get("a").sizes());
    for (const NestedKey& k : {through, deeper}) {
      BOOST_TEST_CONTEXT("key " << k) {
        BOOST_CHECK_THROW(td.set(k, v), KeyError);
        BOOST_CHECK_THROW(td.set(k, v, SetOptions().inplace(true)), KeyError);
        BOOST_CHECK_THROW(td.set_(k, v), KeyError);
        BOOST_CHECK_THROW(td.get(k), ValueError);
        BOOST_CHECK_THROW(td.get_entry(k), ValueError);
        BOOST_CHECK_THROW(td.pop(k), ValueError);
        BOOST_CHECK_THROW(td.pop(k, Entry(v)), ValueError);
        BOOST_CHECK_THROW(td.del(k), AttributeError);
        BOOST_TEST(!td.contains(k));
      }
    }
    // nothing was changed
    BOOST_TEST(td.get("a").equal(ref.get("a")));
    BOOST_TEST(nested_keys(td) == nested_keys(ref));
  });
}

BOOST_AUTO_TEST_CASE(test_err_msg_missing_nested_locked) {
  // a locked TensorDict does not create levels on set(inplace=true): the class is still set's KeyError
  TensorDict td({{"a", zeros4()}}, {4});
  td.lock_();
  BOOST_CHECK_THROW(td.set({"a", "x"}, zeros4(), SetOptions().inplace(true)), KeyError);
  BOOST_CHECK_THROW(td.set({"a", "x"}, zeros4()), KeyError);
  BOOST_CHECK_THROW(td.del({"a", "x"}), AttributeError);
  BOOST_CHECK_THROW(td.get({"a", "x"}), ValueError);
}

BOOST_AUTO_TEST_CASE(test_unflatten_keys) {
  // upstream renames each key holding the separator in turn (rename_key_(key, parts, safe=True)): the plain
  // keys keep their slots and the rebuilt sub-TensorDicts follow, in their order
  TensorDict td({{"a", zeros4()}, {"b.c", zeros4()}, {"d", zeros4()}, {"e.f.g", zeros4()}, {"e.h", zeros4()},
                 {"i", zeros4()}},
                {4});
  for (bool inplace : {false, true}) {
    BOOST_TEST_CONTEXT("inplace " << inplace) {
      TensorDict src = td.clone();
      TensorDict u = src.unflatten_keys(FlattenKeysOptions().inplace(inplace));
      BOOST_TEST(nested_keys(u) == (std::vector<std::string>{"a", "d", "i", "b.c", "b", "e.f.g", "e.f", "e.h", "e"}));
      BOOST_TEST(u.get_td("e").batch_size() == BatchSize({4}));
      BOOST_TEST(u.is_same(src) == inplace);
    }
  }
  // a rebuilt key going into an existing sub-TensorDict keeps that sub-TensorDict's slot
  TensorDict merge({{"b.c", zeros4()}, {"b", Dict{{"d", zeros4()}}}, {"a", zeros4()}}, {4});
  BOOST_TEST(nested_keys(merge.unflatten_keys()) == (std::vector<std::string>{"b.d", "b.c", "b", "a"}));
  BOOST_TEST(nested_keys(merge) == (std::vector<std::string>{"b.c", "b.d", "b", "a"}));  // the source is untouched
  // another separator
  TensorDict slash({{"x/y", zeros4()}, {"z", zeros4()}}, {4});
  BOOST_TEST(nested_keys(slash.unflatten_keys("/")) == (std::vector<std::string>{"z", "x.y", "x"}));
  // a key unflattened onto an existing one, or through a leaf: KeyError (upstream's safe rename)
  TensorDict onto({{"a.b", zeros4()}, {"a", Dict{{"b", zeros4()}}}}, {4});
  BOOST_CHECK_THROW(onto.unflatten_keys(), KeyError);
  TensorDict leaf({{"a", zeros4()}, {"a.b", zeros4()}}, {4});
  BOOST_CHECK_THROW(leaf.unflatten_keys(), KeyError);
  BOOST_CHECK_THROW(leaf.unflatten_keys(FlattenKeysOptions().inplace(true)), KeyError);
}

BOOST_AUTO_TEST_CASE(test_view_and_unflatten_error_classes) {
  // view: upstream's _infer_size_impl asserts a shape holding a negative size (AssertionError); a shape of
  // sizes alone goes to torch's view (RuntimeError "shape ... is invalid"). unflatten: torch.unflatten's
  // RuntimeError, for empty sizes too
  for_each_member([](const Member&, const TensorDict& td, const TensorDict&) {
    BOOST_CHECK_THROW(td.view({7}), RuntimeError);
    BOOST_CHECK_THROW(td.view({5, 5}), RuntimeError);
    BOOST_CHECK_THROW(td.view({-1, -1}), AssertionError);
    BOOST_CHECK_THROW(td.view({-1, 7}), AssertionError);
    BOOST_CHECK_THROW(td.view({-2, 12}), AssertionError);
    BOOST_CHECK_THROW(td.view({0, -1}), AssertionError);
    BOOST_CHECK_THROW(td.unflatten(0, {}), RuntimeError);
    BOOST_CHECK_THROW(td.unflatten(1, {}), RuntimeError);
    BOOST_CHECK_THROW(td.unflatten(0, {3, 2}), RuntimeError);
    // what fits works (on the dense form: torch's view needs compatible strides, as upstream's)
    const TensorDict dense = td.contiguous();
    BOOST_TEST(dense.view({-1}).batch_size() == BatchSize({24}));
    BOOST_TEST(dense.view({2, -1}).batch_size() == BatchSize({2, 12}));
    BOOST_TEST(dense.unflatten(0, {2, 2}).batch_size() == BatchSize({2, 2, 3, 2, 1}));
  });
  // AssertionError is not a RuntimeError here: the two checks above tell them apart
  TensorDict td({{"a", at::zeros({4, 3})}}, {4, 3});
  bool runtime = false;
  try {
    td.view({-1, 5});
  } catch (const RuntimeError&) {
    runtime = true;
  } catch (const AssertionError&) {
  }
  BOOST_TEST(!runtime);
}

BOOST_AUTO_TEST_CASE(test_split_keys) {
  // upstream split_keys(*key_sets, default=..., strict=True): strict ignores the default (a missing key is a
  // KeyError and nothing is split); strict=False uses it, and without one (None) skips the missing key
  TensorDict td({{"a", zeros4()}, {"b", at::ones({4, 2})}, {"n", Dict{{"x", zeros4()}, {"y", zeros4()}}}, {"c", zeros4()}},
                {4});
  const Entry dflt(at::full({4}, 7.0));
  BOOST_CHECK_THROW(td.split_keys({{"a", "zz"}}, dflt), KeyError);
  BOOST_CHECK_THROW(td.split_keys({{"a", "zz"}}, dflt, SelectOptions().inplace(true)), KeyError);
  BOOST_CHECK_THROW(td.split_keys({{"a", "zz"}}, dflt, SelectOptions().strict(true)), KeyError);
  BOOST_CHECK_THROW(td.split_keys({{"a", "zz"}}), KeyError);
  BOOST_TEST(nested_keys(td) == (std::vector<std::string>{"a", "b", "n.x", "n.y", "n", "c"}));
  auto parts = td.split_keys({{"a", "zz"}, {{"n", "x"}}}, dflt, SelectOptions().strict(false));
  BOOST_REQUIRE(parts.size() == 3u);
  BOOST_TEST(nested_keys(parts[0]) == (std::vector<std::string>{"a", "zz"}));
  BOOST_TEST(parts[0].get("zz").equal(at::full({4}, 7.0)));
  BOOST_TEST(nested_keys(parts[1]) == (std::vector<std::string>{"n.x", "n"}));
  BOOST_TEST(nested_keys(parts[2]) == (std::vector<std::string>{"b", "n.y", "n", "c"}));
  // strict=False without a default (None): the missing key is skipped
  for (const auto& skipped : {td.split_keys({{"a", "zz"}}, SelectOptions().strict(false)),
                              td.split_keys({{"a", "zz"}}, Entry(), SelectOptions().strict(false))}) {
    BOOST_REQUIRE(skipped.size() == 2u);
    BOOST_TEST(nested_keys(skipped[0]) == (std::vector<std::string>{"a"}));
    BOOST_TEST(nested_keys(skipped[1]) == (std::vector<std::string>{"b", "n.x", "n.y", "n", "c"}));
  }
  // the default goes in its key's place among the set's keys
  auto ordered = td.split_keys({{"zz", "a"}}, dflt, SelectOptions().strict(false));
  BOOST_TEST(nested_keys(ordered[0]) == (std::vector<std::string>{"zz", "a"}));
  // a missing nested key skipped keeps no level of it; the rest drops sub-TensorDicts left empty, and empty
  // ones it had (upstream's filter_empty_)
  TensorDict withe = td.clone();
  withe.set("e", TensorDict(BatchSize{4}));
  auto nested = withe.split_keys({{{"n", "zz"}, "a"}}, SelectOptions().strict(false));
  BOOST_TEST(nested_keys(nested[0]) == (std::vector<std::string>{"a"}));
  BOOST_TEST(nested_keys(nested[1]) == (std::vector<std::string>{"b", "n.x", "n.y", "n", "c"}));
  auto whole = withe.split_keys({{{"n", "x"}, {"n", "y"}}});
  BOOST_TEST(nested_keys(whole[0]) == (std::vector<std::string>{"n.x", "n.y", "n"}));
  BOOST_TEST(nested_keys(whole[1]) == (std::vector<std::string>{"a", "b", "c"}));
  // in place: the rest is self, without the split keys
  TensorDict src = td.clone();
  auto inpl = src.split_keys({{"a", "zz"}}, dflt, SelectOptions().inplace(true).strict(false));
  BOOST_TEST(inpl.back().is_same(src));
  BOOST_TEST(nested_keys(src) == (std::vector<std::string>{"b", "n.x", "n.y", "n", "c"}));
  BOOST_TEST(inpl[0].get("zz").equal(at::full({4}, 7.0)));
}

BOOST_AUTO_TEST_CASE(test_keys_view) {
  // upstream's test_keys_view: a nested key in a view without include_nested is a TypeError ("... checks
  // with tuples of strings is only supported ..."), an empty key one ("TensorDict keys are always strings")
  TensorDict sub_sub({{"c", at::randn({4, 5, 6, 7})}}, {4, 5, 6});
  TensorDict sub(BatchSize{4, 5});
  sub.set("b", sub_sub);
  TensorDict td(BatchSize{4});
  td.set("a", sub);
  const auto nested = KeysOptions().include_nested(true);
  BOOST_TEST(td.keys().contains("a"));
  BOOST_TEST(!td.keys().contains("random_string"));
  BOOST_TEST(td.keys(nested).contains(NestedKey("a")));
  BOOST_TEST(td.keys(nested).contains({"a", "b", "c"}));
  BOOST_TEST(!td.keys(nested).contains({"a", "c", "b"}));
  auto tuples_only_nested = [](const TypeError& e) {
    return std::string(e.what()).find("checks with tuples of strings is only supported") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(td.keys().contains({"a", "b", "c"}), TypeError, tuples_only_nested);
  BOOST_CHECK_EXCEPTION(td.keys(KeysOptions().leaves_only(true)).contains({"a", "b"}), TypeError, tuples_only_nested);
  auto strings = [](const TypeError& e) {
    return std::string(e.what()).find("TensorDict keys are always strings") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(td.keys().contains(NestedKey()), TypeError, strings);
  BOOST_CHECK_EXCEPTION(td.keys(nested).contains(NestedKey()), TypeError, strings);
  // the listing itself is as before (a std::vector<NestedKey>)
  BOOST_TEST(td.keys() == std::vector<NestedKey>{"a"});
  BOOST_TEST(td.keys(nested).size() == 3u);
  const std::vector<NestedKey> leaves = td.keys(KeysOptions().include_nested(true).leaves_only(true));
  BOOST_TEST(leaves == (std::vector<NestedKey>{{"a", "b", "c"}}));
  // as upstream, membership is the TensorDict's (a sub-TensorDict is a member of a leaves_only view too)
  BOOST_TEST(td.keys(KeysOptions().include_nested(true).leaves_only(true)).contains({"a", "b"}));
  BOOST_TEST(!td.keys(nested).contains({"a", "b", "c", "d"}));  // through a leaf: not a member
  // over every node kind: the same classes
  for_each_member([](const Member&, const TensorDict& m, const TensorDict&) {
    BOOST_TEST(m.keys().contains("a"));
    BOOST_CHECK_THROW(m.keys().contains({"a", "x"}), TypeError);
    BOOST_TEST(!m.keys(KeysOptions().include_nested(true)).contains({"a", "x"}));
    BOOST_CHECK_THROW(m.keys().contains(NestedKey()), TypeError);
  });
}

BOOST_AUTO_TEST_SUITE_END()
