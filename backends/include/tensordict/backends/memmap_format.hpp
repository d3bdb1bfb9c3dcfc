#pragma once
//! Python tensordict's memory-mapped directory format (shared/reference/upstream-formats.md §1): one
//! directory per collection with a meta.json, one raw `<encoded key>.memmap` file per dense tensor leaf,
//! one sub-directory per child collection. This is a generic tree of nodes with NO TensorDict
//! semantics: the engine turns a DirNode into a TensorDict / LazyStackedTensorDict / tensorclass and back.
//!
//! Reading:  DirNode root = read_dir(path);  at::Tensor t = map_leaf(node.path, leaf, writable);
//! Writing:  LeafMeta m = write_leaf(dir, key, tensor);  node.add_leaf(m); ...;  write_meta(dir, node);
//!           or write_tree(dir, node, provider) for a whole tree (leaves and children first, meta.json last).
//!
//! Thread-safety: all functions are reentrant; they share no state. Writing the same directory from two
//! threads/processes at once is not coordinated here (meta.json replacement itself is atomic).
//! Errors: FormatError (malformed/truncated files, always naming the file), ValueError (bad arguments,
//! symlinks, reserved keys), BackendError (I/O failures).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/backends/json_value.hpp"

namespace tensordict::backends {

// ------------------------------------------------------------------------------------------ dtypes
//! "torch.float32" etc. (str(torch.dtype)). Throws ValueError for dtypes Python's loader cannot read back
//! (quantized, and anything outside the table of upstream-formats.md §1.4).
std::string dtype_to_string(at::ScalarType dtype);
//! Inverse of dtype_to_string; nullopt for unknown strings, aliases ("torch.float"), torch>=2.3-only
//! dtypes (uint16/32/64, absent from libtorch 1.13) and quantized dtypes (not mappable).
std::optional<at::ScalarType> dtype_from_string(const std::string& name);

// ------------------------------------------------------------------------------------------ keys
//! Python's robust key encoding (§1.8), for one path component: `/<>:"|?*\`, space, `%`, U+0000-U+001F
//! and U+007F become %XX (uppercase hex); "" -> "%", "." -> "%2E", ".." -> "%2E%2E"; all else (incl. UTF-8) verbatim.
std::string encode_key(const std::string& key);
//! Inverse of encode_key ("%" -> ""). Throws ValueError for a '%' not followed by two hex digits.
std::string decode_key(const std::string& name);
//! Whether the raw key may be tried as a legacy (pre-v0.14, unencoded) file or directory name.
bool is_safe_legacy_key(const std::string& key, bool directory);

// ------------------------------------------------------------------------------------------ nodes
//! Python `_type` strings written by v0.14.
namespace type_repr {
inline constexpr const char* kTensorDict = "<class 'tensordict._td.TensorDict'>";
inline constexpr const char* kLazyStackedTensorDict = "<class 'tensordict._lazy.LazyStackedTensorDict'>";
inline constexpr const char* kNonTensorData = "<class 'tensordict.tensorclass.NonTensorData'>";
inline constexpr const char* kMetaData = "<class 'tensordict.tensorclass.MetaData'>";
inline constexpr const char* kNonTensorStack = "<class 'tensordict.tensorclass.NonTensorStack'>";
inline constexpr const char* kPersistentTensorDict = "<class 'tensordict.persistent.PersistentTensorDict'>";
}  // namespace type_repr

enum class NodeKind {
  TensorDict,             //!< TD layout (also PersistentTensorDict's memmap, which loads as a TensorDict)
  LazyStackedTensorDict,  //!< children "0", "1", ...; stack_dim
  NonTensorData,          //!< data (JSON) and/or pickle (other.pickle); also MetaData
  NonTensorStack,         //!< data (nested list) or pickle (pickle.pkl); stack_dim; device
  TensorClass,            //!< any other class: JSON fields in `data`, pickle, child "_tensordict"
  Other,                  //!< tensordict internals (_SubTensorDict, _CustomOpTensorDict...): meta kept, child "_source"
};
const char* node_kind_name(NodeKind kind);
//! Kind of a `_type` string (unknown "<class '...'>" strings are tensorclasses).
NodeKind classify_type(const std::string& type_repr);

//! One dense tensor leaf as recorded in meta.json.
struct LeafMeta {
  std::string key;             //!< the original key (meta.json's raw key)
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  //!< tensor shape; nested leaves: the sizes matrix shape [n_components, ndim]
  std::string device = "cpu";  //!< informational (Python ignores it on load)
  bool is_nested = false;
  std::string file;            //!< data file name inside the node directory; "" = no file (empty leaf)
  std::string shape_file;      //!< nested only: the sizes file name ("" when the sizes matrix is empty)
  std::vector<std::vector<int64_t>> nested_sizes;  //!< nested only: per-component shapes

  int64_t numel() const;   //!< elements of the data (nested: the sum over components)
  int64_t nbytes() const;  //!< numel() * element size
};

struct DirNode;

//! A directory held open (O_DIRECTORY) while a tree is read from it and its leaves are mapped: every meta.json,
//! pickle, sizes and leaf file is opened relative to it (openat), so what is read comes from that one directory
//! even when another process switches a new save in under its name meanwhile (engine's staged saves exchange
//! directories with one rename). Closed when the last node holding it goes.
class DirHandle {
 public:
  explicit DirHandle(int fd) : fd_(fd) {}
  ~DirHandle();
  DirHandle(const DirHandle&) = delete;
  DirHandle& operator=(const DirHandle&) = delete;
  int fd() const { return fd_; }
  //! whether `path` still names this directory (same device and inode, not removed): false once a save has
  //! switched another directory in under that name
  bool still_at(const std::string& path) const;

 private:
  int fd_;
};
//! Opens the directory `path` (a symlink to a directory is followed). FormatError when it is missing or not a
//! directory, BackendError on other failures.
std::shared_ptr<const DirHandle> open_dir(const std::string& path);

//! An entry of a node, in meta.json order: a tensor leaf or a child collection (sub-directory).
struct DirEntry {
  std::string key;   //!< original key
  std::string name;  //!< name on disk inside the node's directory (encoded, or the legacy raw name)
  bool is_leaf = true;
  LeafMeta leaf;     //!< is_leaf
  std::string type;  //!< !is_leaf: the parent's {"type": ...} value ("TensorDict", "Pair"...; "" for v0.3 dirs)
  //! !is_leaf: the child. Shared on copy: treat a read tree as immutable, or build a new node to edit.
  std::shared_ptr<DirNode> child;
};

//! One directory of the format. Which fields matter depends on `kind` (see NodeKind).
struct DirNode {
  NodeKind kind = NodeKind::TensorDict;
  std::string type_repr = type_repr::kTensorDict;  //!< meta.json "_type", verbatim
  std::string path;  //!< the directory it was read from ("" for a node built in memory)
  //! TensorDict: "shape"; TensorClass: its _tensordict's; lazy stack: from the children + stack_dim
  //! (nullopt if the children have none); NonTensorStack: the nested list's dims; NonTensorData: nullopt.
  std::optional<std::vector<int64_t>> batch_size;
  std::optional<std::string> device;  //!< nullopt = no device ("None", null or absent in the file)
  int64_t stack_dim = 0;              //!< lazy stack / NonTensorStack
  std::vector<DirEntry> entries;      //!< leaves and children in meta.json order (lazy stack: "0", "1", ...)
  //! NonTensorData / NonTensorStack: the "data" value (nullopt when pickled);
  //! TensorClass: a JSON object of the non-tensor fields (meta.json minus "_type").
  std::optional<JsonValue> data;
  std::optional<JsonValue::Bytes> pickle;  //!< raw other.pickle / pickle.pkl bytes; carried, never executed
  JsonValue meta;                          //!< the parsed meta.json, verbatim (null for in-memory nodes)
  std::vector<std::string> warnings;       //!< what was skipped as Python would skip it
  //! the directory the tree was read through (read_dir) and this node's path relative to it ("." for the root):
  //! map_leaf(node, ...) opens the node's files there. Null for a node built in memory.
  std::shared_ptr<const DirHandle> root;
  std::string rel;

  const DirEntry* find(const std::string& key) const;
  //! Appends a leaf entry (name = encode_key(key) + ".memmap" unless leaf.file is set).
  DirEntry& add_leaf(LeafMeta leaf);
  //! Appends a child entry; `type` defaults to default_child_type(child).
  DirEntry& add_child(const std::string& key, DirNode child, std::string type = "");
  //! the same, sharing `child` (not copied): it must not change afterwards
  DirEntry& add_child(const std::string& key, std::shared_ptr<DirNode> child, std::string type = "");
};

//! The parent's {"type": ...} value for a child: "TensorDict", "LazyStackedTensorDict", "NonTensorData",
//! "NonTensorStack", or the class name of a tensorclass/other type ("Pair" for "<class '__main__.Pair'>").
std::string default_child_type(const DirNode& child);

// ------------------------------------------------------------------------------------------ read
//! How read_dir / map_leaf treat what they find below the directory being read.
struct ReadOptions {
  //! Read through symlinked meta.json, leaf, pickle and sizes files and sub-directories, wherever they
  //! point. Default: refused with a FormatError naming the link (a writable mapping of a symlinked leaf
  //! writes into its target). Fifos, devices and sockets are refused either way, without blocking.
  bool follow_symlinks = false;
  //! Skip a non-empty leaf whose data file (nested: data or sizes file) is missing, recording a warning in
  //! DirNode::warnings, as Python does. Default: FormatError naming the key and the file.
  bool allow_missing = false;
};

//! Reads a directory tree (recursively). Tolerant where Python's output varies: any JSON whitespace,
//! \u escapes, NaN/Infinity, trailing bytes after a leaf's data, a missing file for an empty leaf,
//! legacy raw (unencoded) names, v0.3 trees without {"type"} entries, NonTensorData's old list data.
//! Like Python it skips (with a warning) a leaf whose meta lacks dtype/shape. Throws FormatError naming the
//! file for a missing/malformed meta.json, wrong field types, an unknown dtype, negative or overflowing
//! shapes, a leaf file shorter than its shape needs, a listed sub-collection without its directory, a
//! missing non-empty leaf file (unless options.allow_missing), a symlink below `path` (unless
//! options.follow_symlinks; `path` itself may be one) and anything that is not a regular file or directory.
//! Does not map anything (leaf sizes are checked with stat).
//! The directory is opened once (open_dir) and everything below it is read relative to that descriptor, which
//! the returned nodes keep (DirNode::root): map_leaf(node, ...) maps from the same directory, so a tree read
//! while another process switches a new save in under `path` is wholly the old save, or fails (the old
//! directory's files removed meanwhile) with a FormatError or BackendError; DirHandle::still_at(path) then tells
//! that the directory was switched (a caller may read again).
DirNode read_dir(const std::string& path, const ReadOptions& options = {});
//! read_dir through a directory already open (`dir`, opened from `path`; `path` names it in messages).
DirNode read_dir(const std::shared_ptr<const DirHandle>& dir, const std::string& path, const ReadOptions& options = {});

//! Maps a leaf of the node read from directory `dir` (map_file; see memmap_file.hpp for `writable`).
//! An empty leaf without a file gives an ordinary empty tensor. Nested leaves: the flat 1-D data of all
//! components (see map_nested_leaf). Throws FormatError if the file is missing, too short, not a regular
//! file, or a symlink (unless options.follow_symlinks).
at::Tensor map_leaf(const std::string& dir, const LeafMeta& leaf, bool writable, const ReadOptions& options = {});
//! map_leaf of a leaf of `node`, through the directory the node was read from (DirNode::root) when it has one.
at::Tensor map_leaf(const DirNode& node, const LeafMeta& leaf, bool writable, const ReadOptions& options = {});
//! Reads a (non-nested) leaf of `node` into `dst` with pread(2), without mapping it: `dst` is a CPU tensor of the
//! leaf's dtype and shape (checked by the caller), contiguous or not (then through a buffer). The file is opened
//! as map_leaf opens it (through DirNode::root, the same checks and errors); check_only: opened and checked (type,
//! size), nothing read. Reading into memory that is already there (a module's weights) moves the bytes once, where
//! a fresh mapping pays a page fault per 4 KiB first touched.
void read_leaf_into(const DirNode& node, const LeafMeta& leaf, const at::Tensor& dst, bool check_only,
                    const ReadOptions& options = {});
//! A nested leaf's components: views of one mapping, shaped by leaf.nested_sizes.
std::vector<at::Tensor> map_nested_leaf(const std::string& dir, const LeafMeta& leaf, bool writable,
                                        const ReadOptions& options = {});

// ------------------------------------------------------------------------------------------ write
//! The meta.json value Python v0.14 writes for `node` (key order included): TensorDict leaves as
//! {"device","shape","dtype","is_nested"}, children as {"type"}, then "shape", "device" ("None" when
//! nullopt), "_type"; NonTensorData {"_type","data","_is_non_tensor","_metadata"}; NonTensorStack
//! {"_type","stack_dim","device","data"}; lazy stack {"_type","stack_dim"}; tensorclass {"_type", fields...};
//! Other: node.meta verbatim. Throws ValueError for a TensorDict key that Python would lose or collide
//! ("shape", "device", "_type", a child named "meta.json", a leaf k beside a child "k.memmap").
JsonValue make_meta(const DirNode& node);
//! The layout Python uses for a node's meta.json: PythonCompact for NonTensorStack, Python otherwise.
JsonValue::Style meta_style(NodeKind kind);
//! Atomically replaces `dir`/meta.json with `meta` (temp file in `dir`, fsync, rename, fsync of `dir`).
//! Throws BackendError on I/O failure (the old meta.json is then untouched).
void write_meta(const std::string& dir, const JsonValue& meta, JsonValue::Style style = JsonValue::Style::Python);
//! write_meta(dir, make_meta(node), meta_style(node.kind)).
void write_meta(const std::string& dir, const DirNode& node);
//! Writes `dir`/meta.json of a directory nobody reads yet (a staged save's, switched in as a whole later): a
//! plain write, no temp file and no rename. `sync`: the file, then `dir`, fsynced (a durable save). Throws
//! BackendError on I/O failure, with the half-written file removed.
void write_new_meta(const std::string& dir, const DirNode& node, bool sync);

//! Writes `value` as `dir`/encode_key(key).memmap and returns its entry (device = value's device, e.g.
//! "cpu"). Zero elements: no file (a stale one is removed) and leaf.file = "". Throws like write_file.
LeafMeta write_leaf(const std::string& dir, const std::string& key, const at::Tensor& value);
//! Writes a nested (ragged) leaf: `key`.shape.memmap (int64 sizes matrix) and the components' data
//! concatenated in `key`.memmap. All components need the same dtype and ndim (ValueError otherwise).
LeafMeta write_nested_leaf(const std::string& dir, const std::string& key, const std::vector<at::Tensor>& components);

//! Supplies a leaf's data when writing a tree: the dense tensor (nested leaves: the flat data, shaped by
//! leaf.nested_sizes). `node` is the node the leaf belongs to.
using LeafProvider = std::function<at::Tensor(const DirNode& node, const LeafMeta& leaf)>;
//! Writes `node` into `dir` (created if needed, parents too): leaves, children, pickles (other.pickle /
//! pickle.pkl), then meta.json last (atomically) at every level. Names on disk are always encoded.
void write_tree(const std::string& dir, const DirNode& node, const LeafProvider& provider);
//! write_tree with the data of a tree read by read_dir: copies it to `dir` in v0.14 layout.
void copy_tree(const DirNode& src, const std::string& dir);

// ------------------------------------------------------------------------------------------ staged saves
//! The staging directory of a save into `prefix` (engine's memmap_ writes a save there, then switches it in with
//! one rename): a sibling "<parent>/.<base>.td-stage.<pid>.<random>" beside its lock file "<that>.lock", on which
//! the writer holds an OFD write lock (fcntl F_OFD_SETLK, whole file) from before the directory exists until
//! after it is gone. The kernel releases the lock when the writer dies, however it dies, and the lock names no
//! pid: whether a staging directory is abandoned is told by trying its lock, which holds across PID namespaces
//! and, on a file system shared by several hosts, across hosts (NFS passes OFD locks to the server as byte-range
//! locks; flock is emulated the same way there). Creating one first removes the abandoned staging directories of
//! the same prefix (remove_abandoned_stages).
class StagingDir {
 public:
  //! the parent directory is created when missing; path() is empty when the prefix has no sibling to stage in
  //! (".", "..", "/") or the parent may not be written (EACCES, EPERM, EROFS: the caller writes in place).
  //! BackendError on other failures.
  explicit StagingDir(const std::string& prefix);
  //! removes whatever is at path() still (the old directory a rename exchanged in, or a failed save), then the
  //! lock file, and releases the lock
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};
//! Removes each staging directory of `prefix` whose lock can be taken (its writer is gone, in whatever namespace
//! or host it ran) and the lock files left without a directory; returns how many directories were removed. A
//! staging directory whose lock is held is another writer's save in progress and stays; one without a lock file
//! (written by an older version, whose writer cannot be told alive) stays too: nothing is removed that is not
//! provably abandoned.
size_t remove_abandoned_stages(const std::string& prefix);

}  // namespace tensordict::backends
