// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/bulk_copy.cuh
 * @brief Bulk global-to-shared copies completed on a shared-memory barrier (sm_90+):
 * `cp.async.bulk` with `mbarrier::complete_tx::bytes`, the `mbarrier` operations a consumer waits
 * with, and the proxy fence that orders ordinary shared-memory writes before later bulk copies.
 *
 * One instruction moves a whole row part (16 to 256 bytes here) instead of one 16-byte cp.async
 * per lane and chunk, and the data is visible to every thread that waited on the barrier's phase,
 * so a consumer needs no warp or block barrier for visibility. The protocol, per stage:
 *   1. every participating thread announces its bytes: mbarrier_arrive_expect_tx(bar, bytes)
 *      (0 bytes is a plain arrival), then issues its copies on `bar`;
 *   2. every consumer waits: mbarrier_wait(bar, parity), parity = (uses of the stage so far) & 1;
 *   3. before a stage is refilled, every reader of it has finished (a warp or block barrier); a
 *      thread whose ordinary stores to shared memory a later bulk copy overwrites calls
 *      fence_proxy_async() after those stores and before that barrier.
 * A barrier is initialised once per CTA with the number of arriving threads (mbarrier_init), then
 * mbarrier_init_fence() and a barrier before any use.
 *
 * `bulk_copy_arch` says whether the instructions exist for the architecture being compiled
 * (sm_90+, and the host emulator); kernels test it with `if constexpr` and keep a cp.async path
 * for older GPUs. Under TANGRAM_EMULATION the operations call the emulator
 * (test/emu/simt/scheduler.cpp): a barrier's state lives in its 8 bytes of shared memory, copies
 * land when the phase completes (or at issue, in the eager copy mode) and a wait suspends the
 * thread until its phase completes, so a missing wait reads poisoned shared memory and a wait
 * that can never complete is reported.
 */
#pragma once

#include <cstdint>

#include "tangram/kernels/detail/vec.cuh"

#if defined(TANGRAM_EMULATION)
// Provided by the emulator (test/emu/simt/scheduler.cpp).
namespace tangram::emu {
void mbarrier_init(std::uint64_t* bar, unsigned count);
void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes);
void bulk_copy(void* dst, const void* src, unsigned bytes, std::uint64_t* bar);
void mbarrier_wait(std::uint64_t* bar, unsigned parity);
}  // namespace tangram::emu
#endif

namespace tangram::detail {

#if defined(TANGRAM_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
inline constexpr bool bulk_copy_arch = true;
#else
inline constexpr bool bulk_copy_arch = false;
#endif

#if !defined(TANGRAM_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// The 32-bit shared-memory address PTX's `.shared` operands take.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

/// Initialises the barrier at `bar` (shared memory, 8-byte aligned) for `count` arrivals a phase.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned count) {
#if defined(TANGRAM_EMULATION)
  emu::mbarrier_init(bar, count);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count)
               : "memory");
#else
  (void)bar;
  (void)count;
  __trap();
#endif
}

/// Makes initialised barriers visible to the bulk-copy engine (then a thread barrier).
__device__ __forceinline__ void mbarrier_init_fence() {
#if !defined(TANGRAM_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
#if defined(TANGRAM_EMULATION)
  emu::mbarrier_arrive_expect_tx(bar, bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
#else
  (void)bar;
  (void)bytes;
  __trap();
#endif
}

/// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
/// memory; completion counts against the transaction count of `bar`'s current phase.
__device__ __forceinline__ void bulk_copy_g2s(void* smem,
                                              const void* gmem,
                                              unsigned bytes,
                                              std::uint64_t* bar) {
#if defined(TANGRAM_EMULATION)
  emu::bulk_copy(smem, gmem, bytes, bar);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_address(smem)),
      "l"(gmem),
      "r"(bytes),
      "r"(shared_address(bar))
      : "memory");
#else
  (void)smem;
  (void)gmem;
  (void)bytes;
  (void)bar;
  __trap();
#endif
}

/// Returns once the phase of `bar` with parity `parity` has completed (its arrivals and bytes);
/// its copies are then visible to this thread. `site`: the emulator's mutation tests may skip it.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar,
                                              unsigned parity,
                                              sync_site site = sync_site::none) {
#if defined(TANGRAM_EMULATION)
  if (site != sync_site::none && ::tangram::emu::mutation() == static_cast<int>(site)) return;
  emu::mbarrier_wait(bar, parity);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  (void)site;
  unsigned done = 0;
  do {
    asm volatile(
        "{\n"
        " .reg .pred ready;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        " selp.u32 %0, 1, 0, ready;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  (void)bar;
  (void)parity;
  (void)site;
  __trap();
#endif
}

/// Orders this thread's earlier ordinary shared-memory accesses before later bulk copies (the
/// async proxy) into the same bytes.
__device__ __forceinline__ void fence_proxy_async() {
#if !defined(TANGRAM_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace tangram::detail
