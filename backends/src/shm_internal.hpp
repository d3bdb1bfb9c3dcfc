// Shared-memory internals shared by the shm_*.cpp files (not installed): segment names, the registry of the
// names this process owns, the live mappings, dtype and extent checks. The API is tensordict/backends/shm.hpp.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/backends/shape_text.hpp"
#include "tensordict/backends/shm.hpp"

namespace tensordict::backends::shm_internal {

constexpr const char* kShmDir = "/dev/shm/";  // glibc's shm_open directory on Linux
constexpr uint32_t kMaxDims = 64;

inline std::string errno_text(int err) { return std::string(std::strerror(err)); }

// names and process identity (shm_names.cpp)
void check_prefix(const std::string& prefix);
std::string name_problem(const std::string& name);
std::string normalize_name(const std::string& name);

struct ProcStat {
  char state = '?';
  uint64_t starttime = 0;
};
std::optional<ProcStat> read_proc_stat(pid_t pid);
std::string make_name(const std::string& prefix);
bool parse_name_tail(const std::string& tail, pid_t* pid, uint64_t* starttime);
int flock_retry(int fd, int op);

// the names this process owns, unlinked at exit and on a fatal signal (shm_owned.cpp)
struct OwnedNode;
//! registers `name` (before it exists: a signal between shm_open and registration cannot leak it)
OwnedNode* owned_acquire(const std::string& name);
void owned_release(OwnedNode* node);
//! (re)installs the signal handlers that unlink the owned names, and the atexit hook
void ensure_handlers();

// live mappings of this process, for segment_of / handle_of (shm_segment.cpp)
std::mutex& live_mutex();
std::map<uintptr_t, ShmSegment*>& live_map();

//! a sweep of stale segments of `prefix`, at most once a second per prefix, never failing (shm_cleanup.cpp)
void maybe_cleanup(const std::string& prefix);

// dtype and extent checks (shm_alloc.cpp)
struct DtypeName {
  at::ScalarType type;
  const char* name;
};
inline constexpr DtypeName kDtypes[] = {
    {at::kBool, "bool"},         {at::kByte, "uint8"},        {at::kChar, "int8"},
    {at::kShort, "int16"},       {at::kInt, "int32"},         {at::kLong, "int64"},
    {at::kHalf, "float16"},      {at::kBFloat16, "bfloat16"}, {at::kFloat, "float32"},
    {at::kDouble, "float64"},    {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
};
const char* find_dtype_name(at::ScalarType t);

std::string extent_problem(uint64_t offset, at::ScalarType dtype, at::IntArrayRef shape, uint64_t* nbytes);
std::string key_text(const std::vector<std::string>& key);
std::string key_problem(const std::vector<std::string>& key);
bool starts_with_batch(const std::vector<int64_t>& shape, const std::vector<int64_t>& batch);
using tensordict::shape_text;  // "[3, 4]" (shape_text.hpp)

}  // namespace tensordict::backends::shm_internal
