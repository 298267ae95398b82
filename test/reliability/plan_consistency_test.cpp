// SPDX-License-Identifier: Apache-2.0
// Issue 31, defect 1: the manager accepted in-memory plans that the plan file reader refuses (a
// head whose budget exceeds its group's rule let eviction write past the group's page list, into
// another request's pages). Now one check (plan/plan_checks.hpp) serves both. Checked here on the
// example, on its held-out variants, and as a property over randomly mutated plans: the manager
// accepts a plan exactly when the reader accepts its file and reads it back unchanged, and an
// accepted plan runs an operation storm on a host pool (every token's K/V written and read back,
// so a write into another sequence's pages is seen) without a violation.
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "storm/driver.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/plan_checks.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// "" when the manager accepts `p`, else its message (which must name the plan's field).
std::string manager_refusal(static_plan const& p) {
  host_memory_resource mr;
  try {
    kv_cache_manager m(p, mr, opts(64, 2));
    return "";
  } catch (invalid_argument const& e) {
    return e.what();
  }
}

/// "" when the reader accepts the file of `p` and reads back exactly `p`, else why not.
std::string reader_refusal(static_plan const& p) {
  try {
    auto text = detail::json::dump(detail::plan_to_json_value(p));
    auto back = parse_static_plan(text, "mutated.json");
    auto diff = plan_difference(p, back);
    return diff.empty() ? "" : "reads back a different plan: " + diff;
  } catch (invalid_argument const& e) {
    return e.what();
  }
}

std::size_t flat(static_plan const& p, head_ref m) {
  return static_cast<std::size_t>(m.layer) * static_cast<std::size_t>(p.num_kv_heads) +
         static_cast<std::size_t>(m.head);
}

/// A compressed group whose members do not all have its budget, and its member with the smallest.
std::pair<std::size_t, head_ref> smallest_member(static_plan const& p) {
  for (std::size_t g = 0; g < p.grouping.groups.size(); ++g) {
    auto const& grp = p.grouping.groups[g];
    if (grp.rule.kind != layer_kind::compressed) continue;
    head_ref lo = grp.members[0];
    for (auto m : grp.members)
      if (p.rules[flat(p, m)].budget < p.rules[flat(p, lo)].budget) lo = m;
    if (p.rules[flat(p, lo)].budget < grp.rule.budget) return {g, lo};
  }
  FAIL("no compressed group with a member below its rule");
  return {};
}

/// The plans the property starts from: static and elastic, every scope, a tensor-parallel rank,
/// a pipeline stage and a real profile (Llama-3.1-8B with 4-element f32 heads).
std::vector<std::pair<std::string, static_plan>> base_plans() {
  std::vector<std::pair<std::string, static_plan>> out;
  out.emplace_back("tiny-static-global-P4-Hp2", tiny_plan(tiny_budgets()));
  out.emplace_back(
      "tiny-elastic-adjacent-P3-Hp2",
      tiny_plan(tiny_budgets(), 3, 2, 7, grouping_scope::adjacent, elastic_reservation(0.15)));
  out.emplace_back("tiny-static-tp2-rank1", tiny_tp_plans()[1]);
  {
    auto p         = tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::layer);
    plan_options o = p.options;
    o.layers       = layer_range{1, 4};
    out.emplace_back("tiny-static-layer-stage1..3", build_static_plan(p.model, p.profile, o));
  }
  out.emplace_back("llama-small-heads-elastic-P16-Hp4",
                   real_plan(with_small_heads(model_preset("llama-3.1-8b")),
                             "profiles/snapkv/llama-3.1-8b-instruct.json",
                             16,
                             4,
                             grouping_scope::global,
                             1,
                             0,
                             elastic_reservation(0.15)));
  return out;
}

/// Re-derives what follows from other fields (rules, slots, group rules, geometry, shape) where it
/// can, so that mutations also produce consistent plans that differ from the planner's.
void fix_up(static_plan& p) {
  try {
    p.rules = head_rules_for(p.model, p.profile, p.options);
  } catch (invalid_argument const&) {
    return;
  }
  p.geometry = {p.options.page_tokens, p.options.group_size, p.model.head_dim, p.model.kv_dtype};
  auto& g    = p.grouping;
  for (std::size_t k = 0; k < g.groups.size(); ++k)
    for (std::size_t c = 0; c < g.groups[k].members.size(); ++c) {
      auto m = g.groups[k].members[c];
      // The grouping's own shape (a mutation may have changed the plan's or the grouping's).
      auto at = static_cast<std::size_t>(m.layer) * static_cast<std::size_t>(g.num_kv_heads) +
                static_cast<std::size_t>(m.head);
      if (m.layer < 0 || m.layer >= g.num_layers || m.head < 0 || m.head >= g.num_kv_heads ||
          at >= g.slots.size())
        return;
      g.slots[at] = {static_cast<std::int32_t>(k), static_cast<std::int32_t>(c)};
    }
  if (detail::grouping_fault(g) || g.num_kv_heads != p.num_kv_heads ||
      p.rules.size() != static_cast<std::size_t>(g.num_layers) * g.num_kv_heads)
    return;
  for (auto& grp : g.groups) grp.rule = detail::group_rule_of(grp.members, p.rules, p.num_kv_heads);
}

/// One random change to one field of `p`: values that keep it consistent, values that break it,
/// and values no plan may hold (negative, NaN, out of range, wrong sizes).
void mutate(static_plan& p, std::mt19937& rng) {
  auto pick                 = [&](std::size_t n) { return n == 0 ? std::size_t{0} : rng() % n; };
  auto coin                 = [&] { return rng() % 2 == 0; };
  double const odd_values[] = {1.0, 0.5, 0.999, 0.0, -0.25, 2.0, std::nan(""), 1e-9};
  auto odd                  = [&] { return odd_values[pick(std::size(odd_values))]; };
  switch (rng() % 24) {
    case 0:  // a head's budget (the example: one member set to 1.0)
      if (!p.rules.empty()) p.rules[pick(p.rules.size())].budget = odd();
      break;
    case 1:
      if (!p.rules.empty()) {
        auto& r = p.rules[pick(p.rules.size())];
        r.kind  = static_cast<layer_kind>((static_cast<int>(r.kind) + 1 + pick(2)) % 3);
      }
      break;
    case 2:
      if (!p.rules.empty()) p.rules[pick(p.rules.size())].protect += coin() ? 1 : -1;
      break;
    case 3:
      if (!p.rules.empty()) p.rules[pick(p.rules.size())].window += coin() ? 1 : -1;
      break;
    case 4:  // the profile's budget (with fix_up: rules and group rules follow)
      if (!p.profile.budgets.empty()) p.profile.budgets[pick(p.profile.budgets.size())] = odd();
      break;
    case 5:
      if (!p.grouping.groups.empty())
        p.grouping.groups[pick(p.grouping.groups.size())].rule.budget = odd();
      break;
    case 6:
      if (!p.grouping.groups.empty()) {
        auto& r = p.grouping.groups[pick(p.grouping.groups.size())].rule;
        r.protect += coin() ? 1 : -1;
      }
      break;
    case 7: {  // swap two members of two groups (kinds may differ)
      auto& gs = p.grouping.groups;
      if (gs.empty()) break;
      auto& a = gs[pick(gs.size())].members;
      auto& b = gs[pick(gs.size())].members;
      if (!a.empty() && !b.empty()) std::swap(a[pick(a.size())], b[pick(b.size())]);
      break;
    }
    case 8:
      if (!p.grouping.slots.empty()) {
        auto& s = p.grouping.slots[pick(p.grouping.slots.size())];
        (coin() ? s.group : s.column) += coin() ? 1 : -1;
      }
      break;
    case 9:
      switch (pick(4)) {
        case 0:
          p.geometry.page_tokens += coin() ? 1 : -1;
          break;
        case 1:
          p.geometry.group_size += coin() ? 1 : -1;
          break;
        case 2:
          p.geometry.head_dim *= 2;
          break;
        default:
          p.geometry.kv_dtype = p.geometry.kv_dtype == dtype::f32 ? dtype::bf16 : dtype::f32;
      }
      break;
    case 10:
      switch (pick(3)) {
        case 0:
          p.grouping.group_size += 1;
          break;
        case 1:
          p.grouping.scope =
              static_cast<grouping_scope>((static_cast<int>(p.grouping.scope) + 1) % 3);
          break;
        default:
          p.grouping.num_layers -= 1;
      }
      break;
    case 11:
      if (!p.splits.cta_begin.empty())
        p.splits.cta_begin[pick(p.splits.cta_begin.size())] += coin() ? 1 : -1;
      break;
    case 12:
      if (!p.splits.phi.empty())
        p.splits.phi[pick(p.splits.phi.size())] = coin() ? odd() * 7 : -odd();
      break;
    case 13:
      if (coin())
        p.splits.limits = {p.splits.limits.sm_count / 2, p.splits.limits.ctas_per_sm * 2};
      else
        p.splits.num_kv_heads += 1;
      break;
    case 14:
      switch (pick(4)) {
        case 0:
          p.num_layers += coin() ? 1 : -1;
          break;
        case 1:
          p.num_kv_heads += coin() ? 1 : -1;
          break;
        case 2:
          p.first_layer += 1;
          break;
        default:
          p.first_kv_head += coin() ? 1 : -1;
      }
      break;
    case 15:  // options the rules, geometry and grouping follow from
      switch (pick(5)) {
        case 0:
          p.options.page_tokens = coin() ? 8 : 0;
          break;
        case 1:
          p.options.group_size = coin() ? 4 : 0;
          break;
        case 2:
          p.options.tp_rank = (p.options.tp_rank + 1) % (p.options.tp_size + 1);
          break;
        case 3:
          p.options.scope = grouping_scope::adjacent;
          break;
        default:
          p.options.layers = layer_range{static_cast<std::int32_t>(pick(2)), p.model.num_layers};
      }
      break;
    case 16:  // options that change nothing else (valid) or are invalid
      switch (pick(5)) {
        case 0:
          p.options.reservation.margin = coin() ? 0.5 : -1.0;
          break;
        case 1:
          p.options.reservation.mode = p.options.reservation.mode == reservation_mode::elastic
                                           ? reservation_mode::static_budgets
                                           : reservation_mode::elastic;
          break;
        case 2:
          p.options.split.share_quantile = coin() ? 0.5 : std::nan("");
          break;
        case 3:
          p.options.split.reference_contexts = {coin() ? 2048 : 0};
          break;
        default:
          p.options.split.limits.sm_count = coin() ? 66 : 0;
      }
      break;
    case 17:
      p.profile.target_keep_ratio = coin() ? 0.0 : 0.3;
      break;
    case 18:
      switch (pick(3)) {
        case 0:
          if (!p.rules.empty()) p.rules.pop_back();
          break;
        case 1:
          if (!p.grouping.groups.empty()) p.grouping.groups.pop_back();
          break;
        default:
          if (!p.splits.phi.empty()) p.splits.phi.pop_back();
      }
      break;
    case 19:
      if (!p.grouping.groups.empty()) {
        auto& m = p.grouping.groups[pick(p.grouping.groups.size())].members;
        if (coin() && !m.empty())
          m[pick(m.size())] = {p.num_layers, 0};  // out of range
        else if (!m.empty())
          m[pick(m.size())] = m[pick(m.size())];  // a duplicate (or itself)
      }
      break;
    case 20:
      switch (pick(3)) {
        case 0:
          p.model.head_dim = 8;
          break;
        case 1:
          p.model.kv_dtype = dtype::bf16;
          break;
        default:
          p.model.num_kv_heads *= 2;
      }
      break;
    case 21:  // move one interior CTA boundary by one: often still valid
      if (p.num_kv_heads > 1 && !p.splits.cta_begin.empty()) {
        auto H = static_cast<std::size_t>(p.num_kv_heads);
        auto i = pick(static_cast<std::size_t>(p.num_layers)) * (H + 1) + 1 + pick(H - 1);
        if (i < p.splits.cta_begin.size()) p.splits.cta_begin[i] += coin() ? 1 : -1;
      }
      break;
    case 22:
      p.profile.sink_tokens += 1;
      break;
    default:
      if (!p.splits.phi.empty()) p.splits.phi[pick(p.splits.phi.size())] *= 3;
  }
}

}  // namespace

TEST_CASE("the manager refuses a plan whose head keeps more than its group's pages hold",
          "[regression][reliability][manager][plan]") {
  // The probe: one member of a compressed group raised to budget 1.0 in memory, its
  // group's rule (and so its page list) unchanged. It used to be accepted, and eviction wrote
  // through page-table entries past the list into another request's pages.
  for (auto const& [name, base] : base_plans()) {
    INFO(name);
    auto [g, m]                      = smallest_member(base);
    auto plan                        = base;
    plan.rules[flat(plan, m)].budget = 1.0;
    auto field                       = detail::cat("rules[", m.layer, "]");
    TANGRAM_REQUIRE_THROWS_WITH_ALL(validate_plan(plan),
                                    invalid_argument,
                                    "static_plan." + field,
                                    detail::cat("head ", m.head, " is compressed (budget 1,"),
                                    std::string("the model and the profile give"));
    CHECK(manager_refusal(plan).find("static_plan." + field) == 0);
    CHECK(reader_refusal(plan).find("mutated.json: " + field) == 0);

    // Held out: the profile says 1.0 too (rules agree with it), the group's rule does not.
    plan    = base;
    auto li = plan.profile.layer_index(plan.first_layer + m.layer);
    REQUIRE(li >= 0);
    plan.profile.budgets[static_cast<std::size_t>(li) *
                             static_cast<std::size_t>(plan.profile.num_kv_heads) +
                         static_cast<std::size_t>(plan.first_kv_head + m.head)] = 1.0;
    plan.rules = head_rules_for(plan.model, plan.profile, plan.options);
    auto group = detail::cat("grouping.groups[", g, "]");
    CHECK(manager_refusal(plan).find("static_plan." + group + ": rule ") == 0);
    CHECK(manager_refusal(plan).find("is not the rule of its largest member") != std::string::npos);
    CHECK(reader_refusal(plan).find(detail::cat("mutated.json: groups[", g, "]: rule ")) == 0);
    // ... and once the group's rule follows, the plan is consistent and accepted by both.
    plan.grouping.groups[g].rule =
        detail::group_rule_of(plan.grouping.groups[g].members, plan.rules, plan.num_kv_heads);
    CHECK(manager_refusal(plan) == "");
    CHECK(reader_refusal(plan) == "");

    // Held out: the group's rule lowered below its largest member's.
    plan                                = base;
    plan.grouping.groups[g].rule.budget = plan.rules[flat(plan, m)].budget;
    CHECK(manager_refusal(plan).find("is not the rule of its largest member") != std::string::npos);
  }
}

TEST_CASE("the manager and the plan reader accept exactly the same mutated plans",
          "[reliability][manager][plan][plan_io]") {
  std::mt19937 rng(3101);
  std::int64_t accepted = 0, refused = 0, storms = 0;
  for (auto const& [name, base] : base_plans()) {
    std::int64_t storms_here = 0;
    for (int trial = 0; trial < 400; ++trial) {
      auto p = base;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutate(p, rng);
      if (rng() % 3 == 0) fix_up(p);
      auto by_manager = manager_refusal(p);
      auto by_reader  = reader_refusal(p);
      INFO(name << " trial " << trial << "\nmanager: " << by_manager << "\nreader: " << by_reader);
      REQUIRE(by_manager.empty() == by_reader.empty());
      if (!by_manager.empty()) {
        ++refused;
        CHECK(by_manager.rfind("static_plan.", 0) == 0);  // names the plan's field
        continue;
      }
      ++accepted;
      // An accepted plan keeps every sequence's tokens: a short storm on a host pool.
      if (storms_here >= 3) continue;
      auto cfg = p.options.reservation.mode == reservation_mode::elastic
                     ? make_elastic_storm_config(name, p, true, 4, 4, 40, 16, 8)
                     : make_storm_config(name, p, true, 4, 4, 40, 16, 16);
      storm s(cfg, 7 + static_cast<std::uint64_t>(trial), 1);
      for (int i = 0; i < 150; ++i) s.step();
      s.finish();
      ++storms_here;
    }
    storms += storms_here;
  }
  INFO("accepted " << accepted << " refused " << refused << " storms " << storms);
  CHECK(accepted > 100);  // consistent variants were generated, not only broken ones
  CHECK(refused > 1000);
  CHECK(storms >= 10);
}
