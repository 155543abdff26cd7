#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../kernels/foreach_norm_kernels.cuh"
#include "../kernels/statistic_ops.h"
#include "foreach_norm.h"
#include "launch.h"

namespace fastreduce {
namespace {

template <NormOrder kOrder>
cudaError_t launch(const ForeachTable& table, double ord, void* workspace, cudaStream_t stream) {
  using Op = NormOp<float, kOrder>;
  ReduceParams params;
  params.ord = ord;
  const Op op = Op::make(params, 0);
  auto* partials = static_cast<float*>(workspace);
  const int32_t chunks = table.first_chunk[table.count];
  cudaError_t err = launch_kernel(foreach_norm_chunks_kernel<Op, __half, __nv_bfloat16>, chunks, kForeachThreads, 0,
                                  stream, After::Stream, table, partials, op);
  if (err != cudaSuccess) return err;
  constexpr int kFinishThreads = 256;
  const int blocks = (table.count * kWarpSize + kFinishThreads - 1) / kFinishThreads;
  return launch_kernel(foreach_norm_finish_kernel<Op, __half, __nv_bfloat16>, blocks, kFinishThreads, 0, stream,
                       After::Producer, table, static_cast<const float*>(partials), op);
}

}  // namespace

size_t foreach_norm_workspace_bytes(int32_t chunks) { return static_cast<size_t>(chunks) * sizeof(float); }

cudaError_t foreach_norm(const ForeachTable& table, double ord, void* workspace, cudaStream_t stream) {
  if (table.count == 0) return cudaSuccess;
  switch (norm_order(ord)) {
    case NormOrder::Zero: return launch<NormOrder::Zero>(table, ord, workspace, stream);
    case NormOrder::One: return launch<NormOrder::One>(table, ord, workspace, stream);
    case NormOrder::Two: return launch<NormOrder::Two>(table, ord, workspace, stream);
    case NormOrder::Inf: return launch<NormOrder::Inf>(table, ord, workspace, stream);
    case NormOrder::NegInf: return launch<NormOrder::NegInf>(table, ord, workspace, stream);
    default: return launch<NormOrder::Other>(table, ord, workspace, stream);
  }
}

}  // namespace fastreduce
