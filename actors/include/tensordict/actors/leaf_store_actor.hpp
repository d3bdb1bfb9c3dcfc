#pragma once
//! The store actor of a storage whose leaves live outside this process's memory (backends::LeafStore: an
//! HDF5 file, a Redis store). It owns the file / connection, and the storage sees one call at a time: a
//! caller that finds the store free runs its call on its own thread, together with every call waiting;
//! a caller that finds it busy leaves its call waiting and messages the actor, and whoever holds the store
//! next (that caller, or the actor) runs it. Calls waiting are merged: consecutive reads become ONE
//! LeafStore::read (one HDF5 pass, one Redis pipeline) and consecutive writes ONE LeafStore::write (one
//! MULTI/EXEC), so many producers calling `buf[i] = row` at once share round trips without a thread
//! hand-off when the store is idle. When a merged batch fails, each call runs alone so that every caller
//! gets its own result or error.
//!
//!   auto client = LeafStoreClient::open(runtime, backends::open_h5_store(...));
//!   std::vector<at::Tensor> rows = client->read({{{"obs"}, false, {3, 7}}});   // one request
//!   client->run([](backends::LeafStore& s) { s.flush(); });                    // anything else
//!
//! Thread-safety: every method may be called from any thread. In-process only (no CAF in the callers).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensordict/backends/leaf_store.hpp"

namespace tensordict {
namespace actors {

class Runtime;
struct leaf_call;

class LeafStoreClient {
 public:
  //! spawns the actor that owns `store` on rt's system
  static std::shared_ptr<LeafStoreClient> open(std::shared_ptr<Runtime> rt, std::shared_ptr<backends::LeafStore> store);
  //! closes the store (when not closed yet) and stops the actor
  ~LeafStoreClient();
  LeafStoreClient(const LeafStoreClient&) = delete;
  LeafStoreClient& operator=(const LeafStoreClient&) = delete;

  //! one request: the leaves' rows (LeafStore::read), merged with the reads other callers sent meanwhile
  std::vector<at::Tensor> read(std::vector<backends::LeafRead> reads);
  //! one request: LeafStore::write, merged with other callers' writes waiting for the store
  void write(std::vector<backends::LeafWrite> writes);
  //! runs fn(store) with the store held (structure queries, create, erase, non-tensors, flush) and returns
  //! what fn returns; fn's exception reaches the caller with its type
  template <class F>
  auto run(F fn) -> decltype(fn(std::declval<backends::LeafStore&>())) {
    using R = decltype(fn(std::declval<backends::LeafStore&>()));
    if constexpr (std::is_void_v<R>) {
      run_void([&](backends::LeafStore& s) { fn(s); });
    } else {
      std::optional<R> out;
      run_void([&](backends::LeafStore& s) { out.emplace(fn(s)); });
      return std::move(*out);
    }
  }
  //! closes the store inside the actor and stops it; later requests raise BackendError naming the store
  void close();
  bool closed() const;

  //! what the store is, its driver and its spec fields (fixed at open: no request)
  const std::string& describe() const { return describe_; }
  const std::string& driver() const { return driver_; }
  const JsonValue& spec_fields() const { return spec_fields_; }
  bool writable() const { return writable_; }

  //! read / write calls handed to the store, and in how many store calls (merged batches)
  struct BatchStats {
    int64_t calls = 0;
    int64_t batches = 0;
    int64_t largest = 0;
  };
  BatchStats batch_stats() const;
  //! calls waiting for the store right now (for tests and diagnostics)
  size_t waiting() const;

 private:
  LeafStoreClient() = default;
  void run_void(const std::function<void(backends::LeafStore&)>& fn);
  void send(const std::shared_ptr<leaf_call>& call);
  //! tells the actor that calls are waiting for the store
  void announce();
  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::string describe_, driver_;
  JsonValue spec_fields_;
  bool writable_ = false;
};

}  // namespace actors
}  // namespace tensordict
