#pragma once
//! JsonValue: the value of a non-tensor leaf: null, bool, int64, double (NaN/Inf too), string, array,
//! object (insertion-ordered), or opaque bytes (a Python pickle kept for re-writing, never executed).
//! Parsing and printing use RapidJSON with NaN/Infinity support (Python's json writes those tokens).
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace tensordict {

class JsonValue {
 public:
  using Array = std::vector<JsonValue>;
  using Object = std::vector<std::pair<std::string, JsonValue>>;
  //! opaque bytes (e.g. other.pickle): carried, compared and re-written, never interpreted
  struct Bytes {
    std::string data;
    bool operator==(const Bytes& o) const { return data == o.data; }
  };
  enum class Kind { Null, Bool, Int, Double, String, Array, Object, Bytes };

  JsonValue() : v_(nullptr) {}
  JsonValue(std::nullptr_t) : v_(nullptr) {}
  JsonValue(bool b) : v_(b) {}
  JsonValue(int i) : v_(int64_t{i}) {}
  JsonValue(long i) : v_(int64_t(i)) {}
  JsonValue(long long i) : v_(int64_t(i)) {}
  JsonValue(unsigned i) : v_(int64_t{i}) {}
  JsonValue(double d) : v_(d) {}
  JsonValue(const char* s) : v_(std::string(s)) {}
  JsonValue(std::string s) : v_(std::move(s)) {}
  JsonValue(Array a) : v_(std::move(a)) {}
  JsonValue(Object o) : v_(std::move(o)) {}
  JsonValue(Bytes b) : v_(std::move(b)) {}
  static JsonValue array(Array a = {}) { return JsonValue(std::move(a)); }
  static JsonValue object(Object o = {}) { return JsonValue(std::move(o)); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_null() const { return kind() == Kind::Null; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_double() const { return kind() == Kind::Double; }
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_array() const { return kind() == Kind::Array; }
  bool is_object() const { return kind() == Kind::Object; }
  bool is_bytes() const { return kind() == Kind::Bytes; }

  //! typed access; a wrong kind throws tensordict::TypeError naming both kinds
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  //!< ints convert
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();
  const Bytes& as_bytes() const;
  //! object member lookup; nullptr when absent (or not an object)
  const JsonValue* find(const std::string& key) const;

  //! structural equality; NaN equals NaN here (values, not IEEE comparisons)
  bool operator==(const JsonValue& o) const;
  bool operator!=(const JsonValue& o) const { return !(*this == o); }

  //! compact JSON text (NaN, Infinity, -Infinity as Python writes them); Bytes become {"__bytes__": hex}
  std::string dump() const;
  //! text layouts. Every style writes NaN / Infinity / -Infinity and doubles in Python's float repr
  //! (shortest round-trip digits, "1.0", "1e-05", "1e+16"), so Python's json.loads reads back the same values.
  enum class Style {
    Compact,        //!< "," and ":" separators, non-ASCII as raw UTF-8 (orjson-like). What dump() writes.
    Python,         //!< json.dumps(v): ", " and ": " separators, ensure_ascii (non-ASCII as \uXXXX)
    PythonCompact,  //!< json.dumps(v, separators=(",", ":")): compact, ensure_ascii
  };
  //! JSON text in the given layout; throws tensordict::ValueError if a string is not valid UTF-8
  std::string dump(Style style) const;
  //! parses JSON text (accepts NaN/Infinity/-Infinity); throws tensordict::FormatError with the offset
  //! Like Python's json.loads: any whitespace, \u escapes, a duplicate object key keeps its first
  //! position and its last value, numbers without fraction/exponent that fit int64 are Int, others Double.
  //! The text must be valid UTF-8; nesting deeper than kMaxDepth is a FormatError (no stack overflow).
  //! {"__bytes__": ...} objects stay objects (Bytes are never produced by parsing).
  static JsonValue parse(const std::string& text);
  static constexpr int kMaxDepth = 512;
  static const char* kind_name(Kind k);

 private:
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, Array, Object, Bytes> v_;
};

std::ostream& operator<<(std::ostream& os, const JsonValue& v);

}  // namespace tensordict
