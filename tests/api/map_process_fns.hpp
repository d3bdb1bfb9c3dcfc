#pragma once
// Named map functions of the map_process tests, registered both in the test process (the caller looks the
// name up before it starts anything) and in td_map_worker (the worker processes run them).
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tensordict/tensordict.hpp"

namespace map_process_test {

inline tensordict::TensorDict affine(const tensordict::TensorDict& c) {
  return c.apply([](const at::Tensor& t) { return t * 2 + 1; });
}

//! set by the mixed-workers test in the test process only (null in td_map_worker): the shared `out` the
//! worker processes write into. The in-process worker 0 of mp_context waits (bounded) until a process has
//! written a chunk there, so the test does not depend on how fast processes start on a loaded machine.
inline std::atomic<const tensordict::TensorDict*>& mixed_out() {
  static std::atomic<const tensordict::TensorDict*> p{nullptr};
  return p;
}

inline bool has_row(const tensordict::TensorDict& c, int64_t row) {
  return (c.get("idx") == row).any().item<bool>();
}

inline void register_fns() {
  using tensordict::TensorDict;
  tensordict::register_map_fn("mp_affine", affine);
  // a tensordict error with its own message, on the chunk holding row 500
  tensordict::register_map_fn("mp_fail_row_500", [](const TensorDict& c) {
    if (has_row(c, 500)) throw tensordict::ValueError("row 500 is poisoned");
    return affine(c);
  });
  // an error whose message starts with another type's name, on the chunk holding row 500
  tensordict::register_map_fn("mp_fail_prefixed", [](const TensorDict& c) {
    if (has_row(c, 500)) throw tensordict::NotImplementedError("KeyError: row 500 is not a key error");
    return affine(c);
  });
  // worker 1 SIGKILLs itself on its second chunk (its in-flight chunks must be redone elsewhere)
  tensordict::register_map_fn("mp_suicide", [](const TensorDict& c) {
    static std::atomic<int> calls{0};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    if (w && w->worker_index == 1 && ++calls == 2) ::raise(SIGKILL);
    return affine(c);
  });
  // every worker dies on its first chunk
  tensordict::register_map_fn("mp_die", [](const TensorDict&) -> TensorDict {
    ::raise(SIGKILL);
    return {};
  });
  // slow: leaves time to SIGKILL a worker from outside
  tensordict::register_map_fn("mp_slow", [](const TensorDict& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    return affine(c);
  });
  // the worker's context: out["w"] = worker index, out["seed"] = its seed
  tensordict::register_map_fn("mp_context", [](const TensorDict& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    if (const TensorDict* out = mixed_out().load(); out && w && w->worker_index == 0) {
      // a process worker writes seed 41 or 42 (base 40 + its index); at most 30 s
      for (int i = 0; i < 6000 && !(out->get("seed") > 40).any().item<bool>(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    TensorDict r(c.batch_size());
    r.set("w", at::full(c.batch_size(), w ? w->worker_index : -1, at::kLong));
    r.set("seed", at::full(c.batch_size(), w ? w->seed : -1, at::kLong));
    return r;
  });
  // the minor page faults of this process so far (out["faults"]) and its worker index (out["w"]), with an
  // out["x"] of 4 KiB rows from one buffer per process, touched before the count is read: between two calls
  // of one worker the count grows by the pages writing its chunk into out faulted in, and little else
  // (tests/api/test_map_paths.cpp: map.out_write in worker processes)
  tensordict::register_map_fn("mp_faults", [](const TensorDict& c) {
    static at::Tensor buf;  // a worker process runs one chunk at a time
    const int64_t n = c.batch_size()[0];
    if (!buf.defined() || buf.size(0) < n) buf = at::ones({n, 1024});
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    TensorDict r(c.batch_size());
    r.set("x", buf.narrow(0, 0, n));
    r.set("faults", at::full({n}, static_cast<int64_t>(ru.ru_minflt), at::kLong));
    r.set("w", at::full({n}, w ? w->worker_index : -1, at::kLong));
    return r;
  });
}

}  // namespace map_process_test
