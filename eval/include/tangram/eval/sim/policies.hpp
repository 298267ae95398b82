// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/policies.hpp
 * @brief The three KV-memory policies the replay compares, each a thin adapter over the real
 * library objects on a simulated memory resource (no real memory, exact accounting):
 *
 * - `full_kv`: vLLM v1 paging, one page spans all KV heads of a layer, no compression; pages are
 *   allocated per scheduled prefill chunk (admission needs only the first chunk's pages), and an
 *   idle session's pages are an evictable prefix cache (`idle_kv_is_prefix_cache`: the replay
 *   drops the least recently used idle session's KV when memory is needed, and the session
 *   recomputes it on its next turn).
 * - `unified_nonuniform_policy`: non-uniform compression on layer-wide pages with dynamic
 *   reclamation (each chunk is allocated in full, tail pages freed after eviction); each input keeps
 *   its own per-head retention from the samples (`retention_needs`, what a dynamic compressor
 *   keeps), or, given no needs, Tangram's padded budgets; admission checks the uncompressed prompt
 *   like the reference implementation; out of pages -> preemption.
 * - the per-head dynamic baseline (eval/sim/per_head_policy.hpp) is the same class with
 *   `unified_policy_options`: per-head pages, admission by the estimated compressed size,
 *   preempted requests keeping their blocks.
 * - `tangram_policy`: budget reservation (M(r) at admission, increments per turn), head-group
 *   pages with the plan's clustering; answers reserved a window at a time and grown
 *   (memory/answer_window.hpp); when a growth does not fit it parks a session in host memory
 *   (an idle one first, else a running turn, which resumes later where it was), never
 *   recomputing; each park and restore is host-link traffic the replay charges. Only when host
 *   memory is full too does a decode step fail (the replay then preempts). Its eviction step is
 *   pluggable (eval/sim/chunk_eviction.hpp): static budgets keep `expected_kept`; `tangram_elastic`
 *   (eval/sim/elastic_policy.hpp) is the same policy over an elastic plan with the group-length
 *   selection.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/chunk_eviction.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

/// Bytes of K and V one token of one head takes.
inline double head_token_bytes(static_plan const& plan) {
  return static_cast<double>(2 * plan.geometry.head_dim * plan.geometry.element_bytes());
}

/**
 * @brief Pages of `page_bytes` bytes that `kv_bytes` of KV memory holds (rounded down).
 * @throw invalid_argument naming kv_bytes when it is not finite or the pages are not in
 *        [1, page_pool max_pages] (page ids are 32-bit).
 */
inline std::int64_t pool_pages(double kv_bytes, std::int64_t page_bytes) {
  constexpr auto most = page_pool<>::max_pages;
  double pages        = std::floor(kv_bytes / static_cast<double>(page_bytes));
  TANGRAM_EXPECTS(std::isfinite(kv_bytes) && pages >= 1 && pages <= static_cast<double>(most),
                  invalid_argument,
                  "kv_bytes: ",
                  kv_bytes,
                  " bytes hold ",
                  pages,
                  " pages of ",
                  page_bytes,
                  " bytes; a pool needs between 1 and ",
                  most);
  return static_cast<std::int64_t>(pages);
}

/**
 * @brief Live-token accounting of a policy, kept out of the engine's timed path: sessions touched
 * by a call are marked dirty and their held tokens are summed (over every head) only when a
 * figure is read.
 */
class live_tracker {
 public:
  live_tracker(std::int32_t num_sessions, double token_bytes, std::int64_t heads)
      : live_(static_cast<std::size_t>(num_sessions), 0.0),
        attended_(static_cast<std::size_t>(num_sessions), 0.0),
        dirty_(static_cast<std::size_t>(num_sessions), 0),
        token_bytes_(token_bytes),
        heads_(static_cast<double>(heads)) {}

  void touch(std::int32_t s) {
    if (!dirty_[static_cast<std::size_t>(s)]) {
      dirty_[static_cast<std::size_t>(s)] = 1;
      dirty_list_.push_back(s);
    }
  }
  /// The session holds nothing any more.
  void clear(std::int32_t s) {
    total_ -= live_[static_cast<std::size_t>(s)];
    live_[static_cast<std::size_t>(s)]     = 0;
    attended_[static_cast<std::size_t>(s)] = 0;
    dirty_[static_cast<std::size_t>(s)]    = 0;
  }
  /// Brings dirty sessions up to date; `held_tokens(s)` sums the session's head lengths.
  template <class HeldTokens>
  void update(HeldTokens&& held_tokens) const {
    for (auto s : dirty_list_) {
      if (!dirty_[static_cast<std::size_t>(s)]) continue;
      dirty_[static_cast<std::size_t>(s)] = 0;
      auto tokens                         = static_cast<double>(held_tokens(s));
      total_ += tokens * token_bytes_ - live_[static_cast<std::size_t>(s)];
      live_[static_cast<std::size_t>(s)]     = tokens * token_bytes_;
      attended_[static_cast<std::size_t>(s)] = tokens / heads_;
    }
    dirty_list_.clear();
  }
  [[nodiscard]] double live_bytes(std::int32_t s) const {
    return live_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] double attended(std::int32_t s) const {
    return attended_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] double total() const { return total_; }

 private:
  mutable std::vector<double> live_, attended_;
  mutable std::vector<char> dirty_;
  mutable std::vector<std::int32_t> dirty_list_;
  mutable double total_ = 0;
  double token_bytes_   = 0;
  double heads_         = 1;
};

/// @brief A policy whose live bytes come from summing its sequences' head lengths lazily.
class live_accounting_policy : public kv_policy {
 public:
  live_accounting_policy(static_plan const& plan, std::int32_t num_sessions)
      : plan_(plan),
        live_(num_sessions,
              head_token_bytes(plan),
              static_cast<std::int64_t>(plan.num_layers) * plan.num_kv_heads) {}

  [[nodiscard]] double kv_bytes_read(std::int32_t s) const override {
    update();
    return live_.live_bytes(s);
  }
  [[nodiscard]] double attended_tokens(std::int32_t s) const override {
    update();
    return live_.attended(s);
  }

 protected:
  /// Tokens session `s` holds, summed over every (layer, head).
  [[nodiscard]] virtual std::int64_t held_tokens(std::int32_t s) const = 0;
  /// Sum of head lengths given a per-head length function.
  template <class HeadLen>
  [[nodiscard]] std::int64_t sum_heads(HeadLen&& head_len) const {
    std::int64_t sum = 0;
    for (std::int32_t l = 0; l < plan_.num_layers; ++l)
      for (std::int32_t h = 0; h < plan_.num_kv_heads; ++h) sum += head_len(l, h);
    return sum;
  }
  void update() const {
    live_.update([&](std::int32_t s) { return held_tokens(s); });
  }

  static_plan plan_;
  live_tracker live_;
};

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
        host_limit_(window_.host_limit_bytes(manager_.pool().arena_bytes())) {}

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
      auto r = manager_.try_resume(*p, reserved);
      if (!r) return false;
      tt.reserved = reserved;
      return restored(s, r->id);
    }
    std::int64_t reserve = window_.first(max_new);
    if (headroom_tokens > 0) {
      // Checked: an overflowing allowance cannot fit any pool.
      auto headroom = detail::mul_checked<std::int64_t>(
          manager_.num_groups(), ceil_div(headroom_tokens, plan_.geometry.page_tokens));
      auto need = headroom
                      ? detail::add_checked(manager_.admission_pages(prompt, reserve), *headroom)
                      : std::nullopt;
      if (!need || *need > manager_.pool().available_pages()) return false;
    }
    bool ok = false;
    if (auto& p = parked_[static_cast<std::size_t>(s)]) {  // an idle session parked earlier
      auto r = manager_.try_unpark(*p, prompt, reserve);
      ok     = r && restored(s, r->id);
    } else {
      ok = id ? manager_.continue_turn(*id, prompt, reserve)
              : (id = manager_.try_admit(prompt, reserve)).has_value();
    }
    if (ok) {
      tt = {max_new, reserve, 0};
      stamp(s);
      stage(s, prompt, reserve);
    }
    return ok;
  }

  bool prefill_chunk(std::int32_t s, std::int64_t tokens) override {
    auto id = *ids_[static_cast<std::size_t>(s)];
    manager_.prepare_chunk(id, tokens);
    manager_.expected_kept(id, tokens, kept_.data());  // what the fused eviction keeps
    extra_bytes_[static_cast<std::size_t>(s)] =
        config_.eviction ? config_.eviction->choose(manager_, id, s, tokens, kept_) : 0.0;
    manager_.commit_chunk(id, kept_.data(), kept_.size());
    if (manager_.info(id).phase != sequence_phase::prefill) unstage(s);
    live_.touch(s);
    return true;
  }

  [[nodiscard]] double prefill_chunk_extra_bytes(std::int32_t s) const override {
    return extra_bytes_[static_cast<std::size_t>(s)];
  }

  /// A turn that decoded all it reserved grows by a window first; a growth that does not fit
  /// parks sessions (`choose_victim`) until it fits or the growing turn itself was parked. False
  /// (the replay then preempts) only when nothing may be parked within host memory; growths and
  /// parks already made stay.
  bool decode(std::vector<std::int32_t> const& sessions) override {
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
  [[nodiscard]] std::int64_t extensions_rejected() const { return manager_.stats().extend_rejected; }

  void end_turn(std::int32_t s) override {
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
    m.held_bytes = static_cast<double>(pool.used_pages()) * static_cast<double>(pool.page_bytes());
    m.live_bytes     = live_.total();
    m.reclaim_ops    = manager_.stats().reclaimed_pages;
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

  /// Session s ran now (its turn started, resumed or ended): the victim order's clock.
  void stamp(std::int32_t s) { turn_[static_cast<std::size_t>(s)].last_used = ++clock_; }

  /// The session to park so that a growth fits: the idle (ended) sessions and the running turns
  /// of `running` (all in decode), in the answer window's order, within the host memory left.
  std::optional<std::int32_t> choose_victim(std::vector<std::int32_t> const& running) {
    candidates_.clear();
    sessions_.clear();
    auto add = [&](std::int32_t s) {
      auto const& id = ids_[static_cast<std::size_t>(s)];
      if (!id || parked_[static_cast<std::size_t>(s)]) return;
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
  std::int64_t staging_pages_ = 0;  ///< sum of the prefilling turns' staging pages
  std::vector<std::int32_t> just_parked_;   ///< parked since the last take_parked
  host_traffic traffic_;                    ///< since the last take_host_traffic
  std::vector<park_candidate> candidates_;  ///< choose_victim scratch
  std::vector<std::int32_t> sessions_;      ///< choose_victim scratch: candidate -> session
};

/// The plan whose every (layer, KV head) is a one-head layer, in flat head order: its layer-wide
/// pages are per-head pages (`unified_policy_options::per_head`).
inline static_plan per_head_plan(static_plan plan) {
  plan.num_layers *= plan.num_kv_heads;
  plan.num_kv_heads = 1;
  return plan;
}

/// @brief How a `unified_policy` differs from the plain layer-wide baselines (the per-head
/// baseline of eval/sim/per_head_policy.hpp sets all of them).
struct unified_policy_options {
  std::string name;  ///< empty: full_kv or unified_nonuniform
  /// Every (layer, KV head) its own pages (`per_head_plan`): a head holds only its own length.
  bool per_head = false;
  /// compressed_reclaim: admission by the estimated compressed size (the scorer's per-head share
  /// kbar(n) for compressed heads, the rule's tokens for the others, plus one chunk in flight)
  /// instead of the uncompressed prompt or its first chunk.
  std::optional<scorer_total> estimate;
  /// A preempted request keeps its blocks as cache (`kv_policy::preempted_kv_is_cache`).
  bool keep_preempted = false;
};

/// @brief Layer-wide pages (vLLM style): `full_kv` or non-uniform compression with reclamation;
/// with `unified_policy_options::per_head`, per-head pages.
class unified_policy final : public live_accounting_policy {
 public:
  unified_policy(static_plan const& plan,
                 unified_mode mode,
                 double kv_bytes,
                 std::int32_t max_sessions,
                 std::int32_t num_sessions,
                 std::int64_t max_tokens,
                 std::shared_ptr<retention_needs const> own_retention = nullptr,
                 unified_policy_options policy_options                = {})
      : live_accounting_policy(layout(plan, policy_options), num_sessions),
        mode_(mode),
        config_(std::move(policy_options)),
        baseline_(plan_, mode, resource_, pages_for(plan_, kv_bytes), max_sessions, max_tokens),
        slots_(static_cast<std::size_t>(num_sessions), -1),
        own_(mode == unified_mode::compressed_reclaim ? std::move(own_retention) : nullptr),
        kept_(own_ ? plan.rules.size() : 0) {}

  [[nodiscard]] std::string name() const override {
    if (!config_.name.empty()) return config_.name;
    return mode_ == unified_mode::full_kv ? "full_kv" : "unified_nonuniform";
  }
  [[nodiscard]] bool preempted_kv_is_cache() const override {
    return config_.keep_preempted || idle_kv_is_prefix_cache();
  }
  [[nodiscard]] std::int64_t reclaimed_pages() const override {
    return baseline_.stats().reclaim_ops;
  }
  /// full_kv only: vLLM v1's automatic prefix caching (see the file comment).
  [[nodiscard]] bool idle_kv_is_prefix_cache() const override {
    return mode_ == unified_mode::full_kv && vllm_v1_;
  }
  /// full_kv: false gives the simulator's earlier, session-aware full_kv (whole-prompt
  /// admission, idle sessions pinned, continuation headroom for new sessions), for comparison
  /// (`simulate --full-kv-scheduler pinned`); default true (vLLM v1).
  void set_vllm_v1(bool on) { vllm_v1_ = on; }
  /// full_kv as vLLM v1: evict idle sessions' cached KV block by block, tail first, keeping a
  /// prefix (vLLM's block pool), instead of whole sessions (default false).
  void set_block_eviction(bool on) { block_eviction_ = on; }
  std::int64_t evict_cached_block(std::int32_t s) override {
    std::int32_t slot = slots_[static_cast<std::size_t>(s)];
    if (!block_eviction_ || !idle_kv_is_prefix_cache() || slot < 0) return -1;
    std::int64_t held = baseline_.seq_tokens(slot), P = plan_.geometry.page_tokens;
    std::int64_t keep = held > 0 ? (held - 1) / P * P : 0;
    baseline_.truncate(slot, keep);
    live_.touch(s);
    return keep;
  }
  /// full_kv: the largest first chunk admission checks (the replay's `prefill_chunk`, at most
  /// its `step_token_budget`); default 8192.
  void set_scheduled_chunk(std::int64_t tokens) { scheduled_chunk_ = std::max<std::int64_t>(1, tokens); }

  /// unified_nonuniform: true admits on the first scheduled chunk as full_kv (vLLM v1) does, later
  /// chunks allocating as they are scheduled (and preempting when they do not fit); false (the
  /// default here) needs the whole uncompressed prompt free at admission.
  void set_chunk_admission(bool on) { chunk_admission_ = on; }
  [[nodiscard]] bool chunk_admission() const noexcept { return chunk_admission_; }

  /// Admission. unified_nonuniform: by default, as vLLM with a full-prompt check (and the
  /// reference implementation) does it, the uncompressed prompt must fit in the free pages now;
  /// with `set_chunk_admission(true)` only its first scheduled chunk. full_kv: as vLLM v1, only
  /// the first scheduled chunk (`scheduled_chunk` tokens at most) must fit; later chunks allocate
  /// as they are scheduled. Nothing is reserved.
  bool start_turn(std::int32_t s,
                  std::int64_t,
                  std::int64_t prompt,
                  std::int64_t,
                  std::int64_t headroom_tokens) override {
    auto& slot            = slots_[static_cast<std::size_t>(s)];
    bool const compressed = mode_ == unified_mode::compressed_reclaim;
    if (!(compressed && config_.estimate) &&
        (idle_kv_is_prefix_cache() || (compressed && chunk_admission_)))
      prompt = std::min(prompt, scheduled_chunk_);
    std::int64_t need = compressed && config_.estimate
                            ? estimated_pages(slot, prompt, headroom_tokens)
                            : uncompressed_pages(slot, prompt, headroom_tokens);
    if (need > baseline_.pool().available_pages()) return false;
    if (slot < 0) {
      auto got = baseline_.try_admit();
      if (!got) return false;
      slot = *got;
    }
    return true;
  }

  bool prefill_chunk(std::int32_t s, std::int64_t tokens) override {
    std::int32_t slot = slots_[static_cast<std::size_t>(s)];
    if (own_) {  // each compressed head keeps this input's own retention
      std::int64_t seen = baseline_.seq_tokens(slot) + tokens;
      for (std::int32_t i = 0; i < static_cast<std::int32_t>(kept_.size()); ++i) {
        std::int32_t l = i / plan_.num_kv_heads, h = i % plan_.num_kv_heads;
        std::int64_t cand = baseline_.head_len(slot, l, h) + tokens;
        auto const& rule  = plan_.rules[static_cast<std::size_t>(i)];
        kept_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(
            rule.kind == layer_kind::compressed
                ? own_->need(s, i, seen, cand)
                : std::min(retained_tokens(rule, seen), cand));
      }
    }
    if (!baseline_.prefill_chunk(slot, tokens, own_ ? kept_.data() : nullptr)) return false;
    live_.touch(s);
    return true;
  }

  bool decode(std::vector<std::int32_t> const& sessions) override {
    batch_.clear();
    for (auto s : sessions) batch_.push_back(slots_[static_cast<std::size_t>(s)]);
    if (!baseline_.decode_step(batch_.data(), batch_.size())) return false;
    for (auto s : sessions) live_.touch(s);
    return true;
  }

  void end_turn(std::int32_t) override {}

  void release(std::int32_t s) override {
    auto& slot = slots_[static_cast<std::size_t>(s)];
    if (slot < 0) return;
    baseline_.free(slot);
    slot = -1;
    live_.clear(s);
  }

  [[nodiscard]] policy_memory memory() const override {
    update();
    policy_memory m;
    m.allocated_bytes = static_cast<double>(baseline_.pool().used_pages()) *
                        static_cast<double>(baseline_.page_bytes());
    m.live_bytes  = live_.total();
    m.reclaim_ops = baseline_.stats().reclaim_ops;
    return m;
  }
  [[nodiscard]] double capacity_bytes() const override {
    return static_cast<double>(baseline_.pool().arena_bytes());
  }
  /// Whole layer-wide pages held: a decode step reads every head up to the layer's longest one.
  [[nodiscard]] double kv_bytes_read_padded(std::int32_t s) const override {
    return static_cast<double>(baseline_.pages_held(slots_[static_cast<std::size_t>(s)])) *
           static_cast<double>(baseline_.page_bytes());
  }
  /// True when each input keeps its own retention (not Tangram's padded budgets).
  [[nodiscard]] bool own_retention() const noexcept { return own_ != nullptr; }

  /// The baseline, for tests that check the replay's accounting.
  [[nodiscard]] unified_paging_baseline const& baseline() const { return baseline_; }

 private:
  static std::int64_t pages_for(static_plan const& plan, double kv_bytes) {
    return pool_pages(kv_bytes, unified_paging_baseline::layer_geometry(plan).page_bytes());
  }
  static static_plan layout(static_plan const& plan, unified_policy_options const& o) {
    return o.per_head ? per_head_plan(plan) : plan;
  }
  // Pages admission needs for `prompt` more uncompressed tokens in every page table, plus the
  // headroom, less the pages held.
  [[nodiscard]] std::int64_t uncompressed_pages(std::int32_t slot,
                                                std::int64_t prompt,
                                                std::int64_t headroom) const {
    std::int32_t P    = plan_.geometry.page_tokens;
    std::int64_t need = 0;
    for (std::int32_t l = 0; l < plan_.num_layers; ++l) {
      std::int64_t longest = 0, held = 0;
      if (slot >= 0) {
        longest = baseline_.longest(slot, l);
        held    = baseline_.n_pages(slot, l);
      }
      need +=
          std::max<std::int64_t>(0, ceil_div(longest + prompt, P) - held) + ceil_div(headroom, P);
    }
    return need;
  }
  // Pages admission needs under `unified_policy_options::estimate`: per page table, the larger of
  // the prompt's estimated compressed length and the length before its last chunk plus that
  // chunk (the chunk is held whole until its eviction), less the pages held, plus the headroom.
  [[nodiscard]] std::int64_t estimated_pages(std::int32_t slot,
                                             std::int64_t prompt,
                                             std::int64_t headroom) const {
    std::int32_t P    = plan_.geometry.page_tokens;
    std::int64_t seen = slot >= 0 ? baseline_.seq_tokens(slot) : 0, n = seen + prompt;
    std::int64_t c = std::min(prompt, scheduled_chunk_), need = 0;
    auto est = [&](head_rule const& rule, std::int64_t tokens) {
      return rule.kind == layer_kind::compressed ? config_.estimate->per_head(tokens)
                                                 : retained_tokens(rule, tokens);
    };
    for (std::int32_t l = 0; l < plan_.num_layers; ++l) {
      std::int64_t longest = 0, held = 0, most = 0;
      if (slot >= 0) {
        longest = baseline_.longest(slot, l);
        held    = baseline_.n_pages(slot, l);
      }
      for (std::int32_t h = 0; h < plan_.num_kv_heads; ++h) {
        auto const& rule = plan_.rules[static_cast<std::size_t>(l * plan_.num_kv_heads + h)];
        most             = std::max({most, est(rule, n), std::max(est(rule, n - c), longest) + c});
      }
      need += std::max<std::int64_t>(0, ceil_div(std::min(most, longest + prompt), P) - held) +
              ceil_div(headroom, P);
    }
    return need;
  }
  [[nodiscard]] std::int64_t held_tokens(std::int32_t s) const override {
    std::int32_t slot = slots_[static_cast<std::size_t>(s)];
    return sum_heads(
        [&](std::int32_t l, std::int32_t h) { return baseline_.head_len(slot, l, h); });
  }

  unified_mode mode_;
  unified_policy_options config_;
  std::int64_t scheduled_chunk_ = 8192;
  bool vllm_v1_                 = true;
  bool block_eviction_          = false;
  bool chunk_admission_         = false;
  simulated_memory_resource resource_;
  unified_paging_baseline baseline_;
  std::vector<std::int32_t> slots_;
  std::vector<std::int32_t> batch_;
  std::shared_ptr<retention_needs const> own_;  ///< null: the plan's padded budgets
  std::vector<std::int32_t> kept_;              ///< scratch: [layer * H + head]
};

}  // namespace tangram::sim
