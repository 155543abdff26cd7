#include "ladder.h"

#include "../ladder/01_atomic_global.cuh"
#include "../ladder/02_atomic_shared.cuh"
#include "../ladder/03_atomic_vec4.cuh"
#include "../ladder/04_interleaved_divergent.cuh"
#include "../ladder/05_interleaved_bank.cuh"
#include "../ladder/06_sequential.cuh"
#include "../ladder/07_first_add.cuh"
#include "../ladder/08_warp_unroll.cuh"
#include "../ladder/09_complete_unroll.cuh"
#include "../ladder/10_grid_stride.cuh"
#include "../ladder/11_warp_shuffle.cuh"
#include "../ladder/12_cooperative_groups.cuh"
#include "../ladder/13_cg_unroll2.cuh"
#include "../ladder/14_cub_block_reduce.cuh"
#include "../ladder/15_cub_device_reduce.cuh"
#include "../ladder/16_recursive_multipass.cuh"
#include "../ladder/17_two_stage_coarsened.cuh"
#include "../ladder/18_fastreduce.cuh"
#include "../ladder/read_probe.cuh"
#include "../ladder/table.h"

namespace fastreduce {
namespace {

using Runner = cudaError_t (*)(const ladder::RungArgs&);
struct Runners {
  Runner float32, bfloat16, int32;
};

#define FASTREDUCE_RUNNERS(name, summary, deterministic) \
  {&ladder::name<float>, &ladder::name<__nv_bfloat16>, &ladder::name<int32_t>},
constexpr Runners kRunners[] = {FASTREDUCE_LADDER(FASTREDUCE_RUNNERS)};
#undef FASTREDUCE_RUNNERS
static_assert(sizeof(kRunners) / sizeof(kRunners[0]) == kLadderSize);

}  // namespace

size_t ladder_workspace_bytes(int64_t n) { return ladder::ladder_workspace_bytes(n); }

cudaError_t ladder_sum(int rung, DType dtype, const void* x, int64_t n, void* out, void* workspace,
                       int sm_count, cudaStream_t stream) {
  if (rung < 0 || rung >= kLadderSize) return cudaErrorInvalidValue;
  const ladder::RungArgs args{x, n, out, workspace, sm_count, stream};
  switch (dtype) {
    case DType::Float: return kRunners[rung].float32(args);
    case DType::BFloat16: return kRunners[rung].bfloat16(args);
    case DType::Int32: return kRunners[rung].int32(args);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t read_probe(const void* data, int64_t bytes, void* flag, int sm_count, cudaStream_t stream) {
  const int64_t count = bytes / 16;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(ceil_div(count, 512 * 4), sm_count * 4));
  ladder::read_probe_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(data), count,
                                                         static_cast<unsigned*>(flag));
  return cudaGetLastError();
}

}  // namespace fastreduce
