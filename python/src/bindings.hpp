// SPDX-License-Identifier: Apache-2.0
// The parts of the tangram._tangram extension, one per concept (module.cpp calls them in order).
#pragma once

#include <nanobind/nanobind.h>

namespace tangram::python {

void bind_errors(nanobind::module_& m);    // exception mapping (errors.cpp)
void bind_model(nanobind::module_& m);     // model specs and presets (model.cpp)
void bind_profiles(nanobind::module_& m);  // samples, budget profiles, calibration (profiles.cpp)
void bind_plan(nanobind::module_& m);      // plan options, static plans (plan.cpp)
void bind_manager(nanobind::module_& m);   // the KV-cache manager and its view (manager.cpp)
void bind_reference(nanobind::module_& m); // CPU reference kernels on NumPy (reference.cpp)
void bind_interop(nanobind::module_& m);   // batch kinds, FlashInfer/FlashAttention exports (interop.cpp)
void bind_cuda(nanobind::module_& m);      // tangram.cuda launchers (cuda/kernels.cpp; CUDA builds)

}  // namespace tangram::python
