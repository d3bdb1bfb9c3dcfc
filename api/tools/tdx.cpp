//! tdx: inspect and convert tensordict data from the command line: memmap directories (Python tensordict /
//! tensordict-cpp), HDF5 files (PersistentTensorDict) and Redis stores (TensorDictStore).
//!
//!   tdx info PATH [--files]               the tree: keys, kinds, dtypes, shapes, sizes, non-tensor values, totals
//!   tdx dump PATH [--json [--compact] [--indent N]] [--no-values] [--threshold N] [--edgeitems N]
//!   tdx verify PATH                       every leaf present, readable, of the dtype and shape it claims
//!   tdx convert SRC DST [--quiet] [--force]   any pair of the three, streamed in row chunks of <= 64 MiB
//!
//! PATH: a memmap directory, an .h5/.hdf5 file (opened with mode "r") or redis://HOST:PORT/DB?prefix=P&td_id=ID.
//! Memmap directories: `info` and `verify` only use backends::read_dir (no mapping at all), `dump` loads with
//! LoadOptions().writable(false) (private copy-on-write mappings). HDF5 files and Redis stores are read
//! through their store actor; `info` reads one row, `verify` every row in bounded chunks. Only `convert`
//! writes, and only to DST. Like the library, tdx refuses symlinks below a memmap PATH. `info` and `verify`
//! read with allow_missing, so a missing leaf file is a warning (info) or a problem (verify); `dump` refuses it.
//! Exit codes: 0 success, 1 `verify` found problems, 2 usage errors and unreadable input (message on stderr).
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/actors/progress.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/persistent.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/tensordict_store.hpp"

namespace td = tensordict;
namespace tdb = tensordict::backends;
using td::JsonValue;

namespace {

constexpr int kExitProblems = 1;
constexpr int kExitError = 2;

//! A fatal error for the user (printed as "tdx: <what>" on stderr, exit 2).
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------------------------------ small helpers
std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

enum class PathKind { Missing, File, Directory, Other };
PathKind path_kind(const std::string& p, int64_t* size = nullptr) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return PathKind::Missing;
  if (size) *size = static_cast<int64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) return PathKind::File;
  if (S_ISDIR(st.st_mode)) return PathKind::Directory;
  return PathKind::Other;
}

bool is_hdf5_file(const std::string& p) {
  static const char sig[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::ifstream in(p, std::ios::binary);
  char buf[8] = {};
  if (in.read(buf, 8) && std::memcmp(buf, sig, 8) == 0) return true;
  auto ends = [&](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
  return ends(".h5") || ends(".hdf5");
}

//! The input must be an existing directory: clear errors otherwise (HDF5 files get their own message).
void check_input_dir(const std::string& path) {
  switch (path_kind(path)) {
    case PathKind::Directory: return;
    case PathKind::Missing: throw ToolError("'" + path + "': no such file or directory");
    case PathKind::File:
      if (is_hdf5_file(path))
        throw ToolError("'" + path + "' is an HDF5 file: not a memmap directory");
      throw ToolError("'" + path + "' is not a directory (tdx reads memmap directories holding a meta.json)");
    case PathKind::Other: throw ToolError("'" + path + "' is not a directory");
  }
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

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

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

// ------------------------------------------------------------------------------------------ pretty JSON
bool is_scalar(const JsonValue& v) { return !v.is_array() && !v.is_object(); }

void pretty_json(const JsonValue& v, int indent, int level, std::string& out) {
  const std::string pad(static_cast<size_t>(indent * (level + 1)), ' ');
  const std::string close_pad(static_cast<size_t>(indent * level), ' ');
  if (v.is_object()) {
    const auto& o = v.as_object();
    if (o.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    for (size_t i = 0; i < o.size(); ++i) {
      out += pad + json_line(JsonValue(o[i].first)) + ": ";
      pretty_json(o[i].second, indent, level + 1, out);
      out += i + 1 < o.size() ? ",\n" : "\n";
    }
    out += close_pad + "}";
  } else if (v.is_array()) {
    const auto& a = v.as_array();
    if (std::all_of(a.begin(), a.end(), is_scalar)) {  // values, shapes, keys: one line
      out += "[";
      for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + json_line(a[i]);
      out += "]";
      return;
    }
    out += "[\n";
    for (size_t i = 0; i < a.size(); ++i) {
      out += pad;
      pretty_json(a[i], indent, level + 1, out);
      out += i + 1 < a.size() ? ",\n" : "\n";
    }
    out += close_pad + "]";
  } else {
    out += json_line(v);
  }
}

// ------------------------------------------------------------------------------------------ torch-like tensor text
//! Formats a tensor the way Python's torch prints it (tensor([...]), 4 decimals, common width, "..." summaries
//! above `threshold` elements keeping `edgeitems` per side, 80-column lines, dtype suffix for non-default dtypes).
class TensorPrinter {
 public:
  TensorPrinter(int64_t threshold, int64_t edgeitems) : threshold_(threshold), edge_(edgeitems) {}

  std::string format(const at::Tensor& tensor) const {
    at::Tensor t = tensor.detach().cpu().contiguous();
    const at::ScalarType st = t.scalar_type();
    std::string suffix;
    // torch shows the dtype unless it is a default one (float32, its complex64, int64, bool)
    if (st != at::kFloat && st != at::kComplexFloat && st != at::kLong && st != at::kBool)
      suffix = ", dtype=" + td::dtype_repr(st);
    if (t.numel() == 0) {
      // torch: the shape unless it is (0,), the dtype unless it is the default float32
      std::string out = "tensor([]";
      if (t.dim() != 1) {
        out += ", size=(";
        for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
        out += ")";
      }
      if (st != at::kFloat) out += ", dtype=" + td::dtype_repr(st);
      return out + ")";
    }
    State s;
    s.sizes = t.sizes().vec();
    s.summarize = t.numel() > threshold_;
    s.kind = st == at::kBool ? Kind::Bool
             : at::isComplexType(st) ? Kind::Complex
             : at::isFloatingType(st) ? Kind::Float
                                      : Kind::Int;
    if (s.kind == Kind::Bool) {
      at::Tensor b = t.reshape({-1});
      s.bools.assign(b.data_ptr<bool>(), b.data_ptr<bool>() + b.numel());
    } else if (s.kind == Kind::Int) {
      at::Tensor l = t.to(at::kLong).reshape({-1});
      s.ints.assign(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
    } else if (s.kind == Kind::Float) {
      at::Tensor d = t.to(at::kDouble).reshape({-1});
      s.doubles.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
    } else {
      at::Tensor d = at::view_as_real(t.to(at::kComplexDouble)).reshape({-1});
      s.doubles.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
    }
    // strides in elements (C order)
    s.strides.assign(s.sizes.size(), 1);
    for (int64_t i = static_cast<int64_t>(s.sizes.size()) - 2; i >= 0; --i)
      s.strides[i] = s.strides[i + 1] * s.sizes[i + 1];
    // pass 1: which elements are printed -> the common format and width
    std::vector<int64_t> shown;
    collect(s, 0, 0, shown);
    choose_format(s, shown);
    const int indent = 7;  // strlen("tensor(")
    std::string body = s.sizes.empty() ? element(s, 0) : render(s, 0, 0, indent);
    return "tensor(" + body + suffix + ")";
  }

 private:
  enum class Kind { Bool, Int, Float, Complex };
  struct State {
    std::vector<int64_t> sizes, strides;
    bool summarize = false;
    Kind kind = Kind::Float;
    std::vector<bool> bools;
    std::vector<int64_t> ints;
    std::vector<double> doubles;
    bool int_mode = false, sci = false;
    size_t width = 0;
  };

  //! the indices printed along a dim of size n
  std::vector<int64_t> positions(const State& s, int64_t n, bool* ellipsis) const {
    std::vector<int64_t> out;
    *ellipsis = s.summarize && n > 2 * edge_;
    if (*ellipsis) {
      for (int64_t i = 0; i < edge_; ++i) out.push_back(i);
      for (int64_t i = n - edge_; i < n; ++i) out.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) out.push_back(i);
    }
    return out;
  }

  void collect(const State& s, size_t dim, int64_t offset, std::vector<int64_t>& shown) const {
    if (dim == s.sizes.size()) {
      shown.push_back(offset);
      return;
    }
    bool ell = false;
    for (int64_t i : positions(s, s.sizes[dim], &ell)) collect(s, dim + 1, offset + i * s.strides[dim], shown);
  }

  static std::string fmt_double(double v, bool int_mode, bool sci) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    if (sci) {
      std::snprintf(buf, sizeof buf, "%.4e", v);
    } else if (int_mode) {
      std::snprintf(buf, sizeof buf, "%.0f.", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.4f", v);
    }
    return buf;
  }

  void choose_format(State& s, const std::vector<int64_t>& shown) const {
    if (s.kind == Kind::Float || s.kind == Kind::Complex) {
      std::vector<double> vals;
      for (int64_t i : shown) {
        if (s.kind == Kind::Float) {
          vals.push_back(s.doubles[static_cast<size_t>(i)]);
        } else {
          vals.push_back(s.doubles[static_cast<size_t>(2 * i)]);
          vals.push_back(s.doubles[static_cast<size_t>(2 * i + 1)]);
        }
      }
      // python torch._tensor_str._Formatter
      std::vector<double> nz;
      bool all_int = true;
      for (double v : vals) {
        if (std::isfinite(v) && v != 0) nz.push_back(std::fabs(v));
        if (std::isfinite(v) && std::ceil(v) != v) all_int = false;
      }
      s.int_mode = all_int;
      s.sci = false;
      if (!nz.empty()) {
        double mx = *std::max_element(nz.begin(), nz.end()), mn = *std::min_element(nz.begin(), nz.end());
        if (all_int) {
          s.sci = mx > 1e8;
        } else {
          s.sci = mx / mn > 1000.0 || mx > 1e8 || mn < 1e-4;
        }
      }
    }
    for (int64_t i : shown) s.width = std::max(s.width, raw(s, i).size());
  }

  std::string raw(const State& s, int64_t i) const {
    const size_t k = static_cast<size_t>(i);
    switch (s.kind) {
      case Kind::Bool: return s.bools[k] ? "True" : "False";
      case Kind::Int: return std::to_string(s.ints[k]);
      case Kind::Float: return fmt_double(s.doubles[k], s.int_mode, s.sci);
      case Kind::Complex: {
        double re = s.doubles[2 * k], im = s.doubles[2 * k + 1];
        std::string r = fmt_double(re, s.int_mode, s.sci), m = fmt_double(std::fabs(im), s.int_mode, s.sci);
        return r + (im < 0 || (im == 0 && std::signbit(im)) ? "-" : "+") + m + "j";
      }
    }
    return "";
  }

  std::string element(const State& s, int64_t i) const {
    std::string r = raw(s, i);
    if (r.size() < s.width) r.insert(0, s.width - r.size(), ' ');
    return r;
  }

  std::string render(const State& s, size_t dim, int64_t offset, int indent) const {
    bool ell = false;
    std::vector<int64_t> pos = positions(s, s.sizes[dim], &ell);
    const size_t half = pos.size() / 2;
    std::vector<std::string> items;
    if (dim + 1 == s.sizes.size()) {
      for (size_t j = 0; j < pos.size(); ++j) {
        if (ell && j == half) items.push_back(" ...");  // torch's spelling in the last dim
        items.push_back(element(s, offset + pos[j] * s.strides[dim]));
      }
      // wrap like torch: as many elements per line as fit in 80 columns
      const int64_t per_line = std::max<int64_t>(1, (80 - indent) / static_cast<int64_t>(s.width + 2));
      std::string out = "[";
      for (size_t j = 0; j < items.size(); ++j) {
        if (j > 0) {
          out += ",";
          out += (static_cast<int64_t>(j) % per_line == 0) ? "\n" + std::string(static_cast<size_t>(indent + 1), ' ') : " ";
        }
        out += items[j];
      }
      return out + "]";
    }
    for (size_t j = 0; j < pos.size(); ++j) {
      if (ell && j == half) items.push_back("...");
      items.push_back(render(s, dim + 1, offset + pos[j] * s.strides[dim], indent + 1));
    }
    const std::string sep =
        "," + std::string(s.sizes.size() - dim - 1, '\n') + std::string(static_cast<size_t>(indent + 1), ' ');
    std::string out = "[";
    for (size_t j = 0; j < items.size(); ++j) out += (j ? sep : "") + items[j];
    return out + "]";
  }

  int64_t threshold_, edge_;
};

// ------------------------------------------------------------------------------------------ info
struct Row {
  int depth = 0;
  std::string name, kind, dtype, shape, bytes, value;
};

struct Totals {
  int64_t tensors = 0, non_tensors = 0, subs = 0, bytes = 0, files = 0, file_bytes = 0;
};

struct InfoWalker {
  bool show_files = false;
  size_t value_width = 60;
  std::vector<Row> rows;
  Totals totals;
  std::vector<std::string> warnings;

  static std::string batch_of(const tdb::DirNode& n) { return n.batch_size ? shape_str(*n.batch_size) : "?"; }

  static std::string non_tensor_value(const tdb::DirNode& n, size_t width) {
    if (n.data) return truncate(json_line(*n.data), width);
    if (n.pickle) return "<pickled, " + std::to_string(n.pickle->data.size()) + " bytes>";
    return "<no data>";
  }

  void leaf_row(const tdb::DirNode& node, const tdb::LeafMeta& leaf, int depth) {
    Row r;
    r.depth = depth;
    r.name = leaf.key;
    r.kind = leaf.is_nested ? "nested tensor" : "tensor";
    r.dtype = short_dtype(leaf.dtype);
    if (leaf.is_nested) {
      r.shape = std::to_string(leaf.nested_sizes.size()) + " components";
    } else {
      r.shape = shape_str(leaf.shape);
    }
    r.bytes = human_bytes(leaf.nbytes());
    ++totals.tensors;
    totals.bytes += leaf.nbytes();
    for (const std::string* f : {&leaf.file, &leaf.shape_file}) {
      if (f->empty()) continue;
      int64_t size = 0;
      path_kind(join_path(node.path, *f), &size);
      ++totals.files;
      totals.file_bytes += size;
      if (show_files) r.value += (r.value.empty() ? "" : ", ") + *f + " (" + std::to_string(size) + " bytes)";
    }
    if (show_files && leaf.file.empty()) r.value = "(no file: empty)";
    rows.push_back(std::move(r));
  }

  void child_row(const std::string& name, const tdb::DirNode& child, int depth) {
    Row r;
    r.depth = depth;
    r.name = name;
    switch (child.kind) {
      case tdb::NodeKind::NonTensorData:
        r.kind = child.type_repr == tdb::type_repr::kMetaData ? "MetaData" : "NonTensorData";
        r.value = non_tensor_value(child, value_width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
        break;
      case tdb::NodeKind::NonTensorStack:
        r.kind = "NonTensorStack";
        r.shape = batch_of(child);
        r.value = non_tensor_value(child, value_width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
        break;
      case tdb::NodeKind::TensorDict:
        r.name += "/";
        r.kind = "TensorDict";
        r.shape = "batch " + batch_of(child);
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::LazyStackedTensorDict:
        r.name += "/";
        r.kind = "LazyStackedTensorDict";
        r.shape = "batch " + batch_of(child);
        r.value = "stack_dim " + std::to_string(child.stack_dim) + ", " + std::to_string(child.entries.size()) +
                  " members";
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::TensorClass:
        r.name += "/";
        r.kind = tdb::default_child_type(child) + " (tensorclass)";
        r.shape = "batch " + batch_of(child);
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::Other:
        r.name += "/";
        r.kind = tdb::default_child_type(child);
        r.shape = child.batch_size ? "batch " + batch_of(child) : "";
        r.value = "(not loadable: " + child.type_repr + ")";
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
    }
  }

  void walk(const tdb::DirNode& node, int depth) {
    for (const auto& w : node.warnings) warnings.push_back(node.path + ": " + w);
    if (node.kind == tdb::NodeKind::TensorClass && node.data && node.data->is_object()) {
      for (const auto& kv : node.data->as_object()) {  // non-tensor fields kept in the class's meta.json
        Row r;
        r.depth = depth;
        r.name = kv.first;
        r.kind = "field";
        r.value = truncate(json_line(kv.second), value_width);
        rows.push_back(std::move(r));
      }
    }
    for (const auto& e : node.entries) {
      if (e.is_leaf) {
        leaf_row(node, e.leaf, depth);
      } else if (node.kind == tdb::NodeKind::TensorClass && e.key == "_tensordict") {
        for (const auto& w : e.child->warnings) warnings.push_back(e.child->path + ": " + w);
        walk_entries_only(*e.child, depth);  // a tensorclass shows its fields directly
      } else if (node.kind == tdb::NodeKind::LazyStackedTensorDict) {
        child_row("[" + e.key + "]", *e.child, depth);
      } else {
        child_row(e.key, *e.child, depth);
      }
    }
  }

  void walk_entries_only(const tdb::DirNode& node, int depth) {
    for (const auto& e : node.entries) {
      if (e.is_leaf)
        leaf_row(node, e.leaf, depth);
      else
        child_row(e.key, *e.child, depth);
    }
  }
};

std::string root_line(const tdb::DirNode& root) {
  std::string device = root.device ? *root.device : "None";
  switch (root.kind) {
    case tdb::NodeKind::TensorDict:
      return "TensorDict  batch_size=" + InfoWalker::batch_of(root) + "  device=" + device;
    case tdb::NodeKind::LazyStackedTensorDict:
      return "LazyStackedTensorDict  batch_size=" + InfoWalker::batch_of(root) +
             "  stack_dim=" + std::to_string(root.stack_dim) + "  members=" + std::to_string(root.entries.size());
    case tdb::NodeKind::TensorClass:
      return tdb::default_child_type(root) + " (tensorclass " + root.type_repr + ")  batch_size=" +
             InfoWalker::batch_of(root) + "  device=" + device;
    case tdb::NodeKind::NonTensorData:
      return "NonTensorData  value=" + InfoWalker::non_tensor_value(root, 200);
    case tdb::NodeKind::NonTensorStack:
      return "NonTensorStack  batch_size=" + InfoWalker::batch_of(root) + "  value=" +
             InfoWalker::non_tensor_value(root, 200);
    case tdb::NodeKind::Other: return root.type_repr + " (not loadable as a TensorDict)";
  }
  return root.type_repr;
}

void print_rows(const std::vector<Row>& rows, std::ostream& os) {
  Row header;
  header.name = "KEY";
  header.kind = "KIND";
  header.dtype = "DTYPE";
  header.shape = "SHAPE";
  header.bytes = "BYTES";
  header.value = "VALUE";
  std::vector<const Row*> all{&header};
  for (const auto& r : rows) all.push_back(&r);
  size_t w[4] = {0, 0, 0, 0}, wb = 0;
  for (const Row* r : all) {
    w[0] = std::max(w[0], 2 * static_cast<size_t>(r->depth) + r->name.size());
    w[1] = std::max(w[1], r->kind.size());
    w[2] = std::max(w[2], r->dtype.size());
    w[3] = std::max(w[3], r->shape.size());
    wb = std::max(wb, r->bytes.size());
  }
  for (const Row* r : all) {
    std::string line = "  " + std::string(2 * static_cast<size_t>(r->depth), ' ') + r->name;
    auto pad_to = [&](size_t width) { line.resize(std::max(line.size(), width), ' '); };
    pad_to(2 + w[0] + 2);
    line += r->kind;
    pad_to(2 + w[0] + 2 + w[1] + 2);
    line += r->dtype;
    pad_to(2 + w[0] + 2 + w[1] + 2 + w[2] + 2);
    line += r->shape;
    pad_to(2 + w[0] + 2 + w[1] + 2 + w[2] + 2 + w[3] + 2);
    line += std::string(wb - r->bytes.size(), ' ') + r->bytes;  // right-aligned
    if (!r->value.empty()) line += "  " + r->value;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
}

// ------------------------------------------------------------------------------------------ HDF5 files, Redis stores
//! what a PATH argument names
enum class InputKind { Memmap, H5, Redis };

bool is_redis_address(const std::string& s) { return s.rfind("redis://", 0) == 0; }

bool has_h5_extension(const std::string& p) {
  auto ends = [&](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
  return ends(".h5") || ends(".hdf5");
}

//! an existing input: a Redis address, an HDF5 file, or (anything else) a memmap directory
InputKind input_kind(const std::string& path) {
  if (is_redis_address(path)) return InputKind::Redis;
  if (path_kind(path) == PathKind::File && is_hdf5_file(path)) return InputKind::H5;
  return InputKind::Memmap;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

//! "redis://HOST:PORT/DB?prefix=P&td_id=ID" (what TensorDictStore::address() prints); HOST, PORT, DB,
//! prefix and td_id are optional (the engine config's redis.* values fill in what is left out)
td::RedisOptions parse_redis_address(const std::string& address) {
  std::string rest = address.substr(std::string("redis://").size());
  std::string query;
  if (auto q = rest.find('?'); q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }
  std::string db;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    db = rest.substr(slash + 1);
    rest.resize(slash);
  }
  td::RedisOptions o;
  std::string host = rest, port;
  if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  auto number = [&](const std::string& s, const char* what) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9)
      throw ToolError("'" + address + "': bad " + what + " '" + s + "' (expected redis://HOST:PORT/DB?prefix=P&td_id=ID)");
    return std::stoi(s);
  };
  if (!host.empty()) o.host(host);
  if (!port.empty()) o.port(number(port, "port"));
  if (!db.empty()) o.db(number(db, "db"));
  std::istringstream qs(query);
  for (std::string kv; std::getline(qs, kv, '&');) {
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : percent_decode(kv.substr(eq + 1));
    if (k == "prefix")
      o.prefix(v);
    else if (k == "td_id")
      o.td_id(v);
    else if (k == "password")
      o.password(v);
    else
      throw ToolError("'" + address + "': unknown parameter '" + k + "' (expected prefix, td_id, password)");
  }
  return o;
}

//! an open input: the TensorDict (an HDF5 file's and a Redis store's read through their store actor)
struct Input {
  InputKind kind = InputKind::Memmap;
  td::TensorDict td;
  std::function<void()> close;
};

Input open_store_input(const std::string& path, InputKind kind) {
  Input in;
  in.kind = kind;
  if (kind == InputKind::H5) {
    td::PersistentTensorDict h5 = td::PersistentTensorDict::from_h5(path, td::H5Options().mode("r"));
    in.close = [h5] { h5.close(); };
    in.td = h5;
  } else {
    td::RedisOptions o = parse_redis_address(path);
    if (o.td_id().empty()) throw ToolError("'" + path + "': the address names no store (add &td_id=ID)");
    td::TensorDictStore s = td::TensorDictStore::from_store(o.td_id(), o);
    in.close = [s] { s.close(); };
    in.td = s;
  }
  return in;
}

//! replaces the first dim of a shape by the batch's (a 1-row preview -> the full shape)
std::vector<int64_t> full_shape(std::vector<int64_t> shape, const td::BatchSize& batch) {
  if (!batch.empty() && !shape.empty()) shape[0] = batch[0];
  return shape;
}

//! a small read that shows every key, dtype and element shape: the first row (the whole TensorDict when
//! the batch is 0-dim or empty along dim 0)
td::TensorDict preview_of(const td::TensorDict& t) {
  const td::BatchSize b = t.batch_size();
  if (!b.empty() && b[0] > 1) return t.index({at::indexing::Slice(0, 1)}).to_tensordict();
  return t.to_tensordict();
}

//! one tensor leaf of a store: its key, dtype and element shape (the shape past the batch's first dim)
struct LeafSpec {
  td::NestedKey key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> elem;  // shape without dim 0 (the whole shape for a 0-dim batch)
  int64_t row_bytes = 0;
};

struct Layout {
  td::BatchSize batch;
  std::vector<LeafSpec> tensors;
  std::vector<std::pair<td::NestedKey, td::Entry>> non_tensors;
  int64_t row_bytes = 0;  // tensor bytes per row (dim 0)
  int64_t total_bytes() const {
    if (batch.empty()) return row_bytes;
    return row_bytes * batch[0];
  }
};

Layout layout_of(const td::TensorDict& t) {
  Layout l;
  l.batch = t.batch_size();
  td::TensorDict p = preview_of(t);
  std::function<void(const td::TensorDict&, const td::NestedKey&)> walk = [&](const td::TensorDict& d,
                                                                              const td::NestedKey& prefix) {
    for (const auto& kv : d.items()) {
      td::NestedKey key = prefix + kv.first;
      const td::Entry& e = kv.second;
      if (e.is_tensordict()) {
        walk(e.tensordict(), key);
      } else if (e.is_tensor()) {
        LeafSpec s;
        s.key = key;
        s.dtype = e.tensor().scalar_type();
        s.elem = e.tensor().sizes().vec();
        if (!l.batch.empty() && !s.elem.empty()) s.elem.erase(s.elem.begin());
        int64_t n = 1;
        for (auto x : s.elem) n *= x;
        s.row_bytes = n * static_cast<int64_t>(c10::elementSize(s.dtype));
        l.row_bytes += s.row_bytes;
        l.tensors.push_back(std::move(s));
      } else {
        l.non_tensors.emplace_back(key, e);
      }
    }
  };
  walk(p, td::NestedKey());
  return l;
}

constexpr int64_t kChunkBytes = int64_t(64) << 20;

//! rows per step so that a step moves at most ~64 MiB (at least one row)
int64_t rows_per_chunk(const Layout& l) { return std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, l.row_bytes)); }

std::string store_root_line(const td::TensorDict& t) {
  return t.type_name() + "  batch_size=" + shape_str(t.batch_size()) +
         "  device=" + (t.device() ? t.device()->str() : std::string("None"));
}

int cmd_info_store(const std::string& path, InputKind kind, size_t width) {
  Input in = open_store_input(path, kind);
  const td::BatchSize batch = in.td.batch_size();
  td::TensorDict p = preview_of(in.td);
  std::vector<Row> rows;
  Totals totals;
  std::function<void(const td::TensorDict&, int)> walk = [&](const td::TensorDict& d, int depth) {
    for (const auto& kv : d.items()) {
      const td::Entry& e = kv.second;
      Row r;
      r.depth = depth;
      r.name = kv.first[kv.first.size() - 1];
      if (e.is_tensordict()) {
        r.name += "/";
        r.kind = e.tensordict().type_name();
        r.shape = "batch " + shape_str(full_shape(e.tensordict().batch_size(), batch));
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(e.tensordict(), depth + 1);
      } else if (e.is_tensor()) {
        const at::Tensor& x = e.tensor();
        std::vector<int64_t> shape = full_shape(x.sizes().vec(), batch);
        int64_t n = 1;
        for (auto s : shape) n *= s;
        const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(x.scalar_type()));
        r.kind = "tensor";
        r.dtype = short_dtype(x.scalar_type());
        r.shape = shape_str(shape);
        r.bytes = human_bytes(bytes);
        ++totals.tensors;
        totals.bytes += bytes;
        rows.push_back(std::move(r));
      } else if (e.is_non_tensor_data()) {
        r.kind = "NonTensorData";
        r.value = truncate(json_line(e.non_tensor_data().value()), width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
      } else if (e.is_non_tensor_stack()) {
        r.kind = "NonTensorStack";
        r.shape = shape_str(full_shape(e.non_tensor_stack().batch_size(), batch));
        r.value = "(first row) " + truncate(json_line(e.non_tensor_stack().tolist()), width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
      }
    }
  };
  walk(p, 0);
  std::cout << path << "\n" << store_root_line(in.td) << "\n";
  if (!rows.empty()) print_rows(rows, std::cout);
  std::cout << "total: " << count(totals.tensors + totals.non_tensors, "leaf", "leaves") << " ("
            << count(totals.tensors, "tensor", "tensors") << ", "
            << count(totals.non_tensors, "non-tensor", "non-tensors") << "), "
            << count(totals.subs, "sub-tensordict", "sub-tensordicts") << ", " << human_bytes(totals.bytes)
            << " of tensor data";
  if (totals.bytes >= 1024) std::cout << " (" << totals.bytes << " bytes)";
  if (kind == InputKind::H5) {
    int64_t size = 0;
    path_kind(path, &size);
    std::cout << " in an HDF5 file of " << size << " bytes";
  } else {
    std::cout << " in a Redis store";
  }
  std::cout << "\n";
  in.close();
  return 0;
}

//! describe() of a store's contents, with loaded_type the store's type (PersistentTensorDict, TensorDictStore)
JsonValue describe_store(const td::TensorDict& t, bool values) {
  JsonValue d = td::describe(t.to_tensordict(), values);
  for (auto& kv : d.as_object())
    if (kv.first == "loaded_type") kv.second = JsonValue(t.type_name());
  return d;
}

//! reads every leaf of a store in chunks of rows; problems: unreadable rows, shapes or dtypes other than
//! the store's metadata says (the first row's)
struct StoreVerifier {
  std::vector<std::string> problems;
  int64_t leaves = 0, bytes = 0;

  void check(const td::TensorDict& t) {
    Layout l;
    try {
      l = layout_of(t);
    } catch (const std::exception& e) {
      problems.push_back(std::string("cannot read the first row: ") + first_line(e.what()));
      return;
    }
    leaves = static_cast<int64_t>(l.tensors.size() + l.non_tensors.size());
    bytes = l.total_bytes();
    if (l.batch.empty()) {  // 0-dim batch: one read
      try {
        td::TensorDict all = t.to_tensordict();
        for (const auto& s : l.tensors) compare(s, all, s.elem, "");
      } catch (const std::exception& e) {
        problems.push_back(std::string("unreadable: ") + first_line(e.what()));
      }
      return;
    }
    const int64_t n = l.batch[0], step = rows_per_chunk(l);
    std::vector<bool> bad(l.tensors.size(), false);
    for (int64_t a = 0; a < n; a += step) {
      const int64_t b = std::min(n, a + step);
      const std::string rows = "rows " + std::to_string(a) + ".." + std::to_string(b);
      td::TensorDict view = t.index({at::indexing::Slice(a, b)});
      std::vector<int64_t> want_lead{b - a};
      try {
        td::TensorDict chunk = view.to_tensordict();
        for (size_t i = 0; i < l.tensors.size(); ++i)
          if (!bad[i]) bad[i] = !compare(l.tensors[i], chunk, concat(want_lead, l.tensors[i].elem), rows);
      } catch (const std::exception&) {  // which leaves: one read each
        for (size_t i = 0; i < l.tensors.size(); ++i) {
          if (bad[i]) continue;
          try {
            at::Tensor x = view.get(l.tensors[i].key);
            bad[i] = !compare_tensor(l.tensors[i], x, concat(want_lead, l.tensors[i].elem), rows);
          } catch (const std::exception& e) {
            problems.push_back("leaf '" + key_str(l.tensors[i].key) + "': " + rows + " unreadable: " + first_line(e.what()));
            bad[i] = true;
          }
        }
      }
    }
  }

  static std::string first_line(std::string s) {
    if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
    return s;
  }
  static std::string key_str(const td::NestedKey& k) {
    std::string out;
    for (size_t i = 0; i < k.size(); ++i) out += (i ? "/" : "") + k[i];
    return out;
  }
  static std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  bool compare(const LeafSpec& s, const td::TensorDict& chunk, const std::vector<int64_t>& want,
               const std::string& rows) {
    if (!chunk.contains(s.key)) {
      problems.push_back("leaf '" + key_str(s.key) + "': " + rows + " missing");
      return false;
    }
    return compare_tensor(s, chunk.get(s.key), want, rows);
  }
  bool compare_tensor(const LeafSpec& s, const at::Tensor& x, const std::vector<int64_t>& want,
                      const std::string& rows) {
    const std::string where = "leaf '" + key_str(s.key) + "'" + (rows.empty() ? "" : ": " + rows);
    if (x.scalar_type() != s.dtype) {
      problems.push_back(where + ": dtype " + td::dtype_repr(x.scalar_type()) + ", expected " + td::dtype_repr(s.dtype));
      return false;
    }
    if (x.sizes().vec() != want) {
      problems.push_back(where + ": shape " + shape_str(x.sizes().vec()) + ", expected " + shape_str(want));
      return false;
    }
    return true;
  }
};

int cmd_verify_store(const std::string& path, InputKind kind) {
  StoreVerifier v;
  Input in;
  try {
    in = open_store_input(path, kind);
  } catch (const ToolError&) {
    throw;
  } catch (const std::exception& e) {
    v.problems.push_back(std::string("cannot open: ") + StoreVerifier::first_line(e.what()));
  }
  if (in.close) {
    v.check(in.td);
    try {
      in.close();
    } catch (const std::exception&) {
    }
  }
  if (!v.problems.empty()) {
    for (const auto& p : v.problems) std::cout << "PROBLEM: " << path << ": " << p << "\n";
    std::cout << "FAILED: " << v.problems.size() << " problem" << (v.problems.size() == 1 ? "" : "s") << " in " << path
              << "\n";
    return kExitProblems;
  }
  std::cout << "OK: " << v.leaves << " leaves, " << v.bytes << " bytes";
  if (v.bytes >= 1024) std::cout << " (" << human_bytes(v.bytes) << ")";
  std::cout << "\n";
  return 0;
}

// ------------------------------------------------------------------------------------------ convert
struct ConvertOptions {
  bool quiet = false;
  bool force = false;
};

//! the source of a convert: memmap directories load read-only (private mappings); lazy stacks are refused
Input open_source(const std::string& path) {
  const InputKind kind = input_kind(path);
  if (kind != InputKind::Memmap) return open_store_input(path, kind);
  check_input_dir(path);
  if (td::is_lazy_stack_dir(path))
    throw ToolError("'" + path + "' holds a lazy stack: convert copies TensorDicts (stack it first)");
  Input in;
  in.kind = kind;
  in.td = td::TensorDict::load_memmap(path, td::LoadOptions().writable(false).on_warning(
                                                [](const std::string& w) { std::cerr << "tdx: warning: " << w << "\n"; }));
  in.close = [] {};
  return in;
}

int convert_into(const std::string& src_path, const std::string& dst_path, const ConvertOptions& o,
                 std::function<void()>& dst_close);

//! convert; a DST file or directory this call created is removed again when the copy fails
int cmd_convert(const std::string& src_path, const std::string& dst_path, const ConvertOptions& o) {
  const bool created = !is_redis_address(dst_path) && path_kind(dst_path) == PathKind::Missing;
  std::function<void()> dst_close = [] {};
  try {
    return convert_into(src_path, dst_path, o, dst_close);
  } catch (...) {
    try {
      dst_close();
    } catch (...) {
    }
    std::error_code ec;
    if (created) std::filesystem::remove_all(dst_path, ec);
    throw;
  }
}

int convert_into(const std::string& src_path, const std::string& dst_path, const ConvertOptions& o,
                 std::function<void()>& dst_close) {
  using at::indexing::Slice;
  Input src = open_source(src_path);
  const Layout l = layout_of(src.td);
  td::Schema schema;
  for (const auto& s : l.tensors) schema.push_back({s.key, {s.elem, s.dtype}});

  // the destination, preallocated from the source's schema (no data written yet)
  td::TensorDict dst;
  std::string dst_name = dst_path;
  const bool dst_redis = is_redis_address(dst_path);
  if (!dst_redis) {
    const PathKind pk = path_kind(dst_path);
    if (pk != PathKind::Missing && !o.force)
      throw ToolError("'" + dst_path + "' exists (convert writes a new file or directory; --force replaces it)");
    if (pk == PathKind::Directory && path_kind(join_path(dst_path, "meta.json")) != PathKind::File)
      throw ToolError("'" + dst_path + "' is a directory without meta.json: not replaced");
    if (pk == PathKind::Other) throw ToolError("'" + dst_path + "' is not a file or directory");
    if (pk != PathKind::Missing) std::filesystem::remove_all(dst_path);  // --force
  }
  if (dst_redis) {
    td::RedisOptions ro = parse_redis_address(dst_path);
    if (!ro.td_id().empty() && !o.force)
      throw ToolError("'" + dst_path + "' names a store (td_id): convert makes a new one (leave td_id out, or --force)");
    td::TensorDictStore s = td::TensorDictStore::from_schema(schema, l.batch, ro);
    dst_name = s.address();
    dst_close = [s] { s.close(); };
    dst = s;
  } else if (has_h5_extension(dst_path)) {
    dst = td::TensorDict::from_schema(schema, l.batch, "h5", td::H5Options().filename(dst_path).mode("w"));
    td::PersistentTensorDict h5(dst);
    dst_close = [h5] { h5.close(); };
  } else {
    dst = td::TensorDict::from_schema(schema, l.batch, "memmap", td::MemmapOptions().prefix(dst_path));
  }

  // rows in chunks of <= ~64 MiB: one read of every leaf, one write
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = l.total_bytes();
  double read_s = 0, write_s = 0;  // of the row chunks
  if (!l.tensors.empty()) {
    if (l.batch.empty()) {
      td::TensorDict all = src.td.to_tensordict();
      for (const auto& s : l.tensors) dst.set_(s.key, all.get(s.key));
    } else {
      const int64_t n = l.batch[0], step = rows_per_chunk(l);
      const int64_t steps = (n + step - 1) / step;
      td::actors::Progress bar(!o.quiet, steps, std::chrono::milliseconds(1000), "tdx convert");
      int64_t done = 0;
      for (int64_t a = 0; a < n; a += step) {
        const int64_t b = std::min(n, a + step);
        const auto r0 = std::chrono::steady_clock::now();
        // a memmap source: the rows are a view of its mapping (copied once, by the write); a store: one read
        td::TensorDict rows = src.td.index({Slice(a, b)});
        if (src.kind != InputKind::Memmap) rows = rows.to_tensordict();
        td::TensorDict tensors(rows.batch_size());
        for (const auto& s : l.tensors) tensors.set(s.key, rows.get(s.key));
        const auto r1 = std::chrono::steady_clock::now();
        dst.index_put_({Slice(a, b)}, tensors);
        read_s += std::chrono::duration<double>(r1 - r0).count();
        write_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r1).count();
        bar.update(++done);
      }
      bar.finish(true);
    }
  }
  // non-tensor leaves, whole (one read each: the preview holds their first row only)
  if (!l.non_tensors.empty()) {
    std::vector<std::pair<td::NestedKey, td::Entry>> values;
    for (const auto& nt : l.non_tensors) values.emplace_back(nt.first, src.td.get_entry(nt.first));
    if (!dst_redis && !has_h5_extension(dst_path)) {
      // a memmap directory: add them and rewrite meta.json (the tensor leaves stay where they are)
      td::TensorDict d = dst;
      d.unlock_();
      for (const auto& v : values) d.set(v.first, v.second);
      d.memmap_(dst_path, td::MemmapOptions().existsok(true));
    } else {
      for (const auto& v : values) dst.set(v.first, v.second);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  dst_close();
  src.close();
  if (dst_redis) std::cout << dst_name << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%.1f MB/s", secs > 0 ? static_cast<double>(total) / 1e6 / secs : 0.0);
  std::cerr << "tdx: converted " << count(static_cast<int64_t>(l.tensors.size() + l.non_tensors.size()), "leaf", "leaves")
            << ", " << human_bytes(total) << " in " << std::fixed << std::setprecision(3) << secs << " s: " << line
            << " (reading " << read_s << " s, writing " << write_s << " s)\n";
  return 0;
}

int cmd_info(const std::string& path, bool files, size_t width) {
  if (InputKind k = input_kind(path); k != InputKind::Memmap) return cmd_info_store(path, k, width);
  check_input_dir(path);
  tdb::ReadOptions ro;
  ro.allow_missing = true;  // shown as a warning
  tdb::DirNode root = tdb::read_dir(path, ro);
  InfoWalker w;
  w.show_files = files;
  w.value_width = width;
  w.walk(root, 0);
  std::cout << path << "\n" << root_line(root) << "\n";
  if (!w.rows.empty()) print_rows(w.rows, std::cout);
  const Totals& t = w.totals;
  std::cout << "total: " << count(t.tensors + t.non_tensors, "leaf", "leaves") << " ("
            << count(t.tensors, "tensor", "tensors") << ", " << count(t.non_tensors, "non-tensor", "non-tensors")
            << "), " << count(t.subs, "sub-tensordict", "sub-tensordicts") << ", " << human_bytes(t.bytes)
            << " of tensor data";
  if (t.bytes >= 1024) std::cout << " (" << t.bytes << " bytes)";
  std::cout << " in " << count(t.files, "file", "files");
  if (t.file_bytes != t.bytes) std::cout << " (" << t.file_bytes << " bytes on disk)";
  std::cout << "\n";
  for (const auto& warn : w.warnings) std::cerr << "tdx: warning: " << warn << "\n";
  return 0;
}

// ------------------------------------------------------------------------------------------ dump
struct DumpOptions {
  bool json = false, compact = false, values = true;
  int indent = 2;
  int64_t threshold = 1000, edgeitems = 3;
  size_t width = 200;
};

//! "sub/deeper/y"; a part that could be misread ("a/b", "", " x") is shown JSON-quoted
std::string key_path(const td::NestedKey& key) {
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    const std::string& p = key[i];
    const bool quote = p.empty() || p.find('/') != std::string::npos || p.front() == ' ' || p.back() == ' ' ||
                       p.front() == '"';
    out += (i ? "/" : "") + (quote ? json_line(JsonValue(p)) : p);
  }
  return out;
}

void dump_td_text(const td::TensorDict& t, const td::NestedKey& prefix, const DumpOptions& o,
                  const TensorPrinter& printer, std::ostream& os) {
  for (const auto& kv : t.items()) {
    td::NestedKey key = prefix + kv.first;
    const td::Entry& e = kv.second;
    const std::string name = key_path(key);
    if (e.is_tensordict()) {
      td::TensorDict c = e.tensordict();
      os << name << "/: " << c.type_name() << " batch_size=" << shape_str(c.batch_size()) << "\n";
      dump_td_text(c, key, o, printer, os);
    } else if (e.is_tensor()) {
      const at::Tensor& x = e.tensor();
      os << name << ": " << td::dtype_repr(x.scalar_type()) << " " << shape_str(x.sizes().vec()) << "\n";
      if (o.values) {
        std::istringstream lines(printer.format(x));
        for (std::string line; std::getline(lines, line);) os << (line.empty() ? "" : "    ") << line << "\n";
      }
    } else if (e.is_non_tensor_data()) {
      os << name << ": NonTensorData batch_size=" << shape_str(e.non_tensor_data().batch_size()) << "\n";
      if (o.values) os << "    " << truncate(json_line(e.non_tensor_data().value()), o.width) << "\n";
    } else if (e.is_non_tensor_stack()) {
      os << name << ": NonTensorStack batch_size=" << shape_str(e.non_tensor_stack().batch_size()) << "\n";
      if (o.values) os << "    " << truncate(json_line(e.non_tensor_stack().tolist()), o.width) << "\n";
    }
  }
}

int cmd_dump(const std::string& path, const DumpOptions& o) {
  if (InputKind k = input_kind(path); k != InputKind::Memmap) {
    Input in = open_store_input(path, k);
    if (o.json) {
      JsonValue d = describe_store(in.td, o.values);
      std::string out;
      if (o.compact)
        out = json_line(d);
      else
        pretty_json(d, std::max(0, o.indent), 0, out);
      std::cout << out << "\n";
    } else {
      const TensorPrinter printer(o.threshold, o.edgeitems);
      std::ostringstream os;
      os << store_root_line(in.td) << "\n";
      dump_td_text(in.td.to_tensordict(), td::NestedKey(), o, printer, os);
      std::cout << os.str();
    }
    in.close();
    return 0;
  }
  check_input_dir(path);
  const auto load = td::LoadOptions().writable(false).on_warning(
      [](const std::string& w) { std::cerr << "tdx: warning: " << w << "\n"; });
  const bool lazy = td::is_lazy_stack_dir(path);
  std::optional<td::LazyStackedTensorDict> stack;
  td::TensorDict t;
  if (lazy)
    stack.emplace(td::LazyStackedTensorDict::load_memmap(path, load));
  else
    t = td::TensorDict::load_memmap(path, load);

  if (o.json) {
    JsonValue d = lazy ? td::describe(*stack, o.values) : td::describe(t, o.values);
    std::string out;
    if (o.compact)
      out = json_line(d);
    else
      pretty_json(d, std::max(0, o.indent), 0, out);
    std::cout << out << "\n";
    return 0;
  }
  const TensorPrinter printer(o.threshold, o.edgeitems);
  std::ostringstream os;
  if (lazy) {
    os << "LazyStackedTensorDict batch_size=" << shape_str(stack->batch_size()) << " stack_dim=" << stack->stack_dim()
       << " members=" << stack->tensordicts().size() << "\n";
    for (size_t i = 0; i < stack->tensordicts().size(); ++i) {
      const td::TensorDict& m = stack->tensordicts()[i];
      os << "[" << i << "]: " << m.type_name() << " batch_size=" << shape_str(m.batch_size()) << "\n";
      dump_td_text(m, td::NestedKey("[" + std::to_string(i) + "]"), o, printer, os);
    }
  } else {
    os << t.type_name() << " batch_size=" << shape_str(t.batch_size()) << " device="
       << (t.device() ? t.device()->str() : std::string("None")) << "\n";
    dump_td_text(t, td::NestedKey(), o, printer, os);
  }
  std::cout << os.str();
  return 0;
}

// ------------------------------------------------------------------------------------------ verify
bool warning_is_problem(const std::string& w) {
  return w.find("missing") != std::string::npos || w.find("short") != std::string::npos;
}

struct Verifier {
  std::vector<std::string> problems, notes;
  int64_t leaves = 0, bytes = 0;

  void check_file(const tdb::DirNode& node, const std::string& key, const std::string& file, int64_t need,
                  const char* what) {
    const std::string p = join_path(node.path, file);
    int64_t size = 0;
    PathKind k = path_kind(p, &size);
    if (k == PathKind::Missing)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is missing");
    else if (k != PathKind::File)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is not a regular file");
    else if (size < need)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is truncated: expected at least " +
                         std::to_string(need) + " bytes, found " + std::to_string(size));
  }

  void walk(const tdb::DirNode& node) {
    for (const auto& w : node.warnings) (warning_is_problem(w) ? problems : notes).push_back(node.path + ": " + w);
    if (node.kind == tdb::NodeKind::NonTensorData || node.kind == tdb::NodeKind::NonTensorStack) {
      ++leaves;
      if (!node.data && !node.pickle) problems.push_back(node.path + ": non-tensor without data or pickle");
    }
    for (const auto& e : node.entries) {
      if (!e.is_leaf) {
        walk(*e.child);
        continue;
      }
      const tdb::LeafMeta& leaf = e.leaf;
      ++leaves;
      bytes += leaf.nbytes();
      if (!leaf.file.empty())
        check_file(node, leaf.key, leaf.file, leaf.nbytes(), "data file");
      else if (leaf.nbytes() > 0)
        problems.push_back(node.path + ": leaf '" + leaf.key + "' has no data file");
      if (leaf.is_nested && !leaf.shape_file.empty() && leaf.shape.size() == 2)
        check_file(node, leaf.key, leaf.shape_file, leaf.shape[0] * leaf.shape[1] * 8, "sizes file");
    }
  }
};

//! When read_dir fails (it stops at the first error), a tolerant scan of the whole tree to report every
//! problem: unreadable meta.json, missing sub-directories, missing or short leaf files, symlinks (never
//! followed, as read_dir refuses them) and files that are not regular files.
struct FallbackScanner {
  std::vector<std::string> problems;

  static bool is_symlink(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }

  static std::optional<std::string> locate(const std::string& dir, const std::string& key, const std::string& suffix,
                                           PathKind want) {
    std::string enc = tdb::encode_key(key) + suffix;
    if (path_kind(join_path(dir, enc)) == want) return enc;
    if (tdb::is_safe_legacy_key(key, want == PathKind::Directory) && path_kind(join_path(dir, key + suffix)) == want)
      return key + suffix;
    return std::nullopt;
  }

  static std::vector<std::string> subdirs(const std::string& dir) {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* de = ::readdir(d)) {
        std::string n = de->d_name;
        if (n != "." && n != ".." && path_kind(join_path(dir, n)) == PathKind::Directory) out.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void leaf(const std::string& dir, const std::string& meta_path, const std::string& key, const JsonValue& v) {
    const JsonValue* dtype = v.find("dtype");
    const JsonValue* shape = v.find("shape");
    if (!dtype || !shape) return;
    std::optional<at::ScalarType> dt = dtype->is_string() ? tdb::dtype_from_string(dtype->as_string()) : std::nullopt;
    if (!dt) {
      problems.push_back(meta_path + ": leaf '" + key + "': bad dtype " + json_line(*dtype));
      return;
    }
    int64_t numel = 1;
    if (!shape->is_array()) {
      problems.push_back(meta_path + ": leaf '" + key + "': bad shape " + json_line(*shape));
      return;
    }
    for (const auto& d : shape->as_array()) {
      if (!d.is_int() || d.as_int() < 0) {
        problems.push_back(meta_path + ": leaf '" + key + "': bad shape " + json_line(*shape));
        return;
      }
      numel *= d.as_int();
    }
    const JsonValue* nested = v.find("is_nested");
    const bool is_nested = nested && nested->is_bool() && nested->as_bool();
    const int64_t need = is_nested ? 0 : numel * static_cast<int64_t>(c10::elementSize(*dt));
    const std::string enc = join_path(dir, tdb::encode_key(key) + ".memmap");
    if (is_symlink(enc)) {
      problems.push_back(enc + ": data file of leaf '" + key + "' is a symlink");
      return;
    }
    if (path_kind(enc) == PathKind::Other) {
      problems.push_back(enc + ": data file of leaf '" + key + "' is not a regular file");
      return;
    }
    auto name = locate(dir, key, ".memmap", PathKind::File);
    if (!name) {
      if (numel > 0)
        problems.push_back(join_path(dir, tdb::encode_key(key) + ".memmap") + ": data file of leaf '" + key +
                           "' is missing");
      return;
    }
    int64_t size = 0;
    path_kind(join_path(dir, *name), &size);
    if (size < need)
      problems.push_back(join_path(dir, *name) + ": data file of leaf '" + key + "' is truncated: expected at least " +
                         std::to_string(need) + " bytes, found " + std::to_string(size));
  }

  //! scans `dir`; sub-directories are scanned when they hold a meta.json or the meta.json here lists them
  void scan(const std::string& dir, int depth = 0) {
    if (depth > 128) return;
    const std::string meta_path = join_path(dir, "meta.json");
    if (is_symlink(meta_path)) {
      problems.push_back(meta_path + ": is a symlink");
      return;
    }
    if (path_kind(meta_path) != PathKind::File) {
      problems.push_back(dir + ": missing meta.json");
      return;
    }
    std::vector<std::string> listed;
    std::ifstream in(meta_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      JsonValue meta = JsonValue::parse(ss.str());
      if (!meta.is_object()) {
        problems.push_back(meta_path + ": expected a JSON object, found " + JsonValue::kind_name(meta.kind()));
      } else {
        for (const auto& kv : meta.as_object()) {
          if (!kv.second.is_object()) continue;
          if (kv.second.find("type")) {
            if (auto name = locate(dir, kv.first, "", PathKind::Directory))
              listed.push_back(*name);
            else
              problems.push_back(meta_path + ": sub-collection '" + kv.first + "' has no directory '" +
                                 tdb::encode_key(kv.first) + "'");
          } else {
            leaf(dir, meta_path, kv.first, kv.second);
          }
        }
      }
    } catch (const std::exception& e) {
      problems.push_back(meta_path + ": " + e.what());
    }
    for (const auto& s : subdirs(dir)) {
      const std::string sub = join_path(dir, s);
      if (path_kind(join_path(sub, "meta.json")) != PathKind::File &&
          std::find(listed.begin(), listed.end(), s) == listed.end())
        continue;
      if (is_symlink(sub))
        problems.push_back(sub + ": is a symlink");
      else
        scan(sub, depth + 1);
    }
  }
};

int cmd_verify(const std::string& path) {
  if (InputKind k = input_kind(path); k != InputKind::Memmap) return cmd_verify_store(path, k);
  check_input_dir(path);
  Verifier v;
  try {
    tdb::ReadOptions ro;
    ro.allow_missing = true;  // reported as a problem by walk
    tdb::DirNode root = tdb::read_dir(path, ro);
    v.walk(root);
  } catch (const td::Error& e) {
    FallbackScanner scan;
    scan.scan(path);
    v.problems = scan.problems;
    if (v.problems.empty()) v.problems.push_back(e.what());
  }
  for (const auto& n : v.notes) std::cout << "note: " << n << "\n";
  if (!v.problems.empty()) {
    for (const auto& p : v.problems) std::cout << "PROBLEM: " << p << "\n";
    std::cout << "FAILED: " << v.problems.size() << " problem" << (v.problems.size() == 1 ? "" : "s") << " in " << path
              << "\n";
    return kExitProblems;
  }
  std::cout << "OK: " << v.leaves << " leaves, " << v.bytes << " bytes";
  if (v.bytes >= 1024) std::cout << " (" << human_bytes(v.bytes) << ")";
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tdx: inspect tensordict memmap directories, HDF5 files (PersistentTensorDict) and Redis stores\n"
               "(TensorDictStore), and convert between them. info/dump/verify never modify what they read.\n"
               "Exit: 0 ok, 1 verify found problems, 2 error.",
               "tdx"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");

  std::string path;
  bool files = false;
  size_t width = 60;
  CLI::App* info = app.add_subcommand("info", "the tree of a memmap directory: keys, kinds, dtypes, shapes, sizes, "
                                              "non-tensor values, sub-TensorDicts, lazy stacks, totals");
  info->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();
  info->add_flag("--files", files, "also show each leaf's file name and size on disk");
  info->add_option("--width", width, "truncate non-tensor values to this many characters")->capture_default_str();

  DumpOptions dump_opts;
  bool no_values = false;
  CLI::App* dump = app.add_subcommand("dump", "every leaf with its values (text like torch prints, or --json: the "
                                              "fixtures' expected.json layout)");
  dump->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();
  dump->add_flag("--json", dump_opts.json, "JSON: {loaded_type, structure, leaves} (NaN/Infinity as Python writes)");
  dump->add_flag("--compact", dump_opts.compact, "with --json: one line instead of indented");
  dump->add_option("--indent", dump_opts.indent, "with --json: spaces per level")->capture_default_str();
  dump->add_flag("--no-values", no_values, "a summary: keys, dtypes and shapes without the values");
  dump->add_option("--threshold", dump_opts.threshold, "text: summarize tensors with more elements (like torch)")
      ->capture_default_str();
  dump->add_option("--edgeitems", dump_opts.edgeitems, "text: elements kept at each end when summarizing")
      ->capture_default_str();

  CLI::App* verify = app.add_subcommand("verify", "check meta.json files and that every leaf file is present and "
                                                  "long enough; prints OK or one line per problem (exit 1)");
  verify->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();

  std::string dst_path;
  ConvertOptions conv_opts;
  CLI::App* convert = app.add_subcommand("convert", "copy SRC to DST (memmap directory, .h5 file, Redis store: any "
                                                    "pair) in row chunks of <= 64 MiB; prints the throughput");
  convert->add_option("SRC", path, "memmap directory, .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")
      ->required();
  convert->add_option("DST", dst_path, "a new memmap directory, a new .h5/.hdf5 file, or redis://HOST:PORT/DB?prefix=P "
                                       "(a new store; its address is printed)")
      ->required();
  convert->add_flag("--quiet,-q", conv_opts.quiet, "no progress bar");
  convert->add_flag("--force", conv_opts.force, "replace an existing DST file or directory / write into a given td_id");

  // a clearer message than CLI11's "arguments were not expected" for a mistyped subcommand
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    if (sub != "info" && sub != "dump" && sub != "verify" && sub != "convert") {
      std::cerr << "tdx: unknown subcommand '" << sub << "' (expected info, dump, verify or convert; see tdx --help)\n";
      return kExitError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitError;
  }

  try {
    if (*info) return cmd_info(path, files, width);
    if (*dump) {
      dump_opts.values = !no_values;
      dump_opts.width = std::max<size_t>(width, 200);
      return cmd_dump(path, dump_opts);
    }
    if (*verify) return cmd_verify(path);
    if (*convert) return cmd_convert(path, dst_path, conv_opts);
  } catch (const ToolError& e) {
    std::cerr << "tdx: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {  // tensordict::Error (FormatError...), c10::Error, I/O
    std::string what = e.what();
    if (auto nl = what.find("\nException raised from"); nl != std::string::npos) what.resize(nl);  // c10 backtraces
    std::cerr << "tdx: " << (*convert ? "convert " + path + " -> " + dst_path : path) << ": " << what << "\n";
    return kExitError;
  }
  return kExitError;
}
