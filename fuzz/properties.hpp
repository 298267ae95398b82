// SPDX-License-Identifier: Apache-2.0
// The properties each fuzz harness checks, shared with the test suite, which replays every input
// under fuzz/regressions/<harness>/ through the same function. A property returns normally when
// the input is rejected with parse_error or accepted with every invariant holding; anything else
// (another exception, a violated invariant, a crash) is a failure.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "tangram/eval/io/workload_io.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

#include <sstream>
#include <vector>

namespace tangram::fuzz {

/// Thrown when an accepted input breaks an invariant.
struct property_violation : std::logic_error {
  using std::logic_error::logic_error;
};

inline void require(bool ok, char const* what) {
  if (!ok) throw property_violation(what);
}

/// True when a parsed document holds a NaN or an infinity anywhere.
inline bool has_non_finite(tangram::detail::json::value const& v) {
  namespace json = tangram::detail::json;
  if (v.type() == json::kind::number) return !std::isfinite(v.number());
  for (auto const& e : v.elements())
    if (has_non_finite(e)) return true;
  for (auto const& m : v.members())
    if (has_non_finite(m.second)) return true;
  return false;
}

/// JSON: parse, then dump -> parse -> dump is a fixed point (compact and pretty), and what is
/// written is JSON: valid UTF-8, no raw control byte, no NaN or Infinity.
inline void json_roundtrip(std::string_view text) {
  namespace json = tangram::detail::json;
  try {
    auto v = json::parse(text, "fuzz");
    for (int indent : {-1, 2}) {
      std::string once = json::dump(v, indent);
      auto back        = json::parse(once, "roundtrip");
      require(json::dump(back, indent) == once, "json dump is not a fixed point");
      require(!has_non_finite(back), "json dump wrote a non-finite number");
      for (std::size_t i = 0; i < once.size();) {
        std::uint32_t cp = 0;
        std::size_t len  = tangram::detail::utf8_sequence(once, i, cp);
        require(len > 0, "json dump wrote invalid UTF-8");
        require(!tangram::detail::is_control(cp) || cp == '\n', "json dump wrote a control byte");
        i += len;
      }
    }
  } catch (tangram::parse_error const&) {
  }
}

/// retention-samples/v1: accepted documents satisfy every documented invariant.
inline void retention_samples_invariants(std::string_view text) {
  try {
    auto s = tangram::parse_retention_samples(text, "fuzz");
    auto H = static_cast<std::size_t>(s.num_kv_heads);
    for (auto const& smp : s.samples) {
      require(smp.kept.size() == s.layer_ids.size() * H, "kept shape");
      for (auto k : smp.kept) require(k >= 0 && k <= smp.context_tokens, "kept out of range");
    }
    for (std::size_t i = 0; i < s.layer_ids.size(); ++i) {
      require(s.layer_ids[i] >= 0 && s.layer_ids[i] < s.num_model_layers, "layer id range");
      require(i == 0 || s.layer_ids[i] > s.layer_ids[i - 1], "layer ids increasing");
    }
  } catch (tangram::parse_error const&) {
  }
}

/// A document format's round trip: what `parse(text, source)` accepts validates, and reads back
/// from its to_json with `same(back, doc)` holding (`what` names the property).
template <class Doc, class Same>
void validated_roundtrip(std::string_view text,
                         Doc (*parse)(std::string_view, std::string_view),
                         Same same,
                         char const* what) {
  try {
    auto doc = parse(text, "fuzz");
    doc.validate();
    auto back = parse(tangram::to_json(doc), "roundtrip");
    require(same(back, doc), what);
  } catch (tangram::parse_error const&) {
  }
}

/// tangram-budget-profile/v1: accepted profiles validate and round-trip exactly.
inline void budget_profile_roundtrip(std::string_view text) {
  auto same = [](auto const& back, auto const& p) {
    return back.budgets == p.budgets && back.layer_ids == p.layer_ids;
  };
  validated_roundtrip(text, &tangram::parse_budget_profile, same, "profile round trip");
}

/// Model spec JSON: accepted specs validate and round-trip.
inline void model_spec_roundtrip(std::string_view text) {
  auto same = [](auto const& back, auto const& m) {
    return back.layers == m.layers && back.num_kv_heads == m.num_kv_heads;
  };
  validated_roundtrip(text, &tangram::parse_model_spec, same, "model round trip");
}

/// tangram-static-plan/v1: accepted plans are internally consistent and round-trip exactly.
inline void static_plan_roundtrip(std::string_view text) {
  try {
    auto p = tangram::parse_static_plan(text, "fuzz");
    p.grouping.validate();
    p.splits.validate();
    // A pipeline stage lies inside the model; without one the plan covers every layer.
    auto stage = p.stage_layers();
    require(stage.first >= 0 && stage.first < stage.last && stage.last <= p.model.num_layers &&
                (p.options.layers ? *p.options.layers == stage
                                  : stage.first == 0 && stage.last == p.model.num_layers),
            "plan stage inside the model");
    require(p.rules == tangram::head_rules_for(p.model, p.profile, p.options), "stage rules");
    auto back = tangram::parse_static_plan(tangram::to_json(p), "roundtrip");
    require(tangram::plan_difference(p, back).empty(), "plan round trip");
  } catch (tangram::parse_error const&) {
  }
}

/// tangram-workload/v1: accepted traces have sane values and round-trip.
inline void workload_roundtrip(std::string_view text) {
  try {
    auto w = tangram::sim::parse_workload(text, "fuzz");
    for (auto const& s : w.sessions)
      for (auto const& t : s.turns)
        require(t.prompt_tokens >= 1 && t.output_tokens >= 1 && t.max_tokens >= 0, "turn sizes");
    auto json = tangram::sim::to_json(w);
    auto back = tangram::sim::parse_workload(json, "roundtrip");
    require(tangram::sim::to_json(back) == json, "workload round trip");
  } catch (tangram::parse_error const&) {
  }
}

/// The command line: any argument list gives an exit code in {0, 1, 2} and never crashes; a
/// usage error (2) prints exactly one line on stderr. Arguments are the input split at NUL bytes;
/// commands that write files or run long jobs are kept out of reach.
inline void command_line(std::string_view text) {
  std::vector<std::string> argv;
  std::string cur;
  for (char c : text) {
    if (c == '\0') {
      argv.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  argv.push_back(cur);
  if (argv.size() > 16) return;
  for (auto const& a : argv) {
    // No file output and no full simulations from fuzz input.
    if (a.find("--out") != std::string::npos || a.find("--svg") != std::string::npos ||
        a.find("--plot") != std::string::npos || a == "simulate")
      return;
    // Only relative paths inside the tree (no devices, FIFOs or climbing out).
    if (!a.empty() && (a[0] == '/' || a.find("..") != std::string::npos)) return;
  }
  std::ostringstream out, err;
  int rc = tangram::cli::run(argv, {out, err});
  require(rc == 0 || rc == 1 || rc == 2, "exit code");
  if (rc == 2) {
    std::string e = err.str();
    require(!e.empty() && e.find('\n') == e.size() - 1, "one-line error");
  }
}

}  // namespace tangram::fuzz
