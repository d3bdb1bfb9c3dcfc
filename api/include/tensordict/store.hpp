#pragma once
//! Store: a memmap directory or a shared-memory TensorDict behind its store actor, in the one store stack
//! (actors/store_client.hpp: the same interface, actor and client as HDF5 and Redis stores). Many threads and
//! processes share one store: rows are read and written directly in memory (`get`, `set_`, `td()`: no actor,
//! no lock), while what must be serialised runs with the store held, ONE call per user call — adding a key
//! (new leaf file + atomic meta.json rewrite, or a new shared-memory segment), flush, refresh.
//! Another process `connect`s to a store that was `publish`ed on 127.0.0.1 and maps the same storage
//! (zero-copy); its add_key goes to the owner's actor, so concurrent producers never lose a key. Every store
//! has a random token (128 bits, `token()`): another process must show it (`connect(host, port, token)`, or the
//! environment variable TENSORDICT_STORE_TOKEN, or a file `save_token` wrote with mode 0600), else each of its
//! requests is refused with a BackendError and nothing is done. A new key is checked against the space left
//! (the directory's file system, or /dev/shm) and the config's store.max_key_bytes before anything is made.
//!
//!   auto buf = TensorDict::from_schema(schema, {n}, "memmap", MemmapOptions().prefix(dir));
//!   tensordict::Store store = tensordict::Store::open(buf);
//!   store.set_({i}, row);                 // direct, any thread
//!   store.add_key("reward", at::zeros({n}));   // through the actor; every process sees it after refresh()
//!
//! Thread-safety: every method may be called from any thread. A snapshot (`td()`) is immutable in
//! structure; add_key/refresh publish a new one. No CAF in this header.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class Engine;
namespace actors {
class StoreClient;
}

class Store {
 public:
  //! a store over a memmap TensorDict saved to a directory, or over a shared (share_memory_()'d) one;
  //! ValueError for anything else. Runs on `engine` (the default engine when null).
  static Store open(const TensorDict& td, const std::shared_ptr<Engine>& engine = nullptr);
  //! a store over the memmap directory `prefix` (loaded writable)
  static Store open_memmap(const std::string& prefix, const std::shared_ptr<Engine>& engine = nullptr);
  //! connects to a store another process published on host:port and maps its storage here (zero-copy), showing
  //! the owner's `token()`; BackendError when nothing listens there, it does not answer within
  //! request_timeout_ms, or it refuses the token
  static Store connect(const std::string& host, uint16_t port, const std::string& token,
                       const std::shared_ptr<Engine>& engine = nullptr);
  //! as above, the token read from the environment variable TENSORDICT_STORE_TOKEN
  static Store connect(const std::string& host, uint16_t port, const std::shared_ptr<Engine>& engine = nullptr);
  //! a token save_token wrote: ValueError when the file can be read or written by anyone but its owner (this
  //! user), BackendError when it cannot be read
  static std::string load_token(const std::string& path);

  //! the store as a TensorDict (upstream's store-backed TensorDict): every operation works on it. Reads and
  //! row writes go straight to the storage (zero-copy views of the current snapshot); setting a key the
  //! store lacks adds it through the store actor (add_key), so every process sharing the store sees it;
  //! removing keys is a NotImplementedError. Operations that produce a new TensorDict (apply, clone,
  //! shape ops...) give ordinary in-memory results.
  TensorDict tensordict() const;
  //! "memmap" | "shared"
  std::string kind() const;
  bool is_remote() const;
  //! the current snapshot: plain memory, reads and writes need no actor
  TensorDict td() const;
  BatchSize batch_size() const;
  //! leaf keys of the snapshot
  std::vector<NestedKey> keys() const;
  //! structural version: bumped by every add_key/refresh of the owner
  int64_t version() const;

  //! td()[index] (direct; slices are views of the storage)
  TensorDict get(const Index& index) const;
  //! td()[index] = value, in place (direct)
  void set_(const Index& index, const TensorDict& value) const;

  //! a new leaf filled with `value` (shape = batch size + feature shape); through the actor
  void add_key(const NestedKey& key, const at::Tensor& value) const;
  //! a new zero-filled leaf of `shape` (batch size + feature shape) and `dtype`; through the actor
  void add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) const;
  //! msync every leaf (memmap); through the actor
  void flush() const;
  //! picks up leaves added by others (another store on the same directory, or the owner of a connected
  //! store); through the actor
  void refresh() const;

  //! td[index] / td[index] = value as ONE actor request covering every leaf (the path a store that is not
  //! plain memory takes; here mostly for measuring the hop). Not for connected stores (ValueError).
  //! The request is backend-neutral (actors::store_rows): the keys, the index resolved here against the
  //! batch (IndexError / TypeError before any hop) and, for a write, one value per key already broadcast to
  //! the selection (KeyError for a key the store lacks, ValueError for a value that does not broadcast:
  //! nothing is written)
  TensorDict read(const Index& index) const;
  //! only `keys` (leaves of the store) at index
  TensorDict read(const std::vector<NestedKey>& keys, const Index& index) const;
  void write(const Index& index, const TensorDict& value) const;

  //! listens on 127.0.0.1:`port` (0: any free port) for connect(); returns the port. Clients need token().
  uint16_t publish(uint16_t port = 0) const;
  //! the store's token (32 hex digits; a client's: the one it connected with). A secret: hand it to the
  //! processes you trust through their environment (TENSORDICT_STORE_TOKEN) or save_token, never a command line
  std::string token() const;
  //! writes token() into a new file `path` with mode 0600 (written beside it, then renamed); BackendError
  void save_token(const std::string& path) const;
  //! flushes and stops the actor (owner) or disconnects (client); later actor calls raise BackendError,
  //! direct row access on snapshots taken before stays valid
  void close() const;

  //! internal (tests): the actors-layer client
  const std::shared_ptr<actors::StoreClient>& client() const { return client_; }

 private:
  explicit Store(std::shared_ptr<actors::StoreClient> client) : client_(std::move(client)) {}
  std::shared_ptr<actors::StoreClient> client_;
};

}  // namespace tensordict
