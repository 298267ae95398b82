// SPDX-License-Identifier: Apache-2.0
#include "plan_support.hpp"

#include <sys/stat.h>
#include <cstdio>

#include "tangram/io/budget_profile.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"

namespace tangram::cli {

using tangram::detail::cat;
using tangram::detail::printable;
using tangram::detail::quoted;

calibration_args read_calibration_args(args& a) {
  calibration_args out;
  auto estimator = a.value("--estimator");
  auto alpha     = a.value("--alpha");
  auto quantile  = a.value("--quantile");
  auto floor     = a.value("--floor");
  for (auto const& [name, v] :
       {std::pair<char const*, std::optional<std::string> const*>{"--estimator", &estimator},
        {"--alpha", &alpha},
        {"--quantile", &quantile},
        {"--floor", &floor}})
    if (*v && !out.given) out.given = name;
  auto& o = out.options;
  if (estimator) {
    if (*estimator == "musigma")
      o.estimator = budget_estimator::musigma;
    else if (*estimator == "quantile")
      o.estimator = budget_estimator::quantile;
    else
      throw usage_error(
          cat("--estimator: expected one of musigma, quantile, got ", quoted(*estimator)));
  }
  if (alpha) {
    if (o.estimator != budget_estimator::musigma)
      throw usage_error(
          "--alpha: applies to --estimator musigma only (use --quantile with quantile)");
    o.alpha = parse_number(*alpha, "--alpha", 0, 1000);
  }
  if (quantile) {
    if (o.estimator != budget_estimator::quantile)
      throw usage_error(
          "--quantile: applies to --estimator quantile only (the default is musigma)");
    o.quantile = parse_number(*quantile, "--quantile", 0, 1);
  }
  if (floor) {
    o.floor = parse_number(*floor, "--floor", 0, 1);
    if (!(o.floor > 0)) throw usage_error(cat("--floor: must be in (0, 1], got ", *floor));
  }
  return out;
}

retention_samples read_samples(input_text const& in) {
  std::string fmt = format_of(in);
  TANGRAM_EXPECTS(fmt == "retention-samples/v1",
                  tangram::invalid_argument,
                  printable(in.source),
                  ": expected a retention-samples/v1 file, got format ",
                  quoted(fmt));
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
                 quoted(fmt));
  }
  return out;
}

model_spec resolve_model(std::optional<std::string> const& option, std::string const& model_name) {
  if (option) {
    struct stat st {};
    if (::stat(option->c_str(), &st) == 0) return load_model_spec(*option);
    if (auto m = find_model_preset(*option)) return *m;
    std::string known;
    for (auto const& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw usage_error(cat("--model: ",
                          quoted(*option),
                          " is neither a model-spec file nor a preset (known: ",
                          known,
                          ")"));
  }
  if (auto m = find_model_preset(model_name)) return *m;
  std::string known;
  for (auto const& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw usage_error(cat("no built-in model matches ",
                        quoted(model_name),
                        "; pass --model NAME_OR_FILE (presets: ",
                        known,
                        ")"));
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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
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
