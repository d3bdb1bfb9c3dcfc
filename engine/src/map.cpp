// td.map / td.map_iter: the engine-side semantics (validation, chunks, restacking) and the backend registry.
#include "tensordict/map.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "spec_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tree_visitor.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/lazy_stack.hpp"
#include "torch_errors.hpp"

namespace tensordict {

namespace {

std::mutex g_backend_mutex;
std::shared_ptr<MapBackend> g_backend;                 // guarded by g_backend_mutex
std::shared_ptr<MapBackend> (*g_factory)() = nullptr;  // guarded by g_backend_mutex

thread_local const MapWorkerContext* t_worker = nullptr;

struct WorkerScope {
  explicit WorkerScope(const MapWorkerContext* ctx) : prev_(t_worker) { t_worker = ctx; }
  ~WorkerScope() { t_worker = prev_; }
  const MapWorkerContext* prev_;
};

std::string chunk_name(const MapPlan& plan, size_t i) {
  const MapChunk& c = plan.chunks[i];
  std::string s = "chunk " + std::to_string(i);
  if (!c.indices.empty()) return s + " (" + std::to_string(c.indices.size()) + " shuffled elements)";
  if (c.drop_dim) return s + " (element " + std::to_string(c.start) + " of dim " + std::to_string(plan.dim) + ")";
  return s + " (elements [" + std::to_string(c.start) + ", " + std::to_string(c.start + c.length) + ") of dim " +
         std::to_string(plan.dim) + ")";
}

//! the same error type as the current exception with `prefix` + its bare message + `suffix`
[[noreturn]] void rethrow_with_prefix(const std::string& prefix, int64_t chunk, const std::string& suffix = "") {
  map_detail::CarriedError ce = map_detail::carry_current_exception(chunk);
  ce.message = prefix + ce.message + suffix;
  map_detail::rethrow(ce);
}

}  // namespace

const MapWorkerContext* current_map_worker() { return t_worker; }

at::Generator& MapWorkerContext::generator() const {
  if (!generator_.defined()) generator_ = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return generator_;
}

// ============================================================================ named map functions
namespace {
struct FnRegistry {
  std::mutex mu;
  std::map<std::string, MapFn> fns;
};
FnRegistry& fn_registry() {  // function-local: usable from static initialisers (TD_REGISTER_MAP_FN)
  static FnRegistry r;
  return r;
}
}  // namespace

void register_map_fn(const std::string& name, MapFn fn) {
  if (name.empty()) throw ValueError("register_map_fn: the name is empty");
  if (!fn) throw ValueError("register_map_fn: fn '" + name + "' is empty");
  FnRegistry& r = fn_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.fns[name] = std::move(fn);
}

MapFn find_map_fn(const std::string& name) {
  FnRegistry& r = fn_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.fns.find(name);
  return it == r.fns.end() ? MapFn() : it->second;
}

std::vector<std::string> registered_map_fns() {
  FnRegistry& r = fn_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& kv : r.fns) names.push_back(kv.first);
  return names;
}

// ============================================================================ registry
void set_map_backend(std::shared_ptr<MapBackend> backend) {
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  g_backend = std::move(backend);
}

std::shared_ptr<MapBackend> get_map_backend() {
  std::shared_ptr<MapBackend> (*factory)() = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_backend_mutex);
    if (g_backend) return g_backend;
    factory = g_factory;
  }
  return factory ? factory() : nullptr;
}

void set_default_map_backend_factory(std::shared_ptr<MapBackend> (*factory)()) {
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  g_factory = factory;
}

namespace {
std::shared_ptr<MapBackend> require_backend(const char* what) {
  auto b = get_map_backend();
  if (!b) {
    throw RuntimeError(std::string(what) +
                       ": no map backend is registered. Link tensordict::tensordict and include "
                       "<tensordict/tensordict.hpp> (a default Engine then starts on first use), or construct a "
                       "tensordict::Engine before calling it");
  }
  return b;
}
}  // namespace

TensorDict TensorDict::map(const MapFn& fn, const MapOptions& options) const {
  if (!fn) throw ValueError("map: fn is empty");
  // a lazy stack (or one nested below) is mapped chunk by chunk on its dense form (map_detail::run_chunk)
  return require_backend("TensorDict::map")->map(*this, fn, options);
}

TensorDict TensorDict::map(const std::string& fn_name, const MapOptions& options) const {
  MapFn fn = find_map_fn(fn_name);
  if (!fn) {
    std::string known;
    for (const auto& n : registered_map_fns()) known += (known.empty() ? "" : ", ") + n;
    throw KeyError("map: no map function named '" + fn_name + "' is registered (tensordict::register_map_fn); " +
                   (known.empty() ? std::string("none is registered") : "registered: " + known));
  }
  return require_backend("TensorDict::map")->map_named(*this, fn_name, fn, options);
}

MapIter TensorDict::map_iter(const MapFn& fn, const MapOptions& options) const {
  if (!fn) throw ValueError("map_iter: fn is empty");
  return require_backend("TensorDict::map_iter")->map_iter(*this, fn, options);
}

// ============================================================================ MapIter
std::optional<TensorDict> MapIter::next() {
  if (!source_) return std::nullopt;
  std::optional<TensorDict> r;
  try {
    r = source_->next();
  } catch (...) {
    stop();
    throw;
  }
  if (!r) stop();
  return r;
}

void MapIter::stop() noexcept {
  if (!source_) return;
  try {
    source_->stop();
  } catch (...) {
  }
  source_.reset();
}

// ============================================================================ semantics
namespace map_detail {

MapPlan plan(const TensorDict& src, const MapOptions& o, bool for_iter, int64_t default_workers,
             int64_t default_worker_threads, bool default_progress) {
  const char* what = for_iter ? "map_iter" : "map";
  if (!src.defined()) throw ValueError(std::string(what) + ": the TensorDict is undefined");
  MapPlan p;
  if (o.worker_processes() < 0) {
    throw ValueError(std::string(what) + ": worker_processes must be >= 0, got " +
                     std::to_string(o.worker_processes()));
  }
  if (for_iter && o.worker_processes() > 0) {
    throw ValueError("map_iter runs in-process workers only (worker_processes " +
                     std::to_string(o.worker_processes()) + "): worker processes write into a memmap/shared out, "
                     "use map(\"fn name\", MapOptions().out(...).worker_processes(n))");
  }
  const int64_t workers =
      o.num_workers().value_or(o.worker_processes() > 0 ? o.worker_processes() : default_workers);
  if (workers <= 0) {
    throw ValueError(std::string(what) + ": num_workers must be a positive integer, got " + std::to_string(workers));
  }
  if (o.worker_processes() > workers) {
    throw ValueError(std::string(what) + ": worker_processes (" + std::to_string(o.worker_processes()) +
                     ") exceeds num_workers (" + std::to_string(workers) +
                     "); num_workers counts every worker, in-process and process");
  }
  if (o.worker_processes() > 0) {
    if (!o.out()) {
      throw ValueError(std::string(what) + ": worker processes write their results into out: give a memmap or "
                       "shared out (MapOptions().out(td.memmap_like(dir)) or a share_memory_()'d one)");
    }
    if (o.out()->defined() && !(o.out()->is_memmap() || o.out()->is_shared() || detail::is_storage_view(*o.out()))) {
      throw ValueError(std::string(what) + ": worker processes need a memmap or shared out (they write into it "
                       "in place); out is an in-memory TensorDict");
    }
  }
  if (o.chunksize() && o.num_chunks()) {
    throw ValueError("Either chunksize or num_chunks must be provided, but not both.");
  }
  if (o.chunksize() && *o.chunksize() < 0) {
    throw ValueError(std::string(what) + ": chunksize must be >= 0 (0 = one element per chunk), got " +
                     std::to_string(*o.chunksize()));
  }
  if (o.num_chunks() && *o.num_chunks() <= 0) {
    throw ValueError(std::string(what) + ": num_chunks must be a positive integer, got " +
                     std::to_string(*o.num_chunks()));
  }
  const int64_t wthreads = o.worker_threads().value_or(default_worker_threads);
  if (wthreads <= 0) {
    throw ValueError(std::string(what) + ": worker_threads must be a positive integer, got " +
                     std::to_string(wthreads));
  }
  const BatchSize& bs = src.batch_size();
  const auto nd = static_cast<int64_t>(bs.size());
  if (nd == 0) {
    throw IndexError(std::string(what) + ": cannot split a TensorDict with batch_size " + detail::shape_str(bs) +
                     " along dim " + std::to_string(o.dim()) + " (it has no batch dimension)");
  }
  if (o.dim() < -nd || o.dim() >= nd) {
    throw IndexError(std::string(what) + ": dim " + std::to_string(o.dim()) + " is out of range for batch_size " +
                     detail::shape_str(bs) + " (expected a dim in [" + std::to_string(-nd) + ", " +
                     std::to_string(nd - 1) + "])");
  }
  p.dim = o.dim() < 0 ? o.dim() + nd : o.dim();
  if (for_iter && o.out()) {
    throw ValueError("map_iter does not accept out (use map(fn, MapOptions().out(...)))");
  }
  if (!for_iter && o.shuffle()) {
    throw ValueError("map: shuffle is a map_iter option (map keeps the order of the chunks)");
  }
  if (o.out()) {
    const TensorDict& out = *o.out();
    if (!out.defined()) throw ValueError("map: out is an undefined TensorDict");
    if (out.batch_size() != bs) {
      throw BatchSizeError("map: out has batch_size " + detail::shape_str(out.batch_size()) +
                           " but the TensorDict mapped has batch_size " + detail::shape_str(bs) +
                           " (out must have the batch size of the source)");
    }
    p.out = out;
    p.in_place_out = out.is_memmap() || out.is_shared();
  }
  p.shuffle = o.shuffle();
  p.worker_threads = wthreads;
  p.progress = o.progress().value_or(default_progress);
  if (o.seed()) {
    p.seed = *o.seed();
  } else {
    // upstream: seed = torch.empty((), int64).random_(generator), i.e. drawn from torch's default generator
    // (at::manual_seed makes it reproducible); a std::random_device costs ~26 us per map call here
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    p.seed = static_cast<int64_t>(at::check_generator<at::CPUGeneratorImpl>(gen)->random64() &
                                  ((uint64_t{1} << 62) - 1));
  }

  const int64_t n = bs[static_cast<size_t>(p.dim)];
  std::vector<int64_t> perm;
  if (p.shuffle && n > 0) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(p.seed));
    at::Tensor rp = at::randperm(n, gen, at::kLong);
    perm.assign(rp.data_ptr<int64_t>(), rp.data_ptr<int64_t>() + n);
  }
  auto add_slice = [&](int64_t start, int64_t len) {
    MapChunk c;
    c.start = start;
    c.length = len;
    if (p.shuffle) c.indices.assign(perm.begin() + start, perm.begin() + start + len);
    p.chunks.push_back(std::move(c));
  };
  if (o.chunksize() && *o.chunksize() == 0) {
    p.stack = true;
    for (int64_t i = 0; i < n; ++i) {
      MapChunk c;
      c.start = p.shuffle ? perm[static_cast<size_t>(i)] : i;
      c.length = 1;
      c.drop_dim = true;
      p.chunks.push_back(std::move(c));
    }
  } else {
    int64_t size;
    if (o.chunksize()) {
      size = std::min(*o.chunksize(), n);
    } else {
      const int64_t k = std::min(o.num_chunks().value_or(workers), std::max<int64_t>(n, 1));
      size = (n + k - 1) / k;  // upstream td.chunk(k): slices of ceil(n / k)
    }
    if (n == 0) {
      add_slice(0, 0);
    } else {
      for (int64_t s = 0; s < n; s += size) add_slice(s, std::min(size, n - s));
    }
  }
  p.num_workers = std::max<int64_t>(1, std::min<int64_t>(workers, static_cast<int64_t>(p.chunks.size())));
  p.num_processes = std::min<int64_t>(o.worker_processes(), p.num_workers);
  return p;
}

TensorDict take_chunk(const TensorDict& td, const MapPlan& plan, const MapChunk& c) {
  const int64_t d = plan.dim;
  if (!detail::is_dense_tree(td)) {
    // another node kind (an HDF5 file, a Redis store, a lazy stack): its own index, so that a chunk of `out`
    // is a view whose writes land in the storage (map_batch would work on a dense copy)
    Index idx(static_cast<size_t>(d), at::indexing::Slice());
    if (!c.indices.empty()) {
      idx.emplace_back(at::tensor(c.indices, at::kLong));
    } else if (c.drop_dim) {
      idx.emplace_back(c.start);
    } else {
      idx.emplace_back(at::indexing::Slice(c.start, c.start + c.length));
    }
    return td.index(idx);
  }
  BatchSize nb = td.batch_size();
  if (!c.indices.empty()) {
    at::Tensor idx = at::tensor(c.indices, at::kLong);
    nb[static_cast<size_t>(d)] = static_cast<int64_t>(c.indices.size());
    return detail::map_batch(td, nb, [&](const at::Tensor& t) { return t.index_select(d, idx); }, false);
  }
  if (c.drop_dim) {
    nb.erase(nb.begin() + d);
    return detail::map_batch(td, nb, [&](const at::Tensor& t) { return t.select(d, c.start); }, true);
  }
  nb[static_cast<size_t>(d)] = c.length;
  return detail::map_batch(td, nb, [&](const at::Tensor& t) { return t.narrow(d, c.start, c.length); }, true);
}

namespace {
//! out_chunk.update_(result) for a memmap / shared out without a page fault per fresh page: each tensor leaf
//! of result goes into its leaf of out_chunk by pwrite (a file mapping) or after MADV_POPULATE_WRITE, else by
//! stores. False (nothing written) when the leaves do not pair up one to one (update_ then raises or copies).
bool write_mapped(const TensorDict& view, const TensorDict& result, MapOutWrite mode) {
  // dense nodes through and through (the tree visitor's dense levels)
  if (!detail::tree::level_of(view, detail::tree::Descend::DenseOnly) || !detail::is_dense_tree(view) ||
      !detail::is_dense_tree(result)) {
    return false;
  }
  const auto leaves = result.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true));
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  for (const auto& kv : leaves) {
    if (!kv.second.is_tensor() || !view.contains(kv.first)) return false;
    const Entry dst = view.get_entry(kv.first);
    if (!dst.is_tensor()) return false;
    const at::Tensor& s = kv.second.tensor();
    const at::Tensor& d = dst.tensor();
    if (s.sizes() != d.sizes()) return false;  // broadcasting: update_'s copy
    pairs.emplace_back(d, s);
  }
  for (auto& p : pairs) {
    if (mode == MapOutWrite::Pwrite && backends::pwrite_into_mapping(p.first, p.second)) continue;
    backends::allocate_for_write(p.first);  // false (nothing done) where they do not apply
    backends::populate_for_write(p.first);
    p.first.copy_(p.second);
  }
  return true;
}
}  // namespace

void write_chunk(const TensorDict& out, const MapPlan& plan, size_t i, const TensorDict& result) {
  if (!result.defined()) return;  // fn returned None: nothing to write (it may have worked in place)
  try {
    TensorDict view = take_chunk(out, plan, plan.chunks[i]);
    if (view.batch_size() != result.batch_size()) {
      throw BatchSizeError("the result has batch_size " + detail::shape_str(result.batch_size()) +
                           " but out's slice has batch_size " + detail::shape_str(view.batch_size()));
    }
    if (plan.in_place_out && plan.out_write != MapOutWrite::Copy && write_mapped(view, result, plan.out_write)) {
      return;
    }
    view.update_(result);
  } catch (...) {
    rethrow_with_prefix("map: cannot write the result of " + chunk_name(plan, i) + " into out: ",
                        static_cast<int64_t>(i));
  }
}

TensorDict gather(const std::vector<TensorDict>& results, const MapPlan& plan) {
  std::vector<TensorDict> defined;
  std::vector<size_t> which;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].defined()) {
      defined.push_back(results[i]);
      which.push_back(i);
    }
  }
  if (defined.empty()) return TensorDict::undefined();
  // chunksize 0: upstream's maybe_dense_stack (a lazy stack when the per-element results differ in leaf
  // shapes, keys or batch sizes); chunks: concatenated
  auto combine = [&](const std::vector<TensorDict>& tds) {
    if (!plan.stack) return cat(tds, plan.dim);
    try {
      return stack(tds, plan.dim);
    } catch (const Error&) {
      return TensorDict(LazyStackedTensorDict(tds, plan.dim));
    }
  };
  try {
    return combine(defined);
  } catch (...) {
    // find the first chunk that does not combine with the first one, and name it
    const char* op = plan.stack ? "stack" : "concatenate";
    const std::string hint;
    for (size_t j = 1; j < defined.size(); ++j) {
      try {
        combine({defined[0], defined[j]});
      } catch (...) {
        rethrow_with_prefix(std::string("map: cannot ") + op + " the results of fn: the result of " +
                                chunk_name(plan, which[j]) + " does not match that of " +
                                chunk_name(plan, which[0]) + ": ",
                            static_cast<int64_t>(which[j]), hint);
      }
    }
    rethrow_with_prefix(std::string("map: cannot ") + op + " the results of fn: ", -1, hint);
  }
}

namespace {
//! the dense level of a result or of an entry's sub-TensorDict, or null (another node kind: gathered at the end)
const TensorDictImpl* dense_of(const TensorDict& td) { return detail::tree::level_of(td, detail::tree::Descend::DenseOnly); }
const TensorDictImpl* dense_child(const Entry& e) { return dense_of(e.tensordict()); }

//! an empty level like `like` (its dense tree, tensor leaves only) with `total` rows along dim; false when a level
//! or leaf is not of the plain kind
bool alloc_like(const TensorDictImpl& like, int64_t dim, int64_t total, TensorDict* out) {
  if (static_cast<int64_t>(like.batch_size.size()) <= dim) return false;
  BatchSize bs = like.batch_size;
  bs[static_cast<size_t>(dim)] = total;
  TensorDict level = detail::make_empty(like, bs);
  TensorDictImpl& r = *static_cast<TensorDictImpl*>(level.node().get());
  r.entries.reserve(like.entries.size());
  for (const auto& [key, e] : like.entries) {
    if (e.is_tensor()) {
      const at::Tensor& t = e.tensor();
      if (t.layout() != at::kStrided || t.requires_grad()) return false;
      std::vector<int64_t> sizes = t.sizes().vec();
      sizes[static_cast<size_t>(dim)] = total;
      r.entries.emplace_back(key, Entry(at::empty(sizes, t.options().memory_format(t.suggest_memory_format()))));
    } else if (e.is_tensordict()) {
      const TensorDictImpl* sub = dense_child(e);
      TensorDict child;
      if (!sub || !alloc_like(*sub, dim, total, &child)) return false;
      r.entries.emplace_back(key, Entry(child));
    } else {
      return false;
    }
  }
  *out = std::move(level);
  return true;
}

//! r's leaves copied into rows [off, off + rows) along dim of `out`'s (same keys in the same order, dtypes,
//! devices, shapes but along dim); false at the first thing that differs
bool place_level(const TensorDictImpl& out, const TensorDictImpl& r, int64_t dim, int64_t off, int64_t rows) {
  const auto d = static_cast<size_t>(dim);
  if (r.batch_size.size() != out.batch_size.size() || r.batch_size[d] != rows || r.entries.size() != out.entries.size())
    return false;
  for (size_t j = 0; j < r.batch_size.size(); ++j)
    if (j != d && r.batch_size[j] != out.batch_size[j]) return false;
  for (size_t j = 0; j < r.entries.size(); ++j) {
    const auto& [key, e] = r.entries[j];
    const auto& [okey, oe] = out.entries[j];
    if (key != okey) return false;
    if (e.is_tensor() && oe.is_tensor()) {
      const at::Tensor& t = e.tensor();
      const at::Tensor& o = oe.tensor();
      if (t.scalar_type() != o.scalar_type() || t.device() != o.device() || t.layout() != at::kStrided ||
          t.requires_grad() || t.dim() != o.dim())
        return false;
      for (int64_t k = 0; k < t.dim(); ++k)
        if (k != dim ? t.size(k) != o.size(k) : t.size(k) != rows) return false;
      if (dim == 0 && t.is_contiguous() && o.is_contiguous() && !t.is_conj() && !t.is_neg()) {
        // rows of a C-contiguous leaf are one block: the copy without an operator's dispatch (a chunk of 10 rows)
        const int64_t row_bytes = o.numel() / std::max<int64_t>(o.size(0), 1) * static_cast<int64_t>(o.element_size());
        if (rows > 0 && row_bytes > 0) {
          std::memcpy(static_cast<char*>(o.data_ptr()) + off * row_bytes, t.data_ptr(),
                      static_cast<size_t>(rows * row_bytes));
        }
      } else {
        o.narrow(dim, off, rows).copy_(t);
      }
    } else if (e.is_tensordict() && oe.is_tensordict()) {
      const TensorDictImpl* sub = dense_child(e);
      const TensorDictImpl* osub = dense_child(oe);
      if (!sub || !osub || !place_level(*osub, *sub, dim, off, rows)) return false;
    } else {
      return false;
    }
  }
  return true;
}
}  // namespace

struct ChunkGather::State {
  const MapPlan& plan;
  std::vector<int64_t> offsets;  //!< chunk i's first row of the result along plan.dim (size chunks + 1)
  bool ranges = false;           //!< every chunk a range (no shuffle, not stacked, no out)
  TensorDict out;
  std::atomic<bool> ready{false};
  explicit State(const MapPlan& p) : plan(p) {}
};

ChunkGather::ChunkGather(const MapPlan& plan) : s_(std::make_unique<State>(plan)) {
  s_->ranges = !plan.stack && !plan.out && !plan.chunks.empty();
  s_->offsets.reserve(plan.chunks.size() + 1);
  s_->offsets.push_back(0);
  for (const MapChunk& c : plan.chunks) {
    if (c.drop_dim || !c.indices.empty()) s_->ranges = false;
    s_->offsets.push_back(s_->offsets.back() + c.length);
  }
}
ChunkGather::~ChunkGather() = default;

bool ChunkGather::start(size_t i, const TensorDict& r) {
  if (!s_->ranges || !r.defined() || r.typed_schema()) return false;
  const TensorDictImpl* level = dense_of(r);
  const auto d = static_cast<size_t>(s_->plan.dim);
  if (!level || level->batch_size.size() <= d || level->batch_size[d] != s_->offsets[i + 1] - s_->offsets[i]) return false;
  TensorDict out;
  try {
    if (!alloc_like(*level, s_->plan.dim, s_->offsets.back(), &out)) return false;
  } catch (const c10::Error&) {  // a dtype or device at::empty does not make: the cat at the end decides
    return false;
  }
  s_->out = std::move(out);
  s_->ready.store(true, std::memory_order_release);  // from here on, out is only read (its leaves written by rows)
  return place(i, r);
}

bool ChunkGather::ready() const { return s_->ready.load(std::memory_order_acquire); }

bool ChunkGather::place(size_t i, const TensorDict& r) const {
  if (!ready() || !r.defined() || r.typed_schema()) return false;
  const TensorDictImpl* level = dense_of(r);
  const TensorDictImpl* out = dense_of(s_->out);
  const int64_t off = s_->offsets[i];
  try {
    return level && place_level(*out, *level, s_->plan.dim, off, s_->offsets[i + 1] - off);
  } catch (const c10::Error&) {  // a copy torch refuses: kept whole, and the cat at the end says why
    return false;
  }
}

TensorDict ChunkGather::finish(const std::vector<TensorDict>& results, const std::vector<char>& placed) const {
  if (!ready()) return gather(results, s_->plan);
  bool all = true;
  for (size_t i = 0; i < results.size(); ++i) all = all && placed[i];
  if (all) return s_->out;
  // some results did not fit: the placed rows (views) beside them, concatenated as gather does
  std::vector<TensorDict> pieces = results;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!placed[i]) continue;
    Index idx(static_cast<size_t>(s_->plan.dim), at::indexing::Slice());
    idx.emplace_back(at::indexing::Slice(s_->offsets[i], s_->offsets[i + 1]));
    pieces[i] = s_->out.index(idx);
  }
  return gather(pieces, s_->plan);
}

TensorDict run_chunk(const TensorDict& src, const MapFn& fn, const MapPlan& plan, size_t i, MapWorkerContext& ctx) {
  ctx.chunk = static_cast<int64_t>(i);
  // at::set_num_threads is process-global with libtorch's native backend and per calling thread with
  // OpenMP (Debian's build): set it only when it differs, right before fn runs on this scheduler thread.
  if (at::get_num_threads() != plan.worker_threads) at::set_num_threads(static_cast<int>(plan.worker_threads));
  WorkerScope scope(&ctx);
  // fn gets a dense TensorDict whichever way map was called (td.map, Engine::map, map_iter; a worker thread,
  // actor or process): a chunk of a lazy stack (or of a tree holding one, or of a store) in its dense form
  TensorDict chunk = detail::dense_tree(take_chunk(src, plan, plan.chunks[i]));
  TensorDict result = fn(chunk);
  if (plan.in_place_out) {
    write_chunk(*plan.out, plan, i, result);
    return TensorDict::undefined();
  }
  return result;
}

TensorDict call_with_context(const MapFn& fn, const TensorDict& input, const MapWorkerContext& ctx) {
  WorkerScope scope(&ctx);
  return fn(input);
}

CarriedError carry_current_exception(int64_t chunk) {
  CarriedError ce;
  ce.chunk = chunk;
  try {
    throw;
  } catch (const Error& e) {
    ce.code = e.code();
    ce.message = e.message();
  } catch (const c10::Error& e) {
    ce.code = detail::torch_error_code(e);
    ce.message = detail::torch_message(e);
  } catch (const std::exception& e) {
    ce.code = ErrorCode::Runtime;
    ce.message = e.what();
  } catch (...) {
    ce.code = ErrorCode::Runtime;
    ce.message = "a map worker threw an exception that is not a std::exception" +
                 (chunk >= 0 ? " (chunk " + std::to_string(chunk) + ")" : std::string());
  }
  return ce;
}

void rethrow(const CarriedError& e) { throw_error(e.code, e.message); }

}  // namespace map_detail
}  // namespace tensordict
