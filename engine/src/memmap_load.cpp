// TensorDict persistence in Python tensordict's memmap directory format, loading: load_memmap, load,
// load_memmap_ (one save read through one open directory, read again when a save replaced it),
// memmap_refresh_, make_memmap, LazyStackedTensorDict::load_memmap and is_lazy_stack_dir.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>

#include "lazy_stack_node.hpp"
#include "memmap_internal.hpp"
#include "tensordict/memmap_storage.hpp"
#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/lazy_stack.hpp"

namespace tensordict {
namespace {

using namespace detail::memmap;

// ------------------------------------------------------------------------------------------ loading
backends::ReadOptions read_options(const LoadOptions& o) {
  backends::ReadOptions r;
  r.follow_symlinks = o.follow_symlinks();
  r.allow_missing = o.allow_missing();
  return r;
}

//! Hands every warning of the tree read by read_dir to o.on_warning (stderr when unset).
void warn(const LoadOptions& o, const std::string& text) {
  if (o.on_warning())
    o.on_warning()(text);
  else
    std::cerr << "tensordict: warning: " << text << "\n";
}

void report_warnings(const DirNode& node, const LoadOptions& o) {
  for (const auto& w : node.warnings) warn(o, "'" + node.path + "': " + w);
  for (const auto& de : node.entries)
    if (!de.is_leaf && de.child) report_warnings(*de.child, o);
}

void build_from_node(TensorDictImpl& impl, const DirNode& node, const BatchSize& parent_batch,
                     const LoadOptions& o);
LazyStackedTensorDict lazy_from_node(const DirNode& root, const LoadOptions& o);

Entry entry_from_child(const DirNode& child, const TensorDictImpl& parent, const LoadOptions& o) {
  switch (child.kind) {
    case NodeKind::TensorDict:
    case NodeKind::TensorClass:
    case NodeKind::Other: {
      auto impl = std::make_shared<TensorDictImpl>();
      build_from_node(*impl, child, parent.batch_size, o);
      return Entry(TensorDict(impl));
    }
    case NodeKind::NonTensorData: {
      JsonValue v = child.data ? *child.data : (child.pickle ? JsonValue(*child.pickle) : JsonValue());
      return Entry(NonTensorData(v, parent.batch_size));
    }
    case NodeKind::NonTensorStack: {
      if (!child.data) {
        if (child.pickle) {
          // a pickled list: kept verbatim (never executed), broadcast like NonTensorData
          return Entry(NonTensorData(JsonValue(*child.pickle), parent.batch_size));
        }
        throw FormatError("NonTensorStack in '" + child.path + "' has no data");
      }
      int64_t depth = static_cast<int64_t>(parent.batch_size.size());
      NonTensorStack st = NonTensorStack::from_nested(*child.data, depth);
      return Entry(st);
    }
    case NodeKind::LazyStackedTensorDict: {
      // densified when the members stack (what re-writing and the dense fast paths want); a ragged stack
      // stays a lazy stack inside the TensorDict, as upstream loads it
      LazyStackedTensorDict lazy = lazy_from_node(child, o);
      try {
        return Entry(lazy.contiguous());
      } catch (const Error&) {
        return Entry(TensorDict(lazy));
      }
    }
  }
  throw FormatError("unknown node kind in '" + child.path + "'");
}

void build_from_node(TensorDictImpl& impl, const DirNode& node, const BatchSize& parent_batch,
                     const LoadOptions& o) {
  if (node.kind == NodeKind::TensorClass || node.kind == NodeKind::Other) {
    const DirEntry* inner = node.find(node.kind == NodeKind::TensorClass ? "_tensordict" : "_source");
    if (!inner || inner->is_leaf || !inner->child) {
      throw FormatError("'" + node.path + "' (" + node.type_repr + ") has no _tensordict/_source directory");
    }
    build_from_node(impl, *inner->child, parent_batch, o);
    if (node.kind == NodeKind::TensorClass) {
      impl.type_repr = node.type_repr;
      impl.class_fields = node.data;
      impl.class_pickle = node.pickle;
    }
    return;
  }
  if (node.kind != NodeKind::TensorDict) {
    throw TypeError("'" + node.path + "' holds a " + backends::node_kind_name(node.kind) + ", not a TensorDict");
  }
  impl.batch_size = node.batch_size ? *node.batch_size : BatchSize{};
  if (node.device && *node.device != "None") {
    try {
      impl.device = at::Device(*node.device);
    } catch (const c10::Error&) {
      throw FormatError("'" + node.path + "/meta.json' has an unknown device '" + *node.device + "'");
    }
    if (!impl.device->is_cpu()) {  // memory-mapped leaves live on the CPU: so does the TensorDict
      warn(o, "'" + node.path + "/meta.json' names the device '" + *node.device +
                  "'; loaded on the CPU, where its memory-mapped leaves are (as upstream's "
                  "load_memmap(prefix, device=\"cpu\")); move it with .to(device)");
      impl.device = at::Device(at::kCPU);
    }
  }
  (void)parent_batch;
  for (const auto& de : node.entries) {
    if (de.is_leaf) {
      if (de.leaf.is_nested) {
        throw TypeError("'" + node.path + "': the nested (ragged) tensor leaf '" + de.key +
                        "' is not supported yet");
      }
      // a writable load maps every leaf shared or fails naming the file (upstream's PermissionError): a private
      // copy-on-write map of a file this process may not write would take writes and lose them
      at::Tensor t = backends::map_leaf(node, de.leaf, o.writable(), read_options(o));
      if (impl.device && t.device() != *impl.device) t = t.to(*impl.device);
      BatchSize shape(t.sizes().begin(), t.sizes().end());
      if (shape.size() < impl.batch_size.size() ||
          !std::equal(impl.batch_size.begin(), impl.batch_size.end(), shape.begin())) {
        throw FormatError("'" + node.path + "/meta.json': leaf '" + de.key + "' has shape " + detail::shape_str(shape) +
                          " which does not start with the batch size " + detail::shape_str(impl.batch_size));
      }
      impl.entries.emplace_back(de.key, Entry(t));
    } else {
      if (!de.child) throw FormatError("'" + node.path + "': the sub-collection '" + de.key + "' was not read");
      Entry e = entry_from_child(*de.child, impl, o);
      BatchSize shape = e.shape();
      if (shape.size() < impl.batch_size.size() ||
          !std::equal(impl.batch_size.begin(), impl.batch_size.end(), shape.begin())) {
        throw FormatError("'" + de.child->path + "' has batch size " + detail::shape_str(shape) +
                          " which does not start with its parent's " + detail::shape_str(impl.batch_size));
      }
      impl.entries.emplace_back(de.key, std::move(e));
    }
  }
}

//! the members of a lazy stack read by read_dir, memory-mapped and locked
LazyStackedTensorDict lazy_from_node(const DirNode& root, const LoadOptions& o) {
  std::vector<TensorDict> members;
  for (const auto& de : root.entries) {
    if (de.is_leaf || !de.child) continue;
    auto impl = std::make_shared<TensorDictImpl>();
    build_from_node(*impl, *de.child, {}, o);
    TensorDict td(impl);
    mark_memmap(impl, de.child->path);
    td.lock_();
    members.push_back(td);
  }
  if (members.empty()) throw FormatError("'" + root.path + "/meta.json': a LazyStackedTensorDict without members");
  return LazyStackedTensorDict(std::move(members), root.stack_dim);
}

//! Reads `prefix` and builds what it holds with `build`, all through one open directory (read_dir keeps it open
//! and map_leaf maps every leaf from it), so a load racing a save into the same prefix sees one whole save. A
//! save that switches its directory in meanwhile and removes the old one can make the read fail (a file gone):
//! when the prefix no longer names the directory read, the load starts again on the new one, a bounded number
//! of times, then fails with a FormatError saying so.
template <class Build>
auto load_one_save(const std::string& prefix, const LoadOptions& o, const Build& build)
    -> decltype(build(std::declval<const DirNode&>())) {
  constexpr int kAttempts = 20;
  for (int attempt = 1;; ++attempt) {
    const auto dir = backends::open_dir(prefix);
    try {
      return build(backends::read_dir(dir, prefix, read_options(o)));
    } catch (const Error& e) {
      if (dir->still_at(prefix)) throw;  // the directory read is still the prefix: a real error
      if (attempt == kAttempts) {
        throw FormatError("'" + prefix + "' was replaced by other saves " + std::to_string(kAttempts) +
                          " times while it was being loaded (another process keeps saving into it); the last " +
                          "attempt failed with: " + e.what());
      }
    }
  }
}

TensorDict build_tree(const std::string& prefix, const DirNode& root, const LoadOptions& o) {
  if (root.kind == NodeKind::LazyStackedTensorDict) {  // upstream's load_memmap: the class meta.json names
    LazyStackedTensorDict lazy = lazy_from_node(root, o);
    report_warnings(root, o);
    return std::move(lazy);
  }
  if (root.kind == NodeKind::NonTensorData || root.kind == NodeKind::NonTensorStack) {
    throw TypeError("'" + prefix + "' holds a " + std::string(backends::node_kind_name(root.kind)) +
                    ", not a TensorDict");
  }
  auto impl = std::make_shared<TensorDictImpl>();
  build_from_node(*impl, root, {}, o);
  report_warnings(root, o);
  TensorDict td(impl);
  mark_memmap(impl, prefix);
  // sub-TensorDicts of a tensorclass record live under _tensordict/
  td.lock_();
  return td;
}

TensorDict load_tree(const std::string& prefix, const LoadOptions& o) {
  return load_one_save(prefix, o, [&](const DirNode& root) { return build_tree(prefix, root, o); });
}

// ------------------------------------------------------------------------------------------ load_memmap_ inplace
// The saved bytes read into a TensorDict's own leaves (LoadOptions::inplace): every key, dtype and shape is paired
// and every file opened and checked first; only then are bytes read, leaf by leaf (threads take whole leaves).

struct InplaceLeaf {
  const DirNode* node;
  const backends::LeafMeta* leaf;
  at::Tensor dst;
};

std::string dotted(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

void pair_level(const TensorDict& td, const DirNode& node, const std::string& where, std::vector<InplaceLeaf>& out) {
  if (node.kind != NodeKind::TensorDict)
    throw TypeError("load_memmap_(inplace): '" + (where.empty() ? node.path : where) + "' is saved as a " +
                    std::string(backends::node_kind_name(node.kind)) + "; inplace reads plain TensorDict levels");
  // the bytes land in the leaves the node hands out: only where those alias its storage (memory, memmap, shared
  // memory); a lazy stack or a store would take them into copies, silently lost
  const Node& level = *td.node();
  if (!level.caps().zero_copy_views)
    throw TypeError("load_memmap_(inplace): " + (where.empty() ? std::string("the TensorDict") : "'" + where + "'") +
                    " is a " + level.type_name() + ", whose leaves are not its storage; load it with load_memmap and "
                    "update_ instead");
  for (const DirEntry& de : node.entries) {
    const std::string key = dotted(where, de.key);
    // the structure from meta (no data read); the value only once it is known to fit
    const std::optional<EntryMeta> mine = level.meta(de.key);
    if (!mine) throw KeyError("load_memmap_(inplace): the saved key '" + key + "' is not in this TensorDict");
    if (de.is_leaf) {
      if (mine->kind != EntryMeta::Kind::Tensor)
        throw TypeError("load_memmap_(inplace): '" + key + "' is saved as a tensor, but holds a " +
                        std::string(mine->kind_name()) + " here");
      if (de.leaf.is_nested) throw TypeError("load_memmap_(inplace): '" + key + "' is a nested tensor");
      if (mine->dtype != de.leaf.dtype)
        throw TypeError("load_memmap_(inplace): '" + key + "' is saved as " + std::string(c10::toString(de.leaf.dtype)) +
                        ", but is " + c10::toString(mine->dtype) + " here");
      if (at::IntArrayRef(mine->shape) != at::IntArrayRef(de.leaf.shape))
        throw ValueError("load_memmap_(inplace): '" + key + "' is saved with shape " + c10::str(de.leaf.shape) +
                         ", but has shape " + c10::str(mine->shape) + " here");
      if (mine->device && !mine->device->is_cpu())
        throw ValueError("load_memmap_(inplace): '" + key + "' is on " + mine->device->str());
      const at::Tensor t = level.read(de.key)->tensor();
      if (t.is_nested()) throw TypeError("load_memmap_(inplace): '" + key + "' is a nested tensor");
      out.push_back(InplaceLeaf{&node, &de.leaf, t});
    } else {
      if (mine->kind != EntryMeta::Kind::TensorDict)
        throw TypeError("load_memmap_(inplace): '" + key + "' is saved as a " +
                        std::string(de.child ? backends::node_kind_name(de.child->kind) : "level") + ", but holds a " +
                        std::string(mine->kind_name()) + " here");
      if (!de.child) throw FormatError("load_memmap_(inplace): '" + key + "' has no saved directory");
      pair_level(level.read(de.key)->tensordict(), *de.child, key, out);
    }
  }
  // both ways: a tensor here that the save lacks is an error too (it would keep its old value silently)
  for (const auto& [key, meta] : td.node()->metas()) {
    if (node.find(key)) continue;
    if (meta.kind == EntryMeta::Kind::Tensor || meta.kind == EntryMeta::Kind::TensorDict)
      throw KeyError("load_memmap_(inplace): '" + dotted(where, key) + "' is not in the saved TensorDict");
  }
}

void read_inplace(TensorDict& td, const std::string& prefix, const LoadOptions& o) {
  load_one_save(prefix, o, [&](const DirNode& root) {
    std::vector<InplaceLeaf> leaves;
    pair_level(td, root, "", leaves);
    const backends::ReadOptions ro = read_options(o);
    for (const auto& l : leaves) backends::read_leaf_into(*l.node, *l.leaf, l.dst, /*check_only=*/true, ro);
    report_warnings(root, o);
    for_each_job(leaves.size(), o.num_threads(), [&](size_t i) {
      at::NoGradGuard no_grad;  // leaves that require grad (a module's parameters) are written in place (per thread)
      backends::read_leaf_into(*leaves[i].node, *leaves[i].leaf, leaves[i].dst, /*check_only=*/false, ro);
    });
    return 0;
  });
}

}  // namespace

TensorDict TensorDict::load_memmap(const std::string& prefix, const LoadOptions& options) {
  return load_tree(prefix, options);
}

TensorDict TensorDict::load(const std::string& prefix, const LoadOptions& options) {
  return load_tree(prefix, options);
}

TensorDict& TensorDict::load_memmap_(const std::string& prefix, const LoadOptions& options) {
  if (options.inplace()) {
    read_inplace(*this, prefix, options);
    return *this;
  }
  TensorDict loaded = load_tree(prefix, options);
  if (!loaded.node()->dense_node()) {  // a lazy stack's directory: no entries of one level to take
    throw TypeError("load_memmap_: '" + prefix + "' holds a " + loaded.node()->type_name() + ", whose members cannot "
                    "become this TensorDict's entries; load it with load_memmap");
  }
  if (d()->locked) {
    throw LockedError("Cannot modify locked TensorDict: load_memmap_ replaces the entries; unlock it first");
  }
  d()->entries = detail::impl_of(loaded)->entries;
  d()->batch_size = detail::impl_of(loaded)->batch_size;
  d()->device = detail::impl_of(loaded)->device;
  d()->type_repr = detail::impl_of(loaded)->type_repr;
  d()->class_fields = detail::impl_of(loaded)->class_fields;
  d()->class_pickle = detail::impl_of(loaded)->class_pickle;
  for (auto& kv : d()->entries)
    if (kv.second.is_tensordict()) detail::impl_of(kv.second.tensordict())->locked_parents.clear();
  mark_memmap(detail::impl_of(*this), prefix);
  lock_();
  return *this;
}

static void refresh_impl(TensorDictImpl& impl, const DirNode& node, const LoadOptions& o) {
  const DirNode* td_node = &node;
  if (node.kind == NodeKind::TensorClass) {
    const DirEntry* inner = node.find("_tensordict");
    if (!inner || !inner->child) return;
    td_node = inner->child.get();
  }
  for (const auto& de : td_node->entries) {
    Entry* mine = impl.find(de.key);
    if (mine) {
      if (!de.is_leaf && de.child && mine->is_tensordict()) refresh_impl(*detail::impl_of(mine->tensordict()), *de.child, o);
      continue;
    }
    TensorDictImpl tmp;
    tmp.batch_size = impl.batch_size;
    DirNode one = *td_node;
    one.entries = {de};
    one.kind = NodeKind::TensorDict;
    one.batch_size = impl.batch_size;
    build_from_node(tmp, one, impl.batch_size, o);
    for (auto& kv : tmp.entries) {
      if (kv.second.is_tensordict()) {
        auto child = detail::impl_of(kv.second.tensordict());
        child->is_memmap = true;
        child->memmap_prefix = de.child ? de.child->path : "";
        if (impl.locked) {
          child->locked = true;
        }
      }
      impl.entries.push_back(kv);
    }
  }
}

TensorDict& TensorDict::memmap_refresh_() {
  if (!d()->is_memmap || d()->memmap_prefix.empty()) {
    throw ValueError("memmap_refresh_ needs a memmap TensorDict saved to a directory");
  }
  DirNode node = backends::read_dir(d()->memmap_prefix);
  refresh_impl(*d(), node, LoadOptions());
  report_warnings(node, LoadOptions());
  if (d()->locked) lock_();  // register the lock on new children
  return *this;
}

//! a new, empty level `key` of the memmap TensorDict `parent`: its directory and meta.json first, then the
//! parent's meta.json rewritten (atomically) to list it, then loaded into `parent` as a memmap TensorDict
static Entry& make_memmap_level(TensorDictImpl& parent, const std::string& key) {
  if (parent.memmap_prefix.empty()) throw ValueError("make_memmap: the parent of the new level '" + key + "' has no directory");
  // a tensorclass record keeps its TensorDict in <prefix>/_tensordict (as make_memmap's leaves)
  const std::string dir = parent.type_repr.empty() ? parent.memmap_prefix : join_path(parent.memmap_prefix, "_tensordict");
  DirNode level;
  level.kind = NodeKind::TensorDict;
  level.type_repr = backends::type_repr::kTensorDict;
  level.batch_size = parent.batch_size;
  level.device = std::string("cpu");
  backends::write_tree(join_path(dir, backends::encode_key(key)), level,
                       [](const DirNode&, const backends::LeafMeta&) { return at::Tensor(); });
  DirNode node = backends::read_dir(parent.memmap_prefix);
  DirNode* td_node = &node;
  if (node.kind == NodeKind::TensorClass) {
    for (auto& de : node.entries)
      if (de.key == "_tensordict" && de.child) td_node = de.child.get();
  }
  if (!td_node->find(key)) {  // read_dir may already list the new directory
    td_node->add_child(key, level);
    backends::write_meta(dir, *td_node);
  }
  refresh_impl(parent, backends::read_dir(parent.memmap_prefix), LoadOptions());
  Entry* e = parent.find(key);
  if (!e || !e->is_tensordict()) throw BackendError("make_memmap: the new level '" + key + "' did not load back");
  return *e;
}

TensorDict& make_memmap(TensorDict& td, const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) {
  TensorDictImpl* root = detail::impl_of(td).get();
  if (!root->is_memmap || root->memmap_prefix.empty()) {
    throw ValueError("make_memmap needs a memmap TensorDict saved to a directory (call memmap_(prefix) first)");
  }
  if (td.contains(key)) throw KeyError("make_memmap: key " + key.repr() + " already exists");
  for (const auto& part : key.parts()) {  // as memmap_ refuses them: Python would misread the meta.json
    if (part == "shape" || part == "device" || part == "_type") {
      throw ValueError("make_memmap: key " + key.repr() + " cannot be saved: '" + part +
                       "' is what Python's meta.json uses for the TensorDict itself");
    }
  }
  if (shape.size() < root->batch_size.size() ||
      !std::equal(root->batch_size.begin(), root->batch_size.end(), shape.begin())) {
    throw BatchSizeError("make_memmap: shape " + detail::shape_str(shape) + " does not start with the batch size " +
                         detail::shape_str(root->batch_size));
  }
  TensorDictImpl* parent = root;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    Entry* e = parent->find(key[i]);
    if (!e) e = &make_memmap_level(*parent, key[i]);  // as set(("a", "b"), x) creates "a" (upstream)
    if (!e->is_tensordict()) throw KeyError("make_memmap: '" + key[i] + "' is not a TensorDict");
    parent = detail::impl_of(e->tensordict()).get();
  }
  if (parent->memmap_prefix.empty()) throw ValueError("make_memmap: the parent has no directory");
  std::string dir = parent->memmap_prefix;
  if (!parent->type_repr.empty()) dir = join_path(dir, "_tensordict");
  at::Tensor t = backends::create_and_map(join_path(dir, backends::encode_key(key.back()) + ".memmap"), dtype, shape);
  if (t.numel() == 0) t = at::zeros(shape, at::TensorOptions().dtype(dtype));
  parent->entries.emplace_back(key.back(), Entry(t));
  // rewrite that level's meta.json (atomically)
  DirNode node = backends::read_dir(parent->memmap_prefix);
  DirNode* td_node = &node;
  if (node.kind == NodeKind::TensorClass) {
    for (auto& de : node.entries)
      if (de.key == "_tensordict" && de.child) td_node = de.child.get();
  }
  td_node->add_leaf(leaf_meta(key.back(), t));
  backends::write_meta(dir, *td_node);
  return td;
}

std::string memmap_prefix(const TensorDict& td) { return detail::impl_of(td)->memmap_prefix; }

int64_t prefault(const TensorDict& td) {
  int64_t bytes = 0;
  for (const auto& kv : td.items(KeysOptions().include_nested(true).leaves_only(true))) {
    if (!kv.second.is_tensor()) continue;
    const at::Tensor& t = kv.second.tensor();
    if (!backends::mapping_of(t)) continue;  // not a file mapping: its pages are the allocator's
    // the blocks first: a page populated over a hole would be allocated block by block by its writeback
    backends::allocate_for_write(t);
    if (backends::populate_for_write(t)) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  }
  return bytes;
}

std::string TensorDict::type_name() const {
  if (typed_) return typed_->name;
  if (node_ && !detail::tree::dense_level(*this)) return node_->type_name();  // no dense level: the node's class
  if (d()->type_repr.empty()) return "TensorDict";
  const std::string r = class_path();  // "pkg.mod.Name" -> "Name"
  auto dot = r.rfind('.');
  return dot == std::string::npos ? r : r.substr(dot + 1);
}

std::string TensorDict::class_path() const {
  if (typed_) return typed_->tensorclass ? typed_->class_path : "";
  if (node_ && !detail::tree::dense_level(*this)) return "";
  // "<class 'pkg.mod.Name'>" -> "pkg.mod.Name"
  std::string r = d()->type_repr;
  auto q1 = r.find('\'');
  auto q2 = r.rfind('\'');
  if (q1 != std::string::npos && q2 != std::string::npos && q2 > q1) r = r.substr(q1 + 1, q2 - q1 - 1);
  return r;
}

LazyStackedTensorDict LazyStackedTensorDict::load_memmap(const std::string& prefix, const LoadOptions& options) {
  return load_one_save(prefix, options, [&](const DirNode& root) {
    if (root.kind != NodeKind::LazyStackedTensorDict) {
      throw TypeError("'" + prefix + "' holds a " + std::string(backends::node_kind_name(root.kind)) +
                      ", not a LazyStackedTensorDict");
    }
    LazyStackedTensorDict lazy = lazy_from_node(root, options);
    report_warnings(root, options);
    return lazy;
  });
}

bool is_lazy_stack_dir(const std::string& prefix) {
  try {
    JsonValue meta = JsonValue::parse([&] {
      // only a regular meta.json, never through a symlink, never blocking on a fifo (load_memmap reports those)
      std::string path = join_path(prefix, "meta.json");
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::string();
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
      if (fd < 0) return std::string();
      std::string s;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
      ::close(fd);
      return s;
    }());
    const JsonValue* t = meta.find("_type");
    return t && t->is_string() && t->as_string() == backends::type_repr::kLazyStackedTensorDict;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace tensordict
