// TensorDict writes: set / set_ / update / del / rename_key_ / fill_, the key-structure ops (select,
// exclude, split_keys, flatten_keys, empty), clone / to, lock. Each operation reaches its node (node.hpp);
// the dense node's forms are here.
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ExpandUtils.h>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensor_dict_paths.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tree_visitor.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {

using detail::check_node_unlocked;
using detail::check_unlocked;
using detail::dense_walk;
using detail::make_empty;
using detail::missing_in_node;
using detail::node_of;
using detail::parent_of;
using detail::prepare_value;
using detail::shape_str;
using detail::throw_missing_key;

// ============================================================================ writing
//! upstream's class for a nested key through a leaf depends on the call: the walks raise set's KeyError and
//! get's / pop's ValueError; set_ (KeyError) and del_ (AttributeError: 'Tensor' object has no attribute
//! 'del_') ask here first and get the walks' text under their own class
static void leaf_on_path_as(const TensorDict& td, const NestedKey& key, ErrorCode code) {
  if (key.size() < 2 || !td.node()) return;
  try {
    (void)parent_of(td, key, /*create=*/false);
  } catch (const ValueError& e) {
    throw_error(code, e.message());
  }
}

static void copy_into(Entry& dest, const Entry& value, const NestedKey& key) {
  if (dest.is_tensor()) {
    if (!value.is_tensor()) {
      throw TypeError("in-place write of a " + std::string(Entry::kind_name(value.kind())) + " into tensor " +
                      key.repr());
    }
    at::Tensor d = dest.tensor();
    const at::Tensor& v = value.tensor();
    backends::reserve_for_store(d);  // a memmap leaf: a full disk is a BackendError, not a SIGBUS
    if (!v.sizes().equals(d.sizes())) {
      // copy_ broadcasts; upstream allows it too, but a larger value is an error
      try {
        d.copy_(v);
      } catch (const c10::Error& err) {
        throw BatchSizeError("cannot copy a value of shape " + shape_str(v.sizes()) + " into " + key.repr() +
                             " of shape " + shape_str(d.sizes()));
      }
      return;
    }
    d.copy_(v);
  } else if (dest.is_tensordict()) {
    TensorDict d = dest.tensordict();
    if (value.is_tensordict()) {
      d.update_(value.tensordict());
    } else if (value.is_dict()) {
      d.update_(TensorDict(value.dict(), d.batch_size(), d.device()));
    } else {
      throw TypeError("in-place write of a " + std::string(Entry::kind_name(value.kind())) + " into TensorDict " +
                      key.repr());
    }
  } else if (dest.is_non_tensor()) {
    if (!value.is_non_tensor()) throw TypeError("in-place write of a tensor into non-tensor " + key.repr());
    BatchSize bs = dest.shape();
    if (value.is_non_tensor_data()) {
      dest = Entry(NonTensorData(value.non_tensor_data().value(), bs));
    } else {
      if (value.non_tensor_stack().batch_size() != bs) {
        throw BatchSizeError("cannot write a NonTensorStack of batch " + shape_str(value.non_tensor_stack().batch_size()) +
                             " into " + key.repr() + " of batch " + shape_str(bs));
      }
      dest = value;
    }
  }
}

//! the first parent level of `key` that does not exist yet in the dense levels from `root` (the level holding it
//! and its name); nothing when every parent exists (or the walk leaves the dense levels)
static std::optional<std::pair<TensorDictImpl*, std::string>> first_missing_level(TensorDictImpl* root,
                                                                                 const NestedKey& key) {
  TensorDictImpl* cur = root;
  for (size_t i = 0; cur && i + 1 < key.size(); ++i) {
    Entry* e = cur->find(key[i]);
    if (!e) return std::make_pair(cur, key[i]);
    if (!e->is_tensordict()) return std::nullopt;
    cur = detail::tree::dense_root(e->tensordict());
  }
  return std::nullopt;
}

TensorDict& TensorDict::set(const NestedKey& key, const Entry& value, const SetOptions& options) {
  auto walked = [&]() -> TensorDict& {
    const bool inplace = options.inplace();
    if (key.empty()) throw KeyError("empty key");
    if (inplace) leaf_on_path_as(*this, key, ErrorCode::Key);  // a locked node does not create: its walk reads
    TensorDictImpl* p = nullptr;
    if (!dense_walk(dense_, key, /*create=*/dense_ && (!dense_->locked || !inplace), &p)) {
      if (!node_) d("set");
      TensorDict parent = parent_of(*this, key, /*create=*/!is_locked() || !inplace);
      if (!parent.defined()) missing_in_node(key, *this);
      parent.node()->set_entry(key, value, inplace);
      return *this;
    }
    if (!p) throw_missing_key(key, *d());
    Entry* existing = p->find(key.back());
    if (existing && inplace) {
      copy_into(*existing, prepare_value(*p, key.back(), value), key);
      return *this;
    }
    if (p->locked) check_unlocked(*p, "set " + key.repr());
    Entry v = prepare_value(*p, key.back(), value);
    p->put(key.back(), std::move(v));
    return *this;
  };
  // the levels a nested key's walk creates are removed again when the value is refused (a batch size that does not
  // fit left empty levels behind)
  const auto made = key.size() > 1 && dense_ ? first_missing_level(dense_, key) : std::nullopt;
  if (!made) return walked();
  try {
    return walked();
  } catch (...) {
    made->first->erase_entry(made->second);
    throw;
  }
}

TensorDict& TensorDict::set(const char* key, const Entry& value, const SetOptions& options) {
  // an unlocked dense node, not in place: what the general path does for a one-part key, without the NestedKey
  if (dense_ && !options.inplace() && !dense_->locked && key && *key) {
    std::string k(key);
    dense_->put_entry(k, prepare_value(*dense_, k, value));
    return *this;
  }
  return set(NestedKey(key), value, options);
}

TensorDict& TensorDict::set_(const NestedKey& key, const Entry& value) {
  if (key.empty()) throw KeyError("empty key");
  leaf_on_path_as(*this, key, ErrorCode::Key);
  TensorDictImpl* p = nullptr;
  if (!dense_walk(dense_, key, false, &p)) {
    if (!node_) d("set_");
    TensorDict parent = parent_of(*this, key, false);
    if (!parent.defined()) {
      throw KeyError("key " + key.repr() + " not found in tensordict, call td.set(key, value) to add a new key");
    }
    parent.node()->update_entry(key, value);
    return *this;
  }
  Entry* existing = p ? p->find(key.back()) : nullptr;
  if (!existing) {
    throw KeyError("key " + key.repr() + " not found in tensordict, call td.set(key, value) to add a new key");
  }
  copy_into(*existing, prepare_value(*p, key.back(), value), key);
  return *this;
}

TensorDict& TensorDict::set_at_(const NestedKey& key, const at::Tensor& value, const Index& index) {
  node_of(node_, "set_at_").set_at(*this, key, value, index);
  return *this;
}

void TensorDictImpl::set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index) {
  at::Tensor t = self.get(key);  // a view of the leaf: written in place
  t.index_put_(index, value);
}

void TensorDictImpl::set_entry(const NestedKey& key, const Entry& value, bool inplace) {
  TensorDict(std::static_pointer_cast<TensorDictImpl>(shared_from_this())).set(NestedKey(key.back()), value, SetOptions().inplace(inplace));
}

void TensorDictImpl::update_entry(const NestedKey& key, const Entry& value) {
  TensorDict(std::static_pointer_cast<TensorDictImpl>(shared_from_this())).set_(NestedKey(key.back()), value);
}

void TensorDictImpl::del_entry(const NestedKey& key) {
  TensorDict(std::static_pointer_cast<TensorDictImpl>(shared_from_this())).del(NestedKey(key.back()));
}

TensorDict& TensorDict::set_non_tensor(const NestedKey& key, const JsonValue& value) {
  return set(key, Entry(value));
}

//! what update() replaced or added, to put back when a later key is refused (a batch size that does not fit, a
//! locked sub-TensorDict): each level's node puts the previous entry back or erases the added key (a dense level
//! swaps the entries, no data copied; a store writes the values it read back)
struct UpdateUndo {
  struct Step {
    std::shared_ptr<Node> level;
    std::string key;
    std::optional<Entry> previous;
  };
  std::vector<Step> steps;

  void record(const TensorDict& level, const std::string& key, const std::optional<Entry>& previous) {
    steps.push_back({level.node(), key, previous});
  }
  void rollback() noexcept {
    for (size_t i = steps.size(); i-- > 0;) {
      try {
        if (steps[i].previous) {
          steps[i].level->put(steps[i].key, *steps[i].previous);
        } else {
          steps[i].level->erase(steps[i].key);
        }
      } catch (...) {  // the level refuses its own entry back (closed meanwhile): nothing more to do
      }
    }
  }
};

//! every value of an in-place update fits its key before any is written (the project's rule: a later key that
//! does not fit left the earlier ones written): a tensor into a tensor, broadcast to its shape as copy_ does; a
//! non-tensor into a non-tensor. From the keys' metadata (no read)
void detail::check_copy_into(const EntryMeta& m, const Entry& v, const NestedKey& k) {
  if (m.kind == EntryMeta::Kind::Tensor) {
    if (!v.is_tensor()) {
      throw TypeError("in-place write of a " + std::string(Entry::kind_name(v.kind())) + " into tensor " + k.repr());
    }
    if (std::find(m.shape.begin(), m.shape.end(), -1) == m.shape.end() &&
        !at::is_expandable_to(v.tensor().sizes(), m.shape)) {
      throw BatchSizeError("cannot copy a value of shape " + shape_str(v.tensor().sizes()) + " into " + k.repr() +
                           " of shape " + shape_str(m.shape));
    }
  } else if (m.kind == EntryMeta::Kind::NonTensor && !v.is_non_tensor()) {
    throw TypeError("in-place write of a " + std::string(Entry::kind_name(v.kind())) + " into non-tensor " + k.repr());
  } else if (m.is_tensordict() && !v.is_tensordict() && !v.is_dict()) {
    throw TypeError("in-place write of a " + std::string(Entry::kind_name(v.kind())) + " into TensorDict " + k.repr());
  }
}

static void check_in_place_values(const TensorDict& self, const std::vector<std::pair<NestedKey, Entry>>& items) {
  std::unordered_map<std::string, EntryMeta> metas;
  for (auto& [k, m] : detail::key_metas(self, KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true)))
    metas.emplace(k.repr(), std::move(m));
  for (const auto& [k, v] : items) {
    const auto it = metas.find(k.repr());
    if (it == metas.end()) continue;  // the write reports it
    const EntryMeta& m = it->second;
    if (m.kind == EntryMeta::Kind::Tensor && v.is_tensor()) {
      const at::IntArrayRef vs = v.tensor().sizes();
      const BatchSize& batch = self.batch_size();
      if (vs.size() < batch.size() || !std::equal(batch.begin(), batch.end(), vs.begin())) {  // set_'s own rule
        throw BatchSizeError("batch dimension mismatch, got self.batch_size=" + shape_str(batch) +
                             " and value.shape=" + shape_str(vs) + " (key " + k.repr() + ")");
      }
    }
    detail::check_copy_into(m, v, k);
  }
}

//! update's keys_to_update: the key, a key under it, or a key above it is listed
static bool wanted_key(const UpdateOptions& o, const NestedKey& full) {
  if (!o.keys_to_update()) return true;
  const std::string joined = full.join(".");
  for (const auto& w : *o.keys_to_update())
    if (w == joined || joined.rfind(w + ".", 0) == 0 || w.rfind(joined + ".", 0) == 0) return true;
  return false;
}

//! the leaves update(inplace) writes in place (existing keys, walked as update_impl walks them), for
//! check_in_place_values before any is written
static void inplace_items(const TensorDict& self, const TensorDict& other, const UpdateOptions& o,
                          const NestedKey& prefix, std::vector<std::pair<NestedKey, Entry>>& out) {
  for (const auto& kv : other.node()->read_all()) {
    const NestedKey full = prefix + NestedKey(kv.first);
    if (!wanted_key(o, full)) continue;
    const std::optional<EntryMeta> mine = self.node()->meta(kv.first);
    if (!mine) continue;
    if (kv.second.is_tensordict() && mine->is_tensordict()) {
      inplace_items(self.get_td(NestedKey(kv.first)), kv.second.tensordict(), o, full, out);
    } else if (!kv.second.is_tensordict()) {
      out.emplace_back(full, kv.second);
    } else {  // a TensorDict into a tensor or a non-tensor: the write's own refusal, before anything is written
      throw TypeError("in-place write of a TensorDict into " + std::string(mine->kind == EntryMeta::Kind::Tensor ? "tensor " : "non-tensor ") + full.repr());
    }
  }
}

static void update_impl(TensorDict& self, const TensorDict& other, const UpdateOptions& o, const NestedKey& prefix,
                        UpdateUndo& undo) {
  const std::vector<std::pair<std::string, Entry>> theirs = other.node()->read_all();
  for (const auto& kv : theirs) {
    NestedKey k(kv.first);
    NestedKey full = prefix + k;
    if (!wanted_key(o, full)) continue;
    std::optional<Entry> mine = self.node()->read(kv.first);
    if (kv.second.is_tensordict() && mine && mine->is_tensordict()) {
      TensorDict sub = mine->tensordict();
      update_impl(sub, kv.second.tensordict(), o, full, undo);
      continue;
    }
    Entry v = kv.second;
    if (o.clone()) {
      if (v.is_tensor()) v = Entry(v.tensor().clone());
      if (v.is_tensordict()) v = Entry(v.tensordict().clone());
    }
    if (o.inplace() && mine) {
      self.set(k, v, SetOptions().inplace(true));
      continue;
    }
    undo.record(self, kv.first, mine);
    if (o.ignore_lock()) {
      bool was = self.node()->locked;
      self.node()->locked = false;
      try {
        self.set(k, v);
      } catch (...) {
        self.node()->locked = was;
        throw;
      }
      self.node()->locked = was;
    } else {
      self.set(k, v);
    }
  }
}

TensorDict& TensorDict::update(const TensorDict& other, const UpdateOptions& options) {
  if (other.is_same(*this)) return *this;
  if (options.inplace()) {  // the leaves written in place are checked before any is
    std::vector<std::pair<NestedKey, Entry>> items;
    inplace_items(*this, other, options, NestedKey(), items);
    check_in_place_values(*this, items);
  }
  UpdateUndo undo;
  try {
    update_impl(*this, other, options, NestedKey(), undo);
  } catch (...) {
    undo.rollback();
    throw;
  }
  return *this;
}

static void check_all_exist(const TensorDict& self, const TensorDict& other) {
  for (const auto& k : other.keys(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (!self.contains(k)) {
      throw KeyError("key " + k.repr() + " not found in the destination TensorDict: update_ only writes existing keys");
    }
  }
}

TensorDict& TensorDict::update_(const TensorDict& other) {
  if (other.is_same(*this)) return *this;
  check_all_exist(*this, other);
  const auto items = other.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true));
  check_in_place_values(*this, items);
  for (const auto& kv : items) set_(kv.first, kv.second);
  return *this;
}

TensorDict& TensorDict::update_(const TensorDict& other, const std::vector<NestedKey>& keys_to_update) {
  if (other.is_same(*this)) return *this;
  auto selected = [&](const NestedKey& k) {
    for (const auto& u : keys_to_update)
      if (u.size() <= k.size() && std::equal(u.parts().begin(), u.parts().end(), k.parts().begin())) return true;
    return false;
  };
  std::vector<std::pair<NestedKey, Entry>> items;
  for (auto& kv : other.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    if (!selected(kv.first)) continue;
    if (!contains(kv.first)) {
      throw KeyError("key " + kv.first.repr() + " not found in the destination TensorDict: update_ only writes "
                     "existing keys");
    }
    items.push_back(std::move(kv));
  }
  check_in_place_values(*this, items);
  for (const auto& kv : items) set_(kv.first, kv.second);
  return *this;
}

TensorDict& TensorDict::update_at_(const TensorDict& other, const Index& index) {
  check_all_exist(*this, other);
  if (!dense_) {
    this->index(index).update_(other);
    return *this;
  }
  const auto items = other.items(KeysOptions().include_nested(true).leaves_only(true));
  // an index of the batch dims: the leaves written as td[idx] = value writes them (nothing written when one
  // refuses); an index reaching past them into a leaf's own dims (upstream's tensor[idx] = value allows it):
  // leaf by leaf
  const bool batch_index = std::all_of(index.begin(), index.end(), [](const at::indexing::TensorIndex& e) {
    return !e.is_none() && !e.is_ellipsis();
  }) && index.size() <= batch_size().size();
  if (batch_index) {
    std::vector<std::tuple<at::Tensor, at::Tensor, std::string>> leaves;
    for (const auto& kv : items) leaves.emplace_back(get(kv.first), kv.second.tensor(), kv.first.repr());
    detail::put_leaves_at(batch_size(), index, leaves);
    return *this;
  }
  for (const auto& kv : items) get(kv.first).index_put_(index, kv.second.tensor());
  return *this;
}

Entry TensorDict::pop(const NestedKey& key) {
  Entry e = get_entry(key);
  del(key);
  return e;
}

Entry TensorDict::pop(const NestedKey& key, const Entry& default_value) {
  if (!contains(key)) {
    leaf_on_path_as(*this, key, ErrorCode::Value);  // upstream: a leaf on the way raises, even with a default
    return default_value;
  }
  return pop(key);
}

TensorDict& TensorDict::del(const NestedKey& key) {
  if (key.empty()) throw KeyError("empty key");
  leaf_on_path_as(*this, key, ErrorCode::Attribute);
  TensorDictImpl* p = nullptr;
  if (!dense_walk(dense_, key, false, &p)) {
    if (!node_) d("del");
    TensorDict parent = parent_of(*this, key, false);
    if (!parent.defined() || !parent.node()->read(key.back())) missing_in_node(key, parent.defined() ? parent : *this);
    parent.node()->del_entry(key);
    return *this;
  }
  if (!p || !p->find(key.back())) throw_missing_key(key, p ? *p : *d());
  if (p->locked) check_unlocked(*p, "del " + key.repr());
  p->erase(key.back());
  return *this;
}

TensorDict& TensorDict::rename_key_(const NestedKey& old_key, const NestedKey& new_key, const RenameOptions& options) {
  node_of(node_, "rename_key_").rename_key(*this, old_key, new_key, options.safe());
  return *this;
}

void TensorDictImpl::rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) {
  check_unlocked(*this, "rename_key_");
  if (old_key == new_key) return;
  if (safe && self.contains(new_key)) {
    throw KeyError("key " + new_key.repr() + " already present in TensorDict (rename_key_ with safe=true)");
  }
  Entry e = self.get_entry(old_key);
  TensorDictImpl* op = detail::walk(this, old_key, false);
  check_unlocked(*op, "rename_key_");
  // upstream: the renamed key is set under its new name, then the old one deleted, so it moves to the end of its
  // level. A new name that cannot be set (it runs through a leaf, its level is locked, another batch size) leaves
  // the old key as it was. One name inside the other: the old key goes first, and comes back if the new is refused
  const size_t common = std::min(old_key.size(), new_key.size());
  const bool nested = std::equal(old_key.parts().begin(), old_key.parts().begin() + static_cast<long>(common),
                                 new_key.parts().begin());
  if (!nested) {
    self.set(new_key, e);
    self.del(old_key);
    return;
  }
  self.del(old_key);
  try {
    self.set(new_key, e);
  } catch (...) {
    self.set(old_key, e);
    throw;
  }
}

Entry TensorDict::setdefault(const NestedKey& key, const Entry& default_value) {
  if (!contains(key)) set(key, default_value);
  return get_entry(key);
}

TensorDict& TensorDict::clear() {
  node_of(node_, "clear").clear(*this);
  return *this;
}

void TensorDictImpl::clear(TensorDict&) {
  check_unlocked(*this, "clear");
  entries.clear();
}

TensorDict& TensorDict::fill_(const NestedKey& key, const at::Scalar& value) {
  node_of(node_, "fill_").fill(*this, key, value);
  return *this;
}

void TensorDictImpl::fill(TensorDict& self, const NestedKey& key, const at::Scalar& value) {
  Entry e = self.get_entry(key);  // views: filled in place
  if (e.is_tensordict()) {
    e.tensordict().apply_([&](const at::Tensor& t) { return t.fill_(value); });
  } else {
    e.tensor().fill_(value);
  }
}

// ============================================================================ key-structure ops
TensorDict TensorDict::empty(const EmptyOptions& options) const {
  return node_of(node_, "empty").empty(*this, options.recurse());
}

TensorDict TensorDictImpl::empty(const TensorDict&, bool recurse) const {
  TensorDict out = make_empty(*this, batch_size);
  if (recurse) {
    for (const auto& kv : entries)
      if (kv.second.is_tensordict()) detail::impl_of(out)->put(kv.first, Entry(kv.second.tensordict().empty(EmptyOptions().recurse(true))));
  }
  return out;
}

TensorDict TensorDict::select(const std::vector<NestedKey>& keys, const SelectOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).select(keys, options));
  return node_of(node_, "select").select(*this, keys, options.strict(), options.inplace());
}

TensorDict TensorDictImpl::select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict,
                                  bool inplace) const {
  TensorDictImpl* d = const_cast<TensorDictImpl*>(this);  // inplace: this level's entries are replaced
  if (inplace) check_unlocked(*this, "select(inplace=true)");
  TensorDict out = make_empty(*this, batch_size);
  for (const auto& k : keys) {
    auto e = self.get_entry_opt(k);
    if (!e && strict) throw_missing_key(k, *this);
    // rebuild intermediate levels with their own batch sizes; with strict=false a missing leaf still keeps
    // the levels above it that exist (upstream)
    TensorDictImpl* dst = detail::impl_of(out).get();
    const TensorDictImpl* src = this;
    bool reached = true;
    for (size_t i = 0; i + 1 < k.size(); ++i) {
      const Entry* se = src->find(k[i]);
      if (!se || !se->is_tensordict()) {
        reached = false;
        break;
      }
      src = detail::impl_of(se->tensordict()).get();
      Entry* de = dst->find(k[i]);
      if (!de) {
        dst->put(k[i], Entry(make_empty(*src, src->batch_size)));
        de = dst->find(k[i]);
      }
      dst = detail::impl_of(de->tensordict()).get();
    }
    if (e && reached) dst->put(k.back(), *e);
  }
  if (inplace) {
    d->entries = detail::impl_of(out)->entries;
    return self;
  }
  return out;
}

static void exclude_into(const TensorDictImpl& src, TensorDictImpl& dst, const std::vector<NestedKey>& keys) {
  for (const auto& kv : src.entries) {
    bool drop = false;
    std::vector<NestedKey> sub;
    for (const auto& k : keys) {
      if (k.front() != kv.first) continue;
      if (k.size() == 1) {
        drop = true;
      } else {
        sub.push_back(k.tail());
      }
    }
    if (drop) continue;
    if (!sub.empty() && kv.second.is_tensordict()) {
      const auto& child = *detail::impl_of(kv.second.tensordict());
      TensorDict c = make_empty(child, child.batch_size);
      exclude_into(child, *detail::impl_of(c), sub);
      dst.entries.emplace_back(kv.first, Entry(c));
    } else {
      dst.entries.emplace_back(kv.first, kv.second);
    }
  }
}

TensorDict TensorDict::exclude(const std::vector<NestedKey>& keys, const ExcludeOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).exclude(keys, options));
  return node_of(node_, "exclude").exclude(*this, keys, options.inplace());
}

TensorDict TensorDictImpl::exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const {
  // upstream allows exclude(inplace=True) on a locked (memmap, shared) TensorDict: no lock check here
  TensorDict out = make_empty(*this, batch_size);
  exclude_into(*this, *detail::impl_of(out), keys);
  if (inplace) {
    const_cast<TensorDictImpl*>(this)->entries = detail::impl_of(out)->entries;
    return self;
  }
  return out;
}

static std::vector<TensorDict> split_keys_impl(const TensorDict& self,
                                               const std::vector<std::vector<NestedKey>>& key_sets, bool inplace,
                                               bool strict, const Entry* default_value) {
  // upstream: strict drops `default` (NO_DEFAULT: pop raises KeyError); without strict a missing key gets the
  // default, and a None default (ours: no default, or an empty Entry) skips it
  if (strict || (default_value && default_value->kind() == Entry::Kind::None)) default_value = nullptr;
  std::vector<TensorDict> out;
  std::vector<NestedKey> all;
  for (const auto& ks : key_sets) {
    if (strict) {
      out.push_back(self.select(ks, SelectOptions().strict(true)));
    } else if (!default_value) {  // a missing key is skipped (no level of it is kept)
      std::vector<NestedKey> present;
      for (const auto& k : ks)
        if (self.contains(k)) present.push_back(k);
      out.push_back(self.select(present, SelectOptions().strict(true)));
    } else {  // each key in its set's order: its entry, or the default
      TensorDict part = self.select({}, SelectOptions().strict(true));
      for (const auto& k : ks) part.set(k, self.contains(k) ? self.get_entry(k) : *default_value);
      out.push_back(part);
    }
    all.insert(all.end(), ks.begin(), ks.end());
  }
  TensorDict rest = inplace ? self.exclude(all, ExcludeOptions().inplace(true)) : self.exclude(all).clone();
  // upstream filter_empty_() on the rest: sub-TensorDicts left without a leaf go (empty ones it had too)
  if (!rest.is_locked()) {
    std::vector<NestedKey> empty;
    for (const auto& k : rest.keys(KeysOptions().include_nested(true))) {  // the structure only: no leaf read
      const std::optional<EntryMeta> m = rest.meta(k);
      if (m && m->is_tensordict() && rest.get_td(k).is_empty()) empty.push_back(k);
    }
    for (const auto& k : empty)
      if (rest.contains(k)) rest.del(k);
  }
  out.push_back(rest);
  return out;
}

std::vector<TensorDict> TensorDict::split_keys(const std::vector<std::vector<NestedKey>>& key_sets,
                                               const Entry& default_value, const SelectOptions& options) const {
  return split_keys_impl(*this, key_sets, options.inplace(), options.strict(), &default_value);
}

std::vector<TensorDict> TensorDict::split_keys(const std::vector<std::vector<NestedKey>>& key_sets,
                                               const SelectOptions& options) const {
  return split_keys_impl(*this, key_sets, options.inplace(), options.strict(), nullptr);
}

TensorDict TensorDict::flatten_keys(const FlattenKeysOptions& options) const {
  return node_of(node_, "flatten_keys").flatten_keys(*this, options.separator(), options.inplace());
}

TensorDict TensorDictImpl::flatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const {
  TensorDictImpl* d = const_cast<TensorDictImpl*>(this);  // inplace: this level's entries are replaced
  TensorDict out = make_empty(*this, batch_size);
  for (auto& kv : self.items(KeysOptions().include_nested(true))) {
    const Entry& e = kv.second;
    if (e.is_tensordict()) continue;  // upstream: sub-TensorDicts (empty ones too) leave no key
    std::string k = kv.first.join(separator);
    if (detail::impl_of(out)->find(k)) {
      throw KeyError("flatten_keys: the flattened key '" + k + "' collides with an existing key");
    }
    detail::impl_of(out)->entries.emplace_back(k, e);
  }
  if (inplace) {
    check_unlocked(*this, "flatten_keys(inplace=true)");
    d->entries = detail::impl_of(out)->entries;
    return self;
  }
  return out;
}

TensorDict TensorDict::unflatten_keys(const FlattenKeysOptions& options) const {
  return node_of(node_, "unflatten_keys").unflatten_keys(*this, options.separator(), options.inplace());
}

TensorDict TensorDictImpl::unflatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const {
  TensorDictImpl* d = const_cast<TensorDictImpl*>(this);  // inplace: this level's entries are replaced
  if (separator.empty()) throw ValueError("unflatten_keys: empty separator");
  TensorDict out = make_empty(*this, batch_size);
  // upstream renames each key holding the separator to its parts in turn (rename_key_(key, parts, safe=True)):
  // the other keys keep their slots, the rebuilt ones follow in their order; a key that exists already, or a
  // leaf on its path, is a KeyError
  std::vector<std::pair<const std::string*, Entry>> renamed;
  for (const auto& kv : entries) {
    Entry v = kv.second;
    if (v.is_tensordict()) v = Entry(v.tensordict().unflatten_keys(separator));
    if (kv.first.find(separator) == std::string::npos) {
      detail::impl_of(out)->entries.emplace_back(kv.first, std::move(v));
    } else {
      renamed.emplace_back(&kv.first, std::move(v));
    }
  }
  for (auto& [name, v] : renamed) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t pos = name->find(separator, start);
      parts.push_back(name->substr(start, pos - start));
      if (pos == std::string::npos) break;
      start = pos + separator.size();
    }
    const NestedKey k(std::move(parts));
    if (out.contains(k))
      throw KeyError("unflatten_keys: key '" + *name + "' collides with another key unflattened to " + k.repr());
    try {
      out.set(k, v);
    } catch (const KeyError& e) {  // a level of k is a leaf
      throw KeyError("unflatten_keys: key '" + *name + "' collides with a leaf (" + e.message() + ")");
    }
  }
  if (inplace) {
    check_unlocked(*this, "unflatten_keys(inplace=true)");
    d->entries = detail::impl_of(out)->entries;
    return self;
  }
  return out;
}

// ============================================================================ clone, to
namespace {
//! the tree visitor's rebuild for clone: leaves copied (recurse) or shared; a sub-TensorDict of another
//! node kind clones itself; typed sub-TensorDicts keep their schema
struct CloneVisitor : detail::tree::RebuildVisitor {
  bool recurse;
  at::Tensor tensor(const detail::tree::KeyPath&, const at::Tensor& t, const detail::tree::Matched&) {
    return recurse ? t.clone() : t;
  }
  BatchSize sub_batch(const BatchSize&, size_t, const BatchSize& own) { return own; }
  const TensorDictImpl* descend(const detail::tree::KeyPath&, const TensorDict& sub, const detail::tree::Matched&) {
    return detail::tree::level_of(sub, detail::tree::Descend::DenseOnly);
  }
  std::optional<TensorDict> other_node(const detail::tree::KeyPath&, const TensorDict& sub, const BatchSize&,
                                       const detail::tree::Matched&) {
    return sub.clone(CloneOptions().recurse(recurse));
  }
  std::optional<TensorDict> sub_result(const detail::tree::KeyPath&, const TensorDict& sub, TensorDict out, bool) {
    return detail::keep_type(sub, std::move(out));
  }
};
}  // namespace

TensorDict TensorDict::clone(const CloneOptions& options) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).clone(options));
  return node_of(node_, "clone").clone(*this, options.recurse());
}

TensorDict TensorDictImpl::clone(const TensorDict&, bool recurse) const {
  CloneVisitor v{{}, recurse};
  return detail::tree::rebuild(*this, batch_size, v);
}

namespace {
//! the tree visitor's rebuild for shallow_copy: every level a new node with the source's flags, directory
//! and class records, unlocked; leaves shared
struct CopyNodesVisitor : detail::tree::RebuildVisitor {
  TensorDict make_level(const detail::tree::KeyPath&, const TensorDictImpl& src, BatchSize) {
    auto out = std::make_shared<TensorDictImpl>(src);  // flags, directory, records (entries rebuilt)
    out->entries.clear();
    out->locked = false;
    out->locked_parents.clear();
    return TensorDict(std::move(out));
  }
  //! another node kind below: NotImplementedError, as impl() says
  const TensorDictImpl* descend(const detail::tree::KeyPath&, const TensorDict& sub, const detail::tree::Matched&) {
    return detail::impl_of(sub).get();
  }
};
}  // namespace

TensorDict TensorDict::shallow_copy() const {
  CopyNodesVisitor v;
  return detail::tree::rebuild(*d(), d()->batch_size, v);
}

TensorDict TensorDict::to(at::Device device) const { return node_of(node_, "to").to(*this, device); }

TensorDict TensorDictImpl::to(const TensorDict& self, at::Device device) const {
  if (this->device && *this->device == device) return self;
  std::optional<at::Device> target = device;
  auto set_dev = [&](TensorDictImpl& root) {
    root.device = target;
    detail::tree::for_each_entry(root, [&](const detail::tree::KeyPath&, const Entry& e) -> const TensorDictImpl* {
      if (!e.is_tensordict()) return nullptr;
      TensorDictImpl* level = detail::impl_of(e.tensordict()).get();  // another node kind: NotImplementedError
      level->device = target;
      return level;
    });
  };
  // apply() moves results to the result's device (upstream): run it on a device-less structure copy
  TensorDict src = self.clone(CloneOptions().recurse(false));
  target = std::nullopt;
  set_dev(*detail::impl_of(src));
  TensorDict out = src.apply([&](const at::Tensor& t) { return t.to(device); });
  target = device;
  set_dev(*detail::impl_of(out));
  return out;
}

TensorDict TensorDict::to(at::ScalarType dtype) const {
  return apply([&](const at::Tensor& t) { return t.to(dtype); });
}

// ============================================================================ lock
TensorDict& TensorDict::lock_() {
  if (!node_) d("lock_");
  node_->locked = true;
  detail::lock_children(node_);
  return *this;
}

void TensorDictImpl::unlock() {
  locked = false;
  is_memmap = false;
  is_shared = false;
  consolidated.reset();
}

static void unlock_node(const std::shared_ptr<Node>& node) {
  node->unlock();
  for (const auto& child : node->child_nodes()) {
    auto& lp = child->locked_parents;
    lp.erase(std::remove_if(lp.begin(), lp.end(),
                            [&](const std::weak_ptr<Node>& w) {
                              auto s = w.lock();
                              return !s || s == node;
                            }),
             lp.end());
    if (lp.empty()) unlock_node(child);
  }
}

TensorDict& TensorDict::unlock_() {
  if (!node_) d("unlock_");
  for (auto& w : node_->locked_parents) {
    auto parent = w.lock();
    if (parent && parent->locked && detail::contains_node(*parent, node_.get())) {
      throw LockedError("Cannot unlock a tensordict that is part of a locked graph. Unlock the root tensordict "
                        "first. If the tensordict is part of multiple graphs, group the graphs under a common "
                        "tensordict an unlock this root.");
    }
  }
  node_->locked_parents.clear();
  unlock_node(node_);
  return *this;
}

LockGuard::LockGuard(TensorDict td) : td_(std::move(td)), was_locked_(td_.is_locked()) {
  if (!was_locked_) td_.lock_();
}
LockGuard::~LockGuard() {
  if (!was_locked_) {
    try {
      td_.unlock_();
    } catch (...) {
    }
  }
}
UnlockGuard::UnlockGuard(TensorDict td) : td_(std::move(td)), was_locked_(td_.is_locked()) {
  if (was_locked_) td_.unlock_();
}
UnlockGuard::~UnlockGuard() {
  if (was_locked_) td_.lock_();
}

}  // namespace tensordict
