#pragma once
//! What belongs to the shared-memory storage alone (the handle keeps upstream's share_memory_ / is_shared):
//! the handle another process opens, and the names of the segments this process creates.
#include <string>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! a small serialised handle (segment names, offsets, dtypes, shapes, batch size, keys) naming the
//! shared-memory leaves of a share_memory_()'d TensorDict; non-tensor entries are not included. ValueError
//! for a TensorDict that is not shared
std::string share_handle(const TensorDict& td);

//! opens the TensorDict another process shared, zero-copy (writes are seen by every process); the result is
//! locked and is_shared(); sub-TensorDicts get the root's batch size
TensorDict from_share_handle(const std::string& handle);

//! the name prefix of shared-memory segments created by this process (default "tensordict_")
void set_shm_prefix(const std::string& prefix);
std::string shm_prefix();

}  // namespace tensordict
