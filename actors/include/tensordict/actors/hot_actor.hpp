#pragma once
//! HotActor: the base of the actors that serve the synchronous facade (store actors, the echo actor). A
//! blocking actor on a thread of its own (CAF runs every blocking actor detached) that, once its mailbox
//! is empty, spins on it for `spin` before it blocks. Measured here (bench_actors): a facade round trip
//! to such an actor takes ~2-3 us back to back and ~12 us after an idle pause, against ~14 us back to
//! back for an event-based actor on the sharing scheduler, whose worker thread sleeps after every job
//! and must be woken for the next request. The price: one thread per store, and `spin` of CPU after each
//! burst of requests (config actor_spin_us).
#include <chrono>

#include <caf/all.hpp>

namespace tensordict {
namespace actors {

class HotActor : public caf::blocking_actor {
 public:
  HotActor(caf::actor_config& cfg, std::chrono::microseconds spin) : caf::blocking_actor(cfg), spin_(spin) {}

  void await_data() override {
    spin_on_mailbox();
    caf::blocking_actor::await_data();
  }
  bool await_data(timeout_type timeout) override {
    spin_on_mailbox();
    return caf::blocking_actor::await_data(timeout);
  }

 private:
  void spin_on_mailbox();
  std::chrono::microseconds spin_;
};

}  // namespace actors
}  // namespace tensordict
