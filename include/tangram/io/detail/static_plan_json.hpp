// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/static_plan_json.hpp
 * @brief The parts of `tangram-static-plan/v1` shared by its writer and its reader
 * (io/static_plan.hpp): rules as JSON, the plan as a JSON tree, and the size arithmetic of the
 * file-size bound.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/plan_checks.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::detail {

inline json::value rule_to_json(head_rule const& r) {
  auto o = json::value::object();
  o.set("kind", to_string(r.kind));
  if (r.kind == layer_kind::compressed) {
    o.set("budget", r.budget);
    o.set("protect", r.protect);
  } else if (r.kind == layer_kind::sliding_window) {
    o.set("window", r.window);
  }
  return o;
}

/// Reads {"kind", "budget"?, "protect"?, "window"?} (budget only for compressed rules).
inline head_rule rule_from_json(json::node const& n) {
  head_rule r;
  r.kind = read_layer_kind(n["kind"]);
  if (r.kind == layer_kind::compressed) {
    auto b   = n["budget"];
    r.budget = b.as_double(-1e300, 1e300);
    if (!(r.budget > 0 && r.budget <= 1))
      b.fail(cat("budget must be in (0, 1], got ", b.describe()));
    r.protect = n["protect"].as_int(0, 2 * profile_limits::max_protected);
  } else if (r.kind == layer_kind::sliding_window) {
    r.window = static_cast<std::int32_t>(n["window"].as_int(1, model_limits::max_window));
  }
  return r;
}

inline json::value plan_to_json_value(static_plan const& p) {
  auto L = static_cast<std::size_t>(p.num_layers), H = static_cast<std::size_t>(p.num_kv_heads);
  TANGRAM_EXPECTS(p.num_layers >= 1 && p.num_kv_heads >= 1,
                  invalid_argument,
                  "static_plan: needs at least one layer and one KV head, got ",
                  p.num_layers,
                  " x ",
                  p.num_kv_heads);
  TANGRAM_EXPECTS(p.rules.size() == L * H,
                  invalid_argument,
                  "static_plan.rules: expected ",
                  L * H,
                  " entries (num_layers x num_kv_heads), got ",
                  p.rules.size());
  TANGRAM_EXPECTS(p.grouping.slots.size() == L * H,
                  invalid_argument,
                  "static_plan.grouping.slots: expected ",
                  L * H,
                  " entries, got ",
                  p.grouping.slots.size());
  TANGRAM_EXPECTS(p.splits.cta_begin.size() == L * (H + 1) && p.splits.phi.size() == L * H,
                  invalid_argument,
                  "static_plan.splits: expected ",
                  L * (H + 1),
                  " CTA boundaries and ",
                  L * H,
                  " weights, got ",
                  p.splits.cta_begin.size(),
                  " and ",
                  p.splits.phi.size());
  for (auto const& g : p.grouping.groups)
    TANGRAM_EXPECTS(
        !g.members.empty(), invalid_argument, "static_plan.grouping: a group has no members");

  auto v = json::value::object();
  v.set("format", "tangram-static-plan/v1");
  v.set("model", model_to_json(p.model));
  v.set("profile", json::parse(to_json(p.profile), "profile"));

  auto o = json::value::object();
  o.set("group_size", p.options.group_size);
  o.set("scope", to_string(p.options.scope));
  o.set("page_tokens", p.options.page_tokens);
  o.set("sm_count", p.options.split.limits.sm_count);
  o.set("ctas_per_sm", p.options.split.limits.ctas_per_sm);
  o.set("split_weighting", to_string(p.options.split.weighting));
  auto refs = json::value::array();
  for (auto n : p.options.split.reference_contexts) refs.push_back(n);
  o.set("reference_contexts", std::move(refs));
  o.set("reference_batch_size", p.options.split.reference_batch_size);
  o.set("reference_batches", p.options.split.reference_batches);
  o.set("share_quantile", p.options.split.share_quantile);
  o.set("tp_size", p.options.tp_size);
  o.set("tp_rank", p.options.tp_rank);
  if (p.options.layers) {  // a pipeline stage; absent: the whole model (files before stages)
    o.set("first_layer", p.options.layers->first);
    o.set("last_layer", p.options.layers->last);
  }
  auto reservation = json::value::object();
  reservation.set("mode", to_string(p.options.reservation.mode));
  reservation.set("margin", p.options.reservation.margin_or_default());
  reservation.set("keep_ratio_basis", to_string(p.options.reservation.basis));
  o.set("reservation", std::move(reservation));
  v.set("options", std::move(o));

  v.set("num_layers", p.num_layers);
  v.set("num_kv_heads", p.num_kv_heads);
  v.set("first_kv_head", p.first_kv_head);
  v.set("page_bytes", p.geometry.page_bytes());

  auto rules = json::value::array();
  for (std::size_t l = 0; l < L; ++l) {
    head_rule const& first = p.rules[l * H];
    auto row               = json::value::object();
    row.set("kind", to_string(first.kind));
    auto budgets = json::value::array();
    for (std::size_t h = 0; h < H; ++h) {
      head_rule const& r = p.rules[l * H + h];
      TANGRAM_EXPECTS(
          r.kind == first.kind && r.protect == first.protect && r.window == first.window,
          invalid_argument,
          "static_plan.rules: layer ",
          l,
          " head ",
          h,
          " is ",
          describe_rule(r),
          " but head 0 is ",
          describe_rule(first),
          "; the heads of a layer share kind, protect and window");
      budgets.push_back(r.budget);
    }
    if (first.kind == layer_kind::compressed) {
      row.set("protect", first.protect);
      row.set("budgets", std::move(budgets));
    } else if (first.kind == layer_kind::sliding_window) {
      row.set("window", first.window);
    }
    rules.push_back(std::move(row));
  }
  v.set("rules", std::move(rules));

  auto groups = json::value::array();
  for (auto const& g : p.grouping.groups) {
    auto go      = rule_to_json(g.rule);
    auto members = json::value::array();
    for (auto m : g.members) {
      auto pair = json::value::array();
      pair.push_back(m.layer);
      pair.push_back(m.head);
      members.push_back(std::move(pair));
    }
    go.set("members", std::move(members));
    groups.push_back(std::move(go));
  }
  v.set("groups", std::move(groups));

  auto slot_group = json::value::array(), slot_column = json::value::array();
  for (std::size_t l = 0; l < L; ++l) {
    auto gr = json::value::array(), co = json::value::array();
    for (std::size_t h = 0; h < H; ++h) {
      gr.push_back(p.grouping.slots[l * H + h].group);
      co.push_back(p.grouping.slots[l * H + h].column);
    }
    slot_group.push_back(std::move(gr));
    slot_column.push_back(std::move(co));
  }
  auto slots = json::value::object();
  slots.set("group", std::move(slot_group));
  slots.set("column", std::move(slot_column));
  v.set("slots", std::move(slots));

  auto splits = json::value::object();
  splits.set("num_ctas", p.splits.num_ctas());
  auto begins = json::value::array(), phis = json::value::array();
  for (std::size_t l = 0; l < L; ++l) {
    auto b = json::value::array(), f = json::value::array();
    for (std::size_t h = 0; h <= H; ++h) b.push_back(p.splits.cta_begin[l * (H + 1) + h]);
    for (std::size_t h = 0; h < H; ++h) f.push_back(p.splits.phi[l * H + h]);
    begins.push_back(std::move(b));
    phis.push_back(std::move(f));
  }
  splits.set("cta_begin", std::move(begins));
  splits.set("phi", std::move(phis));
  v.set("splits", std::move(splits));
  return v;
}

inline std::uint64_t decimal_digits(std::uint64_t x) {
  std::uint64_t n = 1;
  while (x >= 10) {
    x /= 10;
    ++n;
  }
  return n;
}

/// Bytes of `text` once nested one level deeper in a pretty-printed document (2 more spaces on
/// every line after the first).
inline std::uint64_t nested_bytes(std::string const& text) {
  std::uint64_t lines = 0;
  for (char c : text) lines += c == '\n';
  return text.size() + 2 * lines;
}

}  // namespace tangram::detail
