#pragma once
//! Inbox<T>: how a plain (non-actor) thread receives from actors without a caf::scoped_actor. Actors push
//! into it; the facade thread pops, spinning for a few microseconds before it blocks on a condition
//! variable. On this 2-core VM the spin saves the blocking thread's wake-up, which is most of the ~25 us a
//! scoped_actor request costs (see bench/bench_actors.cpp). Thread-safety: any number of producers, one
//! consumer at a time.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

namespace tensordict {
namespace actors {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <class T>
class Inbox {
 public:
  explicit Inbox(std::chrono::microseconds spin = std::chrono::microseconds(50)) : spin_(spin) {}
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  void push(T value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(value));
      pushed_.fetch_add(1, std::memory_order_release);
    }
    if (waiters_.load(std::memory_order_relaxed) > 0) cv_.notify_one();
  }

  //! the next value if one is waiting (never blocks)
  std::optional<T> try_pop() {
    if (pushed_.load(std::memory_order_acquire) == popped_) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return std::nullopt;
    T v = std::move(queue_.front());
    queue_.pop_front();
    ++popped_;
    return v;
  }

  //! the next value; nullopt when `deadline` passes first
  std::optional<T> pop(std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
    if (pushed_.load(std::memory_order_acquire) == popped_ && spin_.count() > 0) {
      const auto spin_end = std::chrono::steady_clock::now() + spin_;
      uint32_t n = 0;
      while (pushed_.load(std::memory_order_acquire) == popped_) {
        cpu_relax();
        if ((++n & 63) == 0 && std::chrono::steady_clock::now() >= spin_end) break;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (queue_.empty()) {
      waiters_.fetch_add(1, std::memory_order_relaxed);
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock, [&] { return !queue_.empty(); });
      } else {
        cv_.wait_until(lock, deadline, [&] { return !queue_.empty(); });
      }
      waiters_.fetch_sub(1, std::memory_order_relaxed);
      if (queue_.empty()) return std::nullopt;
    }
    T v = std::move(queue_.front());
    queue_.pop_front();
    ++popped_;
    return v;
  }

 private:
  std::chrono::microseconds spin_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> queue_;
  std::atomic<uint64_t> pushed_{0};
  uint64_t popped_ = 0;  // consumer only
  std::atomic<int> waiters_{0};
};

}  // namespace actors
}  // namespace tensordict
