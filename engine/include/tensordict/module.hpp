#pragma once
//! Modules and parameters (upstream's "TensorDict for functional programming"): a module's weights as a nested
//! TensorDict, and back.
//!
//!   TensorDict params = TensorDict::from_module(*model);          // "0": {"weight", "bias"}, "2": {...}
//!   params.memmap(dir);                                            // weights saved in upstream's layout
//!   TensorDict::load_memmap(dir).to_module(*model);                 // loaded: the module takes the mapped storage
//!   {
//!     tensordict::ModuleSwap swap(other_params, *model);            // `with other_params.to_module(model):`
//!     auto y = model->forward(x);                                    // runs on other_params
//!   }                                                                // the module's own weights are back
//!
//! Ensembles: C++ has no vmap; stack the members' params (`tensordict::stack`) and run member i through a
//! ModuleSwap of `stacked.index({i})` (views of the stack: no copy), one after the other.
//! Thread-safety: a swap changes the module's tensors; do not run the module on another thread meanwhile.
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! swaps `params` into `module` (TensorDict::to_module, every check first) and restores the module's previous
//! tensors when it goes out of scope, an exception included (or at restore())
class ModuleSwap {
 public:
  ModuleSwap(const TensorDict& params, torch::nn::Module& module, const ToModuleOptions& options = {});
  ~ModuleSwap();
  ModuleSwap(const ModuleSwap&) = delete;
  ModuleSwap& operator=(const ModuleSwap&) = delete;
  ModuleSwap(ModuleSwap&& other) noexcept;
  ModuleSwap& operator=(ModuleSwap&&) = delete;

  //! puts the previous tensors back now (later calls do nothing); no check runs again: the swap recorded each
  //! tensor it changed and what it held
  void restore();
  //! what the module held before the swap (handles on its previous storage; built when first asked)
  const TensorDict& previous() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  mutable TensorDict previous_ = TensorDict::undefined();
};

}  // namespace tensordict
