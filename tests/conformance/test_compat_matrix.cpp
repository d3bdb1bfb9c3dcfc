// The seed's compatibility page as tests (shared/seeds/compatibility.rst.txt): TensorClass over
// {TensorDict, HDF5, Redis, lazy stack, memmap, TypedTensorDict} and TypedTensorDict over {TensorDict, HDF5,
// Redis, lazy stack, memmap}, each x {build, read, write, index, clone, stack, iter, update}: 88 cells on real
// backends (HDF5 files, a real redis-server, memmap directories). The last test case prints the matrix.
// Then every code example of the page.
#include <boost/test/framework.hpp>
#include <boost/test/results_collector.hpp>
#include <boost/test/tree/test_unit.hpp>
#include <boost/test/unit_test.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "conformance/zoo.hpp"
#include "tensordict/typed.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

// the seed's classes: MyTC (a, b) wraps backends as a TensorClass, State (x, y) as a TypedTensorDict
struct MyTC : TensorClass<MyTC> {
  TD_FIELDS(MyTC, TD_TENSOR(a), TD_TENSOR(b))
};
struct State : TypedTensorDict<State> {
  TD_FIELDS(State, TD_TENSOR(x), TD_TENSOR(y))
};
struct MyTTD : TypedTensorDict<MyTTD> {  // "TypedTensorDict as backend" of a TensorClass
  TD_FIELDS(MyTTD, TD_TENSOR(a), TD_TENSOR(b))
};
struct Replay : TypedTensorDict<Replay> {
  TD_FIELDS(Replay, TD_TENSOR(obs), TD_TENSOR(action), TD_TENSOR(reward))
};

enum class Backend { TensorDict, H5, Redis, Lazy, Memmap, Typed };

at::Tensor first_values() { return at::arange(12, at::kFloat).reshape({4, 3}); }
at::Tensor second_values() { return at::arange(20, at::kFloat).reshape({4, 5}) * 10; }

//! the backend, holding fields (n1 [4,3], n2 [4,5]) of batch [4]; `path` gets the memmap directory
TensorDict make_backend(Backend b, const std::string& n1, const std::string& n2, std::string* path) {
  TensorDict td({{n1, first_values()}, {n2, second_values()}}, {4});
  switch (b) {
    case Backend::TensorDict:
      return td;
    case Backend::H5:
      return PersistentTensorDict::from_dict(td, conformance::fresh_dir("compat") + ".h5");
    case Backend::Redis:
      return TensorDictStore::from_tensordict(td, conformance::redis());
    case Backend::Lazy: {
      std::vector<TensorDict> rows;
      for (int64_t i = 0; i < 4; ++i) rows.push_back(TensorDict({{n1, first_values()[i]}, {n2, second_values()[i]}}, {}));
      return lazy_stack(rows, 0);
    }
    case Backend::Memmap: {
      *path = conformance::fresh_dir("compat");
      return td.memmap_(*path);  // locked: writes go through set_() / update_()
    }
    case Backend::Typed:
      return MyTTD({{n1, first_values()}, {n2, second_values()}}, {4});
  }
  return td;
}

//! how a cell reads and writes its wrapper's fields
struct TcOps {
  using W = MyTC;
  static constexpr const char* f1 = "a";
  static constexpr const char* f2 = "b";
  static W wrap(const TensorDict& td) { return MyTC::from_tensordict(td); }
  static at::Tensor get1(const W& w) { return w.a(); }
  static at::Tensor get2(const W& w) { return w.b(); }
  static void set1(W& w, const at::Tensor& v) { w.set_a(v); }
  static void set1_inplace(W& w, const at::Tensor& v) { w.set_("a", v); }
  static void update(W& w, const TensorDict& other) { w.update(other); }
  static void update_inplace(W& w, const TensorDict& other) { w.update_(other); }
  static std::string type_name(const W& w) { return w.type_name(); }
  static const TensorDict& td(const W& w) { return w.tensordict(); }
};
struct TtdOps {
  using W = State;
  static constexpr const char* f1 = "x";
  static constexpr const char* f2 = "y";
  static W wrap(const TensorDict& td) { return State::from_tensordict(td); }
  static at::Tensor get1(const W& w) { return w.x(); }
  static at::Tensor get2(const W& w) { return w.y(); }
  static void set1(W& w, const at::Tensor& v) { w.set_x(v); }
  static void set1_inplace(W& w, const at::Tensor& v) { w.set_("x", v); }
  static void update(W& w, const TensorDict& other) { w.update(other); }
  static void update_inplace(W& w, const TensorDict& other) { w.update_(other); }
  static std::string type_name(const W& w) { return w.type_name(); }
  static const TensorDict& td(const W& w) { return w; }
};

bool same(const at::Tensor& a, const at::Tensor& b) { return a.defined() && b.defined() && a.equal(b); }

//! the backend's current value of `name`, read without the wrapper (memmap: reloaded from its directory)
at::Tensor backend_value(Backend b, const TensorDict& backend, const std::string& path, const std::string& name) {
  if (b == Backend::Memmap) return TensorDict::load_memmap(path).get(name);
  if (b == Backend::Lazy) {
    std::vector<at::Tensor> rows;
    for (const auto& m : LazyStackedTensorDict(backend).tensordicts()) rows.push_back(m.get(name));
    return at::stack(rows);
  }
  return backend.get(name);
}

template <class Ops>
void run_cell(Backend b, const std::string& op) {
  using W = typename Ops::W;
  std::string path;
  TensorDict backend = make_backend(b, Ops::f1, Ops::f2, &path);
  const bool memmap = b == Backend::Memmap;
  W w = Ops::wrap(backend);
  const std::string cls = W::schema()->name;
  if (op == "build") {
    BOOST_TEST(Ops::type_name(w) == cls);
    BOOST_TEST((Ops::td(w).batch_size() == BatchSize{4}));
    BOOST_TEST(Ops::td(w).node() == backend.node());  // a live wrap of the backend itself, no copy
    BOOST_TEST(W::is_instance(Ops::td(w)));
  } else if (op == "read") {
    BOOST_TEST(same(Ops::get1(w), first_values()));
    BOOST_TEST(same(Ops::get2(w), second_values()));
  } else if (op == "write") {
    at::Tensor v = first_values() + 100;
    if (memmap) {
      Ops::set1_inplace(w, v);  // the seed: set_() on memory-mapped TensorDicts
    } else {
      Ops::set1(w, v);
    }
    BOOST_TEST(same(backend_value(b, backend, path, Ops::f1), v));  // the write reached the backend
    BOOST_TEST(same(Ops::get1(w), v));
  } else if (op == "index") {
    W row = w.index({1});
    BOOST_TEST(Ops::type_name(row) == cls);
    BOOST_TEST((Ops::td(row).batch_size() == BatchSize{}));
    BOOST_TEST(same(Ops::get1(row), first_values()[1]));
    W part = w.index({Slice(1, 3)});
    BOOST_TEST(Ops::type_name(part) == cls);
    BOOST_TEST(same(Ops::get2(part), second_values().slice(0, 1, 3)));
  } else if (op == "clone") {
    W c = w.clone();
    BOOST_TEST(Ops::type_name(c) == cls);
    BOOST_TEST(same(Ops::get1(c), first_values()));
    Ops::set1(c, at::zeros({4, 3}));  // a copy: the backend keeps its values
    BOOST_TEST(same(backend_value(b, backend, path, Ops::f1), first_values()));
  } else if (op == "stack") {
    W s = W::stack({w, w}, 0);
    BOOST_TEST(Ops::type_name(s) == cls);
    BOOST_TEST((Ops::td(s).batch_size() == BatchSize{2, 4}));
    BOOST_TEST(same(Ops::get1(s)[1], first_values()));
  } else if (op == "iter") {
    int64_t n = 0;
    for (W row : w) {
      BOOST_TEST(Ops::type_name(row) == cls);
      BOOST_TEST(same(Ops::get2(row), second_values()[n]));
      ++n;
    }
    BOOST_TEST(n == 4);
  } else if (op == "update") {
    TensorDict other({{Ops::f1, first_values() * 2}}, {4});
    if (memmap) {
      Ops::update_inplace(w, other);  // the seed: update_() on memory-mapped TensorDicts
    } else {
      Ops::update(w, other);
    }
    BOOST_TEST(same(backend_value(b, backend, path, Ops::f1), first_values() * 2));
    BOOST_TEST(same(Ops::get2(w), second_values()));
  } else {
    BOOST_FAIL("unknown op " << op);
  }
}

const char* kOps[] = {"build", "read", "write", "index", "clone", "stack", "iter", "update"};
struct Row {
  const char* wrapper;
  const char* backend;
  const char* label;
};
const Row kRows[] = {
    {"tc", "td", "TensorClass / TensorDict"},        {"tc", "h5", "TensorClass / PersistentTensorDict (H5)"},
    {"tc", "redis", "TensorClass / TensorDictStore (Redis)"}, {"tc", "lazy", "TensorClass / LazyStackedTensorDict"},
    {"tc", "memmap", "TensorClass / TensorDict (memmap)"},    {"tc", "ttd", "TensorClass / TypedTensorDict"},
    {"ttd", "td", "TypedTensorDict / TensorDict"},   {"ttd", "h5", "TypedTensorDict / PersistentTensorDict (H5)"},
    {"ttd", "redis", "TypedTensorDict / TensorDictStore (Redis)"},
    {"ttd", "lazy", "TypedTensorDict / LazyStackedTensorDict"},
    {"ttd", "memmap", "TypedTensorDict / TensorDict (memmap)"},
};

}  // namespace

BOOST_AUTO_TEST_SUITE(compat_matrix)

#define TD_CELL(wrapper, ops, backend, be, op) \
  BOOST_AUTO_TEST_CASE(wrapper##_##backend##_##op) { run_cell<ops>(Backend::be, #op); }
#define TD_CELL_ROW(wrapper, ops, backend, be)   \
  TD_CELL(wrapper, ops, backend, be, build)      \
  TD_CELL(wrapper, ops, backend, be, read)       \
  TD_CELL(wrapper, ops, backend, be, write)      \
  TD_CELL(wrapper, ops, backend, be, index)      \
  TD_CELL(wrapper, ops, backend, be, clone)      \
  TD_CELL(wrapper, ops, backend, be, stack)      \
  TD_CELL(wrapper, ops, backend, be, iter)       \
  TD_CELL(wrapper, ops, backend, be, update)

TD_CELL_ROW(tc, TcOps, td, TensorDict)
TD_CELL_ROW(tc, TcOps, h5, H5)
TD_CELL_ROW(tc, TcOps, redis, Redis)
TD_CELL_ROW(tc, TcOps, lazy, Lazy)
TD_CELL_ROW(tc, TcOps, memmap, Memmap)
TD_CELL_ROW(tc, TcOps, ttd, Typed)
TD_CELL_ROW(ttd, TtdOps, td, TensorDict)
TD_CELL_ROW(ttd, TtdOps, h5, H5)
TD_CELL_ROW(ttd, TtdOps, redis, Redis)
TD_CELL_ROW(ttd, TtdOps, lazy, Lazy)
TD_CELL_ROW(ttd, TtdOps, memmap, Memmap)

// ================================================================================ the page's examples
BOOST_AUTO_TEST_SUITE(examples)

BOOST_AUTO_TEST_CASE(typed_tensordict_direct_construction_and_live_wrap) {
  State state({{"x", at::randn({4, 3})}, {"y", at::randn({4, 5})}}, {4});
  BOOST_TEST((state.x().sizes() == at::IntArrayRef{4, 3}));
  TensorDict td({{"x", at::randn({4, 3})}, {"y", at::randn({4, 5})}}, {4});
  State s2 = State::from_tensordict(td);
  BOOST_TEST((s2.x().sizes() == at::IntArrayRef{4, 3}));
  s2.set_x(at::ones({4, 3}));  // writes to td
  BOOST_TEST((td.get("x") == 1).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(builds_on_h5_from_h5_lazy_and_memmap) {
  TensorDict td({{"x", at::randn({4, 3})}, {"y", at::randn({4, 5})}}, {4});
  const std::string file = conformance::fresh_dir("example") + ".h5";
  PersistentTensorDict::from_dict(td, file).close();
  State h5 = State::from_tensordict(PersistentTensorDict::from_h5(file));
  BOOST_TEST((h5.x().sizes() == at::IntArrayRef{4, 3}));  // reads from HDF5
  std::vector<TensorDict> tds;
  for (int i = 0; i < 4; ++i) tds.push_back(TensorDict({{"x", at::randn({3})}, {"y", at::randn({5})}}, {}));
  State lazy = State::from_tensordict(lazy_stack(tds, 0));
  BOOST_TEST((lazy.index({0}).x().sizes() == at::IntArrayRef{3}));
  TensorDict mm = td.clone().memmap_(conformance::fresh_dir("example"));
  State smm = State::from_tensordict(mm);
  BOOST_TEST((smm.x().sizes() == at::IntArrayRef{4, 3}));
  smm.set_("x", at::ones({4, 3}));  // memmap TDs are locked: in-place operations
  BOOST_TEST((mm.get("x") == 1).all().item<bool>());
  BOOST_CHECK_THROW(smm.set("new", at::ones({4})), LockedError);
}

BOOST_AUTO_TEST_CASE(tensorclass_over_each_backend_reads_the_same) {
  TensorDict td({{"a", at::randn({4, 3})}, {"b", at::randn({4, 5})}}, {4});
  MyTC tc = MyTC::from_tensordict(td);
  BOOST_TEST((tc.a().sizes() == at::IntArrayRef{4, 3}));
  MyTC tc_h5 = MyTC::from_tensordict(PersistentTensorDict::from_dict(td, conformance::fresh_dir("example") + ".h5"));
  BOOST_TEST(tc_h5.a().equal(td.get("a")));
  MyTC tc_redis = MyTC::from_tensordict(TensorDictStore::from_tensordict(td, conformance::redis()));
  BOOST_TEST(tc_redis.a().equal(td.get("a")));
  std::vector<TensorDict> tds;
  for (int i = 0; i < 4; ++i) tds.push_back(TensorDict({{"a", at::randn({3})}, {"b", at::randn({5})}}, {}));
  MyTC tc_lazy = MyTC::from_tensordict(lazy_stack(tds, 0));
  BOOST_TEST((tc_lazy.index({0}).a().sizes() == at::IntArrayRef{3}));
  MyTC tc_mmap = MyTC::from_tensordict(td.clone().memmap_(conformance::fresh_dir("example")));
  tc_mmap.set_("a", at::ones({4, 3}));
  BOOST_TEST((tc_mmap.a() == 1).all().item<bool>());
  MyTTD ttd({{"a", at::randn({4, 3})}, {"b", at::randn({4, 5})}}, {4});
  MyTC tc_typed = MyTC::from_tensordict(ttd);
  BOOST_TEST((tc_typed.a().sizes() == at::IntArrayRef{4, 3}));
  // and back: TTD.from_tensordict(tc._tensordict)
  MyTTD back = MyTTD::from_tensordict(tc_typed.tensordict());
  BOOST_TEST(back.is_same(ttd));
  BOOST_TEST(back.type_name() == "MyTTD");
}

BOOST_AUTO_TEST_CASE(stacking_typed_tensordicts_preserves_the_type) {
  State s1({{"x", at::randn({3})}, {"y", at::randn({3})}}, {3});
  State s2({{"x", at::randn({3})}, {"y", at::randn({3})}}, {3});
  TensorDict stacked = stack({s1, s2}, 0);  // torch.stack
  BOOST_TEST((stacked.batch_size() == BatchSize{2, 3}));
  BOOST_TEST(State::is_instance(stacked));
  LazyStackedTensorDict ls({s1, s2}, 0);
  BOOST_TEST(State::is_instance(ls.index({0})));  // isinstance(ls[0], State)
}

BOOST_AUTO_TEST_CASE(redis_preallocate_then_fill) {
  const int64_t n = 32;
  TensorDictStore store = TensorDictStore::from_schema(
      {{"obs", {{84, 84, 3}, at::kByte}}, {"action", {{4}, at::kFloat}}, {"reward", {{}, at::kFloat}}}, {n},
      conformance::redis());
  Replay replay = Replay::from_tensordict(store);
  for (int64_t i = 0; i < 8; ++i) {  // each write goes directly to Redis
    replay.index_put_({i}, Replay({{"obs", at::full({84, 84, 3}, i, at::kByte)},
                                   {"action", at::full({4}, float(i))},
                                   {"reward", at::full({}, float(i) / 2)}},
                                  {}));
  }
  TensorDictStore again = TensorDictStore::from_store(store.td_id(), conformance::redis());
  Replay r = Replay::from_tensordict(again);
  BOOST_TEST(r.index({5}).obs().sum().item<int64_t>() == 5 * 84 * 84 * 3);
  BOOST_TEST(r.action()[7][0].item<float>() == 7.f);
  BOOST_TEST(r.reward()[3].item<float>() == 1.5f);
  BOOST_TEST(r.reward()[20].item<float>() == 0.f);  // zero-filled by the server
}

BOOST_AUTO_TEST_CASE(redis_empty_store_with_check_false) {
  TensorDictStore store(BatchSize{16}, conformance::redis());
  BOOST_CHECK_THROW(Replay::from_tensordict(store), TypeError);  // check=True: keys missing
  Replay replay = Replay::from_tensordict(store, /*check=*/false);
  BOOST_CHECK_THROW(replay.obs(), AttributeError);  // declared but not set
  // the first indexed write creates each key at the full batch size (SETRANGE)
  replay.index_put_({0}, Replay({{"obs", at::ones({84, 84, 3}, at::kByte)}, {"action", at::ones({4})},
                                 {"reward", at::ones({})}},
                                {}));
  replay.index_put_({1}, Replay({{"obs", at::full({84, 84, 3}, 2, at::kByte)}, {"action", at::full({4}, 2.f)},
                                 {"reward", at::full({}, 2.f)}},
                                {}));
  BOOST_TEST((replay.obs().sizes() == at::IntArrayRef{16, 84, 84, 3}));
  BOOST_TEST(replay.reward()[1].item<float>() == 2.f);
  BOOST_TEST(replay.action()[0].sum().item<float>() == 4.f);
  BOOST_TEST(replay.reward()[2].item<float>() == 0.f);
}

BOOST_AUTO_TEST_CASE(redis_records_the_tensorclass_path) {
  MyTC tc({{"a", at::randn({4, 3})}, {"b", at::randn({4, 5})}}, {4});
  TensorDictStore store = TensorDictStore::from_tensordict(tc.tensordict(), conformance::redis());
  BOOST_TEST(store.tensorclass() == "MyTC");  // TD_FIELDS: the C++ qualified name (TD_FIELDS_AT declares another)
  TensorDictStore again = TensorDictStore::from_store(store.td_id(), conformance::redis());
  BOOST_TEST(again.tensorclass() == MyTC::schema()->class_path);
  MyTC back = MyTC::from_tensordict(again);
  BOOST_TEST(back.a().equal(tc.a()));
  TensorDictStore plain = TensorDictStore::from_tensordict(tc.to_tensordict(), conformance::redis());
  BOOST_TEST(plain.tensorclass() == "");
}

BOOST_AUTO_TEST_SUITE_END()  // examples

// prints the 88 cells as they came out of this run (and writes them to <build>/compat_matrix.md)
BOOST_AUTO_TEST_CASE(print_matrix) {
  namespace ut = boost::unit_test;
  const ut::test_suite& suite =
      ut::framework::get<ut::test_suite>(ut::framework::current_test_case().p_parent_id);
  std::ostringstream os;
  os << "| wrapper / backend |";
  for (const char* op : kOps) os << " " << op << " |";
  os << "\n|---|";
  for (size_t i = 0; i < sizeof(kOps) / sizeof(kOps[0]); ++i) os << "---|";
  os << "\n";
  int passed = 0, total = 0;
  for (const Row& r : kRows) {
    os << "| " << r.label << " |";
    for (const char* op : kOps) {
      const std::string name = std::string(r.wrapper) + "_" + r.backend + "_" + op;
      ut::test_unit_id id = suite.get(name);
      std::string cell = "not run";
      if (id != ut::INV_TEST_UNIT_ID) {
        const ut::test_results& res = ut::results_collector.results(id);
        const bool ran = ut::framework::get(id, ut::TUT_CASE).is_enabled() && !res.p_skipped &&
                         res.p_assertions_passed + res.p_assertions_failed > 0;
        if (ran) cell = res.passed() ? "pass" : "FAIL";
      }
      passed += cell == "pass";
      ++total;
      os << " " << cell << " |";
    }
    os << "\n";
  }
  os << "\n" << passed << "/" << total << " cells pass\n";
  std::cout << "\nCompatibility matrix (seed compatibility.rst):\n" << os.str() << std::flush;
  std::ofstream(std::string(TD_BINARY_DIR) + "/compat_matrix.md") << os.str();
  BOOST_TEST(total == 88);
}

BOOST_AUTO_TEST_SUITE_END()  // compat_matrix
