// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction_common.cuh
 * @brief What every eviction kernel shares (kernels/detail/eviction.cuh, snapkv_mma.cuh): the
 * device arguments of a launch, the (request, KV head) a CTA resolves with `plan_eviction`, and
 * where a candidate's K or V row lives.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// Everything an eviction launch needs on the device (passed by value).
struct eviction_args {
  eviction_params p;
  std::uint32_t* keys         = nullptr;  ///< [heads][max_candidates]
  float* raw                  = nullptr;  ///< [heads][max_candidates] built-in raw scores
  float2* stats               = nullptr;  ///< [heads][key_tiles][nq_max]
  float2* norm                = nullptr;  ///< [heads][nq_max]
  std::int32_t key_tiles      = 0;        ///< ceil(max_candidates / snapkv_key_tile(head_dim))
  std::int32_t nq_max         = 0;        ///< obs_window * group
  float scale2                = 0.f;      ///< sm_scale * log2(e)
  std::uint32_t* select_hist  = nullptr;  ///< [heads][select_radix_bins]
  std::uint32_t* select_state = nullptr;  ///< [heads][select_state_words]
  std::int32_t slices         = 0;        ///< ceil(max_candidates / select_slice)
};

/// The (request, KV head) of a CTA, its cursor and its plan.
struct eviction_head {
  std::int32_t r = 0, h = 0;
  std::int64_t rh = 0;
  head_cursor cur;
  eviction_plan e;
};

__device__ __forceinline__ eviction_head resolve_head(eviction_args const& a, std::int64_t rh) {
  eviction_head x;
  x.rh  = rh;
  x.r   = static_cast<std::int32_t>(rh / a.p.kv.num_kv_heads);
  x.h   = static_cast<std::int32_t>(rh % a.p.kv.num_kv_heads);
  x.cur = make_head_cursor(a.p.kv, x.r, a.p.layer, x.h);
  x.e   = plan_eviction(a.p, x.cur, x.r, x.h);
  return x;
}

/// K (kv == 0) or V of candidate `i`: held token `i` (a growing column) or chunk token `i - len`.
template <class T>
__device__ __forceinline__ const T* candidate_ptr(eviction_args const& a,
                                                  eviction_head const& x,
                                                  std::int64_t i,
                                                  int kv) {
  if (i < x.e.len) return x.cur.ptr_at_position<T>(static_cast<std::int32_t>(i), kv);
  std::int64_t row = a.p.chunk_indptr[x.r] + (i - x.e.len);
  const void* base = kv == 0 ? a.p.chunk_k : a.p.chunk_v;
  return static_cast<const T*>(base) +
         (row * a.p.kv.num_kv_heads + x.h) * static_cast<std::int64_t>(a.p.kv.geometry.head_dim);
}

/// The softmax normaliser of window query `qq` (window-major, group-minor) of head `x` as (max,
/// sum) in base 2: the statistics pass's, or the prefill's log-sum-exp as (lse log2(e), 1).
__device__ __forceinline__ float2 snapkv_norm(eviction_args const& a,
                                              eviction_head const& x,
                                              int qq,
                                              std::int64_t w) {
  if (a.p.q_lse == nullptr) return a.norm[x.rh * a.nq_max + qq];
  const int G            = a.p.group;
  const std::int64_t row = a.p.chunk_indptr[x.r] + (x.e.chunk - w) + qq / G;
  return make_float2(
      a.p.q_lse[row * a.p.kv.num_kv_heads * G + x.h * G + qq % G] * log2e, 1.f);
}

}  // namespace tangram::detail
