#pragma once
// Helpers of the memmap format suites (backends.memmap_format, backends.memmap_format_reader).
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

// each suite uses a part of these helpers
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
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
#pragma GCC diagnostic pop
