// Counters for kernels whose last block to finish does the final step (the
// single-launch full reduction). A counter starts at zero and the kernel
// that uses it leaves it at zero.
#pragma once

#include <cuda_runtime.h>

namespace fastreduce {

// A counter for one launch on `stream` of the current device. Kernels of one
// stream run one after another, so each stream keeps one counter; a launch
// captured into a CUDA graph gets one of its own, never handed out again
// (the graph may replay on any stream). Null when none is left: the caller
// then zeroes a counter of its own (a memset before the launch).
unsigned int* arrival_counter(cudaStream_t stream);

}  // namespace fastreduce
