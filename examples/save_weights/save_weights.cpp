// save_weights: a 100-layer MLP's weights saved and loaded both ways — TensorDict::from_module(model).memmap(dir)
// and TensorDict::load_memmap(dir).to_module(model), against torch::save / torch::load of the module — printing
// both times and their ratio; then the model runs on other weights swapped in (ModuleSwap: the C++ spelling of
// upstream's `with params.to_module(model):`), and on each member of a small ensemble of stacked weights.
//
//   save_weights [--layers N] [--width W] [--dir DIR]      (default: 100 layers of 512 x 512, a temporary DIR)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <tensordict/module.hpp>
#include <tensordict/tensordict.hpp>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

using namespace tensordict;
namespace fs = std::filesystem;

namespace {
template <class F>
double seconds(F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

torch::nn::Sequential make_mlp(int64_t layers, int64_t width) {
  torch::nn::Sequential m;
  for (int64_t i = 0; i < layers; ++i) {
    m->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) m->push_back(torch::nn::ReLU());
  }
  return m;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 100, width = 512;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--layers") layers = std::atoll(argv[i + 1]);
    else if (a == "--width") width = std::atoll(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  if (layers < 1 || width < 1) {
    std::fprintf(stderr, "--layers and --width must be positive\n");
    return 2;
  }
  const bool own_dir = dir.empty();
  if (own_dir) {
    std::string tmpl = (fs::temp_directory_path() / "td-save-weights-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return 1;
    dir = tmpl;
  }
  try {
    torch::manual_seed(0);
    torch::nn::Sequential model = make_mlp(layers, width);
    TensorDict params = TensorDict::from_module(*model);
    std::printf("model: %lld Linear layers of %lld x %lld, %zu tensors, %.1f MiB\n", static_cast<long long>(layers),
                static_cast<long long>(width), static_cast<long long>(width),
                params.keys(KeysOptions().include_nested(true).leaves_only(true)).size(),
                static_cast<double>(params.bytes()) / (1 << 20));

    // save both ways (each into a new place)
    const std::string pdir = dir + "/params", pfile = dir + "/model.pt";
    const double t_td_save = seconds([&] { params.memmap(pdir); });
    const double t_torch_save = seconds([&] { torch::save(model, pfile); });
    // load both ways into a second model of the same layers
    torch::nn::Sequential other = make_mlp(layers, width);
    const double t_td_load = seconds([&] {
      TensorDict::load_memmap(pdir).to_module(*other, ToModuleOptions().inplace(true).return_swap(false));
    });
    const double t_torch_load = seconds([&] { torch::load(other, pfile); });
    std::printf("save:  memmap %.1f ms, torch::save %.1f ms (torch / memmap = %.2f)\n", 1e3 * t_td_save,
                1e3 * t_torch_save, t_torch_save / t_td_save);
    std::printf("load:  load_memmap + to_module %.1f ms, torch::load %.1f ms (torch / memmap = %.2f)\n", 1e3 * t_td_load,
                1e3 * t_torch_load, t_torch_load / t_td_load);

    // the loaded weights give the same outputs; a slice of the directory loads into one layer
    const at::Tensor x = at::randn({4, width});
    at::NoGradGuard no_grad;
    const at::Tensor y = model->forward(x);
    if (!other->forward(x).equal(y)) throw RuntimeError("the loaded model differs");
    TensorDict::load_memmap(pdir + "/0").to_module(*other->ptr(0));

    // run on other weights, swapped in for a scope; the model's own come back after it
    TensorDict zeros = params.apply([](const at::Tensor& t) { return at::zeros_like(t); });
    {
      ModuleSwap swap(zeros, *model);
      std::printf("swapped-in zero weights: output sum %.1f\n", model->forward(x).sum().item<double>());
    }
    if (!model->forward(x).equal(y)) throw RuntimeError("the swap did not restore the model");
    std::printf("after the scope: the model's own weights again (output unchanged)\n");

    // an ensemble: stacked weights of 3 models, member by member (C++ has no vmap)
    std::vector<TensorDict> members;
    for (int i = 0; i < 3; ++i) members.push_back(TensorDict::from_module(*make_mlp(layers, width), FromModuleOptions().copy(true)));
    TensorDict stacked = tensordict::stack(members, 0);
    for (int64_t i = 0; i < 3; ++i) {
      ModuleSwap swap(stacked.index({i}), *model);
      std::printf("ensemble member %lld: output mean %.5f\n", static_cast<long long>(i), model->forward(x).mean().item<double>());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "save_weights: %s\n", e.what());
    if (own_dir) fs::remove_all(dir);
    return 1;
  }
  if (own_dir) fs::remove_all(dir);
  return 0;
}
