#pragma once
// Helpers for tests that read ../shared/fixtures (found through the TD_SHARED_DIR compile definition).
// A missing fixture directory FAILS the test: a skipped fixture test proves nothing.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <boost/test/unit_test.hpp>

#include "tensordict/backends/json_value.hpp"

namespace fixtures {

inline std::string shared_dir() { return TD_SHARED_DIR; }
inline std::string python_written(const std::string& name) { return shared_dir() + "/fixtures/python-written/" + name; }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(f.good(), "missing fixture file " << path << " (TD_SHARED_DIR=" << TD_SHARED_DIR << ")");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline tensordict::JsonValue read_json(const std::string& path) { return tensordict::JsonValue::parse(read_file(path)); }

//! a fresh empty directory under the build dir, removed by the destructor
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    std::string base = std::string(TD_BINARY_DIR) + "/test-tmp";
    std::filesystem::create_directories(base);
    std::string tmpl = base + "/" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = mkdtemp(buf.data());
    BOOST_REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

//! numbers compare as doubles (ints and exact float values alike); NaN equals NaN
inline bool json_equal_numeric(const tensordict::JsonValue& a, const tensordict::JsonValue& b) {
  using K = tensordict::JsonValue::Kind;
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x == y || (x != x && y != y);
  }
  if (a.kind() != b.kind()) return false;
  if (a.kind() == K::Array) {
    const auto& x = a.as_array();
    const auto& y = b.as_array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!json_equal_numeric(x[i], y[i])) return false;
    return true;
  }
  if (a.kind() == K::Object) {
    const auto& x = a.as_object();
    const auto& y = b.as_object();
    if (x.size() != y.size()) return false;
    for (const auto& kv : x) {
      const auto* other = b.find(kv.first);
      if (!other || !json_equal_numeric(kv.second, *other)) return false;
    }
    return true;
  }
  return a == b;
}

//! finds the entry of `arr` whose "key" equals `key`
inline const tensordict::JsonValue* find_by_key(const tensordict::JsonValue& arr, const tensordict::JsonValue& key) {
  for (const auto& e : arr.as_array()) {
    const auto* k = e.find("key");
    if (k && *k == key) return &e;
  }
  return nullptr;
}

//! compares a describe() result with an expected.json (leaves and sub-TensorDicts by key, not order)
inline void check_described(const tensordict::JsonValue& got, const tensordict::JsonValue& want, const std::string& ctx) {
  BOOST_TEST_CONTEXT(ctx) {
    BOOST_TEST(*got.find("loaded_type") == *want.find("loaded_type"));
    const auto& gs = *got.find("structure");
    const auto& ws = *want.find("structure");
    BOOST_TEST(*gs.find("type") == *ws.find("type"));
    BOOST_TEST(json_equal_numeric(*gs.find("batch_size"), *ws.find("batch_size")));
    auto check_leaves = [&](const tensordict::JsonValue& gl, const tensordict::JsonValue& wl) {
      BOOST_TEST(gl.as_array().size() == wl.as_array().size());
      for (const auto& w : wl.as_array()) {
        const auto* g = find_by_key(gl, *w.find("key"));
        BOOST_TEST_REQUIRE(g != nullptr, "missing leaf " << w.find("key")->dump());
        for (const auto& field : w.as_object()) {
          const auto* gf = g->find(field.first);
          BOOST_TEST_REQUIRE(gf != nullptr, "leaf " << w.find("key")->dump() << " lacks " << field.first);
          BOOST_TEST(json_equal_numeric(*gf, field.second),
                     "leaf " << w.find("key")->dump() << " field " << field.first << ": got " << gf->dump()
                             << " want " << field.second.dump());
        }
      }
    };
    if (const auto* wt = ws.find("tensordicts")) {
      BOOST_TEST(json_equal_numeric(*gs.find("stack_dim"), *ws.find("stack_dim")));
      const auto& gt = *gs.find("tensordicts");
      BOOST_TEST_REQUIRE(gt.as_array().size() == wt->as_array().size());
      for (size_t i = 0; i < gt.as_array().size(); ++i) {
        BOOST_TEST(json_equal_numeric(*gt.as_array()[i].find("batch_size"), *wt->as_array()[i].find("batch_size")));
        check_leaves(*gt.as_array()[i].find("leaves"), *wt->as_array()[i].find("leaves"));
      }
      return;
    }
    const auto& wsub = *ws.find("sub_tensordicts");
    const auto& gsub = *gs.find("sub_tensordicts");
    BOOST_TEST(gsub.as_array().size() == wsub.as_array().size());
    for (const auto& w : wsub.as_array()) {
      const auto* g = find_by_key(gsub, *w.find("key"));
      BOOST_TEST_REQUIRE(g != nullptr, "missing sub-TensorDict " << w.find("key")->dump());
      BOOST_TEST(json_equal_numeric(*g->find("batch_size"), *w.find("batch_size")));
    }
    check_leaves(*got.find("leaves"), *want.find("leaves"));
  }
}

}  // namespace fixtures
