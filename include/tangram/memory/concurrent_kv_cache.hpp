// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/concurrent_kv_cache.hpp
 * @brief A mutex-guarded KV-cache manager for engines with a scheduler thread and request
 * threads: admission, next turns, forks and frees from any thread; the per-step calls and the
 * view from the scheduler, under one lock held for the host part of the step.
 *
 * `kv_cache_manager` is a single-threaded object (docs/memory.md). Engines that handle requests
 * on several threads wrap it here instead of adding their own locking:
 *
 * ```cpp
 * tangram::concurrent_kv_cache kv(plan, gpu, options);
 *
 * // Request threads (API server, session manager): any thread, any time.
 * auto seq = kv.try_admit(prompt_tokens, max_new_tokens);   // or nullopt: keep it queued
 * kv.free(*seq);                                             // finished or cancelled
 *
 * // Scheduler thread, once per step.
 * {
 *   auto step = kv.begin_step();                     // exclusive until `step` goes out of scope
 *   for (auto c : step->pending_copies()) { ... }    // enqueue copies (forks, next turns)
 *   step->complete_page_copies();
 *   step.set_live_batch(decode_ids);                 // drops ids other threads freed or ended
 *   step->decode_step();
 *   auto v = step->view();                           // consistent with every call before it
 *   // mirror the arrays (step->changes()) to the device / run the CPU reference here
 *   step->clear_view_changes();
 * }   // request threads run again; `v` must not be used past this point
 * ```
 *
 * What may be shared, and how (see docs/reliability.md):
 * - parking: `park` / `complete_park` / `try_unpark` from any thread; the page copies they
 *   describe run on the scheduler's stream like the fork copies (out before `complete_park`, in
 *   before the restored sequence's first chunk).
 * - `concurrent_kv_cache`: every public member may be called from any thread at any time; calls
 *   are serialised by one mutex (they are O(groups) or less, except the O(pool) checks).
 * - a `step` (from `begin_step`) belongs to the thread that took it; while it lives no other call
 *   runs, so a view taken through it is a consistent snapshot that stays valid until the step
 *   ends. Copy (or mirror via `changes()`) what kernels read before ending the step.
 * - sequences may disappear between steps (another thread called `free`): the scheduler re-checks
 *   `contains(id)` under the step lock before `prepare_chunk`/`commit_chunk` of a sequence, and
 *   builds batches with `set_live_batch`.
 * - page contents: the wrapper, like the manager, never touches pages. Every page write (prefill,
 *   decode, copy-on-write copies) is a kernel the scheduler enqueues on its stream, so pages that
 *   another thread frees while a kernel still reads them are only rewritten by work enqueued
 *   later on the same stream.
 *
 * The lock is a plain `std::mutex`: not recursive. Calling the wrapper's own members from inside
 * a step (or from a `with_lock` callback) on the same thread deadlocks; use the step's manager.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/memory/kv_cache_manager.hpp"

namespace tangram {

/**
 * @brief A `basic_kv_cache_manager` behind a mutex.
 *
 * @tparam Manager the wrapped manager type (`kv_cache_manager` by default).
 *
 * Ownership: owns the manager (built in place from the constructor arguments); the upstream
 * resource must outlive it, as for the manager. Not copyable or movable.
 *
 * Thread safety: every member may be called concurrently from any thread. A `step` gives one
 * thread exclusive access to the manager until it is destroyed.
 */
template <class Manager = kv_cache_manager>
class concurrent_kv_cache {
 public:
  using manager_type = Manager;

  /**
   * @brief Builds the manager in place: `Manager(args...)`, e.g. `(plan, resource, options)`.
   * @throw whatever the manager's constructor throws (invalid_argument, out_of_memory).
   */
  template <class... Args>
  explicit concurrent_kv_cache(Args&&... args) : m_(std::forward<Args>(args)...) {}

  concurrent_kv_cache(concurrent_kv_cache const&)            = delete;
  concurrent_kv_cache& operator=(concurrent_kv_cache const&) = delete;
  concurrent_kv_cache(concurrent_kv_cache&&)                 = delete;
  concurrent_kv_cache& operator=(concurrent_kv_cache&&)      = delete;
  ~concurrent_kv_cache()                                     = default;

  /**
   * @brief Exclusive access to the manager for the host part of one engine step.
   *
   * Holds the wrapper's lock from construction to destruction; `->` and `*` reach the manager.
   * Movable, not copyable; belongs to the thread that created it (std::unique_lock rules).
   */
  class step {
   public:
    step(step&&) noexcept            = default;
    step& operator=(step&&) noexcept = default;
    step(step const&)                = delete;
    step& operator=(step const&)     = delete;
    ~step()                          = default;

    [[nodiscard]] Manager& operator*() const noexcept { return *m_; }
    [[nodiscard]] Manager* operator->() const noexcept { return m_; }

    /**
     * @brief Removes from `ids` every sequence that cannot decode now (freed or replaced by
     * another thread, not in the decode phase, or done with its max_new_tokens), keeping the
     * order of the others, and makes the rest the manager's batch.
     * @return the batch size.
     * @throw invalid_argument when more than max_batch remain; logic_error when one is listed
     *        twice (the batch is then unchanged, `ids` already filtered).
     */
    std::size_t set_live_batch(std::vector<sequence_id>& ids) const {
      std::size_t out = 0;
      for (auto id : ids) {
        if (!m_->contains(id)) continue;
        auto i = m_->info(id);
        if (i.phase != sequence_phase::decode || i.decoded >= i.max_new) continue;
        ids[out++] = id;
      }
      ids.resize(out);
      m_->set_batch(ids);
      return out;
    }

   private:
    friend class concurrent_kv_cache;
    step(std::mutex& mu, Manager& m) : lock_(mu), m_(&m) {}
    std::unique_lock<std::mutex> lock_;
    Manager* m_;
  };

  /// @brief Blocks until no other call runs, then gives this thread the manager until the
  /// returned step is destroyed.
  [[nodiscard]] step begin_step() { return step(mu_, m_); }

  /// @brief Runs `f(manager)` under the lock and returns its result (any single composite
  /// operation, e.g. admit-then-fork, that must not interleave with other threads).
  template <class F>
  decltype(auto) with_lock(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::forward<F>(f)(m_);
  }

  // ----- calls for any thread ------------------------------------------------------------------

  /// @brief `Manager::try_admit` under the lock. @throw invalid_argument as the manager.
  [[nodiscard]] std::optional<sequence_id> try_admit(std::int64_t prompt_tokens,
                                                     std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.try_admit(prompt_tokens, max_new_tokens);
  }

  /// @brief `Manager::admit` under the lock: the new sequence or why it did not fit.
  /// @throw invalid_argument as the manager.
  [[nodiscard]] admit_result admit(std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.admit(prompt_tokens, max_new_tokens);
  }

  /// @brief `Manager::try_extend` under the lock (grows a decoding turn's reservation, all or
  /// nothing). @throw as the manager (nothing changed).
  [[nodiscard]] bool try_extend(sequence_id seq, std::int64_t more_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.try_extend(seq, more_tokens);
  }

  /// @brief `Manager::sequences` under the lock: a copy of every live sequence's info.
  [[nodiscard]] std::vector<sequence_info> sequences() const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.sequences();
  }

  /// @brief `Manager::continue_turn` under the lock. @throw as the manager (nothing changed).
  [[nodiscard]] bool continue_turn(sequence_id seq,
                                   std::int64_t prompt_tokens,
                                   std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.continue_turn(seq, prompt_tokens, max_new_tokens);
  }

  /// @brief `Manager::end_turn` under the lock. @throw logic_error as the manager.
  void end_turn(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.end_turn(seq);
  }

  /// @brief `Manager::fork` under the lock; the scheduler runs the recorded page copies in its
  /// next step (before any kernel reads the child). @throw as the manager (nothing changed).
  [[nodiscard]] std::optional<sequence_id> fork(sequence_id parent) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.fork(parent);
  }

  /// @brief `Manager::pin_prefix` under the lock. @throw logic_error as the manager.
  void pin_prefix(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.pin_prefix(seq);
  }

  /// @brief `Manager::try_admit_with_prefix` under the lock; the scheduler runs the recorded page
  /// copies in its next step, as a fork's. @throw as the manager (nothing changed).
  [[nodiscard]] std::optional<sequence_id> try_admit_with_prefix(sequence_id prefix,
                                                                 std::int64_t prompt_tokens,
                                                                 std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.try_admit_with_prefix(prefix, prompt_tokens, max_new_tokens);
  }

  /// @brief `Manager::free` under the lock (any phase; a batch that listed the sequence must be
  /// set again: `step::set_live_batch`). @throw logic_error for an unknown sequence.
  void free(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.free(seq);
  }

  /// @brief `Manager::park` under the lock: the session and the pages to copy out. The copy-outs
  /// run on the scheduler's stream (after the pending page copies); then `complete_park`.
  /// @throw as the manager (nothing changed).
  [[nodiscard]] parked_session park(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.park(seq);
  }

  /// @brief `Manager::complete_park` under the lock (the copy-outs are done): pages and slot free.
  /// @throw logic_error as the manager.
  void complete_park(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.complete_park(seq);
  }

  /// @brief `Manager::cancel_park` under the lock: the sequence is back in its phase, pages kept.
  /// @throw logic_error as the manager.
  void cancel_park(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.cancel_park(seq);
  }

  /// @brief `Manager::try_unpark` under the lock; the scheduler copies the host pages into
  /// `device_pages` in its next step, before any kernel reads the sequence.
  /// @throw as the manager (nothing changed).
  [[nodiscard]] std::optional<restored_session> try_unpark(parked_session const& session,
                                                           std::int64_t prompt_tokens,
                                                           std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.try_unpark(session, prompt_tokens, max_new_tokens);
  }

  /// @brief `Manager::try_resume` under the lock (a turn parked in decode); the scheduler copies
  /// the host pages into `device_pages` in its next step, before any kernel reads the sequence.
  /// @throw as the manager (nothing changed).
  [[nodiscard]] std::optional<restored_session> try_resume(parked_session const& session,
                                                           std::int64_t max_new_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.try_resume(session, max_new_tokens);
  }

  /// @brief Frees `seq` when it is still live; false when another thread already freed it.
  bool free_if_live(sequence_id seq) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!m_.contains(seq)) return false;
    m_.free(seq);
    return true;
  }

  // ----- queries for any thread (copies, consistent at the time of the call) ------------------

  /// @brief True when `seq` names a live sequence now.
  [[nodiscard]] bool contains(sequence_id seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.contains(seq);
  }
  /// @brief The sequence's state now, or nullopt when it is not live.
  [[nodiscard]] std::optional<sequence_info> info(sequence_id seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!m_.contains(seq)) return std::nullopt;
    return m_.info(seq);
  }
  /// @brief A copy of the manager's counters.
  [[nodiscard]] manager_stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.stats();
  }
  /// @brief A copy of the pool's counters.
  [[nodiscard]] pool_stats pool_statistics() const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.pool().stats();
  }
  /// @brief Sequences alive now.
  [[nodiscard]] std::int32_t live_sequences() const {
    std::lock_guard<std::mutex> lock(mu_);
    return m_.live_sequences();
  }
  /// @brief Pages a request would reserve (pure: no lock needed, the plan never changes).
  [[nodiscard]] std::int64_t admission_pages(std::int64_t prompt_tokens,
                                             std::int64_t max_new_tokens) const {
    return m_.admission_pages(prompt_tokens, max_new_tokens);
  }
  /// @brief The plan (immutable for the wrapper's life: safe to read from any thread).
  [[nodiscard]] static_plan const& plan() const noexcept { return m_.plan(); }

  /// @brief `Manager::check_invariants` under the lock. @throw logic_error on inconsistency.
  void check_invariants() const {
    std::lock_guard<std::mutex> lock(mu_);
    m_.check_invariants();
  }

 private:
  mutable std::mutex mu_;
  Manager m_;
};

}  // namespace tangram
