// RemoteTree: the structure of an HDF5 or Redis store (levels, leaves, batch sizes) as last listed.
#include <algorithm>
#include <functional>

#include "remote_internal.hpp"
#include "tensordict/device.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace remote {

// ============================================================================ RemoteTree
RemoteTree::RemoteTree(std::shared_ptr<actors::StoreClient> client, std::optional<BatchSize> batch,
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
        if (it->second.inferred_shape) shapes.push_back(*it->second.inferred_shape);  // upstream counts it too
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

}  // namespace remote
}  // namespace tensordict
