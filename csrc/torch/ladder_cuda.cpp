#include "../launch/ladder.h"
#include "common.h"
#include "cuda_utils.h"
#include "kernels.h"

namespace fastreduce {

namespace {

void ladder_cuda(int rung, const at::Tensor& flat, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(flat.device());
  const size_t bytes = ladder_workspace_bytes(flat.numel());
  at::Tensor scratch = workspace(flat, bytes);
  check_cuda(ladder_sum(rung, to_dtype(flat.scalar_type(), "sum_variant"), flat.const_data_ptr(), flat.numel(),
                        out.data_ptr(), bytes ? scratch.data_ptr() : nullptr, sm_count(), current_stream()),
             "sum_variant");
}

void read_probe_cuda(const at::Tensor& data, at::Tensor& flag) {
  const c10::cuda::CUDAGuard guard(data.device());
  check_cuda(read_probe(data.const_data_ptr(), data.nbytes(), flag.data_ptr(), sm_count(), current_stream()),
             "_read_probe");
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(ladder_stub, CUDA, ladder_cuda);
FASTREDUCE_REGISTER_KERNEL(read_probe_stub, CUDA, read_probe_cuda);

}  // namespace fastreduce
