// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/kv_cache_types.hpp
 * @brief The plain values of the KV-cache manager's API: sequence handles and phases, options,
 * per-sequence info, counters, page copies and the view's change journal and extents.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/page_pool.hpp"

namespace tangram {
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
  parking,  ///< `park` handed its pages out for copying to host memory; they stay held (with a
            ///< running turn's reservation) until `complete_park` frees them and the slot, or
            ///< `cancel_park`
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
    case sequence_phase::parking:
      return "parking";
  }
  return "?";
}

/// @brief Why an admission did not fit (`admit_result::reason`).
enum class admit_failure : std::uint8_t {
  none,                    ///< admitted
  no_free_slot,            ///< every sequence slot is live (max_sequences); retry after a free
  not_enough_pages,        ///< the unreserved pages do not hold the footprint now; retry later
  page_table_arena_full,   ///< the page-id arena lacks room for its page lists now (forks hold
                           ///< many lists; see manager_options::index_capacity); retry later
  never_fits,              ///< larger than the whole pool or the whole page-id arena: no amount
                           ///< of waiting admits it (shorten the request or build a larger pool)
  pages_awaiting_release,  ///< deferred reuse: the unreserved free pages do not hold the footprint
                           ///< now, but would with the retired pages (`pages_retired`) that wait
                           ///< for `release_epochs_through`; retry after the next release
};

/// @brief Lower-case name of an admission failure ("none", "no_free_slot", ...).
constexpr std::string_view to_string(admit_failure f) noexcept {
  switch (f) {
    case admit_failure::none:
      return "none";
    case admit_failure::no_free_slot:
      return "no_free_slot";
    case admit_failure::not_enough_pages:
      return "not_enough_pages";
    case admit_failure::page_table_arena_full:
      return "page_table_arena_full";
    case admit_failure::never_fits:
      return "never_fits";
    case admit_failure::pages_awaiting_release:
      return "pages_awaiting_release";
  }
  return "?";
}

/// @brief What `admit` answers: the new sequence, or why the request did not fit. Plain value.
struct admit_result {
  std::optional<sequence_id> id;  ///< the admitted sequence; empty when it did not fit
  admit_failure reason      = admit_failure::none;
  std::int64_t pages_needed = 0;  ///< the request's footprint (`admission_pages(N, T)`)
  /// Pages missing: beyond the unreserved pages now (not_enough_pages, pages_awaiting_release),
  /// or beyond the whole pool (never_fits; 0 when only the page-id arena can never hold it); 0
  /// otherwise.
  std::int64_t pages_missing = 0;
  /// Deferred reuse: pages waiting for release when the request was sized (the pool's
  /// `retired_pages()`), whatever the reason; 0 without deferred reuse.
  std::int64_t pages_retired = 0;
  [[nodiscard]] explicit operator bool() const noexcept { return id.has_value(); }
};

/// @brief Sizes chosen when a manager is built.
struct manager_options {
  std::int64_t num_pages      = 0;    ///< pages in the pool; when 0, `pool_bytes / page_bytes`
  std::int64_t pool_bytes     = 0;    ///< bytes of KV memory (used when num_pages is 0)
  std::int32_t max_sequences  = 256;  ///< slots: sequences alive at once (forks included)
  std::int32_t max_batch      = 0;    ///< largest batch of `set_batch`; 0 means max_sequences
  std::int64_t index_capacity = 0;  ///< entries of the page-id arena; 0: 2 * pages + 4 * slots * G
                                    ///< (elastic: min(2 / keep_ratio, 16) * pages + 4 * slots * G)
  std::int64_t max_view_changes =
      0;  ///< journal entries before a full resync; 0: 4 * max_batch + 1024
  std::int64_t max_chunk_tokens =
      2048;  ///< elastic reservation: the longest prefill chunk; each sequence reserves room to
             ///< stage one chunk in every compressed group before its eviction
  /// Multi-stream engines: pages whose last reference is dropped (commit_chunk, end_turn, free,
  /// complete_park, complete_page_copies, ...) retire under the current epoch and become free
  /// only at `release_epochs_through` (docs/memory.md#deferred-reuse-several-streams). Off:
  /// freed pages are reusable by the very next call (safe when every kernel runs on one stream).
  bool deferred_reuse = false;
  /// Shared prefixes (`try_admit_with_prefix`): a compressed group with static budgets shares the
  /// prefix pages every head filled, as an uncompressed group does, and its eviction keeps those
  /// tokens in place for the request's life (pinned: they count in its budget and are never
  /// evicted). Off: the request copies them and its evictions may drop prefix tokens for later
  /// ones (docs/memory.md#shared-prefixes).
  bool share_compressed_prefix = true;

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
        max_chunk_tokens >= 1 && max_chunk_tokens <= std::numeric_limits<std::int32_t>::max(),
        invalid_argument,
        "manager_options.max_chunk_tokens: must be in [1, 2^31 - 1], got ",
        max_chunk_tokens);
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
  bool pinned             = false;  ///< a shared prefix (pin_prefix): read-only, never parked
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
  std::int64_t staging_pages_returned =
      0;  ///< elastic: pages a chunk's eviction gave back to its own reservation (not reclaimed:
          ///< they were reserved for that request and stay reserved for it)
  std::int64_t extended           = 0;  ///< successful try_extend
  std::int64_t extend_rejected    = 0;  ///< try_extend that did not fit
  std::int64_t rolled_back_tokens = 0;  ///< decode tokens removed by rollback
  std::int64_t rollback_pages_returned =
      0;  ///< pages rollback returned to their sequence's reservation (never to the pool)
  std::int64_t parked          = 0;  ///< sessions parked (complete_park)
  std::int64_t parked_mid_turn = 0;  ///< of those, turns parked in decode (resumed by try_resume)
  std::int64_t unparked        = 0;  ///< successful try_unpark
  std::int64_t unpark_rejected = 0;  ///< try_unpark that did not fit
  std::int64_t resumed         = 0;  ///< successful try_resume
  std::int64_t resume_rejected = 0;  ///< try_resume that did not fit
  std::int64_t pages_parked    = 0;  ///< pages handed out for copying to host (park)
  std::int64_t pages_restored  = 0;  ///< pages drawn for restored histories (unpark, resume)
  std::int64_t spare_pages_kept =
      0;  ///< deferred reuse: pages returned to their own sequence's reservation (rollback,
          ///< elastic staging) kept as its spares instead of going through the pool
  std::int64_t prefix_admits   = 0;  ///< successful try_admit_with_prefix
  std::int64_t prefix_rejected = 0;  ///< try_admit_with_prefix that did not fit
  std::int64_t prefix_pages_shared =
      0;  ///< prefix pages mapped by reference into admitted requests, never copied
};

/// @brief A page copy the engine must perform (whole page, K and V) before the next kernel that
/// reads `dst` or writes `src`. The pending list is ordered: one copy's `dst` can be a later
/// copy's `src` (a fork of a fork, or a request admitted over a prefix pinned right after its
/// fork), so the copies run in list order, or a batched kernel first groups them into rounds in
/// which no `src` is an earlier `dst`.
struct page_copy {
  page_id src = 0;
  page_id dst = 0;
  friend bool operator==(page_copy a, page_copy b) { return a.src == b.src && a.dst == b.dst; }
};

/**
 * @brief Copies whole pages inside one host arena: `base + dst * page_bytes` gets the bytes of
 * `base + src * page_bytes`, for every entry of `copies`, in order.
 * @note Host memory only. For a device pool the engine issues the equivalent cudaMemcpyAsync
 * calls, in list order, on its stream (a batched copy kernel must keep that order; see
 * page_copy).
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
 * @brief A session parked in host memory (docs/memory.md#parking-sessions-in-host-memory): an
 * ended session, or a turn parked in the middle of its answer (`mid_turn`). Everything a manager
 * over the same plan needs to rebuild it, plus the device pages the engine copies out. Plain,
 * self-contained value owned by the engine (which also owns the host copy of the pages); no
 * manager keeps a reference to it.
 *
 * Host page k of the session is the k-th page of the page lists, group after group, in list
 * order: `group_pages[0]` pages of group 0, then group 1's, and so on (`host_pages()` in all): the
 * pages its heads use (a turn's pages beyond them hold nothing and are not copied). Each host page
 * is one whole device page (`page_bytes`, K and V of all its columns).
 */
struct parked_session {
  /// Hash of what the pages and lengths mean (`plan_fingerprint(plan)`): layers, heads, page
  /// geometry, grouping, rules and reservation mode. `try_unpark` refuses another plan's session.
  std::uint64_t plan_fingerprint = 0;
  std::int64_t page_bytes        = 0;  ///< bytes of one page (and of one host page)
  std::int64_t seq_tokens        = 0;  ///< tokens the session has seen (all turns)
  std::int32_t appended = 0;  ///< decode tokens appended to every growing head since the last
                              ///< compression (the next turn's first chunk recompresses them)
  std::int64_t written_tokens = 0;         ///< most tokens seen since the last chunk
  std::vector<std::int32_t> head_base_len;  ///< [layer * H + head]: tokens kept at the last
                                            ///< compression (0 for sliding heads)
  std::vector<std::int32_t> group_pages;    ///< [group]: pages its heads use (copied out)
  /// Parked in the middle of a turn (a sequence in decode): `try_resume` continues that turn;
  /// false for an ended session, which `try_unpark` restores with its next turn.
  bool mid_turn        = false;
  std::int64_t decoded = 0;  ///< mid-turn: the turn's decode tokens so far (= appended); else 0
  std::int64_t max_new = 0;  ///< mid-turn: the decode tokens the turn had reserved; else 0
  /// Device pages to copy out, `device_pages[k]` -> host page k. Valid only between `park` and
  /// `complete_park` (the pages are freed then; the ids mean nothing afterwards).
  std::vector<page_id> device_pages;

  /// Pages of the session (host pages the engine keeps): the sum of `group_pages`.
  [[nodiscard]] std::int64_t host_pages() const noexcept {
    std::int64_t n = 0;
    for (auto c : group_pages) n += c;
    return n;
  }
};

/// @brief What `try_unpark` and `try_resume` answer when the session fits: its new sequence (in
/// prefill, as after `continue_turn`, or in decode, its turn resumed) and the device page that
/// receives each host page. Plain value.
struct restored_session {
  sequence_id id;
  /// `device_pages[k]` <- host page k of the session. The engine copies every one before any
  /// kernel reads the sequence (its first chunk's eviction reads the whole history).
  std::vector<page_id> device_pages;
};

/**
 * @brief Copies whole pages from a host arena to a host buffer: host page k (`host + k *
 * page_bytes`) gets the bytes of page `pages[k]` (`base + pages[k] * page_bytes`), k < count.
 * The copy-out of `park` on a host pool; a device pool copies with cudaMemcpyAsync instead.
 */
inline void copy_pages_to_host(std::byte const* base,
                               std::int64_t page_bytes,
                               page_id const* pages,
                               std::size_t count,
                               std::byte* host) {
  for (std::size_t k = 0; k < count; ++k)
    std::memcpy(host + static_cast<std::int64_t>(k) * page_bytes,
                base + static_cast<std::int64_t>(pages[k]) * page_bytes,
                static_cast<std::size_t>(page_bytes));
}

/**
 * @brief The copy-in of `try_unpark` on a host pool: page `pages[k]` of the arena at `base` gets
 * host page k (`host + k * page_bytes`), k < count.
 */
inline void copy_pages_from_host(std::byte* base,
                                 std::int64_t page_bytes,
                                 page_id const* pages,
                                 std::size_t count,
                                 std::byte const* host) {
  for (std::size_t k = 0; k < count; ++k)
    std::memcpy(base + static_cast<std::int64_t>(pages[k]) * page_bytes,
                host + static_cast<std::int64_t>(k) * page_bytes,
                static_cast<std::size_t>(page_bytes));
}

/**
 * @brief Which of the manager's two batches a call or a view means. Each kernel launch runs over
 * one: the eviction (and prefill-attention) kernels over the `prefill` batch, the append and
 * decode-attention kernels over the `decode` batch, so a mixed step (prefill chunks beside
 * decodes) sets both once and launches each kernel on its own view. The calls without a kind
 * (`set_batch(ids)`, `view()`, `decode_step()`, ...) mean `decode`.
 */
enum class batch_kind : std::uint8_t {
  decode  = 0,  ///< requests with one (or a few) new tokens: append, decode attention
  prefill = 1,  ///< requests with a prepared prompt chunk: eviction, prefill attention
};
/// Number of `batch_kind` values (the manager keeps one batch per kind).
inline constexpr std::size_t batch_kind_count = 2;

/// The kind's name ("decode", "prefill"), as error messages print it.
constexpr std::string_view to_string(batch_kind k) noexcept {
  switch (k) {
    case batch_kind::decode:
      return "decode";
    case batch_kind::prefill:
      return "prefill";
  }
  return "?";
}

/// @brief What changed in the view's index arrays since the last `clear_view_changes()`: enough
/// for an engine that mirrors them on the device to upload only the changes.
struct view_changes {
  std::int32_t const* page_entries = nullptr;  ///< indices into `pages` that were written
  std::size_t num_page_entries     = 0;
  std::int32_t const* slots = nullptr;  ///< slots whose page_offset / head_base_len rows changed
  std::size_t num_slots     = 0;
  /// Slots whose `appended` / `seq_tokens` entries changed (decode steps, appends, rollbacks,
  /// chunks, admission, forks, frees); with the lists above, enough to keep a device mirror of
  /// every view array from the journal alone.
  std::int32_t const* counter_slots = nullptr;
  std::size_t num_counter_slots     = 0;
  bool full_resync = false;  ///< too many changes, or the arena was repacked: upload everything
};

/// @brief Element counts of the arrays behind a view (for mirroring them on a device).
struct kv_view_extents {
  std::int64_t head_slots    = 0;  ///< L * H
  std::int64_t groups        = 0;  ///< G (group_window, group_ring_pages)
  std::int64_t page_offset   = 0;  ///< slots * G
  std::int64_t pages         = 0;  ///< index capacity
  std::int64_t head_base_len = 0;  ///< slots * L * H
  std::int64_t slots         = 0;  ///< appended, seq_tokens: every sequence slot plus the
                                   ///< padding slot (max_sequences + 1 rows; page_offset and
                                   ///< head_base_len count the same rows)
  std::int64_t batch         = 0;  ///< batch_slots of each batch kind: the largest batch
                                   ///< (manager_options::max_batch, resolved), padding included,
                                   ///< so buffers sized at load time fit every batch
};

}  // namespace tangram
