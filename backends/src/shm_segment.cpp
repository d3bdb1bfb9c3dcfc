// Shared-memory segments: ShmSegment::create (a fresh name, the creator's lock, every page reserved, the
// name registered for unlinking when the process dies) and open, unlink, tensors over a segment, and the
// map of this process' live mappings. See shm.hpp for the API and the lifetime scheme.
#include "tensordict/backends/shm.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "shm_internal.hpp"
#include "tensordict/backends/fork_safe.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {
namespace shm_internal {

//! held across fork() (fork_safe.hpp)
std::mutex& live_mutex() { return detail::fork_safe_mutex<struct LiveMutex>(); }
std::map<uintptr_t, ShmSegment*>& live_map() {
  static auto* m = new std::map<uintptr_t, ShmSegment*>;
  return *m;
}

}  // namespace shm_internal

using namespace shm_internal;

namespace {

//! Gives the new segment its size with every page allocated (fallocate on tmpfs): a full /dev/shm is an error
//! here, not a SIGBUS at the first store into a page tmpfs cannot supply later. In pieces, each retried on
//! EINTR (tmpfs gives up a whole call when a signal arrives), so a process with a busy timer still gets
//! through. Filesystems without fallocate: ftruncate (sparse, as before). Returns 0 or an errno.
int reserve_pages(int fd, uint64_t nbytes) {
  // the size first (instant), then the pages (tens of ms for a large segment): a creator killed while its pages are
  // reserved leaves a sized segment without a lock, which the stale cleanup removes. Were the size set by the
  // fallocate itself, it would stay 0 until the call returned, and a size-0 segment is one the cleanup must keep
  // (a creator between shm_open and its lock)
  int rc;
  do {
    rc = ::ftruncate(fd, off_t(nbytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return errno;
  constexpr uint64_t kPiece = uint64_t(256) << 20;
  for (uint64_t off = 0; off < nbytes;) {
    const uint64_t len = std::min(kPiece, nbytes - off);
    do {
      rc = ::fallocate(fd, 0, off_t(off), off_t(len));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if ((errno == EOPNOTSUPP || errno == ENOSYS) && off == 0) break;
      return errno;
    }
    off += len;
  }
  return 0;
}

}  // namespace

// =====================================================================================================
// ShmSegment

ShmSegment::ShmSegment(std::string name, void* data, uint64_t size, int owner_pid, void* owned_node, int lock_fd)
    : name_(std::move(name)),
      data_(data),
      size_(size),
      owner_pid_(owner_pid),
      owned_node_(owned_node),
      lock_fd_(lock_fd) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_map()[reinterpret_cast<uintptr_t>(data_)] = this;
}

ShmSegment::~ShmSegment() {
  {
    std::lock_guard<std::mutex> lock(live_mutex());
    auto it = live_map().find(reinterpret_cast<uintptr_t>(data_));
    if (it != live_map().end() && it->second == this) live_map().erase(it);
  }
  if (data_) ::munmap(data_, size_);
  if (owner() && linked_) {
    ::shm_unlink(("/" + name_).c_str());  // errors ignored: nothing sensible to do in a destructor
    owned_release(static_cast<OwnedNode*>(owned_node_));
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // after the unlink: the name never outlives the lock while we live
}

bool ShmSegment::owner() const { return owner_pid_ != 0 && owner_pid_ == ::getpid(); }

bool ShmSegment::linked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return linked_;
}

void ShmSegment::unlink() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!linked_) return;
  if (::shm_unlink(("/" + name_).c_str()) != 0 && errno != ENOENT)
    throw BackendError("shm_unlink('" + name_ + "') failed: " + errno_text(errno));
  linked_ = false;
  if (owner()) {
    owned_release(static_cast<OwnedNode*>(owned_node_));
    owned_node_ = nullptr;
  }
  if (lock_fd_ >= 0) {  // the name is gone: nothing left for the lock to protect
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

std::shared_ptr<ShmSegment> ShmSegment::create(uint64_t nbytes, const std::string& prefix) {
  check_prefix(prefix);
  if (nbytes == 0) throw ValueError("shm segment size must be > 0");
  if (nbytes > uint64_t(INT64_MAX)) throw ValueError("shm segment size too large");
  maybe_cleanup(prefix);
  struct statvfs vfs;
  if (::statvfs(kShmDir, &vfs) == 0) {
    unsigned __int128 avail = (unsigned __int128)vfs.f_bavail * vfs.f_frsize;
    if (avail < nbytes)
      throw BackendError("not enough space in /dev/shm for a " + std::to_string(nbytes) +
                         "-byte segment (" + std::to_string(uint64_t(avail)) + " bytes free)");
  }
  ensure_handlers();

  for (int attempt = 0;; ++attempt) {
    std::string name = make_name(prefix);
    // registered before it exists: a signal between shm_open and registration cannot leak it
    OwnedNode* node = owned_acquire(name);
    std::string shm_name = "/" + name;
    int fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int err = errno;
      owned_release(node);
      if (err == EEXIST && attempt < 8) continue;
      throw BackendError("shm_open('" + name + "', create) failed: " + errno_text(err) +
                         (err == EMFILE ? " (every live segment this process created holds one descriptor: release "
                                          "segments or raise RLIMIT_NOFILE)"
                                        : ""));
    }
    auto fail = [&](const std::string& what, int err) {
      ::close(fd);
      ::shm_unlink(shm_name.c_str());
      owned_release(node);
      if (err == ENOSPC || err == ENOMEM)
        throw BackendError("not enough space in /dev/shm for a " + std::to_string(nbytes) + "-byte segment ('" + name +
                           "'): " + what + " failed: " + errno_text(err));
      throw BackendError(what + " of shm segment '" + name + "' (" + std::to_string(nbytes) + " bytes) failed: " +
                         errno_text(err));
    };
    // the lock first, then the size: a segment with a size always has its creator's lock (stale cleanup)
    if (flock_retry(fd, LOCK_SH) != 0) fail("flock", errno);
    int err = reserve_pages(fd, nbytes);
    if (err != 0) fail("reserving its pages (fallocate)", err);
    void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("mmap", errno);
    try {
      return std::shared_ptr<ShmSegment>(new ShmSegment(name, p, nbytes, int(::getpid()), node, fd));
    } catch (...) {
      ::munmap(p, nbytes);
      ::close(fd);
      ::shm_unlink(shm_name.c_str());
      owned_release(node);
      throw;
    }
  }
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name_in) {
  std::string name = normalize_name(name_in);
  std::string shm_name = "/" + name;
  int fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    throw BackendError("cannot open shm segment '" + name + "': " + errno_text(err) +
                       (err == ENOENT ? " (its creator released or removed it, or it never existed)" : ""));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw BackendError("fstat of shm segment '" + name + "' failed: " + errno_text(err));
  }
  if (st.st_size <= 0) {
    ::close(fd);
    throw BackendError("shm segment '" + name + "' is empty (size 0)");
  }
  uint64_t size = uint64_t(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw BackendError("mmap of shm segment '" + name + "' failed: " + errno_text(err));
  try {
    return std::shared_ptr<ShmSegment>(new ShmSegment(name, p, size, 0, nullptr, -1));
  } catch (...) {
    ::munmap(p, size);
    throw;
  }
}

at::Tensor ShmSegment::tensor_at(uint64_t offset, at::ScalarType dtype, at::IntArrayRef shape) {
  uint64_t nbytes = 0;
  std::string problem = extent_problem(offset, dtype, shape, &nbytes);
  if (!problem.empty()) throw ValueError("shm segment '" + name_ + "': " + problem);
  if (offset > size_ || nbytes > size_ - offset)
    throw ValueError("shm segment '" + name_ + "': bytes [" + std::to_string(offset) + ", " +
                     std::to_string(offset + nbytes) + ") exceed its size " + std::to_string(size_));
  auto self = shared_from_this();
  void* ptr = static_cast<char*>(data_) + offset;
  return at::from_blob(
      ptr, shape, [self](void*) mutable { self.reset(); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

size_t live_segments() {
  std::lock_guard<std::mutex> lock(live_mutex());
  return live_map().size();
}

}  // namespace tensordict::backends
