// SPDX-License-Identifier: Apache-2.0
// The one name lookup and refusal of option enums, against hand-written expectations.
#include "tangram/core/detail/enum_names.hpp"

#include <string_view>

#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/split_options.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {
enum class colour { red, green, blue };
constexpr std::string_view to_string(colour c) {
  return c == colour::red ? "red" : c == colour::green ? "green" : "blue";
}
constexpr colour all_colours[] = {colour::red, colour::green, colour::blue};
constexpr colour one_colour[]  = {colour::green};
}  // namespace

TEST_CASE("enum names: lookup, the listed choices and the refusal", "[enum_names]") {
  CHECK(detail::enum_named("green", all_colours) == colour::green);
  CHECK(detail::enum_named("blue", all_colours) == colour::blue);
  CHECK_FALSE(detail::enum_named("Green", all_colours).has_value());  // exact spelling only
  CHECK_FALSE(detail::enum_named("", all_colours).has_value());
  CHECK_FALSE(detail::enum_named("blue", one_colour).has_value());  // only among the listed
  CHECK(detail::enum_choices(all_colours) == "red, green or blue");
  CHECK(detail::enum_choices(one_colour) == "green");
  CHECK(detail::parse_enum("red", all_colours, "paint.colour", "colour") == colour::red);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      detail::parse_enum("mauve", all_colours, "paint.colour", "colour"),
      invalid_argument,
      "paint.colour: unknown colour \"mauve\" (expected red, green or blue)");
}

TEST_CASE("enum names: the plan's option parsers keep their messages", "[enum_names]") {
  CHECK(parse_grouping_scope("layer") == grouping_scope::layer);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_grouping_scope("galactic", "options.scope"),
      invalid_argument,
      "options.scope: unknown grouping scope \"galactic\" (expected adjacent, layer or global)");
  CHECK(parse_split_weighting("batch_share") == split_weighting::batch_share);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_split_weighting("even"),
      invalid_argument,
      "weighting: unknown split weighting \"even\" (expected budget or batch_share)");
}
