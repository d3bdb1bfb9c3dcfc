#include "tensordict/engine.hpp"
#include "tensordict/loader.hpp"

#include <cstdlib>
#include <mutex>
#include <thread>

#include "tensordict/actors/process_workers.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/logging.hpp"

namespace tensordict {

namespace {
std::mutex g_default_mutex;
std::shared_ptr<Engine> g_default;  // guarded by g_default_mutex
bool g_atexit_registered = false;
bool g_exiting = false;

void stop_default_at_exit() {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lock(g_default_mutex);
    g_exiting = true;
    e = std::move(g_default);
  }
  // glibc's exit() destroys the main thread's thread_local objects before it runs atexit handlers, and CAF
  // keeps per-thread state (memory caches): destroying the actor system on the main thread now corrupts the
  // heap. A fresh thread has intact thread-local state, so the system is stopped there (and joined).
  if (e) std::thread([&e] { e.reset(); }).join();
}

std::shared_ptr<MapBackend> default_backend() {
  return Engine::default_engine()->runtime();
}
}  // namespace

Engine::Engine() : Engine(Config::load()) {}

Engine::Engine(const Config& config) : rt_(actors::Runtime::start(config)) {
  set_map_backend(rt_);
  registered_ = true;
}

Engine::Engine(const Config& config, DefaultTag) : rt_(actors::Runtime::start(config)) {}

Engine::~Engine() {
  if (registered_ && get_map_backend() == std::static_pointer_cast<MapBackend>(rt_)) set_map_backend(nullptr);
  groups_.reset();  // the process groups it made leave (distributed_group.cpp)
  rt_.reset();
}

const Config& Engine::config() const { return rt_->config(); }

int64_t Engine::ping(int64_t x) const { return rt_->ping(x); }

TensorDict Engine::map(const TensorDict& td, const MapFn& fn, const MapOptions& options) const {
  if (!fn) throw ValueError("map: fn is empty");
  return rt_->map(td, fn, options);
}

MapIter Engine::map_iter(const TensorDict& td, const MapFn& fn, const MapOptions& options) const {
  if (!fn) throw ValueError("map_iter: fn is empty");
  return rt_->map_iter(td, fn, options);
}

TensorDict Engine::map(const TensorDict& td, const std::string& fn_name, const MapOptions& options) const {
  MapFn fn = find_map_fn(fn_name);
  if (!fn) throw KeyError("map: no map function named '" + fn_name + "' is registered (tensordict::register_map_fn)");
  return rt_->map_named(td, fn_name, fn, options);
}

bool run_worker_if_requested(int argc, char** argv) {
  // a DataLoader worker process, or a map worker process (neither returns when it is one)
  if (loader_detail::run_loader_worker_process(argc, argv)) return true;
  return actors::run_map_worker_process(argc, argv);
}

std::shared_ptr<Engine> Engine::default_engine() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (g_exiting) throw RuntimeError("the default tensordict Engine is already stopped (program exit)");
  if (!g_default) {
    g_default = std::shared_ptr<Engine>(new Engine(Config::load(), DefaultTag{}));
    if (!g_atexit_registered) {
      // registered after CAF's statics exist, so it runs before they are destroyed
      std::atexit(stop_default_at_exit);
      g_atexit_registered = true;
    }
    logger()->debug("default engine started");
  }
  return g_default;
}

bool Engine::default_running() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  return g_default != nullptr;
}

void Engine::shutdown_default() {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lock(g_default_mutex);
    e = std::move(g_default);
  }
  e.reset();
}

namespace detail {
void register_h5_storage();     // persistent.cpp
void register_redis_storage();  // tensordict_store.cpp
bool link_default_engine() {
  set_default_map_backend_factory(&default_backend);
  static const bool drivers = [] {
    register_h5_storage();
    register_redis_storage();
    return true;
  }();
  (void)drivers;
  return true;
}
}  // namespace detail

}  // namespace tensordict
