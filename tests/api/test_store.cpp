// Store: memmap and shared-memory stores behind their store actor. Rows go straight to memory; add_key,
// flush, refresh go through the actor (one message per call); other processes connect over the middleman
// on 127.0.0.1 (td_store_client, path in TD_STORE_CLIENT_EXE) and map the same storage.
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "engine/zoo.hpp"
#include "process_util.hpp"

#include <caf/io/all.hpp>

#include "tensordict/actors/runtime.hpp"
#include "tensordict/actors/store_client.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/tensordict.hpp"

#ifndef TD_STORE_CLIENT_EXE
#error "TD_STORE_CLIENT_EXE (the path of td_store_client) must be defined"
#endif

using namespace tensordict;
using at::indexing::Slice;
using zoo::throws_with;
using fixtures::TempDir;
namespace fs = std::filesystem;

namespace {

const int64_t kRows = 64;

//! a zero-filled memmap buffer in `dir`: x [64, 4] f32, obs.a [64, 3] i64
TensorDict make_buffer(const std::string& dir) {
  Schema schema = {{"x", {{4}, at::kFloat}}, {{"obs", "a"}, {{3}, at::kLong}}};
  return TensorDict::from_schema(schema, {kRows}, "memmap", MemmapOptions().prefix(dir));
}

//! fork + exec td_store_client with `args`
pid_t run_client(const std::vector<std::string>& args) { return testutil::spawn_exec(TD_STORE_CLIENT_EXE, args); }

//! fork + exec td_store_client with `args` and TENSORDICT_STORE_TOKEN=`token` in its environment only
pid_t run_client_with_token(const std::vector<std::string>& args, const std::string& token) {
  return testutil::spawn([&] {
    ::setenv("TENSORDICT_STORE_TOKEN", token.c_str(), 1);
    return testutil::exec_program(TD_STORE_CLIENT_EXE, args);
  });
}

//! td_store_client `args` run where a `kib` KiB tmpfs is mounted at `dir` (testutil::spawn_on_small_fs); exit
//! codes 90-93 are setup failures
pid_t run_client_on_small_fs(const std::string& dir, int kib, const std::vector<std::string>& args) {
  return testutil::spawn_on_small_fs(dir, kib, [&] { return testutil::exec_program(TD_STORE_CLIENT_EXE, args); });
}

using testutil::read_text;

std::shared_ptr<Engine> engine_with_timeout(int64_t ms) {
  return std::make_shared<Engine>(Config::load("{\"request_timeout_ms\": " + std::to_string(ms) + "}"));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(store)

BOOST_AUTO_TEST_CASE(memmap_rows_direct_add_key_through_the_actor) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  BOOST_TEST(store.kind() == "memmap");
  BOOST_TEST(!store.is_remote());
  BOOST_TEST(store.version() == 0);
  TensorDict before = store.td();
  // rows: straight into the mapping
  TensorDict row{BatchSize{}};
  row.set("x", at::full({4}, 7.0));
  row.set({"obs", "a"}, at::full({3}, 5, at::kLong));
  store.set_({5}, row);
  BOOST_TEST(store.get({5}).get("x").equal(at::full({4}, 7.0)));
  BOOST_TEST(before.get("x")[5].equal(at::full({4}, 7.0)));  // same memory
  // a key through the actor: a new snapshot; the old one keeps its structure
  store.add_key("reward", at::arange(kRows, at::kFloat));
  BOOST_TEST(store.version() == 1);
  BOOST_TEST(store.td().contains("reward"));
  BOOST_TEST(!before.contains("reward"));
  BOOST_TEST(store.td().is_memmap());
  BOOST_TEST(store.td().get("x").data_ptr() == before.get("x").data_ptr());
  store.add_key({"obs", "b"}, {kRows, 2}, at::kDouble);
  BOOST_TEST(store.td().get({"obs", "b"}).sum().item<double>() == 0.0);
  // on disk: meta.json rewritten, a fresh load sees everything
  store.flush();
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  BOOST_TEST(fresh.get("reward").equal(at::arange(kRows, at::kFloat)));
  BOOST_TEST(fresh.get("x")[5].equal(at::full({4}, 7.0)));
  BOOST_TEST(fresh.get({"obs", "b"}).sizes().vec() == std::vector<int64_t>({kRows, 2}));
  BOOST_TEST(fresh.get({"obs", "b"}).scalar_type() == at::kDouble);
  auto keys = store.keys();
  BOOST_TEST(keys.size() == 4u);
  store.close();
}

BOOST_AUTO_TEST_CASE(store_tensordict_is_a_tensordict) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  TensorDict td = store.tensordict();
  BOOST_TEST((td.node()->dense_node() == nullptr));
  BOOST_TEST(td.is_memmap());
  BOOST_TEST(td.batch_size() == BatchSize({kRows}));
  // rows: straight into the storage (a view of the mapping)
  TensorDict row({{"x", at::full({4}, 3.0)}, {{"obs", "a"}, at::full({3}, 7, at::kLong)}}, {});
  td.index_put_({5}, row);
  BOOST_TEST(store.td().get("x")[5].equal(at::full({4}, 3.0)));
  BOOST_TEST(td.index({5}).get({"obs", "a"}).equal(at::full({3}, 7, at::kLong)));
  // a new key goes through the store actor: the directory holds it, the version moved
  const int64_t v0 = store.version();
  td.set("reward", at::arange(kRows).to(at::kFloat));
  td.set({"obs", "b"}, at::ones({kRows, 2}));
  // a leaf under a missing level creates the level (a sub-directory with its meta.json), as upstream's set
  td.set({"next", "done"}, at::zeros({kRows}, at::kBool));
  BOOST_TEST(store.version() == v0 + 3);
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  BOOST_TEST(fresh.get("reward").equal(at::arange(kRows).to(at::kFloat)));
  BOOST_TEST(fresh.get({"obs", "b"}).equal(at::ones({kRows, 2})));
  BOOST_TEST(fresh.get({"next", "done"}).equal(at::zeros({kRows}, at::kBool)));
  BOOST_TEST(td.get({"obs", "b"}).equal(at::ones({kRows, 2})));
  // keys in the storage's order, or sorted on request
  BOOST_TEST(td.keys() ==
             std::vector<NestedKey>({NestedKey("x"), NestedKey("obs"), NestedKey("reward"), NestedKey("next")}));
  BOOST_TEST(td.keys(KeysOptions().sort(true)) ==
             std::vector<NestedKey>({NestedKey("next"), NestedKey("obs"), NestedKey("reward"), NestedKey("x")}));
  // an existing key is written in place
  td.set("reward", at::zeros({kRows}));
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/buf").get("reward").eq(0).all().item<bool>());
  // generic operations work on it
  BOOST_TEST(td.apply([](const at::Tensor& t) { return t.to(at::kDouble); }).get("x").scalar_type() == at::kDouble);
  BOOST_TEST(td.clone().equal(store.td()));
  BOOST_TEST(td.index({at::indexing::Slice(0, 8)}).batch_size() == BatchSize({8}));
  BOOST_TEST(repr(td).find("reward: MemoryMappedTensor") != std::string::npos, repr(td));
  // what a store cannot do, and bad values, lose nothing
  BOOST_TEST(throws_with<NotImplementedError>([&] { td.del("reward"); }, {"cannot remove"}));
  BOOST_TEST(throws_with<NotImplementedError>([&] { td.set_non_tensor("tag", JsonValue("x")); }, {"tensor leaves only"}));
  BOOST_CHECK_THROW(td.set("bad", at::zeros({kRows + 1})), Error);
  BOOST_TEST(!TensorDict::load_memmap(dir.path + "/buf").contains("bad"));
  td.lock_();
  BOOST_CHECK_THROW(td.set("late", at::zeros({kRows})), LockedError);
  td.unlock_();
}

BOOST_AUTO_TEST_CASE(read_and_write_through_the_actor_are_one_message_per_call) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  TensorDict rows(BatchSize{10});
  rows.set("x", at::ones({10, 4}));
  rows.set({"obs", "a"}, at::full({10, 3}, 2, at::kLong));
  store.write({Slice(10, 20)}, rows);
  BOOST_TEST(store.get({Slice(10, 20)}).get("x").equal(at::ones({10, 4})));
  TensorDict back = store.read({Slice(10, 20)});
  BOOST_TEST(back.batch_size() == BatchSize({10}));
  BOOST_TEST(back.get({"obs", "a"}).equal(at::full({10, 3}, 2, at::kLong)));
  // errors of the indexing come back with their type
  BOOST_TEST(throws_with<IndexError>([&] { store.read({kRows + 5}); }, {}));
  TensorDict wrong(BatchSize{3});
  wrong.set("x", at::ones({3, 4}));
  BOOST_CHECK_THROW(store.write({Slice(0, 10)}, wrong), Error);
  BOOST_TEST(store.get({Slice(10, 20)}).get("x").equal(at::ones({10, 4})));  // nothing lost
}

BOOST_AUTO_TEST_CASE(row_requests_carry_keys_and_a_resolved_index) {
  // the request names the leaves and carries the index resolved by the caller: any index kind, some keys
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  TensorDict all = store.td();
  all.get("x").copy_(at::arange(kRows * 4, at::kFloat).view({kRows, 4}));
  all.get({"obs", "a"}).copy_(at::arange(kRows * 3, at::kLong).view({kRows, 3}));
  const at::Tensor rows = at::tensor({7, 2, 7, 31}, at::kLong);
  const at::Tensor mask = at::arange(kRows, at::kLong).remainder(5).eq(0);
  for (const Index& idx : std::vector<Index>{{rows}, {mask}, {Slice(3, 40, 6)}, {at::indexing::None, Slice(1, 3)}, {-1}}) {
    BOOST_TEST_CONTEXT(index_repr(idx)) {
      TensorDict got = store.read(idx);
      TensorDict want = store.td().index(idx);
      BOOST_TEST(got.batch_size() == want.batch_size());
      BOOST_TEST(got.equal(want));
    }
  }
  TensorDict only_x = store.read({NestedKey("x")}, {rows});
  BOOST_TEST(only_x.keys() == std::vector<NestedKey>({NestedKey("x")}));
  BOOST_TEST(only_x.get("x").equal(all.get("x").index({rows})));
  BOOST_TEST(throws_with<KeyError>([&] { store.read({NestedKey("nope")}, {0}); }, {"nope"}));
  // a write at an index tensor, one key of the value only, a value broadcast over the rows and cast
  TensorDict value(BatchSize{});
  value.set("x", at::full({4}, 5, at::kLong));
  store.write({at::tensor({1, 9}, at::kLong)}, value);
  BOOST_TEST(all.get("x").index({at::tensor({1, 9}, at::kLong)}).eq(5).all().item<bool>());
  BOOST_TEST(all.get("x")[2].equal(at::arange(8, 12, at::kFloat)));  // neighbours untouched
  // a value naming a key the store lacks, or one that does not broadcast: an error, nothing written
  TensorDict extra(BatchSize{2});
  extra.set("x", at::full({2, 4}, -1.0));
  extra.set("missing", at::zeros({2}));
  BOOST_TEST(throws_with<KeyError>([&] { store.write({Slice(0, 2)}, extra); }, {"missing", "add_key"}));
  TensorDict bad(BatchSize{2});
  bad.set("x", at::full({2, 5}, -1.0));
  BOOST_TEST(throws_with<ValueError>([&] { store.write({Slice(0, 2)}, bad); }, {"broadcast"}));
  BOOST_TEST(all.get("x").index({Slice(0, 2)}).ge(0).all().item<bool>());
  BOOST_TEST(throws_with<IndexError>([&] { store.write({kRows}, value); }, {}));
  // a non-tensor leaf in the value: a store holds tensor leaves only (as its TensorDict's set)
  TensorDict tagged(BatchSize{2});
  tagged.set("x", at::full({2, 4}, -1.0));
  tagged.set_non_tensor("tag", JsonValue("t"));
  BOOST_TEST(throws_with<NotImplementedError>([&] { store.write({Slice(0, 2)}, tagged); }, {"tensor leaves only", "'tag'"}));
  BOOST_TEST(all.get("x").index({Slice(0, 2)}).ge(0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(concurrent_row_requests_are_drained_in_batches_and_all_answered) {
  // many callers' reads and writes through the actor: it drains what waits in its mailbox and hands the
  // backend runs of reads / writes at once; every caller still gets its own answer
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  const int kThreads = 8, kCalls = 100;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0}, failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int j = 0; j < kCalls; ++j) {
          const int64_t row = (t * kCalls + j) % kRows;
          TensorDict value(BatchSize{});
          value.set("x", at::full({4}, static_cast<double>(t)));
          value.set({"obs", "a"}, at::full({3}, t, at::kLong));
          store.write({row}, value);
          TensorDict back = store.read({at::indexing::Slice(row, row + 1)});
          if (back.batch_size() != BatchSize({1})) ++wrong;  // rows may be overwritten by others: shape only
        }
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  BOOST_TEST(failures.load() == 0);
  BOOST_TEST(wrong.load() == 0);
  const auto stats = store.client()->batch_stats();
  BOOST_TEST(stats.calls == 2 * kThreads * kCalls);  // every read and write reached the backend once
  BOOST_TEST(stats.batches >= 1);
  BOOST_TEST(stats.batches <= stats.calls);
  BOOST_TEST_MESSAGE("row calls " << stats.calls << " in " << stats.batches << " batches, largest "
                                  << stats.largest);
  // a failing call inside a batch fails alone
  BOOST_CHECK_THROW(store.read({kRows + 3}), IndexError);
  BOOST_TEST(store.read({0}).batch_size() == BatchSize({}));
}

BOOST_AUTO_TEST_CASE(add_key_from_many_threads_loses_no_key) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  const int kThreads = 8, kPerThread = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int j = 0; j < kPerThread; ++j) {
          const int id = t * kPerThread + j;
          store.add_key("k" + std::to_string(id), at::full({kRows}, static_cast<double>(id)));
          // rows meanwhile, directly
          store.td().get("x").index_put_({Slice(t * 8, t * 8 + 8)}, static_cast<double>(t));
        }
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  BOOST_TEST(failures.load() == 0);
  BOOST_TEST(store.version() == kThreads * kPerThread);
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  for (int id = 0; id < kThreads * kPerThread; ++id) {
    const std::string k = "k" + std::to_string(id);
    BOOST_REQUIRE(fresh.contains(k));
    BOOST_TEST(fresh.get(k).equal(at::full({kRows}, static_cast<double>(id))));
    BOOST_TEST(store.td().contains(k));
  }
  for (int t = 0; t < kThreads; ++t) BOOST_TEST(fresh.get("x")[t * 8].equal(at::full({4}, static_cast<double>(t))));
}

BOOST_AUTO_TEST_CASE(bad_requests_raise_their_type_and_lose_nothing) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  store.add_key("r", at::ones({kRows}));
  BOOST_TEST(throws_with<KeyError>([&] { store.add_key("r", at::ones({kRows})); }, {"'r'", "already exists"}));
  BOOST_TEST(throws_with<KeyError>([&] { store.add_key({"x", "b"}, at::ones({kRows})); }, {"not a TensorDict"}));
  // names Python's meta.json uses for the TensorDict itself (memmap_ refuses them too)
  for (const NestedKey& k : {NestedKey("shape"), NestedKey({"lvl", "device"}), NestedKey({"_type", "v"})}) {
    BOOST_TEST(throws_with<ValueError>([&] { store.add_key(k, at::ones({kRows})); }, {"cannot be saved"}));
  }
  BOOST_TEST(!fs::exists(dir.path + "/buf/shape.memmap"));
  BOOST_TEST(!fs::exists(dir.path + "/buf/lvl"));
  BOOST_TEST(throws_with<BatchSizeError>([&] { store.add_key("s", at::ones({kRows + 1, 2})); },
                                         {"[65, 2]", "batch size [64]"}));
  actors::store_request bad;
  bad.op = static_cast<int32_t>(actors::StoreOp::AddKey);
  bad.key = {"t"};
  bad.dtype = "torch.nope";
  bad.shape = {kRows};
  BOOST_TEST(throws_with<TypeError>([&] { store.client()->call(bad); }, {"torch.nope"}));
  BOOST_TEST(throws_with<ValueError>([&] { Store::open(TensorDict(BatchSize{kRows})); }, {"ordinary memory"}));
  // the store still works and the directory holds exactly what succeeded
  store.add_key("ok", at::zeros({kRows, 2}));
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  BOOST_TEST(fresh.contains("r"));
  BOOST_TEST(fresh.contains("ok"));
  BOOST_TEST(!fresh.contains("s"));
  BOOST_TEST(!fresh.contains("t"));
  BOOST_TEST(!fs::exists(dir.path + "/buf/s.memmap"));
}

BOOST_AUTO_TEST_CASE(add_key_under_missing_levels_creates_them) {
  // as set(("a", "b"), x) upstream: the levels are created, on disk in Python's layout (memmap) or in shared memory
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  store.add_key({"new", "deeper", "v"}, at::arange(kRows, at::kFloat));
  store.add_key({"new", "w"}, at::zeros({kRows, 2}, at::kLong));
  BOOST_TEST(store.td().get({"new", "deeper", "v"}).equal(at::arange(kRows, at::kFloat)));
  BOOST_TEST(store.td().get_td("new").batch_size() == BatchSize({kRows}));
  BOOST_TEST(store.td().get_td("new").is_memmap());
  BOOST_TEST(fs::exists(dir.path + "/buf/new/deeper/meta.json"));
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  BOOST_TEST(fresh.get({"new", "deeper", "v"}).equal(at::arange(kRows, at::kFloat)));
  BOOST_TEST(fresh.get({"new", "w"}).sizes() == at::IntArrayRef({kRows, 2}));
  BOOST_TEST(fresh.contains({"obs", "a"}));  // what was there stays
  // the store-backed TensorDict does the same through set
  TensorDict td = store.tensordict();
  td.unlock_();
  td.set({"made", "by", "set"}, at::ones({kRows, 3}));
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/buf").get({"made", "by", "set"}).equal(at::ones({kRows, 3})));
  // a level under a leaf is still refused, and nothing is created
  BOOST_TEST(throws_with<KeyError>([&] { store.add_key({"x", "b", "c"}, at::ones({kRows})); }, {"not a TensorDict"}));
  BOOST_TEST(!fs::exists(dir.path + "/buf/x"));
  // a shared store: the new level is shared memory like its leaf
  TensorDict buf(BatchSize{kRows});
  buf.set("x", at::zeros({kRows, 4}));
  buf.share_memory_();
  Store shared = Store::open(buf);
  shared.add_key({"lvl", "y"}, at::full({kRows, 2}, 3.0));
  BOOST_TEST(shared.td().get_td("lvl").is_shared());
  TensorDict other = tensordict::from_share_handle(share_handle(shared.td()));
  BOOST_TEST(other.get({"lvl", "y"}).equal(at::full({kRows, 2}, 3.0)));
}

BOOST_AUTO_TEST_CASE(shared_store_adds_segments_and_hands_out_handles) {
  TensorDict buf(BatchSize{kRows});
  buf.set("x", at::zeros({kRows, 4}));
  buf.share_memory_();
  Store store = Store::open(buf);
  BOOST_TEST(store.kind() == "shared");
  store.add_key("y", at::arange(kRows * 2, at::kFloat).view({kRows, 2}));
  BOOST_TEST(store.td().is_shared());
  TensorDict other = tensordict::from_share_handle(share_handle(store.td()));
  BOOST_TEST(other.get("y").equal(at::arange(kRows * 2, at::kFloat).view({kRows, 2})));
  other.get("y")[3].fill_(-1.0);  // same memory
  BOOST_TEST(store.td().get("y")[3].equal(at::full({2}, -1.0)));
  store.flush();    // nothing to do, but allowed
  store.refresh();  // the owner's structure is current
  BOOST_TEST(store.td().contains("y"));
}

// the one store stack (issue 34, item 5): a memmap or shared store speaks the interface HDF5 and Redis stores
// speak (backends::LeafStore), through the same client, behind the same node
BOOST_AUTO_TEST_CASE(a_dense_store_speaks_the_one_store_interface) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  auto& client = *store.client();
  BOOST_TEST(client.driver() == "memmap");
  BOOST_TEST((client.dense() != nullptr));
  // structure: the store lists its levels and leaves as any LeafStore does
  const auto infos = client.run([](backends::LeafStore& s) { return s.list(); });
  BOOST_REQUIRE(infos.size() == 3u);
  BOOST_TEST((infos[1].kind == backends::LeafKind::Group && infos[1].path == backends::LeafPath{"obs"}));
  BOOST_TEST((infos[2].dtype == at::kLong && infos[2].shape == std::vector<int64_t>{kRows, 3}));
  // a read of rows that form one run is a view of the storage: a write through it reaches the file
  std::vector<at::Tensor> got = client.read({backends::LeafRead{{"x"}, false, {4, 5, 6}, std::nullopt}});
  got.at(0).fill_(2.5);
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/buf").get("x").index({at::indexing::Slice(4, 7)}).eq(2.5).all().item<bool>());
  // rows that are not one run are a gather (a copy), in the shape asked for
  got = client.read({backends::LeafRead{{"x"}, false, {1, 6}, std::vector<int64_t>{2, 2, 2}}});
  BOOST_TEST(got.at(0).sizes() == at::IntArrayRef({2, 2, 2}));
  got.at(0).fill_(-1.0);
  BOOST_TEST(store.td().get("x")[1].eq(0).all().item<bool>());
  // a batched write lands every leaf; one bad leaf among them writes nothing
  client.write({backends::LeafWrite{{"x"}, false, {0, 9}, at::ones({2, 4})},
                backends::LeafWrite{{"obs", "a"}, false, {9}, at::full({3}, 7, at::kLong)}});
  BOOST_TEST(store.td().get("x")[9].equal(at::ones({4})));
  BOOST_TEST(store.td().get({"obs", "a"})[9].equal(at::full({3}, 7, at::kLong)));
  BOOST_TEST(throws_with<KeyError>([&] {
    client.write({backends::LeafWrite{{"x"}, false, {10}, at::full({4}, 8.0)},
                  backends::LeafWrite{{"nope"}, false, {10}, at::ones({1})}});
  }, {"'nope'"}));
  BOOST_TEST(throws_with<ValueError>([&] {
    client.write({backends::LeafWrite{{"x"}, false, {10}, at::full({4}, 8.0)},
                  backends::LeafWrite{{"obs", "a"}, false, {10}, at::ones({3})}});  // float data for an int64 leaf
  }, {"'obs', 'a'", "elements of Long"}));
  BOOST_TEST(throws_with<ValueError>([&] {
    client.write({backends::LeafWrite{{"x"}, false, {kRows}, at::ones({4})}});
  }, {"outside"}));
  BOOST_TEST(store.td().get("x")[10].eq(0).all().item<bool>());
  // what a store cannot hold is refused by the interface, as the node reports it
  BOOST_TEST(throws_with<NotImplementedError>([&] { client.run([](backends::LeafStore& s) { s.erase({"x"}); }); },
                                              {"cannot remove"}));
  // the store node has the store's storage spec: another process reopens the same directory
  TensorDict td = store.tensordict();
  const StorageSpec spec = StorageSpec::of(td);
  BOOST_TEST(spec.driver() == "memmap");
  BOOST_TEST(open_storage(spec).get("x")[9].equal(at::ones({4})));
  // reads and row writes counted as store calls only when they go through the store, not through the node
  const auto before = client.batch_stats().calls;
  td.index_put_({3}, TensorDict({{"x", at::full({4}, 4.0)}}, {}));
  BOOST_TEST(td.get("x")[3].equal(at::full({4}, 4.0)));
  BOOST_TEST(client.batch_stats().calls == before);  // the snapshot: no request
}

BOOST_AUTO_TEST_CASE(a_killed_store_actor_fails_calls_instead_of_hanging) {
  TempDir dir("store");
  // a hang would last 10 minutes (the ctest timeout), not pass
  auto engine = engine_with_timeout(600000);
  Store store = Store::open(make_buffer(dir.path + "/buf"), engine);
  store.add_key("a", at::ones({kRows}));
  caf::anon_send_exit(store.client()->actor(), caf::exit_reason::kill);
  BOOST_TEST(throws_with<BackendError>([&] {
    for (int i = 0; i < 1000; ++i) {  // the exit is asynchronous: the first calls may still be served
      store.add_key("b" + std::to_string(i), at::ones({kRows}));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }, {"store actor terminated"}));
  // rows and what was added before stay usable
  store.td().get("a")[0].fill_(3.0);
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/buf").get("a")[0].item<float>() == 3.0f);
}

BOOST_AUTO_TEST_CASE(closed_store_refuses_actor_calls_keeps_rows) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  TensorDict snap = store.td();
  store.close();
  store.close();  // idempotent
  BOOST_TEST(throws_with<BackendError>([&] { store.add_key("z", at::ones({kRows})); }, {"closed"}));
  BOOST_TEST(throws_with<BackendError>([&] { store.flush(); }, {"closed"}));
  BOOST_TEST(throws_with<BackendError>([&] { store.publish(); }, {"closed"}));
  snap.get("x")[1].fill_(4.0);
  BOOST_TEST(store.get({1}).get("x").equal(at::full({4}, 4.0)));
}

BOOST_AUTO_TEST_CASE(refresh_picks_up_keys_another_process_added) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  BOOST_TEST(testutil::wait_child(run_client({"own_add", dir.path + "/buf", "from_child"})) == 0);
  BOOST_TEST(!store.td().contains("from_child"));
  store.refresh();
  BOOST_REQUIRE(store.td().contains("from_child"));
  BOOST_TEST(store.td().get("from_child").equal(at::ones({kRows})));
  BOOST_TEST(store.version() == 1);
}

BOOST_AUTO_TEST_CASE(processes_connect_add_keys_and_fill_rows) {
  TempDir dir("store");
  Store store = Store::open(make_buffer(dir.path + "/buf"));
  const uint16_t port = store.publish();
  const int kClients = 4;
  std::vector<pid_t> pids;
  for (int i = 0; i < kClients; ++i) {
    const int64_t per = kRows / kClients;
    pids.push_back(run_client_with_token({"add", std::to_string(port), std::to_string(i), std::to_string(i * per),
                                          std::to_string((i + 1) * per)},
                                         store.token()));
  }
  // without the store's token, or with another: refused (exit 3: a tensordict error), nothing added
  std::string wrong = store.token();
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  const pid_t no_token = run_client({"add", std::to_string(port), "8", "0", "0"});
  const pid_t bad_token = run_client_with_token({"add", std::to_string(port), "9", "0", "0"}, wrong);
  for (pid_t p : pids) BOOST_TEST(testutil::wait_child(p) == 0);
  BOOST_TEST(testutil::wait_child(no_token) == 3);
  BOOST_TEST(testutil::wait_child(bad_token) == 3);
  BOOST_TEST(!store.td().contains("k8"));
  BOOST_TEST(!store.td().contains("k9"));
  BOOST_TEST(store.td().keys().size() == static_cast<size_t>(2 + kClients));  // x, obs + one per client
  // the owner's actor added every key: its snapshot has them without a refresh
  TensorDict td = store.td();
  for (int i = 0; i < kClients; ++i) {
    const std::string k = "k" + std::to_string(i);
    BOOST_REQUIRE(td.contains(k));
    BOOST_TEST(td.get(k).equal(at::full({kRows, 2}, static_cast<double>(i))));
    BOOST_TEST(td.get("x")[i * (kRows / kClients)].equal(at::full({4}, static_cast<double>(i + 1))));
  }
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  for (int i = 0; i < kClients; ++i) BOOST_TEST(fresh.contains("k" + std::to_string(i)));
  store.close();
}

BOOST_AUTO_TEST_CASE(processes_connect_to_a_shared_store) {
  TensorDict buf(BatchSize{kRows});
  buf.set("x", at::zeros({kRows, 4}));
  buf.share_memory_();
  Store store = Store::open(buf);
  const uint16_t port = store.publish();
  pid_t a = run_client_with_token({"add", std::to_string(port), "0", "0", "32"}, store.token());
  pid_t b = run_client_with_token({"add", std::to_string(port), "1", "32", "64"}, store.token());
  BOOST_TEST(testutil::wait_child(a) == 0);
  BOOST_TEST(testutil::wait_child(b) == 0);
  TensorDict td = store.td();
  BOOST_TEST(td.get("k0").equal(at::zeros({kRows, 2})));
  BOOST_TEST(td.get("k1").equal(at::ones({kRows, 2})));
  BOOST_TEST(td.get("x").index({Slice(0, 32)}).eq(1.0).all().item<bool>());
  BOOST_TEST(td.get("x").index({Slice(32, 64)}).eq(2.0).all().item<bool>());
}

// a peer that accepts the TCP connection but never answers CAF's handshake: CAF's remote_actor waited for it
// without end; a connect is now bounded (request_timeout_ms per attempt, 3 attempts) and fails typed
BOOST_AUTO_TEST_CASE(a_peer_that_never_answers_the_handshake_is_a_backend_error) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BOOST_REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  BOOST_REQUIRE(::listen(fd, 8) == 0);  // the kernel completes TCP handshakes; nobody ever reads
  socklen_t len = sizeof(addr);
  BOOST_REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const uint16_t port = ntohs(addr.sin_port);
  {
    auto engine = engine_with_timeout(300);
    const auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(throws_with<BackendError>([&] { Store::connect("127.0.0.1", port, std::string(32, 'a'), engine); },
                                         {"cannot connect", "did not answer", "3 attempts"}));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST_MESSAGE("a silent peer refused after " << secs << " s");
  }
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(a_dropped_connection_is_a_backend_error) {
  TempDir dir("store");
  make_buffer(dir.path + "/buf");
  BOOST_TEST(throws_with<BackendError>([&] { Store::connect("127.0.0.1", 1); }, {"cannot connect"}));
  const std::string portfile = dir.path + "/port";
  pid_t server = run_client({"serve", dir.path + "/buf", portfile});
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // at most 60 s for a torch process to start
    std::ifstream in(portfile);
    if (!(in >> port)) port = 0;
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  BOOST_REQUIRE(port > 0);
  auto engine = engine_with_timeout(600000);  // a hang would hit the ctest timeout, not pass
  // the token: in a file only its owner may read
  struct stat st;
  BOOST_REQUIRE(::stat((portfile + ".token").c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  const std::string token = Store::load_token(portfile + ".token");
  BOOST_TEST(token.size() == 32u);
  ::chmod((portfile + ".token").c_str(), 0644);
  BOOST_TEST(throws_with<ValueError>([&] { Store::load_token(portfile + ".token"); }, {"0600"}));
  // no token, a wrong one: refused, with a clear error that does not show the right one
  std::string wrong = token;
  wrong[5] = wrong[5] == '0' ? '1' : '0';
  BOOST_TEST(throws_with<BackendError>([&] { Store::connect("127.0.0.1", static_cast<uint16_t>(port), engine); },
                                       {"access refused", "no store token", "TENSORDICT_STORE_TOKEN"}));
  BOOST_TEST(throws_with<BackendError>([&] { Store::connect("127.0.0.1", static_cast<uint16_t>(port), wrong, engine); },
                                       {"access refused", "wrong store token"}));
  {  // a hand-made AddKey from this process (another node) with a wrong token changes nothing
    auto& sys = engine->runtime()->system();
    auto remote = sys.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(port));
    BOOST_REQUIRE(static_cast<bool>(remote));
    actors::store_request add;
    add.op = static_cast<int32_t>(actors::StoreOp::AddKey);
    add.key = {"intruder"};
    add.dtype = "torch.float32";
    add.shape = {kRows};
    add.token = wrong;
    std::string m;
    try {
      actors::store_request_blocking(sys, *remote, add, std::chrono::seconds(60));
    } catch (const BackendError& e) {
      m = e.what();
    }
    BOOST_TEST(m.find("access refused") != std::string::npos, m);
    BOOST_TEST(m.find(token) == std::string::npos);
    BOOST_TEST(!TensorDict::load_memmap(dir.path + "/buf").contains("intruder"));
    BOOST_TEST(!fs::exists(dir.path + "/buf/intruder.memmap"));
  }
  Store client = Store::connect("127.0.0.1", static_cast<uint16_t>(port), token, engine);
  BOOST_TEST(client.token() == token);
  BOOST_TEST(client.is_remote());
  client.add_key("before", at::ones({kRows}));
  BOOST_TEST(client.td().get("before").equal(at::ones({kRows})));
  BOOST_TEST(throws_with<ValueError>([&] { client.read({0}); }, {"mapping"}));
  BOOST_TEST(throws_with<ValueError>([&] { client.publish(); }, {"only the owner"}));
  actors::store_request close_req;
  close_req.op = static_cast<int32_t>(actors::StoreOp::Close);
  BOOST_TEST(throws_with<ValueError>([&] { client.client()->call(close_req); }, {"only the owner closes"}));
  client.add_key("still_served", at::zeros({kRows}));  // the owner still serves
  {
    Store second = Store::connect("127.0.0.1", static_cast<uint16_t>(port), token, engine);
    BOOST_TEST(second.td().contains("before"));  // the owner's structure, mapped here
    second.close();
    BOOST_TEST(throws_with<BackendError>([&] { second.flush(); }, {"closed"}));
  }
  ::kill(server, SIGKILL);
  BOOST_TEST(testutil::wait_child(server) == -SIGKILL);
  BOOST_TEST(throws_with<BackendError>([&] { client.add_key("after", at::ones({kRows})); }, {"store"}));
  // the mapping stays: rows written before the owner died are on disk
  client.td().get("before")[0].fill_(9.0);
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/buf").get("before")[0].item<float>() == 9.0f);
}

BOOST_AUTO_TEST_CASE(add_key_beyond_the_configured_maximum_is_refused) {
  TempDir dir("store");
  auto engine = std::make_shared<Engine>(Config::load(R"({"store": {"max_key_bytes": 400}})"));
  Store store = Store::open(make_buffer(dir.path + "/buf"), engine);
  const uint16_t port = store.publish();
  // 64 x 4 float32 = 1024 bytes: over the limit, from this process and from another one
  BOOST_TEST(throws_with<ValueError>([&] { store.add_key("big", {kRows, 4}, at::kFloat); },
                                     {"'big'", "1024 bytes", "400", "store.max_key_bytes"}));
  const pid_t client = run_client_with_token({"add", std::to_string(port), "7", "0", "0"}, store.token());  // 64 x 2 f32: 512 bytes
  BOOST_TEST(testutil::wait_child(client) == 3);
  store.add_key("small", {kRows}, at::kFloat);  // 256 bytes: fine
  BOOST_TEST(store.td().contains("small"));
  BOOST_TEST(!store.td().contains("big"));
  BOOST_TEST(!store.td().contains("k7"));
  TensorDict fresh = TensorDict::load_memmap(dir.path + "/buf");
  BOOST_TEST(!fresh.contains("big"));
  BOOST_TEST(!fs::exists(dir.path + "/buf/big.memmap"));
  BOOST_TEST(!fs::exists(dir.path + "/buf/k7.memmap"));
  store.close();
}

BOOST_AUTO_TEST_CASE(add_key_beyond_the_free_space_is_refused_and_changes_nothing) {
  TempDir dir("store");
  // memmap: the buffer lives on a 1 MiB tmpfs; a 4 MiB key does not fit, a 64 KiB one does
  fs::create_directories(dir.path + "/small");
  const std::string buf = dir.path + "/small/buf";
  const std::string report = dir.path + "/report";
  pid_t p = run_client_on_small_fs(dir.path + "/small", 1024,
                                   {"add_big", buf, "huge", std::to_string(4 << 20), report});
  BOOST_TEST(testutil::wait_child(p) == 0);
  std::string text = read_text(report);
  BOOST_TEST(text.find("BackendError") != std::string::npos, text);
  BOOST_TEST(text.find("'huge'") != std::string::npos, text);
  BOOST_TEST(text.find(std::to_string(4 << 20) + " bytes") != std::string::npos, text);
  BOOST_TEST(text.find("left") != std::string::npos, text);
  BOOST_TEST(text.find("key 'huge'") == std::string::npos, text);
  BOOST_TEST(text.find("huge.memmap") == std::string::npos, text);
  BOOST_TEST(text.find("key 'x'") != std::string::npos, text);
  // shared: /dev/shm is a 1 MiB tmpfs in the child's namespace
  fs::remove(report);
  p = run_client_on_small_fs("/dev/shm", 1024, {"add_big", "shared", "huge", std::to_string(4 << 20), report});
  BOOST_TEST(testutil::wait_child(p) == 0);
  text = read_text(report);
  BOOST_TEST(text.find("BackendError") != std::string::npos, text);
  BOOST_TEST(text.find("'huge'") != std::string::npos, text);
  BOOST_TEST(text.find("left") != std::string::npos, text);
  BOOST_TEST(text.find("key 'huge'") == std::string::npos, text);
  BOOST_TEST(text.find("key 'x'") != std::string::npos, text);
}

BOOST_AUTO_TEST_SUITE_END()
