#pragma once
// The c10d side of tensordict/distributed.hpp, shared by distributed_group.cpp (groups, pending work, errors)
// and distributed.cpp (TensorDict's send / recv / collectives).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensordict/distributed.hpp"

namespace tensordict::dist {

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  int rank = 0;
  int size = 0;
  std::chrono::milliseconds timeout{0};
  mutable std::mutex mu;
  bool shut = false;
  //! the process group, or DistributedError when the group was shut down
  c10d::ProcessGroupGloo& get(const char* what) const;

  //! staged receives (distributed.cpp): a leaf received into a staging storage takes it over, and its previous
  //! storage waits here, by byte size, for the next receive of that size (a steady stream allocates nothing)
  std::mutex staging_mu;
  std::multimap<size_t, c10::Storage> staging;
  size_t staging_bytes = 0;
  static constexpr size_t kMaxStagingBytes = size_t{1} << 30;
};

//! the Work of one operation with what it keeps alive (its tensors) and what to do once it succeeded
struct PendingOp {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep;
  //! the storages gloo reads or writes: a leaf set_ to another storage before wait() must not free the one
  //! gloo holds a pointer into (a resize_ that reallocates cannot be guarded: as in torch, a tensor in flight
  //! must not be resized)
  std::vector<c10::Storage> storages;
  std::function<void()> on_done;
  std::string what;  //!< "recv of 'a.b' (tag 3) from rank 1", for messages
  bool returned = false;
};

struct Pending::State {
  std::vector<PendingOp> ops;
  std::optional<int64_t> tag;
  std::shared_ptr<Group> group;  //!< kept alive while operations are in flight
};

//! runs fn; any exception of c10d / gloo becomes a DistributedError "<what>: <reason>" (our typed errors pass)
void guarded(const std::string& what, const std::function<void()>& fn);
//! waits for one operation and runs its on_done (guarded)
void wait_op(PendingOp& op);

//! the group of options (its group, else the default group)
std::shared_ptr<Group> group_of(const DistOptions& options);

c10d::ReduceOp to_c10d(ReduceOp op);

}  // namespace tensordict::dist
