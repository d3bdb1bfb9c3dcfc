#pragma once
//! Worker processes of td.map: starting them (fork + exec of a worker executable, before it creates
//! anything), the table of their pids shared by the caller (who reaps them) and the coordinator (who
//! polls them), and the worker side (run_map_worker_process: what tensordict::run_worker_if_requested
//! runs in the child).
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tensordict {
namespace actors {

//! the environment variable that makes a process a map worker:
//! "<host>:<port>:<token>:<worker index>"
constexpr const char* kMapWorkerEnv = "TENSORDICT_MAP_WORKER";

//! pids of one map call's worker processes, by process slot (slot p = worker index first_index + p).
//! Thread-safe; a pid is never signalled after it was reaped (no pid-reuse accidents).
class ProcessTable {
 public:
  explicit ProcessTable(int64_t first_index = 0) : first_index_(first_index) {}
  int64_t first_index() const { return first_index_; }
  //! records a started child; returns its slot
  size_t add(pid_t pid);
  size_t size() const;
  pid_t pid(size_t slot) const;
  //! SIGKILL the child of `slot` unless it was reaped
  void kill(size_t slot);
  //! non-blocking: reaps children that have exited; returns (slot, "exited with status 3" / "was killed
  //! by signal 9 (Killed)") for each
  std::vector<std::pair<size_t, std::string>> poll();
  //! waits up to `timeout` for the child of `slot` to exit and reaps it: its exit description, or nullopt
  //! (still running, or reaped before: then poll() reported it)
  std::optional<std::string> wait_for(size_t slot, std::chrono::milliseconds timeout);
  //! waits up to `grace` for every child to exit, SIGKILLs the rest and reaps them (blocking); idempotent
  void reap_all(std::chrono::milliseconds grace);
  //! true when every child was reaped
  bool all_reaped() const;

 private:
  std::string reap_locked(size_t slot, int status);
  mutable std::mutex mu_;
  int64_t first_index_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
};

//! the parent's pid, set by spawn_worker_process for watch_parent_or_exit
constexpr const char* kWorkerParentEnv = "TENSORDICT_WORKER_PARENT";
//! the exit status of a worker whose parent process is gone
constexpr int kParentGoneExit = 125;

//! fork + exec `executable` with `env_value` in `env_name` (kMapWorkerEnv for map workers; the DataLoader's
//! workers use their own variable), this process' pid in kWorkerParentEnv and the rest of the environment
//! inherited, file descriptors above 2 closed. The worker outlives the thread that started it (no
//! PR_SET_PDEATHSIG, which follows the forking thread) and dies with this process (watch_parent_or_exit).
//! BackendError when fork fails.
pid_t spawn_worker_process(const std::string& executable, const std::string& env_value,
                           const char* env_name = kMapWorkerEnv);

//! the worker side, first thing: a detached thread that checks every 100 ms that the process named by
//! kWorkerParentEnv (unset here; default: the current parent) is still this process' parent, and
//! `_Exit(kParentGoneExit)`s the worker once it was reparented (its parent died, however), even while the
//! worker's own code is busy or stuck. Used by map's and the DataLoader's worker processes.
void watch_parent_or_exit();

//! the worker side: returns false at once when kMapWorkerEnv is not set; otherwise connects to the
//! coordinator, serves chunks until stopped or disconnected and exits the process (never returns)
bool run_map_worker_process(int argc, char** argv);

}  // namespace actors
}  // namespace tensordict
