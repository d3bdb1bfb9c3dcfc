// Process groups (c10d::ProcessGroupGloo over a TCPStore or FileStore), their life in the Engine, pending
// operations, the mapping of c10d / gloo failures to DistributedError, and upstream's pseudo-random tags.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "distributed_internal.hpp"
#include "tensordict/engine.hpp"

namespace tensordict {

namespace dist {

namespace {

std::mutex g_default_mu;
std::shared_ptr<Group> g_default;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int int_env(const char* name, int option, const char* what) {
  if (option >= 0) return option;
  const char* v = std::getenv(name);
  if (!v || !*v) throw ValueError(std::string("init_process_group: no ") + what + " (set GroupOptions()." + what + " or " + name + ")");
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 20)) throw ValueError(std::string("init_process_group: ") + name + "=" + v + " is not a number");
  return static_cast<int>(x);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

c10d::ProcessGroupGloo& Group::Impl::get(const char* what) const {
  std::lock_guard<std::mutex> lock(mu);
  if (shut || !pg) throw DistributedError(std::string(what) + ": the process group was shut down");
  return *pg;
}

void guarded(const std::string& what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw DistributedError(what + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw DistributedError(what + ": " + e.what());
  }
}

void wait_op(PendingOp& op) {
  guarded(op.what, [&] {
    op.work->wait();
    if (op.on_done) op.on_done();
  });
}

std::shared_ptr<Group> group_of(const DistOptions& options) {
  if (options.group()) return options.group();
  return default_group();
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::BAnd: return c10d::ReduceOp::BAND;
    case ReduceOp::BOr: return c10d::ReduceOp::BOR;
    case ReduceOp::BXor: return c10d::ReduceOp::BXOR;
  }
  throw ValueError("unknown ReduceOp");
}

Group::Group(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Group::~Group() { shutdown(); }

std::shared_ptr<Group> Group::create(const GroupOptions& o) {
  auto impl = std::make_shared<Impl>();
  const std::string kind = o.store();
  if (kind != "env" && kind != "tcp" && kind != "file")
    throw ValueError("process group: store must be \"env\", \"tcp\" or \"file\" (got \"" + kind + "\")");
  impl->rank = kind == "env" ? int_env("RANK", o.rank(), "rank") : o.rank();
  impl->size = kind == "env" ? int_env("WORLD_SIZE", o.world_size(), "world_size") : o.world_size();
  if (impl->size < 1) throw ValueError("process group: world_size must be at least 1 (got " + std::to_string(impl->size) + ")");
  if (impl->rank < 0 || impl->rank >= impl->size)
    throw ValueError("process group: rank " + std::to_string(impl->rank) + " is not in [0, " + std::to_string(impl->size) + ")");
  if (o.timeout().count() <= 0) throw ValueError("process group: the timeout must be positive");
  impl->timeout = o.timeout();
  std::string host = o.host();
  guarded("process group: joining rank " + std::to_string(impl->rank) + " of " + std::to_string(impl->size), [&] {
    if (kind == "file") {
      if (o.file().empty()) throw ValueError("process group: a \"file\" store needs GroupOptions().file(path)");
      impl->store = c10::make_intrusive<c10d::FileStore>(o.file(), impl->size);
    } else {
      int port = o.port();
      if (kind == "env") {
        host = env_or("MASTER_ADDR", host);
        if (port <= 0) port = int_env("MASTER_PORT", -1, "port");
      }
      if (port <= 0 || port > 65535) throw ValueError("process group: port " + std::to_string(port) + " is not a TCP port");
      c10d::TCPStoreOptions so;
      so.port = static_cast<std::uint16_t>(port);
      so.isServer = impl->rank == 0;
      so.numWorkers = impl->size;
      so.waitWorkers = false;
      so.timeout = o.timeout();
      so.multiTenant = true;  // several groups of one process on one host:port share its server
      impl->store = c10::make_intrusive<c10d::TCPStore>(host, so);
    }
    impl->store->setTimeout(o.timeout());
    c10::intrusive_ptr<c10d::Store> barrier_store;
    if (o.python_default_group()) {
      // torch 1.13's init_process_group: env:// wraps its store in PrefixStore("default_pg"); the default group
      // (group count 0) prefixes its keys with "0"; then a store-based barrier on that wrapped store
      if (kind == "env") impl->store = c10::make_intrusive<c10d::PrefixStore>("default_pg", impl->store);
      barrier_store = impl->store;
      impl->store = c10::make_intrusive<c10d::PrefixStore>("0", impl->store);
    } else if (!o.name().empty()) {
      impl->store = c10::make_intrusive<c10d::PrefixStore>(o.name(), impl->store);
    }
    auto gopts = c10d::ProcessGroupGloo::Options::create(o.timeout());
    const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
    if (!o.bind_address().empty()) {
      gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.bind_address()));
    } else if (!ifname.empty()) {
      gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (kind == "file" || is_loopback(host)) {
      gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      gopts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    gopts->threads = 2;
    impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, impl->rank, impl->size, gopts);
    if (barrier_store) {
      const std::string key = "store_based_barrier_key:1";
      barrier_store->add(key, 1);
      const auto deadline = std::chrono::steady_clock::now() + o.timeout();
      while (barrier_store->add(key, 0) < impl->size) {
        if (std::chrono::steady_clock::now() > deadline)
          throw DistributedError("process group: the Python ranks did not all reach the store-based barrier within " +
                                 std::to_string(o.timeout().count()) + " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      impl->pg->setSequenceNumberForGroup();
    }
  });
  return std::shared_ptr<Group>(new Group(std::move(impl)));
}

int Group::rank() const { return impl_->rank; }
int Group::size() const { return impl_->size; }
std::chrono::milliseconds Group::timeout() const { return impl_->timeout; }
Group::Impl& Group::impl() const { return *impl_; }

void Group::barrier() const {
  auto& pg = impl_->get("barrier");
  guarded("barrier", [&] { pg.barrier()->wait(); });
}

void Group::shutdown() {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->shut) return;
    impl_->shut = true;
    pg = std::move(impl_->pg);
  }
  {
    std::lock_guard<std::mutex> lock(impl_->staging_mu);
    impl_->staging.clear();
    impl_->staging_bytes = 0;
  }
  pg.reset();  // joins gloo's threads; operations still in flight end with an error
}

bool Group::is_shut_down() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->shut;
}

std::shared_ptr<Group> init_process_group(const GroupOptions& options) {
  auto group = Engine::default_engine()->process_group(options);
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (g_default && !g_default->is_shut_down())
    throw RuntimeError("init_process_group: the default process group is already initialized");
  g_default = group;
  return group;
}

std::shared_ptr<Group> default_group() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (!g_default || g_default->is_shut_down())
    throw RuntimeError("Default process group has not been initialized, please make sure to call "
                       "init_process_group (or pass DistOptions().group(...))");
  return g_default;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  return g_default && !g_default->is_shut_down();
}

void destroy_process_group() {
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(g_default_mu);
    g = std::move(g_default);
  }
  if (g) g->shutdown();
}

// ------------------------------------------------------------------ Pending

Pending::Pending() : state_(std::make_unique<State>()) {}
Pending::Pending(std::unique_ptr<State> state) : state_(std::move(state)) {}
Pending::~Pending() {
  // operations still in flight keep writing into their tensors: wait for them (errors are dropped here)
  if (!state_) return;
  for (auto& op : state_->ops) {
    if (op.returned) continue;
    try {
      op.work->wait();
    } catch (...) {
    }
  }
}
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;

void Pending::wait_all() {
  std::exception_ptr first;
  for (auto& op : state_->ops) {
    if (op.returned) continue;
    op.returned = true;
    try {
      wait_op(op);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

size_t Pending::wait_any() {
  // one that reports completion (collectives do); otherwise the first still open, waited for (gloo's send /
  // recv work reports completion only once waited)
  std::optional<size_t> first_open;
  for (size_t i = 0; i < state_->ops.size(); ++i) {
    PendingOp& op = state_->ops[i];
    if (op.returned) continue;
    if (!first_open) first_open = i;
    bool done = false;
    guarded(op.what, [&] { done = op.work->isCompleted(); });
    if (done) {
      op.returned = true;
      wait_op(op);
      return i;
    }
  }
  if (!first_open) throw RuntimeError("wait_any: every operation was returned already");
  PendingOp& op = state_->ops[*first_open];
  op.returned = true;
  wait_op(op);
  return *first_open;
}

bool Pending::is_completed() const {
  for (const auto& op : state_->ops)
    if (!op.returned && !op.work->isCompleted()) return false;
  return true;
}

size_t Pending::size() const { return state_->ops.size(); }
std::optional<int64_t> Pending::tag() const { return state_->tag; }

int free_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// ------------------------------------------------------------------ int_generator

int64_t int_generator(int64_t seed) {
  // numpy: SeedSequence(seed) -> PCG64 (XSL-RR 128/64); Generator.bytes(8) = the first 64-bit output, little
  // endian; int.from_bytes(..., "big") reads it byte-swapped
  if (seed < 0) throw ValueError("int_generator: the seed must be non-negative (got " + std::to_string(seed) + ")");
  using u32 = uint32_t;
  using u64 = uint64_t;
  using u128 = unsigned __int128;
  std::vector<u32> entropy;
  u64 n = static_cast<u64>(seed);
  if (n == 0) entropy.push_back(0);
  while (n) {
    entropy.push_back(static_cast<u32>(n & 0xFFFFFFFFu));
    n >>= 32;
  }
  u32 hc = 0x43b0d7e5u;
  auto hashmix = [&](u32 v) {
    v ^= hc;
    hc *= 0x931e8875u;
    v *= hc;
    v ^= v >> 16;
    return v;
  };
  auto mix = [](u32 x, u32 y) {
    u32 r = 0xca01f9ddu * x - 0x4973f715u * y;
    r ^= r >> 16;
    return r;
  };
  u32 pool[4];
  for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0);
  for (size_t s = 0; s < 4; ++s)
    for (size_t d = 0; d < 4; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s]));
  for (size_t s = 4; s < entropy.size(); ++s)
    for (size_t d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(entropy[s]));
  u32 words[8];
  u32 h = 0x8b51f9ddu;
  for (size_t i = 0; i < 8; ++i) {
    u32 v = pool[i % 4];
    v ^= h;
    h *= 0x58f38dedu;
    v *= h;
    v ^= v >> 16;
    words[i] = v;
  }
  u64 st[4];
  for (size_t k = 0; k < 4; ++k) st[k] = static_cast<u64>(words[2 * k]) | (static_cast<u64>(words[2 * k + 1]) << 32);
  const u128 mult = (static_cast<u128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;
  const u128 initstate = (static_cast<u128>(st[0]) << 64) | st[1];
  const u128 inc = (((static_cast<u128>(st[2]) << 64) | st[3]) << 1) | 1;
  u128 state = 0;
  state = state * mult + inc;
  state += initstate;
  state = state * mult + inc;
  state = state * mult + inc;  // next64
  const u64 hi = static_cast<u64>(state >> 64), lo = static_cast<u64>(state);
  const u64 x = hi ^ lo;
  const unsigned r = static_cast<unsigned>(hi >> 58);
  const u64 out = r ? (x >> r) | (x << (64 - r)) : x;
  return static_cast<int64_t>(__builtin_bswap64(out) % 10000u);
}

}  // namespace dist

// ------------------------------------------------------------------ the Engine's groups

struct Engine::Groups {
  std::mutex mu;
  std::vector<std::weak_ptr<dist::Group>> groups;
  ~Groups() {
    for (auto& w : groups)
      if (auto g = w.lock()) g->shutdown();
  }
};

std::shared_ptr<dist::Group> Engine::process_group(const dist::GroupOptions& options) const {
  static std::mutex make_mu;
  std::shared_ptr<Groups> groups;
  {
    std::lock_guard<std::mutex> lock(make_mu);
    if (!groups_) groups_ = std::make_shared<Groups>();
    groups = groups_;
  }
  auto group = dist::Group::create(options);
  std::lock_guard<std::mutex> lock(groups->mu);
  groups->groups.erase(std::remove_if(groups->groups.begin(), groups->groups.end(),
                                      [](const std::weak_ptr<dist::Group>& w) { return w.expired(); }),
                       groups->groups.end());
  groups->groups.push_back(group);
  return group;
}

}  // namespace tensordict
