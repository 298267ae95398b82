// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/elastic_policy.hpp
 * @brief `tangram_elastic`: `tangram_policy` over an elastic copy of the plan
 * (docs/memory.md#elastic-reservation) with the group-length selection as its eviction step.
 *
 * Per prefill chunk of session s (after `prepare_chunk`): every compressed head h has seen
 * `seen` = the session's tokens after the chunk and has `cand_h` candidates (`expected_kept`).
 * Its need is MODELLED by `retention_needs` (eval/sim/retention_needs.hpp). The group lengths are
 * the optimal greedy of `reference::select_group_lengths` within `elastic_page_limit(seq)`, in the
 * form the eviction kernel runs (`elastic::select_lengths`, core/elastic_lengths.hpp: a
 * threshold search, O(G Hp log) per chunk, where the reference's heap adds one page per step,
 * O(pages); elastic_test.cpp checks the two equal); each head keeps min(its group's length in
 * tokens, cand_h). The eviction runs once per chunk outside the forward
 * pass; the policy reports what it moves beyond the fused per-layer eviction the other policies
 * run (`prefill_chunk_extra_bytes`), which the replay charges at HBM bandwidth (modelled, from
 * the kernels as built, docs/kernels.md): a head that drops candidates staged its whole chunk in
 * the column (the fused eviction writes only the chunk's survivors) and moves the survivors down,
 * at most one more read and write of each chunk token (held survivors move as in the fused
 * eviction); a head that keeps every candidate leaves the staged chunk where it is. Every staged
 * head's selection keys are written once and read 5 or 9 times (4 bytes a candidate).
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "tangram/core/elastic_lengths.hpp"
#include "tangram/eval/sim/chunk_eviction.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/elastic.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::sim {

/// @brief The group-length selection of elastic reservation as a `chunk_eviction`.
class elastic_eviction final : public chunk_eviction {
 public:
  /// @throw invalid_argument when the samples do not match the plan (KV heads, kept counts,
  ///        empty contexts) or scale <= 0.
  elastic_eviction(static_plan const& plan, elastic_needs needs)
      : plan_(plan), needs_(plan, std::move(needs)) {
    for (auto const& g : plan.grouping.groups) {
      if (g.rule.kind != layer_kind::compressed) continue;
      for (auto m : g.members) heads_.push_back(m.layer * plan.num_kv_heads + m.head);
    }
    wanted_.resize(heads_.size());
    candidates_.resize(heads_.size());
    pages_.resize(heads_.size() / static_cast<std::size_t>(plan.geometry.group_size));
  }

  /// Head h's modelled need at `seen` tokens with `candidates` candidates (file comment).
  [[nodiscard]] std::int64_t need(std::int32_t session,
                                  std::int32_t h,
                                  std::int64_t seen,
                                  std::int64_t candidates) const {
    return needs_.need(session, h, seen, candidates);
  }

  double choose(kv_cache_manager const& manager,
                sequence_id seq,
                std::int32_t session,
                std::int64_t chunk_tokens,
                std::vector<std::int32_t>& kept) override {
    std::int64_t seen = manager.info(seq).seq_tokens + chunk_tokens, most = 0;
    for (std::size_t i = 0; i < heads_.size(); ++i) {
      candidates_[i] = kept[static_cast<std::size_t>(heads_[i])];
      most           = std::max(most, candidates_[i]);
    }
    needs_.fill(session, heads_.data(), heads_.size(), seen, candidates_.data(), wanted_.data());
    // The protected floor of every group, then the optimal pages above the floors.
    auto const P       = plan_.geometry.page_tokens;
    auto const hp      = plan_.geometry.group_size;
    auto const groups  = static_cast<std::int64_t>(pages_.size());
    std::int64_t lo    = ceil_div(std::min(most, plan_.profile.protected_tokens()), P);
    std::int64_t limit = manager.elastic_page_limit(seq);
    TANGRAM_EXPECTS(lo * groups <= limit,
                    logic_error,
                    "tangram_elastic: the protected floors exceed elastic_page_limit ",
                    limit,
                    " after ",
                    seen,
                    " tokens");
    (void)elastic::select_lengths(wanted_.data(),
                                  static_cast<std::int32_t>(groups),
                                  hp,
                                  P,
                                  lo,
                                  limit - lo * groups,
                                  pages_.data());
    std::int64_t moved = 0, key_words = 0;
    for (std::size_t i = 0; i < heads_.size(); ++i) {
      auto& k  = kept[static_cast<std::size_t>(heads_[i])];
      auto len = pages_[i / static_cast<std::size_t>(hp)] * P;
      wanted_total_ += wanted_[i];
      wanted_clipped_ += wanted_[i] - std::min(wanted_[i], len);
      bool const drops = len < k;
      k                = static_cast<std::int32_t>(std::min<std::int64_t>(len, k));
      moved += drops ? chunk_tokens : 0;
      key_words += candidates_[i] * (drops ? stage_key_passes_dropping : stage_key_passes_keeping);
    }
    return 2.0 * static_cast<double>(moved) * head_token_bytes(plan_) +
           4.0 * static_cast<double>(key_words);
  }

  /// Word accesses per candidate of the stage keys (kernels/elastic_eviction.hpp): the stage
  /// launch's write and the selection's 5 reads (4 radix passes, the count); a head that drops
  /// candidates reads them 4 more times (3 histogram passes, its compaction).
  static constexpr std::int64_t stage_key_passes_keeping = 6, stage_key_passes_dropping = 10;

  /// Wanted head-tokens over every chunk's eviction so far (each chunk counts its whole need).
  [[nodiscard]] std::int64_t wanted_total() const noexcept { return wanted_total_; }
  /// Of those, the ones the selection could not keep within `elastic_page_limit`.
  [[nodiscard]] std::int64_t wanted_clipped() const noexcept { return wanted_clipped_; }

 private:
  static_plan plan_;
  retention_needs needs_;
  std::vector<std::int32_t> heads_;       ///< compressed groups' heads, Hp per group in order
  std::vector<std::int64_t> wanted_;      ///< scratch: needs in group order
  std::vector<std::int64_t> candidates_;  ///< scratch: candidates in group order
  std::vector<std::int64_t> pages_;       ///< scratch: each compressed group's length in pages
  std::int64_t wanted_total_ = 0, wanted_clipped_ = 0;
};

/**
 * @brief The static budgets' clipping, counted as `elastic_eviction` counts its own: per prefill
 * chunk, each compressed head's modelled need (`retention_needs`, capped by the tokens seen) is
 * wanted; what exceeds the count the budget keeps (`expected_kept`) is clipped. Leaves the kept
 * counts unchanged and moves no bytes (the static eviction stays fused).
 */
class static_clipping final : public chunk_eviction {
 public:
  /// @throw invalid_argument as `retention_needs`.
  static_clipping(static_plan const& plan, elastic_needs needs) : needs_(plan, std::move(needs)) {
    for (auto const& g : plan.grouping.groups) {
      if (g.rule.kind != layer_kind::compressed) continue;
      for (auto m : g.members) heads_.push_back(m.layer * plan.num_kv_heads + m.head);
    }
  }

  double choose(kv_cache_manager const& manager,
                sequence_id seq,
                std::int32_t session,
                std::int64_t chunk_tokens,
                std::vector<std::int32_t>& kept) override {
    std::int64_t seen = manager.info(seq).seq_tokens + chunk_tokens;
    for (auto h : heads_) {
      auto want = needs_.need(session, h, seen, seen);
      wanted_total_ += want;
      wanted_clipped_ += std::max<std::int64_t>(0, want - kept[static_cast<std::size_t>(h)]);
    }
    return 0.0;
  }

  /// Wanted head-tokens over every chunk so far (each chunk counts its whole need).
  [[nodiscard]] std::int64_t wanted_total() const noexcept { return wanted_total_; }
  /// Of those, the ones beyond what the static budgets keep.
  [[nodiscard]] std::int64_t wanted_clipped() const noexcept { return wanted_clipped_; }

 private:
  retention_needs needs_;
  std::vector<std::int32_t> heads_;
  std::int64_t wanted_total_ = 0, wanted_clipped_ = 0;
};

/// The share of modelled wanted head-tokens a Tangram policy's eviction step clipped (its
/// `elastic_eviction` or `static_clipping`; 0 before any chunk), or none for another step.
inline std::optional<double> wanted_clipped_fraction(tangram_policy const& policy) {
  auto fraction = [](auto const& m) {
    return m.wanted_total() > 0
               ? static_cast<double>(m.wanted_clipped()) / static_cast<double>(m.wanted_total())
               : 0.0;
  };
  if (auto const* ev = dynamic_cast<elastic_eviction const*>(policy.eviction()))
    return fraction(*ev);
  if (auto const* sc = dynamic_cast<static_clipping const*>(policy.eviction()))
    return fraction(*sc);
  return std::nullopt;
}

/// The plan of the same model, profile and options that reserves elastically with `margin`
/// (none: the plan's default, `elastic_plan_margin` of `samples` over its heads when there are
/// any, else default_elastic_margin), built by the planner (so its split map is the elastic plan's,
/// not the static one's): weighed on the placements of `samples` when given and `placements` (as
/// `tangram plan` does from samples; scaled samples no longer match a plan's heads' placements),
/// else on the groups' rules.
/// @throw invalid_argument naming the margin when it is outside [0, max_elastic_margin], or when
///        the profile (or the samples, for the margin) has no keep ratio.
inline static_plan elastic_plan(static_plan const& plan,
                                std::optional<double> margin,
                                retention_samples const* samples = nullptr,
                                bool placements                  = true) {
  auto options               = plan.options;
  options.reservation.mode   = reservation_mode::elastic;
  options.reservation.margin = margin;
  bool const have_samples    = samples != nullptr && !samples->samples.empty();
  if (have_samples && placements)  // the margin as the planner decides it from samples
    return build_static_plan(plan.model, plan.profile, options, *samples);
  auto p = build_static_plan(plan.model, plan.profile, options);
  // Scaled samples do not weigh the map, but still give the margin (of the profiled keep ratio).
  if (!margin && have_samples) p.options.reservation.margin = elastic_plan_margin(*samples, p);
  return p;
}

/**
 * @brief Bytes of the elastic stage keys (`stage_key_layout`) for one chunk of a request whose
 * compressed heads each hold up to `tokens` candidates (held + chunk): a block of
 * `ceil(tokens / P) * Hp * P` uint32 words per compressed group. The bound a preallocating engine
 * sizes its buffer by, with `tokens` its context limit. 0 tokens: 0. No request holds more than
 * the pool: with `kv_bytes` shared by the pool and the keys, at most 4 bytes a token slot of the
 * pool that is left.
 * @throw invalid_argument naming stage_key_tokens when it is negative.
 */
inline double stage_key_bytes_bound(static_plan const& plan,
                                    std::int64_t tokens,
                                    double kv_bytes = std::numeric_limits<double>::infinity()) {
  TANGRAM_EXPECTS(tokens >= 0, invalid_argument, "stage_key_tokens: must be >= 0, got ", tokens);
  const double P = plan.geometry.page_tokens, Hp = plan.geometry.group_size;
  const double words =
      tokens == 0 ? 0.0 : static_cast<double>(stage_key_words_bound(plan, tokens, 1));
  const double page_keys = sizeof(std::uint32_t) * Hp * P;  // a page's token slots' keys
  return std::min(words * sizeof(std::uint32_t),
                  kv_bytes * page_keys / (static_cast<double>(plan.page_bytes()) + page_keys));
}

/**
 * @brief The `tangram_elastic` policy: `tangram_policy` over `elastic_plan(plan, margin)` whose
 * manager stages chunks of up to `max_chunk_tokens` (the replay's prefill chunk), whose eviction
 * is `elastic_eviction` and whose answers grow by `answers` (parking when a growth does not fit;
 * with `park_for_turns`, also when a turn does not fit: `tangram_policy_options`). Its pool
 * gives up `stage_key_bytes_bound(plan, stage_key_tokens, kv_bytes)` of `kv_bytes` to the elastic
 * selection's stage keys (`eviction_params::stage_keys`), which no other policy needs: the buffer
 * for one request at the context limit, as the replay evicts each chunk on its own (an engine
 * evicting k requests' chunks in one launch needs k times that).
 */
inline std::unique_ptr<tangram_policy> make_tangram_elastic_policy(
    static_plan const& plan,
    double kv_bytes,
    std::int32_t max_sessions,
    std::int32_t num_sessions,
    std::int64_t max_chunk_tokens,
    std::optional<double> margin  = std::nullopt,
    elastic_needs needs           = {},
    answer_window_options answers = {},
    bool park_for_turns           = true,
    std::int64_t stage_key_tokens = 0) {
  // Unscaled samples weigh the split map on their placements (scaled ones no longer match it);
  // without a margin given, scaled ones still give theirs at the profiled keep ratio (with --keep
  // an approximation, as the rescaled needs are).
  auto const* samples = needs.samples ? &*needs.samples : nullptr;
  auto ep             = elastic_plan(plan, margin, samples, needs.scale == 1.0);
  tangram_policy_options o;
  o.name             = "tangram_elastic";
  o.max_chunk_tokens = max_chunk_tokens;
  o.eviction         = std::make_shared<elastic_eviction>(ep, std::move(needs));
  o.answers          = answers;
  o.park_for_turns   = park_for_turns;
  const double keys  = stage_key_bytes_bound(ep, stage_key_tokens, kv_bytes);
  return std::make_unique<tangram_policy>(
      ep, kv_bytes - keys, max_sessions, num_sessions, std::move(o));
}

}  // namespace tangram::sim
