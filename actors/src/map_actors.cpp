#include "tensordict/actors/map_actors.hpp"

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "tensordict/actors/progress.hpp"
#include "tensordict/logging.hpp"

namespace tensordict {
namespace actors {

namespace {

constexpr int kInFlightPerWorker = 2;

struct worker_state {
  MapWorkerContext ctx;
  static inline const char* name = "tensordict.map_worker";
};

caf::behavior map_worker(caf::stateful_actor<worker_state>* self, std::shared_ptr<LocalMapJob> job, int64_t index) {
  self->state.ctx.worker_index = index;
  self->state.ctx.seed = job->plan.seed + index;
  return {
      [=](map_chunk_atom, int64_t chunk) {
        auto reply_to = caf::actor_cast<caf::actor>(self->current_sender());
        if (job->cancelled.load(std::memory_order_relaxed)) return;
        try {
          TensorDict r = map_detail::run_chunk(job->src, job->fn, job->plan, static_cast<size_t>(chunk),
                                               self->state.ctx);
          self->send(reply_to, map_done_atom::value, index, chunk, std::move(r));
        } catch (...) {
          auto ce = map_detail::carry_current_exception(chunk);
          self->send(reply_to, map_failed_atom::value, index, to_wire(ce));
        }
      },
  };
}

struct worker_slot {
  caf::actor handle;        //!< local actor, or the proxy of a worker process once it said hello
  caf::actor_addr addr;
  bool remote = false;
  bool connected = false;   //!< can take chunks (local: from the start; remote: after hello)
  bool lost = false;
  int64_t pid = -1;
  std::vector<int64_t> in_flight;
};

struct coordinator_state {
  std::vector<worker_slot> workers;
  std::deque<int64_t> retry;       //!< chunks of lost workers, dispatched before new ones
  std::vector<char> chunk_done;
  int64_t next = 0;
  int64_t done = 0;
  int64_t alive = 0;
  bool finished = false;
  Progress progress;
  static inline const char* name = "tensordict.map_coordinator";
};

using coordinator = caf::stateful_actor<coordinator_state>;

std::string describe_worker(const LocalMapJob& job, const worker_slot& w, size_t index) {
  if (!w.remote) return "worker " + std::to_string(index);
  std::string s = "worker process " + std::to_string(index);
  int64_t pid = w.pid;
  if (pid < 0 && job.processes) {
    const auto slot = static_cast<int64_t>(index) - job.processes->first_index();
    if (slot >= 0 && static_cast<size_t>(slot) < job.processes->size()) pid = job.processes->pid(static_cast<size_t>(slot));
  }
  if (pid > 0) s += " (pid " + std::to_string(pid) + ")";
  return s;
}

void stop_workers(coordinator* self, LocalMapJob& job) {
  auto& workers = self->state.workers;
  for (size_t i = 0; i < workers.size(); ++i) {
    auto& w = workers[i];
    if (w.remote && !w.connected && !w.lost && job.processes) {
      // still starting (no connection to send a stop through, no work in hand): no reason to wait for it
      const auto p = static_cast<int64_t>(i) - job.processes->first_index();
      if (p >= 0 && static_cast<size_t>(p) < job.processes->size()) job.processes->kill(static_cast<size_t>(p));
    }
    if (!w.handle) continue;
    if (w.remote) {
      if (w.connected && !w.lost) self->send(w.handle, map_stop_atom::value);
      self->demonitor(w.handle);
    } else {
      self->send_exit(w.handle, caf::exit_reason::user_shutdown);
    }
    w.handle = nullptr;
  }
}

void fail(coordinator* self, LocalMapJob& job, map_detail::CarriedError err) {
  if (self->state.finished) return;
  self->state.finished = true;
  job.cancelled = true;
  logger()->debug("map: chunk {} failed in a worker: {}: {}", err.chunk, error_name(err.code), err.message);
  self->state.progress.finish(false);
  MapEvent ev;
  ev.kind = MapEvent::Kind::Error;
  ev.chunk = err.chunk;
  ev.error = std::move(err);
  job.close(std::move(ev));
  stop_workers(self, job);
  self->quit(caf::exit_reason::user_shutdown);
}

void dispatch(coordinator* self, const LocalMapJob& job, size_t w) {
  auto& st = self->state;
  auto& slot = st.workers[w];
  if (!slot.connected || slot.lost || st.finished) return;
  const auto total = static_cast<int64_t>(job.plan.chunks.size());
  while (static_cast<int>(slot.in_flight.size()) < kInFlightPerWorker) {
    int64_t chunk = -1;
    while (!st.retry.empty() && chunk < 0) {
      const int64_t c = st.retry.front();
      st.retry.pop_front();
      if (!st.chunk_done[static_cast<size_t>(c)]) chunk = c;
    }
    if (chunk < 0) {
      if (st.next >= total) break;
      chunk = st.next++;
    }
    self->send(slot.handle, map_chunk_atom::value, chunk);
    slot.in_flight.push_back(chunk);
  }
}

void dispatch_all(coordinator* self, const LocalMapJob& job) {
  for (size_t w = 0; w < self->state.workers.size(); ++w) dispatch(self, job, w);
}

//! a worker process died, disconnected or never connected: reassign its chunks (or fail when none remains)
void lose_worker(coordinator* self, LocalMapJob& job, size_t w, const std::string& reason) {
  auto& st = self->state;
  if (st.finished || w >= st.workers.size()) return;
  auto& slot = st.workers[w];
  if (slot.lost) return;
  slot.lost = true;
  --st.alive;
  const std::string who = describe_worker(job, slot, w);
  size_t requeued = 0;
  for (int64_t c : slot.in_flight) {
    if (!st.chunk_done[static_cast<size_t>(c)]) {
      st.retry.push_back(c);
      ++requeued;
    }
  }
  slot.in_flight.clear();
  if (slot.remote && job.processes) {
    const auto p = static_cast<int64_t>(w) - job.processes->first_index();
    if (p >= 0 && static_cast<size_t>(p) < job.processes->size()) job.processes->kill(static_cast<size_t>(p));
  }
  if (slot.handle) {
    self->demonitor(slot.handle);
    slot.handle = nullptr;
  }
  const auto total = static_cast<int64_t>(job.plan.chunks.size());
  if (st.alive <= 0) {
    fail(self, job,
         {ErrorCode::Backend,
          "map: every worker is gone, the last one: " + who + " " + reason + "; " + std::to_string(st.done) +
              " of " + std::to_string(total) + " chunks were done",
          -1});
    return;
  }
  logger()->warn("map: {} {}; its {} in-flight chunk(s) go to the remaining {} worker(s)", who, reason, requeued,
                 st.alive);
  dispatch_all(self, job);
}

void chunk_done(coordinator* self, LocalMapJob& job, int64_t worker, int64_t chunk, TensorDict result) {
  auto& s = self->state;
  const auto total = static_cast<int64_t>(job.plan.chunks.size());
  if (s.finished || chunk < 0 || chunk >= total) return;
  const auto w = static_cast<size_t>(worker);
  if (w < s.workers.size()) {
    auto& fl = s.workers[w].in_flight;
    auto it = std::find(fl.begin(), fl.end(), chunk);
    if (it != fl.end()) fl.erase(it);
  }
  if (s.chunk_done[static_cast<size_t>(chunk)]) return;  // a reassigned chunk that its first worker finished too
  s.chunk_done[static_cast<size_t>(chunk)] = 1;
  MapEvent ev;
  ev.kind = MapEvent::Kind::Result;
  ev.chunk = chunk;
  ev.result = std::move(result);
  job.events->push(std::move(ev));
  ++s.done;
  s.progress.update(s.done);
  if (s.done == total) {
    s.finished = true;
    s.progress.finish(true);
    job.close(MapEvent{});
    stop_workers(self, job);
    self->quit();
    return;
  }
  if (w < s.workers.size()) dispatch(self, job, w);
}

caf::behavior map_coordinator(coordinator* self, std::shared_ptr<LocalMapJob> job) {
  auto& st = self->state;
  const auto total = static_cast<int64_t>(job->plan.chunks.size());
  st.progress = Progress(job->plan.progress, total, job->progress_interval, "map");
  st.chunk_done.assign(static_cast<size_t>(total), 0);
  // whatever ends the coordinator (done, error, killed by an abandoned MapIter), the caller gets an event
  std::weak_ptr<LocalMapJob> weak = job;
  self->attach_functor([weak](const caf::error& reason) {
    if (auto j = weak.lock()) {
      j->cancelled = true;
      MapEvent ev;
      ev.kind = MapEvent::Kind::Error;
      ev.error = {ErrorCode::Runtime, "map: the coordinator stopped before the end (" + to_string(reason) + ")", -1};
      j->close(std::move(ev));
    }
  });
  self->set_exit_handler([=](caf::exit_msg& msg) {
    if (!msg.reason) return;
    fail(self, *job, {ErrorCode::Runtime, "map: a worker stopped unexpectedly (" + to_string(msg.reason) + ")", -1});
  });
  // a worker process's actor went down: its process died or the connection dropped
  self->set_down_handler([=](caf::down_msg& msg) {
    auto& s = self->state;
    for (size_t w = 0; w < s.workers.size(); ++w) {
      if (s.workers[w].remote && s.workers[w].addr == msg.source) {
        std::string reason = "disconnected (" + to_string(msg.reason) + ")";
        // usually the process died: its exit status says more (it is reaped within moments of the disconnect)
        const auto p = static_cast<int64_t>(w) - job->processes->first_index();
        if (p >= 0) {
          if (auto status = job->processes->wait_for(static_cast<size_t>(p), std::chrono::milliseconds(200))) {
            reason = *status + " (connection lost)";
          }
        }
        lose_worker(self, *job, w, reason);
        return;
      }
    }
  });
  if (total == 0) {
    st.progress.finish(true);
    job->close(MapEvent{});
    self->quit();
    return {};
  }
  const int64_t num_local = job->plan.num_workers - job->num_processes;
  for (int64_t i = 0; i < job->plan.num_workers; ++i) {
    worker_slot slot;
    if (i < num_local) {
      slot.handle = self->spawn<caf::linked>(map_worker, job, i);
      slot.addr = slot.handle.address();
      slot.connected = true;
    } else {
      slot.remote = true;
    }
    st.workers.push_back(std::move(slot));
  }
  st.alive = job->plan.num_workers;
  dispatch_all(self, *job);
  if (job->num_processes > 0) {
    self->delayed_send(self, job->poll_interval, map_poll_atom::value);
    self->delayed_send(self, job->connect_timeout, map_connect_timeout_atom::value);
  }
  return {
      [=](map_done_atom, int64_t worker, int64_t chunk, TensorDict& result) {
        chunk_done(self, *job, worker, chunk, std::move(result));
      },
      [=](map_done_atom, int64_t worker, int64_t chunk) {  // a worker process wrote the chunk into out
        chunk_done(self, *job, worker, chunk, TensorDict::undefined());
      },
      [=](map_failed_atom, int64_t, map_error& e) {
        fail(self, *job, from_wire(e));
      },
      [=](map_hello_atom, const std::string& token, int64_t worker, int64_t pid) {
        auto& s = self->state;
        auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        const bool valid = token == job->token && worker >= num_local && worker < job->plan.num_workers;
        if (!valid) {
          logger()->warn("map: ignoring a hello with a wrong token or worker index {}", worker);
          if (sender) self->send(sender, map_stop_atom::value);
          return;
        }
        auto& slot = s.workers[static_cast<size_t>(worker)];
        if (slot.connected || slot.lost || s.finished) {  // too late (declared lost) or a duplicate
          if (sender) self->send(sender, map_stop_atom::value);
          return;
        }
        slot.handle = sender;
        slot.addr = sender.address();
        slot.pid = pid;
        slot.connected = true;
        self->monitor(sender);
        logger()->debug("map: worker process {} (pid {}) connected", worker, pid);
        self->send(sender, map_job_atom::value, job->remote);
        dispatch(self, *job, static_cast<size_t>(worker));
      },
      [=](map_poll_atom) {
        auto& s = self->state;
        if (s.finished) return;
        for (auto& ex : job->processes->poll()) {
          const auto w = static_cast<size_t>(job->processes->first_index()) + ex.first;
          lose_worker(self, *job, w, ex.second);
          if (s.finished) return;
        }
        self->delayed_send(self, job->poll_interval, map_poll_atom::value);
      },
      [=](map_connect_timeout_atom) {
        auto& s = self->state;
        for (size_t w = 0; w < s.workers.size() && !s.finished; ++w) {
          if (s.workers[w].remote && !s.workers[w].connected && !s.workers[w].lost) {
            lose_worker(self, *job, w,
                        "did not connect within " + std::to_string(job->connect_timeout.count()) +
                            " ms (request_timeout_ms); does its main call tensordict::run_worker_if_requested?");
          }
        }
      },
  };
}

}  // namespace

caf::actor spawn_map_coordinator(caf::actor_system& sys, std::shared_ptr<LocalMapJob> job) {
  return sys.spawn(map_coordinator, std::move(job));
}

namespace {
caf::behavior map_helper(caf::event_based_actor* self, std::shared_ptr<SharedMapJob> job, int64_t index) {
  return {
      [=](map_chunk_atom) {
        MapWorkerContext ctx;
        ctx.worker_index = index;
        ctx.seed = job->plan.seed + index;
        for (int64_t c = job->claim_helper(); c >= 0; c = job->claim_helper()) {
          MapEvent ev;
          ev.chunk = c;
          try {
            ev.result = map_detail::run_chunk(job->src, job->fn, job->plan, static_cast<size_t>(c), ctx);
            ev.kind = MapEvent::Kind::Result;
            if (job->gather && job->gather->place(static_cast<size_t>(c), ev.result)) {
              ev.placed = true;
              ev.result = TensorDict::undefined();
            }
          } catch (...) {
            job->cancelled = true;
            ev.kind = MapEvent::Kind::Error;
            ev.error = map_detail::carry_current_exception(c);
          }
          const bool failed = ev.kind == MapEvent::Kind::Error;
          job->events->push(std::move(ev));
          if (failed) break;
        }
        job->events->push(MapEvent{});  // End: this helper is done with the job
        self->quit();
      },
  };
}
}  // namespace

caf::actor spawn_map_helper(caf::actor_system& sys, std::shared_ptr<SharedMapJob> job, int64_t index) {
  caf::actor h = sys.spawn(map_helper, std::move(job), index);
  caf::anon_send(h, map_chunk_atom::value);
  return h;
}

}  // namespace actors
}  // namespace tensordict
