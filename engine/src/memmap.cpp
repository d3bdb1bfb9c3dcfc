// TensorDict persistence in Python tensordict's memmap directory format (upstream-formats.md §1):
// memmap_, memmap, memmap_like, save, load_memmap, load_memmap_, memmap_refresh_, make_memmap,
// and LazyStackedTensorDict's directory layout. The file format itself lives in backends/memmap_*.
#include <unistd.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <thread>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/lazy_stack.hpp"

namespace fs = std::filesystem;

namespace tensordict {
namespace {

using backends::DirEntry;
using backends::DirNode;
using backends::LeafMeta;
using backends::NodeKind;

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw BackendError("cannot create directory '" + dir + "': " + ec.message());
}

//! one leaf to write: the tensor and where its mapped replacement goes
struct LeafJob {
  std::string path;  // where it is written (inside the staging directory of a staged save)
  at::Tensor source;
  Entry* target;     // entry to replace with the mapped tensor (memmap_); nullptr: only write
  bool zeros_only;   // memmap_like: preallocate, copy nothing
  bool reuse;        // already mapped to the final path: keep the mapping (a staged save links the file)
  at::Tensor result;
  std::string final_path = {};  // where the leaf lives once the save is committed
};

//! A save into `prefix` written into a sibling staging directory and switched in by one rename
//! (renameat2 RENAME_EXCHANGE over an existing directory), so that a writer killed at any moment leaves
//! `prefix` holding the old save or the new one, never a mix (tests/api/test_faults.cpp). Files of the old
//! directory that the new save does not write (stale leaves, a user's own files) are hard-linked into the
//! staging directory first, as an in-place save would have left them. The staging directory is held by a lock
//! for its life (backends::StagingDir): the next save of the same prefix removes only staging directories whose
//! lock it can take (their writer died), never a live writer's in another PID namespace or on another host. When
//! the parent directory is not writable the save is written in place (the old behaviour).
//! durable: every leaf file and meta.json is fsynced before the rename, and the parent directory after it.
class StagedSave {
 public:
  StagedSave(const std::string& prefix, bool durable);
  StagedSave(const StagedSave&) = delete;
  StagedSave& operator=(const StagedSave&) = delete;
  //! the path inside the staging directory for a path below prefix (itself when not staged)
  std::string at(const std::string& final_path) const;
  bool staged() const { return !stage_.empty(); }
  //! switches the staging directory in; the mappings made from it are renamed to prefix
  void commit();

 private:
  std::string prefix_;
  backends::StagingDir dir_;
  std::string stage_;
  bool durable_;
  bool committed_ = false;
};

//! whether a mapped address still belongs to the file a path names (/proc/self/maps, read once per save)
class MappedInodes {
 public:
  bool same_file(const void* p, const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return false;
    if (!loaded_) load();
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const Range& r : ranges_)
      if (a >= r.start && a < r.end) return r.inode == static_cast<unsigned long>(st.st_ino);
    return false;
  }

 private:
  struct Range {
    uintptr_t start, end;
    unsigned long inode;
  };
  void load() {
    loaded_ = true;
    FILE* f = std::fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      unsigned long start = 0, end = 0, off = 0, inode = 0;
      char perms[8], dev[32];
      if (std::sscanf(line, "%lx-%lx %7s %lx %31s %lu", &start, &end, perms, &off, dev, &inode) == 6 && inode != 0)
        ranges_.push_back({start, end, inode});
    }
    std::fclose(f);
  }
  bool loaded_ = false;
  std::vector<Range> ranges_;
};

//! the plan of a whole tree: leaf jobs, then meta.json files bottom-up
struct WritePlan {
  MappedInodes inodes;
  const StagedSave* stage = nullptr;
  bool durable = false;  //!< MemmapOptions::durable: leaf files fsynced once written
  std::vector<LeafJob> leaves;
  std::vector<std::pair<std::string, std::shared_ptr<DirNode>>> metas;  // post-order: children first
  //! where a path below the prefix is written
  std::string at(const std::string& p) const { return stage ? stage->at(p) : p; }
};

//! lexically normal, without a trailing slash ("./a//b/" -> "a/b")
std::string strip_slashes(const std::string& path) {
  std::string p = fs::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

//! links (or, for symlinks, recreates) every entry of `old_dir` missing from `new_dir`, recursively
void link_missing(const fs::path& old_dir, const fs::path& new_dir) {
  std::error_code ec;
  for (fs::directory_iterator it(old_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path target = new_dir / it->path().filename();
    const fs::file_status st = it->symlink_status(ec);
    if (ec) return;
    const fs::file_status tst = fs::symlink_status(target, ec);
    ec.clear();
    if (fs::exists(tst)) {
      if (fs::is_directory(st) && fs::is_directory(tst)) link_missing(it->path(), target);
      continue;
    }
    std::error_code e2;
    if (fs::is_symlink(st)) {
      fs::copy_symlink(it->path(), target, e2);
    } else if (fs::is_directory(st)) {
      fs::create_directory(target, e2);
      if (!e2) link_missing(it->path(), target);
    } else if (fs::is_regular_file(st)) {
      fs::create_hard_link(it->path(), target, e2);
      if (e2) fs::copy_file(it->path(), target, e2);
    }
    if (e2) throw BackendError("cannot carry '" + it->path().string() + "' into the new save: " + e2.message());
  }
}

StagedSave::StagedSave(const std::string& prefix, bool durable)
    : prefix_(strip_slashes(prefix)), dir_(prefix_), stage_(dir_.path()), durable_(durable) {}

std::string StagedSave::at(const std::string& final_path) const {
  if (stage_.empty()) return final_path;
  const std::string f = strip_slashes(final_path);
  if (f == prefix_) return stage_;
  if (f.size() > prefix_.size() && f.compare(0, prefix_.size(), prefix_) == 0 && f[prefix_.size()] == '/')
    return stage_ + f.substr(prefix_.size());
  return final_path;
}

void StagedSave::commit() {
  if (stage_.empty() || committed_) return;
  std::error_code ec;
  const bool existed = fs::is_directory(fs::symlink_status(prefix_, ec));
  if (!existed) {
    if (::rename(stage_.c_str(), prefix_.c_str()) != 0)
      throw BackendError("cannot move the staged save '" + stage_ + "' to '" + prefix_ + "': " + std::strerror(errno));
  } else {
    link_missing(prefix_, stage_);
    if (::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, prefix_.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS)
        throw BackendError("cannot switch the staged save '" + stage_ + "' in for '" + prefix_ +
                           "': " + std::strerror(errno));
      // a filesystem without RENAME_EXCHANGE: two renames (prefix is briefly absent, never a mix)
      const std::string old = stage_ + ".old";  // removed with the staging directory
      if (::rename(prefix_.c_str(), old.c_str()) != 0)
        throw BackendError("cannot switch the staged save '" + stage_ + "' in for '" + prefix_ +
                           "': " + std::strerror(errno));
      if (::rename(stage_.c_str(), prefix_.c_str()) != 0) {
        const int err = errno;
        ::rename(old.c_str(), prefix_.c_str());  // the old save back under its name
        throw BackendError("cannot switch the staged save '" + stage_ + "' in for '" + prefix_ +
                           "': " + std::strerror(err));
      }
    }
  }
  committed_ = true;
  // the old directory (now at the staging name) is removed by dir_ once the new one is in: a load holding it
  // open reads it whole or sees its files go and starts again on the new one
  if (durable_) {
    const std::string parent = fs::path(prefix_).parent_path().string();
    backends::sync_path(parent.empty() ? "." : parent, /*directory=*/true);
  }
  backends::rename_mapped_files(stage_, prefix_);
}

LeafMeta leaf_meta(const std::string& key, const at::Tensor& t) {
  LeafMeta m;
  m.key = key;
  m.dtype = t.scalar_type();
  m.shape.assign(t.sizes().begin(), t.sizes().end());
  m.device = "cpu";
  m.is_nested = false;
  m.file = t.numel() == 0 ? "" : backends::encode_key(key) + ".memmap";
  return m;
}

DirNode non_tensor_node(const Entry& e) {
  DirNode n;
  if (e.is_non_tensor_data()) {
    n.kind = NodeKind::NonTensorData;
    n.type_repr = backends::type_repr::kNonTensorData;
    const JsonValue& v = e.non_tensor_data().value();
    if (v.is_bytes()) {
      n.pickle = v.as_bytes();
    } else {
      n.data = v;
    }
  } else {
    n.kind = NodeKind::NonTensorStack;
    n.type_repr = backends::type_repr::kNonTensorStack;
    n.stack_dim = 0;
    n.data = e.non_tensor_stack().tolist();
    n.batch_size = e.non_tensor_stack().batch_size();
  }
  return n;
}

//! plans the writing of `impl` into `dir`; returns the node whose meta.json is written in `dir`
std::shared_ptr<DirNode> plan_tree(TensorDictImpl& impl, const std::string& dir, const MemmapOptions& o,
                                   bool like, bool replace, WritePlan& plan) {
  make_dirs(plan.at(dir));
  std::string td_dir = dir;
  if (!impl.type_repr.empty()) td_dir = join_path(dir, "_tensordict");  // tensorclass record
  make_dirs(plan.at(td_dir));
  auto node = std::make_shared<DirNode>();
  node->kind = NodeKind::TensorDict;
  node->type_repr = backends::type_repr::kTensorDict;
  node->batch_size = impl.batch_size;
  node->device = std::string("cpu");
  for (auto& kv : impl.entries) {
    const std::string& key = kv.first;
    Entry& e = kv.second;
    if (key == "shape" || key == "device" || key == "_type") {
      throw ValueError("key '" + key + "' cannot be saved: Python's meta.json uses it for the TensorDict itself "
                       "and would lose the entry on load");
    }
    if (e.is_tensor()) {
      const at::Tensor& t = e.tensor();
      if (t.is_nested()) throw TypeError("nested (ragged) tensor leaves cannot be memory-mapped yet: " + key);
      LeafMeta m = leaf_meta(key, t);
      std::string path = join_path(td_dir, backends::encode_key(key) + ".memmap");
      LeafJob job{plan.at(path), t, replace ? &e : nullptr, like, false, {}, path};
      if (!like && t.numel() > 0) {
        auto info = backends::mapping_of(t);
        if (info && !info->anonymous && !info->filename.empty()) {
          bool same = false;
          std::error_code ec;
          same = fs::equivalent(info->filename, path, ec);
          // the name may now be another file: a later save replaced the directory this leaf was mapped from
          // (the leaf still reads its own, older file). Then its data is written like any other tensor's.
          const bool replaced = same && !plan.inodes.same_file(t.data_ptr(), path);
          if (replaced) {
            same = false;
          } else if (same && info->nbytes == t.numel() * static_cast<int64_t>(t.element_size()) &&
                     t.is_contiguous() && t.storage_offset() == 0) {
            job.reuse = true;
          } else if (same && !plan.stage) {
            job.source = t.clone();  // the file is about to be rewritten: read the data out first
          } else if (!same && !o.copy_existing() && replace) {
            throw ValueError("the leaf '" + key + "' is already memory-mapped to '" + info->filename +
                             "'; memmap_ into '" + path + "' needs copy_existing=true");
          }
        }
      }
      plan.leaves.push_back(std::move(job));
      node->add_leaf(m);
    } else if (e.is_tensordict()) {
      TensorDict child = e.tensordict();
      std::string cdir = join_path(td_dir, backends::encode_key(key));
      if (const LazyStackNode* lz = detail::lazy_node(child)) {
        // a lazy stack inside the TensorDict: its directory {"_type", "stack_dim"} and its members in 0/, 1/...
        // (upstream's layout; loading keeps it lazy)
        make_dirs(plan.at(cdir));
        auto lnode = std::make_shared<DirNode>();
        lnode->kind = NodeKind::LazyStackedTensorDict;
        lnode->type_repr = backends::type_repr::kLazyStackedTensorDict;
        lnode->stack_dim = lz->stack_dim;
        lnode->batch_size = child.batch_size();
        for (size_t i = 0; i < lz->members.size(); ++i) {
          const TensorDict& m = lz->members[i];
          if (!m.is_dense()) {
            throw NotImplementedError("memmap of the lazy stack at '" + key + "': member " + std::to_string(i) +
                                      " is a " + m.node()->type_name() + " (dense members only)");
          }
          plan_tree(*m.impl(), join_path(cdir, std::to_string(i)), o, like, replace, plan);
        }
        plan.metas.emplace_back(plan.at(cdir), lnode);
        node->add_child(key, *lnode);
        continue;
      }
      auto cnode = plan_tree(*child.impl(), cdir, o, like, replace, plan);
      DirNode copy = *cnode;
      node->add_child(key, copy);
    } else if (e.is_non_tensor()) {
      std::string cdir = join_path(td_dir, backends::encode_key(key));
      make_dirs(plan.at(cdir));
      auto cnode = std::make_shared<DirNode>(non_tensor_node(e));
      plan.metas.emplace_back(plan.at(cdir), cnode);
      node->add_child(key, *cnode);
    }
  }
  if (!impl.type_repr.empty()) {
    plan.metas.emplace_back(plan.at(td_dir), node);
    auto outer = std::make_shared<DirNode>();
    outer->kind = NodeKind::TensorClass;
    outer->type_repr = impl.type_repr;
    outer->batch_size = impl.batch_size;
    outer->data = impl.class_fields ? *impl.class_fields : JsonValue::object();
    outer->pickle = impl.class_pickle;
    outer->add_child("_tensordict", *node);
    plan.metas.emplace_back(plan.at(dir), outer);
    return outer;
  }
  plan.metas.emplace_back(plan.at(dir), node);
  return node;
}

void write_leaf_job(LeafJob& job) {
  const at::Tensor& t = job.source;
  if (job.reuse) {
    backends::flush(t);
    job.result = t;
    if (!job.final_path.empty() && job.path != job.final_path) {  // staged: the same file, linked
      std::error_code ec;
      fs::create_hard_link(job.final_path, job.path, ec);
      if (ec) backends::write_file(job.path, t);
    }
    return;
  }
  if (t.numel() == 0) {
    std::error_code ec;
    fs::remove(job.path, ec);  // Python writes no file for an empty leaf
    job.result = at::empty(t.sizes(), t.options().device(at::kCPU));
    return;
  }
  if (job.zeros_only) {
    job.result = backends::create_and_map(job.path, t.scalar_type(), t.sizes());
  } else {
    job.result = backends::write_and_map(job.path, t, /*writable=*/true);
  }
}

//! writes a leaf; durable: then fsyncs its file (meta.json files are always fsynced: backends' atomic_write)
void run_leaf_job(LeafJob& job, bool durable) {
  write_leaf_job(job);
  if (durable && job.source.numel() > 0) backends::sync_path(job.path, /*directory=*/false);
}

void run_jobs(std::vector<LeafJob>& jobs, int64_t num_threads, bool durable) {
  if (num_threads <= 1 || jobs.size() < 2) {
    for (auto& j : jobs) run_leaf_job(j, durable);
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr first_error;
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      try {
        run_leaf_job(jobs[i], durable);
      } catch (...) {
        std::lock_guard<std::mutex> g(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  size_t n = std::min<size_t>(static_cast<size_t>(num_threads), jobs.size());
  for (size_t i = 0; i < n; ++i) pool.emplace_back(work);
  for (auto& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}

void mark_memmap(const std::shared_ptr<TensorDictImpl>& impl, const std::string& prefix) {
  impl->is_memmap = true;
  impl->is_shared = false;
  impl->memmap_prefix = prefix;
  std::string base = (prefix.empty() || impl->type_repr.empty()) ? prefix : join_path(prefix, "_tensordict");
  for (auto& kv : impl->entries) {
    if (kv.second.is_tensordict()) {
      std::string sub = base.empty() ? "" : join_path(base, backends::encode_key(kv.first));
      TensorDict child = kv.second.tensordict();
      if (const LazyStackNode* lz = detail::lazy_node(child)) {  // members in sub/0, sub/1, ...
        for (size_t i = 0; i < lz->members.size(); ++i) {
          mark_memmap(lz->members[i].impl(), sub.empty() ? "" : join_path(sub, std::to_string(i)));
        }
        continue;
      }
      mark_memmap(child.impl(), sub);
    }
  }
}

void check_prefix(const std::string& prefix, const MemmapOptions& o) {
  if (!o.existsok() && fs::exists(join_path(prefix, "meta.json"))) {
    throw ValueError("'" + prefix + "' already holds a saved TensorDict (existsok=false)");
  }
  std::error_code ec;
  if (fs::is_symlink(prefix, ec)) throw ValueError("refusing to write through the symlink '" + prefix + "'");
}

// ------------------------------------------------------------------------------------------ loading
backends::ReadOptions read_options(const LoadOptions& o) {
  backends::ReadOptions r;
  r.follow_symlinks = o.follow_symlinks();
  r.allow_missing = o.allow_missing();
  return r;
}

//! Hands every warning of the tree read by read_dir to o.on_warning (stderr when unset).
void report_warnings(const DirNode& node, const LoadOptions& o) {
  for (const auto& w : node.warnings) {
    const std::string text = "'" + node.path + "': " + w;
    if (o.on_warning())
      o.on_warning()(text);
    else
      std::cerr << "tensordict: warning: " << text << "\n";
  }
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
  if (root.kind == NodeKind::LazyStackedTensorDict) {
    throw TypeError("'" + prefix + "' holds a LazyStackedTensorDict: load it with LazyStackedTensorDict::load_memmap");
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

}  // namespace

// ============================================================================ TensorDict methods
TensorDict& TensorDict::memmap_(const std::string& prefix, const MemmapOptions& options) {
  if (detail::is_remote(*this)) {
    throw NotImplementedError("memmap_ on a " + node_->type_name() +
                              ": its leaves live in its storage; to_tensordict() (contiguous()) first, or memmap()");
  }
  if (d()->is_shared) {
    throw ValueError("memmap_ and share_memory_ are mutually exclusive: this TensorDict is in shared memory");
  }
  if (prefix.empty()) {  // anonymous shared memory
    std::function<void(TensorDictImpl&)> anon = [&](TensorDictImpl& impl) {
      for (auto& kv : impl.entries) {
        if (kv.second.is_tensor()) {
          const at::Tensor& t = kv.second.tensor();
          if (backends::mapping_of(t)) continue;
          at::Tensor m = backends::map_anonymous(t.scalar_type(), t.sizes());
          if (t.numel() > 0) m.copy_(t);
          kv.second = Entry(m);
        } else if (kv.second.is_tensordict()) {
          anon(*kv.second.tensordict().impl());
        }
      }
    };
    anon(*d());
    mark_memmap(impl(), "");
    lock_();
    return *this;
  }
  check_prefix(prefix, options);
  StagedSave stage(prefix, options.durable());
  WritePlan plan;
  plan.stage = &stage;
  plan.durable = options.durable();
  plan_tree(*d(), prefix, options, /*like=*/false, /*replace=*/true, plan);
  run_jobs(plan.leaves, options.num_threads(), plan.durable);
  for (const auto& m : plan.metas) backends::write_meta(m.first, *m.second);
  stage.commit();
  for (auto& j : plan.leaves)
    if (j.target) *j.target = Entry(j.result);
  mark_memmap(impl(), prefix);
  lock_();
  return *this;
}

TensorDict TensorDict::memmap(const std::string& prefix, const MemmapOptions& options) const {
  if (detail::is_remote(*this)) return contiguous().memmap(prefix, options);  // a remote node: on its dense form
  TensorDict out = copy();
  out.impl()->type_repr = d()->type_repr;
  out.impl()->class_fields = d()->class_fields;
  out.impl()->class_pickle = d()->class_pickle;
  // the copy's leaves are this TensorDict's: re-writing them elsewhere is what memmap() means
  MemmapOptions o = options;
  o.copy_existing(true);
  if (prefix.empty()) {
    // anonymous: copy even leaves that are already mapped (the copy must not alias this TD)
    out = clone();
  }
  out.memmap_(prefix, o);
  return out;
}

TensorDict TensorDict::save(const std::string& prefix, const MemmapOptions& options) const {
  if (prefix.empty()) throw ValueError("save needs a prefix (a directory)");
  return memmap(prefix, options);
}

TensorDict TensorDict::memmap_like(const std::string& prefix, const MemmapOptions& options) const {
  if (detail::is_remote(*this)) return contiguous().memmap_like(prefix, options);  // a remote node: on its dense form
  TensorDict out = copy();
  out.impl()->type_repr = d()->type_repr;
  out.impl()->class_fields = d()->class_fields;
  if (prefix.empty()) {
    std::function<void(TensorDictImpl&)> anon = [&](TensorDictImpl& impl) {
      for (auto& kv : impl.entries) {
        if (kv.second.is_tensor()) {
          const at::Tensor& t = kv.second.tensor();
          kv.second = Entry(backends::map_anonymous(t.scalar_type(), t.sizes()));
        } else if (kv.second.is_tensordict()) {
          anon(*kv.second.tensordict().impl());
        }
      }
    };
    anon(*out.impl());
    mark_memmap(out.impl(), "");
    out.lock_();
    return out;
  }
  check_prefix(prefix, options);
  StagedSave stage(prefix, options.durable());
  WritePlan plan;
  plan.stage = &stage;
  plan.durable = options.durable();
  plan_tree(*out.impl(), prefix, options, /*like=*/true, /*replace=*/true, plan);
  run_jobs(plan.leaves, options.num_threads(), plan.durable);
  for (const auto& m : plan.metas) backends::write_meta(m.first, *m.second);
  stage.commit();
  for (auto& j : plan.leaves)
    if (j.target) *j.target = Entry(j.result);
  mark_memmap(out.impl(), prefix);
  out.lock_();
  return out;
}

TensorDict TensorDict::load_memmap(const std::string& prefix, const LoadOptions& options) {
  return load_tree(prefix, options);
}

TensorDict TensorDict::load(const std::string& prefix, const LoadOptions& options) {
  return load_tree(prefix, options);
}

TensorDict& TensorDict::load_memmap_(const std::string& prefix, const LoadOptions& options) {
  TensorDict loaded = load_tree(prefix, options);
  if (d()->locked) {
    throw LockedError("Cannot modify locked TensorDict: load_memmap_ replaces the entries; unlock it first");
  }
  d()->entries = loaded.impl()->entries;
  d()->batch_size = loaded.impl()->batch_size;
  d()->device = loaded.impl()->device;
  d()->type_repr = loaded.impl()->type_repr;
  d()->class_fields = loaded.impl()->class_fields;
  d()->class_pickle = loaded.impl()->class_pickle;
  for (auto& kv : d()->entries)
    if (kv.second.is_tensordict()) kv.second.tensordict().impl()->locked_parents.clear();
  mark_memmap(impl(), prefix);
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
      if (!de.is_leaf && de.child && mine->is_tensordict()) refresh_impl(*mine->tensordict().impl(), *de.child, o);
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
        auto child = kv.second.tensordict().impl();
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

TensorDict& TensorDict::make_memmap(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) {
  if (!d()->is_memmap || d()->memmap_prefix.empty()) {
    throw ValueError("make_memmap needs a memmap TensorDict saved to a directory (call memmap_(prefix) first)");
  }
  if (contains(key)) throw KeyError("make_memmap: key " + key.repr() + " already exists");
  for (const auto& part : key.parts()) {  // as memmap_ refuses them: Python would misread the meta.json
    if (part == "shape" || part == "device" || part == "_type") {
      throw ValueError("make_memmap: key " + key.repr() + " cannot be saved: '" + part +
                       "' is what Python's meta.json uses for the TensorDict itself");
    }
  }
  if (shape.size() < d()->batch_size.size() ||
      !std::equal(d()->batch_size.begin(), d()->batch_size.end(), shape.begin())) {
    throw BatchSizeError("make_memmap: shape " + detail::shape_str(shape) + " does not start with the batch size " +
                         detail::shape_str(d()->batch_size));
  }
  TensorDictImpl* parent = d();
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    Entry* e = parent->find(key[i]);
    if (!e) e = &make_memmap_level(*parent, key[i]);  // as set(("a", "b"), x) creates "a" (upstream)
    if (!e->is_tensordict()) throw KeyError("make_memmap: '" + key[i] + "' is not a TensorDict");
    parent = e->tensordict().impl().get();
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
  return *this;
}

std::string TensorDict::memmap_prefix() const { return d()->memmap_prefix; }

std::string TensorDict::type_name() const {
  if (typed_) return typed_->name;
  if (!is_dense() && node() && !node()->dense_view()) return node()->type_name();
  if (d()->type_repr.empty()) return "TensorDict";
  // "<class 'pkg.mod.Name'>" -> "Name"
  std::string r = d()->type_repr;
  auto q1 = r.find('\'');
  auto q2 = r.rfind('\'');
  if (q1 != std::string::npos && q2 != std::string::npos && q2 > q1) r = r.substr(q1 + 1, q2 - q1 - 1);
  auto dot = r.rfind('.');
  return dot == std::string::npos ? r : r.substr(dot + 1);
}

// ============================================================================ LazyStackedTensorDict
// (construction, batch size, keys, densification: lazy_stack.cpp)
LazyStackedTensorDict& LazyStackedTensorDict::memmap_(const std::string& prefix, const MemmapOptions& options) {
  if (prefix.empty()) throw ValueError("LazyStackedTensorDict::memmap_ needs a prefix");
  make_dirs(prefix);
  const auto& tds = tensordicts();
  for (size_t i = 0; i < tds.size(); ++i) TensorDict(tds[i]).memmap_(join_path(prefix, std::to_string(i)), options);
  DirNode node;
  node.kind = NodeKind::LazyStackedTensorDict;
  node.type_repr = backends::type_repr::kLazyStackedTensorDict;
  node.stack_dim = stack_dim();
  backends::write_meta(prefix, node);
  return *this;
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
