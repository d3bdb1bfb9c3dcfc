// libFuzzer target for the shared-memory handle decoders (backends/shm.hpp): the bytes a process receives to
// map another process's TensorDict. Invariants: parse_tensor_handle / parse_tensordict_handle either succeed
// or throw a tensordict::Error (FormatError for malformed input); a parsed handle serializes and parses back
// equal. Nothing is opened or mapped. With TD_FUZZ_SEED_DIR set, the target first writes valid handles there.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tensordict/backends/shm.hpp"
#include "tensordict/errors.hpp"

namespace be = tensordict::backends;

namespace {

void write_seeds(const std::string& dir) {
  be::ShmTensorHandle t;
  t.segment = "tdfuzz123_456_0_0123456789abcdef";
  t.offset = 64;
  t.dtype = at::kFloat;
  t.shape = {4, 3};
  std::ofstream(dir + "/tensor.bin", std::ios::binary) << be::serialize(t);
  be::ShmTensorDictHandle h;
  h.batch_size = {4};
  h.entries.push_back({{"obs"}, t});
  be::ShmTensorHandle u = t;
  u.dtype = at::kLong;
  u.shape = {4};
  u.offset = 128;
  h.entries.push_back({{"next", "reward"}, u});
  std::ofstream(dir + "/tensordict.bin", std::ios::binary) << be::serialize(h);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TD_FUZZ_SEED_DIR")) write_seeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    be::ShmTensorHandle t = be::parse_tensor_handle(bytes);
    if (be::parse_tensor_handle(be::serialize(t)) != t) std::abort();  // round trip
  } catch (const tensordict::Error&) {
  }
  try {
    be::ShmTensorDictHandle h = be::parse_tensordict_handle(bytes);
    if (be::parse_tensordict_handle(be::serialize(h)) != h) std::abort();
  } catch (const tensordict::Error&) {
  }
  return 0;
}
