#pragma once
//! Process-wide mutexes held across fork(), as glibc holds malloc's (backends/ and engine/ use it for their
//! registries and pools).
//! A child forked while another thread holds one of these (mapping or unmapping a file or a segment) would
//! inherit it held and hang on its first memmap, shared-memory or large-tensor call: the forking thread takes each before
//! fork() and both processes give it back after (pthread_atfork). None of them is taken while another is held.
#include <pthread.h>

#include <mutex>

namespace tensordict::backends::detail {

//! registers the fork handlers of the mutex `Get()` returns (call once, where it is created)
template <std::mutex& (*Get)()>
void hold_across_fork() {
  ::pthread_atfork([] { Get().lock(); }, [] { Get().unlock(); }, [] { Get().unlock(); });
}

//! a process-wide mutex held across fork(), one per `Tag` type; never destroyed (deleters that take it may run
//! during static destruction)
template <class Tag>
std::mutex& fork_safe_mutex() {
  static std::mutex* mu = [] {
    auto* m = new std::mutex;
    hold_across_fork<fork_safe_mutex<Tag>>();
    return m;
  }();
  return *mu;
}

}  // namespace tensordict::backends::detail
