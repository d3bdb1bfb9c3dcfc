//! bench_loader: the DataLoader against a single-thread `td.index(batch_idx)` loop over the same memmap dataset.
//! Dataset: a memmap TensorDict of N rows (default 1M) x 64 float32 features ("x") + an int64 label ("y");
//! batches of 256 random rows (Sampler::random, seed 0), the same order for every contender.
//!  1. no transform: the single-thread loop `td.index(idx)` vs a DataLoader with 2 worker threads, then 2 worker
//!     processes (target: >= 0.9x the loop's samples/s);
//!  2. a per-batch transform costing ~4x the gather (`bench_work`: k elementwise passes over x, k calibrated here):
//!     the loop doing gather + transform vs 2 worker threads / processes (target: >= 1.7x).
//! Every contender computes its epoch's order (the sampler's randperm) inside the timed epoch. Each contender: one warm-up epoch (worker processes start, fresh mappings fault their pages in), then
//! `--epochs` measured epochs (median samples/s). The trainer only touches one value per batch. Reported per
//! loader: samples/s, ratio to the loop measured in the same run, the trainer's median wait per batch and the
//! median batch latency (dispatch to ready), and `cores_used`: the CPU time of the trainer and its workers over the
//! wall time (on a shared VM other sessions' work caps it: the kernel's autogroup shares the CPUs per session,
//! not per thread, so 2 workers only help when the session gets more than one core). Prints one JSON object;
//! asserts nothing.
//! Usage: bench_loader [--rows N] [--epochs E] [--batch B]   (this program is also its own worker executable)
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <tensordict/tensordict.hpp>

#include "bench_common.hpp"

using namespace tensordict;
using Clock = std::chrono::steady_clock;
using benchutil::Json;
using benchutil::median;

namespace {

volatile double g_sink = 0;
constexpr int64_t kFeatures = 64;

int64_t work_iters() {
  static const int64_t k = [] {
    const char* e = std::getenv("BENCH_LOADER_WORK_ITERS");
    return e ? std::atoll(e) : 1;
  }();
  return k;
}

//! the transform: k elementwise passes over x (the cost is set by BENCH_LOADER_WORK_ITERS, inherited by workers)
TensorDict bench_work(const TensorDict& b) {
  at::Tensor x = b.get("x");
  at::Tensor acc = x * 1.0001f;
  for (int64_t i = 1; i < work_iters(); ++i) acc.mul_(0.9999f).add_(x, 1e-4);
  TensorDict out(b.batch_size());
  out.set("x", acc);
  out.set("y", b.get("y"));
  return out;
}

void consume(const TensorDict& b) { g_sink = g_sink + b.get("x").data_ptr<float>()[0]; }

//! CPU seconds of this process (every thread)
double self_cpu_s() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

//! CPU seconds of another process (utime + stime from /proc/<pid>/stat); 0 when it is gone
double proc_cpu_s(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(text.substr(close + 2));
  std::string field;
  double ut = 0, st = 0;
  for (int i = 3; i <= 15 && (in >> field); ++i) {
    if (i == 14) ut = std::stod(field);
    if (i == 15) st = std::stod(field);
  }
  return (ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Result {
  double samples_per_s = 0;
  double wait_median_us = 0;
  double latency_median_us = 0;
  double wait_share = 0;  // trainer wait / epoch time
  double cores_used = 0;  // CPU time of the trainer and its workers / wall time: what the machine gave us
};

//! single-thread loop: gather (+ transform) per batch in the trainer's thread
Result single_thread(const TensorDict& td, const Sampler& sampler, int64_t batch, int64_t epochs, bool transform) {
  const int64_t n = td.batch_size()[0];
  std::vector<double> rates, cores;
  for (int64_t e = -1; e < epochs; ++e) {  // epoch -1: warm-up
    const int64_t nb = n / batch;
    const double c0 = self_cpu_s();
    auto t0 = Clock::now();
    // the epoch's order is part of the epoch, as in the loader (randperm of 1M rows: 10-40 ms here)
    at::Tensor order = sampler.indices(n, e + 1);
    for (int64_t b = 0; b < nb; ++b) {
      TensorDict x = td.index({order.narrow(0, b * batch, batch)});
      if (transform) x = bench_work(x);
      consume(x);
    }
    const double s = secs_since(t0);
    if (e >= 0) rates.push_back(static_cast<double>(nb * batch) / s);
    if (e >= 0) cores.push_back((self_cpu_s() - c0) / s);
  }
  Result r;
  r.samples_per_s = median(rates);
  r.cores_used = median(cores);
  return r;
}

Result with_loader(const TensorDict& td, int64_t batch, int64_t epochs, int64_t workers, bool processes, bool transform) {
  LoaderOptions o = LoaderOptions().batch_size(batch).drop_last(true).shuffle(true).seed(0).persistent_workers(true);
  if (processes) o.worker_processes(workers);
  else o.num_workers(workers);
  if (transform) o.transform_name("bench_work");
  DataLoader loader(td, o);
  std::vector<double> rates, waits, lats, shares, cores;
  for (int64_t e = -1; e < epochs; ++e) {
    const std::vector<pid_t> pids = loader.worker_pids();  // persistent: the same processes all epoch
    double c0 = self_cpu_s();
    for (pid_t p : pids) c0 += proc_cpu_s(p);
    auto t0 = Clock::now();
    for (TensorDict b : loader) consume(b);
    const double s = secs_since(t0);
    double c1 = self_cpu_s();
    for (pid_t p : pids) c1 += proc_cpu_s(p);
    if (e < 0) continue;
    cores.push_back((c1 - c0) / s);
    const LoaderStats st = loader.stats();
    rates.push_back(static_cast<double>(st.samples) / s);
    waits.push_back(median(st.wait_us));
    lats.push_back(median(st.latency_us));
    shares.push_back(st.wait_s / s);
  }
  Result r;
  r.samples_per_s = median(rates);
  r.wait_median_us = median(waits);
  r.latency_median_us = median(lats);
  r.wait_share = median(shares);
  r.cores_used = median(cores);
  return r;
}

Json to_json(const Result& r, const Result& base) {
  Json j;
  j.num("samples_per_s", r.samples_per_s, 0).num("ratio", base.samples_per_s > 0 ? r.samples_per_s / base.samples_per_s : 0, 2)
      .num("cores_used", r.cores_used, 2);
  if (r.wait_median_us > 0 || r.latency_median_us > 0) {
    j.num("wait_median_us", r.wait_median_us, 1).num("latency_median_us", r.latency_median_us, 1).num("wait_share", r.wait_share, 3);
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  register_map_fn("bench_work", bench_work);
  run_worker_if_requested(argc, argv);

  int64_t rows = 1000000, epochs = 3, batch = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) rows = std::stoll(argv[++i]);
    else if (a == "--epochs" && i + 1 < argc) epochs = std::stoll(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = std::stoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_loader [--rows N] [--epochs E] [--batch B]\n");
      return 2;
    }
  }
  at::set_num_threads(1);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("td_bench_loader_" + std::to_string(::getpid()))).string();
  int rc = 0;
  try {
    TensorDict td;
    {
      TensorDict mem({{"x", at::rand({rows, kFeatures})}, {"y", at::randint(0, 10, {rows}, at::kLong)}}, {rows});
      mem.memmap_(dir);
      td = TensorDict::load_memmap(dir);  // a fresh read-only mapping, as a trainer would open it
    }
    const Sampler sampler = Sampler::random(0);
    // the gather: the single-thread loop's time per batch (random rows: cache misses and page walks included)
    const Result base = single_thread(td, sampler, batch, epochs, false);
    const double gather_us = 1e6 * static_cast<double>(batch) / base.samples_per_s;
    // one pass of the transform over a gathered batch, to set the transform to ~4x the gather
    TensorDict gathered = td.index({sampler.indices(rows, 0).narrow(0, 0, batch)});
    at::Tensor x = gathered.get("x");
    // work_iters() caches its value at bench_work's first call: measure one pass with a local copy of the loop
    const double pass_us = benchutil::measure_one([&] {
      at::Tensor acc = x * 1.0001f;
      for (int i = 1; i < 16; ++i) acc.mul_(0.9999f).add_(x, 1e-4);
      g_sink = g_sink + acc.data_ptr<float>()[0];
    }) / 16.0;
    const int64_t iters = std::max<int64_t>(1, static_cast<int64_t>(4.0 * gather_us / pass_us + 0.5));
    ::setenv("BENCH_LOADER_WORK_ITERS", std::to_string(iters).c_str(), 1);
    const double transform_us = benchutil::measure_one([&] { consume(bench_work(gathered)); });

    Json out;
    out.str("bench", "bench_loader").num("rows", static_cast<double>(rows), 0).num("features", kFeatures, 0)
        .num("batch", static_cast<double>(batch), 0).num("epochs_measured", static_cast<double>(epochs), 0)
        .num("gather_us", gather_us, 1).num("transform_us", transform_us, 1).num("transform_over_gather", transform_us / gather_us, 2)
        .num("work_iters", static_cast<double>(iters), 0);
    {
      double load[3] = {0, 0, 0};
      ::getloadavg(load, 3);
      out.num("load_avg_1min", load[0], 2).num("cpus", static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN)), 0);
    }

    const Result th = with_loader(td, batch, epochs, 2, false, false);
    const Result pr = with_loader(td, batch, epochs, 2, true, false);
    Json nt;
    nt.obj("single_thread_loop", to_json(base, base)).obj("threads_2", to_json(th, base)).obj("processes_2", to_json(pr, base));
    out.obj("no_transform", nt);

    const Result tbase = single_thread(td, sampler, batch, epochs, true);
    const Result tth = with_loader(td, batch, epochs, 2, false, true);
    const Result tpr = with_loader(td, batch, epochs, 2, true, true);
    Json tr;
    tr.obj("single_thread_loop", to_json(tbase, tbase)).obj("threads_2", to_json(tth, tbase)).obj("processes_2", to_json(tpr, tbase));
    out.obj("transform_4x", tr);
    Json py;
    py.num("td_idx_loop_samples_per_s", 4.6e6, 0).num("torch_dataloader_2_processes_samples_per_s", 0.23e6, 0);
    out.obj("python_anchor", py);
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
