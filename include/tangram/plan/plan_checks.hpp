// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/plan_checks.hpp
 * @brief The one consistency check of a static plan, used by everything that accepts a plan: the
 * KV-cache manager (memory/detail/manager_checks.hpp), the plan file reader and writer
 * (io/static_plan.hpp). A plan the manager accepts is exactly a plan whose file the reader accepts
 * and reads back unchanged.
 *
 * A plan is consistent when:
 * - its options are valid (plan_options, split_options) and its tensor-parallel size divides the
 *   model's KV heads; the model and the profile are valid and fit each other; an elastic plan's
 *   profile has a keep ratio in (0, 1];
 * - its shape follows from the options: num_layers and first_layer from the stage's layers,
 *   num_kv_heads and first_kv_head from the rank, the page geometry from the options and the model;
 * - its rules are `head_rules_for(model, profile, options)`, head for head;
 * - its grouping has the options' group size and scope and the plan's shape, is one bijection
 *   between heads and the cells of full groups (`detail::grouping_fault`), every group holds
 *   heads of one kind (kind, protect, window) and its rule is the rule of its largest member
 *   (`detail::group_rule_of`), the rule its pages are sized by;
 * - its split map has the plan's shape and the options' device limits, N_CTA of at least one CTA
 *   per head, boundaries from 0 to N_CTA giving every head at least one CTA, and finite weights
 *   >= 0.
 * A head whose rule exceeds its group's would make the group's pages too short for the tokens the
 * manager lets it keep (another sequence's pages would be overwritten), which is why the manager
 * checks all of it. Host only; pure functions; O(layers x heads).
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/core/detail/str.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {
namespace detail {

/// A rule in words: "compressed (budget 0.5, protect 36)", "sliding_window (window 128)".
inline std::string describe_rule(head_rule const& r) {
  switch (r.kind) {
    case layer_kind::compressed:
      return cat("compressed (budget ", r.budget, ", protect ", r.protect, ")");
    case layer_kind::sliding_window:
      return cat("sliding_window (window ", r.window, ")");
    case layer_kind::uncompressed:
      return "uncompressed";
  }
  return "?";
}

/**
 * @brief The first inconsistency of `p` (the file comment lists the checks, in their order): the
 * field's path in the struct (`rules[3]`, `grouping.groups[2].members[0]`, `grouping.slots`,
 * `splits.cta_begin[0][4]`, `options.tp_size`, `geometry.group_size`; the plan file spells the
 * grouping's fields without `grouping.`) and what is wrong; nullopt when the plan is consistent.
 */
inline std::optional<field_fault> plan_fault(static_plan const& p) {
  auto fault = [](std::string field, std::string what) {
    return std::optional<field_fault>(field_fault{std::move(field), std::move(what)});
  };
  // A check that throws (the parts' own validate()), as a fault of `field`.
  auto failed = [&fault](char const* field, auto&& check, char const* prefix = "") {
    try {
      check();
    } catch (invalid_argument const& e) {
      return fault(field, cat(prefix, e.what()));
    }
    return std::optional<field_fault>();
  };
  // A part made for `layers` x `heads` heads, not the plan's shape, as a fault of `field`: what
  // says `before`, its shape, `after`, the plan's.
  auto other_shape = [&p, &fault](char const* field,
                                  std::int32_t layers,
                                  std::int32_t heads,
                                  char const* before,
                                  char const* after) {
    if (layers == p.num_layers && heads == p.num_kv_heads) return std::optional<field_fault>();
    return fault(field,
                 cat(before, layers, " x ", heads, after, p.num_layers, " x ", p.num_kv_heads));
  };
  auto const& o = p.options;
  if (auto f = failed("options", [&] {
        o.validate();
        o.split.validate();
      }))
    return f;
  if (auto f = failed("model", [&] { p.model.validate(); })) return f;
  if (p.model.num_kv_heads % o.tp_size != 0)
    return fault(
        "options.tp_size",
        cat("must divide the model's ", p.model.num_kv_heads, " KV heads, got ", o.tp_size));
  layer_range stage;
  std::vector<head_rule> expected;
  if (auto f = failed("options", [&] { stage = o.layers_of(p.model.num_layers); })) return f;
  if (auto f = failed("profile", [&] { p.profile.validate(); })) return f;
  if (auto f = failed(
          "profile",
          [&] { expected = head_rules_for(p.model, p.profile, o); },
          "does not fit the model: "))
    return f;
  if (o.reservation.mode == reservation_mode::elastic &&
      !(p.profile.target_keep_ratio > 0 && p.profile.target_keep_ratio <= 1))
    return fault("options.reservation.mode",
                 cat("elastic reservation needs the profile's target_keep_ratio in (0, 1], got ",
                     p.profile.target_keep_ratio));

  // The shape, from the options and the model.
  std::int32_t local = p.model.num_kv_heads / o.tp_size;
  if (p.num_layers != stage.size())
    return fault("num_layers",
                 cat("must be ",
                     stage.size(),
                     o.layers ? " (options.last_layer - first_layer)" : " (model.num_layers)",
                     ", got ",
                     p.num_layers));
  if (p.first_layer != stage.first)
    return fault("first_layer",
                 cat("must be ", stage.first, " (options.first_layer), got ", p.first_layer));
  if (p.num_kv_heads != local)
    return fault("num_kv_heads",
                 cat("must be ", local, " (model.num_kv_heads / tp_size), got ", p.num_kv_heads));
  if (std::int64_t{p.first_kv_head} != std::int64_t{o.tp_rank} * local)
    return fault("first_kv_head",
                 cat("must be ",
                     std::int64_t{o.tp_rank} * local,
                     " (tp_rank x num_kv_heads), got ",
                     p.first_kv_head));
  if (auto f = failed("geometry", [&] { p.geometry.validate(); })) return f;
  if (p.geometry.page_tokens != o.page_tokens)
    return fault("geometry.page_tokens",
                 cat(p.geometry.page_tokens, " differs from options.page_tokens ", o.page_tokens));
  if (p.geometry.group_size != o.group_size)
    return fault("geometry.group_size",
                 cat(p.geometry.group_size,
                     " differs from the grouping's ",
                     o.group_size,
                     " (options.group_size)"));
  if (p.geometry.head_dim != p.model.head_dim || p.geometry.kv_dtype != p.model.kv_dtype)
    return fault("geometry.head_dim",
                 cat(p.geometry.head_dim,
                     " x ",
                     to_string(p.geometry.kv_dtype),
                     " differs from the model's ",
                     p.model.head_dim,
                     " x ",
                     to_string(p.model.kv_dtype),
                     " (head_dim, kv_dtype)"));

  // The rules: what the model and the profile say.
  auto L = static_cast<std::size_t>(p.num_layers), H = static_cast<std::size_t>(p.num_kv_heads);
  if (p.rules.size() != L * H)
    return fault(
        "rules",
        cat("expected ", L * H, " entries (num_layers x num_kv_heads), got ", p.rules.size()));
  for (std::size_t i = 0; i < L * H; ++i)
    if (!(p.rules[i] == expected[i]))
      return fault(cat("rules[", i / H, "]"),
                   cat("head ",
                       i % H,
                       " is ",
                       describe_rule(p.rules[i]),
                       " but the model and the profile give ",
                       describe_rule(expected[i])));

  // The groups: a bijection over the plan's heads, one kind each, sized by the largest member.
  auto const& g = p.grouping;
  if (g.group_size != o.group_size)
    return fault("grouping.group_size",
                 cat("must be options.group_size = ", o.group_size, ", got ", g.group_size));
  if (g.scope != o.scope)
    return fault("grouping.scope",
                 cat("must be options.scope = ", to_string(o.scope), ", got ", to_string(g.scope)));
  if (auto f = other_shape("grouping.num_layers",
                           g.num_layers,
                           g.num_kv_heads,
                           "the grouping's ",
                           " heads must be the plan's "))
    return f;
  if (auto f = grouping_fault(g)) return fault("grouping." + f->field, f->what);
  for (std::size_t k = 0; k < g.groups.size(); ++k) {
    auto const& grp     = g.groups[k];
    head_rule const& r0 = p.rule(grp.members[0].layer, grp.members[0].head);
    for (std::size_t c = 1; c < grp.members.size(); ++c) {
      auto m             = grp.members[c];
      head_rule const& r = p.rule(m.layer, m.head);
      if (r.kind != r0.kind || r.window != r0.window || r.protect != r0.protect)
        return fault(cat("grouping.groups[", k, "].members[", c, "]"),
                     cat("head (",
                         m.layer,
                         ", ",
                         m.head,
                         ") is ",
                         describe_rule(r),
                         ", unlike the group's first member, ",
                         describe_rule(r0),
                         "; a group holds heads of one kind"));
    }
    head_rule sized = group_rule_of(grp.members, p.rules, p.num_kv_heads);
    if (!(grp.rule == sized))
      return fault(cat("grouping.groups[", k, "]"),
                   cat("rule ",
                       describe_rule(grp.rule),
                       " is not the rule of its largest member, ",
                       describe_rule(sized)));
  }

  // The split map: the plan's shape and device, at least one CTA per head.
  auto const& s = p.splits;
  if (auto f = other_shape(
          "splits", s.num_layers, s.num_kv_heads, "planned for ", " heads, not the plan's "))
    return f;
  if (s.limits.sm_count != o.split.limits.sm_count ||
      s.limits.ctas_per_sm != o.split.limits.ctas_per_sm)
    return fault("splits.limits",
                 cat("planned for ",
                     s.limits.sm_count,
                     " SMs x ",
                     s.limits.ctas_per_sm,
                     " CTAs, not the options' ",
                     o.split.limits.sm_count,
                     " x ",
                     o.split.limits.ctas_per_sm));
  std::int64_t N = s.num_ctas();
  if (N < p.num_kv_heads)
    return fault("splits.num_ctas",
                 cat("N_CTA = ",
                     N,
                     " is smaller than the ",
                     p.num_kv_heads,
                     " KV heads of a layer; every head needs at least one CTA"));
  if (s.cta_begin.size() != L * (H + 1) || s.phi.size() != L * H)
    return fault("splits",
                 cat("expected ",
                     L * (H + 1),
                     " CTA boundaries (num_layers x (num_kv_heads + 1)) and ",
                     L * H,
                     " weights (num_layers x num_kv_heads), got ",
                     s.cta_begin.size(),
                     " and ",
                     s.phi.size()));
  for (std::size_t l = 0; l < L; ++l) {
    for (std::size_t h = 0; h <= H; ++h) {
      std::int64_t x  = s.cta_begin[l * (H + 1) + h];
      std::int64_t lo = h == 0 ? 0 : h == H ? N : s.cta_begin[l * (H + 1) + h - 1] + 1;
      std::int64_t hi = h == 0 ? 0 : N - static_cast<std::int64_t>(H - h);  // H - h heads after
      if (x >= lo && x <= hi) continue;
      return fault(cat("splits.cta_begin[", l, "][", h, "]"),
                   h == 0   ? cat("the first boundary must be 0, got ", x)
                   : h == H ? cat("the last boundary must be N_CTA = ", N, ", got ", x)
                            : cat("must be in [",
                                  lo,
                                  ", ",
                                  hi,
                                  "] (every head keeps at least one CTA), got ",
                                  x));
    }
    for (std::size_t h = 0; h < H; ++h) {
      double x = s.phi[l * H + h];
      if (!(std::isfinite(x) && x >= 0))
        return fault(cat("splits.phi[", l, "][", h, "]"), cat("must be finite and >= 0, got ", x));
    }
  }
  return std::nullopt;
}

}  // namespace detail

/**
 * @brief Checks that `plan` is consistent (the file comment lists every check): the check the
 * KV-cache manager runs on its plan and the plan file writer runs before writing.
 * @throw invalid_argument "static_plan.<field>: <what>", naming the field and the values.
 */
inline void validate_plan(static_plan const& plan) {
  if (auto f = detail::plan_fault(plan))
    TANGRAM_FAIL(invalid_argument, "static_plan.", f->field, ": ", f->what);
}

}  // namespace tangram
