#pragma once
// RedisServer: a real redis-server for tests, started as OUR child (fork + exec, never --daemonize) on
// 127.0.0.1 and a free port, without persistence (--save '' --appendonly no; `durable`: an fsync'd append-only
// file, so that a restart keeps what was acknowledged), in its own temp dir, with its
// output in <dir>/redis.log (so no test pipe is inherited and ctest never waits on it). Optionally it loads an
// RDB file (copied into the temp dir) and requires a password. It is stopped by pid (SIGTERM, bounded wait,
// SIGKILL) in the destructor, and killed by the kernel if the test process dies first (PR_SET_PDEATHSIG; create
// it on the thread that lives longest, e.g. the test's main thread). A missing redis-server binary throws:
// tests never skip.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace testutil {

struct RedisServerOptions {
  std::string rdb_file;   //!< non-empty: copied into the temp dir and loaded at start
  std::string password;   //!< non-empty: --requirepass
  bool unix_socket = true;  //!< also listen on <dir>/redis.sock
  bool durable = false;     //!< --appendonly yes --appendfsync always: writes survive kill() + restart()
};

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {}) : options_(std::move(options)) {
    binary_ = find_binary();
    if (binary_.empty())
      throw std::runtime_error("redis-server not found in PATH (install the redis-server package); the Redis tests need it");
    std::string base = std::filesystem::temp_directory_path().string();
    std::string tmpl = base + "/td-redis-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed under " + base);
    dir_ = tmpl;
    if (!options_.rdb_file.empty()) {
      if (!std::filesystem::exists(options_.rdb_file))
        throw std::runtime_error("RDB file missing: " + options_.rdb_file);
      std::filesystem::copy_file(options_.rdb_file, dir_ + "/dump.rdb");
      std::filesystem::permissions(dir_ + "/dump.rdb", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    }
    std::string last;
    for (int attempt = 0; attempt < 10; ++attempt) {
      port_ = free_port();
      if (launch(&last)) return;
    }
    cleanup_dir();
    throw std::runtime_error("redis-server did not start: " + last);
  }
  ~RedisServer() {
    stop();
    cleanup_dir();
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string unix_socket() const { return dir_ + "/redis.sock"; }
  std::string log() const {
    std::ifstream in(dir_ + "/redis.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  //! SIGKILL (a crash: connections drop at once)
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap(5000);
  }
  //! a new server on the same port (and the same RDB file, if any; data written since is lost)
  void restart() {
    stop();
    std::string last;
    for (int attempt = 0; attempt < 20; ++attempt) {
      if (launch(&last)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("redis-server did not restart on port " + std::to_string(port_) + ": " + last);
  }
  //! SIGTERM, bounded wait, SIGKILL
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (!reap(5000)) {
      ::kill(pid_, SIGKILL);
      reap(5000);
    }
  }

 private:
  static std::string find_binary() {
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
    std::stringstream ss(p);
    std::string d;
    while (std::getline(ss, d, ':')) {
      if (d.empty()) continue;
      std::string f = d + "/redis-server";
      if (::access(f.c_str(), X_OK) == 0) return f;
    }
    return "";
  }

  static int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      throw std::runtime_error("bind(127.0.0.1:0) failed");
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  //! true when the server answers PING (+PONG, or -NOAUTH when a password is required)
  bool answers() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const char ping[] = "PING\r\n";
      if (::send(fd, ping, sizeof ping - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof ping - 1)) {
        char buf[64] = {0};
        ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
        ok = n > 0 && (std::strncmp(buf, "+PONG", 5) == 0 || std::strncmp(buf, "-NOAUTH", 7) == 0);
      }
    }
    ::close(fd);
    return ok;
  }

  bool reap(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        return true;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  bool launch(std::string* why) {
    std::vector<std::string> args = {binary_, "--bind", "127.0.0.1", "--port", std::to_string(port_), "--save", "",
                                     "--appendonly", options_.durable ? "yes" : "no", "--daemonize", "no", "--dir",
                                     dir_, "--dbfilename", "dump.rdb", "--logfile", ""};
    if (options_.durable) args.insert(args.end(), {"--appendfsync", "always"});
    if (options_.unix_socket) {
      args.insert(args.end(), {"--unixsocket", unix_socket(), "--unixsocketperm", "700"});
    }
    if (!options_.password.empty()) args.insert(args.end(), {"--requirepass", options_.password});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string logpath = dir_ + "/redis.log";
    int logfd = ::open(logpath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) throw std::runtime_error("cannot open " + logpath);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(logfd);
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      // the server dies with the test process even when that one is killed (ctest timeout, crash)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
      ::dup2(logfd, 1);
      ::dup2(logfd, 2);
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(logfd);
    pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {  // exited: port taken, bad RDB, ...
        pid_ = -1;
        *why = "exited early (status " + std::to_string(status) + "); log:\n" + log();
        return false;
      }
      if (answers()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    *why = "no PONG within 10 s; log:\n" + log();
    stop();
    return false;
  }

  void cleanup_dir() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  RedisServerOptions options_;
  std::string binary_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace testutil
