#include "tensordict/actors/fault_points.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

namespace tensordict::actors {

FaultPoints::FaultPoints(const char* env_var) {
  const char* v = std::getenv(env_var);
  if (!v) return;
  const std::string s = v;
  const size_t a = s.find('@');
  const size_t b = a == std::string::npos ? a : s.find('@', a + 1);
  if (b == std::string::npos) return;
  stage_ = s.substr(0, a);
  const std::string idx = s.substr(a + 1, b - a - 1);
  index_ = idx == "*" ? kAny : std::atoll(idx.c_str());
  marker_ = s.substr(b + 1);
}

void FaultPoints::maybe_die_at(const char* stage, int64_t index) const {
  if ((index_ != index && index_ != kAny) || stage_ != stage) return;
  // the first process to create the marker dies; the marker existing already means the fault has fired
  const int fd = ::open(marker_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ::close(fd);
  ::raise(SIGKILL);
}

}  // namespace tensordict::actors
