// Storage specs: parsed without I/O, the engine's memmap and shared drivers, registration of another driver.
#include <algorithm>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "engine/zoo.hpp"
#include "tensordict/storage_spec.hpp"

using namespace tensordict;
using zoo::throws_with;

BOOST_AUTO_TEST_SUITE(storage_spec)

BOOST_AUTO_TEST_CASE(parse_without_io) {
  StorageSpec s = StorageSpec::parse(R"({"driver": "memmap", "path": "/nowhere/at/all"})");
  BOOST_TEST(s.driver() == "memmap");
  BOOST_TEST(s.str("path") == "/nowhere/at/all");
  BOOST_TEST(StorageSpec::parse(s.dump()).str("path") == "/nowhere/at/all");
  BOOST_TEST(throws_with<ValueError>([] { StorageSpec::parse("[1, 2]"); }, {"JSON object"}));
  BOOST_TEST(throws_with<ValueError>([] { StorageSpec::parse(R"({"path": "x"})"); }, {"driver"}));
  BOOST_TEST(throws_with<ValueError>([] { StorageSpec::parse("{not json"); }, {"not valid JSON"}));
  BOOST_TEST(throws_with<ValueError>([&] { s.str("missing"); }, {"\"missing\"", "memmap"}));
  BOOST_TEST(throws_with<ValueError>([] { open_storage(StorageSpec::parse(R"({"driver": "foobar"})")); },
                                     {"unknown driver 'foobar'", "memmap", "shared"}));
}

BOOST_AUTO_TEST_CASE(memmap_and_shared_round_trip) {
  fixtures::TempDir dir("spec");
  TensorDict td = zoo::plain({4, 3}, 5);
  TensorDict mm = td.memmap(dir.path + "/mm");
  StorageSpec s = StorageSpec::of(mm);
  BOOST_TEST(s.driver() == "memmap");
  TensorDict back = open_storage(StorageSpec::parse(s.dump()));
  BOOST_TEST(back.equal(td));
  back.index_put_({0}, zeros_like(td.index({0})));  // writable: lands in the files
  BOOST_TEST(TensorDict::load_memmap(dir.path + "/mm").get("a")[0].eq(0).all().item<bool>());

  TensorDict sh = td.clone();
  sh.share_memory_();
  StorageSpec ss = StorageSpec::of(sh);
  BOOST_TEST(ss.driver() == "shared");
  TensorDict other = open_storage(StorageSpec::parse(ss.dump()));
  BOOST_TEST(other.equal(sh));
  other.index_put_({1}, zeros_like(td.index({1})));
  BOOST_TEST(sh.get("a")[1].eq(0).all().item<bool>());  // the same memory

  BOOST_TEST(throws_with<ValueError>([&] { StorageSpec::of(td, "the source"); }, {"the source", "in-memory"}));
  BOOST_TEST(throws_with<ValueError>(
      [] { open_storage(StorageSpec::parse(R"({"driver": "shared", "handle": "zz"})")); }, {"hex"}));
}

BOOST_AUTO_TEST_CASE(register_another_driver) {
  register_storage_driver("test-zeros", {[](const StorageSpec& s, const OpenOptions&) {
                            return TensorDict({{"x", at::zeros({std::stoll(s.str("rows"))})}}, {std::stoll(s.str("rows"))});
                          }});
  const StorageSpec spec = StorageSpec::parse(R"({"driver": "test-zeros", "rows": "3"})");
  TensorDict td = open_storage(spec);
  BOOST_TEST(td.batch_size() == BatchSize({3}));
  std::vector<std::string> d = storage_drivers();
  BOOST_TEST((std::find(d.begin(), d.end(), "test-zeros") != d.end()));
  // a driver that only opens refuses the modes it cannot serve, by name
  BOOST_TEST(throws_with<ValueError>([&] { open_storage(spec, OpenOptions().mode(OpenMode::create)); },
                                     {"test-zeros", "cannot create"}));
  BOOST_TEST(throws_with<ValueError>([&] { open_storage(spec, OpenOptions().mode(OpenMode::open_or_create)); },
                                     {"test-zeros", "open_or_create"}));
}

// one registry opens and creates: OpenMode open / create / open_or_create on the engine's drivers, and
// from_schema through it
BOOST_AUTO_TEST_CASE(open_modes) {
  fixtures::TempDir dir("spec-modes");
  const Schema schema{{"obs", {{3}, at::kFloat}}, {NestedKey{"next", "r"}, {{}, at::kLong}}};
  const OpenOptions create = OpenOptions().mode(OpenMode::create).schema(schema).batch_size({4});
  const OpenOptions either = OpenOptions().mode(OpenMode::open_or_create).schema(schema).batch_size({4});
  const StorageSpec mm("memmap", JsonValue::object({{"path", JsonValue(dir.path + "/mm")}}));

  BOOST_TEST(throws_with<Error>([&] { open_storage(mm); }, {}));  // open: nothing there yet
  TensorDict made = open_storage(mm, either);                      // missing: created from the schema
  BOOST_TEST(made.is_memmap());
  BOOST_TEST(made.batch_size() == BatchSize({4}));
  BOOST_TEST((made.get("obs").sizes() == at::IntArrayRef({4, 3})));
  BOOST_TEST(made.get(NestedKey{"next", "r"}).scalar_type() == at::kLong);
  BOOST_TEST(made.get("obs").eq(0).all().item<bool>());
  made.get("obs").fill_(7);
  TensorDict again = open_storage(mm, either);  // there now: opened, the values kept
  BOOST_TEST(again.get("obs").eq(7).all().item<bool>());
  BOOST_TEST(open_storage(mm).get("obs").eq(7).all().item<bool>());
  TensorDict fresh = open_storage(mm, create);  // create: a new storage from the schema
  BOOST_TEST(fresh.get("obs").eq(0).all().item<bool>());

  TensorDict sh = open_storage(StorageSpec("shared", JsonValue::object({})), either);  // no handle: created
  BOOST_TEST(sh.is_shared());
  BOOST_TEST(sh.batch_size() == BatchSize({4}));
  StorageSpec handle = StorageSpec::of(sh);
  TensorDict other = open_storage(handle, either);  // a handle: opened, the same memory
  other.get("obs").fill_(2);
  BOOST_TEST(sh.get("obs").eq(2).all().item<bool>());

  BOOST_TEST(throws_with<BatchSizeError>(
      [&] { open_storage(mm, OpenOptions().mode(OpenMode::create).schema(schema).batch_size({-1})); }, {"negative"}));
  BOOST_TEST(throws_with<ValueError>(
      [&] { open_storage(StorageSpec("foobar", JsonValue::object({})), create); }, {"unknown driver 'foobar'", "memmap"}));
}

BOOST_AUTO_TEST_SUITE_END()
