// The schema of a typed wrapper, and the typed node: the form a typed handle takes where a node is needed
// (a lazy stack handing out its typed member). Handles unwrap it at once (TensorDict(node)), so the
// algorithms only ever see the source node.
#include <algorithm>
#include <set>

#include "tensordict/node.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/typed_schema.hpp"

namespace tensordict {

const char* field_kind_name(FieldKind k) {
  switch (k) {
    case FieldKind::Tensor: return "Tensor";
    case FieldKind::TensorDict: return "TensorDict";
    case FieldKind::Nested: return "nested class";
    case FieldKind::Scalar: return "scalar";
    case FieldKind::NonTensor: return "non-tensor";
  }
  return "?";
}

const std::vector<std::string>& reserved_field_names() {
  // upstream checks field names against dir(TensorDictBase); these are the attributes a user is likely to
  // collide with (the public API of TensorDictBase in v0.14)
  static const std::vector<std::string> names = {
      "all", "any", "apply", "apply_", "batch_dims", "batch_size", "bytes", "cat", "chunk", "clear", "clone",
      "contiguous", "copy", "copy_", "cpu", "cuda", "data", "del_", "detach", "device", "dim", "empty",
      "entry_class", "exclude", "expand", "fill_", "filter_empty_", "flatten", "flatten_keys", "from_dict",
      "get", "get_at", "get_non_tensor", "grad", "is_empty", "is_locked", "is_memmap", "is_shared", "items",
      "keys", "load", "load_memmap", "lock_", "map", "masked_fill", "mean", "memmap", "memmap_", "memmap_like",
      "names", "ndim", "ndimension", "numel", "numpy", "permute", "pop", "rename_key_", "repeat", "reshape",
      "save", "select", "set", "set_", "set_at_", "setdefault", "shape", "share_memory_", "size", "split",
      "split_keys", "squeeze", "stack", "sum", "to", "to_dict", "to_tensordict", "transpose", "unbind",
      "unflatten", "unflatten_keys", "unlock_", "unsqueeze", "update", "update_", "update_at_", "values",
      "view", "where", "zero_"};
  return names;
}

const FieldSpec* TypedSchema::find(const std::string& field) const {
  for (const auto& f : fields)
    if (f.name == field) return &f;
  return nullptr;
}

std::vector<std::string> TypedSchema::field_names() const {
  std::vector<std::string> out;
  for (const auto& f : fields) out.push_back(f.name);
  return out;
}

std::vector<std::string> TypedSchema::required_fields() const {
  std::vector<std::string> out;
  for (const auto& f : fields)
    if (f.required) out.push_back(f.name);
  return out;
}

std::vector<std::string> TypedSchema::optional_fields() const {
  std::vector<std::string> out;
  for (const auto& f : fields)
    if (!f.required) out.push_back(f.name);
  return out;
}

bool TypedSchema::is_a(const TypedSchema& other) const {
  for (const TypedSchema* s = this; s; s = s->parent.get())
    if (s == &other || (s->name == other.name && s->class_path == other.class_path)) return true;
  return false;
}

bool TypedSchema::same_fields(const TypedSchema& other) const {
  if (fields.size() != other.fields.size()) return false;
  for (const auto& f : fields) {
    const FieldSpec* o = other.find(f.name);
    if (!o || o->kind != f.kind) return false;
    if (f.kind == FieldKind::Scalar && o->scalar_type != f.scalar_type) return false;
    if (f.kind == FieldKind::Nested && f.nested && o->nested && !f.nested->same_fields(*o->nested)) return false;
  }
  return true;
}

std::shared_ptr<const TypedSchema> TypedSchema::make(std::string name, std::string class_path, bool tensorclass,
                                                     const std::vector<std::string>& options,
                                                     std::vector<FieldSpec> own,
                                                     std::shared_ptr<const TypedSchema> parent) {
  auto s = std::make_shared<TypedSchema>();
  s->name = std::move(name);
  s->class_path = class_path.empty() ? "__main__." + s->name : std::move(class_path);
  s->tensorclass = tensorclass;
  s->parent = parent;
  if (parent) {
    s->options = parent->options;
    s->fields = parent->fields;
  }
  TypedOptions mine;
  for (const auto& o : options) {
    if (o == "frozen") mine.frozen = true;
    else if (o == "shadow") mine.shadow = true;
    else if (o == "autocast") mine.autocast = true;
    else if (o == "nocast") mine.nocast = true;
    else if (o == "tensor_only") mine.tensor_only = true;
    else
      throw ValueError("Unknown option '" + o + "' for " + s->name +
                       ": expected one of 'frozen', 'shadow', 'autocast', 'nocast', 'tensor_only'");
  }
  // options are inherited (a frozen base makes a frozen subclass) and merged with the class's own
  s->options.frozen = s->options.frozen || mine.frozen;
  s->options.shadow = s->options.shadow || mine.shadow;
  s->options.autocast = s->options.autocast || mine.autocast;
  s->options.nocast = s->options.nocast || mine.nocast;
  s->options.tensor_only = s->options.tensor_only || mine.tensor_only;
  const int casts = int(s->options.autocast) + int(s->options.nocast) + int(s->options.tensor_only);
  if (tensorclass && casts > 1) {  // a TypedTensorDict stores them without effect (upstream)
    throw ValueError(s->name + ": the options 'autocast', 'nocast' and 'tensor_only' are mutually exclusive");
  }
  const auto& reserved = reserved_field_names();
  for (auto& f : own) {
    if (f.name.empty() || f.name[0] == '_') continue;  // private names are not fields (upstream skips them)
    if (s->find(f.name)) throw TypeError(s->name + ": field '" + f.name + "' is declared twice");
    if (!s->options.shadow && std::find(reserved.begin(), reserved.end(), f.name) != reserved.end()) {
      throw AttributeError("Field '" + f.name + "' shadows a TensorDictBase attribute of the same name. Use " +
                           (tensorclass ? "TensorClass" : "TypedTensorDict") +
                           "[\"shadow\"] to allow it, or rename the field.");
    }
    if (!tensorclass && (f.kind == FieldKind::Scalar || f.kind == FieldKind::NonTensor)) {
      throw TypeError(s->name + ": field '" + f.name + "' is a " + field_kind_name(f.kind) +
                      " field: a TypedTensorDict holds tensors and sub-TensorDicts only");
    }
    if (s->options.tensor_only && f.kind == FieldKind::NonTensor) {
      throw TypeError(s->name + ": field '" + f.name + "' of type " + f.cpp_type +
                      " is not a tensor, and the class is tensor_only");
    }
    s->fields.push_back(std::move(f));
  }
  return s;
}

// ---------------------------------------------------------------------------------------------- TypedNode
namespace {

//! a typed handle in node form. Every call goes to the source; TensorDict(node) unwraps it.
class TypedNode : public Node {
 public:
  TypedNode(std::shared_ptr<Node> source, std::shared_ptr<const TypedSchema> schema)
      : source_(std::move(source)), schema_(std::move(schema)) {
    batch_size = source_->batch_size;
    device = source_->device;
    locked = source_->locked;
  }
  std::pair<std::shared_ptr<Node>, std::shared_ptr<const TypedSchema>> typed_parts() const override {
    return {source_, schema_};
  }
  std::string type_name() const override { return schema_->name; }
  NodeCaps caps() const override { return source_->caps(); }
  std::vector<std::string> keys() const override { return source_->keys(); }
  std::optional<EntryMeta> meta(const std::string& key) const override { return source_->meta(key); }
  std::vector<std::pair<std::string, EntryMeta>> metas() const override { return source_->metas(); }
  void refresh() override { source_->refresh(); }
  std::optional<Entry> read(const std::string& key) const override { return source_->read(key); }
  std::vector<Entry> read(const std::vector<std::string>& keys, const Index& index) const override {
    return source_->read(keys, index);
  }
  void put(const std::string& key, const Entry& value) override { source_->put(key, value); }
  bool erase(const std::string& key) override { return source_->erase(key); }
  std::shared_ptr<Node> index(const Index& index) const override {
    return std::make_shared<TypedNode>(source_->index(index), schema_);
  }
  std::vector<std::shared_ptr<Node>> child_nodes() const override { return source_->child_nodes(); }
  TensorDict to_dense() const override { return source_->to_dense(); }
  void write(const Index& index, const TensorDict& value) override { source_->write(index, value); }
  TensorDict open_child(const std::string& key) override { return source_->open_child(key); }
  std::shared_ptr<TensorDictImpl> dense_view() const override { return source_->dense_view(); }
  std::string storage_spec() const override { return source_->storage_spec(); }

  const std::shared_ptr<Node>& source() const { return source_; }
  const std::shared_ptr<const TypedSchema>& schema() const { return schema_; }

 private:
  std::shared_ptr<Node> source_;
  std::shared_ptr<const TypedSchema> schema_;
};

}  // namespace

namespace detail {

std::shared_ptr<Node> make_typed_node(std::shared_ptr<Node> source, std::shared_ptr<const TypedSchema> schema) {
  if (!schema || !source) return source;
  return std::make_shared<TypedNode>(std::move(source), std::move(schema));
}

std::pair<std::shared_ptr<Node>, std::shared_ptr<const TypedSchema>> unwrap_typed_node(
    std::shared_ptr<Node> node) {
  std::shared_ptr<const TypedSchema> schema;
  while (node) {
    auto parts = node->typed_parts();
    if (!parts.first) break;
    if (!schema) schema = std::move(parts.second);  // the outermost wrapper's type
    node = std::move(parts.first);
  }
  return {std::move(node), std::move(schema)};
}

}  // namespace detail

}  // namespace tensordict
