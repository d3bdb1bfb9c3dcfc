#pragma once
//! The map coordinator and worker actors. One coordinator per map/map_iter call spawns the in-process
//! workers (linked) and waits for the worker processes to connect (monitored), keeps up to two chunks in
//! flight per worker, forwards results to the caller's Inbox, reports progress, and on the first worker
//! error forwards it, cancels the job and stops every worker. A worker process that dies or disconnects
//! is lost: its in-flight chunks go to the remaining workers (BackendError when none remains). Killing
//! the coordinator (an abandoned MapIter) kills its linked workers; worker processes see it go down.
#include <atomic>
#include <memory>

#include <caf/all.hpp>

#include "tensordict/actors/inbox.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/process_workers.hpp"
#include "tensordict/map.hpp"

namespace tensordict {
namespace actors {

//! what the caller's inbox receives: a result, the first error, or the end
struct MapEvent {
  enum class Kind { Result, Error, End } kind = Kind::End;
  int64_t chunk = -1;
  TensorDict result = TensorDict::undefined();
  bool placed = false;  //!< Result: already copied into the call's ChunkGather (result undefined)
  map_detail::CarriedError error;
};

//! one map call, shared (in-process) by the caller, the coordinator and the workers
struct LocalMapJob {
  TensorDict src;
  MapFn fn;
  MapPlan plan;
  std::chrono::milliseconds progress_interval{1000};
  std::shared_ptr<Inbox<MapEvent>> events;
  //! worker processes: the last num_processes of plan.num_workers workers are processes that connect
  //! with (map_hello_atom, token, index, pid); they get `remote` as their job
  int64_t num_processes = 0;
  std::string token;
  map_job_desc remote;
  std::shared_ptr<ProcessTable> processes;
  std::chrono::milliseconds connect_timeout{30000};  //!< a process that has not connected by then is lost
  std::chrono::milliseconds poll_interval{50};       //!< how often the coordinator polls the children
  std::atomic<bool> cancelled{false};  //!< workers skip chunks once set
  std::atomic<bool> closed{false};     //!< the terminal event (End or Error) has been pushed
  //! pushes the terminal event once
  void close(MapEvent ev) {
    bool expected = false;
    if (closed.compare_exchange_strong(expected, true)) events->push(std::move(ev));
  }
};

//! spawns the coordinator (which spawns the workers)
caf::actor spawn_map_coordinator(caf::actor_system& sys, std::shared_ptr<LocalMapJob> job);

//! td.map with a closure, in process (Runtime::map): the caller is worker 0. It runs chunk 0 itself, timed,
//! and from that cost per row decides how many helpers pay off; helpers (worker actors 1..k) and the caller
//! then claim chunks from one counter until none is left, so no chunk waits in a mailbox and the caller's
//! thread works instead of waiting. Helpers push their results, their first error and their exit into
//! `events`.
struct SharedMapJob {
  TensorDict src;
  MapFn fn;
  MapPlan plan;
  std::atomic<int64_t> next{0};        //!< the next chunk nobody has claimed
  std::atomic<bool> cancelled{false};  //!< an error: nobody claims chunks any more
  std::atomic<bool> retired{false};    //!< helpers started early turned out not to pay: they claim no more
  //! Result (a chunk done by a helper), Error (a helper's fn failed), End (a helper exited)
  std::shared_ptr<Inbox<MapEvent>> events;
  //! the call's result made as the chunks come (null: results go to the caller whole)
  std::shared_ptr<map_detail::ChunkGather> gather;
  //! the next chunk index, or -1 when every chunk is claimed or the job is cancelled
  int64_t claim() {
    if (cancelled.load(std::memory_order_relaxed)) return -1;
    const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
    return c < static_cast<int64_t>(plan.chunks.size()) ? c : -1;
  }
  //! claim() for a helper: -1 as well once the helpers are retired
  int64_t claim_helper() { return retired.load(std::memory_order_relaxed) ? -1 : claim(); }
};

//! spawns helper `index` (a worker actor on the scheduler): it claims and runs chunks until none is left,
//! then pushes End and quits
caf::actor spawn_map_helper(caf::actor_system& sys, std::shared_ptr<SharedMapJob> job, int64_t index);

}  // namespace actors
}  // namespace tensordict
