// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/retention_needs.hpp
 * @brief What each head of one input keeps, MODELLED from the retention samples (no scorer runs):
 * the per-input retention a dynamic compressor keeps. Used by `tangram_elastic`'s eviction
 * (eval/sim/elastic_policy.hpp) and by the unified-page baseline (eval/sim/policies.hpp), which
 * compresses each input to its own retention instead of Tangram's padded budgets.
 *
 *   with retention samples: sample k = session mod (number of samples), c = context_k,
 *                           p = protect_h (the profile's sink + recent-window tokens, which the
 *                           scorer always keeps), K = ceil(scale x kept_k[h]) (the head's count at
 *                           c), e = max(0, K - min(c, p)) (what it kept beyond its protected
 *                           tokens):
 *                             seen <= p:      need_h = seen
 *                             p < seen < c:   need_h = p + ceil(e x R_k(seen))
 *                             seen >= c:      need_h = max(p, ceil(scale * kept_k[h] * seen / c))
 *                           then min(need_h, cand_h). R_k(n) = X(n) / X(c), X(n) = sum over the
 *                           profiled compressed heads of kbar_p(n) - min(n, p): the scorer's
 *                           budget beyond the protected tokens at n tokens (kbar:
 *                           `scorer_total::per_head` at the samples' keep ratio x scale, at most
 *                           1, and the plan's basis); linear (the seen >= c rule) when X(c) <= 0
 *                           or the samples record no keep ratio.
 *   otherwise (a budget profile, or a layer the samples did not profile):
 *                           need_h = min(retained_tokens(rule_h, seen), cand_h)  (budget x seen)
 *
 * At and above its own context a sample scales as `retained_tokens`'s k(n) (docs/planning.md)
 * with kept / context as the budget: every head in proportion, never below the protected floor,
 * and the heads together keep the scorer's total (kbar(n) per head) as the sample does at c. Below
 * c that linear share would not: heads that kept more than the floor would shrink while the heads
 * at the floor stay there, so the heads together wanted up to 1.30x the scorer's total at
 * 8-16K tokens (ea/qwen3-4b: 1.28x on average at 12K; 1.05x for snapkv/llama-3.1-8b), which a
 * compressor with a global budget never keeps. Below c every head keeps its protected tokens and
 * the scorer's budget beyond them is shared as the sample shared its own, so the heads together
 * keep the scorer's total at every context (page and ceil rounding aside; this assumes the samples
 * were measured on the plan's keep-ratio basis, which they do not record). After a prefill chunk
 * `fill` caps each head by its candidates (held + chunk: what an earlier chunk evicted does not
 * come back) and gives what the caps cut to the heads with room, as a global budget would, so
 * chunked prefill keeps the total too. The protected floor
 * is what the real compressor does: the bundled samples keep at least sink + window (4,128 tokens)
 * in every head at every context, so an input seen only up to a few thousand tokens keeps all of
 * it (`scale` is 1 unless the budgets were rescaled to another keep ratio; it scales the ratio,
 * not the protected tokens.)
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/elastic_reservation.hpp"
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
      for (std::size_t h = 0; h < H; ++h) {
        auto flat           = static_cast<std::size_t>(layer) * H + h;
        sample_index_[flat] = static_cast<std::int64_t>(li * H + h);
        auto const& rule    = rules_[flat];
        if (rule.kind != layer_kind::compressed) continue;
        auto it = std::find_if(protects_.begin(), protects_.end(), [&](auto const& pc) {
          return pc.first == rule.protect;
        });
        if (it == protects_.end())
          protects_.emplace_back(rule.protect, 1);
        else
          ++it->second;
      }
    }
    // The scorer's budget beyond the protected tokens needs a keep ratio; without one (or without
    // a compressed profiled head) every sample scales linearly at every context, as before.
    if (rs.target_keep_ratio > 0 && rs.target_keep_ratio <= 1 && !protects_.empty()) {
      // Rescaled budgets (--keep) rescale the scorer's ratio, not the protected tokens.
      keep_ratio_ = std::min(1.0, rs.target_keep_ratio * needs_.scale);
      basis_      = plan.options.reservation.basis;
      for (auto const& smp : rs.samples) excess_at_context_.push_back(excess(smp.context_tokens));
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
      auto k          = static_cast<std::size_t>(session) % rs.size();
      auto const& smp = rs[k];
      auto kept       = smp.kept[static_cast<std::size_t>(idx)];
      auto protect    = rules_[static_cast<std::size_t>(h)].protect;
      if (seen <= protect) {
        want = seen;
      } else if (seen < smp.context_tokens && !excess_at_context_.empty() &&
                 excess_at_context_[k] > 0 && profiled(h)) {
        // Below the sample's context: the protected tokens, then the head's share of the
        // scorer's budget beyond them (file comment). The head's kept count at the context is
        // ceil(scale x kept), as above it.
        auto at_c =
            needs_.scale == 1.0
                ? kept
                : static_cast<std::int64_t>(std::ceil(needs_.scale * static_cast<double>(kept)));
        auto extra =
            std::max<std::int64_t>(0, at_c - std::min<std::int64_t>(smp.context_tokens, protect));
        want = protect + static_cast<std::int64_t>(std::ceil(static_cast<double>(extra) *
                                                             excess(seen) / excess_at_context_[k]));
      } else if (needs_.scale == 1.0)
        want = std::max(protect, ceil_div(kept * seen, smp.context_tokens));
      else
        want = std::max(protect,
                        static_cast<std::int64_t>(std::ceil(
                            needs_.scale * static_cast<double>(kept) * static_cast<double>(seen) /
                            static_cast<double>(smp.context_tokens))));
    }
    return std::clamp<std::int64_t>(want, 0, candidates);
  }

  /**
   * @brief The needs of `n` heads of one input after a prefill chunk, as a compressor with a
   * global budget keeps them: head heads[i] (flat ids) wants its uncapped need at `seen` tokens
   * but keeps at most candidates[i] (what it held plus the chunk: tokens evicted by an earlier
   * chunk do not come back); with retention samples what those caps cut goes to the profiled
   * heads still below theirs, in proportion to their room, so the heads together keep
   * min(their needs, their candidates) summed. (Below a sample's context a head's need can grow
   * faster than its tokens arrive, so a head evicted to its floor by an early chunk cannot reach
   * the sample's count; the budget it cannot use stays with the other heads.) O(n); allocates
   * nothing.
   * @param out [n] the kept counts, each in [0, candidates[i]]
   */
  void fill(std::int32_t session,
            std::int32_t const* heads,
            std::size_t n,
            std::int64_t seen,
            std::int64_t const* candidates,
            std::int64_t* out) const {
    std::int64_t cut = 0, room = 0;
    for (std::size_t i = 0; i < n; ++i) {
      auto want = need(session, heads[i], seen, std::numeric_limits<std::int64_t>::max());
      out[i]    = std::min(want, candidates[i]);
      if (!profiled(heads[i])) continue;
      cut += want - out[i];
      room += candidates[i] - out[i];
    }
    if (cut == 0 || room == 0) return;
    // Shares of the cut in proportion to each profiled head's room, rounded down (never past its
    // candidates), the rest one token each in head order.
    std::int64_t give = std::min(cut, room), given = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!profiled(heads[i])) continue;
      auto r = candidates[i] - out[i];
      auto g = static_cast<std::int64_t>(static_cast<double>(give) * static_cast<double>(r) /
                                         static_cast<double>(room));
      g      = std::min(g, r);
      out[i] += g;
      given += g;
    }
    for (std::size_t i = 0; i < n && given < give; ++i)
      if (profiled(heads[i]) && out[i] < candidates[i]) {
        ++out[i];
        ++given;
      }
  }

 private:
  /// True when head h's need follows the samples (a profiled compressed head).
  [[nodiscard]] bool profiled(std::int32_t h) const {
    return sample_index_[static_cast<std::size_t>(h)] >= 0 &&
           rules_[static_cast<std::size_t>(h)].kind == layer_kind::compressed;
  }

  /// X(n): the scorer's budget beyond the protected tokens over the profiled compressed heads.
  [[nodiscard]] double excess(std::int64_t n) const {
    double x = 0;
    for (auto const& [protect, count] : protects_) {
      scorer_total t{keep_ratio_, protect, basis_};
      x += static_cast<double>(count) *
           static_cast<double>(t.per_head(n) - std::min<std::int64_t>(n, protect));
    }
    return x;
  }

  std::vector<head_rule> rules_;
  elastic_needs needs_;
  std::vector<std::int64_t> sample_index_;  ///< [flat head] index into a sample's kept, or -1
  /// Distinct protected-token counts of the profiled compressed heads, with their head counts.
  std::vector<std::pair<std::int64_t, std::int64_t>> protects_;
  double keep_ratio_      = 0;  ///< the samples' target keep ratio (0: linear everywhere)
  keep_ratio_basis basis_ = keep_ratio_basis::all_tokens;
  std::vector<double> excess_at_context_;  ///< [sample] X(context): empty when linear everywhere
};

}  // namespace tangram::sim
