// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/kv_cache_manager.hpp
 * @brief The engine-facing KV-cache manager: admission with exact reservations, head-group page
 * tables in stable slots, chunked prefill with fused eviction, decode, multi-turn sessions, forks
 * with copy-on-write, and the batch view the kernels and the CPU reference read.
 *
 * One manager per tensor-parallel rank, built over that rank's `static_plan`; `try_admit_all`
 * admits a request on every rank or on none.
 *
 * Per step, an engine calls (see docs/memory.md for the full protocol):
 * - `try_admit(N, T)` once per request: reserves the exact footprint M(r) or answers "does not
 *   fit" (nullopt) and changes nothing. An admitted request never runs out of pages.
 * - per prefill chunk: `prepare_chunk(seq, c)` (pages for the lengths after the chunk are drawn
 *   from the reservation), then the fused eviction kernel, then `commit_chunk(seq, kept)` with the
 *   per-head kept counts it produced.
 * - per decode step: `set_batch(ids)` when the batch changes, `decode_step()` (room for one token
 *   per head of every batch member), then `view()` for the attention kernel.
 * - `end_turn(seq)`, `continue_turn(seq, N, T)`, `fork(seq)`, `free(seq)`.
 *
 * Thread safety: a single-threaded object. Every call, including `view()`, must be serialised by
 * the caller. The returned `kv_cache_view` is a non-owning snapshot of pointers into the manager's
 * host arrays: valid until the next mutating call; it may be read by several threads at once
 * while no mutating call runs. Pages are written only by the engine's kernels (or host code for a
 * host pool); the manager never reads or writes page contents.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/detail/checked_math.hpp"
#include "tangram/detail/str.hpp"
#include "tangram/error.hpp"
#include "tangram/memory/detail/turn_footprint.hpp"
#include "tangram/memory/kv_view.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_layout.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/memory/segment_arena.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/retention.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

namespace detail {
/// Defined only by tests that corrupt a manager on purpose to show that `check_invariants`
/// catches it; the library never defines it.
struct kv_cache_manager_test_access;
}  // namespace detail

/// @brief Handle of a sequence: its stable slot plus a generation that detects stale handles.
struct sequence_id {
  std::int32_t slot        = -1;
  std::uint32_t generation = 0;
  friend bool operator==(sequence_id a, sequence_id b) {
    return a.slot == b.slot && a.generation == b.generation;
  }
  friend bool operator!=(sequence_id a, sequence_id b) { return !(a == b); }
};

/// @brief Where a sequence is in its current turn.
enum class sequence_phase : std::uint8_t {
  free,     ///< the slot holds no sequence
  prefill,  ///< prompt tokens of the turn remain to be prefilled
  decode,   ///< the prompt is in; decode tokens may be appended
  ended,    ///< the turn ended: compressed history kept, no reservation held
};

/// @brief Lower-case name of a phase ("free", "prefill", "decode", "ended").
constexpr std::string_view to_string(sequence_phase p) noexcept {
  switch (p) {
    case sequence_phase::free:
      return "free";
    case sequence_phase::prefill:
      return "prefill";
    case sequence_phase::decode:
      return "decode";
    case sequence_phase::ended:
      return "ended";
  }
  return "?";
}

/// @brief Sizes chosen when a manager is built.
struct manager_options {
  std::int64_t num_pages      = 0;    ///< pages in the pool; when 0, `pool_bytes / page_bytes`
  std::int64_t pool_bytes     = 0;    ///< bytes of KV memory (used when num_pages is 0)
  std::int32_t max_sequences  = 256;  ///< slots: sequences alive at once (forks included)
  std::int32_t max_batch      = 0;    ///< largest batch of `set_batch`; 0 means max_sequences
  std::int64_t index_capacity = 0;  ///< entries of the page-id arena; 0: 2 * pages + 4 * slots * G
  std::int64_t max_view_changes =
      0;  ///< journal entries before a full resync; 0: 4 * max_batch + 1024

  /// Field ranges only; the manager's constructor also checks the sizes derived from the plan
  /// (pages from pool_bytes, FlashInfer's 32-bit virtual page ids).
  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(
        num_pages >= 0 && num_pages <= page_pool<>::max_pages,
        invalid_argument,
        "manager_options.num_pages: must be in [0, 2^31 - 1] (page ids are 32-bit), got ",
        num_pages);
    TANGRAM_EXPECTS(pool_bytes >= 0,
                    invalid_argument,
                    "manager_options.pool_bytes: must be >= 0, got ",
                    pool_bytes);
    TANGRAM_EXPECTS(max_sequences >= 1 && max_sequences <= (1 << 20),
                    invalid_argument,
                    "manager_options.max_sequences: must be in [1, 1048576], got ",
                    max_sequences);
    TANGRAM_EXPECTS(max_batch >= 0 && max_batch <= max_sequences,
                    invalid_argument,
                    "manager_options.max_batch: must be in [0, max_sequences = ",
                    max_sequences,
                    "], got ",
                    max_batch);
    TANGRAM_EXPECTS(
        index_capacity >= 0 && index_capacity <= std::numeric_limits<std::int32_t>::max(),
        invalid_argument,
        "manager_options.index_capacity: must be in [0, 2^31 - 1], got ",
        index_capacity);
    TANGRAM_EXPECTS(
        max_view_changes >= 0 && max_view_changes <= std::numeric_limits<std::int32_t>::max(),
        invalid_argument,
        "manager_options.max_view_changes: must be in [0, 2^31 - 1], got ",
        max_view_changes);
  }
};

/// @brief What the manager knows about one sequence. Plain value.
struct sequence_info {
  sequence_id id;
  sequence_phase phase    = sequence_phase::free;
  std::int64_t seq_tokens = 0;  ///< tokens seen (prompts + decoded, all turns)
  std::int64_t appended = 0;  ///< tokens appended to every growing head since the last compression
  std::int64_t prompt_remaining = 0;  ///< prompt tokens of this turn not yet committed
  std::int64_t chunk_pending    = 0;  ///< tokens of a prepared, uncommitted chunk (0: none)
  std::int64_t max_new          = 0;  ///< decode tokens reserved for this turn (T)
  std::int64_t decoded          = 0;  ///< decode tokens appended in this turn
  std::int64_t reserved_pages   = 0;  ///< pages still promised to the sequence
  std::int64_t held_pages = 0;  ///< entries in its page lists (shared pages count once per holder)
};

/// @brief Counters of a manager's life. Plain value.
struct manager_stats {
  std::int64_t admitted          = 0;  ///< successful try_admit
  std::int64_t rejected          = 0;  ///< try_admit that did not fit
  std::int64_t turns_continued   = 0;  ///< successful continue_turn
  std::int64_t continue_rejected = 0;  ///< continue_turn that did not fit
  std::int64_t forks             = 0;  ///< successful fork
  std::int64_t fork_rejected     = 0;  ///< fork that did not fit
  std::int64_t freed             = 0;  ///< sequences freed
  std::int64_t pages_drawn       = 0;  ///< pages taken from reservations
  std::int64_t surplus_pages_released =
      0;  ///< held pages returned when a recompression or turn end no longer needed them
  std::int64_t reclaimed_pages = 0;  ///< pages freed in the same chunk that drew them (0 by design)
  std::int64_t page_copies     = 0;  ///< copy-on-write copies recorded
  std::int64_t index_compactions = 0;  ///< times the page-id arena was repacked
};

/// @brief A page copy the engine must perform (whole page, K and V) before the next kernel that
/// reads `dst` or writes `src`.
struct page_copy {
  page_id src = 0;
  page_id dst = 0;
  friend bool operator==(page_copy a, page_copy b) { return a.src == b.src && a.dst == b.dst; }
};

/**
 * @brief Copies whole pages inside one host arena: `base + dst * page_bytes` gets the bytes of
 * `base + src * page_bytes`, for every entry of `copies`, in order.
 * @note Host memory only. For a device pool the engine issues the equivalent cudaMemcpyAsync
 * (or one batched copy kernel) on its stream.
 */
inline void copy_pages_host(std::byte* base,
                            std::int64_t page_bytes,
                            page_copy const* copies,
                            std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    std::memcpy(base + static_cast<std::int64_t>(copies[i].dst) * page_bytes,
                base + static_cast<std::int64_t>(copies[i].src) * page_bytes,
                static_cast<std::size_t>(page_bytes));
}

/**
 * @brief FlashInfer's paged-KV CSR for one layer of a batch, one single-head "request" per
 * (batch request r, KV head h) at index `r * num_kv_heads + h`.
 *
 * A virtual page is one head's `P x d` block: K of head column c of pool page p is virtual page
 * `p * 2 * Hp + c` of a tensor `[num_virtual_pages, P, d]` starting at the pool base; V uses the
 * same indices with the base offset by `v_offset_elements = Hp * P * d` elements. So
 * `k_data = pool`, `v_data = pool + v_offset_elements`, `stride_page = P * d`, `num_heads = 1`.
 *
 * Sliding-window heads: the list starts at the page holding the oldest held token; the first
 * `first_page_skip[j]` tokens of that page are not part of the window (mask them, e.g. through
 * the kernel's window_left), and a ring whose oldest token is mid-page lists that page again at
 * the end. Growing heads always have `first_page_skip == 0`. A head with no tokens has no pages
 * and `last_page_len == 0`.
 */
struct flashinfer_paged_kv {
  std::vector<std::int32_t> indptr;           ///< [requests + 1]
  std::vector<std::int32_t> indices;          ///< [indptr.back()] virtual page ids
  std::vector<std::int32_t> last_page_len;    ///< [requests], in [1, P] for non-empty heads
  std::vector<std::int32_t> first_page_skip;  ///< [requests] leading tokens to mask
  std::int32_t page_size            = 0;      ///< P
  std::int64_t v_offset_elements    = 0;      ///< Hp * P * d
  std::int64_t page_stride_elements = 0;      ///< P * d, the stride between virtual pages

  /// Tokens FlashInfer will see for request j (including the masked skip).
  [[nodiscard]] std::int64_t kv_len(std::size_t j) const {
    std::int64_t pages = indptr[j + 1] - indptr[j];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[j];
  }
};

/// @brief What changed in the view's index arrays since the last `clear_view_changes()`: enough
/// for an engine that mirrors them on the device to upload only the changes.
struct view_changes {
  std::int32_t const* page_entries = nullptr;  ///< indices into `pages` that were written
  std::size_t num_page_entries     = 0;
  std::int32_t const* slots = nullptr;  ///< slots whose page_offset / head_base_len rows changed
  std::size_t num_slots     = 0;
  bool full_resync = false;  ///< too many changes, or the arena was repacked: upload everything
};

/// @brief Element counts of the arrays behind a view (for mirroring them on a device).
struct kv_view_extents {
  std::int64_t head_slots    = 0;  ///< L * H
  std::int64_t groups        = 0;  ///< G (group_window, group_ring_pages)
  std::int64_t page_offset   = 0;  ///< slots * G
  std::int64_t pages         = 0;  ///< index capacity
  std::int64_t head_base_len = 0;  ///< slots * L * H
  std::int64_t slots         = 0;  ///< appended, seq_tokens
  std::int64_t batch         = 0;  ///< batch_slots in use
};

/**
 * @brief The KV-cache manager of one tensor-parallel rank.
 *
 * @tparam Layout   page geometry type of the pool (`page_layout<>` dynamic by default; a static
 *                  layout must agree with the plan's geometry).
 * @tparam Upstream resource type the pool's arena comes from (`memory_resource` by default).
 *
 * Ownership: owns its pool (and so the arena, returned to `upstream` at destruction) and every
 * host array of the view; `upstream` must outlive the manager. All arrays are sized at
 * construction: admission, chunk, decode and free never allocate memory (fork, continue_turn and
 * the FlashInfer export may grow the pending-copy list or the caller's output vectors).
 * Not copyable or movable.
 */
template <class Layout = page_layout<>, class Upstream = memory_resource>
class basic_kv_cache_manager {
 public:
  using pool_type = page_pool<Layout, Upstream>;

  /**
   * @brief Builds the manager and takes the pool's arena from `upstream`.
   * @throw invalid_argument for bad options or a plan whose geometry the Layout cannot hold.
   * @throw out_of_memory when the upstream cannot provide the arena.
   */
  basic_kv_cache_manager(static_plan const& plan,
                         Upstream& upstream,
                         manager_options const& options)
      : plan_(checked_plan(plan)),
        options_(checked_options(options, plan)),
        pool_(upstream, Layout(plan.geometry), options_.num_pages) {
    L_ = plan_.num_layers;
    H_ = plan_.num_kv_heads;
    G_ = plan_.num_groups();
    P_ = plan_.geometry.page_tokens;
    S_ = options_.max_sequences;
    for (std::int32_t k = 0; k < 31; ++k)
      if ((std::int32_t{1} << k) == P_) p_shift_ = k;
    auto LH = static_cast<std::size_t>(L_) * static_cast<std::size_t>(H_);
    auto SG = static_cast<std::size_t>(S_) * static_cast<std::size_t>(G_);

    head_slots_ = plan_.grouping.slots;
    group_window_.assign(static_cast<std::size_t>(G_), 0);
    group_ring_pages_.assign(static_cast<std::size_t>(G_), 0);
    member_begin_.assign(static_cast<std::size_t>(G_) + 1, 0);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto const& grp = plan_.grouping.groups[static_cast<std::size_t>(g)];
      if (grp.rule.kind == layer_kind::sliding_window) {
        group_window_[static_cast<std::size_t>(g)] = grp.rule.window;
        group_ring_pages_[static_cast<std::size_t>(g)] =
            static_cast<std::int32_t>(ring_pages(grp.rule, P_));
        sliding_groups_.push_back(g);
      } else {
        growing_groups_.push_back(g);
      }
      for (auto m : grp.members) members_.push_back(m.layer * H_ + m.head);
      member_begin_[static_cast<std::size_t>(g) + 1] = static_cast<std::int32_t>(members_.size());
    }
    NG_ = static_cast<std::int32_t>(growing_groups_.size());

    page_offset_.assign(SG, 0);
    n_pages_.assign(SG, 0);
    cap_.assign(SG, 0);
    target_.assign(SG, 0);
    budget_.assign(SG, 0);
    max_base_.assign(SG, 0);
    min_base_.assign(SG, 0);
    prev_pages_.assign(SG, 0);
    head_base_len_.assign(static_cast<std::size_t>(S_) * LH, 0);
    appended_.assign(static_cast<std::size_t>(S_), 0);
    seq_tokens_.assign(static_cast<std::size_t>(S_), 0);
    slots_.resize(static_cast<std::size_t>(S_));
    for (std::int32_t s = S_ - 1; s >= 0; --s) free_slots_.push_back(s);
    bucket_start_.assign(static_cast<std::size_t>(S_) * static_cast<std::size_t>(P_ + 1), 0);
    bucket_groups_.assign(static_cast<std::size_t>(S_) * static_cast<std::size_t>(NG_), 0);
    pages_.assign(static_cast<std::size_t>(options_.index_capacity), -1);
    segments_ = segment_arena(options_.index_capacity, S_);
    batch_slots_.assign(static_cast<std::size_t>(options_.max_batch), 0);
    batch_gen_.assign(static_cast<std::size_t>(options_.max_batch), 0);
    batch_mark_.assign(static_cast<std::size_t>(S_), 0);
    order_.reserve(static_cast<std::size_t>(S_));
    change_entries_.reserve(static_cast<std::size_t>(options_.max_view_changes));
    change_slots_.reserve(static_cast<std::size_t>(S_));
    slot_changed_.assign(static_cast<std::size_t>(S_), 0);
    chunk_need_.assign(static_cast<std::size_t>(G_), 0);
    footprint_ = detail::turn_footprint(G_);
  }

  basic_kv_cache_manager(basic_kv_cache_manager const&)            = delete;
  basic_kv_cache_manager& operator=(basic_kv_cache_manager const&) = delete;
  basic_kv_cache_manager(basic_kv_cache_manager&&)                 = delete;
  basic_kv_cache_manager& operator=(basic_kv_cache_manager&&)      = delete;
  ~basic_kv_cache_manager()                                        = default;

  // ===== shape ==================================================================================

  [[nodiscard]] static_plan const& plan() const noexcept { return plan_; }
  [[nodiscard]] manager_options const& options() const noexcept { return options_; }
  [[nodiscard]] pool_type const& pool() const noexcept { return pool_; }
  [[nodiscard]] std::int32_t num_groups() const noexcept { return G_; }
  [[nodiscard]] std::int32_t max_sequences() const noexcept { return S_; }
  [[nodiscard]] manager_stats const& stats() const noexcept { return stats_; }
  /// Sequences alive (any phase but free).
  [[nodiscard]] std::int32_t live_sequences() const noexcept {
    return S_ - static_cast<std::int32_t>(free_slots_.size());
  }

  // ===== admission ==============================================================================

  /**
   * @brief Pages a new request of N prompt tokens and T max new tokens reserves: M(r) / page_bytes
   * (`footprint_pages`). Pure; does not touch the pool.
   */
  [[nodiscard]] std::int64_t admission_pages(std::int64_t prompt_tokens,
                                             std::int64_t max_new_tokens) const {
    return footprint_pages(plan_, prompt_tokens, max_new_tokens);
  }

  /**
   * @brief Admits a request: reserves its whole footprint M(r) (every group's pages after N prompt
   * tokens and T decode tokens) in one step and gives it a slot.
   * @return the new sequence, or nullopt ("does not fit": no free slot, not enough unreserved
   *         pages, or no room in the page-id arena); nothing changes then.
   * @throw invalid_argument when N < 1, T < 0, or N + T exceeds 2^31 - 1 or overflows int64
   *        (names the values); nothing changes then. A size no sequence may have is bad input;
   *        only a request the pool, the slots or the page-id arena cannot hold now "does not fit".
   */
  [[nodiscard]] std::optional<sequence_id> try_admit(std::int64_t prompt_tokens,
                                                     std::int64_t max_new_tokens) {
    // Validate and size everything before the first change (strong guarantee).
    check_turn_sizes("try_admit", 0, prompt_tokens, max_new_tokens);
    size_turn(turn_kind::admit, -1, prompt_tokens, max_new_tokens);
    std::int64_t total = footprint_.reserve_total();
    if (free_slots_.empty() || total > pool_.available_pages() || !ensure_index_room(total)) {
      ++stats_.rejected;
      return std::nullopt;
    }
    // Both succeed (checked just above); the slot is taken last, when nothing can fail.
    auto reservation   = pool_.try_reserve(total);
    std::int64_t begin = *segments_.allocate(total);
    std::int32_t s     = free_slots_.back();
    free_slots_.pop_back();
    auto& st           = slot(s);
    st.reservation     = std::move(*reservation);
    st.seg_begin       = begin;
    st.seg_size        = total;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i          = sg(s, g);
      auto f          = footprint_.target(g);
      page_offset_[i] = static_cast<std::int32_t>(begin);
      cap_[i]         = static_cast<std::int32_t>(f);
      target_[i]      = static_cast<std::int32_t>(f);
      budget_[i]      = static_cast<std::int32_t>(f);
      n_pages_[i]     = 0;
      max_base_[i]    = 0;
      min_base_[i]    = 0;
      begin += f;
    }
    auto LH = static_cast<std::ptrdiff_t>(L_) * H_;
    std::fill_n(head_base_len_.begin() + s * LH, LH, 0);
    appended_[static_cast<std::size_t>(s)]   = 0;
    seq_tokens_[static_cast<std::size_t>(s)] = 0;
    st.phase                                 = sequence_phase::prefill;
    st.prompt_remaining                      = prompt_tokens;
    st.chunk_pending                         = 0;
    st.max_new                               = max_new_tokens;
    st.decoded                               = 0;
    st.may_share                             = false;
    reset_buckets(s);
    note_slot_changed(s);
    ++stats_.admitted;
    return sequence_id{s, st.generation};
  }

  // ===== chunked prefill ========================================================================

  /**
   * @brief Before the fused eviction of a prompt chunk of `chunk_tokens` runs: draws from the
   * reservation the pages every group needs for its lengths after the chunk (compressed:
   * `retained_tokens(group rule, n + c)`; uncompressed: n + c; sliding: its ring up to
   * `min(n + c, W)` tokens). Head lengths do not change until `commit_chunk`.
   * @throw logic_error (nothing changed) for an unknown sequence, a sequence not in prefill, a
   *        chunk already prepared, or a chunk longer than the prompt tokens that remain.
   * @throw invalid_argument when chunk_tokens < 1.
   */
  void prepare_chunk(sequence_id seq, std::int64_t chunk_tokens) {
    std::int32_t s = check(seq, "prepare_chunk");
    auto& st       = slot(s);
    TANGRAM_EXPECTS(chunk_tokens >= 1,
                    invalid_argument,
                    "prepare_chunk.chunk_tokens: must be >= 1, got ",
                    chunk_tokens);
    TANGRAM_EXPECTS(st.phase == sequence_phase::prefill,
                    logic_error,
                    "prepare_chunk: sequence in slot ",
                    s,
                    " is in phase ",
                    to_string(st.phase),
                    ", not prefill");
    TANGRAM_EXPECTS(st.chunk_pending == 0,
                    logic_error,
                    "prepare_chunk: sequence in slot ",
                    s,
                    " already has a prepared chunk of ",
                    st.chunk_pending,
                    " tokens; commit it first");
    TANGRAM_EXPECTS(chunk_tokens <= st.prompt_remaining,
                    logic_error,
                    "prepare_chunk: chunk_tokens ",
                    chunk_tokens,
                    " exceeds the ",
                    st.prompt_remaining,
                    " prompt tokens left in the turn of slot ",
                    s);
    std::int64_t n = seq_tokens_[static_cast<std::size_t>(s)] + chunk_tokens;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i                                = sg(s, g);
      auto need                             = need_pages(g, n);
      chunk_need_[static_cast<std::size_t>(g)] = need;
      auto draws                            = need > n_pages_[i] ? need - n_pages_[i] : 0;
      TANGRAM_EXPECTS(draws <= budget_[i] && need <= cap_[i],
                      logic_error,
                      "prepare_chunk: group ",
                      g,
                      " of slot ",
                      s,
                      " needs ",
                      need,
                      " pages but holds ",
                      n_pages_[i],
                      " with ",
                      budget_[i],
                      " reserved (internal inconsistency)");
    }
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i         = sg(s, g);
      prev_pages_[i] = n_pages_[i];
      while (n_pages_[i] < chunk_need_[static_cast<std::size_t>(g)]) draw_into(s, g);
    }
    st.chunk_pending = chunk_tokens;
  }

  /**
   * @brief Expected kept count of every head after the prepared-or-next chunk of `chunk_tokens`:
   * `min(retained_tokens(rule, n + c), held + c)` for compressed heads, n + c for uncompressed,
   * `min(n + c, W)` for sliding ones. Writes `L * H` values to `out` ([layer * H + head]).
   * @throw logic_error for an unknown sequence or a chunk longer than the prompt tokens left;
   *        invalid_argument when chunk_tokens < 0. `out` is unchanged then.
   */
  void expected_kept(sequence_id seq, std::int64_t chunk_tokens, std::int32_t* out) const {
    std::int32_t s = check(seq, "expected_kept");
    TANGRAM_EXPECTS(chunk_tokens >= 0,
                    invalid_argument,
                    "expected_kept.chunk_tokens: must be >= 0, got ",
                    chunk_tokens);
    // Bounds n + c by the turn's admitted size (<= 2^31 - 1), so the counts fit in int32.
    TANGRAM_EXPECTS(chunk_tokens <= slot(s).prompt_remaining,
                    logic_error,
                    "expected_kept: chunk_tokens ",
                    chunk_tokens,
                    " exceeds the ",
                    slot(s).prompt_remaining,
                    " prompt tokens left in the turn of slot ",
                    s);
    std::int64_t n = seq_tokens_[static_cast<std::size_t>(s)] + chunk_tokens;
    for (std::int32_t h = 0; h < L_ * H_; ++h)
      out[h] = static_cast<std::int32_t>(expected_for(s, h, n, chunk_tokens));
  }

  /**
   * @brief After the fused eviction ran: records each head's kept count (`kept[layer * H + head]`,
   * `count == L * H`). Compressed heads may keep at most `expected_kept` (the reservation assumes
   * the static rule); uncompressed and sliding heads must keep exactly their expected count.
   * Pages a recompression left unneeded (held beyond this turn's target) return to the pool here.
   * @throw logic_error (nothing changed) naming the head and the values when a count violates the
   *        rule, or when no chunk is prepared; invalid_argument when count != L * H.
   */
  void commit_chunk(sequence_id seq, std::int32_t const* kept, std::size_t count) {
    std::int32_t s = check(seq, "commit_chunk");
    auto& st       = slot(s);
    TANGRAM_EXPECTS(count == static_cast<std::size_t>(L_) * static_cast<std::size_t>(H_),
                    invalid_argument,
                    "commit_chunk.kept: expected ",
                    L_ * H_,
                    " counts (layers x KV heads), got ",
                    count);
    TANGRAM_EXPECTS(st.chunk_pending > 0,
                    logic_error,
                    "commit_chunk: sequence in slot ",
                    s,
                    " has no prepared chunk");
    std::int64_t c = st.chunk_pending;
    std::int64_t n = seq_tokens_[static_cast<std::size_t>(s)] + c;
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      std::int64_t expect = expected_for(s, h, n, c);
      auto kind           = plan_.rules[static_cast<std::size_t>(h)].kind;
      bool ok =
          kind == layer_kind::compressed ? kept[h] >= 0 && kept[h] <= expect : kept[h] == expect;
      TANGRAM_EXPECTS(ok,
                      logic_error,
                      "commit_chunk: head (layer ",
                      h / H_,
                      ", head ",
                      h % H_,
                      ") of slot ",
                      s,
                      " kept ",
                      kept[h],
                      " tokens; a ",
                      to_string(kind),
                      " head must keep ",
                      kind == layer_kind::compressed ? "between 0 and " : "exactly ",
                      expect,
                      " after ",
                      n,
                      " tokens");
    }
    auto* base = &head_base_len_[static_cast<std::size_t>(s) * static_cast<std::size_t>(L_ * H_)];
    for (std::int32_t h = 0; h < L_ * H_; ++h)
      base[h] =
          plan_.rules[static_cast<std::size_t>(h)].kind == layer_kind::sliding_window ? 0 : kept[h];
    appended_[static_cast<std::size_t>(s)]   = 0;
    seq_tokens_[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(n);
    st.prompt_remaining -= c;
    st.chunk_pending = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i = sg(s, g);
      refresh_base_range(s, g);
      // Pages beyond this turn's target hold nothing the turn will need again: decode tokens of
      // the previous turn that this recompression dropped.
      while (n_pages_[i] > target_[i]) {
        --n_pages_[i];
        if (n_pages_[i] >= prev_pages_[i]) ++stats_.reclaimed_pages;
        ++stats_.surplus_pages_released;
        pool_.release(entry(s, g, n_pages_[i]));
      }
    }
    if (st.prompt_remaining == 0) st.phase = sequence_phase::decode;
    rebuild_buckets(s);
    note_slot_changed(s);
  }

  /// @brief `commit_chunk` with a vector of `L * H` counts.
  void commit_chunk(sequence_id seq, std::vector<std::int32_t> const& kept) {
    commit_chunk(seq, kept.data(), kept.size());
  }

  // ===== batch and decode =======================================================================

  /**
   * @brief Sets the batch the view and `decode_step` run over: request r is sequence ids[r].
   * O(batch), allocation-free.
   * @throw logic_error (batch unchanged) for an unknown sequence or a sequence listed twice;
   *        invalid_argument when count exceeds max_batch.
   */
  void set_batch(sequence_id const* ids, std::size_t count) {
    TANGRAM_EXPECTS(count <= batch_slots_.size(),
                    invalid_argument,
                    "set_batch: ",
                    count,
                    " sequences exceed max_batch ",
                    batch_slots_.size());
    std::size_t i = 0;
    try {
      for (; i < count; ++i) {
        std::int32_t s = check(ids[i], "set_batch");
        TANGRAM_EXPECTS(!batch_mark_[static_cast<std::size_t>(s)],
                        logic_error,
                        "set_batch: sequence in slot ",
                        s,
                        " is listed twice");
        batch_mark_[static_cast<std::size_t>(s)] = 1;
      }
    } catch (...) {
      for (std::size_t j = 0; j < i; ++j) batch_mark_[static_cast<std::size_t>(ids[j].slot)] = 0;
      throw;
    }
    for (std::size_t j = 0; j < count; ++j) {
      batch_mark_[static_cast<std::size_t>(ids[j].slot)] = 0;
      batch_slots_[j]                                    = ids[j].slot;
      batch_gen_[j]                                      = ids[j].generation;
    }
    batch_size_ = static_cast<std::int32_t>(count);
  }
  /// @brief `set_batch` from a vector.
  void set_batch(std::vector<sequence_id> const& ids) { set_batch(ids.data(), ids.size()); }

  /// Requests in the current batch.
  [[nodiscard]] std::int32_t batch_size() const noexcept { return batch_size_; }
  /// The sequence of request r of the current batch (it may have been freed since `set_batch`).
  /// @throw invalid_argument when r is not in [0, batch_size()).
  [[nodiscard]] sequence_id batch_sequence(std::int32_t r) const {
    TANGRAM_EXPECTS(r >= 0 && r < batch_size_,
                    invalid_argument,
                    "batch_sequence.r: must be in [0, ",
                    batch_size_,
                    "), got ",
                    r);
    return {batch_slots_[static_cast<std::size_t>(r)], batch_gen_[static_cast<std::size_t>(r)]};
  }

  /**
   * @brief Makes room for one decode token in every head of every sequence of the batch and
   * counts it (call before the attention kernel that writes the token's K/V). Touches O(batch)
   * counters plus one page-table entry per group that crosses a page boundary; draws those pages
   * from the reservations, so it never fails for lack of memory. Allocation-free.
   * @throw logic_error (nothing changed) when a batch member was freed, is not in the decode
   *        phase, or already appended its T reserved tokens this turn.
   */
  void decode_step() {
    check_batch_live("decode_step");
    for (std::int32_t r = 0; r < batch_size_; ++r) {
      std::int32_t s = batch_slots_[static_cast<std::size_t>(r)];
      auto const& st = slots_[static_cast<std::size_t>(s)];
      TANGRAM_EXPECTS(st.phase == sequence_phase::decode,
                      logic_error,
                      "decode_step: sequence in slot ",
                      s,
                      " is in phase ",
                      to_string(st.phase),
                      ", not decode");
      TANGRAM_EXPECTS(st.decoded < st.max_new,
                      logic_error,
                      "decode_step: sequence in slot ",
                      s,
                      " already appended its max_new_tokens = ",
                      st.max_new,
                      " decode tokens; appending past the reservation");
    }
    for (std::int32_t r = 0; r < batch_size_; ++r)
      append_one(batch_slots_[static_cast<std::size_t>(r)]);
  }

  // ===== turns, forks, free =====================================================================

  /**
   * @brief Ends the current turn (prompt done): unused reserved pages return to the pool and the
   * compressed history stays (pages beyond what the longest head uses are released as surplus).
   * @throw logic_error (nothing changed) for an unknown sequence or one not in the decode phase.
   */
  void end_turn(sequence_id seq) {
    std::int32_t s = check(seq, "end_turn");
    auto& st       = slot(s);
    TANGRAM_EXPECTS(st.phase == sequence_phase::decode,
                    logic_error,
                    "end_turn: sequence in slot ",
                    s,
                    " is in phase ",
                    to_string(st.phase),
                    "; a turn ends after its prompt is prefilled");
    pool_.release_unused(st.reservation);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i     = sg(s, g);
      auto inuse = in_use_pages(s, g);
      while (n_pages_[i] > inuse) {
        --n_pages_[i];
        ++stats_.surplus_pages_released;
        pool_.release(entry(s, g, n_pages_[i]));
      }
      budget_[i] = 0;
      target_[i] = n_pages_[i];
    }
    st.phase = sequence_phase::ended;
  }

  /**
   * @brief Starts the next turn of an ended session with `prompt_tokens` new prompt tokens and
   * `max_new_tokens` decode tokens. Reserves per group only the increment
   * `final_g - (pages it holds exclusively below final_g)`, i.e. `max(0, final_g - held_g)` when
   * nothing is shared, where final_g = group_pages(rule, n + N, T). Pages shared with a fork that
   * the recompression will overwrite are copied now (see `pending_copies`).
   * @return false ("does not fit") when the pool or the page-id arena lacks room; nothing
   *         changes then (the arena may have been repacked, which moves no logical state).
   * @throw logic_error for an unknown sequence or one whose turn has not ended;
   *        invalid_argument for N < 1, T < 0 or n + N + T past 2^31 - 1 (also when the sum
   *        overflows int64); std::bad_alloc when the pending-copy list cannot grow. Nothing
   *        changes when it throws.
   */
  [[nodiscard]] bool continue_turn(sequence_id seq,
                                   std::int64_t prompt_tokens,
                                   std::int64_t max_new_tokens) {
    std::int32_t s = check(seq, "continue_turn");
    auto& st       = slot(s);
    TANGRAM_EXPECTS(st.phase == sequence_phase::ended,
                    logic_error,
                    "continue_turn: sequence in slot ",
                    s,
                    " is in phase ",
                    to_string(st.phase),
                    "; call end_turn first");
    std::int64_t n = seq_tokens_[static_cast<std::size_t>(s)];
    check_turn_sizes("continue_turn", n, prompt_tokens, max_new_tokens);
    size_turn(turn_kind::next_turn, s, n + prompt_tokens, max_new_tokens);
    std::int64_t total = footprint_.reserve_total(), seg = footprint_.capacity_total();
    bool relocate = footprint_.grows_capacity();
    if (total > pool_.available_pages() || (relocate && !ensure_index_room(seg))) {
      ++stats_.continue_rejected;
      return false;
    }
    reserve_copies(footprint_.copies_total());  // the only allocation: before any change
    if (relocate) move_segment(s, seg);
    (void)pool_.try_extend(st.reservation, total);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i            = sg(s, g);
      auto fin          = footprint_.target(g);
      target_[i]        = static_cast<std::int32_t>(fin);
      std::int64_t keep = std::min<std::int64_t>(n_pages_[i], fin);
      budget_[i]        = static_cast<std::int32_t>(footprint_.reserve(g));
      prev_pages_[i]    = n_pages_[i];
      // Only a forked sequence can share pages; the scan is skipped for everyone else, which
      // keeps continue_turn O(groups) on the common path.
      for (std::int64_t p = 0; st.may_share && p < keep; ++p) {
        page_id src = entry(s, g, p);
        if (pool_.ref_count(src) == 1) continue;
        // Shared with a fork and about to be overwritten by the recompression: copy on write.
        // Our reference moves to the pending copy, which releases it once the engine copied.
        page_id dst = draw_page(s, g);
        pool_.retain(dst);
        set_entry(s, g, p, dst);
        pending_copies_.push_back({src, dst});
        ++stats_.page_copies;
      }
    }
    st.phase            = sequence_phase::prefill;
    st.prompt_remaining = prompt_tokens;
    st.chunk_pending    = 0;
    st.max_new          = max_new_tokens;
    st.decoded          = 0;
    note_slot_changed(s);
    ++stats_.turns_continued;
    return true;
  }

  /**
   * @brief Forks a sequence (decode phase or ended): the child sees the same history. Pages every
   * head has filled are shared by reference count; the pages heads may still write (the partial
   * tail of each growing group, every page of a sliding ring) are copied into new pages, recorded
   * in `pending_copies`. The child reserves what its turn may still need (its parent's target).
   * @return the child, or nullopt ("does not fit"; nothing changed).
   * @throw logic_error for an unknown sequence or one in prefill; std::bad_alloc when the
   *        pending-copy list cannot grow. Nothing changes when it throws.
   */
  [[nodiscard]] std::optional<sequence_id> fork(sequence_id parent) {
    std::int32_t s = check(parent, "fork");
    auto const& ps = slot(s);
    TANGRAM_EXPECTS(ps.phase == sequence_phase::decode || ps.phase == sequence_phase::ended,
                    logic_error,
                    "fork: sequence in slot ",
                    s,
                    " is in phase ",
                    to_string(ps.phase),
                    "; fork after the prompt is prefilled");
    size_turn(turn_kind::fork, s, 0, 0);
    std::int64_t total = footprint_.reserve_total(), seg = footprint_.capacity_total();
    if (free_slots_.empty() || total > pool_.available_pages() || !ensure_index_room(seg)) {
      ++stats_.fork_rejected;
      return std::nullopt;
    }
    reserve_copies(footprint_.copies_total());  // the only allocation: before any change
    // Both succeed (checked above); the slot is taken last, when nothing can fail.
    auto reservation   = pool_.try_reserve(total);
    std::int64_t begin = *segments_.allocate(seg);
    std::int32_t c     = free_slots_.back();
    free_slots_.pop_back();
    auto& cs           = slot(c);
    auto const& p2     = slot(s);
    cs.reservation     = std::move(*reservation);
    cs.seg_begin       = begin;
    cs.seg_size        = seg;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto pi = sg(s, g), ci = sg(c, g);
      auto tgt    = footprint_.target(g);
      auto shared = shared_pages(s, g), inuse = in_use_pages(s, g);
      page_offset_[ci] = static_cast<std::int32_t>(begin);
      cap_[ci]         = static_cast<std::int32_t>(tgt);
      target_[ci]      = static_cast<std::int32_t>(tgt);
      budget_[ci]      = static_cast<std::int32_t>(footprint_.reserve(g));
      n_pages_[ci]     = 0;
      max_base_[ci]    = max_base_[pi];
      min_base_[ci]    = min_base_[pi];
      begin += tgt;
      for (std::int64_t p = 0; p < shared; ++p) {
        page_id pg = entry(s, g, p);
        pool_.retain(pg);
        set_entry(c, g, n_pages_[ci]++, pg);
      }
      for (std::int64_t p = shared; p < inuse; ++p) {
        page_id src = entry(s, g, p);
        page_id dst = draw_page(c, g);
        set_entry(c, g, n_pages_[ci]++, dst);
        pool_.retain(src);
        pool_.retain(dst);
        pending_copies_.push_back({src, dst});
        ++stats_.page_copies;
      }
    }
    auto LH = static_cast<std::ptrdiff_t>(L_) * H_;
    std::copy_n(head_base_len_.begin() + s * LH, LH, head_base_len_.begin() + c * LH);
    appended_[static_cast<std::size_t>(c)]   = appended_[static_cast<std::size_t>(s)];
    seq_tokens_[static_cast<std::size_t>(c)] = seq_tokens_[static_cast<std::size_t>(s)];
    cs.phase                                 = p2.phase;
    cs.prompt_remaining                      = 0;
    cs.chunk_pending                         = 0;
    cs.max_new                               = p2.max_new;
    cs.decoded                               = p2.decoded;
    cs.may_share                             = true;
    slot(s).may_share                        = true;
    rebuild_buckets(c);
    note_slot_changed(c);
    ++stats_.forks;
    return sequence_id{c, cs.generation};
  }

  /**
   * @brief Frees a sequence in any phase (also mid-chunk: an abort): its page references and its
   * unused reservation return to the pool and its slot becomes free (old handles go stale).
   * A batch that listed it must be set again before the next `decode_step`. Pending page copies
   * keep their own references, so freeing never invalidates a copy the engine has not run.
   * @throw logic_error (nothing changed) for an unknown sequence.
   */
  void free(sequence_id seq) {
    std::int32_t s = check(seq, "free");
    auto& st       = slot(s);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i = sg(s, g);
      for (std::int32_t p = 0; p < n_pages_[i]; ++p) pool_.release(entry(s, g, p));
      n_pages_[i] = cap_[i] = target_[i] = budget_[i] = 0;
    }
    pool_.release_unused(st.reservation);
    segments_.free(st.seg_begin, st.seg_size);
    st.seg_begin = st.seg_size = 0;
    st.phase                   = sequence_phase::free;
    st.prompt_remaining = st.chunk_pending = st.max_new = st.decoded = 0;
    ++st.generation;
    appended_[static_cast<std::size_t>(s)] = seq_tokens_[static_cast<std::size_t>(s)] = 0;
    free_slots_.push_back(s);
    ++stats_.freed;
  }

  // ===== copy-on-write ==========================================================================

  /// @brief Page copies recorded by `fork` / `continue_turn` that the engine has not confirmed.
  /// Each holds a reference on both pages until `complete_page_copies`.
  [[nodiscard]] std::vector<page_copy> const& pending_copies() const noexcept {
    return pending_copies_;
  }

  /// @brief The engine performed (or enqueued, stream-ordered before any later page write) every
  /// pending copy: their page references are dropped and the list is cleared.
  void complete_page_copies() {
    for (auto const& c : pending_copies_) {
      pool_.release(c.src);
      pool_.release(c.dst);
    }
    pending_copies_.clear();
  }

  /// @brief For a host pool: performs the pending copies with memcpy, then completes them.
  /// @throw logic_error when the pool is not host memory.
  void execute_page_copies_host() {
    TANGRAM_EXPECTS(pool_.kind() == memory_kind::host,
                    logic_error,
                    "execute_page_copies_host: the pool is ",
                    to_string(pool_.kind()),
                    " memory; the engine must copy the pages itself");
    copy_pages_host(
        pool_.base(), pool_.page_bytes(), pending_copies_.data(), pending_copies_.size());
    complete_page_copies();
  }

  // ===== views ==================================================================================

  /**
   * @brief The batch view over the manager's host arrays and the pool arena. O(batch): checks
   * that every batch member is still live. Valid until the next mutating call. Allocation-free.
   * @throw logic_error naming the request, slot and generation when a batch member was freed (or
   *        its slot reused) since `set_batch`: the view would show freed or foreign pages.
   */
  [[nodiscard]] kv_cache_view view() const {
    check_batch_live("view");
    kv_cache_view v;
    v.pool             = pool_.base();
    v.geometry         = plan_.geometry;
    v.num_layers       = L_;
    v.num_kv_heads     = H_;
    v.num_groups       = G_;
    v.head_slots       = head_slots_.data();
    v.group_window     = group_window_.data();
    v.group_ring_pages = group_ring_pages_.data();
    v.page_offset      = page_offset_.data();
    v.pages            = pages_.data();
    v.head_base_len    = head_base_len_.data();
    v.appended         = appended_.data();
    v.seq_tokens       = seq_tokens_.data();
    v.batch_size       = batch_size_;
    v.batch_slots      = batch_slots_.data();
    return v;
  }

  /// @brief Element counts of the arrays behind `view()`, for mirroring them on a device.
  [[nodiscard]] kv_view_extents view_extents() const noexcept {
    kv_view_extents e;
    e.head_slots    = static_cast<std::int64_t>(L_) * H_;
    e.groups        = G_;
    e.page_offset   = static_cast<std::int64_t>(S_) * G_;
    e.pages         = static_cast<std::int64_t>(pages_.size());
    e.head_base_len = static_cast<std::int64_t>(S_) * L_ * H_;
    e.slots         = S_;
    e.batch         = batch_size_;
    return e;
  }

  /// @brief Changes to `pages`, `page_offset` and `head_base_len` since the last
  /// `clear_view_changes()` (counters `appended` / `seq_tokens` of batch members change every
  /// step and are not journaled).
  [[nodiscard]] view_changes changes() const noexcept {
    view_changes c;
    c.page_entries     = change_entries_.data();
    c.num_page_entries = change_entries_.size();
    c.slots            = change_slots_.data();
    c.num_slots        = change_slots_.size();
    c.full_resync      = full_resync_;
    return c;
  }
  /// @brief Forgets the journal (after the engine uploaded the changes). Allocation-free.
  void clear_view_changes() noexcept {
    for (auto s : change_slots_) slot_changed_[static_cast<std::size_t>(s)] = 0;
    change_slots_.clear();
    change_entries_.clear();
    full_resync_ = false;
  }

  /**
   * @brief Exports layer `layer` of the current batch as FlashInfer paged-KV CSR (see
   * `flashinfer_paged_kv`). O(pages of the batch in that layer); `out`'s vectors are reused.
   * @throw invalid_argument when layer is out of range, or when the layer lists more than
   *        2^31 - 1 page ids (FlashInfer's int32 indptr); logic_error naming the request, slot and
   *        generation when a batch member was freed (or its slot reused) since `set_batch`.
   *        `out` is unchanged when it throws (std::bad_alloc from growing `out` aside).
   */
  void export_flashinfer_layer(std::int32_t layer, flashinfer_paged_kv& out) const {
    TANGRAM_EXPECTS(layer >= 0 && layer < L_,
                    invalid_argument,
                    "export_flashinfer_layer.layer: must be in [0, ",
                    L_ - 1,
                    "], got ",
                    layer);
    check_batch_live("export_flashinfer_layer");
    auto v = view();
    // Count first: indptr is int32, and `out` stays as it was when the batch is too large.
    std::int64_t total = 0;
    for (std::int32_t r = 0; r < batch_size_; ++r)
      for (std::int32_t h = 0; h < H_; ++h) total += flashinfer_span(v, r, layer, h).pages;
    TANGRAM_EXPECTS(total <= std::numeric_limits<std::int32_t>::max(),
                    invalid_argument,
                    "export_flashinfer_layer: layer ",
                    layer,
                    " of this batch lists ",
                    total,
                    " page ids, more than FlashInfer's int32 indptr holds (2^31 - 1); export a "
                    "smaller batch");
    auto Hp  = plan_.geometry.group_size;
    auto req = static_cast<std::size_t>(batch_size_) * static_cast<std::size_t>(H_);
    out.indptr.assign(req + 1, 0);
    out.last_page_len.assign(req, 0);
    out.first_page_skip.assign(req, 0);
    out.indices.clear();
    out.indices.reserve(static_cast<std::size_t>(total));
    out.page_size            = P_;
    out.page_stride_elements = static_cast<std::int64_t>(P_) * plan_.geometry.head_dim;
    out.v_offset_elements    = static_cast<std::int64_t>(Hp) * out.page_stride_elements;
    for (std::int32_t r = 0; r < batch_size_; ++r) {
      std::int32_t s = batch_slots_[static_cast<std::size_t>(r)];
      for (std::int32_t h = 0; h < H_; ++h) {
        auto j = static_cast<std::size_t>(r) * static_cast<std::size_t>(H_) +
                 static_cast<std::size_t>(h);
        auto hs   = v.slot_of(layer, h);
        auto span = flashinfer_span(v, r, layer, h);
        // Fits int32: page < num_pages and num_pages * 2 * Hp <= 2^31 - 1 (checked when built).
        auto virt = [&](std::int64_t pos) {
          return static_cast<std::int32_t>(
              static_cast<std::int64_t>(entry(s, hs.group, pos)) * 2 * Hp + hs.column);
        };
        if (span.pages > 0) {
          if (span.ring_pages_used == 0) {
            for (std::int64_t p = 0; p < span.pages; ++p) out.indices.push_back(virt(p));
          } else {
            for (std::int64_t p = 0; p < span.pages; ++p)
              out.indices.push_back(virt((span.first + p) % span.ring_pages_used));
          }
          out.first_page_skip[j] = static_cast<std::int32_t>(span.skip);
          out.last_page_len[j] =
              static_cast<std::int32_t>(span.skip + span.len - (span.pages - 1) * P_);
        }
        out.indptr[j + 1] = static_cast<std::int32_t>(out.indices.size());
      }
    }
  }

  // ===== inspection =============================================================================

  /// @brief True when `seq` names a live sequence.
  [[nodiscard]] bool contains(sequence_id seq) const noexcept {
    return seq.slot >= 0 && seq.slot < S_ &&
           slots_[static_cast<std::size_t>(seq.slot)].phase != sequence_phase::free &&
           slots_[static_cast<std::size_t>(seq.slot)].generation == seq.generation;
  }

  /// @throw logic_error for an unknown sequence.
  [[nodiscard]] sequence_info info(sequence_id seq) const {
    std::int32_t s = check(seq, "info");
    auto const& st = slot(s);
    sequence_info i;
    i.id               = seq;
    i.phase            = st.phase;
    i.seq_tokens       = seq_tokens_[static_cast<std::size_t>(s)];
    i.appended         = appended_[static_cast<std::size_t>(s)];
    i.prompt_remaining = st.prompt_remaining;
    i.chunk_pending    = st.chunk_pending;
    i.max_new          = st.max_new;
    i.decoded          = st.decoded;
    i.reserved_pages   = st.reservation.pages();
    for (std::int32_t g = 0; g < G_; ++g) i.held_pages += n_pages_[sg(s, g)];
    return i;
  }

  /// Tokens held by head (layer, head) of `seq`. @throw logic_error for an unknown sequence.
  [[nodiscard]] std::int64_t head_len(sequence_id seq,
                                      std::int32_t layer,
                                      std::int32_t head) const {
    std::int32_t s = check(seq, "head_len");
    check_head(layer, head, "head_len");
    auto g = head_slots_[static_cast<std::size_t>(layer * H_ + head)].group;
    if (group_window_[static_cast<std::size_t>(g)] > 0)
      return std::min<std::int64_t>(seq_tokens_[static_cast<std::size_t>(s)],
                                    group_window_[static_cast<std::size_t>(g)]);
    return head_base_len_[static_cast<std::size_t>(s) * static_cast<std::size_t>(L_ * H_) +
                          static_cast<std::size_t>(layer * H_ + head)] +
           appended_[static_cast<std::size_t>(s)];
  }

  /// Entries in the page list of (seq, group g). @throw logic_error for an unknown sequence/group.
  [[nodiscard]] std::int32_t group_page_count(sequence_id seq, std::int32_t g) const {
    std::int32_t s = check(seq, "group_page_count");
    check_group(g, "group_page_count");
    return n_pages_[sg(s, g)];
  }
  /// The page list of (seq, group g): `group_page_count` ids. Valid until the next mutating call.
  [[nodiscard]] page_id const* group_pages(sequence_id seq, std::int32_t g) const {
    std::int32_t s = check(seq, "group_pages");
    check_group(g, "group_pages");
    return &pages_[static_cast<std::size_t>(page_offset_[sg(s, g)])];
  }
  /// Pages group g of `seq` may hold when its current turn completes (M(r) per group).
  [[nodiscard]] std::int32_t group_target(sequence_id seq, std::int32_t g) const {
    std::int32_t s = check(seq, "group_target");
    check_group(g, "group_target");
    return target_[sg(s, g)];
  }
  /// Pages group g of `seq` may still draw from its reservation.
  [[nodiscard]] std::int32_t group_reserved(sequence_id seq, std::int32_t g) const {
    std::int32_t s = check(seq, "group_reserved");
    check_group(g, "group_reserved");
    return budget_[sg(s, g)];
  }
  /// Pages group g of `seq` uses now: enough for its longest head (a sliding ring: its filled
  /// pages).
  [[nodiscard]] std::int64_t group_pages_in_use(sequence_id seq, std::int32_t g) const {
    std::int32_t s = check(seq, "group_pages_in_use");
    check_group(g, "group_pages_in_use");
    return in_use_pages(s, g);
  }

  /**
   * @brief Full self-check, O(pool + all page lists): reference counts equal the number of page
   * lists and pending copies holding each page, reservations add up to the pool's reserved count,
   * every list fits its capacity and holds what its heads use, segments do not overlap.
   * @throw logic_error describing the first inconsistency.
   */
  void check_invariants() const {
    pool_.check_invariants();
    check_slot_invariants();
    std::vector<std::uint32_t> owners(static_cast<std::size_t>(pool_.capacity()), 0);
    std::int64_t reserved = 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> segs;
    for (std::int32_t s = 0; s < S_; ++s) {
      auto const& st = slot(s);
      if (st.phase == sequence_phase::free) {
        TANGRAM_EXPECTS(
            st.reservation.empty(), logic_error, "free slot ", s, " holds a reservation");
        continue;
      }
      TANGRAM_EXPECTS(pool_.owns(st.reservation), logic_error, "slot ", s, ": foreign reservation");
      reserved += st.reservation.pages();
      std::int64_t budget = 0;
      segs.emplace_back(st.seg_begin, st.seg_size);
      std::int64_t expect_offset = st.seg_begin;
      for (std::int32_t g = 0; g < G_; ++g) {
        auto i = sg(s, g);
        budget += budget_[i];
        TANGRAM_EXPECTS(page_offset_[i] == expect_offset,
                        logic_error,
                        "slot ",
                        s,
                        " group ",
                        g,
                        ": page_offset ",
                        page_offset_[i],
                        " expected ",
                        expect_offset);
        expect_offset += cap_[i];
        TANGRAM_EXPECTS(n_pages_[i] >= 0 && n_pages_[i] <= cap_[i],
                        logic_error,
                        "slot ",
                        s,
                        " group ",
                        g,
                        ": ",
                        n_pages_[i],
                        " pages exceed capacity ",
                        cap_[i]);
        TANGRAM_EXPECTS(n_pages_[i] >= in_use_pages(s, g),
                        logic_error,
                        "slot ",
                        s,
                        " group ",
                        g,
                        ": ",
                        n_pages_[i],
                        " pages but heads use ",
                        in_use_pages(s, g));
        TANGRAM_EXPECTS(
            budget_[i] >= 0, logic_error, "slot ", s, " group ", g, ": negative budget");
        for (std::int32_t p = 0; p < n_pages_[i]; ++p) {
          page_id pg = entry(s, g, p);
          TANGRAM_EXPECTS(pg >= 0 && pg < pool_.capacity(),
                          logic_error,
                          "slot ",
                          s,
                          " group ",
                          g,
                          ": bad page ",
                          pg);
          ++owners[static_cast<std::size_t>(pg)];
        }
      }
      TANGRAM_EXPECTS(expect_offset <= st.seg_begin + st.seg_size,
                      logic_error,
                      "slot ",
                      s,
                      ": lists overflow segment");
      TANGRAM_EXPECTS(budget == st.reservation.pages(),
                      logic_error,
                      "slot ",
                      s,
                      ": group budgets sum to ",
                      budget,
                      " but the reservation holds ",
                      st.reservation.pages());
    }
    for (auto const& c : pending_copies_) {
      ++owners[static_cast<std::size_t>(c.src)];
      ++owners[static_cast<std::size_t>(c.dst)];
    }
    for (std::int64_t p = 0; p < pool_.capacity(); ++p)
      TANGRAM_EXPECTS(
          owners[static_cast<std::size_t>(p)] == pool_.ref_count(static_cast<page_id>(p)),
          logic_error,
          "page ",
          p,
          ": reference count ",
          pool_.ref_count(static_cast<page_id>(p)),
          " but ",
          owners[static_cast<std::size_t>(p)],
          " owners");
    TANGRAM_EXPECTS(reserved == pool_.reserved_pages(),
                    logic_error,
                    "reservations sum to ",
                    reserved,
                    " but the pool reserved ",
                    pool_.reserved_pages());
    TANGRAM_EXPECTS(pool_.used_pages() + pool_.reserved_pages() <= pool_.capacity(),
                    logic_error,
                    "used + reserved exceeds capacity");
    std::sort(segs.begin(), segs.end());
    for (std::size_t k = 1; k < segs.size(); ++k)
      TANGRAM_EXPECTS(
          segs[k - 1].first + segs[k - 1].second <= segs[k].first || segs[k - 1].second == 0,
          logic_error,
          "page-id segments overlap at ",
          segs[k].first);
  }

 private:
  friend struct detail::kv_cache_manager_test_access;

  static constexpr std::int64_t max_tokens = std::numeric_limits<std::int32_t>::max();

  struct slot_state {
    std::uint32_t generation      = 1;
    sequence_phase phase          = sequence_phase::free;
    std::int64_t prompt_remaining = 0;
    std::int64_t chunk_pending    = 0;
    std::int64_t max_new          = 0;
    std::int64_t decoded          = 0;
    std::int64_t seg_begin        = 0;
    std::int64_t seg_size         = 0;
    bool may_share                = false;  ///< forked (parent or child): pages may be shared
    page_reservation reservation;
  };

  /// Slot bookkeeping: the free list holds every free slot exactly once and no live one, so free
  /// list + live slots == max_sequences (a slot on no list is leaked forever).
  void check_slot_invariants() const {
    std::vector<char> listed(static_cast<std::size_t>(S_), 0);
    for (auto s : free_slots_) {
      TANGRAM_EXPECTS(s >= 0 && s < S_,
                      logic_error,
                      "the free list holds slot ",
                      s,
                      ", out of range [0, ",
                      S_,
                      ")");
      TANGRAM_EXPECTS(!listed[static_cast<std::size_t>(s)],
                      logic_error,
                      "slot ",
                      s,
                      " is on the free list twice");
      listed[static_cast<std::size_t>(s)] = 1;
      TANGRAM_EXPECTS(slot(s).phase == sequence_phase::free,
                      logic_error,
                      "slot ",
                      s,
                      " is on the free list but holds a sequence in phase ",
                      to_string(slot(s).phase));
    }
    for (std::int32_t s = 0; s < S_; ++s)
      TANGRAM_EXPECTS(slot(s).phase != sequence_phase::free || listed[static_cast<std::size_t>(s)],
                      logic_error,
                      "slot ",
                      s,
                      " is free but not on the free list (leaked: it can never be admitted again)");
    for (std::int32_t s = 0; s < S_; ++s)
      TANGRAM_EXPECTS(!batch_mark_[static_cast<std::size_t>(s)],
                      logic_error,
                      "slot ",
                      s,
                      ": set_batch left its duplicate mark set");
  }

  static static_plan const& checked_plan(static_plan const& plan) {
    plan.geometry.validate();
    plan.grouping.validate();
    TANGRAM_EXPECTS(plan.rules.size() == static_cast<std::size_t>(plan.num_layers) *
                                             static_cast<std::size_t>(plan.num_kv_heads),
                    invalid_argument,
                    "static_plan.rules: expected ",
                    plan.num_layers * plan.num_kv_heads,
                    " rules, got ",
                    plan.rules.size());
    TANGRAM_EXPECTS(plan.grouping.group_size == plan.geometry.group_size,
                    invalid_argument,
                    "static_plan.geometry.group_size: ",
                    plan.geometry.group_size,
                    " differs from the grouping's ",
                    plan.grouping.group_size);
    return plan;
  }
  static manager_options checked_options(manager_options o, static_plan const& plan) {
    o.validate();
    bool from_bytes = o.num_pages == 0;
    if (from_bytes) o.num_pages = o.pool_bytes / plan.geometry.page_bytes();
    TANGRAM_EXPECTS(o.num_pages <= pool_type::max_pages,
                    invalid_argument,
                    "manager_options.pool_bytes: ",
                    o.pool_bytes,
                    " bytes make ",
                    o.num_pages,
                    " pages of ",
                    plan.geometry.page_bytes(),
                    " bytes, more than a pool holds (2^31 - 1)");
    // export_flashinfer_layer lists virtual page ids `page * 2 * Hp + column` as int32: refuse a
    // pool whose ids would wrap (num_pages <= 2^31 - 1 and Hp <= 1024, so no int64 overflow).
    auto Hp = static_cast<std::int64_t>(plan.geometry.group_size);
    TANGRAM_EXPECTS(o.num_pages * 2 * Hp <= std::numeric_limits<std::int32_t>::max(),
                    invalid_argument,
                    from_bytes ? "manager_options.pool_bytes " : "manager_options.num_pages ",
                    from_bytes ? o.pool_bytes : o.num_pages,
                    ": ",
                    o.num_pages,
                    " pages x 2 x geometry.group_size ",
                    Hp,
                    " = ",
                    o.num_pages * 2 * Hp,
                    " FlashInfer virtual page ids exceed 2^31 - 1; use fewer pages or a smaller "
                    "group_size");
    TANGRAM_EXPECTS(o.num_pages >= 1,
                    invalid_argument,
                    "manager_options: the pool needs at least one page of ",
                    plan.geometry.page_bytes(),
                    " bytes (num_pages ",
                    o.num_pages,
                    ", pool_bytes ",
                    o.pool_bytes,
                    ")");
    if (o.max_batch == 0) o.max_batch = o.max_sequences;
    // Bounded: num_pages <= 2^31 - 1, slots <= 2^20, groups <= 2^20 (layers and heads <= 1024).
    if (o.index_capacity == 0)
      o.index_capacity =
          std::min<std::int64_t>(2 * o.num_pages + 4 * static_cast<std::int64_t>(o.max_sequences) *
                                                       plan.grouping.num_groups(),
                                 std::numeric_limits<std::int32_t>::max());
    if (o.max_view_changes == 0)
      o.max_view_changes = 4 * static_cast<std::int64_t>(o.max_batch) + 1024;
    return o;
  }

  [[nodiscard]] std::size_t sg(std::int32_t s, std::int32_t g) const noexcept {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(G_) + static_cast<std::size_t>(g);
  }
  [[nodiscard]] slot_state& slot(std::int32_t s) noexcept {
    return slots_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] slot_state const& slot(std::int32_t s) const noexcept {
    return slots_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] head_rule const& group_rule(std::int32_t g) const noexcept {
    return plan_.grouping.groups[static_cast<std::size_t>(g)].rule;
  }
  [[nodiscard]] page_id entry(std::int32_t s, std::int32_t g, std::int64_t pos) const noexcept {
    return pages_[static_cast<std::size_t>(page_offset_[sg(s, g)] + pos)];
  }
  void set_entry(std::int32_t s, std::int32_t g, std::int64_t pos, page_id p) noexcept {
    auto at                              = page_offset_[sg(s, g)] + pos;
    pages_[static_cast<std::size_t>(at)] = p;
    if (change_entries_.size() < change_entries_.capacity())
      change_entries_.push_back(static_cast<std::int32_t>(at));
    else
      full_resync_ = true;
  }
  void note_slot_changed(std::int32_t s) noexcept {
    if (slot_changed_[static_cast<std::size_t>(s)]) return;
    slot_changed_[static_cast<std::size_t>(s)] = 1;
    change_slots_.push_back(s);  // capacity S: never reallocates
  }

  std::int32_t check(sequence_id seq, char const* op) const {
    TANGRAM_EXPECTS(seq.slot >= 0 && seq.slot < S_,
                    logic_error,
                    op,
                    ": unknown sequence (slot ",
                    seq.slot,
                    " is out of range [0, ",
                    S_,
                    "))");
    auto const& st = slot(seq.slot);
    TANGRAM_EXPECTS(
        st.phase != sequence_phase::free && st.generation == seq.generation,
        logic_error,
        op,
        ": unknown sequence (slot ",
        seq.slot,
        ", generation ",
        seq.generation,
        "): ",
        st.phase == sequence_phase::free ? "the slot is free" : "the slot holds a newer sequence");
    return seq.slot;
  }
  void check_head(std::int32_t layer, std::int32_t head, char const* op) const {
    TANGRAM_EXPECTS(layer >= 0 && layer < L_ && head >= 0 && head < H_,
                    invalid_argument,
                    op,
                    ": head (layer ",
                    layer,
                    ", head ",
                    head,
                    ") out of range (",
                    L_,
                    " x ",
                    H_,
                    ")");
  }
  /// Every member of the current batch is still the sequence `set_batch` listed.
  void check_batch_live(char const* op) const {
    for (std::int32_t r = 0; r < batch_size_; ++r) {
      std::int32_t s = batch_slots_[static_cast<std::size_t>(r)];
      auto const& st = slots_[static_cast<std::size_t>(s)];
      auto gen       = batch_gen_[static_cast<std::size_t>(r)];
      TANGRAM_EXPECTS(
          st.phase != sequence_phase::free && st.generation == gen,
          logic_error,
          op,
          ": batch request ",
          r,
          " (slot ",
          s,
          ", generation ",
          gen,
          ") is no longer a live sequence (",
          st.phase == sequence_phase::free ? "freed" : "its slot holds a newer sequence",
          "); call set_batch again");
    }
  }

  /// N >= 1, T >= 0 and n + N + T <= 2^31 - 1 for a turn that starts after n tokens, computed
  /// without overflow (`N + T <= limit` with huge N or T used to wrap negative and pass).
  static void check_turn_sizes(char const* op,
                               std::int64_t n,
                               std::int64_t prompt_tokens,
                               std::int64_t max_new_tokens) {
    TANGRAM_EXPECTS(prompt_tokens >= 1,
                    invalid_argument,
                    op,
                    ".prompt_tokens: must be >= 1, got ",
                    prompt_tokens);
    TANGRAM_EXPECTS(max_new_tokens >= 0,
                    invalid_argument,
                    op,
                    ".max_new_tokens: must be >= 0, got ",
                    max_new_tokens);
    auto turn  = detail::add_checked(prompt_tokens, max_new_tokens);
    auto total = turn ? detail::add_checked(n, *turn) : std::nullopt;
    TANGRAM_EXPECTS(total.has_value(),
                    invalid_argument,
                    op,
                    n > 0 ? ": seq_tokens " : ": ",
                    n > 0 ? detail::cat(n, " + ") : std::string(),
                    "prompt_tokens + max_new_tokens overflows: ",
                    prompt_tokens,
                    " + ",
                    max_new_tokens);
    TANGRAM_EXPECTS(*total <= max_tokens,
                    invalid_argument,
                    op,
                    n > 0 ? ": seq_tokens + prompt_tokens + max_new_tokens = "
                          : ": prompt_tokens + max_new_tokens = ",
                    *total,
                    " exceeds ",
                    max_tokens);
  }

  /// What the FlashInfer export lists for head (layer, h) of request r: `pages` entries starting
  /// at list position `first` (mod `ring_pages_used` for a sliding ring, 0 for growing heads),
  /// the first `skip` tokens masked, `len` tokens held.
  struct fi_span {
    std::int64_t len = 0, pages = 0, first = 0, skip = 0, ring_pages_used = 0;
  };
  [[nodiscard]] fi_span flashinfer_span(kv_cache_view const& v,
                                        std::int32_t r,
                                        std::int32_t layer,
                                        std::int32_t h) const noexcept {
    fi_span sp;
    std::int32_t s = batch_slots_[static_cast<std::size_t>(r)];
    auto g         = v.slot_of(layer, h).group;
    sp.len         = v.head_len(r, layer, h);
    if (sp.len <= 0) return sp;
    if (group_window_[static_cast<std::size_t>(g)] == 0) {
      sp.pages = ceil_div(sp.len, P_);
      return sp;
    }
    std::int64_t n = seq_tokens_[static_cast<std::size_t>(s)];
    std::int64_t ring =
        static_cast<std::int64_t>(group_ring_pages_[static_cast<std::size_t>(g)]) * P_;
    std::int64_t start = (n - sp.len) % ring;
    sp.skip            = start % P_;
    sp.pages           = ceil_div(sp.skip + sp.len, P_);  // from the page of `start`
    sp.first           = start / P_;
    sp.ring_pages_used = ceil_div(std::min<std::int64_t>(n, ring), P_);
    return sp;
  }

  void check_group(std::int32_t g, char const* op) const {
    TANGRAM_EXPECTS(
        g >= 0 && g < G_, invalid_argument, op, ": group ", g, " out of range [0, ", G_, ")");
  }

  /// x mod P for x >= 0 (a mask when P is a power of two: decode steps avoid divisions).
  [[nodiscard]] std::int32_t mod_p(std::int64_t x) const noexcept {
    return static_cast<std::int32_t>(p_shift_ >= 0 ? (x & (P_ - 1)) : x % P_);
  }
  /// ceil(x / P) for x >= 0.
  [[nodiscard]] std::int64_t pages_for(std::int64_t x) const noexcept {
    return p_shift_ >= 0 ? (x + P_ - 1) >> p_shift_ : ceil_div(x, P_);
  }

  /// Pages group g needs to hold its lengths after the history reached n tokens.
  [[nodiscard]] std::int64_t need_pages(std::int32_t g, std::int64_t n) const noexcept {
    auto const& r = group_rule(g);
    if (r.kind == layer_kind::sliding_window)
      return std::min<std::int64_t>(ceil_div(n, P_),
                                    group_ring_pages_[static_cast<std::size_t>(g)]);
    return ceil_div(retained_tokens(r, n), P_);
  }
  /// Pages group g of slot s uses for its current lengths.
  [[nodiscard]] std::int64_t in_use_pages(std::int32_t s, std::int32_t g) const noexcept {
    auto i = sg(s, g);
    if (group_window_[static_cast<std::size_t>(g)] > 0)
      return std::min<std::int64_t>(ceil_div(seq_tokens_[static_cast<std::size_t>(s)], P_),
                                    group_ring_pages_[static_cast<std::size_t>(g)]);
    return ceil_div(
        static_cast<std::int64_t>(max_base_[i]) + appended_[static_cast<std::size_t>(s)], P_);
  }
  /// Pages among the first `keep` of (s, g) that only this sequence references.
  [[nodiscard]] std::int64_t exclusive_pages(std::int32_t s, std::int32_t g, std::int64_t keep) const noexcept {
    if (!slot(s).may_share) return keep;
    std::int64_t exclusive = 0;
    for (std::int64_t p = 0; p < keep; ++p) exclusive += pool_.ref_count(entry(s, g, p)) == 1;
    return exclusive;
  }
  /// Leading pages of group g that every head has filled (never written again): shareable.
  [[nodiscard]] std::int64_t shared_pages(std::int32_t s, std::int32_t g) const noexcept {
    if (group_window_[static_cast<std::size_t>(g)] > 0) return 0;
    return (static_cast<std::int64_t>(min_base_[sg(s, g)]) +
            appended_[static_cast<std::size_t>(s)]) /
           P_;
  }
  /// Expected kept count of flat head h after the history reaches n with a chunk of c tokens.
  [[nodiscard]] std::int64_t expected_for(std::int32_t s,
                                          std::int32_t h,
                                          std::int64_t n,
                                          std::int64_t c) const noexcept {
    auto const& r = plan_.rules[static_cast<std::size_t>(h)];
    if (r.kind == layer_kind::sliding_window) return std::min<std::int64_t>(n, r.window);
    std::int64_t held =
        head_base_len_[static_cast<std::size_t>(s) * static_cast<std::size_t>(L_ * H_) +
                       static_cast<std::size_t>(h)] +
        appended_[static_cast<std::size_t>(s)];
    if (r.kind == layer_kind::uncompressed) return held + c;
    return std::min<std::int64_t>(retained_tokens(r, n), held + c);
  }
  void refresh_base_range(std::int32_t s, std::int32_t g) noexcept {
    auto i = sg(s, g);
    if (group_window_[static_cast<std::size_t>(g)] > 0) {
      max_base_[i] = min_base_[i] = 0;
      return;
    }
    auto const* base =
        &head_base_len_[static_cast<std::size_t>(s) * static_cast<std::size_t>(L_ * H_)];
    std::int32_t mx = 0, mn = std::numeric_limits<std::int32_t>::max();
    for (auto k = member_begin_[static_cast<std::size_t>(g)];
         k < member_begin_[static_cast<std::size_t>(g) + 1];
         ++k) {
      auto b = base[members_[static_cast<std::size_t>(k)]];
      mx     = std::max(mx, b);
      mn     = std::min(mn, b);
    }
    max_base_[i] = mx;
    min_base_[i] = mn;
  }

  /// Buckets of a fresh sequence: every base length is 0, so every growing group is in bucket 0.
  void reset_buckets(std::int32_t s) noexcept {
    auto* start = &bucket_start_[static_cast<std::size_t>(s) * static_cast<std::size_t>(P_ + 1)];
    start[0]    = 0;
    std::fill_n(start + 1, P_, NG_);
    std::copy(growing_groups_.begin(),
              growing_groups_.end(),
              bucket_groups_.begin() + static_cast<std::ptrdiff_t>(s) * NG_);
  }

  /// Groups of slot s bucketed by (longest base length mod P): at the decode step that makes
  /// `appended` = a, exactly the groups of bucket (1 - a) mod P start a new page.
  void rebuild_buckets(std::int32_t s) noexcept {
    auto* start = &bucket_start_[static_cast<std::size_t>(s) * static_cast<std::size_t>(P_ + 1)];
    auto* out   = NG_ > 0
                      ? &bucket_groups_[static_cast<std::size_t>(s) * static_cast<std::size_t>(NG_)]
                      : nullptr;
    std::fill_n(start, P_ + 1, 0);
    for (auto g : growing_groups_) ++start[mod_p(max_base_[sg(s, g)]) + 1];
    for (std::int32_t r = 0; r < P_; ++r) start[r + 1] += start[r];
    // Place, then shift the starts back (classic counting sort without a second array).
    for (auto g : growing_groups_) out[start[mod_p(max_base_[sg(s, g)])]++] = g;
    for (std::int32_t r = P_; r > 0; --r) start[r] = start[r - 1];
    start[0] = 0;
  }

  enum class turn_kind : std::uint8_t { admit, next_turn, fork };

  /**
   * The one footprint computation of admission, continue_turn and fork, group by group into
   * `footprint_`: what group g may hold when the turn completes, how much of it is already held
   * without a reservation, the pages to copy and the page-list entries needed.
   * - admit: target = group_pages(rule, N, T); nothing held.
   * - next_turn (slot s, history n): target = group_pages(rule, n + N, T); the first
   *   min(held, target) pages stay, those only s references need no reservation and the shared
   *   ones are copied; the list keeps max(held, target) entries.
   * - fork (parent s): the child's target is the parent's (decode) or what it uses (ended);
   *   fully written pages are shared, the rest of what the parent uses is copied.
   * `tokens` is N for admit and n + N for next_turn; unused for fork.
   */
  void size_turn(turn_kind kind,
                 std::int32_t s,
                 std::int64_t tokens,
                 std::int64_t max_new_tokens) noexcept {
    footprint_.clear();
    for (std::int32_t g = 0; g < G_; ++g) {
      std::int64_t target = 0, already_held = 0, copies = 0, capacity = 0, current = 0;
      switch (kind) {
        case turn_kind::admit:
          target   = ::tangram::group_pages(group_rule(g), tokens, max_new_tokens, P_);
          capacity = target;
          break;
        case turn_kind::next_turn: {
          auto i            = sg(s, g);
          target            = ::tangram::group_pages(group_rule(g), tokens, max_new_tokens, P_);
          std::int64_t keep = std::min<std::int64_t>(n_pages_[i], target);
          already_held      = exclusive_pages(s, g, keep);
          copies            = keep - already_held;
          capacity          = std::max<std::int64_t>(n_pages_[i], target);
          current           = cap_[i];
          break;
        }
        case turn_kind::fork: {
          auto inuse   = in_use_pages(s, g);
          target       = slot(s).phase == sequence_phase::decode ? target_[sg(s, g)] : inuse;
          already_held = shared_pages(s, g);
          copies       = inuse - already_held;
          capacity     = target;
          break;
        }
      }
      footprint_.add(g, target, already_held, copies, capacity, current);
    }
  }

  /// Room for `extra` more pending copies (geometric growth). Called by fork and continue_turn
  /// before they change anything, so that a failed allocation (std::bad_alloc) leaves the
  /// manager as it was.
  void reserve_copies(std::int64_t extra) {
    auto need = pending_copies_.size() + static_cast<std::size_t>(extra);
    if (need > pending_copies_.capacity())
      pending_copies_.reserve(std::max(need, 2 * pending_copies_.capacity()));
  }

  page_id draw_page(std::int32_t s, std::int32_t g) {
    auto i = sg(s, g);
    TANGRAM_EXPECTS(budget_[i] > 0,
                    logic_error,
                    "group ",
                    g,
                    " of slot ",
                    s,
                    " needs a page beyond its reservation (internal inconsistency)");
    page_id p = pool_.draw(slot(s).reservation);
    --budget_[i];
    ++stats_.pages_drawn;
    return p;
  }
  void draw_into(std::int32_t s, std::int32_t g) {
    page_id p = draw_page(s, g);
    auto i    = sg(s, g);
    set_entry(s, g, n_pages_[i]++, p);
  }

  /// One decode token for slot s (validated by the caller).
  void append_one(std::int32_t s) {
    auto& st = slot(s);
    auto a   = ++appended_[static_cast<std::size_t>(s)];
    auto n   = ++seq_tokens_[static_cast<std::size_t>(s)];
    ++st.decoded;
    if (NG_ > 0) {
      auto const* start =
          &bucket_start_[static_cast<std::size_t>(s) * static_cast<std::size_t>(P_ + 1)];
      auto const* grp =
          &bucket_groups_[static_cast<std::size_t>(s) * static_cast<std::size_t>(NG_)];
      std::int32_t b = mod_p(P_ + 1 - mod_p(a));  // (1 - a) mod P
      for (auto k = start[b]; k < start[b + 1]; ++k) {
        auto g    = grp[k];
        auto i    = sg(s, g);
        auto need = pages_for(static_cast<std::int64_t>(max_base_[i]) + a);
        if (need > n_pages_[i]) draw_into(s, g);
      }
    }
    if (!sliding_groups_.empty() && mod_p(n - 1) == 0) {
      for (auto g : sliding_groups_) {
        auto i = sg(s, g);
        auto need =
            std::min<std::int64_t>(pages_for(n), group_ring_pages_[static_cast<std::size_t>(g)]);
        if (need > n_pages_[i]) draw_into(s, g);
      }
    }
  }

  /// True when a segment of `size` entries can be placed (repacking the arena if needed).
  bool ensure_index_room(std::int64_t size) {
    if (size <= 0) return true;
    if (segments_.free_total() < size) return false;
    if (!segments_.can_allocate(size)) compact();
    return true;
  }

  /// Moves every live segment to the front of the page-id arena, in address order.
  void compact() {
    order_.clear();
    for (std::int32_t s = 0; s < S_; ++s)
      if (slot(s).phase != sequence_phase::free && slot(s).seg_size > 0) order_.push_back(s);
    std::sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
      return slot(a).seg_begin < slot(b).seg_begin;
    });
    std::int64_t at = 0;
    for (auto s : order_) {
      auto& st = slot(s);
      if (st.seg_begin != at) {
        std::memmove(&pages_[static_cast<std::size_t>(at)],
                     &pages_[static_cast<std::size_t>(st.seg_begin)],
                     static_cast<std::size_t>(st.seg_size) * sizeof(std::int32_t));
        auto delta = at - st.seg_begin;
        for (std::int32_t g = 0; g < G_; ++g)
          page_offset_[sg(s, g)] += static_cast<std::int32_t>(delta);
        st.seg_begin = at;
      }
      at += st.seg_size;
    }
    segments_.reset(at);
    full_resync_ = true;
    ++stats_.index_compactions;
  }

  /// Moves slot s to a new segment of `size` entries with the group capacities of the turn
  /// just sized (`footprint_`; room already ensured by ensure_index_room).
  void move_segment(std::int32_t s, std::int64_t size) {
    auto& st           = slot(s);
    std::int64_t begin = *segments_.allocate(size);
    std::int64_t at    = begin;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto i   = sg(s, g);
      auto cap = footprint_.capacity(g);
      std::memmove(&pages_[static_cast<std::size_t>(at)],
                   &pages_[static_cast<std::size_t>(page_offset_[i])],
                   static_cast<std::size_t>(n_pages_[i]) * sizeof(std::int32_t));
      page_offset_[i] = static_cast<std::int32_t>(at);
      cap_[i]         = static_cast<std::int32_t>(cap);
      at += cap;
    }
    segments_.free(st.seg_begin, st.seg_size);
    st.seg_begin = begin;
    st.seg_size  = size;
    full_resync_ = true;
  }

  static_plan plan_;
  manager_options options_;
  pool_type pool_;
  std::int32_t L_ = 0, H_ = 0, G_ = 0, P_ = 0, S_ = 0, NG_ = 0;
  std::int32_t p_shift_ = -1;  ///< log2(P) when P is a power of two, else -1

  // View arrays.
  std::vector<head_slot> head_slots_;
  std::vector<std::int32_t> group_window_, group_ring_pages_;
  std::vector<std::int32_t> page_offset_, pages_, head_base_len_, appended_, seq_tokens_;
  std::vector<std::int32_t> batch_slots_;
  std::int32_t batch_size_ = 0;

  // Plan-derived lookups.
  std::vector<std::int32_t> members_, member_begin_, growing_groups_, sliding_groups_;

  // Per (slot, group) bookkeeping.
  std::vector<std::int32_t> n_pages_, cap_, target_, budget_, max_base_, min_base_, prev_pages_;
  std::vector<std::int32_t> bucket_start_, bucket_groups_;

  // Per slot.
  std::vector<slot_state> slots_;
  std::vector<std::int32_t> free_slots_;
  std::vector<std::uint32_t> batch_gen_;
  std::vector<char> batch_mark_;

  segment_arena segments_;
  std::vector<std::int32_t> order_;
  std::vector<page_copy> pending_copies_;
  std::vector<std::int32_t> change_entries_, change_slots_;
  std::vector<char> slot_changed_;
  bool full_resync_ = false;
  std::vector<std::int64_t> chunk_need_;  ///< prepare_chunk: pages each group needs after the chunk
  detail::turn_footprint footprint_;
  manager_stats stats_;
};

/// @brief The manager with dynamic page extents over any `memory_resource`.
using kv_cache_manager = basic_kv_cache_manager<>;

/**
 * @brief Tensor parallelism: admits one request on every rank's manager, or on none.
 * @param ranks one manager per rank (each built over that rank's plan)
 * @return the sequence on each rank (same order), or nullopt when any rank cannot fit it; ranks
 *         that had admitted it are rolled back (freed), so no reservation remains.
 * @throw invalid_argument for bad N or T (before any rank changes).
 */
template <class Manager>
[[nodiscard]] std::optional<std::vector<sequence_id>> try_admit_all(
    std::vector<Manager*> const& ranks, std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
  std::vector<sequence_id> ids;
  ids.reserve(ranks.size());
  for (auto* m : ranks) {
    auto id = m->try_admit(prompt_tokens, max_new_tokens);
    if (!id) {
      for (std::size_t k = 0; k < ids.size(); ++k) ranks[k]->free(ids[k]);
      return std::nullopt;
    }
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace tangram
