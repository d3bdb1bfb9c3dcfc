#pragma once
// Named per-batch transforms of the loader tests, registered in the test process (the DataLoader looks the
// name up and runs it once to learn the batch layout) and in td_loader_worker (worker processes run them).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "tensordict/tensordict.hpp"

namespace loader_test {

//! rows of the test datasets: idx = i, x[i, c] = 10 i + c, {"n", "y"}[i] = -i
inline tensordict::TensorDict dataset(int64_t n) {
  at::Tensor idx = at::arange(n, at::kLong);
  at::Tensor x = idx.to(at::kFloat).unsqueeze(1) * 10 + at::arange(4, at::kFloat).unsqueeze(0);
  return tensordict::TensorDict({{"idx", idx}, {"x", x}, {tensordict::NestedKey{"n", "y"}, -idx.to(at::kDouble)}}, {n});
}

//! true when every row of the batch is the dataset row its idx names (with `scale`/`shift` applied to x, y)
inline bool rows_match(const tensordict::TensorDict& b, double scale = 1, double shift = 0) {
  at::Tensor idx = b.get("idx");
  at::Tensor want_x = (idx.to(at::kFloat).unsqueeze(1) * 10 + at::arange(4, at::kFloat).unsqueeze(0)) * scale + shift;
  at::Tensor want_y = -idx.to(at::kDouble) * scale + shift;
  return at::allclose(b.get("x"), want_x) && at::allclose(b.get(tensordict::NestedKey{"n", "y"}), want_y);
}

//! releases the transforms stuck in sleep_until_released (the timeout tests set it when they are done)
inline std::atomic<bool>& stuck_released() {
  static std::atomic<bool> released{false};
  return released;
}

//! "never returns" for the timeout tests: up to an hour, or until the test releases it (worker processes are
//! killed by the loader long before)
inline void sleep_until_released() {
  // TD_LOADER_TEST_STUCK_DIR: say so with a file <dir>/stuck.<pid> first (tests that kill a stuck process's parent)
  if (const char* dir = std::getenv("TD_LOADER_TEST_STUCK_DIR")) {
    std::ofstream(std::string(dir) + "/stuck." + std::to_string(::getpid())) << "stuck\n";
  }
  for (int i = 0; i < 360000 && !stuck_released().load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

inline void register_fns() {
  using tensordict::TensorDict;
  // x and y scaled and shifted, idx kept
  tensordict::register_map_fn("ld_affine", [](const TensorDict& b) {
    TensorDict r = b.clone();
    r.set("x", b.get("x") * 2 + 1);
    r.set(tensordict::NestedKey{"n", "y"}, b.get(tensordict::NestedKey{"n", "y"}) * 2 + 1);
    return r;
  });
  // a per-batch random column from the batch's generator: the same whatever worker runs the batch
  tensordict::register_map_fn("ld_seeded", [](const TensorDict& b) {
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    TensorDict r = b.clone();
    r.set("noise", at::rand({b.batch_size()[0]}, w->generator()));
    r.set("batch", at::full({b.batch_size()[0]}, w->chunk, at::kLong));
    return r;
  });
  // batch 3 of every epoch is poisoned
  tensordict::register_map_fn("ld_fail_batch_3", [](const TensorDict& b) -> TensorDict {
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    if (w && w->chunk == 3) throw tensordict::IndexError("batch 3 is poisoned");
    return b;
  });
  // slow: leaves time to kill a worker process in the middle of an epoch
  tensordict::register_map_fn("ld_slow", [](const TensorDict& b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    return b;
  });
  // worker 0 takes 10 ms a batch, the others 2 ms: the trainer sleeps on worker 0's batches while the others
  // finish the batches after them
  tensordict::register_map_fn("ld_slow_worker_0", [](const TensorDict& b) {
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    std::this_thread::sleep_for(std::chrono::milliseconds(w && w->worker_index == 0 ? 10 : 2));
    return b;
  });
  // batch 2 of every epoch never returns (in a worker; the constructor's run on the first rows returns)
  tensordict::register_map_fn("ld_stuck_batch_2", [](const TensorDict& b) {
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    if (w && w->worker_index >= 0 && w->chunk == 2) sleep_until_released();
    return b;
  });
  // never returns, the constructor's run included
  tensordict::register_map_fn("ld_stuck_always", [](const TensorDict& b) {
    sleep_until_released();
    return b;
  });
  // a result that changes its layout after the first batch
  tensordict::register_map_fn("ld_bad_layout", [](const TensorDict& b) {
    const tensordict::MapWorkerContext* w = tensordict::current_map_worker();
    TensorDict r = b.clone();
    if (w && w->chunk == 2) r.set("x", b.get("x").to(at::kDouble));
    return r;
  });
}

}  // namespace loader_test
