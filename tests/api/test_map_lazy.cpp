// td.map_lazy: chunksize(0) results restacked as a LazyStackedTensorDict (upstream maybe_dense_stack, the lazy
// branch of test_map_unbind), and map's error pointing to it. Needs the actor backend, hence tests/api.
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

TensorDict undefined() { return TensorDict(std::shared_ptr<TensorDictImpl>()); }

}  // namespace

BOOST_AUTO_TEST_SUITE(map_lazy)

BOOST_AUTO_TEST_CASE(homogeneous_members_and_contiguous_equal_map) {
  Engine engine;
  TensorDict td = sample();
  std::vector<TensorDict> rows = td.unbind(0);
  for (int64_t workers : {int64_t{1}, int64_t{2}}) {
    BOOST_TEST_CONTEXT("num_workers " << workers) {
      const MapOptions o = MapOptions().chunksize(0).num_workers(workers);
      LazyStackedTensorDict lazy = td.map_lazy(plus_one_fn(), o);
      BOOST_TEST(lazy.size() == 6u);
      BOOST_TEST(lazy.stack_dim() == 0);
      BOOST_TEST(lazy.batch_size() == BatchSize({6, 3}));
      BOOST_TEST(lazy.keys().size() == 3u);
      for (size_t i = 0; i < rows.size(); ++i) {
        BOOST_TEST(lazy.member(static_cast<int64_t>(i)).batch_size() == BatchSize({3}));
        BOOST_TEST(lazy[i].equal(plus_one_fn()(rows[i])), "member " << i);
      }
      BOOST_TEST(&lazy[0] == &lazy.tensordicts()[0]);  // the member itself
      BOOST_TEST(lazy.contiguous().equal(td.map(plus_one_fn(), o)));
    }
  }
}

BOOST_AUTO_TEST_CASE(ragged_batch_gives_minus_one_and_members_in_order) {
  Engine engine;
  TensorDict td({{"i", at::arange(10)}}, {10});
  for (int64_t workers : {int64_t{1}, int64_t{2}}) {
    BOOST_TEST_CONTEXT("num_workers " << workers) {
      LazyStackedTensorDict lazy = td.map_lazy(ragged_batch, MapOptions().chunksize(0).num_workers(workers));
      BOOST_TEST(lazy.size() == 10u);
      BOOST_TEST(lazy.batch_size() == BatchSize({10, -1}));
      for (int64_t i = 0; i < 10; ++i) {
        const TensorDict& m = lazy.member(i);
        BOOST_TEST(m.batch_size() == BatchSize({i % 3 + 1}));
        BOOST_TEST(m.get("r").equal(at::arange(i % 3 + 1) + 10 * i), "member " << i);
      }
      BOOST_CHECK(throws_with<BatchSizeError>([&] { lazy.contiguous(); }, {"contiguous", "member 1"}));
    }
  }
}

BOOST_AUTO_TEST_CASE(ragged_leaves_keep_the_batch) {
  Engine engine;
  TensorDict td({{"i", at::arange(7)}}, {7});
  LazyStackedTensorDict lazy = td.map_lazy(ragged_leaf, MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.batch_size() == BatchSize({7}));
  for (int64_t i = 0; i < 7; ++i) BOOST_TEST(lazy.member(i).get("r").equal(at::arange(i % 3 + 1) + 10 * i));
  BOOST_TEST(lazy.member(-1).get("r").equal(at::arange(1) + 60));
  BOOST_CHECK(throws_with<RuntimeError>([&] { lazy.contiguous(); }, {"contiguous", "member 1", "incompatible"}));
  BOOST_CHECK_THROW(lazy.member(7), IndexError);
  BOOST_CHECK_THROW(lazy.member(-8), IndexError);
}

BOOST_AUTO_TEST_CASE(different_keys) {
  Engine engine;
  TensorDict td({{"i", at::arange(5)}}, {5});
  LazyStackedTensorDict lazy = td.map_lazy(odd_extra, MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.size() == 5u);
  BOOST_TEST(lazy.batch_size() == BatchSize({5}));
  BOOST_TEST(lazy.keys() == std::vector<NestedKey>({NestedKey("x")}));
  for (int64_t i = 0; i < 5; ++i) {
    BOOST_TEST(lazy.member(i).get("x").item<int64_t>() == 2 * i);
    BOOST_TEST(lazy.member(i).contains("y") == (i % 2 == 1));
  }
  BOOST_CHECK(throws_with<RuntimeError>([&] { lazy.contiguous(); }, {"contiguous", "member 1"}));
}

BOOST_AUTO_TEST_CASE(dim_one_and_negative_dims) {
  Engine engine;
  TensorDict td = sample();  // [6, 3]
  struct Case {
    int64_t dim, stack_dim;
  };
  for (Case c : {Case{1, 1}, Case{-1, 1}, Case{-2, 0}}) {
    for (int64_t workers : {int64_t{1}, int64_t{2}}) {
      BOOST_TEST_CONTEXT("dim " << c.dim << " num_workers " << workers) {
        const MapOptions o = MapOptions().dim(c.dim).chunksize(0).num_workers(workers);
        LazyStackedTensorDict lazy = td.map_lazy(plus_one_fn(), o);
        std::vector<TensorDict> parts = td.unbind(c.stack_dim);
        BOOST_TEST(lazy.stack_dim() == c.stack_dim);
        BOOST_TEST(lazy.size() == parts.size());
        BOOST_TEST(lazy.batch_size() == td.batch_size());
        for (size_t j = 0; j < parts.size(); ++j) BOOST_TEST(lazy[j].equal(plus_one_fn()(parts[j])));
        BOOST_TEST(lazy.contiguous().equal(td.map(plus_one_fn(), o)));
      }
    }
  }
  // ragged along dim 1: members [6, k] stacked at 1 -> [6, 3, -1]
  TensorDict cols({{"i", at::arange(3).unsqueeze(0).expand({6, 3}).contiguous()}}, {6, 3});
  LazyStackedTensorDict lazy = cols.map_lazy(
      [](const TensorDict& c) {
        const int64_t j = c.get("i")[0].item<int64_t>();
        return TensorDict({{"r", at::zeros({6, j + 1})}}, {6, j + 1});
      },
      MapOptions().dim(-1).chunksize(0).num_workers(2));
  BOOST_TEST(lazy.stack_dim() == 1);
  BOOST_TEST(lazy.batch_size() == BatchSize({6, 3, -1}));
  for (int64_t j = 0; j < 3; ++j) BOOST_TEST(lazy.member(j).batch_size() == BatchSize({6, j + 1}));
}

BOOST_AUTO_TEST_CASE(map_on_heterogeneous_results_points_to_map_lazy) {
  Engine engine;
  TensorDict td({{"i", at::arange(10)}}, {10});
  for (int64_t workers : {int64_t{1}, int64_t{2}}) {
    BOOST_TEST_CONTEXT("num_workers " << workers) {
      const MapOptions o = MapOptions().chunksize(0).num_workers(workers);
      BOOST_CHECK(throws_with<RuntimeError>([&] { td.map(ragged_leaf, o); }, {"chunk 1", "map_lazy"}));
      BOOST_CHECK(throws_with<BatchSizeError>([&] { td.map(ragged_batch, o); }, {"chunk 1", "map_lazy"}));
      BOOST_CHECK(throws_with<RuntimeError>([&] { td.map(odd_extra, o); }, {"chunk 1", "map_lazy"}));
    }
  }
  // chunked map concatenates: map_lazy does not apply there, no hint
  std::string m;
  try {
    td.map([](const TensorDict& c) { return TensorDict({{"r", at::zeros({1, row(c) % 3 + 1})}}, {1}); },
           MapOptions().chunksize(1));
  } catch (const Error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("chunk 1") != std::string::npos, m);
  BOOST_TEST(m.find("map_lazy") == std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(undefined_results_are_skipped) {
  Engine engine;
  TensorDict td({{"i", at::arange(9)}}, {9});
  LazyStackedTensorDict lazy = td.map_lazy(
      [](const TensorDict& c) { return row(c) % 3 == 0 ? ragged_batch(c) : undefined(); },
      MapOptions().chunksize(0).num_workers(2));
  BOOST_TEST(lazy.size() == 3u);
  for (int64_t k = 0; k < 3; ++k) BOOST_TEST(lazy.member(k).get("r").equal(at::arange(1) + 30 * k));
  BOOST_CHECK(throws_with<ValueError>(
      [&] { td.map_lazy([](const TensorDict&) { return undefined(); }, MapOptions().chunksize(0)); },
      {"map_lazy", "no result"}));
  TensorDict empty({{"i", at::arange(0)}}, {0});
  BOOST_CHECK(throws_with<ValueError>([&] { empty.map_lazy(ragged_batch, MapOptions().chunksize(0)); },
                                      {"map_lazy", "nothing to stack"}));
}

BOOST_AUTO_TEST_CASE(worker_errors_propagate) {
  Engine engine;
  TensorDict td({{"i", at::arange(20)}}, {20});
  BOOST_CHECK(throws_with<TypeError>(
      [&] {
        td.map_lazy(
            [](const TensorDict& c) {
              if (row(c) == 7) throw TypeError("bad row");
              return c.clone();
            },
            MapOptions().chunksize(0).num_workers(2));
      },
      {"bad row"}));
  // results with different numbers of batch dims cannot form a lazy stack either
  BOOST_CHECK(throws_with<BatchSizeError>(
      [&] {
        td.map_lazy([](const TensorDict& c) { return row(c) == 3 ? c.unsqueeze(0) : c.clone(); },
                    MapOptions().chunksize(0));
      },
      {"map_lazy", "batch dims"}));
}

BOOST_AUTO_TEST_CASE(validation_before_any_worker) {
  Engine engine;
  TensorDict td = sample();
  std::atomic<int> calls{0};
  auto fn = plus_one_fn(&calls);
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().chunksize(5)); },
                                      {"map_lazy", "chunksize(0)", "chunksize 5"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions()); }, {"chunksize(0)", "no chunksize"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().num_chunks(2)); }, {"chunksize(0)"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().chunksize(0).out(td.clone())); },
                                      {"map_lazy", "out"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().chunksize(0).shuffle(true)); },
                                      {"map_lazy", "shuffle"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().chunksize(0).worker_processes(1)); },
                                      {"map_lazy", "worker_processes"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(MapFn(), MapOptions().chunksize(0)); }, {"fn is empty"}));
  BOOST_CHECK(throws_with<ValueError>([&] { td.map_lazy(fn, MapOptions().chunksize(0).num_workers(0)); },
                                      {"map_lazy:", "num_workers"}));
  BOOST_CHECK(throws_with<IndexError>([&] { td.map_lazy(fn, MapOptions().chunksize(0).dim(2)); },
                                      {"map_lazy:", "dim 2"}));
  BOOST_TEST(calls.load() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
