// SPDX-License-Identifier: Apache-2.0
// The emulator's warp-collective matrix instructions (include/tangram/kernels/detail/mma.cuh):
// mma.sync.aligned.m16n8k16 (bf16 / f16 inputs, f32 accumulate) and ldmatrix.x4 (.trans), with
// the PTX ISA fragment layouts written out as index maps. Each is one warp_gather (one warp
// barrier), so like the hardware instruction it needs every lane of the warp.
#include <cstdint>
#include <cstring>

#include "simt.hpp"
#include "tangram/core/numeric.hpp"

namespace tangram::emu {
namespace {

float half_to_float(std::uint16_t bits, bool bf16) {
  if (bf16) {
    bfloat16 v;
    v.bits = bits;
    return static_cast<float>(v);
  }
  float16 v;
  v.bits = bits;
  return static_cast<float>(v);
}

/// Element `half` (0: low 16 bits) of register `reg`.
float element(unsigned reg, int half, bool bf16) {
  return half_to_float(static_cast<std::uint16_t>(half ? reg >> 16 : reg & 0xffffu), bf16);
}

struct mma_operands {
  unsigned a[4];
  unsigned b[2];
};

}  // namespace

void mma_m16n8k16(bool bf16, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  mma_operands mine{}, warp[32];
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  warp_gather(&mine, sizeof mine, warp);
  // A[m][k]: lane 4 (m % 8) + (k % 8) / 2, register (m / 8) + 2 (k / 8), half k % 2.
  auto A = [&](int m, int k) {
    return element(warp[4 * (m % 8) + (k % 8) / 2].a[m / 8 + 2 * (k / 8)], k % 2, bf16);
  };
  // B[k][n]: lane 4 n + (k % 8) / 2, register k / 8, half k % 2.
  auto B = [&](int k, int n) { return element(warp[4 * n + (k % 8) / 2].b[k / 8], k % 2, bf16); };
  const int lane =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int m = g + 8 * (i / 2), n = 2 * t + i % 2;
    // Products of 16-bit inputs are exact in float; the hardware's internal summation order
    // is unspecified, so any order within f32 rounding is faithful.
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += A(m, k) * B(k, n);
    d[i] = acc;
  }
}

void ldmatrix_x4(unsigned (&r)[4], const void* row, bool trans) {
  const unsigned char* rows[32];
  warp_gather(&row, sizeof row, rows);
  const int lane =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  auto at = [&](int m, int i, int j) {  // element (i, j) of matrix m
    std::uint16_t v;
    std::memcpy(&v, rows[8 * m + i] + 2 * j, 2);
    return static_cast<unsigned>(v);
  };
  for (int m = 0; m < 4; ++m) {
    const int i = lane / 4, j = 2 * (lane % 4);
    r[m] = trans ? at(m, j, i) | (at(m, j + 1, i) << 16) : at(m, i, j) | (at(m, i, j + 1) << 16);
  }
}

}  // namespace tangram::emu
