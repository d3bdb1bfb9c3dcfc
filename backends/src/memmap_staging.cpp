// Staging directories of memmap saves (StagingDir): a sibling of the prefix held by an OFD lock while a
// save writes it, and the removal of stages whose writer is provably gone.
#include "tensordict/backends/memmap_format.hpp"
#include "memmap_format_internal.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <unordered_set>

#include "tensordict/errors.hpp"

namespace tensordict::backends {

using memmap_detail::join;

// ------------------------------------------------------------------------------------------ staged saves
namespace {

//! (parent, ".<base>.td-stage.") of a prefix; an empty tag when it has no sibling to stage in
std::pair<std::string, std::string> stage_tag(const std::string& prefix) {
  std::string p = prefix;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (base.empty() || base == "." || base == ".." || base == "/") return {parent, ""};
  return {parent, "." + base + ".td-stage."};
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

//! an OFD write lock on the whole file, without waiting: false when another open file description holds one
bool try_lock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

//! whether `path` still names the file open as `fd` (not unlinked or replaced since it was opened)
bool same_file(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

//! `fd` (open on `lock`) locked and still named `lock`: the writer it belonged to is gone
bool lock_abandoned(int fd, const std::string& lock) { return fd >= 0 && try_lock(fd) && same_file(fd, lock); }

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string random_hex() {
  static std::atomic<uint64_t> counter{0};
  uint64_t r = 0;
  try {
    std::random_device rd;
    r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (const std::exception&) {
  }
  r ^= (counter.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

}  // namespace

size_t remove_abandoned_stages(const std::string& prefix) {
  const auto [parent, tag] = stage_tag(prefix);
  if (tag.empty()) return 0;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(parent.c_str())) {
    while (dirent* de = ::readdir(d)) {
      const std::string n = de->d_name;
      if (n.compare(0, tag.size(), tag) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::unordered_set<std::string> present(names.begin(), names.end());
  size_t removed = 0;
  for (const std::string& n : names) {
    const bool is_lock = ends_with(n, ".lock");
    // a staging directory, the ".old" directory of a two-rename switch, or a lock file left without either
    const std::string stage = is_lock ? n.substr(0, n.size() - 5) : ends_with(n, ".old") ? n.substr(0, n.size() - 4) : n;
    if (is_lock && (present.count(stage) || present.count(stage + ".old"))) continue;  // handled with its directory
    const std::string lock = join(parent, stage + ".lock");
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // no lock file: an older version's, or one being removed: cannot be proven dead
    if (lock_abandoned(fd, lock)) {
      if (!is_lock) {
        remove_tree(join(parent, n));
        ++removed;
      }
      struct stat st;
      if (::lstat(join(parent, stage).c_str(), &st) != 0 && ::lstat(join(parent, stage + ".old").c_str(), &st) != 0)
        ::unlink(lock.c_str());
    }
    ::close(fd);
  }
  return removed;
}

StagingDir::StagingDir(const std::string& prefix) {
  const auto [parent, tag] = stage_tag(prefix);
  if (tag.empty()) return;  // no sibling to stage in: in place
  // a prefix under directories that do not exist yet: they are created, as upstream's memmap_ (os.makedirs)
  std::error_code ec;
  if (!std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) throw BackendError("cannot create the directory '" + parent + "': " + ec.message());
  }
  remove_abandoned_stages(prefix);
  // the lock file first, locked, then the directory: a staging directory never exists unlocked while its writer
  // lives. A cleaner may take a fresh lock file in the moment before it is locked: then another name is tried.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string stage = join(parent, tag + std::to_string(::getpid()) + "." + random_hex());
    const std::string lock = stage + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      if (errno == EACCES || errno == EPERM || errno == EROFS) return;  // read-only parent: in place
      if (errno == EEXIST) continue;
      throw BackendError("cannot create the lock file '" + lock + "': " + std::strerror(errno));
    }
    if (!try_lock(fd) || !same_file(fd, lock)) {
      ::close(fd);
      continue;
    }
    if (::mkdir(stage.c_str(), 0755) != 0) {
      const int err = errno;
      ::unlink(lock.c_str());
      ::close(fd);
      if (err == EEXIST) continue;
      if (err == EACCES || err == EPERM || err == EROFS) return;
      throw BackendError("cannot create the staging directory '" + stage + "': " + std::strerror(err));
    }
    path_ = stage;
    lock_fd_ = fd;
    return;
  }
  throw BackendError("cannot create a staging directory beside '" + prefix + "': every name tried was taken");
}

StagingDir::~StagingDir() {
  if (lock_fd_ < 0) return;
  remove_tree(path_);
  remove_tree(path_ + ".old");
  ::unlink((path_ + ".lock").c_str());
  ::close(lock_fd_);  // releases the lock
}
}  // namespace tensordict::backends
