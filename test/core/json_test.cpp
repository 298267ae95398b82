// SPDX-License-Identifier: Apache-2.0
#include "tangram/io/detail/json.hpp"

#include <cmath>

#include "test_support.hpp"

using namespace tangram::detail::json;

TEST_CASE("json parses every kind of value and keeps member order", "[json]") {
  auto v = parse(R"( {"b": [1, -2, 3.5, 1e3, true, false, null], "a": "x\ty\u00e9\ud83d\ude00", "c": {}} )", "t");
  REQUIRE(v.type() == kind::object);
  REQUIRE(v.members().size() == 3);
  CHECK(v.members()[0].first == "b");
  CHECK(v.members()[1].first == "a");
  auto const& b = v.find("b")->elements();
  REQUIRE(b.size() == 7);
  CHECK(b[0].is_integer());
  CHECK(b[0].integer() == 1);
  CHECK(b[1].integer() == -2);
  CHECK_FALSE(b[2].is_integer());
  CHECK(b[2].number() == 3.5);
  CHECK(b[3].number() == 1000.0);
  CHECK_FALSE(b[3].is_integer());
  CHECK(b[4].boolean());
  CHECK_FALSE(b[5].boolean());
  CHECK(b[6].is_null());
  CHECK(v.find("a")->string() == "x\ty\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.find("c")->members().empty());
  CHECK(v.find("zzz") == nullptr);
}

TEST_CASE("json dump reads back to the same document", "[json]") {
  auto doc = value::object();
  doc.set("pi", 3.141592653589793);
  doc.set("tiny", 1e-300);
  doc.set("big", std::int64_t{9007199254740993});
  doc.set("s", "quote\" backslash\\ newline\n ctrl\x01");
  auto arr = value::array();
  for (int i = 0; i < 5; ++i) arr.push_back(i * 0.1);
  doc.set("arr", arr);
  auto nested = value::array();
  nested.push_back(arr);
  nested.push_back(value::object());
  doc.set("nested", nested);
  for (int indent : {-1, 0, 2}) {
    std::string text = dump(doc, indent);
    auto back        = parse(text, "roundtrip");
    CHECK(dump(back, indent) == text);
    CHECK(back.find("pi")->number() == 3.141592653589793);
    CHECK(back.find("tiny")->number() == 1e-300);
    CHECK(back.find("big")->integer() == 9007199254740993);
    CHECK(back.find("s")->string() == "quote\" backslash\\ newline\n ctrl\x01");
    CHECK(back.find("arr")->elements()[3].number() == 0.30000000000000004);
  }
}

TEST_CASE("json accepts NaN and Infinity so validation can name them", "[json]") {
  auto v = parse("[NaN, Infinity, -Infinity, 1e999, -1e999]", "t");
  auto const& e = v.elements();
  CHECK(std::isnan(e[0].number()));
  CHECK(e[1].number() == HUGE_VAL);
  CHECK(e[2].number() == -HUGE_VAL);
  CHECK(e[3].number() == HUGE_VAL);
  CHECK(e[4].number() == -HUGE_VAL);
}

TEST_CASE("json syntax errors name the source, line and column", "[json][errors]") {
  using tangram::parse_error;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("{\n  \"a\": 1,\n  \"b\" 2\n}", "f.json"), parse_error,
                                  "f.json:3:7:", "expected ':'");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[1, 2", "x"), parse_error, "x:1:6:", "unterminated array");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("{\"a\":1,\"a\":2}", "x"), parse_error, "duplicate member \"a\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[01]", "x"), parse_error, "leading zeros");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[1.]", "x"), parse_error, "decimal point");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("\"abc", "x"), parse_error, "unterminated string");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("\"\\ud800\"", "x"), parse_error, "surrogate");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[1] 2", "x"), parse_error, "after the JSON value");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("", "x"), parse_error, "unexpected end of input");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[tru]", "x"), parse_error, "unexpected character \"t\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("\"a\x01\"", "x"), parse_error, "control character");
}

TEST_CASE("json enforces depth, size and element limits", "[json][errors]") {
  using tangram::parse_error;
  std::string deep(100, '[');
  deep += std::string(100, ']');
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse(deep, "x"), parse_error, "nesting deeper than 64");
  parse_limits small;
  small.max_bytes = 10;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[1,2,3,4,5,6]", "x", small), parse_error, "13 bytes", "limit of 10");
  parse_limits few;
  few.max_elements = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse("[1,2,3]", "x", few), parse_error, "more than 3 values");
  CHECK_NOTHROW(parse("[1,2]", "x", few));
}

TEST_CASE("json node reports field paths and values", "[json][errors]") {
  using tangram::parse_error;
  auto v = parse(R"({"a": {"b": [1, 2.5, -3, "s", NaN]}, "flag": 1})", "doc.json");
  node root(v, "doc.json");
  auto b = root["a"]["b"];
  CHECK(b.size() == 5);
  CHECK(b[0].as_int(0, 10) == 1);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b[1].as_int(0, 10), parse_error, "doc.json: a.b[1]: expected an integer, got 2.5");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b[2].as_int(0, 10), parse_error, "a.b[2]: must be in [0, 10], got -3");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b[3].as_double(0, 1), parse_error, "a.b[3]: expected a number, got \"s\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b[4].as_double(0, 1), parse_error, "a.b[4]: expected a number, got NaN");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(root["a"]["zz"], parse_error, "a.zz: missing required field");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(root["flag"].as_bool(), parse_error, "flag: expected a boolean, got 1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b.expect_size(3, "three"), parse_error, "a.b: expected 3 elements (three), got 5");
  CHECK_FALSE(root.find("missing").has_value());
  CHECK(b[2].as_int(-5, 5) == -3);
}
