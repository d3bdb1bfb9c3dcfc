// RemoteTree / RemoteNode: TensorDicts over a backends::LeafStore (HDF5, Redis) through its store actor.
#include "remote_node.hpp"

#include <algorithm>
#include <set>

#include "tensordict/device.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/non_tensor.hpp"

namespace tensordict {
namespace remote {

namespace {

std::string shape_str(const BatchSize& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string path_str(const LeafPath& p) {
  std::string r;
  for (const auto& k : p) r += (r.empty() ? "" : "/") + k;
  return "'" + r + "'";
}

bool starts_with(const BatchSize& shape, const BatchSize& prefix) {
  return shape.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), shape.begin());
}

BatchSize common_prefix(const std::vector<BatchSize>& shapes) {
  if (shapes.empty()) return {};
  BatchSize out = shapes[0];
  for (const auto& s : shapes) {
    size_t n = 0;
    while (n < out.size() && n < s.size() && out[n] == s[n]) ++n;
    out.resize(n);
  }
  return out;
}

LeafPath concat_path(LeafPath p, const std::string& key) {
  p.push_back(key);
  return p;
}

LeafPath parent_of(const LeafPath& p) { return LeafPath(p.begin(), p.end() - (p.empty() ? 0 : 1)); }

BatchSize concat(BatchSize a, const BatchSize& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

BatchSize tail(const BatchSize& s, size_t from) {
  return from >= s.size() ? BatchSize{} : BatchSize(s.begin() + static_cast<long>(from), s.end());
}

BatchSize sizes_of(const at::Tensor& t) { return BatchSize(t.sizes().begin(), t.sizes().end()); }

//! a tensor leaf to read (or to patch) at a selection
struct LeafSel {
  const backends::LeafInfo* info;  //!< in the snapshot the caller holds
  std::optional<ResolvedIndex> index;  //!< over the leaf's level batch; nullopt: the whole leaf
  const ResolvedIndex::RowPlan* plan = nullptr;
  BatchSize level_batch;
};

//! `final_shape`: the store returns the rows already in the selection's shape when they are the result
//! as read (in order), so select_rows has nothing left to do
backends::LeafRead to_read(const LeafSel& s, bool final_shape = true) {
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
at::Tensor leaf_data(at::Tensor v, at::ScalarType dtype) {
  if (v.requires_grad()) v = v.detach();
  if (!v.is_cpu() || v.scalar_type() != dtype) v = v.to(at::kCPU, dtype);
  return v.contiguous();
}

//! td[idx] = value in the common case: a flat value of tensors at keys this level already holds as tensor
//! leaves, written at whole rows in order (td[i] = row, td[a:b] = rows, td[...] = all) with values already
//! of the indexed region's shape. One row plan (one row list) for every leaf, no per-level maps, nothing
//! created. False, with nothing written, for anything else: the general path handles it, errors included.
bool flat_writes(const RemoteTree::Level& top, const ResolvedIndex& sel, size_t level_rank, const TensorDict& value,
                 std::vector<backends::LeafWrite>* writes) {
  std::optional<ResolvedIndex::RowPlan> plan;
  if (level_rank > 0) {
    plan = sel.row_plan();
    if (!plan->in_order) return false;
  }
  const bool whole = level_rank == 0 || plan->all;
  const at::IntArrayRef rb = sel.result_sizes();
  const auto items = value.items();
  writes->reserve(items.size());
  for (const auto& kv : items) {
    if (!kv.second.is_tensor() || kv.first.parts().size() != 1) return false;
    const std::string& key = kv.first.parts()[0];
    const auto at = std::find(top.keys.begin(), top.keys.end(), key);
    if (at == top.keys.end()) return false;
    const backends::LeafInfo* info = top.infos[static_cast<size_t>(at - top.keys.begin())];
    if (!info || info->kind != backends::LeafKind::Tensor || info->shape.size() < level_rank) return false;
    at::Tensor v = kv.second.tensor();
    // the indexed region: result batch + the leaf's feature dims (anything to broadcast: the general path)
    const size_t feat = info->shape.size() - level_rank;
    if (static_cast<size_t>(v.dim()) != rb.size() + feat) return false;
    const at::IntArrayRef vs = v.sizes();
    if (!std::equal(rb.begin(), rb.end(), vs.begin()) ||
        !std::equal(info->shape.begin() + static_cast<long>(level_rank), info->shape.end(), vs.begin() + static_cast<long>(rb.size())))
      return false;
    backends::LeafWrite w;
    w.path = info->path;
    w.whole = whole;
    if (!whole) w.rows = plan->rows;
    w.data = leaf_data(std::move(v), info->dtype);
    writes->push_back(std::move(w));
  }
  return true;
}

//! the rows a store returned for s (read by to_read(s)), as the selected values (result batch + feature shape)
at::Tensor select_rows(const LeafSel& s, const at::Tensor& rows) {
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

}  // namespace

// ============================================================================ RemoteTree
RemoteTree::RemoteTree(std::shared_ptr<actors::LeafStoreClient> client, std::optional<BatchSize> batch,
                       std::optional<at::Device> device, std::string type_name)
    : client_(std::move(client)), device_(device), type_name_(std::move(type_name)) {
  if (device_) parse_device(device_->str(), type_name_);  // a device this process cannot use: ValueError now
  auto listed = client_->run([](backends::LeafStore& s) {
    return std::make_pair(s.stored_batch_size(), s.list());
  });
  if (!batch && listed.first) batch = BatchSize(listed.first->begin(), listed.first->end());
  infer_ = !batch.has_value();
  if (batch) {
    for (auto b : *batch)
      if (b < 0) throw BatchSizeError(type_name_ + ": negative batch size " + shape_str(*batch));
    root_batch_ = *batch;
  }
  build(listed.second);
}

void RemoteTree::reload() {
  auto infos = client_->run([](backends::LeafStore& s) { return s.list(); });
  build(infos);
}

void RemoteTree::build(const std::vector<backends::LeafInfo>& infos) {
  std::map<LeafPath, Level> levels;
  std::map<LeafPath, backends::LeafInfo> leaves;
  levels[{}];
  for (const auto& info : infos) {
    if (info.path.empty()) continue;
    const LeafPath parent = parent_of(info.path);
    for (size_t i = 1; i <= parent.size(); ++i) {  // levels implied by a path (redis "a.b")
      LeafPath lp(parent.begin(), parent.begin() + static_cast<long>(i));
      if (!levels.count(lp)) {
        levels[lp];
        auto& keys = levels[parent_of(lp)].keys;
        if (std::find(keys.begin(), keys.end(), lp.back()) == keys.end()) keys.push_back(lp.back());
      }
    }
    auto& keys = levels[parent].keys;
    if (std::find(keys.begin(), keys.end(), info.path.back()) == keys.end()) keys.push_back(info.path.back());
    if (info.kind == backends::LeafKind::Group) {
      levels[info.path];
    } else {
      leaves[info.path] = info;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // batch sizes: decided once per level (fixed_), the rest inferred (h5 without a given batch) or the root's
  std::function<BatchSize(const LeafPath&, const BatchSize&)> decide = [&](const LeafPath& p,
                                                                          const BatchSize& parent_batch) {
    Level& lv = levels[p];
    std::vector<BatchSize> shapes;
    std::vector<LeafPath> children;
    for (const auto& k : lv.keys) {
      LeafPath cp = concat_path(p, k);
      auto it = leaves.find(cp);
      if (it != leaves.end()) {
        if (it->second.kind == backends::LeafKind::Tensor) shapes.push_back(it->second.shape);
      } else if (levels.count(cp)) {
        children.push_back(cp);
      }
    }
    auto fx = fixed_.find(p);
    if (fx != fixed_.end()) {
      lv.batch = fx->second;
    } else if (!infer_) {
      lv.batch = p.empty() ? root_batch_ : parent_batch;
    } else {
      // upstream _set_max_batch_size: the longest common leading shape of the tensor leaves and of the
      // children's batch sizes; a level with neither (only non-tensors) takes its parent's
      std::vector<BatchSize> all = shapes;
      for (const auto& c : children) all.push_back(decide(c, parent_batch));
      lv.batch = all.empty() ? parent_batch : common_prefix(all);
    }
    for (const auto& c : children) {
      BatchSize cb = decide(c, lv.batch);
      if (!starts_with(cb, lv.batch)) {
        throw BatchSizeError(type_name_ + " " + client_->describe() + ": the group " + path_str(c) + " has batch size " +
                             shape_str(cb) + ", which does not start with its parent's " + shape_str(lv.batch));
      }
    }
    for (const auto& k : lv.keys) {
      auto it = leaves.find(concat_path(p, k));
      if (it == leaves.end() || it->second.kind != backends::LeafKind::Tensor) continue;
      if (!starts_with(it->second.shape, lv.batch)) {
        throw BatchSizeError(type_name_ + " " + client_->describe() + ": the dataset " + path_str(it->first) +
                             " has shape " + shape_str(it->second.shape) + ", whose leading dims disagree with the batch size " +
                             shape_str(lv.batch));
      }
    }
    fixed_[p] = lv.batch;
    return lv.batch;
  };
  decide({}, {});
  auto snap = std::make_shared<Snapshot>();
  snap->levels = std::move(levels);
  snap->leaves = std::move(leaves);
  snap->fixed = fixed_;
  snap->root_batch = root_batch_;
  snap->link();
  snap_ = std::move(snap);
}

void RemoteTree::Snapshot::link() {
  for (auto& lv : levels) {
    lv.second.infos.clear();
    lv.second.infos.reserve(lv.second.keys.size());
    for (const auto& k : lv.second.keys) lv.second.infos.push_back(leaf(concat_path(lv.first, k)));
  }
}

const RemoteTree::Level* RemoteTree::Snapshot::level(const LeafPath& path) const {
  auto it = levels.find(path);
  return it == levels.end() ? nullptr : &it->second;
}

const backends::LeafInfo* RemoteTree::Snapshot::leaf(const LeafPath& path) const {
  auto it = leaves.find(path);
  return it == leaves.end() ? nullptr : &it->second;
}

BatchSize RemoteTree::Snapshot::batch_of(const LeafPath& path) const {
  LeafPath p = path;
  while (true) {
    auto fx = fixed.find(p);
    if (fx != fixed.end()) return fx->second;
    auto it = levels.find(p);
    if (it != levels.end()) return it->second.batch;
    if (p.empty()) return root_batch;
    p.pop_back();
  }
}

std::shared_ptr<const RemoteTree::Snapshot> RemoteTree::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_;
}

std::optional<RemoteTree::Level> RemoteTree::level(const LeafPath& path) const {
  auto snap = snapshot();
  const Level* lv = snap->level(path);
  if (!lv) return std::nullopt;
  Level out{lv->batch, lv->keys, {}};  // infos point into the snapshot: not handed out
  return out;
}

std::optional<backends::LeafInfo> RemoteTree::leaf(const LeafPath& path) const {
  auto snap = snapshot();
  const backends::LeafInfo* info = snap->leaf(path);
  if (!info) return std::nullopt;
  return *info;
}

BatchSize RemoteTree::batch_of(const LeafPath& path) const { return snapshot()->batch_of(path); }

void RemoteTree::set_batch(const LeafPath& path, const BatchSize& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  fixed_[path] = batch;
  auto snap = std::make_shared<Snapshot>(*snap_);  // a structural change: rare, a copy is fine
  snap->fixed[path] = batch;
  snap->link();
  snap_ = std::move(snap);
}

std::vector<backends::LeafInfo> RemoteTree::tensor_leaves_under(const LeafPath& path) const {
  auto snap = snapshot();
  std::vector<backends::LeafInfo> out;
  std::function<void(const LeafPath&)> walk = [&](const LeafPath& p) {
    const Level* lv = snap->level(p);
    if (!lv) return;
    for (size_t i = 0; i < lv->keys.size(); ++i) {
      if (const backends::LeafInfo* lf = lv->infos[i]) {
        if (lf->kind == backends::LeafKind::Tensor) out.push_back(*lf);
      } else {
        walk(concat_path(p, lv->keys[i]));
      }
    }
  };
  walk(path);
  return out;
}

// ============================================================================ RemoteNode
RemoteNode::RemoteNode(std::shared_ptr<RemoteTree> tree, LeafPath path, std::optional<ResolvedIndex> index)
    : tree_(std::move(tree)), path_(std::move(path)), index_(std::move(index)) {
  batch_size = index_ ? index_->result_batch() : tree_->batch_of(path_);
  device = tree_->device();
}

NodeCaps RemoteNode::caps() const {
  NodeCaps c;
  c.add_keys = tree_->client()->writable();
  return c;
}

LeafPath RemoteNode::child_path(const std::string& key) const { return concat_path(path_, key); }

std::optional<ResolvedIndex> RemoteNode::index_for(const RemoteTree::Snapshot& snap, const LeafPath& path) const {
  if (!index_) return std::nullopt;
  if (path == path_) return index_;
  const BatchSize mine = snap.batch_of(path_);
  const BatchSize theirs = snap.batch_of(path);
  if (!starts_with(theirs, mine)) {
    throw BatchSizeError(type_name() + ": the level " + path_str(path) + " has batch size " + shape_str(theirs) +
                         ", which does not start with " + shape_str(mine));
  }
  return index_->extend(tail(theirs, mine.size()));
}

std::shared_ptr<RemoteNode> RemoteNode::child(const std::string& key) const {
  LeafPath cp = child_path(key);
  return std::make_shared<RemoteNode>(tree_, cp, index_for(cp));
}

std::vector<std::string> RemoteNode::keys() const {
  auto lv = tree_->level(path_);
  return lv ? lv->keys : std::vector<std::string>{};
}

EntryMeta RemoteNode::meta_of(const RemoteTree::Snapshot& snap, const std::string& key,
                              const backends::LeafInfo* info) const {
  EntryMeta m;
  m.device = tree_->device() ? *tree_->device() : at::Device(at::kCPU);
  const size_t level_dims = snap.batch_of(path_).size();
  if (!info) {  // a nested level: its batch under this node's index
    m.kind = EntryMeta::Kind::TensorDict;
    m.shape = concat(batch_size, tail(snap.batch_of(child_path(key)), level_dims));
  } else if (info->kind == backends::LeafKind::Tensor) {
    m.dtype = info->dtype;
    m.shape = concat(batch_size, tail(info->shape, level_dims));
  } else {  // its value is read only when asked for (read())
    m.kind = EntryMeta::Kind::NonTensor;
    m.shape = batch_size;
  }
  return m;
}

std::optional<EntryMeta> RemoteNode::meta(const std::string& key) const {
  auto snap = tree_->snapshot();
  const LeafPath cp = child_path(key);
  if (const backends::LeafInfo* info = snap->leaf(cp)) return meta_of(*snap, key, info);
  if (snap->level(cp)) return meta_of(*snap, key, nullptr);
  return std::nullopt;
}

std::vector<std::pair<std::string, EntryMeta>> RemoteNode::metas() const {
  auto snap = tree_->snapshot();  // one structure for the whole call
  std::vector<std::pair<std::string, EntryMeta>> out;
  const RemoteTree::Level* lv = snap->level(path_);
  if (!lv) return out;
  out.reserve(lv->keys.size());
  for (size_t i = 0; i < lv->keys.size(); ++i) out.emplace_back(lv->keys[i], meta_of(*snap, lv->keys[i], lv->infos[i]));
  return out;
}

Entry RemoteNode::read_non_tensor(const LeafPath& path) const {
  backends::NonTensorValue v = tree_->client()->run([&](backends::LeafStore& s) { return s.read_non_tensor(path); });
  const BatchSize level = tree_->batch_of(parent_of(path));
  if (!v.stacked) return Entry(NonTensorData(v.value, batch_size));
  // one value per row along dim 0, broadcast over the level's other batch dims
  if (level.empty() || !v.value.is_array() || static_cast<int64_t>(v.value.as_array().size()) != level[0]) {
    throw FormatError(tree_->client()->describe() + ": the non-tensor " + path_str(path) +
                      " holds one value per row, but not " + (level.empty() ? "for a 0-dim batch" : std::to_string(level[0]) + " of them"));
  }
  const auto& rows = v.value.as_array();
  int64_t per_row = 1;
  for (size_t i = 1; i < level.size(); ++i) per_row *= level[i];
  std::vector<JsonValue> values;
  std::optional<ResolvedIndex> idx = index_for(parent_of(path));
  if (!idx) {
    values.reserve(rows.size() * static_cast<size_t>(per_row));
    for (const auto& r : rows)
      for (int64_t j = 0; j < per_row; ++j) values.push_back(r);
    return Entry(NonTensorStack(std::move(values), level));
  }
  at::Tensor pos = idx->positions().reshape({-1}).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < pos.numel(); ++i) values.push_back(rows[static_cast<size_t>(p[i] / per_row)]);
  return Entry(NonTensorStack(std::move(values), idx->result_batch()));
}

std::optional<Entry> RemoteNode::read(const std::string& key) const {
  const LeafPath cp = child_path(key);
  auto snap = tree_->snapshot();
  if (const backends::LeafInfo* info = snap->leaf(cp)) {
    if (info->kind == backends::LeafKind::NonTensor) return read_non_tensor(cp);
    LeafSel s{info, index_, nullptr, snap->batch_of(path_)};
    std::optional<ResolvedIndex::RowPlan> plan;
    if (s.index) {
      plan = s.index->row_plan();
      s.plan = &*plan;
    }
    std::vector<at::Tensor> got = tree_->client()->read({to_read(s)});
    at::Tensor t = select_rows(s, got.at(0));
    if (tree_->device() && t.device() != *tree_->device()) t = t.to(*tree_->device());
    return Entry(t);
  }
  if (snap->level(cp)) return Entry(TensorDict(std::shared_ptr<Node>(child(key))));
  return std::nullopt;
}

std::vector<Entry> RemoteNode::read(const std::vector<std::string>& keys, const Index& index) const {
  auto node = std::static_pointer_cast<RemoteNode>(this->index(index));
  TensorDict d = node->materialize(&keys);
  std::vector<Entry> out;
  for (const auto& k : keys) out.push_back(d.get_entry(NestedKey(k)));
  return out;
}

TensorDict RemoteNode::materialize(const std::vector<std::string>* only) const {
  auto snap = tree_->snapshot();  // one structure for the whole call
  const RemoteTree::Level* top = snap->level(path_);
  const auto& device = tree_->device();
  auto to_device = [&](at::Tensor t) { return device && t.device() != *device ? t.to(*device) : t; };
  auto wanted = [&](const LeafPath& p, const std::string& k) {
    return p != path_ || !only || std::find(only->begin(), only->end(), k) != only->end();
  };
  // a level of tensor leaves only (a row read of a flat TensorDict): one plan, no per-level maps
  if (top && !only &&
      std::all_of(top->infos.begin(), top->infos.end(),
                  [](const backends::LeafInfo* i) { return i && i->kind == backends::LeafKind::Tensor; })) {
    const BatchSize lb = snap->batch_of(path_);
    std::optional<ResolvedIndex::RowPlan> plan;
    if (index_) plan = index_->row_plan();
    std::vector<LeafSel> sels;
    std::vector<backends::LeafRead> reads;
    sels.reserve(top->infos.size());
    reads.reserve(top->infos.size());
    for (const backends::LeafInfo* info : top->infos) {
      sels.push_back(LeafSel{info, index_, plan ? &*plan : nullptr, lb});
      reads.push_back(to_read(sels.back()));
    }
    std::vector<at::Tensor> got = reads.empty() ? std::vector<at::Tensor>{} : tree_->client()->read(std::move(reads));
    TensorDict td(index_ ? index_->result_batch() : lb, device);
    for (size_t i = 0; i < sels.size(); ++i) td.set(top->keys[i].c_str(), to_device(select_rows(sels[i], got.at(i))));
    return td;
  }
  // pass 1: every tensor leaf under this level (one request), pass 2: the TensorDict in key order
  std::vector<LeafSel> sels;
  PlanCache plans;
  std::map<LeafPath, std::optional<ResolvedIndex>> level_index;
  auto index_of_level = [&](const LeafPath& lp) -> const std::optional<ResolvedIndex>& {
    auto it = level_index.find(lp);
    if (it == level_index.end()) it = level_index.emplace(lp, index_for(*snap, lp)).first;
    return it->second;
  };
  std::function<void(const LeafPath&)> collect = [&](const LeafPath& p) {
    const RemoteTree::Level* lv = snap->level(p);
    if (!lv) return;
    for (size_t i = 0; i < lv->keys.size(); ++i) {
      const std::string& k = lv->keys[i];
      if (!wanted(p, k)) continue;
      if (const backends::LeafInfo* info = lv->infos[i]) {
        if (info->kind != backends::LeafKind::Tensor) continue;
        const auto& idx = index_of_level(p);
        sels.push_back(LeafSel{info, idx, plans.get(p, idx), snap->batch_of(p)});
      } else {
        collect(concat_path(p, k));
      }
    }
  };
  collect(path_);
  std::vector<backends::LeafRead> reads;
  reads.reserve(sels.size());
  for (const auto& s : sels) reads.push_back(to_read(s));
  std::vector<at::Tensor> got = reads.empty() ? std::vector<at::Tensor>{} : tree_->client()->read(std::move(reads));
  std::map<const backends::LeafInfo*, at::Tensor> values;
  for (size_t i = 0; i < sels.size(); ++i) values[sels[i].info] = to_device(select_rows(sels[i], got.at(i)));
  std::function<TensorDict(const LeafPath&)> build = [&](const LeafPath& p) {
    const auto& idx = index_of_level(p);
    TensorDict td(idx ? idx->result_batch() : snap->batch_of(p), device);
    const RemoteTree::Level* lv = snap->level(p);
    if (!lv) return td;
    for (size_t i = 0; i < lv->keys.size(); ++i) {
      const std::string& k = lv->keys[i];
      if (!wanted(p, k)) continue;
      if (const backends::LeafInfo* info = lv->infos[i]) {
        if (info->kind == backends::LeafKind::Tensor) {
          td.set(k.c_str(), values.at(info));  // one-part key: no NestedKey
        } else {
          RemoteNode at_level(tree_, p, idx);
          td.set(NestedKey(k), at_level.read_non_tensor(info->path));
        }
      } else {
        td.set(NestedKey(k), build(concat_path(p, k)));
      }
    }
    return td;
  };
  return build(path_);
}

TensorDict RemoteNode::to_dense() const { return materialize(nullptr); }

std::shared_ptr<Node> RemoteNode::index(const Index& index) const {
  ResolvedIndex r = index_ ? index_->compose(index) : ResolvedIndex::resolve(tree_->batch_of(path_), index);
  auto n = std::make_shared<RemoteNode>(tree_, path_, std::move(r));
  n->locked = locked;
  return n;
}

TensorDict RemoteNode::open_child(const std::string& key) {
  const LeafPath cp = child_path(key);
  if (tree_->leaf(cp)) {
    throw KeyError("'" + key + "' is a leaf of " + tree_->client()->describe() + ", not a TensorDict");
  }
  if (!tree_->level(cp)) {
    // through an indexed view too: the level is created in the storage at its full batch size, and the
    // view's leaves under it are preallocated there by their first write (upstream's setitem on a view)
    tree_->client()->run([&](backends::LeafStore& s) { s.create_group(cp); });
    tree_->set_batch(cp, tree_->batch_of(path_));
    tree_->reload();
  }
  return TensorDict(std::shared_ptr<Node>(child(key)));
}

bool RemoteNode::erase(const std::string& key) {
  const LeafPath cp = child_path(key);
  if (!tree_->leaf(cp) && !tree_->level(cp)) return false;
  bool gone = tree_->client()->run([&](backends::LeafStore& s) { return s.erase(cp); });
  tree_->reload();
  return gone;
}

namespace {

//! uploads a whole value at path (a new or replaced key of an unindexed level): one request
void upload(backends::LeafStore& s, const LeafPath& path, const Entry& value, bool replace,
            const backends::CreateOptions& opts) {
  if (replace) s.erase(path);
  if (value.is_tensor()) {
    at::Tensor t = value.tensor().detach().cpu().contiguous();
    s.create(path, t.scalar_type(), sizes_of(t), t, opts);
  } else if (value.is_tensordict()) {
    TensorDict td = value.tensordict();
    td = td.node()->dense_form(td);
    s.create_group(path);
    for (const auto& k : td.keys()) upload(s, concat_path(path, k[0]), td.get_entry(k), false, opts);
  } else if (value.is_non_tensor_data()) {
    s.write_non_tensor(path, backends::NonTensorValue{value.non_tensor_data().value(), false});
  } else if (value.is_non_tensor_stack()) {
    const NonTensorStack& st = value.non_tensor_stack();
    if (st.batch_size().size() != 1) {
      throw NotImplementedError("a NonTensorStack of batch " + shape_str(st.batch_size()) +
                                " in a store (one value per row along dim 0 only)");
    }
    s.write_non_tensor(path, backends::NonTensorValue{JsonValue::array(st.values()), true});
  } else {
    throw TypeError(std::string("cannot store a ") + Entry::kind_name(value.kind()) + " at " + path_str(path));
  }
}

}  // namespace

void RemoteNode::put(const std::string& key, const Entry& value_in) {
  const LeafPath cp = child_path(key);
  Entry value = value_in;
  if (value.is_dict()) value = Entry(TensorDict(value.dict(), batch_size, device));
  if (value.is_tensordict()) value = Entry(value.tensordict().node()->dense_form(value.tensordict()));
  const BatchSize vb = value.shape();
  if (!starts_with(vb, batch_size) && !value.is_non_tensor_data()) {
    throw BatchSizeError("batch dimension mismatch, got self.batch_size=" + shape_str(batch_size) +
                         " and value.shape=" + shape_str(vb) + " (key " + path_str(cp) + ")");
  }
  if (index_) {  // a view: the value is written at the view's selection (new keys are preallocated)
    TensorDict one(batch_size, device);
    one.set(NestedKey(key), value);
    write(Index{}, one);
    return;
  }
  auto info = tree_->leaf(cp);
  if (info && info->kind == backends::LeafKind::Tensor && value.is_tensor() &&
      sizes_of(value.tensor()) == info->shape && value.tensor().scalar_type() == info->dtype) {
    backends::LeafWrite w;
    w.path = cp;
    w.data = value.tensor().detach().cpu().contiguous();
    tree_->client()->write({std::move(w)});
    return;
  }
  const bool replace = info.has_value() || tree_->level(cp).has_value();
  if (value.is_tensordict()) tree_->set_batch(cp, value.tensordict().batch_size());
  tree_->client()->run([&](backends::LeafStore& s) { upload(s, cp, value, replace, tree_->create_options); });
  tree_->reload();
}

void RemoteNode::write(const Index& index, const TensorDict& value_in) {
  auto snap = tree_->snapshot();  // taken again after new keys are created below
  const BatchSize level_batch = snap->batch_of(path_);
  ResolvedIndex sel = index_ ? index_->compose(index) : ResolvedIndex::resolve(level_batch, index);
  const BatchSize rb = sel.result_batch();
  TensorDict value = value_in.node()->dense_form(value_in);
  if (value.batch_size() != rb) value = value.expand(rb);  // torch's broadcasting rules and errors
  if (const RemoteTree::Level* top = snap->level(path_)) {
    std::vector<backends::LeafWrite> writes;
    if (flat_writes(*top, sel, level_batch.size(), value, &writes)) {
      if (!writes.empty()) tree_->client()->write(std::move(writes));
      return;
    }
  }

  struct Item {
    LeafPath path;
    at::Tensor data;  // result batch + feature shape
  };
  std::vector<Item> tensors;
  std::vector<std::pair<LeafPath, Entry>> non_tensors;
  // one walk: the leaves, and the sub-TensorDicts (the levels the store lacks take the value's batch sizes)
  for (const auto& kv : value.items(KeysOptions().include_nested(true).non_tensor_leaves(true))) {
    LeafPath p = path_;
    for (const auto& part : kv.first.parts()) p.push_back(part);
    if (kv.second.is_tensor()) {
      tensors.push_back(Item{p, kv.second.tensor()});
    } else if (kv.second.is_tensordict()) {
      if (!snap->level(p)) tree_->set_batch(p, concat(level_batch, tail(kv.second.tensordict().batch_size(), rb.size())));
    } else {
      non_tensors.emplace_back(p, kv.second);
    }
  }
  snap = tree_->snapshot();  // set_batch above published new levels' batch sizes
  auto level_sel = [&](const LeafPath& level) {
    return level == path_ ? sel : sel.extend(tail(snap->batch_of(level), level_batch.size()));
  };
  // keys the store lacks: preallocated zero-filled at the full batch size, as upstream's first indexed write
  std::vector<std::pair<LeafPath, std::pair<at::ScalarType, BatchSize>>> missing;
  for (const auto& it : tensors) {
    if (const backends::LeafInfo* info = snap->leaf(it.path)) {
      if (info->kind != backends::LeafKind::Tensor) {
        throw TypeError("td[idx] = value: key " + path_str(it.path) + " holds a non-tensor in " +
                        tree_->client()->describe() + " but the value holds a Tensor");
      }
      continue;
    }
    if (!tree_->client()->writable()) continue;  // the write below reports the read-only store
    const LeafPath lv = parent_of(it.path);
    const BatchSize lrb = level_sel(lv).result_batch();
    BatchSize shape = concat(snap->batch_of(lv), tail(sizes_of(it.data), lrb.size()));
    missing.emplace_back(it.path, std::make_pair(it.data.scalar_type(), shape));
  }
  if (!missing.empty()) {
    tree_->client()->run([&](backends::LeafStore& s) {
      for (const auto& m : missing) s.create(m.first, m.second.first, m.second.second, at::Tensor(), tree_->create_options);
    });
    tree_->reload();
    snap = tree_->snapshot();
  }

  PlanCache plans;
  std::map<LeafPath, ResolvedIndex> sels;
  auto sel_of = [&](const LeafPath& level) -> const ResolvedIndex& {
    auto it = sels.find(level);
    if (it == sels.end()) it = sels.emplace(level, level_sel(level)).first;
    return it->second;
  };
  std::vector<backends::LeafWrite> writes;
  std::vector<std::pair<LeafSel, at::Tensor>> patches;  // partial rows: read, patch, write back
  for (auto& it : tensors) {
    const backends::LeafInfo* info = snap->leaf(it.path);
    if (!info) {
      throw ValueError(tree_->client()->describe() + " is read-only: cannot create " + path_str(it.path));
    }
    const LeafPath lv = parent_of(it.path);
    const ResolvedIndex& ls = sel_of(lv);
    const BatchSize lb = snap->batch_of(lv);
    const BatchSize feat = tail(info->shape, lb.size());
    const BatchSize target = concat(ls.result_batch(), feat);
    at::Tensor v = it.data.requires_grad() ? it.data.detach() : it.data;
    if (v.sizes() != at::IntArrayRef(target)) {
      try {
        v = v.expand(target);
      } catch (const c10::Error&) {
        throw RuntimeError("td[idx] = value: the value of " + path_str(it.path) + " has shape " + shape_str(sizes_of(v)) +
                           ", which cannot be broadcast to the indexed region " + shape_str(target));
      }
    }
    v = leaf_data(std::move(v), info->dtype);
    const ResolvedIndex::RowPlan* plan = plans.get(lv, ls);
    LeafSel s{info, ls, plan, lb};
    backends::LeafWrite w;
    w.path = it.path;
    if (lb.empty() || (plan->all && plan->in_order)) {  // LeafWrite checks the element count, not the shape
      w.whole = true;
      w.data = v;
    } else if (plan->in_order) {
      w.whole = false;
      w.rows = plan->rows;
      w.data = v;
    } else if (static_cast<int64_t>(plan->rows.size()) * plan->per_row == ls.numel()) {
      // whole rows in another order, no repeats: a permutation of the rows, no read needed
      w.whole = false;
      w.rows = plan->rows;
      const BatchSize flat_shape = concat({static_cast<int64_t>(plan->rows.size()) * plan->per_row}, feat);
      at::Tensor data = at::empty(flat_shape, v.options());
      data.index_copy_(0, plan->local.reshape({-1}), v.reshape(concat({-1}, feat)));
      w.data = data.reshape(concat({static_cast<int64_t>(plan->rows.size())}, tail(info->shape, 1)));
    } else {
      patches.emplace_back(s, v);
      continue;
    }
    writes.push_back(std::move(w));
  }
  if (!patches.empty()) {
    std::vector<backends::LeafRead> reads;
    for (const auto& p : patches) reads.push_back(to_read(p.first, false));
    std::vector<at::Tensor> rows = tree_->client()->read(std::move(reads));
    for (size_t i = 0; i < patches.size(); ++i) {
      const LeafSel& s = patches[i].first;
      const BatchSize feat = tail(s.info->shape, s.level_batch.size());
      at::Tensor r = rows.at(i).contiguous();
      at::Tensor flat = r.view(concat({static_cast<int64_t>(s.plan->rows.size()) * s.plan->per_row}, feat));
      flat.index_put_({s.plan->local.reshape({-1})}, patches[i].second.reshape(concat({-1}, feat)));
      backends::LeafWrite w;
      w.path = s.info->path;
      w.whole = false;
      w.rows = s.plan->rows;
      w.data = r;
      writes.push_back(std::move(w));
    }
  }
  if (!writes.empty()) tree_->client()->write(std::move(writes));

  // non-tensors: whole values, or one value per row (upstream's json_array) for a selection of rows
  for (const auto& nt : non_tensors) {
    const LeafPath lv = parent_of(nt.first);
    const ResolvedIndex& ls = sel_of(lv);
    const BatchSize lb = tree_->batch_of(lv);
    const ResolvedIndex::RowPlan* plan = plans.get(lv, ls);
    const bool whole = lb.empty() || (plan->all && plan->in_order);
    auto info = tree_->leaf(nt.first);
    if (whole) {
      tree_->client()->run([&](backends::LeafStore& s) { upload(s, nt.first, nt.second, info.has_value(), tree_->create_options); });
      if (!info) tree_->reload();
      continue;
    }
    if (plan->per_row != 1) {
      throw NotImplementedError("writing the non-tensor " + path_str(nt.first) + " at an index of a store with " +
                                std::to_string(lb.size()) + " batch dims (one value per row along dim 0 only)");
    }
    tree_->client()->run([&](backends::LeafStore& s) {
      // a key the store lacks, written at some rows: the other rows hold null (upstream's None)
      backends::NonTensorValue cur = info ? s.read_non_tensor(nt.first) : backends::NonTensorValue{};
      std::vector<JsonValue> rows;
      if (cur.stacked && cur.value.is_array()) {
        rows = cur.value.as_array();
      } else {
        rows.assign(static_cast<size_t>(lb[0]), cur.value);
      }
      rows.resize(static_cast<size_t>(lb[0]));
      at::Tensor pos = ls.positions().reshape({-1}).contiguous();
      const int64_t* p = pos.data_ptr<int64_t>();
      for (int64_t i = 0; i < pos.numel(); ++i) {
        const JsonValue& v = nt.second.is_non_tensor_data() ? nt.second.non_tensor_data().value()
                                                             : nt.second.non_tensor_stack().at(i);
        rows[static_cast<size_t>(p[i])] = v;
      }
      s.write_non_tensor(nt.first, backends::NonTensorValue{JsonValue::array(std::move(rows)), true});
    });
    if (!info) tree_->reload();
  }
}

std::string RemoteNode::storage_spec() const {
  if (index_) return "";
  const auto& client = tree_->client();
  JsonValue::Object o;
  o.emplace_back("driver", JsonValue(client->driver()));
  const JsonValue& f = client->spec_fields();
  if (f.is_object()) {
    for (const auto& kv : f.as_object()) {
      if (kv.first == "group" && !path_.empty()) continue;
      o.push_back(kv);
    }
  }
  if (!path_.empty()) {
    if (client->driver() != "h5") return "";  // a nested level of a Redis store: the root's spec only
    const JsonValue* g = f.is_object() ? f.find("group") : nullptr;
    std::string group = g && g->is_string() ? g->as_string() : "/";
    for (const auto& p : path_) group += (group.empty() || group.back() != '/' ? "/" : "") + p;
    o.emplace_back("group", JsonValue(group));
  }
  return JsonValue::object(std::move(o)).dump();
}

// ============================================================================ helpers
void upload_all(RemoteTree& tree, const LeafPath& path, const TensorDict& td_in) {
  TensorDict td = td_in.node()->dense_form(td_in);
  for (const auto& k : td.keys(KeysOptions().include_nested(true))) {
    Entry e = td.get_entry(k);
    if (!e.is_tensordict()) continue;
    LeafPath p = path;
    for (const auto& part : k.parts()) p.push_back(part);
    tree.set_batch(p, e.tensordict().batch_size());
  }
  const backends::CreateOptions opts = tree.create_options;
  tree.client()->run([&](backends::LeafStore& s) {
    for (const auto& k : td.keys()) upload(s, concat_path(path, k[0]), td.get_entry(k), false, opts);
  });
  tree.reload();
}

TensorDict make_remote(std::shared_ptr<RemoteTree> tree, const LeafPath& path) {
  if (!path.empty() && !tree->level(path)) {
    throw KeyError(tree->client()->describe() + " has no group " + path_str(path));
  }
  return TensorDict(std::shared_ptr<Node>(std::make_shared<RemoteNode>(std::move(tree), path, std::nullopt)));
}

RemoteNode* remote_node_of(const TensorDict& td) {
  if (!td.defined() || !td.node()) return nullptr;
  return dynamic_cast<RemoteNode*>(td.node().get());
}

}  // namespace remote
}  // namespace tensordict
