// Core TensorDict: construction, keys, get/set/update, key-structure ops, non-tensors, lock, errors.
#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {
TensorDict nested3() {
  return TensorDict(Dict{{"a", at::zeros({3, 4})},
                         {"sub", Dict{{"b", at::ones({3, 2})}, {"deep", Dict{{"c", at::arange(3)}}}}},
                         {"z", at::zeros({3})}},
                    {3});
}
std::vector<std::string> joined(const std::vector<NestedKey>& ks) {
  std::vector<std::string> out;
  for (const auto& k : ks) out.push_back(k.join("."));
  return out;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(core)

BOOST_AUTO_TEST_CASE(construction_and_nested_dicts) {
  TensorDict td = nested3();
  BOOST_TEST(td.batch_size() == BatchSize({3}));
  BOOST_TEST(td.batch_dims() == 1);
  BOOST_TEST(td.numel() == 3);
  BOOST_TEST(td.len() == 3);
  BOOST_TEST(td.get_td("sub").batch_size() == BatchSize({3}));
  BOOST_TEST(td.get({"sub", "deep", "c"}).equal(at::arange(3)));
  BOOST_TEST(td.get({{"sub", "deep"}, "c"}).equal(at::arange(3)));  // nested brace keys flatten
  BOOST_TEST(!td.device().has_value());
  TensorDict on_cpu(Dict{{"x", at::zeros({2})}}, {2}, at::Device(at::kCPU));
  BOOST_TEST(on_cpu.device().has_value());
  BOOST_TEST(on_cpu.get("x").device() == at::Device(at::kCPU));
}

BOOST_AUTO_TEST_CASE(batch_mismatch_errors) {
  BOOST_CHECK_EXCEPTION(TensorDict(Dict{{"a", at::zeros({4, 5})}}, {3}), BatchSizeError, [](const BatchSizeError& e) {
    std::string w = e.what();
    return w.find("batch dimension mismatch") != std::string::npos &&
           w.find("torch.Size([3])") != std::string::npos && w.find("torch.Size([4, 5])") != std::string::npos;
  });
  TensorDict td({}, {3});
  BOOST_CHECK_THROW(td.set("a", at::zeros({2})), BatchSizeError);
  BOOST_CHECK_THROW(td.set("a", at::zeros({})), BatchSizeError);
  BOOST_CHECK_THROW(td.set("s", TensorDict(Dict{{"x", at::zeros({4})}}, {4})), BatchSizeError);
  BOOST_CHECK_THROW(TensorDict(BatchSize{-1}), BatchSizeError);
  BOOST_TEST(td.keys().empty());  // nothing half-written
}

BOOST_AUTO_TEST_CASE(sub_td_with_other_batch_is_rebatched) {
  TensorDict td({}, {3});
  TensorDict sub(Dict{{"x", at::zeros({3, 2})}}, {});
  td.set("sub", sub);
  BOOST_TEST(td.get_td("sub").batch_size() == BatchSize({3}));
  BOOST_TEST(sub.batch_size().empty());  // the caller's TD is not modified
}

BOOST_AUTO_TEST_CASE(from_dict_options) {
  Dict d{{"a", at::zeros({3, 4, 5})}, {"b", Dict{{"c", at::zeros({3, 4})}}}, {{"x", "y"}, at::zeros({3, 4, 1})}};
  TensorDict plain = TensorDict::from_dict(d);
  BOOST_TEST(plain.batch_size().empty());
  BOOST_TEST(plain.contains({"x", "y"}));
  TensorDict automatic = TensorDict::from_dict(d, FromDictOptions().auto_batch_size(true));
  BOOST_TEST(automatic.batch_size() == BatchSize({3, 4}));
  BOOST_TEST(automatic.get_td("b").batch_size() == BatchSize({3, 4}));
  TensorDict one = TensorDict::from_dict(d, FromDictOptions().batch_dims(1));
  BOOST_TEST(one.batch_size() == BatchSize({3}));
  TensorDict given = TensorDict::from_dict(d, FromDictOptions().batch_size(BatchSize{3, 4}));
  BOOST_TEST(given.batch_size() == BatchSize({3, 4}));
  BOOST_CHECK_EXCEPTION(TensorDict::from_dict(d, FromDictOptions().batch_size(BatchSize{3}).batch_dims(1)), ValueError,
                        [](const ValueError& e) { return std::string(e.what()).find("both") != std::string::npos; });
  BOOST_CHECK_THROW(TensorDict::from_dict(d, FromDictOptions().batch_dims(4)), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(fromkeys_and_empty) {
  TensorDict td = TensorDict::fromkeys({"a", {"b", "c"}}, 2.0);
  BOOST_TEST(td.get("a").item<float>() == 2.0f);
  BOOST_TEST(td.get({"b", "c"}).item<float>() == 2.0f);
  TensorDict n = nested3();
  TensorDict e = n.empty();
  BOOST_TEST(e.keys().empty());
  BOOST_TEST(e.batch_size() == n.batch_size());
  TensorDict r = n.empty(EmptyOptions().recurse(true));
  BOOST_TEST(joined(r.keys(KeysOptions().include_nested(true))) == std::vector<std::string>({"sub.deep", "sub"}));
  BOOST_TEST(r.is_empty());
  BOOST_TEST(!n.is_empty());
}

BOOST_AUTO_TEST_CASE(keys_order_and_options) {
  TensorDict td = nested3();
  BOOST_TEST(joined(td.keys()) == std::vector<std::string>({"a", "sub", "z"}));
  // children are listed before their parent (upstream's order)
  BOOST_TEST(joined(td.keys(KeysOptions().include_nested(true))) ==
             std::vector<std::string>({"a", "sub.b", "sub.deep.c", "sub.deep", "sub", "z"}));
  BOOST_TEST(joined(td.keys(KeysOptions().include_nested(true).leaves_only(true))) ==
             std::vector<std::string>({"a", "sub.b", "sub.deep.c", "z"}));
  BOOST_TEST(joined(td.keys(KeysOptions().leaves_only(true))) == std::vector<std::string>({"a", "z"}));
  td.set("data", "text");
  BOOST_TEST(joined(td.keys(KeysOptions().leaves_only(true))) == std::vector<std::string>({"a", "z"}));
  BOOST_TEST(joined(td.keys(KeysOptions().leaves_only(true).non_tensor_leaves(true))) ==
             std::vector<std::string>({"a", "z", "data"}));
  BOOST_TEST(joined(td.keys(KeysOptions().sort(true))) == std::vector<std::string>({"a", "data", "sub", "z"}));
  BOOST_TEST(td.values().size() == 4u);
  BOOST_TEST(td.items(KeysOptions().include_nested(true)).size() == 7u);
  BOOST_TEST(td.contains("a"));
  BOOST_TEST(td.contains({"sub", "deep", "c"}));
  BOOST_TEST(!td.contains({"sub", "nope"}));
  BOOST_TEST(!td.contains({"a", "b"}));  // "a" is a tensor
}

BOOST_AUTO_TEST_CASE(get_variants_and_errors) {
  TensorDict td = nested3();
  BOOST_CHECK_EXCEPTION(td.get("missing"), KeyError, [](const KeyError& e) {
    return std::string(e.what()).find("'missing'") != std::string::npos;
  });
  BOOST_CHECK_THROW(td.get({"sub", "missing"}), KeyError);
  BOOST_CHECK_THROW(td.get({"a", "b"}), ValueError);  // a is a tensor (upstream)
  BOOST_CHECK_THROW(td.get("sub"), TypeError);       // sub is a TensorDict
  BOOST_CHECK_THROW(td.get_td("a"), TypeError);
  at::Tensor dflt = at::ones({1});
  BOOST_TEST(td.get("missing", dflt).equal(dflt));
  BOOST_TEST(!td.get_entry_opt("missing").has_value());
  BOOST_TEST(td["sub"].is_tensordict());
  BOOST_TEST(td.get_at("z", {Slice(1, 3)}).sizes() == at::IntArrayRef({2}));
  BOOST_CHECK_THROW(td.get(NestedKey()), KeyError);
}

BOOST_AUTO_TEST_CASE(set_creates_levels_and_replaces_without_copy) {
  TensorDict td({}, {2});
  at::Tensor x = at::zeros({2, 3});
  td.set({"a", "b", "c"}, x);
  BOOST_TEST(td.get_td("a").batch_size() == BatchSize({2}));
  BOOST_TEST(td.get({"a", "b", "c"}).data_ptr() == x.data_ptr());  // no copy
  at::Tensor y = at::ones({2, 3});
  td.set({"a", "b", "c"}, y);
  BOOST_TEST(td.get({"a", "b", "c"}).data_ptr() == y.data_ptr());  // replaced
  td.set({"a", "b", "c"}, at::full({2, 3}, 5.0), SetOptions().inplace(true));
  BOOST_TEST(y.eq(5).all().item<bool>());  // copied into the existing leaf
  BOOST_CHECK_THROW(td.set({"a", "b", "c", "d"}, at::zeros({2})), KeyError);  // c is a tensor (upstream)
}

BOOST_AUTO_TEST_CASE(set_underscore_strict) {
  TensorDict td = nested3();
  at::Tensor a = td.get("a");
  td.set_("a", at::ones({3, 4}));
  BOOST_TEST(a.eq(1).all().item<bool>());
  BOOST_CHECK_THROW(td.set_("nope", at::ones({3})), KeyError);
  BOOST_CHECK_THROW(td.set_("a", at::ones({3, 5})), BatchSizeError);
  BOOST_CHECK_THROW(td.set_("sub", at::ones({3})), TypeError);
  td.set_at_("z", at::full({2}, 7.0), {Slice(0, 2)});
  BOOST_TEST(td.get("z").equal(at::tensor({7.0f, 7.0f, 0.0f})));
}

BOOST_AUTO_TEST_CASE(update_variants) {
  TensorDict td = nested3();
  TensorDict other(Dict{{"a", at::ones({3, 4})}, {"sub", Dict{{"new", at::ones({3})}}}, {"extra", at::ones({3})}}, {3});
  td.update(other);
  BOOST_TEST(td.contains({"sub", "b"}));  // update recurses, keeps the rest
  BOOST_TEST(td.contains({"sub", "new"}));
  BOOST_TEST(td.contains("extra"));
  BOOST_TEST(td.get("a").data_ptr() == other.get("a").data_ptr());
  TensorDict cl = nested3();
  cl.update(other, UpdateOptions().clone(true));
  BOOST_TEST(cl.get("a").data_ptr() != other.get("a").data_ptr());
  TensorDict only = nested3();
  only.update(other, UpdateOptions().keys_to_update(std::vector<std::string>{"extra"}));
  BOOST_TEST(only.contains("extra"));
  BOOST_TEST(!only.contains({"sub", "new"}));
  BOOST_TEST(only.get("a").eq(0).all().item<bool>());
  // update_: strictly in place
  TensorDict dst = nested3();
  at::Tensor a = dst.get("a");
  dst.update_(TensorDict(Dict{{"a", at::full({3, 4}, 3.0)}}, {3}));
  BOOST_TEST(a.eq(3).all().item<bool>());
  BOOST_CHECK_THROW(dst.update_(TensorDict(Dict{{"q", at::zeros({3})}}, {3})), KeyError);
  // update_at_
  dst.update_at_(TensorDict(Dict{{"z", at::full({1}, 9.0)}}, {1}), {Slice(1, 2)});
  BOOST_TEST(dst.get("z").equal(at::tensor({0.0f, 9.0f, 0.0f})));
}

BOOST_AUTO_TEST_CASE(pop_del_rename_setdefault_clear) {
  TensorDict td = nested3();
  Entry e = td.pop("z");
  BOOST_TEST(e.is_tensor());
  BOOST_TEST(!td.contains("z"));
  BOOST_CHECK_THROW(td.pop("z"), KeyError);
  BOOST_TEST(td.pop("z", Entry(at::ones({1}))).tensor().equal(at::ones({1})));
  td.del({"sub", "deep", "c"});
  BOOST_TEST(!td.contains({"sub", "deep", "c"}));
  BOOST_CHECK_THROW(td.del("nope"), KeyError);
  td.rename_key_("a", "alpha");
  BOOST_TEST(joined(td.keys()) == std::vector<std::string>({"sub", "alpha"}));  // upstream: moved to the end
  td.set("beta", at::zeros({3}));
  BOOST_CHECK_THROW(td.rename_key_("alpha", "beta", RenameOptions().safe(true)), KeyError);
  td.rename_key_({"sub", "b"}, {"moved"});
  BOOST_TEST(td.contains("moved"));
  BOOST_TEST(!td.contains({"sub", "b"}));
  Entry d = td.setdefault("fresh", at::ones({3}));
  BOOST_TEST(d.tensor().equal(at::ones({3})));
  Entry kept = td.setdefault("fresh", at::zeros({3}));
  BOOST_TEST(kept.tensor().equal(at::ones({3})));
  td.clear();
  BOOST_TEST(td.keys().empty());
}

BOOST_AUTO_TEST_CASE(select_exclude_no_copy) {
  TensorDict td = nested3();
  TensorDict s = td.select({"a", {"sub", "deep", "c"}});
  BOOST_TEST(joined(s.keys(KeysOptions().include_nested(true).leaves_only(true))) ==
             std::vector<std::string>({"a", "sub.deep.c"}));
  BOOST_TEST(s.get("a").data_ptr() == td.get("a").data_ptr());
  BOOST_CHECK_THROW(td.select({"nope"}), KeyError);
  BOOST_TEST(td.select({"nope", "a"}, SelectOptions().strict(false)).keys().size() == 1u);
  TensorDict x = td.exclude({"a", {"sub", "b"}, "missing"});
  BOOST_TEST(joined(x.keys(KeysOptions().include_nested(true).leaves_only(true))) ==
             std::vector<std::string>({"sub.deep.c", "z"}));
  BOOST_TEST(td.contains({"sub", "b"}));  // the source is untouched
  TensorDict y = nested3();
  y.select({"a"}, SelectOptions().inplace(true));
  BOOST_TEST(joined(y.keys()) == std::vector<std::string>({"a"}));
  TensorDict w = nested3();
  w.exclude({"a"}, ExcludeOptions().inplace(true));
  BOOST_TEST(!w.contains("a"));
}

BOOST_AUTO_TEST_CASE(split_keys_sets) {
  TensorDict td = nested3();
  auto parts = td.split_keys({{"a"}, {{"sub", "b"}}});
  BOOST_REQUIRE_EQUAL(parts.size(), 3u);
  BOOST_TEST(joined(parts[0].keys()) == std::vector<std::string>({"a"}));
  BOOST_TEST(parts[1].contains({"sub", "b"}));
  BOOST_TEST(!parts[2].contains("a"));
  BOOST_TEST(parts[2].contains({"sub", "deep", "c"}));
  BOOST_TEST(parts[2].contains("z"));
  auto inpl = td.split_keys({{"a"}}, SelectOptions().inplace(true));
  BOOST_TEST(inpl.back().is_same(td));
  BOOST_TEST(!td.contains("a"));
}

BOOST_AUTO_TEST_CASE(flatten_unflatten_keys) {
  TensorDict td = nested3();
  TensorDict f = td.flatten_keys();
  BOOST_TEST(joined(f.keys()) == std::vector<std::string>({"a", "sub.b", "sub.deep.c", "z"}));
  TensorDict f2 = td.flatten_keys("/");
  BOOST_TEST(f2.contains("sub/deep/c"));
  TensorDict u = f.unflatten_keys();
  BOOST_TEST(u.get({"sub", "deep", "c"}).equal(at::arange(3)));
  BOOST_TEST(u.get_td("sub").batch_size() == BatchSize({3}));
  // collisions raise
  TensorDict clash(Dict{{"a.b", at::zeros({3})}, {"a", Dict{{"b", at::zeros({3})}}}}, {3});
  BOOST_CHECK_THROW(clash.flatten_keys(), KeyError);
  TensorDict clash2(Dict{{"a", at::zeros({3})}, {"a.b", at::zeros({3})}}, {3});
  BOOST_CHECK_THROW(clash2.unflatten_keys(), KeyError);
  TensorDict inpl = nested3();
  inpl.flatten_keys(FlattenKeysOptions().inplace(true));
  BOOST_TEST(inpl.contains("sub.b"));
}

BOOST_AUTO_TEST_CASE(non_tensor_data) {
  TensorDict td(Dict{{"x", at::zeros({3})}}, {3});
  td.set("name", "hello");
  BOOST_TEST(td.is_non_tensor("name"));
  BOOST_TEST(td.get_non_tensor("name") == JsonValue("hello"));
  Entry w = td.get_entry("name");
  BOOST_TEST(w.is_non_tensor_data());
  BOOST_TEST(w.non_tensor_data().batch_size() == BatchSize({3}));
  td.set_non_tensor("cfg", JsonValue::object({{"lr", 0.1}, {"n", 3}}));
  BOOST_TEST(td.get_non_tensor("cfg").find("n")->as_int() == 3);
  BOOST_CHECK_THROW(td.get("name"), TypeError);
  NonTensorStack st({JsonValue("a"), JsonValue("b"), JsonValue("c")}, {3});
  td.set("names", st);
  BOOST_TEST(td.get_non_tensor("names") == JsonValue::array({"a", "b", "c"}));
  BOOST_CHECK_THROW(td.set("bad", NonTensorStack({JsonValue(1)}, {1})), BatchSizeError);
  BOOST_CHECK_THROW(NonTensorStack({JsonValue(1)}, {2}), ValueError);
  // set_batch_size carries the broadcast value along
  TensorDict t2(Dict{{"x", at::zeros({3, 2})}}, {3});
  t2.set("s", "v");
  t2.set_batch_size({3, 2});
  BOOST_TEST(t2.get_entry("s").non_tensor_data().batch_size() == BatchSize({3, 2}));
}

BOOST_AUTO_TEST_CASE(batch_size_setter) {
  TensorDict td(Dict{{"a", at::zeros({3, 4, 5})}, {"b", at::zeros({3, 4})}}, {3});
  td.set_batch_size({3, 4});
  BOOST_TEST(td.batch_size() == BatchSize({3, 4}));
  BOOST_CHECK_EXCEPTION(td.set_batch_size({3, 4, 5}), BatchSizeError, [](const BatchSizeError& e) {
    std::string w = e.what();
    return w.find("the tensor b has shape torch.Size([3, 4]) which is incompatible with the batch-size "
                  "torch.Size([3, 4, 5])") != std::string::npos;
  });
  BOOST_TEST(td.batch_size() == BatchSize({3, 4}));
  td.set_batch_size({});
  BOOST_TEST(td.batch_dims() == 0);
  BOOST_TEST(td.len() == 0);
}

BOOST_AUTO_TEST_CASE(bytes_and_numel) {
  TensorDict td = nested3();
  // a: 12 f32, b: 6 f32, c: 3 i64, z: 3 f32
  BOOST_TEST(td.bytes() == 12 * 4 + 6 * 4 + 3 * 8 + 3 * 4);
  BOOST_TEST(td.numel() == 3);
  BOOST_TEST(TensorDict().numel() == 1);
}

BOOST_AUTO_TEST_CASE(clone_and_copy) {
  TensorDict td = nested3();
  td.lock_();
  TensorDict c = td.clone();
  BOOST_TEST(!c.is_locked());
  BOOST_TEST(c.get({"sub", "b"}).data_ptr() != td.get({"sub", "b"}).data_ptr());
  BOOST_TEST(c.get({"sub", "b"}).equal(td.get({"sub", "b"})));
  TensorDict s = td.copy();
  BOOST_TEST(s.get({"sub", "b"}).data_ptr() == td.get({"sub", "b"}).data_ptr());
  BOOST_TEST(!s.get_td("sub").is_same(td.get_td("sub")));
  BOOST_TEST(!s.is_locked());
  TensorDict d = td.to(at::kDouble);
  BOOST_TEST(d.get("a").scalar_type() == at::kDouble);
  BOOST_TEST(d.get({"sub", "deep", "c"}).scalar_type() == at::kDouble);
}

BOOST_AUTO_TEST_CASE(lock_blocks_structure_allows_inplace) {
  TensorDict td = nested3();
  td.lock_();
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.get_td("sub").is_locked());
  BOOST_TEST(td.get_td({"sub", "deep"}).is_locked());
  auto locked = [](const LockedError& e) {
    return std::string(e.what()).find("Cannot modify locked TensorDict. For in-place modification") !=
           std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(td.set("new", at::zeros({3})), LockedError, locked);
  BOOST_CHECK_EXCEPTION(td.set("a", at::zeros({3, 4})), LockedError, locked);
  BOOST_CHECK_EXCEPTION(td.set({"sub", "new"}, at::zeros({3})), LockedError, locked);
  BOOST_CHECK_EXCEPTION(td.set({"fresh", "x"}, at::zeros({3})), LockedError, locked);
  BOOST_CHECK_THROW(td.set("new", at::zeros({3}), SetOptions().inplace(true)), LockedError);
  BOOST_CHECK_THROW(td.del("a"), LockedError);
  BOOST_CHECK_THROW(td.pop("a"), LockedError);
  BOOST_CHECK_THROW(td.rename_key_("a", "b"), LockedError);
  BOOST_CHECK_THROW(td.clear(), LockedError);
  BOOST_CHECK_THROW(td.update(TensorDict(Dict{{"q", at::zeros({3})}}, {3})), LockedError);
  BOOST_CHECK_THROW(td.select({"a"}, SelectOptions().inplace(true)), LockedError);
  BOOST_TEST(td.contains("a"));  // nothing lost
  // allowed: in-place writes
  td.set_("a", at::ones({3, 4}));
  td.set("a", at::full({3, 4}, 2.0), SetOptions().inplace(true));
  td.update(TensorDict(Dict{{"z", at::ones({3})}}, {3}), UpdateOptions().inplace(true));
  td.update_(TensorDict(Dict{{"z", at::full({3}, 4.0)}}, {3}));
  td.set_at_("z", at::zeros({1}), {0});
  td.update(TensorDict(Dict{{"q", at::zeros({3})}}, {3}), UpdateOptions().ignore_lock(true));
  BOOST_TEST(td.contains("q"));
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.get("a").eq(2).all().item<bool>());
  BOOST_TEST(td.get("z").equal(at::tensor({0.0f, 4.0f, 4.0f})));
  // upstream allows exclude(inplace=True) on a locked TensorDict (test_exclude_inplace_on_locked)
  td.exclude({"q"}, ExcludeOptions().inplace(true));
  BOOST_TEST(!td.contains("q"));
  BOOST_TEST(td.is_locked());
}

BOOST_AUTO_TEST_CASE(lock_graph) {
  TensorDict td = nested3();
  TensorDict sub = td.get_td("sub");
  td.lock_();
  // a child cannot unlock while its locked parent lives
  BOOST_CHECK_EXCEPTION(sub.unlock_(), LockedError, [](const LockedError& e) {
    return std::string(e.what()).find("part of a locked graph") != std::string::npos;
  });
  BOOST_TEST(sub.is_locked());
  td.unlock_();
  BOOST_TEST(!td.is_locked());
  BOOST_TEST(!sub.is_locked());
  BOOST_TEST(!td.get_td({"sub", "deep"}).is_locked());
  // once the parent is gone the child may unlock
  TensorDict child;
  {
    TensorDict parent(Dict{{"c", TensorDict(Dict{{"x", at::zeros({1})}}, {})}}, {});
    child = parent.get_td("c");
    parent.lock_();
  }
  BOOST_TEST(child.is_locked());
  child.unlock_();
  BOOST_TEST(!child.is_locked());
}

BOOST_AUTO_TEST_CASE(lock_guards) {
  TensorDict td = nested3();
  {
    LockGuard g(td);
    BOOST_TEST(td.is_locked());
  }
  BOOST_TEST(!td.is_locked());
  td.lock_();
  {
    UnlockGuard g(td);
    BOOST_TEST(!td.is_locked());
    td.set("added", at::zeros({3}));
  }
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.contains("added"));
}

BOOST_AUTO_TEST_CASE(handle_semantics) {
  TensorDict a = nested3();
  TensorDict b = a;  // aliases
  b.set("new", at::zeros({3}));
  BOOST_TEST(a.contains("new"));
  BOOST_TEST(a.is_same(b));
  BOOST_TEST(!a.clone().is_same(a));
}

BOOST_AUTO_TEST_CASE(nested_key_forms) {
  NestedKey k{"a", {"b", {"c"}}, "d"};
  BOOST_TEST(k.size() == 4u);
  BOOST_TEST(k.join(".") == "a.b.c.d");
  BOOST_TEST(k.repr() == "('a', 'b', 'c', 'd')");
  BOOST_TEST(NestedKey("x").repr() == "'x'");
  BOOST_TEST((NestedKey("x") + NestedKey{"y", "z"}).join("/") == "x/y/z");
}

BOOST_AUTO_TEST_CASE(zoo_kinds_have_expected_batch) {
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      BOOST_TEST(td.batch_size() == BatchSize({4, 3, 2, 1}));
      for (auto& kv : zoo::leaves(td)) BOOST_TEST(kv.second.size(0) == 4);
      // keys(), contains and get agree on every kind
      for (const auto& k : td.keys(KeysOptions().include_nested(true))) BOOST_TEST(td.contains(k));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
