// Storage specs and the driver registry (open / create / open_or_create); the engine's own drivers: memmap, shared and stack (spec_stack.cpp).
#include "tensordict/storage_spec.hpp"

#include "tensordict/node.hpp"
#include "spec_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/shared_storage.hpp"
#include "tensordict/memmap_storage.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

namespace tensordict {

namespace {

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
  std::map<std::string, StorageDriver> drivers;
  Registry() {
    drivers["memmap"] = StorageDriver{
        [](const StorageSpec& s, const OpenOptions& o) {
          return TensorDict::load_memmap(s.str("path"), LoadOptions().writable(o.writable()));
        },
        [](const StorageSpec& s, const OpenOptions& o) {
          return TensorDict::from_schema(o.schema(), o.batch_size(), "memmap", MemmapOptions().prefix(s.str("path")));
        },
        [](const StorageSpec& s) {
          std::error_code ec;
          return std::filesystem::exists(std::filesystem::path(s.str("path")) / "meta.json", ec);
        }};
    drivers["shared"] = StorageDriver{
        [](const StorageSpec& s, const OpenOptions&) {
          return tensordict::from_share_handle(from_hex(s.str("handle"), "storage spec 'shared': handle"));
        },
        // a new segment: its handle (StorageSpec::of) is what other processes open
        [](const StorageSpec&, const OpenOptions& o) {
          return TensorDict::from_schema(o.schema(), o.batch_size(), "shared");
        },
        [](const StorageSpec& s) { return s.json().find("handle") != nullptr; }};
    drivers["stack"] = detail::stack_storage_driver();  // a lazy stack's members (spec_stack.cpp)
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
  detail::check_spec_fields(driver_, json_);  // "index", a stack's members (spec_index.cpp)
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
  if (td.node()) {  // the node's own: memmap / shared (views with their index), stores, lazy stacks
    std::string s = td.node()->storage_spec();
    if (!s.empty()) return StorageSpec::parse(s);
  }
  if (td.is_memmap()) {
    std::string prefix = memmap_prefix(td);
    if (prefix.empty()) {
      throw ValueError("another process cannot reach " + what +
                       ": it is a memmap TensorDict without a directory (memmap_() with a prefix, or load_memmap)");
    }
    return StorageSpec("memmap", JsonValue::object({{"path", JsonValue(prefix)}}));
  }
  if (td.is_shared()) return StorageSpec("shared", JsonValue::object({{"handle", JsonValue(detail::to_hex(share_handle(td)))}}));
  throw ValueError("another process cannot reach " + what +
                   ": it must be a memmap TensorDict saved to a directory or a shared one (share_memory_()); "
                   "it is an in-memory " + (td.node() ? td.node()->type_name() : std::string("TensorDict")));
}

void register_storage_driver(const std::string& driver, StorageDriver functions) {
  if (driver.empty() || !functions.open) throw ValueError("register_storage_driver: empty driver name or opener");
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().drivers[driver] = std::move(functions);
}

std::vector<std::string> storage_drivers() {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::vector<std::string> out;
  for (const auto& kv : registry().drivers) out.push_back(kv.first);
  return out;
}

TensorDict open_storage(const StorageSpec& spec, const OpenOptions& options) {
  std::optional<StorageDriver> driver;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto it = registry().drivers.find(spec.driver());
    if (it != registry().drivers.end()) driver = it->second;
  }
  if (!driver) {
    std::string known;
    for (const auto& d : storage_drivers()) known += (known.empty() ? "" : ", ") + d;
    throw ValueError("storage spec: unknown driver '" + spec.driver() + "' (registered: " + known + ")");
  }
  OpenMode mode = options.mode();
  if (mode == OpenMode::open_or_create) {
    if (!driver->exists) {
      throw ValueError("storage spec '" + spec.driver() + "': open_or_create is not supported (open or create)");
    }
    mode = driver->exists(spec) ? OpenMode::open : OpenMode::create;
  }
  if (mode == OpenMode::open) return spec.apply_index(driver->open(spec, options));  // the view the spec carries
  if (!driver->create) throw ValueError("storage spec '" + spec.driver() + "': this driver cannot create a storage");
  for (auto b : options.batch_size())
    if (b < 0) throw BatchSizeError("from_schema: negative batch size " + detail::shape_str(options.batch_size()));
  return driver->create(spec, options);
}

TensorDict TensorDict::from_schema(const Schema& schema, const BatchSize& batch_size, const std::string& storage,
                                   const StorageOptions& options) {
  if (storage.empty()) throw ValueError("from_schema: empty storage name (registered: memmap, shared, h5, redis, ...)");
  return open_storage(StorageSpec(storage, options.fields()),
                      OpenOptions().mode(OpenMode::create).schema(schema).batch_size(batch_size));
}

}  // namespace tensordict
