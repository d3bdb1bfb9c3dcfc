// JsonValue: parsing (Python json dialect), printing (Python layouts and float repr), typed access.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include "backends_test_util.hpp"
#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"

using tensordict::FormatError;
using tensordict::JsonValue;
using tensordict::TypeError;
using tensordict::ValueError;
using Style = JsonValue::Style;

BOOST_AUTO_TEST_SUITE(json)

BOOST_AUTO_TEST_CASE(parse_scalars_and_numbers) {
  BOOST_TEST(JsonValue::parse("null").is_null());
  BOOST_TEST(JsonValue::parse(" true ").as_bool() == true);
  BOOST_TEST(JsonValue::parse("false").as_bool() == false);
  BOOST_TEST(JsonValue::parse("0").as_int() == 0);
  BOOST_TEST(JsonValue::parse("-0").is_int());
  BOOST_TEST(JsonValue::parse("1099511627776").as_int() == (int64_t{1} << 40));
  BOOST_TEST(JsonValue::parse("9223372036854775807").as_int() == std::numeric_limits<int64_t>::max());
  BOOST_TEST(JsonValue::parse("-9223372036854775808").as_int() == std::numeric_limits<int64_t>::min());
  // beyond int64: a Double, like a float would be
  JsonValue big = JsonValue::parse("9223372036854775808");
  BOOST_TEST(big.is_double());
  BOOST_TEST(big.as_double() == 9223372036854775808.0);
  BOOST_TEST(JsonValue::parse("18446744073709551616").is_double());
  BOOST_TEST(JsonValue::parse("1.0").is_double());
  BOOST_TEST(JsonValue::parse("1e2").is_double());
  BOOST_TEST(JsonValue::parse("1e2").as_double() == 100.0);
  BOOST_TEST(JsonValue::parse("0.1").as_double() == 0.1);
  BOOST_TEST(JsonValue::parse("2.2250738585072014e-308").as_double() == 2.2250738585072014e-308);
  BOOST_TEST(JsonValue::parse("-0.0").as_double() == 0.0);
  BOOST_TEST(std::signbit(JsonValue::parse("-0.0").as_double()));
  BOOST_TEST(JsonValue::parse("\"x\"").as_string() == "x");
}

BOOST_AUTO_TEST_CASE(parse_nan_and_infinity_tokens) {
  BOOST_TEST(std::isnan(JsonValue::parse("NaN").as_double()));
  BOOST_TEST(JsonValue::parse("Infinity").as_double() == std::numeric_limits<double>::infinity());
  BOOST_TEST(JsonValue::parse("-Infinity").as_double() == -std::numeric_limits<double>::infinity());
  BOOST_TEST(JsonValue::parse("Inf").as_double() == std::numeric_limits<double>::infinity());
  BOOST_TEST(JsonValue::parse("-Inf").as_double() == -std::numeric_limits<double>::infinity());
  JsonValue a = JsonValue::parse("[NaN, Infinity, -Infinity, 1]");
  BOOST_TEST(a.as_array().size() == 4u);
  BOOST_TEST(std::isnan(a.as_array()[0].as_double()));
  BOOST_TEST(a.as_array()[3].as_int() == 1);
  for (const char* bad : {"nan", "infinity", "Infinit", "NaNa", "+Infinity", "-NaN0"})
    td_test::check_throws<FormatError>([&] { JsonValue::parse(bad); }, {"offset"});
}

BOOST_AUTO_TEST_CASE(parse_objects_keep_order_and_python_duplicates) {
  JsonValue o = JsonValue::parse("{\"z\": 1, \"a\": 2, \"m\": {\"y\": [], \"x\": {}}}");
  const auto& obj = o.as_object();
  BOOST_TEST_REQUIRE(obj.size() == 3u);
  BOOST_TEST(obj[0].first == "z");
  BOOST_TEST(obj[1].first == "a");
  BOOST_TEST(obj[2].first == "m");
  BOOST_TEST(o.find("m")->find("y")->as_array().empty());
  BOOST_TEST(o.find("m")->find("x")->as_object().empty());
  BOOST_TEST(o.find("nope") == nullptr);
  BOOST_TEST(JsonValue(1).find("a") == nullptr);
  // Python dict: first position, last value
  JsonValue d = JsonValue::parse("{\"a\": 1, \"b\": 2, \"a\": 3}");
  BOOST_TEST_REQUIRE(d.as_object().size() == 2u);
  BOOST_TEST(d.as_object()[0].first == "a");
  BOOST_TEST(d.as_object()[0].second.as_int() == 3);
  BOOST_TEST(d.as_object()[1].second.as_int() == 2);
}

BOOST_AUTO_TEST_CASE(parse_whitespace_and_escapes) {
  JsonValue v = JsonValue::parse(" \t\r\n{ \"k\\u00e9y\" :\n[ \"\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\" ] }\n ");
  BOOST_TEST(v.as_object()[0].first == "k\xc3\xa9y");
  BOOST_TEST(v.find("k\xc3\xa9y")->as_array()[0].as_string() == "\xc3\xa9\xf0\x9f\x98\x80\n\t\"\\/");
  // raw UTF-8 is accepted too
  BOOST_TEST(JsonValue::parse("\"\xe2\x82\xac\"").as_string() == "\xe2\x82\xac");
  // escaped NUL inside a string is data
  BOOST_TEST(JsonValue::parse("\"a\\u0000b\"").as_string() == std::string("a\0b", 3));
}

BOOST_AUTO_TEST_CASE(truncated_utf8_at_the_end_is_an_error_not_an_overread) {
  // found by fuzz_meta_json: RapidJSON read past the terminator after a lead byte at the very end
  for (std::string tail : {"\xC3", "\xE2\x82", "\xF0\x9F\x98", "\xF4"}) {
    BOOST_CHECK_THROW(tensordict::JsonValue::parse("{\"a\": \"x" + tail), tensordict::FormatError);
    BOOST_CHECK_THROW(tensordict::JsonValue::parse("\"" + tail), tensordict::FormatError);
  }
}

BOOST_AUTO_TEST_CASE(parse_errors_are_format_errors_with_offset) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "offset 0"},
      {"   ", "offset"},
      {"{", "offset 1"},
      {"[1,]", "offset 3"},
      {"{\"a\" 1}", "offset"},
      {"{} x", "offset 3"},
      {"[1] [2]", "offset"},
      {"not json", "offset"},
      {"{'a': 1}", "offset"},
      {"[1, 2", "offset"},
      {"\"unterminated", "offset"},
      {"\"bad \\x escape\"", "offset"},
      {"\"raw\ncontrol\"", "offset"},
      {"\"\xff\xfe\"", "offset"},           // invalid UTF-8
      {"\"\xc3\"", "offset"},               // truncated UTF-8
      {std::string("{}\0{}", 5), "offset 2"},  // NUL byte
      {"// comment\n{}", "offset 0"},
      {"01", "offset"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("input '" << c.first << "'") {
      td_test::check_throws<FormatError>([&] { JsonValue::parse(c.first); }, {"FormatError", "invalid JSON", c.second});
    }
  }
}

BOOST_AUTO_TEST_CASE(parse_depth_limit) {
  std::string ok(JsonValue::kMaxDepth, '[');
  ok += std::string(JsonValue::kMaxDepth, ']');
  BOOST_TEST(JsonValue::parse(ok).is_array());
  std::string deep(100000, '[');  // would overflow a recursive parser's stack
  td_test::check_throws<FormatError>([&] { JsonValue::parse(deep); }, {"nesting deeper than"});
  std::string deep_obj;
  for (int i = 0; i < 1000; ++i) deep_obj += "{\"a\":";
  td_test::check_throws<FormatError>([&] { JsonValue::parse(deep_obj); }, {"nesting deeper than"});
}

BOOST_AUTO_TEST_CASE(typed_access_errors_name_both_kinds) {
  JsonValue s("text");
  td_test::check_throws<TypeError>([&] { s.as_int(); }, {"TypeError", "expected int", "found string"});
  td_test::check_throws<TypeError>([&] { JsonValue(1).as_string(); }, {"expected string", "found int"});
  td_test::check_throws<TypeError>([&] { JsonValue(1.5).as_int(); }, {"expected int", "found double"});
  td_test::check_throws<TypeError>([&] { JsonValue().as_bool(); }, {"expected bool", "found null"});
  td_test::check_throws<TypeError>([&] { JsonValue(true).as_double(); }, {"expected double", "found bool"});
  td_test::check_throws<TypeError>([&] { JsonValue::object().as_array(); }, {"expected array", "found object"});
  td_test::check_throws<TypeError>([&] { JsonValue::array().as_object(); }, {"expected object", "found array"});
  td_test::check_throws<TypeError>([&] { JsonValue(1).as_bytes(); }, {"expected bytes", "found int"});
  JsonValue a = JsonValue::array();
  td_test::check_throws<TypeError>([&] { a.as_object(); }, {"expected object"});
  JsonValue o = JsonValue::object();
  td_test::check_throws<TypeError>([&] { o.as_array(); }, {"expected array"});
  td_test::check_throws<TypeError>([&] { JsonValue(JsonValue::Bytes{"x"}).as_string(); }, {"found bytes"});
  BOOST_TEST(JsonValue(3).as_double() == 3.0);  // ints convert
  for (int k = 0; k <= 7; ++k) BOOST_TEST(std::string(JsonValue::kind_name(static_cast<JsonValue::Kind>(k))) != "?");
}

BOOST_AUTO_TEST_CASE(equality_is_structural) {
  BOOST_TEST(JsonValue(std::nan("")) == JsonValue(std::nan("")));
  BOOST_TEST(JsonValue(1) != JsonValue(1.0));
  BOOST_TEST(JsonValue(1) == JsonValue(int64_t{1}));
  BOOST_TEST(JsonValue::parse("{\"a\":[1,2]}") == JsonValue::object({{"a", JsonValue::array({1, 2})}}));
  BOOST_TEST(JsonValue::parse("{\"a\":1,\"b\":2}") != JsonValue::parse("{\"b\":2,\"a\":1}"));  // order matters
  BOOST_TEST(JsonValue(JsonValue::Bytes{"ab"}) == JsonValue(JsonValue::Bytes{"ab"}));
  BOOST_TEST(JsonValue(JsonValue::Bytes{"ab"}) != JsonValue(JsonValue::Bytes{"ac"}));
  BOOST_TEST(JsonValue("a") != JsonValue("b"));
  BOOST_TEST(JsonValue(true) != JsonValue(false));
  BOOST_TEST(JsonValue() == JsonValue(nullptr));
}

BOOST_AUTO_TEST_CASE(dump_layouts) {
  JsonValue v = JsonValue::object({{"a", 1},
                                   {"b", JsonValue::array({1.5, std::nan(""), std::numeric_limits<double>::infinity(),
                                                           -std::numeric_limits<double>::infinity()})},
                                   {"c", nullptr},
                                   {"d", true},
                                   {"s", "\xc3\xa9"},
                                   {"e", JsonValue::object()},
                                   {"f", JsonValue::array()}});
  BOOST_TEST(v.dump() == "{\"a\":1,\"b\":[1.5,NaN,Infinity,-Infinity],\"c\":null,\"d\":true,\"s\":\"\xc3\xa9\",\"e\":{},\"f\":[]}");
  BOOST_TEST(v.dump(Style::Python) ==
             "{\"a\": 1, \"b\": [1.5, NaN, Infinity, -Infinity], \"c\": null, \"d\": true, \"s\": \"\\u00e9\", \"e\": {}, \"f\": []}");
  BOOST_TEST(v.dump(Style::PythonCompact) ==
             "{\"a\":1,\"b\":[1.5,NaN,Infinity,-Infinity],\"c\":null,\"d\":true,\"s\":\"\\u00e9\",\"e\":{},\"f\":[]}");
  std::ostringstream os;
  os << JsonValue::array({1, "x"});
  BOOST_TEST(os.str() == "[1,\"x\"]");
}

BOOST_AUTO_TEST_CASE(dump_doubles_like_python_repr) {
  const std::vector<std::pair<double, std::string>> cases = {
      {0.0, "0.0"},          {-0.0, "-0.0"},          {1.0, "1.0"},
      {0.1, "0.1"},          {-2.5, "-2.5"},          {123.456, "123.456"},
      {1e15, "1000000000000000.0"}, {1e16, "1e+16"},  {1.5e16, "1.5e+16"},
      {1e22, "1e+22"},       {0.0001, "0.0001"},      {1e-05, "1e-05"},
      {2.5e-07, "2.5e-07"},  {5e-324, "5e-324"},      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {3.140625, "3.140625"}, {65504.0, "65504.0"},   {1.0 / 3.0, "0.3333333333333333"},
      {123456789012345680.0, "1.2345678901234568e+17"}, {0.30000000000000004, "0.30000000000000004"},
  };
  for (const auto& c : cases) {
    BOOST_TEST(JsonValue(c.first).dump() == c.second);
    BOOST_TEST(JsonValue::parse(c.second).as_double() == c.first);
  }
}

BOOST_AUTO_TEST_CASE(dump_string_escapes) {
  std::string s = std::string("q\"b\\n\n r\r t\t b\b f\f c\x01 del\x7f e\xc3\xa9 smile\xf0\x9f\x98\x80 nul") + '\0';
  BOOST_TEST(JsonValue(s).dump(Style::Python) ==
             "\"q\\\"b\\\\n\\n r\\r t\\t b\\b f\\f c\\u0001 del\\u007f e\\u00e9 smile\\ud83d\\ude00 nul\\u0000\"");
  BOOST_TEST(JsonValue(s).dump() ==
             "\"q\\\"b\\\\n\\n r\\r t\\t b\\b f\\f c\\u0001 del\x7f e\xc3\xa9 smile\xf0\x9f\x98\x80 nul\\u0000\"");
  BOOST_TEST(JsonValue::parse(JsonValue(s).dump(Style::Python)).as_string() == s);
  BOOST_TEST(JsonValue::parse(JsonValue(s).dump()).as_string() == s);
  // keys are escaped the same way
  BOOST_TEST(JsonValue::object({{"\xc3\xa9", 1}}).dump(Style::Python) == "{\"\\u00e9\": 1}");
  // invalid UTF-8 cannot be written as JSON text
  for (const char* bad : {"\xff", "\xc3", "\xed\xa0\x80" /* surrogate */, "\xc0\x80" /* overlong */, "\xf4\x90\x80\x80"}) {
    for (const std::string prefix : {"", "plain text before "}) {  // after a run of plain ASCII too
      td_test::check_throws<ValueError>([&] { JsonValue(prefix + bad).dump(); }, {"not valid UTF-8"});
      td_test::check_throws<ValueError>([&] { JsonValue(prefix + bad).dump(Style::Python); }, {"not valid UTF-8"});
    }
  }
  std::ostringstream os;
  os << JsonValue(std::string("\xff"));
  BOOST_TEST(os.str() == "<JsonValue with invalid UTF-8>");
}

BOOST_AUTO_TEST_CASE(dump_bytes_as_hex_object) {
  JsonValue b(JsonValue::Bytes{std::string("\x00\xff\x10", 3)});
  BOOST_TEST(b.is_bytes());
  BOOST_TEST(b.dump() == "{\"__bytes__\":\"00ff10\"}");
  BOOST_TEST(b.dump(Style::Python) == "{\"__bytes__\": \"00ff10\"}");
  // parsing keeps it an ordinary object
  JsonValue back = JsonValue::parse(b.dump());
  BOOST_TEST(back.is_object());
  BOOST_TEST(back.find("__bytes__")->as_string() == "00ff10");
}

BOOST_AUTO_TEST_CASE(round_trip_every_style) {
  JsonValue v = JsonValue::parse(
      "{\"ints\": [0, -1, 9223372036854775807, -9223372036854775808], \"f\": [0.5, 1e-300, -1e300, NaN, -Infinity],"
      " \"s\": [\"\", \"\\u20ac\", \"\\ud83d\\ude00\"], \"n\": {\"deep\": [[[{}]]]}, \"b\": [true, false, null]}");
  for (Style st : {Style::Compact, Style::Python, Style::PythonCompact}) BOOST_TEST(JsonValue::parse(v.dump(st)) == v);
}

BOOST_AUTO_TEST_SUITE_END()
