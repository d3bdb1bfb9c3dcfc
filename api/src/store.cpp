#include "tensordict/store.hpp"

#include "tensordict/actors/runtime.hpp"
#include "tensordict/actors/store_actor.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/engine.hpp"

namespace tensordict {

namespace {
std::shared_ptr<actors::Runtime> runtime_of(const std::shared_ptr<Engine>& engine) {
  return (engine ? engine : Engine::default_engine())->runtime();
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

Store Store::connect(const std::string& host, uint16_t port, const std::shared_ptr<Engine>& engine) {
  return Store(actors::StoreClient::connect(runtime_of(engine), host, port));
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
    client_->call(r, {}, TensorDict(std::shared_ptr<TensorDictImpl>()), value);
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
  if (client_->remote()) throw ValueError("Store::read: a connected store reads rows through its mapping (get)");
  return client_->call(request(actors::StoreOp::Read), index).td;
}

void Store::write(const Index& index, const TensorDict& value) const {
  if (client_->remote()) throw ValueError("Store::write: a connected store writes rows through its mapping (set_)");
  client_->call(request(actors::StoreOp::Write), index, value);
}

uint16_t Store::publish(uint16_t port) const { return client_->publish(port); }
void Store::close() const { client_->close(); }

}  // namespace tensordict
