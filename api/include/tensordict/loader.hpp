#pragma once
//! DataLoader: batches of a TensorDict (any node: memory, memmap, shared, lazy stack, HDF5, Redis) gathered
//! by workers (threads in this process, or worker processes) straight into the slots of a shared-memory
//! ring and yielded to the trainer zero-copy, in the sampler's order whatever the number of workers:
//!
//!   DataLoader loader(td, LoaderOptions().batch_size(256).shuffle(true).seed(0).worker_processes(2));
//!   for (TensorDict batch : loader) train_step(batch);   // one epoch; the next range-for runs the next
//!
//! A yielded batch keeps its ring slot until the batch and every view of its tensors are gone (RAII), so
//! a batch is never overwritten while it is in use. See api/README.md, "DataLoader".
//! Thread-safety: one DataLoader is driven by one thread at a time (like an iterator); batches may be
//! handed to and released on any thread.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tensordict/options.hpp"
#include "tensordict/next_iterator.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! Which rows an epoch visits, in which order. A cheap value (shared, immutable). The indices of an epoch
//! depend only on (the sampler's parameters, the dataset length, the epoch number).
class Sampler {
 public:
  //! 0, 1, ..., n-1
  static Sampler sequential();
  //! a random permutation per epoch: torch's randperm with a CPU generator seeded `seed + epoch`;
  //! no seed: one drawn at random when the sampler is made (fixed for its lifetime)
  static Sampler random(std::optional<int64_t> seed = std::nullopt);
  //! `num_samples` rows drawn with probability proportional to `weights` (1-d, one per row, finite,
  //! >= 0, not all 0), with or without replacement (torch.multinomial, generator seeded `seed + epoch`).
  //! ValueError for bad weights or num_samples <= 0 (or > the non-zero weights without replacement); the
  //! length is checked against the dataset by the DataLoader (ValueError naming both)
  static Sampler weighted(at::Tensor weights, int64_t num_samples, bool replacement = true,
                          std::optional<int64_t> seed = std::nullopt);
  //! this rank's share of an epoch: the (shuffled with `seed + epoch`, or sequential) order split
  //! round-robin over `world_size` ranks: rank r gets positions r, r + world_size, ... Ranks never overlap
  //! and together cover every row (their lengths differ by at most one); drop_last: the tail that does not
  //! divide evenly is dropped, so every rank has floor(n / world_size) rows. No seed: 0 (every rank must
  //! use the same). ValueError for world_size < 1, rank < 0 or rank >= world_size.
  static Sampler distributed(int64_t rank, int64_t world_size, bool shuffle = true,
                             std::optional<int64_t> seed = std::nullopt, bool drop_last = false);

  //! the row indices of `epoch` over a dataset of `n` rows (int64, 1-d)
  at::Tensor indices(int64_t n, int64_t epoch) const;
  //! how many indices an epoch yields for `n` rows; ValueError when the sampler does not fit `n` rows
  int64_t length(int64_t n) const;
  //! "sequential", "random", "weighted", "distributed"
  std::string kind() const;

  struct Impl;
  explicit Sampler(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

struct LoaderOptions {
  //! rows per batch (>= 1)
  TD_ARG(int64_t, batch_size) = 1;
  //! drop the last batch when it has fewer than batch_size rows
  TD_ARG(bool, drop_last) = false;
  //! shorthand for sampler(Sampler::random(seed)) when no sampler is given
  TD_ARG(bool, shuffle) = false;
  //! the seed of shuffle(true), and the base of the per-batch transform generators (default: random)
  TD_ARG(std::optional<int64_t>, seed) = std::nullopt;
  //! the sampler (default: sequential, or random with shuffle)
  TD_ARG(std::optional<Sampler>, sampler) = std::nullopt;
  //! workers in all; 0: the trainer's own thread gathers each batch when asked (torch's num_workers=0).
  //! Default: worker_processes
  TD_ARG(std::optional<int64_t>, num_workers) = std::nullopt;
  //! how many of the workers are worker PROCESSES (the last ones; the others are threads of this
  //! process). Needs a source another process can open (memmap in a directory, shared, HDF5, Redis) and
  //! a named transform (or none). The worker executable's main must call run_worker_if_requested first.
  TD_ARG(int64_t, worker_processes) = 0;
  //! batches in flight per worker (torch's prefetch_factor), >= 1. Default: as many as keep the batches in
  //! flight within 64 MiB, between 2 (torch's default) and 8 (small batches: deeper queues keep both
  //! workers busy while the trainer takes batches in order; bench_loader, 256 rows x 64 floats: 2 workers
  //! went from 1.0-1.1x to 1.6-1.75x the single-thread loop)
  TD_ARG(std::optional<int64_t>, prefetch) = std::nullopt;
  //! ring slots (in flight + held by the trainer); 0: num_workers * prefetch + 2 (at least 3)
  TD_ARG(int64_t, ring_slots) = 0;
  //! keep the workers (and their ring) across epochs; otherwise they start with each epoch and stop at
  //! its end
  TD_ARG(bool, persistent_workers) = false;
  //! per-batch transform run by the workers (threads only: a closure cannot cross processes)
  TD_ARG(MapFn, transform) = nullptr;
  //! per-batch transform registered by name (register_map_fn / TD_REGISTER_MAP_FN): threads and processes
  TD_ARG(std::string, transform_name) = "";
  //! the program a worker process runs (default: /proc/self/exe)
  TD_ARG(std::string, worker_executable) = "";
  //! torch intra-op threads in a worker while it gathers and transforms
  TD_ARG(int64_t, worker_threads) = 1;
  //! ms a worker process may take to start and attach before it is counted lost; default: the engine
  //! config's request_timeout_ms
  TD_ARG(std::optional<int64_t>, start_timeout_ms) = std::nullopt;
  //! how long the trainer waits for a batch (torch's DataLoader timeout; 0: forever, the default). Counted
  //! from when next() starts waiting for the batch, once every worker process has attached (their start is
  //! start_timeout_ms'). Past it, next() throws RuntimeError naming the batch and the worker on it, and the
  //! session stops: worker processes are SIGKILLed and reaped at once; a worker thread stuck in the transform
  //! cannot be killed, so it is left running detached (it owns what it touches: the ring's mapping, the
  //! dataset handle, the transform) and exits when its call returns; stopping the loader waits for its
  //! threads at most this long. Also bounds the constructor's run of the transform on the first rows (the
  //! same detached thread when it never returns). With num_workers(0) batches run in the trainer's own
  //! thread and only the constructor's run is bounded. ValueError when negative.
  TD_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

//! the trainer's view of the current (or last) epoch
struct LoaderStats {
  int64_t epoch = -1;
  int64_t batches = 0;               //!< yielded so far in this epoch
  int64_t samples = 0;
  double wait_s = 0;                 //!< total time next() waited for a batch that was not ready
  std::vector<double> wait_us;       //!< per yielded batch: how long next() waited for it
  std::vector<double> latency_us;    //!< per yielded batch: from dispatch to ready (gather + transform + queue)
  int64_t reassigned = 0;            //!< batches taken over from a lost worker process (whole life)
  int64_t lost_workers = 0;          //!< worker processes lost (whole life)
  int64_t in_flight_max = 0;         //!< batches dispatched ahead at most: max(1, workers) x prefetch
  int64_t sleeps = 0;                //!< times next() slept (futex) waiting for its batch, in this epoch
  //! of those sleeps, the ones a worker woke while the batch was still not ready: a worker wakes the sleeping
  //! trainer only when it finishes the batch the trainer waits for, so these stay near 0 (a wake costs the
  //! trainer two context switches and a worker's core)
  int64_t needless_wakes = 0;
};

class DataLoader {
 public:
  //! validates everything before anything starts (ValueError / TypeError / KeyError): batch_size < 1,
  //! an empty dataset or one of 0 batch dims, a sampler that does not fit, non-tensor leaves, an unknown
  //! transform name, worker processes without a reachable source, ... Runs the transform once on rows
  //! [0, batch_size) in this thread to learn the layout of the ring's slots.
  DataLoader(TensorDict dataset, LoaderOptions options = {});
  //! stops the workers (a transform call in progress in a thread finishes first; with a timeout, one that
  //! does not finish within it is left running detached), reaps every worker process (SIGKILL after a grace
  //! period) and unlinks the ring. Batches still alive stay valid.
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  //! batches per epoch (torch's len(loader))
  int64_t size() const;
  //! the epoch the next begin() (or next() without an epoch in progress) runs; starts at 0 and counts up
  int64_t epoch() const;
  //! sets the number of the next epoch (torch's sampler.set_epoch)
  void set_epoch(int64_t epoch);
  //! the next batch of the current epoch, starting the next epoch when none is in progress; nullopt at
  //! its end. A worker's error (a transform that threw) is rethrown here with its type, the message naming
  //! the batch and epoch; the epoch is then over.
  std::optional<TensorDict> next();
  //! abandons the epoch in progress (in-flight batches are dropped; held batches stay valid)
  void reset();
  //! stops and reaps every worker now (as the destructor); the loader starts new ones when used again
  void shutdown();
  LoaderStats stats() const;
  //! pids of the live worker processes (tests, diagnostics)
  std::vector<pid_t> worker_pids() const;
  //! the shared-memory name prefix of the loader's rings ("<shm prefix>loader_")
  static std::string shm_prefix();

  //! range-for: `for (TensorDict batch : loader)` runs one epoch (begin() starts it, abandoning one in
  //! progress)
  using iterator = NextIterator<DataLoader>;
  iterator begin();
  iterator end() { return iterator(); }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

namespace loader_detail {
//! the worker side of a loader worker process (behind run_worker_if_requested): false at once when this
//! process is not one; otherwise serves batches and exits the process (never returns)
bool run_loader_worker_process(int argc, char** argv);
//! the environment variable that makes a process a loader worker: "<ring segment name>:<worker index>"
constexpr const char* kLoaderWorkerEnv = "TENSORDICT_LOADER_WORKER";
}  // namespace loader_detail

}  // namespace tensordict
