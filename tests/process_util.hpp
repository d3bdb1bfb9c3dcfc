#pragma once
// Forked child processes for multi-process tests: fork, run fn in the child, _exit with its return value; wait
// for a child with a timeout and say how it ended.
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace testutil {

//! the signals Boost.Test catches in the test process (execution_monitor): a forked child that inherited its
//! handlers would turn a SIGBUS into a jump back into the test runner and go on running the suite's other tests
//! in the child, while the parent waits for it
inline void default_fatal_signals() {
  for (int sig : {SIGILL, SIGFPE, SIGSEGV, SIGBUS, SIGPOLL, SIGABRT, SIGALRM, SIGSYS, SIGTRAP}) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
  }
}

//! fork(); the child runs fn and _exits with its return value (98 if it threw). The child dies of a fatal
//! signal as a plain program does (default_fatal_signals), so wait_child reports it at once.
inline pid_t spawn(const std::function<int()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    default_fatal_signals();
    int rc = 99;
    try {
      rc = fn();
    } catch (...) {
      rc = 98;
    }
    ::_exit(rc);
  }
  return pid;
}

//! pids of `parent`'s children (default: this process's), from /proc; `zombies`: a child not reaped yet counts
inline std::vector<pid_t> children(pid_t parent = ::getpid(), bool zombies = true) {
  std::vector<pid_t> out;
  const pid_t self = parent;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in("/proc/" + name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self && (zombies || state != 'Z')) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  ::closedir(d);
  return out;
}

//! the command lines (NULs as spaces) of this process's children
inline std::vector<std::string> children_cmdlines() {
  std::vector<std::string> out;
  for (pid_t pid : children()) {
    std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
    std::string text((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    for (auto& c : text) c = c == '\0' ? ' ' : c;
    out.push_back(text);
  }
  return out;
}

//! the whole text of a file a child wrote; "" when it is missing (the caller's assertions say what was expected)
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

//! in a child: exec `exe` with `args`; returns 97 only when exec fails
inline int exec_program(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  return 97;
}

//! fork + exec `exe` with `args` (the child _exits 97 when exec fails)
inline pid_t spawn_exec(const std::string& exe, const std::vector<std::string>& args) {
  return spawn([&] { return exec_program(exe, args); });
}

//! in a child: enters a mount namespace of its own (as root: unshare(CLONE_NEWNS); otherwise inside a new user
//! namespace) and mounts a `kib` KiB tmpfs at `dir`; 0, or the setup failure 90-93 for the child to return
inline int enter_small_fs(const std::string& dir, int kib) {
  if (::geteuid() != 0) {
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return 90;
    std::ofstream("/proc/self/setgroups") << "deny";
    std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
    std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
  } else if (::unshare(CLONE_NEWNS) != 0) {
    return 91;
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 92;
  const std::string opts = "size=" + std::to_string(kib) + "k";
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) return 93;
  return 0;
}

//! runs fn in a forked child where a `kib` KiB tmpfs is mounted at `dir` (enter_small_fs); exit codes 90-93 are
//! setup failures
inline pid_t spawn_on_small_fs(const std::string& dir, int kib, const std::function<int()>& fn) {
  return spawn([&]() -> int {
    if (int rc = enter_small_fs(dir, kib)) return rc;
    return fn();
  });
}

//! what wait_child returns for a child that outlived its timeout (then SIGKILLed and reaped)
constexpr int kTimedOut = -1001;

//! exit code of the child, or -signal, or kTimedOut: a child still running after `timeout` is SIGKILLed and
//! reaped, so that a stuck child fails its test at once instead of the whole suite at the per-test limit
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(180)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    BOOST_REQUIRE(!(r < 0 && errno != EINTR));
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return kTimedOut;
    }
    ::usleep(2000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

//! wait_child's result in words: "exited with 3", "killed by signal 7 (Bus error)", "still running after its
//! timeout (SIGKILLed)"
inline std::string describe_child(int rc) {
  if (rc >= 0) return "exited with " + std::to_string(rc);
  if (rc == kTimedOut) return "still running after its timeout (SIGKILLed)";
  if (rc > -1000) {
    const char* name = ::strsignal(-rc);
    return "killed by signal " + std::to_string(-rc) + (name ? std::string(" (") + name + ")" : std::string());
  }
  return "ended with wait status " + std::to_string(rc);
}

//! children forked while other threads of this process run on: how many hung (still running after 10 s:
//! killed and reaped) and how many exited with another code than 0 or died of a signal
struct ForkOutcome {
  int hung = 0;
  int failed = 0;
};
//! forks `n` children one after the other, each running `child` (its return value is its exit code)
inline ForkOutcome fork_children(int n, const std::function<int()>& child) {
  ForkOutcome out;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = spawn(child);
    int status = 0;
    pid_t got = 0;
    for (int waited_ms = 0; waited_ms < 10000; waited_ms += 5) {
      got = ::waitpid(pid, &status, WNOHANG);
      if (got != 0 && !(got < 0 && errno == EINTR)) break;
      ::usleep(5000);
    }
    if (got == 0) {
      ++out.hung;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    } else if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++out.failed;
    }
  }
  return out;
}

}  // namespace testutil
