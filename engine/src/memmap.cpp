// TensorDict persistence in Python tensordict's memmap directory format (upstream-formats.md §1), saving:
// memmap_, memmap, memmap_like, save (staged into a sibling directory and switched in), and
// LazyStackedTensorDict::memmap_. Loading, memmap_refresh_ and make_memmap: memmap_load.cpp. The file
// format itself lives in backends/memmap_*.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <set>
#include <string_view>
#include <thread>

#include "memmap_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "lazy_stack_node.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tree_visitor.hpp"

namespace fs = std::filesystem;

namespace tensordict {

namespace detail::memmap {

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

//! the tensorclass record a save writes: "<class 'PATH'>" for MemmapOptions().class_path(PATH), else `own`
std::string class_record(const MemmapOptions& o, const std::string& own) {
  const std::string& path = o.class_path();
  if (path.empty()) return own;
  for (char c : path) {
    if (c == '\'' || c == '"' || c == '<' || c == '>' || static_cast<unsigned char>(c) < 0x20) {
      throw ValueError("MemmapOptions().class_path: '" + path + "' is not a class path (\"pkg.mod.Name\")");
    }
  }
  return "<class '" + path + "'>";
}

namespace {
//! marks each level of a saved tree with its directory ("" throughout for an anonymous save)
struct MarkVisitor : detail::tree::SavedShapeVisitor<std::string> {
  static void mark(TensorDictImpl& level, const std::string& dir) {
    level.is_memmap = true;
    level.is_shared = false;
    level.memmap_prefix = dir;
  }
  std::string sub(TensorDictImpl& level, std::string& dir, const std::string& key, TensorDictImpl& child) {
    std::string cdir = child_dir(level, dir, key);
    mark(child, cdir);
    return cdir;
  }
  std::string stack(TensorDictImpl& level, std::string& dir, const std::string& key, const TensorDict&,
                    const StackMembers&) {
    return child_dir(level, dir, key);
  }
  std::string member(std::string& stack_dir, size_t i, TensorDictImpl& m) {  // members in sub/0, sub/1, ...
    std::string mdir = stack_dir.empty() ? "" : join_path(stack_dir, std::to_string(i));
    mark(m, mdir);
    return mdir;
  }
  //! a sub-TensorDict's directory: below `_tensordict` for a tensorclass record
  static std::string child_dir(const TensorDictImpl& level, const std::string& dir, const std::string& key) {
    if (dir.empty()) return "";
    const std::string base = level.type_repr.empty() ? dir : join_path(dir, "_tensordict");
    return join_path(base, backends::encode_key(key));
  }
};
}  // namespace

void mark_memmap(const std::shared_ptr<TensorDictImpl>& impl, const std::string& prefix) {
  MarkVisitor::mark(*impl, prefix);
  std::string dir = prefix;
  MarkVisitor v;
  detail::tree::walk_saved(*impl, dir, v);
}

}  // namespace detail::memmap

namespace {

using namespace detail::memmap;

//! every tensor leaf of the tree onto anonymous shared memory (memmap_ / memmap_like without a prefix);
//! `copy`: with its values, a leaf that is mapped already kept as it is
void map_anonymous_leaves(TensorDictImpl& root, bool copy) {
  detail::tree::for_each_leaf_mut(root, [&](const detail::tree::KeyPath&, Entry& e) {
    if (!e.is_tensor()) return;
    const at::Tensor& t = e.tensor();
    if (copy && backends::mapping_of(t)) return;
    at::Tensor m = backends::map_anonymous(t.scalar_type(), t.sizes());
    if (copy && t.numel() > 0) m.copy_(t);
    e = Entry(m);
  });
}

void make_dirs(const std::string& dir) {
  // one mkdir when the parent exists (a save makes each level's directory after its parent's): create_directories
  // stats the path and its parent around its mkdir, four calls per level
  if (::mkdir(dir.c_str(), 0777) == 0) return;
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
//! durable: every leaf file, meta.json and directory of the staging directory is fsynced before the rename, and
//! the parent directory after it. Not durable (upstream's default): nothing is fsynced; the rename alone makes
//! the switch (a killed writer loses nothing the page cache holds).
class StagedSave {
 public:
  StagedSave(const std::string& prefix, bool durable);
  StagedSave(const StagedSave&) = delete;
  StagedSave& operator=(const StagedSave&) = delete;
  //! the path inside the staging directory for a path below prefix (itself when not staged)
  std::string at(const std::string& final_path) const;
  bool staged() const { return !stage_.empty(); }
  //! switches the staging directory in; the mappings made from it are renamed to prefix. `stack_dirs`: the
  //! directories (below prefix) this save writes lazy stacks into, whose old numbered members are not carried
  void commit(const std::vector<std::string>& stack_dirs = {});

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
  //! the lazy stacks' directories (final paths) with their number of members
  std::vector<std::pair<std::string, size_t>> stacks;
  //! where a path below the prefix is written
  std::string at(const std::string& p) const { return stage ? stage->at(p) : p; }
};

//! lexically normal, without a trailing slash ("./a//b/" -> "a/b")
std::string strip_slashes(const std::string& path) {
  std::string p = fs::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

//! whether a directory entry's name is a lazy stack's member ("0", "1", ...)
bool member_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

//! links (or, for symlinks, recreates) every entry of `old_dir` missing from `new_dir`, recursively. In a
//! directory of `stacks` (a lazy stack the new save writes) the old members the new save has not are not carried:
//! a load reads members 0, 1, ... while they exist, and would take a longer old stack's last members for the new one's
void link_missing(const fs::path& old_dir, const fs::path& new_dir, const std::set<std::string>& stacks) {
  std::error_code ec;
  const bool stack = stacks.count(new_dir.lexically_normal().string()) > 0;
  for (fs::directory_iterator it(old_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (stack && member_name(it->path().filename().string())) {
      const fs::file_status tst = fs::symlink_status(new_dir / it->path().filename(), ec);
      ec.clear();
      if (!fs::exists(tst)) continue;
    }
    const fs::path target = new_dir / it->path().filename();
    const fs::file_status st = it->symlink_status(ec);
    if (ec) return;
    const fs::file_status tst = fs::symlink_status(target, ec);
    ec.clear();
    if (fs::exists(tst)) {
      if (fs::is_directory(st) && fs::is_directory(tst)) link_missing(it->path(), target, stacks);
      continue;
    }
    std::error_code e2;
    if (fs::is_symlink(st)) {
      fs::copy_symlink(it->path(), target, e2);
    } else if (fs::is_directory(st)) {
      fs::create_directory(target, e2);
      if (!e2) link_missing(it->path(), target, stacks);
    } else if (fs::is_regular_file(st)) {
      fs::create_hard_link(it->path(), target, e2);
      if (e2) fs::copy_file(it->path(), target, e2);
    }
    if (e2) throw BackendError("cannot carry '" + it->path().string() + "' into the new save: " + e2.message());
  }
}

StagedSave::StagedSave(const std::string& prefix, bool durable)
    : prefix_(strip_slashes(prefix)), dir_(prefix_), stage_(dir_.path()), durable_(durable) {}

//! whether `rest` is "/c1/c2/..." with no empty, "." or ".." component: a path below a normal prefix that is
//! normal itself
bool plain_below(std::string_view rest) {
  if (rest.size() < 2 || rest.front() != '/') return false;
  size_t start = 1;
  while (start <= rest.size()) {
    const size_t end = std::min(rest.find('/', start), rest.size());
    const std::string_view c = rest.substr(start, end - start);
    if (c.empty() || c == "." || c == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string StagedSave::at(const std::string& final_path) const {
  if (stage_.empty()) return final_path;
  // the plan's paths are the prefix joined with encoded keys: when the prefix is given normal, they are too, and
  // lexically_normal (half of a 200-leaf save's planning, callgrind) is not needed to find the part below it
  if (final_path == prefix_) return stage_;
  if (prefix_ != "." && final_path.size() > prefix_.size() && final_path.compare(0, prefix_.size(), prefix_) == 0 &&
      plain_below(std::string_view(final_path).substr(prefix_.size())))
    return stage_ + final_path.substr(prefix_.size());
  const std::string f = strip_slashes(final_path);
  if (f == prefix_) return stage_;
  if (f.size() > prefix_.size() && f.compare(0, prefix_.size(), prefix_) == 0 && f[prefix_.size()] == '/')
    return stage_ + f.substr(prefix_.size());
  return final_path;
}

void StagedSave::commit(const std::vector<std::string>& stack_dirs) {
  if (stage_.empty() || committed_) return;
  std::error_code ec;
  const bool existed = fs::is_directory(fs::symlink_status(prefix_, ec));
  if (!existed) {
    if (::rename(stage_.c_str(), prefix_.c_str()) != 0)
      throw BackendError("cannot move the staged save '" + stage_ + "' to '" + prefix_ + "': " + std::strerror(errno));
  } else {
    std::set<std::string> stacks;
    for (const std::string& d : stack_dirs) stacks.insert(fs::path(at(d)).lexically_normal().string());
    link_missing(prefix_, stage_, stacks);
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

//! one level of a save being planned: its directory, where its leaves go (below `_tensordict` for a
//! tensorclass record) and its meta.json node
struct PlanLevel {
  std::string dir, td_dir;
  std::shared_ptr<DirNode> node;
};

//! plans the writing of a tree (tree::walk_saved): directories, one job per tensor leaf, one meta.json per
//! level (children before their parent), Python's layout
struct PlanVisitor : detail::tree::SavedShapeVisitor<PlanLevel> {
  const MemmapOptions& o;
  bool like, replace;
  WritePlan& plan;
  PlanVisitor(const MemmapOptions& opts, bool lk, bool rp, WritePlan& p) : o(opts), like(lk), replace(rp), plan(p) {}

  //! a level's directories and meta.json node
  PlanLevel open(const TensorDictImpl& impl, const std::string& dir) {
    PlanLevel l;
    l.dir = l.td_dir = dir;
    make_dirs(plan.at(dir));
    if (!impl.type_repr.empty()) {  // a tensorclass record
      l.td_dir = join_path(dir, "_tensordict");
      make_dirs(plan.at(l.td_dir));
    }
    l.node = std::make_shared<DirNode>();
    l.node->kind = NodeKind::TensorDict;
    l.node->type_repr = backends::type_repr::kTensorDict;
    l.node->batch_size = impl.batch_size;
    l.node->device = std::string("cpu");
    return l;
  }
  //! once its entries are planned: its meta.json (and its tensorclass record's); the node its parent lists
  std::shared_ptr<DirNode> close(const TensorDictImpl& impl, const PlanLevel& l) {
    if (impl.type_repr.empty()) {
      plan.metas.emplace_back(plan.at(l.dir), l.node);
      return l.node;
    }
    plan.metas.emplace_back(plan.at(l.td_dir), l.node);
    auto outer = std::make_shared<DirNode>();
    outer->kind = NodeKind::TensorClass;
    outer->type_repr = impl.type_repr;
    outer->batch_size = impl.batch_size;
    outer->data = impl.class_fields ? *impl.class_fields : JsonValue::object();
    outer->pickle = impl.class_pickle;
    outer->add_child("_tensordict", l.node);
    plan.metas.emplace_back(plan.at(l.dir), outer);
    return outer;
  }

  void leaf(TensorDictImpl&, PlanLevel& l, const std::string& key, Entry& e) {
    check_key(key);
    if (e.is_tensor()) {
      plan_tensor(l, key, e);
    } else if (e.is_non_tensor()) {
      std::string cdir = join_path(l.td_dir, backends::encode_key(key));
      make_dirs(plan.at(cdir));
      auto cnode = std::make_shared<DirNode>(non_tensor_node(e));
      plan.metas.emplace_back(plan.at(cdir), cnode);
      l.node->add_child(key, cnode);
    }
  }
  PlanLevel sub(TensorDictImpl&, PlanLevel& l, const std::string& key, TensorDictImpl& child) {
    check_key(key);
    return open(child, join_path(l.td_dir, backends::encode_key(key)));
  }
  void after_sub(TensorDictImpl&, PlanLevel& l, const std::string& key, TensorDictImpl& child, PlanLevel& cl) {
    auto cnode = close(child, cl);
    l.node->add_child(key, cnode);  // shared, not copied: a closed level's node does not change
  }
  //! a lazy stack inside the TensorDict: its directory {"_type", "stack_dim"} and its members in 0/, 1/...
  //! (upstream's layout; loading keeps it lazy)
  PlanLevel stack(TensorDictImpl&, PlanLevel& l, const std::string& key, const TensorDict& sub, const StackMembers& lz) {
    check_key(key);
    PlanLevel sl;
    sl.dir = sl.td_dir = join_path(l.td_dir, backends::encode_key(key));
    make_dirs(plan.at(sl.dir));
    sl.node = std::make_shared<DirNode>();
    sl.node->kind = NodeKind::LazyStackedTensorDict;
    sl.node->type_repr = backends::type_repr::kLazyStackedTensorDict;
    sl.node->stack_dim = lz.dim;
    sl.node->batch_size = sub.batch_size();
    plan.stacks.emplace_back(sl.dir, lz.members->size());
    return sl;
  }
  PlanLevel member(PlanLevel& sl, size_t i, TensorDictImpl& m) { return open(m, join_path(sl.dir, std::to_string(i))); }
  void after_member(PlanLevel&, size_t, TensorDictImpl& m, PlanLevel& ml) { close(m, ml); }
  void after_stack(TensorDictImpl&, PlanLevel& l, const std::string& key, const TensorDict&, PlanLevel& sl) {
    plan.metas.emplace_back(plan.at(sl.dir), sl.node);
    l.node->add_child(key, sl.node);
  }
  void other(const std::string& key, const TensorDict& sub) {
    throw NotImplementedError("memmap of '" + key + "': a " + sub.node()->type_name() +
                              " inside the TensorDict (dense TensorDicts and lazy stacks of them only)");
  }

  static void check_key(const std::string& key) {
    if (key == "shape" || key == "device" || key == "_type") {
      throw ValueError("key '" + key + "' cannot be saved: Python's meta.json uses it for the TensorDict itself "
                       "and would lose the entry on load");
    }
  }
  void plan_tensor(PlanLevel& l, const std::string& key, Entry& e) {
    const at::Tensor& t = e.tensor();
    if (t.is_nested()) throw TypeError("nested (ragged) tensor leaves cannot be memory-mapped yet: " + key);
    LeafMeta m = leaf_meta(key, t);
    std::string path = join_path(l.td_dir, backends::encode_key(key) + ".memmap");
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
    l.node->add_leaf(m);
  }
};

//! plans the writing of `impl` into `dir`; returns the node whose meta.json is written in `dir`
std::shared_ptr<DirNode> plan_tree(TensorDictImpl& impl, const std::string& dir, const MemmapOptions& o,
                                   bool like, bool replace, WritePlan& plan) {
  PlanVisitor v(o, like, replace, plan);
  PlanLevel root = v.open(impl, dir);
  detail::tree::walk_saved(impl, root, v);
  return v.close(impl, root);
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

//! writes a leaf; durable: then fsyncs its file
void run_leaf_job(LeafJob& job, bool durable) {
  write_leaf_job(job);
  if (durable && job.source.numel() > 0) backends::sync_path(job.path, /*directory=*/false);
}

//! the plan's leaf files and meta.json files on num_threads threads. A staged save writes into a directory nobody
//! reads until the commit switches it in whole: its files are all new, each meta.json a plain write, and its metas
//! are jobs of the same pass as its leaves (a 100-level module's 100 metas were written by one thread after the
//! leaves). A durable save writes its metas after every leaf (children first): a meta's fsync of its directory then
//! covers the leaf files created in it. A save in place (a parent that is not writable) writes its metas after
//! every leaf, each replaced atomically (temp file, fsync, rename)
void write_plan(WritePlan& plan, const StagedSave& stage, int64_t num_threads) {
  const size_t leaves = plan.leaves.size();
  if (!stage.staged() || plan.durable) {
    for_each_job(leaves, num_threads, [&](size_t i) { run_leaf_job(plan.leaves[i], plan.durable); });
    for (const auto& m : plan.metas) {
      if (stage.staged()) {
        backends::write_new_meta(m.first, *m.second, plan.durable);
      } else {
        backends::write_meta(m.first, *m.second);
      }
    }
    return;
  }
  for_each_job(leaves + plan.metas.size(), num_threads, [&](size_t i) {
    if (i < leaves) {
      run_leaf_job(plan.leaves[i], plan.durable);
    } else {
      const auto& m = plan.metas[i - leaves];
      backends::write_new_meta(m.first, *m.second, plan.durable);
    }
  });
}

//! a structure copy of a dense TensorDict for a save (its leaves shared, its tensorclass record kept)
TensorDict save_copy(const TensorDictImpl& level, const TensorDict& td) {
  TensorDict out = td.copy();
  const auto o = detail::impl_of(out);
  o->type_repr = level.type_repr;
  o->class_fields = level.class_fields;
  o->class_pickle = level.class_pickle;
  return out;
}

//! switches a written plan in: a staged save's directory, or in place (a parent that is not writable) the old
//! members of its lazy stacks past their new number removed (a load would read them as members)
void finish_save(const WritePlan& plan, StagedSave& stage) {
  std::vector<std::string> dirs;
  for (const auto& [dir, members] : plan.stacks) dirs.push_back(dir);
  if (stage.staged()) {
    stage.commit(dirs);
    return;
  }
  for (const auto& [dir, members] : plan.stacks) {
    for (size_t i = members;; ++i) {
      const std::string m = join_path(dir, std::to_string(i));
      std::error_code ec;
      if (!fs::is_directory(fs::symlink_status(m, ec))) break;
      fs::remove_all(m, ec);
      if (ec) throw BackendError("cannot remove the old member '" + m + "' of the lazy stack saved in place: " + ec.message());
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

}  // namespace

// ============================================================================ TensorDict methods
// each reaches its node (node.hpp): Node's defaults (node.cpp) refuse memmap_ where the leaves live in a
// storage and run memmap / memmap_like on the dense form; a store runs the dense node's form on its view
TensorDict& TensorDict::memmap_(const std::string& prefix, const MemmapOptions& options) {
  detail::node_of(*this, "memmap_").memmap_(*this, prefix, options);
  return *this;
}

TensorDict TensorDict::memmap(const std::string& prefix, const MemmapOptions& options) const {
  return detail::node_of(*this, "memmap").memmap(*this, prefix, options);
}

TensorDict TensorDict::memmap_like(const std::string& prefix, const MemmapOptions& options) const {
  return detail::node_of(*this, "memmap_like").memmap_like(*this, prefix, options);
}

void TensorDictImpl::memmap_(TensorDict& self, const std::string& prefix, const MemmapOptions& options) {
  const std::shared_ptr<TensorDictImpl> me = std::static_pointer_cast<TensorDictImpl>(shared_from_this());
  if (is_shared) {
    throw ValueError("memmap_ and share_memory_ are mutually exclusive: this TensorDict is in shared memory");
  }
  if (prefix.empty()) {  // anonymous shared memory
    map_anonymous_leaves(*this, /*copy=*/true);
    mark_memmap(me, "");
    self.lock_();
    return;
  }
  check_prefix(prefix, options);
  const std::string class_repr = class_record(options, type_repr);
  StagedSave stage(prefix, options.durable());
  WritePlan plan;
  plan.stage = &stage;
  plan.durable = options.durable();
  const std::string own_repr = type_repr;
  type_repr = class_repr;
  try {
    plan_tree(*this, prefix, options, /*like=*/false, /*replace=*/true, plan);
  } catch (...) {
    type_repr = own_repr;
    throw;
  }
  write_plan(plan, stage, options.num_threads());
  finish_save(plan, stage);
  for (auto& j : plan.leaves)
    if (j.target) *j.target = Entry(j.result);
  mark_memmap(me, prefix);
  self.lock_();
}

TensorDict TensorDictImpl::memmap(const TensorDict& self, const std::string& prefix, const MemmapOptions& options) const {
  TensorDict out = save_copy(*this, self);
  // the copy's leaves are this TensorDict's: re-writing them elsewhere is what memmap() means
  MemmapOptions o = options;
  o.copy_existing(true);
  if (prefix.empty()) {
    // anonymous: copy even leaves that are already mapped (the copy must not alias this TD)
    out = self.clone();
  }
  out.memmap_(prefix, o);
  return out;
}

TensorDict TensorDict::save(const std::string& prefix, const MemmapOptions& options) const {
  if (prefix.empty()) throw ValueError("save needs a prefix (a directory)");
  return memmap(prefix, options);
}

TensorDict TensorDictImpl::memmap_like(const TensorDict& self, const std::string& prefix,
                                       const MemmapOptions& options) const {
  TensorDict out = self.copy();
  detail::impl_of(out)->type_repr = class_record(options, type_repr);
  detail::impl_of(out)->class_fields = class_fields;
  if (prefix.empty()) {
    map_anonymous_leaves(*detail::impl_of(out), /*copy=*/false);
    mark_memmap(detail::impl_of(out), "");
    out.lock_();
    return out;
  }
  check_prefix(prefix, options);
  StagedSave stage(prefix, options.durable());
  WritePlan plan;
  plan.stage = &stage;
  plan.durable = options.durable();
  plan_tree(*detail::impl_of(out), prefix, options, /*like=*/true, /*replace=*/true, plan);
  write_plan(plan, stage, options.num_threads());
  finish_save(plan, stage);
  for (auto& j : plan.leaves)
    if (j.target) *j.target = Entry(j.result);
  mark_memmap(detail::impl_of(out), prefix);
  out.lock_();
  return out;
}

// ============================================================================ lazy stacks
// upstream's layout: `prefix`/meta.json {"_type", "stack_dim"} and member i in `prefix`/<i>/, written as one staged
// save (a failure leaves the old save whole, a longer old stack's last members are not carried into the new one)
namespace {

//! the dense level of a lazy stack's member i, or a typed error naming it (before anything is written)
TensorDictImpl& stack_member_level(const TensorDict& m, size_t i, const char* op) {
  auto* level = const_cast<TensorDictImpl*>(detail::tree::level_of(m, detail::tree::Descend::DenseOnly));
  if (!level) {
    throw NotImplementedError(std::string(op) + " of a lazy stack: member " + std::to_string(i) + " is a " +
                              m.node()->type_name() + ", whose leaves live in its storage (memmap() copies it)");
  }
  return *level;
}

//! a member of a lazy stack as memmap() / memmap_like() save it: a dense level's structure copy, another node's
//! dense form
TensorDict member_for_copy(const TensorDict& m) {
  if (const TensorDictImpl* level = detail::tree::level_of(m, detail::tree::Descend::DenseOnly)) return save_copy(*level, m);
  TensorDict dense = m.contiguous();
  if (!detail::tree::level_of(dense, detail::tree::Descend::DenseOnly)) {
    throw NotImplementedError("memmap of a lazy stack: a member " + m.node()->type_name() + " has no dense form");
  }
  return dense;
}

//! writes the members (their leaves become memory-mapped, each member locked) and the stack's meta.json into
//! `prefix` as one staged save; like: zero-filled files of the leaves' shapes
void save_stack(const std::vector<TensorDict>& members, int64_t stack_dim, const BatchSize& batch,
                const std::string& prefix, const MemmapOptions& options, bool like) {
  const char* op = like ? "memmap_like" : "memmap_";
  if (members.empty()) {
    throw ValueError(std::string(op) + ": a lazy stack without members cannot be saved (a load finds no member to "
                     "read back)");
  }
  std::vector<TensorDictImpl*> levels;
  for (size_t i = 0; i < members.size(); ++i) {
    TensorDictImpl& level = stack_member_level(members[i], i, op);
    if (level.is_shared) {
      throw ValueError(std::string(op) + ": member " + std::to_string(i) +
                       " is in shared memory; memmap_ and share_memory_ are mutually exclusive");
    }
    levels.push_back(&level);
  }
  check_prefix(prefix, options);
  StagedSave stage(prefix, options.durable());
  WritePlan plan;
  plan.stage = &stage;
  plan.durable = options.durable();
  make_dirs(plan.at(prefix));
  plan.stacks.emplace_back(prefix, members.size());
  for (size_t i = 0; i < levels.size(); ++i)
    plan_tree(*levels[i], join_path(prefix, std::to_string(i)), options, like, /*replace=*/true, plan);
  auto node = std::make_shared<DirNode>();
  node->kind = NodeKind::LazyStackedTensorDict;
  node->type_repr = backends::type_repr::kLazyStackedTensorDict;
  node->stack_dim = stack_dim;
  node->batch_size = batch;
  plan.metas.emplace_back(plan.at(prefix), node);  // after the members' (a durable save's order: children first)
  write_plan(plan, stage, options.num_threads());
  finish_save(plan, stage);
  for (auto& j : plan.leaves)
    if (j.target) *j.target = Entry(j.result);
  for (size_t i = 0; i < levels.size(); ++i) {
    mark_memmap(std::static_pointer_cast<TensorDictImpl>(levels[i]->shared_from_this()),
                join_path(prefix, std::to_string(i)));
    TensorDict(members[i]).lock_();
  }
}

}  // namespace

void LazyStackNode::memmap_(TensorDict& self, const std::string& prefix, const MemmapOptions& options) {
  if (prefix.empty()) {  // anonymous shared memory, member by member (no file to switch in)
    for (size_t i = 0; i < members.size(); ++i) stack_member_level(members[i], i, "memmap_");
    for (auto& m : members) m.memmap_("", options);
  } else {
    save_stack(members, stack_dim, batch_size, prefix, options, /*like=*/false);
  }
  self.lock_();
}

TensorDict LazyStackNode::memmap(const TensorDict&, const std::string& prefix, const MemmapOptions& options) const {
  std::vector<TensorDict> copies;
  // anonymous: the members' values copied even where they are mapped already (the copy must not alias this stack)
  for (const auto& m : members) copies.push_back(prefix.empty() ? m.clone() : member_for_copy(m));
  LazyStackedTensorDict out(std::move(copies), stack_dim);
  MemmapOptions o = options;
  o.copy_existing(true);  // the copies' leaves are this stack's: writing them elsewhere is what memmap() means
  out.memmap_(prefix, o);
  return std::move(out);
}

TensorDict LazyStackNode::memmap_like(const TensorDict&, const std::string& prefix, const MemmapOptions& options) const {
  std::vector<TensorDict> copies;
  for (const auto& m : members) copies.push_back(prefix.empty() ? m.memmap_like("", options) : member_for_copy(m));
  LazyStackedTensorDict out(std::move(copies), stack_dim);
  if (!prefix.empty()) save_stack(out.tensordicts(), stack_dim, out.batch_size(), prefix, options, /*like=*/true);
  out.lock_();
  return std::move(out);
}

LazyStackedTensorDict& LazyStackedTensorDict::memmap_(const std::string& prefix, const MemmapOptions& options) {
  TensorDict::memmap_(prefix, options);
  return *this;
}

}  // namespace tensordict

namespace tensordict::detail::memmap {
void for_each_job(size_t n, int64_t num_threads, const std::function<void(size_t)>& fn) {
  if (num_threads <= 1 || n < 2) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr first_error;
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> g(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t threads = std::min<size_t>(static_cast<size_t>(num_threads), n);
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}
}  // namespace tensordict::detail::memmap
