// TensorDict core: construction, metadata, keys, get/set/update, key-structure ops, clone, lock.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tree_visitor.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {

// ============================================================================ detail helpers
namespace detail {

std::string shape_list(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
std::string shape_str(at::IntArrayRef shape) { return "torch.Size(" + shape_list(shape) + ")"; }

int64_t prod(at::IntArrayRef shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, bool allow_end) {
  int64_t hi = allow_end ? ndim + 1 : ndim;
  if (dim < -hi || dim >= hi) {
    throw IndexError("Dimension out of range (expected to be in range of [" + std::to_string(-hi) + ", " +
                     std::to_string(hi - 1) + "], but got " + std::to_string(dim) + ")");
  }
  return dim < 0 ? dim + hi : dim;
}

TensorDict make_empty(const TensorDictImpl& like, BatchSize batch_size) {
  auto impl = std::make_shared<TensorDictImpl>();
  impl->batch_size = std::move(batch_size);
  impl->device = like.device;
  return TensorDict(std::move(impl));
}

void check_unlocked(const TensorDictImpl& impl, const std::string& what) {
  if (impl.locked) {
    throw LockedError("Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
                      "method and make sure the key is present. (" + what + ")");
  }
}

[[noreturn]] void throw_missing_key(const NestedKey& key, const TensorDictImpl& where) {
  std::string existing;
  for (size_t i = 0; i < where.entries.size(); ++i) existing += (i ? ", " : "") + where.entries[i].first;
  throw KeyError("key " + key.repr() + " not found in TensorDict with keys [" + existing + "]");
}

static bool has_prefix(at::IntArrayRef shape, const BatchSize& bs) {
  if (shape.size() < bs.size()) return false;
  for (size_t i = 0; i < bs.size(); ++i)
    if (shape[i] != bs[i]) return false;
  return true;
}

static void batch_mismatch(const TensorDictImpl& impl, at::IntArrayRef shape) {
  throw BatchSizeError("batch dimension mismatch, got self.batch_size=" + shape_str(impl.batch_size) +
                       " and value.shape=" + shape_str(shape) + ".");
}

Entry prepare_value(const TensorDictImpl& impl, const std::string& key, const Entry& value) {
  (void)key;
  switch (value.kind()) {
    case Entry::Kind::None:
      throw TypeError("cannot set key '" + key + "' to an empty value");
    case Entry::Kind::Tensor: {
      at::Tensor t = value.tensor();
      if (!t.defined()) throw TypeError("cannot set key '" + key + "' to an undefined tensor");
      if (impl.device && t.device() != *impl.device) t = t.to(*impl.device);
      if (!has_prefix(t.sizes(), impl.batch_size)) batch_mismatch(impl, t.sizes());
      return Entry(t);
    }
    case Entry::Kind::TensorDict: {
      TensorDict td = value.tensordict();
      if (impl.device && td.device() != impl.device) td = td.to(*impl.device);
      if (!has_prefix(td.batch_size(), impl.batch_size)) {
        TensorDict copy = td.copy();
        try {
          copy.set_batch_size(impl.batch_size);
        } catch (const BatchSizeError&) {
          batch_mismatch(impl, td.batch_size());
        }
        return Entry(copy);
      }
      return Entry(td);
    }
    case Entry::Kind::Dict:
      return Entry(TensorDict(value.dict(), impl.batch_size, impl.device));
    case Entry::Kind::NonTensorData: {
      const auto& d = value.non_tensor_data();
      if (d.batch_size().empty() || !has_prefix(d.batch_size(), impl.batch_size)) {
        if (!d.batch_size().empty() && d.batch_size() != impl.batch_size) batch_mismatch(impl, d.batch_size());
        return Entry(NonTensorData(d.value(), impl.batch_size));
      }
      return value;
    }
    case Entry::Kind::NonTensorStack: {
      const auto& s = value.non_tensor_stack();
      if (!has_prefix(s.batch_size(), impl.batch_size)) batch_mismatch(impl, s.batch_size());
      return value;
    }
  }
  return value;
}

//! a nested key whose level `part` is a leaf: upstream raises ValueError when setting (creating the path),
//! AttributeError when reading ('Tensor' object has no attribute ...)
[[noreturn]] void through_leaf(const NestedKey& key, const std::string& part, const char* kind, bool set) {
  const std::string msg = "key " + key.repr() + ": '" + part + "' is a " + kind +
                          ", not a TensorDict, so it cannot hold nested keys";
  if (set) throw ValueError(msg);
  throw AttributeError(msg);
}

TensorDictImpl* walk(TensorDictImpl* root, const NestedKey& key, bool create) {
  TensorDictImpl* cur = root;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    Entry* e = cur->find(key[i]);
    if (!e) {
      if (!create) return nullptr;
      if (cur->locked) check_unlocked(*cur, "creating sub-TensorDict '" + key[i] + "'");
      TensorDict sub = make_empty(*cur, cur->batch_size);
      cur->put(key[i], Entry(sub));
      e = cur->find(key[i]);
    }
    if (!e->is_tensordict()) {
      through_leaf(key, key[i], Entry::kind_name(e->kind()), create);
    }
    TensorDict sub = e->tensordict();
    if (!sub.is_dense()) throw NotDense{};
    cur = sub.impl().get();
  }
  return cur;
}

const TensorDictImpl* walk(const TensorDictImpl* root, const NestedKey& key) {
  return walk(const_cast<TensorDictImpl*>(root), key, false);
}

bool is_dense_tree(const TensorDict& td) {
  const TensorDictImpl* root = tree::dense_level(td);
  if (!root) return false;
  bool dense = true;
  tree::for_each_entry(*root, [&](const tree::KeyPath&, const Entry& e) -> const TensorDictImpl* {
    if (!dense || !e.is_tensordict()) return nullptr;
    const TensorDictImpl* child = tree::dense_level(e.tensordict());
    if (!child) dense = false;
    return child;
  });
  return dense;
}

bool is_remote(const TensorDict& td) {
  return !td.is_dense() && td.node() && td.node()->kind() != NodeType::LazyStack && !td.node()->dense_view();
}

void write_back(const TensorDict& self, const TensorDict& dense) { self.node()->write(Index{}, dense); }

TensorDict dense_tree(const TensorDict& td) {
  if (is_dense_tree(td)) return td;
  if (!td.is_dense() && !(td.node() && td.node()->dense_view())) return dense_tree(td.contiguous());
  const TensorDictImpl& s = *td.impl();
  auto out = std::make_shared<TensorDictImpl>(s);  // entries (leaves shared), flags
  out->locked = false;
  out->locked_parents.clear();
  for (auto& kv : out->entries)
    if (kv.second.is_tensordict()) kv.second = Entry(dense_tree(kv.second.tensordict()));
  return TensorDict(out);
}

namespace {
//! the tree visitor's rebuild for map_batch: fn on every tensor (and NonTensorStack positions), sub-levels
//! get new_batch + their extra dims; keep_flags: memmap / shared flags and the lock survive at every level
struct MapBatchVisitor : tree::RebuildVisitor {
  const std::function<at::Tensor(const at::Tensor&)>& fn;
  bool keep_flags;
  MapBatchVisitor(const std::function<at::Tensor(const at::Tensor&)>& f, bool k) : fn(f), keep_flags(k) {}

  at::Tensor tensor(const tree::KeyPath&, const at::Tensor& t, const tree::Matched&) { return fn(t); }
  std::optional<Entry> non_tensor(const tree::KeyPath&, const Entry& e, const TensorDictImpl& src, const BatchSize& nb,
                                  const tree::Matched&) {
    if (e.is_non_tensor_data()) {
      const NonTensorData& d = e.non_tensor_data();
      return Entry(NonTensorData(d.value(), tree::child_batch(nb, src.batch_size.size(), d.batch_size())));
    }
    return Entry(e.non_tensor_stack().remap(fn));
  }
  std::optional<TensorDict> sub_result(const tree::KeyPath&, const TensorDict& sub, TensorDict out, bool) {
    return finish(*tree::dense_level(sub), std::move(out));
  }
  TensorDict finish(const TensorDictImpl& src, TensorDict out) {
    if (keep_flags) {
      TensorDictImpl& o = *static_cast<TensorDictImpl*>(out.node().get());
      o.is_memmap = src.is_memmap;
      o.is_shared = src.is_shared;
      if (src.locked) out.lock_();
    }
    return out;
  }
};
}  // namespace

TensorDict map_batch(const TensorDict& td_in, const BatchSize& new_batch,
                     const std::function<at::Tensor(const at::Tensor&)>& fn, bool keep_flags) {
  const TensorDict td = dense_tree(td_in);  // other node kinds below: on their dense form
  const TensorDictImpl& src = *td.impl();
  MapBatchVisitor v(fn, keep_flags);
  return v.finish(src, tree::rebuild(src, new_batch, v));
}

static void lock_node(const std::shared_ptr<Node>& node) {
  node->locked = true;
  lock_children(node);
}

void lock_children(const std::shared_ptr<Node>& parent) {
  for (const auto& child : parent->child_nodes()) {
    bool known = false;
    for (auto& w : child->locked_parents)
      if (w.lock() == parent) known = true;
    if (!known) child->locked_parents.push_back(parent);
    lock_node(child);
  }
}

bool contains_node(const Node& node, const Node* target) {
  for (const auto& child : node.child_nodes()) {
    if (child.get() == target || contains_node(*child, target)) return true;
  }
  return false;
}

}  // namespace detail

using detail::check_unlocked;
using detail::make_empty;
using detail::prepare_value;
using detail::shape_str;
using detail::throw_missing_key;

// ============================================================================ Entry
Entry::Entry(at::Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}
Entry::Entry(TensorDict td) : kind_(Kind::TensorDict), td_(td.node()), typed_(td.typed_schema()) {
  if (!td_) throw TypeError("cannot make an entry of an undefined TensorDict");
}
Entry::Entry(NonTensorData d) : kind_(Kind::NonTensorData), nt_(std::move(d)) {}
Entry::Entry(NonTensorStack s) : kind_(Kind::NonTensorStack), nts_(std::move(s)) {}
Entry::Entry(Dict d) : kind_(Kind::Dict), dict_(std::make_shared<Dict>(std::move(d))) {}
Entry::Entry(const char* s) : Entry(JsonValue(s)) {}
Entry::Entry(std::string s) : Entry(JsonValue(std::move(s))) {}
Entry::Entry(JsonValue v) : kind_(Kind::NonTensorData), nt_(std::move(v)) {}

const char* Entry::kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Tensor: return "Tensor";
    case Kind::TensorDict: return "TensorDict";
    case Kind::NonTensorData: return "NonTensorData";
    case Kind::NonTensorStack: return "NonTensorStack";
    case Kind::Dict: return "Dict";
  }
  return "?";
}

static void wrong_kind(Entry::Kind want, Entry::Kind got) {
  throw TypeError(std::string("expected a ") + Entry::kind_name(want) + " entry, got a " + Entry::kind_name(got));
}
const at::Tensor& Entry::tensor() const {
  if (kind_ != Kind::Tensor) wrong_kind(Kind::Tensor, kind_);
  return tensor_;
}
TensorDict Entry::tensordict() const {
  if (kind_ != Kind::TensorDict) wrong_kind(Kind::TensorDict, kind_);
  if (typed_) return TensorDict(td_).with_schema(typed_);
  return TensorDict(td_);
}
const NonTensorData& Entry::non_tensor_data() const {
  if (kind_ != Kind::NonTensorData) wrong_kind(Kind::NonTensorData, kind_);
  return nt_;
}
const NonTensorStack& Entry::non_tensor_stack() const {
  if (kind_ != Kind::NonTensorStack) wrong_kind(Kind::NonTensorStack, kind_);
  return nts_;
}
const Dict& Entry::dict() const {
  if (kind_ != Kind::Dict) wrong_kind(Kind::Dict, kind_);
  return *dict_;
}
JsonValue Entry::non_tensor_value() const {
  if (kind_ == Kind::NonTensorData) return nt_.value();
  if (kind_ == Kind::NonTensorStack) return nts_.tolist();
  throw TypeError(std::string("expected a non-tensor entry, got a ") + kind_name(kind_));
}
BatchSize Entry::shape() const {
  switch (kind_) {
    case Kind::Tensor: return BatchSize(tensor_.sizes().begin(), tensor_.sizes().end());
    case Kind::TensorDict: return TensorDict(td_).batch_size();
    case Kind::NonTensorData: return nt_.batch_size();
    case Kind::NonTensorStack: return nts_.batch_size();
    default: return {};
  }
}

// ============================================================================ nodes
std::vector<Entry> Node::read(const std::vector<std::string>& keys, const Index& index) const {
  std::shared_ptr<Node> sub = this->index(index);
  std::vector<Entry> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    std::optional<Entry> e = sub->read(k);
    if (!e) throw KeyError("key \"" + k + "\" not found in " + type_name());
    out.push_back(std::move(*e));
  }
  return out;
}

const char* EntryMeta::kind_name() const {
  switch (kind) {
    case Kind::Tensor: return "Tensor";
    case Kind::TensorDict: return "TensorDict";
    case Kind::LazyStack: return "LazyStackedTensorDict";
    case Kind::NonTensor: return value ? Entry::kind_name(value->kind()) : "non-tensor";
  }
  return "?";
}

namespace detail {
EntryMeta entry_meta(const Entry& e, bool owner_memmap, bool owner_shared) {
  EntryMeta m;
  switch (e.kind()) {
    case Entry::Kind::Tensor: {
      const at::Tensor& t = e.tensor();
      m.dtype = t.scalar_type();
      m.shape.assign(t.sizes().begin(), t.sizes().end());
      m.device = t.device();
      tensor_storage_flags(t, owner_memmap, owner_shared, &m.shared, &m.memmap);
      return m;
    }
    case Entry::Kind::TensorDict: {
      const TensorDict td = e.tensordict();
      m.kind = detail::lazy_node(td) ? EntryMeta::Kind::LazyStack : EntryMeta::Kind::TensorDict;
      m.shape = td.batch_size();
      m.device = td.device();
      return m;
    }
    case Entry::Kind::NonTensorData:
    case Entry::Kind::NonTensorStack:
      m.kind = EntryMeta::Kind::NonTensor;
      m.shape = e.shape();
      m.value = e;
      return m;
    default: throw TypeError(std::string("no metadata for a ") + Entry::kind_name(e.kind()) + " entry");
  }
}
}  // namespace detail

std::optional<EntryMeta> Node::meta(const std::string& key) const {
  std::optional<Entry> e = read(key);
  if (!e) return std::nullopt;
  EntryMeta m = detail::entry_meta(*e);
  if (m.kind == EntryMeta::Kind::NonTensor) m.device = device;
  return m;
}

std::vector<std::pair<std::string, EntryMeta>> Node::metas() const {
  std::vector<std::pair<std::string, EntryMeta>> out;
  for (auto& k : keys()) {
    std::optional<EntryMeta> m = meta(k);
    if (m) out.emplace_back(std::move(k), std::move(*m));
  }
  return out;
}

std::optional<EntryMeta> TensorDictImpl::meta(const std::string& key) const {
  const Entry* e = find(key);
  if (!e) return std::nullopt;
  EntryMeta m = detail::entry_meta(*e, is_memmap, is_shared);
  if (m.kind == EntryMeta::Kind::NonTensor) m.device = device;
  return m;
}

std::vector<std::pair<std::string, EntryMeta>> TensorDictImpl::metas() const {
  std::vector<std::pair<std::string, EntryMeta>> out;
  out.reserve(entries.size());
  for (const auto& kv : entries) {
    out.emplace_back(kv.first, detail::entry_meta(kv.second, is_memmap, is_shared));
    if (out.back().second.kind == EntryMeta::Kind::NonTensor) out.back().second.device = device;
  }
  return out;
}

NodeCaps TensorDictImpl::caps() const {
  NodeCaps c;
  c.zero_copy_views = true;
  c.add_keys = true;
  c.memmap = is_memmap;
  c.shared = is_shared;
  return c;
}

std::vector<std::string> TensorDictImpl::keys() const {
  std::vector<std::string> out;
  out.reserve(entries.size());
  for (const auto& kv : entries) out.push_back(kv.first);
  return out;
}

std::optional<Entry> TensorDictImpl::read(const std::string& key) const {
  if (const Entry* e = find(key)) return *e;
  return std::nullopt;
}

bool TensorDictImpl::erase(const std::string& key) { return erase_entry(key); }

TensorDict TensorDictImpl::to_dense() const {
  return TensorDict(std::const_pointer_cast<Node>(shared_from_this()));
}

void TensorDictImpl::write(const Index& index, const TensorDict& value) {
  TensorDict(std::static_pointer_cast<Node>(shared_from_this())).index_put_(index, value);
}

TensorDict Node::open_child(const std::string& key) {
  if (auto e = read(key)) {
    if (!e->is_tensordict()) {
      throw KeyError("'" + key + "' is a " + std::string(Entry::kind_name(e->kind())) + ", not a TensorDict");
    }
    return e->tensordict();
  }
  if (kind() == NodeType::LazyStack && std::find(batch_size.begin(), batch_size.end(), -1) != batch_size.end()) {
    // ragged members: each gets a sub-TensorDict of its own batch size
    for (auto& m : static_cast<LazyStackNode*>(this)->members) m.set(NestedKey(key), Entry(TensorDict(m.batch_size(), m.device())));
  } else {
    put(key, Entry(TensorDict(batch_size, device)));
  }
  return read(key)->tensordict();
}

void Node::write(const Index& index, const TensorDict&) {
  throw NotImplementedError("td[" + index_repr(index) + "] = value is not supported on a " + type_name());
}

std::shared_ptr<Node> TensorDictImpl::index(const Index& index) const {
  return TensorDict(std::const_pointer_cast<Node>(shared_from_this())).index(index).node();
}

std::vector<std::shared_ptr<Node>> TensorDictImpl::child_nodes() const {
  std::vector<std::shared_ptr<Node>> out;
  for (const auto& kv : entries)
    if (kv.second.is_tensordict()) out.push_back(kv.second.tensordict().node());
  return out;
}

// ============================================================================ generic paths (any node)
namespace {

//! the handle holding the last part of key, through handles (any node kind); undefined when a level is
//! missing and !create. KeyError when a level is not a TensorDict.
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

//! walks key through dense nodes only (detail::walk); false when the node is not dense or a level of another
//! node kind is met: the caller takes its generic path
bool dense_walk(TensorDictImpl* dense, const NestedKey& key, bool create, TensorDictImpl** out) {
  if (!dense) return false;
  try {
    *out = detail::walk(dense, key, create);
    return true;
  } catch (const detail::NotDense&) {
    return false;
  }
}

[[noreturn]] void missing_in_node(const NestedKey& key, const TensorDict& where) {
  std::string avail;
  for (const auto& k : where.node()->keys()) avail += (avail.empty() ? "" : ", ") + std::string("'") + k + "'";
  throw KeyError("key " + key.repr() + " not found in " + where.node()->type_name() + " with keys [" + avail + "]");
}

void collect_node_keys(const TensorDict& td, const NestedKey& prefix, const KeysOptions& o,
                       std::vector<std::pair<NestedKey, Entry>>& out) {
  const Node& node = *td.node();
  for (auto& km : node.metas()) {  // the structure first: only the values listed are read
    const EntryMeta& m = km.second;
    NestedKey full = prefix + NestedKey(km.first);
    const bool leaf = m.kind == EntryMeta::Kind::Tensor || (o.non_tensor_leaves() && m.kind == EntryMeta::Kind::NonTensor);
    const bool listed = !o.leaves_only() || leaf;
    if (!listed && !(o.include_nested() && m.is_tensordict())) continue;
    std::optional<Entry> e = node.read(km.first);
    if (!e) continue;
    if (o.include_nested() && e->is_tensordict()) collect_node_keys(e->tensordict(), full, o, out);
    if (listed) out.emplace_back(std::move(full), std::move(*e));
  }
}

//! collect_node_keys without the values: metas only
void collect_node_metas(const TensorDict& td, const NestedKey& prefix, const KeysOptions& o,
                        std::vector<std::pair<NestedKey, EntryMeta>>& out) {
  const Node& node = *td.node();
  for (auto& km : node.metas()) {
    EntryMeta& m = km.second;
    NestedKey full = prefix + NestedKey(km.first);
    if (o.include_nested() && m.is_tensordict()) collect_node_metas(node.read(km.first)->tensordict(), full, o, out);
    const bool leaf = m.kind == EntryMeta::Kind::Tensor || (o.non_tensor_leaves() && m.kind == EntryMeta::Kind::NonTensor);
    if (!o.leaves_only() || leaf) out.emplace_back(std::move(full), std::move(m));
  }
}

void check_node_unlocked(const TensorDict& td) {
  if (td.is_locked()) {
    throw LockedError("Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
                      "method and make sure the key is present.");
  }
}

}  // namespace

// ============================================================================ construction
static TensorDictImpl* as_dense(const std::shared_ptr<Node>& node) {
  return node && node->kind() == NodeType::Dense ? static_cast<TensorDictImpl*>(node.get()) : nullptr;
}

TensorDict::TensorDict(std::shared_ptr<Node> node) : node_(std::move(node)) {
  if (node_ && node_->kind() == NodeType::Typed) std::tie(node_, typed_) = detail::unwrap_typed_node(node_);
  dense_ = as_dense(node_);
}

TensorDict TensorDict::with_schema(std::shared_ptr<const TypedSchema> schema) const {
  TensorDict out = *this;
  out.typed_ = std::move(schema);
  return out;
}

std::shared_ptr<Node> TensorDict::node_with_schema() const { return detail::make_typed_node(node_, typed_); }
TensorDict::TensorDict(std::shared_ptr<TensorDictImpl> impl) : node_(std::move(impl)), dense_(as_dense(node_)) {}

std::shared_ptr<TensorDictImpl> TensorDict::impl() const {
  if (dense_) return std::static_pointer_cast<TensorDictImpl>(node_);
  if (node_) {
    if (auto view = node_->dense_view()) return view;
  }
  d();
  return nullptr;
}

TensorDictImpl* TensorDict::d(const char* what) const {
  if (dense_) return dense_;
  if (node_) {
    if (auto view = node_->dense_view()) return view.get();  // the node keeps it alive
  }
  if (!node_) throw ValueError(std::string(what ? what : "this operation") + " on an undefined TensorDict");
  throw NotImplementedError(std::string(what ? what : "this operation") + " is not supported on a " +
                            node_->type_name() + " (dense TensorDicts only); densify it first with contiguous()");
}

TensorDict::TensorDict() : TensorDict(std::make_shared<TensorDictImpl>()) {}

TensorDict::TensorDict(BatchSize batch_size, std::optional<at::Device> device)
    : TensorDict(std::make_shared<TensorDictImpl>()) {
  for (auto s : batch_size)
    if (s < 0) throw BatchSizeError("batch size " + shape_str(batch_size) + " has a negative dimension");
  d()->batch_size = std::move(batch_size);
  d()->device = device;
}

TensorDict::TensorDict(const Dict& source, BatchSize batch_size, std::optional<at::Device> device)
    : TensorDict(std::move(batch_size), device) {
  d()->entries.reserve(source.size());
  for (const auto& kv : source) set(kv.first, kv.second);
}

static BatchSize common_prefix(const std::vector<BatchSize>& shapes) {
  if (shapes.empty()) return {};
  BatchSize p = shapes[0];
  for (const auto& s : shapes) {
    size_t n = 0;
    while (n < p.size() && n < s.size() && p[n] == s[n]) ++n;
    p.resize(n);
  }
  return p;
}

static BatchSize max_batch(const TensorDict& td) {
  std::vector<BatchSize> shapes;
  for (const auto& kv : td.impl()->entries) {
    if (kv.second.is_tensordict()) {
      shapes.push_back(max_batch(kv.second.tensordict()));
    } else {
      shapes.push_back(kv.second.shape());
    }
  }
  return common_prefix(shapes);
}

static void auto_batch(TensorDict& td, std::optional<int64_t> dims) {
  for (auto& kv : td.impl()->entries) {
    if (kv.second.is_tensordict()) {
      TensorDict c = kv.second.tensordict();
      auto_batch(c, std::nullopt);
    }
  }
  BatchSize bs = max_batch(td);
  if (dims) {
    if (static_cast<int64_t>(bs.size()) < *dims) {
      throw BatchSizeError("cannot find " + std::to_string(*dims) + " common batch dims, found " +
                           detail::shape_str(bs));
    }
    bs.resize(static_cast<size_t>(*dims));
  }
  td.set_batch_size(bs);
}

TensorDict TensorDict::from_dict(const Dict& source, const FromDictOptions& options) {
  if (options.batch_size() && options.batch_dims()) {
    throw ValueError("Cannot pass both batch_size and batch_dims to `from_dict`.");
  }
  if (options.batch_size()) return TensorDict(source, *options.batch_size());
  TensorDict td(source, {});
  if (options.auto_batch_size() || options.batch_dims()) auto_batch(td, options.batch_dims());
  return td;
}

TensorDict TensorDict::fromkeys(const std::vector<NestedKey>& keys, double value) {
  TensorDict td;
  for (const auto& k : keys) td.set(k, at::scalar_tensor(value, at::kFloat));
  return td;
}

// ============================================================================ metadata
//! the node, or ValueError for an undefined handle
static Node& node_of(const std::shared_ptr<Node>& node, const char* what) {
  if (!node) throw ValueError(std::string(what) + " of an undefined TensorDict");
  return *node;
}
const BatchSize& TensorDict::batch_size() const { return node_of(node_, "batch_size").batch_size; }
int64_t TensorDict::batch_dims() const { return static_cast<int64_t>(batch_size().size()); }
int64_t TensorDict::numel() const { return detail::prod(batch_size()); }
int64_t TensorDict::size(int64_t dim) const { return batch_size()[detail::normalize_dim(dim, batch_dims())]; }
std::optional<at::Device> TensorDict::device() const { return node_of(node_, "device").device; }
int64_t TensorDict::len() const { return batch_size().empty() ? 0 : batch_size()[0]; }
bool TensorDict::is_locked() const { return node_of(node_, "is_locked").locked; }
bool TensorDict::is_memmap() const { return dense_ ? dense_->is_memmap : node_of(node_, "is_memmap").caps().memmap; }
bool TensorDict::is_shared() const { return dense_ ? dense_->is_shared : node_of(node_, "is_shared").caps().shared; }

int64_t TensorDict::bytes() const {
  int64_t n = 0;
  if (!dense_) {
    if (auto* lz = detail::lazy_node(*this)) {
      for (const auto& m : lz->members) n += m.bytes();
      return n;
    }
    for (const auto& e : values(KeysOptions().include_nested(true).leaves_only(true)))
      n += e.tensor().numel() * static_cast<int64_t>(e.tensor().element_size());
    return n;
  }
  detail::tree::for_each_leaf(
      *d(),
      [&](const detail::tree::KeyPath&, const Entry& e) {
        if (e.is_tensor()) n += e.tensor().numel() * static_cast<int64_t>(e.tensor().element_size());
      },
      [&](const detail::tree::KeyPath&, const TensorDict& sub) { n += sub.bytes(); },  // its own form
      detail::tree::Descend::DenseOnly);
  return n;
}

bool TensorDict::is_empty() const {
  if (!dense_) {  // the structure only: a leaf anywhere means not empty
    for (const auto& km : node_of(node_, "is_empty").metas()) {
      if (!km.second.is_tensordict()) return false;
      if (!node_->read(km.first)->tensordict().is_empty()) return false;
    }
    return true;
  }
  for (const auto& kv : d()->entries) {
    if (!kv.second.is_tensordict()) return false;
    if (!kv.second.tensordict().is_empty()) return false;
  }
  return true;
}

static void check_batch_size(const TensorDictImpl& impl, const BatchSize& bs) {
  for (auto s : bs)
    if (s < 0) throw BatchSizeError("batch size " + shape_str(bs) + " has a negative dimension");
  for (const auto& kv : impl.entries) {
    if (kv.second.is_non_tensor_data()) continue;  // broadcast: follows the batch size
    BatchSize shape = kv.second.shape();
    bool ok = shape.size() >= bs.size() && std::equal(bs.begin(), bs.end(), shape.begin());
    if (!ok) {
      std::string what = kv.second.is_tensordict() ? "TensorDict" : "tensor";
      throw BatchSizeError("the " + what + " " + kv.first + " has shape " + shape_str(shape) +
                           " which is incompatible with the batch-size " + shape_str(bs) + ".");
    }
  }
}

void TensorDict::set_batch_size(BatchSize batch_size) {
  if (detail::lazy_node(*this)) {
    throw RuntimeError("Modifying the batch size of a lazy representation of a tensordict is not permitted. Consider "
                       "instantiating the tensordict first by calling `td = td.to_tensordict()` before resetting "
                       "the batch size.");
  }
  check_batch_size(*d(), batch_size);
  // NonTensorData follows the batch size of its parent (it is broadcast) unless its own batch size already
  // starts with the new one (upstream _batch_size_setter: a child keeps its batch size, extra trailing dims
  // included, unless it is shorter than the new batch size)
  for (auto& kv : d()->entries) {
    if (kv.second.is_non_tensor_data()) {
      const BatchSize& own = kv.second.non_tensor_data().batch_size();
      if (own.size() >= batch_size.size() && std::equal(batch_size.begin(), batch_size.end(), own.begin())) continue;
      kv.second = Entry(NonTensorData(kv.second.non_tensor_data().value(), batch_size));
    }
  }
  d()->batch_size = std::move(batch_size);
}

// ============================================================================ keys
static void collect_keys(const TensorDictImpl& impl, const NestedKey& prefix, const KeysOptions& o,
                         std::vector<std::pair<NestedKey, Entry>>& out) {
  for (const auto& kv : impl.entries) {
    NestedKey full = prefix + NestedKey(kv.first);
    const Entry& e = kv.second;
    if (o.include_nested() && e.is_tensordict()) {
      TensorDict sub = e.tensordict();
      if (!sub.is_dense()) throw detail::NotDense{};
      collect_keys(*sub.impl(), full, o, out);
    }
    bool leaf = e.is_tensor() || (o.non_tensor_leaves() && e.is_non_tensor());
    if (!o.leaves_only() || leaf) out.emplace_back(std::move(full), e);
  }
}

std::vector<std::pair<NestedKey, Entry>> TensorDict::items(const KeysOptions& options) const {
  std::vector<std::pair<NestedKey, Entry>> out;
  bool dense_tree = dense_ != nullptr;
  if (dense_tree) {
    out.reserve(dense_->entries.size());
    try {
      collect_keys(*dense_, NestedKey(), options, out);
    } catch (const detail::NotDense&) {
      dense_tree = false;
      out.clear();
    }
  }
  if (!dense_tree) collect_node_keys(*this, NestedKey(), options, out);
  if (options.sort()) {
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.first.join(".") < b.first.join("."); });
  }
  return out;
}

std::vector<NestedKey> TensorDict::keys(const KeysOptions& options) const {
  if (!dense_ && node_ && !options.include_nested() && !options.leaves_only() && !options.sort()) {
    std::vector<NestedKey> out;
    for (auto& k : node_->keys()) out.emplace_back(std::move(k));
    return out;
  }
  if (dense_ && !options.include_nested() && !options.leaves_only() && !options.sort()) {
    std::vector<NestedKey> out;
    out.reserve(d()->entries.size());
    for (const auto& kv : d()->entries) out.emplace_back(kv.first);
    return out;
  }
  std::vector<NestedKey> out;
  bool dense_tree = dense_ != nullptr;
  if (dense_tree) {
    std::vector<std::pair<NestedKey, Entry>> dense_items;
    dense_items.reserve(dense_->entries.size());
    try {
      collect_keys(*dense_, NestedKey(), options, dense_items);
      out.reserve(dense_items.size());
      for (auto& kv : dense_items) out.push_back(std::move(kv.first));
    } catch (const detail::NotDense&) {
      dense_tree = false;
    }
  }
  if (!dense_tree) {  // another node kind in the tree: its structure through Node::meta, no data read
    if (!node_) d("keys");
    for (auto& km : detail::key_metas(*this, options)) out.push_back(std::move(km.first));
  }
  if (options.sort()) std::stable_sort(out.begin(), out.end(), [](const NestedKey& a, const NestedKey& b) {
    return a.join(".") < b.join(".");
  });
  return out;
}

std::vector<Entry> TensorDict::values(const KeysOptions& options) const {
  std::vector<Entry> out;
  for (auto& kv : items(options)) out.push_back(std::move(kv.second));
  return out;
}

bool TensorDict::contains(const NestedKey& key) const {
  if (key.empty()) return false;
  try {
    if (dense_) {
      try {
        const TensorDictImpl* p = detail::walk(dense_, key);
        return p && p->find(key.back());
      } catch (const detail::NotDense&) {
      }
    }
    if (!node_) d("contains");
    return detail::meta_at(*this, key).has_value();  // the structure only: no leaf is read
  } catch (const KeyError&) {
    return false;
  } catch (const AttributeError&) {  // a level of the key is a leaf
    return false;
  }
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
  collect_node_metas(td, NestedKey(), options, out);
  return out;
}

}  // namespace detail

// ============================================================================ reading
std::optional<Entry> TensorDict::get_entry_opt(const NestedKey& key) const {
  if (key.empty()) throw KeyError("empty key");
  if (!dense_ || key.size() > 1) {
    try {
      if (!dense_) throw detail::NotDense{};
      const TensorDictImpl* p = detail::walk(dense_, key);
      if (!p) return std::nullopt;
      const Entry* e = p->find(key.back());
      if (!e) return std::nullopt;
      return *e;
    } catch (const detail::NotDense&) {
      TensorDict parent = parent_of(*this, key, false);
      if (!parent.defined()) return std::nullopt;
      return parent.node()->read(key.back());
    }
  }
  const TensorDictImpl* p = dense_;
  if (!p) return std::nullopt;
  const Entry* e = p->find(key.back());
  if (!e) return std::nullopt;
  return *e;
}

Entry TensorDict::get_entry(const NestedKey& key) const {
  if (key.empty()) throw KeyError("empty key");
  const TensorDictImpl* p = nullptr;
  try {
    if (!dense_) throw detail::NotDense{};
    p = detail::walk(dense_, key);
  } catch (const detail::NotDense&) {
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

//! an index that selects along batch dims only, as a leaf indexes it: ints and slices, or slices and one
//! integer index list (no None / Ellipsis / mask, whose placement rules differ between a leaf and td[idx])
static bool batch_only_index(const Index& index, size_t batch_dims) {
  if (index.size() > batch_dims) return false;
  size_t tensors = 0, ints = 0;
  for (const auto& e : index) {
    if (e.is_integer()) {
      ++ints;
    } else if (e.is_tensor()) {
      const at::Tensor& t = e.tensor();
      if (!t.defined() || t.dim() != 1 || !at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) return false;
      ++tensors;
    } else if (!e.is_slice()) {
      return false;
    }
  }
  return tensors == 0 || (tensors == 1 && ints == 0);
}

at::Tensor TensorDict::get_at(const NestedKey& key, const Index& index) const {
  // a node whose leaves are not in memory reads the selected rows only (td[idx] is composed without I/O)
  if (!dense_ && node_ && !node_->dense_view() && batch_only_index(index, batch_size().size())) {
    return this->index(index).get(key);
  }
  return get(key).index(index);
}

// ============================================================================ writing
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

TensorDict& TensorDict::set(const NestedKey& key, const Entry& value, bool inplace) {
  if (key.empty()) throw KeyError("empty key");
  TensorDictImpl* p = nullptr;
  if (!dense_walk(dense_, key, /*create=*/dense_ && (!dense_->locked || !inplace), &p)) {
    if (!node_) d("set");
    TensorDict parent = parent_of(*this, key, /*create=*/!is_locked() || !inplace);
    if (!parent.defined()) missing_in_node(key, *this);
    if (parent.is_dense()) {
      parent.set(NestedKey(key.back()), value, inplace);
      return *this;
    }
    LazyStackNode* lz = detail::lazy_node(parent);
    if (inplace && parent.node()->meta(key.back())) {
      if (lz) {
        lz->put_inplace(key.back(), value);
      } else {
        parent.node()->put(key.back(), value);  // other nodes write an existing key in place
      }
      return *this;
    }
    check_node_unlocked(parent);
    parent.node()->put(key.back(), value);
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
}

TensorDict& TensorDict::set(const char* key, const Entry& value, bool inplace) {
  // an unlocked dense node, not in place: what the general path does for a one-part key, without the NestedKey
  if (dense_ && !inplace && !dense_->locked && key && *key) {
    std::string k(key);
    dense_->put_entry(k, prepare_value(*dense_, k, value));
    return *this;
  }
  return set(NestedKey(key), value, inplace);
}

TensorDict& TensorDict::set_(const NestedKey& key, const Entry& value) {
  if (key.empty()) throw KeyError("empty key");
  TensorDictImpl* p = nullptr;
  if (!dense_walk(dense_, key, false, &p)) {
    if (!node_) d("set_");
    TensorDict parent = parent_of(*this, key, false);
    if (!parent.defined()) {
      throw KeyError("key " + key.repr() + " not found in tensordict, call td.set(key, value) to add a new key");
    }
    if (parent.is_dense()) {
      parent.set_(NestedKey(key.back()), value);
      return *this;
    }
    if (LazyStackNode* lz = detail::lazy_node(parent)) {
      lz->put_inplace(key.back(), value);
    } else if (parent.node()->meta(key.back())) {
      parent.node()->put(key.back(), value);  // other nodes write an existing key in place
    } else {
      throw KeyError("key " + key.repr() + " not found in tensordict, call td.set(key, value) to add a new key");
    }
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
  if (!is_dense()) {  // get() of another node kind may be a copy: read, modify, write back in place
    at::Tensor t = get(key);
    t.index_put_(index, value);
    return set_(key, t);
  }
  at::Tensor t = get(key);
  t.index_put_(index, value);
  return *this;
}

TensorDict& TensorDict::set_non_tensor(const NestedKey& key, const JsonValue& value) {
  return set(key, Entry(value));
}

static void update_impl(TensorDict& self, const TensorDict& other, const UpdateOptions& o, const NestedKey& prefix) {
  std::vector<std::pair<std::string, Entry>> theirs;
  if (other.is_dense()) {
    theirs = other.impl()->entries;
  } else {
    for (const auto& k : other.node()->keys()) theirs.emplace_back(k, *other.node()->read(k));
  }
  for (const auto& kv : theirs) {
    NestedKey k(kv.first);
    NestedKey full = prefix + k;
    if (o.keys_to_update()) {
      const auto& ks = *o.keys_to_update();
      std::string joined = full.join(".");
      bool wanted = false;
      for (const auto& w : ks)
        if (w == joined || joined.rfind(w + ".", 0) == 0 || w.rfind(joined + ".", 0) == 0) wanted = true;
      if (!wanted) continue;
    }
    std::optional<Entry> mine = self.node()->read(kv.first);
    if (kv.second.is_tensordict() && mine && mine->is_tensordict()) {
      TensorDict sub = mine->tensordict();
      update_impl(sub, kv.second.tensordict(), o, full);
      continue;
    }
    Entry v = kv.second;
    if (o.clone()) {
      if (v.is_tensor()) v = Entry(v.tensor().clone());
      if (v.is_tensordict()) v = Entry(v.tensordict().clone());
    }
    if (o.inplace() && mine) {
      self.set(k, v, true);
    } else if (o.ignore_lock()) {
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
  update_impl(*this, other, options, NestedKey());
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
  for (const auto& kv : other.items(KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
    set_(kv.first, kv.second);
  }
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
  for (const auto& kv : items) set_(kv.first, kv.second);
  return *this;
}

TensorDict& TensorDict::update_at_(const TensorDict& other, const Index& index) {
  check_all_exist(*this, other);
  if (!dense_) {
    this->index(index).update_(other);
    return *this;
  }
  for (const auto& kv : other.items(KeysOptions().include_nested(true).leaves_only(true))) {
    get(kv.first).index_put_(index, kv.second.tensor());
  }
  return *this;
}

Entry TensorDict::pop(const NestedKey& key) {
  Entry e = get_entry(key);
  del(key);
  return e;
}

Entry TensorDict::pop(const NestedKey& key, const Entry& default_value) {
  if (!contains(key)) return default_value;
  return pop(key);
}

TensorDict& TensorDict::del(const NestedKey& key) {
  if (key.empty()) throw KeyError("empty key");
  TensorDictImpl* p = nullptr;
  if (!dense_walk(dense_, key, false, &p)) {
    if (!node_) d("del");
    TensorDict parent = parent_of(*this, key, false);
    if (!parent.defined() || !parent.node()->read(key.back())) missing_in_node(key, parent.defined() ? parent : *this);
    if (parent.is_dense()) {
      parent.del(NestedKey(key.back()));
      return *this;
    }
    check_node_unlocked(parent);
    parent.node()->erase(key.back());
    return *this;
  }
  if (!p || !p->find(key.back())) throw_missing_key(key, p ? *p : *d());
  if (p->locked) check_unlocked(*p, "del " + key.repr());
  p->erase(key.back());
  return *this;
}

TensorDict& TensorDict::rename_key_(const NestedKey& old_key, const NestedKey& new_key, bool safe) {
  if (detail::is_remote(*this)) {  // the value copied to the new key, then the old one removed
    check_node_unlocked(*this);
    if (safe && contains(new_key)) throw KeyError("key " + new_key.repr() + " already present in TensorDict.");
    Entry v = get_entry(old_key);
    set(new_key, v);
    del(old_key);
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {
    check_node_unlocked(*this);
    for (auto& m : lz->members) m.rename_key_(old_key, new_key, safe);
    return *this;
  }
  check_unlocked(*d(), "rename_key_");
  if (old_key == new_key) return *this;
  if (safe && contains(new_key)) {
    throw KeyError("key " + new_key.repr() + " already present in TensorDict (rename_key_ with safe=true)");
  }
  Entry e = get_entry(old_key);
  TensorDictImpl* op = detail::walk(d(), old_key, false);
  check_unlocked(*op, "rename_key_");
  // upstream: the renamed key is popped and set again, so it moves to the end of its level
  del(old_key);
  set(new_key, e);
  return *this;
}

Entry TensorDict::setdefault(const NestedKey& key, const Entry& default_value) {
  if (!contains(key)) set(key, default_value);
  return get_entry(key);
}

TensorDict& TensorDict::clear() {
  if (detail::is_remote(*this)) {
    check_node_unlocked(*this);
    for (const auto& k : keys()) del(k);
    return *this;
  }
  check_unlocked(*d(), "clear");
  d()->entries.clear();
  return *this;
}

TensorDict& TensorDict::fill_(const NestedKey& key, const at::Scalar& value) {
  if (detail::is_remote(*this)) {  // get() is a copy: fill it and write it back
    Entry e = get_entry(key);
    if (e.is_tensordict()) {
      e.tensordict().apply_([&](const at::Tensor& t) { return at::full_like(t, value); });
    } else {
      set_(key, at::full_like(e.tensor(), value));
    }
    return *this;
  }
  if (auto* lz = detail::lazy_node(*this)) {
    for (auto& m : lz->members) m.fill_(key, value);
    return *this;
  }
  Entry e = get_entry(key);
  if (e.is_tensordict()) {
    e.tensordict().apply_([&](const at::Tensor& t) { return t.fill_(value); });
  } else {
    e.tensor().fill_(value);
  }
  return *this;
}

// ============================================================================ key-structure ops
TensorDict TensorDict::empty(bool recurse) const {
  if (detail::is_remote(*this)) return contiguous().empty(recurse);  // a remote node: on its dense form
  if (auto* lz = detail::lazy_node(*this)) {
    std::vector<TensorDict> parts;
    for (const auto& m : lz->members) parts.push_back(m.empty(recurse));
    if (parts.empty()) return TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(lz->member_batch, lz->stack_dim, lz->device)));
    return detail::make_lazy(std::move(parts), lz->stack_dim);
  }
  TensorDict out = make_empty(*d(), d()->batch_size);
  if (recurse) {
    for (const auto& kv : d()->entries)
      if (kv.second.is_tensordict()) out.impl()->put(kv.first, Entry(kv.second.tensordict().empty(true)));
  }
  return out;
}

TensorDict TensorDict::select(const std::vector<NestedKey>& keys, bool strict, bool inplace) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).select(keys, strict, inplace));
  if (detail::is_remote(*this)) {
    if (inplace) throw NotImplementedError("select(..., inplace=true) on a " + node_->type_name() + ": use exclude or del");
    return contiguous().select(keys, strict);  // a remote node: on its dense form
  }
  if (auto* lz = detail::lazy_node(*this); lz && !inplace) {  // member by member (upstream)
    if (strict)
      for (const auto& k : keys)
        if (!contains(k)) missing_in_node(k, *this);
    std::vector<TensorDict> parts;
    for (const auto& m : lz->members) parts.push_back(m.select(keys, /*strict=*/false));
    return detail::make_lazy(std::move(parts), lz->stack_dim);
  }
  if (inplace) check_unlocked(*d(), "select(inplace=true)");
  TensorDict out = make_empty(*d(), d()->batch_size);
  for (const auto& k : keys) {
    auto e = get_entry_opt(k);
    if (!e && strict) throw_missing_key(k, *d());
    // rebuild intermediate levels with their own batch sizes; with strict=false a missing leaf still keeps
    // the levels above it that exist (upstream)
    TensorDictImpl* dst = out.impl().get();
    const TensorDictImpl* src = d();
    bool reached = true;
    for (size_t i = 0; i + 1 < k.size(); ++i) {
      const Entry* se = src->find(k[i]);
      if (!se || !se->is_tensordict()) {
        reached = false;
        break;
      }
      src = se->tensordict().impl().get();
      Entry* de = dst->find(k[i]);
      if (!de) {
        dst->put(k[i], Entry(make_empty(*src, src->batch_size)));
        de = dst->find(k[i]);
      }
      dst = de->tensordict().impl().get();
    }
    if (e && reached) dst->put(k.back(), *e);
  }
  if (inplace) {
    d()->entries = out.impl()->entries;
    return *this;
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
      const auto& child = *kv.second.tensordict().impl();
      TensorDict c = make_empty(child, child.batch_size);
      exclude_into(child, *c.impl(), sub);
      dst.entries.emplace_back(kv.first, Entry(c));
    } else {
      dst.entries.emplace_back(kv.first, kv.second);
    }
  }
}

TensorDict TensorDict::exclude(const std::vector<NestedKey>& keys, bool inplace) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).exclude(keys, inplace));
  if (detail::is_remote(*this) && !inplace) return contiguous().exclude(keys);  // a remote node: on its dense form
  if (auto* lz = detail::lazy_node(*this)) {
    std::vector<TensorDict> parts;
    for (const auto& m : lz->members) parts.push_back(m.exclude(keys, inplace));
    if (inplace) return *this;
    return detail::make_lazy(std::move(parts), lz->stack_dim);
  }
  // upstream allows exclude(inplace=True) on a locked (memmap, shared) TensorDict: no lock check here
  if (inplace && !is_dense()) {  // a store: erased through the node
    for (const auto& k : keys) {
      if (!contains(k)) continue;
      TensorDict parent = k.size() == 1 ? *this : get_td(k.parent());
      parent.node()->erase(k.back());
    }
    return *this;
  }
  TensorDict out = make_empty(*d(), d()->batch_size);
  exclude_into(*d(), *out.impl(), keys);
  if (inplace) {
    d()->entries = out.impl()->entries;
    return *this;
  }
  return out;
}

static std::vector<TensorDict> split_keys_impl(const TensorDict& self,
                                               const std::vector<std::vector<NestedKey>>& key_sets, bool inplace,
                                               bool strict, const Entry* default_value) {
  std::vector<TensorDict> out;
  std::vector<NestedKey> all;
  for (const auto& ks : key_sets) {
    if (!default_value) {
      out.push_back(self.select(ks, strict));
    } else {  // upstream default=: a missing key gets the default value
      std::vector<NestedKey> present, missing;
      for (const auto& k : ks) (self.contains(k) ? present : missing).push_back(k);
      TensorDict part = self.select(present, strict);
      for (const auto& k : missing) part.set(k, *default_value);
      out.push_back(part);
    }
    all.insert(all.end(), ks.begin(), ks.end());
  }
  if (inplace) {
    out.push_back(self.exclude(all, true));
  } else {
    out.push_back(self.exclude(all).clone());
  }
  return out;
}

std::vector<TensorDict> TensorDict::split_keys(const std::vector<std::vector<NestedKey>>& key_sets,
                                               const Entry& default_value, bool inplace) const {
  return split_keys_impl(*this, key_sets, inplace, /*strict=*/true, &default_value);
}

std::vector<TensorDict> TensorDict::split_keys(const std::vector<std::vector<NestedKey>>& key_sets, bool inplace,
                                               bool strict) const {
  return split_keys_impl(*this, key_sets, inplace, strict, nullptr);
}

TensorDict TensorDict::flatten_keys(const std::string& separator, bool inplace) const {
  if (!is_dense()) return contiguous().flatten_keys(separator, inplace);  // another node kind: on its dense form
  TensorDict out = make_empty(*d(), d()->batch_size);
  for (auto& kv : items(KeysOptions().include_nested(true))) {
    const Entry& e = kv.second;
    if (e.is_tensordict()) continue;  // upstream: sub-TensorDicts (empty ones too) leave no key
    std::string k = kv.first.join(separator);
    if (out.impl()->find(k)) {
      throw KeyError("flatten_keys: the flattened key '" + k + "' collides with an existing key");
    }
    out.impl()->entries.emplace_back(k, e);
  }
  if (inplace) {
    check_unlocked(*d(), "flatten_keys(inplace=true)");
    d()->entries = out.impl()->entries;
    return *this;
  }
  return out;
}

TensorDict TensorDict::unflatten_keys(const std::string& separator, bool inplace) const {
  if (!is_dense()) return contiguous().unflatten_keys(separator, inplace);  // another node kind: on its dense form
  if (separator.empty()) throw ValueError("unflatten_keys: empty separator");
  TensorDict out = make_empty(*d(), d()->batch_size);
  // plain keys first so that a collision is detected whatever the order
  for (const auto& kv : d()->entries) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
      size_t pos = kv.first.find(separator, start);
      parts.push_back(kv.first.substr(start, pos - start));
      if (pos == std::string::npos) break;
      start = pos + separator.size();
    }
    NestedKey k{std::vector<std::string>(parts)};
    Entry v = kv.second;
    if (v.is_tensordict()) v = Entry(v.tensordict().unflatten_keys(separator));
    if (out.contains(k)) {
      Entry cur = out.get_entry(k);
      if (cur.is_tensordict() && v.is_tensordict()) {
        cur.tensordict().update(v.tensordict());
        continue;
      }
      throw KeyError("unflatten_keys: key '" + kv.first + "' collides with another key unflattened to " + k.repr());
    }
    try {
      out.set(k, v);
    } catch (const ValueError& e) {  // a level of k is a leaf
      throw KeyError("unflatten_keys: key '" + kv.first + "' collides with a leaf (" + e.what() + ")");
    }
  }
  if (inplace) {
    check_unlocked(*d(), "unflatten_keys(inplace=true)");
    d()->entries = out.impl()->entries;
    return *this;
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
    return sub.clone(recurse);
  }
  std::optional<TensorDict> sub_result(const detail::tree::KeyPath&, const TensorDict& sub, TensorDict out, bool) {
    return detail::keep_type(sub, std::move(out));
  }
};
}  // namespace

TensorDict TensorDict::clone(bool recurse) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).clone(recurse));
  if (detail::is_remote(*this)) return contiguous();  // a remote node: its dense form is a copy already
  if (auto* lz = detail::lazy_node(*this)) {
    std::vector<TensorDict> members;
    for (const auto& m : lz->members) members.push_back(m.clone(recurse));
    if (members.empty()) return TensorDict(std::shared_ptr<Node>(std::make_shared<LazyStackNode>(lz->member_batch, lz->stack_dim, lz->device)));
    return detail::make_lazy(std::move(members), lz->stack_dim);
  }
  CloneVisitor v{{}, recurse};
  return detail::tree::rebuild(*d(), d()->batch_size, v);
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
    return sub.impl().get();
  }
};
}  // namespace

TensorDict TensorDict::shallow_copy() const {
  CopyNodesVisitor v;
  return detail::tree::rebuild(*d(), d()->batch_size, v);
}

TensorDict TensorDict::to(at::Device device) const {
  if (detail::is_remote(*this)) return contiguous().to(device);  // a remote node: on its dense form
  if (auto* lz = detail::lazy_node(*this)) {
    std::vector<TensorDict> members;
    for (const auto& m : lz->members) members.push_back(m.to(device));
    return detail::make_lazy(std::move(members), lz->stack_dim);
  }
  if (d()->device && *d()->device == device) return *this;
  std::optional<at::Device> target = device;
  auto set_dev = [&](TensorDictImpl& root) {
    root.device = target;
    detail::tree::for_each_entry(root, [&](const detail::tree::KeyPath&, const Entry& e) -> const TensorDictImpl* {
      if (!e.is_tensordict()) return nullptr;
      TensorDictImpl* level = e.tensordict().impl().get();  // another node kind: NotImplementedError
      level->device = target;
      return level;
    });
  };
  // apply() moves results to the result's device (upstream): run it on a device-less structure copy
  TensorDict src = clone(false);
  target = std::nullopt;
  set_dev(*src.impl());
  TensorDict out = src.apply([&](const at::Tensor& t) { return t.to(device); });
  target = device;
  set_dev(*out.impl());
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

static void unlock_node(const std::shared_ptr<Node>& node) {
  node->locked = false;
  if (node->kind() == NodeType::Dense) {
    auto* impl = static_cast<TensorDictImpl*>(node.get());
    impl->is_memmap = false;
    impl->is_shared = false;
  }
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
