// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/cost_model.hpp
 * @brief An explicit roofline cost model for the serving replay. Every time it produces is
 * MODELLED, not measured: decode is bandwidth-bound, prefill compute-bound.
 *
 *   decode step  = (active weight bytes + KV bytes read) / HBM bandwidth
 *   prefill      = (2 * active parameters * tokens + attention FLOPs) / peak FLOP/s
 *   attention    = 4 * query heads * head dim * layers * tokens * (tokens / 2 + past tokens)
 *   engine step  = decode step (if any sequence decodes) + prefill of the step's chunks
 *                  + HBM traffic a policy moves outside the forward pass (an unfused eviction)
 *                  + what `step_charges` adds per policy (all off by default: a pure roofline)
 *
 * `step_charges` are the costs a roofline misses (reclamation, padded reads, decode skew,
 * re-planning, launch overhead); their values and sources are in eval/sim/serving_costs.hpp.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/model/model_spec.hpp"

namespace tangram::sim {

/// @brief The accelerator the replay models (defaults: one H200 SXM).
struct gpu_spec {
  std::string name       = "H200";
  double memory_bytes    = 141e9;   ///< HBM capacity
  double usable_fraction = 0.90;    ///< share an engine may use (vLLM's gpu_memory_utilization)
  double hbm_bytes_per_s = 4.8e12;  ///< peak HBM bandwidth
  double peak_flops      = 989e12;  ///< dense bf16 tensor-core peak
  /// Host link, each direction: offloaded KV reloaded, sessions parked and restored
  /// (eval/sim/gpu_presets.hpp gives each preset's figure and its source).
  double host_link_bytes_per_s = 55e9;

  /// Bytes left for the KV cache: usable memory minus the model's weights.
  [[nodiscard]] double kv_budget_bytes(model_spec const& m) const {
    return memory_bytes * usable_fraction - m.weight_bytes;
  }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(memory_bytes > 0 && std::isfinite(memory_bytes),
                    invalid_argument,
                    "gpu.memory_bytes: must be > 0, got ",
                    memory_bytes);
    TANGRAM_EXPECTS(usable_fraction > 0 && usable_fraction <= 1,
                    invalid_argument,
                    "gpu.usable_fraction: must be in (0, 1], got ",
                    usable_fraction);
    TANGRAM_EXPECTS(hbm_bytes_per_s > 0 && std::isfinite(hbm_bytes_per_s),
                    invalid_argument,
                    "gpu.hbm_bytes_per_s: must be > 0, got ",
                    hbm_bytes_per_s);
    TANGRAM_EXPECTS(peak_flops > 0 && std::isfinite(peak_flops),
                    invalid_argument,
                    "gpu.peak_flops: must be > 0, got ",
                    peak_flops);
    TANGRAM_EXPECTS(host_link_bytes_per_s > 0 && std::isfinite(host_link_bytes_per_s),
                    invalid_argument,
                    "gpu.host_link_bytes_per_s: must be > 0, got ",
                    host_link_bytes_per_s);
  }
};

/**
 * @brief A decode skew measured at several batch sizes (eval/split_imbalance.hpp): a step that
 * decodes `n` requests pays the skew measured at the largest measured batch <= n (the smallest
 * measured batch when n is below it). Empty: no curve.
 */
struct skew_curve {
  std::vector<std::int32_t> batch;  ///< ascending, >= 1
  std::vector<double> skew;         ///< one per batch, >= 1

  [[nodiscard]] bool empty() const { return batch.empty(); }
  /// The skew a step of `n` decoding requests pays.
  [[nodiscard]] double at(std::int64_t n) const {
    std::size_t i = 0;
    while (i + 1 < batch.size() && batch[i + 1] <= n) ++i;
    return skew[i];
  }
  /// @throw invalid_argument naming `field` and the bad entry.
  void validate(char const* field) const {
    TANGRAM_EXPECTS(batch.size() == skew.size(), invalid_argument, field, ": ", batch.size(), " batch sizes but ",
                    skew.size(), " skews");
    for (std::size_t i = 0; i < batch.size(); ++i) {
      TANGRAM_EXPECTS(batch[i] >= 1 && (i == 0 || batch[i] > batch[i - 1]), invalid_argument, field, ".batch[", i,
                      "]: must be >= 1 and ascending, got ", batch[i]);
      TANGRAM_EXPECTS(skew[i] >= 1 && std::isfinite(skew[i]), invalid_argument, field, ".skew[", i,
                      "]: must be >= 1, got ", skew[i]);
    }
  }
  friend bool operator==(skew_curve const& a, skew_curve const& b) { return a.batch == b.batch && a.skew == b.skew; }
};

/// @brief How a policy that balances decode per step pays for its planning (serving_costs.hpp).
enum class replan_mode : std::uint8_t {
  fraction,    ///< `replan_fraction` of the decode step (the paper's figure)
  planner,     ///< a measured planner's host time for the step's sequences, serialised
  overlapped,  ///< the same, hidden behind the previous step: only what exceeds it is charged
};

constexpr std::string_view to_string(replan_mode m) noexcept {
  return m == replan_mode::fraction  ? "fraction"
         : m == replan_mode::planner ? "planner"
                                     : "overlapped";
}

/**
 * @brief What one policy pays per engine step beyond the roofline (modelled). The defaults charge
 * nothing, so `replay` without charges is the plain roofline.
 */
struct step_charges {
  double reclaim_s_per_page = 0;  ///< per page freed right after an eviction (reclamation)
  /// Reclamation as a fraction of the prefill time of every chunk that reclaimed pages.
  double reclaim_prefill_fraction = 0;
  bool padded_reads               = false;  ///< decode reads whole pages (padding included)
  double decode_skew              = 1.0;    ///< decode attention time x this (split load imbalance)
  /// When not empty, the skew by the step's decode batch size, instead of `decode_skew`.
  skew_curve decode_skew_by_batch;
  replan_mode replan     = replan_mode::fraction;
  double replan_fraction = 0;  ///< per-step re-planning, fraction of the decode step
  /// Planned sequences per decoding request (replan_mode::planner and overlapped); 0: no planner.
  std::int32_t replan_sequences_per_request = 0;
  double step_overhead_s                    = 0;  ///< fixed per engine step (launches, scheduling)
  /// Each step that decodes also pays one `balance_decode_splits` launch at its decode batch
  /// (`split_balance_s`, measured): Tangram's per-step balanced split map.
  bool balanced_split = false;
  /// Adds the wall time measured inside the policy's calls of each step (host control plane,
  /// not overlapped with the GPU). Measured, so a run is no longer deterministic: off by default.
  bool control_plane = false;

  /// The skew a step that decodes `n` requests pays.
  [[nodiscard]] double skew_for(std::int64_t n) const {
    return decode_skew_by_batch.empty() ? decode_skew : decode_skew_by_batch.at(n);
  }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(reclaim_s_per_page >= 0 && std::isfinite(reclaim_s_per_page),
                    invalid_argument,
                    "charges.reclaim_s_per_page: must be >= 0, got ",
                    reclaim_s_per_page);
    TANGRAM_EXPECTS(reclaim_prefill_fraction >= 0 && std::isfinite(reclaim_prefill_fraction),
                    invalid_argument,
                    "charges.reclaim_prefill_fraction: must be >= 0, got ",
                    reclaim_prefill_fraction);
    TANGRAM_EXPECTS(decode_skew >= 1 && std::isfinite(decode_skew),
                    invalid_argument,
                    "charges.decode_skew: must be >= 1, got ",
                    decode_skew);
    decode_skew_by_batch.validate("charges.decode_skew_by_batch");
    TANGRAM_EXPECTS(replan_fraction >= 0 && std::isfinite(replan_fraction),
                    invalid_argument,
                    "charges.replan_fraction: must be >= 0, got ",
                    replan_fraction);
    TANGRAM_EXPECTS(replan_sequences_per_request >= 0,
                    invalid_argument,
                    "charges.replan_sequences_per_request: must be >= 0, got ",
                    replan_sequences_per_request);
    TANGRAM_EXPECTS(step_overhead_s >= 0 && std::isfinite(step_overhead_s),
                    invalid_argument,
                    "charges.step_overhead_s: must be >= 0, got ",
                    step_overhead_s);
  }
  friend bool operator==(step_charges const& a, step_charges const& b) {
    return a.reclaim_s_per_page == b.reclaim_s_per_page &&
           a.reclaim_prefill_fraction == b.reclaim_prefill_fraction &&
           a.padded_reads == b.padded_reads && a.decode_skew == b.decode_skew &&
           a.decode_skew_by_batch == b.decode_skew_by_batch && a.replan == b.replan &&
           a.replan_fraction == b.replan_fraction &&
           a.replan_sequences_per_request == b.replan_sequences_per_request &&
           a.step_overhead_s == b.step_overhead_s && a.balanced_split == b.balanced_split &&
           a.control_plane == b.control_plane;
  }
};

/// @brief Roofline times for one model on one GPU (modelled).
class cost_model {
 public:
  cost_model(model_spec model, gpu_spec gpu) : model_(std::move(model)), gpu_(std::move(gpu)) {
    gpu_.validate();
  }

  [[nodiscard]] gpu_spec const& gpu() const { return gpu_; }
  [[nodiscard]] model_spec const& model() const { return model_; }

  /// One decode step reading `kv_bytes` of KV cache.
  [[nodiscard]] double decode_step_s(double kv_bytes) const {
    return (model_.active_weight_bytes + kv_bytes) / gpu_.hbm_bytes_per_s;
  }

  /// Reading the active weights once (the weight part of a decode step).
  [[nodiscard]] double weights_s() const { return model_.active_weight_bytes / gpu_.hbm_bytes_per_s; }

  /// Moving `bytes` through HBM (read or written) at peak bandwidth.
  [[nodiscard]] double hbm_s(double bytes) const { return bytes / gpu_.hbm_bytes_per_s; }

  /// Moving `bytes` over the host link (one direction).
  [[nodiscard]] double host_link_s(double bytes) const {
    return bytes / gpu_.host_link_bytes_per_s;
  }

  /// Prefill of `tokens` new tokens on top of `past` tokens already in the cache.
  [[nodiscard]] double prefill_s(std::int64_t tokens, std::int64_t past) const {
    auto n        = static_cast<double>(tokens);
    double linear = 2.0 * model_.active_parameters * n;
    double attn   = 4.0 * model_.num_query_heads * model_.head_dim * model_.num_layers * n *
                  (n / 2.0 + static_cast<double>(past));
    return (linear + attn) / gpu_.peak_flops;
  }

 private:
  model_spec model_;
  gpu_spec gpu_;
};

}  // namespace tangram::sim
