// Typed access costs nothing measurable (issue: TypedTensorDict and TensorClass): state.x() against
// td.get("x"), replay.index(i) against td.index(i), tc.a() against td.get("a"), tc.index(i) against
// td.index(i), and a TensorClass over an HDF5 file against the file itself. Ratios of medians measured in the
// same run, alternating samples. Prints one JSON object.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "bench_common.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using benchutil::Json;

namespace {

struct Replay : TypedTensorDict<Replay> {
  TD_FIELDS(Replay, TD_TENSOR(obs), TD_TENSOR(action), TD_TENSOR(reward))
};
struct ReplayTc : TensorClass<ReplayTc> {
  TD_FIELDS(ReplayTc, TD_TENSOR(obs), TD_TENSOR(action), TD_TENSOR(reward))
};

Json row(const std::string& name, const benchutil::Pair& p) {
  return Json().str("op", name).num("typed_us", p.ours_us, 3).num("untyped_us", p.raw_us, 3).num("ratio", p.ratio(), 3);
}

}  // namespace

int main() {
  const int64_t n = 4096;
  TensorDict td({{"obs", at::randn({n, 16})}, {"action", at::randn({n, 4})}, {"reward", at::randn({n})}}, {n});
  Replay replay = Replay::from_tensordict(td);
  ReplayTc tc = ReplayTc::from_tensordict(td);
  int64_t i = 0;
  volatile int64_t sink = 0;
  std::vector<Json> rows;
  rows.push_back(row("field read: state.x() vs td.get(\\\"x\\\")",
                     benchutil::measure_pair([&] { sink = sink + replay.obs().size(0); },
                                             [&] { sink = sink + td.get("obs").size(0); })));
  rows.push_back(row("index: replay.index(i) vs td.index(i)",
                     benchutil::measure_pair([&] { sink = sink + replay.index({(i++) % n}).len(); },
                                             [&] { sink = sink + td.index({(i++) % n}).len(); })));
  rows.push_back(row("TensorClass field read: tc.obs() vs td.get(\\\"obs\\\")",
                     benchutil::measure_pair([&] { sink = sink + tc.obs().size(0); },
                                             [&] { sink = sink + td.get("obs").size(0); })));
  rows.push_back(row("TensorClass index: tc.index(i) vs td.index(i)",
                     benchutil::measure_pair([&] { sink = sink + tc.index({(i++) % n}).len(); },
                                             [&] { sink = sink + td.index({(i++) % n}).len(); })));
  // a remote backend: the typed layer adds nothing to the I/O
  const std::string file = "/tmp/td_bench_typed_" + std::to_string(::getpid()) + ".h5";
  {
    PersistentTensorDict h5 = PersistentTensorDict::from_dict(td, file);
    Replay rh5 = Replay::from_tensordict(h5);
    rows.push_back(row("HDF5 row read: replay_h5.index(i).obs() vs h5.index(i).get(\\\"obs\\\")",
                       benchutil::measure_pair([&] { sink = sink + rh5.index({(i++) % n}).obs().size(0); },
                                               [&] { sink = sink + h5.index({(i++) % n}).get("obs").size(0); })));
    h5.close();
  }
  std::remove(file.c_str());
  std::cout << Json().str("bench", "typed").num("rows", static_cast<double>(n), 0).arr("results", rows).dump()
            << std::endl;
  return 0;
}
