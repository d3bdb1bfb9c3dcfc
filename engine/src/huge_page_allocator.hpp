#pragma once
//! Internal to engine/: large CPU buffers on transparent huge pages, for the hot paths that allocate them
//! (preallocation by td[idx] = value, gathers by td[long index] / td[mask]).
//!
//! Why: on these VMs the first touch of a fresh 4 KiB page costs ~10-20 us (DESIGN.md), so a fresh 12.8 MB
//! buffer costs ~35-100 ms of page faults before any real work, far more than filling it. Here buffers are
//! 2 MiB-aligned anonymous mappings in whole 2 MiB pages, advised MADV_HUGEPAGE (one fault per 2 MiB), and
//! freed mappings are kept for reuse up to a bound, as malloc keeps freed heap memory. The price: sizes
//! round up to 2 MiB (at most 2 MiB per buffer), and up to kCachedBytes of freed mappings stay mapped.
//! Elsewhere than Linux, or where THP is off, this degrades to plain zero-filled mappings.
//! Thread-safe. The tensors are ordinary CPU tensors (resizable, freed from any thread).
#include <cstddef>

#include <ATen/ATen.h>

namespace tensordict {
namespace detail {

constexpr size_t kHugePageBytes = size_t{2} << 20;
//! freed mappings kept for reuse (exact size matches), at most this many bytes
constexpr size_t kCachedBytes = size_t{64} << 20;

//! a tensor of `shape` on huge pages when the platform has them and it is at least `min_bytes` large,
//! zero-filled when `zeroed` (else uninitialised, for outputs written in full); undefined otherwise
at::Tensor huge_page_empty(at::IntArrayRef shape, const at::TensorOptions& options, size_t min_bytes, bool zeroed);

//! bytes of freed mappings currently kept for reuse (tests, diagnostics)
size_t huge_page_cached_bytes();

}  // namespace detail
}  // namespace tensordict
