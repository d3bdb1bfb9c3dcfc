// TypedTensorDict and TensorClass on in-memory and memory-mapped TensorDicts (upstream §4): schemas,
// constructor strictness vs from_tensordict leniency, options and their errors, ops keeping the class,
// the tensorclass directory format (the Python fixture g_tensorclass and what we write).
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include "engine/fixtures.hpp"
#include "engine/zoo.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/typed.hpp"

using namespace tensordict;
using at::indexing::Slice;
using zoo::message_of;

namespace {

struct State : TypedTensorDict<State> {
  TD_FIELDS(State, TD_TENSOR(x), TD_TENSOR(y))
};
struct Rich : TypedTensorDict<Rich, State> {  // schema composed by inheritance
  TD_FIELDS(Rich, TD_OPTIONAL(z), TD_SUBTD(extra))
};
struct Frozen : TypedTensorDict<Frozen> {
  TD_OPTIONS("frozen")
  TD_FIELDS(Frozen, TD_TENSOR(x))
};
struct FrozenChild : TypedTensorDict<FrozenChild, Frozen> {
  TD_FIELDS(FrozenChild, TD_TENSOR(w))
};
struct Outer : TypedTensorDict<Outer> {
  TD_FIELDS(Outer, TD_TENSOR(obs), TD_NESTED(State, inner))
};
struct Shadowing : TypedTensorDict<Shadowing> {
  TD_FIELDS(Shadowing, TD_TENSOR(batch_size))
};
struct ShadowOk : TypedTensorDict<ShadowOk> {
  TD_OPTIONS("shadow")
  TD_FIELDS(ShadowOk, TD_TENSOR(data))
};
struct BadOption : TypedTensorDict<BadOption> {
  TD_OPTIONS("frozen", "sparkly")
  TD_FIELDS(BadOption, TD_TENSOR(x))
};
struct TwoCasts : TensorClass<TwoCasts> {
  TD_OPTIONS("autocast", "nocast")
  TD_FIELDS(TwoCasts, TD_TENSOR(x))
};
struct TtdWithString : TypedTensorDict<TtdWithString> {
  TD_FIELDS(TtdWithString, TD_TENSOR(x), TD_DATA(std::string, label))
};

struct Pair : TensorClass<Pair> {
  TD_FIELDS(Pair, TD_TENSOR(a), TD_TENSOR(b), TD_DATA(std::string, label))
};
struct PairLike : TensorClass<PairLike> {  // same fields as Pair
  TD_FIELDS(PairLike, TD_TENSOR(a), TD_TENSOR(b), TD_DATA(std::string, label))
};
struct PairOther : TensorClass<PairOther> {  // same names, another type for "b"
  TD_FIELDS(PairOther, TD_TENSOR(a), TD_SUBTD(b), TD_DATA(std::string, label))
};
struct Counter : TensorClass<Counter> {
  TD_FIELDS(Counter, TD_TENSOR(x), TD_SCALAR_OR(int64_t, n, 3), TD_DATA_OR(JsonValue, meta, JsonValue()))
};
struct CounterAuto : TensorClass<CounterAuto> {
  TD_OPTIONS("autocast")
  TD_FIELDS(CounterAuto, TD_SCALAR(int64_t, n), TD_SCALAR_OR(double, w, 0.5))
};
struct CounterNocast : TensorClass<CounterNocast> {
  TD_OPTIONS("nocast")
  TD_FIELDS(CounterNocast, TD_SCALAR(int64_t, n))
};
struct OnlyTensors : TensorClass<OnlyTensors> {
  TD_OPTIONS("tensor_only")
  TD_FIELDS(OnlyTensors, TD_TENSOR(x), TD_DATA(std::string, label))
};
struct FrozenTc : TensorClass<FrozenTc> {
  TD_OPTIONS("frozen")
  TD_FIELDS(FrozenTc, TD_TENSOR(x))
};
struct Holder : TensorClass<Holder> {  // a nested tensorclass field
  TD_FIELDS(Holder, TD_TENSOR(t), TD_NESTED(Pair, pair))
};

TensorDict xy(int64_t n = 4) {
  return TensorDict({{"x", at::arange(n * 3, at::kFloat).reshape({n, 3})}, {"y", at::ones({n, 5})}}, {n});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(typed)

BOOST_AUTO_TEST_CASE(schema_fields_required_optional_and_inheritance) {
  const auto& s = Rich::schema();
  BOOST_TEST(s->name == "Rich");
  BOOST_TEST(s->class_path == "Rich");  // its C++ qualified name (an anonymous namespace left out)
  BOOST_TEST((s->field_names() == std::vector<std::string>{"x", "y", "z", "extra"}));
  BOOST_TEST((s->required_fields() == std::vector<std::string>{"x", "y", "extra"}));
  BOOST_TEST((s->optional_fields() == std::vector<std::string>{"z"}));
  BOOST_TEST(s->is_a(*State::schema()));
  BOOST_TEST(!State::schema()->is_a(*s));
  BOOST_TEST(FrozenChild::schema()->options.frozen);  // options are inherited
}

BOOST_AUTO_TEST_CASE(constructor_is_strict) {
  State s({{"x", at::zeros({4, 3})}, {"y", at::ones({4, 5})}}, {4});
  BOOST_TEST(s.type_name() == "State");
  BOOST_TEST((s.batch_size() == BatchSize{4}));
  BOOST_TEST(s.x().sum().item<float>() == 0.f);
  std::string m = message_of<TypeError>([] { State({{"x", at::zeros({4, 3})}}, {4}); });
  BOOST_TEST(m.find("State() missing required field(s): 'y'") != std::string::npos, m);
  m = message_of<TypeError>([] { State({{"x", at::zeros({4})}, {"y", at::zeros({4})}, {"w", at::zeros({4})}}, {4}); });
  BOOST_TEST(m.find("State() got unexpected field(s): 'w'") != std::string::npos, m);
  // the batch size is checked as for any TensorDict
  BOOST_CHECK_THROW(State({{"x", at::zeros({3})}, {"y", at::zeros({4})}}, {4}), Error);
}

BOOST_AUTO_TEST_CASE(from_tensordict_is_lenient_and_live) {
  TensorDict td = xy();
  td.set("extra_key", at::zeros({4}));  // extras allowed
  State s = State::from_tensordict(td);
  BOOST_TEST(s.is_same(td));                  // the same node: a zero-copy wrap
  s.set_x(at::full({4, 3}, 7.f));
  BOOST_TEST((td.get("x") == 7).all().item<bool>());  // writes reach the wrapped TensorDict
  BOOST_TEST(td.type_name() == "TensorDict");        // the wrapped handle stays untyped
  std::string m = message_of<TypeError>([] { State::from_tensordict(TensorDict({{"x", at::zeros({2})}}, {2})); });
  BOOST_TEST(m.find("missing required field(s): 'y'") != std::string::npos, m);
  // check=false: an empty backend is accepted; a missing field raises on access
  State empty = State::from_tensordict(TensorDict(BatchSize{8}), false);
  m = message_of<AttributeError>([&] { empty.x(); });
  BOOST_TEST(m.find("State has field 'x' declared but not set") != std::string::npos, m);
  empty.index_put_({0}, State({{"x", at::ones({3})}, {"y", at::ones({5})}}, {}));  // preallocates
  BOOST_TEST((empty.x().sizes() == at::IntArrayRef{8, 3}));
  BOOST_TEST(empty.x()[0].sum().item<float>() == 3.f);
}

BOOST_AUTO_TEST_CASE(ops_keep_the_class_without_revalidation) {
  State s = State::from_tensordict(xy());
  State row = s.index({1});
  BOOST_TEST(row.type_name() == "State");
  BOOST_TEST((row.batch_size() == BatchSize{}));
  BOOST_TEST(row.x()[0].item<float>() == 3.f);
  BOOST_TEST(s.clone().type_name() == "State");
  BOOST_TEST(s.expand({2, 4}).type_name() == "State");
  BOOST_TEST(s.apply([](const at::Tensor& t) { return t * 2; }).x()[1][0].item<float>() == 6.f);
  State ex = s.exclude({"y"});  // still a State, missing a required field (upstream)
  BOOST_TEST(ex.type_name() == "State");
  BOOST_CHECK_THROW(ex.y(), AttributeError);
  BOOST_TEST(s.select({"x"}).type_name() == "State");
  auto rows = s.unbind(0);
  BOOST_TEST(rows.size() == 4u);
  BOOST_TEST(rows[2].type_name() == "State");
  // the runtime type travels with plain TensorDict handles too
  TensorDict plain = s;
  BOOST_TEST(plain.index({Slice(0, 2)}).type_name() == "State");
  BOOST_TEST(State::is_instance(plain.clone()));
  BOOST_TEST(!State::is_instance(plain.to_tensordict()));
  // stack / cat keep the class (upstream torch.stack of TypedTensorDicts)
  State st = State::stack({s, s}, 0);
  BOOST_TEST((st.batch_size() == BatchSize{2, 4}));
  BOOST_TEST(stack({s, s}, 0).type_name() == "State");
  BOOST_TEST(State::cat({s, s}, 0).len() == 8);
  // iteration yields rows of the class
  int64_t n = 0;
  for (State r : s) {
    BOOST_TEST(r.type_name() == "State");
    BOOST_TEST(r.x()[0].item<float>() == float(3 * n));
    ++n;
  }
  BOOST_TEST(n == 4);
  std::string r = repr(s);
  BOOST_TEST(r.rfind("State(", 0) == 0, r);
}

BOOST_AUTO_TEST_CASE(lazy_stack_of_typed_members_hands_out_typed_members) {
  State s1({{"x", at::zeros({3})}, {"y", at::zeros({3})}}, {3});
  State s2({{"x", at::ones({3})}, {"y", at::ones({3})}}, {3});
  LazyStackedTensorDict ls({s1, s2}, 0);
  BOOST_TEST(State::is_instance(ls.index({0})));  // upstream isinstance(ls[0], State)
  BOOST_TEST(State::wrap(ls.index({1})).x()[0].item<float>() == 1.f);
  BOOST_TEST(State::is_instance(ls.member(1)));
  // a typed sub-TensorDict stays typed inside a plain TensorDict
  TensorDict parent(BatchSize{3});
  parent.set("s", s1);
  BOOST_TEST(parent.get_td("s").type_name() == "State");
}

BOOST_AUTO_TEST_CASE(nested_typed_fields) {
  State inner({{"x", at::zeros({2, 3})}, {"y", at::zeros({2, 5})}}, {2});
  Outer o({{"obs", at::ones({2, 4})}, {"inner", inner}}, {2});
  BOOST_TEST(o.inner().type_name() == "State");
  BOOST_TEST(o.index({0}).inner().x().dim() == 1);
  o.set_inner(State({{"x", at::ones({2, 3})}, {"y", at::ones({2, 5})}}, {2}));
  BOOST_TEST(o.inner().x().sum().item<float>() == 6.f);
}

BOOST_AUTO_TEST_CASE(frozen_locks_the_instance_but_not_a_wrap) {
  Frozen f({{"x", at::zeros({2})}}, {2});
  BOOST_TEST(f.is_locked());
  BOOST_CHECK_THROW(f.set("new", at::zeros({2})), LockedError);
  FrozenChild c({{"x", at::zeros({2})}, {"w", at::zeros({2})}}, {2});
  BOOST_TEST(c.is_locked());  // inherited
  Frozen w = Frozen::from_tensordict(TensorDict({{"x", at::zeros({2})}}, {2}));
  BOOST_TEST(!w.is_locked());  // upstream: frozen is not applied by from_tensordict
}

BOOST_AUTO_TEST_CASE(class_creation_errors) {
  std::string m = message_of<AttributeError>([] { Shadowing::schema(); });
  BOOST_TEST(m.find("Field 'batch_size' shadows a TensorDictBase attribute") != std::string::npos, m);
  BOOST_CHECK_THROW(Shadowing(), AttributeError);  // every use of the class reports it
  BOOST_TEST(ShadowOk::schema()->find("data") != nullptr);
  ShadowOk ok({{"data", at::zeros({2})}}, {2});
  BOOST_TEST(ok.data().numel() == 2);
  m = message_of<ValueError>([] { BadOption::schema(); });
  BOOST_TEST(m.find("Unknown option 'sparkly'") != std::string::npos, m);
  m = message_of<ValueError>([] { TwoCasts::schema(); });
  BOOST_TEST(m.find("mutually exclusive") != std::string::npos, m);
  m = message_of<TypeError>([] { TtdWithString::schema(); });
  BOOST_TEST(m.find("tensors and sub-TensorDicts only") != std::string::npos, m);
  m = message_of<TypeError>([] { OnlyTensors::schema(); });
  BOOST_TEST(m.find("tensor_only") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(tensorclass_fields_defaults_and_from_tensordict) {
  Pair p({{"a", at::zeros({2, 2})}, {"b", at::arange(2)}, {"label", "hello"}}, {2});
  BOOST_TEST(p.label() == "hello");
  BOOST_TEST(p.type_name() == "Pair");
  p.set_label("bye");
  BOOST_TEST(p.tensordict().get_non_tensor("label").as_string() == "bye");  // stored as NonTensorData
  BOOST_CHECK_THROW(Pair({{"a", at::zeros({2})}}, {2}), TypeError);        // missing b, label
  // from_tensordict: undeclared keys ValueError, declared-absent unset, a key in both KeyError
  TensorDict td({{"a", at::zeros({2})}, {"zz", at::zeros({2})}}, {2});
  std::string m = message_of<ValueError>([&] { Pair::from_tensordict(td); });
  BOOST_TEST(m.find("'zz'") != std::string::npos, m);
  Pair partial = Pair::from_tensordict(TensorDict({{"a", at::zeros({2})}}, {2}));
  BOOST_TEST(!partial.b().defined());  // declared but absent: None
  BOOST_CHECK_THROW(partial.label(), AttributeError);
  Pair withnt = Pair::from_tensordict(TensorDict({{"a", at::zeros({2})}}, {2}),
                                      JsonValue::object({{"label", JsonValue("apart")}}));
  BOOST_TEST(withnt.label() == "apart");
  BOOST_TEST(withnt.index({0}).label() == "apart");
  m = message_of<KeyError>([] {
    Pair::from_tensordict(TensorDict({{"a", at::zeros({2})}, {"label", "x"}}, {2}),
                          JsonValue::object({{"label", JsonValue("y")}}));
  });
  BOOST_TEST(m.find("present in both") != std::string::npos, m);
  // defaults and scalar fields (default rules: a scalar is wrapped as a tensor)
  Counter c({{"x", at::zeros({2})}}, {2});
  BOOST_TEST(c.n() == 3);
  BOOST_TEST(c.get("n").is_tensor());
  BOOST_TEST(c.meta().is_null());
  c.set_n(5);
  BOOST_TEST(c.n() == 5);
  BOOST_TEST((c.get("n").tensor().sizes() == at::IntArrayRef{2}));
}

BOOST_AUTO_TEST_CASE(tensorclass_cast_rules) {
  // autocast: values are cast to the field's type; a non-scalar tensor of distinct values cannot be read
  CounterAuto a({{"n", at::ones({}, at::kFloat) * 4}}, {});
  BOOST_TEST(a.n() == 4);
  BOOST_TEST(a.get("n").tensor().scalar_type() == at::kLong);
  BOOST_TEST(a.w() == 0.5);
  BOOST_CHECK_THROW(CounterAuto({{"n", "four"}}, {}), TypeError);  // wrong field type
  CounterAuto b = CounterAuto::from_tensordict(TensorDict({{"n", at::arange(3)}}, {3}));
  BOOST_CHECK_THROW(b.n(), RuntimeError);
  BOOST_TEST(b.index({2}).n() == 2);
  CounterAuto frac = CounterAuto::from_tensordict(TensorDict({{"n", at::full({}, 1.5)}}, {}));
  BOOST_CHECK_THROW(frac.n(), TypeError);  // 1.5 is not an int64_t
  // nocast: kept as the value itself
  CounterNocast n({{"n", Entry(JsonValue(7))}}, {});
  BOOST_TEST(n.get("n").is_non_tensor());
  BOOST_TEST(n.n() == 7);
  CounterNocast fromt({{"n", at::full({}, 9)}}, {});
  BOOST_TEST(fromt.get("n").is_non_tensor());  // a tensor becomes the value under nocast
  BOOST_TEST(fromt.n() == 9);
  BOOST_CHECK_THROW(CounterNocast({{"n", "nine"}}, {}), TypeError);
  // a tensor field given a non-tensor
  std::string m = message_of<TypeError>([] { Pair({{"a", "text"}, {"b", at::zeros({})}, {"label", "l"}}, {}); });
  BOOST_TEST(m.find("field 'a' of Pair expects a Tensor") != std::string::npos, m);
  m = message_of<TypeError>([] { Pair({{"a", at::zeros({})}, {"b", at::zeros({})}, {"label", at::zeros({})}}, {}); });
  BOOST_TEST(m.find("field 'label' of Pair expects std::string") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(tensorclass_frozen) {
  FrozenTc f({{"x", at::zeros({2})}}, {2});
  BOOST_TEST(f.is_locked());
  std::string m = message_of<AttributeError>([&] { f.set_x(at::ones({2})); });
  BOOST_TEST(m.find("cannot assign to field 'x'") != std::string::npos, m);
  BOOST_CHECK_THROW(f.update(TensorDict({{"x", at::ones({2})}}, {2})), AttributeError);
}

BOOST_AUTO_TEST_CASE(tensorclass_index_put_requires_the_same_fields) {
  Pair buf({{"a", at::zeros({3, 2})}, {"b", at::zeros({3}, at::kLong)}, {"label", "l"}}, {3});
  Pair row({{"a", at::ones({2})}, {"b", at::ones({}, at::kLong)}, {"label", "l"}}, {});
  buf.index_put_({1}, row);
  BOOST_TEST(buf.a()[1].sum().item<float>() == 2.f);
  PairLike like({{"a", at::full({2}, 2.f)}, {"b", at::ones({}, at::kLong)}, {"label", "l"}}, {});
  buf.index_put_({2}, like);  // same field set: accepted
  BOOST_TEST(buf.a()[2].sum().item<float>() == 4.f);
  TensorDict sub({{"q", at::zeros({})}}, {});
  PairOther other({{"a", at::ones({2})}, {"b", sub}, {"label", "l"}}, {});
  std::string m = message_of<ValueError>([&] { buf.index_put_({0}, other); });
  BOOST_TEST(m.find("must be a Pair or have the same fields") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(tensorclass_nested_preallocation_stack_iter) {
  Pair p({{"a", at::zeros({2})}, {"b", at::zeros({}, at::kLong)}, {"label", "in"}}, {});
  Holder h({{"t", at::ones({})}, {"pair", p.tensordict()}}, {});
  BOOST_TEST(h.pair().label() == "in");
  // preallocation of a nested tensorclass field by the first indexed write (upstream test_pre_allocate)
  Holder buf = Holder::from_tensordict(TensorDict(BatchSize{5}));
  buf.index_put_({3}, h);
  BOOST_TEST((buf.pair().a().sizes() == at::IntArrayRef{5, 2}));
  BOOST_TEST(buf.t()[3].item<float>() == 1.f);
  BOOST_TEST(buf.pair().type_name() == "Pair");
  Pair s = Pair::stack({p, p}, 0);
  BOOST_TEST((s.batch_size() == BatchSize{2}));
  BOOST_TEST(s.label() == "in");
  int64_t n = 0;
  for (Pair r : s) {
    BOOST_TEST(r.label() == "in");
    ++n;
  }
  BOOST_TEST(n == 2);
  BOOST_TEST(s.clone().equal(s));
  BOOST_TEST(s.to_tensordict().type_name() == "TensorDict");
}

BOOST_AUTO_TEST_CASE(tensorclass_over_typed_tensordict_and_back) {
  State st = State::from_tensordict(xy());
  struct XY : TensorClass<XY> {
    TD_FIELDS(XY, TD_TENSOR(x), TD_TENSOR(y))
  };
  XY tc = XY::from_tensordict(st);
  BOOST_TEST(tc.x().size(0) == 4);
  tc.set_x(at::zeros({4, 3}));
  BOOST_TEST(st.x().sum().item<float>() == 0.f);  // live through both wrappers
  State back = State::from_tensordict(tc.tensordict());
  BOOST_TEST(back.type_name() == "State");
  BOOST_TEST(back.is_same(st));
}

BOOST_AUTO_TEST_CASE(python_tensorclass_fixture_loads) {
  // g_tensorclass: Pair(a float32 [2,2], b int64 [2], label "pair-label") written by Python's memmap
  Pair p = Pair::load_memmap(fixtures::python_written("g_tensorclass"));
  BOOST_TEST(p.type_name() == "Pair");
  BOOST_TEST((p.batch_size() == BatchSize{2}));
  BOOST_TEST(p.a().flatten()[3].item<float>() == 3.f);
  BOOST_TEST(p.b()[1].item<int64_t>() == 6);
  BOOST_TEST(p.label() == "pair-label");
  // another class refuses it; a plain TensorDict directory is not a tensorclass
  std::string m = message_of<TypeError>([] { PairOther::load_memmap(fixtures::python_written("g_tensorclass")); });
  BOOST_TEST(m.find("not a PairOther") != std::string::npos, m);
  BOOST_CHECK_THROW(Pair::load_memmap(fixtures::python_written("a_flat")), TypeError);
}

BOOST_AUTO_TEST_CASE(tensorclass_memmap_writes_the_python_layout) {
  fixtures::TempDir dir("typed");
  Pair p({{"a", at::arange(4, at::kFloat).reshape({2, 2})}, {"b", at::tensor({5, 6})}, {"label", "pair-label"}}, {2});
  p.memmap_(dir.path + "/p");
  BOOST_TEST(p.is_memmap());
  std::ifstream f(dir.path + "/p/meta.json");
  std::string meta((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  BOOST_TEST(meta.find("<class 'Pair'>") != std::string::npos, meta);
  BOOST_TEST(std::filesystem::exists(dir.path + "/p/_tensordict/a.memmap"));
  BOOST_TEST(std::filesystem::exists(dir.path + "/p/_tensordict/label/meta.json"));
  Pair q = Pair::load_memmap(dir.path + "/p");
  BOOST_TEST(q.equal(p));
  BOOST_TEST(q.label() == "pair-label");
  // memmap cells: in-place writes
  q.set_("a", at::ones({2, 2}));
  BOOST_TEST(Pair::load_memmap(dir.path + "/p").a().sum().item<float>() == 4.f);
  q.update_(TensorDict({{"b", at::zeros({2}, at::kLong)}}, {2}));
  BOOST_TEST(Pair::load_memmap(dir.path + "/p").b().sum().item<int64_t>() == 0);
  // non-tensor fields given apart are written to the class record and come back
  Pair apart = Pair::from_tensordict(TensorDict({{"a", at::zeros({2})}, {"b", at::zeros({2})}}, {2}),
                                     JsonValue::object({{"label", JsonValue("kept")}}));
  apart.memmap_(dir.path + "/apart");
  BOOST_TEST(Pair::load_memmap(dir.path + "/apart").label() == "kept");
}

BOOST_AUTO_TEST_SUITE_END()
