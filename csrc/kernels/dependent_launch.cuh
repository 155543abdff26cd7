// Programmatic dependent launch (Hopper, sm_90+): a producer kernel lets the
// next kernel of its stream start launching before it ends, and that consumer
// waits for the producer's writes before it reads them. The launch latency of
// a second pass then hides behind the first pass's last loads. Both calls are
// no-ops on older GPUs and in kernels launched without the attribute.
#pragma once

namespace fastreduce {

// Producer side: the consumer's blocks may be scheduled from now on.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Consumer side: returns once the producer grid has finished and its writes
// are visible. Call before the first read of the producer's output.
__device__ __forceinline__ void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fastreduce
