// Times the norm backwards (dx and the weight gradient, the residual
// gradient added for the fused add + norm) through their launcher at
// bench/peers.py's row shapes, against a copy of the same bytes, L2 evicted
// before each call. Build and run on the GPU machine:
// bash bench/micro/run.sh norm_backward. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n, DType dtype, const char* dtype_name, bool add) {
  using A = opmath_t<T>;
  int sm_count = 0;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const NormRows<T, Math> buffers(rows, n, rows);
  const NormForwardArgs<T> f = buffers.args;
  const NormShape shape{dtype, rows, n, Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  // Statistics from a real forward, then dy = y; the residual gradient in
  // its own buffer (one that aliased x would be read from L2).
  CHECK(norm_forward(shape, {f.x, nullptr, f.weight, f.bias, f.y, nullptr, Math::kCentered ? f.mean : nullptr, f.rstd},
                     double(A(1e-5)), nullptr));
  T *dx, *dweight, *dbias, *grad_residual = nullptr;
  void* workspace;
  CHECK(cudaMalloc(&dx, buffers.bytes()));
  if (add) {
    CHECK(cudaMalloc(&grad_residual, buffers.bytes()));
    fill_uniform<<<1024, 256>>>(grad_residual, rows * n, 7u, -0.5f, 1.0f);
  }
  CHECK(cudaMalloc(&dweight, n * sizeof(T)));
  CHECK(cudaMalloc(&dbias, n * sizeof(T)));
  const NormBackwardBuffers<> io{f.y, f.x, grad_residual, Math::kCentered ? f.mean : nullptr, f.rstd, f.weight, dx};
  const NormParamGrads grads{dweight, Math::kCentered ? dbias : nullptr, true, true};
  CHECK(cudaMalloc(&workspace, norm_backward_workspace_bytes(shape, grads, sm_count)));
  // Bytes moved: dy and x (and the residual gradient) read, dx written.
  const int64_t half = add ? 2 * buffers.bytes() : 3 * buffers.bytes() / 2;
  T* copy_in;
  T* copy_out;
  CHECK(cudaMalloc(&copy_in, half));
  CHECK(cudaMalloc(&copy_out, half));
  const float copy = timer.copy_us(copy_in, copy_out, half);
  const float us = timer.median_us([&] { CHECK(norm_backward(shape, io, grads, workspace, sm_count, nullptr)); });
  std::printf("| %s%s | %s | (%lld, %lld) | %.1f | %.1f | %.2f |\n", add ? "add_" : "",
              Math::kCentered ? "layer_norm" : "rms_norm", dtype_name, (long long)rows, (long long)n, copy, us,
              copy / us);
  for (void* p : {(void*)dx, (void*)dweight, (void*)dbias, (void*)grad_residual, workspace, (void*)copy_in,
                  (void*)copy_out})
    CHECK(cudaFree(p));
}

template <typename T>
void widths(Timer& timer, DType dtype, const char* name) {
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 768},   {8192, 1600},  {32768, 1024}, {8192, 4096},
                                                {4096, 8192},  {4096, 32768}, {2048, 65536}, {512, 262144}};
  for (auto [rows, n] : shapes)
    for (bool add : {false, true}) {
      run<T, LayerNormMath>(timer, rows, n, dtype, name, add);
      run<T, RmsNormMath>(timer, rows, n, dtype, name, add);
    }
}

int main() {
  Timer timer;
  std::printf("| norm | dtype | shape | copy µs | backward µs | of copy |\n|---|---|---|---|---|---|\n");
  widths<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16");
  widths<float>(timer, DType::Float, "float32");
  return 0;
}
