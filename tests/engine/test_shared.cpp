// Shared memory: share_memory_() (lock, flags, /dev/shm segments, values, nested keys), memmap/shared
// exclusivity, handles across processes (fork + from_share_handle, a SIGKILLed opener leaks nothing),
// malformed handles, and from_schema (upstream test_misc.py::TestFromSchema) incl. sparse preallocation.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "fixtures.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/shm.hpp"
#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"
#include "process_util.hpp"
#include "tensordict/shared_storage.hpp"
#include "tensordict/memmap_storage.hpp"

using namespace tensordict;
namespace fs = std::filesystem;

namespace {

//! a unique segment prefix for one test case ("tdtest_<pid>_<tag>_"), restored on exit
struct ShmPrefix {
  std::string old;
  std::string prefix;
  explicit ShmPrefix(const std::string& tag) : old(tensordict::shm_prefix()) {
    prefix = "tdtest_" + std::to_string(::getpid()) + "_" + tag + "_";
    tensordict::set_shm_prefix(prefix);
  }
  ~ShmPrefix() { tensordict::set_shm_prefix(old); }
};

//! names in /dev/shm that start with `prefix`
std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    std::string n = e.path().filename().string();
    if (n.compare(0, prefix.size(), prefix) == 0) out.push_back(n);
  }
  return out;
}

using testutil::spawn;
using testutil::wait_child;

//! a batch-[4] TensorDict with a nested sub-TensorDict
TensorDict sample_td(int64_t seed = 1) {
  return TensorDict(Dict{{"a", zoo::randn({4, 3}, seed)},
                         {"b", zoo::randint({4}, seed + 1)},
                         {"nested", Dict{{"c", zoo::randn({4, 2}, seed + 2)}, {"d", zoo::randint({4, 2, 2}, seed + 3)}}}},
                    {4});
}

std::vector<NestedKey> leaf_keys(const TensorDict& td) {
  return td.keys(KeysOptions().include_nested(true).leaves_only(true).sort(true));
}

bool same_values(const TensorDict& a, const TensorDict& b) {
  auto ka = leaf_keys(a), kb = leaf_keys(b);
  if (ka != kb) return false;
  for (const auto& k : ka) {
    at::Tensor x = a.get(k), y = b.get(k);
    if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes() || !at::equal(x, y)) return false;
  }
  return true;
}

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

//! bytes allocated on disk for every regular file below dir
int64_t disk_bytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (e.is_regular_file() && ::stat(e.path().c_str(), &st) == 0) total += static_cast<int64_t>(st.st_blocks) * 512;
  }
  return total;
}

//! the schema used by the from_schema tests (nested keys included)
Schema rl_schema() {
  return Schema{{"obs", {{3, 4}, at::kFloat}},
                {"action", {{}, at::kLong}},
                {"done", {{1}, at::kBool}},
                {{"next", "obs"}, {{3, 4}, at::kFloat}},
                {{"next", "reward"}, {{}, at::kDouble}}};
}

void check_schema_td(const TensorDict& td, const BatchSize& bs) {
  auto full = [&](BatchSize e) { return zoo::cat_shape(bs, e); };
  BOOST_TEST(td.batch_size() == bs);
  struct Want {
    NestedKey key;
    BatchSize shape;
    at::ScalarType dtype;
  };
  std::vector<Want> want = {{"obs", full({3, 4}), at::kFloat},
                            {"action", full({}), at::kLong},
                            {"done", full({1}), at::kBool},
                            {{"next", "obs"}, full({3, 4}), at::kFloat},
                            {{"next", "reward"}, full({}), at::kDouble}};
  BOOST_TEST(leaf_keys(td).size() == want.size());
  for (const auto& w : want) {
    BOOST_TEST_CONTEXT(w.key.join(".")) {
      BOOST_TEST_REQUIRE(td.contains(w.key));
      at::Tensor t = td.get(w.key);
      BOOST_TEST(BatchSize(t.sizes().begin(), t.sizes().end()) == w.shape);
      BOOST_TEST(t.scalar_type() == w.dtype);
      BOOST_TEST((t.numel() == 0 || !t.ne(0).any().item<bool>()));  // zeros
    }
  }
  BOOST_TEST(td.get_td("next").batch_size() == bs);
}

//! the row written by the round-trip tests (upstream: td[0] = TensorDict(...))
TensorDict schema_row(double v) {
  return TensorDict(Dict{{"obs", at::full({3, 4}, v)},
                         {"action", at::full({}, static_cast<int64_t>(v), at::kLong)},
                         {"done", at::full({1}, v != 0, at::kBool)},
                         {"next", Dict{{"obs", at::full({3, 4}, -v)}, {"reward", at::full({}, v / 2, at::kDouble)}}}},
                    {});
}

void check_row(const TensorDict& td, int64_t i, double v) {
  BOOST_TEST(at::equal(td.get("obs")[i], at::full({3, 4}, v)));
  BOOST_TEST(td.get("action")[i].item<int64_t>() == static_cast<int64_t>(v));
  BOOST_TEST(td.get("done")[i].all().item<bool>() == (v != 0));
  BOOST_TEST(at::equal(td.get({"next", "obs"})[i], at::full({3, 4}, -v)));
  BOOST_TEST(td.get({"next", "reward"})[i].item<double>() == v / 2);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shared)

// ------------------------------------------------------------------------------------- share_memory_
BOOST_AUTO_TEST_CASE(share_memory_locks_flags_and_places_leaves_in_dev_shm) {
  ShmPrefix pfx("basic");
  TensorDict td = sample_td();
  TensorDict ref = td.clone();
  BOOST_TEST(!td.is_shared());
  BOOST_TEST(!td.is_locked());
  TensorDict& r = td.share_memory_();
  BOOST_TEST(&r == &td);
  BOOST_TEST(td.is_shared());
  BOOST_TEST(!td.is_memmap());
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.get_td("nested").is_shared());
  BOOST_TEST(td.get_td("nested").is_locked());
  BOOST_TEST(td.batch_size() == BatchSize{4});
  BOOST_TEST(td.get_td("nested").batch_size() == BatchSize{4});
  BOOST_TEST(same_values(td, ref));

  std::set<std::string> segs;
  for (const auto& k : leaf_keys(td)) {
    BOOST_TEST_CONTEXT(k.join(".")) {
      auto seg = backends::segment_of(td.get(k));
      BOOST_TEST_REQUIRE(seg != nullptr);
      BOOST_TEST(seg->name().compare(0, pfx.prefix.size(), pfx.prefix) == 0);
      BOOST_TEST(fs::exists("/dev/shm/" + seg->name()));
      BOOST_TEST(seg->owner());
      BOOST_TEST(backends::handle_of(td.get(k)).has_value());
      segs.insert(seg->name());
    }
  }
  BOOST_TEST(segs.size() == 1u);  // one segment per tree
  BOOST_TEST(shm_names(pfx.prefix).size() == 1u);

  // locked: structural changes raise, in-place writes work and land in shared memory
  BOOST_CHECK_THROW(td.set("new", at::zeros({4})), LockedError);
  BOOST_CHECK_THROW(td.set("a", at::zeros({4, 3})), LockedError);
  BOOST_CHECK_THROW(td.set({"nested", "e"}, at::zeros({4})), LockedError);
  at::Tensor a_before = td.get("a");
  td.set_("a", at::ones({4, 3}));
  BOOST_TEST(td.get("a").data_ptr() == a_before.data_ptr());
  BOOST_TEST(at::equal(td.get("a"), at::ones({4, 3})));
  td.set({"nested", "c"}, at::full({4, 2}, 3.0), SetOptions().inplace(true));
  BOOST_TEST(at::equal(td.get({"nested", "c"}), at::full({4, 2}, 3.0)));
  BOOST_TEST(backends::segment_of(td.get({"nested", "c"})) != nullptr);

  // idempotent
  td.share_memory_();
  BOOST_TEST(backends::segment_of(td.get("a")).get() == backends::segment_of(a_before).get());

  // the nested sub-TensorDict shares too: a handle of it is a tensor handle in the same segment
  auto h = backends::handle_of(td.get({"nested", "d"}));
  BOOST_TEST_REQUIRE(h.has_value());
  BOOST_TEST(h->dtype == at::kLong);
  BOOST_TEST(h->shape == (std::vector<int64_t>{4, 2, 2}));
}

BOOST_AUTO_TEST_CASE(share_memory_releases_segment_with_last_reference) {
  ShmPrefix pfx("release");
  {
    TensorDict td = sample_td(3);
    td.share_memory_();
    at::Tensor keep = td.get({"nested", "c"});
    BOOST_TEST(shm_names(pfx.prefix).size() == 1u);
    td = TensorDict();
    // a leaf still holds the segment (and its name)
    BOOST_TEST(shm_names(pfx.prefix).size() == 1u);
    BOOST_TEST(keep.sum().item<double>() == zoo::randn({4, 2}, 5).sum().item<double>());
  }
  BOOST_TEST(shm_names(pfx.prefix).empty());
}

BOOST_AUTO_TEST_CASE(share_memory_empty_and_unlock_semantics) {
  ShmPrefix pfx("empty");
  TensorDict empty(BatchSize{3});
  empty.share_memory_();
  BOOST_TEST(empty.is_shared());
  BOOST_TEST(empty.is_locked());
  BOOST_TEST(shm_names(pfx.prefix).empty());
  // upstream _propagate_unlock: unlocking clears is_shared
  TensorDict td = sample_td();
  td.share_memory_();
  td.unlock_();
  BOOST_TEST(!td.is_shared());
}

BOOST_AUTO_TEST_CASE(memmap_and_shared_are_mutually_exclusive) {
  ShmPrefix pfx("excl");
  fixtures::TempDir dir("shared-excl");
  TensorDict sh = sample_td();
  sh.share_memory_();
  BOOST_CHECK_THROW(sh.memmap_(dir / "x"), ValueError);
  BOOST_TEST(sh.is_shared());
  BOOST_TEST(!sh.is_memmap());

  TensorDict mm = sample_td();
  mm.memmap_(dir / "y");
  BOOST_CHECK_THROW(mm.share_memory_(), ValueError);
  BOOST_TEST(mm.is_memmap());
  BOOST_TEST(!mm.is_shared());
  BOOST_CHECK_THROW(share_handle(mm), ValueError);

  TensorDict loaded = TensorDict::load_memmap(dir / "y");
  BOOST_CHECK_THROW(loaded.share_memory_(), ValueError);

  // a plain TensorDict has no handle
  BOOST_CHECK_THROW(share_handle(sample_td()), ValueError);
}

// ------------------------------------------------------------------------------------- handles
BOOST_AUTO_TEST_CASE(index_put_rows_visible_through_second_handle) {
  ShmPrefix pfx("handle2");
  TensorDict td = sample_td();
  td.share_memory_();
  std::string handle = share_handle(td);
  TensorDict other = tensordict::from_share_handle(handle);
  BOOST_TEST(other.is_shared());
  BOOST_TEST(other.is_locked());
  BOOST_TEST(other.batch_size() == BatchSize{4});
  BOOST_TEST(other.get_td("nested").batch_size() == BatchSize{4});
  BOOST_TEST(same_values(td, other));
  BOOST_TEST(other.get("a").data_ptr() != td.get("a").data_ptr());  // a mapping of its own

  TensorDict row(Dict{{"a", at::full({3}, 7.0)},
                      {"b", at::full({}, 42, at::kLong)},
                      {"nested", Dict{{"c", at::full({2}, -1.0)}, {"d", at::full({2, 2}, 9, at::kLong)}}}},
                 {});
  td.index_put_({2}, row);
  BOOST_TEST(at::equal(other.get("a")[2], at::full({3}, 7.0)));
  BOOST_TEST(other.get("b")[2].item<int64_t>() == 42);
  BOOST_TEST(at::equal(other.get({"nested", "c"})[2], at::full({2}, -1.0)));
  BOOST_TEST(at::equal(other.get({"nested", "d"})[2], at::full({2, 2}, 9, at::kLong)));
  // and back: a slice write through the second handle
  other.index_put_({at::indexing::Slice(0, 2)}, row.expand({2}));
  BOOST_TEST(at::equal(td.get("a").slice(0, 0, 2), at::full({2, 3}, 7.0)));
  BOOST_TEST(same_values(td, other));
  // a missing key cannot be preallocated into a locked shared TensorDict
  TensorDict extra(Dict{{"zzz", at::ones({2})}}, {});
  BOOST_CHECK_THROW(td.index_put_({0}, extra), LockedError);
  // re-sharing the opened TensorDict gives a handle to the same segment
  BOOST_TEST(tensordict::from_share_handle(share_handle(other)).get("a").sum().item<double>() ==
             td.get("a").sum().item<double>());
}

BOOST_AUTO_TEST_CASE(forked_child_writes_rows_through_handle) {
  ShmPrefix pfx("fork");
  const int64_t n = 64;
  TensorDict td = TensorDict::from_schema(Schema{{"x", {{8}, at::kFloat}}, {{"sub", "y"}, {{}, at::kLong}}}, {n},
                                          "shared");
  std::string handle = share_handle(td);
  pid_t pid = spawn([&]() -> int {
    TensorDict c = tensordict::from_share_handle(handle);
    if (c.batch_size() != BatchSize{n}) return 2;
    for (int64_t i = 0; i < n; i += 2) {
      TensorDict row(Dict{{"x", at::full({8}, static_cast<double>(i))}, {"sub", Dict{{"y", at::full({}, i * 10, at::kLong)}}}},
                     {});
      c.index_put_({i}, row);
    }
    return 0;
  });
  BOOST_TEST(wait_child(pid) == 0);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      BOOST_TEST(at::equal(td.get("x")[i], at::full({8}, static_cast<double>(i))), "row " << i);
      BOOST_TEST(td.get({"sub", "y"})[i].item<int64_t>() == i * 10);
    } else {
      BOOST_TEST(td.get("x")[i].eq(0).all().item<bool>(), "row " << i);
      BOOST_TEST(td.get({"sub", "y"})[i].item<int64_t>() == 0);
    }
  }
  // the child never owned the name: it is still there
  BOOST_TEST(shm_names(pfx.prefix).size() == 1u);
}

BOOST_AUTO_TEST_CASE(forked_child_writes_through_inherited_mapping) {
  ShmPrefix pfx("inherit");
  TensorDict td = sample_td();
  td.share_memory_();
  pid_t pid = spawn([&]() -> int {
    td.set_at_("a", at::full({3}, 5.0), {1});
    td.index_put_({3}, TensorDict(Dict{{"a", at::full({3}, 6.0)}}, {}));
    return 0;
  });
  BOOST_TEST(wait_child(pid) == 0);
  BOOST_TEST(at::equal(td.get("a")[1], at::full({3}, 5.0)));
  BOOST_TEST(at::equal(td.get("a")[3], at::full({3}, 6.0)));
  BOOST_TEST(shm_names(pfx.prefix).size() == 1u);  // the child's exit unlinked nothing
}

BOOST_AUTO_TEST_CASE(sigkilled_opener_leaks_nothing) {
  ShmPrefix pfx("kill");
  {
    TensorDict td = sample_td(11);
    td.share_memory_();
    TensorDict ref = td.clone();
    std::string handle = share_handle(td);
    int ready[2];
    BOOST_REQUIRE(::pipe(ready) == 0);
    pid_t pid = spawn([&]() -> int {
      ::close(ready[0]);
      TensorDict c = tensordict::from_share_handle(handle);
      c.set_at_("b", at::full({}, 1234, at::kLong), {0});
      char ok = 'k';
      if (::write(ready[1], &ok, 1) != 1) return 3;
      for (;;) ::pause();  // holds the TensorDict open until killed
    });
    ::close(ready[1]);
    char c = 0;
    BOOST_TEST_REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    BOOST_TEST(::kill(pid, SIGKILL) == 0);
    BOOST_TEST(wait_child(pid) == -SIGKILL);
    // the parent's data: everything as before except the row the child wrote
    ref.set_at_("b", at::full({}, 1234, at::kLong), {0});
    BOOST_TEST(same_values(td, ref));
    td.set_("a", at::ones({4, 3}));  // still writable
    BOOST_TEST(td.get("a").sum().item<double>() == 12.0);
    BOOST_TEST(shm_names(pfx.prefix).size() == 1u);
  }
  BOOST_TEST(shm_names(pfx.prefix).empty());
  // the handle now names a gone segment
}

BOOST_AUTO_TEST_CASE(handle_of_released_tensordict_fails_to_open) {
  ShmPrefix pfx("gone");
  std::string handle;
  {
    TensorDict td = sample_td();
    td.share_memory_();
    handle = share_handle(td);
  }
  BOOST_CHECK_THROW(tensordict::from_share_handle(handle), BackendError);
}

BOOST_AUTO_TEST_CASE(malformed_handle_is_a_format_error) {
  ShmPrefix pfx("bad");
  TensorDict td = sample_td();
  td.share_memory_();
  const std::string good = share_handle(td);
  BOOST_REQUIRE(good.size() > 8);
  BOOST_CHECK_NO_THROW(tensordict::from_share_handle(good));
  BOOST_CHECK_THROW(tensordict::from_share_handle(""), FormatError);
  BOOST_CHECK_THROW(tensordict::from_share_handle("not a handle at all"), FormatError);
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  BOOST_CHECK_THROW(tensordict::from_share_handle(bad_magic), FormatError);
  std::string bad_version = good;
  bad_version[4] = 77;
  BOOST_CHECK_THROW(tensordict::from_share_handle(bad_version), FormatError);
  BOOST_CHECK_THROW(tensordict::from_share_handle(good + "extra"), FormatError);
  for (size_t cut : {size_t(4), size_t(6), good.size() / 2, good.size() - 1}) {
    BOOST_CHECK_THROW(tensordict::from_share_handle(good.substr(0, cut)), FormatError);
  }
  // a tensor handle is not a TensorDict handle
  std::string tensor_handle = backends::serialize(*backends::handle_of(td.get("a")));
  BOOST_CHECK_THROW(tensordict::from_share_handle(tensor_handle), FormatError);
}

// ------------------------------------------------------------------------------------- from_schema
// upstream test_misc.py::TestFromSchema (h5 lives in the api layer and is tested there)
BOOST_AUTO_TEST_CASE(from_schema_default_shapes_dtypes_zeros) {
  TensorDict td = TensorDict::from_schema(rl_schema(), {5, 2});
  check_schema_td(td, {5, 2});
  BOOST_TEST(!td.is_locked());
  BOOST_TEST(!td.is_shared());
  BOOST_TEST(!td.is_memmap());
  TensorDict none = TensorDict::from_schema(rl_schema(), {5, 2}, "none");
  check_schema_td(none, {5, 2});
  // ordinary memory: a new key can be added
  td.set("extra", at::zeros({5, 2}));
  BOOST_TEST(td.contains("extra"));
}

BOOST_AUTO_TEST_CASE(from_schema_no_batch_size) {
  ShmPrefix pfx("nobatch");
  fixtures::TempDir dir("schema-nobatch");
  check_schema_td(TensorDict::from_schema(rl_schema(), {}), {});
  check_schema_td(TensorDict::from_schema(rl_schema(), {}, "memmap", MemmapOptions().prefix(dir / "m")), {});
  check_schema_td(TensorDict::from_schema(rl_schema(), {}, "shared"), {});
  BOOST_CHECK_THROW(TensorDict::from_schema(rl_schema(), {-1}), BatchSizeError);
}

BOOST_AUTO_TEST_CASE(from_schema_memmap_shapes_dtypes_zeros) {
  fixtures::TempDir dir("schema-mm");
  const std::string prefix = dir / "buf";
  TensorDict td = TensorDict::from_schema(rl_schema(), {6}, "memmap", MemmapOptions().prefix(prefix));
  check_schema_td(td, {6});
  BOOST_TEST(td.is_memmap());
  BOOST_TEST(!td.is_shared());
  BOOST_TEST(td.is_locked());
  BOOST_TEST(memmap_prefix(td) == prefix);
  BOOST_TEST(fs::exists(prefix + "/meta.json"));
  BOOST_TEST(fs::exists(prefix + "/obs.memmap"));
  BOOST_TEST(fs::exists(prefix + "/next/meta.json"));
  BOOST_TEST(fs::file_size(prefix + "/obs.memmap") == 6u * 12 * 4);
  TensorDict loaded = TensorDict::load_memmap(prefix);
  check_schema_td(loaded, {6});
  // leaves are real (not stride-0 expanded) storage: a write to one row stays in that row
  td.set_at_("obs", at::ones({3, 4}), {1});
  BOOST_TEST(td.get("obs").sum().item<double>() == 12.0);
  // upstream kwargs default: a memmap without a directory is not allowed here (anonymous memmap: memmap_like(""))
  BOOST_CHECK_THROW(TensorDict::from_schema(rl_schema(), {6}, "memmap"), ValueError);
}

BOOST_AUTO_TEST_CASE(from_schema_memmap_over_existing_prefix_is_zeroed) {
  fixtures::TempDir dir("schema-mm2");
  const std::string prefix = dir / "buf";
  {
    TensorDict td = TensorDict::from_schema(rl_schema(), {6}, "memmap", MemmapOptions().prefix(prefix));
    td.index_put_({0}, schema_row(3));
  }
  // C++ decision (upstream-formats §5): re-preallocating truncates, so the buffer reads as zeros again
  TensorDict again = TensorDict::from_schema(rl_schema(), {6}, "memmap", MemmapOptions().prefix(prefix));
  check_schema_td(again, {6});
}

BOOST_AUTO_TEST_CASE(from_schema_shared_shapes_dtypes_zeros) {
  ShmPrefix pfx("schema");
  TensorDict td = TensorDict::from_schema(rl_schema(), {5, 2}, "shared");
  check_schema_td(td, {5, 2});
  BOOST_TEST(td.is_shared());
  BOOST_TEST(!td.is_memmap());
  BOOST_TEST(td.is_locked());
  BOOST_TEST(td.get_td("next").is_shared());
  for (const auto& k : leaf_keys(td)) BOOST_TEST(backends::segment_of(td.get(k)) != nullptr, k.join("."));
  BOOST_TEST(shm_names(pfx.prefix).size() == 1u);
  BOOST_CHECK_THROW(td.set("new", at::zeros({5, 2})), LockedError);
}

BOOST_AUTO_TEST_CASE(from_schema_setitem_round_trip_default) {
  TensorDict td = TensorDict::from_schema(rl_schema(), {4});
  td.index_put_({0}, schema_row(2));
  check_row(td, 0, 2);
  TensorDict row = td.index({0});
  BOOST_TEST(row.batch_size() == BatchSize{});
  BOOST_TEST(same_values(row, schema_row(2)));
  for (int64_t i = 1; i < 4; ++i) BOOST_TEST(same_values(td.index({i}), schema_row(0)));
}

BOOST_AUTO_TEST_CASE(from_schema_setitem_round_trip_memmap) {
  fixtures::TempDir dir("schema-mm-rt");
  TensorDict td = TensorDict::from_schema(rl_schema(), {4}, "memmap", MemmapOptions().prefix(dir / "b"));
  at::Tensor obs = td.get("obs");
  td.index_put_({0}, schema_row(2));
  td.index_put_({-1}, schema_row(5));
  BOOST_TEST(td.get("obs").data_ptr() == obs.data_ptr());  // in place
  check_row(td, 0, 2);
  check_row(td, 3, 5);
  BOOST_TEST(same_values(td.index({0}), schema_row(2)));
  TensorDict loaded = TensorDict::load_memmap(dir / "b");
  check_row(loaded, 0, 2);
  check_row(loaded, 3, 5);
  BOOST_TEST(same_values(loaded.index({1}), schema_row(0)));
}

BOOST_AUTO_TEST_CASE(from_schema_setitem_round_trip_shared) {
  ShmPrefix pfx("schema_rt");
  TensorDict td = TensorDict::from_schema(rl_schema(), {4}, "shared");
  td.index_put_({0}, schema_row(2));
  check_row(td, 0, 2);
  BOOST_TEST(same_values(td.index({0}), schema_row(2)));
  TensorDict other = tensordict::from_share_handle(share_handle(td));
  check_row(other, 0, 2);
  BOOST_TEST(same_values(other.index({2}), schema_row(0)));
}

BOOST_AUTO_TEST_CASE(from_schema_unknown_storage_lists_valid_ones) {
  try {
    TensorDict::from_schema(rl_schema(), {4}, "foobar");
    BOOST_FAIL("expected ValueError");
  } catch (const ValueError& e) {
    std::string msg = e.what();
    BOOST_TEST(msg.find("foobar") != std::string::npos, msg);
    for (const char* s : {"none", "memmap", "shared"}) BOOST_TEST(msg.find(s) != std::string::npos, msg << " lacks " << s);
  }
}

BOOST_AUTO_TEST_CASE(from_schema_nested_keys) {
  ShmPrefix pfx("schema_nested");
  fixtures::TempDir dir("schema-nested");
  Schema deep{{{"a", "b", "c"}, {{2}, at::kInt}}, {{"a", "x"}, {{}, at::kHalf}}, {"top", {{}, at::kFloat}}};
  for (const std::string storage : {"", "memmap", "shared"}) {
    BOOST_TEST_CONTEXT("storage '" << storage << "'") {
      TensorDict td = TensorDict::from_schema(deep, {3}, storage, MemmapOptions().prefix(dir / ("d" + storage)));
      BOOST_TEST(td.get_td("a").batch_size() == BatchSize{3});
      BOOST_TEST(td.get_td({"a", "b"}).batch_size() == BatchSize{3});
      BOOST_TEST(td.get({"a", "b", "c"}).sizes() == at::IntArrayRef({3, 2}));
      BOOST_TEST(td.get({"a", "b", "c"}).scalar_type() == at::kInt);
      BOOST_TEST(td.get({"a", "x"}).scalar_type() == at::kHalf);
      BOOST_TEST(leaf_keys(td).size() == 3u);
      BOOST_TEST(td.get_td({"a", "b"}).is_shared() == (storage == "shared"));
      BOOST_TEST(td.get_td({"a", "b"}).is_memmap() == (storage == "memmap"));
      td.index_put_({1}, TensorDict(Dict{{"a", Dict{{"b", Dict{{"c", at::full({2}, 4, at::kInt)}}}}}}, {}));
      BOOST_TEST(at::equal(td.get({"a", "b", "c"})[1], at::full({2}, 4, at::kInt)));
      BOOST_TEST(td.get({"a", "b", "c"})[0].eq(0).all().item<bool>());
    }
  }
  TensorDict loaded = TensorDict::load_memmap(dir / "dmemmap");
  BOOST_TEST(at::equal(loaded.get({"a", "b", "c"})[1], at::full({2}, 4, at::kInt)));
}

BOOST_AUTO_TEST_CASE(from_schema_big_memmap_is_sparse) {
  fixtures::TempDir dir("schema-big");
  const int64_t rows = 512 * 1024;                // 512Ki rows x 1024 f32 = 2 GiB
  const int64_t nbytes = rows * 1024 * 4;
  Schema s{{"obs", {{1024}, at::kFloat}}, {{"next", "reward"}, {{}, at::kFloat}}};
  const int64_t rss0 = rss_bytes();
  TensorDict td = TensorDict::from_schema(s, {rows}, "memmap", MemmapOptions().prefix(dir / "big"));
  const int64_t rss1 = rss_bytes();
  const int64_t disk = disk_bytes(dir.path);
  BOOST_TEST_MESSAGE("2 GiB from_schema: RSS growth " << (rss1 - rss0) << " B, disk " << disk << " B");
  BOOST_TEST(td.get("obs").sizes() == at::IntArrayRef({rows, 1024}));
  BOOST_TEST(fs::file_size(dir / "big/obs.memmap") == static_cast<uintmax_t>(nbytes));
  BOOST_TEST(rss1 - rss0 < 64 * 1024 * 1024);  // << 2 GiB
  BOOST_TEST(disk < 1024 * 1024);              // sparse
  // one row in the middle: only its pages become real
  const int64_t mid = rows / 2 + 7;
  td.index_put_({mid}, TensorDict(Dict{{"obs", at::full({1024}, 1.5)}, {"next", Dict{{"reward", at::full({}, 2.0)}}}}, {}));
  BOOST_TEST(at::equal(td.get("obs")[mid], at::full({1024}, 1.5)));
  BOOST_TEST(td.get("obs")[mid - 1].eq(0).all().item<bool>());
  BOOST_TEST(rss_bytes() - rss0 < 64 * 1024 * 1024);
  backends::flush(td.get("obs"));
  BOOST_TEST(disk_bytes(dir.path) < 1024 * 1024);
}

BOOST_AUTO_TEST_SUITE_END()
