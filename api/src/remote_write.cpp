// RemoteNode's writes: put (a key of an unindexed level, or at a view's selection), write / write_at
// (td[idx] = value: ONE request for every leaf), set_at (one leaf's selected rows), upload_all.
#include <algorithm>

#include <ATen/ExpandUtils.h>

#include "remote_internal.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/non_tensor.hpp"

namespace tensordict {
namespace remote {

namespace {

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
  // the level's own entries: a dense value's list itself (read_all copies it, items() built a NestedKey per entry)
  std::vector<std::pair<std::string, Entry>> copied;
  const auto* own = value.node()->own_entries();
  if (!own) copied = value.node()->read_all();
  const auto& items = own ? *own : copied;
  writes->reserve(items.size());
  for (const auto& kv : items) {
    if (!kv.second.is_tensor()) return false;
    const std::string& key = kv.first;
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

void upload_new(backends::LeafStore& s, const LeafPath& path, const Entry& value, const backends::CreateOptions& opts);

//! uploads a whole value at path (a new or replaced key of an unindexed level): one request. A replaced key is
//! written under a staging name beside it and moved over the old one once complete: a value the store refuses
//! part-way (a dtype it cannot hold, a non-tensor it has no layout for, a full disk) leaves the old one as it was
//! and removes what it half-made (the old key was erased first, then the new one made: the data was lost)
void upload(backends::LeafStore& s, const LeafPath& path, const Entry& value, bool replace,
            const backends::CreateOptions& opts) {
  if (!replace) return upload_new(s, path, value, opts);
  LeafPath staged = path;
  staged.back() = "__td_replacing_" + staged.back();
  s.erase(staged);  // left by a process killed mid-replacement
  try {
    upload_new(s, staged, value, opts);
  } catch (...) {
    try {
      s.erase(staged);
    } catch (...) {
    }
    throw;
  }
  s.replace(staged, path);  // the old key dropped and the new one moved in, in one step where the store can
}

void upload_new(backends::LeafStore& s, const LeafPath& path, const Entry& value, const backends::CreateOptions& opts) {
  if (value.is_tensor()) {
    at::Tensor t = value.tensor().detach().cpu().contiguous();
    s.create(path, t.scalar_type(), sizes_of(t), t, opts);
  } else if (value.is_tensordict()) {
    TensorDict td = value.tensordict();
    td = td.node()->dense_form(td);
    s.create_group(path);
    for (const auto& k : td.keys()) upload_new(s, concat_path(path, k[0]), td.get_entry(k), opts);
  } else if (value.is_non_tensor_data()) {
    s.write_non_tensor(path, backends::NonTensorValue{value.non_tensor_data().value(), false});
  } else if (value.is_non_tensor_stack()) {
    const NonTensorStack& st = value.non_tensor_stack();
    if (st.batch_size().size() != 1) {
      throw NotImplementedError("a NonTensorStack of batch " + shape_str(st.batch_size()) +
                                " in a store (one value per row along dim 0 only)");
    }
    // Redis: Python's layout (its set and from_tensordict), ONE json blob of the stack's tolist(), which both
    // libraries read back as a NonTensorStack when it holds one value per row of the store's batch; other
    // stores get it as one value per row (HDF5 refuses it: one value per dataset)
    s.write_non_tensor(path, backends::NonTensorValue{JsonValue::array(st.values()), !s.stack_as_one_value()});
  } else {
    throw TypeError(std::string("cannot store a ") + Entry::kind_name(value.kind()) + " at " + path_str(path));
  }
}

}  // namespace

void write_selected(actors::StoreClient& client, const std::vector<std::pair<LeafSel, at::Tensor>>& items) {
  std::vector<backends::LeafWrite> writes;
  std::vector<const std::pair<LeafSel, at::Tensor>*> patches;  // partial rows: read, patch, write back
  for (const auto& item : items) {
    const LeafSel& s = item.first;
    const at::Tensor& v = item.second;
    const BatchSize feat = tail(s.info->shape, s.level_batch.size());
    const ResolvedIndex::RowPlan* plan = s.plan;
    backends::LeafWrite w;
    w.path = s.info->path;
    if (s.level_batch.empty() || !plan || (plan->all && plan->in_order)) {  // LeafWrite checks the element count
      w.whole = true;
      w.data = v;
    } else if (plan->in_order) {
      w.whole = false;
      w.rows = plan->rows;
      w.data = v;
    } else if (static_cast<int64_t>(plan->rows.size()) * plan->per_row == s.index->numel()) {
      // whole rows in another order, no repeats: a permutation of the rows, no read needed
      w.whole = false;
      w.rows = plan->rows;
      const BatchSize flat_shape = concat({static_cast<int64_t>(plan->rows.size()) * plan->per_row}, feat);
      at::Tensor data = at::empty(flat_shape, v.options());
      data.index_copy_(0, plan->local.reshape({-1}), v.reshape(concat({-1}, feat)));
      w.data = data.reshape(concat({static_cast<int64_t>(plan->rows.size())}, tail(s.info->shape, 1)));
    } else {
      patches.push_back(&item);
      continue;
    }
    writes.push_back(std::move(w));
  }
  if (!patches.empty()) {
    std::vector<backends::LeafRead> reads;
    for (const auto* p : patches) reads.push_back(to_read(p->first, false));
    std::vector<at::Tensor> rows = client.read(std::move(reads));
    for (size_t i = 0; i < patches.size(); ++i) {
      const LeafSel& s = patches[i]->first;
      const BatchSize feat = tail(s.info->shape, s.level_batch.size());
      at::Tensor r = rows.at(i).contiguous();
      at::Tensor flat = r.view(concat({static_cast<int64_t>(s.plan->rows.size()) * s.plan->per_row}, feat));
      flat.index_put_({s.plan->local.reshape({-1})}, patches[i]->second.reshape(concat({-1}, feat)));
      backends::LeafWrite w;
      w.path = s.info->path;
      w.whole = false;
      w.rows = s.plan->rows;
      w.data = r;
      writes.push_back(std::move(w));
    }
  }
  if (!writes.empty()) client.write(std::move(writes));
}

void RemoteNode::set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index) {
  if (dense_) {
    TensorDict lv = dense_level();
    return lv.node()->set_at(lv, key, value, index);
  }
  if (!selects_batch_dims_only(index, batch_size.size())) return Node::set_at(self, key, value, index);
  const ResolvedIndex sel = *resolve(index);
  const TensorDict rows(index_at(sel));
  const std::optional<EntryMeta> m = rows.meta(key);  // the leaf's shape at the selection: no read
  if (!m || m->kind != EntryMeta::Kind::Tensor) return Node::set_at(self, key, value, index);  // its errors
  // torch's index_put_ rule (leaf[index tensors] = value): the leaf's dtype, except a lone mask and a value of
  // one element (masked_fill_)
  int64_t tensors = 0, masks = 0;
  for (const auto& e : index) {
    tensors += e.is_tensor() ? 1 : 0;
    masks += e.is_tensor() && e.tensor().scalar_type() == at::kBool ? 1 : 0;
  }
  const bool masked_fill = tensors == 1 && masks == 1 && value.numel() == 1;
  if (tensors > 0 && !masked_fill && value.scalar_type() != m->dtype) {
    throw RuntimeError("set_at_: Index put requires the source and destination dtypes match, got " +
                       std::string(c10::toString(m->dtype)) + " for the destination and " +
                       c10::toString(value.scalar_type()) + " for the source (key " + key.repr() + ")");
  }
  at::Tensor v;
  try {
    v = value.to(m->dtype).expand(m->shape);
  } catch (const c10::Error&) {
    throw RuntimeError("set_at_: a value of shape " + shape_str(sizes_of(value)) + " cannot be broadcast to the " +
                       "indexed shape " + shape_str(m->shape) + " of key " + key.repr());
  }
  TensorDict one(rows.batch_size(), device);
  one.set(key, v);
  write_at(sel, one);
}

void RemoteNode::put(const std::string& key, const Entry& value_in) {
  const LeafPath cp = child_path(key);
  if (dense_) {
    TensorDict lv = dense_level();  // one snapshot for the check and the write
    if (lv.node()->read(key)) {     // an existing key: written in place (upstream's inplace)
      lv.set_(NestedKey(key), value_in);
      return;
    }
  }
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

void RemoteNode::write(const Index& index, const TensorDict& value) {
  if (dense_) {
    dense_level().index_put_(index, value);
    return;
  }
  write_at(*resolve(index), value);
}

void RemoteNode::write_at(const ResolvedIndex& sel, const TensorDict& value_in) {
  if (dense_) return dense_level().node()->write_at(sel, value_in);
  auto snap = tree_->snapshot();  // taken again after new keys are created below
  const BatchSize level_batch = snap->batch_of(path_);
  check_source(sel, level_batch, "td[idx] = value");
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
  // everything the store would refuse is refused before any key is made or any row written (the project's rule;
  // keys were made, then a value that did not broadcast, or a per-row non-tensor the store has no layout for, was
  // refused after the tensor rows were written): the values of existing leaves broadcast to their regions, and
  // the non-tensors written at a selection of rows have a layout
  for (const auto& it : tensors) {
    const backends::LeafInfo* info = snap->leaf(it.path);
    if (!info) continue;
    if (info->kind != backends::LeafKind::Tensor) {
      throw TypeError("td[idx] = value: key " + path_str(it.path) + " holds a non-tensor in " +
                      tree_->client()->describe() + " but the value holds a Tensor");
    }
    const LeafPath lv = parent_of(it.path);
    const BatchSize target = concat(level_sel(lv).result_batch(), tail(info->shape, snap->batch_of(lv).size()));
    if (!at::is_expandable_to(it.data.sizes(), target)) {
      throw RuntimeError("td[idx] = value: the value of " + path_str(it.path) + " has shape " +
                         shape_str(sizes_of(it.data)) + ", which cannot be broadcast to the indexed region " +
                         shape_str(target));
    }
  }
  for (const auto& nt : non_tensors) {
    const LeafPath lv = parent_of(nt.first);
    const BatchSize lb = snap->batch_of(lv);
    const ResolvedIndex ls = level_sel(lv);
    const std::optional<ResolvedIndex::RowPlan> plan = lb.empty() ? std::nullopt : std::optional(ls.row_plan());
    if (!plan || (plan->all && plan->in_order)) continue;  // written whole
    if (plan->per_row != 1) {
      throw NotImplementedError("writing the non-tensor " + path_str(nt.first) + " at an index of a store with " +
                                std::to_string(lb.size()) + " batch dims (one value per row along dim 0 only)");
    }
    if (!tree_->client()->holds_non_tensor_rows()) {
      throw NotImplementedError(tree_->client()->describe() + ": the non-tensor " + path_str(nt.first) +
                                " written at a selection of rows needs one value per row, which this store cannot hold");
    }
  }
  // keys the store lacks: preallocated zero-filled at the full batch size, as upstream's first indexed write
  std::vector<std::pair<LeafPath, std::pair<at::ScalarType, BatchSize>>> missing;
  for (const auto& it : tensors) {
    if (snap->leaf(it.path)) continue;
    if (!tree_->client()->writable()) continue;  // the write below reports the read-only store
    const LeafPath lv = parent_of(it.path);
    const BatchSize lrb = level_sel(lv).result_batch();
    BatchSize shape = concat(snap->batch_of(lv), tail(sizes_of(it.data), lrb.size()));
    missing.emplace_back(it.path, std::make_pair(it.data.scalar_type(), shape));
  }
  // the keys made here are removed again when the write fails after them (a lost connection, a full disk)
  struct MadeKeys {
    RemoteTree* tree;
    std::vector<LeafPath> paths;
    bool kept = false;
    ~MadeKeys() {
      if (kept || paths.empty()) return;
      try {
        tree->client()->run([&](backends::LeafStore& s) {
          for (const auto& p : paths) s.erase(p);
        });
        tree->reload();
      } catch (...) {  // the store is gone: nothing more to remove
      }
    }
  } made{tree_.get(), {}};
  if (!missing.empty()) {
    tree_->client()->run([&](backends::LeafStore& s) {
      for (const auto& m : missing) {
        s.create(m.first, m.second.first, m.second.second, at::Tensor(), tree_->create_options);
        made.paths.push_back(m.first);
      }
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
  std::vector<std::pair<LeafSel, at::Tensor>> items;
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
    items.emplace_back(LeafSel{info, ls, plans.get(lv, ls), lb}, leaf_data(std::move(v), info->dtype));
  }
  write_selected(*tree_->client(), items);

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
      for (int64_t i = 0; i < pos.numel(); ++i)  // positions anyone holding the index can change: checked first
        if (p[i] < 0 || p[i] >= lb[0]) throw IndexError("index " + std::to_string(p[i]) + " is out of bounds for dimension 0 with size " + std::to_string(lb[0]));
      for (int64_t i = 0; i < pos.numel(); ++i) {
        const JsonValue& v = nt.second.is_non_tensor_data() ? nt.second.non_tensor_data().value()
                                                             : nt.second.non_tensor_stack().at(i);
        rows[static_cast<size_t>(p[i])] = v;
      }
      s.write_non_tensor(nt.first, backends::NonTensorValue{JsonValue::array(std::move(rows)), true});
    });
    if (!info) tree_->reload();
  }
  made.kept = true;
}

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
    for (const auto& k : td.keys()) upload_new(s, concat_path(path, k[0]), td.get_entry(k), opts);
  });
  tree.reload();
}

}  // namespace remote
}  // namespace tensordict
