// Memory-mapped files as at::Tensors (a storage over mmap, munmap in its deleter, no fd kept open).
#include "tensordict/backends/memmap_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <optional>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "tensordict/backends/fork_safe.hpp"
#include "tensordict/backends/tensor_values.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

[[noreturn]] void os_error(const std::string& what, const std::string& path, int err) {
  throw BackendError(what + " '" + path + "': " + errno_text(err));
}

//! Closes an fd on scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

struct Entry {
  MappingInfo info;
  void* base;        // what mmap returned
  size_t map_len;    // what was mapped
  //! held by pwrite_into_mapping for a whole view (see there)
  std::shared_ptr<std::mutex> writers;
  //! the file's blocks are allocated before a large write (allocate_range): a file on a disk filesystem, not
  //! tmpfs / ramfs, where fallocate would zero-fill memory the write fills anyway
  bool allocate = false;
  //! the mapped file (writable shared file mappings): writes by name go only where the name still leads to it
  dev_t dev = 0;
  ino_t ino = 0;
};

//! held across fork() (fork_safe.hpp)
std::mutex& registry_mutex() { return detail::fork_safe_mutex<struct RegistryMutex>(); }
std::unordered_map<const void*, Entry>& registry() {
  static auto* r = new std::unordered_map<const void*, Entry>();  // leaked: outlives static tensors
  return *r;
}

//! writes shorter than this allocate their blocks as they go: below, a fallocate costs about what it saves
constexpr int64_t kAllocateMin = 256 << 10;

//! The DataPtr context of a mapping made here: what its deleter unmaps, and which file blocks of a writable
//! shared file mapping stores have reserved already (reserve_for_store), one bit per 256 KiB block of the file.
//! Reached from a tensor's storage without the registry's lock: its deleter is unmap_context.
struct MapContext {
  void* data = nullptr;  //!< the registry's key
  void* base = nullptr;  //!< what mmap returned
  size_t len = 0;        //!< what was mapped
  int64_t file_offset = 0, nbytes = 0;
  std::atomic<bool> reserve{false};  //!< stores reserve their blocks first (cleared if fallocate is refused)
  dev_t dev = 0;                     //!< the mapped file: a name that now leads elsewhere is not reserved through
  ino_t ino = 0;
  int64_t first_block = 0;           //!< file_offset / kReserveBlock
  std::unique_ptr<std::atomic<uint64_t>[]> reserved;  //!< a bit per block from first_block, set once reserved
};
constexpr int64_t kReserveBlock = 256 << 10;


//! tmpfs and ramfs keep files in memory: fallocate there allocates zeroed pages, it reserves no blocks
bool on_memory_fs(int fd) {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return true;  // unknown: never allocate ahead
  constexpr long kTmpfs = 0x01021994, kRamfs = static_cast<long>(0x858458f6);
  return static_cast<long>(fs.f_type) == kTmpfs || static_cast<long>(fs.f_type) == kRamfs;
}

//! fallocate(mode) of [at, at + len): true when done; a full disk or quota is a BackendError naming the file; any
//! other failure (EOPNOTSUPP: no fallocate on this filesystem, EINTR, ...) false, the write then allocates as it goes
bool reserve_blocks(int fd, int mode, int64_t at, int64_t len, const std::string& path) {
  if (::fallocate(fd, mode, static_cast<off_t>(at), static_cast<off_t>(len)) == 0) return true;
  if (errno == ENOSPC || errno == EDQUOT)
    os_error("cannot allocate " + std::to_string(len) + " bytes at offset " + std::to_string(at) + " of", path, errno);
  return false;
}

//! numel * itemsize with overflow and negative-dimension checks.
int64_t checked_nbytes(at::ScalarType dtype, at::IntArrayRef shape) {
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) throw ValueError("negative dimension " + std::to_string(d) + " in shape " + c10::str(shape));
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t total = item;
  for (int64_t d : shape) {
    if (total > std::numeric_limits<int64_t>::max() / d)
      throw ValueError("byte size of shape " + c10::str(shape) + " overflows int64");
    total *= d;
  }
  return total;
}

//! mmaps [offset, offset + nbytes) of fd and wraps it; the fd may be closed right after.
at::Tensor wrap_mapping(int fd, const std::string& path, at::ScalarType dtype, at::IntArrayRef shape,
                        int64_t nbytes, int64_t offset, bool shared, bool writable, bool anonymous,
                        std::optional<bool> memory_fs = std::nullopt) {
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t aligned = offset - offset % page;
  const int64_t delta = offset - aligned;
  const size_t len = static_cast<size_t>(delta + nbytes);
  const bool file_shared = shared && writable && !anonymous;
  auto ctx = std::make_unique<MapContext>();
  ctx->file_offset = offset;
  ctx->nbytes = nbytes;
  struct stat st {};
  if (file_shared && nbytes > 0 && ::fstat(fd, &st) == 0) {
    ctx->dev = st.st_dev;
    ctx->ino = st.st_ino;
    ctx->first_block = offset / kReserveBlock;
    const int64_t blocks = (offset + nbytes - 1) / kReserveBlock - ctx->first_block + 1;
    ctx->reserved.reset(new std::atomic<uint64_t>[static_cast<size_t>((blocks + 63) / 64)]());
    ctx->reserve = true;
  }
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd,
                      static_cast<off_t>(aligned));
  if (base == MAP_FAILED) os_error("mmap failed for", path, errno);
  char* data = static_cast<char*>(base) + delta;
  ctx->data = data;
  ctx->base = base;
  ctx->len = len;
  Entry e{MappingInfo{anonymous ? std::string() : path, offset, nbytes, writable, anonymous}, base, len,
          std::make_shared<std::mutex>(), file_shared && !(memory_fs ? *memory_fs : on_memory_fs(fd)), ctx->dev, ctx->ino};
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[data] = std::move(e);
  }
  // from here the DataPtr, then the storage, owns the mapping: whatever throws, its deleter runs exactly once
  c10::DataPtr owner(data, ctx.release(), &detail::unmap_context, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes), std::move(owner), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(at::kCPU)).set_(storage, 0, shape);
}

void refuse_symlink(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    throw ValueError("refusing to write through the symlink '" + path + "'");
}

}  // namespace

void detail::unmap_context(void* p) {
  auto* m = static_cast<MapContext*>(p);
  {  // unregister first: once munmapped, the address may be reused by another mapping
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(m->data);
  }
  ::munmap(m->base, m->len);
  delete m;
}

at::Tensor map_file(const std::string& path, at::ScalarType dtype, at::IntArrayRef shape, bool writable,
                    int64_t offset, bool follow_symlinks) {
  return map_file_at(AT_FDCWD, path, path, dtype, shape, writable, offset, follow_symlinks);
}

at::Tensor map_file_at(int dirfd, const std::string& rel, const std::string& path, at::ScalarType dtype,
                       at::IntArrayRef shape, bool writable, int64_t offset, bool follow_symlinks) {
  if (offset < 0) throw ValueError("map_file: negative offset " + std::to_string(offset) + " for '" + path + "'");
  const int64_t nbytes = checked_nbytes(dtype, shape);
  if (nbytes == 0) return at::empty(shape, at::TensorOptions().dtype(dtype));
  // the type is checked before opening: opening a fifo blocks, opening a device may have side effects
  struct stat st;
  if (::fstatat(dirfd, rel.c_str(), &st, follow_symlinks ? 0 : AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) throw ValueError("map_file: refusing to follow the symlink '" + path + "'");
    if (!S_ISREG(st.st_mode)) throw ValueError("map_file: '" + path + "' is not a regular file");
  }
  // O_NONBLOCK: a file swapped for a fifo after the check still cannot block the open
  FdGuard fd{::openat(dirfd, rel.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK |
                                              (follow_symlinks ? 0 : O_NOFOLLOW))};
  if (fd.fd < 0) {
    if (errno == ELOOP && !follow_symlinks) throw ValueError("map_file: refusing to follow the symlink '" + path + "'");
    if (writable && (errno == EACCES || errno == EPERM || errno == EROFS))
      throw BackendError("cannot map '" + path + "' writable: " + errno_text(errno) +
                         " (a writable load needs write permission on every leaf; a read-only load, LoadOptions().writable(false), "
                         "maps it copy-on-write)");
    os_error(writable ? "cannot open for read-write" : "cannot open for reading", path, errno);
  }
  if (::fstat(fd.fd, &st) != 0) os_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw ValueError("map_file: '" + path + "' is not a regular file");
  if (offset > std::numeric_limits<int64_t>::max() - nbytes)
    throw ValueError("map_file: offset + size overflows int64 for '" + path + "'");
  const int64_t need = offset + nbytes;
  if (static_cast<int64_t>(st.st_size) < need)
    throw FormatError("file '" + path + "' is too short: expected at least " + std::to_string(need) + " bytes (" +
                      std::to_string(nbytes) + " for " + c10::toString(dtype) + c10::str(shape) +
                      (offset ? " at offset " + std::to_string(offset) : std::string()) + "), found " +
                      std::to_string(static_cast<int64_t>(st.st_size)));
  return wrap_mapping(fd.fd, path, dtype, shape, nbytes, offset, /*shared=*/writable, writable, false);
}

void create_file(const std::string& path, int64_t nbytes) {
  if (nbytes < 0) throw ValueError("create_file: negative size " + std::to_string(nbytes) + " for '" + path + "'");
  refuse_symlink(path);
  FdGuard fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644)};
  if (fd.fd < 0) {
    if (errno == ELOOP) throw ValueError("refusing to write through the symlink '" + path + "'");
    os_error("cannot create", path, errno);
  }
  if (::ftruncate(fd.fd, static_cast<off_t>(nbytes)) != 0) os_error("ftruncate failed for", path, errno);
}

namespace {

//! the bytes of `tensor` as write_file writes them (value_bytes; TypeError for layouts without one byte layout)
at::Tensor bytes_of(const at::Tensor& tensor, const std::string& path) {
  if (!tensor.defined()) throw ValueError("write_file: undefined tensor for '" + path + "'");
  if (tensor.is_nested()) throw TypeError("write_file: nested tensors have no single byte layout ('" + path + "')");
  if (tensor.is_sparse() || tensor.layout() != at::kStrided)
    throw TypeError("write_file: only strided (dense) tensors can be written ('" + path + "')");
  if (tensor.is_quantized()) throw TypeError("write_file: quantized tensors are not supported ('" + path + "')");
  return value_bytes(tensor);
}

//! creates (or truncates) `path` for writing, never through a symlink: O_NOFOLLOW refuses one as the last component,
//! dangling or not, with ELOOP before anything is created or truncated (an lstat first cost a path walk per leaf)
int create_for_write(const std::string& path, int access) {
  const int fd = ::open(path.c_str(), access | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP) throw ValueError("refusing to write through the symlink '" + path + "'");
    os_error("cannot create", path, errno);
  }
  return fd;
}

//! t's bytes into the open file fd from offset 0
//! `memory_fs`: whether fd is on tmpfs / ramfs (on_memory_fs), when the caller knows it already
void write_bytes(int fd, const at::Tensor& t, const std::string& path, std::optional<bool> memory_fs = std::nullopt) {
  const int64_t nbytes = static_cast<int64_t>(t.nbytes());
  // the whole file's blocks in one call first (see allocate_range): 245 MB written into a fresh file 0.049 s ->
  // 0.030 s here, and a full disk fails before a byte is written
  if (nbytes >= kAllocateMin && !(memory_fs ? *memory_fs : on_memory_fs(fd))) reserve_blocks(fd, 0, 0, nbytes, path);
  const char* p = static_cast<const char*>(t.data_ptr());
  constexpr int64_t kChunk = int64_t{1} << 30;  // pwrite moves at most ~2 GiB per call on Linux
  int64_t done = 0;
  while (done < nbytes) {
    const size_t n = static_cast<size_t>(std::min(kChunk, nbytes - done));
    ssize_t w = ::pwrite(fd, p + done, n, static_cast<off_t>(done));
    if (w < 0) {
      if (errno == EINTR) continue;
      os_error("write failed for", path, errno);
    }
    if (w == 0) throw BackendError("write made no progress for '" + path + "'");
    done += w;
  }
}

}  // namespace

int64_t write_file(const std::string& path, const at::Tensor& tensor) {
  const at::Tensor t = bytes_of(tensor, path);
  FdGuard fd{create_for_write(path, O_WRONLY)};
  write_bytes(fd.fd, t, path);
  return static_cast<int64_t>(t.nbytes());
}

at::Tensor write_and_map(const std::string& path, const at::Tensor& tensor, bool writable) {
  const at::Tensor t = bytes_of(tensor, path);
  const int64_t nbytes = static_cast<int64_t>(t.nbytes());
  if (!writable || nbytes == 0) {
    write_file(path, t);
    return map_file(path, t.scalar_type(), t.sizes(), writable);
  }
  // one open for the write and the mapping (a save of many small leaves paid a second open, two stats and a
  // close per leaf for map_file)
  FdGuard fd{create_for_write(path, O_RDWR)};
  const bool memory_fs = on_memory_fs(fd.fd);  // asked once for the write and the mapping
  write_bytes(fd.fd, t, path, memory_fs);
  return wrap_mapping(fd.fd, path, t.scalar_type(), t.sizes(), nbytes, 0, /*shared=*/true, /*writable=*/true, false,
                      memory_fs);
}

at::Tensor create_and_map(const std::string& path, at::ScalarType dtype, at::IntArrayRef shape) {
  const int64_t nbytes = checked_nbytes(dtype, shape);
  if (nbytes == 0) return at::empty(shape, at::TensorOptions().dtype(dtype));
  create_file(path, nbytes);
  return map_file(path, dtype, shape, /*writable=*/true);
}

at::Tensor map_anonymous(at::ScalarType dtype, at::IntArrayRef shape) {
  const int64_t nbytes = checked_nbytes(dtype, shape);
  if (nbytes == 0) return at::empty(shape, at::TensorOptions().dtype(dtype));
  FdGuard fd{::memfd_create("tensordict", MFD_CLOEXEC)};
  if (fd.fd < 0) os_error("memfd_create failed", "<anonymous>", errno);
  if (::ftruncate(fd.fd, static_cast<off_t>(nbytes)) != 0) os_error("ftruncate failed for", "<anonymous>", errno);
  return wrap_mapping(fd.fd, "<anonymous>", dtype, shape, nbytes, 0, /*shared=*/true, /*writable=*/true, true);
}

std::optional<MappingInfo> mapping_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return std::nullopt;
  const void* key = t.storage().data();
  if (key == nullptr) return std::nullopt;
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(key);
  if (it == registry().end()) return std::nullopt;
  return it->second.info;
}

size_t rename_mapped_files(const std::string& from_dir, const std::string& to_dir) {
  std::string from = from_dir;
  while (from.size() > 1 && from.back() == '/') from.pop_back();
  from += '/';
  std::string to = to_dir;
  while (to.size() > 1 && to.back() == '/') to.pop_back();
  to += '/';
  size_t n = 0;
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto& kv : registry()) {
    std::string& f = kv.second.info.filename;
    if (f.compare(0, from.size(), from) == 0) {
      f = to + f.substr(from.size());
      ++n;
    }
  }
  return n;
}

std::optional<std::string> mapped_filename(const at::Tensor& t) {
  auto info = mapping_of(t);
  if (!info) return std::nullopt;
  return info->filename;
}

void flush(const at::Tensor& t) {
  void* base = nullptr;
  size_t len = 0;
  std::string name;
  {
    if (!t.defined() || !t.has_storage()) throw ValueError("flush: not a memory-mapped tensor");
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(t.storage().data());
    if (it == registry().end()) throw ValueError("flush: not a memory-mapped tensor");
    base = it->second.base;
    len = it->second.map_len;
    name = it->second.info.filename;
  }
  // `t` keeps the mapping alive while we sync it.
  if (::msync(base, len, MS_SYNC) != 0) os_error("msync failed for", name, errno);
}

namespace {
//! the registry entry of t's storage and t's byte range inside the mapping; false if t is not mapped here
//! the registry entry of the bytes [p, p + len) of t's storage and their offset in the mapping; false if t is not
//! mapped here or the range leaves the mapping
bool range_entry(const at::Tensor& t, const void* p, int64_t len, Entry* out, int64_t* begin) {
  if (!t.defined() || !t.has_storage()) return false;
  const void* key = t.storage().data();
  if (key == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(key);
    if (it == registry().end()) return false;
    *out = it->second;
  }
  *begin = static_cast<int64_t>(static_cast<const char*>(p) - static_cast<const char*>(key));
  return *begin >= 0 && len >= 0 && *begin + len <= out->info.nbytes;
}

bool view_range(const at::Tensor& t, Entry* out, int64_t* begin, int64_t* len) {
  if (!t.defined() || t.numel() == 0) return false;
  *len = static_cast<int64_t>(t.numel() * t.element_size());
  return range_entry(t, t.data_ptr(), *len, out, begin);
}

//! Allocates the file blocks of [at, at + len) before a write of them (fallocate, FALLOC_FL_KEEP_SIZE): a write
//! into a hole otherwise makes ext4 reserve and track each 4 KiB block as it goes (delayed allocation, most of
//! a buffered write's time into a fresh file), while one call allocates the whole range as unwritten extents.
//! Measured here, 480 MB in 12 MB chunks of 256 KiB pwrites into a fresh file: 0.085 s, 0.055 s with a
//! fallocate per chunk (0.1 ms of it), and 0.20 against 0.17 s including the fsync. Only blocks about to be
//! written are allocated, so a file stays sparse where nothing is written. A full disk is reported here,
//! before a byte is written; a filesystem without fallocate writes as before.
bool allocate_range(int fd, const Entry& e, int64_t at, int64_t len) {
  return e.allocate && len >= kAllocateMin && reserve_blocks(fd, FALLOC_FL_KEEP_SIZE, at, len, e.info.filename);
}

//! opens the mapped file by its name for writing: -1 when the name is gone or now leads to another file (a file
//! renamed over it, a later save switched in): the mapping's own file is no longer reachable by name, and a
//! write by name would land in the other file
int open_mapped_for_write(const Entry& e) {
  if (e.ino == 0) return -1;
  const int fd = ::open(e.info.filename.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

bool pwrite_into_mapping(const at::Tensor& dst, const at::Tensor& src) {
  Entry e{};
  int64_t begin = 0, len = 0;
  if (!dst.is_contiguous() || !view_range(dst, &e, &begin, &len)) return false;
  if (!e.info.writable || e.info.anonymous || e.info.filename.empty()) return false;
  if (!src.defined() || src.sizes() != dst.sizes() || src.device() != dst.device()) return false;
  // the mapping's own file or nothing: a name that now leads elsewhere (or nowhere) is not written through, the
  // caller stores through the mapping instead
  FdGuard fd{open_mapped_for_write(e)};
  if (fd.fd < 0) return false;
  const at::Tensor bytes = src.to(dst.scalar_type()).contiguous();
  const char* p = static_cast<const char*>(bytes.data_ptr());
  const int64_t at = e.info.file_offset + begin;
  // pieces of at most 256 KiB ending on 256 KiB file offsets: the kernel sizes the page-cache folios of a
  // buffered write by its length, and on these VMs a fresh 2 MiB folio costs about what 512 fresh 4 KiB pages
  // do one by one, under the inode lock every writer of the file waits on. Measured (2 threads writing
  // 480 MB in 12 MB chunks into a fresh file, memory the VM had not touched for 30 s): one pwrite per chunk
  // 1.15-1.19 s, 2 MiB pieces 1.19 s, 512 KiB 0.29 s, 256 KiB 0.11-0.13 s; with recently freed memory all
  // take 0.09-0.10 s (bench/README.md, "map out writes")
  //
  // One writer at a time per mapping, for the whole view. ext4 holds the inode lock for each buffered write, so
  // two threads writing one file take turns piece by piece, each spinning while the other copies: they finish
  // their views together and then run their next fn together, both working sets in the cache at once. Taking
  // turns view by view lets one write while the other computes, and no CPU spins. Main job, 10 alternating
  // pairs: 0.82-0.93x the one-thread floor -> 0.81-0.95x, mean 0.865 -> 0.895; the kernel's
  // rwsem_spin_on_owner (4% of the job's samples) leaves the profile.
  constexpr int64_t kPiece = 256 << 10;
  std::unique_lock<std::mutex> whole;
  if (e.writers) whole = std::unique_lock<std::mutex>(*e.writers);
  allocate_range(fd.fd, e, at, len);
  int64_t done = 0;
  while (done < len) {
    const int64_t piece = std::min(len - done, kPiece - (at + done) % kPiece);
    const ssize_t w = ::pwrite(fd.fd, p + done, static_cast<size_t>(piece), static_cast<off_t>(at + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      os_error("pwrite failed for", e.info.filename, errno);
    }
    done += w;
  }
  return true;
}

void sync_path(const std::string& path, bool directory) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : O_NOFOLLOW))};
  if (fd.fd < 0) os_error("cannot open for fsync", path, errno);
  while (::fsync(fd.fd) != 0) {
    if (errno == EINTR) continue;
    if (directory && errno == EINVAL) return;
    os_error("fsync failed for", path, errno);
  }
}

bool allocate_for_write(const at::Tensor& mapped, const void* begin, int64_t nbytes) {
  Entry e{};
  int64_t off = 0;
  if (nbytes < kAllocateMin || !range_entry(mapped, begin, nbytes, &e, &off) || !e.allocate) return false;
  FdGuard fd{open_mapped_for_write(e)};
  if (fd.fd < 0) return false;  // renamed, removed or replaced since: the stores still reach the mapping
  return allocate_range(fd.fd, e, e.info.file_offset + off, nbytes);
}

bool allocate_for_write(const at::Tensor& dst) {
  if (!dst.defined() || !dst.has_storage() || !dst.is_contiguous()) return false;
  return allocate_for_write(dst, dst.data_ptr(), static_cast<int64_t>(dst.numel() * dst.element_size()));
}

bool reserves_stores(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const c10::DataPtr& owner = t.storage().data_ptr();
  return owner.get_deleter() == &detail::unmap_context &&
         static_cast<MapContext*>(owner.get_context())->reserve.load(std::memory_order_relaxed);
}

void reserve_for_store(const at::Tensor& mapped, const void* begin, int64_t nbytes) {
  if (nbytes <= 0 || !mapped.defined() || !mapped.has_storage()) return;
  const c10::DataPtr& owner = mapped.storage().data_ptr();
  if (owner.get_deleter() != &detail::unmap_context) return;  // not a mapping made here: no lock, no lookup
  auto* m = static_cast<MapContext*>(owner.get_context());
  if (!m->reserve.load(std::memory_order_relaxed)) return;
  const int64_t off = static_cast<int64_t>(static_cast<const char*>(begin) - static_cast<const char*>(m->data));
  if (off < 0 || off > m->nbytes - nbytes) return;
  const int64_t first = (m->file_offset + off) / kReserveBlock - m->first_block;
  const int64_t last = (m->file_offset + off + nbytes - 1) / kReserveBlock - m->first_block;
  auto is_set = [m](int64_t b) {
    return (m->reserved[static_cast<size_t>(b / 64)].load(std::memory_order_acquire) >> (b % 64)) & 1u;
  };
  auto unset_from = [&](int64_t b) {
    while (b <= last && is_set(b)) ++b;
    return b;
  };
  if (unset_from(first) > last) return;  // the common case: every block reserved already
  std::string path;  // the file's name now (rename_mapped_files may have moved it), before the other lock
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(m->data);
    if (it != registry().end()) path = it->second.info.filename;
  }
  // one reservation at a time in the process (they are rare: once per block), held across fork()
  std::lock_guard<std::mutex> one(detail::fork_safe_mutex<struct ReserveMutex>());
  const int64_t lo = unset_from(first);
  if (lo > last) return;  // another thread reserved them meanwhile
  int64_t hi = last;
  while (hi > lo && is_set(hi)) --hi;
  // the blocks [lo, hi], clipped to this mapping's bytes of the file: other bytes of the file stay as they are
  const int64_t from = std::max((m->first_block + lo) * kReserveBlock, m->file_offset);
  const int64_t to = std::min((m->first_block + hi + 1) * kReserveBlock, m->file_offset + m->nbytes);
  FdGuard fd{path.empty() ? -1 : ::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
  struct stat st {};
  // removed since, or the name now leads to another file: the stores still reach the mapping, as before
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0 || st.st_dev != m->dev || st.st_ino != m->ino) return;
  if (!reserve_blocks(fd.fd, FALLOC_FL_KEEP_SIZE, from, to - from, path)) {
    m->reserve.store(false, std::memory_order_relaxed);  // no fallocate here: stores allocate as they go
    return;
  }
  for (int64_t b = lo; b <= hi; ++b)
    m->reserved[static_cast<size_t>(b / 64)].fetch_or(uint64_t{1} << (b % 64), std::memory_order_release);
}

void reserve_for_store(const at::Tensor& dst) {
  if (!reserves_stores(dst)) return;
  if (const int64_t n = span_bytes(dst); n > 0) reserve_for_store(dst, dst.data_ptr(), n);
}

bool populate_for_write(const at::Tensor& dst) {
#ifdef MADV_POPULATE_WRITE
  if (!dst.defined() || !dst.device().is_cpu() || dst.numel() == 0 || !dst.is_contiguous()) return false;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(dst.data_ptr());
  const uintptr_t end = begin + static_cast<uintptr_t>(dst.numel() * dst.element_size());
  const uintptr_t first = begin / page * page, last = (end + page - 1) / page * page;
  // pages are the unit of a mapping: the rounded range lies inside the mapping(s) that hold the view
  return ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0;
#else
  (void)dst;
  return false;
#endif
}

size_t live_mappings() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().size();
}

}  // namespace tensordict::backends
