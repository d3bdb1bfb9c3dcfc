// libFuzzer target for the Redis store's metadata decoders (no server needed: they are pure functions).
// Input: fields separated by 0x01: dtype, shape, is_non_tensor, encoding, value bytes, homogeneous, shapes,
// idx bytes, count (text), data length (text). Invariants checked: every decoder either succeeds or throws a
// tensordict::Error; a decoded tensor leaf's byte size is exactly prod(shape) * itemsize and within 512 MiB;
// a decoded shape re-prints (json.dumps spelling) and parses back equal; a decoded JSON value re-prints in
// Python's style and parses back equal; a decoded lazy-stack leaf has N+1 non-decreasing offsets ending at
// the data length.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/redis_store.hpp"
#include "tensordict/errors.hpp"

namespace be = tensordict::backends;

namespace {

std::vector<std::string> split(const std::string& s, char sep, size_t n) {
  std::vector<std::string> out;
  size_t start = 0;
  while (out.size() + 1 < n) {
    size_t cut = s.find(sep, start);
    if (cut == std::string::npos) break;
    out.push_back(s.substr(start, cut - start));
    start = cut + 1;
  }
  out.push_back(s.substr(start));
  while (out.size() < n) out.push_back("");
  return out;
}

int64_t to_int(const std::string& s) {
  if (s.empty() || s.size() > 12) return 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  return static_cast<int64_t>(v);
}

void check_shape(const std::string& text) {
  try {
    std::vector<int64_t> s = be::parse_redis_shape(text, "K");
    if (be::parse_redis_shape(be::redis_shape_text(s), "K") != s) std::abort();
  } catch (const tensordict::Error&) {
  }
}

void check_meta(const std::map<std::string, std::string>& fields) {
  try {
    be::RedisLeafMeta m = be::decode_redis_meta({"k"}, "K", fields);
    if (m.info.kind == be::LeafKind::Tensor) {
      __int128 n = static_cast<__int128>(c10::elementSize(m.info.dtype));
      for (int64_t d : m.info.shape) {
        if (d < 0) std::abort();
        n *= d;
        if (n > (static_cast<__int128>(1) << 62)) n = static_cast<__int128>(1) << 62;
      }
      if (m.nbytes != static_cast<int64_t>(n) || m.nbytes > be::kRedisMaxValueBytes || m.nbytes < 0) std::abort();
      if (m.row_bytes < 0 || (!m.info.shape.empty() && m.row_bytes * m.info.shape[0] != m.nbytes)) std::abort();
    }
  } catch (const tensordict::Error&) {
  }
}

void check_value(const std::string& encoding, const std::string& bytes) {
  try {
    be::NonTensorValue v = be::decode_redis_non_tensor("K", encoding, bytes);
    if (v.value.is_bytes()) {
      if (v.value.as_bytes().data != bytes) std::abort();
      return;
    }
    if (v.stacked && !v.value.is_array()) std::abort();
    std::string text = v.value.dump(tensordict::JsonValue::Style::Python);
    if (!(tensordict::JsonValue::parse(text) == v.value)) std::abort();
  } catch (const tensordict::Error&) {
  }
}

void check_stack(const std::map<std::string, std::string>& fields, int64_t count,
                 const std::optional<std::string>& idx, int64_t len) {
  try {
    be::RedisStackLeaf l = be::decode_redis_stack_leaf({"k"}, "P:{id}:", fields, count, idx, len);
    if (l.kind != be::LeafKind::Tensor) return;
    if (static_cast<int64_t>(l.offsets.size()) != count + 1 || static_cast<int64_t>(l.shapes.size()) != count)
      std::abort();
    for (size_t i = 1; i < l.offsets.size(); ++i)
      if (l.offsets[i] < l.offsets[i - 1]) std::abort();
    if (l.offsets.front() != 0 || l.offsets.back() != len) std::abort();
  } catch (const tensordict::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> f = split(input, '\x01', 10);
  check_shape(f[1]);
  std::map<std::string, std::string> fields;
  if (!f[0].empty()) fields["dtype"] = f[0];
  if (!f[1].empty()) fields["shape"] = f[1];
  if (!f[2].empty()) fields["is_non_tensor"] = f[2];
  if (!f[3].empty()) fields["encoding"] = f[3];
  check_meta(fields);
  check_value(f[3].empty() ? "json" : f[3], f[4]);
  if (!f[5].empty()) fields["homogeneous"] = f[5];
  if (!f[6].empty()) fields["shapes"] = f[6];
  std::optional<std::string> idx;
  if (!f[7].empty()) idx = f[7];
  check_stack(fields, to_int(f[8]), idx, to_int(f[9]));
  return 0;
}
