// Load (issue 14): 8 producer processes write 100,000 rows each into one buffer — a memmap directory, a shared-
// memory TensorDict, a Redis store — one call per row, while this process reads random batches; at the end
// every row is verified. Producers are td_store_client processes (fork + exec, `fill` mode) that reopen the
// buffer by its storage spec. While rows are written the reader sees, per element, either the zero of the
// preallocated buffer or the row's own value (memmap and shared memory: rows are plain stores to memory);
// on Redis a row is written in one MULTI/EXEC, so the reader sees a whole row or none of it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "process_util.hpp"
#include "redis_server.hpp"
#include "tensordict/tensordict.hpp"

#ifndef TD_STORE_CLIENT_EXE
#error "TD_STORE_CLIENT_EXE (the path of td_store_client) must be defined"
#endif

using namespace tensordict;
using fixtures::TempDir;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kProducers = 8;
constexpr int64_t kPerProducer = 100000;
constexpr int64_t kRows = kProducers * kPerProducer;

Schema schema() {
  return {{NestedKey("obs"), {{8}, at::kFloat}}, {NestedKey("id"), {{}, at::kLong}}, {NestedKey("sum"), {{}, at::kDouble}}};
}

pid_t run_client(const std::vector<std::string>& args) { return testutil::spawn_exec(TD_STORE_CLIENT_EXE, args); }

//! rows [first, first + n) of `part` hold, per element, 0 or the row's value (whole_rows: all of a row or none)
int64_t bad_rows(const TensorDict& part, const at::Tensor& rows, bool whole_rows) {
  const at::Tensor r = rows.to(at::kLong);
  const at::Tensor id = part.get("id"), sum = part.get("sum"), obs = part.get("obs");
  const at::Tensor rf = r.to(at::kFloat).unsqueeze(1);
  const at::Tensor id_ok = id.eq(r) | id.eq(0);
  const at::Tensor sum_ok = sum.eq(r.to(at::kDouble) * 8) | sum.eq(0);
  const at::Tensor obs_ok = (obs.eq(rf) | obs.eq(0)).all(1);
  at::Tensor ok = id_ok & sum_ok & obs_ok;
  if (whole_rows) {
    const at::Tensor written = id.eq(r) & sum.eq(r.to(at::kDouble) * 8) & obs.eq(rf).all(1);
    const at::Tensor empty = id.eq(0) & sum.eq(0) & obs.eq(0).all(1);
    ok = written | empty | r.eq(0);  // row 0's value is the zero itself
  }
  return (~ok).sum().item<int64_t>();
}

struct LoadResult {
  int64_t reads = 0, bad = 0, seen_written = 0;
  std::vector<int> exit_codes;
  double seconds = 0;
};

//! starts the producers on `spec`, reads random batches of 256 rows from `reader` until they end
LoadResult run_load(const std::string& spec, const TensorDict& reader, bool whole_rows) {
  LoadResult res;
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int p = 0; p < kProducers; ++p)  // producer p writes rows p, p + 8, p + 16, ...: neighbours interleave
    pids.push_back(run_client({"fill", spec, std::to_string(p), std::to_string(kPerProducer), std::to_string(kProducers)}));
  at::manual_seed(0);
  const auto deadline = t0 + std::chrono::minutes(8);
  auto all_done = [&] {
    for (pid_t& pid : pids) {
      if (pid <= 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        res.exit_codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
        pid = -1;
      }
    }
    for (pid_t pid : pids)
      if (pid > 0) return false;
    return true;
  };
  while (!all_done()) {
    if (Clock::now() > deadline) {
      for (pid_t pid : pids)
        if (pid > 0) ::kill(pid, SIGKILL);
      continue;  // reaped (as killed) on the next round
    }
    const at::Tensor rows = at::randint(kRows, {256}, at::kLong);
    // one read of every leaf (a store's index() is a lazy view: get() per leaf would be separate reads)
    TensorDict part = reader.index({rows}).to_tensordict();
    res.bad += bad_rows(part, rows, whole_rows);
    res.seen_written += part.get("id").eq(rows).sum().item<int64_t>();
    ++res.reads;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a reader beside the producers, not a flood
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

void check_all_rows(const TensorDict& all) {
  const at::Tensor r = at::arange(kRows);
  BOOST_TEST(all.get("id").equal(r));
  BOOST_TEST(all.get("sum").equal(r.to(at::kDouble) * 8));
  BOOST_TEST(all.get("obs").equal(r.to(at::kFloat).unsqueeze(1).expand({kRows, 8})));
}

void report(const char* what, const LoadResult& res) {
  BOOST_TEST(res.exit_codes == std::vector<int>(kProducers, 0));
  BOOST_TEST(res.bad == 0);
  BOOST_TEST_MESSAGE(what << ": " << kRows << " rows by " << kProducers << " processes in " << res.seconds << " s ("
                          << static_cast<int64_t>(kRows / res.seconds) << " rows/s incl. process start), "
                          << res.reads << " concurrent reads of 256 rows, " << res.seen_written
                          << " written rows seen while filling");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(load)

BOOST_AUTO_TEST_CASE(eight_producers_fill_a_memmap_buffer) {
  TempDir dir("load-memmap");
  TensorDict buf = TensorDict::from_schema(schema(), {kRows}, "memmap", MemmapOptions().prefix(dir / "buf"));
  const LoadResult res = run_load(StorageSpec::of(buf).dump(), buf, false);
  report("memmap", res);
  check_all_rows(TensorDict::load_memmap(dir / "buf"));
}

BOOST_AUTO_TEST_CASE(eight_producers_fill_a_shared_buffer) {
  TensorDict buf = TensorDict::from_schema(schema(), {kRows}, "shared");
  const LoadResult res = run_load(StorageSpec::of(buf).dump(), buf, false);
  report("shared", res);
  check_all_rows(buf.clone());
}

BOOST_AUTO_TEST_CASE(eight_producers_fill_a_redis_store) {
  testutil::RedisServer server;
  TensorDictStore buf = TensorDictStore::from_schema(schema(), {kRows}, RedisOptions().port(server.port()));
  const LoadResult res = run_load(StorageSpec::of(buf).dump(), buf, true);
  report("redis", res);
  check_all_rows(TensorDictStore::from_store(buf.td_id(), RedisOptions().port(server.port())).to_tensordict());
}

BOOST_AUTO_TEST_SUITE_END()
