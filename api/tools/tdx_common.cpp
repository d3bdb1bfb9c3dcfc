// tdx: the helpers its subcommands share (tdx_common.hpp): paths, text, Redis addresses, store layouts.
#include "tensordict/backends/shape_text.hpp"
#include "tdx_common.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "tensordict/describe.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/persistent.hpp"
#include "tensordict/tree.hpp"

namespace tdx {

// ------------------------------------------------------------------------------------------ small helpers
std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

PathKind path_kind(const std::string& p, int64_t* size) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return PathKind::Missing;
  if (size) *size = static_cast<int64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) return PathKind::File;
  if (S_ISDIR(st.st_mode)) return PathKind::Directory;
  return PathKind::Other;
}

bool has_h5_extension(const std::string& p) {
  auto ends = [&](const std::string& s) {
    if (p.size() < s.size()) return false;
    return std::equal(s.begin(), s.end(), p.end() - static_cast<std::ptrdiff_t>(s.size()),
                      [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
  };
  return ends(".h5") || ends(".hdf5");
}

bool is_hdf5_file(const std::string& p) {
  static const char sig[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::ifstream in(p, std::ios::binary);
  char buf[8] = {};
  if (in.read(buf, 8) && std::memcmp(buf, sig, 8) == 0) return true;
  return has_h5_extension(p);
}

//! The input must be an existing directory: clear errors otherwise (HDF5 files get their own message).
void check_input_dir(const std::string& path) {
  switch (path_kind(path)) {
    case PathKind::Directory: return;
    case PathKind::Missing: throw ToolError("'" + shown(path) + "': no such file or directory");
    case PathKind::File:
      if (is_hdf5_file(path))
        throw ToolError("'" + shown(path) + "' is an HDF5 file: not a memmap directory");
      throw ToolError("'" + shown(path) + "' is not a directory (tdx reads memmap directories holding a meta.json)");
    case PathKind::Other: throw ToolError("'" + shown(path) + "' is not a directory");
  }
}

std::string unreadable_reason(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return std::strerror(errno);
  char b;
  const ssize_t n = ::pread(fd, &b, 1, 0);  // an open that succeeds may still fail to read (EIO)
  const int err = errno;
  ::close(fd);
  return n < 0 ? std::strerror(err) : "";
}

std::string human_bytes(int64_t n) {
  if (n < 1024) return std::to_string(n) + " B";
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

//! "1 leaf", "3 leaves"
std::string count(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string shape_str(const std::vector<int64_t>& s) { return tensordict::shape_text(s); }

//! Truncates to `max` characters (on a UTF-8 boundary) with "..." when longer.
std::string truncate(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max > 3 ? max - 3 : 0;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

std::string short_dtype(at::ScalarType t) {
  std::string s = td::dtype_repr(t);
  return s.rfind("torch.", 0) == 0 ? s.substr(6) : s;
}

//! A JSON value on one line (raw UTF-8); falls back to the escaped style if it is not valid UTF-8.
std::string json_line(const JsonValue& v) {
  try {
    return v.dump(JsonValue::Style::Compact);
  } catch (const std::exception&) {
    return v.dump(JsonValue::Style::PythonCompact);
  }
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

std::string escape_text(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02x", c);
    out += b;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      hex(c);
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {  // U+0080..U+009F: C1 controls (CSI is U+009B)
      hex(c);
      hex(static_cast<unsigned char>(s[++i]));
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string shown(const std::string& path) { return escape_text(td::redact_url(path)); }

std::string key_str(const td::NestedKey& k) {
  std::string out;
  for (size_t i = 0; i < k.size(); ++i) out += (i ? "/" : "") + k[i];
  return escape_text(out);
}

void check_stdout() {
  std::cout.flush();
  errno = 0;
  if (std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int err = errno;
    std::cout.clear();
    std::clearerr(stdout);
    throw ToolError(std::string("cannot write to standard output") + (err ? std::string(": ") + std::strerror(err) : ""));
  }
}

// ------------------------------------------------------------------------------------------ HDF5 files, Redis stores

bool is_redis_address(const std::string& s) { return s.rfind("redis://", 0) == 0; }

//! an existing input: a Redis address, an HDF5 file, or (anything else) a memmap directory
InputKind input_kind(const std::string& path) {
  if (is_redis_address(path)) return InputKind::Redis;
  if (path_kind(path) == PathKind::File && is_hdf5_file(path)) return InputKind::H5;
  return InputKind::Memmap;
}

Input open_store_input(const std::string& path, InputKind kind) {
  Input in;
  in.kind = kind;
  if (kind == InputKind::H5) {
    td::PersistentTensorDict h5 = td::PersistentTensorDict::from_h5(path, td::H5Options().mode("r"));
    in.close = [h5] { h5.close(); };
    in.td = h5;
  } else {
    td::RedisOptions o = td::RedisOptions::from_url(path);
    if (o.td_id().empty()) throw ToolError("'" + shown(path) + "': the address names no store (add &td_id=ID)");
    if (td::TensorDictStore::is_lazy_stack(o.td_id(), o)) {  // Python's LazyStackedTensorDictStore
      in.lazy.emplace(td::TensorDictStore::load_lazy_stack(o.td_id(), o));
      in.td = *in.lazy;
      in.type = "LazyStackedTensorDictStore";
      in.close = [] {};
      return in;
    }
    td::TensorDictStore s = td::TensorDictStore::from_store(o.td_id(), o);
    in.close = [s] { s.close(); };
    in.td = s;
    in.class_path = s.tensorclass();
  }
  return in;
}

std::string input_type(const Input& in) {
  if (!in.type.empty()) return in.type;
  return in.lazy ? std::string("LazyStackedTensorDict") : in.td.type_name();
}

std::vector<int64_t> full_shape(std::vector<int64_t> shape, const td::BatchSize& batch) {
  if (!batch.empty() && !shape.empty()) shape[0] = batch[0];
  return shape;
}

td::TensorDict preview_of(const td::TensorDict& t) {
  const td::BatchSize b = t.batch_size();
  if (!b.empty() && b[0] > 1) return t.index({at::indexing::Slice(0, 1)}).to_tensordict();
  return t.to_tensordict();
}

int64_t Layout::total_bytes() const {
  if (batch.empty()) return row_bytes;
  int64_t out = 0;
  return __builtin_mul_overflow(row_bytes, batch[0], &out) ? std::numeric_limits<int64_t>::max() : out;
}

std::vector<int64_t> Layout::leaf_shape(const LeafSpec& s, int64_t rows) const {
  if (batch.empty()) return s.elem;
  std::vector<int64_t> out{rows};
  out.insert(out.end(), batch.begin() + 1, batch.end());
  out.insert(out.end(), s.elem.begin(), s.elem.end());
  return out;
}

Layout layout_of(const td::TensorDict& t) {
  Layout l;
  l.batch = t.batch_size();
  td::TensorDict p = preview_of(t);
  // the preview holds the first row along dim 0 (the batch's other dims whole): every leaf starts with the
  // batch's dims, which are stripped, whatever their sizes (0 or 1 included)
  int64_t row_elems = 1;  // elements of one row of the batch past dim 0
  for (size_t i = 1; i < l.batch.size(); ++i)
    if (__builtin_mul_overflow(row_elems, l.batch[i], &row_elems)) row_elems = std::numeric_limits<int64_t>::max();
  td::walk_entries(p, [&](const td::NestedKey& key, const td::Entry& e) {
    if (e.is_tensordict()) {
      l.sub_batches.emplace_back(key, full_shape(e.tensordict().batch_size(), l.batch));
      return true;
    } else if (e.is_tensor()) {
      LeafSpec s;
      s.key = key;
      s.dtype = e.tensor().scalar_type();
      s.elem = e.tensor().sizes().vec();
      if (s.elem.size() < l.batch.size())
        throw td::FormatError("leaf '" + key_str(key) + "' has shape " + shape_str(s.elem) +
                              ", fewer dims than the batch " + shape_str(l.batch));
      s.elem.erase(s.elem.begin(), s.elem.begin() + static_cast<std::ptrdiff_t>(l.batch.size()));
      int64_t n = static_cast<int64_t>(c10::elementSize(s.dtype));  // saturating: declared sizes may be absurd
      if (!l.batch.empty() && __builtin_mul_overflow(n, row_elems, &n)) n = std::numeric_limits<int64_t>::max();
      for (auto x : s.elem)
        if (__builtin_mul_overflow(n, x, &n)) n = std::numeric_limits<int64_t>::max();
      s.row_bytes = n;
      if (__builtin_add_overflow(l.row_bytes, s.row_bytes, &l.row_bytes)) l.row_bytes = std::numeric_limits<int64_t>::max();
      l.tensors.push_back(std::move(s));
    } else {
      l.non_tensors.emplace_back(key, e);
    }
    return false;
  });
  return l;
}

int64_t rows_per_chunk(const Layout& l) { return std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, l.row_bytes)); }

std::string store_root_line(const td::TensorDict& t) {
  return t.type_name() + "  batch_size=" + shape_str(t.batch_size()) +
         "  device=" + (t.device() ? t.device()->str() : std::string("None"));
}

}  // namespace tdx
