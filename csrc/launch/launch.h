// One way to launch a kernel, with or without programmatic dependent launch
// (see kernels/dependent_launch.cuh), returning the launch error.
#pragma once

#include <cuda_runtime.h>

namespace fastreduce {

enum class After { Stream, Producer };

// kernel<<<grid, block, shared_bytes, stream>>>(args...). With After::Producer
// the kernel may start while the previous kernel of the stream drains; it must
// call wait_for_producer() before reading that kernel's output.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, After after, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = after == After::Producer ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace fastreduce
