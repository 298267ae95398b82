// SPDX-License-Identifier: Apache-2.0
// The fiber scheduler behind simt.hpp: context switching, block and warp barriers, cp.async
// queues, shared-memory poisoning, and the hooks the kernel headers call in emulation builds.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "simt.hpp"

#include "sanitizers.hpp"  // TANGRAM_TEST_ASAN (test/support)

#if defined(TANGRAM_TEST_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// Bounds of the section holding every static __shared__ variable (provided by the ELF linker;
// the anchor makes sure the section exists).
extern "C" unsigned char __start_tangram_emu_shared[];
extern "C" unsigned char __stop_tangram_emu_shared[];
__attribute__((section("tangram_emu_shared"), used)) static unsigned char tangram_emu_shared_anchor;

namespace tangram::emu {
namespace {

// ---------------------------------------------------------------------------------------------
// Context switch. x86-64: saves the callee-saved registers on the old stack and restores them
// from the new one (no signal-mask system call, unlike swapcontext, which would make the
// emulation several times slower; the FP control words are left alone: no kernel changes them).
// Elsewhere: ucontext.
// ---------------------------------------------------------------------------------------------
#if defined(__x86_64__)
extern "C" void tangram_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .type tangram_emu_switch, @function
tangram_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tangram_emu_switch, .-tangram_emu_switch
)");

struct context {
  void* sp = nullptr;
};
#else
struct context {
  ucontext_t uc;
};
#endif

enum class fiber_state { ready, at_block_barrier, at_warp_barrier, done };

struct pending_copy {
  unsigned char* dst;
  unsigned char bytes[16];
  std::size_t size;
  std::size_t group;
};

struct fiber {
  context ctx;
  fiber_state state = fiber_state::ready;
  uint3 idx;
  std::vector<pending_copy> copies;
  std::size_t committed = 0;
  int shuffle_parity    = 0;
};

constexpr std::size_t gather_bytes = 32;          // warp_gather: bytes per lane
constexpr std::size_t stack_bytes  = 256 * 1024;  // ASan-inflated frames fit with room to spare

/// A fiber stack with a PROT_NONE guard page below it (an overflow faults instead of
/// corrupting the neighbour).
struct stack {
  void* base        = nullptr;
  std::size_t total = 0;
  stack() {
    std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    total            = stack_bytes + page;
    base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    mprotect(base, page, PROT_NONE);
  }
  stack(stack&& o) noexcept : base(o.base), total(o.total) { o.base = nullptr; }
  stack(stack const&) = delete;
  ~stack() {
    if (base) munmap(base, total);
  }
  unsigned char* top() const { return static_cast<unsigned char*>(base) + total; }
  unsigned char* bottom() const { return top() - stack_bytes; }
};

struct scheduler {
  options opts;
  statistics stats;
  std::vector<fiber> fibers;
  std::vector<stack> stacks;
  std::vector<std::uint64_t> shuffle_slots[2];
  std::vector<unsigned char> gather_slots[2];  ///< [blockDim][gather_bytes] per parity
  unsigned char* dynamic_smem = nullptr;
  std::size_t dynamic_bytes   = 0;
  context main_ctx;
  int current         = -1;
  void (*body)(void*) = nullptr;
  void* body_ctx      = nullptr;
  std::string fault;            ///< set by a fiber that cannot go on (device check)
  std::vector<unsigned> order;  ///< the current phase's fibers, in run order
  std::size_t next = 0;         ///< position in `order` of the next fiber to run
  std::mt19937_64 rng;
#if defined(TANGRAM_TEST_ASAN)
  void* main_fake_stack         = nullptr;
  const void* main_stack_bottom = nullptr;
  std::size_t main_stack_size   = 0;
#endif
};

scheduler& sched() {
  static scheduler s;
  return s;
}

/// Switches from the running context to `to` (`from` saves it).
void switch_context(context& from,
                    context& to,
                    const void* to_bottom,
                    std::size_t to_size,
                    bool from_is_finishing) {
#if defined(TANGRAM_TEST_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(from_is_finishing ? nullptr : &fake, to_bottom, to_size);
#else
  (void)to_bottom;
  (void)to_size;
  (void)from_is_finishing;
#endif
#if defined(__x86_64__)
  tangram_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
#if defined(TANGRAM_TEST_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/// From the running fiber to the next fiber of the phase (directly: one switch per barrier
/// arrival), or back to the scheduler when the phase is over or a fault was raised.
void yield_to_scheduler(bool finishing) {
  auto& s    = sched();
  auto& from = s.fibers[static_cast<std::size_t>(s.current)].ctx;
  if (s.fault.empty() && s.next < s.order.size()) {
    unsigned i = s.order[s.next++];
    s.current  = static_cast<int>(i);
    threadIdx  = s.fibers[i].idx;
    ++s.stats.switches;
    switch_context(from, s.fibers[i].ctx, s.stacks[i].bottom(), stack_bytes, finishing);
    return;
  }
  s.current = -1;
#if defined(TANGRAM_TEST_ASAN)
  switch_context(from, s.main_ctx, s.main_stack_bottom, s.main_stack_size, finishing);
#else
  switch_context(from, s.main_ctx, nullptr, 0, finishing);
#endif
}

void land(pending_copy const& c) {
  std::memcpy(c.dst, c.bytes, c.size);
}

/// Body of every fiber: the kernel, then its outstanding copies land, then back for good.
void fiber_main() {
  auto& s = sched();
#if defined(TANGRAM_TEST_ASAN)
  // The first fiber ever started was entered from the scheduler: remember its stack.
  const void* from_bottom = nullptr;
  std::size_t from_size   = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (!s.main_stack_bottom) {
    s.main_stack_bottom = from_bottom;
    s.main_stack_size   = from_size;
  }
#endif
  s.body(s.body_ctx);
  auto& f = s.fibers[static_cast<std::size_t>(s.current)];
  for (auto const& c : f.copies) land(c);  // the hardware completes them after exit too
  f.copies.clear();
  f.state = fiber_state::done;
  yield_to_scheduler(true);
  __builtin_unreachable();
}

#if !defined(__x86_64__)
void fiber_entry_ucontext() {
  fiber_main();
}
#endif

void init_fiber(std::size_t i) {
  auto& s  = sched();
  auto& st = s.stacks[i];
  auto& f  = s.fibers[i];
#if defined(TANGRAM_TEST_ASAN)
  // A finished fiber left for good from inside switch_context: its frames never returned, so
  // their redzones are still poisoned. A new fiber on the same stack must start from clean
  // shadow, or its locals that land on those stale redzones read as stack-buffer errors.
  __asan_unpoison_memory_region(st.bottom(), stack_bytes);
#endif
#if defined(__x86_64__)
  // Frame popped by tangram_emu_switch: r15..r12, rbx, rbp, return address (fiber_main,
  // entered with the stack 8 bytes off 16-byte alignment, as after a call).
  auto* top = reinterpret_cast<std::uint64_t*>(st.top());
  top[-1]   = 0;  // fake return address of fiber_main (never used)
  top[-2]   = reinterpret_cast<std::uint64_t>(&fiber_main);
  for (int r = 3; r <= 8; ++r) top[-r] = 0;
  f.ctx.sp = &top[-8];
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp   = st.bottom();
  f.ctx.uc.uc_stack.ss_size = stack_bytes;
  f.ctx.uc.uc_link          = nullptr;
  makecontext(&f.ctx.uc, fiber_entry_ucontext, 0);
#endif
}

void poison_shared(scheduler& s) {
  if (s.dynamic_bytes) std::memset(s.dynamic_smem, 0xff, s.dynamic_bytes);
  std::memset(__start_tangram_emu_shared,
              0xff,
              static_cast<std::size_t>(__stop_tangram_emu_shared - __start_tangram_emu_shared));
}

[[noreturn]] void fail(std::string what) {
  what = "emulated kernel, block (" + std::to_string(blockIdx.x) + "," +
         std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) + "): " + what;
  throw kernel_fault(what);
}

/// Runs the current block to completion.
void run_block(scheduler& s, unsigned threads) {
  s.fibers.assign(threads, fiber{});
  while (s.stacks.size() < threads) s.stacks.emplace_back();
  for (unsigned i = 0; i < threads; ++i) {
    auto& f = s.fibers[i];
    f.idx.x = i % blockDim.x;
    f.idx.y = i / blockDim.x % blockDim.y;
    f.idx.z = i / (blockDim.x * blockDim.y);
    init_fiber(i);
  }
  poison_shared(s);
  auto& order = s.order;
  for (;;) {
    order.clear();
    for (unsigned i = 0; i < threads; ++i)
      if (s.fibers[i].state == fiber_state::ready) order.push_back(i);
    if (!order.empty()) {
      // One phase: the fibers hand over to each other in this order (yield_to_scheduler) and
      // the last one returns here.
      std::shuffle(order.begin(), order.end(), s.rng);
      s.next     = 1;
      unsigned i = order[0];
      threadIdx  = s.fibers[i].idx;
      s.current  = static_cast<int>(i);
      ++s.stats.switches;
      switch_context(s.main_ctx, s.fibers[i].ctx, s.stacks[i].bottom(), stack_bytes, false);
      if (!s.fault.empty()) {
        std::string what;
        what.swap(s.fault);
        fail(what);  // the block's other fibers are abandoned with their stacks
      }
      continue;
    }
    // Nobody can run: release the warps whose live threads all wait at a warp barrier, else
    // the block if all its live threads wait at __syncthreads.
    bool released = false, any_live = false, all_at_block = true;
    for (unsigned w = 0; w < threads; w += 32) {
      unsigned end = std::min(threads, w + 32), live = 0, at_warp = 0;
      for (unsigned i = w; i < end; ++i) {
        auto st = s.fibers[i].state;
        if (st == fiber_state::done) continue;
        ++live;
        at_warp += st == fiber_state::at_warp_barrier;
        all_at_block &= st == fiber_state::at_block_barrier;
      }
      any_live |= live > 0;
      if (live > 0 && at_warp == live) {
        for (unsigned i = w; i < end; ++i)
          if (s.fibers[i].state == fiber_state::at_warp_barrier)
            s.fibers[i].state = fiber_state::ready;
        released = true;
      }
    }
    if (released) continue;
    if (!any_live) return;
    if (!all_at_block)
      fail("divergent barrier: some live threads wait at __syncthreads, others at a warp barrier");
    for (auto& f : s.fibers)
      if (f.state == fiber_state::at_block_barrier) f.state = fiber_state::ready;
  }
}

fiber& running_fiber() {
  auto& s = sched();
  return s.fibers[static_cast<std::size_t>(s.current)];
}

}  // namespace

options& current_options() {
  return sched().opts;
}
statistics const& stats() {
  return sched().stats;
}

void launch(dim3 grid, dim3 block, std::size_t smem_bytes, void (*body)(void*), void* ctx) {
  auto& s                = sched();
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    throw std::invalid_argument("emu::launch: grid (" + std::to_string(grid.x) + "," +
                                std::to_string(grid.y) + "," + std::to_string(grid.z) +
                                ") x block of " + std::to_string(threads) +
                                " threads (1..1024, non-empty grid)");
  if (s.current >= 0) throw std::logic_error("emu::launch: called from inside a kernel");
  s.rng.seed(s.opts.seed * 0x9E3779B97F4A7C15ull + ++s.stats.launches);
  s.body     = body;
  s.body_ctx = ctx;
  blockDim   = block;
  gridDim    = grid;
  for (auto& v : s.shuffle_slots) v.assign(threads, 0);
  for (auto& v : s.gather_slots) v.assign(threads * gather_bytes, 0);
  // Dynamic shared memory: exactly the requested bytes (ASan flags reads past them), 16-aligned.
  struct aligned_delete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(16)); }
  };
  std::unique_ptr<unsigned char[], aligned_delete> smem(
      smem_bytes ? static_cast<unsigned char*>(::operator new[](smem_bytes, std::align_val_t(16)))
                 : nullptr);
  s.dynamic_smem  = smem.get();
  s.dynamic_bytes = smem_bytes;
  // Blocks in an order drawn from the seed: no block may depend on another of the same launch.
  std::vector<uint3> blocks;
  blocks.reserve(static_cast<std::size_t>(grid.x) * grid.y * grid.z);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), s.rng);
  struct reset {
    scheduler& s;
    ~reset() {
      s.current       = -1;
      s.dynamic_smem  = nullptr;
      s.dynamic_bytes = 0;
      s.fibers.clear();
    }
  } guard{s};
  for (auto const& b : blocks) {
    blockIdx = b;
    run_block(s, threads);
    ++s.stats.blocks;
    s.stats.threads += threads;
  }
}

void block_barrier() {
  running_fiber().state = fiber_state::at_block_barrier;
  yield_to_scheduler(false);
}
void warp_barrier() {
  running_fiber().state = fiber_state::at_warp_barrier;
  yield_to_scheduler(false);
}
std::uint64_t* shuffle_slots(int parity) {
  return sched().shuffle_slots[parity].data();
}
void warp_gather(const void* mine, std::size_t bytes, void* warp_out) {
  auto& s = sched();
  if (bytes > gather_bytes) {
    s.fault = "warp_gather of " + std::to_string(bytes) + " bytes per lane (at most 32)";
    yield_to_scheduler(false);
    __builtin_unreachable();
  }
  const int tid =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int base       = tid - tid % 32;
  unsigned char* slots = s.gather_slots[next_shuffle_parity()].data();
  std::memcpy(slots + static_cast<std::size_t>(tid) * gather_bytes, mine, bytes);
  warp_barrier();
  for (int l = 0; l < 32; ++l)
    std::memcpy(static_cast<unsigned char*>(warp_out) + static_cast<std::size_t>(l) * bytes,
                slots + static_cast<std::size_t>(base + l) * gather_bytes,
                bytes);
}
int next_shuffle_parity() {
  auto& f = running_fiber();
  f.shuffle_parity ^= 1;
  return f.shuffle_parity;
}

void copy_async(void* dst, const void* src, std::size_t bytes, std::size_t zero_fill) {
  auto& s = sched();
  if (bytes != 4 && bytes != 8 && bytes != 16)
    s.fault = "cp.async of " + std::to_string(bytes) + " bytes (4, 8 or 16)";
  else if (zero_fill > bytes)
    s.fault = "cp.async zero-fill of " + std::to_string(zero_fill) + " > " + std::to_string(bytes);
  else if (reinterpret_cast<std::uintptr_t>(dst) % bytes ||
           reinterpret_cast<std::uintptr_t>(src) % bytes)
    s.fault = "cp.async of " + std::to_string(bytes) + " bytes from or to a misaligned address";
  if (!s.fault.empty()) {
    yield_to_scheduler(false);
    __builtin_unreachable();
  }
  pending_copy c{static_cast<unsigned char*>(dst), {}, bytes, running_fiber().committed};
  std::memcpy(c.bytes, src, bytes - zero_fill);  // global memory is read at issue
  std::memset(c.bytes + (bytes - zero_fill), 0, zero_fill);
  if (s.opts.copies == copy_mode::eager)
    land(c);
  else
    running_fiber().copies.push_back(c);
}
void copy_commit() {
  ++running_fiber().committed;
}
void copy_wait_prior(std::size_t groups) {
  auto& f = running_fiber();
  // Groups numbered below committed - groups are complete; later ones stay in flight.
  const std::size_t limit = f.committed > groups ? f.committed - groups : 0;
  auto keep               = std::stable_partition(
      f.copies.begin(), f.copies.end(), [&](pending_copy const& c) { return c.group < limit; });
  for (auto it = f.copies.begin(); it != keep; ++it) land(*it);
  f.copies.erase(f.copies.begin(), keep);
}

// Hooks declared by include/tangram/kernels/detail/vec.cuh in emulation builds.
unsigned char* dynamic_smem() {
  return sched().dynamic_smem;
}
int mutation() {
  return sched().opts.mutation;
}
void device_check_failed(const char* condition, const char* what) {
  auto& s = sched();
  s.fault = std::string("device check failed: ") + what + " (" + condition + ")";
  yield_to_scheduler(false);
  __builtin_unreachable();
}

}  // namespace tangram::emu
