// td[idx] = value (a TensorDict, a tensor, a scalar) that fails on one leaf leaves every leaf, key and
// non-tensor entry as it was: the write is planned in full before anything is written (indexing_write.cpp,
// WritePlan). Each case writes into leaves filled with sentinels and checks them all after the failure.
#include <boost/test/unit_test.hpp>

#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::None;
using at::indexing::Slice;

namespace {

constexpr float kSentinel = 7.f;

//! a [5] TensorDict: a [5, 4] and b [5, 4] float, i [5, 4] uint8, n {x [5, 2]}, s a NonTensorData; every
//! number a sentinel
TensorDict sentinel_td() {
  TensorDict td(Dict{{"a", at::full({5, 4}, kSentinel)}, {"b", at::full({5, 4}, kSentinel)},
                     {"i", at::full({5, 4}, 7, at::kByte)}},
                {5});
  td.set("n", TensorDict(Dict{{"x", at::full({5, 2}, kSentinel)}}, {5}));
  td.set_non_tensor("s", JsonValue("kept"));
  return td;
}

//! every leaf still all sentinels, no key added, the non-tensor entry unchanged; the first difference
std::string unchanged(const TensorDict& td) {
  for (const char* k : {"a", "b"})
    if (!at::equal(td.get(k), at::full({5, 4}, kSentinel))) return std::string("leaf ") + k + " written";
  if (!at::equal(td.get("i"), at::full({5, 4}, 7, at::kByte))) return "leaf i written";
  if (!at::equal(td.get({"n", "x"}), at::full({5, 2}, kSentinel))) return "leaf n.x written";
  if (td.keys().size() != 5 || td.get_td("n").keys().size() != 1) return "a key was added";
  if (td.get_non_tensor("s") != JsonValue("kept")) return "the non-tensor entry changed";
  return "";
}

TensorDict row_of(std::initializer_list<std::pair<const char*, at::Tensor>> leaves, BatchSize batch) {
  Dict d;
  for (const auto& [k, t] : leaves) d.emplace_back(k, t);
  return TensorDict(d, std::move(batch));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(write_atomic)

// the value's last leaf does not fit: the leaves before it keep their rows (one row, the general path after the
// one-row path refuses; a slice; rows by an index tensor; a new key before and after the failing one)
BOOST_AUTO_TEST_CASE(a_value_leaf_that_does_not_fit_writes_nothing) {
  struct Case {
    const char* what;
    Index index;
    TensorDict value;
  };
  const at::Tensor rows = at::tensor({0, 2}, at::kLong);
  std::vector<Case> cases{
      {"int, b of another shape", {4}, row_of({{"a", at::ones({4})}, {"b", at::ones({3})}}, {})},
      {"int, new key first", {4}, row_of({{"c", at::ones({4})}, {"a", at::ones({4})}, {"b", at::ones({3})}}, {})},
      {"int, new key after", {4}, row_of({{"a", at::ones({4})}, {"b", at::ones({3})}, {"c", at::ones({4})}}, {})},
      {"slice", {Slice(1, 3)}, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 3})}}, {2})},
      {"slice, a converted", {Slice(1, 3)}, row_of({{"a", at::ones({2, 4}, at::kDouble)}, {"b", at::ones({2, 3})}}, {2})},
      {"slice, a broadcast", {Slice(1, 3)}, row_of({{"a", at::ones({2, 1})}, {"b", at::ones({2, 3})}}, {2})},
      {"take, b of another dtype", {rows}, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4}, at::kLong)}}, {2})},
      {"take, b of another shape", {rows}, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 3})}}, {2})},
      {"take, a converted first", {rows}, row_of({{"i", at::ones({2, 4})}, {"b", at::ones({2, 3})}}, {2})},
      {"int, nested leaf", {4}, [] {
         TensorDict v = row_of({{"a", at::ones({4})}}, {});
         v.set("n", row_of({{"x", at::ones({3})}}, {}));
         return v;
       }()},
      {"int, non-tensor before", {4}, [] {
         TensorDict v = row_of({{"a", at::ones({4})}}, {});
         v.set_non_tensor("s", JsonValue("changed"));
         v.set("b", at::ones({3}));
         return v;
       }()},
  };
  for (const auto& c : cases) {
    TensorDict td = sentinel_td();
    bool threw = false;
    try {
      td.index_put_(c.index, c.value);
    } catch (const Error&) {
      threw = true;
    }
    BOOST_TEST(threw, c.what);
    BOOST_TEST(unchanged(td) == "", c.what << ": " << unchanged(td));
  }
}

// two writes that cannot be checked before they run (several index tensors: a general index): the first is put
// back when the second fails
BOOST_AUTO_TEST_CASE(a_general_index_puts_back_what_it_wrote) {
  TensorDict td(Dict{{"a", at::full({5, 2, 4}, kSentinel)}, {"b", at::full({5, 2, 4}, kSentinel)}}, {5, 2});
  const Index index{at::tensor({0, 3}, at::kLong), at::tensor({1, 0}, at::kLong)};
  TensorDict value = row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4}, at::kLong)}}, {2});
  BOOST_CHECK_THROW(td.index_put_(index, value), Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 2, 4}, kSentinel)));
  BOOST_TEST(at::equal(td.get("b"), at::full({5, 2, 4}, kSentinel)));
  // and the same write with a fitting value lands in both
  td.index_put_(index, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4})}}, {2}));
  BOOST_TEST(td.get("a").sum().item<float>() == kSentinel * 40 + 2 * 4 * (1 - kSentinel));
  BOOST_TEST(at::equal(td.get("b")[3][0], at::ones({4})));
}

// a leaf that requires grad refuses an in-place write (autograd's rule, which no check can stand in for): the
// other leaves are not written
BOOST_AUTO_TEST_CASE(a_leaf_that_refuses_in_place_writes_nothing) {
  TensorDict td = sentinel_td();
  td.set("b", at::full({5, 4}, kSentinel).requires_grad_());
  BOOST_CHECK_THROW(td.index_put_({Slice(1, 3)}, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4})}}, {2})),
                    Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)));
  BOOST_CHECK_THROW(td.index_put_({at::tensor({1, 2}, at::kLong)}, row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4})}}, {2})),
                    Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)));
}

// a leaf shrunk behind the TensorDict's back (set_ to two rows): rows past it fail before any leaf is written
BOOST_AUTO_TEST_CASE(a_shrunk_leaf_fails_before_any_write) {
  for (int kind = 0; kind < 3; ++kind) {
    // (no uint8 leaf when a float tensor fills rows by an index tensor: torch's dtype rule refuses it first)
    TensorDict td = kind == 2 ? TensorDict(Dict{{"a", at::full({5, 4}, kSentinel)}, {"b", at::zeros({5, 4})}}, {5})
                              : sentinel_td();
    at::Tensor backing = at::full({5, 4}, kSentinel);
    td.get("b").set_(backing.storage(), 0, {2, 4}, {4, 1});
    const TensorDict one = row_of({{"a", at::ones({4})}, {"b", at::ones({4})}}, {});
    const TensorDict two = row_of({{"a", at::ones({2, 4})}, {"b", at::ones({2, 4})}}, {2});
    if (kind == 0) BOOST_CHECK_THROW(td.index_put_(4, one), IndexError);
    if (kind == 1) BOOST_CHECK_THROW(td.index_put_({at::tensor({1, 4}, at::kLong)}, two), IndexError);
    if (kind == 2) BOOST_CHECK_THROW(td.index_put_({at::tensor({1, 4}, at::kLong)}, at::ones({4})), IndexError);
    BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)), "kind " << kind);
    BOOST_TEST(at::equal(backing, at::full({5, 4}, kSentinel)), "kind " << kind);
  }
}

// td[idx] = tensor and td[idx] = scalar fill every leaf: one that refuses leaves the others as they were
BOOST_AUTO_TEST_CASE(a_fill_that_one_leaf_refuses_writes_nothing) {
  TensorDict td = sentinel_td();
  td.set("b", at::full({5, 3}, kSentinel));  // a row of 3: a row of 4 does not fit
  BOOST_CHECK_THROW(td.index_put_({0}, at::ones({4})), Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)));
  BOOST_TEST(at::equal(td.get({"n", "x"}), at::full({5, 2}, kSentinel)));
  BOOST_CHECK_THROW(td.index_put_({Slice(0, 2)}, at::ones({2, 4})), Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)));
  // 300 does not fit the uint8 leaf i (fill_'s overflow check)
  TensorDict u = sentinel_td();
  BOOST_CHECK_THROW(u.index_put_({Slice(0, 2)}, at::Scalar(300)), Error);
  BOOST_CHECK_THROW(u.index_put_({at::tensor({0, 1}, at::kLong)}, at::Scalar(300)), Error);
  BOOST_TEST(unchanged(u) == "", unchanged(u));
  // what fits is written everywhere
  u.index_put_({Slice(0, 2)}, at::Scalar(3));
  BOOST_TEST(at::equal(u.get("i")[1], at::full({4}, 3, at::kByte)));
  BOOST_TEST(at::equal(u.get({"n", "x"})[0], at::full({2}, 3.f)));
}

// a lazy stack below a dense TensorDict writes itself: when a later one refuses, the first is put back
BOOST_AUTO_TEST_CASE(a_lazy_stack_below_puts_back_what_it_wrote) {
  auto member = [] { return TensorDict(Dict{{"f", at::full({2}, kSentinel)}}, {}); };
  TensorDict td(Dict{{"a", at::full({2, 4}, kSentinel)}}, {2});
  td.set("l1", lazy_stack({member(), member()}));
  td.set("l2", lazy_stack({member(), member()}));
  TensorDict value = row_of({{"a", at::ones({4})}}, {});
  value.set("l1", row_of({{"f", at::ones({2})}}, {}));
  value.set("l2", row_of({{"f", at::ones({3})}}, {}));
  BOOST_CHECK_THROW(td.index_put_({1}, value), Error);
  BOOST_TEST(at::equal(td.get("a"), at::full({2, 4}, kSentinel)));
  BOOST_TEST(at::equal(td.get({"l1", "f"}), at::full({2, 2}, kSentinel)));
  BOOST_TEST(at::equal(td.get({"l2", "f"}), at::full({2, 2}, kSentinel)));
  value.set("l2", row_of({{"f", at::ones({2})}}, {}));
  td.index_put_({1}, value);
  BOOST_TEST(at::equal(td.get({"l1", "f"})[1], at::ones({2})));
  BOOST_TEST(at::equal(td.get({"l2", "f"})[1], at::ones({2})));
  BOOST_TEST(at::equal(td.get("a")[1], at::ones({4})));
}

// torch 1.13's set_(source) of another dtype keeps the leaf's dtype over the source's storage: a double [5, 4]
// over the 80 bytes of a float [5, 4]. A write into its last rows is refused before anything is written (the
// one-row path's memcpy, and torch's copy_ after it, wrote past the storage)
BOOST_AUTO_TEST_CASE(a_leaf_over_a_storage_too_small_for_it_is_refused) {
  TensorDict td(Dict{{"a", at::full({5, 4}, kSentinel)}, {"d", at::zeros({5, 4}, at::kDouble)}}, {5});
  td.get("d").set_(at::zeros({5, 4}));
  BOOST_REQUIRE(td.get("d").scalar_type() == at::kDouble);  // the torch behaviour this guards against
  BOOST_REQUIRE(td.get("d").storage().nbytes() == 80);
  const TensorDict row = row_of({{"a", at::ones({4})}, {"d", at::ones({4}, at::kDouble)}}, {});
  BOOST_CHECK_THROW(td.index_put_(4, row), RuntimeError);
  BOOST_CHECK_THROW(td.index_put_({Slice(3, 5)}, row_of({{"a", at::ones({2, 4})}, {"d", at::ones({2, 4}, at::kDouble)}}, {2})),
                    RuntimeError);
  BOOST_CHECK_THROW(td.index_put_({4}, at::Scalar(1.5)), RuntimeError);
  BOOST_TEST(at::equal(td.get("a"), at::full({5, 4}, kSentinel)));
  // a value over a storage too small for it is refused as well
  TensorDict ok(Dict{{"a", at::full({5, 4}, kSentinel)}}, {5});
  at::Tensor bad = at::zeros({4}, at::kDouble);
  bad.set_(at::zeros({4}));
  BOOST_CHECK_THROW(ok.index_put_(1, row_of({{"a", bad}}, {})), RuntimeError);
  BOOST_TEST(at::equal(ok.get("a"), at::full({5, 4}, kSentinel)));
}

// a lazy stack writes member by member: a member that refuses its part (a row of 3 where the others hold rows
// of 4) leaves the members written before it as they were, and a key the write added to them is removed
BOOST_AUTO_TEST_CASE(a_lazy_stack_member_that_refuses_leaves_the_others_as_they_were) {
  auto member = [](int64_t f) { return TensorDict(Dict{{"x", at::full({2, f}, kSentinel)}}, {2}); };
  for (int how = 0; how < 4; ++how) {
    LazyStackedTensorDict ls = lazy_stack({member(4), member(4), member(3)}, 0);
    TensorDict value(Dict{{"x", at::ones({3, 4})}}, {3});
    if (how == 1) value.set("y", at::ones({3, 2}));  // a new key: added to members 0 and 1 before 2 refuses
    if (how == 2) value.set("n", TensorDict(Dict{{"z", at::ones({3})}}, {3}));  // a new sub-TensorDict
    bool threw = false;
    try {
      if (how == 3) {
        ls.index_put_({Slice(), 0}, at::ones({4}));  // a tensor broadcast to every member's row
      } else {
        ls.index_put_({Slice(), 0}, value);
      }
    } catch (const Error&) {
      threw = true;
    }
    BOOST_TEST(threw, "how " << how);
    for (int64_t i = 0; i < 3; ++i) {
      const TensorDict m = ls.member(i);
      BOOST_TEST(at::equal(m.get("x"), at::full({2, i < 2 ? 4 : 3}, kSentinel)), "how " << how << " member " << i);
      BOOST_TEST(m.keys().size() == 1u, "how " << how << " member " << i << " keys " << m.keys().size());
    }
  }
  // what fits every member is written into each
  LazyStackedTensorDict ok = lazy_stack({member(4), member(4)}, 0);
  ok.index_put_({Slice(), 1}, TensorDict(Dict{{"x", at::ones({2, 4})}}, {2}));
  BOOST_TEST(at::equal(ok.member(1).get("x")[1], at::ones({4})));
  BOOST_TEST(at::equal(ok.member(0).get("x")[0], at::full({4}, kSentinel)));
}

// update_ / update_(keys) check every value against its key before writing any: a later key of another shape or
// kind leaves the earlier ones as they were
BOOST_AUTO_TEST_CASE(an_in_place_update_that_one_key_refuses_writes_nothing) {
  TensorDict td = sentinel_td();
  TensorDict other(Dict{{"a", at::ones({5, 4})}, {"b", at::ones({5, 3})}}, {5});
  BOOST_CHECK_THROW(td.update_(other), BatchSizeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  BOOST_CHECK_THROW(td.update_(other, {NestedKey("a"), NestedKey("b")}), BatchSizeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  TensorDict kinds(Dict{{"a", at::ones({5, 4})}}, {5});
  kinds.set_non_tensor("s", JsonValue("new"));
  kinds.set({"n", "x"}, at::ones({5, 2}));
  kinds.set("b", TensorDict(BatchSize{5}));  // an empty level: nothing of it is a leaf
  kinds.set_non_tensor("i", JsonValue(1));  // a non-tensor into a tensor
  BOOST_CHECK_THROW(td.update_(kinds), TypeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  // update_at_ writes its leaves as td[idx] = value does: a later leaf that does not fit writes none
  TensorDict at_rows(Dict{{"a", at::ones({2, 4})}, {"b", at::ones({2, 3})}}, {2});
  BOOST_CHECK_THROW(td.update_at_(at_rows, {Slice(0, 2)}), Error);
  BOOST_CHECK_THROW(td.update_at_(at_rows, {at::tensor({0, 3}, at::kLong)}), Error);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  // update(inplace) checks the leaves it writes in place the same way, and a TensorDict into a tensor key
  BOOST_CHECK_THROW(td.update(other, UpdateOptions().inplace(true)), BatchSizeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  TensorDict td_into_leaf(Dict{{"a", at::ones({5, 4})}}, {5});
  td_into_leaf.set("b", TensorDict(Dict{{"q", at::ones({5})}}, {5}));
  BOOST_CHECK_THROW(td.update(td_into_leaf, UpdateOptions().inplace(true)), TypeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  // what fits is written, broadcast as copy_ does
  td.update_(TensorDict(Dict{{"a", at::ones({5, 1})}}, {5}));
  BOOST_TEST(at::equal(td.get("a"), at::ones({5, 4})));
  // a value whose leading dims are not the batch size is refused before any key is written
  TensorDict rows(Dict{{"a", at::ones({5, 4})}, {"b", at::ones({4})}}, {});
  BOOST_CHECK_THROW(td.update_(rows), BatchSizeError);
  BOOST_TEST(at::equal(td.get("b"), at::full({5, 4}, kSentinel)));
}

// update (not in place) replaces entries key by key: a later key that does not fit (another batch size, a locked
// sub-TensorDict) puts back every entry it replaced and removes the keys it added, nested levels included
BOOST_AUTO_TEST_CASE(an_update_that_one_key_refuses_changes_nothing) {
  TensorDict td = sentinel_td();
  const at::Tensor a_before = td.get("a");
  TensorDict other(Dict{{"a", at::ones({5, 4})}, {"new", at::ones({5})}}, {});
  other.set({"n", "x"}, at::ones({5, 2}));
  other.set({"n", "y"}, at::ones({5, 3}));
  other.set("bad", at::ones({3}));  // td's batch [5] refuses a leaf of 3 rows
  BOOST_CHECK_THROW(td.update(other), Error);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  BOOST_TEST(td.get("a").is_same(a_before));
  BOOST_TEST(!td.contains("new"));
  BOOST_TEST(!td.contains(NestedKey({"n", "y"})));
  // a locked sub-TensorDict refuses its new key after the top level took its own
  TensorDict locked = sentinel_td();
  locked.get_td("n").lock_();
  TensorDict into_locked(Dict{{"a", at::ones({5, 4})}}, {5});
  into_locked.set({"n", "z"}, at::ones({5}));
  BOOST_CHECK_THROW(locked.update(into_locked), Error);
  BOOST_TEST(at::equal(locked.get("a"), at::full({5, 4}, kSentinel)));
  // what fits lands
  td.update(TensorDict(Dict{{"a", at::ones({5, 4})}, {"new", at::ones({5})}}, {5}));
  BOOST_TEST(at::equal(td.get("a"), at::ones({5, 4})));
  BOOST_TEST(td.contains("new"));
}

// rename_key_ sets the new name before it deletes the old one: a new name that cannot be set (it runs through a
// leaf) leaves the old key where it was
BOOST_AUTO_TEST_CASE(a_refused_rename_keeps_the_old_key) {
  TensorDict td = sentinel_td();
  BOOST_CHECK_THROW(td.rename_key_("a", NestedKey({"b", "c"})), Error);
  BOOST_TEST(td.contains("a"));
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  td.rename_key_("a", "z");
  BOOST_TEST(!td.contains("a"));
  BOOST_TEST(at::equal(td.get("z"), at::full({5, 4}, kSentinel)));
}

// a nested key whose value is refused leaves no level its walk created
BOOST_AUTO_TEST_CASE(a_refused_nested_set_leaves_no_new_level) {
  TensorDict td = sentinel_td();
  BOOST_CHECK_THROW(td.set(NestedKey({"new", "m", "x"}), at::ones({3})), BatchSizeError);
  BOOST_CHECK_THROW(td.set(NestedKey({"n", "m", "x"}), at::ones({3})), BatchSizeError);
  BOOST_TEST(unchanged(td) == "", unchanged(td));
  td.set(NestedKey({"new", "m", "x"}), at::ones({5}));
  BOOST_TEST(at::equal(td.get(NestedKey({"new", "m", "x"})), at::ones({5})));
}

// a lazy stack's in-place ops run member by member: a member that refuses (an int leaf that cannot hold x * 0.5, a
// fn that throws, a key another member lacks, a name another member holds) leaves the members before it as they
// were
BOOST_AUTO_TEST_CASE(a_lazy_stack_op_that_one_member_refuses_changes_no_member) {
  auto make = [] {
    TensorDict a(Dict{{"x", at::full({2}, kSentinel)}}, {});
    TensorDict b(Dict{{"x", at::full({2}, 7, at::kLong)}}, {});
    return lazy_stack({a, a.clone(), b}, 0);
  };
  auto first_kept = [](const LazyStackedTensorDict& ls) {
    return at::equal(ls.member(0).get("x"), at::full({2}, kSentinel)) &&
           at::equal(ls.member(1).get("x"), at::full({2}, kSentinel)) && ls.member(0).keys().size() == 1;
  };
  {
    LazyStackedTensorDict ls = make();
    BOOST_CHECK_THROW(ls.mul_(0.5), RuntimeError);
    BOOST_TEST(first_kept(ls));
    ls.mul_(2);
    BOOST_TEST(at::equal(ls.member(2).get("x"), at::full({2}, 14, at::kLong)));
  }
  {
    LazyStackedTensorDict ls = make();
    BOOST_CHECK_THROW(ls.apply_([](const at::Tensor& t) {
      if (t.scalar_type() == at::kLong) throw std::runtime_error("refused");
      return t * 2;
    }), std::exception);
    BOOST_TEST(first_kept(ls));
  }
  {
    LazyStackedTensorDict ls = make();
    BOOST_CHECK_THROW(ls.add_(TensorDict(Dict{{"x", at::full({3, 2}, 0.5)}}, {3})), Error);
    BOOST_TEST(first_kept(ls));
  }
  {
    LazyStackedTensorDict ls = make();
    TensorDict third = ls.member(2);  // a handle on the member
    third.set("y", at::zeros({1}));
    BOOST_CHECK_THROW(ls.rename_key_("x", "y", RenameOptions().safe(true)), KeyError);
    BOOST_TEST(first_kept(ls));
    BOOST_TEST(ls.member(2).contains("x"));
  }
}

// apply_ over a TensorDict holding a lazy stack: the lazy stack is applied once every dense leaf's result is known,
// so a fn that throws on a later dense leaf leaves the lazy stack as it was (it was applied during the visit)
BOOST_AUTO_TEST_CASE(an_apply_that_a_later_leaf_refuses_leaves_a_lazy_stack_below_as_it_was) {
  TensorDict member(Dict{{"f", at::full({2}, kSentinel)}}, {});
  TensorDict td(BatchSize{2});
  td.set("l", lazy_stack({member, member.clone()}, 0));
  td.set("b", at::full({2, 3}, 7, at::kLong));
  auto fn = [](const at::Tensor& t) {
    if (t.scalar_type() == at::kLong) throw std::runtime_error("refused");
    return t * 2;
  };
  BOOST_CHECK_THROW(td.apply_(fn), std::exception);
  BOOST_TEST(at::equal(td.get(NestedKey({"l", "f"})), at::full({2, 2}, kSentinel)));
  BOOST_TEST(at::equal(td.get("b"), at::full({2, 3}, 7, at::kLong)));
  td.del("b");
  td.apply_(fn);
  BOOST_TEST(at::equal(td.get(NestedKey({"l", "f"})), at::full({2, 2}, 2 * kSentinel)));
  // apply_ with other TensorDicts reaches the lazy stack with the others' sub-TensorDicts (its members with their
  // slices), once every dense leaf's result is known: a fn refusing a later dense leaf leaves the stack as it was
  td.set("d", at::ones({2}));
  td.set("b", at::full({2, 3}, 7, at::kLong));
  const TensorDict other = td.clone();
  auto sum = [](const std::vector<at::Tensor>& ts) {
    if (ts[0].scalar_type() == at::kLong) throw std::runtime_error("refused");
    return ts[0] + ts[1];
  };
  BOOST_CHECK_THROW(td.apply_(sum, {other}), std::exception);
  BOOST_TEST(at::equal(td.get(NestedKey({"l", "f"})), at::full({2, 2}, 2 * kSentinel)));
  BOOST_TEST(at::equal(td.get("d"), at::ones({2})));
  td.del("b");
  td.apply_(sum, {other});
  BOOST_TEST(at::equal(td.get(NestedKey({"l", "f"})), at::full({2, 2}, 4 * kSentinel)));
  BOOST_TEST(at::equal(td.get("d"), at::full({2}, 2.f)));
  // apply (a new TensorDict) with others: the stack's result is a lazy stack of the members' results
  TensorDict r = td.apply([](const std::vector<at::Tensor>& ts) { return ts[0] - ts[1]; }, {other});
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(r.get_td("l")));
  BOOST_TEST(at::equal(r.get(NestedKey({"l", "f"})), at::full({2, 2}, 2 * kSentinel)));
}

// a lazy stack's apply_ with other TensorDicts runs member by member with each other's slice along the stack dim
// (upstream _apply_nest); a member that refuses puts the members before it back; an other that does not split
// into the members is refused before anything is written
BOOST_AUTO_TEST_CASE(a_lazy_stacks_apply_with_others_goes_member_by_member_or_not_at_all) {
  TensorDict a(Dict{{"x", at::full({3}, 1.f)}}, {}), b(Dict{{"x", at::full({5}, 2.f)}}, {});
  LazyStackedTensorDict ls({a, b}, 0);  // ragged: x is [3] and [5]
  const TensorDict other = ls.clone();
  auto sum = [](const std::vector<at::Tensor>& ts) { return ts[0] + 10 * ts[1]; };
  ls.apply_(sum, {other});
  BOOST_TEST(at::equal(ls.member(0).get("x"), at::full({3}, 11.f)));
  BOOST_TEST(at::equal(ls.member(1).get("x"), at::full({5}, 22.f)));
  TensorDict r = ls.apply(sum, {other});
  BOOST_TEST(LazyStackedTensorDict(r).member(1).get("x").equal(at::full({5}, 42.f)));
  BOOST_TEST(at::equal(ls.member(1).get("x"), at::full({5}, 22.f)));
  // member 1 refuses: member 0 is put back
  auto refuse_long = [](const std::vector<at::Tensor>& ts) {
    if (ts[0].numel() == 5) throw std::runtime_error("refused");
    return ts[0] + ts[1];
  };
  BOOST_CHECK_THROW(ls.apply_(refuse_long, {other}), std::exception);
  BOOST_TEST(at::equal(ls.member(0).get("x"), at::full({3}, 11.f)));
  BOOST_TEST(at::equal(ls.member(1).get("x"), at::full({5}, 22.f)));
  // an other of three along the stack dim: a BatchSizeError, nothing written
  TensorDict three = lazy_stack({a.clone(), a.clone(), a.clone()}, 0);
  BOOST_CHECK_THROW(ls.apply_(sum, {three}), BatchSizeError);
  BOOST_TEST(at::equal(ls.member(0).get("x"), at::full({3}, 11.f)));
}

BOOST_AUTO_TEST_SUITE_END()
