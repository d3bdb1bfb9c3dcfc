#pragma once
//! Store actors: one actor per open memmap / shared-memory store. It serialises what must be serialised —
//! adding a key (a new leaf file plus an atomic meta.json rewrite, or a new shared-memory segment), flush
//! (msync), refresh (leaves another process added to the directory) — and after every structural change
//! publishes a new immutable snapshot (TensorDict::shallow_copy) of the store's structure. Row reads and
//! writes never take the actor hop: the facade indexes the current snapshot, i.e. plain memory. Another
//! process (CAF middleman, 127.0.0.1) asks the actor for the storage handle and maps the storage itself.
//! Messages: messages.hpp ("store protocol").
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "tensordict/actors/messages.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {
namespace actors {

//! what a backend store implements; its methods run inside the store actor (one at a time)
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  //! "memmap" | "shared"
  virtual std::string kind() const = 0;
  //! the current structure (the snapshot the facade reads from)
  virtual TensorDict td() const = 0;
  //! a new leaf of the given full shape (batch size + feature shape) and dtype, zero-filled, or with
  //! `data`'s values when defined. KeyError: the key exists or a parent is missing; BatchSizeError: the
  //! shape does not start with the batch size; TypeError: a dtype the format cannot hold
  virtual void add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype, const at::Tensor& data) = 0;
  //! rows.keys at rows.index, one tensor per key in order (one request). Default: the leaves of td() in
  //! memory (ResolvedIndex::take: a view for a run of whole rows, a gather otherwise)
  virtual std::vector<at::Tensor> read(const store_rows& rows);
  //! rows.keys at rows.index = rows.values, in place (one request). Default: ResolvedIndex::put into td()
  virtual void write(const store_rows& rows);
  //! many reads at once: the calls the actor found waiting in its mailbox, in arrival order (a remote store
  //! turns them into one round trip, e.g. one Redis pipeline for many producers). Default: one by one
  virtual std::vector<std::vector<at::Tensor>> read_batch(const std::vector<const store_rows*>& reads) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(reads.size());
    for (const store_rows* r : reads) out.push_back(read(*r));
    return out;
  }
  //! many writes at once, in arrival order (later writes win where they overlap). Default: one by one
  virtual void write_batch(const std::vector<const store_rows*>& writes) {
    for (const store_rows* w : writes) write(*w);
  }
  virtual void flush() = 0;
  virtual void refresh() = 0;
  //! the storage spec another process opens (open_storage): memmap directory or shared-memory handle
  virtual StorageSpec spec() const = 0;
  //! bytes a new leaf may still take (the free space of the directory's file system, or of /dev/shm); -1: unknown
  virtual int64_t space_left() const { return -1; }
  virtual void close() = 0;
};

//! a store over a memmap TensorDict saved to a directory (ValueError otherwise)
std::shared_ptr<StoreBackend> make_memmap_store(const TensorDict& td);
//! a store over a share_memory_()'d TensorDict (ValueError otherwise)
std::shared_ptr<StoreBackend> make_shared_store(const TensorDict& td);

//! what the store actor shares with the in-process facade: the published snapshot, liveness, and the
//! calls in flight (failed with a BackendError when the actor terminates, so no caller waits on a dead
//! actor until its timeout)
class StoreShared {
 public:
  TensorDict snapshot() const;
  int64_t version() const;
  void publish(const TensorDict& td, int64_t version);
  //! registers a call before it is sent; false (and nothing registered) when the actor is gone
  bool begin(const store_call_ptr& call, std::string* why);
  void end(const store_call_ptr& call);
  //! the actor terminated: fails every registered call, refuses new ones
  void fail_all(const std::string& why);
  //! row reads / writes the actor handed its backend, and in how many batches (drained together)
  struct BatchStats {
    int64_t calls = 0;
    int64_t batches = 0;
    int64_t largest = 0;
  };
  BatchStats batch_stats() const;
  void count_batch(int64_t calls);

 private:
  mutable std::mutex mu_;
  TensorDict snapshot_ = TensorDict::undefined();
  int64_t version_ = 0;
  bool alive_ = true;
  std::string why_dead_;
  std::set<store_call_ptr> calls_;
  BatchStats stats_;
};

//! what a store actor checks beyond its backend
struct StoreGuard {
  //! requests from another node (or with no sender) must carry it; empty: such requests are all refused
  std::string token;
  //! the largest new leaf add_key creates (config store.max_key_bytes); 0: no limit but the space left
  int64_t max_key_bytes = 0;
};

//! a new store token: 128 random bits from /dev/urandom as 32 hex digits (BackendError when it cannot be read)
std::string new_store_token();

//! spawns the store actor for `backend` (a HotActor: a thread of its own, spinning `spin` on its empty
//! mailbox before it blocks); it publishes its first snapshot into `shared` before this returns
caf::actor spawn_store_actor(caf::actor_system& system, std::shared_ptr<StoreBackend> backend,
                             std::shared_ptr<StoreShared> shared, std::chrono::microseconds spin,
                             StoreGuard guard = {});

//! one in-process request through `shared`'s actor: spins `spin`, then blocks until `timeout`;
//! rethrows the store's error with its type; BackendError when the actor is gone or does not reply
StoreResult store_call_blocking(const caf::actor& actor, StoreShared& shared, store_call_ptr call,
                                std::chrono::microseconds spin, std::chrono::milliseconds timeout);

//! one request to a (possibly remote) store actor with a caf::scoped_actor; rethrows the store's error
//! with its type; BackendError when the actor is unreachable, down or silent for `timeout`
store_response store_request_blocking(caf::actor_system& system, const caf::actor& actor, const store_request& req,
                                      std::chrono::milliseconds timeout);

class Runtime;

//! the facade's side of one store (api/'s Store wraps it): the owner's in-process link to its actor, or a
//! client in another process connected through the middleman, with its own mapping of the storage
class StoreClient {
 public:
  //! spawns the store actor for `backend` on rt's system, with a new token (new_store_token) and the config's
  //! store.max_key_bytes
  static std::shared_ptr<StoreClient> open(std::shared_ptr<Runtime> rt, std::shared_ptr<StoreBackend> backend);
  //! connects to a published store actor and maps its storage (BackendError when unreachable, or refused: a
  //! missing or wrong token). An empty `token` is read from the environment variable TENSORDICT_STORE_TOKEN.
  static std::shared_ptr<StoreClient> connect(std::shared_ptr<Runtime> rt, const std::string& host, uint16_t port,
                                              const std::string& token = "");
  //! the owner stops its actor (no flush: close() flushes); a client just drops its proxy
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  bool remote() const { return remote_; }
  const std::string& kind() const { return kind_; }
  const caf::actor& actor() const { return actor_; }
  //! the store's token (the owner's; a client's is the one it connected with)
  const std::string& token() const { return token_; }
  TensorDict snapshot() const { return shared_->snapshot(); }
  int64_t version() const { return shared_->version(); }
  StoreShared::BatchStats batch_stats() const { return shared_->batch_stats(); }
  //! one request: in-process through the reply slot, remote through a scoped_actor request (no payload)
  StoreResult call(const store_request& req, store_rows rows = {}, const at::Tensor& tensor = at::Tensor());
  //! remote: asks the owner for the current structure and re-maps when it changed; owner: StoreOp::Refresh
  void refresh();
  uint16_t publish(uint16_t port);
  void close();

 private:
  StoreClient() = default;
  void adopt_remote(const store_response& r);
  std::shared_ptr<Runtime> rt_;  // first: outlives the actor handle
  caf::actor actor_;
  std::shared_ptr<StoreShared> shared_ = std::make_shared<StoreShared>();
  bool remote_ = false;
  bool closed_ = false;
  std::string kind_;
  std::string token_;
  std::vector<uint16_t> ports_;
  std::mutex mu_;  // remote refresh / publish / close
};

//! leaves (key, dtype, shape) of a TensorDict, as the protocol lists them
std::vector<store_leaf> describe_leaves(const TensorDict& td);

}  // namespace actors
}  // namespace tensordict
