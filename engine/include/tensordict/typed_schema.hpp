#pragma once
//! The runtime schema of a typed wrapper (TypedTensorDict, TensorClass): its class name, fields and options.
//! A TensorDict handle may carry one (`TensorDict::typed_schema()`): results of index / clone / expand /
//! select / exclude / apply / unbind / stack / cat keep it without revalidation (upstream's `_wrap_td`), and
//! a lazy stack of typed members hands out typed members. The C++ classes that declare schemas live in
//! tensordict/typed.hpp.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tensordict/backends/json_value.hpp"

namespace tensordict {

struct TypedSchema;

//! what a field holds
enum class FieldKind {
  Tensor,      //!< a tensor leaf
  TensorDict,  //!< a sub-TensorDict (any node)
  Nested,      //!< a nested typed wrapper (TypedTensorDict or TensorClass): `nested` is its schema
  Scalar,      //!< a C++ scalar (int64_t, double, bool) under the class's cast rules (autocast / nocast ...)
  NonTensor    //!< a JSON-like value (string, number, list, object) stored as NonTensorData
};

const char* field_kind_name(FieldKind k);

struct FieldSpec {
  std::string name;
  FieldKind kind = FieldKind::Tensor;
  bool required = true;
  //! Scalar fields: the dtype of the tensor a cast value becomes (kLong, kDouble, kBool)
  c10::ScalarType scalar_type = c10::ScalarType::Undefined;
  //! NonTensor / Scalar fields: the default value (absent: no default)
  std::optional<JsonValue> default_value;
  //! the C++ type of the field, for messages ("at::Tensor", "std::string", "int64_t", a class name)
  std::string cpp_type;
  //! Nested fields: the nested class's schema
  std::shared_ptr<const TypedSchema> nested;
};

//! the options of upstream's TensorClass[...] / TypedTensorDict[...]
struct TypedOptions {
  bool frozen = false;
  bool shadow = false;
  bool autocast = false;
  bool nocast = false;
  bool tensor_only = false;
};

struct TypedSchema {
  std::string name;        //!< the class name ("State")
  std::string class_path;  //!< the Python class path ("__main__.State"): what memmap and Redis record
  bool tensorclass = false;  //!< a TensorClass (HAS-A) rather than a TypedTensorDict (IS-A)
  TypedOptions options;
  std::vector<FieldSpec> fields;  //!< the base classes' fields first, in declaration order
  //! the schema this one extends (C++ inheritance), or null
  std::shared_ptr<const TypedSchema> parent;

  const FieldSpec* find(const std::string& field) const;
  std::vector<std::string> field_names() const;
  std::vector<std::string> required_fields() const;
  std::vector<std::string> optional_fields() const;
  //! true when this schema is `other` or extends it
  bool is_a(const TypedSchema& other) const;
  //! same field names and kinds (what index_put_ between two classes requires)
  bool same_fields(const TypedSchema& other) const;

  //! builds a schema: the parent's fields then `own`, options inherited and merged. Throws what upstream
  //! raises at class creation: ValueError for an unknown option or mutually exclusive cast options,
  //! AttributeError for a field that shadows a TensorDict attribute (unless shadow), TypeError for a
  //! non-tensor field under tensor_only or a field declared twice.
  static std::shared_ptr<const TypedSchema> make(std::string name, std::string class_path, bool tensorclass,
                                                 const std::vector<std::string>& options,
                                                 std::vector<FieldSpec> own,
                                                 std::shared_ptr<const TypedSchema> parent);
};

//! the names a field may not take without `shadow` (TensorDictBase attributes upstream checks)
const std::vector<std::string>& reserved_field_names();

}  // namespace tensordict
