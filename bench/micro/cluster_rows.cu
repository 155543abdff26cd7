// Times the norm forward on very wide rows split over a cluster of blocks
// (the row in registers, the blocks' sums exchanged in distributed shared
// memory) at several block sizes, packs per thread and cluster sizes,
// against a copy of the same bytes and against the same kernel on rows of
// one block's share (no cluster: what the exchange and the co-scheduling of
// a cluster cost). L2 evicted before each call. On the GPU machine:
// bash bench/micro/run.sh cluster_rows. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

using T = __nv_bfloat16;
constexpr int kVec = 8;

template <int kPacks, typename Math>
void run(Timer& timer, NormForwardArgs<T> a, float copy, int threads, int cluster, const char* name) {
  const auto kernel = norm_forward_lanes_kernel<T, kPacks, kVec, false, Math>;
  if (int64_t(threads) * kPacks * kVec * cluster < a.n) return;  // the row does not fit
  CHECK(rows::allow_clusters(kernel, cluster, 0));
  cudaLaunchAttribute attribute = rows::cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(a.rows * cluster));
  config.blockDim = dim3(unsigned(threads));
  config.attrs = &attribute;
  config.numAttrs = 1;
  const int resident = rows::resident_clusters(kernel, cluster, threads, 0);
  const float clustered = timer.median_us([&] { CHECK(cudaLaunchKernelEx(&config, kernel, a)); });
  // The same blocks, each on a row of its share alone.
  NormForwardArgs<T> alone = a;
  alone.rows = a.rows * cluster;
  alone.n = a.n / cluster;
  const float separate = timer.median_us([&] { kernel<<<alone.rows, threads>>>(alone); });
  std::printf("| %s | (%lld, %lld) | %d | %d | %d | %d | %.1f | %.0f%% | %.1f |\n", name, (long long)a.rows,
              (long long)a.n, threads, kPacks, cluster, resident, clustered, 100.0f * copy / clustered, separate);
}

template <typename Math>
void shape(Timer& timer, int64_t rows, int64_t n, const char* name) {
  const NormRows<T, Math> buffers(rows, n, rows * 16);  // room for the unclustered rows' statistics
  const NormForwardArgs<T> a = buffers.args;
  const float copy = timer.copy_us(buffers.x, buffers.y, buffers.bytes());
  std::printf("| %s | (%lld, %lld) | copy | | | | %.1f | 100%% | |\n", name, (long long)rows, (long long)n, copy);
  for (int threads : {256, 512})
    for (int cluster : {2, 4, 8, 16}) {
      run<4, Math>(timer, a, copy, threads, cluster, name);
      run<8, Math>(timer, a, copy, threads, cluster, name);
    }
}

int main() {
  Timer timer;
  std::printf("| norm | shape | threads | packs | cluster | resident clusters | µs | of copy | µs unclustered |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  shape<RmsNormMath>(timer, 2048, 65536, "rms_norm");
  shape<LayerNormMath>(timer, 2048, 65536, "layer_norm");
  shape<RmsNormMath>(timer, 512, 262144, "rms_norm");
  shape<LayerNormMath>(timer, 512, 262144, "layer_norm");
  return 0;
}
