// SPDX-License-Identifier: Apache-2.0
// Plan options (every field of plan_options), building, saving and inspecting a static plan.
// Enumerations are their lower-case names, parsed by the library (errors name the field).
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/pipeline_stages.hpp"

namespace nb = nanobind;

namespace tangram::python {

namespace {

reservation_mode reservation_from(std::string const& name) {
  auto r = reservation_mode_named(name);
  TANGRAM_EXPECTS(r.has_value(), invalid_argument, "PlanOptions.reservation: unknown mode ",
                  detail::quoted(name), " (expected static or elastic)");
  return *r;
}

keep_ratio_basis basis_from(std::string const& name) {
  auto b = keep_ratio_basis_named(name);
  TANGRAM_EXPECTS(b.has_value(), invalid_argument, "PlanOptions.basis: unknown basis ",
                  detail::quoted(name), " (expected all_tokens or compressible_tokens)");
  return *b;
}

using range_pair = std::pair<std::int32_t, std::int32_t>;

std::vector<layer_range> ranges_from(std::vector<range_pair> const& v) {
  std::vector<layer_range> out;
  for (auto [first, last] : v) out.push_back({first, last});
  return out;
}

std::vector<range_pair> pairs_from(std::vector<layer_range> const& v) {
  std::vector<range_pair> out;
  for (auto r : v) out.emplace_back(r.first, r.last);
  return out;
}

}  // namespace

void bind_plan(nb::module_& m) {
  nb::class_<plan_options>(m, "PlanOptions", "Every option of a static plan (plan_options).")
      .def(nb::init<>())
      .def_rw("group_size", &plan_options::group_size, "Hp: heads per page")
      .def_prop_rw("scope",
                   [](plan_options const& o) { return std::string(to_string(o.scope)); },
                   [](plan_options& o, std::string const& v) {
                     o.scope = parse_grouping_scope(v, "PlanOptions.scope");
                   },
                   "\"adjacent\", \"layer\" or \"global\"")
      .def_rw("page_tokens", &plan_options::page_tokens, "P: tokens per page")
      .def_prop_rw("sm_count", [](plan_options const& o) { return o.split.limits.sm_count; },
                   [](plan_options& o, std::int32_t v) { o.split.limits.sm_count = v; })
      .def_prop_rw("ctas_per_sm", [](plan_options const& o) { return o.split.limits.ctas_per_sm; },
                   [](plan_options& o, std::int32_t v) { o.split.limits.ctas_per_sm = v; })
      .def_prop_rw("weighting",
                   [](plan_options const& o) { return std::string(to_string(o.split.weighting)); },
                   [](plan_options& o, std::string const& v) {
                     o.split.weighting = parse_split_weighting(v, "PlanOptions.weighting");
                   },
                   "\"budget\" or \"batch_share\"")
      .def_prop_rw("reference_contexts",
                   [](plan_options const& o) { return o.split.reference_contexts; },
                   [](plan_options& o, std::vector<std::int64_t> v) {
                     o.split.reference_contexts = std::move(v);
                   })
      .def_prop_rw("reference_batch_size",
                   [](plan_options const& o) { return o.split.reference_batch_size; },
                   [](plan_options& o, std::int32_t v) { o.split.reference_batch_size = v; })
      .def_prop_rw("reference_batches",
                   [](plan_options const& o) { return o.split.reference_batches; },
                   [](plan_options& o, std::int32_t v) { o.split.reference_batches = v; })
      .def_prop_rw("share_quantile", [](plan_options const& o) { return o.split.share_quantile; },
                   [](plan_options& o, double v) { o.split.share_quantile = v; })
      .def_rw("tp_size", &plan_options::tp_size)
      .def_rw("tp_rank", &plan_options::tp_rank)
      .def_prop_rw("layers",
                   [](plan_options const& o) -> std::optional<range_pair> {
                     if (!o.layers) return std::nullopt;
                     return range_pair{o.layers->first, o.layers->last};
                   },
                   [](plan_options& o, std::optional<range_pair> v) {
                     if (v)
                       o.layers = layer_range{v->first, v->second};
                     else
                       o.layers.reset();
                   },
                   nb::arg("value").none(),
                   "Pipeline stage: model layers (first, last), last excluded; None: every layer")
      .def_prop_rw("reservation",
                   [](plan_options const& o) { return std::string(to_string(o.reservation.mode)); },
                   [](plan_options& o, std::string const& v) { o.reservation.mode = reservation_from(v); },
                   "\"elastic\" (the default: the scorer's total, placed per group at eviction) or\n"
                   "\"static\" (per-group budgets; docs/memory.md says when to choose it)")
      .def_prop_rw("margin", [](plan_options const& o) { return o.reservation.margin; },
                   [](plan_options& o, std::optional<double> v) { o.reservation.margin = v; },
                   nb::arg("value").none(),
                   "Elastic: reserve (1 + margin) x the scorer's total. None (the default): the\n"
                   "plan decides, from the retention samples it is built from (mean + 2 sd of\n"
                   "their required margins, at least 0.02), else 0.02; a built plan's options\n"
                   "hold the margin it reserves.")
      .def_prop_rw("basis",
                   [](plan_options const& o) { return std::string(to_string(o.reservation.basis)); },
                   [](plan_options& o, std::string const& v) { o.reservation.basis = basis_from(v); })
      .def("validate", &plan_options::validate, "Raises ValueError naming the field and the value.");

  nb::class_<static_plan>(m, "StaticPlan",
                          "The plan of one tensor-parallel rank and pipeline stage (a value: "
                          "copies are independent).")
      .def_ro("model", &static_plan::model)
      .def_ro("profile", &static_plan::profile)
      .def_prop_ro("options", [](static_plan const& p) { return p.options; },
                   "A copy of the options the plan was built with (changing it changes no plan).")
      .def_ro("num_layers", &static_plan::num_layers)
      .def_ro("num_kv_heads", &static_plan::num_kv_heads)
      .def_ro("first_kv_head", &static_plan::first_kv_head)
      .def_ro("first_layer", &static_plan::first_layer,
              "Model layer of local layer 0 (the pipeline stage's first layer; 0 without stages)")
      .def_prop_ro("stage_layers",
                   [](static_plan const& p) {
                     auto r = p.stage_layers();
                     return range_pair{r.first, r.last};
                   },
                   "(first, last): the model layers this plan covers, last excluded")
      .def_prop_ro("num_groups", &static_plan::num_groups)
      .def_prop_ro("page_bytes", &static_plan::page_bytes)
      .def_prop_ro("page_tokens", [](static_plan const& p) { return p.geometry.page_tokens; })
      .def_prop_ro("group_size", [](static_plan const& p) { return p.geometry.group_size; })
      .def_prop_ro("head_rules",
                   [](static_plan const& p) {
                     nb::list out;
                     for (auto const& r : p.rules) {
                       nb::dict d;
                       d["kind"]    = std::string(to_string(r.kind));
                       d["budget"]  = r.budget;
                       d["protect"] = r.protect;
                       d["window"]  = r.window;
                       out.append(d);
                     }
                     return out;
                   },
                   "[num_layers * num_kv_heads] dicts: kind, budget, protect, window")
      .def_prop_ro("groups",
                   [](static_plan const& p) {
                     std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> out;
                     for (auto const& g : p.grouping.groups) {
                       out.emplace_back();
                       for (auto h : g.members) out.back().emplace_back(h.layer, h.head);
                     }
                     return out;
                   },
                   "Members (layer, head) of every group, column order")
      .def_prop_ro("cta_begin",
                   [](static_plan const& p) {
                     return numpy_copy(p.splits.cta_begin,
                                       {static_cast<std::size_t>(p.num_layers),
                                        static_cast<std::size_t>(p.num_kv_heads) + 1});
                   },
                   "[num_layers, num_kv_heads + 1] first CTA of every head (split map; a copy)")
      .def_prop_ro("split_weights",
                   [](static_plan const& p) {
                     return numpy_copy(p.splits.phi, {static_cast<std::size_t>(p.num_layers),
                                                      static_cast<std::size_t>(p.num_kv_heads)});
                   },
                   "[num_layers, num_kv_heads] Phi the split map was apportioned by (a copy)")
      .def_prop_ro("num_ctas", [](static_plan const& p) { return p.splits.num_ctas(); });

  m.def("build_plan",
        // By value: the arguments are copied while the GIL is held, so another thread that
        // mutates them during the (GIL-free) build cannot race it.
        [](model_spec model, budget_profile profile, plan_options options,
           std::optional<retention_samples> samples) {
          return samples ? build_static_plan(model, profile, options, *samples)
                         : build_static_plan(model, profile, options);
        },
        nb::call_guard<nb::gil_scoped_release>(), nb::arg("model"), nb::arg("profile"), nb::arg("options") = plan_options{},
        nb::arg("samples") = nb::none(),
        "build_static_plan. With the samples the profile was calibrated from, an elastic plan's\n"
        "split map is weighed on their placements and, unless options.margin is set, it reserves\n"
        "their margin (elastic_plan_margin). Raises ValueError naming the option.");
  m.def("stage_key_words_bound",
        [](static_plan const& plan, std::int64_t tokens, std::int64_t requests) {
          return stage_key_words_bound(plan, tokens, requests);
        },
        nb::arg("plan"), nb::arg("tokens"), nb::arg("requests") = 1,
        "The most uint32 words stage_key_layout asks for from an eviction batch of at most\n"
        "`requests` requests of at most `tokens` tokens each (the context limit): allocate the\n"
        "stage-key buffer once by it and pass its first words at each chunk. Raises ValueError\n"
        "naming the argument.");
  m.def("elastic_plan_margin",
        [](retention_samples const& samples, static_plan const& plan) {
          return elastic_plan_margin(samples, plan);
        },
        nb::arg("samples"), nb::arg("plan"),
        "The margin the elastic `plan` reserves from these samples unless given one: mean +\n"
        "2 sd of their required margins over the plan's own groups, stage and rank, at least\n"
        "0.02 (C++ tangram::elastic_plan_margin). Raises ValueError for unusable samples.");
  m.def("layer_kv_tokens",
        [](model_spec const& model, budget_profile const& profile, plan_options const& options,
           std::int64_t context) { return layer_kv_tokens(model, profile, options, context); },
        nb::arg("model"), nb::arg("profile"), nb::arg("options"), nb::arg("context"),
        "KV tokens each model layer holds (the rank's heads) for a request of `context` tokens\n"
        "under the options' reservation mode: the weights balanced_pipeline_stages balances.");
  m.def("balanced_pipeline_stages",
        [](std::vector<std::int64_t> const& weights, std::int32_t stages) {
          return pairs_from(balanced_pipeline_stages(weights, stages));
        },
        nb::arg("layer_weights"), nb::arg("stages"),
        "`stages` contiguous layer ranges (first, last) whose heaviest total weight is the least\n"
        "possible. Raises ValueError for stages outside [1, layers] or negative weights.");
  m.def("check_pipeline_stages",
        [](std::vector<range_pair> const& stages, std::int32_t model_layers) {
          check_pipeline_stages(ranges_from(stages), model_layers);
        },
        nb::arg("stages"), nb::arg("model_layers"),
        "Raises ValueError naming the stage unless the ranges cover the layers in order, each\n"
        "non-empty, without overlap or gap.");
  m.def("build_stage_plans",
        [](model_spec model, budget_profile profile, plan_options options,
           std::vector<range_pair> stages, std::optional<retention_samples> samples) {
          nb::gil_scoped_release release;
          return build_stage_plans(model, profile, options, ranges_from(stages),
                                   samples ? &*samples : nullptr);
        },
        nb::arg("model"), nb::arg("profile"), nb::arg("options"), nb::arg("stages"),
        nb::arg("samples") = nb::none(),
        "One plan per pipeline stage (first, last), as build_plan with options.layers set.\n"
        "Raises ValueError naming the stage or the option.");
  m.def("save_plan",
        [](static_plan const& plan, std::filesystem::path const& p) {
          save_static_plan(plan, path_string(p));
        },
        nb::arg("plan"), nb::arg("path"),
        "Writes the plan JSON atomically (temporary file in the target's folder, then rename).");
  m.def("load_plan",
        [](std::filesystem::path const& p) { return load_static_plan(path_string(p)); },
        nb::arg("path"),
        "Reads a plan file. Raises ParseError naming the field.");
  add_value_copies<plan_options>();
  add_value_copies<static_plan>();
}

}  // namespace tangram::python
