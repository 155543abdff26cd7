#include <array>
#include <atomic>

#include "../launch/reduce.h"
#include "common.h"
#include "cuda_utils.h"
#include "kernels.h"

namespace fastreduce {

int sm_count() {
  static std::array<std::atomic<int>, 64> cached{};
  const int device = c10::cuda::current_device();
  int count = device < 64 ? cached[device].load() : 0;
  if (count == 0) {
    check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "sm_count");
    if (device < 64) cached[device] = count;
  }
  return count;
}

namespace {

void reduce_cuda(ReduceKind kind, const ReduceParams& params, const at::Tensor& input, int64_t outer, int64_t len,
                 int64_t inner, at::Tensor& out, at::Tensor* second) {
  const c10::cuda::CUDAGuard guard(input.device());
  const ReduceProblem problem{kind,  to_dtype(input.scalar_type(), "reduce"), input.const_data_ptr(), outer, len,
                              inner, params, second && second->defined() ? second->data_ptr() : nullptr};
  const int sms = sm_count();
  const size_t bytes = reduce_workspace_bytes(problem, sms);
  at::Tensor scratch = workspace(input, bytes);
  check_cuda(reduce(problem, out.data_ptr(), bytes ? scratch.data_ptr() : nullptr, sms, current_stream()),
             "fastreduce reduction");
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(reduce_stub, CUDA, reduce_cuda);

}  // namespace fastreduce
