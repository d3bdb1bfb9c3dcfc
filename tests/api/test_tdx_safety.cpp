// tdx (api/tools) as separate processes, where the cmake script of tools.tdx cannot look: Redis credentials in
// every URL form and in the environment are used by every connection tdx makes and never printed (issue 33 item
// 8), `convert --durable` fsyncs the copy before the rename that switches it in and the parent directory after
// (item 18; under the LD_PRELOAD recorder tests/tools/syscall_recorder.c), and the sibling of a convert killed
// mid-copy is removed by the next convert to the same DST, never a live one. tdx runs as a child (fork + execve);
// its stdout and stderr go to files that the test's thread reads and asserts on.
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/fixtures.hpp"
#include "process_util.hpp"
#include "redis_server.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/tensordict.hpp"

#ifndef TD_TDX_EXE
#define TD_TDX_EXE ""  // tests/CMakeLists.txt defines it for this file
#endif
#ifndef TD_SYSCALL_RECORDER
#define TD_SYSCALL_RECORDER ""
#endif

using namespace tensordict;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using fixtures::TempDir;

namespace {


bool starts(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

struct Run {
  int rc = -1;
  std::string out, err;
};

//! the environment of this process with `extra` ("NAME=value") added (replacing a variable of the same name)
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || starts(kv, x.substr(0, x.find('=') + 1));
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

//! starts tdx with `args` (stdout, stderr into `out`, `err`); returns its pid
pid_t start_tdx(const std::vector<std::string>& args, const std::string& out, const std::string& err,
                const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv_s{TD_TDX_EXE};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s = environment_with(extra_env);
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  return testutil::spawn([&]() -> int {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) return 96;
    ::execve(argv[0], argv.data(), envp.data());
    return 97;
  });
}

//! runs tdx to its end (bounded: a stuck tdx is killed and fails the test)
Run run_tdx(const TempDir& dir, const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  const std::string out = dir / "tdx.out", err = dir / "tdx.err";
  const pid_t pid = start_tdx(args, out, err, extra_env);
  Run r;
  r.rc = testutil::wait_child(pid, std::chrono::seconds(120));
  r.out = testutil::read_text(out);
  r.err = testutil::read_text(err);
  return r;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

//! under ASan the recorder comes before ASan's runtime in the child: allowed on top of the suite's own options
std::string asan_options_allowing_preload() {
  const char* cur = std::getenv("ASAN_OPTIONS");
  return "ASAN_OPTIONS=" + std::string(cur && *cur ? std::string(cur) + ":" : "") + "verify_asan_link_order=0";
}

//! a small memmap source: leaves a [4, 3], b [4], sub/c [4, 2] and a string
std::string make_source(const TempDir& dir, const std::string& name) {
  TensorDict td({{"a", at::arange(12, at::kFloat).reshape({4, 3})}, {"b", at::arange(4, at::kLong)}}, {4});
  td.set(NestedKey{"sub", "c"}, at::ones({4, 2}, at::kInt));
  td.set_non_tensor("note", JsonValue("hello"));
  const std::string p = fs::canonical(dir.path).string() + "/" + name;
  td.memmap_(p);
  return p;
}

//! the names in `dir` that start with `head`
std::vector<std::string> entries_starting(const std::string& dir, const std::string& head) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (starts(n, head)) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ------------------------------------------------------------------------------------------ the recorder's log
struct Call {
  std::string op, a, b;
};

std::vector<Call> calls_of(const std::string& log) {
  std::vector<Call> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<std::string> w;
    for (std::string s; ls >> s;) w.push_back(s);
    if (w.empty()) continue;
    Call c{w[0], w.size() > 1 ? w[1] : "", ""};
    if (starts(c.op, "rename") && w.size() > 2) c.b = w[2];
    out.push_back(c);
  }
  return out;
}

template <class P>
long find_call(const std::vector<Call>& calls, P pred) {
  for (size_t i = 0; i < calls.size(); ++i)
    if (pred(calls[i])) return static_cast<long>(i);
  return -1;
}

//! the index of the rename that switched the copy in as `dst` (from a sibling ".NAME.td-stage.*"), or -1
long switch_of(const std::vector<Call>& calls, const std::string& dst) {
  return find_call(calls, [&](const Call& c) {
    return starts(c.op, "rename") && c.b == dst && c.a.find(".td-stage.") != std::string::npos;
  });
}

bool fsynced_before(const std::vector<Call>& calls, const std::string& path, long limit) {
  const long at = find_call(calls, [&](const Call& c) { return (c.op == "fsync" || c.op == "fdatasync") && c.a == path; });
  return at >= 0 && at < limit;
}

bool fsynced_after(const std::vector<Call>& calls, const std::string& path, long from) {
  for (size_t i = static_cast<size_t>(std::max<long>(from + 1, 0)); i < calls.size(); ++i)
    if (calls[i].op == "fsync" && calls[i].a == path) return true;
  return false;
}

//! runs `tdx convert [--durable] SRC DST` under the recorder; returns its calls
std::vector<Call> recorded_convert(const TempDir& dir, const std::vector<std::string>& args, const std::string& tag) {
  const std::string log = dir / ("calls-" + tag + ".log");
  Run r = run_tdx(dir, args, {std::string("LD_PRELOAD=") + TD_SYSCALL_RECORDER, "TD_SYSCALL_LOG=" + log,
                              asan_options_allowing_preload()});
  BOOST_REQUIRE_MESSAGE(r.rc == 0, "tdx " << joined(args) << ": " << testutil::describe_child(r.rc) << ": " << r.err);
  const std::string text = testutil::read_text(log);
  BOOST_TEST_MESSAGE(tag << ": recorded calls:\n" << text);
  return calls_of(text);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tdx_safety)

BOOST_AUTO_TEST_CASE(redis_credentials_reach_every_connection_and_are_never_printed) {
  BOOST_REQUIRE_MESSAGE(std::string(TD_TDX_EXE) != "", "TD_TDX_EXE is not defined (tests/CMakeLists.txt)");
  const std::string pw = "tdx-S3cr3t-pw";
  testutil::RedisServerOptions so;
  so.password = pw;
  so.unix_socket = false;
  testutil::RedisServer server(so);
  TempDir dir("tdx-redis-pw");
  const std::string host = "127.0.0.1:" + std::to_string(server.port());
  TensorDict td({{"obs", at::arange(6, at::kFloat).reshape({3, 2})}, {"idx", at::arange(3, at::kLong)}}, {3});
  TensorDictStore store = TensorDictStore::from_tensordict(td, RedisOptions().port(server.port()).password(pw).prefix("tdxpw"));
  const std::string id = store.td_id();
  store.close();
  const std::string src = make_source(dir, "src");
  std::vector<Run> runs;
  auto run = [&](const std::string& what, const std::vector<std::string>& args, const std::vector<std::string>& env,
                 int want_rc) {
    Run r = run_tdx(dir, args, env);
    BOOST_TEST(r.rc == want_rc, what << ": tdx " << redact_url(joined(args)) << ": "
                                     << testutil::describe_child(r.rc) << ", expected exit " << want_rc << ": "
                                     << r.out << r.err);
    runs.push_back(r);
    return r;
  };
  struct Form {
    std::string name, base;  // base: "redis://...:PORT/0?prefix=tdxpw"
    std::vector<std::string> env;
  };
  const std::vector<Form> forms = {
      {"redis://:PW@", "redis://:" + pw + "@" + host + "/0?prefix=tdxpw", {}},
      {"redis://default:PW@", "redis://default:" + pw + "@" + host + "/0?prefix=tdxpw", {}},
      {"TENSORDICT_REDIS_PASSWORD", "redis://" + host + "/0?prefix=tdxpw", {"TENSORDICT_REDIS_PASSWORD=" + pw}},
      {"?password=", "redis://" + host + "/0?prefix=tdxpw&password=" + pw, {}},
  };
  int n = 0;
  for (const Form& f : forms) {
    BOOST_TEST_CONTEXT(f.name) {
      const std::string addr = f.base + "&td_id=" + id;
      Run i = run(f.name + " info", {"info", addr}, f.env, 0);
      BOOST_TEST(i.out.find("obs") != std::string::npos, i.out);
      Run d = run(f.name + " dump", {"dump", addr, "--json", "--compact"}, f.env, 0);
      BOOST_TEST(d.out.find("\"idx\"") != std::string::npos, d.out);
      run(f.name + " verify", {"verify", addr}, f.env, 0);
      const std::string mm = dir / ("copy" + std::to_string(n++));
      run(f.name + " convert store -> memmap", {"convert", addr, mm, "--quiet"}, f.env, 0);
      // a new store: its address is printed (without the password)
      Run c = run(f.name + " convert memmap -> a new store", {"convert", src, f.base, "--quiet"}, f.env, 0);
      BOOST_TEST(c.out.find("td_id=") != std::string::npos, c.out);
      // --force into the existing td_id: the key switch runs on tdx's own connection (the same credentials)
      run(f.name + " convert --force into the store", {"convert", mm, addr, "--quiet", "--force"}, f.env, 0);
      // errors that name the address: an unknown td_id, a source that cannot be copied
      run(f.name + " info of an unknown td_id", {"info", f.base + "&td_id=no-such-store"}, f.env, 2);
      run(f.name + " convert onto a td_id without --force", {"convert", src, addr}, f.env, 2);
    }
  }
  // the server does require the password: without one, a clear error (and still nothing secret)
  Run noauth = run("no password", {"info", "redis://" + host + "/0?prefix=tdxpw&td_id=" + id}, {}, 2);
  BOOST_TEST((noauth.err.find("NOAUTH") != std::string::npos || noauth.err.find("uthentication") != std::string::npos),
             noauth.err);
  // a wrong password is refused without echoing either
  run("a wrong password", {"info", "redis://:wrong-" + pw + "@" + host + "/0?prefix=tdxpw&td_id=" + id}, {}, 2);
  for (const Run& r : runs) {
    BOOST_TEST(r.out.find(pw) == std::string::npos, "the password on stdout: " << r.out);
    BOOST_TEST(r.err.find(pw) == std::string::npos, "the password on stderr: " << r.err);
  }
  // the store holds what the last --force wrote (the source's leaves)
  TensorDictStore again = TensorDictStore::from_store(id, RedisOptions().port(server.port()).password(pw).prefix("tdxpw"));
  BOOST_TEST(again.get("obs").equal(td.get("obs")));
  again.close();
}

BOOST_AUTO_TEST_CASE(a_durable_convert_fsyncs_the_copy_before_the_switch_and_the_parent_after) {
  BOOST_REQUIRE_MESSAGE(std::string(TD_TDX_EXE) != "" && std::string(TD_SYSCALL_RECORDER) != "",
                        "TD_TDX_EXE / TD_SYSCALL_RECORDER are not defined (tests/CMakeLists.txt)");
  TempDir dir("tdx-durable");
  const std::string src = make_source(dir, "src");
  const std::string parent = fs::canonical(dir.path).string();
  // memmap -> memmap, into a new directory (one rename) and over it (--force: the rename exchange)
  for (const char* step : {"new", "over"}) {
    BOOST_TEST_CONTEXT("memmap -> memmap, " << step) {
      const std::string dst = parent + "/out";
      std::vector<std::string> args{"convert", "--durable", "--quiet", src, dst};
      if (std::string(step) == "over") args.push_back("--force");
      const auto calls = recorded_convert(dir, args, std::string("mm-") + step);
      const long sw = switch_of(calls, dst);
      BOOST_REQUIRE_MESSAGE(sw >= 0, "no rename switching a sibling in as " << dst);
      const std::string stage = calls[static_cast<size_t>(sw)].a;
      for (const char* f : {"/a.memmap", "/b.memmap", "/sub/c.memmap", "/meta.json", "/sub/meta.json", "", "/sub"})
        BOOST_TEST(fsynced_before(calls, stage + f, sw), "'" << stage + f << "' not fsynced before the switch");
      BOOST_TEST(fsynced_after(calls, parent, sw), "the parent directory is not fsynced after the switch");
    }
  }
  // memmap -> h5
  {
    const std::string dst = parent + "/out.h5";
    const auto calls = recorded_convert(dir, {"convert", "--durable", "--quiet", src, dst}, "h5");
    const long sw = switch_of(calls, dst);
    BOOST_REQUIRE_MESSAGE(sw >= 0, "no rename switching a sibling in as " << dst);
    BOOST_TEST(fsynced_before(calls, calls[static_cast<size_t>(sw)].a, sw), "the .h5 copy is not fsynced before the switch");
    BOOST_TEST(fsynced_after(calls, parent, sw), "the parent directory is not fsynced after the switch");
  }
  // without --durable (upstream's saves never fsync): no leaf file is fsynced, the switch is the same rename
  {
    const std::string dst = parent + "/plain";
    const auto calls = recorded_convert(dir, {"convert", "--quiet", src, dst}, "plain");
    BOOST_TEST(switch_of(calls, dst) >= 0);
    BOOST_TEST(find_call(calls, [](const Call& c) { return c.op == "fsync" && c.a.find(".memmap") != std::string::npos; }) == -1);
  }
  // a Redis DST has no --durable (its server's persistence settings decide)
  Run r = run_tdx(dir, {"convert", "--durable", src, "redis://127.0.0.1:1/0"});
  BOOST_TEST((r.rc == 2 && r.err.find("--durable") != std::string::npos), r.rc << " " << r.err);
}

BOOST_AUTO_TEST_CASE(a_killed_convert_leaves_a_sibling_that_the_next_convert_removes) {
  BOOST_REQUIRE_MESSAGE(std::string(TD_TDX_EXE) != "", "TD_TDX_EXE is not defined (tests/CMakeLists.txt)");
  TempDir dir("tdx-killed");
  const std::string parent = fs::canonical(dir.path).string();
  const std::string dst = parent + "/dst", head = ".dst.td-stage.";
  // a big sparse source (float32 [rows, 1024]): the copy takes long enough to be killed in the middle. Should a
  // convert end before it is caught, the next attempt doubles the size (bounded)
  std::string stage;
  for (int64_t rows = 131072, attempt = 0; attempt < 3 && stage.empty(); rows *= 2, ++attempt) {
    const std::string big = parent + "/big" + std::to_string(attempt);
    fs::create_directories(big);
    std::ofstream(big + "/meta.json")
        << "{\"x\": {\"device\": \"cpu\", \"shape\": [" << rows << ", 1024], \"dtype\": \"torch.float32\", "
        << "\"is_nested\": false}, \"shape\": [" << rows << "], \"device\": \"cpu\", \"_type\": \"<class 'tensordict._td.TensorDict'>\"}";
    { std::ofstream create(big + "/x.memmap"); }
    BOOST_REQUIRE(::truncate((big + "/x.memmap").c_str(), rows * 1024 * 4) == 0);
    const pid_t pid = start_tdx({"convert", big, dst}, dir / "killed.out", dir / "killed.err");
    // the sibling appears, the copy's first leaf file inside it: then SIGKILL
    const auto end = Clock::now() + std::chrono::seconds(120);
    int status = 0;
    bool exited = false;
    while (Clock::now() < end) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::string found;
      for (const auto& n : entries_starting(parent, head))
        if (fs::is_directory(parent + "/" + n) && fs::exists(parent + "/" + n + "/data")) found = parent + "/" + n;
      if (!found.empty()) {
        ::kill(pid, SIGKILL);
        stage = found;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!exited) {
      const int rc = testutil::wait_child(pid, std::chrono::seconds(30));
      BOOST_TEST_MESSAGE("attempt " << attempt << " (" << rows << " rows): tdx " << testutil::describe_child(rc));
    }
    if (stage.empty()) fs::remove_all(dst);  // it finished first: try a bigger source
    fs::remove_all(big);
  }
  BOOST_REQUIRE_MESSAGE(!stage.empty(), "no convert could be caught in the middle of its copy");
  BOOST_TEST(fs::exists(stage), "the killed convert's sibling is gone already");
  BOOST_TEST(!fs::exists(dst));
  // a live sibling of another writer (this process holds its lock) must survive the next convert
  backends::StagingDir live(dst);
  BOOST_REQUIRE(!live.path().empty());
  // the next convert to the same DST removes the abandoned sibling and succeeds
  const std::string src = make_source(dir, "src");
  Run r = run_tdx(dir, {"convert", "--quiet", src, dst});
  BOOST_TEST(r.rc == 0, r.err);
  BOOST_TEST(!fs::exists(stage), "the killed convert's sibling '" << stage << "' is still there");
  BOOST_TEST(!fs::exists(stage + ".lock"));
  BOOST_TEST(fs::exists(live.path()), "a live sibling was removed");
  const auto left = entries_starting(parent, head);
  BOOST_TEST(left.size() == 2u, "beside DST: " << left.size() << " entries (the live sibling and its lock expected)");
  TensorDict back = TensorDict::load_memmap(dst);
  BOOST_TEST(back.get("a").equal(at::arange(12, at::kFloat).reshape({4, 3})));
}

// issue 35 item 4: a lazy stack is read and copied as one: a Python lazy-stack store (python-store.rdb) dumps,
// shows and verifies under its upstream class name, and lazy stacks convert directory <-> store keeping their
// ragged members; HDF5 gets the dense stack when the members stack and a clear refusal (nothing written) otherwise
BOOST_AUTO_TEST_CASE(lazy_stacks_convert_and_dump_between_directories_and_stores) {
  TempDir dir("tdx_lazy");
  const std::string base = fs::canonical(dir.path).string();
  testutil::RedisServer server(testutil::RedisServerOptions{fixtures::shared_dir() + "/fixtures/redis/python-store.rdb", "", false});
  const std::string url = "redis://127.0.0.1:" + std::to_string(server.port()) + "/0";
  const std::string py = url + "?prefix=tensordict&td_id=c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f";
  Run d = run_tdx(dir, {"dump", py, "--json", "--compact"});
  BOOST_TEST(d.rc == 0, d.err);
  BOOST_TEST(d.out.find("\"loaded_type\":\"LazyStackedTensorDictStore\"") != std::string::npos, d.out);
  BOOST_TEST(d.out.find("\"shape\":[5],\"values\":[0.0,10.0,20.0,30.0,40.0]") != std::string::npos, d.out);
  Run i = run_tdx(dir, {"info", py});
  BOOST_TEST(i.rc == 0, i.err);
  BOOST_TEST(i.out.find("LazyStackedTensorDictStore  batch_size=[2]  stack_dim=0  members=2") != std::string::npos, i.out);
  Run v = run_tdx(dir, {"verify", py});
  BOOST_TEST((v.rc == 0 && starts(v.out, "OK: 4 leaves, 48 bytes")), v.out << v.err);
  // store -> directory -> new store -> directory: the ragged members as they were
  Run c1 = run_tdx(dir, {"convert", "--quiet", py, base + "/a.mm"});
  BOOST_REQUIRE_MESSAGE(c1.rc == 0, c1.err);
  BOOST_TEST(is_lazy_stack_dir(base + "/a.mm"));
  Run c2 = run_tdx(dir, {"convert", "--quiet", base + "/a.mm", url + "?prefix=lz"});
  BOOST_REQUIRE_MESSAGE(c2.rc == 0, c2.err);
  RedisOptions ro = RedisOptions::from_url(c2.out.substr(0, c2.out.find('\n')));
  BOOST_REQUIRE(TensorDictStore::is_lazy_stack(ro.td_id(), ro));
  LazyStackedTensorDict back = TensorDictStore::load_lazy_stack(ro.td_id(), ro);
  LazyStackedTensorDict fixture = LazyStackedTensorDict::load_memmap(fixtures::python_written("f_lazy_stack"));
  BOOST_REQUIRE(back.tensordicts().size() == 2u);
  for (size_t m = 0; m < 2; ++m) {
    BOOST_TEST(back.tensordicts()[m].get("x").equal(fixture.tensordicts()[m].get("x")));
    BOOST_TEST(back.tensordicts()[m].get("shared").equal(fixture.tensordicts()[m].get("shared")));
  }
  // the Python fixture directory -> directory keeps the lazy stack
  Run c3 = run_tdx(dir, {"convert", "--quiet", fixtures::python_written("f_lazy_stack"), base + "/f.mm"});
  BOOST_REQUIRE_MESSAGE(c3.rc == 0, c3.err);
  LazyStackedTensorDict f = LazyStackedTensorDict::load_memmap(base + "/f.mm");
  BOOST_TEST(f.tensordicts()[1].get("x").equal(fixture.tensordicts()[1].get("x")));
  // HDF5: ragged members are refused before anything is written
  Run h = run_tdx(dir, {"convert", "--quiet", base + "/f.mm", base + "/f.h5"});
  BOOST_TEST(h.rc == 2);
  BOOST_TEST(h.err.find("HDF5 file cannot hold it") != std::string::npos, h.err);
  BOOST_TEST(!fs::exists(base + "/f.h5"));
  BOOST_TEST(entries_starting(base, ".f.h5").empty());
  // members that stack: the dense stack
  lazy_stack({TensorDict({{"x", at::arange(3, at::kFloat)}}, {}), TensorDict({{"x", at::arange(3, 6).to(at::kFloat)}}, {})})
      .memmap_(base + "/even.mm");
  Run h2 = run_tdx(dir, {"convert", "--quiet", base + "/even.mm", base + "/even.h5"});
  BOOST_REQUIRE_MESSAGE(h2.rc == 0, h2.err);
  PersistentTensorDict dense = PersistentTensorDict::from_h5(base + "/even.h5", "r");
  BOOST_TEST(dense.batch_size().at(0) == 2);  // HDF5 keeps no batch size: it is inferred again, as upstream
  BOOST_TEST(dense.get("x").equal(at::arange(6, at::kFloat).reshape({2, 3})));
  dense.close();
}

// issue 35 item 6: dump --json writes complex values as [re, im] pairs (streamed pieces included)
BOOST_AUTO_TEST_CASE(dump_json_writes_complex_values_as_pairs) {
  TempDir dir("tdx_complex");
  const std::string p = fs::canonical(dir.path).string() + "/c";
  at::Tensor z = at::view_as_complex(at::tensor({1.f, 2.f, 3.f, -4.f}).reshape({2, 2}));
  TensorDict({{"z", z}}, {2}).memmap_(p);
  Run compact = run_tdx(dir, {"dump", p, "--json", "--compact"});
  BOOST_TEST(compact.rc == 0, compact.err);
  BOOST_TEST(compact.out.find("\"values\":[[1.0,2.0],[3.0,-4.0]]") != std::string::npos, compact.out);
  Run pretty = run_tdx(dir, {"dump", p, "--json"});
  BOOST_TEST(pretty.out.find("\"values\": [[1.0, 2.0], [3.0, -4.0]]") != std::string::npos, pretty.out);
}

BOOST_AUTO_TEST_SUITE_END()
