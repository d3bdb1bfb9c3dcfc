//! concurrent_fill: many producer processes fill rows of ONE preallocated buffer (replay buffers, rollout
//! storage, dataset building). The parent preallocates the buffer with from_schema (a memmap directory, then
//! shared memory), forks the writers before any thread exists, and each writer does `buf.index_put_({i},
//! sample)` for its own rows: memmap writers use the mapping they inherited, shared-memory writers reopen the
//! buffer from its handle (what an unrelated process would do). The parent then checks every row: the values
//! encode (writer, row), so a lost or torn row is caught.
//! Run: build/examples/concurrent_fill [rows=65536] [writers=4]; exits 1 if a row is wrong.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <tensordict/tensordict.hpp>

using namespace tensordict;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kMaxRows = 65536;  // code * 16 + 15 stays exact in float32 (< 2^24)
constexpr int kMaxWriters = 15;

Schema transition_schema() {
  return Schema{{"obs", {{16}, at::kFloat}},
                {"action", {{}, at::kLong}},
                {{"next", "obs"}, {{16}, at::kFloat}},
                {{"next", "reward"}, {{}, at::kFloat}}};
}

//! (writer, row) -> one integer that every field of the row carries
int64_t code_of(int writer, int64_t row) { return writer * kMaxRows + row; }

//! one writer: a sample TensorDict allocated once, refilled through raw pointers, written row by row
void write_rows(TensorDict buf, int writer, int writers) {
  at::Tensor obs = at::empty({16}), action = at::empty({}, at::kLong), next_obs = at::empty({16}),
             reward = at::empty({});
  TensorDict sample(Dict{{"obs", obs}, {"action", action}, {"next", Dict{{"obs", next_obs}, {"reward", reward}}}}, {});
  float* o = obs.data_ptr<float>();
  float* no = next_obs.data_ptr<float>();
  for (int64_t i = writer; i < buf.size(0); i += writers) {
    const int64_t c = code_of(writer, i);
    for (int k = 0; k < 16; ++k) {
      o[k] = static_cast<float>(c * 16 + k);
      no[k] = -o[k];
    }
    *action.data_ptr<int64_t>() = c;
    *reward.data_ptr<float>() = static_cast<float>(c) + 0.5f;
    buf.index_put_({i}, sample);
  }
}

//! number of rows whose fields are not exactly (writer i % writers, row i)
int64_t bad_rows(const TensorDict& buf, int writers) {
  at::Tensor obs = buf.get("obs").contiguous(), act = buf.get("action").contiguous(),
             nobs = buf.get({"next", "obs"}).contiguous(), rew = buf.get({"next", "reward"}).contiguous();
  const float* o = obs.data_ptr<float>();
  const int64_t* a = act.data_ptr<int64_t>();
  const float* no = nobs.data_ptr<float>();
  const float* r = rew.data_ptr<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < buf.size(0); ++i) {
    const int64_t c = code_of(static_cast<int>(i % writers), i);
    bool ok = a[i] == c && r[i] == static_cast<float>(c) + 0.5f;
    for (int k = 0; k < 16; ++k) {
      ok &= o[i * 16 + k] == static_cast<float>(c * 16 + k);
      ok &= no[i * 16 + k] == -static_cast<float>(c * 16 + k);
    }
    bad += !ok;
  }
  return bad;
}

struct Result {
  double seconds = 0;        //!< first fork to last exit
  double write_seconds = 0;  //!< first writer's first row to last writer's last row (no fork/exit cost)
  int64_t bad = 0;
  bool children_ok = true;
};

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

//! forks `writers` processes that fill buf (reopened from `handle` when given), waits, verifies
Result fill(const TensorDict& buf, int writers, const std::string& handle) {
  Result res;
  // per writer: [start, end] of its writing, in steady_clock seconds (system-wide, comparable across processes)
  auto* times = static_cast<double*>(
      ::mmap(nullptr, sizeof(double) * 2 * kMaxWriters, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (times == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::fflush(stdout);
  auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int w = 0; w < writers; ++w) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid == 0) {
      int rc = 0;
      try {
        TensorDict mine = handle.empty() ? buf : tensordict::from_share_handle(handle);
        times[2 * w] = now_s();
        write_rows(mine, w, writers);
        times[2 * w + 1] = now_s();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d: %s\n", w, e.what());
        rc = 2;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    res.children_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  double first = times[0], last = times[1];
  for (int w = 1; w < writers; ++w) {
    first = std::min(first, times[2 * w]);
    last = std::max(last, times[2 * w + 1]);
  }
  res.write_seconds = last - first;
  ::munmap(times, sizeof(double) * 2 * kMaxWriters);
  res.bad = bad_rows(buf, writers);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : kMaxRows;
  const int writers = argc > 2 ? std::atoi(argv[2]) : 4;
  if (rows < 1 || rows > kMaxRows || writers < 1 || writers > kMaxWriters) {
    std::cerr << "usage: concurrent_fill [rows in 1.." << kMaxRows << "] [writers in 1.." << kMaxWriters << "]\n";
    return 2;
  }
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "td-concurrent-fill-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  bool all_ok = true;
  std::cout << "concurrent_fill: " << writers << " writer processes, " << rows
            << " rows of {obs f32[16], action i64, next/obs f32[16], next/reward f32}\n";
  for (const std::string storage : {"memmap", "shared"}) {
    // preallocate: sparse files / fresh shm pages, zero-filled, locked (only in-place writes)
    TensorDict buf = TensorDict::from_schema(transition_schema(), {rows}, storage,
                                             MemmapOptions().prefix(dir + "/buffer"));
    const std::string handle = storage == "shared" ? share_handle(buf) : "";
    Result r = fill(buf, writers, handle);
    int64_t bad_reloaded = 0;
    if (storage == "memmap") bad_reloaded = bad_rows(TensorDict::load_memmap(dir + "/buffer"), writers);
    const bool ok = r.children_ok && r.bad == 0 && bad_reloaded == 0;
    all_ok &= ok;
    std::cout << "  " << std::setw(6) << storage << ": " << std::fixed << std::setprecision(1)
              << r.seconds * 1000 << " ms fork to last exit (" << std::setprecision(0) << rows / r.seconds
              << " rows/s), " << std::setprecision(1) << r.write_seconds * 1000 << " ms writing ("
              << std::setprecision(0) << rows / r.write_seconds << " rows/s), " << (storage == "memmap" ? "mapping inherited" : "reopened from share_handle()")
              << ", verification " << (ok ? "OK" : "FAILED") << " (" << r.bad << " bad rows"
              << (storage == "memmap" ? ", " + std::to_string(bad_reloaded) + " after load_memmap" : "") << ")\n";
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::cout << (all_ok ? "all rows verified" : "VERIFICATION FAILED") << "\n";
  return all_ok ? 0 : 1;
}
