#pragma once
//! describe(): a TensorDict (or lazy stack) as JSON in the layout of the fixtures' `.expected.json`
//! files (`loaded_type`, `structure`, `leaves` with every value), so any dataset can be diffed against
//! what Python's tensordict reports. Used by `tdx dump --json` and by the fixture tests.
#include "tensordict/backends/json_value.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! {"loaded_type", "structure": {"type","batch_size","sub_tensordicts"}, "leaves": [...]}; with
//! values=false the leaves carry no "values" (a summary for large datasets)
JsonValue describe(const TensorDict& td, bool values = true);
JsonValue describe(const LazyStackedTensorDict& lazy, bool values = true);
//! a tensor's dtype as Python prints it ("torch.float32")
std::string dtype_repr(at::ScalarType dtype);
//! the flattened (C-order) values of a tensor as a JSON array (bools as booleans, ints as ints,
//! floating types as their exact double values, complex ones as [re, im] pairs)
JsonValue tensor_values(const at::Tensor& t);

}  // namespace tensordict
