// The lazy stack's storage spec, {"driver": "stack", "dim": d, "members": [spec, ...]}, and the "stack" driver
// that opens it: every member by its own spec (its view included), lazy-stacked again along "dim".
#include "lazy_stack_node.hpp"
#include "spec_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/device.hpp"

namespace tensordict {

std::string LazyStackNode::storage_spec() const {
  if (members.empty()) return "";  // nothing to reopen: an empty stack keeps only a batch size
  JsonValue::Array specs;
  specs.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    specs.push_back(StorageSpec::of(members[i], "member " + std::to_string(i) + " of the lazy stack").json());
  }
  JsonValue::Object o{{"dim", JsonValue(stack_dim)}, {"members", JsonValue::array(std::move(specs))}};
  if (device) o.emplace_back("device", JsonValue(device->str()));
  return StorageSpec("stack", JsonValue::object(std::move(o))).dump();
}

namespace detail {

namespace {

//! the member specs of a validated "stack" spec
std::vector<StorageSpec> member_specs(const JsonValue& json) {
  std::vector<StorageSpec> out;
  for (const auto& m : json.find("members")->as_array()) {
    const JsonValue* d = m.find("driver");
    out.emplace_back(d->as_string(), m);
  }
  return out;
}

}  // namespace

void check_stack_fields(const JsonValue& json) {
  const JsonValue* dim = json.find("dim");
  if (!dim || !dim->is_int()) throw ValueError("storage spec 'stack': the int field \"dim\" is required");
  const JsonValue* members = json.find("members");
  if (!members || !members->is_array() || members->as_array().empty()) {
    throw ValueError("storage spec 'stack': \"members\" must be a non-empty list of member specs");
  }
  size_t i = 0;
  for (const auto& m : members->as_array()) {
    const JsonValue* d = m.is_object() ? m.find("driver") : nullptr;
    if (!d || !d->is_string() || d->as_string().empty()) {
      throw ValueError("storage spec 'stack': member " + std::to_string(i) +
                       " is not a spec (a JSON object with a string \"driver\")");
    }
    try {
      StorageSpec(d->as_string(), m);  // validates the member (its index, a nested stack)
    } catch (const ValueError& e) {
      throw ValueError("storage spec 'stack': member " + std::to_string(i) + ": " + e.message());
    }
    ++i;
  }
}

StorageDriver stack_storage_driver() {
  StorageDriver d;
  d.open = [](const StorageSpec& spec, const OpenOptions& options) {
    std::optional<at::Device> device;
    if (const JsonValue* d = spec.json().find("device"); d && d->is_string()) {
      device = parse_device(d->as_string(), "storage spec 'stack'");
    }
    std::vector<TensorDict> members;
    for (const StorageSpec& m : member_specs(spec.json())) {
      TensorDict td = open_storage(m, options);
      // a storage may reopen with a device its writer left unset (load_memmap says "cpu"): a dense member
      // whose leaves are where the stack was takes the stack's device, so that the members agree again
      TensorDictImpl* dense = td.node() ? td.node()->dense_node() : nullptr;
      if (dense && td.device() != device && (!device || device->is_cpu()) && (!td.device() || td.device()->is_cpu())) {
        dense->device = device;
      }
      members.push_back(std::move(td));
    }
    return make_lazy(std::move(members), spec.json().find("dim")->as_int());
  };
  return d;
}

}  // namespace detail
}  // namespace tensordict
