// SPDX-License-Identifier: Apache-2.0
/**
 * @file tangram.hpp
 * @brief Everything host-side in one include. Device code and kernel launchers have their own
 * headers (`tangram/kernels/...`).
 */
#pragma once

#include "tangram/config.hpp"
#include "tangram/device/device_limits.hpp"
#include "tangram/dtype.hpp"
#include "tangram/error.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/numeric.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "tangram/version.hpp"
