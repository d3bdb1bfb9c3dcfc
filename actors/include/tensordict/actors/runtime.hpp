#pragma once
//! Runtime: one caf::actor_system configured from a tensordict::Config, plus the actors every Engine has
//! (an echo actor for facade health checks) and the map backend (coordinator + worker actors per call).
//! api/'s Engine owns one; holders of a MapIter share it, so the system outlives every actor handle
//! (CAF pitfall: a handle that outlives its actor_system makes the system's destructor hang).
#include <atomic>
#include <chrono>
#include <memory>

#include <caf/actor.hpp>  // the echo actor handle; the system and its config are held by pointer
#include <caf/fwd.hpp>

#include "tensordict/config.hpp"
#include "tensordict/map.hpp"

namespace tensordict {
namespace actors {

class Runtime : public MapBackend, public std::enable_shared_from_this<Runtime> {
 public:
  //! starts the scheduler (config scheduler.threads / scheduler.policy) and sets the log level
  static std::shared_ptr<Runtime> start(const Config& config);
  ~Runtime() override;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  caf::actor_system& system() { return *system_; }
  const Config& config() const { return config_; }
  std::chrono::microseconds spin() const { return std::chrono::microseconds(config_.facade_spin_us); }
  std::chrono::milliseconds request_timeout() const {
    return std::chrono::milliseconds(config_.request_timeout_ms);
  }
  //! the echo actor: (ping_atom, int_reply_ptr box, int64 x) fulfils box with x; (ping_atom, int64 x) replies x
  const caf::actor& echo() const { return echo_; }
  //! a facade round trip to the echo actor (spin-then-block reply box); BackendError on timeout
  int64_t ping(int64_t x = 0);

  //! td.map(fn): the caller runs chunk 0 and decides from its measured cost per row whether to run the rest
  //! itself or with helper workers (see SharedMapJob); the result is the same either way
  TensorDict map(const TensorDict& src, const MapFn& fn, const MapOptions& options) override;
  MapIter map_iter(const TensorDict& src, const MapFn& fn, const MapOptions& options) override;
  //! td.map("name", ...): with options.worker_processes() > 0 starts that many worker processes (fork +
  //! exec of options.worker_executable()), which connect back to this system's middleman on 127.0.0.1
  TensorDict map_named(const TensorDict& src, const std::string& name, const MapFn& fn,
                       const MapOptions& options) override;

 private:
  explicit Runtime(const Config& config);
  Config config_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor echo_;  // after system_: released first
  //! measured by map over the calls that started helpers (smoothed): the spawn of one helper on the caller's
  //! thread, and what the helpers lost against the ideal split of the chunks (times the number of workers)
  std::atomic<int64_t> helper_spawn_ns_{20000};
  std::atomic<int64_t> helper_start_ns_{100000};
  //! the cost per row (picoseconds) of the last call's first chunk: a call whose fn costs about as much per row
  //! starts its helpers before its own first chunk (0: no call yet)
  std::atomic<int64_t> last_ps_per_row_{0};
};

//! the actor published on host:port, through `system`'s middleman: CAF's remote_actor waits without end for a
//! handshake that stalls (a peer that accepted the connection but never answers, a lost message on a loaded
//! machine); here each attempt is bounded by `timeout` and a timed-out one is tried again, `attempts` times in
//! all. Any other failure (nothing listens there, no actor published) is returned at once. The error renders
//! as "<host>:<port> did not answer within <ms> ms (<n> attempts)" when every attempt timed out.
caf::expected<caf::actor> connect_remote_actor(caf::actor_system& system, const std::string& host, uint16_t port,
                                               std::chrono::milliseconds timeout, int attempts = 3);

}  // namespace actors
}  // namespace tensordict
