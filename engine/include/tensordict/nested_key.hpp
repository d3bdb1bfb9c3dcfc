#pragma once
//! NestedKey: a key path ("a" or {"a", "b"}); nested brace lists flatten like upstream's nested tuples.
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tensordict {

class NestedKey {
 public:
  NestedKey() = default;
  NestedKey(const char* key) : parts_{key} {}
  NestedKey(std::string key) : parts_{std::move(key)} {}
  //! {"a", {"b", "c"}} == {"a", "b", "c"}
  NestedKey(std::initializer_list<NestedKey> keys);
  explicit NestedKey(std::vector<std::string> parts) : parts_(std::move(parts)) {}

  const std::vector<std::string>& parts() const { return parts_; }
  size_t size() const { return parts_.size(); }
  bool empty() const { return parts_.empty(); }
  bool is_nested() const { return parts_.size() > 1; }
  const std::string& front() const { return parts_.front(); }
  const std::string& back() const { return parts_.back(); }
  const std::string& operator[](size_t i) const { return parts_[i]; }
  //! the key without its first part
  NestedKey tail() const { return NestedKey(std::vector<std::string>(parts_.begin() + 1, parts_.end())); }
  //! the key without its last part
  NestedKey parent() const { return NestedKey(std::vector<std::string>(parts_.begin(), parts_.end() - 1)); }
  NestedKey operator+(const NestedKey& other) const;
  //! "a.b.c" with the given separator
  std::string join(const std::string& sep = ".") const;
  //! ("a", "b") for nested keys, "a" for plain ones (upstream's repr)
  std::string repr() const;

  bool operator==(const NestedKey& o) const { return parts_ == o.parts_; }
  bool operator!=(const NestedKey& o) const { return parts_ != o.parts_; }
  bool operator<(const NestedKey& o) const { return parts_ < o.parts_; }

 private:
  std::vector<std::string> parts_;
};

std::ostream& operator<<(std::ostream& os, const NestedKey& key);

}  // namespace tensordict
