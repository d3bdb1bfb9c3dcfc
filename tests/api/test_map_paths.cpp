// One map path with one behaviour (issue 35, item 22): whichever way map is called (td.map with a closure or a
// name, Engine::map with either, map_iter of both), fn gets a lazy stack's chunks in their dense form; and
// worker processes write their chunks into `out` the way the config's map.out_write says, as the caller's
// threads do. The worker executable is td_map_worker (tests/api/map_worker_main.cpp).
#include <algorithm>
#include <atomic>
#include <map>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "api/map_process_fns.hpp"
#include "engine/fixtures.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensordict.hpp"

#ifndef TD_MAP_WORKER_EXE
#error "TD_MAP_WORKER_EXE (the path of td_map_worker) must be defined"
#endif

using namespace tensordict;

namespace {

//! batch [6, 5]: "x" = a dense leaf, "st" = a lazy stack of 6 members of batch [5] (stack dim 0)
TensorDict with_lazy_stack() {
  std::vector<TensorDict> members;
  for (int64_t i = 0; i < 6; ++i) {
    members.push_back(TensorDict({{"a", at::full({5, 2}, static_cast<double>(i))}, {"i", at::full({5}, i)}}, {5}));
  }
  TensorDict td({{"x", at::arange(30, at::kFloat).reshape({6, 5})}}, {6, 5});
  td.set("st", TensorDict(LazyStackedTensorDict(members, 0)));
  return td;
}

//! fn: +1 on every leaf; counts the calls whose chunk (or its "st") is not dense (a lazy stack)
MapFn plus_one_counting(std::atomic<int>* calls, std::atomic<int>* lazy) {
  return [calls, lazy](const TensorDict& c) {
    ++*calls;
    if (LazyStackedTensorDict::is_lazy_stack(c) || LazyStackedTensorDict::is_lazy_stack(c.get_td("st"))) ++*lazy;
    return c.apply([](const at::Tensor& t) { return t + 1; });
  };
}

//! the values of a 1-d leaf at each chunk's first row, per worker index, in the order each worker ran them
std::map<int64_t, std::vector<int64_t>> faults_per_worker(const TensorDict& out, int64_t rows, int64_t chunk) {
  std::map<int64_t, std::vector<int64_t>> per;
  const at::Tensor f = out.get("faults");
  const at::Tensor w = out.get("w");
  for (int64_t r = 0; r < rows; r += chunk) per[w[r].item<int64_t>()].push_back(f[r].item<int64_t>());
  for (auto& kv : per) std::sort(kv.second.begin(), kv.second.end());  // a process's count only grows
  return per;
}

//! the median growth of the fault count between two consecutive calls of one worker
int64_t median_growth(const std::map<int64_t, std::vector<int64_t>>& per) {
  std::vector<int64_t> d;
  for (const auto& kv : per)
    for (size_t i = 1; i < kv.second.size(); ++i) d.push_back(kv.second[i] - kv.second[i - 1]);
  BOOST_REQUIRE_GE(d.size(), 4u);
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

}  // namespace

BOOST_AUTO_TEST_SUITE(map_paths)

BOOST_AUTO_TEST_CASE(every_map_path_gives_fn_dense_chunks_of_a_lazy_stack) {
  Engine engine;
  const TensorDict td = with_lazy_stack();
  const TensorDict want = td.contiguous().apply([](const at::Tensor& t) { return t + 1; });
  std::atomic<int> calls{0}, lazy{0};
  register_map_fn("map_paths_plus_one", plus_one_counting(&calls, &lazy));
  const MapFn fn = plus_one_counting(&calls, &lazy);
  const MapOptions o = MapOptions().chunksize(2).num_workers(2);
  auto drain = [](MapIter it) {
    std::vector<TensorDict> parts;
    while (auto r = it.next()) parts.push_back(*r);
    return cat(parts, 0);
  };
  const std::vector<std::pair<const char*, std::function<TensorDict()>>> paths = {
      {"td.map(fn)", [&] { return td.map(fn, o); }},
      {"td.map(name)", [&] { return td.map("map_paths_plus_one", o); }},
      {"Engine::map(fn)", [&] { return engine.map(td, fn, o); }},
      {"Engine::map(name)", [&] { return engine.map(td, "map_paths_plus_one", o); }},
      {"td.map_iter", [&] { return drain(td.map_iter(fn, o)); }},
      {"Engine::map_iter", [&] { return drain(engine.map_iter(td, fn, o)); }},
  };
  for (const auto& p : paths) {
    calls = 0;
    lazy = 0;
    TensorDict r = p.second();
    BOOST_TEST_CONTEXT(p.first) {
      BOOST_TEST(calls.load() == 3);
      BOOST_TEST(lazy.load() == 0);  // every chunk reached fn dense
      BOOST_TEST(r.batch_size() == td.batch_size());
      BOOST_TEST(r.contiguous().equal(want));
    }
  }
}

BOOST_AUTO_TEST_CASE(worker_processes_write_out_as_map_out_write_says) {
  // map.out_write "copy" stores through the worker's fresh mapping of out (a page fault per 4 KiB page
  // written); "pwrite" writes into the file (no fault). The workers count their faults between two calls.
  map_process_test::register_fns();
  fixtures::TempDir dir("map-paths");
  constexpr int64_t kRows = 4096, kChunk = 256;  // chunks of 1 MiB of "x": 256 pages
  TensorDict src({{"i", at::arange(kRows)}}, {kRows});
  src.memmap_(dir.path + "/src");
  std::map<std::string, int64_t> growth;
  for (const char* mode : {"copy", "pwrite"}) {
    Engine engine(Config::load(std::string(R"({"map": {"out_write": ")") + mode + R"("}})"));
    TensorDict out = TensorDict::from_schema({{"x", {{1024}, at::kFloat}}, {"faults", {{}, at::kLong}}, {"w", {{}, at::kLong}}},
                                             {kRows}, "memmap", MemmapOptions().prefix(dir.path + "/out_" + mode));
    engine.map(src, "mp_faults",
               MapOptions().worker_processes(2).num_workers(2).chunksize(kChunk).out(out).worker_executable(TD_MAP_WORKER_EXE));
    BOOST_TEST(out.get("x").eq(1).all().item<bool>(), mode);
    const auto per = faults_per_worker(out, kRows, kChunk);
    for (const auto& kv : per) BOOST_TEST(kv.first >= 0, mode << ": a chunk not run by a worker process");
    growth[mode] = median_growth(per);
    BOOST_TEST_MESSAGE(mode << ": median page faults between two calls of a worker: " << growth[mode]);
  }
  BOOST_TEST(growth["copy"] >= 200, "copy: " << growth["copy"] << " faults per 256-page chunk");
  BOOST_TEST(growth["pwrite"] < 128, "pwrite: " << growth["pwrite"] << " faults per 256-page chunk");
}

BOOST_AUTO_TEST_SUITE_END()
