#pragma once
//! PersistentTensorDict: a TensorDict whose node is an HDF5 file or group in h5py's layout (upstream's
//! PersistentTensorDict): groups are sub-TensorDicts, datasets leaves, no attributes. Every access goes
//! through the file's store actor as ONE request per user call; `td[idx]` is a lazy view over the same
//! file (no I/O) that reads on get / to_tensordict() / iteration, and writes through it land in the file.
//!
//!   auto h5 = PersistentTensorDict::from_h5("data.h5");                 // batch sizes inferred
//!   TensorDict rows = h5.index({at::tensor({7, 3, 7})}).to_tensordict(); // unsorted, repeated: fine
//!   auto buf = TensorDict::from_schema(schema, {n}, "h5", H5Options().filename("buf.h5"));
//!
//! Thread-safety: as a TensorDict; the store actor serialises the file's accesses.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/storage_spec.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

class Engine;

//! how an HDF5 file is opened and how its datasets are created (h5py's create_dataset kwargs)
struct H5Options : StorageOptions {
  //! the file (from_schema / from_dict / to_h5)
  TD_ARG(std::string, filename) = "";
  //! "r" | "r+" | "w" (create / truncate) | "a" (open or create)
  TD_ARG(std::string, mode) = "r";
  //! chunk shape of new datasets (empty: contiguous, or ~1 MiB chunks when compressed)
  TD_ARG(std::vector<int64_t>, chunks) = {};
  //! gzip level 0-9 of new datasets; -1: none (h5py's default)
  TD_ARG(int, compression_level) = -1;
  TD_ARG(bool, shuffle) = false;
  //! true: a write returns once its rows are in the file (the page cache), so a full disk fails that write
  //! and no acknowledged row is lost (HDF5 flushes per write; costly for compressed chunks, which are
  //! re-compressed per write). false: h5py's behaviour, rows stay in HDF5's caches until flush() / close(),
  //! and a full disk is reported there: rows written since the last flush can be lost.
  TD_ARG(bool, durable) = true;
  //! the batch size (nullopt: inferred per group from the datasets' shapes, as upstream's from_h5)
  TD_ARG(std::optional<BatchSize>, batch_size) = std::nullopt;
  TD_ARG(std::optional<at::Device>, device) = std::nullopt;
  //! the engine whose actor system runs the file's store actor (null: the default engine)
  TD_ARG(std::shared_ptr<Engine>, engine) = nullptr;

 public:
  JsonValue fields() const override;
  //! the options back from fields() (what from_schema's registered creator gets)
  static H5Options from_fields(const JsonValue& fields);
};

class PersistentTensorDict : public TensorDict {
 public:
  //! opens a file (mode "r" by default); batch sizes inferred unless options.batch_size() is given.
  //! BackendError: missing file, a directory, a file locked by another writer; FormatError: not an HDF5
  //! file (truncated, corrupted); BatchSizeError: a dataset whose leading dims disagree with the batch
  static PersistentTensorDict from_h5(const std::string& filename, const H5Options& options = {});
  static PersistentTensorDict from_h5(const std::string& filename, const std::string& mode);
  //! opens (mode "r+" / "a" / "w") with the given batch size; nested groups take it too
  PersistentTensorDict(const std::string& filename, const BatchSize& batch_size, const std::string& mode = "r");
  //! writes td into a new file (mode "w" unless options say otherwise) and returns it open
  static PersistentTensorDict from_dict(const TensorDict& td, const std::string& filename,
                                        const H5Options& options = {});
  //! the handle of an existing PersistentTensorDict node (TypeError for another node kind)
  explicit PersistentTensorDict(const TensorDict& td);

  const std::string& filename() const;
  std::string mode() const;
  //! the group this handle's root is ("/" for the file)
  std::string group() const;
  //! closes the file; every handle and view over it raises BackendError afterwards
  void close() const;
  //! msync-like: H5Fflush
  void flush() const;
  //! row reads / writes the file's store actor ran, and in how many merged batches
  struct StoreStats {
    int64_t calls = 0;
    int64_t batches = 0;
    int64_t largest = 0;
    int64_t lane_calls = 0;  //!< of `calls`, those run on a second connection (Redis: config store.lanes)
  };
  StoreStats store_stats() const;
};

//! td written to an HDF5 file in h5py's layout (mode "w"), returned open; what td.to_h5(file) does
PersistentTensorDict to_h5(const TensorDict& td, const std::string& filename, const H5Options& options = {});

}  // namespace tensordict
