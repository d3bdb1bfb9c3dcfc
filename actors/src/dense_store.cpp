// The dense stores of the one store stack (store_client.hpp): the LeafStore interface over a TensorDict held
// in this process's memory. A memmap directory (MemmapStore), a shared-memory TensorDict (SharedStore), and
// another process's store as a connected client maps it (ConnectedStore: its new keys and flushes go to the
// owner's actor, its rows straight into its own mapping).
#include <sys/statvfs.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>

#include "tensordict/actors/runtime.hpp"
#include "tensordict/actors/store_client.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/shape_text.hpp"
#include "tensordict/memmap_storage.hpp"
#include "tensordict/non_tensor.hpp"

namespace tensordict {
namespace actors {

namespace {

//! bytes the file system holding `path` still gives an unprivileged writer; -1 when statvfs fails
int64_t free_bytes_at(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return -1;
  const unsigned long long b = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
  return b > static_cast<unsigned long long>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(b);
}

NestedKey key_of(const backends::LeafPath& path) { return NestedKey(path); }

//! the tensor leaf of td at path: KeyError when missing or not a tensor
at::Tensor leaf_at(const TensorDict& td, const backends::LeafPath& path) {
  std::optional<Entry> e = path.empty() ? std::nullopt : td.get_entry_opt(key_of(path));
  if (!e || !e->is_tensor()) throw KeyError("store: " + key_of(path).repr() + " is not a tensor leaf of the store");
  return e->tensor();
}

//! rows along dim 0 of a leaf with n rows: ValueError when one is out of range
void check_rows(const backends::RowList& rows, int64_t n, const backends::LeafPath& path) {
  if (!rows.empty() && (rows.front() < 0 || rows.back() >= n)) {
    throw ValueError("store: rows " + std::to_string(rows.front()) + ".." + std::to_string(rows.back()) + " of " +
                     key_of(path).repr() + " outside its " + std::to_string(n) + " rows");
  }
}

//! true when the (ascending, unique) rows are one run: a view (narrow) instead of a gather
bool one_run(const backends::RowList& rows) {
  return !rows.empty() && rows.back() - rows.front() + 1 == static_cast<int64_t>(rows.size());
}

at::Tensor row_index(const backends::RowList& rows) {
  return at::tensor(at::ArrayRef<int64_t>(rows.vec()), at::TensorOptions().dtype(at::kLong));
}

}  // namespace

// ============================================================================ DenseStore
DenseStore::DenseStore(std::string kind, TensorDict td, int64_t max_key_bytes)
    : kind_(std::move(kind)), max_key_bytes_(max_key_bytes) {
  td.lock_();
  td_ = std::move(td);
}

TensorDict DenseStore::td() const {
  std::lock_guard<std::mutex> lock(mu_);
  return td_;
}

int64_t DenseStore::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

void DenseStore::publish(TensorDict next, std::optional<int64_t> version) {
  next.lock_();  // a snapshot: keys cannot be added behind the store's back; rows are writable
  std::lock_guard<std::mutex> lock(mu_);
  td_ = std::move(next);
  version_ = version ? *version : version_ + 1;
}

store_response DenseStore::request(store_request req) {
  (void)req;
  throw ValueError("store: the owner's store takes its requests itself, not through a connection");
}

StorageSpec DenseStore::spec() const { return StorageSpec::of(td(), "the store"); }

JsonValue DenseStore::spec_fields() const {
  JsonValue::Object o;
  const StorageSpec sp = spec();
  const JsonValue& j = sp.json();
  if (j.is_object()) {
    for (const auto& kv : j.as_object())
      if (kv.first != "driver") o.push_back(kv);
  }
  return JsonValue::object(std::move(o));
}

std::optional<std::vector<int64_t>> DenseStore::stored_batch_size() const {
  const BatchSize& b = td().batch_size();
  return std::vector<int64_t>(b.begin(), b.end());
}

void DenseStore::set_stored_batch_size(const std::vector<int64_t>& batch) {
  const BatchSize& b = td().batch_size();
  if (!std::equal(b.begin(), b.end(), batch.begin(), batch.end())) {
    throw ValueError("store: the batch size " + shape_text(b) + " of a " + kind_ + " store is fixed, not " +
                     shape_text(batch));
  }
}

std::vector<backends::LeafInfo> DenseStore::list() {
  std::vector<backends::LeafInfo> out;
  std::function<void(const TensorDict&, const backends::LeafPath&)> walk = [&](const TensorDict& t,
                                                                              const backends::LeafPath& at) {
    for (const auto& kv : t.items()) {
      backends::LeafInfo info;
      info.path = at;
      info.path.push_back(kv.first.parts()[0]);
      if (kv.second.is_tensordict()) {
        info.kind = backends::LeafKind::Group;
        out.push_back(info);
        walk(kv.second.tensordict(), info.path);
        continue;
      }
      if (kv.second.is_tensor()) {
        info.dtype = kv.second.tensor().scalar_type();
        info.shape.assign(kv.second.tensor().sizes().begin(), kv.second.tensor().sizes().end());
      } else {
        info.kind = backends::LeafKind::NonTensor;
      }
      out.push_back(std::move(info));
    }
  };
  walk(td(), {});
  return out;
}

std::vector<at::Tensor> DenseStore::read(const std::vector<backends::LeafRead>& reads) {
  const TensorDict t = td();
  std::vector<at::Tensor> out;
  out.reserve(reads.size());
  for (const auto& r : reads) {
    at::Tensor leaf = leaf_at(t, r.path);
    at::Tensor v = leaf;
    if (!r.whole) {
      if (leaf.dim() == 0) throw ValueError("store: rows of the 0-dim leaf " + key_of(r.path).repr());
      check_rows(r.rows, leaf.size(0), r.path);
      v = one_run(r.rows) ? leaf.narrow(0, r.rows.front(), static_cast<int64_t>(r.rows.size()))
                          : leaf.index_select(0, row_index(r.rows));
    }
    if (r.shape) {
      if (c10::multiply_integers(*r.shape) != v.numel()) {
        throw ValueError("store: the shape " + shape_text(*r.shape) + " asked for " + key_of(r.path).repr() +
                         " does not hold its " + std::to_string(v.numel()) + " elements");
      }
      v = v.reshape(*r.shape);  // a view of the storage where the rows are one run
    }
    out.push_back(std::move(v));
  }
  return out;
}

void DenseStore::write(const std::vector<backends::LeafWrite>& writes) {
  const TensorDict t = td();
  // every leaf checked before the first write: an error writes nothing
  std::vector<at::Tensor> targets;
  targets.reserve(writes.size());
  for (const auto& w : writes) {
    at::Tensor leaf = leaf_at(t, w.path);
    int64_t numel = leaf.numel();
    if (!w.whole) {
      if (leaf.dim() == 0) throw ValueError("store: rows of the 0-dim leaf " + key_of(w.path).repr());
      check_rows(w.rows, leaf.size(0), w.path);
      numel = static_cast<int64_t>(w.rows.size()) * c10::multiply_integers(leaf.sizes().slice(1));
    }
    if (!w.data.defined() || w.data.numel() != numel || w.data.scalar_type() != leaf.scalar_type()) {
      throw ValueError("store: the data written to " + key_of(w.path).repr() + " is not " + std::to_string(numel) +
                       " elements of " + std::string(c10::toString(leaf.scalar_type())));
    }
    targets.push_back(leaf);
  }
  for (size_t i = 0; i < writes.size(); ++i) {
    const auto& w = writes[i];
    const at::Tensor& leaf = targets[i];
    if (w.whole) {
      leaf.copy_(w.data.reshape(leaf.sizes()));
      continue;
    }
    std::vector<int64_t> shape(leaf.sizes().begin(), leaf.sizes().end());
    shape[0] = static_cast<int64_t>(w.rows.size());
    const at::Tensor data = w.data.reshape(shape);
    if (one_run(w.rows)) {
      leaf.narrow(0, w.rows.front(), shape[0]).copy_(data);
    } else {
      leaf.index_copy_(0, row_index(w.rows), data);
    }
  }
}

bool DenseStore::erase(const backends::LeafPath& path) {
  throw NotImplementedError("a store cannot remove keys (" + key_of(path).repr() + ")");
}

backends::NonTensorValue DenseStore::read_non_tensor(const backends::LeafPath& path) {
  std::optional<Entry> e = path.empty() ? std::nullopt : td().get_entry_opt(key_of(path));
  if (!e) throw KeyError("store: " + key_of(path).repr() + " is not in the store");
  if (e->is_non_tensor_data()) return {e->non_tensor_data().value(), false};
  if (e->is_non_tensor_stack() && e->non_tensor_stack().batch_size().size() == 1) {
    return {JsonValue::array(e->non_tensor_stack().values()), true};
  }
  throw KeyError("store: " + key_of(path).repr() + " is not a non-tensor value of one row each along dim 0");
}

void DenseStore::write_non_tensor(const backends::LeafPath& path, const backends::NonTensorValue& value) {
  (void)value;
  throw NotImplementedError("a store holds tensor leaves only: cannot add the non-tensor " + key_of(path).repr());
}

void DenseStore::check_new_leaf(const NestedKey& key, const std::vector<int64_t>& shape, at::ScalarType dtype) const {
  const TensorDict t = td();
  if (key.size() == 0) throw KeyError("add_key: the key is empty");
  if (t.contains(key)) throw KeyError("add_key: key " + key.repr() + " already exists in the store");
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    NestedKey parent(std::vector<std::string>(key.parts().begin(), key.parts().begin() + static_cast<long>(i) + 1));
    if (!t.contains(parent)) break;  // this level and those below it are created with the leaf
    if (!t.get_entry(parent).is_tensordict()) {
      throw KeyError("add_key: " + parent.repr() + " is not a TensorDict, so it cannot hold " + key.repr());
    }
  }
  const BatchSize& bs = t.batch_size();
  if (shape.size() < bs.size() || !std::equal(bs.begin(), bs.end(), shape.begin())) {
    throw BatchSizeError("add_key: the shape " + shape_text(shape) + " of " + key.repr() +
                         " does not start with the store's batch size " + shape_text(bs));
  }
  // its bytes against the configured maximum and the space left, before anything is made
  for (int64_t d : shape)
    if (d <= 0) return;  // empty (nothing to store) or negative (the format refuses it with its own error)
  int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  bool overflow = false;
  for (int64_t d : shape) {
    if (bytes > INT64_MAX / d) {
      overflow = true;
      break;
    }
    bytes *= d;
  }
  const std::string size = overflow ? std::string("more than 2^63 bytes") : std::to_string(bytes) + " bytes";
  if (max_key_bytes_ > 0 && (overflow || bytes > max_key_bytes_)) {
    throw ValueError("add_key: " + key.repr() + " of shape " + shape_text(shape) + " needs " + size +
                     ", more than the store's limit of " + std::to_string(max_key_bytes_) +
                     " bytes (config store.max_key_bytes)");
  }
  const int64_t left = space_left();
  if (left >= 0 && (overflow || bytes > left)) {
    throw BackendError("add_key: " + key.repr() + " of shape " + shape_text(shape) + " needs " + size + ", but only " +
                       std::to_string(left) + " bytes are left for the " + kind_ + " store; nothing was added");
  }
}

namespace {

class MemmapStore final : public DenseStore {
 public:
  MemmapStore(const TensorDict& td, int64_t max_key_bytes) : DenseStore("memmap", checked(td), max_key_bytes) {
    prefix_ = memmap_prefix(td);
  }
  std::string describe() const override { return "memmap store " + prefix_; }
  void create(const backends::LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
              const at::Tensor& data, const backends::CreateOptions& options) override {
    (void)options;
    const NestedKey key = key_of(path);
    check_new_leaf(key, shape, dtype);
    backends::dtype_to_string(dtype);  // ValueError for a dtype Python's loader cannot read back
    TensorDict next = td().shallow_copy();
    make_memmap(next, key, BatchSize(shape.begin(), shape.end()), dtype);  // the file, then meta.json atomically
    if (data.defined()) next.get(key).copy_(data.reshape(shape));
    publish(next);
  }
  void refresh() override {
    TensorDict next = td().shallow_copy();
    next.memmap_refresh_();
    publish(next);
  }
  int64_t space_left() const override { return free_bytes_at(prefix_); }
  void flush() override {
    for (const Entry& e : td().values(KeysOptions().include_nested(true).leaves_only(true))) {
      if (e.is_tensor()) backends::flush(e.tensor());
    }
  }
  void close() override { flush(); }

 private:
  static TensorDict checked(const TensorDict& td) {
    if (!td.is_memmap() || memmap_prefix(td).empty()) {
      throw ValueError("a memmap store needs a memmap TensorDict saved to a directory (memmap_(prefix), "
                       "load_memmap or from_schema with storage \"memmap\")");
    }
    return td.shallow_copy();
  }
  std::string prefix_;
};

class SharedStore final : public DenseStore {
 public:
  SharedStore(const TensorDict& td, int64_t max_key_bytes) : DenseStore("shared", checked(td), max_key_bytes) {}
  std::string describe() const override { return "shared-memory store"; }
  void create(const backends::LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
              const at::Tensor& data, const backends::CreateOptions& options) override {
    (void)options;
    const NestedKey key = key_of(path);
    check_new_leaf(key, shape, dtype);
    const TensorDict cur = td();
    TensorDict one(cur.batch_size());
    one.set(key, data.defined() ? data.to(dtype).reshape(shape).contiguous()
                                : at::zeros(shape, at::TensorOptions().dtype(dtype)));
    one.share_memory_();  // a new segment for the leaf
    TensorDict next = cur.shallow_copy();  // unlocked, still is_shared (unlock_() would clear that)
    // the first missing level comes whole from `one` (shared like its leaf); else the leaf alone
    NestedKey first = key;
    for (size_t i = 0; i + 1 < key.size(); ++i) {
      NestedKey level(std::vector<std::string>(key.parts().begin(), key.parts().begin() + static_cast<long>(i) + 1));
      if (!next.contains(level)) {
        first = level;
        break;
      }
    }
    if (first.size() < key.size()) {
      next.set(first, one.get_td(first));
    } else {
      next.set(key, one.get(key));
    }
    publish(next);
  }
  void refresh() override {}  // the owner's structure is the truth; clients re-open the handle
  int64_t space_left() const override { return free_bytes_at("/dev/shm"); }  // where new segments go
  void flush() override {}  // shared memory: nothing to write back
  void close() override {}

 private:
  static TensorDict checked(const TensorDict& td) {
    if (!td.is_shared()) throw ValueError("a shared store needs a share_memory_()'d TensorDict");
    return td.shallow_copy();
  }
};

}  // namespace

std::shared_ptr<DenseStore> make_memmap_store(const TensorDict& td, int64_t max_key_bytes) {
  return std::make_shared<MemmapStore>(td, max_key_bytes);
}
std::shared_ptr<DenseStore> make_shared_store(const TensorDict& td, int64_t max_key_bytes) {
  return std::make_shared<SharedStore>(td, max_key_bytes);
}

// ============================================================================ ConnectedStore
namespace {

//! another process's dense store as a connected client maps it
class ConnectedStore final : public DenseStore {
 public:
  ConnectedStore(std::shared_ptr<Runtime> rt, caf::actor owner, std::string token, const store_response& info)
      : DenseStore(info.kind, open_storage(StorageSpec::parse(info.spec)), 0),
        system_(&rt->system()),
        timeout_(rt->request_timeout()),
        owner_(std::move(owner)),
        token_(std::move(token)),
        spec_text_(info.spec) {
    publish(td().shallow_copy(), info.version);
  }
  std::string describe() const override { return "the " + kind_ + " store of another process"; }
  StorageSpec spec() const override { return StorageSpec::parse(spec_text_); }
  bool connected() const override { return true; }
  void create(const backends::LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
              const at::Tensor& data, const backends::CreateOptions& options) override;
  void refresh() override;
  void flush() override;
  void close() override { owner_ = nullptr; }
  store_response request(store_request req) override;

 private:
  //! the owner's structure, mapped here when its version moved
  void adopt(const store_response& r);
  // the system, never the Runtime: the store lives as long as its actor, and the last reference to a Runtime
  // must not drop on an actor's thread (its system would join itself); the client holds the Runtime
  caf::actor_system* system_;
  std::chrono::milliseconds timeout_;
  caf::actor owner_;
  std::string token_;
  std::string spec_text_;
};

store_response ConnectedStore::request(store_request req) {
  if (!owner_) throw BackendError("store: the client is closed");
  req.token = token_;
  return store_request_blocking(*system_, owner_, req, timeout_);
}

void ConnectedStore::adopt(const store_response& r) {
  if (r.version == version()) return;
  const TensorDict current = td();
  TensorDict next = TensorDict::undefined();
  if (r.kind == "memmap") {
    next = current.shallow_copy();  // same files: map only the leaves that are new
    next.memmap_refresh_();
  } else {
    next = open_storage(StorageSpec::parse(r.spec));
  }
  publish(next, r.version);
}

void ConnectedStore::create(const backends::LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape,
                            const at::Tensor& data, const backends::CreateOptions& options) {
  (void)options;
  // the owner adds a zero-filled leaf, then the values go straight into this process's mapping
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::AddKey);
  req.key = path;
  req.dtype = backends::dtype_to_string(dtype);
  req.shape = shape;
  adopt(request(req));
  if (data.defined()) td().get(key_of(path)).copy_(data.reshape(shape));
}

void ConnectedStore::refresh() {
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::Info);
  adopt(request(req));
}

void ConnectedStore::flush() {
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::Flush);
  request(req);
}

}  // namespace

std::shared_ptr<DenseStore> connect_dense_store(std::shared_ptr<Runtime> rt, caf::actor owner, std::string token,
                                                const store_response& info) {
  return std::make_shared<ConnectedStore>(std::move(rt), std::move(owner), std::move(token), info);
}

}  // namespace actors
}  // namespace tensordict
