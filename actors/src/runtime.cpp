#include "tensordict/actors/runtime.hpp"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <random>

#include <caf/io/all.hpp>

#include "tensordict/actors/hot_actor.hpp"
#include "tensordict/actors/map_actors.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/logging.hpp"

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

Runtime::Runtime(const Config& config) : config_(config) {
  config_.validate();
  set_log_level(config_.log_level);
  if (config_.shm_prefix != Config::defaults().shm_prefix) TensorDict::set_shm_prefix(config_.shm_prefix);
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
std::shared_ptr<LocalMapJob> make_job(const Runtime& rt, const TensorDict& src, const MapFn& fn,
                                      const MapOptions& options, bool for_iter) {
  const Config& c = rt.config();
  auto job = std::make_shared<LocalMapJob>();
  job->plan = map_detail::plan(src, options, for_iter, c.map_num_workers, c.map_torch_threads_per_worker,
                               c.map_progress);  // validation: throws before any actor exists
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
  std::vector<TensorDict> results(plan.chunks.size(), TensorDict(std::shared_ptr<TensorDictImpl>()));
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
  if (plan.in_place_out) return TensorDict(std::shared_ptr<TensorDictImpl>());
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

TensorDict Runtime::map(const TensorDict& src, const MapFn& fn, const MapOptions& options) {
  auto job = make_job(*this, src, fn, options, false);
  if (job->plan.num_processes > 0) {
    throw ValueError("map: worker processes run named functions only: register fn with "
                     "tensordict::register_map_fn(\"name\", fn) and call td.map(\"name\", options)");
  }
  ActorMapIter it(shared_from_this(), job);
  return collect(it, job->plan);
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

}  // namespace actors
}  // namespace tensordict
