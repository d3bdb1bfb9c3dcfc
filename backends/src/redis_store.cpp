#include "tensordict/backends/redis_store.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the Redis layout is little-endian; big-endian hosts need byte swaps");

namespace tensordict {
namespace backends {

// ------------------------------------------------------------------------------------------ Lua scripts
namespace {

// KEYS[1] = data key, ARGV = off1 len1 off2 len2 ...: the concatenated ranges (Python's _LUA_GETRANGES)
const char* const kLuaGetRanges =
    "local k = KEYS[1]\n"
    "local out = {}\n"
    "for i = 1, #ARGV, 2 do\n"
    "  local off = tonumber(ARGV[i])\n"
    "  local len = tonumber(ARGV[i + 1])\n"
    "  if len > 0 then out[#out + 1] = redis.call('GETRANGE', k, off, off + len - 1) end\n"
    "end\n"
    "return table.concat(out)\n";

// KEYS[1] = data key, ARGV = off1 bytes1 off2 bytes2 ...: SETRANGE of each (Python's _LUA_SETRANGES)
const char* const kLuaSetRanges =
    "local k = KEYS[1]\n"
    "for i = 1, #ARGV, 2 do\n"
    "  redis.call('SETRANGE', k, tonumber(ARGV[i]), ARGV[i + 1])\n"
    "end\n"
    "return 1\n";

std::string sha1_of_script(RedisClient& c, const char* script) {
  RedisReply r = c.command(RedisCommand{"SCRIPT", "LOAD", script});
  return r.str;
}

bool is_noscript(const RedisReply& r) { return r.is_error() && r.str.rfind("NOSCRIPT", 0) == 0; }

int64_t item_size(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

//! product of dims * itemsize, or -1 on overflow / beyond the Redis limit
int64_t checked_nbytes(const std::vector<int64_t>& shape, int64_t itemsize, size_t from = 0) {
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

//! the bytes of a CPU contiguous tensor (resolved conj/neg)
at::Tensor bytes_ready(const at::Tensor& t) {
  at::Tensor c = t;
  if (c.device().type() != at::kCPU) c = c.cpu();
  if (c.is_conj()) c = c.resolve_conj();
  if (c.is_neg()) c = c.resolve_neg();
  return c.contiguous();
}

struct Run {
  int64_t first;
  int64_t count;
};

std::vector<Run> runs_of(const std::vector<int64_t>& rows) {
  std::vector<Run> runs;
  for (int64_t r : rows) {
    if (!runs.empty() && runs.back().first + runs.back().count == r)
      ++runs.back().count;
    else
      runs.push_back({r, 1});
  }
  return runs;
}

void check_rows(const std::vector<int64_t>& rows, int64_t n, const std::string& key) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= n)
      throw ValueError("row " + std::to_string(rows[i]) + " out of range for " + key + " with " + std::to_string(n) +
                       " rows");
    if (i > 0 && rows[i] <= rows[i - 1])
      throw ValueError("rows of " + key + " must be ascending and unique");
  }
}

std::map<std::string, std::string> hash_fields(const RedisReply& r) {
  std::map<std::string, std::string> out;
  if (!r.is_array()) return out;
  for (size_t i = 0; i + 1 < r.elements.size(); i += 2) out[r.elements[i].str] = r.elements[i + 1].str;
  return out;
}

bool contains_bytes(const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::Bytes:
      return true;
    case JsonValue::Kind::Array:
      for (const auto& e : v.as_array())
        if (contains_bytes(e)) return true;
      return false;
    case JsonValue::Kind::Object:
      for (const auto& e : v.as_object())
        if (contains_bytes(e.second)) return true;
      return false;
    default:
      return false;
  }
}

void check_leaf_path(const LeafPath& path) {
  if (path.empty()) throw ValueError("a Redis leaf path cannot be empty");
  for (const auto& p : path) {
    if (p.empty()) throw ValueError("a Redis key part cannot be empty: '" + redis_join_path(path) + "'");
    if (p.find('.') != std::string::npos)
      throw ValueError("a Redis key part cannot contain '.' (the nesting separator): '" + p + "'");
  }
}

//! a stored __device__: "" (None) or what str(torch.device) prints; FormatError naming the store and the key
void check_redis_device(const std::string& text, const std::string& store, const std::string& key) {
  if (text.empty()) return;
  bool ok = text.size() <= 64;
  if (ok) {
    try {
      c10::Device d(text);
      ok = d.str() == text;  // "cpu", "cuda:0"; not " cpu" or "cuda:00"
    } catch (const c10::Error&) {
      ok = false;
    }
  }
  if (!ok) {
    std::string shown;
    for (char c : text.substr(0, 64)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
    throw FormatError(store + ": field " + key + " holds '" + shown + (text.size() > 64 ? "...'" : "'") +
                      ", not a device (expected \"\" or a device such as \"cpu\", \"cuda:0\")");
  }
}

std::vector<int64_t> std_shape(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

std::string shape_str(const std::vector<int64_t>& s) { return redis_shape_text(s); }

}  // namespace

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

std::string redis_shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

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

// ------------------------------------------------------------------------------------------ RedisStore
RedisStore::RedisStore(const RedisOptions& options) : options_(options) {
  if (options_.td_id().empty()) options_.td_id(new_redis_td_id());
  client_ = std::make_unique<RedisClient>(options_.connect_options());
}

RedisStore::~RedisStore() = default;

void RedisStore::check_open() const {
  if (!client_) throw BackendError(describe() + " is closed");
}

RedisClient& RedisStore::client() const {
  check_open();
  return *client_;
}

void RedisStore::close() { client_.reset(); }

JsonValue RedisStore::spec_fields() const {
  return JsonValue::object({{"host", options_.host()},
                            {"port", options_.port()},
                            {"db", options_.db()},
                            {"unix_socket", options_.unix_socket()},
                            {"prefix", options_.prefix()},
                            {"td_id", options_.td_id()}});
}

std::string RedisStore::describe() const {
  std::string where = options_.unix_socket().empty()
                          ? options_.host() + ":" + std::to_string(options_.port())
                          : options_.unix_socket();
  return "Redis store " + options_.prefix() + ":{" + options_.td_id() + "} at " + where + "/" +
         std::to_string(options_.db());
}

std::optional<std::vector<int64_t>> RedisStore::stored_batch_size() const {
  RedisReply r = client().command(RedisCommand{"GET", key("__batch_size__")});
  if (r.is_nil()) return std::nullopt;
  return parse_redis_shape(r.str, key("__batch_size__"));
}

void RedisStore::set_stored_batch_size(const std::vector<int64_t>& batch) {
  for (int64_t b : batch)
    if (b < 0) throw ValueError("a batch size cannot be negative: " + redis_shape_text(batch));
  client().command(RedisCommand{"SET", key("__batch_size__"), redis_shape_text(batch)});
}

std::string RedisStore::device() const {
  RedisReply r = client().command(RedisCommand{"GET", key("__device__")});
  return r.is_nil() ? std::string() : r.str;
}

void RedisStore::set_device(const std::string& device) {
  client().command(RedisCommand{"SET", key("__device__"), device});
}

std::string RedisStore::tensorclass() const {
  RedisReply r = client().command(RedisCommand{"GET", key("__tensorclass__")});
  if (r.is_error()) redis_reply_error(r, key("__tensorclass__"));
  return r.is_nil() ? std::string() : r.str;
}

void RedisStore::set_tensorclass(const std::string& class_path) {
  client().command(RedisCommand{"SET", key("__tensorclass__"), class_path});
}

std::vector<std::string> RedisStore::members() const {
  RedisReply r = client().command(RedisCommand{"SMEMBERS", key("__keys__")});
  std::vector<std::string> out;
  for (auto& e : r.elements) out.push_back(std::move(e.str));
  return out;
}

void RedisStore::fetch_meta(const std::vector<LeafPath>& paths) {
  std::vector<RedisCommand> cmds;
  for (const auto& p : paths) cmds.push_back(RedisCommand{"HGETALL", key("m:" + redis_join_path(p))});
  std::vector<RedisReply> replies = client().pipeline(cmds);
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string joined = redis_join_path(paths[i]);
    if (replies[i].is_error()) redis_reply_error(replies[i], key("m:" + joined));
    auto fields = hash_fields(replies[i]);
    if (fields.empty()) throw KeyError("key '" + joined + "' not found in " + describe());
    meta_cache_[joined] = decode_redis_meta(paths[i], key("m:" + joined), fields);
  }
}

const RedisLeafMeta& RedisStore::meta(const LeafPath& path) {
  auto it = meta_cache_.find(redis_join_path(path));
  if (it != meta_cache_.end()) return it->second;
  fetch_meta({path});
  return meta_cache_.at(redis_join_path(path));
}

std::vector<LeafInfo> RedisStore::list() {
  std::vector<std::string> keys = members();
  std::vector<LeafPath> paths;
  for (const auto& k : keys) paths.push_back(redis_split_path(k));
  std::sort(paths.begin(), paths.end());
  std::vector<RedisCommand> cmds;
  for (const auto& p : paths) cmds.push_back(RedisCommand{"HGETALL", key("m:" + redis_join_path(p))});
  std::vector<RedisReply> replies = client().pipeline(cmds);
  meta_cache_.clear();
  length_checked_.clear();
  std::vector<LeafInfo> out;
  std::set<LeafPath> groups, leaves(paths.begin(), paths.end());
  for (size_t i = 0; i < paths.size(); ++i) {
    const LeafPath& p = paths[i];
    std::string joined = redis_join_path(p);
    std::string mkey = key("m:" + joined);
    if (replies[i].is_error()) redis_reply_error(replies[i], mkey);
    RedisLeafMeta m = decode_redis_meta(p, mkey, hash_fields(replies[i]));
    for (size_t d = 1; d < p.size(); ++d) {
      LeafPath g(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(d));
      if (leaves.count(g))
        throw FormatError(key("__keys__") + ": '" + redis_join_path(g) + "' is both a leaf and a nested level");
      if (groups.insert(g).second) {
        LeafInfo gi;
        gi.path = g;
        gi.kind = LeafKind::Group;
        out.push_back(gi);
      }
    }
    out.push_back(m.info);
    meta_cache_[joined] = std::move(m);
  }
  return out;
}

namespace {
//! the distinct paths of `items` (LeafReads or LeafWrites) whose metadata is not cached yet
template <class Items>
std::vector<LeafPath> uncached(const Items& items, const std::map<std::string, RedisLeafMeta>& cache) {
  std::vector<LeafPath> missing;
  std::set<std::string> seen;
  for (const auto& it : items) {
    std::string j = redis_join_path(it.path);
    if (!cache.count(j) && seen.insert(j).second) missing.push_back(it.path);
  }
  return missing;
}
}  // namespace

std::vector<at::Tensor> RedisStore::read(const std::vector<LeafRead>& reads) {
  if (reads.empty()) return {};
  std::vector<size_t> bad;
  std::vector<at::Tensor> out = read_once(reads, &bad);
  if (bad.empty()) return out;
  // a length that disagrees with cached metadata: the leaf may have been replaced elsewhere; re-read once
  for (size_t i : bad) {
    meta_cache_.erase(redis_join_path(reads[i].path));
    length_checked_.erase(redis_join_path(reads[i].path));
  }
  return read_once(reads, nullptr);
}

namespace {
//! the shape a read asked for (LeafRead::shape) in place of `shape`, when it holds the same elements
void reshape_to(const LeafRead& r, const std::string& dkey, std::vector<int64_t>* shape) {
  if (!r.shape) return;
  int64_t a = 1, b = 1;
  for (int64_t d : *shape) a *= d;
  for (int64_t d : *r.shape) b *= d;
  if (a != b) throw ValueError(dkey + ": cannot return the rows read as shape " + shape_str(*r.shape));
  *shape = *r.shape;
}
}  // namespace

std::vector<at::Tensor> RedisStore::read_once(const std::vector<LeafRead>& reads, std::vector<size_t>* bad) {
  // metadata of every leaf (cached; the missing ones in one pipeline)
  if (auto missing = uncached(reads, meta_cache_); !missing.empty()) fetch_meta(missing);

  enum class Op { Get, GetRange, Ranges, None };
  struct Plan {
    Op op = Op::None;
    size_t data = 0, strlen = 0;
    bool check_len = false;
    std::vector<int64_t> shape;
    int64_t expect = 0;
    RedisLeafMeta* meta = nullptr;  //!< in meta_cache_ (a std::map: stable while this call runs)
  };
  std::vector<Plan> plans(reads.size());
  std::vector<RedisCommand> cmds;
  cmds.reserve(2 * reads.size());
  bool uses_script = false;
  auto command = [](const char* name, const std::string& dkey) {
    RedisCommand c;
    c.reserve(4);
    c.arg_view(name, std::char_traits<char>::length(name)).arg_view(dkey.data(), dkey.size());
    return c;
  };
  RowMemo<bool> checked_rows;  // the leaves of a call share their row lists: check and split each once
  RowMemo<std::vector<Run>> runs_memo;
  for (size_t i = 0; i < reads.size(); ++i) {
    const LeafRead& r = reads[i];
    Plan& p = plans[i];
    const std::string joined = redis_join_path(r.path);
    RedisLeafMeta& m = meta_cache_.at(joined);
    p.meta = &m;
    if (m.data_key.empty()) m.data_key = key("d:" + joined);
    const std::string& dkey = m.data_key;  // borrowed by the commands below
    if (m.info.kind != LeafKind::Tensor) throw TypeError("key '" + joined + "' in " + describe() + " is a non-tensor");
    if (r.whole) {
      p.shape = m.info.shape;
      reshape_to(r, dkey, &p.shape);
      p.expect = m.nbytes;
      p.op = Op::Get;
      p.data = cmds.size();
      cmds.push_back(command("GET", dkey));
      continue;
    }
    if (m.info.shape.empty()) throw ValueError("cannot read rows of the 0-dim leaf " + dkey);
    checked_rows.get(r.rows, m.info.shape[0], [&] {
      check_rows(r.rows.vec(), m.info.shape[0], dkey);
      return true;
    });
    p.shape = m.info.shape;
    p.shape[0] = static_cast<int64_t>(r.rows.size());
    reshape_to(r, dkey, &p.shape);
    p.expect = static_cast<int64_t>(r.rows.size()) * m.row_bytes;
    if (p.expect == 0) {
      p.op = Op::None;
      continue;
    }
    // the value's length is checked once per leaf (with its first rows read); later reads trust the cache
    if (!length_checked_.count(joined)) {
      p.strlen = cmds.size();
      p.check_len = true;
      cmds.push_back(command("STRLEN", dkey));
    }
    p.data = cmds.size();
    if (r.rows.size() == 1 || r.rows.back() - r.rows.front() + 1 == static_cast<int64_t>(r.rows.size())) {
      p.op = Op::GetRange;  // one run (rows are ascending and unique)
      int64_t off = r.rows.front() * m.row_bytes;
      cmds.push_back(command("GETRANGE", dkey).arg(off).arg(off + static_cast<int64_t>(r.rows.size()) * m.row_bytes - 1));
      continue;
    }
    const std::vector<Run>& runs = runs_memo.get(r.rows, 0, [&] { return runs_of(r.rows.vec()); });
    {
      p.op = Op::Ranges;
      uses_script = true;
      RedisCommand c{"EVALSHA", "", "1", dkey};  // sha filled in below
      for (const Run& run : runs) c.arg(run.first * m.row_bytes).arg(run.count * m.row_bytes);
      cmds.push_back(std::move(c));
    }
  }

  std::vector<RedisReply> replies;
  for (int attempt = 0;; ++attempt) {
    if (uses_script) {
      if (!getranges_loaded_ || attempt > 0) {
        sha_getranges_ = sha1_of_script(client(), kLuaGetRanges);
        getranges_loaded_ = true;
      }
      for (size_t i = 0; i < reads.size(); ++i)
        if (plans[i].op == Op::Ranges) {
          // rebuild the command with the sha (argument 1)
          RedisCommand& old = cmds[plans[i].data];
          RedisCommand c;
          c.arg("EVALSHA").arg(sha_getranges_);
          for (size_t a = 2; a < old.size(); ++a) c.arg(old.at(a));
          old = std::move(c);
        }
    }
    if (cmds.empty())
      replies.clear();
    else if (cmds.size() == 1)
      replies = client().pipeline(cmds);
    else
      replies = client().transaction(cmds);
    bool noscript = false;
    for (const auto& r : replies) noscript = noscript || is_noscript(r);
    if (!noscript) break;
    if (attempt >= 1) throw BackendError(describe() + ": the server keeps losing the GETRANGES script (NOSCRIPT)");
    getranges_loaded_ = false;
  }

  std::vector<at::Tensor> out(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const Plan& p = plans[i];
    const RedisLeafMeta& meta = *p.meta;
    const std::string& dkey = meta.data_key;
    at::ScalarType dtype = meta.info.dtype;
    if (p.op == Op::None) {
      out[i] = at::empty(p.shape, at::TensorOptions().dtype(dtype));
      continue;
    }
    RedisReply& d = replies[p.data];
    if (d.is_error()) redis_reply_error(d, dkey);
    auto mismatch = [&](int64_t got, int64_t want) {
      if (bad) {
        bad->push_back(i);
        return;
      }
      throw FormatError(dkey + ": value holds " + std::to_string(got) + " bytes, metadata " +
                        key("m:" + redis_join_path(meta.info.path)) + " says " + std::to_string(want) + " (shape " +
                        shape_str(meta.info.shape) + ", " + dtype_to_string(dtype) + ")");
    };
    if (p.op == Op::Get) {
      if (d.is_nil() && p.expect != 0) {
        if (bad) {
          bad->push_back(i);
          continue;
        }
        throw FormatError(dkey + ": data value is missing (metadata says " + std::to_string(p.expect) + " bytes)");
      }
      if (static_cast<int64_t>(d.str.size()) != p.expect) {
        mismatch(static_cast<int64_t>(d.str.size()), p.expect);
        continue;
      }
      length_checked_.insert(redis_join_path(meta.info.path));
    } else {
      if (p.check_len) {
        const RedisReply& sl = replies[p.strlen];
        if (sl.is_error()) redis_reply_error(sl, dkey);
        int64_t want = meta.nbytes;
        if (sl.integer != want) {
          mismatch(sl.integer, want);
          continue;
        }
        length_checked_.insert(redis_join_path(meta.info.path));
      }
      if (static_cast<int64_t>(d.str.size()) != p.expect) {
        mismatch(static_cast<int64_t>(d.str.size()), p.expect);
        continue;
      }
    }
    out[i] = tensor_from_bytes(std::move(d.str), dtype, p.shape);
  }
  return out;
}

void RedisStore::write(const std::vector<LeafWrite>& writes) {
  if (writes.empty()) return;
  if (auto missing = uncached(writes, meta_cache_); !missing.empty()) fetch_meta(missing);

  std::vector<at::Tensor> keep;  // payloads are borrowed by the commands
  std::vector<RedisCommand> cmds;
  std::vector<const std::string*> what;  // the data key of each command, for its error
  keep.reserve(writes.size());
  cmds.reserve(writes.size());
  what.reserve(writes.size());
  RowMemo<bool> checked_rows;  // the leaves of a call share their row lists: check and split each once
  RowMemo<std::vector<Run>> runs_memo;
  for (const LeafWrite& w : writes) {
    const std::string joined = redis_join_path(w.path);
    RedisLeafMeta& m = meta_cache_.at(joined);
    if (m.data_key.empty()) m.data_key = key("d:" + joined);
    const std::string& dkey = m.data_key;  // borrowed by the commands (meta_cache_ is a std::map)
    if (m.info.kind != LeafKind::Tensor) throw TypeError("key '" + joined + "' in " + describe() + " is a non-tensor");
    if (!w.data.defined()) throw ValueError("no data to write to " + dkey);
    if (w.data.scalar_type() != m.info.dtype)
      throw ValueError("cannot write " + std::string(c10::toString(w.data.scalar_type())) + " data to " + dkey +
                       " of dtype " + dtype_to_string(m.info.dtype));
    std::vector<int64_t> want = m.info.shape;
    if (!w.whole) {
      if (want.empty()) throw ValueError("cannot write rows of the 0-dim leaf " + dkey);
      checked_rows.get(w.rows, m.info.shape[0], [&] {
        check_rows(w.rows.vec(), m.info.shape[0], dkey);
        return true;
      });
      want[0] = static_cast<int64_t>(w.rows.size());
    }
    int64_t want_numel = 1;
    for (int64_t d : want) want_numel *= d;
    if (w.data.numel() != want_numel)  // the elements count, not the shape (LeafWrite)
      throw ValueError("data of shape " + shape_str(std_shape(w.data.sizes())) + " does not fit " + dkey +
                       " (expected " + shape_str(want) + ")");
    at::Tensor t = bytes_ready(w.data);
    keep.push_back(t);
    const char* base = static_cast<const char*>(t.data_ptr());
    if (w.whole) {
      RedisCommand c{"SET", dkey};
      c.arg_view(t.numel() ? base : "", static_cast<size_t>(m.nbytes));
      cmds.push_back(std::move(c));
      what.push_back(&dkey);
      continue;
    }
    if (m.row_bytes == 0 || w.rows.empty()) continue;
    const std::vector<Run>& runs = runs_memo.get(w.rows, 0, [&] { return runs_of(w.rows.vec()); });
    if (runs.size() == 1) {
      RedisCommand c;
      c.reserve(4);
      c.arg_view("SETRANGE", 8).arg_view(dkey.data(), dkey.size());
      c.arg(runs[0].first * m.row_bytes).arg_view(base, static_cast<size_t>(runs[0].count * m.row_bytes));
      cmds.push_back(std::move(c));
    } else {
      RedisCommand c{"EVAL", kLuaSetRanges, "1", dkey};
      int64_t src = 0;
      for (const Run& run : runs) {
        int64_t len = run.count * m.row_bytes;
        c.arg(run.first * m.row_bytes).arg_view(base + src, static_cast<size_t>(len));
        src += len;
      }
      cmds.push_back(std::move(c));
    }
    what.push_back(&dkey);
  }
  if (cmds.empty()) return;
  std::vector<RedisReply> replies = cmds.size() == 1 ? client().pipeline(cmds) : client().transaction(cmds);
  for (size_t i = 0; i < replies.size(); ++i)
    if (replies[i].is_error()) redis_reply_error(replies[i], *what[i]);
}

void RedisStore::create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
                        const at::Tensor& data, const CreateOptions& /*options*/) {
  check_leaf_path(path);
  std::string joined = redis_join_path(path);
  std::string dkey = key("d:" + joined), mkey = key("m:" + joined);
  std::string dtype_name;
  try {
    dtype_name = dtype_to_string(dtype);
  } catch (const ValueError& e) {
    throw TypeError("a Redis store cannot hold " + std::string(c10::toString(dtype)) + " (" + dkey + "): " + e.message());
  }
  if (!dtype_from_string(dtype_name))
    throw TypeError("a Redis store cannot hold " + dtype_name + " (" + dkey + ")");
  for (int64_t d : shape)
    if (d < 0) throw ValueError("negative dimension in shape " + shape_str(shape) + " of " + dkey);
  int64_t nbytes = checked_nbytes(shape, item_size(dtype));
  if (nbytes < 0)
    throw ValueError(dkey + ": a leaf of shape " + shape_str(shape) + " and " + dtype_name +
                     " exceeds 512 MiB, the largest Redis value (proto-max-bulk-len)");
  at::Tensor t;
  if (data.defined()) {
    if (std_shape(data.sizes()) != shape)
      throw ValueError("data of shape " + shape_str(std_shape(data.sizes())) + " does not fit the new leaf " + dkey +
                       " of shape " + shape_str(shape));
    t = bytes_ready(data.scalar_type() == dtype ? data : data.to(dtype));
  }
  // the path must be new and must not collide with a nested level
  for (const std::string& k : members()) {
    if (k == joined) throw KeyError("key '" + joined + "' already exists in " + describe());
    if (k.size() > joined.size() && k.compare(0, joined.size() + 1, joined + ".") == 0)
      throw KeyError("key '" + joined + "' is a nested level of " + describe());
    if (joined.size() > k.size() && joined.compare(0, k.size() + 1, k + ".") == 0)
      throw KeyError("key '" + k + "' of " + describe() + " is a leaf, not a nested level (creating '" + joined + "')");
  }
  std::vector<RedisCommand> cmds;
  cmds.push_back(RedisCommand{"DEL", dkey, mkey});
  if (t.defined() && nbytes > 0) {
    RedisCommand c{"SET", dkey};
    c.arg_view(t.data_ptr(), static_cast<size_t>(nbytes));
    cmds.push_back(std::move(c));
  } else if (nbytes > 0) {
    cmds.push_back(RedisCommand{"SETRANGE", dkey, std::to_string(nbytes - 1), std::string(1, '\0')});
  } else {
    cmds.push_back(RedisCommand{"SET", dkey, ""});  // an empty leaf: an empty value (Python writes none)
  }
  cmds.push_back(RedisCommand{"HSET", mkey, "shape", shape_str(shape), "dtype", dtype_name});
  cmds.push_back(RedisCommand{"SADD", key("__keys__"), joined});
  std::vector<RedisReply> replies = client().transaction(cmds);
  for (const auto& r : replies)
    if (r.is_error()) redis_reply_error(r, dkey);
  RedisLeafMeta m;
  m.info.path = path;
  m.info.kind = LeafKind::Tensor;
  m.info.dtype = dtype;
  m.info.shape = shape;
  m.nbytes = nbytes;
  m.row_bytes = shape.empty() ? 0 : checked_nbytes(shape, item_size(dtype), 1);
  meta_cache_[joined] = std::move(m);
  length_checked_.insert(joined);
}

bool RedisStore::erase(const LeafPath& path) {
  if (path.empty()) throw ValueError("cannot erase the root of " + describe() + " (use a path)");
  std::string joined = redis_join_path(path);
  std::vector<std::string> targets;
  for (const std::string& k : members())
    if (k == joined || (k.size() > joined.size() && k.compare(0, joined.size() + 1, joined + ".") == 0))
      targets.push_back(k);
  if (targets.empty()) return false;
  std::vector<RedisCommand> cmds;
  RedisCommand del{"DEL"};
  RedisCommand srem{"SREM", key("__keys__")};
  for (const auto& k : targets) {
    del.arg(key("d:" + k)).arg(key("m:" + k)).arg(key("d:" + k + ":idx"));
    srem.arg(k);
    meta_cache_.erase(k);
    length_checked_.erase(k);
  }
  cmds.push_back(std::move(del));
  cmds.push_back(std::move(srem));
  std::vector<RedisReply> replies = client().transaction(cmds);
  for (const auto& r : replies)
    if (r.is_error()) redis_reply_error(r, key("d:" + joined));
  return true;
}

NonTensorValue RedisStore::read_non_tensor(const LeafPath& path) {
  std::string joined = redis_join_path(path);
  std::string dkey = key("d:" + joined), mkey = key("m:" + joined);
  std::vector<RedisReply> r =
      client().pipeline({RedisCommand{"HGETALL", mkey}, RedisCommand{"GET", dkey}});
  if (r[0].is_error()) redis_reply_error(r[0], mkey);
  if (r[1].is_error()) redis_reply_error(r[1], dkey);
  auto fields = hash_fields(r[0]);
  if (fields.empty()) throw KeyError("key '" + joined + "' not found in " + describe());
  RedisLeafMeta m = decode_redis_meta(path, mkey, fields);
  meta_cache_[joined] = m;
  if (m.info.kind != LeafKind::NonTensor) throw TypeError("key '" + joined + "' in " + describe() + " is a tensor");
  if (r[1].is_nil()) throw FormatError(dkey + ": the value of a non-tensor is missing");
  return decode_redis_non_tensor(dkey, m.encoding, r[1].str);
}

void RedisStore::write_non_tensor(const LeafPath& path, const NonTensorValue& value) {
  check_leaf_path(path);
  std::string joined = redis_join_path(path);
  std::string dkey = key("d:" + joined), mkey = key("m:" + joined);
  std::string encoding, text;
  if (value.value.is_bytes() && !value.stacked) {
    encoding = "pickle";  // opaque bytes read from a store, written back verbatim
    text = value.value.as_bytes().data;
  } else {
    if (contains_bytes(value.value))
      throw TypeError("a Redis non-tensor (" + dkey + ") can only hold JSON values (opaque bytes inside a value)");
    if (value.stacked) {
      if (!value.value.is_array()) throw ValueError("a stacked non-tensor (" + dkey + ") must be a list");
      encoding = "json_array";
    } else {
      encoding = "json";
    }
    text = value.value.dump(JsonValue::Style::Python);
  }
  if (static_cast<int64_t>(text.size()) > kRedisMaxValueBytes)
    throw ValueError(dkey + ": the non-tensor value exceeds 512 MiB, the largest Redis value");
  for (const std::string& k : members()) {
    if (k.size() > joined.size() && k.compare(0, joined.size() + 1, joined + ".") == 0)
      throw KeyError("key '" + joined + "' is a nested level of " + describe());
    if (joined.size() > k.size() && joined.compare(0, k.size() + 1, k + ".") == 0)
      throw KeyError("key '" + k + "' of " + describe() + " is a leaf, not a nested level (writing '" + joined + "')");
  }
  std::vector<RedisCommand> cmds;
  cmds.push_back(RedisCommand{"DEL", mkey});
  cmds.push_back(RedisCommand{"SET", dkey, text});
  cmds.push_back(RedisCommand{"HSET", mkey, "is_non_tensor", "1", "encoding", encoding});
  cmds.push_back(RedisCommand{"SADD", key("__keys__"), joined});
  std::vector<RedisReply> replies = client().transaction(cmds);
  for (const auto& r : replies)
    if (r.is_error()) redis_reply_error(r, dkey);
  RedisLeafMeta m;
  m.info.path = path;
  m.info.kind = LeafKind::NonTensor;
  m.encoding = encoding;
  meta_cache_[joined] = std::move(m);
  length_checked_.erase(joined);
}

// ------------------------------------------------------------------------------------------ factories
std::shared_ptr<LeafStore> create_redis_store(const RedisOptions& options, const std::vector<int64_t>& batch_size,
                                              const std::string& device) {
  for (int64_t b : batch_size)
    if (b < 0) throw ValueError("a batch size cannot be negative: " + redis_shape_text(batch_size));
  auto store = std::make_shared<RedisStore>(options);
  std::vector<RedisReply> r = store->client().transaction(
      {RedisCommand{"SET", store->key("__batch_size__"), redis_shape_text(batch_size)},
       RedisCommand{"SET", store->key("__device__"), device}});
  for (const auto& x : r)
    if (x.is_error()) redis_reply_error(x, store->key("__batch_size__"));
  return store;
}

std::shared_ptr<LeafStore> open_redis_store(const RedisOptions& options) {
  if (options.td_id().empty()) throw ValueError("opening a Redis store needs its td_id");
  auto store = std::make_shared<RedisStore>(options);
  std::vector<RedisReply> r = store->client().pipeline({RedisCommand{"GET", store->key("__batch_size__")},
                                                        RedisCommand{"GET", store->key("__type__")},
                                                        RedisCommand{"GET", store->key("__device__")}});
  if (r[0].is_nil()) {
    if (r[1].is_string() && r[1].str == "lazy_stack")
      throw KeyError("td_id '" + options.td_id() + "' (prefix '" + options.prefix() +
                     "') is a lazy-stack store (no __batch_size__): open it with RedisLazyStackStore");
    throw KeyError("no Redis store with td_id '" + options.td_id() + "' (prefix '" + options.prefix() + "') at " +
                   store->client().endpoint() + ": " + store->key("__batch_size__") + " is missing");
  }
  if (r[0].is_error()) redis_reply_error(r[0], store->key("__batch_size__"));
  parse_redis_shape(r[0].str, store->key("__batch_size__"));
  if (r[2].is_error()) redis_reply_error(r[2], store->key("__device__"));
  if (!r[2].is_nil()) check_redis_device(r[2].str, store->describe(), store->key("__device__"));
  return store;
}

std::shared_ptr<LeafStore> open_redis_store(const JsonValue& spec, const std::string& password) {
  if (!spec.is_object()) throw ValueError("a Redis storage spec must be a JSON object");
  RedisOptions o;
  auto str = [&](const char* name, auto setter) {
    if (const JsonValue* v = spec.find(name)) {
      if (!v->is_string()) throw ValueError(std::string("Redis storage spec field '") + name + "' must be a string");
      setter(v->as_string());
    }
  };
  auto num = [&](const char* name, auto setter) {
    if (const JsonValue* v = spec.find(name)) {
      if (!v->is_int()) throw ValueError(std::string("Redis storage spec field '") + name + "' must be an integer");
      setter(static_cast<int>(v->as_int()));
    }
  };
  str("host", [&](const std::string& s) { o.host(s); });
  num("port", [&](int p) { o.port(p); });
  num("db", [&](int d) { o.db(d); });
  str("unix_socket", [&](const std::string& s) { o.unix_socket(s); });
  str("prefix", [&](const std::string& s) { o.prefix(s); });
  str("td_id", [&](const std::string& s) { o.td_id(s); });
  if (o.td_id().empty()) throw ValueError("a Redis storage spec needs a 'td_id'");
  o.password(password);  // empty: the client takes the environment's (redis_env_credentials)
  return open_redis_store(o);
}

std::string redis_store_td_id(const LeafStore& store) {
  auto* r = dynamic_cast<const RedisStore*>(&store);
  if (!r) throw ValueError("not a Redis store: " + store.describe());
  return r->td_id();
}

// ------------------------------------------------------------------------------------------ lazy stacks
namespace {

int64_t parse_int_text(const std::string& text, const std::string& what) {
  JsonValue v;
  try {
    v = JsonValue::parse(text);
  } catch (const FormatError&) {
    throw FormatError(what + ": not an integer: '" + text.substr(0, 64) + "'");
  }
  if (!v.is_int()) throw FormatError(what + ": not an integer: '" + text.substr(0, 64) + "'");
  return v.as_int();
}

}  // namespace

RedisStackLeaf decode_redis_stack_leaf(const LeafPath& path, const std::string& key_base,
                                       const std::map<std::string, std::string>& fields, int64_t count,
                                       const std::optional<std::string>& idx, int64_t data_len) {
  RedisStackLeaf leaf;
  leaf.path = path;
  const std::string joined = redis_join_path(path);
  const std::string mkey = key_base + "m:" + joined, dkey = key_base + "d:" + joined;
  const int64_t N = count;
  const int64_t len = data_len;
  if (N < 0 || N > kRedisMaxStackCount)
    throw FormatError(key_base + "__count__: bad member count " + std::to_string(N));
  if (fields.empty()) throw FormatError(mkey + ": metadata hash is missing or empty");
  auto nt = fields.find("is_non_tensor");
  if (nt != fields.end() && nt->second == "1") {
    leaf.kind = LeafKind::NonTensor;
    auto enc = fields.find("encoding");
    leaf.encoding = enc == fields.end() ? "json" : enc->second;
    if (leaf.encoding != "json" && leaf.encoding != "json_array" && leaf.encoding != "pickle")
      throw FormatError(mkey + ": unknown non-tensor encoding '" + leaf.encoding.substr(0, 64) + "'");
    return leaf;
  }
  // dtype / shape as a regular leaf (shape = [N, *elem0]; the byte-size checks apply to it)
  RedisLeafMeta base = decode_redis_meta(leaf.path, mkey, fields);
  leaf.dtype = base.info.dtype;
  const std::vector<int64_t>& shape = base.info.shape;
  if (shape.empty() || shape[0] != N)
    throw FormatError(mkey + ": shape " + redis_shape_text(shape) + " does not start with the member count " +
                      std::to_string(N));
  auto hom = fields.find("homogeneous");
  leaf.homogeneous = hom == fields.end() || hom->second != "0";
  int64_t isz = item_size(leaf.dtype);
  if (leaf.homogeneous) {
    std::vector<int64_t> elem(shape.begin() + 1, shape.end());
    int64_t eb = checked_nbytes(elem, isz);
    leaf.shapes.assign(static_cast<size_t>(N), elem);
    for (int64_t j = 0; j <= N; ++j) leaf.offsets.push_back(j * eb);
  } else {
    auto sh = fields.find("shapes");
    if (sh == fields.end()) throw FormatError(mkey + ": a heterogeneous leaf has no 'shapes' field");
    JsonValue v;
    try {
      v = JsonValue::parse(sh->second);
    } catch (const FormatError& e) {
      throw FormatError(mkey + ": invalid 'shapes': " + e.message());
    }
    if (!v.is_array() || static_cast<int64_t>(v.as_array().size()) != N)
      throw FormatError(mkey + ": 'shapes' must be a list of " + std::to_string(N) + " shapes");
    for (const auto& s : v.as_array()) {
      if (!s.is_array()) throw FormatError(mkey + ": 'shapes' holds a non-list");
      std::vector<int64_t> one;
      for (const auto& d : s.as_array()) {
        if (!d.is_int() || d.as_int() < 0) throw FormatError(mkey + ": 'shapes' must hold non-negative integers");
        one.push_back(d.as_int());
      }
      leaf.shapes.push_back(std::move(one));
    }
    std::string ikey = dkey + ":idx";
    if (!idx) throw FormatError(ikey + ": the offset table of a heterogeneous leaf is missing");
    if (static_cast<int64_t>(idx->size()) != (N + 1) * 8)
      throw FormatError(ikey + ": holds " + std::to_string(idx->size()) + " bytes, expected " +
                        std::to_string((N + 1) * 8) + " (N+1 int64 offsets)");
    leaf.offsets.resize(static_cast<size_t>(N + 1));
    std::memcpy(leaf.offsets.data(), idx->data(), idx->size());
    if (leaf.offsets[0] != 0) throw FormatError(ikey + ": the first offset is not 0");
    for (int64_t j = 0; j < N; ++j) {
      int64_t eb = checked_nbytes(leaf.shapes[static_cast<size_t>(j)], isz);
      if (eb < 0) throw FormatError(mkey + ": member " + std::to_string(j) + "'s shape exceeds 512 MiB");
      if (leaf.offsets[j + 1] < leaf.offsets[j] || leaf.offsets[j + 1] - leaf.offsets[j] != eb)
        throw FormatError(ikey + ": offsets of member " + std::to_string(j) + " disagree with its shape " +
                          redis_shape_text(leaf.shapes[static_cast<size_t>(j)]));
    }
  }
  if (leaf.offsets.back() != len)
    throw FormatError(dkey + ": value holds " + std::to_string(len) + " bytes, the layout says " +
                      std::to_string(leaf.offsets.back()));
  return leaf;
}

RedisLazyStackStore::RedisLazyStackStore(const RedisOptions& options) : options_(options) {
  if (options_.td_id().empty()) throw ValueError("opening a Redis lazy-stack store needs its td_id");
  client_ = std::make_unique<RedisClient>(options_.connect_options());
  auto k = [&](const std::string& s) { return redis_key(options_.prefix(), options_.td_id(), s); };
  std::vector<RedisReply> r = client_->pipeline({RedisCommand{"GET", k("__type__")}, RedisCommand{"GET", k("__count__")},
                                                 RedisCommand{"GET", k("__stack_dim__")},
                                                 RedisCommand{"GET", k("__inner_batch_size__")},
                                                 RedisCommand{"GET", k("__device__")},
                                                 RedisCommand{"SMEMBERS", k("__keys__")}});
  for (const auto& x : r)
    if (x.is_error()) redis_reply_error(x, k("__type__"));
  if (!r[0].is_string() || r[0].str != "lazy_stack")
    throw KeyError("no Redis lazy-stack store with td_id '" + options_.td_id() + "' (prefix '" + options_.prefix() +
                   "'): " + k("__type__") + " is " + (r[0].is_nil() ? "missing" : "'" + r[0].str.substr(0, 64) + "'"));
  if (r[1].is_nil()) throw FormatError(k("__count__") + " is missing");
  layout_.count = parse_int_text(r[1].str, k("__count__"));
  if (layout_.count < 0 || layout_.count > kRedisMaxStackCount)
    throw FormatError(k("__count__") + ": bad member count " + std::to_string(layout_.count));
  layout_.stack_dim = r[2].is_nil() ? 0 : parse_int_text(r[2].str, k("__stack_dim__"));
  if (!r[3].is_nil()) layout_.inner_batch_size = parse_redis_shape(r[3].str, k("__inner_batch_size__"));
  if (layout_.stack_dim < 0 || layout_.stack_dim > static_cast<int64_t>(layout_.inner_batch_size.size()))
    throw FormatError(k("__stack_dim__") + ": stack dim " + std::to_string(layout_.stack_dim) +
                      " does not fit the inner batch size " + redis_shape_text(layout_.inner_batch_size));
  layout_.device = r[4].is_nil() ? "" : r[4].str;
  std::vector<std::string> names;
  for (auto& e : r[5].elements) names.push_back(e.str);
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return redis_split_path(a) < redis_split_path(b);
  });
  std::vector<RedisCommand> cmds;
  for (const auto& n : names) {
    cmds.push_back(RedisCommand{"HGETALL", k("m:" + n)});
    cmds.push_back(RedisCommand{"STRLEN", k("d:" + n)});
    cmds.push_back(RedisCommand{"GET", k("d:" + n + ":idx")});
  }
  std::vector<RedisReply> m = client_->pipeline(cmds);
  const int64_t N = layout_.count;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string mkey = k("m:" + names[i]), dkey = k("d:" + names[i]);
    for (size_t j = 0; j < 3; ++j)
      if (m[3 * i + j].is_error()) redis_reply_error(m[3 * i + j], dkey);
    const RedisReply& idx = m[3 * i + 2];
    int64_t len = m[3 * i + 1].integer;
    data_len_[names[i]] = len;
    std::optional<std::string> idx_bytes;
    if (!idx.is_nil()) idx_bytes = idx.str;
    layout_.leaves.push_back(
        decode_redis_stack_leaf(redis_split_path(names[i]), k(""), hash_fields(m[3 * i]), N, idx_bytes, len));
  }
}

const RedisStackLeaf& RedisLazyStackStore::leaf(const LeafPath& path) const {
  for (const auto& l : layout_.leaves)
    if (l.path == path) return l;
  throw KeyError("key '" + redis_join_path(path) + "' not found in the Redis lazy-stack store " + options_.prefix() +
                 ":{" + options_.td_id() + "}");
}

std::vector<std::vector<at::Tensor>> RedisLazyStackStore::read_leaves(const std::vector<LeafPath>& paths) {
  std::vector<RedisCommand> cmds;
  for (const auto& p : paths) {
    const RedisStackLeaf& l = leaf(p);
    if (l.kind != LeafKind::Tensor) throw TypeError("key '" + redis_join_path(p) + "' is a non-tensor");
    cmds.push_back(RedisCommand{"GET", redis_key(options_.prefix(), options_.td_id(), "d:" + redis_join_path(p))});
  }
  std::vector<RedisReply> r = cmds.size() > 1 ? client_->transaction(cmds) : client_->pipeline(cmds);
  std::vector<std::vector<at::Tensor>> out;
  for (size_t i = 0; i < paths.size(); ++i) {
    const RedisStackLeaf& l = leaf(paths[i]);
    std::string dkey = redis_key(options_.prefix(), options_.td_id(), "d:" + redis_join_path(paths[i]));
    if (r[i].is_error()) redis_reply_error(r[i], dkey);
    if (static_cast<int64_t>(r[i].str.size()) != l.offsets.back())
      throw FormatError(dkey + ": value holds " + std::to_string(r[i].str.size()) + " bytes, the layout says " +
                        std::to_string(l.offsets.back()));
    std::vector<at::Tensor> members;
    for (size_t j = 0; j + 1 < l.offsets.size(); ++j) {
      at::Tensor t = at::empty(l.shapes[j], at::TensorOptions().dtype(l.dtype));
      size_t n = static_cast<size_t>(l.offsets[j + 1] - l.offsets[j]);
      if (n) std::memcpy(t.data_ptr(), r[i].str.data() + l.offsets[j], n);
      members.push_back(t);
    }
    out.push_back(std::move(members));
  }
  return out;
}

std::vector<at::Tensor> RedisLazyStackStore::read_member(int64_t member) {
  if (member < 0 || member >= layout_.count)
    throw ValueError("member " + std::to_string(member) + " out of range for a lazy stack of " +
                     std::to_string(layout_.count));
  std::vector<RedisCommand> cmds;
  std::vector<const RedisStackLeaf*> leaves;
  for (const auto& l : layout_.leaves) {
    if (l.kind != LeafKind::Tensor) continue;
    leaves.push_back(&l);
    int64_t a = l.offsets[static_cast<size_t>(member)], b = l.offsets[static_cast<size_t>(member) + 1];
    cmds.push_back(RedisCommand{"GETRANGE", redis_key(options_.prefix(), options_.td_id(), "d:" + redis_join_path(l.path))}
                       .arg(a)
                       .arg(b - 1));
  }
  std::vector<RedisReply> r = cmds.size() > 1 ? client_->transaction(cmds) : client_->pipeline(cmds);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < leaves.size(); ++i) {
    const RedisStackLeaf& l = *leaves[i];
    std::string dkey = redis_key(options_.prefix(), options_.td_id(), "d:" + redis_join_path(l.path));
    if (r[i].is_error()) redis_reply_error(r[i], dkey);
    int64_t want = l.offsets[static_cast<size_t>(member) + 1] - l.offsets[static_cast<size_t>(member)];
    std::string bytes = want == 0 ? std::string() : std::move(r[i].str);
    if (static_cast<int64_t>(bytes.size()) != want)
      throw FormatError(dkey + ": member " + std::to_string(member) + " holds " + std::to_string(bytes.size()) +
                        " bytes, the layout says " + std::to_string(want));
    out.push_back(tensor_from_bytes(std::move(bytes), l.dtype, l.shapes[static_cast<size_t>(member)]));
  }
  return out;
}

std::unique_ptr<RedisLazyStackStore> RedisLazyStackStore::create(
    const RedisOptions& options_in, const std::vector<std::vector<std::pair<LeafPath, at::Tensor>>>& members,
    int64_t stack_dim, const std::vector<int64_t>& inner_batch_size, const std::string& device) {
  RedisOptions options = options_in;
  if (options.td_id().empty()) options.td_id(new_redis_td_id());
  auto k = [&](const std::string& s) { return redis_key(options.prefix(), options.td_id(), s); };
  if (stack_dim < 0 || stack_dim > static_cast<int64_t>(inner_batch_size.size()))
    throw ValueError("stack dim " + std::to_string(stack_dim) + " does not fit the inner batch size " +
                     redis_shape_text(inner_batch_size));
  const int64_t N = static_cast<int64_t>(members.size());
  std::vector<RedisCommand> cmds;
  cmds.push_back(RedisCommand{"SET", k("__type__"), "lazy_stack"});
  cmds.push_back(RedisCommand{"SET", k("__count__"), std::to_string(N)});
  cmds.push_back(RedisCommand{"SET", k("__stack_dim__"), std::to_string(stack_dim)});
  cmds.push_back(RedisCommand{"SET", k("__inner_batch_size__"), redis_shape_text(inner_batch_size)});
  cmds.push_back(RedisCommand{"SET", k("__device__"), device});
  if (N > 0) {
    const auto& first = members[0];
    for (size_t li = 0; li < first.size(); ++li) {
      const LeafPath& path = first[li].first;
      check_leaf_path(path);
      std::string joined = redis_join_path(path);
      at::ScalarType dtype = first[li].second.scalar_type();
      std::string dtype_name = dtype_to_string(dtype);
      std::vector<std::vector<int64_t>> shapes;
      std::string data;
      std::vector<int64_t> offsets{0};
      for (int64_t m = 0; m < N; ++m) {
        const auto& mem = members[static_cast<size_t>(m)];
        if (mem.size() != first.size() || mem[li].first != path)
          throw ValueError("lazy-stack members must hold the same keys in the same order (member " +
                           std::to_string(m) + ", key '" + joined + "')");
        if (mem[li].second.scalar_type() != dtype)
          throw ValueError("lazy-stack members disagree on the dtype of '" + joined + "'");
        at::Tensor t = bytes_ready(mem[li].second);
        shapes.push_back(std_shape(t.sizes()));
        data.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.nbytes()));
        offsets.push_back(static_cast<int64_t>(data.size()));
      }
      if (static_cast<int64_t>(data.size()) > kRedisMaxValueBytes)
        throw ValueError(k("d:" + joined) + ": exceeds 512 MiB, the largest Redis value");
      bool homogeneous = std::all_of(shapes.begin(), shapes.end(), [&](const auto& s) { return s == shapes[0]; });
      std::vector<int64_t> shape{N};
      shape.insert(shape.end(), shapes[0].begin(), shapes[0].end());
      cmds.push_back(RedisCommand{"DEL", k("d:" + joined), k("m:" + joined), k("d:" + joined + ":idx")});
      cmds.push_back(RedisCommand{"SET", k("d:" + joined), data});
      RedisCommand h{"HSET", k("m:" + joined), "shape", redis_shape_text(shape), "dtype", dtype_name, "homogeneous",
                     homogeneous ? "1" : "0"};
      if (!homogeneous) {
        std::string st = "[";
        for (size_t j = 0; j < shapes.size(); ++j) st += (j ? ", " : "") + redis_shape_text(shapes[j]);
        h.arg("shapes").arg(st + "]");
        std::string idx(offsets.size() * 8, '\0');
        std::memcpy(&idx[0], offsets.data(), idx.size());
        cmds.push_back(RedisCommand{"SET", k("d:" + joined + ":idx"), idx});
      }
      cmds.push_back(std::move(h));
      cmds.push_back(RedisCommand{"SADD", k("__keys__"), joined});
    }
  }
  {
    RedisClient c(options.connect_options());
    std::vector<RedisReply> r = c.transaction(cmds);
    for (const auto& x : r)
      if (x.is_error()) redis_reply_error(x, k("__type__"));
  }
  return std::make_unique<RedisLazyStackStore>(options);
}

RedisStackLayout read_redis_lazy_stack_layout(const RedisOptions& options) {
  return RedisLazyStackStore(options).layout();
}


}  // namespace backends
}  // namespace tensordict
