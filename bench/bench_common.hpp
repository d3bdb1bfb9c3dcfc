#pragma once
//! Timing helpers shared by bench_h5, bench_redis and bench_storage: alternating samples of "ours" and "raw", medians,
//! and a small ordered JSON builder. Header-only; not part of the library.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace benchutil {

using Clock = std::chrono::steady_clock;

template <class F>
double run_us(F& f, int inner) {
  auto t0 = Clock::now();
  for (int i = 0; i < inner; ++i) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

//! inner repetitions so that one sample lasts at least min_us
template <class F>
int calibrate(F& f, double min_us) {
  int inner = 1;
  while (inner < (1 << 16)) {
    if (run_us(f, inner) >= min_us) break;
    inner *= 2;
  }
  return inner;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Pair {
  double ours_us = 0, raw_us = 0;
  double ratio() const { return raw_us > 0 ? ours_us / raw_us : 0; }
};

//! warm-up, then alternating samples of `ours` and `raw` within about budget_us; medians per call
template <class FA, class FB>
Pair measure_pair(FA ours, FB raw, double budget_us = 8e5, double sample_min_us = 2000) {
  for (int i = 0; i < 3; ++i) {
    ours();
    raw();
  }
  int ia = calibrate(ours, sample_min_us), ib = calibrate(raw, sample_min_us);
  double sample = run_us(ours, ia) + run_us(raw, ib);
  int reps = static_cast<int>(std::clamp(budget_us / std::max(sample, 1.0), 5.0, 201.0));
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    a.push_back(run_us(ours, ia) / ia);
    b.push_back(run_us(raw, ib) / ib);
  }
  return {median(a), median(b)};
}

//! median per-call time of f alone
template <class F>
double measure_one(F f, double budget_us = 4e5, double sample_min_us = 2000) {
  for (int i = 0; i < 2; ++i) f();
  int inner = calibrate(f, sample_min_us);
  double sample = run_us(f, inner);
  int reps = static_cast<int>(std::clamp(budget_us / std::max(sample, 1.0), 5.0, 201.0));
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(run_us(f, inner) / inner);
  return median(v);
}

inline std::string fmt(double v, int prec = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

//! a tiny ordered JSON builder: numbers, strings, nested objects and arrays of objects
struct Json {
  std::vector<std::pair<std::string, std::string>> kv;
  Json& num(const std::string& k, double v, int prec = 1) {
    kv.emplace_back(k, fmt(v, prec));
    return *this;
  }
  Json& str(const std::string& k, const std::string& v) {
    kv.emplace_back(k, "\"" + v + "\"");
    return *this;
  }
  Json& obj(const std::string& k, const Json& j) {
    kv.emplace_back(k, j.dump());
    return *this;
  }
  Json& arr(const std::string& k, const std::vector<Json>& items) {
    std::string s = "[";
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ",\n    " : "") + items[i].dump();
    kv.emplace_back(k, s + "]");
    return *this;
  }
  std::string dump() const {
    std::string s = "{";
    for (size_t i = 0; i < kv.size(); ++i) s += (i ? ", " : "") + ("\"" + kv[i].first + "\": ") + kv[i].second;
    return s + "}";
  }
};

//! touches `bytes` of fresh anonymous memory (bounded by half the free memory), then gives it back. On a virtual
//! machine the first touch of a guest page faults on the host too: a save whose page cache lands on never-touched
//! guest pages ran at 250-300 MB/s, one on recycled pages at 3-4 GB/s, whichever of torch::save and ours it was
//! (the saves of a run reach ~4 GB). Touched once here, the pages the saves take are ones the host has backed
inline double warm_guest_memory(size_t bytes) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const long avail = ::sysconf(_SC_AVPHYS_PAGES);
  if (page > 0 && avail > 0) bytes = std::min(bytes, static_cast<size_t>(avail) * static_cast<size_t>(page) / 2);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  for (size_t off = 0; off < bytes; off += static_cast<size_t>(page > 0 ? page : 4096)) static_cast<char*>(p)[off] = 1;
  ::munmap(p, bytes);
  return static_cast<double>(bytes) / (1 << 30);
}

}  // namespace benchutil
