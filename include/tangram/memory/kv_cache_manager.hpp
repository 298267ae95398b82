// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/kv_cache_manager.hpp
 * @brief The engine-facing KV-cache manager: admission with exact reservations, head-group page
 * tables in stable slots, chunked prefill with fused eviction, decode, multi-turn sessions, forks
 * with copy-on-write, and the batch view the kernels and the CPU reference read.
 *
 * One manager per tensor-parallel rank, built over that rank's `static_plan`; `try_admit_all`
 * (memory/tensor_parallel.hpp) admits a request on every rank or on none.
 *
 * Per step, an engine calls (see docs/memory.md for the full protocol):
 * - `try_admit(N, T)` once per request: reserves the exact footprint M(r) or answers "does not
 *   fit" (nullopt) and changes nothing. An admitted request never runs out of pages. Under
 *   elastic reservation (the plan's `options.reservation`) M(r) is the scorer's total plus one
 *   chunk's staging, shared by the compressed groups (docs/memory.md#elastic-reservation).
 * - per prefill chunk: `prepare_chunk(seq, c)` (pages drawn from the reservation), the eviction
 *   kernel over `view(batch_kind::prefill)` (the prefill batch, set by
 *   `set_batch(batch_kind::prefill, ids)` to the sequences whose chunks one launch evicts;
 *   elastic: its group-length selection keeps the groups within `elastic_page_limit`), then
 *   `commit_chunk(seq, kept)` with the per-head kept counts.
 * - per decode step: `set_batch(ids)` (= `set_batch(batch_kind::decode, ids)`) when the batch
 *   changes, `decode_step()` (room for one token per head of every batch member;
 *   `decode_step(counts)` or `append_tokens(seq, k)` for several, `rollback(seq, k)` for rejected
 *   speculative tokens), then `view()` (= `view(batch_kind::decode)`) for the append and
 *   attention kernels.
 * - a mixed step (chunked prefill beside decodes, as vLLM v1 and SGLang schedule) keeps both
 *   batches set and launches each kernel once on its own view: the two views share every
 *   page-table array and differ only in `batch_size` / `batch_slots`. A sequence may be in both.
 * - CUDA graphs: `set_batch(kind, ids, count, padded_size)` pads a batch to a fixed size with
 *   padding requests (the view's `padding_slot`: zero tokens, no pages, a no-op for every kernel),
 *   so a graph captured at batch size B replays for any batch up to B.
 * - `try_extend(seq, more)` grows a running turn's decode reservation, all or nothing.
 * - `end_turn(seq)`, `continue_turn(seq, N, T)`, `fork(seq)`, `free(seq)`.
 * - sessions in host memory: `park(seq)` (copy its pages out), `complete_park(seq)`, later
 *   `try_unpark(session, N, T)` (copy them into fresh pages) instead of `continue_turn`, or
 *   `try_resume(session, T)` for a turn parked in decode (answers that grow:
 *   memory/answer_window.hpp).
 * - several streams: with `manager_options::deferred_reuse`, `advance_epoch()` once per step and
 *   `release_epochs_through(e)` once epoch e's work completed; freed pages wait until then.
 * FlashInfer's paged-KV CSR comes from `export_flashinfer_layer` in interop/flashinfer.hpp.
 *
 * Thread safety: a single-threaded object. Every call, including `view()`, must be serialised by
 * the caller. The returned `kv_cache_view` is a non-owning snapshot of pointers into the manager's
 * host arrays: valid until the next mutating call; it may be read by several threads at once
 * while no mutating call runs. Pages are written only by the engine's kernels (or host code for a
 * host pool); the manager never reads or writes page contents.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/memory/detail/batch_membership.hpp"
#include "tangram/memory/detail/chunk_rules.hpp"
#include "tangram/memory/detail/copy_on_write.hpp"
#include "tangram/memory/detail/decode_buckets.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/manager_checks.hpp"
#include "tangram/memory/detail/manager_invariants.hpp"
#include "tangram/memory/detail/page_flow.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/page_usage.hpp"
#include "tangram/memory/detail/parking.hpp"
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
/// Defined only by tests that corrupt a manager on purpose to show that `check_invariants`
/// catches it; the library never defines it.
struct kv_cache_manager_test_access;
}  // namespace detail

/**
 * @brief The KV-cache manager of one tensor-parallel rank: a facade over its parts.
 *
 * Parts (memory/detail/; what each owns: docs/memory.md#the-managers-parts): group_lookup,
 * sequence_table, page_table_storage, head_lengths, decode_buckets, chunk_rules, page_usage,
 * turn_footprint, copy_on_write, batch_membership, view_journal, page_flow, view_assembly.
 *
 * Every operation validates its arguments and sizes its work first, then applies it through the
 * parts' mutators, which cannot fail once the checks passed (the few that may throw do so only on
 * an internal inconsistency): an operation that throws or answers "does not fit" changes nothing
 * (strong guarantee).
 *
 * @tparam Layout   page geometry type of the pool (`page_layout<>` dynamic by default; a static
 *                  layout must agree with the plan's geometry).
 *
 * Ownership: owns its pool (and so the arena, returned to `upstream` at destruction) and every
 * host array of the view; `upstream` must outlive the manager. All arrays are sized at
 * construction: admission, chunk, decode and free never allocate memory (fork and continue_turn
 * may grow the pending-copy list; park and try_unpark allocate only the value they return). Not copyable or movable.
 */
template <class Layout = page_layout<>>
class basic_kv_cache_manager {
 public:
  using pool_type = page_pool<Layout>;

  /**
   * @brief Builds the manager and takes the pool's arena from `upstream`.
   * @throw invalid_argument for bad options or a plan whose geometry the Layout cannot hold.
   * @throw out_of_memory when the upstream cannot provide the arena.
   */
  basic_kv_cache_manager(static_plan const& plan,
                         memory_resource& upstream,
                         manager_options const& options)
      : plan_(detail::checked_plan(plan)),
        fingerprint_(plan_fingerprint(plan_)),
        options_(detail::checked_options(options, plan)),
        pool_(upstream, Layout(plan.geometry), options_.num_pages, options_.deferred_reuse),
        groups_(plan_),
        sequences_(options_.max_sequences),
        page_table_(options_.max_sequences, groups_.num_groups(), options_.index_capacity),
        // + the padding slot's row (slot max_sequences): zero forever, read by padding requests
        lengths_(options_.max_sequences + 1, groups_.num_heads()),
        buckets_(options_.max_sequences, groups_.page_tokens(), groups_.growing_groups()),
        batches_{detail::batch_membership(options_.max_batch, options_.max_sequences),
                 detail::batch_membership(options_.max_batch, options_.max_sequences)},
        journal_(options_.max_view_changes, options_.max_sequences),
        footprint_(groups_.num_groups()),
        usage_(groups_,
               sequences_,
               page_table_,
               lengths_,
               pool_,
               options_.max_chunk_tokens),
        flow_(
            groups_, sequences_, page_table_, lengths_, buckets_, journal_, copies_, pool_, stats_),
        chunk_need_(static_cast<std::size_t>(groups_.num_groups()), 0) {}

  basic_kv_cache_manager(basic_kv_cache_manager const&)            = delete;
  basic_kv_cache_manager& operator=(basic_kv_cache_manager const&) = delete;
  basic_kv_cache_manager(basic_kv_cache_manager&&)                 = delete;
  basic_kv_cache_manager& operator=(basic_kv_cache_manager&&)      = delete;
  ~basic_kv_cache_manager()                                        = default;

  // ===== shape ==================================================================================
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

  // ===== admission ==============================================================================
  /**
   * @brief Pages a new request of N prompt tokens and T max new tokens reserves
   * (`admission_footprint_pages`: M(r), or the elastic total plus staging). Pure.
   */
  [[nodiscard]] std::int64_t admission_pages(std::int64_t prompt_tokens,
                                             std::int64_t max_new_tokens) const {
    return admission_footprint_pages(
        plan_, prompt_tokens, max_new_tokens, options_.max_chunk_tokens);
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
    return admit_checked("try_admit", prompt_tokens, max_new_tokens).id;
  }

  /**
   * @brief `try_admit` that says why a request did not fit: no free slot, not enough unreserved
   * pages now (and how many are missing), no room in the page-id arena now, or a request that can
   * never fit (larger than the whole pool or arena). Checked in that order after never_fits; the
   * first that applies is reported. Same reservation, guarantees and errors as `try_admit`.
   * @throw invalid_argument as `try_admit` (names "admit"); nothing changes then.
   */
  [[nodiscard]] admit_result admit(std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
    return admit_checked("admit", prompt_tokens, max_new_tokens);
  }

  /**
   * @brief Calls `f(sequence_info const&)` for every live sequence, in slot order (its id,
   * phase, lengths and pages, as `info`). O(slots + live sequences x groups), allocation-free.
   * `f` must not call the manager's mutating members.
   */
  template <class F>
  void for_each_sequence(F&& f) const {
    for (std::int32_t s = 0; s < sequences_.size(); ++s) {
      if (sequences_[s].phase == sequence_phase::free) continue;
      f(detail::assemble_info(
          sequence_id{s, sequences_[s].generation}, s, sequences_, lengths_, page_table_));
    }
  }
  /// @brief Every live sequence's `info`, in slot order (allocates the vector).
  [[nodiscard]] std::vector<sequence_info> sequences() const {
    std::vector<sequence_info> out;
    out.reserve(static_cast<std::size_t>(sequences_.live()));
    for_each_sequence([&](sequence_info const& i) { out.push_back(i); });
    return out;
  }

  // ===== chunked prefill ========================================================================
  /**
   * @brief Before the eviction of a prompt chunk of `chunk_tokens` runs: draws from the
   * reservation the pages every group needs for its lengths after the chunk (compressed:
   * `retained_tokens(group rule, n + c)`; uncompressed: n + c; sliding: its ring up to
   * `min(n + c, W)` tokens; elastic compressed: the chunk staged after the group's longest head).
   * Head lengths do not change until `commit_chunk`.
   * @throw logic_error (nothing changed) for an unknown sequence, a sequence not in prefill, a
   *        chunk already prepared, or a chunk longer than the prompt tokens that remain.
   * @throw invalid_argument when chunk_tokens < 1 (elastic: or > max_chunk_tokens).
   */
  void prepare_chunk(sequence_id seq, std::int64_t chunk_tokens) {
    std::int32_t s = sequences_.find(seq, "prepare_chunk");
    auto& st       = sequences_[s];
    detail::check_chunk_size(groups_.elastic(), chunk_tokens, options_.max_chunk_tokens);
    sequences_.expect_phase(
        s, st.phase == sequence_phase::prefill, "prepare_chunk", ", not prefill");
    sequences_.expect_no_prepared_chunk(s);
    sequences_.expect_chunk_fits(s, chunk_tokens, "prepare_chunk");
    std::int64_t n = lengths_.tokens(s) + chunk_tokens, pooled_need = 0;
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      auto need = usage_.pages_after_chunk(s, g, n, chunk_tokens);
      if (groups_.pooled(g))
        pooled_need += std::max<std::int64_t>(0, need - page_table_.count(s, g));
      else
        page_table_.expect_can_grow(s, g, need, "prepare_chunk");
      chunk_need_[static_cast<std::size_t>(g)] = need;
    }
    page_table_.expect_pooled_room(s, pooled_need, "prepare_chunk");
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      page_table_.count_before_chunk(s, g) = page_table_.count(s, g);
      flow_.grow_to(s, g, chunk_need_[static_cast<std::size_t>(g)]);
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
    std::int32_t s = sequences_.find(seq, "expected_kept");
    TANGRAM_EXPECTS(chunk_tokens >= 0,
                    invalid_argument,
                    "expected_kept.chunk_tokens: must be >= 0, got ",
                    chunk_tokens);
    // Bounds n + c by the turn's admitted size (<= 2^31 - 1), so the counts fit in int32.
    sequences_.expect_chunk_fits(s, chunk_tokens, "expected_kept");
    std::int64_t n = lengths_.tokens(s) + chunk_tokens;
    for (std::int32_t h = 0; h < groups_.num_heads(); ++h)
      out[h] = static_cast<std::int32_t>(usage_.expected_kept(s, h, n, chunk_tokens));
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
    std::int32_t s       = sequences_.find(seq, "commit_chunk");
    auto& st             = sequences_[s];
    std::int32_t const H = groups_.num_kv_heads(), heads = groups_.num_heads();
    TANGRAM_EXPECTS(count == static_cast<std::size_t>(heads),
                    invalid_argument,
                    "commit_chunk.kept: expected ",
                    heads,
                    " counts (layers x KV heads), got ",
                    count);
    sequences_.expect_prepared_chunk(s);
    std::int64_t c = st.chunk_pending;
    std::int64_t n = lengths_.tokens(s) + c;
    for (std::int32_t h = 0; h < heads; ++h) {
      auto kind = plan_.rules[static_cast<std::size_t>(h)].kind;
      detail::check_kept(kind, kept[h], usage_.expected_kept(s, h, n, c), n, s, h / H, h % H);
    }
    detail::check_pooled_kept(groups_, kept, page_table_.pooled_limit(s), s);
    lengths_.commit_chunk(s, kept, static_cast<std::int32_t>(n), [&](std::int32_t h) {
      return plan_.rules[static_cast<std::size_t>(h)].kind == layer_kind::sliding_window;
    });
    st.prompt_remaining -= c;
    st.chunk_pending = 0;
    if (st.prompt_remaining == 0) st.phase = sequence_phase::decode;
    flow_.settle_after_chunk(s);
    if (st.phase == sequence_phase::decode)
      flow_.trim_pooled_budget(s, usage_.pooled_decode_need(s));
    journal_.note_slot(s);
  }

  /// @brief `commit_chunk` with a vector of `L * H` counts.
  void commit_chunk(sequence_id seq, std::vector<std::int32_t> const& kept) {
    commit_chunk(seq, kept.data(), kept.size());
  }

  // ===== batches and decode =====================================================================
  /**
   * @brief Sets the batch of kind `kind` (each kernel runs over its own: eviction and prefill
   * attention over `prefill`, append and decode attention over `decode`): request r is sequence
   * ids[r] for r < count. With `padded_size` > count the batch is a fixed-capacity one (a CUDA
   * graph captured at that batch size replays for any count up to it): requests
   * [count, padded_size) are padding requests, which name the view's `padding_slot` (zero
   * tokens, no pages: every kernel treats them as no-ops, `decode_step` skips them); 0 means no
   * padding. A sequence may be in both batches (e.g. it decodes while another's chunk is
   * evicted), but only once in each. Phases are not checked here: `decode_step` checks the
   * decode batch, `prepare_chunk` / `commit_chunk` the chunks. The other batch is unchanged.
   * O(padded_size), allocation-free.
   * @throw invalid_argument (batch unchanged) for an unknown `kind`, count > max_batch, null
   *        `ids` with count > 0, or padded_size neither 0 nor in [count, max_batch]; logic_error (batch unchanged) for
   *        an unknown sequence or one listed twice.
   */
  void set_batch(batch_kind kind,
                 sequence_id const* ids,
                 std::size_t count,
                 std::size_t padded_size = 0) {
    batch_of(kind, "set_batch").set(ids, count, sequences_, padded_size);
  }
  /// @brief `set_batch(kind, ids, count, padded_size)` from a vector.
  void set_batch(batch_kind kind, std::vector<sequence_id> const& ids, std::size_t padded_size = 0) {
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

  /// Requests in the batch of `kind`, padding included (the view's `batch_size`).
  /// @throw invalid_argument for an unknown kind.
  [[nodiscard]] std::int32_t batch_size(batch_kind kind) const {
    return batch_of(kind, "batch_size").size();
  }
  /// Requests in the decode batch, padding included.
  [[nodiscard]] std::int32_t batch_size() const noexcept {
    return batches_[static_cast<std::size_t>(batch_kind::decode)].size();
  }
  /// Padding requests of the batch of `kind`: its last `batch_padding(kind)` requests.
  /// @throw invalid_argument for an unknown kind.
  [[nodiscard]] std::int32_t batch_padding(batch_kind kind) const {
    auto const& b = batch_of(kind, "batch_padding");
    return b.size() - b.members();
  }
  /// The sequence of request r of the batch of `kind` (it may have been freed since
  /// `set_batch`).
  /// @throw invalid_argument for an unknown kind, or when r is not in [0, batch_size(kind)) or
  ///        names a padding request (which has no sequence).
  [[nodiscard]] sequence_id batch_sequence(batch_kind kind, std::int32_t r) const {
    auto const& b = batch_of(kind, "batch_sequence");
    TANGRAM_EXPECTS(r >= 0 && r < b.size(),
                    invalid_argument,
                    "batch_sequence.r: must be in [0, ",
                    b.size(),
                    ") for the ",
                    to_string(kind),
                    " batch, got ",
                    r);
    TANGRAM_EXPECTS(r < b.members(),
                    invalid_argument,
                    "batch_sequence.r: request ",
                    r,
                    " of the ",
                    to_string(kind),
                    " batch is a padding request (requests ",
                    b.members(),
                    " to ",
                    b.size() - 1,
                    " are padding) and has no sequence");
    return b.member(r);
  }
  /// The sequence of request r of the decode batch. @throw as `batch_sequence(kind, r)`.
  [[nodiscard]] sequence_id batch_sequence(std::int32_t r) const {
    return batch_sequence(batch_kind::decode, r);
  }
  /// @brief Checks that every (non-padding) member of the batch of `kind` is still the sequence
  /// `set_batch` listed. O(batch), allocation-free.
  /// @throw invalid_argument for an unknown kind; logic_error naming `operation`, the request,
  ///        slot and generation of the first member that was freed (or whose slot was reused).
  void check_batch_live(batch_kind kind, char const* operation) const {
    batch_of(kind, operation).check_live(operation, sequences_);
  }
  /// @brief `check_batch_live(batch_kind::decode, operation)`.
  void check_batch_live(char const* operation) const {
    check_batch_live(batch_kind::decode, operation);
  }

  /**
   * @brief Makes room for one decode token in every head of every sequence of the decode batch
   * (padding requests are skipped) and counts it (call before the append kernel that writes the
   * token's K/V and the attention kernel). Touches O(batch)
   * counters plus one page-table entry per group that crosses a page boundary; draws those pages
   * from the reservations, so it never fails for lack of memory. Allocation-free.
   * @throw logic_error (nothing changed) when a batch member was freed, is not in the decode
   *        phase, or already appended its T reserved tokens this turn.
   */
  void decode_step() {
    check_batch_live("decode_step");
    auto const& b = decode_batch();
    for (std::int32_t r = 0; r < b.members(); ++r) sequences_.expect_decode_room(b.slot(r));
    for (std::int32_t r = 0; r < b.members(); ++r) flow_.append_decode_token(b.slot(r));
  }

  /**
   * @brief `decode_step` with a token count per request of the decode batch (speculative
   * decoding: request r appends `tokens[r]` tokens, 0 allowed; a padding request's count must be
   * 0), all drawn from the reservations: never fails for lack of memory. Allocation-free.
   * @throw invalid_argument when count != batch_size() (padding included), a count is negative
   *        or a padding request's count is not 0; logic_error when
   *        a member was freed, is not in decode, or would pass its max_new_tokens (try_extend
   *        first). Nothing changes when it throws.
   */
  void decode_step(std::int32_t const* tokens, std::size_t count) {
    check_batch_live("decode_step");
    auto const& b = decode_batch();
    TANGRAM_EXPECTS(count == static_cast<std::size_t>(b.size()),
                    invalid_argument,
                    "decode_step.tokens: expected ",
                    b.size(),
                    " counts (one per request of the decode batch, padding included), got ",
                    count);
    for (std::int32_t r = 0; r < b.size(); ++r) {
      TANGRAM_EXPECTS(tokens[r] >= 0,
                      invalid_argument,
                      "decode_step.tokens[",
                      r,
                      "]: must be >= 0, got ",
                      tokens[r]);
      TANGRAM_EXPECTS(r < b.members() || tokens[r] == 0,
                      invalid_argument,
                      "decode_step.tokens[",
                      r,
                      "]: request ",
                      r,
                      " is a padding request and appends nothing, got ",
                      tokens[r]);
      if (r < b.members()) sequences_.expect_decode_room(b.slot(r), tokens[r]);
    }
    for (std::int32_t r = 0; r < b.members(); ++r) flow_.append_decode_tokens(b.slot(r), tokens[r]);
  }
  /// @brief `decode_step` with a vector of per-member counts.
  void decode_step(std::vector<std::int32_t> const& tokens) {
    decode_step(tokens.data(), tokens.size());
  }

  /**
   * @brief Appends `tokens` decode tokens to one sequence (in a batch or not), e.g. a draft of
   * speculative tokens before verification; pages come from its reservation. Allocation-free.
   * @throw invalid_argument when tokens < 1; logic_error for an unknown sequence, one not in
   *        decode, or one that would pass its max_new_tokens (try_extend first). Nothing changes
   *        when it throws.
   */
  void append_tokens(sequence_id seq, std::int64_t tokens) {
    std::int32_t s = sequences_.find(seq, "append_tokens");
    detail::check_token_count("append_tokens.tokens", tokens);
    sequences_.expect_decode_room(s, tokens, "append_tokens");
    flow_.append_decode_tokens(s, tokens);
  }

  /**
   * @brief Removes the last `tokens` decode tokens of `seq` (speculative tokens the verifier
   * rejected): `decoded`, `appended` and `seq_tokens` go back by `tokens`, and the pages those
   * tokens had started return to the sequence's own reservation, not to the pool, so appending
   * them again can never fail. The K/V the kernel wrote for them is simply overwritten later.
   * Allocation-free, O(groups + pages returned).
   * @throw invalid_argument when tokens < 1; logic_error for an unknown sequence, one not in
   *        decode, or tokens > `max_rollback(seq)` (names both). Nothing changes when it throws.
   */
  void rollback(sequence_id seq, std::int64_t tokens) {
    std::int32_t s = sequences_.find(seq, "rollback");
    detail::check_token_count("rollback.tokens", tokens);
    sequences_.expect_phase(
        s, sequences_[s].phase == sequence_phase::decode, "rollback", ", not decode");
    auto limit = usage_.max_rollback(s);
    TANGRAM_EXPECTS(tokens <= limit,
                    logic_error,
                    "rollback.tokens: ",
                    tokens,
                    " exceeds max_rollback = ",
                    limit,
                    " for the sequence in slot ",
                    s,
                    " (",
                    sequences_[s].decoded,
                    " decode tokens this turn",
                    limit < sequences_[s].decoded
                        ? "; a page of those positions is shared with a fork or an uncompleted "
                          "page copy, or a sliding-window ring already overwrote tokens its "
                          "window needs again)"
                        : ")");
    flow_.rollback_decode_tokens(s, tokens);
    stats_.rolled_back_tokens += tokens;
  }

  /**
   * @brief The most tokens `rollback(seq, k)` accepts now: the decode tokens of this turn (0
   * outside decode), less where a rolled-back position's page is shared (a fork's page, or one
   * a pending copy still reads: complete the copies first) or where a sliding-window ring that
   * wrapped lacks the older tokens its window needs again (at most ring_pages * P - W, less the
   * tokens already rolled back since the highest position written).
   * O(groups), O(pages) for a forked sequence.
   * @throw logic_error for an unknown sequence.
   */
  [[nodiscard]] std::int64_t max_rollback(sequence_id seq) const {
    return usage_.max_rollback(sequences_.find(seq, "max_rollback"));
  }

  /**
   * @brief Grows the decode reservation of a running turn by `more_tokens` (an engine that
   * reserved an expected length and now needs more): all or nothing. Per group the pages its
   * heads reach after max_new + more decode tokens, less what it holds or has reserved; under
   * elastic reservation the compressed groups' shared budget grows by what their decode now needs
   * beyond it. What was reserved before stays guaranteed either way.
   * @return true when reserved (max_new_tokens grew by `more_tokens`); false ("does not fit":
   *         the pool lacks the pages, or the page-id arena the room for longer lists), nothing
   *         changed then (the arena may have been repacked, which moves no logical state).
   * @throw invalid_argument when more_tokens < 1 or the turn would pass 2^31 - 1 tokens;
   *        logic_error for an unknown sequence or one not in decode. Nothing changes then.
   */
  [[nodiscard]] bool try_extend(sequence_id seq, std::int64_t more_tokens) {
    std::int32_t s = sequences_.find(seq, "try_extend");
    auto& st       = sequences_[s];
    sequences_.expect_phase(s,
                            st.phase == sequence_phase::decode,
                            "try_extend",
                            ", not decode (reserve prompt-phase tokens at admission)");
    std::int64_t max_new =
        detail::check_extension(lengths_.tokens(s) - st.decoded, st.max_new, more_tokens);
    usage_.size_extension(s, max_new, footprint_);
    std::int64_t pages = footprint_.reserve_total();
    bool relocate      = footprint_.grows_capacity();
    if (pages > pool_.available_pages() ||
        (relocate && !flow_.make_index_room(footprint_.capacity_total()))) {
      ++stats_.extend_rejected;
      return false;
    }
    // Checked: nothing below fails.
    if (relocate) {
      page_table_.relocate(s, footprint_);
      journal_.note_full_resync();
    }
    (void)pool_.try_extend(st.reservation, pages);
    page_table_.extend_turn(s, footprint_);
    st.max_new = max_new;
    ++stats_.extended;
    return true;
  }

  // ===== turns, forks, free =====================================================================
  /**
   * @brief Ends the current turn (prompt done): unused reserved pages return to the pool and the
   * compressed history stays (pages beyond what the longest head uses are released as surplus).
   * This is also how a turn that stops early (EOS before max_new_tokens) gives back what it did
   * not use: the whole remaining reservation (every group's budget and, elastic, the shared
   * budget) and any page no head uses return to the pool at once; `info().reserved_pages` is 0
   * afterwards and each group keeps exactly `group_pages_in_use` pages.
   * @throw logic_error (nothing changed) for an unknown sequence or one not in the decode phase.
   */
  void end_turn(sequence_id seq) {
    std::int32_t s = sequences_.find(seq, "end_turn");
    auto& st       = sequences_[s];
    sequences_.expect_phase(s,
                            st.phase == sequence_phase::decode,
                            "end_turn",
                            "; a turn ends after its prompt is prefilled");
    pool_.release_unused(st.reservation);
    flow_.release_spares(s);  // deferred reuse: they retire
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g)
      flow_.release_tail(s, g, usage_.in_use(s, g));
    page_table_.end_turn(s);
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
    std::int32_t s = sequences_.find(seq, "continue_turn");
    auto& st       = sequences_[s];
    sequences_.expect_phase(
        s, st.phase == sequence_phase::ended, "continue_turn", "; call end_turn first");
    std::int64_t n = lengths_.tokens(s);
    detail::check_turn_sizes("continue_turn", n, prompt_tokens, max_new_tokens);
    usage_.size_turn(detail::turn_kind::next_turn,
                     s,
                     n + prompt_tokens,
                     prompt_tokens,
                     max_new_tokens,
                     footprint_);
    std::int64_t pages = footprint_.reserve_total();
    bool relocate      = footprint_.grows_capacity();
    if (pages > pool_.available_pages() ||
        (relocate && !flow_.make_index_room(footprint_.capacity_total()))) {
      ++stats_.continue_rejected;
      return false;
    }
    copies_.reserve(footprint_.copies_total());  // the only allocation, before any change
    // Checked: nothing below fails.
    if (relocate) {
      page_table_.relocate(s, footprint_);
      journal_.note_full_resync();
    }
    (void)pool_.try_extend(st.reservation, pages);
    page_table_.start_turn(s, footprint_);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g)
      flow_.copy_shared_head(
          s, g, std::min<std::int64_t>(page_table_.count(s, g), footprint_.target(g)));
    st.phase            = sequence_phase::prefill;
    st.prompt_remaining = prompt_tokens;
    st.chunk_pending    = 0;
    st.max_new          = max_new_tokens;
    st.decoded          = 0;
    journal_.note_slot(s);
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
    std::int32_t s = sequences_.find(parent, "fork");
    sequences_.expect_phase(s,
                            sequences_[s].phase == sequence_phase::decode ||
                                sequences_[s].phase == sequence_phase::ended,
                            "fork",
                            "; fork after the prompt is prefilled");
    usage_.size_turn(detail::turn_kind::fork, s, 0, 0, 0, footprint_);
    std::int64_t pages = footprint_.reserve_total();
    if (sequences_.full() || pages > pool_.available_pages() ||
        !flow_.make_index_room(footprint_.capacity_total())) {
      ++stats_.fork_rejected;
      return std::nullopt;
    }
    copies_.reserve(footprint_.copies_total());  // the only allocation, before any change
    // Checked: nothing below fails.
    std::int32_t c = sequences_.take(sequences_[s].phase, std::move(*pool_.try_reserve(pages)));
    auto& ps       = sequences_[s];
    auto& cs       = sequences_[c];
    page_table_.open(c, footprint_);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g)
      flow_.share_into_fork(s, c, g, usage_.shareable(s, g), usage_.in_use(s, g));
    lengths_.copy(s, c);
    cs.max_new        = ps.max_new;
    cs.decoded        = ps.decoded;
    cs.written_tokens = ps.written_tokens;
    cs.may_share = ps.may_share = true;
    flow_.rebuild_buckets(c);
    journal_.note_slot(c);
    ++stats_.forks;
    return sequence_id{c, cs.generation};
  }

  /**
   * @brief Frees a sequence in any phase (also mid-chunk: an abort): its page references and its
   * unused reservation return to the pool and its slot becomes free (old handles go stale).
   * A batch (of either kind) that listed it must be set again before its next `view(kind)`
   * (and, for the decode batch, `decode_step`); until then those refuse with a logic_error. Pending page copies
   * keep their own references, so freeing never invalidates a copy the engine has not run.
   * @throw logic_error (nothing changed) for an unknown sequence.
   */
  void free(sequence_id seq) {
    release_sequence(sequences_.find(seq, "free"));
    ++stats_.freed;
  }

  // ===== deferred reuse (multi-stream engines) ==================================================
  /**
   * @brief With `manager_options::deferred_reuse`, every page whose last reference is dropped
   * (commit_chunk's recompression surplus, end_turn, free, complete_park, complete_page_copies,
   * the copy-on-write releases of continue_turn and fork) retires under the current epoch instead
   * of becoming free: no admission, reservation or draw hands it out until
   * `release_epochs_through` covers its epoch (docs/memory.md#deferred-reuse-several-streams).
   * Pages that go back to their own sequence's reservation (a rollback's, an elastic eviction's
   * unneeded staging) stay with it as spares, taken by its next draws; `end_turn` and `free`
   * retire what is left. Unused reservation returns at once: those pages were never written.
   *
   * Closes the open epoch (call once per step, after the step's kernels were enqueued and an
   * event recorded behind them; `stream_epochs` in device/stream_epochs.hpp does both) and
   * returns its id. O(1), allocation-free. Also accepted without deferred reuse (nothing retires).
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
   * @brief The work enqueued up to the close of `epoch` (every kernel or copy that may read a
   * page retired in an epoch <= `epoch`) completed: those pages become free, oldest epoch first.
   * Releasing an epoch already released does nothing (a poller may repeat itself).
   * O(pages released), allocation-free.
   * @return the pages that became free.
   * @throw invalid_argument naming the value when epoch < 0 or epoch >= current_epoch() (not
   *        closed by `advance_epoch` yet); nothing changes then.
   */
  std::int64_t release_epochs_through(std::int64_t epoch) {
    return pool_.release_epochs_through(epoch);
  }

  // ===== host offload of sessions (docs/memory.md#parking-sessions-in-host-memory) ============
  /**
   * @brief Starts parking a session, ended or in decode (an answer's growth that does not fit:
   * memory/answer_window.hpp): the self-contained `parked_session` (lengths, the pages its heads
   * use per group, plan fingerprint; `mid_turn` with the answer tokens decoded and reserved) and,
   * in `device_pages`, the pages to copy out (`device_pages[k]` -> host page k). Phase `parking`
   * keeps its pages, reservation and slot until `complete_park` / `cancel_park`; it accepts only
   * those, `free` and the queries. Pending page copies run before the copy-outs (same stream).
   * Allocates the returned value only. @throw logic_error (nothing changed) for an unknown
   * sequence or one neither ended nor in decode.
   */
  [[nodiscard]] parked_session park(sequence_id seq) {
    std::int32_t s = sequences_.find(seq, "park");
    auto& st       = sequences_[s];
    sequences_.expect_phase(s,
                            st.phase == sequence_phase::ended || st.phase == sequence_phase::decode,
                            "park",
                            "; only an ended session or a turn in decode can be parked");
    auto p             = usage_.describe(s, fingerprint_, pool_.page_bytes());
    st.parked_mid_turn = st.phase == sequence_phase::decode;
    st.phase           = sequence_phase::parking;
    stats_.pages_parked += p.host_pages();
    return p;
  }

  /// @brief The copy-outs of `park` are done (or stream-ordered before any later write): pages
  /// and reservation return to the pool (a fork keeps the pages it shares), the slot is free,
  /// the handle stale. @throw logic_error (nothing changed) for an unknown sequence or one not
  /// parking.
  void complete_park(sequence_id seq) {
    std::int32_t s = sequences_.find(seq, "complete_park");
    sequences_.expect_phase(s,
                            sequences_[s].phase == sequence_phase::parking,
                            "complete_park",
                            ", not parking (call park first)");
    stats_.parked_mid_turn += sequences_[s].parked_mid_turn;
    release_sequence(s);
    ++stats_.parked;
  }

  /// @brief Abandons a `park`: the sequence is back in its phase (ended, or decode with its turn),
  /// pages kept; do not restore the session. @throw logic_error (nothing changed) if not parking.
  void cancel_park(sequence_id seq) {
    std::int32_t s = sequences_.find(seq, "cancel_park");
    auto& st       = sequences_[s];
    sequences_.expect_phase(
        s, st.phase == sequence_phase::parking, "cancel_park", ", not parking (call park first)");
    st.phase           = st.parked_mid_turn ? sequence_phase::decode : sequence_phase::ended;
    st.parked_mid_turn = false;
  }

  /// @brief Pages `try_unpark(session, N, T)` reserves now: the history's pages plus what
  /// `continue_turn(N, T)` would reserve holding them exclusively. Pure; allocates scratch.
  /// @throw invalid_argument as `try_unpark` (names "unpark_pages").
  [[nodiscard]] std::int64_t unpark_pages(parked_session const& session,
                                          std::int64_t prompt_tokens,
                                          std::int64_t max_new_tokens) const {
    check_unpark("unpark_pages", session, prompt_tokens, max_new_tokens);
    detail::turn_footprint fp(groups_.num_groups());
    usage_.size_turn(detail::turn_kind::restore,
                     -1,
                     session.seq_tokens + prompt_tokens,
                     prompt_tokens,
                     max_new_tokens,
                     fp,
                     session.group_pages.data());
    return fp.reserve_total() + session.host_pages();
  }

  /**
   * @brief Restores a session parked after its turn ended with its next turn (N, T), all or
   * nothing: reserves `unpark_pages`, takes a slot, draws fresh pages for the history (host page k
   * -> `device_pages[k]`, copied in before any kernel reads the sequence) and leaves it exactly as
   * `continue_turn(N, T)` leaves the original (phase prefill; nothing shared). The session is not
   * consumed (each restore gets its own pages). Allocates the result only, before any change.
   * @return nullopt ("does not fit": slot, pages or page-id arena; nothing changed).
   * @throw invalid_argument (nothing changed) for another plan's or page size's session, one
   *        parked mid-turn (`try_resume`), impossible lengths or page counts (names the field),
   *        N < 1, T < 0 or seq_tokens + N + T past 2^31 - 1; std::bad_alloc.
   */
  [[nodiscard]] std::optional<restored_session> try_unpark(parked_session const& session,
                                                           std::int64_t prompt_tokens,
                                                           std::int64_t max_new_tokens) {
    check_unpark("try_unpark", session, prompt_tokens, max_new_tokens);
    usage_.size_turn(detail::turn_kind::restore,
                     -1,
                     session.seq_tokens + prompt_tokens,
                     prompt_tokens,
                     max_new_tokens,
                     footprint_,
                     session.group_pages.data());
    auto out = restore(session, sequence_phase::prefill, stats_.unpark_rejected);
    if (!out) return out;
    sequences_[out->id.slot].prompt_remaining = prompt_tokens;
    sequences_[out->id.slot].max_new          = max_new_tokens;
    ++stats_.unparked;
    return out;
  }

  /// @brief Pages `try_resume(session, T)` reserves now: the history's pages plus what the groups
  /// grow by until the answer reaches T tokens (`page_usage::size_resume`). Pure; allocates
  /// scratch. @throw invalid_argument as `try_resume` (names "resume_pages").
  [[nodiscard]] std::int64_t resume_pages(parked_session const& session,
                                          std::int64_t max_new_tokens) const {
    check_resume("resume_pages", session, max_new_tokens);
    detail::turn_footprint fp(groups_.num_groups());
    usage_.size_resume(session, max_new_tokens, fp);
    return fp.reserve_total() + session.host_pages();
  }

  /**
   * @brief Resumes a turn parked in decode (`session.mid_turn`) with `max_new_tokens` answer
   * tokens in all (>= its decoded ones: e.g. its next window), all or nothing, as `try_unpark`
   * restores: `resume_pages` reserved, fresh pages for the history; the sequence is in decode
   * with its lengths and decoded tokens. @return nullopt ("does not fit"; nothing changed).
   * @throw invalid_argument (nothing changed) as `try_unpark`, for a session that ended before it
   *        was parked, or for max_new_tokens below its decoded tokens or past 2^31 - 1 tokens.
   */
  [[nodiscard]] std::optional<restored_session> try_resume(parked_session const& session,
                                                           std::int64_t max_new_tokens) {
    check_resume("try_resume", session, max_new_tokens);
    usage_.size_resume(session, max_new_tokens, footprint_);
    auto out = restore(session, sequence_phase::decode, stats_.resume_rejected);
    if (!out) return out;
    sequences_[out->id.slot].max_new = max_new_tokens;
    sequences_[out->id.slot].decoded = session.decoded;
    ++stats_.resumed;
    return out;
  }

  // ===== copy-on-write ==========================================================================
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

  // ===== views ==================================================================================
  /**
   * @brief The view of the batch of `kind` over the manager's host arrays and the pool arena:
   * the kernels of that kind take it (eviction: `prefill`; append and decode attention:
   * `decode`). The views of both kinds share every array but `batch_size` / `batch_slots`, so
   * taking both costs nothing and a mixed step launches each kernel on its own view. O(batch):
   * checks that every (non-padding) member is still live. Valid until the next mutating call;
   * non-owning (host pointers into the manager). Allocation-free.
   * @throw invalid_argument for an unknown kind; logic_error naming the request, slot and
   *        generation when a member was freed (or its slot reused) since `set_batch`: the view
   *        would show freed or foreign pages.
   */
  [[nodiscard]] kv_cache_view view(batch_kind kind) const {
    check_batch_live(kind, "view");
    return detail::assemble_view(
        pool_.base(), plan_.geometry, groups_, page_table_, lengths_, batch_of(kind, "view"));
  }
  /// @brief `view(batch_kind::decode)`. @throw as `view(kind)`.
  [[nodiscard]] kv_cache_view view() const { return view(batch_kind::decode); }

  /// @brief Element counts of the arrays behind `view(kind)`, for sizing device mirrors once at
  /// load time: every count is a capacity fixed at construction (`batch` is max_batch, the
  /// capacity of each kind's `batch_slots`, not a current batch; `slots` counts the padding
  /// slot), so pointers to buffers of these sizes never need to move.
  [[nodiscard]] kv_view_extents view_extents() const noexcept {
    return detail::assemble_extents(sequences_.size(), groups_, page_table_, decode_batch());
  }

  /// @brief Changes to `pages`, `page_offset`, `head_base_len` and the `appended` / `seq_tokens`
  /// counters since the last `clear_view_changes()`: an engine keeps a device mirror of the view
  /// from it alone (upload the listed entries, or everything when `full_resync`). `batch_slots`
  /// is not journaled: upload it after each `set_batch`.
  [[nodiscard]] view_changes changes() const noexcept { return journal_.changes(); }
  /// @brief Forgets the journal (after the engine uploaded the changes). Allocation-free.
  void clear_view_changes() noexcept { journal_.clear(); }

  // ===== inspection =============================================================================
  /// @brief True when `seq` names a live sequence.
  [[nodiscard]] bool contains(sequence_id seq) const noexcept { return sequences_.contains(seq); }

  /// @throw logic_error for an unknown sequence.
  [[nodiscard]] sequence_info info(sequence_id seq) const {
    return detail::assemble_info(
        seq, sequences_.find(seq, "info"), sequences_, lengths_, page_table_);
  }

  /// Tokens held by head (layer, head) of `seq`. @throw logic_error for an unknown sequence.
  [[nodiscard]] std::int64_t head_len(sequence_id seq,
                                      std::int32_t layer,
                                      std::int32_t head) const {
    std::int32_t s = sequences_.find(seq, "head_len");
    groups_.check_head(layer, head, "head_len");
    return usage_.head_tokens(s, layer * groups_.num_kv_heads() + head);
  }

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
  /// Elastic reservation: the most pages the compressed groups of `seq` may hold together after
  /// each chunk's eviction this turn: the budget of the eviction's group-length selection
  /// (`commit_chunk` refuses more). 0 under static reservation. @throw logic_error for an unknown
  /// sequence.
  [[nodiscard]] std::int64_t elastic_page_limit(sequence_id seq) const {
    return page_table_.pooled_limit(sequences_.find(seq, "elastic_page_limit"));
  }
  /// Elastic reservation: the tokens the scorer keeps over the compressed heads of `seq` once its
  /// prepared chunk is in (its global top-k after `seq_tokens + chunk_pending` tokens): the
  /// `wanted` input of `evict_elastic` (kernels/elastic_eviction.hpp), beside
  /// `elastic_page_limit`. 0 under static reservation. O(1), allocation-free.
  /// @throw logic_error for an unknown sequence.
  [[nodiscard]] std::int64_t elastic_wanted_tokens(sequence_id seq) const {
    std::int32_t s = sequences_.find(seq, "elastic_wanted_tokens");
    return groups_.pooled_wanted(static_cast<std::int64_t>(lengths_.tokens(s)) +
                                 sequences_[s].chunk_pending);
  }
  /// Pages group g of `seq` uses now: enough for its longest head (a sliding ring: its filled
  /// pages).
  [[nodiscard]] std::int64_t group_pages_in_use(sequence_id seq, std::int32_t g) const {
    return usage_.in_use(checked_group(seq, g, "group_pages_in_use"), g);
  }

  /**
   * @brief Full self-check, O(pool + all page lists): the free-slot list, both batches (marks,
   * padding requests in the padding slot and only there), the padding slot's zero rows,
   * reference counts equal the number of page lists and pending copies holding each page,
   * reservations add up to the pool's reserved count, every list fits its capacity and holds what
   * its heads use, segments do not overlap. Allocates (scratch arrays).
   * @throw logic_error describing the first inconsistency.
   */
  void check_invariants() const {
    for (auto const& b : batches_) b.check_invariants();
    detail::check_padding_slot(sequences_.size(), groups_.num_groups(), page_table_, lengths_);
    detail::check_manager_invariants(
        pool_,
        sequences_,
        page_table_,
        copies_,
        [&](std::int32_t s, std::int32_t g) { return usage_.in_use(s, g); },
        [&](std::int32_t s, auto&& f) { flow_.for_each_spare(s, f); });
  }

 private:
  friend struct detail::kv_cache_manager_test_access;

  /// try_admit / admit (`op` names the call in errors): sizes, classifies, then admits.
  admit_result admit_checked(char const* op,
                             std::int64_t prompt_tokens,
                             std::int64_t max_new_tokens) {
    detail::check_turn_sizes(op, 0, prompt_tokens, max_new_tokens);
    usage_.size_turn(
        detail::turn_kind::admit, -1, prompt_tokens, prompt_tokens, max_new_tokens, footprint_);
    admit_result r;
    std::int64_t pages = footprint_.reserve_total();
    r.pages_needed     = pages;
    r.pages_retired    = pool_.retired_pages();
    r.reason           = detail::admission_failure(pages,
                                         footprint_.capacity_total(),
                                         pool_.capacity(),
                                         pool_.available_pages(),
                                         r.pages_retired,
                                         page_table_.arena_entries(),
                                         sequences_.full(),
                                         r.pages_missing);
    if (r.reason == admit_failure::none && !flow_.make_index_room(footprint_.capacity_total()))
      r.reason = admit_failure::page_table_arena_full;
    if (r.reason != admit_failure::none) {
      ++stats_.rejected;
      return r;
    }
    // Checked: nothing below fails.
    std::int32_t s = sequences_.take(sequence_phase::prefill, std::move(*pool_.try_reserve(pages)));
    auto& st       = sequences_[s];
    st.prompt_remaining = prompt_tokens;
    st.max_new          = max_new_tokens;
    page_table_.open(s, footprint_);
    lengths_.reset(s);
    buckets_.reset(s);
    journal_.note_slot(s);
    ++stats_.admitted;
    r.id = sequence_id{s, st.generation};
    return r;
  }

  /// free / complete_park: page references, list segment and unused reservation back, slot free.
  void release_sequence(std::int32_t s) {
    flow_.release_all(s);
    page_table_.close(s);
    pool_.release_unused(sequences_[s].reservation);
    lengths_.appended(s) = lengths_.tokens(s) = 0;
    journal_.note_counters(s);
    sequences_.release(s);
  }

  /// try_unpark / unpark_pages (`op`): the session is this plan's, ended, the turn sizes valid.
  void check_unpark(char const* op,
                    parked_session const& session,
                    std::int64_t prompt_tokens,
                    std::int64_t max_new_tokens) const {
    detail::check_parked_session(op, session, fingerprint_, pool_.page_bytes(), groups_);
    detail::check_ended_session(op, session);
    detail::check_turn_sizes(op, session.seq_tokens, prompt_tokens, max_new_tokens);
  }
  /// try_resume / resume_pages (`op`): the session belongs here and was parked in decode.
  void check_resume(char const* op, parked_session const& session, std::int64_t max_new) const {
    detail::check_parked_session(op, session, fingerprint_, pool_.page_bytes(), groups_);
    detail::check_resume(op, session, max_new);
  }

  /// try_unpark / try_resume once `footprint_` sizes the turn; a "does not fit" counts in
  /// `rejected`.
  std::optional<restored_session> restore(parked_session const& p,
                                          sequence_phase phase,
                                          std::int64_t& rejected) {
    restored_session out;
    auto s = flow_.try_restore(p, footprint_, phase, out.device_pages);
    if (!s) {
      ++rejected;
      return std::nullopt;
    }
    out.id = sequence_id{*s, sequences_[*s].generation};
    return out;
  }

  /// Index of `kind` in `batches_`. @throw invalid_argument naming `op` for a value outside
  /// batch_kind.
  static std::size_t kind_index(batch_kind kind, char const* op) {
    auto k = static_cast<std::size_t>(kind);
    TANGRAM_EXPECTS(k < batch_kind_count,
                    invalid_argument,
                    op,
                    ".kind: must be batch_kind::decode or batch_kind::prefill, got ",
                    k);
    return k;
  }
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
  std::int32_t checked_group(sequence_id seq, std::int32_t g, char const* op) const {
    std::int32_t s = sequences_.find(seq, op);
    groups_.check_group(g, op);
    return s;
  }

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

/// @brief The manager with dynamic page extents over any `memory_resource`.
using kv_cache_manager = basic_kv_cache_manager<>;

}  // namespace tangram
