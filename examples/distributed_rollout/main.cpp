// Distributed rollouts (issue 37): N producer ranks each send rollouts (nested TensorDicts: observations, actions,
// rewards, a "next" level and a non-tensor policy name) to a learner rank over a c10d process group (gloo on a
// TCPStore on loopback). Each producer first sends its structure with init_remote; the learner builds the
// receiving TensorDict from it (from_remote_init), then every rollout moves as one consolidated message into it.
// The learner writes each rollout into a replay buffer, samples batches from it, checks every row it received and
// prints a progress line.
//
//   distributed_rollout [--producers 2] [--rollouts 20] [--steps 64] [--capacity 4096] [--batch 256]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensordict/tensordict.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

struct Args {
  int producers = 2;
  int rollouts = 20;
  int steps = 64;
  int64_t capacity = 4096;
  int64_t batch = 256;
};


//! rollout r of producer p: every value tells where it comes from (the learner checks them)
TensorDict rollout(int p, int r, int steps) {
  const double base = p * 1000.0 + r;
  TensorDict td(BatchSize{steps});
  at::Tensor t = at::arange(steps, at::kFloat);
  td.set("observation", (t + base).unsqueeze(1).expand({steps, 8}).contiguous());
  td.set("action", at::full({steps, 2}, static_cast<int64_t>(r % 4), at::kLong));
  td.set("reward", at::full({steps}, base, at::kFloat));
  TensorDict next(BatchSize{steps});
  next.set("observation", (t + base + 1).unsqueeze(1).expand({steps, 8}).contiguous());
  next.set("done", t == steps - 1);
  td.set("next", next);
  td.set("policy", "producer-" + std::to_string(p));
  return td;
}

int producer(int rank, const Args& a, int port) {
  try {
    dist::init_process_group(dist::GroupOptions().store("tcp").port(port).rank(rank).world_size(a.producers + 1));
    rollout(rank, 0, a.steps).init_remote(0);  // the structure, once
    for (int r = 0; r < a.rollouts; ++r) rollout(rank, r, a.steps).send(0, DistOptions().consolidated(true));
    dist::default_group()->barrier();
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "producer %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (k == "--producers") a.producers = static_cast<int>(v);
    else if (k == "--rollouts") a.rollouts = static_cast<int>(v);
    else if (k == "--steps") a.steps = static_cast<int>(v);
    else if (k == "--capacity") a.capacity = v;
    else if (k == "--batch") a.batch = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.producers < 1 || a.rollouts < 1 || a.steps < 1 || a.capacity < a.steps || a.batch < 1) {
    std::fprintf(stderr, "need --producers >= 1, --rollouts >= 1, --steps >= 1, --capacity >= --steps, --batch >= 1\n");
    return 2;
  }
  const int port = dist::free_port();
  // the producers are forked before this process starts any thread
  std::vector<pid_t> pids;
  for (int p = 1; p <= a.producers; ++p) {
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(producer(p, a, port));
    pids.push_back(pid);
  }
  int failed = 0;
  try {
    auto group = dist::init_process_group(dist::GroupOptions().store("tcp").port(port).rank(0).world_size(a.producers + 1));
    std::vector<TensorDict> inbox;
    for (int p = 1; p <= a.producers; ++p) inbox.push_back(TensorDict::from_remote_init(p));
    // the replay buffer: the rollout's structure without the non-tensor policy, capacity rows
    TensorDict buffer = inbox[0].exclude({"policy"}).index({Slice(0, 1)}).expand({a.capacity}).clone();
    buffer.zero_();
    int64_t cursor = 0, filled = 0, received = 0;
    const int64_t total = static_cast<int64_t>(a.producers) * a.rollouts;
    const auto t0 = std::chrono::steady_clock::now();
    double sampled_mean = 0;
    for (int r = 0; r < a.rollouts; ++r) {
      for (int p = 1; p <= a.producers; ++p) {
        TensorDict& td = inbox[p - 1];
        td.recv(p, DistOptions().consolidated(true));
        const double base = p * 1000.0 + r;
        if (!at::equal(td.get("reward"), at::full({a.steps}, base, at::kFloat)) ||
            td.get_entry("policy").non_tensor_value() != JsonValue("producer-" + std::to_string(p)) ||
            td.get({"next", "observation"}).index({0, 0}).item<float>() != static_cast<float>(base + 1)) {
          std::fprintf(stderr, "learner: rollout %d of producer %d has other values\n", r, p);
          ++failed;
        }
        // into the replay buffer (a ring of rows)
        const int64_t n = a.steps;
        const int64_t first = std::min(n, a.capacity - cursor);
        buffer.index_put_({Slice(cursor, cursor + first)}, td.exclude({"policy"}).index({Slice(0, first)}));
        if (first < n) buffer.index_put_({Slice(0, n - first)}, td.exclude({"policy"}).index({Slice(first, n)}));
        cursor = (cursor + n) % a.capacity;
        filled = std::min(a.capacity, filled + n);
        ++received;
        // sample a batch from what the buffer holds
        at::Tensor idx = at::randint(filled, {a.batch}, at::kLong);
        TensorDict batch = buffer.index({idx});
        sampled_mean = batch.get("reward").mean().item<double>();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("\rrollouts %lld/%lld  rows %lld  buffer %lld/%lld  %.0f rows/s  sampled mean reward %.1f",
                  static_cast<long long>(received), static_cast<long long>(total),
                  static_cast<long long>(received * a.steps), static_cast<long long>(filled),
                  static_cast<long long>(a.capacity), received * a.steps / std::max(secs, 1e-9), sampled_mean);
      std::fflush(stdout);
    }
    std::printf("\n");
    group->barrier();
    dist::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "learner: %s\n", e.what());
    ++failed;
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed) {
    std::printf("FAILED: %d problems\n", failed);
    return 1;
  }
  std::printf("every rollout verified (%d producers x %d rollouts of %d steps)\n", a.producers, a.rollouts, a.steps);
  return 0;
}
