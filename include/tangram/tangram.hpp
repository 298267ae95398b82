// SPDX-License-Identifier: Apache-2.0
/**
 * @file tangram.hpp
 * @brief The model, profile and device types with their file readers and writers (io/) in one
 * include. Planning (`tangram/plan/...`), the memory manager (`tangram/memory/...`) and the kernel
 * launchers (`tangram/kernels/...`) have their own headers.
 */
#pragma once

#include "tangram/config.hpp"
#include "tangram/device/device_limits.hpp"
#include "tangram/dtype.hpp"
#include "tangram/error.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/numeric.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "tangram/version.hpp"
