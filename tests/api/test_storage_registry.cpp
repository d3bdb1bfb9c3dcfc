// One store stack (issue 34, item 5): one registry whose h5 and redis drivers open, create and open_or_create
// (OpenMode), and api/ reaching a store's own records (the tensorclass path, clear_redis) through the LeafStore
// interface only; against real HDF5 files and a real redis-server.
#include <filesystem>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "redis_server.hpp"
#include "tensordict/backends/redis_client.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using fixtures::TempDir;

namespace {

const Schema& schema() {
  static const Schema s{{"obs", {{3}, at::kFloat}}, {NestedKey{"next", "r"}, {{}, at::kLong}}};
  return s;
}

OpenOptions mode(OpenMode m) { return OpenOptions().mode(m).schema(schema()).batch_size({4}); }

//! row 1 of a schema() TensorDict: obs 7, next.r 5
TensorDict row() {
  return TensorDict({{"obs", at::full({3}, 7.f)}, {NestedKey{"next", "r"}, at::full({}, 5, at::kLong)}}, {});
}

bool holds_row(const TensorDict& td) {
  TensorDict dense = td.to_tensordict();
  return dense.get("obs")[1].eq(7).all().item<bool>() && dense.get("obs")[0].eq(0).all().item<bool>() &&
         dense.get(NestedKey{"next", "r"})[1].item<int64_t>() == 5;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(storage_registry)

BOOST_AUTO_TEST_CASE(h5_open_create_and_open_or_create) {
  TempDir dir("registry");
  const std::string file = dir.path + "/x.h5";
  const StorageSpec spec("h5", JsonValue::object({{"path", JsonValue(file)}}));
  BOOST_CHECK_THROW(open_storage(spec), Error);  // open: no such file
  {
    PersistentTensorDict made(open_storage(spec, mode(OpenMode::open_or_create)));  // missing: created
    BOOST_TEST(made.batch_size() == BatchSize({4}));
    BOOST_TEST((made.get("obs").sizes() == at::IntArrayRef({4, 3})));
    BOOST_TEST(made.get(NestedKey{"next", "r"}).scalar_type() == at::kLong);
    made.index_put_({1}, row());
    made.close();
  }
  {
    PersistentTensorDict again(open_storage(spec, mode(OpenMode::open_or_create)));  // there: opened as it is
    BOOST_TEST(holds_row(again));
    again.close();
  }
  {
    PersistentTensorDict ro(open_storage(spec, OpenOptions().writable(false)));
    BOOST_TEST(holds_row(ro));
    BOOST_TEST(ro.mode() == "r");
    ro.close();
  }
  // create: a new file from the schema (from_schema's rule for a file already there: it is replaced)
  PersistentTensorDict fresh(open_storage(spec, mode(OpenMode::create)));
  BOOST_TEST(fresh.to_tensordict().get("obs").eq(0).all().item<bool>());
  fresh.close();
  // from_schema goes through the same driver
  TensorDict other = TensorDict::from_schema(schema(), {2}, "h5", H5Options().filename(dir.path + "/y.h5"));
  BOOST_TEST(other.batch_size() == BatchSize({2}));
}

BOOST_AUTO_TEST_CASE(redis_open_create_and_open_or_create) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port()).td_id("registry-id");
  const StorageSpec spec("redis", o.fields());
  BOOST_CHECK_THROW(open_storage(spec), KeyError);  // open: no such td_id
  TensorDictStore made(open_storage(spec, mode(OpenMode::open_or_create)));  // missing: created with that td_id
  BOOST_TEST(made.td_id() == "registry-id");
  BOOST_TEST(made.batch_size() == BatchSize({4}));
  made.index_put_({1}, row());
  TensorDictStore again(open_storage(spec, mode(OpenMode::open_or_create)));  // there: opened, values kept
  BOOST_TEST(holds_row(again));
  BOOST_TEST(holds_row(open_storage(StorageSpec::parse(StorageSpec::of(made).dump()))));
  // create without a td_id: a new store
  const StorageSpec anon("redis", RedisOptions().port(server.port()).fields());
  TensorDictStore other(open_storage(anon, mode(OpenMode::open_or_create)));
  BOOST_TEST(other.td_id() != "registry-id");
  BOOST_TEST(!other.td_id().empty());
}

// clear_redis and the tensorclass path through LeafStore's virtuals (no downcast in api/): clear_redis removes
// the leaves and __batch_size__ / __device__ / __keys__, and keeps __tensorclass__, as upstream's clear_redis
BOOST_AUTO_TEST_CASE(redis_records_through_the_store_interface) {
  testutil::RedisServer server;
  const RedisOptions o = RedisOptions().port(server.port());
  TensorDict td({{"a", at::ones({3, 2})}, {NestedKey{"sub", "b"}, at::zeros({3})}}, {3});
  TensorDictStore s = TensorDictStore::from_tensordict(td, o);
  BOOST_TEST(s.tensorclass() == "");
  s.set_tensorclass("pkg.models.Pair");
  BOOST_TEST(TensorDictStore::from_store(s.td_id(), o).tensorclass() == "pkg.models.Pair");
  s.clear_redis();
  backends::RedisConnectOptions c;
  c.port = server.port();
  backends::RedisClient raw(c);
  const backends::RedisReply keys = raw.command({"KEYS", "tensordict:{" + s.td_id() + "}:*"});
  BOOST_REQUIRE(keys.elements.size() == 1u);
  BOOST_TEST(keys.elements[0].str == "tensordict:{" + s.td_id() + "}:__tensorclass__");
  BOOST_TEST(s.tensorclass() == "pkg.models.Pair");
  BOOST_TEST(!TensorDictStore::is_lazy_stack(s.td_id(), o));
}

BOOST_AUTO_TEST_SUITE_END()
