#pragma once
// Forked child processes for multi-process tests: fork, run fn in the child, _exit with its return value.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace testutil {

//! fork(); the child runs fn and _exits with its return value (98 if it threw)
inline pid_t spawn(const std::function<int()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
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

//! fork + exec `exe` with `args` (the child _exits 97 when exec fails)
inline pid_t spawn_exec(const std::string& exe, const std::vector<std::string>& args) {
  return spawn([&] {
    std::vector<std::string> all = {exe};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    return 97;
  });
}

//! exit code of the child, or -signal
inline int wait_child(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  BOOST_REQUIRE(r == pid);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
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
