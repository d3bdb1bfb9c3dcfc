// TensorDict persistence: Python fixtures load, round trips are bit-exact, memmap_/memmap/memmap_like,
// load_memmap_/memmap_refresh_/make_memmap, locks, bad files.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <boost/test/unit_test.hpp>

#include "fixtures.hpp"
#include "fs_util.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"
#include "tensordict/memmap_storage.hpp"

using namespace tensordict;
using at::indexing::Slice;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTdFixtures = {"a_flat", "b_nested", "c_non_tensor", "d_dtypes",
                                              "e_empty", "g_tensorclass", "h_zero_dim", "j_memmap_like"};

//! every file below `dir` (relative path -> bytes)
std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& p : fs::recursive_directory_iterator(dir)) {
    if (!p.is_regular_file()) continue;
    out[fs::relative(p.path(), dir).string()] = fixtures::read_file(p.path().string());
  }
  return out;
}

void check_same_data(const TensorDict& a, const TensorDict& b) {
  auto la = zoo::leaves(a);
  auto lb = zoo::leaves(b);
  BOOST_REQUIRE_EQUAL(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    BOOST_TEST(la[i].first == lb[i].first);
    BOOST_TEST(la[i].second.scalar_type() == lb[i].second.scalar_type());
    BOOST_TEST(la[i].second.sizes() == lb[i].second.sizes());
    // bit-exact: compare raw bytes (NaN-safe)
    at::Tensor x = la[i].second.contiguous(), y = lb[i].second.contiguous();
    const size_t nbytes = static_cast<size_t>(x.numel() * x.element_size());  // empty leaves: no data pointer
    BOOST_TEST((nbytes == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), nbytes) == 0), "leaf " << la[i].first);
  }
  for (const auto& k : a.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (a.is_non_tensor(k)) BOOST_TEST(a.get_non_tensor(k) == b.get_non_tensor(k));
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(memmap)

BOOST_AUTO_TEST_CASE(shared_fixtures_present) {
  // loud failure when ../shared is not beside the checkout
  BOOST_REQUIRE_MESSAGE(fs::is_directory(fixtures::shared_dir() + "/fixtures/python-written"),
                        "shared fixtures not found at " << fixtures::shared_dir());
}

BOOST_AUTO_TEST_CASE(python_fixtures_load_with_expected_values) {
  for (const auto& name : kTdFixtures) {
    TensorDict td = TensorDict::load_memmap(fixtures::python_written(name));
    BOOST_TEST(td.is_memmap());
    BOOST_TEST(td.is_locked());
    fixtures::check_described(describe(td), fixtures::read_json(fixtures::python_written(name + ".expected.json")), name);
  }
}

BOOST_AUTO_TEST_CASE(python_lazy_stack_fixture) {
  std::string dir = fixtures::python_written("f_lazy_stack");
  BOOST_TEST(is_lazy_stack_dir(dir));
  // TensorDict::load_memmap reads the class meta.json names (upstream), here the lazy stack
  BOOST_TEST(LazyStackedTensorDict(TensorDict::load_memmap(dir)).tensordicts().size() == 2u);
  LazyStackedTensorDict lazy = LazyStackedTensorDict::load_memmap(dir);
  BOOST_TEST(lazy.tensordicts().size() == 2u);
  BOOST_TEST(lazy.batch_size() == BatchSize({2}));
  fixtures::check_described(describe(lazy), fixtures::read_json(dir + ".expected.json"), "f_lazy_stack");
  BOOST_CHECK_THROW(lazy.contiguous(), Error);  // ragged x: [3] vs [5]
}

BOOST_AUTO_TEST_CASE(upstream_artifact_loads) {
  // test_load_custom_artifact: padded data files (17 and 6 bytes) and the old list form of NonTensorData
  TensorDict td = TensorDict::load_memmap(fixtures::shared_dir() + "/fixtures/upstream-artifact/mmap_example");
  BOOST_TEST(td.batch_size() == BatchSize({2, 1}));
  BOOST_TEST(td.get({"nested", "int64"}).equal(at::tensor({1, 2}, at::kLong).view({2, 1})));
  BOOST_TEST(td.get({"nested", "bfloat16"}).equal(at::ones({2, 1}, at::kBFloat16)));
  JsonValue s = td.get_non_tensor({"nested", "string"});
  BOOST_TEST((s == JsonValue("a string!") || s == JsonValue::array({"a string!"})), "got " << s.dump());
}

BOOST_AUTO_TEST_CASE(fixture_round_trips_are_bit_exact) {
  for (const auto& name : kTdFixtures) {
    BOOST_TEST_CONTEXT(name) {
      fixtures::TempDir tmp("rt-" + name);
      TensorDict td = TensorDict::load_memmap(fixtures::python_written(name));
      TensorDict saved = td.save(tmp.path + "/out");
      TensorDict back = TensorDict::load_memmap(tmp.path + "/out");
      check_same_data(td, back);
      BOOST_TEST(back.type_name() == td.type_name());
      fixtures::check_described(describe(back),
                                fixtures::read_json(fixtures::python_written(name + ".expected.json")), name);
      // data files are byte-identical to Python's (meta.json too, for the stdlib-json layout)
      auto want = tree_bytes(fixtures::python_written(name));
      auto got = tree_bytes(tmp.path + "/out");
      for (const auto& kv : want) {
        if (kv.first.find(".memmap") == std::string::npos) continue;
        BOOST_TEST_REQUIRE(got.count(kv.first) == 1u, "missing file " << kv.first);
        BOOST_TEST((got[kv.first] == kv.second), "file " << kv.first << " differs");
      }
    }
  }
  fixtures::TempDir tmp("rt-lazy");
  LazyStackedTensorDict lazy = LazyStackedTensorDict::load_memmap(fixtures::python_written("f_lazy_stack"));
  std::vector<TensorDict> members;
  for (const auto& m : lazy.tensordicts()) members.push_back(m.clone());
  LazyStackedTensorDict copy(members, lazy.stack_dim());
  copy.memmap_(tmp.path + "/lazy");
  LazyStackedTensorDict back = LazyStackedTensorDict::load_memmap(tmp.path + "/lazy");
  for (size_t i = 0; i < 2; ++i) check_same_data(lazy.tensordicts()[i], back.tensordicts()[i]);
}

BOOST_AUTO_TEST_CASE(a_zero_tensor_leaf_saves_as_zeros) {
  // a ZeroTensor (torch's lazy zeros: no bytes behind its data pointer) is written as its values
  fixtures::TempDir tmp("zerotensor");
  TensorDict td(Dict{{"z", at::_efficientzerotensor({3, 2})}, {"a", at::ones({3})}}, {3});
  td.memmap(tmp.path + "/td");
  TensorDict back = TensorDict::load_memmap(tmp.path + "/td");
  BOOST_TEST(at::equal(back.get("z"), at::zeros({3, 2})));
  BOOST_TEST(at::equal(back.get("a"), at::ones({3})));
}

BOOST_AUTO_TEST_CASE(saves_under_missing_directories_create_them) {
  // upstream's memmap_ / from_schema create the prefix with its parents (os.makedirs); the staged save
  // stages beside the prefix, so its parent is created first (the main job writes into a fresh directory)
  fixtures::TempDir tmp("parents");
  TensorDict td = zoo::plain({4, 3});
  TensorDict ref = td.clone();
  td.memmap_(tmp.path + "/a/b/c");
  check_same_data(TensorDict::load_memmap(tmp.path + "/a/b/c"), ref);
  Schema schema = {{NestedKey("x"), {{2}, at::kFloat}}};
  TensorDict buf = TensorDict::from_schema(schema, {5}, "memmap", MemmapOptions().prefix(tmp.path + "/d/e"));
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/d/e").get("x").equal(at::zeros({5, 2})));
  // a parent that cannot be created (a regular file on the way): BackendError naming it, nothing written
  { std::ofstream(tmp.path + "/file") << "x"; }
  BOOST_CHECK_EXCEPTION(zoo::plain({4, 3}).memmap_(tmp.path + "/file/sub/td"), BackendError,
                        [&](const BackendError& e) { return std::string(e.what()).find(tmp.path + "/file") != std::string::npos; });
  BOOST_TEST(!std::filesystem::exists(tmp.path + "/file/sub"));
}

BOOST_AUTO_TEST_CASE(memmap_in_place_locks_and_writes_through) {
  fixtures::TempDir tmp("inplace");
  TensorDict td = zoo::plain({4, 3});
  td.set({"sub", "x"}, at::arange(12, at::kFloat).view({4, 3, 1}));
  td.set("label", "cat");
  TensorDict ref = td.clone();
  at::Tensor before = td.get("a");
  td.memmap_(tmp.path);
  BOOST_TEST(td.is_memmap());
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.get_td("sub").is_memmap());
  BOOST_TEST(td.get("a").data_ptr() != before.data_ptr());
  BOOST_TEST(backends::mapped_filename(td.get("a")).value() == tmp.path + "/a.memmap");
  check_same_data(td, ref);
  BOOST_CHECK_THROW(td.set("new", at::zeros({4, 3})), LockedError);
  // in-place writes go to the files
  td.set_("a", at::full({4, 3, 5}, 3.5));
  td.index_put_({1}, TensorDict(Dict{{"c", at::full({3, 3}, 7, at::kLong)}}, {3}));
  TensorDict back = TensorDict::load_memmap(tmp.path);
  BOOST_TEST(back.get("a").eq(3.5).all().item<bool>());
  BOOST_TEST(back.get("c").index({1}).eq(7).all().item<bool>());
  BOOST_TEST(back.get_non_tensor("label") == JsonValue("cat"));
  // memmap_ again into the same prefix reuses the files
  td.memmap_(tmp.path);
  BOOST_TEST(backends::mapped_filename(td.get("a")).value() == tmp.path + "/a.memmap");
  // into another prefix needs copy_existing
  fixtures::TempDir other("inplace2");
  BOOST_CHECK_THROW(td.memmap_(other.path), ValueError);
  td.memmap_(other.path, MemmapOptions().copy_existing(true));
  BOOST_TEST(backends::mapped_filename(td.get("a")).value() == other.path + "/a.memmap");
}

BOOST_AUTO_TEST_CASE(memmap_new_td_and_parallel_threads) {
  fixtures::TempDir tmp("copy");
  TensorDict td = zoo::plain({50});
  td.set("sub", zoo::plain({50}, 7));
  td.set({"sub", "deeper"}, zoo::plain({50}, 11));
  TensorDict m = td.memmap(tmp.path, MemmapOptions().num_threads(3));
  BOOST_TEST(m.is_memmap());
  BOOST_TEST(!td.is_memmap());
  BOOST_TEST(!td.is_locked());
  check_same_data(m, td);
  // every level's meta.json (written in the leaves' parallel pass) is on disk: the save loads back whole
  check_same_data(TensorDict::load_memmap(tmp.path), td);
  TensorDict anon = td.memmap();
  BOOST_TEST(anon.is_memmap());
  BOOST_TEST(backends::mapping_of(anon.get("a"))->anonymous);
  check_same_data(anon, td);
}

BOOST_AUTO_TEST_CASE(memmap_like_preallocates_zeros) {
  fixtures::TempDir tmp("like");
  TensorDict src(Dict{{"big", at::zeros({}).expand({1000, 64})}, {"n", Dict{{"i", at::ones({1000}, at::kInt)}}}},
                 {1000});
  TensorDict like = src.memmap_like(tmp.path);
  BOOST_TEST(like.get("big").sizes() == at::IntArrayRef({1000, 64}));
  BOOST_TEST(like.get("big").stride(0) == 64);  // a full-size file, not an expanded view
  BOOST_TEST(like.get({"n", "i"}).eq(0).all().item<bool>());
  BOOST_TEST(fs::file_size(tmp.path + "/big.memmap") == 1000u * 64u * 4u);
  like.get("big").index_put_({3}, 1.0);
  BOOST_TEST(TensorDict::load_memmap(tmp.path).get("big").index({3}).eq(1).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(large_row_writes_land_whole_from_any_source) {
  // td[rows] = value copies blocks of 1 MiB and more in 256 KiB pieces (indexing.cpp, copy_in_pieces): sizes that
  // are no multiple of a piece, a source that is itself a memmap (page-aligned), stepped rows of 1.2 MB each
  fixtures::TempDir tmp("bigrows");
  const int64_t rows = 96, row = 33333;  // 3.2 MB in all, rows of an odd size
  at::Tensor values = at::randint(0, 255, {rows, row}, at::kByte);
  TensorDict src = TensorDict(Dict{{"x", values}}, {rows}).memmap(tmp.path + "/src");
  TensorDict dst = src.memmap_like(tmp.path + "/dst");
  dst.index_put_({Slice(0, 40)}, src.index({Slice(0, 40)}));                    // 1.33 MB from a memmap
  dst.index_put_({Slice(40, rows)}, TensorDict(Dict{{"x", values.index({Slice(40, rows)})}}, {rows - 40}));
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/dst").get("x").equal(values));
  at::Tensor wide = at::randint(0, 255, {6, 1200001}, at::kByte);
  TensorDict steps = TensorDict(Dict{{"w", at::zeros({6, 1200001}, at::kByte)}}, {6}).memmap(tmp.path + "/steps");
  steps.index_put_({Slice(0, 6, 2)}, TensorDict(Dict{{"w", wide.index({Slice(0, 6, 2)})}}, {3}));
  at::Tensor back = TensorDict::load_memmap(tmp.path + "/steps").get("w");
  BOOST_TEST(back.index({Slice(0, 6, 2)}).equal(wide.index({Slice(0, 6, 2)})));
  BOOST_TEST(back.index({Slice(1, 6, 2)}).eq(0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(large_row_writes_allocate_their_file_blocks_first) {
  // td[rows] = value into a memmap allocates the file blocks of a block of 1 MiB or more in one call before
  // copying it (backends' allocate_for_write): the rows written show allocated extents at once, never delayed
  // ones, and the rows not written stay holes
  fixtures::TempDir tmp("allocrows");
  constexpr int64_t kRow = 64 << 10;
  TensorDict td = TensorDict::from_schema({{"x", {{kRow}, at::kByte}}}, {64}, "memmap",
                                          MemmapOptions().prefix(tmp.path + "/d"));
  const std::string f = backends::mapped_filename(td.get("x")).value();
  at::Tensor rows = at::randint(1, 255, {32, kRow}, at::kByte);
  td.index_put_({Slice(16, 48)}, TensorDict(Dict{{"x", rows}}, {32}));  // 2 MiB: bytes [1, 3) MiB
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/d").get("x").index({Slice(16, 48)}).equal(rows));
  BOOST_TEST(td.get("x").index({Slice(0, 16)}).eq(0).all().item<bool>());
  const auto found = testutil::extents_to_check(f);
  if (!found) { BOOST_TEST_MESSAGE(testutil::kExtentsNotChecked); return; }
  const std::vector<testutil::Extent>& ext = *found;
  BOOST_TEST_REQUIRE(ext.size() == 1u);
  BOOST_TEST(ext[0].begin == 16 * kRow);
  BOOST_TEST(ext[0].end == 48 * kRow);
  BOOST_TEST(!ext[0].delalloc);  // without allocation ahead, the copy leaves delayed blocks
}

using testutil::resident_pages;

// prefault (the main job's output, faulted in while its dataset is synthesised): every page of every memmap leaf
// resident and mapped afterwards (none before: a fresh sparse file), the values as they were (zeros, then a row
// written between two prefaults kept), the byte count returned; leaves that are not file mappings are left alone
BOOST_AUTO_TEST_CASE(prefault_maps_every_page_of_the_memmap_leaves_and_keeps_their_values) {
  fixtures::TempDir tmp("prefault");
  TensorDict td = TensorDict::from_schema({{"x", {{1024}, at::kFloat}}, {NestedKey(std::vector<std::string>{"sub", "y"}), {{}, at::kLong}}},
                                          {256}, "memmap", MemmapOptions().prefix(tmp.path + "/td"));
  int64_t pages = 0;
  BOOST_TEST(resident_pages(td.get("x"), &pages) == 0);  // nothing touched yet (a fault would read ahead)
  BOOST_TEST(pages == 256);
  const int64_t bytes = 256 * 1024 * 4 + 256 * 8;
  BOOST_TEST(prefault(td) == bytes);
  BOOST_TEST(resident_pages(td.get("x"), &pages) == pages);
  BOOST_TEST(resident_pages(td.get({"sub", "y"}), &pages) == pages);
  at::Tensor want = at::zeros({256, 1024});
  BOOST_TEST(td.get("x").equal(want));
  td.index_put_({3}, TensorDict({{"x", at::full({1024}, 7.0f)}, {"sub", TensorDict({{"y", at::scalar_tensor(9, at::kLong)}}, {})}}, {}));
  BOOST_TEST(prefault(td) == bytes);  // again: the row written stays
  want[3] = 7.0f;
  BOOST_TEST(td.get("x").equal(want));
  BOOST_TEST(td.get({"sub", "y"}).sum().item<int64_t>() == 9);
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/td").get("x").equal(want));  // the file, not only the mapping
  BOOST_TEST(prefault(TensorDict({{"x", at::zeros({4, 2})}}, {4})) == 0);  // in memory: nothing to fault in
}

BOOST_AUTO_TEST_CASE(load_memmap_into_self_and_refresh) {
  fixtures::TempDir tmp("refresh");
  TensorDict td = zoo::plain({5});
  td.memmap_(tmp.path);
  TensorDict other = TensorDict::load_memmap(tmp.path);
  make_memmap(td, "extra", {5, 2}, at::kDouble);
  BOOST_TEST(td.get("extra").sizes() == at::IntArrayRef({5, 2}));
  BOOST_TEST(!other.contains("extra"));
  other.memmap_refresh_();
  BOOST_TEST(other.contains("extra"));
  td.get("extra").fill_(2.0);
  BOOST_TEST(other.get("extra").eq(2.0).all().item<bool>());  // same file, shared mapping
  BOOST_CHECK_THROW(make_memmap(td, "extra", {5}, at::kFloat), KeyError);
  BOOST_CHECK_THROW(make_memmap(td, "bad", {4}, at::kFloat), BatchSizeError);
  TensorDict fresh;
  fresh.load_memmap_(tmp.path);
  BOOST_TEST(fresh.is_memmap());
  BOOST_TEST(fresh.contains("extra"));
  BOOST_CHECK_THROW(TensorDict().memmap_refresh_(), ValueError);
  TensorDict plain;
  BOOST_CHECK_THROW(make_memmap(plain, "x", {}, at::kFloat), ValueError);
}

BOOST_AUTO_TEST_CASE(make_memmap_creates_missing_levels_in_plain_and_tensorclass_directories) {
  fixtures::TempDir tmp("levels");
  // a plain directory: the level's directory and meta.json, then the parent's meta.json
  TensorDict td = zoo::plain({5});
  td.memmap_(tmp.path + "/plain");
  make_memmap(td, {"lvl", "deeper", "v"}, {5, 2}, at::kLong);
  BOOST_TEST(td.get_td("lvl").is_memmap());
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/plain").get({"lvl", "deeper", "v"}).sizes() ==
             at::IntArrayRef({5, 2}));
  // a Python tensorclass record: the level goes into its _tensordict, and the record loads back with it
  fs::copy(fixtures::python_written("g_tensorclass"), tmp.path + "/tc", fs::copy_options::recursive);
  TensorDict tc = TensorDict::load_memmap(tmp.path + "/tc");
  const BatchSize bs = tc.batch_size();
  BatchSize shape = bs;
  shape.push_back(3);
  make_memmap(tc, {"added", "x"}, shape, at::kFloat);
  BOOST_TEST(fs::exists(tmp.path + "/tc/_tensordict/added/meta.json"));
  TensorDict back = TensorDict::load_memmap(tmp.path + "/tc");
  BOOST_TEST(back.type_name() == tc.type_name());
  BOOST_TEST(back.get({"added", "x"}).sizes() == at::IntArrayRef(shape));
  // names Python's meta.json uses for the TensorDict itself, and a level under a leaf: refused, nothing created
  BOOST_CHECK_THROW(make_memmap(td, {"shape", "x"}, {5}, at::kFloat), ValueError);
  BOOST_TEST(!fs::exists(tmp.path + "/plain/shape"));
  BOOST_CHECK_THROW(make_memmap(td, {"lvl", "deeper", "v", "w"}, {5}, at::kFloat), KeyError);
}

BOOST_AUTO_TEST_CASE(read_only_files_map_private) {
  fixtures::TempDir tmp("ro");
  TensorDict td = zoo::plain({3});
  td.memmap(tmp.path);
  TensorDict ro = TensorDict::load_memmap(tmp.path, LoadOptions().writable(false));
  ro.get("a").fill_(9.0);  // copy-on-write: works, never reaches the file
  BOOST_TEST(TensorDict::load_memmap(tmp.path).get("a").equal(td.get("a")));
}

BOOST_AUTO_TEST_CASE(reserved_keys_and_bad_files) {
  fixtures::TempDir tmp("bad");
  TensorDict td(Dict{{"shape", at::zeros({2})}}, {2});
  BOOST_CHECK_THROW(td.memmap(tmp.path + "/x"), ValueError);
  BOOST_CHECK_THROW(TensorDict::load_memmap(tmp.path + "/missing"), Error);
  // truncated leaf
  TensorDict ok = zoo::plain({4});
  ok.memmap(tmp.path + "/t");
  fs::resize_file(tmp.path + "/t/a.memmap", 10);
  BOOST_CHECK_EXCEPTION(TensorDict::load_memmap(tmp.path + "/t"), FormatError, [](const FormatError& e) {
    return std::string(e.what()).find("a.memmap") != std::string::npos;
  });
  // malformed meta.json
  ok.memmap(tmp.path + "/m");
  { std::ofstream(tmp.path + "/m/meta.json") << "{\"a\": {\"dtype\": "; }
  BOOST_CHECK_EXCEPTION(TensorDict::load_memmap(tmp.path + "/m"), FormatError, [](const FormatError& e) {
    return std::string(e.what()).find("meta.json") != std::string::npos;
  });
  // a leaf whose shape does not fit the batch
  ok.memmap(tmp.path + "/s");
  {
    std::string meta = fixtures::read_file(tmp.path + "/s/meta.json");
    auto pos = meta.find("\"shape\": [4]");
    BOOST_REQUIRE(pos != std::string::npos);
    meta.replace(pos, 12, "\"shape\": [5]");
    std::ofstream(tmp.path + "/s/meta.json") << meta;
  }
  BOOST_CHECK_THROW(TensorDict::load_memmap(tmp.path + "/s"), FormatError);
  // existsok=false refuses an existing save
  BOOST_CHECK_THROW(ok.memmap(tmp.path + "/t", MemmapOptions().existsok(false)), ValueError);
}

// ------------------------------------------------------------------------------------------ untrusted trees
namespace {
//! obs [4, 2] (ones) and sub/b [4] saved to `dir`
TensorDict save_small(const std::string& dir) {
  TensorDict td(BatchSize{4});
  td.set("obs", at::ones({4, 2}));
  td.set({"sub", "b"}, at::arange(4, at::kFloat));
  return td.save(dir);
}

template <class E>
void check_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    BOOST_ERROR("no exception thrown");
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) BOOST_TEST(msg.find(n) != std::string::npos, "'" << msg << "' lacks '" << n << "'");
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(load_refuses_a_leaf_symlinked_outside_and_leaves_the_target_alone) {
  fixtures::TempDir tmp("symlink-leaf");
  save_small(tmp.path + "/td");
  const std::string target = tmp.path + "/target.bin";  // stands for any file outside the tree
  const std::string original(32, 'T');                  // 4 x 2 float32
  { std::ofstream(target, std::ios::binary) << original; }
  fs::remove(tmp.path + "/td/obs.memmap");
  fs::create_symlink(target, tmp.path + "/td/obs.memmap");
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td"); },
                           {tmp.path + "/td/obs.memmap", "symlink"});
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td", LoadOptions().allow_missing(true)); },
                           {tmp.path + "/td/obs.memmap", "symlink"});
  BOOST_TEST(fixtures::read_file(target) == original);
  // followed on request (read-only here: a writable load would write into the target)
  TensorDict td = TensorDict::load_memmap(tmp.path + "/td", LoadOptions().follow_symlinks(true).writable(false));
  BOOST_TEST(td.get("obs").sizes() == at::IntArrayRef({4, 2}));
  td.get("obs").fill_(0.0f);
  BOOST_TEST(fixtures::read_file(target) == original);
}

BOOST_AUTO_TEST_CASE(load_refuses_symlinked_dirs_and_meta_json) {
  fixtures::TempDir tmp("symlink-dir");
  // a sub-directory moved outside the tree and symlinked back
  save_small(tmp.path + "/td");
  fs::rename(tmp.path + "/td/sub", tmp.path + "/sub-elsewhere");
  fs::create_directory_symlink(tmp.path + "/sub-elsewhere", tmp.path + "/td/sub");
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td"); }, {tmp.path + "/td/sub", "symlink"});
  TensorDict td = TensorDict::load_memmap(tmp.path + "/td", LoadOptions().follow_symlinks(true));
  BOOST_TEST(td.get({"sub", "b"}).equal(at::arange(4, at::kFloat)));
  // a symlinked meta.json (root and sub-directory)
  save_small(tmp.path + "/m");
  fs::rename(tmp.path + "/m/sub/meta.json", tmp.path + "/sub-meta.json");
  fs::create_symlink(tmp.path + "/sub-meta.json", tmp.path + "/m/sub/meta.json");
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/m"); }, {tmp.path + "/m/sub/meta.json", "symlink"});
  fs::rename(tmp.path + "/m/meta.json", tmp.path + "/root-meta.json");
  fs::create_symlink(tmp.path + "/root-meta.json", tmp.path + "/m/meta.json");
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/m"); }, {tmp.path + "/m/meta.json", "symlink"});
  BOOST_TEST(!is_lazy_stack_dir(tmp.path + "/m"));
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/m", LoadOptions().follow_symlinks(true)).contains({"sub", "b"}));
  // the prefix itself may be a symlink (the caller names it)
  save_small(tmp.path + "/plain");
  fs::create_directory_symlink(tmp.path + "/plain", tmp.path + "/plain-alias");
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/plain-alias").contains("obs"));
}

BOOST_AUTO_TEST_CASE(load_follows_an_inner_symlink_only_on_request) {
  fixtures::TempDir tmp("symlink-inner");
  save_small(tmp.path + "/td");
  fs::rename(tmp.path + "/td/obs.memmap", tmp.path + "/td/obs.data");
  fs::create_symlink("obs.data", tmp.path + "/td/obs.memmap");  // relative, inside the root
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td"); }, {tmp.path + "/td/obs.memmap", "symlink"});
  TensorDict td = TensorDict::load_memmap(tmp.path + "/td", LoadOptions().follow_symlinks(true));
  BOOST_TEST(td.get("obs").equal(at::ones({4, 2})));
  td.get("obs")[0].fill_(3.0f);  // writable: through the link into the file inside the root
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/td", LoadOptions().follow_symlinks(true)).get("obs")[0].eq(3.0f).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(load_refuses_a_fifo_leaf_without_blocking) {
  // nothing opens the fifos' write end: a loader that opened them blocking would hang here
  fixtures::TempDir tmp("fifo");
  save_small(tmp.path + "/td");
  fs::remove(tmp.path + "/td/sub/b.memmap");
  BOOST_REQUIRE(::mkfifo((tmp.path + "/td/sub/b.memmap").c_str(), 0600) == 0);
  for (const LoadOptions& o : {LoadOptions(), LoadOptions().follow_symlinks(true).allow_missing(true),
                               LoadOptions().writable(false)}) {
    check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td", o); },
                             {tmp.path + "/td/sub/b.memmap", "not a regular file"});
  }
  // a fifo meta.json: not a lazy stack, and refused by load_memmap
  fs::create_directories(tmp.path + "/m");
  BOOST_REQUIRE(::mkfifo((tmp.path + "/m/meta.json").c_str(), 0600) == 0);
  BOOST_TEST(!is_lazy_stack_dir(tmp.path + "/m"));
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/m"); }, {tmp.path + "/m/meta.json", "not a regular file"});
  check_error<FormatError>([&] { LazyStackedTensorDict::load_memmap(tmp.path + "/m"); },
                           {tmp.path + "/m/meta.json", "not a regular file"});
}

BOOST_AUTO_TEST_CASE(load_refuses_a_missing_leaf_file_unless_allowed) {
  fixtures::TempDir tmp("missing");
  save_small(tmp.path + "/td");
  fs::remove(tmp.path + "/td/sub/b.memmap");
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/td"); },
                           {tmp.path + "/td/sub/b.memmap", "leaf 'b'", "missing"});
  TensorDict into;
  check_error<FormatError>([&] { into.load_memmap_(tmp.path + "/td"); }, {"leaf 'b'", "missing"});
  std::vector<std::string> warnings;
  TensorDict td = TensorDict::load_memmap(
      tmp.path + "/td",
      LoadOptions().allow_missing(true).on_warning([&](const std::string& w) { warnings.push_back(w); }));
  BOOST_TEST(td.contains("obs"));
  BOOST_TEST(td.contains("sub"));
  BOOST_TEST(!td.contains({"sub", "b"}));
  BOOST_TEST_REQUIRE(warnings.size() == 1u);
  BOOST_TEST(warnings[0].find("leaf 'b'") != std::string::npos, warnings[0]);
  BOOST_TEST(warnings[0].find(tmp.path + "/td/sub") != std::string::npos, warnings[0]);
  // an empty leaf needs no file (not a warning)
  TensorDict empty(BatchSize{0});
  empty.set("e", at::zeros({0, 3}));
  empty.save(tmp.path + "/empty");
  warnings.clear();
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/empty", LoadOptions().on_warning([&](const std::string& w) {
               warnings.push_back(w);
             })).contains("e"));
  BOOST_TEST(warnings.empty());
}

BOOST_AUTO_TEST_CASE(lazy_stack_members_are_checked_too) {
  fixtures::TempDir tmp("lazy-safety");
  TensorDict a(BatchSize{2}), b(BatchSize{2});
  a.set("x", at::zeros({2, 3}));
  b.set("x", at::ones({2, 3}));
  LazyStackedTensorDict({a, b}, 0).memmap_(tmp.path + "/ls");
  fs::remove(tmp.path + "/ls/1/x.memmap");
  check_error<FormatError>([&] { LazyStackedTensorDict::load_memmap(tmp.path + "/ls"); },
                           {tmp.path + "/ls/1/x.memmap", "leaf 'x'", "missing"});
  std::vector<std::string> warnings;
  LazyStackedTensorDict lazy = LazyStackedTensorDict::load_memmap(
      tmp.path + "/ls",
      LoadOptions().allow_missing(true).on_warning([&](const std::string& w) { warnings.push_back(w); }));
  BOOST_TEST(lazy.tensordicts()[0].contains("x"));
  BOOST_TEST(!lazy.tensordicts()[1].contains("x"));
  BOOST_TEST(warnings.size() == 1u);
  // a member directory symlinked from elsewhere
  fs::rename(tmp.path + "/ls/1", tmp.path + "/member");
  fs::create_directory_symlink(tmp.path + "/member", tmp.path + "/ls/1");
  check_error<FormatError>([&] { LazyStackedTensorDict::load_memmap(tmp.path + "/ls"); }, {tmp.path + "/ls/1", "symlink"});
  // inside a TensorDict
  TensorDict outer(BatchSize{});
  outer.save(tmp.path + "/outer");
  fs::rename(tmp.path + "/ls", tmp.path + "/outer/ls");
  {
    std::string meta = fixtures::read_file(tmp.path + "/outer/meta.json");
    meta.replace(0, 1, "{\"ls\": {\"type\": \"LazyStackedTensorDict\"}, ");
    std::ofstream(tmp.path + "/outer/meta.json") << meta;
  }
  check_error<FormatError>([&] { TensorDict::load_memmap(tmp.path + "/outer"); }, {tmp.path + "/outer/ls/1", "symlink"});
}

BOOST_AUTO_TEST_CASE(memmap_and_shared_are_exclusive) {
  TensorDict td = zoo::plain({3});
  td.memmap_();
  BOOST_CHECK_THROW(td.share_memory_(), ValueError);
  TensorDict sh = zoo::plain({3});
  sh.share_memory_();
  BOOST_CHECK_THROW(sh.memmap_(), ValueError);
}

BOOST_AUTO_TEST_CASE(unlock_clears_memmap_flag) {
  fixtures::TempDir tmp("flag");
  TensorDict td = zoo::plain({3});
  td.memmap_(tmp.path);
  td.unlock_();
  BOOST_TEST(!td.is_memmap());
}

BOOST_AUTO_TEST_CASE(shallow_copy_keeps_flags_and_leaves_not_structure) {
  fixtures::TempDir tmp("shallow");
  TensorDict td(BatchSize{4});
  td.set("a", at::zeros({4, 2}));
  td.set({"sub", "b"}, at::ones({4}));
  td.memmap_(tmp.path + "/td");
  TensorDict c = td.shallow_copy();
  BOOST_TEST(c.is_memmap());
  BOOST_TEST(!c.is_locked());
  BOOST_TEST(td.is_locked());
  BOOST_TEST(memmap_prefix(c) == memmap_prefix(td));
  BOOST_TEST(c.get("a").data_ptr() == td.get("a").data_ptr());
  BOOST_TEST(!c.get_entry("sub").tensordict().is_same(td.get_entry("sub").tensordict()));
  make_memmap(c, {"sub", "new"}, {4, 3}, at::kFloat);  // structure: only the copy
  BOOST_TEST(c.contains({"sub", "new"}));
  BOOST_TEST(!td.contains({"sub", "new"}));
  c.get("a")[1].fill_(5.0);  // leaves: shared
  BOOST_TEST(td.get("a")[1].equal(at::full({2}, 5.0)));
  c.lock_();
  BOOST_TEST(c.is_memmap());  // lock_ keeps the flag (unlock_ would clear it)
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/td").contains({"sub", "new"}));
}

// lazy stacks save through the TensorDict handle (memmap, memmap_, memmap_like, save) in upstream's layout, as
// one staged save, and TensorDict::load_memmap reads the stack back (upstream's load_memmap reads the class
// meta.json names)
namespace {
//! a ragged stack of n members: member i holds "x" of [2, i + 1] filled with v + i and "sub"."y" of [2]
LazyStackedTensorDict ragged_stack(int n, float v) {
  std::vector<TensorDict> members;
  for (int i = 0; i < n; ++i) {
    TensorDict m(Dict{{"x", at::full({2, i + 1}, v + static_cast<float>(i))}}, {2});
    m.set("sub", TensorDict(Dict{{"y", at::full({2}, v)}}, {2}));
    members.push_back(m);
  }
  return LazyStackedTensorDict(members, 0);
}

//! the members' "x" of the stack saved in `dir`, loaded through TensorDict::load_memmap
std::vector<at::Tensor> saved_xs(const std::string& dir) {
  TensorDict back = TensorDict::load_memmap(dir);
  BOOST_TEST_REQUIRE(LazyStackedTensorDict::is_lazy_stack(back));
  return LazyStackedTensorDict(back).get_list("x");
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_lazy_stack_saves_through_the_tensordict_handle) {
  fixtures::TempDir tmp("lazy-handle");
  TensorDict stack = ragged_stack(3, 1.f);  // the handle: the node decides how it saves
  // memmap: a copy in the stack layout; the stack itself stays in memory and unlocked
  TensorDict saved = stack.memmap(tmp.path + "/copy");
  BOOST_TEST(LazyStackedTensorDict::is_lazy_stack(saved));
  BOOST_TEST(saved.is_memmap());
  BOOST_TEST(saved.is_locked());
  BOOST_TEST(!stack.is_memmap());
  BOOST_TEST(!stack.is_locked());
  BOOST_TEST(is_lazy_stack_dir(tmp.path + "/copy"));
  std::vector<at::Tensor> xs = saved_xs(tmp.path + "/copy");
  BOOST_TEST_REQUIRE(xs.size() == 3u);
  for (int i = 0; i < 3; ++i) BOOST_TEST(xs[i].equal(at::full({2, i + 1}, 1.f + static_cast<float>(i))));
  TensorDict back = TensorDict::load_memmap(tmp.path + "/copy");
  BOOST_TEST(back.get({"sub", "y"}).equal(at::ones({3, 2})));
  BOOST_TEST(back.batch_size() == BatchSize({3, 2}));
  // save: the same
  stack.save(tmp.path + "/saved");
  BOOST_TEST(saved_xs(tmp.path + "/saved").size() == 3u);
  // memmap_like: zeros of the members' shapes
  TensorDict like = stack.memmap_like(tmp.path + "/like");
  std::vector<at::Tensor> zs = saved_xs(tmp.path + "/like");
  BOOST_TEST_REQUIRE(zs.size() == 3u);
  for (int i = 0; i < 3; ++i) BOOST_TEST(zs[i].equal(at::zeros({2, i + 1})));
  BOOST_TEST(like.is_locked());
  // memmap_: the members' own leaves become the files; the stack is locked
  stack.memmap_(tmp.path + "/inplace");
  BOOST_TEST(stack.is_memmap());
  BOOST_TEST(stack.is_locked());
  const TensorDict& m1 = LazyStackedTensorDict(stack).member(1);
  BOOST_TEST(m1.is_memmap());
  BOOST_TEST(backends::mapping_of(m1.get("x")).has_value());
  BOOST_TEST(saved_xs(tmp.path + "/inplace")[2].equal(at::full({2, 3}, 3.f)));
  // anonymous memory: no files, members mapped
  TensorDict anon = ragged_stack(2, 5.f);
  anon.memmap_();
  BOOST_TEST(anon.is_memmap());
  BOOST_TEST(LazyStackedTensorDict(anon).member(0).get("x").equal(at::full({2, 1}, 5.f)));
  // load_memmap_ into a TensorDict cannot take a stack's members: a typed error, the TensorDict untouched
  TensorDict target(Dict{{"k", at::ones({2})}}, {2});
  check_error<TypeError>([&] { target.load_memmap_(tmp.path + "/copy"); }, {"LazyStackedTensorDict"});
  BOOST_TEST(target.get("k").equal(at::ones({2})));
}

BOOST_AUTO_TEST_CASE(a_lazy_stack_saved_over_a_longer_one_loads_its_own_members) {
  // a load reads members 0, 1, ... while their directories exist: a save over a longer stack's save must not
  // carry the old last members into the new one (at the root, and for a stack inside a TensorDict)
  fixtures::TempDir tmp("lazy-over");
  for (int threads : {0, 2}) {
    const std::string dir = tmp.path + "/root" + std::to_string(threads);
    ragged_stack(5, 1.f).memmap(dir);
    TensorDict old = TensorDict::load_memmap(dir);  // kept open: the old save stays readable
    LazyStackedTensorDict(ragged_stack(3, 10.f)).memmap_(dir, MemmapOptions().num_threads(threads));
    std::vector<at::Tensor> xs = saved_xs(dir);
    BOOST_TEST(xs.size() == 3u, threads << " threads: " << xs.size() << " members");
    BOOST_TEST(xs[0].equal(at::full({2, 1}, 10.f)));
    BOOST_TEST(LazyStackedTensorDict(old).get_list("x")[4].equal(at::full({2, 5}, 5.f)));
    BOOST_TEST(!fs::exists(dir + "/3"));
    // inside a TensorDict (its own stack directory below the prefix), a user's file beside the members kept
    const std::string outer = tmp.path + "/outer" + std::to_string(threads);
    TensorDict a(BatchSize{5});
    a.set("s", ragged_stack(5, 1.f));
    a.memmap(outer);
    std::ofstream(outer + "/s/notes.txt") << "mine";
    TensorDict b(BatchSize{3});
    b.set("s", ragged_stack(3, 10.f));
    b.memmap(outer, MemmapOptions().num_threads(threads));
    TensorDict back = TensorDict::load_memmap(outer);
    BOOST_TEST(back.get_td("s").batch_size() == BatchSize({3, 2}));
    BOOST_TEST(!fs::exists(outer + "/s/3"));
    BOOST_TEST(fixtures::read_file(outer + "/s/notes.txt") == "mine");
  }
}

BOOST_AUTO_TEST_CASE(a_lazy_stack_save_refuses_what_it_cannot_write_before_writing) {
  fixtures::TempDir tmp("lazy-refused");
  // a member that is itself a lazy stack has no dense level: memmap_ refuses, memmap writes its dense form
  TensorDict inner0 = ragged_stack(2, 1.f).get_td("sub");
  TensorDict inner1 = ragged_stack(2, 2.f).get_td("sub");
  TensorDict nested = lazy_stack({inner0, inner1}, 0);
  check_error<NotImplementedError>([&] { nested.memmap_(tmp.path + "/n"); }, {"member 0", "LazyStackedTensorDict"});
  BOOST_TEST(!fs::exists(tmp.path + "/n"));
  BOOST_TEST(!nested.is_locked());
  TensorDict copy = nested.memmap(tmp.path + "/n");
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/n").get("y").equal(at::stack({at::ones({2, 2}), at::full({2, 2}, 2.f)})));
  // existsok=false over a saved prefix
  check_error<ValueError>([&] { ragged_stack(2, 1.f).memmap(tmp.path + "/n", MemmapOptions().existsok(false)); },
                          {"existsok"});
  BOOST_TEST(TensorDict::load_memmap(tmp.path + "/n").get("y").equal(at::stack({at::ones({2, 2}), at::full({2, 2}, 2.f)})));
}

BOOST_AUTO_TEST_SUITE_END()
