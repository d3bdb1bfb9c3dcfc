// Leak soaks (issue "Hardening"): thousands of open / use / close cycles of every storage kind, store and map,
// counting the process's file descriptors, memory mappings, threads, shared-memory segments and RSS before
// and after. A warm-up round first creates what lives for the whole process (the default engine, its
// threads, libhdf5's globals), then the counts must not grow.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "redis_server.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;

namespace {

int64_t count_dir(const std::string& path, const std::string& prefix = "") {
  int64_t n = 0;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (prefix.empty() || name.compare(0, prefix.size(), prefix) == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

int64_t count_lines(const std::string& path) {
  std::ifstream f(path);
  int64_t n = 0;
  std::string line;
  while (std::getline(f, line)) ++n;
  return n;
}

int64_t rss_kib() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

struct Counts {
  int64_t fds, maps, threads, shm, rss_kib;
};

//! the counts once the threads of actors that just stopped have exited (they end asynchronously): waits,
//! bounded (3 s), for the thread count to come down to `threads_at_most`
Counts counts(int64_t threads_at_most = 1 << 30) {
  for (int i = 0; i < 300 && count_dir("/proc/self/task") > threads_at_most; ++i) ::usleep(10000);
  // this process' segments only ("<prefix><pid>_..."): other test processes share the prefix
  const std::string mine = tensordict::shm_prefix() + std::to_string(::getpid()) + "_";
  return {count_dir("/proc/self/fd"), count_lines("/proc/self/maps"), count_dir("/proc/self/task"),
          count_dir("/dev/shm", mine), rss_kib()};
}

//! runs `cycle` 50 times (warm-up), then n times in two halves, taking the counts after each. A leak grows in
//! both halves; what lives for the whole process (a scheduler thread started on first need, a scratch segment)
//! appears once. So the second half must not grow at all, and the whole run by at most one of each.
//! Mappings may move by a few (malloc arenas); RSS may grow by allocator caching within `rss_slack_kib`.
void run_soak(const std::string& what, int n, const std::function<void(int)>& cycle, int64_t rss_slack_kib = 32768) {
  for (int i = 0; i < 50; ++i) cycle(i);
  Counts c0 = counts();
  for (int i = 0; i < n / 2; ++i) cycle(i);
  Counts c1 = counts(c0.threads);
  for (int i = n / 2; i < n; ++i) cycle(i);
  Counts c2 = counts(c1.threads);
  BOOST_TEST_MESSAGE(what << ": " << n << " cycles; fds " << c0.fds << " -> " << c1.fds << " -> " << c2.fds
                          << ", maps " << c0.maps << " -> " << c1.maps << " -> " << c2.maps << ", threads "
                          << c0.threads << " -> " << c1.threads << " -> " << c2.threads << ", shm " << c0.shm
                          << " -> " << c1.shm << " -> " << c2.shm << ", rss KiB " << c0.rss_kib << " -> "
                          << c1.rss_kib << " -> " << c2.rss_kib);
  BOOST_TEST(c2.fds <= c1.fds, what << ": file descriptors grew " << c1.fds << " -> " << c2.fds);
  BOOST_TEST(c2.threads <= c1.threads, what << ": threads grew " << c1.threads << " -> " << c2.threads);
  BOOST_TEST(c2.shm <= c1.shm, what << ": shm segments grew " << c1.shm << " -> " << c2.shm);
  BOOST_TEST(c2.fds <= c0.fds + 1, what << ": file descriptors grew " << c0.fds << " -> " << c2.fds);
  BOOST_TEST(c2.threads <= c0.threads + 1, what << ": threads grew " << c0.threads << " -> " << c2.threads);
  BOOST_TEST(c2.shm <= c0.shm + 1, what << ": shm segments grew " << c0.shm << " -> " << c2.shm);
  BOOST_TEST(c2.maps <= c1.maps + 8, what << ": mappings grew " << c1.maps << " -> " << c2.maps);
  BOOST_TEST(c2.rss_kib <= c0.rss_kib + rss_slack_kib,
             what << ": RSS grew " << c0.rss_kib << " -> " << c2.rss_kib << " KiB");
}

TensorDict sample_td(int64_t rows = 64) {
  return TensorDict({{"obs", at::randn({rows, 8})}, {"label", at::arange(rows)}}, {rows});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(soak)

BOOST_AUTO_TEST_CASE(memmap_load_use_close_10000) {
  fixtures::TempDir dir("soak");
  sample_td().memmap(dir.path + "/td");
  run_soak("memmap", 10000, [&](int i) {
    TensorDict td = TensorDict::load_memmap(dir.path + "/td");
    BOOST_REQUIRE(td.get("label")[i % 64].item<int64_t>() == i % 64);
  });
}

BOOST_AUTO_TEST_CASE(shared_memory_share_attach_release_10000) {
  {  // the segment counter sees this process' segments
    const int64_t none = counts().shm;
    TensorDict held = sample_td(8);
    held.share_memory_();
    BOOST_TEST(counts().shm > none);
  }
  run_soak("shared", 10000, [&](int i) {
    TensorDict td = sample_td(8);
    td.share_memory_();
    TensorDict other = tensordict::from_share_handle(share_handle(td));
    BOOST_REQUIRE(other.get("label")[i % 8].item<int64_t>() == i % 8);
  });
}

BOOST_AUTO_TEST_CASE(hdf5_open_read_close_10000) {
  fixtures::TempDir dir("soak");
  const std::string file = dir.path + "/td.h5";
  PersistentTensorDict::from_dict(sample_td(), file).close();
  run_soak("hdf5", 10000, [&](int i) {
    PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
    BOOST_REQUIRE(h5.index({i % 64}).get("label").item<int64_t>() == i % 64);
    h5.close();
  });
}

BOOST_AUTO_TEST_CASE(redis_connect_read_close_10000) {
  testutil::RedisServer server;
  RedisOptions opts = RedisOptions().port(server.port());
  TensorDictStore store = TensorDictStore::from_tensordict(sample_td(), opts);
  const std::string id = store.td_id();
  run_soak("redis", 10000, [&](int i) {
    TensorDictStore s = TensorDictStore::from_store(id, opts);
    BOOST_REQUIRE(s.index({i % 64}).get("label").item<int64_t>() == i % 64);
    s.close();
  });
  store.close();
}

BOOST_AUTO_TEST_CASE(store_open_write_close_10000) {
  fixtures::TempDir dir("soak");
  TensorDict buf = sample_td().memmap(dir.path + "/buf");
  run_soak("store", 10000, [&](int i) {
    Store store = Store::open(buf);
    store.set_({i % 64}, TensorDict({{"obs", at::full({8}, float(i))}, {"label", at::full({}, int64_t(i % 64))}}, {}));
  });
}

BOOST_AUTO_TEST_CASE(map_calls_10000) {
  TensorDict td = sample_td(256);
  MapOptions o = MapOptions().num_workers(2).chunksize(64);
  run_soak("map", 10000, [&](int) {
    TensorDict out = td.map([](const TensorDict& c) { return c.apply([](const at::Tensor& t) { return t + 1; }); }, o);
    BOOST_REQUIRE(out.get("label")[3].item<int64_t>() == 4);
  });
}

BOOST_AUTO_TEST_CASE(loader_epochs_10000) {
  TensorDict td = sample_td(64);
  run_soak("loader", 10000, [&](int i) {
    DataLoader loader(td, LoaderOptions().batch_size(16).shuffle(true).seed(i).num_workers(2));
    int64_t rows = 0;
    for (TensorDict batch : loader) rows += batch.len();
    BOOST_REQUIRE(rows == 64);
  });
}

BOOST_AUTO_TEST_SUITE_END()
