// Modules and parameters: TensorDict::from_module, TensorDict::to_module, ModuleSwap (tensordict/module.hpp).
#include "tensordict/module.hpp"

#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "block_pool.hpp"
#include "tensordict/backends/shape_text.hpp"
#include "tensor_dict_internal.hpp"

namespace tensordict {

namespace {

//! the blocks of a leaf handle (its TensorImpl, its AutogradMeta): one size for both, 2,048 kept per thread
constexpr std::size_t kLeafBlock = 208;
using LeafBlocks = detail::BlockPool<kLeafBlock, 2048>;
void* take_leaf_block(std::size_t n) { return n <= kLeafBlock ? LeafBlocks::take() : ::operator new(n); }
void give_leaf_block(void* p, std::size_t n) noexcept {
  if (n <= kLeafBlock) {
    LeafBlocks::give(p);
  } else {
    ::operator delete(p);
  }
}

//! the AutogradMeta of a from_module leaf that requires grad, in a LeafBlocks block
struct LeafGradMeta final : torch::autograd::AutogradMeta {
  using torch::autograd::AutogradMeta::AutogradMeta;
  static void* operator new(std::size_t n) { return take_leaf_block(n); }
  static void operator delete(void* p, std::size_t n) noexcept { give_leaf_block(p, n); }
};

//! a TensorImpl on src's storage with src's sizes, strides, offset and contiguity flags, sharing src's version
//! counter (as detach() does: a write through it is a write of src for autograd's checks). Built without the
//! dispatcher and without TensorImpl's general constructor, which allocates a version counter only for it to be
//! replaced and recomputes what src already knows (a 100-layer from_module made 200 of them: a third of its
//! time). Only for a plain strided TensorImpl (checked by alias_of); behaves as a TensorImpl in every respect
struct AliasImpl final : c10::TensorImpl {
  explicit AliasImpl(const c10::TensorImpl& src)
      // the VIEW constructor takes the key set as given: without autograd keys it allocates no version counter
      : c10::TensorImpl(c10::TensorImpl::VIEW, c10::Storage(src.storage()),
                        src.key_set() - c10::autograd_dispatch_keyset_with_ADInplaceOrView, src.dtype()) {
    key_set_ = src.key_set() - c10::python_ks;
    version_counter_ = src.version_counter();
    sizes_and_strides_.set_sizes(src.sizes());
    sizes_and_strides_.set_strides(src.strides());
    storage_offset_ = src.storage_offset();
    numel_ = src.numel();
    is_contiguous_ = src.is_contiguous_default(at::MemoryFormat::Contiguous);
    is_channels_last_contiguous_ = src.is_contiguous_default(at::MemoryFormat::ChannelsLast);
    is_channels_last_3d_contiguous_ = src.is_contiguous_default(at::MemoryFormat::ChannelsLast3d);
    is_channels_last_ = src.is_strides_like_default(at::MemoryFormat::ChannelsLast);
    is_channels_last_3d_ = src.is_strides_like_default(at::MemoryFormat::ChannelsLast3d);
    is_non_overlapping_and_dense_ = src.is_non_overlapping_and_dense_default();
  }

  static void* operator new(std::size_t n) { return take_leaf_block(n); }
  static void operator delete(void* p, std::size_t n) noexcept { give_leaf_block(p, n); }

  //! whether src's metadata is all in its own fields (no custom or symbolic sizes and strides, no Python
  //! dispatch, not a TensorImpl subclass of another library): what the constructor copies is then all of it
  static bool can_alias(const c10::TensorImpl& src) {
    const auto& type = typeid(src);
    if (type != typeid(c10::TensorImpl) && type != typeid(AliasImpl)) return false;
    constexpr auto policy = &AliasImpl::matches_policy;  // protected: named through this class, called on src
    return src.has_storage() && src.layout() == c10::kStrided && !src.is_python_dispatch() &&
           !src.has_symbolic_sizes_strides() && !(src.*policy)(SizesStridesPolicy::CustomStrides) &&
           !src.key_set().has_any(c10::python_ks);
  }
};

//! a new handle on t's storage (same sizes, strides and offset, the same version counter) without autograd
//! history: what detach() gives, without the dispatcher (a 100-layer swap did 600 of them: most of its time)
at::Tensor alias_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  const c10::TensorImpl& src = *t.unsafeGetTensorImpl();
  if (!AliasImpl::can_alias(src)) return t.detach();
  return at::Tensor(c10::make_intrusive<AliasImpl>(src));
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

using Params = torch::OrderedDict<std::string, at::Tensor>;

//! a module's registered parameters, by reference: named_parameters(false) copies the OrderedDict with its hash
//! index on every call (most of a 100-layer swap's time). `parameters_` is protected in torch::nn::Module: a member
//! pointer formed in a derived class reads it from any Module
struct ParamsOf : torch::nn::Module {
  static const Params& get(const torch::nn::Module& m) { return m.*(&ParamsOf::parameters_); }
};

//! a module's buffers and children, by reference. Module keeps them private, and its accessors build copies on
//! every call: buffers(false) an OrderedDict of them (for an empty one too), children() and named_children() the
//! whole list of a Sequential (17% of a 100-layer from_module, callgrind). A private member is named the one way
//! the language allows without its class's consent: as an argument of an explicit template instantiation, which
//! is not access-checked ([temp.spec] "the usual access checking rules do not apply")
using Children = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;
struct BuffersTag {
  using type = Params torch::nn::Module::*;
  friend type member_of(BuffersTag);
};
struct ChildrenTag {
  using type = Children torch::nn::Module::*;
  friend type member_of(ChildrenTag);
};
template <class Tag, typename Tag::type M>
struct PrivateMember {
  friend typename Tag::type member_of(Tag) { return M; }
};
template struct PrivateMember<BuffersTag, &torch::nn::Module::buffers_>;
template struct PrivateMember<ChildrenTag, &torch::nn::Module::children_>;
const Params& buffers_of(const torch::nn::Module& m) { return m.*member_of(BuffersTag{}); }
const Children& children_of(const torch::nn::Module& m) { return m.*member_of(ChildrenTag{}); }

at::Tensor leaf_of(const at::Tensor& t, const FromModuleOptions& o) {
  if (o.use_state_dict()) return o.copy() ? t.detach().clone() : alias_of(t);
  at::Tensor out = o.copy() ? t.detach().clone() : alias_of(t);  // a new handle: a later swap leaves it alone
  if (!t.requires_grad()) return out;
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  if (!impl->autograd_meta() && typeid(*impl) == typeid(AliasImpl) && !out.is_inference()) {
    // what requires_grad_(true) makes for a fresh leaf, without its dispatch and checks (a floating dtype, as t's)
    impl->set_autograd_meta(std::make_unique<LeafGradMeta>(impl, true));
  } else {
    out.requires_grad_(true);
  }
  return out;
}

//! a strided tensor with a storage whose metadata may change (what swap_in changes directly)
bool plain_strided(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->allow_tensor_metadata_change() && t.has_storage() && !t.is_sparse() &&
         !t.is_quantized() && !t.is_nested();
}

//! target.set_(value) under no-grad, without the dispatcher: the module's tensor object keeps its identity
//! (requires_grad, grad, hooks) and takes value's storage, sizes, strides and offset; its version counter moves
//! as an in-place op moves it. Dtype and device were checked equal (match)
void swap_in(const at::Tensor& target, const at::Tensor& value) {
  c10::TensorImpl* impl = target.unsafeGetTensorImpl();
  if (!plain_strided(target) || !value.has_storage() || value.is_sparse() || value.is_quantized() ||
      value.dtype() != target.dtype()) {
    at::Tensor t = target;
    t.set_(alias_of(value));
    return;
  }
  impl->set_storage_keep_dtype(value.storage());
  // a swap between tensors of one layout (the common case: the shapes were checked equal) keeps the sizes and
  // strides, whose setter recomputes the contiguity flags
  if (target.sizes() != value.sizes() || target.strides() != value.strides())
    impl->set_sizes_and_strides(value.sizes(), value.strides());
  impl->set_storage_offset(value.storage_offset());
  impl->bump_version();
}

//! the level of `m`; nullopt when it holds no tensor and filter_empty. Built in place: the names are the
//! module's (unique, registered), the values tensors of a level with batch size [] (TensorDict::set would check
//! and look each key up)
std::optional<TensorDict> from_level(const torch::nn::Module& m, const FromModuleOptions& o) {
  std::vector<std::pair<std::string, Entry>> entries;
  // names are unique within each of the module's dicts: only a name in two of them can repeat
  const Params& params = ParamsOf::get(m);
  const Params& buffers = buffers_of(m);
  auto twice = [](const std::string& key) {
    return ValueError("from_module: '" + key + "' names two tensors of one module");
  };
  const Children& children = children_of(m);
  entries.reserve(params.size() + buffers.size() + children.size());
  for (const auto& kv : params)
    if (kv.value().defined()) entries.emplace_back(kv.key(), Entry(leaf_of(kv.value(), o)));
  for (const auto& kv : buffers) {
    if (!kv.value().defined()) continue;
    if (const at::Tensor* p = params.find(kv.key()); p && p->defined()) throw twice(kv.key());
    entries.emplace_back(kv.key(), Entry(leaf_of(kv.value(), o)));
  }
  {
    for (const auto& kv : children) {
      std::optional<TensorDict> sub = from_level(*kv.value(), o);
      if (!sub) continue;
      const at::Tensor* p = params.find(kv.key());
      const at::Tensor* b = buffers.find(kv.key());
      if ((p && p->defined()) || (b && b->defined())) throw twice(kv.key());
      entries.emplace_back(kv.key(), Entry(*sub));
    }
  }
  if (entries.empty() && o.filter_empty()) return std::nullopt;
  auto impl = std::make_shared<TensorDictImpl>();
  impl->entries = std::move(entries);
  return TensorDict(std::move(impl));
}

//! one module tensor and the value it takes
struct Slot {
  at::Tensor target;  //!< the module's own tensor (its registered parameter or buffer)
  at::Tensor value;
  int32_t level;    //!< where it is: Plan::levels[level], then key
  std::string key;
};

//! every slot of a TensorDict in a module, checked; levels[i] = (parent level, key), levels[0] the root
struct Plan {
  std::vector<Slot> slots;
  std::vector<std::pair<int32_t, std::string>> levels{{-1, ""}};

  std::vector<std::string> path_of(int32_t level, const std::string& key) const {
    std::vector<std::string> path{key};
    for (int32_t l = level; l > 0; l = levels[static_cast<size_t>(l)].first) path.push_back(levels[static_cast<size_t>(l)].second);
    return {path.rbegin(), path.rend()};
  }
  //! "a.b.key", for messages
  std::string where(int32_t level, const std::string& key) const {
    std::string out;
    for (const auto& part : path_of(level, key)) out = join(out, part);
    return out;
  }
};

//! whether the module holds any defined parameter or buffer (recursively)
bool holds_tensors(const torch::nn::Module& m) {
  for (const auto& kv : m.named_parameters(true))
    if (kv.value().defined()) return true;
  for (const auto& kv : m.named_buffers(true))
    if (kv.value().defined()) return true;
  return false;
}

//! fn(key, entry) for every entry of td's level: a dense level's own entries (no copy), items() otherwise
template <class F>
void for_each_entry(const TensorDict& td, F&& fn) {
  if (TensorDictImpl* d = td.node()->dense_node()) {
    for (const auto& kv : d->entries) fn(kv.first, kv.second);
    return;
  }
  for (const auto& kv : td.items()) fn(kv.first.parts()[0], kv.second);
}

//! pairs the TensorDict's level with the module's, checking everything; nothing is changed here
void match(const TensorDict& td, const torch::nn::Module& m, int32_t level, const ToModuleOptions& o, Plan& plan) {
  const Params& params = ParamsOf::get(m);
  const Params& buffers = buffers_of(m);
  const Children& children = children_of(m);
  size_t matched_params = 0, matched_buffers = 0, matched_children = 0;
  for_each_entry(td, [&](const std::string& k, const Entry& e) {
    const at::Tensor* target = nullptr;
    if (const at::Tensor* p = params.find(k); p && p->defined()) {
      target = p;
      ++matched_params;
    } else if (const at::Tensor* b = buffers.find(k); b && b->defined()) {
      target = b;
      ++matched_buffers;
    }
    const auto* child = children.find(k);
    if (e.is_tensor()) {
      if (!target) {
        if (child) throw TypeError("to_module: '" + plan.where(level, k) + "' is a submodule of the module, but the value is a tensor");
        throw KeyError("to_module: the module has no parameter or buffer '" + plan.where(level, k) + "'");
      }
      const at::Tensor& v = e.tensor();
      if (v.scalar_type() != target->scalar_type()) {
        throw TypeError("to_module: '" + plan.where(level, k) + "' is " + std::string(c10::toString(target->scalar_type())) +
                        " in the module, but the value is " + c10::toString(v.scalar_type()));
      }
      if (v.sizes() != target->sizes()) {
        throw ValueError("to_module: '" + plan.where(level, k) + "' has shape " + shape_text(target->sizes()) +
                         " in the module, but the value has shape " + shape_text(v.sizes()));
      }
      if (v.device() != target->device()) {
        throw ValueError("to_module: '" + plan.where(level, k) + "' is on " + target->device().str() +
                         " in the module, but the value is on " + v.device().str());
      }
      plan.slots.push_back(Slot{*target, v, level, k});
    } else if (e.is_tensordict()) {
      if (!child) {
        if (target) throw TypeError("to_module: '" + plan.where(level, k) + "' is a tensor of the module, but the value is a TensorDict");
        throw KeyError("to_module: the module has no submodule '" + plan.where(level, k) + "'");
      }
      ++matched_children;
      plan.levels.emplace_back(level, k);
      match(e.tensordict(), **child, static_cast<int32_t>(plan.levels.size() - 1), o, plan);
    } else {
      throw TypeError("to_module: '" + plan.where(level, k) + "' holds a " + std::string(Entry::kind_name(e.kind())) +
                      ", which a module cannot hold");
    }
  });
  if (!o.strict()) return;
  // every defined tensor and every submodule holding one must have had a value: counted, and looked for only
  // when the count says one is missing
  auto defined = [](const Params& d) {
    size_t n = 0;
    for (const auto& kv : d) n += kv.value().defined() ? 1 : 0;
    return n;
  };
  auto missing = [&](const std::string& k) {
    bool found = false;
    for_each_entry(td, [&](const std::string& key, const Entry&) { found = found || key == k; });
    return !found;
  };
  if (matched_params < defined(params))
    for (const auto& kv : params)
      if (kv.value().defined() && missing(kv.key()))
        throw KeyError("to_module: the module's parameter '" + plan.where(level, kv.key()) + "' has no value in the TensorDict");
  if (matched_buffers < defined(buffers))
    for (const auto& kv : buffers)
      if (kv.value().defined() && missing(kv.key()))
        throw KeyError("to_module: the module's buffer '" + plan.where(level, kv.key()) + "' has no value in the TensorDict");
  if (matched_children < children.size())
    for (const auto& kv : children)
      if (holds_tensors(*kv.value()) && missing(kv.key()))
        throw KeyError("to_module: the module's submodule '" + plan.where(level, kv.key()) + "' has no value in the TensorDict");
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
Plan plan_slots(const TensorDict& td, const torch::nn::Module& module, const ToModuleOptions& options) {
  if (!td.defined()) throw ValueError("to_module: the TensorDict is undefined");
  Plan plan;
  match(td, module, 0, options, plan);
  return plan;
}

//! what a module tensor held before a swap: its storage, offset, sizes and strides (no new tensor: a swap of
//! 200 leaves made 200 of them); a tensor where that cannot be restored alone (a copy-in's clone, a tensor
//! whose metadata cannot change). The sizes too: the user may resize_ or t_() the module's tensor during the
//! swap, and the old storage under the new sizes would be read past its end
struct Held {
  at::Tensor tensor;
  c10::Storage storage;
  int64_t offset = 0;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
};

Held hold(const at::Tensor& target, bool copy_in) {
  Held h;
  if (copy_in) {
    h.tensor = target.detach().clone();
  } else if (plain_strided(target)) {
    h.storage = target.storage();
    h.offset = target.storage_offset();
    h.sizes.assign(target.sizes().begin(), target.sizes().end());
    h.strides.assign(target.strides().begin(), target.strides().end());
  } else {
    h.tensor = alias_of(target);
  }
  return h;
}

//! puts back what `target` held, sizes included
void give_back(const at::Tensor& target, const Held& h, bool copy_in) {
  if (h.tensor.defined()) {
    if (copy_in) {
      alias_of(target).copy_(h.tensor);
    } else {
      swap_in(target, h.tensor);
    }
    return;
  }
  c10::TensorImpl* impl = target.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(h.storage);
  if (target.sizes() != c10::IntArrayRef(h.sizes) || target.strides() != c10::IntArrayRef(h.strides))
    impl->set_sizes_and_strides(h.sizes, h.strides);
  impl->set_storage_offset(h.offset);
  impl->bump_version();
}

//! a handle on what `target` held (for previous())
at::Tensor held_tensor(const at::Tensor& target, const Held& h) {
  if (h.tensor.defined()) return h.tensor;
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(h.storage), target.key_set(), target.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(h.sizes, h.strides);
  out.unsafeGetTensorImpl()->set_storage_offset(h.offset);
  return out;
}

//! writes the slots' values into the module; `previous` (when given) gets what each slot held before, recorded
//! before any slot changes (a tensor registered under two names, shared parameters, is recorded as it was)
void apply_slots(const std::vector<Slot>& slots, bool copy_in, std::vector<Held>* previous) {
  at::NoGradGuard no_grad;
  if (previous) {
    previous->reserve(slots.size());
    for (const auto& s : slots) previous->push_back(hold(s.target, copy_in));
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

TensorDict previous_td(const Plan& plan, const std::vector<Held>& previous) {
  TensorDict out{BatchSize{}};
  for (size_t i = 0; i < plan.slots.size(); ++i)
    out.set(NestedKey(plan.path_of(plan.slots[i].level, plan.slots[i].key)), held_tensor(plan.slots[i].target, previous[i]));
  return out;
}

}  // namespace

TensorDict TensorDict::to_module(torch::nn::Module& module, const ToModuleOptions& options) const {
  const Plan plan = plan_slots(*this, module, options);
  const bool copy_in = options.inplace() || options.use_state_dict();
  if (!options.return_swap()) {
    apply_slots(plan.slots, copy_in, nullptr);
    return TensorDict::undefined();
  }
  std::vector<Held> previous;
  apply_slots(plan.slots, copy_in, &previous);
  return previous_td(plan, previous);
}

struct ModuleSwap::State {
  Plan plan;
  std::vector<Held> previous;
  bool copy_in = false;
  bool restored = false;
};

ModuleSwap::ModuleSwap(const TensorDict& params, torch::nn::Module& module, const ToModuleOptions& options)
    : state_(std::make_unique<State>()) {
  state_->plan = plan_slots(params, module, options);
  state_->copy_in = options.inplace() || options.use_state_dict();
  apply_slots(state_->plan.slots, state_->copy_in, &state_->previous);
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
  for (size_t i = state_->plan.slots.size(); i-- > 0;)
    give_back(state_->plan.slots[i].target, state_->previous[i], state_->copy_in);
}

const TensorDict& ModuleSwap::previous() const {
  if (!previous_.defined() && state_) previous_ = previous_td(state_->plan, state_->previous);
  return previous_;
}

}  // namespace tensordict
