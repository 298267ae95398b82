// SPDX-License-Identifier: Apache-2.0
// resource_ref (memory/resource_ref.hpp): resources of CCCL's cuda::mr shapes plug into a page
// pool and a manager without an adaptor. Stand-ins with the documented member shapes (RMM and
// CCCL are not on this machine): an RMM 26 resource (allocate_sync / deallocate_sync, a stream
// overload, ==, a get_property friend) and a CCCL 3.0 resource (allocate / deallocate with an
// alignment). Checked: the arena is asked for once with its size and 256-byte alignment and
// given back at destruction, the memory kind is the one named, std::bad_alloc and null become
// out_of_memory naming the bytes, other exceptions pass unchanged, temporaries and unrelated
// types do not convert.
#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "memory_fixtures.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/limiting_resource_adaptor.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/memory/resource_ref.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// What a stand-in resource saw.
struct resource_log {
  int allocations = 0, deallocations = 0;
  std::size_t bytes = 0, alignment = 0, outstanding = 0;
};

struct fake_stream {};                 // cuda::stream_ref stand-in
struct device_accessible_property {};  // cuda::mr::device_accessible stand-in

/// The member shape of an RMM 26 resource (rmm::mr::device_memory_resource and the rest).
class rmm26_like_resource {
 public:
  explicit rmm26_like_resource(resource_log& log) : log_(&log) {}
  void* allocate_sync(std::size_t bytes, std::size_t alignment = 256) {
    if (fail_with_bad_alloc) throw std::bad_alloc();
    if (fail_with_runtime_error) throw std::runtime_error("rmm: cudaErrorLaunchFailure");
    if (return_null) return nullptr;
    ++log_->allocations;
    log_->bytes     = bytes;
    log_->alignment = alignment;
    log_->outstanding += bytes;
    return ::operator new (bytes, std::align_val_t{alignment});
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment = 256) noexcept {
    ++log_->deallocations;
    log_->outstanding -= bytes;
    ::operator delete (p, std::align_val_t{alignment});
  }
  void* allocate(fake_stream, std::size_t bytes, std::size_t alignment = 256) {
    return allocate_sync(bytes, alignment);
  }
  void deallocate(fake_stream, void* p, std::size_t bytes, std::size_t alignment = 256) noexcept {
    deallocate_sync(p, bytes, alignment);
  }
  friend bool operator==(rmm26_like_resource const& a, rmm26_like_resource const& b) {
    return a.log_ == b.log_;
  }
  friend void get_property(rmm26_like_resource const&, device_accessible_property) noexcept {}

  bool fail_with_bad_alloc = false, fail_with_runtime_error = false, return_null = false;

 private:
  resource_log* log_;
};

/// The member shape of a CCCL 3.0 cuda::mr::resource (as shipped with nvcc 13.0).
class cccl30_like_resource {
 public:
  explicit cccl30_like_resource(resource_log& log) : log_(&log) {}
  void* allocate(std::size_t bytes, std::size_t alignment) {
    ++log_->allocations;
    log_->bytes     = bytes;
    log_->alignment = alignment;
    log_->outstanding += bytes;
    return ::operator new (bytes, std::align_val_t{alignment});
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) {
    ++log_->deallocations;
    log_->outstanding -= bytes;
    ::operator delete (p, std::align_val_t{alignment});
  }
  friend bool operator==(cccl30_like_resource const& a, cccl30_like_resource const& b) {
    return a.log_ == b.log_;
  }

 private:
  resource_log* log_;
};

manager_options small_pool() {
  manager_options o;
  o.num_pages     = 40;
  o.max_sequences = 4;
  return o;
}

// Conversions: Tangram's resources convert implicitly; foreign ones need their kind; temporaries,
// const resources and unrelated types do not convert.
static_assert(std::is_convertible_v<host_memory_resource&, resource_ref>);
static_assert(std::is_convertible_v<memory_resource&, resource_ref>);
static_assert(!std::is_convertible_v<rmm26_like_resource&, resource_ref>);
static_assert(std::is_constructible_v<resource_ref, rmm26_like_resource&, memory_kind>);
static_assert(std::is_constructible_v<resource_ref, cccl30_like_resource&, memory_kind>);
static_assert(!std::is_constructible_v<resource_ref, host_memory_resource>);
static_assert(!std::is_constructible_v<resource_ref, host_memory_resource&&>);
static_assert(!std::is_constructible_v<resource_ref, rmm26_like_resource&&, memory_kind>);
static_assert(!std::is_constructible_v<resource_ref, host_memory_resource const&>);
static_assert(!std::is_constructible_v<resource_ref, int&, memory_kind>);
static_assert(!std::is_constructible_v<resource_ref, std::string&, memory_kind>);
static_assert(std::is_trivially_copyable_v<resource_ref>);

}  // namespace

TEST_CASE("resource_ref: an RMM 26-shaped resource holds a manager's pool without an adaptor",
          "[memory][resource]") {
  resource_log log;
  rmm26_like_resource mr(log);
  auto plan = tiny_plan(tiny_budgets());
  {
    kv_cache_manager m(plan, resource_ref(mr, memory_kind::host), small_pool());
    CHECK(log.allocations == 1);
    CHECK(log.bytes == static_cast<std::size_t>(m.pool().arena_bytes()));
    CHECK(log.alignment == default_arena_alignment);
    CHECK(m.pool().kind() == memory_kind::host);
    // The arena is real host memory, and the manager runs on it.
    m.pool().base()[0] = std::byte{42};
    CHECK(m.pool().base()[0] == std::byte{42});
    auto id = m.try_admit(8, 2);
    REQUIRE(id);
    m.free(*id);
    CHECK(log.deallocations == 0);
  }
  CHECK(log.deallocations == 1);
  CHECK(log.outstanding == 0);
}

TEST_CASE("resource_ref: a CCCL 3.0-shaped resource and the kind its caller names",
          "[memory][resource]") {
  resource_log log;
  cccl30_like_resource mr(log);
  auto plan = tiny_plan(tiny_budgets());
  {
    // The caller's claim decides who may dereference: simulated here, so nothing is written.
    page_pool<> pool(resource_ref(mr, memory_kind::simulated), page_layout<>(plan.geometry), 16);
    CHECK(pool.kind() == memory_kind::simulated);
    CHECK(log.allocations == 1);
    CHECK(log.bytes == static_cast<std::size_t>(pool.arena_bytes()));
    CHECK(log.alignment == default_arena_alignment);
  }
  CHECK(log.deallocations == 1);
  CHECK(log.outstanding == 0);
  // A ref is a reference: copies compare equal and refer to the same object, not to the ref.
  resource_ref a(mr, memory_kind::host);
  resource_ref b = a;
  resource_ref c(b);
  CHECK(a == c);
  CHECK(c.object() == static_cast<void*>(&mr));
  cccl30_like_resource other(log);
  CHECK(resource_ref(other, memory_kind::host) != a);
}

TEST_CASE("resource_ref: failures of a foreign resource are out_of_memory naming the bytes",
          "[memory][resource]") {
  resource_log log;
  rmm26_like_resource mr(log);
  auto plan = tiny_plan(tiny_budgets());
  resource_ref ref(mr, memory_kind::device);
  mr.fail_with_bad_alloc = true;
  CHECK_THROWS_AS(kv_cache_manager(plan, ref, small_pool()), out_of_memory);
  CHECK_THROWS_WITH(
      (void)ref.allocate_sync(4096),
      Catch::StartsWith("resource_ref: the device resource cannot allocate 4096 bytes (alignment "
                        "256): "));
  mr.fail_with_bad_alloc = false;
  mr.return_null         = true;
  CHECK_THROWS_WITH((void)ref.allocate_sync(512, 64),
                    "resource_ref: the device resource returned null for 512 bytes (alignment 64)");
  CHECK_THROWS_AS(page_pool<>(ref, page_layout<>(plan.geometry), 8), out_of_memory);
  mr.return_null             = false;
  mr.fail_with_runtime_error = true;  // not an allocation failure: propagates unchanged
  CHECK_THROWS_AS((void)ref.allocate_sync(512), std::runtime_error);
  CHECK_THROWS_WITH((void)ref.allocate_sync(512), "rmm: cudaErrorLaunchFailure");
  CHECK(log.allocations == 0);
  // Bad sizes are refused before the resource is asked.
  CHECK_THROWS_WITH((void)ref.allocate_sync(0),
                    "resource_ref::allocate_sync: bytes must be > 0, got 0");
  CHECK_THROWS_WITH((void)ref.allocate_sync(64, 48),
                    "resource_ref::allocate_sync: alignment must be a power of two, got 48");
}

TEST_CASE("limiting_resource_adaptor caps any resource, and its refusal passes unchanged",
          "[memory][resource]") {
  resource_log log;
  rmm26_like_resource mr(log);
  auto plan = tiny_plan(tiny_budgets());
  auto need = static_cast<std::size_t>(small_pool().num_pages) *
              static_cast<std::size_t>(page_layout<>(plan.geometry).page_bytes());
  limiting_resource_adaptor tight(resource_ref(mr, memory_kind::host), need - 1);
  CHECK_THROWS_WITH(kv_cache_manager(plan, tight, small_pool()),
                    "limiting_resource_adaptor: cannot allocate " + std::to_string(need) +
                        " bytes: 0 of the " + std::to_string(need - 1) + "-byte limit are in use");
  CHECK(tight.refusals() == 1);
  CHECK(log.allocations == 0);
  limiting_resource_adaptor enough(resource_ref(mr, memory_kind::host), need);
  {
    kv_cache_manager m(plan, enough, small_pool());
    CHECK(enough.allocated_bytes() == need);
    CHECK(m.pool().kind() == memory_kind::host);  // the upstream's kind
    CHECK(enough.upstream().object() == static_cast<void*>(&mr));
  }
  CHECK(enough.allocated_bytes() == 0);
  CHECK(log.outstanding == 0);
}
