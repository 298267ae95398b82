// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/footprint.hpp
 * @brief Exact post-compression footprint of a request, M(r), from the static plan.
 *
 * A group of a request that has seen n tokens and decoded t more holds
 * `ceil((k_group(n) + t) / P)` pages, k_group the rule of its largest member; a sliding-window
 * group holds `ceil(min(n + t, W) / P)` pages (its ring never grows beyond `ceil(W / P)`).
 * Budgets are static, so the footprint is known exactly before the request runs. Under elastic
 * reservation (plan/elastic_reservation.hpp) the compressed groups share one total instead,
 * `elastic_footprint_pages`, equally known before the request runs.
 *
 * Sizes come from callers (requests, workloads), so every function checks them: context and
 * decode must be >= 0 with `context + decode <= max_footprint_tokens`, and sums and products that
 * would overflow int64 throw `invalid_argument` naming the operands instead of wrapping.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

/// Largest `context + decode` a footprint is computed for: 2^53. Far beyond any manager (2^31 - 1
/// tokens per sequence), and small enough that `ceil(budget * n)` converts back from double
/// without overflow and per-group page counts cannot overflow.
inline constexpr std::int64_t max_footprint_tokens = std::int64_t{1} << 53;

/// Ring pages of a sliding-window group: ceil(W / P).
inline std::int64_t ring_pages(head_rule const& rule, std::int32_t page_tokens) {
  return ceil_div(rule.window, page_tokens);
}

namespace detail {
/// Checks the sizes of a footprint and returns `context + decode`.
inline std::int64_t footprint_tokens(std::int64_t context,
                                     std::int64_t decode,
                                     std::int32_t page_tokens) {
  TANGRAM_EXPECTS(context >= 0, invalid_argument, "footprint.context: must be >= 0, got ", context);
  TANGRAM_EXPECTS(decode >= 0, invalid_argument, "footprint.decode: must be >= 0, got ", decode);
  TANGRAM_EXPECTS(
      page_tokens >= 1, invalid_argument, "footprint.page_tokens: must be >= 1, got ", page_tokens);
  std::int64_t n = add_or_throw(context, decode, "footprint: context + decode");
  TANGRAM_EXPECTS(n <= max_footprint_tokens,
                  invalid_argument,
                  "footprint: context + decode = ",
                  n,
                  " exceeds ",
                  max_footprint_tokens,
                  " (2^53)");
  return n;
}
}  // namespace detail

/**
 * @brief Pages one group needs after `context` tokens of history and `decode` uncompressed tokens.
 * @throw invalid_argument when context < 0, decode < 0, page_tokens < 1, or context + decode
 *        overflows or exceeds `max_footprint_tokens` (names the values).
 */
inline std::int64_t group_pages(head_rule const& group_rule,
                                std::int64_t context,
                                std::int64_t decode,
                                std::int32_t page_tokens) {
  std::int64_t n = detail::footprint_tokens(context, decode, page_tokens);
  if (group_rule.kind == layer_kind::sliding_window)
    return ceil_div(n < group_rule.window ? n : group_rule.window, page_tokens);
  // retained_tokens(rule, context) <= context, so the sum stays <= n.
  return ceil_div(retained_tokens(group_rule, context) + decode, page_tokens);
}

/// Pages a request needs in every group: `out[g]` for group g. @throw as `group_pages`; `out` is
/// unchanged then.
inline void footprint_pages(static_plan const& plan,
                            std::int64_t context,
                            std::int64_t decode,
                            std::vector<std::int64_t>& out) {
  (void)detail::footprint_tokens(
      context, decode, plan.geometry.page_tokens);  // before `out` changes
  out.resize(plan.grouping.groups.size());
  for (std::size_t g = 0; g < out.size(); ++g)
    out[g] = group_pages(plan.grouping.groups[g].rule, context, decode, plan.geometry.page_tokens);
}

/// Total pages of a request: sum over groups. @throw as `group_pages`, or when the sum overflows.
inline std::int64_t footprint_pages(static_plan const& plan,
                                    std::int64_t context,
                                    std::int64_t decode) {
  std::int64_t total = 0;
  for (auto const& g : plan.grouping.groups)
    total = detail::add_or_throw(total,
                                 group_pages(g.rule, context, decode, plan.geometry.page_tokens),
                                 "footprint_pages: sum over groups");
  return total;
}

/// M(r) in bytes: footprint pages times page bytes. @throw as `footprint_pages`, or when the
/// product overflows.
inline std::int64_t footprint_bytes(static_plan const& plan,
                                    std::int64_t context,
                                    std::int64_t decode) {
  return detail::mul_or_throw(footprint_pages(plan, context, decode),
                              plan.page_bytes(),
                              "footprint_bytes: pages x page_bytes");
}

/// Groups of compressed heads: under elastic reservation, the ones sharing a request's total.
inline std::int64_t compressed_group_count(static_plan const& plan) noexcept {
  std::int64_t groups = 0;
  for (auto const& g : plan.grouping.groups) groups += g.rule.kind == layer_kind::compressed;
  return groups;
}

/// Staging of elastic reservation: room for one chunk of up to `max_chunk_tokens` (>= 1) in
/// each of `compressed_groups` groups, G_c ceil(max_chunk_tokens / P) pages.
/// @throw invalid_argument when the product overflows.
inline std::int64_t elastic_staging_pages(std::int64_t compressed_groups,
                                          std::int32_t page_tokens,
                                          std::int64_t max_chunk_tokens) {
  return detail::mul_or_throw(
      compressed_groups, ceil_div(max_chunk_tokens, page_tokens), "staging pages");
}

/**
 * @brief The most uint32 words `stage_key_layout` (kernels/eviction.hpp) asks for from any
 * eviction batch of at most `requests` requests whose sequences hold at most `tokens` tokens
 * each, their chunk included (the engine's context limit): requests x G_c x ceil(tokens / P) x
 * Hp x P, at least 1. A staged head's candidates (held tokens and the chunk) never exceed its
 * sequence's tokens, so an engine allocates its stage-key buffer once by this bound (4 bytes a
 * word) and passes its first `stage_key_layout` words at each chunk, instead of sizing it per
 * chunk. Llama-3.1-8B per-head pages at 131,072 tokens: 134 MB a request.
 * @throw invalid_argument naming the argument when `tokens` or `requests` is negative or above
 *        max_footprint_tokens, or when the product overflows.
 */
inline std::int64_t stage_key_words_bound(static_plan const& plan,
                                          std::int64_t tokens,
                                          std::int64_t requests) {
  TANGRAM_EXPECTS(tokens >= 0 && tokens <= max_footprint_tokens,
                  invalid_argument,
                  "stage_key_words_bound: tokens must be in [0, ",
                  max_footprint_tokens,
                  "], got ",
                  tokens);
  TANGRAM_EXPECTS(requests >= 0 && requests <= max_footprint_tokens,
                  invalid_argument,
                  "stage_key_words_bound: requests must be in [0, ",
                  max_footprint_tokens,
                  "], got ",
                  requests);
  std::int64_t const P     = plan.geometry.page_tokens;
  std::int64_t const slots = detail::mul_or_throw(ceil_div(tokens, plan.geometry.page_tokens),
                                                  P * plan.geometry.group_size,
                                                  "stage_key_words_bound: token slots of a group");
  std::int64_t const words = detail::mul_or_throw(
      detail::mul_or_throw(compressed_group_count(plan), slots, "stage_key_words_bound: groups"),
      requests,
      "stage_key_words_bound: requests");
  return std::max<std::int64_t>(words, 1);
}

namespace detail {
/// An elastic footprint's parts, in pages: the other groups' static pages, R(n) of the
/// compressed groups and their decode pages G_c ceil(T / P).
struct elastic_parts {
  std::int64_t others = 0, limit = 0, decode = 0;
};
/// @throw as `elastic_footprint_pages`.
inline elastic_parts elastic_footprint_parts(static_plan const& plan,
                                             double margin,
                                             std::int64_t context,
                                             std::int64_t decode,
                                             keep_ratio_basis basis) {
  TANGRAM_EXPECTS(decode >= 0, invalid_argument, "decode_tokens: must be >= 0, got ", decode);
  TANGRAM_EXPECTS(
      plan.profile.target_keep_ratio > 0 && plan.profile.target_keep_ratio <= 1,
      invalid_argument,
      "profile.target_keep_ratio: elastic reservation needs a keep ratio in (0, 1], got ",
      plan.profile.target_keep_ratio);
  scorer_total t{plan.profile.target_keep_ratio, plan.profile.protected_tokens(), basis};
  std::int32_t P                 = plan.geometry.page_tokens;
  std::int64_t compressed_groups = compressed_group_count(plan);
  elastic_parts out;
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed)
      out.others = add_or_throw(
          out.others, group_pages(g.rule, context, decode, P), "elastic footprint pages");
  }
  std::int32_t hp = plan.grouping.group_size;
  out.limit       = elastic_compressed_pages(t, compressed_groups * hp, hp, P, margin, context);
  out.decode      = mul_or_throw(compressed_groups, ceil_div(decode, P), "decode pages");
  return out;
}
}  // namespace detail

/**
 * @brief Elastic footprint of a request in pages under a static plan: the compressed groups
 * reserve R(n) + G_c ceil(T / P); the other groups (sliding window, uncompressed) their static
 * pages. The scorer is the plan profile's keep ratio and protected tokens. (What a manager
 * admits adds staging and caps the compressed groups' total: `admission_footprint_pages`.)
 * @throw invalid_argument as elastic_compressed_pages, or when the profile has no keep ratio.
 */
inline std::int64_t elastic_footprint_pages(static_plan const& plan,
                                            double margin,
                                            std::int64_t context,
                                            std::int64_t decode,
                                            keep_ratio_basis basis = keep_ratio_basis::all_tokens) {
  auto p = detail::elastic_footprint_parts(plan, margin, context, decode, basis);
  return detail::add_or_throw(detail::add_or_throw(p.others, p.limit, "elastic footprint pages"),
                              p.decode,
                              "elastic footprint pages");
}

/**
 * @brief Pages the same request takes uncompressed on this plan's pages: every group as if its
 * heads kept every token, ceil((context + decode) / P) (a sliding-window group keeps only its
 * window, as an uncompressed cache of that model would). The bound no admission exceeds: static
 * budgets keep at most every token, and elastic reservation caps its shared total by it
 * (`elastic_turn_pages`). In bytes it is the uncompressed KV of context + decode tokens rounded
 * to whole pages.
 * @throw invalid_argument as `group_pages`, or when the sum overflows.
 */
inline std::int64_t uncompressed_footprint_pages(static_plan const& plan,
                                                 std::int64_t context,
                                                 std::int64_t decode) {
  std::int32_t P = plan.geometry.page_tokens;
  std::int64_t n = detail::footprint_tokens(context, decode, P), total = 0;
  for (auto const& g : plan.grouping.groups)
    total = detail::add_or_throw(total,
                                 g.rule.kind == layer_kind::sliding_window
                                     ? group_pages(g.rule, context, decode, P)
                                     : ceil_div(n, P),
                                 "uncompressed footprint pages");
  return total;
}

/**
 * @brief Pages a memory manager reserves when it admits a request of N prompt and T decode
 * tokens under the plan's reservation mode: M(r) (`footprint_pages`) under static budgets; under
 * elastic reservation the other groups' static pages plus the compressed groups' shared total
 * `elastic_turn_pages(R(N), G_c ceil(T / P), staging, G_c ceil((N + T) / P))`, with staging the
 * room to stage one chunk in every compressed group, G_c ceil(min(max_chunk_tokens, N) / P), since
 * no chunk of the prompt is longer. Never more than `uncompressed_footprint_pages(plan, N, T)`.
 * @throw invalid_argument as those functions, or for max_chunk_tokens < 1.
 */
inline std::int64_t admission_footprint_pages(static_plan const& plan,
                                              std::int64_t context,
                                              std::int64_t decode,
                                              std::int64_t max_chunk_tokens) {
  auto const& r = plan.options.reservation;
  if (r.mode == reservation_mode::static_budgets) return footprint_pages(plan, context, decode);
  TANGRAM_EXPECTS(max_chunk_tokens >= 1,
                  invalid_argument,
                  "max_chunk_tokens: must be >= 1, got ",
                  max_chunk_tokens);
  // First: it validates the sizes and the profile, which the rest then uses.
  auto p = detail::elastic_footprint_parts(plan, r.margin_or_default(), context, decode, r.basis);
  std::int32_t P       = plan.geometry.page_tokens;
  std::int64_t Gc      = compressed_group_count(plan);
  std::int64_t staging = elastic_staging_pages(Gc, P, std::min(max_chunk_tokens, context));
  std::int64_t whole   = detail::mul_or_throw(Gc, ceil_div(context + decode, P), "full pages");
  return detail::add_or_throw(p.others,
                              elastic_turn_pages(p.limit, p.decode, staging, whole),
                              "admission pages: elastic footprint + staging");
}

}  // namespace tangram
