// libFuzzer target for the HDF5 store's reader: the input is written to a file that is opened read-only with
// open_h5_store, listed, and every leaf is read (tensors whole and by rows, non-tensors).
// Invariant: either everything works or a tensordict::Error is thrown; any other exception or a crash is
// a finding. Leaves larger than 64 MiB are not read (a hostile header may claim any size).
//
// Seeds: with TD_FUZZ_H5_SEED_OUT=<file>, the target first writes a file with the store itself (every dtype,
// zero-dim and empty leaves, nested groups, a chunked gzip+shuffle dataset, non-tensors); run_fuzz.cmake adds
// it to the corpus beside the fixture and h5py-written files.
//
// Mutations: libFuzzer's own by default. libhdf5 1.10 (C code that trusts its input) crashes on some
// mutated files in ways the store cannot prevent (backends/README.md, "HDF5 store", lists the findings), so
// the CI run (ctest fuzz.h5_open) sets TD_FUZZ_H5_MUTATIONS=covered: each mutation is then a truncation or
// an XOR of one byte among the first 120 (the superblock and the root group's header), the damage the
// bad_files test of tests/backends/test_h5_store.cpp covers.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "tensordict/backends/h5_store.hpp"
#include "tensordict/errors.hpp"

namespace {

std::string scratch_file() {
  static std::string file = [] {
    char tmpl[] = "/tmp/td-fuzz-h5-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (!p) std::abort();
    return std::string(p) + "/input.h5";
  }();
  return file;
}

constexpr int64_t kMaxLeafBytes = int64_t{64} << 20;

bool covered_mutations_only() {
  static const bool only = [] {
    const char* v = std::getenv("TD_FUZZ_H5_MUTATIONS");
    return v && std::strcmp(v, "covered") == 0;
  }();
  return only;
}

}  // namespace

namespace {

void write_store_seed(const std::string& path) {
  namespace be = tensordict::backends;
  auto s = be::open_h5_store(path, be::H5Mode::Write);
  const at::ScalarType dtypes[] = {at::kChar, at::kShort, at::kInt, at::kLong, at::kByte, at::kHalf,
                                   at::kFloat, at::kDouble, at::kBool, at::kComplexFloat, at::kComplexDouble};
  for (at::ScalarType dt : dtypes)
    s->create({"t", c10::toString(dt)}, dt, {4, 2}, at::arange(8).reshape({4, 2}).to(dt), {});
  s->create({"scalar"}, at::kDouble, {}, at::scalar_tensor(2.5, at::kDouble), {});
  s->create({"empty"}, at::kFloat, {0, 3}, {}, {});
  s->create({"zeros"}, at::kLong, {5}, {}, {});
  s->create({"a", "b", "chunked"}, at::kInt, {16, 4}, at::arange(64, at::kInt).reshape({16, 4}),
            be::CreateOptions{{4, 4}, 6, true});
  s->write_non_tensor({"n", "str"}, {tensordict::JsonValue("a string!"), false});
  s->write_non_tensor({"n", "int"}, {tensordict::JsonValue(3), false});
  s->write_non_tensor({"n", "float"}, {tensordict::JsonValue(2.5), false});
  s->write_non_tensor({"n", "bool"}, {tensordict::JsonValue(true), false});
  s->write_non_tensor({"n", "list"}, {tensordict::JsonValue::array({1, 2, 3}), false});
  s->write_non_tensor({"n", "strs"}, {tensordict::JsonValue::array({"a", "bc"}), false});
  s->close();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("TD_FUZZ_H5_SEED_OUT")) write_store_seed(out);
  return 0;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (!covered_mutations_only()) return LLVMFuzzerMutate(data, size, max_size);
  if (size == 0) return 0;
  std::minstd_rand rng(seed);
  if (rng() % 4 == 0) return static_cast<size_t>(rng() % size);  // a truncated file
  const size_t pos = static_cast<size_t>(rng() % std::min<size_t>(size, 120));
  data[pos] = static_cast<uint8_t>(data[pos] ^ (1 + rng() % 255));  // one damaged byte in the header
  return size;
}

// libhdf5 (not instrumented) keeps allocations of a failed call where LeakSanitizer's per-input check does not
// see them (they are released by the library, no leak is reported at exit): those reports are not ours.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace be = tensordict::backends;
  const std::string file = scratch_file();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    auto store = be::open_h5_store(file, be::H5Mode::Read);
    for (const auto& leaf : store->list()) {
      try {
        if (leaf.kind == be::LeafKind::NonTensor) {
          (void)store->read_non_tensor(leaf.path);
        } else if (leaf.kind == be::LeafKind::Tensor) {
          int64_t bytes = static_cast<int64_t>(c10::elementSize(leaf.dtype));
          for (int64_t d : leaf.shape) bytes = d > 0 && bytes > kMaxLeafBytes / d ? kMaxLeafBytes + 1 : bytes * d;
          if (bytes > kMaxLeafBytes) continue;
          (void)store->read({be::LeafRead{leaf.path, true, {}}});
          if (!leaf.shape.empty() && leaf.shape[0] > 1)
            (void)store->read({be::LeafRead{leaf.path, false, {0, leaf.shape[0] - 1}}});
        }
      } catch (const tensordict::Error&) {
      }
    }
    store->close();
  } catch (const tensordict::Error&) {
  }
  return 0;
}
