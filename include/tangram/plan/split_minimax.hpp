// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/split_minimax.hpp
 * @brief CTA counts of one layer's heads chosen directly for the load imbalance the decode pays
 * (split_weighting::batch_minimax, docs/planning.md#split-map): given each head's share of the
 * layer's tokens in every reference batch, the counts that minimise the mean over the batches of
 * the layer's fullest CTA over its mean CTA. Host only; pure; planning time, not a hot path.
 *
 * Under an AOT split a head's n_h CTAs split its tokens evenly, so in a batch where head h holds
 * the share s_h of the layer's T tokens, its CTAs each attend s_h T / n_h and the launch's load
 * imbalance (eval/split_imbalance.hpp `load_imbalance`) is N max_h s_h / n_h, N = sum_h n_h.
 * Proportional seats (`apportion`) size every head for one weight; these size them for the
 * batches' joint spread.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"

namespace tangram {

namespace detail {

/// @brief Per reference batch, the largest s_hm / n_h, the head holding it and the second largest.
struct minimax_tops {
  std::vector<double> top, second;
  std::vector<std::size_t> arg;

  void compute(std::vector<double> const& shares,
               std::vector<std::int32_t> const& seats,
               std::size_t B) {
    auto H = seats.size();
    top.assign(B, 0.0);
    second.assign(B, 0.0);
    arg.assign(B, 0);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t m = 0; m < B; ++m) {
        double r = shares[h * B + m] / seats[h];
        if (r > top[m]) {
          second[m] = top[m];
          top[m]    = r;
          arg[m]    = h;
        } else if (r > second[m]) {
          second[m] = r;
        }
      }
  }
};

/// sum_m max_h shares[h * B + m] / seats[h]: B x the objective `apportion_minimax` minimises / N.
inline double minimax_cost(std::vector<double> const& shares,
                           std::vector<std::int32_t> const& seats,
                           std::size_t B) {
  double sum = 0;
  for (std::size_t m = 0; m < B; ++m) {
    double mx = 0;
    for (std::size_t h = 0; h < seats.size(); ++h) mx = std::max(mx, shares[h * B + m] / seats[h]);
    sum += mx;
  }
  return sum;
}

/// Single-seat moves between heads of `seats` while one lowers `minimax_cost` (the best move
/// each time, at most 4 H moves); returns the final cost.
inline double minimax_refine(std::vector<double> const& shares,
                             std::vector<std::int32_t>& seats,
                             std::size_t B) {
  auto H      = seats.size();
  double cost = minimax_cost(shares, seats, B);
  for (std::size_t move = 0; move < 4 * H; ++move) {
    std::size_t from = H, to = H;
    double best = cost;
    for (std::size_t a = 0; a < H; ++a) {
      if (seats[a] <= 1) continue;
      for (std::size_t b = 0; b < H; ++b) {
        if (b == a) continue;
        seats[a] -= 1;
        seats[b] += 1;
        double c = minimax_cost(shares, seats, B);
        seats[a] += 1;
        seats[b] -= 1;
        if (c < best * (1 - 1e-12)) {
          best = c;
          from = a;
          to   = b;
        }
      }
    }
    if (from == H) break;
    seats[from] -= 1;
    seats[to] += 1;
    cost = best;
  }
  return cost;
}

}  // namespace detail

/**
 * @brief Apportions `total` CTAs to `H` heads, at least one each, to lower
 * sum_m max_h shares[h * B + m] / n_h: B x the mean over the B reference batches of the layer's
 * load imbalance / N (file comment). Two starts, each refined by single-seat moves between heads
 * while one lowers the sum (the best move each time, at most 4 H moves): greedy seat by seat from
 * one each (the seat that lowers the sum most; on a tie the head with the largest
 * sum_m s_hm / n_h, then the lower index), and `start` (e.g. proportional seats); the lower sum
 * wins, the greedy one on a tie. So the result is never worse on the reference batches than
 * `start`. Deterministic; O((total + 4 H^3) x H x B).
 * @param shares [H * B]: shares[h * B + m] >= 0, head h's share of its layer's tokens in batch m
 * @param start  H seats, each >= 1, summing to total
 * @throw invalid_argument when H or B is 0, total < H, shares has the wrong size or a negative
 *        or non-finite entry, or start is not H seats >= 1 summing to total.
 */
inline std::vector<std::int32_t> apportion_minimax(std::vector<double> const& shares,
                                                   std::size_t H,
                                                   std::size_t B,
                                                   std::int32_t total,
                                                   std::vector<std::int32_t> start) {
  TANGRAM_EXPECTS(H >= 1 && B >= 1,
                  invalid_argument,
                  "apportion_minimax: ",
                  H,
                  " heads x ",
                  B,
                  " batches (at least one of each)");
  TANGRAM_EXPECTS(total >= 0 && static_cast<std::size_t>(total) >= H,
                  invalid_argument,
                  "N_CTA = ",
                  total,
                  " is smaller than the ",
                  H,
                  " heads of a layer; every head needs at least one CTA");
  TANGRAM_EXPECTS(shares.size() == H * B,
                  invalid_argument,
                  "apportion_minimax: expected ",
                  H * B,
                  " shares, got ",
                  shares.size());
  for (std::size_t i = 0; i < shares.size(); ++i)
    TANGRAM_EXPECTS(std::isfinite(shares[i]) && shares[i] >= 0,
                    invalid_argument,
                    "apportion_minimax: share ",
                    i,
                    " is ",
                    shares[i]);
  std::int64_t start_sum = 0;
  bool start_ok          = start.size() == H;
  for (auto n : start) {
    start_ok = start_ok && n >= 1;
    start_sum += n;
  }
  TANGRAM_EXPECTS(start_ok && start_sum == total,
                  invalid_argument,
                  "apportion_minimax: start must be ",
                  H,
                  " seats >= 1 summing to ",
                  total);
  std::vector<std::int32_t> seats(H, 1);
  detail::minimax_tops t;
  for (auto left = total - static_cast<std::int32_t>(H); left > 0; --left) {
    t.compute(shares, seats, B);
    // Only the batches a head tops gain from its seat: gain_h = sum over them of top - new max.
    std::size_t best = 0;
    double best_gain = -1, best_mass = -1;
    for (std::size_t h = 0; h < H; ++h) {
      double gain = 0, mass = 0;
      for (std::size_t m = 0; m < B; ++m) {
        mass += shares[h * B + m] / seats[h];
        if (t.arg[m] != h) continue;
        double r = shares[h * B + m] / (seats[h] + 1);
        gain += t.top[m] - std::max(t.second[m], r);
      }
      if (gain > best_gain || (gain == best_gain && mass > best_mass)) {
        best      = h;
        best_gain = gain;
        best_mass = mass;
      }
    }
    seats[best] += 1;
  }
  double greedy_cost = detail::minimax_refine(shares, seats, B);
  double start_cost  = detail::minimax_refine(shares, start, B);
  return start_cost < greedy_cost ? start : seats;
}

}  // namespace tangram
