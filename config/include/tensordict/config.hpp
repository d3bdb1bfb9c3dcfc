#pragma once
//! The engine configuration. Lookup order, key by key: explicit values > the JSON file named by the
//! environment variable TENSORDICT_CONFIG > the default embedded at build time (config/default_config.json).
//! Unknown keys are a ValueError and ill-typed values a TypeError, both naming the key ("map.num_workers").
#include <cstdint>
#include <optional>
#include <string>

namespace tensordict {

struct Config {
  // scheduler.*: the CAF scheduler of an Engine
  int64_t scheduler_threads = 2;
  std::string scheduler_policy = "sharing";
  //! "stealing" only: how many times an idle scheduler thread polls for work (spinning) before it sleeps
  //! on its condition variable; a request arriving meanwhile needs no thread wake-up
  int64_t scheduler_spin_polls = 100;
  //! "stealing" only: a sleeping scheduler thread wakes after this long to steal queued work of others
  int64_t scheduler_idle_sleep_us = 1000;
  // map.*
  int64_t map_num_workers = 2;
  int64_t map_torch_threads_per_worker = 1;
  bool map_progress = false;
  int64_t map_progress_interval_ms = 1000;
  //! worker processes: how long map waits for them to exit after the stop message before SIGKILL
  int64_t map_process_exit_grace_ms = 2000;
  //! how map workers write a chunk into a memmap / shared out: "pwrite" (into the page cache through the
  //! file, no page faults on the mapping; a shared out: "populate"), "populate" (MADV_POPULATE_WRITE over
  //! the chunk's pages, then stores) or "copy" (stores through the mapping, one fault per fresh 4 KiB page)
  std::string map_out_write = "pwrite";
  // shm.*: name prefix of the shared-memory segments this process creates; an Engine whose prefix differs
  // from the default sets it process-wide (TensorDict::set_shm_prefix) when it starts
  std::string shm_prefix = "tensordict_";
  // redis.*
  std::string redis_host = "127.0.0.1";
  int64_t redis_port = 6379;
  int64_t redis_db = 0;
  std::string redis_prefix = "tensordict";
  //! redis.timeout_ms: a Redis server that sends no byte for this long fails the call with "no reply from
  //! HOST:PORT within T s" (a long reply that keeps arriving is never cut); 0: wait forever
  int64_t redis_timeout_ms = 5000;
  //! store.max_key_bytes: the largest leaf a Store's add_key creates (remote clients included); 0: no limit
  //! beyond the free space of the file system (memmap) or of /dev/shm (shared), which is always checked
  int64_t store_max_key_bytes = 0;
  //! store.lanes: extra connections a store with them (Redis) opens, on first need, for synchronous reads and
  //! writes that find its connection busy (they run there at once instead of waiting for it); 0: none
  int64_t store_lanes = 3;
  //! store.lane_retry_ms: after a lane could not be opened (the server refused another client), how long its calls
  //! wait for the one connection before a lane is tried again
  int64_t store_lane_retry_ms = 1000;
  // log.*
  std::string log_level = "warn";
  int64_t request_timeout_ms = 30000;
  //! how long a facade request spins on its reply before it blocks (a reply that wakes a sleeping caller
  //! costs another thread wake-up, ~10 us here; see actors/README.md "Store actors")
  int64_t facade_spin_us = 50;
  //! how long an actor serving the facade (store actors, the echo actor: actors/hot_actor.hpp) spins on
  //! its empty mailbox before its thread blocks; a request arriving meanwhile needs no thread wake-up
  int64_t actor_spin_us = 20;
  //! how long a caller that finds a leaf store (HDF5, Redis) free waits for the other callers' calls
  //! before it runs its own, when the store's last merged calls came from several callers at once
  //! (producers in step: their rows then share one round trip instead of alternating 1 and N-1); 0: never
  int64_t store_linger_us = 20;
  //! malloc.keep_mb (glibc only): how much free memory glibc's malloc keeps at the top of a heap for reuse
  //! instead of handing it back to the kernel (M_TRIM_THRESHOLD, with M_MMAP_THRESHOLD at 32 MiB), 0..1024,
  //! set process-wide when an Engine starts; 0 leaves malloc as it is. Memory handed back and taken again costs a page fault
  //! per 4 KiB (10-20 us each on the VMs measured): map frees chunk results on another thread than the one
  //! that made them, which made glibc trim and refault its heap (a cheap map 1-17 ms a call against 0.25 ms)
  int64_t malloc_keep_mb = 64;
  //! malloc.huge_page_min_kb (Linux): CPU tensors of at least this many KiB live on transparent huge pages,
  //! process-wide from when an Engine starts (tensordict/memory.hpp), 0..1048576; 0 leaves libtorch's
  //! allocator alone. Kernels streaming through buffers larger than the cache miss the TLB every 4 KiB, and on
  //! a VM each miss walks two page tables: the main job's transform runs ~25% faster on huge pages
  int64_t malloc_huge_page_min_kb = 2048;

  //! the embedded default only
  static Config defaults();
  //! default, then $TENSORDICT_CONFIG (if set), then `explicit_json` (if given)
  static Config load(const std::optional<std::string>& explicit_json = std::nullopt);
  //! this config with the keys present in `json` replaced; `origin` names the source in error messages
  Config overlay(const std::string& json, const std::string& origin = "explicit config") const;
  //! this config with the keys of the JSON file at `path` replaced
  Config overlay_file(const std::string& path) const;
  //! checks the values (ranges, enumerations); ValueError naming the key
  void validate() const;
  //! every key, as JSON (loadable by overlay)
  std::string to_json() const;
  //! the embedded default JSON text
  static const char* default_json();
};

}  // namespace tensordict
