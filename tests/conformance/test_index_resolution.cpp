// One resolution per call (issue 34, item 4): on the store members of the zoo (HDF5 and Redis: files, groups,
// views, a typed wrapper), td[idx], get_at, td[idx] = TensorDict / tensor / scalar resolve the index once
// (ResolvedIndex::resolutions(), a process-wide count of resolve / compose) and pass the resolved form down;
// td[idx] = scalar / tensor writes the selected rows in ONE store request without reading them (the store
// actor's call count, and the bytes this process read: /proc/self/io rchar counts every read() / pread() of
// the HDF5 library and of the Redis client's socket); get_at reads the selected rows only.
#include <fstream>
#include <sstream>

#include <boost/test/unit_test.hpp>

#include "conformance/zoo.hpp"
#include "tensordict/resolved_index.hpp"

using namespace tensordict;
using at::indexing::Slice;
using conformance::Member;

namespace {

bool is_store_member(const Member& m) {
  return m.name.rfind("h5", 0) == 0 || m.name.rfind("redis", 0) == 0 || m.name == "typed_h5_td";
}

//! row reads and writes the store actor of td ran (HDF5, Redis)
int64_t store_calls(const TensorDict& td) {
  try {
    return PersistentTensorDict(td).store_stats().calls;
  } catch (const TypeError&) {
  }
  return TensorDictStore(td).store_stats().calls;
}

//! bytes this process has read through read() / pread() / recv-by-read so far (/proc/self/io, rchar)
int64_t bytes_read() {
  std::ifstream in("/proc/self/io");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("rchar:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor mask(std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); }

//! resolutions `f` makes
template <class F>
int64_t resolutions_of(F&& f) {
  const int64_t before = ResolvedIndex::resolutions();
  f();
  return ResolvedIndex::resolutions() - before;
}

//! the zoo's HDF5 file and Redis store with a large leaf "big" [2048, 512] f32 (4 MiB) and a small "r" [2048]
std::vector<std::pair<std::string, TensorDict>> big_stores() {
  TensorDict src(Dict{{"big", at::arange(2048 * 512, at::kFloat).view({2048, 512})}, {"r", at::arange(2048, at::kFloat)}},
                 {2048});
  std::vector<std::pair<std::string, TensorDict>> out;
  out.emplace_back("h5", TensorDict(PersistentTensorDict::from_dict(src, conformance::fresh_dir("big") + ".h5")));
  out.emplace_back("redis", TensorDict(TensorDictStore::from_tensordict(src, conformance::redis())));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(index_resolution)

BOOST_AUTO_TEST_CASE(an_index_is_resolved_once_per_call) {
  const std::vector<Index> reads = {{1}, {Slice(0, 3)}, {longs({0, 2})}, {mask({1, 0, 1, 1})},
                                    {0, longs({1, 2})}, {Slice(), 1}};
  int checked = 0;
  for (const Member& m : conformance::members()) {
    if (!is_store_member(m)) continue;
    BOOST_TEST_CONTEXT("zoo member " << m.name) {
      TensorDict td = m.make();
      const TensorDict ref = td.contiguous().clone();
      for (size_t i = 0; i < reads.size(); ++i) {
        BOOST_TEST_CONTEXT("index " << i) {
          const Index& idx = reads[i];
          TensorDict r;
          BOOST_TEST(resolutions_of([&] { r = td.index(idx); }) == 1);
          BOOST_TEST(r.get("a").equal(ref.get("a").index(idx)));
          at::Tensor c;
          BOOST_TEST(resolutions_of([&] { c = td.get_at("c", idx); }) == 1);
          BOOST_TEST(c.equal(ref.get("c").index(idx)));
        }
      }
      // writes: a TensorDict, a tensor, a scalar; each one resolution, values as the dense reference's
      const std::vector<Index> writes = {{1}, {Slice(1, 3)}, {longs({3, 0})}, {mask({1, 0, 1, 0})}};
      TensorDict expect = ref.clone();
      for (size_t i = 0; i < writes.size(); ++i) {
        BOOST_TEST_CONTEXT("write index " << i) {
          const Index& idx = writes[i];
          TensorDict v = ref.index(idx).clone();
          v.apply_([&](const at::Tensor& t) { return t.fill_(static_cast<double>(i) + 7); });
          BOOST_TEST(resolutions_of([&] { td.index_put_(idx, v); }) == 1);
          expect.index_put_(idx, v);
          if (i == 2) continue;  // a scalar or a tensor through an index list needs each leaf's dtype
          BOOST_TEST(resolutions_of([&] { td.index_put_(idx, at::Scalar(static_cast<int64_t>(i) + 20)); }) == 1);
          expect.index_put_(idx, at::Scalar(static_cast<int64_t>(i) + 20));
          if (i < 2) {  // basic indices convert a tensor's dtype (an index tensor or a mask needs each leaf's)
            const at::Tensor t = at::tensor(-1.5);
            BOOST_TEST(resolutions_of([&] { td.index_put_(idx, t); }) == 1);
            expect.index_put_(idx, t);
          }
          if (i < 2) {  // set_at_ on one leaf: an index on the batch dims resolves once too
            const at::Tensor c = at::full(ref.get("c").index(idx).sizes(), static_cast<int64_t>(i) + 40, at::kLong);
            BOOST_TEST(resolutions_of([&] { td.set_at_("c", c, idx); }) == 1);
            expect.set_at_("c", c, idx);
          }
          const TensorDict now = td.contiguous();
          for (const char* k : {"a", "b", "c"}) BOOST_TEST(now.get(k).equal(expect.get(k)), k);
        }
      }
      ++checked;
    }
  }
  BOOST_TEST(checked == 8);  // h5 file, group, view, typed h5; redis store, write-behind store, nested level, view
}

BOOST_AUTO_TEST_CASE(fill_writes_the_rows_without_reading_them) {
  for (auto& [name, td] : big_stores()) {
    BOOST_TEST_CONTEXT(name) {
      const int64_t leaf_bytes = 2048 * 512 * 4;
      // td[idx] = scalar: one store request (the write), and far fewer bytes read than the rows written
      const std::vector<Index> fills = {{Slice(100, 1100)}, {longs({7, 1500, 3, 900})}, {Slice(0, 2048, 2)}};
      for (size_t i = 0; i < fills.size(); ++i) {
        const int64_t calls = store_calls(td), bytes = bytes_read();
        td.index_put_(fills[i], at::Scalar(3.0));  // a float: the leaves' dtype (an index list needs it)
        BOOST_TEST(store_calls(td) - calls == 1, "one request: the write, no read of the rows");
        // (HDF5 itself reads the range a strided selection spans to write it: its data sieving)
        if (name == "redis" || i < 2) {
          BOOST_TEST(bytes_read() - bytes < leaf_bytes / 16, "bytes read by the write: " << bytes_read() - bytes);
        }
      }
      // td[idx] = a tensor that broadcasts over the selected rows of every leaf ([512] for "big" would not
      // fit "r": a 0-dim tensor fits both)
      const int64_t calls = store_calls(td), bytes = bytes_read();
      td.index_put_({Slice(2000, 2010)}, at::tensor(-2.0));
      BOOST_TEST(store_calls(td) - calls == 1);
      BOOST_TEST(bytes_read() - bytes < leaf_bytes / 16);
      // set_at_ of one leaf's rows: the same (a row broadcast over the selected rows)
      for (const Index& idx : std::vector<Index>{{Slice(1200, 1300)}, {longs({11, 1999})}}) {
        const int64_t c0 = store_calls(td), b0 = bytes_read();
        td.set_at_("big", at::full({512}, 5.0), idx);
        BOOST_TEST(store_calls(td) - c0 == 1);
        BOOST_TEST(bytes_read() - b0 < leaf_bytes / 16, "bytes read by set_at_: " << bytes_read() - b0);
      }
      // the values, read back
      const at::Tensor big = td.get("big");
      at::Tensor want = at::arange(2048 * 512, at::kFloat).view({2048, 512});
      want.index_put_({Slice(100, 1100)}, 3);
      want.index_put_({longs({7, 1500, 3, 900})}, 3);
      want.index_put_({Slice(0, 2048, 2)}, 3);
      want.index_put_({Slice(2000, 2010)}, -2);
      want.index_put_({Slice(1200, 1300)}, 5);
      want.index_put_({longs({11, 1999})}, 5);
      BOOST_TEST(big.equal(want));
      BOOST_TEST(td.get("r").index({Slice(2000, 2010)}).eq(-2).all().item<bool>());
    }
  }
}

BOOST_AUTO_TEST_CASE(get_at_reads_the_selected_rows_only) {
  for (auto& [name, td] : big_stores()) {
    BOOST_TEST_CONTEXT(name) {
      const int64_t leaf_bytes = 2048 * 512 * 4;
      const at::Tensor want = at::arange(2048 * 512, at::kFloat).view({2048, 512});
      for (const Index& idx : std::vector<Index>{{5}, {Slice(10, 20)}, {longs({2000, 3, 3})}}) {
        const int64_t calls = store_calls(td), bytes = bytes_read();
        const at::Tensor got = td.get_at("big", idx);
        BOOST_TEST(store_calls(td) - calls == 1);
        BOOST_TEST(bytes_read() - bytes < leaf_bytes / 16, "bytes read by get_at: " << bytes_read() - bytes);
        BOOST_TEST(got.equal(want.index(idx)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_write_that_does_not_fit_writes_nothing) {
  // the value is broadcast to every selected leaf before the one request: a shape that fits no leaf, or an
  // index that is out of range, leaves the store as it was
  for (const Member& m : conformance::members()) {
    if (!is_store_member(m)) continue;
    BOOST_TEST_CONTEXT("zoo member " << m.name) {
      TensorDict td = m.make();
      const TensorDict ref = td.contiguous().clone();
      const int64_t calls = store_calls(td);
      BOOST_CHECK_THROW(td.index_put_({Slice(0, 2)}, at::zeros({7})), RuntimeError);
      BOOST_CHECK_THROW(td.index_put_({9}, at::Scalar(1)), IndexError);
      BOOST_CHECK_THROW(td.index_put_({Slice(), 5}, at::Scalar(1)), IndexError);
      BOOST_CHECK_THROW(td.index_put_({longs({0, 1})}, at::Scalar(1)), RuntimeError);  // dtypes (float leaves)
      BOOST_TEST(store_calls(td) == calls);
      const TensorDict now = td.contiguous();
      for (const char* k : {"a", "b", "c"}) BOOST_TEST(now.get(k).equal(ref.get(k)), k);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
