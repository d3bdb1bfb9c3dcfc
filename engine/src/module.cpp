// Modules and parameters: TensorDict::from_module, TensorDict::to_module, ModuleSwap (tensordict/module.hpp).
#include "tensordict/module.hpp"

#include <torch/nn/module.h>

#include "tensordict/backends/shape_text.hpp"
#include "tensor_dict_internal.hpp"

namespace tensordict {

namespace {

//! a new handle on t's storage (same sizes, strides and offset) without autograd history: what detach() gives,
//! without the dispatcher (a 100-layer swap did 600 of them: most of its time)
at::Tensor alias_of(const at::Tensor& t) {
  if (!t.defined() || t.is_sparse() || t.is_quantized() || t.is_nested() || !t.has_storage()) return t.detach();
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides());
  out.unsafeGetTensorImpl()->set_storage_offset(t.storage_offset());
  return out;
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

at::Tensor leaf_of(const at::Tensor& t, const FromModuleOptions& o) {
  if (o.use_state_dict()) return o.copy() ? t.detach().clone() : alias_of(t);
  at::Tensor out = o.copy() ? t.detach().clone() : alias_of(t);  // a new handle: a later swap leaves it alone
  if (t.requires_grad()) out.requires_grad_(true);
  return out;
}

//! target.set_(value) under no-grad, without the dispatcher: the module's tensor object keeps its identity
//! (requires_grad, grad, hooks) and takes value's storage, sizes, strides and offset; its version counter moves
//! as an in-place op moves it. Dtype and device were checked equal (match)
void swap_in(const at::Tensor& target, const at::Tensor& value) {
  c10::TensorImpl* impl = target.unsafeGetTensorImpl();
  if (!impl->allow_tensor_metadata_change() || !value.has_storage() || value.is_sparse() || value.is_quantized() ||
      target.is_nested() || value.dtype() != target.dtype()) {
    at::Tensor t = target;
    t.set_(alias_of(value));
    return;
  }
  impl->set_storage_keep_dtype(value.storage());
  impl->set_sizes_and_strides(value.sizes(), value.strides());
  impl->set_storage_offset(value.storage_offset());
  impl->bump_version();
}

//! the level of `m`; nullopt when it holds no tensor and filter_empty. Built in place: the names are the
//! module's (unique, registered), the values tensors of a level with batch size [] (TensorDict::set would check
//! and look each key up)
std::optional<TensorDict> from_level(const torch::nn::Module& m, const FromModuleOptions& o) {
  std::vector<std::pair<std::string, Entry>> entries;
  auto add = [&](const std::string& key, Entry value) {
    for (const auto& kv : entries)
      if (kv.first == key) throw ValueError("from_module: '" + key + "' names two tensors of one module");
    entries.emplace_back(key, std::move(value));
  };
  // the named forms copy an OrderedDict with its index: asked only where the plain (vector) form finds something
  if (!m.parameters(/*recurse=*/false).empty())
    for (const auto& kv : m.named_parameters(/*recurse=*/false))
      if (kv.value().defined()) add(kv.key(), Entry(leaf_of(kv.value(), o)));
  if (!m.buffers(/*recurse=*/false).empty())
    for (const auto& kv : m.named_buffers(/*recurse=*/false))
      if (kv.value().defined()) add(kv.key(), Entry(leaf_of(kv.value(), o)));
  if (!m.children().empty()) {
    for (const auto& kv : m.named_children()) {
      std::optional<TensorDict> sub = from_level(*kv.value(), o);
      if (sub) add(kv.key(), Entry(*sub));
    }
  }
  if (entries.empty() && o.filter_empty()) return std::nullopt;
  auto impl = std::make_shared<TensorDictImpl>();
  impl->entries = std::move(entries);
  return TensorDict(std::move(impl));
}

//! one module tensor and the value it takes
struct Slot {
  std::vector<std::string> path;
  at::Tensor target;  //!< the module's own tensor (its registered parameter or buffer)
  at::Tensor value;
};

//! whether the module holds any defined parameter or buffer (recursively)
bool holds_tensors(const torch::nn::Module& m) {
  for (const auto& kv : m.named_parameters(true))
    if (kv.value().defined()) return true;
  for (const auto& kv : m.named_buffers(true))
    if (kv.value().defined()) return true;
  return false;
}

//! pairs the TensorDict's level with the module's, checking everything; nothing is changed here
void match(const TensorDict& td, const torch::nn::Module& m, std::vector<std::string>& path, const std::string& prefix,
           const ToModuleOptions& o, std::vector<Slot>& out) {
  // the named forms copy an OrderedDict with its index: asked only where the plain (vector) form finds something
  using Params = torch::OrderedDict<std::string, at::Tensor>;
  using Children = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;
  const Params params = m.parameters(false).empty() ? Params() : m.named_parameters(false);
  const Params buffers = m.buffers(false).empty() ? Params() : m.named_buffers(false);
  const Children children = m.children().empty() ? Children() : m.named_children();
  auto tensor_of = [&](const std::string& k) -> const at::Tensor* {
    if (const at::Tensor* p = params.find(k); p && p->defined()) return p;
    if (const at::Tensor* b = buffers.find(k); b && b->defined()) return b;
    return nullptr;
  };
  std::vector<std::string> seen;
  for (const auto& kv : td.items()) {
    const std::string& k = kv.first.parts()[0];
    auto where_fn = [&] { return join(prefix, k); };  // built for messages only
    seen.push_back(k);
    const at::Tensor* target = tensor_of(k);
    const auto* child = children.find(k);
    if (kv.second.is_tensor()) {
      if (!target) {
        const std::string where = where_fn();
        if (child) throw TypeError("to_module: '" + where + "' is a submodule of the module, but the value is a tensor");
        throw KeyError("to_module: the module has no parameter or buffer '" + where + "'");
      }
      const at::Tensor& v = kv.second.tensor();
      if (v.scalar_type() != target->scalar_type() || v.sizes() != target->sizes() || v.device() != target->device()) {
        const std::string where = where_fn();
      if (v.scalar_type() != target->scalar_type()) {
        throw TypeError("to_module: '" + where + "' is " + std::string(c10::toString(target->scalar_type())) +
                        " in the module, but the value is " + c10::toString(v.scalar_type()));
      }
      if (v.sizes() != target->sizes()) {
        throw ValueError("to_module: '" + where + "' has shape " + shape_text(target->sizes()) +
                         " in the module, but the value has shape " + shape_text(v.sizes()));
      }
      if (v.device() != target->device()) {
        throw ValueError("to_module: '" + where + "' is on " + target->device().str() + " in the module, but the value is on " +
                         v.device().str());
      }
      }
      path.push_back(k);
      out.push_back(Slot{path, *target, v});
      path.pop_back();
    } else if (kv.second.is_tensordict()) {
      if (!child) {
        const std::string where = where_fn();
        if (target) throw TypeError("to_module: '" + where + "' is a tensor of the module, but the value is a TensorDict");
        throw KeyError("to_module: the module has no submodule '" + where + "'");
      }
      path.push_back(k);
      match(kv.second.tensordict(), **child, path, where_fn(), o, out);
      path.pop_back();
    } else {
      throw TypeError("to_module: '" + where_fn() + "' holds a " + std::string(Entry::kind_name(kv.second.kind())) +
                      ", which a module cannot hold");
    }
  }
  if (!o.strict()) return;
  auto has = [&](const std::string& k) { return std::find(seen.begin(), seen.end(), k) != seen.end(); };
  for (const auto& kv : params)
    if (kv.value().defined() && !has(kv.key()))
      throw KeyError("to_module: the module's parameter '" + join(prefix, kv.key()) + "' has no value in the TensorDict");
  for (const auto& kv : buffers)
    if (kv.value().defined() && !has(kv.key()))
      throw KeyError("to_module: the module's buffer '" + join(prefix, kv.key()) + "' has no value in the TensorDict");
  for (const auto& kv : children)
    if (!has(kv.key()) && holds_tensors(*kv.value()))
      throw KeyError("to_module: the module's submodule '" + join(prefix, kv.key()) + "' has no value in the TensorDict");
}

}  // namespace

TensorDict TensorDict::from_module(const torch::nn::Module& module, const FromModuleOptions& options) {
  std::optional<TensorDict> td = from_level(module, options);
  TensorDict out = td ? *td : TensorDict(BatchSize{});
  if (options.lock()) out.lock_();
  return out;
}

namespace {

//! every slot of td in module, checked (nothing changed yet)
std::vector<Slot> plan_slots(const TensorDict& td, const torch::nn::Module& module, const ToModuleOptions& options) {
  if (!td.defined()) throw ValueError("to_module: the TensorDict is undefined");
  std::vector<Slot> slots;
  std::vector<std::string> path;
  match(td, module, path, "", options, slots);
  return slots;
}

//! writes the slots' values into the module; `previous` (when given) gets what each slot held before, recorded
//! before any slot changes (a tensor registered under two names, shared parameters, is recorded as it was)
void apply_slots(const std::vector<Slot>& slots, bool copy_in, std::vector<at::Tensor>* previous) {
  at::NoGradGuard no_grad;
  if (previous) {
    previous->reserve(slots.size());
    for (const auto& s : slots) previous->push_back(copy_in ? s.target.detach().clone() : alias_of(s.target));
  }
  for (const auto& s : slots) {
    if (copy_in) {
      alias_of(s.target).copy_(s.value);
    } else {
      // the module keeps its tensor object (requires_grad, grad, hooks); its storage becomes the value's
      swap_in(s.target, s.value);
    }
  }
}

TensorDict previous_td(const std::vector<Slot>& slots, const std::vector<at::Tensor>& previous) {
  TensorDict out{BatchSize{}};
  for (size_t i = 0; i < slots.size(); ++i) out.set(NestedKey(slots[i].path), previous[i]);
  return out;
}

}  // namespace

TensorDict TensorDict::to_module(torch::nn::Module& module, const ToModuleOptions& options) const {
  const std::vector<Slot> slots = plan_slots(*this, module, options);
  const bool copy_in = options.inplace() || options.use_state_dict();
  if (!options.return_swap()) {
    apply_slots(slots, copy_in, nullptr);
    return TensorDict::undefined();
  }
  std::vector<at::Tensor> previous;
  apply_slots(slots, copy_in, &previous);
  return previous_td(slots, previous);
}

struct ModuleSwap::State {
  std::vector<Slot> slots;
  std::vector<at::Tensor> previous;
  bool copy_in = false;
  bool restored = false;
};

ModuleSwap::ModuleSwap(const TensorDict& params, torch::nn::Module& module, const ToModuleOptions& options)
    : state_(std::make_unique<State>()) {
  state_->slots = plan_slots(params, module, options);
  state_->copy_in = options.inplace() || options.use_state_dict();
  apply_slots(state_->slots, state_->copy_in, &state_->previous);
}

ModuleSwap::ModuleSwap(ModuleSwap&& other) noexcept = default;

ModuleSwap::~ModuleSwap() {
  try {
    restore();
  } catch (...) {
    // putting back what was checked and swapped in cannot mismatch; nothing to report from a destructor
  }
}

void ModuleSwap::restore() {
  if (!state_ || state_->restored) return;
  state_->restored = true;
  at::NoGradGuard no_grad;
  // the previous tensors back, last slot first (a tensor under two names ends as it was)
  for (size_t i = state_->slots.size(); i-- > 0;) {
    const at::Tensor& target = state_->slots[i].target;
    if (state_->copy_in) {
      alias_of(target).copy_(state_->previous[i]);
    } else {
      swap_in(target, state_->previous[i]);
    }
  }
}

const TensorDict& ModuleSwap::previous() const {
  if (!previous_.defined() && state_) previous_ = previous_td(state_->slots, state_->previous);
  return previous_;
}

}  // namespace tensordict
