// SPDX-License-Identifier: Apache-2.0
// The GPU tests of kv_view_mirror (test/gpu/kv_view_mirror_test.cpp) run on the CPU: the fake CUDA
// runtime (../shim) stands in for the device, and decode_attention for the kernel is the CPU
// reference reading the mirrored view (the fake's "device" memory is host memory). What this
// leaves to a real GPU: the CUDA runtime's own behaviour and the decode kernel itself.
// Its own runner, like test/gpu's (gpu_test.hpp): exit 0 when every test passes, 1 otherwise.
#include <cuda_runtime_api.h>  // the fake: ../shim comes first on the include path

#include "../../../kernels/cuda_memory_resource.cu"
#include "../../../kernels/kv_view_mirror.cu"
#include "../../gpu/kv_view_mirror_test.cpp"
#include "tangram/reference/decode_attention.hpp"

namespace tangram {
/// The kernel's stand-in: the uploads before it on the stream run first, then the reference.
void decode_attention(decode_params const& p, void*, std::size_t, cuda_stream_t) {
  fake_cuda::run();
  reference::decode_attention(p, reference::split_mode::split);
}
}  // namespace tangram

int main() {
  return tangram::gpu_test::run_all();
}
