// data *= factor, with the factor read on the device: a loss's gradient
// computed in the forward is scaled in the backward by the incoming gradient
// without a host synchronisation, and not touched at all when that gradient
// is 1 (the usual loss.backward()): every block returns at once.
#pragma once

#include "row_io.cuh"

namespace fastreduce {

// v * f in the accumulator type, rounded once to T.
template <typename T>
__device__ __forceinline__ T scaled(T v, opmath_t<T> f) {
  return static_cast<T>(static_cast<opmath_t<T>>(v) * f);
}

// Whether any target is not ignore_index, the block together; one round of
// blockDim.x targets settles it unless the first ones are all ignored.
__device__ __forceinline__ bool any_target_counts(const int64_t* __restrict__ target, int64_t count,
                                                  int64_t ignore_index) {
  for (int64_t base = 0; base < count; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    if (__syncthreads_or(i < count && target[i] != ignore_index)) return true;
  }
  return false;
}

// n elements, flat; with check_targets, nothing is written when no target
// counts. F: the factor's type, the data's own (a loss's incoming gradient)
// or its accumulator type.
template <typename T, typename F, int kVec>
__global__ void scale_unless_one_kernel(T* data, int64_t n, const F* __restrict__ factor, bool check_targets,
                                        const int64_t* __restrict__ target, int64_t target_count,
                                        int64_t ignore_index) {
  using Pack = VecN<T, kVec>;
  const opmath_t<T> f = static_cast<opmath_t<T>>(*factor);
  if (f == opmath_t<T>(1)) return;
  if (check_targets && !any_target_counts(target, target_count, ignore_index)) return;
  const int64_t packs = n / kVec, stride = int64_t(gridDim.x) * blockDim.x;
  auto* p = reinterpret_cast<Pack*>(data);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += stride) {
    Pack v = p[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) v.elem[k] = scaled(v.elem[k], f);
    p[i] = v;
  }
  // The tail past the last whole pack.
  for (int64_t i = packs * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    data[i] = scaled(data[i], f);
}

// rows x width, a target a row, the rows whose target is ignore_index left as
// they are: flat over packs as above, each thread following its pack's row
// and column from one division. width >= kVec, so a pack spans at most two
// rows.
template <typename T, typename F, int kVec>
__global__ void scale_rows_unless_one_kernel(T* data, int64_t rows, int64_t width, const F* __restrict__ factor,
                                             const int64_t* __restrict__ target, int64_t ignore_index) {
  using Pack = VecN<T, kVec>;
  const opmath_t<T> f = static_cast<opmath_t<T>>(*factor);
  if (f == opmath_t<T>(1)) return;
  const int64_t n = rows * width, packs = n / kVec, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t step_rows = stride * kVec / width, step_columns = stride * kVec % width;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t row = first * kVec / width, column = first * kVec % width;
  auto* p = reinterpret_cast<Pack*>(data);
  for (int64_t i = first; i < packs; i += stride) {
    const bool counts = target[row] != ignore_index;
    const bool next_counts = column + kVec > width && target[row + 1] != ignore_index;
    if (counts || next_counts) {
      Pack v = p[i];
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (column + k < width ? counts : next_counts) v.elem[k] = scaled(v.elem[k], f);
      p[i] = v;
    }
    row += step_rows;
    column += step_columns;
    if (column >= width) {
      column -= width;
      ++row;
    }
  }
  for (int64_t i = packs * kVec + first; i < n; i += stride)
    if (target[i / width] != ignore_index) data[i] = scaled(data[i], f);
}

}  // namespace fastreduce
