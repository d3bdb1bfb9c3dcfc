#pragma once
//! Internal to engine/: large CPU buffers on transparent huge pages, for the hot paths that allocate them
//! (preallocation by td[idx] = value, gathers by td[long index] / td[mask]) and, once an Engine installs it
//! (tensordict/memory.hpp), for every large CPU tensor libtorch allocates.
//!
//! Why: on these VMs the first touch of a fresh 4 KiB page costs ~10-20 us (DESIGN.md), so a fresh 12.8 MB
//! buffer costs ~35-100 ms of page faults before any real work, far more than filling it. Here buffers are
//! 2 MiB-aligned anonymous mappings advised MADV_HUGEPAGE (one fault per 2 MiB, and a TLB entry per 2 MiB:
//! kernels streaming through tens of MB run up to ~25% faster on these VMs), and freed mappings are kept for
//! reuse up to a bound, as malloc keeps freed heap memory (best fit: a kept mapping up to 1.5x the request).
//! A tensor starts kDataOffset bytes into its mapping; sizes round up to 4 KiB; a tail short of a whole 2 MiB
//! stays on 4 KiB pages. Up to kCachedBytes of freed
//! mappings stay mapped.
//! Elsewhere than Linux, or where THP is off, this degrades to plain zero-filled mappings.
//! Thread-safe. The tensors are ordinary CPU tensors (resizable, freed from any thread).
#include <cstddef>

#include <ATen/ATen.h>

namespace tensordict {
namespace detail {

constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kPageBytes = 4096;  // mappings are whole base pages
//! where a tensor starts in its mapping. Not at 0: glibc's memcpy between two addresses at the same offset
//! in their pages (or a few cache lines apart) takes its page-aliasing loop, which writes four pages far apart
//! in turn; into a file mapping (td[idx] = value on a memmap) the kernel then faults and allocates the page
//! cache page by page instead of in large folios: 245 MB copied in 24 MB blocks took 61,389 faults and 0.23 s
//! from a page-aligned source, 2,827 faults and 0.07 s from one 16 B to 2 KiB past a page start (glibc's own
//! blocks start 16 B in). Half a page keeps page-aligned destinations (files, rows of whole pages) far from it
constexpr size_t kDataOffset = 2048;
//! freed mappings kept for reuse (exact size matches), at most this many bytes
constexpr size_t kCachedBytes = size_t{64} << 20;

//! a tensor of `shape` on huge pages when the platform has them and it is at least `min_bytes` large,
//! zero-filled when `zeroed` (else uninitialised, for outputs written in full); undefined otherwise
at::Tensor huge_page_empty(at::IntArrayRef shape, const at::TensorOptions& options, size_t min_bytes, bool zeroed);

//! bytes of freed mappings currently kept for reuse (tests, diagnostics)
size_t huge_page_cached_bytes();

}  // namespace detail
}  // namespace tensordict
