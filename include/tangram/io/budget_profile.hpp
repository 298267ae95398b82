// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/budget_profile.hpp
 * @brief Reading and writing `tangram-budget-profile/v1` (docs/formats.md) for `budget_profile`
 * (profile/budget_profile.hpp).
 *
 * Host only; pure functions except `load_budget_profile` and `save_budget_profile`, which read
 * and (atomically) write a file.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tangram/core/error.hpp"
#include "tangram/io/detail/fields.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// @brief Serialises a profile as `tangram-budget-profile/v1` JSON (docs/formats.md).
inline std::string to_json(budget_profile const& p) {
  namespace json = detail::json;
  auto v         = json::value::object();
  v.set("format", "tangram-budget-profile/v1");
  v.set("model", p.model);
  v.set("scorer", p.scorer);
  v.set("num_model_layers", p.num_model_layers);
  v.set("num_kv_heads", p.num_kv_heads);
  auto ids = json::value::array();
  for (auto id : p.layer_ids) ids.push_back(id);
  v.set("layer_ids", std::move(ids));
  v.set("sink_tokens", p.sink_tokens);
  v.set("window_tokens", p.window_tokens);
  v.set("target_keep_ratio", p.target_keep_ratio);
  auto cal = json::value::object();
  cal.set("estimator", to_string(p.calibration.estimator));
  cal.set("alpha", p.calibration.alpha);
  cal.set("quantile", p.calibration.quantile);
  cal.set("floor", p.calibration.floor);
  cal.set("num_samples", p.calibration.num_samples);
  v.set("calibration", std::move(cal));
  auto rows = json::value::array();
  auto H    = static_cast<std::size_t>(p.num_kv_heads);
  for (std::size_t li = 0; li < p.layer_ids.size(); ++li) {
    auto row = json::value::array();
    for (std::size_t h = 0; h < H; ++h) row.push_back(p.budgets[li * H + h]);
    rows.push_back(std::move(row));
  }
  v.set("budgets", std::move(rows));
  return json::dump(v);
}

/**
 * @brief Parses `tangram-budget-profile/v1` JSON text and validates every field.
 * @throw parse_error naming the source, the field path and the value.
 */
inline budget_profile parse_budget_profile(std::string_view text, std::string_view source) {
  using detail::cat;
  detail::format_document file(text, source, "tangram-budget-profile/v1");
  auto const& doc = file.root;

  budget_profile p;
  if (auto m = doc.find("model")) p.model = m->as_string(256);
  if (auto s = doc.find("scorer")) p.scorer = s->as_string(256);
  p.num_model_layers = detail::as_i32(doc["num_model_layers"], 1, model_limits::max_layers);
  p.num_kv_heads     = detail::as_i32(doc["num_kv_heads"], 1, model_limits::max_kv_heads);
  p.layer_ids        = detail::read_layer_ids(doc["layer_ids"], p.num_model_layers);
  p.sink_tokens      = detail::as_i32(doc["sink_tokens"], 0, profile_limits::max_protected);
  p.window_tokens    = detail::as_i32(doc["window_tokens"], 0, profile_limits::max_protected);
  if (auto t = doc.find("target_keep_ratio")) p.target_keep_ratio = t->as_double(0, 1);
  if (auto cal = doc.find("calibration")) {
    if (auto e = cal->find("estimator")) {
      std::string name = e->as_string(32);
      try {
        p.calibration.estimator = parse_budget_estimator(name);
      } catch (invalid_argument const&) {
        e->fail(
            cat("unknown estimator ", e->describe(), " (expected musigma, quantile or external)"));
      }
    }
    if (auto a = cal->find("alpha")) p.calibration.alpha = a->as_double(0, 1000);
    if (auto q = cal->find("quantile")) p.calibration.quantile = q->as_double(0, 1);
    if (auto f = cal->find("floor")) p.calibration.floor = f->as_double(0, 1);
    if (auto n = cal->find("num_samples"))
      p.calibration.num_samples = detail::as_i32(*n, 0, profile_limits::max_samples);
  }
  detail::read_layer_head_table(
      doc["budgets"],
      p.layer_ids.size(),
      static_cast<std::size_t>(p.num_kv_heads),
      p.budgets,
      [](auto const& cell) {
        double b = cell.as_double(-1e300, 1e300);
        if (!(b > 0 && b <= 1)) cell.fail(cat("budget must be in (0, 1], got ", cell.describe()));
        return b;
      });
  return p;
}

/// @brief Reads and validates a budget-profile file.
inline budget_profile load_budget_profile(std::string const& path) {
  return parse_budget_profile(detail::read_file(path), path);
}

/// @brief Writes a budget-profile file (atomically).
inline void save_budget_profile(budget_profile const& p, std::string const& path) {
  p.validate();
  detail::write_file(path, to_json(p));
}

}  // namespace tangram
