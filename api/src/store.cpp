#include "tensordict/store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tensordict/actors/runtime.hpp"
#include "tensordict/actors/store_actor.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/engine.hpp"

namespace tensordict {

namespace {
std::shared_ptr<actors::Runtime> runtime_of(const std::shared_ptr<Engine>& engine) {
  return (engine ? engine : Engine::default_engine())->runtime();
}

std::string shape_text(at::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

actors::store_request request(actors::StoreOp op) {
  actors::store_request r;
  r.op = static_cast<int32_t>(op);
  return r;
}
}  // namespace

Store Store::open(const TensorDict& td, const std::shared_ptr<Engine>& engine) {
  if (!td.defined()) throw ValueError("Store::open: the TensorDict is undefined");
  std::shared_ptr<actors::StoreBackend> backend;
  if (td.is_shared()) {
    backend = actors::make_shared_store(td);
  } else if (td.is_memmap()) {
    backend = actors::make_memmap_store(td);
  } else {
    throw ValueError("Store::open: a store needs a memmap TensorDict saved to a directory or a shared one "
                     "(share_memory_()); this one is in ordinary memory");
  }
  return Store(actors::StoreClient::open(runtime_of(engine), std::move(backend)));
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

std::string Store::kind() const { return client_->kind(); }
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
  if (!client_->remote()) {
    actors::store_request r = request(actors::StoreOp::AddKey);
    r.key = key.parts();
    client_->call(r, {}, value);
    return;
  }
  // another process: the owner adds a zero-filled leaf, then the values go straight into the mapping
  add_key(key, BatchSize(value.sizes().begin(), value.sizes().end()), value.scalar_type());
  td().get(key).copy_(value);
}

void Store::add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) const {
  actors::store_request r = request(actors::StoreOp::AddKey);
  r.key = key.parts();
  r.shape.assign(shape.begin(), shape.end());
  r.dtype = backends::dtype_to_string(dtype);
  client_->call(r);
  if (client_->remote()) client_->refresh();
}

void Store::flush() const { client_->call(request(actors::StoreOp::Flush)); }
void Store::refresh() const { client_->refresh(); }

TensorDict Store::read(const Index& index) const {
  return read(td().keys(KeysOptions().include_nested(true).leaves_only(true)), index);
}

TensorDict Store::read(const std::vector<NestedKey>& keys, const Index& index) const {
  if (client_->remote()) throw ValueError("Store::read: a connected store reads rows through its mapping (get)");
  const TensorDict snap = td();
  actors::store_rows rows;
  rows.index = ResolvedIndex::resolve(snap.batch_size(), index);
  rows.keys = keys;
  const BatchSize result = rows.index->result_batch();
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
  std::vector<at::Tensor> got = client_->call(request(actors::StoreOp::Read), std::move(rows)).tensors;
  if (got.size() != keys.size()) throw BackendError("Store::read: the store answered with a wrong count of leaves");
  for (size_t i = 0; i < keys.size(); ++i) out.set(keys[i], got[i]);
  return out;
}

void Store::write(const Index& index, const TensorDict& value) const {
  if (client_->remote()) throw ValueError("Store::write: a connected store writes rows through its mapping (set_)");
  if (!value.defined()) throw ValueError("Store::write: the value is undefined");
  const TensorDict snap = td();
  actors::store_rows rows;
  rows.index = ResolvedIndex::resolve(snap.batch_size(), index);
  const BatchSize result = rows.index->result_batch();
  const size_t nb = snap.batch_size().size();
  for (const auto& kv : value.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (!kv.second.is_tensor()) {
      throw NotImplementedError("Store::write: a store holds tensor leaves only, not the " +
                                std::string(Entry::kind_name(kv.second.kind())) + " " + kv.first.repr());
    }
    std::optional<Entry> leaf = snap.get_entry_opt(kv.first);
    if (!leaf || !leaf->is_tensor()) {
      throw KeyError("Store::write: " + kv.first.repr() + " is not a leaf of the store (add it with add_key)");
    }
    const at::Tensor& dst = leaf->tensor();
    BatchSize target = result;  // the selection, then the leaf's own dims after the store's batch
    target.insert(target.end(), dst.sizes().begin() + static_cast<long>(nb), dst.sizes().end());
    at::Tensor v;
    try {
      v = kv.second.tensor().to(dst.scalar_type()).expand(target);
    } catch (const c10::Error&) {
      throw ValueError("Store::write: the value of " + kv.first.repr() + " of shape " +
                       shape_text(kv.second.tensor().sizes()) + " does not broadcast to the selection " +
                       shape_text(target));
    }
    rows.keys.push_back(kv.first);
    rows.values.push_back(std::move(v));
  }
  if (rows.keys.empty()) return;
  client_->call(request(actors::StoreOp::Write), std::move(rows));
}

uint16_t Store::publish(uint16_t port) const { return client_->publish(port); }
void Store::close() const { client_->close(); }

}  // namespace tensordict
