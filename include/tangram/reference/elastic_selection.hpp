// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/elastic_selection.hpp
 * @brief CPU reference of the group-aware placement of elastic reservation: at one chunk's
 * eviction, choose every head group's length (whole pages) within the request's remaining
 * reservation so that as many of the tokens the scorer wanted as possible are kept.
 *
 * Model. A request has H heads in G = H / Hp groups; `members[g * Hp + c]` is the head in column c
 * of group g. Every head has seen the same `candidates` tokens (held tokens plus the chunk) and the
 * scorer wants `need_h` of them (its per-head share of the global top-k, protected tokens
 * included). A group of p pages is p * P tokens long for every member: head h keeps its best
 * min(p * P, candidates) tokens, of which min(need_h, p * P) are wanted; a head that wants fewer
 * than the group's length keeps its next-best tokens in the padding (quality for free). Every head
 * keeps its protected tokens, so a group has at least lo = ceil(min(candidates, protect) / P)
 * pages.
 *
 * Problem: maximise W(p) = sum_g f_g(p_g), f_g(p) = sum_{h in g} min(need_h, p * P), subject to
 * p_g >= lo and sum_g p_g <= R (the remaining reservation, in pages).
 *
 * Algorithm (greedy by marginal gain per page). Start every group at lo; then repeatedly give one
 * page to the group whose next page adds the most wanted tokens, gain
 * d_g(p) = f_g(p + 1) - f_g(p) = sum_{h in g} clamp(need_h - p * P, 0, P); stop when R pages are
 * used or no page adds a wanted token (a zero-gain page would hold only padding, so it stays in
 * the reservation for later chunks). Ties go to the lower group index, so the result is
 * deterministic.
 *
 * Optimality (proved here, checked against exhaustive search in test/plan/elastic_test.cpp).
 * Each min(need_h, p * P) is a minimum of two affine functions of p, hence concave; so is f_g, and
 * d_g(p) is non-increasing in p. Any feasible p has W(p) = W(lo) + sum_g sum_{q = lo}^{p_g - 1}
 * d_g(q): a sum of at most R - G * lo marginal gains that takes a prefix of every group's
 * sequence. The greedy takes, among all marginal gains of all groups, the largest ones (each
 * group's sequence is non-increasing, so taking the largest available head of the sequences
 * never skips a larger later one), and stops before the first zero; no set of at most as many
 * prefix-closed gains has a larger sum. Hence the greedy is optimal, not just within a bound.
 *
 * Cost: O(H + (pages given above the floors) * (Hp + log G)); no allocation beyond the result and
 * a heap of G entries. Host only; pure; safe to call from any thread.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

#include "tangram/detail/checked_math.hpp"
#include "tangram/error.hpp"
#include "tangram/plan/retention.hpp"

namespace tangram::reference {

/// @brief Group lengths chosen for one chunk; see the file comment for every formula.
struct elastic_selection {
  bool fits = false;  ///< false: the protected floors alone need more pages than the reservation
  std::vector<std::int64_t> group_pages;  ///< [group] pages p_g (empty when !fits)
  std::int64_t pages_used   = 0;          ///< sum of group_pages
  std::int64_t wanted_total = 0;          ///< sum over heads of need_h
  std::int64_t wanted_kept  = 0;          ///< sum over heads of min(need_h, p_g * P)
  std::int64_t padding_kept =
      0;  ///< next-best tokens in padding: min(p_g P, candidates) - wanted kept

  /// Wanted tokens the placement could not keep.
  [[nodiscard]] std::int64_t wanted_clipped() const { return wanted_total - wanted_kept; }
};

/// @brief The inputs of one placement (views; the caller owns the storage).
struct elastic_selection_input {
  std::vector<std::int64_t> const* needs   = nullptr;  ///< [head] wanted tokens, in [0, candidates]
  std::vector<std::int32_t> const* members = nullptr;  ///< [g * Hp + c] head of column c of group g
  std::int32_t group_size                  = 4;        ///< Hp
  std::int32_t page_tokens                 = 16;       ///< P
  std::int64_t candidates                  = 0;  ///< tokens every head has seen (held + chunk)
  std::int64_t protect                     = 0;  ///< sink + window tokens every head keeps
  std::int64_t budget_pages = 0;  ///< R: the request's remaining reservation for these groups

  /// @throw invalid_argument naming the field and the value (members must be a permutation of
  ///        the heads, grouped by Hp; needs within [0, candidates]).
  void validate() const {
    TANGRAM_EXPECTS(needs != nullptr && members != nullptr,
                    invalid_argument,
                    "elastic_selection_input: needs and members must be set");
    TANGRAM_EXPECTS(group_size >= 1,
                    invalid_argument,
                    "elastic_selection_input.group_size: must be >= 1, got ",
                    group_size);
    TANGRAM_EXPECTS(page_tokens >= 1,
                    invalid_argument,
                    "elastic_selection_input.page_tokens: must be >= 1, got ",
                    page_tokens);
    TANGRAM_EXPECTS(candidates >= 0,
                    invalid_argument,
                    "elastic_selection_input.candidates: must be >= 0, got ",
                    candidates);
    TANGRAM_EXPECTS(protect >= 0,
                    invalid_argument,
                    "elastic_selection_input.protect: must be >= 0, got ",
                    protect);
    TANGRAM_EXPECTS(budget_pages >= 0,
                    invalid_argument,
                    "elastic_selection_input.budget_pages: must be >= 0, got ",
                    budget_pages);
    std::size_t heads = needs->size();
    TANGRAM_EXPECTS(members->size() == heads,
                    invalid_argument,
                    "elastic_selection_input.members: expected ",
                    heads,
                    " entries (one per head), got ",
                    members->size());
    TANGRAM_EXPECTS(heads % static_cast<std::size_t>(group_size) == 0,
                    invalid_argument,
                    "elastic_selection_input.group_size: ",
                    group_size,
                    " does not divide the ",
                    heads,
                    " heads");
    std::vector<bool> seen(heads, false);
    for (std::size_t i = 0; i < heads; ++i) {
      auto m = (*members)[i];
      TANGRAM_EXPECTS(m >= 0 && static_cast<std::size_t>(m) < heads,
                      invalid_argument,
                      "elastic_selection_input.members[",
                      i,
                      "]: head ",
                      m,
                      " out of range [0, ",
                      heads,
                      ")");
      TANGRAM_EXPECTS(!seen[static_cast<std::size_t>(m)],
                      invalid_argument,
                      "elastic_selection_input.members[",
                      i,
                      "]: head ",
                      m,
                      " appears twice");
      seen[static_cast<std::size_t>(m)] = true;
      auto n                            = (*needs)[i];
      TANGRAM_EXPECTS(n >= 0 && n <= candidates,
                      invalid_argument,
                      "elastic_selection_input.needs[",
                      i,
                      "]: must be in [0, candidates = ",
                      candidates,
                      "], got ",
                      n);
    }
  }
};

/// Wanted tokens the next page of a group at `pages` pages adds: sum of clamp(need - pages P, 0,
/// P).
inline std::int64_t elastic_page_gain(elastic_selection_input const& in,
                                      std::size_t group,
                                      std::int64_t pages) {
  std::int64_t len = pages * in.page_tokens, gain = 0;
  auto hp = static_cast<std::size_t>(in.group_size);
  for (std::size_t c = 0; c < hp; ++c) {
    auto need = (*in.needs)[static_cast<std::size_t>((*in.members)[group * hp + c])];
    gain += std::clamp<std::int64_t>(need - len, 0, in.page_tokens);
  }
  return gain;
}

/**
 * @brief Chooses every group's length in pages (the greedy of the file comment; optimal).
 * @return `fits == false` (nothing chosen) when G * ceil(min(candidates, protect) / P) pages, the
 *         protected floors, exceed `budget_pages`: not enough reservation is a result, not an
 * error.
 * @throw invalid_argument for malformed input, naming the field and the value.
 */
inline elastic_selection select_group_lengths(elastic_selection_input const& in) {
  in.validate();
  auto const& needs = *in.needs;
  std::size_t heads = needs.size();
  std::size_t G     = heads / static_cast<std::size_t>(in.group_size);
  elastic_selection out;
  for (auto n : needs)
    out.wanted_total = ::tangram::detail::add_or_throw(out.wanted_total, n, "elastic_selection: sum of needs");
  std::int64_t lo = ceil_div(std::min(in.candidates, in.protect), in.page_tokens);
  auto floors = ::tangram::detail::mul_checked(lo, static_cast<std::int64_t>(G)).value_or(in.budget_pages + 1);
  if (floors > in.budget_pages) return out;

  out.fits = true;
  out.group_pages.assign(G, lo);
  out.pages_used = floors;
  // Max-heap on (gain, -group): the largest gain first, ties to the lower group index.
  using entry = std::pair<std::int64_t, std::int64_t>;
  std::priority_queue<entry> heap;
  for (std::size_t g = 0; g < G; ++g)
    if (auto d = elastic_page_gain(in, g, lo); d > 0)
      heap.emplace(d, -static_cast<std::int64_t>(g));
  while (out.pages_used < in.budget_pages && !heap.empty()) {
    auto g = static_cast<std::size_t>(-heap.top().second);
    heap.pop();
    ++out.group_pages[g];
    ++out.pages_used;
    if (auto d = elastic_page_gain(in, g, out.group_pages[g]); d > 0)
      heap.emplace(d, -static_cast<std::int64_t>(g));
  }
  auto hp = static_cast<std::size_t>(in.group_size);
  for (std::size_t g = 0; g < G; ++g) {
    std::int64_t len = out.group_pages[g] * in.page_tokens;
    for (std::size_t c = 0; c < hp; ++c) {
      auto need   = needs[static_cast<std::size_t>((*in.members)[g * hp + c])];
      auto wanted = std::min(need, len);
      out.wanted_kept += wanted;
      out.padding_kept += std::min(len, in.candidates) - wanted;
    }
  }
  return out;
}

}  // namespace tangram::reference
