#pragma once
//! What belongs to the memmap storage alone (the handle keeps upstream's memmap_ / memmap / load_memmap /
//! memmap_like / memmap_refresh_ / is_memmap): a new leaf in an existing directory, and the directory itself.
#include <string>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! upstream td.make_memmap(key, shape, dtype): adds a zero-filled memory-mapped leaf to `td`, a memmap
//! TensorDict with a prefix (rewrites meta.json); missing levels of a nested key are created (their
//! directory and meta.json, then the parent's meta.json). ValueError: not saved to a directory, or a key
//! Python's meta.json reserves; KeyError: the key exists; BatchSizeError: `shape` does not start with the
//! batch size
TensorDict& make_memmap(TensorDict& td, const NestedKey& key, const BatchSize& shape, at::ScalarType dtype = at::kFloat);

//! the directory the memmap TensorDict `td` lives in ("" when not memmap or anonymous)
std::string memmap_prefix(const TensorDict& td);
//! Faults in, ahead of its writers, every page of the memory-mapped tensor leaves of `td` (memmap files; other
//! leaves are left alone): the file blocks are reserved first (fallocate: a full disk is a BackendError naming the file here, not
//! in a writer) and the pages are allocated in the page cache and mapped (MADV_POPULATE_WRITE), so the writes
//! that follow (map's `pwrite` into `out`, `td[rows] = value`) copy bytes only. The bytes keep their values (the
//! zeros of a fresh leaf). Its use: on another thread while other work goes on; the main job pre-faults its
//! output while it synthesises its dataset, so a first run pays for its fresh memory off the map's critical path.
//! The pages stay resident and dirty until written back: for what fits in memory (the main job prefaults only an
//! output under a quarter of the free memory). Returns the bytes faulted in (0 where no leaf is a file mapping, or
//! the kernel lacks MADV_POPULATE_WRITE).
int64_t prefault(const TensorDict& td);

}  // namespace tensordict
