#pragma once
//! Fault injection for the crash tests (issue 14): a worker process dies by SIGKILL at a named stage of its work,
//! as a real crash would, so a test can check that nothing is lost whatever the moment.
//!   <ENV>=<stage>@<worker index>@<marker file>
//! makes the worker of that index (`*`: whichever worker gets there first) create <marker file> and SIGKILL itself
//! when it reaches <stage>. The fault fires once: the marker is created exclusively, and a marker that exists
//! already (another worker died there first) lets the worker go on. The variable is read once per process;
//! unset, a stage costs one compare.
//! Used by the map worker processes (TD_FAULT_MAP_WORKER: hello, job, reply) and the DataLoader's worker
//! processes (TD_FAULT_LOADER_WORKER: attach, open, claim, write, ready).
#include <cstdint>
#include <string>

namespace tensordict::actors {

class FaultPoints {
 public:
  explicit FaultPoints(const char* env_var);
  //! SIGKILLs this process when `stage` and `index` are the ones the variable names
  void maybe_die_at(const char* stage, int64_t index) const;

 private:
  static constexpr int64_t kAny = -2;
  std::string stage_, marker_;
  int64_t index_ = -1;
};

}  // namespace tensordict::actors
