// Storage-spec round trip (issue 34, item 6; TensorStore's TestTensorStoreDriverSpecRoundtrip): for every
// storage with a spec (memmap, shared memory, a Store-backed TensorDict, HDF5 file / group / view, Redis store /
// view, typed wrappers and a TensorClass over them, lazy stacks of storage members) the spec of the whole
// TensorDict AND of views of it (slices, index lists, ints, a view of a view, a mask over two dims) is opened
// in ANOTHER process (this executable run again, fresh: the actor system cannot be forked), which writes the
// keys, batch size and values it sees to a file; the test compares them with the view in this process.
// The child runs before any test (a global fixture that finds its environment variables) and asserts nothing.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"
#include "process_util.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

constexpr const char* kSpecsEnv = "TD_SPEC_ROUNDTRIP_SPECS";  // the file of specs, one per line
constexpr const char* kOutEnv = "TD_SPEC_ROUNDTRIP_OUT";      // where the child writes what it opened

struct ZooClass : TensorClass<ZooClass> {
  TD_FIELDS(ZooClass, TD_TENSOR(a), TD_TENSOR(b), TD_TENSOR(c))
};

//! what a TensorDict holds, as text: batch size, then every leaf (sorted) with dtype, shape and values
std::string dump(const TensorDict& td) {
  std::ostringstream out;
  out << "batch";
  for (auto b : td.batch_size()) out << ' ' << b;
  out << '\n';
  std::vector<std::pair<std::string, NestedKey>> keys;
  for (const auto& k : td.keys(KeysOptions().include_nested(true).leaves_only(true))) keys.emplace_back(k.join("."), k);
  std::sort(keys.begin(), keys.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (const auto& [k, key] : keys) {
    const Entry e = td.get_entry(key);
    if (!e.is_tensor()) {
      out << k << " non-tensor\n";
      continue;
    }
    const at::Tensor t = e.tensor().contiguous();
    out << k << ' ' << c10::toString(t.scalar_type()) << " [";
    for (auto s : t.sizes()) out << ' ' << s;
    out << " ]";
    const at::Tensor d = t.to(at::kDouble).reshape({-1}).contiguous();
    const double* p = d.data_ptr<double>();
    char buf[32];
    for (int64_t i = 0; i < d.numel(); ++i) {
      std::snprintf(buf, sizeof buf, " %.17g", p[i]);
      out << buf;
    }
    out << '\n';
  }
  return out.str();
}

constexpr const char* kSeparator = "----\n";

//! the child: opens every spec of the file (read-only) and dumps it; "error: <what>" for one that fails
struct ChildMode {
  ChildMode() {
    const char* specs = std::getenv(kSpecsEnv);
    const char* out_path = std::getenv(kOutEnv);
    if (!specs || !out_path) return;
    int rc = 0;
    std::ostringstream out;
    try {
      std::ifstream in(specs);
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
          out << dump(open_storage(StorageSpec::parse(line), OpenOptions().writable(false)));
        } catch (const std::exception& e) {
          out << "error: " << e.what() << '\n';
        }
        out << kSeparator;
      }
    } catch (...) {
      rc = 3;
    }
    std::ofstream(out_path) << out.str();
    std::exit(rc);  // the default engine stops at exit; no test runs in the child
  }
};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(ChildMode);

namespace {

using View = std::pair<std::string, std::function<TensorDict(const TensorDict&)>>;

//! a view by one index
View by(std::string name, Index index) {
  return {std::move(name), [index](const TensorDict& td) { return td.index(index); }};
}

//! the storage and the views of it to reopen
struct Case {
  std::string name;
  TensorDict td;
  std::vector<View> views;
};

//! the views every storage of batch [4, 3, 2, 1] is reopened as
std::vector<View> views_4321() {
  at::Tensor mask = at::zeros({4, 3}, at::kBool);
  mask.index_put_({1, 2}, true);
  mask.index_put_({3, 0}, true);
  mask.index_put_({0, 1}, true);
  return {{"whole", [](const TensorDict& td) { return td; }},
          by("[1:3]", {Slice(1, 3)}),
          by("[::2]", {Slice(0, 4, 2)}),
          by("[[2, 0, 3]]", {at::tensor({2, 0, 3}, at::kLong)}),
          by("[2]", {2}),
          by("[:, 1]", {Slice(), 1}),
          {"[1:4][:, [2, 0]][1] (a view of a view of a view)",
           [](const TensorDict& td) {
             return td.index({Slice(1, 4)}).index({Slice(), at::tensor({2, 0}, at::kLong)}).index({1});
           }},
          by("mask over 2 dims", {mask})};
}

//! writes the specs, runs the child (this executable, fresh), returns its dumps (one per spec) or the reason
std::vector<std::string> open_in_child(const std::vector<std::string>& specs, std::string* failure) {
  fixtures::TempDir dir("spec_roundtrip");
  const std::string in = dir / "specs.txt", out = dir / "out.txt";
  {
    std::ofstream f(in);
    for (const auto& s : specs) f << s << '\n';
  }
  // argv and environment built before fork: the child only execs
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  BOOST_REQUIRE(n > 0);
  exe[n] = '\0';
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.push_back(std::string(kSpecsEnv) + "=" + in);
  env_s.push_back(std::string(kOutEnv) + "=" + out);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = exe;
  char* argv[] = {arg0.data(), nullptr};
  const pid_t pid = testutil::spawn([&]() -> int {
    ::execve(argv[0], argv, envp.data());
    return 97;
  });
  const int rc = testutil::wait_child(pid);
  if (rc != 0) {
    *failure = "the child " + testutil::describe_child(rc);
    return {};
  }
  std::vector<std::string> dumps;
  const std::string text = testutil::read_text(out);
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(kSeparator, at);
    if (end == std::string::npos) break;
    dumps.push_back(text.substr(at, end - at));
    at = end + std::string(kSeparator).size();
  }
  return dumps;
}

//! every view of the case: its spec here, the same keys, batch and values in another process
void roundtrip(const Case& c) {
  std::vector<std::string> specs, expected, names;
  for (const auto& v : c.views) {
    BOOST_TEST_CONTEXT(c.name << v.first) {
      const TensorDict view = v.second(c.td);
      std::string spec;
      try {
        spec = StorageSpec::of(view).dump();
      } catch (const std::exception& e) {
        BOOST_ERROR("no spec for " << c.name << v.first << ": " << e.what());
        continue;
      }

      specs.push_back(spec);
      expected.push_back(dump(view));
      names.push_back(v.first + " -> " + spec.substr(0, 300));
    }
  }
  std::string failure;
  const std::vector<std::string> got = open_in_child(specs, &failure);
  BOOST_TEST_CONTEXT(c.name) {
    BOOST_TEST(failure.empty(), failure);
    BOOST_REQUIRE_EQUAL(got.size(), specs.size());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    BOOST_TEST_CONTEXT(c.name << " " << names[i]) { BOOST_TEST(got[i] == expected[i]); }
  }
}

const BatchSize kBatch{4, 3, 2, 1};

//! the spec's "index" as JSON text, "<none>" without one
std::string index_text(const StorageSpec& spec) {
  const JsonValue* i = spec.json().find("index");
  return i ? i->dump() : "<none>";
}

//! an HDF5 file of data, opened read-only (another process may open it too)
TensorDict h5_of(const TensorDict& data, const std::string& tag) {
  const std::string path = conformance::fresh_dir(tag) + ".h5";
  PersistentTensorDict::from_dict(data, path).close();
  return PersistentTensorDict::from_h5(path, "r");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(spec_roundtrip)

BOOST_AUTO_TEST_CASE(memmap_shared_and_store) {
  roundtrip({"memmap", zoo::plain(kBatch, 31).memmap(conformance::fresh_dir("rt_mm")), views_4321()});
  TensorDict sh = zoo::plain(kBatch, 33);
  sh.share_memory_();
  roundtrip({"shared", sh, views_4321()});
  TensorDict buf = zoo::plain(kBatch, 35).memmap(conformance::fresh_dir("rt_store"));
  Store store = Store::open(buf);
  roundtrip({"store", store.tensordict(), views_4321()});
}

BOOST_AUTO_TEST_CASE(h5_file_group_and_view) {
  roundtrip({"h5", h5_of(zoo::plain(kBatch, 101), "rt_h5"), views_4321()});
  TensorDict outer(kBatch);
  outer.set("grp", zoo::plain(kBatch, 103));
  roundtrip({"h5 group", h5_of(outer, "rt_h5g").get_entry("grp").tensordict(), views_4321()});
  TensorDict v = h5_of(zoo::plain({6, 3, 2, 1}, 105), "rt_h5v").index({Slice(1, 5)});
  roundtrip({"h5 view", v, views_4321()});
}

BOOST_AUTO_TEST_CASE(redis_store_and_view) {
  roundtrip({"redis", TensorDictStore::from_tensordict(zoo::plain(kBatch, 111), conformance::redis()), views_4321()});
  TensorDict v = TensorDictStore::from_tensordict(zoo::plain({6, 3, 2, 1}, 115), conformance::redis()).index({Slice(1, 5)});
  roundtrip({"redis view", v, views_4321()});
  // a nested level of a Redis store has no spec of its own (the root's only): a clear error, not a wrong spec
  TensorDict outer(kBatch);
  outer.set("grp", zoo::plain(kBatch, 113));
  TensorDict nested = TensorDictStore::from_tensordict(outer, conformance::redis()).get_entry("grp").tensordict();
  BOOST_CHECK_THROW(StorageSpec::of(nested), ValueError);
}

BOOST_AUTO_TEST_CASE(typed_and_tensorclass) {
  TensorDict mm = zoo::plain(kBatch, 121).memmap(conformance::fresh_dir("rt_typed"));
  roundtrip({"typed memmap", conformance::ZooTyped::from_tensordict(mm), views_4321()});
  roundtrip({"typed h5", conformance::ZooTyped::from_tensordict(h5_of(zoo::plain(kBatch, 123), "rt_typed_h5")), views_4321()});
  // a TensorClass wraps its TensorDict: a view of the class is a view of that TensorDict
  ZooClass tc = ZooClass::from_tensordict(zoo::plain(kBatch, 125).memmap(conformance::fresh_dir("rt_tc")));
  roundtrip({"tensorclass memmap", tc.tensordict(), views_4321()});
  BOOST_TEST(StorageSpec::of(tc.index({Slice(1, 3)}).tensordict()).dump() ==
             StorageSpec::of(tc.tensordict().index({Slice(1, 3)})).dump());
}

BOOST_AUTO_TEST_CASE(lazy_stacks_of_storage_members) {
  // members of batch [3, 2, 1] in four storages, stacked along dim 0 ([4, 3, 2, 1]) and dim 2 ([3, 2, 4, 1])
  std::vector<TensorDict> members;
  members.push_back(zoo::plain({3, 2, 1}, 140).memmap(conformance::fresh_dir("rt_lazy")));
  TensorDict sh = zoo::plain({3, 2, 1}, 141);
  sh.share_memory_();
  members.push_back(sh);
  members.push_back(h5_of(zoo::plain({3, 2, 1}, 142), "rt_lazy_h5"));
  members.push_back(TensorDictStore::from_tensordict(zoo::plain({3, 2, 1}, 143), conformance::redis()));
  // (a mask over the stack dim and the next gathers the members' rows into memory: no spec, not tested here)
  std::vector<View> stack_views = views_4321();
  stack_views.pop_back();
  roundtrip({"lazy stack dim 0", lazy_stack(members, 0), stack_views});
  roundtrip({"lazy stack dim 2",
             lazy_stack(members, 2),
             {by("[1]", {1}), by("[:, :, 1:3]", {Slice(), Slice(), Slice(1, 3)}), by("[0:2]", {Slice(0, 2)})}});
  // a stack of views: each member's spec carries its own index
  std::vector<TensorDict> views;
  for (const auto& m : members) views.push_back(m.index({Slice(1, 3)}));
  roundtrip({"lazy stack of views", lazy_stack(views, 0), {by("whole", {}), by("[1:3]", {Slice(1, 3)})}});
  // a member another process cannot reach: ValueError naming it
  std::vector<TensorDict> with_memory = members;
  with_memory.push_back(zoo::plain({3, 2, 1}, 144));
  BOOST_TEST(zoo::message_of<ValueError>([&] { StorageSpec::of(lazy_stack(with_memory, 0)); }).find("member 4") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(views_keep_their_origin_until_a_non_batch_op) {
  TensorDict mm = zoo::plain(kBatch, 150).memmap(conformance::fresh_dir("rt_origin"));
  TensorDict view = mm.index({Slice(1, 4)}).index({at::tensor({2, 0}, at::kLong)});
  StorageSpec spec = StorageSpec::of(view);
  // composed: rows 3 and 1 of the directory, as a list over dim 0
  BOOST_TEST(index_text(spec) == "[[3,1]]");
  BOOST_TEST(open_storage(spec).equal(view));
  // in memory after clone / apply / to: no spec
  BOOST_CHECK_THROW(StorageSpec::of(mm.index({Slice(1, 3)}).clone()), ValueError);
  BOOST_CHECK_THROW(StorageSpec::of(mm.index({Slice(1, 3)}).apply([](const at::Tensor& t) { return t + 1; })),
                    ValueError);
  BOOST_CHECK_THROW(StorageSpec::of(mm.index({Slice(1, 3)}).to(at::Device("cpu"))), ValueError);
  // the encodings: a slice, an int, a joint selection
  BOOST_TEST(index_text(StorageSpec::of(mm.index({Slice(1, 3)}))) ==
             R"([{"start":1,"stop":3,"step":1}])");
  BOOST_TEST(index_text(StorageSpec::of(mm.index({Slice(), 2}))) ==
             R"([{"start":0,"stop":4,"step":1},2])");
  at::Tensor mask = at::zeros({4, 3}, at::kBool);
  mask.index_put_({1, 2}, true);
  mask.index_put_({3, 0}, true);
  BOOST_TEST(index_text(StorageSpec::of(mm.index({mask}))) ==
             R"({"shape":[2,2,1],"coords":[[1,1,3,3],[2,2,0,0],[0,1,0,1],[0,0,0,0]]})");
}

BOOST_AUTO_TEST_CASE(malformed_index_is_a_value_error_at_parse) {
  for (const char* bad : {R"({"driver":"memmap","path":"x","index":3})",
                          R"({"driver":"memmap","path":"x","index":["a"]})",
                          R"({"driver":"memmap","path":"x","index":[{"start":1}]})",
                          R"({"driver":"memmap","path":"x","index":[{"start":1,"stop":2,"step":0}]})",
                          R"({"driver":"memmap","path":"x","index":[[1,2.5]]})",
                          R"({"driver":"memmap","path":"x","index":{"shape":[2],"coords":[[1]]}})",
                          R"({"driver":"memmap","path":"x","index":{"shape":[2]}})",
                          R"({"driver":"stack","dim":0})",
                          R"({"driver":"stack","dim":0,"members":[{"path":"x"}]})",
                          R"({"driver":"stack","dim":0,"members":[{"driver":"memmap","index":"all"}]})"}) {
    BOOST_TEST_CONTEXT(bad) { BOOST_CHECK_THROW(StorageSpec::parse(bad), ValueError); }
  }
  // well-formed but out of range: the index error at open, nothing opened half
  TensorDict mm = zoo::plain(kBatch, 160).memmap(conformance::fresh_dir("rt_bad"));
  StorageSpec far = StorageSpec::parse(R"({"driver":"memmap","path":")" + memmap_prefix(mm) + R"(","index":[9]})");
  BOOST_CHECK_THROW(open_storage(far), IndexError);
}

BOOST_AUTO_TEST_SUITE_END()
