// Engine: explicit and default engines start and stop without hanging; td.map picks the registered one.
#include <chrono>

#include <boost/test/unit_test.hpp>

#include "tensordict/actors/runtime.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using std::chrono::steady_clock;

BOOST_AUTO_TEST_SUITE(engine)

BOOST_AUTO_TEST_CASE(explicit_start_stop) {
  for (int i = 0; i < 3; ++i) {
    auto t0 = steady_clock::now();
    {
      Engine engine(Config::load(R"({"scheduler": {"threads": 1}, "map": {"num_workers": 3}})"));
      BOOST_TEST(engine.config().scheduler_threads == 1);
      BOOST_TEST(engine.config().map_num_workers == 3);
      BOOST_TEST(engine.ping(5) == 5);
      BOOST_TEST((get_map_backend() == std::static_pointer_cast<MapBackend>(engine.runtime())));
    }
    BOOST_CHECK(steady_clock::now() - t0 < std::chrono::seconds(5));
  }
}

BOOST_AUTO_TEST_CASE(default_engine_is_lazy) {
  Engine::shutdown_default();
  BOOST_TEST(!Engine::default_running());
  TensorDict td({{"x", at::ones({4, 2})}}, {4});
  TensorDict r = td.map([](const TensorDict& c) { return c.apply([](const at::Tensor& t) { return t + 1; }); },
                        MapOptions());
  BOOST_TEST(Engine::default_running());
  BOOST_TEST(at::equal(r.get("x"), at::full({4, 2}, 2.0)));
  auto t0 = steady_clock::now();
  Engine::shutdown_default();
  BOOST_TEST(!Engine::default_running());
  BOOST_CHECK(steady_clock::now() - t0 < std::chrono::seconds(5));
  // restarts on next use; stays running: the process exit stops it (ctest's timeout catches a hang)
  BOOST_TEST(Engine::default_engine()->ping(3) == 3);
}

BOOST_AUTO_TEST_CASE(explicit_engine_takes_over_then_default_again) {
  TensorDict td({{"x", at::ones({6})}}, {6});
  MapFn fn = [](const TensorDict& c) { return c; };
  {
    Engine engine;
    BOOST_TEST((get_map_backend() == std::static_pointer_cast<MapBackend>(engine.runtime())));
    BOOST_TEST(td.map(fn, MapOptions().chunksize(2)).batch_size() == BatchSize{6});
  }
  BOOST_TEST((get_map_backend() == std::static_pointer_cast<MapBackend>(Engine::default_engine()->runtime())));
  BOOST_TEST(td.map(fn, MapOptions().chunksize(2)).batch_size() == BatchSize{6});
}

BOOST_AUTO_TEST_SUITE_END()
