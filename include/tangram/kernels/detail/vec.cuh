// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/vec.cuh
 * @brief Device helpers shared by the kernels: 16-byte vector loads widened to float, runtime-dtype
 * scalar access, asynchronous global-to-shared copies, numbered barrier sites, the launch error
 * check and the launch policy the launchers are written against.
 *
 * Host emulation (test/emu): with TANGRAM_EMULATION defined, the kernel bodies compile with a
 * plain C++ compiler against the emulator's CUDA shims, which run one fiber per CUDA thread. Only
 * three things differ from the nvcc build, all in this file: dynamic shared memory comes from the
 * emulator, the numbered barrier and pipeline-wait sites consult the emulator's mutation switch
 * (so a test can prove that removing one is detected), and device checks report to the emulator.
 * In every nvcc build they are exactly `extern __shared__`, `__syncthreads()`, the given wait
 * depth and (debug builds only) `assert`.
 */
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline.h>
#include <cuda_runtime_api.h>

#include <cassert>
#include <cstdint>
#include <type_traits>

#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/numeric.hpp"

#if defined(TANGRAM_EMULATION)
// Provided by the emulator (test/emu/simt).
namespace tangram::emu {
unsigned char* dynamic_smem();  ///< the running block's dynamic shared memory
int mutation();                 ///< the sync_site the running test disables (0: none)
[[noreturn]] void device_check_failed(const char* condition, const char* what);
}  // namespace tangram::emu
/// The block's dynamic shared memory (`extern __shared__` on the GPU).
#define TANGRAM_DYNAMIC_SMEM(name) unsigned char* name = ::tangram::emu::dynamic_smem()
/// A device-side invariant: a test failure in the emulator, an assert in nvcc debug builds.
#define TANGRAM_DEVICE_CHECK(cond, what) \
  ((cond) ? (void)0 : ::tangram::emu::device_check_failed(#cond, what))
#else
#define TANGRAM_DYNAMIC_SMEM(name)       extern __shared__ __align__(16) unsigned char name[]
#define TANGRAM_DEVICE_CHECK(cond, what) assert((cond) && what)
#endif

namespace tangram::detail {

/// Widens the T values packed in 16 bytes to float (one overload per storage type).
__device__ __forceinline__ void widen16(uint4 u, float (&f)[4], float) {
  f[0] = __uint_as_float(u.x);
  f[1] = __uint_as_float(u.y);
  f[2] = __uint_as_float(u.z);
  f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void widen16(uint4 u, float (&f)[8], bfloat16) {
  unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i]     = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void widen16(uint4 u, float (&f)[8], float16) {
  unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h    = *reinterpret_cast<__half2*>(&w[i]);
    float2 x     = __half22float2(h);
    f[2 * i]     = x.x;
    f[2 * i + 1] = x.y;
  }
}

/// One element of type T widened to float (device).
__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ float widen(bfloat16 x) {
  return __uint_as_float(static_cast<unsigned>(x.bits) << 16);
}
__device__ __forceinline__ float widen(float16 x) {
  return __half2float(__ushort_as_half(x.bits));
}
/// fp8 through binary16 with the CUDA conversions (`cvt.rn.f16x2.e4m3x2` / `.e5m2x2` on sm_89+,
/// one instruction per two values, where core/numeric.hpp's software widening costs several per
/// value). Every e4m3 and e5m2 value is a binary16 value, so the result is exactly the float
/// core/numeric.hpp's `to_float` (the reference's and the append's conversion) gives; NaN stays
/// NaN. The K/V scales (kv_scales.hpp) are not applied here: each kernel folds them once.
template <class F8>
struct fp8_kind;
template <>
struct fp8_kind<float8_e4m3> {
  static constexpr __nv_fp8_interpretation_t value = __NV_E4M3;
};
template <>
struct fp8_kind<float8_e5m2> {
  static constexpr __nv_fp8_interpretation_t value = __NV_E5M2;
};
__device__ __forceinline__ float widen(float8_e4m3 x) {
  return __half2float(__ushort_as_half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E4M3).x));
}
__device__ __forceinline__ float widen(float8_e5m2 x) {
  return __half2float(__ushort_as_half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E5M2).x));
}

/// Widens the `4 * Words` fp8 values packed in `w` (lowest byte first, as in memory) to float,
/// two per conversion.
template <class F8, int Words>
__device__ __forceinline__ void widen_fp8_words(const unsigned (&w)[Words], float* f) {
  static_assert(sizeof(F8) == 1, "widen_fp8_words: one-byte storage types only");
#pragma unroll
  for (int i = 0; i < 2 * Words; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), fp8_kind<F8>::value);
    f[2 * i]     = __half2float(__ushort_as_half(h.x));
    f[2 * i + 1] = __half2float(__ushort_as_half(h.y));
  }
}
__device__ __forceinline__ void widen16(uint4 u, float (&f)[16], float8_e4m3) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
  widen_fp8_words<float8_e4m3>(w, f);
}
__device__ __forceinline__ void widen16(uint4 u, float (&f)[16], float8_e5m2) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
  widen_fp8_words<float8_e5m2>(w, f);
}

/// Loads N consecutive T values and widens them to float: whole 16-byte vectors when
/// N * sizeof(T) is a multiple of 16 (`p` 16-byte aligned; global or shared memory), else one
/// 8-byte vector of 8 fp8 values (`p` 8-byte aligned: the decode kernel's lane slice for fp8).
template <class T, int N>
__device__ __forceinline__ void load_widen(const T* p, float (&out)[N]) {
  constexpr int bytes = N * static_cast<int>(sizeof(T));
  if constexpr (bytes % 16 != 0) {
    static_assert(sizeof(T) == 1 && bytes == 8,
                  "load_widen: N * sizeof(T) must be a multiple of 16 bytes (or 8 fp8 values)");
    const uint2 u       = *reinterpret_cast<const uint2*>(p);
    const unsigned w[2] = {u.x, u.y};
    widen_fp8_words<T>(w, out);
  } else {
    constexpr int per = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < N / per; ++c) {
      uint4 u = reinterpret_cast<const uint4*>(p)[c];
      float f[per];
      widen16(u, f, T{});
#pragma unroll
      for (int i = 0; i < per; ++i) out[c * per + i] = f[i];
    }
  }
}

/// Element `i` of an array of runtime dtype `t` (f32, f16 or bf16) as float.
__device__ __forceinline__ float load_scalar(const void* base, dtype t, std::int64_t i) {
  switch (t) {
    case dtype::f16:
      return widen(static_cast<const float16*>(base)[i]);
    case dtype::bf16:
      return widen(static_cast<const bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

/// Element `j` of the 16-bit or f32 values packed in `w` (lowest address first), widened.
template <class S, int Words>
__device__ __forceinline__ float widen_word_element(const unsigned (&w)[Words], int j) {
  if constexpr (std::is_same_v<S, float>) {
    return __uint_as_float(w[j]);
  } else {
    static_assert(sizeof(S) == 2, "widen_word_element: f32, f16 or bf16");
    S x;
    x.bits = static_cast<std::uint16_t>(w[j / 2] >> (16 * (j % 2)));
    return widen(x);
  }
}

/// Loads the N consecutive S values at `p`, aligned to min(N * sizeof(S), 16) bytes, in vectors
/// of that size and widens them to float.
template <class S, int N>
__device__ __forceinline__ void load_run_vector(const S* p, float (&out)[N]) {
  constexpr int bytes = N * static_cast<int>(sizeof(S));
  constexpr int width = bytes < 16 ? bytes : 16;  ///< bytes per vector load
  static_assert(bytes % 4 == 0 && (width & (width - 1)) == 0 && bytes % width == 0,
                "load_run: N * sizeof(S) must be 4, 8 or a multiple of 16 bytes");
  unsigned w[bytes / 4];
#pragma unroll
  for (int c = 0; c < bytes / width; ++c) {
    if constexpr (width == 16) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[c];
      w[4 * c]      = u.x;
      w[4 * c + 1]  = u.y;
      w[4 * c + 2]  = u.z;
      w[4 * c + 3]  = u.w;
    } else if constexpr (width == 8) {
      const uint2 u = reinterpret_cast<const uint2*>(p)[c];
      w[2 * c]      = u.x;
      w[2 * c + 1]  = u.y;
    } else {
      w[c] = reinterpret_cast<const unsigned*>(p)[c];
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = widen_word_element<S>(w, j);
}

/// Runs r < `rows` of N consecutive S values at `p + r * stride`, widened to float (0 for the
/// rows from `rows` to R): vector loads of min(N * sizeof(S), 16) bytes when every run is aligned
/// to that size (`p` and the stride), else one element at a time (a row stride or offset that
/// is not a multiple of the vector: the same values either way). One branch for all R runs.
template <class S, int R, int N>
__device__ __forceinline__ void load_runs_typed(const S* p,
                                                std::int64_t stride,
                                                int rows,
                                                float (&out)[R][N]) {
  constexpr int bytes = N * static_cast<int>(sizeof(S));
  constexpr int width = bytes < 16 ? bytes : 16;
  if (reinterpret_cast<std::uintptr_t>(p) % width == 0 &&
      stride % (width / static_cast<int>(sizeof(S))) == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {
        load_run_vector(p + r * stride, out[r]);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) out[r][j] = 0.f;
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < N; ++j) out[r][j] = r < rows ? widen(p[r * stride + j]) : 0.f;
  }
}

/// load_runs_typed on an array of runtime dtype `t` (f32, f16 or bf16) from element `i`: the
/// dtype dispatched once for all runs (where load_scalar dispatches per element).
template <int R, int N>
__device__ __forceinline__ void load_runs(
    const void* base, dtype t, std::int64_t i, std::int64_t stride, int rows, float (&out)[R][N]) {
  switch (t) {
    case dtype::f16:
      load_runs_typed(static_cast<const float16*>(base) + i, stride, rows, out);
      break;
    case dtype::bf16:
      load_runs_typed(static_cast<const bfloat16*>(base) + i, stride, rows, out);
      break;
    default:
      load_runs_typed(static_cast<const float*>(base) + i, stride, rows, out);
      break;
  }
}

/// Elements `i` .. `i + N - 1` of an array of runtime dtype `t` as float (one run of load_runs).
template <int N>
__device__ __forceinline__ void load_run(const void* base,
                                         dtype t,
                                         std::int64_t i,
                                         float (&out)[N]) {
  float run[1][N];
  load_runs(base, t, i, 0, 1, run);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = run[0][j];
}

/// Stores `v` as element `i` of an array of runtime dtype `t` (f32, f16 or bf16), rounding to
/// nearest even exactly as the host conversions in core/numeric.hpp do.
__device__ __forceinline__ void store_scalar(void* base, dtype t, std::int64_t i, float v) {
  switch (t) {
    case dtype::f16:
      static_cast<float16*>(base)[i] = float16(v);
      break;
    case dtype::bf16:
      static_cast<bfloat16*>(base)[i] = bfloat16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
      break;
  }
}

/// Barrier and pipeline-wait sites that the emulator's mutation tests may weaken (test/emu).
enum class sync_site : int {
  none = 0,
  decode_tile_ready,   ///< decode: a stage's copies are visible to every thread
  decode_tile_wait,    ///< decode: cp.async wait for the stage about to be read
  compact_loaded,      ///< eviction compaction: every load of a batch precedes its stores
  snapkv_queries,      ///< SnapKV scoring: the query tile is in shared memory
  prefill_tile_ready,  ///< prefill: the K/V tile (and the queries) are in shared memory
  select_counted,      ///< top-k histogram: every key of the slice is counted before the flush
};

/// `__syncthreads()` at a numbered site.
__device__ __forceinline__ void sync_block(sync_site site) {
#if defined(TANGRAM_EMULATION)
  if (::tangram::emu::mutation() == static_cast<int>(site)) return;
#else
  (void)site;
#endif
  __syncthreads();
}

/// Asynchronous 16-byte global-to-shared copy (cp.async on sm_80+) that reads `src_bytes` (0 or
/// 16) and zero-fills the rest: the zero-fill is a register operand of the instruction, not a
/// branch; `gmem` must be a mapped address either way.
__device__ __forceinline__ void copy16_async_zfill(void* smem,
                                                   const void* gmem,
                                                   unsigned src_bytes) {
#if defined(TANGRAM_EMULATION) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
  __pipeline_memcpy_async(smem, gmem, 16, 16 - src_bytes);
#else
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
#endif
}

__device__ __forceinline__ void copy_async_commit() {
  __pipeline_commit();
}
/// Waits until at most `N` committed copy groups are still in flight (`site`: see sync_site).
template <int N>
__device__ __forceinline__ void copy_async_wait(sync_site site = sync_site::none) {
#if defined(TANGRAM_EMULATION)
  const bool weakened =
      site != sync_site::none && ::tangram::emu::mutation() == static_cast<int>(site);
  __pipeline_wait_prior(N + (weakened ? 1 : 0));
#else
  (void)site;
  __pipeline_wait_prior(N);
#endif
}

/**
 * Programmatic dependent launch (sm_90+), device side: waits until the grids this one depends
 * on have completed and their memory is visible (`griddepcontrol.wait`; returns at once when the
 * grid was launched without the attribute or nothing is in flight). A kernel launched with
 * `stream_launch::pdl` may run its prologue before this call, which must not read what the
 * previous kernel in the stream writes, nor write what it reads.
 */
__device__ __forceinline__ void grid_dependency_wait() {
#if !defined(TANGRAM_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/// Lets the next kernel in the stream, if launched with the PDL attribute, be scheduled once
/// every CTA of this grid has called this or exited (`griddepcontrol.launch_dependents`); it
/// still waits for this grid's completion in its own grid_dependency_wait.
__device__ __forceinline__ void grid_dependency_launch_dependents() {
#if !defined(TANGRAM_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/**
 * The launch policy of the nvcc build: `launch(kernel, grid, threads, smem_bytes, args...)`
 * enqueues `kernel<<<grid, threads, smem_bytes, stream>>>(args...)`, or with `pdl` the same
 * through cudaLaunchKernelEx with programmatic stream serialization allowed (the kernel may start
 * while the previous one in the stream finishes; see grid_dependency_wait). The launchers below
 * are written against a policy so that the emulator runs the same launch sequence with its own.
 * A failed launch is reported by cudaGetLastError, as for `<<<>>>`.
 */
struct stream_launch {
  cudaStream_t stream = nullptr;
  bool pdl            = false;
#if !defined(TANGRAM_EMULATION)
  template <class... P, class... A>
  void operator()(void (*kernel)(P...), dim3 grid, int threads, int smem, A const&... args) const {
    // The attribute only where the kernel's code has the wait: a build for an older
    // architecture JIT-compiled for sm_90 runs without griddepcontrol, so it must not overlap.
    cudaFuncAttributes fa{};
    bool overlap = pdl;
    if (overlap && cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
      (void)cudaGetLastError();  // a failed attribute query is not the launch's error
      overlap = false;
    }
    if (!overlap || fa.ptxVersion < 90) {
      kernel<<<grid, threads, smem, stream>>>(args...);
      return;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim          = grid;
    config.blockDim         = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<std::size_t>(smem);
    config.stream           = stream;
    config.attrs            = attr;
    config.numAttrs         = 1;
    (void)cudaLaunchKernelEx(&config, kernel, args...);
  }
#endif
};

/// Throws cuda_error naming `what` when the last launch failed (clears the error).
inline void check_launch(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TANGRAM_FAIL(cuda_error, what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

}  // namespace tangram::detail
