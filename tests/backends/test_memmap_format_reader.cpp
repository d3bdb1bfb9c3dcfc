// The memmap directory format reader: Python variations it tolerates, malformed meta.json, missing and truncated
// leaves, symlinks, fifos, missing leaf files, writable mappings. Helpers in test_memmap_format_util.hpp.
#include "backends/test_memmap_format_util.hpp"

BOOST_AUTO_TEST_SUITE(memmap_format_reader)

BOOST_AUTO_TEST_CASE(reader_tolerates_python_variations) {
  td_test::TempDir tmp;
  // any whitespace, \u escapes, NaN in unrelated fields, missing shape/device, legacy raw file names
  std::string d = make_dir(tmp, "v",
                           "{\n  \"a b\" : {\"shape\":[2],\"dtype\":\"torch.\\u0066loat32\"},\n"
                           "  \"x\": {\"device\": \"cuda:0\", \"shape\": [1], \"dtype\": \"torch.int64\", \"is_nested\": false, \"extra\": NaN},\n"
                           "  \"nothing\": {\"foo\": 1},\n  \"weird\": Infinity\n}");
  be::write_file(d + "/a b.memmap", at::tensor({1.0f, 2.0f}));  // legacy raw name (v0.11-v0.13 style)
  be::write_file(d + "/x.memmap", at::tensor({int64_t{7}, int64_t{8}}));  // longer than needed
  DirNode n = be::read_dir(d);
  BOOST_TEST(n.batch_size.value().empty());  // missing "shape" -> []
  BOOST_TEST(!n.device.has_value());
  BOOST_TEST(n.type_repr == be::type_repr::kTensorDict);
  BOOST_TEST_REQUIRE(n.entries.size() == 2u);
  BOOST_TEST(n.entries[0].name == "a b.memmap");
  BOOST_TEST(at::equal(be::map_leaf(d, n.entries[0].leaf, false), at::tensor({1.0f, 2.0f})));
  BOOST_TEST(n.entries[1].leaf.device == "cuda:0");
  BOOST_TEST(be::map_leaf(d, n.entries[1].leaf, false).item<int64_t>() == 7);
  BOOST_TEST(n.warnings.size() == 1u);  // "nothing" has no dtype/shape

  // missing file: an empty leaf is rebuilt; a non-empty one is a FormatError, or skipped with allow_missing
  // (as Python does)
  d = make_dir(tmp, "m",
               std::string("{\"e\": {\"device\": \"cpu\", \"shape\": [0, 3], \"dtype\": \"torch.float32\", \"is_nested\": false}, "
                           "\"gone\": {\"device\": \"cpu\", \"shape\": [2], \"dtype\": \"torch.float32\", \"is_nested\": false}, ") +
                   kTd + "}");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/gone.memmap", "leaf 'gone'", "missing"});
  be::ReadOptions lenient;
  lenient.allow_missing = true;
  n = be::read_dir(d, lenient);
  BOOST_TEST_REQUIRE(n.entries.size() == 1u);
  BOOST_TEST(n.entries[0].key == "e");
  BOOST_TEST(n.warnings.size() == 1u);
  BOOST_TEST(n.warnings[0].find("gone") != std::string::npos);
  BOOST_TEST(n.device.value() == "cpu");
  // a zero-length file for an empty leaf is fine too
  td_test::write_text(d + "/e.memmap", "");
  BOOST_TEST(be::read_dir(d, lenient).entries[0].leaf.file == "e.memmap");

  // a huge nested leaf of scalar components without data is skipped (allow_missing) without allocating anything
  d = make_dir(tmp, "huge", "{\"a\": {\"shape\": [1000000000000, 0], \"dtype\": \"torch.float32\", \"is_nested\": true}}");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/a.memmap", "leaf 'a'", "missing"});
  n = be::read_dir(d, lenient);
  BOOST_TEST(n.entries.empty());
  BOOST_TEST(n.warnings.size() == 1u);
  // nested leaf with n scalar components
  d = make_dir(tmp, "scal", "{\"a\": {\"shape\": [3, 0], \"dtype\": \"torch.int32\", \"is_nested\": true}}");
  be::write_file(d + "/a.memmap", at::tensor({4, 5, 6}, at::kInt));
  n = be::read_dir(d);
  BOOST_TEST_REQUIRE(n.entries.size() == 1u);
  BOOST_TEST(be::map_nested_leaf(d, n.entries[0].leaf, false).at(2).item<int>() == 6);

  // "device": "None" means no device
  d = make_dir(tmp, "dn", "{\"shape\": [1], \"device\": \"None\", \"_type\": \"<class 'tensordict._td.TensorDict'>\"}");
  BOOST_TEST(!be::read_dir(d).device.has_value());

  // v0.3 trees: sub-directories without {"type"} entries
  d = make_dir(tmp, "v03", std::string("{") + kTd + "}");
  make_dir(tmp, "v03/child", std::string("{") + kTd + "}");
  fs::create_directories(d + "/not_a_node");
  n = be::read_dir(d);
  BOOST_TEST_REQUIRE(n.entries.size() == 1u);
  BOOST_TEST(n.entries[0].key == "child");
  BOOST_TEST(!n.entries[0].is_leaf);

  // legacy raw directory name for a sub-collection (v0.13 wrote raw dir names)
  d = make_dir(tmp, "v13", std::string("{\"sub dir\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  make_dir(tmp, "v13/sub dir", std::string("{") + kTd + "}");
  n = be::read_dir(d);
  BOOST_TEST(n.entries.at(0).name == "sub dir");

  // unknown internal type: meta kept verbatim, _source read, rewritten verbatim
  d = make_dir(tmp, "other", "{\"_type\": \"<class 'tensordict._td._SubTensorDict'>\", \"index\": [\"tuple\", [0]]}");
  make_dir(tmp, "other/_source", std::string("{") + kTd + "}");
  n = be::read_dir(d);
  BOOST_TEST((n.kind == NodeKind::Other));
  BOOST_TEST(n.entries.at(0).key == "_source");
  be::copy_tree(n, tmp / "other2");
  BOOST_TEST(td_test::read_file(tmp / "other2/meta.json") == td_test::read_file(d + "/meta.json"));

  // NonTensorData without data but with other.pickle; MetaData type; extra fields kept on rewrite
  d = make_dir(tmp, "nt", "{\"_type\": \"<class 'tensordict.tensorclass.MetaData'>\", \"_metadata\": {\"k\": 1}, \"zz\": 2}");
  td_test::write_text(d + "/other.pickle", std::string("\x80\x05.", 3));
  n = be::read_dir(d);
  BOOST_TEST((n.kind == NodeKind::NonTensorData));
  BOOST_TEST(!n.data.has_value());
  BOOST_TEST(n.pickle->data == std::string("\x80\x05.", 3));
  BOOST_TEST(be::make_meta(n).dump() ==
             "{\"_type\":\"<class 'tensordict.tensorclass.MetaData'>\",\"_is_non_tensor\":true,\"_metadata\":{\"k\":1},\"zz\":2}");

  // NonTensorStack: nested equal-length lists add dims; ragged ones do not
  d = make_dir(tmp, "nts", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"stack_dim\": 0, \"device\": \"cpu\", \"data\": [[1, 2], [3, 4], [5, 6]]}");
  BOOST_TEST(be::read_dir(d).batch_size.value() == (std::vector<int64_t>{3, 2}));
  d = make_dir(tmp, "nts2", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"data\": [[1, 2], [3]]}");
  BOOST_TEST(be::read_dir(d).batch_size.value() == (std::vector<int64_t>{2}));
  // NonTensorStack without data: lazy-stack layout fallback
  d = make_dir(tmp, "nts3", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"stack_dim\": 0}");
  make_dir(tmp, "nts3/0", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorData'>\", \"data\": 1}");
  make_dir(tmp, "nts3/1", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorData'>\", \"data\": 2}");
  n = be::read_dir(d);
  BOOST_TEST(n.entries.size() == 2u);
  BOOST_TEST(!n.batch_size.has_value());  // NonTensorData members carry no batch size

  // empty lazy stack, and a tensorclass without _tensordict
  d = make_dir(tmp, "ls0", "{\"_type\": \"<class 'tensordict._lazy.LazyStackedTensorDict'>\", \"stack_dim\": 0}");
  BOOST_TEST(be::read_dir(d).entries.empty());
  d = make_dir(tmp, "tc0", "{\"_type\": \"<class 'x.Y'>\", \"f\": 1}");
  n = be::read_dir(d);
  BOOST_TEST((n.kind == NodeKind::TensorClass));
  BOOST_TEST(n.entries.empty());
}

// ------------------------------------------------------------------------------------------ bad input
BOOST_AUTO_TEST_CASE(malformed_meta_json_is_a_format_error_naming_the_file) {
  td_test::TempDir tmp;
  const std::string leaf_ok = "\"device\": \"cpu\", \"is_nested\": false";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "invalid JSON at offset 0"},
      {"not json", "invalid JSON"},
      {"{\"a\": {\"dtype\"", "invalid JSON"},  // truncated
      {"{\"a\": 1,}", "invalid JSON"},
      {"[1, 2]", "expected a JSON object, found array"},
      {"null", "expected a JSON object, found null"},
      {"\"str\"", "expected a JSON object"},
      {"{\"_type\": 5}", "\"_type\" must be a string"},
      {"{\"shape\": \"4\"}", "\"shape\" must be a list of ints"},
      {"{\"shape\": [2, -1]}", "negative dimension -1"},
      {"{\"shape\": [2.0]}", "must be a list of ints"},
      {"{\"shape\": [true]}", "must be a list of ints"},
      {"{\"shape\": [4611686018427387904, 4611686018427387904]}", "overflows int64"},
      {"{\"a\": {\"shape\": [576460752303423488, 2], \"dtype\": \"torch.float64\"}}", "byte size overflows int64"},
      {"{\"device\": 5}", "\"device\" must be a string"},
      {"{\"a\": {\"shape\": \"x\", \"dtype\": \"torch.float32\"}}", "leaf 'a': \"shape\" must be a list of ints"},
      {"{\"a\": {\"shape\": [-2], \"dtype\": \"torch.float32\"}}", "negative dimension -2"},
      {"{\"a\": {\"shape\": [null], \"dtype\": \"torch.float32\"}}", "found an element of kind null"},
      {"{\"a\": {\"shape\": [2], \"dtype\": 5}}", "leaf 'a': \"dtype\" must be a string, found int"},
      {"{\"a\": {\"shape\": [2], \"dtype\": \"torch.float8_e4m3fn\"}}", "unknown or unsupported dtype 'torch.float8_e4m3fn'"},
      {"{\"a\": {\"shape\": [2], \"dtype\": \"torch.float\"}}", "unknown or unsupported dtype"},
      {"{\"a\": {\"shape\": [2], \"dtype\": \"torch.float32\", \"is_nested\": \"no\"}}", "\"is_nested\" must be a bool"},
      {"{\"a\": {\"shape\": [2, 2, 2], \"dtype\": \"torch.float32\", \"is_nested\": true}}", "[n_components, ndim]"},
      {"{\"s\": {\"type\": \"TensorDict\"}}", "sub-collection 's' has no directory"},
      {"{\"_type\": \"<class 'tensordict._lazy.LazyStackedTensorDict'>\", \"stack_dim\": \"0\"}", "\"stack_dim\" must be an int"},
      {"{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"data\": \"evil.pkl\"}", "must be \"pickle.pkl\""},
      {"{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"device\": [], \"data\": []}", "\"device\" must be a string"},
  };
  int i = 0;
  for (const auto& [text, needle] : cases) {
    BOOST_TEST_CONTEXT("meta.json '" << text << "'") {
      std::string d = make_dir(tmp, "bad" + std::to_string(i++), text);
      td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"FormatError", d + "/meta.json", needle});
    }
  }
  (void)leaf_ok;
  // pickle.pkl referenced but missing
  std::string d = make_dir(tmp, "nopkl", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorStack'>\", \"data\": \"pickle.pkl\"}");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/pickle.pkl", "missing"});
  // lazy stack members with different batch sizes / out-of-range stack_dim
  d = make_dir(tmp, "lsbad", "{\"_type\": \"<class 'tensordict._lazy.LazyStackedTensorDict'>\", \"stack_dim\": 0}");
  make_dir(tmp, "lsbad/0", "{\"shape\": [2]}");
  make_dir(tmp, "lsbad/1", "{\"shape\": [3]}");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/meta.json", "different batch sizes"});
  d = make_dir(tmp, "lsdim", "{\"_type\": \"<class 'tensordict._lazy.LazyStackedTensorDict'>\", \"stack_dim\": 3}");
  make_dir(tmp, "lsdim/0", "{\"shape\": [2]}");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"out of range"});
  // errors deep in a tree name the deep file
  d = make_dir(tmp, "deep", std::string("{\"s\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  make_dir(tmp, "deep/s", "{\"shape\": [1, 2");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/s/meta.json", "invalid JSON"});
}

BOOST_AUTO_TEST_CASE(missing_meta_and_truncated_leaves) {
  td_test::TempDir tmp;
  fs::create_directories(tmp / "empty_dir");
  td_test::check_throws<FormatError>([&] { be::read_dir(tmp / "empty_dir"); }, {"missing meta.json", tmp / "empty_dir"});
  td_test::check_throws<FormatError>([&] { be::read_dir(tmp / "does_not_exist"); }, {"not a directory"});
  fs::create_directories(tmp / "metadir/meta.json");
  td_test::check_throws<FormatError>([&] { be::read_dir(tmp / "metadir"); }, {"not a regular file"});
  // truncated leaf
  std::string d = make_dir(tmp, "trunc",
                           std::string("{\"x\": {\"device\": \"cpu\", \"shape\": [2, 3], \"dtype\": \"torch.float64\", \"is_nested\": false}, ") +
                               kTd + "}");
  td_test::write_text(d + "/x.memmap", std::string(40, '\0'));
  td_test::check_throws<FormatError>([&] { be::read_dir(d); },
                                     {d + "/x.memmap", "truncated", "expected at least 48 bytes", "found 40"});
  // a leaf that is truncated after read_dir: map_leaf reports it too
  td_test::write_text(d + "/x.memmap", std::string(48, '\0'));
  DirNode n = be::read_dir(d);
  td_test::write_text(d + "/x.memmap", std::string(8, '\0'));
  td_test::check_throws<FormatError>([&] { be::map_leaf(d, n.entries[0].leaf, false); }, {d + "/x.memmap", "too short"});
  fs::remove(d + "/x.memmap");
  td_test::check_throws<FormatError>([&] { be::map_leaf(d, n.entries[0].leaf, false); }, {d + "/x.memmap", "missing"});
  // a symlink loop of directories: refused at once; followed, it cannot recurse forever
  d = make_dir(tmp, "loop", std::string("{\"s\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  BOOST_TEST_REQUIRE(::symlink(d.c_str(), (d + "/s").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/s' is a symlink"});
  be::ReadOptions follow;
  follow.follow_symlinks = true;
  // (fails at the kernel's 40-symlink path limit or at our depth limit, whichever comes first)
  td_test::check_throws<FormatError>([&] { be::read_dir(d, follow); }, {"FormatError", d + "/s/s/s"});
  // a real tree deeper than the reader's limit
  std::string deep = tmp / "deep";
  for (int i = 0; i < 130; ++i) {
    fs::create_directories(deep);
    td_test::write_text(deep + "/meta.json", std::string("{\"s\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
    deep += "/s";
  }
  td_test::check_throws<FormatError>([&] { be::read_dir(tmp / "deep"); }, {"deeper than 128"});
}

// ------------------------------------------------------------------------------------------ untrusted trees
namespace {
const char* kObsMeta =
    "{\"obs\": {\"device\": \"cpu\", \"shape\": [2], \"dtype\": \"torch.float32\", \"is_nested\": false}, "
    "\"shape\": [2], \"device\": \"cpu\", \"_type\": \"<class 'tensordict._td.TensorDict'>\"}";
be::ReadOptions following() {
  be::ReadOptions o;
  o.follow_symlinks = true;
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(reader_refuses_symlinked_leaves_metas_and_dirs) {
  td_test::TempDir tmp;
  const std::string target = tmp / "outside.bin";  // outside the tree being read
  td_test::write_text(target, std::string(8, 'T'));
  // a leaf symlinked outside the root: refused by read_dir and by map_leaf
  std::string d = make_dir(tmp, "leaf", kObsMeta);
  BOOST_TEST_REQUIRE(::symlink(target.c_str(), (d + "/obs.memmap").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/obs.memmap' is a symlink", "refused"});
  LeafMeta leaf;
  leaf.key = "obs";
  leaf.shape = {2};
  leaf.file = "obs.memmap";
  td_test::check_throws<FormatError>([&] { be::map_leaf(d, leaf, /*writable=*/true); }, {d + "/obs.memmap", "symlink"});
  BOOST_TEST(td_test::read_file(target) == std::string(8, 'T'));
  // map_file refuses it too when asked not to follow
  td_test::check_throws<ValueError>(
      [&] { be::map_file(d + "/obs.memmap", at::kFloat, {2}, true, 0, /*follow_symlinks=*/false); }, {"symlink"});
  // followed on request (the caller trusts the tree)
  DirNode n = be::read_dir(d, following());
  BOOST_TEST_REQUIRE(n.entries.size() == 1u);
  BOOST_TEST(be::map_leaf(d, n.entries[0].leaf, false, following()).numel() == 2);

  // a symlinked meta.json, at the root and in a sub-directory
  std::string m = tmp / "meta";
  fs::create_directories(m);
  td_test::write_text(tmp / "elsewhere.json", kObsMeta);
  BOOST_TEST_REQUIRE(::symlink((tmp / "elsewhere.json").c_str(), (m + "/meta.json").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(m); }, {"'" + m + "/meta.json' is a symlink"});

  // a symlinked sub-directory (pointing outside the root), listed and as a v0.3 child
  make_dir(tmp, "outside_td", std::string("{") + kTd + "}");
  d = make_dir(tmp, "sub", std::string("{\"s\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  BOOST_TEST_REQUIRE(::symlink((tmp / "outside_td").c_str(), (d + "/s").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/s' is a symlink"});
  BOOST_TEST(be::read_dir(d, following()).find("s")->child->batch_size.value() == (std::vector<int64_t>{2}));
  d = make_dir(tmp, "v03", std::string("{") + kTd + "}");
  BOOST_TEST_REQUIRE(::symlink((tmp / "outside_td").c_str(), (d + "/s").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/s' is a symlink"});
  // a real sub-directory whose meta.json is a symlink
  d = make_dir(tmp, "submeta", std::string("{\"s\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  fs::create_directories(d + "/s");
  BOOST_TEST_REQUIRE(::symlink((tmp / "outside_td/meta.json").c_str(), (d + "/s/meta.json").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/s/meta.json' is a symlink"});

  // a symlink inside the root to a file inside the root: refused by default, read with follow_symlinks
  d = make_dir(tmp, "inner", kObsMeta);
  be::write_file(d + "/data.bin", at::tensor({1.0f, 2.0f}));
  BOOST_TEST_REQUIRE(::symlink("data.bin", (d + "/obs.memmap").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/obs.memmap' is a symlink"});
  n = be::read_dir(d, following());
  BOOST_TEST(at::equal(be::map_leaf(d, n.entries[0].leaf, false, following()), at::tensor({1.0f, 2.0f})));
  // a dangling leaf symlink is refused, not taken for a missing file
  d = make_dir(tmp, "dangling", kObsMeta);
  BOOST_TEST_REQUIRE(::symlink("nowhere", (d + "/obs.memmap").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {"'" + d + "/obs.memmap' is a symlink"});
}

BOOST_AUTO_TEST_CASE(reader_refuses_fifos_without_blocking) {
  // The reader checks the type before any (non-blocking) open: nothing here opens the fifos' other end,
  // so a blocking open would hang the test.
  td_test::TempDir tmp;
  std::string d = make_dir(tmp, "leaf", kObsMeta);
  BOOST_TEST_REQUIRE(::mkfifo((d + "/obs.memmap").c_str(), 0600) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/obs.memmap", "not a regular file"});
  be::ReadOptions lenient;
  lenient.allow_missing = true;
  lenient.follow_symlinks = true;
  td_test::check_throws<FormatError>([&] { be::read_dir(d, lenient); }, {d + "/obs.memmap", "not a regular file"});
  LeafMeta leaf;
  leaf.key = "obs";
  leaf.shape = {2};
  td_test::check_throws<FormatError>([&] { be::map_leaf(d, leaf, /*writable=*/false); }, {"not a regular file"});
  td_test::check_throws<FormatError>([&] { be::map_leaf(d, leaf, /*writable=*/true, lenient); }, {"not a regular file"});
  td_test::check_throws<ValueError>([&] { be::map_file(d + "/obs.memmap", at::kFloat, {2}, false); },
                                    {"not a regular file"});
  // a symlink to a fifo, followed on request: still refused
  std::string s = make_dir(tmp, "link", kObsMeta);
  BOOST_TEST_REQUIRE(::symlink((d + "/obs.memmap").c_str(), (s + "/obs.memmap").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(s, lenient); }, {s + "/obs.memmap", "not a regular file"});
  // meta.json, a pickle and a nested sizes file as fifos
  std::string m = tmp / "meta";
  fs::create_directories(m);
  BOOST_TEST_REQUIRE(::mkfifo((m + "/meta.json").c_str(), 0600) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(m); }, {m + "/meta.json", "not a regular file"});
  std::string p = make_dir(tmp, "pickle", "{\"_type\": \"<class 'tensordict.tensorclass.NonTensorData'>\"}");
  BOOST_TEST_REQUIRE(::mkfifo((p + "/other.pickle").c_str(), 0600) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(p); }, {p + "/other.pickle", "not a regular file"});
  std::string nst = make_dir(tmp, "nested", "{\"a\": {\"shape\": [2, 1], \"dtype\": \"torch.float32\", \"is_nested\": true}}");
  BOOST_TEST_REQUIRE(::mkfifo((nst + "/a.shape.memmap").c_str(), 0600) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(nst); }, {nst + "/a.shape.memmap", "not a regular file"});
  // a device file in place of a leaf
  d = make_dir(tmp, "dev", kObsMeta);
  BOOST_TEST_REQUIRE(::symlink("/dev/zero", (d + "/obs.memmap").c_str()) == 0);
  td_test::check_throws<FormatError>([&] { be::read_dir(d, lenient); }, {d + "/obs.memmap", "not a regular file"});
}

BOOST_AUTO_TEST_CASE(reader_refuses_missing_leaf_files) {
  td_test::TempDir tmp;
  be::ReadOptions lenient;
  lenient.allow_missing = true;
  // a dense leaf in a sub-directory
  std::string d = make_dir(tmp, "td", std::string("{\"sub\": {\"type\": \"TensorDict\"}, ") + kTd + "}");
  fs::create_directories(d + "/sub");
  td_test::write_text(d + "/sub/meta.json", kObsMeta);
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/sub/obs.memmap", "leaf 'obs'", "missing"});
  DirNode n = be::read_dir(d, lenient);
  const DirNode& sub = *n.find("sub")->child;
  BOOST_TEST(sub.entries.empty());
  BOOST_TEST_REQUIRE(sub.warnings.size() == 1u);
  BOOST_TEST(sub.warnings[0].find("'obs'") != std::string::npos);
  BOOST_TEST(sub.warnings[0].find("obs.memmap' is missing") != std::string::npos);

  // nested (ragged) leaves: the sizes file, then the data file
  const std::string meta = "{\"r\": {\"shape\": [2, 1], \"dtype\": \"torch.float32\", \"is_nested\": true}}";
  d = make_dir(tmp, "nested", meta);
  be::write_nested_leaf(d, "r", {at::tensor({1.0f}), at::tensor({2.0f, 3.0f})});
  BOOST_TEST(be::read_dir(d).entries.size() == 1u);
  fs::remove(d + "/r.shape.memmap");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/r.shape.memmap", "leaf 'r'", "sizes file", "missing"});
  n = be::read_dir(d, lenient);
  BOOST_TEST(n.entries.empty());
  BOOST_TEST_REQUIRE(n.warnings.size() == 1u);
  BOOST_TEST(n.warnings[0].find("r.shape.memmap") != std::string::npos);
  d = make_dir(tmp, "nested2", meta);
  be::write_nested_leaf(d, "r", {at::tensor({1.0f}), at::tensor({2.0f, 3.0f})});
  fs::remove(d + "/r.memmap");
  td_test::check_throws<FormatError>([&] { be::read_dir(d); }, {d + "/r.memmap", "leaf 'r'", "data file", "missing"});
  n = be::read_dir(d, lenient);
  BOOST_TEST(n.entries.empty());
  BOOST_TEST(n.warnings.size() == 1u);
}

BOOST_AUTO_TEST_CASE(writable_leaf_mappings_write_through) {
  td_test::TempDir tmp;
  be::copy_tree(be::read_dir(case_dir("j_memmap_like")), tmp / "j");
  DirNode n = be::read_dir(tmp / "j");
  {
    at::Tensor obs = be::map_leaf(n.path, n.find("obs")->leaf, /*writable=*/true);
    obs[2] = 5.0;
    BOOST_TEST(be::mapped_filename(obs).value() == tmp / "j/obs.memmap");
  }
  at::Tensor again = be::map_leaf(n.path, n.find("obs")->leaf, false);
  check_values(again, JsonValue::parse("[0.0, 0.0, 7.0, 7.0, 5.0, 5.0]"), "obs");
  // the fixture itself is untouched
  check_values(be::map_leaf(case_dir("j_memmap_like"), n.find("obs")->leaf, false),
               JsonValue::parse("[0.0, 0.0, 7.0, 7.0, 0.0, 0.0]"), "fixture obs");
}

BOOST_AUTO_TEST_SUITE_END()
