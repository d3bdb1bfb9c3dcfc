#pragma once
//! Internal to engine/: the nested-key walks that tensor_dict.cpp and tensor_dict_write.cpp share.
#include <memory>

#include "tensor_dict_internal.hpp"

namespace tensordict {
namespace detail {

//! the handle holding the last part of key, through handles (any node kind); undefined when a level is
//! missing and !create. KeyError when a level is not a TensorDict.
TensorDict parent_of(const TensorDict& root, const NestedKey& key, bool create);
//! walks key through dense nodes only (detail::walk); false when the node is not dense or a level of another
//! node kind is met: the caller takes its generic path
bool dense_walk(TensorDictImpl* dense, const NestedKey& key, bool create, TensorDictImpl** out);

}  // namespace detail

//! the node, or ValueError naming `what` for an undefined handle (tensor_dict.cpp)
Node& node_of(const std::shared_ptr<Node>& node, const char* what);

}  // namespace tensordict
