#pragma once
//! Memory-mapped files as at::Tensors: a tensor returned here has a storage over an mmap whose DataPtr deleter
//! munmaps it when the last reference to the storage goes away. No file descriptor is kept open:
//! each function closes its fd right after mmap(2).
//!
//! Which file a tensor maps is recorded in a process-wide registry keyed by the storage's data pointer, so
//! views that share the storage (slices, reshapes, `t[i]`) report the same mapping: see mapping_of().
//!
//! Thread-safety: every function here may be called concurrently from any thread (the registry has its
//! own mutex). Concurrent writes to the same bytes of a mapping are the caller's business, as for any
//! tensor. Ownership: the returned tensor owns the mapping; the file itself is never deleted here.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tensordict::backends {

//! What a mapped tensor's storage is backed by (see mapping_of()).
struct MappingInfo {
  std::string filename;  //!< the path given when mapping; empty for anonymous memory
  int64_t file_offset = 0;  //!< byte offset in the file where the storage starts
  int64_t nbytes = 0;       //!< bytes mapped for the storage
  bool writable = false;    //!< true: MAP_SHARED (writes reach the file); false: private copy-on-write
  bool anonymous = false;   //!< memfd-backed (map_anonymous)
};

//! Maps `shape`-many `dtype` elements of `path`, starting at byte `offset`, as a C-contiguous CPU tensor.
//! writable=true: O_RDWR + MAP_SHARED, in-place ops write through to the file (and to every other
//! process mapping it). writable=false: O_RDONLY + MAP_PRIVATE with PROT_READ|PROT_WRITE, i.e. a private
//! copy-on-write view: in-place ops work and never reach the file.
//! The file may be longer than needed (trailing bytes are ignored). Shapes with zero elements need no
//! file: an ordinary empty tensor is returned and `path` is not touched.
//! The file type is checked before it is opened (and the open is non-blocking), so a fifo, device or
//! socket is refused without blocking. follow_symlinks=false: a symlink at `path` is refused (O_NOFOLLOW).
//! Throws ValueError (negative dim/offset, byte size overflow, not a regular file, refused symlink),
//! FormatError naming the file with expected vs actual size if the file is too short,
//! BackendError for OS failures (missing file, mmap failure), with errno's text; writable=true on a file this
//! process may not open for writing (EACCES, EPERM, EROFS) is a BackendError naming the file, never a fallback to
//! a private mapping whose writes would be lost.
at::Tensor map_file(const std::string& path, at::ScalarType dtype, at::IntArrayRef shape, bool writable,
                    int64_t offset = 0, bool follow_symlinks = true);

//! map_file() of `rel` opened relative to the directory `dirfd` (openat; AT_FDCWD: the working directory), named
//! `path` in messages and in mapping_of(): a loader that holds its directory open reads every leaf from that one
//! directory even when its name is switched to another directory meanwhile (memmap_format.hpp, read_dir).
at::Tensor map_file_at(int dirfd, const std::string& rel, const std::string& path, at::ScalarType dtype,
                       at::IntArrayRef shape, bool writable, int64_t offset = 0, bool follow_symlinks = true);

//! Creates (or truncates) `path` as a sparse zero-filled file of `nbytes` bytes with ftruncate: no data
//! is written and no RAM is used until pages are touched. Existing contents are discarded, so the file
//! reads as zeros afterwards (unlike Python's from_file, which keeps stale bytes).
//! Throws ValueError if `path` is an existing symlink (never followed) or nbytes < 0, BackendError on OS errors.
void create_file(const std::string& path, int64_t nbytes);

//! Writes the bytes of `tensor` (made CPU and C-contiguous first; expanded/strided views are densified)
//! to `path`, replacing its contents, with large pwrite(2)s into the page cache, its blocks allocated first in
//! one fallocate (as allocate_for_write; not on tmpfs / ramfs, not under 256 KiB). Returns the byte count.
//! The file is created even when the tensor has no elements (0 bytes).
//! Throws ValueError for an existing symlink at `path`, TypeError for nested/sparse/quantized tensors,
//! BackendError on OS errors (e.g. ENOSPC), leaving a partially written file behind.
int64_t write_file(const std::string& path, const at::Tensor& tensor);

//! write_file() then map_file(path, tensor's dtype and shape, writable): Python's MemoryMappedTensor.from_tensor.
//! With zero elements, the (empty) file is still created and an ordinary empty tensor is returned.
at::Tensor write_and_map(const std::string& path, const at::Tensor& tensor, bool writable = true);

//! create_file() then map_file(writable=true): a zero-filled file-backed tensor (Python's memmap_like /
//! MemoryMappedTensor.zeros(filename=...)). With zero elements no file is created (Python creates none).
at::Tensor create_and_map(const std::string& path, at::ScalarType dtype, at::IntArrayRef shape);

//! Zero-filled tensor in anonymous shared memory (memfd_create + MAP_SHARED; the fd is closed at once).
//! Shared with children created by fork(); invisible to unrelated processes. mapping_of() reports
//! anonymous=true and filename = "". Zero elements: an ordinary empty tensor.
at::Tensor map_anonymous(at::ScalarType dtype, at::IntArrayRef shape);

//! The mapping behind `t`'s storage (works for any view of a mapped tensor), or nullopt if `t` is
//! undefined, not created by this file's functions, or has zero elements.
std::optional<MappingInfo> mapping_of(const at::Tensor& t);

//! The file behind `t` (empty string for anonymous memory), or nullopt if `t` is not mapped here.
std::optional<std::string> mapped_filename(const at::Tensor& t);

//! The mappings made here from files below `from_dir` now name the same files below `to_dir` (the directory
//! was renamed: a staged save switched in, engine/src/memmap.cpp). Returns how many were renamed.
size_t rename_mapped_files(const std::string& from_dir, const std::string& to_dir);

//! msync(MS_SYNC) of the whole mapping behind `t` (writable file mappings: forces data to the file;
//! private/anonymous mappings: no-op). Throws ValueError if `t` is not a mapped tensor, BackendError on failure.
void flush(const at::Tensor& t);

//! Writes `src` into `dst`, a C-contiguous view of a writable file mapping made here, with pwrite(2) of its
//! bytes at dst's offset in the file instead of stores through the mapping: the kernel fills the page
//! cache without a page fault per 4 KiB (on these VMs ~10 us each on a fresh mapping), and the mapping
//! sees the bytes (one page cache). The view's file blocks are allocated first (allocate_for_write), so a
//! full disk is reported before a byte is written. `src` must have dst's shape; it is converted to dst's dtype. Returns
//! false, having written nothing, when dst is not such a view (private, anonymous, not mapped here, not
//! contiguous), the shapes differ, or the mapped file's name no longer leads to the mapped file (removed, or
//! another file renamed over it: checked by device and inode, so the other file is never written; the caller
//! stores through the mapping instead); BackendError when the file cannot be written.
//! Thread-safety: as for any write to those bytes (disjoint views may be written concurrently).
bool pwrite_into_mapping(const at::Tensor& dst, const at::Tensor& src);

//! fsync(2) of the file or directory `path` (opened read-only for it): its data and metadata reach the disk.
//! BackendError naming it when it cannot be opened or the fsync fails; for a directory, a file system that refuses
//! fsync on directories (EINVAL) is not an error.
void sync_path(const std::string& path, bool directory);

//! Allocates the file blocks behind the bytes [begin, begin + nbytes) of `mapped`'s storage, a writable file
//! mapping made here, ahead of stores or a pwrite that fill them: fallocate(FALLOC_FL_KEEP_SIZE) of that range.
//! Into a hole, a buffered write or a store through the mapping otherwise makes the filesystem reserve each
//! 4 KiB block as it goes (ext4's delayed allocation); one call allocates the range as unwritten extents, so
//! the writes that follow are plain copies. Only the range is allocated: the rest of a sparse file stays a
//! hole. Returns false, doing nothing, for ranges under 256 KiB, tensors not mapped here, private or anonymous
//! mappings, files on tmpfs / ramfs (fallocate there would zero-fill pages the write fills anyway), and
//! filesystems without fallocate. Throws BackendError naming the file when the disk (or quota) is full, before
//! a byte is written: a store into a mapping would instead die of SIGBUS.
//! pwrite_into_mapping() calls it itself.
bool allocate_for_write(const at::Tensor& mapped, const void* begin, int64_t nbytes);
//! allocate_for_write() over the bytes of `dst`, a C-contiguous view of such a mapping (false otherwise).
bool allocate_for_write(const at::Tensor& dst);

//! Reserves the file blocks behind the bytes [begin, begin + nbytes) of `mapped`'s storage before stores
//! through the mapping fill them, so that a full disk (or a full tmpfs, or a quota) is a BackendError naming the
//! file instead of a SIGBUS at the first store into a block the filesystem cannot allocate. Any size: each
//! mapping keeps a bit per 256 KiB block of its file, so a block costs one fallocate(FALLOC_FL_KEEP_SIZE) (an
//! open and the call, clipped to the mapping's bytes) the first time a store reaches it, and a bit test after.
//! A file stays sparse outside the blocks written. Does nothing for tensors not mapped here (told apart by the
//! storage's deleter, without a lock), private or anonymous mappings, and filesystems without fallocate.
//! Thread-safe. td[rows] = value calls it before its copies (engine/README.md, "memmap writes").
void reserve_for_store(const at::Tensor& mapped, const void* begin, int64_t nbytes);
namespace detail {
void unmap_context(void* context);  //!< the deleter of every mapping made here
}
//! true when `t`'s storage is a mapping made here (any kind): an inline test of its deleter, for callers on a hot
//! path that only call reserve_for_store() for such tensors
inline bool made_here(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &detail::unmap_context;
}
//! true when stores into `t`'s storage reserve their blocks (reserve_for_store does something): a writable shared
//! file mapping made here, on a filesystem that took fallocate so far. No lock; for callers that would otherwise
//! compute byte ranges for nothing.
bool reserves_stores(const at::Tensor& t);
//! bytes from a view's first element to the end of its last one (0 for no elements or a negative stride)
inline int64_t span_bytes(const at::Tensor& v) {
  if (!v.defined() || v.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < v.dim(); ++d) {
    if (v.stride(d) < 0) return 0;
    last += (v.size(d) - 1) * v.stride(d);
  }
  return (last + 1) * static_cast<int64_t>(v.element_size());
}
//! reserve_for_store() over span_bytes(dst) from dst's first element: before a copy into the whole of a mapped leaf
void reserve_for_store(const at::Tensor& dst);

//! madvise(MADV_POPULATE_WRITE) over the pages of `dst`, a C-contiguous CPU tensor (a view of a shared or
//! file mapping, any memory): the kernel allocates and maps them in one call, so the stores that follow do
//! not fault page by page. Returns false when dst is not contiguous or the kernel refuses (MADV_POPULATE_WRITE
//! is Linux 5.14+). Use it on outputs only: on a private file mapping it copies every page.
bool populate_for_write(const at::Tensor& dst);

//! Number of live mappings created by this file's functions (diagnostics and leak tests).
size_t live_mappings();

}  // namespace tensordict::backends
