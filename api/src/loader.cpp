// DataLoader: the trainer side (the session of ring + workers, epochs, dispatch, waits, worker health) and
// the constructor's checks of the options. Samplers: loader_sampler.cpp; the ring: loader_ring.cpp; the
// workers: loader_worker.cpp; what they share: loader_internal.hpp.
//
// One data path for every kind of worker: the trainer posts a batch (its row indices) into a free slot of
// a ring that lives in one shared-memory segment; a worker (a thread of this process, a worker process, or
// the trainer itself with num_workers 0) claims the slot with a CAS, gathers the rows straight into the
// slot's tensors (or gathers, transforms and copies the result in), and marks it ready. The trainer yields
// the slot's tensors zero-copy as a TensorDict whose storages hold a lease; the last view dying frees the
// slot. No locks live in the segment (a dead worker cannot leave one held): slot states are atomics, and
// waiting is a futex on a sequence word with a timeout, so every wait is bounded and re-checks the workers.
#include "tensordict/loader.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "loader_internal.hpp"
#include "tensordict/actors/process_workers.hpp"
#include "tensordict/config.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/map.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/shared_storage.hpp"

namespace tensordict {

using namespace loader_internal;

namespace {

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
  m.prefix = tensordict::shm_prefix() + "loader_";
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

std::string DataLoader::shm_prefix() { return tensordict::shm_prefix() + "loader_"; }

DataLoader::iterator DataLoader::begin() {
  impl_->cancel_epoch();
  return iterator(this);
}

}  // namespace tensordict
