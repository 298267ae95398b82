// SPDX-License-Identifier: Apache-2.0
// The manager object behind tangram.KVCacheManager, shared by the manager, reference and CUDA
// bindings: the manager with the memory its page arena comes from.
#pragma once

#include <memory>
#include <string>

#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"

namespace tangram::python {

/// The memory resource named by KVCacheManager's `memory` argument: "host", or "cuda" (device
/// `device`; only in a package built with the CUDA kernels). Defined in manager.cpp.
std::unique_ptr<memory_resource> make_memory(std::string const& name, std::int32_t device);

/// The manager with the resource it draws its arena from (declared first: built first, destroyed
/// last). Not movable: Python holds it in place.
struct bound_kv_cache {
  std::unique_ptr<memory_resource> memory;
  std::int32_t device = -1;  ///< CUDA device of a device arena, else -1
  bool mirrored       = false;  ///< a tangram.cuda.DeviceMirror consumes the change journal
  kv_cache_manager kv;
  bound_kv_cache(static_plan const& plan,
                 manager_options const& o,
                 std::unique_ptr<memory_resource> m,
                 std::int32_t device_id)
      : memory(std::move(m)), device(device_id), kv(plan, *memory, o) {}

  [[nodiscard]] bool on_device() const noexcept { return memory->kind() == memory_kind::device; }

  /// Refuses a device arena for what reads or writes the pool on the CPU (`who` names the call).
  void expect_host_pool(char const* who) const {
    TANGRAM_EXPECTS(!on_device(), invalid_argument, who,
                    ": this manager's page arena is device memory (memory='cuda'); the CPU "
                    "reference kernels and host copies need memory='host' (on the device use "
                    "tangram.cuda)");
  }
};

}  // namespace tangram::python
