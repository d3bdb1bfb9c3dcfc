// Python tensordict's memmap directory format: dtype strings, key encoding, read_dir, writers.
#include "tensordict/backends/memmap_format.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>
#include <unordered_set>

#include "tensordict/backends/memmap_file.hpp"
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

namespace {
//! numel of a shape with overflow detection; nullopt on overflow.
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
}  // namespace

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
  DirEntry e;
  e.key = key;
  e.name = encode_key(key);
  e.is_leaf = false;
  e.type = type.empty() ? default_child_type(child) : std::move(type);
  e.child = std::make_shared<DirNode>(std::move(child));
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

// ------------------------------------------------------------------------------------------ read
namespace {

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

enum class FileKind { Missing, Regular, Directory, Symlink, Other };
FileKind kind_of(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return FileKind::Regular;
  if (S_ISDIR(st.st_mode)) return FileKind::Directory;
  if (S_ISLNK(st.st_mode)) return FileKind::Symlink;
  return FileKind::Other;
}
//! The kind of `rel` below the directory `dfd` (AT_FDCWD: a path) itself (Symlink for a symlink), or of its
//! target when `follow` (a dangling symlink is then Missing).
FileKind entry_kind_at(int dfd, const std::string& rel, bool follow, int64_t* size = nullptr) {
  struct stat st;
  if (::fstatat(dfd, rel.c_str(), &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0) return FileKind::Missing;
  if (size) *size = static_cast<int64_t>(st.st_size);
  return kind_of(st);
}

[[noreturn]] void refuse_symlink(const std::string& p) {
  throw FormatError("'" + p + "' is a symlink: refused (follow_symlinks allows it)");
}
[[noreturn]] void refuse_not_regular(const std::string& p) {
  throw FormatError("'" + p + "' is not a regular file");
}

//! Reads a whole regular file; nullopt if it does not exist. Never blocks on a fifo (the type is checked
//! before the non-blocking open and again on the fd). BackendError on other I/O errors.
//! `rel` is opened below the directory `dfd` (AT_FDCWD: a path); `p` names it in messages.
std::optional<std::string> read_whole_at(int dfd, const std::string& rel, const std::string& p, bool follow) {
  FileKind k = entry_kind_at(dfd, rel, follow);
  if (k == FileKind::Missing) return std::nullopt;
  if (k == FileKind::Symlink) refuse_symlink(p);
  if (k != FileKind::Regular) refuse_not_regular(p);
  int fd = ::openat(dfd, rel.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    if (errno == ELOOP && !follow) refuse_symlink(p);
    if (errno == ENOENT) return std::nullopt;  // removed since the check
    throw BackendError("cannot open '" + p + "' for reading: " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) throw BackendError("cannot stat '" + p + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse_not_regular(p);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw BackendError("cannot read '" + p + "': " + std::strerror(errno));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw FormatError("'" + file + "': " + what);
}

std::string describe(const JsonValue& v) { return JsonValue::kind_name(v.kind()); }

//! A JSON array of non-negative ints.
std::vector<int64_t> read_shape(const JsonValue& v, const std::string& file, const std::string& what) {
  if (!v.is_array()) bad(file, what + " must be a list of ints, found " + describe(v));
  std::vector<int64_t> out;
  for (const auto& d : v.as_array()) {
    if (!d.is_int()) bad(file, what + " must be a list of ints, found an element of kind " + describe(d));
    if (d.as_int() < 0) bad(file, what + " has a negative dimension " + std::to_string(d.as_int()));
    out.push_back(d.as_int());
  }
  if (!checked_numel(out)) bad(file, what + " " + c10::str(at::IntArrayRef(out)) + " overflows int64");
  return out;
}

std::optional<std::string> read_device(const JsonValue* v, const std::string& file) {
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_string()) bad(file, "\"device\" must be a string, found " + describe(*v));
  if (v->as_string() == "None") return std::nullopt;
  return v->as_string();
}

int64_t read_stack_dim(const JsonValue& meta, const std::string& file) {
  const JsonValue* v = meta.find("stack_dim");
  if (v == nullptr) return 0;
  if (!v->is_int()) bad(file, "\"stack_dim\" must be an int, found " + describe(*v));
  return v->as_int();
}

//! "/proc/self/fd/<fd>[/rel]": the path of something below an open directory, for realpath
std::string fd_path(int fd, const std::string& rel = ".") {
  return "/proc/self/fd/" + std::to_string(fd) + (rel == "." ? std::string() : "/" + rel);
}

struct Reader {
  ReadOptions opt;
  std::shared_ptr<const DirHandle> dir;  //!< the root, held open: every path below it is opened relative to it
  std::string root_path;                 //!< what the root was opened as (the prefix of every path read)
  std::string root_real;  //!< realpath of the root (checked below it when symlinks are refused)
  int depth = 0;
  static constexpr int kMaxDepth = 128;

  int fd() const { return dir->fd(); }
  //! `p` (root_path or a path joined below it) relative to the root: "." for the root itself
  std::string rel(const std::string& p) const {
    if (p == root_path) return ".";
    const size_t n = root_path.size() + (root_path.back() == '/' ? 0 : 1);
    return p.size() > n && p.compare(0, root_path.size(), root_path) == 0 ? p.substr(n) : p;
  }

  std::optional<std::string> read_text(const std::string& p) { return read_whole_at(fd(), rel(p), p, opt.follow_symlinks); }

  std::optional<JsonValue::Bytes> read_bytes_file(const std::string& p) {
    auto s = read_text(p);
    if (!s) return std::nullopt;
    return JsonValue::Bytes{std::move(*s)};
  }

  //! The kind of `p` below the root, of its target when `follow`.
  FileKind kind_at_follow(const std::string& p, bool follow) { return entry_kind_at(fd(), rel(p), follow); }

  //! The kind of `p` below the root: a refused symlink is a FormatError.
  FileKind kind(const std::string& p, int64_t* size = nullptr) {
    FileKind k = entry_kind_at(fd(), rel(p), opt.follow_symlinks, size);
    if (k == FileKind::Symlink) refuse_symlink(p);
    return k;
  }

  //! Finds an entry's name on disk: the encoded name, else the raw legacy name when safe. Looking for a
  //! file, anything else under that name (fifo, device, directory) is a FormatError, never taken as missing.
  std::optional<std::string> locate(const std::string& dir, const std::string& key, const std::string& suffix,
                                    FileKind want) {
    auto found = [&](const std::string& name) {
      const std::string p = join(dir, name);
      FileKind k = kind(p);
      if (want == FileKind::Regular && k != FileKind::Regular && k != FileKind::Missing) refuse_not_regular(p);
      return k == want;
    };
    std::string enc = encode_key(key) + suffix;
    if (found(enc)) return enc;
    if (is_safe_legacy_key(key, want == FileKind::Directory) && key + suffix != enc && found(key + suffix))
      return key + suffix;
    return std::nullopt;
  }

  //! A missing non-empty leaf file: FormatError, or a warning and false (skip) with allow_missing.
  bool missing(DirNode& node, const std::string& what, const std::string& key, const std::string& name) {
    const std::string p = join(node.path, name);
    if (!opt.allow_missing)
      throw FormatError("'" + p + "': " + what + " of leaf '" + key + "' is missing (allow_missing skips the leaf)");
    node.warnings.push_back("leaf '" + key + "': " + what + " '" + name + "' is missing: skipped");
    return false;
  }

  //! Every directory read must lie below the root when symlinks are refused (defence in depth: the names
  //! read are single path components and each one is checked with lstat).
  void check_inside(const std::string& path) {
    if (opt.follow_symlinks || root_real.empty() || root_real == "/") return;
    char* r = ::realpath(fd_path(fd(), rel(path)).c_str(), nullptr);
    if (r == nullptr) return;  // reported by the reads that follow
    const std::string real(r);
    std::free(r);
    if (real != root_real && real.compare(0, root_real.size() + 1, root_real + "/") != 0)
      throw FormatError("'" + path + "' resolves to '" + real + "', outside '" + root_real + "': refused");
  }

  DirNode read(const std::string& path) {
    if (++depth > kMaxDepth) throw FormatError("'" + path + "': directory tree deeper than " + std::to_string(kMaxDepth));
    struct DepthGuard {
      int& d;
      ~DepthGuard() { --d; }
    } guard{depth};
    if (depth == 1) {
      if (char* r = ::realpath(fd_path(fd()).c_str(), nullptr)) {
        root_real = r;
        std::free(r);
      }
    } else {
      check_inside(path);
    }

    const std::string meta_path = join(path, "meta.json");
    auto text = read_text(meta_path);
    if (!text) {
      if (entry_kind_at(fd(), rel(path), true) != FileKind::Directory) throw FormatError("'" + path + "' is not a directory");
      throw FormatError("missing meta.json in '" + path + "'");
    }
    JsonValue meta;
    try {
      meta = JsonValue::parse(*text);
    } catch (const FormatError& e) {
      throw FormatError("'" + meta_path + "': " + e.what());
    }
    if (!meta.is_object()) bad(meta_path, "expected a JSON object, found " + describe(meta));

    DirNode node;
    node.path = path;
    node.root = dir;
    node.rel = rel(path);
    const JsonValue* type = meta.find("_type");
    if (type != nullptr && !type->is_string()) bad(meta_path, "\"_type\" must be a string, found " + describe(*type));
    // A missing _type: a TD-like node (Python would refuse it; we read what is there).
    node.type_repr = type ? type->as_string() : type_repr::kTensorDict;
    node.kind = type ? classify_type(node.type_repr) : NodeKind::TensorDict;
    node.meta = meta;

    switch (node.kind) {
      case NodeKind::TensorDict: read_td(node, meta_path); break;
      case NodeKind::LazyStackedTensorDict:
        node.stack_dim = read_stack_dim(meta, meta_path);
        read_stack_children(node, meta_path);
        break;
      case NodeKind::NonTensorData:
        if (const JsonValue* d = meta.find("data")) node.data = *d;
        node.pickle = read_bytes_file(join(path, "other.pickle"));
        break;
      case NodeKind::NonTensorStack: read_non_tensor_stack(node, meta_path); break;
      case NodeKind::TensorClass: {
        JsonValue::Object fields;
        for (const auto& kv : meta.as_object())
          if (kv.first != "_type") fields.push_back(kv);
        node.data = JsonValue(std::move(fields));
        node.pickle = read_bytes_file(join(path, "other.pickle"));
        if (kind(join(path, "_tensordict")) == FileKind::Directory) {
          add_child_dir(node, "_tensordict", "_tensordict", "TensorDict");
          const DirNode& td = *node.entries.back().child;
          node.batch_size = td.batch_size;
          node.device = td.device;
        }
        break;
      }
      case NodeKind::Other:
        if (kind(join(path, "_source")) == FileKind::Directory &&
            kind(join(join(path, "_source"), "meta.json")) == FileKind::Regular)
          add_child_dir(node, "_source", "_source", "");
        break;
    }
    return node;
  }

  void add_child_dir(DirNode& node, const std::string& key, const std::string& name, const std::string& type) {
    DirEntry e;
    e.key = key;
    e.name = name;
    e.is_leaf = false;
    e.type = type;
    e.child = std::make_shared<DirNode>(read(join(node.path, name)));
    node.entries.push_back(std::move(e));
  }

  void read_td(DirNode& node, const std::string& meta_path) {
    const JsonValue& meta = node.meta;
    const JsonValue* shape = meta.find("shape");
    node.batch_size = shape ? read_shape(*shape, meta_path, "\"shape\"") : std::vector<int64_t>{};
    node.device = read_device(meta.find("device"), meta_path);
    bool any_type = false;
    for (const auto& kv : meta.as_object()) {
      const std::string& key = kv.first;
      const JsonValue& v = kv.second;
      if (!v.is_object()) continue;  // "shape", "device", "_type" and anything else that is not an entry
      if (const JsonValue* t = v.find("type")) {
        any_type = true;
        auto name = locate(node.path, key, "", FileKind::Directory);
        if (!name)
          bad(meta_path, "sub-collection '" + key + "' has no directory '" + encode_key(key) + "' in '" + node.path + "'");
        add_child_dir(node, key, *name, t->is_string() ? t->as_string() : std::string());
        continue;
      }
      read_leaf(node, meta_path, key, v);
    }
    if (!any_type) read_v03_children(node);
  }

  //! v0.3 trees list no {"type"} entries: every sub-directory holding a meta.json is a child.
  void read_v03_children(DirNode& node) {
    std::vector<std::string> names;
    const int dfd = ::openat(fd(), node.rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* d = dfd < 0 ? nullptr : ::fdopendir(dfd);
    if (d == nullptr && dfd >= 0) ::close(dfd);
    if (d != nullptr) {
      while (dirent* de = ::readdir(d)) {
        std::string n = de->d_name;
        if (n == "." || n == "..") continue;
        const std::string p = join(node.path, n);
        FileKind k = kind_at_follow(p, opt.follow_symlinks);
        if (k == FileKind::Symlink && kind_at_follow(p, true) == FileKind::Directory) {  // would be a child: refused
          ::closedir(d);
          refuse_symlink(p);
        }
        if (k == FileKind::Directory && kind_at_follow(join(p, "meta.json"), true) == FileKind::Regular) names.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      if (node.find(n)) continue;
      node.warnings.push_back("sub-directory '" + n + "' is not listed in meta.json: read as a v0.3 child");
      add_child_dir(node, n, n, "");
    }
  }

  void read_leaf(DirNode& node, const std::string& meta_path, const std::string& key, const JsonValue& v) {
    const JsonValue* dtype = v.find("dtype");
    const JsonValue* shape = v.find("shape");
    if (dtype == nullptr || shape == nullptr) {
      node.warnings.push_back("entry '" + key + "' has no dtype/shape: skipped");
      return;
    }
    LeafMeta leaf;
    leaf.key = key;
    if (!dtype->is_string()) bad(meta_path, "leaf '" + key + "': \"dtype\" must be a string, found " + describe(*dtype));
    auto dt = dtype_from_string(dtype->as_string());
    if (!dt) bad(meta_path, "leaf '" + key + "': unknown or unsupported dtype '" + dtype->as_string() + "'");
    leaf.dtype = *dt;
    leaf.shape = read_shape(*shape, meta_path, "leaf '" + key + "': \"shape\"");
    if (const JsonValue* dev = v.find("device"); dev && dev->is_string()) leaf.device = dev->as_string();
    if (const JsonValue* nested = v.find("is_nested")) {
      if (!nested->is_bool()) bad(meta_path, "leaf '" + key + "': \"is_nested\" must be a bool, found " + describe(*nested));
      leaf.is_nested = nested->as_bool();
    }
    if (leaf.is_nested && !read_nested_sizes(node, meta_path, leaf)) return;
    if (leaf.numel() > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(c10::elementSize(leaf.dtype)))
      bad(meta_path, "leaf '" + key + "': byte size overflows int64");
    const int64_t need = leaf.nbytes();
    auto name = locate(node.path, key, ".memmap", FileKind::Regular);
    if (!name) {
      if (leaf.numel() == 0) {  // v0.14 writes no file for an empty leaf
        leaf.file.clear();
        node.add_leaf(std::move(leaf)).name.clear();
        return;
      }
      missing(node, "data file", key, encode_key(key) + ".memmap");
      return;
    }
    leaf.file = *name;
    int64_t size = 0;
    kind(join(node.path, *name), &size);
    if (size < need)
      bad(join(node.path, *name), "leaf '" + key + "' is truncated: expected at least " + std::to_string(need) +
                                      " bytes for " + dtype->as_string() + c10::str(at::IntArrayRef(leaf.shape)) +
                                      ", found " + std::to_string(size));
    node.add_leaf(std::move(leaf));
  }

  //! Reads `k.shape.memmap` for a nested leaf; false if the leaf is to be skipped.
  bool read_nested_sizes(DirNode& node, const std::string& meta_path, LeafMeta& leaf) {
    if (leaf.shape.size() != 2)
      bad(meta_path, "nested leaf '" + leaf.key + "': \"shape\" must be [n_components, ndim], found " +
                         c10::str(at::IntArrayRef(leaf.shape)));
    const int64_t n = leaf.shape[0], ndim = leaf.shape[1];
    if (n == 0) return true;
    if (ndim == 0) {  // n scalar components: n elements of data, no sizes file; check before allocating n rows
      auto data = locate(node.path, leaf.key, ".memmap", FileKind::Regular);
      if (!data) return missing(node, "data file", leaf.key, encode_key(leaf.key) + ".memmap");
      int64_t size = 0;
      kind(join(node.path, *data), &size);
      if (size / static_cast<int64_t>(c10::elementSize(leaf.dtype)) < n) {
        node.warnings.push_back("nested leaf '" + leaf.key + "': data file short: skipped");
        return false;
      }
      leaf.nested_sizes.assign(static_cast<size_t>(n), std::vector<int64_t>());
      return true;
    }
    auto name = locate(node.path, leaf.key, ".shape.memmap", FileKind::Regular);
    if (!name) return missing(node, "sizes file", leaf.key, encode_key(leaf.key) + ".shape.memmap");
    leaf.shape_file = *name;
    const std::string file = join(node.path, *name);
    at::Tensor sizes = map_file_at(fd(), rel(file), file, at::kLong, {n, ndim}, /*writable=*/false, 0,
                                   opt.follow_symlinks);  // checks the size first
    leaf.nested_sizes.assign(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(ndim)));
    const int64_t* p = sizes.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < ndim; ++j) {
        int64_t d = p[i * ndim + j];
        if (d < 0) bad(file, "negative component size " + std::to_string(d));
        leaf.nested_sizes[static_cast<size_t>(i)][static_cast<size_t>(j)] = d;
      }
      auto c = checked_numel(leaf.nested_sizes[static_cast<size_t>(i)]);
      if (!c || total > std::numeric_limits<int64_t>::max() / 16 - *c) bad(file, "component sizes overflow int64");
      total += *c;
    }
    return true;
  }

  void read_stack_children(DirNode& node, const std::string& meta_path) {
    for (int64_t i = 0;; ++i) {
      std::string name = std::to_string(i);
      if (kind(join(node.path, name)) != FileKind::Directory) break;
      add_child_dir(node, name, name, "");
    }
    // batch size = the children's common batch size with N inserted at stack_dim
    if (node.entries.empty()) return;
    std::optional<std::vector<int64_t>> common;
    for (const auto& e : node.entries) {
      if (!e.child->batch_size) return;
      if (!common) common = e.child->batch_size;
      else if (*common != *e.child->batch_size)
        bad(meta_path, "stacked members have different batch sizes " + c10::str(at::IntArrayRef(*common)) + " and " +
                           c10::str(at::IntArrayRef(*e.child->batch_size)));
    }
    const int64_t ndim = static_cast<int64_t>(common->size());
    int64_t dim = node.stack_dim < 0 ? node.stack_dim + ndim + 1 : node.stack_dim;
    if (dim < 0 || dim > ndim)
      bad(meta_path, "\"stack_dim\" " + std::to_string(node.stack_dim) + " out of range for members of batch size " +
                         c10::str(at::IntArrayRef(*common)));
    common->insert(common->begin() + dim, static_cast<int64_t>(node.entries.size()));
    node.batch_size = common;
  }

  void read_non_tensor_stack(DirNode& node, const std::string& meta_path) {
    const JsonValue& meta = node.meta;
    node.stack_dim = read_stack_dim(meta, meta_path);
    node.device = read_device(meta.find("device"), meta_path);
    const JsonValue* data = meta.find("data");
    if (data == nullptr) {  // pre-v0.4 dev layout: members in 0/, 1/, ...
      read_stack_children(node, meta_path);
      return;
    }
    if (data->is_string()) {
      if (data->as_string() != "pickle.pkl")
        bad(meta_path, "NonTensorStack \"data\" string must be \"pickle.pkl\", found \"" + data->as_string() + "\"");
      node.pickle = read_bytes_file(join(node.path, "pickle.pkl"));
      if (!node.pickle) bad(join(node.path, "pickle.pkl"), "missing (referenced by meta.json)");
      return;
    }
    node.data = *data;
    // Python's _from_list: a list whose items are all lists of one length adds a dim.
    std::vector<int64_t> bs;
    const JsonValue* cur = data;
    while (cur->is_array()) {
      const auto& arr = cur->as_array();
      bs.push_back(static_cast<int64_t>(arr.size()));
      if (arr.empty() || !arr[0].is_array()) break;
      const size_t len = arr[0].as_array().size();
      bool uniform = true;
      for (const auto& x : arr) uniform = uniform && x.is_array() && x.as_array().size() == len;
      if (!uniform) break;
      cur = &arr[0];
    }
    node.batch_size = bs;
  }
};

}  // namespace

DirHandle::~DirHandle() {
  if (fd_ >= 0) ::close(fd_);
}

bool DirHandle::still_at(const std::string& path) const {
  struct stat mine, now;
  if (::fstat(fd_, &mine) != 0 || mine.st_nlink == 0) return false;
  return ::stat(path.c_str(), &now) == 0 && now.st_dev == mine.st_dev && now.st_ino == mine.st_ino;
}

std::shared_ptr<const DirHandle> open_dir(const std::string& path) {
  const int fd = ::open(path.empty() ? "" : path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw FormatError("'" + path + "' is not a directory");
    throw BackendError("cannot open the directory '" + path + "': " + std::strerror(errno));
  }
  return std::make_shared<const DirHandle>(fd);
}

DirNode read_dir(const std::string& path, const ReadOptions& options) { return read_dir(open_dir(path), path, options); }

DirNode read_dir(const std::shared_ptr<const DirHandle>& dir, const std::string& path, const ReadOptions& options) {
  if (!dir) throw ValueError("read_dir: no directory");
  Reader r;
  r.opt = options;
  r.dir = dir;
  r.root_path = path.empty() ? std::string(".") : path;
  return r.read(r.root_path);
}

namespace {
//! map_leaf through `dfd` (AT_FDCWD: `dir` is a path): `rel_dir` is the node's directory below dfd
at::Tensor map_leaf_at(int dfd, const std::string& rel_dir, const std::string& dir, const LeafMeta& leaf,
                       bool writable, const ReadOptions& options) {
  std::vector<int64_t> shape = leaf.is_nested ? std::vector<int64_t>{leaf.numel()} : leaf.shape;
  if (leaf.numel() == 0) return at::empty(shape, at::TensorOptions().dtype(leaf.dtype));
  const std::string name = leaf.file.empty() ? encode_key(leaf.key) + ".memmap" : leaf.file;
  const std::string file = join(dir, name);
  const std::string rel = rel_dir == "." ? name : join(rel_dir, name);
  switch (entry_kind_at(dfd, rel, options.follow_symlinks)) {
    case FileKind::Missing: throw FormatError("'" + file + "': data file of leaf '" + leaf.key + "' is missing");
    case FileKind::Symlink: refuse_symlink(file);
    case FileKind::Regular: break;
    default: throw FormatError("'" + file + "': data file of leaf '" + leaf.key + "' is not a regular file");
  }
  return map_file_at(dfd, rel, file, leaf.dtype, shape, writable, 0, options.follow_symlinks);
}
}  // namespace

at::Tensor map_leaf(const std::string& dir, const LeafMeta& leaf, bool writable, const ReadOptions& options) {
  return map_leaf_at(AT_FDCWD, dir, dir, leaf, writable, options);
}

at::Tensor map_leaf(const DirNode& node, const LeafMeta& leaf, bool writable, const ReadOptions& options) {
  if (!node.root) return map_leaf(node.path, leaf, writable, options);
  return map_leaf_at(node.root->fd(), node.rel, node.path, leaf, writable, options);
}

std::vector<at::Tensor> map_nested_leaf(const std::string& dir, const LeafMeta& leaf, bool writable,
                                        const ReadOptions& options) {
  if (!leaf.is_nested) throw ValueError("map_nested_leaf: leaf '" + leaf.key + "' is not nested");
  at::Tensor flat = map_leaf(dir, leaf, writable, options);
  std::vector<at::Tensor> out;
  int64_t off = 0;
  for (const auto& sizes : leaf.nested_sizes) {
    int64_t n = checked_numel(sizes).value_or(0);
    out.push_back(flat.narrow(0, off, n).view(sizes));
    off += n;
  }
  return out;
}

// ------------------------------------------------------------------------------------------ write
namespace {

JsonValue shape_json(const std::vector<int64_t>& shape) {
  JsonValue::Array a;
  for (int64_t d : shape) a.emplace_back(d);
  return JsonValue(std::move(a));
}

void check_td_keys(const DirNode& node) {
  std::unordered_set<std::string> keys, children;
  for (const auto& e : node.entries) {
    if (e.key == "shape" || e.key == "device" || e.key == "_type")
      throw ValueError("key '" + e.key + "' collides with a TensorDict field of meta.json (Python would lose it)");
    if (!keys.insert(e.key).second) throw ValueError("duplicate key '" + e.key + "' in one node");
    if (!e.is_leaf) {
      if (encode_key(e.key) == "meta.json") throw ValueError("a sub-collection named 'meta.json' collides with the metadata file");
      children.insert(encode_key(e.key));
    }
  }
  for (const auto& e : node.entries) {
    if (!e.is_leaf) continue;
    const std::string enc = encode_key(e.key);
    if (children.count(enc + ".memmap"))
      throw ValueError("leaf '" + e.key + "' collides with a sub-collection named '" + e.key + ".memmap'");
    if (e.leaf.is_nested && keys.count(e.key + ".shape"))
      throw ValueError("nested leaf '" + e.key + "' collides with a leaf named '" + e.key + ".shape'");
  }
}

JsonValue leaf_json(const LeafMeta& leaf) {
  return JsonValue::object({{"device", JsonValue(leaf.device)},
                            {"shape", shape_json(leaf.shape)},
                            {"dtype", JsonValue(dtype_to_string(leaf.dtype))},
                            {"is_nested", JsonValue(leaf.is_nested)}});
}

//! Appends to `out` the members of `original` whose keys are not yet in `out` (round-tripping extras).
void append_unknown(JsonValue::Object& out, const JsonValue& original) {
  if (!original.is_object()) return;
  for (const auto& kv : original.as_object()) {
    bool present = false;
    for (const auto& o : out) present = present || o.first == kv.first;
    if (!present) out.push_back(kv);
  }
}

}  // namespace

JsonValue make_meta(const DirNode& node) {
  JsonValue::Object o;
  switch (node.kind) {
    case NodeKind::TensorDict: {
      check_td_keys(node);
      for (const auto& e : node.entries) {
        if (e.is_leaf)
          o.emplace_back(e.key, leaf_json(e.leaf));
        else
          o.emplace_back(e.key, JsonValue::object({{"type", JsonValue(e.type.empty() ? default_child_type(*e.child) : e.type)}}));
      }
      o.emplace_back("shape", shape_json(node.batch_size.value_or(std::vector<int64_t>{})));
      o.emplace_back("device", JsonValue(node.device.value_or("None")));
      o.emplace_back("_type", JsonValue(node.type_repr));
      break;
    }
    case NodeKind::LazyStackedTensorDict:
      o.emplace_back("_type", JsonValue(node.type_repr));
      o.emplace_back("stack_dim", JsonValue(node.stack_dim));
      break;
    case NodeKind::NonTensorData: {
      o.emplace_back("_type", JsonValue(node.type_repr));
      if (node.data) o.emplace_back("data", *node.data);
      o.emplace_back("_is_non_tensor", JsonValue(true));
      const JsonValue* md = node.meta.find("_metadata");
      o.emplace_back("_metadata", md ? *md : JsonValue(nullptr));
      append_unknown(o, node.meta);
      break;
    }
    case NodeKind::NonTensorStack:
      o.emplace_back("_type", JsonValue(node.type_repr));
      o.emplace_back("stack_dim", JsonValue(node.stack_dim));
      o.emplace_back("device", node.device ? JsonValue(*node.device) : JsonValue(nullptr));
      if (node.data)
        o.emplace_back("data", *node.data);
      else if (node.pickle)
        o.emplace_back("data", JsonValue("pickle.pkl"));
      break;
    case NodeKind::TensorClass:
      o.emplace_back("_type", JsonValue(node.type_repr));
      if (node.data && node.data->is_object())
        for (const auto& kv : node.data->as_object())
          if (kv.first != "_type") o.push_back(kv);
      break;
    case NodeKind::Other:
      if (node.meta.is_object()) return node.meta;
      o.emplace_back("_type", JsonValue(node.type_repr));
      break;
  }
  return JsonValue(std::move(o));
}

JsonValue::Style meta_style(NodeKind kind) {
  return kind == NodeKind::NonTensorStack ? JsonValue::Style::PythonCompact : JsonValue::Style::Python;
}

namespace {

void write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw BackendError("write failed for '" + path + "': " + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
}

//! temp file + fsync + rename + fsync(dir): readers see the old or the new file, never a partial one.
void atomic_write(const std::string& dir, const std::string& name, const std::string& data) {
  static std::atomic<uint64_t> counter{0};
  const std::string target = join(dir, name);
  const std::string tmp = join(dir, "." + name + ".tmp." + std::to_string(::getpid()) + "." +
                                        std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()) % 1000000) +
                                        "." + std::to_string(counter++));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw BackendError("cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    write_all(fd, data, tmp);
    if (::fsync(fd) != 0) throw BackendError("fsync failed for '" + tmp + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw BackendError("close failed for '" + tmp + "': " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw BackendError("cannot rename '" + tmp + "' to '" + target + "': " + std::strerror(err));
  }
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some filesystems refuse fsync on directories
    ::close(dfd);
  }
}

void make_dirs(const std::string& dir) {
  if (dir.empty()) return;
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    struct stat st;
    if (::lstat(cur.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode) && pos == std::string::npos)
        throw ValueError("refusing to write into the symlinked directory '" + cur + "'");
      if (S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)) continue;
      throw BackendError("'" + cur + "' exists and is not a directory");
    }
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw BackendError("cannot create directory '" + cur + "': " + std::strerror(errno));
  }
}

void remove_stale(const std::string& file) {
  struct stat st;
  if (::lstat(file.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(file.c_str());
}

}  // namespace

void write_meta(const std::string& dir, const JsonValue& meta, JsonValue::Style style) {
  atomic_write(dir, "meta.json", meta.dump(style));
}

void write_meta(const std::string& dir, const DirNode& node) { write_meta(dir, make_meta(node), meta_style(node.kind)); }

LeafMeta write_leaf(const std::string& dir, const std::string& key, const at::Tensor& value) {
  if (!value.defined()) throw ValueError("write_leaf: undefined tensor for key '" + key + "'");
  LeafMeta leaf;
  leaf.key = key;
  leaf.dtype = value.scalar_type();
  dtype_to_string(leaf.dtype);  // ValueError for dtypes Python cannot load
  leaf.shape = value.sizes().vec();
  leaf.device = value.device().str();
  const std::string file = join(dir, encode_key(key) + ".memmap");
  if (value.numel() == 0) {
    remove_stale(file);
    return leaf;
  }
  write_file(file, value);
  leaf.file = encode_key(key) + ".memmap";
  return leaf;
}

LeafMeta write_nested_leaf(const std::string& dir, const std::string& key, const std::vector<at::Tensor>& components) {
  LeafMeta leaf;
  leaf.key = key;
  leaf.is_nested = true;
  int64_t ndim = components.empty() ? 0 : components[0].dim();
  leaf.dtype = components.empty() ? at::kFloat : components[0].scalar_type();
  dtype_to_string(leaf.dtype);
  std::vector<at::Tensor> flat;
  for (const auto& c : components) {
    if (c.dim() != ndim || c.scalar_type() != leaf.dtype)
      throw ValueError("write_nested_leaf: components of '" + key + "' differ in dtype or ndim");
    leaf.nested_sizes.push_back(c.sizes().vec());
    flat.push_back(c.reshape({-1}));
    leaf.device = c.device().str();
  }
  leaf.shape = {static_cast<int64_t>(components.size()), ndim};
  const std::string enc = encode_key(key);
  at::Tensor sizes = at::empty({leaf.shape[0], ndim}, at::TensorOptions().dtype(at::kLong));
  for (size_t i = 0; i < leaf.nested_sizes.size(); ++i)
    for (int64_t j = 0; j < ndim; ++j) sizes[static_cast<int64_t>(i)][j] = leaf.nested_sizes[i][static_cast<size_t>(j)];
  if (sizes.numel() > 0) {
    write_file(join(dir, enc + ".shape.memmap"), sizes);
    leaf.shape_file = enc + ".shape.memmap";
  } else {
    remove_stale(join(dir, enc + ".shape.memmap"));
  }
  at::Tensor data = flat.empty() ? at::empty({0}, at::TensorOptions().dtype(leaf.dtype)) : at::cat(flat);
  if (data.numel() > 0) {
    write_file(join(dir, enc + ".memmap"), data);
    leaf.file = enc + ".memmap";
  } else {
    remove_stale(join(dir, enc + ".memmap"));
  }
  return leaf;
}

void write_tree(const std::string& dir, const DirNode& node, const LeafProvider& provider) {
  make_dirs(dir);
  DirNode written = node;  // entries re-pointed at the names actually written
  if (node.kind == NodeKind::TensorDict) check_td_keys(node);
  for (auto& e : written.entries) {
    if (e.is_leaf) {
      at::Tensor value = provider(node, e.leaf);
      LeafMeta m;
      if (e.leaf.is_nested) {
        std::vector<at::Tensor> comps;
        int64_t off = 0;
        for (const auto& sizes : e.leaf.nested_sizes) {
          int64_t n = checked_numel(sizes).value_or(0);
          comps.push_back(value.reshape({-1}).narrow(0, off, n).view(sizes));
          off += n;
        }
        m = write_nested_leaf(dir, e.key, comps);
        m.shape = e.leaf.shape;  // keep [n, ndim] even when n == 0
      } else {
        if (value.sizes().vec() != e.leaf.shape || value.scalar_type() != e.leaf.dtype)
          throw ValueError("write_tree: provider returned " + std::string(c10::toString(value.scalar_type())) +
                           c10::str(value.sizes()) + " for leaf '" + e.key + "' declared as " +
                           c10::toString(e.leaf.dtype) + c10::str(at::IntArrayRef(e.leaf.shape)));
        m = write_leaf(dir, e.key, value);
      }
      m.device = e.leaf.device;
      e.leaf = std::move(m);
      e.name = e.leaf.file;
    } else {
      e.name = encode_key(e.key);
      write_tree(join(dir, e.name), *e.child, provider);
    }
  }
  if (node.pickle) {
    const char* name = node.kind == NodeKind::NonTensorStack ? "pickle.pkl" : "other.pickle";
    atomic_write(dir, name, node.pickle->data);
  }
  write_meta(dir, written);
}

void copy_tree(const DirNode& src, const std::string& dir) {
  write_tree(dir, src, [](const DirNode& node, const LeafMeta& leaf) {
    return map_leaf(node, leaf, /*writable=*/false);
  });
}

// ------------------------------------------------------------------------------------------ staged saves
namespace {

//! (parent, ".<base>.td-stage.") of a prefix; an empty tag when it has no sibling to stage in
std::pair<std::string, std::string> stage_tag(const std::string& prefix) {
  std::string p = prefix;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (base.empty() || base == "." || base == ".." || base == "/") return {parent, ""};
  return {parent, "." + base + ".td-stage."};
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

//! an OFD write lock on the whole file, without waiting: false when another open file description holds one
bool try_lock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

//! whether `path` still names the file open as `fd` (not unlinked or replaced since it was opened)
bool same_file(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

//! `fd` (open on `lock`) locked and still named `lock`: the writer it belonged to is gone
bool lock_abandoned(int fd, const std::string& lock) { return fd >= 0 && try_lock(fd) && same_file(fd, lock); }

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string random_hex() {
  static std::atomic<uint64_t> counter{0};
  uint64_t r = 0;
  try {
    std::random_device rd;
    r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (const std::exception&) {
  }
  r ^= (counter.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

}  // namespace

size_t remove_abandoned_stages(const std::string& prefix) {
  const auto [parent, tag] = stage_tag(prefix);
  if (tag.empty()) return 0;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(parent.c_str())) {
    while (dirent* de = ::readdir(d)) {
      const std::string n = de->d_name;
      if (n.compare(0, tag.size(), tag) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::unordered_set<std::string> present(names.begin(), names.end());
  size_t removed = 0;
  for (const std::string& n : names) {
    const bool is_lock = ends_with(n, ".lock");
    // a staging directory, the ".old" directory of a two-rename switch, or a lock file left without either
    const std::string stage = is_lock ? n.substr(0, n.size() - 5) : ends_with(n, ".old") ? n.substr(0, n.size() - 4) : n;
    if (is_lock && (present.count(stage) || present.count(stage + ".old"))) continue;  // handled with its directory
    const std::string lock = join(parent, stage + ".lock");
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // no lock file: an older version's, or one being removed: cannot be proven dead
    if (lock_abandoned(fd, lock)) {
      if (!is_lock) {
        remove_tree(join(parent, n));
        ++removed;
      }
      struct stat st;
      if (::lstat(join(parent, stage).c_str(), &st) != 0 && ::lstat(join(parent, stage + ".old").c_str(), &st) != 0)
        ::unlink(lock.c_str());
    }
    ::close(fd);
  }
  return removed;
}

StagingDir::StagingDir(const std::string& prefix) {
  const auto [parent, tag] = stage_tag(prefix);
  if (tag.empty()) return;  // no sibling to stage in: in place
  // a prefix under directories that do not exist yet: they are created, as upstream's memmap_ (os.makedirs)
  std::error_code ec;
  if (!std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) throw BackendError("cannot create the directory '" + parent + "': " + ec.message());
  }
  remove_abandoned_stages(prefix);
  // the lock file first, locked, then the directory: a staging directory never exists unlocked while its writer
  // lives. A cleaner may take a fresh lock file in the moment before it is locked: then another name is tried.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string stage = join(parent, tag + std::to_string(::getpid()) + "." + random_hex());
    const std::string lock = stage + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      if (errno == EACCES || errno == EPERM || errno == EROFS) return;  // read-only parent: in place
      if (errno == EEXIST) continue;
      throw BackendError("cannot create the lock file '" + lock + "': " + std::strerror(errno));
    }
    if (!try_lock(fd) || !same_file(fd, lock)) {
      ::close(fd);
      continue;
    }
    if (::mkdir(stage.c_str(), 0755) != 0) {
      const int err = errno;
      ::unlink(lock.c_str());
      ::close(fd);
      if (err == EEXIST) continue;
      if (err == EACCES || err == EPERM || err == EROFS) return;
      throw BackendError("cannot create the staging directory '" + stage + "': " + std::strerror(err));
    }
    path_ = stage;
    lock_fd_ = fd;
    return;
  }
  throw BackendError("cannot create a staging directory beside '" + prefix + "': every name tried was taken");
}

StagingDir::~StagingDir() {
  if (lock_fd_ < 0) return;
  remove_tree(path_);
  remove_tree(path_ + ".old");
  ::unlink((path_ + ".lock").c_str());
  ::close(lock_fd_);  // releases the lock
}

}  // namespace tensordict::backends
