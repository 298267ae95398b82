// SPDX-License-Identifier: Apache-2.0
// The emulated tensor-core fragments (include/tangram/kernels/detail/mma.cuh) against a plain
// matrix product: one warp loads non-symmetric A (16 x 16) and B (16 x 8) from shared memory with
// ldmatrix (A and K-style B plain, V-style B transposed), multiplies with mma_m16n8k16 onto a
// non-zero C and scatters D by the documented C layout. A transposed or shuffled fragment layout
// (in the emulator or in the helpers' use of it) gives a different product.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "simt/simt.hpp"
#include "tangram/kernels/detail/mma.cuh"

using namespace tangram;

namespace {

template <class T>
std::uint16_t bits_of(float x) {
  return T(x).bits;
}
template <class T>
float value_of(std::uint16_t b) {
  T v;
  v.bits = b;
  return static_cast<float>(v);
}

/// D = A B + C on the emulator (one warp) with B given as `b_rows` rows of 16-bit elements:
/// b_trans == false: rows are B's columns (n-major, like K rows for S = Q K^T), read by plain
/// ldmatrix; b_trans == true: rows are B's rows (k-major, like V rows for O = P V), read by
/// ldmatrix.trans.
template <class T>
std::vector<float> emulated(std::vector<std::uint16_t> const& a,  // [16][16] row-major
                            std::vector<std::uint16_t> const& b_rows,
                            bool b_trans,
                            std::vector<float> const& c) {  // [16][8]
  std::vector<float> d(16 * 8, -1.f);
  // Shared-memory images: A rows then B rows, 16 elements each (plus padding, like the kernel).
  constexpr int row = 24;
  emu::launch(dim3(1), dim3(32), 2 * 32 * row, [&] {
    auto* sm       = reinterpret_cast<std::uint16_t*>(emu::dynamic_smem());
    const int lane = static_cast<int>(threadIdx.x);
    if (lane == 0) {
      for (int i = 0; i < 16; ++i) std::memcpy(sm + i * row, &a[i * 16], 32);
      const int n_rows = b_trans ? 16 : 8;
      for (int i = 0; i < n_rows; ++i)
        std::memcpy(sm + (16 + i) * row, &b_rows[i * 16], b_trans ? 16 : 32);
    }
    __syncthreads();
    unsigned fa[4], fb[4];
    detail::ldmatrix_x4<false>(fa, sm + (lane % 16) * row + (lane / 16) * 8);
    unsigned b2[2];
    if (!b_trans) {
      // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31 repeat them.
      detail::ldmatrix_x4<false>(fb, sm + (16 + lane % 8) * row + ((lane / 8) % 2) * 8);
      b2[0] = fb[0];
      b2[1] = fb[1];
    } else {
      // Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7); lanes 16-31 repeat them.
      detail::ldmatrix_x4<true>(fb, sm + (16 + ((lane / 8) % 2) * 8 + lane % 8) * row);
      b2[0] = fb[0];
      b2[1] = fb[1];
    }
    const int g = lane / 4, t = lane % 4;
    float acc[4] = {
        c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    detail::mma_m16n8k16<T>(acc, fa, b2);
    d[g * 8 + 2 * t]           = acc[0];
    d[g * 8 + 2 * t + 1]       = acc[1];
    d[(g + 8) * 8 + 2 * t]     = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
  });
  return d;
}

template <class T>
void check_product(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Small integers are exact in both formats, so the expected product is exact; A and B are
  // random (hence non-symmetric), and A's k-halves and B's two k-blocks differ.
  std::uniform_int_distribution<int> v(-8, 8);
  std::vector<std::uint16_t> a(16 * 16), bk(8 * 16), bv(16 * 8 * 2, 0);
  std::vector<float> af(16 * 16), bf(16 * 8), c(16 * 8);
  for (int i = 0; i < 16 * 16; ++i) af[i] = static_cast<float>(v(rng));
  for (int i = 0; i < 16 * 8; ++i) bf[i] = static_cast<float>(v(rng));  // bf[k * 8 + n]
  for (int i = 0; i < 16 * 8; ++i) c[i] = static_cast<float>(v(rng)) / 4.f;
  for (int i = 0; i < 16 * 16; ++i) a[i] = bits_of<T>(af[i]);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) bk[n * 16 + k] = bits_of<T>(bf[k * 8 + n]);  // K rows: B^T
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) bv[k * 16 + n] = bits_of<T>(bf[k * 8 + n]);  // V rows: B
  std::vector<float> want(16 * 8);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float s = c[m * 8 + n];
      for (int k = 0; k < 16; ++k) s += af[m * 16 + k] * bf[k * 8 + n];
      want[m * 8 + n] = s;
    }
  CHECK(emulated<T>(a, bk, false, c) == want);
  CHECK(emulated<T>(a, bv, true, c) == want);
  // The expectation is not symmetric in the layout: transposing A changes it.
  std::vector<std::uint16_t> at(16 * 16);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) at[i * 16 + k] = a[k * 16 + i];
  CHECK(emulated<T>(at, bk, false, c) != want);
}

}  // namespace

TEST_CASE("emulated mma m16n8k16 with ldmatrix equals a plain matrix product (bf16)",
          "[emu][mma]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) check_product<bfloat16>(seed);
}

TEST_CASE("emulated mma m16n8k16 with ldmatrix equals a plain matrix product (f16)", "[emu][mma]") {
  for (std::uint64_t seed : {4u, 5u}) check_product<float16>(seed);
}

TEST_CASE("split2 carries a float as a 16-bit hi + lo pair", "[emu][mma]") {
  // hi is x rounded to T, lo the rounded remainder: hi + lo is much closer to x than hi.
  for (float x : {0.1234567f, -3.1415926f, 1e-3f, 0.f}) {
    unsigned hi = 0, lo = 0;
    detail::split2<bfloat16>(x, -x, hi, lo);
    const float h0 = value_of<bfloat16>(static_cast<std::uint16_t>(hi & 0xffffu));
    const float l0 = value_of<bfloat16>(static_cast<std::uint16_t>(lo & 0xffffu));
    const float h1 = value_of<bfloat16>(static_cast<std::uint16_t>(hi >> 16));
    const float l1 = value_of<bfloat16>(static_cast<std::uint16_t>(lo >> 16));
    CHECK(h0 == static_cast<float>(bfloat16(x)));
    CHECK(h1 == -h0);
    CHECK(l1 == -l0);
    CHECK(std::abs(h0 + l0 - x) <= std::abs(x) * 0x1p-16f);
  }
}
