#pragma once
//! What TensorDict::keys() returns: the listed keys (a std::vector<NestedKey>: iterate, index, compare and copy
//! it as one) and upstream's membership test of a key view (`key in td.keys(...)`).
#include <memory>
#include <utility>
#include <vector>

#include "tensordict/nested_key.hpp"
#include "tensordict/options.hpp"

namespace tensordict {

class Node;

class KeysView : public std::vector<NestedKey> {
 public:
  KeysView() = default;
  //! an empty listing of `node`'s keys made with `options` (TensorDict::keys fills it)
  KeysView(std::weak_ptr<Node> node, const KeysOptions& options) : node_(std::move(node)), options_(options) {}

  //! upstream's `key in td.keys(...)` (_TensorDictKeysView.__contains__): TypeError for an empty key, and for
  //! a key of two parts or more unless the view includes nested keys; otherwise whether the TensorDict holds
  //! the key now (a sub-TensorDict too, even in a leaves_only view, as upstream answers), or, once that
  //! TensorDict is gone, whether it is listed here
  bool contains(const NestedKey& key) const;
  const KeysOptions& options() const { return options_; }

 private:
  std::weak_ptr<Node> node_;
  KeysOptions options_;
};

}  // namespace tensordict
