#include "tensordict/actors/runtime.hpp"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallopt (malloc.keep_mb)
#endif

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include <ATen/Parallel.h>

#include <caf/io/all.hpp>

#include "tensordict/actors/hot_actor.hpp"
#include "tensordict/actors/map_actors.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/progress.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/memory.hpp"
#include "tensordict/shared_storage.hpp"

namespace tensordict {
namespace actors {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<map_error>("tensordict::map_error");
  cfg.add_message_type<map_job_desc>("tensordict::map_job_desc");
  cfg.add_message_type<store_request>("tensordict::store_request");
  cfg.add_message_type<store_response>("tensordict::store_response");
}

namespace {

//! the echo actor: a HotActor like the store actors, so Engine::ping measures what a store request pays
class EchoActor final : public HotActor {
 public:
  using HotActor::HotActor;
  void act() override {
    bool running = true;
    receive_while(running)(
        [](ping_atom, const int_reply_ptr& box, int64_t x) { box->set_value(x); },
        [](ping_atom, int64_t x) { return x; },
        [&](caf::exit_msg& m) {
          fail_state(m.reason);
          running = false;
        });
  }
};

//! one running map job as seen by the caller: the events inbox and the coordinator handle
class ActorMapIter final : public MapIterSource {
 public:
  ActorMapIter(std::shared_ptr<Runtime> rt, std::shared_ptr<LocalMapJob> job)
      : rt_(std::move(rt)), job_(std::move(job)) {
    coordinator_ = spawn_map_coordinator(rt_->system(), job_);
  }
  ~ActorMapIter() override { stop(); }

  //! the next event (results in arrival order), after which End/Error are final
  MapEvent next_event() {
    if (finished_) return MapEvent{};
    auto ev = job_->events->pop();
    if (!ev || ev->kind != MapEvent::Kind::Result) {
      finished_ = true;
      stop();
      if (!ev) return MapEvent{};
    }
    return std::move(*ev);
  }

  std::optional<TensorDict> next() override {
    const bool ordered = !job_->plan.shuffle;
    for (;;) {
      if (ordered) {
        auto it = pending_.find(next_chunk_);
        if (it != pending_.end()) {
          TensorDict r = std::move(it->second);
          pending_.erase(it);
          ++next_chunk_;
          return r;
        }
      }
      if (finished_) {
        if (!pending_.empty()) {  // cannot happen (End comes after every result); keep the order anyway
          auto it = pending_.begin();
          TensorDict r = std::move(it->second);
          pending_.erase(it);
          return r;
        }
        return std::nullopt;
      }
      MapEvent ev = next_event();
      switch (ev.kind) {
        case MapEvent::Kind::Result:
          if (!ordered) return std::move(ev.result);
          pending_.emplace(ev.chunk, std::move(ev.result));
          break;
        case MapEvent::Kind::Error:
          pending_.clear();
          map_detail::rethrow(ev.error);
        case MapEvent::Kind::End:
          break;
      }
    }
  }

  void stop() override {
    job_->cancelled = true;
    if (coordinator_) {
      caf::anon_send_exit(coordinator_, caf::exit_reason::user_shutdown);
      coordinator_ = nullptr;
    }
  }

  const LocalMapJob& job() const { return *job_; }
  //! the coordinator (null after stop)
  const caf::actor& coordinator() const { return coordinator_; }

 private:
  std::shared_ptr<Runtime> rt_;  // first: outlives the coordinator handle
  std::shared_ptr<LocalMapJob> job_;
  caf::actor coordinator_;
  bool finished_ = false;
  int64_t next_chunk_ = 0;
  std::map<int64_t, TensorDict> pending_;
};

}  // namespace

std::shared_ptr<Runtime> Runtime::start(const Config& config) {
  return std::shared_ptr<Runtime>(new Runtime(config));
}

namespace {
//! config malloc.keep_mb: glibc keeps up to keep_mb of free memory at the top of a heap for reuse instead of
//! handing it back to the kernel (M_TRIM_THRESHOLD), and serves blocks below 32 MiB from its heaps
//! (M_MMAP_THRESHOLD at the ceiling its own dynamic threshold reaches: setting the trim threshold freezes
//! that one where it stands). Its defaults trim a heap whose free top exceeds twice the largest mmapped block
//! freed so far: chunk results made on a map helper and freed by the caller, then a fresh cat output, went
//! back to the kernel and were faulted in again, page by page, on every call (a cheap map over 10 chunks of
//! 3.2 MB: 200-1,200 faults, 1-17 ms a call, against 0.5 faults and 0.25 ms with this)
void keep_freed_memory(int64_t keep_mb) {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // a sanitizer's own allocator
  if (keep_mb <= 0) return;
  // keep_mb <= 1024 (Config::validate): the byte count fits mallopt's int
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, static_cast<int>(keep_mb << 20)) != 1) {
    logger()->warn("malloc.keep_mb: glibc refused a mallopt setting; malloc keeps its defaults in part");
  }
#else
  (void)keep_mb;
#endif
}
}  // namespace

Runtime::Runtime(const Config& config) : config_(config) {
  config_.validate();
  set_log_level(config_.log_level);
  keep_freed_memory(config_.malloc_keep_mb);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their allocators must see every block
  set_huge_page_tensors(static_cast<size_t>(config_.malloc_huge_page_min_kb) << 10);
#endif
  if (config_.shm_prefix != Config::defaults().shm_prefix) tensordict::set_shm_prefix(config_.shm_prefix);
  cfg_ = std::make_unique<caf::actor_system_config>();
  // DEPENDENCIES §5.1: CAF's defaults (work stealing, one thread per core and more) cost ~4x per request
  cfg_->set("scheduler.policy", config_.scheduler_policy == "stealing" ? caf::atom("stealing") : caf::atom("sharing"));
  cfg_->set("scheduler.max-threads", static_cast<size_t>(config_.scheduler_threads));
  if (config_.scheduler_policy == "stealing") {
    // spin (aggressive polling), then sleep on the worker's condition variable (woken by new work); CAF's
    // moderate stage (50 us sleeps without wake-up for 25 ms) is what made its defaults cost ~100 us
    cfg_->set("work-stealing.aggressive-poll-attempts", static_cast<size_t>(config_.scheduler_spin_polls));
    cfg_->set("work-stealing.aggressive-steal-interval", size_t{10});
    cfg_->set("work-stealing.moderate-poll-attempts", size_t{0});
    cfg_->set("work-stealing.relaxed-steal-interval", size_t{1});
    cfg_->set("work-stealing.relaxed-sleep-duration",
              caf::timespan{std::chrono::microseconds(config_.scheduler_idle_sleep_us)});
  }
  // the middleman: worker processes of td.map connect back on 127.0.0.1 (nothing listens until a map
  // with worker_processes publishes its coordinator); its I/O runs on the multiplexer thread
  cfg_->load<caf::io::middleman>();
  cfg_->set("middleman.workers", size_t{0});
  register_message_types(*cfg_);
  system_ = std::make_unique<caf::actor_system>(*cfg_);
  echo_ = system_->spawn<EchoActor>(std::chrono::microseconds(config_.actor_spin_us));
  logger()->debug("engine started: {} scheduler threads, policy {}", config_.scheduler_threads,
                  config_.scheduler_policy);
}

Runtime::~Runtime() {
  if (echo_) {
    caf::anon_send_exit(echo_, caf::exit_reason::user_shutdown);
    echo_ = nullptr;
  }
  // ~actor_system waits for every actor: running map workers finish their current fn call first
  system_.reset();
  cfg_.reset();
  logger()->debug("engine stopped");
}

int64_t Runtime::ping(int64_t x) {
  auto box = std::make_shared<Reply<int64_t>>();
  caf::anon_send(echo_, ping_atom::value, box, x);
  if (!box->wait(std::chrono::steady_clock::now() + request_timeout(), spin())) {
    throw BackendError("engine: no reply from the echo actor within " + std::to_string(config_.request_timeout_ms) +
                       " ms (request_timeout_ms)");
  }
  return box->get();
}

namespace {
MapOutWrite out_write_mode(const Config& c) {
  if (c.map_out_write == "copy") return MapOutWrite::Copy;
  if (c.map_out_write == "populate") return MapOutWrite::Populate;
  return MapOutWrite::Pwrite;
}

std::shared_ptr<LocalMapJob> make_job(const Runtime& rt, const TensorDict& src, const MapFn& fn,
                                      const MapOptions& options, bool for_iter) {
  const Config& c = rt.config();
  auto job = std::make_shared<LocalMapJob>();
  job->plan = map_detail::plan(src, options, for_iter, c.map_num_workers, c.map_torch_threads_per_worker,
                               c.map_progress);  // validation: throws before any actor exists
  job->plan.out_write = out_write_mode(c);
  job->src = src;
  job->fn = fn;
  job->progress_interval = std::chrono::milliseconds(c.map_progress_interval_ms);
  // no spin: the caller of map waits while the workers use the cores (facade_spin_us is for requests)
  job->events = std::make_shared<Inbox<MapEvent>>(std::chrono::microseconds(0));
  return job;
}
}  // namespace

namespace {
//! the caller's side of map: results in, restacked or written into a plain out; rethrows the first error
TensorDict collect(ActorMapIter& it, const MapPlan& plan) {
  std::vector<TensorDict> results(plan.chunks.size(), TensorDict::undefined());
  const bool plain_out = plan.out && !plan.in_place_out;
  for (;;) {
    MapEvent ev = it.next_event();
    if (ev.kind == MapEvent::Kind::End) break;
    if (ev.kind == MapEvent::Kind::Error) map_detail::rethrow(ev.error);
    const auto i = static_cast<size_t>(ev.chunk);
    if (plain_out) {
      try {
        map_detail::write_chunk(*plan.out, plan, i, ev.result);
      } catch (...) {
        it.stop();
        throw;
      }
    } else if (!plan.in_place_out) {
      results[i] = std::move(ev.result);
    }
  }
  if (plan.in_place_out) return TensorDict::undefined();
  if (plain_out) return *plan.out;
  return map_detail::gather(results, plan);
}

std::string random_token() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 32; ++i) t += hex[rd() & 15];
  return t;
}
}  // namespace

namespace {
//! a chunk 0 cheaper than this (or than what helpers cost lately) is confirmed by a warm chunk 1 before helpers
//! start, and helpers are not tried again for a rest of the call under twice this (Runtime::map)
constexpr double kColdChunkNs = 50'000;

int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

//! rows of a chunk along the mapped dim (an element of chunksize 0 counts as one row)
int64_t chunk_rows(const MapChunk& c) {
  if (c.drop_dim) return 1;
  return c.indices.empty() ? c.length : static_cast<int64_t>(c.indices.size());
}

//! the caller's torch thread count comes back as it was (run_chunk sets it for fn)
struct TorchThreadsGuard {
  int saved = at::get_num_threads();
  ~TorchThreadsGuard() {
    if (at::get_num_threads() != saved) at::set_num_threads(saved);
  }
};

//! how many workers (the caller included) finish the remaining chunks soonest: w workers take
//! ceil(chunks / w) chunk-times each, plus what w - 1 helpers cost: their spawn on the caller's thread, and
//! the time the last calls with helpers lost against their ideal split (a late start, slower chunks on a
//! helper's thread). Everything is measured: the chunk time on chunk 0, the helper costs on earlier calls.
//! A second worker must save at least a tenth of the time.
int64_t workers_for(int64_t max_workers, int64_t chunks_left, double rows_left, double ns_per_row,
                    double chunk_ns, double spawn_ns, double start_ns) {
  const double serial = rows_left * ns_per_row;
  int64_t best = 1;
  double best_t = serial;
  for (int64_t w = 2; w <= std::min(max_workers, chunks_left + 1); ++w) {
    // the caller starts at once, helpers after start_ns: the caller's share grows by what they miss
    const double t = static_cast<double>((chunks_left + w - 1) / w) * chunk_ns + static_cast<double>(w - 1) * spawn_ns +
                     start_ns / static_cast<double>(w);
    if (t < best_t * 0.9) {
      best = w;
      best_t = t;
    }
  }
  return best;
}
}  // namespace

TensorDict Runtime::map(const TensorDict& src, const MapFn& fn, const MapOptions& options) {
  const Config& c = config_;
  auto job = std::make_shared<SharedMapJob>();
  job->plan = map_detail::plan(src, options, false, c.map_num_workers, c.map_torch_threads_per_worker,
                               c.map_progress);  // validation: throws before anything runs
  if (job->plan.num_processes > 0) {
    throw ValueError("map: worker processes run named functions only: register fn with "
                     "tensordict::register_map_fn(\"name\", fn) and call td.map(\"name\", options)");
  }
  job->plan.out_write = out_write_mode(c);
  job->src = src;
  job->fn = fn;
  job->events = std::make_shared<Inbox<MapEvent>>(std::chrono::microseconds(0));
  const MapPlan& plan = job->plan;
  const auto total = static_cast<int64_t>(plan.chunks.size());
  const bool plain_out = plan.out && !plan.in_place_out;
  std::vector<TensorDict> results(plan.chunks.size(), TensorDict::undefined());
  // results not written into an out: copied into the call's result as they come, by the worker that made them
  // (chunksize 0 stacks its results: gathered at the end)
  if (!plan.out && !plan.stack) job->gather = std::make_shared<map_detail::ChunkGather>(plan);
  std::vector<char> placed(plan.chunks.size(), 0);
  bool gather_started = false;
  Progress progress(plan.progress, total, std::chrono::milliseconds(c.map_progress_interval_ms), "map");
  TorchThreadsGuard threads_guard;
  MapWorkerContext ctx;  // the caller is worker 0
  ctx.worker_index = 0;
  ctx.seed = plan.seed;
  int64_t done = 0;
  int64_t helpers = 0, helpers_ended = 0;
  auto consume = [&](int64_t chunk, TensorDict r, bool was_placed) {
    const auto i = static_cast<size_t>(chunk);
    if (plain_out) {
      map_detail::write_chunk(*plan.out, plan, i, r);
    } else if (was_placed) {
      placed[i] = 1;
    } else if (!plan.in_place_out) {
      // the first result sets the layout of the call's result; later ones a helper could not place (it ran
      // before the layout was set, or does not fit it) are tried here once more
      const bool put = job->gather && (gather_started ? job->gather->place(i, r) : job->gather->start(i, r));
      gather_started = true;
      if (put) {
        placed[i] = 1;
      } else {
        results[i] = std::move(r);
      }
    }
    progress.update(++done);
  };
  // on any failure: nobody claims more chunks, the helpers finish the chunk in hand (fn must not run after
  // map returns) and the first error is what the caller sees, with its type and message
  auto fail = [&](const map_detail::CarriedError& err) {
    job->cancelled = true;
    while (helpers_ended < helpers) {
      auto ev = job->events->pop();
      if (ev && ev->kind == MapEvent::Kind::End) ++helpers_ended;
    }
    progress.finish(false);
    map_detail::rethrow(err);
  };
  auto handle = [&](MapEvent& ev) {
    switch (ev.kind) {
      case MapEvent::Kind::Result: consume(ev.chunk, std::move(ev.result), ev.placed); return;
      case MapEvent::Kind::End: ++helpers_ended; return;
      case MapEvent::Kind::Error: fail(ev.error);
    }
  };
  auto run_own = [&](int64_t chunk) {
    try {
      consume(chunk, map_detail::run_chunk(src, fn, plan, static_cast<size_t>(chunk), ctx), false);
    } catch (...) {
      fail(map_detail::carry_current_exception(chunk));
    }
  };
  if (total > 0) {
    // helpers run on the scheduler's threads, never more workers than cores
    // read once: glibc reads /sys on every hardware_concurrency() call (~5 us, a tenth of a cheap map call)
    static const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
    const int64_t max_workers = std::min({plan.num_workers, cores, c.scheduler_threads + 1});
    double rows_left = 0;
    for (int64_t i = 1; i < total; ++i) rows_left += static_cast<double>(chunk_rows(plan.chunks[static_cast<size_t>(i)]));
    const double rows0 = static_cast<double>(std::max<int64_t>(chunk_rows(plan.chunks[0]), 1));
    auto smooth = [](std::atomic<int64_t>& v, int64_t sample) { v.store((3 * v.load() + sample) / 4); };
    auto spawn_helpers = [&](int64_t w) {
      const int64_t t_spawn = now_ns();
      for (int64_t i = 1; i < w; ++i) {
        spawn_map_helper(system(), job, i);
        ++helpers;
      }
      const int64_t spawned = now_ns();
      // a spawn sample counts at most 4x the running value: the spawn is the caller's own work (10-40 us),
      // and one call preempted while it spawned (1.2 ms once, in bench_map) kept every later call inline
      const int64_t old = helper_spawn_ns_.load();
      smooth(helper_spawn_ns_, std::min((spawned - t_spawn) / (w - 1), 4 * std::max<int64_t>(old, 1000)));
      return spawned;
    };
    // chunk 0 is the caller's, claimed first. When the last call's fn cost as much per row as helpers need to
    // pay off for this one, they start now, before chunk 0 (which would otherwise run alone while it is timed:
    // with 2 workers and n chunks the caller's lone chunk caps the speed-up at 2n / (n + 1), 1.82x for 20)
    const int64_t first = job->claim();
    int64_t early_workers = 1, early_spawned = 0;
    const int64_t t_call = now_ns();
    // (not on a cheap prior: a chunk that costs under kColdChunkNs is confirmed warm before helpers start)
    if (const double prior = static_cast<double>(last_ps_per_row_.load()) / 1000.0;
        prior > 0 && prior * rows0 >= kColdChunkNs) {
      early_workers = workers_for(max_workers, total, rows_left + rows0, prior, prior * rows0,
                                  static_cast<double>(helper_spawn_ns_.load()), static_cast<double>(helper_start_ns_.load()));
      if (early_workers > 1) early_spawned = spawn_helpers(early_workers);
    }
    // chunk 0 on this thread, timed: its cost per row says whether helpers pay off for the rest
    const int64_t t0 = now_ns();
    run_own(first);
    double chunk_ns = static_cast<double>(std::max<int64_t>(now_ns() - t0, 1));
    double ns_per_row = chunk_ns / rows0;
    int64_t chunks_left = total - 1;
    // chunk 0 runs on a cold cache: the previous call's output has evicted fn's code and data. An identity fn's
    // chunk 0 of 1,000 rows took 7-15 us where the next chunks took 1.2 us (a 2 MiB L2, after a 3.2 MB cat), and
    // helpers spawned on that figure made the call 20% slower than the loop. A chunk 0 that costs no more than
    // helpers do is confirmed by the next chunk, warm, before helpers are spawned (a heavy fn decides at once)
    if (early_workers == 1 && chunks_left > 0 &&
        chunk_ns < std::max(kColdChunkNs, static_cast<double>(helper_spawn_ns_.load() + helper_start_ns_.load()))) {
      if (const int64_t next = job->claim(); next >= 0) {
        const double rows1 = static_cast<double>(std::max<int64_t>(chunk_rows(plan.chunks[static_cast<size_t>(next)]), 1));
        const int64_t t1 = now_ns();
        run_own(next);
        const double next_ns = static_cast<double>(std::max<int64_t>(now_ns() - t1, 1));
        if (next_ns / rows1 < ns_per_row) {
          ns_per_row = next_ns / rows1;
          chunk_ns = next_ns;
        }
        rows_left -= rows1;
        --chunks_left;
      }
    }
    last_ps_per_row_.store(static_cast<int64_t>(ns_per_row * 1000.0));
    const int64_t w = workers_for(max_workers, chunks_left, rows_left, ns_per_row, chunk_ns,
                                  static_cast<double>(helper_spawn_ns_.load()), static_cast<double>(helper_start_ns_.load()));
    if (w == 1 && rows_left * ns_per_row >= 2 * kColdChunkNs &&
        workers_for(max_workers, chunks_left, rows_left, ns_per_row, chunk_ns, 0.0, 0.0) > 1) {
      // only what helpers cost lately keeps this call inline: let both costs fade, so that helpers are tried
      // again once the machine may have changed (they are only measured when helpers run). Not for a rest
      // under 2 x kColdChunkNs: its best saving is under one thread wake-up on a VM (10-30 us)
      helper_start_ns_.store(helper_start_ns_.load() * 7 / 8);
      helper_spawn_ns_.store(helper_spawn_ns_.load() * 7 / 8);
    }
    // started early on the last call's cost, but this fn is too cheap to share even with helpers that cost
    // nothing more (their spawn is paid, they are running): they finish the chunk in hand and claim no more;
    // the caller runs the rest and collects what they did. Measured on a cheap fn (x + 1, 10 chunks of 1,000
    // rows): retiring whenever a fresh call would stay inline made such calls 203 us against 169 us with the
    // helper kept and 190 us for the plain loop
    const bool retire = early_workers > 1 && w == 1 &&
                        workers_for(max_workers, chunks_left, rows_left, ns_per_row, chunk_ns, 0.0, 0.0) == 1;
    if (retire) job->retired = true;
    if (w > 1 || early_workers > 1) {
      const bool early = early_workers > 1;
      const int64_t workers = early ? early_workers : w;
      const int64_t spawned = early ? early_spawned : spawn_helpers(w);
      // the caller claims chunks too; between its own chunks it takes what the helpers have done
      for (int64_t chunk = job->claim(); chunk >= 0; chunk = job->claim()) {
        run_own(chunk);
        while (auto ev = job->events->try_pop()) handle(*ev);
      }
      while (done < total) {
        auto ev = job->events->pop();
        handle(*ev);
      }
      // what the helpers really cost: the wall time beyond the ideal split of the chunks (a helper that starts
      // late, chunks that run slower on a helper's thread: cold memory, a core shared with other work), as
      // the start-up term of the next decision (it counts 1/w there)
      // (early: from the call's start, over every chunk; nothing to learn from retired helpers)
      if (!retire) {
        const int64_t chunks = early ? total : chunks_left;
        const double ideal = static_cast<double>((chunks + workers - 1) / workers) * chunk_ns;
        const double excess = static_cast<double>(now_ns() - (early ? t_call : spawned)) - ideal;
        smooth(helper_start_ns_, static_cast<int64_t>(std::max(0.0, excess) * static_cast<double>(workers)));
      }
    } else {
      for (int64_t chunk = job->claim(); chunk >= 0; chunk = job->claim()) run_own(chunk);
    }
  }
  progress.finish(true);
  if (plan.in_place_out) return TensorDict::undefined();
  if (plain_out) return *plan.out;
  return job->gather ? job->gather->finish(results, placed) : map_detail::gather(results, plan);
}

TensorDict Runtime::map_named(const TensorDict& src, const std::string& name, const MapFn& fn,
                              const MapOptions& options) {
  if (options.worker_processes() <= 0) return map(src, fn, options);
  // ---- validation: everything that can be checked before a process starts
  auto job = make_job(*this, src, fn, options, false);  // plan: also rejects a missing or in-memory out
  const MapPlan& plan = job->plan;
  if (const char* env = std::getenv(kMapWorkerEnv); env && *env) {
    throw RuntimeError(std::string("map: this process was started as a map worker (") + kMapWorkerEnv +
                       " is set) but did not call tensordict::run_worker_if_requested first; it cannot start "
                       "worker processes itself");
  }
  // how the worker processes reopen both: storage specs
  auto spec_of = [](const TensorDict& td, const std::string& what) {
    try {
      return StorageSpec::of(td, what);
    } catch (const ValueError& e) {
      throw ValueError("map: worker processes: " + e.message());
    }
  };
  const StorageSpec src_h = spec_of(src, "the source");
  const StorageSpec out_h = spec_of(*plan.out, "out");
  const std::string exe = options.worker_executable().empty() ? "/proc/self/exe" : options.worker_executable();
  if (::access(exe.c_str(), X_OK) != 0) {
    throw ValueError("map: worker_executable '" + exe + "' is not an executable file");
  }
  job->num_processes = plan.num_processes;
  job->token = random_token();
  job->processes = std::make_shared<ProcessTable>(plan.num_workers - plan.num_processes);
  job->connect_timeout = request_timeout();
  map_job_desc& d = job->remote;
  d.fn_name = name;
  d.src_spec = src_h.dump();
  d.out_spec = out_h.dump();
  d.dim = plan.dim;
  d.seed = plan.seed;
  d.worker_threads = plan.worker_threads;
  d.drop_dim = plan.stack;
  for (const MapChunk& c : plan.chunks) {
    d.starts.push_back(c.start);
    d.lengths.push_back(c.length);
  }
  d.log_level = config_.log_level;
  d.out_write = static_cast<int32_t>(plan.out_write);

  // ---- run: the coordinator listens on 127.0.0.1, then the children start and connect back
  ActorMapIter it(shared_from_this(), job);
  caf::actor coordinator = it.coordinator();
  uint16_t port = 0;
  struct Cleanup {  // on every exit path: stop, unpublish, reap every child (none outlives map)
    ActorMapIter& it;
    caf::actor& coordinator;
    uint16_t& port;
    caf::actor_system& sys;
    std::shared_ptr<ProcessTable> table;
    std::chrono::milliseconds grace;
    ~Cleanup() {
      it.stop();
      if (port != 0) sys.middleman().unpublish(coordinator, port);
      coordinator = nullptr;
      table->reap_all(grace);
    }
  } cleanup{it, coordinator, port, system(), job->processes,
            std::chrono::milliseconds(config_.map_process_exit_grace_ms)};
  if (plan.chunks.empty()) return collect(it, plan);
  auto published = system().middleman().publish(coordinator, 0, "127.0.0.1");
  if (!published) {
    throw BackendError("map: cannot listen on 127.0.0.1 for worker processes: " + system().render(published.error()));
  }
  port = *published;
  for (int64_t p = 0; p < plan.num_processes; ++p) {
    const int64_t index = plan.num_workers - plan.num_processes + p;
    const std::string spec = "127.0.0.1:" + std::to_string(port) + ":" + job->token + ":" + std::to_string(index);
    const pid_t pid = spawn_worker_process(exe, spec);
    job->processes->add(pid);
    logger()->debug("map: started worker process {} (pid {}): {}", index, pid, exe);
  }
  return collect(it, plan);
}

MapIter Runtime::map_iter(const TensorDict& src, const MapFn& fn, const MapOptions& options) {
  auto job = make_job(*this, src, fn, options, true);
  return MapIter(std::make_unique<ActorMapIter>(shared_from_this(), std::move(job)));
}

caf::expected<caf::actor> connect_remote_actor(caf::actor_system& system, const std::string& host, uint16_t port,
                                               std::chrono::milliseconds timeout, int attempts) {
  if (attempts < 1) attempts = 1;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    caf::strong_actor_ptr found;
    caf::error err;
    {
      caf::scoped_actor self{system};
      self->request(system.middleman().actor_handle(), timeout, caf::connect_atom::value, host, port)
          .receive([&](const caf::node_id&, caf::strong_actor_ptr& ptr,
                       const std::set<std::string>&) { found = std::move(ptr); },
                   [&](caf::error& e) { err = std::move(e); });
    }
    if (!err) {
      if (!found) return caf::make_error(caf::sec::no_actor_published_at_port, host, port);
      return caf::actor_cast<caf::actor>(std::move(found));
    }
    if (err != caf::sec::request_timeout) return err;
    logger()->warn("{}:{} did not answer a connect within {} ms (attempt {} of {})", host, port, timeout.count(),
                   attempt + 1, attempts);
  }
  return caf::make_error(caf::sec::request_timeout, host + ":" + std::to_string(port) + " did not answer within " +
                                                        std::to_string(timeout.count()) + " ms (" +
                                                        std::to_string(attempts) + " attempts)");
}

}  // namespace actors
}  // namespace tensordict
