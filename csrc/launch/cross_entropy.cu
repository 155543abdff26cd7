#include "cross_entropy.h"

#include <algorithm>

#include "../kernels/cross_entropy_kernels.cuh"
#include "rows.h"

namespace fastreduce {
namespace {

using namespace rows;

// Threads per row: enough for a few packs each, kCrossEntropyThreads at most.
int cross_entropy_threads(int64_t groups) {
  int threads = kWarpSize;
  while (threads < kCrossEntropyThreads && threads * int64_t(4) < groups) threads *= 2;
  return threads;
}

template <typename T>
CrossEntropyArgs<T> kernel_args(const CrossEntropyShape& shape, const void* logits, const int64_t* target) {
  return {static_cast<const T*>(logits), target, shape.rows, shape.classes, shape.ignore_index,
          static_cast<opmath_t<T>>(shape.label_smoothing)};
}

}  // namespace

size_t cross_entropy_workspace_bytes(const CrossEntropyShape& shape) {
  const size_t acc = shape.dtype == DType::Double ? 8 : 4;
  return std::max<int64_t>(shape.rows, 1) * acc;
}

cudaError_t cross_entropy_forward(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io,
                                  void* workspace, cudaStream_t stream) {
  const void* logits = io.logits;
  const int64_t* target = io.target;
  void *loss = io.loss, *lse = io.lse;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target);
    auto* row_loss = static_cast<A*>(workspace);
    if (shape.rows > 0) {
      const cudaError_t err = with_vec<T>(shape.classes, {logits}, [&](auto vec) {
        constexpr int kVec = decltype(vec)::value;
        cross_entropy_forward_kernel<T, kVec><<<shape.rows, cross_entropy_threads(shape.classes / kVec), 0, stream>>>(
            a, static_cast<A*>(lse), row_loss);
        return cudaGetLastError();
      });
      if (err != cudaSuccess) return err;
    }
    const auto reduction = static_cast<LossReduction>(shape.reduction);
    const int64_t blocks = reduction == LossReduction::None ? std::clamp<int64_t>(ceil_div(shape.rows, 1024), 1, 1024) : 1;
    cross_entropy_reduce_kernel<T><<<blocks, 1024, 0, stream>>>(a, row_loss, reduction, static_cast<T*>(loss));
    return cudaGetLastError();
  });
}

cudaError_t cross_entropy_backward(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io,
                                   void* workspace, cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  const void *grad_loss = io.grad_loss, *grad_lse = io.grad_lse, *logits = io.logits, *lse = io.lse;
  const int64_t* target = io.target;
  void* grad_input = io.grad_input;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target);
    const auto reduction = static_cast<LossReduction>(shape.reduction);
    auto* scale = static_cast<A*>(workspace);
    const bool per_row = reduction == LossReduction::None;
    if (!per_row) {
      cross_entropy_grad_scale_kernel<T><<<1, 1024, 0, stream>>>(a, static_cast<const T*>(grad_loss), reduction, scale);
      if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    }
    return with_vec<T>(shape.classes, {logits, grad_input}, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      cross_entropy_backward_kernel<T, kVec><<<shape.rows, cross_entropy_threads(shape.classes / kVec), 0, stream>>>(
          a, per_row ? static_cast<const T*>(grad_loss) : nullptr, scale, static_cast<const A*>(grad_lse),
          static_cast<const A*>(lse), static_cast<T*>(grad_input));
      return cudaGetLastError();
    });
  });
}

cudaError_t cross_entropy_forward_backward(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io,
                                           cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  const void *logits = io.logits, *grad_scale = io.grad_scale;
  const int64_t* target = io.target;
  void *lse = io.lse, *row_loss = io.row_loss, *grad_input = io.grad_input;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target);
    return with_vec<T>(shape.classes, {logits, grad_input}, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      cross_entropy_forward_backward_kernel<T, kVec>
          <<<shape.rows, cross_entropy_threads(shape.classes / kVec), 0, stream>>>(
              a, static_cast<const A*>(grad_scale), static_cast<A*>(lse), static_cast<A*>(row_loss),
              static_cast<T*>(grad_input));
      return cudaGetLastError();
    });
  });
}

}  // namespace fastreduce
