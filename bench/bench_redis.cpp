//! bench_redis: TensorDictStore (a TensorDict on a Redis server, behind its store actor) against raw hiredis
//! sending the same commands to the same server, in the same process. The program starts its own
//! redis-server (loopback, a free port, --save '' --appendonly no) and stops it by pid.
//!  1. rows: 5 float32 leaves [10000, 64]. Reads store.index(idx).to_tensordict() for idx = 42, 100:356 and
//!     256 random rows (unsorted); writes store.index_put_(idx, rows) for 42 and 100:356. Raw: one pipeline
//!     of GETRANGE / SETRANGE per leaf for int / slice, and for random rows one EVALSHA of the GETRANGES Lua
//!     script (the store's, offsets and lengths per row) per leaf, in one pipeline.
//!  2. replay buffer: from_schema of 100k rows (obs [16] f32, action i64, reward f32, done bool), filled row
//!     by row by 4 producer threads, each with its own handle (from_store) and all sharing one handle:
//!     rows/s and store_stats() (row calls per merged pipeline), against raw hiredis with one round trip per
//!     row (4 SETRANGE pipelined) from 4 threads with a connection each, and against the server's ceiling: our
//!     commands per row (MULTI, a SETRANGE per leaf, EXEC) pipelined 64 rows deep from 4 connections (issue
//!     38). Then a sample of 256 random rows against the raw Lua gather.
//! Prints one JSON object (µs per call, medians of alternating samples); asserts nothing.
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <tensordict/tensordict.hpp>

#include "bench_common.hpp"
#include "redis_server.hpp"

using namespace tensordict;
using namespace benchutil;
using at::indexing::Slice;

namespace {

constexpr int64_t kRows = 10000;
constexpr int64_t kFeatures = 64;
constexpr int kLeaves = 5;
constexpr int64_t kReplayRows = 100000;
constexpr int kProducers = 4;
const char* const kPrefix = "tensordict";

volatile int64_t g_sink = 0;

//! one facade round trip to an actor (Engine::ping to the engine's echo actor), measured in this run:
//! the hop each store call pays on top of its backend work
double actor_hop_us() {
  auto engine = Engine::default_engine();
  return measure_one([&] { g_sink = g_sink + engine->ping(1); }, 3e5, 1000);
}

// the store's GETRANGES script (backends/src/redis_store.cpp, Python's _LUA_GETRANGES)
const char* const kLuaGetRanges =
    "local k = KEYS[1]\n"
    "local out = {}\n"
    "for i = 1, #ARGV, 2 do\n"
    "  local off = tonumber(ARGV[i])\n"
    "  local len = tonumber(ARGV[i + 1])\n"
    "  if len > 0 then out[#out + 1] = redis.call('GETRANGE', k, off, off + len - 1) end\n"
    "end\n"
    "return table.concat(out)\n";

std::string data_key(const std::string& td_id, const std::string& leaf) {
  return std::string(kPrefix) + ":{" + td_id + "}:d:" + leaf;
}

//! one hiredis connection; commands are appended (pipelined) and their replies read in order
class Raw {
 public:
  explicit Raw(int port) {
    ctx_ = redisConnect("127.0.0.1", port);
    if (!ctx_ || ctx_->err) throw std::runtime_error("hiredis: cannot connect");
  }
  ~Raw() { redisFree(ctx_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  //! appends a command; args point at caller-owned bytes (no copy of payloads)
  void append(const std::vector<const char*>& argv, const std::vector<size_t>& lens) {
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), const_cast<const char**>(argv.data()),
                               lens.data()) != REDIS_OK)
      throw std::runtime_error("hiredis: append failed");
  }
  redisReply* reply() {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || !r) throw std::runtime_error("hiredis: no reply");
    auto* rr = static_cast<redisReply*>(r);
    if (rr->type == REDIS_REPLY_ERROR) {
      std::string msg(rr->str, rr->len);
      freeReplyObject(rr);
      throw std::runtime_error("redis: " + msg);
    }
    return rr;
  }
  std::string load_script(const char* script) {
    append({"SCRIPT", "LOAD", script}, {6, 4, std::strlen(script)});
    redisReply* r = reply();
    std::string sha(r->str, r->len);
    freeReplyObject(r);
    return sha;
  }

 private:
  redisContext* ctx_ = nullptr;
};

//! an argv built from strings (owned) and views (borrowed)
struct Cmd {
  std::vector<std::string> owned;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  Cmd& s(std::string v) {
    owned.push_back(std::move(v));
    return *this;
  }
  //! finalises argv after every owned string is in place; views are appended with view()
  void seal() {
    argv.clear();
    lens.clear();
    for (const auto& o : owned) {
      argv.push_back(o.data());
      lens.push_back(o.size());
    }
  }
};

//! MULTI or EXEC, built once
const Cmd& tx_cmd(bool begin) {
  auto word = [](const char* w) {
    Cmd m;
    m.s(w);
    m.seal();
    return m;
  };
  static const Cmd multi = word("MULTI"), exec = word("EXEC");
  return begin ? multi : exec;
}

//! a pipeline of one command per leaf; each reply's bytes are copied into a fresh tensor. `tx`: the commands
//! wrapped in MULTI / EXEC, as the store sends a request of several leaves (the same commands)
std::vector<at::Tensor> raw_read(Raw& raw, std::vector<Cmd>& cmds, int64_t rows, const std::vector<int64_t>& row_shape,
                                 const std::vector<at::ScalarType>& dtypes, bool tx = false) {
  if (tx) raw.append(tx_cmd(true).argv, tx_cmd(true).lens);
  for (auto& c : cmds) raw.append(c.argv, c.lens);
  if (tx) raw.append(tx_cmd(false).argv, tx_cmd(false).lens);
  redisReply* exec = nullptr;
  if (tx) {
    for (size_t k = 0; k < cmds.size() + 1; ++k) freeReplyObject(raw.reply());  // +OK, +QUEUED...
    exec = raw.reply();
    if (exec->type != REDIS_REPLY_ARRAY || exec->elements != cmds.size()) {
      freeReplyObject(exec);
      throw std::runtime_error("raw read: unexpected EXEC reply");
    }
  }
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < cmds.size(); ++k) {
    redisReply* r = tx ? exec->element[k] : raw.reply();
    std::vector<int64_t> shape = {rows};
    if (row_shape[k] > 0) shape.push_back(row_shape[k]);
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtypes[k]));
    const bool ok = static_cast<size_t>(t.nbytes()) == r->len;
    if (ok) std::memcpy(t.data_ptr(), r->str, r->len);
    if (!tx) freeReplyObject(r);
    if (!ok) {
      if (exec) freeReplyObject(exec);
      throw std::runtime_error("raw read: unexpected length");
    }
    out.push_back(t);
  }
  if (exec) freeReplyObject(exec);
  return out;
}

void raw_write(Raw& raw, const std::vector<Cmd>& cmds, bool tx = false) {
  if (tx) raw.append(tx_cmd(true).argv, tx_cmd(true).lens);
  for (const auto& c : cmds) raw.append(c.argv, c.lens);
  if (tx) raw.append(tx_cmd(false).argv, tx_cmd(false).lens);
  for (size_t k = 0; k < cmds.size() + (tx ? 2 : 0); ++k) freeReplyObject(raw.reply());
}

std::vector<int64_t> to_vec(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

//! GETRANGE of rows [first, first + count) of every leaf
std::vector<Cmd> getrange_cmds(const std::string& id, const std::vector<std::string>& leaves,
                               const std::vector<int64_t>& row_bytes, int64_t first, int64_t count) {
  std::vector<Cmd> cmds;
  for (size_t k = 0; k < leaves.size(); ++k) {
    Cmd c;
    c.s("GETRANGE").s(data_key(id, leaves[k])).s(std::to_string(first * row_bytes[k]))
        .s(std::to_string((first + count) * row_bytes[k] - 1));
    c.seal();
    cmds.push_back(std::move(c));
  }
  return cmds;
}

//! EVALSHA GETRANGES with (offset, length) per row in the given order, one per leaf
std::vector<Cmd> gather_cmds(const std::string& id, const std::string& sha, const std::vector<std::string>& leaves,
                             const std::vector<int64_t>& row_bytes, const std::vector<int64_t>& rows) {
  std::vector<Cmd> cmds;
  for (size_t k = 0; k < leaves.size(); ++k) {
    Cmd c;
    c.s("EVALSHA").s(sha).s("1").s(data_key(id, leaves[k]));
    for (int64_t r : rows) c.s(std::to_string(r * row_bytes[k])).s(std::to_string(row_bytes[k]));
    c.seal();
    cmds.push_back(std::move(c));
  }
  return cmds;
}

//! SETRANGE of rows [first, first + count) of every leaf from `src` (views into the tensors)
std::vector<Cmd> setrange_cmds(const std::string& id, const std::vector<std::string>& leaves,
                               const std::vector<int64_t>& row_bytes, int64_t first, int64_t count,
                               const std::vector<at::Tensor>& src) {
  std::vector<Cmd> cmds;
  for (size_t k = 0; k < leaves.size(); ++k) {
    Cmd c;
    c.s("SETRANGE").s(data_key(id, leaves[k])).s(std::to_string(first * row_bytes[k]));
    c.seal();
    c.argv.push_back(static_cast<const char*>(src[k].data_ptr()));
    c.lens.push_back(static_cast<size_t>(count * row_bytes[k]));
    cmds.push_back(std::move(c));
  }
  return cmds;
}

RedisOptions options(int port) { return RedisOptions().host("127.0.0.1").port(port).prefix(kPrefix); }

Json bench_rows(int port) {
  std::vector<std::string> leaves;
  Dict d;
  for (int k = 0; k < kLeaves; ++k) {
    leaves.push_back("leaf" + std::to_string(k));
    d.emplace_back(leaves.back(), at::randn({kRows, kFeatures}));
  }
  TensorDict src(d, {kRows});
  TensorDictStore store = TensorDictStore::from_tensordict(src, options(port));
  const std::string id = store.td_id();
  Raw raw(port);
  const std::string sha = raw.load_script(kLuaGetRanges);
  const std::vector<int64_t> row_bytes(kLeaves, kFeatures * 4), row_shape(kLeaves, kFeatures);
  const std::vector<at::ScalarType> dtypes(kLeaves, at::kFloat);
  at::Tensor random_rows = at::randperm(kRows, at::kLong).index({Slice(0, 256)});
  const double hop_us = actor_hop_us();
  // the lazy view alone (td[42] without reading): what a call costs before its request
  const double view_us = measure_one([&] { g_sink = g_sink + store.index({42}).batch_size().size(); }, 2e5, 1000);
  std::vector<Json> results;
  // `same`: ours against raw hiredis sending the same commands as the store (MULTI / EXEC around a request of
  // several leaves: the atomicity of a row); `p`: against the bare pipeline (no transaction)
  auto record = [&](const std::string& name, const Pair& p, const Pair& same, const std::string& raw_cmds,
                    double python_us) {
    Json j;
    j.str("name", name).num("td_us", p.ours_us).num("raw_us", p.raw_us).num("ratio", p.ratio(), 2)
        .num("ratio_without_hop", (p.ours_us - hop_us) / p.raw_us, 2)
        .num("td_us_vs_tx", same.ours_us).num("raw_tx_us", same.raw_us)
        .num("ratio_same_commands", same.ratio(), 2)
        .str("raw", raw_cmds).num("python_us", python_us, 0);
    results.push_back(j);
  };
  auto read_case = [&](const std::string& name, const Index& idx, std::vector<Cmd>& c, int64_t rows,
                       const std::string& raw_cmds, double python_us) {
    auto ours = [&] { g_sink = g_sink + store.index(idx).to_tensordict().numel(); };
    Pair p = measure_pair(ours, [&] { g_sink = g_sink + raw_read(raw, c, rows, row_shape, dtypes).size(); });
    Pair same = measure_pair(ours, [&] { g_sink = g_sink + raw_read(raw, c, rows, row_shape, dtypes, true).size(); });
    record(name, p, same, raw_cmds, python_us);
  };
  auto write_case = [&](const std::string& name, const Index& idx, const TensorDict& sub, std::vector<Cmd>& c,
                        const std::string& raw_cmds, double python_us) {
    auto ours = [&] { store.index_put_(idx, sub); };
    Pair p = measure_pair(ours, [&] { raw_write(raw, c); });
    Pair same = measure_pair(ours, [&] { raw_write(raw, c, true); });
    record(name, p, same, raw_cmds, python_us);
  };
  // reads
  {
    std::vector<Cmd> c = getrange_cmds(id, leaves, row_bytes, 42, 1);
    read_case("read int[42]", {42}, c, 1, "pipeline: GETRANGE per leaf", 326);
  }
  {
    std::vector<Cmd> c = getrange_cmds(id, leaves, row_bytes, 100, 256);
    read_case("read slice[100:356]", {Slice(100, 356)}, c, 256, "pipeline: GETRANGE per leaf", 622);
  }
  {
    std::vector<Cmd> c = gather_cmds(id, sha, leaves, row_bytes, to_vec(random_rows));
    read_case("read long[256 random rows]", {random_rows}, c, 256, "pipeline: EVALSHA GETRANGES per leaf", 5242);
  }
  // writes
  {
    TensorDict sub = src.index({42}).clone();
    std::vector<at::Tensor> vals;
    for (const auto& l : leaves) vals.push_back(sub.get(l).contiguous());
    std::vector<Cmd> c = setrange_cmds(id, leaves, row_bytes, 42, 1, vals);
    write_case("write int[42]", {42}, sub, c, "pipeline: SETRANGE per leaf", 652);
  }
  {
    TensorDict sub = src.index({Slice(100, 356)}).clone();
    std::vector<at::Tensor> vals;
    for (const auto& l : leaves) vals.push_back(sub.get(l).contiguous());
    std::vector<Cmd> c = setrange_cmds(id, leaves, row_bytes, 100, 256, vals);
    write_case("write slice[100:356]", {Slice(100, 356)}, sub, c, "pipeline: SETRANGE per leaf", 653);
  }
  bool same = store.to_tensordict().get("leaf3").equal(src.get("leaf3"));
  auto st = store.store_stats();
  store.clear_redis();
  Json j;
  j.num("verified", same ? 1 : 0, 0)
      .num("actor_hop_us", hop_us)
      .num("index_view_only_us", view_us)
      .num("actor_hop_after_us", actor_hop_us())
      .num("store_calls", static_cast<double>(st.calls), 0)
      .num("store_batches", static_cast<double>(st.batches), 0)
      .arr("results", results);
  return j;
}

// ------------------------------------------------------------------------------------------ replay buffer
Schema replay_schema() {
  return {{"obs", {BatchSize{16}, at::kFloat}},
          {"action", {BatchSize{}, at::kLong}},
          {"reward", {BatchSize{}, at::kFloat}},
          {"done", {BatchSize{}, at::kBool}}};
}

TensorDict replay_values(int64_t n) {
  at::Tensor r = at::arange(n, at::kLong);
  return TensorDict(Dict{{"obs", r.to(at::kFloat).unsqueeze(1) + at::arange(16, at::kFloat).unsqueeze(0) / 16},
                         {"action", r},
                         {"reward", r.to(at::kFloat) / 2},
                         {"done", (r % 2) == 1}},
                    {n});
}

//! this process's CPU time (user + system, all threads) in seconds
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
//! the CPU time this process spent in the last run_threads (the server's is not counted)
double g_last_cpu_s = 0;

double run_threads(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int k = 0; k < n; ++k)
    ts.emplace_back([&, k] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      body(k);
    });
  while (ready.load() < n) std::this_thread::yield();
  const double cpu0 = process_cpu_s();
  auto t0 = Clock::now();
  go.store(true);
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  g_last_cpu_s = process_cpu_s() - cpu0;
  return s;
}

Json bench_replay(int port) {
  const std::vector<std::string> leaves = {"obs", "action", "reward", "done"};
  const std::vector<int64_t> row_bytes = {16 * 4, 8, 4, 1}, row_shape = {16, 0, 0, 0};
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kLong, at::kFloat, at::kBool};
  TensorDict values = replay_values(kReplayRows);
  Json j;
  j.num("rows", kReplayRows, 0).num("producers", kProducers, 0);
  double own_rows_per_s = 0, shared_rows_per_s = 0;

  auto verify = [&](const TensorDict& buf) {
    TensorDict back = buf.to_tensordict();
    bool ok = true;
    for (const auto& l : leaves) ok = ok && back.get(l).equal(values.get(l));
    return ok;
  };

  // TD_BENCH_ONLY=behind: the write-behind fills alone (for a profiler)
  const char* only = std::getenv("TD_BENCH_ONLY");
  const bool only_behind = only && std::string(only) == "behind";
  // TD_BENCH_ONLY=sync: the synchronous fills and the raw round trips alone (no write-behind, ceiling, sample)
  const bool only_sync = only && std::string(only) == "sync";
  // (a) 4 threads, a handle each (from_store)
  if (!only_behind) {
    TensorDictStore buf = TensorDictStore::from_schema(replay_schema(), {kReplayRows}, options(port));
    std::vector<TensorDictStore> handles;
    for (int k = 0; k < kProducers; ++k) handles.push_back(TensorDictStore::from_store(buf.td_id(), options(port)));
    double s = run_threads(kProducers, [&](int k) {
      for (int64_t r = k; r < kReplayRows; r += kProducers) handles[k].index_put_({r}, values.index({r}));
    });
    int64_t calls = 0, batches = 0, largest = 0;
    for (auto& h : handles) {
      auto st = h.store_stats();
      calls += st.calls;
      batches += st.batches;
      largest = std::max(largest, st.largest);
    }
    own_rows_per_s = kReplayRows / s;
    j.num("own_handles_rows_per_s", own_rows_per_s, 0)
        .num("own_handles_cpu_us_per_row", 1e6 * g_last_cpu_s / kReplayRows, 2)
        .num("own_handles_calls", static_cast<double>(calls), 0)
        .num("own_handles_batches", static_cast<double>(batches), 0)
        .num("own_handles_calls_per_batch", batches ? static_cast<double>(calls) / batches : 0, 2)
        .num("own_handles_largest_batch", static_cast<double>(largest), 0)
        .num("own_handles_verified", verify(buf) ? 1 : 0, 0);
    for (auto& h : handles) h.close();
    buf.clear_redis();
  }
  // (b) 4 threads sharing one handle
  TensorDictStore buf = TensorDictStore::from_schema(replay_schema(), {kReplayRows}, options(port));
  if (!only_behind) {
    auto before = buf.store_stats();
    double s = run_threads(kProducers, [&](int k) {
      for (int64_t r = k; r < kReplayRows; r += kProducers) buf.index_put_({r}, values.index({r}));
    });
    auto st = buf.store_stats();
    const double calls = static_cast<double>(st.calls - before.calls), batches = static_cast<double>(st.batches - before.batches);
    shared_rows_per_s = kReplayRows / s;
    j.num("shared_handle_rows_per_s", shared_rows_per_s, 0)
        .num("shared_handle_cpu_us_per_row", 1e6 * g_last_cpu_s / kReplayRows, 2)
        .num("shared_handle_calls", calls, 0)
        .num("shared_handle_batches", batches, 0)
        .num("shared_handle_calls_per_batch", batches > 0 ? calls / batches : 0, 2)
        .num("shared_handle_largest_batch", static_cast<double>(st.largest), 0)
        .num("shared_handle_lane_calls", static_cast<double>(st.lane_calls - before.lane_calls), 0)
        .num("shared_handle_verified", verify(buf) ? 1 : 0, 0);
  }
  // (e) write-behind (RedisOptions::write_behind): the same two fills with writes that return once queued, the
  // store actor sending what waits as one pipeline; the time includes flush_writes() (every row on the server)
  double behind_own = 0, behind_shared = 0;
  const RedisOptions wb = options(port).write_behind(4096);
  //! the write-behind fill through a handle per producer: rows/s, calls per batch and whether every row arrived
  struct BehindFill {
    double rows_per_s, calls_per_batch;
    bool verified;
  };
  auto behind_own_fill = [&] {
    TensorDictStore own = TensorDictStore::from_schema(replay_schema(), {kReplayRows}, options(port));
    std::vector<TensorDictStore> handles;
    for (int k = 0; k < kProducers; ++k) handles.push_back(TensorDictStore::from_store(own.td_id(), wb));
    double s = run_threads(kProducers, [&](int k) {
      for (int64_t r = k; r < kReplayRows; r += kProducers) handles[k].index_put_({r}, values.index({r}));
      handles[k].flush_writes();
    });
    int64_t calls = 0, batches = 0;
    for (auto& h : handles) {
      calls += h.store_stats().calls;
      batches += h.store_stats().batches;
    }
    BehindFill f{kReplayRows / s, batches ? static_cast<double>(calls) / batches : 0, verify(own)};
    for (auto& h : handles) h.close();
    own.clear_redis();
    return f;
  };
  if (!only_sync) {
    const BehindFill f = behind_own_fill();
    behind_own = f.rows_per_s;
    j.num("write_behind_own_handles_rows_per_s", behind_own, 0)
        .num("write_behind_own_handles_cpu_us_per_row", 1e6 * g_last_cpu_s / kReplayRows, 2)
        .num("write_behind_own_handles_calls_per_batch", f.calls_per_batch, 1)
        .num("write_behind_own_handles_verified", f.verified ? 1 : 0, 0);
    TensorDictStore shared = TensorDictStore::from_schema(replay_schema(), {kReplayRows}, wb);
    const double s = run_threads(kProducers, [&](int k) {
      for (int64_t r = k; r < kReplayRows; r += kProducers) shared.index_put_({r}, values.index({r}));
      shared.flush_writes();
    });
    behind_shared = kReplayRows / s;
    const auto st = shared.store_stats();
    j.num("write_behind_shared_handle_rows_per_s", behind_shared, 0)
        .num("write_behind_shared_handle_calls_per_batch", st.batches ? static_cast<double>(st.calls) / st.batches : 0, 1)
        .num("write_behind_shared_handle_verified", verify(shared) ? 1 : 0, 0);
    shared.clear_redis();
  }
  // (f) what the producers' own work costs: the same 4 threads making each row (values.index) and writing it
  // into an in-memory TensorDict of the same schema (no store): a fill through any store is slower than this
  {
    TensorDict mem = TensorDict::from_schema(replay_schema(), {kReplayRows});
    const double s = run_threads(kProducers, [&](int k) {
      for (int64_t r = k; r < kReplayRows; r += kProducers) mem.index_put_({r}, values.index({r}));
    });
    j.num("producers_into_memory_rows_per_s", kReplayRows / s, 0);
  }
  // (c) and (d): a fresh store, one raw connection per producer, each leaf's column and data key
  struct RawFill {
    TensorDictStore buf;
    std::vector<at::Tensor> cols;
    std::vector<std::unique_ptr<Raw>> conns;
    std::vector<std::string> keys;
    std::vector<int64_t> row_bytes;
    //! one SETRANGE per leaf of row r on producer k's connection (hiredis copies a command when appended)
    void append_row(int k, int64_t r) {
      for (size_t l = 0; l < keys.size(); ++l) {
        const std::string off = std::to_string(r * row_bytes[l]);
        const char* p = static_cast<const char*>(cols[l].data_ptr()) + r * row_bytes[l];
        conns[k]->append({"SETRANGE", keys[l].c_str(), off.c_str(), p},
                         {8, keys[l].size(), off.size(), static_cast<size_t>(row_bytes[l])});
      }
    }
  };
  // one row as the store sends it: MULTI, a SETRANGE per leaf, EXEC (leaves + 2 replies)
  auto append_tx_row = [](RawFill& f, Raw& raw, int k, int64_t r) {
    raw.append(tx_cmd(true).argv, tx_cmd(true).lens);
    f.append_row(k, r);
    raw.append(tx_cmd(false).argv, tx_cmd(false).lens);
  };
  auto raw_fill = [&] {
    auto f = std::make_unique<RawFill>(RawFill{TensorDictStore::from_schema(replay_schema(), {kReplayRows}, options(port)),
                                               {}, {}, {}, row_bytes});
    for (const auto& l : leaves) {
      f->cols.push_back(values.get(l).contiguous());
      f->keys.push_back(data_key(f->buf.td_id(), l));
    }
    for (int k = 0; k < kProducers; ++k) f->conns.push_back(std::make_unique<Raw>(port));
    return f;
  };
  // (c) raw: 4 threads, a connection each, one round trip per row: 4 SETRANGE pipelined, and (c') our commands
  // (MULTI, a SETRANGE per leaf, EXEC): what 4 synchronous callers can reach at best (one row in flight each, the
  // transaction of a row as upstream's pipeline sends it)
  auto raw_round_trips = [&](bool tx, const std::string& rate_key, const std::string& verified_key, const std::string& vs) {
    auto fill = raw_fill();
    const size_t replies_per_row = leaves.size() + (tx ? 2 : 0);  // tx: +OK, +QUEUED per leaf, the EXEC array
    double s = run_threads(kProducers, [&](int k) {
      Raw& raw = *fill->conns[k];
      for (int64_t r = k; r < kReplayRows; r += kProducers) {
        if (tx) {
          append_tx_row(*fill, raw, k, r);
        } else {
          fill->append_row(k, r);
        }
        for (size_t n = 0; n < replies_per_row; ++n) freeReplyObject(raw.reply());
      }
    });
    const double rate = kReplayRows / s;
    j.num(rate_key, rate, 0)
        .num(rate_key.substr(0, rate_key.size() - std::string("rows_per_s").size()) + "cpu_us_per_row",
             1e6 * g_last_cpu_s / kReplayRows, 2)
        .num(verified_key, verify(fill->buf) ? 1 : 0, 0)
        .num("own_handles_vs_" + vs, own_rows_per_s / rate, 2)
        .num("shared_handle_vs_" + vs, shared_rows_per_s / rate, 2);
    fill->buf.clear_redis();
    return rate;
  };
  if (!only_behind) {
    raw_round_trips(false, "raw_round_trip_per_row_rows_per_s", "raw_verified", "raw");
    raw_round_trips(true, "raw_round_trip_tx_per_row_rows_per_s", "raw_tx_verified", "raw_tx");
  }
  // (d) the server's ceiling (issue 38): 4 threads, a connection each, our commands per row (MULTI, one
  // SETRANGE per leaf, EXEC) pipelined kDepth rows deep before the replies are read
  auto ceiling_fill = [&](bool report) {
    constexpr int64_t kDepth = 64;
    auto fill = raw_fill();
    const size_t replies_per_row = leaves.size() + 2;  // +OK, +QUEUED per leaf, the EXEC array
    double s = run_threads(kProducers, [&](int k) {
      Raw& raw = *fill->conns[k];
      int64_t pending = 0;
      auto drain = [&] {
        for (size_t n = 0; n < static_cast<size_t>(pending) * replies_per_row; ++n) freeReplyObject(raw.reply());
        pending = 0;
      };
      for (int64_t r = k; r < kReplayRows; r += kProducers) {
        append_tx_row(*fill, raw, k, r);
        if (++pending == kDepth) drain();
      }
      drain();
    });
    const double ceiling = kReplayRows / s;
    if (report) {
      j.num("raw_pipelined_tx_rows_per_s", ceiling, 0)
          .num("raw_pipelined_tx_cpu_us_per_row", 1e6 * g_last_cpu_s / kReplayRows, 2)
          .num("raw_pipelined_verified", verify(fill->buf) ? 1 : 0, 0)
          .num("own_handles_vs_ceiling", own_rows_per_s / ceiling, 2)
          .num("shared_handle_vs_ceiling", shared_rows_per_s / ceiling, 2)
          .num("write_behind_own_handles_vs_ceiling", behind_own / ceiling, 2)
          .num("write_behind_shared_handle_vs_ceiling", behind_shared / ceiling, 2);
    }
    fill->buf.clear_redis();
    return ceiling;
  };
  if (!only_behind && !only_sync) {
    ceiling_fill(true);
    // the server's ceiling moves from run to run on a shared host (190-300k rows/s): five more pairs, the own-handle
    // write-behind fill right before the ceiling each time, and the median of their ratios
    std::vector<double> ratios;
    for (int pair = 0; pair < 5; ++pair) {
      const double own = behind_own_fill().rows_per_s;
      ratios.push_back(own / ceiling_fill(false));
    }
    std::sort(ratios.begin(), ratios.end());
    std::string list;
    for (double r : ratios) list += (list.empty() ? "" : ", ") + std::to_string(r).substr(0, 4);
    j.num("write_behind_own_handles_vs_ceiling_median_of_5_pairs", ratios[2], 2)
        .str("write_behind_own_handles_vs_ceiling_pairs", "[" + list + "]");
  }
  // sample 256 random rows from the filled buffer vs the raw Lua gather
  if (!only_behind && !only_sync) {
    Raw raw(port);
    const std::string sha = raw.load_script(kLuaGetRanges);
    at::Tensor rows = at::randint(0, kReplayRows, {256}, at::kLong);
    std::vector<Cmd> c = gather_cmds(buf.td_id(), sha, leaves, row_bytes, to_vec(rows));
    Pair p = measure_pair([&] { g_sink = g_sink + buf.index({rows}).to_tensordict().numel(); },
                          [&] { g_sink = g_sink + raw_read(raw, c, 256, row_shape, dtypes).size(); });
    const double hop_us = actor_hop_us();
    j.num("sample_256_td_us", p.ours_us).num("sample_256_raw_us", p.raw_us).num("sample_256_ratio", p.ratio(), 2)
        .num("sample_256_ratio_without_hop", (p.ours_us - hop_us) / p.raw_us, 2).num("actor_hop_us", hop_us);
  }
  buf.clear_redis();
  return j;
}

}  // namespace

int main() {
  at::manual_seed(0);
  at::set_num_threads(1);
  try {
    testutil::RedisServer server;
    Json out;
    out.str("benchmark", "redis").str("unit", "us");
    Json config;
    config.num("rows", kRows, 0).num("leaves", kLeaves, 0).num("features", kFeatures, 0)
        .str("server", "redis-server on 127.0.0.1 (TCP), --save '' --appendonly no");
    out.obj("config", config);
    Json targets;
    targets.num("ratio", 1.2, 1).num("fill_rows_per_s", 50000, 0).num("sample_ratio", 1.1, 1);
    out.obj("targets", targets);
    Json python;
    python.num("fill_rows_per_s", 2189, 0);
    out.obj("python", python);
    // TD_BENCH_ONLY=rows|replay runs one part (quicker iterations; the JSON then lacks the other)
    const char* only = std::getenv("TD_BENCH_ONLY");
    const std::string part = only ? only : "";
    if (part.empty() || part == "rows") out.obj("rows", bench_rows(server.port()));
    if (part.empty() || part == "replay" || part == "behind" || part == "sync") out.obj("replay", bench_replay(server.port()));
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_redis: %s\n", e.what());
    return 1;
  }
  return 0;
}
