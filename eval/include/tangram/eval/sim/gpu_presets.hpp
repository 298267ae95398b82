// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/gpu_presets.hpp
 * @brief Accelerators `tangram simulate --gpu` names, with vendor figures and the scheduling
 * limits vLLM v1 picks by default on each (online serving).
 *
 * Figures (dense, no sparsity; one GPU of the SXM/HGX board):
 * - H100 80GB SXM: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s bf16 (the datasheet's 1,979 is with
 *   sparsity). NVIDIA H100 datasheet, www.nvidia.com/en-us/data-center/h100/; checked against
 *   glennklockwood.com/garden/processors/h100 (989.4 matrix bf16).
 * - H200 141GB SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s bf16 (same GH100 compute as H100).
 *   www.nvidia.com/en-us/data-center/h200/.
 * - B200 (HGX, 1000 W): 180 GB HBM3e exposed per GPU (192 GB on the package; DGX/HGX B200
 *   list 1,440 GB for 8 GPUs), 8 TB/s, 2,250 TFLOP/s bf16 dense (4,500 with sparsity).
 *   www.nvidia.com/en-us/data-center/hgx/ and the DGX B200 datasheet; checked against
 *   glennklockwood.com/garden/processors/B200 (HGX 1000 W: bf16 2250 matrix).
 * - A100 80GB SXM: 80 GB HBM2e, 2.039 TB/s, 312 TFLOP/s bf16 (624 with sparsity). NVIDIA A100
 *   datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf).
 *
 * SM counts (the split map's CTAs): H100 SXM and H200 132 (GH100 as shipped), B200 148,
 * A100 108. NVIDIA's H100/H200 and A100 architecture whitepapers; B200:
 * the Blackwell architecture technical brief.
 *
 * Host link (KV offloaded to host memory and reloaded, sessions parked and restored;
 * `gpu_spec::host_link_bytes_per_s`), achievable per direction with pinned host memory and large
 * copies: H100, H200 and B200 on PCIe Gen5 x16, 55 GB/s (NVIDIA nvbandwidth's
 * host_to_device_memcpy_ce example output, 55.6 GB/s, of the 64 GB/s per direction that "PCIe
 * Gen5: 128 GB/s" in NVIDIA's H100 and H200 datasheets gives; github.com/NVIDIA/nvbandwidth);
 * A100 on PCIe Gen4 x16, half of it, 27.5 GB/s (PCIe 4.0 signals at half the 5.0 rate). One
 * figure for every policy that moves KV over the link (full_kv_offload's reloads, Tangram's parks).
 *
 * vLLM v1 defaults (vllm/engine/arg_utils.py, EngineArgs batch defaults, OpenAI API server
 * usage context): on GPUs with at least 70 GiB that are not A100, max_num_batched_tokens 8192
 * and max_num_seqs 1024; otherwise (A100 included) 2048 and 256.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tangram/eval/sim/cost_model.hpp"

namespace tangram::sim {

/// @brief One accelerator preset: its figures and vLLM v1's default scheduling limits on it.
struct gpu_preset {
  std::string key;  ///< the --gpu value
  gpu_spec gpu;     ///< name, memory, bandwidth, peak, host link (usable_fraction left at 0.90)
  std::int64_t max_num_batched_tokens = 8192;  ///< vLLM v1 default (online serving)
  std::int32_t max_num_seqs           = 1024;  ///< vLLM v1 default (online serving)
  std::int32_t sm_count               = 132;   ///< SMs (the split map's CTAs: sm_count x ctas_per_sm)
};

/// Every preset, in the order `--help` lists them.
inline std::vector<gpu_preset> const& gpu_presets() {
  static std::vector<gpu_preset> const all = [] {
    auto make = [](char const* key,
                   char const* name,
                   double gb,
                   double tbps,
                   double tflops,
                   std::int64_t tokens,
                   std::int32_t seqs,
                   std::int32_t sms,
                   double link_gbps) {
      gpu_preset p;
      p.key                       = key;
      p.gpu.name                  = name;
      p.gpu.memory_bytes          = gb * 1e9;
      p.gpu.hbm_bytes_per_s       = tbps * 1e12;
      p.gpu.peak_flops            = tflops * 1e12;
      p.gpu.host_link_bytes_per_s = link_gbps * 1e9;
      p.max_num_batched_tokens    = tokens;
      p.max_num_seqs              = seqs;
      p.sm_count                  = sms;
      return p;
    };
    return std::vector<gpu_preset>{
        make("h200", "H200 141GB SXM", 141, 4.8, 989, 8192, 1024, 132, 55),
        make("h100", "H100 80GB SXM", 80, 3.35, 989, 8192, 1024, 132, 55),
        make("b200", "B200 180GB HGX", 180, 8.0, 2250, 8192, 1024, 148, 55),
        make("a100", "A100 80GB SXM", 80, 2.039, 312, 2048, 256, 108, 27.5),
    };
  }();
  return all;
}

/// The preset named `key` (h200, h100, b200, a100), or none.
inline std::optional<gpu_preset> find_gpu_preset(std::string const& key) {
  for (auto const& p : gpu_presets())
    if (p.key == key) return p;
  return std::nullopt;
}

}  // namespace tangram::sim
