#pragma once
//! Reply<T>: the single-shot slot a plain (non-actor) thread waits on for one facade request. The actor
//! fulfils it once, with a value or a carried error; the waiter spins for `spin` (an atomic load per
//! iteration, no lock) and only then blocks on a condition variable, which the actor signals only when
//! somebody sleeps. On this 2-core VM that makes a facade round trip ~2-6 us against ~25 us for a
//! caf::scoped_actor request (bench/bench_actors.cpp), because the reply never has to wake a sleeping
//! thread. Thread-safety: one producer (fulfil once; later calls are ignored), one waiter.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "tensordict/actors/inbox.hpp"  // cpu_relax
#include "tensordict/map.hpp"           // map_detail::CarriedError / rethrow

namespace tensordict {
namespace actors {

template <class T>
class Reply {
 public:
  Reply() = default;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  //! fulfils with a value; false when already fulfilled
  bool set_value(T v) {
    if (!claim()) return false;
    value_.emplace(std::move(v));
    publish();
    return true;
  }
  //! fulfils with an error, rethrown by get() with the same type and message
  bool set_error(map_detail::CarriedError e) {
    if (!claim()) return false;
    error_.emplace(std::move(e));
    publish();
    return true;
  }
  bool ready() const { return state_.load(std::memory_order_acquire) == kReady; }

  //! waits until fulfilled or `deadline`; true when fulfilled
  bool wait(std::chrono::steady_clock::time_point deadline, std::chrono::microseconds spin) {
    if (ready()) return true;
    if (spin.count() > 0) {
      // a few microseconds of pure spinning (the reply comes in ~2-5 us when the actor's thread runs on
      // the other core), then spin yielding: when the scheduler woke the actor's thread onto THIS core,
      // pure spinning would keep it off the CPU until the spin ends (measured: replies at spin + 20 us)
      const auto now = std::chrono::steady_clock::now();
      const auto pure_end = now + std::min(spin, std::chrono::microseconds(4));
      const auto spin_end = now + spin;
      bool pure = true;
      uint32_t n = 0;
      while (!ready()) {
        ++n;
        if (pure) {
          cpu_relax();
          if ((n & 31) == 0 && std::chrono::steady_clock::now() >= pure_end) pure = false;
        } else if ((n & 7) == 0) {
          std::this_thread::yield();
          if (std::chrono::steady_clock::now() >= spin_end) break;
        } else {
          cpu_relax();
        }
      }
      if (ready()) return true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    sleeping_.store(true, std::memory_order_seq_cst);
    while (!ready()) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
    sleeping_.store(false, std::memory_order_relaxed);
    return ready();
  }
  //! the value (after wait returned true); rethrows a carried error
  T get() {
    if (error_) map_detail::rethrow(*error_);
    return std::move(*value_);
  }

 private:
  static constexpr int kEmpty = 0, kWriting = 1, kReady = 2;
  bool claim() {
    int expected = kEmpty;
    return state_.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel);
  }
  void publish() {
    state_.store(kReady, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mu_);  // the waiter is inside wait_until or about to check ready()
      cv_.notify_all();
    }
  }

  std::atomic<int> state_{kEmpty};
  std::atomic<bool> sleeping_{false};
  std::optional<T> value_;
  std::optional<map_detail::CarriedError> error_;
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace actors
}  // namespace tensordict
