// SPDX-License-Identifier: Apache-2.0
#include "common_options.hpp"

#include "option_values.hpp"
#include "usage_error.hpp"

namespace tangram::cli {

void add_calibration_options(CLI::App& app, calibration_args& cal) {
  auto& o       = cal.options;
  cal.estimator = add_choice(
      app, "--estimator",
      [&o](std::string const& v) {
        o.estimator = v == "quantile" ? budget_estimator::quantile : budget_estimator::musigma;
      },
      std::string(to_string(o.estimator)), {"musigma", "quantile"},
      "How retention samples become budgets: mean + alpha sd (musigma) or a quantile");
  cal.alpha = add_number(app, "--alpha", o.alpha, {0, 1000},
                         "musigma: budget = mean + alpha x sd of each head's kept fraction");
  cal.quantile =
      add_number(app, "--quantile", o.quantile, {0, 1}, "quantile estimator: q of each head's kept fraction");
  cal.floor = add_number(app, "--floor", o.floor, {0, 1, true}, "Lower clamp of every budget");
}

void check_calibration_args(calibration_args& cal) {
  for (auto* opt : {cal.estimator, cal.alpha, cal.quantile, cal.floor})
    if (opt->count() > 0 && !cal.given) cal.given = opt->get_name();
  auto est = cal.options.estimator;
  if (cal.alpha->count() > 0 && est != budget_estimator::musigma)
    throw usage_error("--alpha: applies to --estimator musigma only (use --quantile with quantile)");
  if (cal.quantile->count() > 0 && est != budget_estimator::quantile)
    throw usage_error("--quantile: applies to --estimator quantile only (the default is musigma)");
}

CLI::Option* add_group_size(CLI::App& app, std::int32_t& target) {
  return add_integer(app, "--group-size", target, 1, 1024, "Hp: KV heads that share a page");
}

CLI::Option* add_page_tokens(CLI::App& app, std::int32_t& target) {
  return add_integer(app, "--page-tokens", target, 1, 4096, "P: tokens per page");
}

CLI::Option* add_scope(CLI::App& app, grouping_scope& target) {
  return add_choice(
      app, "--scope", [&target](std::string const& v) { target = parse_grouping_scope(v); },
      std::string(to_string(target)), {"adjacent", "layer", "global"},
      "Which heads may share a group: neighbours in a layer, any in a layer, or any");
}

CLI::Option* add_sms(CLI::App& app, std::int32_t& target) {
  // Every KV head of a layer needs one of the sms x ctas_per_sm CTAs.
  return add_integer(app, "--sms", target, 1, 65536,
                     "SMs of the GPU the split map is planned for (132: H100/H200 SXM)");
}

}  // namespace tangram::cli
