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

void reduce_cuda(const ReduceProblem& problem, void* output) {
  const int sms = sm_count();
  const size_t bytes = reduce_workspace_bytes(problem, sms);
  at::Tensor scratch = workspace(bytes);
  check_cuda(reduce(problem, output, bytes ? scratch.data_ptr() : nullptr, sms, current_stream()),
             "fastreduce reduction");
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(reduce_stub, CUDA, reduce_cuda);

}  // namespace fastreduce
