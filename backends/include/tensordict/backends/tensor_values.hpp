#pragma once
//! The bytes a storage writes for a tensor: one rule for every byte writer (memmap files, HDF5 datasets, Redis
//! values).
#include <ATen/core/Tensor.h>

namespace tensordict::backends {

//! `t` as a C-contiguous CPU tensor whose bytes are its values: the conj and neg bits resolved (lazy views whose
//! bytes are not their values) and a ZeroTensor materialised (lazy zeros, no bytes behind its data pointer).
//! Layout checks (sparse, nested, quantized) are the caller's
at::Tensor value_bytes(const at::Tensor& t);

}  // namespace tensordict::backends
