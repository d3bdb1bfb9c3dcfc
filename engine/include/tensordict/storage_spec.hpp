#pragma once
//! Storage specs: a small JSON object naming a driver and where its storage lives, parsed without I/O, and the
//! registry of drivers, each opening and creating its storage (OpenMode). A spec is how another process (a
//! map worker, a store client, a loader worker) reopens the same storage:
//!   {"driver": "memmap", "path": "/data/buf"}
//!   {"driver": "shared", "handle": "<share_handle() bytes as hex>"}
//!   {"driver": "stack", "dim": 0, "members": [{"driver": "memmap", ...}, ...]}   (a lazy stack)
//! engine/ registers "memmap", "shared" and "stack"; upper layers register theirs (h5, redis) the same way, as
//! td.map's backend is registered (the engine never includes them).
//!
//! A spec carries its view (TensorStore's bound spec holds its transform): an optional "index" field selects
//! over the storage's batch, and open_storage opens the storage then indexes it (a view, no copy, for slices
//! and ints on memmap / shared; composed without I/O on HDF5 / Redis). Two forms:
//!   "index": [e0, e1, ...]   one element per leading batch dim, each dim selected on its own (the dims not
//!                            named are whole): an int k (the dim is dropped), a slice
//!                            {"start": a, "stop": b, "step": s} (s > 0), or a list of ints [i, j, ...]
//!   "index": {"shape": [...], "coords": [[...], ...]}   elements chosen jointly over every batch dim (a mask
//!                            over several dims, zipped index tensors, None): per source dim, the coordinate
//!                            of every result element in row-major order over "shape"
//! StorageSpec::of(td[a:b]) of a memmap / shared / HDF5 / Redis TensorDict writes the first form when the
//! selection has it, the second otherwise; a view of a view composes the indices.
#include <functional>
#include <string>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class ResolvedIndex;

class StorageSpec {
 public:
  //! parses the JSON text; ValueError when it is not an object with a string "driver", or when its "index"
  //! (or a stack's "dim" / "members") is malformed (no I/O)
  static StorageSpec parse(const std::string& text);
  //! a spec from its driver and fields (fields must be an object; "driver" is set from `driver`); validated
  //! as parse() does
  StorageSpec(std::string driver, JsonValue fields);
  //! the spec that reopens td's storage, as td sees it: memmap saved to a directory, shared memory
  //! (share_memory_()), a store node's storage (HDF5, Redis), a view of one of these (with its "index"), a lazy
  //! stack of such members; ValueError (naming `what`, or the member of a stack) for storage another process
  //! cannot reach (in-memory, anonymous memmap)
  static StorageSpec of(const TensorDict& td, const std::string& what = "the TensorDict");

  //! this spec seen through `index` (over the whole batch of the storage it names): "index" set to its
  //! encoding, or removed when `index` selects the whole batch in order. ValueError when the spec already
  //! carries an index (compose the ResolvedIndex instead)
  StorageSpec with_index(const ResolvedIndex& index) const;
  //! whether the spec carries an "index"
  bool has_index() const { return json_.find("index") != nullptr; }
  //! td (the storage this spec names, as opened) indexed by the spec's "index"; td itself without one
  TensorDict apply_index(const TensorDict& td) const;

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

//! what open_storage does with the storage a spec names (TensorStore's OpenMode): open the existing one,
//! create a new one from OpenOptions' schema and batch size (what from_schema does, with the driver's rules
//! for a storage already there: an HDF5 file is replaced, a memmap directory rewritten, a Redis td_id's keys
//! kept), or open it when it exists and create it otherwise
enum class OpenMode { open, create, open_or_create };

struct OpenOptions {
  //! map writable (memmap: MAP_SHARED when the files allow it)
  TD_ARG(bool, writable) = true;
  TD_ARG(OpenMode, mode) = OpenMode::open;
  //! create / open_or_create: the new storage's leaves (key -> element shape, dtype) and its batch size
  TD_ARG(Schema, schema) = {};
  TD_ARG(BatchSize, batch_size) = {};
};

using StorageOpener = std::function<TensorDict(const StorageSpec&, const OpenOptions&)>;
//! one driver of the registry: how it opens, creates and finds the storage a spec names. open_storage picks
//! the function from OpenOptions::mode(); a driver without `create` cannot create (ValueError naming it),
//! one without `exists` refuses open_or_create.
struct StorageDriver {
  //! opens the existing storage; the driver's own typed error when it is not there
  StorageOpener open;
  //! creates the storage from options.schema() / options.batch_size(); the spec's fields are the driver's
  //! options (a StorageOptions' fields(): from_schema passes them so)
  StorageOpener create;
  //! whether the storage the spec names exists (no data read)
  std::function<bool(const StorageSpec&)> exists;
};
//! registers (or replaces) `driver` ("memmap", "shared", "h5", "redis", ...); thread-safe
void register_storage_driver(const std::string& driver, StorageDriver functions);
//! the registered drivers, sorted
std::vector<std::string> storage_drivers();
//! opens or creates (OpenOptions::mode) the storage a spec names in this process; ValueError for an unknown
//! driver (listing the known ones) or a mode the driver cannot serve
TensorDict open_storage(const StorageSpec& spec, const OpenOptions& options = {});

//! the options of a storage from_schema creates through the registry (api/'s H5Options, RedisOptions):
//! TensorDict::from_schema(schema, batch, "h5", H5Options().filename(f)) is
//! open_storage(StorageSpec("h5", options.fields()), OpenOptions().mode(OpenMode::create).schema(..).batch_size(..))
struct StorageOptions {
  virtual ~StorageOptions() = default;
  //! the options as JSON fields (what the driver's create reads)
  virtual JsonValue fields() const = 0;
};

}  // namespace tensordict
