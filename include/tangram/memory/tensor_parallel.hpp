// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/tensor_parallel.hpp
 * @brief Admission, restores and resumes of parked sessions across tensor-parallel ranks or
 * pipeline stages: one manager per rank (or per stage, or per (stage, rank)), a request on all or
 * none.
 *
 * Nothing here depends on what the managers' plans cover: a vector of the managers of the
 * pipeline stages (plans of `plan_options::layers`, plan/pipeline_stages.hpp) is admitted the
 * same way, every stage or none, and so is a vector of every (stage, rank) manager.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram {

/**
 * @brief Tensor or pipeline parallelism: admits one request on every rank's (stage's) manager,
 * or on none.
 * @tparam Manager any type with `try_admit(N, T)` and `free(id)` (a `basic_kv_cache_manager`,
 *         or an engine's wrapper around one).
 * @param ranks one manager per rank or per pipeline stage (each built over its own plan); not
 *        owned
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

namespace detail {
/// try_unpark_all / try_resume_all (`op`): `check` every rank's session first (throws), then
/// `restore` on each rank in order; the first that does not fit rolls the others back (freed).
template <class Manager, class Check, class Restore>
std::optional<std::vector<restored_session>> restore_all(
    std::vector<Manager*> const& ranks,
    std::vector<parked_session> const& sessions,
    char const* op,
    Check check,
    Restore restore) {
  TANGRAM_EXPECTS(sessions.size() == ranks.size(),
                  invalid_argument,
                  op,
                  ".sessions: expected one per rank (",
                  ranks.size(),
                  "), got ",
                  sessions.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) check(*ranks[r], sessions[r]);
  std::vector<restored_session> out;
  out.reserve(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    auto got = restore(*ranks[r], sessions[r]);
    if (!got) {
      for (std::size_t k = 0; k < out.size(); ++k) ranks[k]->free(out[k].id);
      return std::nullopt;
    }
    out.push_back(std::move(*got));
  }
  return out;
}
}  // namespace detail

/**
 * @brief Tensor or pipeline parallelism: restores a session parked on every rank (or stage)
 * (`sessions[r]` from rank r's `park`) with its next turn of N prompt and T decode tokens on every
 * rank, or on none.
 * @tparam Manager any type with `unpark_pages`, `try_unpark` and `free` (a
 *         `basic_kv_cache_manager`).
 * @return each rank's restored sequence and pages (same order), or nullopt when any rank cannot
 *         fit it; ranks that had restored it are rolled back (freed), so nothing remains.
 * @throw invalid_argument (before any rank changes) when `sessions.size() != ranks.size()`, or
 *        as `try_unpark` for a session that is not its rank's or bad N, T (every rank's session
 *        is checked first, through `unpark_pages`); std::bad_alloc as `try_unpark`.
 */
template <class Manager>
[[nodiscard]] std::optional<std::vector<restored_session>> try_unpark_all(
    std::vector<Manager*> const& ranks,
    std::vector<parked_session> const& sessions,
    std::int64_t prompt_tokens,
    std::int64_t max_new_tokens) {
  return detail::restore_all(
      ranks,
      sessions,
      "try_unpark_all",
      [&](Manager const& m, parked_session const& p) {
        (void)m.unpark_pages(p, prompt_tokens, max_new_tokens);
      },
      [&](Manager& m, parked_session const& p) {
        return m.try_unpark(p, prompt_tokens, max_new_tokens);
      });
}

/**
 * @brief Tensor or pipeline parallelism: resumes a turn parked in decode on every rank (or
 * stage) (`sessions[r]` from rank r's `park`) with `max_new_tokens` answer tokens in all, on
 * every rank or on none, as `try_unpark_all` restores.
 * @tparam Manager any type with `resume_pages`, `try_resume` and `free`.
 * @throw invalid_argument (before any rank changes) when `sessions.size() != ranks.size()`, or
 *        as `try_resume` (every rank's session is checked first, through `resume_pages`);
 *        std::bad_alloc as `try_resume`.
 */
template <class Manager>
[[nodiscard]] std::optional<std::vector<restored_session>> try_resume_all(
    std::vector<Manager*> const& ranks,
    std::vector<parked_session> const& sessions,
    std::int64_t max_new_tokens) {
  return detail::restore_all(
      ranks,
      sessions,
      "try_resume_all",
      [&](Manager const& m, parked_session const& p) { (void)m.resume_pages(p, max_new_tokens); },
      [&](Manager& m, parked_session const& p) { return m.try_resume(p, max_new_tokens); });
}

}  // namespace tangram
