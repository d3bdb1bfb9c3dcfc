// Storage specs and the per-driver opener registry; the engine's own drivers: memmap and shared.
#include "tensordict/storage_spec.hpp"

#include "tensordict/node.hpp"
#include "tensor_dict_internal.hpp"

#include <algorithm>
#include <map>
#include <mutex>

namespace tensordict {

namespace {

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string from_hex(const std::string& hex, const std::string& what) {
  auto val = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw ValueError(what + ": '" + std::string(1, c) + "' is not a hex digit");
  };
  if (hex.size() % 2) throw ValueError(what + ": odd number of hex digits");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(val(hex[2 * i]) * 16 + val(hex[2 * i + 1]));
  return out;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, StorageOpener> openers;
  Registry() {
    openers["memmap"] = [](const StorageSpec& s, const OpenOptions& o) {
      return TensorDict::load_memmap(s.str("path"), LoadOptions().writable(o.writable()));
    };
    openers["shared"] = [](const StorageSpec& s, const OpenOptions&) {
      return TensorDict::from_share_handle(from_hex(s.str("handle"), "storage spec 'shared': handle"));
    };
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

StorageSpec::StorageSpec(std::string driver, JsonValue fields) : driver_(std::move(driver)), json_(std::move(fields)) {
  if (!json_.is_object()) throw ValueError("storage spec: the fields must be a JSON object");
  if (driver_.empty()) throw ValueError("storage spec: empty driver");
  auto& obj = json_.as_object();
  bool found = false;
  for (auto& kv : obj) {
    if (kv.first == "driver") {
      kv.second = JsonValue(driver_);
      found = true;
    }
  }
  if (!found) obj.insert(obj.begin(), {"driver", JsonValue(driver_)});
}

StorageSpec StorageSpec::parse(const std::string& text) {
  JsonValue v;
  try {
    v = JsonValue::parse(text);
  } catch (const Error& e) {
    throw ValueError(std::string("storage spec: not valid JSON (") + e.what() + ")");
  }
  if (!v.is_object()) throw ValueError("storage spec: expected a JSON object, got " + std::string(JsonValue::kind_name(v.kind())));
  const JsonValue* d = v.find("driver");
  if (!d || !d->is_string() || d->as_string().empty()) {
    throw ValueError("storage spec: a non-empty string \"driver\" is required (e.g. {\"driver\": \"memmap\", "
                     "\"path\": ...})");
  }
  std::string driver = d->as_string();
  return StorageSpec(std::move(driver), std::move(v));
}

const std::string& StorageSpec::str(const std::string& field) const {
  const JsonValue* v = json_.find(field);
  if (!v || !v->is_string()) {
    throw ValueError("storage spec '" + driver_ + "': the string field \"" + field + "\" is " +
                     (v ? std::string("a ") + JsonValue::kind_name(v->kind()) : std::string("missing")));
  }
  return v->as_string();
}

StorageSpec StorageSpec::of(const TensorDict& td, const std::string& what) {
  if (!td.defined()) throw ValueError(what + " is an undefined TensorDict");
  if (!td.is_dense() && td.node()) {
    std::string s = td.node()->storage_spec();
    if (!s.empty()) return StorageSpec::parse(s);
  }
  if (td.is_memmap()) {
    std::string prefix = td.memmap_prefix();
    if (prefix.empty()) {
      throw ValueError("another process cannot reach " + what +
                       ": it is a memmap TensorDict without a directory (memmap_() with a prefix, or load_memmap)");
    }
    return StorageSpec("memmap", JsonValue::object({{"path", JsonValue(prefix)}}));
  }
  if (td.is_shared()) return StorageSpec("shared", JsonValue::object({{"handle", JsonValue(to_hex(td.share_handle()))}}));
  throw ValueError("another process cannot reach " + what +
                   ": it must be a memmap TensorDict saved to a directory or a shared one (share_memory_()); "
                   "it is an in-memory " + (td.node() ? td.node()->type_name() : std::string("TensorDict")));
}

void register_storage_driver(const std::string& driver, StorageOpener opener) {
  if (driver.empty() || !opener) throw ValueError("register_storage_driver: empty driver name or opener");
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().openers[driver] = std::move(opener);
}

std::vector<std::string> storage_drivers() {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::vector<std::string> out;
  for (const auto& kv : registry().openers) out.push_back(kv.first);
  return out;
}

TensorDict open_storage(const StorageSpec& spec, const OpenOptions& options) {
  StorageOpener opener;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto it = registry().openers.find(spec.driver());
    if (it != registry().openers.end()) opener = it->second;
  }
  if (!opener) {
    std::string known;
    for (const auto& d : storage_drivers()) known += (known.empty() ? "" : ", ") + d;
    throw ValueError("storage spec: unknown driver '" + spec.driver() + "' (registered: " + known + ")");
  }
  return opener(spec, options);
}

namespace {
struct SchemaRegistry {
  std::mutex mu;
  std::map<std::string, SchemaCreator> creators;
};
SchemaRegistry& schema_registry() {
  static SchemaRegistry r;
  return r;
}
}  // namespace

void register_schema_storage(const std::string& storage, SchemaCreator creator) {
  if (storage.empty() || !creator) throw ValueError("register_schema_storage: empty storage name or creator");
  std::lock_guard<std::mutex> lock(schema_registry().mu);
  schema_registry().creators[storage] = std::move(creator);
}

std::vector<std::string> schema_storages() {
  std::lock_guard<std::mutex> lock(schema_registry().mu);
  std::vector<std::string> out;
  for (const auto& kv : schema_registry().creators) out.push_back(kv.first);
  return out;
}

TensorDict TensorDict::from_schema(const Schema& schema, const BatchSize& batch_size, const std::string& storage,
                                   const StorageOptions& options) {
  SchemaCreator creator;
  {
    std::lock_guard<std::mutex> lock(schema_registry().mu);
    auto it = schema_registry().creators.find(storage);
    if (it != schema_registry().creators.end()) creator = it->second;
  }
  if (!creator) {
    std::string known = "memmap, shared";
    for (const auto& d : schema_storages()) known += ", " + d;
    throw ValueError("from_schema: unknown storage '" + storage + "' (known: " + known +
                     "; h5 and redis are registered by the api library)");
  }
  for (auto b : batch_size)
    if (b < 0) throw BatchSizeError("from_schema: negative batch size " + detail::shape_str(batch_size));
  return creator(schema, batch_size, options.fields());
}

}  // namespace tensordict
