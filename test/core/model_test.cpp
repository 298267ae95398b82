// SPDX-License-Identifier: Apache-2.0
#include "tangram/core/version.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;

TEST_CASE("version header matches the CMake project version", "[version]") {
  CHECK(std::string(version_string) == TANGRAM_PROJECT_VERSION);
}

TEST_CASE("presets carry the published shapes", "[model]") {
  struct row {
    char const* name;
    int layers, q, kv, d;
    long long kv_bytes_per_token;  // all layers, bf16: 2 * d * 2 bytes * layers * kv
  };
  // Hand-computed from the configs listed in docs/formats.md.
  row rows[] = {{"qwen3-4b", 36, 32, 8, 128, 147456},      {"llama-3.1-8b", 32, 32, 8, 128, 131072},
                {"gemma-3-12b", 48, 16, 8, 256, 393216},   {"gpt-oss-20b", 24, 64, 8, 64, 49152},
                {"qwen3-30b-a3b", 48, 32, 4, 128, 98304},  {"qwen2.5-7b", 28, 28, 4, 128, 57344},
                {"qwen2.5-32b", 64, 40, 8, 128, 262144},   {"llama-3.1-70b", 80, 64, 8, 128, 327680}};
  REQUIRE(model_preset_names().size() == std::size(rows));
  for (auto const& r : rows) {
    auto m = model_preset(r.name);
    INFO(r.name);
    CHECK_NOTHROW(m.validate());
    CHECK(m.num_layers == r.layers);
    CHECK(m.num_query_heads == r.q);
    CHECK(m.num_kv_heads == r.kv);
    CHECK(m.head_dim == r.d);
    CHECK(m.kv_bytes_per_token() == r.kv_bytes_per_token);
    CHECK(m.weight_bytes > 5e9);
  }
  CHECK(model_preset("qwen2.5-7b").gqa_group() == 7);
  CHECK(model_preset("qwen2.5-32b").gqa_group() == 5);
}

TEST_CASE("hybrid presets mark their sliding-window layers", "[model]") {
  auto gemma = model_preset("gemma-3-12b");
  CHECK(gemma.count(layer_kind::sliding_window) == 40);
  CHECK(gemma.count(layer_kind::compressed) == 8);
  for (int l = 0; l < 48; ++l) {
    bool full = l % 6 == 5;
    CHECK(gemma.layers[l].kind == (full ? layer_kind::compressed : layer_kind::sliding_window));
    CHECK(gemma.layers[l].window == (full ? 0 : 1024));
  }
  auto oss = model_preset("gpt-oss-20b");
  CHECK(oss.attention_sinks);
  CHECK(oss.layers[0].kind == layer_kind::sliding_window);
  CHECK(oss.layers[0].window == 128);
  CHECK(oss.layers[1].kind == layer_kind::compressed);
  CHECK(oss.count(layer_kind::sliding_window) == 12);
  CHECK(oss.active_weight_bytes < oss.weight_bytes);
}

TEST_CASE("preset lookup accepts Hugging Face ids", "[model]") {
  CHECK(find_model_preset("meta-llama/Llama-3.1-8B-Instruct")->name == "Llama-3.1-8B");
  CHECK(find_model_preset("Qwen/Qwen3-4B-Instruct-2507")->name == "Qwen3-4B");
  CHECK(find_model_preset("google/gemma-3-12b-it")->name == "Gemma-3-12B");
  CHECK_FALSE(find_model_preset("gpt-5").has_value());
  TANGRAM_REQUIRE_THROWS_WITH_ALL(model_preset("gpt-5"), invalid_argument, "unknown preset \"gpt-5\"", "llama-3.1-8b");
}

TEST_CASE("model_spec validation names the field and value", "[model][errors]") {
  auto m = model_preset("llama-3.1-8b");
  auto bad = m;
  bad.num_kv_heads = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "num_kv_heads", "got 0");
  bad = m;
  bad.num_kv_heads = 5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "num_query_heads", "32", "(5)");
  bad = m;
  bad.layers.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "layers", "expected 32", "got 31");
  bad = m;
  bad.layers[3] = {layer_kind::sliding_window, 0};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "layers[3].window", "got 0");
  bad = m;
  bad.layers[4] = {layer_kind::compressed, 12};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "layers[4].window", "got 12");
}

TEST_CASE("model_spec JSON round-trips and rejects bad fields", "[model][errors]") {
  for (auto const& name : model_preset_names()) {
    auto m    = model_preset(name);
    auto back = parse_model_spec(to_json(m), "rt");
    CHECK(back.name == m.name);
    CHECK(back.layers == m.layers);
    CHECK(back.num_query_heads == m.num_query_heads);
    CHECK(back.attention_sinks == m.attention_sinks);
    CHECK(back.weight_bytes == m.weight_bytes);
    CHECK(back.active_parameters == m.active_parameters);
    CHECK(back.kv_dtype == m.kv_dtype);
  }
  std::string good = to_json(model_preset("gpt-oss-20b"));
  auto mutate = [&](std::string const& from, std::string const& to) {
    auto pos = good.find(from);
    REQUIRE(pos != std::string::npos);
    return good.substr(0, pos) + to + good.substr(pos + from.size());
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"kv_dtype\": \"bf16\"", "\"kv_dtype\": \"int3\""), "m.json"),
                                  parse_error, "m.json: kv_dtype", "\"int3\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"num_layers\": 24", "\"num_layers\": 23"), "m.json"),
                                  parse_error, "layers", "expected 23 elements", "got 24");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"window\": 128", "\"window\": -1"), "m.json"),
                                  parse_error, "layers[0].window", "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"kind\": \"sliding_window\"", "\"kind\": \"linear\""), "m.json"),
                                  parse_error, "layers[0].kind", "\"linear\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"head_dim\": 64,", ""), "m.json"), parse_error,
                                  "head_dim: missing required field");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_model_spec(mutate("\"num_kv_heads\": 8", "\"num_kv_heads\": 7"), "m.json"),
                                  parse_error, "num_query_heads", "multiple of num_kv_heads (7)");
}
