// What a memmap directory's meta.json holds beside the entries (issue 35): the TensorDict's own fields
// "shape", "device" and "_type" share the object with the keys, so a key of that name is refused by every
// save path before anything is written (item 20: Python would lose the entry on load); a meta.json naming a
// device other than the CPU loads on the CPU, where the memory-mapped leaves are, and says so (item 21).
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/memmap_storage.hpp"

using namespace tensordict;
namespace fs = std::filesystem;
using fixtures::TempDir;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  BOOST_REQUIRE(f.good());
}

void write_bytes(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  BOOST_REQUIRE(f.good());
}

//! every file and directory below `dir` (relative paths, sorted), with the bytes of each file
std::vector<std::string> snapshot(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::string line = fs::relative(e.path(), dir).string();
    if (e.is_regular_file()) line += " = " + fixtures::read_file(e.path().string());
    out.push_back(line);
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <class E, class F>
bool throws_naming(F f, const std::string& key) {
  try {
    f();
  } catch (const E& e) {
    const std::string what = e.what();
    return what.find("'" + key + "'") != std::string::npos && what.find("meta.json") != std::string::npos;
  }
  return false;
}

const std::vector<std::string> kReserved = {"shape", "device", "_type"};

constexpr const char* kTdType = R"("_type": "<class 'tensordict._td.TensorDict'>")";

}  // namespace

BOOST_AUTO_TEST_SUITE(memmap_meta)

BOOST_AUTO_TEST_CASE(reserved_keys_are_refused_by_memmap_before_anything_is_written) {
  TempDir dir("meta");
  for (const std::string& k : kReserved) {
    // at the root, one level down, and in a member of a lazy stack below the root
    TensorDict root({{"a", at::ones({4})}, {k, at::zeros({4})}}, {4});
    TensorDict nested({{"a", at::ones({4})}, {NestedKey{"lvl", k}, at::zeros({4, 2})}}, {4});
    TensorDict member({{"a", at::ones({4})}, {k, at::zeros({4})}}, {4});
    TensorDict in_stack({{"a", at::ones({2, 4})}}, {2});
    in_stack.set("st", TensorDict(LazyStackedTensorDict({member, member.clone()}, 0)));
    int i = 0;
    for (const TensorDict& td : {root, nested, in_stack}) {
      const std::string fresh = dir / (k + "-fresh-" + std::to_string(i));
      BOOST_TEST(throws_naming<ValueError>([&] { td.clone().memmap_(fresh); }, k), k << " case " << i);
      BOOST_TEST(!fs::exists(fresh), fresh << " was left behind");
      BOOST_TEST(throws_naming<ValueError>([&] { td.memmap_like(fresh); }, k), k << " case " << i);
      BOOST_TEST(!fs::exists(fresh), fresh << " was left behind by memmap_like");
      // over an earlier save: that save stays as it was
      const std::string old = dir / (k + "-old-" + std::to_string(i));
      TensorDict({{"keep", at::arange(4)}}, {4}).memmap_(old);
      const auto before = snapshot(old);
      BOOST_TEST(throws_naming<ValueError>([&] { td.clone().memmap_(old); }, k), k << " case " << i);
      BOOST_TEST(snapshot(old) == before, old << " changed");
      BOOST_TEST(TensorDict::load_memmap(old).get("keep").equal(at::arange(4)));
      ++i;
    }
    const std::string schema_dir = dir / (k + "-schema");
    BOOST_TEST(throws_naming<ValueError>(
                   [&] {
                     TensorDict::from_schema({{"a", {{}, at::kFloat}}, {NestedKey{"lvl", k}, {{3}, at::kLong}}}, {4},
                                             "memmap", MemmapOptions().prefix(schema_dir));
                   },
                   k),
               k);
    BOOST_TEST(!fs::exists(schema_dir), schema_dir << " was left behind");
  }
}

BOOST_AUTO_TEST_CASE(reserved_keys_are_refused_by_make_memmap_and_the_directory_is_unchanged) {
  TempDir dir("meta");
  TensorDict td({{"a", at::arange(4)}, {NestedKey{"sub", "b"}, at::ones({4, 2})}}, {4});
  td.memmap_(dir / "td");
  const auto before = snapshot(dir / "td");
  for (const std::string& k : kReserved) {
    for (const NestedKey& key : {NestedKey(k), NestedKey{"sub", k}, NestedKey{"new", k}, NestedKey{k, "x"}}) {
      BOOST_TEST(throws_naming<ValueError>([&] { make_memmap(td, key, {4, 3}, at::kFloat); }, k), key.repr());
      BOOST_TEST(!td.contains(key));
    }
  }
  BOOST_TEST(snapshot(dir / "td") == before);
  BOOST_TEST(!td.contains("new"));
  TensorDict back = TensorDict::load_memmap(dir / "td");
  BOOST_TEST(back.keys(KeysOptions().include_nested(true)).size() == 3u);
  BOOST_TEST(back.get("a").equal(at::arange(4)));
}

BOOST_AUTO_TEST_CASE(a_meta_json_naming_cuda_loads_on_the_cpu_and_says_so) {
  // as Python would write it from a TensorDict on cuda:0 (upstream's writers say "cpu"; older ones or a hand
  // edit may not): a leaf at the root, a sub-TensorDict with a leaf, and a sub-TensorDict with no leaf at all
  TempDir dir("meta");
  const std::string p = dir / "cuda";
  fs::create_directories(p + "/nested/empty");
  const std::string leaf_f = R"({"device": "cuda:0", "shape": [4, 2], "dtype": "torch.float32", "is_nested": false})";
  const std::string leaf_l = R"({"device": "cuda:0", "shape": [4], "dtype": "torch.int64", "is_nested": false})";
  write_file(p + "/meta.json", std::string(R"({"obs": )") + leaf_f + R"(, "nested": {"type": "TensorDict"}, )" +
                                   R"("shape": [4], "device": "cuda:0", )" + kTdType + "}");
  write_file(p + "/nested/meta.json", std::string(R"({"x": )") + leaf_l + R"(, "empty": {"type": "TensorDict"}, )" +
                                          R"("shape": [4], "device": "cuda", )" + kTdType + "}");
  write_file(p + "/nested/empty/meta.json", std::string(R"({"shape": [4], "device": "cuda:1", )") + kTdType + "}");
  write_bytes(p + "/obs.memmap", at::arange(8, at::kFloat).reshape({4, 2}));
  write_bytes(p + "/nested/x.memmap", at::arange(4, at::kLong));

  std::vector<std::string> warnings;
  TensorDict td = TensorDict::load_memmap(p, LoadOptions().on_warning([&](const std::string& w) { warnings.push_back(w); }));
  BOOST_REQUIRE(td.device().has_value());
  BOOST_TEST(td.device()->is_cpu());
  BOOST_TEST(td.get("obs").device().is_cpu());
  BOOST_TEST(td.get("obs").equal(at::arange(8, at::kFloat).reshape({4, 2})));
  for (const char* level : {"nested", "empty"}) {
    const TensorDict sub = std::string(level) == "nested" ? td.get_td("nested") : td.get_td(NestedKey{"nested", "empty"});
    BOOST_REQUIRE_MESSAGE(sub.device().has_value(), level);
    BOOST_TEST(sub.device()->is_cpu(), level);
  }
  BOOST_TEST(td.get(NestedKey{"nested", "x"}).equal(at::arange(4, at::kLong)));
  // the leaves were mapped, not copied: writes reach the files
  td.get("obs").fill_(7);
  BOOST_TEST(TensorDict::load_memmap(p, LoadOptions().on_warning([](const std::string&) {})).get("obs").eq(7).all().item<bool>());
  // one warning per level, naming its meta.json and its device
  BOOST_REQUIRE(warnings.size() == 3u);
  BOOST_TEST(warnings[0].find("'" + p + "/meta.json'") != std::string::npos, warnings[0]);
  BOOST_TEST(warnings[0].find("'cuda:0'") != std::string::npos, warnings[0]);
  BOOST_TEST(warnings[0].find("CPU") != std::string::npos, warnings[0]);
  // the load stays a memmap TensorDict of that directory; saving it again writes "cpu"
  BOOST_TEST(td.is_memmap());
  TensorDict copy = td.clone();
  copy.memmap_(dir / "again");
  BOOST_TEST(fixtures::read_json(dir / "again/meta.json").find("device")->as_string() == "cpu");
}

// tdx convert of a tensorclass store or file (issue 35 item 3) writes the class through this option
BOOST_AUTO_TEST_CASE(class_path_option_records_a_tensorclass_and_class_path_reads_it) {
  TempDir dir("cls");
  TensorDict td({{"a", at::arange(4, at::kFloat)}, {NestedKey{"sub", "b"}, at::ones({4, 2})}}, {4});
  BOOST_CHECK_EQUAL(td.class_path(), "");
  const std::string p1 = dir.path + "/saved", p2 = dir.path + "/like";
  td.memmap(p1, MemmapOptions().class_path("pkg.mod.Pair"));
  td.memmap_like(p2, MemmapOptions().class_path("pkg.mod.Pair"));
  for (const std::string& p : {p1, p2}) {
    std::ifstream f(p + "/meta.json");
    std::string meta((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    BOOST_CHECK_MESSAGE(meta.find("<class 'pkg.mod.Pair'>") != std::string::npos, p << ": " << meta);
    BOOST_CHECK(fs::exists(p + "/_tensordict/meta.json"));
    TensorDict back = TensorDict::load_memmap(p);
    BOOST_CHECK_EQUAL(back.class_path(), "pkg.mod.Pair");
    BOOST_CHECK_EQUAL(back.type_name(), "Pair");
    BOOST_CHECK(back.get("a").equal(p == p1 ? td.get("a") : at::zeros({4})));
    // a copy of the record keeps its class without the option
    const std::string p3 = p + ".copy";
    back.memmap(p3);
    BOOST_CHECK_EQUAL(TensorDict::load_memmap(p3).class_path(), "pkg.mod.Pair");
  }
  // a path that cannot be a class is refused before anything is written
  BOOST_CHECK_THROW(td.memmap(dir.path + "/bad", MemmapOptions().class_path("a'b")), ValueError);
  BOOST_CHECK_THROW(td.memmap_like(dir.path + "/bad", MemmapOptions().class_path("<x>")), ValueError);
  BOOST_CHECK(!fs::exists(dir.path + "/bad"));
}

BOOST_AUTO_TEST_SUITE_END()
