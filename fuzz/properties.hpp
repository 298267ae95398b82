// SPDX-License-Identifier: Apache-2.0
// The properties each fuzz harness checks, shared with the test suite, which replays every input
// under fuzz/regressions/<harness>/ through the same function. A property returns normally when
// the input is rejected with parse_error or accepted with every invariant holding; anything else
// (another exception, a violated invariant, a crash) is a failure.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "tangram/detail/json.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::fuzz {

/// Thrown when an accepted input breaks an invariant.
struct property_violation : std::logic_error {
  using std::logic_error::logic_error;
};

inline void require(bool ok, char const* what) {
  if (!ok) throw property_violation(what);
}

/// JSON: parse, then dump -> parse -> dump is a fixed point (compact and pretty).
inline void json_roundtrip(std::string_view text) {
  namespace json = tangram::detail::json;
  try {
    auto v = json::parse(text, "fuzz");
    for (int indent : {-1, 2}) {
      std::string once = json::dump(v, indent);
      require(json::dump(json::parse(once, "roundtrip"), indent) == once, "json dump is not a fixed point");
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

/// tangram-budget-profile/v1: accepted profiles validate and round-trip exactly.
inline void budget_profile_roundtrip(std::string_view text) {
  try {
    auto p = tangram::parse_budget_profile(text, "fuzz");
    p.validate();
    auto back = tangram::parse_budget_profile(tangram::to_json(p), "roundtrip");
    require(back.budgets == p.budgets && back.layer_ids == p.layer_ids, "profile round trip");
  } catch (tangram::parse_error const&) {
  }
}

/// Model spec JSON: accepted specs validate and round-trip.
inline void model_spec_roundtrip(std::string_view text) {
  try {
    auto m = tangram::parse_model_spec(text, "fuzz");
    m.validate();
    auto back = tangram::parse_model_spec(tangram::to_json(m), "roundtrip");
    require(back.layers == m.layers && back.num_kv_heads == m.num_kv_heads, "model round trip");
  } catch (tangram::parse_error const&) {
  }
}

}  // namespace tangram::fuzz
