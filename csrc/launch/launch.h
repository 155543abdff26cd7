// Ways to launch a kernel, returning the launch error: with or without
// programmatic dependent launch (see kernels/dependent_launch.cuh).
#pragma once

#include <cuda_runtime.h>

namespace fastreduce {

enum class After { Stream, Producer };

namespace detail {
template <typename... Params, typename... Args>
cudaError_t launch_with(cudaLaunchAttribute* attributes, unsigned count, void (*kernel)(Params...), dim3 grid,
                        dim3 block, size_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}
}  // namespace detail

// kernel<<<grid, block, shared_bytes, stream>>>(args...). With After::Producer
// the kernel may start while the previous kernel of the stream drains; it must
// call wait_for_producer() before reading that kernel's output.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, After after, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return detail::launch_with(&attribute, after == After::Producer ? 1 : 0, kernel, grid, block, shared_bytes, stream,
                             args...);
}

// How many blocks of `kernel` (threads and dynamic shared bytes each) one
// multiprocessor holds at once: 0 when it cannot run so (or the query failed).
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, size_t shared_bytes = 0) {
  int resident = 0;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared_bytes) == cudaSuccess
             ? resident
             : 0;
}

}  // namespace fastreduce
