// Large CPU buffers on transparent huge pages (see huge_page_allocator.hpp).
#include "huge_page_allocator.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include <ATen/EmptyTensor.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tensordict/errors.hpp"

namespace tensordict {
namespace detail {

#if defined(__linux__)
namespace {

//! mappings in whole huge pages, with a bounded free list
class Pool {
 public:
  //! never destroyed: tensors may be freed during static destruction
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }

  //! a mapping of `len` bytes (a multiple of kHugePageBytes); `fresh`: zero-filled by the kernel
  void* acquire(size_t len, bool& fresh) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(len);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= len;
        fresh = false;
        return p;
      }
    }
    fresh = true;
    const size_t span = len + kHugePageBytes;  // room to align the start on a huge page
    void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw RuntimeError("cannot map " + std::to_string(len) + " bytes for a tensor");
    const auto start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
    const size_t head = aligned - start;
    const size_t tail = span - head - len;
    if (head) munmap(p, head);
    if (tail) munmap(reinterpret_cast<void*>(aligned + len), tail);
    void* base = reinterpret_cast<void*>(aligned);
    madvise(base, len, MADV_HUGEPAGE);  // advisory: ignored where THP is off
    return base;
  }

  void release(void* p, size_t len) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + len <= kCachedBytes) {
        free_.emplace(len, p);
        cached_ += len;
        return;
      }
    }
    munmap(p, len);
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

class HugePageAllocator final : public c10::Allocator {
 public:
  explicit HugePageAllocator(bool zeroed) : zeroed_(zeroed) {}

  at::DataPtr allocate(size_t n) const override {
    if (n == 0) return at::DataPtr(nullptr, at::Device(at::kCPU));
    const size_t len = (n + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    bool fresh = false;
    void* base = Pool::get().acquire(len, fresh);
    if (zeroed_ && !fresh) std::memset(base, 0, n);
    return {base, new Mapping{base, len}, &release, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  struct Mapping {
    void* base;
    size_t len;
  };
  static void release(void* ctx) {
    auto* m = static_cast<Mapping*>(ctx);
    Pool::get().release(m->base, m->len);
    delete m;
  }
  bool zeroed_;
};

}  // namespace
#endif

at::Tensor huge_page_empty(at::IntArrayRef shape, const at::TensorOptions& options, size_t min_bytes, bool zeroed) {
#if defined(__linux__)
  const auto st = c10::typeMetaToScalarType(options.dtype());
  if (!options.device().is_cpu() || options.layout() != at::kStrided || c10::isQIntType(st)) return at::Tensor();
  size_t numel = 1;
  for (auto s : shape) numel *= static_cast<size_t>(s);
  if (numel * c10::elementSize(st) < min_bytes) return at::Tensor();
  static HugePageAllocator zeroed_alloc(true);
  static HugePageAllocator raw_alloc(false);
  c10::Allocator* alloc = zeroed ? &zeroed_alloc : &raw_alloc;
  return at::Tensor(at::detail::empty_generic(shape, alloc, c10::DispatchKeySet(c10::DispatchKey::CPU), st, c10::nullopt));
#else
  (void)shape;
  (void)options;
  (void)min_bytes;
  (void)zeroed;
  return at::Tensor();
#endif
}

size_t huge_page_cached_bytes() {
#if defined(__linux__)
  return Pool::get().cached();
#else
  return 0;
#endif
}

}  // namespace detail
}  // namespace tensordict
