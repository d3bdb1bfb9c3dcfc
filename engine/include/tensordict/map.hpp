#pragma once
//! td.map / td.map_iter / td.map_lazy: options, the result iterator, and the backend interface the upper
//! layer (actors/, registered by api/'s Engine) implements. engine/ owns the semantics that do not need actors
//! (validation, splitting into chunks, taking a chunk view, restacking, writing into `out`) so that every
//! backend behaves alike; the backend only schedules chunks on workers.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tensordict/errors.hpp"
#include "tensordict/lazy_stack.hpp"  // td.map_lazy's result
#include "tensordict/options.hpp"
#include "tensordict/next_iterator.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! `td.map(fn, MapOptions().dim(0).num_workers(2).chunksize(0).out(buf).progress(true))`
struct MapOptions {
  //! batch dim to split along (negative counts from the end of the batch dims)
  TD_ARG(int64_t, dim) = 0;
  //! worker actors; default: the engine config's map.num_workers
  TD_ARG(std::optional<int64_t>, num_workers) = std::nullopt;
  //! elements per chunk; 0 = one chunk per element with `dim` removed (upstream unbind). Excludes num_chunks
  TD_ARG(std::optional<int64_t>, chunksize) = std::nullopt;
  //! number of chunks (upstream td.chunk(min(k, n), dim)); when neither is set: num_workers chunks
  TD_ARG(std::optional<int64_t>, num_chunks) = std::nullopt;
  //! map only: preallocated output with the batch size of the source. memmap/shared: workers write their
  //! chunk in place and map returns an undefined TensorDict (upstream's None); plain: the caller writes
  //! the results in and map returns out
  TD_ARG(std::optional<TensorDict>, out) = std::nullopt;
  //! progress bar on stderr when it is a TTY, else periodic log lines; default: config map.progress
  TD_ARG(std::optional<bool>, progress) = std::nullopt;
  //! map_iter only: a random order of elements (one global randperm, seeded by `seed`); results are
  //! yielded as they complete; every element exactly once
  TD_ARG(bool, shuffle) = false;
  //! base seed: worker i gets a generator seeded seed + i (see current_map_worker()); default: drawn from
  //! torch's default CPU generator, as upstream (so at::manual_seed makes it reproducible)
  TD_ARG(std::optional<int64_t>, seed) = std::nullopt;
  //! torch intra-op threads while a worker runs fn; default: config map.torch_threads_per_worker
  TD_ARG(std::optional<int64_t>, worker_threads) = std::nullopt;
  //! how many of the workers are worker PROCESSES (0 = in-process actors only, the default). Needs a
  //! named fn (`td.map("name", ...)`, register_map_fn), a memmap (saved to a directory) or shared source
  //! and a memmap/shared `out`. When num_workers is not given it defaults to worker_processes (all
  //! workers are processes); otherwise num_workers - worker_processes workers stay in-process.
  TD_ARG(int64_t, worker_processes) = 0;
  //! the program a worker process runs (its main must call tensordict::run_worker_if_requested first);
  //! default: /proc/self/exe (this program)
  TD_ARG(std::string, worker_executable) = "";
};

//! registers `fn` under `name` for td.map("name", ...) (replaces an existing entry). Worker processes
//! look the name up in their own registry, so the worker executable must register it too (usually the
//! same program: register before run_worker_if_requested, or with TD_REGISTER_MAP_FN). Thread-safe.
void register_map_fn(const std::string& name, MapFn fn);
//! the fn registered under `name`; an empty MapFn when there is none
MapFn find_map_fn(const std::string& name);
//! the registered names, sorted
std::vector<std::string> registered_map_fns();

#define TD_MAP_FN_CONCAT2(a, b) a##b
#define TD_MAP_FN_CONCAT(a, b) TD_MAP_FN_CONCAT2(a, b)
//! static registration at namespace scope: `TD_REGISTER_MAP_FN("normalize", my_normalize);`. In a static
//! library the object file must be linked in (put it in the executable's sources, or reference it).
#define TD_REGISTER_MAP_FN(name, fn)                                                              \
  [[maybe_unused]] static const bool TD_MAP_FN_CONCAT(td_map_fn_registered_, __COUNTER__) = \
      (::tensordict::register_map_fn((name), (fn)), true)

//! what a worker knows while it runs fn (thread-local; nullptr outside a map worker)
struct MapWorkerContext {
  int64_t worker_index = 0;
  int64_t seed = 0;          //!< base seed + worker_index
  int64_t chunk = -1;        //!< the chunk being processed
  //! a CPU generator seeded with `seed`, private to this worker (the DataLoader: to this batch). Made at the
  //! first call: seeding one costs about 1.5 us, which only fns that draw random numbers pay (a loader batch
  //! of a few us paid it every time)
  at::Generator& generator() const;

 private:
  mutable at::Generator generator_;
};
//! libtorch has one process-global default generator, so per-worker seeding means a per-worker
//! generator: `at::rand({3}, tensordict::current_map_worker()->generator())`.
const MapWorkerContext* current_map_worker();

//! one unit of work: a slice [start, start+length) along dim, one element (dim removed), or a gathered
//! list of elements (shuffle)
struct MapChunk {
  int64_t start = 0;
  int64_t length = 0;
  bool drop_dim = false;              //!< chunksize 0: integer index `start`, dim removed
  std::vector<int64_t> indices;       //!< shuffle: gathered elements (a copy, not a view)
};

//! how a chunk's result is written into a memmap / shared `out` (config map.out_write)
enum class MapOutWrite {
  Copy,      //!< stores through the mapping (a fresh page faults on first touch, ~10 us per 4 KiB here)
  Pwrite,    //!< pwrite(2) into the file's page cache (a memmap leaf); other mappings as Populate
  Populate,  //!< MADV_POPULATE_WRITE over the chunk's pages, then stores
};

//! a validated map request: everything a backend needs to schedule it
struct MapPlan {
  int64_t dim = 0;                     //!< normalised to [0, batch_dims)
  int64_t num_workers = 1;             //!< min(requested, number of chunks), at least 1
  bool stack = false;                  //!< chunksize 0: results are stacked (dim removed per chunk)
  bool shuffle = false;
  bool in_place_out = false;           //!< out is memmap/shared: workers write into it
  std::optional<TensorDict> out;
  std::vector<MapChunk> chunks;
  int64_t seed = 0;
  int64_t worker_threads = 1;
  bool progress = false;
  int64_t num_processes = 0;           //!< how many of the num_workers are worker processes (the last ones)
  MapOutWrite out_write = MapOutWrite::Pwrite;  //!< in_place_out: how chunks are written (set by the backend)
};

namespace map_detail {
//! validation + splitting; throws ValueError / IndexError / BatchSizeError before any worker starts.
//! `default_workers` etc. come from the backend's config. for_iter: map_iter rules (no out, shuffle ok).
MapPlan plan(const TensorDict& src, const MapOptions& options, bool for_iter, int64_t default_workers,
             int64_t default_worker_threads, bool default_progress);
//! the chunk of td (a view for slices, a gathered copy for shuffle index lists)
TensorDict take_chunk(const TensorDict& td, const MapPlan& plan, const MapChunk& chunk);
//! out[chunk].update_(result) (the result must match the chunk's shape); errors name the chunk
void write_chunk(const TensorDict& out, const MapPlan& plan, size_t chunk_index, const TensorDict& result);
//! cat / stack of the defined results in chunk order (undefined if none); errors name the first chunk
//! that does not fit with chunk 0
TensorDict gather(const std::vector<TensorDict>& results, const MapPlan& plan);
//! map's cat of the chunk results (chunks of a range, no out, not stacked), made as the results come: the first
//! result sets the layout and the whole result is allocated; each result is then copied into its rows by the
//! worker that made it, while it is in that core's cache, and nothing is left to concatenate at the end. A result
//! that does not fit the layout (another dtype, row count, key set or order, a non-tensor leaf, autograd) is kept,
//! and the end concatenates it with the placed rows as `gather` would (its errors included). place() of distinct
//! chunks may run on any threads at once, after start() returned true on one.
class ChunkGather {
 public:
  explicit ChunkGather(const MapPlan& plan);
  ~ChunkGather();
  ChunkGather(const ChunkGather&) = delete;
  ChunkGather& operator=(const ChunkGather&) = delete;
  //! the first result (of chunk i): allocates the whole result when the plan and the result allow, then places r;
  //! true when r was placed (false: nothing allocated, everything is gathered at the end)
  bool start(size_t i, const TensorDict& r);
  //! start() has allocated the result (acquire: place() may run)
  bool ready() const;
  //! copies result i into its rows; false when it does not fit (its rows are then never read)
  bool place(size_t i, const TensorDict& r) const;
  //! the result: placed chunks from their rows, the others from results[i] (undefined ones skipped)
  TensorDict finish(const std::vector<TensorDict>& results, const std::vector<char>& placed) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};
//! runs fn on one chunk inside a worker: sets the thread-local context and torch threads
TensorDict run_chunk(const TensorDict& src, const MapFn& fn, const MapPlan& plan, size_t chunk_index,
                     MapWorkerContext& ctx);
//! fn(input) with `ctx` as current_map_worker() for the call (the DataLoader's per-batch transforms)
TensorDict call_with_context(const MapFn& fn, const TensorDict& input, const MapWorkerContext& ctx);
//! an exception from a worker, as it crosses the actor boundary: its ErrorCode and its bare message
//! (Error::message(), without the "Name: " prefix; never parsed back out of what())
struct CarriedError {
  ErrorCode code = ErrorCode::Runtime;
  std::string message;
  int64_t chunk = -1;
};
//! classifies the exception currently being handled (call inside catch): our errors keep code and
//! message; a c10::Error goes through the engine's torch translation (IndexError / ValueError / TypeError /
//! RuntimeError, message without backtrace); any other std::exception is Runtime with its what()
CarriedError carry_current_exception(int64_t chunk);
//! throws the tensordict error of that code with that message (throw_error: what() equals the original's)
[[noreturn]] void rethrow(const CarriedError& e);
}  // namespace map_detail

//! the producer side of a MapIter (implemented by a backend)
class MapIterSource {
 public:
  virtual ~MapIterSource() = default;
  //! the next result (nullopt when exhausted); rethrows a worker's error
  virtual std::optional<TensorDict> next() = 0;
  //! stops the workers; idempotent; must not block on fn calls in progress
  virtual void stop() = 0;
};

//! input-iterator-like result stream of td.map_iter. Move-only; destroying it (or stop()) early stops
//! the workers without waiting for the remaining chunks.
class MapIter {
 public:
  MapIter() = default;
  explicit MapIter(std::unique_ptr<MapIterSource> source) : source_(std::move(source)) {}
  MapIter(MapIter&&) noexcept = default;
  MapIter& operator=(MapIter&& other) noexcept {
    if (this != &other) {
      stop();
      source_ = std::move(other.source_);
    }
    return *this;
  }
  MapIter(const MapIter&) = delete;
  MapIter& operator=(const MapIter&) = delete;
  ~MapIter() { stop(); }

  //! the next result, nullopt at the end; a worker's error is rethrown here (then the stream is over)
  std::optional<TensorDict> next();
  void stop() noexcept;

  //! range-for support: `for (TensorDict r : td.map_iter(fn, opts))`
  using iterator = NextIterator<MapIter>;
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  std::unique_ptr<MapIterSource> source_;
};

//! what td.map / td.map_iter forward to
class MapBackend {
 public:
  virtual ~MapBackend() = default;
  virtual TensorDict map(const TensorDict& src, const MapFn& fn, const MapOptions& options) = 0;
  virtual MapIter map_iter(const TensorDict& src, const MapFn& fn, const MapOptions& options) = 0;
  //! td.map("name", options): fn is the registered function (already looked up). Backends that can start
  //! worker processes override this; the default runs in-process only.
  virtual TensorDict map_named(const TensorDict& src, const std::string& name, const MapFn& fn,
                               const MapOptions& options) {
    if (options.worker_processes() > 0) {
      throw ValueError("map: this map backend cannot start worker processes (worker_processes " +
                       std::to_string(options.worker_processes()) + " for '" + name + "')");
    }
    return map(src, fn, options);
  }
};

//! registers the backend td.map uses (nullptr unregisters). An explicit tensordict::Engine registers itself.
void set_map_backend(std::shared_ptr<MapBackend> backend);
//! the backend td.map uses: the registered one, else the lazy default (an Engine started on first use
//! when tensordict::tensordict is linked); nullptr when there is none
std::shared_ptr<MapBackend> get_map_backend();
//! the upper layer's lazy default (called when no backend is registered)
void set_default_map_backend_factory(std::shared_ptr<MapBackend> (*factory)());

}  // namespace tensordict
