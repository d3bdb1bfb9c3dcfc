// PersistentTensorDict: HDF5 files as TensorDicts behind their store actor (api/persistent.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include <filesystem>

#include <boost/test/unit_test.hpp>

#include "api/remote_fixtures.hpp"
#include "engine/fixtures.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using namespace at::indexing;
using fixtures::TempDir;

using remote_fixtures::indices;
using remote_fixtures::same;
using remote_fixtures::sample;

BOOST_AUTO_TEST_SUITE(persistent)

BOOST_AUTO_TEST_CASE(python_fixture_loads_with_inferred_batch_sizes) {
  const std::string file = fixtures::python_written("i_h5.h5");
  JsonValue want = fixtures::read_json(fixtures::python_written("i_h5.expected.json"));
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
  BOOST_TEST(h5.type_name() == "PersistentTensorDict");
  BOOST_TEST(h5.batch_size() == BatchSize({3}));
  BOOST_TEST(h5.get_td("sub").batch_size() == BatchSize({3}));
  TensorDict dense = h5.to_tensordict();
  BOOST_TEST((dense.node()->dense_node() != nullptr));
  for (const auto& leaf : want.find("leaves")->as_array()) {
    NestedKey key;
    std::vector<std::string> parts;
    for (const auto& p : leaf.find("key")->as_array()) parts.push_back(p.as_string());
    key = NestedKey(parts);
    at::Tensor t = dense.get(key);
    BOOST_TEST(backends::dtype_to_string(t.scalar_type()) == leaf.find("dtype")->as_string());
    std::vector<int64_t> shape;
    for (const auto& s : leaf.find("shape")->as_array()) shape.push_back(s.as_int());
    BOOST_TEST(BatchSize(t.sizes().begin(), t.sizes().end()) == shape);
    at::Tensor flat = t.reshape({-1}).to(at::kDouble);
    const auto& values = leaf.find("values")->as_array();
    BOOST_REQUIRE(static_cast<int64_t>(values.size()) == flat.numel());
    for (size_t i = 0; i < values.size(); ++i) {
      double v = values[i].is_bool() ? (values[i].as_bool() ? 1.0 : 0.0) : values[i].as_double();
      BOOST_TEST(flat[static_cast<int64_t>(i)].item<double>() == v, key.repr() << "[" << i << "]");
    }
  }
}

// a memmap save of a TensorDict holding an HDF5 TensorDict saves the file's values, as upstream's memmap reads
// the h5 leaves; the saved tree reads back equal
BOOST_AUTO_TEST_CASE(memmap_of_a_tree_holding_a_file_node_saves_its_values) {
  TempDir dir("persistent");
  const TensorDict ref = sample(16, 1);
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/a.h5");
  TensorDict outer(BatchSize{16});
  outer.set("x", at::arange(16, at::kFloat));
  outer.set("file", h5);
  outer.memmap(dir.path + "/mm");
  TensorDict back = TensorDict::load_memmap(dir.path + "/mm");
  BOOST_TEST(back.get("x").equal(at::arange(16, at::kFloat)));
  BOOST_TEST(same(back.get_td("file").to_tensordict(), ref));
}

BOOST_AUTO_TEST_CASE(index_reads_match_the_dense_tensordict) {
  TempDir dir("persistent");
  TensorDict ref = sample(16, 1);
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/a.h5");
  BOOST_TEST(same(h5.to_tensordict(), ref));
  for (const auto& idx : indices(16)) {
    TensorDict got = h5.index(idx).to_tensordict();
    BOOST_TEST(same(got, ref.index(idx)), "index " << index_repr(idx));
    // a view of a view composes without I/O and reads the same as the dense result
    if (got.batch_size().size() >= 1 && got.batch_size()[0] >= 2) {
      BOOST_TEST(same(h5.index(idx).index({Slice(None, None, -1 + 2)}).index({1}).to_tensordict(),
                      ref.index(idx).index({1})));
    }
  }
  BOOST_TEST(h5.get("obs").equal(ref.get("obs")));
  BOOST_TEST(h5.index({3}).get({"sub", "x"}).equal(ref.get({"sub", "x"})[3]));
}

BOOST_AUTO_TEST_CASE(one_request_per_user_call) {
  TempDir dir("persistent");
  TensorDict ref = sample(64, 2);
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/a.h5");
  const int64_t before = h5.store_stats().calls;
  TensorDict v = h5.index({at::tensor({40, 3, 17}, at::kLong)});  // no I/O
  TensorDict w = v.index({Slice(0, 2)});
  BOOST_TEST(w.batch_size() == BatchSize({2}));
  BOOST_TEST(h5.store_stats().calls == before);
  // every leaf (obs, idx, flag, sub.x) in one read request
  BOOST_TEST(same(w.to_tensordict(), ref.index({at::tensor({40, 3}, at::kLong)})));
  BOOST_TEST(h5.store_stats().calls == before + 1);
  // one write request for a row of every leaf (in order rows: no read first)
  h5.index_put_({Slice(5, 9)}, ref.index({Slice(0, 4)}));
  BOOST_TEST(h5.store_stats().calls == before + 2);
}

BOOST_AUTO_TEST_CASE(index_writes_land_in_the_file) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/w.h5";
  TensorDict ref = sample(16, 3);
  {
    PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, file);
    int i = 0;
    for (const auto& idx : indices(16)) {
      TensorDict rows = ref.index(idx).clone();
      rows.apply_([&](const at::Tensor& t) { return t.dtype() == at::kBool ? t.logical_not() : t + (++i); });
      h5.index_put_(idx, rows);
      ref.index_put_(idx, rows);
      BOOST_TEST(same(h5.to_tensordict(), ref), "after writing index " << index_repr(idx));
    }
    // through a view, a scalar and a tensor broadcast to the rows
    TensorDict view = h5.index({Slice(4, 8)});
    // (a mask: a scalar through an index list needs every leaf's dtype, as upstream's index_put_)
    const at::Tensor rows_3_0 = at::tensor({1, 0, 0, 1}, at::kLong).to(at::kBool);
    view.index_put_({rows_3_0}, at::Scalar(0.5));
    ref.index({Slice(4, 8)}).index_put_({rows_3_0}, at::Scalar(0.5));
    BOOST_CHECK_THROW(view.index_put_({at::tensor({3, 0}, at::kLong)}, at::Scalar(0.5)), RuntimeError);
    view.set_("idx", at::full({4}, 9, at::kLong));
    ref.index({Slice(4, 8)}).set_("idx", at::full({4}, 9, at::kLong));
    BOOST_TEST(same(h5.to_tensordict(), ref));
    h5.close();
  }
  PersistentTensorDict again = PersistentTensorDict::from_h5(file);
  BOOST_TEST(same(again.to_tensordict(), ref));
}

BOOST_AUTO_TEST_CASE(flat_row_writes_land_like_dense_ones) {
  // a flat value of existing tensor keys at rows in order goes the short way (one row list for every leaf);
  // anything else (broadcasting, new keys, reordered rows, nested values) the general one: same results
  TempDir dir("persistent");
  at::manual_seed(5);
  TensorDict ref({{"obs", at::randn({16, 4})}, {"idx", at::arange(16)}, {"flag", at::arange(16).remainder(3).eq(0)}},
                 {16});
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/flat.h5");
  auto both = [&](const Index& idx, const TensorDict& value, const std::string& what) {
    h5.index_put_(idx, value);
    ref.index_put_(idx, value);
    BOOST_TEST(same(h5.to_tensordict(), ref), what);
  };
  int i = 0;
  for (const auto& idx : remote_fixtures::indices(16)) {
    TensorDict rows = ref.index(idx).clone();
    rows.apply_([&](const at::Tensor& t) { return t.dtype() == at::kBool ? t.logical_not() : t + (++i); });
    both(idx, rows, "index " + index_repr(idx));
  }
  // a flat write of every leaf at rows in order is one request to the store
  {
    const int64_t before = h5.store_stats().calls;
    h5.index_put_({Slice(1, 4)}, ref.index({Slice(5, 8)}).clone());
    ref.index_put_({Slice(1, 4)}, ref.index({Slice(5, 8)}).clone());
    BOOST_TEST(h5.store_stats().calls == before + 1);
    BOOST_TEST(same(h5.to_tensordict(), ref), "rows 1..3");
  }
  // values to convert (dtype, requires_grad), to broadcast (feature dims), a subset of the keys
  both({Slice(2, 5)}, TensorDict({{"obs", at::full({3, 4}, 1.5, at::kDouble)}, {"idx", at::full({3}, 7.0)}}, {3}),
       "dtypes converted");
  both({7}, TensorDict({{"obs", at::randn({4}).requires_grad_()}}, {}), "a row with requires_grad");
  both({Slice(5, 7)}, TensorDict({{"obs", at::randn({2, 1})}}, {2}), "broadcast feature dims");
  // a new key among existing ones: created zero-filled at the full batch, then written
  both({Slice(0, 3)}, TensorDict({{"obs", at::randn({3, 4})}, {"fresh", at::ones({3, 2})}}, {3}), "a new key");
  // through a view: the view's index composed with the write's
  TensorDict view = h5.index({Slice(4, 12)});
  TensorDict value({{"idx", at::full({2}, -3, at::kLong)}, {"flag", at::ones({2}, at::kBool)}}, {2});
  view.index_put_({Slice(1, 3)}, value);
  ref.index({Slice(4, 12)}).index_put_({Slice(1, 3)}, value);
  BOOST_TEST(same(h5.to_tensordict(), ref), "through a view");
  // a value that does not fit: the same error as a dense TensorDict's, nothing written
  const TensorDict before = h5.to_tensordict();
  BOOST_CHECK_THROW(h5.index_put_({Slice(0, 3)}, TensorDict({{"obs", at::randn({3, 5})}}, {3})), RuntimeError);
  BOOST_TEST(same(h5.to_tensordict(), before));
  h5.close();
}

BOOST_AUTO_TEST_CASE(new_keys_nested_groups_and_non_tensors) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/n.h5";
  TensorDict ref({{"a", at::arange(12).reshape({4, 3})}}, {4});
  ref.set("name", Entry(JsonValue("a string!")));
  TensorDict deeper({{"z", at::ones({4, 2, 5})}}, {4, 2});
  ref.set("deeper", deeper);
  {
    PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, file, H5Options().mode("w"));
    h5.set({"new", "leaf"}, at::zeros({4, 7}));
    h5.index({1}).set_({"new", "leaf"}, at::ones({7}));
    BOOST_TEST(h5.get({"new", "leaf"})[1].eq(1).all().item<bool>());
    BOOST_TEST(h5.get_non_tensor("name").as_string() == "a string!");
    h5.del("a");
    BOOST_TEST(!h5.contains("a"));
  }
  // batch sizes inferred again on open as upstream's from_h5: [4] at the root (the common leading dims of
  // its datasets and groups), [4, 2, 5] for the deeper group (the whole shape of its only dataset)
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
  BOOST_TEST(h5.batch_size() == BatchSize({4}));
  BOOST_TEST(h5.get_td("deeper").batch_size() == BatchSize({4, 2, 5}));
  BOOST_TEST(h5.index({Slice(1, 3)}).get({"deeper", "z"}).sizes() == at::IntArrayRef({2, 2, 5}));
  // a given batch size holds for every group, as upstream's PersistentTensorDict(batch_size=...)
  h5.close();
  PersistentTensorDict given(file, {4}, "r");
  BOOST_TEST(given.get_td("deeper").batch_size() == BatchSize({4}));
  BOOST_TEST(given.get_non_tensor("name").as_string() == "a string!");
}

// set over an existing key with a value of another shape or dtype replaces the dataset: the new one is written under
// a staging name and moved over the old one when complete, so a value the file refuses part-way (bfloat16, which
// HDF5 cannot hold, here as a leaf of a sub-TensorDict after one it takes) leaves the old key as it was
BOOST_AUTO_TEST_CASE(a_refused_replacement_leaves_the_old_key) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/replace.h5";
  TensorDict ref({{"obs", at::arange(4, at::kFloat)}}, {4});
  ref.set("sub", TensorDict({{"x", at::full({4, 2}, 3.f)}}, {4}));
  {
    PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, file, H5Options().mode("w"));
    BOOST_CHECK_THROW(h5.set("obs", at::zeros({4}, at::kBFloat16)), TypeError);
    TensorDict bad({{"x", at::zeros({4, 3})}, {"y", at::zeros({4}, at::kBFloat16)}}, {4});
    BOOST_CHECK_THROW(h5.set("sub", bad), TypeError);
    BOOST_TEST(h5.get("obs").equal(at::arange(4, at::kFloat)));
    BOOST_TEST(h5.get({"sub", "x"}).equal(at::full({4, 2}, 3.f)));
    BOOST_TEST(h5.keys(KeysOptions().include_nested(true)).size() == 3u);
    // set_ writes in place as a dense leaf's copy_: another shape is refused (it replaced the dataset), a value
    // that broadcasts is broadcast and converted to the dataset's dtype
    BOOST_CHECK_THROW(h5.set_("obs", at::zeros({4, 7})), BatchSizeError);
    BOOST_CHECK_THROW(h5.set_("obs", TensorDict({{"q", at::zeros({4})}}, {4})), TypeError);
    h5.set_("obs", at::full({1}, 2.0, at::kDouble));
    BOOST_TEST(h5.get("obs").equal(at::full({4}, 2.f)));
    h5.set_("obs", at::arange(4, at::kFloat));
    // a replacement the file takes lands whole
    h5.set("obs", at::ones({4, 2}, at::kDouble));
    h5.set("sub", TensorDict({{"z", at::ones({4})}}, {4}));
  }
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
  BOOST_TEST(h5.get("obs").equal(at::ones({4, 2}, at::kDouble)));
  BOOST_TEST(h5.get({"sub", "z"}).equal(at::ones({4})));
  BOOST_TEST(h5.keys(KeysOptions().include_nested(true)).size() == 3u);  // obs, sub, sub.z: nothing staged left
}

// td[idx] = value on a file checks what the file would refuse before it makes a key or writes a row: a value that
// does not broadcast to its region, a non-tensor written at a selection of rows (HDF5 holds one value per
// dataset). The new key of the same value is not made, the existing rows keep their values
BOOST_AUTO_TEST_CASE(a_refused_indexed_write_makes_no_key_and_writes_no_row) {
  TempDir dir("persistent");
  TensorDict ref({{"obs", at::zeros({4, 2})}}, {4});
  ref.set_non_tensor("s", JsonValue("all"));
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/idx.h5", H5Options().mode("w"));
  TensorDict wide({{"obs", at::ones({3})}, {"newk", at::ones({3})}}, {});
  BOOST_CHECK_THROW(h5.index_put_({1}, wide), RuntimeError);
  TensorDict with_text({{"obs", at::ones({2})}, {"newk", at::ones({3})}}, {});
  with_text.set_non_tensor("s", JsonValue("one"));
  BOOST_CHECK_THROW(h5.index_put_({1}, with_text), NotImplementedError);
  BOOST_TEST(!h5.contains("newk"));
  BOOST_TEST(h5.get("obs").equal(at::zeros({4, 2})));
  BOOST_TEST(h5.get_non_tensor("s").as_string() == "all");
  // what the file takes lands, the new key made at the full batch size
  TensorDict fits({{"obs", at::ones({2})}, {"newk", at::ones({3})}}, {});
  h5.index_put_({1}, fits);
  BOOST_TEST(h5.get("obs")[1].equal(at::ones({2})));
  BOOST_TEST(h5.get("newk").sizes().vec() == std::vector<int64_t>({4, 3}));
}

BOOST_AUTO_TEST_CASE(from_schema_creates_datasets_without_writing) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/s.h5";
  Schema schema = {{NestedKey("obs"), {{1024}, at::kFloat}}, {NestedKey({"next", "reward"}), {{}, at::kFloat}}};
  TensorDict buf = TensorDict::from_schema(schema, {65536}, "h5", H5Options().filename(file));  // 256 MiB of obs
  BOOST_TEST(buf.type_name() == "PersistentTensorDict");
  BOOST_TEST(buf.get({"next", "reward"}).sizes() == at::IntArrayRef({65536}));
  BOOST_TEST(buf.index({at::tensor({70, 65535}, at::kLong)}).get("obs").eq(0).all().item<bool>());
  struct stat st {};
  BOOST_REQUIRE(::stat(file.c_str(), &st) == 0);
  BOOST_TEST(static_cast<int64_t>(st.st_blocks) * 512 < (int64_t(1) << 20), "bytes on disk: " << st.st_blocks * 512);
  buf.index_put_({100}, TensorDict({{"obs", at::ones({1024})}, {"next", TensorDict({{"reward", at::ones({})}}, {})}}, {}));
  BOOST_TEST(buf.get("obs")[100].eq(1).all().item<bool>());
  BOOST_TEST(buf.get({"next", "reward"})[100].item<float>() == 1.0f);
  BOOST_TEST(buf.get({"next", "reward"}).sum().item<float>() == 1.0f);
}

BOOST_AUTO_TEST_CASE(closed_file_views_fail_with_a_typed_error) {
  TempDir dir("persistent");
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(sample(8), dir.path + "/c.h5");
  TensorDict view = h5.index({Slice(2, 4)});
  h5.close();
  BOOST_CHECK_THROW(view.get("obs"), BackendError);
  BOOST_CHECK_THROW(h5.to_tensordict(), BackendError);
  BOOST_CHECK_THROW(h5.index_put_({0}, at::Scalar(1)), BackendError);
  h5.close();  // twice: no-op
}

BOOST_AUTO_TEST_CASE(read_only_file_refuses_writes_and_keeps_its_data) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/r.h5";
  TensorDict ref = sample(8, 4);
  PersistentTensorDict::from_dict(ref, file).close();
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file, "r");
  BOOST_CHECK_THROW(h5.index_put_({1}, at::Scalar(3)), Error);
  BOOST_CHECK_THROW(h5.set("new", at::zeros({8})), Error);
  BOOST_CHECK_THROW(h5.set_("obs", at::zeros({8, 4})), Error);
  BOOST_TEST(same(h5.to_tensordict(), ref));
}

BOOST_AUTO_TEST_CASE(bad_files_give_clear_errors) {
  TempDir dir("persistent");
  BOOST_CHECK_THROW(PersistentTensorDict::from_h5(dir.path + "/missing.h5"), BackendError);
  BOOST_CHECK_THROW(PersistentTensorDict::from_h5(dir.path), BackendError);  // a directory
  const std::string file = dir.path + "/t.h5";
  PersistentTensorDict::from_dict(sample(8), file).close();
  // truncated copies
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t cut : {size_t(0), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
    const std::string bad = dir.path + "/cut" + std::to_string(cut) + ".h5";
    std::ofstream(bad, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    bool clear = false;
    try {
      TensorDict t = PersistentTensorDict::from_h5(bad);
      t.to_tensordict();
    } catch (const FormatError& e) {
      clear = std::string(e.what()).find(bad) != std::string::npos;
    } catch (const BackendError& e) {
      clear = std::string(e.what()).find(bad) != std::string::npos;
    }
    BOOST_TEST(clear, "cut at " << cut);
  }
  // leading dims that disagree with a given batch size
  BOOST_CHECK_THROW(PersistentTensorDict(file, {5}, "r"), BatchSizeError);
  try {
    PersistentTensorDict(file, {5}, "r");
  } catch (const BatchSizeError& e) {
    BOOST_TEST(std::string(e.what()).find("leading dims disagree") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find(file) != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(an_unsupported_dataset_fails_only_on_its_key) {
  // upstream opens an HDF5 file lazily: a dataset of a type it cannot map fails when that key is read, and the
  // rest of the file works (a compound record and a vlen sequence beside a tensor)
  TempDir dir("persistent");
  const std::string file = dir.path + "/odd.h5";
  const std::string script = dir.path + "/make.py";
  std::ofstream(script) << "import h5py, numpy as np, sys\n"
                           "with h5py.File(sys.argv[1], 'w') as f:\n"
                           "    f['obs'] = np.arange(12, dtype=np.float32).reshape(4, 3)\n"
                           "    f['r'] = np.arange(4, dtype=np.int64)\n"
                           "    f['rec'] = np.zeros(4, dtype=[('a', 'i4'), ('b', 'f8')])\n"
                           "    f.create_dataset('vl', (4,), dtype=h5py.vlen_dtype(np.int32))\n";
  BOOST_TEST_REQUIRE(std::system(("/usr/bin/python3 '" + script + "' '" + file + "'").c_str()) == 0);
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
  BOOST_TEST(h5.batch_size() == BatchSize({4}));
  std::vector<NestedKey> keys = h5.keys();
  for (const char* key : {"obs", "r", "rec", "vl"})
    BOOST_TEST((std::find(keys.begin(), keys.end(), NestedKey(key)) != keys.end()), key);
  BOOST_TEST(at::equal(h5.get("obs"), at::arange(12, at::kFloat).reshape({4, 3})));
  BOOST_TEST(at::equal(h5.index({1}).get("obs"), at::tensor({3.0f, 4.0f, 5.0f})));
  for (const char* key : {"rec", "vl"}) {
    bool typed = false;
    try {
      (void)h5.get_entry(key);
    } catch (const TypeError& e) {
      const std::string what = e.what();
      typed = what.find(file) != std::string::npos && what.find(std::string("/") + key) != std::string::npos &&
              what.find("unsupported HDF5 type") != std::string::npos;
      BOOST_TEST(typed, what);
    }
    BOOST_TEST(typed, key);
  }
}

BOOST_AUTO_TEST_CASE(a_refused_dtype_creates_no_file) {
  // bfloat16 has no numpy dtype: to_h5 refuses it before making the file (it left an empty .h5 behind)
  TempDir dir("persistent");
  const std::string file = dir.path + "/bf16.h5";
  TensorDict td({{"x", at::zeros({4, 2})}, {NestedKey{"sub", "y"}, at::zeros({4}, at::kBFloat16)}}, {4});
  bool typed = false;
  try {
    to_h5(td, file);
  } catch (const TypeError& e) {
    const std::string what = e.what();
    typed = what.find("BFloat16") != std::string::npos && what.find(file) != std::string::npos &&
            what.find("sub") != std::string::npos;
    BOOST_TEST(typed, what);
  }
  BOOST_TEST(typed);
  BOOST_TEST(!std::filesystem::exists(file), "a refused to_h5 left " << file);
}

BOOST_AUTO_TEST_CASE(memmap_and_share_memory_need_a_dense_copy) {
  TempDir dir("persistent");
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(sample(8), dir.path + "/m.h5");
  BOOST_CHECK_THROW(h5.memmap_(dir.path + "/mm"), NotImplementedError);
  BOOST_CHECK_THROW(h5.share_memory_(), NotImplementedError);
  TensorDict mm = h5.memmap(dir.path + "/mm2");
  BOOST_TEST(mm.is_memmap());
  BOOST_TEST(same(mm, h5.to_tensordict()));
}

BOOST_AUTO_TEST_CASE(storage_spec_reopens_the_file) {
  TempDir dir("persistent");
  const std::string file = dir.path + "/spec.h5";
  TensorDict ref = sample(8, 5);
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, file, H5Options().mode("w"));
  h5.close();
  PersistentTensorDict ro = PersistentTensorDict::from_h5(file, "r");
  StorageSpec spec = StorageSpec::of(ro);
  BOOST_TEST(spec.driver() == "h5");
  TensorDict again = open_storage(spec, OpenOptions().writable(false));
  BOOST_TEST(same(again.contiguous(), ref));
  StorageSpec sub = StorageSpec::of(ro.get_td("sub"));
  // the group alone: its batch size inferred from its one dataset, as upstream's from_h5 of a group
  TensorDict group = open_storage(sub, OpenOptions().writable(false));
  BOOST_TEST(group.batch_size() == BatchSize({8, 2, 3}));
  BOOST_TEST(group.get("x").equal(ref.get({"sub", "x"})));
  // a view's spec carries its index (issue 34, item 6): it reopens as that row
  TensorDict row = open_storage(StorageSpec::of(ro.index({1})), OpenOptions().writable(false));
  BOOST_TEST(row.batch_size() == BatchSize({}));
  BOOST_TEST(same(row.contiguous(), ref.index({1})));
}

BOOST_AUTO_TEST_CASE(per_row_non_tensor_writes_are_refused) {
  // HDF5 keeps one non-tensor value per dataset: a write of one row's value is refused, the file unchanged
  TempDir dir("persistent");
  TensorDict td({{"x", at::zeros({3})}}, {3});
  td.set("name", Entry(JsonValue("all")));
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(td, dir.path + "/nt.h5");
  TensorDict row({{"x", at::ones({})}}, {});
  row.set("name", Entry(JsonValue("one")));
  BOOST_CHECK_THROW(h5.index_put_({1}, row), NotImplementedError);
  BOOST_TEST(h5.get_non_tensor("name").as_string() == "all");
}

// rename_key_ moves the dataset or group in the file (an HDF5 link move: its data is not read), within a level and
// into a new one; clear erases every key of the level in one request
BOOST_AUTO_TEST_CASE(rename_key_and_clear_move_and_erase_links) {
  TempDir dir("persistent");
  const TensorDict ref = sample(16, 3);
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir.path + "/a.h5");
  const int64_t before = h5.store_stats().calls;
  h5.rename_key_("obs", "o");
  BOOST_TEST(h5.store_stats().calls == before);  // no read or write request: a structural one
  h5.rename_key_(NestedKey({"sub", "x"}), NestedKey({"sub", "y"}));  // inside a nested level
  h5.rename_key_("sub", "other");                                     // a whole group
  h5.close();
  PersistentTensorDict back = PersistentTensorDict::from_h5(dir.path + "/a.h5", "r+");
  BOOST_TEST(back.get("o").equal(ref.get("obs")));
  BOOST_TEST(back.get({"other", "y"}).equal(ref.get({"sub", "x"})));
  BOOST_TEST(!back.contains("sub"));
  BOOST_TEST(!back.contains("obs"));
  BOOST_CHECK_THROW(back.rename_key_("o", "idx", RenameOptions().safe(true)), KeyError);
  BOOST_TEST(back.get("idx").equal(ref.get("idx")));
  back.rename_key_("o", "idx");
  BOOST_TEST(back.get("idx").equal(ref.get("obs")));
  BOOST_CHECK_THROW(back.rename_key_("missing", "m"), KeyError);
  BOOST_TEST(back.batch_size() == BatchSize({16}));
  back.clear();
  BOOST_TEST(back.keys().empty());
  BOOST_TEST(back.batch_size() == BatchSize({16}));  // kept, as upstream's
}

BOOST_AUTO_TEST_SUITE_END()
