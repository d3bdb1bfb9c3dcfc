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
  backends::RedisOptions b;
  b.host(o.host().empty() ? cfg.redis_host : o.host());
  b.port(o.port() > 0 ? o.port() : static_cast<int>(cfg.redis_port));
  b.db(o.db() >= 0 ? o.db() : static_cast<int>(cfg.redis_db));
  b.unix_socket(o.unix_socket());
  b.prefix(o.prefix().empty() ? cfg.redis_prefix : o.prefix());
  b.password(o.password());
  b.td_id(o.td_id());
  b.retries(o.retries());
  b.retry_delay_ms(o.retry_delay_ms());
  b.connect_timeout_ms(o.connect_timeout_ms());
  return b;
}

std::string device_str(const RedisOptions& o) { return o.device() ? o.device()->str() : std::string(); }

std::shared_ptr<remote::RemoteTree> tree_over(std::shared_ptr<backends::LeafStore> store, const RedisOptions& o) {
  auto client = actors::LeafStoreClient::open(runtime_of(o.engine()), std::move(store));
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
  o.emplace_back("password", JsonValue(password()));
  o.emplace_back("td_id", JsonValue(td_id()));
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
  o.password(str("password")).td_id(str("td_id"));
  if (!str("device").empty()) o.device(parse_device(str("device"), "RedisOptions"));
  return o;
}

TensorDictStore::TensorDictStore(const BatchSize& batch_size, const RedisOptions& options)
    : TensorDict(remote::make_remote(create(batch_size, options))) {}

TensorDictStore::TensorDictStore(const TensorDict& td) : TensorDict(td) { node_of(td); }

TensorDictStore TensorDictStore::from_tensordict(const TensorDict& td, const RedisOptions& options) {
  if (!td.defined()) throw ValueError("TensorDictStore.from_tensordict: the TensorDict is undefined");
  auto tree = create(td.batch_size(), options);
  remote::upload_all(*tree, {}, td);
  TensorDictStore out(remote::make_remote(tree));
  // a TensorClass's TensorDict: its class path, as Python's from_tensordict(tc) stores it
  if (td.typed_schema() && td.typed_schema()->tensorclass) out.set_tensorclass(td.typed_schema()->class_path);
  return out;
}

std::string TensorDictStore::tensorclass() const {
  std::string out;
  node_of(*this).tree()->client()->run(
      [&](backends::LeafStore& s) { out = dynamic_cast<backends::RedisStore&>(s).tensorclass(); });
  return out;
}

void TensorDictStore::set_tensorclass(const std::string& class_path) const {
  node_of(*this).tree()->client()->run(
      [&](backends::LeafStore& s) { dynamic_cast<backends::RedisStore&>(s).set_tensorclass(class_path); });
}

TensorDictStore TensorDictStore::from_schema(const Schema& schema, const BatchSize& batch_size,
                                             const RedisOptions& options) {
  auto tree = create(batch_size, options);
  create_schema(*tree, schema, batch_size);
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
    TensorDict dense = m.is_dense() ? m : m.contiguous();
    for (const auto& kv : dense.items(KeysOptions().include_nested(true).leaves_only(true))) {
      leaves.emplace_back(kv.first.parts(), kv.second.tensor().detach().cpu().contiguous());
    }
    members.push_back(std::move(leaves));
  }
  auto store = backends::RedisLazyStackStore::create(backend_options(options, runtime_of(options.engine())->config()),
                                                     members, td.stack_dim(), inner, device_str(options));
  return store->td_id();
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

void TensorDictStore::clear_redis() const {
  remote::RemoteNode& n = node_of(*this);
  n.tree()->client()->run([](backends::LeafStore& s) {
    for (const auto& info : s.list()) {
      if (info.path.size() == 1) s.erase(info.path);
    }
    if (auto* r = dynamic_cast<backends::RedisStore*>(&s)) {
      r->client().command({"DEL", r->key("__batch_size__"), r->key("__device__"), r->key("__keys__")});
    }
  });
  n.tree()->reload();
}

TensorDictStore::StoreStats TensorDictStore::store_stats() const {
  auto s = node_of(*this).tree()->client()->batch_stats();
  return StoreStats{s.calls, s.batches, s.largest};
}

namespace detail {

//! the "redis" storage driver (another process reopens a store by its spec) and from_schema(..., "redis")
void register_redis_storage() {
  register_storage_driver("redis", [](const StorageSpec& spec, const OpenOptions&) {
    RedisOptions o = RedisOptions::from_fields(spec.json());
    return TensorDict(TensorDictStore::from_store(o.td_id(), o));
  });
  register_schema_storage("redis", [](const Schema& schema, const BatchSize& batch, const JsonValue& fields) {
    return TensorDict(TensorDictStore::from_schema(schema, batch, RedisOptions::from_fields(fields)));
  });
}

}  // namespace detail

}  // namespace tensordict
