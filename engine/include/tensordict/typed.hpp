#pragma once
//! Typed wrappers (upstream §4, seed "compatibility"): TypedTensorDict (IS-A TensorDict) and TensorClass
//! (HAS-A TensorDict), both declared with one field list and both a live, zero-copy wrap of any TensorDict
//! (memory, memmap, shared, HDF5, Redis, lazy stack, another typed wrapper).
//!
//!   struct State : tensordict::TypedTensorDict<State> {
//!     TD_FIELDS(State, TD_TENSOR(x), TD_TENSOR(y), TD_OPTIONAL(z))
//!   };
//!   struct Child : tensordict::TypedTensorDict<Child, State> {   // schema composed by inheritance
//!     TD_OPTIONS("frozen")
//!     TD_FIELDS(Child, TD_TENSOR(w))
//!   };
//!   State s({{"x", x}, {"y", y}}, {4});            // strict: missing / unexpected fields -> TypeError
//!   State t = State::from_tensordict(h5_td);         // lenient and live: writes go to the backend
//!   at::Tensor a = s.x();  s.set_x(a + 1);  State row = s.index({0});
//!
//!   struct Pair : tensordict::TensorClass<Pair> {
//!     TD_FIELDS(Pair, TD_TENSOR(a), TD_TENSOR(b), TD_DATA(std::string, label))
//!   };
//!
//! Field kinds: TD_TENSOR(name) (required tensor), TD_OPTIONAL(name) (tensor that may be absent),
//! TD_SUBTD(name) (a sub-TensorDict), TD_NESTED(Type, name) (a nested typed class), and for TensorClass
//! only TD_DATA(Type, name) / TD_DATA_OR(Type, name, default) (non-tensor: std::string or JsonValue) and
//! TD_SCALAR(Type, name) / TD_SCALAR_OR(Type, name, default) (int64_t, double or bool under the class's
//! cast rules). TD_OPTIONS("frozen", "shadow", "autocast", "nocast", "tensor_only") sets options (inherited).
//! The class path a TensorClass records (a Redis store's __tensorclass__, a memmap directory's meta.json _type):
//! TD_FIELDS records the C++ qualified name ("ns::Pair"); TD_FIELDS_AT(Class, "pkg.mod.Class", ...) records the
//! path the user declares, e.g. the Python class's "module.QualName" so that Python maps the data to its class.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "tensordict/tensor_dict.hpp"
#include "tensordict/typed_schema.hpp"

namespace tensordict {

class TensorClassBase;

namespace typed_detail {

struct WrapTag {};
//! the C++ qualified name of a type from its typeid name ("ns::Pair"; anonymous namespaces left out): the
//! class path TD_FIELDS records
std::string qualified_class_name(const char* mangled);
//! the non-tensor fields given to TensorClass::from_tensordict (upstream's _non_tensordict)
using NonTensorFields = std::map<std::string, JsonValue>;

// ------------------------------------------------------------------ C++ types of DATA / SCALAR fields
template <class T>
struct ValueTraits;
template <>
struct ValueTraits<std::string> {
  static constexpr FieldKind kind = FieldKind::NonTensor;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Undefined;
  static const char* name() { return "std::string"; }
  static JsonValue to_json(const std::string& v) { return JsonValue(v); }
  static std::string from_json(const JsonValue& v, const TypedSchema& s, const std::string& field);
};
template <>
struct ValueTraits<JsonValue> {
  static constexpr FieldKind kind = FieldKind::NonTensor;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Undefined;
  static const char* name() { return "JsonValue"; }
  static JsonValue to_json(const JsonValue& v) { return v; }
  static JsonValue from_json(const JsonValue& v, const TypedSchema&, const std::string&) { return v; }
};
template <>
struct ValueTraits<int64_t> {
  static constexpr FieldKind kind = FieldKind::Scalar;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Long;
  static const char* name() { return "int64_t"; }
  static JsonValue to_json(int64_t v) { return JsonValue(static_cast<long long>(v)); }
  static int64_t from_json(const JsonValue& v, const TypedSchema& s, const std::string& field);
};
template <>
struct ValueTraits<double> {
  static constexpr FieldKind kind = FieldKind::Scalar;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Double;
  static const char* name() { return "double"; }
  static JsonValue to_json(double v) { return JsonValue(v); }
  static double from_json(const JsonValue& v, const TypedSchema& s, const std::string& field);
};
template <>
struct ValueTraits<bool> {
  static constexpr FieldKind kind = FieldKind::Scalar;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Bool;
  static const char* name() { return "bool"; }
  static JsonValue to_json(bool v) { return JsonValue(v); }
  static bool from_json(const JsonValue& v, const TypedSchema& s, const std::string& field);
};

// ------------------------------------------------------------------ field specs (what the macros build)
FieldSpec tensor_field(const char* name, bool required);
FieldSpec subtd_field(const char* name);
template <class N>
FieldSpec nested_field(const char* name) {
  FieldSpec f;
  f.name = name;
  f.kind = FieldKind::Nested;
  f.nested = N::schema();
  f.cpp_type = f.nested->name;
  return f;
}
template <class T>
FieldSpec value_field(const char* name, std::optional<T> def) {
  FieldSpec f;
  f.name = name;
  f.kind = ValueTraits<T>::kind;
  f.scalar_type = ValueTraits<T>::dtype;
  f.cpp_type = ValueTraits<T>::name();
  f.required = !def.has_value();
  if (def) f.default_value = ValueTraits<T>::to_json(*def);
  return f;
}

// ------------------------------------------------------------------ runtime checks and field access
//! strict construction (upstream's generated __init__): TypeError for missing required and unexpected
//! fields, TypeError for a value of the wrong kind; scalar and non-tensor values stored by the cast rules
TensorDict build_fields(const TypedSchema& s, const Dict& fields, const BatchSize& batch_size,
                        std::optional<at::Device> device);
//! TypeError "<Name>.from_tensordict() missing required field(s): ..." when td lacks a required field
void check_required(const TypedSchema& s, const TensorDict& td);
//! TensorClass.from_tensordict: ValueError for keys the class does not declare, KeyError for a key in both
void check_tensorclass_keys(const TypedSchema& s, const TensorDict& td, const NonTensorFields& nt);
//! a tensor field (AttributeError "declared but not set" when absent; TensorClass: an undefined tensor)
at::Tensor get_tensor(const TypedSchema& s, const TensorDict& td, const char* field);
//! a sub-TensorDict field (AttributeError when absent; TypeError when the key holds something else)
TensorDict get_subtd(const TypedSchema& s, const TensorDict& td, const char* field);
//! a DATA / SCALAR field as JSON: the TensorDict's value, else the non-tensor fields', else the default
JsonValue get_value(const TypedSchema& s, const TensorDict& td, const NonTensorFields* nt, const char* field);
//! writes a field; TensorClass: AttributeError "cannot assign to field" when frozen, TypeError when the value
//! does not fit the field (scalar / non-tensor cast rules); TypedTensorDict: TensorDict::set (locked: error)
void set_field(const TypedSchema& s, TensorDict& td, NonTensorFields* nt, const char* field, const Entry& value);
void set_value(const TypedSchema& s, TensorDict& td, NonTensorFields* nt, const char* field, const JsonValue& v);
//! the typed view of `td` as the class `s`: its own schema kept when it already is a subclass of `s`
TensorDict as_class(const TensorDict& td, const std::shared_ptr<const TypedSchema>& s);
//! index_put_ between typed instances: ValueError unless `value` is the same class or has the same fields
void check_same_class(const TypedSchema& mine, const TypedSchema* theirs, const char* what);
//! TensorClass persistence (upstream-formats §1.7): the class record in meta.json, fields in _tensordict/
void tensorclass_memmap_(TensorDict& td, const TypedSchema& s, const NonTensorFields* nt, const std::string& prefix,
                         const MemmapOptions& options);
//! the TensorDict of a tensorclass directory (TypeError when it records no class or another one); the
//! non-tensor fields of the class's meta.json go to class_fields
TensorDict tensorclass_load_memmap(const TypedSchema& s, const std::string& prefix, const LoadOptions& options,
                                   JsonValue* class_fields);
std::string typed_repr(const TypedSchema& s, const TensorDict& td, const NonTensorFields* nt);

//! range-for over the rows (dim 0) of a typed instance: each row is owner.index({i}), of the owner's class
template <class D>
class RowIterator {
 public:
  RowIterator(const D* owner, int64_t i) : owner_(owner), i_(i) {}
  D operator*() const { return owner_->index({at::indexing::TensorIndex(i_)}); }
  RowIterator& operator++() {
    ++i_;
    return *this;
  }
  bool operator!=(const RowIterator& o) const { return i_ != o.i_; }
  bool operator==(const RowIterator& o) const { return i_ == o.i_; }

 private:
  const D* owner_;
  int64_t i_;
};

}  // namespace typed_detail

// ====================================================================== TypedTensorDict (IS-A TensorDict)
template <class D, class Parent = TensorDict>
class TypedTensorDict : public Parent {
  static_assert(std::is_base_of<TensorDict, Parent>::value, "a TypedTensorDict extends TensorDict or another one");
  static Parent make_parent(TensorDict td) {
    if constexpr (std::is_same<Parent, TensorDict>::value) {
      return td;
    } else {
      return Parent(typed_detail::WrapTag{}, std::move(td));
    }
  }

 public:
  using td_crtp_base = TypedTensorDict;

  //! an instance with no field set (what a default-constructed value holds)
  TypedTensorDict() : Parent(make_parent(TensorDict())) { retag(); }
  //! upstream's generated constructor: every required field given, no undeclared one (TypeError); the
  //! "frozen" option locks the instance
  TypedTensorDict(const Dict& fields, BatchSize batch_size = {}, std::optional<at::Device> device = std::nullopt)
      : Parent(make_parent(typed_detail::build_fields(*D::schema(), fields, batch_size, device))) {
    retag();
    if (D::schema()->options.frozen) TensorDict::lock_();
  }
  //! an unchecked wrap of td (what op results use); the storage is td's
  TypedTensorDict(typed_detail::WrapTag, TensorDict td) : Parent(make_parent(std::move(td))) { retag(); }

  //! the class's schema: fields of the base classes then its own, options inherited
  static const std::shared_ptr<const TypedSchema>& schema() {
    static const std::shared_ptr<const TypedSchema> s =
        TypedSchema::make(D::td_class_name(), D::td_class_path(), false, D::td_own_options(), D::td_own_fields(),
                          parent_schema());
    return s;
  }
  static std::vector<std::string> td_own_options() { return {}; }

  //! a live, zero-copy wrap of any TensorDict (writes go to it). check: the required fields must be there
  //! (TypeError); extra keys are allowed; check=false accepts an empty or partial backend (missing fields
  //! raise AttributeError when read). "frozen" is not applied (upstream).
  static D from_tensordict(const TensorDict& td, bool check = true) {
    if (check) typed_detail::check_required(*D::schema(), td);
    return wrap(td);
  }
  //! an unchecked wrap
  static D wrap(TensorDict td) { return D(typed_detail::WrapTag{}, std::move(td)); }
  //! true when td is typed as this class or a subclass of it (upstream isinstance)
  static bool is_instance(const TensorDict& td) {
    return td.typed_schema() && td.typed_schema()->is_a(*D::schema());
  }
  //! the wrapped TensorDict (this instance; what TensorClass::from_tensordict takes)
  const TensorDict& tensordict() const { return *this; }

  // results of ops are the same class, unvalidated (upstream _wrap_td)
  using TensorDict::apply;
  D index(const Index& index) const { return wrap(TensorDict::index(index)); }
  D clone(const CloneOptions& options = {}) const { return wrap(TensorDict::clone(options)); }
  D expand(BatchSize shape) const { return wrap(TensorDict::expand(std::move(shape))); }
  D select(const std::vector<NestedKey>& keys, const SelectOptions& options = {}) const {
    return wrap(TensorDict::select(keys, options));
  }
  D exclude(const std::vector<NestedKey>& keys, const ExcludeOptions& options = {}) const {
    return wrap(TensorDict::exclude(keys, options));
  }
  D apply(const LeafFn& fn, const ApplyOptions& options = {}) const { return wrap(TensorDict::apply(fn, options)); }
  std::vector<D> unbind(int64_t dim = 0) const {
    std::vector<D> out;
    for (auto& t : TensorDict::unbind(dim)) out.push_back(wrap(t));
    return out;
  }
  static D stack(const std::vector<D>& xs, int64_t dim = 0) {
    return wrap(tensordict::stack(std::vector<TensorDict>(xs.begin(), xs.end()), dim));
  }
  static D cat(const std::vector<D>& xs, int64_t dim = 0) {
    return wrap(tensordict::cat(std::vector<TensorDict>(xs.begin(), xs.end()), dim));
  }
  //! rows along dim 0, each of this class
  typed_detail::RowIterator<D> begin() const { return {static_cast<const D*>(this), 0}; }
  typed_detail::RowIterator<D> end() const { return {static_cast<const D*>(this), TensorDict::len()}; }

 protected:
  at::Tensor td_tensor_(const char* f) const {
    if (TensorDict::is_dense()) {  // the untyped lookup; a missing or non-tensor field takes the checked path
      try {
        return TensorDict::get(f);
      } catch (const Error&) {
      }
    }
    return typed_detail::get_tensor(*D::schema(), *this, f);
  }
  TensorDict td_subtd_(const char* f) const { return typed_detail::get_subtd(*D::schema(), *this, f); }
  JsonValue td_value_(const char* f) const { return typed_detail::get_value(*D::schema(), *this, nullptr, f); }
  void td_set_(const char* f, const Entry& v) {
    TensorDict& self = *this;
    typed_detail::set_field(*D::schema(), self, nullptr, f, v);
  }
  void td_set_value_(const char* f, const JsonValue& v) {
    TensorDict& self = *this;
    typed_detail::set_value(*D::schema(), self, nullptr, f, v);
  }

 private:
  static std::shared_ptr<const TypedSchema> parent_schema() {
    if constexpr (std::is_same<Parent, TensorDict>::value) {
      return nullptr;
    } else {
      return Parent::schema();
    }
  }
  //! this handle under the class's schema, unless it already is this class or a subclass
  void retag() {
    const auto& mine = TensorDict::typed_schema();
    const auto& want = D::schema();
    if (mine == want || (mine && mine->is_a(*want))) return;
    TensorDict::operator=(TensorDict::with_schema(want));
  }
};

// ====================================================================== TensorClass (HAS-A TensorDict)
//! what every TensorClass shares: the wrapped TensorDict and the non-tensor fields given apart from it
class TensorClassBase {
 public:
  //! the live TensorDict the instance wraps (typed as the class; upstream's `_tensordict`)
  const TensorDict& tensordict() const { return td_; }
  const BatchSize& batch_size() const { return td_.batch_size(); }
  std::optional<at::Device> device() const { return td_.device(); }
  int64_t batch_dims() const { return td_.batch_dims(); }
  int64_t numel() const { return td_.numel(); }
  int64_t len() const { return td_.len(); }
  bool is_locked() const { return td_.is_locked(); }
  bool is_memmap() const { return td_.is_memmap(); }
  //! the class's name ("Pair")
  std::string type_name() const { return td_.type_name(); }
  //! the field's raw entry (a tensor, a TensorDict, a NonTensorData); KeyError when absent
  Entry get(const std::string& field) const;
  //! a plain TensorDict copy of the fields (upstream to_tensordict)
  TensorDict to_tensordict() const;
  //! the non-tensor fields held apart from the TensorDict (from_tensordict's non_tensordict)
  const typed_detail::NonTensorFields& non_tensordict() const;
  std::string repr() const;
  bool equal(const TensorClassBase& other) const;

 protected:
  TensorClassBase() = default;
  TensorClassBase(typed_detail::WrapTag, TensorDict td, std::shared_ptr<const typed_detail::NonTensorFields> nt)
      : td_(std::move(td)), nt_(std::move(nt)) {}
  //! a private copy of the non-tensor fields before writing one
  typed_detail::NonTensorFields* nt_for_write();

  TensorDict td_;
  std::shared_ptr<const typed_detail::NonTensorFields> nt_;
};

template <class D, class Parent = TensorClassBase>
class TensorClass : public Parent {
  static_assert(std::is_base_of<TensorClassBase, Parent>::value, "a TensorClass extends TensorClassBase or another");
  using NtPtr = std::shared_ptr<const typed_detail::NonTensorFields>;

 public:
  using td_crtp_base = TensorClass;

  TensorClass() : TensorClass(typed_detail::WrapTag{}, TensorDict(), nullptr) {}
  //! upstream's generated constructor: required fields (no default) given, no undeclared one (TypeError);
  //! tensors, sub-TensorDicts, nested classes (their tensordict()) and non-tensor values (JsonValue);
  //! "frozen" locks the instance
  TensorClass(const Dict& fields, BatchSize batch_size = {}, std::optional<at::Device> device = std::nullopt)
      : TensorClass(typed_detail::WrapTag{}, typed_detail::build_fields(*D::schema(), fields, batch_size, device),
                    nullptr) {
    if (D::schema()->options.frozen) this->td_.lock_();
  }
  TensorClass(typed_detail::WrapTag, TensorDict td, NtPtr nt)
      : Parent(typed_detail::WrapTag{}, std::move(td), std::move(nt)) {
    const auto& mine = this->td_.typed_schema();
    const auto& want = D::schema();
    if (this->td_.defined() && mine != want && !(mine && mine->is_a(*want))) this->td_ = this->td_.with_schema(want);
  }

  static const std::shared_ptr<const TypedSchema>& schema() {
    static const std::shared_ptr<const TypedSchema> s = TypedSchema::make(
        D::td_class_name(), D::td_class_path(), true, D::td_own_options(), D::td_own_fields(), parent_schema());
    return s;
  }
  static std::vector<std::string> td_own_options() { return {}; }

  //! wraps td without a copy (upstream from_tensordict): keys the class does not declare raise ValueError;
  //! declared but absent fields are unset; non_tensordict (a JSON object) gives non-tensor fields apart from
  //! td (a key in both: KeyError)
  static D from_tensordict(const TensorDict& td, const JsonValue& non_tensordict = JsonValue::object(),
                           bool safe = true) {
    typed_detail::NonTensorFields nt;
    if (!non_tensordict.is_null()) {
      if (!non_tensordict.is_object()) throw TypeError("from_tensordict: non_tensordict must be a JSON object");
      for (const auto& kv : non_tensordict.as_object()) nt[kv.first] = kv.second;
    }
    if (safe) typed_detail::check_tensorclass_keys(*D::schema(), td, nt);
    return D(typed_detail::WrapTag{}, td,
             nt.empty() ? nullptr : std::make_shared<const typed_detail::NonTensorFields>(std::move(nt)));
  }
  //! an unchecked wrap
  static D wrap(TensorDict td) { return D(typed_detail::WrapTag{}, std::move(td), nullptr); }
  static bool is_instance(const TensorDict& td) {
    return td.typed_schema() && td.typed_schema()->is_a(*D::schema());
  }

  D index(const Index& index) const { return with(this->td_.index(index)); }
  D clone(const CloneOptions& options = {}) const { return with(this->td_.clone(options)); }
  D expand(BatchSize shape) const { return with(this->td_.expand(std::move(shape))); }
  D contiguous() const { return with(this->td_.contiguous()); }
  D apply(const LeafFn& fn, const ApplyOptions& options = {}) const { return with(this->td_.apply(fn, options)); }
  std::vector<D> unbind(int64_t dim = 0) const {
    std::vector<D> out;
    for (auto& t : this->td_.unbind(dim)) out.push_back(with(t));
    return out;
  }
  static D stack(const std::vector<D>& xs, int64_t dim = 0) { return combine(xs, dim, true); }
  static D cat(const std::vector<D>& xs, int64_t dim = 0) { return combine(xs, dim, false); }
  typed_detail::RowIterator<D> begin() const { return {static_cast<const D*>(this), 0}; }
  typed_detail::RowIterator<D> end() const { return {static_cast<const D*>(this), this->td_.len()}; }

  //! x[index] = value: value must be the same class or have the same fields (ValueError)
  D& index_put_(const Index& index, const TensorClassBase& value) {
    typed_detail::check_same_class(*D::schema(), value.tensordict().typed_schema().get(), "index_put_");
    check_writable("index_put_");
    this->td_.index_put_(index, value.tensordict().with_schema(nullptr));
    return self();
  }
  //! upstream update: the fields of other (a TensorDict or another instance) written into this one
  D& update(const TensorDict& other) {
    check_writable("update");
    this->td_.update(other.with_schema(nullptr));
    return self();
  }
  D& update(const TensorClassBase& other) { return update(other.tensordict()); }
  //! in place: what memory-mapped instances take (the seed's update_())
  D& update_(const TensorDict& other) {
    check_writable("update_");
    this->td_.update_(other.with_schema(nullptr));
    return self();
  }
  D& update_(const TensorClassBase& other) { return update_(other.tensordict()); }
  //! in-place write of an existing field (memory-mapped instances)
  D& set_(const std::string& field, const Entry& value) {
    check_writable("set_");
    this->td_.set_(field, value);
    return self();
  }
  D& lock_() {
    this->td_.lock_();
    return self();
  }
  D& unlock_() {
    this->td_.unlock_();
    return self();
  }
  //! writes the tensorclass directory format (meta.json with the class path, fields in _tensordict/)
  D& memmap_(const std::string& prefix, const MemmapOptions& options = {}) {
    typed_detail::tensorclass_memmap_(this->td_, *D::schema(), this->nt_.get(), prefix, options);
    return self();
  }
  //! a memory-mapped copy at prefix
  D memmap(const std::string& prefix, const MemmapOptions& options = {}) const {
    D c = clone();
    c.memmap_(prefix, options);
    return c;
  }
  //! loads a tensorclass directory written by Python or C++ (TypeError when it records another class)
  static D load_memmap(const std::string& prefix, const LoadOptions& options = {}) {
    JsonValue fields;
    TensorDict td = typed_detail::tensorclass_load_memmap(*D::schema(), prefix, options, &fields);
    return from_tensordict(td, fields);
  }

 protected:
  at::Tensor td_tensor_(const char* f) const {
    if (this->td_.is_dense()) {  // the untyped lookup; a missing (None) or non-tensor field: the checked path
      try {
        return this->td_.get(f);
      } catch (const Error&) {
      }
    }
    return typed_detail::get_tensor(*D::schema(), this->td_, f);
  }
  TensorDict td_subtd_(const char* f) const { return typed_detail::get_subtd(*D::schema(), this->td_, f); }
  JsonValue td_value_(const char* f) const {
    return typed_detail::get_value(*D::schema(), this->td_, this->nt_.get(), f);
  }
  void td_set_(const char* f, const Entry& v) {
    typed_detail::set_field(*D::schema(), this->td_, nt_slot(f), f, v);
  }
  void td_set_value_(const char* f, const JsonValue& v) {
    typed_detail::set_value(*D::schema(), this->td_, nt_slot(f), f, v);
  }

 private:
  static std::shared_ptr<const TypedSchema> parent_schema() {
    if constexpr (std::is_same<Parent, TensorClassBase>::value) {
      return nullptr;
    } else {
      return Parent::schema();
    }
  }
  D& self() { return static_cast<D&>(*this); }
  D with(TensorDict td) const { return D(typed_detail::WrapTag{}, std::move(td), this->nt_); }
  static D combine(const std::vector<D>& xs, int64_t dim, bool stack) {
    if (xs.empty()) throw RuntimeError(std::string(stack ? "stack" : "cat") + " expects a non-empty list");
    std::vector<TensorDict> tds;
    for (const auto& x : xs) tds.push_back(x.tensordict());
    TensorDict r = stack ? tensordict::stack(tds, dim) : tensordict::cat(tds, dim);
    return D(typed_detail::WrapTag{}, r, xs[0].nt_);
  }
  //! the non-tensor fields map when f lives there (a private copy), else nullptr
  typed_detail::NonTensorFields* nt_slot(const char* f) {
    if (this->nt_ && this->nt_->count(f)) return this->nt_for_write();
    return nullptr;
  }
  void check_writable(const char* what) const {
    if (D::schema()->options.frozen) {
      throw AttributeError(std::string("cannot assign to a frozen ") + D::schema()->name + " (" + what + ")");
    }
  }
};

}  // namespace tensordict

// ====================================================================== the declaration macros
// preprocessor helpers
#define TD_PP_CAT_(a, b) a##b
#define TD_PP_CAT(a, b) TD_PP_CAT_(a, b)
#define TD_PP_UNPACK(...) __VA_ARGS__
#define TD_PP_NARG(...) TD_PP_NARG_(__VA_ARGS__, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define TD_PP_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, _33, _34, _35, _36, _37, _38, _39, _40, N, ...) N
#define TD_PP_FE_1(m, d, x) m(d, x)
#define TD_PP_FE_2(m, d, x, ...) m(d, x) TD_PP_FE_1(m, d, __VA_ARGS__)
#define TD_PP_FE_3(m, d, x, ...) m(d, x) TD_PP_FE_2(m, d, __VA_ARGS__)
#define TD_PP_FE_4(m, d, x, ...) m(d, x) TD_PP_FE_3(m, d, __VA_ARGS__)
#define TD_PP_FE_5(m, d, x, ...) m(d, x) TD_PP_FE_4(m, d, __VA_ARGS__)
#define TD_PP_FE_6(m, d, x, ...) m(d, x) TD_PP_FE_5(m, d, __VA_ARGS__)
#define TD_PP_FE_7(m, d, x, ...) m(d, x) TD_PP_FE_6(m, d, __VA_ARGS__)
#define TD_PP_FE_8(m, d, x, ...) m(d, x) TD_PP_FE_7(m, d, __VA_ARGS__)
#define TD_PP_FE_9(m, d, x, ...) m(d, x) TD_PP_FE_8(m, d, __VA_ARGS__)
#define TD_PP_FE_10(m, d, x, ...) m(d, x) TD_PP_FE_9(m, d, __VA_ARGS__)
#define TD_PP_FE_11(m, d, x, ...) m(d, x) TD_PP_FE_10(m, d, __VA_ARGS__)
#define TD_PP_FE_12(m, d, x, ...) m(d, x) TD_PP_FE_11(m, d, __VA_ARGS__)
#define TD_PP_FE_13(m, d, x, ...) m(d, x) TD_PP_FE_12(m, d, __VA_ARGS__)
#define TD_PP_FE_14(m, d, x, ...) m(d, x) TD_PP_FE_13(m, d, __VA_ARGS__)
#define TD_PP_FE_15(m, d, x, ...) m(d, x) TD_PP_FE_14(m, d, __VA_ARGS__)
#define TD_PP_FE_16(m, d, x, ...) m(d, x) TD_PP_FE_15(m, d, __VA_ARGS__)
#define TD_PP_FE_17(m, d, x, ...) m(d, x) TD_PP_FE_16(m, d, __VA_ARGS__)
#define TD_PP_FE_18(m, d, x, ...) m(d, x) TD_PP_FE_17(m, d, __VA_ARGS__)
#define TD_PP_FE_19(m, d, x, ...) m(d, x) TD_PP_FE_18(m, d, __VA_ARGS__)
#define TD_PP_FE_20(m, d, x, ...) m(d, x) TD_PP_FE_19(m, d, __VA_ARGS__)
#define TD_PP_FE_21(m, d, x, ...) m(d, x) TD_PP_FE_20(m, d, __VA_ARGS__)
#define TD_PP_FE_22(m, d, x, ...) m(d, x) TD_PP_FE_21(m, d, __VA_ARGS__)
#define TD_PP_FE_23(m, d, x, ...) m(d, x) TD_PP_FE_22(m, d, __VA_ARGS__)
#define TD_PP_FE_24(m, d, x, ...) m(d, x) TD_PP_FE_23(m, d, __VA_ARGS__)
#define TD_PP_FE_25(m, d, x, ...) m(d, x) TD_PP_FE_24(m, d, __VA_ARGS__)
#define TD_PP_FE_26(m, d, x, ...) m(d, x) TD_PP_FE_25(m, d, __VA_ARGS__)
#define TD_PP_FE_27(m, d, x, ...) m(d, x) TD_PP_FE_26(m, d, __VA_ARGS__)
#define TD_PP_FE_28(m, d, x, ...) m(d, x) TD_PP_FE_27(m, d, __VA_ARGS__)
#define TD_PP_FE_29(m, d, x, ...) m(d, x) TD_PP_FE_28(m, d, __VA_ARGS__)
#define TD_PP_FE_30(m, d, x, ...) m(d, x) TD_PP_FE_29(m, d, __VA_ARGS__)
#define TD_PP_FE_31(m, d, x, ...) m(d, x) TD_PP_FE_30(m, d, __VA_ARGS__)
#define TD_PP_FE_32(m, d, x, ...) m(d, x) TD_PP_FE_31(m, d, __VA_ARGS__)
#define TD_PP_FE_33(m, d, x, ...) m(d, x) TD_PP_FE_32(m, d, __VA_ARGS__)
#define TD_PP_FE_34(m, d, x, ...) m(d, x) TD_PP_FE_33(m, d, __VA_ARGS__)
#define TD_PP_FE_35(m, d, x, ...) m(d, x) TD_PP_FE_34(m, d, __VA_ARGS__)
#define TD_PP_FE_36(m, d, x, ...) m(d, x) TD_PP_FE_35(m, d, __VA_ARGS__)
#define TD_PP_FE_37(m, d, x, ...) m(d, x) TD_PP_FE_36(m, d, __VA_ARGS__)
#define TD_PP_FE_38(m, d, x, ...) m(d, x) TD_PP_FE_37(m, d, __VA_ARGS__)
#define TD_PP_FE_39(m, d, x, ...) m(d, x) TD_PP_FE_38(m, d, __VA_ARGS__)
#define TD_PP_FE_40(m, d, x, ...) m(d, x) TD_PP_FE_39(m, d, __VA_ARGS__)
//! m(d, item) for each item (at most 40)
#define TD_PP_FOR_EACH(m, d, ...) TD_PP_CAT(TD_PP_FE_, TD_PP_NARG(__VA_ARGS__))(m, d, __VA_ARGS__)

// field items: (KIND, name, extra...)
#define TD_TENSOR(name) (TENSOR, name, true)
#define TD_OPTIONAL(name) (TENSOR, name, false)
#define TD_SUBTD(name) (SUBTD, name, _)
#define TD_NESTED(Type, name) (NESTED, name, Type)
#define TD_DATA(Type, name) (DATA, name, Type)
#define TD_DATA_OR(Type, name, default_value) (DATAOR, name, Type, default_value)
#define TD_SCALAR(Type, name) (DATA, name, Type)
#define TD_SCALAR_OR(Type, name, default_value) (DATAOR, name, Type, default_value)

// accessors of one item
#define TD_ACC(C, item) TD_ACC_X(C, TD_PP_UNPACK item)
#define TD_ACC_X(...) TD_ACC_Y(__VA_ARGS__)
#define TD_ACC_Y(C, K, ...) TD_PP_CAT(TD_ACC_, K)(C, __VA_ARGS__)
#define TD_ACC_TENSOR(C, name, req)                                                   \
  at::Tensor name() const { return this->td_tensor_(#name); }                         \
  C& set_##name(const at::Tensor& v) {                                                \
    this->td_set_(#name, ::tensordict::Entry(v));                                     \
    return *this;                                                                     \
  }
#define TD_ACC_SUBTD(C, name, _)                                                      \
  ::tensordict::TensorDict name() const { return this->td_subtd_(#name); }            \
  C& set_##name(const ::tensordict::TensorDict& v) {                                  \
    this->td_set_(#name, ::tensordict::Entry(v));                                     \
    return *this;                                                                     \
  }
#define TD_ACC_NESTED(C, name, Type)                                                  \
  Type name() const { return Type::wrap(this->td_subtd_(#name)); }                    \
  C& set_##name(const Type& v) {                                                      \
    this->td_set_(#name, ::tensordict::Entry(v.tensordict()));                        \
    return *this;                                                                     \
  }
#define TD_ACC_DATA(C, name, Type)                                                    \
  Type name() const {                                                                 \
    return ::tensordict::typed_detail::ValueTraits<Type>::from_json(this->td_value_(#name), *C::schema(), #name); \
  }                                                                                   \
  C& set_##name(const Type& v) {                                                      \
    this->td_set_value_(#name, ::tensordict::typed_detail::ValueTraits<Type>::to_json(v)); \
    return *this;                                                                     \
  }
#define TD_ACC_DATAOR(C, name, Type, default_value) TD_ACC_DATA(C, name, Type)

// the spec of one item
#define TD_SPEC(C, item) TD_SPEC_X(C, TD_PP_UNPACK item)
#define TD_SPEC_X(...) TD_SPEC_Y(__VA_ARGS__)
#define TD_SPEC_Y(C, K, ...) TD_PP_CAT(TD_SPEC_, K)(C, __VA_ARGS__),
#define TD_SPEC_TENSOR(C, name, req) ::tensordict::typed_detail::tensor_field(#name, req)
#define TD_SPEC_SUBTD(C, name, _) ::tensordict::typed_detail::subtd_field(#name)
#define TD_SPEC_NESTED(C, name, Type) ::tensordict::typed_detail::nested_field<Type>(#name)
#define TD_SPEC_DATA(C, name, Type) ::tensordict::typed_detail::value_field<Type>(#name, std::nullopt)
#define TD_SPEC_DATAOR(C, name, Type, default_value) \
  ::tensordict::typed_detail::value_field<Type>(#name, std::optional<Type>(default_value))

//! the class's fields (in a TypedTensorDict<C, ...> or TensorClass<C, ...>): accessors name() / set_name(v),
//! the schema, and the constructors
#define TD_FIELDS_AT(C, class_path, ...)                                              \
 public:                                                                              \
  using td_crtp_base::td_crtp_base;                                                   \
  static const char* td_class_name() { return #C; }                                   \
  static std::string td_class_path() { return class_path; }                           \
  static std::vector<::tensordict::FieldSpec> td_own_fields() {                       \
    return {TD_PP_FOR_EACH(TD_SPEC, C, __VA_ARGS__)};                                 \
  }                                                                                   \
  TD_PP_FOR_EACH(TD_ACC, C, __VA_ARGS__)
#define TD_FIELDS(C, ...) TD_FIELDS_AT(C, ::tensordict::typed_detail::qualified_class_name(typeid(C).name()), __VA_ARGS__)
//! the class's options ("frozen", "shadow", "autocast", "nocast", "tensor_only"); subclasses inherit them
#define TD_OPTIONS(...) \
 public:                \
  static std::vector<std::string> td_own_options() { return {__VA_ARGS__}; }
