// td.map with worker PROCESSES (MapOptions().worker_processes(n)): named functions, memmap/shared storage
// handles, errors, a worker killed midway, validation before any process starts, no leftover processes.
// The worker executable is td_map_worker (tests/api/map_worker_main.cpp), path given by TD_MAP_WORKER_EXE.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "process_util.hpp"
#include "redis_server.hpp"

#include "api/map_process_fns.hpp"
#include "engine/zoo.hpp"
#include "tensordict/tensordict.hpp"

#ifndef TD_MAP_WORKER_EXE
#error "TD_MAP_WORKER_EXE (the path of td_map_worker) must be defined"
#endif

using namespace tensordict;
using zoo::message_of;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

using testutil::children;

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("td_map_process_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string sub(const std::string& name) const { return (path / name).string(); }
};

//! batch [n]: "x" [n, 8] f32, "idx" [n] i64 = row, "nested" {"z": [n, 3] f32}
TensorDict dataset(int64_t n) {
  auto gen = at::detail::createCPUGenerator(11);
  TensorDict nested({{"z", at::randn({n, 3}, gen)}}, {n});
  return TensorDict({{"x", at::randn({n, 8}, gen)}, {"idx", at::arange(n)}, {"nested", nested}}, {n});
}

MapOptions procs(int64_t n) { return MapOptions().worker_processes(n).worker_executable(TD_MAP_WORKER_EXE); }

struct Fixture {
  Fixture() {
    map_process_test::register_fns();
    BOOST_REQUIRE(children().empty());
  }
  ~Fixture() { BOOST_CHECK_MESSAGE(children().empty(), "worker processes survived the map"); }
  Engine engine;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(map_process)

BOOST_FIXTURE_TEST_CASE(memmap_source_and_out_equal_in_process, Fixture) {
  TempDir tmp;
  TensorDict td = dataset(2000);
  td.memmap_(tmp.sub("src"));
  TensorDict out = td.memmap_like(tmp.sub("out"));
  BOOST_REQUIRE(out.is_memmap());
  TensorDict expected = td.map("mp_affine", MapOptions().chunksize(100).out(zeros_like(td)));  // in-process
  BOOST_TEST(expected.equal(map_process_test::affine(td)));
  auto t0 = steady_clock::now();
  TensorDict r = td.map("mp_affine", procs(2).chunksize(100).out(out));
  BOOST_TEST_MESSAGE("2 worker processes, 20 chunks: "
                     << std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count() << " ms");
  BOOST_TEST(!r.defined());  // written in place, as in-process with a memmap out
  BOOST_TEST(out.equal(expected));
  BOOST_TEST(children().empty());
  // the files hold it too
  BOOST_TEST(TensorDict::load_memmap(tmp.sub("out")).equal(expected));
}

BOOST_FIXTURE_TEST_CASE(h5_source_read_by_worker_processes, Fixture) {
  // the workers reopen the HDF5 file read-only by its storage spec; the caller holds it open read-only too
  TempDir tmp;
  TensorDict td = dataset(600);
  PersistentTensorDict::from_dict(td, tmp.sub("src.h5")).close();
  PersistentTensorDict src = PersistentTensorDict::from_h5(tmp.sub("src.h5"), "r");
  TensorDict expected = map_process_test::affine(td);
  TensorDict out = td.memmap_like(tmp.sub("out"));
  TensorDict r = src.map("mp_affine", procs(2).chunksize(100).out(out));
  BOOST_TEST(!r.defined());
  BOOST_TEST(out.equal(expected));
  // in-process workers read their chunks through the file's actor and write into an HDF5 out
  PersistentTensorDict h5out = PersistentTensorDict::from_dict(zeros_like(td), tmp.sub("out.h5"));
  src.map("mp_affine", MapOptions().num_workers(2).chunksize(100).out(h5out));
  BOOST_TEST(h5out.to_tensordict().equal(expected));
  BOOST_TEST(children().empty());
}

BOOST_FIXTURE_TEST_CASE(redis_source_read_by_worker_processes, Fixture) {
  // the workers reconnect to the store by its storage spec (host, port, db, prefix, td_id)
  testutil::RedisServer server;
  TempDir tmp;
  TensorDict td = dataset(600);
  TensorDictStore src = TensorDictStore::from_tensordict(td, RedisOptions().port(server.port()));
  TensorDict expected = map_process_test::affine(td);
  TensorDict out = td.memmap_like(tmp.sub("out"));
  TensorDict r = src.map("mp_affine", procs(2).chunksize(100).out(out));
  BOOST_TEST(!r.defined());
  BOOST_TEST(out.equal(expected));
}  // (the redis-server child stops here, before the fixture counts the children left)

BOOST_FIXTURE_TEST_CASE(shared_source_and_out, Fixture) {
  TensorDict td = dataset(2000);
  td.share_memory_();
  TensorDict expected = map_process_test::affine(td);
  for (auto opts : {procs(2), procs(2).chunksize(0).dim(0), procs(2).chunksize(333)}) {
    TensorDict out = zeros_like(td);
    out.share_memory_();
    TensorDict r = td.map("mp_affine", opts.out(out));
    BOOST_TEST(!r.defined());
    BOOST_TEST(out.equal(expected));
  }
}

BOOST_FIXTURE_TEST_CASE(mixed_in_process_and_process_workers, Fixture) {
  TempDir tmp;
  TensorDict td = dataset(600);
  td.memmap_(tmp.sub("src"));
  TensorDict out = TensorDict::from_schema({{"w", {{}, at::kLong}}, {"seed", {{}, at::kLong}}}, {600}, "shared");
  // 3 workers: worker 0 in-process, workers 1 and 2 are processes; worker 0 waits until a process has
  // written a chunk (mixed_out), however slowly the processes start
  map_process_test::mixed_out() = &out;
  struct Reset {
    ~Reset() { map_process_test::mixed_out() = nullptr; }
  } reset;
  td.map("mp_context", procs(2).num_workers(3).chunksize(4).seed(40).out(out));  // 150 chunks of 20 ms
  auto w = out.get("w");
  BOOST_TEST((w >= 0).all().item<bool>());
  BOOST_TEST((w <= 2).all().item<bool>());
  BOOST_TEST(at::equal(out.get("seed"), w + 40));
  BOOST_TEST((w >= 1).any().item<bool>(), "the worker processes did some chunks");
}

BOOST_FIXTURE_TEST_CASE(worker_error_same_type_and_message, Fixture) {
  TempDir tmp;
  TensorDict td = dataset(2000);
  td.memmap_(tmp.sub("src"));
  TensorDict out = td.memmap_like(tmp.sub("out"));
  auto t0 = steady_clock::now();
  std::string m = message_of<ValueError>([&] { td.map("mp_fail_row_500", procs(2).chunksize(100).out(out)); });
  BOOST_TEST(m == "ValueError: row 500 is poisoned");
  BOOST_CHECK(steady_clock::now() - t0 < seconds(20));
  BOOST_TEST(children().empty());
}

BOOST_FIXTURE_TEST_CASE(worker_error_code_crosses_processes_verbatim, Fixture) {
  // the code and the bare message cross the middleman: no prefix is parsed back out of the message
  TempDir tmp;
  TensorDict td = dataset(1000);
  td.memmap_(tmp.sub("src"));
  TensorDict out = td.memmap_like(tmp.sub("out"));
  std::string m =
      message_of<NotImplementedError>([&] { td.map("mp_fail_prefixed", procs(2).chunksize(100).out(out)); });
  BOOST_TEST(m == "NotImplementedError: KeyError: row 500 is not a key error");
  BOOST_TEST(children().empty());
}

BOOST_FIXTURE_TEST_CASE(worker_killed_midway_chunks_are_reassigned, Fixture) {
  TempDir tmp;
  TensorDict td = dataset(2000);
  td.memmap_(tmp.sub("src"));
  TensorDict out = td.memmap_like(tmp.sub("out"));
  auto t0 = steady_clock::now();
  TensorDict r = td.map("mp_suicide", procs(2).chunksize(50).out(out));  // worker 1 dies on its 2nd chunk
  BOOST_CHECK(steady_clock::now() - t0 < seconds(30));
  BOOST_TEST(out.equal(map_process_test::affine(td)));
  BOOST_TEST(children().empty());
}

BOOST_FIXTURE_TEST_CASE(worker_sigkilled_from_outside, Fixture) {
  TensorDict td = dataset(2000);
  td.share_memory_();
  TensorDict out = zeros_like(td);
  out.share_memory_();
  std::atomic<bool> killed{false};
  std::atomic<bool> stop{false};
  std::thread killer([&] {
    // once both workers run and the first results are in out, SIGKILL one of them
    const auto deadline = steady_clock::now() + seconds(30);
    while (!stop && steady_clock::now() < deadline) {
      auto kids = children();
      if (kids.size() == 2 && (out.get("idx") != 0).any().item<bool>()) {
        ::kill(kids.back(), SIGKILL);
        killed = true;
        return;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  auto t0 = steady_clock::now();
  try {
    td.map("mp_slow", procs(2).chunksize(20).out(out));  // 100 chunks of 40 ms: ~2 s on 2 workers
  } catch (...) {
    stop = true;
    killer.join();
    throw;
  }
  stop = true;
  killer.join();
  BOOST_TEST(killed.load(), "the killer thread found the workers");
  BOOST_CHECK(steady_clock::now() - t0 < seconds(40));
  BOOST_TEST(out.equal(map_process_test::affine(td)));
}

BOOST_FIXTURE_TEST_CASE(worker_killed_at_each_stage_chunks_are_reassigned, Fixture) {
  // TD_FAULT_MAP_WORKER (actors/src/process_workers.cpp): worker 1 SIGKILLs itself once connected, once its job
  // is open, or after it wrote its first chunk into out but before it said so; the other finishes the map
  // 60 chunks of 40 ms (2.4 s of work): worker 1 starts and takes a job before worker 0 could finish alone, even
  // on a loaded machine under ASan (30 chunks were not always enough there)
  TempDir tmp;
  TensorDict td = dataset(1200);
  td.memmap_(tmp.sub("src"));
  for (const char* stage : {"hello", "job", "reply"}) {
    TensorDict out = td.memmap_like(tmp.sub(std::string("out-") + stage));
    const std::string marker = tmp.sub(std::string("died-") + stage);
    ::setenv("TD_FAULT_MAP_WORKER", (std::string(stage) + "@1@" + marker).c_str(), 1);
    auto t0 = steady_clock::now();
    std::string error;
    try {
      td.map("mp_slow", procs(2).chunksize(20).out(out));  // both workers take part
    } catch (const std::exception& e) {
      error = e.what();
    }
    ::unsetenv("TD_FAULT_MAP_WORKER");
    BOOST_TEST(error.empty(), stage << ": " << error);
    BOOST_TEST(std::filesystem::exists(marker), stage << ": worker 1 did not reach the stage");
    BOOST_CHECK(steady_clock::now() - t0 < seconds(60));
    BOOST_TEST(out.equal(map_process_test::affine(td)), stage);
    BOOST_TEST(children().empty(), stage);
  }
}

BOOST_FIXTURE_TEST_CASE(every_worker_dies_is_a_backend_error, Fixture) {
  TempDir tmp;
  TensorDict td = dataset(200);
  td.memmap_(tmp.sub("src"));
  TensorDict out = td.memmap_like(tmp.sub("out"));
  auto t0 = steady_clock::now();
  std::string m = message_of<BackendError>([&] { td.map("mp_die", procs(2).chunksize(10).out(out)); });
  BOOST_TEST(m.find("every worker is gone") != std::string::npos, m);
  // the exit status when the child was reaped in time ("was killed by signal 9"), else "disconnected"
  BOOST_TEST((m.find("signal 9") != std::string::npos || m.find("disconnected") != std::string::npos), m);
  BOOST_CHECK(steady_clock::now() - t0 < seconds(20));
}

BOOST_FIXTURE_TEST_CASE(executable_that_is_not_a_worker, Fixture) {
  TensorDict td = dataset(100);
  td.share_memory_();
  TensorDict out = zeros_like(td);
  out.share_memory_();
  // /bin/true never connects: it exits, the coordinator sees it and fails the map at once
  auto t0 = steady_clock::now();
  std::string m = message_of<BackendError>(
      [&] { td.map("mp_affine", MapOptions().worker_processes(2).worker_executable("/bin/true").out(out)); });
  BOOST_TEST(m.find("exited with status 0") != std::string::npos, m);
  BOOST_CHECK(steady_clock::now() - t0 < seconds(10));
}

BOOST_FIXTURE_TEST_CASE(validation_before_any_process_starts, Fixture) {
  TempDir tmp;
  TensorDict plain = dataset(100);
  TensorDict mm = plain.memmap(tmp.sub("src"));
  TensorDict mm_out = plain.memmap_like(tmp.sub("out"));
  // unknown name: KeyError naming it (in-process as well)
  std::string m = message_of<KeyError>([&] { mm.map("no_such_fn", procs(2).out(mm_out)); });
  BOOST_TEST(m.find("no_such_fn") != std::string::npos, m);
  BOOST_CHECK_THROW(mm.map("no_such_fn", MapOptions()), KeyError);
  // out: missing or in memory
  m = message_of<ValueError>([&] { mm.map("mp_affine", procs(2)); });
  BOOST_TEST(m.find("out") != std::string::npos, m);
  m = message_of<ValueError>([&] { mm.map("mp_affine", procs(2).out(zeros_like(plain))); });
  BOOST_TEST(m.find("memmap or shared out") != std::string::npos, m);
  // the source must be reachable from another process
  m = message_of<ValueError>([&] { plain.map("mp_affine", procs(2).out(mm_out)); });
  BOOST_TEST(m.find("the source") != std::string::npos, m);
  // counts, closures, map_iter, executable
  BOOST_CHECK_THROW(mm.map("mp_affine", procs(3).num_workers(2).out(mm_out)), ValueError);
  BOOST_CHECK_THROW(mm.map("mp_affine", procs(-1).out(mm_out)), ValueError);
  BOOST_CHECK_THROW(mm.map(map_process_test::affine, procs(2).out(mm_out)), ValueError);
  BOOST_CHECK_THROW(mm.map_iter(map_process_test::affine, procs(2)), ValueError);
  m = message_of<ValueError>([&] {
    mm.map("mp_affine", MapOptions().worker_processes(2).worker_executable("/nonexistent/worker").out(mm_out));
  });
  BOOST_TEST(m.find("/nonexistent/worker") != std::string::npos, m);
  BOOST_TEST(children().empty());
  BOOST_TEST(mm_out.equal(zeros_like(plain)), "nothing was written");
  // named fns run in-process too (worker_processes 0)
  TensorDict r = mm.map("mp_affine", MapOptions().chunksize(7));
  BOOST_TEST(r.equal(map_process_test::affine(plain)));
}

BOOST_AUTO_TEST_SUITE_END()
