// Worker processes of td.map: fork + exec, the pid table, and the worker side (the child's actor system).
#include "tensordict/actors/process_workers.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "tensordict/actors/fault_points.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/backends/redis_client.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/map.hpp"

extern char** environ;

namespace tensordict {
namespace actors {

// ============================================================================ ProcessTable
size_t ProcessTable::add(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  pids_.push_back(pid);
  reaped_.push_back(false);
  return pids_.size() - 1;
}

size_t ProcessTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_.size();
}

pid_t ProcessTable::pid(size_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot < pids_.size() ? pids_[slot] : -1;
}

void ProcessTable::kill(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot < pids_.size() && !reaped_[slot]) ::kill(pids_[slot], SIGKILL);
}

std::string ProcessTable::reap_locked(size_t slot, int status) {
  reaped_[slot] = true;
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : std::string());
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

std::vector<std::pair<size_t, std::string>> ProcessTable::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<size_t, std::string>> out;
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    int status = 0;
    const pid_t r = ::waitpid(pids_[i], &status, WNOHANG);
    if (r == pids_[i]) {
      out.emplace_back(i, reap_locked(i, status));
    } else if (r < 0 && errno == ECHILD) {  // reaped by someone else (a SIGCHLD handler of the program)
      reaped_[i] = true;
      out.emplace_back(i, "is gone (reaped elsewhere)");
    }
  }
  return out;
}

std::optional<std::string> ProcessTable::wait_for(size_t slot, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot >= pids_.size() || reaped_[slot]) return std::nullopt;
      int status = 0;
      const pid_t r = ::waitpid(pids_[slot], &status, WNOHANG);
      if (r == pids_[slot]) return reap_locked(slot, status);
      if (r < 0 && errno == ECHILD) {
        reaped_[slot] = true;
        return std::nullopt;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool ProcessTable::all_reaped() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (bool r : reaped_)
    if (!r) return false;
  return true;
}

void ProcessTable::reap_all(std::chrono::milliseconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    for (auto& ex : poll()) logger()->debug("map: worker process slot {} {}", ex.first, ex.second);
    if (all_reaped()) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    logger()->warn("map: worker process {} did not exit within {} ms of the stop message: SIGKILL", pids_[i],
                   grace.count());
    ::kill(pids_[i], SIGKILL);
    int status = 0;
    while (::waitpid(pids_[i], &status, 0) < 0 && errno == EINTR) {
    }
    reaped_[i] = true;
  }
}

// ============================================================================ spawning
pid_t spawn_worker_process(const std::string& executable, const std::string& env_value, const char* env_name) {
  // everything the child needs is prepared before fork: between fork and exec it only makes syscalls
  const std::string prefix = std::string(env_name) + "=";
  // the Redis credentials this process authenticated with travel in the environment, never on the command line
  const std::vector<std::string> secrets = backends::redis_child_environment();
  auto replaced = [&](const char* e) {
    if (std::strncmp(e, prefix.c_str(), prefix.size()) == 0) return true;
    for (const auto& s : secrets)
      if (std::strncmp(e, s.c_str(), s.find('=') + 1) == 0) return true;
    return false;
  };
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    if (!replaced(*e)) env_strings.emplace_back(*e);
  }
  env_strings.insert(env_strings.end(), secrets.begin(), secrets.end());
  env_strings.push_back(prefix + env_value);
  const pid_t parent = ::getpid();
  // the worker watches this pid (watch_parent_or_exit): dropped from the inherited environment first, so a
  // worker's own workers see their parent's pid, not their grandparent's
  const std::string parent_prefix = std::string(kWorkerParentEnv) + "=";
  env_strings.erase(std::remove_if(env_strings.begin(), env_strings.end(),
                                   [&](const std::string& e) { return e.compare(0, parent_prefix.size(), parent_prefix) == 0; }),
                    env_strings.end());
  env_strings.push_back(parent_prefix + std::to_string(parent));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = executable;
  char* argv[] = {arg0.data(), nullptr};

  const pid_t pid = ::fork();
  if (pid < 0) {
    throw BackendError("map: cannot start a worker process (fork: " + std::string(std::strerror(errno)) + ")");
  }
  if (pid == 0) {
    // child: async-signal-safe calls only. No PR_SET_PDEATHSIG: it follows the forking THREAD, so a worker
    // would die with a short-lived thread that started it while the process lives on; the worker watches the
    // process instead (watch_parent_or_exit)
    if (::getppid() != parent) ::_exit(126);
    // no inherited sockets/files (the coordinator's connections, the caller's files)
    if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int fd = 3; fd < 65536; ++fd) ::close(fd);
    }
    ::execve(executable.c_str(), argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

void watch_parent_or_exit() {
  pid_t parent = 0;
  if (const char* e = std::getenv(kWorkerParentEnv); e && *e) parent = static_cast<pid_t>(std::atol(e));
  ::unsetenv(kWorkerParentEnv);  // not inherited by processes the worker's code might start
  if (parent <= 0) parent = ::getppid();
  if (::getppid() != parent) std::_Exit(kParentGoneExit);
  std::thread([parent] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (::getppid() != parent) std::_Exit(kParentGoneExit);  // reparented: the process that started us is gone
    }
  }).detach();
}

// ============================================================================ the worker side
namespace {

struct remote_worker_state {
  caf::actor coordinator;
  caf::actor_addr coordinator_addr;
  int64_t index = 0;
  bool ready = false;
  std::optional<map_error> open_error;  // the job could not be opened: every chunk fails with it
  TensorDict src = TensorDict::undefined();
  MapFn fn;
  MapPlan plan;
  MapWorkerContext ctx;
  static inline const char* name = "tensordict.map_worker_process";
};

using remote_worker = caf::stateful_actor<remote_worker_state>;

void finish(remote_worker* self) {
  auto& st = self->state;
  st.src = TensorDict::undefined();
  st.plan.out.reset();
  st.fn = nullptr;
  if (st.coordinator) self->demonitor(st.coordinator);
  st.coordinator = nullptr;
  self->quit();
}

//! TD_FAULT_MAP_WORKER=<stage>@<index>@<marker> (tensordict/actors/fault_points.hpp; tests/api/test_map_process.cpp):
//! "hello" (connected, before it says hello), "job" (the job opened, before its first chunk), "reply" (its
//! first chunk computed and written into out, before the done message)
void maybe_die_at(const char* stage, int64_t index) {
  static const FaultPoints points("TD_FAULT_MAP_WORKER");
  points.maybe_die_at(stage, index);
}

void open_job(remote_worker* self, const map_job_desc& d) {
  auto& st = self->state;
  if (!d.log_level.empty()) set_log_level(d.log_level);
  st.fn = find_map_fn(d.fn_name);
  if (!st.fn) {
    throw KeyError("map: the worker process (pid " + std::to_string(::getpid()) + ") has no map function named '" +
                   d.fn_name + "' (register it in the worker executable too, before run_worker_if_requested)");
  }
  st.src = open_storage(StorageSpec::parse(d.src_spec), OpenOptions().writable(false));
  MapPlan& p = st.plan;
  p.dim = d.dim;
  p.stack = d.drop_dim;
  p.in_place_out = true;
  p.out = open_storage(StorageSpec::parse(d.out_spec));
  p.seed = d.seed;
  p.worker_threads = d.worker_threads;
  if (d.out_write < static_cast<int32_t>(MapOutWrite::Copy) || d.out_write > static_cast<int32_t>(MapOutWrite::Populate)) {
    throw ValueError("map: the job names an unknown out_write mode " + std::to_string(d.out_write));
  }
  p.out_write = static_cast<MapOutWrite>(d.out_write);
  p.chunks.clear();
  for (size_t i = 0; i < d.starts.size(); ++i) {
    MapChunk c;
    c.start = d.starts[i];
    c.length = i < d.lengths.size() ? d.lengths[i] : 1;
    c.drop_dim = d.drop_dim;
    p.chunks.push_back(std::move(c));
  }
  st.ctx = MapWorkerContext();  // a generator of an earlier job's seed goes with it
  st.ctx.worker_index = st.index;
  st.ctx.seed = d.seed + st.index;
}

caf::behavior remote_worker_actor(remote_worker* self, caf::actor coordinator, std::string token, int64_t index) {
  auto& st = self->state;
  st.coordinator = coordinator;
  st.coordinator_addr = coordinator.address();
  st.index = index;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& msg) {
    if (msg.source == self->state.coordinator_addr) {
      logger()->debug("map worker {}: the coordinator is gone ({}), exiting", self->state.index, to_string(msg.reason));
      finish(self);
    }
  });
  maybe_die_at("hello", index);
  self->send(coordinator, map_hello_atom::value, token, index, static_cast<int64_t>(::getpid()));
  return {
      [=](map_job_atom, const map_job_desc& d) {
        try {
          open_job(self, d);
        } catch (...) {
          self->state.open_error = to_wire(map_detail::carry_current_exception(-1));
        }
        self->state.ready = true;
        maybe_die_at("job", self->state.index);
      },
      [=](map_chunk_atom, int64_t chunk) {
        auto& s = self->state;
        if (!s.coordinator) return;
        if (s.open_error || !s.ready) {
          map_error e = s.ready ? *s.open_error
                                : map_error{static_cast<int32_t>(ErrorCode::Backend),
                                            "map: a chunk arrived before the job", -1};
          e.chunk = chunk;
          self->send(s.coordinator, map_failed_atom::value, s.index, std::move(e));
          return;
        }
        try {
          if (chunk < 0 || static_cast<size_t>(chunk) >= s.plan.chunks.size()) {
            throw IndexError("map: chunk " + std::to_string(chunk) + " is not in the job's chunk table");
          }
          map_detail::run_chunk(s.src, s.fn, s.plan, static_cast<size_t>(chunk), s.ctx);
          maybe_die_at("reply", s.index);
          self->send(s.coordinator, map_done_atom::value, s.index, chunk);
        } catch (...) {
          auto ce = map_detail::carry_current_exception(chunk);
          self->send(s.coordinator, map_failed_atom::value, s.index, to_wire(ce));
        }
      },
      [=](map_stop_atom) {
        logger()->debug("map worker {}: stop", self->state.index);
        finish(self);
      },
  };
}

struct WorkerSpec {
  std::string host;
  uint16_t port = 0;
  std::string token;
  int64_t index = 0;
};

bool parse_spec(const std::string& v, WorkerSpec& s) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (;;) {
    const size_t c = v.find(':', pos);
    parts.push_back(v.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  if (parts.size() != 4) return false;
  try {
    s.host = parts[0];
    const long port = std::stol(parts[1]);
    if (port <= 0 || port > 65535) return false;
    s.port = static_cast<uint16_t>(port);
    s.token = parts[2];
    s.index = std::stoll(parts[3]);
  } catch (...) {
    return false;
  }
  return !s.host.empty() && !s.token.empty() && s.index >= 0;
}

int serve(const WorkerSpec& spec) {
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{1});  // fn runs on it; torch threads come from worker_threads
  cfg.set("middleman.workers", size_t{0});
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  int rc = 0;
  {
    // the coordinator listens since before the fork: a refused connection means it is gone already
    auto coordinator = connect_remote_actor(sys, spec.host, spec.port, std::chrono::seconds(30));
    if (!coordinator) {
      std::fprintf(stderr, "tensordict map worker %lld: cannot connect to %s:%u: %s\n",
                   static_cast<long long>(spec.index), spec.host.c_str(), spec.port,
                   sys.render(coordinator.error()).c_str());
      rc = 3;
    } else {
      sys.spawn(remote_worker_actor, *coordinator, spec.token, spec.index);
    }
  }  // no handle outlives the system
  logger()->debug("map worker {}: waiting for its actor", spec.index);
  sys.await_all_actors_done();
  logger()->debug("map worker {}: actor done, stopping the actor system", spec.index);
  // the system's destructor stops the middleman; never let it keep the process alive
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(0);
  }).detach();
  return rc;
}

}  // namespace

bool run_map_worker_process(int /*argc*/, char** /*argv*/) {
  const char* env = std::getenv(kMapWorkerEnv);
  if (!env || !*env) return false;
  const std::string value = env;
  ::unsetenv(kMapWorkerEnv);  // not inherited by processes fn might start
  watch_parent_or_exit();     // also while fn runs: the coordinator's down message waits for fn to return
  WorkerSpec spec;
  if (!parse_spec(value, spec)) {
    std::fprintf(stderr, "tensordict map worker: malformed %s=%s\n", kMapWorkerEnv, value.c_str());
    std::fflush(stderr);
    std::_Exit(2);
  }
  int rc = 2;
  try {
    rc = serve(spec);
    logger()->debug("map worker {}: actor system stopped, exiting", spec.index);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensordict map worker %lld: %s\n", static_cast<long long>(spec.index), e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}

}  // namespace actors
}  // namespace tensordict
