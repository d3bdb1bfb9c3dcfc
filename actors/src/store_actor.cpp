#include "tensordict/actors/store_actor.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <caf/io/all.hpp>

#include "tensordict/actors/hot_actor.hpp"
#include "tensordict/actors/runtime.hpp"

#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/logging.hpp"
#include "tensordict/memmap_storage.hpp"

namespace tensordict {
namespace actors {

namespace {

std::string shape_str(const BatchSize& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

//! checks shared by every backend: a new key whose existing parents are TensorDicts (missing ones are created,
//! as set(("a", "b"), x) creates "a" upstream), a shape that starts with the batch size
void check_new_key(const TensorDict& td, const NestedKey& key, const BatchSize& shape) {
  if (key.size() == 0) throw KeyError("add_key: the key is empty");
  if (td.contains(key)) throw KeyError("add_key: key " + key.repr() + " already exists in the store");
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    NestedKey parent(std::vector<std::string>(key.parts().begin(), key.parts().begin() + static_cast<long>(i) + 1));
    if (!td.contains(parent)) break;  // this level and those below it are created with the leaf
    if (!td.get_entry(parent).is_tensordict()) {
      throw KeyError("add_key: " + parent.repr() + " is not a TensorDict, so it cannot hold " + key.repr());
    }
  }
  const BatchSize& bs = td.batch_size();
  if (shape.size() < bs.size() || !std::equal(bs.begin(), bs.end(), shape.begin())) {
    throw BatchSizeError("add_key: the shape " + shape_str(shape) + " of " + key.repr() +
                         " does not start with the store's batch size " + shape_str(bs));
  }
}

//! bytes the file system holding `path` still gives an unprivileged writer; -1 when statvfs fails
int64_t free_bytes_at(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return -1;
  const unsigned long long b = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
  return b > static_cast<unsigned long long>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(b);
}

//! stores hand out locked snapshots, like load_memmap / share_memory_ (keys can't be added behind the
//! actor's back; rows are writable)
TensorDict relock(TensorDict td) {
  td.lock_();
  return td;
}

class MemmapStore final : public StoreBackend {
 public:
  explicit MemmapStore(const TensorDict& td) {
    if (!td.is_memmap() || memmap_prefix(td).empty()) {
      throw ValueError("a memmap store needs a memmap TensorDict saved to a directory (memmap_(prefix), "
                       "load_memmap or from_schema with storage \"memmap\")");
    }
    td_ = relock(td.shallow_copy());
  }
  std::string kind() const override { return "memmap"; }
  TensorDict td() const override { return td_; }
  void add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype, const at::Tensor& data) override {
    check_new_key(td_, key, shape);
    backends::dtype_to_string(dtype);  // ValueError for a dtype Python's loader cannot read back
    TensorDict next = td_.shallow_copy();
    make_memmap(next, key, shape, dtype);  // the leaf file, then meta.json rewritten atomically
    if (data.defined()) next.get(key).copy_(data);
    td_ = relock(next);
  }
  void flush() override {
    for (const Entry& e : td_.values(KeysOptions().include_nested(true).leaves_only(true))) {
      if (e.is_tensor()) backends::flush(e.tensor());
    }
  }
  void refresh() override {
    TensorDict next = td_.shallow_copy();
    next.memmap_refresh_();
    td_ = relock(next);
  }
  StorageSpec spec() const override { return StorageSpec::of(td_, "the store"); }
  int64_t space_left() const override { return free_bytes_at(memmap_prefix(td_)); }
  void close() override { flush(); }

 private:
  TensorDict td_ = TensorDict::undefined();
};

class SharedStore final : public StoreBackend {
 public:
  explicit SharedStore(const TensorDict& td) {
    if (!td.is_shared()) throw ValueError("a shared store needs a share_memory_()'d TensorDict");
    td_ = relock(td.shallow_copy());
  }
  std::string kind() const override { return "shared"; }
  TensorDict td() const override { return td_; }
  void add_key(const NestedKey& key, const BatchSize& shape, at::ScalarType dtype, const at::Tensor& data) override {
    check_new_key(td_, key, shape);
    TensorDict one(td_.batch_size());
    one.set(key, data.defined() ? data.to(dtype).contiguous() : at::zeros(shape, at::TensorOptions().dtype(dtype)));
    one.share_memory_();  // a new segment for the leaf
    TensorDict next = td_.shallow_copy();  // unlocked, still is_shared (unlock_() would clear that)
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
    td_ = relock(next);
  }
  void flush() override {}    // shared memory: nothing to write back
  void refresh() override {}  // the owner's structure is the truth; clients re-open the handle
  StorageSpec spec() const override { return StorageSpec::of(td_, "the store"); }
  int64_t space_left() const override { return free_bytes_at("/dev/shm"); }  // where new segments go
  void close() override {}

 private:
  TensorDict td_ = TensorDict::undefined();
};

//! a Read / Write's rows as the actor accepts them: an index, and for a write one value per key
const store_rows& checked_rows(const store_rows& rows, bool write) {
  if (!rows.index) throw ValueError("store: a row request without a resolved index");
  if (write && rows.values.size() != rows.keys.size()) {
    throw ValueError("store: a row write with " + std::to_string(rows.keys.size()) + " keys and " +
                     std::to_string(rows.values.size()) + " values");
  }
  return rows;
}

struct StoreState {
  std::shared_ptr<StoreBackend> backend;
  std::shared_ptr<StoreShared> shared;
  StoreGuard guard;
  int64_t version = 0;
};

//! a new leaf's bytes against the configured maximum and the space left, before anything is made:
//! ValueError (over store.max_key_bytes) or BackendError (more than the free space), naming the key
void check_key_space(const StoreState& st, const NestedKey& key, const BatchSize& shape, at::ScalarType dtype) {
  for (int64_t d : shape)
    if (d <= 0) return;  // empty (nothing to store) or negative (the backend refuses it with its own error)
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
  if (st.guard.max_key_bytes > 0 && (overflow || bytes > st.guard.max_key_bytes)) {
    throw ValueError("add_key: " + key.repr() + " of shape " + shape_str(shape) + " needs " + size +
                     ", more than the store's limit of " + std::to_string(st.guard.max_key_bytes) +
                     " bytes (config store.max_key_bytes)");
  }
  const int64_t left = st.backend->space_left();
  if (left >= 0 && (overflow || bytes > left)) {
    throw BackendError("add_key: " + key.repr() + " of shape " + shape_str(shape) + " needs " + size + ", but only " +
                       std::to_string(left) + " bytes are left for the " + st.backend->kind() +
                       " store; nothing was added");
  }
}

//! a == b without an early exit (a token compared byte by byte leaks nothing through timing)
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<unsigned char>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

store_response info(StoreState& st) {
  store_response r;
  r.kind = st.backend->kind();
  r.spec = st.backend->spec().dump();
  TensorDict td = st.backend->td();
  r.batch_size.assign(td.batch_size().begin(), td.batch_size().end());
  r.leaves = describe_leaves(td);
  r.version = st.version;
  return r;
}

void republish(StoreState& st) {
  ++st.version;
  st.shared->publish(st.backend->td(), st.version);
}

//! runs one request inside the actor; `call` is null for a remote (inspectable-only) request
StoreResult apply(StoreState& st, const store_request& req, store_call* call) {
  StoreResult res;
  switch (static_cast<StoreOp>(req.op)) {
    case StoreOp::Info:
      break;
    case StoreOp::AddKey: {
      NestedKey key(req.key);
      at::Tensor data = call ? call->tensor : at::Tensor();
      BatchSize shape(req.shape.begin(), req.shape.end());
      at::ScalarType dtype = at::kFloat;
      if (data.defined()) {
        shape.assign(data.sizes().begin(), data.sizes().end());
        dtype = data.scalar_type();
      } else {
        auto d = backends::dtype_from_string(req.dtype);
        if (!d) throw TypeError("add_key: unknown dtype '" + req.dtype + "' (expected e.g. \"torch.float32\")");
        dtype = *d;
      }
      check_key_space(st, key, shape, dtype);
      st.backend->add_key(key, shape, dtype, data);
      republish(st);
      res.td = st.backend->td();
      break;
    }
    case StoreOp::Flush:
      st.backend->flush();
      break;
    case StoreOp::Refresh:
      st.backend->refresh();
      republish(st);
      res.td = st.backend->td();
      break;
    case StoreOp::Read:
      if (!call) throw ValueError("store: rows are read through the mapping in another process, not by message");
      res.tensors = st.backend->read(checked_rows(call->rows, false));
      return res;  // the hot path: no info
    case StoreOp::Write:
      if (!call) throw ValueError("store: rows are written through the mapping in another process, not by message");
      st.backend->write(checked_rows(call->rows, true));
      return res;
    case StoreOp::Close:
      st.backend->close();
      break;
    default:
      throw ValueError("store: unknown request " + std::to_string(req.op));
  }
  res.response = info(st);
  return res;
}

store_response error_response(const map_detail::CarriedError& e) {
  store_response r;
  r.ok = false;
  r.error = to_wire(e);
  return r;
}

//! the store actor: a HotActor (own thread, spins before blocking) so a facade request costs ~2-3 us
class StoreActor final : public HotActor {
 public:
  StoreActor(caf::actor_config& cfg, std::chrono::microseconds spin, std::shared_ptr<StoreBackend> backend,
             std::shared_ptr<StoreShared> shared, StoreGuard guard)
      : HotActor(cfg, spin) {
    state_.backend = std::move(backend);
    state_.shared = shared;
    state_.guard = std::move(guard);
    std::weak_ptr<StoreShared> weak = shared;
    caf::abstract_actor::attach_functor([weak](const caf::error& reason) {
      if (auto s = weak.lock()) {
        s->fail_all(reason ? "the store actor terminated (" + to_string(reason) + ")" : "the store was closed");
      }
    });
  }

  void act() override {
    bool running = true;
    std::vector<store_call_ptr> batch;
    auto on_remote = [&](store_atom, const store_request& req) -> store_response {
      // another node (or an anonymous sender, whose node is unknown) must show the store's token; the actors
      // of this process need none
      const caf::strong_actor_ptr& sender = current_sender();
      if ((!sender || sender->node() != system().node()) && !same_token(req.token, state_.guard.token)) {
        logger()->warn("store: refused a request from another process: {}",
                       req.token.empty() ? "no token" : "wrong token");
        return error_response({ErrorCode::Backend,
                               std::string("store: access refused: the request carries ") +
                                   (req.token.empty() ? "no store token" : "a wrong store token") +
                                   " (give the owner's Store::token() to Store::connect, or set "
                                   "TENSORDICT_STORE_TOKEN); nothing was done",
                               -1});
      }
      // another process: it may not close the owner's store (its own close just disconnects)
      if (static_cast<StoreOp>(req.op) == StoreOp::Close) {
        return error_response({ErrorCode::Value, "store: only the owner closes a store; a client disconnects", -1});
      }
      try {
        return apply(state_, req, nullptr).response;
      } catch (...) {
        return error_response(map_detail::carry_current_exception(-1));
      }
    };
    auto on_exit = [&](caf::exit_msg& m) {
      if (m.source && m.source.node() != system().node()) return;  // only this process stops its store
      fail_state(m.reason);
      running = false;
    };
    receive_while(running)(
        [&](store_atom, const store_call_ptr& call) {
          // the calls already waiting join this one: the backend gets runs of reads / writes as one batch
          batch.clear();
          batch.push_back(call);
          bool more = true;
          while (more && running && batch.size() < kMaxBatch) {
            // an empty mailbox ends the batch at once: a timed receive would first spin on it (HotActor)
            if (mailbox().empty()) break;
            receive([&](store_atom, const store_call_ptr& c) { batch.push_back(c); }, on_remote, on_exit,
                    caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
          }
          // after an exit message, fail_state has failed every registered call, these included
          if (running && run_batch(batch)) running = false;
        },
        on_remote, on_exit);
  }

 private:
  static constexpr size_t kMaxBatch = 256;

  //! runs the calls in order, handing consecutive Read (or Write) calls to the backend at once; true when a
  //! Close was among them
  bool run_batch(const std::vector<store_call_ptr>& calls) {
    bool closed = false;
    size_t i = 0;
    while (i < calls.size()) {
      const auto op = static_cast<StoreOp>(calls[i]->req.op);
      size_t j = i + 1;
      if (op == StoreOp::Read || op == StoreOp::Write) {
        while (j < calls.size() && static_cast<StoreOp>(calls[j]->req.op) == op) ++j;
      }
      if (j - i > 1) {
        run_rows(calls, i, j, op);
      } else {
        run_one(calls[i]);
        if (op == StoreOp::Close) closed = true;
      }
      i = j;
    }
    return closed;
  }

  void run_one(const store_call_ptr& call) {
    const auto op = static_cast<StoreOp>(call->req.op);
    if (op == StoreOp::Read || op == StoreOp::Write) state_.shared->count_batch(1);
    try {
      call->reply.set_value(apply(state_, call->req, call.get()));
    } catch (...) {
      call->reply.set_error(map_detail::carry_current_exception(-1));
    }
  }

  //! calls[i, j) are all reads or all writes: one backend batch; when the batch fails as a whole, each call
  //! is run alone so that every caller gets its own result or error
  void run_rows(const std::vector<store_call_ptr>& calls, size_t i, size_t j, StoreOp op) {
    try {
      if (op == StoreOp::Read) {
        std::vector<const store_rows*> reads;
        for (size_t k = i; k < j; ++k) reads.push_back(&checked_rows(calls[k]->rows, false));
        std::vector<std::vector<at::Tensor>> out = state_.backend->read_batch(reads);
        if (out.size() != j - i) throw RuntimeError("store: the backend's read_batch returned a wrong count");
        state_.shared->count_batch(static_cast<int64_t>(j - i));
        for (size_t k = i; k < j; ++k) {
          StoreResult r;
          r.tensors = std::move(out[k - i]);
          calls[k]->reply.set_value(std::move(r));
        }
      } else {
        std::vector<const store_rows*> writes;
        for (size_t k = i; k < j; ++k) writes.push_back(&checked_rows(calls[k]->rows, true));
        state_.backend->write_batch(writes);
        state_.shared->count_batch(static_cast<int64_t>(j - i));
        for (size_t k = i; k < j; ++k) calls[k]->reply.set_value(StoreResult());
      }
    } catch (...) {
      for (size_t k = i; k < j; ++k) run_one(calls[k]);
    }
  }

  StoreState state_;
};

}  // namespace

std::shared_ptr<StoreBackend> make_memmap_store(const TensorDict& td) { return std::make_shared<MemmapStore>(td); }
std::shared_ptr<StoreBackend> make_shared_store(const TensorDict& td) { return std::make_shared<SharedStore>(td); }

TensorDict StoreShared::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}
int64_t StoreShared::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}
void StoreShared::publish(const TensorDict& td, int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = td;
  version_ = version;
}
bool StoreShared::begin(const store_call_ptr& call, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!alive_) {
    *why = why_dead_;
    return false;
  }
  calls_.insert(call);
  return true;
}
void StoreShared::end(const store_call_ptr& call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(call);
}
StoreShared::BatchStats StoreShared::batch_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}
void StoreShared::count_batch(int64_t calls) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.calls += calls;
  stats_.batches += 1;
  stats_.largest = std::max(stats_.largest, calls);
}
void StoreShared::fail_all(const std::string& why) {
  std::set<store_call_ptr> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    alive_ = false;
    why_dead_ = why;
    calls.swap(calls_);
  }
  for (const auto& c : calls) c->reply.set_error(map_detail::CarriedError{ErrorCode::Backend, "store: " + why, -1});
}

std::string new_store_token() {
  unsigned char bytes[16];
  size_t got = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  while (fd >= 0 && got < sizeof bytes) {
    const ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n > 0) got += static_cast<size_t>(n);
    else if (!(n < 0 && errno == EINTR)) break;
  }
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (got < sizeof bytes) {
    throw BackendError("store: cannot draw a token from /dev/urandom: " +
                       std::string(fd < 0 || err ? std::strerror(err) : "short read"));
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

caf::actor spawn_store_actor(caf::actor_system& system, std::shared_ptr<StoreBackend> backend,
                             std::shared_ptr<StoreShared> shared, std::chrono::microseconds spin, StoreGuard guard) {
  shared->publish(backend->td(), 0);
  return system.spawn<StoreActor>(spin, std::move(backend), std::move(shared), std::move(guard));
}

StoreResult store_call_blocking(const caf::actor& actor, StoreShared& shared, store_call_ptr call,
                                std::chrono::microseconds spin, std::chrono::milliseconds timeout) {
  std::string why;
  if (!actor || !shared.begin(call, &why)) {
    throw BackendError("store: " + (why.empty() ? std::string("the store is closed") : why));
  }
  struct End {
    StoreShared& s;
    const store_call_ptr& c;
    ~End() { s.end(c); }
  } end{shared, call};
  caf::anon_send(actor, store_atom::value, call);
  if (!call->reply.wait(std::chrono::steady_clock::now() + timeout, spin)) {
    throw BackendError("store: no reply from the store actor within " + std::to_string(timeout.count()) +
                       " ms (request_timeout_ms)");
  }
  return call->reply.get();
}

store_response store_request_blocking(caf::actor_system& system, const caf::actor& actor, const store_request& req,
                                      std::chrono::milliseconds timeout) {
  if (!actor) throw BackendError("store: not connected");
  // send + monitor instead of request(): a request to a remote actor whose node went away is never
  // answered (it would wait for the whole timeout), while the monitor delivers a down message at once
  caf::scoped_actor self{system};
  self->monitor(actor);
  self->send(actor, store_atom::value, req);
  store_response out;
  std::string failure;
  bool done = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    self->receive(
        [&](const store_response& r) {
          out = r;
          done = true;
        },
        [&](const caf::down_msg& d) {
          if (d.source != actor.address()) return;  // not ours: keep waiting
          failure = "the store actor is down (" + system.render(d.reason) + "): the connection dropped or the store was closed";
          done = true;
        },
        [&](const caf::error& e) {
          failure = "the request failed: " + system.render(e);
          done = true;
        },
        caf::after(std::max(left, std::chrono::milliseconds(0))) >> [&] {
          failure = "no reply from the store actor within " + std::to_string(timeout.count()) + " ms (request_timeout_ms)";
          done = true;
        });
  }
  if (!failure.empty()) throw BackendError("store: " + failure);
  if (!out.ok) map_detail::rethrow(from_wire(out.error));
  return out;
}

std::shared_ptr<StoreClient> StoreClient::open(std::shared_ptr<Runtime> rt, std::shared_ptr<StoreBackend> backend) {
  std::shared_ptr<StoreClient> c(new StoreClient());
  c->rt_ = std::move(rt);
  c->kind_ = backend->kind();
  c->token_ = new_store_token();
  StoreGuard guard{c->token_, c->rt_->config().store_max_key_bytes};
  c->actor_ = spawn_store_actor(c->rt_->system(), std::move(backend), c->shared_,
                                std::chrono::microseconds(c->rt_->config().actor_spin_us), std::move(guard));
  return c;
}

std::shared_ptr<StoreClient> StoreClient::connect(std::shared_ptr<Runtime> rt, const std::string& host,
                                                  uint16_t port, const std::string& token) {
  std::shared_ptr<StoreClient> c(new StoreClient());
  c->rt_ = std::move(rt);
  c->remote_ = true;
  c->token_ = token;
  if (c->token_.empty()) {
    if (const char* env = std::getenv("TENSORDICT_STORE_TOKEN")) c->token_ = env;
  }
  auto a = connect_remote_actor(c->rt_->system(), host, port, c->rt_->request_timeout());
  if (!a) {
    throw BackendError("store: cannot connect to " + host + ":" + std::to_string(port) + ": " +
                       c->rt_->system().render(a.error()));
  }
  c->actor_ = *a;
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::Info);
  req.token = c->token_;
  c->adopt_remote(store_request_blocking(c->rt_->system(), c->actor_, req, c->rt_->request_timeout()));
  return c;
}

void StoreClient::adopt_remote(const store_response& r) {
  kind_ = r.kind;
  TensorDict current = shared_->snapshot();
  if (current.defined() && r.version == shared_->version()) return;
  TensorDict next = TensorDict::undefined();
  if (r.kind == "memmap" && current.defined()) {
    next = current.shallow_copy();  // same files: map only the leaves that are new
    next.memmap_refresh_();
  } else {
    next = open_storage(StorageSpec::parse(r.spec));
  }
  shared_->publish(relock(next), r.version);
}

StoreClient::~StoreClient() {
  if (actor_ && !remote_) caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  actor_ = nullptr;
}

StoreResult StoreClient::call(const store_request& req, store_rows rows, const at::Tensor& tensor) {
  if (remote_) {
    if (closed_) throw BackendError("store: the client is closed");
    StoreResult res;
    store_request with_token = req;
    with_token.token = token_;
    res.response = store_request_blocking(rt_->system(), actor_, with_token, rt_->request_timeout());
    return res;
  }
  auto c = std::make_shared<store_call>();
  c->req = req;
  c->rows = std::move(rows);
  c->tensor = tensor;
  return store_call_blocking(actor_, *shared_, std::move(c), rt_->spin(), rt_->request_timeout());
}

void StoreClient::refresh() {
  store_request req;
  if (!remote_) {
    req.op = static_cast<int32_t>(StoreOp::Refresh);
    call(req);
    return;
  }
  req.op = static_cast<int32_t>(StoreOp::Info);
  store_response r = call(req).response;
  std::lock_guard<std::mutex> lock(mu_);
  adopt_remote(r);
}

uint16_t StoreClient::publish(uint16_t port) {
  if (remote_) throw ValueError("store: only the owner of a store can publish it");
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw BackendError("store: the store is closed");
  auto p = rt_->system().middleman().publish(actor_, port, "127.0.0.1");
  if (!p) {
    throw BackendError("store: cannot listen on 127.0.0.1:" + std::to_string(port) + ": " +
                       rt_->system().render(p.error()));
  }
  ports_.push_back(*p);
  return *p;
}

void StoreClient::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  if (remote_) {
    actor_ = nullptr;
    shared_->fail_all("the client is closed");
    return;
  }
  for (uint16_t p : ports_) rt_->system().middleman().unpublish(actor_, p);
  ports_.clear();
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::Close);
  auto c = std::make_shared<store_call>();
  c->req = req;
  try {
    store_call_blocking(actor_, *shared_, std::move(c), rt_->spin(), rt_->request_timeout());
  } catch (const BackendError&) {
    // already gone (killed): closing is done
  }
}

namespace {
//! the leaf of td at key (KeyError when it is missing or not a tensor); the rows' index must be over td's batch
at::Tensor row_leaf(const TensorDict& td, const store_rows& rows, const NestedKey& key) {
  if (rows.index->source_batch() != td.batch_size()) {
    throw ValueError("store: rows resolved over the batch " + shape_str(rows.index->source_batch()) +
                     ", the store's is " + shape_str(td.batch_size()));
  }
  std::optional<Entry> e = td.get_entry_opt(key);
  if (!e || !e->is_tensor()) throw KeyError("store: " + key.repr() + " is not a tensor leaf of the store");
  return e->tensor();
}
}  // namespace

std::vector<at::Tensor> StoreBackend::read(const store_rows& rows) {
  const TensorDict t = td();
  std::vector<at::Tensor> out;
  out.reserve(rows.keys.size());
  for (const auto& key : rows.keys) out.push_back(rows.index->take(row_leaf(t, rows, key)));
  return out;
}

void StoreBackend::write(const store_rows& rows) {
  const TensorDict t = td();
  std::vector<at::Tensor> leaves;  // every key checked before the first write: an error writes nothing
  leaves.reserve(rows.keys.size());
  for (const auto& key : rows.keys) leaves.push_back(row_leaf(t, rows, key));
  for (size_t i = 0; i < leaves.size(); ++i) rows.index->put(leaves[i], rows.values[i]);
}

std::vector<store_leaf> describe_leaves(const TensorDict& td) {
  std::vector<store_leaf> out;
  for (const auto& kv : td.items(KeysOptions().include_nested(true).leaves_only(true))) {
    if (!kv.second.is_tensor()) continue;
    const at::Tensor& t = kv.second.tensor();
    out.push_back(store_leaf{kv.first.parts(), backends::dtype_to_string(t.scalar_type()),
                             std::vector<int64_t>(t.sizes().begin(), t.sizes().end())});
  }
  return out;
}

}  // namespace actors
}  // namespace tensordict
