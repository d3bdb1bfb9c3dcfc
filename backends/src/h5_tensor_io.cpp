// The HDF5 store's tensor I/O (h5_internal.hpp): creating tensor datasets, reading and writing whole
// datasets or lists of rows (hyperslab layouts, batched transfers) and the cache of open datasets.
#include "h5_internal.hpp"
#include "tensordict/backends/tensor_values.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <new>

#include <ATen/EmptyTensor.h>

namespace tensordict {
namespace backends {
namespace h5_detail {

std::vector<at::Tensor> H5Store::read(const std::vector<LeafRead>& reads) {
  LibraryGuard g;
  ensure_open();
  std::vector<at::Tensor> out;
  out.reserve(reads.size());
  for (const auto& r : reads) out.push_back(read_one(r));
  return out;
}

void H5Store::write(const std::vector<LeafWrite>& writes) {
  LibraryGuard g;
  ensure_open();
  ensure_writable("write");
  // validate everything first: a bad request leaves the file untouched
  for (const auto& w : writes) check_write(w);
  for (const auto& w : writes) do_write(w);
  // HDF5 keeps small raw-data writes (a row of a narrow leaf) in a dataset's sieve buffer (contiguous) or
  // chunk cache (chunked) until evicted or the file closed: a row reported written could then be lost to a
  // full disk at close (tests/api/test_faults.cpp, h5_writes_on_a_full_disk_keep_every_acknowledged_row).
  // A durable store reports a write batch done only once its bytes are in the file (the page cache); reads
  // keep the caches. Not durable (h5py's behaviour): the bytes reach the file at flush() / close().
  if (!durable_) return;
  for (const auto& w : writes) {
    if (w.path.empty()) continue;
    auto it = datasets_.find(rel_path(w.path));
    if (it != datasets_.end() && H5Dflush(it->second->ds.get()) < 0)
      fail<BackendError>(w.path, "cannot write the rows to the file");
  }
}

void H5Store::create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
                     const at::Tensor& data, const CreateOptions& options) {
  LibraryGuard g;
  ensure_open();
  ensure_writable("create " + join_path(path));
  check_path(path, describe());
  if (path.empty()) throw ValueError(describe() + ": cannot create a dataset at the root");
  auto ftype = h5_type_of(dtype);
  if (!ftype)
    throw TypeError(describe() + ", key '" + rel_path(path) + "': dtype " + c10::toString(dtype) +
                    " cannot be stored in HDF5 (numpy has no such dtype; upstream cannot write it either)");
  if (checked_numel(shape) < 0 || shape.size() > H5S_MAX_RANK)
    throw ValueError(where(path) + ": invalid shape " + shape_str(shape));
  at::Tensor src;
  if (data.defined()) {
    if (data.sizes().vec() != shape)
      throw ValueError(where(path) + ": data of shape " + shape_str(data.sizes().vec()) + " for a dataset of shape " +
                       shape_str(shape));
    src = value_bytes(data.to(at::kCPU, dtype));
  }
  if (auto k = kind_at(path)) throw KeyError(where(path) + ": already exists (a " + *k + ")");
  ensure_parents(path);
  forget(path);
  StructureChange change(*this);  // bumps the generation when done, failed or not

  const CreateOptions& opt =
      (options.chunks.empty() && options.compression_level < 0 && !options.shuffle) ? defaults_ : options;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Id space = space_id(shape.empty() ? H5Screate(H5S_SCALAR)
                                    : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  if (!space.valid()) fail<BackendError>(path, "cannot create the dataspace");
  Id dcpl = plist_id(H5Pcreate(H5P_DATASET_CREATE));
  const size_t elsize = H5Tget_size(ftype->get());
  const bool chunked = !shape.empty() && (!opt.chunks.empty() || opt.compression_level >= 0 || opt.shuffle);
  if (opt.compression_level > 9) throw ValueError(where(path) + ": gzip level must be 0-9");
  if (chunked) {
    std::vector<hsize_t> chunk = chunk_shape(path, shape, opt.chunks, elsize);
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0)
      fail<ValueError>(path, "invalid chunk shape");
    if (opt.shuffle && H5Pset_shuffle(dcpl.get()) < 0) fail<BackendError>(path, "cannot set the shuffle filter");
    if (opt.compression_level >= 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opt.compression_level)) < 0)
      fail<BackendError>(path, "cannot set the gzip filter");
    // chunks are allocated when first written; filling at allocation (per chunk) keeps unwritten parts
    // of a written chunk at zero and costs nothing for the chunks never written
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC);
  } else if (!src.defined() && !may_reuse_space_) {
    // contiguous: allocated now (H5D_ALLOC_TIME_EARLY) and never pre-filled: fresh file space past the end
    // of file is a hole that reads as 0, so a 10 GB preallocation writes nothing and takes no disk. Early,
    // not at the first write (HDF5's default): the first write of a late dataset raises the file's end in
    // the superblock before the file itself grows, and a writer stopped in between (disk full, the file
    // size limit, a crash before close) leaves a file HDF5 refuses as truncated (tests/api/test_faults.cpp).
    // Only space freed in this session (or a persistent free-space manager) could hold old bytes: then the
    // fill value is written at allocation.
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_IFSET);
  } else if (src.defined()) {
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_IFSET);  // every byte is written right away
  } else {
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC);  // the zeros are written at the first write
  }
  Id lcpl = plist_id(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Id ds = dataset_id(
      H5Dcreate2(root_.get(), rel_path(path).c_str(), ftype->get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) fail<BackendError>(path, "cannot create the dataset");
  if (src.defined() && src.numel() > 0) {
    if (H5Dwrite(ds.get(), ftype->get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src.data_ptr()) < 0)
      fail<BackendError>(path, "cannot write the dataset");
  }
}

void H5Store::check_rows(const LeafPath& path, const std::vector<hsize_t>& dims, const RowList& list) {
  if (dims.empty()) throw ValueError(where(path) + ": a zero-dim dataset can only be read or written whole");
  checked_rows_.get(list, static_cast<int64_t>(dims[0]), [&] {
    check_rows_once(path, dims, list.vec());
    return true;
  });
}

void H5Store::check_rows_once(const LeafPath& path, const std::vector<hsize_t>& dims,
                              const std::vector<int64_t>& rows) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || static_cast<hsize_t>(rows[i]) >= dims[0])
      throw IndexError(where(path) + ": row " + std::to_string(rows[i]) + " out of range for dim 0 of size " +
                       std::to_string(dims[0]));
    if (i && rows[i] <= rows[i - 1]) throw ValueError(where(path) + ": rows must be ascending and unique");
  }
}

H5Store::RowLayout H5Store::layout_of(const std::vector<int64_t>& rows) {
  RowLayout l;
  const size_t n_rows = rows.size();
  if (n_rows == 0) return l;
  size_t len = 1;
  while (len < n_rows && rows[len] == rows[len - 1] + 1) ++len;
  bool regular = n_rows % len == 0;
  const int64_t step = len < n_rows ? rows[len] - rows[0] : static_cast<int64_t>(len);
  for (size_t i = len; regular && i < n_rows; ++i)
    regular = rows[i] - rows[i - len] == step;  // periodic differences: runs of len, step apart
  if (regular) {
    l.regular = true;
    l.first = static_cast<hsize_t>(rows[0]);
    l.len = static_cast<hsize_t>(len);
    l.step = static_cast<hsize_t>(step);
    l.count = static_cast<hsize_t>(n_rows / len);
    return l;
  }
  for (size_t i = 0; i < n_rows;) {
    size_t j = i + 1;
    while (j < n_rows && rows[j] == rows[j - 1] + 1) ++j;
    l.runs.emplace_back(static_cast<hsize_t>(rows[i]), static_cast<hsize_t>(j - i));
    i = j;
  }
  return l;
}

void H5Store::transfer_rows(const LeafPath& path, CachedDataset& e, hid_t mtype, const RowList& rows, void* buf,
                            bool write) {
  if (rows.empty()) return;
  if (!e.fspace.valid()) fail<FormatError>(path, "cannot read the dataspace");
  const RowLayout& layout = layouts_.get(rows, 0, [&] { return layout_of(rows.vec()); });
  const std::vector<hsize_t>& dims = e.p.dims;
  const size_t rank = dims.size();
  const hid_t fspace = e.fspace.get();
  // inner dims: whole (stride = block = the dim: one block per row, never overlapping)
  std::array<hsize_t, H5S_MAX_RANK> start{}, stride{}, count{}, block{}, mdims{};
  for (size_t d = 1; d < rank; ++d) {
    stride[d] = block[d] = mdims[d] = dims[d];
    count[d] = 1;
  }
  auto transfer = [&](hsize_t n, size_t out_row) {
    if (!e.mspace.valid() || e.mspace_rows != n) {
      mdims[0] = n;
      e.mspace = space_id(H5Screate_simple(static_cast<int>(rank), mdims.data(), nullptr));
      e.mspace_rows = n;
      if (!e.mspace.valid()) fail<BackendError>(path, "cannot create the memory dataspace");
    }
    char* p = static_cast<char*>(buf) + out_row * e.row_bytes;
    if (write) {
      if (H5Dwrite(e.ds.get(), mtype, e.mspace.get(), fspace, H5P_DEFAULT, p) < 0)
        fail<BackendError>(path, "cannot write");
    } else {
      if (H5Dread(e.ds.get(), mtype, e.mspace.get(), fspace, H5P_DEFAULT, p) < 0)
        fail<FormatError>(path, "cannot read");
    }
  };
  if (layout.regular) {
    start[0] = layout.first;
    stride[0] = layout.step;
    count[0] = layout.count;
    block[0] = layout.len;
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), stride.data(), count.data(), block.data()) < 0)
      fail<BackendError>(path, "cannot select rows");
    transfer(static_cast<hsize_t>(rows.size()), 0);
    return;
  }
  const auto& runs = layout.runs;
  size_t out_row = 0;
  stride[0] = 1;
  block[0] = 1;
  // chunked: one run per transfer. HDF5 maps a multi-run selection onto chunks before it reads any; single
  // runs (mostly inside one cached chunk) measured faster for scattered rows (bench_h5: a ~50% mask of a
  // gzip-chunked [10000, 64] dataset, 1.6x slower in 32-run batches than the raw API one run at a time)
  const size_t per_transfer = e.chunked ? 1 : kRunsPerTransfer;
  for (size_t b = 0; b < runs.size(); b += per_transfer) {
    const size_t end = std::min(runs.size(), b + per_transfer);
    hsize_t n = 0;
    for (size_t k = b; k < end; ++k) {
      start[0] = runs[k].first;
      count[0] = runs[k].second;
      n += runs[k].second;
      if (H5Sselect_hyperslab(fspace, k == b ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), stride.data(),
                              count.data(), block.data()) < 0)
        fail<BackendError>(path, "cannot select rows");
    }
    transfer(n, out_row);
    out_row += static_cast<size_t>(n);
  }
}

at::Tensor H5Store::allocate(const LeafPath& path, at::IntArrayRef shape, at::ScalarType dtype) const {
  try {
    return at::detail::empty_cpu(shape, dtype);  // at::empty without the dispatcher (~0.3 us a call)
  } catch (const std::bad_alloc&) {
  } catch (const c10::Error&) {
  }
  throw BackendError(where(path) + ": cannot allocate a tensor of shape " + shape_str(shape.vec()));
}

void H5Store::forget(const LeafPath& path) {
  const std::string key = rel_path(path);
  for (auto it = datasets_.begin(); it != datasets_.end();) {
    const std::string& k = it->first;
    if (k == key || (k.size() > key.size() && k.compare(0, key.size(), key) == 0 && k[key.size()] == '/'))
      it = datasets_.erase(it);
    else
      ++it;
  }
}

void H5Store::changed_structure() noexcept {
  const uint64_t before = generation_->fetch_add(1);
  if (before == seen_generation_) seen_generation_ = before + 1;  // no other store changed it meanwhile
}

H5Store::CachedDataset& H5Store::cached_dataset(const LeafPath& path) {
  if (path.empty()) throw KeyError(describe() + ": the root is a group, not a dataset");
  const uint64_t generation = generation_->load();
  if (generation != seen_generation_) {  // another store of this process changed the file's structure
    datasets_.clear();
    seen_generation_ = generation;
  }
  const std::string key = rel_path(path);
  auto it = datasets_.find(key);
  // the ids stay valid until this store closes them: another store's H5F_CLOSE_STRONG closes only the
  // objects opened through its own file id (two_stores_on_one_file); structure changes: generation_
  if (it != datasets_.end()) return *it->second;
  auto e = std::make_unique<CachedDataset>();
  e->ds = open_dataset(path);
  e->ftype = type_id(H5Dget_type(e->ds.get()));
  if (!e->ftype.valid()) fail<FormatError>(path, "cannot read the datatype");
  e->tc = classify(e->ftype.get());
  e->fspace = space_id(H5Dget_space(e->ds.get()));
  if (datasets_.size() >= kMaxCachedDatasets) datasets_.clear();
  return *datasets_.emplace(key, std::move(e)).first->second;
}

H5Store::CachedDataset& H5Store::cached_tensor(const LeafPath& path) {
  CachedDataset& e = cached_dataset(path);
  if (e.tc.kind == TypeClass::Unsupported) throw TypeError(where(path) + ": unsupported HDF5 type: " + e.tc.why);
  if (e.tc.kind != TypeClass::Tensor) throw TypeError(where(path) + ": is a non-tensor dataset, not a tensor");
  if (e.tensor_ready) return e;
  Prepared p;
  p.dtype = e.tc.dtype;
  p.dims = dataspace_dims(path, e.fspace.get());
  std::vector<int64_t> shape(p.dims.begin(), p.dims.end());
  if (checked_numel(shape) < 0 || checked_numel(shape) > std::numeric_limits<int64_t>::max() / 16)
    throw FormatError(where(path) + ": shape " + shape_str(shape) + " overflows");
  e.mtype = std::move(*h5_type_of(p.dtype));
  if (p.dtype == at::kBool) e.read_type = type_id(H5Tget_native_type(e.ftype.get(), H5T_DIR_ASCEND));
  clear_errors();
  e.row_bytes = c10::elementSize(p.dtype);  // the memory types' size (bool: the file's 1-byte enum)
  for (size_t d = 1; d < p.dims.size(); ++d) e.row_bytes *= static_cast<size_t>(p.dims[d]);
  e.p = std::move(p);
  {
    Id dcpl = plist_id(H5Dget_create_plist(e.ds.get()));
    e.chunked = dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED;
    clear_errors();
  }
  e.tensor_ready = true;
  return e;
}

at::Tensor H5Store::read_one(const LeafRead& r) {
  check_key(r.path);
  CachedDataset& e = cached_tensor(r.path);
  const Prepared& p = e.p;
  const bool whole = r.whole && r.rows.empty();
  c10::SmallVector<int64_t, 8> shape(p.dims.begin(), p.dims.end());
  if (!whole) {
    check_rows(r.path, p.dims, r.rows);
    shape[0] = static_cast<int64_t>(r.rows.size());
  }
  if (r.shape) {
    if (checked_numel(std::vector<int64_t>(shape.begin(), shape.end())) != checked_numel(*r.shape))
      throw ValueError(where(r.path) + ": cannot return the rows read as shape " + shape_str(*r.shape));
    shape.assign(r.shape->begin(), r.shape->end());
  }
  at::Tensor out = allocate(r.path, shape, p.dtype);
  if (out.numel() == 0) return out;
  // memory type: the dtype's own type (HDF5 converts byte order / float layouts); bool reads the file's
  // enum as is (no enum conversion), normalized to 0/1 below
  const Id& mtype = p.dtype == at::kBool ? e.read_type : e.mtype;
  if (!mtype.valid()) fail<FormatError>(r.path, "cannot build the memory type");
  if (whole) {
    if (H5Dread(e.ds.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()) < 0)
      fail<FormatError>(r.path, "cannot read");
  } else {
    transfer_rows(r.path, e, mtype.get(), r.rows, out.data_ptr(), /*write=*/false);
  }
  if (p.dtype == at::kBool) {
    at::Tensor bytes = out.view(at::kByte);
    bytes.ne_(0);
  }
  return out;
}

void H5Store::check_write(const LeafWrite& w) {
  check_key(w.path);
  const Prepared& p = cached_tensor(w.path).p;
  if (!w.data.defined()) throw ValueError(where(w.path) + ": no data to write");
  if (w.data.scalar_type() != p.dtype)
    throw TypeError(where(w.path) + ": data of dtype " + c10::toString(w.data.scalar_type()) +
                    " for a dataset of dtype " + c10::toString(p.dtype));
  std::vector<int64_t> expect(p.dims.begin(), p.dims.end());
  const bool whole = w.whole && w.rows.empty();
  if (!whole) {
    check_rows(w.path, p.dims, w.rows);
    expect[0] = static_cast<int64_t>(w.rows.size());
  }
  int64_t want = 1;
  for (int64_t d : expect) want *= d;
  if (w.data.numel() != want)  // the elements count, not the shape (LeafWrite)
    throw ValueError(where(w.path) + ": data of shape " + shape_str(w.data.sizes().vec()) + ", expected " +
                     shape_str(expect));
}

void H5Store::do_write(const LeafWrite& w) {
  if (w.data.numel() == 0) return;
  const at::Tensor src = value_bytes(w.data);
  CachedDataset& e = cached_tensor(w.path);
  if (w.whole && w.rows.empty()) {
    if (H5Dwrite(e.ds.get(), e.mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src.data_ptr()) < 0)
      fail<BackendError>(w.path, "cannot write");
  } else {
    transfer_rows(w.path, e, e.mtype.get(), w.rows, src.data_ptr(), /*write=*/true);
  }
}

std::vector<hsize_t> H5Store::chunk_shape(const LeafPath& path, const std::vector<int64_t>& shape,
                                          const std::vector<int64_t>& asked, size_t elsize) const {
  std::vector<hsize_t> chunk(shape.size());
  if (!asked.empty()) {
    if (asked.size() != shape.size())
      throw ValueError(where(path) + ": chunk shape " + shape_str(asked) + " does not match the rank of " +
                       shape_str(shape));
    for (size_t i = 0; i < shape.size(); ++i) {
      if (asked[i] <= 0 || (shape[i] > 0 && asked[i] > shape[i]))
        throw ValueError(where(path) + ": chunk shape " + shape_str(asked) + " invalid for shape " +
                         shape_str(shape));
      chunk[i] = static_cast<hsize_t>(asked[i]);
    }
    return chunk;
  }
  constexpr double kTarget = 1 << 20;
  for (size_t i = 0; i < shape.size(); ++i) chunk[i] = static_cast<hsize_t>(std::max<int64_t>(1, shape[i]));
  for (size_t i = 0; i < shape.size(); ++i) {
    double bytes = static_cast<double>(elsize);
    for (hsize_t c : chunk) bytes *= static_cast<double>(c);
    if (bytes <= kTarget) break;
    const double keep = std::max(1.0, static_cast<double>(chunk[i]) * kTarget / bytes);
    chunk[i] = static_cast<hsize_t>(keep);
  }
  return chunk;
}

}  // namespace h5_detail
}  // namespace backends
}  // namespace tensordict
