#pragma once
//! The structure of a TensorDict for tools (tdx): the engine's one tree walk, public. Depth first, each level
//! in its key order, every node kind alike (dense, lazy stack, store, remote) through the node interface.
#include <functional>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

//! fn(key, entry) for every key of td's tree, a sub-TensorDict before its keys; the keys of a sub-TensorDict
//! are walked when fn returns true for it (fn's result is ignored for a leaf). `key` is relative to td. A leaf
//! of a node whose leaves are not in memory is read to hand it to fn.
void walk_entries(const TensorDict& td, const std::function<bool(const NestedKey&, const Entry&)>& fn);

}  // namespace tensordict
