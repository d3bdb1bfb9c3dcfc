#pragma once
//! Internal to engine/: the one tree visitor the recursive algorithms are written over (issue 9, issue 34).
//!
//! A TensorDict is a tree of nodes: each level (a dense node, a lazy stack, a store, a remote node) holds
//! leaves (tensors, NonTensorData, NonTensorStack) and sub-TensorDicts of any node kind. Four walk shapes
//! cover the algorithms:
//!  (s) `visit`: the structure of one tree through the node interface (Node::metas(), a sub-TensorDict
//!      reached through Node::read() as a handle: no leaf is read unless a hook asks for its value), every
//!      node kind alike; a dense level is walked over its entries directly (its fast path). Key listing,
//!      is_empty, from_dict's batch inference, walk_entries (tensordict/tree.hpp: tdx's walks);
//!  (a) `for_each_leaf` / `for_each_tensor` / `for_each_leaf_mut` / `for_each_entry` / `for_each_level`:
//!      visit the leaves (const or writable), entries or levels of one tree's dense levels;
//!  (b) `rebuild`: a new tree of the same structure from a per-entry transform, each level with its own
//!      new batch size (shape ops, apply, arithmetic, reductions, clone, index, ...);
//!  (c) `rebuild` / `walk` with `others`: several trees walked in parallel by key (binary ops, compare,
//!      where, equal, stack / cat);
//!  (d) `walk_saved`: one tree in the shape a memmap directory holds it, a lazy stack's members as levels of
//!      their own below their stack, with a context per level (its directory, its meta.json node): the
//!      memmap save's plan and the marking of a saved tree.
//! (a)-(c) run over the dense levels' entries directly (no virtual call, no copy of an entry); a
//! sub-TensorDict without a dense level (lazy stack, remote node) is handed to the visitor, which decides
//! (its own form, its dense form, an error). Which sub-TensorDict has a dense level is the visitor's
//! question (`dense_level` / `level_of`, over Node::dense_node() / dense_view()), never the algorithms'.
//! Visitors are templates: callables are inlined, nothing is boxed in a std::function. Keys are built only
//! when asked (`KeyPath::full()`, e.g. for an error message).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor_dict_internal.hpp"

namespace tensordict {
namespace detail {
namespace tree {

//! the path of an entry: a chain of names on the walk's stack; the NestedKey is built on demand
class KeyPath {
 public:
  //! the root (empty path)
  KeyPath() = default;
  KeyPath(const KeyPath& parent, const std::string& name) : parent_(&parent), name_(&name) {}
  KeyPath(const KeyPath&) = delete;
  KeyPath& operator=(const KeyPath&) = delete;

  bool is_root() const { return name_ == nullptr; }
  //! the last part (the key in its level); the root has none
  const std::string& name() const { return *name_; }
  size_t depth() const { return is_root() ? 0 : parent_->depth() + 1; }
  //! the full nested key from the root of the walk
  NestedKey full() const {
    std::vector<std::string> parts(depth());
    size_t i = parts.size();
    for (const KeyPath* p = this; !p->is_root(); p = p->parent_) parts[--i] = *p->name_;
    return NestedKey(std::move(parts));
  }

 private:
  const KeyPath* parent_ = nullptr;
  const std::string* name_ = nullptr;
};

//! the dense level of a sub-TensorDict: its dense node, a store's dense view, or nullptr (lazy stack,
//! remote node). A dense view is kept alive by its node.
inline const TensorDictImpl* dense_level(const TensorDict& td) {
  if (!td.node()) return nullptr;
  if (const TensorDictImpl* dense = td.node()->dense_node()) return dense;
  return td.node()->dense_view().get();
}

//! which sub-TensorDicts a leaf walk enters: dense nodes only, or also nodes with a dense view (stores)
enum class Descend { DenseOnly, DenseOrView };

inline const TensorDictImpl* level_of(const TensorDict& td, Descend how) {
  if (how == Descend::DenseOnly) return td.node() ? td.node()->dense_node() : nullptr;
  return dense_level(td);
}

//! the dense node of a tree's root for the dense fast paths (writable), nullptr for any other node kind
inline TensorDictImpl* dense_root(const TensorDict& td) { return td.node() ? td.node()->dense_node() : nullptr; }

//! the batch of a child (sub-TensorDict or non-tensor) whose level goes from `old_nd` batch dims to
//! `parent_batch`: parent_batch followed by the child's own dims past the first old_nd (its extra dims)
inline BatchSize child_batch(const BatchSize& parent_batch, size_t old_nd, const BatchSize& own) {
  BatchSize b = parent_batch;
  if (own.size() > old_nd) b.insert(b.end(), own.begin() + static_cast<long>(old_nd), own.end());
  return b;
}

//! the entry of `level` at `key`, trying position `hint` first (trees built alike list keys alike)
inline const Entry* find_at(const TensorDictImpl& level, const std::string& key, size_t hint) {
  if (hint < level.entries.size() && level.entries[hint].first == key) return &level.entries[hint].second;
  return level.find(key);
}

//! NotImplementedError for a leaf walk that meets a node without dense leaves (the walkers' text)
[[noreturn]] inline void throw_no_dense_leaves(const KeyPath& at, const TensorDict& sub) {
  throw NotImplementedError("this operation reaches the leaves of " + at.full().repr() + ", a " +
                            sub.node()->type_name() + ", which has no dense leaves to visit");
}

// ------------------------------------------------------------------------------------ (s) structure
//! one key of a level as `visit` sees it: a dense level's entry (no copy) or a key of another node with
//! its meta (its value is read only when value() / sub() asks)
class Item {
 public:
  Item(const Entry& e, const TensorDictImpl& level) : entry_(&e), level_(&level) {}
  Item(const Node& node, const std::string& key, const EntryMeta& m) : node_(&node), key_(&key), meta_(&m) {}

  bool is_tensordict() const { return entry_ ? entry_->is_tensordict() : meta_->is_tensordict(); }
  bool is_tensor() const { return entry_ ? entry_->is_tensor() : meta_->kind == EntryMeta::Kind::Tensor; }
  bool is_non_tensor() const { return entry_ ? entry_->is_non_tensor() : meta_->kind == EntryMeta::Kind::NonTensor; }
  //! a tensor's full shape; a sub-TensorDict's or non-tensor's batch size
  BatchSize shape() const { return entry_ ? entry_->shape() : meta_->shape; }
  //! kind, dtype, shape, device without reading data
  EntryMeta meta() const {
    if (!entry_) return *meta_;
    EntryMeta m = entry_meta(*entry_, level_->is_memmap, level_->is_shared);
    if (m.kind == EntryMeta::Kind::NonTensor) m.device = level_->device;
    return m;
  }
  //! the value (a dense level's entry; any other node reads it: I/O for a leaf of a remote node)
  Entry value() const { return entry_ ? *entry_ : read(); }
  //! the sub-TensorDict (a handle over its node, no data read)
  TensorDict sub() const { return entry_ ? entry_->tensordict() : read().tensordict(); }
  //! the dense level's entry itself (writable through its level), nullptr for another node's key
  const Entry* entry() const { return entry_; }

 private:
  Entry read() const {
    std::optional<Entry> e = node_->read(*key_);
    if (!e) throw KeyError("key '" + *key_ + "' vanished from its " + node_->type_name() + " during a walk");
    return std::move(*e);
  }
  const Entry* entry_ = nullptr;
  const TensorDictImpl* level_ = nullptr;
  const Node* node_ = nullptr;
  const std::string* key_ = nullptr;
  const EntryMeta* meta_ = nullptr;
};

//! what a walk does after visiting an entry
enum class Step { Stop, Next, Enter };

//! the default hooks of a structure visitor: derive from it and hide what differs
struct StructureVisitor {
  //! a key of a level: Stop ends the walk (visit then returns false), Next goes on, Enter (a
  //! sub-TensorDict) walks its level before after()
  Step visit(const KeyPath&, const Item&) { return Step::Next; }
  //! called after each key (after its level when it was entered)
  void after(const KeyPath&, const Item&) {}
};

//! the structure of `td` through the node interface, depth first in each level's key order (see Item,
//! StructureVisitor); a dense level is walked over its entries, any other through Node::metas()
template <class V>
bool visit(const TensorDict& td, V& v, const KeyPath& at = {}) {
  auto step = [&](const KeyPath& path, const Item& item) {
    const Step s = v.visit(path, item);
    if (s == Step::Stop) return false;
    if (s == Step::Enter && item.is_tensordict() && !visit(item.sub(), v, path)) return false;
    v.after(path, item);
    return true;
  };
  Node& node = *td.node();
  if (const TensorDictImpl* level = node.dense_node()) {  // the dense fast path: no meta, no entry copy
    for (const auto& kv : level->entries)
      if (!step(KeyPath(at, kv.first), Item(kv.second, *level))) return false;
    return true;
  }
  for (const auto& km : node.metas())
    if (!step(KeyPath(at, km.first), Item(node, km.first, km.second))) return false;
  return true;
}

// ------------------------------------------------------------------------------------ (a) leaves
//! on_leaf(path, entry) for every leaf (tensor or non-tensor) in order, depth first; sub-TensorDicts
//! with a dense level (see Descend) are entered, any other one goes to on_other(path, sub)
template <class OnLeaf, class OnOther>
void for_each_leaf(const TensorDictImpl& level, OnLeaf&& on_leaf, OnOther&& on_other,
                   Descend how = Descend::DenseOrView, const KeyPath& at = {}) {
  for (const auto& kv : level.entries) {
    const KeyPath path(at, kv.first);
    const Entry& e = kv.second;
    if (e.is_tensordict()) {
      const TensorDict sub = e.tensordict();
      if (const TensorDictImpl* child = level_of(sub, how)) {
        for_each_leaf(*child, on_leaf, on_other, how, path);
      } else {
        on_other(path, sub);
      }
    } else {
      on_leaf(path, e);
    }
  }
}

//! f(path, entry) for every entry in order, parents before their entries; for a sub-TensorDict f returns
//! the level to enter (nullptr: not entered), for a leaf its result is ignored
template <class F>
void for_each_entry(const TensorDictImpl& level, F&& f, const KeyPath& at = {}) {
  for (const auto& kv : level.entries) {
    const KeyPath path(at, kv.first);
    const TensorDictImpl* child = f(path, kv.second);
    if (child && kv.second.is_tensordict()) for_each_entry(*child, f, path);
  }
}

//! f(path, tensor) for every tensor leaf; a sub-TensorDict without a dense level is a NotImplementedError
template <class F>
void for_each_tensor(const TensorDictImpl& level, F&& f, const KeyPath& at = {}) {
  for_each_leaf(
      level,
      [&](const KeyPath& p, const Entry& e) {
        if (e.is_tensor()) f(p, e.tensor());
      },
      [](const KeyPath& p, const TensorDict& sub) { throw_no_dense_leaves(p, sub); }, Descend::DenseOrView, at);
}

//! f(path, entry) for every leaf, the entry writable (a leaf may be replaced in place: storage swaps)
template <class F>
void for_each_leaf_mut(TensorDictImpl& level, F&& f, const KeyPath& at = {}) {
  for (auto& kv : level.entries) {
    const KeyPath path(at, kv.first);
    if (kv.second.is_tensordict()) {
      const TensorDict sub = kv.second.tensordict();
      if (const TensorDictImpl* child = dense_level(sub)) {
        for_each_leaf_mut(const_cast<TensorDictImpl&>(*child), f, path);
      } else {
        throw_no_dense_leaves(path, sub);
      }
    } else {
      f(path, kv.second);
    }
  }
}

//! f(path, level) for `level` and every dense level below it, parents first (flags, devices, records);
//! sub-TensorDicts without a dense level are skipped
template <class F>
void for_each_level(TensorDictImpl& level, F&& f, const KeyPath& at = {}) {
  f(at, level);
  for (auto& kv : level.entries) {
    if (!kv.second.is_tensordict()) continue;
    const KeyPath path(at, kv.first);
    if (const TensorDictImpl* child = dense_level(kv.second.tensordict())) {
      for_each_level(const_cast<TensorDictImpl&>(*child), f, path);
    }
  }
}

// ------------------------------------------------------------------------------------ (b), (c) rebuild
//! the entries of the other trees at one key (null where an other tree lacks the key)
using Matched = std::vector<const Entry*>;

//! the default hooks of a rebuild visitor: derive from it and hide what differs. Every hook gets the
//! entry's path; `others` holds the matching entries of the other trees (empty for one tree).
struct RebuildVisitor {
  //! the new level (no entries yet) of a source level; default: same device, no flags
  TensorDict make_level(const KeyPath&, const TensorDictImpl& src, BatchSize new_batch) {
    return make_empty(src, std::move(new_batch));
  }
  //! the new batch of a sub-TensorDict of batch `own` below a level going from old_nd dims to parent_batch
  BatchSize sub_batch(const BatchSize& parent_batch, size_t old_nd, const BatchSize& own) {
    return child_batch(parent_batch, old_nd, own);
  }
  //! called at each level before its entries (key-set checks of parallel walks) and after them
  void enter(const KeyPath&, const TensorDictImpl&, const std::vector<const TensorDictImpl*>&) {}
  void leave(const KeyPath&) {}
  //! a tensor leaf -> its new value; an undefined tensor drops the key
  at::Tensor tensor(const KeyPath&, const at::Tensor& t, const Matched&) { return t; }
  //! a non-tensor leaf of level `src` -> its new value; nullopt drops the key
  std::optional<Entry> non_tensor(const KeyPath&, const Entry& e, const TensorDictImpl& /*src*/,
                                  const BatchSize& /*new_batch*/, const Matched&) {
    return e;
  }
  //! the dense level to rebuild a sub-TensorDict from, or nullptr to hand it to other_node
  const TensorDictImpl* descend(const KeyPath&, const TensorDict& sub, const Matched&) { return dense_level(sub); }
  //! the other trees' levels matching a sub-TensorDict (called when others is not empty)
  std::vector<const TensorDictImpl*> descend_others(const KeyPath&, const TensorDictImpl& /*child*/,
                                                    const Matched& others) {
    std::vector<const TensorDictImpl*> out(others.size(), nullptr);
    for (size_t i = 0; i < others.size(); ++i)
      if (others[i] && others[i]->is_tensordict()) out[i] = dense_level(others[i]->tensordict());
    return out;
  }
  //! a sub-TensorDict that descend() refused; nullopt drops the key
  std::optional<TensorDict> other_node(const KeyPath& at, const TensorDict& sub, const BatchSize&, const Matched&) {
    throw_no_dense_leaves(at, sub);
  }
  //! a rebuilt sub-level: nullopt drops it (apply's empty levels); `any` tells whether it got an entry
  std::optional<TensorDict> sub_result(const KeyPath&, const TensorDict& /*sub*/, TensorDict out, bool /*any*/) {
    return out;
  }
  //! stores a new entry in the new level (default: appended as it is)
  void put(TensorDictImpl& out, const KeyPath& at, Entry&& value) { out.entries.emplace_back(at.name(), std::move(value)); }
};

//! a new tree with src's structure and key order, the level of batch `new_batch`; what happens to each
//! entry is v's (see RebuildVisitor). `others` are the matching levels of trees walked in parallel (by key,
//! src's order); `any` receives whether the level got an entry.
template <class V>
TensorDict rebuild(const TensorDictImpl& src, BatchSize new_batch, V& v,
                   const std::vector<const TensorDictImpl*>& others = {}, const KeyPath& at = {},
                   bool* any = nullptr) {
  v.enter(at, src, others);
  const size_t old_nd = src.batch_size.size();
  TensorDict out_td = v.make_level(at, src, std::move(new_batch));
  TensorDictImpl& out = *static_cast<TensorDictImpl*>(out_td.node().get());
  const BatchSize& nb = out.batch_size;
  out.entries.reserve(src.entries.size());
  Matched matched(others.size(), nullptr);
  bool any_set = false;
  for (size_t j = 0; j < src.entries.size(); ++j) {
    const auto& kv = src.entries[j];
    const KeyPath path(at, kv.first);
    const Entry& e = kv.second;
    for (size_t i = 0; i < others.size(); ++i) matched[i] = others[i] ? find_at(*others[i], kv.first, j) : nullptr;
    switch (e.kind()) {
      case Entry::Kind::Tensor: {
        at::Tensor r = v.tensor(path, e.tensor(), matched);
        if (r.defined()) {
          v.put(out, path, Entry(std::move(r)));
          any_set = true;
        }
        break;
      }
      case Entry::Kind::TensorDict: {
        const TensorDict sub = e.tensordict();
        const BatchSize cb = v.sub_batch(nb, old_nd, sub.batch_size());
        std::optional<TensorDict> r;
        if (const TensorDictImpl* child = v.descend(path, sub, matched)) {
          bool child_any = false;
          TensorDict built = others.empty() ? rebuild(*child, cb, v, others, path, &child_any)
                                            : rebuild(*child, cb, v, v.descend_others(path, *child, matched), path, &child_any);
          r = v.sub_result(path, sub, std::move(built), child_any);
        } else {
          r = v.other_node(path, sub, cb, matched);
        }
        if (r) {
          v.put(out, path, Entry(std::move(*r)));
          any_set = true;
        }
        break;
      }
      case Entry::Kind::NonTensorData:
      case Entry::Kind::NonTensorStack: {
        std::optional<Entry> r = v.non_tensor(path, e, src, nb, matched);
        if (r) {
          v.put(out, path, std::move(*r));
          any_set = true;
        }
        break;
      }
      default:
        break;
    }
  }
  v.leave(at);
  if (any) *any = any_set;
  return out_td;
}

//! the default hooks of a walk visitor (no output): derive from it and hide what differs
struct WalkVisitor {
  //! called at each level before its entries and after them
  void enter(const KeyPath&, const TensorDictImpl&, const std::vector<const TensorDictImpl*>&) {}
  void leave(const KeyPath&) {}
  //! an entry of the first tree with the matching entries of the others (null where missing): Stop ends
  //! the walk (walk then returns false), Next goes on, Enter (a sub-TensorDict) walks its level first
  Step visit(const KeyPath&, const Entry&, const Matched&) { return Step::Next; }
  //! the levels entered for a sub-TensorDict (default: dense nodes and dense views, null where none)
  const TensorDictImpl* level(const TensorDict& sub) { return dense_level(sub); }
};

//! a walk of `a` with `others` in parallel by key, without output: v.visit for every entry of a in a's order
//! (sub-TensorDicts before their entries); see WalkVisitor
template <class V>
bool walk(const TensorDictImpl& a, const std::vector<const TensorDictImpl*>& others, V& v, const KeyPath& at = {}) {
  v.enter(at, a, others);
  Matched matched(others.size(), nullptr);
  for (size_t j = 0; j < a.entries.size(); ++j) {
    const auto& kv = a.entries[j];
    const KeyPath path(at, kv.first);
    for (size_t i = 0; i < others.size(); ++i) matched[i] = others[i] ? find_at(*others[i], kv.first, j) : nullptr;
    const Step step = v.visit(path, kv.second, matched);
    if (step == Step::Stop) return false;
    if (step == Step::Enter) {
      std::vector<const TensorDictImpl*> subs(others.size(), nullptr);
      for (size_t i = 0; i < others.size(); ++i)
        if (matched[i] && matched[i]->is_tensordict()) subs[i] = v.level(matched[i]->tensordict());
      if (!walk(*v.level(kv.second.tensordict()), subs, v, path)) return false;
    }
  }
  v.leave(at);
  return true;
}

// ------------------------------------------------------------------------------------ (d) saved shape
//! the default hooks of a saved-shape visitor (see walk_saved): derive from it and hide what differs. Ctx is
//! what the visitor keeps per level (e.g. its directory and meta.json node)
template <class Ctx>
struct SavedShapeVisitor {
  //! a leaf (tensor or non-tensor) of `level`, writable (a save may swap it for its memory-mapped copy)
  void leaf(TensorDictImpl&, Ctx&, const std::string&, Entry&) {}
  //! a sub-TensorDict with a dense level: the context its level is walked with
  Ctx sub(TensorDictImpl&, Ctx&, const std::string&, TensorDictImpl&) { return Ctx(); }
  //! after the sub-TensorDict's level was walked
  void after_sub(TensorDictImpl&, Ctx&, const std::string&, TensorDictImpl&, Ctx&) {}
  //! a lazy stack: the stack's context, then member(...) gives each member's, after_stack when all are walked
  Ctx stack(TensorDictImpl&, Ctx&, const std::string&, const TensorDict&, const StackMembers&) { return Ctx(); }
  Ctx member(Ctx&, size_t, TensorDictImpl&) { return Ctx(); }
  void after_member(Ctx&, size_t, TensorDictImpl&, Ctx&) {}
  void after_stack(TensorDictImpl&, Ctx&, const std::string&, const TensorDict&, Ctx&) {}
  //! a sub-TensorDict (or a lazy stack's member) without a dense level: not walked (the default), or an error
  void other(const std::string&, const TensorDict&) {}
};

//! the entries of `level` in order, as a saved directory holds them: leaves go to v.leaf, a sub-TensorDict's
//! dense level is walked with v.sub's context, a lazy stack's dense members each with v.member's context
template <class Ctx, class V>
void walk_saved(TensorDictImpl& level, Ctx& ctx, V& v) {
  for (auto& kv : level.entries) {
    Entry& e = kv.second;
    if (!e.is_tensordict()) {
      v.leaf(level, ctx, kv.first, e);
      continue;
    }
    const TensorDict sub = e.tensordict();
    if (const StackMembers lz = sub.node()->stack_members()) {
      Ctx sc = v.stack(level, ctx, kv.first, sub, lz);
      for (size_t i = 0; i < lz.members->size(); ++i) {
        const TensorDict& m = (*lz.members)[i];
        TensorDictImpl* ml = const_cast<TensorDictImpl*>(level_of(m, Descend::DenseOnly));
        if (!ml) {
          v.other(kv.first, m);
          continue;
        }
        Ctx mc = v.member(sc, i, *ml);
        walk_saved(*ml, mc, v);
        v.after_member(sc, i, *ml, mc);
      }
      v.after_stack(level, ctx, kv.first, sub, sc);
      continue;
    }
    TensorDictImpl* child = const_cast<TensorDictImpl*>(dense_level(sub));
    if (!child) {
      v.other(kv.first, sub);
      continue;
    }
    Ctx cc = v.sub(level, ctx, kv.first, *child);
    walk_saved(*child, cc, v);
    v.after_sub(level, ctx, kv.first, *child, cc);
  }
}

}  // namespace tree
}  // namespace detail
}  // namespace tensordict
