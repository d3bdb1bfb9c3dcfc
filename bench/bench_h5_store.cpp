//! bench_h5_store: small reads and writes through the HDF5 LeafStore against the raw HDF5 C API.
//! Data: 5 float32 datasets [10000, 64] (contiguous, h5py's default layout), as in bench_core. Each
//! operation is one batched store call over the 5 leaves: store.read / store.write of rows {42}, rows
//! 100..355 and rows 0, 3, 6, ... (3334 rows, td[::3]). The baseline does the same 5 selections with the
//! raw C API, datasets and file dataspaces kept open: one hyperslab each (a strided one for ::3), one
//! H5Dread / H5Dwrite per dataset into a buffer that already exists.
//! Reads also report raw_alloc_us: the raw reads into tensors allocated per call, as the store returns new ones.
//! Each sample repeats the call until at least 2 ms have passed; store and raw samples alternate (the store
//! and the raw handles are open on the same file at once, read-write); the median per-call time is reported.
//! Argument: run only the results whose name contains it (e.g. "read step").
//! Prints one JSON object; asserts nothing. Runs in a few seconds (a temp dir under /tmp, removed at the end).
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tensordict/backends/h5_store.hpp"

namespace be = tensordict::backends;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRows = 10000;
constexpr int64_t kCols = 64;
constexpr int kLeaves = 5;

//! per-call microseconds: one sample repeats f until >= 2 ms have passed
double sample_us(const std::function<void()>& f) {
  int n = 0;
  auto t0 = Clock::now();
  double el = 0;
  do {
    f();
    ++n;
    el = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  } while (el < 2000);
  return el / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

//! the raw C API side: datasets, file dataspaces and a memory dataspace per selection kept open
struct Raw {
  hid_t file = -1;
  std::vector<hid_t> ds, fspace;
  explicit Raw(const std::string& path) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);  // as the store's: one file opened twice needs the same degree
    file = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
    H5Pclose(fapl);
    if (file < 0) throw std::runtime_error("raw: cannot open the file");
    for (int i = 0; i < kLeaves; ++i) {
      ds.push_back(H5Dopen2(file, ("l" + std::to_string(i)).c_str(), H5P_DEFAULT));
      fspace.push_back(H5Dget_space(ds.back()));
    }
  }
  ~Raw() {
    for (int i = 0; i < kLeaves; ++i) {
      H5Sclose(fspace[static_cast<size_t>(i)]);
      H5Dclose(ds[static_cast<size_t>(i)]);
    }
    H5Fclose(file);
  }
  //! rows start, start+stride, ... (count of them) of every leaf into / from bufs
  //! alloc: read into fresh tensors (allocated per call, as a store read returns new tensors)
  void transfer(hsize_t start, hsize_t stride, hsize_t count, hid_t mspace, std::vector<std::vector<float>>& bufs,
                bool write, bool alloc = false) {
    const hsize_t st[2] = {start, 0}, sd[2] = {stride, 1}, cn[2] = {count, static_cast<hsize_t>(kCols)};
    for (size_t i = 0; i < static_cast<size_t>(kLeaves); ++i) {
      H5Sselect_hyperslab(fspace[i], H5S_SELECT_SET, st, sd, cn, nullptr);
      at::Tensor fresh;
      if (alloc) fresh = at::empty({static_cast<int64_t>(count), kCols});
      float* buf = alloc ? fresh.data_ptr<float>() : bufs[i].data();
      herr_t rc = write ? H5Dwrite(ds[i], H5T_NATIVE_FLOAT, mspace, fspace[i], H5P_DEFAULT, buf)
                        : H5Dread(ds[i], H5T_NATIVE_FLOAT, mspace, fspace[i], H5P_DEFAULT, buf);
      if (rc < 0) throw std::runtime_error("raw: transfer failed");
    }
  }
};

struct Case {
  std::string name;
  hsize_t start, stride, count;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";  // run only the results whose name contains this
  const fs::path dir = fs::temp_directory_path() / ("td_bench_h5_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "bench.h5").string();
  {
    auto w = be::open_h5_store(file, be::H5Mode::Write);
    for (int i = 0; i < kLeaves; ++i)
      w->create({"l" + std::to_string(i)}, at::kFloat, {kRows, kCols}, at::rand({kRows, kCols}), {});
    w->close();
  }
  std::vector<Case> cases = {{"index int[42]", 42, 1, 1},
                             {"slice[100:356]", 100, 1, 256},
                             {"step[::3]", 0, 3, static_cast<hsize_t>((kRows + 2) / 3)}};
  std::ostringstream out;
  out << "{\"benchmark\":\"h5_store\",\"unit\":\"us\",\"config\":{\"leaves\":" << kLeaves << ",\"shape\":[" << kRows
      << "," << kCols << "],\"dtype\":\"float32\",\"layout\":\"contiguous\",\"h5_library\":\"" << H5_VERS_MAJOR << "."
      << H5_VERS_MINOR << "." << H5_VERS_RELEASE << "\"},\"results\":[";
  bool first = true;
  {
    auto store = be::open_h5_store(file, be::H5Mode::ReadWrite);
    Raw raw(file);  // the same file opened a second time in this process: HDF5 shares it
    for (const auto& c : cases) {
      std::vector<int64_t> rows;
      for (hsize_t k = 0; k < c.count; ++k) rows.push_back(static_cast<int64_t>(c.start + k * c.stride));
      std::vector<be::LeafRead> reads;
      std::vector<be::LeafWrite> writes;
      for (int i = 0; i < kLeaves; ++i) {
        be::LeafRead r;
        r.path = {"l" + std::to_string(i)};
        r.whole = false;
        r.rows = rows;
        reads.push_back(r);
        be::LeafWrite w;
        w.path = r.path;
        w.whole = false;
        w.rows = rows;
        w.data = at::rand({static_cast<int64_t>(rows.size()), kCols});
        writes.push_back(w);
      }
      std::vector<std::vector<float>> bufs(kLeaves, std::vector<float>(c.count * kCols));
      const hsize_t mdims[2] = {c.count, static_cast<hsize_t>(kCols)};
      hid_t mspace = H5Screate_simple(2, mdims, nullptr);
      for (bool write : {false, true}) {
        if ((std::string(write ? "write " : "read ") + c.name).find(only) == std::string::npos) continue;
        std::function<void()> td_op = write ? std::function<void()>([&] { store->write(writes); })
                                            : std::function<void()>([&] { (void)store->read(reads); });
        std::function<void()> raw_op = [&] { raw.transfer(c.start, c.stride, c.count, mspace, bufs, write); };
        std::function<void()> raw_alloc_op = [&] {
          raw.transfer(c.start, c.stride, c.count, mspace, bufs, write, /*alloc=*/true);
        };
        td_op();
        raw_op();
        std::vector<double> td_s, raw_s, raw_alloc_s;
        for (int s = 0; s < 15; ++s) {
          td_s.push_back(sample_us(td_op));
          raw_s.push_back(sample_us(raw_op));
          if (!write) raw_alloc_s.push_back(sample_us(raw_alloc_op));
        }
        const double t = median(td_s), r = median(raw_s);
        out << (first ? "" : ",") << "{\"name\":\"" << (write ? "write " : "read ") << c.name
            << "\",\"td_us\":" << fmt(t, 2) << ",\"raw_us\":" << fmt(r, 2) << ",\"ratio\":" << fmt(t / r, 2);
        if (!write) out << ",\"raw_alloc_us\":" << fmt(median(raw_alloc_s), 2);
        out << "}";
        first = false;
      }
      H5Sclose(mspace);
    }
    store->close();
  }
  out << "]}";
  std::printf("%s\n", out.str().c_str());
  fs::remove_all(dir);
  return 0;
}
