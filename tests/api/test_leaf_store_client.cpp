// The store client (actors/store_client.hpp) over a real HDF5 file: calls that find the store busy
// wait and are merged into one store call; each caller still gets its own result or error; calls from many
// threads at once all complete with the right values. Assertions run on the test's thread only.
#include <boost/test/unit_test.hpp>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/backends_test_util.hpp"
#include "tensordict/actors/store_client.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/backends/h5_store.hpp"
#include "tensordict/backends/redis_store.hpp"
#include "redis_server.hpp"
#include "tensordict/config.hpp"
#include "tensordict/errors.hpp"

using namespace tensordict;
namespace be = tensordict::backends;
using td_test::TempDir;

namespace {

//! a bounded wait on the test's thread: true once pred() holds
template <class F>
bool eventually(F pred, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

//! holds the store (a `run` call that blocks until released) so that other calls must wait for it
struct StoreHolder {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false;
  std::thread t;
  explicit StoreHolder(actors::StoreClient& c) {
    t = std::thread([this, &c] {
      c.run([this](be::LeafStore&) {
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait_for(lock, std::chrono::seconds(30), [this] { return released; });
      });
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [this] { return entered; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
    }
    cv.notify_all();
    t.join();
  }
  ~StoreHolder() {
    if (t.joinable()) release();
  }
};

//! a client over a new HDF5 file holding one float leaf "x" of [rows, 3] (zeros)
struct H5Client {
  TempDir dir;
  std::shared_ptr<actors::Runtime> rt;
  std::shared_ptr<actors::StoreClient> client;
  explicit H5Client(int64_t rows, const Config& config = Config::load()) : rt(actors::Runtime::start(config)) {
    auto store = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
    store->create({"x"}, at::kFloat, {rows, 3}, at::Tensor(), {});
    client = actors::StoreClient::open(rt, store);
  }
};

be::LeafWrite row_write(int64_t r, at::Tensor v) {
  be::LeafWrite w;
  w.path = {"x"};
  w.whole = false;
  w.rows = {r};
  w.data = std::move(v);
  return w;
}

//! gates on the writes of a Redis store's connections: [0] the store's own, then its lanes in the order they open.
//! A closed gate holds the writes that reach it until it opens (bounded: 30 s)
struct Gates {
  static constexpr size_t kMax = 8;
  std::mutex mu;
  std::condition_variable cv;
  size_t opened = 0;  // connections made so far
  bool closed[kMax] = {};
  int held[kMax] = {};
  void set(size_t i, bool close) {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed[i] = close;
    }
    cv.notify_all();
  }
  //! waits (bounded) until `n` writes are held at gate i
  bool holds(size_t i, int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return held[i] == n; });
  }
};

//! a real Redis store (its own connection) whose writes pass a gate first; its lanes are such stores too
class GatedRedisStore : public be::RedisStore {
 public:
  GatedRedisStore(const be::RedisOptions& o, std::shared_ptr<Gates> g) : RedisStore(o), gates_(std::move(g)) {
    std::lock_guard<std::mutex> lock(gates_->mu);
    index_ = std::min(gates_->opened++, Gates::kMax - 1);
  }
  void write(const std::vector<be::LeafWrite>& writes) override {
    {
      Gates& g = *gates_;
      std::unique_lock<std::mutex> lock(g.mu);
      if (g.closed[index_]) {
        ++g.held[index_];
        g.cv.notify_all();
        g.cv.wait_for(lock, std::chrono::seconds(30), [&] { return !g.closed[index_]; });
        --g.held[index_];
      }
    }
    RedisStore::write(writes);
  }
  std::function<std::shared_ptr<be::LeafStore>()> lane_opener() const override {
    return [o = options(), g = gates_] { return std::make_shared<GatedRedisStore>(o, g); };
  }

 private:
  std::shared_ptr<Gates> gates_;
  size_t index_ = 0;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(leaf_store_client)

// a structural call (Op::Run) never runs beside a call on a lane: it waits until the lane's call is done (a lane
// whose cached structure a concurrent change made stale could write a row at the old key's offsets after it)
BOOST_AUTO_TEST_CASE(a_structural_call_waits_for_the_call_on_a_lane) {
  testutil::RedisServer server;
  auto rt = actors::Runtime::start(Config::load());
  auto gates = std::make_shared<Gates>();
  auto store = std::make_shared<GatedRedisStore>(be::RedisOptions().port(server.port()), gates);
  store->create({"x"}, at::kFloat, {8, 3}, at::Tensor(), {});
  auto client = actors::StoreClient::open(rt, store);
  gates->set(0, true);
  std::thread w1([&] { client->write({row_write(0, at::full({3}, 1.0f))}); });  // holds the store's connection
  BOOST_TEST_REQUIRE(gates->holds(0, 1));
  gates->set(1, true);
  std::thread w2([&] { client->write({row_write(1, at::full({3}, 2.0f))}); });  // the store is busy: a lane
  BOOST_TEST_REQUIRE(gates->holds(1, 1), "the second write runs on a lane");
  gates->set(0, false);
  w1.join();  // the store is free again; the lane's call is still in flight
  std::atomic<bool> ran{false};
  std::thread structural([&] { client->run([&](be::LeafStore& s) { ran.store(true); return s.list().size(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const bool ran_beside_the_lane = ran.load();
  gates->set(1, false);
  w2.join();
  structural.join();
  BOOST_TEST(!ran_beside_the_lane, "the structural call waited for the lane's call");
  BOOST_TEST(ran.load());
  BOOST_TEST(client->batch_stats().lane_calls == 1);
  at::Tensor got = client->read({be::LeafRead{{"x"}, false, {0, 1}}}).at(0);
  BOOST_TEST(got.equal(at::stack({at::full({3}, 1.0f), at::full({3}, 2.0f)})));
  client->close();
}

BOOST_AUTO_TEST_CASE(calls_that_wait_for_a_busy_store_become_one_store_call) {
  H5Client f(8);
  auto& client = f.client;
  const auto before = client->batch_stats();
  std::vector<std::thread> writers;
  {
    StoreHolder hold(*client);
    BOOST_TEST(client->waiting() == 0u);
    for (int64_t r = 0; r < 3; ++r)
      writers.emplace_back([&client, r] { client->write({row_write(r, at::full({3}, static_cast<float>(r + 1)))}); });
    BOOST_TEST_REQUIRE(eventually([&] { return client->waiting() == 3u; }), "3 writes waiting for the busy store");
  }  // released: the three writes run as ONE store call
  for (auto& t : writers) t.join();
  const auto after = client->batch_stats();
  BOOST_TEST(after.calls - before.calls == 3);
  BOOST_TEST(after.batches - before.batches == 1);
  BOOST_TEST(after.largest >= 3);
  at::Tensor got = client->read({be::LeafRead{{"x"}, true, {}}}).at(0);
  at::Tensor want = at::zeros({8, 3});
  for (int64_t r = 0; r < 3; ++r) want[r].fill_(static_cast<float>(r + 1));
  BOOST_TEST(got.equal(want));
  BOOST_TEST(client->waiting() == 0u);
}

BOOST_AUTO_TEST_CASE(a_bad_call_in_a_merged_batch_fails_alone) {
  H5Client f(8);
  auto& client = f.client;
  std::vector<std::string> errors(3);
  std::vector<std::thread> writers;
  {
    StoreHolder hold(*client);
    for (int64_t r = 0; r < 3; ++r) {
      writers.emplace_back([&client, &errors, r] {
        // the second write has the wrong dtype: the merged write fails, then each runs alone
        at::Tensor v = r == 1 ? at::full({3}, 9.0, at::kDouble) : at::full({3}, static_cast<float>(r + 1));
        try {
          client->write({row_write(r, v)});
        } catch (const TypeError& e) {
          errors[static_cast<size_t>(r)] = std::string("TypeError: ") + e.what();
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = std::string("other: ") + e.what();
        }
      });
    }
    BOOST_TEST_REQUIRE(eventually([&] { return client->waiting() == 3u; }));
  }
  for (auto& t : writers) t.join();
  BOOST_TEST(errors[0].empty());
  BOOST_TEST(errors[1].rfind("TypeError: ", 0) == 0, errors[1]);
  BOOST_TEST(errors[2].empty());
  at::Tensor got = client->read({be::LeafRead{{"x"}, false, {0, 1, 2}}}).at(0);
  BOOST_TEST(got.equal(at::stack({at::full({3}, 1.0f), at::zeros({3}), at::full({3}, 3.0f)})));
}

namespace {
//! 4 threads x 150 write + read-back (+ a run call now and then) on one store; each must get its own rows
void many_threads_on_one_store(const Config& config) {
  const int threads = 4, per = 150;
  H5Client f(threads * per, config);
  auto& client = f.client;
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> ts;
  for (int k = 0; k < threads; ++k) {
    ts.emplace_back([&, k] {
      try {
        for (int i = 0; i < per; ++i) {
          const int64_t r = k * per + i;
          client->write({row_write(r, at::full({3}, static_cast<float>(r)))});
          at::Tensor back = client->read({be::LeafRead{{"x"}, false, {r}}}).at(0);
          if (!back.equal(at::full({1, 3}, static_cast<float>(r)))) wrong.fetch_add(1);
          if (i % 25 == 0) client->run([](be::LeafStore& s) { return s.list().size(); });
        }
      } catch (...) {
        failed.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  BOOST_TEST(failed.load() == 0);
  BOOST_TEST(wrong.load() == 0);
  at::Tensor all = client->read({be::LeafRead{{"x"}, true, {}}}).at(0);
  BOOST_TEST(all.equal(at::arange(threads * per).to(at::kFloat).unsqueeze(1).expand({threads * per, 3})));
  const auto st = client->batch_stats();
  BOOST_TEST(st.calls == 2 * threads * per + 1);
  BOOST_TEST(st.batches <= st.calls);
  BOOST_TEST(client->waiting() == 0u);
  BOOST_TEST_MESSAGE("row calls " << st.calls << " in " << st.batches << " store calls, largest " << st.largest);
}
}  // namespace

BOOST_AUTO_TEST_CASE(many_threads_reading_and_writing_each_get_their_own_rows) {
  many_threads_on_one_store(Config::load());
}

BOOST_AUTO_TEST_CASE(many_threads_with_sleeping_waiters_each_get_their_own_rows) {
  // no spinning and no linger: waiters sleep at once, and every call that waited wakes a sleeping caller
  Config config = Config::load();
  config.facade_spin_us = 0;
  config.store_linger_us = 0;
  many_threads_on_one_store(config);
}

BOOST_AUTO_TEST_SUITE_END()
