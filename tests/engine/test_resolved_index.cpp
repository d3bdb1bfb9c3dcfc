// ResolvedIndex: the public, composable, serialisable form of an index on the batch dims.
#include <boost/test/unit_test.hpp>

#include "tensordict/errors.hpp"
#include "tensordict/resolved_index.hpp"

#include <optional>
#include <thread>

using namespace tensordict;
using namespace at::indexing;

namespace {
at::Tensor grid(const BatchSize& bs) {
  int64_t n = 1;
  for (auto s : bs) n *= s;
  return at::arange(n, at::kLong).view(bs);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(resolved_index)

BOOST_AUTO_TEST_CASE(resolve_follows_torch_for_every_index_kind) {
  const BatchSize bs{5, 4, 3};
  const std::vector<Index> indices = {
      {},         {1},          {-1, 2},          {Slice(1, 4)},         {Slice(None, None, 2), 1},
      {None, 0},  {Ellipsis, 1}, {at::tensor({4, 0, 2}, at::kLong)}, {Slice(), at::tensor({1,0,1,1}, at::kLong).to(at::kBool)},
      {at::rand({5, 4}) > 0.5},
  };
  for (const auto& idx : indices) {
    BOOST_TEST_CONTEXT(index_repr(idx)) {
      ResolvedIndex r = ResolvedIndex::resolve(bs, idx);
      at::Tensor want = idx.empty() ? grid(bs) : grid(bs).index(idx);
      BOOST_TEST(r.result_batch() == BatchSize(want.sizes().begin(), want.sizes().end()));
      BOOST_TEST(at::equal(r.positions(), want));
      BOOST_TEST(r.source_batch() == bs);
    }
  }
  BOOST_CHECK_THROW(ResolvedIndex::resolve(bs, {7}), IndexError);
  BOOST_CHECK_THROW(ResolvedIndex::resolve(bs, {0, 0, 0, 0}), IndexError);
  BOOST_CHECK_THROW(ResolvedIndex::resolve(bs, {at::tensor({0.5})}), Error);
}

BOOST_AUTO_TEST_CASE(compose_equals_indexing_twice) {
  const BatchSize bs{6, 5};
  const std::vector<std::pair<Index, Index>> pairs = {
      {{Slice(1, 5)}, {2}},
      {{Slice(None, None, 2)}, {Slice(), 3}},
      {{at::tensor({5, 1, 3}, at::kLong)}, {Slice(0, 2)}},
      {{2}, {at::tensor({4, 0}, at::kLong)}},
      {{None}, {0, 1}},
  };
  for (const auto& [a, b] : pairs) {
    BOOST_TEST_CONTEXT(index_repr(a) << " then " << index_repr(b)) {
      ResolvedIndex r = ResolvedIndex::resolve(bs, a).compose(b);
      BOOST_TEST(at::equal(r.positions(), grid(bs).index(a).index(b)));
    }
  }
}

BOOST_AUTO_TEST_CASE(rows_and_row_ranges) {
  const BatchSize bs{10, 3};
  ResolvedIndex one = ResolvedIndex::resolve(bs, {4});
  BOOST_TEST((one.row_range() == std::make_pair(int64_t{4}, int64_t{1})));
  ResolvedIndex run = ResolvedIndex::resolve(bs, {Slice(2, 7)});
  BOOST_TEST((run.row_range() == std::make_pair(int64_t{2}, int64_t{5})));
  BOOST_TEST(!ResolvedIndex::resolve(bs, {Slice(None, None, 2)}).row_range().has_value());
  BOOST_TEST(!ResolvedIndex::resolve(bs, {Slice(), 1}).row_range().has_value());
  ResolvedIndex picked = ResolvedIndex::resolve(bs, {at::tensor({7, 7, 1}, at::kLong)});
  BOOST_TEST(picked.rows() == std::vector<int64_t>({7, 7, 7, 7, 7, 7, 1, 1, 1}));
}

BOOST_AUTO_TEST_CASE(stepped_slice_whose_range_is_not_a_multiple_of_the_step) {
  // one stepped slice over a range the step does not divide: ceil((stop - start) / step) rows, the last one
  // short of stop (Slice(1, 10, 4) over 10 rows: 1, 5, 9; Slice(0, 7, 3): 0, 3, 6), as torch counts them
  const BatchSize bs{10, 2};
  struct Case {
    Slice s;
    std::vector<int64_t> rows;
  };
  const std::vector<Case> cases = {{Slice(1, 10, 4), {1, 5, 9}},
                                   {Slice(0, 7, 3), {0, 3, 6}},
                                   {Slice(2, 9, 3), {2, 5, 8}},
                                   {Slice(0, 10, 3), {0, 3, 6, 9}},
                                   {Slice(8, None, 5), {8}},
                                   {Slice(3, 100, 4), {3, 7}}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(index_repr({c.s})) {
      const ResolvedIndex r = ResolvedIndex::resolve(bs, {c.s});
      const int64_t n = static_cast<int64_t>(c.rows.size());
      BOOST_TEST(r.result_batch() == BatchSize({n, 2}));
      BOOST_TEST(r.numel() == n * 2);
      BOOST_TEST(r.positions().equal(grid(bs).index({c.s})));
      std::vector<int64_t> want;
      for (int64_t row : c.rows) want.insert(want.end(), {row, row});
      BOOST_TEST(r.rows() == want);
      if (n > 1) BOOST_TEST(!r.row_range().has_value());  // not a run of consecutive rows
      const auto plan = r.row_plan();
      BOOST_TEST(plan.rows.vec() == c.rows);
      BOOST_TEST((plan.in_order && !plan.all && plan.per_row == 2));
      // take and put of a leaf agree with torch on the same rows
      const at::Tensor leaf = at::arange(20, at::kFloat).view({10, 2});
      BOOST_TEST(r.take(leaf).equal(leaf.index({c.s})));
      at::Tensor dst = at::zeros({10, 2});
      r.put(dst, at::ones({n, 2}));
      BOOST_TEST(dst.sum().item<double>() == 2.0 * n);
      for (int64_t row : c.rows) BOOST_TEST(dst[row].eq(1).all().item<bool>());
    }
  }
}

BOOST_AUTO_TEST_CASE(repeated_row_selections_share_one_plan_per_thread) {
  // td[i] / td[a:b:s] again and again (a write loop) resolves to the same positions and the same row plan on
  // one thread: the row list is shared (RowList::same), so the stores' memos of checks and layouts hold.
  // A different selection, source or thread gets its own; large selections are not kept, and stay right.
  const BatchSize bs{10000, 2};
  auto plan_of = [](const BatchSize& b, const Index& i) { return ResolvedIndex::resolve(b, i).row_plan(); };
  const auto a = plan_of(bs, {Slice(100, 356)});
  const auto b = plan_of(bs, {Slice(100, 356)});
  BOOST_TEST(a.rows.same(b.rows));
  BOOST_TEST(a.rows.size() == 256u);
  BOOST_TEST(a.rows.front() == 100);
  BOOST_TEST(a.rows.back() == 355);
  BOOST_TEST((a.in_order && !a.all && a.per_row == 2));
  const auto c = plan_of(bs, {Slice(100, 357)});  // one row more
  BOOST_TEST(!c.rows.same(a.rows));
  BOOST_TEST(c.rows.size() == 257u);
  BOOST_TEST(c.rows.back() == 356);
  const auto d = plan_of(BatchSize{10000, 3}, {Slice(100, 356)});  // another source: other positions
  BOOST_TEST(d.per_row == 3);
  BOOST_TEST(ResolvedIndex::resolve(BatchSize{10000, 3}, {Slice(100, 356)}).positions().equal(
      grid(BatchSize{10000, 3}).index({Slice(100, 356)})));
  const auto e = plan_of(bs, {Slice(100, 356, 2)});  // a step: other rows
  BOOST_TEST(e.rows.size() == 128u);
  BOOST_TEST(e.rows[1] == 102);
  const auto f = plan_of(bs, {-1});
  const auto g = plan_of(bs, {9999});  // the same row, spelled otherwise
  BOOST_TEST(f.rows.same(g.rows));
  BOOST_TEST(f.rows.vec() == std::vector<int64_t>({9999}));
  // another thread: its own plan, equal in value
  backends::RowList other;
  std::thread t([&] { other = plan_of(bs, {Slice(100, 356)}).rows; });
  t.join();
  const auto h = plan_of(bs, {Slice(100, 356)});
  BOOST_TEST(!other.same(h.rows));
  BOOST_TEST(other.vec() == h.rows.vec());
  // 5,000 rows x 2: more positions than are kept; right each time, not shared
  const auto big1 = plan_of(bs, {Slice(0, 5000)});
  const auto big2 = plan_of(bs, {Slice(0, 5000)});
  BOOST_TEST(!big1.rows.same(big2.rows));
  BOOST_TEST(big2.rows.size() == 5000u);
  BOOST_TEST(big2.rows.back() == 4999);
  BOOST_TEST(ResolvedIndex::resolve(bs, {Slice(0, 5000)}).positions().equal(grid(bs).index({Slice(0, 5000)})));
  // a fancy index takes the general path: its plan is right after a remembered slice
  const auto k = plan_of(bs, {at::tensor({7, 3, 7}, at::kLong)});
  BOOST_TEST(k.rows.vec() == std::vector<int64_t>({3, 7}));
  BOOST_TEST(!k.in_order);
}

BOOST_AUTO_TEST_CASE(row_after_row_reuses_positions_only_when_nothing_holds_them) {
  // a producer's td[i] = row, row after row: the remembered positions tensor is written again for the next row
  // once its ResolvedIndex is gone, and the plan remembered for it is dropped with it. A ResolvedIndex (or a view
  // of its positions) still held keeps its rows.
  const BatchSize bs{100, 3};
  auto rows_of = [](const ResolvedIndex& r) { return r.row_plan().rows.vec(); };
  const void* first_impl = nullptr;
  {
    const ResolvedIndex r = ResolvedIndex::resolve(bs, {5});
    BOOST_TEST(rows_of(r) == std::vector<int64_t>({5}));  // its plan is remembered now
    first_impl = r.positions().unsafeGetTensorImpl();
  }
  const ResolvedIndex a = ResolvedIndex::resolve(bs, {6});  // nothing holds row 5's: written again
  BOOST_TEST(a.positions().unsafeGetTensorImpl() == first_impl);
  BOOST_TEST(a.positions().equal(grid(bs).index({6})));
  BOOST_TEST(rows_of(a) == std::vector<int64_t>({6}));  // not row 5's remembered plan
  std::optional<ResolvedIndex> b = ResolvedIndex::resolve(bs, {7});  // `a` is held: new positions
  BOOST_TEST(b->positions().unsafeGetTensorImpl() != a.positions().unsafeGetTensorImpl());
  BOOST_TEST(a.positions().equal(grid(bs).index({6})));
  BOOST_TEST(rows_of(a) == std::vector<int64_t>({6}));
  BOOST_TEST(rows_of(*b) == std::vector<int64_t>({7}));
  at::Tensor view = at::empty({0}, at::kLong);  // only b's storage held (as a tensor set_ on it holds it)
  view.set_(b->positions().storage(), 0, {3}, {1});
  const void* b_impl = b->positions().unsafeGetTensorImpl();
  b.reset();
  const ResolvedIndex c = ResolvedIndex::resolve(bs, {8});
  BOOST_TEST(c.positions().unsafeGetTensorImpl() != b_impl);
  BOOST_TEST(view.equal(grid(bs).index({7}).view({3})));
  BOOST_TEST(rows_of(c) == std::vector<int64_t>({8}));
}

BOOST_AUTO_TEST_CASE(json_round_trip_and_bad_input) {
  ResolvedIndex r = ResolvedIndex::resolve({4, 3}, {Slice(1, 3), at::tensor({2, 0}, at::kLong)});
  ResolvedIndex back = ResolvedIndex::from_json(r.to_json());
  BOOST_TEST((back == r));
  BOOST_CHECK_THROW(ResolvedIndex::from_json("not json"), FormatError);
  BOOST_CHECK_THROW(ResolvedIndex::from_json(R"({"source":[4],"shape":[2],"positions":[1]})"), FormatError);
  BOOST_CHECK_THROW(ResolvedIndex::from_json(R"({"source":[4],"shape":[1],"positions":[9]})"), ValueError);
  BOOST_CHECK_THROW(ResolvedIndex::from_json(R"({"source":[4],"shape":[1]})"), FormatError);
}

BOOST_AUTO_TEST_CASE(take_and_put_equal_indexing_the_leaf) {
  // a leaf of batch [5, 4, 3] with feature dims [2]: take is leaf.index(idx), put is leaf.index_put_(idx, v)
  const BatchSize bs{5, 4, 3};
  const std::vector<Index> indices = {
      {},        {1},           {-1, 2},   {Slice(1, 4)}, {Slice(None, None, 2), 1}, {None, 0},
      {Ellipsis, 1}, {at::tensor({4, 0, 2}, at::kLong)}, {at::tensor({1, 0, 1, 0, 1}, at::kLong).to(at::kBool)},
  };
  const at::Tensor leaf = at::arange(5 * 4 * 3 * 2, at::kFloat).view({5, 4, 3, 2});
  for (const auto& idx : indices) {
    BOOST_TEST_CONTEXT(index_repr(idx)) {
      const ResolvedIndex r = ResolvedIndex::resolve(bs, idx);
      // the leaf's feature dims are not indexed: an Ellipsis stands for the batch dims only
      const at::Tensor want = idx.empty() ? leaf : leaf.index(convert_ellipsis(idx, 3));
      const at::Tensor got = r.take(leaf);
      BOOST_TEST(got.sizes() == want.sizes());
      BOOST_TEST(got.equal(want));
      if (r.row_range()) BOOST_TEST(got.is_alias_of(leaf));  // a run of whole rows is a view
      // put into a contiguous leaf and into a transposed (non-contiguous) one
      for (bool transposed : {false, true}) {
        at::Tensor dst = transposed ? at::zeros({5, 3, 4, 2}).transpose(1, 2) : at::zeros({5, 4, 3, 2});
        at::Tensor ref = at::zeros({5, 4, 3, 2});
        const at::Tensor value = at::rand(want.sizes()) + 1;
        r.put(dst, value);
        if (idx.empty()) {
          ref.copy_(value);
        } else {
          ref.index_put_(convert_ellipsis(idx, 3), value);
        }
        BOOST_TEST(dst.equal(ref));
      }
    }
  }
  // a value that broadcasts (one row for many) and one cast to the leaf's dtype
  const ResolvedIndex rows = ResolvedIndex::resolve(bs, {Slice(0, 2)});
  at::Tensor dst = at::zeros({5, 4, 3, 2}, at::kDouble);
  rows.put(dst, at::full({3, 2}, 7, at::kLong));
  BOOST_TEST(dst.index({Slice(0, 2)}).eq(7).all().item<bool>());
  BOOST_TEST(dst.index({Slice(2, None)}).eq(0).all().item<bool>());
  // errors: a leaf that does not start with the batch, a value that does not broadcast (nothing written)
  BOOST_CHECK_THROW(rows.take(at::zeros({4, 4, 3})), ValueError);
  BOOST_CHECK_THROW(rows.put(at::zeros({4, 4, 3}), at::zeros({2, 4, 3})), ValueError);
  at::Tensor untouched = at::zeros({5, 4, 3, 2});
  BOOST_CHECK_THROW(rows.put(untouched, at::ones({3, 3})), ValueError);
  BOOST_TEST(untouched.eq(0).all().item<bool>());
  // a 0-dim source: every position is its one element
  const ResolvedIndex scalar = ResolvedIndex::resolve({}, {None});
  at::Tensor one = at::zeros({2});
  BOOST_TEST(scalar.take(at::arange(2, at::kFloat)).sizes() == at::IntArrayRef({1, 2}));
  scalar.put(one, at::ones({1, 2}));
  BOOST_TEST(one.eq(1).all().item<bool>());
}

// a row's positions are written into the tensor remembered for the last row of the same shape once nothing holds
// it; a holder that set_ or resize_d it before letting it go leaves a tensor that is not reused (the rows were
// written through its data pointer: 64 bytes into 8)
BOOST_AUTO_TEST_CASE(remembered_positions_changed_by_their_holder_are_not_reused) {
  for (int how = 0; how < 2; ++how) {
    ResolvedIndex r = ResolvedIndex::resolve({100, 8}, {3});
    if (how == 0) r.positions().set_(at::empty({1}, at::kLong));
    if (how == 1) r.positions().resize_({2});
    r = ResolvedIndex::identity({1});
    const ResolvedIndex next = ResolvedIndex::resolve({100, 8}, {4});
    BOOST_TEST(next.positions().sizes().vec() == std::vector<int64_t>{8}, "how " << how);
    BOOST_TEST(next.positions().equal(at::arange(32, 40, at::kLong)), "how " << how);
  }
}

BOOST_AUTO_TEST_SUITE_END()
