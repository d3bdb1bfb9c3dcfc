// Stale shared-memory segments: a sweep removes the segments of a prefix whose creator is gone (nobody holds
// their lock and the pid + start time in their name name no live process); create() runs one at most once a
// second per prefix.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <unordered_map>

#include "shm_internal.hpp"
#include "tensordict/backends/fork_safe.hpp"

namespace tensordict::backends {
namespace shm_internal {
namespace {

std::mutex& cleanup_mutex() { return detail::fork_safe_mutex<struct CleanupMutex>(); }

}  // namespace

void maybe_cleanup(const std::string& prefix) {
  static std::unordered_map<std::string, std::chrono::steady_clock::time_point> last;
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(cleanup_mutex());
    auto it = last.find(prefix);
    if (it != last.end() && now - it->second < std::chrono::seconds(1)) return;
    last[prefix] = now;
  }
  try {
    cleanup_stale_segments(prefix);
  } catch (...) {
    // best effort: a failed sweep must not fail create()
  }
}

}  // namespace shm_internal

using namespace shm_internal;

namespace {
//! false only when the pid + start time in a segment's name certainly name no live process of this PID namespace
//! (a second witness beside the lock, for segments made by builds that took no lock: their live creators in this
//! namespace keep them)
bool creator_alive(pid_t pid, uint64_t starttime) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  auto st = read_proc_stat(pid);
  if (!st) return errno != ENOENT && errno != ESRCH;  // unreadable (e.g. hidepid): assume alive
  if (st->state == 'Z' || st->state == 'X') return false;
  return st->starttime == starttime;
}
}  // namespace

size_t cleanup_stale_segments(const std::string& prefix) {
  check_prefix(prefix);
  DIR* dir = ::opendir(kShmDir);
  if (!dir) return 0;
  std::vector<std::string> candidates;
  while (struct dirent* ent = ::readdir(dir)) {
    std::string name = ent->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    pid_t pid = 0;
    uint64_t start = 0;
    // a segment whose named creator lives in this namespace is kept whatever its lock says
    if (parse_name_tail(name.substr(prefix.size()), &pid, &start) && !creator_alive(pid, start))
      candidates.push_back(std::move(name));
  }
  ::closedir(dir);
  size_t removed = 0;
  for (const auto& name : candidates) {
    const std::string path = kShmDir + name;
    // non-blocking open: a fifo planted under one of our names never blocks the sweep
    int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat held, named;
    // dead = nobody holds the segment's lock. Its size is read under our exclusive lock: 0 is a segment whose
    // creator has not locked it yet (it takes the lock before it gives the segment a size), kept; so is
    // anything that is not a plain file, and a name that no longer holds the file we locked
    if (::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && flock_retry(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::fstat(fd, &held) == 0 && held.st_size > 0 && ::lstat(path.c_str(), &named) == 0 &&
        named.st_dev == held.st_dev && named.st_ino == held.st_ino && ::unlink(path.c_str()) == 0)
      ++removed;
    ::close(fd);  // releases the exclusive lock
  }
  return removed;
}

}  // namespace tensordict::backends
