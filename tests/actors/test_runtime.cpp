// actors/ directly: the runtime (CAF system from a Config), the facade inbox, the echo actor, map backend.
#include <atomic>
#include <chrono>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "tensordict/actors/inbox.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/map.hpp"

using namespace tensordict;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

BOOST_AUTO_TEST_SUITE(runtime)

BOOST_AUTO_TEST_CASE(start_ping_stop) {
  for (int round = 0; round < 3; ++round) {
    auto t0 = steady_clock::now();
    auto rt = actors::Runtime::start(Config::load());
    BOOST_TEST(rt->ping(41) == 41);
    rt.reset();
    BOOST_CHECK(steady_clock::now() - t0 < std::chrono::seconds(5));
  }
}

BOOST_AUTO_TEST_CASE(raw_scoped_actor_request) {
  auto rt = actors::Runtime::start(Config::load());
  {
    caf::scoped_actor self{rt->system()};
    int64_t got = -1;
    self->request(rt->echo(), std::chrono::seconds(5), actors::ping_atom::value, int64_t{7})
        .receive([&](int64_t r) { got = r; }, [&](caf::error&) {});
    BOOST_TEST(got == 7);
  }
}

BOOST_AUTO_TEST_CASE(inbox_spin_then_block) {
  actors::Inbox<int> box(std::chrono::microseconds(20));
  auto t0 = steady_clock::now();
  BOOST_TEST(!box.pop(steady_clock::now() + milliseconds(30)).has_value());
  BOOST_CHECK(steady_clock::now() - t0 >= milliseconds(30));
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    for (int i = 0; i < 100; ++i) box.push(i);
  });
  for (int i = 0; i < 100; ++i) BOOST_TEST(*box.pop() == i);
  producer.join();
}

BOOST_AUTO_TEST_CASE(map_through_runtime) {
  auto rt = actors::Runtime::start(Config::load());
  TensorDict td({{"x", at::arange(12).reshape({12, 1})}}, {12});
  MapFn fn = [](const TensorDict& c) {
    return TensorDict({{"x", c.get("x") * 2}}, c.batch_size());
  };
  TensorDict r = rt->map(td, fn, MapOptions().chunksize(5));
  BOOST_TEST(at::equal(r.get("x"), td.get("x") * 2));
  // map_iter through the runtime, then the runtime goes away after the iterator
  MapIter it = rt->map_iter(td, fn, MapOptions().chunksize(4));
  rt.reset();  // the iterator keeps the system alive
  int64_t n = 0;
  while (auto c = it.next()) n += c->batch_size()[0];
  BOOST_TEST(n == 12);
}

BOOST_AUTO_TEST_SUITE_END()
