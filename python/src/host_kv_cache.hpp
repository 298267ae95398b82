// SPDX-License-Identifier: Apache-2.0
// The manager object behind tangram.KVCacheManager, shared by the manager and reference bindings.
#pragma once

#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"

namespace tangram::python {

/// The manager with the host memory it draws its arena from (declared first: built first,
/// destroyed last). Not movable: Python holds it in place.
struct host_kv_cache {
  host_memory_resource memory;
  kv_cache_manager kv;
  host_kv_cache(static_plan const& plan, manager_options const& o) : kv(plan, memory, o) {}
};

}  // namespace tangram::python
