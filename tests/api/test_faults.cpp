// Fault injection (issue 14): writers SIGKILLed in the middle of a save or a meta.json rewrite, the file-size
// limit and a full disk (a small tmpfs in a private mount namespace) during a save and during HDF5 writes,
// redis-server killed and restarted during a fill, a full /dev/shm (shared-memory segments and the DataLoader's
// ring). What
// each must keep: the directory loads as the old or the new state, never a mix; a typed error and the earlier
// data intact; no row reported written is lost.
// Children are forked (fork only: they use the engine layer, never the actor system) and assert nothing: they
// report through exit codes and files; the test's own thread checks.
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <ATen/Parallel.h>
#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "process_util.hpp"
#include "redis_server.hpp"
#include "tensordict/backends/shm.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using fixtures::TempDir;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

//! 40 leaves of 64k float32 (10 MiB), a nested level and a string, every value `v`; `extra` adds a key the
//! other state lacks, so that a mix of two states shows in the keys as well as the values
TensorDict state(float v, bool extra) {
  TensorDict td(BatchSize{256});
  for (int i = 0; i < 40; ++i) td.set("leaf" + std::to_string(i), at::full({256, 256}, v));
  td.set(NestedKey{"nested", "x"}, at::full({256, 16}, v));
  td.set("label", std::string(v == 1.0f ? "old" : "new"));
  td.set(extra ? "only_new" : "only_old", at::full({256}, v));
  return td;
}

//! "old", "new", or what is wrong with the directory (a mix, a torn leaf, a load error)
std::string state_of(const std::string& prefix) {
  TensorDict td;
  try {
    td = TensorDict::load_memmap(prefix);
  } catch (const std::exception& e) {
    return std::string("load failed: ") + e.what();
  }
  const bool is_new = td.contains("only_new");
  if (is_new == td.contains("only_old")) return "mixed keys";
  const float v = is_new ? 2.0f : 1.0f;
  for (const auto& k : td.keys(KeysOptions().include_nested(true).leaves_only(true))) {
    if (k == NestedKey("label")) {
      if (td.get_non_tensor("label").as_string() != (is_new ? "new" : "old")) return "mixed label";
      continue;
    }
    if (!td.get(k).eq(v).all().item<bool>()) return "mixed values at " + k.repr();
  }
  return is_new ? "new" : "old";
}

//! staging directories a save left beside `prefix`
int staging_dirs(const std::string& prefix) {
  int n = 0;
  const std::string tag = "." + fs::path(prefix).filename().string() + ".td-stage.";
  for (const auto& de : fs::directory_iterator(fs::path(prefix).parent_path()))
    if (de.path().filename().string().compare(0, tag.size(), tag) == 0) ++n;
  return n;
}

//! a forked child that signals on `go` (a pipe) then runs fn; the parent waits for the signal
struct Child {
  pid_t pid = -1;
  Clock::time_point started;
};

Child start_child(const std::function<void()>& fn) {
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);
  Child c;
  c.pid = testutil::spawn([&]() -> int {
    ::close(fds[0]);
    at::set_num_threads(1);  // no OpenMP pool in a forked child
    char b = 1;
    if (::write(fds[1], &b, 1) != 1) return 97;
    fn();
    return 0;
  });
  ::close(fds[1]);
  char b = 0;
  BOOST_REQUIRE(::read(fds[0], &b, 1) == 1);
  c.started = Clock::now();
  ::close(fds[0]);
  return c;
}


//! fn in a forked child (one intra-op thread) over a `kib` KiB tmpfs mounted at `dir` (testutil::spawn_on_small_fs)
pid_t spawn_on_small_fs(const std::string& dir, int kib, const std::function<int()>& fn) {
  return testutil::spawn_on_small_fs(dir, kib, [&] {
    at::set_num_threads(1);
    return fn();
  });
}

//! runs `action` in a forked child whose files may not grow past `limit` bytes (SIGXFSZ ignored, so writes
//! fail with EFBIG); returns the child's BackendError text, or "no error" / "other: ..." (the test asserts)
std::string backend_error_under_file_limit(const std::string& report, rlim_t limit, const std::function<void()>& action) {
  pid_t pid = testutil::spawn([&]() -> int {
    at::set_num_threads(1);
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 96;
    std::ofstream out(report);
    try {
      action();
      out << "no error";
    } catch (const BackendError& e) {
      out << e.what();
    } catch (const std::exception& e) {
      out << "other: " << e.what();
    }
    return 0;
  });
  const int rc = testutil::wait_child(pid);
  std::ifstream in(report);
  std::string what((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return rc == 0 ? what : "child " + testutil::describe_child(rc) + ": " + what;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(faults)

BOOST_AUTO_TEST_CASE(memmap_save_killed_at_any_moment_loads_old_or_new) {
  TempDir dir("fault-save");
  const std::string prefix = dir / "data";
  state(1.0f, false).memmap(prefix);
  BOOST_TEST(state_of(prefix) == "old");
  TensorDict fresh = state(2.0f, true);

  // how long a whole save takes here, in a child like the victims
  Child timed = start_child([&] { TensorDict(fresh).memmap(dir / "timing"); });
  const int timed_rc = testutil::wait_child(timed.pid);
  BOOST_TEST(timed_rc == 0, "the timed save's child " << testutil::describe_child(timed_rc));
  const auto full = Clock::now() - timed.started;
  BOOST_TEST_MESSAGE("one save: " << std::chrono::duration_cast<std::chrono::microseconds>(full).count() << " us");

  // kill points spread over the save (and a little past it); each victim saves the new state over the old
  int olds = 0, news = 0;
  for (int k = 0; k <= 12; ++k) {
    if (state_of(prefix) == "new") state(1.0f, false).memmap(prefix);  // back to the old state
    BOOST_REQUIRE(state_of(prefix) == "old");
    Child victim = start_child([&] { TensorDict(fresh).memmap(prefix); });
    std::this_thread::sleep_until(victim.started + full * k / 10);
    ::kill(victim.pid, SIGKILL);
    const int rc = testutil::wait_child(victim.pid);
    BOOST_TEST((rc == -SIGKILL || rc == 0), "victim " << k << " " << testutil::describe_child(rc));
    const std::string s = state_of(prefix);
    BOOST_TEST((s == "old" || s == "new"), "kill point " << k << ": " << s);
    (s == "old" ? olds : news) += 1;
  }
  BOOST_TEST_MESSAGE("after the kills: " << olds << " old, " << news << " new");
  // the next save removes what dead writers left beside the prefix
  state(2.0f, true).memmap(prefix);
  BOOST_TEST(state_of(prefix) == "new");
  BOOST_TEST(staging_dirs(prefix) == 0);
}

BOOST_AUTO_TEST_CASE(staged_save_keeps_other_files_and_live_mappings) {
  TempDir dir("fault-stage");
  const std::string prefix = dir / "data";
  TensorDict td = state(1.0f, false).memmap(prefix);
  { std::ofstream(prefix + "/NOTES.txt") << "mine\n"; }
  // re-saving the same TensorDict in place reuses its files: its mappings stay valid and name the new files
  td.memmap_(prefix, MemmapOptions().existsok(true));
  td.get("leaf0").fill_(3.0f);
  TensorDict back = TensorDict::load_memmap(prefix);
  BOOST_TEST(back.get("leaf0").eq(3.0f).all().item<bool>());
  BOOST_TEST(fs::exists(prefix + "/NOTES.txt"));
  // a save of another state over it: stale leaves stay on disk as an in-place save leaves them, meta.json wins
  state(2.0f, true).memmap(prefix);
  BOOST_TEST(state_of(prefix) == "new");
  BOOST_TEST(fs::exists(prefix + "/NOTES.txt"));
  BOOST_TEST(fs::exists(prefix + "/only_old.memmap"));
  BOOST_TEST(staging_dirs(prefix) == 0);
  // the first TensorDict still reads its own (old) data
  BOOST_TEST(td.get("leaf1").eq(1.0f).all().item<bool>());
  // re-saving it there writes its data (its leaves' file names now name the other state's files)
  td.memmap_(prefix, MemmapOptions().existsok(true));
  TensorDict again = TensorDict::load_memmap(prefix);
  BOOST_TEST(again.contains("only_old"));
  BOOST_TEST(!again.contains("only_new"));
  BOOST_TEST(again.get("leaf0").eq(3.0f).all().item<bool>());
  BOOST_TEST(again.get("leaf1").eq(1.0f).all().item<bool>());
  BOOST_TEST(again.get(NestedKey{"nested", "x"}).eq(1.0f).all().item<bool>());
  // views of those leaves (part of each file) saved over the same prefix: written from the files they map
  TensorDict part = td.index({at::indexing::Slice(0, 128)});
  part.memmap_(prefix, MemmapOptions().existsok(true));
  TensorDict half = TensorDict::load_memmap(prefix);
  BOOST_TEST(half.batch_size() == BatchSize({128}));
  BOOST_TEST(half.get("leaf1").eq(1.0f).all().item<bool>());
  BOOST_TEST(half.get("leaf0").eq(3.0f).all().item<bool>());
  BOOST_TEST(staging_dirs(prefix) == 0);
}

BOOST_AUTO_TEST_CASE(meta_json_rewrite_killed_loads_old_or_new) {
  TempDir dir("fault-meta");
  const std::string prefix = dir / "grow";
  TensorDict(BatchSize{64}).memmap_(prefix);
  // a child adds keys k0, k1, ... (each: a new leaf file, then meta.json rewritten) until it is killed
  for (int round = 0; round < 6; ++round) {
    const std::string p = prefix + std::to_string(round);
    TensorDict(BatchSize{64}).memmap_(p);
    Child victim = start_child([&] {
      TensorDict td = TensorDict::load_memmap(p);
      for (int i = 0; i < 100000; ++i) make_memmap(td, "k" + std::to_string(i), {64, 32}, at::kFloat);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 15 * round));
    ::kill(victim.pid, SIGKILL);
    const int rc = testutil::wait_child(victim.pid);
    BOOST_TEST(rc == -SIGKILL, "victim " << testutil::describe_child(rc));
    TensorDict back;
    BOOST_REQUIRE_NO_THROW(back = TensorDict::load_memmap(p));
    const auto keys = back.keys();
    // keys k0..k(n-1), each whole
    for (size_t i = 0; i < keys.size(); ++i) {
      BOOST_TEST(back.contains("k" + std::to_string(i)), "round " << round << ": k" << i << " missing");
    }
    for (const auto& k : keys) BOOST_TEST(back.get(k).sizes().vec() == std::vector<int64_t>({64, 32}));
    BOOST_TEST_MESSAGE("round " << round << ": " << keys.size() << " keys survived the kill");
  }
}

BOOST_AUTO_TEST_CASE(save_over_the_file_size_limit_fails_typed_and_keeps_the_old_save) {
  TempDir dir("fault-fsize");
  const std::string prefix = dir / "data";
  state(1.0f, false).memmap(prefix);
  TensorDict fresh = state(2.0f, true);
  // a child whose files may not grow past 64 KiB (a leaf is 256 KiB)
  const std::string what = backend_error_under_file_limit(dir / "report", 64 * 1024, [&] { fresh.memmap(prefix); });
  BOOST_TEST(what.find("File too large") != std::string::npos, what);
  BOOST_TEST(state_of(prefix) == "old");
  BOOST_TEST(staging_dirs(prefix) == 0);  // the failed save cleaned up after itself
}

BOOST_AUTO_TEST_CASE(h5_preallocation_over_the_file_size_limit_fails_typed) {
  TempDir dir("fault-h5-limit");
  const std::string file = dir / "buf.h5";
  // from_schema allocates its datasets at once (a sparse file): the limit is met there, before any row
  const std::string what = backend_error_under_file_limit(dir / "report", 1 << 20, [&] {
    Schema schema = {{NestedKey("obs"), {{256}, at::kFloat}}};
    TensorDict::from_schema(schema, {4096}, "h5", H5Options().filename(file));  // 4 MiB
  });
  BOOST_TEST(what.find("buf.h5") != std::string::npos, what);
}

BOOST_AUTO_TEST_CASE(redis_killed_and_restarted_during_a_fill_loses_no_acknowledged_row) {
  testutil::RedisServerOptions so;
  so.durable = true;  // appendonly, fsync always: what a server that must not lose writes runs with
  testutil::RedisServer server(so);
  const RedisOptions o = RedisOptions().port(server.port()).retries(0).retry_delay_ms(20);
  const int64_t rows = 3000;
  Schema schema = {{NestedKey("obs"), {{8}, at::kFloat}}, {NestedKey("id"), {{}, at::kLong}}};
  TensorDictStore buf = TensorDictStore::from_schema(schema, {rows}, o);
  // the producer writes rows in order; a failed row is retried until it is acknowledged (bounded)
  std::atomic<int64_t> acked{0};
  std::atomic<int> failures{0};
  std::atomic<bool> gave_up{false};
  std::thread producer([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (int64_t r = 0; r < rows; ++r) {
      TensorDict row({{"obs", at::full({8}, static_cast<float>(r))}, {"id", at::full({}, r, at::kLong)}}, {});
      while (true) {
        try {
          buf.index_put_({r}, row);
          break;
        } catch (const Error&) {
          failures.fetch_add(1);
          if (Clock::now() > deadline) {
            gave_up = true;
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      acked.store(r + 1);
    }
  });
  // kill the server twice while rows flow, restart it on the same port from its append-only file
  std::vector<int64_t> at_kill;
  for (int k = 0; k < 2; ++k) {
    const int64_t target = (k + 1) * rows / 3;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (acked.load() < target && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    at_kill.push_back(acked.load());
    server.kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.restart();
  }
  producer.join();
  BOOST_TEST(!gave_up.load());
  BOOST_TEST(acked.load() == rows);
  BOOST_TEST(failures.load() > 0);  // the kills did hit the fill
  BOOST_TEST_MESSAGE("killed after " << at_kill[0] << " and " << at_kill[1] << " rows; " << failures.load()
                                     << " calls failed and were retried");
  // a fresh connection reads every row back
  TensorDictStore again = TensorDictStore::from_store(buf.td_id(), o);
  TensorDict all = again.to_tensordict();
  BOOST_TEST(all.get("id").equal(at::arange(rows)));
  BOOST_TEST(all.get("obs").equal(at::arange(rows).to(at::kFloat).unsqueeze(1).expand({rows, 8})));
}


BOOST_AUTO_TEST_CASE(save_on_a_full_disk_fails_typed_and_keeps_the_old_save) {
  TempDir dir("fault-full-save");
  const std::string mnt = dir / "fs";
  fs::create_directories(mnt);
  const std::string report = dir / "report";
  // a 4 MiB filesystem: the old save (~0.5 MiB) fits, the new one (10 MiB) does not
  pid_t pid = spawn_on_small_fs(mnt, 4096, [&]() -> int {
    std::ofstream out(report);
    const std::string prefix = mnt + "/data";
    TensorDict small(BatchSize{256});
    small.set("only_old", at::full({256}, 1.0f));
    small.set("leaf0", at::full({256, 256}, 1.0f));
    small.memmap(prefix);
    try {
      state(2.0f, true).memmap(prefix);
      out << "no error\n";
      return 1;
    } catch (const BackendError& e) {
      out << e.what() << "\n";
    } catch (const std::exception& e) {
      out << "other: " << e.what() << "\n";
      return 2;
    }
    TensorDict back = TensorDict::load_memmap(prefix);
    const bool intact = back.keys().size() == 2 && back.get("leaf0").eq(1.0f).all().item<bool>() &&
                        back.get("only_old").eq(1.0f).all().item<bool>();
    out << (intact ? "intact" : "changed") << "\n" << staging_dirs(prefix) << "\n";
    return 0;
  });
  const int rc = testutil::wait_child(pid);
  std::ifstream in(report);
  std::string what, intact;
  int staging = -1;
  std::getline(in, what);
  std::getline(in, intact);
  in >> staging;
  BOOST_TEST(rc == 0, "child " << testutil::describe_child(rc) << " (90-93: no private tmpfs could be mounted): " << what);
  BOOST_TEST(what.find("No space left on device") != std::string::npos, what);
  BOOST_TEST(intact == "intact");
  BOOST_TEST(staging == 0);
}

//! what a full-disk child wrote to its report: the rows it kept, the verdict of its reload, then its error text
//! (the rest of the file: HDF5's messages span lines)
struct FullDiskReport {
  int64_t kept = -1;
  std::string verdict, what;
};
static FullDiskReport read_full_disk_report(const std::string& report) {
  std::ifstream in(report);
  FullDiskReport r;
  in >> r.kept;
  std::getline(in, r.verdict);
  std::getline(in, r.verdict);
  r.what.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

//! rows of a from_schema HDF5 buffer written one by one on a 1 MiB filesystem (a 4 MiB dataset: a sparse file)
//! until the disk is full. Durable (the default): every acknowledged row reads back. durable(false): rows stay
//! in HDF5's caches until flush() / close(), so a full disk is reported by a later write, a flush or the close
//! (a typed error, never a crash), and every row written before the last successful flush() (one per 16 rows)
//! reads back.
static void h5_full_disk(bool durable) {
  TempDir dir(durable ? "fault-full-h5" : "fault-full-h5-nd");
  const std::string mnt = dir / "fs";
  fs::create_directories(mnt);
  const std::string report = dir / "report";
  pid_t pid = spawn_on_small_fs(mnt, 1024, [&]() -> int {
    std::ofstream out(report);
    const std::string file = mnt + "/buf.h5";
    const int64_t rows = 4096;
    int64_t kept = 0;  // durable: rows acknowledged; not durable: rows flushed
    std::string what = "no error";
    {
      Schema schema = {{NestedKey("obs"), {{256}, at::kFloat}}, {NestedKey("id"), {{}, at::kLong}}};
      TensorDict buf;
      try {
        buf = TensorDict::from_schema(schema, {rows}, "h5", H5Options().filename(file).durable(durable));
        for (int64_t done = 0; done < rows; ++done) {
          TensorDict row({{"obs", at::full({256}, static_cast<float>(done))}, {"id", at::full({}, done, at::kLong)}}, {});
          buf.index_put_({done}, row);
          if (durable) {
            kept = done + 1;
          } else if ((done + 1) % 16 == 0) {
            PersistentTensorDict(buf).flush();
            kept = done + 1;
          }
        }
      } catch (const BackendError& e) {
        what = e.what();
      } catch (const std::exception& e) {
        what = std::string("other: ") + e.what();
      }
      try {
        if (buf.defined()) PersistentTensorDict(buf).close();
      } catch (const BackendError& e) {
        what += std::string(" | close: ") + e.what();
      } catch (const std::exception& e) {
        what += std::string(" | close, other: ") + e.what();
      }
    }
    out << kept << "\n";
    // a fresh open reads every kept row back
    try {
      PersistentTensorDict back = PersistentTensorDict::from_h5(file, "r");
      TensorDict got = back.index({at::indexing::Slice(0, kept)}).to_tensordict();
      const bool ok = got.get("id").equal(at::arange(kept)) &&
                      got.get("obs").equal(at::arange(kept).to(at::kFloat).unsqueeze(1).expand({kept, 256}));
      out << (ok ? "intact" : "rows differ") << "\n";
      back.close();
    } catch (const std::exception& e) {
      out << "reopen failed: " << e.what() << "\n";
    }
    out << what;  // last: HDF5's messages span lines
    return 0;
  });
  const int rc = testutil::wait_child(pid);
  const auto [kept, verdict, what] = read_full_disk_report(report);
  BOOST_TEST(rc == 0, "child " << testutil::describe_child(rc) << " (90-93: no private tmpfs could be mounted)");
  BOOST_TEST(kept > 0);
  BOOST_TEST(kept < 4096);
  BOOST_TEST(what.find("No space left on device") != std::string::npos, what);
  BOOST_TEST(what.find("other") == std::string::npos, what);
  BOOST_TEST(verdict == "intact", verdict);
  BOOST_TEST_MESSAGE(kept << (durable ? " rows acknowledged" : " rows flushed") << " before the disk was full: "
                          << what.substr(0, 200));
}

BOOST_AUTO_TEST_CASE(h5_writes_on_a_full_disk_keep_every_acknowledged_row) { h5_full_disk(true); }

BOOST_AUTO_TEST_CASE(h5_not_durable_on_a_full_disk_keeps_every_flushed_row) { h5_full_disk(false); }

//! rows of a from_schema memmap buffer (a 4 MiB sparse file) written on a 1 MiB filesystem until it is full, by
//! one write path: "rows" (td[i] = row, 16 KiB each), "take" (td[index tensor] = 2 rows), "leaf" (a whole leaf set
//! in place). A store into a block the filesystem cannot allocate would kill the writer with SIGBUS; each path
//! reserves its blocks first (backends' reserve_for_store), so the disk being full is a BackendError, and every
//! row written before it reads back.
static void memmap_full_disk(const std::string& path_kind) {
  TempDir dir("fault-full-memmap-" + path_kind);
  const std::string mnt = dir / "fs";
  fs::create_directories(mnt);
  const std::string report = dir / "report";
  pid_t pid = spawn_on_small_fs(mnt, 1024, [&]() -> int {
    std::ofstream out(report);
    const std::string prefix = mnt + "/buf";
    const int64_t rows = 256;  // 256 x 4096 float32 = 4 MiB
    int64_t kept = 0;
    std::string what = "no error";
    try {
      TensorDict buf = TensorDict::from_schema({{"obs", {{4096}, at::kFloat}}}, {rows}, "memmap",
                                               MemmapOptions().prefix(prefix));
      if (path_kind == "leaf") {
        buf.set_("obs", at::full({rows, 4096}, 7.0f));
      } else {
        for (int64_t done = 0; done < rows; done += path_kind == "take" ? 2 : 1) {
          if (path_kind == "take") {
            const at::Tensor idx = at::tensor({done + 1, done}, at::kLong);
            buf.index_put_({idx}, TensorDict({{"obs", at::arange(done + 1, done - 1, -1).to(at::kFloat).unsqueeze(1).expand({2, 4096})}}, {2}));
          } else {
            buf.index_put_({done}, TensorDict({{"obs", at::full({4096}, static_cast<float>(done))}}, {}));
          }
          kept = done + (path_kind == "take" ? 2 : 1);
        }
      }
    } catch (const BackendError& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = std::string("other: ") + e.what();
    }
    out << kept << "\n";
    try {
      TensorDict back = TensorDict::load_memmap(prefix);
      const at::Tensor got = back.get("obs").index({at::indexing::Slice(0, kept)});
      const bool ok = got.equal(at::arange(kept).to(at::kFloat).unsqueeze(1).expand({kept, 4096}));
      out << (ok ? "intact" : "rows differ") << "\n";
    } catch (const std::exception& e) {
      out << "reload failed: " << e.what() << "\n";
    }
    out << what << "\n";
    return 0;
  });
  const int rc = testutil::wait_child(pid);
  const auto [kept, verdict, what] = read_full_disk_report(report);
  BOOST_TEST(rc == 0, "child " << testutil::describe_child(rc) << " (90-93: no private tmpfs could be mounted; a signal: the store died)");
  if (path_kind == "leaf") {
    BOOST_TEST(kept == 0);  // nothing was written: the reservation failed before the first store
  } else {
    BOOST_TEST(kept > 0);
    BOOST_TEST(kept < 256);
  }
  BOOST_TEST(what.find("No space left on device") != std::string::npos, what);
  BOOST_TEST(what.find("obs.memmap") != std::string::npos, what);  // the error names the file
  BOOST_TEST(verdict == "intact", verdict);
  BOOST_TEST_MESSAGE(path_kind << ": " << kept << " rows written before the disk was full: " << what);
}

BOOST_AUTO_TEST_CASE(memmap_row_writes_on_a_full_disk_fail_typed_and_keep_every_row) { memmap_full_disk("rows"); }

BOOST_AUTO_TEST_CASE(memmap_index_tensor_writes_on_a_full_disk_fail_typed_and_keep_every_row) {
  memmap_full_disk("take");
}

BOOST_AUTO_TEST_CASE(memmap_whole_leaf_write_on_a_full_disk_fails_typed_before_a_store) { memmap_full_disk("leaf"); }

//! issue 33, item 22: a child that dies of a signal (here a real SIGBUS: a store past the end of a shrunk
//! mapping) is reaped and reported at once, not left running the suite under Boost.Test's inherited handler
BOOST_AUTO_TEST_CASE(a_child_killed_by_a_signal_is_reported_at_once) {
  const pid_t pid = testutil::spawn([]() -> int {
    const int fd = ::memfd_create("td-sigbus", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) return 90;
    auto* p = static_cast<volatile char*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (p == MAP_FAILED || ::ftruncate(fd, 0) != 0) return 91;
    p[0] = 1;  // SIGBUS: the page is past the end of the file
    return 92;
  });
  const int rc = testutil::wait_child(pid, std::chrono::seconds(30));
  BOOST_TEST_MESSAGE("the child " << testutil::describe_child(rc));
  BOOST_TEST(rc == -SIGBUS, "the child " << testutil::describe_child(rc));
  BOOST_TEST(testutil::describe_child(rc).find("killed by signal 7") == 0u, testutil::describe_child(rc));
}

//! issue 33, item 4: on an 8 MiB /dev/shm (a tmpfs mounted over it in a private mount namespace), a 6 MiB
//! segment reserves its pages, so a second one of 4 MiB is a BackendError at its creation and every store into
//! the first one lands (before: both were created sparse, and the stores into the first died of SIGBUS once the
//! second was filled). The DataLoader's ring is such a segment: a ring that does not fit fails typed at the
//! first next().
BOOST_AUTO_TEST_CASE(shared_memory_on_a_full_dev_shm_fails_typed_at_creation) {
  TempDir dir("fault-shm");
  const std::string report = dir / "report.txt";
  const std::string prefix = "tdtest_fullshm_" + std::to_string(::getpid()) + "_";
  const pid_t pid = spawn_on_small_fs("/dev/shm", 8192, [&]() -> int {
    std::ofstream out(report);
    using backends::ShmSegment;
    const uint64_t first_bytes = uint64_t(6) << 20, second_bytes = uint64_t(4) << 20;
    std::shared_ptr<ShmSegment> first = ShmSegment::create(first_bytes, prefix);
    std::shared_ptr<ShmSegment> second;
    try {
      second = ShmSegment::create(second_bytes, prefix);
      std::memset(second->data(), 2, second_bytes);
      out << "second created\n";
    } catch (const BackendError& e) {
      out << e.what() << "\n";  // "BackendError: ..."
    } catch (const std::exception& e) {
      out << "other: " << e.what() << "\n";
    }
    out.flush();
    std::memset(first->data(), 7, first_bytes);  // every page of the first segment
    const auto* bytes = static_cast<const unsigned char*>(first->data());
    bool all = true;
    for (uint64_t i = 0; i < first_bytes; i += 4096) all = all && bytes[i] == 7;
    out << (all ? "first written" : "first wrong") << "\n";
    out.flush();
    // a loader ring of 3 slots x 1 MiB does not fit in the 2 MiB left
    TensorDict data({{"x", at::zeros({1024, 1024}, at::kFloat)}}, {1024});
    try {
      DataLoader loader(data, LoaderOptions().batch_size(256).num_workers(0));
      auto b = loader.next();
      out << "ring created\n";
    } catch (const BackendError& e) {
      out << e.what() << "\n";  // "BackendError: ..."
    } catch (const std::exception& e) {
      out << "other: " << e.what() << "\n";
    }
    first.reset();  // nothing of ours is left on the small /dev/shm
    second.reset();
    int left = 0;
    for (const auto& de : fs::directory_iterator("/dev/shm")) left += de.path().filename().string().rfind(prefix, 0) == 0;
    out << "left " << left << "\n";
    return 0;
  });
  const int rc = testutil::wait_child(pid, std::chrono::seconds(120));
  std::ifstream in(report);
  std::string second, first, ring, left;
  std::getline(in, second);
  std::getline(in, first);
  std::getline(in, ring);
  std::getline(in, left);
  BOOST_TEST(rc == 0, "child " << testutil::describe_child(rc) << " (90-93: no private tmpfs could be mounted); it wrote: "
                               << second << " / " << first << " / " << ring);
  BOOST_TEST(second.find("BackendError: not enough space in /dev/shm for a 4194304-byte segment") == 0u, second);
  BOOST_TEST(first == "first written");
  BOOST_TEST(ring.find("BackendError: not enough space in /dev/shm") == 0u, ring);
  BOOST_TEST(left == "left 0");
  BOOST_TEST_MESSAGE("full /dev/shm: " << second << "; loader: " << ring);
}

BOOST_AUTO_TEST_SUITE_END()
