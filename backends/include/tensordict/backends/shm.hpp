#pragma once
//! Shared-memory segments and handles for tensors: the storage under TensorDict::share_memory_() and
//! from_schema(storage="shared"). No TensorDict semantics here, only segments, byte layouts and handles.
//!
//! A *segment* is one named POSIX shared-memory object (shm_open + fallocate + mmap(MAP_SHARED), i.e. a
//! file in /dev/shm; the same thing Boost.Interprocess' shared_memory_object wraps) holding many tensors
//! at 64-byte aligned offsets. Tensors are at::from_blob views over the mapping whose deleter holds a
//! shared_ptr to the segment, so tensors (and their views) keep the mapping alive after every handle is gone.
//! Creating a segment of N bytes reserves its N bytes of /dev/shm at once (fallocate: tmpfs allocates the
//! zeroed pages, which count as shared memory from then on; nothing is mapped into the process until touched),
//! so a full /dev/shm is a BackendError at creation and never a SIGBUS at a later store.
//!
//! A *handle* (ShmTensorHandle, ShmTensorDictHandle) names tensors by (segment name, byte offset, dtype,
//! shape); serialize() turns it into a compact length-prefixed binary string that another process on the
//! same host passes to parse() and opens zero-copy (open_tensor / open_tensordict).
//!
//! LIFETIME SCHEME (names, not memory: a mapping stays valid after its name is unlinked, POSIX semantics)
//!  * Segment names are `<prefix><pid>_<starttime>_<counter>_<random hex>`: the creator's pid and its
//!    start time (field 22 of /proc/<pid>/stat) as the creator sees them: unique names and diagnostics only.
//!  * Only the creating process owns the name. It is unlinked (shm_unlink) when
//!      1. the creator releases the segment for the last time (last shared_ptr/tensor gone), or
//!      2. ShmSegment::unlink() is called (any process may call it, e.g. once every opener has opened), or
//!      3. the creator exits normally (std::atexit handler over a process-wide registry of owned names), or
//!      4. the creator gets a fatal signal: SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT always unlink and then chain
//!         to the previous handler (or re-raise with the default action); SIGTERM/SIGINT/SIGHUP/SIGQUIT
//!         unlink and re-raise only if their previous disposition was the default one (a program that
//!         installed its own handler before the first create() decides itself, and exits through case 3;
//!         a signal that was ignored stays ignored). Handlers are installed on the first create(). The
//!         handler only calls async-signal-safe functions (unlink(2) of precomputed /dev/shm paths).
//!      5. the creator is SIGKILLed (or its handler was replaced): the name stays until some process calls
//!         cleanup_stale_segments(prefix), which removes names whose creator is provably gone. Proof: the
//!         creator holds flock(LOCK_SH) on the segment's own descriptor from before the segment has a size
//!         until it releases it (one descriptor per live segment it created; close-on-exec; a child forked
//!         without exec shares the lock until it closes its copy or exits), and the kernel drops the lock when
//!         the holder dies, however it dies. Cleanup removes a segment only if it can take LOCK_EX|LOCK_NB on
//!         it. A lock holds across PID namespaces (containers sharing /dev/shm), where pids prove nothing.
//!         The pid and start time in the name are a second witness: a creator they name that lives in this
//!         PID namespace keeps its segment whatever the lock says (segments of builds that took no lock).
//!         create() calls it for its prefix (at most once a second per prefix and process, as it lists /dev/shm).
//!  * Processes that only open() a segment never unlink it, so a killed opener leaks nothing: its mapping
//!    goes away with it. A child created by fork() inherits the parent's segments and tensors but never
//!    owns the names (every unlink path checks the creator pid against getpid()).
//!  * Consequence: the creator must keep the segment (or a tensor of it) alive until the other processes
//!    have opened it; after that, they keep working even if the creator exits.
//!  * Use a prefix that only this library uses: cleanup_stale_segments() only considers names that parse.
//!    The pid and start time in a name are the creator's as it sees them (diagnostics, uniqueness); liveness
//!    is judged by the lock alone.
//!
//! Thread-safety: every function may be called from any thread. Concurrent writes to the same bytes are
//! the caller's business, as for any tensor. fork(): do it before starting threads that create segments
//! (a child forked while another thread holds the registry mutex would block on it).
//! Capacity: create() reserves the segment's pages (fallocate) and throws BackendError ("not enough space in
//! /dev/shm ...") when tmpfs cannot supply them; the pages are the segment's from then on, so stores into it
//! never meet a full /dev/shm. On a filesystem without fallocate the segment stays sparse (as before).
//! Descriptors: one per live segment this process created (the lock above; none for opened ones, none once
//! unlink() removed the name); EMFILE at creation says so.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tensordict::backends {

//! One mapped POSIX shared-memory segment. Always held by shared_ptr (tensors from tensor_at() hold one
//! too); not copyable or movable. The mapping lives until the last shared_ptr goes.
class ShmSegment : public std::enable_shared_from_this<ShmSegment> {
 public:
  //! Byte alignment of every tensor placed by ShmLayout (cache line; >= any dtype's alignment).
  static constexpr uint64_t kAlignment = 64;

  //! Creates a new zero-filled segment of `nbytes` (> 0) bytes named `<prefix><pid>_<starttime>_<n>_<hex>`
  //! (O_CREAT|O_EXCL, mode 0600), takes its lock, reserves its pages and maps it read-write. The calling
  //! process owns the name (see the lifetime scheme above). Also runs cleanup_stale_segments(prefix) (throttled).
  //! Throws ValueError for nbytes == 0 or a prefix that is empty, too long (> 180 chars) or has characters
  //! outside [A-Za-z0-9._-]; BackendError if /dev/shm lacks space for all of it or an OS call fails (errno's
  //! text); nothing is left behind then.
  static std::shared_ptr<ShmSegment> create(uint64_t nbytes, const std::string& prefix);

  //! Maps an existing segment read-write by name (with or without a leading '/'). The name is never
  //! unlinked by this process (unless unlink() is called). Size comes from fstat.
  //! Throws BackendError naming the segment if it does not exist (or was already unlinked), cannot be
  //! opened or mapped, or has size 0; ValueError for an invalid name (empty, '/' inside, too long).
  static std::shared_ptr<ShmSegment> open(const std::string& name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }  //!< without the leading '/': /dev/shm/<name>
  uint64_t size() const { return size_; }
  void* data() const { return data_; }
  //! true in the process that created the segment (forked children of the creator: false)
  bool owner() const;
  //! true until the name is unlinked by this handle (unlink() or release); openers: true until unlink()
  bool linked() const;

  //! A CPU tensor of `dtype` and `shape` (C-contiguous) over bytes [offset, offset + nbytes) of the
  //! mapping; zero-copy, writes are seen by every process mapping the segment. The tensor keeps the segment
  //! alive. Throws ValueError for a negative dim, an offset not aligned to the element size, an
  //! out-of-range or overflowing extent, or an unsupported dtype (see dtype_name()).
  at::Tensor tensor_at(uint64_t offset, at::ScalarType dtype, at::IntArrayRef shape);

  //! Removes the name now (idempotent; ENOENT is ignored). Existing mappings, here and in other processes,
  //! stay valid; later open() calls fail. Lets a creator go leak-proof once all openers have opened.
  //! Throws BackendError for other errors (e.g. EACCES).
  void unlink();

 private:
  ShmSegment(std::string name, void* data, uint64_t size, int owner_pid, void* owned_node, int lock_fd);
  std::string name_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
  int owner_pid_ = 0;            //!< creator pid when created here, 0 for opened segments
  void* owned_node_ = nullptr;   //!< entry in the process-wide registry of owned names (creator only)
  bool linked_ = true;
  int lock_fd_ = -1;             //!< creator: the descriptor holding the segment's LOCK_SH while it is linked
  mutable std::mutex mu_;        //!< guards linked_, owned_node_ and lock_fd_
};

//! Where one tensor lives: segment name, byte offset, dtype, shape (C-contiguous).
struct ShmTensorHandle {
  std::string segment;
  uint64_t offset = 0;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;

  uint64_t numel() const;
  uint64_t nbytes() const;  //!< numel * element size
  bool operator==(const ShmTensorHandle& o) const;
  bool operator!=(const ShmTensorHandle& o) const { return !(*this == o); }
};

//! A TensorDict's worth of handles: batch size plus (key path, tensor handle) entries. Entries may live in
//! different segments (e.g. leaves shared separately); serialization stores each segment name once.
struct ShmTensorDictHandle {
  struct Entry {
    std::vector<std::string> key;  //!< nested key path, e.g. {"next", "obs"}; non-empty parts
    ShmTensorHandle tensor;
    bool operator==(const Entry& o) const { return key == o.key && tensor == o.tensor; }
  };
  std::vector<int64_t> batch_size;
  std::vector<Entry> entries;

  std::vector<std::string> segments() const;  //!< distinct segment names in first-use order
  bool operator==(const ShmTensorDictHandle& o) const {
    return batch_size == o.batch_size && entries == o.entries;
  }
  bool operator!=(const ShmTensorDictHandle& o) const { return !(*this == o); }
};

//! Compact binary form (may contain NUL bytes): "TDSH", version byte 1, kind byte (1 tensor, 2 tensordict),
//! then little-endian u32 lengths/counts, u64 offsets, i64 dims, length-prefixed strings, dtypes by name
//! ("float32", ...); a tensordict stores a table of segment names and a u32 index per entry.
std::string serialize(const ShmTensorHandle& h);
std::string serialize(const ShmTensorDictHandle& h);
//! Parsers: throw FormatError for anything malformed: bad magic/version/kind, truncation, trailing bytes,
//! invalid segment names, unknown dtypes, negative dims, > 64 dims, byte-size overflow, offsets not aligned
//! to the element size, empty or duplicate key paths, out-of-range segment indices, and entries whose
//! shape does not start with batch_size.
ShmTensorHandle parse_tensor_handle(const std::string& bytes);
ShmTensorDictHandle parse_tensordict_handle(const std::string& bytes);

//! Opens the handle's segment and returns its tensor (BackendError if the segment is gone, ValueError if
//! the extent does not fit the segment).
at::Tensor open_tensor(const ShmTensorHandle& h);
//! Opens every segment of the handle once and returns one tensor per entry, in entry order.
std::vector<at::Tensor> open_tensordict(const ShmTensorDictHandle& h);

//! One tensor to place: key path, dtype, full shape (batch dims included).
struct ShmLayoutEntry {
  std::vector<std::string> key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};

//! Byte layout of many tensors in one segment: each at the next multiple of ShmSegment::kAlignment.
struct ShmLayout {
  std::vector<uint64_t> offsets;  //!< one per entry
  uint64_t total_bytes = 0;       //!< segment size needed (>= kAlignment, so never 0)

  //! Throws ValueError for an empty or duplicate key path, an empty key part, a negative dim, an
  //! unsupported dtype or a total size that overflows.
  static ShmLayout plan(const std::vector<ShmLayoutEntry>& entries);
};

//! A freshly created segment with its tensors and handle (tensors[i] <-> handle.entries[i]).
struct ShmAllocation {
  std::shared_ptr<ShmSegment> segment;
  ShmTensorDictHandle handle;
  std::vector<at::Tensor> tensors;
};

//! Plans `entries`, creates one zero-filled segment with `prefix` and maps every tensor. batch_size is
//! recorded in the handle; every shape must start with it (ValueError otherwise).
ShmAllocation allocate(const std::vector<ShmLayoutEntry>& entries, const std::vector<int64_t>& batch_size,
                       const std::string& prefix);

//! share_memory_() helper: allocate() with the tensors' dtypes/shapes (CPU, strided, dense only:
//! TypeError otherwise; ValueError if keys.size() != tensors.size()), then copies every value in.
ShmAllocation share_tensors(const std::vector<std::vector<std::string>>& keys,
                            const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& batch_size,
                            const std::string& prefix);

//! The handle of a C-contiguous tensor (or view) whose bytes lie in a segment mapped by this process,
//! e.g. to send a shared TensorDict's leaves to a worker; nullopt otherwise (not shm, non-contiguous,
//! undefined). The segment is the one this process mapped; it must still be linked for others to open it.
std::optional<ShmTensorHandle> handle_of(const at::Tensor& t);
//! The live segment mapped by this process that contains `t`'s data, or nullptr.
std::shared_ptr<ShmSegment> segment_of(const at::Tensor& t);

//! Removes segments named `<prefix><pid>_<starttime>_<n>_<hex>` whose creator is provably gone: nobody holds
//! the segment's lock (LOCK_EX|LOCK_NB succeeds; see the lifetime scheme), whatever PID namespace the creator
//! lived in. Names that do not parse, segments someone holds (a live creator here or in another namespace, or
//! a child it forked), segments still being created (size 0) and anything that is not a plain file are kept.
//! Returns how many were removed. Throws ValueError for an invalid prefix; a missing /dev/shm returns 0.
size_t cleanup_stale_segments(const std::string& prefix);

//! Names (without '/') this process currently owns and has not unlinked (diagnostics and tests).
std::vector<std::string> owned_segments();
//! Segments currently mapped by this process (created or opened; diagnostics and leak tests).
size_t live_segments();

//! dtype <-> the names used in serialized handles ("bool", "uint8", "int8", "int16", "int32", "int64",
//! "float16", "bfloat16", "float32", "float64", "complex64", "complex128"). ValueError if unsupported.
std::string dtype_name(at::ScalarType dtype);
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace tensordict::backends
