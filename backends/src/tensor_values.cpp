#include "tensordict/backends/tensor_values.hpp"

#include <ATen/ATen.h>

namespace tensordict::backends {

at::Tensor value_bytes(const at::Tensor& t) {
  at::Tensor c = t.device().is_cpu() ? t : t.to(at::kCPU);
  if (c.is_conj()) c = c.resolve_conj();
  if (c.is_neg()) c = c.resolve_neg();
  if (c._is_zerotensor()) c = at::zeros(c.sizes(), c.options());
  return c.contiguous();
}

}  // namespace tensordict::backends
