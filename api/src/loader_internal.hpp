// DataLoader internals shared by its files (not installed): the shared-memory ring's layout and its waiting
// primitives (loader_ring.cpp), the worker core that fills a slot (loader_worker.cpp), the sampler's seed
// source (loader_sampler.cpp). loader.cpp is the trainer side and the DataLoader itself.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensordict/actors/fault_points.hpp"
#include "tensordict/backends/shm.hpp"
#include "tensordict/loader.hpp"
#include "tensordict/map.hpp"

namespace tensordict::loader_internal {

//! a seed from std::random_device (samplers and loaders given none)
int64_t random_seed();

// ============================================================================ the ring
constexpr int kMaxWorkers = 256;
constexpr size_t kErrBytes = 2000;

enum SlotState : uint32_t { kFree = 0, kPending = 1, kClaimed = 2, kReady = 3, kFailed = 4, kHeld = 5 };
enum WorkerState : uint32_t { kStarting = 0, kAttached = 1, kOpenFailed = 2 };

inline uint32_t state_of(uint32_t word) { return word & 0xffu; }
inline int64_t claimer_of(uint32_t word) { return static_cast<int64_t>(word >> 8) - 1; }
inline uint32_t claimed_by(int64_t worker) { return kClaimed | (static_cast<uint32_t>(worker + 1) << 8); }

struct alignas(64) WorkerRec {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> state;
  int32_t err_code;
  uint32_t err_len;
  char err[kErrBytes];
};

struct alignas(64) RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t num_slots;
  uint32_t num_workers;
  uint32_t num_leaves;
  int64_t capacity;
  uint64_t slot_stride;
  uint64_t slots_offset;
  uint64_t config_offset;
  uint64_t config_len;
  int32_t trainer_pid;
  alignas(64) std::atomic<uint32_t> work_seq;
  std::atomic<uint32_t> work_waiters;
  alignas(64) std::atomic<uint32_t> done_seq;
  std::atomic<uint32_t> done_waiters;
  //! the slot the trainer sleeps on, plus 1 (0: any slot): a worker that finishes another slot bumps done_seq
  //! without waking it (signal_done)
  std::atomic<uint32_t> done_want;
  std::atomic<uint32_t> shutdown;
  WorkerRec workers[kMaxWorkers];
};

struct alignas(64) SlotCtl {
  std::atomic<uint32_t> state;
  // dispatch order: workers claim the smallest pending task first. Atomic: a worker scanning for the smallest
  // reads it while the trainer may be re-posting that slot (its CAS on state then decides; TSan found the race)
  std::atomic<int64_t> task;
  int64_t batch;
  int64_t epoch;
  int64_t nrows;
  int64_t seed;   // the transform's generator seed of this batch
  int64_t posted_ns;
  int64_t ready_ns;
  int32_t err_code;
  uint32_t err_len;
  char err[kErrBytes];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free atomics");
static_assert(std::atomic<int64_t>::is_always_lock_free, "slot fields shared between processes must be lock-free");

constexpr uint64_t round64(uint64_t x) { return (x + 63) & ~uint64_t{63}; }

int64_t now_ns();

//! true when woken by a FUTEX_WAKE (false: the word had moved on, the timeout, a signal)
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);
void futex_wake_all(std::atomic<uint32_t>* word);

//! bumps a sequence word and wakes its sleepers (only when someone sleeps: the counter is checked after
//! the bump, and a sleeper re-checks after registering, so no wake-up is lost)
void signal_seq(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& waiters);

//! a worker finished `slot`: bumps done_seq and wakes the trainer only when it sleeps on that slot (or on any).
//! The trainer takes batches in order and two workers finish about together, so half of the wakes would find
//! the batch after the one it waits for: a futex wake, two context switches and a core taken from a worker for
//! nothing (bench_loader with a transform: 10 us between two batches of a worker, 3 us without these wakes)
void signal_done(RingHeader& h, uint32_t slot);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}
inline int64_t now_ns_fwd() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

//! spin budgets before a futex sleep (tunable for experiments: TENSORDICT_LOADER_SPIN_US="trainer,worker")
struct SpinBudget {
  int64_t trainer_ns = 50000;
  int64_t worker_ns = 100000;
  SpinBudget() {
    if (const char* e = std::getenv("TENSORDICT_LOADER_SPIN_US")) {
      long long t = 0, w = 0;
      if (std::sscanf(e, "%lld,%lld", &t, &w) == 2) {
        trainer_ns = t * 1000;
        worker_ns = w * 1000;
      }
    }
  }
};
const SpinBudget& spin_budget();

//! spins (pause, then sched_yield so that a thread waiting for this core runs) until `ready()` or `budget_ns`.
//! The clock is read after every yield: on a loaded machine one yield can hand the core over for a whole time
//! slice (milliseconds), and eight of them let a "50 us" spin run for a batch's whole wait without sleeping.
template <class F>
bool spin_until(F ready, int64_t budget_ns) {
  if (budget_ns <= 0) return ready();
  const int64_t deadline = now_ns_fwd() + budget_ns;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (i < 32) {
      for (int k = 0; k < 16; ++k) cpu_relax();
      if ((i & 7) == 7 && now_ns_fwd() > deadline) return ready();
    } else {
      std::this_thread::yield();
      if (now_ns_fwd() > deadline) return ready();
    }
  }
}

void copy_message(char* dst, uint32_t& len, const std::string& msg);

//! one leaf of a slot: key, dtype, feature shape (after the row dim), byte offset in the slot
struct LeafSpec {
  NestedKey key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> feature;
  uint64_t offset = 0;
};

//! what every worker needs, written into the segment as JSON by the trainer
struct RingConfig {
  std::string src_spec;   // empty: threads only (the workers use the trainer's TensorDict)
  std::string transform;  // registered name ("" = none or a closure)
  std::vector<LeafSpec> leaves;
  std::vector<int64_t> batch_rest;  // the result's batch dims after the row dim
  std::vector<std::string> src_keys;  // (unused by processes) kept for symmetry
  int64_t worker_threads = 1;
  std::string log_level;
};

//! the ring as mapped by one process (trainer or worker)
struct Ring {
  std::shared_ptr<backends::ShmSegment> seg;
  RingHeader* hdr = nullptr;
  RingConfig cfg;
  int64_t capacity = 0;
  uint32_t num_slots = 0;
  uint64_t stride = 0;
  uint64_t slots_offset = 0;
  uint64_t index_bytes = 0;

  char* slot_base(uint32_t s) const { return static_cast<char*>(seg->data()) + slots_offset + s * stride; }
  SlotCtl* ctl(uint32_t s) const { return reinterpret_cast<SlotCtl*>(slot_base(s)); }
  int64_t* indices(uint32_t s) const { return reinterpret_cast<int64_t*>(slot_base(s) + round64(sizeof(SlotCtl))); }
  void* leaf_ptr(uint32_t s, size_t l) const {
    return slot_base(s) + round64(sizeof(SlotCtl)) + index_bytes + cfg.leaves[l].offset;
  }
  std::vector<int64_t> leaf_shape(size_t l, int64_t rows) const {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), cfg.leaves[l].feature.begin(), cfg.leaves[l].feature.end());
    return shape;
  }
  //! a view of a slot's leaf that does not own the mapping (workers: the ring outlives it)
  at::Tensor leaf_view(uint32_t s, size_t l, int64_t rows) const {
    return at::from_blob(leaf_ptr(s, l), leaf_shape(l, rows), at::TensorOptions().dtype(cfg.leaves[l].dtype));
  }
  WorkerRec& worker(int64_t w) const { return hdr->workers[w]; }

  //! the trainer: plans the slots and creates the segment
  static std::shared_ptr<Ring> create(RingConfig cfg, int64_t capacity, uint32_t num_slots, uint32_t num_workers,
                                      const std::string& prefix);

  //! a worker process: maps the segment by name and reads the layout
  static std::shared_ptr<Ring> attach(const std::string& name);
};

//! seeds of the per-batch transform generators: a mix of (seed, epoch, batch), the same in every worker
int64_t batch_seed(int64_t seed, int64_t epoch, int64_t batch);
std::string batch_name(int64_t batch, int64_t epoch);
std::string shape_str(at::IntArrayRef s);

//! the gather + transform of one slot: shared by worker threads, worker processes and the trainer itself
struct WorkerCore {
  std::shared_ptr<Ring> ring;
  TensorDict src;
  MapFn transform;
  int64_t index = 0;  // worker index (-1: the trainer itself)
  int64_t worker_threads = 1;
  std::vector<NestedKey> src_keys;       // the source's tensor leaves (the gather's keys)
  std::vector<at::Tensor> dense_leaves;  // the source's leaves when it is dense (zero-copy views)
  std::vector<int64_t> src_rest;         // the source's batch dims after the row dim
  std::vector<at::Tensor> gather_buf;    // with a transform: reused gather buffers (dense sources)
  const actors::FaultPoints* faults = nullptr;  // worker processes: TD_FAULT_LOADER_WORKER (crash tests)
  std::atomic<bool> exited{false};  // worker threads: set when the loop returned (a bounded join looks at it)

  void fault_point(const char* stage) const {
    if (faults) faults->maybe_die_at(stage, index);
  }

  void prepare();
  //! the rows `idx` of the source as a dense TensorDict (with a transform) or written into the slot
  TensorDict gather(const at::Tensor& idx, int64_t n, uint32_t slot, bool into_slot);
  //! copies `r` into the slot, checking it against the slot layout
  void write_result(const TensorDict& r, uint32_t slot, int64_t n, int64_t batch, int64_t epoch, bool from_transform);
  //! runs the claimed slot to the end: ready, or failed with the error
  void run(uint32_t slot);
  //! claims the pending slot with the smallest task number; -1 when none
  int64_t claim();
  //! the worker loop: until shutdown (or `gone()` says the trainer is gone)
  void loop(const std::function<bool()>& gone);
};

}  // namespace tensordict::loader_internal
