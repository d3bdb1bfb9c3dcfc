// Large CPU buffers on transparent huge pages (see huge_page_allocator.hpp).
#include "huge_page_allocator.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tensordict/backends/fork_safe.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/memory.hpp"

namespace tensordict {
namespace detail {

#if defined(__linux__)
namespace {

//! 2 MiB-aligned mappings advised MADV_HUGEPAGE, with a bounded free list
class Pool {
 public:
  //! never destroyed: tensors may be freed during static destruction
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }

  //! a mapping of at least `len` bytes (a multiple of kPageBytes), 2 MiB-aligned; `len` becomes its length:
  //! a kept mapping up to half as large again is reused (best fit); `fresh`: zero-filled by the kernel
  void* acquire(size_t& len, bool& fresh) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.lower_bound(len);
      if (it != free_.end() && it->first <= len + len / 2) {
        void* p = it->second;
        len = it->first;
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
    // advisory, ignored where THP is off; a tail short of a whole huge page stays on 4 KiB pages
    madvise(base, len, MADV_HUGEPAGE);
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
  //! held across fork() (fork_safe.hpp): a child forked while another thread takes or gives back a large
  //! tensor would otherwise hang on its first large tensor
  std::mutex& mu_ = backends::detail::fork_safe_mutex<struct PoolMutex>();
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

struct Mapping {
  void* base;
  size_t len;
};
void release_mapping(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  Pool::get().release(m->base, m->len);
  delete m;
}

//! `n` bytes on a mapping of the pool, kDataOffset bytes into it, zeroed if asked
at::DataPtr huge_page_data(size_t n, bool zeroed) {
  size_t len = (n + kDataOffset + kPageBytes - 1) / kPageBytes * kPageBytes;
  bool fresh = false;
  void* base = Pool::get().acquire(len, fresh);
  char* data = static_cast<char*>(base) + kDataOffset;
  if (zeroed && !fresh) std::memset(data, 0, n);
  return {data, new Mapping{base, len}, &release_mapping, at::Device(at::kCPU)};
}

class HugePageAllocator final : public c10::Allocator {
 public:
  explicit HugePageAllocator(bool zeroed) : zeroed_(zeroed) {}

  at::DataPtr allocate(size_t n) const override {
    if (n == 0) return at::DataPtr(nullptr, at::Device(at::kCPU));
    return huge_page_data(n, zeroed_);
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  bool zeroed_;
};

//! libtorch's CPU allocator once installed (set_huge_page_tensors): requests from min_bytes up to what the pool
//! keeps (kCachedBytes) go to the pool, others to the allocator it replaced. Installed once and never removed
//! (tensors keep their own deleters, and SetAllocator is not thread-safe); turning it off sets min_bytes to
//! "never".
class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* next) : next_(next) {}

  at::DataPtr allocate(size_t n) const override {
    // larger than the pool keeps: unmapped when freed, so never reused. On VMs that hand free 2 MiB blocks
    // back to the host (free page reporting) a fresh huge page is memory the host took back: a one-off clone of
    // 245 MB took 0.59 s on fresh huge pages against 0.11 s on 4 KiB pages (0.02 s on reused huge pages)
    if (n == 0 || n < min_bytes.load(std::memory_order_relaxed) || n > kCachedBytes) return next_->allocate(n);
    return huge_page_data(n, false);
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }

  static constexpr size_t kOff = ~size_t{0};
  std::atomic<size_t> min_bytes{kOff};

 private:
  c10::Allocator* next_;
};

std::mutex install_mu;
CpuAllocator* installed = nullptr;  // never freed: tensors may be freed during static destruction

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

void set_huge_page_tensors(size_t min_bytes) {
#if defined(__linux__)
  std::lock_guard<std::mutex> lock(detail::install_mu);
  if (min_bytes == 0) {
    if (detail::installed) detail::installed->min_bytes.store(detail::CpuAllocator::kOff);
    return;
  }
  if (!detail::installed) {
    detail::installed = new detail::CpuAllocator(c10::GetCPUAllocator());
    // the highest priority: a later static registration of libtorch's own must not displace it
    c10::SetCPUAllocator(detail::installed, std::numeric_limits<uint8_t>::max());
  }
  detail::installed->min_bytes.store(min_bytes);
#else
  (void)min_bytes;
#endif
}

size_t huge_page_tensors_min_bytes() {
#if defined(__linux__)
  std::lock_guard<std::mutex> lock(detail::install_mu);
  if (!detail::installed) return 0;
  const size_t m = detail::installed->min_bytes.load();
  return m == detail::CpuAllocator::kOff ? 0 : m;
#else
  return 0;
#endif
}

}  // namespace tensordict
