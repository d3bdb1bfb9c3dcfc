#include "tensordict/describe.hpp"

#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"

namespace tensordict {
namespace {

JsonValue int_list(at::IntArrayRef v) {
  JsonValue::Array a;
  for (auto x : v) a.emplace_back(static_cast<int64_t>(x));
  return JsonValue(std::move(a));
}
JsonValue key_list(const NestedKey& k) {
  JsonValue::Array a;
  for (const auto& p : k.parts()) a.emplace_back(p);
  return JsonValue(std::move(a));
}

//! pre-order over the tree's structure (tree::visit: a dense level's entries, any other node's metas): the
//! structure reads no leaf; `values` reads each tensor leaf
struct DescribeVisitor : detail::tree::StructureVisitor {
  bool values;
  JsonValue::Array& subs;
  JsonValue::Array& leaves;
  DescribeVisitor(bool v, JsonValue::Array& s, JsonValue::Array& l) : values(v), subs(s), leaves(l) {}

  detail::tree::Step visit(const detail::tree::KeyPath& path, const detail::tree::Item& item) {
    const NestedKey full = path.full();
    if (item.is_tensordict()) {
      const TensorDict c = item.sub();  // a handle, no data
      subs.emplace_back(JsonValue::object({{"key", key_list(full)}, {"type", c.type_name()}, {"batch_size", int_list(c.batch_size())}}));
      return detail::tree::Step::Enter;
    }
    const EntryMeta m = item.meta();
    if (m.kind == EntryMeta::Kind::Tensor) {
      JsonValue::Object o{{"key", key_list(full)}, {"kind", "tensor"}, {"dtype", dtype_repr(m.dtype)}, {"shape", int_list(m.shape)}};
      if (values) o.emplace_back("values", tensor_values(item.value().tensor()));
      leaves.emplace_back(JsonValue(std::move(o)));
      return detail::tree::Step::Next;
    }
    const Entry e = m.value ? *m.value : item.value();  // a remote node: the value alone
    if (e.is_non_tensor_data()) {
      leaves.emplace_back(JsonValue::object({{"key", key_list(full)},
                                             {"kind", "non_tensor"},
                                             {"type", "NonTensorData"},
                                             {"data", e.non_tensor_data().value()},
                                             {"batch_size", int_list(e.non_tensor_data().batch_size())}}));
    } else if (e.is_non_tensor_stack()) {
      leaves.emplace_back(JsonValue::object({{"key", key_list(full)},
                                             {"kind", "non_tensor_stack"},
                                             {"data", e.non_tensor_stack().tolist()},
                                             {"batch_size", int_list(e.non_tensor_stack().batch_size())}}));
    }
    return detail::tree::Step::Next;
  }
};

JsonValue structure_of(const TensorDict& td, bool values, JsonValue* leaves_out) {
  JsonValue::Array subs, leaves;
  DescribeVisitor v(values, subs, leaves);
  detail::tree::visit(td, v);
  if (leaves_out) *leaves_out = JsonValue(std::move(leaves));
  return JsonValue::object({{"type", td.type_name()}, {"batch_size", int_list(td.batch_size())}, {"sub_tensordicts", JsonValue(std::move(subs))}});
}

}  // namespace

std::string dtype_repr(at::ScalarType dtype) { return detail::dtype_str(dtype); }

JsonValue tensor_values(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu().reshape({-1});
  JsonValue::Array a;
  a.reserve(static_cast<size_t>(c.numel()));
  if (c.scalar_type() == at::kBool) {
    auto p = c.data_ptr<bool>();
    for (int64_t i = 0; i < c.numel(); ++i) a.emplace_back(p[i]);
  } else if (at::isIntegralType(c.scalar_type(), /*includeBool=*/false)) {
    at::Tensor l = c.to(at::kLong);
    auto p = l.data_ptr<int64_t>();
    for (int64_t i = 0; i < l.numel(); ++i) a.emplace_back(p[i]);
  } else if (at::isComplexType(c.scalar_type())) {
    at::Tensor r = at::view_as_real(c.to(at::kComplexDouble)).reshape({-1});
    auto p = r.data_ptr<double>();
    for (int64_t i = 0; i + 1 < r.numel(); i += 2)  // one [re, im] pair per element
      a.emplace_back(JsonValue::array({JsonValue(p[i]), JsonValue(p[i + 1])}));
  } else {
    at::Tensor d = c.to(at::kDouble);
    auto p = d.data_ptr<double>();
    for (int64_t i = 0; i < d.numel(); ++i) a.emplace_back(p[i]);
  }
  return JsonValue(std::move(a));
}

JsonValue describe(const TensorDict& td, bool values) {
  JsonValue leaves;
  JsonValue structure = structure_of(td, values, &leaves);
  return JsonValue::object({{"loaded_type", td.type_name()}, {"structure", structure}, {"leaves", leaves}});
}

JsonValue describe(const LazyStackedTensorDict& lazy, bool values) {
  JsonValue::Array members;
  for (const auto& td : lazy.tensordicts()) {
    JsonValue leaves;
    JsonValue s = structure_of(td, values, &leaves);
    s.as_object().emplace_back("leaves", leaves);
    members.push_back(std::move(s));
  }
  JsonValue::Array bs;
  for (auto b : lazy.batch_size()) bs.emplace_back(b);
  return JsonValue::object({{"loaded_type", "LazyStackedTensorDict"},
                            {"structure", JsonValue::object({{"type", "LazyStackedTensorDict"},
                                                             {"batch_size", JsonValue(std::move(bs))},
                                                             {"stack_dim", lazy.stack_dim()},
                                                             {"tensordicts", JsonValue(std::move(members))}})}});
}

}  // namespace tensordict
