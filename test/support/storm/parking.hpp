// SPDX-License-Identifier: Apache-2.0
// Host offload in an operation storm (see driver.hpp): park, complete or cancel, restore or
// resume, and the answer window's growth that parks victims until it fits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "lifecycle.hpp"
#include "tangram/memory/answer_window.hpp"

namespace tangram::test {

/// The parking operations.
class storm_parking : public storm_lifecycle {
 public:
  using storm_lifecycle::storm_lifecycle;

 protected:
  /// Host offload: park an ended session or a running turn (its copy-out now or just before
  /// complete_park), complete or cancel a park, restore a parked session with a next turn or
  /// resume a parked turn, or grow a turn parking victims until it fits. A restore or resume fits
  /// exactly when `unpark_pages` / `resume_pages` are available with a free slot (the page-id
  /// arena may refuse while forks share pages); a refusal changes nothing. On host pools the
  /// restored history is read back token by token at the next check.
  void park_op() {
    auto& m = *manager_;
    parking_.erase(std::remove_if(parking_.begin(),
                                  parking_.end(),
                                  [&](parking_entry const& e) { return !m.contains(e.id); }),
                   parking_.end());
    switch (rng_() % 4) {
      case 0: {
        auto ended = phase(rng_() % 3 == 0 ? sequence_phase::decode : sequence_phase::ended);
        if (ended.empty()) return end_turn();
        auto id = pick(ended);
        start_park(id);
        return;
      }
      case 1: {
        if (parking_.empty()) return;
        auto k  = rng_() % parking_.size();
        auto& e = parking_[k];
        if (rng_() % 6 == 0) {
          sim_->cancel_park(e.id);
          ++t_.park_cancels;
        } else {
          finish_park(k);
        }
        ++t_.calls;
        parking_.erase(parking_.begin() + static_cast<long>(k));
        return;
      }
      case 2:
        return grow_or_park();
      default: {
        if (parked_.empty()) return;
        auto k         = rng_() % parked_.size();
        auto const& ps = parked_[k].session;
        auto N         = uniform(1, std::max<std::int64_t>(1, cfg_.max_prompt / 2));
        auto T     = ps.mid_turn ? ps.max_new + uniform(0, cfg_.max_new) : uniform(0, cfg_.max_new);
        auto need  = ps.mid_turn ? m.resume_pages(ps, T) : m.unpark_pages(ps, N, T);
        bool fits  = m.live_sequences() < m.max_sequences() && need <= m.pool().available_pages();
        bool arena = arena_may_refuse();
        std::optional<sequence_id> back;
        bool ok = fits_or_unchanged(!fits || arena, [&] {
          back = ps.mid_turn ? sim_->resume(parked_[k], T) : sim_->unpark(parked_[k], N, T);
          return back.has_value();
        });
        if (fits && !arena) REQUIRE(ok);
        if (!fits) REQUIRE(!ok);
        note_refusal(fits, ok);
        if (ok) {
          REQUIRE(m.info(*back).reserved_pages == need - ps.host_pages());
          ++(ps.mid_turn ? t_.resumes : t_.unparks);
          if (rng_() % 2) parked_.erase(parked_.begin() + static_cast<long>(k));
        } else {
          ++(parked_[k].session.mid_turn ? t_.resume_rejected : t_.unpark_rejected);
        }
        return;
      }
    }
  }

  /// `park(id)` (ended or in decode), its copy-out now or later.
  void start_park(sequence_id id) {
    auto& m = *manager_;
    t_.running_parks += m.info(id).phase == sequence_phase::decode;
    bool shared = false;
    for (std::int32_t g = 0; g < m.num_groups() && !shared; ++g)
      for (std::int32_t p = 0; p < m.group_page_count(id, g) && !shared; ++p)
        shared = m.pool().ref_count(m.group_pages(id, g)[p]) > 1;
    t_.shared_parks += shared;
    parking_entry e{id, sim_->park(id), {}, false};
    if (rng_() % 2) {
      e.host   = sim_->copy_out(e.session);
      e.copied = true;
    }
    parking_.push_back(std::move(e));
    ++t_.calls;
  }
  /// The copy-out of `parking_[k]` (if not done yet) and `complete_park`: the session lives on in
  /// host memory (the entry stays in `parking_`: the caller removes it).
  void finish_park(std::size_t k) {
    auto& e = parking_[k];
    if (!e.copied) e.host = sim_->copy_out(e.session);
    parked_.push_back(sim_->complete_park(e.id, std::move(e.session), std::move(e.host)));
    graveyard(e.id);
    ++t_.parks;
    if (parked_.size() > 8) parked_.erase(parked_.begin() + static_cast<long>(rng_() % 8));
  }

  /// The engine loop's growth (memory/answer_window.hpp): a turn in decode grows by a window;
  /// while that does not fit, the victim the answer window names (an ended session first, then
  /// the newest running turn, the growing one included; random clocks) is parked and completed.
  /// Every growth either fits or ends with the growing turn parked: nothing is recomputed.
  void grow_or_park() {
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id   = pick(dec);
    auto more = uniform(1, std::max<std::int64_t>(1, cfg_.max_new));
    answer_window window;
    for (;;) {
      auto before = sim_->sequences().at(id.slot).max_new;
      if (sim_->extend(id, more)) {
        REQUIRE(sim_->sequences().at(id.slot).max_new == before + more);
        ++t_.extended;
        return;
      }
      ++t_.extend_rejected;
      std::vector<park_candidate> candidates;
      for (auto const& [s, q] : sim_->sequences())
        if (!is_prefix(q.id))
          candidates.push_back({q.id,
                                q.phase,
                                static_cast<std::int64_t>(rng_() % 1000),
                                manager_->info(q.id).held_pages});
      auto k = window.choose_victim(
          candidates, manager_->pool().page_bytes(), std::numeric_limits<std::int64_t>::max());
      REQUIRE(k.has_value());  // the growing turn itself is a candidate
      auto victim = candidates[*k].id;
      REQUIRE((candidates[*k].phase == sequence_phase::ended ||
               candidates[*k].phase == sequence_phase::decode));
      start_park(victim);
      finish_park(parking_.size() - 1);
      parking_.pop_back();
      ++t_.growth_parks;
      if (victim == id) return;  // the growing turn left the GPU; it resumes later
    }
  }
};

}  // namespace tangram::test
