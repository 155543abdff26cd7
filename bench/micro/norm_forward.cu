// Times the norm forwards through their launcher (the kernel it picks for
// each width) at bench/peers.py's shapes, weight and bias as the
// peers cells have them, against a copy of the same bytes, L2 evicted before
// each call. Build and run on the GPU machine:
// bash bench/micro/run.sh norm_forward. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n, DType dtype, const char* dtype_name, bool add) {
  using A = opmath_t<T>;
  const NormRows<T, Math> buffers(rows, n, rows);
  T *residual = nullptr, *h = nullptr;
  if (add) {
    CHECK(cudaMalloc(&residual, buffers.bytes()));
    CHECK(cudaMalloc(&h, buffers.bytes()));
    fill_uniform<<<1024, 256>>>(residual, rows * n, 5u, -0.5f, 1.0f);
  }
  const NormForwardArgs<T> a = buffers.args;
  const NormShape shape{dtype, rows, n, Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{a.x, residual, a.weight, a.bias, a.y, h, Math::kCentered ? a.mean : nullptr, a.rstd};
  // Bytes moved: x (and the residual) read, y (and h) written.
  const int64_t half = buffers.bytes() * (add ? 2 : 1);
  T* copy_in;
  T* copy_out;
  CHECK(cudaMalloc(&copy_in, half));
  CHECK(cudaMalloc(&copy_out, half));
  const float copy = timer.copy_us(copy_in, copy_out, half);
  const float us = timer.median_us([&] { CHECK(norm_forward(shape, io, double(A(1e-5)), nullptr)); });
  std::printf("| %s%s | %s | (%lld, %lld) | %.1f | %.1f | %.2f |\n", add ? "add_" : "",
              Math::kCentered ? "layer_norm" : "rms_norm", dtype_name, (long long)rows, (long long)n, copy, us,
              copy / us);
  for (void* p : {(void*)residual, (void*)h, (void*)copy_in, (void*)copy_out}) CHECK(cudaFree(p));
}

template <typename T>
void widths(Timer& timer, DType dtype, const char* name) {
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 768},    {32768, 1024},  {8192, 1600},  {8192, 4096},
                                                {4096, 8192},   {8192, 16384},  {4096, 32768},
                                                {2048, 65536},  {1024, 131072}, {512, 262144}};
  for (auto [rows, n] : shapes) {
    run<T, LayerNormMath>(timer, rows, n, dtype, name, false);
    run<T, RmsNormMath>(timer, rows, n, dtype, name, false);
    if (n <= 8192) {
      run<T, LayerNormMath>(timer, rows, n, dtype, name, true);
      run<T, RmsNormMath>(timer, rows, n, dtype, name, true);
    }
  }
}

int main() {
  Timer timer;
  std::printf("| norm | dtype | shape | copy µs | forward µs | of copy |\n|---|---|---|---|---|---|\n");
  widths<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16");
  widths<float>(timer, DType::Float, "float32");
  return 0;
}
