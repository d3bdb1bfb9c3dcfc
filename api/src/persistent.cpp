// PersistentTensorDict: HDF5 files (backends/h5_store) behind their store actor, as RemoteNodes.
#include "tensordict/persistent.hpp"

#include "tensordict/device.hpp"

#include <filesystem>

#include "remote_node.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/backends/h5_store.hpp"
#include "tensordict/engine.hpp"

namespace tensordict {

namespace {

const char* kType = "PersistentTensorDict";

std::shared_ptr<actors::Runtime> runtime_of(const std::shared_ptr<Engine>& engine) {
  return (engine ? engine : Engine::default_engine())->runtime();
}

backends::CreateOptions create_options(const H5Options& o) {
  backends::CreateOptions c;
  c.chunks = o.chunks();
  c.compression_level = o.compression_level();
  c.shuffle = o.shuffle();
  return c;
}

std::string absolute(const std::string& f) {
  if (f.empty()) throw ValueError("PersistentTensorDict: no file name (H5Options().filename(...))");
  return std::filesystem::absolute(f).lexically_normal().string();
}

backends::LeafPath group_path(const std::string& group) {
  backends::LeafPath p;
  std::string cur;
  for (char c : group) {
    if (c == '/') {
      if (!cur.empty()) p.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) p.push_back(cur);
  return p;
}

std::shared_ptr<remote::RemoteTree> open_tree(const std::string& filename, const H5Options& o,
                                             const backends::LeafPath& group = {}) {
  auto store = backends::open_h5_store(absolute(filename), backends::parse_h5_mode(o.mode()), group, create_options(o),
                                       o.durable());
  auto client = actors::StoreClient::open(runtime_of(o.engine()), std::move(store));
  auto tree = std::make_shared<remote::RemoteTree>(std::move(client), o.batch_size(), o.device(), kType);
  tree->create_options = create_options(o);
  return tree;
}

remote::RemoteNode& node_of(const TensorDict& td) {
  remote::RemoteNode* n = remote::remote_node_of(td);
  if (!n || n->tree()->client()->driver() != "h5") {
    throw TypeError(std::string("not a PersistentTensorDict: a ") +
                    (td.defined() && td.node() ? td.node()->type_name() : std::string("undefined TensorDict")));
  }
  return *n;
}

std::string str_field(const JsonValue& f, const char* name, const std::string& dflt = "") {
  const JsonValue* v = f.find(name);
  return v && v->is_string() ? v->as_string() : dflt;
}

}  // namespace

JsonValue H5Options::fields() const {
  JsonValue::Object o;
  o.emplace_back("filename", JsonValue(filename()));
  o.emplace_back("mode", JsonValue(mode()));
  JsonValue::Array ch;
  for (auto c : chunks()) ch.emplace_back(c);
  o.emplace_back("chunks", JsonValue(std::move(ch)));
  o.emplace_back("compression_level", JsonValue(static_cast<int64_t>(compression_level())));
  o.emplace_back("shuffle", JsonValue(shuffle()));
  o.emplace_back("durable", JsonValue(durable()));
  if (device()) o.emplace_back("device", JsonValue(device()->str()));
  return JsonValue::object(std::move(o));
}

H5Options H5Options::from_fields(const JsonValue& f) {
  H5Options o;
  o.filename(str_field(f, "filename")).mode(str_field(f, "mode", "r"));
  if (const JsonValue* ch = f.find("chunks"); ch && ch->is_array()) {
    std::vector<int64_t> c;
    for (const auto& x : ch->as_array()) c.push_back(x.as_int());
    o.chunks(c);
  }
  if (const JsonValue* l = f.find("compression_level"); l && l->is_int()) o.compression_level(static_cast<int>(l->as_int()));
  if (const JsonValue* s = f.find("shuffle"); s && s->is_bool()) o.shuffle(s->as_bool());
  if (const JsonValue* d = f.find("durable"); d && d->is_bool()) o.durable(d->as_bool());
  if (const JsonValue* d = f.find("device"); d && d->is_string()) o.device(parse_device(d->as_string(), "H5Options"));
  return o;
}

PersistentTensorDict PersistentTensorDict::from_h5(const std::string& filename, const H5Options& options) {
  return PersistentTensorDict(remote::make_remote(open_tree(filename, options)));
}

PersistentTensorDict PersistentTensorDict::from_h5(const std::string& filename, const std::string& mode) {
  return from_h5(filename, H5Options().mode(mode));
}

PersistentTensorDict::PersistentTensorDict(const std::string& filename, const BatchSize& batch_size,
                                           const std::string& mode)
    : PersistentTensorDict(remote::make_remote(open_tree(filename, H5Options().mode(mode).batch_size(batch_size)))) {}

PersistentTensorDict::PersistentTensorDict(const TensorDict& td) : TensorDict(td) { node_of(td); }

PersistentTensorDict PersistentTensorDict::from_dict(const TensorDict& td, const std::string& filename,
                                                     const H5Options& options) {
  if (!td.defined()) throw ValueError("PersistentTensorDict.from_dict: the TensorDict is undefined");
  // a leaf HDF5 cannot hold is refused before the file is made: a refused write creates nothing
  for (const NestedKey& key : td.keys(KeysOptions().include_nested(true).leaves_only(true))) {
    std::optional<EntryMeta> m = td.meta(key);
    if (m && m->kind == EntryMeta::Kind::Tensor && !backends::h5_can_store(m->dtype))
      throw TypeError("PersistentTensorDict.from_dict('" + filename + "'): key " + key.repr() + ": dtype " +
                      c10::toString(m->dtype) +
                      " cannot be stored in HDF5 (numpy has no such dtype; upstream cannot write it either); "
                      "nothing was written");
  }
  H5Options o = options;
  if (o.mode() == "r") o.mode("w");
  o.batch_size(td.batch_size());
  std::error_code ec;
  const bool existed = std::filesystem::exists(filename, ec);
  auto tree = open_tree(filename, o);
  try {
    remote::upload_all(*tree, {}, td);
  } catch (...) {
    tree.reset();
    if (!existed) std::filesystem::remove(filename, ec);  // a file this call made is not left half-written
    throw;
  }
  return PersistentTensorDict(remote::make_remote(tree));
}

PersistentTensorDict to_h5(const TensorDict& td, const std::string& filename, const H5Options& options) {
  return PersistentTensorDict::from_dict(td, filename, options);
}

const std::string& PersistentTensorDict::filename() const {
  const JsonValue& f = node_of(*this).tree()->client()->spec_fields();
  const JsonValue* p = f.find("path");
  static const std::string kEmpty;
  return p && p->is_string() ? p->as_string() : kEmpty;
}

std::string PersistentTensorDict::mode() const {
  return str_field(node_of(*this).tree()->client()->spec_fields(), "mode");
}

std::string PersistentTensorDict::group() const {
  std::string g = str_field(node_of(*this).tree()->client()->spec_fields(), "group", "/");
  for (const auto& part : node_of(*this).path()) g += (g.empty() || g.back() != '/' ? "/" : "") + part;
  return g;
}

PersistentTensorDict::StoreStats PersistentTensorDict::store_stats() const {
  auto s = node_of(*this).tree()->client()->batch_stats();
  return StoreStats{s.calls, s.batches, s.largest, s.lane_calls};
}

void PersistentTensorDict::close() const { node_of(*this).tree()->client()->close(); }

void PersistentTensorDict::flush() const {
  node_of(*this).tree()->client()->run([](backends::LeafStore& s) { s.flush(); });
}

namespace detail {

//! the "h5" storage driver: another process reopens a file by its spec ({"path", "group"}); from_schema(...,
//! "h5", H5Options) creates one (its fields name the file "filename"; a spec's "path" does as well)
void register_h5_storage() {
  // the file a spec or H5Options' fields name
  auto file_of = [](const StorageSpec& spec) {
    const std::string path = str_field(spec.json(), "path");
    return path.empty() ? spec.str("filename") : path;
  };
  StorageDriver driver;
  driver.open = [file_of](const StorageSpec& spec, const OpenOptions& open) {
    H5Options o;
    o.mode(open.writable() ? "r+" : "r");
    auto tree = open_tree(file_of(spec), o, group_path(str_field(spec.json(), "group", "/")));
    return TensorDict(remote::make_remote(tree));
  };
  driver.exists = [file_of](const StorageSpec& spec) {
    std::error_code ec;
    return std::filesystem::is_regular_file(file_of(spec), ec);
  };
  driver.create = [file_of](const StorageSpec& spec, const OpenOptions& open) {
    const Schema& schema = open.schema();
    const BatchSize& batch = open.batch_size();
    H5Options o = H5Options::from_fields(spec.json());
    o.filename(file_of(spec));
    if (o.mode() == "r") o.mode("w");
    o.batch_size(batch);
    auto tree = open_tree(o.filename(), o);
    // datasets created without data: HDF5's fill value (0) reads back as zeros, nothing is written
    tree->client()->run([&](backends::LeafStore& s) {
      for (const auto& kv : schema) {
        BatchSize shape = batch;
        shape.insert(shape.end(), kv.second.first.begin(), kv.second.first.end());
        s.create(kv.first.parts(), kv.second.second, shape, at::Tensor(), tree->create_options);
      }
      // the superblock and the file's (sparse) length on disk now: a full disk or the file-size limit fails
      // here, with nothing written, instead of at a later write
      s.flush();
    });
    tree->reload();
    return TensorDict(remote::make_remote(tree));
  };
  register_storage_driver("h5", std::move(driver));
}

}  // namespace detail

}  // namespace tensordict
