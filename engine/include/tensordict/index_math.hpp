#pragma once
//! Index math on batch dims: what an index (libtorch's TensorIndex list) does to a batch size, with
//! torch's own rules and error texts. Pure functions; no TensorDict here.
#include <cstdint>
#include <string>
#include <vector>

#include "tensordict/fwd.hpp"

namespace tensordict {

//! a Slice resolved against a dim of `size`, clamped as torch's slice: start <= stop, length elements
struct SliceRange {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  int64_t length = 0;
};

//! torch's clamping of `s` over a dim of `size`; ValueError "step must be greater than zero" otherwise
SliceRange slice_range(const at::indexing::Slice& s, int64_t size);

//! i in [-size, size) -> [0, size); IndexError "index i is out of bounds for dimension d with size s"
int64_t wrap_index(int64_t i, int64_t size, int64_t dim);

//! batch dims an index consumes: ints, slices and tensors count 1, a k-dim bool mask k; None, Ellipsis
//! and bools 0 (torch's count_specified_dimensions)
int64_t count_indexed_dims(const Index& index);

//! the index with its Ellipsis replaced by full slices over the remaining batch dims (upstream
//! convert_ellipsis_to_idx), so that leaves with extra feature dims are indexed on their batch dims only.
//! IndexError for a second Ellipsis or when the index consumes more than batch_dims dims.
Index convert_ellipsis(const Index& index, int64_t batch_dims);

//! upstream _index_preserve_data_ptr: every element an int, a bool, None, Ellipsis or a slice starting at 0
bool index_preserves_data_ptr(const Index& index);

//! every element is a full slice `:` (or Ellipsis) and they consume at most batch_dims dims: td[:] is td
bool is_full_slice_index(const Index& index, int64_t batch_dims);

//! the sizes of at::zeros(batch).index(index): analytic for ints, slices, None and Ellipsis; with tensor or
//! bool elements a stride-0 dummy of shape batch is indexed (it allocates only the result). Torch's errors
//! (IndexError for out-of-range / too many indices, TypeError for index tensors of a wrong dtype).
BatchSize getitem_batch_size(const BatchSize& batch, const Index& index);
//! source.index(index) for a tensor whose shape is a batch size, with upstream's checks and exception classes
//! (those of getitem_batch_size): what resolves an index once against positions (ResolvedIndex). A mask of the
//! wrong shape is an IndexError, as upstream's per-leaf torch indexing raises; index tensors (a mask counted
//! as its number of True) that do not broadcast together a RuntimeError (upstream's broadcast_shapes)
at::Tensor index_batch(const at::Tensor& source, const Index& index);

//! an index that selects along the first `batch_dims` dims only, so that leaf[index] is td[index]'s leaf: ints,
//! slices, index tensors and masks (torch places the dims of separated index tensors first on both alike);
//! not None, Ellipsis (which spans a leaf's feature dims too) or a bool. get_at / set_at on a store read or
//! write just the selected rows
bool selects_batch_dims_only(const Index& index, size_t batch_dims);
//! the longest leading dims every shape shares (upstream's batch-size inference: _get_shape_from_args /
//! auto_batch_size); [] for no shapes
BatchSize common_prefix(const std::vector<BatchSize>& shapes);
//! Python-like text: "(0, slice(1, 3, None), None, Ellipsis, tensor(shape=[4], dtype=Long))"
std::string index_repr(const Index& index);

}  // namespace tensordict
