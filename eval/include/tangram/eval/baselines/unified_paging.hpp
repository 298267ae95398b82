// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/baselines/unified_paging.hpp
 * @brief Baselines for side-by-side measurement: pages that span all KV heads of a layer
 * (vLLM style, `page_bytes = H * 2 * P * d * sizeof(dtype)` per layer).
 *
 * - `unified_mode::full_kv`: no compression; every layer holds `ceil(n / P)` pages.
 * - `unified_mode::compressed_reclaim`: non-uniform compression on unified pages with dynamic
 *   reclamation, as serving stacks do it today: for each prefill chunk the layer first gets pages
 *   for its whole chunk (held tokens + chunk), the eviction runs, then the tail pages beyond the
 *   layer's longest head are freed. Each page freed that way is one reclamation operation.
 *
 * Neither reserves anything at admission: pages are taken as tokens arrive and a step that finds
 * no free page fails (where an engine would preempt). Same page pool as Tangram, so the figures
 * compare like with like. Single-threaded object; the pool's arena comes from the resource
 * `upstream` refers to, which must outlive the baseline.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/memory/resource_ref.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

/// @brief Which baseline a `unified_paging_baseline` models.
enum class unified_mode : std::uint8_t {
  full_kv,             ///< vLLM full-KV paging, no compression
  compressed_reclaim,  ///< non-uniform compression on layer-wide pages, tail pages freed after
                       ///< eviction
};

/// @brief Name of a baseline mode ("full_kv", "compressed_reclaim").
constexpr std::string_view to_string(unified_mode m) noexcept {
  return m == unified_mode::full_kv ? "full_kv" : "compressed_reclaim";
}

/// @brief Counters of a baseline. Plain value.
struct unified_stats {
  std::int64_t pages_allocated =
      0;  ///< pages taken from the pool, ever (a chunk's transient ones included)
  std::int64_t reclaim_ops  = 0;  ///< pages freed right after an eviction (reclamation)
  std::int64_t failed_steps = 0;  ///< chunks or decode steps refused for lack of pages
  /// Pages in use at the highest point of a chunk's forward pass (held + the whole chunk's, before
  /// the evictions free the transient ones): `unified_paging_baseline::peak_pages` reads it.
  std::int64_t forward_peak_pages = 0;
};

/**
 * @brief Layer-wide paging over a `page_pool` whose page holds all `H` KV heads of one layer.
 *
 * Ownership: owns its pool and all bookkeeping. The bookkeeping is bounded by the pool and the
 * sequences, never by `max_tokens`: each (sequence, layer) keeps its pages as a stack linked
 * through one entry per pool page, so a long `max_tokens` costs nothing until pages are taken
 * (`bookkeeping_bytes`). Not copyable or movable.
 */
class unified_paging_baseline {
 public:
  /**
   * @param plan      the model's rules (budgets decide what compression keeps)
   * @param mode      full_kv or compressed_reclaim
   * @param upstream  arena resource
   * @param num_pages pages of `H * 2 * P * d * sizeof(dtype)` bytes
   * @param max_sequences sequences alive at once
   * @param max_tokens    tokens one sequence may reach, in [1, 2^31 - 1] (a limit only: allocates
   * nothing)
   * @throw invalid_argument for non-positive sizes; out_of_memory when the arena is refused.
   */
  unified_paging_baseline(static_plan const& plan,
                          unified_mode mode,
                          resource_ref upstream,
                          std::int64_t num_pages,
                          std::int32_t max_sequences,
                          std::int64_t max_tokens)
      : mode_(mode),
        L_(plan.num_layers),
        H_(plan.num_kv_heads),
        P_(plan.geometry.page_tokens),
        S_(checked_positive(max_sequences, "max_sequences")),
        max_pages_(ceil_div(checked_max_tokens(max_tokens), plan.geometry.page_tokens)),
        // Tokens that max_pages_ pages hold, at most what a 32-bit head length can count.
        token_cap_(
            std::min<std::int64_t>(max_pages_ * P_, std::numeric_limits<std::int32_t>::max())),
        rules_(plan.rules),
        pool_(upstream, page_layout<>(layer_geometry(plan)), num_pages) {
    auto SL = static_cast<std::size_t>(S_) * static_cast<std::size_t>(L_);
    below_.assign(static_cast<std::size_t>(pool_.capacity()), -1);
    top_.assign(SL, -1);
    n_pages_.assign(SL, 0);
    len_.assign(SL * static_cast<std::size_t>(H_), 0);
    seq_tokens_.assign(static_cast<std::size_t>(S_), 0);
    tails_.assign(static_cast<std::size_t>(S_), 0);
    live_.assign(static_cast<std::size_t>(S_), 0);
    for (std::int32_t s = S_ - 1; s >= 0; --s) free_slots_.push_back(s);
  }

  unified_paging_baseline(unified_paging_baseline const&)            = delete;
  unified_paging_baseline& operator=(unified_paging_baseline const&) = delete;

  [[nodiscard]] unified_mode mode() const noexcept { return mode_; }
  [[nodiscard]] page_pool<page_layout<>> const& pool() const noexcept { return pool_; }
  [[nodiscard]] unified_stats const& stats() const noexcept { return stats_; }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return pool_.page_bytes(); }

  /// @brief Takes a slot (nothing is reserved); nullopt when every slot is taken.
  [[nodiscard]] std::optional<std::int32_t> try_admit() {
    if (free_slots_.empty()) return std::nullopt;
    std::int32_t s = free_slots_.back();
    free_slots_.pop_back();
    live_[static_cast<std::size_t>(s)] = 1;
    return s;
  }

  /**
   * @brief Prefills a chunk of `chunk_tokens`: every layer first holds pages for its longest head
   * plus the whole chunk; in compressed_reclaim mode the heads then keep `kept[layer * H + head]`
   * tokens (null: the static rule, `retained_tokens(rule, n + c)`) and the tail pages beyond the
   * longest head are freed (counted in `reclaim_ops`). With `hold_tail` those pages stay held
   * (out of `available_pages`, counted in `held_tail_pages`) until `release_tail(seq)`: an engine
   * that learns the kept counts from the GPU a step later frees them only then.
   * @return false when the pool lacks pages for the chunk (nothing changed).
   * @throw logic_error for an unknown sequence, a kept count above held + chunk, or a sequence
   *        that would pass max_tokens.
   */
  bool prefill_chunk(std::int32_t seq,
                     std::int64_t chunk_tokens,
                     std::int32_t const* kept = nullptr,
                     bool hold_tail           = false) {
    check(seq);
    // Checked: a caller's chunk near INT64_MAX must not wrap past the max_tokens check.
    auto sum       = detail::add_checked(seq_tokens_[static_cast<std::size_t>(seq)], chunk_tokens);
    std::int64_t n = sum.value_or(std::numeric_limits<std::int64_t>::max());
    TANGRAM_EXPECTS(chunk_tokens >= 1 && sum && n <= token_cap_,
                    logic_error,
                    "unified_paging_baseline::prefill_chunk: chunk of ",
                    chunk_tokens,
                    " tokens takes slot ",
                    seq,
                    " to ",
                    n,
                    " tokens (max ",
                    token_cap_,
                    ")");
    if (mode_ == unified_mode::compressed_reclaim && kept != nullptr) {
      for (std::int32_t h = 0; h < L_ * H_; ++h) {
        std::int64_t cand = len_[lh(seq, h / H_, h % H_)] + chunk_tokens;
        TANGRAM_EXPECTS(kept[h] >= 0 && kept[h] <= cand,
                        logic_error,
                        "unified_paging_baseline::prefill_chunk: head (",
                        h / H_,
                        ", ",
                        h % H_,
                        ") keeps ",
                        kept[h],
                        " of ",
                        cand,
                        " tokens");
      }
    }
    std::int64_t need = 0;
    for (std::int32_t l = 0; l < L_; ++l)
      need +=
          std::max<std::int64_t>(0, ceil_div(longest(seq, l) + chunk_tokens, P_) - n_pages(seq, l));
    if (need > available_pages()) {
      ++stats_.failed_steps;
      return false;
    }
    stats_.forward_peak_pages =
        std::max(stats_.forward_peak_pages, pool_.stats().used + held_tails_ + need);
    std::int64_t tail = 0;  // pages the evictions free
    // The scheduler gives every layer pages for the whole chunk before the forward pass; then each
    // layer's eviction runs and its tail pages are freed (reclaimed). The pages that only live
    // through the forward pass are counted (allocated, then reclaimed) but not taken from the pool:
    // the pool ends as allocating and freeing them would leave it, without the simulator's own
    // page-by-page work, which a measured control plane would otherwise charge on top of the
    // reclamation constant.
    for (std::int32_t l = 0; l < L_; ++l) {
      std::int64_t held  = n_pages(seq, l);
      std::int64_t whole = std::max(held, ceil_div(longest(seq, l) + chunk_tokens, P_));
      for (std::int32_t h = 0; h < H_; ++h) {
        auto& len         = len_[lh(seq, l, h)];
        std::int64_t keep = len + chunk_tokens;
        if (mode_ == unified_mode::compressed_reclaim)
          keep = kept ? kept[l * H_ + h]
                      : std::min(retained_tokens(rules_[static_cast<std::size_t>(l * H_ + h)], n),
                                 keep);
        len = static_cast<std::int32_t>(keep);
      }
      std::int64_t keep_pages =
          mode_ == unified_mode::compressed_reclaim ? ceil_div(longest(seq, l), P_) : whole;
      stats_.pages_allocated += whole - std::max(held, keep_pages);  // the transient ones
      stats_.reclaim_ops += whole - keep_pages;
      tail += whole - keep_pages;
      grow_to(seq, l, keep_pages);
      while (n_pages_[sl(seq, l)] > keep_pages) pop_page(seq, l);
    }
    seq_tokens_[static_cast<std::size_t>(seq)] = n;
    if (hold_tail && tail > 0) {
      tails_[static_cast<std::size_t>(seq)] += tail;
      held_tails_ += tail;
    }
    return true;
  }

  /// Free pages nothing else may take: the pool's, less the tails held for kept counts.
  [[nodiscard]] std::int64_t available_pages() const noexcept {
    return pool_.available_pages() - held_tails_;
  }
  /// Pages held past their chunk until its kept counts arrive (`prefill_chunk`'s `hold_tail`).
  [[nodiscard]] std::int64_t held_tail_pages() const noexcept { return held_tails_; }
  /// The kept counts of `seq`'s chunks reached the host: the tails held for them go. O(1).
  /// @throw logic_error for an unknown slot.
  void release_tail(std::int32_t seq) {
    check(seq);
    held_tails_ -= std::exchange(tails_[static_cast<std::size_t>(seq)], 0);
  }

  /**
   * @brief One decode token for every sequence in `seqs`: every head grows by one; a layer whose
   * longest head crosses a page boundary takes a page.
   * @return false when the pool lacks the pages (nothing changed).
   * @throw logic_error for an unknown sequence or one already at max_tokens (nothing changed).
   */
  bool decode_step(std::int32_t const* seqs, std::size_t count) {
    std::int64_t need = 0;
    for (std::size_t i = 0; i < count; ++i) {
      check(seqs[i]);
      TANGRAM_EXPECTS(seq_tokens_[static_cast<std::size_t>(seqs[i])] < token_cap_,
                      logic_error,
                      "unified_paging_baseline::decode_step: slot ",
                      seqs[i],
                      " already holds the most tokens allowed (",
                      token_cap_,
                      ")");
      for (std::int32_t l = 0; l < L_; ++l) need += longest(seqs[i], l) % P_ == 0;
    }
    if (need > available_pages()) {
      ++stats_.failed_steps;
      return false;
    }
    for (std::size_t i = 0; i < count; ++i) {
      auto s = seqs[i];
      for (std::int32_t l = 0; l < L_; ++l) {
        grow_to(s, l, ceil_div(longest(s, l) + 1, P_));
        for (std::int32_t h = 0; h < H_; ++h) ++len_[lh(s, l, h)];
      }
      ++seq_tokens_[static_cast<std::size_t>(s)];
    }
    if (held_tails_ > 0)  // held tails count as in use (peak_pages)
      stats_.forward_peak_pages =
          std::max(stats_.forward_peak_pages, pool_.stats().used + held_tails_);
    return true;
  }

  /// @brief Returns every page of the sequence and its slot. @throw logic_error for an unknown
  /// slot.
  void free(std::int32_t seq) {
    check(seq);
    for (std::int32_t l = 0; l < L_; ++l) {
      while (n_pages_[sl(seq, l)] > 0) pop_page(seq, l);
      for (std::int32_t h = 0; h < H_; ++h) len_[lh(seq, l, h)] = 0;
    }
    release_tail(seq);
    seq_tokens_[static_cast<std::size_t>(seq)] = 0;
    live_[static_cast<std::size_t>(seq)]       = 0;
    free_slots_.push_back(seq);
  }

  /**
   * @brief full_kv only: keeps the first `tokens` tokens of `seq` (every head, every layer) and
   * returns the pages beyond them to the pool, tail first (a prefix cache evicting its tail
   * blocks). Nothing changes when `tokens` >= what the sequence holds.
   * @return pages returned. @throw logic_error for an unknown slot or a compressed pool;
   *         invalid_argument for tokens < 0.
   */
  std::int64_t truncate(std::int32_t seq, std::int64_t tokens) {
    check(seq);
    TANGRAM_EXPECTS(mode_ == unified_mode::full_kv, logic_error,
                    "unified_paging_baseline::truncate: only a full_kv pool keeps a prefix");
    TANGRAM_EXPECTS(tokens >= 0, invalid_argument, "unified_paging_baseline::truncate.tokens: must be >= 0, got ",
                    tokens);
    std::int64_t freed = 0;
    for (std::int32_t l = 0; l < L_; ++l) {
      for (std::int32_t h = 0; h < H_; ++h) {
        auto& len = len_[lh(seq, l, h)];
        if (len > tokens) len = static_cast<std::int32_t>(tokens);
      }
      while (n_pages_[sl(seq, l)] > ceil_div(longest(seq, l), P_)) {
        pop_page(seq, l);
        ++freed;
      }
    }
    auto& n = seq_tokens_[static_cast<std::size_t>(seq)];
    n       = std::min(n, tokens);
    return freed;
  }

  /// Pages layer `layer` of `seq` holds.
  [[nodiscard]] std::int64_t n_pages(std::int32_t seq, std::int32_t layer) const {
    return n_pages_[sl(seq, layer)];
  }
  /// Tokens `seq` has seen (prefilled and decoded, before any eviction).
  [[nodiscard]] std::int64_t seq_tokens(std::int32_t seq) const {
    return seq_tokens_[static_cast<std::size_t>(seq)];
  }
  /// Pages in use at their highest so far: the pool's peak, or a chunk's forward pass (whose
  /// transient pages are counted, not drawn from the pool) or a decode step beside held tails
  /// (`hold_tail`), whichever is higher.
  [[nodiscard]] std::int64_t peak_pages() const {
    return std::max(pool_.stats().peak_used, stats_.forward_peak_pages);
  }
  /// Pages `seq` holds over all layers.
  [[nodiscard]] std::int64_t pages_held(std::int32_t seq) const {
    std::int64_t t = 0;
    for (std::int32_t l = 0; l < L_; ++l) t += n_pages(seq, l);
    return t;
  }
  /// Tokens head (layer, head) of `seq` holds.
  [[nodiscard]] std::int64_t head_len(std::int32_t seq,
                                      std::int32_t layer,
                                      std::int32_t head) const {
    return len_[lh(seq, layer, head)];
  }
  /// Tokens the longest head of layer `layer` of `seq` holds (what sizes the layer's pages).
  [[nodiscard]] std::int64_t longest(std::int32_t seq, std::int32_t layer) const noexcept {
    std::int32_t m = 0;
    for (std::int32_t h = 0; h < H_; ++h) m = std::max(m, len_[lh(seq, layer, h)]);
    return m;
  }
  /// Host bytes of the page tables and counters: one link per pool page plus per-sequence,
  /// per-layer and per-head counters; independent of `max_tokens`.
  [[nodiscard]] std::size_t bookkeeping_bytes() const noexcept {
    return (below_.capacity() + top_.capacity() + n_pages_.capacity() + len_.capacity() +
            free_slots_.capacity()) *
               sizeof(std::int32_t) +
           (seq_tokens_.capacity() + tails_.capacity()) * sizeof(std::int64_t) + live_.capacity();
  }
  /// Geometry of a layer-wide page: one page holds every KV head of a layer (Hp = H).
  [[nodiscard]] static page_geometry layer_geometry(static_plan const& plan) noexcept {
    return {plan.geometry.page_tokens,
            plan.num_kv_heads,
            plan.geometry.head_dim,
            plan.geometry.kv_dtype};
  }

 private:
  /// Head lengths are 32-bit, and ceil_div(max_tokens, P) must not overflow: at most 2^31 - 1.
  static std::int64_t checked_max_tokens(std::int64_t v) {
    TANGRAM_EXPECTS(v >= 1 && v <= std::numeric_limits<std::int32_t>::max(),
                    invalid_argument,
                    "unified_paging_baseline.max_tokens: must be in [1, ",
                    std::numeric_limits<std::int32_t>::max(),
                    "], got ",
                    v);
    return v;
  }
  template <class T>
  static T checked_positive(T v, char const* field) {
    TANGRAM_EXPECTS(
        v >= 1, invalid_argument, "unified_paging_baseline.", field, ": must be >= 1, got ", v);
    return v;
  }
  void check(std::int32_t seq) const {
    TANGRAM_EXPECTS(seq >= 0 && seq < S_ && live_[static_cast<std::size_t>(seq)],
                    logic_error,
                    "unified_paging_baseline: unknown sequence slot ",
                    seq);
  }
  [[nodiscard]] std::size_t sl(std::int32_t s, std::int32_t l) const noexcept {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(L_) + static_cast<std::size_t>(l);
  }
  [[nodiscard]] std::size_t lh(std::int32_t s, std::int32_t l, std::int32_t h) const noexcept {
    return sl(s, l) * static_cast<std::size_t>(H_) + static_cast<std::size_t>(h);
  }
  // Callers have checked that the pool has the pages.
  void grow_to(std::int32_t s, std::int32_t l, std::int64_t pages) {
    auto& np  = n_pages_[sl(s, l)];
    auto& top = top_[sl(s, l)];
    while (np < pages) {
      page_id p                           = *pool_.try_allocate();
      below_[static_cast<std::size_t>(p)] = top;
      top                                 = p;
      ++np;
      ++stats_.pages_allocated;
    }
  }
  // Returns the layer's last page (the tail: pages are freed in reverse order of allocation).
  void pop_page(std::int32_t s, std::int32_t l) {
    auto& top                           = top_[sl(s, l)];
    page_id p                           = top;
    top                                 = below_[static_cast<std::size_t>(p)];
    below_[static_cast<std::size_t>(p)] = -1;
    --n_pages_[sl(s, l)];
    pool_.release(p);
  }

  unified_mode mode_;
  std::int32_t L_, H_, P_, S_;
  std::int64_t max_pages_, token_cap_;
  std::vector<head_rule> rules_;
  page_pool<page_layout<>> pool_;
  // Page stacks: top_[sequence * L + layer] is the layer's last page, below_[page] the page
  // allocated before it in the same layer (-1 at the bottom).
  std::vector<page_id> below_, top_;
  std::vector<std::int32_t> n_pages_, len_;
  std::vector<std::int64_t> seq_tokens_;
  std::vector<std::int64_t> tails_;  ///< [S] pages held until release_tail
  std::int64_t held_tails_ = 0;      ///< sum of tails_
  std::vector<char> live_;
  std::vector<std::int32_t> free_slots_;
  unified_stats stats_;
};

}  // namespace tangram
