// What a row kernel's shape costs on this card: the same 2 x 256 MiB moved by
// plain copies of several shapes (the ceiling) and by bare norm rows, which
// load a row's share into registers, reduce it (a block or warp sum of
// rms_norm's or layer_norm's statistics), normalise and store, with their
// parameters absent, read in the output pass, or loaded with the row. The
// gaps are what the load -> reduce -> store phases and the parameters cost at
// a given occupancy. bash bench/micro/run.sh stream_shapes
#include "probe.cuh"

#include <cuda_bf16.h>

// Grid-stride copy, kUnroll packs in flight per thread.
template <int kUnroll>
__global__ void strided_copy(const float4* in, float4* out, int64_t count) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; base < count; base += stride * kUnroll) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < count) v[u] = in[base + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < count) out[base + u * stride] = v[u];
  }
}

// One pass, no loop: block b copies packs [b * kPacks * blockDim, ...).
template <int kPacks>
__global__ void oneshot_copy(const float4* in, float4* out, int64_t count) {
  const int64_t base = blockIdx.x * int64_t(blockDim.x) * kPacks + threadIdx.x;
  float4 v[kPacks];
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (base + p * blockDim.x < count) v[p] = in[base + p * blockDim.x];
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (base + p * blockDim.x < count) out[base + p * blockDim.x] = v[p];
}

__device__ __forceinline__ float pack_sum(const float4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    s += f.x * f.x + f.y * f.y;
  }
  return s;
}

// Where a row's parameters come from: none, read in the output pass (from L2
// after the first rows), or loaded with the row into registers.
enum Params { kNone, kLate, kEarly };

// A row of kPacks * blockDim packs a block: loaded, a block sum (two
// barriers), each pack normalised and stored: rms_norm's phases (bf16), or
// with kCentered layer_norm's (a shifted sum and sum of squares, a bias).
template <int kPacks, bool kCentered, Params kParams>
__global__ void block_row(const float4* in, float4* out, const float4* weight, const float4* bias, int64_t rows) {
  __shared__ float2 partial[32];
  const int64_t row_packs = int64_t(kPacks) * blockDim.x;
  const float4* x = in + blockIdx.x * row_packs;
  float4* y = out + blockIdx.x * row_packs;
  float4 v[kPacks], w[kPacks], b[kPacks];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) v[p] = x[threadIdx.x + p * blockDim.x];
  if (kParams == kEarly)
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      w[p] = weight[threadIdx.x + p * blockDim.x];
      if (kCentered) b[p] = bias[threadIdx.x + p * blockDim.x];
    }
  const float shift = kCentered ? __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(x)) : 0.f;
  float2 s = {0.f, 0.f};
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[p]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      s.x += (f.x - shift) * (f.x - shift) + (f.y - shift) * (f.y - shift);
      if (kCentered) s.y += f.x - shift + f.y - shift;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s.x += __shfl_xor_sync(0xffffffffu, s.x, o);
    if (kCentered) s.y += __shfl_xor_sync(0xffffffffu, s.y, o);
  }
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : float2{0.f, 0.f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s.x += __shfl_xor_sync(0xffffffffu, s.x, o);
    if (kCentered) s.y += __shfl_xor_sync(0xffffffffu, s.y, o);
  }
  const float count = float(row_packs * 8), offset = s.y / count;
  const float r = rsqrtf(s.x / count - offset * offset + 1e-6f), m = kCentered ? -(shift + offset) * r : 0.f;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (kParams == kLate) {
      w[p] = weight[threadIdx.x + p * blockDim.x];
      if (kCentered) b[p] = bias[threadIdx.x + p * blockDim.x];
    }
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v[p]);
    const __nv_bfloat162* hw = reinterpret_cast<const __nv_bfloat162*>(&w[p]);
    const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&b[p]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f = __bfloat1622float2(h[k]);
      f = {fmaf(f.x, r, m), fmaf(f.y, r, m)};
      if (kParams != kNone) {
        const float2 fw = __bfloat1622float2(hw[k]);
        f = {f.x * fw.x, f.y * fw.y};
        if (kCentered) {
          const float2 fb = __bfloat1622float2(hb[k]);
          f = {f.x + fb.x, f.y + fb.y};
        }
      }
      h[k] = __floats2bfloat162_rn(f.x, f.y);
    }
    y[threadIdx.x + p * blockDim.x] = v[p];
  }
}

// The same with rows of kPacks * 32 packs, one to a warp.
template <int kPacks>
__global__ void warp_row(const float4* in, float4* out, int64_t rows) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float4* x = in + row * kPacks * 32;
  float4* y = out + row * kPacks * 32;
  float4 v[kPacks];
  float s = 0;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) v[p] = x[lane + p * 32];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) s += pack_sum(v[p]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float r = rsqrtf(s / float(kPacks * 32 * 8) + 1e-6f);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v[p]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f = __bfloat1622float2(h[k]);
      h[k] = __floats2bfloat162_rn(f.x * r, f.y * r);
    }
    y[lane + p * 32] = v[p];
  }
}

template <typename Kernel>
int per_sm(Kernel kernel, int threads) {
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  return blocks;
}

int main() {
  const int64_t bytes = 256ll << 20, count = bytes / 16;
  float4 *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  fill_uniform<<<1024, 256>>>(reinterpret_cast<__nv_bfloat16*>(in), bytes / 2, 7, -2.f, 4.f);
  Timer timer;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("| kind | shape | threads | packs a thread | blocks an SM | µs | GB/s |\n|---|---|---|---|---|---|---|\n");
  auto row = [&](const char* kind, const char* shape, int threads, int packs, int resident, float us) {
    std::printf("| %s | %s | %d | %d | %d | %.1f | %.0f |\n", kind, shape, threads, packs, resident, us,
                2.0 * bytes / us / 1e3);
  };
  row("cudaMemcpyAsync", "256 MiB", 0, 0, 0,
      timer.median_us([&] { CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); }));
  row("strided, 4 blocks an SM", "256 MiB", 512, 1, per_sm(strided_copy<1>, 512),
      timer.median_us([&] { strided_copy<1><<<sms * 4, 512>>>(in, out, count); }));
  row("strided", "256 MiB", 512, 4, per_sm(strided_copy<4>, 512),
      timer.median_us([&] { strided_copy<4><<<sms * 4, 512>>>(in, out, count); }));
  row("strided", "256 MiB", 256, 8, per_sm(strided_copy<8>, 256),
      timer.median_us([&] { strided_copy<8><<<sms * 8, 256>>>(in, out, count); }));
  for (int threads : {128, 256, 512}) {
    auto one = [&](auto packs_tag) {
      constexpr int kPacks = decltype(packs_tag)::value;
      const int64_t blocks = (count + int64_t(threads) * kPacks - 1) / (int64_t(threads) * kPacks);
      row("one pass", "256 MiB", threads, kPacks, per_sm(oneshot_copy<kPacks>, threads),
          timer.median_us([&] { oneshot_copy<kPacks><<<blocks, threads>>>(in, out, count); }));
    };
    one(std::integral_constant<int, 1>{});
    one(std::integral_constant<int, 2>{});
    one(std::integral_constant<int, 4>{});
    one(std::integral_constant<int, 8>{});
  }
  // Block rows of 2048 packs (bf16 16384 wide) and of 512 (bf16 4096), rms_norm
  // and layer_norm phases, parameters none / late / early.
  float4 *weight, *bias;
  CHECK(cudaMalloc(&weight, 2048 * 16));
  CHECK(cudaMalloc(&bias, 2048 * 16));
  fill_uniform<<<16, 256>>>(reinterpret_cast<__nv_bfloat16*>(weight), 2048 * 8, 3, 0.5f, 1.f);
  fill_uniform<<<16, 256>>>(reinterpret_cast<__nv_bfloat16*>(bias), 2048 * 8, 4, -0.5f, 1.f);
  auto block_rows = [&](auto packs_tag, auto centered_tag, auto params_tag, int threads) {
    constexpr int kPacks = decltype(packs_tag)::value;
    constexpr bool kCentered = decltype(centered_tag)::value;
    constexpr Params kParams = decltype(params_tag)::value;
    const int64_t row_packs = int64_t(kPacks) * threads, rows = count / row_packs;
    char kind[64], shape[64];
    std::snprintf(kind, sizeof kind, "block row %s, params %s", kCentered ? "layer" : "rms",
                  kParams == kNone ? "none" : kParams == kLate ? "late" : "early");
    std::snprintf(shape, sizeof shape, "bf16 (%lld, %lld)", (long long)rows, (long long)row_packs * 8);
    auto kernel = block_row<kPacks, kCentered, kParams>;
    row(kind, shape, threads, kPacks, per_sm(kernel, threads),
        timer.median_us([&] { kernel<<<rows, threads>>>(in, out, weight, bias, rows); }));
  };
  using Rms = std::false_type;
  using Layer = std::true_type;
  auto sweep = [&](auto packs_tag, int threads) {
    block_rows(packs_tag, Rms{}, std::integral_constant<Params, kNone>{}, threads);
    block_rows(packs_tag, Rms{}, std::integral_constant<Params, kLate>{}, threads);
    block_rows(packs_tag, Rms{}, std::integral_constant<Params, kEarly>{}, threads);
    block_rows(packs_tag, Layer{}, std::integral_constant<Params, kNone>{}, threads);
    block_rows(packs_tag, Layer{}, std::integral_constant<Params, kLate>{}, threads);
    block_rows(packs_tag, Layer{}, std::integral_constant<Params, kEarly>{}, threads);
  };
  sweep(std::integral_constant<int, 4>{}, 512);
  sweep(std::integral_constant<int, 8>{}, 256);
  sweep(std::integral_constant<int, 2>{}, 1024);
  sweep(std::integral_constant<int, 1>{}, 512);
  sweep(std::integral_constant<int, 2>{}, 256);
  sweep(std::integral_constant<int, 4>{}, 128);
  // Warp rows of 128 packs (bf16 1024 wide) and 64 (bf16 512).
  auto warp_rows = [&](auto packs_tag, int threads) {
    constexpr int kPacks = decltype(packs_tag)::value;
    const int64_t rows = count / (kPacks * 32);
    char shape[64];
    std::snprintf(shape, sizeof shape, "bf16 (%lld, %d)", (long long)rows, kPacks * 32 * 8);
    row("warp row", shape, threads, kPacks, per_sm(warp_row<kPacks>, threads),
        timer.median_us([&] { warp_row<kPacks><<<(rows + threads / 32 - 1) / (threads / 32), threads>>>(in, out, rows); }));
  };
  for (int threads : {128, 256, 512}) warp_rows(std::integral_constant<int, 4>{}, threads);
  for (int threads : {128, 256, 512}) warp_rows(std::integral_constant<int, 2>{}, threads);
  return 0;
}
