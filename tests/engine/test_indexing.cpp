// Indexing on batch dims: td.index(idx) and td.index_put_(idx, value) against the same index on dense tensors
// (upstream test_getitem_batch_size, test_index_none, test_masking(_set), test_setitem*, test_tensordict_indexing,
// test_indexed_properties).
#include <type_traits>
#include <boost/test/unit_test.hpp>
#include <c10/core/InferenceMode.h>

#include "tensordict/index_math.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Ellipsis;
using at::indexing::None;
using at::indexing::Slice;

namespace {

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor longs2(std::vector<int64_t> v, int64_t rows) { return at::tensor(v, at::kLong).view({rows, -1}); }
at::Tensor bools(std::vector<int64_t> v, BatchSize shape) { return at::tensor(v, at::kLong).view(shape).to(at::kBool); }

BatchSize dense_size(const BatchSize& bs, const Index& idx) {
  at::Tensor r = at::zeros(bs).index(idx);
  return BatchSize(r.sizes().begin(), r.sizes().end());
}

bool what_has(const std::exception& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }

//! td.index(idx) must match torch: batch size of zeros(batch)[idx], every leaf leaf[idx'] where idx' is idx with
//! its Ellipsis expanded over the batch dims, views where torch gives views, non-tensors carried over
void check_index(const TensorDict& td, const Index& idx, const std::string& ctx) {
  TensorDict r = td.index(idx);
  const BatchSize want = dense_size(td.batch_size(), idx);
  const Index norm = convert_ellipsis(idx, td.batch_dims());
  zoo::check_leafwise(td, r, want, [&](const at::Tensor& t) { return t.index(norm); }, ctx + " " + index_repr(idx));
  if (td.contains("data") && td.is_non_tensor("data")) {
    BOOST_TEST(r.get_non_tensor("data") == td.get_non_tensor("data"), ctx);
  }
}

//! a TensorDict of the same structure with fn applied to each tensor leaf
TensorDict map_leaves(const TensorDict& td, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  TensorDict out(td.batch_size());
  for (auto& kv : td.items()) {
    if (kv.second.is_tensor()) {
      out.set(kv.first, fn(kv.second.tensor()));
    } else if (kv.second.is_tensordict()) {
      out.set(kv.first, map_leaves(kv.second.tensordict(), fn));
    } else {
      out.set(kv.first, kv.second);
    }
  }
  return out;
}

std::vector<at::Tensor> leaf_clones(const TensorDict& td) {
  std::vector<at::Tensor> out;
  for (auto& kv : zoo::leaves(td)) out.push_back(kv.second.clone());
  return out;
}

//! after td.index_put_(idx, value): every leaf equals its old value with leaf[idx'] = value leaf
void check_written(const TensorDict& td, const std::vector<at::Tensor>& before, const Index& idx,
                   const TensorDict& value, const std::string& ctx) {
  const Index norm = convert_ellipsis(idx, td.batch_dims());
  auto now = zoo::leaves(td);
  auto vals = zoo::leaves(value);
  BOOST_REQUIRE_EQUAL(now.size(), before.size());
  BOOST_REQUIRE_EQUAL(now.size(), vals.size());
  for (size_t i = 0; i < now.size(); ++i) {
    at::Tensor want = before[i].clone();
    want.index_put_(norm, vals[i].second);
    BOOST_TEST(at::equal(now[i].second, want), ctx << " " << index_repr(idx) << " leaf " << now[i].first);
  }
}

// indices over batch [4, 3, 2, 1] that torch accepts
std::vector<Index> index_zoo() {
  return {
      {0},
      {-1},
      {3},
      {Slice(1, 3)},
      {Slice(None, None, 2)},
      {Slice(1, None, 2)},
      {Slice(-3, -1)},
      {Slice(5, 10)},
      {Slice(0, 4)},
      {Slice(), 1},
      {Slice(), Slice(), 0},
      {0, 1},
      {-1, -1, -1, -1},
      {Ellipsis, 0},
      {Ellipsis, Slice(0, 1)},
      {0, Ellipsis, 0},
      {longs({0, 2})},
      {longs({-1, 0, 0})},
      {longs({2})},
      {at::tensor(int64_t{2})},
      {at::scalar_tensor(2, at::kLong)},
      {Slice(), at::scalar_tensor(-1, at::kLong)},
      {Slice(), longs({0, 2})},
      {longs2({0, 1, 2, 3}, 2)},
      {longs({0, 1}), longs({1, 2})},
      {longs({0, 1}), Slice(), longs({0, 1})},
      {0, longs({0, 2})},
      {Ellipsis, longs({0})},
      {bools({1, 0, 1, 1}, {4})},
      {bools({1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0}, {4, 3})},
      {Slice(), bools({0, 1, 1}, {3})},
      {at::tensor({1, 0, 1, 1}, at::kByte)},
      {true},
      {false},
      {Slice(), true},
      {at::ones({}, at::kBool)},
      {None, 0, Ellipsis, None},
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(indexing)

BOOST_AUTO_TEST_CASE(getitem_batch_size_matches_torch) {
  for (const BatchSize& bs : std::vector<BatchSize>{{4, 3, 2, 1}, {4, 3, 2, 5}}) {
    for (const auto& idx : index_zoo()) {
      BOOST_TEST(getitem_batch_size(bs, idx) == dense_size(bs, idx), index_repr(idx));
    }
  }
  // empty dims and 0-dim batches
  BOOST_TEST(getitem_batch_size({5, 0, 2}, {Slice(), Slice(), 1}) == BatchSize({5, 0}));
  BOOST_TEST(getitem_batch_size({5, 0, 2}, {longs({4, 0})}) == BatchSize({2, 0, 2}));
  BOOST_TEST(getitem_batch_size({}, {None}) == BatchSize({1}));
  BOOST_TEST(getitem_batch_size({}, {true}) == BatchSize({1}));
  BOOST_TEST(getitem_batch_size({}, {false}) == BatchSize({0}));
  BOOST_TEST(getitem_batch_size({10}, {Slice(2, 9, 3)}) == BatchSize({3}));
  BOOST_TEST(getitem_batch_size({10}, {Slice(-100, 100)}) == BatchSize({10}));
  BOOST_TEST(getitem_batch_size({10}, {Slice(8, 2)}) == BatchSize({0}));
  // int32 index tensors (torch 1.13 takes only int64) read as int64
  BOOST_TEST(getitem_batch_size({4, 3}, {Slice(), at::tensor({0, 2, 1}, at::kInt)}) == BatchSize({4, 3}));

  BOOST_CHECK_EXCEPTION(getitem_batch_size({4, 3}, {4}), IndexError,
                        [](const IndexError& e) { return what_has(e, "index 4 is out of bounds for dimension 0 with size 4"); });
  BOOST_CHECK_EXCEPTION(getitem_batch_size({4, 3}, {0, -4}), IndexError,
                        [](const IndexError& e) { return what_has(e, "index -4 is out of bounds for dimension 1 with size 3"); });
  BOOST_CHECK_EXCEPTION(getitem_batch_size({4, 3}, {0, 0, 0}), IndexError,
                        [](const IndexError& e) { return what_has(e, "too many indices for tensor of dimension 2"); });
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {Ellipsis, 0, Ellipsis}), RuntimeError);  // upstream
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {longs({0, 4})}), IndexError);
  // index tensors that do not broadcast together are a RuntimeError upstream (_getitem_batch_size); a mask
  // of the wrong shape on its own is torch's IndexError
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {bools({1, 0, 1}, {3})}), IndexError);
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {longs({0, 1}), longs({0, 1, 2})}), RuntimeError);  // no broadcast
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {at::ones({2})}), TypeError);
  BOOST_CHECK_THROW(getitem_batch_size({4, 3}, {Slice(None, None, -1)}), ValueError);
}

BOOST_AUTO_TEST_CASE(index_math_helpers) {
  BOOST_TEST(count_indexed_dims({None, 0, Ellipsis, Slice(), bools({1, 0, 1, 0}, {2, 2}), true}) == 4);
  Index e = convert_ellipsis({0, Ellipsis, None}, 4);
  BOOST_REQUIRE_EQUAL(e.size(), 5u);
  BOOST_TEST(e[0].is_integer());
  BOOST_TEST((e[1].is_slice() && e[2].is_slice() && e[3].is_slice()));
  BOOST_TEST(e[4].is_none());
  BOOST_TEST(index_preserves_data_ptr({0, None, Ellipsis, Slice(), Slice(None, 3)}));
  BOOST_TEST(!index_preserves_data_ptr({Slice(1, 3)}));
  BOOST_TEST(!index_preserves_data_ptr({longs({0})}));
  BOOST_TEST(is_full_slice_index({Slice(), Ellipsis}, 2));
  BOOST_TEST(!is_full_slice_index({Slice(), Slice(), Slice()}, 2));
  BOOST_TEST(!is_full_slice_index({Slice(0, 3)}, 2));
  auto r = slice_range(Slice(-7, None, 3), 10);
  BOOST_TEST((r.start == 3 && r.stop == 10 && r.step == 3 && r.length == 3));
  BOOST_TEST(wrap_index(-1, 5, 0) == 4);
  BOOST_CHECK_THROW(wrap_index(5, 5, 0), IndexError);
  BOOST_TEST(index_repr({0, Slice(1, 3), None, Ellipsis}) == "(0, slice(1, 3, None), None, Ellipsis)");
  BOOST_TEST(index_repr({-2}) == "(-2,)");
}

BOOST_AUTO_TEST_CASE(index_none_patterns_over_zoo) {
  // upstream test_index_none: (..., None), (None, ...), (None,), None, (:, None), (0, None), (None, :, :),
  // (None, ..., None), (None, 1, ..., None), (1, ..., None), (..., None, 0), ([1], ..., None)
  const std::vector<Index> patterns = {
      {Ellipsis, None}, {None, Ellipsis},       {None},           {None},
      {Slice(), None},  {0, None},              {None, Slice(), Slice()}, {None, Ellipsis, None},
      {None, 1, Ellipsis, None}, {1, Ellipsis, None}, {Ellipsis, None, 0}, {longs({1}), Ellipsis, None},
  };
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    for (const auto& idx : patterns) check_index(td, idx, kind.name);
  }
}

BOOST_AUTO_TEST_CASE(index_kinds_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    for (const auto& idx : index_zoo()) check_index(td, idx, kind.name);
  }
}

BOOST_AUTO_TEST_CASE(int32_index_tensors_read_as_int64) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    for (const auto& pair : std::vector<std::pair<Index, Index>>{
             {{at::tensor({2, 0}, at::kInt)}, {longs({2, 0})}},
             {{Slice(), at::tensor({-1}, at::kInt)}, {Slice(), longs({-1})}},
             {{at::scalar_tensor(1, at::kInt)}, {1}}}) {
      zoo::check_equal(td.index(pair.first), td.index(pair.second), kind.name + " " + index_repr(pair.first));
    }
  }
}

BOOST_AUTO_TEST_CASE(full_indices_return_self) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    BOOST_TEST(td.index({}).is_same(td), kind.name);
    BOOST_TEST(td.index({Ellipsis}).is_same(td), kind.name);
    BOOST_TEST(td.index({Slice()}).is_same(td), kind.name);
    BOOST_TEST(td.index({Slice(), Slice()}).is_same(td), kind.name);
    BOOST_TEST(td.index({Ellipsis, Slice()}).is_same(td), kind.name);
    BOOST_TEST(td.index({Slice(), Slice(), Slice(), Slice()}).is_same(td), kind.name);
    BOOST_TEST(!td.index({Slice(0, 4)}).is_same(td), kind.name);  // a new TensorDict over the same storage
    BOOST_TEST(zoo::all_alias(td.index({Slice(0, 4)}), td), kind.name);
    // upstream: full slices beyond the batch dims return the TensorDict too
    BOOST_TEST(td.index({Slice(), Slice(), Slice(), Slice(), Slice()}).is_same(td), kind.name);
  }
}

BOOST_AUTO_TEST_CASE(nested_batch_dims_are_kept) {
  TensorDict td = zoo::kinds()[1].make();  // nested_td: "nested" has batch [4, 3, 2, 1, 2]
  BOOST_TEST(td.index({1, Slice(0, 2)}).get_td("nested").batch_size() == BatchSize({2, 2, 1, 2}));
  BOOST_TEST(td.index({longs({0, 0, 1})}).get_td("nested").batch_size() == BatchSize({3, 3, 2, 1, 2}));
  BOOST_TEST(td.index({Ellipsis, None}).get_td("nested").batch_size() == BatchSize({4, 3, 2, 1, 1, 2}));
  // the nested index is the normalized one: the sub-TensorDict's own extra dim is not touched
  BOOST_TEST(td.index({Ellipsis, 0}).get_td("nested").batch_size() == BatchSize({4, 3, 2, 2}));
  BOOST_TEST(at::equal(td.index({Ellipsis, 0}).get({"nested", "x"}), td.get({"nested", "x"}).select(3, 0)));
}

BOOST_AUTO_TEST_CASE(index_writes_through_to_parent) {
  // upstream test_tensordict_indexing
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    TensorDict td = kind.make();
    TensorDict row = td.index({0});
    row.set_("a", at::zeros_like(row.get("a")));
    BOOST_TEST(td.get("a").index({0}).eq(0).all().item<bool>(), kind.name);
    BOOST_TEST(!td.get("a").index({1}).eq(0).all().item<bool>(), kind.name);
    TensorDict col = td.index({Slice(), 0});
    col.set_("b", at::ones_like(col.get("b")));
    BOOST_TEST(td.get("b").index({Slice(), 0}).eq(1).all().item<bool>(), kind.name);
    std::vector<TensorDict> rows;
    for (int64_t i = 0; i < td.len(); ++i) rows.push_back(td.index({i}));
    zoo::check_equal(tensordict::stack(rows, 0), td, kind.name + " stack(list(td))");
  }
}

BOOST_AUTO_TEST_CASE(masking) {
  // upstream test_masking: td[mask] == masked_select, batch_dims 1 for a full mask
  auto gen = at::detail::createCPUGenerator(3);
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    at::Tensor mask = at::rand({4, 3}, gen).gt(0.5);
    TensorDict r = td.index({mask});
    BOOST_TEST(r.batch_size() == BatchSize({mask.sum().item<int64_t>(), 2, 1}), kind.name);
    check_index(td, {mask}, kind.name);
    at::Tensor full = at::rand({4, 3, 2, 1}, gen).gt(0.5);
    TensorDict rf = td.index({full});
    BOOST_TEST(rf.batch_dims() == 1, kind.name);
    BOOST_TEST(rf.batch_size()[0] == full.sum().item<int64_t>(), kind.name);
    check_index(td, {full}, kind.name);
  }
}

BOOST_AUTO_TEST_CASE(masking_set) {
  // upstream test_masking_set: td[mask] = zeros zeroes exactly the masked rows of every leaf
  auto gen = at::detail::createCPUGenerator(5);
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    for (const BatchSize& mshape : std::vector<BatchSize>{{4}, {4, 3}, {4, 3, 2, 1}}) {
      TensorDict td = kind.make();
      at::Tensor mask = at::rand(mshape, gen).gt(0.5);
      auto before = leaf_clones(td);
      TensorDict value = map_leaves(td.index({mask}), [](const at::Tensor& t) { return at::zeros_like(t); });
      td.index_put_({mask}, value);
      check_written(td, before, {mask}, value, kind.name);
      for (auto& kv : zoo::leaves(td)) BOOST_TEST(kv.second.index({mask}).eq(0).all().item<bool>());
    }
  }
}

BOOST_AUTO_TEST_CASE(setitem_over_zoo) {
  // upstream test_setitem: td[idx] = td[idx].zero_() for int / slice / tensor / mask indices
  const std::vector<Index> indices = {{0},
                                      {-2},
                                      {Slice(1, 3)},
                                      {Slice(None, None, 2)},
                                      {Slice(), 1},
                                      {longs({0, 2})},
                                      {longs({-1, 1})},
                                      {bools({1, 0, 0, 1}, {4})},
                                      {Ellipsis, 0},
                                      {0, Slice(), longs({1, 0})},
                                      {None, 1},
                                      {true}};
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    for (const auto& idx : indices) {
      TensorDict td = kind.make();
      auto before = leaf_clones(td);
      TensorDict value = map_leaves(td.index(idx), [](const at::Tensor& t) { return at::full_like(t, 7); });
      td.index_put_(idx, value);
      check_written(td, before, idx, value, kind.name);
      if (td.contains("data")) BOOST_TEST(td.get_non_tensor("data") == JsonValue("a string"));
    }
  }
}

BOOST_AUTO_TEST_CASE(setitem_batch_mismatch) {
  TensorDict td = zoo::plain({4, 3, 2, 1});
  // upstream __setitem__ raises RuntimeError (test_setitem_refuses_values_whose_batch_does_not_fit)
  BOOST_CHECK_EXCEPTION(td.index_put_({Slice(0, 2)}, td.index({Slice(0, 3)}).clone()), RuntimeError,
                        [](const RuntimeError& e) {
                          return what_has(e, "indexed destination TensorDict batch size is torch.Size([2, 3, 2, 1])") &&
                                 what_has(e, "which differs from the source batch size torch.Size([3, 3, 2, 1])");
                        });
  BOOST_CHECK_THROW(td.index_put_({longs({0, 1})}, td.clone()), RuntimeError);
  BOOST_CHECK_THROW(td.index_put_({0}, td.index({Slice(), 0}).clone()), RuntimeError);
  // a value with the indexed batch but other feature shapes
  TensorDict bad(Dict{{"a", at::zeros({3, 2, 1, 4})}}, {3, 2, 1});
  BOOST_CHECK_THROW(td.index_put_({0}, bad), RuntimeError);
  // kinds must agree
  TensorDict wrong_kind(Dict{{"a", Dict{{"x", at::zeros({3, 2, 1})}}}}, {3, 2, 1});
  BOOST_CHECK_THROW(td.index_put_({0}, wrong_kind), TypeError);
  TensorDict nt(Dict{{"a", "text"}}, {3, 2, 1});
  BOOST_CHECK_THROW(td.index_put_({0}, nt), TypeError);
}

BOOST_AUTO_TEST_CASE(setitem_broadcast_on_the_left) {
  // upstream test_setitem_slice / test_setitem_ellipsis
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    TensorDict td = kind.make();
    TensorDict row0 = td.index({0}).clone();
    td.index_put_({Slice(0, 1)}, row0);  // td[:1] = td[0]
    zoo::check_equal(td.index({0}), row0, kind.name);

    td = kind.make();
    TensorDict v = td.index({0, Slice(), 0}).clone();  // batch [3, 1]
    auto before = leaf_clones(td);
    td.index_put_({Slice(0, 2), Slice(), 0}, v);  // td[:2, :, 0] = td[0, :, 0]
    auto now = zoo::leaves(td);
    for (size_t i = 0; i < now.size(); ++i) {
      at::Tensor want = before[i].clone();
      want.index_put_({Slice(0, 2), Slice(), 0}, before[i].index({0, Slice(), 0}));
      BOOST_TEST(at::equal(now[i].second, want), kind.name << " leaf " << now[i].first);
    }

    td = kind.make();
    before = leaf_clones(td);
    TensorDict v2 = map_leaves(td.index({Ellipsis, 0, 0}), [](const at::Tensor& t) { return at::full_like(t, 3); });
    td.index_put_({Ellipsis, 0, 0}, v2.index({0}).clone());  // batch [3] broadcast to [4, 3]
    now = zoo::leaves(td);
    for (size_t i = 0; i < now.size(); ++i) {
      BOOST_TEST(now[i].second.index({Slice(), Slice(), 0, 0}).eq(3).all().item<bool>(), kind.name);
      BOOST_TEST(at::equal(now[i].second.index({Slice(), Slice(), 1}), before[i].index({Slice(), Slice(), 1})));
    }
  }
}

BOOST_AUTO_TEST_CASE(setitem_rebatches_a_copy_of_the_value) {
  // a value whose batch is a prefix of the indexed batch: its leaves fit, so a shallow copy is re-batched
  TensorDict td = zoo::plain({4, 3});
  TensorDict v(Dict{{"a", at::ones({3, 5})}, {"b", at::ones({3, 1, 10})}, {"c", at::ones({3, 3}, at::kLong)}}, {});
  td.index_put_({1}, v);
  BOOST_TEST(td.get("a").index({1}).eq(1).all().item<bool>());
  BOOST_TEST(v.batch_size().empty());  // the caller's value is untouched
}

BOOST_AUTO_TEST_CASE(setitem_refuses_a_row_without_batch_dims) {
  // upstream: a value of batch [] is re-batched to the indexed batch or refused (`indexed_bs[-0:]` is the
  // whole indexed batch, so it is never broadcast on the left); nothing is written or preallocated
  TensorDict td = zoo::plain({4, 3});
  TensorDict row(Dict{{"a", at::full({5}, 2.0)}, {"b", at::full({1, 10}, 3.0)}, {"c", at::full({3}, 4, at::kLong)},
                      {"sub", Dict{{"x", at::ones({2})}}}},
                 {});
  auto before = leaf_clones(td);
  BOOST_CHECK_THROW(td.index_put_({Slice(0, 2)}, row), RuntimeError);
  BOOST_TEST(!td.contains("sub"));
  BOOST_TEST(at::equal(td.get("a"), before[0]));
  // a value with batch dims that are not the trailing indexed dims raises too
  BOOST_CHECK_THROW(td.index_put_({Slice(0, 2)}, TensorDict(Dict{{"a", at::zeros({4, 5})}}, {4})), RuntimeError);
}

BOOST_AUTO_TEST_CASE(setitem_tensor_and_scalar) {
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable) continue;
    TensorDict td = kind.make();
    td.index_put_({1}, at::Scalar(2.5));
    for (auto& kv : zoo::leaves(td)) {
      at::Tensor want = kv.second.scalar_type() == at::kLong ? at::tensor(2) : at::tensor(2.5);
      BOOST_TEST(kv.second.index({1}).eq(want).all().item<bool>(), kind.name << " " << kv.first);
    }
    // a number through an index list is an int64 tensor written with index_put_ upstream: refused by the
    // float leaves (test_setitem_scalar_through_index_put_needs_the_dtype), nothing written
    BOOST_CHECK_THROW(td.index_put_({longs({0, 3}), Slice(), 1}, at::Scalar(-1)), RuntimeError);
    for (auto& kv : zoo::leaves(td)) BOOST_TEST(!kv.second.index({3, Slice(), 1}).eq(-1).all().item<bool>());
    td.index_put_({Slice(2, 4)}, at::tensor(4.0));
    for (auto& kv : zoo::leaves(td)) BOOST_TEST(kv.second.index({Slice(2, 4)}).eq(4).all().item<bool>());
    at::Tensor mask = bools({1, 0, 0, 0}, {4});
    // advanced indexing keeps torch's rule: the value must have the leaf's dtype (an int64 tensor into a
    // float leaf raises, as upstream's tensor[mask] = value); a number is cast
    BOOST_CHECK_THROW(td.index_put_({mask}, at::tensor(9)), RuntimeError);
    td.index_put_({mask}, at::Scalar(9));
    for (auto& kv : zoo::leaves(td)) BOOST_TEST(kv.second.index({0}).eq(9).all().item<bool>());
    if (td.contains("data")) BOOST_TEST(td.get_non_tensor("data") == JsonValue("a string"));
  }
  TensorDict td = zoo::plain({4});
  BOOST_CHECK_THROW(td.index_put_({0}, at::ones({7})), RuntimeError);  // does not broadcast to any leaf
  BOOST_CHECK_THROW(td.index_put_({4}, at::Scalar(1)), IndexError);
  BOOST_CHECK_THROW(td.index_put_({0}, at::Tensor()), TypeError);
}

BOOST_AUTO_TEST_CASE(zero_dim_tensordict) {
  TensorDict td(Dict{{"a", at::arange(3)}, {"s", "str"}}, {});
  for (const Index& idx : std::vector<Index>{{0}, {longs({0})}, {Slice(0, 1)}, {None, 0}, {false}}) {
    BOOST_CHECK_EXCEPTION(td.index(idx), RuntimeError, [](const RuntimeError& e) {
      return what_has(e, "indexing a tensordict with td.batch_dims==0 is not permitted");
    });
  }
  BOOST_TEST(td.index({}).is_same(td));
  BOOST_TEST(td.index({Ellipsis}).is_same(td));
  for (const Index& idx : std::vector<Index>{{None}, {true}, {at::ones({}, at::kBool)}, {None, None}}) {
    TensorDict r = td.index(idx);
    BOOST_TEST(r.batch_size() == dense_size({}, idx), index_repr(idx));
    BOOST_TEST(at::equal(r.get("a"), at::arange(3).index(idx)));
    BOOST_TEST(r.get_entry("s").shape() == r.batch_size());
  }
  BOOST_TEST(td.index({at::zeros({}, at::kBool)}).batch_size() == BatchSize({0}));
  // writes: None / True write the whole thing, other indices raise
  td.index_put_({None}, TensorDict(Dict{{"a", at::full({1, 3}, 5, at::kLong)}}, {1}));
  BOOST_TEST(at::equal(td.get("a"), at::full({3}, 5, at::kLong)));
  td.index_put_({}, TensorDict(Dict{{"a", at::full({3}, 6, at::kLong)}}, {}));
  BOOST_TEST(at::equal(td.get("a"), at::full({3}, 6, at::kLong)));
  BOOST_CHECK_THROW(td.index_put_({0}, TensorDict(Dict{{"a", at::zeros({}, at::kLong)}}, {})), RuntimeError);
  BOOST_CHECK_THROW(td.index_put_({0}, at::Scalar(1)), RuntimeError);
}

BOOST_AUTO_TEST_CASE(index_errors) {
  TensorDict td = zoo::plain({4, 3});
  BOOST_CHECK_EXCEPTION(td.index({4}), IndexError, [](const IndexError& e) {
    return what_has(e, "index 4 is out of bounds for dimension 0 with size 4");
  });
  BOOST_CHECK_THROW(td.index({-5}), IndexError);
  BOOST_CHECK_THROW(td.index({0, 3}), IndexError);
  BOOST_CHECK_EXCEPTION(td.index({0, 0, 0}), IndexError,
                        [](const IndexError& e) { return what_has(e, "too many indices for tensor of dimension 2"); });
  BOOST_CHECK_THROW(td.index({Ellipsis, 0, 0, 0}), IndexError);
  BOOST_CHECK_THROW(td.index({Ellipsis, Ellipsis}), RuntimeError);  // upstream convert_ellipsis_to_idx
  BOOST_CHECK_EXCEPTION(td.index({longs({0, 4})}), IndexError, [](const IndexError& e) {
    return what_has(e, "index 4 is out of bounds for dimension 0 with size 4");
  });
  BOOST_CHECK_THROW(td.index({longs({-5})}), IndexError);
  BOOST_CHECK_THROW(td.index({Slice(), longs({3})}), IndexError);
  BOOST_CHECK_THROW(td.index({longs2({0, 9}, 1)}), IndexError);
  BOOST_CHECK_THROW(td.index({bools({1, 0, 1}, {3})}), IndexError);  // mask of the wrong shape (upstream: torch's)
  BOOST_CHECK_THROW(td.index({bools({1, 0, 1, 0}, {2, 2})}), IndexError);
  BOOST_CHECK_EXCEPTION(td.index({at::tensor({0.0, 1.0})}), TypeError,
                        [](const TypeError& e) { return what_has(e, "tensors used as indices must be long"); });
  BOOST_CHECK_THROW(td.index({at::tensor(1.0)}), TypeError);
  BOOST_CHECK_THROW(td.index({at::Tensor()}), TypeError);
  BOOST_CHECK_THROW(td.index({Slice(None, None, -1)}), ValueError);
  // the same errors on writes, and nothing is written
  auto before = leaf_clones(td);
  TensorDict v = td.index({0}).clone();
  BOOST_CHECK_THROW(td.index_put_({4}, v), IndexError);
  BOOST_CHECK_THROW(td.index_put_({0, 0, 0}, v), RuntimeError);  // too many indices in a write (upstream)
  BOOST_CHECK_THROW(td.index_put_({at::tensor({0.5})}, v), TypeError);
  BOOST_CHECK_THROW(td.index_put_({longs({7})}, td.index({longs({0})}).clone()), IndexError);
  auto now = zoo::leaves(td);
  for (size_t i = 0; i < now.size(); ++i) BOOST_TEST(at::equal(now[i].second, before[i]));
}

BOOST_AUTO_TEST_CASE(indexed_properties) {
  // upstream test_indexed_properties + _index_preserve_data_ptr: flags (and the lock) survive view-preserving
  // indices of memmap / shared TensorDicts only
  TensorDict shared = zoo::plain({4, 3});
  shared.share_memory_();
  for (const Index& idx : std::vector<Index>{{0}, {None}, {Ellipsis, 1}, {Slice(0, 2)}, {Slice(None, 3), 0}}) {
    TensorDict r = shared.index(idx);
    BOOST_TEST(r.is_shared(), index_repr(idx));
    BOOST_TEST(r.is_locked(), index_repr(idx));
    BOOST_TEST(!r.is_memmap());
  }
  for (const Index& idx : std::vector<Index>{{Slice(1, 3)}, {longs({0, 1})}, {bools({1, 0, 1, 1}, {4})}}) {
    TensorDict r = shared.index(idx);
    BOOST_TEST(!r.is_shared(), index_repr(idx));
    BOOST_TEST(!r.is_locked(), index_repr(idx));
  }
  TensorDict mm = zoo::plain({4, 3});
  mm.memmap_();
  BOOST_TEST(mm.index({0}).is_memmap());
  BOOST_TEST(mm.index({0}).is_locked());
  BOOST_TEST(!mm.index({Slice(2, 4)}).is_memmap());
  // a plain locked TensorDict gives unlocked results (upstream locks only for memmap / shared)
  TensorDict locked = zoo::plain({4, 3});
  locked.lock_();
  BOOST_TEST(!locked.index({0}).is_locked());
  BOOST_TEST(!locked.index({0}).is_shared());
}

BOOST_AUTO_TEST_CASE(non_tensor_entries) {
  TensorDict td(Dict{{"x", at::arange(6).view({2, 3})}}, {2, 3});
  td.set("name", "same");
  td.set("ids", NonTensorStack({"a", "b", "c", "d", "e", "f"}, {2, 3}));
  TensorDict r = td.index({Slice(), longs({2, 0})});
  BOOST_TEST(r.get_non_tensor("name") == JsonValue("same"));
  BOOST_TEST(r.get_entry("name").shape() == BatchSize({2, 2}));
  BOOST_TEST(r.get_non_tensor("ids") ==
             JsonValue(JsonValue::Array{JsonValue::Array{"c", "a"}, JsonValue::Array{"f", "d"}}));
  BOOST_TEST(td.index({1, 1}).get_non_tensor("ids") == JsonValue("e"));
  // writes: a different value somewhere turns NonTensorData into a stack; the same value changes nothing
  TensorDict v(Dict{{"name", "same"}, {"ids", "z"}}, {3});
  td.index_put_({0}, v);
  BOOST_TEST(td.get_entry("name").is_non_tensor_data());
  BOOST_TEST(td.get_non_tensor("ids") ==
             JsonValue(JsonValue::Array{JsonValue::Array{"z", "z", "z"}, JsonValue::Array{"d", "e", "f"}}));
  td.index_put_({1, Slice(1, 3)}, TensorDict(Dict{{"name", "other"}}, {2}));
  BOOST_TEST(td.get_entry("name").is_non_tensor_stack());
  BOOST_TEST(td.get_non_tensor("name") == JsonValue(JsonValue::Array{JsonValue::Array{"same", "same", "same"},
                                                                     JsonValue::Array{"same", "other", "other"}}));
  // a NonTensorStack value written at a mask
  TensorDict sv(Dict{}, {2});
  sv.set("ids", NonTensorStack({"p", "q"}, {2}));
  td.index_put_({bools({1, 0, 0, 1, 0, 0}, {2, 3})}, sv);
  BOOST_TEST(td.get_non_tensor("ids") ==
             JsonValue(JsonValue::Array{JsonValue::Array{"p", "z", "z"}, JsonValue::Array{"q", "e", "f"}}));
}

BOOST_AUTO_TEST_CASE(non_tensor_in_shared_tensordict) {
  // upstream: a NonTensorData of a shared / memmap TensorDict cannot become a stack
  TensorDict td(Dict{{"x", at::zeros({4})}, {"val", "zero"}}, {4});
  td.share_memory_();
  td.index_put_({Slice(1, None, 2)}, TensorDict(Dict{{"x", at::ones({2})}, {"val", "zero"}}, {2}));
  BOOST_TEST(at::equal(td.get("x"), at::tensor({0.f, 1.f, 0.f, 1.f})));
  BOOST_CHECK_EXCEPTION(td.index_put_({Slice(1, None, 2)}, TensorDict(Dict{{"val", "one"}}, {2})), RuntimeError,
                        [](const RuntimeError& e) {
                          return what_has(e, "You're attempting to update a leaf in-place with a shared");
                        });
  BOOST_TEST(td.get_non_tensor("val") == JsonValue("zero"));
}

BOOST_AUTO_TEST_CASE(large_gathers_match_torch) {
  // gathers of 1 MiB and more get their own buffers: same values, independent of the source, reusable
  auto gen = at::detail::createCPUGenerator(11);
  for (int round = 0; round < 3; ++round) {
    TensorDict td(Dict{{"x", at::randn({20000, 64}, gen)}, {"i", at::randint(0, 9, {20000, 16}, gen, at::kLong)}},
                  {20000});
    at::Tensor mask = at::rand({20000}, gen).gt(0.3);
    at::Tensor rows = at::randint(-20000, 20000, {6000}, gen, at::kLong);
    TensorDict m = td.index({mask});
    TensorDict r = td.index({rows});
    BOOST_TEST(at::equal(m.get("x"), td.get("x").index({mask})));
    BOOST_TEST(at::equal(m.get("i"), td.get("i").index({mask})));
    BOOST_TEST(at::equal(r.get("x"), td.get("x").index({rows})));
    BOOST_TEST(r.get("x").is_contiguous());
    at::Tensor keep = td.get("x").index({rows});
    r.get("x").zero_();  // a copy, not a view of td
    BOOST_TEST(at::equal(td.get("x").index({rows}), keep));
    td = TensorDict();  // the results outlive their source
    BOOST_TEST(at::equal(m.get("x").sum(), m.get("x").clone().sum()));
  }
}

BOOST_AUTO_TEST_CASE(fast_row_writes_match_torch) {
  // the memcpy path and its fallbacks: same results as leaf[idx] = v
  TensorDict td(Dict{{"f", at::zeros({6, 4})}, {"d", at::zeros({6, 2}, at::kDouble)}, {"i", at::zeros({6}, at::kInt)}},
                {6});
  TensorDict v(Dict{{"f", at::arange(4).to(at::kFloat)}, {"d", at::ones({2}, at::kFloat)}, {"i", at::scalar_tensor(3, at::kLong)}}, {});
  td.index_put_({2}, v);  // f: memcpy, d and i: dtype conversion
  BOOST_TEST(at::equal(td.get("f")[2], at::arange(4).to(at::kFloat)));
  BOOST_TEST(at::equal(td.get("d")[2], at::ones({2}, at::kDouble)));
  BOOST_TEST(td.get("i")[2].item<int>() == 3);
  TensorDict rows(Dict{{"f", at::arange(8).view({2, 4}).to(at::kFloat)},
                       {"d", at::ones({2, 2}, at::kDouble)},
                       {"i", at::tensor({7, 8}, at::kInt)}},
                  {2});
  td.index_put_({Slice(3, 5)}, rows);
  td.index_put_({Slice(0, 4, 3)}, rows);  // rows 0 and 3, strided
  BOOST_TEST(at::equal(td.get("f").index({Slice(4, 5)}), rows.get("f").index({Slice(1, 2)})));
  BOOST_TEST(at::equal(td.get("f").index({longs({0, 3})}), rows.get("f")));
  BOOST_TEST(at::equal(td.get("i"), at::tensor({7, 0, 3, 8, 8, 0}, at::kInt)));
  // the value aliases the destination (td[0] = td[1]), and a non-contiguous destination
  td.index_put_({0}, td.index({4}));
  BOOST_TEST(at::equal(td.get("f")[0], td.get("f")[4]));
  TensorDict t2(Dict{{"f", at::zeros({4, 6}).t()}}, {6});
  t2.index_put_({1}, TensorDict(Dict{{"f", at::ones({4})}}, {}));
  BOOST_TEST(t2.get("f")[1].eq(1).all().item<bool>());
  BOOST_TEST(t2.get("f").sum().item<float>() == 4.f);
  // a value of the wrong row shape is an error, not a partial write
  BOOST_CHECK_THROW(td.index_put_({1}, TensorDict(Dict{{"f", at::ones({5})}}, {})), RuntimeError);
  // version counter bumps, as for an in-place torch write
  auto version = td.get("f")._version();
  td.index_put_({5}, TensorDict(Dict{{"f", at::ones({4})}}, {}));
  BOOST_TEST(td.get("f")._version() > version);
}

// td[i] = row through the one-row path (put_row_fast) and each case it hands to the general path: the same results
BOOST_AUTO_TEST_CASE(one_row_reads_are_views_that_count_as_the_source) {
  // td[i] of plain leaves is made without the dispatcher: still a view of the source's storage, and an in-place
  // write through it moves the source's version counter (what autograd checks a saved tensor against)
  TensorDict td(Dict{{"a", at::arange(12, at::kFloat).reshape({4, 3})}, {"b", at::arange(4, at::kLong)}}, {4});
  TensorDict row = td.index({2});
  BOOST_TEST(at::equal(row.get("a"), at::tensor({6.f, 7.f, 8.f})));
  BOOST_TEST(row.get("b").item<int64_t>() == 2);
  BOOST_TEST(row.get("a").dim() == 1);
  BOOST_TEST(row.get("a").is_contiguous());
  const int64_t before = td.get("a")._version();
  row.get("a").add_(1);
  BOOST_TEST(td.get("a")._version() > before);
  BOOST_TEST(at::equal(td.get("a")[2], at::tensor({7.f, 8.f, 9.f})));
  BOOST_TEST(at::equal(td.index({-1}).get("a"), at::tensor({9.f, 10.f, 11.f})));
  // a non-contiguous leaf (a transposed one): the row's strides are the source's
  TensorDict t(Dict{{"x", at::arange(6, at::kFloat).reshape({3, 2}).t()}}, {2});
  BOOST_TEST(at::equal(t.index({1}).get("x"), at::tensor({1.f, 3.f, 5.f})));
  // a leaf that requires grad: torch's select, which records the graph
  at::Tensor w = at::ones({3, 2}).requires_grad_(true);
  TensorDict g(Dict{{"w", w}}, {3});
  at::Tensor r = g.index({1}).get("w");
  BOOST_TEST(r.grad_fn() != nullptr);
  r.sum().backward();
  BOOST_TEST(at::equal(w.grad(), at::tensor({0.f, 0.f, 1.f, 1.f, 0.f, 0.f}).reshape({3, 2})));
  // under InferenceMode: torch's select (an inference view)
  {
    c10::InferenceMode guard;
    BOOST_TEST(at::equal(td.index({0}).get("a"), at::tensor({0.f, 1.f, 2.f})));
  }
}

//! every write of one_row_writes_fast_and_their_fallbacks through `put(td, row, value)`: td[row] = value
template <class Put>
void check_one_row_writes(Put put) {
  auto make = [] {
    TensorDict sub(Dict{{"z", at::zeros({5, 3, 2})}}, {5, 3});
    TensorDict td(Dict{{"a", at::zeros({5, 4})}, {"b", at::zeros({5}, at::kLong)}}, {5});
    td.set("sub", sub);
    return td;
  };
  auto row = [](float v) {
    TensorDict r(Dict{{"a", at::full({4}, v)}, {"b", at::scalar_tensor(static_cast<int64_t>(v), at::kLong)}}, {});
    r.set("sub", TensorDict(Dict{{"z", at::full({3, 2}, v)}}, {3}));
    return r;
  };
  TensorDict td = make();
  put(td, 1, row(1));
  put(td, -1, row(4));  // negative: the last row
  BOOST_TEST(at::equal(td.get("a")[1], at::full({4}, 1.f)));
  BOOST_TEST(at::equal(td.get({"sub", "z"})[1], at::full({3, 2}, 1.f)));
  BOOST_TEST(td.get("b")[4].item<int64_t>() == 4);
  BOOST_TEST(at::equal(td.get({"sub", "z"})[4], at::full({3, 2}, 4.f)));
  BOOST_TEST(td.get("a").sum().item<float>() == 4.f + 16.f);
  // out of range: upstream's IndexError, nothing written
  BOOST_CHECK_THROW(put(td, 5, row(9)), IndexError);
  BOOST_TEST(td.get("a").sum().item<float>() == 20.f);
  // keys in another order and a key the destination lacks: the general path (by key; the new key preallocated)
  TensorDict swapped(Dict{{"b", at::scalar_tensor(int64_t{7}, at::kLong)}, {"a", at::full({4}, 7.f)}}, {});
  put(td, 2, swapped);
  BOOST_TEST(at::equal(td.get("a")[2], at::full({4}, 7.f)));
  BOOST_TEST(td.get("b")[2].item<int64_t>() == 7);
  TensorDict extra = row(3);
  extra.set("c", at::full({2}, 3.f));
  put(td, 3, extra);
  BOOST_TEST(at::equal(td.get("c"), at::cat({at::zeros({3, 2}), at::full({1, 2}, 3.f), at::zeros({1, 2})})));
  // a destination leaf that requires grad: torch's copy_ (autograd records the write), as the general path does
  TensorDict g(Dict{{"w", at::zeros({3, 2}).requires_grad_(true).clone()}}, {3});
  at::Tensor src = at::ones({2}).requires_grad_(true);
  put(g, 0, TensorDict(Dict{{"w", src}}, {}));
  g.get("w").sum().backward();
  BOOST_TEST(src.grad().defined());
  BOOST_TEST(at::equal(src.grad(), at::ones({2})));
  // a value that requires grad into a plain destination: torch's copy_ too (the destination joins the graph)
  TensorDict plain(Dict{{"w", at::zeros({3, 2})}}, {3});
  at::Tensor src2 = at::full({2}, 2.f).requires_grad_(true);
  put(plain, 1, TensorDict(Dict{{"w", src2}}, {}));
  BOOST_TEST(plain.get("w").requires_grad());
  (plain.get("w") * 3).sum().backward();
  BOOST_TEST(src2.grad().defined());
  if (src2.grad().defined()) BOOST_TEST(at::equal(src2.grad(), at::full({2}, 3.f)));
  // a value with the conj bit or the neg bit (lazy views: their bytes are not their values): the general path
  TensorDict c(Dict{{"x", at::zeros({2, 2}, at::kComplexFloat)}}, {2});
  put(c, 1, TensorDict(Dict{{"x", at::complex(at::ones({2}), at::ones({2})).conj()}}, {}));
  BOOST_TEST(at::equal(c.get("x")[1], at::complex(at::ones({2}), -at::ones({2}))));
  TensorDict n(Dict{{"y", at::zeros({2, 2})}}, {2});
  put(n, 1, TensorDict(Dict{{"y", at::_neg_view(at::ones({2}))}}, {}));
  BOOST_TEST(at::equal(n.get("y")[1], -at::ones({2})));
  // a row of the destination itself (one storage): the general path
  TensorDict self = make();
  put(self, 1, row(5));
  put(self, 0, self.index({1}));
  BOOST_TEST(at::equal(self.get("a")[0], at::full({4}, 5.f)));
  BOOST_TEST(at::equal(self.get({"sub", "z"})[0], at::full({3, 2}, 5.f)));
  // a row made under InferenceMode (no autograd keys: the fast path) and a ZeroTensor row (its ZeroTensor key and
  // no bytes: the general path), both written as their values
  TensorDict inf(Dict{{"x", at::zeros({2, 2})}}, {2});
  {
    c10::InferenceMode guard;
    put(inf, 1, TensorDict(Dict{{"x", at::full({2}, 3.f)}}, {}));
  }
  BOOST_TEST(at::equal(inf.get("x")[1], at::full({2}, 3.f)));
  put(inf, 1, TensorDict(Dict{{"x", at::_efficientzerotensor({2})}}, {}));
  BOOST_TEST(at::equal(inf.get("x"), at::zeros({2, 2})));
  // a row of another dtype: converted by the general path
  TensorDict d(Dict{{"x", at::zeros({2, 2}, at::kDouble)}}, {2});
  put(d, 1, TensorDict(Dict{{"x", at::ones({2}, at::kFloat)}}, {}));
  BOOST_TEST(at::equal(d.get("x")[1], at::ones({2}, at::kDouble)));
}

BOOST_AUTO_TEST_CASE(one_row_writes_fast_and_their_fallbacks) {
  check_one_row_writes([](TensorDict& td, int64_t row, const TensorDict& v) { td.index_put_({row}, v); });
}

// the same writes through index_put_(row, value) (an integer row, no Index built): the fast path and every
// fallback alike; a bool is not a row
template <class T, class = void>
struct takes_a_row : std::false_type {};
template <class T>
struct takes_a_row<T, std::void_t<decltype(std::declval<TensorDict&>().index_put_(std::declval<T>(),
                                                                     std::declval<const TensorDict&>()))>>
    : std::true_type {};
static_assert(takes_a_row<int>::value && takes_a_row<int64_t>::value && takes_a_row<size_t>::value);
static_assert(!takes_a_row<bool>::value);

BOOST_AUTO_TEST_CASE(one_row_writes_with_an_integer_row) {
  check_one_row_writes([](TensorDict& td, int64_t row, const TensorDict& v) { td.index_put_(row, v); });
  // an int and a size_t row, and the version bump of an in-place write
  TensorDict td(Dict{{"f", at::zeros({3, 2})}}, {3});
  const int64_t version = td.get("f")._version();
  td.index_put_(int{1}, TensorDict(Dict{{"f", at::ones({2})}}, {}));
  td.index_put_(size_t{2}, TensorDict(Dict{{"f", at::full({2}, 2.f)}}, {}));
  BOOST_TEST(at::equal(td.get("f"), at::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f}).reshape({3, 2})));
  BOOST_TEST(td.get("f")._version() > version);
  BOOST_CHECK_THROW(td.index_put_(-4, TensorDict(Dict{{"f", at::ones({2})}}, {})), IndexError);
  BOOST_CHECK_THROW(td.index_put_(0, TensorDict(std::shared_ptr<TensorDictImpl>())), TypeError);  // undefined
  // {true} stays torch's bool index (every row, the value broadcast), not row 1
  td.index_put_({true}, TensorDict(Dict{{"f", at::full({2}, 7.f)}}, {}));
  BOOST_TEST(at::equal(td.get("f"), at::full({3, 2}, 7.f)));
  // a lazy stack's row: the node's own index_put_ (Node::put_row)
  TensorDict stacked = lazy_stack({TensorDict(Dict{{"f", at::zeros({2})}}, {}), TensorDict(Dict{{"f", at::zeros({2})}}, {})});
  stacked.index_put_(1, TensorDict(Dict{{"f", at::ones({2})}}, {}));
  BOOST_TEST(at::equal(stacked.get("f"), at::tensor({0.f, 0.f, 1.f, 1.f}).reshape({2, 2})));
}

// the one-row path matches the value's keys to the destination's by position, comparing them by words: a key of
// any length that differs from the destination's in any one byte is another key (the general path then writes it
// under its own name, the destination's leaf keeps its row), and the same key of any length is written in place
BOOST_AUTO_TEST_CASE(one_row_writes_tell_keys_apart_by_every_byte) {
  int wrong_leaf = 0, wrong_new_key = 0, wrong_same_key = 0;
  for (size_t len = 1; len <= 40; ++len) {
    std::string key;
    for (size_t i = 0; i < len; ++i) key.push_back(static_cast<char>('a' + i % 26));
    TensorDict same(Dict{{key, at::zeros({3, 2})}}, {3});
    same.index_put_(1, TensorDict(Dict{{key, at::ones({2})}}, {}));
    if (!at::equal(same.get(key), at::tensor({0.f, 0.f, 1.f, 1.f, 0.f, 0.f}).reshape({3, 2}))) ++wrong_same_key;
    for (size_t at_byte = 0; at_byte < len; ++at_byte) {
      std::string other = key;
      other[at_byte] = 'Z';
      TensorDict td(Dict{{key, at::zeros({3, 2})}}, {3});
      td.index_put_(1, TensorDict(Dict{{other, at::ones({2})}}, {}));
      if (!at::equal(td.get(key), at::zeros({3, 2}))) ++wrong_leaf;
      if (!td.contains(other) || !at::equal(td.get(other)[1], at::ones({2}))) ++wrong_new_key;
    }
  }
  BOOST_TEST(wrong_same_key == 0);
  BOOST_TEST(wrong_leaf == 0);
  BOOST_TEST(wrong_new_key == 0);
}

// a leaf set_ to fewer rows behind the TensorDict's back (its batch size still says 5): a row past the leaf's own
// is an error, read or written, by the one-row paths and the general path's memcpy alike, and nothing past the
// leaf's rows is written (its storage is the first two rows of a buffer whose other rows are sentinels)
BOOST_AUTO_TEST_CASE(rows_past_a_leaf_shrunk_behind_the_tensordicts_back) {
  at::Tensor backing = at::full({5, 4}, 7.f);
  auto make = [&] {
    backing.fill_(7.f);
    TensorDict td(Dict{{"a", at::zeros({5, 4})}}, {5});
    td.get("a").set_(backing.storage(), 0, {2, 4}, {4, 1});
    return td;
  };
  auto sentinels_kept = [&] { return at::equal(backing.index({Slice(2, None)}), at::full({3, 4}, 7.f)); };
  const TensorDict row(Dict{{"a", at::ones({4})}}, {});
  BOOST_CHECK_THROW(make().index_put_(4, row), IndexError);
  BOOST_TEST(sentinels_kept());
  BOOST_CHECK_THROW(make().index_put_({4}, row), IndexError);
  BOOST_TEST(sentinels_kept());
  BOOST_CHECK_THROW(make().index_put_({Slice(3, 5)}, TensorDict(Dict{{"a", at::ones({2, 4})}}, {2})), Error);
  BOOST_TEST(sentinels_kept());
  BOOST_CHECK_THROW(make().index_put_({Slice(0, 5, 2)}, TensorDict(Dict{{"a", at::ones({3, 4})}}, {3})), Error);
  BOOST_TEST(sentinels_kept());
  BOOST_CHECK_THROW(make().index_put_({4}, at::ones({4})), IndexError);
  BOOST_TEST(sentinels_kept());
  BOOST_CHECK_THROW(make().index({4}), IndexError);
  // the leaf's own rows still take the fast paths
  TensorDict td = make();
  td.index_put_(1, row);
  BOOST_TEST(at::equal(td.index({1}).get("a"), at::ones({4})));
  BOOST_TEST(at::equal(backing[1], at::ones({4})));
  BOOST_TEST(sentinels_kept());
}

// a row of more leaves than the one-row path keeps on the stack (16), nested and flat: every leaf written
BOOST_AUTO_TEST_CASE(one_row_writes_of_many_leaves) {
  for (int leaves : {15, 16, 17, 40}) {
    Dict dst_leaves, row_leaves, sub_dst, sub_row;
    for (int k = 0; k < leaves; ++k) {
      dst_leaves.emplace_back("k" + std::to_string(k), at::zeros({4, 3}));
      row_leaves.emplace_back("k" + std::to_string(k), at::full({3}, static_cast<float>(k + 1)));
      sub_dst.emplace_back("s" + std::to_string(k), at::zeros({4}, at::kLong));
      sub_row.emplace_back("s" + std::to_string(k), at::scalar_tensor(int64_t{k + 100}, at::kLong));
    }
    TensorDict td(dst_leaves, {4});
    td.set("sub", TensorDict(sub_dst, {4}));
    TensorDict row(row_leaves, {});
    row.set("sub", TensorDict(sub_row, {}));
    td.index_put_(2, row);
    int wrong = 0;
    for (int k = 0; k < leaves; ++k) {
      const at::Tensor f = td.get("k" + std::to_string(k));
      if (!at::equal(f[2], at::full({3}, static_cast<float>(k + 1))) || f.sum().item<float>() != 3.f * (k + 1)) ++wrong;
      const at::Tensor s = td.get({"sub", "s" + std::to_string(k)});
      if (s[2].item<int64_t>() != k + 100 || s.sum().item<int64_t>() != k + 100) ++wrong;
    }
    BOOST_TEST(wrong == 0, leaves << " leaves: " << wrong << " wrong");
  }
}

BOOST_AUTO_TEST_SUITE_END()
