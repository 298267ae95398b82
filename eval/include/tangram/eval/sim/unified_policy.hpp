// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/unified_policy.hpp
 * @brief `unified_policy`: layer-wide pages (vLLM style), `full_kv` or non-uniform compression with
 * reclamation, or per-head pages (`unified_policy_options::per_head`); the file comment of
 * eval/sim/policies.hpp tells the three policies apart.
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

#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/live_accounting.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

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
        kept_(own_ ? plan.rules.size() : 0) {
    for (std::int32_t l = 0; l < plan_.num_layers; ++l)
      grows_.push_back(
          grows_with_context(plan_.rules.data() + static_cast<std::size_t>(l) * plan_.num_kv_heads,
                             static_cast<std::size_t>(plan_.num_kv_heads)));
    if (!own_) return;
    for (std::int32_t i = 0; i < static_cast<std::int32_t>(plan.rules.size()); ++i)
      if (plan.rules[static_cast<std::size_t>(i)].kind == layer_kind::compressed)
        own_heads_.push_back(i);
    own_cand_.resize(own_heads_.size());
    own_kept_.resize(own_heads_.size());
  }

  [[nodiscard]] std::string name() const override {
    if (!config_.name.empty()) return config_.name;
    return mode_ == unified_mode::full_kv ? "full_kv" : "unified_nonuniform";
  }
  /// Compressed with each input's own retention: the eviction chooses each head's length on the
  /// GPU and the host frees the tail pages beyond the layer's (per head: the head's) kept length.
  /// With the plan's static budgets instead (no retention given) the counts are known in advance.
  [[nodiscard]] bool kept_counts_from_gpu() const override { return own_ != nullptr; }
  /// counts_arrival::next_step: a chunk's tail pages stay held until its counts arrive.
  void begin_replay(counts_arrival counts) override {
    hold_tails_ = own_ != nullptr && counts == counts_arrival::next_step;
  }
  void counts_arrived(std::int32_t s) override {
    if (std::int32_t slot = slots_[static_cast<std::size_t>(s)]; slot >= 0)
      baseline_.release_tail(slot);
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
  void set_scheduled_chunk(std::int64_t tokens) {
    scheduled_chunk_ = std::max<std::int64_t>(1, tokens);
  }

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
    if (need > baseline_.available_pages()) return false;
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
      auto candidates   = [&](std::int32_t i) {
        return baseline_.head_len(slot, i / plan_.num_kv_heads, i % plan_.num_kv_heads) + tokens;
      };
      for (std::int32_t i = 0; i < static_cast<std::int32_t>(kept_.size()); ++i) {
        auto const& rule = plan_.rules[static_cast<std::size_t>(i)];
        if (rule.kind != layer_kind::compressed)
          kept_[static_cast<std::size_t>(i)] =
              static_cast<std::int32_t>(std::min(retained_tokens(rule, seen), candidates(i)));
      }
      for (std::size_t j = 0; j < own_heads_.size(); ++j) own_cand_[j] = candidates(own_heads_[j]);
      own_->fill(s, own_heads_.data(), own_heads_.size(), seen, own_cand_.data(), own_kept_.data());
      for (std::size_t j = 0; j < own_heads_.size(); ++j)
        kept_[static_cast<std::size_t>(own_heads_[j])] = static_cast<std::int32_t>(own_kept_[j]);
    }
    if (!baseline_.prefill_chunk(slot, tokens, own_ ? kept_.data() : nullptr, hold_tails_))
      return false;
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
    m.allocated_bytes =
        static_cast<double>(baseline_.pool().used_pages() + baseline_.held_tail_pages()) *
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
      need += std::max<std::int64_t>(0, ceil_div(longest + prompt, P) - held) +
              (grows_[static_cast<std::size_t>(l)] ? ceil_div(headroom, P) : 0);
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
              (grows_[static_cast<std::size_t>(l)] ? ceil_div(headroom, P) : 0);
    }
    return need;
  }
  [[nodiscard]] std::int64_t held_tokens(std::int32_t s) const override {
    std::int32_t slot = slots_[static_cast<std::size_t>(s)];
    return sum_heads(
        [&](std::int32_t l, std::int32_t h) { return baseline_.head_len(slot, l, h); });
  }

  unified_mode mode_;
  bool hold_tails_ = false;  ///< chunk tails held until their counts arrive (begin_replay)
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
  std::vector<bool> grows_;  ///< per page table: the continuation headroom applies (not all rings)
  std::vector<std::int32_t> own_heads_;            ///< the compressed heads (flat ids), fixed
  std::vector<std::int64_t> own_cand_, own_kept_;  ///< scratch: their candidates and kept counts
};

}  // namespace tangram::sim
