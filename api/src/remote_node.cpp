// RemoteNode: TensorDicts over a backends::LeafStore (HDF5, Redis) through its store actor: structure,
// reads, indexing, the storage spec. Its structure (RemoteTree) is in remote_tree.cpp, its writes in
// remote_write.cpp.
#include "remote_node.hpp"
#include "remote_internal.hpp"

#include <algorithm>
#include <functional>

#include "tensordict/device.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/non_tensor.hpp"
#include "tensordict/storage_spec.hpp"  // RemoteNode::storage_spec: a view's "index"

namespace tensordict {
namespace remote {

// ============================================================================ RemoteNode
RemoteNode::RemoteNode(std::shared_ptr<RemoteTree> tree, LeafPath path, std::optional<ResolvedIndex> index)
    : tree_(std::move(tree)), path_(std::move(path)), index_(std::move(index)) {
  dense_ = tree_->client()->dense() != nullptr;
  if (dense_) {
    const TensorDict lv = dense_level();
    batch_size = lv.batch_size();
    device = lv.device();
    return;
  }
  batch_size = index_ ? index_->result_batch() : tree_->batch_of(path_);
  device = tree_->device();
}

NodeCaps RemoteNode::caps() const {
  NodeCaps c;
  c.add_keys = tree_->client()->writable();
  if (dense_) {
    c.zero_copy_views = true;
    c.memmap = tree_->client()->driver() == "memmap";
    c.shared = tree_->client()->driver() == "shared";
  }
  return c;
}

TensorDict RemoteNode::dense_level() const {
  TensorDict td = tree_->client()->snapshot();
  for (const auto& part : path_) {
    std::optional<Entry> e = td.get_entry_opt(NestedKey(part));
    if (!e || !e->is_tensordict()) return TensorDict(td.batch_size(), td.device());
    td = e->tensordict();
  }
  return td;
}

std::shared_ptr<TensorDictImpl> RemoteNode::dense_view() const {
  if (!dense_) return nullptr;
  TensorDict v = dense_level();
  TensorDictImpl* impl = v.node()->dense_node();  // a snapshot is a dense node
  if (!impl) return nullptr;
  std::shared_ptr<TensorDictImpl> out(v.node(), impl);
  std::lock_guard<std::mutex> lock(kept_mu_);
  if (kept_.empty() || kept_.back() != out) kept_.push_back(out);
  return out;
}

void RemoteNode::refresh() {
  if (actors::DenseStore* d = tree_->client()->dense()) tree_->client()->run([d](backends::LeafStore&) { d->refresh(); });
  tree_->reload();
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
  if (dense_) return dense_level().node()->keys();
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
  if (dense_) return dense_level().node()->meta(key);
  auto snap = tree_->snapshot();
  const LeafPath cp = child_path(key);
  if (const backends::LeafInfo* info = snap->leaf(cp)) return meta_of(*snap, key, info);
  if (snap->level(cp)) return meta_of(*snap, key, nullptr);
  return std::nullopt;
}

std::vector<std::pair<std::string, EntryMeta>> RemoteNode::metas() const {
  if (dense_) return dense_level().node()->metas();
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
  for (int64_t i = 0; i < pos.numel(); ++i) {
    // positions are a tensor anyone holding the index can change: checked before they index the rows
    if (p[i] < 0 || static_cast<size_t>(p[i] / per_row) >= rows.size())
      throw IndexError("index " + std::to_string(p[i]) + " is out of bounds for the non-tensor " + path_str(path));
    values.push_back(rows[static_cast<size_t>(p[i] / per_row)]);
  }
  return Entry(NonTensorStack(std::move(values), idx->result_batch()));
}

std::optional<Entry> RemoteNode::read(const std::string& key) const {
  if (dense_) {
    std::optional<Entry> e = dense_level().node()->read(key);
    if (e && e->is_tensordict()) return Entry(TensorDict(std::shared_ptr<Node>(child(key))));
    return e;
  }
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
  if (dense_) return dense_level().node()->read(keys, index);
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

TensorDict RemoteNode::to_dense() const { return dense_ ? dense_level() : materialize(nullptr); }

std::optional<ResolvedIndex> RemoteNode::resolve(const Index& index) const {
  if (dense_) return dense_level().node()->resolve(index);
  return index_ ? index_->compose(index) : ResolvedIndex::resolve(tree_->batch_of(path_), index);
}

// a resolved index handed to index_at / write_at is one over this level's whole batch (what resolve() makes)
void check_source(const ResolvedIndex& index, const BatchSize& level, const std::string& what) {
  if (index.source_batch() != level) {
    throw ValueError(what + ": the index was resolved over a batch of " + shape_str(index.source_batch()) +
                     ", not over this store level's " + shape_str(level));
  }
}

std::shared_ptr<Node> RemoteNode::index_at(const ResolvedIndex& index) const {
  if (dense_) return dense_level().node()->index_at(index);  // views of the storage, as the snapshot's
  // the level's batch this node resolves over (its own, or its index's source): no snapshot on the row read path
  check_source(index, index_ ? index_->source_batch() : batch_size, "index_at");
  auto n = std::make_shared<RemoteNode>(tree_, path_, index);
  n->locked = locked;
  return n;
}

std::shared_ptr<Node> RemoteNode::index(const Index& index) const {
  if (dense_) return dense_level().index(index).node();
  return index_at(*resolve(index));
}

TensorDict RemoteNode::open_child(const std::string& key) {
  const LeafPath cp = child_path(key);
  if (dense_) {
    std::optional<Entry> e = dense_level().node()->read(key);
    if (e && !e->is_tensordict()) {
      throw KeyError("'" + key + "' is a " + std::string(Entry::kind_name(e->kind())) + ", not a TensorDict");
    }
    return TensorDict(std::shared_ptr<Node>(child(key)));  // missing: created by its first leaf
  }
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
  if (dense_) return tree_->client()->run([&](backends::LeafStore& s) { return s.erase(cp); });
  if (!tree_->leaf(cp) && !tree_->level(cp)) return false;
  bool gone = tree_->client()->run([&](backends::LeafStore& s) { return s.erase(cp); });
  tree_->reload();
  return gone;
}

namespace {
void check_unlocked(const Node& n, const char* what) {
  if (n.locked) {
    throw LockedError(std::string("Cannot modify locked TensorDict. For in-place modification, consider using the "
                                  "`set_()` method and make sure the key is present. (") + what + ")");
  }
}
LeafPath below(LeafPath p, const NestedKey& key) {
  p.insert(p.end(), key.parts().begin(), key.parts().end());
  return p;
}
}  // namespace

void RemoteNode::rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) {
  (void)self;
  check_unlocked(*this, "rename_key_");
  const LeafPath from = below(path_, old_key), to = below(path_, new_key);
  const auto snap = tree_->snapshot();
  const backends::LeafInfo* leaf = snap->leaf(from);
  if (!leaf && !snap->level(from)) {
    std::string keys;
    for (const auto& k : this->keys()) keys += (keys.empty() ? "" : ", ") + k;
    throw KeyError("key " + old_key.repr() + " not found in TensorDict with keys [" + keys + "]");
  }
  if (old_key == new_key) return;
  const bool taken = snap->leaf(to) || snap->level(to);
  if (taken && safe) throw KeyError("key " + new_key.repr() + " already present in TensorDict.");
  if (to.size() > from.size() && std::equal(from.begin(), from.end(), to.begin()))
    throw ValueError("rename_key_: " + new_key.repr() + " lies inside " + old_key.repr());
  // the new key's parent: a level (made when missing), never a leaf, whose batch size the moved value starts with
  const LeafPath parent = parent_of(to);
  for (LeafPath p = parent; p.size() > path_.size(); p = parent_of(p))
    if (snap->leaf(p)) throw KeyError("rename_key_: '" + path_str(p) + "' is a leaf of " + tree_->client()->describe() + ", not a TensorDict");
  const BatchSize batch = snap->batch_of(parent);
  const bool tensor = leaf && leaf->kind == backends::LeafKind::Tensor;
  if ((tensor && !starts_with(leaf->shape, batch)) || (!leaf && !starts_with(snap->batch_of(from), batch))) {
    throw BatchSizeError("rename_key_: " + old_key.repr() + " of shape " +
                         shape_str(tensor ? BatchSize(leaf->shape) : snap->batch_of(from)) +
                         " does not fit under the batch size " + shape_str(batch) + " of " + new_key.repr() + "'s level");
  }
  const bool new_level = parent.size() > path_.size() && !snap->level(parent);
  tree_->client()->run([&](backends::LeafStore& s) {
    if (new_level) s.create_group(parent);
    if (taken) {
      s.replace(from, to);  // replaced, as upstream's set of the new key (safe=false), in one step
    } else {
      s.move(from, to);
    }
  });
  if (new_level) tree_->set_batch(parent, batch);
  tree_->reload();
}

void RemoteNode::clear(TensorDict& self) {
  (void)self;
  check_unlocked(*this, "clear");
  const std::vector<std::string> ks = keys();
  if (ks.empty()) return;
  // the level's batch size stays: it was decided when the tree was first listed (RemoteTree's fixed batch sizes)
  tree_->client()->run([&](backends::LeafStore& s) {
    for (const auto& k : ks) s.erase(child_path(k));
  });
  tree_->reload();
}

std::string RemoteNode::storage_spec() const {
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
  if (!index_) return JsonValue::object(std::move(o)).dump();
  // a view: the level's spec with its resolved index (composed already: td[a][b] holds one index)
  return StorageSpec(client->driver(), JsonValue::object(std::move(o))).with_index(*index_).dump();
}

// ============================================================================ handles
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
