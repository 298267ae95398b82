// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/answer_window.hpp
 * @brief The scheduler's side of answer reservations that grow: how many answer tokens a turn
 * reserves at a time, which session to park in host memory when a growth does not fit, and how
 * much host memory parked sessions may take. Pure policy over numbers the engine owns; the
 * manager does the reservations (`try_admit`, `try_extend`) and the moves (`park`,
 * `complete_park`, `try_resume`, `try_unpark`). docs/memory.md#answer-reservations-that-grow.
 *
 * The engine loop (examples/engine_loop.cpp):
 * - admission reserves `first(max_tokens)` answer tokens, not `max_tokens`;
 * - a turn that decoded all it reserved grows by `growth(max_tokens, reserved)` (`try_extend`);
 * - when a growth does not fit, `choose_victim` names a session to park (an ended one first, by
 *   default, else a running turn, the growing one included), within `host_limit_bytes`; the
 *   engine parks it (`park`, copy-out, `complete_park`) and tries the growth again; a parked
 *   running turn resumes later with `try_resume`, an ended one with `try_unpark` at its next turn.
 *   Nothing admitted is recomputed or lost.
 *
 * Host only, no state beyond the options: safe to share between threads.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "tangram/core/detail/enum_names.hpp"
#include "tangram/core/error.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram {

/// @brief Which session `answer_window::choose_victim` parks first.
enum class park_victim_order : std::uint8_t {
  /// The least recently used ended session (it is not running: parking it delays no answer, and
  /// its next turn restores it), then the running turn started last (vLLM's preemption order:
  /// the requests that have waited longest keep decoding). The default.
  idle_then_newest,
  /// The sequence used last, ended or running (its pages were the latest promised).
  newest,
  /// The session holding the most pages (frees the most with one transfer).
  largest,
};

constexpr std::string_view to_string(park_victim_order o) noexcept {
  switch (o) {
    case park_victim_order::idle_then_newest:
      return "idle_then_newest";
    case park_victim_order::newest:
      return "newest";
    case park_victim_order::largest:
      return "largest";
  }
  return "unknown";
}

/// The order named `name` ("idle_then_newest", "newest", "largest"), if any.
inline std::optional<park_victim_order> park_victim_order_named(std::string_view name) noexcept {
  static constexpr park_victim_order all[] = {
      park_victim_order::idle_then_newest, park_victim_order::newest, park_victim_order::largest};
  return detail::enum_named(name, all);
}

/// Answer tokens a turn reserves at a time unless told otherwise: 16 pages per group at P = 16,
/// so a turn grows (`try_extend`, O(groups)) once per 256 decode steps and holds at most 256
/// answer tokens of reservation it may not use.
inline constexpr std::int64_t default_answer_window = 256;

/// Host memory parked sessions may take, as a multiple of the device pool's bytes, unless told
/// otherwise: SGLang HiCache's `--hicache-ratio 2` (host KV pool twice the device pool; SGLang's
/// HiCache best-practices guide, docs.sglang.io/advanced_features/hicache_best_practices.html).
inline constexpr double default_host_pool_ratio = 2.0;

/// @brief The options of `answer_window`; defaults an engine would pick.
struct answer_window_options {
  /// Answer tokens reserved at admission and added per growth; 0 reserves `max_tokens` up front
  /// (no growth, so no parking: the pre-window behaviour).
  std::int64_t window_tokens = default_answer_window;
  park_victim_order victims  = park_victim_order::idle_then_newest;
  /// Host bytes for parked sessions per device pool byte, >= 0 (0: nothing may be parked).
  double host_pool_ratio = default_host_pool_ratio;

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(window_tokens >= 0 && window_tokens <= std::numeric_limits<std::int32_t>::max(),
                    invalid_argument,
                    "answer_window_options.window_tokens: must be in [0, 2^31 - 1], got ",
                    window_tokens);
    TANGRAM_EXPECTS(victims == park_victim_order::idle_then_newest ||
                        victims == park_victim_order::newest ||
                        victims == park_victim_order::largest,
                    invalid_argument,
                    "answer_window_options.victims: unknown order ",
                    static_cast<int>(victims));
    TANGRAM_EXPECTS(
        std::isfinite(host_pool_ratio) && host_pool_ratio >= 0 && host_pool_ratio <= 1e6,
        invalid_argument,
        "answer_window_options.host_pool_ratio: must be in [0, 1e6], got ",
        host_pool_ratio);
  }
};

/// @brief A session the scheduler could park (`answer_window::choose_victim`).
struct park_candidate {
  sequence_id id;
  /// `ended` or `decode`; a candidate in any other phase is never chosen (the manager parks
  /// only those two).
  sequence_phase phase = sequence_phase::ended;
  /// The engine's clock (any increasing count) when the session last ran: an ended session's
  /// turn end, a running turn's admission or resume.
  std::int64_t last_used = 0;
  /// Pages a park copies out (`parked_session::host_pages`: the pages its heads use).
  std::int64_t pages = 0;
};

/**
 * @brief Answer reservations a window at a time, and whom to park when a growth does not fit.
 * A value type holding only its options.
 */
class answer_window {
 public:
  /// @throw invalid_argument as `answer_window_options::validate`.
  explicit answer_window(answer_window_options options = {}) : options_(options) {
    options_.validate();
  }

  [[nodiscard]] answer_window_options const& options() const noexcept { return options_; }

  /// Answer tokens a turn of `max_tokens` (>= 0) reserves at admission: min(window, max_tokens),
  /// or max_tokens without a window. @throw invalid_argument when max_tokens < 0.
  [[nodiscard]] std::int64_t first(std::int64_t max_tokens) const {
    TANGRAM_EXPECTS(max_tokens >= 0,
                    invalid_argument,
                    "answer_window.first.max_tokens: must be >= 0, got ",
                    max_tokens);
    return options_.window_tokens > 0 && options_.window_tokens < max_tokens
               ? options_.window_tokens
               : max_tokens;
  }

  /// Answer tokens a turn that reserved `reserved` of `max_tokens` adds when it reaches them:
  /// min(window, max_tokens - reserved); 0 when it reserved everything (it ends there).
  /// @throw invalid_argument unless 0 <= reserved <= max_tokens.
  [[nodiscard]] std::int64_t growth(std::int64_t max_tokens, std::int64_t reserved) const {
    TANGRAM_EXPECTS(reserved >= 0 && reserved <= max_tokens,
                    invalid_argument,
                    "answer_window.growth: reserved must be in [0, max_tokens = ",
                    max_tokens,
                    "], got ",
                    reserved);
    std::int64_t left = max_tokens - reserved;
    return options_.window_tokens > 0 && options_.window_tokens < left ? options_.window_tokens
                                                                       : left;
  }

  /// Host bytes parked sessions may take beside a device pool of `device_pool_bytes` (>= 0):
  /// floor(host_pool_ratio x device_pool_bytes), at most 2^62.
  /// @throw invalid_argument when device_pool_bytes < 0.
  [[nodiscard]] std::int64_t host_limit_bytes(std::int64_t device_pool_bytes) const {
    TANGRAM_EXPECTS(device_pool_bytes >= 0,
                    invalid_argument,
                    "answer_window.host_limit_bytes.device_pool_bytes: must be >= 0, got ",
                    device_pool_bytes);
    double bytes = std::floor(options_.host_pool_ratio * static_cast<double>(device_pool_bytes));
    return bytes < 0x1p62 ? static_cast<std::int64_t>(bytes) : std::int64_t{1} << 62;
  }

  /**
   * @brief The candidate to park next, by the options' order, among those in phase ended or
   * decode whose pages fit `host_bytes_free` (pages x `page_bytes`); ties go to the earlier
   * candidate. O(candidates), allocation-free.
   * @return its index in `candidates`, or nullopt when none may be parked (the engine then waits:
   *         the growth is tried again after something ends).
   * @throw invalid_argument when page_bytes < 1, host_bytes_free < 0 or a candidate's pages < 0.
   */
  [[nodiscard]] std::optional<std::size_t> choose_victim(
      std::vector<park_candidate> const& candidates,
      std::int64_t page_bytes,
      std::int64_t host_bytes_free) const {
    TANGRAM_EXPECTS(page_bytes >= 1,
                    invalid_argument,
                    "answer_window.choose_victim.page_bytes: must be >= 1, got ",
                    page_bytes);
    TANGRAM_EXPECTS(host_bytes_free >= 0,
                    invalid_argument,
                    "answer_window.choose_victim.host_bytes_free: must be >= 0, got ",
                    host_bytes_free);
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      auto const& c = candidates[i];
      TANGRAM_EXPECTS(c.pages >= 0,
                      invalid_argument,
                      "answer_window.choose_victim.candidates[",
                      i,
                      "].pages: must be >= 0, got ",
                      c.pages);
      bool parkable = c.phase == sequence_phase::ended || c.phase == sequence_phase::decode;
      if (!parkable || c.pages > host_bytes_free / page_bytes) continue;
      if (!best || before(c, candidates[*best])) best = i;
    }
    return best;
  }

 private:
  /// True when `a` is parked before `b` under the options' order.
  [[nodiscard]] bool before(park_candidate const& a, park_candidate const& b) const noexcept {
    switch (options_.victims) {
      case park_victim_order::idle_then_newest: {
        bool ai = a.phase == sequence_phase::ended, bi = b.phase == sequence_phase::ended;
        if (ai != bi) return ai;
        return ai ? a.last_used < b.last_used : a.last_used > b.last_used;
      }
      case park_victim_order::newest:
        return a.last_used > b.last_used;
      case park_victim_order::largest:
        return a.pages > b.pages;
    }
    return false;
  }

  answer_window_options options_;
};

}  // namespace tangram
