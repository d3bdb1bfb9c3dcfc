#pragma once
// Which byte ranges of a file have blocks, as the filesystem reports them (FIEMAP): for tests of what a write
// allocates; which pages of a mapping are in memory (mincore). Header-only, no Boost.Test: callers assert on what
// it returns.
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>

#include <ATen/core/Tensor.h>
#include <string>
#include <vector>

namespace testutil {

//! pages of t's bytes resident in memory (mincore over its mapping: for a file mapping, in the page cache); -1 when
//! mincore refuses; `total` gets the page count
inline int64_t resident_pages(const at::Tensor& t, int64_t* total) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr()) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(t.data_ptr()) + static_cast<uintptr_t>(t.numel() * t.element_size());
  std::vector<unsigned char> v((end - begin + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, v.data()) != 0) return -1;
  *total = static_cast<int64_t>(v.size());
  int64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

struct Extent {
  int64_t begin = 0, end = 0;  //!< file bytes [begin, end)
  bool delalloc = false;       //!< not allocated yet: the filesystem reserves the blocks at writeback
  bool unwritten = false;      //!< allocated, reads as zeros until written back (fallocate)
};

//! the file's extents in order (holes are the gaps), after merging touching ones with the same flags; an empty
//! vector for a sparse file with no blocks. `ok` is false when the file cannot be opened or FIEMAP is refused.
inline std::vector<Extent> file_extents(const std::string& path, bool* ok) {
  std::vector<Extent> out;
  *ok = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  constexpr unsigned kMax = 512;
  std::vector<char> buf(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = 0;  // no FIEMAP_FLAG_SYNC: see dirty, delayed extents as they are
  fm->fm_extent_count = kMax;
  const int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  if (rc != 0) return out;
  *ok = true;
  for (unsigned i = 0; i < fm->fm_mapped_extents; ++i) {
    const fiemap_extent& x = fm->fm_extents[i];
    Extent e{static_cast<int64_t>(x.fe_logical), static_cast<int64_t>(x.fe_logical + x.fe_length),
             (x.fe_flags & FIEMAP_EXTENT_DELALLOC) != 0, (x.fe_flags & FIEMAP_EXTENT_UNWRITTEN) != 0};
    if (!out.empty() && out.back().end == e.begin && out.back().delalloc == e.delalloc &&
        out.back().unwritten == e.unwritten)
      out.back().end = e.end;
    else
      out.push_back(e);
  }
  return out;
}

//! true when the file at `path` lives on ext4 or xfs, the filesystems whose FIEMAP tells delayed blocks from
//! allocated ones (tests of allocate_for_write check extents there)
inline bool reports_delayed_allocation(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return false;
  constexpr long kExt4 = 0xEF53, kXfs = 0x58465342;
  return static_cast<long>(fs.f_type) == kExt4 || static_cast<long>(fs.f_type) == kXfs;
}

//! a file's extents for a test that checks them, or nullopt when its filesystem does not tell delayed blocks from
//! allocated ones (the test then says so, kExtentsNotChecked, and checks the data alone). A file FIEMAP refuses
//! gives no extents, which the test's count of extents reports.
inline std::optional<std::vector<Extent>> extents_to_check(const std::string& path) {
  if (!reports_delayed_allocation(path)) return std::nullopt;
  bool ok = false;
  return file_extents(path, &ok);
}
constexpr const char* kExtentsNotChecked = "the test directory is not on ext4 or xfs: file extents are not checked";

}  // namespace testutil
