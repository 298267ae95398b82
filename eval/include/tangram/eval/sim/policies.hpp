// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/policies.hpp
 * @brief The three KV-memory policies the replay compares (one header each, included here:
 * eval/sim/tangram_policy.hpp, eval/sim/unified_policy.hpp, over eval/sim/live_accounting.hpp),
 * each a thin adapter over the real library objects on a simulated memory resource (no real memory,
 * exact accounting):
 *
 * - `full_kv`: vLLM v1 paging, one page spans all KV heads of a layer, no compression; pages are
 *   allocated per scheduled prefill chunk (admission needs only the first chunk's pages), and an
 *   idle session's pages are an evictable prefix cache (`idle_kv_is_prefix_cache`: the replay
 *   drops the least recently used idle session's KV when memory is needed, and the session
 *   recomputes it on its next turn).
 * - `unified_nonuniform_policy`: non-uniform compression on layer-wide pages with dynamic
 *   reclamation (each chunk is allocated in full, tail pages freed after eviction); each input
 * keeps its own per-head retention from the samples (`retention_needs`, what a dynamic compressor
 *   keeps), or, given no needs, Tangram's padded budgets; admission checks the uncompressed prompt
 *   like the reference implementation; out of pages -> preemption.
 * - the per-head dynamic baseline (eval/sim/per_head_policy.hpp) is the same class with
 *   `unified_policy_options`: per-head pages, admission by the estimated compressed size,
 *   preempted requests keeping their blocks.
 * - `tangram_policy`: budget reservation (M(r) at admission, increments per turn), head-group
 *   pages with the plan's clustering; answers reserved a window at a time and grown
 *   (memory/answer_window.hpp); when a growth does not fit it parks a session in host memory
 *   (an idle one first, else a running turn, which resumes later where it was), never
 *   recomputing; each park and restore is host-link traffic the replay charges. Only when host
 *   memory is full too does a decode step fail (the replay then preempts). Its eviction step is
 *   pluggable (eval/sim/chunk_eviction.hpp): static budgets keep `expected_kept`; `tangram_elastic`
 *   (eval/sim/elastic_policy.hpp) is the same policy over an elastic plan with the group-length
 *   selection.
 */
#pragma once

#include "tangram/eval/sim/live_accounting.hpp"
#include "tangram/eval/sim/tangram_policy.hpp"
#include "tangram/eval/sim/unified_policy.hpp"
