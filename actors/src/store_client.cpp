// The one store actor and its client (store_client.hpp): flat combining over a backends::LeafStore, the
// protocol requests of other processes (dense stores), tokens.
#include "tensordict/actors/store_client.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <thread>

#include <caf/io/all.hpp>

#include "tensordict/actors/hot_actor.hpp"
#include "tensordict/actors/reply.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/logging.hpp"

namespace tensordict {
namespace actors {

//! a queued write's own copy of its data (write-behind): one buffer, a tensor per leaf over it. The handle
//! recycles it once the write is done and nothing else holds it (a row of 4 leaves cost a malloc and 4
//! TensorImpls with their version counters, made on the producer and freed on the store actor's thread)
struct OwnedData {
  c10::Storage buf;
  size_t bytes = 0;
  std::vector<at::Tensor> views;
  //! nobody but this holds the buffer or a view: it may be written again
  bool unshared() const {
    if (!buf.unsafeGetStorageImpl() || buf.use_count() != 1 + views.size()) return false;
    for (const auto& v : views)
      if (v.use_count() != 1) return false;
    return true;
  }
};

//! one call of a caller (in-process only)
struct leaf_call {
  enum class Op { Read, Write, Run } op = Op::Run;
  std::vector<backends::LeafRead> reads;
  std::vector<backends::LeafWrite> writes;
  std::function<void(backends::LeafStore&)> fn;
  Reply<std::vector<at::Tensor>> reply;
  std::unique_ptr<OwnedData> owned;  //!< write-behind: what `writes` point into
  // registered in StoreCallState::calls (under its mu): an intrusive list (a std::set node per call was a
  // malloc and a rebalancing per queued write); `self` keeps the call alive while it is registered
  leaf_call* reg_prev = nullptr;
  leaf_call* reg_next = nullptr;
  std::shared_ptr<leaf_call> self;
};
using leaf_call_ptr = std::shared_ptr<leaf_call>;

using leaf_atom = caf::atom_constant<caf::atom("tdleaf")>;

//! what the client and its actor share: liveness, the calls waiting for the store (`pending`), the calls in
//! flight (failed when the actor dies, so no caller waits on a dead actor), and the batch counters
//! (the actor holds it too, never the Runtime: the last reference to a Runtime must not drop on an actor's
//! thread, whose system would then join itself)
//!
//! Who runs a call: whoever holds `store_mu` (the holder). A caller that finds the store free becomes the
//! holder and runs its own call together with every call waiting in `pending` (one merged store call: one
//! HDF5 pass, one Redis pipeline). A caller that finds it busy appends its call to `pending` and waits; the
//! holder runs it with the others waiting by then. So calls from many threads share round trips without a
//! thread hand-off. No call is left behind: while `holder_takes` is set (under pending_mu) the holder
//! promises to look at `pending` once more before it lets go of the store; a call appended when it is not
//! set is announced to the actor by a message, and the actor, once it holds the store, runs everything
//! waiting. A holder that stops with calls still waiting (its round bound) announces them the same way.
struct StoreCallState {
  caf::actor actor;
  std::string describe;
  //! the store (also the actor's); used under store_mu only
  std::shared_ptr<backends::LeafStore> store;
  std::mutex store_mu;
  //! calls waiting for the holder of store_mu (a call is taken out exactly once: by a runner or fail_all)
  std::mutex pending_mu;
  std::vector<leaf_call_ptr> pending;
  bool holder_takes = false;                 //!< under pending_mu: the holder will take `pending` again
  std::atomic<size_t> pending_n{0};          //!< pending.size(), for a lingering holder's polling
  std::atomic<size_t> recent_batch[2] = {1, 1};  //!< callers merged in the last two store calls
  std::atomic<int64_t> recent_store_ns{0};       //!< how long the last store call took (a waiter's spin)
  mutable std::mutex mu;
  bool alive = true;
  bool closed = false;
  std::string why_dead;
  leaf_call* calls = nullptr;  //!< the registered calls (leaf_call::reg_next), failed by fail_all
  StoreClient::BatchStats stats;

  //! a lane: another connection to the store (LeafStore::lane_opener), on which a synchronous read or write that
  //! finds the store held runs at once, on its caller's thread, instead of waiting for the holder's round trip.
  //! Its call never waits for anything while it holds `mu` (a structural call takes every lane's `mu`)
  struct Lane {
    std::mutex mu;
    std::shared_ptr<backends::LeafStore> store;  //!< opened on first use (under mu)
    uint64_t structure = 0;                      //!< the structure_version its store's cache is valid for
  };
  std::vector<std::unique_ptr<Lane>> lanes;  //!< fixed when the client starts (config store.lanes)
  std::function<std::shared_ptr<backends::LeafStore>()> open_lane;
  //! 0 while lanes may be opened; after one could not be (the server refused another client), the steady-clock time
  //! (ns) before which calls wait for the one connection (store.lane_retry_ms later), then a lane is tried again
  std::atomic<int64_t> lanes_retry_at{0};
  int64_t lane_retry_ns = 1000000000;
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  //! bumped by every structural call (Op::Run), which runs with every lane idle: a lane's store forgets its
  //! cached structure before its next call
  std::atomic<uint64_t> structure_version{0};

  ~StoreCallState() {
    while (calls) unlink(*calls);  // what is still registered holds itself (leaf_call::self): let it go
  }

  //! registers a call and gives the actor to send it to; false (and `why`) when the actor is gone
  bool begin(const leaf_call_ptr& c, std::string* why, caf::actor* to) {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive || !actor) {
      *why = dead_reason();
      return false;
    }
    if (!c->self) {
      c->self = c;
      c->reg_prev = nullptr;
      c->reg_next = calls;
      if (calls) calls->reg_prev = c.get();
      calls = c.get();
    }
    *to = actor;
    return true;
  }
  void end(const leaf_call_ptr& c) {
    std::lock_guard<std::mutex> lock(mu);
    if (!c->self) return;  // not registered, or failed by fail_all
    unlink(*c);
  }
  std::string dead_reason() const { return why_dead.empty() ? describe + " is closed" : why_dead; }
  //! BackendError when the store can take no more calls
  void check_alive() const {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive || !actor) throw BackendError(dead_reason());
  }
  void fail_all(const std::string& why) {
    std::vector<leaf_call_ptr> pending_calls;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (alive) why_dead = why;  // the first reason stays (a killed actor's, not its end's afterwards)
      alive = false;
      while (calls) {
        leaf_call_ptr c = calls->self;
        unlink(*c);
        pending_calls.push_back(std::move(c));
      }
    }
    {
      std::lock_guard<std::mutex> lock(pending_mu);
      pending.clear();  // registered in `calls` too: failed below, never run
    }
    for (const auto& c : pending_calls) c->reply.set_error({ErrorCode::Backend, why, -1});
  }
  void count(int64_t n, bool lane = false) {
    std::lock_guard<std::mutex> lock(mu);
    stats.calls += n;
    if (lane) stats.lane_calls += n;
    stats.batches += 1;
    stats.largest = std::max(stats.largest, n);
  }
  //! appends a call that found the store busy; true when nobody holding the store will take it (announce
  //! it to the actor, or take the store and run it)
  bool push_pending(const leaf_call_ptr& c) {
    std::lock_guard<std::mutex> lock(pending_mu);
    pending.push_back(c);
    pending_n.store(pending.size(), std::memory_order_release);
    return !holder_takes;
  }
  //! store_mu held, before a store call: when the last store calls merged several callers' calls, wait up
  //! to `linger_for` until as many calls are in hand (`have`) or waiting (callers in step then share one
  //! round trip, instead of alternating a batch of 1 and one of N-1)
  void linger(size_t have, std::chrono::microseconds linger_for) {
    const size_t expect = std::max(recent_batch[0].load(std::memory_order_relaxed),
                                   recent_batch[1].load(std::memory_order_relaxed));
    if (expect <= 1 || linger_for.count() <= 0) return;
    {
      std::lock_guard<std::mutex> lock(pending_mu);
      holder_takes = true;  // callers arriving now need not message the actor
    }
    const auto end = std::chrono::steady_clock::now() + linger_for;
    for (uint32_t n = 1; pending_n.load(std::memory_order_acquire) + have < expect; ++n) {
      if ((n & 15) == 0) {
        if (std::chrono::steady_clock::now() >= end) break;
        std::this_thread::yield();  // the callers we wait for may need this core
      } else {
        cpu_relax();
      }
    }
  }

  //! runs `calls` on the store (store_mu held): runs of consecutive reads, or of writes, as ONE store call
  //! each; when a merged call fails, each of its calls runs alone so that every caller gets its own result
  //! or error (writes: the store's write is atomic or applied in order)
  void run_batch(const std::vector<leaf_call_ptr>& batch) {
    size_t i = 0;
    while (i < batch.size()) {
      const auto op = batch[i]->op;
      size_t j = i + 1;
      if (op != leaf_call::Op::Run) {
        while (j < batch.size() && batch[j]->op == op) ++j;
      }
      if (j - i > 1) {
        run_merged(batch, i, j, op);
      } else {
        run_one(*batch[i]);
      }
      i = j;
    }
  }
  //! store_mu held: `batch` with the calls waiting now, then those that arrived meanwhile, for at most
  //! `rounds` store calls. true when calls are still waiting at the end (the caller's round bound): the
  //! caller must announce them to the actor after it lets go of the store (the actor drains without a bound)
  bool drain(std::vector<leaf_call_ptr> batch, size_t rounds, std::chrono::microseconds linger_for) {
    for (size_t r = 0;; ++r) {
      if (r < rounds) linger(batch.size(), linger_for);
      {
        std::lock_guard<std::mutex> lock(pending_mu);
        if (r >= rounds) {  // out of rounds: what is left goes back to the front of the queue
          pending.insert(pending.begin(), batch.begin(), batch.end());
          pending_n.store(pending.size(), std::memory_order_release);
          holder_takes = false;
          return !pending.empty();
        }
        batch.insert(batch.end(), pending.begin(), pending.end());
        pending.clear();
        pending_n.store(0, std::memory_order_release);
        holder_takes = !batch.empty();  // looks again after these run
        if (batch.empty()) return false;
      }
      // at most kMaxBatch calls in one store call (a bounded pipeline); the rest in the next round
      std::vector<leaf_call_ptr> now;
      if (batch.size() > kMaxBatch) {
        now.assign(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(kMaxBatch));
        batch.erase(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(kMaxBatch));
      } else {
        now.swap(batch);
      }
      recent_batch[1].store(recent_batch[0].load(std::memory_order_relaxed), std::memory_order_relaxed);
      recent_batch[0].store(now.size(), std::memory_order_relaxed);
      const auto t0 = std::chrono::steady_clock::now();
      run_batch(now);
      recent_store_ns.store((std::chrono::steady_clock::now() - t0).count(), std::memory_order_relaxed);
    }
  }
  static constexpr size_t kMaxBatch = 256;

  //! a synchronous read or write that found the store held runs on a free lane, on this thread, at once; false
  //! when every lane is busy (or none can be opened): the call then waits for the holder
  bool run_on_lane(leaf_call& c) {
    const int64_t retry_at = lanes_retry_at.load(std::memory_order_acquire);
    if (retry_at != 0 && now_ns() < retry_at) return false;
    for (auto& lp : lanes) {
      Lane& l = *lp;
      std::unique_lock<std::mutex> lock(l.mu, std::try_to_lock);
      if (!lock.owns_lock()) continue;
      check_alive();
      const uint64_t now = structure_version.load(std::memory_order_acquire);
      if (!l.store) {
        try {
          l.store = open_lane();
        } catch (const std::exception& e) {
          // the server may refuse more clients: the calls share the one connection, as without lanes, until the
          // retry (logged when lanes were usable before)
          if (lanes_retry_at.exchange(now_ns() + lane_retry_ns) == 0)
            logger()->warn("store: {}: no second connection ({}); calls wait for the first, a lane is tried again in "
                           "{} ms", describe, e.what(), lane_retry_ns / 1000000);
          return false;
        }
        if (!l.store) {  // the store opens none
          lanes_retry_at.store(std::numeric_limits<int64_t>::max(), std::memory_order_release);
          return false;
        }
        if (lanes_retry_at.exchange(0) != 0) logger()->info("store: {}: a second connection opened again", describe);
      } else if (l.structure != now) {
        l.store->forget_structure();
      }
      l.structure = now;
      run_on(c, *l.store, /*lane=*/true);
      return true;
    }
    return false;
  }
  //! closes the lanes' connections (the store is closed; a later call fails at check_alive)
  void close_lanes() {
    for (auto& l : lanes) {
      std::lock_guard<std::mutex> lock(l->mu);
      if (!l->store) continue;
      try {
        l->store->close();
      } catch (const std::exception& e) {
        logger()->warn("store: {}: closing a lane: {}", describe, e.what());
      }
      l->store.reset();
    }
  }

 private:
  //! takes a registered call out of `calls` (mu held); the caller holds another reference to it
  void unlink(leaf_call& c) {
    if (c.reg_prev) c.reg_prev->reg_next = c.reg_next;
    if (c.reg_next) c.reg_next->reg_prev = c.reg_prev;
    if (calls == &c) calls = c.reg_next;
    c.reg_prev = c.reg_next = nullptr;
    c.self.reset();
  }

  void run_one(leaf_call& c) { run_on(c, *store); }

 public:
  //! runs `c` on `on` (the store, store_mu held; or a lane's store, its mu held) and sets its reply. A
  //! structural call (Op::Run) takes every lane first: it never runs beside a lane's call, and the lanes forget
  //! their cached structure afterwards
  void run_on(leaf_call& c, backends::LeafStore& on, bool lane = false) {
    try {
      switch (c.op) {
        case leaf_call::Op::Read: {
          std::vector<at::Tensor> out = on.read(c.reads);
          count(1, lane);
          c.reply.set_value(std::move(out));
          return;
        }
        case leaf_call::Op::Write:
          on.write(c.writes);
          count(1, lane);
          break;
        case leaf_call::Op::Run: {
          std::vector<std::unique_lock<std::mutex>> idle;
          idle.reserve(lanes.size());
          for (auto& l : lanes) idle.emplace_back(l->mu);
          struct Bump {
            std::atomic<uint64_t>& v;
            ~Bump() { v.fetch_add(1, std::memory_order_acq_rel); }
          } bump{structure_version};
          c.fn(on);
          break;
        }
      }
      c.reply.set_value({});
    } catch (...) {
      c.reply.set_error(map_detail::carry_current_exception(-1));
    }
  }

  void run_merged(const std::vector<leaf_call_ptr>& calls, size_t i, size_t j, leaf_call::Op op) {
    try {
      if (op == leaf_call::Op::Read) {
        std::vector<backends::LeafRead> all;
        for (size_t k = i; k < j; ++k) all.insert(all.end(), calls[k]->reads.begin(), calls[k]->reads.end());
        std::vector<at::Tensor> out = store->read(all);
        if (out.size() != all.size()) throw RuntimeError("store: read returned a wrong number of tensors");
        count(static_cast<int64_t>(j - i));
        size_t pos = 0;
        for (size_t k = i; k < j; ++k) {
          const auto first = out.begin() + static_cast<long>(pos);
          const auto last = first + static_cast<long>(calls[k]->reads.size());
          calls[k]->reply.set_value(
              std::vector<at::Tensor>(std::make_move_iterator(first), std::make_move_iterator(last)));
          pos += calls[k]->reads.size();
        }
      } else {
        // the calls' writes moved into one list (no copy of their paths), and back if the merged write fails
        // (each call then runs alone with its own)
        std::vector<backends::LeafWrite> all;
        size_t n = 0;
        for (size_t k = i; k < j; ++k) n += calls[k]->writes.size();
        all.reserve(n);
        for (size_t k = i; k < j; ++k)
          std::move(calls[k]->writes.begin(), calls[k]->writes.end(), std::back_inserter(all));
        // back to their calls before any reply (a failed merged write runs each call alone with its own; a
        // done write-behind call is recycled by its handle once its reply is set)
        auto give_back = [&] {
          size_t pos = 0;
          for (size_t k = i; k < j; ++k)
            for (auto& w : calls[k]->writes) w = std::move(all[pos++]);
        };
        try {
          store->write(all);
        } catch (...) {
          give_back();
          throw;
        }
        give_back();
        count(static_cast<int64_t>(j - i));
        for (size_t k = i; k < j; ++k) calls[k]->reply.set_value({});
      }
    } catch (...) {
      for (size_t k = i; k < j; ++k) run_one(*calls[k]);
    }
  }
};


namespace {

//! a == b without an early exit (a token compared byte by byte leaks nothing through timing)
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<unsigned char>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

store_response info_of(const DenseStore& store) {
  store_response r;
  r.kind = store.driver();
  r.spec = store.spec().dump();
  const TensorDict td = store.td();
  r.batch_size.assign(td.batch_size().begin(), td.batch_size().end());
  r.leaves = describe_leaves(td);
  r.version = store.version();
  return r;
}

//! a protocol request, with the store held: what another process (or the owner, StoreClient::call) asks of a
//! dense store. A connected client's store forwards it to its owner
store_response apply_request(DenseStore& store, const store_request& req) {
  if (store.connected()) return store.request(req);
  switch (static_cast<StoreOp>(req.op)) {
    case StoreOp::Info:
      break;
    case StoreOp::AddKey: {
      auto d = backends::dtype_from_string(req.dtype);
      if (!d) throw TypeError("add_key: unknown dtype '" + req.dtype + "' (expected e.g. \"torch.float32\")");
      store.create(req.key, *d, req.shape, at::Tensor(), {});
      break;
    }
    case StoreOp::Flush:
      store.flush();
      break;
    case StoreOp::Refresh:
      store.refresh();
      break;
    case StoreOp::Read:
    case StoreOp::Write:
      throw ValueError("store: rows are read and written through the mapping in another process, not by message");
    case StoreOp::Close:
      store.close();
      break;
    default:
      throw ValueError("store: unknown request " + std::to_string(req.op));
  }
  return info_of(store);
}

store_response error_response(const map_detail::CarriedError& e) {
  store_response r;
  r.ok = false;
  r.error = to_wire(e);
  return r;
}

//! the store's actor: it owns the store, runs the calls left waiting when no caller holding the store will run
//! them (it is told by a message, and drains its mailbox of the others first), and serves the protocol requests
//! of other processes (dense stores; they must show the store's token)
class StoreActor final : public HotActor {
 public:
  StoreActor(caf::actor_config& cfg, std::chrono::microseconds spin, std::chrono::microseconds linger,
             std::shared_ptr<backends::LeafStore> store, DenseStore* dense, std::string token,
             std::shared_ptr<StoreCallState> impl)
      : HotActor(cfg, spin),
        linger_(linger),
        store_(std::move(store)),
        dense_(dense),
        token_(std::move(token)),
        impl_(impl) {
    std::weak_ptr<StoreCallState> weak = impl;
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
    auto on_exit = [&](caf::exit_msg& m) {
      if (m.source && m.source.node() != system().node()) return;  // only this process stops its store
      if (m.reason && m.reason != caf::exit_reason::user_shutdown) {  // killed: say so to every caller
        impl_->fail_all(store_->describe() + ": the store actor terminated (" + to_string(m.reason) + ")");
      }
      running = false;
    };
    auto on_request = [&](store_atom, const store_request& req) -> store_response { return serve(req); };
    receive_while(running)(
        [&](leaf_atom) {
          // the other messages waiting are for calls that this drain runs too
          // (an empty mailbox ends it at once: a timed receive on it costs ~110 us)
          for (size_t n = 0; running && n < StoreCallState::kMaxBatch && !mailbox().empty(); ++n)
            receive([](leaf_atom) {}, on_request, on_exit, caf::after(std::chrono::seconds(0)) >> [] {});
          std::lock_guard<std::mutex> lock(impl_->store_mu);
          impl_->drain({}, SIZE_MAX, linger_);  // no bound: nothing is left waiting
        },
        on_request, on_exit);
    // the actor's end fails every call still registered (attach_functor)
  }

 private:
  store_response serve(const store_request& req) {
    // another node (or an anonymous sender, whose node is unknown) must show the store's token; the actors of
    // this process need none
    const caf::strong_actor_ptr& sender = current_sender();
    if ((!sender || sender->node() != system().node()) && !same_token(req.token, token_)) {
      logger()->warn("store: refused a request from another process: {}", req.token.empty() ? "no token" : "wrong token");
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
    if (!dense_) {
      return error_response({ErrorCode::Value, "store: " + store_->describe() +
                                                   " is reopened by its storage spec, not through its actor", -1});
    }
    try {
      std::lock_guard<std::mutex> lock(impl_->store_mu);
      impl_->check_alive();
      return apply_request(*dense_, req);
    } catch (...) {
      return error_response(map_detail::carry_current_exception(-1));
    }
  }

  std::chrono::microseconds linger_;
  std::shared_ptr<backends::LeafStore> store_;  // keeps the store alive as long as its actor
  DenseStore* dense_;                           // store_ itself when it is a dense store
  std::string token_;
  std::shared_ptr<StoreCallState> impl_;
};

}  // namespace

struct StoreClient::Impl {
  std::shared_ptr<Runtime> rt;
  std::shared_ptr<StoreCallState> st;
  std::shared_ptr<backends::LeafStore> store;
  //! runs the call here when the store is free, else leaves it waiting for whoever holds the store
  void send(const leaf_call_ptr& call);
  //! tells the actor that calls are waiting for the store
  void announce();

  // ---- write-behind (StoreClient::set_write_behind)
  std::atomic<size_t> behind_max{0};
  std::mutex behind_mu;
  std::deque<leaf_call_ptr> behind;       //!< queued writes not yet seen done, oldest first (under behind_mu)
  std::atomic<size_t> behind_n{0};        //!< behind.size()
  std::optional<map_detail::CarriedError> behind_error;  //!< the first error of a queued write, not raised yet
  std::atomic<bool> behind_failed{false};                //!< behind_error is set
  //! the data copies of done queued writes, oldest first, to be written again (under behind_mu): rows' copies
  //! only (a large write's copy is freed at once), at most kMaxSpareBytes of them
  std::deque<std::unique_ptr<OwnedData>> spare;
  size_t spare_bytes = 0;
  static constexpr size_t kMaxSpareCopy = size_t{1} << 20, kMaxSpareBytes = size_t{32} << 20;
  //! a spare copy of at least `bytes` that nothing holds any more (its call is gone), or nullptr
  std::unique_ptr<OwnedData> take_spare(size_t bytes) {
    std::lock_guard<std::mutex> lock(behind_mu);
    // the oldest first; one still held goes to the back (its call may be in a batch the actor has not let go
    // of yet), so that a copy held for long does not stand in front of the others
    for (size_t i = 0; i < std::min<size_t>(spare.size(), 4); ++i) {
      std::unique_ptr<OwnedData> o = std::move(spare.front());
      spare.pop_front();
      if (o->bytes >= bytes && o->unshared()) {
        spare_bytes -= o->bytes;
        return o;
      }
      spare.push_back(std::move(o));
    }
    return nullptr;
  }
  //! queues a write without waiting for it: registered (fail_all fails it), left waiting, the actor told
  void queue(const leaf_call_ptr& call);
  //! forgets the queued writes that are done, oldest first, keeping the first error; waits for the oldest while
  //! more than `keep` are queued (0: waits for all)
  void reap(size_t keep);
  //! raises the kept error of a queued write, once
  void raise_behind();
  //! before any call that is not a queued write: the queued writes run first (a caller reads what it wrote)
  void settle() {
    if (behind_n.load(std::memory_order_acquire) > 0) reap(0);
    if (behind_failed.load(std::memory_order_acquire)) raise_behind();
  }
};

void StoreClient::Impl::queue(const leaf_call_ptr& call) {
  std::string why;
  caf::actor to;
  if (!st->begin(call, &why, &to)) throw BackendError(why);
  {
    std::lock_guard<std::mutex> lock(behind_mu);
    behind.push_back(call);
    behind_n.store(behind.size(), std::memory_order_release);
  }
  // never run here: the caller goes on while whoever holds the store (the actor, told now) runs what waits
  if (st->push_pending(call)) caf::anon_send(to, leaf_atom::value);
}

void StoreClient::Impl::reap(size_t keep) {
  const auto spin = std::chrono::microseconds(rt->config().facade_spin_us);
  std::lock_guard<std::mutex> lock(behind_mu);
  while (!behind.empty()) {
    const leaf_call_ptr c = behind.front();
    if (!c->reply.ready()) {
      if (keep > 0 && behind.size() <= keep) break;
      c->reply.wait(std::chrono::steady_clock::time_point::max(), spin);  // fail_all ends it if the actor dies
    }
    try {
      c->reply.get();
    } catch (...) {
      if (!behind_error) {
        behind_error = map_detail::carry_current_exception(-1);
        behind_failed.store(true, std::memory_order_release);
      }
    }
    st->end(c);
    behind.pop_front();
    // its data copy, for a later write once the call is gone (OwnedData::unshared; only this thread touches
    // `owned`)
    if (c->owned && c->owned->bytes <= kMaxSpareCopy && spare_bytes + c->owned->bytes <= kMaxSpareBytes) {
      spare_bytes += c->owned->bytes;
      spare.push_back(std::move(c->owned));
    }
  }
  behind_n.store(behind.size(), std::memory_order_release);
}

void StoreClient::Impl::raise_behind() {
  std::optional<map_detail::CarriedError> e;
  {
    std::lock_guard<std::mutex> lock(behind_mu);
    e.swap(behind_error);
    behind_failed.store(false, std::memory_order_release);
  }
  if (!e) return;
  e->message = "a queued write (write-behind) failed: " + e->message;
  map_detail::rethrow(*e);
}

std::shared_ptr<StoreClient> StoreClient::spawn(std::shared_ptr<Runtime> rt, std::shared_ptr<backends::LeafStore> store,
                                                DenseStore* dense, std::string token) {
  if (!rt || !store) throw ValueError("opening a storage: no engine runtime or no store");
  std::shared_ptr<StoreClient> c(new StoreClient());
  c->describe_ = store->describe();
  c->driver_ = store->driver();
  c->spec_fields_ = store->spec_fields();
  c->writable_ = store->writable();
  c->non_tensor_rows_ = store->holds_non_tensor_rows();
  c->dense_ = dense;
  c->token_ = std::move(token);
  c->impl_ = std::make_shared<Impl>();
  c->impl_->rt = std::move(rt);
  c->impl_->store = store;
  c->impl_->st = std::make_shared<StoreCallState>();
  c->impl_->st->describe = c->describe_;
  c->impl_->st->store = store;
  const Config& cfg = c->impl_->rt->config();
  if (cfg.store_lanes > 0) {
    if (auto opener = store->lane_opener()) {
      c->impl_->st->open_lane = std::move(opener);
      c->impl_->st->lane_retry_ns = cfg.store_lane_retry_ms * 1000000;
      for (int64_t i = 0; i < cfg.store_lanes; ++i)
        c->impl_->st->lanes.push_back(std::make_unique<StoreCallState::Lane>());
    }
  }
  caf::actor a = c->impl_->rt->system().spawn<StoreActor>(std::chrono::microseconds(cfg.actor_spin_us),
                                                          std::chrono::microseconds(cfg.store_linger_us),
                                                          std::move(store), dense, c->token_, c->impl_->st);
  c->actor_ = a;
  std::lock_guard<std::mutex> lock(c->impl_->st->mu);
  c->impl_->st->actor = std::move(a);
  return c;
}

std::shared_ptr<StoreClient> StoreClient::open(std::shared_ptr<Runtime> rt, std::shared_ptr<backends::LeafStore> store) {
  return spawn(std::move(rt), std::move(store), nullptr, "");
}

std::shared_ptr<StoreClient> StoreClient::open_dense(std::shared_ptr<Runtime> rt, std::shared_ptr<DenseStore> store) {
  DenseStore* dense = store.get();
  return spawn(std::move(rt), std::move(store), dense, new_store_token());
}

std::shared_ptr<StoreClient> StoreClient::connect(std::shared_ptr<Runtime> rt, const std::string& host, uint16_t port,
                                                  const std::string& token_in) {
  std::string token = token_in;
  if (token.empty()) {
    if (const char* env = std::getenv("TENSORDICT_STORE_TOKEN")) token = env;
  }
  auto a = connect_remote_actor(rt->system(), host, port, rt->request_timeout());
  if (!a) {
    throw BackendError("store: cannot connect to " + host + ":" + std::to_string(port) + ": " +
                       rt->system().render(a.error()));
  }
  store_request req;
  req.op = static_cast<int32_t>(StoreOp::Info);
  req.token = token;
  const store_response info = store_request_blocking(rt->system(), *a, req, rt->request_timeout());
  std::shared_ptr<DenseStore> store = connect_dense_store(rt, *a, token, info);
  DenseStore* dense = store.get();
  return spawn(std::move(rt), std::move(store), dense, std::move(token));
}

StoreClient::~StoreClient() {
  // the queued writes (write-behind) run first; an error of one has nobody left to be raised to: it is logged
  try {
    if (!closed()) impl_->settle();
  } catch (const std::exception& e) {
    logger()->error("{}: {}", describe_, e.what());
  } catch (...) {
  }
  try {
    close();
  } catch (...) {
    // a store that fails to close has already reported through its last request
  }
}

namespace {
//! how many merged store calls a caller that found the store free runs before it returns: its own, with
//! the calls waiting then (the calls that arrive meanwhile are the actor's, or the next caller's)
constexpr size_t kCallerRounds = 1;
//! the longest a waiting caller spins (yielding) before it sleeps
constexpr std::chrono::microseconds kMaxWaitSpin(1000);
}  // namespace

void StoreClient::Impl::send(const leaf_call_ptr& call) {
  StoreCallState& st = *this->st;
  const auto linger = std::chrono::microseconds(rt->config().store_linger_us);
  // the store is free: this caller runs its call, with every call waiting, on its own thread
  auto run_here = [&](std::unique_lock<std::mutex>& lock, std::vector<leaf_call_ptr> mine) {
    st.check_alive();
    const bool left = st.drain(std::move(mine), kCallerRounds, linger);
    lock.unlock();
    if (left) announce();
  };
  {
    std::unique_lock<std::mutex> lock(st.store_mu, std::try_to_lock);
    if (lock.owns_lock()) {
      run_here(lock, {call});
      return;
    }
  }
  // busy: a read or write runs on a free lane (another connection) at once
  if (call->op != leaf_call::Op::Run && !st.lanes.empty() && st.run_on_lane(*call)) return;
  // else it waits in `pending` for the holder (or the actor) to run it
  std::string why;
  caf::actor to;
  if (!st.begin(call, &why, &to)) throw BackendError(why);
  if (st.push_pending(call)) {
    // nobody holding the store will take it: take the store if it is free by now, else tell the actor
    std::unique_lock<std::mutex> lock(st.store_mu, std::try_to_lock);
    if (lock.owns_lock()) {
      try {
        run_here(lock, {});
      } catch (...) {
        st.end(call);
        throw;
      }
    } else {
      caf::anon_send(to, leaf_atom::value);
    }
  }
  // the wait lasts about two store calls (the one running, then this one's): spin (yielding) that long
  // instead of sleeping, since a sleeping waiter costs a wake-up per call and the wake-ups, not the round
  // trips, bound many producers on few cores (4 producers on one Redis handle, 2 cores: ~25k rows/s
  // sleeping after 50 us, a median of ~40k spinning); at least facade_spin_us, at most kMaxWaitSpin;
  // facade_spin_us = 0 (no spinning wanted) sleeps at once
  const auto facade_spin = std::chrono::microseconds(rt->config().facade_spin_us);
  const auto spin =
      facade_spin.count() == 0
          ? facade_spin
          : std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::nanoseconds(
                           2 * st.recent_store_ns.load(std::memory_order_relaxed))) +
                           std::chrono::microseconds(rt->config().store_linger_us),
                       facade_spin, std::max(kMaxWaitSpin, facade_spin));
  // no timeout: a long HDF5 write is legitimate; an actor that dies fails the call (fail_all)
  call->reply.wait(std::chrono::steady_clock::time_point::max(), spin);
  st.end(call);
}

void StoreClient::Impl::announce() {
  caf::actor to;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (!st->alive) return;  // fail_all has failed the calls waiting
    to = st->actor;
  }
  if (to) caf::anon_send(to, leaf_atom::value);
}

std::vector<at::Tensor> StoreClient::read(std::vector<backends::LeafRead> reads) {
  impl_->settle();
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Read;
  c->reads = std::move(reads);
  impl_->send(c);
  return c->reply.get();
}

namespace {
bool plain_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
         !t._is_zerotensor() && !t.requires_grad() && !t.is_quantized();
}

//! gives each write data that nothing else holds (the caller may reuse or change its tensors at once). Plain
//! contiguous CPU leaves (a replay buffer's row) are copied into ONE buffer, each leaf a tensor over its part,
//! made without the dispatcher: a row of 4 leaves cost 4 at::empty (15% of a producer's time, measured) + 4
//! TensorIterator copies as clones; others are cloned (nullptr returned). A done write's copy that nothing
//! holds any more (`take_spare(bytes)`, Impl::take_spare) is written again when it is large enough: its buffer
//! and tensors are reused
template <class TakeSpare>
std::unique_ptr<OwnedData> own_data(std::vector<backends::LeafWrite>& writes, TakeSpare&& take_spare) {
  constexpr size_t kAlign = 64;
  size_t total = 0;
  bool plain = true;
  for (const auto& w : writes) {
    if (!w.data.defined()) continue;
    plain = plain && plain_cpu(w.data);
    total += (w.data.nbytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (!plain) {
    for (auto& w : writes)
      if (w.data.defined()) w.data = w.data.clone(at::MemoryFormat::Contiguous);
    return nullptr;
  }
  const size_t bytes = std::max<size_t>(total, 1);
  std::unique_ptr<OwnedData> o = take_spare(bytes);
  if (!o) {
    // the buffer straight from malloc: at::empty's dispatch was a fifth of this function (callgrind), and the CPU
    // allocator's 64-byte posix_memalign another 5% of a producer (perf); each leaf starts at a multiple of 64
    // bytes
    o = std::make_unique<OwnedData>();
    void* mem = std::malloc(bytes);
    if (!mem) throw std::bad_alloc();
    o->buf = c10::Storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(mem, mem, &std::free, at::Device(at::kCPU)),
                          /*allocator=*/nullptr, /*resizable=*/false);
    o->bytes = bytes;
    o->views.reserve(writes.size());
  }
  char* base = static_cast<char*>(o->buf.unsafeGetStorageImpl()->data());
  size_t off = 0, k = 0;
  for (auto& w : writes) {
    if (!w.data.defined()) continue;
    const size_t n = w.data.nbytes();
    if (n) std::memcpy(base + off, w.data.data_ptr(), n);
    const auto offset = static_cast<int64_t>(off / w.data.element_size());
    if (k < o->views.size() && o->views[k].dtype() == w.data.dtype()) {
      c10::TensorImpl* impl = o->views[k].unsafeGetTensorImpl();
      if (impl->sizes() != w.data.sizes()) impl->set_sizes_contiguous(w.data.sizes());
      impl->set_storage_offset(offset);
    } else {
      // the constructor adds autograd's and autocast's keys to CPU's, as for any CPU tensor
      at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(o->buf), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                              w.data.dtype());
      t.unsafeGetTensorImpl()->set_sizes_contiguous(w.data.sizes());
      t.unsafeGetTensorImpl()->set_storage_offset(offset);
      if (k < o->views.size()) {
        o->views[k] = std::move(t);
      } else {
        o->views.push_back(std::move(t));
      }
    }
    w.data = o->views[k++];
    off += (n + kAlign - 1) / kAlign * kAlign;
  }
  o->views.resize(k);
  return o;
}
}  // namespace

void StoreClient::write(std::vector<backends::LeafWrite> writes) {
  Impl& im = *impl_;
  const size_t max_behind = im.behind_max.load(std::memory_order_acquire);
  if (max_behind == 0) {
    im.settle();
  } else {
    im.reap(max_behind);  // the done ones forgotten; past the bound, the oldest waited for
    // a queued write failed: every write queued so far is waited for, then the first error raised (so one raise
    // answers for all of them, and the queue is empty after it)
    if (im.behind_failed.load(std::memory_order_acquire)) im.settle();
  }
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Write;
  if (max_behind > 0)  // the call outlives this one
    c->owned = own_data(writes, [&im](size_t bytes) { return im.take_spare(bytes); });
  c->writes = std::move(writes);
  if (max_behind > 0) {
    im.queue(c);
    return;
  }
  im.send(c);
  c->reply.get();
}

void StoreClient::set_write_behind(size_t max_in_flight) {
  if (max_in_flight == 0) impl_->settle();
  impl_->behind_max.store(max_in_flight, std::memory_order_release);
}

size_t StoreClient::write_behind() const { return impl_->behind_max.load(std::memory_order_acquire); }

void StoreClient::flush_writes() { impl_->settle(); }

void StoreClient::run_void(const std::function<void(backends::LeafStore&)>& fn) {
  impl_->settle();
  auto c = std::make_shared<leaf_call>();
  c->op = leaf_call::Op::Run;
  c->fn = fn;
  impl_->send(c);
  c->reply.get();
}

void StoreClient::close() {
  StoreCallState& st = *impl_->st;
  // the queued writes run before the store closes; the first error of one is raised after it closed
  std::exception_ptr behind_err;
  try {
    if (!closed()) impl_->settle();
  } catch (...) {
    behind_err = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.closed) return;
    st.closed = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint16_t p : ports_) impl_->rt->system().middleman().unpublish(actor_, p);
    ports_.clear();
  }
  std::exception_ptr err;
  try {
    run_void([](backends::LeafStore& s) { s.close(); });
  } catch (const BackendError&) {
    // already gone (killed): closing is done
  } catch (...) {
    err = std::current_exception();
  }
  st.fail_all(describe_ + " is closed");
  st.close_lanes();
  caf::actor a;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    a.swap(st.actor);
  }
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  if (err) std::rethrow_exception(err);
  if (behind_err) std::rethrow_exception(behind_err);
}

bool StoreClient::closed() const {
  std::lock_guard<std::mutex> lock(impl_->st->mu);
  return impl_->st->closed;
}

size_t StoreClient::waiting() const { return impl_->st->pending_n.load(std::memory_order_acquire); }

StoreClient::BatchStats StoreClient::batch_stats() const {
  std::lock_guard<std::mutex> lock(impl_->st->mu);
  return impl_->st->stats;
}

TensorDict StoreClient::snapshot() const { return dense_ ? dense_->td() : TensorDict::undefined(); }

int64_t StoreClient::version() const { return dense_ ? dense_->version() : 0; }

store_response StoreClient::call(const store_request& req) {
  if (!dense_) throw ValueError("store: " + describe_ + " takes no protocol requests");
  if (static_cast<StoreOp>(req.op) == StoreOp::Close && !remote()) {
    close();
    return store_response();
  }
  return run([&](backends::LeafStore&) { return apply_request(*dense_, req); });
}

uint16_t StoreClient::publish(uint16_t port) {
  if (!dense_ || remote()) throw ValueError("store: only the owner of a store can publish it");
  impl_->st->check_alive();
  std::lock_guard<std::mutex> lock(mu_);
  auto p = impl_->rt->system().middleman().publish(actor_, port, "127.0.0.1");
  if (!p) {
    throw BackendError("store: cannot listen on 127.0.0.1:" + std::to_string(port) + ": " +
                       impl_->rt->system().render(p.error()));
  }
  ports_.push_back(*p);
  return *p;
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
