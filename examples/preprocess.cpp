// The main job: parallel preprocessing with map (DESIGN.md, first use).
// 1. builds a synthetic image dataset (N uint8 images 3x64x64 + labels) in a memmap TensorDict with
//    from_schema (files preallocated sparse, filled block by block),
// 2. maps a transform (horizontal flip, normalise to float16, label bucketing) over it with the
//    configured workers, written in place into a preallocated memmap `out`, with a progress bar (`out` is made
//    first, and its pages faulted in on another thread while the dataset is synthesised: `prefault`),
// 3. reloads the output from disk as Python would (load_memmap) and verifies every row against the transform
//    run on whole blocks (no slabs),
// 4. prints the map's throughput next to the floor: the same transform over the same chunks in one thread
//    on in-memory tensors (no map, no memmap), i.e. what one core does with the transform alone.
// Usage: preprocess [--rows N] [--dir DIR] [--keep] [--workers K] [--chunk C] [--kernel fused|torch] [--slab R]
//                   [--cold] [--no-prefault]
//   --cold: before the usual (warm) map, a cold one into a second output: the dataset dropped from the page
//     cache and read back from disk, malloc's free memory returned, as on a first run; prints both (COLD: line)
//   --no-prefault: the output's pages are not faulted in on another thread while the dataset is synthesised
//   --kernel fused (default): the transform in one pass through a table of its 256 results (transform_fused);
//   --kernel torch: libtorch's kernels (flip, copy, mul, sub, copy) on slabs of R rows (0: whole chunks)
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <mutex>
#include <vector>

#include <ATen/Parallel.h>
#include <tensordict/memmap_storage.hpp>
#include <tensordict/tensordict.hpp>

using namespace tensordict;
using at::indexing::Slice;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kC = 3, kH = 64, kW = 64, kLabels = 100, kBuckets = 10;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

//! deterministic synthetic rows [start, start+n): pixel values and labels are functions of the row
TensorDict synth_block(int64_t start, int64_t n) {
  at::Tensor rows = at::arange(start, start + n, at::kLong);
  // uint8 arithmetic wraps modulo 256: pixel = (131 * row + 7 * p) mod 256 without int64 temporaries
  at::Tensor row_part = (rows * 131 % 256).to(at::kByte).view({n, 1});
  at::Tensor pix_part = (at::arange(kC * kH * kW, at::kLong) * 7 % 256).to(at::kByte).view({1, -1});
  at::Tensor image = at::add(row_part, pix_part).view({n, kC, kH, kW});
  at::Tensor label = (rows * 37) % kLabels;
  return TensorDict(Dict{{"image", image}, {"label", label}}, {n});
}

//! the float16 output buffers of the transforms, shared by every thread that runs one: take(n) hands out a
//! [n, C, H, W] view of a free buffer, and the buffer comes back here when the last handle on that view is gone
//! (map has written the chunk into `out`). warm() makes buffers ahead of the map, on a thread that would
//! otherwise wait: on these VMs the first touch of fresh memory costs 10-40 us a 4 KiB page, and the two workers'
//! first chunks spent 40% of a 0.3 s map faulting in the 12 MB buffers each thread used to allocate (perf)
class HalfBuffers {
 public:
  static HalfBuffers& get() {
    static HalfBuffers* pool = new HalfBuffers();  // never destroyed: a buffer may come back during exit
    return *pool;
  }
  //! `count` buffers of `rows` rows, every page written
  void warm(size_t count, int64_t rows) {
    std::vector<at::Tensor> made;
    for (size_t i = 0; i < count; ++i) made.push_back(at::zeros({rows, kC, kH, kW}, at::kHalf));
    std::lock_guard<std::mutex> g(mu_);
    for (auto& t : made) free_.push_back(std::move(t));
  }
  at::Tensor take(int64_t rows) {
    at::Tensor buf;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].size(0) >= rows) {
          buf = std::move(free_[i]);
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
    if (!buf.defined()) buf = at::empty({rows, kC, kH, kW}, at::kHalf);
    void* data = buf.data_ptr();
    return at::from_blob(
        data, {rows, kC, kH, kW},
        [this, buf](void*) mutable {
          std::lock_guard<std::mutex> g(mu_);
          free_.push_back(std::move(buf));
        },
        at::TensorOptions().dtype(at::kHalf));
  }

 private:
  std::mutex mu_;
  std::vector<at::Tensor> free_;
};

//! the transform each worker runs on its chunk: horizontal flip, (x / 255 - 0.5) / 0.25 == x * 4/255 - 2 in
//! float32, stored as float16; labels bucketed. The same libtorch kernels as the Python job, run on `slab` rows
//! at a time (0: the whole chunk at once, as the Python job does; the output is the same bytes): the uint8 and float32 steps of a slab of 32 rows (0.4 + 1.6 MB) stay in this core's 2 MiB L2, where the
//! whole chunk at once (6 + 25 MB for 500 rows) streams every step through memory, and two workers share its
//! bandwidth (examples/README.md, "preprocess"). Scratch buffers of this thread are reused chunk after
//! chunk: fresh temporaries would cost a page fault per 4 KiB on every chunk where malloc hands back memory
//! (DESIGN.md, "Data paths"). The result is a HalfBuffers buffer, back in the pool once map has written it.
TensorDict transform(const TensorDict& chunk, int64_t slab_rows) {
  thread_local at::Tensor u8, f32;
  const at::Tensor image = chunk.get("image");
  const int64_t n = image.size(0);
  const int64_t slab = slab_rows > 0 ? std::min(slab_rows, n) : n;
  if (!u8.defined() || u8.size(0) < slab) {
    u8 = at::empty({slab, kC, kH, kW}, at::kByte);
    f32 = at::empty({slab, kC, kH, kW}, at::kFloat);
  }
  const at::Tensor f16 = HalfBuffers::get().take(n);
  for (int64_t s = 0; s < n; s += slab) {
    const int64_t m = std::min(slab, n - s);
    at::Tensor a = u8.narrow(0, 0, m), f = f32.narrow(0, 0, m);
    at::flip_out(a, image.narrow(0, s, m), {-1});
    f.copy_(a).mul_(4.0f / 255.0f).sub_(2.0f);
    f16.narrow(0, s, m).copy_(f);
  }
  at::Tensor bucket = at::floor_divide(chunk.get("label"), kLabels / kBuckets);
  return TensorDict(Dict{{"image", f16}, {"bucket", bucket}}, chunk.batch_size());
}

//! the float16 bits of every uint8 pixel value after the transform, computed once with the libtorch kernels of
//! transform() (u8 -> f32, * 4/255, - 2, -> f16): 256 values, so the fused transform looks each pixel up
const std::array<uint16_t, 256>& half_of_pixel() {
  static const std::array<uint16_t, 256> table = [] {
    at::Tensor t = at::arange(256, at::kInt).to(at::kByte).to(at::kFloat).mul_(4.0f / 255.0f).sub_(2.0f).to(at::kHalf);
    std::array<uint16_t, 256> out{};
    std::memcpy(out.data(), t.data_ptr(), sizeof(out));
    return out;
  }();
  return table;
}

//! the same transform fused into one pass (the default kernel), written into `image_out` ([n, C, H, W] float16,
//! C-contiguous) and `bucket_out` ([n] int64): a pooled buffer (transform_fused) or `out`'s own rows through its
//! mapping (the map's direct fn). Each output pixel is the table entry of the mirrored input pixel, read once and
//! written once, with no float32 intermediate. Every output byte equals transform()'s (the table holds its results;
//! the run verifies every row against transform() on whole blocks).
void fused_into(const TensorDict& chunk, const at::Tensor& image_out, const at::Tensor& bucket_out) {
  const at::Tensor image = chunk.get("image").contiguous();
  const int64_t n = image.size(0);
  if (image_out.size(0) != n || !image_out.is_contiguous() || image_out.scalar_type() != at::kHalf)
    throw std::runtime_error("fused_into: the image destination is not a contiguous float16 [n, C, H, W]");
  const auto& table = half_of_pixel();
  const uint8_t* src = image.data_ptr<uint8_t>();
  auto* dst = reinterpret_cast<uint16_t*>(image_out.data_ptr());
  for (int64_t line = 0; line < n * kC * kH; ++line) {
    const uint8_t* in = src + line * kW;
    uint16_t* o = dst + line * kW;
    for (int64_t w = 0; w < kW; ++w) o[w] = table[in[kW - 1 - w]];
  }
  bucket_out.copy_(at::floor_divide(chunk.get("label"), kLabels / kBuckets));
}

TensorDict transform_fused(const TensorDict& chunk) {
  const int64_t n = chunk.batch_size()[0];
  const at::Tensor f16 = HalfBuffers::get().take(n);
  const at::Tensor bucket = at::empty({n}, at::kLong);
  fused_into(chunk, f16, bucket);
  return TensorDict(Dict{{"image", f16}, {"bucket", bucket}}, chunk.batch_size());
}

int64_t arg_int(int argc, char** argv, const std::string& name, int64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  return dflt;
}
std::string arg_str(int argc, char** argv, const std::string& name, const std::string& dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return dflt;
}
bool arg_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

//! writes back and drops from the page cache every file below `dir` (a cold cache, as after a reboot); files
//! still mapped somewhere keep their pages, so the caller closes its handles on them first
void drop_page_cache(const std::string& dir) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + f.path().string() + " to drop its pages");
    ::fdatasync(fd);  // dirty pages are not dropped
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

//! joins a thread on every way out of a scope (a throw while it runs would otherwise terminate the program)
struct Joiner {
  std::thread t;
  ~Joiner() {
    if (t.joinable()) t.join();
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = arg_int(argc, argv, "--rows", 20000);
  const int64_t chunk = arg_int(argc, argv, "--chunk", 500);
  const std::string dir =
      arg_str(argc, argv, "--dir", (std::filesystem::temp_directory_path() / ("td-preprocess-" + std::to_string(getpid()))).string());
  const bool keep = arg_flag(argc, argv, "--keep");
  const bool cold = arg_flag(argc, argv, "--cold");
  const bool prefault_out = !arg_flag(argc, argv, "--no-prefault");
  const int64_t slab = arg_int(argc, argv, "--slab", 32);
  const std::string kernel = arg_str(argc, argv, "--kernel", "fused");
  if (kernel != "fused" && kernel != "torch") {
    std::fprintf(stderr, "preprocess: --kernel must be fused or torch, got %s\n", kernel.c_str());
    return 2;
  }
  // the transform map and the floor run: fused (one pass through a 256-entry table) or libtorch's kernels in slabs
  auto run_transform = [slab, fused = kernel == "fused"](const TensorDict& c) {
    return fused ? transform_fused(c) : transform(c, slab);
  };
  if (slab < 0) {
    std::fprintf(stderr, "preprocess: --slab must be 0 (whole chunks) or a number of rows, got %lld\n", (long long)slab);
    return 2;
  }
  // chunk-sized temporaries freed and allocated again stay in malloc's heap: the Engine's malloc.keep_mb
  try {
    Engine engine;  // the embedded default config (overridable with $TENSORDICT_CONFIG)
    const int64_t workers = arg_int(argc, argv, "--workers", engine.config().map_num_workers);
    const std::string slabs = kernel == "fused" ? "one fused pass"
                              : slab > 0        ? "slabs of " + std::to_string(slab) + " rows"
                                                : "whole chunks";
    std::printf("tensordict-cpp preprocess: %lld images %lldx%lldx%lld, %lld workers, chunks of %lld (transform in %s), in %s%s\n",
                (long long)rows, (long long)kC, (long long)kH, (long long)kW, (long long)workers, (long long)chunk,
                slabs.c_str(), dir.c_str(), cold ? " (--cold: a cold map, then a warm one)" : "");

    // 1. the preallocated memmap output (two with --cold: the cold map's and the warm map's), made first: its
    // pages are faulted in on another thread while the dataset is synthesised (a first run's fresh memory paid
    // off the map's critical path; --no-prefault leaves them to the map's writes)
    auto t0 = Clock::now();
    auto make_out = [&](const std::string& name) {
      return TensorDict::from_schema({{"image", {{kC, kH, kW}, at::kHalf}}, {"bucket", {{}, at::kLong}}}, {rows}, "memmap",
                                     MemmapOptions().prefix(dir + "/" + name));
    };
    TensorDict out = make_out("out");
    TensorDict out_cold = cold ? make_out("out-cold") : TensorDict::undefined();
    // the outputs' rows in blocks, taken in turn by the prefault thread and, once the dataset is written, by the
    // main thread too (a first run's prefault of 492 MB on fresh memory outlasted the dataset by 1.6-2 s)
    constexpr int64_t kPrefaultRows = 1000;
    const int64_t blocks_per_out = (rows + kPrefaultRows - 1) / kPrefaultRows;
    std::atomic<int64_t> next_block{0}, prefaulted{0};
    auto prefault_blocks = [&] {
      for (int64_t b = next_block++; b < blocks_per_out * (cold ? 2 : 1); b = next_block++) {
        const TensorDict& o = b < blocks_per_out ? out : out_cold;
        const int64_t s = (b % blocks_per_out) * kPrefaultRows;
        prefaulted += prefault(o.index({Slice(s, std::min(rows, s + kPrefaultRows))}));
      }
    };
    double t_prefault = 0;
    std::exception_ptr prefault_error;
    Joiner prefaulter;
    bool prefaulter_ran = false;
    // a prefaulted page stays resident (and dirty) until the map overwrites it: only for an output that fits
    // in a quarter of the memory free now (else the writes fault as they go)
    const double free_bytes = static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    const double out_bytes = static_cast<double>(out.bytes()) * (cold ? 2 : 1);
    if (prefault_out && out_bytes > free_bytes / 4) {
      std::printf("  prefault: skipped (the output's %.1f MB exceed a quarter of the %.1f MB free)\n", out_bytes / 1e6,
                  free_bytes / 1e6);
    } else if (prefault_out) {
      prefaulter_ran = true;
      prefaulter.t = std::thread([&] {
        try {
          const auto tp = Clock::now();
          prefault_blocks();
          t_prefault = seconds_since(tp);
        } catch (...) {
          prefault_error = std::current_exception();
        }
      });
    }

    // 2. the dataset, preallocated on disk and filled block by block
    TensorDict data = TensorDict::from_schema({{"image", {{kC, kH, kW}, at::kByte}}, {"label", {{}, at::kLong}}}, {rows},
                                              "memmap", MemmapOptions().prefix(dir + "/dataset"));
    for (int64_t s = 0; s < rows; s += 2000) {
      int64_t n = std::min<int64_t>(2000, rows - s);
      data.index_put_({Slice(s, s + n)}, synth_block(s, n));
    }
    double t_build = seconds_since(t0);
    std::printf("  dataset: %.1f MB written in %.2f s\n", data.bytes() / 1e6, t_build);
    // while the output's pages are faulted in: the transforms' output buffers (one per worker and one more, as a
    // finished chunk waits for its write), made and touched here rather than in the map's first chunks
    HalfBuffers::get().warm(static_cast<size_t>(std::max<int64_t>(workers, 1) + 1), std::min(chunk, rows));
    if (prefaulter.t.joinable()) {
      prefault_blocks();  // the blocks the prefault thread has not taken yet, shared with it
      prefaulter.t.join();
      if (prefault_error) std::rethrow_exception(prefault_error);
      std::printf("  prefault: %.1f MB of the output's pages faulted in on another thread (with the main thread's help "
                  "once the dataset was written) in %.2f s (%.2f s after the dataset)\n",
                  static_cast<double>(prefaulted.load()) / 1e6, t_prefault, seconds_since(t0) - t_build);
    }

    // 3. map the transform into the preallocated output (workers write their chunks in place)
    // the fused kernel into a prefaulted out writes each chunk's rows straight into out's mapping (its pages are
    // there: no fault) and returns nothing, so map has nothing to write: the result never exists elsewhere. With a
    // result to write, its pwrite (12 MB a chunk) cost as much as the transform (one worker ran at 0.5x the floor)
    // only when every output page was prefaulted: a store into a page whose block the file system could not
    // reserve (a full disk: prefault then reports fewer bytes) would be a SIGBUS, where map's write is an error
    const bool direct = kernel == "fused" && prefaulter_ran && static_cast<double>(prefaulted.load()) == out_bytes;
    auto run_map = [&](const TensorDict& input, const TensorDict& into, const char* what) {
      const at::Tensor in_image = input.get("image"), out_image = into.get("image"), out_bucket = into.get("bucket");
      auto direct_fn = [&](const TensorDict& c) -> TensorDict {
        // the chunk's rows: map's chunk i of `chunk` rows along dim 0, checked against where its image lies
        const MapWorkerContext* w = current_map_worker();
        const int64_t n = c.batch_size()[0];
        const int64_t at_row = w ? w->chunk * chunk : -1;
        if (at_row < 0 || at_row + n > rows ||
            c.get("image").data_ptr() != static_cast<const uint8_t*>(in_image.data_ptr()) + at_row * kC * kH * kW)
          return run_transform(c);
        fused_into(c, out_image.narrow(0, at_row, n), out_bucket.narrow(0, at_row, n));
        return TensorDict::undefined();  // upstream's None: written in place
      };
      // what the process did meanwhile (its CPU time and major faults: pages read from disk): a map that waits on the
      // disk keeps fewer of its workers' cores busy than a warm one
      struct rusage r0, r1;
      getrusage(RUSAGE_SELF, &r0);
      auto t1 = Clock::now();
      TensorDict ret = direct ? engine.map(input, direct_fn,
                                           MapOptions().dim(0).num_workers(workers).chunksize(chunk).out(into).progress(true))
                              : engine.map(input, run_transform,
                                           MapOptions().dim(0).num_workers(workers).chunksize(chunk).out(into).progress(true));
      const double t = seconds_since(t1);
      getrusage(RUSAGE_SELF, &r1);
      auto secs = [](const timeval& a, const timeval& b) { return (b.tv_sec - a.tv_sec) + (b.tv_usec - a.tv_usec) * 1e-6; };
      const double cpu = secs(r0.ru_utime, r1.ru_utime) + secs(r0.ru_stime, r1.ru_stime);
      if (ret.defined()) throw RuntimeError("map into a memmap out should return nothing (upstream's None)");
      std::printf("  map%s: %.2f s, %.0f rows/s, %.1f MB/s in, %.1f MB/s out%s; cpu %.2f s (%.2f cores busy), %ld major "
                  "faults\n", what, t, rows / t, input.bytes() / 1e6 / t, into.bytes() / 1e6 / t,
                  direct ? " (fn writes its rows of out in place)" : "", cpu, cpu / t, r1.ru_majflt - r0.ru_majflt);
      return t;
    };
    double t_cold = 0;
    if (cold) {
      // a first run's map: the dataset read back from disk (its handles closed, its pages written back and
      // dropped), malloc's free memory handed back to the system, an output never written
      data = TensorDict::undefined();
      drop_page_cache(dir + "/dataset");
      malloc_trim(0);
      data = TensorDict::load_memmap(dir + "/dataset", LoadOptions().writable(false));
      t_cold = run_map(data, out_cold, " (cold)");
    }
    const double t_map = run_map(data, out, cold ? " (warm)" : "");

    // 4. reload from disk and verify every row against the transform applied directly
    auto t2 = Clock::now();
    int64_t bad = 0;
    for (const char* name : {"out", "out-cold"}) {
      if (!cold && std::string(name) == "out-cold") continue;
      TensorDict back = TensorDict::load_memmap(dir + "/" + name, LoadOptions().writable(false));
      // in blocks of a chunk: a block's float32 temporaries (98 MB for 2,000 rows) exceeded what the Engine's
      // allocator keeps for reuse, and came back as fresh memory block after block (1.9 s of a 2 s verification)
      for (int64_t s = 0; s < rows; s += chunk) {
        int64_t n = std::min<int64_t>(chunk, rows - s);
        TensorDict want = transform(synth_block(s, n), 0);
        TensorDict got = back.index({Slice(s, s + n)});
        if (!got.get("image").equal(want.get("image")) || !got.get("bucket").equal(want.get("bucket"))) ++bad;
      }
      if (std::string(name) == "out") std::cout << "  output: " << back.index({Slice(0, 2)}) << "\n";
    }
    double t_verify = seconds_since(t2);
    if (bad) {
      std::fprintf(stderr, "preprocess: %lld blocks differ from the expected output\n", (long long)bad);
      if (!keep) std::filesystem::remove_all(dir);
      return 1;
    }
    std::printf("  verify: all %lld rows equal the expected output%s (%.2f s)\n", (long long)rows,
                cold ? " in both outputs" : "", t_verify);

    // 5. the floor: the transform alone, one thread, in-memory chunks of the same size (the dataset read into
    // memory first), results dropped
    double t_floor = 0;
    {
      const int saved = at::get_num_threads();
      at::set_num_threads(1);
      TensorDict mem = data.clone();
      // as the map writes: into an output of every row when it writes out's rows in place (touched first, as out
      // was prefaulted), else a result per chunk
      const at::Tensor mem_image = direct ? at::zeros({rows, kC, kH, kW}, at::kHalf) : at::Tensor();
      const at::Tensor mem_bucket = direct ? at::zeros({rows}, at::kLong) : at::Tensor();
      auto floor_chunk = [&](int64_t s) {
        const int64_t e = std::min(rows, s + chunk);
        const TensorDict c = mem.index({Slice(s, e)});
        if (direct) {
          fused_into(c, mem_image.narrow(0, s, e - s), mem_bucket.narrow(0, s, e - s));
        } else {
          run_transform(c);
        }
      };
      for (int64_t s = 0; s < std::min(rows, 2 * chunk); s += chunk) floor_chunk(s);
      auto t3 = Clock::now();
      for (int64_t s = 0; s < rows; s += chunk) floor_chunk(s);
      t_floor = seconds_since(t3);
      at::set_num_threads(saved);
    }
    std::printf("  floor: the transform alone in one thread over in-memory chunks: %.0f rows/s\n", rows / t_floor);
    if (cold)
      std::printf("COLD: %.0f rows/s cold, %.0f rows/s warm: the cold map at %.2fx the warm one\n", rows / t_cold,
                  rows / t_map, t_map / t_cold);
    std::printf("OK: %.0f rows/s through map with %lld workers = %.2fx the one-thread floor (%.0f rows/s); %.2f s total\n",
                rows / t_map, (long long)workers, t_floor / t_map, rows / t_floor, seconds_since(t0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preprocess failed: %s\n", e.what());
    if (!keep) std::filesystem::remove_all(dir);
    return 1;
  }
  if (!keep) std::filesystem::remove_all(dir);
  return 0;
}
