// Modules and parameters (issue 36): TensorDict::from_module / to_module and ModuleSwap over real libtorch
// modules: Sequential, nested custom modules with buffers, shared and frozen parameters, empty modules, every
// mismatch (the module is left as it was), the guard restoring on scope exit and on exceptions, memmap round
// trips and slices, ensembles through stacked params.
#include <boost/test/unit_test.hpp>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/optim/sgd.h>

#include "engine/zoo.hpp"
#include "fixtures.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/module.hpp"

#include <filesystem>
#include <thread>

using namespace tensordict;
using zoo::throws_with;
using fixtures::TempDir;

namespace {

torch::nn::Sequential mlp(int64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
}

//! a module with its own parameter, a buffer, a child with a BatchNorm (running buffers) and an empty child
struct NetImpl : torch::nn::Module {
  NetImpl() {
    scale = register_parameter("scale", torch::ones({3}));
    steps = register_buffer("steps", torch::zeros({}, torch::kLong));
    block = register_module("block", torch::nn::Sequential(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3)));
    act = register_module("act", torch::nn::ReLU());
  }
  torch::Tensor forward(torch::Tensor x) { return act->forward(block->forward(x * scale)); }
  torch::Tensor scale, steps;
  torch::nn::Sequential block{nullptr};
  torch::nn::ReLU act{nullptr};
};
TORCH_MODULE(Net);

//! every parameter and buffer of m by dotted name, cloned (what the module holds now)
std::map<std::string, at::Tensor> state_of(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : m.named_parameters()) out[kv.key()] = kv.value().detach().clone();
  for (const auto& kv : m.named_buffers()) out[kv.key()] = kv.value().detach().clone();
  return out;
}

bool same_state(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& kv : a) {
    auto it = b.find(kv.first);
    if (it == b.end() || !kv.second.equal(it->second)) return false;
  }
  return true;
}

//! params with every leaf replaced by `v` (same shapes and dtypes, new storage)
TensorDict filled(const TensorDict& params, double v) {
  return params.apply([v](const at::Tensor& t) { return at::full_like(t, v).detach(); });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(module)

BOOST_AUTO_TEST_CASE(from_module_follows_the_module_tree_and_aliases_its_storage) {
  auto seq = mlp(1);
  TensorDict p = TensorDict::from_module(*seq);
  BOOST_TEST(p.batch_size() == BatchSize({}));
  // upstream's keys: submodules by name, the ReLU (no tensor) left out; weight then bias (registration order)
  BOOST_TEST(p.keys() == std::vector<NestedKey>({NestedKey("0"), NestedKey("2")}));
  BOOST_TEST(p.get_td("0").keys() == std::vector<NestedKey>({NestedKey("weight"), NestedKey("bias")}));
  auto lin0 = seq->ptr(0)->as<torch::nn::Linear>();
  BOOST_TEST(p.get({"0", "weight"}).equal(lin0->weight));
  BOOST_TEST(p.get({"0", "weight"}).requires_grad());
  // the same storage: a write to the value reaches the module
  {
    at::NoGradGuard g;
    p.get({"2", "bias"}).fill_(5.0);
  }
  BOOST_TEST(seq->ptr(2)->as<torch::nn::Linear>()->bias.eq(5.0).all().item<bool>());
  // copies when asked, detached leaves for the state dict, an empty Sequential gives an empty TensorDict
  TensorDict c = TensorDict::from_module(*seq, FromModuleOptions().copy(true));
  BOOST_TEST(c.get({"0", "weight"}).data_ptr() != lin0->weight.data_ptr());
  BOOST_TEST(!TensorDict::from_module(*seq, FromModuleOptions().use_state_dict(true)).get({"0", "weight"}).requires_grad());
  BOOST_TEST(TensorDict::from_module(*torch::nn::Sequential(torch::nn::ReLU())).is_empty());
  BOOST_TEST(TensorDict::from_module(*torch::nn::Sequential(torch::nn::ReLU()), FromModuleOptions().filter_empty(false))
                 .contains("0"));
  BOOST_TEST(TensorDict::from_module(*seq, FromModuleOptions().lock(true)).is_locked());
}

BOOST_AUTO_TEST_CASE(to_module_swaps_storage_and_returns_the_previous_values) {
  auto seq = mlp(2);
  const auto before = state_of(*seq);
  TensorDict p = TensorDict::from_module(*seq);
  TensorDict zeros = filled(p, 0.0);
  auto lin0 = seq->ptr(0)->as<torch::nn::Linear>();
  at::TensorImpl* own = lin0->weight.unsafeGetTensorImpl();
  TensorDict prev = zeros.to_module(*seq);
  // the module keeps its own tensor objects (and requires_grad) on the values' storage
  BOOST_TEST(lin0->weight.unsafeGetTensorImpl() == own);
  BOOST_TEST(lin0->weight.data_ptr() == zeros.get({"0", "weight"}).data_ptr());
  BOOST_TEST(lin0->weight.requires_grad());
  BOOST_TEST(seq->forward(at::ones({1, 4})).eq(0).all().item<bool>());
  // what from_module returned before is unchanged by the swap, and the swap returned the same values
  BOOST_TEST(p.get({"0", "weight"}).equal(before.at("0.weight")));
  BOOST_TEST(prev.get({"2", "bias"}).equal(before.at("2.bias")));
  prev.to_module(*seq, ToModuleOptions().return_swap(false));
  BOOST_TEST(same_state(state_of(*seq), before));
  // inplace: the module's storage stays, the values are copied in
  const void* ptr = lin0->weight.data_ptr();
  TensorDict old = filled(p, 3.0).to_module(*seq, ToModuleOptions().inplace(true));
  BOOST_TEST(lin0->weight.data_ptr() == ptr);
  BOOST_TEST(lin0->weight.eq(3.0).all().item<bool>());
  BOOST_TEST(old.get({"0", "weight"}).equal(before.at("0.weight")));
}

BOOST_AUTO_TEST_CASE(module_swap_restores_on_scope_exit_and_on_exceptions) {
  auto seq = mlp(3);
  const auto before = state_of(*seq);
  const at::Tensor x = at::randn({5, 4});
  const at::Tensor y = seq->forward(x).detach();
  TensorDict other = TensorDict::from_module(*mlp(4), FromModuleOptions().copy(true));
  auto twin = mlp(4);
  {
    ModuleSwap swap(other, *seq);
    BOOST_TEST(seq->forward(x).allclose(twin->forward(x)));
    BOOST_TEST(!seq->forward(x).allclose(y));
    BOOST_TEST(swap.previous().get({"0", "weight"}).equal(before.at("0.weight")));
  }
  BOOST_TEST(same_state(state_of(*seq), before));
  BOOST_TEST(seq->forward(x).equal(y));
  try {
    ModuleSwap swap(other, *seq);
    throw std::runtime_error("fn failed");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(same_state(state_of(*seq), before));
  // gradients reach the module's own parameters while the swap holds
  {
    ModuleSwap swap(other, *seq);
    seq->forward(x).sum().backward();
    BOOST_TEST(seq->ptr(0)->as<torch::nn::Linear>()->weight.grad().defined());
  }
}

// the module's tensors resized or transposed by the user while a swap holds: the restore gives back their own
// sizes with their own storage (restoring the storage under the new sizes read past its end), and previous()
// shows what they held
BOOST_AUTO_TEST_CASE(a_swap_restores_sizes_changed_while_it_holds) {
  auto bn = torch::nn::BatchNorm1d(4);
  bn->running_mean.copy_(at::arange(4, at::kFloat));
  auto seq = mlp(7);
  auto* lin = seq->ptr(0)->as<torch::nn::Linear>();
  const at::Tensor w_before = lin->weight.detach().clone();
  TensorDict params = TensorDict::from_module(*bn).clone();
  TensorDict other = TensorDict::from_module(*seq, FromModuleOptions().copy(true));
  {
    ModuleSwap swap(params, *bn);
    bn->running_mean.resize_({1 << 16});
    BOOST_TEST(swap.previous().get("running_mean").sizes().vec() == std::vector<int64_t>{4});
  }
  BOOST_TEST(bn->running_mean.sizes().vec() == std::vector<int64_t>{4});
  BOOST_TEST(bn->running_mean.equal(at::arange(4, at::kFloat)));
  {
    ModuleSwap swap(other, *seq);
    at::NoGradGuard no_grad;
    lin->weight.t_();
  }
  BOOST_TEST(lin->weight.sizes().vec() == w_before.sizes().vec());
  BOOST_TEST(lin->weight.equal(w_before));
}

// a value with other strides (a transposed view) swaps in as it is, and the restore gives the module back its own
// storage, offset and strides; previous() is built from what was recorded
BOOST_AUTO_TEST_CASE(a_swap_of_a_strided_view_restores_strides_and_offset) {
  auto seq = mlp(5);
  auto* lin = seq->ptr(0)->as<torch::nn::Linear>();
  const at::Tensor w_before = lin->weight.detach().clone();
  const auto strides_before = lin->weight.strides().vec();
  const void* data_before = lin->weight.data_ptr();
  TensorDict other = TensorDict::from_module(*seq, FromModuleOptions().copy(true));
  const at::Tensor base = at::randn({5, 4, 8});
  const at::Tensor view = base[2].t();  // [8, 4], strides [1, 8], offset 64
  other.set({"0", "weight"}, view);
  {
    ModuleSwap swap(other, *seq);
    BOOST_TEST(lin->weight.equal(view));
    BOOST_TEST(lin->weight.strides().vec() == view.strides().vec());
    BOOST_TEST(lin->weight.storage_offset() == view.storage_offset());
    BOOST_TEST(swap.previous().get({"0", "weight"}).equal(w_before));
    BOOST_TEST(swap.previous().get({"0", "weight"}).strides().vec() == strides_before);
  }
  BOOST_TEST(lin->weight.equal(w_before));
  BOOST_TEST(lin->weight.strides().vec() == strides_before);
  BOOST_TEST(lin->weight.storage_offset() == 0);
  BOOST_TEST(lin->weight.data_ptr() == data_before);
  BOOST_TEST(lin->weight.is_contiguous());
}

BOOST_AUTO_TEST_CASE(nested_modules_with_buffers_round_trip) {
  Net net;
  net->block->ptr(1)->as<torch::nn::BatchNorm1d>()->running_mean.fill_(0.5);
  TensorDict p = TensorDict::from_module(*net);
  BOOST_TEST(p.keys() == std::vector<NestedKey>({NestedKey("scale"), NestedKey("steps"), NestedKey("block")}));
  BOOST_TEST(p.get({"block", "1", "running_mean"}).eq(0.5).all().item<bool>());
  BOOST_TEST(p.contains({"block", "1", "num_batches_tracked"}));
  BOOST_TEST(p.get("steps").scalar_type() == at::kLong);
  const auto before = state_of(*net);
  {
    ModuleSwap swap(filled(p, 2.0), *net);
    BOOST_TEST(net->block->ptr(1)->as<torch::nn::BatchNorm1d>()->running_var.eq(2.0).all().item<bool>());
    BOOST_TEST(net->steps.item<int64_t>() == 2);
  }
  BOOST_TEST(same_state(state_of(*net), before));
}

BOOST_AUTO_TEST_CASE(shared_and_frozen_parameters) {
  // one tensor under two names
  auto lin = torch::nn::Linear(3, 3);
  lin->register_parameter("tied", lin->weight);
  TensorDict p = TensorDict::from_module(*lin);
  BOOST_TEST(p.contains("tied"));
  BOOST_TEST(p.get("tied").data_ptr() == p.get("weight").data_ptr());
  const at::Tensor w = lin->weight.detach().clone();
  {
    TensorDict v = filled(p, 7.0);
    v.set("tied", v.get("weight"));  // tied in the values too
    ModuleSwap swap(v, *lin);
    BOOST_TEST(lin->weight.eq(7.0).all().item<bool>());
    BOOST_TEST(swap.previous().get("tied").equal(w));  // recorded before either name changed it
  }
  BOOST_TEST(lin->weight.equal(w));
  // a frozen parameter stays frozen; its value keeps requires_grad false
  auto seq = mlp(5);
  seq->ptr(0)->as<torch::nn::Linear>()->weight.requires_grad_(false);
  TensorDict q = TensorDict::from_module(*seq);
  BOOST_TEST(!q.get({"0", "weight"}).requires_grad());
  BOOST_TEST(q.get({"0", "bias"}).requires_grad());
  filled(q, 1.0).to_module(*seq, ToModuleOptions().return_swap(false));
  BOOST_TEST(!seq->ptr(0)->as<torch::nn::Linear>()->weight.requires_grad());
  BOOST_TEST(seq->ptr(0)->as<torch::nn::Linear>()->bias.requires_grad());
}

BOOST_AUTO_TEST_CASE(leaves_share_the_parameters_version_counter_as_detach_does) {
  auto seq = mlp(11);
  auto lin0 = seq->ptr(0)->as<torch::nn::Linear>();
  auto lin2 = seq->ptr(2)->as<torch::nn::Linear>();
  TensorDict p = TensorDict::from_module(*seq);
  const at::Tensor w = p.get({"0", "weight"});
  BOOST_TEST(w.unsafeGetTensorImpl() != lin0->weight.unsafeGetTensorImpl());  // a new handle
  BOOST_TEST(w.is_leaf());
  BOOST_TEST(w.grad_fn() == nullptr);
  const auto v0 = lin0->weight._version();
  {
    at::NoGradGuard g;
    w.mul_(1.0);  // an in-place write through the value is a write of the parameter
  }
  BOOST_TEST(lin0->weight._version() == v0 + 1);
  // so autograd sees it: a graph that saved the parameter refuses its backward after the write
  const at::Tensor x = torch::randn({2, 4});
  at::Tensor y = seq->forward(x).sum();
  {
    at::NoGradGuard g;
    p.get({"2", "weight"}).mul_(1.0);
  }
  BOOST_CHECK_THROW(y.backward(), c10::Error);
  // a value takes part in autograd as a leaf of its own (the module's parameter gets no gradient from it)
  at::Tensor z = (p.get({"2", "weight"}) * 3.0).sum();
  z.backward();
  BOOST_TEST(p.get({"2", "weight"}).grad().defined());
  BOOST_TEST(p.get({"2", "weight"}).grad().eq(3.0).all().item<bool>());
  BOOST_TEST(!lin2->weight.grad().defined());
}

BOOST_AUTO_TEST_CASE(optimizers_step_values_and_parameters_alike) {
  // the values are leaves of their own that alias the parameters' storage: an optimizer over the values (their
  // gradients from a loss over them) moves the module's weights, and one over the module moves the values. (A
  // forward of the module records its own parameters, not the values: C++ modules are not functional, see
  // module.hpp)
  auto seq = mlp(14);
  TensorDict p = TensorDict::from_module(*seq);
  std::vector<at::Tensor> values;
  for (const auto& key : p.keys(KeysOptions().leaves_only(true).include_nested(true))) values.push_back(p.get(key));
  BOOST_TEST_REQUIRE(values.size() == 4U);
  auto lin0 = seq->ptr(0)->as<torch::nn::Linear>();
  const at::Tensor w0 = lin0->weight.detach().clone();
  torch::optim::SGD over_values(values, torch::optim::SGDOptions(0.1));
  over_values.zero_grad();
  at::Tensor loss = p.get({"0", "weight"}).pow(2).sum();
  loss.backward();
  BOOST_TEST(p.get({"0", "weight"}).grad().defined());
  BOOST_TEST(!lin0->weight.grad().defined());
  over_values.step();
  BOOST_TEST(lin0->weight.allclose(w0 * 0.8));  // w - 0.1 * 2w, in the module's own storage
  torch::optim::SGD over_module(seq->parameters(), torch::optim::SGDOptions(0.5));
  over_module.zero_grad();
  seq->forward(torch::ones({3, 4})).sum().backward();
  const at::Tensor g = lin0->weight.grad().clone();
  const at::Tensor before = p.get({"0", "weight"}).detach().clone();
  over_module.step();
  BOOST_TEST(p.get({"0", "weight"}).allclose(before - 0.5 * g));
}

//! a module whose tensors are laid out every way a strided tensor can be
struct LayoutsImpl : torch::nn::Module {
  LayoutsImpl() {
    torch::manual_seed(12);
    conv = register_parameter("conv", torch::randn({4, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast));
    conv3d = register_parameter("conv3d", torch::randn({2, 3, 2, 4, 4}).contiguous(torch::MemoryFormat::ChannelsLast3d));
    const at::Tensor base = torch::arange(60.0).view({10, 6});
    register_buffer("transposed", base.t());
    register_buffer("offset", base.narrow(0, 3, 4));
    register_buffer("strided", base.index({at::indexing::Slice(1, at::indexing::None, 3), at::indexing::Slice(0, at::indexing::None, 2)}));
    register_buffer("expanded", torch::ones({3, 1}).expand({3, 4}));
    register_buffer("scalar", torch::tensor(2.5));
    register_buffer("empty", torch::empty({0, 3}));
    register_buffer("ints", torch::arange(6, torch::kInt32).view({2, 3}));
  }
  at::Tensor conv, conv3d;
};
TORCH_MODULE(Layouts);

BOOST_AUTO_TEST_CASE(leaves_keep_every_layout_of_the_modules_tensors) {
  Layouts m;
  TensorDict p = TensorDict::from_module(*m);
  std::vector<std::pair<std::string, at::Tensor>> own;
  for (const auto& kv : m->named_parameters()) own.emplace_back(kv.key(), kv.value());
  for (const auto& kv : m->named_buffers()) own.emplace_back(kv.key(), kv.value());
  BOOST_TEST(own.size() == 9U);
  for (const auto& [key, t] : own) {
    BOOST_TEST_CONTEXT(key) {
      const at::Tensor v = p.get(key);
      const at::Tensor d = t.detach();  // libtorch's own handle on the same tensor: what the flags must be
      BOOST_TEST(v.sizes() == d.sizes());
      BOOST_TEST(v.strides() == d.strides());
      BOOST_TEST(v.storage_offset() == d.storage_offset());
      BOOST_TEST(v.numel() == d.numel());
      BOOST_TEST(v.dtype() == d.dtype());
      BOOST_TEST(v.device() == d.device());
      BOOST_TEST(v.is_contiguous() == d.is_contiguous());
      BOOST_TEST(v.is_contiguous(torch::MemoryFormat::ChannelsLast) == d.is_contiguous(torch::MemoryFormat::ChannelsLast));
      BOOST_TEST(v.is_contiguous(torch::MemoryFormat::ChannelsLast3d) == d.is_contiguous(torch::MemoryFormat::ChannelsLast3d));
      BOOST_TEST(v.is_non_overlapping_and_dense() == d.is_non_overlapping_and_dense());
      BOOST_TEST(v.suggest_memory_format() == d.suggest_memory_format());
      BOOST_TEST(v.requires_grad() == t.requires_grad());
      BOOST_TEST(v.is_alias_of(t));
      BOOST_TEST(v.equal(t));
      // and what libtorch computes from the sizes and strides agrees: a contiguous() copy equals the value
      BOOST_TEST(v.contiguous().equal(d.contiguous()));
    }
  }
  BOOST_TEST(p.get("conv").is_contiguous(torch::MemoryFormat::ChannelsLast));  // the cases are what they claim
  BOOST_TEST(!p.get("transposed").is_contiguous());
  BOOST_TEST(p.get("offset").storage_offset() == 18);
  // values made under inference mode alias too, and stay inference tensors
  auto lin = torch::nn::Linear(2, 2);
  {
    c10::InferenceMode guard;
    lin->register_buffer("frozen", torch::ones({2}));
  }
  TensorDict q = TensorDict::from_module(*lin);
  BOOST_TEST(q.get("frozen").is_inference());
  BOOST_TEST(q.get("frozen").data_ptr() == lin->named_buffers()["frozen"].data_ptr());
  BOOST_TEST(!q.get("weight").is_inference());
}

BOOST_AUTO_TEST_CASE(leaves_made_on_one_thread_and_dropped_on_another) {
  // a leaf's TensorImpl and AutogradMeta come from a per-thread list of blocks: a leaf dropped on a thread that
  // then ends, and many more leaves than the list keeps, are all freed (the sanitizer build checks for leaks)
  auto seq = mlp(13);
  std::vector<TensorDict> made;
  for (int r = 0; r < 40; ++r) made.push_back(TensorDict::from_module(*seq));  // 160 leaves
  std::thread dropper([moved = std::move(made)]() mutable { moved.clear(); });
  dropper.join();
  std::vector<TensorDict> more;
  std::thread maker([&] {
    for (int r = 0; r < 1500; ++r) more.push_back(TensorDict::from_module(*seq));  // 6,000 leaves
  });
  maker.join();
  bool same = true;
  for (const auto& td : more) same = same && td.get({"0", "weight"}).equal(seq->ptr(0)->as<torch::nn::Linear>()->weight);
  BOOST_TEST(same);
  more.clear();  // 12,000 blocks freed here, most past what the list keeps
  TensorDict again = TensorDict::from_module(*seq);
  BOOST_TEST(again.get({"2", "bias"}).equal(seq->ptr(2)->as<torch::nn::Linear>()->bias));
}

BOOST_AUTO_TEST_CASE(every_mismatch_is_a_typed_error_and_changes_nothing) {
  auto seq = mlp(6);
  const auto before = state_of(*seq);
  const void* ptr = seq->ptr(0)->as<torch::nn::Linear>()->weight.data_ptr();
  const TensorDict p = filled(TensorDict::from_module(*seq), 1.0);
  auto check_untouched = [&] {
    BOOST_TEST(same_state(state_of(*seq), before));
    BOOST_TEST(seq->ptr(0)->as<torch::nn::Linear>()->weight.data_ptr() == ptr);
  };
  TensorDict extra = p.clone();
  extra.set({"2", "gain"}, at::ones({2}));
  BOOST_TEST(throws_with<KeyError>([&] { extra.to_module(*seq); }, {"'2.gain'", "no parameter or buffer"}));
  check_untouched();
  TensorDict missing = p.clone();
  missing.del({"2", "bias"});
  BOOST_TEST(throws_with<KeyError>([&] { missing.to_module(*seq); }, {"'2.bias'", "has no value"}));
  check_untouched();
  TensorDict no_sub = p.clone();
  no_sub.del("2");
  BOOST_TEST(throws_with<KeyError>([&] { no_sub.to_module(*seq); }, {"submodule '2'"}));
  // a part of the module, when asked; its previous values put back the same way
  no_sub.to_module(*seq, ToModuleOptions().strict(false)).to_module(*seq, ToModuleOptions().strict(false));
  check_untouched();
  TensorDict shape = p.clone();
  shape.set({"0", "bias"}, at::ones({9}));
  BOOST_TEST(throws_with<ValueError>([&] { shape.to_module(*seq); }, {"'0.bias'", "[8]", "[9]"}));
  check_untouched();
  TensorDict dtype = p.clone();
  dtype.set({"0", "weight"}, at::ones({8, 4}, at::kDouble));
  BOOST_TEST(throws_with<TypeError>([&] { dtype.to_module(*seq); }, {"'0.weight'", "Double"}));
  check_untouched();
  TensorDict flat = p.clone();
  flat.set("0", at::ones({1}));
  BOOST_TEST(throws_with<TypeError>([&] { flat.to_module(*seq); }, {"'0'", "submodule"}));
  check_untouched();
  TensorDict nt = p.clone();
  nt.set_non_tensor({"0", "tag"}, JsonValue("x"));
  BOOST_TEST(throws_with<TypeError>([&] { nt.to_module(*seq); }, {"'0.tag'"}));
  check_untouched();
}

BOOST_AUTO_TEST_CASE(weights_saved_with_memmap_load_whole_or_by_slice) {
  TempDir dir("module");
  auto seq = mlp(7);
  TensorDict::from_module(*seq).memmap(dir.path + "/w");
  auto other = mlp(8);
  TensorDict loaded = TensorDict::load_memmap(dir.path + "/w");
  loaded.to_module(*other, ToModuleOptions().return_swap(false));
  const at::Tensor x = at::randn({3, 4});
  BOOST_TEST(other->forward(x).equal(seq->forward(x)));
  BOOST_TEST(other->ptr(0)->as<torch::nn::Linear>()->weight.requires_grad());  // the module's flag stays
  // a slice: the directory of the first layer into the first layer of a third model
  auto third = mlp(9);
  TensorDict::load_memmap(dir.path + "/w/0").to_module(*third->ptr(0), ToModuleOptions().inplace(true));
  BOOST_TEST(third->ptr(0)->as<torch::nn::Linear>()->weight.equal(seq->ptr(0)->as<torch::nn::Linear>()->weight));
  BOOST_TEST(!third->ptr(2)->as<torch::nn::Linear>()->weight.equal(seq->ptr(2)->as<torch::nn::Linear>()->weight));
}

// LoadOptions::inplace: the saved bytes read into the module's own storage (from_module's aliases), whole, by slice
// and with threads; a mismatch of any kind, or a truncated file, is an error naming it and changes nothing
BOOST_AUTO_TEST_CASE(weights_read_in_place_into_the_modules_storage) {
  TempDir dir("module_inplace");
  auto seq = mlp(7);
  TensorDict::from_module(*seq).memmap(dir.path + "/w");
  const at::Tensor x = at::randn({3, 4});
  for (int threads : {0, 2}) {
    auto other = mlp(8);
    auto* w0 = other->ptr(0)->as<torch::nn::Linear>();
    const void* data_before = w0->weight.data_ptr();
    TensorDict::from_module(*other).load_memmap_(dir.path + "/w", LoadOptions().inplace(true).num_threads(threads));
    BOOST_TEST(other->forward(x).equal(seq->forward(x)));
    BOOST_TEST(w0->weight.data_ptr() == data_before);  // the module's own storage, written in place
    BOOST_TEST(w0->weight.requires_grad());
  }
  // a slice into one layer
  auto third = mlp(9);
  TensorDict::from_module(*third->ptr(0)).load_memmap_(dir.path + "/w/0", LoadOptions().inplace(true));
  BOOST_TEST(third->ptr(0)->as<torch::nn::Linear>()->weight.equal(seq->ptr(0)->as<torch::nn::Linear>()->weight));
  BOOST_TEST(!third->ptr(2)->as<torch::nn::Linear>()->weight.equal(seq->ptr(2)->as<torch::nn::Linear>()->weight));
  // a non-contiguous leaf is read through a buffer
  TensorDict td(BatchSize{});
  td.set("a", at::zeros({4, 3}).t());
  TensorDict src(BatchSize{});
  src.set("a", at::arange(12, at::kFloat).view({3, 4}));
  src.memmap(dir.path + "/t");
  td.load_memmap_(dir.path + "/t", LoadOptions().inplace(true));
  BOOST_TEST(td.get("a").equal(src.get("a")));
  // ... also a view of a parameter (it requires grad) on a reading thread of its own: written without autograd
  const at::Tensor param = at::zeros({4, 3}).requires_grad_(true);
  TensorDict grads(BatchSize{});
  grads.set("a", param.t());
  grads.set("b", at::zeros({2}));
  TensorDict src2 = src.clone();
  src2.set("b", at::ones({2}));
  src2.memmap(dir.path + "/t2");
  grads.load_memmap_(dir.path + "/t2", LoadOptions().inplace(true).num_threads(2));
  BOOST_TEST(param.t().equal(src.get("a")));
  BOOST_TEST(grads.get("b").equal(at::ones({2})));
  // mismatches: nothing is written
  auto target = mlp(10);
  const auto before = state_of(*target);
  auto wide = torch::nn::Sequential(torch::nn::Linear(4, 9), torch::nn::ReLU(), torch::nn::Linear(9, 2));
  TensorDict::from_module(*wide).memmap(dir.path + "/wide");
  BOOST_TEST(throws_with<ValueError>([&] { TensorDict::from_module(*target).load_memmap_(dir.path + "/wide", LoadOptions().inplace(true)); },
                                     {"0.weight"}));
  auto dbl = mlp(11);
  dbl->to(at::kDouble);
  TensorDict::from_module(*dbl).memmap(dir.path + "/double");
  BOOST_TEST(throws_with<TypeError>([&] { TensorDict::from_module(*target).load_memmap_(dir.path + "/double", LoadOptions().inplace(true)); },
                                    {"Double"}));
  TensorDict fewer = TensorDict::from_module(*seq).exclude({NestedKey({"2", "bias"})});
  fewer.memmap(dir.path + "/fewer");
  BOOST_TEST(throws_with<KeyError>([&] { TensorDict::from_module(*target).load_memmap_(dir.path + "/fewer", LoadOptions().inplace(true)); },
                                   {"2.bias"}));
  TensorDict more = TensorDict::from_module(*seq).clone();
  more.set({"2", "extra"}, at::zeros({1}));
  more.memmap(dir.path + "/more");
  BOOST_TEST(throws_with<KeyError>([&] { TensorDict::from_module(*target).load_memmap_(dir.path + "/more", LoadOptions().inplace(true)); },
                                   {"2.extra"}));
  // a lazy stack hands out stacked copies, not its storage: refused (the bytes would be lost), nothing written
  TensorDict member(Dict{{"x", at::zeros({2})}}, {});
  LazyStackedTensorDict stacked = lazy_stack({member, member.clone()}, 0);
  TensorDict(Dict{{"x", at::ones({2, 2})}}, {2}).memmap(dir.path + "/stacked");
  BOOST_TEST(throws_with<TypeError>([&] { stacked.load_memmap_(dir.path + "/stacked", LoadOptions().inplace(true)); },
                                    {"LazyStackedTensorDict", "update_"}));
  BOOST_TEST(member.get("x").eq(0).all().item<bool>());
  // a truncated last leaf (in save order): found before any leaf is read
  std::filesystem::resize_file(dir.path + "/w/2/bias.memmap", 4);
  BOOST_TEST(throws_with<FormatError>([&] { TensorDict::from_module(*target).load_memmap_(dir.path + "/w", LoadOptions().inplace(true)); },
                                      {"truncated"}));
  BOOST_TEST(same_state(state_of(*target), before));
}

BOOST_AUTO_TEST_CASE(an_ensemble_runs_member_by_member_on_stacked_params) {
  std::vector<torch::nn::Sequential> members = {mlp(10), mlp(11), mlp(12)};
  std::vector<TensorDict> params;
  for (auto& m : members) params.push_back(TensorDict::from_module(*m));
  TensorDict stacked = tensordict::stack(params, 0);
  BOOST_TEST(stacked.batch_size() == BatchSize({3}));
  auto model = mlp(13);
  const at::Tensor x = at::randn({2, 4});
  for (int64_t i = 0; i < 3; ++i) {
    ModuleSwap swap(stacked.index({i}), *model);  // views of the stack: no copy
    BOOST_TEST(model->forward(x).allclose(members[static_cast<size_t>(i)]->forward(x)));
  }
}

// interop (upstream's layout both ways): tests/data/python_weights was written by Python tensordict v0.14.0
// (TensorDict.from_module(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))).memmap(dir), with an input
// and that model's output on it: scripts/python_weights.py); the C++ model of the same layers loads it and gives
// the same output. The reverse direction: weights_for_python below writes test-tmp/cpp_weights, which
// scripts/python_weights.py --check loads into the Python model (run by hand with the peer, shared/peer/)
BOOST_AUTO_TEST_CASE(weights_written_by_python_load_into_the_same_cpp_model) {
  const std::string data = (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "python_weights").string();
  BOOST_REQUIRE_MESSAGE(std::filesystem::exists(data + "/params/meta.json"), "missing fixture " << data);
  TensorDict params = TensorDict::load_memmap(data + "/params");
  BOOST_TEST(params.keys() == std::vector<NestedKey>({NestedKey("0"), NestedKey("2")}));
  auto model = mlp(99);
  params.to_module(*model, ToModuleOptions().return_swap(false));
  TensorDict io = TensorDict::load_memmap(data + "/io");
  BOOST_TEST(model->forward(io.get("x")).allclose(io.get("y"), 1e-5, 1e-6));
}

BOOST_AUTO_TEST_CASE(weights_for_python) {
  const std::string out = std::string(TD_BINARY_DIR) + "/test-tmp/cpp_weights";
  std::filesystem::remove_all(out);
  auto model = mlp(21);
  TensorDict::from_module(*model).memmap(out + "/params");
  const at::Tensor x = at::randn({3, 4});
  at::NoGradGuard g;
  TensorDict io({{"x", x}, {"y", model->forward(x)}}, {3});
  io.memmap(out + "/io");
  BOOST_TEST(TensorDict::load_memmap(out + "/params").keys() == std::vector<NestedKey>({NestedKey("0"), NestedKey("2")}));
}

BOOST_AUTO_TEST_SUITE_END()
