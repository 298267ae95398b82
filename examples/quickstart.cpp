// SPDX-License-Identifier: Apache-2.0
// Quick start: load a model preset and a real retention profile, print their shapes.
#include <cstdio>

#include "tangram/tangram.hpp"

int main() {
  auto model   = tangram::model_preset("llama-3.1-8b");
  auto samples = tangram::load_retention_samples(std::string(TANGRAM_DATA_DIR) +
                                                 "/profiles/snapkv/llama-3.1-8b-instruct.json");
  std::printf("%s: %d layers x %d KV heads, %zu pilot samples, %lld KV bytes per token\n",
              model.name.c_str(), model.num_layers, model.num_kv_heads, samples.samples.size(),
              static_cast<long long>(model.kv_bytes_per_token()));
  return 0;
}
