// A storage spec carries its view: the "index" field (encoding, checks, applying it after the open), the
// origin a view of a memmap / shared TensorDict keeps, and the dense node's own spec (storage_spec.hpp).
#include <ATen/ATen.h>

#include "spec_internal.hpp"
#include "tensor_dict_internal.hpp"
#include "tensordict/resolved_index.hpp"
#include "tensordict/shared_storage.hpp"

namespace tensordict {
namespace detail {

namespace {

using at::indexing::Slice;

[[noreturn]] void bad_index(const std::string& why) {
  throw ValueError("storage spec: malformed \"index\": " + why +
                   " (a list with one element per batch dim: an int, {\"start\", \"stop\", \"step\"} or a list of "
                   "ints; or {\"shape\": [...], \"coords\": [[...], ...]})");
}

int64_t int_of(const JsonValue& v, const std::string& what) {
  if (!v.is_int()) bad_index(what + " is a " + JsonValue::kind_name(v.kind()) + ", not an int");
  return v.as_int();
}

std::vector<int64_t> ints_of(const JsonValue& v, const std::string& what) {
  if (!v.is_array()) bad_index(what + " is a " + std::string(JsonValue::kind_name(v.kind())) + ", not a list");
  std::vector<int64_t> out;
  out.reserve(v.as_array().size());
  for (const auto& e : v.as_array()) out.push_back(int_of(e, what + " element"));
  return out;
}

at::Tensor long_tensor(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
}

//! the steps td.index() takes for an "index" field, in order (each validated)
std::vector<Index> steps_of(const JsonValue& field) {
  std::vector<Index> steps;
  if (field.is_array()) {
    Index basic;
    bool any = false;
    std::vector<std::pair<int64_t, at::Tensor>> lists;  // (result dim, rows)
    int64_t kept = 0;
    size_t d = 0;
    for (const auto& e : field.as_array()) {
      const std::string what = "element " + std::to_string(d++);
      if (e.is_int()) {
        basic.emplace_back(e.as_int());
        any = true;
      } else if (e.is_object()) {
        for (const auto& kv : e.as_object()) {
          if (kv.first != "start" && kv.first != "stop" && kv.first != "step") bad_index(what + " has a field \"" + kv.first + "\"");
        }
        const JsonValue* a = e.find("start");
        const JsonValue* b = e.find("stop");
        const JsonValue* s = e.find("step");
        if (!a || !b) bad_index(what + " (a slice) needs \"start\" and \"stop\"");
        const int64_t step = s ? int_of(*s, what + " step") : 1;
        if (step <= 0) bad_index(what + " has step " + std::to_string(step) + " (it must be positive)");
        basic.emplace_back(Slice(int_of(*a, what + " start"), int_of(*b, what + " stop"), step));
        ++kept;
        any = true;
      } else if (e.is_array()) {
        lists.emplace_back(kept++, long_tensor(ints_of(e, what)));
        basic.emplace_back(Slice());
      } else {
        bad_index(what + " is a " + std::string(JsonValue::kind_name(e.kind())));
      }
    }
    if (any) steps.push_back(std::move(basic));
    // each list on its own dim (orthogonal): torch zips index tensors given together
    for (auto& l : lists) {
      Index step(static_cast<size_t>(l.first), Slice());
      step.emplace_back(std::move(l.second));
      steps.push_back(std::move(step));
    }
    return steps;
  }
  if (!field.is_object()) bad_index("it is a " + std::string(JsonValue::kind_name(field.kind())));
  for (const auto& kv : field.as_object()) {
    if (kv.first != "shape" && kv.first != "coords") bad_index("it has a field \"" + kv.first + "\"");
  }
  const JsonValue* shape_v = field.find("shape");
  const JsonValue* coords_v = field.find("coords");
  if (!shape_v || !coords_v) bad_index("the joint form needs \"shape\" and \"coords\"");
  const std::vector<int64_t> shape = ints_of(*shape_v, "\"shape\"");
  int64_t n = 1;
  for (auto s : shape) {
    if (s < 0) bad_index("\"shape\" has a negative size");
    n *= s;
  }
  if (!coords_v->is_array() || coords_v->as_array().empty()) bad_index("\"coords\" must be a non-empty list of lists");
  Index step;
  for (const auto& c : coords_v->as_array()) {
    std::vector<int64_t> v = ints_of(c, "a \"coords\" list");
    if (static_cast<int64_t>(v.size()) != n) {
      bad_index("a \"coords\" list has " + std::to_string(v.size()) + " elements for a shape of " + std::to_string(n));
    }
    step.emplace_back(long_tensor(v).view(shape));
  }
  steps.push_back(std::move(step));
  return steps;
}

JsonValue ints_json(const at::Tensor& t) {
  at::Tensor c = t.reshape({-1}).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  JsonValue::Array a;
  a.reserve(static_cast<size_t>(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) a.emplace_back(p[i]);
  return JsonValue::array(std::move(a));
}

JsonValue slice_json(int64_t start, int64_t stop, int64_t step) {
  return JsonValue::object({{"start", JsonValue(start)}, {"stop", JsonValue(stop)}, {"step", JsonValue(step)}});
}

//! a dim's selected coordinates: a slice when they are an increasing arithmetic run, else the list
JsonValue dim_json(const at::Tensor& vals) {
  const int64_t n = vals.numel();
  at::Tensor c = vals.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  if (n == 1) return slice_json(p[0], p[0] + 1, 1);
  const int64_t step = p[1] - p[0];
  bool run = step > 0;
  for (int64_t i = 2; run && i < n; ++i) run = p[i] - p[i - 1] == step;
  if (run) return slice_json(p[0], p[n - 1] + 1, step);
  return ints_json(c);
}

//! the per-dim (orthogonal) form of a selection, or null when it has none: every source dim is either one
//! coordinate (an int) or varies along exactly one result dim, in order
JsonValue orthogonal_json(const BatchSize& src, const std::vector<at::Tensor>& coords, at::IntArrayRef res) {
  const size_t n = src.size(), m = res.size();
  JsonValue::Array items;
  size_t j = 0;
  for (size_t d = 0; d < n; ++d) {
    const at::Tensor& c = coords[d];
    if (m - j > n - d) return JsonValue();  // more result dims than source dims left (None)
    const int64_t first = c.reshape({-1})[0].item<int64_t>();
    const bool constant = at::equal(c, at::full_like(c, first));
    if (constant && n - d > m - j) {  // a dim to drop, and dims enough left for the result's
      items.emplace_back(first);
      continue;
    }
    if (j >= m) return JsonValue();
    at::Tensor vals = c;
    for (size_t k = m; k-- > 0;)
      if (k != j) vals = vals.select(static_cast<int64_t>(k), 0);
    std::vector<int64_t> along(m, 1);
    along[j] = res[j];
    if (!at::equal(c, vals.reshape(along).expand(res))) return JsonValue();
    items.push_back(dim_json(vals));
    ++j;
  }
  if (j != m) return JsonValue();
  // trailing whole dims are implied
  while (!items.empty() && items.back().is_object()) {
    const JsonValue& s = items.back();
    const size_t d = items.size() - 1;
    if (s.find("start")->as_int() != 0 || s.find("stop")->as_int() != src[d] || s.find("step")->as_int() != 1) break;
    items.pop_back();
  }
  return JsonValue::array(std::move(items));
}

}  // namespace

JsonValue index_field(const ResolvedIndex& index) {
  const BatchSize& src = index.source_batch();
  const at::Tensor& pos = index.positions();
  const at::IntArrayRef res = index.result_sizes();
  const int64_t total = detail::prod(src);
  if (res.equals(at::IntArrayRef(src)) && at::equal(pos.reshape({-1}), at::arange(total, at::kLong))) return JsonValue();
  if (src.empty()) {
    throw ValueError("a storage spec cannot carry a selection " + detail::shape_list(res.vec()) +
                     " of a TensorDict without batch dims");
  }
  // the coordinate along each source dim of every result element
  std::vector<at::Tensor> coords;
  int64_t stride = total;
  for (size_t d = 0; d < src.size(); ++d) {
    stride = src[d] ? stride / src[d] : 0;
    coords.push_back(stride ? at::remainder(at::div(pos, stride, "trunc"), src[d]) : at::zeros_like(pos));
  }
  if (pos.numel() > 0) {
    JsonValue o = orthogonal_json(src, coords, res);
    if (!o.is_null()) return o;
  }
  JsonValue::Array shape;
  for (auto s : res) shape.emplace_back(s);
  JsonValue::Array cs;
  for (const auto& c : coords) cs.push_back(ints_json(c));
  return JsonValue::object({{"shape", JsonValue::array(std::move(shape))}, {"coords", JsonValue::array(std::move(cs))}});
}

TensorDict apply_index_field(const TensorDict& td, const JsonValue& field) {
  TensorDict out = td;
  for (const Index& step : steps_of(field)) out = out.index(step);
  return out;
}

void check_spec_fields(const std::string& driver, const JsonValue& json) {
  if (const JsonValue* index = json.find("index")) (void)steps_of(*index);
  if (driver == "stack") check_stack_fields(json);
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool is_storage_view(const TensorDict& td) {
  const TensorDictImpl* n = td.defined() && td.node() ? td.node()->dense_node() : nullptr;
  return n && n->origin;
}

void carry_view_origin(const TensorDictImpl& src, const Index& index, const TensorDict& out) {
  if (!src.origin && !(src.is_memmap && !src.memmap_prefix.empty()) && !src.is_shared) return;
  TensorDictImpl* o = out.defined() && out.node() ? out.node()->dense_node() : nullptr;
  if (!o || o == &src) return;
  auto v = std::make_shared<ViewOrigin>();
  if (src.origin) {
    v->parent = src.origin;
  } else {
    v->root = std::static_pointer_cast<const TensorDictImpl>(src.shared_from_this());
    v->root_batch = src.batch_size;
  }
  // index tensors copied: a caller writing into its index tensor later does not move the view's spec
  v->index.reserve(index.size());
  for (const auto& e : index) v->index.push_back(e.is_tensor() ? at::indexing::TensorIndex(e.tensor().clone()) : e);
  o->origin = std::move(v);
}

}  // namespace detail

namespace {

//! the spec of a whole memmap (saved to a directory) or shared dense node; "" for any other
std::string whole_spec(const TensorDictImpl& n) {
  if (n.is_memmap && !n.memmap_prefix.empty()) {
    return StorageSpec("memmap", JsonValue::object({{"path", JsonValue(n.memmap_prefix)}})).dump();
  }
  if (n.is_shared) {
    TensorDict h(std::const_pointer_cast<Node>(n.shared_from_this()));
    return StorageSpec("shared", JsonValue::object({{"handle", JsonValue(detail::to_hex(share_handle(h)))}})).dump();
  }
  return "";
}

}  // namespace

std::string TensorDictImpl::storage_spec() const {
  if (!origin) return whole_spec(*this);
  std::vector<const detail::ViewOrigin*> chain;
  for (const detail::ViewOrigin* o = origin.get(); o; o = o->parent.get()) chain.push_back(o);
  const detail::ViewOrigin& base = *chain.back();
  const std::string root = whole_spec(*base.root);
  if (root.empty()) return "";
  ResolvedIndex r = ResolvedIndex::identity(base.root_batch);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) r = r.compose((*it)->index);
  return StorageSpec::parse(root).with_index(r).dump();
}

StorageSpec StorageSpec::with_index(const ResolvedIndex& index) const {
  if (has_index()) {
    throw ValueError("storage spec '" + driver_ + "': it already carries an \"index\" (compose the selections first)");
  }
  JsonValue field = detail::index_field(index);
  JsonValue json = json_;
  if (!field.is_null()) json.as_object().emplace_back("index", std::move(field));
  return StorageSpec(driver_, std::move(json));
}

TensorDict StorageSpec::apply_index(const TensorDict& td) const {
  const JsonValue* field = json_.find("index");
  return field ? detail::apply_index_field(td, *field) : td;
}

}  // namespace tensordict
