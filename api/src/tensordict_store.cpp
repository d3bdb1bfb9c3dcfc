// TensorDictStore: Redis stores (backends/redis_store) behind their store actor, as RemoteNodes.
#include "tensordict/tensordict_store.hpp"

#include "tensordict/device.hpp"

#include "remote_node.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/backends/redis_store.hpp"
#include "tensordict/config.hpp"
#include "tensordict/engine.hpp"
#include "tensordict/typed_schema.hpp"

namespace tensordict {

namespace {

const char* kType = "TensorDictStore";

std::shared_ptr<actors::Runtime> runtime_of(const std::shared_ptr<Engine>& engine) {
  return (engine ? engine : Engine::default_engine())->runtime();
}

backends::RedisOptions backend_options(const RedisOptions& o, const Config& cfg) {
  // checked before any store is made or reached
  if (o.write_behind() < 0) {
    throw ValueError("RedisOptions::write_behind must be 0 (off) or a number of writes, got " +
                     std::to_string(o.write_behind()));
  }
  backends::RedisOptions b;
  b.host(o.host().empty() ? cfg.redis_host : o.host());
  b.port(o.port() > 0 ? o.port() : static_cast<int>(cfg.redis_port));
  b.db(o.db() >= 0 ? o.db() : static_cast<int>(cfg.redis_db));
  b.unix_socket(o.unix_socket());
  b.prefix(o.prefix().empty() ? cfg.redis_prefix : o.prefix());
  b.user(o.user());
  b.password(o.password());  // empty: the environment's (backends::redis_env_credentials)
  b.td_id(o.td_id());
  b.retries(o.retries());
  b.retry_delay_ms(o.retry_delay_ms());
  b.connect_timeout_ms(o.connect_timeout_ms());
  b.command_timeout_ms(o.timeout_ms() >= 0 ? o.timeout_ms() : static_cast<int>(cfg.redis_timeout_ms));
  return b;
}

std::string device_str(const RedisOptions& o) { return o.device() ? o.device()->str() : std::string(); }

std::shared_ptr<remote::RemoteTree> tree_over(std::shared_ptr<backends::LeafStore> store, const RedisOptions& o) {
  auto client = actors::StoreClient::open(runtime_of(o.engine()), std::move(store));
  client->set_write_behind(static_cast<size_t>(o.write_behind()));
  return std::make_shared<remote::RemoteTree>(std::move(client), std::nullopt, o.device(), kType);
}

std::shared_ptr<remote::RemoteTree> create(const BatchSize& batch, const RedisOptions& o) {
  auto rt = runtime_of(o.engine());
  for (auto b : batch)
    if (b < 0) throw BatchSizeError("TensorDictStore: negative batch size");
  auto store = backends::create_redis_store(backend_options(o, rt->config()), batch, device_str(o));
  return tree_over(std::move(store), o);
}

remote::RemoteNode& node_of(const TensorDict& td) {
  remote::RemoteNode* n = remote::remote_node_of(td);
  if (!n || n->tree()->client()->driver() != "redis") {
    throw TypeError(std::string("not a TensorDictStore: a ") +
                    (td.defined() && td.node() ? td.node()->type_name() : std::string("undefined TensorDict")));
  }
  return *n;
}

std::string field(const JsonValue& f, const char* name) {
  const JsonValue* v = f.is_object() ? f.find(name) : nullptr;
  if (!v) return "";
  if (v->is_string()) return v->as_string();
  if (v->is_int()) return std::to_string(v->as_int());
  return "";
}

//! fills a store just created: a fill that fails part-way (a leaf the store refuses, a lost connection) clears the
//! store again when it held no key before, as a file from_dict made is removed (persistent.cpp): no half-made
//! store under the id is left for a reader to open
template <class F>
void fill_new(remote::RemoteTree& tree, F fill) {
  const bool was_empty = tree.client()->run([](backends::LeafStore& s) { return s.list().empty(); });
  try {
    fill();
  } catch (...) {
    if (was_empty) {
      try {
        tree.client()->run([](backends::LeafStore& s) { s.clear(); });
      } catch (...) {  // the server is gone: nothing more to clear
      }
    }
    throw;
  }
}

void create_schema(remote::RemoteTree& tree, const Schema& schema, const BatchSize& batch) {
  tree.client()->run([&](backends::LeafStore& s) {
    for (const auto& kv : schema) {
      BatchSize shape = batch;
      shape.insert(shape.end(), kv.second.first.begin(), kv.second.first.end());
      s.create(kv.first.parts(), kv.second.second, shape, at::Tensor(), backends::CreateOptions());
    }
  });
  tree.reload();
}

}  // namespace

JsonValue RedisOptions::fields() const {
  JsonValue::Object o;
  o.emplace_back("host", JsonValue(host()));
  o.emplace_back("port", JsonValue(static_cast<int64_t>(port())));
  o.emplace_back("db", JsonValue(static_cast<int64_t>(db())));
  o.emplace_back("unix_socket", JsonValue(unix_socket()));
  o.emplace_back("prefix", JsonValue(prefix()));
  // in-process only (from_schema's creator reads them back): storage specs come from the store's
  // spec_fields(), which never hold the user nor the password
  o.emplace_back("user", JsonValue(user()));
  o.emplace_back("password", JsonValue(password()));
  o.emplace_back("td_id", JsonValue(td_id()));
  o.emplace_back("timeout_ms", JsonValue(static_cast<int64_t>(timeout_ms())));
  if (device()) o.emplace_back("device", JsonValue(device()->str()));
  return JsonValue::object(std::move(o));
}

RedisOptions RedisOptions::from_fields(const JsonValue& f) {
  RedisOptions o;
  auto str = [&](const char* n) { return field(f, n); };
  auto num = [&](const char* n, int dflt) {
    const JsonValue* v = f.is_object() ? f.find(n) : nullptr;
    return v && v->is_int() ? static_cast<int>(v->as_int()) : dflt;
  };
  o.host(str("host")).port(num("port", 0)).db(num("db", -1)).unix_socket(str("unix_socket")).prefix(str("prefix"));
  o.user(str("user")).password(str("password")).td_id(str("td_id")).timeout_ms(num("timeout_ms", -1));
  if (!str("device").empty()) o.device(parse_device(str("device"), "RedisOptions"));
  return o;
}

backends::RedisConnectOptions RedisOptions::connect_options() const {
  return backend_options(*this, runtime_of(engine())->config()).connect_options();
}

std::string redact_url(const std::string& url) { return backends::redact_redis_url(url); }

namespace {

std::string percent_decode(const std::string& s, const std::string& url) {
  auto hex = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || hex(s[i + 1]) < 0 || hex(s[i + 2]) < 0)
      throw ValueError("Redis URL '" + redact_url(url) + "': a '%' not followed by two hex digits");
    out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
    i += 2;
  }
  return out;
}

}  // namespace

RedisOptions RedisOptions::from_url(const std::string& url) {
  const std::string shown = redact_url(url);
  const std::string usage = " (expected redis://[user[:password]@]HOST:PORT/DB?prefix=P&td_id=ID&timeout=SECONDS)";
  if (url.rfind("redis://", 0) != 0) throw ValueError("'" + shown + "' is not a redis:// URL" + usage);
  std::string rest = url.substr(8), query;
  RedisOptions o;
  std::string userinfo;
  bool has_userinfo = false;
  // the userinfo ends at the last '@' before the query ('/' may be part of a password; '?' must be %3F)
  if (auto at = rest.substr(0, rest.find('?')).rfind('@'); at != std::string::npos) {
    userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    has_userinfo = true;
  }
  if (auto q = rest.find('?'); q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }
  std::string db;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    db = rest.substr(slash + 1);
    rest.resize(slash);
  }
  if (has_userinfo) {
    if (auto colon = userinfo.find(':'); colon != std::string::npos) {
      o.user(percent_decode(userinfo.substr(0, colon), url));
      o.password(percent_decode(userinfo.substr(colon + 1), url));
    } else {
      o.password(percent_decode(userinfo, url));  // "redis://secret@host", as redis-cli reads it
    }
  }
  std::string host = rest, port;
  if (auto colon = rest.rfind(':'); colon != std::string::npos && rest.find(']') == std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  auto number = [&](const std::string& s, const char* what, int64_t max) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9 || std::stoll(s) > max)
      throw ValueError("'" + shown + "': bad " + what + usage);
    return static_cast<int>(std::stoll(s));
  };
  if (host.find_first_of("@:/ ") != std::string::npos) throw ValueError("'" + shown + "': bad host" + usage);
  o.host(host);
  if (!port.empty()) o.port(number(port, "port", 65535));
  if (!db.empty()) o.db(number(db, "db", 1 << 30));
  size_t pos = 0;
  while (pos <= query.size() && !query.empty()) {
    size_t amp = query.find('&', pos);
    std::string kv = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    pos = amp == std::string::npos ? query.size() + 1 : amp + 1;
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : percent_decode(kv.substr(eq + 1), url);
    if (k == "prefix") {
      o.prefix(v);
    } else if (k == "td_id") {
      o.td_id(v);
    } else if (k == "password") {
      o.password(v);
    } else if (k == "user") {
      o.user(v);
    } else if (k == "timeout") {
      char* end = nullptr;
      const double secs = v.empty() ? -1 : std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(secs >= 0) || secs > 86400)
        throw ValueError("'" + shown + "': bad timeout '" + v + "' (seconds, 0 to 86400; 0: none)");
      const int ms = static_cast<int>(secs * 1000 + 0.5);
      o.timeout_ms(secs > 0 && ms == 0 ? 1 : ms);
    } else {
      throw ValueError("'" + shown + "': unknown parameter '" + k.substr(0, 64) +
                       "' (expected prefix, td_id, timeout, user, password)");
    }
  }
  return o;
}

TensorDictStore::TensorDictStore(const BatchSize& batch_size, const RedisOptions& options)
    : TensorDict(remote::make_remote(create(batch_size, options))) {}

TensorDictStore::TensorDictStore(const TensorDict& td) : TensorDict(td) { node_of(td); }

TensorDictStore TensorDictStore::from_tensordict(const TensorDict& td, const RedisOptions& options) {
  if (!td.defined()) throw ValueError("TensorDictStore.from_tensordict: the TensorDict is undefined");
  auto tree = create(td.batch_size(), options);
  // a NonTensorStack (one value per row along dim 0) goes in as upstream's from_tensordict stores it: ONE json
  // blob of its tolist() (LeafStore::stack_as_one_value), which Python and this library read back as a stack
  std::optional<TensorDictStore> out;
  fill_new(*tree, [&] {
    remote::upload_all(*tree, {}, td);
    out.emplace(remote::make_remote(tree));
    // a TensorClass's TensorDict: its class path, as Python's from_tensordict(tc) stores it
    if (td.typed_schema() && td.typed_schema()->tensorclass) out->set_tensorclass(td.typed_schema()->class_path);
  });
  return std::move(*out);
}

std::string TensorDictStore::tensorclass() const {
  std::string out;
  node_of(*this).tree()->client()->run([&](backends::LeafStore& s) { out = s.tensorclass(); });
  return out;
}

void TensorDictStore::set_tensorclass(const std::string& class_path) const {
  node_of(*this).tree()->client()->run([&](backends::LeafStore& s) { s.set_tensorclass(class_path); });
}

TensorDictStore TensorDictStore::from_schema(const Schema& schema, const BatchSize& batch_size,
                                             const RedisOptions& options) {
  auto tree = create(batch_size, options);
  fill_new(*tree, [&] { create_schema(*tree, schema, batch_size); });
  return TensorDictStore(remote::make_remote(tree));
}

TensorDictStore TensorDictStore::from_store(const std::string& td_id, const RedisOptions& options) {
  if (td_id.empty()) throw ValueError("TensorDictStore.from_store: empty td_id");
  RedisOptions o = options;
  o.td_id(td_id);
  auto rt = runtime_of(o.engine());
  auto store = backends::open_redis_store(backend_options(o, rt->config()));
  return TensorDictStore(remote::make_remote(tree_over(std::move(store), o)));
}

LazyStackedTensorDict TensorDictStore::load_lazy_stack(const std::string& td_id, const RedisOptions& options) {
  RedisOptions o = options;
  o.td_id(td_id);
  backends::RedisLazyStackStore store(backend_options(o, runtime_of(o.engine())->config()));
  const backends::RedisStackLayout& layout = store.layout();
  std::vector<backends::LeafPath> paths;
  for (const auto& leaf : layout.leaves)
    if (leaf.kind == backends::LeafKind::Tensor) paths.push_back(leaf.path);
  std::vector<std::vector<at::Tensor>> values = store.read_leaves(paths);
  std::optional<at::Device> device = o.device();
  if (!device && !layout.device.empty()) device = parse_device(layout.device, "the Redis store's recorded device");
  std::vector<TensorDict> members;
  for (int64_t m = 0; m < layout.count; ++m) {
    TensorDict td(layout.inner_batch_size, device);
    for (size_t i = 0; i < paths.size(); ++i) {
      at::Tensor t = values[i][static_cast<size_t>(m)];
      td.set(NestedKey(paths[i]), device ? t.to(*device) : t);
    }
    members.push_back(td);
  }
  return LazyStackedTensorDict(std::move(members), layout.stack_dim);
}

std::string TensorDictStore::save_lazy_stack(const LazyStackedTensorDict& td, const RedisOptions& options) {
  std::vector<std::vector<std::pair<backends::LeafPath, at::Tensor>>> members;
  BatchSize inner;
  for (const auto& m : td.tensordicts()) {
    inner = m.batch_size();
    std::vector<std::pair<backends::LeafPath, at::Tensor>> leaves;
    TensorDict dense = m.node()->dense_form(m);
    for (const auto& kv : dense.items(KeysOptions().include_nested(true).leaves_only(true))) {
      leaves.emplace_back(kv.first.parts(), kv.second.tensor().detach().cpu().contiguous());
    }
    members.push_back(std::move(leaves));
  }
  auto store = backends::RedisLazyStackStore::create(backend_options(options, runtime_of(options.engine())->config()),
                                                     members, td.stack_dim(), inner, device_str(options));
  return store->td_id();
}

bool TensorDictStore::is_lazy_stack(const std::string& td_id, const RedisOptions& options) {
  if (td_id.empty()) throw ValueError("TensorDictStore.is_lazy_stack: empty td_id");
  RedisOptions o = options;
  o.td_id(td_id);
  return backends::redis_store_kind(backend_options(o, runtime_of(o.engine())->config())) ==
         backends::RedisStoreKind::LazyStack;
}

int64_t TensorDictStore::remove(const std::string& td_id, const RedisOptions& options) {
  RedisOptions o = options;
  o.td_id(td_id);
  return backends::remove_redis_store(backend_options(o, runtime_of(o.engine())->config()));
}

int64_t TensorDictStore::replace(const std::string& td_id, const std::string& staged_td_id, const RedisOptions& options) {
  RedisOptions o = options;
  o.td_id(td_id);
  return backends::replace_redis_store(backend_options(o, runtime_of(o.engine())->config()), staged_td_id);
}

std::string TensorDictStore::address_of(const std::string& td_id, const RedisOptions& options) {
  RedisOptions o = options;
  o.td_id(td_id);
  const backends::RedisOptions b = backend_options(o, runtime_of(o.engine())->config());
  const std::string where = b.unix_socket().empty() ? b.host() + ":" + std::to_string(b.port()) : b.unix_socket();
  return "redis://" + where + "/" + std::to_string(b.db()) + "?prefix=" + b.prefix() + "&td_id=" + td_id;
}

const std::string& TensorDictStore::td_id() const {
  const JsonValue& f = node_of(*this).tree()->client()->spec_fields();
  const JsonValue* v = f.find("td_id");
  static const std::string kEmpty;
  return v && v->is_string() ? v->as_string() : kEmpty;
}

std::string TensorDictStore::address() const {
  const JsonValue& f = node_of(*this).tree()->client()->spec_fields();
  std::string where = field(f, "unix_socket");
  if (where.empty()) where = field(f, "host") + ":" + field(f, "port");
  return "redis://" + where + "/" + field(f, "db") + "?prefix=" + field(f, "prefix") + "&td_id=" + field(f, "td_id");
}

void TensorDictStore::close() const { node_of(*this).tree()->client()->close(); }

void TensorDictStore::flush_writes() const { node_of(*this).tree()->client()->flush_writes(); }

void TensorDictStore::clear_redis() const {
  remote::RemoteNode& n = node_of(*this);
  n.tree()->client()->run([](backends::LeafStore& s) { s.clear(); });
  n.tree()->reload();
}

TensorDictStore::StoreStats TensorDictStore::store_stats() const {
  auto s = node_of(*this).tree()->client()->batch_stats();
  return StoreStats{s.calls, s.batches, s.largest, s.lane_calls};
}

namespace detail {

//! the "redis" storage driver: another process reopens a store by its spec; from_schema(..., "redis") creates
//! one (a new td_id unless the options name one); open_or_create opens the td_id when the server has it
void register_redis_storage() {
  StorageDriver driver;
  driver.open = [](const StorageSpec& spec, const OpenOptions&) {
    RedisOptions o = RedisOptions::from_fields(spec.json());
    return TensorDict(TensorDictStore::from_store(o.td_id(), o));
  };
  driver.create = [](const StorageSpec& spec, const OpenOptions& open) {
    return TensorDict(
        TensorDictStore::from_schema(open.schema(), open.batch_size(), RedisOptions::from_fields(spec.json())));
  };
  driver.exists = [](const StorageSpec& spec) {
    RedisOptions o = RedisOptions::from_fields(spec.json());
    return backends::redis_store_kind(backend_options(o, runtime_of(o.engine())->config())) !=
           backends::RedisStoreKind::None;
  };
  register_storage_driver("redis", std::move(driver));
}

}  // namespace detail

}  // namespace tensordict
