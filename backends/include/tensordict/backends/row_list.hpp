#pragma once
//! RowList: an immutable, shared list of row positions along dim 0 (ascending and unique where a LeafStore
//! takes it). One user call reads or writes the same rows of every leaf of a level: the remote node builds
//! the list once and every leaf's request shares it (a copy is a reference count, not an allocation), and a
//! store checks and analyses a list once per call, not once per leaf (`same` tells it the list is the one
//! it saw). Built from a std::vector or a brace list, read like a const std::vector.
//!
//!   RowList rows = std::vector<int64_t>{3, 4, 5};
//!   LeafRead a{{"obs"}, false, rows}, b{{"reward"}, false, rows};   // one list, two leaves
//!
//! Thread-safety: immutable; copies may be used from any thread.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace tensordict {
namespace backends {

class RowList {
 public:
  using const_iterator = std::vector<int64_t>::const_iterator;

  RowList() = default;
  RowList(std::vector<int64_t> rows)  // NOLINT(google-explicit-constructor): a list of rows is a RowList
      : rows_(rows.empty() ? nullptr : std::make_shared<const std::vector<int64_t>>(std::move(rows))) {}
  RowList(std::initializer_list<int64_t> rows) : RowList(std::vector<int64_t>(rows)) {}

  //! the rows as a vector (an empty one for an empty list)
  const std::vector<int64_t>& vec() const { return rows_ ? *rows_ : empty_rows(); }
  size_t size() const { return rows_ ? rows_->size() : 0; }
  bool empty() const { return size() == 0; }
  int64_t operator[](size_t i) const { return (*rows_)[i]; }
  int64_t front() const { return rows_->front(); }
  int64_t back() const { return rows_->back(); }
  const_iterator begin() const { return vec().begin(); }
  const_iterator end() const { return vec().end(); }
  //! true when both are copies of one non-empty list (so a check or analysis of one holds for the other)
  bool same(const RowList& o) const { return rows_ && rows_ == o.rows_; }
  bool operator==(const RowList& o) const { return rows_ == o.rows_ || vec() == o.vec(); }
  bool operator!=(const RowList& o) const { return !(*this == o); }

 private:
  static const std::vector<int64_t>& empty_rows() {
    static const std::vector<int64_t> none;
    return none;
  }
  std::shared_ptr<const std::vector<int64_t>> rows_;
};

//! one value computed from a RowList and a bound (say the leaf's dim 0), kept for the next leaf of the same
//! call: get() computes again only for another list or bound. A compute that throws leaves nothing kept.
//!
//!   RowMemo<std::vector<Run>> runs;
//!   for (const LeafWrite& w : writes) use(runs.get(w.rows, n, [&] { return runs_of(w.rows.vec()); }));
template <class T>
class RowMemo {
 public:
  template <class F>
  const T& get(const RowList& rows, int64_t bound, F&& compute) {
    if (!(for_.same(rows) && bound_ == bound)) {
      for_ = RowList();
      value_ = compute();
      for_ = rows;
      bound_ = bound;
    }
    return value_;
  }

 private:
  RowList for_;
  int64_t bound_ = 0;
  T value_{};
};

}  // namespace backends
}  // namespace tensordict
