// Shared-memory segments and handles: see shm.hpp for the API and the lifetime scheme.
#include "tensordict/backends/shm.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <ATen/core/grad_mode.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "tensordict/backends/fork_safe.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {
namespace {

constexpr const char* kShmDir = "/dev/shm/";  // glibc's shm_open directory on Linux
constexpr size_t kMaxPrefix = 180;
constexpr size_t kMaxName = 250;  // NAME_MAX is 255
constexpr uint32_t kMaxDims = 64;

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// ---------------------------------------------------------------------------------------------------
// names and process identity

bool valid_prefix_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

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

struct ProcStat {
  char state = '?';
  uint64_t starttime = 0;
};

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

// ---------------------------------------------------------------------------------------------------
// Registry of the names this process owns. Read from signal handlers, so: a lock-free singly linked list
// of nodes that are never freed (reused instead); a node is FREE, BUSY (being written) or LIVE, and a
// generation counter lets the handler detect a node rewritten while it copied the path.

enum : int { kFree = 0, kBusy = 1, kLive = 2 };

struct OwnedNode {
  std::atomic<int> state{kFree};
  std::atomic<uint64_t> generation{0};
  std::atomic<pid_t> pid{0};
  char path[300] = {};  // "/dev/shm/<name>"
  std::atomic<OwnedNode*> next{nullptr};
};

std::atomic<OwnedNode*> g_owned_head{nullptr};
//! serialises acquire/release among threads (never taken in handlers); held across fork() (fork_safe.hpp)
std::mutex& owned_mutex() { return detail::fork_safe_mutex<struct OwnedMutex>(); }

OwnedNode* owned_acquire(const std::string& name) {
  std::lock_guard<std::mutex> lock(owned_mutex());
  OwnedNode* node = nullptr;
  for (OwnedNode* n = g_owned_head.load(); n; n = n->next.load()) {
    int expected = kFree;
    if (n->state.compare_exchange_strong(expected, kBusy)) {
      node = n;
      break;
    }
  }
  if (!node) {
    node = new OwnedNode;  // never freed: signal handlers may walk the list at any time
    node->state.store(kBusy);
    node->next.store(g_owned_head.load());
    g_owned_head.store(node);
  }
  node->generation.fetch_add(1);
  std::string path = kShmDir + name;
  std::snprintf(node->path, sizeof node->path, "%s", path.c_str());
  node->pid.store(::getpid());
  node->state.store(kLive);
  return node;
}

void owned_release(OwnedNode* node) {
  if (!node) return;
  std::lock_guard<std::mutex> lock(owned_mutex());
  node->generation.fetch_add(1);
  node->state.store(kFree);
}

// async-signal-safe: atomics, getpid, unlink
void unlink_owned_names() {
  pid_t self = ::getpid();
  for (OwnedNode* n = g_owned_head.load(); n; n = n->next.load()) {
    uint64_t gen = n->generation.load();
    if (n->state.load() != kLive || n->pid.load() != self) continue;
    char path[sizeof n->path];
    std::memcpy(path, n->path, sizeof path);
    path[sizeof path - 1] = '\0';
    if (n->state.load() != kLive || n->generation.load() != gen) continue;
    ::unlink(path);
  }
}

void on_exit_unlink() { unlink_owned_names(); }

// ---------------------------------------------------------------------------------------------------
// signal handlers

constexpr int kTerminalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kAsyncSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
struct sigaction g_old_actions[NSIG];

bool is_terminal(int sig) {
  for (int s : kTerminalSignals)
    if (s == sig) return true;
  return false;
}

void on_signal(int sig, siginfo_t* info, void* ctx) {
  int saved_errno = errno;
  const struct sigaction old = g_old_actions[sig];
  bool old_default = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL;
  if (old_default || is_terminal(sig)) unlink_owned_names();
  if (old_default) {
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);  // blocked while we run: delivered with the default action when we return
  } else if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) old.sa_sigaction(sig, info, ctx);
  } else if (old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  }
  errno = saved_errno;
}

std::mutex& handlers_mutex() { return detail::fork_safe_mutex<struct HandlersMutex>(); }

// (Re)installs our handler where it is not installed (someone may have replaced it since), keeping the
// current action for chaining. Ignored signals stay ignored.
void ensure_handlers() {
  static std::once_flag atexit_once;
  std::call_once(atexit_once, [] { std::atexit(on_exit_unlink); });
  std::lock_guard<std::mutex> lock(handlers_mutex());
  auto install = [](int sig) {
    struct sigaction cur;
    if (::sigaction(sig, nullptr, &cur) != 0) return;
    if (cur.sa_flags & SA_SIGINFO) {
      if (cur.sa_sigaction == on_signal) return;
    } else if (cur.sa_handler == SIG_IGN) {
      return;
    }
    g_old_actions[sig] = cur;
    struct sigaction ours;
    std::memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_signal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    ::sigaction(sig, &ours, nullptr);
  };
  for (int s : kTerminalSignals) install(s);
  for (int s : kAsyncSignals) install(s);
}

// ---------------------------------------------------------------------------------------------------
// live mappings of this process (for segment_of / handle_of)

//! held across fork() (fork_safe.hpp)
std::mutex& live_mutex() { return detail::fork_safe_mutex<struct LiveMutex>(); }
std::map<uintptr_t, ShmSegment*>& live_map() {
  static auto* m = new std::map<uintptr_t, ShmSegment*>;
  return *m;
}

std::mutex& cleanup_mutex() { return detail::fork_safe_mutex<struct CleanupMutex>(); }
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

//! Gives the new segment its size with every page allocated (fallocate on tmpfs): a full /dev/shm is an error
//! here, not a SIGBUS at the first store into a page tmpfs cannot supply later. In pieces, each retried on
//! EINTR (tmpfs gives up a whole call when a signal arrives), so a process with a busy timer still gets
//! through. Filesystems without fallocate: ftruncate (sparse, as before). Returns 0 or an errno.
int reserve_pages(int fd, uint64_t nbytes) {
  constexpr uint64_t kPiece = uint64_t(256) << 20;
  for (uint64_t off = 0; off < nbytes;) {
    const uint64_t len = std::min(kPiece, nbytes - off);
    int rc;
    do {
      rc = ::fallocate(fd, 0, off_t(off), off_t(len));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if ((errno == EOPNOTSUPP || errno == ENOSYS) && off == 0) break;
      return errno;
    }
    off += len;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno;
  if (uint64_t(st.st_size) == nbytes) return 0;
  int rc;
  do {
    rc = ::ftruncate(fd, off_t(nbytes));
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

// ---------------------------------------------------------------------------------------------------
// dtype and extent checks

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kBool, "bool"},         {at::kByte, "uint8"},        {at::kChar, "int8"},
    {at::kShort, "int16"},       {at::kInt, "int32"},         {at::kLong, "int64"},
    {at::kHalf, "float16"},      {at::kBFloat16, "bfloat16"}, {at::kFloat, "float32"},
    {at::kDouble, "float64"},    {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
};

const char* find_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return nullptr;
}

// "" if fine; otherwise the reason. On success *nbytes = numel * itemsize.
std::string extent_problem(uint64_t offset, at::ScalarType dtype, at::IntArrayRef shape, uint64_t* nbytes) {
  if (!find_dtype_name(dtype)) return std::string("unsupported dtype ") + c10::toString(dtype);
  if (shape.size() > kMaxDims) return "more than " + std::to_string(kMaxDims) + " dims";
  uint64_t itemsize = c10::elementSize(dtype);
  uint64_t numel = 1;
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) return "negative dim " + std::to_string(d);
    if (d == 0) zero = true;
  }
  if (zero) {
    numel = 0;
  } else {
    for (int64_t d : shape)
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel)) return "byte size overflows";
  }
  uint64_t bytes = 0, end = 0;
  if (__builtin_mul_overflow(numel, itemsize, &bytes) || __builtin_add_overflow(offset, bytes, &end) ||
      end > uint64_t(INT64_MAX))
    return "byte size overflows";
  if (offset % itemsize != 0)
    return "offset " + std::to_string(offset) + " is not a multiple of the element size " +
           std::to_string(itemsize);
  *nbytes = bytes;
  return {};
}

std::string key_text(const std::vector<std::string>& key) {
  std::string s = "(";
  for (size_t i = 0; i < key.size(); ++i) s += (i ? ", '" : "'") + key[i] + "'";
  return s + ")";
}

// "" if fine
std::string key_problem(const std::vector<std::string>& key) {
  if (key.empty()) return "empty key path";
  for (const auto& k : key)
    if (k.empty()) return "empty key part in " + key_text(key);
  return {};
}

bool starts_with_batch(const std::vector<int64_t>& shape, const std::vector<int64_t>& batch) {
  if (shape.size() < batch.size()) return false;
  for (size_t i = 0; i < batch.size(); ++i)
    if (shape[i] != batch[i]) return false;
  return true;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// ---------------------------------------------------------------------------------------------------
// binary (de)serialization

constexpr char kMagic[4] = {'T', 'D', 'S', 'H'};
constexpr uint8_t kVersion = 1;
constexpr uint8_t kKindTensor = 1;
constexpr uint8_t kKindTensorDict = 2;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(char(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) { u64(uint64_t(v)); }
  void count(size_t n) {
    if (n > UINT32_MAX) throw ValueError("shm handle: too many items to serialize");
    u32(uint32_t(n));
  }
  void str(const std::string& s) {
    count(s.size());
    out_ += s;
  }
  void header(uint8_t kind) {
    out_.append(kMagic, 4);
    u8(kVersion);
    u8(kind);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError("malformed shm handle at byte " + std::to_string(pos_) + ": " + why);
  }
  size_t remaining() const { return in_.size() - pos_; }
  void need(size_t n) const {
    if (remaining() < n) fail("truncated (need " + std::to_string(n) + " more bytes)");
  }
  uint8_t u8() {
    need(1);
    return uint8_t(in_[pos_++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(in_[pos_++])) << (8 * i);
    return v;
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(in_[pos_++])) << (8 * i);
    return v;
  }
  int64_t i64() { return int64_t(u64()); }
  // a count of items each at least min_item_bytes long
  uint32_t count(size_t min_item_bytes) {
    uint32_t n = u32();
    if (min_item_bytes && uint64_t(n) * min_item_bytes > remaining())
      fail("truncated or corrupt: count " + std::to_string(n) + " needs at least " +
           std::to_string(uint64_t(n) * min_item_bytes) + " bytes, " + std::to_string(remaining()) + " remain");
    return n;
  }
  std::string str() {
    uint32_t n = count(1);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void header(uint8_t kind) {
    need(6);
    if (std::memcmp(in_.data(), kMagic, 4) != 0) fail("bad magic (expected \"TDSH\")");
    pos_ = 4;
    uint8_t v = u8();
    if (v != kVersion) fail("unsupported version " + std::to_string(v));
    uint8_t k = u8();
    if (k != kind)
      fail("wrong handle kind " + std::to_string(k) + " (expected " + std::to_string(kind) + ")");
  }
  void end() const {
    if (remaining() != 0) fail(std::to_string(remaining()) + " trailing bytes");
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

void write_tensor_body(Writer& w, const ShmTensorHandle& h) {
  w.u64(h.offset);
  w.str(dtype_name(h.dtype));
  w.count(h.shape.size());
  for (int64_t d : h.shape) w.i64(d);
}

void read_tensor_body(Reader& r, ShmTensorHandle& h) {
  h.offset = r.u64();
  std::string dt = r.str();
  bool found = false;
  for (const auto& d : kDtypes)
    if (dt == d.name) {
      h.dtype = d.type;
      found = true;
    }
  if (!found) r.fail("unknown dtype '" + dt + "'");
  uint32_t ndim = r.count(8);
  if (ndim > kMaxDims) r.fail("more than " + std::to_string(kMaxDims) + " dims");
  h.shape.resize(ndim);
  for (auto& d : h.shape) d = r.i64();
  uint64_t nbytes = 0;
  std::string problem = extent_problem(h.offset, h.dtype, h.shape, &nbytes);
  if (!problem.empty()) r.fail(problem);
}

void check_segment_name(Reader& r, const std::string& name) {
  std::string problem = name_problem(name);
  if (!problem.empty()) r.fail(problem);
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

// =====================================================================================================
// handles

uint64_t ShmTensorHandle::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d < 0 ? 0 : d);
  return n;
}

uint64_t ShmTensorHandle::nbytes() const { return numel() * c10::elementSize(dtype); }

bool ShmTensorHandle::operator==(const ShmTensorHandle& o) const {
  return segment == o.segment && offset == o.offset && dtype == o.dtype && shape == o.shape;
}

std::vector<std::string> ShmTensorDictHandle::segments() const {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& e : entries)
    if (seen.insert(e.tensor.segment).second) out.push_back(e.tensor.segment);
  return out;
}

std::string serialize(const ShmTensorHandle& h) {
  Writer w;
  w.header(kKindTensor);
  w.str(h.segment);
  write_tensor_body(w, h);
  return w.take();
}

std::string serialize(const ShmTensorDictHandle& h) {
  Writer w;
  w.header(kKindTensorDict);
  w.count(h.batch_size.size());
  for (int64_t d : h.batch_size) w.i64(d);
  std::vector<std::string> segs = h.segments();
  std::map<std::string, uint32_t> index;
  for (size_t i = 0; i < segs.size(); ++i) index[segs[i]] = uint32_t(i);
  w.count(segs.size());
  for (const auto& s : segs) w.str(s);
  w.count(h.entries.size());
  for (const auto& e : h.entries) {
    w.count(e.key.size());
    for (const auto& k : e.key) w.str(k);
    w.u32(index.at(e.tensor.segment));
    write_tensor_body(w, e.tensor);
  }
  return w.take();
}

ShmTensorHandle parse_tensor_handle(const std::string& bytes) {
  Reader r(bytes);
  r.header(kKindTensor);
  ShmTensorHandle h;
  h.segment = r.str();
  check_segment_name(r, h.segment);
  read_tensor_body(r, h);
  r.end();
  return h;
}

ShmTensorDictHandle parse_tensordict_handle(const std::string& bytes) {
  Reader r(bytes);
  r.header(kKindTensorDict);
  ShmTensorDictHandle h;
  uint32_t nbatch = r.count(8);
  if (nbatch > kMaxDims) r.fail("batch_size has more than " + std::to_string(kMaxDims) + " dims");
  h.batch_size.resize(nbatch);
  for (auto& d : h.batch_size) {
    d = r.i64();
    if (d < 0) r.fail("negative batch dim " + std::to_string(d));
  }
  uint32_t nseg = r.count(5);
  std::vector<std::string> segs(nseg);
  for (auto& s : segs) {
    s = r.str();
    check_segment_name(r, s);
  }
  // min entry: nparts(4) + one part (4+1) + segidx(4) + offset(8) + dtype (4+4) + ndim(4)
  uint32_t nentries = r.count(33);
  std::set<std::vector<std::string>> keys;
  for (uint32_t i = 0; i < nentries; ++i) {
    ShmTensorDictHandle::Entry e;
    uint32_t nparts = r.count(5);
    e.key.resize(nparts);
    for (auto& k : e.key) k = r.str();
    std::string problem = key_problem(e.key);
    if (!problem.empty()) r.fail(problem);
    if (!keys.insert(e.key).second) r.fail("duplicate key " + key_text(e.key));
    uint32_t si = r.u32();
    if (si >= nseg) r.fail("segment index " + std::to_string(si) + " out of range");
    e.tensor.segment = segs[si];
    read_tensor_body(r, e.tensor);
    if (!starts_with_batch(e.tensor.shape, h.batch_size))
      r.fail("shape " + shape_text(e.tensor.shape) + " of " + key_text(e.key) + " does not start with batch_size " +
             shape_text(h.batch_size));
    h.entries.push_back(std::move(e));
  }
  r.end();
  return h;
}

at::Tensor open_tensor(const ShmTensorHandle& h) {
  return ShmSegment::open(h.segment)->tensor_at(h.offset, h.dtype, h.shape);
}

std::vector<at::Tensor> open_tensordict(const ShmTensorDictHandle& h) {
  std::map<std::string, std::shared_ptr<ShmSegment>> opened;
  std::vector<at::Tensor> out;
  out.reserve(h.entries.size());
  for (const auto& e : h.entries) {
    auto& seg = opened[e.tensor.segment];
    if (!seg) seg = ShmSegment::open(e.tensor.segment);
    out.push_back(seg->tensor_at(e.tensor.offset, e.tensor.dtype, e.tensor.shape));
  }
  return out;
}

// =====================================================================================================
// layout and allocation

ShmLayout ShmLayout::plan(const std::vector<ShmLayoutEntry>& entries) {
  ShmLayout layout;
  std::set<std::vector<std::string>> keys;
  uint64_t cursor = 0;
  constexpr uint64_t A = ShmSegment::kAlignment;
  for (const auto& e : entries) {
    std::string problem = key_problem(e.key);
    if (!problem.empty()) throw ValueError("shm layout: " + problem);
    if (!keys.insert(e.key).second) throw ValueError("shm layout: duplicate key " + key_text(e.key));
    uint64_t nbytes = 0;
    problem = extent_problem(cursor, e.dtype, e.shape, &nbytes);
    if (!problem.empty()) throw ValueError("shm layout: " + key_text(e.key) + ": " + problem);
    layout.offsets.push_back(cursor);
    uint64_t end = cursor + nbytes;  // checked by extent_problem
    if (end > uint64_t(INT64_MAX) - A) throw ValueError("shm layout: total size overflows");
    cursor = (end + A - 1) / A * A;
  }
  layout.total_bytes = cursor == 0 ? A : cursor;
  return layout;
}

ShmAllocation allocate(const std::vector<ShmLayoutEntry>& entries, const std::vector<int64_t>& batch_size,
                       const std::string& prefix) {
  for (int64_t d : batch_size)
    if (d < 0) throw ValueError("shm allocate: negative batch dim " + std::to_string(d));
  for (const auto& e : entries)
    if (!starts_with_batch(e.shape, batch_size))
      throw ValueError("shm allocate: shape " + shape_text(e.shape) + " of " + key_text(e.key) +
                       " does not start with batch_size " + shape_text(batch_size));
  ShmLayout layout = ShmLayout::plan(entries);
  ShmAllocation out;
  out.segment = ShmSegment::create(layout.total_bytes, prefix);
  out.handle.batch_size = batch_size;
  out.handle.entries.reserve(entries.size());
  out.tensors.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    ShmTensorHandle th{out.segment->name(), layout.offsets[i], e.dtype, e.shape};
    out.tensors.push_back(out.segment->tensor_at(th.offset, th.dtype, th.shape));
    out.handle.entries.push_back({e.key, std::move(th)});
  }
  return out;
}

ShmAllocation share_tensors(const std::vector<std::vector<std::string>>& keys,
                            const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& batch_size,
                            const std::string& prefix) {
  if (keys.size() != tensors.size())
    throw ValueError("share_tensors: " + std::to_string(keys.size()) + " keys for " +
                     std::to_string(tensors.size()) + " tensors");
  std::vector<ShmLayoutEntry> entries;
  entries.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) throw TypeError("share_tensors: undefined tensor for " + key_text(keys[i]));
    if (t.layout() != at::kStrided || t.is_quantized() || t.is_nested())
      throw TypeError("share_tensors: only dense strided tensors can be shared, " + key_text(keys[i]) + " is not");
    if (!t.device().is_cpu())
      throw ValueError("share_tensors: " + key_text(keys[i]) + " is on " + t.device().str() + ", not cpu");
    if (!find_dtype_name(t.scalar_type()))
      throw TypeError(std::string("share_tensors: unsupported dtype ") + c10::toString(t.scalar_type()) +
                      " for " + key_text(keys[i]));
    entries.push_back({keys[i], t.scalar_type(), t.sizes().vec()});
  }
  ShmAllocation out = allocate(entries, batch_size, prefix);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) out.tensors[i].copy_(tensors[i]);
  return out;
}

std::shared_ptr<ShmSegment> segment_of(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided) return nullptr;
  auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (!addr) return nullptr;
  std::lock_guard<std::mutex> lock(live_mutex());
  auto& m = live_map();
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return nullptr;
  --it;
  ShmSegment* seg = it->second;
  if (addr >= it->first + seg->size() && !(addr == it->first + seg->size() && t.numel() == 0)) return nullptr;
  return seg->weak_from_this().lock();  // null if it is being destroyed
}

std::optional<ShmTensorHandle> handle_of(const at::Tensor& t) {
  auto seg = segment_of(t);
  if (!seg || !t.is_contiguous()) return std::nullopt;
  uint64_t offset = reinterpret_cast<uintptr_t>(t.data_ptr()) - reinterpret_cast<uintptr_t>(seg->data());
  ShmTensorHandle h{seg->name(), offset, t.scalar_type(), t.sizes().vec()};
  uint64_t nbytes = 0;
  if (!extent_problem(offset, h.dtype, h.shape, &nbytes).empty() || nbytes > seg->size() - offset)
    return std::nullopt;
  return h;
}

// =====================================================================================================
// stale cleanup, diagnostics, dtypes

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

std::vector<std::string> owned_segments() {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(owned_mutex());
  pid_t self = ::getpid();
  size_t dir_len = std::strlen(kShmDir);
  for (OwnedNode* n = g_owned_head.load(); n; n = n->next.load())
    if (n->state.load() == kLive && n->pid.load() == self) out.emplace_back(n->path + dir_len);
  return out;
}

size_t live_segments() {
  std::lock_guard<std::mutex> lock(live_mutex());
  return live_map().size();
}

std::string dtype_name(at::ScalarType dtype) {
  if (const char* n = find_dtype_name(dtype)) return n;
  throw ValueError(std::string("unsupported dtype for shared memory: ") + c10::toString(dtype));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw ValueError("unknown dtype name '" + name + "'");
}

}  // namespace tensordict::backends
