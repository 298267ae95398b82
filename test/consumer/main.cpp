// SPDX-License-Identifier: Apache-2.0
// Exercises the public API the way an embedding engine would, through the installed or fetched
// package only.
#include <cstdio>
#include <string>

#include "tangram/tangram.hpp"
#ifdef TANGRAM_HAS_KERNELS
#include "tangram/device/device.hpp"
#endif

int main() {
  auto model = tangram::model_preset("meta-llama/Llama-3.1-8B-Instruct");
  model.validate();
  std::printf("tangram %s: %s has %d layers, %d KV heads, %lld KV bytes per token\n",
              tangram::version_string, model.name.c_str(), model.num_layers, model.num_kv_heads,
              static_cast<long long>(model.kv_bytes_per_token()));
#ifdef TANGRAM_HAS_KERNELS
  std::printf("kernels linked; CUDA devices: %d\n", tangram::cuda_device_count());
#endif
  // The data folder the build system named (TANGRAM_DATA_DIR) holds the bundled profiles.
  auto samples = tangram::load_retention_samples(std::string(TANGRAM_DATA_DIR) +
                                                 "/profiles/snapkv/llama-3.1-8b-instruct.json");
  std::printf("%zu retention samples from %s\n", samples.samples.size(), TANGRAM_DATA_DIR);
  return model.kv_bytes_per_token() == 131072 && !samples.samples.empty() ? 0 : 1;
}
