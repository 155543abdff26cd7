// A norm forward's buffers for the probes, on the device and filled: x of
// (rows, n), weight and bias of n, and statistics for `stat_rows` rows.
#pragma once

#include <cuda_fp16.h>

#include <vector>

#include "../../csrc/kernels/norm_kernels.cuh"
#include "../../csrc/launch/norms.h"
#include "probe.cuh"

template <typename T, typename Math>
struct NormRows {
  using A = fastreduce::opmath_t<T>;
  fastreduce::NormForwardArgs<T> args{};
  T *x, *y, *w, *b;
  A *mean, *rstd;

  NormRows(int64_t rows, int64_t n, int64_t stat_rows) {
    CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
    CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
    CHECK(cudaMalloc(&w, n * sizeof(T)));
    CHECK(cudaMalloc(&b, n * sizeof(T)));
    CHECK(cudaMalloc(&mean, stat_rows * sizeof(A)));
    CHECK(cudaMalloc(&rstd, stat_rows * sizeof(A)));
    fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -0.5f, 2.0f);
    fill_uniform<<<64, 256>>>(w, n, 2u, -0.5f, 2.0f);
    fill_uniform<<<64, 256>>>(b, n, 3u, -0.5f, 2.0f);
    args.x = x, args.weight = w, args.bias = Math::kCentered ? b : nullptr, args.y = y;
    args.mean = mean, args.rstd = rstd, args.rows = rows, args.n = n, args.eps = A(1e-5);
  }
  ~NormRows() {
    for (void* p : {(void*)x, (void*)y, (void*)w, (void*)b, (void*)mean, (void*)rstd}) CHECK(cudaFree(p));
  }
  int64_t bytes() const { return args.rows * args.n * int64_t(sizeof(T)); }
};

// A forward probe's case: NormRows, with the fused add's residual and h where
// asked, the launcher's time and output, and a copy of the bytes the forward
// moves (with the add, x and the residual in, h and y out: twice the bytes).
template <typename T, typename Math>
struct ForwardCase {
  using A = fastreduce::opmath_t<T>;
  NormRows<T, Math> buffers;
  fastreduce::NormForwardArgs<T> args;
  T *residual = nullptr, *residual_out = nullptr;
  float copy_us, launcher_us;
  std::vector<T> launcher_y;
  const char* name;
  static constexpr bool kFloat = std::is_same_v<T, float>, kHalf = std::is_same_v<T, __half>;
  const char* dtype = kFloat ? "float32" : kHalf ? "float16" : "bfloat16";
  ForwardCase(Timer& timer, int64_t rows, int64_t n, bool fused_add)
      : buffers(rows, n, rows),
        args(buffers.args),
        launcher_y(rows * n),
        name(fused_add ? (Math::kCentered ? "add_layer_norm" : "add_rms_norm")
                       : (Math::kCentered ? "layer_norm" : "rms_norm")) {
    using namespace fastreduce;
    if (fused_add) {
      CHECK(cudaMalloc(&residual, buffers.bytes()));
      CHECK(cudaMalloc(&residual_out, buffers.bytes()));
      fill_uniform<<<1024, 256>>>(residual, rows * n, 4u, -1.0f, 2.0f);
      args.residual = residual, args.residual_out = residual_out;
    }
    const int64_t moved = (fused_add ? 2 : 1) * buffers.bytes();
    T *copy_in, *copy_out;
    CHECK(cudaMalloc(&copy_in, moved));
    CHECK(cudaMalloc(&copy_out, moved));
    copy_us = timer.copy_us(copy_in, copy_out, moved);
    CHECK(cudaFree(copy_in));
    CHECK(cudaFree(copy_out));
    launcher_us = time_launcher(timer);
    CHECK(cudaMemcpy(launcher_y.data(), args.y, buffers.bytes(), cudaMemcpyDeviceToHost));
  }
  // One forward through the launcher (norms.cu), on args' buffers.
  void launch() {
    using namespace fastreduce;
    const NormShape shape{kFloat ? DType::Float : kHalf ? DType::Half : DType::BFloat16, args.rows, args.n,
                          Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
    const NormForwardBuffers<> io{args.x, residual, args.weight, args.bias, args.y, residual_out,
                                  Math::kCentered ? args.mean : nullptr, args.rstd};
    CHECK(norm_forward(shape, io, double(A(1e-5)), nullptr));
  }
  float time_launcher(Timer& timer) {
    return timer.median_us([&] { launch(); });
  }
  ~ForwardCase() {
    for (T* p : {residual, residual_out})
      if (p) CHECK(cudaFree(p));
  }
  // The largest |y| difference of the last kernel run from the launcher's.
  float difference() const { return largest_difference(args.y, launcher_y); }
  // One row of the reread probes' table (forward_table_header): `kernel`
  // launched a block a row of `threads`, `packs` a thread, with `shared`
  // bytes of dynamic shared memory, y zeroed first.
  template <typename Kernel>
  void time_kernel(Timer& timer, Kernel kernel, int threads, int packs, const char* what, size_t shared = 0) {
    if (threads == 0) return;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
    CHECK(cudaMemset(args.y, 0, buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<args.rows, threads, shared>>>(args); });
    std::printf("| %s | %s | (%lld, %lld) | %d x %d | %s | %d regs, %d an SM | %.1f | %.1f | %.1f | %.3f | %.3g |\n",
                name, dtype, (long long)args.rows, (long long)args.n, threads, packs, what, registers(kernel), per_sm,
                copy_us, launcher_us, us, launcher_us / us, difference());
  }
  // The launcher timed again after the kernels (its first time follows the
  // last case's kernels).
  void launcher_again(Timer& timer) {
    std::printf("| %s | %s | (%lld, %lld) | | launcher again | | | | %.1f | | |\n", name, dtype, (long long)args.rows,
                (long long)args.n, time_launcher(timer));
  }
};

inline void forward_table_header() {
  std::printf(
      "| norm | dtype | shape | threads x packs | kernel | registers | copy µs | launcher µs | kernel µs | "
      "launcher / kernel | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
}
