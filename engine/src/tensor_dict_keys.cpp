// TensorDict keys and reads: the nested-key paths through any node kind, keys / items / values / contains /
// is_empty (one structure walk: tree::visit), meta_at / key_metas, get / get_entry / get_at.
#include <algorithm>
#include <cstring>

#include "tensor_dict_internal.hpp"
#include "tensordict/tree.hpp"
#include "tensor_dict_paths.hpp"
#include "tree_visitor.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {

using detail::throw_missing_key;

// ============================================================================ generic paths (any node)
namespace detail {

TensorDict parent_of(const TensorDict& root, const NestedKey& key, bool create) {
  TensorDict cur = root;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    std::optional<EntryMeta> m = cur.node()->meta(key[i]);  // a leaf on the way is not read
    if (!m) {
      if (!create) return TensorDict::undefined();
      if (cur.is_locked()) {
        throw LockedError("Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
                          "method and make sure the key is present.");
      }
      cur = cur.node()->open_child(key[i]);
      continue;
    }
    if (!m->is_tensordict()) detail::through_leaf(key, key[i], m->kind_name(), create);
    cur = cur.node()->read(key[i])->tensordict();  // a sub-TensorDict: a handle, no data
  }
  return cur;
}

[[noreturn]] void missing_in_node(const NestedKey& key, const TensorDict& where) {
  std::string avail;
  for (const auto& k : where.node()->keys()) avail += (avail.empty() ? "" : ", ") + std::string("'") + k + "'";
  throw KeyError("key " + key.repr() + " not found in " + where.node()->type_name() + " with keys [" + avail + "]");
}

}  // namespace detail

namespace {
using detail::missing_in_node;
using detail::parent_of;
namespace tree = detail::tree;

//! keys(options) as one structure walk: a sub-TensorDict's keys before its own (upstream's order); `emit`
//! gets each listed key's path and item (a remote node's leaf is read only if emit asks for its value)
template <class Emit>
struct KeyWalk : tree::StructureVisitor {
  const KeysOptions& o;
  Emit& emit;
  KeyWalk(const KeysOptions& options, Emit& e) : o(options), emit(e) {}
  tree::Step visit(const tree::KeyPath&, const tree::Item& item) {
    return o.include_nested() && item.is_tensordict() ? tree::Step::Enter : tree::Step::Next;
  }
  void after(const tree::KeyPath& at, const tree::Item& item) {
    const bool leaf = item.is_tensor() || (o.non_tensor_leaves() && item.is_non_tensor());
    if (!o.leaves_only() || leaf) emit(at, item);
  }
};

template <class Emit>
void collect(const TensorDict& td, const KeysOptions& options, Emit&& emit) {
  KeyWalk<Emit> v(options, emit);
  tree::visit(td, v);
}

bool key_less(const NestedKey& a, const NestedKey& b) { return a.join(".") < b.join("."); }

}  // namespace

// ============================================================================ keys
bool TensorDict::is_empty() const {
  struct Empty : tree::StructureVisitor {  // the structure only: a leaf anywhere means not empty
    tree::Step visit(const tree::KeyPath&, const tree::Item& item) {
      return item.is_tensordict() ? tree::Step::Enter : tree::Step::Stop;
    }
  } v;
  return tree::visit(*this, v);
}

std::vector<std::pair<NestedKey, Entry>> TensorDict::items(const KeysOptions& options) const {
  std::vector<std::pair<NestedKey, Entry>> out;
  if (!node_) d("items");
  if (dense_) out.reserve(dense_->entries.size());
  collect(*this, options, [&](const tree::KeyPath& at, const tree::Item& item) { out.emplace_back(at.full(), item.value()); });
  if (options.sort()) {
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return key_less(a.first, b.first); });
  }
  return out;
}

KeysView TensorDict::keys(const KeysOptions& options) const {
  if (!node_) d("keys");
  KeysView out(node_, options);
  if (!options.include_nested() && !options.leaves_only() && !options.sort()) {  // this level's keys
    if (!dense_) {
      for (auto& k : node_->keys()) out.emplace_back(std::move(k));
      return out;
    }
    out.reserve(dense_->entries.size());
    for (const auto& kv : dense_->entries) out.emplace_back(kv.first);
    return out;
  }
  if (dense_) out.reserve(dense_->entries.size());
  collect(*this, options, [&](const tree::KeyPath& at, const tree::Item&) { out.push_back(at.full()); });
  if (options.sort()) std::stable_sort(out.begin(), out.end(), key_less);
  return out;
}

std::vector<Entry> TensorDict::values(const KeysOptions& options) const {
  std::vector<Entry> out;
  for (auto& kv : items(options)) out.push_back(std::move(kv.second));
  return out;
}

bool TensorDict::contains(const NestedKey& key) const {
  if (key.empty()) return false;
  if (!node_) d("contains");  // an undefined handle: its ValueError, not "absent"
  try {
    TensorDictImpl* p = nullptr;
    if (detail::dense_walk(dense_, key, false, &p)) return p && p->find(key.back());
    return detail::meta_at(*this, key).has_value();  // another node kind on the way: no leaf is read
  } catch (const KeyError&) {
    return false;
  } catch (const ValueError&) {  // a level of the key is a leaf
    return false;
  }
}

void walk_entries(const TensorDict& td, const std::function<bool(const NestedKey&, const Entry&)>& fn) {
  struct Walk : tree::StructureVisitor {
    const std::function<bool(const NestedKey&, const Entry&)>& fn;
    explicit Walk(const std::function<bool(const NestedKey&, const Entry&)>& f) : fn(f) {}
    tree::Step visit(const tree::KeyPath& at, const tree::Item& item) {
      const bool enter = fn(at.full(), item.value());
      return enter && item.is_tensordict() ? tree::Step::Enter : tree::Step::Next;
    }
  } v(fn);
  detail::node_of(td, "walk_entries");
  tree::visit(td, v);
}

namespace detail {

std::optional<EntryMeta> meta_at(const TensorDict& td, const NestedKey& key) {
  if (key.empty()) return std::nullopt;
  TensorDict cur = td;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    std::optional<EntryMeta> m = cur.node()->meta(key[i]);
    if (!m || !m->is_tensordict()) return std::nullopt;
    cur = cur.node()->read(key[i])->tensordict();  // a sub-TensorDict: a handle, no data
  }
  return cur.node()->meta(key.back());
}

std::vector<std::pair<NestedKey, EntryMeta>> key_metas(const TensorDict& td, const KeysOptions& options) {
  std::vector<std::pair<NestedKey, EntryMeta>> out;
  collect(td, options, [&](const tree::KeyPath& at, const tree::Item& item) { out.emplace_back(at.full(), item.meta()); });
  return out;
}

}  // namespace detail

// ============================================================================ reading
std::optional<Entry> TensorDict::get_entry_opt(const NestedKey& key) const {
  if (key.empty()) throw KeyError("empty key");
  TensorDictImpl* p = nullptr;
  if (detail::dense_walk(dense_, key, false, &p)) {
    if (!p) return std::nullopt;
    const Entry* e = p->find(key.back());
    if (!e) return std::nullopt;
    return *e;
  }
  if (!node_) d("get");
  TensorDict parent = parent_of(*this, key, false);  // another node kind on the way
  if (!parent.defined()) return std::nullopt;
  return parent.node()->read(key.back());
}

Entry TensorDict::get_entry(const NestedKey& key) const {
  if (key.empty()) throw KeyError("empty key");
  TensorDictImpl* p = nullptr;
  if (!detail::dense_walk(dense_, key, false, &p)) {  // another node kind on the way: through the nodes
    if (!node_) d("get");
    TensorDict parent = parent_of(*this, key, false);
    if (!parent.defined()) missing_in_node(key, *this);
    std::optional<Entry> e = parent.node()->read(key.back());
    if (!e) missing_in_node(key, parent);
    return *e;
  }
  if (!p) throw_missing_key(key, *d());
  const Entry* e = p->find(key.back());
  if (!e) throw_missing_key(key, *p);
  return *e;
}

Entry TensorDict::operator[](const NestedKey& key) const { return get_entry(key); }

at::Tensor TensorDict::get(const NestedKey& key) const {
  if (key.size() == 1 && dense_) {  // fast path: no walk, no Entry copy
    const Entry* e = d()->find(key.front());
    if (!e) throw_missing_key(key, *d());
    return e->tensor();
  }
  return get_entry(key).tensor();
}

at::Tensor TensorDict::get(const char* key) const {
  if (dense_) {
    const size_t n = std::strlen(key);  // once, not per entry
    for (const auto& kv : dense_->entries)
      if (kv.first.size() == n && std::memcmp(kv.first.data(), key, n) == 0) return kv.second.tensor();
  }
  return get(NestedKey(key));  // missing, or another node kind: the general path and its errors
}

at::Tensor TensorDict::get(const NestedKey& key, const at::Tensor& default_value) const {
  auto e = get_entry_opt(key);
  if (!e) return default_value;
  return e->tensor();
}

TensorDict TensorDict::get_td(const NestedKey& key) const { return get_entry(key).tensordict(); }

JsonValue TensorDict::get_non_tensor(const NestedKey& key) const { return get_entry(key).non_tensor_value(); }

bool TensorDict::is_non_tensor(const NestedKey& key) const {
  auto e = get_entry_opt(key);
  return e && e->is_non_tensor();
}

at::Tensor TensorDict::get_at(const NestedKey& key, const Index& index) const {
  // a node whose leaves are not in memory reads the selected rows only (td[idx] is composed without I/O)
  if (!dense_ && node_ && !node_->dense_view() && selects_batch_dims_only(index, batch_size().size())) {
    return this->index(index).get(key);
  }
  return get(key).index(index);
}

}  // namespace tensordict
