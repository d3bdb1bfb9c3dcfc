//! bench_loader: the DataLoader against a single-thread `td.index(batch_idx)` loop over the same memmap dataset.
//! Dataset: a memmap TensorDict of N rows (default 1M) x 64 float32 features ("x") + an int64 label ("y");
//! batches of 256 random rows (Sampler::random, seed 0), the same order for every contender.
//!  1. no transform: the single-thread loop `td.index(idx)` vs a DataLoader with 2 worker threads, then 2 worker
//!     processes (target: >= 0.9x the loop's samples/s);
//!  2. a per-batch transform costing ~4x the gather (`bench_work`: k elementwise passes over x, k calibrated here):
//!     the loop doing gather + transform vs 2 worker threads / processes (target: >= 1.7x).
//! Every contender computes its epoch's order (the sampler's randperm) inside the timed epoch. The three
//! contenders (loop, threads, processes) take turns: one epoch each per round, a warm-up round (worker
//! processes start, fresh mappings fault their pages in), then `--epochs` measured rounds (default 5); a
//! ratio is the median over rounds of the contender's rate over the loop's in the same round, so that a load
//! change on the shared machine hits all three alike (measured one after the other, the same build read
//! 0.69x and 1.18x for processes ten minutes apart). The trainer only touches one value per batch. Reported per
//! loader: samples/s, ratio to the loop measured in the same run, the trainer's median wait per batch and the
//! median batch latency (dispatch to ready), and `cores_used`: the CPU time of the trainer and its workers over the
//! wall time (on a shared VM other sessions' work caps it: the kernel's autogroup shares the CPUs per session,
//! not per thread, so 2 workers only help when the session gets more than one core), the trainer's futex sleeps
//! per batch and the share of them a wake for another batch ended (`needless_per_sleep`, LoaderStats). Prints one JSON object;
//! asserts nothing.
//! Usage: bench_loader [--rows N] [--epochs E] [--batch B]   (this program is also its own worker executable)
//! BENCH_LOADER_PREFETCH=K sets the loaders' prefetch (default: the loader's own choice)
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

//! CPU seconds of the calling thread
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
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
  double ratio = 1;       // median over rounds of this contender's rate / the loop's rate in the same round
  double wait_median_us = 0;
  double latency_median_us = 0;
  double wait_share = 0;  // trainer wait / epoch time
  double cores_used = 0;  // CPU time of the trainer and its workers / wall time: what the machine gave us
  double trainer_cores = 0;  // CPU time of the trainer's thread alone / wall time (its spin while it waits)
  double sleeps_per_batch = 0;    // the trainer's futex sleeps / batches (LoaderStats::sleeps)
  double needless_per_sleep = 0;  // sleeps ended by a wake for another batch / sleeps
};

//! one epoch's figures
struct Epoch {
  double samples_per_s = 0, wait_median_us = 0, latency_median_us = 0, wait_share = 0, cores_used = 0, trainer_cores = 0;
  double sleeps_per_batch = 0, needless_per_sleep = 0;
};

//! one epoch of the single-thread loop: gather (+ transform) per batch in the trainer's thread
Epoch single_epoch(const TensorDict& td, const Sampler& sampler, int64_t batch, int64_t epoch, bool transform) {
  const int64_t n = td.batch_size()[0];
  const int64_t nb = n / batch;
  const double c0 = self_cpu_s();
  auto t0 = Clock::now();
  // the epoch's order is part of the epoch, as in the loader (randperm of 1M rows: 10-40 ms here)
  at::Tensor order = sampler.indices(n, epoch);
  for (int64_t b = 0; b < nb; ++b) {
    TensorDict x = td.index({order.narrow(0, b * batch, batch)});
    if (transform) x = bench_work(x);
    consume(x);
  }
  const double s = secs_since(t0);
  Epoch e;
  e.samples_per_s = static_cast<double>(nb * batch) / s;
  e.cores_used = (self_cpu_s() - c0) / s;
  return e;
}

DataLoader make_loader(const TensorDict& td, int64_t batch, int64_t workers, bool processes, bool transform) {
  LoaderOptions o = LoaderOptions().batch_size(batch).drop_last(true).shuffle(true).seed(0).persistent_workers(true);
  if (processes) o.worker_processes(workers);
  else o.num_workers(workers);
  if (transform) o.transform_name("bench_work");
  if (const char* e = std::getenv("BENCH_LOADER_PREFETCH")) o.prefetch(std::atoll(e));  // default: the loader's
  return DataLoader(td, o);
}

//! one epoch of a loader (persistent workers: the same processes every epoch)
Epoch loader_epoch(DataLoader& loader) {
  const std::vector<pid_t> pids = loader.worker_pids();
  double c0 = self_cpu_s();
  for (pid_t p : pids) c0 += proc_cpu_s(p);
  const double tc0 = thread_cpu_s();
  auto t0 = Clock::now();
  for (TensorDict b : loader) consume(b);
  const double s = secs_since(t0);
  const double tc1 = thread_cpu_s();
  double c1 = self_cpu_s();
  for (pid_t p : pids) c1 += proc_cpu_s(p);
  const LoaderStats st = loader.stats();
  Epoch e;
  e.samples_per_s = static_cast<double>(st.samples) / s;
  e.wait_median_us = median(st.wait_us);
  e.latency_median_us = median(st.latency_us);
  e.wait_share = st.wait_s / s;
  e.cores_used = (c1 - c0) / s;
  e.trainer_cores = (tc1 - tc0) / s;
  e.sleeps_per_batch = st.batches ? static_cast<double>(st.sleeps) / st.batches : 0;
  e.needless_per_sleep = st.sleeps ? static_cast<double>(st.needless_wakes) / st.sleeps : 0;
  return e;
}

//! medians over rounds; `ratio` against the loop's epoch of the same round
Result summarize(const std::vector<Epoch>& es, const std::vector<Epoch>& loop) {
  std::vector<double> rate, ratio, wait, lat, share, cores, trainer, sleeps, needless;
  for (size_t i = 0; i < es.size(); ++i) {
    rate.push_back(es[i].samples_per_s);
    ratio.push_back(es[i].samples_per_s / loop[i].samples_per_s);
    wait.push_back(es[i].wait_median_us);
    lat.push_back(es[i].latency_median_us);
    share.push_back(es[i].wait_share);
    cores.push_back(es[i].cores_used);
    trainer.push_back(es[i].trainer_cores);
    sleeps.push_back(es[i].sleeps_per_batch);
    needless.push_back(es[i].needless_per_sleep);
  }
  Result r;
  r.samples_per_s = median(rate);
  r.ratio = median(ratio);
  r.wait_median_us = median(wait);
  r.latency_median_us = median(lat);
  r.wait_share = median(share);
  r.cores_used = median(cores);
  r.trainer_cores = median(trainer);
  r.sleeps_per_batch = median(sleeps);
  r.needless_per_sleep = median(needless);
  return r;
}

//! the loop, 2 worker threads and 2 worker processes, one epoch each per round, `rounds` rounds after a
//! warm-up round: a load change on the shared machine hits the three alike (ratios are per round)
struct Contest {
  Result loop, threads, processes;
};
Contest contest(const TensorDict& td, const Sampler& sampler, int64_t batch, int64_t rounds, bool transform) {
  DataLoader thr = make_loader(td, batch, 2, false, transform);
  DataLoader proc = make_loader(td, batch, 2, true, transform);
  std::vector<Epoch> l, t, p;
  for (int64_t r = -1; r < rounds; ++r) {  // round -1: warm-up (worker processes start, mappings fault in)
    Epoch el = single_epoch(td, sampler, batch, r + 1, transform);
    Epoch et = loader_epoch(thr);
    Epoch ep = loader_epoch(proc);
    if (r < 0) continue;
    l.push_back(el);
    t.push_back(et);
    p.push_back(ep);
  }
  return {summarize(l, l), summarize(t, l), summarize(p, l)};
}

Json to_json(const Result& r) {
  Json j;
  j.num("samples_per_s", r.samples_per_s, 0).num("ratio", r.ratio, 2).num("cores_used", r.cores_used, 2);
  if (r.wait_median_us > 0 || r.latency_median_us > 0) {
    j.num("trainer_cores", r.trainer_cores, 3);
    j.num("wait_median_us", r.wait_median_us, 1).num("latency_median_us", r.latency_median_us, 1).num("wait_share", r.wait_share, 3);
    j.num("sleeps_per_batch", r.sleeps_per_batch, 3).num("needless_per_sleep", r.needless_per_sleep, 3);
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  register_map_fn("bench_work", bench_work);
  run_worker_if_requested(argc, argv);

  int64_t rows = 1000000, epochs = 5, batch = 256;
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
    single_epoch(td, sampler, batch, 0, false);  // warm-up: the fresh mapping faults its pages in
    const double gather_us = 1e6 * static_cast<double>(batch) / single_epoch(td, sampler, batch, 1, false).samples_per_s;
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

    const Contest plain = contest(td, sampler, batch, epochs, false);
    Json nt;
    nt.obj("single_thread_loop", to_json(plain.loop)).obj("threads_2", to_json(plain.threads))
        .obj("processes_2", to_json(plain.processes));
    out.obj("no_transform", nt);
    const Contest tf = contest(td, sampler, batch, epochs, true);
    Json tr;
    tr.obj("single_thread_loop", to_json(tf.loop)).obj("threads_2", to_json(tf.threads)).obj("processes_2", to_json(tf.processes));
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
