// SPDX-License-Identifier: Apache-2.0
// Device tensors from DLPack or __cuda_array_interface__, and streams (device_tensor.hpp).
#include "device_tensor.hpp"

#include "../dtypes.hpp"

#include <nanobind/stl/string.h>

#include <sstream>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"

namespace nb = nanobind;

namespace tangram::python {

namespace {

using code = nb::dlpack::dtype_code;

/// A __cuda_array_interface__ typestr ("<f4", "|u1", ...) as a DLPack dtype.
nb::dlpack::dtype dtype_from_typestr(std::string const& s, char const* name) {
  TANGRAM_EXPECTS(s.size() >= 3 && (s[0] == '<' || s[0] == '|' || s[0] == '='), invalid_argument,
                  name, ": __cuda_array_interface__ typestr '", s,
                  "' is not a little-endian scalar type");
  nb::dlpack::dtype t{};
  switch (s[1]) {
    case 'f':
      t.code = static_cast<std::uint8_t>(code::Float);
      break;
    case 'i':
      t.code = static_cast<std::uint8_t>(code::Int);
      break;
    case 'u':
      t.code = static_cast<std::uint8_t>(code::UInt);
      break;
    default:
      TANGRAM_FAIL(invalid_argument, name, ": __cuda_array_interface__ typestr '", s,
                   "' is not an integer or floating-point type");
  }
  int bytes = 0;
  for (std::size_t i = 2; i < s.size(); ++i) {
    TANGRAM_EXPECTS(s[i] >= '0' && s[i] <= '9' && bytes < 64, invalid_argument, name,
                    ": __cuda_array_interface__ typestr '", s, "' has a bad size");
    bytes = bytes * 10 + (s[i] - '0');
  }
  TANGRAM_EXPECTS(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8, invalid_argument, name,
                  ": __cuda_array_interface__ typestr '", s, "' has a bad size");
  t.bits  = static_cast<std::uint8_t>(8 * bytes);
  t.lanes = 1;
  return t;
}

/// Strides (in elements) of a C-contiguous tensor of `shape`.
std::vector<std::int64_t> c_strides(std::vector<std::int64_t> const& shape) {
  std::vector<std::int64_t> out(shape.size());
  std::int64_t step = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    out[i] = step;
    step   = detail::mul_or_throw(step, shape[i] > 0 ? shape[i] : 1, "tensor elements");
  }
  return out;
}

/// A tuple member of a __cuda_array_interface__ dict (a list or anything else is refused: the
/// protocol says tuple, and a lying object must get an error, never a misread).
nb::tuple cai_tuple(nb::dict const& d, char const* key, char const* name) {
  nb::object v = d[key];
  TANGRAM_EXPECTS(nb::isinstance<nb::tuple>(v), invalid_argument, name,
                  ": __cuda_array_interface__ ", key, " must be a tuple, got ",
                  nb::cast<std::string>(nb::str(v.type())));
  return nb::borrow<nb::tuple>(v);
}

/// An integer member (a Python int in range), or an error naming the field.
template <class T>
T cai_int(nb::handle v, char const* field, char const* name) {
  T out{};
  TANGRAM_EXPECTS(nb::isinstance<nb::int_>(v) && nb::try_cast(v, out, /*convert=*/false),
                  invalid_argument, name, ": __cuda_array_interface__ ", field,
                  " must be an integer in range, got ", nb::cast<std::string>(nb::repr(v)));
  return out;
}

device_tensor from_cuda_array_interface(nb::handle obj, nb::handle cai, char const* name) {
  TANGRAM_EXPECTS(nb::isinstance<nb::dict>(cai), invalid_argument, name,
                  ": __cuda_array_interface__ is not a dict");
  nb::dict d = nb::borrow<nb::dict>(cai);
  TANGRAM_EXPECTS(d.contains("shape") && d.contains("typestr") && d.contains("data"),
                  invalid_argument, name,
                  ": __cuda_array_interface__ lacks one of shape, typestr, data");
  device_tensor t;
  nb::object typestr = d["typestr"];
  TANGRAM_EXPECTS(nb::isinstance<nb::str>(typestr), invalid_argument, name,
                  ": __cuda_array_interface__ typestr must be a string");
  t.dtype = dtype_from_typestr(nb::cast<std::string>(typestr), name);
  for (nb::handle e : cai_tuple(d, "shape", name)) {
    auto x = cai_int<std::int64_t>(e, "shape", name);
    TANGRAM_EXPECTS(x >= 0, invalid_argument, name, ": negative extent ", x);
    t.shape.push_back(x);
  }
  (void)t.bytes();  // overflow-checked extents
  nb::tuple data = cai_tuple(d, "data", name);
  TANGRAM_EXPECTS(nb::len(data) == 2 && nb::isinstance<nb::bool_>(data[1]), invalid_argument,
                  name, ": __cuda_array_interface__ data must be (pointer, read_only)");
  t.data     = reinterpret_cast<void*>(cai_int<std::uintptr_t>(data[0], "data pointer", name));
  t.readonly = nb::cast<bool>(data[1]);
  TANGRAM_EXPECTS(t.data != nullptr || t.elements() == 0, invalid_argument, name,
                  ": __cuda_array_interface__ data pointer is null");
  if (d.contains("mask"))
    TANGRAM_EXPECTS(d["mask"].is_none(), invalid_argument, name, ": masked arrays are not supported");
  if (d.contains("strides") && !d["strides"].is_none()) {
    nb::tuple strides = cai_tuple(d, "strides", name);
    TANGRAM_EXPECTS(nb::len(strides) == t.shape.size(), invalid_argument, name, ": ",
                    nb::len(strides), " strides for ", t.shape.size(), " dimensions");
    auto want = c_strides(t.shape);
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      auto bytes = cai_int<std::int64_t>(strides[i], "strides", name);
      TANGRAM_EXPECTS(t.shape[i] <= 1 || bytes == want[i] * (t.dtype.bits / 8), invalid_argument,
                      name, ": must be C-contiguous (dimension ", i, " has a stride of ", bytes,
                      " bytes)");
    }
  }
  t.owner = nb::borrow(obj);
  return t;
}

}  // namespace

std::int64_t device_tensor::elements() const {
  std::int64_t n = 1;
  for (auto x : shape) n = detail::mul_or_throw(n, x, "tensor elements");
  return n;
}

std::int64_t device_tensor::bytes() const {
  return detail::mul_or_throw(elements(), std::int64_t{dtype.bits / 8}, "tensor bytes");
}

std::string device_tensor::describe() const {
  std::ostringstream o;
  o << dtype_name(dtype) << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) o << (i ? ", " : "") << shape[i];
  o << ']';
  return o.str();
}

device_tensor device_tensor_from(nb::handle obj, char const* name) {
  TANGRAM_EXPECTS(obj.is_valid() && !obj.is_none(), invalid_argument, name,
                  ": expected a CUDA tensor, got None");
  if (nb::hasattr(obj, "__cuda_array_interface__") && !nb::hasattr(obj, "__dlpack__"))
    return from_cuda_array_interface(obj, obj.attr("__cuda_array_interface__"), name);
  // Writable first; a tensor exported read-only (DLPack 1.0's flag, e.g. JAX) only as read-only.
  nb::ndarray<nb::ro> a;
  bool readonly = false;
  nb::ndarray<> writable;
  if (nb::try_cast(obj, writable, /*convert=*/false)) {
    a = nb::ndarray<nb::ro>(writable);
  } else {
    readonly = true;
    TANGRAM_EXPECTS(nb::try_cast(obj, a, /*convert=*/false), invalid_argument, name,
                    ": expected a CUDA tensor (DLPack or __cuda_array_interface__), got ",
                    nb::cast<std::string>(nb::str(obj.type())));
  }
  TANGRAM_EXPECTS(a.device_type() == nb::device::cuda::value ||
                      a.device_type() == nb::device::cuda_managed::value,
                  invalid_argument, name, ": expected a CUDA tensor, got one on DLPack device type ",
                  a.device_type(), a.device_type() == nb::device::cpu::value ? " (cpu)" : "");
  device_tensor t;
  t.data     = const_cast<void*>(static_cast<void const*>(a.data()));
  t.dtype    = a.dtype();
  t.device   = a.device_id();
  t.readonly = readonly;
  for (std::size_t i = 0; i < a.ndim(); ++i) t.shape.push_back(static_cast<std::int64_t>(a.shape(i)));
  auto want = c_strides(t.shape);
  for (std::size_t i = 0; i < a.ndim(); ++i)
    TANGRAM_EXPECTS(t.shape[i] <= 1 || a.stride(i) == want[i], invalid_argument, name,
                    ": must be C-contiguous (dimension ", i, " has a stride of ", a.stride(i),
                    " elements)");
  t.owner = nb::borrow(obj);
  return t;
}

void expect_shape(device_tensor const& t, std::initializer_list<std::int64_t> want, char const* name) {
  bool ok = t.shape.size() == want.size();
  std::size_t i = 0;
  for (auto w : want) ok = ok && (w < 0 || t.shape[i++] == w);
  if (ok) return;
  std::ostringstream o;
  o << '[';
  i = 0;
  for (auto w : want) o << (i++ ? ", " : "") << (w < 0 ? std::string("*") : std::to_string(w));
  o << ']';
  TANGRAM_FAIL(invalid_argument, name, ": expected shape ", o.str(), ", got ", t.describe());
}

void expect_writable(device_tensor const& t, char const* name) {
  TANGRAM_EXPECTS(!t.readonly, invalid_argument, name, ": is an output but the tensor is read-only");
}

cuda_stream_t stream_from(nb::handle obj) {
  auto handle_of = [](nb::handle v, char const* what) {
    std::uintptr_t h = 0;
    TANGRAM_EXPECTS(nb::isinstance<nb::int_>(v) && nb::try_cast(v, h, /*convert=*/false),
                    invalid_argument, "stream: ", what, " must be a non-negative integer handle, got ",
                    nb::cast<std::string>(nb::repr(v)));
    return h;
  };
  std::uintptr_t handle = 0;
  if (!obj.is_valid() || obj.is_none()) {
    handle = 0;
  } else if (nb::isinstance<nb::int_>(obj)) {
    handle = handle_of(obj, "the integer");
  } else if (nb::hasattr(obj, "__cuda_stream__")) {
    nb::object r = obj.attr("__cuda_stream__")();
    TANGRAM_EXPECTS(nb::isinstance<nb::tuple>(r) && nb::len(r) == 2, invalid_argument,
                    "stream: __cuda_stream__() must return (version, handle)");
    handle = handle_of(nb::borrow<nb::tuple>(r)[1], "__cuda_stream__()[1]");
  } else if (nb::hasattr(obj, "cuda_stream")) {
    handle = handle_of(obj.attr("cuda_stream"), "cuda_stream");
  } else if (nb::hasattr(obj, "ptr")) {
    handle = handle_of(obj.attr("ptr"), "ptr");
  } else {
    TANGRAM_FAIL(invalid_argument, "stream: expected None, an integer handle or a stream object "
                 "(__cuda_stream__, cuda_stream or ptr), got ",
                 nb::cast<std::string>(nb::str(obj.type())));
  }
  return reinterpret_cast<cuda_stream_t>(handle);
}

}  // namespace tangram::python
