// SPDX-License-Identifier: Apache-2.0
#include "tangram/io/static_plan.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::bundled_profiles;
using tangram::test::data_path;
namespace json = tangram::detail::json;

namespace {

static_plan make_plan(std::string const& rel, plan_options o = {}, char const* model = nullptr) {
  auto s = load_retention_samples(data_path(rel));
  return build_static_plan(
      model_preset(model != nullptr ? model : s.model.c_str()), calibrate(s), o);
}

// Field-by-field comparison written here, independently of plan_difference.
void require_same(static_plan const& a, static_plan const& b) {
  CHECK(a.model.name == b.model.name);
  CHECK(a.model.num_layers == b.model.num_layers);
  CHECK(a.model.num_query_heads == b.model.num_query_heads);
  CHECK(a.model.num_kv_heads == b.model.num_kv_heads);
  CHECK(a.model.head_dim == b.model.head_dim);
  CHECK(a.model.kv_dtype == b.model.kv_dtype);
  CHECK(a.model.layers == b.model.layers);
  CHECK(a.model.attention_sinks == b.model.attention_sinks);
  CHECK(a.model.weight_bytes == b.model.weight_bytes);
  CHECK(a.profile.model == b.profile.model);
  CHECK(a.profile.scorer == b.profile.scorer);
  CHECK(a.profile.layer_ids == b.profile.layer_ids);
  CHECK(a.profile.budgets == b.profile.budgets);  // bit-exact doubles
  CHECK(a.profile.sink_tokens == b.profile.sink_tokens);
  CHECK(a.profile.window_tokens == b.profile.window_tokens);
  CHECK(a.profile.calibration.alpha == b.profile.calibration.alpha);
  CHECK(a.profile.calibration.floor == b.profile.calibration.floor);
  CHECK(a.options.group_size == b.options.group_size);
  CHECK(a.options.scope == b.options.scope);
  CHECK(a.options.page_tokens == b.options.page_tokens);
  CHECK(a.options.split.limits.sm_count == b.options.split.limits.sm_count);
  CHECK(a.options.split.limits.ctas_per_sm == b.options.split.limits.ctas_per_sm);
  CHECK(a.options.split.weighting == b.options.split.weighting);
  CHECK(a.options.split.reference_contexts == b.options.split.reference_contexts);
  CHECK(a.options.tp_size == b.options.tp_size);
  CHECK(a.options.tp_rank == b.options.tp_rank);
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.num_kv_heads == b.num_kv_heads);
  CHECK(a.first_kv_head == b.first_kv_head);
  CHECK(a.rules == b.rules);
  CHECK(a.geometry == b.geometry);
  REQUIRE(a.grouping.groups.size() == b.grouping.groups.size());
  for (std::size_t g = 0; g < a.grouping.groups.size(); ++g) {
    CHECK(a.grouping.groups[g].rule == b.grouping.groups[g].rule);
    CHECK(a.grouping.groups[g].members == b.grouping.groups[g].members);
  }
  REQUIRE(a.grouping.slots.size() == b.grouping.slots.size());
  for (std::size_t i = 0; i < a.grouping.slots.size(); ++i) {
    CHECK(a.grouping.slots[i].group == b.grouping.slots[i].group);
    CHECK(a.grouping.slots[i].column == b.grouping.slots[i].column);
  }
  CHECK(a.grouping.scope == b.grouping.scope);
  CHECK(a.grouping.group_size == b.grouping.group_size);
  CHECK(a.splits.cta_begin == b.splits.cta_begin);
  CHECK(a.splits.phi == b.splits.phi);
  CHECK(a.splits.num_ctas() == b.splits.num_ctas());
  CHECK(plan_difference(a, b).empty());
}

// Edits a member of a JSON document by path ("groups", 0, "members", 1, ...).
json::value& at(json::value& v, std::vector<std::string> const& path) {
  json::value* cur = &v;
  for (auto const& key : path) {
    if (cur->type() == json::kind::array) {
      cur = &cur->elements().at(std::stoul(key));
    } else {
      json::value* next = nullptr;
      for (auto& m : cur->members())
        if (m.first == key) next = &m.second;
      REQUIRE(next != nullptr);
      cur = next;
    }
  }
  return *cur;
}

// Parses `text`, applies `edit`, and expects loading to fail with every piece in the message.
void expect_rejected(std::string const& text,
                     std::function<void(json::value&)> const& edit,
                     std::vector<std::string> const& pieces) {
  auto doc = json::parse(text, "t");
  edit(doc);
  std::string edited = json::dump(doc);
  bool threw         = false;
  try {
    (void)parse_static_plan(edited, "plan.json");
  } catch (parse_error const& e) {
    threw           = true;
    std::string msg = e.what();
    INFO("message: " << msg);
    for (auto const& p : pieces) CHECK(msg.find(p) != std::string::npos);
  }
  CHECK(threw);
}

}  // namespace

TEST_CASE("static plans round-trip through JSON for every profile, scope and reservation",
          "[plan_io]") {
  for (auto const& rel : bundled_profiles()) {
    for (auto scope : {grouping_scope::adjacent, grouping_scope::layer, grouping_scope::global}) {
      for (auto mode : {reservation_mode::static_budgets, reservation_mode::elastic}) {
        INFO(rel << " " << to_string(scope) << " " << to_string(mode));
        plan_options o;
        o.scope            = scope;
        o.reservation.mode = mode;
        if (scope == grouping_scope::layer) o.split.weighting = split_weighting::budget;
        auto p    = make_plan("profiles/" + rel, o);
        auto text = to_json(p);
        auto q    = parse_static_plan(text, "mem");
        require_same(p, q);
        CHECK(q.options.reservation.mode == mode);
        CHECK(to_json(q) == text);  // stable
      }
    }
  }
}

TEST_CASE("the reservation mode round-trips, files without it are static, bad values are named",
          "[plan_io]") {
  plan_options o;
  o.reservation.mode   = reservation_mode::elastic;
  o.reservation.margin = 0.125;
  o.reservation.basis  = keep_ratio_basis::compressible_tokens;
  auto p               = make_plan("profiles/snapkv/llama-3.1-8b-instruct.json", o);
  auto text            = to_json(p);
  auto q               = parse_static_plan(text, "mem");
  CHECK(q.options.reservation.mode == reservation_mode::elastic);
  CHECK(q.options.reservation.margin == 0.125);
  CHECK(q.options.reservation.basis == keep_ratio_basis::compressible_tokens);
  CHECK(plan_difference(p, q).empty());
  plan_options so;
  so.reservation.mode = reservation_mode::static_budgets;
  auto s              = make_plan("profiles/snapkv/llama-3.1-8b-instruct.json", so);
  CHECK(plan_difference(p, s).find("options.reservation") != std::string::npos);
  // Elastic is the default, and a default plan's file says so.
  auto dflt =
      parse_static_plan(to_json(make_plan("profiles/snapkv/llama-3.1-8b-instruct.json")), "d");
  CHECK(dflt.options.reservation.mode == reservation_mode::elastic);
  CHECK(dflt.options.reservation.margin == default_elastic_margin);
  // A file from before elastic reservation (no "reservation") reads as static, what it was
  // written as, not as the current default.
  auto doc      = json::parse(text, "t");
  auto& options = at(doc, {"options"}).members();
  options.erase(
      std::remove_if(
          options.begin(), options.end(), [](auto const& m) { return m.first == "reservation"; }),
      options.end());
  auto old = parse_static_plan(json::dump(doc), "old.json");
  CHECK(old.options.reservation.mode == reservation_mode::static_budgets);
  expect_rejected(text,
                  [](json::value& d) {
                    at(d, {"options", "reservation", "mode"}) = json::value("dynamic");
                  },
                  {"options.reservation.mode", "dynamic", "static or elastic"});
  expect_rejected(text,
                  [](json::value& d) {
                    at(d, {"options", "reservation", "margin"}) = json::value(11.0);
                  },
                  {"options.reservation.margin", "11"});
  expect_rejected(text,
                  [](json::value& d) {
                    at(d, {"profile", "target_keep_ratio"}) = json::value(0.0);
                  },
                  {"elastic reservation needs", "target_keep_ratio"});
}

TEST_CASE("tensor-parallel plans and hybrid models round-trip through files", "[plan_io]") {
  auto dir = std::filesystem::path(TANGRAM_BINARY_DIR) / "test-tmp" / "plan_io";
  std::filesystem::create_directories(dir);
  struct cse {
    char const* rel;
    std::int32_t tp;
    std::int32_t hp;
  };
  for (auto c : {cse{"profiles/keydiff/llama-3.1-8b-instruct.json", 2, 4},
                 cse{"profiles/ea/qwen3-4b-instruct-2507.json", 4, 2},
                 cse{"derived/gemma-3-12b-it.derived.json", 2, 4},
                 cse{"derived/gpt-oss-20b.derived.json", 2, 4},
                 cse{"derived/qwen2.5-7b-instruct.derived.json", 2, 2}}) {
    for (std::int32_t rank = 0; rank < c.tp; ++rank) {
      INFO(c.rel << " tp " << c.tp << " rank " << rank);
      plan_options o;
      o.tp_size      = c.tp;
      o.tp_rank      = rank;
      o.group_size   = c.hp;
      o.split.limits = {100, 3};
      auto p         = make_plan(c.rel, o);
      CHECK(p.num_kv_heads == p.model.num_kv_heads / c.tp);
      CHECK(p.first_kv_head == rank * p.num_kv_heads);
      auto path = (dir / ("plan_" + std::to_string(rank) + ".json")).string();
      save_static_plan(p, path);
      auto q = load_static_plan(path);
      require_same(p, q);
      CHECK(q.options.tp_rank == rank);
      CHECK(q.options.tp_size == c.tp);
      // The rank's budgets are the profile's heads [first, first + local).
      for (std::int32_t l = 0; l < q.num_layers; ++l) {
        auto li = q.profile.layer_index(l);
        if (li < 0) continue;
        for (std::int32_t h = 0; h < q.num_kv_heads; ++h)
          CHECK(q.rule(l, h).budget ==
                q.profile.budget(static_cast<std::size_t>(li),
                                 static_cast<std::size_t>(q.first_kv_head + h)));
      }
    }
  }
}

TEST_CASE("a margin decided from samples round-trips exactly", "[plan_io]") {
  // The derived GPT-OSS-20B samples need more than the default margin; the plan decides a margin
  // that is no short decimal, and the file must give back the same double (plans are compared
  // and hashed by it).
  auto s = load_retention_samples(data_path("derived/gpt-oss-20b.derived.json"));
  auto p = build_static_plan(model_preset(s.model), calibrate(s), {}, s);
  REQUIRE(p.options.reservation.margin);
  CHECK(*p.options.reservation.margin == elastic_plan_margin(s, p));
  CHECK(*p.options.reservation.margin > default_elastic_margin);
  auto q = parse_static_plan(to_json(p), "mem");
  REQUIRE(q.options.reservation.margin);
  CHECK(*q.options.reservation.margin == *p.options.reservation.margin);
  require_same(p, q);
}

TEST_CASE("loading rejects inconsistent plans, naming the field", "[plan_io][errors]") {
  plan_options o;
  o.group_size = 4;  // groups of several heads: the member checks below need them
  o.tp_size    = 2;
  o.tp_rank    = 1;
  auto p       = make_plan("profiles/snapkv/llama-3.1-8b-instruct.json", o);
  auto text    = to_json(p);
  auto set     = [](std::vector<std::string> path, json::value v) {
    return [path, v](json::value& d) { at(d, path) = v; };
  };
  expect_rejected(
      text, set({"format"}, "tangram-static-plan/v0"), {"plan.json: format", "unsupported format"});
  expect_rejected(text,
                  set({"rules", "3", "budgets", "2"}, 0.5),
                  {"plan.json: rules[3]",
                   "head 2 is compressed (budget 0.5",
                   "the model and the profile give"});
  expect_rejected(
      text, set({"rules", "3", "kind"}, "uncompressed"), {"rules[3]", "head 0 is uncompressed"});
  expect_rejected(text,
                  [](json::value& d) {
                    at(d, {"groups", "0", "members", "1"}) = at(d, {"groups", "0", "members", "0"});
                  },
                  {"groups[0].members[1]", "already a member of groups[0]"});
  expect_rejected(text,
                  set({"groups", "2", "budget"}, 0.99),
                  {"plan.json: groups[2]", "is not the rule of its largest member"});
  expect_rejected(text,
                  set({"groups", "2", "members", "0", "1"}, 4),
                  {"plan.json: groups[2].members[0]", ", 4) out of range", "32 x 4"});
  expect_rejected(text,
                  [](json::value& d) { at(d, {"groups"}).elements().pop_back(); },
                  {"plan.json: groups", "31 groups of 4 heads", "128 heads"});
  expect_rejected(text,
                  [](json::value& d) {
                    auto& g = at(d, {"slots", "group", "0", "0"});
                    g       = (g.integer() + 1) % 32;
                  },
                  {"plan.json: slots", "head (0, 0) maps to (group "});
  expect_rejected(text,
                  set({"splits", "cta_begin", "0", "4"}, 263),
                  {"splits.cta_begin[0][4]", "must be N_CTA = 264"});
  expect_rejected(text,
                  set({"splits", "cta_begin", "0", "2"}, 5),
                  {"splits.cta_begin[0][2]", "every head keeps at least one CTA"});
  expect_rejected(
      text, set({"splits", "num_ctas"}, 100), {"splits.num_ctas", "sm_count x ctas_per_sm"});
  expect_rejected(
      text, set({"options", "tp_rank"}, 2), {"options.tp_rank", "must be in [0, 1], got 2"});
  expect_rejected(text,
                  set({"options", "tp_size"}, 3),
                  {"options.tp_size", "must divide the model's 8 KV heads"});
  expect_rejected(text,
                  set({"options", "scope"}, "galactic"),
                  {"options.scope", "unknown grouping scope \"galactic\""});
  expect_rejected(text,
                  set({"first_kv_head"}, 0),
                  {"first_kv_head", "must be 4 (tp_rank x num_kv_heads), got 0"});
  expect_rejected(
      text, set({"num_kv_heads"}, 8), {"num_kv_heads", "must be 4 (model.num_kv_heads / tp_size)"});
  expect_rejected(text, set({"page_bytes"}, 1), {"page_bytes", "must be 32768"});
  expect_rejected(text,
                  set({"profile", "budgets", "0", "0"}, 1.5),
                  {"plan.json: profile", "budgets[0][0]", "1.5"});
  expect_rejected(text,
                  set({"profile", "num_model_layers"}, 33),
                  {"plan.json: profile", "does not fit the model", "num_model_layers: 33"});
  expect_rejected(text, set({"model", "num_layers"}, 31), {"model.layers", "expected 31 elements"});
  // Syntax errors give a line and a column.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_static_plan(text.substr(0, text.size() / 2), "half.json"),
                                  parse_error,
                                  "half.json:",
                                  "invalid JSON");
  // Saving an inconsistent plan is refused too.
  auto bad                = p;
  bad.splits.cta_begin[1] = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      to_json(bad), invalid_argument, "static_plan.splits.cta_begin[0][1]");
  bad                               = p;
  bad.grouping.groups[0].members[0] = bad.grouping.groups[0].members[1];
  TANGRAM_REQUIRE_THROWS_WITH_ALL(to_json(bad),
                                  invalid_argument,
                                  "static_plan.grouping.groups[0].members[1]",
                                  "already a member");
  bad = p;
  bad.rules.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      to_json(bad), invalid_argument, "static_plan.rules: expected 128");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(load_static_plan("/nonexistent/plan.json"),
                                  invalid_argument,
                                  "cannot open",
                                  "/nonexistent/plan.json");
}

TEST_CASE("plan_difference names the first differing field", "[plan_io]") {
  auto p = make_plan("profiles/snapkv/qwen3-4b-instruct-2507.json");
  auto q = p;
  CHECK(plan_difference(p, q).empty());
  q.splits.phi[3] += 1e-9;
  CHECK(plan_difference(p, q) == "splits.phi");
  q = p;
  q.grouping.slots[5].column ^= 1;
  CHECK(plan_difference(p, q) == "grouping.slots[5]");
  q                    = p;
  q.profile.budgets[0] = 0.5;
  CHECK(plan_difference(p, q) == "profile");
}
