#include "tensordict/actors/hot_actor.hpp"

#include <thread>

#include "tensordict/actors/inbox.hpp"  // cpu_relax

namespace tensordict {
namespace actors {

void HotActor::spin_on_mailbox() {
  if (spin_.count() <= 0 || !mailbox().empty()) return;
  const auto end = std::chrono::steady_clock::now() + spin_;
  uint32_t n = 0;
  while (mailbox().empty()) {
    // yield now and then: a facade caller spinning for the reply may share this core
    if ((++n & 7) == 0) {
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() >= end) return;
    } else {
      cpu_relax();
    }
  }
}

}  // namespace actors
}  // namespace tensordict
