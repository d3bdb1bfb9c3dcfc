// Python tensordict's memmap directory format: dtype strings, key encoding, the generic tree (DirNode,
// LeafMeta). Reading (meta.json, directories by fd, leaf mapping): memmap_read.cpp; writing:
// memmap_write.cpp; staging directories: memmap_staging.cpp.
#include "tensordict/backends/memmap_format.hpp"
#include "memmap_format_internal.hpp"

#include <cctype>
#include <cstring>
#include <limits>

#include "tensordict/errors.hpp"

namespace tensordict::backends {

// ------------------------------------------------------------------------------------------ dtypes
namespace {
struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"torch.bool", at::kBool},          {"torch.uint8", at::kByte},
    {"torch.int8", at::kChar},          {"torch.int16", at::kShort},
    {"torch.int32", at::kInt},          {"torch.int64", at::kLong},
    {"torch.float16", at::kHalf},       {"torch.bfloat16", at::kBFloat16},
    {"torch.float32", at::kFloat},      {"torch.float64", at::kDouble},
    {"torch.complex32", at::kComplexHalf}, {"torch.complex64", at::kComplexFloat},
    {"torch.complex128", at::kComplexDouble},
};
}  // namespace

std::string dtype_to_string(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype) return d.name;
  throw ValueError(std::string("dtype ") + c10::toString(dtype) + " cannot be stored in a memmap directory");
}

std::optional<at::ScalarType> dtype_from_string(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
}

// ------------------------------------------------------------------------------------------ keys
namespace {
bool must_escape(unsigned char c) {
  return c < 0x20 || c == 0x7F || std::strchr("/<>:\"|?*\\ %", c) != nullptr;
}
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string encode_key(const std::string& key) {
  if (key.empty()) return "%";
  if (key == ".") return "%2E";
  if (key == "..") return "%2E%2E";
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (must_escape(c)) {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 0xF];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string decode_key(const std::string& name) {
  if (name == "%") return "";
  std::string out;
  out.reserve(name.size());
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out += name[i];
      continue;
    }
    int hi = (i + 1 < name.size()) ? hex_value(name[i + 1]) : -1;
    int lo = (i + 2 < name.size()) ? hex_value(name[i + 2]) : -1;
    if (hi < 0 || lo < 0)
      throw ValueError("decode_key: malformed escape at offset " + std::to_string(i) + " in '" + name + "'");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

bool is_safe_legacy_key(const std::string& key, bool directory) {
  if (key.find('/') != std::string::npos || key.find('\\') != std::string::npos) return false;
  if (key.find('\0') != std::string::npos) return false;
  if (key.size() >= 2 && std::isalpha(static_cast<unsigned char>(key[0])) && key[1] == ':') return false;
  if (directory && (key.empty() || key == "." || key == "..")) return false;
  return true;
}

// ------------------------------------------------------------------------------------------ nodes
const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::TensorDict: return "TensorDict";
    case NodeKind::LazyStackedTensorDict: return "LazyStackedTensorDict";
    case NodeKind::NonTensorData: return "NonTensorData";
    case NodeKind::NonTensorStack: return "NonTensorStack";
    case NodeKind::TensorClass: return "TensorClass";
    case NodeKind::Other: return "Other";
  }
  return "?";
}

NodeKind classify_type(const std::string& t) {
  if (t == type_repr::kTensorDict || t == type_repr::kPersistentTensorDict) return NodeKind::TensorDict;
  if (t == type_repr::kLazyStackedTensorDict) return NodeKind::LazyStackedTensorDict;
  if (t == type_repr::kNonTensorData || t == type_repr::kMetaData) return NodeKind::NonTensorData;
  if (t == type_repr::kNonTensorStack) return NodeKind::NonTensorStack;
  if (t.rfind("<class 'tensordict.", 0) == 0) return NodeKind::Other;
  return NodeKind::TensorClass;
}

namespace memmap_detail {

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (n > std::numeric_limits<int64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace memmap_detail

using memmap_detail::checked_numel;

int64_t LeafMeta::numel() const {
  if (is_nested) {
    int64_t total = 0;
    for (const auto& row : nested_sizes) total += checked_numel(row).value_or(0);
    return total;
  }
  return checked_numel(shape).value_or(0);
}

int64_t LeafMeta::nbytes() const { return numel() * static_cast<int64_t>(c10::elementSize(dtype)); }

const DirEntry* DirNode::find(const std::string& key) const {
  for (const auto& e : entries)
    if (e.key == key) return &e;
  return nullptr;
}

DirEntry& DirNode::add_leaf(LeafMeta leaf) {
  DirEntry e;
  e.key = leaf.key;
  e.name = leaf.file.empty() ? encode_key(leaf.key) + ".memmap" : leaf.file;
  e.is_leaf = true;
  e.leaf = std::move(leaf);
  entries.push_back(std::move(e));
  return entries.back();
}

DirEntry& DirNode::add_child(const std::string& key, DirNode child, std::string type) {
  return add_child(key, std::make_shared<DirNode>(std::move(child)), std::move(type));
}

DirEntry& DirNode::add_child(const std::string& key, std::shared_ptr<DirNode> child, std::string type) {
  DirEntry e;
  e.key = key;
  e.name = encode_key(key);
  e.is_leaf = false;
  e.type = type.empty() ? default_child_type(*child) : std::move(type);
  e.child = std::move(child);
  entries.push_back(std::move(e));
  return entries.back();
}

std::string default_child_type(const DirNode& child) {
  switch (child.kind) {
    case NodeKind::TensorDict: return "TensorDict";
    case NodeKind::LazyStackedTensorDict: return "LazyStackedTensorDict";
    case NodeKind::NonTensorData:
      return child.type_repr == type_repr::kMetaData ? "MetaData" : "NonTensorData";
    case NodeKind::NonTensorStack: return "NonTensorStack";
    case NodeKind::TensorClass:
    case NodeKind::Other: {
      // "<class 'pkg.mod.Name'>" -> "Name"
      std::string t = child.type_repr;
      auto q1 = t.find('\'');
      auto q2 = t.rfind('\'');
      if (q1 != std::string::npos && q2 != std::string::npos && q2 > q1) t = t.substr(q1 + 1, q2 - q1 - 1);
      auto dot = t.rfind('.');
      return dot == std::string::npos ? t : t.substr(dot + 1);
    }
  }
  return "TensorDict";
}

}  // namespace tensordict::backends
