// Shared-memory segment names: checks, "<prefix><pid>_<starttime>_<counter>_<hex>" (made and parsed), the
// pid + start time of a process (/proc/<pid>/stat), and the creator's lock every user of a segment holds.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <random>

#include "shm_internal.hpp"
#include "tensordict/backends/fork_safe.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends::shm_internal {
namespace {

constexpr size_t kMaxPrefix = 180;
constexpr size_t kMaxName = 250;  // NAME_MAX is 255

bool valid_prefix_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

}  // namespace

void check_prefix(const std::string& prefix) {
  if (prefix.empty() || prefix.size() > kMaxPrefix)
    throw ValueError("shm prefix must have 1 to " + std::to_string(kMaxPrefix) + " characters, got '" +
                     prefix + "'");
  for (char c : prefix)
    if (!valid_prefix_char(c))
      throw ValueError("shm prefix '" + prefix + "' may only contain [A-Za-z0-9._-]");
}

// "" if fine, else the reason
std::string name_problem(const std::string& name) {
  if (name.empty()) return "empty segment name";
  if (name.size() > kMaxName) return "segment name longer than " + std::to_string(kMaxName) + " characters";
  if (name == "." || name == "..") return "invalid segment name '" + name + "'";
  for (char c : name) {
    if (c == '/') return "segment name '" + name + "' contains '/'";
    if (c == '\0') return "segment name contains a NUL byte";
  }
  return {};
}

std::string normalize_name(const std::string& name) {
  std::string n = (!name.empty() && name[0] == '/') ? name.substr(1) : name;
  std::string problem = name_problem(n);
  if (!problem.empty()) throw ValueError(problem);
  return n;
}

// Reads /proc/<pid>/stat; nullopt + errno on failure.
std::optional<ProcStat> read_proc_stat(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (n <= 0) {
    errno = n < 0 ? err : EIO;
    return std::nullopt;
  }
  buf[n] = '\0';
  // comm may hold spaces and parentheses: fields restart after the last ')'
  const char* p = std::strrchr(buf, ')');
  if (!p) {
    errno = EIO;
    return std::nullopt;
  }
  ++p;
  ProcStat st;
  // tokens after ')': [0]=state (field 3) ... [19]=starttime (field 22)
  int tok = 0;
  while (*p && tok <= 19) {
    while (*p == ' ') ++p;
    if (!*p) break;
    const char* start = p;
    while (*p && *p != ' ') ++p;
    if (tok == 0) st.state = *start;
    if (tok == 19) st.starttime = std::strtoull(start, nullptr, 10);
    ++tok;
  }
  if (tok <= 19) {
    errno = EIO;
    return std::nullopt;
  }
  return st;
}

namespace {

struct Identity {
  pid_t pid;
  uint64_t starttime;
};

// The mutexes of this file's function-local state, each held across fork() (fork_safe.hpp): a child forked while
// another thread holds one would hang on its first segment. None is taken while another is held.
std::mutex& identity_mutex() { return detail::fork_safe_mutex<struct IdentityMutex>(); }
std::mutex& rng_mutex() { return detail::fork_safe_mutex<struct RngMutex>(); }

// This process' pid and start time; recomputed after fork().
Identity self_identity() {
  static Identity cached{0, 0};
  pid_t pid = ::getpid();
  std::lock_guard<std::mutex> lock(identity_mutex());
  if (cached.pid != pid) {
    auto st = read_proc_stat(pid);
    cached = Identity{pid, st ? st->starttime : 0};
  }
  return cached;
}

std::string random_hex() {
  static std::mt19937_64 rng([] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }());
  static pid_t seeded_pid = ::getpid();
  std::lock_guard<std::mutex> lock(rng_mutex());
  if (seeded_pid != ::getpid()) {  // forked child: do not repeat the parent's sequence
    seeded_pid = ::getpid();
    std::random_device rd;
    rng.seed((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(seeded_pid));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

std::string make_name(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  Identity id = self_identity();
  return prefix + std::to_string(id.pid) + "_" + std::to_string(id.starttime) + "_" +
         std::to_string(counter.fetch_add(1)) + "_" + random_hex();
}

// Parses "<pid>_<starttime>_<counter>_<hex>" (the part after the prefix).
bool parse_name_tail(const std::string& tail, pid_t* pid, uint64_t* starttime) {
  size_t pos = 0;
  auto digits = [&](uint64_t* out, size_t max_len) {
    size_t begin = pos;
    uint64_t v = 0;
    while (pos < tail.size() && tail[pos] >= '0' && tail[pos] <= '9' && pos - begin < max_len) {
      v = v * 10 + uint64_t(tail[pos] - '0');
      ++pos;
    }
    if (pos == begin || pos - begin >= max_len) return false;
    *out = v;
    return true;
  };
  auto underscore = [&] {
    if (pos < tail.size() && tail[pos] == '_') {
      ++pos;
      return true;
    }
    return false;
  };
  uint64_t p = 0, st = 0, cnt = 0;
  if (!digits(&p, 11) || !underscore() || !digits(&st, 21) || !underscore() || !digits(&cnt, 21) ||
      !underscore())
    return false;
  size_t hex_begin = pos;
  while (pos < tail.size() && std::isxdigit(static_cast<unsigned char>(tail[pos]))) ++pos;
  if (pos != tail.size() || pos == hex_begin || pos - hex_begin > 32) return false;
  if (p == 0 || p > uint64_t(INT_MAX)) return false;
  *pid = static_cast<pid_t>(p);
  *starttime = st;
  return true;
}

//! Takes the lock that every user of a segment holds for as long as it uses it: LOCK_SH by the creator from
//! before the segment has a size until it closes its descriptor (flock on the open file description, so a
//! forked child that inherits the descriptor holds it too; close-on-exec drops it at exec), LOCK_EX|LOCK_NB by
//! cleanup_stale_segments. The kernel releases a lock when the last descriptor of its holder goes, however the
//! holder dies, and a lock on a tmpfs file is seen by every process that opens the file, whatever its PID
//! namespace: unlike a pid, it proves liveness across containers sharing /dev/shm.
int flock_retry(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

}  // namespace tensordict::backends::shm_internal
