#pragma once
// Test helper shared by the layers: every combination of the keys() options (include_nested, leaves_only,
// non_tensor_leaves, sort), for tests that compare structural answers option by option.
#include <vector>

#include "tensordict/tensor_dict.hpp"

namespace testutil {

inline std::vector<tensordict::KeysOptions> every_keys_option() {
  std::vector<tensordict::KeysOptions> out;
  for (int bits = 0; bits < 16; ++bits) {
    out.push_back(tensordict::KeysOptions()
                      .include_nested(bits & 1)
                      .leaves_only((bits & 2) != 0)
                      .non_tensor_leaves((bits & 4) != 0)
                      .sort((bits & 8) != 0));
  }
  return out;
}

}  // namespace testutil
