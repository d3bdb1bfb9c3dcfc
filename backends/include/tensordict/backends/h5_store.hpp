#pragma once
//! The HDF5 LeafStore: Python tensordict's PersistentTensorDict layout (shared/reference/upstream-formats.md
//! §2), i.e. h5py's: groups = nested levels, datasets = leaves, no attributes.
//!
//! Tensor dtypes as h5py writes numpy arrays: int8/16/32/64, uint8, float16 (IEEE half), float32/64,
//! bool = ENUM int8 {FALSE:0, TRUE:1}, complex64/128 = COMPOUND {r, i}. bfloat16 / complex32 (numpy has no
//! such dtype, upstream cannot write them) -> TypeError naming the key.
//! Non-tensors: a string is a scalar variable-length UTF-8 string dataset; any other value an OPAQUE
//! dataset tagged "NUMPY:" + numpy's dtype.str (h5py.opaque_dtype): int "<i8", float "<f8", bool "|b1",
//! a list of strings "<U n" (UCS-4). Unknown tags read back as JsonValue::Bytes and are re-written as is.
//!
//! Errors name the file and the dataset and carry HDF5's own message (its error stack).
//! Thread-safety: one store is used by one thread at a time (its actor); stores of different files may run
//! on different threads (see backends/README.md: the library build is checked at run time).
//! A store keeps the tensor datasets it reads or writes open until close(); the stores of one file in this
//! process drop them when one of them creates, erases or replaces a dataset (backends/README.md).
#include <memory>
#include <optional>
#include <string>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/leaf_store.hpp"

namespace tensordict {
namespace backends {

enum class H5Mode {
  Read,       //!< "r": read-only, the file must exist
  ReadWrite,  //!< "r+": read/write, the file must exist
  Write,      //!< "w": create, truncating an existing file
  Append,     //!< "a": read/write, created when missing
};

//! "r" | "r+" | "w" | "a" (ValueError otherwise)
H5Mode parse_h5_mode(const std::string& mode);
std::string to_string(H5Mode mode);

//! Opens (or creates) `file`; the store's root is the group `group` ({} = the file's root group; created
//! with its parents in modes "w"/"a", KeyError when missing in "r"/"r+"). `defaults` apply to create()
//! calls whose options are all defaults. `durable`: every write is in the file (the page cache) before it
//! returns, so a full disk fails the write itself (HDF5 flushes per write batch); false: h5py's behaviour,
//! writes stay in HDF5's caches until flush() / close(), where a full disk is reported instead.
//! Errors: BackendError (no such file, a directory, permissions, the file locked by another process),
//! FormatError (not an HDF5 file: truncated or corrupted), ValueError (bad mode / group path).
std::shared_ptr<LeafStore> open_h5_store(const std::string& file, H5Mode mode, const LeafPath& group = {},
                                         const CreateOptions& defaults = {}, bool durable = true);

//! whether a tensor of `dtype` can be stored (numpy has such a dtype); create() refuses the others with a TypeError
bool h5_can_store(at::ScalarType dtype);

//! Reopens a store from its spec_fields() ({"path", "group", "mode"[, "durable": false]}); `mode_override` replaces the
//! recorded mode (another process opens with H5Mode::Read). FormatError for malformed fields.
std::shared_ptr<LeafStore> open_h5_store(const JsonValue& spec_fields, std::optional<H5Mode> mode_override = std::nullopt);

}  // namespace backends
}  // namespace tensordict
