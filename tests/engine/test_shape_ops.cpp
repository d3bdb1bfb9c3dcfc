// Shape ops on the batch dims (upstream test_view, test_permute_*, test_squeeze, test_unsqueeze,
// test_transpose, test_unbind, test_split, test_chunk, test_shared_inheritance): over the zoo, every leaf
// equals the same torch op on the leaf with the feature dims carried along; views share storage.
#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {

using LeafOp = std::function<at::Tensor(const at::Tensor&)>;

//! the full shape of a leaf after its first `nd` dims are replaced by `batch`
std::vector<int64_t> full(const BatchSize& batch, const at::Tensor& t, int64_t nd = 4) {
  std::vector<int64_t> s(batch);
  s.insert(s.end(), t.sizes().begin() + nd, t.sizes().end());
  return s;
}

bool leaf_op_fails(const TensorDict& td, const LeafOp& op) {
  for (auto& kv : zoo::leaves(td)) {
    try {
      op(kv.second);
    } catch (const c10::Error&) {
      return true;
    }
  }
  return false;
}

//! runs `td_op` on every zoo kind and compares with `leaf_op` leaf by leaf; when the torch op fails on
//! some leaf (e.g. view of a permuted leaf), the TensorDict op must throw a RuntimeError instead
void over_zoo(const std::string& what, const std::function<TensorDict(const TensorDict&)>& td_op,
              const LeafOp& leaf_op, const BatchSize& want_bs) {
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    std::string ctx = what + " on " + kind.name;
    if (leaf_op_fails(td, leaf_op)) {
      BOOST_TEST_CONTEXT(ctx) { BOOST_CHECK_THROW(td_op(td), RuntimeError); }
      continue;
    }
    TensorDict got = td_op(td);
    zoo::check_leafwise(td, got, want_bs, leaf_op, ctx);
    if (td.contains("data")) {
      BOOST_TEST(got.get_non_tensor("data") == JsonValue("a string"));
    }
  }
}

using zoo::throws_with;

TensorDict small() {  // batch [2, 3], a [2,3,4], nested [2,3,5] with x [2,3,5,2]
  TensorDict td(Dict{{"a", at::arange(24, at::kFloat).view({2, 3, 4})}}, {2, 3});
  td.set("nested", TensorDict(Dict{{"x", at::arange(60, at::kLong).view({2, 3, 5, 2})}}, {2, 3, 5}));
  return td;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shape_ops)

// ---------------------------------------------------------------------------- view / reshape
BOOST_AUTO_TEST_CASE(view_over_zoo) {
  over_zoo("view(-1)", [](const TensorDict& td) { return td.view({-1}); },
           [](const at::Tensor& t) { return t.view(full({24}, t)); }, {24});
  over_zoo("view(2, -1)", [](const TensorDict& td) { return td.view({2, -1}); },
           [](const at::Tensor& t) { return t.view(full({2, 12}, t)); }, {2, 12});
  over_zoo("view(4, 6, 1)", [](const TensorDict& td) { return td.view({4, 6, 1}); },
           [](const at::Tensor& t) { return t.view(full({4, 6, 1}, t)); }, {4, 6, 1});
}

BOOST_AUTO_TEST_CASE(view_writes_through_and_same_shape_is_identity) {
  for (const auto& kind : zoo::kinds()) {
    if (!kind.writable || kind.name == "permute_td") continue;
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      TensorDict v = td.view({-1});
      v.get("a").fill_(3.5);
      BOOST_TEST((td.get("a") == 3.5).all().item<bool>());
      v.set_("c", at::ones_like(v.get("c")));  // upstream test_view: set_ on the view lands in td
      BOOST_TEST((td.get("c") == 1).all().item<bool>());
      BOOST_TEST(td.view({4, 3, 2, 1}).is_same(td));
      BOOST_TEST(td.view({4, 3, -1, 1}).is_same(td));
    }
  }
}

BOOST_AUTO_TEST_CASE(view_errors) {
  TensorDict td = zoo::plain({4, 3, 2, 1});
  // upstream's view asserts a shape holding a negative size (AssertionError); sizes alone: torch's RuntimeError
  BOOST_TEST(throws_with<RuntimeError>([&] { td.view({5, 5}); }, {"view", "[5, 5]", "24"}));
  BOOST_TEST(throws_with<AssertionError>([&] { td.view({-1, -1}); }, {"only one dimension can be inferred"}));
  BOOST_TEST(throws_with<AssertionError>([&] { td.view({7, -1}); }, {"[7, -1]", "24"}));
  BOOST_TEST(throws_with<AssertionError>([&] { td.view({-2, 12}); }, {"invalid shape dimension -2"}));
  TensorDict empty0 = zoo::plain({0, 3});
  BOOST_TEST(throws_with<AssertionError>([&] { empty0.view({0, -1}); }, {"ambiguous"}));
  BOOST_TEST(empty0.view({3, 0}).batch_size() == BatchSize({3, 0}));
  // a view incompatible with the leaves' strides names the leaf (torch says: use reshape)
  TensorDict perm = zoo::plain({3, 1, 4, 2}, 13).permute({2, 0, 3, 1});
  BOOST_TEST(throws_with<RuntimeError>([&] { perm.view({-1}); }, {"view", "leaf", "reshape"}));
  // ... and reshape works, copying
  TensorDict r = perm.reshape({-1});
  zoo::check_leafwise(perm, r, {24}, [](const at::Tensor& t) { return t.reshape(full({24}, t)); });
  BOOST_TEST(!r.get("a").is_alias_of(perm.get("a")));
}

BOOST_AUTO_TEST_CASE(reshape_over_zoo) {
  over_zoo("reshape(-1)", [](const TensorDict& td) { return td.reshape({-1}); },
           [](const at::Tensor& t) { return t.reshape(full({24}, t)); }, {24});
  over_zoo("reshape(3, 8)", [](const TensorDict& td) { return td.reshape({3, 8}); },
           [](const at::Tensor& t) { return t.reshape(full({3, 8}, t)); }, {3, 8});
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(td.reshape({4, 3, 2, 1}).is_same(td));
  BOOST_CHECK_THROW(td.reshape({5}), RuntimeError);
  BOOST_CHECK_THROW(td.reshape({-1, 5}), RuntimeError);
}

// ---------------------------------------------------------------------------- flatten / unflatten
BOOST_AUTO_TEST_CASE(flatten_over_zoo) {
  over_zoo("flatten()", [](const TensorDict& td) { return td.flatten(); },
           [](const at::Tensor& t) { return t.flatten(0, 3); }, {24});
  over_zoo("flatten(1, 2)", [](const TensorDict& td) { return td.flatten(1, 2); },
           [](const at::Tensor& t) { return t.flatten(1, 2); }, {4, 6, 1});
  over_zoo("flatten(-2, -1)", [](const TensorDict& td) { return td.flatten(-2, -1); },
           [](const at::Tensor& t) { return t.flatten(2, 3); }, {4, 3, 2});
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(td.flatten(2, 2).is_same(td));
  BOOST_TEST(td.flatten(-1, 3).is_same(td));
}

BOOST_AUTO_TEST_CASE(flatten_errors) {
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(throws_with<ValueError>([&] { td.flatten(2, 1); }, {"start_dim cannot come after end_dim"}));
  BOOST_TEST(throws_with<IndexError>([&] { td.flatten(0, 4); }, {"flatten", "[-4, 3]", "got 4"}));
  BOOST_TEST(throws_with<IndexError>([&] { td.flatten(-5, 2); }, {"got -5"}));
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_TEST(throws_with<IndexError>([&] { scalar.flatten(); }, {"no batch dimension"}));
}

BOOST_AUTO_TEST_CASE(unflatten_round_trip_and_errors) {
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      TensorDict flat = td.reshape({12, 2, 1});
      TensorDict back = flat.unflatten(0, {4, -1});
      zoo::check_equal(back, td);
      if (td.contains("nested")) BOOST_TEST(back.get_td("nested").batch_size() == BatchSize({4, 3, 2, 1, 2}));
      zoo::check_leafwise(td, td.unflatten(-2, {1, 2, 1}), {4, 3, 1, 2, 1, 1},
                          [](const at::Tensor& t) { return t.view(full({4, 3, 1, 2, 1, 1}, t)); });
    }
  }
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(throws_with<RuntimeError>([&] { td.unflatten(1, {2, 2}); }, {"unflatten", "[2, 2]", "3 elements"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.unflatten(0, {-1, -1}); }, {"only one dimension"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.unflatten(0, {}); }, {"non-empty"}));  // torch.unflatten's
  BOOST_TEST(throws_with<IndexError>([&] { td.unflatten(4, {1}); }, {"unflatten", "got 4"}));
}

// ---------------------------------------------------------------------------- squeeze / unsqueeze
BOOST_AUTO_TEST_CASE(squeeze_over_zoo) {
  over_zoo("squeeze()", [](const TensorDict& td) { return td.squeeze(); },
           [](const at::Tensor& t) { return t.squeeze(3); }, {4, 3, 2});
  over_zoo("squeeze(-1)", [](const TensorDict& td) { return td.squeeze(-1); },
           [](const at::Tensor& t) { return t.squeeze(3); }, {4, 3, 2});
  over_zoo("squeeze(3)", [](const TensorDict& td) { return td.squeeze(3); },
           [](const at::Tensor& t) { return t.squeeze(3); }, {4, 3, 2});
  for (const auto& kind : zoo::kinds()) {
    TensorDict td = kind.make();
    BOOST_TEST(td.squeeze(0).is_same(td));  // non-singleton dim: unchanged, like torch
    BOOST_TEST(td.squeeze(-2).batch_size() == td.batch_size());
  }
}

BOOST_AUTO_TEST_CASE(squeeze_several_and_errors) {
  TensorDict td = zoo::plain({1, 3, 1, 2, 1});
  TensorDict s = td.squeeze();
  zoo::check_leafwise(td, s, {3, 2}, [](const at::Tensor& t) { return t.squeeze(4).squeeze(2).squeeze(0); });
  BOOST_TEST(s.get("b").sizes() == at::IntArrayRef({3, 2, 1, 10}));  // feature dims of size 1 are kept
  BOOST_TEST(zoo::plain({4, 3}).squeeze().batch_size() == BatchSize({4, 3}));
  BOOST_TEST(throws_with<IndexError>([&] { td.squeeze(5); }, {"squeeze", "[-5, 4]", "got 5"}));
  BOOST_CHECK_THROW(td.squeeze(-6), IndexError);
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_TEST(scalar.squeeze(0).is_same(scalar));
  BOOST_TEST(scalar.squeeze(-1).is_same(scalar));
  BOOST_TEST(scalar.squeeze().is_same(scalar));
  BOOST_CHECK_THROW(scalar.squeeze(1), IndexError);
}

BOOST_AUTO_TEST_CASE(unsqueeze_over_zoo) {
  over_zoo("unsqueeze(0)", [](const TensorDict& td) { return td.unsqueeze(0); },
           [](const at::Tensor& t) { return t.unsqueeze(0); }, {1, 4, 3, 2, 1});
  over_zoo("unsqueeze(2)", [](const TensorDict& td) { return td.unsqueeze(2); },
           [](const at::Tensor& t) { return t.unsqueeze(2); }, {4, 3, 1, 2, 1});
  over_zoo("unsqueeze(-1)", [](const TensorDict& td) { return td.unsqueeze(-1); },
           [](const at::Tensor& t) { return t.unsqueeze(4); }, {4, 3, 2, 1, 1});
  over_zoo("unsqueeze(4)", [](const TensorDict& td) { return td.unsqueeze(4); },
           [](const at::Tensor& t) { return t.unsqueeze(4); }, {4, 3, 2, 1, 1});
  over_zoo("unsqueeze(-5)", [](const TensorDict& td) { return td.unsqueeze(-5); },
           [](const at::Tensor& t) { return t.unsqueeze(0); }, {1, 4, 3, 2, 1});
}

BOOST_AUTO_TEST_CASE(unsqueeze_spec_example_and_errors) {
  // upstream-api §0: td.unsqueeze(-1) on batch [3,4] gives [3,4,1]; leaf (3,4,5) -> (3,4,1,5)
  TensorDict td(Dict{{"x", at::zeros({3, 4, 5})}}, {3, 4});
  TensorDict u = td.unsqueeze(-1);
  BOOST_TEST(u.batch_size() == BatchSize({3, 4, 1}));
  BOOST_TEST(u.get("x").sizes() == at::IntArrayRef({3, 4, 1, 5}));
  BOOST_TEST(u.squeeze(-1).batch_size() == BatchSize({3, 4}));
  // upstream: RuntimeError for a dim out of range in unsqueeze
  BOOST_TEST(throws_with<RuntimeError>([&] { td.unsqueeze(3); }, {"unsqueeze", "[-3, 2]", "got 3"}));
  BOOST_CHECK_THROW(td.unsqueeze(-4), RuntimeError);
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_TEST(scalar.unsqueeze(0).get("a").sizes() == at::IntArrayRef({1, 3}));
  BOOST_TEST(scalar.unsqueeze(-1).batch_size() == BatchSize({1}));
}

// ---------------------------------------------------------------------------- permute / transpose
BOOST_AUTO_TEST_CASE(permute_over_zoo) {
  over_zoo("permute(3, 1, 0, 2)", [](const TensorDict& td) { return td.permute({3, 1, 0, 2}); },
           [](const at::Tensor& t) {
             std::vector<int64_t> d{3, 1, 0, 2};
             for (int64_t i = 4; i < t.dim(); ++i) d.push_back(i);
             return t.permute(d);
           },
           {1, 3, 4, 2});
  over_zoo("permute(-1, -2, -3, -4)", [](const TensorDict& td) { return td.permute({-1, -2, -3, -4}); },
           [](const at::Tensor& t) {
             std::vector<int64_t> d{3, 2, 1, 0};
             for (int64_t i = 4; i < t.dim(); ++i) d.push_back(i);
             return t.permute(d);
           },
           {1, 2, 3, 4});
  // upstream accepts a complete permutation of the first k dims
  over_zoo("permute(1, 0)", [](const TensorDict& td) { return td.permute({1, 0}); },
           [](const at::Tensor& t) { return t.transpose(0, 1); }, {3, 4, 2, 1});
}

BOOST_AUTO_TEST_CASE(permute_round_trip_writes_and_errors) {
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      BOOST_TEST(td.permute({0, 1, 2, 3}).is_same(td));
      TensorDict p = td.permute({2, 3, 0, 1});
      zoo::check_equal(p.permute({2, 3, 0, 1}), td);
      if (kind.writable) {
        p.get("a").index_put_({0}, 9.0);
        BOOST_TEST((td.get("a").index({Slice(), Slice(), 0}) == 9.0).all().item<bool>());
      }
    }
  }
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(throws_with<ValueError>([&] { td.permute({0, 0, 1, 2}); }, {"permutation", "[0, 0, 1, 2]"}));
  BOOST_TEST(throws_with<ValueError>([&] { td.permute({0, 2}); }, {"permutation"}));
  BOOST_TEST(throws_with<ValueError>([&] { td.permute({0, 1, 2, 3, 4}); }, {"5 dims", "4 batch dims"}));
  BOOST_TEST(throws_with<ValueError>([&] { td.permute({0, 1, 5, 2}); }, {"permute", "got 5"}));  // upstream
}

BOOST_AUTO_TEST_CASE(transpose_over_zoo) {
  over_zoo("transpose(0, 2)", [](const TensorDict& td) { return td.transpose(0, 2); },
           [](const at::Tensor& t) { return t.transpose(0, 2); }, {2, 3, 4, 1});
  over_zoo("transpose(-1, 1)", [](const TensorDict& td) { return td.transpose(-1, 1); },
           [](const at::Tensor& t) { return t.transpose(3, 1); }, {4, 1, 2, 3});
  TensorDict td = zoo::plain({4, 3, 2, 1});
  BOOST_TEST(td.transpose(1, -3).is_same(td));
  zoo::check_equal(td.transpose(0, 1).transpose(0, 1), td);
  // upstream: ValueError for a dim out of range in transpose / permute
  BOOST_TEST(throws_with<ValueError>([&] { td.transpose(0, 4); }, {"transpose", "got 4"}));
  BOOST_CHECK_THROW(td.transpose(-5, 0), ValueError);
}

// ---------------------------------------------------------------------------- expand
BOOST_AUTO_TEST_CASE(expand_over_zoo) {
  over_zoo("expand(2, 4, 3, 2, 7)", [](const TensorDict& td) { return td.expand({2, 4, 3, 2, 7}); },
           [](const at::Tensor& t) { return t.expand(full({2, 4, 3, 2, 7}, t)); }, {2, 4, 3, 2, 7});
  over_zoo("expand(-1, -1, -1, 5)", [](const TensorDict& td) { return td.expand({-1, -1, -1, 5}); },
           [](const at::Tensor& t) { return t.expand(full({4, 3, 2, 5}, t)); }, {4, 3, 2, 5});
}

BOOST_AUTO_TEST_CASE(expand_is_stride0_no_allocation) {
  TensorDict td = zoo::plain({1, 3});
  td.set("nested", TensorDict(Dict{{"x", at::zeros({1, 3, 4, 2})}}, {1, 3, 4}));
  TensorDict e = td.expand({5, 6, 3});
  BOOST_TEST(e.batch_size() == BatchSize({5, 6, 3}));
  BOOST_TEST(e.get("a").data_ptr() == td.get("a").data_ptr());
  BOOST_TEST(e.get("a").stride(0) == 0);
  BOOST_TEST(e.get("a").stride(1) == 0);
  BOOST_TEST(e.get_td("nested").batch_size() == BatchSize({5, 6, 3, 4}));
  BOOST_TEST(e.get({"nested", "x"}).sizes() == at::IntArrayRef({5, 6, 3, 4, 2}));
  BOOST_TEST(e.get({"nested", "x"}).data_ptr() == td.get({"nested", "x"}).data_ptr());
  // -1 keeps the size; 0 is a valid size for a singleton dim
  BOOST_TEST(td.expand({-1, -1}).batch_size() == BatchSize({1, 3}));
  BOOST_TEST(td.expand({0, 3}).get("a").sizes() == at::IntArrayRef({0, 3, 5}));
}

BOOST_AUTO_TEST_CASE(expand_errors) {
  TensorDict td = zoo::plain({1, 3});
  BOOST_TEST(throws_with<RuntimeError>([&] { td.expand({2, 4}); },
                                       {"expand", "(4)", "existing size (3)", "non-singleton dimension 1"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.expand({3}); }, {"number of sizes provided (1)", "(2)"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.expand({-1, 1, 3}); }, {"leading, non-existing dimension 0"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.expand({5, -2}); }, {"invalid size -2"}));
  BOOST_TEST(td.get("a").sizes() == at::IntArrayRef({1, 3, 5}));  // untouched
}

// ---------------------------------------------------------------------------- unbind / split / chunk
BOOST_AUTO_TEST_CASE(unbind_over_zoo) {
  for (int64_t dim : {0, 1, 2, 3, -1, -4}) {
    for (const auto& kind : zoo::kinds()) {
      BOOST_TEST_CONTEXT(kind.name << " unbind(" << dim << ")") {
        TensorDict td = kind.make();
        int64_t d = dim < 0 ? dim + 4 : dim;
        std::vector<TensorDict> parts = td.unbind(dim);
        BOOST_REQUIRE_EQUAL(static_cast<int64_t>(parts.size()), td.batch_size()[d]);
        BatchSize nb = td.batch_size();
        nb.erase(nb.begin() + d);
        for (int64_t i = 0; i < static_cast<int64_t>(parts.size()); ++i) {
          zoo::check_leafwise(td, parts[i], nb, [&](const at::Tensor& t) { return t.select(d, i); });
          if (td.contains("data")) BOOST_TEST(parts[i].get_non_tensor("data") == JsonValue("a string"));
        }
        zoo::check_equal(stack(parts, dim), td);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(unbind_writes_through_and_errors) {
  TensorDict td = zoo::plain({4, 3});
  auto parts = td.unbind(1);
  parts[2].get("a").fill_(-1.0);
  BOOST_TEST((td.get("a").select(1, 2) == -1.0).all().item<bool>());
  BOOST_TEST((td.get("a").select(1, 0) != -1.0).all().item<bool>());
  BOOST_TEST(throws_with<IndexError>([&] { td.unbind(2); }, {"unbind", "got 2"}));
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_CHECK_THROW(scalar.unbind(0), IndexError);
  BOOST_TEST(zoo::plain({0, 2}).unbind(0).empty());
}

BOOST_AUTO_TEST_CASE(split_over_zoo) {
  struct Case {
    std::function<std::vector<TensorDict>(const TensorDict&)> op;
    std::vector<int64_t> sizes;
    int64_t dim;
  };
  std::vector<Case> cases{
      {[](const TensorDict& td) { return td.split(2, 0); }, {2, 2}, 0},
      {[](const TensorDict& td) { return td.split(3, 0); }, {3, 1}, 0},
      {[](const TensorDict& td) { return td.split(1, -3); }, {1, 1, 1}, 1},
      {[](const TensorDict& td) { return td.split(std::vector<int64_t>{1, 2}, 1); }, {1, 2}, 1},
      {[](const TensorDict& td) { return td.split(std::vector<int64_t>{0, 2, 0}, 2); }, {0, 2, 0}, 2},
      {[](const TensorDict& td) { return td.split(5, -1); }, {1}, 3},
      {[](const TensorDict& td) { return td.chunk(3, 0); }, {2, 2}, 0},
      {[](const TensorDict& td) { return td.chunk(2, 1); }, {2, 1}, 1},
      {[](const TensorDict& td) { return td.chunk(5, 1); }, {1, 1, 1}, 1},
      {[](const TensorDict& td) { return td.chunk(1, -2); }, {2}, 2},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    for (const auto& kind : zoo::kinds()) {
      BOOST_TEST_CONTEXT(kind.name << " split case " << c) {
        TensorDict td = kind.make();
        const auto& cs = cases[c];
        std::vector<TensorDict> parts = cs.op(td);
        BOOST_REQUIRE_EQUAL(parts.size(), cs.sizes.size());
        int64_t start = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
          BatchSize nb = td.batch_size();
          nb[cs.dim] = cs.sizes[i];
          int64_t s0 = start;
          zoo::check_leafwise(td, parts[i], nb,
                              [&](const at::Tensor& t) { return t.narrow(cs.dim, s0, cs.sizes[i]); });
          start += cs.sizes[i];
        }
        zoo::check_equal(cat(parts, cs.dim), td);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(split_chunk_errors) {
  TensorDict td = zoo::plain({4, 3});
  BOOST_TEST(throws_with<RuntimeError>([&] { td.split(std::vector<int64_t>{1, 2}, 0); },
                                       {"Split method expects split_size to sum exactly to 4", "[1, 2]"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.split(std::vector<int64_t>{5, -1}, 0); }, {"non-negative"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.split(-1, 0); }, {"non-negative"}));
  BOOST_TEST(throws_with<RuntimeError>([&] { td.split(0, 0); }, {"split_size can only be 0"}));
  BOOST_TEST(throws_with<IndexError>([&] { td.split(1, 2); }, {"split", "got 2"}));
  BOOST_TEST(throws_with<IndexError>([&] { td.chunk(2, -3); }, {"chunk", "got -3"}));
  BOOST_TEST(throws_with<ValueError>([&] { td.chunk(0, 0); }, {"strictly positive", "got 0"}));
  TensorDict scalar(Dict{{"a", at::zeros({3})}}, {});
  BOOST_TEST(throws_with<RuntimeError>([&] { scalar.split(1, 0); }, {"not splittable"}));
  BOOST_CHECK_THROW(scalar.chunk(2, 0), RuntimeError);
  // a zero-size dim gives one empty part, like torch
  auto parts = zoo::plain({0, 3}).split(2, 0);
  BOOST_REQUIRE_EQUAL(parts.size(), 1u);
  BOOST_TEST(parts[0].batch_size() == BatchSize({0, 3}));
}

BOOST_AUTO_TEST_CASE(split_parts_are_views) {
  TensorDict td = zoo::plain({6, 2});
  at::Tensor head = td.get("c").narrow(0, 0, 2).clone();
  auto parts = td.split(std::vector<int64_t>{2, 4}, 0);
  BOOST_TEST(zoo::all_alias(parts[1], td));
  parts[1].get("c").zero_();
  BOOST_TEST((td.get("c").narrow(0, 2, 4) == 0).all().item<bool>());
  BOOST_TEST(td.get("c").narrow(0, 0, 2).equal(head));
}

// ---------------------------------------------------------------------------- contiguous
BOOST_AUTO_TEST_CASE(contiguous_over_zoo) {
  for (const auto& kind : zoo::kinds()) {
    BOOST_TEST_CONTEXT(kind.name) {
      TensorDict td = kind.make();
      TensorDict c = td.contiguous();
      zoo::check_equal(c, td);
      for (auto& kv : zoo::leaves(c)) BOOST_TEST(kv.second.is_contiguous(), kv.first);
      if (td.contains("data")) BOOST_TEST(c.get_non_tensor("data") == JsonValue("a string"));
    }
  }
}

// ---------------------------------------------------------------------------- flags, non-tensors
BOOST_AUTO_TEST_CASE(shared_inheritance) {
  // upstream test_shared_inheritance: shape ops keep lock and shared/memmap flags, key ops drop them
  TensorDict td = small();
  td.share_memory_();
  BOOST_REQUIRE(td.is_shared());
  BOOST_REQUIRE(td.is_locked());
  std::vector<std::pair<std::string, TensorDict>> kept{
      {"view", td.view({-1})},           {"reshape", td.reshape({3, 2})},    {"flatten", td.flatten()},
      {"unflatten", td.unflatten(1, {3, 1})}, {"unsqueeze", td.unsqueeze(0)}, {"squeeze", td.unsqueeze(1).squeeze(1)},
      {"permute", td.permute({1, 0})},   {"transpose", td.transpose(0, 1)}, {"unbind", td.unbind(0)[1]},
      {"split", td.split(1, 1)[0]},      {"chunk", td.chunk(2, 0)[1]},
  };
  for (auto& kv : kept) {
    BOOST_TEST_CONTEXT(kv.first) {
      BOOST_TEST(kv.second.is_locked());
      BOOST_TEST(kv.second.is_shared());
      BOOST_TEST(kv.second.get_td("nested").is_locked());
      BOOST_TEST(kv.second.get_td("nested").is_shared());
      BOOST_CHECK_THROW(kv.second.set("new", at::zeros(kv.second.batch_size())), LockedError);
    }
  }
  // expand / contiguous: locked like upstream's propagate_lock, but not shared
  for (auto& kv : std::vector<std::pair<std::string, TensorDict>>{{"expand", td.expand({2, 2, 3})},
                                                                  {"contiguous", td.contiguous()}}) {
    BOOST_TEST_CONTEXT(kv.first) {
      BOOST_TEST(kv.second.is_locked());
      BOOST_TEST(kv.second.get_td("nested").is_locked());
      BOOST_TEST(!kv.second.is_shared());
    }
  }
  // key ops drop everything
  BOOST_TEST(!td.select({"a"}).is_locked());
  BOOST_TEST(!td.select({"a"}).is_shared());
  // results of an unlocked TD are unlocked
  TensorDict plain_td = small();
  BOOST_TEST(!plain_td.view({-1}).is_locked());
  BOOST_TEST(!plain_td.unbind(0)[0].is_locked());
}

BOOST_AUTO_TEST_CASE(non_tensor_stack_follows_shape_ops) {
  TensorDict td(Dict{{"a", at::arange(6).view({2, 3})}}, {2, 3});
  std::vector<JsonValue> vals;
  for (int i = 0; i < 6; ++i) vals.emplace_back("v" + std::to_string(i));
  td.set("s", NonTensorStack(vals, {2, 3}));
  td.set("d", "same");
  auto as_list = [](const TensorDict& t) { return t.get_non_tensor("s"); };
  auto strs = [](std::vector<std::vector<std::string>> rows) {
    JsonValue::Array out;
    for (auto& r : rows) {
      JsonValue::Array row;
      for (auto& s : r) row.emplace_back(s);
      out.emplace_back(std::move(row));
    }
    return JsonValue(std::move(out));
  };
  BOOST_TEST(as_list(td.permute({1, 0})) == strs({{"v0", "v3"}, {"v1", "v4"}, {"v2", "v5"}}));
  BOOST_TEST(as_list(td.view({3, 2})) == strs({{"v0", "v1"}, {"v2", "v3"}, {"v4", "v5"}}));
  auto cols = td.unbind(1);
  BOOST_TEST(cols[2].get_non_tensor("s") == JsonValue(JsonValue::Array{JsonValue("v2"), JsonValue("v5")}));
  BOOST_TEST(cols[2].get_non_tensor("d") == JsonValue("same"));
  BOOST_TEST(cols[2].get_entry("d").shape() == BatchSize({2}));
  auto parts = td.split(std::vector<int64_t>{1, 2}, 1);
  BOOST_TEST(parts[1].get_non_tensor("s") == strs({{"v1", "v2"}, {"v4", "v5"}}));
  BOOST_TEST(td.unsqueeze(1).get_entry("s").shape() == BatchSize({2, 1, 3}));
  BOOST_TEST(td.expand({2, 2, 3}).get_entry("s").shape() == BatchSize({2, 2, 3}));
  BOOST_TEST(td.expand({2, 2, 3}).get_entry("d").shape() == BatchSize({2, 2, 3}));
  // a round trip through stack restores the per-element values
  TensorDict back = stack(td.unbind(1), 1);
  BOOST_TEST(back.get_non_tensor("s") == td.get_non_tensor("s"));
}

BOOST_AUTO_TEST_CASE(nested_extra_batch_dims_preserved) {
  TensorDict td = small();
  TensorDict p = td.permute({1, 0});
  BOOST_TEST(p.get_td("nested").batch_size() == BatchSize({3, 2, 5}));
  BOOST_TEST(p.get({"nested", "x"}).equal(td.get({"nested", "x"}).permute({1, 0, 2, 3})));
  TensorDict v = td.view({6});
  BOOST_TEST(v.get_td("nested").batch_size() == BatchSize({6, 5}));
  auto u = td.unbind(1);
  BOOST_TEST(u[0].get_td("nested").batch_size() == BatchSize({2, 5}));
  BOOST_TEST(td.expand({4, 2, 3}).get_td("nested").batch_size() == BatchSize({4, 2, 3, 5}));
  BOOST_TEST(td.squeeze().is_same(td));
}

BOOST_AUTO_TEST_SUITE_END()
