// Upstream parity (issue 15): the behaviours where the engine used to differ from Python tensordict v0.14,
// over every node kind of the conformance zoo. Each test names the upstream behaviour it pins down; the
// exception classes are upstream's (RuntimeError / ValueError / IndexError / AssertionError / AttributeError).
#include <map>

#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"

using namespace tensordict;
using namespace at::indexing;
using conformance::Member;

namespace {

using conformance::for_each_member;

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor mask(std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); }

//! the common tensor leaves a, b, c of td equal those of ref
bool abc_equal(const TensorDict& td, const TensorDict& ref) {
  for (const char* k : {"a", "b", "c"})
    if (!td.get(k).equal(ref.get(k))) return false;
  return true;
}

bool has(const std::exception& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

//! a TensorDict with the leaves a, b, c of ref's shapes past `skip` batch dims, prefixed by `batch`
TensorDict value_of(const TensorDict& ref, const BatchSize& batch, size_t skip) {
  TensorDict v(batch);
  for (const char* k : {"a", "b", "c"}) {
    at::Tensor t = ref.get(k);
    BatchSize shape = batch;
    shape.insert(shape.end(), t.sizes().begin() + static_cast<long>(skip), t.sizes().end());
    v.set(k, at::zeros(shape, t.options()));
  }
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(parity)

BOOST_AUTO_TEST_CASE(test_setitem_refuses_values_whose_batch_does_not_fit) {
  // upstream __setitem__: RuntimeError "indexed destination TensorDict batch size is ..." and nothing written
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    if (!m.writable) return;
    auto refused = [](const RuntimeError& e) { return has(e, "indexed destination TensorDict batch size is"); };
    // buf[1:3] = td_of_batch_[2]: the other dims of the buffer differ
    BOOST_CHECK_EXCEPTION(td.index_put_({Slice(1, 3)}, value_of(ref, {2}, 4)), RuntimeError, refused);
    // a fancy index of another count
    BOOST_CHECK_EXCEPTION(td.index_put_({longs({0, 1, 2})}, value_of(ref, {2, 3, 2, 1}, 4)), RuntimeError, refused);
    // a mask whose number of True differs from the value's leading dim
    BOOST_CHECK_EXCEPTION(td.index_put_({mask({1, 0, 1, 1})}, value_of(ref, {2, 3, 2, 1}, 4)), RuntimeError, refused);
    // an index tensor of shape [2, 1]: the indexed batch is [2, 1, 3, 2, 1]
    BOOST_CHECK_EXCEPTION(td.index_put_({longs({0, 1}).reshape({2, 1})}, value_of(ref, {2, 3, 2, 1}, 4)),
                          RuntimeError, refused);
    // buf[...] = td_of_batch_[] whose keys differ (upstream: indexed_bs[-0:] is the whole batch)
    TensorDict row(Dict{{"zz", at::zeros({5})}}, {});
    BOOST_CHECK_EXCEPTION(td.index_put_({Ellipsis}, row), RuntimeError, refused);
    BOOST_TEST(!td.contains("zz"));
    BOOST_TEST(abc_equal(td, ref));
    // a row of batch [] over existing keys is broadcast (our departure: upstream's `indexed_bs[-0:]` slip)
    td.index_put_({Slice(2, 4)}, value_of(ref, {}, 4));
    BOOST_TEST(td.get("a").index({Slice(2, 4)}).eq(0).all().item<bool>());
    // what upstream accepts still works: the trailing dims broadcast on the left (td[:2] = td[0])
    td.index_put_({Slice(0, 2)}, ref.index({0}).clone());
    BOOST_TEST(td.get("a").index({1}).equal(ref.get("a").index({0})));
  });
}

BOOST_AUTO_TEST_CASE(test_setitem_advanced_index_needs_the_leaf_dtype) {
  // torch's index_put_ (upstream's tensor[idx] = value): a float64 [1, 3] broadcast into two rows of float32
  // leaves through a fancy index or a mask raises RuntimeError; with a slice it is converted
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    if (!m.writable) return;
    TensorDict ab = td.select({"a", "b"});
    const at::Tensor v = at::ones({1, 1}, at::kDouble);
    BOOST_CHECK_THROW(ab.index_put_({longs({0, 2})}, v), RuntimeError);
    BOOST_CHECK_THROW(ab.index_put_({mask({1, 0, 1, 0})}, v), RuntimeError);
    BOOST_TEST(abc_equal(td, ref));
    ab.index_put_({Slice(0, 2)}, v);
    BOOST_TEST(ab.get("a").index({Slice(0, 2)}).eq(1).all().item<bool>());
    // select shares the leaves of a node with zero-copy views; a remote node's select is a copy
    if (td.node()->caps().zero_copy_views) {
      BOOST_TEST(td.get("a").index({Slice(0, 2)}).eq(1).all().item<bool>());
    }
  });
}

BOOST_AUTO_TEST_CASE(test_malformed_indices_raise_runtime_error) {
  // upstream _getitem_batch_size / convert_ellipsis_to_idx: RuntimeError for index tensors that do not
  // broadcast together, two ellipses and too many indices in a write; reads keep torch's IndexError for
  // out-of-range and too many indices; a mask of the wrong shape on its own is torch's IndexError
  // (tests/conformance/test_parity_index.cpp)
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1})}), IndexError);
    BOOST_CHECK_THROW(td.index({longs({0, 1}), longs({0, 1, 2})}), RuntimeError);
    BOOST_CHECK_THROW(td.index({Ellipsis, 0, Ellipsis}), RuntimeError);
    BOOST_CHECK_THROW(td.index({0, 0, 0, 0, 0}), IndexError);
    BOOST_CHECK_THROW(td.index({9}), IndexError);
    if (!m.writable) return;
    TensorDict row = ref.index({0, 0, 0, 0}).clone();
    BOOST_CHECK_THROW(td.index_put_({0, 0, 0, 0, 0}, row), RuntimeError);
    BOOST_CHECK_THROW(td.index_put_({0, 0, 0, 0, 0}, at::Scalar(1)), RuntimeError);
    BOOST_CHECK_THROW(td.index_put_({mask({1, 0, 1})}, at::Scalar(1)), IndexError);
    BOOST_CHECK_THROW(td.index_put_({Ellipsis, 0, Ellipsis}, at::Scalar(1)), RuntimeError);
    BOOST_TEST(abc_equal(td, ref));
  });
}

BOOST_AUTO_TEST_CASE(test_int_and_index_list_mixes_as_torch) {
  // upstream v0.14 (_td.py): a read is _index_tensordict (each leaf `tensor[index]`, batch from
  // _getitem_batch_size, which for these mixes gives torch's shape: an int selects its dim, it is not an
  // advanced index as in numpy); a write of a scalar or tensor is set_at_ per key, i.e. _set_at_str ->
  // _set_item -> `tensor[index] = value`, torch's own write, and a TensorDict value is checked against
  // _getitem_batch_size then written the same way. Nothing raises for these mixes on a TensorDict (the engine
  // README records what upstream's lazy stacks do). Every member must read and write as torch does on its
  // dense form.
  const std::vector<Index> mixes = {
      {0, longs({1, 2})},                    // int, list
      {longs({0, 3}), 1},                    // list, int
      {1, Slice(), longs({0, 1})},           // int, slice, list: torch [3, 2, 1] (numpy would give [2, 3, 1])
      {longs({0, 2}), 0, longs({1, 0})},     // list, int, list
      {Slice(1, 3), 2, longs({1, 1, 0})},    // slice, int, list (repeated rows)
      {2, longs({0, 2}), 1, 0},              // int, list, int, int
      {longs({3, 1}), Slice(), 1},           // list, slice, int
  };
  for_each_member([&](const Member& m, TensorDict td, const TensorDict& ref) {
    const at::Tensor shape_probe = at::zeros({4, 3, 2, 1});
    for (size_t i = 0; i < mixes.size(); ++i) {
      BOOST_TEST_CONTEXT("index mix " << i) {
        const Index& idx = mixes[i];
        const at::Tensor probe = shape_probe.index(idx);
        const BatchSize want(probe.sizes().begin(), probe.sizes().end());
        TensorDict r = td.index(idx);
        BOOST_TEST(r.batch_size() == want);
        for (const char* k : {"a", "b", "c"}) BOOST_TEST(r.get(k).equal(ref.get(k).index(idx)), k);
      }
    }
    if (!m.writable) return;
    // writes, applied to the dense reference with torch in the same order
    std::map<std::string, at::Tensor> expect;
    for (const char* k : {"a", "b", "c"}) expect[k] = ref.get(k).clone();
    for (size_t i = 0; i < mixes.size(); ++i) {
      BOOST_TEST_CONTEXT("index mix " << i) {
        const Index& idx = mixes[i];
        const auto fill = static_cast<double>(10 + i);
        // a Python float is a float32 tensor written with index_put_: refused for the int64 leaf "c", nothing
        // written (test_setitem_scalar_through_index_put_needs_the_dtype, tests/conformance/test_parity_index.cpp)
        BOOST_CHECK_THROW(td.index_put_(idx, at::Scalar(fill)), RuntimeError);
        // a TensorDict value of the indexed batch size
        const at::Tensor probe = at::zeros({4, 3, 2, 1}).index(idx);
        TensorDict v = value_of(ref, BatchSize(probe.sizes().begin(), probe.sizes().end()), 4);
        v.apply_([&](const at::Tensor& t) { return t.fill_(fill + 0.5); });
        td.index_put_(idx, v);
        for (auto& kv : expect) kv.second.index_put_(idx, v.get(kv.first));
        for (const auto& kv : expect) BOOST_TEST(td.get(kv.first).equal(kv.second), kv.first);
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(test_index_full_slices_return_self) {
  // upstream: td[:], td[...], and full slices beyond the batch dims return the TensorDict itself
  for_each_member([](const Member&, const TensorDict& td, const TensorDict&) {
    BOOST_TEST(td.index({Slice()}).is_same(td));
    BOOST_TEST(td.index({Ellipsis}).is_same(td));
    BOOST_TEST(td.index({Slice(), Slice(), Slice(), Slice()}).is_same(td));
    BOOST_TEST(td.index({Slice(), Slice(), Slice(), Slice(), Slice()}).is_same(td));
  });
  TensorDict zero(Dict{{"a", at::arange(3)}}, {});
  BOOST_TEST(zero.index({Slice()}).is_same(zero));
  BOOST_TEST(zero.index({Ellipsis}).is_same(zero));
  BOOST_TEST(zero.index({Slice(), Slice()}).is_same(zero));
}

BOOST_AUTO_TEST_CASE(test_dim_errors_are_upstreams) {
  // unsqueeze / cat / all / any: RuntimeError; permute / transpose: ValueError; view: AssertionError when
  // a negative size is inferred, torch's RuntimeError otherwise (tests/conformance/test_parity_keys.cpp)
  for_each_member([](const Member&, const TensorDict& td, const TensorDict&) {
    BOOST_CHECK_THROW(td.unsqueeze(5), RuntimeError);
    BOOST_CHECK_THROW(td.unsqueeze(-6), RuntimeError);
    BOOST_CHECK_THROW(cat({td, td}, 4), RuntimeError);
    BOOST_CHECK_THROW(cat({td, td}, -5), RuntimeError);
    BOOST_CHECK_THROW(td.all(4), RuntimeError);
    BOOST_CHECK_THROW(td.any(-5), RuntimeError);
    BOOST_CHECK_THROW(td.permute({0, 1, 2, 7}), ValueError);
    BOOST_CHECK_THROW(td.transpose(0, 4), ValueError);
    BOOST_CHECK_THROW(td.view({7}), RuntimeError);
    BOOST_CHECK_THROW(td.view({-1, -1}), AssertionError);
  });
  BOOST_CHECK_THROW(stack(std::vector<TensorDict>{}, 0), RuntimeError);
  BOOST_CHECK_THROW(cat(std::vector<TensorDict>{}, 0), RuntimeError);
}

BOOST_AUTO_TEST_CASE(test_stack_and_cat_dims_as_torch) {
  // torch.stack accepts -(n+1) ... n for n batch dims; cat accepts -n ... n-1
  for_each_member([](const Member&, const TensorDict& td, const TensorDict& ref) {
    for (int64_t dim = -5; dim <= 4; ++dim) {
      BOOST_TEST_CONTEXT("stack dim " << dim) {
        TensorDict s = stack({td, td}, dim).contiguous();
        TensorDict want = stack({ref, ref}, dim);
        BOOST_TEST(s.batch_size() == want.batch_size());
        BOOST_TEST(abc_equal(s, want));
      }
    }
    for (int64_t dim = -4; dim <= 3; ++dim) {
      BOOST_TEST_CONTEXT("cat dim " << dim) {
        TensorDict c = cat({td, td}, dim);
        TensorDict want = cat({ref, ref}, dim);
        BOOST_TEST(c.batch_size() == want.batch_size());
        BOOST_TEST(abc_equal(c, want));
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(test_nested_key_through_a_tensor) {
  // upstream: KeyError when setting ("a", "x") with "a" a tensor, ValueError when getting it (every call:
  // test_err_msg_missing_nested in tests/conformance/test_parity_keys.cpp)
  for_each_member([](const Member&, TensorDict td, const TensorDict&) {
    BOOST_CHECK_THROW(td.set({"a", "x"}, at::zeros({4, 3, 2, 1})), KeyError);
    BOOST_CHECK_THROW(td.get({"a", "x"}), ValueError);
    BOOST_CHECK_THROW(td.get_entry({"a", "x"}), ValueError);
    BOOST_TEST(!td.contains({"a", "x"}));
  });
}

BOOST_AUTO_TEST_CASE(test_reduction_without_dim_reduces_every_dim) {
  // v0.14: sum() / mean() without dim reduce every dim of each leaf; dim may be a tuple; reduce=True gives one
  // tensor; mean of integer leaves raises as torch.mean
  for_each_member([](const Member&, const TensorDict& td, const TensorDict& ref) {
    TensorDict s = td.sum();
    BOOST_TEST(s.batch_size().empty());
    for (const char* k : {"a", "b", "c"}) {
      BOOST_TEST(s.get(k).dim() == 0, k);
      BOOST_TEST(at::allclose(s.get(k), ref.get(k).sum(), 1e-4, 1e-4), k);
    }
    TensorDict s01 = td.sum({0, 1});
    BOOST_TEST(s01.batch_size() == BatchSize({2, 1}));
    BOOST_TEST(at::allclose(s01.get("a"), ref.get("a").sum(std::vector<int64_t>{0, 1}), 1e-4, 1e-4));
    TensorDict s13k = td.sum({1, -1}, true);
    BOOST_TEST(s13k.batch_size() == BatchSize({4, 1, 2, 1}));
    BOOST_CHECK_THROW(td.mean(), RuntimeError);  // "c" is int64
    TensorDict f = td.select({"a", "b"});
    TensorDict m = f.mean({0, 2});
    BOOST_TEST(m.batch_size() == BatchSize({3, 1}));
    BOOST_TEST(at::allclose(m.get("b"), ref.get("b").mean(std::vector<int64_t>{0, 2}), 1e-5, 1e-5));
    at::Tensor total = f.sum_reduce();
    BOOST_TEST(total.dim() == 0);
    BOOST_TEST(at::allclose(total, ref.get("a").sum() + ref.get("b").sum(), 1e-3, 1e-3));
    at::Tensor per_row = f.sum_reduce(std::vector<int64_t>{1, 2, 3});
    BOOST_TEST(per_row.sizes() == at::IntArrayRef({4}));
    const at::Tensor want_rows = ref.get("a").reshape({4, -1}).sum(1) + ref.get("b").reshape({4, -1}).sum(1);
    BOOST_TEST(at::allclose(per_row, want_rows, 1e-3, 1e-3));
    at::Tensor mean_all = f.mean_reduce();
    BOOST_TEST(at::allclose(mean_all, at::cat({ref.get("a").reshape(-1), ref.get("b").reshape(-1)}).mean(), 1e-5, 1e-5));
    BOOST_CHECK_THROW(td.mean_reduce(), RuntimeError);
  });
}

BOOST_AUTO_TEST_CASE(test_reflected_and_inplace_arithmetic) {
  // upstream __rsub__ / __rtruediv__, -= /= (and += *= with tensors), comparisons with tensors
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    TensorDict r = 2 - td;
    BOOST_TEST(r.get("a").equal(2 - ref.get("a")));
    BOOST_TEST(r.get("c").equal(2 - ref.get("c")));
    TensorDict q = 1 / td.select({"a"});
    BOOST_TEST(q.get("a").equal(1 / ref.get("a")));
    // a tensor broadcasts against the batch dims aligned on the right, then over each leaf's features
    const at::Tensor t = at::arange(2).to(at::kFloat).reshape({2, 1});
    const at::Tensor tl = at::arange(2).reshape({2, 1});  // int64
    // x as it meets `leaf`: trailing singleton dims for the leaf's feature dims
    auto right = [](const at::Tensor& x, const at::Tensor& leaf) {
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.resize(shape.size() + static_cast<size_t>(leaf.dim() - 4), 1);
      return x.reshape(shape);
    };
    const at::Tensor ra = ref.get("a"), rc = ref.get("c");
    TensorDict lt = td < t;
    BOOST_TEST(lt.batch_size() == BatchSize({4, 3, 2, 1}));
    BOOST_TEST(lt.get("a").equal(ra < right(t, ra)));
    BOOST_TEST(lt.get("c").equal(rc < right(t, rc)));
    BOOST_TEST((td == tl).get("c").equal(rc == right(tl, rc)));
    TensorDict ge = td >= 0.5;
    BOOST_TEST(ge.get("b").equal(ref.get("b") >= 0.5));
    TensorDict rt = t - td.select({"a"});
    BOOST_TEST(rt.get("a").equal(right(t, ra) - ra));
    if (!m.writable) return;
    td -= 1;
    BOOST_TEST(td.get("a").equal(ra - 1));
    BOOST_TEST(td.get("c").equal(rc - 1));
    td += tl;
    BOOST_TEST(td.get("a").equal(ra - 1 + right(tl, ra)));
    const at::Tensor c_now = rc - 1 + right(tl, rc);
    BOOST_TEST(td.get("c").equal(c_now));
    BOOST_CHECK_THROW(td /= 2, RuntimeError);  // int64 "c" cannot hold the float result, as torch
    BOOST_TEST(td.get("c").equal(c_now));       // nothing written
    td *= tl;
    td -= td.clone();
    BOOST_TEST(!td.any());
    BOOST_CHECK_THROW(td += at::ones({2, 4, 3, 2, 1}), RuntimeError);  // the batch size would change
  });
}

BOOST_AUTO_TEST_CASE(test_exclude_inplace_on_locked) {
  // upstream allows exclude(..., inplace=True) on a locked (memmap, shared) TensorDict
  for_each_member([](const Member&, TensorDict td, const TensorDict&) {
    td.lock_();
    // a memmap / shared store (zero-copy views of its snapshot) cannot remove keys at all (locked or not);
    // the HDF5 and Redis nodes erase them in their storage
    if (td.node()->dense_view() && td.node()->caps().zero_copy_views) {  // a store node
      BOOST_CHECK_THROW(td.exclude({"b"}, ExcludeOptions().inplace(true)), NotImplementedError);
      return;
    }
    td.exclude({"b"}, ExcludeOptions().inplace(true));
    BOOST_TEST(!td.contains("b"));
    BOOST_TEST(td.contains("a"));
    BOOST_TEST(td.is_locked());
  });
}

BOOST_AUTO_TEST_CASE(test_update_with_keys_to_update) {
  // upstream update_(other, keys_to_update=...): only those keys are written, in place
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    if (!m.writable) return;
    TensorDict other = (ref.select({"a", "b"}) + 1);
    td.update_(other, {"a"});
    BOOST_TEST(td.get("a").equal(ref.get("a") + 1));
    BOOST_TEST(td.get("b").equal(ref.get("b")));
  });
}

BOOST_AUTO_TEST_SUITE_END()
