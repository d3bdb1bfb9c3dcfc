#pragma once
//! Large CPU tensors on transparent huge pages, process-wide (config malloc.huge_page_min_kb; an Engine
//! applies it when it starts).
//!
//! Once set, every CPU tensor libtorch allocates with at least `min_bytes` and at most 64 MiB (at::empty, the
//! results of kernels, clones, gathers) lives on its own 2 MiB-aligned anonymous mapping advised
//! MADV_HUGEPAGE, and freed ones are kept for reuse (up to 64 MiB in all, best fit), as malloc keeps its heap.
//! Other tensors go to the allocator libtorch had: larger ones would not be kept, and on VMs that hand free
//! 2 MiB blocks back to the host a fresh huge page costs ~5x a 4 KiB-paged fill (a one-off 245 MB clone: 0.59 s
//! against 0.11 s; on reused huge pages 0.02 s). Why: kernels streaming through buffers larger than the cache
//! miss the TLB on every 4 KiB page, and on virtual machines a miss walks two page tables; measured here, the
//! main job's transform with 2 workers over 43 MB of scratch per chunk runs ~25% faster on huge pages. Where THP is off (or
//! `never`), the mappings are plain ones and nothing changes but the reuse.
//! Not under AddressSanitizer or ThreadSanitizer builds (the Engine skips it): their allocators must see
//! every heap block.
#include <cstddef>

namespace tensordict {

//! CPU tensors of at least `min_bytes` bytes on huge pages from now on; 0 turns it off (tensors already made
//! keep their memory). Thread-safe, but libtorch's allocator slot is not: call it before other threads
//! allocate tensors, as an Engine does on start.
void set_huge_page_tensors(size_t min_bytes);

//! the current threshold in bytes, 0 when off
size_t huge_page_tensors_min_bytes();

}  // namespace tensordict
