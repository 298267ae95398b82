// SPDX-License-Identifier: Apache-2.0
// tangram._tangram: Python bindings over the same headers engines embed (docs/python.md).
#include "bindings.hpp"

#include "tangram/core/version.hpp"

NB_MODULE(_tangram, m) {
  m.doc() = "Tangram: per-head KV-cache budgets, head-group paging and an AOT decode split.";
  m.attr("__version__") = TANGRAM_VERSION_STRING;
  tangram::python::bind_errors(m);
  tangram::python::bind_model(m);
  tangram::python::bind_profiles(m);
  tangram::python::bind_plan(m);
  tangram::python::bind_manager(m);
  tangram::python::bind_reference(m);
  tangram::python::bind_interop(m);
#if TANGRAM_HAS_KERNELS
  m.attr("has_cuda_kernels") = true;
  tangram::python::bind_cuda(m);
#else
  m.attr("has_cuda_kernels") = false;
#endif
}
