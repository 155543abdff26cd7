// Chooses the decomposition of a reduction (full / rows / columns, how many
// segments) from its shape and the SM count, and launches the kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../kernels/reduce_kernels.cuh"
#include "reduce.h"

namespace fastreduce {
namespace {

constexpr int kAllThreads = 512;
constexpr int kAllBlocksPerSm = 4;
constexpr int kFinishThreads = 1024;
constexpr int kRowThreads = 512;
constexpr int kRowBlocksPerSm = 4;
constexpr int kWarpRowMaxLen = 1024;    // rows up to this length get one warp each
constexpr int64_t kMinSegment = 4096;    // elements: below this a split costs more than it buys
constexpr int kColumnBlocksPerSm = 8;
constexpr int64_t kMinColumnRowsPerLane = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  enum class Layout { All, Rows, Columns } layout;
  int64_t segments;   // partials per output element (1: single pass)
  int64_t chunk;      // elements of `len` per segment
  bool warp_per_row;  // Rows only
};

Plan make_plan(const ReduceProblem& p, size_t elem_size, int sm_count) {
  const int64_t vec = 16 / elem_size;
  if (p.outer == 1 && p.inner == 1) {
    // Enough blocks to fill the chip, each thread with 4 vectors in flight.
    const int64_t per_block = kAllThreads * vec * 4;
    const int64_t blocks = std::min<int64_t>(ceil_div(p.len, per_block), sm_count * kAllBlocksPerSm);
    return {Plan::Layout::All, std::max<int64_t>(blocks, 1), 0, false};
  }
  if (p.inner == 1) {
    const bool warp_per_row = p.len <= kWarpRowMaxLen;
    int64_t segments = 1;
    const int64_t target = int64_t(sm_count) * kRowBlocksPerSm;
    if (!warp_per_row && p.outer < target)
      segments = std::min(ceil_div(target, p.outer), std::max<int64_t>(p.len / kMinSegment, 1));
    // Keep segment starts 16-byte aligned whenever the rows are.
    const int64_t chunk = ceil_div(ceil_div(p.len, segments), vec) * vec;
    return {Plan::Layout::Rows, ceil_div(p.len, chunk), chunk, warp_per_row};
  }
  const int64_t blocks = ceil_div(p.inner, kColumnTile) * p.outer;
  const int64_t target = int64_t(sm_count) * kColumnBlocksPerSm;
  int64_t segments = 1;
  if (blocks < target)
    segments = std::min(ceil_div(target, blocks),
                        std::max<int64_t>(p.len / (kColumnLanes * kMinColumnRowsPerLane), 1));
  const int64_t chunk = std::max<int64_t>(ceil_div(p.len, segments), 1);
  return {Plan::Layout::Columns, std::max<int64_t>(ceil_div(p.len, chunk), 1), chunk, false};
}

template <ReduceKind K, typename In>
cudaError_t launch(const ReduceProblem& p, const In* x, void* output, void* workspace, int sm_count,
                   cudaStream_t stream) {
  using T = ReduceTypes<K, In>;
  using Op = typename T::op_t;
  using Acc = typename T::acc_t;
  using Out = typename T::out_t;
  auto* out = static_cast<Out*>(output);
  auto* partials = static_cast<Acc*>(workspace);
  const Acc scale = static_cast<Acc>(1.0 / static_cast<double>(p.len));
  const Plan plan = make_plan(p, sizeof(In), sm_count);

  switch (plan.layout) {
    case Plan::Layout::All:
      if (plan.segments == 1) {
        reduce_all_kernel<Op, In, Out, true><<<1, kAllThreads, 0, stream>>>(x, p.len, out, scale);
      } else {
        reduce_all_kernel<Op, In, Acc, false>
            <<<plan.segments, kAllThreads, 0, stream>>>(x, p.len, partials, scale);
        reduce_all_kernel<Op, Acc, Out, true>
            <<<1, kFinishThreads, 0, stream>>>(partials, plan.segments, out, scale);
      }
      break;
    case Plan::Layout::Rows: {
      const int warps = kRowThreads / kWarpSize;
      if (plan.warp_per_row) {
        reduce_rows_kernel<Op, In, Out, true, true><<<ceil_div(p.outer, warps), kRowThreads, 0, stream>>>(
            x, p.outer, p.len, 1, plan.chunk, out, scale);
      } else if (plan.segments == 1) {
        reduce_rows_kernel<Op, In, Out, true, false>
            <<<p.outer, kRowThreads, 0, stream>>>(x, p.outer, p.len, 1, plan.chunk, out, scale);
      } else {
        reduce_rows_kernel<Op, In, Acc, false, false><<<p.outer * plan.segments, kRowThreads, 0, stream>>>(
            x, p.outer, p.len, plan.segments, plan.chunk, partials, scale);
        reduce_rows_kernel<Op, Acc, Out, true, true><<<ceil_div(p.outer, warps), kRowThreads, 0, stream>>>(
            partials, p.outer, plan.segments, 1, plan.segments, out, scale);
      }
      break;
    }
    case Plan::Layout::Columns: {
      const dim3 grid(ceil_div(p.inner, kColumnTile) * p.outer, plan.segments);
      if (plan.segments == 1) {
        reduce_columns_kernel<Op, In, Out, true>
            <<<grid, kColumnThreads, 0, stream>>>(x, p.len, p.inner, 1, plan.chunk, out, scale);
      } else {
        reduce_columns_kernel<Op, In, Acc, false><<<grid, kColumnThreads, 0, stream>>>(
            x, p.len, p.inner, plan.segments, plan.chunk, partials, scale);
        reduce_columns_kernel<Op, Acc, Out, true><<<dim3(grid.x, 1), kColumnThreads, 0, stream>>>(
            partials, plan.segments, p.inner, 1, plan.segments, out, scale);
      }
      break;
    }
  }
  return cudaGetLastError();
}

template <typename F>
cudaError_t dispatch_kind(const ReduceProblem& p, F&& f) {
  return visit_reduction<__half, __nv_bfloat16>(p.kind, p.dtype, cudaErrorInvalidValue, f);
}

}  // namespace

size_t reduce_workspace_bytes(const ReduceProblem& problem, int sm_count) {
  size_t bytes = 0;
  dispatch_kind(problem, [&](auto kind, auto tag) {
    using In = typename decltype(tag)::type;
    using Acc = typename ReduceTypes<decltype(kind)::value, In>::acc_t;
    const Plan plan = make_plan(problem, sizeof(In), sm_count);
    if (plan.segments > 1) bytes = plan.segments * problem.outer * problem.inner * sizeof(Acc);
    return cudaSuccess;
  });
  return bytes;
}

cudaError_t reduce(const ReduceProblem& problem, const void* input, void* output, void* workspace,
                   int sm_count, cudaStream_t stream) {
  if (problem.outer * problem.inner == 0) return cudaSuccess;
  return dispatch_kind(problem, [&](auto kind, auto tag) {
    using In = typename decltype(tag)::type;
    return launch<decltype(kind)::value, In>(problem, static_cast<const In*>(input), output, workspace,
                                              sm_count, stream);
  });
}

}  // namespace fastreduce
