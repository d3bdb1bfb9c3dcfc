// td.map against the plain loop, as one JSON object on stdout (issue 13's figures, measured in one run):
//  - the per-call fixed cost: a map call over 10 chunks with an identity fn (median), on a small TensorDict
//    (the cost without data) and on the 10,000-row one of the throughput figures, each beside the plain loop
//    (split, fn, cat) over the same chunks;
//  - a cheap fn (x + 1) over 10,000 rows, chunks of 1,000, 2 workers, against the same fn in a plain
//    single-thread loop;
//  - a heavy elementwise fn (16 rounds of sin/cos per leaf) with 1 and 2 workers against the plain loop.
// The plain loop is `for chunk in td.split(c): parts.push_back(fn(chunk)); cat(parts)`, run on the calling
// thread with one torch thread (as a map worker runs, map.torch_threads_per_worker = 1). Samples of map and
// of the loop alternate, so that a load change on the machine hits both; ratios are of medians.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench_map_fns.hpp"
#include "bench_common.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using benchutil::fmt;
using benchutil::Json;
using benchutil::median;
using clk = std::chrono::steady_clock;

namespace {

double us_since(clk::time_point t0) { return std::chrono::duration<double, std::micro>(clk::now() - t0).count(); }

TensorDict plain_loop(const TensorDict& td, const MapFn& fn, int64_t chunk) {
  std::vector<TensorDict> parts;
  for (const TensorDict& c : td.split(chunk, 0)) parts.push_back(fn(c));
  return cat(parts, 0);
}

struct Medians {
  double map_us = 0, loop_us = 0;
};

//! `samples` alternating single calls of map and of the plain loop (after `warm` of each); medians
template <class M, class L>
Medians alternate(int warm, int samples, M&& run_map, L&& run_loop) {
  for (int i = 0; i < warm; ++i) {
    run_map();
    run_loop();
  }
  std::vector<double> a, b;
  for (int i = 0; i < samples; ++i) {
    auto t0 = clk::now();
    run_map();
    a.push_back(us_since(t0));
    t0 = clk::now();
    run_loop();
    b.push_back(us_since(t0));
  }
  return {median(a), median(b)};
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);  // the loop runs as a map worker does (one torch thread)
  Engine engine;
  const int64_t rows = 10000;
  TensorDict td({{"x", at::randn({rows, 64})}, {"y", at::randn({rows, 16})}}, {rows});
  TensorDict small({{"x", at::randn({100, 8})}}, {100});
  MapFn id = benchutil::identity_fn();
  MapFn cheap = benchutil::cheap_fn();
  MapFn heavy = benchutil::heavy_fn();
  Json out;
  // for a profiler: the heavy fn's 2-worker map alone, N calls
  if (argc > 2 && std::string(argv[1]) == "--heavy-only") {
    const int calls = std::atoi(argv[2]);
    const auto t0 = clk::now();
    double map_us = 0;
    for (int i = 0; i < calls; ++i) {
      const auto t1 = clk::now();
      td.map(heavy, MapOptions().chunksize(500).num_workers(2));
      map_us += us_since(t1);
      if (std::getenv("TD_BENCH_VERBOSE")) std::fprintf(stderr, "%.0f ", us_since(t1));
      if (argc > 3) plain_loop(td, heavy, 500);  // alternating with the loop, as the full run does
    }
    std::printf("{\"heavy_two_workers_map_only_rows_per_s\": %.0f}\n", rows * calls / (map_us * 1e-6));
    std::printf("{\"heavy_two_workers_rows_per_s\": %.0f}\n", rows * calls / (us_since(t0) * 1e-6));
    return 0;
  }

  // for a profiler: the 10-chunk identity (or cheap) call over 10,000 rows, N calls (`loop`: the plain loop
  // instead; `one`: map with one worker)
  if (argc > 2 && (std::string(argv[1]) == "--identity-only" || std::string(argv[1]) == "--cheap-only")) {
    const bool is_cheap = std::string(argv[1]) == "--cheap-only";
    const MapFn& f = is_cheap ? cheap : id;
    const int calls = std::atoi(argv[2]);
    const std::string how = argc > 3 ? argv[3] : "";
    const bool loop = how == "loop", one = how == "one";
    std::vector<double> us;
    for (int i = 0; i < calls; ++i) {
      const auto t0 = clk::now();
      if (loop) {
        plain_loop(td, f, 1000);
      } else {
        td.map(f, MapOptions().chunksize(1000).num_workers(one ? 1 : 2));
      }
      us.push_back(us_since(t0));
    }
    std::printf("{\"%s_10_chunks_median_us\": %.1f}\n", is_cheap ? "cheap" : "identity", median(us));
    return 0;
  }

  // ---- fixed cost: 10 chunks, identity fn, 2 workers
  const Medians fixed_small =
      alternate(50, 400, [&] { small.map(id, MapOptions().chunksize(10).num_workers(2)); },
                [&] { plain_loop(small, id, 10); });
  const Medians fixed_big = alternate(20, 200, [&] { td.map(id, MapOptions().chunksize(1000).num_workers(2)); },
                                      [&] { plain_loop(td, id, 1000); });
  out.obj("call_identity_10_chunks",
          Json()
              .obj("small_100_rows", Json()
                                         .num("map_median_us", fixed_small.map_us)
                                         .num("plain_loop_median_us", fixed_small.loop_us)
                                         .num("map_minus_loop_us", fixed_small.map_us - fixed_small.loop_us))
              .obj("rows_10000", Json()
                                     .num("map_median_us", fixed_big.map_us)
                                     .num("plain_loop_median_us", fixed_big.loop_us)
                                     .num("map_minus_loop_us", fixed_big.map_us - fixed_big.loop_us)));

  // ---- cheap fn: x + 1, 10,000 rows, chunks of 1,000, 2 workers
  {
    const Medians s = alternate(10, 200, [&] { td.map(cheap, MapOptions().chunksize(1000).num_workers(2)); },
                                [&] { plain_loop(td, cheap, 1000); });
    out.obj("cheap_x_plus_1", Json()
                                  .num("rows", rows, 0)
                                  .num("chunk_rows", 1000, 0)
                                  .num("workers", 2, 0)
                                  .num("map_rows_per_s", rows / s.map_us * 1e6, 0)
                                  .num("plain_loop_rows_per_s", rows / s.loop_us * 1e6, 0)
                                  .num("map_vs_loop", s.loop_us / s.map_us, 2));
  }

  // ---- heavy fn: 1 and 2 workers, chunks of 500
  {
    const Medians two = alternate(1, 9, [&] { td.map(heavy, MapOptions().chunksize(500).num_workers(2)); },
                                  [&] { plain_loop(td, heavy, 500); });
    const Medians one = alternate(1, 5, [&] { td.map(heavy, MapOptions().chunksize(500).num_workers(1)); },
                                  [&] { plain_loop(td, heavy, 500); });
    // the same run's reference for two workers: two plain threads, each the loop over half the chunks (no map).
    // What the machine gives two threads right now (another process on a core, the kernel's writeback after a
    // job that wrote a GB) shows here as well as in the map's figure
    const TensorDict first = td.index({at::indexing::Slice(0, rows / 2)});
    const TensorDict second = td.index({at::indexing::Slice(rows / 2, rows)});
    const Medians threads = alternate(1, 9,
                                      [&] {
                                        std::thread t([&] { plain_loop(second, heavy, 500); });
                                        plain_loop(first, heavy, 500);
                                        t.join();
                                      },
                                      [&] { plain_loop(td, heavy, 500); });
    out.obj("heavy_16_rounds_sin_cos",
            Json()
                .num("rows", rows, 0)
                .num("chunk_rows", 500, 0)
                .num("two_workers_rows_per_s", rows / two.map_us * 1e6, 0)
                .num("one_worker_rows_per_s", rows / one.map_us * 1e6, 0)
                .num("plain_loop_rows_per_s", rows / two.loop_us * 1e6, 0)
                .num("two_workers_vs_loop", two.loop_us / two.map_us, 2)
                .num("one_worker_vs_loop", one.loop_us / one.map_us, 2)
                .num("two_vs_one", one.map_us / two.map_us, 2)
                .num("two_plain_threads_vs_loop", threads.loop_us / threads.map_us, 2)
                .num("two_workers_vs_two_plain_threads", threads.map_us / two.map_us, 2));
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
