// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/group_lookup.hpp
 * @brief What a manager derives once from its plan: shape, each group's rule, window and ring,
 * its member heads, growing and sliding groups, page arithmetic over P tokens per page, and under
 * elastic reservation which groups share the request's compressed total (pooled groups).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::detail {

/// @brief Read-only lookups over a plan's head groups, built once; every query is noexcept.
class group_lookup {
 public:
  group_lookup() = default;
  /// Precondition: the plan was validated (rules cover every head, grouping consistent; under
  /// elastic reservation a keep ratio in (0, 1] and a margin in range).
  explicit group_lookup(static_plan const& plan)
      : num_layers_(plan.num_layers),
        num_kv_heads_(plan.num_kv_heads),
        page_tokens_(plan.geometry.page_tokens),
        group_size_(plan.geometry.group_size),
        elastic_(plan.options.reservation.mode == reservation_mode::elastic),
        margin_(plan.options.reservation.margin_or_default()),
        scorer_{plan.profile.target_keep_ratio,
                plan.profile.protected_tokens(),
                plan.options.reservation.basis},
        head_slots_(plan.grouping.slots),
        head_rules_(plan.rules) {
    for (std::int32_t k = 0; k < 31; ++k)
      if ((std::int32_t{1} << k) == page_tokens_) page_shift_ = k;
    auto G = static_cast<std::size_t>(plan.num_groups());
    window_.assign(G, 0);
    ring_pages_.assign(G, 0);
    member_begin_.assign(G + 1, 0);
    for (std::size_t g = 0; g < G; ++g) {
      auto const& grp = plan.grouping.groups[g];
      rules_.push_back(grp.rule);
      if (grp.rule.kind == layer_kind::sliding_window) {
        window_[g]     = grp.rule.window;
        ring_pages_[g] = static_cast<std::int32_t>(::tangram::ring_pages(grp.rule, page_tokens_));
        sliding_.push_back(static_cast<std::int32_t>(g));
      } else {
        growing_.push_back(static_cast<std::int32_t>(g));
      }
      pooled_.push_back(elastic_ && grp.rule.kind == layer_kind::compressed);
      if (pooled_.back()) {
        pooled_groups_.push_back(static_cast<std::int32_t>(g));
        pooled_protect_ = std::max<std::int64_t>(pooled_protect_, grp.rule.protect);
      }
      for (auto m : grp.members) members_.push_back(m.layer * num_kv_heads_ + m.head);
      member_begin_[g + 1] = static_cast<std::int32_t>(members_.size());
    }
  }

  [[nodiscard]] std::int32_t num_layers() const noexcept { return num_layers_; }
  [[nodiscard]] std::int32_t num_kv_heads() const noexcept { return num_kv_heads_; }
  /// Heads of the rank: layers x KV heads (flat head index layer * H + head).
  [[nodiscard]] std::int32_t num_heads() const noexcept { return num_layers_ * num_kv_heads_; }
  [[nodiscard]] std::int32_t num_groups() const noexcept {
    return static_cast<std::int32_t>(rules_.size());
  }
  [[nodiscard]] std::int32_t page_tokens() const noexcept { return page_tokens_; }

  /// @throw invalid_argument naming `op` when g is not a group.
  void check_group(std::int32_t g, char const* op) const {
    TANGRAM_EXPECTS(g >= 0 && g < num_groups(),
                    invalid_argument,
                    op,
                    ": group ",
                    g,
                    " out of range [0, ",
                    num_groups(),
                    ")");
  }
  /// @throw invalid_argument naming `op` when (layer, head) is not a head of the rank.
  void check_head(std::int32_t layer, std::int32_t head, char const* op) const {
    TANGRAM_EXPECTS(layer >= 0 && layer < num_layers_ && head >= 0 && head < num_kv_heads_,
                    invalid_argument,
                    op,
                    ": head (layer ",
                    layer,
                    ", head ",
                    head,
                    ") out of range (",
                    num_layers_,
                    " x ",
                    num_kv_heads_,
                    ")");
  }

  /// The rule of flat head h (layer * H + head); a group's rule is its largest member's.
  [[nodiscard]] head_rule const& head_rule_of(std::int32_t h) const noexcept {
    return head_rules_[static_cast<std::size_t>(h)];
  }
  [[nodiscard]] head_rule const& rule(std::int32_t g) const noexcept {
    return rules_[static_cast<std::size_t>(g)];
  }
  [[nodiscard]] bool is_sliding(std::int32_t g) const noexcept {
    return window_[static_cast<std::size_t>(g)] > 0;
  }
  /// True when every head of group g is uncompressed: its chunks and decode tokens are only
  /// appended, so a page its heads have all filled is never written again. O(members).
  [[nodiscard]] bool append_only(std::int32_t g) const noexcept {
    for (auto const* m = members_begin(g); m != members_end(g); ++m)
      if (head_rule_of(*m).kind != layer_kind::uncompressed) return false;
    return true;
  }
  [[nodiscard]] std::int32_t window(std::int32_t g) const noexcept {
    return window_[static_cast<std::size_t>(g)];
  }
  [[nodiscard]] std::int32_t ring_pages(std::int32_t g) const noexcept {
    return ring_pages_[static_cast<std::size_t>(g)];
  }
  /// Flat head indices of group g's members: [members_begin(g), members_end(g)).
  [[nodiscard]] std::int32_t const* members_begin(std::int32_t g) const noexcept {
    return members_.data() + member_begin_[static_cast<std::size_t>(g)];
  }
  [[nodiscard]] std::int32_t const* members_end(std::int32_t g) const noexcept {
    return members_.data() + member_begin_[static_cast<std::size_t>(g) + 1];
  }
  [[nodiscard]] std::vector<std::int32_t> const& growing_groups() const noexcept {
    return growing_;
  }
  [[nodiscard]] std::vector<std::int32_t> const& sliding_groups() const noexcept {
    return sliding_;
  }

  /// True under elastic reservation.
  [[nodiscard]] bool elastic() const noexcept { return elastic_; }
  /// True when group g draws from its sequence's shared (pooled) budget: a compressed group under
  /// elastic reservation. Other groups have a budget of their own.
  [[nodiscard]] bool pooled(std::int32_t g) const noexcept {
    return pooled_[static_cast<std::size_t>(g)] != 0;
  }
  [[nodiscard]] std::vector<std::int32_t> const& pooled_groups() const noexcept {
    return pooled_groups_;
  }
  /// Pages a sequence's pooled groups may hold beyond their target to stage one chunk of up to
  /// `max_chunk_tokens` tokens before its eviction (0 without pooled groups); the manager's
  /// options bound it (chunk <= 2^31 - 1, groups <= 2^20), so it does not overflow.
  [[nodiscard]] std::int64_t staging_pages(std::int64_t max_chunk_tokens) const {
    return elastic_staging_pages(
        static_cast<std::int64_t>(pooled_groups_.size()), page_tokens_, max_chunk_tokens);
  }
  /// R(n): pages the pooled groups may hold after n tokens of prompt (plan/elastic_reservation.hpp;
  /// 0 without pooled groups). Precondition: 0 <= n <= 2^31 - 1 (the manager's turn-size check),
  /// so the validated plan's arithmetic cannot overflow or throw.
  [[nodiscard]] std::int64_t pooled_pages(std::int64_t n) const {
    if (pooled_groups_.empty()) return 0;
    auto heads = static_cast<std::int64_t>(pooled_groups_.size()) * group_size_;
    return elastic_compressed_pages(scorer_, heads, group_size_, page_tokens_, margin_, n);
  }

  /// Pages the elastic eviction keeps at least in a pooled group whose heads lead with `pinned`
  /// tokens (a shared prefix's, kept in place; kernels/elastic_eviction.hpp): the pinned and
  /// protected tokens, bounded above by pinned + the largest pooled `protect`; for an unpinned
  /// group the protected floor alone.
  [[nodiscard]] std::int64_t pooled_floor_pages(std::int64_t pinned) const noexcept {
    return pages_for(pinned + pooled_protect_);
  }

  /// K(n): the scorer's total over the pooled groups' heads after n tokens (what the elastic
  /// eviction keeps before page rounding; 0 without pooled groups). Same precondition on n.
  [[nodiscard]] std::int64_t pooled_wanted(std::int64_t n) const {
    if (pooled_groups_.empty()) return 0;
    return scorer_.tokens(static_cast<std::int64_t>(pooled_groups_.size()) * group_size_, n);
  }

  // View arrays (their storage lives here for the manager's lifetime).
  [[nodiscard]] head_slot const* head_slots() const noexcept { return head_slots_.data(); }
  [[nodiscard]] head_slot head_slot_of(std::int32_t flat_head) const noexcept {
    return head_slots_[static_cast<std::size_t>(flat_head)];
  }
  [[nodiscard]] std::int32_t const* windows() const noexcept { return window_.data(); }
  [[nodiscard]] std::int32_t const* ring_page_counts() const noexcept { return ring_pages_.data(); }

  /// x mod P for x >= 0 (a mask when P is a power of two: decode steps avoid divisions).
  [[nodiscard]] std::int32_t mod_page(std::int64_t x) const noexcept {
    return static_cast<std::int32_t>(page_shift_ >= 0 ? (x & (page_tokens_ - 1))
                                                      : x % page_tokens_);
  }
  /// ceil(x / P) for x >= 0.
  [[nodiscard]] std::int64_t pages_for(std::int64_t x) const noexcept {
    return page_shift_ >= 0 ? (x + page_tokens_ - 1) >> page_shift_ : ceil_div(x, page_tokens_);
  }
  /// Pages group g needs to hold its lengths once the history reached n tokens.
  [[nodiscard]] std::int64_t pages_after(std::int32_t g, std::int64_t n) const noexcept {
    if (is_sliding(g)) return std::min<std::int64_t>(pages_for(n), ring_pages(g));
    return pages_for(retained_tokens(rule(g), n));
  }

 private:
  std::int32_t num_layers_ = 0, num_kv_heads_ = 0, page_tokens_ = 1;
  std::int32_t page_shift_ = -1;  ///< log2(P) when P is a power of two, else -1
  std::int32_t group_size_ = 1;
  bool elastic_            = false;
  double margin_           = 0;
  scorer_total scorer_;
  std::vector<std::uint8_t> pooled_;
  std::vector<std::int32_t> pooled_groups_;
  std::int64_t pooled_protect_ = 0;  ///< the largest `protect` of a pooled group's rule
  std::vector<head_slot> head_slots_;
  std::vector<head_rule> head_rules_;
  std::vector<head_rule> rules_;
  std::vector<std::int32_t> window_, ring_pages_;
  std::vector<std::int32_t> members_, member_begin_;
  std::vector<std::int32_t> growing_, sliding_;
};

}  // namespace tangram::detail
