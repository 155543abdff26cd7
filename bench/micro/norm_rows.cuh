// A norm forward's buffers for the probes, on the device and filled: x of
// (rows, n), weight and bias of n, and statistics for `stat_rows` rows.
#pragma once

#include "../../csrc/kernels/norm_kernels.cuh"
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
