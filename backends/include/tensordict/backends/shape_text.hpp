#pragma once
//! How messages print a shape: "[3, 4]" ("[]" for a scalar). One spelling for every layer.
#include <cstdint>
#include <string>

#include <c10/util/ArrayRef.h>

namespace tensordict {

inline std::string shape_text(c10::ArrayRef<int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

}  // namespace tensordict
