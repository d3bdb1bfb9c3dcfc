// replay_fill: a replay buffer on a Redis server, filled by producer PROCESSES while a consumer samples it.
// The owner starts a redis-server on a free loopback port (unless --port is given), creates a zero-filled
// buffer with TensorDictStore::from_schema (obs [16] f32, action i64, reward f32, done bool), then spawns
// N producers (this program again, exec'd fresh: --producer i --td-id ID --port P --producers N). Each
// reconnects with TensorDictStore::from_store and writes its share of the rows one by one (row r gets values
// derived from r). Meanwhile the owner samples random batches of 256 rows and checks that every sampled row
// is either still all zero or complete. At the end it reads the whole buffer and verifies every row, deletes
// the store's keys and stops its redis-server by pid.
// Usage: replay_fill [--rows N] [--producers K] [--port P] [--batch B]; exits 0 only when every row verifies.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <tensordict/tensordict.hpp>

extern char** environ;

using namespace tensordict;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kObs = 16;

Schema replay_schema() {
  return {{"obs", {BatchSize{kObs}, at::kFloat}},
          {"action", {BatchSize{}, at::kLong}},
          {"reward", {BatchSize{}, at::kFloat}},
          {"done", {BatchSize{}, at::kBool}}};
}

//! the values of rows `r` (a 1-d long tensor): obs = r + [0..15]/16, action = r, reward = r/2, done = r odd
TensorDict rows_of(const at::Tensor& r) {
  at::Tensor f = r.to(at::kFloat);
  return TensorDict(Dict{{"obs", f.unsqueeze(1) + at::arange(kObs, at::kFloat).unsqueeze(0) / kObs},
                         {"action", r.to(at::kLong)},
                         {"reward", f / 2},
                         {"done", (r % 2) == 1}},
                    {r.size(0)});
}

RedisOptions options(int port) { return RedisOptions().host("127.0.0.1").port(port); }

// ------------------------------------------------------------------------------------------ producer
int producer(int port, const std::string& td_id, int64_t k, int64_t producers) {
  TensorDictStore buf = TensorDictStore::from_store(td_id, options(port));
  const int64_t rows = buf.batch_size().at(0);
  for (int64_t r = k; r < rows; r += producers) {
    TensorDict row(BatchSize{});
    row.set("obs", at::arange(kObs, at::kFloat) / kObs + static_cast<float>(r));
    row.set("action", at::scalar_tensor(r, at::kLong));
    row.set("reward", at::scalar_tensor(static_cast<double>(r) / 2, at::kFloat));
    row.set("done", at::scalar_tensor(r % 2 == 1, at::kBool));
    buf.index_put_({r}, row);  // one pipeline for the four leaves
  }
  return 0;
}

// ------------------------------------------------------------------------------------------ redis-server
std::string find_redis_server() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string d;
  while (std::getline(ss, d, ':'))
    if (!d.empty() && ::access((d + "/redis-server").c_str(), X_OK) == 0) return d + "/redis-server";
  return "";
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool answers_ping(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
    char buf[16] = {0};
    ok = ::recv(fd, buf, sizeof buf - 1, 0) > 0 && std::strncmp(buf, "+PONG", 5) == 0;
  }
  ::close(fd);
  return ok;
}

//! a redis-server child on 127.0.0.1, without persistence, its log in a temp dir; stopped by pid
struct RedisChild {
  pid_t pid = -1;
  int port = -1;
  std::string dir;

  bool start(std::string* why) {
    const std::string bin = find_redis_server();
    if (bin.empty()) {
      *why = "redis-server not found in PATH";
      return false;
    }
    std::string tmpl = (std::filesystem::temp_directory_path() / "td-replay-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      *why = "mkdtemp failed";
      return false;
    }
    dir = tmpl;
    for (int attempt = 0; attempt < 10; ++attempt) {
      port = free_port();
      if (port <= 0) continue;
      std::vector<std::string> args = {bin,          "--bind",   "127.0.0.1", "--port",      std::to_string(port),
                                       "--save",     "",         "--appendonly", "no",       "--daemonize",
                                       "no",         "--dir",    dir,         "--logfile",   ""};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
      const std::string log = dir + "/redis.log";
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
      int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&fa);
      if (rc != 0) {
        *why = "posix_spawn redis-server failed";
        return false;
      }
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (Clock::now() < deadline) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) {  // exited: the port was taken meanwhile
          pid = -1;
          break;
        }
        if (answers_ping(port)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      stop();
    }
    *why = "redis-server did not answer PING (log in " + dir + ")";
    return false;
  }

  void stop() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }

  ~RedisChild() {
    stop();
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
};

pid_t spawn_producer(int64_t k, int64_t producers, const std::string& td_id, int port) {
  std::vector<std::string> args = {"/proc/self/exe", "--producer", std::to_string(k),   "--producers",
                                   std::to_string(producers), "--td-id", td_id, "--port", std::to_string(port)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

//! per sampled row: complete (every leaf as written) or untouched (every leaf zero); counts the complete ones
bool check_sample(const TensorDict& got, const TensorDict& want, int64_t* complete) {
  const at::Tensor obs = got.get("obs"), action = got.get("action"), reward = got.get("reward"),
                   done = got.get("done");
  at::Tensor full = obs.eq(want.get("obs")).all(1) & action.eq(want.get("action")) &
                    reward.eq(want.get("reward")) & done.eq(want.get("done"));
  at::Tensor zero = obs.eq(0).all(1) & action.eq(0) & reward.eq(0) & done.logical_not();
  *complete += full.sum().item<int64_t>();
  return (full | zero).all().item<bool>();
}

int usage() {
  std::fprintf(stderr, "usage: replay_fill [--rows N] [--producers K] [--port P] [--batch B]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 100000, producers = 4, batch = 256, producer_id = -1;
  int port = 0;
  std::string td_id;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--rows" && has) rows = std::stoll(argv[++i]);
    else if (a == "--producers" && has) producers = std::stoll(argv[++i]);
    else if (a == "--port" && has) port = std::stoi(argv[++i]);
    else if (a == "--batch" && has) batch = std::stoll(argv[++i]);
    else if (a == "--producer" && has) producer_id = std::stoll(argv[++i]);
    else if (a == "--td-id" && has) td_id = argv[++i];
    else return usage();
  }
  if (producer_id >= 0) {
    try {
      return producer(port, td_id, producer_id, producers);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replay_fill: producer %lld: %s\n", static_cast<long long>(producer_id), e.what());
      return 3;
    }
  }
  if (rows <= 0 || producers <= 0 || producers > 64 || batch <= 0) return usage();

  // the server first: nothing of the engine runs yet
  RedisChild server;
  if (port <= 0) {
    std::string why;
    if (!server.start(&why)) {
      std::fprintf(stderr, "replay_fill: %s\n", why.c_str());
      return 1;
    }
    port = server.port;
  }
  bool ok = true;
  try {
    TensorDictStore buf = TensorDictStore::from_schema(replay_schema(), {rows}, options(port));
    std::printf("replay_fill: %lld rows on 127.0.0.1:%d, td_id %s\n", static_cast<long long>(rows), port,
                buf.td_id().c_str());
    const TensorDict expected = rows_of(at::arange(rows, at::kLong));
    auto t0 = Clock::now();
    std::vector<pid_t> pids;
    for (int64_t k = 0; k < producers; ++k) {
      pid_t pid = spawn_producer(k, producers, buf.td_id(), port);
      if (pid < 0) {
        std::fprintf(stderr, "replay_fill: cannot spawn producer %lld\n", static_cast<long long>(k));
        ok = false;
        break;
      }
      pids.push_back(pid);
    }
    // the consumer: random batches while the producers write
    int64_t samples = 0, complete = 0, running = static_cast<int64_t>(pids.size());
    std::vector<bool> done(pids.size(), false);
    while (running > 0) {
      at::Tensor idx = at::randint(0, rows, {batch}, at::kLong);
      TensorDict got = buf.index({idx}).to_tensordict();
      ++samples;
      if (!check_sample(got, expected.index({idx}), &complete)) {
        std::fprintf(stderr, "replay_fill: a sampled row is neither untouched nor complete\n");
        ok = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a learner's pace, not a busy loop
      for (size_t k = 0; k < pids.size(); ++k) {
        if (done[k]) continue;
        int status = 0;
        if (::waitpid(pids[k], &status, WNOHANG) == pids[k]) {
          done[k] = true;
          --running;
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::fprintf(stderr, "replay_fill: producer %zu failed (status %d)\n", k, status);
            ok = false;
          }
        }
      }
    }
    const double fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    auto st = buf.store_stats();
    std::printf("replay_fill: %lld producer processes filled %lld rows in %.2f s (%.0f rows/s, process start "
                "included); the consumer sampled %lld batches of %lld (%lld rows seen complete); owner store: "
                "%lld calls in %lld pipelines\n",
                static_cast<long long>(producers), static_cast<long long>(rows), fill_s, rows / fill_s,
                static_cast<long long>(samples), static_cast<long long>(batch), static_cast<long long>(complete),
                static_cast<long long>(st.calls), static_cast<long long>(st.batches));
    // verify every row
    TensorDict back = buf.to_tensordict();
    for (const char* key : {"obs", "action", "reward", "done"}) {
      at::Tensor g = back.get(key), w = expected.get(key);
      if (!g.equal(w)) {
        at::Tensor bad = g.ne(w);
        if (bad.dim() > 1) bad = bad.any(1);
        std::fprintf(stderr, "replay_fill: %lld rows of %s are wrong (first: %lld)\n",
                     static_cast<long long>(bad.sum().item<int64_t>()), key,
                     static_cast<long long>(bad.nonzero().index({0, 0}).item<int64_t>()));
        ok = false;
      }
    }
    buf.clear_redis();
    buf.close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay_fill: %s\n", e.what());
    ok = false;
  }
  server.stop();
  std::printf("replay_fill: %s\n", ok ? "every row verified" : "FAILED");
  return ok ? 0 : 1;
}
