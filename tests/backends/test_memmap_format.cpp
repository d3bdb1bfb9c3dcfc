// Python tensordict's memmap directory format: fixtures written by Python v0.14 and the upstream artifact
// are read and compared with their .expected.json; the writer reproduces Python's bytes; bad input fails cleanly.
#include <boost/test/unit_test.hpp>

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "backends_test_util.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace be = tensordict::backends;
namespace fs = std::filesystem;
using be::DirNode;
using be::LeafMeta;
using be::NodeKind;
using tensordict::BackendError;
using tensordict::FormatError;
using tensordict::JsonValue;
using tensordict::ValueError;

namespace {

const std::vector<std::string> kCases = {"a_flat",     "b_nested", "c_non_tensor", "d_dtypes", "e_empty",
                                         "f_lazy_stack", "g_tensorclass", "h_zero_dim", "j_memmap_like"};

JsonValue load_json(const std::string& p) { return JsonValue::parse(td_test::read_file(p)); }

std::vector<int64_t> ints(const JsonValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int());
  return out;
}

std::vector<std::string> strs(const JsonValue& v) {
  std::vector<std::string> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_string());
  return out;
}

std::string join_key(const std::vector<std::string>& k) {
  std::string s;
  for (const auto& p : k) s += (s.empty() ? "" : "/") + p;
  return "[" + s + "]";
}

//! Compares a tensor's row-major values with a JSON list, exactly (bool, int64 and float kinds).
void check_values(const at::Tensor& t, const JsonValue& values, const std::string& what) {
  at::Tensor flat = t.reshape({-1}).contiguous();
  const auto& vals = values.as_array();
  BOOST_TEST_REQUIRE(flat.numel() == static_cast<int64_t>(vals.size()), what << ": element count");
  if (t.scalar_type() == at::kBool) {
    auto acc = flat.accessor<bool, 1>();
    for (size_t i = 0; i < vals.size(); ++i) BOOST_TEST(acc[i] == vals[i].as_bool(), what << "[" << i << "]");
  } else if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    at::Tensor l = flat.to(at::kLong);
    auto acc = l.accessor<int64_t, 1>();
    for (size_t i = 0; i < vals.size(); ++i) BOOST_TEST(acc[i] == vals[i].as_int(), what << "[" << i << "]");
  } else {
    at::Tensor d = flat.to(at::kDouble);
    auto acc = d.accessor<double, 1>();
    for (size_t i = 0; i < vals.size(); ++i) BOOST_TEST(acc[i] == vals[i].as_double(), what << "[" << i << "]");
  }
}

struct Found {
  std::string kind;  // tensor / non_tensor / non_tensor_stack
  const DirNode* node = nullptr;  // owner of the leaf, or the non-tensor node itself
  const LeafMeta* leaf = nullptr;
  std::vector<int64_t> parent_batch;
};

struct SubTd {
  std::vector<std::string> key;
  std::string type;
  std::vector<int64_t> batch;
};

//! Flattens a TD-like node the way the .expected.json files describe a loaded tree.
void collect(const DirNode& node, const std::vector<std::string>& prefix, std::map<std::vector<std::string>, Found>& leaves,
             std::vector<SubTd>& subs) {
  const DirNode* td = &node;
  if (node.kind == NodeKind::TensorClass) {
    const auto* e = node.find("_tensordict");
    BOOST_TEST_REQUIRE(e != nullptr);
    td = e->child.get();
  }
  for (const auto& e : td->entries) {
    auto path = prefix;
    path.push_back(e.key);
    if (e.is_leaf) {
      leaves[path] = Found{"tensor", td, &e.leaf, td->batch_size.value()};
      continue;
    }
    const DirNode& c = *e.child;
    switch (c.kind) {
      case NodeKind::TensorDict:
        subs.push_back({path, "TensorDict", c.batch_size.value()});
        collect(c, path, leaves, subs);
        break;
      case NodeKind::NonTensorData: leaves[path] = Found{"non_tensor", &c, nullptr, td->batch_size.value()}; break;
      case NodeKind::NonTensorStack: leaves[path] = Found{"non_tensor_stack", &c, nullptr, td->batch_size.value()}; break;
      default: BOOST_ERROR("unexpected child kind " << be::node_kind_name(c.kind) << " at " << join_key(path));
    }
  }
}

//! Checks the leaves of a TD-like node against an expected "leaves" list (by key path).
void check_leaves(const DirNode& node, const JsonValue& expected_leaves, const JsonValue* expected_subs) {
  std::map<std::vector<std::string>, Found> leaves;
  std::vector<SubTd> subs;
  collect(node, {}, leaves, subs);
  BOOST_TEST(leaves.size() == expected_leaves.as_array().size());
  for (const auto& exp : expected_leaves.as_array()) {
    auto key = strs(*exp.find("key"));
    const std::string what = join_key(key);
    auto it = leaves.find(key);
    BOOST_TEST_REQUIRE((it != leaves.end()), "leaf " << what << " not found");
    const Found& f = it->second;
    const std::string kind = exp.find("kind")->as_string();
    BOOST_TEST(f.kind == kind, what);
    if (kind == "tensor") {
      BOOST_TEST(be::dtype_to_string(f.leaf->dtype) == exp.find("dtype")->as_string(), what);
      BOOST_TEST(f.leaf->shape == ints(*exp.find("shape")), what);
      at::Tensor t = be::map_leaf(f.node->path, *f.leaf, /*writable=*/false);
      BOOST_TEST(t.sizes().vec() == f.leaf->shape, what);
      BOOST_TEST(t.scalar_type() == f.leaf->dtype, what);
      check_values(t, *exp.find("values"), what);
    } else {
      BOOST_TEST_REQUIRE(f.node->data.has_value(), what);
      BOOST_TEST(*f.node->data == *exp.find("data"), what << ": " << *f.node->data << " vs " << *exp.find("data"));
      const auto bs = ints(*exp.find("batch_size"));
      if (kind == "non_tensor")
        BOOST_TEST(f.parent_batch == bs, what);  // NonTensorData takes the parent's batch size
      else
        BOOST_TEST(f.node->batch_size.value() == bs, what);
    }
  }
  if (expected_subs) {
    BOOST_TEST(subs.size() == expected_subs->as_array().size());
    for (const auto& exp : expected_subs->as_array()) {
      auto key = strs(*exp.find("key"));
      bool found = false;
      for (const auto& s : subs)
        if (s.key == key) {
          found = true;
          BOOST_TEST(s.type == exp.find("type")->as_string());
          BOOST_TEST(s.batch == ints(*exp.find("batch_size")), join_key(key));
        }
      BOOST_TEST(found, "sub-tensordict " << join_key(key));
    }
  }
}

//! Checks a read tree against a fixture's .expected.json.
void check_against_expected(const DirNode& root, const JsonValue& expected) {
  const JsonValue& st = *expected.find("structure");
  const std::string type = st.find("type")->as_string();
  BOOST_TEST(root.batch_size.value() == ints(*st.find("batch_size")));
  if (type == "LazyStackedTensorDict") {
    BOOST_TEST_REQUIRE((root.kind == NodeKind::LazyStackedTensorDict));
    BOOST_TEST(root.stack_dim == st.find("stack_dim")->as_int());
    const auto& tds = st.find("tensordicts")->as_array();
    BOOST_TEST_REQUIRE(root.entries.size() == tds.size());
    for (size_t i = 0; i < tds.size(); ++i) {
      BOOST_TEST(root.entries[i].key == std::to_string(i));
      const DirNode& c = *root.entries[i].child;
      BOOST_TEST(be::default_child_type(c) == tds[i].find("type")->as_string());
      BOOST_TEST(c.batch_size.value() == ints(*tds[i].find("batch_size")));
      check_leaves(c, *tds[i].find("leaves"), tds[i].find("sub_tensordicts"));
    }
    return;
  }
  if (type == "TensorDict")
    BOOST_TEST((root.kind == NodeKind::TensorDict));
  else
    BOOST_TEST((root.kind == NodeKind::TensorClass));
  BOOST_TEST(be::default_child_type(root) == type);
  check_leaves(root, *expected.find("leaves"), st.find("sub_tensordicts"));
}

//! Relative paths of every file below `dir`.
std::set<std::string> list_files(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

std::string case_dir(const std::string& c) { return td_test::fixture("python-written/" + c); }

const char* kTd = "\"shape\": [2], \"device\": \"cpu\", \"_type\": \"<class 'tensordict._td.TensorDict'>\"";

//! A scratch TD directory with the given meta.json text.
std::string make_dir(const td_test::TempDir& tmp, const std::string& name, const std::string& meta) {
  std::string d = tmp / name;
  fs::create_directories(d);
  td_test::write_text(d + "/meta.json", meta);
  return d;
}

}  // namespace

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
