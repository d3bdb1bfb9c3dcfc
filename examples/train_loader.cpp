// train_loader: a small libtorch training loop fed by the DataLoader (DESIGN.md: multi-process data loaders).
// It writes a synthetic regression dataset to a memmap directory (x [N, 16] float32, y = f(x) + noise), then
// trains a 2-layer MLP on it for a few epochs, reading shuffled batches through a DataLoader with 2 worker
// PROCESSES (this program again: main registers the per-batch transform, then run_worker_if_requested). The
// workers gather each batch straight into a shared-memory ring slot and run the transform there; the trainer
// gets the batch zero-copy. Per epoch it prints the loss, samples/s and the time the trainer waited for data.
// Usage: train_loader [--rows N] [--epochs E] [--batch B] [--workers K] [--dir DIR] [--keep]
// Exits 1 when the model did not learn (final loss not below a quarter of the first epoch's).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <tensordict/tensordict.hpp>
#include <torch/torch.h>

using namespace tensordict;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kFeatures = 16;

//! the per-batch transform the workers run: standardise x (the dataset's x is in [0, 10))
TensorDict normalize(const TensorDict& batch) {
  TensorDict out(batch.batch_size());
  out.set("x", (batch.get("x") - 5.0f) / 2.9f);
  out.set("y", batch.get("y"));
  return out;
}

TensorDict make_dataset(int64_t rows, const std::string& dir) {
  torch::manual_seed(0);
  at::Tensor x = torch::rand({rows, kFeatures}) * 10;
  at::Tensor w = torch::linspace(-1, 1, kFeatures);
  at::Tensor xn = (x - 5.0f) / 2.9f;
  at::Tensor y = (xn.matmul(w) + 0.5 * torch::sin(xn.select(1, 0) * 2) + 0.01 * torch::randn({rows})).unsqueeze(1);
  TensorDict td({{"x", x}, {"y", y}}, {rows});
  return td.memmap_(dir);  // the workers reopen it by its directory
}

}  // namespace

int main(int argc, char** argv) {
  register_map_fn("train_normalize", normalize);  // in the trainer and in every worker process
  run_worker_if_requested(argc, argv);            // a worker process serves batches inside and exits

  int64_t rows = 200000, epochs = 3, batch = 256, workers = 2;
  bool keep = false;
  std::string dir = (std::filesystem::temp_directory_path() / ("td_train_loader_" + std::to_string(::getpid()))).string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) rows = std::stoll(argv[++i]);
    else if (a == "--epochs" && i + 1 < argc) epochs = std::stoll(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = std::stoll(argv[++i]);
    else if (a == "--workers" && i + 1 < argc) workers = std::stoll(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--keep") keep = true;
    else {
      std::fprintf(stderr, "usage: train_loader [--rows N] [--epochs E] [--batch B] [--workers K] [--dir DIR] [--keep]\n");
      return 2;
    }
  }
  int rc = 0;
  try {
    TensorDict data = make_dataset(rows, dir);
    DataLoader loader(data, LoaderOptions()
                                .batch_size(batch)
                                .shuffle(true)
                                .seed(0)
                                .worker_processes(workers)
                                .persistent_workers(true)
                                .transform_name("train_normalize"));
    torch::manual_seed(1);
    torch::nn::Sequential model(torch::nn::Linear(kFeatures, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
    std::printf("train_loader: %lld rows x %lld features (memmap), batch %lld, %lld worker processes, %lld batches/epoch\n",
                static_cast<long long>(rows), static_cast<long long>(kFeatures), static_cast<long long>(batch),
                static_cast<long long>(workers), static_cast<long long>(loader.size()));
    double first_loss = -1, last_loss = -1;
    for (int64_t e = 0; e < epochs; ++e) {
      const auto t0 = Clock::now();
      double loss_sum = 0;
      int64_t n = 0;
      for (TensorDict b : loader) {
        at::Tensor pred = model->forward(b.get("x"));
        at::Tensor loss = torch::mse_loss(pred, b.get("y"));
        opt.zero_grad();
        loss.backward();
        opt.step();
        loss_sum += loss.item<double>();
        ++n;
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const LoaderStats st = loader.stats();
      const double loss = loss_sum / static_cast<double>(n);
      if (first_loss < 0) first_loss = loss;
      last_loss = loss;
      std::printf("epoch %lld: loss %.4f, %.0f samples/s, trainer waited %.3f s for data (%.1f%% of %.2f s)\n",
                  static_cast<long long>(e), loss, static_cast<double>(st.samples) / secs, st.wait_s,
                  100.0 * st.wait_s / secs, secs);
      std::fflush(stdout);
    }
    if (!(last_loss < first_loss * 0.25)) {
      std::fprintf(stderr, "train_loader: the model did not learn (loss %.4f -> %.4f)\n", first_loss, last_loss);
      rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_loader: %s\n", e.what());
    rc = 1;
  }
  if (!keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return rc;
}
