// Plain-data pickles (pickle_plain.hpp). The reader keeps containers in an arena so that the memo (BINGET of a
// dict filled after it was memoized) refers to the finished object, and materialises them at STOP.
#include "pickle_plain.hpp"

#include <cstring>
#include <optional>
#include <vector>

#include "tensordict/errors.hpp"

namespace tensordict::pickle {

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void dump(const JsonValue& v, std::string& out, int depth) {
  if (depth > JsonValue::kMaxDepth) throw ValueError("pickle: nesting too deep");
  switch (v.kind()) {
    case JsonValue::Kind::Null: out.push_back('N'); break;
    case JsonValue::Kind::Bool: out.push_back(v.as_bool() ? '\x88' : '\x89'); break;
    case JsonValue::Kind::Int: {
      const int64_t x = v.as_int();
      if (x >= 0 && x < 256) {
        out.push_back('K');
        out.push_back(static_cast<char>(x));
      } else if (x >= INT32_MIN && x <= INT32_MAX) {
        out.push_back('J');
        put_u32(out, static_cast<uint32_t>(static_cast<int32_t>(x)));
      } else {
        out.push_back('\x8a');
        out.push_back(8);
        for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(x) >> (8 * i)) & 0xFF));
      }
      break;
    }
    case JsonValue::Kind::Double: {
      out.push_back('G');
      double d = v.as_double();
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
      break;
    }
    case JsonValue::Kind::String:
      out.push_back('X');
      put_u32(out, static_cast<uint32_t>(v.as_string().size()));
      out += v.as_string();
      break;
    case JsonValue::Kind::Bytes:
      out.push_back('B');
      put_u32(out, static_cast<uint32_t>(v.as_bytes().data.size()));
      out += v.as_bytes().data;
      break;
    case JsonValue::Kind::Array:
      out.push_back(']');
      if (!v.as_array().empty()) {
        out.push_back('(');
        for (const auto& x : v.as_array()) dump(x, out, depth + 1);
        out.push_back('e');
      }
      break;
    case JsonValue::Kind::Object:
      out.push_back('}');
      if (!v.as_object().empty()) {
        out.push_back('(');
        for (const auto& [k, x] : v.as_object()) {
          dump(JsonValue(k), out, depth + 1);
          dump(x, out, depth + 1);
        }
        out.push_back('u');
      }
      break;
  }
}

struct Node {
  enum Kind { Scalar, List, Dict } kind = Scalar;
  JsonValue scalar;
  std::vector<int> items;                    // List (and tuples)
  std::vector<std::pair<int, int>> entries;  // Dict
};

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}

  JsonValue run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;             // PROTO
        case 0x95: take(8); break;            // FRAME
        case '.': {                           // STOP
          if (stack_.size() != 1) fail("the stack does not hold one value at STOP");
          return materialise(stack_.back(), 0);
        }
        case '(': marks_.push_back(stack_.size()); break;
        case '}': push_node(Node::Dict); break;
        case ']': push_node(Node::List); break;
        case ')': push_node(Node::List); break;
        case 'N': push_scalar(JsonValue()); break;
        case 0x88: push_scalar(JsonValue(true)); break;
        case 0x89: push_scalar(JsonValue(false)); break;
        case 'K': push_scalar(JsonValue(static_cast<long long>(byte()))); break;
        case 'M': {
          uint32_t v = le(2);
          push_scalar(JsonValue(static_cast<long long>(v)));
          break;
        }
        case 'J': push_scalar(JsonValue(static_cast<long long>(static_cast<int32_t>(le(4))))); break;
        case 0x8a: {  // LONG1
          const uint8_t n = byte();
          if (n > 8) fail("an integer of more than 64 bits");
          std::string raw = take(n);
          uint64_t v = 0;
          for (size_t i = 0; i < raw.size(); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
          if (n > 0 && n < 8 && (static_cast<uint8_t>(raw[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
          push_scalar(JsonValue(static_cast<long long>(static_cast<int64_t>(v))));
          break;
        }
        case 'G': {
          std::string raw = take(8);
          uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(raw[i]);
          double d;
          std::memcpy(&d, &bits, 8);
          push_scalar(JsonValue(d));
          break;
        }
        case 'X': push_scalar(JsonValue(take(le(4)))); break;
        case 0x8c: push_scalar(JsonValue(take(byte()))); break;
        case 0x8d: push_scalar(JsonValue(take(le64()))); break;
        case 'B': push_scalar(JsonValue(JsonValue::Bytes{take(le(4))})); break;
        case 'C': push_scalar(JsonValue(JsonValue::Bytes{take(byte())})); break;
        case 0x8e: push_scalar(JsonValue(JsonValue::Bytes{take(le64())})); break;
        case 0x94: memo_.push_back(top()); break;  // MEMOIZE
        case 'q': memoize(byte()); break;
        case 'r': memoize(le(4)); break;
        case 'h': get(byte()); break;
        case 'j': get(le(4)); break;
        case 'a': {  // APPEND
          int v = pop();
          list(top()).items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<int> xs = pop_mark();
          auto& l = list(top());
          l.items.insert(l.items.end(), xs.begin(), xs.end());
          break;
        }
        case 's': {  // SETITEM
          int v = pop(), k = pop();
          dict(top()).entries.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<int> xs = pop_mark();
          if (xs.size() % 2) fail("SETITEMS with an odd number of items");
          auto& d = dict(top());
          for (size_t i = 0; i < xs.size(); i += 2) d.entries.emplace_back(xs[i], xs[i + 1]);
          break;
        }
        case 't': tuple(pop_mark()); break;
        case 0x85: tuple(pop_n(1)); break;
        case 0x86: tuple(pop_n(2)); break;
        case 0x87: tuple(pop_n(3)); break;
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("opcode ") + hex + " is not plain data (a class, a call or an object: never executed)");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError("pickle at byte " + std::to_string(pos_) + ": " + why);
  }
  uint8_t byte() {
    if (pos_ >= b_.size()) fail("truncated");
    return static_cast<uint8_t>(b_[pos_++]);
  }
  std::string take(uint64_t n) {
    if (n > b_.size() - pos_) fail("truncated");
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint32_t le(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint32_t>(byte()) << (8 * i);
    return v;
  }
  uint64_t le64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(byte()) << (8 * i);
    return v;
  }
  int add(Node n) {
    if (nodes_.size() > 10'000'000) fail("too many objects");
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }
  void push_node(Node::Kind k) {
    Node n;
    n.kind = k;
    stack_.push_back(add(std::move(n)));
  }
  void push_scalar(JsonValue v) {
    Node n;
    n.scalar = std::move(v);
    stack_.push_back(add(std::move(n)));
  }
  int top() const {
    if (stack_.empty()) fail("empty stack");
    return stack_.back();
  }
  int pop() {
    int v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<int> pop_n(size_t n) {
    if (stack_.size() < n) fail("empty stack");
    std::vector<int> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<int> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail("bad MARK");
    return pop_n(stack_.size() - m);
  }
  void tuple(std::vector<int> xs) {
    Node n;
    n.kind = Node::List;
    n.items = std::move(xs);
    stack_.push_back(add(std::move(n)));
  }
  Node& list(int id) {
    if (nodes_[id].kind != Node::List) fail("APPEND to a value that is not a list");
    return nodes_[id];
  }
  Node& dict(int id) {
    if (nodes_[id].kind != Node::Dict) fail("SETITEM on a value that is not a dict");
    return nodes_[id];
  }
  void memoize(uint32_t i) {
    if (i > 10'000'000) fail("memo index too large");
    if (memo_.size() <= i) memo_.resize(i + 1, -1);
    memo_[i] = top();
  }
  void get(uint32_t i) {
    if (i >= memo_.size() || memo_[i] < 0) fail("memo " + std::to_string(i) + " is not set");
    stack_.push_back(memo_[i]);
  }
  JsonValue materialise(int id, int depth) const {
    if (depth > JsonValue::kMaxDepth) fail("nesting too deep (or a cycle)");
    const Node& n = nodes_[id];
    if (n.kind == Node::Scalar) return n.scalar;
    if (n.kind == Node::List) {
      JsonValue::Array a;
      for (int x : n.items) a.push_back(materialise(x, depth + 1));
      return JsonValue(std::move(a));
    }
    JsonValue::Object o;
    for (const auto& [k, v] : n.entries) {
      const Node& kn = nodes_[k];
      if (kn.kind != Node::Scalar || !kn.scalar.is_string()) fail("a dict key that is not a string");
      o.emplace_back(kn.scalar.as_string(), materialise(v, depth + 1));
    }
    return JsonValue(std::move(o));
  }

  const std::string& b_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> stack_;
  std::vector<size_t> marks_;
  std::vector<int> memo_;
};

}  // namespace

std::string dump_plain(const JsonValue& value) {
  std::string out = "\x80\x02";
  dump(value, out, 0);
  out.push_back('.');
  return out;
}

JsonValue load_plain(const std::string& bytes) { return Reader(bytes).run(); }

}  // namespace tensordict::pickle
