#pragma once
//! Distributed tensordicts on libtorch's c10d, the C++ core of torch.distributed: process groups (gloo over a
//! TCPStore or a FileStore) and the pending operations of isend / irecv / reduce / all_reduce. TensorDict's
//! send / recv / isend / irecv / init_remote / from_remote_init / broadcast / reduce / all_reduce / all_gather
//! (tensordict/tensor_dict.hpp) run on them, leaf by leaf in upstream's order and tags, so that a Python rank
//! (torch.distributed with gloo, upstream tensordict) can share a group with C++ ranks.
//!
//!   auto group = tensordict::dist::init_process_group();          // MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
//!   if (group->rank() == 0) td.send(1); else td.recv(0);
//!
//! Our ranks check the structure before the data (DistOptions::checked, the default): the sender sends the
//! keys, dtypes and shapes in send order, the receiver answers whether they are its own, and only then do the
//! leaves move. A mismatch is a KeyError / TypeError / ValueError naming the key on the receiver (a
//! DistributedError naming it on the sender), and nothing is written. A Python rank speaks upstream's protocol,
//! which has no such step: talk to it with DistOptions().checked(false).
//! No c10d in this header.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensordict/options.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict::dist {

//! how the ranks of a group meet
struct GroupOptions {
  //! "env": MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (torch.distributed's env://), each overridden by the
  //! option below when set; "tcp": a TCPStore at host:port that rank 0 serves; "file": a FileStore at `file`
  TD_ARG(std::string, store) = "env";
  TD_ARG(std::string, host) = "127.0.0.1";
  TD_ARG(int, port) = 0;
  TD_ARG(std::string, file) = "";
  TD_ARG(int, rank) = -1;
  TD_ARG(int, world_size) = -1;
  //! how long joining the group and each operation wait for a peer before a DistributedError
  TD_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(30000);
  //! the address this rank's gloo transport listens on. Default: the interface GLOO_SOCKET_IFNAME names; else
  //! 127.0.0.1 when the store's host is a loopback address; else the address of this machine's hostname
  TD_ARG(std::string, bind_address) = "";
  //! the group's keys in the store are prefixed by its name: several groups on one store
  TD_ARG(std::string, name) = "";
  //! join the default group of Python ranks made with torch.distributed.init_process_group("gloo", store=...)
  //! (store "tcp" / "file") or with env:// (store "env"): its key prefix ("0", "default_pg/0"), its store-based
  //! barrier and its sequence number, as torch 1.13 does them (`name` is ignored then)
  TD_ARG(bool, python_default_group) = false;
};

//! one process group (c10d::ProcessGroupGloo): its ranks are 0 .. size()-1
class Group {
 public:
  //! joins the group (every rank calls it; it returns when all joined, DistributedError after the timeout)
  static std::shared_ptr<Group> create(const GroupOptions& options);
  ~Group();
  int rank() const;
  int size() const;
  std::chrono::milliseconds timeout() const;
  //! waits until every rank reached it
  void barrier() const;
  //! leaves the group: every later operation on it is a DistributedError (the Engine that made it calls this)
  void shutdown();
  bool is_shut_down() const;

  struct Impl;
  //! internal (api/): the c10d side
  Impl& impl() const;

 private:
  explicit Group(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

//! joins a group (GroupOptions) on the default Engine and makes it the default group (DistOptions().group()
//! unset); the group lives until destroy_process_group() or the Engine stops
std::shared_ptr<Group> init_process_group(const GroupOptions& options = {});
//! the default group; RuntimeError when there is none
std::shared_ptr<Group> default_group();
bool is_initialized();
//! leaves the default group
void destroy_process_group();

//! operations in flight (isend, irecv, reduce / all_reduce with async_op), upstream's list of Work
class Pending {
 public:
  Pending();
  ~Pending();
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  //! waits for every operation; the first failure is rethrown (DistributedError) once all have ended
  void wait_all();
  //! waits until one operation not returned before completes and returns its index (failures rethrown);
  //! RuntimeError when every one was returned. gloo's point-to-point operations tell that they completed only
  //! once waited for: among them wait_any returns the first one posted that is still open
  size_t wait_any();
  //! true when every operation completed
  bool is_completed() const;
  size_t size() const;
  //! the last tag used (upstream's return of isend / recv); nullopt for operations without tags
  std::optional<int64_t> tag() const;

  struct State;
  explicit Pending(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

//! a TCP port on `host` that was free a moment ago (bind to port 0, read it, close): for a TCPStore that rank 0
//! serves when the ranks are started together (tests, examples); 0 when no port could be bound
int free_port(const std::string& host = "127.0.0.1");

//! upstream's int_generator (tensordict.utils), the chain of pseudo_rand tags: the first 8 bytes of numpy's
//! default_rng(seed) as a big-endian integer, mod 10000 (bit for bit; seed >= 0, ValueError otherwise)
int64_t int_generator(int64_t seed);

}  // namespace tensordict::dist
