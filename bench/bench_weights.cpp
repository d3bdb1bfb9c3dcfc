//! bench_weights (issue 36): a 100-layer MLP's parameters (200 leaves, 100 MiB) saved and loaded with memmap
//! against torch::save / torch::load of the same module, alternated in one run:
//!  - save: td.memmap(dir) (not durable; one thread and two) vs torch::save(model, file); durable: memmap(dir,
//!    durable) vs torch::save + fsync of its file; the floor: the same bytes written into one new file by one
//!    write(2) (what no save of them can beat);
//!  - load into the module: from_module(model).load_memmap_(dir, inplace) (the bytes read into its own storage,
//!    one thread and two), load_memmap(dir).to_module(model, inplace) (mapped, then copied) and the default swap
//!    (the module takes the mapped storage; its first forward reads it) vs torch::load(model, file);
//!  - from_module + to_module swap and restore of the whole MLP (us).
//! Prints one JSON object; ratios are torch's time over ours (> 1: we are faster).
//! The file system decides the saves: on ext4 without a journal (the machines this project runs on), each new
//! inode is searched past every inode deleted in the last 60-300 s (ext4's recently_deleted), so a memmap save
//! (~400 new files) right after a test run measures those deletions (47% of its profile once); torch::save makes
//! one file. Run it on a quiet file system, and with TMPDIR=/dev/shm for the copies without a disk file system.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <tensordict/module.hpp>
#include <tensordict/tensordict.hpp>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include "bench_common.hpp"

using namespace tensordict;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

//! medians of `ours` and `theirs`, alternated `reps` times (each after its `before`)
std::pair<double, double> alternate(int reps, const std::function<void()>& ours, const std::function<void()>& theirs,
                                    const std::function<void()>& before) {
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    before();
    a.push_back(seconds_of(ours));
    before();
    b.push_back(seconds_of(theirs));
  }
  return {benchutil::median(a), benchutil::median(b)};
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t layers = argc > 1 ? std::stoll(argv[1]) : 100;
  const int64_t width = argc > 2 ? std::stoll(argv[2]) : 512;
  const int reps = 5;
  std::string tmpl = (fs::temp_directory_path() / "td-bench-weights-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return 1;
  const std::string dir = tmpl, prefix = dir + "/params", file = dir + "/model.pt";
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) model->push_back(torch::nn::Linear(width, width));
  const TensorDict params = TensorDict::from_module(*model);
  const double mib = static_cast<double>(params.bytes()) / (1024.0 * 1024.0);
  auto clean = [&] {
    std::error_code ec;
    fs::remove_all(prefix, ec);
    fs::remove(file, ec);
  };
  TensorDict saved;
  // every save goes to a new directory / file, removed after the timed part: on ext4 without a journal, a new
  // inode is searched past every inode deleted in the last ~30 s (ext4's recently_deleted), so saving over a
  // copy deleted just before measured the file system's allocator (45% of the profile), not the save
  int n = 0;
  auto fresh = [&] { return dir + "/s" + std::to_string(n++); };
  if (argc > 3 && std::string(argv[3]) == "swap-only") {  // for a profiler: from_module + swap + restore
    const TensorDict other = params.clone();
    const int n = argc > 4 ? std::max(1, std::atoi(argv[4])) : 3000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      TensorDict p = TensorDict::from_module(*model);
      ModuleSwap swap(other, *model);
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) (void)TensorDict::from_module(*model);
    const auto t2 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) ModuleSwap swap(other, *model);
    const auto t3 = std::chrono::steady_clock::now();
    auto us = [n](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / n; };
    std::printf("{\"from_module_swap_restore_us\": %.1f, \"from_module_us\": %.1f, \"swap_restore_us\": %.1f}\n",
                us(t0, t1), us(t1, t2), us(t2, t3));
    fs::remove_all(dir);
    return 0;
  }
  if (argc > 3 && std::string(argv[3]) == "save-only") {  // for a profiler: memmap saves alone [threads]
    const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
    for (int r = 0; r < 20; ++r) saved = params.memmap(fresh(), MemmapOptions().num_threads(threads));
    saved = TensorDict();
    fs::remove_all(dir);
    return 0;
  }
  // every timed save below writes new page cache: ~40 saves of the parameters, on pages the host has backed
  const double warmed_gib = benchutil::warm_guest_memory(static_cast<size_t>(params.bytes()) * 48);
  // the floor of any save: the same bytes (already in one buffer) written into one new file with one write(2)
  const at::Tensor all_bytes = params.consolidate().consolidated_storage();
  auto [floor_s, tsave0_s] = alternate(
      reps,
      [&] {
        const int fd = ::open(fresh().c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
        const char* p = static_cast<const char*>(all_bytes.data_ptr());
        for (size_t done = 0, n = static_cast<size_t>(all_bytes.numel()); done < n;) {
          const ssize_t w = ::write(fd, p + done, n - done);
          if (w <= 0) break;
          done += static_cast<size_t>(w);
        }
        ::close(fd);
      },
      [&] { torch::save(model, fresh()); }, [] {});
  auto [save_s, tsave_s] = alternate(
      reps, [&] { saved = params.memmap(fresh()); }, [&] { torch::save(model, fresh()); }, [&] { saved = TensorDict(); });
  auto [save2_s, tsave2_s] = alternate(
      reps, [&] { saved = params.memmap(fresh(), MemmapOptions().num_threads(2)); }, [&] { torch::save(model, fresh()); },
      [&] { saved = TensorDict(); });
  auto [dsave_s, tdsave_s] = alternate(
      reps, [&] { saved = params.memmap(fresh(), MemmapOptions().durable(true)); },
      [&] {
        const std::string f = fresh();
        torch::save(model, f);
        fsync_file(f);
      },
      [&] { saved = TensorDict(); });
  saved = TensorDict();
  clean();
  params.memmap(prefix);
  torch::save(model, file);
  torch::nn::Sequential target(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
  const at::Tensor x = at::randn({8, width});
  auto [load_copy_s, tload_s] = alternate(
      reps,
      [&] {
        TensorDict::load_memmap(prefix).to_module(*target, ToModuleOptions().inplace(true).return_swap(false));
      },
      [&] { torch::load(target, file); }, [] {});
  // the bytes read straight into the module's own storage (pread: no mapping, no page faults on fresh memory)
  auto [load_read_s, tload3_s] = alternate(
      reps, [&] { TensorDict::from_module(*target).load_memmap_(prefix, LoadOptions().inplace(true)); },
      [&] { torch::load(target, file); }, [] {});
  auto [load_read2_s, tload4_s] = alternate(
      reps, [&] { TensorDict::from_module(*target).load_memmap_(prefix, LoadOptions().inplace(true).num_threads(2)); },
      [&] { torch::load(target, file); }, [] {});
  // the default swap: the module takes the mapped storage (no copy); then one read per 4 KiB page of every
  // parameter, what any first use pays (the page faults of the mapping), for both
  auto touch = [&] {
    volatile float sink = 0;
    for (const auto& p : target->parameters()) {
      const float* d = p.data_ptr<float>();
      for (int64_t i = 0; i < p.numel(); i += 1024) sink = sink + d[i];
    }
  };
  auto [load_map_s, tload5_s] = alternate(
      reps,
      [&] {
        TensorDict::load_memmap(prefix).to_module(*target, ToModuleOptions().return_swap(false));
        touch();
      },
      [&] {
        torch::load(target, file);
        touch();
      },
      [] {});
  // the same, followed by a forward pass
  auto [load_swap_s, tload2_s] = alternate(
      reps,
      [&] {
        TensorDict::load_memmap(prefix).to_module(*target, ToModuleOptions().return_swap(false));
        target->forward(x);
      },
      [&] {
        torch::load(target, file);
        target->forward(x);
      },
      [] {});
  // swap in and back out (what ModuleSwap costs), from from_module on
  std::vector<double> swap_us;
  const TensorDict other = params.clone();
  for (int r = 0; r < 200; ++r) {
    const auto t0 = Clock::now();
    {
      TensorDict p = TensorDict::from_module(*model);
      ModuleSwap swap(other, *model);
    }
    swap_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  clean();
  std::error_code ec;
  fs::remove_all(dir, ec);
  benchutil::Json j;
  j.str("benchmark", "weights")
      .num("layers", static_cast<double>(layers), 0)
      .num("leaves", static_cast<double>(params.keys(KeysOptions().include_nested(true).leaves_only(true)).size()), 0)
      .num("MiB", mib, 1)
      .num("warmed_GiB", warmed_gib, 1)
      .num("write_floor_s", floor_s, 4)
      .num("write_floor_vs_torch", tsave0_s / floor_s, 2)
      .num("memmap_save_s", save_s, 4)
      .num("torch_save_s", tsave_s, 4)
      .num("save_vs_torch", tsave_s / save_s, 2)
      .num("memmap_save_2threads_s", save2_s, 4)
      .num("save_2threads_vs_torch", tsave2_s / save2_s, 2)
      .num("durable_memmap_save_s", dsave_s, 4)
      .num("torch_save_fsync_s", tdsave_s, 4)
      .num("durable_save_vs_torch_fsync", tdsave_s / dsave_s, 2)
      .num("load_read_into_module_s", load_read_s, 4)
      .num("load_read_vs_torch", tload3_s / load_read_s, 2)
      .num("load_read_2threads_s", load_read2_s, 4)
      .num("load_read_2threads_vs_torch", tload4_s / load_read2_s, 2)
      .num("load_copy_into_module_s", load_copy_s, 4)
      .num("torch_load_s", tload_s, 4)
      .num("load_copy_vs_torch", tload_s / load_copy_s, 2)
      .num("load_map_swap_touch_s", load_map_s, 4)
      .num("torch_load_touch_s", tload5_s, 4)
      .num("load_map_swap_vs_torch", tload5_s / load_map_s, 2)
      .num("load_swap_forward_s", load_swap_s, 4)
      .num("torch_load_forward_s", tload2_s, 4)
      .num("load_swap_vs_torch", tload2_s / load_swap_s, 2)
      .num("from_module_swap_restore_us", benchutil::median(swap_us), 1);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
