// Memory-mapped files as tensors: map_file / create_file / write_file / anonymous mappings / registry.
#include <boost/test/unit_test.hpp>

#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "backends_test_util.hpp"
#include "fs_util.hpp"
#include "process_util.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/errors.hpp"

namespace be = tensordict::backends;
using tensordict::BackendError;
using tensordict::FormatError;
using tensordict::TypeError;
using tensordict::ValueError;

namespace {
size_t count_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  BOOST_TEST_REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}
int64_t file_size(const std::string& p) {
  struct stat st;
  BOOST_TEST_REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_size;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(memmap_file)

BOOST_AUTO_TEST_CASE(write_then_map_read_only_is_copy_on_write) {
  td_test::TempDir tmp;
  at::Tensor src = at::arange(12, at::kFloat).reshape({3, 4});
  const std::string f = tmp / "x.memmap";
  BOOST_TEST(be::write_file(f, src) == 48);
  BOOST_TEST(file_size(f) == 48);
  at::Tensor m = be::map_file(f, at::kFloat, {3, 4}, /*writable=*/false);
  BOOST_TEST(m.is_contiguous());
  BOOST_TEST(at::equal(m, src));
  m.add_(100);  // private mapping: in-place works, the file is untouched
  BOOST_TEST(m[0][0].item<float>() == 100.0f);
  at::Tensor again = be::map_file(f, at::kFloat, {3, 4}, false);
  BOOST_TEST(at::equal(again, src));
  auto info = be::mapping_of(m);
  BOOST_TEST_REQUIRE(info.has_value());
  BOOST_TEST(info->filename == f);
  BOOST_TEST(!info->writable);
  BOOST_TEST(!info->anonymous);
  BOOST_TEST(info->nbytes == 48);
}

BOOST_AUTO_TEST_CASE(writable_mapping_writes_through) {
  td_test::TempDir tmp;
  const std::string f = tmp / "w.memmap";
  be::write_file(f, at::zeros({4}, at::kLong));
  {
    at::Tensor m = be::map_file(f, at::kLong, {4}, /*writable=*/true);
    m[2] = int64_t{1} << 40;
    be::flush(m);
    at::Tensor other = be::map_file(f, at::kLong, {4}, false);  // a second mapping sees it at once
    BOOST_TEST(other[2].item<int64_t>() == (int64_t{1} << 40));
    BOOST_TEST(be::mapping_of(m)->writable);
  }
  std::string bytes = td_test::read_file(f);
  int64_t v;
  std::memcpy(&v, bytes.data() + 16, 8);
  BOOST_TEST(v == (int64_t{1} << 40));
}

BOOST_AUTO_TEST_CASE(pwrite_into_mapping_writes_long_unaligned_views_whole) {
  // pwrite_into_mapping writes in pieces of at most 256 KiB that end on 256 KiB file offsets: a view that
  // starts mid-piece and spans several pieces lands whole, byte for byte, and nothing around it changes
  td_test::TempDir tmp;
  const std::string f = tmp / "p.memmap";
  const int64_t n = (1 << 20) + 77;  // int32: ~4 MiB
  be::write_file(f, at::full({n}, -1, at::kInt));
  at::Tensor m = be::map_file(f, at::kInt, {n}, /*writable=*/true);
  const int64_t start = 12345, len = 700001;  // bytes 49,380 .. 2,849,384: 12 pieces, neither end aligned
  at::Tensor src = at::arange(len, at::kLong);  // converted to the view's dtype
  BOOST_TEST(be::pwrite_into_mapping(m.narrow(0, start, len), src));
  BOOST_TEST(m.narrow(0, start, len).equal(src.to(at::kInt)));  // the mapping sees the page cache
  BOOST_TEST((m.narrow(0, 0, start) == -1).all().item<bool>());
  BOOST_TEST((m.narrow(0, start + len, n - start - len) == -1).all().item<bool>());
  const std::string bytes = td_test::read_file(f);
  BOOST_REQUIRE(bytes.size() == static_cast<size_t>(n) * 4);
  bool same = true;
  for (int64_t i = 0; i < len && same; ++i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + (start + i) * 4, 4);
    same = v == static_cast<int32_t>(i);
  }
  BOOST_TEST(same);
  // not a view of a writable file mapping: false, nothing written
  BOOST_TEST(!be::pwrite_into_mapping(at::zeros({len}, at::kInt), src));
  BOOST_TEST(!be::pwrite_into_mapping(m.narrow(0, start, len), src.narrow(0, 0, len - 1)));
}

BOOST_AUTO_TEST_CASE(pwrite_into_mapping_never_writes_a_file_renamed_over_the_mapped_one) {
  // the mapped file's name now leads to another file (renamed over it, as a later save switches a directory
  // in): pwrite_into_mapping writes nothing by that name and says so, the caller's stores reach the mapping (the
  // map path's fallback, engine/src/map.cpp), and the replacing file keeps its bytes
  td_test::TempDir tmp;
  const std::string f = tmp / "leaf.memmap";
  const std::string other = tmp / "other.memmap";
  const int64_t rows = 128 * 1024, cols = 4;  // 2 MiB of int32: past allocate_for_write's 256 KiB floor
  be::write_file(f, at::zeros({rows, cols}, at::kInt));
  at::Tensor m = be::map_file(f, at::kInt, {rows, cols}, /*writable=*/true);
  be::write_file(other, at::full({rows, cols}, 5, at::kInt));
  const std::string before = td_test::read_file(other);
  BOOST_REQUIRE(::rename(other.c_str(), f.c_str()) == 0);
  const at::Tensor src = at::arange(100000 * cols, at::kInt).view({100000, cols});
  at::Tensor view = m.narrow(0, 7, 100000);
  BOOST_TEST(!be::allocate_for_write(view));
  if (!be::pwrite_into_mapping(view, src)) view.copy_(src);  // the map path: stores through the mapping
  BOOST_TEST(view.equal(src));
  BOOST_TEST((m.narrow(0, 0, 7) == 0).all().item<bool>());
  BOOST_TEST(td_test::read_file(f) == before);  // the replacing file: untouched
  // the name removed: nothing to write by name either
  BOOST_REQUIRE(::unlink(f.c_str()) == 0);
  BOOST_TEST(!be::pwrite_into_mapping(view, src));
  BOOST_TEST(!td_test::exists(f));
}

BOOST_AUTO_TEST_CASE(pwrite_into_mapping_writes_one_view_at_a_time_per_mapping) {
  // two threads writing views of one mapping take turns view by view (not 256 KiB piece by piece): when both
  // write the same 3 MiB range, it ends up wholly one writer's, never a mix, round after round; disjoint views
  // written at the same time all land. The threads only write; every check runs here after they join.
  td_test::TempDir tmp;
  const std::string f = tmp / "t.memmap";
  const int64_t n = 3 << 18;  // int32: 3 MiB, 12 pieces
  be::write_file(f, at::zeros({2 * n}, at::kInt));
  at::Tensor m = be::map_file(f, at::kInt, {2 * n}, /*writable=*/true);
  const at::Tensor ones = at::ones({n}, at::kInt), twos = at::full({n}, 2, at::kInt);
  int mixed = 0, failed = 0, by_one = 0, by_two = 0;
  for (int round = 0; round < 100; ++round) {
    std::atomic<int> errors{0}, ready{0};
    auto write = [&](const at::Tensor& src) {
      ++ready;
      for (int spins = 0; ready.load() < 2 && spins < 100000000; ++spins) {  // start together (bounded)
      }
      errors += !be::pwrite_into_mapping(m.narrow(0, 0, n), src);
    };
    std::thread a(write, std::cref(ones)), b(write, std::cref(twos));
    a.join();
    b.join();
    failed += errors.load();
    const at::Tensor got = m.narrow(0, 0, n);
    if (got.equal(ones)) ++by_one;
    else if (got.equal(twos)) ++by_two;
    else ++mixed;
  }
  BOOST_TEST(failed == 0);
  BOOST_TEST(mixed == 0);
  BOOST_TEST(by_one + by_two == 100);
  // disjoint views of 100,003 ints each, written by two threads at once, all land
  const int64_t v = 100003, k = n * 2 / v;
  std::atomic<int> errors{0};
  auto writer = [&](int64_t parity) {
    for (int64_t i = parity; i < k; i += 2) errors += !be::pwrite_into_mapping(m.narrow(0, i * v, v), at::full({v}, i + 10, at::kInt));
  };
  std::thread a(writer, 0), b(writer, 1);
  a.join();
  b.join();
  BOOST_TEST(errors.load() == 0);
  bool all = true;
  for (int64_t i = 0; i < k && all; ++i) all = (m.narrow(0, i * v, v) == i + 10).all().item<bool>();
  BOOST_TEST(all);
}

BOOST_AUTO_TEST_CASE(large_writes_allocate_their_file_blocks_first) {
  // allocate_for_write, and pwrite_into_mapping through it, allocate the file blocks of a large range in one
  // call (fallocate) before it is written, instead of the filesystem reserving each 4 KiB block as the write goes
  // (ext4's delayed allocation): the range shows allocated extents at once, never delayed ones, and the rest of
  // the sparse file stays a hole. Ranges under 256 KiB, private and anonymous mappings, tensors not mapped here
  // and files on tmpfs are left alone.
  td_test::TempDir tmp;
  const std::string f = tmp / "a.memmap";
  constexpr int64_t MiB = 1 << 20;
  be::create_file(f, 8 * MiB);
  at::Tensor m = be::map_file(f, at::kByte, {8 * MiB}, /*writable=*/true);
  const bool check = testutil::reports_delayed_allocation(f);
  if (!check) BOOST_TEST_MESSAGE("the test directory is not on ext4 or xfs: file extents are not checked");
  bool ok = false;
  if (check) {
    BOOST_TEST(testutil::file_extents(f, &ok).empty());
    BOOST_TEST(ok);
  }
  const bool allocated = be::allocate_for_write(m.narrow(0, MiB, 2 * MiB));
  BOOST_TEST(!be::allocate_for_write(m.narrow(0, 3 * MiB + 4096, 100 << 10)));  // under 256 KiB
  at::Tensor src = at::randint(0, 255, {3 * MiB}, at::kByte);
  BOOST_TEST(be::pwrite_into_mapping(m.narrow(0, 4 * MiB, 3 * MiB), src));
  BOOST_TEST(m.narrow(0, 4 * MiB, 3 * MiB).equal(src));
  BOOST_TEST(m.narrow(0, 0, 4 * MiB).eq(0).all().item<bool>());  // allocated blocks read as zeros
  BOOST_TEST(m.narrow(0, 7 * MiB, MiB).eq(0).all().item<bool>());
  if (check) {
    BOOST_TEST(allocated);
    const auto ext = testutil::file_extents(f, &ok);
    BOOST_TEST_REQUIRE(ok);
    BOOST_TEST_REQUIRE(ext.size() == 2u);
    BOOST_TEST(ext[0].begin == MiB);  // [0, 1 MiB) and [3, 4 MiB) stay holes: the 100 KiB range was left alone
    BOOST_TEST(ext[0].end == 3 * MiB);
    BOOST_TEST(ext[0].unwritten);
    BOOST_TEST(ext[1].begin == 4 * MiB);  // [7, 8 MiB) stays a hole
    BOOST_TEST(ext[1].end == 7 * MiB);
    BOOST_TEST(!ext[0].delalloc);
    BOOST_TEST(!ext[1].delalloc);  // without allocation ahead, the write leaves delayed blocks here
  }
  // write_file allocates the whole file first
  const std::string g = tmp / "w.memmap";
  be::write_file(g, src);
  BOOST_TEST(be::map_file(g, at::kByte, {3 * MiB}, false).equal(src));
  if (check) {
    const auto whole = testutil::file_extents(g, &ok);
    BOOST_TEST_REQUIRE(ok);
    BOOST_TEST_REQUIRE(whole.size() == 1u);
    BOOST_TEST(whole[0].begin == 0);
    BOOST_TEST(whole[0].end == 3 * MiB);
    BOOST_TEST(!whole[0].delalloc);
  }
  // what is left alone
  at::Tensor priv = be::map_file(f, at::kByte, {8 * MiB}, /*writable=*/false);
  BOOST_TEST(!be::allocate_for_write(priv.narrow(0, 0, MiB)));
  BOOST_TEST(!be::allocate_for_write(be::map_anonymous(at::kByte, {2 * MiB})));
  BOOST_TEST(!be::allocate_for_write(at::zeros({2 * MiB}, at::kByte)));
  BOOST_TEST(!be::allocate_for_write(m.view({8, MiB}).narrow(1, 0, MiB / 2)));  // not contiguous
  const std::string shm = "/dev/shm/td-test-alloc-" + std::to_string(::getpid());
  be::create_file(shm, 2 * MiB);
  {
    at::Tensor t = be::map_file(shm, at::kByte, {2 * MiB}, /*writable=*/true);
    BOOST_TEST(!be::allocate_for_write(t));  // tmpfs: fallocate would zero-fill pages the write fills anyway
    BOOST_TEST(be::pwrite_into_mapping(t, src.narrow(0, 0, 2 * MiB)));
    BOOST_TEST(t.equal(src.narrow(0, 0, 2 * MiB)));
  }
  ::unlink(shm.c_str());
}

BOOST_AUTO_TEST_CASE(stores_reserve_the_256_KiB_blocks_they_reach) {
  // reserve_for_store, before stores through a mapping: any size, one fallocate per 256 KiB block of the file the
  // first time a store reaches it, clipped to the mapping's bytes; the rest of the file stays a hole. In-memory
  // tensors, private and anonymous mappings are left alone, told apart without a lookup (reserves_stores)
  td_test::TempDir tmp;
  const std::string f = tmp / "r.memmap";
  constexpr int64_t KiB = 1024, Block = 256 * KiB;
  be::create_file(f, 4 * Block + 4096);
  // a mapping of the file from byte 4096: its blocks are the file's, clipped to [4096, 4 blocks + 4096)
  at::Tensor m = be::map_file(f, at::kByte, {4 * Block}, /*writable=*/true, 4096);
  BOOST_TEST(be::reserves_stores(m));
  BOOST_TEST(be::reserves_stores(m.narrow(0, 10, 20)));  // any view of the storage
  BOOST_TEST(!be::reserves_stores(at::zeros({16}, at::kByte)));
  BOOST_TEST(!be::reserves_stores(be::map_file(f, at::kByte, {4 * Block}, /*writable=*/false, 4096)));
  BOOST_TEST(!be::reserves_stores(be::map_anonymous(at::kByte, {Block})));
  BOOST_TEST(!be::reserves_stores(at::Tensor()));
  be::reserve_for_store(at::zeros({16}, at::kByte));  // does nothing
  // 1 KiB at mapping offset Block + 100: file bytes [Block + 4196, Block + 5220), inside the file's block 1
  char* p = static_cast<char*>(m.data_ptr());
  be::reserve_for_store(m, p + Block + 100, KiB);
  std::memset(p + Block + 100, 7, KiB);
  // a whole view that ends exactly at the mapping's end: the file's blocks 3 and 4, the last clipped
  be::reserve_for_store(m.narrow(0, 3 * Block, Block));
  m.narrow(0, 3 * Block, Block).fill_(9);
  // reaching past the mapping: nothing
  be::reserve_for_store(m, p + 4 * Block - 10, 20);
  BOOST_TEST(m.narrow(0, Block + 100, KiB).eq(7).all().item<bool>());
  const auto found = testutil::extents_to_check(f);
  if (!found) { BOOST_TEST_MESSAGE(testutil::kExtentsNotChecked); return; }
  const std::vector<testutil::Extent>& ext = *found;
  BOOST_TEST_REQUIRE(ext.size() == 2u);
  BOOST_TEST(ext[0].begin == Block);  // the file's block 1, whole: blocks 0 and 2 stay holes
  BOOST_TEST(ext[0].end == 2 * Block);
  BOOST_TEST(!ext[0].delalloc);  // reserved before the store: without it, a delayed block
  BOOST_TEST(ext[1].begin == 3 * Block);
  BOOST_TEST(ext[1].end == 4 * Block + 4096);  // clipped to the file's last mapped byte
  BOOST_TEST(!ext[1].delalloc);
}

BOOST_AUTO_TEST_CASE(offsets_and_longer_files) {
  td_test::TempDir tmp;
  const std::string f = tmp / "o.memmap";
  at::Tensor data = at::arange(3000, at::kInt);  // 12000 bytes: crosses page boundaries
  be::write_file(f, data);
  at::Tensor a = be::map_file(f, at::kInt, {2}, false, 8);  // unaligned offset
  BOOST_TEST(a[0].item<int>() == 2);
  BOOST_TEST(a[1].item<int>() == 3);
  at::Tensor b = be::map_file(f, at::kInt, {10}, true, 4096 + 12);  // offset beyond the first page
  BOOST_TEST(b[0].item<int>() == 1027);
  BOOST_TEST(be::mapping_of(b)->file_offset == 4096 + 12);
  b[0] = -5;
  BOOST_TEST(be::map_file(f, at::kInt, {1}, false, 4096 + 12).item<int>() == -5);
  // longer file than the shape needs: accepted, trailing bytes ignored
  at::Tensor head = be::map_file(f, at::kInt, {5}, false);
  BOOST_TEST(at::equal(head, at::arange(5, at::kInt)));
}

BOOST_AUTO_TEST_CASE(too_short_file_is_a_format_error_naming_the_file) {
  td_test::TempDir tmp;
  const std::string f = tmp / "short.memmap";
  be::write_file(f, at::ones({3}, at::kFloat));  // 12 bytes
  td_test::check_throws<FormatError>([&] { be::map_file(f, at::kFloat, {4}, false); },
                                     {"FormatError", f, "expected at least 16 bytes", "found 12"});
  td_test::check_throws<FormatError>([&] { be::map_file(f, at::kFloat, {4}, true); }, {f, "16"});
  td_test::check_throws<FormatError>([&] { be::map_file(f, at::kFloat, {3}, false, 4); },
                                     {"expected at least 16 bytes", "offset 4"});
  BOOST_TEST(file_size(f) == 12);  // never grown silently
}

BOOST_AUTO_TEST_CASE(bad_arguments_and_os_errors) {
  td_test::TempDir tmp;
  const std::string missing = tmp / "missing.memmap";
  td_test::check_throws<BackendError>([&] { be::map_file(missing, at::kFloat, {2}, false); }, {missing, "No such file"});
  td_test::check_throws<BackendError>([&] { be::map_file(missing, at::kFloat, {2}, true); }, {missing});
  td_test::check_throws<ValueError>([&] { be::map_file(missing, at::kFloat, {-1, 2}, false); }, {"negative dimension"});
  td_test::check_throws<ValueError>([&] { be::map_file(missing, at::kFloat, {2}, false, -8); }, {"negative offset"});
  td_test::check_throws<ValueError>(
      [&] { be::map_file(missing, at::kDouble, {int64_t{1} << 40, int64_t{1} << 40}, false); }, {"overflows"});
  td_test::check_throws<ValueError>([&] { be::map_file(tmp.path, at::kFloat, {2}, false); }, {"not a regular file"});
  td_test::check_throws<ValueError>([&] { be::create_file(tmp / "neg", -1); }, {"negative size"});
  td_test::check_throws<BackendError>([&] { be::create_file(tmp / "no/such/dir/f", 8); }, {"cannot create"});
  td_test::check_throws<BackendError>([&] { be::write_file(tmp / "no/such/dir/f", at::ones({2})); }, {"cannot create"});
  td_test::check_throws<ValueError>([&] { be::write_file(tmp / "u", at::Tensor()); }, {"undefined"});
  td_test::check_throws<TypeError>([&] { be::write_file(tmp / "s", at::ones({2, 2}).to_sparse()); }, {"strided"});
  td_test::check_throws<ValueError>([&] { be::flush(at::ones({2})); }, {"not a memory-mapped tensor"});
  td_test::check_throws<ValueError>([&] { be::flush(at::Tensor()); }, {"not a memory-mapped tensor"});
  BOOST_TEST(!be::mapping_of(at::ones({2})).has_value());
  BOOST_TEST(!be::mapping_of(at::Tensor()).has_value());
  BOOST_TEST(!be::mapped_filename(at::ones({2})).has_value());
}

BOOST_AUTO_TEST_CASE(zero_size_shapes_need_no_file) {
  td_test::TempDir tmp;
  const std::string f = tmp / "never.memmap";
  at::Tensor e = be::map_file(f, at::kFloat, {0, 5}, true);
  BOOST_TEST(e.numel() == 0);
  BOOST_TEST(e.sizes().vec() == (std::vector<int64_t>{0, 5}));
  BOOST_TEST(!td_test::exists(f));
  at::Tensor c = be::create_and_map(f, at::kLong, {3, 0});
  BOOST_TEST(c.numel() == 0);
  BOOST_TEST(!td_test::exists(f));  // like Python: no file for an empty tensor
  BOOST_TEST(be::map_anonymous(at::kFloat, {0}).numel() == 0);
  // write_file still creates the (empty) file; write_and_map maps nothing
  at::Tensor w = be::write_and_map(f, at::empty({0}, at::kFloat));
  BOOST_TEST(td_test::exists(f));
  BOOST_TEST(file_size(f) == 0);
  BOOST_TEST(w.numel() == 0);
}

BOOST_AUTO_TEST_CASE(create_file_is_sparse_zeroed_and_truncates) {
  td_test::TempDir tmp;
  const std::string f = tmp / "big.memmap";
  const int64_t n = int64_t{256} << 20;  // 256 MiB, no RAM and (almost) no disk used
  be::create_file(f, n);
  struct stat st;
  BOOST_TEST_REQUIRE(::stat(f.c_str(), &st) == 0);
  BOOST_TEST(st.st_size == n);
  BOOST_TEST(st.st_blocks * 512 < int64_t{1} << 20);
  {
    at::Tensor m = be::map_file(f, at::kByte, {n}, true);
    BOOST_TEST(m[n - 1].item<uint8_t>() == 0);
    m[7] = 9;
  }
  be::create_file(f, 16);  // existing contents are discarded: zeros again
  BOOST_TEST(file_size(f) == 16);
  BOOST_TEST(be::map_file(f, at::kByte, {16}, false).sum().item<int64_t>() == 0);
  at::Tensor z = be::create_and_map(tmp / "z.memmap", at::kDouble, {2, 3});
  BOOST_TEST(at::equal(z, at::zeros({2, 3}, at::kDouble)));
  BOOST_TEST(be::mapped_filename(z).value() == tmp / "z.memmap");
  z.fill_(1.5);
  BOOST_TEST(be::map_file(tmp / "z.memmap", at::kDouble, {6}, false).sum().item<double>() == 9.0);
}

BOOST_AUTO_TEST_CASE(symlinks_are_refused_for_writing) {
  td_test::TempDir tmp;
  const std::string target = tmp / "target";
  td_test::write_text(target, "precious");
  const std::string link = tmp / "link.memmap";
  BOOST_TEST_REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  td_test::check_throws<ValueError>([&] { be::create_file(link, 8); }, {"ValueError", "symlink", link});
  td_test::check_throws<ValueError>([&] { be::write_file(link, at::ones({2})); }, {"symlink", link});
  td_test::check_throws<ValueError>([&] { be::write_and_map(link, at::ones({2})); }, {"symlink"});
  td_test::check_throws<ValueError>([&] { be::create_and_map(link, at::kFloat, {2}); }, {"symlink"});
  BOOST_TEST(td_test::read_file(target) == "precious");
  // dangling symlinks too (O_NOFOLLOW would otherwise create the target)
  const std::string dangling = tmp / "dangling.memmap";
  BOOST_TEST_REQUIRE(::symlink((tmp / "nowhere").c_str(), dangling.c_str()) == 0);
  td_test::check_throws<ValueError>([&] { be::create_file(dangling, 8); }, {"symlink"});
  BOOST_TEST(!td_test::exists(tmp / "nowhere"));
}

BOOST_AUTO_TEST_CASE(write_file_densifies_views_in_c_order) {
  td_test::TempDir tmp;
  at::Tensor base = at::arange(6, at::kShort).reshape({2, 3});
  at::Tensor t = base.t();  // non-contiguous [3, 2]
  be::write_file(tmp / "t", t);
  BOOST_TEST(at::equal(be::map_file(tmp / "t", at::kShort, {3, 2}, false), t));
  at::Tensor ex = at::tensor({7}, at::kInt).expand({4});
  be::write_file(tmp / "e", ex);
  BOOST_TEST(file_size(tmp / "e") == 16);
  BOOST_TEST(at::equal(be::map_file(tmp / "e", at::kInt, {4}, false), at::full({4}, 7, at::kInt)));
  at::Tensor bf = at::tensor({1.0, -2.0, 0.5, 3.140625}, at::kDouble).to(at::kBFloat16);
  at::Tensor mb = be::write_and_map(tmp / "bf", bf, false);
  BOOST_TEST(mb.scalar_type() == at::kBFloat16);
  BOOST_TEST(at::equal(mb, bf));
  std::string raw = td_test::read_file(tmp / "bf");
  BOOST_TEST(raw.size() == 8u);
  BOOST_TEST(static_cast<unsigned char>(raw[0]) == 0x80);  // bf16 1.0 = 0x3f80, little-endian
  BOOST_TEST(static_cast<unsigned char>(raw[1]) == 0x3f);
  at::Tensor cplx = at::complex(at::ones({2}), at::full({2}, 2.0f));
  at::Tensor mc = be::write_and_map(tmp / "c", cplx.conj(), false);  // conj view is resolved
  BOOST_TEST(at::equal(mc, cplx.conj().resolve_conj()));
  at::Tensor bools = at::tensor({1, 0, 1}, at::kInt).to(at::kBool);
  be::write_file(tmp / "b", bools);
  BOOST_TEST(td_test::read_file(tmp / "b") == std::string("\x01\x00\x01", 3));
}

BOOST_AUTO_TEST_CASE(anonymous_mappings) {
  at::Tensor a = be::map_anonymous(at::kFloat, {1000, 10});
  BOOST_TEST(at::equal(a, at::zeros({1000, 10})));
  a.fill_(2);
  BOOST_TEST(a.sum().item<float>() == 20000.0f);
  auto info = be::mapping_of(a);
  BOOST_TEST_REQUIRE(info.has_value());
  BOOST_TEST(info->anonymous);
  BOOST_TEST(info->writable);
  BOOST_TEST(info->filename.empty());
  BOOST_TEST(be::mapped_filename(a).value().empty());
  be::flush(a);
}

BOOST_AUTO_TEST_CASE(registry_follows_views_and_releases) {
  td_test::TempDir tmp;
  const size_t before = be::live_mappings();
  {
    at::Tensor m = be::write_and_map(tmp / "v", at::arange(20, at::kFloat).reshape({4, 5}));
    at::Tensor row = m[2];
    at::Tensor sl = m.narrow(1, 1, 3).t();
    BOOST_TEST(be::live_mappings() == before + 1);
    m = at::Tensor();  // the views keep the mapping alive
    BOOST_TEST(be::mapped_filename(row).value() == tmp / "v");
    BOOST_TEST(be::mapped_filename(sl).value() == tmp / "v");
    BOOST_TEST(row[4].item<float>() == 14.0f);
    BOOST_TEST(be::live_mappings() == before + 1);
  }
  BOOST_TEST(be::live_mappings() == before);
}

BOOST_AUTO_TEST_CASE(no_file_descriptor_is_kept_per_tensor) {
  td_test::TempDir tmp;
  const size_t fds_before = count_fds();
  const size_t maps_before = be::live_mappings();
  {
    std::vector<at::Tensor> keep;
    for (int i = 0; i < 300; ++i) {
      const std::string f = tmp / ("f" + std::to_string(i));
      switch (i % 4) {
        case 0: keep.push_back(be::write_and_map(f, at::full({16}, i, at::kInt), i % 8 == 0)); break;
        case 1: keep.push_back(be::create_and_map(f, at::kFloat, {4, 4})); break;
        case 2: keep.push_back(be::map_anonymous(at::kDouble, {8})); break;
        case 3:
          be::create_file(f, 64);
          keep.push_back(be::map_file(f, at::kByte, {64}, false));
          break;
      }
    }
    BOOST_TEST(count_fds() == fds_before);  // all 300 alive, no fd held
    BOOST_TEST(be::live_mappings() == maps_before + 300);
  }
  BOOST_TEST(count_fds() == fds_before);
  BOOST_TEST(be::live_mappings() == maps_before);
  // failing calls do not leak either
  for (int i = 0; i < 50; ++i) {
    try {
      be::map_file(tmp / "f1", at::kFloat, {1000}, false);
    } catch (const FormatError&) {
    }
  }
  BOOST_TEST(count_fds() == fds_before);
}

BOOST_AUTO_TEST_CASE(concurrent_mapping_is_safe) {
  td_test::TempDir tmp;
  be::write_file(tmp / "shared", at::arange(1024, at::kLong));
  const size_t before = be::live_mappings();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        at::Tensor m = be::map_file(tmp / "shared", at::kLong, {1024}, false);
        at::Tensor a = be::map_anonymous(at::kInt, {16});
        if (m[1023].item<int64_t>() != 1023 || !be::mapping_of(m) || !be::mapping_of(a)->anonymous) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  BOOST_TEST(bad.load() == 0);
  BOOST_TEST(be::live_mappings() == before);
}

BOOST_AUTO_TEST_CASE(children_forked_while_a_thread_maps_can_map) {
  // the registry's lock is held across fork(): a child forked while another thread maps or unmaps would
  // otherwise inherit it held and hang on its first mapping (without the handlers, 50 of 100 children hung)
  td_test::TempDir tmp;
  be::write_file(tmp / "f", at::arange(4096, at::kLong));
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    at::Tensor m = be::map_file(tmp / "f", at::kLong, {4096}, false);
    while (!stop.load()) (void)be::mapping_of(m);  // the lock taken and given back, no syscall in between

  });
  // the children: no Boost.Test there
  const testutil::ForkOutcome r = testutil::fork_children(100, [&] {
    at::Tensor m = be::map_file(tmp / "f", at::kLong, {4096}, false);
    return m[4095].item<int64_t>() == 4095 ? 0 : 3;
  });
  stop = true;
  churn.join();
  BOOST_TEST(r.hung == 0);
  BOOST_TEST(r.failed == 0);
}

BOOST_AUTO_TEST_SUITE_END()
