#pragma once
// (internal) What the RemoteNode sources share (remote_node.cpp: structure and reads, remote_tree.cpp: the
// store's structure, remote_write.cpp: writes and uploads): shape and path helpers, a leaf selection and its
// read request, the per-level row plans of one call.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "remote_node.hpp"
#include "tensordict/backends/shape_text.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {
namespace remote {

inline std::string shape_str(const BatchSize& s) { return shape_text(s); }

inline std::string path_str(const LeafPath& p) {
  std::string r;
  for (const auto& k : p) r += (r.empty() ? "" : "/") + k;
  return "'" + r + "'";
}

inline bool starts_with(const BatchSize& shape, const BatchSize& prefix) {
  return shape.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), shape.begin());
}

inline LeafPath concat_path(LeafPath p, const std::string& key) {
  p.push_back(key);
  return p;
}

inline LeafPath parent_of(const LeafPath& p) { return LeafPath(p.begin(), p.end() - (p.empty() ? 0 : 1)); }

inline BatchSize concat(BatchSize a, const BatchSize& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline BatchSize tail(const BatchSize& s, size_t from) {
  return from >= s.size() ? BatchSize{} : BatchSize(s.begin() + static_cast<long>(from), s.end());
}

inline BatchSize sizes_of(const at::Tensor& t) { return BatchSize(t.sizes().begin(), t.sizes().end()); }

//! a tensor leaf to read (or to patch) at a selection
struct LeafSel {
  const backends::LeafInfo* info;  //!< in the snapshot the caller holds
  std::optional<ResolvedIndex> index;  //!< over the leaf's level batch; nullopt: the whole leaf
  const ResolvedIndex::RowPlan* plan = nullptr;
  BatchSize level_batch;
};

//! `final_shape`: the store returns the rows already in the selection's shape when they are the result
//! as read (in order), so select_rows has nothing left to do
inline backends::LeafRead to_read(const LeafSel& s, bool final_shape = true) {
  backends::LeafRead r;
  r.path = s.info->path;
  r.whole = !s.plan || (s.plan->all && s.plan->in_order) || s.level_batch.empty();
  if (!r.whole) r.rows = s.plan->rows;
  if (final_shape && s.index && s.plan && s.plan->in_order) {  // result batch + feature dims, one allocation
    const at::IntArrayRef rb = s.index->result_sizes();
    const auto& full = s.info->shape;
    const size_t lb = std::min(s.level_batch.size(), full.size());
    std::vector<int64_t> shape;
    shape.reserve(rb.size() + full.size() - lb);
    shape.assign(rb.begin(), rb.end());
    shape.insert(shape.end(), full.begin() + static_cast<long>(lb), full.end());
    r.shape = std::move(shape);
  }
  return r;
}

//! a value's tensor as a leaf's data: detached, on the CPU, in the leaf's dtype, contiguous (each skipped
//! no-op saves a dispatched call per leaf: a row write is a few microseconds of such calls)
inline at::Tensor leaf_data(at::Tensor v, at::ScalarType dtype) {
  if (v.requires_grad()) v = v.detach();
  if (!v.is_cpu() || v.scalar_type() != dtype) v = v.to(at::kCPU, dtype);
  return v.contiguous();
}

//! the rows a store returned for s (read by to_read(s)), as the selected values (result batch + feature shape)
inline at::Tensor select_rows(const LeafSel& s, const at::Tensor& rows) {
  if (!s.index || !s.plan || s.plan->in_order) return rows;
  const BatchSize feat = tail(s.info->shape, s.level_batch.size());
  const BatchSize out_shape = concat(s.index->result_batch(), feat);
  at::Tensor flat = rows.reshape(concat({static_cast<int64_t>(s.plan->rows.size()) * s.plan->per_row}, feat));
  return flat.index_select(0, s.plan->local.reshape({-1})).reshape(out_shape);
}

//! plans computed once per distinct level (many leaves share their level's selection)
class PlanCache {
 public:
  const ResolvedIndex::RowPlan* get(const LeafPath& level, const std::optional<ResolvedIndex>& idx) {
    if (!idx) return nullptr;
    auto it = plans_.find(level);
    if (it == plans_.end()) it = plans_.emplace(level, idx->row_plan()).first;
    return &it->second;
  }

 private:
  std::map<LeafPath, ResolvedIndex::RowPlan> plans_;
};

//! writes each value at its leaf's selection in ONE write request (`value`: [the selection's result batch...,
//! the leaf's feature dims...] in the leaf's dtype, contiguous): whole rows in order as they are, a permutation
//! of whole rows re-ordered in memory, anything else read (one request), patched and written back
void write_selected(actors::StoreClient& client, const std::vector<std::pair<LeafSel, at::Tensor>>& items);

}  // namespace remote
}  // namespace tensordict
