// Memmap saves and loads under hostile conditions (issue 33): staging directories of live writers in another
// PID namespace survive a save (item 3), a load racing saves sees one whole save (5), a writable load of a leaf
// the process may not write is a typed error (6), masked and multi-index writes on a full file system are a
// BackendError rather than a SIGBUS (15), and a durable save fsyncs in the right order (18). Children report
// through files and exit codes; the test's thread asserts.
#include <functional>
#include <set>

#include <boost/test/unit_test.hpp>

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "fixtures.hpp"
#include "process_util.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/memmap_storage.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using fixtures::TempDir;

namespace {


//! the entries of `dir` whose name starts with `head`
std::vector<std::string> entries_starting(const std::string& dir, const std::string& head) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.compare(0, head.size(), head) == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

//! waits (bounded) until `p` exists
bool wait_for_file(const std::string& p, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (fs::exists(p) && !testutil::read_text(p).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TensorDict small_td(float v) {
  return TensorDict({{"x", at::full({4, 2}, v)}}, {4});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(memmap_safety)

// ------------------------------------------------------------------------------------------------ item 3
BOOST_AUTO_TEST_CASE(a_live_writers_staging_directory_in_another_pid_namespace_survives_a_save) {
  // A writer in another PID namespace (a container sharing the file system) holds a staging directory of the
  // prefix: its name carries a pid that is dead in this namespace, which a liveness test by kill(pid, 0) took for
  // an abandoned save and deleted. Liveness is its lock now: the directory survives a save of the same prefix.
  TempDir dir("memmap-stage-ns");
  const std::string prefix = dir / "data", report = dir / "report", release = dir / "release";
  small_td(1).save(prefix);
  bool own_namespace = true;
  pid_t holder = testutil::spawn([&]() -> int {
    // in a new PID namespace (as root): its first process (pid 1 there) forks until a child gets a pid that is
    // not a live pid of the test's namespace (/proc is still that namespace's), and that child holds a staging
    // directory until `release` appears
    const bool in_ns = ::unshare(CLONE_NEWPID) == 0;
    auto hold = [&]() -> int {
      {
        backends::StagingDir stage(prefix);
        std::ofstream(report) << (in_ns ? "ns " : "same ") << ::getpid() << " " << stage.path() << "\n";
        for (int i = 0; i < 6000 && !fs::exists(release); ++i) ::usleep(10000);
      }
      return 0;
    };
    if (!in_ns) return hold();
    const pid_t init = ::fork();
    if (init < 0) return 80;
    if (init == 0) {
      for (int attempt = 0; attempt < 5000; ++attempt) {
        const pid_t c = ::fork();
        if (c < 0) ::_exit(81);
        if (c == 0) ::_exit(fs::exists("/proc/" + std::to_string(::getpid())) ? 70 : hold());
        int st = 0;
        ::waitpid(c, &st, 0);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 70)) ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 82);
      }
      ::_exit(83);
    }
    int st = 0;
    ::waitpid(init, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 84;
  });
  BOOST_REQUIRE_MESSAGE(wait_for_file(report), "the holder never reported its staging directory");
  std::string kind, stage;
  long ns_pid = 0;
  std::istringstream(testutil::read_text(report)) >> kind >> ns_pid >> stage;
  own_namespace = kind == "ns";
  if (!own_namespace) {
    // no new PID namespace here: the holder is in this namespace, its directory renamed to carry a dead pid
    BOOST_TEST_MESSAGE("unshare(CLONE_NEWPID) was refused: a live holder in this namespace with a faked dead pid");
    const std::string fake = (fs::path(stage).parent_path() / ("." + fs::path(prefix).filename().string() +
                                                               ".td-stage.999999999.fake")).string();
    fs::rename(stage, fake);
    fs::rename(stage + ".lock", fake + ".lock");
    stage = fake;
  } else {
    BOOST_TEST_MESSAGE("holder in a new PID namespace as pid " << ns_pid << ", not a live pid here");
  }
  BOOST_TEST((::kill(static_cast<pid_t>(ns_pid), 0) != 0 || !own_namespace));
  BOOST_REQUIRE(fs::is_directory(stage));
  // an older version's staging directory (no lock file) of a dead pid: cannot be proven dead, kept
  const std::string legacy = dir / ".data.td-stage.999999998.0";
  fs::create_directory(legacy);
  // an abandoned one: its writer died holding the lock (the kernel released it)
  pid_t dead = testutil::spawn([&]() -> int {
    auto* s = new backends::StagingDir(prefix);  // never destroyed: the process dies with it
    std::ofstream(dir / "abandoned") << s->path();
    ::_exit(0);
  });
  BOOST_TEST(testutil::wait_child(dead) == 0);
  const std::string abandoned = testutil::read_text(dir / "abandoned");
  BOOST_REQUIRE(fs::is_directory(abandoned));

  small_td(2).save(prefix);  // cleans the staging directories of the prefix it can prove abandoned

  BOOST_TEST(fs::is_directory(stage), "a live writer's staging directory was removed: " << stage);
  BOOST_TEST(fs::exists(stage + ".lock"));
  BOOST_TEST(fs::is_directory(legacy));
  BOOST_TEST(!fs::exists(abandoned), "an abandoned staging directory was kept: " << abandoned);
  BOOST_TEST(!fs::exists(abandoned + ".lock"));
  BOOST_TEST(TensorDict::load_memmap(prefix).get("x").eq(2).all().item<bool>());

  if (!own_namespace) {  // back to its name: its owner removes it
    const std::string fake = stage;
    stage = testutil::read_text(report).substr(testutil::read_text(report).rfind(' ') + 1);
    stage.erase(stage.find_last_not_of('\n') + 1);
    fs::rename(fake, stage);
    fs::rename(fake + ".lock", stage + ".lock");
  }
  std::ofstream(release) << "go";
  BOOST_TEST(testutil::wait_child(holder) == 0);
  BOOST_TEST(!fs::exists(stage));  // its writer removed it, and its lock file
  BOOST_TEST(!fs::exists(stage + ".lock"));
  BOOST_TEST(entries_starting(dir.path, ".data.td-stage.") == std::vector<std::string>({".data.td-stage.999999998.0"}));
}

// ------------------------------------------------------------------------------------------------ item 5
BOOST_AUTO_TEST_CASE(a_load_racing_saves_of_the_same_prefix_sees_one_whole_save) {
  // a writer process saves k = 1, 2, 3 ... into one prefix (every leaf of save k holds k; odd and even saves have
  // different shapes) while this thread loads it again and again: each load is wholly one save, or a clear
  // tensordict::Error; never leaves of two saves
  TempDir dir("memmap-race");
  const std::string prefix = dir / "data", stop = dir / "stop", count = dir / "count";
  auto make = [](int64_t k) {
    const int64_t n = k % 2 ? 24 : 40;
    const double v = static_cast<double>(k);
    return TensorDict({{"a", at::full({n, 3}, v, at::kFloat)},
                       {"b", at::full({n}, k, at::kLong)},
                       {NestedKey{"sub", "c"}, at::full({n, 2}, v, at::kDouble)},
                       {NestedKey{"sub", "deeper", "d"}, at::full({n}, v, at::kFloat)}},
                      {n});
  };
  make(1).save(prefix);
  pid_t writer = testutil::spawn([&]() -> int {
    at::set_num_threads(1);
    int64_t k = 2;
    const auto end = Clock::now() + std::chrono::seconds(20);
    for (; k < 20000 && !fs::exists(stop) && Clock::now() < end; ++k) make(k).save(prefix);
    std::ofstream(count) << k - 2;
    return 0;
  });
  int64_t whole = 0, errors = 0, mixed = 0, distinct = 0, last = -1;
  std::vector<std::string> error_texts, mix_texts;
  const auto end = Clock::now() + std::chrono::milliseconds(2500);
  for (int i = 0; i < 100000 && Clock::now() < end; ++i) {
    try {
      TensorDict td = TensorDict::load_memmap(prefix, LoadOptions().writable(false));
      const at::Tensor b = td.get("b");
      const int64_t k = b.numel() ? b[0].item<int64_t>() : -1;
      const int64_t n = k % 2 ? 24 : 40;
      const bool ok = b.size(0) == n && b.eq(k).all().item<bool>() && td.get("a").size(0) == n &&
                      td.get("a").eq(static_cast<double>(k)).all().item<bool>() &&
                      td.get(NestedKey{"sub", "c"}).size(0) == n &&
                      td.get(NestedKey{"sub", "c"}).eq(static_cast<double>(k)).all().item<bool>() &&
                      td.get(NestedKey{"sub", "deeper", "d"}).size(0) == n &&
                      td.get(NestedKey{"sub", "deeper", "d"}).eq(static_cast<double>(k)).all().item<bool>() &&
                      td.batch_size() == BatchSize({n});
      if (ok) {
        ++whole;
        if (k != last) ++distinct;
        last = k;
      } else {
        ++mixed;
        if (mix_texts.size() < 3) {
          std::ostringstream os;
          os << "b=" << k << " a[0]=" << td.get("a").flatten()[0].item<double>()
             << " c[0]=" << td.get(NestedKey{"sub", "c"}).flatten()[0].item<double>() << " n=" << b.size(0);
          mix_texts.push_back(os.str());
        }
      }
    } catch (const Error& e) {
      ++errors;
      if (error_texts.size() < 3) error_texts.push_back(e.what());
    } catch (const std::exception& e) {
      ++mixed;  // an untyped error is as wrong as a mix
      if (mix_texts.size() < 3) mix_texts.push_back(std::string("untyped: ") + e.what());
    }
  }
  std::ofstream(stop) << "stop";
  const int rc = testutil::wait_child(writer);
  BOOST_TEST(rc == 0, "writer " << testutil::describe_child(rc));
  BOOST_TEST_MESSAGE("racing loads: " << whole << " whole, " << errors << " typed errors, " << mixed
                                      << " mixed; " << distinct << " save changes seen; saves: " << testutil::read_text(count));
  for (const auto& t : error_texts) BOOST_TEST_MESSAGE("  error: " << t);
  BOOST_TEST(mixed == 0, "loads mixing saves: " << mixed << (mix_texts.empty() ? "" : ", e.g. " + mix_texts[0]));
  BOOST_TEST(whole > 0);
  BOOST_TEST(distinct > 1, "the loads never saw a new save: the race did not happen");
}

// ------------------------------------------------------------------------------------------------ item 6
BOOST_AUTO_TEST_CASE(a_writable_load_of_a_leaf_this_process_may_not_write_is_a_typed_error) {
  // a child as an unprivileged user (uid/gid 65534) loads a directory it may read but not write: the default
  // (writable) load fails naming the leaf file (upstream raises PermissionError) instead of a private mapping
  // whose writes are lost; an explicit read-only load works and leaves the file as it was
  TempDir dir("memmap-perm");
  ::chmod(dir.path.c_str(), 0755);
  const std::string prefix = dir / "data", report = dir / "report";
  small_td(3).save(prefix);
  const std::string leaf = prefix + "/x.memmap";
  ::chmod(dir.path.c_str(), 0777);  // the child writes its report here
  pid_t child = testutil::spawn([&]() -> int {
    at::set_num_threads(1);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 60;
    if (::access(leaf.c_str(), W_OK) == 0) return 61;  // still allowed to write: proves nothing
    std::ofstream out(report);
    try {
      TensorDict td = TensorDict::load_memmap(prefix);
      out << "loaded\n";
    } catch (const BackendError& e) {
      out << "BackendError " << e.what() << "\n";
    } catch (const std::exception& e) {
      out << "other " << e.what() << "\n";
    }
    try {
      TensorDict ro = TensorDict::load_memmap(prefix, LoadOptions().writable(false));
      ro.get("x").fill_(9);  // a private copy: the file is untouched
      out << "readonly " << ro.get("x")[0][0].item<float>() << "\n";
    } catch (const std::exception& e) {
      out << "readonly failed " << e.what() << "\n";
    }
    return 0;
  });
  const int rc = testutil::wait_child(child);
  BOOST_REQUIRE_MESSAGE(rc == 0, "child " << testutil::describe_child(rc) << " (60: cannot drop to uid 65534; 61: "
                                          "that user may write the leaf)");
  const std::string got = testutil::read_text(report);
  std::istringstream lines(got);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  BOOST_TEST(first.rfind("BackendError ", 0) == 0, got);
  BOOST_TEST(first.find(leaf) != std::string::npos, "the error names the file: " << first);
  BOOST_TEST(first.find("writable(false)") != std::string::npos, first);
  BOOST_TEST(second == "readonly 9", got);
  BOOST_TEST(TensorDict::load_memmap(prefix).get("x").eq(3).all().item<bool>());  // the file as it was
}

// ------------------------------------------------------------------------------------------------ item 15
namespace {
//! fn in a forked child (one intra-op thread) over a `kib` KiB tmpfs mounted at `dir` (testutil::spawn_on_small_fs)
pid_t spawn_on_small_fs(const std::string& dir, int kib, const std::function<int()>& fn) {
  return testutil::spawn_on_small_fs(dir, kib, [&] {
    at::set_num_threads(1);
    return fn();
  });
}

//! what a fill on a full 1 MiB tmpfs reported: rows kept before the error, the check of what reads back, the error
struct FullDisk {
  int rc = -1;
  int64_t kept = -1;
  std::string verdict, what;
};

//! runs `fill(prefix, kept)` in a forked child over a 1 MiB tmpfs until it throws (BackendError expected), then
//! `check(prefix, kept)` on a reload; both run in the child, the parent gets the report
FullDisk fill_full_disk(const std::string& tag, const std::function<void(const std::string&, int64_t&)>& fill,
                        const std::function<std::string(const std::string&, int64_t)>& check) {
  TempDir dir("memmap-full-" + tag);
  const std::string mnt = dir / "fs";
  fs::create_directories(mnt);
  const std::string report = dir / "report";
  pid_t pid = spawn_on_small_fs(mnt, 1024, [&]() -> int {
    std::ofstream out(report);
    const std::string prefix = mnt + "/buf";
    int64_t kept = 0;
    std::string what = "no error";
    try {
      fill(prefix, kept);
    } catch (const BackendError& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = std::string("other: ") + e.what();
    }
    out << kept << "\n";
    try {
      out << check(prefix, kept) << "\n";
    } catch (const std::exception& e) {
      out << "reload failed: " << e.what() << "\n";
    }
    out << what << "\n";
    return 0;
  });
  FullDisk r;
  r.rc = testutil::wait_child(pid);
  std::istringstream in(testutil::read_text(report));
  in >> r.kept;
  in.ignore();
  std::getline(in, r.verdict);
  std::getline(in, r.what);
  return r;
}

//! the common verdicts: the child lived, some rows but not all were kept, the error is the full disk's
void check_full_disk(const FullDisk& r, const std::string& file) {
  BOOST_TEST(r.rc == 0, "child " << testutil::describe_child(r.rc) << " (90-93: no private tmpfs could be mounted; a "
                                                                    "signal: a store died of SIGBUS)");
  BOOST_TEST(r.kept > 0);
  BOOST_TEST(r.kept < 128);
  BOOST_TEST(r.what.find("No space left on device") != std::string::npos, r.what);
  BOOST_TEST(r.what.find(file) != std::string::npos, r.what);
}

//! rows of a from_schema memmap buffer of batch [128, 2] (a 2 MiB sparse file, 16 KiB per row) written on a
//! 1 MiB tmpfs until it is full, by a 2-D mask ("mask") or two index tensors ("multi"), both general indices, or
//! one integer ("int", the fast row path).
//! Each reserves the rows it writes first, so the full disk is a BackendError, never a SIGBUS, and every row
//! written before reads back.
void masked_full_disk(const std::string& how) {
  const int64_t rows = 128;
  FullDisk r = fill_full_disk(
      how,
      [&](const std::string& prefix, int64_t& kept) {
        TensorDict buf = TensorDict::from_schema({{"obs", {{2048}, at::kFloat}}}, {rows, 2}, "memmap",
                                                 MemmapOptions().prefix(prefix));
        for (int64_t r = 0; r < rows; ++r) {
          TensorDict v({{"obs", at::full({2, 2048}, static_cast<float>(r + 1))}}, {2});
          if (how == "int") {
            buf.index_put_({r}, v);  // one row: the fast row path (indexing_write.cpp, put_row_fast)
          } else if (how == "mask") {
            at::Tensor mask = at::zeros({rows, 2}, at::kBool);
            mask[r] = true;
            buf.index_put_({mask}, v);
          } else {
            buf.index_put_({at::tensor({r, r}, at::kLong), at::tensor({1, 0}, at::kLong)}, v);
          }
          kept = r + 1;
        }
      },
      [&](const std::string& prefix, int64_t kept) {
        TensorDict back = TensorDict::load_memmap(prefix);
        const at::Tensor got = back.get("obs").index({at::indexing::Slice(0, kept)});
        const at::Tensor want = at::arange(1, kept + 1).to(at::kFloat).view({kept, 1, 1}).expand({kept, 2, 2048});
        return std::string(got.equal(want) ? "intact" : "rows differ");
      });
  check_full_disk(r, "buf/obs.memmap");
  BOOST_TEST(r.verdict == "intact");
}
}  // namespace

BOOST_AUTO_TEST_CASE(masked_writes_on_a_full_disk_fail_typed_and_keep_every_row) { masked_full_disk("mask"); }

BOOST_AUTO_TEST_CASE(row_writes_on_a_full_disk_fail_typed_and_keep_every_row) { masked_full_disk("int"); }

BOOST_AUTO_TEST_CASE(multi_index_writes_on_a_full_disk_fail_typed_and_keep_every_row) { masked_full_disk("multi"); }

// td[i] = row with two leaves on a full disk: the small leaf's blocks were reserved by the first row, the large one
// runs out. The one-row path reserves every leaf's blocks before it copies any, so the failing row is left whole
// as it was in both leaves (not half-written), and every row before it reads back.
BOOST_AUTO_TEST_CASE(a_row_write_that_fails_on_a_full_disk_writes_none_of_its_leaves) {
  const int64_t rows = 128;
  FullDisk r = fill_full_disk(
      "row",
      [&](const std::string& prefix, int64_t& kept) {
        TensorDict buf = TensorDict::from_schema({{"a", {{2}, at::kFloat}}, {"obs", {{2, 2048}, at::kFloat}}}, {rows},
                                                 "memmap", MemmapOptions().prefix(prefix));
        for (int64_t i = 0; i < rows; ++i) {
          const float v = static_cast<float>(i + 1);
          buf.index_put_({i}, TensorDict({{"a", at::full({2}, v)}, {"obs", at::full({2, 2048}, v)}}, {}));
          kept = i + 1;
        }
      },
      [&](const std::string& prefix, int64_t kept) {
        TensorDict back = TensorDict::load_memmap(prefix);
        const at::Tensor want = at::arange(1, kept + 1).to(at::kFloat);
        const at::indexing::Slice done(0, kept);
        const bool before = back.get("a").index({done}).equal(want.view({kept, 1}).expand({kept, 2})) &&
                            back.get("obs").index({done}).equal(want.view({kept, 1, 1}).expand({kept, 2, 2048}));
        const bool untouched = kept < rows && back.get("a")[kept].eq(0).all().item<bool>();
        return std::string(before ? "intact" : "rows differ") + (untouched ? " untouched" : " half-written");
      });
  check_full_disk(r, "buf/obs.memmap");
  BOOST_TEST(r.verdict == "intact untouched");
}

// a threaded save of many levels (its meta.json files written in the leaves' parallel pass) that runs out of space
// over an earlier save: the error is the full disk's, the earlier save loads as it was, and no staging directory
// is left beside it
BOOST_AUTO_TEST_CASE(a_save_whose_directory_is_a_file_fails_typed_and_leaves_nothing) {
  // a level's directory is made with one mkdir when its parent exists: a regular file in the way (here the
  // prefix's parent, and a key's directory in a memmap_ into an existing save) is an error naming it, the file is
  // left as it was and no staging directory remains
  fixtures::TempDir tmp("save-file-in-way");
  const std::string blocker = tmp.path + "/not-a-dir";
  std::ofstream(blocker) << "keep me";
  TensorDict td(Dict{{"a", at::arange(4, at::kFloat)}}, {4});
  td.set("sub", TensorDict(Dict{{"b", at::ones({4})}}, {4}));
  auto names_it = [&](const Error& e) { return std::string(e.what()).find("not-a-dir") != std::string::npos; };
  for (int threads : {0, 2}) {
    BOOST_CHECK_EXCEPTION(td.memmap(blocker + "/td", MemmapOptions().num_threads(threads)), Error, names_it);
    BOOST_CHECK_EXCEPTION(td.memmap(blocker, MemmapOptions().num_threads(threads)), Error, names_it);
  }
  std::ifstream in(blocker);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST(text == "keep me");
  int left = 0;
  for (const auto& e : fs::directory_iterator(tmp.path))
    if (e.path().filename().string() != "not-a-dir") ++left;
  BOOST_TEST(left == 0);
  // a save whose prefix's parents are missing still makes them (the fallback of the one mkdir)
  TensorDict saved = td.memmap(tmp.path + "/x/y/z");
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/x/y/z").get({"sub", "b"}).equal(at::ones({4})));
}

BOOST_AUTO_TEST_CASE(a_save_over_any_spelling_of_its_prefix_is_staged) {
  // the staging directory is found from the prefix's lexically normal form (a normal prefix without normalizing
  // each path again): every spelling of the prefix writes into the staging directory and switches it in, so a
  // load of the old save keeps reading the old values, and nothing else is left beside it
  fixtures::TempDir tmp("save-spellings");
  auto make = [](float v) {
    TensorDict td(Dict{{"a", at::full({4}, v)}}, {4});
    td.set("sub", TensorDict(Dict{{"b", at::full({4, 2}, v)}}, {4}));
    return td;
  };
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {tmp.path + "/s1", tmp.path + "/s1"},       {tmp.path + "//s2/", tmp.path + "/s2"},
      {tmp.path + "/./s3", tmp.path + "/s3"},     {tmp.path + "/q/../s4", tmp.path + "/s4"},
      {tmp.path + "/s5//", tmp.path + "/s5"}};
  for (int threads : {0, 2}) {
    for (const auto& [spelled, normal] : spellings) {
      make(1.f).memmap(normal);
      TensorDict old = TensorDict::load_memmap(normal);
      make(2.f).memmap(spelled, MemmapOptions().num_threads(threads));
      BOOST_TEST(old.get({"sub", "b"}).equal(at::full({4, 2}, 1.f)), spelled << ": the old save was written over");
      BOOST_TEST(old.get("a").equal(at::full({4}, 1.f)), spelled);
      TensorDict now = TensorDict::load_memmap(normal);
      BOOST_TEST(now.get({"sub", "b"}).equal(at::full({4, 2}, 2.f)), spelled);
      BOOST_TEST(now.get("a").equal(at::full({4}, 2.f)), spelled);
    }
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp.path)) names.insert(e.path().filename().string());
    BOOST_TEST(names == (std::set<std::string>{"s1", "s2", "s3", "s4", "s5"}));
  }
}

//! "old N" / "changed N": whether the reload found the old save, and how many staging directories are left beside
//! `prefix`
std::string save_verdict(const std::string& prefix, bool old) {
  int staged = 0;
  for (const auto& e : fs::directory_iterator(fs::path(prefix).parent_path()))
    if (e.path().filename().string().find("td-stage") != std::string::npos) ++staged;
  return std::string(old ? "old" : "changed") + " " + std::to_string(staged);
}

//! a save that ran out of space: it failed with the disk's error, the old save kept whole, nothing staged left
void check_old_save_kept(const FullDisk& r) {
  BOOST_TEST(r.rc == 0, "child " << testutil::describe_child(r.rc) << " (90-93: no private tmpfs could be mounted)");
  BOOST_TEST(r.kept == 1);
  BOOST_TEST(r.what.find("No space left on device") != std::string::npos, r.what);
  BOOST_TEST(r.verdict == "old 0");
}

BOOST_AUTO_TEST_CASE(a_threaded_save_on_a_full_disk_keeps_the_old_save_and_leaves_nothing) {
  FullDisk r = fill_full_disk(
      "threaded-save",
      [](const std::string& prefix, int64_t& kept) {
        TensorDict(Dict{{"a", at::arange(4, at::kFloat)}}, {4}).memmap(prefix);
        kept = 1;
        TensorDict big(BatchSize{4});
        for (int l = 0; l < 40; ++l) {
          TensorDict level(Dict{{"w", at::full({4, 8192}, static_cast<float>(l))}, {"b", at::ones({4})}}, {4});
          big.set(std::to_string(l), level);
        }
        big.memmap(prefix, MemmapOptions().num_threads(2));  // 40 levels of 128 KiB: 5 MiB on a 1 MiB tmpfs
        kept = 2;
      },
      [](const std::string& prefix, int64_t) {
        const bool old = TensorDict::load_memmap(prefix).get("a").equal(at::arange(4, at::kFloat));
        return save_verdict(prefix, old);
      });
  check_old_save_kept(r);
}

BOOST_AUTO_TEST_CASE(a_lazy_stack_save_on_a_full_disk_keeps_the_old_save_and_leaves_nothing) {
  // the members and the stack's meta.json are one staged save: the members written before the disk filled up
  // must not replace the old save's (a member-by-member save had left members 0.. of the new stack beside the
  // old stack's last members and meta.json)
  FullDisk r = fill_full_disk(
      "lazy-save",
      [](const std::string& prefix, int64_t& kept) {
        std::vector<TensorDict> small;
        for (int i = 0; i < 3; ++i) small.push_back(TensorDict(Dict{{"a", at::full({4}, static_cast<float>(i))}}, {4}));
        lazy_stack(small, 0).memmap(prefix);
        kept = 1;
        std::vector<TensorDict> big;
        for (int i = 0; i < 40; ++i) big.push_back(TensorDict(Dict{{"a", at::full({4, 8192}, 9.f)}}, {4}));
        lazy_stack(big, 0).memmap_(prefix, MemmapOptions().num_threads(2));  // 40 x 128 KiB on a 1 MiB tmpfs
        kept = 2;
      },
      [](const std::string& prefix, int64_t) {
        const LazyStackedTensorDict back(TensorDict::load_memmap(prefix));
        bool old = back.tensordicts().size() == 3;
        for (size_t i = 0; old && i < 3; ++i)
          old = back.member(static_cast<int64_t>(i)).get("a").equal(at::full({4}, static_cast<float>(i)));
        return save_verdict(prefix, old);
      });
  check_old_save_kept(r);
}

// a save whose parent directory may not be written is made in place (no staging directory beside it): a lazy stack
// saved so over a longer one removes the old last members, which a load would read as members. The parent is a
// read-only bind mount in the child's own mount namespace, the prefix a writable bind mount below it
BOOST_AUTO_TEST_CASE(a_lazy_stack_saved_in_place_over_a_longer_one_loads_its_own_members) {
  TempDir dir("memmap-inplace-stack");
  const std::string mnt = dir / "fs";
  fs::create_directories(mnt);
  const std::string report = dir / "report";
  auto stack = [](int n, float v) {
    std::vector<TensorDict> ms;
    for (int i = 0; i < n; ++i) ms.push_back(TensorDict(Dict{{"a", at::full({2}, v + static_cast<float>(i))}}, {2}));
    return lazy_stack(ms, 0);
  };
  pid_t pid = spawn_on_small_fs(mnt, 4096, [&]() -> int {
    std::ofstream out(report);
    const std::string parent = mnt + "/parent", prefix = parent + "/ls";
    fs::create_directories(prefix);
    if (::mount(parent.c_str(), parent.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, parent.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0 ||
        ::mount(prefix.c_str(), prefix.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, prefix.c_str(), nullptr, MS_BIND | MS_REMOUNT, nullptr) != 0) {  // writable again
      out << "no mounts: " << std::strerror(errno) << "\n";
      return 94;
    }
    try {
      stack(5, 1.f).memmap(prefix);
      stack(3, 10.f).memmap(prefix);
      const LazyStackedTensorDict back(TensorDict::load_memmap(prefix));
      out << back.tensordicts().size() << " " << back.member(0).get("a")[0].item<float>() << " "
          << fs::exists(prefix + "/3") << "\n";
      int staged = 0;
      for (const auto& e : fs::directory_iterator(parent))
        if (e.path().filename().string().find("td-stage") != std::string::npos) ++staged;
      out << staged << "\n";
    } catch (const std::exception& e) {
      out << "failed: " << e.what() << "\n";
    }
    return 0;
  });
  const int rc = testutil::wait_child(pid);
  BOOST_TEST(rc == 0, "child " << testutil::describe_child(rc) << " (90-94: no private mounts could be made) "
                                << testutil::read_text(report));
  std::istringstream in(testutil::read_text(report));
  std::string members, staged;
  std::getline(in, members);
  std::getline(in, staged);
  BOOST_TEST(members == "3 10 0", members);  // three members, the new values, no old member 3 left
  BOOST_TEST(staged == "0");                 // written in place: no staging directory could be made
}

// prefault on a file system that cannot hold the leaf (a 2 MiB leaf on a 1 MiB tmpfs: no blocks to reserve
// there, and the populate runs out of pages part-way): it reports fewer bytes than the leaf's and the process
// lives. Faulting the pages in by touching them would kill it with SIGBUS (what a store into a page the file
// system cannot give does)
BOOST_AUTO_TEST_CASE(prefault_on_a_full_file_system_reports_less_and_lives) {
  FullDisk r = fill_full_disk(
      "prefault",
      [](const std::string& prefix, int64_t& bytes) {
        TensorDict buf = TensorDict::from_schema({{"obs", {{2048}, at::kFloat}}}, {256}, "memmap",
                                                 MemmapOptions().prefix(prefix));
        bytes = prefault(buf);
      },
      [](const std::string&, int64_t) { return std::string("lived"); });
  BOOST_TEST(r.rc == 0, "child " << testutil::describe_child(r.rc) << " (90-93: no private tmpfs could be mounted)");
  BOOST_TEST_MESSAGE("prefault on a full tmpfs: " << r.kept << " bytes, " << r.what);
  BOOST_TEST(r.verdict == "lived");
  // fewer bytes than the leaf's 2 MiB, or a typed error naming the file
  BOOST_TEST((r.kept < 2 * 1024 * 1024 || r.what.find("buf/obs.memmap") != std::string::npos), r.kept << " " << r.what);
}

BOOST_AUTO_TEST_CASE(a_masked_write_reserves_only_the_rows_it_selects) {
  // the pass over the mask: a mask selecting a few rows of a large leaf reserves those rows' blocks only (the
  // file stays sparse elsewhere), whatever the mask's shape; timed here for the record (never asserted)
  TempDir dir("memmap-mask-rows");
  const int64_t rows = 4096;
  TensorDict buf = TensorDict::from_schema({{"obs", {{4096}, at::kFloat}}}, {rows, 2}, "memmap",
                                           MemmapOptions().prefix(dir / "buf"));
  at::Tensor mask = at::zeros({rows, 2}, at::kBool);
  for (int64_t r : {5, 2000, 4000}) mask[r][1] = true;
  TensorDict v({{"obs", at::ones({3, 4096})}}, {3});
  const auto t0 = Clock::now();
  const int reps = 50;
  for (int i = 0; i < reps; ++i) buf.index_put_({mask}, v);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps;
  BOOST_TEST_MESSAGE("a [4096, 2] mask selecting 3 rows of a 128 MiB leaf: " << us << " us per masked write");
  struct stat st;
  BOOST_REQUIRE(::stat((dir / "buf/obs.memmap").c_str(), &st) == 0);
  // 3 rows of 32 KiB, each in one or two 256 KiB blocks: far below the file's 128 MiB
  BOOST_TEST(st.st_blocks * 512 <= 6 * (256 << 10), "allocated " << st.st_blocks * 512 << " bytes");
  BOOST_TEST(buf.get("obs").index({mask}).eq(1).all().item<bool>());
  BOOST_TEST(buf.get("obs").sum().item<double>() == 3 * 4096);
}

// ------------------------------------------------------------------------------------------------ item 18
namespace {
struct Call {
  std::string op, a, b;
};

//! the recorder's lines between "mark <from>" and the next mark
std::vector<Call> calls_of_step(const std::string& log, const std::string& from) {
  std::vector<Call> out;
  std::istringstream in(log);
  std::string line;
  bool in_step = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> w;
    for (std::string s; ls >> s;) w.push_back(s);
    if (w.empty()) continue;
    if (w[0] == "mark") {
      in_step = w.size() > 1 && w[1] == from;
      continue;
    }
    if (!in_step) continue;
    Call c{w[0], w.size() > 1 ? w[1] : "", ""};
    if ((c.op.rfind("rename", 0) == 0) && w.size() > 2) c.b = w[2];
    out.push_back(c);
  }
  return out;
}

//! index of the first call matching pred, or -1
template <class P>
long find_call(const std::vector<Call>& calls, P pred) {
  for (size_t i = 0; i < calls.size(); ++i)
    if (pred(calls[i])) return static_cast<long>(i);
  return -1;
}

bool starts(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

//! checks one durable save step: every leaf file and meta.json of the staging directory fsynced before the one
//! rename that switches it in as `prefix`, the parent directory fsynced after
void check_durable_save(const std::vector<Call>& calls, const std::string& prefix, const std::string& step) {
  BOOST_TEST_CONTEXT(step) {
    const long sw = find_call(calls, [&](const Call& c) {
      return starts(c.op, "rename") && c.b == prefix && c.a.find(".td-stage.") != std::string::npos;
    });
    BOOST_REQUIRE_MESSAGE(sw >= 0, "no rename switching a staging directory in as " << prefix);
    const std::string stage = calls[static_cast<size_t>(sw)].a;
    auto synced_before = [&](const std::string& path) {
      const long at = find_call(calls, [&](const Call& c) { return c.op == "fsync" && c.a == path; });
      return at >= 0 && at < sw;
    };
    for (const char* leaf : {"/a.memmap", "/b.memmap", "/sub/c.memmap"})
      BOOST_TEST(synced_before(stage + leaf), "leaf " << leaf << " not fsynced before the switch");
    for (const char* dir : {"", "/sub"}) {
      // meta.json, written in place inside the staging directory, and the directory itself (its entries: the
      // leaves, the child directories, meta.json) fsynced before the switch
      BOOST_TEST(synced_before(stage + dir + "/meta.json"), "meta.json of '" << dir << "' not fsynced before the switch");
      BOOST_TEST(synced_before(stage + dir), "the directory '" << dir << "' not fsynced before the switch");
    }
    const std::string parent = fs::path(prefix).parent_path().string();
    const long after = find_call(calls, [&](const Call& c) { return c.op == "fsync" && c.a == parent; });
    long last_parent = -1;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].op == "fsync" && calls[i].a == parent) last_parent = static_cast<long>(i);
    BOOST_TEST((after >= 0 && last_parent > sw), "the parent directory is not fsynced after the switch");
  }
}
}  // namespace

//! under ASan the recorder comes before ASan's runtime in the child: allowed on top of the suite's own options
static void allow_preload_before_asan() {
  const char* cur = std::getenv("ASAN_OPTIONS");
  const std::string opts = std::string(cur && *cur ? std::string(cur) + ":" : "") + "verify_asan_link_order=0";
  ::setenv("ASAN_OPTIONS", opts.c_str(), 1);
}

BOOST_AUTO_TEST_CASE(a_durable_save_fsyncs_leaves_and_meta_before_the_switch_and_the_parent_after) {
  // td_durable_save runs under an LD_PRELOAD recorder of fsync / rename calls (tests/tools/syscall_recorder.c):
  // a durable save into a new prefix (one rename), one over it (the rename exchange), then a key added to the
  // saved directory (a meta.json rewrite: temp file fsynced, renamed, its directory fsynced)
  TempDir dir("memmap-durable");
  const std::string prefix = fs::canonical(dir.path).string() + "/data";
  const std::string log = dir / "calls.log";
  pid_t pid = testutil::spawn([&]() -> int {
    ::setenv("LD_PRELOAD", TD_SYSCALL_RECORDER, 1);
    ::setenv("TD_SYSCALL_LOG", log.c_str(), 1);
    allow_preload_before_asan();
    ::execl(TD_DURABLE_SAVE_EXE, TD_DURABLE_SAVE_EXE, prefix.c_str(), static_cast<char*>(nullptr));
    return 97;
  });
  const int rc = testutil::wait_child(pid);
  BOOST_REQUIRE_MESSAGE(rc == 0, "td_durable_save " << testutil::describe_child(rc));
  const std::string text = testutil::read_text(log);
  BOOST_TEST_MESSAGE("recorded calls:\n" << text);
  check_durable_save(calls_of_step(text, "save-new"), prefix, "a durable save into a new prefix");
  check_durable_save(calls_of_step(text, "save-over"), prefix, "a durable save over an existing one");
  {
    const auto calls = calls_of_step(text, "add-key");
    const std::string meta = prefix + "/meta.json";
    const long ren = find_call(calls, [&](const Call& c) { return starts(c.op, "rename") && c.b == meta; });
    BOOST_REQUIRE_MESSAGE(ren >= 0, "add-key: meta.json not replaced by a rename");
    const std::string tmp = calls[static_cast<size_t>(ren)].a;
    const long sync = find_call(calls, [&](const Call& c) { return c.op == "fsync" && c.a == tmp; });
    BOOST_TEST((sync >= 0 && sync < ren), "add-key: the new meta.json is not fsynced before its rename");
    long dir_sync = -1;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].op == "fsync" && calls[i].a == prefix) dir_sync = static_cast<long>(i);
    BOOST_TEST(dir_sync > ren, "add-key: the directory is not fsynced after the rename");
  }
}

BOOST_AUTO_TEST_CASE(a_plain_save_is_not_fsynced_leaf_by_leaf) {
  // the default (upstream's): nothing is fsynced, neither a leaf nor a meta.json (the staging directory is
  // switched in whole by one rename: a killed writer leaves the old save or the new one, from the page cache)
  TempDir dir("memmap-plain");
  const std::string prefix = fs::canonical(dir.path).string() + "/data";
  const std::string log = dir / "calls.log";
  pid_t pid = testutil::spawn([&]() -> int {
    ::setenv("LD_PRELOAD", TD_SYSCALL_RECORDER, 1);
    ::setenv("TD_SYSCALL_LOG", log.c_str(), 1);
    allow_preload_before_asan();
    ::execl(TD_DURABLE_SAVE_EXE, TD_DURABLE_SAVE_EXE, prefix.c_str(), "plain", static_cast<char*>(nullptr));
    return 97;
  });
  const int rc = testutil::wait_child(pid);
  BOOST_REQUIRE_MESSAGE(rc == 0, "td_durable_save " << testutil::describe_child(rc));
  const auto calls = calls_of_step(testutil::read_text(log), "save-over");
  BOOST_TEST(find_call(calls, [](const Call& c) { return c.op == "fsync" && c.a.find(".memmap") != std::string::npos; }) == -1);
  BOOST_TEST(find_call(calls, [](const Call& c) { return c.op == "fsync"; }) == -1);
  BOOST_TEST(find_call(calls, [](const Call& c) { return starts(c.op, "rename") && c.a.find(".td-stage.") != std::string::npos; }) >= 0);
}

BOOST_AUTO_TEST_SUITE_END()
