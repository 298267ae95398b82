// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/out_of_sample.hpp
 * @brief Replays on unseen prompts (`tangram simulate --verdict`): the retention samples are cut
 * into two folds grouped by prompt (samples of equal context length, one long prompt asked
 * several questions, share a fold: `evaluation_options::group_by_context`, as `tangram calibrate
 * --group-by-context` folds them), and each fold is replayed with everything calibrated on the
 * other: Tangram's budgets, head groups and split maps (the elastic plan's weighed on the
 * calibration fold's placements) from the calibration fold; every input's retention (what the
 * dynamic compressors keep, what Tangram's elastic eviction wants) and every measured skew from
 * the replayed fold. Both ways, so every prompt is replayed once unseen.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/plan/calibration.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::sim {

/// @brief One way of an out-of-sample replay: calibrate on `calibration`, replay `replay`.
struct sample_fold {
  retention_samples calibration, replay;
  std::vector<std::size_t> calibration_ids, replay_ids;  ///< indices into the input's samples
};

/// `s` keeping only the samples `ids` (in that order).
inline retention_samples sample_subset(retention_samples s, std::vector<std::size_t> const& ids) {
  std::vector<retention_sample> kept;
  kept.reserve(ids.size());
  for (auto k : ids) kept.push_back(std::move(s.samples.at(k)));
  s.samples = std::move(kept);
  return s;
}

/**
 * @brief The folds of an out-of-sample replay (file comment): fold f replays the samples whose
 * distinct context length has rank r with r mod `folds` == f, calibrated on the others.
 * @throw invalid_argument naming the folds when the samples have fewer distinct context lengths
 *        than `folds`, or folds < 2.
 */
inline std::vector<sample_fold> prompt_folds(retention_samples const& s, std::int32_t folds = 2) {
  evaluation_options e;
  e.folds            = folds;
  e.group_by_context = true;
  e.validate();
  TANGRAM_EXPECTS(folds >= 2, invalid_argument, "folds: must be >= 2, got ", folds);
  auto assignment = detail::assign_folds(s, e);
  std::vector<sample_fold> out(static_cast<std::size_t>(folds));
  for (std::int32_t f = 0; f < folds; ++f) {
    auto& fold = out[static_cast<std::size_t>(f)];
    assignment.split(f, fold.calibration_ids, fold.replay_ids);
    fold.calibration = sample_subset(s, fold.calibration_ids);
    fold.replay      = sample_subset(s, fold.replay_ids);
  }
  return out;
}

}  // namespace tangram::sim
