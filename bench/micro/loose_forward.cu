// The norm forward of loose rows a block a row (norm_forward_loose_kernel:
// odd widths, each row starting at another place in its 16-byte pack, the
// parameters read shifted to the row's packs), taken apart: the kernel
// itself, the kernel without parameters, and a copy of it whose parameters
// are read at aligned packs (wrong columns: the bound of what the shift
// costs), or from kVec copies of each parameter row, copy e shifted e
// elements (right columns, aligned reads), or whose loose elements (the
// 1-15 a row outside its packs) are left out (wrong output: their share).
// Prints µs, registers, blocks an SM, the copy of the same bytes, the
// launcher's time and the largest |y| difference from its output.
//   bash bench/micro/run.sh loose_forward
// H200 (NOTES, 2026-12-04), bf16 layer_norm (8192, 4095), µs: the kernel
// 37.2-37.4, loose elements left out 36.2, parameters aligned 36.2-36.6,
// both 35.4-35.8, no parameters 34.1-34.3, the shifted copies 38.3-38.5
// (eight times the parameters' L1 footprint); a copy of the bytes 32.4.
#include <cuda_bf16.h>

#include "../../csrc/kernels/norm_loose_kernels.cuh"
#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

// Where the copy reads its parameters.
enum class Params { kShifted, kAligned, kShiftedCopies };

// kVec copies of a parameter row of n, each `stride` long (16-byte aligned):
// copies[e * stride + i] = params[e + i].
template <typename P>
__global__ void shifted_copies(const P* params, P* copies, int n, int vec, int stride) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vec * stride; i += gridDim.x * blockDim.x) {
    const int e = i / stride, c = i % stride;
    copies[i] = e + c < n ? params[e + c] : P(0.0f);
  }
}
__host__ __device__ inline int copy_stride(int n, int vec) { return (n / vec + 2) * vec; }

// norm_forward_loose_kernel with its parameters read as kParams says (with
// kShiftedCopies a.weight and a.bias point at shifted_copies) and its loose
// elements left out unless kLooseElements.
template <typename T, int kPacks, typename Math, Params kParams, bool kLooseElements, bool kAffine>
__global__ void __launch_bounds__(kRowThreadsMax, 2) loose_parts_kernel(NormForwardArgs<T> a) {
  constexpr bool kCentered = Math::kCentered;
  const bool weighted = kAffine || a.weight, biased = kCentered && (kAffine || a.bias);
  constexpr int kVec = Vec16<T>::kSize;
  using A = opmath_t<T>;
  using Pack = Vec16<T>;
  using ParamPack = VecN<T, kVec>;
  const RowThreads<false> threads(a.rows);
  const int n = static_cast<int>(a.n);
  const T* const x = a.x + threads.row * a.n;
  T* const y = a.y + threads.row * a.n;
  const LooseColumns<T, false> columns(x, n, threads);
  const auto& layout = columns.layout;
  const bool loose = kLooseElements && layout.loose.held;
  Pack packs[kPacks];
  load_packs<sizeof(T) == 2>(threads, layout.packs_of(x), layout.packs, packs);
  const A spare = layout.loose_of(x);
  const A shift = kCentered ? static_cast<A>(x[0]) : A(0);
  A mean;
  const A rstd = row_rstd<kCentered>(
      n, a.eps, shift,
      [&](auto f) {
#pragma unroll
        for (int p = 0; p < kPacks; ++p)
          if (columns.in_row(p))
#pragma unroll
            for (int j = 0; j < kVec; ++j) f(element(packs[p], j));
        if (loose) f(spare);
      },
      [&](auto v) { return threads.template allreduce<SumOp<decltype(v)>>(v); }, mean);
  const RowNormalizer<T, A> normalize(mean, rstd);
  Pack* const out = layout.packs_of(y);
  const auto write = [&](auto weight_at, auto bias_at) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (!columns.in_row(p)) continue;
      const int g = threads.group(p);
      const ParamPack w = weighted ? weight_at(g) : ParamPack{}, b = biased ? bias_at(g) : ParamPack{};
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result[j] = normalize(element(packs[p], j));
        if (weighted) result[j] *= element<T, kVec, A>(w, j);
        if (biased) result[j] += element<T, kVec, A>(b, j);
      }
      store_pack<T>(&out[g], result);
    }
  };
  if constexpr (kParams == Params::kShifted) {
    with_loose_params<T, kVec>(a.weight, a.bias, layout.head, weighted, biased, write);
  } else if constexpr (kParams == Params::kAligned) {
    write([&](int g) { return load_param_pack<kVec>(a.weight + kVec * g); },
          [&](int g) { return load_param_pack<kVec>(a.bias + kVec * g); });
  } else {
    const int e = layout.head % kVec, offset = e * copy_stride(n, kVec) + layout.head - e;
    write([&](int g) { return load_param_pack<kVec>(a.weight + offset + kVec * g); },
          [&](int g) { return load_param_pack<kVec>(a.bias + offset + kVec * g); });
  }
  if (loose) {
    const int64_t i = layout.loose.index;  // copy 0 of the shifted copies is the row itself
    A v = normalize(spare);
    if (weighted) v *= static_cast<A>(a.weight[i]);
    if (biased) v += static_cast<A>(a.bias[i]);
    y[i] = static_cast<T>(v);
  }
  if (threads.rank == 0) {
    if constexpr (kCentered) a.mean[threads.row] = mean;
    a.rstd[threads.row] = rstd;
  }
}

template <typename T, typename Math, int kPacks>
void parts(ForwardCase<T, Math>& c, Timer& timer, int threads) {
  constexpr int kVec = Vec16<T>::kSize;
  constexpr bool kAffine = Math::kCentered && sizeof(T) == 2;  // as the launcher
  c.time_kernel(timer, norm_forward_loose_kernel<T, kPacks, Math, T, kAffine>, threads, kPacks, "the kernel");
  c.time_kernel(timer, loose_parts_kernel<T, kPacks, Math, Params::kShifted, false, kAffine>, threads, kPacks,
                "loose elements left out");
  c.time_kernel(timer, loose_parts_kernel<T, kPacks, Math, Params::kAligned, true, kAffine>, threads, kPacks,
                "parameters aligned (wrong)");
  c.time_kernel(timer, loose_parts_kernel<T, kPacks, Math, Params::kAligned, false, kAffine>, threads, kPacks,
                "both");
  const T *weight = c.args.weight, *bias = c.args.bias;
  const int n = static_cast<int>(c.args.n), stride = copy_stride(n, kVec);
  T *weights, *biases = nullptr;
  CHECK(cudaMalloc(&weights, sizeof(T) * kVec * stride));
  shifted_copies<<<64, 256>>>(weight, weights, n, kVec, stride);
  if (bias) {
    CHECK(cudaMalloc(&biases, sizeof(T) * kVec * stride));
    shifted_copies<<<64, 256>>>(bias, biases, n, kVec, stride);
  }
  c.args.weight = weights, c.args.bias = biases;
  c.time_kernel(timer, loose_parts_kernel<T, kPacks, Math, Params::kShiftedCopies, true, kAffine>, threads, kPacks,
                "shifted copies");
  c.args.weight = nullptr, c.args.bias = nullptr;
  c.time_kernel(timer, norm_forward_loose_kernel<T, kPacks, Math, T, false>, threads, kPacks,
                "no parameters (wrong)");
  c.args.weight = weight, c.args.bias = bias;
  CHECK(cudaFree(weights));
  if (biases) CHECK(cudaFree(biases));
}

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/false);
  const int threads = rows::block_lane_threads(loose_row_packs<kVec>(n));
  if (ceil_div(loose_row_packs<kVec>(n), int64_t(threads)) <= 3) parts<T, Math, 3>(c, timer, threads);
  else parts<T, Math, 4>(c, timer, threads);
  c.launcher_again(timer);
}

template <typename T>
void shapes(Timer& timer) {
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{8192, 4095}, {4096, 8191}, {16384, 1601}}) {
    run<T, LayerNormMath>(timer, rows, n);
    run<T, RmsNormMath>(timer, rows, n);
  }
}

int main() {
  Timer timer;
  forward_table_header();
  for (int pass = 0; pass < 2; ++pass) {
    shapes<__nv_bfloat16>(timer);
    shapes<float>(timer);
  }
  return 0;
}
