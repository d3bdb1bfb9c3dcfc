// The memmap directory format: dtype strings, key encoding, the Python fixtures byte for byte, the writer
// (test_memmap_format_reader.cpp: what the reader tolerates and refuses). Helpers in test_memmap_format_util.hpp.
#include "backends/test_memmap_format_util.hpp"

BOOST_AUTO_TEST_SUITE(memmap_format)

// ------------------------------------------------------------------------------------------ dtypes and keys
BOOST_AUTO_TEST_CASE(dtype_strings) {
  const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"torch.bool", at::kBool},         {"torch.uint8", at::kByte},     {"torch.int8", at::kChar},
      {"torch.int16", at::kShort},       {"torch.int32", at::kInt},      {"torch.int64", at::kLong},
      {"torch.float16", at::kHalf},      {"torch.bfloat16", at::kBFloat16}, {"torch.float32", at::kFloat},
      {"torch.float64", at::kDouble},    {"torch.complex32", at::kComplexHalf},
      {"torch.complex64", at::kComplexFloat}, {"torch.complex128", at::kComplexDouble}};
  for (const auto& [s, t] : table) {
    BOOST_TEST(be::dtype_to_string(t) == s);
    BOOST_TEST((be::dtype_from_string(s) == t), s);
  }
  for (const char* unknown : {"torch.float", "torch.long", "float32", "torch.float8_e4m3fn", "torch.uint16", "torch.qint8", ""})
    BOOST_TEST(!be::dtype_from_string(unknown).has_value(), unknown);
  td_test::check_throws<ValueError>([] { be::dtype_to_string(at::kQInt8); }, {"cannot be stored"});
}

BOOST_AUTO_TEST_CASE(key_encoding_matches_python) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a/b/c", "a%2Fb%2Fc"}, {"key with spaces", "key%20with%20spaces"}, {"50%", "50%25"}, {"C:x", "C%3Ax"},
      {"", "%"}, {".", "%2E"}, {"..", "%2E%2E"}, {".x", ".x"}, {"a..b", "a..b"}, {"a.b-c_d", "a.b-c_d"},
      {"<>:\"|?*\\", "%3C%3E%3A%22%7C%3F%2A%5C"}, {std::string("n\0l", 3), "n%00l"}, {"\x01\x1f\x7f", "%01%1F%7F"},
      {"\xc3\xa9t\xc3\xa9 \xe2\x82\xac", "\xc3\xa9t\xc3\xa9%20\xe2\x82\xac"}, {"pct%sign", "pct%25sign"}, {"sub dir", "sub%20dir"}};
  for (const auto& [key, enc] : cases) {
    BOOST_TEST(be::encode_key(key) == enc);
    BOOST_TEST(be::decode_key(enc) == key);
  }
  // every single byte round-trips
  for (int c = 0; c < 256; ++c) {
    std::string k = "k" + std::string(1, static_cast<char>(c)) + "k";
    BOOST_TEST(be::decode_key(be::encode_key(k)) == k);
    BOOST_TEST(be::encode_key(k).find('/') == std::string::npos);
  }
  BOOST_TEST(be::decode_key("%2e") == ".");  // lowercase hex accepted when decoding
  for (const char* bad : {"a%", "a%2", "%G0", "%%"})
    td_test::check_throws<ValueError>([&] { be::decode_key(bad); }, {"malformed escape"});
}

BOOST_AUTO_TEST_CASE(legacy_key_safety) {
  BOOST_TEST(be::is_safe_legacy_key("a b", false));
  BOOST_TEST(be::is_safe_legacy_key("a b", true));
  BOOST_TEST(!be::is_safe_legacy_key("a/b", false));
  BOOST_TEST(!be::is_safe_legacy_key("a\\b", false));
  BOOST_TEST(!be::is_safe_legacy_key("C:stuff", false));
  BOOST_TEST(be::is_safe_legacy_key("", false));
  BOOST_TEST(!be::is_safe_legacy_key("", true));
  BOOST_TEST(!be::is_safe_legacy_key("..", true));
  BOOST_TEST(!be::is_safe_legacy_key(".", true));
}

BOOST_AUTO_TEST_CASE(type_classification) {
  BOOST_TEST((be::classify_type(be::type_repr::kTensorDict) == NodeKind::TensorDict));
  BOOST_TEST((be::classify_type(be::type_repr::kPersistentTensorDict) == NodeKind::TensorDict));
  BOOST_TEST((be::classify_type(be::type_repr::kLazyStackedTensorDict) == NodeKind::LazyStackedTensorDict));
  BOOST_TEST((be::classify_type(be::type_repr::kNonTensorData) == NodeKind::NonTensorData));
  BOOST_TEST((be::classify_type(be::type_repr::kMetaData) == NodeKind::NonTensorData));
  BOOST_TEST((be::classify_type(be::type_repr::kNonTensorStack) == NodeKind::NonTensorStack));
  BOOST_TEST((be::classify_type("<class '__main__.Pair'>") == NodeKind::TensorClass));
  BOOST_TEST((be::classify_type("<class 'tensordict._td._SubTensorDict'>") == NodeKind::Other));
  DirNode tc;
  tc.kind = NodeKind::TensorClass;
  tc.type_repr = "<class 'my.pkg.Transition'>";
  BOOST_TEST(be::default_child_type(tc) == "Transition");
  for (int k = 0; k <= 5; ++k) BOOST_TEST(std::string(be::node_kind_name(static_cast<NodeKind>(k))) != "?");
}

// ------------------------------------------------------------------------------------------ fixtures
BOOST_AUTO_TEST_CASE(every_fixture_meta_json_reprints_byte_identical) {
  std::vector<std::string> roots;
  for (const auto& c : kCases) roots.push_back(case_dir(c));
  roots.push_back(td_test::fixture("upstream-artifact/mmap_example"));
  int n = 0;
  for (const auto& root : roots)
    for (const auto& rel : list_files(root)) {
      if (fs::path(rel).filename() != "meta.json") continue;
      std::string text = td_test::read_file(root + "/" + rel);
      // the upstream artifact went through git as text: Python's bytes plus a final newline
      if (root.find("upstream-artifact") != std::string::npos && !text.empty() && text.back() == '\n') text.pop_back();
      JsonValue v = JsonValue::parse(text);
      const JsonValue* t = v.find("_type");
      auto style = be::meta_style(t ? be::classify_type(t->as_string()) : NodeKind::TensorDict);
      BOOST_TEST(v.dump(style) == text, root << "/" << rel);
      ++n;
    }
  BOOST_TEST(n == 23);
}

BOOST_AUTO_TEST_CASE(python_written_fixtures_read_as_expected) {
  for (const auto& c : kCases) {
    BOOST_TEST_CONTEXT("fixture " << c) {
      const std::string dir = case_dir(c);
      JsonValue expected = load_json(td_test::fixture("python-written/" + c + ".expected.json"));
      DirNode root = be::read_dir(dir);
      BOOST_TEST(root.path == dir);
      BOOST_TEST(root.warnings.empty());
      check_against_expected(root, expected);
    }
  }
}

BOOST_AUTO_TEST_CASE(fixture_details) {
  DirNode b = be::read_dir(case_dir("b_nested"));
  std::vector<std::string> keys, names;
  for (const auto& e : b.entries) {
    keys.push_back(e.key);
    names.push_back(e.name);
  }
  BOOST_TEST(keys == (std::vector<std::string>{"top", "sub", "key with space", "a/b", "pct%sign", "sub dir"}));
  BOOST_TEST(names == (std::vector<std::string>{"top.memmap", "sub", "key%20with%20space.memmap", "a%2Fb.memmap",
                                                "pct%25sign.memmap", "sub%20dir"}));
  BOOST_TEST(b.find("sub")->type == "TensorDict");
  BOOST_TEST(b.device.value() == "cpu");
  BOOST_TEST(b.type_repr == be::type_repr::kTensorDict);

  DirNode e = be::read_dir(case_dir("e_empty"));
  BOOST_TEST_REQUIRE(e.entries.size() == 2u);
  BOOST_TEST(e.entries[0].leaf.file.empty());  // no file on disk for an empty leaf
  BOOST_TEST(be::map_leaf(e.path, e.entries[0].leaf, true).sizes().vec() == (std::vector<int64_t>{0, 5}));

  DirNode c = be::read_dir(case_dir("c_non_tensor"));
  const DirNode& names_node = *c.find("names")->child;
  BOOST_TEST((names_node.kind == NodeKind::NonTensorStack));
  BOOST_TEST(!names_node.device.has_value());  // "device": null
  BOOST_TEST(names_node.stack_dim == 0);
  const DirNode& name_node = *c.find("name")->child;
  BOOST_TEST((name_node.kind == NodeKind::NonTensorData));
  BOOST_TEST(!name_node.batch_size.has_value());
  BOOST_TEST(!name_node.pickle.has_value());

  DirNode g = be::read_dir(case_dir("g_tensorclass"));
  BOOST_TEST((g.kind == NodeKind::TensorClass));
  BOOST_TEST(g.type_repr == "<class '__main__.Pair'>");
  BOOST_TEST(g.data->as_object().empty());
  BOOST_TEST(g.batch_size.value() == (std::vector<int64_t>{2}));

  DirNode h = be::read_dir(case_dir("h_zero_dim"));
  BOOST_TEST(h.batch_size.value().empty());
  at::Tensor s = be::map_leaf(h.path, h.find("scalar")->leaf, false);
  BOOST_TEST(s.dim() == 0);
  BOOST_TEST(s.item<float>() == 3.5f);
}

BOOST_AUTO_TEST_CASE(upstream_artifact_with_trailing_bytes) {
  const std::string dir = td_test::fixture("upstream-artifact/mmap_example");
  DirNode root = be::read_dir(dir);
  BOOST_TEST(root.batch_size.value() == (std::vector<int64_t>{2, 1}));
  const DirNode& nested = *root.find("nested")->child;
  BOOST_TEST(nested.batch_size.value() == (std::vector<int64_t>{2, 1}));
  at::Tensor i64 = be::map_leaf(nested.path, nested.find("int64")->leaf, false);
  BOOST_TEST(i64.sizes().vec() == (std::vector<int64_t>{2, 1}));
  check_values(i64, JsonValue::parse("[1, 2]"), "int64");
  at::Tensor bf = be::map_leaf(nested.path, nested.find("bfloat16")->leaf, false);
  BOOST_TEST(bf.scalar_type() == at::kBFloat16);
  check_values(bf, JsonValue::parse("[1.0, 1.0]"), "bfloat16");
  const DirNode& str = *nested.find("string")->child;
  BOOST_TEST((str.kind == NodeKind::NonTensorData));
  BOOST_TEST(*str.data == JsonValue::parse("[\"a string!\"]"));  // the old list form, kept as is
  // rewrite in v0.14 layout and read back
  td_test::TempDir tmp;
  be::copy_tree(root, tmp / "copy");
  // same bytes as the artifact, except the final newline git added to it
  BOOST_TEST(td_test::read_file(tmp / "copy/meta.json") + "\n" == td_test::read_file(dir + "/meta.json"));
  BOOST_TEST(td_test::read_file(tmp / "copy/nested/meta.json") + "\n" == td_test::read_file(dir + "/nested/meta.json"));
  BOOST_TEST(td_test::read_file(tmp / "copy/nested/int64.memmap") == td_test::read_file(dir + "/nested/int64.memmap").substr(0, 16));
  BOOST_TEST(td_test::read_file(tmp / "copy/nested/bfloat16.memmap") == std::string("\x80\x3f\x80\x3f"));
  JsonValue sm = load_json(tmp / "copy/nested/string/meta.json");
  BOOST_TEST(*sm.find("data") == JsonValue::parse("[\"a string!\"]"));
  BOOST_TEST(sm.find("_is_non_tensor")->as_bool());
  DirNode back = be::read_dir(tmp / "copy");
  const DirNode& n2 = *back.find("nested")->child;
  BOOST_TEST(at::equal(be::map_leaf(n2.path, n2.find("int64")->leaf, false), i64));
  BOOST_TEST(at::equal(be::map_leaf(n2.path, n2.find("bfloat16")->leaf, false), bf));
}

BOOST_AUTO_TEST_CASE(rewriting_fixtures_is_byte_identical_to_python) {
  for (const auto& c : kCases) {
    BOOST_TEST_CONTEXT("fixture " << c) {
      const std::string dir = case_dir(c);
      JsonValue expected = load_json(td_test::fixture("python-written/" + c + ".expected.json"));
      DirNode root = be::read_dir(dir);
      td_test::TempDir tmp;
      const std::string out = tmp / "out";
      be::copy_tree(root, out);
      // exactly the files Python wrote (no .memmap for empty leaves, no leftover temp files), same bytes
      std::set<std::string> want;
      for (const auto& kv : expected.find("files")->as_object()) {
        want.insert(kv.first);
        BOOST_TEST(static_cast<int64_t>(td_test::read_file(out + "/" + kv.first).size()) == kv.second.find("size")->as_int(),
                   kv.first);
        BOOST_TEST(td_test::read_file(out + "/" + kv.first) == td_test::read_file(dir + "/" + kv.first), kv.first);
      }
      BOOST_TEST(list_files(out) == want);
      BOOST_TEST(list_files(dir) == want);
      // and the copy reads back to the same values
      DirNode back = be::read_dir(out);
      check_against_expected(back, expected);
    }
  }
}

// ------------------------------------------------------------------------------------------ writer
BOOST_AUTO_TEST_CASE(write_tree_round_trips_every_node_kind) {
  td_test::TempDir tmp;
  DirNode root;  // a TensorDict, batch [3]
  root.batch_size = std::vector<int64_t>{3};
  root.device = "cpu";
  std::map<std::string, at::Tensor> data;
  auto add = [&](DirNode& node, const std::string& key, const at::Tensor& t) {
    LeafMeta m;
    m.key = key;
    m.dtype = t.scalar_type();
    m.shape = t.sizes().vec();
    node.add_leaf(m);
    data[key] = t;
  };
  add(root, "f32", at::rand({3, 2}));
  add(root, "weird/key with \xc3\xa9 %", at::arange(3, at::kLong) * (int64_t{1} << 40));
  add(root, "", at::tensor({1, 0, 1}, at::kInt).to(at::kBool));
  add(root, "..", at::rand({3}, at::kDouble).to(at::kHalf));
  add(root, "empty", at::empty({3, 0}, at::kFloat));
  add(root, "c64", at::complex(at::rand({3}), at::rand({3})));
  DirNode sub;
  sub.batch_size = std::vector<int64_t>{3};
  sub.device = "cpu";
  add(sub, "bf", at::rand({3, 4}).to(at::kBFloat16));
  root.add_child("sub/dir", sub);
  DirNode ntd;
  ntd.kind = NodeKind::NonTensorData;
  ntd.type_repr = be::type_repr::kNonTensorData;
  ntd.data = JsonValue::parse("{\"x\": [1, 2.5, NaN, -Infinity, \"\\u20ac\"], \"y\": null}");
  root.add_child(".", ntd);
  DirNode nts;
  nts.kind = NodeKind::NonTensorStack;
  nts.type_repr = be::type_repr::kNonTensorStack;
  nts.data = JsonValue::parse("[\"\\u00e9\", \"b\", \"c\"]");
  root.add_child("stack", nts);
  DirNode pickled;
  pickled.kind = NodeKind::NonTensorData;
  pickled.type_repr = be::type_repr::kNonTensorData;
  pickled.pickle = JsonValue::Bytes{std::string("\x80\x04\x95\x00pickle\x00", 12)};
  root.add_child("pickled", pickled);

  auto provider = [&](const DirNode&, const LeafMeta& leaf) { return data.at(leaf.key); };
  const std::string out = tmp / "tree";
  be::write_tree(out, root, provider);

  BOOST_TEST(td_test::exists(out + "/%.memmap"));
  BOOST_TEST(td_test::exists(out + "/%2E%2E.memmap"));
  BOOST_TEST(td_test::exists(out + "/weird%2Fkey%20with%20\xc3\xa9%20%25.memmap"));
  BOOST_TEST(!td_test::exists(out + "/empty.memmap"));
  BOOST_TEST(td_test::exists(out + "/sub%2Fdir/bf.memmap"));
  BOOST_TEST(td_test::exists(out + "/%2E/meta.json"));
  BOOST_TEST(td_test::read_file(out + "/pickled/other.pickle") == pickled.pickle->data);
  // stack meta is compact + ensure_ascii, like Python's
  BOOST_TEST(td_test::read_file(out + "/stack/meta.json") ==
             "{\"_type\":\"<class 'tensordict.tensorclass.NonTensorStack'>\",\"stack_dim\":0,\"device\":null,"
             "\"data\":[\"\\u00e9\",\"b\",\"c\"]}");
  for (const auto& f : list_files(out)) BOOST_TEST(f.find(".tmp.") == std::string::npos, f);

  DirNode back = be::read_dir(out);
  BOOST_TEST(back.warnings.empty());
  BOOST_TEST_REQUIRE(back.entries.size() == root.entries.size());
  for (size_t i = 0; i < root.entries.size(); ++i) BOOST_TEST(back.entries[i].key == root.entries[i].key);
  for (const auto& e : back.entries) {
    if (!e.is_leaf) continue;
    at::Tensor t = be::map_leaf(back.path, e.leaf, false);
    const at::Tensor& want = data.at(e.key);
    BOOST_TEST(t.scalar_type() == want.scalar_type(), e.key);
    BOOST_TEST(t.sizes().vec() == want.sizes().vec(), e.key);
    BOOST_TEST(at::equal(t, want), e.key);  // bit-exact
  }
  const DirNode& sub2 = *back.find("sub/dir")->child;
  BOOST_TEST(at::equal(be::map_leaf(sub2.path, sub2.find("bf")->leaf, false), data.at("bf")));
  BOOST_TEST(*back.find(".")->child->data == *ntd.data);
  BOOST_TEST(*back.find("stack")->child->data == *nts.data);
  BOOST_TEST(back.find("stack")->child->batch_size.value() == (std::vector<int64_t>{3}));
  BOOST_TEST(back.find("pickled")->child->pickle->data == pickled.pickle->data);
  BOOST_TEST(!back.find("pickled")->child->data.has_value());

  // writing the read tree again reproduces every file byte for byte
  be::copy_tree(back, tmp / "again");
  BOOST_TEST(list_files(tmp / "again") == list_files(out));
  for (const auto& f : list_files(out)) BOOST_TEST(td_test::read_file(tmp / ("again/" + f)) == td_test::read_file(out + "/" + f), f);
}

BOOST_AUTO_TEST_CASE(lazy_stack_tensorclass_and_pickled_stack_round_trip) {
  td_test::TempDir tmp;
  // lazy stack of two TDs with heterogeneous leaf shapes, stack_dim 1
  DirNode stack;
  stack.kind = NodeKind::LazyStackedTensorDict;
  stack.type_repr = be::type_repr::kLazyStackedTensorDict;
  stack.stack_dim = 1;
  for (int i = 0; i < 2; ++i) {
    DirNode m;
    m.batch_size = std::vector<int64_t>{4};
    m.device = "cpu";
    LeafMeta leaf;
    leaf.key = "x";
    leaf.shape = {4, 2 + i};
    m.add_leaf(leaf);
    stack.add_child(std::to_string(i), m);
  }
  be::write_tree(tmp / "ls", stack, [](const DirNode&, const LeafMeta& l) { return at::ones(l.shape) * l.shape[1]; });
  BOOST_TEST(td_test::read_file(tmp / "ls/meta.json") ==
             "{\"_type\": \"<class 'tensordict._lazy.LazyStackedTensorDict'>\", \"stack_dim\": 1}");
  DirNode ls = be::read_dir(tmp / "ls");
  BOOST_TEST(ls.batch_size.value() == (std::vector<int64_t>{4, 2}));
  BOOST_TEST(be::map_leaf(ls.entries[1].child->path, ls.entries[1].child->entries[0].leaf, false).sum().item<float>() == 36.0f);

  // tensorclass with JSON fields, a pickle and its _tensordict
  DirNode tc;
  tc.kind = NodeKind::TensorClass;
  tc.type_repr = "<class 'my.mod.Rec'>";
  tc.data = JsonValue::parse("{\"name\": \"r\", \"n\": 3, \"t\": null}");
  tc.pickle = JsonValue::Bytes{"opaque"};
  DirNode inner;
  inner.batch_size = std::vector<int64_t>{2};
  inner.device = "cpu";
  LeafMeta a;
  a.key = "a";
  a.shape = {2};
  inner.add_leaf(a);
  tc.add_child("_tensordict", inner);
  be::write_tree(tmp / "tc", tc, [](const DirNode&, const LeafMeta&) { return at::tensor({1.0f, 2.0f}); });
  BOOST_TEST(td_test::read_file(tmp / "tc/meta.json") ==
             "{\"_type\": \"<class 'my.mod.Rec'>\", \"name\": \"r\", \"n\": 3, \"t\": null}");
  DirNode tc2 = be::read_dir(tmp / "tc");
  BOOST_TEST((tc2.kind == NodeKind::TensorClass));
  BOOST_TEST(*tc2.data == *tc.data);
  BOOST_TEST(tc2.pickle->data == "opaque");
  BOOST_TEST(tc2.batch_size.value() == (std::vector<int64_t>{2}));

  // NonTensorStack whose data was pickled
  DirNode ps;
  ps.kind = NodeKind::NonTensorStack;
  ps.type_repr = be::type_repr::kNonTensorStack;
  ps.device = "cpu";
  ps.pickle = JsonValue::Bytes{"PK"};
  be::write_tree(tmp / "ps", ps, {});
  BOOST_TEST(td_test::read_file(tmp / "ps/pickle.pkl") == "PK");
  DirNode ps2 = be::read_dir(tmp / "ps");
  BOOST_TEST(!ps2.data.has_value());
  BOOST_TEST(ps2.pickle->data == "PK");
  BOOST_TEST(ps2.device.value() == "cpu");
}

BOOST_AUTO_TEST_CASE(nested_leaves_round_trip) {
  td_test::TempDir tmp;
  fs::create_directories(tmp / "n");
  std::vector<at::Tensor> comps = {at::arange(6, at::kFloat).reshape({2, 3}), at::arange(3, at::kFloat).reshape({1, 3}) + 100};
  LeafMeta m = be::write_nested_leaf(tmp / "n", "rag ged", comps);
  BOOST_TEST(m.is_nested);
  BOOST_TEST(m.shape == (std::vector<int64_t>{2, 2}));
  BOOST_TEST(m.numel() == 9);
  DirNode node;
  node.batch_size = std::vector<int64_t>{2};
  node.device = "cpu";
  node.add_leaf(m);
  be::write_meta(tmp / "n", node);
  BOOST_TEST(td_test::exists(tmp / "n/rag%20ged.shape.memmap"));
  DirNode back = be::read_dir(tmp / "n");
  const LeafMeta& l = back.entries.at(0).leaf;
  BOOST_TEST(l.nested_sizes == (std::vector<std::vector<int64_t>>{{2, 3}, {1, 3}}));
  auto parts = be::map_nested_leaf(back.path, l, false);
  BOOST_TEST_REQUIRE(parts.size() == 2u);
  BOOST_TEST(at::equal(parts[0], comps[0]));
  BOOST_TEST(at::equal(parts[1], comps[1]));
  BOOST_TEST(be::map_leaf(back.path, l, false).sizes().vec() == (std::vector<int64_t>{9}));
  td_test::check_throws<ValueError>([&] { be::map_nested_leaf(back.path, LeafMeta{}, false); },
                                    {"not nested"});
  td_test::check_throws<ValueError>(
      [&] { be::write_nested_leaf(tmp / "n", "bad", {at::ones({2}), at::ones({2, 2})}); }, {"differ"});
  // copy_tree handles nested leaves too
  be::copy_tree(back, tmp / "n2");
  DirNode back2 = be::read_dir(tmp / "n2");
  BOOST_TEST(at::equal(be::map_nested_leaf(back2.path, back2.entries[0].leaf, false)[1], comps[1]));
  // truncated sizes file
  {
    std::string p = tmp / "n/rag%20ged.shape.memmap";
    std::string bytes = td_test::read_file(p);
    td_test::write_text(p, bytes.substr(0, 20));
    td_test::check_throws<FormatError>([&] { be::read_dir(tmp / "n"); }, {p, "expected at least 32 bytes"});
  }
}

BOOST_AUTO_TEST_CASE(writer_refuses_bad_keys_dtypes_and_symlinks) {
  td_test::TempDir tmp;
  for (const char* reserved : {"shape", "device", "_type"}) {
    DirNode n;
    LeafMeta l;
    l.key = reserved;
    n.add_leaf(l);
    td_test::check_throws<ValueError>([&] { be::make_meta(n); }, {"collides", reserved});
  }
  {
    DirNode n;
    n.add_child("meta.json", DirNode());
    td_test::check_throws<ValueError>([&] { be::make_meta(n); }, {"meta.json"});
  }
  {
    DirNode n;
    LeafMeta l;
    l.key = "k";
    n.add_leaf(l);
    n.add_child("k.memmap", DirNode());
    td_test::check_throws<ValueError>([&] { be::make_meta(n); }, {"collides"});
  }
  {
    DirNode n;
    LeafMeta l;
    l.key = "k";
    n.add_leaf(l);
    n.add_leaf(l);
    td_test::check_throws<ValueError>([&] { be::make_meta(n); }, {"duplicate key"});
  }
  {
    DirNode n;
    LeafMeta l;
    l.key = "k";
    l.is_nested = true;
    n.add_leaf(l);
    l.key = "k.shape";
    l.is_nested = false;
    n.add_leaf(l);
    td_test::check_throws<ValueError>([&] { be::make_meta(n); }, {"collides"});
  }
  td_test::check_throws<ValueError>(
      [&] { be::write_leaf(tmp.path, "q", at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQUInt8)); }, {"cannot be stored"});
  td_test::check_throws<ValueError>([&] { be::write_leaf(tmp.path, "u", at::Tensor()); }, {"undefined"});
  // a symlink where a leaf file goes is refused, its target untouched
  td_test::write_text(tmp / "victim", "keep");
  BOOST_TEST_REQUIRE(::symlink((tmp / "victim").c_str(), (tmp / "x.memmap").c_str()) == 0);
  td_test::check_throws<ValueError>([&] { be::write_leaf(tmp.path, "x", at::ones({2})); }, {"symlink"});
  BOOST_TEST(td_test::read_file(tmp / "victim") == "keep");
  // a symlinked target directory too
  fs::create_directories(tmp / "real");
  BOOST_TEST_REQUIRE(::symlink((tmp / "real").c_str(), (tmp / "linkdir").c_str()) == 0);
  DirNode n;
  td_test::check_throws<ValueError>([&] { be::write_tree(tmp / "linkdir", n, {}); }, {"symlink"});
  // the provider must return what the leaf declares
  DirNode d;
  LeafMeta l;
  l.key = "a";
  l.shape = {2};
  d.add_leaf(l);
  td_test::check_throws<ValueError>(
      [&] { be::write_tree(tmp / "w", d, [](const DirNode&, const LeafMeta&) { return at::ones({3}); }); }, {"declared as"});
  // empty leaves leave no file (and remove a stale one)
  td_test::write_text(tmp / "e.memmap", "stale");
  LeafMeta em = be::write_leaf(tmp.path, "e", at::empty({0, 3}));
  BOOST_TEST(em.file.empty());
  BOOST_TEST(!td_test::exists(tmp / "e.memmap"));
  // write_tree into a path whose parent is a file
  td_test::write_text(tmp / "afile", "x");
  td_test::check_throws<BackendError>([&] { be::write_tree(tmp / "afile/sub", DirNode(), {}); }, {"not a directory"});
}

BOOST_AUTO_TEST_CASE(write_meta_is_atomic_and_replaces) {
  td_test::TempDir tmp;
  be::write_meta(tmp.path, JsonValue::parse("{\"a\": 1}"));
  BOOST_TEST(td_test::read_file(tmp / "meta.json") == "{\"a\": 1}");
  be::write_meta(tmp.path, JsonValue::parse("{\"b\": [1.5, NaN]}"), JsonValue::Style::Compact);
  BOOST_TEST(td_test::read_file(tmp / "meta.json") == "{\"b\":[1.5,NaN]}");
  BOOST_TEST(list_files(tmp.path) == (std::set<std::string>{"meta.json"}));  // no temp file left
  // a meta.json symlink is replaced, never written through
  td_test::write_text(tmp / "victim", "keep");
  fs::remove(tmp / "meta.json");
  BOOST_TEST_REQUIRE(::symlink((tmp / "victim").c_str(), (tmp / "meta.json").c_str()) == 0);
  be::write_meta(tmp.path, JsonValue::parse("{}"));
  BOOST_TEST(td_test::read_file(tmp / "victim") == "keep");
  BOOST_TEST(!fs::is_symlink(tmp / "meta.json"));
  td_test::check_throws<BackendError>([&] { be::write_meta(tmp / "missing-dir", JsonValue::object()); }, {"cannot create"});
  td_test::check_throws<ValueError>([&] { be::write_meta(tmp.path, JsonValue(std::string("\xff"))); }, {"UTF-8"});
  BOOST_TEST(td_test::read_file(tmp / "meta.json") == "{}");  // untouched by the failed write
}

// ------------------------------------------------------------------------------------------ tolerant reading
BOOST_AUTO_TEST_SUITE_END()
