// SPDX-License-Identifier: Apache-2.0
// NumPy arrays for the bindings (copies of small value arrays, read-only aliases of memory that a
// Python object owns) and copies of bound value types.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>

#include <filesystem>
#include <string>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tangram::python {

/// A file argument: a str or any os.PathLike (pathlib.Path, as tangram.profile_path returns), as
/// the UTF-8 string the io/ functions take.
inline std::string path_string(std::filesystem::path const& p) { return p.u8string(); }

/// A NumPy array that owns a copy of `values`, with shape `shape` (the product must be its size).
template <class T>
nanobind::object numpy_copy(std::vector<T> const& values, std::vector<std::size_t> shape) {
  auto* data = new std::vector<T>(values);
  nanobind::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T>(data->data(), shape.size(), shape.data(), owner)
      .cast();
}

/// `copy.copy` and `copy.deepcopy` for a bound value type `T` (a C++ copy: values share nothing).
template <class T>
void add_value_copies() {
  nanobind::handle cls = nanobind::type<T>();
  nanobind::setattr(cls, "__copy__",
                    nanobind::cpp_function([](T const& x) { return x; }, nanobind::scope(cls),
                                           nanobind::name("__copy__"), nanobind::is_method()));
  nanobind::setattr(cls, "__deepcopy__",
                    nanobind::cpp_function([](T const& x, nanobind::handle) { return x; },
                                           nanobind::scope(cls), nanobind::name("__deepcopy__"),
                                           nanobind::is_method(), nanobind::arg("memo")));
}

/// A read-only 1-D NumPy array of `count` elements at `data`, which `owner` keeps alive.
template <class T>
nanobind::object numpy_alias(T const* data, std::int64_t count, nanobind::handle owner) {
  std::size_t shape[1] = {static_cast<std::size_t>(count)};
  return nanobind::ndarray<nanobind::numpy, T const, nanobind::ndim<1>>(data, 1, shape, owner).cast();
}

/// The same alias as a framework-neutral tensor (nanobind's `nb_ndarray`): it implements
/// `__dlpack__` in both DLPack flavours (versioned, flagged read-only; and legacy, for consumers
/// such as older PyTorch that do not ask for a version — NumPy 2 refuses those for a read-only
/// array) and the buffer protocol.
template <class T>
nanobind::object dlpack_alias(T const* data, std::int64_t count, nanobind::handle owner) {
  std::size_t shape[1] = {static_cast<std::size_t>(count)};
  return nanobind::ndarray<nanobind::array_api, T const, nanobind::ndim<1>>(data, 1, shape, owner)
      .cast();
}

}  // namespace tangram::python
