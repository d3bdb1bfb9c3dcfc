// td_loader_worker: the worker executable of the loader tests (register the named transforms, then
// run_worker_if_requested first thing), and a trainer the tests SIGKILL:
//   td_loader_worker trainer <memmap dir>        2 worker processes attach, 2 batches held, "ready <pids>"
//   td_loader_worker stall-trainer <memmap dir>  its worker processes never attach (the ring stays named)
//   td_loader_worker map-parent <memmap dir> <out dir>  td.map with 2 worker processes whose fn never returns
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "api/loader_fns.hpp"
#include "tensordict/shared_storage.hpp"

namespace {

bool named_segment(const std::string& prefix) {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

int run_trainer(const char* dir, bool stall) {
  using namespace tensordict;
  TensorDict td = TensorDict::load_memmap(dir);
  DataLoader loader(td, LoaderOptions().batch_size(4).worker_processes(2).persistent_workers(true).seed(1));
  if (stall) {
    std::printf("started\n");
    std::fflush(stdout);
    loader.next();  // never returns before the test kills this process (the workers never attach)
    return 3;
  }
  std::optional<TensorDict> a = loader.next();
  std::optional<TensorDict> b = loader.next();
  // the ring's name goes once every worker attached and the loader saw it (next() checks): bounded
  const std::string mine = DataLoader::shm_prefix() + std::to_string(::getpid()) + "_";
  std::optional<TensorDict> c;
  for (int i = 0; i < 3000; ++i) {
    c = loader.next();
    if (!named_segment(mine)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<pid_t> pids = loader.worker_pids();
  std::printf("ready");
  for (pid_t p : pids) std::printf(" %d", static_cast<int>(p));
  std::printf("\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // the test SIGKILLs this process
  return a && b && c ? 0 : 4;
}

//! td.map over the directory with 2 worker processes running ld_stuck_always (each says so with a file when
//! TD_LOADER_TEST_STUCK_DIR is set): never returns before the test SIGKILLs this process
int run_map_parent(const char* dir, const char* out_dir) {
  using namespace tensordict;
  Engine engine;
  TensorDict td = TensorDict::load_memmap(dir);
  TensorDict out = td.memmap_like(out_dir);
  std::printf("started\n");
  std::fflush(stdout);
  td.map("ld_stuck_always", MapOptions().worker_processes(2).num_workers(2).chunksize(10).out(out));
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  loader_test::register_fns();
  if (std::getenv("TD_LOADER_TEST_STALL") && std::getenv(tensordict::loader_detail::kLoaderWorkerEnv)) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // a worker that never attaches (dies with its trainer)
    return 1;
  }
  tensordict::run_worker_if_requested(argc, argv);
  if (argc >= 3 && std::strcmp(argv[1], "trainer") == 0) return run_trainer(argv[2], false);
  if (argc >= 3 && std::strcmp(argv[1], "stall-trainer") == 0) {
    ::setenv("TD_LOADER_TEST_STALL", "1", 1);
    return run_trainer(argv[2], true);
  }
  if (argc >= 4 && std::strcmp(argv[1], "map-parent") == 0) return run_map_parent(argv[2], argv[3]);
  std::fprintf(stderr, "td_loader_worker: a worker process for the loader tests (started by DataLoader)\n");
  return 1;
}
