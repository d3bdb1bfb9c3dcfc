#pragma once
//! The map functions bench_actors and bench_map time: identity, a cheap elementwise fn (x + 1) and a heavy one
//! (16 rounds of sin / cos per element). Header-only; not part of the library.
#include "tensordict/tensordict.hpp"

namespace benchutil {

inline tensordict::MapFn identity_fn() {
  return [](const tensordict::TensorDict& c) { return c; };
}
inline tensordict::MapFn cheap_fn() {
  return [](const tensordict::TensorDict& c) { return c.apply([](const at::Tensor& t) { return t + 1; }); };
}
inline tensordict::MapFn heavy_fn() {
  return [](const tensordict::TensorDict& c) {
    return c.apply([](const at::Tensor& t) {
      at::Tensor x = t;
      for (int k = 0; k < 16; ++k) x = at::sin(x) * 1.1 + at::cos(x);
      return x;
    });
  };
}

}  // namespace benchutil
