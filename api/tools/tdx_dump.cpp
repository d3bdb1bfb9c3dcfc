// tdx dump: every leaf as text (the way torch prints tensors) or as JSON (describe()'s layout), written to
// stdout leaf by leaf. JSON values are streamed in chunks of rows, so memory stays bounded whatever a leaf's
// size; the text form reads only the elements it prints.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tdx_common.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tree.hpp"

namespace tdx {
namespace {

// ------------------------------------------------------------------------------------------ torch-like tensor text
//! the text form prints at most this many elements of one tensor (its text is built in memory)
constexpr int64_t kMaxPrintedElements = int64_t(1) << 22;

//! Formats a tensor the way Python's torch prints it (tensor([...]), 4 decimals, common width, "..." summaries
//! above `threshold` elements keeping `edgeitems` per side, 80-column lines, dtype suffix for non-default dtypes).
//! Only the printed elements are read (a summary of a mapped leaf touches a few pages).
class TensorPrinter {
 public:
  TensorPrinter(int64_t threshold, int64_t edgeitems) : threshold_(threshold), edge_(edgeitems) {}

  std::string format(const at::Tensor& tensor, const std::string& name) const {
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
    // strides in elements (C order)
    s.strides.assign(s.sizes.size(), 1);
    for (int64_t i = static_cast<int64_t>(s.sizes.size()) - 2; i >= 0; --i)
      s.strides[i] = s.strides[i + 1] * s.sizes[i + 1];
    // how many elements print (no overflow whatever edgeitems is)
    int64_t printed = 1;
    for (int64_t n : s.sizes) {
      const int64_t k = ellipsis(s, n) ? 2 * edge_ : n;
      if (__builtin_mul_overflow(printed, k, &printed)) printed = std::numeric_limits<int64_t>::max();
    }
    if (printed > kMaxPrintedElements)
      throw ToolError("leaf '" + name + "' would print " + std::to_string(printed) + " elements (more than " +
                      std::to_string(kMaxPrintedElements) + "): lower --threshold or --edgeitems, or use dump --json, "
                      "which streams any size");
    // pass 1: which elements are printed; only those are read
    std::vector<int64_t> shown;
    shown.reserve(static_cast<size_t>(printed));
    collect(s, 0, 0, shown);
    at::Tensor flat = t.reshape({-1});
    at::Tensor picked =
        static_cast<int64_t>(shown.size()) == t.numel()
            ? flat
            : flat.index_select(0, at::from_blob(shown.data(), {static_cast<int64_t>(shown.size())}, at::kLong));
    if (s.kind == Kind::Bool) {
      at::Tensor b = picked.contiguous();
      s.bools.assign(b.data_ptr<bool>(), b.data_ptr<bool>() + b.numel());
    } else if (s.kind == Kind::Int) {
      at::Tensor l = picked.to(at::kLong).contiguous();
      s.ints.assign(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
    } else if (s.kind == Kind::Float) {
      at::Tensor d = picked.to(at::kDouble).contiguous();
      s.doubles.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
    } else {
      at::Tensor d = at::view_as_real(picked.to(at::kComplexDouble)).contiguous().reshape({-1});
      s.doubles.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
    }
    choose_format(s, static_cast<int64_t>(shown.size()));
    const int indent = 7;  // strlen("tensor(")
    int64_t next = 0;      // render visits the printed elements in collect's order
    std::string body = s.sizes.empty() ? element(s, next) : render(s, 0, indent, next);
    return "tensor(" + body + suffix + ")";
  }

 private:
  enum class Kind { Bool, Int, Float, Complex };
  struct State {
    std::vector<int64_t> sizes, strides;
    bool summarize = false;
    Kind kind = Kind::Float;
    std::vector<bool> bools;  // the printed elements, in order
    std::vector<int64_t> ints;
    std::vector<double> doubles;
    bool int_mode = false, sci = false;
    size_t width = 0;
  };

  //! torch: summarize a dim when its size > 2 * edgeitems (written so that a huge edgeitems cannot overflow)
  bool ellipsis(const State& s, int64_t n) const { return s.summarize && edge_ <= (n - 1) / 2; }

  //! the indices printed along a dim of size n
  std::vector<int64_t> positions(const State& s, int64_t n, bool* ell) const {
    std::vector<int64_t> out;
    *ell = ellipsis(s, n);
    if (*ell) {
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

  void choose_format(State& s, int64_t n) const {
    if (s.kind == Kind::Float || s.kind == Kind::Complex) {
      // python torch._tensor_str._Formatter
      std::vector<double> nz;
      bool all_int = true;
      for (double v : s.doubles) {
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
    for (int64_t i = 0; i < n; ++i) s.width = std::max(s.width, raw(s, i).size());
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

  std::string element(const State& s, int64_t& next) const {
    std::string r = raw(s, next++);
    if (r.size() < s.width) r.insert(0, s.width - r.size(), ' ');
    return r;
  }

  std::string render(const State& s, size_t dim, int indent, int64_t& next) const {
    bool ell = false;
    std::vector<int64_t> pos = positions(s, s.sizes[dim], &ell);
    const size_t half = pos.size() / 2;
    std::vector<std::string> items;
    if (dim + 1 == s.sizes.size()) {
      for (size_t j = 0; j < pos.size(); ++j) {
        if (ell && j == half) items.push_back(" ...");  // torch's spelling in the last dim
        items.push_back(element(s, next));
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
      items.push_back(render(s, dim + 1, indent + 1, next));
    }
    const std::string sep =
        "," + std::string(s.sizes.size() - dim - 1, '\n') + std::string(static_cast<size_t>(indent + 1), ' ');
    std::string out = "[";
    for (size_t j = 0; j < items.size(); ++j) out += (j ? sep : "") + items[j];
    return out + "]";
  }

  int64_t threshold_, edge_;
};

//! "sub/deeper/y"; a part that could be misread ("a/b", "", " x") is shown JSON-quoted; control characters
//! are escaped
std::string key_path(const td::NestedKey& key) {
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    const std::string& p = key[i];
    const bool quote = p.empty() || p.find('/') != std::string::npos || p.front() == ' ' || p.back() == ' ' ||
                       p.front() == '"';
    out += (i ? "/" : "") + (quote ? json_line(JsonValue(p)) : p);
  }
  return escape_text(out);
}

//! writes `text` with "    " before every non-empty line
void write_indented(const std::string& text, std::ostream& os) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) os << (line.empty() ? "" : "    ") << line << "\n";
}

void dump_td_text(const td::TensorDict& t, const td::NestedKey& prefix, const DumpOptions& o,
                  const TensorPrinter& printer, std::ostream& os) {
  td::walk_entries(t, [&](const td::NestedKey& rel, const td::Entry& e) {
    const td::NestedKey key = prefix + rel;
    const std::string name = key_path(key);
    if (e.is_tensordict()) {
      td::TensorDict c = e.tensordict();
      os << name << "/: " << c.type_name() << " batch_size=" << shape_str(c.batch_size()) << "\n";
      check_stdout();
      return true;
    } else if (e.is_tensor()) {
      const at::Tensor& x = e.tensor();
      os << name << ": " << td::dtype_repr(x.scalar_type()) << " " << shape_str(x.sizes().vec()) << "\n";
      if (o.values) write_indented(printer.format(x, name), os);
    } else if (e.is_non_tensor_data()) {
      os << name << ": NonTensorData batch_size=" << shape_str(e.non_tensor_data().batch_size()) << "\n";
      if (o.values) os << "    " << escape_text(truncate(json_line(e.non_tensor_data().value()), o.width)) << "\n";
    } else if (e.is_non_tensor_stack()) {
      os << name << ": NonTensorStack batch_size=" << shape_str(e.non_tensor_stack().batch_size()) << "\n";
      if (o.values) os << "    " << escape_text(truncate(json_line(e.non_tensor_stack().tolist()), o.width)) << "\n";
    }
    check_stdout();  // a full stdout stops the dump at the leaf it could not write
    return false;
  });
}

// ------------------------------------------------------------------------------------------ streamed JSON
//! elements per formatted piece of a leaf's values (a multiple of the page size for every element size)
constexpr int64_t kValuesPerPiece = int64_t(1) << 16;

//! Writes describe()'s document (built without values) as pretty_json / json_line would write it with values,
//! fetching each tensor leaf's values piece by piece: `leaf(member, key)` gives the leaf's tensor (a view of a
//! mapping, or a store's handle read in row chunks by `rows`).
class JsonStreamer {
 public:
  //! the values of one leaf, in pieces: calls `piece` with consecutive flat chunks (C order)
  using LeafReader = std::function<void(int member, const td::NestedKey& key,
                                        const std::function<void(const at::Tensor&)>& piece)>;

  JsonStreamer(std::ostream& os, int indent, bool compact, LeafReader reader)
      : os_(os), indent_(indent), compact_(compact), reader_(std::move(reader)) {}

  void write(const JsonValue& doc) {
    value(doc, 0, "");
    os_ << "\n";
  }

 private:
  static bool is_scalar(const JsonValue& v) { return !v.is_array() && !v.is_object(); }
  static bool is_tensor_leaf(const JsonValue& v) {
    const JsonValue* kind = v.find("kind");
    return kind && kind->is_string() && kind->as_string() == "tensor" && v.find("key") && !v.find("values");
  }

  void value(const JsonValue& v, int level, const std::string& name) {
    if (v.is_object())
      object(v, level, name);
    else if (v.is_array())
      array(v, level, name);
    else
      os_ << json_line(v);
  }

  void object(const JsonValue& v, int level, const std::string& name) {
    const auto& o = v.as_object();
    const bool values = name == "leaves[]" && reader_ && is_tensor_leaf(v);
    const size_t n = o.size() + (values ? 1 : 0);
    if (n == 0) {
      os_ << "{}";
      return;
    }
    const std::string pad(compact_ ? 0 : static_cast<size_t>(indent_ * (level + 1)), ' ');
    os_ << (compact_ ? "{" : "{\n");
    for (size_t i = 0; i < n; ++i) {
      os_ << pad;
      if (i < o.size()) {
        os_ << json_line(JsonValue(o[i].first)) << (compact_ ? ":" : ": ");
        value(o[i].second, level + 1, o[i].first);
      } else {
        os_ << json_line(JsonValue("values")) << (compact_ ? ":" : ": ");
        leaf_values(v);
      }
      if (i + 1 < n) os_ << ",";
      if (!compact_) os_ << "\n";
    }
    if (!compact_) os_ << std::string(static_cast<size_t>(indent_ * level), ' ');
    os_ << "}";
  }

  void array(const JsonValue& v, int level, const std::string& name) {
    const auto& a = v.as_array();
    const char* sep = compact_ ? "," : ", ";
    if (compact_ || std::all_of(a.begin(), a.end(), is_scalar)) {  // values, shapes, keys: one line
      os_ << "[";
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) os_ << (compact_ ? "," : sep);
        if (name == "tensordicts") member_ = static_cast<int>(i);
        value(a[i], level + 1, name + "[]");
      }
      os_ << "]";
      return;
    }
    const std::string pad(static_cast<size_t>(indent_ * (level + 1)), ' ');
    os_ << "[\n";
    for (size_t i = 0; i < a.size(); ++i) {
      if (name == "tensordicts") member_ = static_cast<int>(i);
      os_ << pad;
      value(a[i], level + 1, name + "[]");
      os_ << (i + 1 < a.size() ? ",\n" : "\n");
    }
    os_ << std::string(static_cast<size_t>(indent_ * level), ' ') << "]";
  }

  //! "[v, v, ...]": each piece through tensor_values (describe()'s numbers), written at once
  void leaf_values(const JsonValue& leaf) {
    td::NestedKey key;
    for (const auto& p : leaf.find("key")->as_array()) key = key + p.as_string();
    bool first = true;
    os_ << "[";
    reader_(member_, key, [&](const at::Tensor& piece) {
      std::string text = json_line(td::tensor_values(piece));  // "[a,b,c]": numbers hold no ','
      if (text.size() <= 2) return;
      if (!first) os_ << (compact_ ? "," : ", ");
      first = false;
      if (compact_) {
        os_.write(text.data() + 1, static_cast<std::streamsize>(text.size() - 2));
      } else {
        std::string spaced;
        spaced.reserve(text.size() * 5 / 4);
        for (size_t i = 1; i + 1 < text.size(); ++i) {
          spaced += text[i];
          if (text[i] == ',') spaced += ' ';
        }
        os_ << spaced;
      }
      check_stdout();
    });
    os_ << "]";
  }

  std::ostream& os_;
  int indent_;
  bool compact_;
  LeafReader reader_;
  int member_ = -1;
};

//! feeds `x` to `piece` in flat chunks of kValuesPerPiece elements; the pages of a read-only mapping (a
//! directory's leaf) are dropped after each chunk, so a leaf of any size costs a bounded resident set
void stream_tensor(const at::Tensor& x, const std::function<void(const at::Tensor&)>& piece) {
  at::Tensor flat = x.detach().cpu().contiguous().reshape({-1});
  const auto map = tdb::mapping_of(flat);
  const bool drop = map && !map->writable && !map->anonymous;
  const int64_t n = flat.numel();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t a = 0; a < n; a += kValuesPerPiece) {
    const int64_t b = std::min(n, a + kValuesPerPiece);
    at::Tensor part = flat.slice(0, a, b);
    piece(part);
    if (drop) {  // clean private pages: dropped, read again from the file if ever touched
      const auto begin = reinterpret_cast<uintptr_t>(part.data_ptr()) & ~(page - 1);
      const auto end = (reinterpret_cast<uintptr_t>(part.data_ptr()) + static_cast<uintptr_t>(part.nbytes()) + page - 1) &
                       ~(page - 1);
      ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    }
  }
}

//! a store's document without values, from one row: full shapes and batch sizes, loaded_type the store's
//! type, non-tensor leaves read whole
JsonValue store_doc(const td::TensorDict& t) {
  const td::BatchSize batch = t.batch_size();
  const Layout l = layout_of(t);
  JsonValue d = td::describe(preview_of(t), false);
  std::map<std::vector<std::string>, JsonValue> non_tensors;
  if (!l.non_tensors.empty()) {
    td::TensorDict nts(batch);
    for (const auto& nt : l.non_tensors) nts.set(nt.first, t.get_entry(nt.first));
    const JsonValue described = td::describe(nts, true);
    for (const auto& leaf : described.find("leaves")->as_array()) {
      std::vector<std::string> k;
      for (const auto& p : leaf.find("key")->as_array()) k.push_back(p.as_string());
      non_tensors[k] = leaf;
    }
  }
  auto set = [](JsonValue& obj, const char* name, JsonValue v) {
    for (auto& kv : obj.as_object())
      if (kv.first == name) kv.second = std::move(v);
  };
  auto full = [&](const JsonValue& shape) {
    std::vector<int64_t> s;
    for (const auto& x : shape.as_array()) s.push_back(x.as_int());
    JsonValue::Array out;
    for (int64_t x : full_shape(s, batch)) out.emplace_back(x);
    return JsonValue(std::move(out));
  };
  set(d, "loaded_type", JsonValue(t.type_name()));
  for (auto& kv : d.as_object()) {
    if (kv.first == "structure") {
      set(kv.second, "batch_size", full(*kv.second.find("batch_size")));
      for (auto& s : kv.second.as_object())
        if (s.first == "sub_tensordicts")
          for (auto& sub : s.second.as_array()) set(sub, "batch_size", full(*sub.find("batch_size")));
    } else if (kv.first == "leaves") {
      for (auto& leaf : kv.second.as_array()) {
        if (leaf.find("kind")->as_string() == "tensor") {
          set(leaf, "shape", full(*leaf.find("shape")));
          continue;
        }
        std::vector<std::string> k;
        for (const auto& p : leaf.find("key")->as_array()) k.push_back(p.as_string());
        if (auto it = non_tensors.find(k); it != non_tensors.end()) leaf = it->second;
      }
    }
  }
  return d;
}

void validate(const DumpOptions& o) {
  if (o.edgeitems < 0) throw ToolError("--edgeitems must be >= 0, got " + std::to_string(o.edgeitems));
  if (o.threshold < 0) throw ToolError("--threshold must be >= 0, got " + std::to_string(o.threshold));
  if (o.indent < 0 || o.indent > 64) throw ToolError("--indent must be between 0 and 64, got " + std::to_string(o.indent));
}

//! a lazy stack (a directory's or a Redis store's, in memory or mapped) as JSON or text; `type` is the class a
//! reader gets (loaded_type)
void dump_lazy(const td::LazyStackedTensorDict& stack, const std::string& type, const DumpOptions& o) {
  if (o.json) {
    JsonValue d = td::describe(stack, false);
    for (auto& kv : d.as_object())
      if (kv.first == "loaded_type") kv.second = JsonValue(type);
    JsonStreamer::LeafReader reader;
    if (o.values)
      reader = [&](int member, const td::NestedKey& key, const std::function<void(const at::Tensor&)>& piece) {
        stream_tensor(stack.tensordicts().at(static_cast<size_t>(member)).get(key), piece);
      };
    JsonStreamer(std::cout, o.indent, o.compact, reader).write(d);
    return;
  }
  const TensorPrinter printer(o.threshold, o.edgeitems);
  std::ostream& os = std::cout;
  os << type << " batch_size=" << shape_str(stack.batch_size()) << " stack_dim=" << stack.stack_dim()
     << " members=" << stack.tensordicts().size() << "\n";
  for (size_t i = 0; i < stack.tensordicts().size(); ++i) {
    const td::TensorDict& m = stack.tensordicts()[i];
    os << "[" << i << "]: " << m.type_name() << " batch_size=" << shape_str(m.batch_size()) << "\n";
    dump_td_text(m, td::NestedKey("[" + std::to_string(i) + "]"), o, printer, os);
  }
}

}  // namespace

int cmd_dump(const std::string& path, const DumpOptions& o) {
  validate(o);
  const int indent = o.indent;
  if (InputKind k = input_kind(path); k != InputKind::Memmap) {
    Input in = open_store_input(path, k);
    if (in.lazy) {
      dump_lazy(*in.lazy, input_type(in), o);
    } else if (o.json) {
      const td::TensorDict t = in.td;
      const Layout l = layout_of(t);
      JsonStreamer::LeafReader reader;
      if (o.values)
        reader = [&](int, const td::NestedKey& key, const std::function<void(const at::Tensor&)>& piece) {
          if (l.batch.empty()) return stream_tensor(t.get(key), piece);
          int64_t row_bytes = 1;
          for (const auto& s : l.tensors)
            if (s.key == key) row_bytes = std::max<int64_t>(1, s.row_bytes);
          const int64_t n = l.batch[0], step = std::max<int64_t>(1, kChunkBytes / row_bytes);
          for (int64_t a = 0; a < n; a += step)  // one read per chunk of rows of this leaf
            stream_tensor(t.index({at::indexing::Slice(a, std::min(n, a + step))}).get(key), piece);
        };
      JsonStreamer(std::cout, indent, o.compact, reader).write(store_doc(t));
    } else {
      const TensorPrinter printer(o.threshold, o.edgeitems);
      std::cout << store_root_line(in.td) << "\n";
      dump_td_text(in.td.to_tensordict(), td::NestedKey(), o, printer, std::cout);
    }
    in.close();
    return 0;
  }
  check_input_dir(path);
  const auto load = td::LoadOptions().writable(false).on_warning(
      [](const std::string& w) { std::cerr << "tdx: warning: " << escape_text(w) << "\n"; });
  if (td::is_lazy_stack_dir(path)) {
    dump_lazy(td::LazyStackedTensorDict::load_memmap(path, load), "LazyStackedTensorDict", o);
    return 0;
  }
  const td::TensorDict t = td::TensorDict::load_memmap(path, load);
  if (o.json) {
    JsonValue d = td::describe(t, false);
    JsonStreamer::LeafReader reader;
    if (o.values)
      reader = [&](int, const td::NestedKey& key, const std::function<void(const at::Tensor&)>& piece) {
        stream_tensor(t.get(key), piece);
      };
    JsonStreamer(std::cout, indent, o.compact, reader).write(d);
    return 0;
  }
  const TensorPrinter printer(o.threshold, o.edgeitems);
  std::cout << t.type_name() << " batch_size=" << shape_str(t.batch_size()) << " device="
            << (t.device() ? t.device()->str() : std::string("None")) << "\n";
  dump_td_text(t, td::NestedKey(), o, printer, std::cout);
  return 0;
}

}  // namespace tdx
