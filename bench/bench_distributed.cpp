// Distributed tensordicts (issue 37) against raw c10d, two ranks on loopback (this process forks the second before
// any thread starts). Every figure is a ratio within one run; samples of ours and of the reference alternate.
//   p2p:          5 leaves x [10000, 64] float32, td.send / td.recv (default: checked + staged; and upstream's way:
//                 unchecked, straight into the leaves) vs raw ProcessGroupGloo sends of the same tensors (posted
//                 at once, then waited), timed on the receiver from a common barrier
//   small leaves: 512 leaves x [64] float32: one consolidated send vs per-leaf send (goal: >= 5x faster)
//   all_reduce:   the 5-leaf TensorDict vs raw allreduce of its leaves (goal: <= 1.1x)
//   consolidate:  into a preallocated (warm) buffer vs memcpy of the same bytes (goal: >= 0.7x memcpy speed)
// Prints one JSON object.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>

#include "bench_common.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using benchutil::Clock;

namespace {


TensorDict big_td(double v) {
  TensorDict td(BatchSize{10000});
  for (int i = 0; i < 5; ++i) td.set("k" + std::to_string(i), at::full({10000, 64}, v, at::kFloat));
  return td;
}

TensorDict small_td(double v) {
  TensorDict td(BatchSize{});
  for (int i = 0; i < 512; ++i) td.set("p" + std::to_string(1000 + i), at::full({64}, v, at::kFloat));
  return td;
}

std::vector<at::Tensor> leaves(const TensorDict& td) {
  std::vector<at::Tensor> out;
  for (const auto& k : td.keys(KeysOptions().sort(true))) out.push_back(td.get(k));
  return out;
}

struct Raw {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  //! every tensor posted at once (tag = its position), then waited for
  void p2p(const std::vector<at::Tensor>& ts, int peer, bool sending) {
    std::vector<c10::intrusive_ptr<c10d::Work>> ws;
    std::vector<std::vector<at::Tensor>> keep;
    keep.reserve(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      keep.push_back({ts[i]});
      ws.push_back(sending ? pg->send(keep.back(), peer, static_cast<int>(i)) : pg->recv(keep.back(), peer, static_cast<int>(i)));
    }
    for (auto& w : ws) w->wait();
  }
  //! one round trip of a 16-byte message (what a checked transfer's handshake costs): rank 0 asks, rank 1 answers
  void ping(int rank) {
    std::vector<at::Tensor> v{at::zeros({2}, at::kLong)};
    if (rank == 0) {
      pg->send(v, 1, 77)->wait();
      pg->recv(v, 1, 78)->wait();
    } else {
      pg->recv(v, 0, 77)->wait();
      pg->send(v, 0, 78)->wait();
    }
  }
  void all_reduce(const std::vector<at::Tensor>& ts) {
    std::vector<c10::intrusive_ptr<c10d::Work>> ws;
    std::vector<std::vector<at::Tensor>> keep;
    keep.reserve(ts.size());
    for (const auto& t : ts) {
      keep.push_back({t});
      ws.push_back(pg->allreduce(keep.back()));
    }
    for (auto& w : ws) w->wait();
  }
};

//! one timed round on both ranks: barrier, then fn; the time on this rank (µs)
template <class F>
double round_us(dist::Group& g, F&& fn) {
  g.barrier();
  auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int run(int rank, int port, int raw_port, int reps) {
  auto g = dist::init_process_group(dist::GroupOptions().store("tcp").port(port).rank(rank).world_size(2));
  Raw raw;
  {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(raw_port);
    so.isServer = rank == 0;
    so.numWorkers = 2;
    so.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 2;
    raw.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, opts);
  }
  // rank 1 receives (and times the point-to-point rounds); rank 0 sends
  TensorDict big = big_td(rank == 0 ? 1.0 : 0.0);
  // the rounds that receive straight into the leaves get TensorDicts of their own, so that the staged rounds
  // measure their own path (a leaf that received straight into itself is not handed a received storage)
  TensorDict big_direct = big_td(rank == 0 ? 1.0 : 0.0);
  // the raw reference's own tensors of the same shapes (an alias of a leaf would make our staged receive copy
  // into the leaf instead of handing it the received storage)
  std::vector<at::Tensor> big_leaves;
  for (const auto& t : leaves(big)) big_leaves.push_back(t.clone());
  TensorDict small = small_td(rank == 0 ? 1.0 : 0.0);
  TensorDict small_c = small.consolidate();
  std::vector<double> t_ours, t_upstream, t_raw, t_small_leaf, t_small_cons, t_ar_ours, t_ar_raw, t_checked_direct,
      t_unchecked_staged, t_ping;
  const DistOptions upstream_way = DistOptions().checked(false).staged(false);
  const DistOptions cd = DistOptions().staged(false), us = DistOptions().checked(false);
  const DistOptions whole = DistOptions().consolidated(true);
  // every contender's round, in an order that rotates with each rep: a round pays for what the one before it left
  // behind (e.g. the first after an all_reduce runs ~20% slower), and no contender should always follow the same one
  std::vector<std::pair<std::vector<double>*, std::function<void()>>> rounds = {
      {&t_ours, [&] { rank == 0 ? big.send(1) : (void)big.recv(0); }},
      {&t_raw, [&] { raw.p2p(big_leaves, 1 - rank, rank == 0); }},
      {&t_upstream, [&] { rank == 0 ? big_direct.send(1, upstream_way) : (void)big_direct.recv(0, upstream_way); }},
      {&t_checked_direct, [&] { rank == 0 ? big_direct.send(1, cd) : (void)big_direct.recv(0, cd); }},
      {&t_unchecked_staged, [&] { rank == 0 ? big.send(1, us) : (void)big.recv(0, us); }},
      {&t_small_leaf, [&] { rank == 0 ? small.send(1) : (void)small.recv(0); }},
      {&t_small_cons, [&] { rank == 0 ? small_c.send(1, whole) : (void)small_c.recv(0, whole); }},
      {&t_ar_ours, [&] { big_direct.all_reduce(); }},
      {&t_ar_raw, [&] { raw.all_reduce(big_leaves); }},
      {&t_ping, [&] { raw.ping(rank); }},
  };
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < rounds.size(); ++i) {
      auto& [times, fn] = rounds[(i + static_cast<size_t>(r)) % rounds.size()];
      times->push_back(round_us(*g, fn));
    }
  // rank 1's point-to-point times to rank 0
  std::vector<double> mine = {benchutil::median(t_ours), benchutil::median(t_raw), benchutil::median(t_upstream),
                              benchutil::median(t_small_leaf), benchutil::median(t_small_cons),
                              benchutil::median(t_checked_direct), benchutil::median(t_unchecked_staged),
                              benchutil::median(t_ping)};
  at::Tensor m = at::tensor(mine, at::kDouble);
  std::vector<at::Tensor> mv{m};
  if (rank == 1) {
    raw.pg->send(mv, 0, 99)->wait();
    dist::destroy_process_group();
    return 0;
  }
  raw.pg->recv(mv, 1, 99)->wait();
  auto p = m.accessor<double, 1>();
  // consolidate into a warm buffer vs memcpy (this rank alone)
  auto cons = [&](const TensorDict& td, const char* name) {
    TensorDict c = td.consolidate();
    at::Tensor buf = at::empty({c.consolidated_storage().numel()}, at::kByte);
    at::Tensor src = at::empty_like(buf);
    src.zero_();
    buf.zero_();
    auto pair = benchutil::measure_pair(
        [&] { (void)td.consolidate(ConsolidateOptions().buffer(buf)); },
        [&] { std::memcpy(buf.data_ptr(), src.data_ptr(), static_cast<size_t>(buf.numel())); });
    return benchutil::Json()
        .str("case", name)
        .num("bytes", static_cast<double>(buf.numel()), 0)
        .num("consolidate_us", pair.ours_us)
        .num("memcpy_us", pair.raw_us)
        .num("speed_vs_memcpy", pair.raw_us / pair.ours_us, 2);
  };
  benchutil::Json out;
  out.num("reps", reps, 0)
      .obj("p2p_5x10000x64_f32", benchutil::Json()
                                     .num("ours_us", p[0])
                                     .num("raw_c10d_us", p[1])
                                     .num("upstream_way_us", p[2])
                                     .num("checked_direct_us", p[5])
                                     .num("unchecked_staged_us", p[6])
                                     .num("raw_round_trip_us", p[7])
                                     .num("ours_vs_raw", p[0] / p[1], 2)
                                     .num("upstream_way_vs_raw", p[2] / p[1], 2))
      .obj("small_512_leaves", benchutil::Json()
                                   .num("per_leaf_us", p[3])
                                   .num("consolidated_us", p[4])
                                   .num("consolidated_speedup", p[3] / p[4], 2))
      .obj("all_reduce_5x10000x64", benchutil::Json()
                                        .num("ours_us", benchutil::median(t_ar_ours))
                                        .num("raw_us", benchutil::median(t_ar_raw))
                                        .num("ours_vs_raw", benchutil::median(t_ar_ours) / benchutil::median(t_ar_raw), 2))
      .arr("consolidate_warm_buffer", {cons(big, "5x10000x64_f32"), cons(small, "512x64_f32")});
  std::printf("%s\n", out.dump().c_str());
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--consolidate-only") {
    // for perf: the 512-leaf consolidate into a warm buffer, in a loop, one process
    TensorDict small = small_td(1.0);
    at::Tensor buf = at::empty({small.consolidate().consolidated_storage().numel()}, at::kByte);
    const int n = argc > 2 ? std::atoi(argv[2]) : 2000;
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) (void)small.consolidate(ConsolidateOptions().buffer(buf));
    std::printf("{\"consolidate_512_leaves_us\": %.1f}\n",
                std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
    return 0;
  }
  int reps = 31;
  if (argc > 2 && std::string(argv[1]) == "--reps") reps = std::max(3, std::atoi(argv[2]));
  const int port = dist::free_port(), raw_port = dist::free_port();
  std::fflush(stdout);
  pid_t child = ::fork();
  if (child == 0) ::_exit(run(1, port, raw_port, reps));
  int rc = 1;
  try {
    rc = run(0, port, raw_port, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_distributed: %s\n", e.what());
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
