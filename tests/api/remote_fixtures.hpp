#pragma once
// Shared by the tests of the remote TensorDicts (test_persistent.cpp: HDF5, test_tensordict_store.cpp: Redis):
// a sample TensorDict, a value comparison, and the index kinds both must read and write like a dense one.
#include <vector>

#include "tensordict/tensordict.hpp"

namespace remote_fixtures {

using tensordict::Index;
using tensordict::KeysOptions;
using tensordict::TensorDict;

//! batch [n]: obs f32 [n, 4], idx i64 [n], flag bool [n], sub.x f32 [n, 2, 3]
inline TensorDict sample(int64_t n, int64_t seed = 0) {
  at::manual_seed(seed);
  TensorDict td({{"obs", at::randn({n, 4})}, {"idx", at::arange(n)}, {"flag", at::arange(n).remainder(3).eq(0)}}, {n});
  td.set({"sub", "x"}, at::randn({n, 2, 3}));
  return td;
}

//! same batch size, same leaf keys, equal leaves
inline bool same(const TensorDict& a, const TensorDict& b) {
  if (a.batch_size() != b.batch_size()) return false;
  auto ka = a.keys(KeysOptions().include_nested(true).leaves_only(true).sort(true));
  auto kb = b.keys(KeysOptions().include_nested(true).leaves_only(true).sort(true));
  if (ka != kb) return false;
  for (const auto& k : ka)
    if (!a.get(k).equal(b.get(k))) return false;
  return true;
}

//! ints, slices, a step, unsorted and repeated fancy indices (h5py refuses these), a mask, a 2-d index
inline std::vector<Index> indices(int64_t n) {
  using at::indexing::None;
  using at::indexing::Slice;
  return {{0},
          {-1},
          {Slice(3, 9)},
          {Slice(None, None, 3)},
          {at::tensor({7, 2, 7, 0}, at::kLong)},
          {at::arange(n).remainder(4).eq(1)},
          {Slice(2, 12), at::indexing::Ellipsis},
          {at::tensor({1, 5, 5, 0}, at::kLong).view({2, 2})}};
}

}  // namespace remote_fixtures
