// KeysView (tensordict/keys_view.hpp): upstream's membership test of a key view.
#include "tensordict/keys_view.hpp"

#include <algorithm>

#include "tensordict/errors.hpp"
#include "tensordict/tensor_dict.hpp"

namespace tensordict {

bool KeysView::contains(const NestedKey& key) const {
  if (key.empty()) {
    throw TypeError("TensorDict keys are always strings. Membership checks are only supported for strings or "
                    "non-empty tuples of strings (for nested TensorDicts)");
  }
  if (key.size() > 1 && !options_.include_nested()) {
    throw TypeError("Nested membership checks with tuples of strings is only supported when setting "
                    "`include_nested=True`.");
  }
  if (std::shared_ptr<Node> node = node_.lock()) return TensorDict(std::move(node)).contains(key);
  return std::find(begin(), end(), key) != end();
}

}  // namespace tensordict
