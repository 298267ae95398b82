// SPDX-License-Identifier: Apache-2.0
// Retention samples, budget profiles and calibration. Samples and profiles are values: their
// arrays come back as NumPy copies (they are small and owned by value on the C++ side).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/plan/calibration.hpp"

namespace nb = nanobind;

namespace tangram::python {

void bind_profiles(nb::module_& m) {
  nb::class_<retention_samples>(m, "RetentionSamples",
                                "Per-head retention measured on pilot prompts (retention-samples/v1).")
      .def_ro("model", &retention_samples::model)
      .def_ro("scorer", &retention_samples::scorer)
      .def_ro("target_keep_ratio", &retention_samples::target_keep_ratio)
      .def_ro("sink_tokens", &retention_samples::sink_tokens)
      .def_ro("window_tokens", &retention_samples::window_tokens)
      .def_ro("num_model_layers", &retention_samples::num_model_layers)
      .def_ro("layer_ids", &retention_samples::layer_ids)
      .def_ro("num_kv_heads", &retention_samples::num_kv_heads)
      .def("__len__", [](retention_samples const& s) { return s.samples.size(); })
      .def_prop_ro("contexts",
                   [](retention_samples const& s) {
                     std::vector<std::int64_t> c;
                     for (auto const& x : s.samples) c.push_back(x.context_tokens);
                     return numpy_copy(c, {c.size()});
                   },
                   "Prompt length of every sample (a copy).")
      .def_prop_ro("kept",
                   [](retention_samples const& s) {
                     std::vector<std::int64_t> k;
                     for (auto const& x : s.samples) k.insert(k.end(), x.kept.begin(), x.kept.end());
                     std::size_t heads = s.layer_ids.size() * static_cast<std::size_t>(s.num_kv_heads);
                     return numpy_copy(k, {s.samples.size(), heads});
                   },
                   "[samples, profiled layers * KV heads] kept tokens, protected included (a copy).");
  m.def("load_retention_samples",
        [](std::filesystem::path const& p) { return load_retention_samples(path_string(p)); },
        nb::arg("path"),
        "Reads a retention-samples/v1 file. Raises ParseError naming the field.");
  m.def("parse_retention_samples",
        [](std::string const& text, std::string const& source) {
          return parse_retention_samples(text, source);
        },
        nb::arg("text"), nb::arg("source") = "<string>");

  nb::class_<budget_profile>(m, "BudgetProfile", "Per-head budgets of a compressor (a value).")
      .def_ro("model", &budget_profile::model)
      .def_ro("scorer", &budget_profile::scorer)
      .def_ro("num_model_layers", &budget_profile::num_model_layers)
      .def_ro("num_kv_heads", &budget_profile::num_kv_heads)
      .def_ro("layer_ids", &budget_profile::layer_ids)
      .def_ro("sink_tokens", &budget_profile::sink_tokens)
      .def_ro("window_tokens", &budget_profile::window_tokens)
      .def_ro("target_keep_ratio", &budget_profile::target_keep_ratio)
      .def_prop_ro("budgets",
                   [](budget_profile const& p) {
                     return numpy_copy(p.budgets,
                                       {p.layer_ids.size(), static_cast<std::size_t>(p.num_kv_heads)});
                   },
                   "[profiled layers, KV heads] budgets B in (0, 1] (a copy).")
      .def("validate", &budget_profile::validate, "Raises ValueError naming the field.");
  m.def("parse_budget_profile",
        [](std::string const& text, std::string const& source) {
          return parse_budget_profile(text, source);
        },
        nb::arg("text"), nb::arg("source") = "<string>",
        "A tangram-budget-profile/v1 document from a string. Raises ParseError naming the field.");
  m.def("load_budget_profile",
        [](std::filesystem::path const& p) { return load_budget_profile(path_string(p)); },
        nb::arg("path"));
  m.def("save_budget_profile",
        [](budget_profile const& b, std::filesystem::path const& p) {
          save_budget_profile(b, path_string(p));
        },
        nb::arg("profile"), nb::arg("path"),
        "Writes atomically (temporary file in the target's folder, then rename).");

  nb::class_<calibration_options>(m, "CalibrationOptions")
      .def(nb::init<>())
      .def_prop_rw("estimator",
                   [](calibration_options const& o) { return std::string(to_string(o.estimator)); },
                   [](calibration_options& o, std::string const& v) {
                     o.estimator = parse_budget_estimator(v, "CalibrationOptions.estimator");
                   },
                   "\"musigma\" (mu + alpha sigma) or \"quantile\"")
      .def_rw("alpha", &calibration_options::alpha)
      .def_rw("quantile", &calibration_options::quantile)
      .def_rw("floor", &calibration_options::floor)
      .def("validate", &calibration_options::validate);
  m.def("calibrate",
        [](retention_samples const& s, calibration_options const& o) { return calibrate(s, o); },
        nb::arg("samples"), nb::arg("options") = calibration_options{},
        "Budgets from samples: B = clamp(mu + alpha sigma, floor, 1) per head (or a quantile).");

  nb::class_<calibration_report>(m, "CalibrationReport",
                                 "What a calibration reserves and how well it predicts held-out samples.")
      .def_ro("num_samples", &calibration_report::num_samples)
      .def_ro("num_heads", &calibration_report::num_heads)
      .def_ro("mean_budget", &calibration_report::mean_budget)
      .def_ro("reserved_over_ideal", &calibration_report::reserved_over_ideal)
      .def_ro("insample_clip_fraction", &calibration_report::insample_clip_fraction)
      .def_ro("folds", &calibration_report::folds)
      .def_ro("fold_clip_fractions", &calibration_report::fold_clip_fractions)
      .def_ro("heldout_clip_fraction", &calibration_report::heldout_clip_fraction)
      .def_ro("heldout_reserved_over_ideal", &calibration_report::heldout_reserved_over_ideal)
      .def_ro("rank_spearman_mean", &calibration_report::rank_spearman_mean)
      .def_ro("narrow_band_share", &calibration_report::narrow_band_share);
  m.def("evaluate_calibration",
        [](retention_samples const& s, calibration_options const& o, std::int32_t folds,
           double band, bool group_by_context) {
          evaluation_options e;
          e.folds            = folds;
          e.band             = band;
          e.group_by_context = group_by_context;
          return evaluate_calibration(s, o, e);
        },
        nb::arg("samples"), nb::arg("options") = calibration_options{}, nb::arg("folds") = 2,
        nb::arg("band") = 0.05, nb::arg("group_by_context") = false,
        "The calibration report of `tangram calibrate` (held-out folds by sample index or prompt).");
  add_value_copies<retention_samples>();
  add_value_copies<budget_profile>();
  add_value_copies<calibration_options>();
}

}  // namespace tangram::python
