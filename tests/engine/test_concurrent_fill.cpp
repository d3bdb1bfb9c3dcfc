// Concurrent fill of a preallocated buffer (DESIGN "Who uses it": replay buffers, rollout storage):
// forked writer processes and threads write disjoint rows with buf.index_put_({i}, sample) into a memmap or
// shared buffer from from_schema; every row is verified exactly (values encode (writer, row), so a lost or
// torn row shows). A writer SIGKILLed midway loses nothing that it or the others completed.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "fixtures.hpp"
#include "tensordict/tensor_dict.hpp"
#include "process_util.hpp"
#include "tensordict/shared_storage.hpp"

using namespace tensordict;

namespace {

constexpr int64_t kRows = 4096;
constexpr int kWriters = 4;

Schema fill_schema() {
  return Schema{{"obs", {{16}, at::kFloat}},
                {"action", {{}, at::kLong}},
                {{"next", "obs"}, {{16}, at::kFloat}},
                {{"next", "reward"}, {{}, at::kFloat}}};
}

//! (writer, row) -> one integer, exact in float32 (< 2^24 after * 16 + 15)
int64_t code_of(int writer, int64_t row) { return (writer + 1) * 10000 + row; }

//! a reusable sample (batch []) whose values are rewritten per row through raw pointers
struct Sample {
  TensorDict td;
  float* obs;
  int64_t* action;
  float* next_obs;
  float* reward;
  Sample() {
    at::Tensor o = at::empty({16}, at::kFloat), a = at::empty({}, at::kLong), no = at::empty({16}, at::kFloat),
               r = at::empty({}, at::kFloat);
    td = TensorDict(Dict{{"obs", o}, {"action", a}, {"next", Dict{{"obs", no}, {"reward", r}}}}, {});
    obs = o.data_ptr<float>();
    action = a.data_ptr<int64_t>();
    next_obs = no.data_ptr<float>();
    reward = r.data_ptr<float>();
  }
  void encode(int writer, int64_t row) {
    const int64_t c = code_of(writer, row);
    for (int k = 0; k < 16; ++k) {
      obs[k] = static_cast<float>(c * 16 + k);
      next_obs[k] = -static_cast<float>(c * 16 + k);
    }
    *action = c;
    *reward = static_cast<float>(c) + 0.5f;
  }
};

//! rows of writer w: w, w + N, w + 2N, ... (neighbouring rows belong to different writers)
std::vector<int64_t> rows_of(int writer, int writers = kWriters, int64_t rows = kRows) {
  std::vector<int64_t> out;
  for (int64_t i = writer; i < rows; i += writers) out.push_back(i);
  return out;
}

//! writes `rows` of `writer`; progress (if given) counts completed rows
void write_rows(TensorDict buf, int writer, const std::vector<int64_t>& rows, std::atomic<int64_t>* progress = nullptr,
                unsigned pause_us = 0, int64_t slow_after = -1) {
  Sample s;
  int64_t done = 0;
  for (int64_t i : rows) {
    s.encode(writer, i);
    buf.index_put_({i}, s.td);
    if (progress) progress->fetch_add(1, std::memory_order_release);
    ++done;
    // past slow_after rows a row takes 20 ms: the killer has seconds to strike mid-stream, even on a loaded machine
    if (slow_after >= 0 && done >= slow_after) {
      ::usleep(20000);
    } else if (pause_us) {
      ::usleep(pause_us);
    }
  }
}

//! what a row must look like
enum class Want { Full, Zero, Partial };  // Partial: each field either zero or the writer's (in-flight row)

//! checks every row of buf against want/writer; returns a description of the first problems ("" if none)
std::string verify(const TensorDict& buf, const std::vector<Want>& want, const std::vector<int>& writer) {
  at::Tensor obs = buf.get("obs").contiguous(), act = buf.get("action").contiguous(),
             nobs = buf.get({"next", "obs"}).contiguous(), rew = buf.get({"next", "reward"}).contiguous();
  const float* o = obs.data_ptr<float>();
  const int64_t* a = act.data_ptr<int64_t>();
  const float* no = nobs.data_ptr<float>();
  const float* r = rew.data_ptr<float>();
  std::ostringstream err;
  int problems = 0;
  for (int64_t i = 0; i < buf.size(0); ++i) {
    const int64_t c = code_of(writer[i], i);
    // per field: 0 = zero, 1 = the writer's value for this row, 2 = anything else
    auto vec_state = [&](const float* p, float sign) {
      bool zero = true, mine = true;
      for (int k = 0; k < 16; ++k) {
        zero &= p[k] == 0.f;
        mine &= p[k] == sign * static_cast<float>(c * 16 + k);
      }
      return zero ? 0 : (mine ? 1 : 2);
    };
    int fields[4] = {vec_state(o + i * 16, 1.f), a[i] == 0 ? 0 : (a[i] == c ? 1 : 2), vec_state(no + i * 16, -1.f),
                     r[i] == 0.f ? 0 : (r[i] == static_cast<float>(c) + 0.5f ? 1 : 2)};
    bool ok = true;
    for (int f : fields) {
      if (want[i] == Want::Full) ok &= f == 1;
      if (want[i] == Want::Zero) ok &= f == 0;
      if (want[i] == Want::Partial) ok &= f != 2;
    }
    if (!ok && ++problems <= 5) {
      err << "row " << i << " (writer " << writer[i] << ", want " << static_cast<int>(want[i]) << "): fields "
          << fields[0] << fields[1] << fields[2] << fields[3] << ", action " << a[i] << ", obs[0] " << o[i * 16]
          << "; ";
    }
  }
  if (problems) err << problems << " bad rows";
  return err.str();
}

using testutil::spawn;
using testutil::wait_child;

//! progress counters shared with forked children (anonymous MAP_SHARED page)
struct SharedCounters {
  std::atomic<int64_t>* c;
  SharedCounters() {
    static_assert(std::atomic<int64_t>::is_always_lock_free, "cross-process atomics need lock-free ones");
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    BOOST_REQUIRE(p != MAP_FAILED);
    c = new (p) std::atomic<int64_t>[kWriters]();
  }
  ~SharedCounters() { ::munmap(c, 4096); }
};

//! how a forked writer reaches the buffer
enum class Path { Inherited, Reopened };

//! opens the buffer in a child: the inherited TensorDict, or a fresh one (load_memmap / from_share_handle)
TensorDict child_view(const TensorDict& buf, Path path, const std::string& storage, const std::string& prefix,
                      const std::string& handle) {
  if (path == Path::Inherited) return buf;
  return storage == "memmap" ? TensorDict::load_memmap(prefix) : tensordict::from_share_handle(handle);
}

TensorDict make_buffer(const std::string& storage, const std::string& prefix) {
  return TensorDict::from_schema(fill_schema(), {kRows}, storage, MemmapOptions().prefix(prefix));
}

void run_process_fill(const std::string& storage, Path path) {
  fixtures::TempDir dir("fill");
  const std::string prefix = dir / "buf";
  std::string old_prefix = tensordict::shm_prefix();
  tensordict::set_shm_prefix("tdtest_" + std::to_string(::getpid()) + "_fill_");
  {
    TensorDict buf = make_buffer(storage, prefix);
    const std::string handle = storage == "shared" ? share_handle(buf) : "";
    std::vector<pid_t> pids;
    for (int w = 0; w < kWriters; ++w) {
      pids.push_back(spawn([&, w]() -> int {
        write_rows(child_view(buf, path, storage, prefix, handle), w, rows_of(w));
        return 0;
      }));
    }
    for (pid_t p : pids) BOOST_TEST(wait_child(p) == 0);
    std::vector<Want> want(kRows, Want::Full);
    std::vector<int> writer(kRows);
    for (int64_t i = 0; i < kRows; ++i) writer[i] = static_cast<int>(i % kWriters);
    std::string err = verify(buf, want, writer);
    BOOST_TEST(err.empty(), err);
    if (storage == "memmap") {
      std::string err2 = verify(TensorDict::load_memmap(prefix), want, writer);
      BOOST_TEST(err2.empty(), "reloaded: " << err2);
    }
  }
  tensordict::set_shm_prefix(old_prefix);
}

void run_process_fill_with_kill(const std::string& storage, Path path) {
  fixtures::TempDir dir("fillkill");
  const std::string prefix = dir / "buf";
  std::string old_prefix = tensordict::shm_prefix();
  tensordict::set_shm_prefix("tdtest_" + std::to_string(::getpid()) + "_fillkill_");
  {
    TensorDict buf = make_buffer(storage, prefix);
    const std::string handle = storage == "shared" ? share_handle(buf) : "";
    SharedCounters progress;
    const int victim = 2;
    const int64_t kill_after = 256;  // of the victim's 1024 rows
    std::vector<pid_t> pids;
    for (int w = 0; w < kWriters; ++w) {
      pids.push_back(spawn([&, w]() -> int {
        write_rows(child_view(buf, path, storage, prefix, handle), w, rows_of(w), &progress.c[w],
                   w == victim ? 200 : 0, w == victim ? kill_after : -1);
        if (w == victim) return 7;  // must not finish: it is killed first
        return 0;
      }));
    }
    // kill the victim once it is a quarter through (it writes a row per ~200 us)
    for (int spins = 0; progress.c[victim].load(std::memory_order_acquire) < kill_after && spins < 200000; ++spins) {
      ::usleep(50);
    }
    BOOST_TEST(::kill(pids[victim], SIGKILL) == 0);
    for (int w = 0; w < kWriters; ++w) BOOST_TEST(wait_child(pids[w]) == (w == victim ? -SIGKILL : 0), "writer " << w);
    const int64_t done = progress.c[victim].load(std::memory_order_acquire);
    BOOST_TEST_MESSAGE(storage << ": victim completed " << done << " of " << kRows / kWriters << " rows");
    BOOST_TEST(done >= kill_after);
    BOOST_TEST(done < kRows / kWriters);

    std::vector<Want> want(kRows, Want::Full);
    std::vector<int> writer(kRows);
    for (int64_t i = 0; i < kRows; ++i) writer[i] = static_cast<int>(i % kWriters);
    auto vrows = rows_of(victim);
    for (size_t j = 0; j < vrows.size(); ++j) {
      const auto n = static_cast<size_t>(done);
      want[vrows[j]] = j < n ? Want::Full : (j == n ? Want::Partial : Want::Zero);
    }
    std::string err = verify(buf, want, writer);
    BOOST_TEST(err.empty(), err);
    if (storage == "memmap") {
      TensorDict loaded = TensorDict::load_memmap(prefix);
      BOOST_TEST(loaded.batch_size() == BatchSize{kRows});
      std::string err2 = verify(loaded, want, writer);
      BOOST_TEST(err2.empty(), "reloaded: " << err2);
    }
  }
  tensordict::set_shm_prefix(old_prefix);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(concurrent_fill)

BOOST_AUTO_TEST_CASE(processes_fill_memmap_inherited_mapping) { run_process_fill("memmap", Path::Inherited); }
BOOST_AUTO_TEST_CASE(processes_fill_memmap_reloaded) { run_process_fill("memmap", Path::Reopened); }
BOOST_AUTO_TEST_CASE(processes_fill_shared_inherited_mapping) { run_process_fill("shared", Path::Inherited); }
BOOST_AUTO_TEST_CASE(processes_fill_shared_from_handle) { run_process_fill("shared", Path::Reopened); }

BOOST_AUTO_TEST_CASE(sigkilled_writer_memmap) { run_process_fill_with_kill("memmap", Path::Inherited); }
BOOST_AUTO_TEST_CASE(sigkilled_writer_shared_from_handle) { run_process_fill_with_kill("shared", Path::Reopened); }

BOOST_AUTO_TEST_CASE(threads_fill_one_buffer) {
  fixtures::TempDir dir("fillthreads");
  std::string old_prefix = tensordict::shm_prefix();
  tensordict::set_shm_prefix("tdtest_" + std::to_string(::getpid()) + "_fillthr_");
  for (const std::string storage : {"memmap", "shared"}) {
    BOOST_TEST_CONTEXT(storage) {
      TensorDict buf = make_buffer(storage, dir / "buf");
      std::vector<std::thread> threads;
      for (int w = 0; w < 2; ++w) threads.emplace_back([&, w] { write_rows(buf, w, rows_of(w, 2)); });
      for (auto& t : threads) t.join();
      std::vector<Want> want(kRows, Want::Full);
      std::vector<int> writer(kRows);
      for (int64_t i = 0; i < kRows; ++i) writer[i] = static_cast<int>(i % 2);
      std::string err = verify(buf, want, writer);
      BOOST_TEST(err.empty(), err);
    }
  }
  tensordict::set_shm_prefix(old_prefix);
}

BOOST_AUTO_TEST_CASE(verifier_catches_torn_and_lost_rows) {
  // the checker itself: a torn row (fields from two writers) and a lost row are both reported
  TensorDict buf = make_buffer("", "");
  write_rows(buf, 0, rows_of(0, 1, 8));
  std::vector<Want> want(8, Want::Full);
  std::vector<int> writer(8, 0);
  BOOST_TEST(verify(buf.index({at::indexing::Slice(0, 8)}), want, writer).empty());
  Sample s;
  s.encode(1, 3);
  buf.set_at_({"next", "obs"}, s.td.get({"next", "obs"}), {3});  // torn: next/obs from writer 1
  buf.set_at_("action", at::zeros({}, at::kLong), {5});          // lost field
  std::string err = verify(buf.index({at::indexing::Slice(0, 8)}), want, writer);
  BOOST_TEST(err.find("row 3 ") != std::string::npos, err);
  BOOST_TEST(err.find("row 5 ") != std::string::npos, err);
  BOOST_TEST(err.find("2 bad rows") != std::string::npos, err);
}

BOOST_AUTO_TEST_SUITE_END()
