// td.map / td.map_iter: upstream §2 semantics (acceptance items 50-57 where they apply in one process).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "engine/zoo.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using zoo::message_of;
using namespace at::indexing;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

//! batch [10, 3]: "a" [10,3,4] f32, "idx" [10,3] i64 = row index, "nested" {"b": [10,3,2] f32}
TensorDict sample() {
  auto gen = at::detail::createCPUGenerator(3);
  TensorDict nested({{"b", at::randn({10, 3, 2}, gen)}}, {10, 3});
  return TensorDict({{"a", at::randn({10, 3, 4}, gen)},
                     {"idx", at::arange(10).unsqueeze(1).expand({10, 3}).contiguous()},
                     {"nested", nested}},
                    {10, 3});
}

at::Tensor plus_one(const at::Tensor& t) { return t + 1; }

MapFn plus_one_fn(std::atomic<int>* calls = nullptr) {
  return [calls](const TensorDict& c) {
    if (calls) ++*calls;
    return c.apply(plus_one);
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(map)

BOOST_AUTO_TEST_CASE(a_worker_generator_is_made_at_its_first_call_and_then_kept) {
  MapWorkerContext ctx;
  ctx.seed = 7;
  at::Generator& g = ctx.generator();
  BOOST_TEST(g.defined());
  BOOST_TEST(g.current_seed() == 7u);
  at::Generator ref = at::detail::createCPUGenerator(7);
  BOOST_TEST(at::rand({3}, g).equal(at::rand({3}, ref)));
  // the same generator on every call: its stream goes on, it is not seeded again
  BOOST_TEST(&ctx.generator() == &g);
  BOOST_TEST(at::rand({3}, ctx.generator()).equal(at::rand({3}, ref)));
}

BOOST_AUTO_TEST_CASE(map_equals_apply_over_dims_and_chunkings) {
  Engine engine;
  TensorDict td = sample();
  TensorDict expected = td.apply(plus_one);
  for (int64_t dim = -2; dim <= 1; ++dim) {
    std::vector<MapOptions> variants = {MapOptions().dim(dim), MapOptions().dim(dim).chunksize(0),
                                        MapOptions().dim(dim).chunksize(5), MapOptions().dim(dim).chunksize(1),
                                        MapOptions().dim(dim).num_chunks(3), MapOptions().dim(dim).num_workers(3)};
    for (size_t v = 0; v < variants.size(); ++v) {
      BOOST_TEST_CONTEXT("dim " << dim << " variant " << v) {
        TensorDict r = td.map(plus_one_fn(), variants[v]);
        BOOST_TEST(r.batch_size() == td.batch_size());
        BOOST_TEST(r.equal(expected));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(chunk_counts) {
  Engine engine;
  TensorDict td = sample();
  auto count = [&](const MapOptions& o) {
    std::atomic<int> calls{0};
    td.map(plus_one_fn(&calls), o);
    return calls.load();
  };
  BOOST_TEST(count(MapOptions().chunksize(3)) == 4);   // ceil(10/3)
  BOOST_TEST(count(MapOptions().chunksize(0)) == 10);  // one per element
  BOOST_TEST(count(MapOptions().num_chunks(3)) == 3);  // chunks of ceil(10/3) = 4: 4,4,2
  BOOST_TEST(count(MapOptions().num_chunks(20)) == 10);
  BOOST_TEST(count(MapOptions().num_workers(2)) == 2);  // neither: num_workers chunks
  BOOST_TEST(count(MapOptions().chunksize(100)) == 1);
}

BOOST_AUTO_TEST_CASE(chunksize_zero_removes_the_dim) {
  Engine engine;
  TensorDict td = sample();
  std::mutex mu;
  std::vector<BatchSize> seen;
  TensorDict r = td.map(
      [&](const TensorDict& c) {
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(c.batch_size());
        return c;
      },
      MapOptions().dim(1).chunksize(0));
  BOOST_TEST(seen.size() == 3u);
  for (auto& b : seen) BOOST_TEST(b == BatchSize{10});
  BOOST_TEST(r.equal(td));
}

BOOST_AUTO_TEST_CASE(results_in_order_despite_uneven_work) {
  Engine engine(Config::load(R"({"map": {"num_workers": 3}})"));
  TensorDict td({{"i", at::arange(30)}}, {30});
  TensorDict r = td.map(
      [](const TensorDict& c) {
        // early chunks are the slow ones: they complete last
        std::this_thread::sleep_for(milliseconds(c.get("i")[0].item<int64_t>() < 6 ? 20 : 1));
        return c;
      },
      MapOptions().chunksize(3));
  BOOST_TEST(at::equal(r.get("i"), at::arange(30)));
}

BOOST_AUTO_TEST_CASE(out_in_memory) {
  Engine engine;
  TensorDict td = sample();
  for (auto o : {MapOptions().chunksize(0), MapOptions().chunksize(5), MapOptions().dim(1).chunksize(2)}) {
    TensorDict out = zeros_like(td);
    TensorDict r = td.map(plus_one_fn(), o.out(out));
    BOOST_TEST(r.is_same(out));
    BOOST_TEST(out.equal(td.apply(plus_one)));
  }
}

BOOST_AUTO_TEST_CASE(out_shared_is_written_by_workers) {
  Engine engine;
  TensorDict td = sample();
  TensorDict out = zeros_like(td);
  out.share_memory_();
  BOOST_REQUIRE(out.is_shared());
  TensorDict r = td.map(plus_one_fn(), MapOptions().chunksize(5).out(out));
  BOOST_TEST(!r.defined());  // upstream returns None
  BOOST_TEST(out.equal(td.apply(plus_one)));
}

BOOST_AUTO_TEST_CASE(out_write_modes_give_the_same_files) {
  // map.out_write: pwrite into the page cache, MADV_POPULATE_WRITE then stores, or plain stores: the same
  // bytes in the files, for memmap and shared outs, chunks along dim 0 (contiguous) and dim 1 (strided: the
  // stores path), and results whose dtype differs from out's (converted as update_ does)
  fixtures::TempDir dir("map-out-write");
  TensorDict td = sample();
  TensorDict want = td.apply(plus_one);
  int n = 0;
  for (const char* mode : {"pwrite", "populate", "copy"}) {
    Engine engine(Config::load(std::string(R"({"map": {"out_write": ")") + mode + R"("}})"));
    for (auto o : {MapOptions().chunksize(3), MapOptions().dim(1).chunksize(2), MapOptions().chunksize(0)}) {
      BOOST_TEST_CONTEXT(mode << " dim " << o.dim() << " chunksize " << *o.chunksize()) {
        const std::string path = dir.path + "/out" + std::to_string(n++);
        TensorDict out = zeros_like(td).memmap(path);
        TensorDict r = td.map(plus_one_fn(), MapOptions(o).out(out));
        BOOST_TEST(!r.defined());
        BOOST_TEST(out.equal(want));
        BOOST_TEST(TensorDict::load_memmap(path).equal(want));
        TensorDict shared = zeros_like(td);
        shared.share_memory_();
        td.map(plus_one_fn(), MapOptions(o).out(shared));
        BOOST_TEST(shared.equal(want));
        // float64 results into the float32 leaves of out
        TensorDict out64 = zeros_like(td).memmap(path + "_64");
        td.map([](const TensorDict& c) { return c.apply([](const at::Tensor& t) {
                                          return t.is_floating_point() ? t.to(at::kDouble) + 1 : t + 1; }); },
               MapOptions(o).out(out64));
        BOOST_TEST(TensorDict::load_memmap(path + "_64").equal(want));
      }
    }
  }
  BOOST_CHECK_THROW(Config::load(R"({"map": {"out_write": "mmap"}})"), ValueError);
}

BOOST_AUTO_TEST_CASE(cheap_and_slow_fns_give_the_same_results) {
  // the caller runs chunk 0 and, from its cost, the rest alone or with helpers: either way the results are
  // in chunk order, every chunk runs once, and fn sees worker 0 (the caller) or a helper's context
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  TensorDict td({{"i", at::arange(40)}}, {40});
  for (int slow_ms : {0, 3}) {
    std::mutex mu;
    std::multiset<int64_t> starts;
    std::set<int64_t> workers, seeds;
    TensorDict r = td.map(
        [&](const TensorDict& c) {
          if (slow_ms) std::this_thread::sleep_for(milliseconds(slow_ms));
          const MapWorkerContext* w = current_map_worker();
          std::lock_guard<std::mutex> lock(mu);
          starts.insert(c.get("i")[0].item<int64_t>());
          if (w) {
            workers.insert(w->worker_index);
            seeds.insert(w->seed);
          }
          return c.apply(plus_one);
        },
        MapOptions().chunksize(4).seed(7));
    BOOST_TEST_CONTEXT("slow_ms " << slow_ms) {
      BOOST_TEST(at::equal(r.get("i"), at::arange(40) + 1));
      BOOST_TEST(starts.size() == 10u);
      BOOST_TEST(std::set<int64_t>(starts.begin(), starts.end()).size() == 10u);
      BOOST_TEST(workers.count(0) == 1u);  // the caller always runs chunk 0
      for (auto w : workers) BOOST_TEST((w == 0 || w == 1));
      for (auto s : seeds) BOOST_TEST((s == 7 || s == 8));
    }
  }
  BOOST_TEST(current_map_worker() == nullptr);
}

BOOST_AUTO_TEST_CASE(a_call_as_costly_as_the_last_starts_its_helpers_before_chunk_0) {
  // map times chunk 0 on the caller to decide on helpers; a call whose last predecessor's fn cost enough per
  // row starts them before chunk 0, so chunk 0 no longer runs alone. Seen here without timing: chunk 0 waits
  // (at most 5 s) until another worker has started a chunk. Then a cheap call after it: the early helpers are
  // retired after chunk 0 and every chunk still runs once, in order.
  if (std::thread::hardware_concurrency() < 2) {
    BOOST_TEST_MESSAGE("one core: map never starts helpers");
    return;
  }
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  TensorDict td({{"i", at::arange(40)}}, {40});
  std::atomic<int> others_started{0};
  std::atomic<bool> waited_out{false};
  auto slow = [&](bool wait_in_chunk_0) {
    return [&, wait_in_chunk_0](const TensorDict& c) {
      const bool chunk0 = c.get("i")[0].item<int64_t>() == 0;
      if (!chunk0) ++others_started;
      if (chunk0 && wait_in_chunk_0) {
        const auto deadline = steady_clock::now() + std::chrono::seconds(5);
        while (others_started.load() == 0 && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
        if (others_started.load() == 0) waited_out = true;
      } else {
        std::this_thread::sleep_for(milliseconds(5));
      }
      return c.apply(plus_one);
    };
  };
  // the first call has no predecessor: chunk 0 runs alone (it does not wait here)
  TensorDict r1 = td.map(slow(false), MapOptions().chunksize(4));
  BOOST_TEST(at::equal(r1.get("i"), at::arange(40) + 1));
  others_started = 0;
  TensorDict r2 = td.map(slow(true), MapOptions().chunksize(4));
  BOOST_TEST(at::equal(r2.get("i"), at::arange(40) + 1));
  BOOST_TEST(!waited_out.load());  // a helper started a chunk while chunk 0 ran
  // a cheap call next: started early on the slow call's cost, its helper is retired
  std::mutex mu;
  std::multiset<int64_t> starts;
  TensorDict r3 = td.map(
      [&](const TensorDict& c) {
        std::lock_guard<std::mutex> lock(mu);
        starts.insert(c.get("i")[0].item<int64_t>());
        return c.apply(plus_one);
      },
      MapOptions().chunksize(4));
  BOOST_TEST(at::equal(r3.get("i"), at::arange(40) + 1));
  BOOST_TEST(starts.size() == 10u);
  BOOST_TEST(std::set<int64_t>(starts.begin(), starts.end()).size() == 10u);
  // and one more slow call errs in chunk 0 with helpers started early: the error, and no fn after map returns
  std::atomic<bool> returned{false};
  std::atomic<int> late{0};
  const std::string m = message_of<ValueError>([&] {
    td.map(
        [&](const TensorDict& c) {
          std::this_thread::sleep_for(milliseconds(5));
          if (returned.load()) ++late;
          if (c.get("i")[0].item<int64_t>() == 0) throw ValueError("chunk 0");
          return c;
        },
        MapOptions().chunksize(4));
  });
  returned = true;
  std::this_thread::sleep_for(milliseconds(30));
  BOOST_TEST(m == "ValueError: chunk 0");
  BOOST_TEST(late.load() == 0);
}

BOOST_AUTO_TEST_CASE(helpers_that_lost_are_tried_again) {
  // a call whose helper ran slow (its chunk 50 ms, the caller's 2 ms) teaches map that helpers lose: the next
  // calls of a fn worth sharing (2 ms a chunk on any thread) run inline, but what helpers cost fades on every
  // such call, so a later call uses its helper again. Sleeps, with margins of 4x and more.
  if (std::thread::hardware_concurrency() < 2) {
    BOOST_TEST_MESSAGE("one core: map never starts helpers");
    return;
  }
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  TensorDict td({{"i", at::arange(40)}}, {40});
  std::atomic<int> helper_chunks{0};
  auto fn = [&](int helper_ms) {
    return [&, helper_ms](const TensorDict& c) {
      const MapWorkerContext* w = current_map_worker();
      const bool helper = w && w->worker_index > 0;
      if (helper) ++helper_chunks;
      std::this_thread::sleep_for(milliseconds(helper ? helper_ms : 2));
      return c.apply(plus_one);
    };
  };
  // teach: a call whose helper runs slow, then a call of the cheap-helper fn, until that one runs inline. On a
  // loaded machine the caller's 2 ms sleeps can overrun too, and one slow call may not teach it (CI once saw
  // the helper used right after): up to 10 rounds
  TensorDict r;
  bool learned = false;
  for (int round = 0; round < 10 && !learned; ++round) {
    helper_chunks = 0;
    r = td.map(fn(50), MapOptions().chunksize(4));  // chunk 0: 2 ms a chunk, worth a helper
    BOOST_TEST_REQUIRE(at::equal(r.get("i"), at::arange(40) + 1));
    helper_chunks = 0;
    r = td.map(fn(2), MapOptions().chunksize(4));
    BOOST_TEST_REQUIRE(at::equal(r.get("i"), at::arange(40) + 1));
    learned = helper_chunks.load() == 0;
  }
  BOOST_TEST_REQUIRE(learned);  // a slow helper made the next calls run inline
  int calls = 1;
  for (; calls < 60 && helper_chunks.load() == 0; ++calls) {
    r = td.map(fn(2), MapOptions().chunksize(4));
    BOOST_TEST_REQUIRE(at::equal(r.get("i"), at::arange(40) + 1));
  }
  BOOST_TEST_MESSAGE("a helper ran again after " << calls << " calls");
  BOOST_TEST(helper_chunks.load() >= 1);
}

BOOST_AUTO_TEST_CASE(no_fn_runs_after_map_throws) {
  // the first error stops the claims; map returns only when the chunks in hand are finished, so fn (which may
  // hold references to the caller's stack) never runs after map has thrown
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  TensorDict td({{"i", at::arange(64)}}, {64});
  for (int64_t bad : {0, 1, 9}) {
    std::atomic<bool> returned{false};
    std::atomic<int> late{0}, calls{0};
    auto fn = [&, bad](const TensorDict& c) {
      ++calls;
      std::this_thread::sleep_for(milliseconds(2));
      if (returned.load()) ++late;
      if (c.get("i")[0].item<int64_t>() == bad) throw ValueError("chunk " + std::to_string(bad));
      return c;
    };
    const std::string m = message_of<ValueError>([&] { td.map(fn, MapOptions().chunksize(1)); });
    returned = true;
    std::this_thread::sleep_for(milliseconds(20));
    BOOST_TEST(m == "ValueError: chunk " + std::to_string(bad));
    BOOST_TEST(late.load() == 0);
    BOOST_TEST(calls.load() < 64);
  }
}

BOOST_AUTO_TEST_CASE(fn_returning_none) {
  Engine engine;
  TensorDict td = sample();
  std::atomic<int> calls{0};
  TensorDict r = td.map(
      [&](const TensorDict&) {
        ++calls;
        return TensorDict::undefined();
      },
      MapOptions().chunksize(2));
  BOOST_TEST(!r.defined());
  BOOST_TEST(calls.load() == 5);
}

BOOST_AUTO_TEST_CASE(fn_writing_its_rows_of_a_memmap_out_itself) {
  // the main job's direct path: with a memmap out, fn writes its chunk's rows of out through out's mapping (its
  // chunk index from current_map_worker()) and returns None; map writes nothing over them, and every row is fn's
  Engine engine;
  fixtures::TempDir dir("map-out-direct");
  TensorDict td({{"i", at::arange(23)}}, {23});
  TensorDict out = TensorDict::from_schema({{"y", {{3}, at::kFloat}}}, {23}, "memmap", MemmapOptions().prefix(dir.path + "/out"));
  const at::Tensor y = out.get("y");
  std::atomic<int> calls{0}, wrong{0};
  TensorDict r = td.map(
      [&](const TensorDict& c) {
        ++calls;
        const MapWorkerContext* w = current_map_worker();
        const int64_t start = w ? w->chunk * 5 : -1;
        const int64_t n = c.batch_size()[0];
        if (start < 0 || c.get("i")[0].item<int64_t>() != start) ++wrong;
        if (start >= 0) y.narrow(0, start, n).copy_(c.get("i").unsqueeze(-1).to(at::kFloat).expand({n, 3}) * 2);
        return TensorDict::undefined();
      },
      MapOptions().chunksize(5).num_workers(2).out(out));
  BOOST_TEST(!r.defined());
  BOOST_TEST(calls.load() == 5);
  BOOST_TEST(wrong.load() == 0);
  TensorDict back = TensorDict::load_memmap(dir.path + "/out");
  BOOST_TEST(back.get("y").equal(at::arange(23).unsqueeze(-1).to(at::kFloat).expand({23, 3}) * 2));
}

BOOST_AUTO_TEST_CASE(worker_errors_propagate_with_type_and_message) {
  Engine engine;
  TensorDict td({{"i", at::arange(60)}}, {60});
  std::atomic<int> calls{0};
  auto failing = [&](auto make_error) {
    calls = 0;
    return [&calls, make_error](const TensorDict& c) {
      ++calls;
      if (c.get("i")[0].item<int64_t>() == 3) make_error();
      std::this_thread::sleep_for(milliseconds(2));
      return c;
    };
  };
  auto t0 = steady_clock::now();
  std::string m = message_of<TypeError>([&] {
    td.map(failing([] { throw TypeError("unsupported operand"); }), MapOptions().chunksize(1));
  });
  BOOST_TEST(m == "TypeError: unsupported operand");
  BOOST_TEST(calls.load() < 60);  // the others stopped
  m = message_of<ValueError>([&] {
    td.map(failing([] { throw ValueError("bad value in chunk"); }), MapOptions().chunksize(1));
  });
  BOOST_TEST(m == "ValueError: bad value in chunk");
  BOOST_TEST(calls.load() < 60);
  m = message_of<RuntimeError>([&] {
    td.map(failing([] { throw std::runtime_error("plain std error"); }), MapOptions().chunksize(1));
  });
  BOOST_TEST(m == "RuntimeError: plain std error");
  // map_iter too: the error comes out of next()
  m = message_of<KeyError>([&] {
    auto it = td.map_iter(failing([] { throw KeyError("missing"); }), MapOptions().chunksize(1));
    while (it.next()) {
    }
  });
  BOOST_TEST(m == "KeyError: missing");
  BOOST_CHECK(steady_clock::now() - t0 < std::chrono::seconds(10));
}

BOOST_AUTO_TEST_CASE(worker_errors_keep_code_and_bare_message) {
  // a message that starts with another type's name is carried verbatim (never parsed back), a torch error
  // inside fn arrives as the translated tensordict type without torch's backtrace
  Engine engine;
  TensorDict td({{"i", at::arange(8)}}, {8});
  auto throwing = [](std::function<void()> make_error) {
    return [make_error](const TensorDict& c) {
      if (c.get("i")[0].item<int64_t>() == 5) make_error();
      return c;
    };
  };
  std::string m = message_of<IndexError>([&] {
    td.map(throwing([] { throw IndexError("KeyError: not a key error"); }), MapOptions().chunksize(1));
  });
  BOOST_TEST(m == "IndexError: KeyError: not a key error");
  m = message_of<NotImplementedError>([&] {
    td.map(throwing([] { throw NotImplementedError("share_memory_ on this store"); }), MapOptions().chunksize(1));
  });
  BOOST_TEST(m == "NotImplementedError: share_memory_ on this store");
  m = message_of<IndexError>([&] {
    td.map(throwing([] { at::index_select(at::arange(3), 0, at::tensor({9}, at::kLong)); }),
           MapOptions().chunksize(1));
  });
  BOOST_TEST(m.find("index out of range") != std::string::npos, m);
  BOOST_TEST(m.find("Exception raised from") == std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(validation_before_any_worker) {
  Engine engine;
  TensorDict td = sample();
  std::atomic<int> calls{0};
  auto fn = plus_one_fn(&calls);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().num_workers(0)), ValueError);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().num_workers(-1)), ValueError);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().chunksize(-1)), ValueError);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().num_chunks(0)), ValueError);
  std::string m = message_of<ValueError>([&] { td.map(fn, MapOptions().chunksize(2).num_chunks(2)); });
  BOOST_TEST(m.find("but not both") != std::string::npos, m);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().dim(2)), IndexError);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().dim(-3)), IndexError);
  BOOST_CHECK_THROW(TensorDict({{"x", at::ones({2})}}, {}).map(fn, MapOptions()), IndexError);
  m = message_of<BatchSizeError>([&] { td.map(fn, MapOptions().out(td.index({Slice(0, 5)}).clone())); });
  BOOST_TEST(m.find("[5, 3]") != std::string::npos, m);
  BOOST_CHECK_THROW(td.map_iter(fn, MapOptions().out(td.clone())), ValueError);
  BOOST_CHECK_THROW(td.map(fn, MapOptions().shuffle(true)), ValueError);
  BOOST_CHECK_THROW(td.map_iter(fn, MapOptions().chunksize(1).num_chunks(1)), ValueError);
  BOOST_TEST(calls.load() == 0);
}

BOOST_AUTO_TEST_CASE(unstackable_results_name_the_chunk) {
  Engine engine;
  TensorDict td({{"i", at::arange(10)}}, {10});
  std::string m = message_of<Error>([&] {
    td.map(
        [](const TensorDict& c) {
          TensorDict r = c.clone();
          if (c.get("i")[0].item<int64_t>() == 4) r.set("extra", at::zeros(c.batch_size()));
          return r;
        },
        MapOptions().chunksize(2));
  });
  BOOST_TEST(m.find("chunk 2") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(map_iter_each_element_once) {
  Engine engine;
  TensorDict td({{"i", at::arange(23)}}, {23});
  MapFn id = [](const TensorDict& c) { return c.clone(); };
  for (bool shuffle : {false, true}) {
    for (int64_t cs : {int64_t{0}, int64_t{1}, int64_t{4}}) {
      BOOST_TEST_CONTEXT("shuffle " << shuffle << " chunksize " << cs) {
        std::vector<int64_t> got;
        for (const TensorDict& r : td.map_iter(id, MapOptions().chunksize(cs).shuffle(shuffle).seed(5))) {
          if (cs == 0) BOOST_TEST(r.batch_size().empty());
          auto t = r.get("i").reshape({-1});
          for (int64_t k = 0; k < t.numel(); ++k) got.push_back(t[k].item<int64_t>());
        }
        BOOST_TEST(got.size() == 23u);
        if (!shuffle) {
          for (int64_t k = 0; k < 23; ++k) BOOST_TEST(got[static_cast<size_t>(k)] == k);  // ordered contiguity
        }
        std::sort(got.begin(), got.end());
        for (int64_t k = 0; k < 23; ++k) BOOST_TEST(got[static_cast<size_t>(k)] == k);  // exactly once
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(map_iter_abandoned_early_stops_workers) {
  Engine engine;
  TensorDict td({{"i", at::arange(200)}}, {200});
  std::atomic<int> calls{0};
  MapFn slow = [&](const TensorDict& c) {
    ++calls;
    std::this_thread::sleep_for(milliseconds(10));
    return c;
  };
  auto t0 = steady_clock::now();
  {
    MapIter it = td.map_iter(slow, MapOptions().chunksize(1));
    BOOST_TEST(it.next().has_value());
    BOOST_TEST(it.next().has_value());
  }  // destroyed here
  // generous bound (the machine may be loaded): a destructor that waited for all 200 chunks takes >= 1 s
  // of worker sleep alone, and one that hangs never returns
  BOOST_CHECK(steady_clock::now() - t0 < std::chrono::seconds(30));
  // wait until no call starts for 300 ms (calls in flight finish their 10 ms sleep), bounded at 20 s;
  // workers that kept going would reach all 200 chunks
  int after = calls.load();
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(milliseconds(300));
    const int now = calls.load();
    if (now == after) break;
    after = now;
  }
  std::this_thread::sleep_for(milliseconds(300));
  BOOST_TEST(calls.load() == after);  // nothing runs any more
  BOOST_TEST(after < 100);
}

BOOST_AUTO_TEST_CASE(per_worker_seeds_and_context) {
  Engine engine;
  TensorDict td({{"i", at::arange(16)}}, {16});
  std::mutex mu;
  std::set<int64_t> seeds;
  std::set<int64_t> workers;
  std::atomic<int> without_context{0};
  // no Boost.Test assertion in here: fn runs on worker threads (Boost.Test is not thread-safe); what the
  // workers see is recorded and checked on the test's thread after map returns
  TensorDict r = td.map(
      [&](const TensorDict& c) {
        const MapWorkerContext* w = current_map_worker();
        if (w == nullptr) {
          ++without_context;
          return c.clone();
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          seeds.insert(w->seed);
          workers.insert(w->worker_index);
        }
        at::Generator g = w->generator();
        TensorDict out = c.clone();
        out.set("r", at::rand(c.batch_size(), g));
        return out;
      },
      MapOptions().chunksize(1).num_workers(2).seed(100));
  BOOST_TEST(without_context.load() == 0);
  BOOST_TEST(seeds.size() >= 1u);
  BOOST_TEST(current_map_worker() == nullptr);
  for (auto s : seeds) BOOST_TEST((s == 100 || s == 101));
  for (auto w : workers) BOOST_TEST((w == 0 || w == 1));
  BOOST_TEST(r.get("r").numel() == 16);
}

BOOST_AUTO_TEST_CASE(progress_smoke) {
  Engine engine(Config::load(R"({"map": {"progress_interval_ms": 0}})"));
  TensorDict td({{"i", at::arange(8)}}, {8});
  TensorDict r = td.map([](const TensorDict& c) { return c; }, MapOptions().chunksize(2).progress(true));
  BOOST_TEST(at::equal(r.get("i"), at::arange(8)));
}

BOOST_AUTO_TEST_CASE(map_equals_apply_over_the_zoo) {
  // upstream test_map: td.map(fn, dim) == td.apply(fn) for dims -2..3 on every zoo kind
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    TensorDict want = td.apply(plus_one);
    for (int64_t dim : {-2, -1, 0, 1, 2, 3}) {
      for (std::optional<int64_t> chunk : {std::optional<int64_t>(), std::optional<int64_t>(0), std::optional<int64_t>(2)}) {
        MapOptions o = MapOptions().dim(dim).num_workers(2);
        if (chunk) o.chunksize(*chunk);
        TensorDict got = td.map(plus_one_fn(), o);
        zoo::check_equal(got, want, kind.name + " dim " + std::to_string(dim) +
                                        (chunk ? " chunksize " + std::to_string(*chunk) : std::string()));
      }
    }
  }
}

// upstream test_map_with_out: a memmap out, written in place by the (in-process) workers, chunksize 0 and 5
BOOST_AUTO_TEST_CASE(out_memmap_is_written_by_workers) {
  Engine engine;
  fixtures::TempDir dir("map-out");
  TensorDict td = sample();
  for (int64_t cs : {0, 5}) {
    TensorDict out = td.apply([](const at::Tensor& t) { return at::zeros_like(t); })
                         .memmap(dir.path + "/out" + std::to_string(cs));
    BOOST_REQUIRE(out.is_memmap());
    TensorDict r = td.map(plus_one_fn(), MapOptions().chunksize(cs).out(out));
    BOOST_TEST(!r.defined());  // upstream returns None
    BOOST_TEST(out.equal(td.apply(plus_one)));
    // the files hold it: a fresh load sees the values
    BOOST_TEST(TensorDict::load_memmap(dir.path + "/out" + std::to_string(cs)).equal(td.apply(plus_one)));
  }
}

// upstream test_map_inplace: memmap chunks reach fn as views of the mapping (zero-copy), and fn may work in
// place on a memmap source and return nothing
BOOST_AUTO_TEST_CASE(memmap_chunks_are_views_of_the_mapping) {
  Engine engine;
  fixtures::TempDir dir("map-inplace");
  TensorDict src = sample().memmap(dir.path + "/src");
  const std::string file = *backends::mapped_filename(src.get("a"));
  std::atomic<int> mapped{0}, calls{0};
  TensorDict r = src.map(
      [&](const TensorDict& c) {
        ++calls;
        auto m = backends::mapping_of(c.get("a"));
        if (m && m->filename == file) ++mapped;
        c.get("a").mul_(0).add_(c.get("idx").unsqueeze(-1).to(at::kFloat));  // in place, on the files
        return TensorDict::undefined();
      },
      MapOptions().chunksize(2));
  BOOST_TEST(!r.defined());
  BOOST_TEST(calls.load() == 5);
  BOOST_TEST(mapped.load() == 5);
  TensorDict back = TensorDict::load_memmap(dir.path + "/src");
  BOOST_TEST(back.get("a").equal(back.get("idx").unsqueeze(-1).to(at::kFloat).expand({10, 3, 4})));
}

// upstream test_map_non_tensor: chunksize 0 restacks per-element non-tensor results into a NonTensorStack
BOOST_AUTO_TEST_CASE(chunksize_zero_restacks_non_tensor_results) {
  Engine engine;
  TensorDict td({{"i", at::arange(6)}}, {6});
  TensorDict r = td.map(
      [](const TensorDict& c) {
        TensorDict o(c.batch_size());
        o.set("i", c.get("i") * 2);
        o.set_non_tensor("name", JsonValue("row" + std::to_string(c.get("i").item<int64_t>())));
        return o;
      },
      MapOptions().chunksize(0));
  BOOST_TEST(r.batch_size() == BatchSize({6}));
  BOOST_TEST(r.get("i").equal(at::arange(6) * 2));
  BOOST_REQUIRE(r.get_entry("name").is_non_tensor_stack());
  for (int64_t k = 0; k < 6; ++k) {
    BOOST_TEST(r.index({k}).get_non_tensor("name").as_string() == "row" + std::to_string(k));
  }
  // equal values too: a NonTensorStack read as a list (upstream's default, capture_non_tensor_stack off)
  TensorDict same = td.map(
      [](const TensorDict& c) {
        TensorDict o(c.batch_size());
        o.set_non_tensor("tag", JsonValue("x"));
        return o;
      },
      MapOptions().chunksize(0));
  BOOST_TEST(same.get_non_tensor("tag").dump() == R"(["x","x","x","x","x","x"])");
}

// map copies each chunk's result into the call's result as it comes (map_detail::ChunkGather) instead of
// concatenating them at the end: the same values, dtypes and batch sizes as the plain loop's cat, a copy (not a
// view of the source), and every result that does not fit the first one's layout taken as cat takes it
namespace {
//! the plain loop the gather must equal: fn over the chunks, then cat
TensorDict loop_cat(const TensorDict& td, const MapFn& fn, int64_t chunk, int64_t dim) {
  std::vector<TensorDict> parts;
  for (const TensorDict& c : td.split(chunk, dim)) parts.push_back(fn(c));
  return cat(parts, dim);
}
//! the first leaf value of a chunk (dim 0: its row index in "i")
int64_t first_i(const TensorDict& c) { return c.get("i").flatten()[0].item<int64_t>(); }
}  // namespace

BOOST_AUTO_TEST_CASE(results_placed_as_they_come_equal_the_loops_cat) {
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  // batch [12, 3]: "i" row index, "x" float32, a nested level, a leaf that is channels-last
  TensorDict nested({{"b", at::randn({12, 3, 2})}}, {12, 3});
  TensorDict td({{"i", at::arange(12).unsqueeze(1).expand({12, 3}).contiguous()},
                 {"x", at::randn({12, 3, 4})},
                 {"img", at::randn({12, 3, 5, 6}).contiguous()},
                 {"nested", nested}},
                {12, 3});
  MapFn identity = [](const TensorDict& c) { return c; };
  MapFn slow_plus_one = [](const TensorDict& c) {  // worth a helper: both workers place rows
    std::this_thread::sleep_for(milliseconds(2));
    return c.apply(plus_one);
  };
  for (int64_t dim : {0, 1}) {
    for (int workers : {1, 2}) {
      for (const MapFn* fn : {&identity, &slow_plus_one}) {
        BOOST_TEST_CONTEXT("dim " << dim << " workers " << workers << (fn == &identity ? " identity" : " slow")) {
          const TensorDict expected = loop_cat(td, *fn, 1, dim);
          TensorDict r = td.map(*fn, MapOptions().dim(dim).chunksize(1).num_workers(workers));
          BOOST_TEST(r.batch_size() == td.batch_size());
          BOOST_TEST(r.equal(expected));
          BOOST_TEST(r.get("x").dtype() == expected.get("x").dtype());
        }
      }
    }
  }
  // a copy, as cat's result is: the identity fn's chunks are views of td, the result is not
  TensorDict r = td.map(identity, MapOptions().chunksize(4));
  const TensorDict before = r.clone();
  td.get("x").add_(100);
  td.get(NestedKey({"nested", "b"})).add_(100);
  BOOST_TEST(r.equal(before));
}

BOOST_AUTO_TEST_CASE(results_that_do_not_fit_the_first_are_concatenated_as_cat_would) {
  Engine engine(Config::load(R"({"map": {"num_workers": 2}})"));
  TensorDict td({{"i", at::arange(20)}, {"x", at::arange(20, at::kFloat)}}, {20});
  // each case: a fn whose result for the chunk starting at row 8 (or at every chunk but the first) differs
  std::vector<std::pair<std::string, std::function<TensorDict(const TensorDict&)>>> cases = {
      {"another dtype (promoted)",
       [](const TensorDict& c) {
         TensorDict o = c.clone();
         if (first_i(c) == 8) o.set("x", c.get("x").to(at::kDouble));
         return o;
       }},
      {"fewer rows", [](const TensorDict& c) { return first_i(c) == 8 ? c.index({Slice(0, 2)}).clone() : c.clone(); }},
      {"the first with fewer rows", [](const TensorDict& c) { return first_i(c) == 0 ? c.index({Slice(0, 1)}).clone() : c.clone(); }},
      {"keys in another order",
       [](const TensorDict& c) {
         if (first_i(c) != 8) return c.clone();
         return TensorDict({{"x", c.get("x").clone()}, {"i", c.get("i").clone()}}, c.batch_size());
       }},
      {"a non-tensor leaf",
       [](const TensorDict& c) {
         TensorDict o = c.clone();
         o.set_non_tensor("tag", JsonValue("t"));
         return o;
       }},
      {"autograd",
       [](const TensorDict& c) {
         TensorDict o = c.clone();
         o.set("x", c.get("x").clone().requires_grad_(true) * 2);
         return o;
       }},
      {"no result for one chunk",
       [](const TensorDict& c) { return first_i(c) == 8 ? TensorDict::undefined() : c.clone(); }},
  };
  for (const auto& [name, f] : cases) {
    for (bool slow : {false, true}) {
      BOOST_TEST_CONTEXT(name << (slow ? ", slow (helpers)" : "")) {
        MapFn fn = [f = f, slow](const TensorDict& c) {
          if (slow) std::this_thread::sleep_for(milliseconds(2));
          return f(c);
        };
        std::vector<TensorDict> parts;
        for (const TensorDict& c : td.split(4, 0)) {
          TensorDict p = fn(c);
          if (p.defined()) parts.push_back(p);
        }
        const TensorDict expected = cat(parts, 0);
        TensorDict r = td.map(fn, MapOptions().chunksize(4));
        BOOST_TEST(r.batch_size() == expected.batch_size());
        BOOST_TEST(r.get("x").dtype() == expected.get("x").dtype());
        BOOST_TEST(at::equal(r.get("x").detach(), expected.get("x").detach()));
        BOOST_TEST(at::equal(r.get("i"), expected.get("i")));
        BOOST_TEST(r.get("x").requires_grad() == expected.get("x").requires_grad());
        BOOST_TEST(r.contains("tag") == expected.contains("tag"));
        if (expected.contains("tag")) BOOST_TEST(r.get_non_tensor("tag").dump() == expected.get_non_tensor("tag").dump());
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
