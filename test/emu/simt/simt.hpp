// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/emu/simt/simt.hpp
 * @brief A host emulator of CUDA thread blocks, enough to run Tangram's kernel bodies on the CPU.
 *
 * One fiber per CUDA thread; the blocks of a launch run one after another in an order drawn from
 * the scheduling seed. Inside a block the fibers run in phases: every ready fiber runs, in a
 * random order, until it reaches a barrier (`__syncthreads`, `__syncwarp`, a warp shuffle) or
 * exits; a barrier releases once every live thread of its scope has arrived. So any value a
 * thread reads from another without a barrier in between depends on the seed, which is how a
 * missing barrier shows up as a wrong result. Further checks:
 *
 * - shared memory (dynamic and static `__shared__`) is filled with 0xff bytes (NaN in every float
 *   type) before each block, so reading what the block never wrote poisons the output;
 * - `cp.async` copies (`__pipeline_memcpy_async`) either land only when the issuing thread waits
 *   for their group (copy_mode::deferred: a wait that is too short reads stale or poisoned
 *   shared memory) or at issue (copy_mode::eager: a stage refilled while another thread still
 *   reads it is overwritten early);
 * - barriers that not every live thread of the scope reaches (divergence), and failed device
 *   checks, end the launch with emu::kernel_fault instead of hanging or aborting.
 *
 * Not modelled: timing, occupancy, registers, the memory model across blocks (blocks never run
 * concurrently), warp-synchronous execution without an explicit barrier, partial shuffle masks.
 *
 * The CUDA names (threadIdx, __syncthreads, ...) live in the global namespace, as in CUDA; they
 * are declared by the shim headers in test/emu/shim, which include this file.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---------------------------------------------------------------------------------------------
// Vector types and built-in variables.
// ---------------------------------------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) {
  return {x, y};
}

// Set by the scheduler before a fiber runs (blocks run one at a time, so globals suffice).
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline constexpr int warpSize = 32;

namespace tangram::emu {

/// How cp.async copies land (see the file comment).
enum class copy_mode { deferred, eager };

/// What the emulator does for the launches that follow (set with scoped_options).
struct options {
  std::uint64_t seed = 1;  ///< scheduling seed: block order and phase orders
  copy_mode copies   = copy_mode::deferred;
  int mutation       = 0;  ///< tangram::detail::sync_site to weaken (0: none)
};

/// The options in force.
options& current_options();

/// Sets the emulator options for its lifetime and restores the previous ones.
class scoped_options {
 public:
  explicit scoped_options(options o) : saved_(current_options()) { current_options() = o; }
  ~scoped_options() { current_options() = saved_; }
  scoped_options(scoped_options const&)            = delete;
  scoped_options& operator=(scoped_options const&) = delete;

 private:
  options saved_;
};

/// A launch that cannot complete: divergent barrier, failed device check, bad launch shape.
struct kernel_fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Counters since program start (for the test log; never asserted on).
struct statistics {
  std::uint64_t launches = 0, blocks = 0, threads = 0, switches = 0;
};
statistics const& stats();

/**
 * Runs `body(ctx)` as every thread of a grid of `grid` blocks of `block` threads with
 * `smem_bytes` bytes of dynamic shared memory; returns when every block has finished.
 * @throw kernel_fault as described in the file comment; std::invalid_argument for a block of
 * more than 1024 threads or an empty grid dimension.
 */
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, void (*body)(void*), void* ctx);

/// launch() for any callable.
template <class F>
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, F&& body) {
  using Fn = std::remove_reference_t<F>;
  launch(
      grid,
      block,
      smem_bytes,
      [](void* c) { (*static_cast<Fn*>(c))(); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

/**
 * The launch policy of the emulator (the counterpart of detail::stream_launch): runs
 * `kernel(args...)` over the grid with the parameters copied once, as a launch does.
 */
struct emulated_launch {
  template <class... P, class... A>
  void operator()(void (*kernel)(P...), dim3 grid, int threads, int smem, A const&... args) const {
    std::tuple<std::decay_t<P>...> params(args...);
    launch(grid, dim3(static_cast<unsigned>(threads)), static_cast<std::size_t>(smem), [&] {
      std::apply(kernel, params);
    });
  }
};

// Used by the builtins below (one fiber is running when they are called).
void block_barrier();
void warp_barrier();
std::uint64_t* shuffle_slots(int parity);  ///< [blockDim] exchange slots of one parity
int next_shuffle_parity();                 ///< alternates per thread: one barrier per shuffle
/// Warp-collective exchange (one warp barrier): every lane publishes `bytes` (<= 32) bytes at
/// `mine`; each lane receives the 32 lanes' values, lane order, at `warp_out` (32 * bytes).
void warp_gather(const void* mine, std::size_t bytes, void* warp_out);
void copy_async(void* dst, const void* src, std::size_t bytes, std::size_t zero_fill);
void copy_commit();
void copy_wait_prior(std::size_t groups);

}  // namespace tangram::emu

// ---------------------------------------------------------------------------------------------
// Built-in functions.
// ---------------------------------------------------------------------------------------------
inline void __syncthreads() {
  tangram::emu::block_barrier();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  tangram::emu::warp_barrier();
}
/// Load through L2 only (bypassing L1): a plain load here.
template <class T>
T __ldcg(const T* p) {
  return *p;
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

namespace tangram::emu {
/// Every lane publishes `v`, one warp barrier, then reads lane `src_lane(lane)` (its own value
/// when that is outside the segment of `width` lanes, as on the GPU).
template <class T, class Lane>
T shuffle(T v, int width, Lane src_lane) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of 4 or 8 bytes");
  const int tid =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int lane = tid % 32, base = tid - lane;
  std::uint64_t* slots = shuffle_slots(next_shuffle_parity());
  std::uint64_t bits   = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots[tid] = bits;
  warp_barrier();
  const int seg = lane - lane % width;
  const int src = src_lane(lane);
  T out         = v;
  if (src >= seg && src < seg + width) std::memcpy(&out, &slots[base + src], sizeof(T));
  return out;
}
}  // namespace tangram::emu

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  return tangram::emu::shuffle(v, width, [&](int lane) { return lane ^ lane_mask; });
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  return tangram::emu::shuffle(v, width, [&](int lane) { return lane + static_cast<int>(delta); });
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  return tangram::emu::shuffle(v, width, [&](int lane) {
    int src = lane - static_cast<int>(delta);
    return src >= lane - lane % width ? src : lane;
  });
}
template <class T>
T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  return tangram::emu::shuffle(
      v, width, [&](int lane) { return lane - lane % width + src_lane % width; });
}

// Atomics: a fiber is never preempted between a barrier and the next, so plain read-modify-write
// is atomic here. They return the old value, as on the GPU.
template <class T>
T atomicAdd(T* p, T v) {
  T old = *p;
  *p    = old + v;
  return old;
}
template <class T>
T atomicSub(T* p, T v) {
  T old = *p;
  *p    = old - v;
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  T old = *p;
  *p    = old < v ? v : old;
  return old;
}
template <class T>
T atomicMin(T* p, T v) {
  T old = *p;
  *p    = v < old ? v : old;
  return old;
}
template <class T>
T atomicExch(T* p, T v) {
  T old = *p;
  *p    = v;
  return old;
}
template <class T>
T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

// Blocks of a launch run one after another, so every write of an earlier block is visible to a
// later one: the fence has nothing to order (the "last block" ticket pattern still runs as on
// the GPU, with the seed choosing which block is last).
inline void __threadfence() {}

inline int __popc(unsigned v) {
  return __builtin_popcount(v);
}
inline int __ffs(int v) {
  return __builtin_ffs(v);
}

/// The lanes of the warp whose `v` equals this lane's (one warp barrier; all 32 lanes call it).
template <class T>
unsigned __match_any_sync(unsigned, T v) {
  static_assert((sizeof(T) == 4 || sizeof(T) == 8) && std::is_trivially_copyable_v<T>,
                "match of 4 or 8 bytes");
  T lanes[32];
  tangram::emu::warp_gather(&v, sizeof(T), lanes);
  unsigned peers = 0;
  for (int l = 0; l < 32; ++l)
    if (std::memcmp(&lanes[l], &v, sizeof(T)) == 0) peers |= 1u << l;
  return peers;
}

// cp.async through the cuda_pipeline.h primitives.
inline void __pipeline_memcpy_async(void* dst,
                                    const void* src,
                                    std::size_t bytes,
                                    std::size_t zfill = 0) {
  tangram::emu::copy_async(dst, src, bytes, zfill);
}
inline void __pipeline_commit() {
  tangram::emu::copy_commit();
}
inline void __pipeline_wait_prior(std::size_t prior) {
  tangram::emu::copy_wait_prior(prior);
}

// Kernel qualifiers. Static __shared__ variables go to one section, which the scheduler poisons
// before every block (the linker provides its bounds).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__   static __attribute__((section("tangram_emu_shared")))
#ifndef TANGRAM_KERNEL
#define TANGRAM_KERNEL
#endif
