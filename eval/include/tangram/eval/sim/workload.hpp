// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/workload.hpp
 * @brief Multi-turn serving workloads for the replay: the workload type, the limits a trace must
 * respect and the SCBench-like generators. Evaluation code: not installed. The
 * `tangram-workload/v1` reader and writer are in eval/io/workload_io.hpp (docs/formats.md), so
 * the replay itself compiles without the JSON reader.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/detail/enum_names.hpp"
#include "tangram/core/error.hpp"

namespace tangram::sim {

/// @brief One turn of a session: the new prompt tokens, the answer length, and how long the user
/// waits after the answer before sending the next turn.
struct turn_spec {
  std::int64_t prompt_tokens = 0;
  std::int64_t output_tokens = 0;
  double think_s             = 0;
  /// The request's own max_tokens (what admission reserves for its answer); 0: the run's
  /// `replay_options::max_tokens`.
  std::int64_t max_tokens = 0;

  /// The decode tokens the turn reserves at admission: its max_tokens (or `run_max_tokens`),
  /// capped by what the context leaves, at least 1.
  [[nodiscard]] std::int64_t reservation(std::int64_t run_max_tokens,
                                         std::int64_t context_left) const {
    std::int64_t want = max_tokens > 0 ? max_tokens : run_max_tokens;
    return std::max<std::int64_t>(1, std::min(want, context_left));
  }
};

/// @brief A conversation: when it arrives and its turns (the first turn carries the long shared
/// context, later turns are follow-up questions).
struct session_spec {
  double arrival_s = 0;
  std::vector<turn_spec> turns;

  /// Tokens of the whole conversation (prompts and answers of every turn).
  [[nodiscard]] std::int64_t total_tokens() const {
    std::int64_t n = 0;
    for (auto const& t : turns) n += t.prompt_tokens + t.output_tokens;
    return n;
  }
};

/// @brief A replayable workload.
struct workload {
  std::string name;
  std::vector<session_spec> sessions;
};

/// Limits for traces read from files.
struct workload_limits {
  static constexpr std::int64_t max_sessions                    = 1000000;
  static constexpr std::int64_t max_turns                       = 10000;
  static constexpr std::int64_t max_generated_turns_per_session = 1000;  ///< `turns` of a generator
  static constexpr std::int64_t max_tokens         = std::int64_t{1} << 30;  ///< one prompt/answer
  static constexpr std::int64_t max_session_tokens = (std::int64_t{1} << 31) - 1;  ///< a session
  static constexpr std::int64_t max_total_tokens   = std::int64_t{1} << 40;        ///< whole trace
  static constexpr std::int64_t max_total_answer_tokens = std::int64_t{1} << 28;   ///< decode steps
  /// Turns of a generated workload (sessions x turns): the turns are held in memory, ~25 MB at
  /// the cap; a trace's turns are bounded by its file size instead.
  static constexpr std::int64_t max_generated_turns = std::int64_t{1} << 20;
  static constexpr double max_seconds               = 1e9;
};

/// @brief Built-in SCBench-like traffic classes.
enum class workload_kind : std::uint8_t {
  short_context,  ///< first-turn context under 20K tokens
  mid_context,    ///< 20K-100K
  long_context,   ///< over 100K
};

constexpr std::string_view to_string(workload_kind k) noexcept {
  switch (k) {
    case workload_kind::short_context:
      return "short";
    case workload_kind::mid_context:
      return "mid";
    case workload_kind::long_context:
      return "long";
  }
  return "?";
}

/// The workload kind that `to_string` spells `name` ("short", "mid", "long"), if any.
inline std::optional<workload_kind> workload_kind_named(std::string_view name) noexcept {
  static constexpr workload_kind all[] = {
      workload_kind::short_context, workload_kind::mid_context, workload_kind::long_context};
  return ::tangram::detail::enum_named(name, all);
}

/// @brief How the generator draws first-turn contexts within [LO, HI] (the class's range or
/// `workload_options::context_lo`-`context_hi`).
enum class context_dist {
  loguniform,  ///< log-uniform (the default): mean (HI - LO) / ln(HI / LO)
  uniform,     ///< uniform: mean (LO + HI) / 2
  fixed,       ///< every context (LO + HI) / 2, the uniform's mean, with no spread
};

inline constexpr char const* to_string(context_dist d) noexcept {
  switch (d) {
    case context_dist::loguniform:
      return "loguniform";
    case context_dist::uniform:
      return "uniform";
    case context_dist::fixed:
      return "fixed";
  }
  return "?";
}

/// The distribution named `name` ("loguniform", "uniform", "fixed"), or nullopt.
inline std::optional<context_dist> context_dist_named(std::string_view name) {
  static constexpr context_dist all[] = {
      context_dist::loguniform, context_dist::uniform, context_dist::fixed};
  return ::tangram::detail::enum_named(name, all);
}

/// @brief Parameters of the built-in generator.
struct workload_options {
  workload_kind kind       = workload_kind::mid_context;
  std::int32_t sessions    = 128;
  std::int32_t turns       = 5;       ///< turns per session (1 context turn + follow-ups)
  double arrival_rate      = 0;       ///< sessions per second (Poisson); 0 = all arrive at t = 0
  double think_mean_s      = 2.0;     ///< mean user think time between turns (exponential)
  std::int64_t max_context = 131072;  ///< model context limit: a whole session must fit in it
  std::uint64_t seed       = 1;
  /// First-turn context range [context_lo, context_hi] (log-uniform) instead of the class's;
  /// 0, 0: the class's (short 4096-20000, mid 20000-100000, long 100000-120000).
  std::int64_t context_lo = 0, context_hi = 0;
  /// How first-turn contexts are drawn within the range.
  context_dist contexts = context_dist::loguniform;

  /// @throw invalid_argument naming the field and the value; for sessions x turns above
  /// `workload_limits::max_generated_turns`, naming both.
  void validate() const {
    TANGRAM_EXPECTS(sessions >= 1 && sessions <= workload_limits::max_sessions,
                    invalid_argument,
                    "workload.sessions: must be in [1, 1000000], got ",
                    sessions);
    TANGRAM_EXPECTS(turns >= 1 && turns <= workload_limits::max_generated_turns_per_session,
                    invalid_argument,
                    "workload.turns: must be in [1, 1000], got ",
                    turns);
    auto total = detail::mul_checked<std::int64_t>(sessions, turns);  // both >= 1: no overflow
    TANGRAM_EXPECTS(total && *total <= workload_limits::max_generated_turns,
                    invalid_argument,
                    "workload.sessions x workload.turns: ",
                    sessions,
                    " x ",
                    turns,
                    " = ",
                    total.value_or(-1),
                    " turns, more than the limit of ",
                    workload_limits::max_generated_turns);
    TANGRAM_EXPECTS(arrival_rate >= 0 && std::isfinite(arrival_rate),
                    invalid_argument,
                    "workload.arrival_rate: must be >= 0, got ",
                    arrival_rate);
    TANGRAM_EXPECTS(think_mean_s >= 0 && std::isfinite(think_mean_s),
                    invalid_argument,
                    "workload.think_mean_s: must be >= 0, got ",
                    think_mean_s);
    TANGRAM_EXPECTS(max_context >= 4096,
                    invalid_argument,
                    "workload.max_context: must be >= 4096, got ",
                    max_context);
    TANGRAM_EXPECTS((context_lo == 0 && context_hi == 0) ||
                        (context_lo >= 1 && context_lo <= context_hi && context_hi <= max_context),
                    invalid_argument,
                    "workload.context_range: must be LO,HI with 1 <= LO <= HI <= max_context (",
                    max_context,
                    "), got ",
                    context_lo,
                    ",",
                    context_hi);
  }
};

/**
 * @brief Generates an SCBench-like multi-turn workload: a long shared context in the first turn
 * (`contexts`, log-uniform by default, within the class's range or `context_lo`-`context_hi`), then
 * follow-up questions of 64-512 tokens; answers of
 * 64-512 tokens. Deterministic for a given seed. Contexts are capped so a whole session fits in
 * `max_context` tokens.
 */
inline workload generate_workload(workload_options const& o) {
  o.validate();
  std::mt19937_64 rng(o.seed);
  double lo = 4096, hi = 20000;
  if (o.kind == workload_kind::mid_context) {
    lo = 20000;
    hi = 100000;
  } else if (o.kind == workload_kind::long_context) {
    lo = 100000;
    hi = 120000;
  }
  if (o.context_hi > 0) {
    lo = static_cast<double>(o.context_lo);
    hi = static_cast<double>(o.context_hi);
  }
  // One draw per first turn whatever the distribution, so the other draws (answers, think times,
  // arrivals) are the same for every distribution at a seed.
  std::uniform_real_distribution<double> log_ctx(std::log(lo), std::log(hi));
  auto context = [&](double x) -> std::int64_t {
    switch (o.contexts) {
      case context_dist::uniform:
        return hi > lo ? static_cast<std::int64_t>(lo + (hi - lo) * (x - std::log(lo)) /
                                                            (std::log(hi) - std::log(lo)))
                       : static_cast<std::int64_t>(lo);
      case context_dist::fixed:
        return static_cast<std::int64_t>((lo + hi) / 2);
      case context_dist::loguniform:
        break;
    }
    return static_cast<std::int64_t>(std::exp(x));
  };
  std::uniform_int_distribution<std::int64_t> small(64, 512);
  std::exponential_distribution<double> think(o.think_mean_s > 0 ? 1.0 / o.think_mean_s : 1.0);
  std::exponential_distribution<double> gap(o.arrival_rate > 0 ? o.arrival_rate : 1.0);
  workload w;
  w.name = std::string(to_string(o.kind));
  if (o.context_hi > 0)
    w.name +=
        " (contexts " + std::to_string(o.context_lo) + "-" + std::to_string(o.context_hi) + ")";
  if (o.contexts != context_dist::loguniform)
    w.name += std::string(" (") + to_string(o.contexts) + " contexts)";
  double t = 0;
  for (std::int32_t s = 0; s < o.sessions; ++s) {
    session_spec sess;
    if (o.arrival_rate > 0) t += gap(rng);
    sess.arrival_s = t;
    for (std::int32_t k = 0; k < o.turns; ++k) {
      turn_spec turn;
      turn.prompt_tokens = k == 0 ? context(log_ctx(rng)) : small(rng);
      turn.output_tokens = small(rng);
      turn.think_s       = k + 1 < o.turns && o.think_mean_s > 0 ? think(rng) : 0.0;
      sess.turns.push_back(turn);
    }
    // Fit the conversation into the model's context: shorten the shared context.
    std::int64_t excess = sess.total_tokens() - o.max_context;
    if (excess > 0)
      sess.turns[0].prompt_tokens =
          std::max<std::int64_t>(1024, sess.turns[0].prompt_tokens - excess);
    w.sessions.push_back(std::move(sess));
  }
  return w;
}

}  // namespace tangram::sim
