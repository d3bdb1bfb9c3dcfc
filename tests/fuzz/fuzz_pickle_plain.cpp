// libFuzzer target for the plain-data pickle reader (api/src/pickle_plain.cpp): what a Python rank's metadata
// record arrives as (init_remote / broadcast / all_gather), i.e. bytes from another process. Invariants: the
// reader either returns plain data or throws a tensordict::Error (never executes, never crashes, bounded memory);
// what it returns pickles back (dump_plain) to bytes it reads as the same value.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../../api/src/pickle_plain.hpp"
#include "tensordict/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    tensordict::JsonValue v = tensordict::pickle::load_plain(bytes);
    if (!(tensordict::pickle::load_plain(tensordict::pickle::dump_plain(v)) == v)) std::abort();
  } catch (const tensordict::Error&) {
  }
  return 0;
}
