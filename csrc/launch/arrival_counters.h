// Counters for kernels whose last block to finish does the final step (the
// single-launch reductions: the last block of a row folds the row's
// partials). A counter starts at zero and the kernel that uses it leaves it
// at zero.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fastreduce {

// The most counters one launch may ask for.
constexpr int64_t kMaxArrivalCounters = 1024;

// `count` (at most kMaxArrivalCounters) counters for one launch on `stream`
// of the current device. Kernels of one stream run one after another, so
// each stream keeps one set; a launch captured into a CUDA graph gets a set
// of its own, never handed out again (the graph may replay on any stream).
// Null when none are left: the caller then zeroes counters of its own (a
// memset before the launch).
unsigned int* arrival_counters(cudaStream_t stream, int64_t count);

}  // namespace fastreduce
