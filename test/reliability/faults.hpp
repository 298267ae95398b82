// SPDX-License-Identifier: Apache-2.0
// Fault injection at the memory-resource level, shared by the reliability suite and the soak
// driver: arenas refused by a limiting adaptor (limits 0, 1, one byte short, random) and by a
// resource that fails its k-th allocation, for managers, bare pools and the layer-wide baseline.
// Each refusal must surface as tangram::out_of_memory naming the bytes, and every byte handed out
// must come back (no partial state survives a failed constructor).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/limiting_resource_adaptor.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/plan/static_plan.hpp"
#include "test_support.hpp"

namespace tangram::test {

/// A resource that refuses its `fail_at`-th allocation (1-based; 0: never) and counts what is
/// outstanding. Forwards to a host or simulated upstream. Single-threaded.
class failing_resource final : public memory_resource {
 public:
  failing_resource(memory_resource& upstream, std::int64_t fail_at)
      : upstream_(&upstream), fail_at_(fail_at) {}
  [[nodiscard]] std::int64_t outstanding_blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::size_t outstanding_bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::int64_t attempts() const noexcept { return attempts_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (++attempts_ == fail_at_)
      TANGRAM_FAIL(out_of_memory,
                   "failing_resource: allocation ",
                   attempts_,
                   " of ",
                   bytes,
                   " bytes refused (injected)");
    void* p = upstream_->allocate(bytes, alignment);
    ++blocks_;
    bytes_ += bytes;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    upstream_->deallocate(p, bytes, alignment);
    --blocks_;
    bytes_ -= bytes;
  }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return upstream_->kind(); }

  memory_resource* upstream_;
  std::int64_t fail_at_;
  std::int64_t attempts_ = 0;
  std::int64_t blocks_   = 0;
  std::size_t bytes_     = 0;
};

/// Expects `make()` to throw out_of_memory whose message holds `piece`.
template <class Make>
void expect_out_of_memory(Make&& make, std::string const& piece) {
  bool threw = false;
  std::string msg;
  try {
    make();
  } catch (out_of_memory const& e) {
    threw = true;
    msg   = e.what();
  }
  INFO("expected out_of_memory with \"" << piece << "\", got \"" << msg << "\"");
  REQUIRE(threw);
  REQUIRE(msg.find(piece) != std::string::npos);
}

/**
 * Runs every resource fault case over `plan` with a pool of `num_pages` pages (`host`: real host
 * memory, else simulated addresses). Returns the number of injected faults.
 */
inline std::int64_t run_resource_faults(static_plan const& plan,
                                        std::int64_t num_pages,
                                        bool host,
                                        std::uint32_t seed) {
  std::mt19937 rng(seed);
  host_memory_resource host_mr;
  simulated_memory_resource sim_mr;
  memory_resource& base = host ? static_cast<memory_resource&>(host_mr) : sim_mr;
  manager_options o;
  o.num_pages         = num_pages;
  o.max_sequences     = 4;
  auto arena          = static_cast<std::size_t>(num_pages * plan.page_bytes());
  std::int64_t faults = 0;

  // 1. A limiting adaptor below the arena: limits 0, 1, one byte short and a random one.
  std::vector<std::size_t> limits{0, 1, arena - 1, static_cast<std::size_t>(rng() % arena)};
  for (auto limit : limits) {
    limiting_resource_adaptor lim(base, limit);
    expect_out_of_memory([&] { basic_kv_cache_manager<> m(plan, lim, o); },
                         std::to_string(arena) + " bytes");
    REQUIRE(lim.allocated_bytes() == 0);
    REQUIRE(lim.refusals() == 1);
    ++faults;
  }
  {
    limiting_resource_adaptor lim(base, arena);  // exactly enough
    {
      basic_kv_cache_manager<> m(plan, lim, o);
      REQUIRE(lim.allocated_bytes() == arena);
      auto id = m.try_admit(1, 1);
      REQUIRE(id.has_value());
      m.free(*id);
      // A second manager does not fit under the same limit, and leaves the first untouched.
      expect_out_of_memory([&] { basic_kv_cache_manager<> m2(plan, lim, o); }, "limit");
      ++faults;
      REQUIRE(lim.allocated_bytes() == arena);
      m.check_invariants();
    }
    REQUIRE(lim.allocated_bytes() == 0);
  }

  // 2. The k-th allocation fails: build k managers over one resource; the k-th throws, the
  //    earlier ones keep working, and everything returns when they go.
  for (std::int64_t k = 1; k <= 4; ++k) {
    failing_resource fr(base, k);
    {
      std::vector<std::unique_ptr<kv_cache_manager>> alive;
      for (std::int64_t i = 1; i < k; ++i)
        alive.push_back(std::make_unique<kv_cache_manager>(plan, fr, o));
      expect_out_of_memory([&] { kv_cache_manager m(plan, fr, o); },
                           "allocation " + std::to_string(k));
      ++faults;
      REQUIRE(fr.outstanding_blocks() == k - 1);
      for (auto& m : alive) {
        auto id = m->try_admit(2, 2);
        REQUIRE(id.has_value());
        m->prepare_chunk(*id, 2);
        std::vector<std::int32_t> kept(plan.rules.size());
        m->expected_kept(*id, 2, kept.data());
        m->commit_chunk(*id, kept);
        m->free(*id);
        m->check_invariants();
      }
    }
    REQUIRE(fr.outstanding_blocks() == 0);
    REQUIRE(fr.outstanding_bytes() == 0);
  }

  // 3. Bare pools and the layer-wide baseline over a failing resource.
  {
    failing_resource fr(base, 1);
    expect_out_of_memory([&] { page_pool<> p(fr, page_layout<>(plan.geometry), num_pages); },
                         "allocation 1");
    REQUIRE(fr.outstanding_blocks() == 0);
    ++faults;
  }
  {
    failing_resource fr(base, 2);
    page_pool<> first(fr, page_layout<>(plan.geometry), num_pages);
    expect_out_of_memory([&] { page_pool<> p(fr, page_layout<>(plan.geometry), num_pages); },
                         "allocation 2");
    REQUIRE(fr.outstanding_blocks() == 1);
    first.check_invariants();
    ++faults;
  }
  {
    failing_resource fr(base, 1);
    expect_out_of_memory(
        [&] { unified_paging_baseline b(plan, unified_mode::full_kv, fr, 16, 2, 256); },
        "allocation 1");
    REQUIRE(fr.outstanding_blocks() == 0);
    ++faults;
  }
  return faults;
}

}  // namespace tangram::test
