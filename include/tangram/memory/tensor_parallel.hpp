// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/tensor_parallel.hpp
 * @brief Admission across tensor-parallel ranks: one manager per rank, a request on all or none.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tangram/memory/kv_cache_types.hpp"

namespace tangram {

/**
 * @brief Tensor parallelism: admits one request on every rank's manager, or on none.
 * @tparam Manager any type with `try_admit(N, T)` and `free(id)` (a `basic_kv_cache_manager`,
 *         or an engine's wrapper around one).
 * @param ranks one manager per rank (each built over that rank's plan); not owned
 * @return the sequence on each rank (same order), or nullopt when any rank cannot fit it; ranks
 *         that had admitted it are rolled back (freed), so no reservation remains.
 * @throw invalid_argument for bad N or T (before any rank changes); std::bad_alloc when the
 *        result cannot be allocated (before any rank changes).
 */
template <class Manager>
[[nodiscard]] std::optional<std::vector<sequence_id>> try_admit_all(
    std::vector<Manager*> const& ranks, std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
  std::vector<sequence_id> ids;
  ids.reserve(ranks.size());
  for (auto* m : ranks) {
    auto id = m->try_admit(prompt_tokens, max_new_tokens);
    if (!id) {
      for (std::size_t k = 0; k < ids.size(); ++k) ranks[k]->free(ids[k]);
      return std::nullopt;
    }
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace tangram
