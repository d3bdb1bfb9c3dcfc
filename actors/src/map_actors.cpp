#include "tensordict/actors/map_actors.hpp"

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
  self->state.ctx.generator = at::detail::createCPUGenerator(static_cast<uint64_t>(self->state.ctx.seed));
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
          self->send(reply_to, map_failed_atom::value, index, map_error{ce.type, ce.message, ce.chunk});
        }
      },
  };
}

struct coordinator_state {
  std::vector<caf::actor> workers;
  std::vector<int> in_flight;
  int64_t next = 0;
  int64_t done = 0;
  Progress progress;
  static inline const char* name = "tensordict.map_coordinator";
};

using coordinator = caf::stateful_actor<coordinator_state>;

void stop_workers(coordinator* self) {
  for (auto& w : self->state.workers) self->send_exit(w, caf::exit_reason::user_shutdown);
  self->state.workers.clear();
}

void dispatch(coordinator* self, const LocalMapJob& job, size_t w) {
  auto& st = self->state;
  const auto total = static_cast<int64_t>(job.plan.chunks.size());
  while (st.in_flight[w] < kInFlightPerWorker && st.next < total) {
    self->send(st.workers[w], map_chunk_atom::value, st.next++);
    ++st.in_flight[w];
  }
}

void fail(coordinator* self, LocalMapJob& job, map_detail::CarriedError err) {
  job.cancelled = true;
  logger()->debug("map: chunk {} failed in a worker: {}: {}", err.chunk, err.type, err.message);
  self->state.progress.finish(false);
  MapEvent ev;
  ev.kind = MapEvent::Kind::Error;
  ev.chunk = err.chunk;
  ev.error = std::move(err);
  job.close(std::move(ev));
  stop_workers(self);
  self->quit(caf::exit_reason::user_shutdown);
}

caf::behavior map_coordinator(coordinator* self, std::shared_ptr<LocalMapJob> job) {
  auto& st = self->state;
  const auto total = static_cast<int64_t>(job->plan.chunks.size());
  st.progress = Progress(job->plan.progress, total, job->progress_interval, "map");
  // whatever ends the coordinator (done, error, killed by an abandoned MapIter), the caller gets an event
  std::weak_ptr<LocalMapJob> weak = job;
  self->attach_functor([weak](const caf::error& reason) {
    if (auto j = weak.lock()) {
      j->cancelled = true;
      MapEvent ev;
      ev.kind = MapEvent::Kind::Error;
      ev.error = {"RuntimeError", "map: the coordinator stopped before the end (" + to_string(reason) + ")", -1};
      j->close(std::move(ev));
    }
  });
  self->set_exit_handler([=](caf::exit_msg& msg) {
    if (!msg.reason) return;
    fail(self, *job, {"RuntimeError", "map: a worker stopped unexpectedly (" + to_string(msg.reason) + ")", -1});
  });
  if (total == 0) {
    st.progress.finish(true);
    job->close(MapEvent{});
    self->quit();
    return {};
  }
  for (int64_t i = 0; i < job->plan.num_workers; ++i) {
    st.workers.push_back(self->spawn<caf::linked>(map_worker, job, i));
    st.in_flight.push_back(0);
  }
  for (size_t w = 0; w < st.workers.size(); ++w) dispatch(self, *job, w);
  return {
      [=](map_done_atom, int64_t worker, int64_t chunk, TensorDict& result) {
        auto& s = self->state;
        MapEvent ev;
        ev.kind = MapEvent::Kind::Result;
        ev.chunk = chunk;
        ev.result = std::move(result);
        job->events->push(std::move(ev));
        ++s.done;
        s.progress.update(s.done);
        const auto w = static_cast<size_t>(worker);
        if (w < s.in_flight.size()) {
          --s.in_flight[w];
          dispatch(self, *job, w);
        }
        if (s.done == total) {
          s.progress.finish(true);
          job->close(MapEvent{});
          stop_workers(self);
          self->quit();
        }
      },
      [=](map_failed_atom, int64_t, map_error& e) {
        fail(self, *job, {std::move(e.type), std::move(e.message), e.chunk});
      },
  };
}

}  // namespace

caf::actor spawn_map_coordinator(caf::actor_system& sys, std::shared_ptr<LocalMapJob> job) {
  return sys.spawn(map_coordinator, std::move(job));
}

}  // namespace actors
}  // namespace tensordict
