#include "tensordict/store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tensordict/actors/runtime.hpp"
#include "remote_internal.hpp"
#include "tensordict/actors/store_client.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/shape_text.hpp"
#include "tensordict/engine.hpp"

namespace tensordict {

namespace {
std::shared_ptr<actors::Runtime> runtime_of(const std::shared_ptr<Engine>& engine) {
  return (engine ? engine : Engine::default_engine())->runtime();
}

//! the leaves of the store at `keys`, as LeafInfos over the store's batch (KeyError naming a key that is not a
//! tensor leaf of the store); their selections share one row plan
std::vector<backends::LeafInfo> leaf_infos(const TensorDict& snap, const std::vector<NestedKey>& keys,
                                           const std::string& what) {
  std::vector<backends::LeafInfo> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    std::optional<Entry> e = snap.get_entry_opt(key);
    if (!e || !e->is_tensor()) {
      throw KeyError(what + ": " + key.repr() + " is not a leaf of the store (add it with add_key)");
    }
    backends::LeafInfo info;
    info.path = key.parts();
    info.dtype = e->tensor().scalar_type();
    info.shape.assign(e->tensor().sizes().begin(), e->tensor().sizes().end());
    out.push_back(std::move(info));
  }
  return out;
}
}  // namespace

Store Store::open(const TensorDict& td, const std::shared_ptr<Engine>& engine) {
  if (!td.defined()) throw ValueError("Store::open: the TensorDict is undefined");
  std::shared_ptr<actors::Runtime> rt = runtime_of(engine);
  const int64_t max_key_bytes = rt->config().store_max_key_bytes;
  std::shared_ptr<actors::DenseStore> backend;
  if (td.is_shared()) {
    backend = actors::make_shared_store(td, max_key_bytes);
  } else if (td.is_memmap()) {
    backend = actors::make_memmap_store(td, max_key_bytes);
  } else {
    throw ValueError("Store::open: a store needs a memmap TensorDict saved to a directory or a shared one "
                     "(share_memory_()); this one is in ordinary memory");
  }
  return Store(actors::StoreClient::open_dense(std::move(rt), std::move(backend)));
}

Store Store::open_memmap(const std::string& prefix, const std::shared_ptr<Engine>& engine) {
  return open(TensorDict::load_memmap(prefix, LoadOptions().writable(true)), engine);
}

Store Store::connect(const std::string& host, uint16_t port, const std::string& token,
                     const std::shared_ptr<Engine>& engine) {
  return Store(actors::StoreClient::connect(runtime_of(engine), host, port, token));
}

Store Store::connect(const std::string& host, uint16_t port, const std::shared_ptr<Engine>& engine) {
  return Store(actors::StoreClient::connect(runtime_of(engine), host, port, ""));
}

std::string Store::token() const { return client_->token(); }

void Store::save_token(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw BackendError("Store::save_token: cannot create " + tmp + ": " + std::strerror(errno));
  const std::string text = client_->token() + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    throw BackendError("Store::save_token: cannot write " + path + ": " + std::strerror(e));
  }
}

std::string Store::load_token(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw BackendError("Store::load_token: cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || (st.st_mode & 077) != 0 || st.st_uid != ::geteuid()) {
    ::close(fd);
    throw ValueError("Store::load_token: " + path +
                     " must be a file of this user that nobody else may read or write (mode 0600)");
  }
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  std::string token = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw ValueError("Store::load_token: " + path + " holds no token");
  return token;
}

std::string Store::kind() const { return client_->driver(); }
bool Store::is_remote() const { return client_->remote(); }
TensorDict Store::td() const { return client_->snapshot(); }
BatchSize Store::batch_size() const { return td().batch_size(); }
std::vector<NestedKey> Store::keys() const {
  return td().keys(KeysOptions().include_nested(true).leaves_only(true));
}
int64_t Store::version() const { return client_->version(); }

TensorDict Store::get(const Index& index) const { return td().index(index); }
void Store::set_(const Index& index, const TensorDict& value) const { td().index_put_(index, value); }

void Store::add_key(const NestedKey& key, const at::Tensor& value) const {
  if (!value.defined()) throw ValueError("add_key: the value is undefined");
  const at::Tensor data = value.detach().cpu().contiguous();
  const std::vector<int64_t> shape(data.sizes().begin(), data.sizes().end());
  client_->run([&](backends::LeafStore& s) { s.create(key.parts(), data.scalar_type(), shape, data, {}); });
}

void Store::add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) const {
  const std::vector<int64_t> full(shape.begin(), shape.end());
  client_->run([&](backends::LeafStore& s) { s.create(key.parts(), dtype, full, at::Tensor(), {}); });
}

void Store::flush() const {
  client_->run([](backends::LeafStore& s) { s.flush(); });
}
void Store::refresh() const {
  actors::DenseStore* dense = client_->dense();
  client_->run([dense](backends::LeafStore&) { dense->refresh(); });
}

TensorDict Store::read(const Index& index) const {
  return read(td().keys(KeysOptions().include_nested(true).leaves_only(true)), index);
}

TensorDict Store::read(const std::vector<NestedKey>& keys, const Index& index) const {
  if (client_->remote()) throw ValueError("Store::read: a connected store reads rows through its mapping (get)");
  const TensorDict snap = td();
  const ResolvedIndex sel = ResolvedIndex::resolve(snap.batch_size(), index);
  const std::vector<backends::LeafInfo> infos = leaf_infos(snap, keys, "Store::read");
  const BatchSize result = sel.result_batch();
  const size_t nb = snap.batch_size().size();
  TensorDict out(result, snap.device());
  // the levels first, with the extra batch dims a nested level has beyond the store's
  for (const auto& key : keys) {
    for (size_t n = 1; n < key.size(); ++n) {
      NestedKey level(std::vector<std::string>(key.parts().begin(), key.parts().begin() + static_cast<long>(n)));
      if (out.contains(level)) continue;
      const BatchSize& lb = snap.get_td(level).batch_size();
      BatchSize b = result;
      if (lb.size() > nb) b.insert(b.end(), lb.begin() + static_cast<long>(nb), lb.end());
      out.set(level, TensorDict(b, snap.device()));
    }
  }
  // ONE read request for every leaf, rows planned once over the store's batch
  const ResolvedIndex::RowPlan plan = sel.row_plan();
  std::vector<remote::LeafSel> sels;
  std::vector<backends::LeafRead> reads;
  for (const auto& info : infos) {
    sels.push_back(remote::LeafSel{&info, sel, &plan, snap.batch_size()});
    reads.push_back(remote::to_read(sels.back()));
  }
  std::vector<at::Tensor> got = reads.empty() ? std::vector<at::Tensor>{} : client_->read(std::move(reads));
  if (got.size() != keys.size()) throw BackendError("Store::read: the store answered with a wrong count of leaves");
  for (size_t i = 0; i < keys.size(); ++i) out.set(keys[i], remote::select_rows(sels[i], got[i]));
  return out;
}

void Store::write(const Index& index, const TensorDict& value) const {
  if (client_->remote()) throw ValueError("Store::write: a connected store writes rows through its mapping (set_)");
  if (!value.defined()) throw ValueError("Store::write: the value is undefined");
  const TensorDict snap = td();
  const ResolvedIndex sel = ResolvedIndex::resolve(snap.batch_size(), index);
  const BatchSize result = sel.result_batch();
  const size_t nb = snap.batch_size().size();
  std::vector<NestedKey> keys;
  std::vector<at::Tensor> values;
  for (const auto& kv : value.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (!kv.second.is_tensor()) {
      throw NotImplementedError("Store::write: a store holds tensor leaves only, not the " +
                                std::string(Entry::kind_name(kv.second.kind())) + " " + kv.first.repr());
    }
    keys.push_back(kv.first);
    values.push_back(kv.second.tensor());
  }
  const std::vector<backends::LeafInfo> infos = leaf_infos(snap, keys, "Store::write");
  const ResolvedIndex::RowPlan plan = sel.row_plan();
  std::vector<std::pair<remote::LeafSel, at::Tensor>> items;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto& info = infos[i];
    // the selection, then the leaf's own dims after the store's batch; checked for every key before any write
    BatchSize target = result;
    target.insert(target.end(), info.shape.begin() + static_cast<long>(nb), info.shape.end());
    at::Tensor v;
    try {
      v = values[i].to(info.dtype).expand(target);
    } catch (const c10::Error&) {
      throw ValueError("Store::write: the value of " + keys[i].repr() + " of shape " + shape_text(values[i].sizes()) +
                       " does not broadcast to the selection " + shape_text(target));
    }
    items.emplace_back(remote::LeafSel{&info, sel, &plan, snap.batch_size()}, remote::leaf_data(std::move(v), info.dtype));
  }
  if (!items.empty()) remote::write_selected(*client_, items);
}

TensorDict Store::tensordict() const {
  // the one store node over the store: the snapshot serves reads and indexing, new keys go to the store
  auto tree = std::make_shared<remote::RemoteTree>(client_, std::nullopt, td().device(), "TensorDict");
  return remote::make_remote(std::move(tree));
}

uint16_t Store::publish(uint16_t port) const { return client_->publish(port); }
void Store::close() const { client_->close(); }

}  // namespace tensordict
