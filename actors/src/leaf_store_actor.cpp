#include "tensordict/actors/leaf_store_actor.hpp"

#include <algorithm>
#include <atomic>

#include <caf/all.hpp>

#include "tensordict/actors/hot_actor.hpp"
#include "tensordict/actors/reply.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace actors {

//! one request to a leaf-store actor (in-process only)
struct leaf_call {
  enum class Op { Read, Write, Run } op = Op::Run;
  std::vector<backends::LeafRead> reads;
  std::vector<backends::LeafWrite> writes;
  std::function<void(backends::LeafStore&)> fn;
  Reply<std::vector<at::Tensor>> reply;
};
using leaf_call_ptr = std::shared_ptr<leaf_call>;

}  // namespace actors
}  // namespace tensordict

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tensordict::actors::leaf_call_ptr)

namespace tensordict {
namespace actors {

using leaf_atom = caf::atom_constant<caf::atom("tdleaf")>;

//! what the client and its actor share: liveness, the calls in flight (failed when the actor dies, so no
//! caller waits on a dead actor), and the batch counters
//! (the actor holds it too, never the Runtime: the last reference to a Runtime must not drop on an actor's
//! thread, whose system would then join itself)
struct LeafCallState {
  caf::actor actor;
  std::string describe;
  //! the store (also the actor's); used under store_mu only
  std::shared_ptr<backends::LeafStore> store;
  //! held by whoever uses the store: the actor for a batch, or a caller on the fast path (try_direct)
  std::mutex store_mu;
  //! calls sent to the actor and not yet run: a caller takes the fast path only when there are none
  std::atomic<int64_t> queued{0};
  mutable std::mutex mu;
  bool alive = true;
  bool closed = false;
  std::string why_dead;
  std::set<leaf_call_ptr> calls;
  LeafStoreClient::BatchStats stats;

  //! registers a call and gives the actor to send it to; false (and `why`) when the actor is gone
  bool begin(const leaf_call_ptr& c, std::string* why, caf::actor* to) {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive || !actor) {
      *why = why_dead.empty() ? describe + " is closed" : why_dead;
      return false;
    }
    calls.insert(c);
    *to = actor;
    return true;
  }
  void end(const leaf_call_ptr& c) {
    std::lock_guard<std::mutex> lock(mu);
    calls.erase(c);
  }
  void fail_all(const std::string& why) {
    std::set<leaf_call_ptr> pending;
    {
      std::lock_guard<std::mutex> lock(mu);
      alive = false;
      why_dead = why;
      pending.swap(calls);
    }
    for (const auto& c : pending) c->reply.set_error({ErrorCode::Backend, why, -1});
  }
  void count(int64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    stats.calls += n;
    stats.batches += 1;
    stats.largest = std::max(stats.largest, n);
  }
};

struct LeafStoreClient::Impl {
  std::shared_ptr<Runtime> rt;
  std::shared_ptr<LeafCallState> st;
};

namespace {

class LeafStoreActor final : public HotActor {
 public:
  LeafStoreActor(caf::actor_config& cfg, std::chrono::microseconds spin, std::shared_ptr<backends::LeafStore> store,
                 std::shared_ptr<LeafCallState> impl)
      : HotActor(cfg, spin), store_(std::move(store)), impl_(impl) {
    std::weak_ptr<LeafCallState> weak = impl;
    const std::string what = store_->describe();
    caf::abstract_actor::attach_functor([weak, what](const caf::error& reason) {
      if (auto s = weak.lock()) {
        s->fail_all(reason && reason != caf::exit_reason::user_shutdown
                        ? what + ": the store actor terminated (" + to_string(reason) + ")"
                        : what + " is closed");
      }
    });
  }

  void act() override {
    bool running = true;
    std::vector<leaf_call_ptr> batch;
    auto on_exit = [&](caf::exit_msg&) { running = false; };
    receive_while(running)(
        [&](leaf_atom, const leaf_call_ptr& call) {
          batch.clear();
          batch.push_back(call);
          bool more = true;
          while (more && running && batch.size() < kMaxBatch) {
            // an empty mailbox ends the batch at once: a timed receive on it costs ~110 us (store_actor.cpp)
            if (mailbox().empty()) break;
            receive([&](leaf_atom, const leaf_call_ptr& c) { batch.push_back(c); }, on_exit,
                    caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
          }
          {
            std::lock_guard<std::mutex> lock(impl_->store_mu);
            run_batch(batch);
          }
          impl_->queued.fetch_sub(static_cast<int64_t>(batch.size()), std::memory_order_acq_rel);
        },
        on_exit);
    // the actor's end fails every call still registered (attach_functor)
  }

 private:
  static constexpr size_t kMaxBatch = 256;

  void run_batch(const std::vector<leaf_call_ptr>& calls) {
    size_t i = 0;
    while (i < calls.size()) {
      const auto op = calls[i]->op;
      size_t j = i + 1;
      if (op != leaf_call::Op::Run) {
        while (j < calls.size() && calls[j]->op == op) ++j;
      }
      if (j - i > 1) {
        run_merged(calls, i, j, op);
      } else {
        run_one(*calls[i]);
      }
      i = j;
    }
  }

  void run_one(leaf_call& c) {
    try {
      switch (c.op) {
        case leaf_call::Op::Read: {
          std::vector<at::Tensor> out = store_->read(c.reads);
          impl_->count(1);
          c.reply.set_value(std::move(out));
          return;
        }
        case leaf_call::Op::Write:
          store_->write(c.writes);
          impl_->count(1);
          break;
        case leaf_call::Op::Run:
          c.fn(*store_);
          break;
      }
      c.reply.set_value({});
    } catch (...) {
      c.reply.set_error(map_detail::carry_current_exception(-1));
    }
  }

  //! calls[i, j): all reads or all writes, as ONE store call; when it fails, each call runs alone so that
  //! every caller gets its own result or error (writes: the store's write is atomic or applied in order)
  void run_merged(const std::vector<leaf_call_ptr>& calls, size_t i, size_t j, leaf_call::Op op) {
    try {
      if (op == leaf_call::Op::Read) {
        std::vector<backends::LeafRead> all;
        for (size_t k = i; k < j; ++k) all.insert(all.end(), calls[k]->reads.begin(), calls[k]->reads.end());
        std::vector<at::Tensor> out = store_->read(all);
        if (out.size() != all.size()) throw RuntimeError("store: read returned a wrong number of tensors");
        impl_->count(static_cast<int64_t>(j - i));
        size_t pos = 0;
        for (size_t k = i; k < j; ++k) {
          const size_t n = calls[k]->reads.size();
          calls[k]->reply.set_value(std::vector<at::Tensor>(out.begin() + static_cast<long>(pos),
                                                            out.begin() + static_cast<long>(pos + n)));
          pos += n;
        }
      } else {
        std::vector<backends::LeafWrite> all;
        for (size_t k = i; k < j; ++k) all.insert(all.end(), calls[k]->writes.begin(), calls[k]->writes.end());
        store_->write(all);
        impl_->count(static_cast<int64_t>(j - i));
        for (size_t k = i; k < j; ++k) calls[k]->reply.set_value({});
      }
    } catch (...) {
      for (size_t k = i; k < j; ++k) run_one(*calls[k]);
    }
  }

  std::shared_ptr<backends::LeafStore> store_;
  std::shared_ptr<LeafCallState> impl_;
};

}  // namespace

std::shared_ptr<LeafStoreClient> LeafStoreClient::open(std::shared_ptr<Runtime> rt,
                                                       std::shared_ptr<backends::LeafStore> store) {
  if (!rt || !store) throw ValueError("LeafStoreClient::open: no runtime or no store");
  std::shared_ptr<LeafStoreClient> c(new LeafStoreClient());
  c->describe_ = store->describe();
  c->driver_ = store->driver();
  c->spec_fields_ = store->spec_fields();
  c->writable_ = store->writable();
  c->impl_ = std::make_shared<Impl>();
  c->impl_->rt = std::move(rt);
  c->impl_->st = std::make_shared<LeafCallState>();
  c->impl_->st->describe = c->describe_;
  c->impl_->st->store = store;
  caf::actor a = c->impl_->rt->system().spawn<LeafStoreActor>(
      std::chrono::microseconds(c->impl_->rt->config().actor_spin_us), std::move(store), c->impl_->st);
  std::lock_guard<std::mutex> lock(c->impl_->st->mu);
  c->impl_->st->actor = std::move(a);
  return c;
}

LeafStoreClient::~LeafStoreClient() {
  try {
    close();
  } catch (...) {
    // a store that fails to close has already reported through its last request
  }
}

void LeafStoreClient::send(const leaf_call_ptr& call) {
  std::string why;
  caf::actor to;
  if (!impl_->st->begin(call, &why, &to)) throw BackendError(why);
  impl_->st->queued.fetch_add(1, std::memory_order_acq_rel);
  caf::anon_send(to, leaf_atom::value, call);
  // no timeout: a long HDF5 write is legitimate; an actor that dies fails the call (fail_all)
  call->reply.wait(std::chrono::steady_clock::time_point::max(),
                   std::chrono::microseconds(impl_->rt->config().facade_spin_us));
  impl_->st->end(call);
}

namespace {

//! the fast path: when the store is idle (no call queued at its actor, nobody using it), the caller runs its
//! call itself under the store's lock. That saves the two thread hand-offs of an actor request, which on a
//! loaded 2-core VM cost far more than the store's own I/O (a Redis row read: ~40 us direct, 180-1400 us
//! through the actor while the actor's thread sleeps on the socket). Calls that find the store busy go to
//! the actor, which merges them into one store call. false: not run, send it.
template <class F>
bool try_direct(LeafCallState& st, F&& f) {
  if (st.queued.load(std::memory_order_acquire) != 0) return false;
  std::unique_lock<std::mutex> lock(st.store_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  {
    std::lock_guard<std::mutex> g(st.mu);
    if (!st.alive || !st.actor) throw BackendError(st.why_dead.empty() ? st.describe + " is closed" : st.why_dead);
  }
  f(*st.store);
  return true;
}

}  // namespace

std::vector<at::Tensor> LeafStoreClient::read(std::vector<backends::LeafRead> reads) {
  std::vector<at::Tensor> out;
  if (try_direct(*impl_->st, [&](backends::LeafStore& s) { out = s.read(reads); })) {
    impl_->st->count(1);
    return out;
  }
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Read;
  c->reads = std::move(reads);
  send(c);
  return c->reply.get();
}

void LeafStoreClient::write(std::vector<backends::LeafWrite> writes) {
  if (try_direct(*impl_->st, [&](backends::LeafStore& s) { s.write(writes); })) {
    impl_->st->count(1);
    return;
  }
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Write;
  c->writes = std::move(writes);
  send(c);
  c->reply.get();
}

void LeafStoreClient::run_void(const std::function<void(backends::LeafStore&)>& fn) {
  if (try_direct(*impl_->st, fn)) return;
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Run;
  c->fn = fn;
  send(c);
  c->reply.get();
}

void LeafStoreClient::close() {
  LeafCallState& st = *impl_->st;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.closed) return;
    st.closed = true;
  }
  std::exception_ptr err;
  try {
    run_void([](backends::LeafStore& s) { s.close(); });
  } catch (...) {
    err = std::current_exception();
  }
  st.fail_all(describe_ + " is closed");
  caf::actor a;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    a.swap(st.actor);
  }
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  if (err) std::rethrow_exception(err);
}

bool LeafStoreClient::closed() const {
  std::lock_guard<std::mutex> lock(impl_->st->mu);
  return impl_->st->closed;
}

LeafStoreClient::BatchStats LeafStoreClient::batch_stats() const {
  std::lock_guard<std::mutex> lock(impl_->st->mu);
  return impl_->st->stats;
}

}  // namespace actors
}  // namespace tensordict
