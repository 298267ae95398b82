// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/elastic_selection.hpp
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
 * Computed without a per-page loop, so the cost does not grow with the context length. A group's
 * gains form runs of equal value: member h adds P while p < floor(need_h / P), need_h mod P at
 * p = floor(need_h / P) and nothing after, so d_g changes only at p = floor(need_h / P) and one
 * page later, at most 2 Hp + 1 runs per group. The greedy's heap merges the groups' non-increasing
 * gain sequences by (gain descending, group ascending), page by page; taking whole runs in that
 * order, (gain descending, group ascending, first page ascending), and cutting the last one at the
 * reservation gives the same pages, tie for tie (checked against the per-page greedy in
 * test/plan/elastic_test.cpp). Cost: O(H log H) (a sort of at most 2H + G runs); memory O(H).
 * Host only; pure; safe to call from any thread.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"

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
  /// Optional [G]: pages group g keeps at least (a shared prefix's pinned pages, kept in place by
  /// the eviction); a group's floor is the larger of this and the protected floor. Null: none.
  std::vector<std::int64_t> const* floors = nullptr;

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
    if (floors != nullptr) {
      TANGRAM_EXPECTS(floors->size() == heads / static_cast<std::size_t>(group_size),
                      invalid_argument,
                      "elastic_selection_input.floors: expected ",
                      heads / static_cast<std::size_t>(group_size),
                      " entries (one per group), got ",
                      floors->size());
      for (std::size_t g = 0; g < floors->size(); ++g)
        TANGRAM_EXPECTS((*floors)[g] >= 0 && (*floors)[g] <= (std::int64_t{1} << 40),
                        invalid_argument,
                        "elastic_selection_input.floors[",
                        g,
                        "]: must be in [0, 2^40], got ",
                        (*floors)[g]);
    }
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

namespace detail {

/// A run of equal gains of one group: `pages` consecutive pages from `first`, each adding `gain`
/// wanted tokens.
struct gain_run {
  std::int64_t gain  = 0;
  std::int64_t first = 0;
  std::int64_t pages = 0;
  std::size_t group  = 0;
};

/// Appends the positive-gain runs of a group above `lo` pages, from its members' needs
/// (`sorted`, ascending; `prefix[i]` = sum of the first i): d(p) = P #{need >= (p + 1) P} +
/// sum of (need - p P) over needs in (p P, (p + 1) P).
inline void append_gain_runs(std::vector<std::int64_t> const& sorted,
                             std::vector<std::int64_t> const& prefix,
                             std::int64_t P,
                             std::int64_t lo,
                             std::size_t group,
                             std::vector<std::int64_t>& points,
                             std::vector<gain_run>& out) {
  points.assign(1, lo);
  for (auto n : sorted)
    for (auto q : {n / P, n / P + 1})
      if (q > lo) points.push_back(q);
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  auto count_below = [&](std::int64_t x) {  // needs < x
    return static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), x) -
                                    sorted.begin());
  };
  for (std::size_t i = 0; i + 1 < points.size(); ++i) {
    std::int64_t p = points[i], len = p * P;
    std::size_t a = count_below(len + 1), b = count_below(len + P);  // needs in (len, len + P)
    auto full         = static_cast<std::int64_t>(sorted.size() - b);
    std::int64_t gain = P * full + (prefix[b] - prefix[a]) - len * static_cast<std::int64_t>(b - a);
    if (gain <= 0) break;  // gains never increase: the rest are zero
    out.push_back({gain, p, points[i + 1] - p, group});
  }
}

}  // namespace detail

/**
 * @brief Chooses every group's length in pages (the greedy of the file comment; optimal).
 * @return `fits == false` (nothing chosen) when the floors (each group's max(ceil(min(candidates,
 *         protect) / P), floors[g])) exceed `budget_pages`: not enough reservation is a result,
 *         not an error.
 * @throw invalid_argument for malformed input, naming the field and the value.
 */
inline elastic_selection select_group_lengths(elastic_selection_input const& in) {
  in.validate();
  auto const& needs = *in.needs;
  std::size_t heads = needs.size();
  std::size_t G     = heads / static_cast<std::size_t>(in.group_size);
  elastic_selection out;
  for (auto n : needs)
    out.wanted_total =
        ::tangram::detail::add_or_throw(out.wanted_total, n, "elastic_selection: sum of needs");
  std::int64_t lo = ceil_div(std::min(in.candidates, in.protect), in.page_tokens);
  std::vector<std::int64_t> floor(G, lo);
  std::int64_t floors = 0;
  for (std::size_t g = 0; g < G; ++g) {
    if (in.floors != nullptr) floor[g] = std::max(lo, (*in.floors)[g]);
    auto sum = ::tangram::detail::add_checked(floors, floor[g]);
    if (!sum) return out;  // past int64: certainly more than the budget
    floors = *sum;
  }
  if (floors > in.budget_pages) return out;

  out.fits        = true;
  out.group_pages = floor;
  out.pages_used  = floors;
  auto hp         = static_cast<std::size_t>(in.group_size);
  std::vector<detail::gain_run> runs;
  runs.reserve(2 * heads + G);
  std::vector<std::int64_t> sorted(hp), prefix(hp + 1), points;
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t c = 0; c < hp; ++c)
      sorted[c] = needs[static_cast<std::size_t>((*in.members)[g * hp + c])];
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t c = 0; c < hp; ++c) prefix[c + 1] = prefix[c] + sorted[c];
    detail::append_gain_runs(sorted, prefix, in.page_tokens, floor[g], g, points, runs);
  }
  // The greedy's order: the largest gain first, ties to the lower group, a group's pages in order.
  std::sort(runs.begin(), runs.end(), [](detail::gain_run const& a, detail::gain_run const& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.group != b.group) return a.group < b.group;
    return a.first < b.first;
  });
  for (auto const& r : runs) {
    std::int64_t take = std::min(r.pages, in.budget_pages - out.pages_used);
    if (take <= 0) break;
    out.group_pages[r.group] += take;
    out.pages_used += take;
  }
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
