//! bench_core: the in-memory TensorDict against the same work done on raw libtorch tensors.
//! Shape of upstream's storage benchmark: N = 10,000 rows, 5 float32 leaves of 64 features.
//! Prints one JSON object (unit: microseconds per call, median over many samples after warm-up);
//! each result has td_us, raw_us and ratio = td_us / raw_us. Targets are reported, never asserted.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/Parallel.h>
#include <tensordict/tensordict.hpp>

using namespace tensordict;
using at::indexing::None;
using at::indexing::Slice;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kRows = 10000;
constexpr int64_t kBigRows = 1000000;  // the replay-buffer refill larger than the caches
constexpr int64_t kFeatures = 64;
constexpr int kLeaves = 5;
constexpr double kSampleMinUs = 300;    // one sample runs `inner` calls and lasts at least this long
constexpr double kBudgetUsPerOp = 6e5;  // time spent sampling one op (td + raw), about 0.6 s

volatile int64_t g_sink = 0;  // keeps results observable
void sink(const at::Tensor& t) { g_sink = g_sink + t.numel(); }
void sink(const TensorDict& td) { g_sink = g_sink + td.numel(); }
void sink(int64_t n) { g_sink = g_sink + n; }

template <class F>
double run_us(F& f, int inner) {
  auto t0 = Clock::now();
  for (int i = 0; i < inner; ++i) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

template <class F>
int calibrate(F& f) {
  int inner = 1;
  while (inner < (1 << 20)) {
    if (run_us(f, inner) >= kSampleMinUs) break;
    inner *= 2;
  }
  return inner;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Result {
  std::string name;
  double td_us, raw_us;
};
std::vector<Result> g_results;

//! warms up, calibrates, then alternates td and raw samples; records the medians of the per-call times
template <class FT, class FR>
Result measure(const std::string& name, FT ftd, FR fraw) {
  for (int i = 0; i < 3; ++i) {
    ftd();
    fraw();
  }
  int inner_td = calibrate(ftd), inner_raw = calibrate(fraw);
  double sample_us = run_us(ftd, inner_td) + run_us(fraw, inner_raw);
  int reps = static_cast<int>(std::clamp(kBudgetUsPerOp / std::max(sample_us, 1.0), 7.0, 301.0));
  std::vector<double> td, raw;
  for (int r = 0; r < reps; ++r) {
    td.push_back(run_us(ftd, inner_td) / inner_td);
    raw.push_back(run_us(fraw, inner_raw) / inner_raw);
  }
  Result res{name, median(td), median(raw)};
  g_results.push_back(res);
  return res;
}

std::vector<std::string> leaf_names() {
  std::vector<std::string> names;
  for (int k = 0; k < kLeaves; ++k) names.push_back("leaf" + std::to_string(k));
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  at::manual_seed(0);
  const auto names = leaf_names();
  // for a profiler: the refill loop alone, N passes over a buffer of ROWS rows (kRows; kBigRows for the refill
  // larger than the caches), after one untimed pass that faults the buffer in
  if (argc > 2 && std::string(argv[1]) == "--refill-only") {
    Dict src;
    for (const auto& n : names) src.emplace_back(n, at::randn({kFeatures}));
    const TensorDict sample(src);
    const int64_t rows = argc > 3 ? std::atoll(argv[3]) : kRows;
    TensorDict pre(BatchSize{rows});
    for (int64_t i = 0; i < rows; ++i) pre.index_put_(i, sample);
    const int passes = std::atoi(argv[2]);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < passes; ++r)
      for (int64_t i = 0; i < rows; ++i) pre.index_put_(i, sample);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"refill_rows_per_s\": %.0f}\n", static_cast<double>(rows) * passes / s);
    return 0;
  }

  // ---- data: one TensorDict and the same 5 tensors held raw
  std::vector<at::Tensor> raw;
  std::unordered_map<std::string, at::Tensor> raw_map;
  Dict source;
  for (const auto& n : names) {
    at::Tensor t = at::randn({kRows, kFeatures});
    raw.push_back(t);
    raw_map[n] = t;
    source.emplace_back(n, t);
  }
  TensorDict td(source, {kRows});

  // ---- the five indices
  at::Tensor random_rows = at::randperm(kRows, at::kLong).index({Slice(0, 256)});
  at::Tensor mask = at::zeros({kRows}, at::kBool);
  mask.index_put_({at::randperm(kRows, at::kLong).index({Slice(0, 256)})}, true);
  struct Case {
    std::string name;
    Index index;
  };
  std::vector<Case> cases = {
      {"int[42]", {42}},
      {"slice[100:356]", {Slice(100, 356)}},
      {"step[::3]", {Slice(None, None, 3)}},
      {"long[256 random rows]", {random_rows}},
      {"mask[256 rows]", {mask}},
  };

  // ---- reads: td[idx] vs 5 x t.index(idx)
  for (const auto& c : cases) {
    const Index& idx = c.index;
    measure(
        "index " + c.name, [&] { sink(td.index(idx)); },
        [&] {
          for (const auto& t : raw) sink(t.index(idx));
        });
  }
  // ---- writes: td.index_put_(idx, sub) vs 5 x t.index_put_(idx, sub_t)
  for (const auto& c : cases) {
    const Index& idx = c.index;
    TensorDict sub = td.index(idx).clone();
    std::vector<at::Tensor> raw_sub;
    for (const auto& t : raw) raw_sub.push_back(t.index(idx).clone());
    measure(
        "index_put_ " + c.name, [&] { td.index_put_(idx, sub); },
        [&] {
          for (int k = 0; k < kLeaves; ++k) raw[k].index_put_(idx, raw_sub[k]);
        });
  }

  // ---- keys: get / set one key, keys()  (raw: an unordered_map<string, Tensor>)
  measure(
      "get one key", [&] { sink(td.get("leaf3")); }, [&] { sink(raw_map.at("leaf3")); });
  at::Tensor replacement = raw[3];
  measure(
      "set one key", [&] { td.set("leaf3", replacement); }, [&] { raw_map["leaf3"] = replacement; });
  measure(
      "keys()", [&] { sink(static_cast<int64_t>(td.keys().size())); },
      [&] {
        std::vector<std::string> ks;
        ks.reserve(raw_map.size());
        for (const auto& kv : raw_map) ks.push_back(kv.first);
        sink(static_cast<int64_t>(ks.size()));
      });

  // ---- whole-TensorDict ops
  // the raw side keeps its 5 results alive together, as the TensorDict does: freeing 2.56 MB at a time lets
  // glibc reuse the same pages, while a 12.8 MB release is trimmed and page-faulted again on the next call
  measure(
      "clone()", [&] { sink(td.clone()); },
      [&] {
        std::vector<at::Tensor> out;
        for (const auto& t : raw) out.push_back(t.clone());
        sink(out.back());
      });
  measure(
      "apply(x + 1)", [&] { sink(td.apply([](const at::Tensor& x) { return x + 1; })); },
      [&] {
        std::vector<at::Tensor> out;
        for (const auto& t : raw) out.push_back(t + 1);
        sink(out.back());
      });

  // stack of 64 small TensorDicts (batch [3], 10 leaves of shape [3]) vs 10 x at::stack of 64 tensors
  std::vector<TensorDict> small_tds;
  std::vector<std::vector<at::Tensor>> small_raw(10);
  for (int i = 0; i < 64; ++i) {
    Dict d;
    for (int k = 0; k < 10; ++k) {
      at::Tensor t = at::randn({3});
      d.emplace_back("k" + std::to_string(k), t);
      small_raw[k].push_back(t);
    }
    small_tds.emplace_back(d, BatchSize{3});
  }
  measure(
      "stack(64 TDs of 10 leaves [3])", [&] { sink(stack(small_tds, 0)); },
      [&] {
        for (const auto& ts : small_raw) sink(at::stack(ts, 0));
      });

  // ---- lazy stack of 100 members (batch [100], 5 leaves [64]) against the same data stacked densely:
  //      td_us = the lazy stack, raw_us = the dense TensorDict (ratio = lazy / dense)
  std::vector<TensorDict> lazy_members;
  for (int m = 0; m < 100; ++m) {
    Dict d;
    for (const auto& n : names) d.emplace_back(n, at::randn({100, kFeatures}));
    lazy_members.emplace_back(d, BatchSize{100});
  }
  LazyStackedTensorDict lazy = lazy_stack(lazy_members, 0);
  TensorDict dense_stack = stack(lazy_members, 0);
  at::Tensor lazy_rows = at::randint(0, 100, {256}, at::kLong);
  const std::vector<std::pair<std::string, Index>> lazy_cases = {
      {"int[42]", {42}}, {"slice[10:60]", {Slice(10, 60)}}, {"long[256 random members]", {lazy_rows}},
      {"[:, 7] (per member)", {Slice(), 7}}};
  for (const auto& c : lazy_cases) {
    const Index& idx = c.second;
    measure(
        "lazy_stack(100) index " + c.first + " vs dense", [&] { sink(lazy.index(idx)); },
        [&] { sink(dense_stack.index(idx)); });
  }
  measure(
      "lazy_stack(100) get(key) vs dense", [&] { sink(lazy.get("leaf2")); }, [&] { sink(dense_stack.get("leaf2")); });

  // ---- preallocate-and-fill: buf.index_put_(i, sample) for every row of an empty TensorDict(BatchSize{N})
  //      (the first write allocates the leaves) vs 5 x t.select(0, i).copy_(v) into fresh zeros
  Dict sample_src;
  std::vector<at::Tensor> raw_sample;
  for (const auto& n : names) {
    at::Tensor t = at::randn({kFeatures});
    sample_src.emplace_back(n, t);
    raw_sample.push_back(t);
  }
  TensorDict sample(sample_src);
  auto fill_td = [&] {
    TensorDict buf(BatchSize{kRows});
    for (int64_t i = 0; i < kRows; ++i) buf.index_put_(i, sample);
    sink(buf);
  };
  auto fill_raw = [&] {
    std::vector<at::Tensor> buf;
    for (int k = 0; k < kLeaves; ++k) buf.push_back(at::zeros({kRows, kFeatures}));
    for (int64_t i = 0; i < kRows; ++i)
      for (int k = 0; k < kLeaves; ++k) buf[k].select(0, i).copy_(raw_sample[k]);
    sink(buf[0]);
  };
  Result fill = measure("fill 10000 rows (alloc + index_put_ per row)", fill_td, fill_raw);
  // the same loop into buffers that already exist (a replay buffer being overwritten): no allocation
  TensorDict pre(BatchSize{kRows});
  pre.index_put_({0}, sample);
  std::vector<at::Tensor> pre_raw;
  for (int k = 0; k < kLeaves; ++k) pre_raw.push_back(at::zeros({kRows, kFeatures}));
  auto refill_td = [&] {
    for (int64_t i = 0; i < kRows; ++i) pre.index_put_(i, sample);
  };
  auto refill_raw = [&] {
    for (int64_t i = 0; i < kRows; ++i)
      for (int k = 0; k < kLeaves; ++k) pre_raw[k].select(0, i).copy_(raw_sample[k]);
  };
  Result refill = measure("refill 10000 rows (preallocated, index_put_(i, row) per row)", refill_td, refill_raw);
  // the same through an Index ({i}: a std::vector<TensorIndex> built by each call)
  measure(
      "refill 10000 rows (preallocated, index_put_({i}, row) per row)",
      [&] {
        for (int64_t i = 0; i < kRows; ++i) pre.index_put_({i}, sample);
      },
      refill_raw);

  // the floor of a refill: the same rows' bytes, one memcpy per leaf into plain buffers (alternated with the
  // refill in measure(): the second line of the pair is the floor)
  std::vector<std::vector<float>> floor_dst(kLeaves, std::vector<float>(static_cast<size_t>(kRows * kFeatures)));
  std::vector<const float*> floor_src;
  for (int k = 0; k < kLeaves; ++k) floor_src.push_back(raw_sample[k].data_ptr<float>());
  Result refill_floor = measure(
      "refill 10000 rows against the memcpy floor (one memcpy per leaf and row)", refill_td,
      [&] {
        for (int64_t i = 0; i < kRows; ++i)
          for (int k = 0; k < kLeaves; ++k)
            std::memcpy(floor_dst[k].data() + i * kFeatures, floor_src[k], kFeatures * sizeof(float));
        sink(static_cast<int64_t>(floor_dst[0][static_cast<size_t>(kFeatures)]));
      });

  // the same refill into a replay buffer of kBigRows rows (1.28 GB: a real buffer of a million transitions), far
  // larger than any cache, against its memcpy floor: one memcpy per leaf and row into tensors of the same size
  // from the same allocator. Each pass walks the whole buffer, so the bytes come from and go to memory, the
  // floor the 7.6-8.4 GB/s names; the 12.8 MB refill above stays in L3 (its floor is the cache's)
  TensorDict big(BatchSize{kBigRows});
  big.index_put_(int64_t{0}, sample);
  std::vector<at::Tensor> big_raw;
  for (int k = 0; k < kLeaves; ++k) big_raw.push_back(at::zeros({kBigRows, kFeatures}));
  std::vector<float*> big_dst;
  for (auto& t : big_raw) big_dst.push_back(t.data_ptr<float>());
  Result big_refill = measure(
      "refill 1000000 rows (1.28 GB) against the memcpy floor (one memcpy per leaf and row)",
      [&] {
        for (int64_t i = 0; i < kBigRows; ++i) big.index_put_(i, sample);
      },
      [&] {
        for (int64_t i = 0; i < kBigRows; ++i)
          for (int k = 0; k < kLeaves; ++k)
            std::memcpy(big_dst[k] + i * kFeatures, floor_src[k], kFeatures * sizeof(float));
        sink(static_cast<int64_t>(big_dst[0][kFeatures]));
      });

  // ---- JSON
  std::printf("{\"benchmark\":\"core\",\"unit\":\"us\",\n");
  std::printf(" \"config\":{\"rows\":%lld,\"leaves\":%d,\"features\":%lld,\"dtype\":\"float32\",\"torch_threads\":%d},\n",
              static_cast<long long>(kRows), kLeaves, static_cast<long long>(kFeatures), at::get_num_threads());
  std::printf(" \"targets\":{\"index_ratio_max\":1.5,\"fill_rows_per_s_min\":1000000},\n");
  std::printf(" \"results\":[\n");
  for (size_t i = 0; i < g_results.size(); ++i) {
    const auto& r = g_results[i];
    std::printf("  {\"name\":\"%s\",\"td_us\":%.3f,\"raw_us\":%.3f,\"ratio\":%.3f}%s\n", r.name.c_str(), r.td_us,
                r.raw_us, r.td_us / r.raw_us, i + 1 < g_results.size() ? "," : "");
  }
  std::printf(" ],\n");
  std::printf(" \"fill_rows_per_s\":%.0f,\"raw_fill_rows_per_s\":%.0f,\n", kRows / (fill.td_us * 1e-6),
              kRows / (fill.raw_us * 1e-6));
  std::printf(" \"refill_rows_per_s\":%.0f,\"raw_refill_rows_per_s\":%.0f,\n", kRows / (refill.td_us * 1e-6),
              kRows / (refill.raw_us * 1e-6));
  std::printf(" \"memcpy_floor_rows_per_s\":%.0f,\"refill_vs_memcpy_floor\":%.3f,\n",
              kRows / (refill_floor.raw_us * 1e-6), refill_floor.raw_us / refill_floor.td_us);
  std::printf(" \"big_refill_rows_per_s\":%.0f,\"big_memcpy_floor_rows_per_s\":%.0f,\"big_refill_vs_memcpy_floor\":%.3f}\n",
              kBigRows / (big_refill.td_us * 1e-6), kBigRows / (big_refill.raw_us * 1e-6),
              big_refill.raw_us / big_refill.td_us);
  return 0;
}
