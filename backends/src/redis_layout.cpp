// The Redis layout (Python's TensorDictStore, shared/reference/upstream-formats.md): connection options,
// store ids, key names, shapes and leaf paths as text, leaf metadata and non-tensor encodings; the helpers
// the Redis store's sources share (redis_internal.hpp).
#include "tensordict/backends/shape_text.hpp"
#include "redis_internal.hpp"

#include <ATen/EmptyTensor.h>

#include <cstring>
#include <random>

#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

namespace redis_detail {

int64_t checked_nbytes(const std::vector<int64_t>& shape, int64_t itemsize, size_t from) {
  int64_t n = itemsize;
  for (size_t i = from; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d < 0) return -1;
    if (d == 0) {
      n = 0;
      continue;
    }
    if (n != 0 && n > kRedisMaxValueBytes / d) {
      // keep scanning: a later 0 makes the total 0
      bool zero = false;
      for (size_t j = i + 1; j < shape.size(); ++j) zero = zero || shape[j] == 0;
      return zero ? 0 : -1;
    }
    n *= d;
  }
  return n;
}

at::Tensor tensor_from_bytes(std::string&& bytes, at::ScalarType dtype, at::IntArrayRef shape) {
  // small values (a row) are copied into a plain CPU tensor: cheaper than a heap holder and a from_blob
  // deleter; large ones keep the reply's buffer (no copy)
  if (bytes.size() <= 64 * 1024) {
    at::Tensor t = at::detail::empty_cpu(shape, dtype);
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return t;
  }
  auto* holder = new std::string(std::move(bytes));
  return at::from_blob(holder->data(), shape, [holder](void*) { delete holder; }, at::TensorOptions().dtype(dtype));
}

std::map<std::string, std::string> hash_fields(const RedisReply& r) {
  std::map<std::string, std::string> out;
  if (!r.is_array()) return out;
  for (size_t i = 0; i + 1 < r.elements.size(); i += 2) out[r.elements[i].str] = r.elements[i + 1].str;
  return out;
}

void check_leaf_path(const LeafPath& path) {
  if (path.empty()) throw ValueError("a Redis leaf path cannot be empty");
  for (const auto& p : path) {
    if (p.empty()) throw ValueError("a Redis key part cannot be empty: '" + redis_join_path(path) + "'");
    if (p.find('.') != std::string::npos)
      throw ValueError("a Redis key part cannot contain '.' (the nesting separator): '" + p + "'");
  }
}

}  // namespace redis_detail

using namespace redis_detail;

// ------------------------------------------------------------------------------------------ helpers
RedisConnectOptions RedisOptions::connect_options() const {
  RedisConnectOptions c;
  c.host = host_;
  c.port = port_;
  c.unix_socket = unix_socket_;
  c.db = db_;
  c.user = user_;
  c.password = password_;
  c.connect_timeout_ms = connect_timeout_ms_;
  c.command_timeout_ms = command_timeout_ms_;
  c.retries = retries_;
  c.retry_delay_ms = retry_delay_ms_;
  return c;
}

std::string new_redis_td_id() {
  static thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  unsigned char b[16];
  uint64_t a = gen(), c = gen();
  std::memcpy(b, &a, 8);
  std::memcpy(b + 8, &c, 8);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}

std::string redis_key(const std::string& prefix, const std::string& td_id, const std::string& suffix) {
  return prefix + ":{" + td_id + "}:" + suffix;
}

std::string redis_shape_text(const std::vector<int64_t>& shape) { return shape_text(shape); }

std::vector<int64_t> parse_redis_shape(const std::string& text, const std::string& what) {
  JsonValue v;
  try {
    v = JsonValue::parse(text);
  } catch (const FormatError& e) {
    throw FormatError(what + ": invalid shape '" + text.substr(0, 64) + "': " + e.message());
  }
  if (!v.is_array()) throw FormatError(what + ": shape is not a JSON list: '" + text.substr(0, 64) + "'");
  std::vector<int64_t> out;
  for (const auto& e : v.as_array()) {
    if (!e.is_int() || e.as_int() < 0)
      throw FormatError(what + ": shape must hold non-negative integers: '" + text.substr(0, 64) + "'");
    out.push_back(e.as_int());
  }
  return out;
}

std::string redis_join_path(const LeafPath& path) {
  std::string s;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) s += '.';
    s += path[i];
  }
  return s;
}

LeafPath redis_split_path(const std::string& joined) {
  LeafPath out;
  size_t start = 0;
  while (true) {
    size_t dot = joined.find('.', start);
    out.push_back(joined.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

RedisLeafMeta decode_redis_meta(const LeafPath& path, const std::string& key,
                                const std::map<std::string, std::string>& fields) {
  RedisLeafMeta m;
  m.info.path = path;
  if (fields.empty()) throw FormatError(key + ": metadata hash is missing or empty");
  auto nt = fields.find("is_non_tensor");
  if (nt != fields.end() && nt->second == "1") {
    m.info.kind = LeafKind::NonTensor;
    auto enc = fields.find("encoding");
    m.encoding = enc == fields.end() ? "json" : enc->second;
    if (m.encoding != "json" && m.encoding != "json_array" && m.encoding != "pickle")
      throw FormatError(key + ": unknown non-tensor encoding '" + m.encoding.substr(0, 64) + "'");
    return m;
  }
  auto dt = fields.find("dtype");
  auto sh = fields.find("shape");
  if (dt == fields.end()) throw FormatError(key + ": metadata has no 'dtype' field");
  if (sh == fields.end()) throw FormatError(key + ": metadata has no 'shape' field");
  auto dtype = dtype_from_string(dt->second);
  if (!dtype) throw FormatError(key + ": unknown dtype '" + dt->second.substr(0, 64) + "'");
  m.info.kind = LeafKind::Tensor;
  m.info.dtype = *dtype;
  m.info.shape = parse_redis_shape(sh->second, key);
  int64_t isz = item_size(*dtype);
  m.nbytes = checked_nbytes(m.info.shape, isz);
  if (m.nbytes < 0)
    throw FormatError(key + ": shape " + sh->second.substr(0, 64) + " of " + dt->second +
                      " exceeds the 512 MiB limit of a Redis value");
  m.row_bytes = m.info.shape.empty() ? 0 : checked_nbytes(m.info.shape, isz, 1);
  if (m.row_bytes < 0) throw FormatError(key + ": row size of shape " + sh->second.substr(0, 64) + " overflows");
  return m;
}

NonTensorValue decode_redis_non_tensor(const std::string& key, const std::string& encoding, const std::string& bytes) {
  NonTensorValue out;
  if (encoding == "pickle") {
    out.value = JsonValue(JsonValue::Bytes{bytes});
    return out;
  }
  if (encoding != "json" && encoding != "json_array")
    throw FormatError(key + ": unknown non-tensor encoding '" + encoding.substr(0, 64) + "'");
  try {
    out.value = JsonValue::parse(bytes);
  } catch (const FormatError& e) {
    throw FormatError(key + ": invalid " + encoding + " value: " + e.message());
  }
  if (encoding == "json_array") {
    if (!out.value.is_array()) throw FormatError(key + ": a json_array value is not a JSON list");
    out.stacked = true;
  }
  return out;
}

}  // namespace backends
}  // namespace tensordict
