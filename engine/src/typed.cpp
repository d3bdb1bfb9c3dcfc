// The runtime half of the typed wrappers (tensordict/typed.hpp): construction checks, field access under
// the cast rules, TensorClass persistence and repr.
#include "tensordict/typed.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"

namespace tensordict {
namespace typed_detail {

std::string qualified_class_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && d ? d.get() : mangled;
  const std::string anon = "(anonymous namespace)::";
  for (size_t at = name.find(anon); at != std::string::npos; at = name.find(anon)) name.erase(at, anon.size());
  return name;
}

namespace {

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out;
}

const FieldSpec& field_of(const TypedSchema& s, const std::string& field) {
  const FieldSpec* f = s.find(field);
  if (!f) throw AttributeError(s.name + " has no field '" + field + "'");
  return *f;
}

[[noreturn]] void not_set(const TypedSchema& s, const std::string& field) {
  throw AttributeError(s.name + " has field '" + field + "' declared but not set");
}

std::string json_kind(const JsonValue& v) {
  if (v.is_null()) return "null";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_double()) return "float";
  if (v.is_string()) return "string";
  if (v.is_array()) return "list";
  if (v.is_object()) return "dict";
  return "bytes";
}

[[noreturn]] void wrong_value(const TypedSchema& s, const std::string& field, const char* want, const std::string& got) {
  throw TypeError("field '" + field + "' of " + s.name + " expects " + want + ", got " + got);
}

void check_frozen(const TypedSchema& s, const std::string& field) {
  // upstream: dataclasses.FrozenInstanceError (an AttributeError) "cannot assign to field 'x'"
  if (s.tensorclass && s.options.frozen) throw AttributeError("cannot assign to field '" + field + "' of a frozen " + s.name);
}

//! the value of a one-element (or constant) tensor as JSON of the field's scalar type
JsonValue scalar_of_tensor(const TypedSchema& s, const FieldSpec& f, const at::Tensor& t) {
  if (t.numel() == 0) wrong_value(s, f.name, f.cpp_type.c_str(), "an empty tensor");
  at::Tensor flat = t.reshape({-1});
  if (t.numel() > 1 && !at::equal(flat, flat[0].expand_as(flat))) {
    throw RuntimeError("field '" + f.name + "' of " + s.name + ": a Tensor with " + std::to_string(t.numel()) +
                       " elements cannot be converted to Scalar");
  }
  at::Tensor v = flat[0];
  if (f.scalar_type == at::kBool) return JsonValue(v.item<bool>());
  if (f.scalar_type == at::kDouble) return JsonValue(v.item<double>());
  if (v.is_floating_point()) {
    double d = v.item<double>();
    if (d != static_cast<double>(static_cast<int64_t>(d))) {
      wrong_value(s, f.name, f.cpp_type.c_str(), "the non-integral value " + std::to_string(d));
    }
  }
  return JsonValue(static_cast<long long>(v.item<int64_t>()));
}

//! a JSON number / bool of a scalar field as a tensor of the batch size
at::Tensor tensor_of_scalar(const TypedSchema& s, const FieldSpec& f, const JsonValue& v, const BatchSize& batch) {
  if (!(v.is_number() || v.is_bool())) wrong_value(s, f.name, f.cpp_type.c_str(), json_kind(v));
  at::TensorOptions o = at::TensorOptions().dtype(f.scalar_type);
  if (f.scalar_type == at::kBool) {
    bool b = v.is_bool() ? v.as_bool() : v.as_double() != 0;
    return at::full(batch, b, o);
  }
  if (f.scalar_type == at::kDouble) return at::full(batch, v.is_bool() ? double(v.as_bool()) : v.as_double(), o);
  if (v.is_double() && v.as_double() != static_cast<double>(static_cast<int64_t>(v.as_double()))) {
    wrong_value(s, f.name, f.cpp_type.c_str(), "the non-integral value " + std::to_string(v.as_double()));
  }
  return at::full(batch, v.is_bool() ? int64_t(v.as_bool()) : static_cast<int64_t>(v.as_double()), o);
}

}  // namespace

// ---------------------------------------------------------------------------------------- value traits
std::string ValueTraits<std::string>::from_json(const JsonValue& v, const TypedSchema& s, const std::string& field) {
  if (!v.is_string()) wrong_value(s, field, "std::string", json_kind(v));
  return v.as_string();
}
int64_t ValueTraits<int64_t>::from_json(const JsonValue& v, const TypedSchema& s, const std::string& field) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_double() && v.as_double() == static_cast<double>(static_cast<int64_t>(v.as_double()))) {
    return static_cast<int64_t>(v.as_double());
  }
  wrong_value(s, field, "int64_t", json_kind(v));
}
double ValueTraits<double>::from_json(const JsonValue& v, const TypedSchema& s, const std::string& field) {
  if (v.is_number()) return v.as_double();
  wrong_value(s, field, "double", json_kind(v));
}
bool ValueTraits<bool>::from_json(const JsonValue& v, const TypedSchema& s, const std::string& field) {
  if (v.is_bool()) return v.as_bool();
  if (v.is_int() && (v.as_int() == 0 || v.as_int() == 1)) return v.as_int() == 1;
  wrong_value(s, field, "bool", json_kind(v));
}

FieldSpec tensor_field(const char* name, bool required) {
  FieldSpec f;
  f.name = name;
  f.kind = FieldKind::Tensor;
  f.required = required;
  f.cpp_type = "at::Tensor";
  return f;
}

FieldSpec subtd_field(const char* name) {
  FieldSpec f;
  f.name = name;
  f.kind = FieldKind::TensorDict;
  f.cpp_type = "TensorDict";
  return f;
}

// ---------------------------------------------------------------------------------------- construction
TensorDict build_fields(const TypedSchema& s, const Dict& fields, const BatchSize& batch_size,
                        std::optional<at::Device> device) {
  std::vector<std::string> given, unexpected, missing;
  for (const auto& kv : fields) {
    if (kv.first.size() != 1) throw TypeError(s.name + "() takes field names, not the nested key " + kv.first.repr());
    const std::string& k = kv.first[0];
    given.push_back(k);
    if (!s.find(k)) unexpected.push_back(k);
  }
  for (const auto& f : s.fields) {
    if (f.required && !f.default_value && std::find(given.begin(), given.end(), f.name) == given.end()) {
      missing.push_back(f.name);
    }
  }
  if (!missing.empty()) throw TypeError(s.name + "() missing required field(s): " + quoted_list(missing));
  if (!unexpected.empty()) throw TypeError(s.name + "() got unexpected field(s): " + quoted_list(unexpected));
  TensorDict td(batch_size, device);
  TypedSchema open = s;  // construction writes fields even when the class is frozen (it is locked after)
  open.options.frozen = false;
  for (const auto& kv : fields) set_field(open, td, nullptr, kv.first[0].c_str(), kv.second);
  for (const auto& f : s.fields) {
    if (f.default_value && std::find(given.begin(), given.end(), f.name) == given.end()) {
      set_value(open, td, nullptr, f.name.c_str(), *f.default_value);
    }
  }
  return td;
}

void check_required(const TypedSchema& s, const TensorDict& td) {
  std::vector<std::string> missing;
  for (const auto& f : s.fields)
    if (f.required && !f.default_value && !td.contains(f.name)) missing.push_back(f.name);
  if (!missing.empty()) {
    throw TypeError(s.name + ".from_tensordict() missing required field(s): " + quoted_list(missing) +
                    " (use check=false to wrap an empty or partial TensorDict)");
  }
}

void check_tensorclass_keys(const TypedSchema& s, const TensorDict& td, const NonTensorFields& nt) {
  std::vector<std::string> extra;
  for (const auto& k : td.keys())
    if (!s.find(k[0])) extra.push_back(k[0]);
  for (const auto& kv : nt) {
    if (!s.find(kv.first)) extra.push_back(kv.first);
    if (td.contains(kv.first)) {
      throw KeyError("key '" + kv.first + "' is present in both the tensordict and the non_tensordict of " + s.name);
    }
  }
  if (!extra.empty()) {
    throw ValueError("Keys from the tensordict (" + quoted_list(extra) + ") must correspond to the class attributes (" +
                     quoted_list(s.field_names()) + ") of " + s.name);
  }
}

// ---------------------------------------------------------------------------------------- field access
at::Tensor get_tensor(const TypedSchema& s, const TensorDict& td, const char* field) {
  // fast path: a lookup in the dense level, no key object, no entry copy
  if (const TensorDictImpl* impl = detail::tree::level_of(td, detail::tree::Descend::DenseOnly)) {
    const size_t n = std::strlen(field);
    for (const auto& kv : impl->entries) {
      if (kv.first.size() == n && std::memcmp(kv.first.data(), field, n) == 0 && kv.second.is_tensor()) {
        return kv.second.tensor();
      }
    }
  }
  std::optional<Entry> e = td.get_entry_opt(field);
  if (!e) {
    if (s.tensorclass) return at::Tensor();  // upstream: None
    not_set(s, field);
  }
  if (!e->is_tensor()) {
    wrong_value(s, field, "a Tensor", std::string("a ") + Entry::kind_name(e->kind()));
  }
  return e->tensor();
}

TensorDict get_subtd(const TypedSchema& s, const TensorDict& td, const char* field) {
  std::optional<Entry> e = td.get_entry_opt(field);
  if (!e) {
    if (s.tensorclass) return TensorDict::undefined();
    not_set(s, field);
  }
  if (!e->is_tensordict()) {
    wrong_value(s, field, "a TensorDict", std::string("a ") + Entry::kind_name(e->kind()));
  }
  return e->tensordict();
}

JsonValue get_value(const TypedSchema& s, const TensorDict& td, const NonTensorFields* nt, const char* field) {
  const FieldSpec& f = field_of(s, field);
  std::optional<Entry> e = td.get_entry_opt(field);
  if (e) {
    if (e->is_tensor()) {
      if (f.kind != FieldKind::Scalar) wrong_value(s, field, f.cpp_type.c_str(), "a Tensor");
      return scalar_of_tensor(s, f, e->tensor());
    }
    if (e->is_non_tensor()) {
      JsonValue v = e->non_tensor_value();
      if (e->is_non_tensor_stack() && v.is_array() && !v.as_array().empty()) {
        // a stack of one value (rows of the same instance): that value
        const auto& a = v.as_array();
        bool same = std::all_of(a.begin(), a.end(), [&](const JsonValue& x) { return x == a[0]; });
        if (same && !(f.kind == FieldKind::NonTensor && f.cpp_type == "JsonValue")) return a[0];
      }
      return v;
    }
    wrong_value(s, field, f.cpp_type.c_str(), std::string("a ") + Entry::kind_name(e->kind()));
  }
  if (nt) {
    auto it = nt->find(field);
    if (it != nt->end()) return it->second;
  }
  if (f.default_value) return *f.default_value;
  if (f.cpp_type == "JsonValue") return JsonValue();  // upstream: None
  not_set(s, field);
}

void set_field(const TypedSchema& s, TensorDict& td, NonTensorFields* nt, const char* field, const Entry& value) {
  const FieldSpec& f = field_of(s, field);
  check_frozen(s, field);
  switch (f.kind) {
    case FieldKind::Tensor:
      if (!value.is_tensor()) wrong_value(s, field, "a Tensor", std::string("a ") + Entry::kind_name(value.kind()));
      td.set(field, value);
      return;
    case FieldKind::TensorDict:
    case FieldKind::Nested:
      if (!value.is_tensordict() && !value.is_dict()) {
        wrong_value(s, field, "a TensorDict", std::string("a ") + Entry::kind_name(value.kind()));
      }
      if (f.kind == FieldKind::Nested && value.is_tensordict()) {
        const std::shared_ptr<const TypedSchema> theirs = value.tensordict().typed_schema();  // a copy: tensordict() is a temporary
        if (theirs && !theirs->is_a(*f.nested) && !theirs->same_fields(*f.nested)) {
          wrong_value(s, field, f.cpp_type.c_str(), "a " + theirs->name);
        }
        td.set(field, Entry(as_class(value.tensordict(), f.nested)));
        return;
      }
      td.set(field, value);
      return;
    case FieldKind::Scalar:
      if (value.is_tensor()) {
        const at::Tensor& t = value.tensor();
        if (s.options.nocast) {
          set_value(s, td, nt, field, scalar_of_tensor(s, f, t));
        } else if (s.options.autocast) {
          td.set(field, t.to(f.scalar_type));
        } else {
          td.set(field, value);
        }
        return;
      }
      if (value.is_non_tensor_data()) {
        set_value(s, td, nt, field, value.non_tensor_value());
        return;
      }
      wrong_value(s, field, f.cpp_type.c_str(), std::string("a ") + Entry::kind_name(value.kind()));
    case FieldKind::NonTensor:
      if (value.is_tensor()) wrong_value(s, field, f.cpp_type.c_str(), "a Tensor");
      if (value.is_non_tensor_data()) {
        set_value(s, td, nt, field, value.non_tensor_value());
        return;
      }
      if (value.is_non_tensor_stack()) {
        td.set(field, value);
        return;
      }
      wrong_value(s, field, f.cpp_type.c_str(), std::string("a ") + Entry::kind_name(value.kind()));
  }
}

void set_value(const TypedSchema& s, TensorDict& td, NonTensorFields* nt, const char* field, const JsonValue& v) {
  const FieldSpec& f = field_of(s, field);
  check_frozen(s, field);
  if (f.kind == FieldKind::Scalar) {
    if (!(v.is_number() || v.is_bool())) wrong_value(s, field, f.cpp_type.c_str(), json_kind(v));
    if (nt) {
      (*nt)[field] = v;
    } else if (s.options.nocast) {
      td.set_non_tensor(field, v);  // kept as the value (upstream nocast)
    } else {
      td.set(field, tensor_of_scalar(s, f, v, td.batch_size()));  // wrapped as a tensor (default, autocast)
    }
    return;
  }
  if (f.kind != FieldKind::NonTensor) wrong_value(s, field, f.cpp_type.c_str(), json_kind(v));
  if (f.cpp_type == "std::string" && !v.is_string()) wrong_value(s, field, "std::string", json_kind(v));
  if (nt) {
    (*nt)[field] = v;
  } else {
    td.set_non_tensor(field, v);
  }
}

TensorDict as_class(const TensorDict& td, const std::shared_ptr<const TypedSchema>& s) {
  if (!td.defined()) return td;
  if (td.typed_schema() && td.typed_schema()->is_a(*s)) return td;
  return td.with_schema(s);
}

void check_same_class(const TypedSchema& mine, const TypedSchema* theirs, const char* what) {
  if (theirs && (theirs->is_a(mine) || mine.same_fields(*theirs))) return;
  throw ValueError(std::string(what) + ": the value must be a " + mine.name +
                   " or have the same fields, got " + (theirs ? "a " + theirs->name : std::string("a TensorDict")) +
                   (theirs ? " with fields (" + quoted_list(theirs->field_names()) + ")" : std::string()));
}

// ---------------------------------------------------------------------------------------- persistence
namespace {
//! marks the dense nodes of a TensorClass (and of its nested TensorClass fields) with their class records
void mark_records(const TensorDict& td, const TypedSchema& s, const NonTensorFields* nt) {
  std::shared_ptr<TensorDictImpl> impl = detail::impl_of(td);
  impl->type_repr = "<class '" + s.class_path + "'>";
  if (nt && !nt->empty()) {
    JsonValue::Object o;
    for (const auto& kv : *nt) o.emplace_back(kv.first, kv.second);
    impl->class_fields = JsonValue(std::move(o));
  }
  for (const auto& f : s.fields) {
    if (f.kind != FieldKind::Nested || !f.nested || !f.nested->tensorclass) continue;
    std::optional<Entry> e = td.get_entry_opt(f.name);
    if (e && e->is_tensordict()) mark_records(e->tensordict(), *f.nested, nullptr);
  }
}
}  // namespace

void tensorclass_memmap_(TensorDict& td, const TypedSchema& s, const NonTensorFields* nt, const std::string& prefix,
                         const MemmapOptions& options) {
  if (!detail::tree::dense_level(td)) {  // no dense level (its own or a store's view) to record the class in
    throw NotImplementedError("memmap_ of a " + s.name + " over a " + td.node()->type_name() +
                              ": copy it to memory first (clone of its to_tensordict())");
  }
  mark_records(td, s, nt);
  td.memmap_(prefix, options);
}

TensorDict tensorclass_load_memmap(const TypedSchema& s, const std::string& prefix, const LoadOptions& options,
                                   JsonValue* class_fields) {
  TensorDict td = TensorDict::load_memmap(prefix, options);
  std::shared_ptr<TensorDictImpl> impl = detail::impl_of(td);
  if (impl->type_repr.empty()) {
    throw TypeError("'" + prefix + "' holds a TensorDict, not a " + s.name + " (no tensorclass record in meta.json)");
  }
  const std::string want = "<class '" + s.class_path + "'>";
  if (impl->type_repr != want && td.type_name() != s.name) {
    throw TypeError("'" + prefix + "' holds a " + impl->type_repr + ", not a " + s.name + " (" + want + ")");
  }
  if (class_fields) *class_fields = impl->class_fields ? *impl->class_fields : JsonValue::object();
  return td;
}

std::string typed_repr(const TypedSchema& s, const TensorDict& td, const NonTensorFields* nt) {
  std::string r = td.defined() ? repr(td.with_schema(nullptr)) : std::string("TensorDict()");
  const std::string dense = "TensorDict(";
  if (r.compare(0, dense.size(), dense) == 0) r = s.name + "(" + r.substr(dense.size());
  if (nt && !nt->empty()) {
    std::ostringstream os;
    os << r << " + non_tensordict{";
    bool first = true;
    for (const auto& kv : *nt) {
      os << (first ? "" : ", ") << kv.first << ": " << kv.second.dump();
      first = false;
    }
    os << "}";
    r = os.str();
  }
  return r;
}

}  // namespace typed_detail

// ---------------------------------------------------------------------------------------- TensorClassBase
Entry TensorClassBase::get(const std::string& field) const {
  std::optional<Entry> e = td_.get_entry_opt(field);
  if (e) return *e;
  if (nt_) {
    auto it = nt_->find(field);
    if (it != nt_->end()) return Entry(it->second);
  }
  throw KeyError("key \"" + field + "\" not found in " + td_.type_name());
}

TensorDict TensorClassBase::to_tensordict() const { return td_.with_schema(nullptr).to_tensordict(); }

const typed_detail::NonTensorFields& TensorClassBase::non_tensordict() const {
  static const typed_detail::NonTensorFields empty;
  return nt_ ? *nt_ : empty;
}

std::string TensorClassBase::repr() const {
  if (!td_.typed_schema()) return tensordict::repr(td_);
  return typed_detail::typed_repr(*td_.typed_schema(), td_, nt_.get());
}

bool TensorClassBase::equal(const TensorClassBase& other) const {
  return td_.with_schema(nullptr).equal(other.td_.with_schema(nullptr)) && non_tensordict() == other.non_tensordict();
}

typed_detail::NonTensorFields* TensorClassBase::nt_for_write() {
  auto copy = std::make_shared<typed_detail::NonTensorFields>(nt_ ? *nt_ : typed_detail::NonTensorFields{});
  typed_detail::NonTensorFields* p = copy.get();
  nt_ = std::move(copy);
  return p;
}

}  // namespace tensordict
