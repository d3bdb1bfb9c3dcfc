// td.map with chunksize(0): per-element results restacked with maybe_dense_stack, a dense TensorDict when they
// stack and a LazyStackedTensorDict when they differ in leaf shapes, keys or batch sizes (upstream
// test_map_unbind). Needs the actor backend, hence tests/api.
#include <atomic>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/zoo.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using namespace at::indexing;
using zoo::throws_with;

namespace {

//! batch [6, 3]: "a" [6,3,4] f32, "idx" [6,3] i64 = row index, "nested" {"b": [6,3,2] f32}
TensorDict sample() {
  auto gen = at::detail::createCPUGenerator(11);
  TensorDict nested({{"b", at::randn({6, 3, 2}, gen)}}, {6, 3});
  return TensorDict({{"a", at::randn({6, 3, 4}, gen)},
                     {"idx", at::arange(6).unsqueeze(1).expand({6, 3}).contiguous()},
                     {"nested", nested}},
                    {6, 3});
}

MapFn plus_one_fn(std::atomic<int>* calls = nullptr) {
  return [calls](const TensorDict& c) {
    if (calls) ++*calls;
    return c.apply([](const at::Tensor& t) { return t + 1; });
  };
}

//! the element's row index (source {"i": arange(n)}, chunksize 0: a 0-dim leaf)
int64_t row(const TensorDict& c) { return c.get("i").item<int64_t>(); }

//! ragged in the batch: batch [k] with k = row % 3 + 1, "r" = arange(k) + 10 * row
TensorDict ragged_batch(const TensorDict& c) {
  const int64_t i = row(c);
  const int64_t k = i % 3 + 1;
  return TensorDict({{"r", at::arange(k) + 10 * i}}, {k});
}

//! ragged leaves only: batch [], "r" = arange(k) + 10 * row
TensorDict ragged_leaf(const TensorDict& c) {
  const int64_t i = row(c);
  return TensorDict({{"r", at::arange(i % 3 + 1) + 10 * i}}, {});
}

//! different keys: every row has "x", odd rows also "y"
TensorDict odd_extra(const TensorDict& c) {
  TensorDict r({{"x", c.get("i") * 2}}, {});
  if (row(c) % 2 == 1) r.set("y", at::ones({2}));
  return r;
}

TensorDict undefined() { return TensorDict::undefined(); }

//! the lazy stack map returned (fails the test when map densified)
LazyStackedTensorDict lazy_map(const TensorDict& td, const MapFn& fn, const MapOptions& o) {
  TensorDict r = td.map(fn, o);
  BOOST_REQUIRE(LazyStackedTensorDict::is_lazy_stack(r));
  return LazyStackedTensorDict(r);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(map_unbind)

BOOST_AUTO_TEST_CASE(homogeneous_results_are_dense) {
  Engine engine;
  TensorDict td = sample();
  for (int64_t workers : {int64_t{1}, int64_t{2}}) {
    BOOST_TEST_CONTEXT("num_workers " << workers) {
      const MapOptions o = MapOptions().chunksize(0).num_workers(workers);
      TensorDict r = td.map(plus_one_fn(), o);
      BOOST_TEST((r.node()->dense_node() != nullptr));
      BOOST_TEST(r.equal(td.apply([](const at::Tensor& t) { return t + 1; })));
    }
  }
}

BOOST_AUTO_TEST_CASE(ragged_batch_gives_minus_one_and_members_in_order) {
  Engine engine;
  TensorDict td({{"i", at::arange(10)}}, {10});
  for (int64_t workers : {int64_t{1}, int64_t{2}}) {
    BOOST_TEST_CONTEXT("num_workers " << workers) {
      LazyStackedTensorDict lazy = lazy_map(td, ragged_batch, MapOptions().chunksize(0).num_workers(workers));
      BOOST_TEST(lazy.size() == 10u);
      BOOST_TEST(lazy.stack_dim() == 0);
      BOOST_TEST(lazy.batch_size() == BatchSize({10, -1}));
      for (int64_t i = 0; i < 10; ++i) {
        const TensorDict& m = lazy.member(i);
        BOOST_TEST(m.batch_size() == BatchSize({i % 3 + 1}));
        BOOST_TEST(m.get("r").equal(at::arange(i % 3 + 1) + 10 * i), "member " << i);
        BOOST_TEST(lazy.index({i}).is_same(m));  // an int at the stack dim is the member itself
      }
      BOOST_TEST(&lazy[0] == &lazy.tensordicts()[0]);
      BOOST_CHECK(throws_with<BatchSizeError>([&] { lazy.contiguous(); }, {"contiguous", "member 1"}));
    }
  }
}

BOOST_AUTO_TEST_CASE(ragged_leaves_keep_the_batch) {
  Engine engine;
  TensorDict td({{"i", at::arange(7)}}, {7});
  LazyStackedTensorDict lazy = lazy_map(td, ragged_leaf, MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.batch_size() == BatchSize({7}));
  for (int64_t i = 0; i < 7; ++i) BOOST_TEST(lazy.member(i).get("r").equal(at::arange(i % 3 + 1) + 10 * i));
  BOOST_TEST(lazy.member(-1).get("r").equal(at::arange(1) + 60));
  BOOST_CHECK(throws_with<RuntimeError>([&] { lazy.get("r"); }, {"Failed to stack tensors within a tensordict"}));
  BOOST_CHECK(throws_with<RuntimeError>([&] { lazy.contiguous(); }, {"contiguous", "member 1"}));
  BOOST_CHECK_THROW(lazy.member(7), IndexError);
  BOOST_CHECK_THROW(lazy.member(-8), IndexError);
}

BOOST_AUTO_TEST_CASE(different_keys) {
  Engine engine;
  TensorDict td({{"i", at::arange(5)}}, {5});
  LazyStackedTensorDict lazy = lazy_map(td, odd_extra, MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.size() == 5u);
  BOOST_TEST(lazy.batch_size() == BatchSize({5}));
  BOOST_TEST(lazy.keys() == std::vector<NestedKey>({NestedKey("x")}));
  for (int64_t i = 0; i < 5; ++i) {
    BOOST_TEST(lazy.member(i).get("x").item<int64_t>() == 2 * i);
    BOOST_TEST(lazy.member(i).contains("y") == (i % 2 == 1));
  }
  BOOST_TEST(lazy.get("x").equal(at::arange(5) * 2));
  // upstream contiguous(): the common keys stacked, exclusive keys dropped
  TensorDict dense = lazy.contiguous();
  BOOST_TEST((dense.node()->dense_node() != nullptr));
  BOOST_TEST(dense.keys() == std::vector<NestedKey>({NestedKey("x")}));
}

BOOST_AUTO_TEST_CASE(dim_one_and_negative_dims) {
  Engine engine;
  // ragged along dim 1: members [6, k] stacked at 1 -> [6, 3, -1]
  TensorDict cols({{"i", at::arange(3).unsqueeze(0).expand({6, 3}).contiguous()}}, {6, 3});
  for (int64_t dim : {int64_t{1}, int64_t{-1}}) {
    LazyStackedTensorDict lazy = lazy_map(
        cols,
        [](const TensorDict& c) {
          const int64_t j = c.get("i")[0].item<int64_t>();
          return TensorDict({{"r", at::zeros({6, j + 1})}}, {6, j + 1});
        },
        MapOptions().dim(dim).chunksize(0).num_workers(2));
    BOOST_TEST(lazy.stack_dim() == 1);
    BOOST_TEST(lazy.batch_size() == BatchSize({6, 3, -1}));
    for (int64_t j = 0; j < 3; ++j) BOOST_TEST(lazy.member(j).batch_size() == BatchSize({6, j + 1}));
    BOOST_TEST(lazy.index({Slice(), 2}).is_same(lazy.member(2)));
  }
}

BOOST_AUTO_TEST_CASE(chunked_map_names_the_chunk_that_does_not_concatenate) {
  Engine engine;
  TensorDict td({{"i", at::arange(10)}}, {10});
  std::string m;
  try {
    td.map([](const TensorDict& c) { return TensorDict({{"r", at::zeros({1, row(c) % 3 + 1})}}, {1}); },
           MapOptions().chunksize(1));
  } catch (const Error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("chunk 1") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(undefined_results_are_skipped) {
  Engine engine;
  TensorDict td({{"i", at::arange(9)}}, {9});
  // rows 0, 4, 8 give batches [1], [2], [3]; the others nothing
  LazyStackedTensorDict lazy = lazy_map(
      td, [](const TensorDict& c) { return row(c) % 4 == 0 ? ragged_batch(c) : undefined(); },
      MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.size() == 3u);
  for (int64_t k = 0; k < 3; ++k) BOOST_TEST(lazy.member(k).get("r").equal(at::arange(k + 1) + 40 * k));
  BOOST_TEST(!td.map([](const TensorDict&) { return undefined(); }, MapOptions().chunksize(0)).defined());
}

BOOST_AUTO_TEST_CASE(worker_errors_propagate) {
  Engine engine;
  TensorDict td({{"i", at::arange(20)}}, {20});
  BOOST_CHECK(throws_with<TypeError>(
      [&] {
        td.map(
            [](const TensorDict& c) {
              if (row(c) == 7) throw TypeError("bad row");
              return ragged_batch(c);
            },
            MapOptions().chunksize(0).num_workers(2));
      },
      {"bad row"}));
  // results with different numbers of batch dims cannot form a lazy stack either: the chunk is named
  BOOST_CHECK(throws_with<BatchSizeError>(
      [&] {
        td.map([](const TensorDict& c) { return row(c) == 3 ? c.unsqueeze(0) : c.clone(); },
               MapOptions().chunksize(0));
      },
      {"chunk 3", "batch dims"}));
}

BOOST_AUTO_TEST_SUITE_END()
