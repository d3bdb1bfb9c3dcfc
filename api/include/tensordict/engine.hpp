#pragma once
//! Engine: the actor system tensordict-cpp runs its actors on (map workers, store actors), with its
//! configuration. A default Engine starts lazily on first use (td.map without an explicit Engine) and
//! stops at exit; users who want control construct one: `tensordict::Engine engine(config);` — while it
//! lives, td.map runs on it. No CAF in this header.
#include <cstdint>
#include <memory>
#include <string>

#include "tensordict/config.hpp"
#include "tensordict/map.hpp"

namespace tensordict {

namespace actors {
class Runtime;
}
namespace dist {
class Group;
struct GroupOptions;
}

class Engine {
 public:
  //! configured by Config::load() (embedded default < $TENSORDICT_CONFIG)
  Engine();
  //! explicit configuration (e.g. Config::load(R"({"map": {"num_workers": 4}})"))
  explicit Engine(const Config& config);
  //! unregisters as td.map's backend and stops the actor system; a MapIter still alive keeps the system
  //! until it is destroyed. Blocks only while a worker finishes the fn call it is in.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const;
  //! a blocking round trip to an actor through the facade (health check; benchmarks the facade cost)
  int64_t ping(int64_t x = 0) const;
  //! td.map / td.map_iter on this engine (whatever backend is registered)
  TensorDict map(const TensorDict& td, const MapFn& fn, const MapOptions& options = {}) const;
  MapIter map_iter(const TensorDict& td, const MapFn& fn, const MapOptions& options = {}) const;
  //! td.map("name", options) on this engine (a registered fn; the form worker processes can run)
  TensorDict map(const TensorDict& td, const std::string& fn_name, const MapOptions& options = {}) const;

  //! the default engine, started on first call; stopped at exit (or by shutdown_default)
  static std::shared_ptr<Engine> default_engine();
  //! true while the default engine runs
  static bool default_running();
  //! stops the default engine now (the next use starts a new one)
  static void shutdown_default();

  //! joins a process group (tensordict/distributed.hpp) whose life this engine bounds: the group is shut down
  //! when the engine stops (its handles then fail with DistributedError)
  std::shared_ptr<dist::Group> process_group(const dist::GroupOptions& options) const;

  //! internal: the actors-layer runtime (api/ and actors/ code only)
  const std::shared_ptr<actors::Runtime>& runtime() const { return rt_; }

 private:
  struct DefaultTag {};
  Engine(const Config& config, DefaultTag);
  std::shared_ptr<actors::Runtime> rt_;
  bool registered_ = false;
  struct Groups;
  mutable std::shared_ptr<Groups> groups_;
};

//! Call first thing in main() of any program that maps with worker processes (MapOptions().worker_processes),
//! after registering its map functions: returns false at once in a normal run; in a process started as a
//! map worker (by td.map: fork + exec of MapOptions().worker_executable(), default this program) it
//! connects to the coordinator on 127.0.0.1, runs the named fn on the chunks it is given, writes the
//! results into the memmap/shared out, and exits the process when the map is over or the coordinator
//! goes away (it never returns). The same call serves a DataLoader's worker processes
//! (LoaderOptions().worker_processes(n), tensordict/loader.hpp): it maps the loader's ring, reopens the
//! dataset and fills batch slots until the loader stops (it never returns either).
//!   int main(int argc, char** argv) {
//!     tensordict::register_map_fn("normalize", normalize);
//!     tensordict::run_worker_if_requested(argc, argv);
//!     ...
bool run_worker_if_requested(int argc, char** argv);

namespace detail {
//! registers the lazy default engine with engine/'s td.map; referenced from every TU that includes this
//! header, so that the static library's engine object is linked in
bool link_default_engine();
[[maybe_unused]] static const bool td_default_engine_linked = link_default_engine();
}  // namespace detail

}  // namespace tensordict
