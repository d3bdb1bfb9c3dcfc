#pragma once
//! tdx internals shared by its source files (api/tools/tdx*.cpp): paths and what a PATH argument names,
//! Redis addresses, the row layout of a store, safe output (escaped names, redacted addresses, a checked
//! stdout), and the subcommands. Not a library: only tdx includes it.
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/tensordict_store.hpp"

namespace tensordict::backends {}

namespace tdx {

namespace td = tensordict;
namespace tdb = tensordict::backends;
using td::JsonValue;

constexpr int kExitProblems = 1;
constexpr int kExitError = 2;

//! A fatal error for the user (printed as "tdx: <what>" on stderr, exit 2).
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------------------------------ paths
std::string join_path(const std::string& a, const std::string& b);
enum class PathKind { Missing, File, Directory, Other };
PathKind path_kind(const std::string& p, int64_t* size = nullptr);
//! ".h5" / ".hdf5" in any case ("X.H5" is an HDF5 file)
bool has_h5_extension(const std::string& p);
//! the HDF5 signature, or an HDF5 suffix
bool is_hdf5_file(const std::string& p);
//! The input must be an existing directory: clear errors otherwise (HDF5 files get their own message).
void check_input_dir(const std::string& path);
//! "" when `path` can be opened for reading, else the reason ("Permission denied"); works as root too
//! for what root cannot read either
std::string unreadable_reason(const std::string& path);

// ------------------------------------------------------------------------------------------ text
std::string human_bytes(int64_t n);
//! "1 leaf", "3 leaves"
std::string count(int64_t n, const std::string& one, const std::string& many);
std::string shape_str(const std::vector<int64_t>& s);
//! Truncates to `max` characters (on a UTF-8 boundary) with "..." when longer.
std::string truncate(const std::string& s, size_t max);
std::string short_dtype(at::ScalarType t);
//! A JSON value on one line (raw UTF-8); falls back to the escaped style if it is not valid UTF-8.
std::string json_line(const JsonValue& v);
//! the first line of a message (c10 errors carry a backtrace after it)
std::string first_line(std::string s);
//! control characters (C0, DEL and the UTF-8 encoded C1 range, so ANSI escapes too) as \xNN: a key or a
//! path is printed as text, never as terminal commands
std::string escape_text(const std::string& s);
//! a PATH argument as messages show it: a Redis URL without its password (td::redact_url), escaped
std::string shown(const std::string& path);
//! "sub/deeper/y", escaped
std::string key_str(const td::NestedKey& k);
//! throws ToolError when standard output could not be written (a full disk, /dev/full, a closed pipe)
void check_stdout();

// ------------------------------------------------------------------------------------------ inputs
//! what a PATH argument names
enum class InputKind { Memmap, H5, Redis };
bool is_redis_address(const std::string& s);
//! an existing input: a Redis address, an HDF5 file, or (anything else) a memmap directory
InputKind input_kind(const std::string& path);

//! an open input: the TensorDict (an HDF5 file's and a Redis store's read through their store actor), or a lazy
//! stack (a Redis lazy-stack store, read whole by TensorDictStore::load_lazy_stack; `td` is then its handle too)
struct Input {
  InputKind kind = InputKind::Memmap;
  td::TensorDict td;
  std::optional<td::LazyStackedTensorDict> lazy;
  //! the upstream class a user gets for it (loaded_type): "LazyStackedTensorDictStore" for a Redis lazy stack
  std::string type;
  //! the Python tensorclass the source records (a tensorclass directory's _type, a store's __tensorclass__;
  //! "" when none): what a convert records in DST
  std::string class_path;
  std::function<void()> close;
};
Input open_store_input(const std::string& path, InputKind kind);
//! the type a reader of this input gets, as upstream names it (dump's loaded_type, info's root line)
std::string input_type(const Input& in);

//! replaces the first dim of a shape by the batch's (a 1-row preview -> the full shape)
std::vector<int64_t> full_shape(std::vector<int64_t> shape, const td::BatchSize& batch);
//! a small read that shows every key, dtype and element shape: the first row (the whole TensorDict when
//! the batch is 0-dim or empty along dim 0)
td::TensorDict preview_of(const td::TensorDict& t);

//! one tensor leaf of a store: its key, dtype and element shape (the shape past every batch dim: what
//! from_schema takes)
struct LeafSpec {
  td::NestedKey key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> elem;  // shape without the batch dims (the whole shape for a 0-dim batch)
  int64_t row_bytes = 0;      // bytes per row of dim 0 (the batch's other dims included)
};

struct Layout {
  td::BatchSize batch;
  std::vector<LeafSpec> tensors;
  std::vector<std::pair<td::NestedKey, td::Entry>> non_tensors;
  //! the batch size of every sub-TensorDict (nested batches may be longer than the root's)
  std::vector<std::pair<td::NestedKey, td::BatchSize>> sub_batches;
  int64_t row_bytes = 0;  // tensor bytes per row (dim 0)
  //! saturates at INT64_MAX (a declared size may be absurd)
  int64_t total_bytes() const;
  //! a leaf's shape for `rows` rows of dim 0: [rows, batch[1:]..., elem...] (elem for a 0-dim batch)
  std::vector<int64_t> leaf_shape(const LeafSpec& s, int64_t rows) const;
};
Layout layout_of(const td::TensorDict& t);

constexpr int64_t kChunkBytes = int64_t(64) << 20;
//! rows per step so that a step moves at most ~64 MiB (at least one row)
int64_t rows_per_chunk(const Layout& l);
std::string store_root_line(const td::TensorDict& t);

// ------------------------------------------------------------------------------------------ subcommands
int cmd_info(const std::string& path, bool files, size_t width);

struct DumpOptions {
  bool json = false, compact = false, values = true;
  int indent = 2;
  int64_t threshold = 1000, edgeitems = 3;
  size_t width = 200;
};
int cmd_dump(const std::string& path, const DumpOptions& o);

struct VerifyOptions {
  bool quiet = false;
  //! stores (HDF5, Redis) declaring more tensor bytes are refused unless this is raised (0: no limit)
  int64_t max_bytes = int64_t(16) << 30;
};
int cmd_verify(const std::string& path, const VerifyOptions& o);

struct ConvertOptions {
  bool quiet = false;
  bool force = false;
  //! memmap / HDF5 DST: every file of the copy and its directories fsynced before the rename, the parent after
  bool durable = false;
};
int cmd_convert(const std::string& src_path, const std::string& dst_path, const ConvertOptions& o);

}  // namespace tdx
