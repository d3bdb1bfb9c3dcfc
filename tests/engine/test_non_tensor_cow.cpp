// A NonTensorStack in a clone or copy of a TensorDict: the two share the stack's values until one of them
// writes (copy-on-write, NonTensorStack::assign); a write through either leaves the other as it was.
#include <boost/test/unit_test.hpp>

#include "tensordict/tensor_dict.hpp"

using namespace tensordict;
using at::indexing::Slice;

namespace {
JsonValue strings(std::initializer_list<const char*> v) {
  JsonValue::Array a;
  for (const char* s : v) a.emplace_back(s);
  return JsonValue(std::move(a));
}

TensorDict with_stacks() {
  TensorDict td(Dict{{"x", at::arange(3)}}, {3});
  td.set("ids", NonTensorStack({"a", "b", "c"}, {3}));
  td.set(NestedKey{"sub", "tags"}, NonTensorStack({"p", "q", "r"}, {3}));
  return td;
}

//! td[1] = {"ids": v, ("sub", "tags"): v}: one element of each stack
void write_row(TensorDict& td, const char* v) {
  TensorDict row(Dict{{"ids", v}, {NestedKey{"sub", "tags"}, v}}, {});
  td.index_put_({1}, row);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(non_tensor_cow)

BOOST_AUTO_TEST_CASE(writing_a_clone_leaves_the_original_as_it_was_and_the_reverse) {
  // clone() and copy() (clone(false)): both share the stacks' values at first
  for (bool deep : {true, false}) {
    BOOST_TEST_CONTEXT((deep ? "clone()" : "copy()")) {
      TensorDict orig = with_stacks();
      TensorDict dup = deep ? orig.clone() : orig.copy();
      write_row(dup, "z");
      BOOST_TEST(dup.get_non_tensor("ids") == strings({"a", "z", "c"}));
      BOOST_TEST(dup.get_non_tensor(NestedKey{"sub", "tags"}) == strings({"p", "z", "r"}));
      BOOST_TEST(orig.get_non_tensor("ids") == strings({"a", "b", "c"}));
      BOOST_TEST(orig.get_non_tensor(NestedKey{"sub", "tags"}) == strings({"p", "q", "r"}));

      // the reverse: a write into the original after another clone
      TensorDict dup2 = deep ? orig.clone() : orig.copy();
      write_row(orig, "y");
      orig.index_put_({Slice(2, 3)}, TensorDict(Dict{{"ids", "w"}}, {1}));
      BOOST_TEST(orig.get_non_tensor("ids") == strings({"a", "y", "w"}));
      BOOST_TEST(orig.get_non_tensor(NestedKey{"sub", "tags"}) == strings({"p", "y", "r"}));
      BOOST_TEST(dup2.get_non_tensor("ids") == strings({"a", "b", "c"}));
      BOOST_TEST(dup2.get_non_tensor(NestedKey{"sub", "tags"}) == strings({"p", "q", "r"}));
      // and the first clone saw none of it
      BOOST_TEST(dup.get_non_tensor("ids") == strings({"a", "z", "c"}));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_copied_stack_value_is_independent_of_its_source) {
  // the stack itself, copied as a value: the same rule
  NonTensorStack a({"a", "b", "c"}, {3});
  NonTensorStack b = a;
  b.assign([](const at::Tensor& pos) { return pos.index({1}); }, {JsonValue("z")});
  BOOST_TEST(a.tolist() == strings({"a", "b", "c"}));
  BOOST_TEST(b.tolist() == strings({"a", "z", "c"}));
  a.assign([](const at::Tensor& pos) { return pos.index({0}); }, {JsonValue("y")});
  BOOST_TEST(a.tolist() == strings({"y", "b", "c"}));
  BOOST_TEST(b.tolist() == strings({"a", "z", "c"}));
}

BOOST_AUTO_TEST_SUITE_END()
