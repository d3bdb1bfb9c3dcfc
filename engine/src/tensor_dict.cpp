// TensorDict core: the engine's shared helpers, Entry, construction, metadata (keys and reads:
// tensor_dict_keys.cpp; writes: tensor_dict_write.cpp).
#include "tensordict/backends/shape_text.hpp"
#include <algorithm>
#include <cstring>
#include <sstream>

#include "lazy_stack_node.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tree_visitor.hpp"
#include "tensordict/index_math.hpp"
#include "tensor_dict_paths.hpp"

namespace tensordict {

// ============================================================================ detail helpers
namespace detail {

std::string shape_list(at::IntArrayRef shape) { return shape_text(shape); }
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

//! a nested key whose level `part` is a leaf: upstream raises KeyError when setting ("The entry ... is already
//! present"), ValueError when reading ("Expected a TensorDictBase instance"); del_ makes it an AttributeError
[[noreturn]] void through_leaf(const NestedKey& key, const std::string& part, const char* kind, bool set) {
  const std::string msg = "key " + key.repr() + ": '" + part + "' is a " + kind +
                          ", not a TensorDict, so it cannot hold nested keys";
  if (set) throw KeyError(msg);
  throw ValueError(msg);
}

bool dense_walk(TensorDictImpl* root, const NestedKey& key, bool create, TensorDictImpl** out) {
  if (!root) return false;
  TensorDictImpl* cur = root;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    Entry* e = cur->find(key[i]);
    if (!e) {
      if (!create) {
        *out = nullptr;
        return true;
      }
      if (cur->locked) check_unlocked(*cur, "creating sub-TensorDict '" + key[i] + "'");
      TensorDict sub = make_empty(*cur, cur->batch_size);
      cur->put(key[i], Entry(sub));
      e = cur->find(key[i]);
    }
    if (!e->is_tensordict()) {
      through_leaf(key, key[i], Entry::kind_name(e->kind()), create);
    }
    cur = tree::dense_root(e->tensordict());
    if (!cur) return false;  // another node kind on the way: the caller takes the node interface
  }
  *out = cur;
  return true;
}

TensorDictImpl* walk(TensorDictImpl* root, const NestedKey& key, bool create) {
  TensorDictImpl* out = nullptr;
  if (!dense_walk(root, key, create, &out)) {
    throw NotImplementedError("key " + key.repr() + " passes through a sub-TensorDict of another node kind");
  }
  return out;
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

void write_back(const TensorDict& self, const TensorDict& dense) { self.node()->write(Index{}, dense); }

TensorDict dense_tree(const TensorDict& td) {
  if (is_dense_tree(td)) return td;
  const TensorDictImpl* level = tree::dense_level(td);
  if (!level) return dense_tree(td.contiguous());
  auto out = std::make_shared<TensorDictImpl>(*level);  // entries (leaves shared), flags
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
  const TensorDictImpl& src = *detail::impl_of(td);
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

void Entry::wrong_kind(Entry::Kind want, Entry::Kind got) {
  throw TypeError(std::string("expected a ") + Entry::kind_name(want) + " entry, got a " + Entry::kind_name(got));
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

namespace detail {
void check_node_unlocked(const Node& node) {
  if (node.locked) {
    throw LockedError("Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
                      "method and make sure the key is present.");
  }
}
void check_node_unlocked(const TensorDict& td) { check_node_unlocked(node_of(td, "is_locked")); }
}  // namespace detail
using detail::check_node_unlocked;

// ============================================================================ construction
static TensorDictImpl* as_dense(const std::shared_ptr<Node>& node) { return node ? node->dense_node() : nullptr; }

TensorDict::TensorDict(std::shared_ptr<Node> node) : node_(std::move(node)) {
  if (node_ && node_->typed_parts().first) std::tie(node_, typed_) = detail::unwrap_typed_node(node_);
  dense_ = as_dense(node_);
}

TensorDict TensorDict::with_schema(std::shared_ptr<const TypedSchema> schema) const {
  TensorDict out = *this;
  out.typed_ = std::move(schema);
  return out;
}

std::shared_ptr<Node> TensorDict::node_with_schema() const { return detail::make_typed_node(node_, typed_); }
TensorDict::TensorDict(std::shared_ptr<TensorDictImpl> impl) : node_(std::move(impl)), dense_(as_dense(node_)) {}

std::shared_ptr<TensorDictImpl> detail::impl_of(const TensorDict& td) {
  const std::shared_ptr<Node>& n = td.node();
  if (n) {
    if (TensorDictImpl* dense = n->dense_node()) return std::shared_ptr<TensorDictImpl>(n, dense);
    if (auto view = n->dense_view()) return view;
    throw NotImplementedError("this operation is not supported on a " + n->type_name() +
                              " (dense TensorDicts only); densify it first with contiguous()");
  }
  throw ValueError("this operation on an undefined TensorDict");
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

//! from_dict's batch inference (upstream's auto_batch_size) as one structure walk: every sub-TensorDict,
//! deepest first, gets the longest batch its entries share; the root's is returned
struct AutoBatch : detail::tree::StructureVisitor {
  std::vector<std::vector<BatchSize>> shapes{1};  //!< the shapes of each open level's entries
  detail::tree::Step visit(const detail::tree::KeyPath&, const detail::tree::Item& item) {
    if (!item.is_tensordict()) {
      shapes.back().push_back(item.shape());
      return detail::tree::Step::Next;
    }
    shapes.emplace_back();
    return detail::tree::Step::Enter;
  }
  void after(const detail::tree::KeyPath&, const detail::tree::Item& item) {
    if (!item.is_tensordict()) return;
    BatchSize bs = common_prefix(shapes.back());
    shapes.pop_back();
    item.sub().set_batch_size(bs);
    shapes.back().push_back(std::move(bs));
  }
};

static void auto_batch(TensorDict& td, std::optional<int64_t> dims) {
  AutoBatch v;
  detail::tree::visit(td, v);
  BatchSize bs = common_prefix(v.shapes.back());
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
Node& node_of(const std::shared_ptr<Node>& node, const char* what) {
  if (!node) throw ValueError(std::string(what) + " of an undefined TensorDict");
  return *node;
}
Node& detail::node_of(const TensorDict& td, const char* what) { return tensordict::node_of(td.node(), what); }
const BatchSize& TensorDict::batch_size() const { return node_of(node_, "batch_size").batch_size; }
int64_t TensorDict::batch_dims() const { return static_cast<int64_t>(batch_size().size()); }
int64_t TensorDict::numel() const { return detail::prod(batch_size()); }
int64_t TensorDict::size(int64_t dim) const { return batch_size()[detail::normalize_dim(dim, batch_dims())]; }
std::optional<at::Device> TensorDict::device() const { return node_of(node_, "device").device; }
int64_t TensorDict::len() const { return batch_size().empty() ? 0 : batch_size()[0]; }
bool TensorDict::is_locked() const { return node_of(node_, "is_locked").locked; }
bool TensorDict::is_memmap() const { return dense_ ? dense_->is_memmap : node_of(node_, "is_memmap").caps().memmap; }
bool TensorDict::is_shared() const { return dense_ ? dense_->is_shared : node_of(node_, "is_shared").caps().shared; }

int64_t TensorDict::bytes() const { return node_of(node_, "bytes").bytes(*this); }

int64_t TensorDictImpl::bytes(const TensorDict&) const {
  int64_t n = 0;
  detail::tree::for_each_leaf(
      *this,
      [&](const detail::tree::KeyPath&, const Entry& e) {
        if (e.is_tensor()) n += e.tensor().numel() * static_cast<int64_t>(e.tensor().element_size());
      },
      [&](const detail::tree::KeyPath&, const TensorDict& sub) { n += sub.bytes(); },  // its own form
      detail::tree::Descend::DenseOnly);
  return n;
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
  node_of(node_, "set_batch_size").set_batch_size(*this, std::move(batch_size));
}

void TensorDictImpl::set_batch_size(TensorDict&, BatchSize new_batch_size) {
  check_batch_size(*this, new_batch_size);
  // NonTensorData follows the batch size of its parent (it is broadcast) unless its own batch size already
  // starts with the new one (upstream _batch_size_setter: a child keeps its batch size, extra trailing dims
  // included, unless it is shorter than the new batch size)
  for (auto& kv : entries) {
    if (kv.second.is_non_tensor_data()) {
      const BatchSize& own = kv.second.non_tensor_data().batch_size();
      if (own.size() >= new_batch_size.size() && std::equal(new_batch_size.begin(), new_batch_size.end(), own.begin())) continue;
      kv.second = Entry(NonTensorData(kv.second.non_tensor_data().value(), new_batch_size));
    }
  }
  batch_size = std::move(new_batch_size);
}

}  // namespace tensordict
