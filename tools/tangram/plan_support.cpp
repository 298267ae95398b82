// SPDX-License-Identifier: Apache-2.0
#include "plan_support.hpp"

#include <cstdio>
#include <string_view>
#include <utility>

#include "tangram/io/budget_profile.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"

namespace tangram::cli {

using tangram::detail::cat;
using tangram::detail::printable;
// detail::quoted is spelled out: CLI11 brings in <iomanip>, and argument-dependent lookup would
// pick std::quoted for a std::string.

retention_samples read_samples(input_text const& in) {
  std::string fmt = format_of(in);
  TANGRAM_EXPECTS(fmt == "retention-samples/v1",
                  tangram::invalid_argument,
                  printable(in.source),
                  ": expected a retention-samples/v1 file, got format ",
                  tangram::detail::quoted(fmt));
  return parse_retention_samples(in.text, in.source);
}

budget_source read_samples_or_profile(std::string const& name_or_path,
                                      calibration_args const& cal) {
  auto in         = read_input(name_or_path);
  std::string fmt = format_of(in);
  budget_source out;
  out.source = in.source;
  if (fmt == "retention-samples/v1") {
    out.samples = parse_retention_samples(in.text, in.source);
    out.profile = calibrate(*out.samples, cal.options);
  } else if (fmt == "tangram-budget-profile/v1") {
    if (cal.given)
      throw usage_error(cat(*cal.given,
                            ": calibration options apply to retention samples; ",
                            printable(in.source),
                            " is already a budget profile"));
    out.profile = parse_budget_profile(in.text, in.source);
  } else {
    TANGRAM_FAIL(tangram::invalid_argument,
                 printable(in.source),
                 ": expected retention-samples/v1 or tangram-budget-profile/v1, got format ",
                 tangram::detail::quoted(fmt));
  }
  return out;
}

model_spec resolve_model(std::optional<std::string> const& option, std::string const& model_name) {
  if (option) {
    if (names_a_file(*option)) return load_model_spec(*option);
    if (auto m = find_model_preset(*option)) return *m;
    std::string known;
    for (auto const& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw usage_error(cat("--model: ",
                          tangram::detail::quoted(*option),
                          " is neither a model-spec file nor a preset (known: ",
                          known,
                          ")"));
  }
  if (auto m = find_model_preset(model_name)) return *m;
  std::string known;
  for (auto const& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw usage_error(cat("no built-in model matches ",
                        tangram::detail::quoted(model_name),
                        "; pass --model NAME_OR_FILE (presets: ",
                        known,
                        ")"));
}

void throw_plan_option_error(tangram::invalid_argument const& e) {
  // Library field -> option; a prefix ending in ": " is replaced, any other is kept as context.
  static constexpr std::pair<std::string_view, std::string_view> names[] = {
      {"plan_options.tp_size: ", "--tp-size"},
      {"tp_size: ", "--tp-size"},
      {"plan_options.tp_rank: ", "--tp-rank"},
      {"plan_options.group_size: ", "--group-size"},
      {"group_size: ", "--group-size"},
      {"plan_options.page_tokens: ", "--page-tokens"},
      {"plan_options.reservation.mode: ", "--reservation"},
      {"plan_options.layers: ", "--layers"},
      {"pipeline_stages", "--layers"},
      {"N_CTA", "--sms x --ctas-per-sm"},
  };
  std::string_view what = e.what();
  for (auto const& [field, option] : names) {
    if (what.substr(0, field.size()) != field) continue;
    bool replace = field.back() == ' ';
    throw usage_error(cat(option, ": ", replace ? what.substr(field.size()) : what));
  }
  throw;  // the exception being handled, whatever its type
}

static_plan build_plan_for_cli(model_spec const& model,
                               budget_profile const& profile,
                               plan_options const& options,
                               retention_samples const* samples) {
  try {
    return samples ? build_static_plan(model, profile, options, *samples)
                   : build_static_plan(model, profile, options);
  } catch (tangram::invalid_argument const& e) {
    throw_plan_option_error(e);
  }
}

bool margin_from_samples(plan_options const& o, budget_source const& src) {
  return o.reservation.mode == reservation_mode::elastic && src.samples && !o.reservation.margin;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    std::size_t len  = tangram::detail::utf8_sequence(text, i, cp);
    if (len == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD: an SVG must be valid UTF-8 to be read at all
      ++i;
      continue;
    }
    switch (cp) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (!tangram::detail::is_control(cp) && cp != 0xfffe && cp != 0xffff)  // not XML characters
          out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string percent(double fraction, int decimals) {
  return fixed(100.0 * fraction, decimals) + "%";
}

}  // namespace tangram::cli
