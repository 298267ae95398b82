// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/tangram_policy.hpp
 * @brief `tangram_policy`: budget reservation (M(r) at admission, increments per turn), head-group
 * pages with the plan's clustering, answers reserved a window at a time and grown
 * (memory/answer_window.hpp), sessions parked in host memory when a growth does not fit (the
 * file comment of eval/sim/policies.hpp tells the three policies apart).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/eval/sim/chunk_eviction.hpp"
#include "tangram/eval/sim/live_accounting.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

/// @brief How a `tangram_policy` differs from the plain static one.
struct tangram_policy_options {
  std::string name = "tangram";
  /// manager_options.max_chunk_tokens (elastic: bounds the staging per request, with its prompt);
  /// 0: the manager's default
  std::int64_t max_chunk_tokens = 0;
  /// The eviction step of each prefill chunk; null: keep `expected_kept` (fused, static budgets).
  std::shared_ptr<chunk_eviction> eviction;
  /// Answer reservations (memory/answer_window.hpp): a turn reserves `window_tokens` of its
  /// max_tokens at admission and adds as many each time it runs out (`try_extend`); a growth that
  /// does not fit parks sessions in the options' victim order (ended ones first by default, then
  /// running turns, the growing one included) within `host_pool_ratio` x the pool's bytes of host
  /// memory. Window 0: the whole max_tokens up front (no growth, no parking).
  answer_window_options answers;
  /// With parking (a window > 0): a turn that does not fit parks idle (ended) sessions in the
  /// answer window's victim order to make room, and admission keeps no continuation headroom for
  /// resident sessions (the replay's `headroom_tokens` is not applied), as vLLM keeps none and
  /// evicts idle blocks instead; here nothing is recomputed. False, or window 0: the headroom is
  /// kept and a turn that does not fit waits.
  bool park_for_turns = true;
};

/// @brief Tangram: reservation + head-group pages (kv_cache_manager).
class tangram_policy final : public live_accounting_policy {
 public:
  /// @param kv_bytes KV memory of the GPU; @param max_sessions sessions alive at once
  tangram_policy(static_plan const& plan,
                 double kv_bytes,
                 std::int32_t max_sessions,
                 std::int32_t num_sessions,
                 tangram_policy_options policy_options = {})
      : live_accounting_policy(plan, num_sessions),
        config_(std::move(policy_options)),
        window_(config_.answers),
        manager_(plan, resource_, options(plan, kv_bytes, max_sessions, config_.max_chunk_tokens)),
        ids_(static_cast<std::size_t>(num_sessions)),
        kept_(static_cast<std::size_t>(plan.num_layers) *
              static_cast<std::size_t>(plan.num_kv_heads)),
        extra_bytes_(static_cast<std::size_t>(num_sessions), 0.0),
        turn_(static_cast<std::size_t>(num_sessions)),
        parked_(static_cast<std::size_t>(num_sessions)),
        host_limit_(window_.host_limit_bytes(manager_.pool().arena_bytes())) {
    for (auto const& g : plan.grouping.groups) growing_groups_ += grows_with_context(&g.rule, 1);
  }

  [[nodiscard]] std::string name() const override { return config_.name; }

  bool start_turn(std::int32_t s,
                  std::int64_t,
                  std::int64_t prompt,
                  std::int64_t max_new,
                  std::int64_t headroom_tokens) override {
    auto& id = ids_[static_cast<std::size_t>(s)];
    auto& tt = turn_[static_cast<std::size_t>(s)];
    if (auto& p = parked_[static_cast<std::size_t>(s)]; p && p->mid_turn) {
      // A running turn parked to make room resumes where it stopped, with its next window when
      // it had decoded all it had reserved.
      std::int64_t reserved =
          tt.reserved + (tt.decoded == tt.reserved ? window_.growth(tt.wanted, tt.reserved) : 0);
      return fit_by_parking(s, manager_.resume_pages(*p, reserved), [&] {
        auto r = manager_.try_resume(*p, reserved);
        if (!r) return false;
        tt.reserved = reserved;
        return restored(s, r->id);
      });
    }
    std::int64_t reserve = window_.first(max_new);
    if (headroom_tokens > 0 && !parks_for_turns()) {
      // Checked: an overflowing allowance cannot fit any pool.
      auto headroom = detail::mul_checked<std::int64_t>(
          growing_groups_, ceil_div(headroom_tokens, plan_.geometry.page_tokens));
      auto need = headroom
                      ? detail::add_checked(manager_.admission_pages(prompt, reserve), *headroom)
                      : std::nullopt;
      if (!need || *need > manager_.pool().available_pages()) return false;
    }
    bool ok = false;
    if (auto& p = parked_[static_cast<std::size_t>(s)]) {  // an idle session parked earlier
      ok = fit_by_parking(s, manager_.unpark_pages(*p, prompt, reserve), [&] {
        auto r = manager_.try_unpark(*p, prompt, reserve);
        return r && restored(s, r->id);
      });
    } else if (id) {
      // At most what the whole history would reserve as a new request, less what it holds.
      auto bound = manager_.admission_pages(manager_.info(*id).seq_tokens + prompt, reserve) -
                   held_pages(*id);
      ok = fit_by_parking(s, bound, [&] { return manager_.continue_turn(*id, prompt, reserve); });
    } else {  // a new session waits rather than park others
      ok = (id = manager_.try_admit(prompt, reserve)).has_value();
    }
    if (ok) {
      tt = {max_new, reserve, 0};
      stamp(s);
      stage(s, prompt, reserve);
    }
    return ok;
  }

  bool prefill_chunk(std::int32_t s, std::int64_t tokens) override {
    commit_pending(s);
    auto id = *ids_[static_cast<std::size_t>(s)];
    manager_.prepare_chunk(id, tokens);
    manager_.expected_kept(id, tokens, kept_.data());  // what the fused eviction keeps
    extra_bytes_[static_cast<std::size_t>(s)] =
        config_.eviction ? config_.eviction->choose(manager_, id, s, tokens, kept_) : 0.0;
    if (defer_commit_) {  // committed when the counts arrive (counts_arrived)
      auto& k = pending_[static_cast<std::size_t>(s)];
      k.assign(kept_.begin(), kept_.end());
      return true;
    }
    commit(s, kept_);
    return true;
  }

  /// Elastic with counts_arrival::next_step: a chunk's counts are committed (`commit_chunk`: the
  /// staged pages the eviction dropped go back, the last chunk's unused reservation to the pool)
  /// only when they reach the host, as in the engine loop of docs/integration.md.
  void begin_replay(counts_arrival counts) override {
    defer_commit_ = counts == counts_arrival::next_step && kept_counts_from_gpu();
    if (defer_commit_) pending_.resize(ids_.size());
  }
  void counts_arrived(std::int32_t s) override { commit_pending(s); }

  /// Elastic reservation: `evict_elastic` chooses the groups' lengths on the GPU and
  /// `commit_chunk` needs them (static budgets: known in advance).
  [[nodiscard]] bool kept_counts_from_gpu() const override {
    return plan_.options.reservation.mode == reservation_mode::elastic &&
           compressed_group_count(plan_) > 0;
  }

  [[nodiscard]] double prefill_chunk_extra_bytes(std::int32_t s) const override {
    return extra_bytes_[static_cast<std::size_t>(s)];
  }

  /// A turn that decoded all it reserved grows by a window first; a growth that does not fit
  /// parks sessions (`choose_victim`) until it fits or the growing turn itself was parked. False
  /// (the replay then preempts) only when nothing may be parked within host memory; growths and
  /// parks already made stay.
  bool decode(std::vector<std::int32_t> const& sessions) override {
    for (auto s : sessions) commit_pending(s);  // none: a session waits for its counts
    for (auto s : sessions) {
      auto& tt = turn_[static_cast<std::size_t>(s)];
      if (tt.decoded < tt.reserved || parked_[static_cast<std::size_t>(s)]) continue;
      std::int64_t more = window_.growth(tt.wanted, tt.reserved);
      if (more < 1) return false;  // the replay never decodes past max_tokens
      while (!manager_.try_extend(*ids_[static_cast<std::size_t>(s)], more)) {
        auto victim = choose_victim(sessions);
        if (!victim) return false;
        park(*victim);
        if (*victim == s) break;
      }
      if (!parked_[static_cast<std::size_t>(s)]) tt.reserved += more;
    }
    batch_.clear();
    for (auto s : sessions)
      if (!parked_[static_cast<std::size_t>(s)])
        batch_.push_back(*ids_[static_cast<std::size_t>(s)]);
    manager_.set_batch(batch_);
    manager_.decode_step();
    for (auto s : sessions) {
      if (parked_[static_cast<std::size_t>(s)]) continue;
      turn_[static_cast<std::size_t>(s)].decoded += 1;
      live_.touch(s);
    }
    return true;
  }

  /// Turns grown past their first reservation (the answer window), and growths that did not fit.
  [[nodiscard]] std::int64_t extensions() const { return manager_.stats().extended; }
  [[nodiscard]] std::int64_t extensions_rejected() const {
    return manager_.stats().extend_rejected;
  }

  void end_turn(std::int32_t s) override {
    commit_pending(s);
    manager_.end_turn(*ids_[static_cast<std::size_t>(s)]);
    stamp(s);
    live_.touch(s);
  }

  void release(std::int32_t s) override {
    if (auto& p = parked_[static_cast<std::size_t>(s)]) {  // its history leaves host memory
      host_used_ -= host_bytes(*p);
      p.reset();
    }
    auto& id = ids_[static_cast<std::size_t>(s)];
    if (!id) return;
    commit_pending(s);
    unstage(s);
    manager_.free(*id);
    id.reset();
    live_.clear(s);
  }

  std::vector<std::int32_t> take_parked() override { return std::exchange(just_parked_, {}); }
  bool park_idle(std::int32_t s) override {
    auto const& id = ids_[static_cast<std::size_t>(s)];
    if (!window_.options().window_tokens || !id ||
        manager_.info(*id).phase != sequence_phase::ended ||
        held_pages(*id) * manager_.pool().page_bytes() > host_limit_ - host_used_)
      return false;
    park(s);
    return true;
  }
  host_traffic take_host_traffic() override { return std::exchange(traffic_, {}); }
  /// Host bytes parked sessions hold now, and the most they may hold.
  [[nodiscard]] std::int64_t host_bytes_used() const noexcept { return host_used_; }
  [[nodiscard]] std::int64_t host_bytes_limit() const noexcept { return host_limit_; }

  [[nodiscard]] policy_memory memory() const override {
    update();
    auto const& pool = manager_.pool();
    policy_memory m;
    m.allocated_bytes = static_cast<double>(pool.used_pages() + pool.reserved_pages()) *
                        static_cast<double>(pool.page_bytes());
    m.held_bytes  = static_cast<double>(pool.used_pages()) * static_cast<double>(pool.page_bytes());
    m.live_bytes  = live_.total();
    m.reclaim_ops = manager_.stats().reclaimed_pages;
    m.released_pages = manager_.stats().surplus_pages_released;
    m.staging_bytes  = static_cast<double>(staging_pages_) * static_cast<double>(pool.page_bytes());
    return m;
  }
  [[nodiscard]] double capacity_bytes() const override {
    return static_cast<double>(manager_.pool().arena_bytes());
  }
  /// Whole head-group pages in use, padding included.
  [[nodiscard]] double kv_bytes_read_padded(std::int32_t s) const override {
    return static_cast<double>(held_pages(*ids_[static_cast<std::size_t>(s)])) *
           static_cast<double>(manager_.pool().page_bytes());
  }

  /// The manager, for tests that check the replay's accounting.
  [[nodiscard]] kv_cache_manager const& manager() const { return manager_; }
  /// The eviction step (null: `expected_kept`).
  [[nodiscard]] chunk_eviction const* eviction() const { return config_.eviction.get(); }

 private:
  static manager_options options(static_plan const& plan,
                                 double kv_bytes,
                                 std::int32_t max_sessions,
                                 std::int64_t max_chunk_tokens) {
    manager_options o;
    o.num_pages     = pool_pages(kv_bytes, plan.page_bytes());
    o.max_sequences = max_sessions;
    if (max_chunk_tokens > 0) o.max_chunk_tokens = max_chunk_tokens;
    return o;
  }
  [[nodiscard]] std::int64_t held_tokens(std::int32_t s) const override {
    auto id = *ids_[static_cast<std::size_t>(s)];
    return sum_heads([&](std::int32_t l, std::int32_t h) { return manager_.head_len(id, l, h); });
  }
  /// Pages the heads of `id` use (what a park copies out; what a decode step reads).
  [[nodiscard]] std::int64_t held_pages(sequence_id id) const {
    std::int64_t np = 0;
    for (std::int32_t g = 0; g < manager_.num_groups(); ++g)
      np += manager_.group_pages_in_use(id, g);
    return np;
  }
  [[nodiscard]] std::int64_t host_bytes(parked_session const& p) const {
    return p.host_pages() * p.page_bytes;
  }
  /// Elastic: the pages session s's turn (N prompt, T answer tokens) reserves only to stage its
  /// chunks, elastic_turn_pages with its staging less without (counted while it prefills).
  void stage(std::int32_t s, std::int64_t prompt, std::int64_t answer) {
    if (plan_.options.reservation.mode != reservation_mode::elastic) return;
    auto id        = *ids_[static_cast<std::size_t>(s)];
    auto Gc        = compressed_group_count(plan_);
    std::int32_t P = plan_.geometry.page_tokens;
    auto limit = manager_.elastic_page_limit(id), decode = Gc * ceil_div(answer, P);
    auto whole = Gc * ceil_div(manager_.info(id).seq_tokens + prompt + answer, P);
    auto staging =
        elastic_staging_pages(Gc, P, std::min(manager_.options().max_chunk_tokens, prompt));
    auto& tt   = turn_[static_cast<std::size_t>(s)];
    tt.staging = elastic_turn_pages(limit, decode, staging, whole) -
                 elastic_turn_pages(limit, decode, 0, whole);
    staging_pages_ += tt.staging;
  }
  void unstage(std::int32_t s) {
    staging_pages_ -= std::exchange(turn_[static_cast<std::size_t>(s)].staging, 0);
  }
  /// Commits session s's chunk with `kept` (its eviction's counts).
  void commit(std::int32_t s, std::vector<std::int32_t> const& kept) {
    auto id = *ids_[static_cast<std::size_t>(s)];
    manager_.commit_chunk(id, kept.data(), kept.size());
    if (manager_.info(id).phase != sequence_phase::prefill) unstage(s);
    live_.touch(s);
  }
  /// Commits a chunk whose counts were held back (begin_replay), if any.
  void commit_pending(std::int32_t s) {
    if (!defer_commit_) return;
    auto& k = pending_[static_cast<std::size_t>(s)];
    if (k.empty()) return;
    commit(s, k);
    k.clear();
  }

  /// Parking makes room for turns (`tangram_policy_options::park_for_turns` with a window).
  [[nodiscard]] bool parks_for_turns() const {
    return config_.park_for_turns && window_.options().window_tokens > 0;
  }
  /// Runs `attempt` (a turn's all-or-nothing reservation for session s, of about `need` pages)
  /// and, while it does not fit and parking makes room for turns, parks another idle session and
  /// tries again; but parks nobody when parking every idle session the host memory can take
  /// would still leave fewer than `need` pages free (the turn then waits).
  template <class Attempt>
  bool fit_by_parking(std::int32_t s, std::int64_t need, Attempt&& attempt) {
    if (attempt()) return true;
    if (!parks_for_turns() || idle_pages(s) + manager_.pool().available_pages() < need)
      return false;
    do {  // nothing changed since the failed attempt: park first
      auto victim = choose_victim({}, s);
      if (!victim) return false;
      park(*victim);
    } while (!attempt());
    return true;
  }

  /// Pages the idle (ended, on-device) sessions other than `spare` use, at most what the host
  /// memory left can take.
  [[nodiscard]] std::int64_t idle_pages(std::int32_t spare) const {
    std::int64_t pages = 0;
    for (std::int32_t s = 0; s < static_cast<std::int32_t>(ids_.size()); ++s) {
      auto const& id = ids_[static_cast<std::size_t>(s)];
      if (s != spare && id && manager_.info(*id).phase == sequence_phase::ended)
        pages += held_pages(*id);
    }
    return std::min(pages, (host_limit_ - host_used_) / manager_.pool().page_bytes());
  }

  /// Session s ran now (its turn started, resumed or ended): the victim order's clock.
  void stamp(std::int32_t s) { turn_[static_cast<std::size_t>(s)].last_used = ++clock_; }

  /// The session to park so that a growth or a turn fits: the idle (ended) sessions and the
  /// running turns of `running` (all in decode), but not `spare`, in the answer window's order,
  /// within the host memory left.
  std::optional<std::int32_t> choose_victim(std::vector<std::int32_t> const& running,
                                            std::int32_t spare = -1) {
    candidates_.clear();
    sessions_.clear();
    auto add = [&](std::int32_t s) {
      auto const& id = ids_[static_cast<std::size_t>(s)];
      if (s == spare || !id || parked_[static_cast<std::size_t>(s)]) return;
      auto phase = manager_.info(*id).phase;
      if (phase != sequence_phase::ended && phase != sequence_phase::decode) return;
      candidates_.push_back(
          {*id, phase, turn_[static_cast<std::size_t>(s)].last_used, held_pages(*id)});
      sessions_.push_back(s);
    };
    for (std::int32_t s = 0; s < static_cast<std::int32_t>(ids_.size()); ++s)
      if (ids_[static_cast<std::size_t>(s)] &&
          manager_.info(*ids_[static_cast<std::size_t>(s)]).phase == sequence_phase::ended)
        add(s);
    for (auto s : running) add(s);
    auto k =
        window_.choose_victim(candidates_, manager_.pool().page_bytes(), host_limit_ - host_used_);
    if (!k) return std::nullopt;
    return sessions_[*k];
  }

  /// Parks session s (ended or in decode): its pages are copied out (host-link traffic) and
  /// return to the pool; it resumes at its next start_turn.
  void park(std::int32_t s) {
    commit_pending(s);
    auto& id = ids_[static_cast<std::size_t>(s)];
    auto p   = manager_.park(*id);
    manager_.complete_park(*id);
    p.device_pages = {};  // the simulation copies nothing: the descriptor is all it keeps
    auto bytes     = host_bytes(p);
    host_used_ += bytes;
    traffic_.parked_bytes += static_cast<double>(bytes);
    parked_[static_cast<std::size_t>(s)] = std::move(p);
    id.reset();
    live_.clear(s);
    just_parked_.push_back(s);
  }
  /// Session s's parked KV is back as sequence `id` (host-link traffic), and it ran now.
  bool restored(std::int32_t s, sequence_id id) {
    auto& p    = parked_[static_cast<std::size_t>(s)];
    auto bytes = host_bytes(*p);
    host_used_ -= bytes;
    traffic_.restored_bytes += static_cast<double>(bytes);
    p.reset();
    ids_[static_cast<std::size_t>(s)] = id;
    stamp(s);
    live_.touch(s);
    return true;
  }

  tangram_policy_options config_;
  answer_window window_;
  simulated_memory_resource resource_;
  kv_cache_manager manager_;
  std::vector<std::optional<sequence_id>> ids_;
  std::vector<std::int32_t> kept_;
  bool defer_commit_ = false;  ///< begin_replay: commit each chunk when its counts arrive
  /// [session]: the counts of a chunk not yet committed (empty: none).
  std::vector<std::vector<std::int32_t>> pending_;
  std::vector<double> extra_bytes_;  ///< per session: the last chunk's eviction traffic
  std::vector<sequence_id> batch_;
  /// Per session, the current turn's answer tokens: max_new asked, reserved so far, decoded; and
  /// when it last ran (the victim order's clock).
  struct turn_reservation {
    std::int64_t wanted = 0, reserved = 0, decoded = 0, last_used = 0;
    std::int64_t staging = 0;  ///< elastic: pages reserved only to stage its chunks (prefill)
  };
  std::vector<turn_reservation> turn_;
  std::vector<std::optional<parked_session>> parked_;  ///< sessions in host memory
  std::int64_t host_limit_ = 0, host_used_ = 0, clock_ = 0;
  std::int64_t staging_pages_  = 0;  ///< sum of the prefilling turns' staging pages
  std::int64_t growing_groups_ = 0;  ///< groups the continuation headroom applies to (not rings)
  std::vector<std::int32_t> just_parked_;   ///< parked since the last take_parked
  host_traffic traffic_;                    ///< since the last take_host_traffic
  std::vector<park_candidate> candidates_;  ///< choose_victim scratch
  std::vector<std::int32_t> sessions_;      ///< choose_victim scratch: candidate -> session
};

}  // namespace tangram::sim
