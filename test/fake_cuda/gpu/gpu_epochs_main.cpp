// SPDX-License-Identifier: Apache-2.0
// The GPU test of stream_epochs (test/gpu/stream_epochs_test.cpp) on the CPU: the fake CUDA
// runtime (../shim) stands in for the device. Its cudaLaunchHostFunc runs nothing and its queue
// holds work until something waits, so the stream is "held" before the events just as the gate
// holds a real one. What this leaves to a real GPU: the CUDA runtime's own behaviour.
// Its own runner, like test/gpu's (gpu_test.hpp): exit 0 when every test passes, 1 otherwise.
#include <cuda_runtime_api.h>  // the fake: ../shim comes first on the include path

#include "../../../kernels/cuda_memory_resource.cu"
#include "../../../kernels/stream_epochs.cu"
#include "../../gpu/stream_epochs_test.cpp"

int main() {
  return tangram::gpu_test::run_all();
}
