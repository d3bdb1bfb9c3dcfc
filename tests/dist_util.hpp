#pragma once
// Process groups of forked ranks for the distributed tests: run_ranks forks one child per rank (before any
// thread of the test process runs c10d or gloo), each joins a group on loopback (a TCPStore on a free port, or
// a FileStore) and runs the body; a rank reports a failure by throwing, and the parent asserts on the reports
// (Boost.Test stays on the test's own thread; children never assert).
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/fixtures.hpp"
#include "process_util.hpp"
#include "tensordict/tensordict.hpp"

namespace disttest {

using tensordict::dist::GroupOptions;

//! a TCP port on 127.0.0.1 that was free a moment ago
inline int free_port() { return tensordict::dist::free_port(); }

//! a failed expectation inside a rank (its message reaches the parent's assertion)
struct Failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw Failed(what);
}
//! fn must throw E whose message contains `part`
template <class E, class F>
void expect_throw(F&& fn, const std::string& part, const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    expect(std::string(e.what()).find(part) != std::string::npos,
           what + ": the message '" + e.what() + "' does not contain '" + part + "'");
    return;
  } catch (const std::exception& e) {
    throw Failed(what + ": threw another error: " + e.what());
  }
  throw Failed(what + ": did not throw");
}

enum class StoreKind { Tcp, File };

struct RankResult {
  int rc = 0;
  std::string report;  //!< "" when the rank's body returned; the failure otherwise
};

//! forks `n` ranks; rank r runs body(r, options) with options for a group of n ranks on a fresh store.
//! Returns what each rank reported (after all ended, or were killed after `timeout`)
inline std::vector<RankResult> run_ranks(int n, const std::function<void(int, const GroupOptions&)>& body,
                                         StoreKind kind = StoreKind::Tcp,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                         std::chrono::milliseconds group_timeout = std::chrono::seconds(30)) {
  fixtures::TempDir dir("dist");
  GroupOptions base;
  base.world_size(n).timeout(group_timeout);
  if (kind == StoreKind::Tcp) base.store("tcp").host("127.0.0.1").port(free_port());
  else base.store("file").file(dir / "store");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const std::string out = dir / ("rank" + std::to_string(r));
    pids.push_back(testutil::spawn([&, r, out] {
      std::string report;
      try {
        GroupOptions o = base;
        o.rank(r);
        body(r, o);
      } catch (const std::exception& e) {
        report = std::string("rank ") + std::to_string(r) + ": " + e.what();
      } catch (...) {
        report = "rank " + std::to_string(r) + ": unknown exception";
      }
      std::ofstream(out) << report;
      tensordict::dist::destroy_process_group();
      return report.empty() ? 0 : 1;
    }));
  }
  std::vector<RankResult> results;
  for (int r = 0; r < n; ++r) {
    RankResult res;
    res.rc = testutil::wait_child(pids[r], timeout);
    res.report = testutil::read_text(dir / ("rank" + std::to_string(r)));
    if (res.rc != 0 && res.report.empty())
      res.report = "rank " + std::to_string(r) + " " + testutil::describe_child(res.rc);
    results.push_back(res);
  }
  return results;
}

//! every rank ended well
#define DIST_CHECK_ALL(results)                                                   \
  do {                                                                            \
    const auto& _rs = (results);                                                  \
    for (size_t _i = 0; _i < _rs.size(); ++_i)                                    \
      BOOST_CHECK_MESSAGE(_rs[_i].rc == 0 && _rs[_i].report.empty(),              \
                          "rank " << _i << " rc " << _rs[_i].rc << ": " << _rs[_i].report); \
  } while (0)

//! two network namespaces ("hosts") joined by a veth pair, 10.231.<n>.1 and 10.231.<n>.2, made with iproute2
//! and removed by the destructor; ok() is false when this user may not create them (then nothing was made)
class TwoHosts {
 public:
  TwoHosts() {
    const int n = static_cast<int>(::getpid() % 250) + 1;
    a_ = "tdnet_a_" + std::to_string(::getpid());
    b_ = "tdnet_b_" + std::to_string(::getpid());
    addr_a_ = "10.231." + std::to_string(n) + ".1";
    addr_b_ = "10.231." + std::to_string(n) + ".2";
    if (::geteuid() != 0 || std::system("command -v ip >/dev/null 2>&1") != 0) return;
    const std::string va = "tdva" + std::to_string(::getpid() % 100000), vb = "tdvb" + std::to_string(::getpid() % 100000);
    const std::string cmds[] = {
        "ip netns add " + a_, "ip netns add " + b_, "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a_, "ip link set " + vb + " netns " + b_,
        "ip -n " + a_ + " addr add " + addr_a_ + "/24 dev " + va, "ip -n " + b_ + " addr add " + addr_b_ + "/24 dev " + vb,
        "ip -n " + a_ + " link set " + va + " up", "ip -n " + b_ + " link set " + vb + " up",
        "ip -n " + a_ + " link set lo up", "ip -n " + b_ + " link set lo up"};
    made_ = true;
    for (const auto& c : cmds) {
      if (std::system((c + " 2>/dev/null").c_str()) != 0) {
        why_ = "'" + c + "' failed";
        ok_ = false;
        return;
      }
    }
    ok_ = true;
  }
  ~TwoHosts() {
    if (!made_) return;
    (void)std::system(("ip netns del " + a_ + " 2>/dev/null").c_str());  // the veth pair goes with it
    (void)std::system(("ip netns del " + b_ + " 2>/dev/null").c_str());
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::string& address(int host) const { return host == 0 ? addr_a_ : addr_b_; }
  //! in a child: moves this process into host 0's or host 1's namespace (false when it cannot)
  bool enter(int host) const {
    const std::string path = "/var/run/netns/" + (host == 0 ? a_ : b_);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return ok;
  }

 private:
  std::string a_, b_, addr_a_, addr_b_, why_ = "not root, or no iproute2";
  bool made_ = false, ok_ = false;
};

}  // namespace disttest
