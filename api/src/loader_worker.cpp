// The DataLoader's workers: the core that claims a slot of the ring, gathers its rows (and runs the transform)
// into it, shared by worker threads, worker processes and the trainer itself; and a worker process's main
// (run_worker_if_requested).
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ATen/Parallel.h>

#include "loader_internal.hpp"
#include "tensordict/actors/process_workers.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/node.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {
namespace loader_internal {

void WorkerCore::prepare() {
  src_keys = src.keys(KeysOptions().include_nested(true).leaves_only(true));
  if (!transform) {  // the gather writes the slot's leaves in the slot's order
    src_keys.clear();
    for (const auto& l : ring->cfg.leaves) src_keys.push_back(l.key);
  }
  src_rest.assign(src.batch_size().begin() + 1, src.batch_size().end());
  if (src.node()->caps().zero_copy_views) {  // leaves that are views of memory: rows gathered from them
    for (const auto& k : src_keys) dense_leaves.push_back(src.get(k));
  }
}

TensorDict WorkerCore::gather(const at::Tensor& idx, int64_t n, uint32_t slot, bool into_slot) {
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

void WorkerCore::write_result(const TensorDict& r, uint32_t slot, int64_t n, int64_t batch, int64_t epoch, bool from_transform) {
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

void WorkerCore::run(uint32_t slot) {
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

int64_t WorkerCore::claim() {
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

void WorkerCore::loop(const std::function<bool()>& gone) {
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

}  // namespace loader_internal

// ============================================================================ the worker process
namespace loader_detail {

using namespace loader_internal;

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
