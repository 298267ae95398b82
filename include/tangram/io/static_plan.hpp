// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/static_plan.hpp
 * @brief Saving and loading a static plan as `tangram-static-plan/v1` JSON (docs/formats.md).
 *
 * The file holds everything a serving engine needs without re-planning: the model spec, the
 * budget profile, the options (Hp, scope, P, device limits, split weighting and reference
 * contexts, tensor-parallel size and rank, the pipeline stage's layer range when the plan is one
 * stage), the per-head rules, the head groups with their
 * members and the slot of every head, and the split map (CTA boundaries and the weights Phi).
 *
 * Loading reads every field, then checks the plan with the one consistency check of
 * plan/plan_checks.hpp (`detail::plan_fault`, which the KV-cache manager runs too), with errors
 * that name the file, the field path and the value: the rules must follow from the model and the
 * profile, the groups must cover every head of the rank exactly once with full, single-kind groups
 * sized by their largest member, the slots must agree with the groups, and every layer's CTA
 * shares must be at least one and sum to N_CTA. Saving runs the same check first, so a file on
 * disk always loads, and a plan the manager accepts is one whose file loads back unchanged.
 * Host only; pure functions.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/fields.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/detail/static_plan_json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/plan_checks.hpp"
#include "tangram/plan/split_options.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// @brief Bounds of a plan file, shared by the writer and the reader, so that every plan written
/// can be read back.
struct plan_file_limits {
  /// Largest plan file: `to_json` / `save_static_plan` refuse to produce more, `parse_static_plan`
  /// / `load_static_plan` refuse to read more.
  static constexpr std::size_t max_bytes = std::size_t{64} << 20;
  /// Largest value of `options.reference_contexts` (tokens): the split options' own cap.
  static constexpr std::int64_t max_reference_context = split_limits::max_reference_context;
};

/**
 * @brief An upper bound of the bytes `to_json` writes for the plan of (model, profile, options),
 * computed without building the plan: the model and the profile exactly, every other number at
 * its widest (a double in 24 characters, an integer in the digits of its largest possible value).
 * @throw invalid_argument when the model, the profile or the options are invalid.
 */
inline std::uint64_t plan_json_bound(model_spec const& model,
                                     budget_profile const& profile,
                                     plan_options const& o) {
  using detail::decimal_digits;
  model.validate();
  o.validate();
  TANGRAM_EXPECTS(model.num_kv_heads % o.tp_size == 0,
                  invalid_argument,
                  "plan_options.tp_size: must divide the model's ",
                  model.num_kv_heads,
                  " KV heads, got ",
                  o.tp_size);
  std::uint64_t L  = static_cast<std::uint64_t>(o.layers_of(model.num_layers).size());
  std::uint64_t H  = static_cast<std::uint64_t>(model.num_kv_heads / o.tp_size);
  std::uint64_t Hp = static_cast<std::uint64_t>(o.group_size);
  std::uint64_t G  = (L * H + Hp - 1) / Hp;
  std::uint64_t N  = static_cast<std::uint64_t>(o.split.limits.sm_count) *
                    static_cast<std::uint64_t>(o.split.limits.ctas_per_sm);
  constexpr std::uint64_t number = 24 + 2;  // widest shortest double, and ", "
  std::uint64_t bytes            = 4096;    // top level, options' names and small values
  bytes += detail::nested_bytes(detail::json::dump(detail::model_to_json(model)));
  bytes += detail::nested_bytes(to_json(profile));
  for (auto n : o.split.reference_contexts)
    bytes += decimal_digits(static_cast<std::uint64_t>(std::max<std::int64_t>(n, 0))) + 2;
  bytes += L * (128 + H * number);  // rules: one object per layer, a budget per head
  // groups: one object per group (kind, budget, protect, window), one [layer, head] per member
  bytes += G * 192 + G * Hp * (16 + decimal_digits(L) + decimal_digits(H));
  bytes += L * (32 + H * (decimal_digits(G) + decimal_digits(Hp) + 4));  // slots
  bytes += L * (32 + (H + 1) * (decimal_digits(N) + 2) + H * number);    // splits
  return bytes;
}

/**
 * @brief Refuses, before any planning work, a plan whose file could exceed
 * `plan_file_limits::max_bytes` (see `plan_json_bound`).
 * @throw invalid_argument naming the limit, the bound and the shape that drives it.
 */
inline void check_plan_file_size(model_spec const& model,
                                 budget_profile const& profile,
                                 plan_options const& o) {
  std::uint64_t bound = plan_json_bound(model, profile, o);
  TANGRAM_EXPECTS(bound <= plan_file_limits::max_bytes,
                  invalid_argument,
                  "static_plan: the plan file of ",
                  detail::quoted(model.name),
                  " (",
                  o.layers_of(model.num_layers).size(),
                  " layers x ",
                  model.num_kv_heads / o.tp_size,
                  " KV heads per rank, group size ",
                  o.group_size,
                  ") can take up to ",
                  bound,
                  " bytes, more than the plan file limit of ",
                  plan_file_limits::max_bytes,
                  " bytes; use a larger tensor-parallel size or group size");
}

/**
 * @brief Parses and validates `tangram-static-plan/v1` JSON text.
 * @param source name used in error messages (usually the file path)
 * @throw parse_error naming the source, the field path and the value (see the file comment for
 *        the invariants checked).
 */
inline static_plan parse_static_plan(std::string_view text, std::string_view source) {
  using detail::cat;
  namespace json = detail::json;
  json::parse_limits limits;
  limits.max_bytes = plan_file_limits::max_bytes;  // what the writer may produce
  detail::format_document file(text, source, "tangram-static-plan/v1", limits);
  auto const& doc = file.root;

  static_plan p;
  p.model = detail::model_from_json(doc["model"]);  // validate() failures arrive as parse_errors
  {
    auto prof = doc["profile"];
    prof.expect(json::kind::object);
    p.profile = parse_budget_profile(json::dump(prof.raw(), -1), cat(source, ": profile"));
  }

  auto o                = doc["options"];
  p.options.group_size  = detail::as_i32(o["group_size"], 1, 1024);
  p.options.page_tokens = detail::as_i32(o["page_tokens"], 1, 4096);
  {
    auto s     = o["scope"];
    auto scope = grouping_scope_named(s.as_string(32));
    if (!scope)
      s.fail(cat("unknown grouping scope ", s.describe(), " (expected adjacent, layer or global)"));
    p.options.scope = *scope;
  }
  p.options.split.limits.sm_count    = detail::as_i32(o["sm_count"], 1, 65536);
  p.options.split.limits.ctas_per_sm = detail::as_i32(o["ctas_per_sm"], 1, 64);
  {
    auto w         = o["split_weighting"];
    auto weighting = split_weighting_named(w.as_string(32));
    if (!weighting)
      w.fail(cat("unknown split weighting ", w.describe(), " (expected budget or batch_share)"));
    p.options.split.weighting = *weighting;
    auto refs                 = o["reference_contexts"];
    std::size_t n             = refs.expect_size_in(1, split_limits::max_reference_contexts);
    p.options.split.reference_contexts.clear();
    for (std::size_t i = 0; i < n; ++i)
      p.options.split.reference_contexts.push_back(
          refs[i].as_int(1, plan_file_limits::max_reference_context));
    p.options.split.reference_batch_size =
        detail::as_i32(o["reference_batch_size"], 1, split_limits::max_batch_size);
    p.options.split.reference_batches =
        detail::as_i32(o["reference_batches"], 1, split_limits::max_batches);
    p.options.split.share_quantile = o["share_quantile"].as_double(0, 1);
    try {
      p.options.split.validate();  // the bounds across fields (reference batches x batch size)
    } catch (invalid_argument const& e) {
      o.fail(e.what());
    }
  }
  p.options.tp_size = detail::as_i32(o["tp_size"], 1, 1024);
  p.options.tp_rank = detail::as_i32(o["tp_rank"], 0, p.options.tp_size - 1);
  if (p.model.num_kv_heads % p.options.tp_size != 0)
    o["tp_size"].fail(cat(
        "must divide the model's ", p.model.num_kv_heads, " KV heads, got ", p.options.tp_size));
  // A pipeline stage's layers [first_layer, last_layer); absent in files of the whole model
  // (and in every file written before pipeline stages): the whole model.
  {
    auto first = o.find("first_layer"), last = o.find("last_layer");
    if (first || last) {
      if (!first) o["first_layer"].fail("missing; a stage names both first_layer and last_layer");
      if (!last) o["last_layer"].fail("missing; a stage names both first_layer and last_layer");
      std::int32_t f   = detail::as_i32(*first, 0, p.model.num_layers - 1);
      std::int32_t l   = detail::as_i32(*last, f + 1, p.model.num_layers);
      p.options.layers = layer_range{f, l};
    }
  }
  auto const stage = p.options.layers_of(p.model.num_layers);  // checked above
  // Absent in files written before elastic reservation: those were static plans (their split
  // maps and budgets assume static), so a missing field means static, not the current default.
  p.options.reservation.mode   = reservation_mode::static_budgets;
  p.options.reservation.margin = default_elastic_margin;  // a built plan's margin is decided
  if (auto r = o.find("reservation")) {
    auto m    = (*r)["mode"];
    auto mode = reservation_mode_named(m.as_string(32));
    if (!mode)
      m.fail(cat("unknown reservation mode ", m.describe(), " (expected static or elastic)"));
    p.options.reservation.mode   = *mode;
    p.options.reservation.margin = (*r)["margin"].as_double(0, max_elastic_margin);
    auto b                       = (*r)["keep_ratio_basis"];
    auto basis                   = keep_ratio_basis_named(b.as_string(32));
    if (!basis)
      b.fail(cat("unknown keep ratio basis ",
                 b.describe(),
                 " (expected all_tokens or compressible_tokens)"));
    p.options.reservation.basis = *basis;
  }

  p.num_layers = detail::expect_derived(
      doc["num_layers"],
      stage.size(),
      p.options.layers ? "options.last_layer - first_layer" : "model.num_layers");
  p.first_layer      = stage.first;
  std::int32_t local = p.model.num_kv_heads / p.options.tp_size;
  p.num_kv_heads =
      detail::expect_derived(doc["num_kv_heads"], local, "model.num_kv_heads / tp_size");
  p.first_kv_head = detail::expect_derived(
      doc["first_kv_head"], std::int64_t{p.options.tp_rank} * local, "tp_rank x num_kv_heads");
  p.geometry = {p.options.page_tokens, p.options.group_size, p.model.head_dim, p.model.kv_dtype};
  if (auto pb = doc.find("page_bytes"))
    (void)detail::expect_derived(
        *pb, p.geometry.page_bytes(), "group_size x 2 x page_tokens x head_dim x sizeof(kv_dtype)");

  auto L = static_cast<std::size_t>(p.num_layers), H = static_cast<std::size_t>(p.num_kv_heads);

  // Rules, groups, slots and the split map as the file holds them; whether they are consistent
  // (with each other, the options, the model and the profile) is the plan check's to say, the
  // same check the manager runs (plan/plan_checks.hpp).
  auto any_i32 = [](json::node const& n) {
    return detail::as_i32(
        n, std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max());
  };
  {
    auto rows = doc["rules"];
    (void)rows.expect_size(L, "one per layer, num_layers");
    p.rules.resize(L * H);
    for (std::size_t l = 0; l < L; ++l) {
      auto row = rows[l];
      head_rule base;
      base.kind = detail::read_layer_kind(row["kind"]);
      if (base.kind == layer_kind::compressed) {
        base.protect = row["protect"].as_int(0, 2 * profile_limits::max_protected);
        auto b       = row["budgets"];
        (void)b.expect_size(H, "one per KV head of the rank, num_kv_heads");
        for (std::size_t h = 0; h < H; ++h) {
          p.rules[l * H + h]        = base;
          p.rules[l * H + h].budget = b[h].as_double(-1e300, 1e300);
        }
      } else {
        if (base.kind == layer_kind::sliding_window)
          base.window =
              static_cast<std::int32_t>(row["window"].as_int(1, model_limits::max_window));
        for (std::size_t h = 0; h < H; ++h) p.rules[l * H + h] = base;
      }
    }
  }
  p.grouping.group_size   = p.options.group_size;
  p.grouping.scope        = p.options.scope;
  p.grouping.num_layers   = p.num_layers;
  p.grouping.num_kv_heads = p.num_kv_heads;
  {
    auto groups = doc["groups"];
    for (std::size_t g = 0; g < groups.size(); ++g) {
      auto gn = groups[g];
      head_group grp;
      grp.rule     = detail::rule_from_json(gn);
      auto members = gn["members"];
      for (std::size_t c = 0; c < members.size(); ++c) {
        auto m = members[c];
        (void)m.expect_size(2, "[layer, head]");
        grp.members.push_back({any_i32(m[0]), any_i32(m[1])});
      }
      p.grouping.groups.push_back(std::move(grp));
    }
    auto slots  = doc["slots"];
    auto sgroup = slots["group"], scol = slots["column"];
    (void)sgroup.expect_size(L, "one row per layer, num_layers");
    (void)scol.expect_size(L, "one row per layer, num_layers");
    p.grouping.slots.resize(L * H);
    for (std::size_t l = 0; l < L; ++l) {
      auto gr = sgroup[l], co = scol[l];
      (void)gr.expect_size(H, "one per KV head of the rank, num_kv_heads");
      (void)co.expect_size(H, "one per KV head of the rank, num_kv_heads");
      for (std::size_t h = 0; h < H; ++h)
        p.grouping.slots[l * H + h] = {any_i32(gr[h]), any_i32(co[h])};
    }
  }
  {
    auto s                = doc["splits"];
    p.splits.num_layers   = p.num_layers;
    p.splits.num_kv_heads = p.num_kv_heads;
    p.splits.limits       = p.options.split.limits;
    (void)detail::expect_derived(s["num_ctas"], p.splits.num_ctas(), "sm_count x ctas_per_sm");
    auto begins = s["cta_begin"], phis = s["phi"];
    (void)begins.expect_size(L, "one row per layer, num_layers");
    (void)phis.expect_size(L, "one row per layer, num_layers");
    for (std::size_t l = 0; l < L; ++l) {
      auto b = begins[l], f = phis[l];
      (void)b.expect_size(H + 1, "num_kv_heads + 1 boundaries");
      (void)f.expect_size(H, "one per KV head of the rank, num_kv_heads");
      for (std::size_t h = 0; h <= H; ++h) p.splits.cta_begin.push_back(any_i32(b[h]));
      for (std::size_t h = 0; h < H; ++h) p.splits.phi.push_back(f[h].as_double(-1e300, 1e300));
    }
  }
  if (auto f = detail::plan_fault(p)) {
    std::string_view field = f->field;  // the file holds the grouping's fields at the top level
    if (field.substr(0, 9) == "grouping.") field.remove_prefix(9);
    TANGRAM_FAIL(parse_error, detail::printable(source), ": ", field, ": ", f->what);
  }
  return p;
}

/**
 * @brief Serialises a static plan as `tangram-static-plan/v1` JSON, after checking it as the
 * manager and a load do (`validate_plan`), then reading the text back.
 * @throw invalid_argument when the plan is inconsistent ("static_plan: <field>: ...") or its text
 *        exceeds `plan_file_limits::max_bytes` (message names the limit).
 */
inline std::string to_json(static_plan const& p) {
  validate_plan(p);
  std::string text = detail::json::dump(detail::plan_to_json_value(p));
  TANGRAM_EXPECTS(text.size() <= plan_file_limits::max_bytes,
                  invalid_argument,
                  "static_plan: the plan file would be ",
                  text.size(),
                  " bytes, more than the plan file limit of ",
                  plan_file_limits::max_bytes,
                  " bytes");
  (void)parse_static_plan(text, "static_plan");
  return text;
}

/// @brief Reads and validates a plan file; a file over `plan_file_limits::max_bytes` is refused
/// naming the limit. @throw parse_error / invalid_argument naming the path.
inline static_plan load_static_plan(std::string const& path) {
  return parse_static_plan(detail::read_file(path, plan_file_limits::max_bytes), path);
}

/// @brief Validates and writes a plan file (atomically). @throw invalid_argument naming the path.
inline void save_static_plan(static_plan const& p, std::string const& path) {
  detail::write_file(path, to_json(p));
}

/**
 * @brief The first difference between two plans, as "field: a vs b"; empty when they are equal.
 * Model specs and profiles compare by their JSON form (every serialised field); the rest field
 * by field.
 */
inline std::string plan_difference(static_plan const& a, static_plan const& b) {
  using detail::cat;
  namespace json = detail::json;
  if (json::dump(detail::model_to_json(a.model)) != json::dump(detail::model_to_json(b.model)))
    return "model";
  if (to_json(a.profile) != to_json(b.profile)) return "profile";
  auto const &oa = a.options, &ob = b.options;
  if (oa.group_size != ob.group_size)
    return cat("options.group_size: ", oa.group_size, " vs ", ob.group_size);
  if (oa.scope != ob.scope)
    return cat("options.scope: ", to_string(oa.scope), " vs ", to_string(ob.scope));
  if (oa.page_tokens != ob.page_tokens)
    return cat("options.page_tokens: ", oa.page_tokens, " vs ", ob.page_tokens);
  if (oa.split.limits.sm_count != ob.split.limits.sm_count ||
      oa.split.limits.ctas_per_sm != ob.split.limits.ctas_per_sm)
    return "options.split.limits";
  if (oa.split.weighting != ob.split.weighting) return "options.split.weighting";
  if (oa.split.reference_contexts != ob.split.reference_contexts)
    return "options.split.reference_contexts";
  if (oa.split.reference_batch_size != ob.split.reference_batch_size ||
      oa.split.reference_batches != ob.split.reference_batches)
    return cat("options.split.reference_batches: ",
               oa.split.reference_batches,
               " x ",
               oa.split.reference_batch_size,
               " vs ",
               ob.split.reference_batches,
               " x ",
               ob.split.reference_batch_size);
  if (oa.split.share_quantile != ob.split.share_quantile)
    return cat(
        "options.split.share_quantile: ", oa.split.share_quantile, " vs ", ob.split.share_quantile);
  if (oa.reservation.mode != ob.reservation.mode ||
      oa.reservation.margin_or_default() != ob.reservation.margin_or_default() ||
      oa.reservation.basis != ob.reservation.basis)
    return cat("options.reservation: ",
               to_string(oa.reservation.mode),
               " margin ",
               oa.reservation.margin_or_default(),
               " vs ",
               to_string(ob.reservation.mode),
               " margin ",
               ob.reservation.margin_or_default());
  if (oa.tp_size != ob.tp_size || oa.tp_rank != ob.tp_rank)
    return cat("options.tp: ", oa.tp_size, "/", oa.tp_rank, " vs ", ob.tp_size, "/", ob.tp_rank);
  if (oa.layers != ob.layers) {
    auto range = [](std::optional<layer_range> const& r) {
      return r ? cat("[", r->first, ", ", r->last, ")") : std::string("all");
    };
    return cat("options.layers: ", range(oa.layers), " vs ", range(ob.layers));
  }
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads ||
      a.first_layer != b.first_layer || a.first_kv_head != b.first_kv_head)
    return "shape (num_layers, num_kv_heads, first_layer, first_kv_head)";
  if (!(a.geometry == b.geometry)) return "geometry";
  if (a.rules.size() != b.rules.size()) return "rules: size";
  for (std::size_t i = 0; i < a.rules.size(); ++i)
    if (!(a.rules[i] == b.rules[i]))
      return cat("rules[",
                 i,
                 "]: ",
                 detail::describe_rule(a.rules[i]),
                 " vs ",
                 detail::describe_rule(b.rules[i]));
  auto const &ga = a.grouping, &gb = b.grouping;
  if (ga.group_size != gb.group_size || ga.scope != gb.scope || ga.num_layers != gb.num_layers ||
      ga.num_kv_heads != gb.num_kv_heads || ga.groups.size() != gb.groups.size())
    return "grouping: shape";
  for (std::size_t g = 0; g < ga.groups.size(); ++g) {
    if (!(ga.groups[g].rule == gb.groups[g].rule)) return cat("grouping.groups[", g, "].rule");
    if (!(ga.groups[g].members == gb.groups[g].members))
      return cat("grouping.groups[", g, "].members");
  }
  if (ga.slots.size() != gb.slots.size()) return "grouping.slots: size";
  for (std::size_t i = 0; i < ga.slots.size(); ++i)
    if (ga.slots[i].group != gb.slots[i].group || ga.slots[i].column != gb.slots[i].column)
      return cat("grouping.slots[", i, "]");
  if (a.splits.num_layers != b.splits.num_layers || a.splits.num_kv_heads != b.splits.num_kv_heads)
    return "splits: shape";
  if (a.splits.limits.sm_count != b.splits.limits.sm_count ||
      a.splits.limits.ctas_per_sm != b.splits.limits.ctas_per_sm)
    return "splits.limits";
  if (a.splits.cta_begin != b.splits.cta_begin) return "splits.cta_begin";
  if (a.splits.phi != b.splits.phi) return "splits.phi";
  return "";
}

}  // namespace tangram
