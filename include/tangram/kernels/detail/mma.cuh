// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/mma.cuh
 * @brief Warp-level tensor-core fragments: `mma.sync.aligned.m16n8k16` (bf16 / f16 inputs, f32
 * accumulate), `ldmatrix` (x4, plain and transposed), 16-bit pair packing and the fp8 -> f16
 * widening of 16 values (kernels/detail/decode_mma.cuh, snapkv_mma.cuh).
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16/.bf16): with
 * `g = lane / 4` and `t = lane % 4`, each 32-bit register holds two 16-bit elements, the lower
 * column (A) or row (B) in the low half:
 *   A (16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
 *                           a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9];
 *   B (16 x 8, "col"):      b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
 *   C, D (16 x 8, f32):     c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
 * `ldmatrix.x4`: lanes 8m..8m+7 give the row addresses of 8x8 matrix m (16 bytes per row); lane
 * l receives r[m] = M_m[l / 4][2(l % 4)..2(l % 4)+1], or with `.trans`
 * r[m] = (M_m[2(l % 4)][l / 4], M_m[2(l % 4)+1][l / 4]).
 *
 * In nvcc builds these are single instructions (inline PTX, sm_80+). Under TANGRAM_EMULATION
 * they call the emulator (test/emu/simt/warp_matrix.cpp), which performs the same warp-collective
 * operation on the lanes' registers with the layout above, so a kernel that assumes a wrong
 * layout fails its emulation tests.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "tangram/core/numeric.hpp"
#include "tangram/kernels/detail/vec.cuh"

#if defined(TANGRAM_EMULATION)
// Provided by the emulator (test/emu/simt/warp_matrix.cpp); `bf16` selects the input format.
namespace tangram::emu {
void mma_m16n8k16(bool bf16, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
void ldmatrix_x4(unsigned (&r)[4], const void* row, bool trans);
}  // namespace tangram::emu
#endif

namespace tangram::detail {

/// D = A B + D for one m16n8k16 tile of 16-bit T (bfloat16 or float16), f32 accumulate.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4],
                                             const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "mma_m16n8k16: bf16 or f16 inputs");
#if defined(TANGRAM_EMULATION)
  emu::mma_m16n8k16(std::is_same_v<T, bfloat16>, d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the tensor-core path needs sm_80 or newer
#endif
}

/// Four 8x8 matrices of 16-bit elements from shared memory (`row`: this lane's row address).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
#if defined(TANGRAM_EMULATION)
  emu::ldmatrix_x4(r, row, Trans);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

/// Two floats rounded to nearest even into one 32-bit register of T pairs (`lo` in the low half).
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(TANGRAM_EMULATION)
  unsigned d;
  if constexpr (std::is_same_v<T, bfloat16>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return static_cast<unsigned>(T(lo).bits) | (static_cast<unsigned>(T(hi).bits) << 16);
#endif
}

/// The two T values of a pair register widened to float (exact).
template <class T>
__device__ __forceinline__ void unpack2(unsigned v, float& lo, float& hi) {
  T l, h;
  l.bits = static_cast<std::uint16_t>(v & 0xffffu);
  h.bits = static_cast<std::uint16_t>(v >> 16);
  lo     = widen(l);
  hi     = widen(h);
}

/**
 * Splits `x` into T pairs `hi + lo` (hi = round(x), lo = round(x - hi)): a 16-bit operand pair
 * that carries about twice the significand of one T (bf16: 16 bits, f16: 22 bits above the f16
 * subnormal range), so products summed in f32 lose almost nothing against f32 inputs.
 */
template <class T>
__device__ __forceinline__ void split2(float x0, float x1, unsigned& hi, unsigned& lo) {
  hi = pack2<T>(x0, x1);
  float h0, h1;
  unpack2<T>(hi, h0, h1);
  lo = pack2<T>(x0 - h0, x1 - h1);
}

/// The 8 fp8 values F8 (float8_e4m3 or float8_e5m2) of `raw` (lowest byte first) as 8 f16:
/// exact for both formats (their ranges lie in f16's), one `cvt.rn.f16x2.e4m3x2` / `.e5m2x2` per
/// pair on sm_89+.
template <class F8>
__device__ __forceinline__ uint4 fp8x8_to_f16(uint2 raw) {
  const unsigned w[2] = {raw.x, raw.y};
  unsigned h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw p = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), fp8_kind<F8>::value);
    h[i] = static_cast<unsigned>(p.x) | (static_cast<unsigned>(p.y) << 16);
  }
  return {h[0], h[1], h[2], h[3]};
}

/// The 16 fp8 values of `raw` as 16 f16, `out[0]` the first 8 (fp8x8_to_f16 on each half).
template <class F8>
__device__ __forceinline__ void fp8x16_to_f16(uint4 raw, uint4 (&out)[2]) {
  out[0] = fp8x8_to_f16<F8>(uint2{raw.x, raw.y});
  out[1] = fp8x8_to_f16<F8>(uint2{raw.z, raw.w});
}

}  // namespace tangram::detail
