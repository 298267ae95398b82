// SPDX-License-Identifier: Apache-2.0
// Model specs: presets, files, and the fields a Python engine reads.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/model/presets.hpp"

namespace nb = nanobind;

namespace tangram::python {

void bind_model(nb::module_& m) {
  nb::class_<layer_spec>(m, "LayerSpec", "One decoder layer: its kind and sliding window.")
      .def_prop_ro("kind", [](layer_spec const& l) { return std::string(to_string(l.kind)); })
      .def_ro("window", &layer_spec::window);

  nb::class_<model_spec>(m, "ModelSpec", "Attention shape of a model (a value; copies are independent).")
      .def_ro("name", &model_spec::name)
      .def_ro("num_layers", &model_spec::num_layers)
      .def_ro("num_query_heads", &model_spec::num_query_heads)
      .def_ro("num_kv_heads", &model_spec::num_kv_heads)
      .def_ro("head_dim", &model_spec::head_dim)
      .def_prop_ro("kv_dtype", [](model_spec const& s) { return std::string(to_string(s.kv_dtype)); })
      .def_ro("layers", &model_spec::layers)
      .def_prop_ro("gqa_group", &model_spec::gqa_group)
      .def_prop_ro("kv_bytes_per_token", &model_spec::kv_bytes_per_token)
      .def("__repr__", [](model_spec const& s) {
        return "ModelSpec(" + s.name + ", " + std::to_string(s.num_layers) + " layers x " +
               std::to_string(s.num_kv_heads) + " KV heads)";
      });

  m.def("model_preset", [](std::string const& name) { return model_preset(name); }, nb::arg("name"),
        "A built-in model by name (e.g. \"llama-3.1-8b\"). Raises ValueError naming the known ones.");
  m.def("model_preset_names", &model_preset_names, "Names of the built-in models.");
  m.def("load_model_spec",
        [](std::filesystem::path const& p) { return load_model_spec(path_string(p)); },
        nb::arg("path"),
        "Reads a tangram-model/v1 file. Raises ParseError naming the field.");
  m.def("parse_model_spec",
        [](std::string const& text, std::string const& source) {
          return parse_model_spec(text, source);
        },
        nb::arg("text"), nb::arg("source") = "<string>",
        "A tangram-model/v1 document from a string (e.g. built from a Hugging Face config).");
  add_value_copies<model_spec>();
}

}  // namespace tangram::python
