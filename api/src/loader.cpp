// DataLoader: samplers, the shared-memory ring of batch slots, worker threads and worker processes.
//
// One data path for every kind of worker: the trainer posts a batch (its row indices) into a free slot of
// a ring that lives in one shared-memory segment; a worker (a thread of this process, a worker process, or
// the trainer itself with num_workers 0) claims the slot with a CAS, gathers the rows straight into the
// slot's tensors (or gathers, transforms and copies the result in), and marks it ready. The trainer yields
// the slot's tensors zero-copy as a TensorDict whose storages hold a lease; the last view dying frees the
// slot. No locks live in the segment (a dead worker cannot leave one held): slot states are atomics, and
// waiting is a futex on a sequence word with a timeout, so every wait is bounded and re-checks the workers.
#include "tensordict/loader.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "tensordict/actors/fault_points.hpp"
#include "tensordict/actors/process_workers.hpp"
#include "tensordict/backends/shm.hpp"
#include "tensordict/config.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/map.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {

// ============================================================================ samplers
struct Sampler::Impl {
  enum class Kind { Sequential, Random, Weighted, Distributed } kind = Kind::Sequential;
  int64_t seed = 0;
  at::Tensor weights;  // float64
  int64_t num_samples = 0;
  bool replacement = true;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

namespace {

int64_t random_seed() {
  std::random_device rd;
  return static_cast<int64_t>((static_cast<uint64_t>(rd()) << 31) ^ rd()) & INT64_MAX;
}

at::Generator seeded(int64_t seed) { return at::detail::createCPUGenerator(static_cast<uint64_t>(seed)); }

const Sampler::Impl& impl_of(const std::shared_ptr<const Sampler::Impl>& p) {
  if (!p) throw ValueError("DataLoader: an empty Sampler");
  return *p;
}

}  // namespace

Sampler Sampler::sequential() { return Sampler(std::make_shared<Impl>()); }

Sampler Sampler::random(std::optional<int64_t> seed) {
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Random;
  i->seed = seed ? *seed : random_seed();
  return Sampler(std::move(i));
}

Sampler Sampler::weighted(at::Tensor weights, int64_t num_samples, bool replacement, std::optional<int64_t> seed) {
  if (!weights.defined() || weights.dim() != 1) {
    throw ValueError("Sampler::weighted: weights must be a 1-d tensor (one weight per row), got " +
                     (weights.defined() ? std::to_string(weights.dim()) + " dims" : std::string("an undefined tensor")));
  }
  if (!at::isFloatingType(weights.scalar_type()) && !at::isIntegralType(weights.scalar_type(), true)) {
    throw TypeError("Sampler::weighted: weights must be real numbers, got " + std::string(c10::toString(weights.scalar_type())));
  }
  at::Tensor w = weights.to(at::kDouble).contiguous().clone();
  if (w.numel() == 0) throw ValueError("Sampler::weighted: weights is empty");
  if (!at::isfinite(w).all().item<bool>()) throw ValueError("Sampler::weighted: weights must be finite (found inf or nan)");
  if ((w < 0).any().item<bool>()) {
    throw ValueError("Sampler::weighted: weights must be >= 0, found " +
                     std::to_string(w.min().item<double>()));
  }
  const int64_t nonzero = (w > 0).sum().item<int64_t>();
  if (nonzero == 0) throw ValueError("Sampler::weighted: every weight is 0");
  if (num_samples <= 0) throw ValueError("Sampler::weighted: num_samples must be >= 1, got " + std::to_string(num_samples));
  if (!replacement && num_samples > nonzero) {
    throw ValueError("Sampler::weighted: " + std::to_string(num_samples) + " samples without replacement, but only " +
                     std::to_string(nonzero) + " weights are > 0");
  }
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Weighted;
  i->weights = w;
  i->num_samples = num_samples;
  i->replacement = replacement;
  i->seed = seed ? *seed : random_seed();
  return Sampler(std::move(i));
}

Sampler Sampler::distributed(int64_t rank, int64_t world_size, bool shuffle, std::optional<int64_t> seed,
                             bool drop_last) {
  if (world_size < 1) throw ValueError("Sampler::distributed: world_size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size) {
    throw ValueError("Sampler::distributed: rank must be in [0, world_size) = [0, " + std::to_string(world_size) +
                     "), got " + std::to_string(rank));
  }
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Distributed;
  i->rank = rank;
  i->world_size = world_size;
  i->shuffle = shuffle;
  i->seed = seed ? *seed : 0;
  i->drop_last = drop_last;
  return Sampler(std::move(i));
}

std::string Sampler::kind() const {
  switch (impl_of(impl_).kind) {
    case Impl::Kind::Sequential: return "sequential";
    case Impl::Kind::Random: return "random";
    case Impl::Kind::Weighted: return "weighted";
    case Impl::Kind::Distributed: return "distributed";
  }
  return "?";
}

int64_t Sampler::length(int64_t n) const {
  const Impl& s = impl_of(impl_);
  if (n < 0) throw ValueError("Sampler: negative dataset length " + std::to_string(n));
  switch (s.kind) {
    case Impl::Kind::Sequential:
    case Impl::Kind::Random: return n;
    case Impl::Kind::Weighted:
      if (s.weights.numel() != n) {
        throw ValueError("Sampler::weighted: " + std::to_string(s.weights.numel()) + " weights for a dataset of " +
                         std::to_string(n) + " rows (one weight per row)");
      }
      return s.num_samples;
    case Impl::Kind::Distributed:
      if (s.drop_last) return n / s.world_size;
      return (n - s.rank + s.world_size - 1) / s.world_size;
  }
  return 0;
}

at::Tensor Sampler::indices(int64_t n, int64_t epoch) const {
  const Impl& s = impl_of(impl_);
  length(n);  // validates
  const auto opts = at::TensorOptions().dtype(at::kLong);
  switch (s.kind) {
    case Impl::Kind::Sequential: return at::arange(n, opts);
    case Impl::Kind::Random: return at::randperm(n, seeded(s.seed + epoch), opts);
    case Impl::Kind::Weighted:
      return at::multinomial(s.weights, s.num_samples, s.replacement, seeded(s.seed + epoch)).to(at::kLong).contiguous();
    case Impl::Kind::Distributed: {
      at::Tensor all = s.shuffle ? at::randperm(n, seeded(s.seed + epoch), opts) : at::arange(n, opts);
      if (s.drop_last) all = all.narrow(0, 0, (n / s.world_size) * s.world_size);
      return all.slice(0, s.rank, all.size(0), s.world_size).contiguous();
    }
  }
  return at::Tensor();
}

// ============================================================================ the ring
namespace {

constexpr uint64_t kMagic = 0x31524c445444ull;  // "TDLR1"
constexpr uint32_t kVersion = 2;  // 2: RingHeader::done_want
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

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

//! true when woken by a FUTEX_WAKE (false: the word had moved on, the timeout, a signal)
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec ts{};
  ts.tv_sec = timeout_us / 1000000;
  ts.tv_nsec = (timeout_us % 1000000) * 1000;
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0) == 0;
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

//! bumps a sequence word and wakes its sleepers (only when someone sleeps: the counter is checked after
//! the bump, and a sleeper re-checks after registering, so no wake-up is lost)
void signal_seq(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& waiters) {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) > 0) futex_wake_all(&seq);
}

//! a worker finished `slot`: bumps done_seq and wakes the trainer only when it sleeps on that slot (or on any).
//! The trainer takes batches in order and two workers finish about together, so half of the wakes would find
//! the batch after the one it waits for: a futex wake, two context switches and a core taken from a worker for
//! nothing (bench_loader with a transform: 10 us between two batches of a worker, 3 us without these wakes)
void signal_done(RingHeader& h, uint32_t slot) {
  h.done_seq.fetch_add(1, std::memory_order_seq_cst);
  if (h.done_waiters.load(std::memory_order_seq_cst) == 0) return;
  const uint32_t want = h.done_want.load(std::memory_order_seq_cst);
  if (want == 0 || want == slot + 1) futex_wake_all(&h.done_seq);
}

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
const SpinBudget& spin_budget() {
  static const SpinBudget b;
  return b;
}

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


void copy_message(char* dst, uint32_t& len, const std::string& msg) {
  const size_t n = std::min(msg.size(), kErrBytes);
  std::memcpy(dst, msg.data(), n);
  len = static_cast<uint32_t>(n);
}

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

JsonValue key_json(const NestedKey& k) {
  JsonValue::Array a;
  for (const auto& p : k.parts()) a.emplace_back(p);
  return JsonValue::array(std::move(a));
}

JsonValue ints_json(const std::vector<int64_t>& v) {
  JsonValue::Array a;
  for (int64_t x : v) a.emplace_back(static_cast<long long>(x));
  return JsonValue::array(std::move(a));
}

std::vector<int64_t> ints_of(const JsonValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int());
  return out;
}

std::string dump_config(const RingConfig& c) {
  JsonValue::Array leaves;
  for (const auto& l : c.leaves) {
    leaves.push_back(JsonValue::object({{"key", key_json(l.key)},
                                        {"dtype", JsonValue(backends::dtype_name(l.dtype))},
                                        {"feature", ints_json(l.feature)},
                                        {"offset", JsonValue(static_cast<long long>(l.offset))}}));
  }
  return JsonValue::object({{"src", JsonValue(c.src_spec)},
                            {"transform", JsonValue(c.transform)},
                            {"leaves", JsonValue::array(std::move(leaves))},
                            {"batch_rest", ints_json(c.batch_rest)},
                            {"worker_threads", JsonValue(static_cast<long long>(c.worker_threads))},
                            {"log_level", JsonValue(c.log_level)}})
      .dump();
}

RingConfig parse_config(const std::string& text) {
  JsonValue v = JsonValue::parse(text);
  RingConfig c;
  c.src_spec = v.find("src")->as_string();
  c.transform = v.find("transform")->as_string();
  for (const auto& l : v.find("leaves")->as_array()) {
    LeafSpec s;
    std::vector<std::string> parts;
    for (const auto& p : l.find("key")->as_array()) parts.push_back(p.as_string());
    s.key = NestedKey(parts);
    s.dtype = backends::dtype_from_name(l.find("dtype")->as_string());
    s.feature = ints_of(*l.find("feature"));
    s.offset = static_cast<uint64_t>(l.find("offset")->as_int());
    c.leaves.push_back(std::move(s));
  }
  c.batch_rest = ints_of(*v.find("batch_rest"));
  c.worker_threads = v.find("worker_threads")->as_int();
  c.log_level = v.find("log_level")->as_string();
  return c;
}

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
                                      const std::string& prefix) {
    std::vector<backends::ShmLayoutEntry> entries;
    for (const auto& l : cfg.leaves) {
      backends::ShmLayoutEntry e;
      e.key = l.key.parts();
      e.dtype = l.dtype;
      e.shape = {capacity};
      e.shape.insert(e.shape.end(), l.feature.begin(), l.feature.end());
      entries.push_back(std::move(e));
    }
    backends::ShmLayout layout = backends::ShmLayout::plan(entries);
    for (size_t i = 0; i < cfg.leaves.size(); ++i) cfg.leaves[i].offset = layout.offsets[i];
    auto r = std::make_shared<Ring>();
    r->cfg = std::move(cfg);
    r->capacity = capacity;
    r->num_slots = num_slots;
    r->index_bytes = round64(static_cast<uint64_t>(capacity) * sizeof(int64_t));
    r->stride = round64(round64(sizeof(SlotCtl)) + r->index_bytes + layout.total_bytes);
    const std::string text = dump_config(r->cfg);
    const uint64_t config_offset = round64(sizeof(RingHeader));
    r->slots_offset = round64(config_offset + text.size() + 1);
    const uint64_t total = r->slots_offset + r->stride * num_slots;
    r->seg = backends::ShmSegment::create(total, prefix);
    char* base = static_cast<char*>(r->seg->data());
    r->hdr = new (base) RingHeader();  // the segment is zero-filled: atomics start at 0
    RingHeader& h = *r->hdr;
    h.version = kVersion;
    h.num_slots = num_slots;
    h.num_workers = num_workers;
    h.num_leaves = static_cast<uint32_t>(r->cfg.leaves.size());
    h.capacity = capacity;
    h.slot_stride = r->stride;
    h.slots_offset = r->slots_offset;
    h.config_offset = config_offset;
    h.config_len = text.size();
    h.trainer_pid = static_cast<int32_t>(::getpid());
    std::memcpy(base + config_offset, text.data(), text.size());
    for (uint32_t s = 0; s < num_slots; ++s) new (r->slot_base(s)) SlotCtl();
    std::atomic_thread_fence(std::memory_order_release);
    h.magic = kMagic;
    return r;
  }

  //! a worker process: maps the segment by name and reads the layout
  static std::shared_ptr<Ring> attach(const std::string& name) {
    auto r = std::make_shared<Ring>();
    r->seg = backends::ShmSegment::open(name);
    if (r->seg->size() < sizeof(RingHeader)) throw FormatError("DataLoader: shared-memory segment " + name + " is not a loader ring");
    r->hdr = reinterpret_cast<RingHeader*>(r->seg->data());
    RingHeader& h = *r->hdr;
    if (h.magic != kMagic || h.version != kVersion) {
      throw FormatError("DataLoader: shared-memory segment " + name + " is not a loader ring of this version");
    }
    if (h.config_offset + h.config_len > r->seg->size() || h.slots_offset + h.slot_stride * h.num_slots > r->seg->size()) {
      throw FormatError("DataLoader: the ring " + name + " is truncated");
    }
    const char* base = static_cast<const char*>(r->seg->data());
    r->cfg = parse_config(std::string(base + h.config_offset, h.config_len));
    r->capacity = h.capacity;
    r->num_slots = h.num_slots;
    r->stride = h.slot_stride;
    r->slots_offset = h.slots_offset;
    r->index_bytes = round64(static_cast<uint64_t>(r->capacity) * sizeof(int64_t));
    return r;
  }
};

//! seeds of the per-batch transform generators: a mix of (seed, epoch, batch), the same in every worker
int64_t batch_seed(int64_t seed, int64_t epoch, int64_t batch) {
  uint64_t x = static_cast<uint64_t>(seed) ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(batch) * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<int64_t>(x & static_cast<uint64_t>(INT64_MAX));
}

std::string batch_name(int64_t batch, int64_t epoch) {
  return "batch " + std::to_string(batch) + " of epoch " + std::to_string(epoch);
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

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

  void prepare() {
    src_keys = src.keys(KeysOptions().include_nested(true).leaves_only(true));
    if (!transform) {  // the gather writes the slot's leaves in the slot's order
      src_keys.clear();
      for (const auto& l : ring->cfg.leaves) src_keys.push_back(l.key);
    }
    src_rest.assign(src.batch_size().begin() + 1, src.batch_size().end());
    if (src.is_dense()) {
      for (const auto& k : src_keys) dense_leaves.push_back(src.get(k));
    }
  }

  //! the rows `idx` of the source as a dense TensorDict (with a transform) or written into the slot
  TensorDict gather(const at::Tensor& idx, int64_t n, uint32_t slot, bool into_slot) {
    std::vector<int64_t> bs{n};
    bs.insert(bs.end(), src_rest.begin(), src_rest.end());
    if (!dense_leaves.empty() || src_keys.empty()) {
      if (into_slot) {
        // no transform: the slot layout is the source's leaves, in order
        for (size_t l = 0; l < dense_leaves.size(); ++l) {
          at::Tensor dst = ring->leaf_view(slot, l, n);
          at::index_select_out(dst, dense_leaves[l], 0, idx);
        }
        return TensorDict::undefined();
      }
      if (gather_buf.size() != dense_leaves.size()) {
        gather_buf.clear();
        for (const auto& t : dense_leaves) {
          std::vector<int64_t> shape = t.sizes().vec();
          shape[0] = ring->capacity;
          gather_buf.push_back(at::empty(shape, t.options()));
        }
      }
      TensorDict b{BatchSize(bs)};
      for (size_t l = 0; l < dense_leaves.size(); ++l) {
        at::Tensor dst = gather_buf[l].narrow(0, 0, n);
        at::index_select_out(dst, dense_leaves[l], 0, idx);
        b.set(src_keys[l], dst);
      }
      return b;
    }
    // any other node (lazy stack, HDF5, Redis): one indexed read of every leaf
    TensorDict b = src.index({idx}).to_tensordict();
    if (into_slot) {
      write_result(b, slot, n, -1, -1, false);
      return TensorDict::undefined();
    }
    return b;
  }

  //! copies `r` into the slot, checking it against the slot layout
  void write_result(const TensorDict& r, uint32_t slot, int64_t n, int64_t batch, int64_t epoch, bool from_transform) {
    const auto& leaves = ring->cfg.leaves;
    // the errors' subject, built only for an error (every batch passes here)
    auto who = [&] {
      return from_transform ? "the transform's result for " + batch_name(batch, epoch) : std::string("the gathered batch");
    };
    if (!r.defined()) throw ValueError("DataLoader: " + who() + " is undefined (the transform must return a TensorDict)");
    if (r.batch_dims() < 1 || r.batch_size()[0] != n) {
      throw BatchSizeError("DataLoader: " + who() + " has batch size " + shape_str(r.batch_size()) + "; expected " +
                           std::to_string(n) + " rows first (one per row of the batch)");
    }
    const auto keys = r.keys(KeysOptions().include_nested(true).leaves_only(true));
    if (keys.size() != leaves.size()) {
      throw ValueError("DataLoader: " + who() + " has " + std::to_string(keys.size()) + " tensor leaves; the ring slot holds " +
                       std::to_string(leaves.size()) + " (every batch must have the keys of the first batch)");
    }
    for (size_t l = 0; l < leaves.size(); ++l) {
      at::Tensor t = r.get(leaves[l].key, at::Tensor());  // one lookup: undefined when missing
      if (!t.defined()) {
        throw KeyError("DataLoader: " + who() + " has no key '" + leaves[l].key.join() + "' (every batch must have the keys of the first batch)");
      }
      const auto& feature = leaves[l].feature;
      const bool fits = t.scalar_type() == leaves[l].dtype && t.dim() == static_cast<int64_t>(feature.size()) + 1 &&
                        t.size(0) == n && std::equal(feature.begin(), feature.end(), t.sizes().begin() + 1);
      if (!fits) {
        throw ValueError("DataLoader: " + who() + " does not fit the ring slot: key '" + leaves[l].key.join() + "' is " +
                         std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes()) + ", the slot holds " +
                         std::string(c10::toString(leaves[l].dtype)) + " " + shape_str(ring->leaf_shape(l, n)) +
                         " (every batch must have the dtypes and shapes of the first batch)");
      }
      void* dst = ring->leaf_ptr(slot, l);
      if (dst == t.data_ptr()) continue;
      if (t.is_contiguous() && t.is_cpu()) {
        std::memcpy(dst, t.data_ptr(), t.nbytes());  // at::copy_'s dispatch and iterator: ~4% of a bench_loader batch
      } else {
        ring->leaf_view(slot, l, n).copy_(t);
      }
    }
  }

  //! runs the claimed slot to the end: ready, or failed with the error
  void run(uint32_t slot) {
    SlotCtl& c = *ring->ctl(slot);
    const int64_t n = c.nrows;
    try {
      // a worker's torch threads; the trainer's own thread (num_workers 0) keeps the user's setting
      if (index >= 0 && at::get_num_threads() != worker_threads) at::set_num_threads(static_cast<int>(worker_threads));
      at::Tensor idx = at::from_blob(ring->indices(slot), {n}, at::TensorOptions().dtype(at::kLong));
      fault_point("claim");
      if (!transform) {
        gather(idx, n, slot, true);
      } else {
        TensorDict in = gather(idx, n, slot, false);
        MapWorkerContext ctx;
        ctx.worker_index = index;
        ctx.seed = c.seed;
        ctx.chunk = c.batch;
        TensorDict out = map_detail::call_with_context(transform, in, ctx);
        write_result(out, slot, n, c.batch, c.epoch, true);
      }
      fault_point("write");  // the slot written, not yet ready
      c.ready_ns = now_ns();
      c.state.store(kReady, std::memory_order_release);
    } catch (...) {
      map_detail::CarriedError e = map_detail::carry_current_exception(c.batch);
      const std::string who = index < 0 ? std::string("the trainer") : "worker " + std::to_string(index);
      c.err_code = static_cast<int32_t>(e.code);
      copy_message(c.err, c.err_len, "DataLoader: " + batch_name(c.batch, c.epoch) + " (" + who + "): " + e.message);
      c.ready_ns = now_ns();
      c.state.store(kFailed, std::memory_order_release);
    }
    signal_done(*ring->hdr, slot);
    fault_point("ready");
  }

  //! claims the pending slot with the smallest task number; -1 when none
  int64_t claim() {
    for (int attempt = 0; attempt < 4; ++attempt) {
      int64_t best = -1;
      int64_t best_task = INT64_MAX;
      for (uint32_t s = 0; s < ring->num_slots; ++s) {
        SlotCtl& c = *ring->ctl(s);
        if (c.state.load(std::memory_order_acquire) != kPending) continue;
        const int64_t task = c.task.load(std::memory_order_relaxed);
        if (task < best_task) {
          best_task = task;
          best = s;
        }
      }
      if (best < 0) return -1;
      uint32_t expected = kPending;
      if (ring->ctl(static_cast<uint32_t>(best))->state.compare_exchange_strong(expected, claimed_by(index),
                                                                                 std::memory_order_acq_rel)) {
        return best;
      }
    }
    return -1;
  }

  //! the worker loop: until shutdown (or `gone()` says the trainer is gone)
  void loop(const std::function<bool()>& gone) {
    RingHeader& h = *ring->hdr;
    for (;;) {
      if (h.shutdown.load(std::memory_order_acquire)) return;
      const uint32_t seq = h.work_seq.load(std::memory_order_seq_cst);
      const int64_t s = claim();
      if (s >= 0) {
        run(static_cast<uint32_t>(s));
        continue;
      }
      if (spin_until([&] { return h.work_seq.load(std::memory_order_relaxed) != seq || h.shutdown.load(std::memory_order_relaxed); },
                     spin_budget().worker_ns)) {
        continue;
      }
      h.work_waiters.fetch_add(1, std::memory_order_seq_cst);
      if (h.work_seq.load(std::memory_order_seq_cst) == seq && !h.shutdown.load()) futex_wait(&h.work_seq, seq, 100000);
      h.work_waiters.fetch_sub(1, std::memory_order_seq_cst);
      if (gone && gone()) return;
    }
  }
};

//! keeps a slot held by the trainer until the last tensor of a yielded batch dies
struct SlotLease {
  std::shared_ptr<Ring> ring;
  uint32_t slot;
  SlotLease(std::shared_ptr<Ring> r, uint32_t s) : ring(std::move(r)), slot(s) {}
  ~SlotLease() { ring->ctl(slot)->state.store(kFree, std::memory_order_release); }
};

std::string exe_of(const LoaderOptions& o) { return o.worker_executable().empty() ? "/proc/self/exe" : o.worker_executable(); }

}  // namespace

// ============================================================================ the trainer side
struct DataLoader::Impl {
  // configuration (fixed at construction)
  TensorDict src;
  LoaderOptions opts;
  Sampler sampler = Sampler::sequential();
  int64_t n = 0;               // dataset rows
  int64_t epoch_len = 0;       // sampler indices per epoch
  int64_t num_batches = 0;
  int64_t num_workers = 0;
  int64_t num_processes = 0;
  int64_t in_flight_max = 1;
  uint32_t num_slots = 3;
  int64_t seed = 0;
  MapFn transform;
  RingConfig cfg;              // layout (offsets filled by Ring::create)
  std::vector<int64_t> result_rest;
  int64_t start_timeout_ms = 30000;
  int64_t exit_grace_ms = 2000;
  std::string prefix;

  // session: the ring and its workers
  std::shared_ptr<Ring> ring;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<WorkerCore>> thread_cores;  // threads[i]'s core: its `exited` flag
  std::unique_ptr<actors::ProcessTable> procs;
  std::vector<bool> lost;      // per worker index
  int64_t lost_alive_check_ns = 0;
  int64_t session_start_ns = 0;
  int64_t settled_ns = 0;      // when every worker process had attached or was lost (0: not yet); timeouts count from it
  bool unlinked = false;
  std::string last_loss;
  std::unique_ptr<WorkerCore> inline_core;  // num_workers == 0

  // epoch
  int64_t next_epoch = 0;
  bool active = false;
  int64_t cur_epoch = -1;
  at::Tensor indices;
  // the order of the epoch after this one, computed on a helper thread while this epoch runs (a sampler's
  // order is a pure function of its seed and the epoch): a 1M-row randperm is 10-40 ms that the workers
  // would otherwise sit idle through at every epoch start
  std::future<at::Tensor> next_order;
  int64_t next_order_epoch = -1;
  int64_t next_dispatch = 0;
  int64_t next_yield = 0;
  int64_t task_counter = 0;
  struct InFlight {
    int64_t batch;
    uint32_t slot;
  };
  std::deque<InFlight> inflight;
  std::vector<char> orphan;
  LoaderStats st;

  ~Impl() { stop_session(); }

  // ---------------------------------------------------------------- session
  void start_session() {
    if (ring) return;
    if (num_processes > 0) {
      if (const char* e = std::getenv(loader_detail::kLoaderWorkerEnv); e && *e) {
        throw RuntimeError("DataLoader: this process was started as a loader worker; its main must call "
                           "tensordict::run_worker_if_requested first (no recursive worker processes)");
      }
    }
    ring = Ring::create(cfg, opts.batch_size(), num_slots, static_cast<uint32_t>(num_workers), prefix);
    orphan.assign(num_slots, 0);
    lost.assign(static_cast<size_t>(num_workers), false);
    unlinked = false;
    session_start_ns = now_ns();
    settled_ns = num_processes == 0 ? session_start_ns : 0;
    if (num_processes == 0) {
      ring->seg->unlink();  // nobody else opens it: no name left behind, whatever happens to us
      unlinked = true;
    }
    if (num_workers == 0) {
      inline_core = make_core(-1);
      return;
    }
    const int64_t num_threads = num_workers - num_processes;
    try {
      for (int64_t w = 0; w < num_threads; ++w) {
        std::shared_ptr<WorkerCore> core = make_core(w);
        thread_cores.push_back(core);
        // the thread owns its core (the ring's mapping, the dataset handle, the transform): one left running
        // detached after a timeout (stop_session) touches nothing the loader frees
        threads.emplace_back([core] {
          core->loop(nullptr);
          core->exited.store(true, std::memory_order_release);
        });
      }
      if (num_processes > 0) {
        procs = std::make_unique<actors::ProcessTable>(num_threads);
        const std::string exe = exe_of(opts);
        for (int64_t w = num_threads; w < num_workers; ++w) {
          procs->add(actors::spawn_worker_process(exe, ring->seg->name() + ":" + std::to_string(w),
                                                  loader_detail::kLoaderWorkerEnv));
        }
      }
    } catch (...) {
      stop_session();
      throw;
    }
  }

  std::unique_ptr<WorkerCore> make_core(int64_t w) {
    auto c = std::make_unique<WorkerCore>();
    c->ring = ring;
    c->src = src;
    c->transform = transform;
    c->index = w;
    c->worker_threads = opts.worker_threads();
    c->prepare();
    return c;
  }

  //! stops the session; with a timeout, waits for the worker threads at most `thread_wait` (default: the timeout)
  //! and leaves one still in its transform running detached (it owns its core)
  void stop_session(std::optional<std::chrono::milliseconds> thread_wait = std::nullopt) {
    if (!ring) return;
    RingHeader& h = *ring->hdr;
    h.shutdown.store(1, std::memory_order_seq_cst);
    h.work_seq.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&h.work_seq);
    const int64_t wait_ns = (thread_wait ? *thread_wait : opts.timeout()).count() * 1000000;
    const int64_t deadline = now_ns() + wait_ns;
    for (size_t i = 0; i < threads.size(); ++i) {
      if (!threads[i].joinable()) continue;
      if (opts.timeout().count() > 0) {
        while (!thread_cores[i]->exited.load(std::memory_order_acquire) && now_ns() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (!thread_cores[i]->exited.load(std::memory_order_acquire)) {
          logger()->warn("DataLoader: worker thread {} is still in its transform {} ms after the loader stopped it: "
                         "left running detached (it exits when the call returns)",
                         thread_cores[i]->index, wait_ns / 1000000);
          threads[i].detach();
          continue;
        }
      }
      threads[i].join();
    }
    threads.clear();
    thread_cores.clear();
    if (procs) {
      procs->reap_all(std::chrono::milliseconds(exit_grace_ms));
      procs.reset();
    }
    try {
      ring->seg->unlink();
    } catch (const std::exception& e) {
      logger()->warn("DataLoader: cannot unlink the ring {}: {}", ring->seg->name(), e.what());
    }
    inline_core.reset();
    ring.reset();  // batches still alive keep the mapping (not the name)
    inflight.clear();
    orphan.clear();
    active = false;
  }

  // ---------------------------------------------------------------- epoch
  void start_epoch() {
    cancel_epoch();
    start_session();
    cur_epoch = next_epoch++;
    if (next_order.valid() && next_order_epoch == cur_epoch) {
      indices = next_order.get();  // rethrows what the sampler threw
    } else {
      if (next_order.valid()) next_order.wait();  // another epoch was set: the prefetched order is not used
      indices = sampler.indices(n, cur_epoch).contiguous();
    }
    next_order_epoch = next_epoch;
    next_order = std::async(std::launch::async, [smp = sampler, rows = n, ep = next_epoch] {
      return smp.indices(rows, ep).contiguous();
    });
    next_dispatch = 0;
    next_yield = 0;
    st = LoaderStats();
    st.epoch = cur_epoch;
    st.reassigned = reassigned_total;
    st.lost_workers = lost_total;
    st.in_flight_max = in_flight_max;
    active = true;
  }
  int64_t reassigned_total = 0;
  int64_t lost_total = 0;

  void cancel_epoch() {
    for (const auto& f : inflight) orphan[f.slot] = 1;
    inflight.clear();
    active = false;
  }

  void end_epoch() {
    active = false;
    if (!opts.persistent_workers()) stop_session();
  }

  void reclaim_orphans() {
    for (uint32_t s = 0; s < orphan.size(); ++s) {
      if (!orphan[s]) continue;
      SlotCtl& c = *ring->ctl(s);
      uint32_t w = c.state.load(std::memory_order_acquire);
      if (state_of(w) == kPending) {
        if (c.state.compare_exchange_strong(w, kFree)) orphan[s] = 0;
      } else if (state_of(w) == kReady || state_of(w) == kFailed) {
        c.state.store(kFree, std::memory_order_release);
        orphan[s] = 0;
      }
    }
  }

  bool post_one() {
    uint32_t slot = UINT32_MAX;
    for (uint32_t s = 0; s < num_slots; ++s) {
      if (!orphan[s] && ring->ctl(s)->state.load(std::memory_order_acquire) == kFree) {
        slot = s;
        break;
      }
    }
    if (slot == UINT32_MAX) return false;
    const int64_t b = next_dispatch;
    const int64_t start = b * opts.batch_size();
    const int64_t rows = std::min(opts.batch_size(), epoch_len - start);
    SlotCtl& c = *ring->ctl(slot);
    c.task.store(task_counter++, std::memory_order_relaxed);
    c.batch = b;
    c.epoch = cur_epoch;
    c.nrows = rows;
    c.seed = batch_seed(seed, cur_epoch, b);
    c.err_code = 0;
    c.err_len = 0;
    std::memcpy(ring->indices(slot), indices.data_ptr<int64_t>() + start, static_cast<size_t>(rows) * sizeof(int64_t));
    c.posted_ns = now_ns();
    c.state.store(kPending, std::memory_order_release);
    inflight.push_back({b, slot});
    ++next_dispatch;
    return true;
  }

  void dispatch() {
    reclaim_orphans();
    bool posted = false;
    while (next_dispatch < num_batches && static_cast<int64_t>(inflight.size()) < in_flight_max && post_one()) posted = true;
    if (posted && num_workers > 0) signal_seq(ring->hdr->work_seq, ring->hdr->work_waiters);
  }

  // ---------------------------------------------------------------- worker health
  int64_t alive_workers() const {
    int64_t a = 0;
    for (bool l : lost) a += l ? 0 : 1;
    return a;
  }

  [[noreturn]] void fail_session(const std::string& msg, ErrorCode code = ErrorCode::Backend) {
    stop_session();
    throw_error(code, msg);
  }

  void worker_lost(int64_t w, const std::string& why) {
    if (lost[static_cast<size_t>(w)]) return;
    lost[static_cast<size_t>(w)] = true;
    ++lost_total;
    ++st.lost_workers;
    const pid_t pid = procs ? procs->pid(static_cast<size_t>(w - procs->first_index())) : -1;
    last_loss = "worker process " + std::to_string(w) + " (pid " + std::to_string(pid) + ") " + why;
    // its claimed slots go back to the queue: another worker redoes them
    for (uint32_t s = 0; s < num_slots; ++s) {
      SlotCtl& c = *ring->ctl(s);
      uint32_t word = c.state.load(std::memory_order_acquire);
      if (state_of(word) == kClaimed && claimer_of(word) == w && c.state.compare_exchange_strong(word, kPending)) {
        ++reassigned_total;
        ++st.reassigned;
        logger()->warn("DataLoader: {}; {} goes to another worker", last_loss, batch_name(c.batch, c.epoch));
      }
    }
    signal_seq(ring->hdr->work_seq, ring->hdr->work_waiters);
  }

  //! polls the worker processes: failed starts, deaths (reassigning their batches), attach timeouts
  void check_workers() {
    if (!procs) return;
    for (size_t p = 0; p < procs->size(); ++p) {
      const int64_t w = procs->first_index() + static_cast<int64_t>(p);
      WorkerRec& rec = ring->worker(w);
      if (rec.state.load(std::memory_order_acquire) == kOpenFailed) {
        const std::string msg(rec.err, std::min<size_t>(rec.err_len, kErrBytes));
        fail_session("DataLoader: worker process " + std::to_string(w) + " (pid " + std::to_string(procs->pid(p)) +
                         ") could not start: " + msg,
                     static_cast<ErrorCode>(rec.err_code));
      }
    }
    for (auto& ex : procs->poll()) worker_lost(procs->first_index() + static_cast<int64_t>(ex.first), ex.second);
    bool all_settled = true;
    const int64_t now = now_ns();
    for (size_t p = 0; p < procs->size(); ++p) {
      const int64_t w = procs->first_index() + static_cast<int64_t>(p);
      if (lost[static_cast<size_t>(w)]) continue;
      if (ring->worker(w).state.load(std::memory_order_acquire) != kAttached) {
        all_settled = false;
        if (now - session_start_ns > start_timeout_ms * 1000000) {
          logger()->warn("DataLoader: worker process {} did not start within {} ms: SIGKILL", w, start_timeout_ms);
          procs->kill(p);
        }
      }
    }
    if (all_settled && settled_ns == 0) settled_ns = now;
    if (all_settled && !unlinked) {
      ring->seg->unlink();  // every worker mapped it: from now on a SIGKILL of the trainer leaves no name behind
      unlinked = true;
    }
    if (alive_workers() == 0) {
      fail_session("DataLoader: every worker is gone, the last: " + last_loss + "; " +
                   batch_name(next_yield, cur_epoch) + " was not done");
    }
  }

  bool has_orphans() const {
    for (char o : orphan)
      if (o) return true;
    return false;
  }

  //! one bounded wait for any slot to finish (20 ms), checking the workers
  void wait_any() {
    RingHeader& h = *ring->hdr;
    if (procs) check_workers();
    if (!ring) return;
    h.done_want.store(0, std::memory_order_seq_cst);  // any slot
    const uint32_t seq = ring->hdr->done_seq.load(std::memory_order_seq_cst);
    h.done_waiters.fetch_add(1, std::memory_order_seq_cst);
    futex_wait(&h.done_seq, seq, 20000);
    h.done_waiters.fetch_sub(1, std::memory_order_seq_cst);
  }

  //! the batch in `slot` did not come within the timeout: stops the session (worker processes SIGKILLed and
  //! reaped at once; worker threads waited for briefly, a stuck one left detached) and throws RuntimeError
  [[noreturn]] void timed_out(uint32_t slot) {
    SlotCtl& c = *ring->ctl(slot);
    const uint32_t word = c.state.load(std::memory_order_acquire);
    const int64_t num_threads = num_workers - num_processes;
    std::string who = "no worker had taken it yet (each was still on an earlier batch)";
    if (state_of(word) == kClaimed) {
      const int64_t w = claimer_of(word);
      if (w < num_threads) {
        who = "worker thread " + std::to_string(w) + " was still on it: a thread cannot be killed, it is left running detached";
      } else {
        who = "worker process " + std::to_string(w) + " (pid " +
              std::to_string(procs ? procs->pid(static_cast<size_t>(w - procs->first_index())) : -1) +
              ") was still on it: killed";
      }
    }
    const std::string msg = "DataLoader: " + batch_name(c.batch, c.epoch) + " timed out after " +
                            std::to_string(opts.timeout().count()) + " ms (" + who +
                            "); the workers were stopped, the next next() starts a new epoch";
    if (procs) {
      for (size_t p = 0; p < procs->size(); ++p) procs->kill(p);
    }
    stop_session(std::chrono::milliseconds(100));  // idle threads leave at once; busy ones are left detached
    throw RuntimeError(msg);
  }

  //! waits until the slot is ready or failed (bounded steps; checks the workers every 20 ms), at most the
  //! timeout (counted once the worker processes have all attached)
  void wait_slot(uint32_t slot) {
    RingHeader& h = *ring->hdr;
    SlotCtl& c = *ring->ctl(slot);
    auto done = [&] {
      const uint32_t s = state_of(c.state.load(std::memory_order_acquire));
      return s == kReady || s == kFailed;
    };
    if (done()) return;
    if (spin_until(done, spin_budget().trainer_ns)) return;
    const int64_t timeout_ns = opts.timeout().count() * 1000000;
    const int64_t wait_start = now_ns();
    int64_t last_check = 0;
    while (!done()) {
      const int64_t now = now_ns();
      if (procs && now - last_check > 20000000) {
        check_workers();
        last_check = now;
        if (done()) break;
      }
      if (timeout_ns > 0 && num_workers > 0 && settled_ns != 0 && now - std::max(wait_start, settled_ns) > timeout_ns) {
        timed_out(slot);
      }
      h.done_want.store(slot + 1, std::memory_order_seq_cst);
      const uint32_t seq = h.done_seq.load(std::memory_order_seq_cst);
      h.done_waiters.fetch_add(1, std::memory_order_seq_cst);
      if (!done() && h.done_seq.load(std::memory_order_seq_cst) == seq) {
        ++st.sleeps;
        if (futex_wait(&h.done_seq, seq, 20000) && !done()) ++st.needless_wakes;
      }
      h.done_waiters.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::optional<TensorDict> next() {
    if (!active) start_epoch();
    if (next_yield >= num_batches) {
      end_epoch();
      return std::nullopt;
    }
    const int64_t t0 = now_ns();
    if (procs && (!unlinked || (st.batches & 63) == 0)) check_workers();  // the unlink happens early even when never waiting
    dispatch();
    // slots of an abandoned epoch still in a worker's hands come back when it is done with them
    for (int i = 0; inflight.empty() && has_orphans() && i < 1000000; ++i) {
      wait_any();
      dispatch();
    }
    if (inflight.empty()) {
      cancel_epoch();
      throw RuntimeError("DataLoader: every ring slot (" + std::to_string(num_slots) +
                         ") is held by a batch that is still alive, so " + batch_name(next_yield, cur_epoch) +
                         " has nowhere to go; release batches (and their views) or raise LoaderOptions().ring_slots()");
    }
    const InFlight f = inflight.front();
    SlotCtl& c = *ring->ctl(f.slot);
    if (num_workers == 0) {
      uint32_t expected = kPending;
      if (c.state.compare_exchange_strong(expected, claimed_by(-1))) inline_core->run(f.slot);
    }
    const int64_t t1 = now_ns();
    wait_slot(f.slot);
    const int64_t waited = now_ns() - t1;
    inflight.pop_front();
    if (state_of(c.state.load(std::memory_order_acquire)) == kFailed) {
      const std::string msg(c.err, std::min<size_t>(c.err_len, kErrBytes));
      const ErrorCode code = static_cast<ErrorCode>(c.err_code);
      c.state.store(kFree, std::memory_order_release);
      cancel_epoch();
      throw_error(code, msg);
    }
    c.state.store(kHeld, std::memory_order_release);
    TensorDict batch = make_batch(f.slot, c.nrows);
    ++next_yield;
    ++st.batches;
    st.samples += c.nrows;
    const double wait_us = (num_workers == 0 ? (now_ns() - t0) : waited) / 1e3;
    st.wait_us.push_back(wait_us);
    st.wait_s += wait_us / 1e6;
    st.latency_us.push_back((c.ready_ns - c.posted_ns) / 1e3);
    dispatch();  // refill while the trainer works on this batch
    return batch;
  }

  TensorDict make_batch(uint32_t slot, int64_t rows) {
    auto lease = std::make_shared<SlotLease>(ring, slot);
    std::vector<int64_t> bs{rows};
    bs.insert(bs.end(), result_rest.begin(), result_rest.end());
    TensorDict td{BatchSize(bs)};
    for (size_t l = 0; l < ring->cfg.leaves.size(); ++l) {
      at::Tensor t = at::from_blob(ring->leaf_ptr(slot, l), ring->leaf_shape(l, rows), [lease](void*) {},
                                   at::TensorOptions().dtype(ring->cfg.leaves[l].dtype));
      td.set(ring->cfg.leaves[l].key, t);
    }
    return td;
  }
};

// ============================================================================ DataLoader
namespace {

std::vector<int64_t> tail(const BatchSize& b) { return std::vector<int64_t>(b.begin() + 1, b.end()); }

constexpr const char* kProbeTimedOut = "did not return within";

//! the constructor's run of the transform with a timeout: on a thread of its own that owns its inputs, so a
//! call that never returns is left running detached and the constructor throws RuntimeError
TensorDict call_within(const MapFn& fn, const TensorDict& rows, const MapWorkerContext& ctx, std::chrono::milliseconds timeout,
                       int64_t nrows) {
  struct Call {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    TensorDict result;
    std::exception_ptr error;
  };
  auto call = std::make_shared<Call>();
  std::thread([call, fn, rows, ctx] {
    TensorDict r;
    std::exception_ptr e;
    try {
      r = map_detail::call_with_context(fn, rows, ctx);
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(call->mu);
    call->result = std::move(r);
    call->error = e;
    call->done = true;
    call->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mu);
  if (!call->cv.wait_for(lock, timeout, [&] { return call->done; })) {
    throw RuntimeError("DataLoader: the transform " + std::string(kProbeTimedOut) + " " + std::to_string(timeout.count()) +
                       " ms on rows [0, " + std::to_string(nrows) +
                       ") (batch 0, run once in the constructor to learn the batch layout); the call is left running "
                       "on a detached thread");
  }
  if (call->error) std::rethrow_exception(call->error);
  return call->result;
}

//! the default prefetch: batches in flight per worker such that all workers' batches in flight stay within
//! kAutoPrefetchBytes, between 2 (torch's prefetch_factor) and 8. Workers finish out of order and the trainer
//! takes batches in order, so with 2 per worker a worker often waits for the trainer to free a slot; small
//! batches can afford deeper queues (bench_loader, 2 workers, 256 x 64 floats: 2 -> 1.0-1.1x the loop,
//! 8 -> 1.6-1.75x), large ones keep torch's depth and its memory
constexpr int64_t kAutoPrefetchBytes = int64_t{64} << 20;
int64_t auto_prefetch(const std::vector<LeafSpec>& leaves, int64_t batch_size, int64_t workers) {
  double bytes = 0;
  for (const LeafSpec& l : leaves) {
    double n = static_cast<double>(batch_size) * static_cast<double>(c10::elementSize(l.dtype));
    for (int64_t d : l.feature) n *= static_cast<double>(d);
    bytes += n;
  }
  const double fit = bytes > 0 ? static_cast<double>(kAutoPrefetchBytes) / (bytes * static_cast<double>(workers)) : 8.0;
  return std::clamp<int64_t>(static_cast<int64_t>(fit), 2, 8);
}

}  // namespace

DataLoader::DataLoader(TensorDict dataset, LoaderOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const LoaderOptions& o = options;
  if (!dataset.defined()) throw ValueError("DataLoader: the dataset is an undefined TensorDict");
  if (dataset.batch_dims() < 1) {
    throw BatchSizeError("DataLoader: the dataset needs at least one batch dim (its rows), it has batch size []");
  }
  if (o.batch_size() < 1) throw ValueError("DataLoader: batch_size must be >= 1, got " + std::to_string(o.batch_size()));
  m.n = dataset.batch_size()[0];
  if (m.n == 0) throw ValueError("DataLoader: the dataset is empty (batch size " + shape_str(dataset.batch_size()) + ")");
  if (o.prefetch() && *o.prefetch() < 1)
    throw ValueError("DataLoader: prefetch must be >= 1, got " + std::to_string(*o.prefetch()));
  if (o.ring_slots() < 0) throw ValueError("DataLoader: ring_slots must be >= 0 (0: automatic), got " + std::to_string(o.ring_slots()));
  if (o.worker_threads() < 1) throw ValueError("DataLoader: worker_threads must be >= 1, got " + std::to_string(o.worker_threads()));
  if (o.worker_processes() < 0) throw ValueError("DataLoader: worker_processes must be >= 0, got " + std::to_string(o.worker_processes()));
  if (o.timeout().count() < 0) {
    throw ValueError("DataLoader: timeout must be >= 0 ms (0: none), got " + std::to_string(o.timeout().count()));
  }
  m.num_processes = o.worker_processes();
  m.num_workers = o.num_workers() ? *o.num_workers() : m.num_processes;
  if (m.num_workers < 0 || m.num_workers > kMaxWorkers) {
    throw ValueError("DataLoader: num_workers must be in [0, " + std::to_string(kMaxWorkers) + "], got " + std::to_string(m.num_workers));
  }
  if (m.num_processes > m.num_workers) {
    throw ValueError("DataLoader: worker_processes (" + std::to_string(m.num_processes) + ") > num_workers (" +
                     std::to_string(m.num_workers) + ")");
  }
  if (o.transform() && !o.transform_name().empty()) {
    throw ValueError("DataLoader: give transform or transform_name, not both");
  }
  m.seed = o.seed() ? *o.seed() : random_seed();
  m.sampler = o.sampler() ? *o.sampler() : (o.shuffle() ? Sampler::random(m.seed) : Sampler::sequential());
  m.epoch_len = m.sampler.length(m.n);
  m.num_batches = o.drop_last() ? m.epoch_len / o.batch_size() : (m.epoch_len + o.batch_size() - 1) / o.batch_size();
  if (m.num_batches == 0) {
    throw ValueError("DataLoader: an epoch has no batch: the " + m.sampler.kind() + " sampler yields " +
                     std::to_string(m.epoch_len) + " rows of " + std::to_string(m.n) +
                     (o.drop_last() ? ", fewer than batch_size " + std::to_string(o.batch_size()) + " with drop_last" : std::string()));
  }
  if (!o.transform_name().empty()) {
    m.transform = find_map_fn(o.transform_name());
    if (!m.transform) {
      std::string names;
      for (const auto& s : registered_map_fns()) names += (names.empty() ? "" : ", ") + s;
      throw KeyError("DataLoader: no transform named '" + o.transform_name() +
                     "' is registered (tensordict::register_map_fn); registered: " + (names.empty() ? "none" : names));
    }
  } else {
    m.transform = o.transform();
  }
  if (m.num_processes > 0) {
    if (o.transform()) {
      throw ValueError("DataLoader: worker processes cannot run a closure transform: register it by name "
                       "(register_map_fn) and pass LoaderOptions().transform_name(...)");
    }
    m.cfg.src_spec = StorageSpec::of(dataset, "the DataLoader's dataset (worker processes open it)").dump();
    m.cfg.transform = o.transform_name();
    const std::string exe = exe_of(o);
    if (::access(exe.c_str(), X_OK) != 0) {
      throw ValueError("DataLoader: the worker executable '" + exe + "' is not an executable file");
    }
  }
  const Config config = Config::load();
  m.start_timeout_ms = o.start_timeout_ms() ? *o.start_timeout_ms() : config.request_timeout_ms;
  m.exit_grace_ms = config.map_process_exit_grace_ms;
  m.prefix = TensorDict::shm_prefix() + "loader_";
  m.cfg.log_level = config.log_level;
  m.cfg.worker_threads = o.worker_threads();

  // the slot layout: the first batch's rows [0, batch_size) (through the transform when there is one)
  const int64_t probe_rows = std::min(o.batch_size(), m.n);
  TensorDict probe = dataset.index({at::indexing::Slice(0, probe_rows)}).to_tensordict();
  {
    const auto all = probe.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true));
    for (const auto& k : all) {
      if (probe.is_non_tensor(k)) {
        throw TypeError("DataLoader: the dataset has a non-tensor leaf '" + k.join() +
                        "'; the loader carries tensor leaves only (exclude it first: td.exclude({...}))");
      }
    }
  }
  TensorDict layout = probe;
  if (m.transform) {
    MapWorkerContext ctx;
    ctx.worker_index = -1;
    ctx.seed = batch_seed(m.seed, -1, 0);
    ctx.chunk = 0;
    try {
      layout = o.timeout().count() > 0 ? call_within(m.transform, probe, ctx, o.timeout(), probe_rows)
                                       : map_detail::call_with_context(m.transform, probe, ctx);
    } catch (const RuntimeError& e) {
      if (std::strstr(e.what(), kProbeTimedOut) != nullptr) throw;
      map_detail::CarriedError ce = map_detail::carry_current_exception(0);
      throw_error(ce.code, "DataLoader: the transform failed on rows [0, " + std::to_string(probe_rows) +
                               ") (run once to learn the batch layout): " + ce.message);
    } catch (...) {
      map_detail::CarriedError e = map_detail::carry_current_exception(0);
      throw_error(e.code, "DataLoader: the transform failed on rows [0, " + std::to_string(probe_rows) +
                              ") (run once to learn the batch layout): " + e.message);
    }
    if (!layout.defined()) throw ValueError("DataLoader: the transform returned an undefined TensorDict on rows [0, " + std::to_string(probe_rows) + ")");
    if (layout.batch_dims() < 1 || layout.batch_size()[0] != probe_rows) {
      throw BatchSizeError("DataLoader: the transform's result on rows [0, " + std::to_string(probe_rows) + ") has batch size " +
                           shape_str(layout.batch_size()) + "; expected " + std::to_string(probe_rows) + " rows first");
    }
  }
  for (const auto& k : layout.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (layout.is_non_tensor(k)) {
      throw TypeError("DataLoader: the transform's result has a non-tensor leaf '" + k.join() + "'; the loader carries tensor leaves only");
    }
    at::Tensor t = layout.get(k);
    if (t.device().type() != at::kCPU) throw TypeError("DataLoader: leaf '" + k.join() + "' is not on the CPU");
    LeafSpec s;
    s.key = k;
    s.dtype = t.scalar_type();
    s.feature.assign(t.sizes().begin() + 1, t.sizes().end());
    backends::dtype_name(s.dtype);  // ValueError for dtypes the shared-memory layout cannot hold
    m.cfg.leaves.push_back(std::move(s));
  }
  if (m.cfg.leaves.empty()) throw ValueError("DataLoader: the batches have no tensor leaf");
  m.result_rest = tail(layout.batch_size());
  const int64_t prefetch = o.prefetch() ? *o.prefetch() : auto_prefetch(m.cfg.leaves, o.batch_size(), std::max<int64_t>(1, m.num_workers));
  m.in_flight_max = std::max<int64_t>(1, m.num_workers) * prefetch;
  m.st.in_flight_max = m.in_flight_max;
  const int64_t slots = o.ring_slots() > 0 ? o.ring_slots() : std::max<int64_t>(3, m.num_workers * prefetch + 2);
  m.num_slots = static_cast<uint32_t>(slots);
  m.src = std::move(dataset);
  m.opts = std::move(options);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

int64_t DataLoader::size() const { return impl_->num_batches; }
int64_t DataLoader::epoch() const { return impl_->next_epoch; }
void DataLoader::set_epoch(int64_t epoch) { impl_->next_epoch = epoch; }
std::optional<TensorDict> DataLoader::next() { return impl_->next(); }
void DataLoader::reset() {
  impl_->cancel_epoch();
  if (!impl_->opts.persistent_workers()) impl_->stop_session();
}
void DataLoader::shutdown() { impl_->stop_session(); }
LoaderStats DataLoader::stats() const { return impl_->st; }

std::vector<pid_t> DataLoader::worker_pids() const {
  std::vector<pid_t> out;
  if (!impl_->procs) return out;
  for (size_t p = 0; p < impl_->procs->size(); ++p) {
    if (!impl_->lost[impl_->procs->first_index() + p]) out.push_back(impl_->procs->pid(p));
  }
  return out;
}

std::string DataLoader::shm_prefix() { return TensorDict::shm_prefix() + "loader_"; }

DataLoader::iterator DataLoader::begin() {
  impl_->cancel_epoch();
  return iterator(this);
}

// ============================================================================ the worker process
namespace loader_detail {

bool run_loader_worker_process(int /*argc*/, char** /*argv*/) {
  const char* env = std::getenv(kLoaderWorkerEnv);
  if (!env || !*env) return false;
  const std::string value = env;
  ::unsetenv(kLoaderWorkerEnv);
  actors::watch_parent_or_exit();  // dies with the trainer, even in a transform that never returns
  const size_t colon = value.rfind(':');
  int64_t index = -1;
  try {
    if (colon != std::string::npos) index = std::stoll(value.substr(colon + 1));
  } catch (...) {
  }
  if (colon == std::string::npos || index < 0 || index >= kMaxWorkers) {
    std::fprintf(stderr, "tensordict loader worker: malformed %s=%s\n", kLoaderWorkerEnv, value.c_str());
    std::fflush(stderr);
    std::_Exit(2);
  }
  std::shared_ptr<Ring> ring;
  WorkerCore core;
  try {
    ring = Ring::attach(value.substr(0, colon));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensordict loader worker %lld: %s\n", static_cast<long long>(index), e.what());
    std::fflush(stderr);
    std::_Exit(3);
  }
  WorkerRec& rec = ring->worker(index);
  rec.pid.store(static_cast<int32_t>(::getpid()));
  const pid_t trainer = ring->hdr->trainer_pid;
  if (::getppid() != trainer) std::_Exit(4);  // the trainer is gone already
  // TD_FAULT_LOADER_WORKER=<stage>@<index>@<marker> (tensordict/actors/fault_points.hpp, tests/api/test_loader.cpp):
  // attach (the ring mapped, the source not open), open (the source open, not yet attached), claim (a batch
  // claimed, nothing written), write (the batch written into its slot, not marked ready), ready (just after)
  static const actors::FaultPoints faults("TD_FAULT_LOADER_WORKER");
  core.faults = &faults;
  core.index = index;
  core.fault_point("attach");
  try {
    if (!ring->cfg.log_level.empty()) set_log_level(ring->cfg.log_level);
    core.ring = ring;
    core.worker_threads = ring->cfg.worker_threads;
    core.src = open_storage(StorageSpec::parse(ring->cfg.src_spec), OpenOptions().writable(false));
    if (!ring->cfg.transform.empty()) {
      core.transform = find_map_fn(ring->cfg.transform);
      if (!core.transform) {
        throw KeyError("the worker executable has no transform named '" + ring->cfg.transform +
                       "' (register it there too, before run_worker_if_requested)");
      }
    }
    core.prepare();
    core.fault_point("open");
  } catch (...) {
    map_detail::CarriedError e = map_detail::carry_current_exception(-1);
    rec.err_code = static_cast<int32_t>(e.code);
    copy_message(rec.err, rec.err_len, e.message);
    rec.state.store(kOpenFailed, std::memory_order_release);
    signal_seq(ring->hdr->done_seq, ring->hdr->done_waiters);
    std::_Exit(3);
  }
  rec.state.store(kAttached, std::memory_order_release);
  core.loop([trainer] { return ::getppid() != trainer; });
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace loader_detail

}  // namespace tensordict
