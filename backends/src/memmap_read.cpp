// Reading Python's memmap directory format: meta.json files of every node kind (tensordicts,
// tensorclasses, lazy stacks, non-tensors, nested leaves), a save's directory read through one open fd
// (DirHandle), and leaves mapped as tensors.
#include "tensordict/backends/memmap_format.hpp"
#include "memmap_format_internal.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {

using memmap_detail::checked_numel;
using memmap_detail::join;

// ------------------------------------------------------------------------------------------ read
namespace {

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

//! an open file descriptor, closed on scope exit
struct OpenFd {
  int fd = -1;
  OpenFd() = default;
  OpenFd(const OpenFd&) = delete;
  OpenFd& operator=(const OpenFd&) = delete;
  OpenFd(OpenFd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  ~OpenFd() {
    if (fd >= 0) ::close(fd);
  }
};

//! Opens the regular file `rel` below the directory `dfd` (AT_FDCWD: a path) for reading; `p` names it in
//! messages. Never blocks on a fifo (the type is checked before the non-blocking open and again on the fd); a
//! refused symlink or another file type is a FormatError, other failures a BackendError. fd -1 when it does not
//! exist; `size` (when given) gets its size.
OpenFd open_regular_at(int dfd, const std::string& rel, const std::string& p, bool follow, int64_t* size = nullptr) {
  OpenFd f;
  FileKind k = entry_kind_at(dfd, rel, follow);
  if (k == FileKind::Missing) return f;
  if (k == FileKind::Symlink) refuse_symlink(p);
  if (k != FileKind::Regular) refuse_not_regular(p);
  f.fd = ::openat(dfd, rel.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW));
  if (f.fd < 0) {
    if (errno == ELOOP && !follow) refuse_symlink(p);
    if (errno == ENOENT) return f;  // removed since the check
    throw BackendError("cannot open '" + p + "' for reading: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw BackendError("cannot stat '" + p + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse_not_regular(p);
  if (size) *size = static_cast<int64_t>(st.st_size);
  return f;
}

//! Reads a whole regular file; nullopt if it does not exist (open_regular_at). BackendError on other I/O errors.
std::optional<std::string> read_whole_at(int dfd, const std::string& rel, const std::string& p, bool follow) {
  OpenFd f = open_regular_at(dfd, rel, p, follow);
  if (f.fd < 0) return std::nullopt;
  const int fd = f.fd;
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

void read_leaf_into(const DirNode& node, const LeafMeta& leaf, const at::Tensor& dst, bool check_only,
                    const ReadOptions& options) {
  if (leaf.is_nested) throw TypeError("read_leaf_into: the leaf '" + leaf.key + "' is nested");
  const int64_t nbytes = leaf.nbytes();
  if (nbytes == 0) return;
  const std::string name = leaf.file.empty() ? encode_key(leaf.key) + ".memmap" : leaf.file;
  const std::string file = join(node.path, name);
  const int dfd = node.root ? node.root->fd() : AT_FDCWD;
  const std::string rel = !node.root ? file : node.rel == "." ? name : join(node.rel, name);
  int64_t size = 0;
  OpenFd f = open_regular_at(dfd, rel, file, options.follow_symlinks, &size);
  if (f.fd < 0) throw FormatError("'" + file + "': data file of leaf '" + leaf.key + "' is missing");
  const int fd = f.fd;
  if (size < nbytes)
    throw FormatError("file '" + file + "' is too short: expected at least " + std::to_string(nbytes) + " bytes (" +
                      c10::toString(leaf.dtype) + c10::str(leaf.shape) + "), found " + std::to_string(size));
  if (check_only) return;
  const bool direct = dst.is_contiguous() && dst.device().is_cpu();
  at::Tensor into = direct ? dst : at::empty(leaf.shape, at::TensorOptions().dtype(leaf.dtype));
  char* p = static_cast<char*>(into.data_ptr());
  for (int64_t done = 0; done < nbytes;) {
    const ssize_t n = ::pread(fd, p + done, static_cast<size_t>(nbytes - done), static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw BackendError("cannot read '" + file + "': " + std::strerror(errno));
    if (n == 0) throw FormatError("file '" + file + "' ended after " + std::to_string(done) + " of " + std::to_string(nbytes) + " bytes");
    done += n;
  }
  if (!direct) dst.copy_(into);
}

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
}  // namespace tensordict::backends
