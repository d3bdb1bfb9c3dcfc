#pragma once
// The fixture "zoo" (upstream's TestTensorDictsBase): every kind of TensorDict the generic tests run on.
// Every zoo member has batch_size [4, 3, 2, 1] and the tensor leaves "a" [..,5] f32, "b" [..,1,10] f32,
// "c" [..,3] i64; some add a sub-TensorDict "nested" (batch [4,3,2,1,2]) or a non-tensor "data".
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"

namespace zoo {

using tensordict::BatchSize;
using tensordict::Dict;
using tensordict::TensorDict;
using namespace at::indexing;

struct Kind {
  std::string name;
  std::function<TensorDict()> make;
  bool writable;  // in-place writes reach distinct memory (false for expanded stride-0 leaves)
};

inline at::Tensor randn(BatchSize shape, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return at::randn(shape, gen);
}
inline at::Tensor randint(BatchSize shape, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return at::randint(0, 100, shape, gen, at::kLong);
}

inline BatchSize cat_shape(BatchSize a, const BatchSize& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

//! a plain TensorDict of the given batch with leaves a, b, c
inline TensorDict plain(const BatchSize& bs, int64_t seed = 1) {
  return TensorDict(Dict{{"a", randn(cat_shape(bs, {5}), seed)},
                         {"b", randn(cat_shape(bs, {1, 10}), seed + 1)},
                         {"c", randint(cat_shape(bs, {3}), seed + 2)}},
                    bs);
}

inline std::vector<Kind> kinds() {
  const BatchSize bs{4, 3, 2, 1};
  return {
      {"td", [=] { return plain(bs); }, true},
      {"nested_td",
       [=] {
         TensorDict td = plain(bs);
         td.set("nested", TensorDict(Dict{{"x", randn(cat_shape(bs, {2, 3}), 7)},
                                          {"y", randint(cat_shape(bs, {2}), 8)}},
                                     cat_shape(bs, {2})));
         return td;
       },
       true},
      {"sub_td", [=] { return plain(cat_shape({2}, bs), 3).index({1}); }, true},
      {"idx_td", [=] { return plain({6, 3, 2, 1}, 5).index({Slice(1, 5)}); }, true},
      {"unsqueezed_td", [=] { return plain({4, 3, 2}, 9).unsqueeze(-1); }, true},
      {"squeezed_td", [=] { return plain({4, 3, 1, 2, 1}, 11).squeeze(2); }, true},
      {"permute_td", [=] { return plain({3, 1, 4, 2}, 13).permute({2, 0, 3, 1}); }, true},
      {"expanded_td", [=] { return plain({1, 3, 2, 1}, 15).expand(bs); }, false},
      {"td_reset_bs",
       [=] {
         TensorDict td = plain(cat_shape(bs, {1}), 17);
         td.set_batch_size(bs);
         return td;
       },
       true},
      {"stacked_td",
       [=] {
         std::vector<TensorDict> parts;
         for (int i = 0; i < 4; ++i) parts.push_back(plain({3, 2, 1}, 20 + i));
         return tensordict::stack(parts, 0);
       },
       true},
      {"td_with_non_tensor",
       [=] {
         TensorDict td = plain(bs, 19);
         td.set("data", "a string");
         return td;
       },
       true},
  };
}

//! the tensor leaves (nested included) as (joined key, tensor) pairs
inline std::vector<std::pair<std::string, at::Tensor>> leaves(const TensorDict& td) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& kv : td.items(tensordict::KeysOptions().include_nested(true).leaves_only(true)))
    out.emplace_back(kv.first.join("."), kv.second.tensor());
  return out;
}

//! same batch size, same tensor keys, equal values
inline void check_equal(const TensorDict& got, const TensorDict& want, const std::string& ctx = "") {
  BOOST_TEST_CONTEXT(ctx) {
    BOOST_TEST(got.batch_size() == want.batch_size());
    auto g = leaves(got);
    auto w = leaves(want);
    BOOST_REQUIRE_EQUAL(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      BOOST_TEST(g[i].first == w[i].first);
      BOOST_TEST(g[i].second.sizes() == w[i].second.sizes());
      BOOST_TEST(at::equal(g[i].second, w[i].second), "leaf " << g[i].first << " differs");
    }
  }
}

}  // namespace zoo

namespace zoo {

//! `got` must equal `op` applied to every tensor leaf of `src` (same keys, same order) and have batch size
//! `want_bs`; where `op` gives a view of the source leaf, the result leaf must be that same view (same
//! data_ptr and strides). Sub-TensorDicts and non-tensors must keep the dims they had beyond src's batch.
inline void check_leafwise(const TensorDict& src, const TensorDict& got, const BatchSize& want_bs,
                           const std::function<at::Tensor(const at::Tensor&)>& op, const std::string& ctx = "") {
  BOOST_TEST_CONTEXT(ctx) {
    BOOST_TEST(got.batch_size() == want_bs);
    auto s = leaves(src);
    auto g = leaves(got);
    BOOST_REQUIRE_EQUAL(s.size(), g.size());
    for (size_t i = 0; i < s.size(); ++i) {
      at::Tensor want = op(s[i].second);
      BOOST_TEST(g[i].first == s[i].first);
      BOOST_TEST(g[i].second.sizes() == want.sizes(), "leaf " << g[i].first << " shape");
      BOOST_TEST(at::equal(g[i].second, want), "leaf " << g[i].first << " differs");
      if (want.is_alias_of(s[i].second)) {
        BOOST_TEST(g[i].second.is_alias_of(s[i].second), "leaf " << g[i].first << " is not a view");
        BOOST_TEST(g[i].second.data_ptr() == want.data_ptr());
        BOOST_TEST(g[i].second.strides() == want.strides(), "leaf " << g[i].first << " strides");
      }
    }
    const size_t snd = src.batch_size().size();
    for (const auto& kv : got.items(tensordict::KeysOptions().include_nested(true))) {
      if (kv.second.is_tensor()) continue;
      BatchSize shape = kv.second.shape();
      BatchSize src_shape = src.get_entry(kv.first).shape();
      BatchSize want = want_bs;
      if (src_shape.size() > snd) want.insert(want.end(), src_shape.begin() + static_cast<long>(snd), src_shape.end());
      BOOST_TEST(shape == want, "entry " << kv.first.join(".") << " batch");
    }
  }
}

//! true when every tensor leaf of `td` shares storage with the leaf of the same key in `base`
inline bool all_alias(const TensorDict& td, const TensorDict& base) {
  auto a = leaves(td);
  auto b = leaves(base);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !a[i].second.is_alias_of(b[i].second)) return false;
  return true;
}

//! what() of the E that f throws; fails the test when f throws nothing or another type
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    BOOST_FAIL(std::string("unexpected exception type: ") + e.what());
  }
  BOOST_FAIL("expected an exception");
  return "";
}

//! true when f throws E and its message contains every part (the missing part is logged)
template <class E>
bool throws_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const E& e) {
    std::string w = e.what();
    for (const auto& p : parts)
      if (w.find(p) == std::string::npos) {
        BOOST_TEST_MESSAGE("message lacks '" << p << "': " << w);
        return false;
      }
    return true;
  }
  return false;
}

//! the data pointers of every tensor leaf (to prove in-place writes)
inline std::map<std::string, const void*> ptrs(const TensorDict& td) {
  std::map<std::string, const void*> out;
  for (auto& kv : leaves(td)) out[kv.first] = kv.second.data_ptr();
  return out;
}

}  // namespace zoo
