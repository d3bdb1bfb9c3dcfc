// JsonValue: parsing with RapidJSON's SAX reader (iterative, NaN/Infinity, full precision, UTF-8 validated)
// and a hand-written printer that reproduces Python's json.dumps layouts and float repr.
#include "tensordict/backends/json_value.hpp"

#include <rapidjson/error/en.h>
#include <rapidjson/reader.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "tensordict/errors.hpp"

namespace tensordict {

// ------------------------------------------------------------------------------------------ access
namespace {
[[noreturn]] void wrong_kind(JsonValue::Kind want, JsonValue::Kind got) {
  throw TypeError(std::string("JsonValue: expected ") + JsonValue::kind_name(want) + ", found " +
                  JsonValue::kind_name(got));
}
}  // namespace

const char* JsonValue::kind_name(Kind k) {
  switch (k) {
    case Kind::Null: return "null";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Double: return "double";
    case Kind::String: return "string";
    case Kind::Array: return "array";
    case Kind::Object: return "object";
    case Kind::Bytes: return "bytes";
  }
  return "?";
}

bool JsonValue::as_bool() const {
  if (!is_bool()) wrong_kind(Kind::Bool, kind());
  return std::get<bool>(v_);
}
int64_t JsonValue::as_int() const {
  if (!is_int()) wrong_kind(Kind::Int, kind());
  return std::get<int64_t>(v_);
}
double JsonValue::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(v_));
  if (!is_double()) wrong_kind(Kind::Double, kind());
  return std::get<double>(v_);
}
const std::string& JsonValue::as_string() const {
  if (!is_string()) wrong_kind(Kind::String, kind());
  return std::get<std::string>(v_);
}
const JsonValue::Array& JsonValue::as_array() const {
  if (!is_array()) wrong_kind(Kind::Array, kind());
  return std::get<Array>(v_);
}
JsonValue::Array& JsonValue::as_array() {
  if (!is_array()) wrong_kind(Kind::Array, kind());
  return std::get<Array>(v_);
}
const JsonValue::Object& JsonValue::as_object() const {
  if (!is_object()) wrong_kind(Kind::Object, kind());
  return std::get<Object>(v_);
}
JsonValue::Object& JsonValue::as_object() {
  if (!is_object()) wrong_kind(Kind::Object, kind());
  return std::get<Object>(v_);
}
const JsonValue::Bytes& JsonValue::as_bytes() const {
  if (!is_bytes()) wrong_kind(Kind::Bytes, kind());
  return std::get<Bytes>(v_);
}

const JsonValue* JsonValue::find(const std::string& key) const {
  if (!is_object()) return nullptr;
  for (const auto& kv : std::get<Object>(v_))
    if (kv.first == key) return &kv.second;
  return nullptr;
}

bool JsonValue::operator==(const JsonValue& o) const {
  if (kind() != o.kind()) return false;
  switch (kind()) {
    case Kind::Null: return true;
    case Kind::Bool: return std::get<bool>(v_) == std::get<bool>(o.v_);
    case Kind::Int: return std::get<int64_t>(v_) == std::get<int64_t>(o.v_);
    case Kind::Double: {
      double a = std::get<double>(v_), b = std::get<double>(o.v_);
      return a == b || (std::isnan(a) && std::isnan(b));
    }
    case Kind::String: return std::get<std::string>(v_) == std::get<std::string>(o.v_);
    case Kind::Array: return std::get<Array>(v_) == std::get<Array>(o.v_);
    case Kind::Object: return std::get<Object>(v_) == std::get<Object>(o.v_);
    case Kind::Bytes: return std::get<Bytes>(v_) == std::get<Bytes>(o.v_);
  }
  return false;
}

// ------------------------------------------------------------------------------------------ parse
namespace {

//! SAX handler building a JsonValue tree with an explicit stack (the reader runs iteratively).
struct Builder : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Builder> {
  std::vector<JsonValue> stack;   // open containers
  std::vector<std::string> keys;  // pending member key, one slot per open container
  JsonValue root;
  bool too_deep = false;

  bool add(JsonValue v) {
    if (stack.empty()) {
      root = std::move(v);
      return true;
    }
    JsonValue& top = stack.back();
    if (top.is_array())
      top.as_array().push_back(std::move(v));
    else
      top.as_object().emplace_back(std::move(keys.back()), std::move(v));
    return true;
  }
  bool Null() { return add(JsonValue(nullptr)); }
  bool Bool(bool b) { return add(JsonValue(b)); }
  bool Int(int i) { return add(JsonValue(int64_t{i})); }
  bool Uint(unsigned u) { return add(JsonValue(int64_t{u})); }
  bool Int64(int64_t i) { return add(JsonValue(i)); }
  bool Uint64(uint64_t u) {
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return add(JsonValue(static_cast<int64_t>(u)));
    return add(JsonValue(static_cast<double>(u)));
  }
  bool Double(double d) { return add(JsonValue(d)); }
  bool String(const char* s, rapidjson::SizeType n, bool) { return add(JsonValue(std::string(s, n))); }
  bool open(JsonValue v) {
    if (stack.size() >= static_cast<size_t>(JsonValue::kMaxDepth)) {
      too_deep = true;
      return false;
    }
    stack.push_back(std::move(v));
    keys.emplace_back();
    return true;
  }
  bool StartObject() { return open(JsonValue::object()); }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    keys.back().assign(s, n);
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    JsonValue v = std::move(stack.back());
    stack.pop_back();
    keys.pop_back();
    dedupe(v.as_object());
    return add(std::move(v));
  }
  bool StartArray() { return open(JsonValue::array()); }
  bool EndArray(rapidjson::SizeType) {
    JsonValue v = std::move(stack.back());
    stack.pop_back();
    keys.pop_back();
    return add(std::move(v));
  }
  //! Python dict semantics: a repeated key keeps its first position and takes the last value.
  static void dedupe(JsonValue::Object& obj) {
    if (obj.size() < 2) return;
    std::unordered_map<std::string, size_t> seen;
    seen.reserve(obj.size());
    JsonValue::Object out;
    out.reserve(obj.size());
    for (auto& kv : obj) {
      auto it = seen.find(kv.first);
      if (it == seen.end()) {
        seen.emplace(kv.first, out.size());
        out.push_back(std::move(kv));
      } else {
        out[it->second].second = std::move(kv.second);
      }
    }
    obj = std::move(out);
  }
};

}  // namespace

JsonValue JsonValue::parse(const std::string& text) {
  // A raw NUL byte is never valid JSON; RapidJSON's string stream would treat it as the end of the text.
  if (auto nul = text.find('\0'); nul != std::string::npos)
    throw FormatError("invalid JSON at offset " + std::to_string(nul) + ": unexpected NUL byte");
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                              rapidjson::kParseFullPrecisionFlag | rapidjson::kParseValidateEncodingFlag;
  Builder b;
  rapidjson::Reader reader;
  // RapidJSON 1.1's UTF-8 validation reads up to 3 continuation bytes after a lead byte without stopping
  // at the terminator (found by fuzz_meta_json): pad with NULs so a truncated sequence stays in bounds.
  std::string padded;
  padded.reserve(text.size() + 4);
  padded.append(text).append(4, '\0');
  rapidjson::StringStream ss(padded.c_str());
  rapidjson::ParseResult r = reader.Parse<kFlags>(ss, b);
  if (r.IsError()) {
    if (b.too_deep)
      throw FormatError("invalid JSON at offset " + std::to_string(r.Offset()) + ": nesting deeper than " +
                        std::to_string(kMaxDepth));
    throw FormatError("invalid JSON at offset " + std::to_string(r.Offset()) + ": " +
                      rapidjson::GetParseError_En(r.Code()));
  }
  return std::move(b.root);
}

// ------------------------------------------------------------------------------------------ dump
namespace {

//! Python's float repr: shortest round-trip digits; fixed notation for 1e-4 <= |d| < 1e16, else "1.5e+16".
void append_double(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "NaN";
    return;
  }
  if (std::isinf(d)) {
    out += d > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // [-]D[.DDD]e(+|-)XX
  size_t pos = 0;
  if (s[0] == '-') {
    out += '-';
    pos = 1;
  }
  size_t e = s.find('e');
  std::string digits(1, s[pos]);
  if (s[pos + 1] == '.') digits.append(s, pos + 2, e - pos - 2);
  int exp = std::atoi(s.c_str() + e + 1);
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      size_t ip = static_cast<size_t>(exp) + 1;
      if (digits.size() <= ip) {
        out += digits;
        out.append(ip - digits.size(), '0');
        out += ".0";
      } else {
        out.append(digits, 0, ip);
        out += '.';
        out.append(digits, ip, std::string::npos);
      }
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    out += 'e';
    out += exp < 0 ? '-' : '+';
    int a = exp < 0 ? -exp : exp;
    if (a < 10) out += '0';
    out += std::to_string(a);
  }
}

//! Decodes one UTF-8 sequence at s[i]; returns the code point and advances i; -1 on invalid input.
long next_code_point(const std::string& s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n;
  long cp;
  if ((c & 0xE0) == 0xC0) {
    n = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3;
    cp = c & 0x07;
  } else {
    return -1;
  }
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size()) return -1;
    auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static const long kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  i += static_cast<size_t>(n) + 1;
  return cp;
}

void append_u_escape(std::string& out, long cp) {
  static const char* hex = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += hex[(cp >> shift) & 0xF];
}

void append_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    // a run of printable ASCII without a quote or a backslash is copied as it is, in one append (one append per
    // code point was 40% of writing a save's meta.json files, callgrind)
    size_t run = i;
    while (run < s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[run]);
      if (c < 0x20 || c > 0x7E || c == '"' || c == '\\') break;
      ++run;
    }
    if (run > i) {
      out.append(s, i, run - i);
      i = run;
      continue;
    }
    size_t start = i;
    long cp = next_code_point(s, i);
    if (cp < 0)
      throw ValueError("JsonValue::dump: string is not valid UTF-8 (byte offset " + std::to_string(start) + ")");
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp >= 0x10000) {  // surrogate pair, as Python writes it
        long v = cp - 0x10000;
        append_u_escape(out, 0xD800 + (v >> 10));
        append_u_escape(out, 0xDC00 + (v & 0x3FF));
      } else {
        append_u_escape(out, cp);
      }
    } else {
      out.append(s, start, i - start);
    }
  }
  out += '"';
}

struct Printer {
  std::string out;
  bool ensure_ascii;
  const char* item_sep;
  const char* key_sep;

  void value(const JsonValue& v) {
    switch (v.kind()) {
      case JsonValue::Kind::Null: out += "null"; break;
      case JsonValue::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
      case JsonValue::Kind::Int: out += std::to_string(v.as_int()); break;
      case JsonValue::Kind::Double: append_double(out, v.as_double()); break;
      case JsonValue::Kind::String: append_string(out, v.as_string(), ensure_ascii); break;
      case JsonValue::Kind::Array: {
        out += '[';
        bool first = true;
        for (const auto& e : v.as_array()) {
          if (!first) out += item_sep;
          first = false;
          value(e);
        }
        out += ']';
        break;
      }
      case JsonValue::Kind::Object: {
        out += '{';
        bool first = true;
        for (const auto& kv : v.as_object()) {
          if (!first) out += item_sep;
          first = false;
          append_string(out, kv.first, ensure_ascii);
          out += key_sep;
          value(kv.second);
        }
        out += '}';
        break;
      }
      case JsonValue::Kind::Bytes: {
        static const char* hex = "0123456789abcdef";
        out += "{\"__bytes__\"";
        out += key_sep;
        out += '"';
        for (unsigned char c : v.as_bytes().data) {
          out += hex[c >> 4];
          out += hex[c & 0xF];
        }
        out += "\"}";
        break;
      }
    }
  }
};

}  // namespace

std::string JsonValue::dump() const { return dump(Style::Compact); }

std::string JsonValue::dump(Style style) const {
  Printer p;
  p.ensure_ascii = style != Style::Compact;
  p.item_sep = style == Style::Python ? ", " : ",";
  p.key_sep = style == Style::Python ? ": " : ":";
  p.value(*this);
  return std::move(p.out);
}

std::ostream& operator<<(std::ostream& os, const JsonValue& v) {
  try {
    return os << v.dump();
  } catch (const ValueError&) {
    return os << "<JsonValue with invalid UTF-8>";
  }
}

}  // namespace tensordict
