#include "tensordict/nested_key.hpp"

namespace tensordict {

NestedKey::NestedKey(std::initializer_list<NestedKey> keys) {
  for (const auto& k : keys) parts_.insert(parts_.end(), k.parts_.begin(), k.parts_.end());
}

NestedKey NestedKey::operator+(const NestedKey& other) const {
  std::vector<std::string> p = parts_;
  p.insert(p.end(), other.parts_.begin(), other.parts_.end());
  return NestedKey(std::move(p));
}

std::string NestedKey::join(const std::string& sep) const {
  std::string out;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (i) out += sep;
    out += parts_[i];
  }
  return out;
}

std::string NestedKey::repr() const {
  if (parts_.size() == 1) return "'" + parts_[0] + "'";
  std::string out = "(";
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (i) out += ", ";
    out += "'" + parts_[i] + "'";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const NestedKey& key) { return os << key.repr(); }

}  // namespace tensordict
