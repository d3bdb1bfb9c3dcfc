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
  register_storage_driver("test-zeros", [](const StorageSpec& s, const OpenOptions&) {
    return TensorDict({{"x", at::zeros({std::stoll(s.str("rows"))})}}, {std::stoll(s.str("rows"))});
  });
  TensorDict td = open_storage(StorageSpec::parse(R"({"driver": "test-zeros", "rows": "3"})"));
  BOOST_TEST(td.batch_size() == BatchSize({3}));
  std::vector<std::string> d = storage_drivers();
  BOOST_TEST((std::find(d.begin(), d.end(), "test-zeros") != d.end()));
}

BOOST_AUTO_TEST_SUITE_END()
