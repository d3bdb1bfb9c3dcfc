#pragma once
//! Storage specs: a small JSON object naming a driver and where its storage lives, parsed without I/O, and the
//! registry of openers per driver. A spec is how another process (a map worker, a store client, a loader
//! worker) reopens the same storage:
//!   {"driver": "memmap", "path": "/data/buf"}
//!   {"driver": "shared", "handle": "<share_handle() bytes as hex>"}
//! engine/ registers "memmap" and "shared"; upper layers register theirs (h5, redis) the same way, as
//! td.map's backend is registered (the engine never includes them).
#include <functional>
#include <string>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class StorageSpec {
 public:
  //! parses the JSON text; ValueError when it is not an object with a string "driver" (no I/O)
  static StorageSpec parse(const std::string& text);
  //! a spec from its driver and fields (fields must be an object; "driver" is set from `driver`)
  StorageSpec(std::string driver, JsonValue fields);
  //! the spec that reopens td's storage: memmap saved to a directory, or shared memory (share_memory_());
  //! ValueError (naming `what`) for storage another process cannot reach (in-memory, anonymous memmap)
  static StorageSpec of(const TensorDict& td, const std::string& what = "the TensorDict");

  const std::string& driver() const { return driver_; }
  const JsonValue& json() const { return json_; }
  //! a required string field; ValueError naming the driver and field when missing or not a string
  const std::string& str(const std::string& field) const;
  //! the compact JSON text (what travels in messages)
  std::string dump() const { return json_.dump(); }

 private:
  std::string driver_;
  JsonValue json_;
};

struct OpenOptions {
  //! map writable (memmap: MAP_SHARED when the files allow it)
  TD_ARG(bool, writable) = true;
};

using StorageOpener = std::function<TensorDict(const StorageSpec&, const OpenOptions&)>;
//! registers (or replaces) the opener of `driver`; thread-safe
void register_storage_driver(const std::string& driver, StorageOpener opener);
//! the registered drivers, sorted
std::vector<std::string> storage_drivers();
//! opens the storage a spec names in this process; ValueError for an unknown driver (listing the known ones)
TensorDict open_storage(const StorageSpec& spec, const OpenOptions& options = {});

//! the options of a from_schema storage an upper layer registers (api/'s H5Options, RedisOptions):
//! TensorDict::from_schema(schema, batch, "h5", H5Options().filename(f))
struct StorageOptions {
  virtual ~StorageOptions() = default;
  //! the options as JSON fields (what the registered creator reads)
  virtual JsonValue fields() const = 0;
};

using SchemaCreator = std::function<TensorDict(const Schema&, const BatchSize&, const JsonValue& fields)>;
//! registers (or replaces) the from_schema creator of `storage` ("h5", "redis"); thread-safe
void register_schema_storage(const std::string& storage, SchemaCreator creator);
//! the registered creators' names, sorted (memory, memmap and shared are built in)
std::vector<std::string> schema_storages();

}  // namespace tensordict
