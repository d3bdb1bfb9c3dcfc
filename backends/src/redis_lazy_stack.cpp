// Redis lazy stacks (RedisLazyStackStore, Python's lazy-stack layout in Redis): the stack's layout and
// leaves, reading leaves across members or one member whole, creating a stack from its members' tensors.
#include "redis_internal.hpp"

#include <algorithm>
#include <cstring>

#include "tensordict/backends/tensor_values.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

using namespace redis_detail;

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
  std::vector<RedisReply> r = cmds.size() > 1 ? client_->read_together(cmds) : client_->pipeline(cmds);
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
  std::vector<RedisReply> r = cmds.size() > 1 ? client_->read_together(cmds) : client_->pipeline(cmds);
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
        at::Tensor t = value_bytes(mem[li].second);
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
    // refused over a td_id that holds a store (dense or lazy): the transaction would mix its metadata and keys with
    // the old store's. WATCH makes a store created there meanwhile abort the transaction (nothing applied)
    RedisClient c(options.connect_options());
    auto held = [&] {
      std::vector<RedisReply> h = c.pipeline({RedisCommand{"GET", k("__batch_size__")}, RedisCommand{"GET", k("__type__")}});
      for (const auto& x : h)
        if (x.is_error()) redis_reply_error(x, k("__type__"));
      return !h[0].is_nil() || !h[1].is_nil();
    };
    auto refuse = [&] {
      return ValueError("td_id '" + options.td_id() + "' (prefix '" + options.prefix() + "') already holds a store at " +
                        c.endpoint() + "; clear it (clear_redis) or use another td_id");
    };
    const RedisReply w = c.command({"WATCH", k("__batch_size__"), k("__type__")});
    if (w.is_error()) redis_reply_error(w, k("__type__"));
    if (held()) {
      c.command({"UNWATCH"});
      throw refuse();
    }
    std::vector<RedisReply> r;
    try {
      r = c.transaction(cmds);
    } catch (const BackendError&) {
      if (held()) throw refuse();
      throw;
    }
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
