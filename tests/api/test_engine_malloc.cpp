// malloc.keep_mb and malloc.huge_page_min_kb: an Engine makes glibc's malloc keep freed memory for reuse and puts
// large CPU tensors on huge pages (config/README.md). Its own file, so its own process under ctest: malloc starts
// there with glibc's defaults.
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "process_util.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;

namespace {
long minor_faults() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

//! minor page faults over `rounds` map calls of a cheap fn with 2 workers, after 5 warm-up calls: chunk
//! results made on the caller and on a helper, freed on the caller after the cat of them
long faults_of_map_rounds(int rounds) {
  const int64_t rows = 10000;
  TensorDict td({{"x", at::randn({rows, 64})}, {"y", at::randn({rows, 16})}}, {rows});
  MapFn fn = [](const TensorDict& c) { return c.apply([](const at::Tensor& t) { return t + 1; }); };
  long f0 = 0;
  for (int r = 0; r < rounds + 5; ++r) {
    if (r == 5) f0 = minor_faults();
    TensorDict out = td.map(fn, MapOptions().chunksize(1000).num_workers(2));
    if (out.batch_size()[0] != rows) return -1;
  }
  return minor_faults() - f0;
}

struct MappingInfo {
  uintptr_t start = 0;
  std::string flags;  // its VmFlags line, "" when no mapping holds the address
};
//! the mapping of this process that holds `p` (/proc/self/smaps)
MappingInfo mapping_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  MappingInfo found;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;  // a mapping's first line: "lo-hi perms offset dev inode path"
      if (inside) found.start = lo;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) {
      found.flags = line;
      return found;
    }
  }
  return {};
}
//! on a mapping of its own advised MADV_HUGEPAGE ("hg"), starting on a 2 MiB boundary, the data half a page
//! into it (never at a page start: see huge_page_allocator.hpp, kDataOffset)
bool on_huge_page_mapping(const at::Tensor& t) {
  const MappingInfo m = mapping_of(t.data_ptr());
  const auto data = reinterpret_cast<uintptr_t>(t.data_ptr());
  return m.flags.find(" hg") != std::string::npos && m.start % (uintptr_t{2} << 20) == 0 && data - m.start == 2048;
}
std::string vm_flags_of(const void* p) { return mapping_of(p).flags; }
}  // namespace

BOOST_AUTO_TEST_SUITE(engine_malloc)

BOOST_AUTO_TEST_CASE(freed_chunks_are_kept_for_reuse) {
  // malloc.keep_mb (default 64): a map call's chunk results and its 3.2 MB cat reuse the memory of the last
  // call instead of faulting it in again (glibc's defaults: 100-1,200 faults a call, measured with
  // TD_TEST_MALLOC_KEEP_MB=0; with the setting, under one a call)
  BOOST_TEST(Config::defaults().malloc_keep_mb == 64);
  const char* probe = std::getenv("TD_TEST_MALLOC_KEEP_MB");  // 0: shows the faults without the setting
  Engine engine(Config::load(std::string(R"({"malloc": {"keep_mb": )") + (probe ? probe : "64") + "}}"));
  const int rounds = 200;
  const long faults = faults_of_map_rounds(rounds);
  BOOST_TEST_MESSAGE("minor faults over " << rounds << " rounds: " << faults);
  BOOST_TEST(faults >= 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // a sanitizer's allocator replaces glibc's malloc (and its quarantine hands out fresh memory): the
  // setting does not apply there; the map results above are still checked
#else
  BOOST_TEST(faults < rounds * 20, faults);
#endif
  BOOST_CHECK_THROW(Config::load(R"({"malloc": {"keep_mb": -1}})"), ValueError);
  BOOST_CHECK_THROW(Config::load(R"({"malloc": {"keep_mb": 1025}})"), ValueError);
  BOOST_TEST(Config::load(R"({"malloc": {"keep_mb": 1024}})").malloc_keep_mb == 1024);
}

BOOST_AUTO_TEST_CASE(large_tensors_live_on_huge_pages) {
  // malloc.huge_page_min_kb (default 2048): once an Engine starts, CPU tensors of 2 to 64 MiB are 2 MiB-aligned
  // mappings advised MADV_HUGEPAGE ("hg" in smaps), freed ones reused best fit; smaller ones stay with libtorch's
  // allocator; 0 turns it off for the tensors made afterwards
  BOOST_TEST(Config::defaults().malloc_huge_page_min_kb == 2048);
  BOOST_CHECK_THROW(Config::load(R"({"malloc": {"huge_page_min_kb": -1}})"), ValueError);
  BOOST_CHECK_THROW(Config::load(R"({"malloc": {"huge_page_min_kb": 1048577}})"), ValueError);
  BOOST_CHECK_THROW(Config::load(R"({"malloc": {"huge_page_min_kb": "2048"}})"), TypeError);
  BOOST_TEST(Config::load(R"({"malloc": {"huge_page_min_kb": 1048576}})").malloc_huge_page_min_kb == 1048576);
  const int64_t mib = int64_t{1} << 20;
  {
    Engine engine;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    BOOST_TEST(huge_page_tensors_min_bytes() == 0u);  // their allocators must see every block
#else
    BOOST_TEST(huge_page_tensors_min_bytes() == size_t{2} << 20);
    at::Tensor big = at::empty({3 * mib}, at::kByte);
    BOOST_TEST(on_huge_page_mapping(big), vm_flags_of(big.data_ptr()));
    BOOST_TEST(!on_huge_page_mapping(at::empty({mib}, at::kByte)));
    // kernels' results and clones too, and the values are the values
    at::Tensor x = at::arange(mib, at::kFloat);  // 4 MiB
    at::Tensor y = x * 2 + 1;
    BOOST_TEST(on_huge_page_mapping(x));
    BOOST_TEST(on_huge_page_mapping(y));
    BOOST_TEST(y.equal(at::arange(mib, at::kDouble).mul(2).add(1).to(at::kFloat)));
    // a freed mapping serves the next request it fits up to 1.5x, and only those
    void* p = big.data_ptr();
    big = at::Tensor();
    at::Tensor smaller = at::empty({5 * mib / 2}, at::kByte);
    BOOST_TEST(smaller.data_ptr() == p);
    smaller.fill_(7);
    BOOST_TEST(smaller.sum().item<int64_t>() == 7 * (5 * mib / 2));
    smaller = at::Tensor();
    at::Tensor larger = at::empty({4 * mib}, at::kByte);  // does not fit in 3 MiB
    BOOST_TEST(larger.data_ptr() != p);
    BOOST_TEST(on_huge_page_mapping(larger));
    // more than the pool keeps (64 MiB): libtorch's allocator
    BOOST_TEST(!on_huge_page_mapping(at::empty({65 * mib}, at::kByte)));
    // a tensor that outlives the setting keeps its memory; new ones go to libtorch's allocator
    set_huge_page_tensors(0);
    BOOST_TEST(huge_page_tensors_min_bytes() == 0u);
    BOOST_TEST(!on_huge_page_mapping(at::empty({3 * mib}, at::kByte)));
    larger.fill_(1);
    BOOST_TEST(larger.sum().item<int64_t>() == 4 * mib);
#endif
  }
  {
    Engine off(Config::load(R"({"malloc": {"huge_page_min_kb": 0}})"));
    BOOST_TEST(huge_page_tensors_min_bytes() == 0u);
    BOOST_TEST(!on_huge_page_mapping(at::empty({8 * mib}, at::kByte)));
  }
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  {
    Engine four(Config::load(R"({"malloc": {"huge_page_min_kb": 4096}})"));
    BOOST_TEST(huge_page_tensors_min_bytes() == size_t{4} << 20);
    BOOST_TEST(!on_huge_page_mapping(at::empty({3 * mib}, at::kByte)));
    BOOST_TEST(on_huge_page_mapping(at::empty({4 * mib}, at::kByte)));
  }
#endif
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
BOOST_AUTO_TEST_CASE(children_forked_while_a_thread_allocates_can_allocate) {
  // the pool's lock is held across fork() (pthread_atfork): a child forked while another thread takes or gives
  // back a large tensor would otherwise inherit the lock held and hang on its first large tensor (without the
  // handlers, 6-7 of 40 children hung)
  Engine engine;
  std::atomic<bool> stop{false};
  std::thread churn([&stop] {
    while (!stop.load()) {
      at::Tensor t = at::empty({3 << 20}, at::kByte);
      t.data_ptr<uint8_t>()[0] = 1;
    }
  });
  // the children: no Boost.Test there
  const testutil::ForkOutcome r = testutil::fork_children(40, [] {
    at::Tensor t = at::empty({3 << 20}, at::kByte);
    t.fill_(2);
    return t.data_ptr<uint8_t>()[12345] == 2 ? 0 : 3;
  });
  stop = true;
  churn.join();
  BOOST_TEST(r.hung == 0);
  BOOST_TEST(r.failed == 0);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
