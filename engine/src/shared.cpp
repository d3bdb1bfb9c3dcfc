// Shared memory for TensorDicts (share_memory_, handles, from_schema) over backends/shm.
#include <mutex>

#include "tensor_dict_internal.hpp"
#include "tensordict/shared_storage.hpp"
#include "tree_visitor.hpp"
#include "tensordict/backends/shm.hpp"

namespace tensordict {
namespace {

std::mutex g_prefix_mu;
std::string g_prefix = "tensordict_";

void collect_leaves(const TensorDictImpl& impl, std::vector<std::vector<std::string>>& keys,
                    std::vector<at::Tensor>& tensors) {
  detail::tree::for_each_leaf(
      impl,
      [&](const detail::tree::KeyPath& p, const Entry& e) {
        if (!e.is_tensor()) return;
        keys.push_back(p.full().parts());
        tensors.push_back(e.tensor());
      },
      [](const detail::tree::KeyPath&, const TensorDict& sub) { detail::impl_of(sub); });  // NotImplementedError
}

void mark_shared(const std::shared_ptr<TensorDictImpl>& impl) {
  detail::tree::for_each_level(*impl, [](const detail::tree::KeyPath&, TensorDictImpl& level) {
    level.is_shared = true;
    level.is_memmap = false;
  });
}

}  // namespace

void set_shm_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> g(g_prefix_mu);
  g_prefix = prefix;
}
std::string shm_prefix() {
  std::lock_guard<std::mutex> g(g_prefix_mu);
  return g_prefix;
}

TensorDict& TensorDict::share_memory_() {
  detail::node_of(*this, "share_memory_").share_memory_(*this);
  return *this;
}

void TensorDictImpl::share_memory_(TensorDict& self) {
  if (is_memmap) {
    throw ValueError("share_memory_ and memmap_ are mutually exclusive: this TensorDict is memory-mapped");
  }
  if (is_shared) return;
  std::vector<std::vector<std::string>> keys;
  std::vector<at::Tensor> tensors;
  collect_leaves(*this, keys, tensors);
  if (!tensors.empty()) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].device().is_cpu()) {
        throw TypeError("share_memory_: leaf '" + NestedKey(keys[i]).join(".") + "' is not on the CPU");
      }
    }
    backends::ShmAllocation alloc = backends::share_tensors(keys, tensors, batch_size, shm_prefix());
    size_t i = 0;  // the leaves in the order collect_leaves listed them: each swapped for its shared copy
    detail::tree::for_each_leaf_mut(*this, [&](const detail::tree::KeyPath&, Entry& e) {
      if (e.is_tensor()) e = Entry(alloc.tensors[i++]);
    });
  }
  mark_shared(std::static_pointer_cast<TensorDictImpl>(shared_from_this()));
  self.lock_();
}

std::string share_handle(const TensorDict& td) {
  const std::shared_ptr<TensorDictImpl> d = detail::impl_of(td);
  if (!d->is_shared) throw ValueError("share_handle needs a shared TensorDict (call share_memory_() first)");
  std::vector<std::vector<std::string>> keys;
  std::vector<at::Tensor> tensors;
  collect_leaves(*d, keys, tensors);
  backends::ShmTensorDictHandle h;
  h.batch_size = d->batch_size;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto th = backends::handle_of(tensors[i]);
    if (!th) {
      throw ValueError("share_handle: leaf '" + NestedKey(keys[i]).join(".") +
                       "' is not a contiguous tensor in a shared-memory segment");
    }
    h.entries.push_back({keys[i], *th});
  }
  return backends::serialize(h);
}

TensorDict from_share_handle(const std::string& handle) {
  backends::ShmTensorDictHandle h = backends::parse_tensordict_handle(handle);
  std::vector<at::Tensor> tensors = backends::open_tensordict(h);
  TensorDict td(h.batch_size);
  for (size_t i = 0; i < tensors.size(); ++i) td.set(NestedKey(h.entries[i].key), tensors[i]);
  mark_shared(detail::impl_of(td));
  td.lock_();
  return td;
}

TensorDict TensorDict::from_schema(const Schema& schema, const BatchSize& batch_size, const std::string& storage,
                                   const MemmapOptions& options) {
  auto full_shape = [&](const BatchSize& elem) {
    BatchSize s = batch_size;
    s.insert(s.end(), elem.begin(), elem.end());
    return s;
  };
  for (auto b : batch_size)
    if (b < 0) throw BatchSizeError("from_schema: negative batch size " + detail::shape_str(batch_size));
  if (storage.empty() || storage == "none") {
    TensorDict td(batch_size);
    for (const auto& kv : schema)
      td.set(kv.first, at::zeros(full_shape(kv.second.first), at::TensorOptions().dtype(kv.second.second)));
    return td;
  }
  if (storage == "memmap") {
    if (options.prefix().empty()) throw ValueError("from_schema(storage=\"memmap\") needs MemmapOptions().prefix(dir)");
    // the expand trick: stride-0 views of one zero, then memmap_like preallocates sparse files
    TensorDict td(batch_size);
    for (const auto& kv : schema) {
      td.set(kv.first, at::zeros({}, at::TensorOptions().dtype(kv.second.second)).expand(full_shape(kv.second.first)));
    }
    return td.memmap_like(options.prefix(), options);
  }
  if (storage == "shared") {
    std::vector<backends::ShmLayoutEntry> entries;
    for (const auto& kv : schema) entries.push_back({kv.first.parts(), kv.second.second, full_shape(kv.second.first)});
    TensorDict td(batch_size);
    if (!entries.empty()) {
      backends::ShmAllocation alloc = backends::allocate(entries, batch_size, shm_prefix());
      for (size_t i = 0; i < entries.size(); ++i) td.set(NestedKey(entries[i].key), alloc.tensors[i]);
    }
    mark_shared(detail::impl_of(td));
    td.lock_();
    return td;
  }
  throw ValueError("Unknown storage backend '" + storage + "'. Valid storages: none, memmap, shared");
}

}  // namespace tensordict
