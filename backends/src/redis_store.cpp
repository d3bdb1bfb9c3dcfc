// The Redis LeafStore (see redis_store.hpp and backends/README.md): the store's connection and metadata
// (batch size, device, tensorclass, the leaf cache), listing, creating and erasing leaves, non-tensor
// values, and the factories that create or open a store (from options or a spec). Tensor I/O:
// redis_tensor_io.cpp; key layout and shared helpers: redis_layout.cpp; lazy stacks: redis_lazy_stack.cpp.
#include "redis_internal.hpp"

#include <c10/core/Device.h>

#include <algorithm>
#include <set>

#include "tensordict/backends/tensor_values.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

namespace {

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

}  // namespace

using namespace redis_detail;

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

std::function<std::shared_ptr<LeafStore>()> RedisStore::lane_opener() const {
  check_open();
  return [options = options_] { return std::make_shared<RedisStore>(options); };
}

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
    t = value_bytes(data.scalar_type() == dtype ? data : data.to(dtype));
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
  const std::vector<std::string> targets = members_under(joined);
  if (targets.empty()) return false;
  RedisCommand del{"DEL"};
  RedisCommand srem{"SREM", key("__keys__")};
  for (const auto& k : targets) {
    del.arg(key("d:" + k)).arg(key("m:" + k)).arg(key("d:" + k + ":idx"));
    srem.arg(k);
    forget(k);
  }
  transact({std::move(del), std::move(srem)}, key("d:" + joined));
  return true;
}

std::vector<std::string> RedisStore::members_under(const std::string& joined) const {
  std::vector<std::string> out;
  for (const std::string& k : members())
    if (k == joined || (k.size() > joined.size() && k.compare(0, joined.size() + 1, joined + ".") == 0)) out.push_back(k);
  return out;
}

void RedisStore::transact(const std::vector<RedisCommand>& cmds, const std::string& what) {
  // one script (atomic, as MULTI/EXEC) running each command from ARGV: <argc> <arg>... per command. Not a
  // MULTI: a server over its maxmemory refuses every command queued in a MULTI, so no key could be erased or
  // moved to free memory, and a write that failed for want of memory could not remove the keys it had made. A
  // script without flags runs there, and DEL / SREM / RENAME (not refused when out of memory) run inside it. A
  // RENAME whose source does not exist deletes its destination instead (RENAME would fail there, and a failing
  // command stops a script with the commands before it applied)
  static const char* const kRun =
      "local i = 1\n"
      "while i <= #ARGV do\n"
      "  local n = tonumber(ARGV[i])\n"
      "  if ARGV[i + 1] == 'RENAME' and redis.call('EXISTS', ARGV[i + 2]) == 0 then\n"
      "    redis.call('DEL', ARGV[i + 3])\n"
      "  else\n"
      "    redis.call(unpack(ARGV, i + 1, i + n))\n"
      "  end\n"
      "  i = i + n + 1\n"
      "end\n"
      "return 1\n";
  RedisCommand eval{"EVAL", kRun, "0"};
  for (const auto& c : cmds) {
    eval.arg(static_cast<int64_t>(c.size()));
    for (size_t j = 0; j < c.size(); ++j) eval.arg(c.at(j));
  }
  const RedisReply r = client().command(eval);
  if (r.is_error()) redis_reply_error(r, what);
}

std::vector<RedisCommand> RedisStore::rename_cmds(const std::string& jf, const std::string& jt,
                                                  const std::vector<std::string>& targets) {
  // every key a leaf may have, renamed: the transaction's script skips a source that does not exist (a lazy
  // stack's offset table d:<key>:idx, the value of a zero-byte leaf) and deletes its destination instead
  std::vector<RedisCommand> cmds;
  RedisCommand srem{"SREM", key("__keys__")};
  RedisCommand sadd{"SADD", key("__keys__")};
  for (const std::string& k : targets) {
    const std::string nk = jt + k.substr(jf.size());
    cmds.push_back(RedisCommand{"RENAME", key("d:" + k), key("d:" + nk)});
    cmds.push_back(RedisCommand{"RENAME", key("m:" + k), key("m:" + nk)});
    cmds.push_back(RedisCommand{"RENAME", key("d:" + k + ":idx"), key("d:" + nk + ":idx")});
    srem.arg(k);
    sadd.arg(nk);
    forget(k);
    forget(nk);
  }
  cmds.push_back(std::move(srem));
  cmds.push_back(std::move(sadd));
  return cmds;
}

void RedisStore::move(const LeafPath& from, const LeafPath& to) {
  check_leaf_path(to);
  const std::string jf = redis_join_path(from), jt = redis_join_path(to);
  if (!members_under(jt).empty()) throw KeyError("key '" + jt + "' already exists in " + describe());
  const std::vector<std::string> targets = members_under(jf);
  if (targets.empty()) throw KeyError("key '" + jf + "' not found in " + describe());
  transact(rename_cmds(jf, jt, targets), key("d:" + jf));
}

void RedisStore::replace(const LeafPath& from, const LeafPath& to) {
  check_leaf_path(to);
  const std::string jf = redis_join_path(from), jt = redis_join_path(to);
  const std::vector<std::string> targets = members_under(jf);
  if (targets.empty()) throw KeyError("key '" + jf + "' not found in " + describe());
  if (jt.size() > jf.size() && jt.compare(0, jf.size() + 1, jf + ".") == 0)
    throw ValueError("cannot move '" + jf + "' into itself ('" + jt + "') in " + describe());
  // the old leaves under `to` (not those being moved, which may lie in it) deleted, in the same script
  const std::set<std::string> moving(targets.begin(), targets.end());
  RedisCommand del{"DEL"};
  RedisCommand srem{"SREM", key("__keys__")};
  for (const std::string& k : members_under(jt)) {
    if (moving.count(k)) continue;
    del.arg(key("d:" + k)).arg(key("m:" + k)).arg(key("d:" + k + ":idx"));
    srem.arg(k);
    forget(k);
  }
  std::vector<RedisCommand> cmds;
  if (srem.size() > 2) {
    cmds.push_back(std::move(del));
    cmds.push_back(std::move(srem));
  }
  for (RedisCommand& c : rename_cmds(jf, jt, targets)) cmds.push_back(std::move(c));
  transact(cmds, key("d:" + jf));
}

void RedisStore::clear() {
  RedisCommand del{"DEL", key("__batch_size__"), key("__device__"), key("__keys__")};
  for (const std::string& k : members()) del.arg(key("d:" + k)).arg(key("m:" + k)).arg(key("d:" + k + ":idx"));
  invalidate_cache();
  // one command (atomic by itself): no MULTI, which a server over its maxmemory refuses (clear_redis is how memory
  // is freed)
  const RedisReply r = client().command(del);
  if (r.is_error()) redis_reply_error(r, key("__keys__"));
}

NonTensorValue RedisStore::read_non_tensor(const LeafPath& path) {
  std::string joined = redis_join_path(path);
  std::string dkey = key("d:" + joined), mkey = key("m:" + joined);
  std::vector<RedisReply> r = client().pipeline(
      {RedisCommand{"HGETALL", mkey}, RedisCommand{"GET", dkey}, RedisCommand{"GET", key("__batch_size__")}});
  if (r[0].is_error()) redis_reply_error(r[0], mkey);
  if (r[1].is_error()) redis_reply_error(r[1], dkey);
  auto fields = hash_fields(r[0]);
  if (fields.empty()) throw KeyError("key '" + joined + "' not found in " + describe());
  RedisLeafMeta m = decode_redis_meta(path, mkey, fields);
  meta_cache_[joined] = m;
  if (m.info.kind != LeafKind::NonTensor) throw TypeError("key '" + joined + "' in " + describe() + " is a tensor");
  if (r[1].is_nil()) throw FormatError(dkey + ": the value of a non-tensor is missing");
  NonTensorValue v = decode_redis_non_tensor(dkey, m.encoding, r[1].str);
  // upstream stores a NonTensorStack as ONE json blob of its tolist() (from_tensordict, set), and its reader
  // turns a list of one value per row back into a NonTensorStack: so does this one (a 1-dim batch)
  if (m.encoding == "json" && v.value.is_array() && r[2].is_string()) {
    const std::vector<int64_t> batch = parse_redis_shape(r[2].str, key("__batch_size__"));
    if (batch.size() == 1 && static_cast<int64_t>(v.value.as_array().size()) == batch[0]) v.stacked = true;
  }
  return v;
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
  // one script, so nothing changes unless it may: a td_id that holds a store of another batch size (or a lazy
  // stack's store) is refused. Setting __batch_size__ over it had left its keys disagreeing with the new batch size,
  // a store no handle could open again. The same batch size is upstream's reconnect (its metadata written again)
  static const char* const kCreate =
      "local bs = redis.call('GET', KEYS[1])\n"
      "if bs and bs ~= ARGV[1] then return {0, bs} end\n"
      "if not bs then\n"
      "  local t = redis.call('GET', KEYS[3])\n"
      "  if t then return {1, t} end\n"
      "end\n"
      "redis.call('SET', KEYS[1], ARGV[1])\n"
      "redis.call('SET', KEYS[2], ARGV[2])\n"
      "return {2, ''}\n";
  const std::string bs_key = store->key("__batch_size__");
  std::string shape = redis_shape_text(batch_size);
  for (int attempt = 0;; ++attempt) {
    const RedisReply r = store->client().command(
        {"EVAL", kCreate, "3", bs_key, store->key("__device__"), store->key("__type__"), shape, device});
    if (r.is_error()) redis_reply_error(r, bs_key);
    if (!r.is_array() || r.elements.size() != 2 || !r.elements[0].is_integer())
      throw BackendError("creating " + store->describe() + ": an unexpected reply from the server's script");
    const int64_t code = r.elements[0].integer;
    if (code == 2) return store;
    if (code == 1) {
      throw ValueError("td_id '" + options.td_id() + "' (prefix '" + options.prefix() + "') already holds a " +
                       "lazy-stack store at " + store->client().endpoint() + "; clear it (clear_redis) or use another td_id");
    }
    const std::string& old = r.elements[1].str;
    std::vector<int64_t> old_shape;
    bool parsed = false;
    try {
      old_shape = parse_redis_shape(old, bs_key);
      parsed = true;
    } catch (const Error&) {
    }
    // the same batch size spelled otherwise (another writer's formatting): kept as it is spelled
    if (parsed && old_shape == batch_size && attempt == 0) {
      shape = old;
      continue;
    }
    throw ValueError("td_id '" + options.td_id() + "' (prefix '" + options.prefix() + "') already holds a store of " +
                     "batch size " + (parsed ? redis_shape_text(old_shape) : "'" + old.substr(0, 64) + "'") +
                     " at " + store->client().endpoint() + ": a store of batch size " + redis_shape_text(batch_size) +
                     " over it would leave its keys unreadable; open it with TensorDictStore::from_store, or clear it "
                     "(clear_redis) first");
  }
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
                     "') is a lazy-stack store (Python's LazyStackedTensorDictStore, no __batch_size__): read it with "
                     "TensorDictStore::load_lazy_stack");
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

RedisStoreKind redis_store_kind(const RedisOptions& options) {
  if (options.td_id().empty()) return RedisStoreKind::None;
  RedisStore store(options);
  std::vector<RedisReply> r = store.client().pipeline(
      {RedisCommand{"GET", store.key("__batch_size__")}, RedisCommand{"GET", store.key("__type__")}});
  if (r[0].is_error()) redis_reply_error(r[0], store.key("__batch_size__"));
  if (r[1].is_error()) redis_reply_error(r[1], store.key("__type__"));
  if (!r[0].is_nil()) return RedisStoreKind::TensorDict;
  return r[1].is_string() && r[1].str == "lazy_stack" ? RedisStoreKind::LazyStack : RedisStoreKind::None;
}

namespace {
//! a glob pattern matching `s` literally (Redis SCAN / KEYS)
std::string glob_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

int64_t remove_redis_store(const RedisOptions& options) {
  if (options.td_id().empty()) throw ValueError("remove_redis_store: no td_id");
  RedisClient client(options.connect_options());
  const std::string pattern = glob_literal(redis_key(options.prefix(), options.td_id(), "")) + "*";
  int64_t removed = 0;
  std::string cursor = "0";
  for (int guard = 0; guard < 1000000; ++guard) {
    RedisReply r = client.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    cursor = r.elements.at(0).str;
    std::vector<std::string> del{"DEL"};
    for (const auto& k : r.elements.at(1).elements) del.push_back(k.str);
    if (del.size() > 1) removed += client.command(del).integer;
    if (cursor == "0") break;
  }
  return removed;
}

int64_t replace_redis_store(const RedisOptions& options, const std::string& staged_td_id) {
  if (options.td_id().empty() || staged_td_id.empty() || staged_td_id == options.td_id()) {
    throw ValueError("replace_redis_store: needs two different td_ids");
  }
  static const char* script =
      "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end\n"
      "local moved = 0\n"
      "for _, k in ipairs(redis.call('KEYS', ARGV[2])) do\n"
      "  redis.call('RENAME', k, ARGV[3] .. string.sub(k, #ARGV[4] + 1))\n"
      "  moved = moved + 1\n"
      "end\n"
      "return moved\n";
  const std::string old_p = redis_key(options.prefix(), options.td_id(), "");
  const std::string new_p = redis_key(options.prefix(), staged_td_id, "");
  RedisClient client(options.connect_options());
  return client.command({"EVAL", script, "0", glob_literal(old_p) + "*", glob_literal(new_p) + "*", old_p, new_p}).integer;
}

std::string redis_store_td_id(const LeafStore& store) {
  auto* r = dynamic_cast<const RedisStore*>(&store);
  if (!r) throw ValueError("not a Redis store: " + store.describe());
  return r->td_id();
}

}  // namespace backends
}  // namespace tensordict
