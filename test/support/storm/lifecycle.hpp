// SPDX-License-Identifier: Apache-2.0
// The engine operations of an operation storm (see driver.hpp): admission, chunks, decode and
// speculative steps, growth, turn ends and next turns, forks, frees, aborts, full-pool bursts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "state.hpp"

namespace tangram::test {

/// The engine operations, each checked against the model and the footprint formulas.
class storm_lifecycle : public storm_state {
 public:
  using storm_state::storm_state;

 protected:
  // ----- operations ----------------------------------------------------------------------------

  bool admit_one(std::int64_t N, std::int64_t T) {
    auto& m    = *manager_;
    auto need  = m.admission_pages(N, T);
    bool slots = m.live_sequences() < m.max_sequences();
    bool fits  = slots && need <= m.pool().available_pages();
    bool arena = arena_may_refuse();
    std::optional<sequence_id> id;
    bool ok = fits_or_unchanged(!fits || arena, [&] {
      id = sim_->admit(N, T);
      return id.has_value();
    });
    // A request whose footprint fits the unreserved pages, with a free slot, is admitted.
    if (fits && !arena) REQUIRE(ok);
    if (!fits) REQUIRE(!ok);
    // The reason: the pool or the arena can never hold it, else the slot, the pages, the arena.
    auto const& r = sim_->last_admit();
    REQUIRE(r.pages_needed == need);
    if (!ok && r.reason != admit_failure::never_fits) {
      REQUIRE(need <= m.pool().capacity());
      if (!slots)
        REQUIRE(r.reason == admit_failure::no_free_slot);
      else if (!fits)
        REQUIRE((r.reason == admit_failure::not_enough_pages &&
                 r.pages_missing == need - m.pool().available_pages()));
      else
        REQUIRE(r.reason == admit_failure::page_table_arena_full);
    }
    if (!ok && r.reason == admit_failure::never_fits)
      REQUIRE(r.pages_missing == std::max<std::int64_t>(0, need - m.pool().capacity()));
    if (ok) REQUIRE(r.reason == admit_failure::none);
    note_refusal(fits, ok);
    if (ok)
      ++t_.admitted;
    else
      ++t_.admit_rejected;
    return ok;
  }

  void admit() { (void)admit_one(uniform(1, cfg_.max_prompt), uniform(0, cfg_.max_new)); }

  void do_chunk(sequence_id id) {
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    sim_->chunk(id, uniform(1, std::min(rem, cfg_.max_chunk)));
    ++t_.chunks;
    t_.calls += 2;
    note_elastic();
  }
  void note_elastic() {
    t_.elastic_evictions = sim_->elastic_evictions();
    t_.elastic_clipped   = sim_->elastic_clipped();
  }
  void chunk() {
    auto pre = phase(sequence_phase::prefill);
    if (pre.empty()) return admit();
    do_chunk(pick(pre));
  }

  void do_decode(std::vector<sequence_id> const& batch) {
    sim_->decode(batch);
    ++t_.decode_steps;
    t_.decode_tokens += static_cast<std::int64_t>(batch.size());
    t_.calls += 2;
  }
  void decode() {
    // A changing batch: a random subset of the requests that may still decode.
    std::vector<sequence_id> batch;
    for (auto id : phase(sequence_phase::decode)) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded < q.max_new && rng_() % 4 != 0) batch.push_back(id);
    }
    if (batch.empty()) return chunk();
    std::shuffle(batch.begin(), batch.end(), rng_);
    cap_batch(batch);
    do_decode(batch);
  }

  /// Speculative decoding: a batch whose members append random counts (0 allowed) in one step,
  /// or a draft for one sequence through append_tokens; then a member rolls back a random part
  /// of what it decoded (up to max_rollback), and sometimes tries one token more than allowed.
  void speculate() {
    std::vector<sequence_id> batch;
    std::vector<std::int32_t> counts;
    for (auto id : phase(sequence_phase::decode)) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded < q.max_new && rng_() % 3 != 0) {
        batch.push_back(id);
        counts.push_back(static_cast<std::int32_t>(
            uniform(0, std::min<std::int64_t>(4, q.max_new - q.decoded))));
      }
    }
    cap_batch(batch);
    counts.resize(batch.size());
    if (!batch.empty()) {
      if (batch.size() == 1 && counts[0] > 0 && rng_() % 2 == 0)
        sim_->append(batch[0], counts[0]);
      else
        sim_->decode(batch, counts);
      ++t_.speculative_steps;
      t_.calls += 2;
    }
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id    = pick(dec);
    auto limit = manager_->max_rollback(id);
    REQUIRE(limit <= sim_->sequences().at(id.slot).decoded);
    if (limit > 0) {
      auto k = uniform(1, limit);
      sim_->rollback(id, k);
      ++t_.rollbacks;
      t_.rolled_back += k;
      ++t_.calls;
    }
    if (rng_() % 8 == 0) {
      auto over = manager_->max_rollback(id) + 1;
      expect_misuse<logic_error>("exceeds max_rollback", [&] { manager_->rollback(id, over); });
    }
  }

  /// Grows a decoding turn by a random count: it fits exactly when the model's page count is
  /// available (the page-id arena may refuse while forks share pages); a refusal changes nothing.
  void extend() {
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id    = pick(dec);
    auto more  = uniform(1, std::max<std::int64_t>(1, cfg_.max_new));
    auto pages = sim_->extension_pages(sim_->sequences().at(id.slot), more).total();
    bool fits  = pages <= manager_->pool().available_pages();
    bool arena = arena_may_refuse();
    bool ok    = fits_or_unchanged(!fits || arena, [&] { return sim_->extend(id, more); });
    if (fits && !arena) REQUIRE(ok);
    if (!fits) REQUIRE(!ok);
    note_refusal(fits, ok);
    if (ok)
      ++t_.extended;
    else
      ++t_.extend_rejected;
  }

  void do_end_turn(sequence_id id) {
    auto const& q = sim_->sequences().at(id.slot);
    if (q.decoded == q.max_new) ++t_.completed_turns;
    sim_->end_turn(id);
    ++t_.calls;
  }
  void end_turn() {
    // Mostly requests that decoded their T tokens; sometimes an early stop.
    std::vector<sequence_id> done, all = phase(sequence_phase::decode);
    for (auto id : all) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded == q.max_new) done.push_back(id);
    }
    if (!done.empty() && rng_() % 4 != 0) return do_end_turn(pick(done));
    if (!all.empty()) return do_end_turn(pick(all));
    decode();
  }

  void continue_turn() {
    auto ended = phase(sequence_phase::ended);
    if (ended.empty()) return end_turn();
    auto id = pick(ended);
    auto N  = uniform(1, std::max<std::int64_t>(1, cfg_.max_prompt / 2));
    auto T  = uniform(0, cfg_.max_new);
    // Upper bound of what the turn reserves: the whole footprint after n + N tokens (elastic:
    // the compressed groups' whole target, held pages not deducted).
    bool fits = sim_->continue_reservation_bound(sim_->sequences().at(id.slot), N, T) <=
                manager_->pool().available_pages();
    bool arena = arena_may_refuse();
    bool ok    = fits_or_unchanged(!fits || arena, [&] { return sim_->continue_turn(id, N, T); });
    if (fits && !arena) REQUIRE(ok);
    note_refusal(fits, ok);
    if (ok)
      ++t_.continued;
    else
      ++t_.continue_rejected;
  }

  void fork() {
    auto cand  = phase(sequence_phase::decode);
    auto ended = phase(sequence_phase::ended);
    cand.insert(cand.end(), ended.begin(), ended.end());
    if (cand.empty()) return admit();
    (void)fork_of(pick(cand));
  }
  /// Forks `id` (decode, ended, or a pinned prefix): made when the upper bound of the child's
  /// reservation (the parent's targets, or its pages in use when ended) fits, a refusal changes
  /// nothing (add_sharer).
  std::optional<sequence_id> fork_of(sequence_id id) {
    std::int64_t ub = sim_->fork_reservation_bound(sim_->sequences().at(id.slot));
    auto child      = add_sharer(id, ub, [&] { return sim_->fork(id); });
    if (child)
      ++t_.forks;
    else
      ++t_.fork_rejected;
    return child;
  }

  /// Shared prefixes: pins an ended sequence (from then on only a prefix: `free` unregisters it),
  /// or admits a request over a pinned one (the reservation bound of a next turn over its tokens;
  /// a refusal changes nothing), or forks one (a plain fork: the child is no prefix), or checks
  /// that a prefix refuses what would write it (a next turn, a park) and that an unpinned sequence
  /// is no prefix.
  void prefix_op() {
    auto& m = *manager_;
    prefixes_.erase(
        std::remove_if(
            prefixes_.begin(), prefixes_.end(), [&](sequence_id id) { return !m.contains(id); }),
        prefixes_.end());
    auto ended = phase(sequence_phase::ended);
    if (prefixes_.empty() || rng_() % 5 == 0) {
      if (ended.empty()) return end_turn();
      auto id = pick(ended);
      if (rng_() % 4 == 0) {  // not pinned: no prefix
        expect_misuse<invalid_argument>("not pinned",
                                        [&] { (void)m.try_admit_with_prefix(id, 1, 0); });
        ++t_.prefix_misuses;
        return;
      }
      m.pin_prefix(id);
      prefixes_.push_back(id);
      ++t_.prefix_pins;
      ++t_.calls;
      return;
    }
    auto id = pick(prefixes_);
    if (rng_() % 6 == 0) {
      // A fork of a prefix is a plain fork (docs/memory.md: `fork` accepts a pinned prefix): an
      // ended, unpinned sequence sharing every page, which the other operations then continue,
      // park or free like any ended sequence; its writes copy what they rewrite.
      if (auto child = fork_of(id)) {
        REQUIRE(!m.info(*child).pinned);
        REQUIRE(m.info(*child).phase == sequence_phase::ended);
        ++t_.prefix_forks;
      }
      return;
    }
    if (rng_() % 8 == 0) {
      if (rng_() % 2)
        expect_misuse<logic_error>("pinned prefix", [&] { (void)m.continue_turn(id, 1, 1); });
      else
        expect_misuse<logic_error>("pinned prefix", [&] { (void)m.park(id); });
      ++t_.prefix_misuses;
      return;
    }
    auto N  = uniform(1, std::max<std::int64_t>(1, cfg_.max_prompt / 2));
    auto T  = uniform(0, cfg_.max_new);
    auto ub = sim_->continue_reservation_bound(sim_->sequences().at(id.slot), N, T);
    if (add_sharer(id, ub, [&] { return sim_->admit_with_prefix(id, N, T); }))
      ++t_.prefix_admits;
    else
      ++t_.prefix_rejected;
  }

  /// A new sequence sharing `parent`'s pages (`make`: a fork, a request over a prefix) whose
  /// reservation `bound` pages cover: it must be made when they and a slot are free (unless the
  /// page-id arena may refuse), and a refusal changes nothing. Both may share pages from then on.
  template <class Make>
  std::optional<sequence_id> add_sharer(sequence_id parent, std::int64_t bound, Make&& make) {
    auto& m        = *manager_;
    bool slot_free = m.live_sequences() < m.max_sequences();
    bool fits      = slot_free && bound <= m.pool().available_pages();
    bool arena     = arena_may_refuse();
    std::optional<sequence_id> child;
    bool ok = fits_or_unchanged(!fits || arena, [&] {
      child = make();
      return child.has_value();
    });
    if (fits && !arena) REQUIRE(ok);
    if (!slot_free) REQUIRE(!ok);
    note_refusal(fits, ok);
    if (child) {
      forked_.push_back(parent);
      forked_.push_back(*child);
    }
    return child;
  }

  /// A mixed step, as vLLM v1 / SGLang schedule it: prefill chunks of some requests beside a
  /// decode step of others, each batch padded to a random fixed capacity (CUDA-graph style) or
  /// not (engine_sim::mixed_step checks both views); after a padded decode batch, sometimes the
  /// padding misuse (padding_misuse).
  void mixed_step() {
    std::vector<sequence_id> dec, pre;
    std::vector<std::int64_t> chunks;
    for (auto id : phase(sequence_phase::decode)) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded < q.max_new && rng_() % 3 != 0) dec.push_back(id);
    }
    for (auto id : phase(sequence_phase::prefill))
      if (rng_() % 2 == 0) {
        pre.push_back(id);
        auto rem = sim_->sequences().at(id.slot).prompt_remaining;
        chunks.push_back(uniform(1, std::min(rem, cfg_.max_chunk)));
      }
    cap_batch(dec);
    cap_batch(pre);
    chunks.resize(pre.size());
    auto pad = [&](std::size_t n) -> std::size_t {
      auto cap = static_cast<std::size_t>(manager_->options().max_batch);
      return rng_() % 3 == 0 ? 0 : n + rng_() % (cap - n + 1);
    };
    std::size_t pp = pad(pre.size()), pd = pad(dec.size());
    t_.padded_requests += static_cast<std::int64_t>((pp == 0 ? 0 : pp - pre.size()) +
                                                    (pd == 0 ? 0 : pd - dec.size()));
    t_.mixed_steps += !pre.empty() && !dec.empty();
    sim_->mixed_step(pre, chunks, dec, pp, pd);
    t_.calls += 3 + static_cast<std::int64_t>(pre.size());
    t_.chunks += static_cast<std::int64_t>(pre.size());
    ++t_.decode_steps;
    t_.decode_tokens += static_cast<std::int64_t>(dec.size());
    note_elastic();
    if (pd > dec.size() && rng_() % 2 == 0) padding_misuse(dec);
  }
  /// Misuse of the padding of a decode batch of `members` requests padded beyond them (after a
  /// mixed step): a padding request's sequence, a decode count for a padding request, a padded
  /// size above max_batch; each throws invalid_argument naming it, with nothing changed.
  void padding_misuse(std::vector<sequence_id> const& members) {
    auto& m      = *manager_;
    misuse_kind_ = storm_totals::misuse_kinds;
    auto r       = static_cast<std::int32_t>(members.size());
    expect_misuse<invalid_argument>("padding request",
                                    [&] { (void)m.batch_sequence(batch_kind::decode, r); });
    std::vector<std::int32_t> counts(static_cast<std::size_t>(m.batch_size(batch_kind::decode)));
    counts.back() = 1;
    expect_misuse<invalid_argument>("padding request", [&] { m.decode_step(counts); });
    auto too_big = static_cast<std::size_t>(m.options().max_batch) + 1;
    expect_misuse<invalid_argument>("set_batch.padded_size",
                                    [&] { m.set_batch(batch_kind::prefill, members, too_big); });
  }

  /// A random batch of a random kind, padded to a random capacity half of the time.
  void random_batch() {
    auto kind = rng_() % 2 ? batch_kind::decode : batch_kind::prefill;
    auto cap  = manager_->options().max_batch;
    auto ids  = sim_->ids();
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(uniform(0, cap))));
    auto padded =
        rng_() % 2 ? 0
                   : static_cast<std::size_t>(uniform(static_cast<std::int64_t>(ids.size()), cap));
    manager_->set_batch(kind, ids, padded);
    ++t_.batch_changes;
    ++t_.calls;
  }

  void free_one() {
    auto ids = sim_->ids();
    if (ids.empty()) return admit();
    auto id = pick(ids);
    sim_->free(id);
    graveyard(id);
    ++t_.frees;
    ++t_.calls;
  }

  void abort_mid_chunk() {
    auto pre = phase(sequence_phase::prefill);
    if (pre.empty()) return admit();
    auto id  = pick(pre);
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    sim_->abort_mid_chunk(id, uniform(1, std::min(rem, cfg_.max_chunk)));
    graveyard(id);
    ++t_.aborts;
    t_.calls += 2;
  }

  /// Admits requests (small and large) until the pool refused several in a row; every refusal
  /// must leave the state unchanged. The pool then stays full for the following steps.
  void full_pool_burst() {
    int refusals = 0;
    for (int k = 0; k < 256 && refusals < 6; ++k) {
      bool small = rng_() % 2 == 0;
      auto N     = small ? uniform(1, 4) : uniform(1, cfg_.max_prompt);
      auto T     = small ? uniform(0, 2) : uniform(0, cfg_.max_new);
      if (admit_one(N, T))
        refusals = 0;
      else
        ++refusals;
    }
    ++t_.full_pool_bursts;
  }

  /// One misuse; it must throw `Exception` whose message holds `piece`, with nothing changed.
};

}  // namespace tangram::test
