// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/kv_cache_manager.hpp
 * @brief The engine-facing KV-cache manager: admission with exact reservations, head-group page
 * tables in stable slots, chunked prefill with fused eviction, decode, multi-turn sessions, forks
 * with copy-on-write, sessions parked in host memory, and the batch view the kernels read.
 *
 * One manager per tensor-parallel rank or pipeline stage (`try_admit_all` in
 * memory/tensor_parallel.hpp admits on all or none). Operations are declared in the order of a
 * request's life, with their contracts: admit -> chunks -> decode -> turns -> park -> free, then
 * views and inspection; bodies in memory/detail/manager_*.inl. The engine protocol, call by call:
 * docs/memory.md#engine-protocol.
 *
 * Thread safety: a single-threaded object; every call, `view()` included, is serialised by the
 * caller. A `kv_cache_view` is a non-owning snapshot of the manager's host arrays, valid until the
 * next mutating call and readable by several threads while none runs. The manager never reads or
 * writes page contents.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/memory/detail/batch_membership.hpp"
#include "tangram/memory/detail/copy_on_write.hpp"
#include "tangram/memory/detail/decode_buckets.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_flow.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/page_usage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/detail/turn_footprint.hpp"
#include "tangram/memory/detail/view_assembly.hpp"
#include "tangram/memory/detail/view_journal.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

namespace detail {
/// Defined only by tests that corrupt a manager on purpose (`check_invariants` must catch it).
struct kv_cache_manager_test_access;
}  // namespace detail

/**
 * @brief One rank's KV-cache manager: a facade over its parts (docs/memory.md#the-managers-parts).
 *
 * Every operation validates its arguments and sizes its work first, then applies it through the
 * parts' mutators, which cannot fail once the checks passed: an operation that throws or answers
 * "does not fit" changes nothing (strong guarantee).
 *
 * @tparam Layout page geometry type of the pool (`page_layout<>` dynamic by default; a static one
 *         must agree with the plan's geometry).
 *
 * Ownership: owns its pool (the arena, returned to `upstream` at destruction) and every host
 * array of the view; `upstream` must outlive the manager. Arrays are sized at construction:
 * admission, chunk, decode and free never allocate (fork, continue_turn, prefix admission may
 * grow the pending-copy list; park and try_unpark allocate only their result). Not copyable, not
 * movable. */
template <class Layout = page_layout<>>
class basic_kv_cache_manager {
 public:
  using pool_type = page_pool<Layout>;

  // ===== construction and shape (constructor: detail/manager_admit.inl) ========================
  /**
   * @brief Builds the manager and takes the pool's arena from `upstream`.
   * @throw invalid_argument for bad options or a plan whose geometry the Layout cannot hold.
   * @throw out_of_memory when the upstream cannot provide the arena.
   */
  basic_kv_cache_manager(static_plan const& plan,
                         resource_ref upstream,
                         manager_options const& options);
  basic_kv_cache_manager(basic_kv_cache_manager const&)            = delete;
  basic_kv_cache_manager& operator=(basic_kv_cache_manager const&) = delete;

  [[nodiscard]] static_plan const& plan() const noexcept { return plan_; }
  [[nodiscard]] manager_options const& options() const noexcept { return options_; }
  [[nodiscard]] pool_type const& pool() const noexcept { return pool_; }
  [[nodiscard]] std::int32_t num_groups() const noexcept { return groups_.num_groups(); }
  [[nodiscard]] std::int32_t max_sequences() const noexcept { return sequences_.size(); }
  [[nodiscard]] manager_stats const& stats() const noexcept { return stats_; }
  /// Sequences alive (any phase but free).
  [[nodiscard]] std::int32_t live_sequences() const noexcept { return sequences_.live(); }
  /// `plan_fingerprint(plan())`: what a `parked_session` must carry to restore here.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }

  // ===== 1. admit (detail/manager_admit.inl) ===================================================
  /// @brief Pages a request of N prompt and T max new tokens reserves (M(r); elastic: the
  /// scorer's total plus one chunk's staging; `admission_footprint_pages`). Pure.
  [[nodiscard]] std::int64_t admission_pages(std::int64_t prompt_tokens,
                                             std::int64_t max_new_tokens) const {
    return admission_footprint_pages(
        plan_, prompt_tokens, max_new_tokens, options_.max_chunk_tokens);
  }

  /**
   * @brief Admits a request: reserves its whole footprint M(r) (`admission_pages`) at once and
   * gives it a slot; an admitted request never runs out of pages.
   * @return the new sequence, or nullopt ("does not fit": no free slot, not enough unreserved
   *         pages, or no room in the page-id arena); nothing changes then.
   * @throw invalid_argument when N < 1, T < 0, or N + T exceeds 2^31 - 1 or overflows int64
   *        (names the values); nothing changes then.
   */
  [[nodiscard]] std::optional<sequence_id> try_admit(std::int64_t prompt_tokens,
                                                     std::int64_t max_new_tokens) {
    return admit_checked("try_admit", prompt_tokens, max_new_tokens).id;
  }

  /// @brief `try_admit` that says why a request did not fit (`admit_failure`: never fits, no free
  /// slot, pages missing now and how many, no page-id arena room; the first that applies). Same
  /// reservation, guarantees and errors as `try_admit` (invalid_argument names "admit").
  [[nodiscard]] admit_result admit(std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
    return admit_checked("admit", prompt_tokens, max_new_tokens);
  }

  // ===== 2. chunks of the prompt (detail/manager_prefill.inl) ===================================
  /**
   * @brief Before the eviction of a prompt chunk of `chunk_tokens` runs: draws from the
   * reservation the pages every group needs after the chunk (its rule's length at n + c; elastic
   * compressed groups: the chunk staged after the longest head). Lengths change at `commit_chunk`.
   * @throw logic_error (nothing changed) for an unknown sequence, a sequence not in prefill, a
   *        chunk already prepared, or a chunk longer than the prompt tokens that remain.
   * @throw invalid_argument when chunk_tokens < 1 (elastic: or > max_chunk_tokens).
   */
  void prepare_chunk(sequence_id seq, std::int64_t chunk_tokens);

  /**
   * @brief Writes to `out[layer * H + head]` every head's expected kept count after the prepared
   * or next chunk of `chunk_tokens`: compressed `min(retained_tokens(rule, n + c), held + c)`,
   * uncompressed n + c, sliding `min(n + c, W)`.
   * @throw logic_error for an unknown sequence or a chunk longer than the prompt tokens left;
   *        invalid_argument when chunk_tokens < 0. `out` is unchanged then.
   */
  void expected_kept(sequence_id seq, std::int64_t chunk_tokens, std::int32_t* out) const;

  /**
   * @brief After the eviction ran: records each head's kept count (`kept[layer * H + head]`,
   * `count == L * H`): compressed heads at most `expected_kept`, the others exactly it. Pages the
   * recompression left beyond this turn's target return to the pool; elastic staging only after
   * the last chunk (until then a group keeps it for the next chunk, in `group_page_count`).
   * @throw logic_error (nothing changed) naming a bad count's head and values, or when no chunk
   *        is prepared; invalid_argument when count != L * H.
   */
  void commit_chunk(sequence_id seq, std::int32_t const* kept, std::size_t count);
  /// @brief `commit_chunk` with a vector of `L * H` counts.
  void commit_chunk(sequence_id seq, std::vector<std::int32_t> const& kept) {
    commit_chunk(seq, kept.data(), kept.size());
  }

  // ===== 3. batches and decode (detail/manager_decode.inl) =====================================
  /**
   * @brief Sets the batch of kind `kind` (eviction and prefill attention run over `prefill`,
   * append and decode attention over `decode`): request r is sequence ids[r] for r < count.
   * Requests [count, padded_size) are padding (a CUDA graph captured at `padded_size` replays for
   * any count up to it): they name the view's `padding_slot`, zero tokens and no pages, a no-op
   * for every kernel and for `decode_step`; 0 means no padding. A sequence may be in both batches
   * (a mixed step), once in each. Phases are checked by `decode_step` and the chunk calls, not
   * here. The other batch is unchanged. O(padded_size), allocation-free.
   * @throw invalid_argument (batch unchanged) for an unknown `kind`, count > max_batch, null
   *        `ids` with count > 0, or padded_size neither 0 nor in [count, max_batch];
   *        logic_error (batch unchanged) for an unknown sequence or one listed twice.
   */
  void set_batch(batch_kind kind,
                 sequence_id const* ids,
                 std::size_t count,
                 std::size_t padded_size = 0) {
    batch_of(kind, "set_batch").set(ids, count, sequences_, padded_size);
  }
  /// @brief `set_batch(kind, ids, count, padded_size)` from a vector.
  void set_batch(batch_kind kind,
                 std::vector<sequence_id> const& ids,
                 std::size_t padded_size = 0) {
    set_batch(kind, ids.data(), ids.size(), padded_size);
  }
  /// @brief `set_batch(batch_kind::decode, ids, count)`: the batch `view()` and `decode_step` run
  /// over, without padding.
  void set_batch(sequence_id const* ids, std::size_t count) {
    set_batch(batch_kind::decode, ids, count);
  }
  /// @brief `set_batch(batch_kind::decode, ids)` from a vector.
  void set_batch(std::vector<sequence_id> const& ids) {
    set_batch(batch_kind::decode, ids.data(), ids.size());
  }

  /// Requests in the batch of `kind`, padding included. @throw invalid_argument if kind unknown.
  [[nodiscard]] std::int32_t batch_size(batch_kind kind) const {
    return batch_of(kind, "batch_size").size();
  }
  /// Requests in the decode batch, padding included.
  [[nodiscard]] std::int32_t batch_size() const noexcept { return decode_batch().size(); }
  /// Padding requests (the last ones) of the batch of `kind`. @throw as `batch_size(kind)`.
  [[nodiscard]] std::int32_t batch_padding(batch_kind kind) const {
    auto const& b = batch_of(kind, "batch_padding");
    return b.size() - b.members();
  }
  /// The sequence of request r of the batch of `kind` (perhaps freed since `set_batch`).
  /// @throw invalid_argument for an unknown kind, r outside [0, batch_size(kind)) or padding.
  [[nodiscard]] sequence_id batch_sequence(batch_kind kind, std::int32_t r) const;
  /// The sequence of request r of the decode batch. @throw as `batch_sequence(kind, r)`.
  [[nodiscard]] sequence_id batch_sequence(std::int32_t r) const {
    return batch_sequence(batch_kind::decode, r);
  }
  /// @brief Checks that every (non-padding) member of the batch of `kind` is still the sequence
  /// `set_batch` listed. O(batch), allocation-free. @throw invalid_argument for an unknown kind;
  /// logic_error naming `operation`, request, slot and generation of the first one freed.
  void check_batch_live(batch_kind kind, char const* operation) const {
    batch_of(kind, operation).check_live(operation, sequences_);
  }
  /// @brief `check_batch_live(batch_kind::decode, operation)`.
  void check_batch_live(char const* operation) const {
    check_batch_live(batch_kind::decode, operation);
  }

  /**
   * @brief Makes room for one decode token in every head of every (non-padding) request of the
   * decode batch, before the append and attention kernels: O(batch) counters plus one page-table
   * entry per group crossing a page, drawn from the reservations (never short). Allocation-free.
   * @throw logic_error (nothing changed) when a batch member was freed, is not in the decode
   *        phase, or already appended its T reserved tokens this turn.
   */
  void decode_step();

  /**
   * @brief `decode_step` with a token count per request of the decode batch (speculative
   * decoding: request r appends `tokens[r]` >= 0 tokens; padding requests 0). Allocation-free.
   * @throw invalid_argument when count != batch_size() (padding included), a count is negative
   *        or a padding request's count is not 0; logic_error when a member was freed, is not in
   *        decode, or would pass its max_new_tokens (try_extend first). Nothing changes then.
   */
  void decode_step(std::int32_t const* tokens, std::size_t count);
  /// @brief `decode_step` with a vector of per-member counts.
  void decode_step(std::vector<std::int32_t> const& tokens) {
    decode_step(tokens.data(), tokens.size());
  }

  /**
   * @brief Appends `tokens` decode tokens to one sequence (in a batch or not), e.g. a speculative
   * draft; pages come from its reservation. Allocation-free.
   * @throw invalid_argument when tokens < 1; logic_error for an unknown sequence, one not in
   *        decode, or one that would pass its max_new_tokens. Nothing changes then.
   */
  void append_tokens(sequence_id seq, std::int64_t tokens);

  /**
   * @brief Removes the last `tokens` decode tokens of `seq` (rejected speculative tokens): the
   * counters go back and the pages those tokens started return to its own reservation, so
   * appending again never fails. Allocation-free, O(groups + pages returned).
   * @throw invalid_argument when tokens < 1; logic_error for an unknown sequence, one not in
   *        decode, or tokens > `max_rollback(seq)` (names both). Nothing changes when it throws.
   */
  void rollback(sequence_id seq, std::int64_t tokens);

  /**
   * @brief The most tokens `rollback(seq, k)` accepts now: this turn's decode tokens (0 outside
   * decode), less where a rolled-back position's page is shared (a fork's, or one a pending copy
   * reads) or a wrapped sliding-window ring lacks tokens its window needs again (at most
   * ring_pages * P - W, less what was rolled back since). O(groups), O(pages) when forked.
   * @throw logic_error for an unknown sequence.
   */
  [[nodiscard]] std::int64_t max_rollback(sequence_id seq) const {
    return usage_.max_rollback(sequences_.find(seq, "max_rollback"));
  }

  /**
   * @brief Grows the decode reservation of a running turn by `more_tokens` (e.g. the next answer
   * window), all or nothing: per group the pages its heads reach after max_new + more tokens, less
   * what it holds or has reserved (elastic: the shared budget likewise).
   * @return true when reserved (max_new_tokens grew); false ("does not fit": pages or page-id
   *         arena room), nothing changed then (a repacked arena moves no logical state).
   * @throw invalid_argument when more_tokens < 1 or the turn would pass 2^31 - 1 tokens;
   *        logic_error for an unknown sequence or one not in decode. Nothing changes then.
   */
  [[nodiscard]] bool try_extend(sequence_id seq, std::int64_t more_tokens);

  // ===== 4. turns, forks and their page copies (detail/manager_turns.inl) =======================
  /**
   * @brief Ends the current turn (prompt done; also a turn that stops early at EOS): the whole
   * remaining reservation and every page no head uses return to the pool at once, the compressed
   * history stays: `info().reserved_pages` is 0 afterwards and each group keeps exactly
   * `group_pages_in_use` pages.
   * @throw logic_error (nothing changed) for an unknown sequence or one not in the decode phase.
   */
  void end_turn(sequence_id seq);

  /**
   * @brief Starts the next turn (N prompt, T decode tokens) of an ended session, reserving per
   * group only `final_g` less the pages it holds exclusively below it (final_g =
   * group_pages(rule, n + N, T)); pages shared with a fork that the recompression will overwrite
   * are copied (`pending_copies`).
   * @return false ("does not fit": pages or page-id arena room); nothing changed then.
   * @throw logic_error for an unknown sequence or one whose turn has not ended;
   *        invalid_argument for N < 1, T < 0 or n + N + T past 2^31 - 1 or int64;
   *        std::bad_alloc (the pending-copy list). Nothing changes when it throws.
   */
  [[nodiscard]] bool continue_turn(sequence_id seq,
                                   std::int64_t prompt_tokens,
                                   std::int64_t max_new_tokens);

  /**
   * @brief Forks a sequence (decode phase or ended): the child sees the same history. Filled pages
   * are shared by reference count; pages heads may still write (partial tails, sliding rings) are
   * copied (`pending_copies`). The child reserves what its turn may still need.
   * @return the child, or nullopt ("does not fit"; nothing changed).
   * @throw logic_error for an unknown sequence or one in prefill; std::bad_alloc when the
   *        pending-copy list cannot grow. Nothing changes when it throws.
   */
  [[nodiscard]] std::optional<sequence_id> fork(sequence_id parent);
  /// @brief Shared prefixes, contracts in detail/manager_prefix.inl: pin an ended sequence
  /// read-only (`free` unregisters it), admit N + T tokens after it sharing its pages.
  void pin_prefix(sequence_id seq);
  [[nodiscard]] std::optional<sequence_id> try_admit_with_prefix(sequence_id prefix,
                                                                 std::int64_t prompt_tokens,
                                                                 std::int64_t max_new_tokens);

  /// @brief Page copies recorded by `fork` / `continue_turn` that the engine has not confirmed.
  /// Each holds a reference on both pages until `complete_page_copies`.
  [[nodiscard]] std::vector<page_copy> const& pending_copies() const noexcept {
    return copies_.pending();
  }
  /// @brief The engine performed (or enqueued, stream-ordered before any later page write) every
  /// pending copy: their page references are dropped and the list is cleared.
  void complete_page_copies() { copies_.complete(pool_); }
  /// @brief For a host pool: performs the pending copies with memcpy, then completes them.
  /// @throw logic_error when the pool is not host memory.
  void execute_page_copies_host() { copies_.execute_host(pool_); }

  // ===== 5. park in host memory (detail/manager_park.inl) =====================================
  /**
   * @brief Starts parking a session, ended or in decode (memory/answer_window.hpp): returns the
   * self-contained `parked_session` (lengths, pages in use per group, plan fingerprint; `mid_turn`
   * with its decoded and reserved answer tokens) and the pages to copy out (`device_pages[k]` ->
   * host page k, after the pending page copies). Phase `parking` keeps pages, reservation and slot
   * and accepts only `complete_park`, `cancel_park`, `free` and queries. Allocates the result;
   * docs/memory.md#parking-sessions-in-host-memory. @throw logic_error (nothing changed) for an
   * unknown sequence or one neither ended nor in decode.
   */
  [[nodiscard]] parked_session park(sequence_id seq);

  /// @brief The copy-outs of `park` are done (or stream-ordered before any later write): pages
  /// and reservation return to the pool (a fork keeps what it shares), the slot is free.
  /// @throw logic_error (nothing changed) for an unknown sequence or one not parking.
  void complete_park(sequence_id seq);

  /// @brief Abandons a `park`: the sequence is back in its phase (ended, or decode with its turn),
  /// pages kept; do not restore the session. @throw logic_error (nothing changed) if not parking.
  void cancel_park(sequence_id seq);

  /// @brief Pages `try_unpark(session, N, T)` reserves now: the history's pages plus what
  /// `continue_turn(N, T)` would reserve holding them exclusively. Pure; allocates scratch.
  /// @throw invalid_argument as `try_unpark` (names "unpark_pages").
  [[nodiscard]] std::int64_t unpark_pages(parked_session const& session,
                                          std::int64_t prompt_tokens,
                                          std::int64_t max_new_tokens) const;

  /**
   * @brief Restores a session parked after its turn ended, with its next turn (N, T), all or
   * nothing: reserves `unpark_pages`, takes a slot and fresh pages (host page k ->
   * `device_pages[k]`, copied in before any kernel reads it), as `continue_turn(N, T)` leaves
   * the original. The session is not consumed. Allocates the result only, before any change.
   * @return nullopt ("does not fit": slot, pages or page-id arena; nothing changed).
   * @throw invalid_argument (nothing changed) for another plan's or page size's session, one
   *        parked mid-turn (`try_resume`), impossible lengths or page counts (names the field),
   *        N < 1, T < 0 or seq_tokens + N + T past 2^31 - 1; std::bad_alloc.
   */
  [[nodiscard]] std::optional<restored_session> try_unpark(parked_session const& session,
                                                           std::int64_t prompt_tokens,
                                                           std::int64_t max_new_tokens);

  /// @brief Pages `try_resume(session, T)` reserves now: the history's pages plus what the groups
  /// grow by until the answer reaches T tokens (`page_usage::size_resume`). Pure; allocates
  /// scratch. @throw invalid_argument as `try_resume` (names "resume_pages").
  [[nodiscard]] std::int64_t resume_pages(parked_session const& session,
                                          std::int64_t max_new_tokens) const;

  /**
   * @brief Resumes a turn parked in decode (`session.mid_turn`) with `max_new_tokens` answer
   * tokens in all (>= those decoded), all or nothing, as `try_unpark` restores; the sequence is
   * back in decode. @return nullopt ("does not fit"; nothing changed).
   * @throw invalid_argument (nothing changed) as `try_unpark`, for a session that ended before it
   *        was parked, or for max_new_tokens below its decoded tokens or past 2^31 - 1 tokens.
   */
  [[nodiscard]] std::optional<restored_session> try_resume(parked_session const& session,
                                                           std::int64_t max_new_tokens);

  // ===== 6. free, and deferred reuse for several streams ========================================
  /**
   * @brief Frees a sequence in any phase (mid-chunk: an abort): page references and unused
   * reservation return to the pool, the slot is free, old handles stale. A batch that listed it
   * must be set again before its next `view` / `decode_step` (they refuse until then). Pending
   * page copies keep their own references.
   * @throw logic_error (nothing changed) for an unknown sequence.
   */
  void free(sequence_id seq) {
    release_sequence(sequences_.find(seq, "free"));
    ++stats_.freed;
  }

  /**
   * @brief Closes the open epoch and returns its id: call once per step, after the step's kernels
   * were enqueued and an event recorded behind them (`stream_epochs`, device/stream_epochs.hpp,
   * does both). With `manager_options::deferred_reuse` a page whose last reference is dropped
   * retires under the current epoch and is handed out again only once `release_epochs_through`
   * covers it; pages back in their own sequence's reservation stay with it as spares; unused
   * reservation returns at once (docs/memory.md#deferred-reuse-several-streams). O(1),
   * allocation-free; accepted without deferred reuse.
   * @throw logic_error when the epoch id would overflow int64; nothing changes then.
   */
  std::int64_t advance_epoch() { return pool_.advance_epoch(); }
  /// @brief The open epoch: pages unreferenced from now on retire under this id (0 at first).
  [[nodiscard]] std::int64_t current_epoch() const noexcept { return pool_.current_epoch(); }
  /// @brief The newest epoch released so far (-1 before the first release).
  [[nodiscard]] std::int64_t released_epoch() const noexcept { return pool_.released_through(); }
  /// @brief Pages waiting for `release_epochs_through` (neither free nor used; not available to
  /// admission). 0 without deferred reuse.
  [[nodiscard]] std::int64_t retired_pages() const noexcept { return pool_.retired_pages(); }
  /// @brief Calls `f(page_id)` for each spare page of `seq` (deferred reuse: pages back in its own
  /// reservation, referenced by it alone, counted in `info().reserved_pages`; none otherwise).
  /// O(its spares), allocation-free. @throw logic_error for an unknown sequence.
  template <class F>
  void for_each_spare_page(sequence_id seq, F&& f) const {
    flow_.for_each_spare(sequences_.find(seq, "for_each_spare_page"), f);
  }
  /**
   * @brief The work enqueued up to the close of `epoch` completed: pages retired in epochs <=
   * `epoch` become free (again for an epoch already released: nothing). O(pages released),
   * allocation-free. @return the pages that became free.
   * @throw invalid_argument naming the value when epoch < 0 or epoch >= current_epoch();
   *        nothing changes then.
   */
  std::int64_t release_epochs_through(std::int64_t epoch) {
    return pool_.release_epochs_through(epoch);
  }

  // ===== 7. views for the kernels (detail/manager_inspect.inl) ==================================
  /**
   * @brief The view of the batch of `kind` over the manager's host arrays and the pool arena,
   * for the kernels of that kind. Both kinds' views share every array but `batch_size` /
   * `batch_slots`. Checks that every (non-padding) member is still live: O(batch),
   * allocation-free. Non-owning, valid until the next mutating call.
   * @throw invalid_argument for an unknown kind; logic_error naming the request, slot and
   *        generation of a member freed (or its slot reused) since `set_batch`.
   */
  [[nodiscard]] kv_cache_view view(batch_kind kind) const;
  /// @brief `view(batch_kind::decode)`. @throw as `view(kind)`.
  [[nodiscard]] kv_cache_view view() const { return view(batch_kind::decode); }

  /// @brief Element counts of the arrays behind `view(kind)`, for sizing device mirrors once:
  /// capacities fixed at construction (`batch` is max_batch; `slots` counts the padding slot).
  [[nodiscard]] kv_view_extents view_extents() const noexcept {
    return detail::assemble_extents(sequences_.size(), groups_, page_table_, decode_batch());
  }

  /// @brief Changes to `pages`, `page_offset`, `head_base_len`, `appended` and `seq_tokens` since
  /// the last `clear_view_changes()`, which keep a device mirror current (`full_resync`: upload
  /// all). `batch_slots` is not journaled: upload it after each `set_batch`.
  [[nodiscard]] view_changes changes() const noexcept { return journal_.changes(); }
  /// @brief Forgets the journal (after the engine uploaded the changes). Allocation-free.
  void clear_view_changes() noexcept { journal_.clear(); }

  // ===== 8. inspection (detail/manager_inspect.inl) =============================================
  /// @brief True when `seq` names a live sequence.
  [[nodiscard]] bool contains(sequence_id seq) const noexcept { return sequences_.contains(seq); }

  /// @throw logic_error for an unknown sequence.
  [[nodiscard]] sequence_info info(sequence_id seq) const {
    return detail::assemble_info(
        seq, sequences_.find(seq, "info"), sequences_, lengths_, page_table_);
  }

  /// @brief Calls `f(sequence_info const&)` (as `info`) for every live sequence in slot order;
  /// `f` must not mutate the manager. O(slots + live sequences x groups), allocation-free.
  template <class F>
  void for_each_sequence(F&& f) const;
  /// @brief Every live sequence's `info`, in slot order (allocates the vector).
  [[nodiscard]] std::vector<sequence_info> sequences() const;

  /// Tokens held by head (layer, head) of `seq`. @throw logic_error for an unknown sequence.
  [[nodiscard]] std::int64_t head_len(sequence_id seq, std::int32_t layer, std::int32_t head) const;

  /// Entries in the page list of (seq, group g). @throw logic_error for an unknown sequence/group.
  [[nodiscard]] std::int32_t group_page_count(sequence_id seq, std::int32_t g) const {
    return page_table_.count(checked_group(seq, g, "group_page_count"), g);
  }
  /// The page list of (seq, group g): `group_page_count` ids. Valid until the next mutating call.
  [[nodiscard]] page_id const* group_pages(sequence_id seq, std::int32_t g) const {
    return page_table_.list(checked_group(seq, g, "group_pages"), g);
  }
  /// Pages group g of `seq` may hold when its current turn completes (M(r) per group).
  [[nodiscard]] std::int32_t group_target(sequence_id seq, std::int32_t g) const {
    return page_table_.target(checked_group(seq, g, "group_target"), g);
  }
  /// Pages group g of `seq` may still draw from its reservation (0 for a compressed group under
  /// elastic reservation: those draw from `elastic_page_limit`'s shared reservation).
  [[nodiscard]] std::int32_t group_reserved(sequence_id seq, std::int32_t g) const {
    return page_table_.budget(checked_group(seq, g, "group_reserved"), g);
  }
  /// Leading tokens of group g's heads on a pinned prefix's shared pages (view `pinned_tokens`).
  [[nodiscard]] std::int32_t group_pinned_tokens(sequence_id seq, std::int32_t g) const;
  /// Pages group g of `seq` uses now: its longest head's (a sliding ring: its filled pages).
  [[nodiscard]] std::int64_t group_pages_in_use(sequence_id seq, std::int32_t g) const {
    return usage_.in_use(checked_group(seq, g, "group_pages_in_use"), g);
  }
  /// Elastic: the most pages the compressed groups of `seq` may hold together after each chunk's
  /// eviction this turn (`commit_chunk` refuses more); 0 if static. @throw logic_error if unknown.
  [[nodiscard]] std::int64_t elastic_page_limit(sequence_id seq) const {
    return page_table_.pooled_limit(sequences_.find(seq, "elastic_page_limit"));
  }
  /// Elastic: the tokens the scorer keeps over the compressed heads of `seq` after its prepared
  /// chunk, the `wanted` input of `evict_elastic` (kernels/elastic_eviction.hpp); 0 if static.
  /// O(1), allocation-free. @throw logic_error for an unknown sequence.
  [[nodiscard]] std::int64_t elastic_wanted_tokens(sequence_id seq) const;

  /**
   * @brief Full self-check, O(pool + all page lists): free slots, both batches and the padding
   * slot, reference counts against page lists and pending copies, reservations against the pool,
   * list capacities, page use and non-overlapping segments. Allocates (scratch arrays).
   * @throw logic_error describing the first inconsistency.
   */
  void check_invariants() const;

 private:
  friend struct detail::kv_cache_manager_test_access;

  /// try_admit / admit (`op` names the call in errors): sizes, classifies, then admits.
  admit_result admit_checked(char const* op,
                             std::int64_t prompt_tokens,
                             std::int64_t max_new_tokens);
  /// Whether the turn `footprint_` sized fits now: its pages are available and, when its lists
  /// outgrow their segments, the page-id arena makes room (a repack moves no logical state).
  bool footprint_fits(bool relocates);
  /// free / complete_park: page references, list segment and unused reservation back, slot free.
  void release_sequence(std::int32_t s);
  /// try_unpark / unpark_pages (`op`): the session is this plan's, ended, the turn sizes valid.
  void check_unpark(char const* op,
                    parked_session const& session,
                    std::int64_t prompt_tokens,
                    std::int64_t max_new_tokens) const;
  /// try_resume / resume_pages (`op`): the session belongs here and was parked in decode.
  void check_resume(char const* op, parked_session const& session, std::int64_t max_new) const;
  /// try_unpark / try_resume once `footprint_` sizes the turn; "does not fit" counts in `rejected`.
  std::optional<restored_session> restore(parked_session const& p,
                                          sequence_phase phase,
                                          std::int64_t& rejected);
  /// Index of `kind` in `batches_`. @throw invalid_argument naming `op` for an unknown kind.
  static std::size_t kind_index(batch_kind kind, char const* op);
  detail::batch_membership& batch_of(batch_kind kind, char const* op) {
    return batches_[kind_index(kind, op)];
  }
  detail::batch_membership const& batch_of(batch_kind kind, char const* op) const {
    return batches_[kind_index(kind, op)];
  }
  detail::batch_membership const& decode_batch() const noexcept {
    return batches_[static_cast<std::size_t>(batch_kind::decode)];
  }
  /// The slot of `seq` after checking it and group g. @throw as the group_* accessors.
  std::int32_t checked_group(sequence_id seq, std::int32_t g, char const* op) const;

  static_plan plan_;
  std::uint64_t fingerprint_ = 0;  ///< plan_fingerprint(plan_), carried by parked sessions
  manager_options options_;
  pool_type pool_;
  detail::group_lookup groups_;
  detail::sequence_table sequences_;
  detail::page_table_storage page_table_;
  detail::head_lengths lengths_;
  detail::decode_buckets buckets_;
  std::array<detail::batch_membership, batch_kind_count> batches_;  ///< [batch_kind]
  detail::view_journal journal_;
  detail::copy_on_write copies_;
  detail::turn_footprint footprint_;
  detail::page_usage<pool_type> usage_;
  detail::page_flow<pool_type> flow_;
  std::vector<std::int64_t> chunk_need_;  ///< prepare_chunk: pages each group needs after it
  manager_stats stats_;
};

/// @brief The manager with dynamic page extents over any resource (`resource_ref`).
using kv_cache_manager = basic_kv_cache_manager<>;

}  // namespace tangram

// The bodies, one file per group of operations above.
#include "tangram/memory/detail/manager_admit.inl"
#include "tangram/memory/detail/manager_decode.inl"
#include "tangram/memory/detail/manager_inspect.inl"
#include "tangram/memory/detail/manager_park.inl"
#include "tangram/memory/detail/manager_prefill.inl"
#include "tangram/memory/detail/manager_prefix.inl"
#include "tangram/memory/detail/manager_turns.inl"
