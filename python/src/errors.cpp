// SPDX-License-Identifier: Apache-2.0
// C++ errors -> Python exceptions, with the C++ message: invalid_argument -> ValueError (a
// parse_error -> tangram.ParseError, a ValueError), logic_error (misuse) -> tangram.UsageError,
// out_of_memory -> MemoryError. "Does not fit" is never an exception: it is a None return.
#include <exception>

#include "bindings.hpp"
#include "tangram/core/error.hpp"

namespace nb = nanobind;

namespace tangram::python {

void bind_errors(nb::module_& m) {
  // nanobind tries translators newest first: the generic one is registered before the two
  // specific exception types so that they win for their own classes.
  nb::register_exception_translator([](std::exception_ptr const& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (tangram::invalid_argument const& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (tangram::out_of_memory const& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (tangram::cuda_error const& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  nb::exception<tangram::logic_error>(m, "UsageError", PyExc_RuntimeError);
  nb::exception<tangram::parse_error>(m, "ParseError", PyExc_ValueError);
}

}  // namespace tangram::python
