// Free functions: dense stack and cat of TensorDicts (with out= written in place), zeros_like / ones_like /
// empty_like. Inputs are fully validated before anything is allocated or written, so a failed call leaves
// `out` untouched.
#include <algorithm>
#include <string>

#include <c10/core/ScalarType.h>

#include "tensor_dict_internal.hpp"
#include "tensordict/lazy_stack.hpp"
#include "torch_errors.hpp"
#include "tree_visitor.hpp"

namespace tensordict {

using detail::shape_list;
using detail::shape_str;

namespace {

std::string key_list(const TensorDictImpl& impl) {
  std::string s = "[";
  for (size_t i = 0; i < impl.entries.size(); ++i) s += (i ? ", '" : "'") + impl.entries[i].first + "'";
  return s + "]";
}

enum class Cat { Tensor, TensorDict, NonTensor };
Cat category(const Entry& e) {
  if (e.is_tensor()) return Cat::Tensor;
  if (e.is_tensordict()) return Cat::TensorDict;
  return Cat::NonTensor;
}

//! shared logic of stack (insert a new dim) and cat (concatenate along an existing dim)
struct Combiner {
  bool is_stack;
  int64_t dim;  //!< normalised
  size_t n;     //!< number of inputs
  const char* name() const { return is_stack ? "stack" : "cat"; }

  //! shape of the combination of shapes that passed check_shapes
  BatchSize result_shape(const std::vector<BatchSize>& shapes) const {
    BatchSize r = shapes.front();
    if (is_stack) {
      r.insert(r.begin() + dim, static_cast<int64_t>(n));
    } else {
      int64_t total = 0;
      for (const auto& s : shapes) total += s[static_cast<size_t>(dim)];
      r[static_cast<size_t>(dim)] = total;
    }
    return r;
  }

  //! stack: identical shapes; cat: same rank, equal except along dim. Returns the index of the first
  //! offending shape (0 when all fit)
  size_t mismatch(const std::vector<BatchSize>& shapes) const {
    for (size_t i = 1; i < shapes.size(); ++i) {
      if (is_stack) {
        if (shapes[i] != shapes[0]) return i;
      } else {
        if (shapes[i].size() != shapes[0].size()) return i;
        for (size_t j = 0; j < shapes[0].size(); ++j)
          if (static_cast<int64_t>(j) != dim && shapes[i][j] != shapes[0][j]) return i;
      }
    }
    return 0;
  }

  // ------------------------------------------------------------------ validation (nothing written)
  void check_batch(const std::vector<TensorDict>& tds, const NestedKey& at) const {
    std::vector<BatchSize> shapes;
    shapes.reserve(tds.size());
    for (const auto& td : tds) shapes.push_back(td.batch_size());
    size_t bad = mismatch(shapes);
    if (bad == 0) return;
    std::string where = at.empty() ? "" : " (sub-TensorDict " + at.repr() + ")";
    if (is_stack) {
      throw BatchSizeError("stacking tensordicts requires them to have congruent batch sizes, got td1.batch_size=" +
                           shape_str(shapes[bad]) + " and td2.batch_size=" + shape_str(shapes[0]) + where);
    }
    throw BatchSizeError("cat along batch dim " + std::to_string(dim) +
                         " requires the other batch dims to match, got td1.batch_size=" + shape_str(shapes[bad]) +
                         " and td2.batch_size=" + shape_str(shapes[0]) + where);
  }

  void check_keys(const std::vector<TensorDict>& tds, const NestedKey& at) const {
    const TensorDictImpl& first = *detail::impl_of(tds[0]);
    for (size_t i = 1; i < tds.size(); ++i) {
      const TensorDictImpl& other = *detail::impl_of(tds[i]);
      bool same = other.entries.size() == first.entries.size();
      for (size_t j = 0; same && j < first.entries.size(); ++j) same = other.find(first.entries[j].first) != nullptr;
      if (same) continue;
      std::string where = at.empty() ? "" : " in sub-TensorDict " + at.repr();
      if (is_stack) {
        throw RuntimeError("The sets of keys in the tensordicts to stack are exclusive: tensordict 0 has keys " +
                           key_list(first) + " and tensordict " + std::to_string(i) + " has keys " + key_list(other) +
                           where + ". Dense stacking needs identical key sets.");
      }
      throw KeyError("cat: got keys " + key_list(first) + " and " + key_list(other) + where +
                     " which are incompatible (cat needs identical key sets)");
    }
  }

  //! the entries of every input at one key (the first input's, then the others' from a parallel walk),
  //! checked for kind and shape
  std::vector<Entry> gather(const Entry& first, const detail::tree::Matched& rest, const NestedKey& full) const {
    std::vector<Entry> es = entries(first, rest);
    Cat c = category(es[0]);
    for (size_t i = 1; i < es.size(); ++i) {
      if (category(es[i]) != c) {
        throw TypeError(std::string(name()) + ": key " + full.repr() + " holds a " + Entry::kind_name(es[0].kind()) +
                        " in tensordict 0 but a " + Entry::kind_name(es[i].kind()) + " in tensordict " +
                        std::to_string(i));
      }
    }
    if (c == Cat::TensorDict) return es;  // checked recursively
    std::vector<BatchSize> shapes;
    shapes.reserve(es.size());
    for (const auto& e : es) shapes.push_back(e.shape());
    size_t bad = mismatch(shapes);
    if (bad != 0) {
      if (is_stack) {
        throw RuntimeError("The shapes of the tensors to stack is incompatible: " + shape_str(shapes[0]) + " vs " +
                           shape_str(shapes[bad]) + " for key " + full.repr() + ".");
      }
      throw RuntimeError("cat along dim " + std::to_string(dim) + ": the shapes at key " + full.repr() +
                         " are incompatible: " + shape_str(shapes[0]) + " vs " + shape_str(shapes[bad]) +
                         " (all dims but " + std::to_string(dim) + " must match)");
    }
    return es;
  }

  //! the entries of every input at one key: the first input's and the others' (all present)
  static std::vector<Entry> entries(const Entry& first, const detail::tree::Matched& rest) {
    std::vector<Entry> es;
    es.reserve(rest.size() + 1);
    es.push_back(first);
    for (const Entry* e : rest) es.push_back(*e);
    return es;
  }
  //! the levels of tds[1..] (and of `out`), what the tree visitor walks in parallel with tds[0]
  static std::vector<const TensorDictImpl*> other_levels(const std::vector<TensorDict>& tds,
                                                         const TensorDictImpl* out = nullptr) {
    std::vector<const TensorDictImpl*> levels;
    levels.reserve(tds.size());
    for (size_t i = 1; i < tds.size(); ++i) levels.push_back(detail::impl_of(tds[i]).get());
    if (out) levels.push_back(out);
    return levels;
  }

  //! every level: same batch sizes (as the op needs them), same key sets, entries of one kind and of fitting
  //! shapes; nothing is written
  void validate(const std::vector<TensorDict>& tds) const {
    struct Visitor : detail::tree::WalkVisitor {
      const Combiner& c;
      explicit Visitor(const Combiner& comb) : c(comb) {}
      detail::tree::Step visit(const detail::tree::KeyPath& at, const Entry& e, const detail::tree::Matched& m) {
        const NestedKey full = at.full();
        std::vector<Entry> es = c.gather(e, m, full);
        if (!es[0].is_tensordict()) return detail::tree::Step::Next;
        const std::vector<TensorDict> kids = children(es);
        c.check_batch(kids, full);
        c.check_keys(kids, full);
        return detail::tree::Step::Enter;
      }
      const TensorDictImpl* level(const TensorDict& sub) { return detail::impl_of(sub).get(); }
    } v(*this);
    check_batch(tds, NestedKey());
    check_keys(tds, NestedKey());
    detail::tree::walk(*detail::impl_of(tds[0]), other_levels(tds), v);
  }

  static std::vector<TensorDict> children(const std::vector<Entry>& es) {
    std::vector<TensorDict> out;
    out.reserve(es.size());
    for (const auto& e : es) out.push_back(e.tensordict());
    return out;
  }

  //! `out`'s level against the batch size of the result of `tds`' levels (handles: checked before `out`'s level
  //! is read, whatever its node kind)
  void check_out_batch(const std::vector<TensorDict>& tds, const TensorDict& out, const NestedKey& at) const {
    std::vector<BatchSize> bss;
    for (const auto& td : tds) bss.push_back(td.batch_size());
    BatchSize want = result_shape(bss);
    if (out.batch_size() != want) {
      std::string where = at.empty() ? "" : " (sub-TensorDict " + at.repr() + ")";
      throw BatchSizeError(std::string("out.batch_size and ") + (is_stack ? "stacked" : "cat") +
                           " batch size must match, got out.batch_size=" + shape_str(out.batch_size()) +
                           " and batch_size=" + shape_str(want) + where);
    }
  }

  //! checks that `out` can receive the result: same batch, every key present with the right kind and shape
  void validate_out(const std::vector<TensorDict>& tds, const TensorDict& out) const {
    struct Visitor : detail::tree::WalkVisitor {
      const Combiner& c;
      std::vector<const TensorDictImpl*> outs;  //!< out's levels being walked (innermost last)
      explicit Visitor(const Combiner& comb) : c(comb) {}
      void enter(const detail::tree::KeyPath&, const TensorDictImpl&, const std::vector<const TensorDictImpl*>& o) {
        outs.push_back(o.back());
      }
      void leave(const detail::tree::KeyPath&) { outs.pop_back(); }
      detail::tree::Step visit(const detail::tree::KeyPath& at, const Entry& e, const detail::tree::Matched& m) {
        const NestedKey full = at.full();
        const Entry* dest = m.back();
        if (!dest) {
          throw KeyError(std::string(c.name()) + "(out=...): key " + full.repr() +
                         " of the inputs is missing in out (out has keys " + key_list(*outs.back()) + ")");
        }
        const detail::tree::Matched rest(m.begin(), m.end() - 1);
        std::vector<Entry> es = entries(e, rest);
        if (category(*dest) != category(es[0])) {
          throw TypeError(std::string(c.name()) + "(out=...): key " + full.repr() + " is a " +
                          Entry::kind_name(es[0].kind()) + " in the inputs but a " + Entry::kind_name(dest->kind()) +
                          " in out");
        }
        if (es[0].is_tensordict()) {
          c.check_out_batch(children(es), dest->tensordict(), full);
          return detail::tree::Step::Enter;
        }
        if (es[0].is_tensor()) {
          std::vector<BatchSize> shapes;
          c10::ScalarType promoted = es[0].tensor().scalar_type();
          for (const auto& x : es) {
            shapes.push_back(x.shape());
            promoted = c10::promoteTypes(promoted, x.tensor().scalar_type());
          }
          BatchSize ws = c.result_shape(shapes);
          const at::Tensor& d = dest->tensor();
          if (!d.sizes().equals(ws)) {
            throw BatchSizeError(std::string(c.name()) + "(out=...): out[" + full.repr() + "] has shape " +
                                 shape_str(d.sizes()) + " but the result has shape " + shape_str(ws));
          }
          if (!c10::canCast(promoted, d.scalar_type())) {
            throw TypeError(std::string(c.name()) + "(out=...): cannot write values of dtype " +
                            c10::toString(promoted) + " into out[" + full.repr() + "] of dtype " +
                            c10::toString(d.scalar_type()));
          }
        }
        return detail::tree::Step::Next;
      }
      const TensorDictImpl* level(const TensorDict& sub) { return detail::impl_of(sub).get(); }
    } v(*this);
    check_out_batch(tds, out, NestedKey());
    const std::vector<const TensorDictImpl*> others = other_levels(tds, detail::impl_of(out).get());
    detail::tree::walk(*detail::impl_of(tds[0]), others, v);
  }

  // ------------------------------------------------------------------ fast path (no out)
  //! the dense node behind a node handle (a store: its snapshot, kept alive by the node)
  static const TensorDictImpl* dense_of(const std::shared_ptr<Node>& n) {
    if (!n) return nullptr;
    if (const TensorDictImpl* d = n->dense_node()) return d;
    return n->dense_view().get();
  }

  //! leaf shapes fit (stack: equal; cat: equal but along dim)
  bool fits(at::IntArrayRef a, at::IntArrayRef b) const {
    if (is_stack) return a.equals(b);
    if (a.size() != b.size()) return false;
    for (size_t j = 0; j < a.size(); ++j)
      if (static_cast<int64_t>(j) != dim && a[j] != b[j]) return false;
    return true;
  }

  //! validates and builds in one walk over raw nodes, matching keys by position (inputs built the same way
  //! list their keys in the same order). false at the first thing out of the ordinary (a key order that
  //! differs, any mismatch, a torch failure): the caller then takes the checked path, which reports errors.
  bool fast_build(const std::vector<const TensorDictImpl*>& ims, TensorDict* result_out) const {
    const TensorDictImpl& f = *ims[0];
    for (size_t i = 1; i < ims.size(); ++i) {
      if (!ims[i] || !fits(ims[i]->batch_size, f.batch_size) || ims[i]->entries.size() != f.entries.size()) {
        return false;
      }
    }
    BatchSize rs = f.batch_size;
    if (is_stack) {
      rs.insert(rs.begin() + dim, static_cast<int64_t>(ims.size()));
    } else {
      int64_t total = 0;
      for (const auto* im : ims) total += im->batch_size[static_cast<size_t>(dim)];
      rs[static_cast<size_t>(dim)] = total;
    }
    TensorDict result = detail::make_empty(f, rs);
    TensorDictImpl& r = *static_cast<TensorDictImpl*>(result.node().get());
    r.entries.reserve(f.entries.size());
    std::vector<at::Tensor> ts(ims.size());
    for (size_t j = 0; j < f.entries.size(); ++j) {
      const std::string& key = f.entries[j].first;
      const Entry& e0 = f.entries[j].second;
      const Cat c = category(e0);
      for (size_t i = 1; i < ims.size(); ++i) {
        const auto& kv = ims[i]->entries[j];
        if (kv.first != key || category(kv.second) != c) return false;
      }
      if (c == Cat::Tensor) {
        for (size_t i = 0; i < ims.size(); ++i) {
          const at::Tensor& t = ims[i]->entries[j].second.tensor();
          if (i && !fits(t.sizes(), ts[0].sizes())) return false;
          ts[i] = t;
        }
        try {
          r.entries.emplace_back(key, Entry(is_stack ? at::stack(ts, dim) : at::cat(ts, dim)));
        } catch (const c10::Error&) {
          return false;
        }
      } else if (c == Cat::TensorDict) {
        std::vector<const TensorDictImpl*> sub(ims.size());
        for (size_t i = 0; i < ims.size(); ++i) {
          sub[i] = dense_of(ims[i]->entries[j].second.tensordict().node());
          if (!sub[i]) return false;
        }
        TensorDict child;
        if (!fast_build(sub, &child)) return false;
        r.entries.emplace_back(key, Entry(child));
      } else {
        std::vector<Entry> es;
        es.reserve(ims.size());
        for (size_t i = 0; i < ims.size(); ++i) {
          es.push_back(ims[i]->entries[j].second);
          if (i && !fits(es[i].shape(), es[0].shape())) return false;
        }
        r.entries.emplace_back(key, Entry(combine_non_tensor(es)));
      }
    }
    *result_out = std::move(result);
    return true;
  }

  // ------------------------------------------------------------------ building
  NonTensorStack combine_non_tensor(const std::vector<Entry>& es) const {
    std::vector<at::Tensor> pos;
    std::vector<JsonValue> all;
    int64_t offset = 0;
    for (const auto& e : es) {
      NonTensorStack s = e.is_non_tensor_data()
                             ? NonTensorStack::filled(e.non_tensor_data().value(), e.non_tensor_data().batch_size())
                             : e.non_tensor_stack();
      pos.push_back(s.positions() + offset);
      all.insert(all.end(), s.values().begin(), s.values().end());
      offset += s.numel();
    }
    at::Tensor p = (is_stack ? at::stack(pos, dim) : at::cat(pos, dim)).contiguous();
    std::vector<JsonValue> vals;
    vals.reserve(static_cast<size_t>(p.numel()));
    const int64_t* pp = p.data_ptr<int64_t>();
    for (int64_t i = 0; i < p.numel(); ++i) vals.push_back(all[static_cast<size_t>(pp[i])]);
    return NonTensorStack(std::move(vals), BatchSize(p.sizes().begin(), p.sizes().end()));
  }

  at::Tensor combine_tensors(const std::vector<Entry>& es, const NestedKey& full, at::Tensor* out) const {
    std::vector<at::Tensor> ts;
    ts.reserve(es.size());
    for (const auto& e : es) ts.push_back(e.tensor());
    try {
      if (out) {
        if (is_stack) return at::stack_out(*out, ts, dim);
        return at::cat_out(*out, ts, dim);
      }
      return is_stack ? at::stack(ts, dim) : at::cat(ts, dim);
    } catch (const c10::Error& err) {
      throw RuntimeError(std::string(name()) + ": failed at key " + full.repr() + ": " +
                         detail::torch_message(err, detail::TorchText::FirstLine));
    }
  }

  //! the result, built by the tree visitor's parallel rebuild (inputs validated)
  TensorDict build(const std::vector<TensorDict>& tds) const {
    struct Visitor : detail::tree::RebuildVisitor {
      const Combiner& c;
      std::vector<std::vector<const TensorDictImpl*>> levels;  //!< the other inputs' levels (innermost last)
      explicit Visitor(const Combiner& comb) : c(comb) {}
      void enter(const detail::tree::KeyPath&, const TensorDictImpl&, const std::vector<const TensorDictImpl*>& o) {
        levels.push_back(o);
      }
      void leave(const detail::tree::KeyPath&) { levels.pop_back(); }
      TensorDict make_level(const detail::tree::KeyPath&, const TensorDictImpl& src, BatchSize) {
        std::vector<BatchSize> bss{src.batch_size};
        for (const TensorDictImpl* o : levels.back()) bss.push_back(o->batch_size);
        return detail::make_empty(src, c.result_shape(bss));
      }
      at::Tensor tensor(const detail::tree::KeyPath& at, const at::Tensor& t, const detail::tree::Matched& m) {
        return c.combine_tensors(entries(Entry(t), m), at.full(), nullptr);
      }
      std::optional<Entry> non_tensor(const detail::tree::KeyPath&, const Entry& e, const TensorDictImpl&,
                                      const BatchSize&, const detail::tree::Matched& m) {
        return Entry(c.combine_non_tensor(entries(e, m)));
      }
      const TensorDictImpl* descend(const detail::tree::KeyPath&, const TensorDict& sub, const detail::tree::Matched&) {
        return detail::impl_of(sub).get();
      }
      std::vector<const TensorDictImpl*> descend_others(const detail::tree::KeyPath&, const TensorDictImpl&,
                                                        const detail::tree::Matched& m) {
        std::vector<const TensorDictImpl*> out;
        out.reserve(m.size());
        for (const Entry* e : m) out.push_back(detail::impl_of(e->tensordict()).get());
        return out;
      }
    } v(*this);
    const TensorDictImpl& first = *detail::impl_of(tds[0]);
    return detail::tree::rebuild(first, first.batch_size, v, other_levels(tds));
  }

  //! the result written into `out`'s leaves (inputs and out validated); non-tensor entries are replaced
  void write(const std::vector<TensorDict>& tds, const TensorDict& out) const {
    struct Visitor : detail::tree::WalkVisitor {
      const Combiner& c;
      explicit Visitor(const Combiner& comb) : c(comb) {}
      detail::tree::Step visit(const detail::tree::KeyPath& at, const Entry& e, const detail::tree::Matched& m) {
        // out's entry: out is the destination, written through the walk (its levels are mutable)
        Entry* dest = const_cast<Entry*>(m.back());
        const detail::tree::Matched rest(m.begin(), m.end() - 1);
        switch (category(e)) {
          case Cat::Tensor: {
            at::Tensor d = dest->tensor();
            c.combine_tensors(entries(e, rest), at.full(), &d);
            return detail::tree::Step::Next;
          }
          case Cat::TensorDict:
            return detail::tree::Step::Enter;
          case Cat::NonTensor:
            // non-tensors have no storage to write into: the entry is replaced (like an indexed write of a
            // non-tensor, this is allowed on a locked out)
            *dest = Entry(c.combine_non_tensor(entries(e, rest)));
            return detail::tree::Step::Next;
        }
        return detail::tree::Step::Next;
      }
      const TensorDictImpl* level(const TensorDict& sub) { return detail::impl_of(sub).get(); }
    } v(*this);
    detail::tree::walk(*detail::impl_of(tds[0]), other_levels(tds, detail::impl_of(out).get()), v);
  }
};

void check_inputs(const char* op, const std::vector<TensorDict>& tds) {
  if (tds.empty()) {
    throw RuntimeError(std::string(op) + ": expected a non-empty list of TensorDicts, got an empty list");
  }
  for (size_t i = 0; i < tds.size(); ++i) {
    if (!tds[i].defined()) {
      throw ValueError(std::string(op) + ": the TensorDict at position " + std::to_string(i) + " is undefined");
    }
  }
}

//! dim in [-n, n) -> [0, n) (n = batch dims, + 1 for stack); IndexError otherwise (stack, as torch.stack),
//! RuntimeError for cat (upstream)
int64_t norm_dim(const char* op, int64_t dim, const BatchSize& bs, int64_t n, ErrorCode code = ErrorCode::Index) {
  if (dim < -n || dim >= n) {
    throw_error(code, std::string(op) + ": dimension out of range (expected to be in range of [" + std::to_string(-n) +
                     ", " + std::to_string(n - 1) + "] for TensorDicts with batch_size " + shape_str(bs) +
                     ", but got " + std::to_string(dim) + ")");
  }
  return dim < 0 ? dim + n : dim;
}

TensorDict run(const Combiner& c, const std::vector<TensorDict>& tds, const std::optional<TensorDict>& out) {
  if (!out) {
    std::vector<const TensorDictImpl*> ims;
    ims.reserve(tds.size());
    for (const auto& td : tds) ims.push_back(Combiner::dense_of(td.node()));
    TensorDict r;
    if (ims[0] && c.fast_build(ims, &r)) return r;
  }
  c.validate(tds);
  if (!out) return c.build(tds);
  if (!out->defined()) throw ValueError(std::string(c.name()) + ": out is an undefined TensorDict");
  c.validate_out(tds, *out);
  c.write(tds, *out);
  return *out;
}

TensorDict like(const TensorDict& td, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (!td.defined()) throw ValueError("expected a defined TensorDict");
  TensorDict out = detail::map_batch(td, td.batch_size(), fn, /*keep_flags=*/false);
  if (td.is_locked()) out.lock_();
  return out;
}

}  // namespace

namespace {
//! the dense form of every input (other node kinds densified)
std::vector<TensorDict> densified(const std::vector<TensorDict>& tds) {
  std::vector<TensorDict> out;
  out.reserve(tds.size());
  for (const auto& td : tds) out.push_back(td.node()->dense_form(td));
  return out;
}
//! the dense level of an input (its dense node), or null: the tree visitor's question, not a kind test here
const TensorDictImpl* stack_level(const TensorDict& td) { return detail::tree::level_of(td, detail::tree::Descend::DenseOnly); }
//! a dense input holding nodes of another kind below (a lazy stack as a sub-TensorDict): those levels on
//! their dense form, so that the dense stack / cat can walk every level
std::vector<TensorDict> dense_levels(const std::vector<TensorDict>& tds) {
  std::vector<TensorDict> out;
  out.reserve(tds.size());
  for (const auto& td : tds) out.push_back(stack_level(td) && !detail::is_dense_tree(td) ? detail::dense_tree(td) : td);
  return out;
}
bool all_dense(const std::vector<TensorDict>& tds) {
  for (const auto& td : tds)
    if (td.defined() && !stack_level(td)) return false;
  return true;
}
//! the schema every input carries (typed wrappers of one class), or null; `plain` gets the inputs untyped
std::shared_ptr<const TypedSchema> common_schema(const std::vector<TensorDict>& tds, std::vector<TensorDict>& plain) {
  if (tds.empty() || !tds[0].typed_schema()) return nullptr;
  const auto& s = tds[0].typed_schema();
  for (const auto& t : tds)
    if (!t.typed_schema() || t.typed_schema()->name != s->name) return nullptr;
  plain.reserve(tds.size());
  for (const auto& t : tds) plain.push_back(t.with_schema(nullptr));
  return s;
}

}  // namespace

//! upstream _lazy_cat: every input a lazy stack along the same dim. Along the stack dim the result stacks every
//! member; along another dim, member i of the result is the cat of the inputs' members i (same member count).
//! nullopt when the inputs are not all such lazy stacks.
static std::optional<TensorDict> lazy_cat(const std::vector<TensorDict>& tds, int64_t dim) {
  std::vector<LazyStackedTensorDict> ls;
  for (const auto& td : tds) {
    if (!LazyStackedTensorDict::is_lazy_stack(td)) return std::nullopt;
    ls.emplace_back(td);
  }
  const int64_t sd = ls[0].stack_dim();
  const int64_t nd = ls[0].batch_dims();
  for (const auto& l : ls)
    if (l.stack_dim() != sd || l.batch_dims() != nd) return std::nullopt;
  const int64_t d = norm_dim("cat", dim, ls[0].batch_size(), nd, ErrorCode::Runtime);
  std::vector<TensorDict> members;
  if (d == sd) {
    for (const auto& l : ls) members.insert(members.end(), l.tensordicts().begin(), l.tensordicts().end());
    return TensorDict(lazy_stack(members, sd));
  }
  const size_t k = ls[0].size();
  for (const auto& l : ls) {
    if (l.size() != k) {
      throw RuntimeError("cat of lazy stacks along dim " + std::to_string(d) + " (not the stack dim " +
                         std::to_string(sd) + ") needs the same number of members, got " + std::to_string(k) +
                         " and " + std::to_string(l.size()));
    }
  }
  for (size_t i = 0; i < k; ++i) {
    std::vector<TensorDict> parts;
    for (const auto& l : ls) parts.push_back(l.tensordicts()[i]);
    members.push_back(cat(parts, d < sd ? d : d - 1));
  }
  return TensorDict(lazy_stack(members, sd));
}

TensorDict stack(const std::vector<TensorDict>& tds_in, int64_t dim, std::optional<TensorDict> out) {
  {
    std::vector<TensorDict> plain;
    if (auto s = common_schema(tds_in, plain)) return stack(plain, dim, out).with_schema(s);
  }
  check_inputs("stack", tds_in);
  const std::vector<TensorDict> tds = dense_levels(tds_in);
  if (!all_dense(tds)) {
    // lazy inputs stay lazy (a lazy stack of them, as upstream's torch.stack of lazy stacks); with out they
    // are written densely
    if (!out) return lazy_stack(tds, dim);
    return stack(densified(tds), dim, out);
  }
  if (out && !stack_level(*out)) {
    throw NotImplementedError("stack(..., out=...) into a " + out->node()->type_name() +
                              ": lazy stacks cannot be stacked onto. Make it dense first with contiguous()");
  }
  const BatchSize& bs = tds[0].batch_size();
  const int64_t d = norm_dim("stack", dim, bs, static_cast<int64_t>(bs.size()) + 1);
  return run(Combiner{true, d, tds.size()}, tds, out);
}

TensorDict cat(const std::vector<TensorDict>& tds_in, int64_t dim, std::optional<TensorDict> out) {
  {
    std::vector<TensorDict> plain;
    if (auto s = common_schema(tds_in, plain)) return cat(plain, dim, out).with_schema(s);
  }
  check_inputs("cat", tds_in);
  const std::vector<TensorDict> tds = dense_levels(tds_in);
  if (!out) {
    if (auto lazy = lazy_cat(tds, dim)) return *lazy;  // upstream _lazy_cat: lazy stacks stay lazy
  }
  if (!all_dense(tds)) return cat(densified(tds), dim, out);
  const BatchSize& bs = tds[0].batch_size();
  if (bs.empty()) {
    throw RuntimeError("cat: TensorDicts with batch_size " + shape_str(bs) +
                     " have no batch dimension to concatenate along (got dim=" + std::to_string(dim) + ")");
  }
  const int64_t d = norm_dim("cat", dim, bs, static_cast<int64_t>(bs.size()), ErrorCode::Runtime);
  return run(Combiner{false, d, tds.size()}, tds, out);
}

TensorDict zeros_like(const TensorDict& td) {
  return like(td, [](const at::Tensor& t) { return at::zeros_like(t); });
}
TensorDict ones_like(const TensorDict& td) {
  return like(td, [](const at::Tensor& t) { return at::ones_like(t); });
}
TensorDict empty_like(const TensorDict& td) {
  return like(td, [](const at::Tensor& t) { return at::empty_like(t); });
}

}  // namespace tensordict
