// The node interface's defaults and the dense node's node methods. Node's default operations (issue 34,
// item 2): each operation of the handle reaches its node through a virtual of tensordict/node.hpp; the defaults below are written once over the node interface. A node with
// a dense_view() (a store) runs the dense node's form on that view; any other node (HDF5, Redis) runs the
// operation on its dense form (`self.contiguous()`: one read) and writes in-place results through put() /
// write(). The dense node (tensor_dict.cpp, shape_ops.cpp) and the lazy stack (lazy_stack_ops.cpp) override
// them.
#include <algorithm>
#include <string>

#include <ATen/ExpandUtils.h>

#include "tensor_dict_internal.hpp"
#include "tensordict/index_math.hpp"

namespace tensordict {

namespace {
//! what an operation without a form for this node says (the text the handle's dense-only paths use)
[[noreturn]] void not_supported(const Node& node, const char* what) {
  throw NotImplementedError(std::string(what) + " is not supported on a " + node.type_name() +
                            " (dense TensorDicts only); densify it first with contiguous()");
}

}  // namespace

// ============================================================================ the node interface, the dense node
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
      return e.tensordict().node()->as_entry_meta();
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
  put(key, Entry(TensorDict(batch_size, device)));
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

// ============================================================================ the handle: metadata
std::optional<EntryMeta> TensorDict::meta(const NestedKey& key) const {
  detail::node_of(*this, "meta");
  return detail::meta_at(*this, key);
}

void TensorDict::refresh() { detail::node_of(*this, "refresh").refresh(); }

EntryMeta Node::as_entry_meta() const {
  EntryMeta m;
  m.kind = EntryMeta::Kind::TensorDict;
  m.shape = batch_size;
  m.device = device;
  return m;
}

// ============================================================================ key access
// the structure from metas() (no data read), the tensor leaves in one batched read (a store node: one request),
// the rest (sub-TensorDict handles, non-tensors) one by one
std::vector<std::pair<std::string, Entry>> Node::read_all() const {
  const auto ms = metas();
  std::vector<std::string> tensor_keys;
  for (const auto& [k, m] : ms)
    if (m.kind == EntryMeta::Kind::Tensor) tensor_keys.push_back(k);
  std::vector<Entry> tensors;
  if (!tensor_keys.empty()) tensors = read(tensor_keys, Index{});
  std::vector<std::pair<std::string, Entry>> out;
  out.reserve(ms.size());
  size_t next = 0;
  for (const auto& [k, m] : ms) {
    if (m.kind == EntryMeta::Kind::Tensor) {
      out.emplace_back(k, std::move(tensors.at(next++)));
    } else if (std::optional<Entry> e = read(k)) {
      out.emplace_back(k, std::move(*e));
    }
  }
  return out;
}

void Node::set_entry(const NestedKey& key, const Entry& value, bool inplace) {
  if (!(inplace && meta(key.back()))) detail::check_node_unlocked(*this);
  put(key.back(), value);  // an existing key is written in place
}

void Node::update_entry(const NestedKey& key, const Entry& value) {
  const std::optional<EntryMeta> m = meta(key.back());
  if (!m) throw KeyError("key " + key.repr() + " not found in tensordict, call td.set(key, value) to add a new key");
  // in place, as a dense leaf's copy_: the value broadcast to the leaf's shape and converted to its dtype, never
  // a replacement of another shape or dtype (a store's put replaces a key whose value differs: set_ did that)
  detail::check_copy_into(*m, value, key);
  if (m->kind == EntryMeta::Kind::Tensor) {
    const at::Tensor& v = value.tensor();
    if (!v.sizes().equals(m->shape) || v.scalar_type() != m->dtype) {
      if (std::find(m->shape.begin(), m->shape.end(), -1) != m->shape.end()) {  // ragged: no shape to expand to
        throw BatchSizeError("cannot copy a value of shape " + detail::shape_str(v.sizes()) + " into " + key.repr() +
                             " of shape " + detail::shape_str(m->shape));
      }
      return put(key.back(), Entry(v.to(m->dtype).expand(m->shape)));
    }
  }
  put(key.back(), value);  // an existing key is written in place
}

void Node::del_entry(const NestedKey& key) {
  detail::check_node_unlocked(*this);
  erase(key.back());
}

void Node::rename_key(TensorDict& self, const NestedKey& old_key, const NestedKey& new_key, bool safe) {
  if (auto view = dense_view()) return view->rename_key(self, old_key, new_key, safe);
  // the value copied to the new key, then the old one removed
  detail::check_node_unlocked(*this);
  if (safe && self.contains(new_key)) throw KeyError("key " + new_key.repr() + " already present in TensorDict.");
  Entry v = self.get_entry(old_key);
  self.set(new_key, v);
  self.del(old_key);
}

void Node::clear(TensorDict& self) {
  if (auto view = dense_view()) return view->clear(self);
  detail::check_node_unlocked(*this);
  for (const auto& k : self.keys()) self.del(k);
}

void Node::fill(TensorDict& self, const NestedKey& key, const at::Scalar& value) {
  if (auto view = dense_view()) return view->fill(self, key, value);
  Entry e = self.get_entry(key);  // a copy: filled, then written back
  if (e.is_tensordict()) {
    e.tensordict().apply_([&](const at::Tensor& t) { return at::full_like(t, value); });
  } else {
    self.set_(key, at::full_like(e.tensor(), value));
  }
}

void Node::set_at(TensorDict& self, const NestedKey& key, const at::Tensor& value, const Index& index) {
  at::Tensor t = self.get(key);  // may be a copy: modified, then written back in place
  t.index_put_(index, value);
  self.set_(key, t);
}

void Node::set_batch_size(TensorDict& self, BatchSize batch_size) {
  if (auto view = dense_view()) return view->set_batch_size(self, std::move(batch_size));
  not_supported(*this, "this operation");
}

int64_t Node::bytes(const TensorDict& self) const {
  int64_t n = 0;
  for (const auto& e : self.values(KeysOptions().include_nested(true).leaves_only(true)))
    n += e.tensor().numel() * static_cast<int64_t>(e.tensor().element_size());
  return n;
}

// ============================================================================ key-structure ops
TensorDict Node::empty(const TensorDict& self, bool recurse) const {
  if (auto view = dense_view()) return view->empty(self, recurse);
  return self.contiguous().empty(EmptyOptions().recurse(recurse));
}

TensorDict Node::select(const TensorDict& self, const std::vector<NestedKey>& keys, bool strict, bool inplace) const {
  if (auto view = dense_view()) return view->select(self, keys, strict, inplace);
  if (inplace) throw NotImplementedError("select(..., inplace=true) on a " + type_name() + ": use exclude or del");
  return self.contiguous().select(keys, SelectOptions().strict(strict));
}

TensorDict Node::exclude(const TensorDict& self, const std::vector<NestedKey>& keys, bool inplace) const {
  if (inplace) {  // erased through the node (allowed on a locked TensorDict, as upstream)
    for (const auto& k : keys) {
      if (!self.contains(k)) continue;
      TensorDict parent = k.size() == 1 ? self : self.get_td(k.parent());
      parent.node()->erase(k.back());
    }
    return self;
  }
  if (auto view = dense_view()) return view->exclude(self, keys, false);
  return self.contiguous().exclude(keys);
}

TensorDict Node::flatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const {
  return self.contiguous().flatten_keys(FlattenKeysOptions().separator(separator).inplace(inplace));
}

TensorDict Node::unflatten_keys(const TensorDict& self, const std::string& separator, bool inplace) const {
  return self.contiguous().unflatten_keys(FlattenKeysOptions().separator(separator).inplace(inplace));
}

TensorDict Node::clone(const TensorDict& self, bool recurse) const {
  if (auto view = dense_view()) return view->clone(self, recurse);
  return self.contiguous();  // the dense form is a copy already
}

TensorDict Node::dense_form(const TensorDict& self) const { return self.contiguous(); }

// ============================================================================ persistence
void Node::memmap_(TensorDict& self, const std::string& prefix, const MemmapOptions& options) {
  if (auto view = dense_view()) return view->memmap_(self, prefix, options);
  throw NotImplementedError("memmap_ on a " + type_name() +
                            ": its leaves live in its storage; to_tensordict() (contiguous()) first, or memmap()");
}

TensorDict Node::memmap(const TensorDict& self, const std::string& prefix, const MemmapOptions& options) const {
  if (auto view = dense_view()) return view->memmap(self, prefix, options);
  return self.contiguous().memmap(prefix, options);  // on its dense form
}

TensorDict Node::memmap_like(const TensorDict& self, const std::string& prefix, const MemmapOptions& options) const {
  if (auto view = dense_view()) return view->memmap_like(self, prefix, options);
  return self.contiguous().memmap_like(prefix, options);  // on its dense form
}

void Node::share_memory_(TensorDict& self) {
  if (auto view = dense_view()) return view->share_memory_(self);
  throw NotImplementedError("share_memory_ on a " + type_name() +
                            ": its leaves live in its storage; to_tensordict() (contiguous()) first");
}

TensorDict Node::to(const TensorDict& self, at::Device device) const {
  if (auto view = dense_view()) return view->to(self, device);
  return self.contiguous().to(device);
}

// ============================================================================ apply, fills, in-place arithmetic
namespace {
//! an in-place op of a node without a dense view: run on the dense form, written back in one request
template <class Op>
void on_dense_form(TensorDict& self, Op&& op) {
  TensorDict dense = self.contiguous();
  op(dense);
  detail::write_back(self, dense);
}
}  // namespace

TensorDict Node::apply(const TensorDict& self, const LeafFn& fn, const ApplyOptions& options) const {
  if (auto view = dense_view()) return view->apply(self, fn, options);
  return self.contiguous().apply(fn, options);
}

TensorDict Node::apply(const TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others,
                       const ApplyOptions& options) const {
  if (auto view = dense_view()) return view->apply(self, fn, others, options);
  return self.contiguous().apply(fn, others, options);
}

void Node::apply_(TensorDict& self, const LeafFn& fn) {
  if (auto view = dense_view()) return view->apply_(self, fn);
  on_dense_form(self, [&](TensorDict& d) { d.apply_(fn); });
}

void Node::apply_(TensorDict& self, const MultiLeafFn& fn, const std::vector<TensorDict>& others) {
  if (auto view = dense_view()) return view->apply_(self, fn, others);
  on_dense_form(self, [&](TensorDict& d) { d.apply_(fn, others); });
}

TensorDict Node::named_apply(const TensorDict& self, const NamedLeafFn& fn, const ApplyOptions& options) const {
  return self.contiguous().named_apply(fn, options);
}

TensorDict Node::named_apply(const TensorDict& self, const NamedMultiLeafFn& fn, const std::vector<TensorDict>& others,
                             const ApplyOptions& options) const {
  return self.contiguous().named_apply(fn, others, options);
}

void Node::zero_(TensorDict& self) {
  self.apply_([](const at::Tensor& t) { return at::zeros_like(t); });
}

TensorDict Node::masked_fill(const TensorDict& self, const at::Tensor& mask, const at::Scalar& value) const {
  return self.contiguous().masked_fill(mask, value);
}

void Node::masked_fill_(TensorDict& self, const at::Tensor& mask, const at::Scalar& value) {
  if (auto view = dense_view()) return view->masked_fill_(self, mask, value);
  on_dense_form(self, [&](TensorDict& d) { d.masked_fill_(mask, value); });
}

TensorDict Node::where(const TensorDict& self, const at::Tensor& condition, const TensorDict& other) const {
  return self.contiguous().where(condition, other);
}

TensorDict Node::where(const TensorDict& self, const at::Tensor& condition, const at::Scalar& other) const {
  return self.contiguous().where(condition, other);
}

void Node::add_(TensorDict& self, const TensorDict& other) {
  if (auto view = dense_view()) return view->add_(self, other);
  on_dense_form(self, [&](TensorDict& d) { d.add_(other); });
}

void Node::add_(TensorDict& self, const at::Scalar& other) {
  if (auto view = dense_view()) return view->add_(self, other);
  on_dense_form(self, [&](TensorDict& d) { d.add_(other); });
}

void Node::mul_(TensorDict& self, const at::Scalar& other) {
  if (auto view = dense_view()) return view->mul_(self, other);
  on_dense_form(self, [&](TensorDict& d) { d.mul_(other); });
}

// ============================================================================ the handle's shape ops
// each reaches its node; Node's default runs the op on the dense form (a store's: a view of its storage)
TensorDict TensorDict::view(BatchSize shape) const { return detail::node_of(*this, "view").view(*this, std::move(shape)); }
TensorDict TensorDict::reshape(BatchSize shape) const {
  return detail::node_of(*this, "reshape").reshape(*this, std::move(shape));
}
TensorDict TensorDict::flatten(int64_t start_dim, int64_t end_dim) const {
  return detail::node_of(*this, "flatten").flatten(*this, start_dim, end_dim);
}
TensorDict TensorDict::unflatten(int64_t dim, BatchSize sizes) const {
  return detail::node_of(*this, "unflatten").unflatten(*this, dim, std::move(sizes));
}
TensorDict TensorDict::squeeze() const { return detail::node_of(*this, "squeeze").squeeze(*this, std::nullopt); }
TensorDict TensorDict::squeeze(int64_t dim) const { return detail::node_of(*this, "squeeze").squeeze(*this, dim); }
TensorDict TensorDict::unsqueeze(int64_t dim) const { return detail::node_of(*this, "unsqueeze").unsqueeze(*this, dim); }
TensorDict TensorDict::permute(std::vector<int64_t> dims) const {
  return detail::node_of(*this, "permute").permute(*this, std::move(dims));
}
TensorDict TensorDict::transpose(int64_t dim0, int64_t dim1) const {
  return detail::node_of(*this, "transpose").transpose(*this, dim0, dim1);
}
TensorDict TensorDict::expand(BatchSize shape) const {
  if (typed_) return detail::keep_type(*this, with_schema(nullptr).expand(shape));
  return detail::node_of(*this, "expand").expand(*this, std::move(shape));
}

TensorDict Node::view(const TensorDict& self, BatchSize shape) const { return self.contiguous().view(shape); }
TensorDict Node::reshape(const TensorDict& self, BatchSize shape) const { return self.contiguous().reshape(shape); }
TensorDict Node::flatten(const TensorDict& self, int64_t start_dim, int64_t end_dim) const {
  return self.contiguous().flatten(start_dim, end_dim);
}
TensorDict Node::unflatten(const TensorDict& self, int64_t dim, BatchSize sizes) const {
  return self.contiguous().unflatten(dim, sizes);
}
TensorDict Node::squeeze(const TensorDict& self, std::optional<int64_t> dim) const {
  return dim ? self.contiguous().squeeze(*dim) : self.contiguous().squeeze();
}
TensorDict Node::unsqueeze(const TensorDict& self, int64_t dim) const { return self.contiguous().unsqueeze(dim); }
TensorDict Node::permute(const TensorDict& self, std::vector<int64_t> dims) const {
  return self.contiguous().permute(dims);
}
TensorDict Node::transpose(const TensorDict& self, int64_t dim0, int64_t dim1) const {
  return self.contiguous().transpose(dim0, dim1);
}
TensorDict Node::expand(const TensorDict& self, BatchSize shape) const { return self.contiguous().expand(shape); }

}  // namespace tensordict
