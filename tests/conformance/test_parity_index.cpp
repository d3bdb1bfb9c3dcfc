// Upstream parity of index errors and scalar writes (issue 35, items 11 and 12), on every zoo member. Upstream
// v0.14.0 has no test of its own for these; the cases follow its source:
// - _td.py _index_tensordict: the batch is _getitem_batch_size (which counts a mask as [its number of True]
//   and broadcasts the index tensors' shapes with torch.broadcast_shapes: RuntimeError when they do not
//   broadcast), then each leaf is indexed by torch, which raises IndexError for a mask of the wrong shape;
// - _td.py __setitem__ with a value that is not a TensorDict: set_at_ per key, whose _validate_value turns a
//   Python scalar into a tensor (torch.as_tensor: int64, float32, bool) and writes `tensor[idx] = value`:
//   torch's index_put_, which refuses a value of another dtype ("Index put requires the source and
//   destination dtypes match") except for a lone mask (masked_fill_ takes any dtype); ints and slices copy.
// - _td.py __setitem__ with an empty TensorDict (no leaves): nothing to write, so no check fails; the real
//   v0.14.0 accepts td[0], td[(0,)], td[0:1] = TensorDict({}, []) and td[1] = TensorDict({"n": TensorDict({},
//   [])}, []) over an existing sub-TensorDict "n", values unchanged (item 12's last clause); a value without
//   keys takes the indexed batch whatever its own (td[1] = TensorDict({}, [2]) is accepted too).
#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"

using namespace tensordict;
using at::indexing::Slice;
using conformance::for_each_member;
using conformance::Member;

namespace {

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor mask(std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); }

bool same_leaves(const TensorDict& td, const TensorDict& ref) {
  const TensorDict now = td.contiguous();
  for (const char* k : {"a", "b", "c"})
    if (!now.get(k).equal(ref.get(k))) return false;
  return true;
}

//! every tensor leaf, nested ones included, equal to ref's
bool same_tensor_leaves(const TensorDict& td, const TensorDict& ref) {
  const TensorDict now = td.contiguous();
  for (const auto& kv : ref.items(KeysOptions().include_nested(true).leaves_only(true)))
    if (kv.second.is_tensor() && !now.get(kv.first).equal(kv.second.tensor())) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(parity_index)

BOOST_AUTO_TEST_CASE(test_masking_wrong_shape) {
  // batch [4, 3, 2, 1]: a mask of the wrong shape on its own is an IndexError (reads and writes, nothing
  // written); a mask that must broadcast with an index list of another count is a RuntimeError
  for_each_member([](const Member& m, TensorDict td, const TensorDict& ref) {
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1})}), IndexError);
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1, 0, 1, 1}).reshape({2, 3})}), IndexError);
    BOOST_CHECK_THROW(td.index({Slice(), mask({1, 0})}), IndexError);
    // with another index tensor it broadcasts with ([2] and [2]): still the mask's IndexError
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1}), longs({0, 1})}), IndexError);
    // [2] and [3] do not broadcast: RuntimeError, whether the mask has the right shape or not
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1}), longs({0, 1, 2})}), RuntimeError);
    BOOST_CHECK_THROW(td.index({mask({1, 0, 1, 0}), longs({0, 1, 2})}), RuntimeError);
    // a mask of the right shape works as before
    BOOST_TEST(td.index({mask({1, 0, 1, 1})}).batch_size() == BatchSize({3, 3, 2, 1}));
    if (!m.writable) return;
    BOOST_CHECK_THROW(td.index_put_({mask({1, 0, 1})}, at::Scalar(1)), IndexError);
    BOOST_CHECK_THROW(td.index_put_({mask({1, 0, 1})}, ref.index({mask({1, 0, 1, 0})}).clone()), IndexError);
    BOOST_CHECK_THROW(td.index_put_({mask({1, 0, 1, 0}), longs({0, 1, 2})}, at::Scalar(1)), RuntimeError);
    BOOST_TEST(same_leaves(td, ref));
  });
}

BOOST_AUTO_TEST_CASE(test_setitem_scalar_through_index_put_needs_the_dtype) {
  // leaves "a", "b" float32, "c" int64: a scalar written through index_put_ must have every leaf's dtype
  const std::vector<Index> through_index_put = {
      {0, longs({1, 2})},                // an int with an index list
      {longs({0, 3}), Slice(), 1},       // an index list, a slice, an int
      {longs({0, 1}).reshape({2, 1})},   // a multi-dim index tensor
      {longs({0, 2})},                   // an index list on its own
      {mask({1, 0, 1, 0}), longs({0, 2})},  // a mask with an index list
  };
  for_each_member([&](const Member& m, TensorDict td, const TensorDict& ref) {
    if (!m.writable) return;
    for (size_t i = 0; i < through_index_put.size(); ++i) {
      BOOST_TEST_CONTEXT("index " << i) {
        const Index& idx = through_index_put[i];
        BOOST_CHECK_EXCEPTION(td.index_put_(idx, at::Scalar(1.5)), RuntimeError, [](const RuntimeError& e) {
          return std::string(e.what()).find("Index put requires the source and destination dtypes match") !=
                 std::string::npos;
        });
        BOOST_CHECK_THROW(td.index_put_(idx, at::Scalar(int64_t{2})), RuntimeError);  // int64 into "a", "b"
        BOOST_CHECK_THROW(td.index_put_(idx, at::Scalar(true)), RuntimeError);
      }
    }
    BOOST_TEST(same_leaves(td, ref));
    // leaves of the scalar's dtype take it (float32 leaves, a Python float)
    TensorDict ab = td.select({"a", "b"});
    ab.index_put_({0, longs({1, 2})}, at::Scalar(1.5));
    BOOST_TEST(ab.get("a").index({0, longs({1, 2})}).eq(1.5).all().item<bool>());
    // a lone mask (masked_fill_), ints and slices (copy_) convert the scalar for every leaf
    td.index_put_({mask({0, 1, 0, 1})}, at::Scalar(1.5));
    td.index_put_({2, Slice(0, 2)}, at::Scalar(int64_t{7}));
    const TensorDict now = td.contiguous();
    BOOST_TEST(now.get("c").index({mask({0, 1, 0, 1})}).eq(1).all().item<bool>());  // 1.5 cast to int64
    BOOST_TEST(now.get("a").index({mask({0, 1, 0, 1})}).eq(1.5).all().item<bool>());
    BOOST_TEST(now.get("a").index({2, Slice(0, 2)}).eq(7).all().item<bool>());
  });
}

BOOST_AUTO_TEST_CASE(test_setitem_empty_tensordict_into_one_element) {
  // batch [4, 3, 2, 1]: an empty TensorDict written into one element (or a slice of one) is accepted and changes
  // nothing, directly and as the value of an existing sub-TensorDict
  const std::vector<Index> one_element = {{0}, {Slice(0, 1)}, {0, 1}, {3, 2, 1, 0}, {at::indexing::Ellipsis},
                                          {longs({0, 2})}, {mask({1, 0, 1, 0})}};
  for_each_member([&](const Member& m, TensorDict td, const TensorDict& ref) {
    if (!m.writable) return;
    const std::vector<std::string> keys_before = [&] {
      std::vector<std::string> out;
      for (const auto& k : td.keys(KeysOptions().include_nested(true))) out.push_back(k.repr());
      return out;
    }();
    for (size_t i = 0; i < one_element.size(); ++i) {
      BOOST_TEST_CONTEXT("index " << i) {
        BOOST_CHECK_NO_THROW(td.index_put_(one_element[i], TensorDict(BatchSize{})));
      }
    }
    // upstream re-batches a value without keys to the indexed batch, whatever its own batch
    BOOST_CHECK_NO_THROW(td.index_put_({1}, TensorDict(BatchSize{2})));
    BOOST_CHECK_NO_THROW(td.index_put_({Slice(0, 2), 1}, TensorDict(BatchSize{5, 7})));
    // the index is still checked here, as for any value (upstream, with no leaf to index, accepts even this)
    BOOST_CHECK_THROW(td.index_put_({4}, TensorDict(BatchSize{})), IndexError);
    BOOST_TEST(same_leaves(td, ref));
    // td2[1] = TensorDict({"n": TensorDict({}, [])}, []) with "n" a sub-TensorDict of td2: each zoo member
    // as the "n" of a fresh TensorDict over it, and the member's own sub-TensorDicts where it has some
    TensorDict td2(td.batch_size());
    td2.set("n", td);
    TensorDict nested_empty(BatchSize{});
    nested_empty.set("n", TensorDict(BatchSize{}));
    BOOST_CHECK_NO_THROW(td2.index_put_({1}, nested_empty));
    for (const auto& k : td.keys()) {
      if (!td.get_entry(k).is_tensordict()) continue;
      BOOST_TEST_CONTEXT("sub-TensorDict " << k.repr()) {
        TensorDict v(BatchSize{});
        v.set(k, TensorDict(BatchSize{}));
        BOOST_CHECK_NO_THROW(td.index_put_({1}, v));
        BOOST_CHECK_NO_THROW(td.index_put_({Slice(1, 2)}, v));
      }
    }
    BOOST_TEST(same_leaves(td, ref));
    BOOST_TEST(same_leaves(td2.get_entry("n").tensordict(), ref));
    BOOST_TEST(same_tensor_leaves(td, ref));
    std::vector<std::string> keys_after;
    for (const auto& k : td.keys(KeysOptions().include_nested(true))) keys_after.push_back(k.repr());
    BOOST_TEST(keys_after == keys_before, boost::test_tools::per_element());
  });
}

BOOST_AUTO_TEST_SUITE_END()
