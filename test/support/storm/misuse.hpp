// SPDX-License-Identifier: Apache-2.0
// Misuse in an operation storm (see driver.hpp): every kind of wrong call throws the documented
// exception naming the value, and changes nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "parking.hpp"

namespace tangram::test {

/// The misuse cases (storm_totals::misuse_kinds of them).
class storm_misuse : public storm_parking {
 public:
  using storm_parking::storm_parking;

 protected:
  void misuse() {
    auto& m      = *manager_;
    auto pre     = phase(sequence_phase::prefill);
    auto dec     = phase(sequence_phase::decode);
    auto end     = phase(sequence_phase::ended);
    auto live    = sim_->ids();
    misuse_kind_ = static_cast<std::size_t>(rng_() % storm_totals::misuse_kinds);
    switch (misuse_kind_) {
      case 0:  // stale handle (a freed sequence): every entry point refuses it
        if (!graveyard_.empty()) {
          auto id = graveyard_[rng_() % graveyard_.size()];
          if (m.contains(id)) break;
          switch (rng_() % 6) {
            case 0:
              expect_misuse<logic_error>("unknown sequence", [&] { m.free(id); });
              break;
            case 1:
              expect_misuse<logic_error>("unknown sequence", [&] { m.prepare_chunk(id, 1); });
              break;
            case 2:
              expect_misuse<logic_error>("unknown sequence", [&] { m.end_turn(id); });
              break;
            case 3:
              expect_misuse<logic_error>("unknown sequence",
                                         [&] { (void)m.continue_turn(id, 1, 1); });
              break;
            case 4:
              expect_misuse<logic_error>("unknown sequence", [&] { (void)m.fork(id); });
              break;
            default:
              expect_misuse<logic_error>("unknown sequence", [&] { m.set_batch({id}); });
              break;
          }
        }
        break;
      case 1: {  // unknown slot
        std::int32_t slot = rng_() % 2 ? -1 - static_cast<std::int32_t>(rng_() % 5)
                                       : m.max_sequences() + static_cast<std::int32_t>(rng_() % 5);
        expect_misuse<logic_error>("out of range", [&] { m.free(sequence_id{slot, 1}); });
        break;
      }
      case 2:  // commit without prepare
        if (!pre.empty()) {
          auto id = pick(pre);
          expect_misuse<logic_error>("no prepared chunk", [&] {
            m.commit_chunk(id, std::vector<std::int32_t>(static_cast<std::size_t>(LH_), 0));
          });
        }
        break;
      case 3:  // kept above the rule (or off the exact count), a second prepare, a wrong count;
               // then the engine aborts the request
        if (!pre.empty()) {
          auto id  = pick(pre);
          auto rem = sim_->sequences().at(id.slot).prompt_remaining;
          auto c   = uniform(1, std::min(rem, cfg_.max_chunk));
          m.prepare_chunk(id, c);
          ++t_.calls;
          std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
          m.expected_kept(id, c, kept.data());
          auto h   = static_cast<std::size_t>(rng_() % kept.size());
          auto hk  = cfg_.plan.rules[h].kind;
          auto bad = kept;
          bad[h] += (hk == layer_kind::compressed || rng_() % 2) ? 1 : -1;
          if (bad[h] < 0) bad[h] = kept[h] + 1;
          // A head over a pinned prefix keeps at least its pinned tokens: below them is misuse too.
          auto pin = m.group_pinned_tokens(id, cfg_.plan.grouping.slots[h].group);
          if (hk == layer_kind::compressed && pin > 0 && rng_() % 2) bad[h] = pin - 1;
          auto range = pin > 0 ? "between " + std::to_string(pin) + " (pinned) and "
                               : std::string("between 0 and ");
          if (hk != layer_kind::compressed) range = "exactly ";
          expect_misuse<logic_error>(range.c_str(), [&] { m.commit_chunk(id, bad); });
          expect_misuse<logic_error>("already has a prepared chunk",
                                     [&] { m.prepare_chunk(id, 1); });
          expect_misuse<invalid_argument>("counts (layers x KV heads)", [&] {
            m.commit_chunk(id, std::vector<std::int32_t>(kept.size() + 1, 0));
          });
          sim_->free(id);  // abort mid-chunk after the engine's failed commit
          graveyard(id);
          ++t_.aborts;
          ++t_.calls;
        }
        break;
      case 4:  // decode past T
        for (auto id : dec) {
          auto const& q = sim_->sequences().at(id.slot);
          if (q.decoded != q.max_new) continue;
          m.set_batch({id});
          expect_misuse<logic_error>("past the reservation", [&] { m.decode_step(); });
          break;
        }
        break;
      case 5:  // a batch listing a sequence twice
        if (!live.empty()) {
          auto id    = pick(live);
          auto batch = live;
          batch.push_back(id);
          std::shuffle(batch.begin(), batch.end(), rng_);
          if (batch.size() <= static_cast<std::size_t>(m.options().max_batch))
            expect_misuse<logic_error>("listed twice", [&] { m.set_batch(batch); });
        }
        break;
      case 6:  // a chunk longer than the prompt left
        if (!pre.empty()) {
          auto id  = pick(pre);
          auto rem = sim_->sequences().at(id.slot).prompt_remaining;
          if (sim_->elastic() && rem + 1 > m.options().max_chunk_tokens)  // the size check first
            expect_misuse<invalid_argument>("max_chunk_tokens",
                                            [&] { m.prepare_chunk(id, rem + 1); });
          else
            expect_misuse<logic_error>("prompt tokens left", [&] { m.prepare_chunk(id, rem + 1); });
        }
        break;
      case 7:  // turn calls in the wrong phase
        if (!pre.empty()) {
          auto id = pick(pre);
          switch (rng_() % 3) {
            case 0:
              expect_misuse<logic_error>("phase prefill", [&] { m.end_turn(id); });
              break;
            case 1:
              expect_misuse<logic_error>("end_turn first",
                                         [&] { (void)m.continue_turn(id, 1, 1); });
              break;
            default:
              expect_misuse<logic_error>("fork after the prompt", [&] { (void)m.fork(id); });
              break;
          }
        }
        break;
      case 8:  // decode with a member still in prefill
        if (!pre.empty()) {
          std::vector<sequence_id> batch;
          for (auto id : dec) {
            auto const& q = sim_->sequences().at(id.slot);
            if (q.decoded < q.max_new) batch.push_back(id);
          }
          if (batch.size() >= static_cast<std::size_t>(m.options().max_batch))
            batch.resize(static_cast<std::size_t>(m.options().max_batch) - 1);
          batch.push_back(pick(pre));
          m.set_batch(batch);
          expect_misuse<logic_error>("not decode", [&] { m.decode_step(); });
        }
        break;
      case 9:  // double free
        if (!live.empty()) {
          auto id = pick(live);
          sim_->free(id);
          ++t_.frees;
          ++t_.calls;
          graveyard(id);
          expect_misuse<logic_error>("unknown sequence", [&] { m.free(id); });
        }
        break;
      case 10:  // a batch member freed after set_batch
        if (!dec.empty()) {
          auto id = pick(dec);
          std::vector<sequence_id> batch{id};
          for (auto d : dec)
            if (d != id && rng_() % 2) batch.push_back(d);
          cap_batch(batch);
          m.set_batch(batch);
          sim_->free(id);
          ++t_.frees;
          ++t_.calls;
          graveyard(id);
          // Every entry point that reads the batch refuses it (freed pages, or another
          // sequence's once the slot is reused).
          switch (rng_() % 3) {
            case 0:
              expect_misuse<logic_error>("no longer a live sequence", [&] { m.decode_step(); });
              break;
            case 1:
              expect_misuse<logic_error>("no longer a live sequence", [&] { (void)m.view(); });
              break;
            default:
              expect_misuse<logic_error>("no longer a live sequence",
                                         [&] { export_flashinfer_layer(m, 0, fi_); });
              break;
          }
        }
        break;
      case 11:  // prepare in the wrong phase
        if (!end.empty())
          expect_misuse<logic_error>("phase ended", [&] { m.prepare_chunk(pick(end), 1); });
        else if (!dec.empty())
          expect_misuse<logic_error>("phase decode", [&] { m.prepare_chunk(pick(dec), 1); });
        break;
      case 12:  // bad and hostile sizes (zero, negative, near INT64_MAX): nothing changes
        bad_sizes(pre, end);
        break;
      case 14:  // elastic: a chunk above max_chunk_tokens; kept counts past the limit
        if (sim_->elastic() && !pre.empty()) elastic_misuse(pick(pre));
        break;
      case 15:  // parking: the wrong phase, a session of another plan or corrupted
        parking_misuse(pre, end);
        break;
      default:  // a stale generation on a live slot
        if (!live.empty()) {
          auto id = pick(live);
          sequence_id stale{id.slot, id.generation + 1 + static_cast<std::uint32_t>(rng_() % 3)};
          expect_misuse<logic_error>("generation", [&] { m.end_turn(stale); });
        }
        break;
    }
  }

  /// Parking misuse: park in prefill, complete or cancel a park that was never started, turn
  /// calls on a parking sequence (logic_error naming the phase), and a session whose
  /// fingerprint, page size or counts are wrong (invalid_argument naming the field).
  void parking_misuse(std::vector<sequence_id> const& pre, std::vector<sequence_id> const& end) {
    auto& m = *manager_;
    switch (rng_() % 4) {
      case 0:
        if (!pre.empty())
          expect_misuse<logic_error>("only an ended session or a turn in decode can be parked",
                                     [&, id = pick(pre)] { (void)m.park(id); });
        break;
      case 1:
        if (!end.empty()) {
          auto id = pick(end);
          if (rng_() % 2)
            expect_misuse<logic_error>("not parking", [&] { m.complete_park(id); });
          else
            expect_misuse<logic_error>("not parking", [&] { m.cancel_park(id); });
        }
        break;
      case 2: {
        std::vector<sequence_id> parking;
        for (auto const& e : parking_)
          if (m.contains(e.id)) parking.push_back(e.id);
        if (parking.empty()) break;
        auto id = pick(parking);
        if (rng_() % 2)
          expect_misuse<logic_error>("phase parking", [&] { (void)m.continue_turn(id, 1, 1); });
        else
          expect_misuse<logic_error>("phase parking", [&] { (void)m.fork(id); });
        break;
      }
      default:
        if (!parked_.empty()) {
          auto c = parked_[rng_() % parked_.size()].session;
          switch (rng_() % 3) {
            case 0:
              c.plan_fingerprint ^= 1;
              expect_misuse<invalid_argument>("session.plan_fingerprint",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
            case 1:
              c.page_bytes *= 2;
              expect_misuse<invalid_argument>("session.page_bytes",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
            default:
              c.group_pages[rng_() % c.group_pages.size()] += 1;
              expect_misuse<invalid_argument>("session.group_pages[",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
          }
        }
        break;
    }
  }

  /// Elastic misuse on a prefilling request: a chunk above max_chunk_tokens (invalid_argument);
  /// then a prepared chunk whose commit keeps every candidate of every head when that makes the
  /// compressed groups exceed elastic_page_limit (logic_error "would hold"; when every candidate
  /// fits the limit there is no such commit to try); nothing changes, and the engine then commits
  /// a valid eviction of the same prepared chunk.
  void elastic_misuse(sequence_id id) {
    auto& m  = *manager_;
    auto mc  = m.options().max_chunk_tokens;
    auto big = mc + 1 + static_cast<std::int64_t>(rng_() % 5);
    expect_misuse<invalid_argument>("max_chunk_tokens", [&] { m.prepare_chunk(id, big); });
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    auto c   = uniform(1, std::min(rem, cfg_.max_chunk));
    m.prepare_chunk(id, c);
    ++t_.calls;
    std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
    m.expected_kept(id, c, kept.data());  // compressed heads: all their candidates
    auto P           = cfg_.plan.geometry.page_tokens;
    std::int64_t all = 0;
    for (auto const& grp : sim_->pooled_members()) {
      std::int32_t longest = 0;
      for (auto h : grp) longest = std::max(longest, kept[static_cast<std::size_t>(h)]);
      all += ceil_div(longest, P);
    }
    auto limit = m.elastic_page_limit(id);
    if (all > limit) {
      auto piece = "would hold " + std::to_string(all) + " pages";
      expect_misuse<logic_error>(piece.c_str(), [&] { m.commit_chunk(id, kept); });
      ++t_.limit_refusals;
    }
    sim_->chunk(id, c, true);  // the engine's valid eviction of the chunk still prepared
    ++t_.chunks;
    ++t_.calls;
    note_elastic();
  }

  /// A size from the edges of int64 (or just past a limit): sums with it overflow or exceed
  /// 2^31 - 1.
  std::int64_t hostile_size() {
    constexpr auto top = std::numeric_limits<std::int64_t>::max();
    switch (rng_() % 5) {
      case 0:
        return top;
      case 1:
        return top - static_cast<std::int64_t>(rng_() % 64);
      case 2:
        return (std::int64_t{1} << 62) + static_cast<std::int64_t>(rng_() % 64);
      case 3:
        return std::int64_t{1} << 31;
      default:  // past the cap with any N >= 1 or history n >= 1
        return std::numeric_limits<std::int32_t>::max();
    }
  }
  std::int64_t negative_size() {
    return rng_() % 2
               ? -1 - static_cast<std::int64_t>(rng_() % 8)
               : std::numeric_limits<std::int64_t>::min() + static_cast<std::int64_t>(rng_() % 8);
  }

  /// try_admit / continue_turn / prepare_chunk / expected_kept with sizes no sequence may have:
  /// each throws invalid_argument (or logic_error for a chunk past the prompt) and changes nothing
  /// (a rejected admission used to leak its slot; an overflowing N + T used to be admitted).
  void bad_sizes(std::vector<sequence_id> const& pre, std::vector<sequence_id> const& end) {
    auto& m         = *manager_;
    auto misuses_at = t_.misuses;
    switch (rng_() % 9) {
      case 0:
        expect_misuse<invalid_argument>("prompt_tokens", [&] { (void)m.try_admit(0, 1); });
        break;
      case 1: {
        auto T = negative_size();
        expect_misuse<invalid_argument>("max_new_tokens", [&] { (void)m.try_admit(1, T); });
        break;
      }
      case 2: {
        auto N = negative_size();
        expect_misuse<invalid_argument>("prompt_tokens", [&] { (void)m.try_admit(N, 1); });
        break;
      }
      case 3: {  // hostile prompt, max_new or both
        auto N = rng_() % 3 == 0 ? uniform(1, cfg_.max_prompt) : hostile_size();
        auto T = N <= cfg_.max_prompt || rng_() % 2 ? hostile_size() : uniform(1, cfg_.max_new + 1);
        expect_misuse<invalid_argument>("prompt_tokens + max_new_tokens",
                                        [&] { (void)m.try_admit(N, T); });
        break;
      }
      case 4:
        if (!end.empty()) {
          auto id = pick(end);
          auto N  = rng_() % 3 == 0 ? std::int64_t{1} : hostile_size();
          auto T  = N == 1 || rng_() % 2 ? hostile_size() : std::int64_t{0};
          expect_misuse<invalid_argument>("prompt_tokens + max_new_tokens",
                                          [&] { (void)m.continue_turn(id, N, T); });
        }
        break;
      case 5:
        if (!end.empty()) {
          auto id = pick(end);
          if (rng_() % 2)
            expect_misuse<invalid_argument>("prompt_tokens",
                                            [&] { (void)m.continue_turn(id, 0, 1); });
          else
            expect_misuse<invalid_argument>("max_new_tokens",
                                            [&] { (void)m.continue_turn(id, 1, negative_size()); });
        }
        break;
      case 6:
        if (!pre.empty()) {
          auto id = pick(pre);
          auto c  = rng_() % 2 ? std::int64_t{0} : negative_size();
          expect_misuse<invalid_argument>("chunk_tokens", [&] { m.prepare_chunk(id, c); });
        }
        break;
      case 7:
        if (!pre.empty()) {
          auto id = pick(pre);
          auto c  = hostile_size();
          if (sim_->elastic())  // beyond max_chunk_tokens: refused before the prompt check
            expect_misuse<invalid_argument>("max_chunk_tokens", [&] { m.prepare_chunk(id, c); });
          else
            expect_misuse<logic_error>("prompt tokens left", [&] { m.prepare_chunk(id, c); });
        }
        break;
      default:
        if (!pre.empty()) {
          auto id = pick(pre);
          std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
          if (rng_() % 2)
            expect_misuse<invalid_argument>(
                "chunk_tokens", [&] { m.expected_kept(id, negative_size(), kept.data()); });
          else
            expect_misuse<logic_error>("prompt tokens left",
                                       [&] { m.expected_kept(id, hostile_size(), kept.data()); });
        }
        break;
    }
    t_.bad_sizes += t_.misuses - misuses_at;
  }
};

}  // namespace tangram::test
