#pragma once
//! LeafStore: the narrow interface of a storage whose leaves are not in this process's memory (an HDF5 file,
//! a Redis store). It knows paths, dtypes, shapes and rows along dim 0, nothing of TensorDicts: the engine's
//! remote node (api/) turns a resolved index into the rows each leaf needs, asks for ALL leaves of one user
//! call in ONE batched read or write, and re-indexes the rows in memory. Every method runs inside the
//! store's actor (one call at a time), so an implementation needs no locking of its own.
//!
//! Paths: a leaf or group path is a list of key parts, {"sub", "x"} (h5: "/sub/x"; redis: "sub.x").
//! Rows: ascending, unique positions along dim 0 of a leaf (the caller sorts and deduplicates, as h5py
//! requires; the remote node un-permutes in memory). A read of rows returns a contiguous tensor
//! [rows.size(), shape[1:]...]; a read without rows returns the whole leaf.
//! Errors (backends/errors.hpp): KeyError (missing path), FormatError (a file or key that is malformed,
//! naming the file/key and the dataset), TypeError (a dtype the format cannot hold), BackendError (I/O,
//! connection, locking), ValueError (read-only store written, bad shapes), NotImplementedError.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/row_list.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

using LeafPath = std::vector<std::string>;

enum class LeafKind {
  Tensor,     //!< a dense tensor (h5 dataset of a numeric / bool / complex type; redis d: + m: keys)
  NonTensor,  //!< a non-tensor value (h5 string / opaque scalar dataset; redis is_non_tensor)
  Group,      //!< a nested level (h5 group; redis: implied by a leaf path "a.b")
};

//! a dtype the format maps to torch's, with numpy's spelling where a format records it
struct LeafInfo {
  LeafPath path;
  LeafKind kind = LeafKind::Tensor;
  at::ScalarType dtype = at::kFloat;  //!< Tensor only
  std::vector<int64_t> shape;         //!< Tensor: the full shape (dim 0 = the rows)
  //! NonTensor: the shape upstream's batch inference (from_h5, _set_max_batch_size) counts it with, as it
  //! counts an array: an h5 opaque dataset of a numpy number or bool (h5py's encoding of int / float / bool
  //! values, [] for one value); nullopt: the inference skips it (strings, other values)
  std::optional<std::vector<int64_t>> inferred_shape = std::nullopt;
};

//! a non-tensor value as a store keeps it: one value broadcast over the batch (NonTensorData), or, when
//! `stacked`, `value` is an array of one value per row along dim 0 (redis `json_array`: a NonTensorStack)
struct NonTensorValue {
  JsonValue value;
  bool stacked = false;
};

//! one leaf to read in a batched read: the whole leaf when `rows` is empty and `whole` is set
struct LeafRead {
  LeafPath path;
  bool whole = true;
  RowList rows;  //!< ascending, unique (used when !whole); one list shared by the leaves of a call
  //! the shape of the tensor returned, when given: the same elements as [rows.size(), shape[1:]...] (td[i]
  //! of a row store wants [f], not [1, f]: the store builds it so, saving a reshape); ValueError otherwise
  std::optional<std::vector<int64_t>> shape = std::nullopt;
};

//! one leaf to write: `data` holds the elements of [rows.size(), shape[1:]...] (or of the full shape when
//! `whole`) in row-major order, already in the leaf's dtype; only its element count is checked, so a row
//! [f] written at rows {i} needs no reshape to [1, f] (a dispatched op per leaf on the hot path)
struct LeafWrite {
  LeafPath path;
  bool whole = true;
  RowList rows;  //!< ascending, unique (used when !whole); one list shared by the leaves of a call
  at::Tensor data;
};

//! how new datasets are created (h5: chunking / gzip / shuffle; ignored by stores without such options)
struct CreateOptions {
  std::vector<int64_t> chunks;  //!< chunk shape (empty: contiguous unless a filter needs chunks)
  int compression_level = -1;   //!< gzip level 0-9; -1: no compression
  bool shuffle = false;
};

class LeafStore {
 public:
  virtual ~LeafStore() = default;
  //! the storage-spec driver: "h5" | "redis"
  virtual std::string driver() const = 0;
  //! the storage spec's fields (without "driver") that reopen this store in another process, e.g.
  //! {"path": "/data/x.h5", "group": "/sub", "mode": "r"} or {"host":..,"port":..,"db":..,"prefix":..,"td_id":..}
  virtual JsonValue spec_fields() const = 0;
  //! what the store is, for messages: "HDF5 file /data/x.h5" | "Redis store tensordict:{id} at 127.0.0.1:6379"
  virtual std::string describe() const = 0;
  virtual bool writable() const = 0;

  //! the batch size the storage records (redis: __batch_size__), nullopt when the format records none
  //! (h5: the caller infers it from the shapes as upstream does)
  virtual std::optional<std::vector<int64_t>> stored_batch_size() const = 0;
  //! records the batch size where the format has a place for it (redis); no-op otherwise
  virtual void set_stored_batch_size(const std::vector<int64_t>& batch) = 0;
  //! every group and leaf under the root, parents before children, in the storage's order
  virtual std::vector<LeafInfo> list() = 0;

  //! batched reads: one tensor per request, in order (ONE round trip / one pass for all of them)
  virtual std::vector<at::Tensor> read(const std::vector<LeafRead>& reads) = 0;
  //! batched writes, applied in order; atomic where the storage can make it so (redis: MULTI/EXEC)
  virtual void write(const std::vector<LeafWrite>& writes) = 0;

  //! a new tensor leaf of `shape` and `dtype`: with `data`'s values when defined (same shape), else zeros
  //! WITHOUT writing them (h5 fill value; redis SETRANGE at the last byte). Missing parent groups are created.
  //! KeyError when the path exists; TypeError for a dtype the format cannot hold (h5: bfloat16)
  virtual void create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
                      const at::Tensor& data, const CreateOptions& options) = 0;
  //! a new (empty) group; its parents too. No-op for stores where levels are implicit (redis)
  virtual void create_group(const LeafPath& path) = 0;
  //! removes a leaf or a whole group; false when missing
  virtual bool erase(const LeafPath& path) = 0;
  //! moves a leaf or a whole group to `to` (missing: a KeyError; `to` must not exist). A replaced key is written
  //! under a staging name and moved over the old one only once it is complete (RemoteNode::put): a value the
  //! store refuses part-way leaves the old one as it was. NotImplementedError for a store that cannot
  virtual void move(const LeafPath& from, const LeafPath& to) {
    (void)from;
    (void)to;
    throw NotImplementedError(describe() + " cannot move a key");
  }
  //! moves `from` over `to`, whose old leaf or group (when there is one) goes in the same step; what lies under
  //! `from` inside `to` is moved, not dropped. A store that can (redis: one script) does both at once, so a
  //! failure between them (a lost connection) cannot leave `to` erased and `from` unmoved; the default erases,
  //! then moves (an HDF5 file in this process): `from` is first moved aside, beside `to`, so that a missing `from`
  //! (a KeyError) erases nothing and a `from` inside `to` is not erased with it
  virtual void replace(const LeafPath& from, const LeafPath& to) {
    if (to.empty()) throw ValueError(describe() + ": cannot replace the root");
    LeafPath aside = to;
    aside.back() = "__td_moving_" + aside.back();
    erase(aside);  // left by a process killed mid-replacement
    move(from, aside);
    erase(to);
    move(aside, to);
  }

  virtual NonTensorValue read_non_tensor(const LeafPath& path) = 0;
  //! writes (creating or replacing) a non-tensor leaf
  virtual void write_non_tensor(const LeafPath& path, const NonTensorValue& value) = 0;

  //! the class path of the tensorclass the storage holds (redis __tensorclass__, Python's "module.QualName");
  //! "" when none, or for a format without a place for it (the default: h5py files record none)
  virtual std::string tensorclass() const { return {}; }
  //! records the tensorclass path; NotImplementedError naming the store for a format without a place for it
  virtual void set_tensorclass(const std::string& class_path) {
    (void)class_path;
    throw NotImplementedError(describe() + " records no tensorclass");
  }
  //! how a NonTensorStack written whole (set(key, stack)) is kept: true when the format holds it as ONE value, the
  //! list of the stack's values, and reads it back as a stack (redis: Python's json blob); false (the default) when
  //! it is written one value per row (h5 refuses that: one value per dataset)
  virtual bool stack_as_one_value() const { return false; }
  //! a non-tensor can hold one value per row (written at a selection of rows); HDF5 holds one value per dataset
  virtual bool holds_non_tensor_rows() const { return true; }
  //! removes every leaf and group; a store with records of its own removes those too (redis: __batch_size__,
  //! __device__, __keys__, as upstream's clear_redis; __tensorclass__ stays, as there)
  virtual void clear() {
    for (const auto& info : list())
      if (info.path.size() == 1) erase(info.path);
  }

  //! how to open a lane: another connection to the same storage, on which StoreClient runs a synchronous `read` /
  //! `write` that finds this one busy (redis: a RedisStore of the same td_id). Empty (the default) for a store
  //! without (one file handle, memory). Taken once when the store's client starts; the opener must not refer to
  //! this store (it runs on other threads while this one is in use)
  virtual std::function<std::shared_ptr<LeafStore>()> lane_opener() const { return {}; }
  //! forgets what it cached about the structure (a lane, after a structural change made on another connection)
  virtual void forget_structure() {}

  //! pushes buffered data to the storage (h5: H5Fflush)
  virtual void flush() = 0;
  //! releases the file / connection; later calls raise BackendError naming the store
  virtual void close() = 0;
};

}  // namespace backends
}  // namespace tensordict
