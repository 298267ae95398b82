// SPDX-License-Identifier: Apache-2.0
/**
 * @file tangram.hpp
 * @brief Everything host-side in one include: the model, profile and device types with their
 * file readers and writers (io/), planning (plan/: calibration, grouping, footprints, split
 * maps, elastic reservation and placement, the static plan, its checks and its JSON file), the
 * memory manager (memory/: pools, resources, the KV-cache manager, its thread-safe wrapper,
 * tensor-parallel admission, the batch view), the FlashInfer export (interop/) and the CPU
 * reference kernels (reference/: append, the balanced split map, decode and prefill attention,
 * eviction and elastic eviction). Every public host-only header is here
 * (test/memory/umbrella_include_test.cpp checks it).
 *
 * Not included, because they need the CUDA library (`tangram::kernels`): the kernel launchers
 * (`tangram/kernels/...`), `tangram/memory/cuda_memory_resource.hpp`, the device mirror
 * (`tangram/device/kv_view_mirror.hpp`), the stream-ordered release of deferred pages
 * (`tangram/device/stream_epochs.hpp`) and the asynchronous readback of the elastic eviction's
 * lengths (`tangram/device/async_readback.hpp`). Include those where the engine launches kernels or
 * allocates its device pool.
 */
#pragma once

#include "tangram/core/balanced_split.hpp"
#include "tangram/core/config.hpp"
#include "tangram/core/device_limits.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/elastic_lengths.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_shape.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/numeric.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/core/split_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/core/version.hpp"
#include "tangram/device/device.hpp"
#include "tangram/interop/flash_attn_varlen.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/interop/flashinfer_block_sparse.hpp"
#include "tangram/interop/virtual_pages.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/memory/concurrent_kv_cache.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/memory/limiting_resource_adaptor.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/memory/resource_ref.hpp"
#include "tangram/memory/segment_arena.hpp"
#include "tangram/memory/tensor_parallel.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/aot_mapping.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/elastic.hpp"
#include "tangram/plan/elastic_placement.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/elastic_split_map.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/pipeline_stages.hpp"
#include "tangram/plan/plan_checks.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_options.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "tangram/reference/append.hpp"
#include "tangram/reference/balanced_split.hpp"
#include "tangram/reference/decode_attention.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"
#include "tangram/reference/prefill_attention.hpp"
#include "tangram/reference/storage.hpp"
