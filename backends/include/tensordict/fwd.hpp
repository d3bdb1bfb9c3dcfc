#pragma once
//! Forward declarations of tensordict's and libtorch's types, for headers that only name them (parameters,
//! return types, references, pointers, aliases). A header including this instead of <ATen/ATen.h> or
//! tensor_dict.hpp spares its includers libtorch's ~240k preprocessed lines (or, with ATen/core/Tensor.h
//! where a tensor is held by value, ~95k of them) and their rebuild when tensor_dict.hpp changes.
//! It sits in backends/include like errors.hpp: the lowest layer, so every layer may include it.
#include <cstdint>
#include <vector>

#include <c10/macros/Macros.h>  // namespace at { using namespace c10; }: at::Device, at::Scalar ... below

namespace c10 {
struct Device;
enum class ScalarType : int8_t;
class Scalar;
template <typename T>
class ArrayRef;
}  // namespace c10

namespace at {
class Tensor;
struct Generator;
using IntArrayRef = c10::ArrayRef<int64_t>;
namespace indexing {
struct Slice;
struct TensorIndex;
}  // namespace indexing
}  // namespace at

namespace tensordict {

class TensorDict;
class LazyStackedTensorDict;
class Entry;
class Node;
struct NodeCaps;
class NestedKey;
class NonTensorData;
class NonTensorStack;
class JsonValue;
class ResolvedIndex;
class StorageSpec;
struct StorageOptions;
struct OpenOptions;
struct TypedSchema;
struct TensorDictImpl;
struct MapOptions;
class MapIter;
struct KeysOptions;
struct UpdateOptions;
struct ApplyOptions;
struct MemmapOptions;
struct LoadOptions;

//! a batch size (or any shape): one size per dim
using BatchSize = std::vector<int64_t>;
//! one index element per batch dim: int, Slice, None, Ellipsis, bool, long/bool tensor (libtorch's kinds)
using Index = std::vector<at::indexing::TensorIndex>;

}  // namespace tensordict
