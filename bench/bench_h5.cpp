//! bench_h5: PersistentTensorDict (an HDF5 file behind its store actor) against the raw HDF5 C API doing the
//! same selections on the same 5 datasets in the same process.
//!  1. rows: 5 float32 leaves [10000, 64], contiguous and chunked ([512, 64]) + shuffle + gzip 4. Reads
//!     h5td.index(idx).to_tensordict() and writes h5td.index_put_(idx, rows) for idx = 42, 100:356, ::3,
//!     256 random rows (unsorted, as users pass them) and a ~50% mask. The raw side keeps the file and its
//!     datasets open and selects with H5Sselect_hyperslab: one hyperslab for int / slice / step (strided),
//!     and for row lists (sorted: HDF5 needs it) the fastest of one OR-ed selection, batches of 32 runs and
//!     one H5Dread per run, chosen by a quick measurement (reported as raw_variant).
//!  2. from_schema of 1 GiB on h5 (time, file size and bytes on disk) and from_dict of 1 GiB, against
//!     memcpy of 1 GiB into a warm buffer, write(2) of 1 GiB to a fresh file and a raw H5Dwrite of 1 GiB.
//!  3. two files read from two threads through their own store actors, against the same reads one file
//!     after the other (and the same for the raw API): HDF5 serialises its calls through one global lock.
//! Usage: bench_h5 [rows] [two] [big] (the sections to run; default: all; `probe`: 5 s of td[42] reads). Prints one JSON object (times
//! in µs per call, medians of alternating samples); asserts nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <tensordict/tensordict.hpp>

#include "bench_common.hpp"

using namespace tensordict;
using namespace benchutil;
using at::indexing::None;
using at::indexing::Slice;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRows = 10000;
constexpr int64_t kFeatures = 64;
constexpr int kLeaves = 5;

volatile int64_t g_sink = 0;

//! one facade round trip to an actor (Engine::ping to the engine's echo actor), measured in this run:
//! the hop each store call pays on top of its backend work
double actor_hop_us() {
  auto engine = Engine::default_engine();
  return measure_one([&] { g_sink = g_sink + engine->ping(1); }, 3e5, 1000);
}

void check(herr_t rc, const char* what) {
  if (rc < 0) throw std::runtime_error(std::string("HDF5: ") + what);
}

std::string leaf(int k) { return "leaf" + std::to_string(k); }

//! the raw side: the same file opened with the C API, its datasets kept open
struct RawH5 {
  hid_t file = -1;
  std::vector<hid_t> ds, fspace;
  explicit RawH5(const std::string& path) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    // the store actor holds the file open with a strong close degree; a second open of the same file in
    // the same process must ask for the same degree (HDF5 then shares the open file)
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    file = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
    H5Pclose(fapl);
    if (file < 0) throw std::runtime_error("H5Fopen " + path);
    for (int k = 0; k < kLeaves; ++k) {
      hid_t d = H5Dopen2(file, ("/" + leaf(k)).c_str(), H5P_DEFAULT);
      if (d < 0) throw std::runtime_error("H5Dopen2 " + leaf(k));
      ds.push_back(d);
      fspace.push_back(H5Dget_space(d));
    }
  }
  ~RawH5() {
    for (hid_t s : fspace) H5Sclose(s);
    for (hid_t d : ds) H5Dclose(d);
    if (file >= 0) H5Fclose(file);
  }
  RawH5(const RawH5&) = delete;
  RawH5& operator=(const RawH5&) = delete;
};

//! the raw side opens the same file (HDF5 shares it within the process); should the library refuse the
//! second open, it opens an identical copy instead (`how` says which)
std::unique_ptr<RawH5> open_raw(const std::string& file, std::string* how) {
  try {
    *how = "same file";
    return std::make_unique<RawH5>(file);
  } catch (const std::exception&) {
    fs::copy_file(file, file + ".copy.h5", fs::copy_options::overwrite_existing);
    *how = "identical copy";
    return std::make_unique<RawH5>(file + ".copy.h5");
  }
}

using Runs = std::vector<std::pair<hsize_t, hsize_t>>;  // (first row, count)

Runs runs_of(const std::vector<int64_t>& sorted) {
  Runs runs;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i + 1;
    while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
    runs.emplace_back(static_cast<hsize_t>(sorted[i]), static_cast<hsize_t>(j - i));
    i = j;
  }
  return runs;
}

//! a selection of rows as the raw side does it: a regular hyperslab (start, count, stride) or runs
struct Selection {
  bool regular = false;
  hsize_t start = 0, count = 0, stride = 1;
  Runs runs;
  hsize_t rows = 0;
};

//! one transfer of `sel` for every dataset; runs are sent `batch` per H5Dread/H5Dwrite (0: all at once)
void raw_transfer(RawH5& h, const Selection& sel, size_t batch, std::vector<at::Tensor>& bufs, bool write) {
  for (int k = 0; k < kLeaves; ++k) {
    hid_t ds = h.ds[k], fs_ = h.fspace[k];
    char* p = static_cast<char*>(bufs[k].data_ptr());
    const size_t row_bytes = kFeatures * sizeof(float);
    if (sel.regular) {
      hsize_t start[2] = {sel.start, 0}, stride[2] = {sel.stride, 1}, count[2] = {sel.count, kFeatures};
      check(H5Sselect_hyperslab(fs_, H5S_SELECT_SET, start, stride, count, nullptr), "select");
      hsize_t md[2] = {sel.count, kFeatures};
      hid_t ms = H5Screate_simple(2, md, nullptr);
      if (write) check(H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, p), "write");
      else check(H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, p), "read");
      H5Sclose(ms);
      continue;
    }
    const size_t step = batch == 0 ? sel.runs.size() : batch;
    size_t out = 0;
    for (size_t b = 0; b < sel.runs.size(); b += step) {
      const size_t e = std::min(sel.runs.size(), b + step);
      hsize_t n = 0;
      for (size_t r = b; r < e; ++r) {
        hsize_t start[2] = {sel.runs[r].first, 0}, count[2] = {sel.runs[r].second, kFeatures};
        check(H5Sselect_hyperslab(fs_, r == b ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count, nullptr),
              "select");
        n += sel.runs[r].second;
      }
      hsize_t md[2] = {n, kFeatures};
      hid_t ms = H5Screate_simple(2, md, nullptr);
      char* q = p + out * row_bytes;
      if (write) check(H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, q), "write");
      else check(H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, q), "read");
      H5Sclose(ms);
      out += n;
    }
  }
}

struct Case {
  std::string name;
  Index idx;
  Selection sel;
  std::vector<int64_t> user_rows;  // the rows in the user's order (what ours returns)
  std::vector<int64_t> sorted_rows;
};

Selection regular(hsize_t start, hsize_t count, hsize_t stride) {
  Selection s;
  s.regular = true;
  s.start = start;
  s.count = count;
  s.stride = stride;
  s.rows = count;
  return s;
}

Selection of_rows(const std::vector<int64_t>& sorted) {
  Selection s;
  s.runs = runs_of(sorted);
  s.rows = sorted.size();
  return s;
}

std::vector<int64_t> to_vec(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& name, Index idx, std::vector<int64_t> user, Selection sel) {
    std::vector<int64_t> sorted = user;
    std::sort(sorted.begin(), sorted.end());
    cases.push_back({name, std::move(idx), std::move(sel), std::move(user), std::move(sorted)});
  };
  add("int[42]", {42}, {42}, regular(42, 1, 1));
  {
    std::vector<int64_t> r;
    for (int64_t i = 100; i < 356; ++i) r.push_back(i);
    add("slice[100:356]", {Slice(100, 356)}, r, regular(100, 256, 1));
  }
  {
    std::vector<int64_t> r;
    for (int64_t i = 0; i < kRows; i += 3) r.push_back(i);
    add("step[::3]", {Slice(None, None, 3)}, r, regular(0, static_cast<hsize_t>(r.size()), 3));
  }
  {
    at::Tensor rows = at::randperm(kRows, at::kLong).index({Slice(0, 256)});
    std::vector<int64_t> user = to_vec(rows), sorted = user;
    std::sort(sorted.begin(), sorted.end());
    add("long[256 random rows]", {rows}, user, of_rows(sorted));
  }
  {
    at::Tensor mask = at::rand({kRows}) < 0.5;
    std::vector<int64_t> r = to_vec(mask.nonzero().squeeze(1));
    add("mask[~50%]", {mask}, r, of_rows(r));
  }
  return cases;
}

std::vector<at::Tensor> leaf_buffers(hsize_t rows) {
  std::vector<at::Tensor> b;
  for (int k = 0; k < kLeaves; ++k) b.push_back(at::empty({static_cast<int64_t>(rows), kFeatures}));
  return b;
}

//! the fastest raw variant (0 = one selection, 32, 1 = a transfer per run) for a run selection
size_t pick_batch(RawH5& h, const Selection& sel, bool write, std::vector<at::Tensor>& bufs, std::string* name) {
  if (sel.regular) {
    *name = sel.stride > 1 ? "strided hyperslab" : "one hyperslab";
    return 0;
  }
  const std::vector<std::pair<size_t, std::string>> variants = {
      {0, "one OR-ed selection"}, {32, "32 runs per transfer"}, {1, "one transfer per run"}};
  double best = 1e300;
  size_t best_b = 32;
  for (const auto& v : variants) {
    if (v.first == 0 && sel.runs.size() > 600) continue;  // O(runs^2) in HDF5 1.10: seconds per call
    auto f = [&] { raw_transfer(h, sel, v.first, bufs, write); };
    double us = measure_one(f, 1.5e5, 1000);
    if (us < best) {
      best = us;
      best_b = v.first;
      *name = v.second;
    }
  }
  return best_b;
}

//! `durable`: the store's default (a write returns once in the file): writes are also timed against raw
//! writes followed by H5Dflush of each dataset (the same guarantee). Not durable (h5py's behaviour): writes
//! only, against plain raw writes.
Json bench_layout(const std::string& dir, const std::string& layout, const TensorDict& src,
                  const std::vector<Case>& cases, bool durable) {
  const std::string file = dir + "/" + layout + (durable ? "" : "_nd") + ".h5";
  H5Options opts = H5Options().mode("w").durable(durable);
  if (layout != "contiguous") opts = opts.chunks({512, kFeatures}).compression_level(4).shuffle(true);
  PersistentTensorDict h5td = PersistentTensorDict::from_dict(src, file, opts);
  h5td.flush();
  std::string raw_file;
  std::unique_ptr<RawH5> raw_ptr = open_raw(file, &raw_file);
  RawH5& raw = *raw_ptr;
  const double hop_us = actor_hop_us();
  // the lazy view alone (td[42] without reading): what a call costs before its request
  const double view_us = measure_one([&] { g_sink = g_sink + h5td.index({42}).batch_size().size(); }, 2e5, 1000);
  std::vector<Json> results;
  auto record = [&](const std::string& name, const Pair& p, const std::string& variant, const Pair* flushed) {
    Json j;
    j.str("name", name).num("td_us", p.ours_us).num("raw_us", p.raw_us).num("ratio", p.ratio(), 2)
        .num("ratio_without_hop", (p.ours_us - hop_us) / p.raw_us, 2).str("raw_variant", variant);
    if (flushed) {
      j.num("td_us_vs_flush", flushed->ours_us).num("raw_flush_us", flushed->raw_us)
          .num("ratio_same_durability", flushed->ratio(), 2)
          .num("ratio_same_durability_without_hop", (flushed->ours_us - hop_us) / flushed->raw_us, 2);
    }
    results.push_back(j);
  };
  for (const Case& c : cases) {
    if (!durable) break;  // reads do not depend on it
    std::vector<at::Tensor> bufs = leaf_buffers(c.sel.rows);
    std::string variant;
    const size_t batch = pick_batch(raw, c.sel, false, bufs, &variant);
    Pair p = measure_pair(
        [&] {
          TensorDict out = h5td.index(c.idx).to_tensordict();
          g_sink = g_sink + out.numel();
        },
        [&] {
          std::vector<at::Tensor> out = leaf_buffers(c.sel.rows);  // fresh outputs, as ours allocates
          raw_transfer(raw, c.sel, batch, out, false);
          g_sink = g_sink + out[0].numel();
        });
    record("read " + c.name, p, variant, nullptr);
  }
  for (const Case& c : cases) {
    // the rows to write: ours in the user's order, raw the same values in sorted order
    TensorDict sub = src.index(c.idx).clone();
    std::vector<at::Tensor> sorted_bufs;
    at::Tensor sorted_idx = at::tensor(c.sorted_rows, at::kLong);
    for (int k = 0; k < kLeaves; ++k) sorted_bufs.push_back(src.get(leaf(k)).index({sorted_idx}).contiguous());
    std::vector<at::Tensor> scratch = leaf_buffers(c.sel.rows);
    std::string variant;
    const size_t batch = pick_batch(raw, c.sel, true, sorted_bufs, &variant);
    (void)scratch;
    Pair p = measure_pair([&] { h5td.index_put_(c.idx, sub); },
                          [&] { raw_transfer(raw, c.sel, batch, sorted_bufs, true); });
    std::optional<Pair> flushed;
    if (durable) {
      flushed = measure_pair([&] { h5td.index_put_(c.idx, sub); },
                             [&] {
                               raw_transfer(raw, c.sel, batch, sorted_bufs, true);
                               for (hid_t d : raw.ds) check(H5Dflush(d), "flush");
                             });
    }
    record("write " + c.name, p, variant, flushed ? &*flushed : nullptr);
  }
  // the same sizes at a new offset on every call (a loop walking the dataset): no memo of the last selection
  // (ResolvedIndex, the store's row checks and layouts) helps, as none helps the raw side. Contiguous layouts
  // only: both sides open the same datasets, whose chunk cache HDF5 shares, so with chunks one side's reads
  // warm the other's and whichever evicts a chunk pays for compressing what the other dirtied (measured:
  // 0.01x for fresh chunked writes)
  for (const int64_t len : {int64_t{1}, int64_t{256}}) {
    if (layout != "contiguous") break;
    const std::string name = len == 1 ? "int[fresh]" : "slice[fresh:+256]";
    auto idx_at = [len](int64_t o) { return len == 1 ? Index{o} : Index{Slice(o, o + len)}; };
    auto next = [len](int64_t& o) { return o = (o + 977) % (kRows - len); };
    const TensorDict value = src.index(idx_at(0)).clone();
    std::vector<at::Tensor> bufs = leaf_buffers(static_cast<hsize_t>(len));
    int64_t o_ours = 0, o_raw = 0;
    if (durable) {
      Pair p = measure_pair(
          [&] { g_sink = g_sink + h5td.index(idx_at(next(o_ours))).to_tensordict().numel(); },
          [&] {
            std::vector<at::Tensor> out = leaf_buffers(static_cast<hsize_t>(len));
            raw_transfer(raw, regular(static_cast<hsize_t>(next(o_raw)), static_cast<hsize_t>(len), 1), 0, out, false);
            g_sink = g_sink + out[0].numel();
          });
      record("read " + name, p, "one hyperslab", nullptr);
    }
    Pair p = measure_pair([&] { h5td.index_put_(idx_at(next(o_ours)), value); },
                          [&] {
                            raw_transfer(raw, regular(static_cast<hsize_t>(next(o_raw)), static_cast<hsize_t>(len), 1),
                                         0, bufs, true);
                            if (durable)
                              for (hid_t d : raw.ds) check(H5Dflush(d), "flush");
                          });
    record("write " + name + (durable ? " (raw + flush)" : ""), p, "one hyperslab", nullptr);
  }
  auto st = h5td.store_stats();
  Json j;
  j.str("layout", std::string(layout == "contiguous" ? "contiguous" : "chunks [512, 64], shuffle, gzip 4") +
                      (durable ? "" : ", durable(false)"))
      .num("durable", durable ? 1 : 0, 0)
      .str("raw_file", raw_file)
      .num("actor_hop_us", hop_us)
      .num("index_view_only_us", view_us)
      .num("actor_hop_after_us", actor_hop_us())
      .num("store_calls", static_cast<double>(st.calls), 0)
      .num("store_batches", static_cast<double>(st.batches), 0)
      .arr("results", results);
  return j;
}

int64_t disk_bytes(const std::string& path) {
  struct stat s {};
  if (::stat(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.st_blocks) * 512;
}

//! from_schema / from_dict of 1 GiB against memcpy, write(2) and a raw H5Dwrite of the same bytes
Json bench_big(const std::string& dir) {
  constexpr int64_t kBigRows = int64_t{1} << 20;  // 4 leaves x [2^20, 64] f32 = 1 GiB
  constexpr int kBigLeaves = 4;
  const double bytes = static_cast<double>(kBigLeaves) * kBigRows * kFeatures * sizeof(float);
  Schema schema;
  for (int k = 0; k < kBigLeaves; ++k) schema.push_back({leaf(k), {BatchSize{kFeatures}, at::kFloat}});
  const std::string f_schema = dir + "/schema.h5", f_dict = dir + "/dict.h5", f_raw = dir + "/raw.bin",
                    f_rawh5 = dir + "/raw.h5";
  Json j;
  j.num("GiB", bytes / (1 << 30), 2);
  // from_schema (no data: contiguous datasets, allocated at the first write)
  {
    auto t0 = Clock::now();
    TensorDict buf = TensorDict::from_schema(schema, {kBigRows}, "h5", H5Options().filename(f_schema).mode("w"));
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    PersistentTensorDict(buf).flush();
    j.num("from_schema_ms", s * 1e3, 2)
        .num("from_schema_file_bytes", static_cast<double>(fs::file_size(f_schema)), 0)
        .num("from_schema_disk_bytes", static_cast<double>(disk_bytes(f_schema)), 0);
    // the first row write allocates the datasets
    TensorDict row(BatchSize{});
    for (int k = 0; k < kBigLeaves; ++k) row.set(leaf(k), at::ones({kFeatures}));
    auto t1 = Clock::now();
    buf.index_put_({kBigRows - 1}, row);
    PersistentTensorDict(buf).flush();
    j.num("first_row_write_ms", std::chrono::duration<double>(Clock::now() - t1).count() * 1e3, 2)
        .num("after_first_write_disk_bytes", static_cast<double>(disk_bytes(f_schema)), 0);
    PersistentTensorDict(buf).close();
  }
  fs::remove(f_schema);
  std::vector<at::Tensor> data;
  Dict d;
  for (int k = 0; k < kBigLeaves; ++k) {
    data.push_back(at::rand({kBigRows, kFeatures}));
    d.emplace_back(leaf(k), data.back());
  }
  TensorDict big(d, {kBigRows});
  // memcpy into a warm buffer
  {
    std::vector<at::Tensor> dst;
    for (auto& t : data) dst.push_back(at::zeros_like(t));
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      for (int k = 0; k < kBigLeaves; ++k) std::memcpy(dst[k].data_ptr(), data[k].data_ptr(), data[k].nbytes());
      v.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    j.num("memcpy_ms", median(v) * 1e3, 2);
  }
  // write(2) of the same bytes to a fresh file (page cache; no fsync, like HDF5's close)
  {
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      fs::remove(f_raw);
      auto t0 = Clock::now();
      int fd = ::open(f_raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (int k = 0; k < kBigLeaves; ++k) {
        const char* p = static_cast<const char*>(data[k].data_ptr());
        size_t left = data[k].nbytes();
        while (left > 0) {
          ssize_t n = ::write(fd, p, left);
          if (n <= 0) throw std::runtime_error("write failed");
          p += n;
          left -= static_cast<size_t>(n);
        }
      }
      ::close(fd);
      v.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    fs::remove(f_raw);
    j.num("write_ms", median(v) * 1e3, 2);
  }
  // raw H5Dwrite of the same datasets into a new file
  {
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      fs::remove(f_rawh5);
      auto t0 = Clock::now();
      hid_t f = H5Fcreate(f_rawh5.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      hsize_t dims[2] = {static_cast<hsize_t>(kBigRows), kFeatures};
      hid_t sp = H5Screate_simple(2, dims, nullptr);
      for (int k = 0; k < kBigLeaves; ++k) {
        hid_t ds = H5Dcreate2(f, leaf(k).c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        check(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data[k].data_ptr()), "big write");
        H5Dclose(ds);
      }
      H5Sclose(sp);
      H5Fclose(f);
      v.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    fs::remove(f_rawh5);
    j.num("raw_h5_write_ms", median(v) * 1e3, 2);
  }
  // from_dict: the same bytes through the store actor (create + write + open)
  {
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      fs::remove(f_dict);
      auto t0 = Clock::now();
      {
        PersistentTensorDict h = PersistentTensorDict::from_dict(big, f_dict, H5Options().mode("w"));
        h.close();
      }
      v.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    j.num("from_dict_ms", median(v) * 1e3, 2).num("from_dict_disk_bytes", static_cast<double>(disk_bytes(f_dict)), 0);
    fs::remove(f_dict);
  }
  return j;
}

//! two files read from two threads (their own store actors) vs one after the other; same for raw HDF5
Json bench_two_files(const std::string& dir, const TensorDict& src, const std::string& layout) {
  const int kReads = layout == "contiguous" ? 150 : 20;  // a chunked read of 256 rows decompresses ~10 ms
  H5Options opts = H5Options().mode("w");
  if (layout != "contiguous") opts = opts.chunks({512, kFeatures}).compression_level(4).shuffle(true);
  const std::string fa = dir + "/two_a.h5", fb = dir + "/two_b.h5";
  PersistentTensorDict a = PersistentTensorDict::from_dict(src, fa, opts);
  PersistentTensorDict b = PersistentTensorDict::from_dict(src, fb, opts);
  std::vector<at::Tensor> idx;
  std::vector<Selection> sels;
  for (int i = 0; i < 16; ++i) {
    at::Tensor rows = at::randperm(kRows, at::kLong).index({Slice(0, 256)});
    idx.push_back(rows);
    std::vector<int64_t> s = to_vec(rows);
    std::sort(s.begin(), s.end());
    sels.push_back(of_rows(s));
  }
  auto ours = [&](const PersistentTensorDict& td) {
    for (int i = 0; i < kReads; ++i) {
      TensorDict out = td.index({idx[i % idx.size()]}).to_tensordict();
      g_sink = g_sink + out.numel();
    }
  };
  auto seconds = [](const std::function<void()>& f) {
    auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  ours(a);
  ours(b);
  std::vector<double> seq, conc, raw_seq, raw_conc;
  a.flush();
  b.flush();
  std::string how;
  std::unique_ptr<RawH5> pa = open_raw(fa, &how), pb = open_raw(fb, &how);
  RawH5 &ra = *pa, &rb = *pb;
  auto raw = [&](RawH5& h) {
    std::vector<at::Tensor> out = leaf_buffers(256);
    for (int i = 0; i < kReads; ++i) raw_transfer(h, sels[i % sels.size()], 32, out, false);
  };
  for (int r = 0; r < 3; ++r) {
    seq.push_back(seconds([&] {
      ours(a);
      ours(b);
    }));
    conc.push_back(seconds([&] {
      std::thread t([&] { ours(a); });
      ours(b);
      t.join();
    }));
    raw_seq.push_back(seconds([&] {
      raw(ra);
      raw(rb);
    }));
    hbool_t threadsafe = 0;
    H5is_library_threadsafe(&threadsafe);
    if (threadsafe)  // two raw threads need the library's global lock
      raw_conc.push_back(seconds([&] {
        std::thread t([&] { raw(ra); });
        raw(rb);
        t.join();
      }));
  }
  Json j;
  j.str("layout", layout)
      .num("reads_per_file", kReads, 0)
      .num("sequential_ms", median(seq) * 1e3, 2)
      .num("two_threads_ms", median(conc) * 1e3, 2)
      .num("speedup", median(seq) / median(conc), 2)
      .num("raw_sequential_ms", median(raw_seq) * 1e3, 2)
      .num("raw_two_threads_ms", median(raw_conc) * 1e3, 2)
      .num("raw_speedup", raw_conc.empty() ? 0 : median(raw_seq) / median(raw_conc), 2);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  // sections: rows, two, big (default: all)
  std::vector<std::string> only(argv + 1, argv + argc);
  auto want = [&](const char* s) { return only.empty() || std::find(only.begin(), only.end(), s) != only.end(); };
  at::manual_seed(0);
  at::set_num_threads(1);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string dir = (fs::temp_directory_path() / ("td_bench_h5_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  int rc = 0;
  try {
    Dict d;
    for (int k = 0; k < kLeaves; ++k) d.emplace_back(leaf(k), at::randn({kRows, kFeatures}));
    TensorDict src(d, {kRows});
    std::vector<Case> cases = make_cases();
    Json out;
    out.str("benchmark", "h5").str("unit", "us");
    Json config;
    config.num("rows", kRows, 0).num("leaves", kLeaves, 0).num("features", kFeatures, 0);
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    hbool_t ts = 0;
    H5is_library_threadsafe(&ts);
    config.str("hdf5", std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel))
        .num("hdf5_threadsafe", ts ? 1 : 0, 0);
    out.obj("config", config);
    Json targets;
    targets.num("single_read_ratio", 1.2, 1).num("other_ratio", 1.3, 1);
    out.obj("targets", targets);
    Json python;
    python.num("h5td[42].to_tensordict()_us", 4637, 0).num("256_sorted_rows_us", 4500, 0);
    out.obj("python_us", python);
    if (!only.empty() && only[0] == "probe") {  // 5 s of td[42] reads, for a profiler
      PersistentTensorDict h = PersistentTensorDict::from_dict(src, dir + "/probe.h5", H5Options().mode("w"));
      auto end = Clock::now() + std::chrono::seconds(5);
      int64_t n = 0;
      while (Clock::now() < end) {
        g_sink = g_sink + h.index({42}).to_tensordict().numel();
        ++n;
      }
      out.num("probe_us", 5e6 / static_cast<double>(n));
    }
    if (want("rows")) {
      std::vector<Json> layouts;
      layouts.push_back(bench_layout(dir, "contiguous", src, cases, true));
      layouts.push_back(bench_layout(dir, "chunked", src, cases, true));
      layouts.push_back(bench_layout(dir, "contiguous", src, cases, false));
      layouts.push_back(bench_layout(dir, "chunked", src, cases, false));
      out.arr("layouts", layouts);
    }
    if (want("two"))
      out.arr("two_files", {bench_two_files(dir, src, "contiguous"), bench_two_files(dir, src, "chunked")});
    if (want("big")) out.obj("one_gib", bench_big(dir));
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_h5: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
