// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/retention_needs.hpp
 * @brief What each head of one input keeps, MODELLED from the retention samples (no scorer runs):
 * the per-input retention a dynamic compressor keeps. Used by `tangram_elastic`'s eviction
 * (eval/sim/elastic_policy.hpp) and by the unified-page baseline (eval/sim/policies.hpp), which
 * compresses each input to its own retention instead of Tangram's padded budgets.
 *
 *   with retention samples: sample k = session mod (number of samples), p = protect_h (the
 *                           profile's sink + recent-window tokens, which the scorer always keeps),
 *                           r = ceil(scale * kept_k[h] * seen / context_k),
 *                           need_h = min(seen <= p ? seen : max(p, r), cand_h)
 *   otherwise (a budget profile, or a layer the samples did not profile):
 *                           need_h = min(retained_tokens(rule_h, seen), cand_h)  (budget x seen)
 *
 * Both are `retained_tokens`'s k(n) (docs/planning.md): the samples' ratio kept / context takes
 * the budget's place. The protected floor is what the real compressor does: the bundled samples
 * keep at least sink + window (4,128 tokens) in every head at every context, so an input seen
 * only up to a few thousand tokens keeps all of it, not kept x seen / context of it (that linear
 * share, without the floor, had the unified baseline keep 0.31 of short prompts where the
 * compressor keeps 0.43). (`scale` is 1 unless the budgets were rescaled to another keep ratio;
 * it scales the ratio, not the protected tokens.)
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::sim {

/// @brief Where per-input needs come from (see the file comment).
struct elastic_needs {
  std::optional<retention_samples> samples;  ///< none: each head's budget x seen
  double scale = 1.0;                        ///< multiplies the samples' kept counts, > 0
};

/// @brief Per-head needs of one input (file comment). Plain value; const after construction.
class retention_needs {
 public:
  /// @throw invalid_argument when the samples do not match the plan (KV heads, kept counts,
  ///        empty contexts) or scale <= 0.
  retention_needs(static_plan const& plan, elastic_needs needs)
      : rules_(plan.rules), needs_(std::move(needs)) {
    auto H = static_cast<std::size_t>(plan.num_kv_heads);
    TANGRAM_EXPECTS(needs_.scale > 0 && std::isfinite(needs_.scale),
                    invalid_argument,
                    "elastic_needs.scale: must be > 0, got ",
                    needs_.scale);
    if (needs_.samples && needs_.samples->samples.empty()) needs_.samples.reset();
    sample_index_.assign(plan.rules.size(), -1);
    if (!needs_.samples) return;
    auto const& rs = *needs_.samples;
    TANGRAM_EXPECTS(rs.num_kv_heads == plan.num_kv_heads,
                    invalid_argument,
                    "elastic_needs.samples: ",
                    rs.num_kv_heads,
                    " KV heads per layer, the plan has ",
                    plan.num_kv_heads);
    for (std::size_t k = 0; k < rs.samples.size(); ++k) {
      auto const& smp = rs.samples[k];
      TANGRAM_EXPECTS(smp.context_tokens > 0 && smp.kept.size() == rs.layer_ids.size() * H,
                      invalid_argument,
                      "elastic_needs.samples[",
                      k,
                      "]: needs context_tokens > 0 and ",
                      rs.layer_ids.size() * H,
                      " kept counts, got ",
                      smp.context_tokens,
                      " and ",
                      smp.kept.size());
    }
    for (std::size_t li = 0; li < rs.layer_ids.size(); ++li) {
      auto layer = rs.layer_ids[li];
      if (layer < 0 || layer >= plan.num_layers) continue;
      for (std::size_t h = 0; h < H; ++h)
        sample_index_[static_cast<std::size_t>(layer) * H + h] =
            static_cast<std::int64_t>(li * H + h);
    }
  }

  /// True when the needs come from retention samples (not the budgets).
  [[nodiscard]] bool from_samples() const noexcept { return needs_.samples.has_value(); }

  /// Head h's (flat layer * H + head) need at `seen` tokens with `candidates` candidates.
  [[nodiscard]] std::int64_t need(std::int32_t session,
                                  std::int32_t h,
                                  std::int64_t seen,
                                  std::int64_t candidates) const {
    auto idx = sample_index_[static_cast<std::size_t>(h)];
    std::int64_t want;
    if (idx < 0) {
      want = retained_tokens(rules_[static_cast<std::size_t>(h)], seen);
    } else {
      auto const& rs  = needs_.samples->samples;
      auto const& smp = rs[static_cast<std::size_t>(session) % rs.size()];
      auto kept       = smp.kept[static_cast<std::size_t>(idx)];
      auto protect    = rules_[static_cast<std::size_t>(h)].protect;
      if (seen <= protect)
        want = seen;
      else if (needs_.scale == 1.0)
        want = std::max(protect, ceil_div(kept * seen, smp.context_tokens));
      else
        want = std::max(protect,
                        static_cast<std::int64_t>(std::ceil(
                            needs_.scale * static_cast<double>(kept) * static_cast<double>(seen) /
                            static_cast<double>(smp.context_tokens))));
    }
    return std::clamp<std::int64_t>(want, 0, candidates);
  }

 private:
  std::vector<head_rule> rules_;
  elastic_needs needs_;
  std::vector<std::int64_t> sample_index_;  ///< [flat head] index into a sample's kept, or -1
};

}  // namespace tangram::sim
