// store_fill: many producer PROCESSES fill one buffer through a Store (DESIGN.md: concurrent fill of shared
// buffers). The owner preallocates a memmap buffer with from_schema, opens it as a Store and publishes it on
// 127.0.0.1. K producers (this program again, spawned) connect; each adds a key of its own through the
// owner's store actor ("producer_<k>", one flag per row) and writes its rows of "obs" and "reward" straight
// into the mapping, row by row. The owner then reloads the directory as Python would (load_memmap) and
// checks every row and every key: a lost row or a lost meta.json update is caught.
// Usage: store_fill [--rows N] [--producers K] [--dir DIR] [--keep]; exits 1 if anything is wrong.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <tensordict/tensordict.hpp>

extern char** environ;

using namespace tensordict;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kObs = 8;

//! the values row i gets: obs = i + [0, 1, ..., 7] / 8, reward = i / 2
at::Tensor obs_of(int64_t i) { return at::arange(kObs, at::kFloat) / kObs + static_cast<float>(i); }

int producer(uint16_t port, int64_t k, int64_t producers) {
  Store store = Store::connect("127.0.0.1", port);  // the owner's token: TENSORDICT_STORE_TOKEN
  const int64_t rows = store.batch_size().at(0);
  const std::string key = "producer_" + std::to_string(k);
  store.add_key(key, at::zeros({rows}, at::kByte));  // through the owner's store actor
  TensorDict buf = store.td();                       // this process's mapping, with the new key
  TensorDict row{BatchSize{}};
  for (int64_t i = k; i < rows; i += producers) {
    row.set("obs", obs_of(i));
    row.set("reward", at::scalar_tensor(static_cast<double>(i) / 2, at::kFloat));
    row.set(key, at::scalar_tensor(1, at::kByte));
    buf.index_put_({i}, row);  // straight into the mapping: no actor hop
  }
  store.flush();
  return 0;
}

//! a producer with the store's token in its environment (never on its command line)
pid_t spawn_producer(uint16_t port, int64_t k, int64_t producers, const std::string& token) {
  std::vector<std::string> args = {"/proc/self/exe", "--producer", std::to_string(port), std::to_string(k),
                                   std::to_string(producers)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  std::vector<std::string> env = {"TENSORDICT_STORE_TOKEN=" + token};
  for (char** e = environ; e && *e; ++e)
    if (std::string(*e).rfind("TENSORDICT_STORE_TOKEN=", 0) != 0) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) {
    std::perror("posix_spawn");
    std::exit(1);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--producer") {
    try {
      return producer(static_cast<uint16_t>(std::stoi(argv[2])), std::stoll(argv[3]), std::stoll(argv[4]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "producer %s: %s\n", argv[3], e.what());
      return 3;
    }
  }
  int64_t rows = 20000, producers = 4;
  bool keep = false;
  std::string dir = (std::filesystem::temp_directory_path() / ("td_store_fill_" + std::to_string(::getpid()))).string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) rows = std::stoll(argv[++i]);
    else if (a == "--producers" && i + 1 < argc) producers = std::stoll(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--keep") keep = true;
    else {
      std::fprintf(stderr, "usage: store_fill [--rows N] [--producers K] [--dir DIR] [--keep]\n");
      return 2;
    }
  }
  if (rows <= 0 || producers <= 0 || producers > 64) {
    std::fprintf(stderr, "store_fill: need rows > 0 and 1..64 producers\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  bool ok = true;
  {
    auto t0 = Clock::now();
    Schema schema = {{"obs", {{kObs}, at::kFloat}}, {"reward", {{}, at::kFloat}}};
    TensorDict buf = TensorDict::from_schema(schema, {rows}, "memmap", MemmapOptions().prefix(dir));
    Store store = Store::open(buf);
    const uint16_t port = store.publish();
    std::vector<pid_t> pids;
    for (int64_t k = 0; k < producers; ++k) pids.push_back(spawn_producer(port, k, producers, store.token()));
    for (size_t k = 0; k < pids.size(); ++k) {
      int status = 0;
      ::waitpid(pids[k], &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "store_fill: producer %zu failed (status %d)\n", k, status);
        ok = false;
      }
    }
    const double fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    store.close();
    std::printf("store_fill: %lld rows by %lld producer processes in %.2f s (process start included), %lld keys "
                "added through the store actor (version %lld)\n",
                static_cast<long long>(rows), static_cast<long long>(producers), fill_s,
                static_cast<long long>(producers), static_cast<long long>(store.version()));
  }
  // verify from disk, as another program (or Python's TensorDict.load_memmap) would see it
  TensorDict back = TensorDict::load_memmap(dir);
  at::Tensor i = at::arange(rows, at::kFloat);
  at::Tensor want_obs = i.unsqueeze(1) + at::arange(kObs, at::kFloat).unsqueeze(0) / kObs;
  if (!back.get("obs").equal(want_obs) || !back.get("reward").equal(i / 2)) {
    std::fprintf(stderr, "store_fill: obs/reward rows differ from what the producers wrote\n");
    ok = false;
  }
  for (int64_t k = 0; k < producers; ++k) {
    const std::string key = "producer_" + std::to_string(k);
    if (!back.contains(key)) {
      std::fprintf(stderr, "store_fill: key %s is missing from meta.json\n", key.c_str());
      ok = false;
      continue;
    }
    at::Tensor want = (at::arange(rows, at::kLong) % producers == k).to(at::kByte);
    if (!back.get(key).equal(want)) {
      std::fprintf(stderr, "store_fill: the rows of %s are wrong\n", key.c_str());
      ok = false;
    }
  }
  std::printf("store_fill: %s (%s)\n", ok ? "every row and key verified" : "FAILED", dir.c_str());
  if (!keep) std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
