// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/parking.hpp
 * @brief Host offload of sessions (ended, or a turn in decode): the plan fingerprint a
 * `parked_session` carries, and the checks `try_unpark` and `try_resume` run on a session before
 * they change anything.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tangram/core/error.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/manager_checks.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

namespace detail {
/// FNV-1a over 64-bit words: stable across runs and builds (no std::hash), so a session parked
/// by one process restores in another over the same plan.
class fnv1a {
 public:
  void add(std::uint64_t x) noexcept {
    for (int b = 0; b < 8; ++b) {
      h_ ^= (x >> (8 * b)) & 0xffu;
      h_ *= 0x100000001b3ull;
    }
  }
  void add(double x) noexcept {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    add(bits);
  }
  void add_int(std::int64_t x) noexcept { add(static_cast<std::uint64_t>(x)); }
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};
}  // namespace detail

/**
 * @brief Hash of everything that gives a parked session's pages and lengths their meaning:
 * layers and KV heads of the rank (and a pipeline stage's first layer), page geometry (P, Hp, d,
 * dtype), each group's rule and member columns, each head's rule and slot, and the reservation
 * mode (elastic: margin, basis, keep ratio and protected tokens). Two plans with the same fingerprint lay pages out identically and size
 * turns identically. Pure, O(heads), allocation-free.
 */
[[nodiscard]] inline std::uint64_t plan_fingerprint(static_plan const& plan) {
  detail::fnv1a h;
  h.add_int(plan.num_layers);
  h.add_int(plan.num_kv_heads);
  // A pipeline stage's pages hold its own layers: the same shape on other layers is another
  // plan. (Whole-model plans hash as they did before stages.)
  if (plan.first_layer != 0) h.add_int(plan.first_layer);
  h.add_int(plan.geometry.page_tokens);
  h.add_int(plan.geometry.group_size);
  h.add_int(plan.geometry.head_dim);
  h.add_int(static_cast<std::int64_t>(plan.geometry.kv_dtype));
  auto rule = [&](head_rule const& r) {
    h.add_int(static_cast<std::int64_t>(r.kind));
    h.add(r.budget);
    h.add_int(r.protect);
    h.add_int(r.window);
  };
  h.add_int(plan.num_groups());
  for (auto const& g : plan.grouping.groups) {
    rule(g.rule);
    h.add_int(static_cast<std::int64_t>(g.members.size()));
    for (auto m : g.members) {
      h.add_int(m.layer);
      h.add_int(m.head);
    }
  }
  for (auto const& r : plan.rules) rule(r);
  for (auto s : plan.grouping.slots) {
    h.add_int(s.group);
    h.add_int(s.column);
  }
  auto const& res = plan.options.reservation;
  h.add_int(static_cast<std::int64_t>(res.mode));
  if (res.mode == reservation_mode::elastic) {
    h.add(res.margin_or_default());
    h.add_int(static_cast<std::int64_t>(res.basis));
    h.add(plan.profile.target_keep_ratio);
    h.add_int(plan.profile.protected_tokens());
  }
  return h.value();
}

namespace detail {

/**
 * @brief `try_unpark` / `try_resume` and their page counts (`op`): the session was parked under
 * this plan (`fingerprint`, page size) and describes a sequence this manager could have parked:
 * one base length per head (0 for sliding heads, at most seq_tokens - appended otherwise), one
 * page count per group equal to the pages its heads use, seq_tokens in [1, 2^31 - 1], appended in
 * [0, seq_tokens], written_tokens in [seq_tokens, 2^31 - 1]; an ended session (not `mid_turn`)
 * with decoded = max_new = 0, a turn parked in decode with appended = decoded <= max_new and
 * decoded < seq_tokens (its prompt is in).
 * @throw invalid_argument naming the field and the value.
 */
inline void check_parked_session(char const* op,
                                 parked_session const& p,
                                 std::uint64_t fingerprint,
                                 std::int64_t page_bytes,
                                 group_lookup const& groups) {
  TANGRAM_EXPECTS(p.plan_fingerprint == fingerprint,
                  invalid_argument,
                  op,
                  ".session.plan_fingerprint: ",
                  p.plan_fingerprint,
                  " is not this manager's plan (",
                  fingerprint,
                  "); a session restores only into a manager over the plan that parked it");
  TANGRAM_EXPECTS(p.page_bytes == page_bytes,
                  invalid_argument,
                  op,
                  ".session.page_bytes: expected ",
                  page_bytes,
                  ", got ",
                  p.page_bytes);
  TANGRAM_EXPECTS(p.head_base_len.size() == static_cast<std::size_t>(groups.num_heads()),
                  invalid_argument,
                  op,
                  ".session.head_base_len: expected ",
                  groups.num_heads(),
                  " lengths (layers x KV heads), got ",
                  p.head_base_len.size());
  TANGRAM_EXPECTS(p.group_pages.size() == static_cast<std::size_t>(groups.num_groups()),
                  invalid_argument,
                  op,
                  ".session.group_pages: expected ",
                  groups.num_groups(),
                  " counts (one per group), got ",
                  p.group_pages.size());
  TANGRAM_EXPECTS(p.seq_tokens >= 1 && p.seq_tokens <= max_tokens,
                  invalid_argument,
                  op,
                  ".session.seq_tokens: must be in [1, 2^31 - 1], got ",
                  p.seq_tokens);
  TANGRAM_EXPECTS(p.appended >= 0 && p.appended <= p.seq_tokens,
                  invalid_argument,
                  op,
                  ".session.appended: must be in [0, seq_tokens = ",
                  p.seq_tokens,
                  "], got ",
                  p.appended);
  TANGRAM_EXPECTS(p.written_tokens >= p.seq_tokens && p.written_tokens <= max_tokens,
                  invalid_argument,
                  op,
                  ".session.written_tokens: must be in [seq_tokens = ",
                  p.seq_tokens,
                  ", 2^31 - 1], got ",
                  p.written_tokens);
  if (p.mid_turn) {
    TANGRAM_EXPECTS(p.decoded == p.appended && p.decoded < p.seq_tokens,
                    invalid_argument,
                    op,
                    ".session.decoded: a turn parked in decode has decoded = appended = ",
                    p.appended,
                    " < seq_tokens = ",
                    p.seq_tokens,
                    ", got ",
                    p.decoded);
    TANGRAM_EXPECTS(p.max_new >= p.decoded && p.max_new <= max_tokens,
                    invalid_argument,
                    op,
                    ".session.max_new: must be in [decoded = ",
                    p.decoded,
                    ", 2^31 - 1], got ",
                    p.max_new);
  } else {
    TANGRAM_EXPECTS(p.decoded == 0 && p.max_new == 0,
                    invalid_argument,
                    op,
                    ".session: an ended session (mid_turn false) has decoded = max_new = 0, got ",
                    p.decoded,
                    " and ",
                    p.max_new);
  }
  for (std::int32_t g = 0; g < groups.num_groups(); ++g) {
    std::int64_t longest = 0;
    for (auto const* m = groups.members_begin(g); m != groups.members_end(g); ++m) {
      std::int64_t b = p.head_base_len[static_cast<std::size_t>(*m)];
      bool ok        = groups.is_sliding(g) ? b == 0 : b >= 0 && b <= p.seq_tokens - p.appended;
      TANGRAM_EXPECTS(ok,
                      invalid_argument,
                      op,
                      ".session.head_base_len[",
                      *m,
                      "]: ",
                      b,
                      groups.is_sliding(g) ? " for a sliding-window head (must be 0)"
                                           : " outside [0, seq_tokens - appended]");
      longest = std::max(longest, b);
    }
    std::int64_t use =
        groups.is_sliding(g)
            ? std::min<std::int64_t>(groups.pages_for(p.seq_tokens), groups.ring_pages(g))
            : groups.pages_for(longest + p.appended);
    TANGRAM_EXPECTS(p.group_pages[static_cast<std::size_t>(g)] == use,
                    invalid_argument,
                    op,
                    ".session.group_pages[",
                    g,
                    "]: ",
                    p.group_pages[static_cast<std::size_t>(g)],
                    " pages, but its heads' lengths use ",
                    use);
  }
}

/**
 * @brief `try_unpark` / `unpark_pages` (`op`): the session ended before it was parked; a turn
 * parked in decode resumes with `try_resume` instead.
 * @throw invalid_argument naming the field.
 */
inline void check_ended_session(char const* op, parked_session const& p) {
  TANGRAM_EXPECTS(!p.mid_turn,
                  invalid_argument,
                  op,
                  ".session.mid_turn: the session was parked in the middle of a turn (",
                  p.decoded,
                  " of ",
                  p.max_new,
                  " answer tokens decoded); resume it with try_resume, or end it after resuming");
}

/**
 * @brief `try_resume` / `resume_pages` (`op`): the session was parked in decode (`mid_turn`) and
 * its turn resumes with `max_new_tokens` answer tokens in all: at least those it decoded, and the
 * turn within 2^31 - 1 tokens ((seq_tokens - decoded) + max_new_tokens).
 * @throw invalid_argument naming the field and the value.
 */
inline void check_resume(char const* op, parked_session const& p, std::int64_t max_new_tokens) {
  TANGRAM_EXPECTS(p.mid_turn,
                  invalid_argument,
                  op,
                  ".session.mid_turn: the session ended before it was parked; restore it with "
                  "try_unpark and its next turn");
  TANGRAM_EXPECTS(
      max_new_tokens >= p.decoded && max_new_tokens <= max_tokens - (p.seq_tokens - p.decoded),
      invalid_argument,
      op,
      ".max_new_tokens: must be in [decoded = ",
      p.decoded,
      ", 2^31 - 1 - ",
      p.seq_tokens - p.decoded,
      " tokens before the answer], got ",
      max_new_tokens);
}

}  // namespace detail
}  // namespace tangram
