// The names of the segments this process created and has not released: a registry read by the signal
// handlers and the atexit hook that unlink them when the process dies (a fatal signal, exit), and
// owned_segments().
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "shm_internal.hpp"
#include "tensordict/backends/fork_safe.hpp"

namespace tensordict::backends {
namespace shm_internal {

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

namespace {

std::atomic<OwnedNode*> g_owned_head{nullptr};
//! serialises acquire/release among threads (never taken in handlers); held across fork() (fork_safe.hpp)
std::mutex& owned_mutex() { return detail::fork_safe_mutex<struct OwnedMutex>(); }

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace shm_internal

using namespace shm_internal;

std::vector<std::string> owned_segments() {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(owned_mutex());
  pid_t self = ::getpid();
  size_t dir_len = std::strlen(kShmDir);
  for (OwnedNode* n = g_owned_head.load(); n; n = n->next.load())
    if (n->state.load() == kLive && n->pid.load() == self) out.emplace_back(n->path + dir_len);
  return out;
}

}  // namespace tensordict::backends
