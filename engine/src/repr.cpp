// repr(td): upstream's layout, character for character (TensorDictBase.__repr__, utils._td_fields,
// NonTensorDataBase.__repr__, NonTensorStack.__repr__), including Python's textwrap.indent rule that
// whitespace-only lines are not indented and the alphabetical sort of the whole "key: value" strings.
#include <ATen/MapAllocator.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include <iterator>

#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"

namespace tensordict {
namespace detail {

std::string dtype_str(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kHalf: return "torch.float16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kBool: return "torch.bool";
    case at::kQInt8: return "torch.qint8";
    case at::kQUInt8: return "torch.quint8";
    case at::kQInt32: return "torch.qint32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kQUInt4x2: return "torch.quint4x2";
    case at::kQUInt2x4: return "torch.quint2x4";
    default: {
      std::string s = c10::toString(dtype);
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      return "torch." + s;
    }
  }
}

void tensor_storage_flags(const at::Tensor& t, bool owner_memmap, bool owner_shared, bool* shared, bool* memmap) {
  *shared = t.is_cuda() || owner_shared || owner_memmap;
  bool file_backed = false;
  if (auto m = backends::mapping_of(t)) {
    *shared = true;  // torch: a MapAllocator storage is_shared()
    file_backed = !m->filename.empty();
  } else if (t.has_storage() && at::MapAllocator::fromDataPtr(t.storage().data_ptr()) != nullptr) {
    *shared = true;
  }
  *memmap = owner_memmap || file_backed;
}

}  // namespace detail

namespace {

using detail::shape_str;

// ---------------------------------------------------------------------------------------------- UTF-8
//! byte length of the UTF-8 sequence starting with `c` (1 for invalid lead bytes)
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

//! the string split into code points (each as its UTF-8 bytes)
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t decode(const std::string& cp) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(cp[i])); };
  switch (cp.size()) {
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default: return b(0);
  }
}

std::string join_cps(const std::vector<std::string>& cps, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < to; ++i) s += cps[i];
  return s;
}

// ---------------------------------------------------------------------------------------------- Python text
//! textwrap.indent(text, prefix): prefixes every line (str.splitlines(keepends=True)) that is not
//! whitespace only
std::string py_indent(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    size_t end = text.size();
    while (j < text.size()) {  // find the end of this line (after its line break)
      unsigned char c = static_cast<unsigned char>(text[j]);
      if (c == '\r') {
        end = (j + 1 < text.size() && text[j + 1] == '\n') ? j + 2 : j + 1;
        break;
      }
      if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
        end = j + 1;
        break;
      }
      if (c == 0xC2 && j + 1 < text.size() && static_cast<unsigned char>(text[j + 1]) == 0x85) {
        end = j + 2;
        break;
      }
      if (c == 0xE2 && j + 2 < text.size() && static_cast<unsigned char>(text[j + 1]) == 0x80 &&
          (static_cast<unsigned char>(text[j + 2]) == 0xA8 || static_cast<unsigned char>(text[j + 2]) == 0xA9)) {
        end = j + 3;
        break;
      }
      ++j;
    }
    std::string line = text.substr(i, end - i);
    bool blank = std::all_of(line.begin(), line.end(), [](char ch) {
      unsigned char c = static_cast<unsigned char>(ch);
      return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1f);
    });
    out += blank ? line : prefix + line;
    i = end;
  }
  return out;
}

std::string hex_escape(uint32_t v, int digits, char tag) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\%c%0*x", tag, digits, v);
  return buf;
}

//! the escapes Python's str and bytes reprs share (backslash, the quote, \t \n \r); false for others
bool common_escape(uint32_t c, char q, std::string& out) {
  switch (c) {
    case '\\': out += "\\\\"; return true;
    case '\t': out += "\\t"; return true;
    case '\n': out += "\\n"; return true;
    case '\r': out += "\\r"; return true;
    default: break;
  }
  if (c != static_cast<uint32_t>(static_cast<unsigned char>(q))) return false;
  out += std::string("\\") + q;
  return true;
}

//! Python's repr() of a str. Non-ASCII code points are kept as they are, except the common
//! non-printable ones (C1 controls, NBSP, soft hyphen, zero-width and line/paragraph separators, BOM)
std::string py_repr_str(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (const auto& cp : code_points(s)) {
    uint32_t c = decode(cp);
    if (common_escape(c, q, out)) continue;
    if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) {
      out += hex_escape(c, 2, 'x');
    } else if ((c >= 0x200b && c <= 0x200f) || c == 0x2028 || c == 0x2029 || (c >= 0x2060 && c <= 0x2064) ||
               c == 0xfeff) {
      out += hex_escape(c, 4, 'u');
    } else {
      out += cp;
    }
  }
  return out + q;
}

//! Python's repr() of bytes
std::string py_repr_bytes(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out = "b";
  out += q;
  for (unsigned char c : s) {
    if (common_escape(c, q, out)) continue;
    if (c < 0x20 || c >= 0x7f) {
      out += hex_escape(c, 2, 'x');
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

//! Python's repr() of a float
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return JsonValue(d).dump();
}

//! Python's repr() of the value (lists and dicts as Python prints them; opaque pickled bytes as bytes)
std::string py_repr(const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::Null: return "None";
    case JsonValue::Kind::Bool: return v.as_bool() ? "True" : "False";
    case JsonValue::Kind::Int: return std::to_string(v.as_int());
    case JsonValue::Kind::Double: return py_float(v.as_double());
    case JsonValue::Kind::String: return py_repr_str(v.as_string());
    case JsonValue::Kind::Array: {
      std::string s = "[";
      const auto& a = v.as_array();
      for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + py_repr(a[i]);
      return s + "]";
    }
    case JsonValue::Kind::Object: {
      std::string s = "{";
      const auto& o = v.as_object();
      for (size_t i = 0; i < o.size(); ++i) s += (i ? ", " : "") + py_repr_str(o[i].first) + ": " + py_repr(o[i].second);
      return s + "}";
    }
    case JsonValue::Kind::Bytes: return py_repr_bytes(v.as_bytes().data);
  }
  return "?";
}

//! Python's str(): strings as they are, everything else as repr()
std::string py_str(const JsonValue& v) { return v.is_string() ? v.as_string() : py_repr(v); }

std::string device_str(const std::optional<at::Device>& d) { return d ? d->str() : "None"; }

// ---------------------------------------------------------------------------------------------- entries
std::string tensor_repr(const EntryMeta& m) {
  return std::string(m.memmap ? "MemoryMappedTensor" : "Tensor") + "(shape=" + shape_str(m.shape) + ", device=" +
         device_str(m.device) + ", dtype=" + detail::dtype_str(m.dtype) + ", is_shared=" + (m.shared ? "True" : "False") +
         ")";
}

std::string non_tensor_data_repr(const NonTensorData& d, const std::optional<at::Device>& device) {
  std::string data = py_str(d.value());
  auto cps = code_points(data);
  if (cps.size() > 200) data = join_cps(cps, 0, 20) + "  ...  " + join_cps(cps, cps.size() - 20, cps.size());
  return "NonTensorData(data=" + data + ", batch_size=" + shape_str(d.batch_size()) + ", device=" +
         device_str(device) + ")";
}

std::string non_tensor_stack_repr(const NonTensorStack& s, const std::optional<at::Device>& device) {
  std::string body = py_str(s.tolist());
  auto cps = code_points(body);
  if (cps.size() > 50) body = join_cps(cps, 0, 50) + "...";
  const std::string ind(4, ' ');
  return "NonTensorStack(\n" + py_indent(body, ind) + ",\n" + py_indent("batch_size=" + shape_str(s.batch_size()), ind) +
         ",\n" + py_indent("device=" + device_str(device), ind) + ")";
}

std::string td_repr(const TensorDict& td);

//! the "value" of one "key: value" line, from the key's meta: a tensor's layout is never read; a
//! sub-TensorDict is its own repr; a non-tensor prints its value (a node that does not hold it with its
//! structure, a remote one, reads that value alone)
std::string field_value(const TensorDict& td, const std::string& key, const EntryMeta& m,
                        const std::optional<at::Device>& device) {
  if (m.kind == EntryMeta::Kind::Tensor) return tensor_repr(m);
  if (m.is_tensordict()) return td_repr(td.node()->read(key)->tensordict());
  const std::optional<Entry> v = m.value ? m.value : td.node()->read(key);
  if (!v) return "None";
  switch (v->kind()) {
    case Entry::Kind::NonTensorData: return non_tensor_data_repr(v->non_tensor_data(), device);
    case Entry::Kind::NonTensorStack: return non_tensor_stack_repr(v->non_tensor_stack(), device);
    default: return Entry::kind_name(v->kind());
  }
}

//! "key: value" lines sorted (upstream sorts the whole strings, code point order) and indented as
//! upstream's _td_fields
std::string fields_text(std::vector<std::string> strs) {
  std::sort(strs.begin(), strs.end());
  std::string joined;
  for (size_t i = 0; i < strs.size(); ++i) joined += (i ? ",\n" : "") + strs[i];
  return py_indent("\n" + joined, std::string(4, ' '));
}

//! the field lines of some keys of a lazy stack: a tensor's shape from the members' metas, ragged dims as
//! -1 (upstream get_item_shape); no stacked copy and no read is made for the repr
std::string lazy_fields(const StackMembers& lz, const TensorDict& td, const std::vector<std::string>& keys) {
  const std::vector<TensorDict>& members = *lz.members;
  std::vector<std::string> strs;
  for (const auto& k : keys) {
    std::optional<EntryMeta> first = members.empty() ? std::nullopt : members[0].node()->meta(k);
    std::string v;
    if (first && first->kind == EntryMeta::Kind::Tensor) {
      EntryMeta m = *first;
      for (const auto& member : members) {
        std::optional<EntryMeta> mm = member.node()->meta(k);
        if (!mm || mm->shape.size() != m.shape.size()) continue;
        for (size_t i = 0; i < m.shape.size(); ++i)
          if (mm->shape[i] != m.shape[i]) m.shape[i] = -1;
      }
      m.shape.insert(m.shape.begin() + lz.dim, static_cast<int64_t>(members.size()));
      v = tensor_repr(m);
    } else {
      std::optional<EntryMeta> m = td.node()->meta(k);
      if (!m) continue;
      v = field_value(td, k, *m, td.device());
    }
    strs.push_back(k + ": " + v);
  }
  return fields_text(std::move(strs));
}

//! the field lines of every key of a node, from its metas
std::string node_fields(const TensorDict& td) {
  std::vector<std::string> strs;
  for (const auto& km : td.node()->metas()) strs.push_back(km.first + ": " + field_value(td, km.first, km.second, td.device()));
  return fields_text(std::move(strs));
}

//! the keys each member holds beyond the stack's common keys (upstream's exclusive_fields), sorted
std::vector<std::vector<std::string>> exclusive_keys(const TensorDict& td, const StackMembers& lz) {
  std::vector<std::string> common = td.node()->keys();  // a stack's keys: the members' sorted intersection
  std::vector<std::vector<std::string>> out;
  for (const auto& m : *lz.members) {
    std::vector<std::string> k = m.node()->keys();
    std::sort(k.begin(), k.end());
    std::vector<std::string> only;
    std::set_difference(k.begin(), k.end(), common.begin(), common.end(), std::back_inserter(only));
    out.push_back(std::move(only));
  }
  return out;
}

std::string lazy_repr(const TensorDict& td, const StackMembers& lz) {
  const std::string ind(4, ' ');
  std::string excl;
  std::vector<std::vector<std::string>> only = exclusive_keys(td, lz);
  for (size_t i = 0; i < only.size(); ++i) {
    if (only[i].empty()) continue;
    const TensorDict& member = (*lz.members)[i];
    std::string f;
    if (const StackMembers member_lz = member.node()->stack_members()) {
      f = lazy_fields(member_lz, member, only[i]);
    } else {  // the member's own field lines for the exclusive keys
      std::vector<std::string> strs;
      for (const auto& k : only[i]) {
        std::optional<EntryMeta> m = member.node()->meta(k);
        if (m) strs.push_back(k + ": " + field_value(member, k, *m, td.device()));
      }
      f = fields_text(std::move(strs));
    }
    excl += (excl.empty() ? "" : ",\n") + std::to_string(i) + " ->" + f;
  }
  const bool shared = td.is_shared();
  return "LazyStackedTensorDict(\n" + py_indent("fields={" + lazy_fields(lz, td, td.node()->keys()) + "}", ind) + ",\n" +
         py_indent("exclusive_fields={" + py_indent("\n" + excl, ind) + "}", ind) + ",\n" +
         py_indent("batch_size=" + shape_str(td.batch_size()), ind) + ",\n" +
         py_indent("device=" + device_str(td.device()), ind) + ",\n" +
         py_indent(std::string("is_shared=") + (shared ? "True" : "False"), ind) + ",\n" +
         py_indent("stack_dim=" + std::to_string(lz.dim), ind) + ")";
}

std::string td_repr(const TensorDict& td) {
  if (td.typed_schema()) {  // a typed wrapper: its storage's repr under the class's name
    std::string r = td_repr(td.with_schema(nullptr));
    const std::string dense = "TensorDict(";
    if (r.compare(0, dense.size(), dense) == 0) r = td.typed_schema()->name + "(" + r.substr(dense.size());
    return r;
  }
  if (const StackMembers lz = td.node()->stack_members()) return lazy_repr(td, lz);
  // any other node: its layout from its metas (a store or remote node reads no leaf), under its class name
  const std::string ind(4, ' ');
  const bool shared = td.is_shared() || (td.device() && td.device()->is_cuda());
  return td.node()->type_name() + "(\n" + py_indent("fields={" + node_fields(td) + "}", ind) + ",\n" +
         py_indent("batch_size=" + shape_str(td.batch_size()), ind) + ",\n" +
         py_indent("device=" + device_str(td.device()), ind) + ",\n" +
         py_indent(std::string("is_shared=") + (shared ? "True" : "False"), ind) + ")";
}

}  // namespace

std::string repr(const TensorDict& td) {
  if (!td.defined()) return "TensorDict(undefined)";
  return td_repr(td);
}

std::string repr_batch_size(const BatchSize& bs) { return shape_str(bs); }

std::ostream& operator<<(std::ostream& os, const TensorDict& td) { return os << repr(td); }

}  // namespace tensordict
