// SPDX-License-Identifier: Apache-2.0
// `tangram models` and `tangram profiles`: what is built into the program.
#include <iomanip>
#include <memory>
#include <ostream>

#include "embedded_profiles.hpp"
#include "subcommands.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/presets.hpp"

namespace tangram::cli {

namespace {

int list_models(bool json, streams io) {
  if (json) {
    auto arr = tangram::detail::json::value::array();
    for (auto const& name : model_preset_names())
      arr.push_back(tangram::detail::model_to_json(model_preset(name)));
    auto obj = tangram::detail::json::value::object();
    obj.set("models", std::move(arr));
    io.out << tangram::detail::json::dump(obj, -1) << "\n";
    return 0;
  }
  io.out << std::left << std::setw(16) << "preset" << std::right << std::setw(7) << "layers"
         << std::setw(8) << "q_heads" << std::setw(9) << "kv_heads" << std::setw(9) << "head_dim"
         << std::setw(8) << "GQA" << "  layer kinds\n";
  for (auto const& name : model_preset_names()) {
    auto m = model_preset(name);
    std::string kinds;
    if (auto s = m.count(layer_kind::sliding_window)) {
      std::int32_t w = 0;
      for (auto const& l : m.layers)
        if (l.kind == layer_kind::sliding_window) w = l.window;
      kinds = tangram::detail::cat(m.count(layer_kind::compressed), " full + ", s, " sliding (window ", w, ")");
    } else {
      kinds = tangram::detail::cat(m.num_layers, " full");
    }
    if (m.attention_sinks) kinds += ", attention sinks";
    io.out << std::left << std::setw(16) << name << std::right << std::setw(7) << m.num_layers
           << std::setw(8) << m.num_query_heads << std::setw(9) << m.num_kv_heads << std::setw(9)
           << m.head_dim << std::setw(8) << m.gqa_group() << "  " << kinds << "\n";
  }
  return 0;
}

}  // namespace

command_body setup_models(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  app.add_flag("--json", *json, "One JSON document: every preset's model spec");
  return [json](streams io) { return list_models(*json, io); };
}

command_body setup_profiles(CLI::App&) {
  return [](streams io) {
    for (auto const& f : embedded_profiles()) {
      std::string_view n = f.name;
      io.out << n.substr(0, n.size() - 5) << "\n";  // without ".json"
    }
    return 0;
  };
}

}  // namespace tangram::cli
