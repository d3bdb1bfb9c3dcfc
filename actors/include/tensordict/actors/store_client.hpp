#pragma once
//! The one store stack: every store — a memmap directory, a shared-memory TensorDict, an HDF5 file, a Redis
//! store — speaks ONE batched interface (backends::LeafStore: leaves by path, rows resolved once by the
//! caller, tensors; read / write of many leaves in one call), is owned by ONE kind of actor, and is reached
//! through ONE client (StoreClient). The stores whose leaves are in this process's memory (memmap, shared)
//! are DenseStores: they also publish their structure as an immutable snapshot (a locked TensorDict whose
//! leaves are the storage itself), which readers index directly, with no actor and no lock of the store.
//!
//! Who runs a call (flat combining, store_actor.cpp): a caller that finds the store free holds it and runs
//! its call on its own thread, together with every call waiting: consecutive reads become ONE
//! LeafStore::read (one HDF5 pass, one Redis pipeline), consecutive writes ONE LeafStore::write (one
//! MULTI/EXEC). A caller that finds it busy leaves its call waiting and messages the actor; whoever holds the
//! store next (that caller, or the actor) runs it. When a merged batch fails, each call runs alone so that
//! every caller gets its own result or error.
//!
//! Another process reaches a dense store through its actor (CAF middleman, 127.0.0.1, `publish`): the
//! inspectable (store_atom, store_request) -> store_response carries no data, only the storage spec, which
//! the client maps itself (zero-copy); its structural changes (a new key, flush) go to the owner's actor.
//! HDF5 and Redis stores are reopened in another process by their storage spec instead.
//!
//!   auto client = StoreClient::open(runtime, backends::open_h5_store(...));
//!   std::vector<at::Tensor> rows = client->read({{{"obs"}, false, {3, 7}}});   // one request
//!   client->run([](backends::LeafStore& s) { s.flush(); });                    // anything else
//!
//! Thread-safety: every method may be called from any thread.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "tensordict/actors/messages.hpp"
#include "tensordict/backends/leaf_store.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {
namespace actors {

class Runtime;

//! a store whose leaves are in this process's memory (a memmap directory mapped here, shared memory): the
//! LeafStore interface over a TensorDict, plus the snapshot every reader indexes directly. Rows read by
//! `read` are views of the storage where the rows are one run (a gather otherwise); `write` copies into it.
class DenseStore : public backends::LeafStore {
 public:
  //! the current structure: a locked TensorDict whose leaves are the storage (readable from any thread)
  TensorDict td() const;
  //! bumped by every structural change (create, refresh)
  int64_t version() const;
  //! picks up leaves another process added (memmap: memmap_refresh_; a connected client: the owner's structure)
  virtual void refresh() = 0;
  //! bytes a new leaf may still take (the file system of the directory, or /dev/shm); -1: unknown
  virtual int64_t space_left() const { return -1; }
  //! the storage spec another process opens (open_storage)
  virtual StorageSpec spec() const;
  //! a store of another process, reached through its owner's actor (Store::connect)
  virtual bool connected() const { return false; }
  //! a connected client's request to the owner's actor (with its token); ValueError for an owner's store
  virtual store_response request(store_request req);

  // backends::LeafStore over td(): paths are nested keys, rows index dim 0
  std::string driver() const override { return kind_; }
  JsonValue spec_fields() const override;
  bool writable() const override { return true; }
  std::optional<std::vector<int64_t>> stored_batch_size() const override;
  void set_stored_batch_size(const std::vector<int64_t>& batch) override;
  std::vector<backends::LeafInfo> list() override;
  std::vector<at::Tensor> read(const std::vector<backends::LeafRead>& reads) override;
  void write(const std::vector<backends::LeafWrite>& writes) override;
  //! levels are created with their first leaf (as Redis): nothing to do
  void create_group(const backends::LeafPath& path) override { (void)path; }
  //! NotImplementedError: a store cannot remove keys
  bool erase(const backends::LeafPath& path) override;
  backends::NonTensorValue read_non_tensor(const backends::LeafPath& path) override;
  //! NotImplementedError: a store holds tensor leaves only
  void write_non_tensor(const backends::LeafPath& path, const backends::NonTensorValue& value) override;

 protected:
  DenseStore(std::string kind, TensorDict td, int64_t max_key_bytes);
  //! publishes `next` (locked) as the new structure, at `version` (default: the next one)
  void publish(TensorDict next, std::optional<int64_t> version = std::nullopt);
  //! the checks every new leaf passes before anything is made: a key that is new and whose existing parents are
  //! TensorDicts (KeyError), a shape that starts with the batch size (BatchSizeError), a size within
  //! max_key_bytes (ValueError) and the space left (BackendError)
  void check_new_leaf(const NestedKey& key, const std::vector<int64_t>& shape, at::ScalarType dtype) const;
  const std::string kind_;
  const int64_t max_key_bytes_;

 private:
  mutable std::mutex mu_;
  TensorDict td_ = TensorDict::undefined();
  int64_t version_ = 0;
};

//! a store over a memmap TensorDict saved to a directory (ValueError otherwise); `max_key_bytes` bounds a new
//! leaf (config store.max_key_bytes; 0: only the free space)
std::shared_ptr<DenseStore> make_memmap_store(const TensorDict& td, int64_t max_key_bytes = 0);
//! a store over a share_memory_()'d TensorDict (ValueError otherwise)
std::shared_ptr<DenseStore> make_shared_store(const TensorDict& td, int64_t max_key_bytes = 0);

//! another process's dense store, as a client that connected to its owner's actor `owner` (whose Info
//! response is `info`) maps it: rows in this process's mapping, new keys and flushes through the owner
std::shared_ptr<DenseStore> connect_dense_store(std::shared_ptr<Runtime> rt, caf::actor owner, std::string token,
                                                const store_response& info);

//! a new store token: 128 random bits from /dev/urandom as 32 hex digits (BackendError when it cannot be read)
std::string new_store_token();

//! one request to a (possibly remote) store actor with a caf::scoped_actor; rethrows the store's error
//! with its type; BackendError when the actor is unreachable, down or silent for `timeout`
store_response store_request_blocking(caf::actor_system& system, const caf::actor& actor, const store_request& req,
                                      std::chrono::milliseconds timeout);

//! leaves (key, dtype, shape) of a TensorDict, as the protocol lists them
std::vector<store_leaf> describe_leaves(const TensorDict& td);

struct StoreCallState;

class StoreClient {
 public:
  //! spawns the actor that owns `store` (an HDF5 file, a Redis store) on rt's system
  static std::shared_ptr<StoreClient> open(std::shared_ptr<Runtime> rt, std::shared_ptr<backends::LeafStore> store);
  //! the same for a dense store (memmap, shared), which gets a new token (new_store_token) and can be published
  static std::shared_ptr<StoreClient> open_dense(std::shared_ptr<Runtime> rt, std::shared_ptr<DenseStore> store);
  //! connects to a dense store published by another process and maps its storage here (BackendError when
  //! unreachable, or refused: a missing or wrong token). An empty `token` is read from the environment variable
  //! TENSORDICT_STORE_TOKEN. The client owns an actor too (its calls run like the owner's); its new keys and
  //! flushes go to the owner's actor
  static std::shared_ptr<StoreClient> connect(std::shared_ptr<Runtime> rt, const std::string& host, uint16_t port,
                                              const std::string& token = "");
  //! closes the store (when not closed yet) and stops the actor
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  //! one request: the leaves' rows (LeafStore::read), merged with the reads other callers sent meanwhile
  std::vector<at::Tensor> read(std::vector<backends::LeafRead> reads);
  //! one request: LeafStore::write, merged with other callers' writes waiting for the store. With write-behind on
  //! (set_write_behind), it returns once the call is queued (its tensors copied first)
  void write(std::vector<backends::LeafWrite> writes);
  //! write-behind: with `max_in_flight` > 0, write() does not wait for the store. Its call (the data copied, so
  //! the caller may reuse its tensors at once) is queued behind the calls waiting and run by the actor, which
  //! merges what waits into one store call (one Redis pipeline, one MULTI/EXEC of up to 256 calls): producers
  //! that each had one write in flight now keep the pipeline as deep as the queue. At most `max_in_flight`
  //! queued writes: past that a write waits for the oldest. The first error of a queued write is raised (once,
  //! with its type and message, after every write queued before it has run) by the next call of this client from
  //! any thread, by flush_writes() and by close(); reads and every other call first wait for the queued writes, so a caller reads what it wrote.
  //! 0 (the default): write() returns when the store has written, as upstream's synchronous pipeline does
  void set_write_behind(size_t max_in_flight);
  size_t write_behind() const;
  //! waits until every queued write has run; raises the first error of one (write-behind)
  void flush_writes();
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
  //! closes the store with the store held and stops the actor; later requests raise BackendError naming the
  //! store. A connected client disconnects (the owner's store stays open)
  void close();
  bool closed() const;

  //! what the store is, its driver and its spec fields (fixed at open: no request)
  const std::string& describe() const { return describe_; }
  const std::string& driver() const { return driver_; }
  const JsonValue& spec_fields() const { return spec_fields_; }
  bool writable() const { return writable_; }
  //! the store's holds_non_tensor_rows() (fixed at open: no request)
  bool holds_non_tensor_rows() const { return non_tensor_rows_; }

  // ---- dense stores (memmap, shared); ValueError for the others where noted
  //! the dense store, or nullptr (HDF5, Redis)
  DenseStore* dense() const { return dense_; }
  //! the current snapshot (undefined for a store that is not dense): plain memory, no request
  TensorDict snapshot() const;
  int64_t version() const;
  //! a client connected to another process's store
  bool remote() const { return dense_ && dense_->connected(); }
  const caf::actor& actor() const { return actor_; }
  //! the store's token (the owner's; a client's is the one it connected with)
  const std::string& token() const { return token_; }
  //! the protocol request another process sends (Info, AddKey, Flush, Refresh, Close), made here: the owner runs
  //! it with the store held, a connected client sends it to the owner
  store_response call(const store_request& req);
  //! listens on 127.0.0.1:`port` (0: any free port) for connect(); the owner of a dense store only
  uint16_t publish(uint16_t port);

  //! read / write calls handed to the store, and in how many store calls (merged batches)
  struct BatchStats {
    int64_t calls = 0;
    int64_t batches = 0;
    int64_t largest = 0;
    int64_t lane_calls = 0;  //!< of `calls`, those run on a lane (another connection), one store call each
  };
  BatchStats batch_stats() const;
  //! calls waiting for the store right now (for tests and diagnostics)
  size_t waiting() const;

 private:
  StoreClient() = default;
  static std::shared_ptr<StoreClient> spawn(std::shared_ptr<Runtime> rt, std::shared_ptr<backends::LeafStore> store,
                                            DenseStore* dense, std::string token);
  void run_void(const std::function<void(backends::LeafStore&)>& fn);
  struct Impl;
  std::shared_ptr<Impl> impl_;
  caf::actor actor_;
  DenseStore* dense_ = nullptr;
  std::string describe_, driver_, token_;
  JsonValue spec_fields_;
  bool writable_ = false;
  bool non_tensor_rows_ = true;
  std::mutex mu_;  // publish / close
  std::vector<uint16_t> ports_;
};

}  // namespace actors
}  // namespace tensordict
