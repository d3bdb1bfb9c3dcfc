// Worker PROCESSES over a VIEW of a memmap TensorDict (issue 34, item 6): td.map's workers reopen the source
// view and the out view by their storage specs, which carry the views' indices, so they read and write only
// those rows of the directories (td_map_worker, TD_MAP_WORKER_EXE); a DataLoader's worker processes read only
// the view's rows (td_loader_worker, TD_LOADER_WORKER_EXE).
#include <boost/test/unit_test.hpp>

#include "api/map_process_fns.hpp"
#include "engine/fixtures.hpp"
#include "tensordict/tensordict.hpp"

#if !defined(TD_MAP_WORKER_EXE) || !defined(TD_LOADER_WORKER_EXE)
#error "TD_MAP_WORKER_EXE and TD_LOADER_WORKER_EXE (the worker programs' paths) must be defined"
#endif

using namespace tensordict;
using at::indexing::Slice;

namespace {

//! batch [n]: "x" [n, 8] f32, "idx" [n] i64 = row, "nested" {"z": [n, 3] f32}
TensorDict dataset(int64_t n) {
  auto gen = at::detail::createCPUGenerator(17);
  TensorDict nested({{"z", at::randn({n, 3}, gen)}}, {n});
  return TensorDict({{"x", at::randn({n, 8}, gen)}, {"idx", at::arange(n)}, {"nested", nested}}, {n});
}

MapOptions procs(int64_t n) { return MapOptions().worker_processes(n).worker_executable(TD_MAP_WORKER_EXE); }

//! every leaf of td filled with `v` (in place)
void fill_all(TensorDict& td, double v) {
  td.apply_([v](const at::Tensor& t) { return t.fill_(v); });
}

struct Fixture {
  Fixture() { map_process_test::register_fns(); }
  Engine engine;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(view_workers)

BOOST_FIXTURE_TEST_CASE(worker_processes_map_a_slice_view_into_a_slice_view, Fixture) {
  fixtures::TempDir tmp("map_view");
  TensorDict src = dataset(1000).memmap(tmp / "src");
  TensorDict out = src.memmap_like(tmp / "out");
  fill_all(out, -7);
  const TensorDict src_view = src.index({Slice(200, 700)});
  TensorDict out_view = out.index({Slice(200, 700)});
  BOOST_TEST(StorageSpec::of(src_view).has_index());
  BOOST_TEST(StorageSpec::of(out_view).has_index());
  TensorDict r = src_view.map("mp_affine", procs(2).chunksize(100).out(out_view));
  if (r.defined()) BOOST_TEST(r.equal(map_process_test::affine(src_view)));  // out itself, when returned
  // the view's rows hold the result, every other row of the directory is untouched
  const TensorDict on_disk = TensorDict::load_memmap(tmp / "out");
  BOOST_TEST(on_disk.index({Slice(200, 700)}).equal(map_process_test::affine(src_view)));
  TensorDict before = on_disk.index({Slice(0, 200)}).clone(), after = on_disk.index({Slice(700, 1000)}).clone();
  TensorDict untouched_before = before.clone(), untouched_after = after.clone();
  fill_all(untouched_before, -7);
  fill_all(untouched_after, -7);
  BOOST_TEST(before.equal(untouched_before));
  BOOST_TEST(after.equal(untouched_after));
}

BOOST_FIXTURE_TEST_CASE(worker_processes_map_an_index_list_view, Fixture) {
  // the source is a list of rows (out of order), the out a strided view
  fixtures::TempDir tmp("map_view");
  TensorDict src = dataset(600).memmap(tmp / "src");
  TensorDict out = src.memmap_like(tmp / "out");
  fill_all(out, -7);
  const at::Tensor rows = at::arange(599, 0, -3, at::kLong);  // 200 rows, descending
  const TensorDict src_view = src.index({rows});
  TensorDict out_view = out.index({Slice(0, 600, 3)});
  BOOST_REQUIRE_EQUAL(out_view.batch_size()[0], 200);
  src_view.map("mp_affine", procs(2).chunksize(50).out(out_view));
  const TensorDict on_disk = TensorDict::load_memmap(tmp / "out");
  BOOST_TEST(on_disk.index({Slice(0, 600, 3)}).equal(map_process_test::affine(src_view)));
  // rows 1, 2, 4, 5, ... untouched
  const at::Tensor other = at::arange(600, at::kLong).index({at::arange(600, at::kLong).remainder(3) != 0});
  BOOST_TEST((on_disk.get("x").index({other}) == -7).all().item<bool>());
  BOOST_TEST((on_disk.get("idx").index({other}) == -7).all().item<bool>());
}

BOOST_FIXTURE_TEST_CASE(loader_worker_processes_read_only_the_view, Fixture) {
  fixtures::TempDir tmp("map_view");
  TensorDict src = dataset(500).memmap(tmp / "src");
  const TensorDict view = src.index({Slice(100, 300)});
  DataLoader loader(view, LoaderOptions()
                              .worker_processes(2)
                              .worker_executable(TD_LOADER_WORKER_EXE)
                              .batch_size(16)
                              .transform_name(""));
  std::vector<at::Tensor> idx, x;
  for (TensorDict b : loader) {
    idx.push_back(b.get("idx").clone());
    x.push_back(b.get("x").clone());
  }
  BOOST_TEST(at::cat(idx).equal(at::arange(100, 300, at::kLong)));
  BOOST_TEST(at::cat(x).equal(view.get("x")));
}

BOOST_AUTO_TEST_SUITE_END()
