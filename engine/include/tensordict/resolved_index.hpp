#pragma once
//! A resolved index: what td[index] selects, computed once from (batch size, index) as a public value that
//! can be inspected, sent to another process and composed without reading any data. Remote nodes (HDF5,
//! Redis) keep (storage, ResolvedIndex) and read on demand; td[a][b] is resolve(a).compose(b).
//! The value is the tensor of linear source positions (row-major over the whole source batch) with the
//! result's batch shape, so every libtorch index kind (ints, slices, None, Ellipsis, index tensors, masks)
//! follows torch's own rules and errors, and composing is indexing the positions.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tensordict/index_math.hpp"
#include "tensordict/backends/row_list.hpp"

namespace tensordict {

class ResolvedIndex {
 public:
  //! the whole batch (td[...])
  static ResolvedIndex identity(const BatchSize& source_batch);
  //! `index` over a source of `source_batch`, with upstream's errors (index_batch: IndexError, TypeError,
  //! ValueError for a slice step <= 0, RuntimeError for index tensors that do not broadcast together)
  static ResolvedIndex resolve(const BatchSize& source_batch, const Index& index);

  //! this index followed by `index` on its result (td[a][b]); no data is read
  ResolvedIndex compose(const Index& index) const;
  //! how many times resolve() and compose() ran in this process (an atomic count, for tests: a user call
  //! on a store node resolves its index once and passes the resolved form down)
  static int64_t resolutions();
  //! the same selection over a source with `extra` trailing batch dims, all of them selected (a nested
  //! level whose batch is longer than its parent's: result batch = this result batch + extra)
  ResolvedIndex extend(const BatchSize& extra) const;
  const BatchSize& source_batch() const { return source_; }
  BatchSize result_batch() const;
  //! result_batch() as a view of the positions' sizes (no allocation; valid while this index lives)
  at::IntArrayRef result_sizes() const { return positions_.sizes(); }
  int64_t numel() const { return positions_.numel(); }
  //! linear positions into the source batch (int64, shape = result batch)
  const at::Tensor& positions() const { return positions_; }
  //! the source rows along dim 0 each result element lies in (what a row store reads), in result order
  std::vector<int64_t> rows() const;
  //! when the selection is a run of whole consecutive source rows [start, start + count) in order
  //! (td[i], td[a:b]): (start, count); the fast path of byte-range reads
  std::optional<std::pair<int64_t, int64_t>> row_range() const;

  //! what a store addressing leaves by rows along dim 0 (HDF5, Redis) reads for this selection: the
  //! ascending unique rows (h5py refuses unsorted or repeated ones), and how the rows read map to the result
  struct RowPlan {
    //! ascending, unique source rows along dim 0 (empty for a 0-dim source); shared, so that every leaf's
    //! store request of one call carries the same list
    backends::RowList rows;
    //! int64 of the result batch shape: positions into the rows read, flattened over the batch dims
    //! ([rows.size() * per_row]); undefined when in_order
    at::Tensor local;
    bool in_order = false;  //!< the rows read, in order, ARE the result (no re-indexing)
    bool all = false;       //!< every source element in order: read the whole leaf
    int64_t per_row = 1;    //!< batch elements per row (the product of the source batch after dim 0)
  };
  RowPlan row_plan() const;

  //! leaf[selection] for a leaf held in memory whose leading dims are the source batch (the rest are its
  //! feature dims): [result batch..., feature...]. A run of whole rows is a view (narrow), the rest a gather.
  //! ValueError when the leaf does not start with the source batch
  at::Tensor take(const at::Tensor& leaf) const;
  //! leaf[selection] = value, in place: `value` broadcasts to [result batch..., leaf's feature dims...] and is
  //! cast to the leaf's dtype. Where positions repeat, which write wins is torch's index_put_'s choice. ValueError
  //! (nothing written) when the leaf does not start with the source batch or the value does not broadcast
  void put(const at::Tensor& leaf, const at::Tensor& value) const;

  //! compact JSON: {"source":[...],"shape":[...],"positions":[...]} (what travels to another process)
  std::string to_json() const;
  //! FormatError for malformed text, ValueError for positions outside the source batch
  static ResolvedIndex from_json(const std::string& text);
  bool operator==(const ResolvedIndex& o) const;

 private:
  ResolvedIndex(BatchSize source, at::Tensor positions) : source_(std::move(source)), positions_(std::move(positions)) {}
  RowPlan compute_row_plan() const;
  BatchSize source_;
  at::Tensor positions_;
};

}  // namespace tensordict
