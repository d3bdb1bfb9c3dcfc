// libFuzzer target for the engine configuration (config/): arbitrary text overlaid on the embedded defaults, as
// a $TENSORDICT_CONFIG file or an explicit config is. Invariants: overlay + validate either succeed or throw a
// tensordict::Error naming the problem; an accepted config prints (to_json) and overlays back to the same JSON.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tensordict/config.hpp"
#include "tensordict/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tensordict::Config defaults = tensordict::Config::defaults();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    tensordict::Config c = defaults.overlay(text, "fuzz input");
    c.validate();
    const std::string json = c.to_json();
    if (defaults.overlay(json, "round trip").to_json() != json) std::abort();
  } catch (const tensordict::Error&) {
  }
  return 0;
}
