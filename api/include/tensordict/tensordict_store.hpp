#pragma once
//! TensorDictStore: a TensorDict whose node lives on a Redis server, in the key layout of Python's
//! TensorDictStore (tensordict/store), so Python reads what we write with the same td_id and the reverse.
//! One store actor per store owns its connection; one user call (td[idx], td[idx] = rows, to_tensordict)
//! is ONE pipeline covering every leaf, and calls from many producers waiting at the actor share pipelines.
//!
//!   auto buf = TensorDict::from_schema(schema, {100000}, "redis", RedisOptions().port(port)); // zero-filled
//!   buf.index_put_({i}, row);                                 // any thread / process with its own handle
//!   auto again = TensorDictStore::from_store(id, RedisOptions().port(port));
//!
//! Thread-safety: as a TensorDict; the store actor serialises the connection.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tensordict/lazy_stack.hpp"
#include "tensordict/storage_spec.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class Engine;
namespace backends {
struct RedisConnectOptions;
}

//! where a store lives; empty / negative fields take the engine config's redis.* values
struct RedisOptions : StorageOptions {
  TD_ARG(std::string, host) = "";
  TD_ARG(int, port) = 0;
  TD_ARG(int, db) = -1;
  //! a unix socket path instead of host:port
  TD_ARG(std::string, unix_socket) = "";
  //! the key namespace ("tensordict" by default, as Python)
  TD_ARG(std::string, prefix) = "";
  //! an ACL user (AUTH user password); empty: the default user
  TD_ARG(std::string, user) = "";
  //! empty: TENSORDICT_REDIS_PASSWORD (or the per-endpoint variable, backends/redis_client.hpp). Never printed:
  //! not in address(), messages, logs, nor in the storage spec other processes get (they read the environment,
  //! which td.map and the DataLoader's worker processes are given)
  TD_ARG(std::string, password) = "";
  //! the store's id (empty: a new uuid4 for a new store)
  TD_ARG(std::string, td_id) = "";
  //! reconnect attempts after a lost connection, and the pause between them
  TD_ARG(int, retries) = 3;
  TD_ARG(int, retry_delay_ms) = 100;
  TD_ARG(int, connect_timeout_ms) = 2000;
  //! a server that sends no byte for this long fails the call ("no reply from HOST:PORT within T s"); a long
  //! reply that keeps arriving is never cut. Negative: the config's redis.timeout_ms (5000); 0: no timeout
  TD_ARG(int, timeout_ms) = -1;
  //! write-behind (0: off, the default): row writes of this handle (`buf[i] = row`, index_put_, set_at) return
  //! once queued, their values copied, and the store actor sends what waits as one pipeline (one MULTI/EXEC of up
  //! to 256 writes), so producers keep the server busy instead of waiting a round trip per row. At most this many
  //! queued writes (then a write waits for the oldest). The first error of a queued write is raised by the next
  //! call of the handle (or of a view over it), by flush_writes() and by close(); every read and every other call
  //! first waits for the queued writes, so a handle reads what it wrote (another handle or process sees them once
  //! flush_writes() returned). Not upstream's (its writes are synchronous pipelines): for fills from many
  //! producers (bench/README.md, "bench_redis", 2026-11-28)
  TD_ARG(int, write_behind) = 0;
  TD_ARG(std::optional<at::Device>, device) = std::nullopt;
  //! the engine whose actor system runs the store actor (null: the default engine)
  TD_ARG(std::shared_ptr<Engine>, engine) = nullptr;

 public:
  JsonValue fields() const override;
  static RedisOptions from_fields(const JsonValue& fields);
  //! "redis://[[user][:password]@][host][:port][/db][?prefix=P&td_id=ID&timeout=SECONDS&password=PW&user=U]"
  //! (the standard Redis URL; parts left out take the config's values; user, password and the query values are
  //! percent-decoded). ValueError for anything else, its text with the secrets hidden (redact_url)
  static RedisOptions from_url(const std::string& url);
  //! the connection a store opened with these options makes (the config's redis.* values filled in, the same
  //! user, password, timeouts and retries; an empty password: the environment's), for a raw
  //! backends::RedisClient beside a store (<tensordict/backends/redis_client.hpp>)
  backends::RedisConnectOptions connect_options() const;
};

//! a redis:// URL with its password hidden ("user:***@", "password=***"), for messages and logs
std::string redact_url(const std::string& url);

class TensorDictStore : public TensorDict {
 public:
  //! a new empty store of `batch_size` (its keys are created by the first write to each, as upstream's
  //! check=False pattern: buf[i] = row preallocates every leaf at the full batch size)
  TensorDictStore(const BatchSize& batch_size, const RedisOptions& options = {});
  //! a new store holding td's values (one pipeline); KeyError-free even for nested TensorDicts
  static TensorDictStore from_tensordict(const TensorDict& td, const RedisOptions& options = {});
  //! a new zero-filled store: SETRANGE at each leaf's last byte, no tensor data leaves the process
  static TensorDictStore from_schema(const Schema& schema, const BatchSize& batch_size, const RedisOptions& options = {});
  //! reconnects to an existing store from any process; KeyError when the td_id has no __batch_size__
  static TensorDictStore from_store(const std::string& td_id, const RedisOptions& options = {});
  //! the handle of an existing store node (TypeError for another node kind)
  explicit TensorDictStore(const TensorDict& td);

  //! a lazy-stack store (Python's LazyStackedTensorDictStore: __type__ "lazy_stack") read into memory as a
  //! LazyStackedTensorDict; ragged members come back whole (upstream truncates them). KeyError when td_id is
  //! not a lazy-stack store. One round trip for the data.
  static LazyStackedTensorDict load_lazy_stack(const std::string& td_id, const RedisOptions& options = {});
  //! writes a lazy stack of tensor leaves as Python's TensorDictStore.from_tensordict(lazy_stack) does
  //! (element-major data, offset tables for ragged leaves); returns the new store's td_id
  static std::string save_lazy_stack(const LazyStackedTensorDict& td, const RedisOptions& options = {});
  //! whether td_id names a lazy-stack store (load_lazy_stack reads it) rather than a TensorDictStore (from_store)
  static bool is_lazy_stack(const std::string& td_id, const RedisOptions& options = {});
  //! the address of the store td_id under `options` (the config's redis.* values filled in), as address() gives
  //! it: for a lazy-stack store too
  static std::string address_of(const std::string& td_id, const RedisOptions& options = {});
  //! removes every key of the store `td_id` (a TensorDict or lazy-stack store, or what a failed write left of
  //! one); returns how many keys it removed. Handles open on it fail afterwards
  static int64_t remove(const std::string& td_id, const RedisOptions& options = {});
  //! switches the store written under `staged_td_id` in under `td_id`, atomically on the server (no client sees
  //! both or neither): the keys of `td_id` are removed and those of `staged_td_id` take their names. Returns how
  //! many keys moved. What tdx convert --force does to replace a store
  static int64_t replace(const std::string& td_id, const std::string& staged_td_id, const RedisOptions& options = {});

  //! the tensorclass path stored in __tensorclass__ ("module.QualName", as Python stores it; "" when none).
  //! from_tensordict of a TensorClass's tensordict() records its class path there.
  std::string tensorclass() const;
  void set_tensorclass(const std::string& class_path) const;

  const std::string& td_id() const;
  //! "redis://HOST:PORT/DB?prefix=P&td_id=ID" (what tdx and RedisOptions::from_url accept); never holds the
  //! user nor the password
  std::string address() const;
  //! disconnects; every handle and view over the store raises BackendError afterwards (the data stays). Queued
  //! writes (write_behind) are sent first, and the first error of one is raised after the store closed
  void close() const;
  //! waits until every queued write of this handle (RedisOptions::write_behind) is on the server; raises the
  //! first error of one, with its type. Nothing to do without write-behind
  void flush_writes() const;
  //! deletes every key of the store on the server (upstream clear_redis)
  void clear_redis() const;
  struct StoreStats {
    int64_t calls = 0;
    int64_t batches = 0;
    int64_t largest = 0;
    int64_t lane_calls = 0;  //!< of `calls`, those run on a second connection (Redis: config store.lanes)
  };
  //! row reads / writes the store actor ran, and in how many pipelines (merged batches)
  StoreStats store_stats() const;
};

}  // namespace tensordict
