// libFuzzer target for the meta.json reader and the memmap directory loader.
// Input: root meta.json bytes, optionally followed by 0x01 and a child meta.json (written to s/ and 0/).
// Invariants checked: parsing never crashes; a parsed value re-prints in every style and parses back equal;
// read_dir/map_leaf either succeed or throw a tensordict::Error.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace {

std::string scratch_dir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/td-fuzz-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (!p) std::abort();
    std::string d = p;
    ::mkdir((d + "/s").c_str(), 0755);
    ::mkdir((d + "/0").c_str(), 0755);
    std::ofstream(d + "/x.memmap", std::ios::binary) << std::string(64, '\x01');
    std::ofstream(d + "/a.memmap", std::ios::binary) << std::string(3, '\x02');
    std::ofstream(d + "/s/x.memmap", std::ios::binary) << std::string(16, '\x03');
    return d;
  }();
  return dir;
}

void put(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }

void check_json(const std::string& text) {
  tensordict::JsonValue v;
  try {
    v = tensordict::JsonValue::parse(text);
  } catch (const tensordict::FormatError&) {
    return;
  }
  using Style = tensordict::JsonValue::Style;
  for (Style st : {Style::Compact, Style::Python, Style::PythonCompact}) {
    std::string out = v.dump(st);  // parse validated UTF-8, so this cannot throw
    if (!(tensordict::JsonValue::parse(out) == v)) std::abort();
  }
}

void walk(const tensordict::backends::DirNode& node) {
  namespace be = tensordict::backends;
  for (const auto& e : node.entries) {
    if (e.is_leaf) {
      at::Tensor t = be::map_leaf(node.path, e.leaf, /*writable=*/false);
      if (t.numel() > 0) (void)t.reshape({-1})[0];
      if (e.leaf.is_nested) (void)be::map_nested_leaf(node.path, e.leaf, false);
    } else {
      walk(*e.child);
    }
  }
  (void)be::make_meta(node);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  std::string root = input, child;
  if (auto cut = input.find('\x01'); cut != std::string::npos) {
    root = input.substr(0, cut);
    child = input.substr(cut + 1);
  }
  check_json(root);
  const std::string dir = scratch_dir();
  put(dir + "/meta.json", root);
  put(dir + "/s/meta.json", child);
  put(dir + "/0/meta.json", child);
  try {
    auto node = tensordict::backends::read_dir(dir);
    walk(node);
  } catch (const tensordict::Error&) {
  }
  return 0;
}
