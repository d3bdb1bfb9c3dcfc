// TensorDictStore: Redis stores as TensorDicts behind their store actor, against a real redis-server.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <mutex>
#include <thread>
#include <type_traits>

#include <boost/test/unit_test.hpp>

#include "process_util.hpp"
#include "api/loader_fns.hpp"
#include "api/map_process_fns.hpp"
#include "api/remote_fixtures.hpp"
#include "engine/fixtures.hpp"
#include "redis_server.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/redis_client.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using namespace at::indexing;

using remote_fixtures::indices;
using remote_fixtures::same;
using remote_fixtures::sample;

namespace {

using testutil::children_cmdlines;

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {  // one handler: E may be std::exception itself
    if constexpr (std::is_same_v<E, std::exception>) {
      return e.what();
    } else {
      if (dynamic_cast<const E*>(&e)) return e.what();
      return std::string("wrong exception type: ") + e.what();
    }
  }
  return "no exception";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

//! a tensorclass that declares the Python class path it maps to (issue 35 item 10)
struct DeclaredPair : TensorClass<DeclaredPair> {
  TD_FIELDS_AT(DeclaredPair, "mypkg.models.Pair", TD_TENSOR(a), TD_DATA(std::string, label))
};

}  // namespace

namespace shapes {
//! TD_FIELDS without a declared path: it records its C++ qualified name
struct Pair : TensorClass<Pair> {
  TD_FIELDS(Pair, TD_TENSOR(a), TD_DATA(std::string, label))
};
}  // namespace shapes

BOOST_AUTO_TEST_SUITE(tensordict_store)

BOOST_AUTO_TEST_CASE(python_rdb_fixture_loads) {
  testutil::RedisServerOptions so;
  so.rdb_file = std::string(TD_SHARED_DIR) + "/fixtures/redis/python-store.rdb";
  testutil::RedisServer server(so);
  JsonValue want = fixtures::read_json(std::string(TD_SHARED_DIR) + "/fixtures/redis/python-store.expected.json");
  int checked = 0;
  for (const auto& st : want.find("stores")->as_array()) {
    if (st.find("store_type")->as_string() != "TensorDictStore") continue;
    TensorDictStore s = TensorDictStore::from_store(st.find("td_id")->as_string(),
                                                    RedisOptions().port(server.port()).prefix(st.find("prefix")->as_string()));
    BatchSize bs;
    for (const auto& b : st.find("structure")->find("batch_size")->as_array()) bs.push_back(b.as_int());
    BOOST_TEST(s.batch_size() == bs);
    TensorDict dense = s.to_tensordict();
    for (const auto& leaf : st.find("leaves")->as_array()) {
      std::vector<std::string> parts;
      for (const auto& p : leaf.find("key")->as_array()) parts.push_back(p.as_string());
      NestedKey key(parts);
      if (leaf.find("kind")->as_string() != "tensor") {
        BOOST_TEST(dense.get_non_tensor(key) == *leaf.find("data"), key.repr());
        continue;
      }
      at::Tensor t = dense.get(key);
      BOOST_TEST(backends::dtype_to_string(t.scalar_type()) == leaf.find("dtype")->as_string());
      at::Tensor flat = t.reshape({-1}).to(at::kDouble);
      const auto& values = leaf.find("values")->as_array();
      BOOST_REQUIRE(static_cast<int64_t>(values.size()) == flat.numel());
      for (size_t i = 0; i < values.size(); ++i) {
        double v = values[i].is_bool() ? (values[i].as_bool() ? 1.0 : 0.0) : values[i].as_double();
        BOOST_TEST(flat[static_cast<int64_t>(i)].item<double>() == v, key.repr() << "[" << i << "]");
      }
    }
    ++checked;
  }
  BOOST_TEST(checked == 2);
  // the lazy-stack store: two 0-dim members whose x is ragged ([3] and [5]): both come back whole
  for (const auto& st : want.find("stores")->as_array()) {
    if (st.find("store_type")->as_string() != "LazyStackedTensorDictStore") continue;
    LazyStackedTensorDict lz = TensorDictStore::load_lazy_stack(
        st.find("td_id")->as_string(), RedisOptions().port(server.port()).prefix(st.find("prefix")->as_string()));
    BOOST_REQUIRE(lz.tensordicts().size() == 2);
    BOOST_TEST(lz.tensordicts()[0].get("x").sizes() == at::IntArrayRef({3}));
    BOOST_TEST(lz.tensordicts()[1].get("x").sizes() == at::IntArrayRef({5}));
    BOOST_TEST(lz.tensordicts()[1].get("shared").item<int64_t>() == 2);
    ++checked;
  }
  BOOST_TEST(checked == 3);
  BOOST_CHECK_THROW(TensorDictStore::load_lazy_stack("6f1c2a9e-3b5d-4c8e-9a7f-0d1e2f3a4b5c", RedisOptions().port(server.port())),
                    KeyError);
}

BOOST_AUTO_TEST_CASE(lazy_stack_stores_round_trip_ragged_members) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  std::vector<TensorDict> parts;
  for (int i = 0; i < 3; ++i) {
    TensorDict p({{"x", at::arange(2 * (i + 1)).to(at::kFloat).view({2, i + 1})}, {"y", at::full({2}, i)}}, {2});
    parts.push_back(p);
  }
  LazyStackedTensorDict lz(parts, 0);
  const std::string id = TensorDictStore::save_lazy_stack(lz, o);
  LazyStackedTensorDict back = TensorDictStore::load_lazy_stack(id, o);
  BOOST_REQUIRE(back.tensordicts().size() == 3);
  BOOST_TEST(back.stack_dim() == 0);
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST(back.tensordicts()[i].get("x").equal(parts[i].get("x")));
    BOOST_TEST(back.tensordicts()[i].get("y").equal(parts[i].get("y")));
  }
}

BOOST_AUTO_TEST_CASE(index_reads_and_writes_match_the_dense_tensordict) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict ref = sample(16, 1);
  TensorDictStore s = TensorDictStore::from_tensordict(ref, o);
  BOOST_TEST(same(s.to_tensordict(), ref));
  int i = 0;
  for (const auto& idx : indices(16)) {
    BOOST_TEST(same(s.index(idx).to_tensordict(), ref.index(idx)), "read " << index_repr(idx));
    TensorDict rows = ref.index(idx).clone();
    rows.apply_([&](const at::Tensor& t) { return t.dtype() == at::kBool ? t.logical_not() : t + (++i); });
    s.index_put_(idx, rows);
    ref.index_put_(idx, rows);
    BOOST_TEST(same(s.to_tensordict(), ref), "write " << index_repr(idx));
  }
  // another handle on the same td_id sees the same values
  TensorDictStore again = TensorDictStore::from_store(s.td_id(), o);
  BOOST_TEST(same(again.to_tensordict(), ref));
  BOOST_TEST(s.address().find("td_id=" + s.td_id()) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(empty_store_filled_by_indexed_writes) {
  // upstream's check=False pattern: keys are created by their first indexed write at the full batch size
  testutil::RedisServer server;
  TensorDictStore buf({10}, RedisOptions().port(server.port()));
  BOOST_TEST(buf.keys().empty());
  TensorDict row({{"obs", at::ones({3})}, {"reward", at::full({}, 2.0)}}, {});
  row.set({"next", "done"}, at::ones({}, at::kBool));
  buf.index_put_({4}, row);
  BOOST_TEST(buf.get("obs").sizes() == at::IntArrayRef({10, 3}));
  BOOST_TEST(buf.get("obs")[4].eq(1).all().item<bool>());
  BOOST_TEST(buf.get("obs").sum().item<float>() == 3.0f);
  BOOST_TEST(buf.get({"next", "done"})[4].item<bool>());
  BOOST_TEST(buf.get("reward")[4].item<float>() == 2.0f);
}

BOOST_AUTO_TEST_CASE(from_schema_zero_fills_on_the_server) {
  testutil::RedisServer server;
  Schema schema = {{NestedKey("obs"), {{64}, at::kFloat}}, {NestedKey({"next", "r"}), {{}, at::kDouble}}};
  TensorDict buf = TensorDict::from_schema(schema, {1000}, "redis", RedisOptions().port(server.port()));
  BOOST_TEST(buf.type_name() == "TensorDictStore");
  BOOST_TEST(buf.get("obs").sizes() == at::IntArrayRef({1000, 64}));
  BOOST_TEST(!buf.get("obs").any().item<bool>());
  BOOST_TEST(buf.get({"next", "r"}).scalar_type() == at::kDouble);
}

namespace {
//! a raw connection beside the store (the same server and credentials)
backends::RedisClient raw_client(const RedisOptions& o) { return backends::RedisClient(o.connect_options()); }
std::string data_key(const TensorDictStore& s, const std::string& leaf) { return "tensordict:{" + s.td_id() + "}:d:" + leaf; }
TensorDict replay_row(int64_t r) {
  return TensorDict({{"obs", at::full({8}, static_cast<float>(r))}, {"id", at::full({}, r, at::kLong)}}, {});
}
const Schema kReplaySchema = {{NestedKey("obs"), {{8}, at::kFloat}}, {NestedKey("id"), {{}, at::kLong}}};
//! `producers` threads writing replay_row(r) for r in [first, end), interleaved; how many of them threw
int fill_rows(TensorDictStore& buf, int producers, int64_t first, int64_t end) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      try {
        for (int64_t r = first + p; r < end; r += producers) buf.index_put_({r}, replay_row(r));
      } catch (...) {
        failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  return failures.load();
}
//! a read of the whole store raises one of our typed errors (after its server lost the data)
bool read_fails_cleanly(const TensorDictStore& s) {
  try {
    s.to_tensordict();
  } catch (const Error&) {
    return true;
  }
  return false;
}
//! rows [0, n) of `all` are replay_row(r)
bool holds_rows(const TensorDict& all, int64_t n) {
  return all.get("id").equal(at::arange(n)) && all.get("obs").equal(at::arange(n).to(at::kFloat).unsqueeze(1).expand({n, 8}));
}
}  // namespace

BOOST_AUTO_TEST_CASE(many_producers_share_pipelines) {
  testutil::RedisServer server;
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {400}, RedisOptions().port(server.port()));
  BOOST_TEST(fill_rows(buf, 4, 0, 400) == 0);
  BOOST_TEST(holds_rows(buf.to_tensordict(), 400));
  auto st = buf.store_stats();
  BOOST_TEST(st.calls >= 400);
  BOOST_TEST_MESSAGE("writes " << st.calls << " in " << st.batches << " store calls, largest " << st.largest);
}

BOOST_AUTO_TEST_CASE(write_behind_queues_rows_into_deep_pipelines_and_reads_see_them) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).write_behind(1024);
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {100}, o);
  backends::RedisClient raw = raw_client(o);
  const auto before = buf.store_stats();
  raw.command(backends::RedisCommand{"CLIENT", "PAUSE", "1500", "WRITE"});
  for (int64_t r = 0; r < 60; ++r) {
    TensorDict row = replay_row(r);
    buf.index_put_({r}, row);
    row.get("obs").fill_(-1.0f);  // the queued write copied it
  }
  buf.flush_writes();
  const auto st = buf.store_stats();
  BOOST_TEST(st.calls - before.calls == 60);
  BOOST_TEST(st.batches - before.batches <= 2, "60 queued writes in " << st.batches - before.batches << " store calls");
  BOOST_TEST(st.largest >= 30);
  // 4 producers, then a read right after their last writes: every row is there
  BOOST_TEST(fill_rows(buf, 4, 60, 100) == 0);
  BOOST_TEST(holds_rows(buf.to_tensordict(), 100));
  buf.flush_writes();  // nothing queued: nothing to do
  // a handle without write-behind over the same store reads them too
  BOOST_TEST(TensorDictStore::from_store(buf.td_id(), RedisOptions().port(server.port())).get("id").equal(at::arange(100)));
}

// a queued write's data copy is reused by a later write of its handle once the first is done and nothing holds
// it: many rows through a shallow queue (copies reused again and again), rows of a sub-selection of the leaves
// and slices of several rows between them (other sizes, other leaf counts) all land as written
BOOST_AUTO_TEST_CASE(recycled_write_behind_copies_never_change_a_queued_row) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).write_behind(4);
  constexpr int64_t kN = 3000;
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {kN}, o);
  for (int64_t r = 0; r < kN; ++r) {
    if (r % 97 == 5 && r + 3 <= kN) {  // three rows at once: a larger copy
      TensorDict rows = TensorDict(Dict{{"obs", at::arange(r, r + 3).to(at::kFloat).unsqueeze(1).expand({3, 8}).contiguous()},
                                        {"id", at::arange(r, r + 3)}},
                                   {3});
      buf.index_put_({Slice(r, r + 3)}, rows);
      r += 2;
      continue;
    }
    if (r % 31 == 7) {  // only "id" first (one leaf, a smaller copy), then "obs"
      buf.index_put_({r}, TensorDict(Dict{{"id", at::scalar_tensor(r, at::kLong)}}, {}));
      buf.index_put_({r}, TensorDict(Dict{{"obs", at::full({8}, static_cast<float>(r))}}, {}));
      continue;
    }
    TensorDict row = replay_row(r);
    buf.index_put_({r}, row);
    row.get("obs").fill_(-1.0f);  // the caller's tensors change at once: the queued copy must not
    row.get("id").fill_(-1);
  }
  buf.flush_writes();
  BOOST_TEST(holds_rows(buf.to_tensordict(), kN));
}

// the first error of a queued write is raised once, with its type, by the next call of the handle and by
// flush_writes(); the rows written before it stay, and the handle works on afterwards
BOOST_AUTO_TEST_CASE(a_failed_queued_write_is_raised_by_the_next_call_and_by_flush_writes) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).write_behind(64);
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {16}, o);
  buf.index_put_({0}, replay_row(0));
  buf.flush_writes();
  backends::RedisClient raw = raw_client(o);
  // the leaf's data key becomes a list: every SETRANGE on it fails on the server (WRONGTYPE)
  raw.command(backends::RedisCommand{"DEL", data_key(buf, "obs")});
  raw.command(backends::RedisCommand{"RPUSH", data_key(buf, "obs"), "x"});
  buf.index_put_({1}, replay_row(1));  // queued: returns before the server refuses it
  const std::string first = error_of<BackendError>([&] { buf.flush_writes(); });
  BOOST_TEST(has(first, "a queued write (write-behind) failed"), first);
  BOOST_TEST(has(first, "WRONGTYPE"), first);
  buf.flush_writes();  // raised once: nothing left
  buf.index_put_({2}, replay_row(2));
  const std::string next = error_of<BackendError>([&] { buf.index_put_({3}, replay_row(3)); buf.flush_writes(); });
  BOOST_TEST(has(next, "a queued write (write-behind) failed"), next);
  // the row written before the failure stays; once the key is repaired (zero bytes of the leaf's size) the
  // handle writes and reads on
  BOOST_TEST(buf.get("id")[0].item<int64_t>() == 0);
  raw.command(backends::RedisCommand{"SET", data_key(buf, "obs"), std::string(16 * 8 * 4, '\0')});
  buf.index_put_({5}, replay_row(5));
  buf.flush_writes();
  at::Tensor want = at::zeros({16, 8});
  want[5] = 5.0f;
  BOOST_TEST(buf.get("obs").equal(want));
}

// a connection lost under queued writes: the next call raises it (BackendError, once, as a queued write's), and
// nothing waits forever: a read after it reaches the (restarted, empty) server and fails cleanly too
BOOST_AUTO_TEST_CASE(a_connection_lost_under_queued_writes_is_raised_by_the_next_call) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).write_behind(256).retries(1).retry_delay_ms(10);
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {64}, o);
  buf.index_put_({0}, replay_row(0));
  buf.flush_writes();
  server.kill();
  // queued: the first failure comes back with a later write (once the actor has met it) or with flush_writes()
  const std::string lost = error_of<BackendError>([&] {
    for (int64_t r = 1; r < 32; ++r) buf.index_put_({r}, replay_row(r));
    buf.flush_writes();
  });
  BOOST_TEST(has(lost, "a queued write (write-behind) failed"), lost);
  buf.flush_writes();  // raised once: it answered for every write queued before it
  server.restart();    // empty: the data was not persisted
  BOOST_TEST(read_fails_cleanly(buf));
}

// close() sends what is queued before the store closes; a bad write_behind is a ValueError before any store
BOOST_AUTO_TEST_CASE(write_behind_rows_reach_the_server_before_close_and_bad_depths_are_refused) {
  testutil::RedisServer server;
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {50}, RedisOptions().port(server.port()).write_behind(8));
  for (int64_t r = 0; r < 50; ++r) buf.index_put_({r}, replay_row(r));  // 8 in flight at most: writers wait
  const std::string id = buf.td_id();
  buf.close();
  BOOST_TEST(TensorDictStore::from_store(id, RedisOptions().port(server.port())).get("id").equal(at::arange(50)));
  const std::string bad = error_of<ValueError>(
      [&] { TensorDictStore::from_schema(kReplaySchema, {4}, RedisOptions().port(server.port()).write_behind(-1)); });
  BOOST_TEST(has(bad, "write_behind must be 0"), bad);
}

namespace {
//! the server's count of clients blocked (a write held by CLIENT PAUSE WRITE), read on `raw`
int64_t blocked_clients(backends::RedisClient& raw) {
  const std::string info = raw.command(backends::RedisCommand{"INFO", "clients"}).str;
  const size_t at = info.find("blocked_clients:");
  return at == std::string::npos ? -1 : std::stoll(info.substr(at + 16));
}
//! runs `call` on this thread while another thread's write of row 7's "id" through `buf` holds the handle's
//! connection, held back by the server (CLIENT PAUSE WRITE); true when `call` returned before that write did
template <class F>
bool while_a_write_waits(TensorDictStore& buf, backends::RedisClient& raw, F&& call, bool* write_was_held,
                         const char* pause_ms = "3000") {
  raw.command(backends::RedisCommand{"CLIENT", "PAUSE", pause_ms, "WRITE"});
  std::atomic<bool> done{false};
  std::thread writer([&] {
    try {
      buf.index_put_({7}, TensorDict(Dict{{"id", at::full({}, 70, at::kLong)}}, {}));
    } catch (...) {
    }
    done.store(true);
  });
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (blocked_clients(raw) < 1 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  *write_was_held = blocked_clients(raw) == 1 && !done.load();
  std::exception_ptr error;  // raised once the writer is joined
  try {
    call();
  } catch (...) {
    error = std::current_exception();
  }
  const bool first = !done.load();
  raw.command(backends::RedisCommand{"CLIENT", "UNPAUSE"});
  writer.join();
  if (error) std::rethrow_exception(error);
  return first;
}
}  // namespace

// a synchronous call that finds its handle's connection busy (here a write the server holds back) runs at once on
// a lane, a second connection of the same handle (config store.lanes), instead of waiting for the first
BOOST_AUTO_TEST_CASE(a_call_that_finds_the_connection_busy_runs_on_a_second_connection) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {100}, o);
  BOOST_TEST(fill_rows(buf, 1, 0, 100) == 0);
  BOOST_TEST(buf.store_stats().lane_calls == 0);  // one caller: the connection was never busy
  backends::RedisClient raw = raw_client(o);
  TensorDict row;
  bool held = false;
  const bool first = while_a_write_waits(buf, raw, [&] { row = buf.index({3}).to_tensordict(); }, &held);
  BOOST_TEST_REQUIRE(held, "the write through the handle is held by the server");
  BOOST_TEST(first, "the read returned while the write was held");
  BOOST_TEST(row.get("id").item<int64_t>() == 3);
  BOOST_TEST(row.get("obs").equal(at::full({8}, 3.0f)));
  BOOST_TEST(buf.store_stats().lane_calls >= 1);
  BOOST_TEST(buf.get("id")[7].item<int64_t>() == 70);  // the held write landed once the server let it
  // store.lanes 0: the handle has its one connection, and the read waits for the write (until the pause ends)
  auto engine = std::make_shared<Engine>(Config::load(R"({"store": {"lanes": 0}})"));
  TensorDictStore one = TensorDictStore::from_store(buf.td_id(), RedisOptions(o).engine(engine));
  while_a_write_waits(one, raw, [&] { row = one.index({4}).to_tensordict(); }, &held, "1000");
  BOOST_TEST(row.get("id").item<int64_t>() == 4);
  BOOST_TEST(one.store_stats().lane_calls == 0);
  one.close();
}

// a server that takes no more clients (maxclients) refuses the lane: the call waits for the handle's connection as
// without lanes and succeeds; the handle does not try again
BOOST_AUTO_TEST_CASE(a_refused_second_connection_leaves_the_calls_on_the_first_until_the_retry) {
  testutil::RedisServer server;
  auto engine = [](int64_t retry_ms) {
    return std::make_shared<Engine>(Config::load(R"({"store": {"lane_retry_ms": )" + std::to_string(retry_ms) + "}}"));
  };
  const RedisOptions o = RedisOptions().port(server.port()).retry_delay_ms(10);
  // store.lane_retry_ms 60 s (longer than the test): once refused, every call stays on the one connection
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {100}, RedisOptions(o).engine(engine(60000)));
  BOOST_TEST(fill_rows(buf, 1, 0, 100) == 0);
  backends::RedisClient raw = raw_client(o);
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxclients", "2"});  // the handle's connection and this one
  TensorDict row;
  bool held = false;
  while_a_write_waits(buf, raw, [&] { row = buf.index({5}).to_tensordict(); }, &held, "2000");
  BOOST_TEST_REQUIRE(held, "the read found the handle's connection busy");
  BOOST_TEST(row.get("id").item<int64_t>() == 5);
  BOOST_TEST(buf.store_stats().lane_calls == 0);
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxclients", "10000"});
  BOOST_TEST(fill_rows(buf, 4, 0, 100) == 0);  // within the back-off: every call on its one connection
  BOOST_TEST(buf.store_stats().lane_calls == 0);
  BOOST_TEST(holds_rows(buf.to_tensordict(), 100));
  // store.lane_retry_ms 100: refused, then, once the server takes clients again and the back-off has passed, a call
  // that finds the connection busy runs on a lane again
  TensorDictStore quick = TensorDictStore::from_store(buf.td_id(), RedisOptions(o).engine(engine(100)));
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxclients", "3"});  // buf's, raw's and quick's connections
  while_a_write_waits(quick, raw, [&] { row = quick.index({6}).to_tensordict(); }, &held, "1000");
  BOOST_TEST_REQUIRE(held);
  BOOST_TEST(row.get("id").item<int64_t>() == 6);
  BOOST_TEST(quick.store_stats().lane_calls == 0);
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxclients", "10000"});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const bool first = while_a_write_waits(quick, raw, [&] { row = quick.index({8}).to_tensordict(); }, &held);
  BOOST_TEST_REQUIRE(held);
  BOOST_TEST(first, "the read returned on a lane while the write was held");
  BOOST_TEST(row.get("id").item<int64_t>() == 8);
  BOOST_TEST(quick.store_stats().lane_calls >= 1);
}

// a lane caches the structure like any connection: a key replaced through the handle (another shape) is read with
// its new shape on the lane too
BOOST_AUTO_TEST_CASE(a_second_connection_sees_a_key_replaced_through_its_handle) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {100}, o);
  BOOST_TEST(fill_rows(buf, 1, 0, 100) == 0);
  backends::RedisClient raw = raw_client(o);
  TensorDict before, after;
  bool held = false;
  BOOST_TEST(while_a_write_waits(buf, raw, [&] { before = buf.index({3}).to_tensordict(); }, &held));
  BOOST_TEST_REQUIRE(held);
  BOOST_TEST(before.get("obs").equal(at::full({8}, 3.0f)));
  const auto lane_calls = buf.store_stats().lane_calls;
  BOOST_TEST(lane_calls >= 1);
  const at::Tensor wide = at::arange(400, at::kFloat).reshape({100, 4});
  buf.set("obs", wide);  // [100, 8] -> [100, 4]: a structural call
  BOOST_TEST(while_a_write_waits(buf, raw, [&] { after = buf.index({3}).to_tensordict(); }, &held));
  BOOST_TEST_REQUIRE(held);
  BOOST_TEST(buf.store_stats().lane_calls > lane_calls, "the second read ran on the lane too");
  BOOST_TEST(after.get("obs").sizes() == at::IntArrayRef({4}));
  BOOST_TEST(after.get("obs").equal(wide[3]));
}

// many threads reading and writing rows through one handle (on its connection and its lanes) while the test's
// thread adds and replaces keys: every call completes, every row lands
BOOST_AUTO_TEST_CASE(rows_through_one_handle_beside_structural_calls) {
  testutil::RedisServer server;
  TensorDictStore buf = TensorDictStore::from_schema(kReplaySchema, {800}, RedisOptions().port(server.port()));
  std::atomic<int> failures{0}, wrong{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int p = 0; p < 6; ++p) {
    threads.emplace_back([&, p] {
      try {
        for (int64_t r = p; r < 800; r += 6) {
          buf.index_put_({r}, replay_row(r));
          if (buf.index({r}).get("id").item<int64_t>() != r) wrong.fetch_add(1);  // "id" alone: "extra" changes
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (failures.fetch_add(1) == 0) first_error = e.what();
      }
    });
  }
  for (int k = 0; k < 20; ++k) {
    buf.set("extra", at::full({800, 2}, static_cast<float>(k)));
    buf.set("extra", at::full({800, 3}, static_cast<float>(k)));  // replaced: another shape
  }
  for (auto& t : threads) t.join();
  BOOST_TEST(failures.load() == 0, first_error);
  BOOST_TEST(wrong.load() == 0);
  BOOST_TEST(holds_rows(buf.to_tensordict(), 800));
  BOOST_TEST(buf.get("extra").equal(at::full({800, 3}, 19.0f)));
  const auto st = buf.store_stats();
  BOOST_TEST_MESSAGE("rows: " << st.calls << " calls in " << st.batches << " store calls, " << st.lane_calls << " on lanes");
}

BOOST_AUTO_TEST_CASE(lost_connection_fails_the_call_then_reconnects) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).retries(20).retry_delay_ms(50);
  TensorDict ref = sample(8, 2);
  TensorDictStore s = TensorDictStore::from_tensordict(ref, o);
  server.kill();
  BOOST_CHECK_THROW(s.to_tensordict(), BackendError);
  server.restart();  // an empty server: the data was not persisted
  TensorDictStore fresh = TensorDictStore::from_tensordict(ref, o);
  BOOST_TEST(same(fresh.to_tensordict(), ref));
  // the old handle reconnects too: its next call reaches the (new, empty) server and fails cleanly
  BOOST_TEST(read_fails_cleanly(s));
}

BOOST_AUTO_TEST_CASE(bad_addresses_and_ids_give_typed_errors) {
  testutil::RedisServer server;
  BOOST_CHECK_THROW(TensorDictStore::from_store("no-such-id", RedisOptions().port(server.port())), KeyError);
  // a port nothing listens on (the server's own port after it stopped)
  testutil::RedisServer gone;
  const int port = gone.port();
  gone.stop();
  try {
    TensorDictStore({4}, RedisOptions().port(port).retries(0));
    BOOST_ERROR("connected to a stopped server");
  } catch (const BackendError& e) {
    BOOST_TEST(std::string(e.what()).find(std::to_string(port)) != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(memmap_and_share_memory_need_to_tensordict) {
  testutil::RedisServer server;
  TensorDictStore s = TensorDictStore::from_tensordict(sample(4), RedisOptions().port(server.port()));
  BOOST_CHECK_THROW(s.share_memory_(), NotImplementedError);
  BOOST_CHECK_THROW(s.memmap_(""), NotImplementedError);
  TensorDict d = s.to_tensordict();
  d.share_memory_();
  BOOST_TEST(d.is_shared());
}

BOOST_AUTO_TEST_CASE(closed_store_views_fail_with_a_typed_error) {
  testutil::RedisServer server;
  TensorDictStore s = TensorDictStore::from_tensordict(sample(8), RedisOptions().port(server.port()));
  TensorDict view = s.index({Slice(1, 3)});
  s.close();
  BOOST_CHECK_THROW(view.get("obs"), BackendError);
  BOOST_CHECK_THROW(s.index_put_({0}, at::Scalar(1)), BackendError);
}

BOOST_AUTO_TEST_CASE(non_tensors_whole_per_row_and_refused) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict td({{"x", at::zeros({3})}}, {3});
  td.set("name", Entry(JsonValue("all")));
  TensorDictStore s = TensorDictStore::from_tensordict(td, o);
  BOOST_TEST(s.get_non_tensor("name").as_string() == "all");
  // one row written: upstream's json_array, the other rows keep the broadcast value
  TensorDict row({{"x", at::ones({})}}, {});
  row.set("name", Entry(JsonValue("one")));
  s.index_put_({1}, row);
  Entry e = s.get_entry("name");
  BOOST_REQUIRE(e.is_non_tensor_stack());
  BOOST_TEST(e.non_tensor_stack().at(0).as_string() == "all");
  BOOST_TEST(e.non_tensor_stack().at(1).as_string() == "one");
  // a NonTensorStack over two batch dims has no place in the layout (one value per row along dim 0)
  TensorDict two({{"x", at::zeros({2, 2})}}, {2, 2});
  two.set("s", Entry(NonTensorStack({JsonValue("a"), JsonValue("b"), JsonValue("c"), JsonValue("d")}, {2, 2})));
  BOOST_CHECK_THROW(TensorDictStore::from_tensordict(two, o), NotImplementedError);
  // the store it made for that TensorDict (its leaf x written before s was refused) is cleared again: nothing
  // under the id for another process to open
  BOOST_CHECK_THROW(TensorDictStore::from_tensordict(two, RedisOptions(o).td_id("half-made")), NotImplementedError);
  BOOST_CHECK_THROW(TensorDictStore::from_store("half-made", o), KeyError);
}

// a resolved index handed to the store's node directly: one over another batch is refused, and positions changed
// in place past the store's rows are refused before the per-row non-tensor values are indexed (read and write);
// the store keeps what it held
BOOST_AUTO_TEST_CASE(resolved_indices_from_elsewhere_are_refused) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict td({{"a", at::arange(12).reshape({4, 3})}}, {4});
  const std::vector<JsonValue> names{JsonValue("w"), JsonValue("x"), JsonValue("y"), JsonValue("z")};
  td.set("s", Entry(NonTensorStack(names, {4})));
  TensorDictStore s = TensorDictStore::from_tensordict(td, o);
  TensorDict row(BatchSize{1});
  row.set("s", Entry(NonTensorStack({JsonValue("new")}, {1})));
  const ResolvedIndex other = ResolvedIndex::resolve({1000}, {at::indexing::Slice(999, 1000)});
  BOOST_CHECK_THROW(s.node()->write_at(other, row), ValueError);
  BOOST_CHECK_THROW(s.node()->index_at(other), ValueError);
  std::optional<ResolvedIndex> own = s.node()->resolve({at::indexing::Slice(1, 2)});
  BOOST_REQUIRE(own.has_value());
  own->positions().fill_(999);
  BOOST_CHECK_THROW(s.node()->write_at(*own, row), IndexError);
  BOOST_CHECK_THROW(TensorDict(s.node()->index_at(*own)).get_entry("s"), IndexError);
  const Entry e = s.get_entry("s");
  BOOST_REQUIRE(e.is_non_tensor_stack());
  BOOST_TEST(e.non_tensor_stack().values() == names);
  BOOST_TEST(s.get("a").equal(at::arange(12).reshape({4, 3})));
}

// set over an existing key with another shape or kind replaces it through a staging key moved over the old one:
// a sub-TensorDict the store refuses part-way (a NonTensorStack over two batch dims after a leaf it takes) leaves
// the old sub-TensorDict as it was; one it takes lands whole, nothing staged left
BOOST_AUTO_TEST_CASE(a_refused_replacement_leaves_the_old_key) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict td({{"obs", at::arange(4, at::kFloat)}}, {4});
  td.set("sub", TensorDict({{"x", at::full({4, 2}, 3.f)}}, {4}));
  TensorDictStore s = TensorDictStore::from_tensordict(td, o);
  TensorDict bad({{"x", at::zeros({4, 2, 3})}}, {4, 2});
  bad.set("s", Entry(NonTensorStack(std::vector<JsonValue>(8, JsonValue("v")), {4, 2})));
  BOOST_CHECK_THROW(s.set("sub", bad), NotImplementedError);
  BOOST_TEST(s.get({"sub", "x"}).equal(at::full({4, 2}, 3.f)));
  BOOST_TEST(s.keys(KeysOptions().include_nested(true)).size() == 3u);
  s.set("sub", TensorDict({{"z", at::ones({4})}}, {4}));
  s.set("obs", at::ones({4, 2}, at::kDouble));
  TensorDictStore again = TensorDictStore::from_store(s.td_id(), o);
  BOOST_TEST(again.get({"sub", "z"}).equal(at::ones({4})));
  BOOST_TEST(again.get("obs").equal(at::ones({4, 2}, at::kDouble)));
  BOOST_TEST(again.keys(KeysOptions().include_nested(true)).size() == 3u);
}

// issue 35 item 7: Python's TensorDictStore.from_tensordict stores a NonTensorStack as ONE json blob of its
// tolist() (encoding "json"); it reads back as a NonTensorStack with one value per row, both ways
BOOST_AUTO_TEST_CASE(non_tensor_stacks_use_the_python_layout_both_ways) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  backends::RedisConnectOptions c;
  c.port = server.port();
  backends::RedisClient raw(c);
  // written as Python writes it (from_tensordict of a TensorDict with a NonTensorStack "names", batch [3])
  const std::string base = "tensordict:{py-nts}:";
  for (const auto& cmd : std::vector<backends::RedisCommand>{
           {"SET", base + "__batch_size__", "[3]"},
           {"SET", base + "__device__", ""},
           {"SADD", base + "__keys__", "names", "x"},
           {"SET", base + "d:names", "[\"a\", \"b\", \"c\"]"},
           {"HSET", base + "m:names", "is_non_tensor", "1", "encoding", "json"},
           {"SET", base + "d:x", std::string(12, '\0')},
           {"HSET", base + "m:x", "dtype", "torch.float32", "shape", "[3]"}})
    raw.command(cmd);
  TensorDictStore py = TensorDictStore::from_store("py-nts", o);
  Entry e = py.get_entry("names");
  BOOST_REQUIRE_MESSAGE(e.is_non_tensor_stack(), "read back as " << Entry::kind_name(e.kind()));
  BOOST_TEST(e.non_tensor_stack().batch_size() == BatchSize({3}));
  BOOST_TEST(e.non_tensor_stack().at(1).as_string() == "b");
  BOOST_TEST(py.index({2}).get_non_tensor("names").as_string() == "c");
  BOOST_TEST(py.to_tensordict().get_entry("names").is_non_tensor_stack());
  // written here: the same layout (one json blob, Python's spacing), read back as a NonTensorStack
  TensorDict td({{"x", at::zeros({3})}}, {3});
  td.set(NestedKey{"sub", "names"}, Entry(NonTensorStack({JsonValue("p"), JsonValue("q"), JsonValue("r")}, {3})));
  TensorDictStore ours = TensorDictStore::from_tensordict(td, o);
  const std::string ob = "tensordict:{" + ours.td_id() + "}:";
  BOOST_TEST(raw.command({"GET", ob + "d:sub.names"}).str == "[\"p\", \"q\", \"r\"]");
  BOOST_TEST(raw.command({"HGET", ob + "m:sub.names", "encoding"}).str == "json");
  BOOST_TEST(raw.command({"HGET", ob + "m:sub.names", "is_non_tensor"}).str == "1");
  Entry back = TensorDictStore::from_store(ours.td_id(), o).get_entry(NestedKey{"sub", "names"});
  BOOST_REQUIRE(back.is_non_tensor_stack());
  BOOST_TEST(back.non_tensor_stack().at(2).as_string() == "r");
  // a NonTensorData that is not one value per row stays one value
  TensorDict one({{"x", at::zeros({3})}}, {3});
  one.set("pair", Entry(JsonValue::array({JsonValue(1), JsonValue(2)})));
  BOOST_TEST(TensorDictStore::from_tensordict(one, o).get_entry("pair").is_non_tensor_data());
}

// issue 35 item 7: td.set(key, NonTensorStack) on an existing store (a new key, a replaced one, a nested one,
// td[:] = value) writes what Python's from_tensordict / set write: ONE json blob of its tolist()
BOOST_AUTO_TEST_CASE(setting_a_non_tensor_stack_on_a_store_writes_the_python_layout) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  backends::RedisConnectOptions c;
  c.port = server.port();
  backends::RedisClient raw(c);
  const NonTensorStack names({JsonValue("p"), JsonValue("q"), JsonValue("r")}, {3});
  const NonTensorStack other({JsonValue(1), JsonValue::array({JsonValue("x")}), JsonValue()}, {3});
  // the reference: from_tensordict of the same values
  TensorDict ref_td({{"x", at::zeros({3})}}, {3});
  ref_td.set("names", Entry(names));
  ref_td.set("old", Entry(other));
  ref_td.set(NestedKey{"sub", "names"}, Entry(names));
  ref_td.set("whole", Entry(other));
  TensorDictStore ref = TensorDictStore::from_tensordict(ref_td, o);
  // an existing store: "old" held a NonTensorData, "sub" a tensor
  TensorDict start({{"x", at::zeros({3})}, {NestedKey{"sub", "y"}, at::ones({3})}}, {3});
  start.set("old", Entry(JsonValue("before")));
  TensorDictStore s = TensorDictStore::from_tensordict(start, o);
  s.set("names", Entry(names));
  s.set("old", Entry(other));
  s.set(NestedKey{"sub", "names"}, Entry(names));
  TensorDict row_value({{"x", at::zeros({3})}}, {3});
  row_value.set("whole", Entry(other));
  s.index_put_({Slice()}, row_value);  // td[:] = value: the whole key
  const std::string rb = "tensordict:{" + ref.td_id() + "}:", sb = "tensordict:{" + s.td_id() + "}:";
  for (const std::string k : {"names", "old", "sub.names", "whole"}) {
    // (b) the raw Redis values: the same bytes and metadata as from_tensordict writes (encoding "json")
    BOOST_TEST(raw.command({"GET", sb + "d:" + k}).str == raw.command({"GET", rb + "d:" + k}).str, k);
    BOOST_TEST(raw.command({"HGET", sb + "m:" + k, "encoding"}).str == "json", k);
    BOOST_TEST(raw.command({"HGET", sb + "m:" + k, "is_non_tensor"}).str == "1", k);
    BOOST_TEST(raw.command({"HLEN", sb + "m:" + k}).integer == raw.command({"HLEN", rb + "m:" + k}).integer, k);
    BOOST_TEST(raw.command({"SISMEMBER", sb + "__keys__", k}).integer == 1, k);
  }
  BOOST_TEST(raw.command({"GET", sb + "d:names"}).str == "[\"p\", \"q\", \"r\"]");
  // (a) read back equal, here and by a second connection
  for (const TensorDict& t : {TensorDict(s), TensorDict(TensorDictStore::from_store(s.td_id(), o))}) {
    for (const auto& kv : std::vector<std::pair<NestedKey, NonTensorStack>>{
             {"names", names}, {"old", other}, {NestedKey{"sub", "names"}, names}, {"whole", other}}) {
      Entry e = t.get_entry(kv.first);
      BOOST_REQUIRE_MESSAGE(e.is_non_tensor_stack(), kv.first.repr() << " read back as " << Entry::kind_name(e.kind()));
      BOOST_TEST((e.non_tensor_stack() == kv.second), kv.first.repr());
    }
    BOOST_TEST(t.index({1}).get_non_tensor("names").as_string() == "q");
    BOOST_TEST(at::equal(t.get(NestedKey{"sub", "y"}), at::ones({3})));
  }
}

// issue 35 item 10: a tensorclass records the Python class path it declares (TD_FIELDS_AT), in a Redis store's
// __tensorclass__ and in a memmap directory's meta.json _type alike; TD_FIELDS records its C++ qualified name
BOOST_AUTO_TEST_CASE(tensorclass_records_its_declared_class_path_in_redis_and_memmap) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  DeclaredPair p({{"a", at::arange(4, at::kFloat).reshape({2, 2})}, {"label", "l"}}, {2});
  BOOST_TEST(DeclaredPair::schema()->class_path == "mypkg.models.Pair");
  TensorDictStore s = TensorDictStore::from_tensordict(p.tensordict(), o);
  BOOST_TEST(s.tensorclass() == "mypkg.models.Pair");
  fixtures::TempDir dir("tc_path");
  p.memmap_(dir.path + "/p");
  std::ifstream f(dir.path + "/p/meta.json");
  const std::string meta((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  BOOST_TEST(has(meta, "<class 'mypkg.models.Pair'>"), meta);
  BOOST_TEST(DeclaredPair::load_memmap(dir.path + "/p").label() == "l");
}

BOOST_AUTO_TEST_CASE(tensorclass_records_its_cpp_qualified_name_by_default) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  shapes::Pair p({{"a", at::arange(4, at::kFloat).reshape({2, 2})}, {"label", "l"}}, {2});
  BOOST_TEST(shapes::Pair::schema()->class_path == "shapes::Pair");
  TensorDictStore s = TensorDictStore::from_tensordict(p.tensordict(), o);
  BOOST_TEST(s.tensorclass() == "shapes::Pair");
  shapes::Pair back = shapes::Pair::from_tensordict(TensorDictStore::from_store(s.td_id(), o));
  BOOST_TEST(back.a().equal(p.a()));
  BOOST_TEST(back.label() == "l");
  fixtures::TempDir dir("tc_cpp_path");
  p.memmap_(dir.path + "/p");
  std::ifstream f(dir.path + "/p/meta.json");
  const std::string meta((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  BOOST_TEST(has(meta, "<class 'shapes::Pair'>"), meta);
  BOOST_TEST(shapes::Pair::load_memmap(dir.path + "/p").label() == "l");
}

BOOST_AUTO_TEST_CASE(credentials_by_url_acl_user_and_environment_never_printed) {
  const std::string pw = "Td-S3cret-4411", bob_pw = "Bob-S3cret-2k";
  testutil::RedisServer server(testutil::RedisServerOptions{"", pw, false});
  const std::string port = std::to_string(server.port());
  {
    backends::RedisConnectOptions c;
    c.port = server.port();
    c.password = pw;
    backends::RedisClient admin(c);
    admin.command(backends::RedisCommand{"ACL", "SETUSER", "bob", "on", ">" + bob_pw, "~*", "&*", "+@all"});
  }
  TensorDict td = loader_test::dataset(16);
  // redis://user:password@host:port/db
  TensorDictStore a = TensorDictStore::from_tensordict(
      td, RedisOptions::from_url("redis://bob:" + bob_pw + "@127.0.0.1:" + port + "/0?timeout=2.5"));
  BOOST_TEST(a.to_tensordict().equal(td));
  BOOST_TEST(a.address() == "redis://127.0.0.1:" + port + "/0?prefix=tensordict&td_id=" + a.td_id());
  // redis://:password@ (the default user), and the old password= query form
  for (const std::string& url : {"redis://:" + pw + "@127.0.0.1:" + port + "/0?td_id=" + a.td_id(),
                                 "redis://127.0.0.1:" + port + "/0?td_id=" + a.td_id() + "&password=" + pw}) {
    RedisOptions o = RedisOptions::from_url(url);
    BOOST_TEST(TensorDictStore::from_store(o.td_id(), o).to_tensordict().equal(td));
  }
  // the environment, when nothing is given
  ::setenv("TENSORDICT_REDIS_PASSWORD", pw.c_str(), 1);
  BOOST_TEST(TensorDictStore::from_store(a.td_id(), RedisOptions().port(server.port())).to_tensordict().equal(td));
  ::unsetenv("TENSORDICT_REDIS_PASSWORD");
  // a wrong password: a clear error without it
  const std::string wrong = "Wrong-S3cret-x";
  std::string m = error_of<BackendError>([&] {
    RedisOptions o = RedisOptions::from_url("redis://bob:" + wrong + "@127.0.0.1:" + port + "/0?td_id=" + a.td_id());
    TensorDictStore::from_store(o.td_id(), o);
  });
  BOOST_TEST(has(m, "authentication failed"), m);
  BOOST_TEST(!has(m, "S3cret"), m);
  // malformed URLs: ValueError, the password hidden
  for (const std::string& url : {"redis://bob:" + bob_pw + "@127.0.0.1:99999/0", "redis://:" + bob_pw + "@127.0.0.1:x/0",
                                 "redis://127.0.0.1/0?password=" + bob_pw + "&bogus=1",
                                 "redis://:" + bob_pw + "%zz@127.0.0.1/0", "redis://h/0?password=" + bob_pw + "&timeout=-1"}) {
    m = error_of<ValueError>([&] { RedisOptions::from_url(url); });
    BOOST_TEST(!has(m, "S3cret"), m);
    BOOST_TEST(!has(m, "no exception"), url);
  }
  BOOST_TEST(redact_url("redis://bob:" + bob_pw + "@h:1/0") == "redis://bob:***@h:1/0");
}

BOOST_AUTO_TEST_CASE(worker_processes_get_the_password_through_their_environment_only) {
  const std::string pw = "Wk-S3cret-5150";
  testutil::RedisServer server(testutil::RedisServerOptions{"", pw, false});
  map_process_test::register_fns();
  loader_test::register_fns();
  const int64_t n = 256;
  TensorDict td = loader_test::dataset(n);
  // the password given in the options only: the workers have no other way to learn it than their environment
  BOOST_REQUIRE(std::getenv("TENSORDICT_REDIS_PASSWORD") == nullptr);
  TensorDictStore src = TensorDictStore::from_tensordict(td, RedisOptions().port(server.port()).password(pw));
  BOOST_TEST(StorageSpec::of(src).dump().find(pw) == std::string::npos);
  // a DataLoader with 2 worker processes (a slow transform: their command lines are read while they run)
  std::vector<std::string> cmdlines;
  int64_t rows = 0;
  bool all_match = true;
  {
    DataLoader loader(src, LoaderOptions().batch_size(16).transform_name("ld_slow").worker_processes(2).worker_executable(
                               TD_LOADER_WORKER_EXE));
    for (TensorDict b : loader) {
      rows += b.batch_size()[0];
      all_match = all_match && loader_test::rows_match(b);
      for (auto& c : children_cmdlines()) cmdlines.push_back(c);
    }
  }
  BOOST_TEST(rows == n);
  BOOST_TEST(all_match);
  // a map with 2 worker processes, its children's command lines read from another thread while it runs
  fixtures::TempDir out_dir("td-store-map");
  TensorDict out = zeros_like(td);
  out.memmap_(out_dir / "out");
  std::atomic<bool> done{false};
  std::vector<std::string> map_cmdlines;
  std::thread watcher([&] {
    while (!done) {
      for (auto& c : children_cmdlines()) map_cmdlines.push_back(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::string map_error;
  try {
    src.map("mp_slow", MapOptions().worker_processes(2).worker_executable(TD_MAP_WORKER_EXE).chunksize(32).out(out));
  } catch (const std::exception& e) {
    map_error = e.what();
  }
  done = true;
  watcher.join();
  BOOST_TEST(map_error.empty(), map_error);
  BOOST_TEST(out.equal(map_process_test::affine(td)));
  cmdlines.insert(cmdlines.end(), map_cmdlines.begin(), map_cmdlines.end());
  BOOST_TEST_MESSAGE(cmdlines.size() << " command lines of worker processes read while they ran");
  BOOST_TEST(!cmdlines.empty());
  for (const auto& c : cmdlines) BOOST_TEST(!has(c, pw), c);
}


// a store created under a td_id that holds one already: another batch size, or a store of the other kind (dense /
// lazy stack), is refused before anything changes, and the old store still opens with its data. Setting the new
// batch size over it had left its keys disagreeing with it (no handle could open it again). The same batch size is
// upstream's reconnect: its metadata written again, its keys kept
BOOST_AUTO_TEST_CASE(a_store_created_over_a_taken_td_id_is_refused_and_the_old_one_kept) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).td_id("taken");
  const TensorDict src(Dict{{"a", at::arange(40, at::kFloat).reshape({10, 4})}}, {10});
  TensorDictStore first = TensorDictStore::from_tensordict(src, o);
  auto old_store_intact = [&] {
    TensorDictStore again = TensorDictStore::from_store("taken", RedisOptions().port(server.port()));
    return again.batch_size() == BatchSize({10}) && again.to_tensordict().get("a").equal(src.get("a"));
  };
  const TensorDict five(Dict{{"b", at::ones({5, 2})}}, {5});
  std::string e = error_of<ValueError>([&] { TensorDictStore::from_tensordict(five, o); });
  BOOST_TEST(has(e, "already holds a store of batch size [10]"), e);
  BOOST_TEST(old_store_intact());
  e = error_of<ValueError>([&] { TensorDictStore::from_schema({{"b", {{2}, at::kFloat}}}, {5}, o); });
  BOOST_TEST(has(e, "already holds"), e);
  e = error_of<ValueError>([&] { TensorDictStore({5}, o); });
  BOOST_TEST(has(e, "already holds"), e);
  BOOST_TEST(old_store_intact());
  // the same batch size: a handle on the same store
  TensorDictStore same({10}, o);
  BOOST_TEST(same.keys().size() == 1u);
  BOOST_TEST(old_store_intact());
  // a lazy-stack store over the dense one, and a dense store over a lazy-stack one
  const LazyStackedTensorDict lz({TensorDict(Dict{{"x", at::ones({2, 3})}}, {2}), TensorDict(Dict{{"x", at::zeros({2, 5})}}, {2})}, 0);
  e = error_of<ValueError>([&] { TensorDictStore::save_lazy_stack(lz, o); });
  BOOST_TEST(has(e, "already holds a store"), e);
  BOOST_TEST(old_store_intact());
  const RedisOptions lo = RedisOptions().port(server.port()).td_id("lazy");
  TensorDictStore::save_lazy_stack(lz, lo);
  e = error_of<ValueError>([&] { TensorDictStore({2}, lo); });
  BOOST_TEST(has(e, "lazy-stack store"), e);
  e = error_of<ValueError>([&] { TensorDictStore::save_lazy_stack(lz, lo); });
  BOOST_TEST(has(e, "already holds a store"), e);
  const LazyStackedTensorDict back = TensorDictStore::load_lazy_stack("lazy", RedisOptions().port(server.port()));
  BOOST_TEST(back.member(1).get("x").equal(at::zeros({2, 5})));
}

// rename_key_ moves the key in the store (RENAME of its keys) without reading or writing its data, within a level,
// out of one and into a new one; clear erases every key of the level and keeps the store's batch size
BOOST_AUTO_TEST_CASE(rename_key_and_clear_move_and_erase_keys_without_their_data) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict src(Dict{{"a", at::arange(40, at::kFloat).reshape({10, 4})}, {"b", at::ones({10})}}, {10});
  src.set("sub", TensorDict(Dict{{"x", at::full({10, 2}, 3.f)}}, {10}));
  TensorDictStore st = TensorDictStore::from_tensordict(src, o);
  backends::RedisClient raw = raw_client(o);
  raw.command(backends::RedisCommand{"CONFIG", "RESETSTAT"});
  st.rename_key_("a", "c");
  st.rename_key_(NestedKey({"sub", "x"}), NestedKey("y"));
  st.rename_key_("b", NestedKey({"new", "b"}));
  const std::string stats = raw.command(backends::RedisCommand{"INFO", "commandstats"}).str;
  for (const char* data_cmd : {"cmdstat_get:", "cmdstat_getrange:", "cmdstat_set:", "cmdstat_setrange:", "cmdstat_evalsha:"})
    BOOST_TEST(!has(stats, data_cmd), data_cmd << " in " << stats);
  BOOST_TEST(has(stats, "cmdstat_rename:"), stats);
  const TensorDictStore again = TensorDictStore::from_store(st.td_id(), o);
  BOOST_TEST(again.get("c").equal(src.get("a")));
  BOOST_TEST(again.get("y").equal(src.get({"sub", "x"})));
  BOOST_TEST(again.get({"new", "b"}).equal(at::ones({10})));
  BOOST_TEST(!again.contains("a"));
  BOOST_TEST(!again.contains("b"));
  // safe: the new key exists, a KeyError and nothing moved; not safe: the new key replaced
  std::string e = error_of<KeyError>([&] { st.rename_key_("c", "y", RenameOptions().safe(true)); });
  BOOST_TEST(has(e, "already present"), e);
  BOOST_TEST(st.get("y").equal(src.get({"sub", "x"})));
  // the old key dropped and the new one moved in by one script: a connection lost between two steps could have
  // left the old key erased and the renamed one not moved (RedisStore::replace)
  auto eval_calls = [&] {
    const std::string st_text = raw.command(backends::RedisCommand{"INFO", "commandstats"}).str;
    const size_t at = st_text.find("cmdstat_eval:calls=");
    return at == std::string::npos ? 0LL : std::stoll(st_text.substr(at + 19));
  };
  raw.command(backends::RedisCommand{"CONFIG", "RESETSTAT"});
  st.rename_key_("c", "y");
  BOOST_TEST(eval_calls() == 1);
  BOOST_TEST(st.get("y").equal(src.get("a")));
  BOOST_TEST(!st.contains("c"));
  // a key replaced by a value of another shape: written under a staging name, then moved over the old one by one
  // script as well
  raw.command(backends::RedisCommand{"CONFIG", "RESETSTAT"});
  st.set("y", at::full({10, 7}, 9.f));
  BOOST_TEST(eval_calls() == 1);
  BOOST_TEST(TensorDictStore::from_store(st.td_id(), o).get("y").equal(at::full({10, 7}, 9.f)));
  st.set("y", src.get("a"));
  // a missing key, a key moved below itself, a value that does not fit the new level's batch size, a locked store
  e = error_of<KeyError>([&] { st.rename_key_("nope", "z"); });
  BOOST_TEST(has(e, "not found"), e);
  BOOST_TEST(error_of<ValueError>([&] { st.rename_key_("new", NestedKey({"new", "deeper"})); }) != "no exception");
  st.rename_key_("y", "y");  // the same key: nothing to do
  BOOST_TEST(st.get("y").equal(src.get("a")));
  st.lock_();
  BOOST_TEST(error_of<LockedError>([&] { st.rename_key_("y", "z"); }) != "no exception");
  BOOST_TEST(error_of<LockedError>([&] { st.clear(); }) != "no exception");
  st.unlock_();
  BOOST_TEST(st.get("y").equal(src.get("a")));
  st.clear();
  BOOST_TEST(st.keys().empty());
  const TensorDictStore cleared = TensorDictStore::from_store(st.td_id(), o);
  BOOST_TEST(cleared.keys().empty());
  BOOST_TEST(cleared.batch_size() == BatchSize({10}));
}

// A server at its maxmemory (noeviction). td[idx] = value with a key the store lacks makes the key (zero-filled at
// the full batch size), then writes the rows: the create runs while the server is under its limit, the row write
// after it is refused (OOM), and the key it made is removed again (the removal had been a MULTI, which such a
// server refuses whole: the half-made key stayed). Over the limit, reads of several leaves and erases still work
BOOST_AUTO_TEST_CASE(a_server_out_of_memory_keeps_no_half_made_key_and_still_reads_and_erases) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDictStore st = TensorDictStore::from_tensordict(TensorDict(Dict{{"a", at::ones({1024})}}, {1024}), o);
  const std::string lazy_id = TensorDictStore::save_lazy_stack(
      LazyStackedTensorDict({TensorDict(Dict{{"x", at::ones({2, 3})}, {"y", at::ones({2})}}, {2}),
                             TensorDict(Dict{{"x", at::zeros({2, 5})}, {"y", at::zeros({2})}}, {2})},
                            0),
      o);
  backends::RedisClient raw = raw_client(o);
  const std::string info = raw.command(backends::RedisCommand{"INFO", "memory"}).str;
  const size_t at = info.find("used_memory:");
  BOOST_TEST_REQUIRE(at != std::string::npos);
  const long long used = std::stoll(info.substr(at + 12));
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxmemory", std::to_string(used + 4 * 1024 * 1024)});
  // "big" made at [1024, 4096] float32 (16 MiB, past the limit once made), then its row 3 written: refused
  const TensorDict row(Dict{{"a", at::full({}, 5.f)}, {"big", at::full({4096}, 2.f)}}, {});
  const std::string e = error_of<std::exception>([&] { st.index_put_({3}, row); });
  BOOST_TEST((has(e, "OOM") || has(e, "maxmemory")), e);
  // a server over its limit refuses writes, and keys can still be erased to free memory (in a MULTI, refused whole
  // there, they could not)
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxmemory", "0"});
  st.set("small", at::zeros({1024}));
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxmemory", "1"});
  const std::string refused = error_of<std::exception>([&] { st.set("more", at::zeros({1024})); });
  BOOST_TEST(has(refused, "OOM"), refused);
  // reads of several leaves (a MULTI, refused whole there) go as one pipeline: no write can land between them
  BOOST_TEST(st.index({5}).to_tensordict().get("a").item<float>() == 1.f);
  BOOST_TEST(st.to_tensordict().get("small").equal(at::zeros({1024})));
  const LazyStackedTensorDict lz = TensorDictStore::load_lazy_stack(lazy_id, o);
  BOOST_TEST(lz.member(1).get("x").equal(at::zeros({2, 5})));
  st.del("small");
  BOOST_TEST(!st.contains("small"));
  raw.command(backends::RedisCommand{"CONFIG", "SET", "maxmemory", "0"});
  const TensorDictStore again = TensorDictStore::from_store(st.td_id(), o);
  BOOST_TEST(!again.contains("big"), "the key the failed write made is still there");
  BOOST_TEST(again.get("a").equal(at::ones({1024})));  // the old key as it was
}

BOOST_AUTO_TEST_SUITE_END()
