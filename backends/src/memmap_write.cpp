// Writing Python's memmap directory format: meta.json of every node kind (atomic replace), leaves and
// nested leaves, whole trees.
#include "tensordict/backends/memmap_format.hpp"
#include "memmap_format_internal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {

using memmap_detail::checked_numel;
using memmap_detail::join;

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

void write_new_meta(const std::string& dir, const DirNode& node, bool sync) {
  const std::string data = make_meta(node).dump(meta_style(node.kind));
  const std::string path = join(dir, "meta.json");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw BackendError("cannot create '" + path + "': " + std::strerror(errno));
  try {
    write_all(fd, data, path);
    if (sync && ::fsync(fd) != 0) throw BackendError("fsync failed for '" + path + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw BackendError("close failed for '" + path + "': " + std::strerror(err));
  }
  if (!sync) return;
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // its entries (the leaves, the child directories, meta.json): best effort, as atomic_write
    ::close(dfd);
  }
}

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
}  // namespace tensordict::backends
