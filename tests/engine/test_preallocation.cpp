// Lazy preallocation through td.index_put_(idx, value): missing keys become full-size zeros, then the value is
// written in place (upstream test_filling_empty_tensordict, test_tensordict_prealloc_nested,
// tensordict_preallocation.py, test_assign_non_tensor).
#include <algorithm>

#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Ellipsis;
using at::indexing::None;
using at::indexing::Slice;

namespace {

TensorDict sample(int64_t seed) {
  return TensorDict(Dict{{"a", zoo::randn({3}, seed)}, {"b", zoo::randint({2, 2}, seed + 1)}}, {});
}

bool rows_zero_except(const at::Tensor& t, const std::vector<int64_t>& written) {
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (std::find(written.begin(), written.end(), i) != written.end()) continue;
    if (!t[i].eq(0).all().item<bool>()) return false;
  }
  return true;
}

JsonValue strings(std::vector<std::string> v) {
  JsonValue::Array a;
  for (auto& s : v) a.emplace_back(s);
  return JsonValue(std::move(a));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(preallocation)

BOOST_AUTO_TEST_CASE(first_write_allocates_full_size_zeros) {
  TensorDict buf(BatchSize{10});
  TensorDict s = sample(1);
  buf.index_put_({2}, s);
  BOOST_TEST(buf.get("a").sizes() == at::IntArrayRef({10, 3}));
  BOOST_TEST(buf.get("b").sizes() == at::IntArrayRef({10, 2, 2}));
  BOOST_TEST(buf.get("a").scalar_type() == at::kFloat);
  BOOST_TEST(buf.get("b").scalar_type() == at::kLong);
  BOOST_TEST(at::equal(buf.get("a")[2], s.get("a")));
  BOOST_TEST(at::equal(buf.get("b")[2], s.get("b")));
  BOOST_TEST(rows_zero_except(buf.get("a"), {2}));
  BOOST_TEST(rows_zero_except(buf.get("b"), {2}));
  // not an alias of the sample
  BOOST_TEST(!buf.get("a").is_alias_of(s.get("a")));

  // the second write goes in place (tensordict["a"] is a)
  at::Tensor a = buf.get("a");
  void* ptr = a.data_ptr();
  TensorDict s2 = sample(5);
  buf.index_put_({-1}, s2);
  BOOST_TEST(buf.get("a").is_same(a));
  BOOST_TEST(buf.get("a").data_ptr() == ptr);
  BOOST_TEST(at::equal(buf.get("a")[9], s2.get("a")));
  BOOST_TEST(at::equal(buf.get("a")[2], s.get("a")));
  BOOST_TEST(rows_zero_except(buf.get("a"), {2, 9}));
  BOOST_TEST(buf.keys().size() == 2u);
}

BOOST_AUTO_TEST_CASE(fill_loop) {
  // the preallocate-and-fill loop of the tutorial
  const int64_t n = 50;
  TensorDict buf(BatchSize{n});
  for (int64_t i = 0; i < n; ++i) {
    buf.index_put_({i}, TensorDict(Dict{{"x", at::full({4}, static_cast<double>(i))}, {"i", at::scalar_tensor(i, at::kLong)}}, {}));
  }
  BOOST_TEST(at::equal(buf.get("i"), at::arange(n)));
  BOOST_TEST(at::equal(buf.get("x"), at::arange(n).to(at::kFloat).unsqueeze(1).expand({n, 4})));
}

BOOST_AUTO_TEST_CASE(large_buffers_are_zero_and_behave_like_any_tensor) {
  // leaves of 2 MiB and more come from zero-filled huge-page mappings: same contract as at::zeros
  const int64_t n = 9000;  // 9000 x 64 floats = 2.3 MB
  TensorDict buf(BatchSize{n});
  TensorDict s(Dict{{"x", at::arange(64).to(at::kFloat)}, {"small", at::ones({2})}}, {});
  buf.index_put_({n - 1}, s);
  at::Tensor x = buf.get("x");
  BOOST_TEST(x.sizes() == at::IntArrayRef({n, 64}));
  BOOST_TEST(x.is_contiguous());
  BOOST_TEST(x.index({Slice(0, n - 1)}).eq(0).all().item<bool>());
  BOOST_TEST(at::equal(x[n - 1], s.get("x")));
  for (int64_t i = 0; i < n; i += 7) buf.index_put_({i}, s);
  BOOST_TEST(x.sum().item<double>() == double((n + 6) / 7 + 1) * (63 * 64 / 2));
  BOOST_TEST(buf.get("x").data_ptr() == x.data_ptr());
  at::Tensor c = x.clone();
  x.resize_({2 * n, 64});  // the storage is resizable, as at::zeros' is
  BOOST_TEST(at::equal(x.index({Slice(0, n)}), c));
  TensorDict rows = buf.index({at::arange(0, n, 7)});
  BOOST_TEST(rows.get("x").eq(s.get("x")).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(reused_buffers_are_zero_again) {
  // freed large buffers are recycled: a new preallocation must still read as zeros
  for (int round = 0; round < 3; ++round) {
    TensorDict buf(BatchSize{9000});
    buf.index_put_({0}, TensorDict(Dict{{"x", at::ones({64})}, {"y", at::ones({64}, at::kDouble)}}, {}));
    BOOST_TEST(buf.get("x").index({Slice(1, None)}).eq(0).all().item<bool>(), "round " << round);
    BOOST_TEST(buf.get("y").index({Slice(1, None)}).eq(0).all().item<bool>(), "round " << round);
    buf.index_put_({Slice()}, TensorDict(Dict{{"x", at::full({64}, 3.0)}, {"y", at::full({64}, 3.0)}}, {}));
    BOOST_TEST(buf.get("x").eq(3).all().item<bool>());
  }
}

BOOST_AUTO_TEST_CASE(other_indices_preallocate_too) {
  // slice, step, tensor, mask, ellipsis, tuple: full size, only the addressed rows written
  struct Case {
    Index idx;
    std::vector<int64_t> rows;
  };
  const std::vector<Case> cases = {
      {{Slice(1, 4)}, {1, 2, 3}},
      {{Slice(None, None, 4)}, {0, 4, 8}},
      {{at::tensor({7, 2}, at::kLong)}, {7, 2}},
      {{at::tensor({-1}, at::kLong)}, {9}},
      {{at::arange(10).remainder(3).eq(0)}, {0, 3, 6, 9}},
      {{Ellipsis, Slice(5, 6)}, {5}},
  };
  for (const auto& c : cases) {
    TensorDict buf(BatchSize{10});
    const int64_t n = static_cast<int64_t>(c.rows.size());
    TensorDict v(Dict{{"a", at::ones({n, 3})}, {"c", at::full({n}, 2, at::kLong)}}, {n});
    buf.index_put_(c.idx, v);
    BOOST_TEST(buf.get("a").sizes() == at::IntArrayRef({10, 3}));
    BOOST_TEST(buf.get("c").sizes() == at::IntArrayRef({10}));
    for (auto r : c.rows) BOOST_TEST(buf.get("a")[r].eq(1).all().item<bool>());
    BOOST_TEST(rows_zero_except(buf.get("a"), c.rows));
    BOOST_TEST(rows_zero_except(buf.get("c"), c.rows));
  }
  // a 2-D buffer written at a tuple index: the value's batch is the indexed batch
  TensorDict grid(BatchSize{4, 5});
  grid.index_put_({1, Slice(0, 2)}, TensorDict(Dict{{"x", at::ones({2, 6})}}, {2}));
  BOOST_TEST(grid.get("x").sizes() == at::IntArrayRef({4, 5, 6}));
  BOOST_TEST(grid.get("x").sum().item<float>() == 12.f);
  BOOST_TEST(grid.get("x").index({1, Slice(0, 2)}).eq(1).all().item<bool>());
  // broadcast of the value on the left when preallocating
  TensorDict g2(BatchSize{4, 5});
  g2.index_put_({Slice(0, 2)}, TensorDict(Dict{{"x", at::arange(5).to(at::kFloat)}}, {5}));
  BOOST_TEST(at::equal(g2.get("x").index({Slice(0, 2)}), at::arange(5).to(at::kFloat).expand({2, 5})));
  BOOST_TEST(g2.get("x").index({Slice(2, 4)}).eq(0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(nested_samples_preallocate_recursively) {
  // upstream test_tensordict_prealloc_nested: buffer [B, N], td_0 [N] with a [N, T] sub-TensorDict
  const int64_t N = 3, B = 5, T = 4;
  TensorDict buffer(BatchSize{B, N});
  auto make = [&](int64_t seed) {
    return TensorDict(Dict{{"env.time", zoo::randn({N, 1}, seed)},
                           {"agent.obs", TensorDict(Dict{{"image", zoo::randn({N, T, 6}, seed + 1)}}, {N, T})}},
                      {N});
  };
  TensorDict td0 = make(1), td1 = make(3);
  buffer.index_put_({0}, td0);
  buffer.index_put_({1}, td1);
  BOOST_TEST(buffer.get_td("agent.obs").batch_size() == BatchSize({B, N, T}));
  BOOST_TEST(buffer.get({"agent.obs", "image"}).sizes() == at::IntArrayRef({B, N, T, 6}));
  BOOST_TEST(buffer.get("env.time").sizes() == at::IntArrayRef({B, N, 1}));
  BOOST_TEST(at::equal(buffer.get({"agent.obs", "image"})[1], td1.get({"agent.obs", "image"})));
  BOOST_TEST(at::equal(buffer.get("env.time")[0], td0.get("env.time")));
  BOOST_TEST(rows_zero_except(buffer.get({"agent.obs", "image"}), {0, 1}));
  BOOST_TEST(repr_batch_size(buffer.get_td("agent.obs").batch_size()) == "torch.Size([5, 3, 4])");

  // a new key inside an existing sub-TensorDict is preallocated inside it
  TensorDict extra(Dict{{"agent.obs", TensorDict(Dict{{"image", zoo::randn({N, T, 6}, 9)},
                                                      {"mask", at::ones({N, T}, at::kBool)}},
                                                 {N, T})}},
                   {N});
  at::Tensor image = buffer.get({"agent.obs", "image"});
  buffer.index_put_({2}, extra);
  BOOST_TEST(buffer.get({"agent.obs", "image"}).is_same(image));
  BOOST_TEST(buffer.get({"agent.obs", "mask"}).sizes() == at::IntArrayRef({B, N, T}));
  BOOST_TEST(buffer.get({"agent.obs", "mask"}).sum().item<int64_t>() == N * T);
  BOOST_TEST(at::equal(buffer.get({"agent.obs", "image"})[2], extra.get({"agent.obs", "image"})));
}

BOOST_AUTO_TEST_CASE(non_tensor_samples_expand) {
  // upstream test_assign_non_tensor
  TensorDict data(BatchSize{1, 10});
  data.index_put_({0, 0}, TensorDict(Dict{{"a", at::scalar_tensor(0, at::kLong)}, {"b", "a string!"}}, {}));
  BOOST_TEST(data.get_non_tensor("b") == JsonValue("a string!"));
  BOOST_TEST(data.get_entry("b").is_non_tensor_data());
  BOOST_TEST(data.get_entry("b").shape() == BatchSize({1, 10}));
  data.index_put_({0, 1}, TensorDict(Dict{{"a", at::scalar_tensor(0, at::kLong)}, {"b", "another string!"}}, {}));
  std::vector<std::string> want(10, "a string!");
  want[1] = "another string!";
  BOOST_TEST(data.get_non_tensor("b") == JsonValue(JsonValue::Array{strings(want)}));

  data = TensorDict(BatchSize{1, 10});
  data.index_put_({0, 0}, TensorDict(Dict{{"a", at::scalar_tensor(0, at::kLong)}, {"b", "a string!"}}, {}));
  data.index_put_({0, Slice(5, None)}, TensorDict(Dict{{"a", at::zeros({5}, at::kLong)}, {"b", "another string!"}}, {5}));
  want = std::vector<std::string>(5, "a string!");
  for (int i = 0; i < 5; ++i) want.push_back("another string!");
  BOOST_TEST(data.get_non_tensor("b") == JsonValue(JsonValue::Array{strings(want)}));

  data = TensorDict(BatchSize{1, 10});
  data.index_put_({0, 0}, TensorDict(Dict{{"a", at::scalar_tensor(0, at::kLong)}, {"b", "a string!"}}, {}));
  data.index_put_({0, Slice(0, None, 2)},
                  TensorDict(Dict{{"a", at::zeros({5}, at::kLong)}, {"b", "another string!"}}, {5}));
  want.clear();
  for (int i = 0; i < 5; ++i) {
    want.push_back("another string!");
    want.push_back("a string!");
  }
  BOOST_TEST(data.get_non_tensor("b") == JsonValue(JsonValue::Array{strings(want)}));

  // a NonTensorStack sample: unwritten slots are null
  TensorDict buf(BatchSize{4});
  TensorDict v(Dict{}, {2});
  v.set("s", NonTensorStack({"x", "y"}, {2}));
  buf.index_put_({Slice(1, 3)}, v);
  BOOST_TEST(buf.get_non_tensor("s") == JsonValue(JsonValue::Array{JsonValue(), "x", "y", JsonValue()}));
}

BOOST_AUTO_TEST_CASE(locked_tensordicts_do_not_preallocate) {
  TensorDict buf(BatchSize{10});
  buf.index_put_({0}, sample(1));
  buf.lock_();
  // existing keys: in place, allowed
  TensorDict s = sample(2);
  buf.index_put_({3}, s);
  BOOST_TEST(at::equal(buf.get("a")[3], s.get("a")));
  // a missing key: LockedError, and nothing added
  TensorDict more(Dict{{"a", at::zeros({3})}, {"new", at::zeros({2})}}, {});
  BOOST_CHECK_EXCEPTION(buf.index_put_({4}, more), LockedError, [](const LockedError& e) {
    return std::string(e.what()).find("Cannot modify locked TensorDict") != std::string::npos;
  });
  BOOST_TEST(!buf.contains("new"));
  // a locked sub-TensorDict neither
  TensorDict nb(BatchSize{4});
  nb.index_put_({0}, TensorDict(Dict{{"sub", Dict{{"x", at::zeros({2})}}}}, {}));
  nb.lock_();
  BOOST_CHECK_THROW(nb.index_put_({1}, TensorDict(Dict{{"sub", Dict{{"y", at::zeros({2})}}}}, {})), LockedError);
  BOOST_CHECK_THROW(nb.index_put_({1}, TensorDict(Dict{{"s", "str"}}, {})), LockedError);
  // a NonTensorData turning into a stack is not a structural change (upstream ignores the lock)
  TensorDict nt(Dict{{"s", "one"}}, {3});
  nt.lock_();
  nt.index_put_({1}, TensorDict(Dict{{"s", "two"}}, {}));
  BOOST_TEST(nt.get_non_tensor("s") == strings({"one", "two", "one"}));
}

BOOST_AUTO_TEST_CASE(none_and_true_write_through_a_new_dim) {
  // upstream: td[None] = v is td.unsqueeze(0)[:] = v
  TensorDict scalar_td(BatchSize{});
  scalar_td.index_put_({None}, TensorDict(Dict{{"x", at::ones({1, 3})}}, {1}));
  BOOST_TEST(scalar_td.get("x").sizes() == at::IntArrayRef({3}));
  BOOST_TEST(scalar_td.get("x").eq(1).all().item<bool>());
  scalar_td.index_put_({true}, TensorDict(Dict{{"x", at::full({1, 3}, 2.0)}}, {1}));
  BOOST_TEST(scalar_td.get("x").eq(2).all().item<bool>());

  TensorDict td(BatchSize{4});
  td.index_put_({None}, TensorDict(Dict{{"x", at::arange(4).to(at::kFloat)}}, {4}));  // broadcast to [1, 4]
  BOOST_TEST(at::equal(td.get("x"), at::arange(4).to(at::kFloat)));
  td.index_put_({false}, TensorDict(Dict{{"x", at::zeros({0, 4})}, {"y", at::zeros({0, 4, 2})}}, {0, 4}));
  BOOST_TEST(at::equal(td.get("x"), at::arange(4).to(at::kFloat)));  // nothing selected
  BOOST_TEST(td.get("y").sizes() == at::IntArrayRef({4, 2}));       // but the key exists, zero-filled
  BOOST_TEST(td.get("y").eq(0).all().item<bool>());
}

BOOST_AUTO_TEST_CASE(preallocation_keeps_device_and_dtype) {
  TensorDict buf(BatchSize{3}, at::Device(at::kCPU));
  buf.index_put_({0}, TensorDict(Dict{{"h", at::ones({2}, at::kHalf)}, {"u", at::ones({2}, at::kByte)}}, {}));
  BOOST_TEST(buf.get("h").scalar_type() == at::kHalf);
  BOOST_TEST(buf.get("u").scalar_type() == at::kByte);
  BOOST_TEST(buf.get("h").device() == at::Device(at::kCPU));
  BOOST_TEST(buf.get("h").is_contiguous());
}

BOOST_AUTO_TEST_SUITE_END()
