#pragma once
//! NextIterator: the input iterator of range-for over a stream of TensorDicts, for any source with
//! `std::optional<TensorDict> next()` (map_iter's MapIter, the DataLoader). Each step drops the previous item
//! before asking for the next one (a DataLoader batch's ring slot can then be reused once the caller dropped
//! its own copies); the end of the stream (nullopt) makes it equal to the default-constructed end iterator.
#include <cstddef>
#include <iterator>
#include <optional>

#include "tensordict/tensor_dict.hpp"

namespace tensordict {

template <class Source>
class NextIterator {
 public:
  using value_type = TensorDict;
  using difference_type = std::ptrdiff_t;
  using reference = const TensorDict&;
  using pointer = const TensorDict*;
  using iterator_category = std::input_iterator_tag;
  NextIterator() = default;
  explicit NextIterator(Source* source) : source_(source) { ++*this; }
  reference operator*() const { return *cur_; }
  pointer operator->() const { return &*cur_; }
  NextIterator& operator++() {
    cur_.reset();
    cur_ = source_->next();
    if (!cur_) source_ = nullptr;
    return *this;
  }
  bool operator==(const NextIterator& o) const { return source_ == o.source_; }
  bool operator!=(const NextIterator& o) const { return source_ != o.source_; }

 private:
  Source* source_ = nullptr;
  std::optional<TensorDict> cur_;
};

}  // namespace tensordict
