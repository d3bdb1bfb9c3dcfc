#pragma once
// Helpers shared by the backends test suites: temp dirs under the build dir, file I/O, fixture paths.
#include <boost/test/unit_test.hpp>

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace td_test {

//! A fresh directory under TD_BINARY_DIR/test-tmp, removed (recursively) on destruction.
struct TempDir {
  std::string path;
  TempDir() {
    std::string base = std::string(TD_BINARY_DIR) + "/test-tmp";
    std::filesystem::create_directories(base);
    std::string tmpl = base + "/backends-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    BOOST_TEST_REQUIRE(p != nullptr, "mkdtemp failed under " << base);
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  BOOST_TEST_REQUIRE(static_cast<bool>(in), "cannot open " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  BOOST_TEST_REQUIRE(static_cast<bool>(out), "cannot write " << p);
  out << text;
}

inline bool exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

//! shared/fixtures/<rel>; FAILS the test (never skips) when the fixture is missing.
inline std::string fixture(const std::string& rel) {
  std::string p = std::string(TD_SHARED_DIR) + "/fixtures/" + rel;
  BOOST_TEST_REQUIRE(exists(p), "fixture missing: " << p << " (TD_SHARED_DIR=" << TD_SHARED_DIR << ")");
  return p;
}

//! Runs `f` and checks it throws E whose message contains every one of `needles`.
template <class E, class F>
void check_throws(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
  } catch (const E& e) {
    std::string msg = e.what();
    for (const auto& n : needles) BOOST_TEST(msg.find(n) != std::string::npos, "message '" << msg << "' lacks '" << n << "'");
    return;
  } catch (const std::exception& e) {
    BOOST_ERROR("wrong exception type: " << e.what());
    return;
  }
  BOOST_ERROR("no exception thrown");
}

}  // namespace td_test
