// Messages a user sees never name the library's internal classes or source files (issue 35 item 19): every string
// literal in the library's sources (backends, engine, actors, api with tdx, config) is scanned for the names of
// internal classes (store and node implementations, actor clients, *Impl) and for source file names. A message names
// what a user knows instead: the upstream class (TensorDictStore, LazyStackedTensorDictStore, PersistentTensorDict)
// and the call they made. Public headers a message may point to ("<tensordict/tensordict.hpp>") are allowed.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

//! the repository root: this file is <root>/tests/backends/test_user_messages.cpp
fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

//! the string literals of one line of C++ ("" pieces of a line that is not an #include nor a // comment)
std::vector<std::string> literals_of(const std::string& line) {
  std::vector<std::string> out;
  const auto first = line.find_first_not_of(" \t");
  if (first == std::string::npos || line.compare(first, 8, "#include") == 0 || line.compare(first, 2, "//") == 0)
    return out;
  bool in = false;
  std::string cur;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (!in) {
      if (c == '\'' && i + 2 < line.size()) {  // a char literal: '"' or '\"' is no string
        i += line[i + 1] == '\\' ? 3 : 2;
        continue;
      }
      if (c == '/' && i + 1 < line.size() && line[i + 1] == '/') break;  // a trailing comment
      if (c == '"') {
        in = true;
        cur.clear();
      }
      continue;
    }
    if (c == '\\' && i + 1 < line.size()) {
      cur += line[++i];
      continue;
    }
    if (c == '"') {
      in = false;
      out.push_back(cur);
      continue;
    }
    cur += c;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(user_messages)

BOOST_AUTO_TEST_CASE(literals_name_no_internal_class_nor_source_file) {
  const fs::path root = repo_root();
  BOOST_REQUIRE_MESSAGE(fs::exists(root / "backends" / "src"), "sources not found under " << root);
  const std::regex internal(
      R"(\b(RedisLazyStackStore|RedisStore|H5Store|RemoteNode|RemoteTree|DenseNode|StoreNode|LazyStackNode|)"
      R"(MemmapNode|LeafStore\w*|StoreBackend|\w+Impl)\b)");
  const std::regex source_file(R"((^|[^/\w])\w+\.(cpp|hpp|cc|h)\b)");  // "tensordict/x.hpp" is a public header
  std::vector<std::string> found;
  size_t scanned = 0;
  for (const char* dir : {"backends", "engine", "actors", "api", "config"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp")) continue;
      std::ifstream in(e.path());
      int n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        for (const auto& lit : literals_of(line)) {
          ++scanned;
          if (std::regex_search(lit, internal) || std::regex_search(lit, source_file))
            found.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n) + ": \"" + lit + "\"");
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("scanned " << scanned << " string literals");
  BOOST_TEST(scanned > 1000u);
  std::string all;
  for (const auto& f : found) all += "\n  " + f;
  BOOST_TEST(found.empty(), "messages naming internal classes or source files:" << all);
}

// the scanner itself: a literal after an escaped quote, a char literal and a comment are read as the compiler does
BOOST_AUTO_TEST_CASE(the_scanner_reads_literals_as_the_compiler_does) {
  const auto l = literals_of(R"(  throw KeyError("a \"RemoteNode\" b" + c + '"' + "x.cpp"); // "H5Store")");
  BOOST_REQUIRE(l.size() == 2u);
  BOOST_TEST(l[0] == "a \"RemoteNode\" b");
  BOOST_TEST(l[1] == "x.cpp");
  BOOST_TEST(literals_of("#include \"h5_internal.hpp\"").empty());
  BOOST_TEST(literals_of("  // \"RedisStore\"").empty());
}

BOOST_AUTO_TEST_SUITE_END()
