// bench_metadata: structural questions on storages larger than one wants to read (issue 34): contains,
// keys(include_nested), repr and is_empty on a ~400 MB Redis store (a real redis-server on loopback) and a
// ~400 MB HDF5 file, both from_schema({"obs": [1024] f32, "r": [] f32}, {100000}). Each is answered from the
// node's metadata (Node::meta), so it costs a lookup, not a read of the data. Also get_at("obs", 5) against
// td.index({5}).get("obs") on Redis (both read one row). Prints one JSON object; times are medians per call.
// TD_BENCH_BEFORE=1 also times one whole read of "obs" and one contiguous() (what contains and repr read
// before), which takes seconds.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include <ATen/Parallel.h>
#include <tensordict/tensordict.hpp>

#include "bench_common.hpp"
#include "redis_server.hpp"

using namespace tensordict;
using benchutil::Json;

namespace {

constexpr int64_t kRows = 100000;
constexpr int64_t kFeatures = 1024;

Schema schema() { return {{"obs", {{kFeatures}, at::kFloat}}, {"r", {{}, at::kFloat}}}; }

double once_ms(const std::function<void()>& f) {
  auto t0 = benchutil::Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(benchutil::Clock::now() - t0).count();
}

//! the structural questions on td, in microseconds per call
Json structure(const TensorDict& td, bool before) {
  Json j;
  size_t sink = 0;
  j.num("contains_us", benchutil::measure_one([&] { sink += td.contains("obs"); }), 2);
  j.num("contains_missing_us", benchutil::measure_one([&] { sink += td.contains("missing"); }), 2);
  j.num("keys_include_nested_us",
        benchutil::measure_one([&] { sink += td.keys(KeysOptions().include_nested(true).leaves_only(true)).size(); }), 2);
  j.num("repr_us", benchutil::measure_one([&] {
          std::ostringstream os;
          os << td;
          sink += os.str().size();
        }),
        2);
  j.num("is_empty_us", benchutil::measure_one([&] { sink += td.is_empty(); }), 2);
  if (before) {  // what contains and repr read before issue 34: the whole leaf, the whole TensorDict
    j.num("before_get_obs_ms", once_ms([&] { sink += static_cast<size_t>(td.get("obs").numel()); }), 0);
    j.num("before_contiguous_ms", once_ms([&] { sink += td.contiguous().keys().size(); }), 0);
  }
  if (sink == 0) std::fprintf(stderr, "?");
  return j;
}

}  // namespace

int main() {
  at::manual_seed(0);
  at::set_num_threads(1);
  const bool before = std::getenv("TD_BENCH_BEFORE") != nullptr;
  try {
    Json out;
    out.str("benchmark", "metadata").str("unit", "us");
    Json config;
    config.num("rows", kRows, 0).num("features", kFeatures, 0).num("mb", kRows * (kFeatures + 1) * 4 / 1e6, 0);
    out.obj("config", config);
    Json targets;
    targets.num("structural_us", 1000, 0).num("get_at_ratio", 1.3, 1);
    out.obj("targets", targets);
    {
      testutil::RedisServer server;
      Json redis;
      double made_ms = 0;
      TensorDict td;
      made_ms = once_ms([&] {
        td = TensorDict::from_schema(schema(), {kRows}, "redis", RedisOptions().port(server.port()));
      });
      redis.num("from_schema_ms", made_ms, 0);
      redis.obj("structure", structure(td, before));
      size_t sink = 0;
      auto p = benchutil::measure_pair([&] { sink += static_cast<size_t>(td.get_at("obs", {5}).numel()); },
                                       [&] { sink += static_cast<size_t>(td.index({5}).get("obs").numel()); });
      Json g;
      g.num("get_at_us", p.ours_us, 1).num("index_get_us", p.raw_us, 1).num("ratio", p.ratio(), 2);
      redis.obj("get_at", g);
      if (sink == 0) std::fprintf(stderr, "?");
      TensorDictStore(td).clear_redis();
      out.obj("redis", redis);
    }
    {
      const std::string dir = std::filesystem::temp_directory_path() / ("bench_metadata_" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      Json h5;
      TensorDict td;
      h5.num("from_schema_ms", once_ms([&] {
               td = TensorDict::from_schema(schema(), {kRows}, "h5", H5Options().filename(dir + "/buf.h5"));
             }),
             0);
      h5.obj("structure", structure(td, before));
      td = TensorDict();
      std::filesystem::remove_all(dir);
      out.obj("h5", h5);
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_metadata: %s\n", e.what());
    return 1;
  }
  return 0;
}
