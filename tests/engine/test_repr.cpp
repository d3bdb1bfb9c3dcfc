// repr(td) / operator<<: upstream's exact layout (TensorDictBase.__repr__, utils._td_fields,
// NonTensorData / NonTensorStack reprs), including test_tensordict_prealloc_nested's expected string.
#include <boost/test/unit_test.hpp>

#include <sstream>

#include "fixtures.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;

namespace {
std::string tensor_line(const std::string& shape, const std::string& dtype) {
  return "Tensor(shape=torch.Size([" + shape + "]), device=cpu, dtype=torch." + dtype + ", is_shared=False)";
}
//! the repr of a TensorDict with a single 0-dim... field `field` (already "key: value"), batch []
std::string one_field(const std::string& field) {
  return "TensorDict(\n    fields={\n        " + field +
         "},\n    batch_size=torch.Size([]),\n    device=None,\n    is_shared=False)";
}
std::string data_repr(const JsonValue& v) {
  TensorDict td;
  td.set("d", Entry(v));
  return tensordict::repr(td);
}
std::string nt(const std::string& data) {
  return one_field("d: NonTensorData(data=" + data + ", batch_size=torch.Size([]), device=None)");
}
}  // namespace

BOOST_AUTO_TEST_SUITE(repr)

BOOST_AUTO_TEST_CASE(flat) {
  TensorDict td(Dict{{"b", at::zeros({3, 4}, at::kLong)}, {"a", at::zeros({3})}, {"c", at::zeros({3}, at::kBool)}},
                {3});
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "        a: Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, is_shared=False),\n"
      "        b: Tensor(shape=torch.Size([3, 4]), device=cpu, dtype=torch.int64, is_shared=False),\n"
      "        c: Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.bool, is_shared=False)},\n"
      "    batch_size=torch.Size([3]),\n"
      "    device=None,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(td) == want);
  std::ostringstream os;
  os << td;
  BOOST_TEST(os.str() == want);
}

BOOST_AUTO_TEST_CASE(nested_prealloc_upstream_string) {  // upstream test_tensordict_prealloc_nested
  const int64_t N = 3, B = 5, T = 4;
  TensorDict buffer({}, {B, N});
  TensorDict td_0(Dict{{"env.time", at::rand({N, 1})},
                       {"agent.obs", TensorDict(Dict{{"image", at::rand({N, T, 64})}, {"state", at::rand({N, T, 3, 32, 32})}},
                                                {N, T})}},
                  {N});
  TensorDict td_1 = td_0.clone();
  buffer.index_put_({0}, td_0);
  buffer.index_put_({1}, td_1);
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "        agent.obs: TensorDict(\n"
      "            fields={\n"
      "                image: Tensor(shape=torch.Size([5, 3, 4, 64]), device=cpu, dtype=torch.float32, is_shared=False),\n"
      "                state: Tensor(shape=torch.Size([5, 3, 4, 3, 32, 32]), device=cpu, dtype=torch.float32, is_shared=False)},\n"
      "            batch_size=torch.Size([5, 3, 4]),\n"
      "            device=None,\n"
      "            is_shared=False),\n"
      "        env.time: Tensor(shape=torch.Size([5, 3, 1]), device=cpu, dtype=torch.float32, is_shared=False)},\n"
      "    batch_size=torch.Size([5, 3]),\n"
      "    device=None,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(buffer) == want);
  BOOST_TEST(buffer.get_td("agent.obs").batch_size() == BatchSize({B, N, T}));
}

BOOST_AUTO_TEST_CASE(nested_two_levels) {
  TensorDict td(Dict{{"x", at::zeros({2}, at::kDouble)},
                     {"sub", Dict{{"deep", Dict{{"z", at::zeros({2, 1}, at::kInt)}}}, {"y", at::zeros({2}, at::kHalf)}}}},
                {2}, at::Device(at::kCPU));
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "        sub: TensorDict(\n"
      "            fields={\n"
      "                deep: TensorDict(\n"
      "                    fields={\n"
      "                        z: " + tensor_line("2, 1", "int32") + "},\n"
      "                    batch_size=torch.Size([2]),\n"
      "                    device=cpu,\n"
      "                    is_shared=False),\n"
      "                y: " + tensor_line("2", "float16") + "},\n"
      "            batch_size=torch.Size([2]),\n"
      "            device=cpu,\n"
      "            is_shared=False),\n"
      "        x: " + tensor_line("2", "float64") + "},\n"
      "    batch_size=torch.Size([2]),\n"
      "    device=cpu,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(td) == want);
}

BOOST_AUTO_TEST_CASE(non_tensor) {
  TensorDict td(Dict{{"a", at::zeros({3})}}, {3});
  td.set("data", "a string");
  td.set("names", NonTensorStack({JsonValue("a"), JsonValue("b"), JsonValue("c")}, {3}));
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "        a: Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, is_shared=False),\n"
      "        data: NonTensorData(data=a string, batch_size=torch.Size([3]), device=None),\n"
      "        names: NonTensorStack(\n"
      "            ['a', 'b', 'c'],\n"
      "            batch_size=torch.Size([3]),\n"
      "            device=None)},\n"
      "    batch_size=torch.Size([3]),\n"
      "    device=None,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(td) == want);
  // a 2-d stack prints nested lists; a long one is cut at 50 characters
  TensorDict st({}, {2, 2});
  st.set("p", NonTensorStack({JsonValue(1), JsonValue(2), JsonValue(3), JsonValue(4)}, {2, 2}));
  BOOST_TEST(tensordict::repr(st).find("p: NonTensorStack(\n            [[1, 2], [3, 4]],\n            batch_size=torch.Size([2, 2]),\n"
                           "            device=None)}") != std::string::npos);
  std::vector<JsonValue> many;
  for (int i = 0; i < 30; ++i) many.emplace_back(i);
  TensorDict lg({}, {30});
  lg.set("n", NonTensorStack(many, {30}));
  BOOST_TEST(tensordict::repr(lg).find("            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,...,\n") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(non_tensor_values_print_as_python) {
  BOOST_TEST(data_repr(JsonValue(3)) == nt("3"));
  BOOST_TEST(data_repr(JsonValue(1.0)) == nt("1.0"));
  BOOST_TEST(data_repr(JsonValue(0.1)) == nt("0.1"));
  BOOST_TEST(data_repr(JsonValue(1e-5)) == nt("1e-05"));
  BOOST_TEST(data_repr(JsonValue(std::nan(""))) == nt("nan"));
  BOOST_TEST(data_repr(JsonValue(-HUGE_VAL)) == nt("-inf"));
  BOOST_TEST(data_repr(JsonValue(true)) == nt("True"));
  BOOST_TEST(data_repr(JsonValue(nullptr)) == nt("None"));
  BOOST_TEST(data_repr(JsonValue::array({JsonValue("x"), JsonValue(1), JsonValue(2.5), JsonValue(), JsonValue(false)})) ==
             nt("['x', 1, 2.5, None, False]"));
  BOOST_TEST(data_repr(JsonValue::object({{"k", JsonValue("v")}, {"n", JsonValue::array()}})) == nt("{'k': 'v', 'n': []}"));
  BOOST_TEST(data_repr(JsonValue::array({JsonValue("it's"), JsonValue("a\\b\n")})) == nt("[\"it's\", 'a\\\\b\\n']"));
  // long values: 20 characters, "  ...  ", 20 characters (counted in code points)
  std::string digits;
  for (int i = 0; i < 25; ++i) digits += "0123456789";
  BOOST_TEST(data_repr(JsonValue(digits)) == nt("01234567890123456789  ...  01234567890123456789"));
  std::string accents;
  for (int i = 0; i < 201; ++i) accents += "\xc3\xa9";  // 201 x "é" (2 bytes each)
  std::string twenty;
  for (int i = 0; i < 20; ++i) twenty += "\xc3\xa9";
  BOOST_TEST(data_repr(JsonValue(accents)) == nt(twenty + "  ...  " + twenty));
}

BOOST_AUTO_TEST_CASE(multiline_values_follow_textwrap_indent) {
  TensorDict td;
  td.set("s", "l1\n\nl2");
  // textwrap.indent leaves whitespace-only lines alone
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "        s: NonTensorData(data=l1\n"
      "\n"
      "        l2, batch_size=torch.Size([]), device=None)},\n"
      "    batch_size=torch.Size([]),\n"
      "    device=None,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(td) == want);
}

BOOST_AUTO_TEST_CASE(empty) {
  const std::string want =
      "TensorDict(\n"
      "    fields={\n"
      "    },\n"
      "    batch_size=torch.Size([]),\n"
      "    device=None,\n"
      "    is_shared=False)";
  BOOST_TEST(tensordict::repr(TensorDict()) == want);
  TensorDict td(Dict{{"e", TensorDict({}, {2})}}, {2});
  BOOST_TEST(tensordict::repr(td) ==
             "TensorDict(\n    fields={\n        e: TensorDict(\n            fields={\n            },\n"
             "            batch_size=torch.Size([2]),\n            device=None,\n            is_shared=False)},\n"
             "    batch_size=torch.Size([2]),\n    device=None,\n    is_shared=False)");
  BOOST_TEST(tensordict::repr(TensorDict::undefined()) == "TensorDict(undefined)");
}

BOOST_AUTO_TEST_CASE(fields_sorted_as_strings) {
  // upstream sorts the "key: value" strings: "B" < "a0" < "a" because '0' < ':' < letters
  TensorDict td(Dict{{"a", at::zeros({})}, {"a0", at::zeros({})}, {"B", at::zeros({})}}, {});
  const std::string t = tensor_line("", "float32");
  BOOST_TEST(tensordict::repr(td) == "TensorDict(\n    fields={\n        B: " + t + ",\n        a0: " + t + ",\n        a: " + t +
                             "},\n    batch_size=torch.Size([]),\n    device=None,\n    is_shared=False)");
}

BOOST_AUTO_TEST_CASE(dtype_names) {
  const std::vector<std::pair<at::ScalarType, std::string>> cases = {
      {at::kBFloat16, "bfloat16"}, {at::kHalf, "float16"},     {at::kFloat, "float32"},   {at::kDouble, "float64"},
      {at::kByte, "uint8"},        {at::kChar, "int8"},        {at::kShort, "int16"},     {at::kInt, "int32"},
      {at::kLong, "int64"},        {at::kBool, "bool"},        {at::kComplexFloat, "complex64"},
      {at::kComplexDouble, "complex128"}};
  for (const auto& c : cases) {
    TensorDict td(Dict{{"t", at::zeros({2}, c.first)}}, {});
    BOOST_TEST(tensordict::repr(td) == one_field("t: " + tensor_line("2", c.second)), c.second);
  }
}

BOOST_AUTO_TEST_CASE(memory_mapped_leaf) {
  fixtures::TempDir dir("repr");
  at::Tensor m = backends::write_and_map(dir / "m.memmap", at::zeros({3}));
  TensorDict td(Dict{{"m", m}}, {3});
  BOOST_TEST(tensordict::repr(td).find("m: MemoryMappedTensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, is_shared=True)") !=
             std::string::npos);
  BOOST_TEST(tensordict::repr(td.index({at::indexing::Slice(0, 2)})).find("m: MemoryMappedTensor(shape=torch.Size([2])") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(batch_size_repr) {
  BOOST_TEST(repr_batch_size({}) == "torch.Size([])");
  BOOST_TEST(repr_batch_size({3}) == "torch.Size([3])");
  BOOST_TEST(repr_batch_size({3, 4, 0}) == "torch.Size([3, 4, 0])");
}

BOOST_AUTO_TEST_SUITE_END()
