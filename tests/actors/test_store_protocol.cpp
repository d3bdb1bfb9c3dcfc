// The store protocol under hostile requests (issue 14, "fuzzing store protocol messages"): a seeded generator
// sends thousands of store_requests — unknown ops, empty / reserved / path-like / overlong / non-UTF-8 keys,
// unknown dtypes, negative, overflowing and mismatched shapes — to a memmap and a shared-memory store actor the way
// another process's client does (store_request_blocking: the inspectable, remote path). Each request must get a
// response or a typed tensordict::Error; the store must keep serving; afterwards the directory still loads,
// holds exactly the keys the store reports, and nothing was written outside it. Deterministic (fixed seed).
#include <cstdint>
#include <filesystem>
#include <random>
#include <set>

#include <boost/test/unit_test.hpp>

#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/actors/store_client.hpp"
#include "tensordict/backends/json_value.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;
namespace fs = std::filesystem;

namespace {

struct Outcome {
  int ok = 0, typed = 0;
  std::vector<std::string> untyped;  // what() of anything that is not a tensordict::Error
};

actors::store_request random_request(std::mt19937_64& rng, int64_t batch) {
  static const std::vector<std::string> parts = {
      "", ".", "..", "a", "b", "x/y", "../up", "%2E%2E", "meta.json", "shape", "device", "_type", "obs",
      std::string(300, 'k'), "\xff\xfe", "a b", "\n", "nested", std::string(1, '\0') + "z"};
  static const std::vector<std::string> dtypes = {"torch.float32", "torch.int64", "torch.bool", "torch.uint8",
                                                  "torch.bfloat16", "torch.complex64", "float32", "", "torch.",
                                                  "torch.float32 ", "torch.uint16", "torch.qint8"};
  static const std::vector<int64_t> dims = {0, 1, 3, 8, -1, -5, int64_t{1} << 62, INT64_MAX, INT64_MIN};
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  actors::store_request r;
  r.op = static_cast<int32_t>(pick(11)) - 2;  // -2 .. 8: below, inside and above the enum
  const size_t nkey = pick(4);
  for (size_t i = 0; i < nkey; ++i) r.key.push_back(parts[pick(parts.size())]);
  r.dtype = dtypes[pick(dtypes.size())];
  if (pick(10) < 7) r.shape.push_back(batch);  // mostly well-led shapes, so the deeper checks are reached
  const size_t ndim = pick(4);
  for (size_t i = 0; i < ndim; ++i) r.shape.push_back(pick(3) == 0 ? dims[pick(dims.size())] : static_cast<int64_t>(pick(5)));
  return r;
}

Outcome hammer(actors::Runtime& rt, const caf::actor& store, int n, uint64_t seed, int64_t batch) {
  Outcome o;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    const actors::store_request req = random_request(rng, batch);
    try {
      actors::store_request_blocking(rt.system(), store, req, std::chrono::seconds(30));
      ++o.ok;
    } catch (const Error&) {
      ++o.typed;
    } catch (const std::exception& e) {
      o.untyped.push_back(e.what());
    }
  }
  return o;
}

std::set<std::string> leaf_keys(const TensorDict& td) {
  std::set<std::string> out;
  for (const auto& k : td.keys(KeysOptions().include_nested(true).leaves_only(true))) out.insert(k.repr());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(store_protocol)

BOOST_AUTO_TEST_CASE(hostile_requests_to_a_memmap_store) {
  const fs::path base = fs::path(TD_BINARY_DIR) / "test-tmp" / "store-protocol";
  fs::remove_all(base);
  fs::create_directories(base);
  const std::string prefix = (base / "buf").string();
  TensorDict td(BatchSize{16});
  td.set("obs", at::arange(16 * 4, at::kFloat).view({16, 4}));
  td.set(NestedKey{"nested", "x"}, at::zeros({16, 2}));
  td.memmap_(prefix);
  auto rt = actors::Runtime::start(Config::load());
  auto client = actors::StoreClient::open_dense(rt, actors::make_memmap_store(td));
  const Outcome o = hammer(*rt, client->actor(), 3000, 20261125, 16);
  BOOST_TEST_MESSAGE("memmap store: " << o.ok << " accepted, " << o.typed << " typed errors");
  BOOST_TEST(o.untyped.empty(), (o.untyped.empty() ? "" : o.untyped.front()));
  BOOST_TEST(o.ok > 0);
  BOOST_TEST(o.typed > 0);
  // the store still serves, and its directory holds what it reports
  actors::store_request info;
  info.op = static_cast<int32_t>(actors::StoreOp::Info);
  BOOST_CHECK_NO_THROW(actors::store_request_blocking(rt->system(), client->actor(), info, std::chrono::seconds(30)));
  const TensorDict snap = client->snapshot();
  TensorDict back;
  BOOST_REQUIRE_NO_THROW(back = TensorDict::load_memmap(prefix));
  BOOST_TEST(leaf_keys(back) == leaf_keys(snap));
  BOOST_TEST(back.get("obs").equal(at::arange(16 * 4, at::kFloat).view({16, 4})));
  // nothing outside the store's directory
  std::vector<std::string> beside;
  for (const auto& de : fs::directory_iterator(base)) beside.push_back(de.path().filename().string());
  BOOST_TEST(beside == std::vector<std::string>({"buf"}));
  client.reset();
  rt.reset();
  fs::remove_all(base);
}

BOOST_AUTO_TEST_CASE(hostile_requests_to_a_shared_store) {
  TensorDict td(BatchSize{16});
  td.set("obs", at::arange(16 * 4, at::kFloat).view({16, 4}));
  td.share_memory_();
  auto rt = actors::Runtime::start(Config::load());
  auto client = actors::StoreClient::open_dense(rt, actors::make_shared_store(td));
  const Outcome o = hammer(*rt, client->actor(), 1500, 7, 16);
  BOOST_TEST_MESSAGE("shared store: " << o.ok << " accepted, " << o.typed << " typed errors");
  BOOST_TEST(o.untyped.empty(), (o.untyped.empty() ? "" : o.untyped.front()));
  BOOST_TEST(o.typed > 0);
  const TensorDict snap = client->snapshot();
  BOOST_TEST(snap.get("obs").equal(at::arange(16 * 4, at::kFloat).view({16, 4})));
  client.reset();
  rt.reset();
}

BOOST_AUTO_TEST_SUITE_END()
