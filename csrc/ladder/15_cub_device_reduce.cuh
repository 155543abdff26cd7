// Rung 15: CUB DeviceReduce (Reduce with a plus in the accumulator type), the vendor library's whole-device answer:
// tuned tiles and vector loads per architecture, a multi-block pass and a
// single-block pass. The yardstick for every other rung. Its temporary
// storage comes out of the ladder workspace.
#pragma once
#include <cub/device/device_reduce.cuh>

#include "rung.cuh"

namespace fastreduce::ladder {

// Adds in the accumulator type whatever CUB pairs up (input or partial).
template <typename A>
struct AccumulatingPlus {
  template <typename L, typename R>
  __device__ A operator()(const L& a, const R& b) const {
    return static_cast<A>(a) + static_cast<A>(b);
  }
};

template <typename In>
cudaError_t cub_device_reduce(const RungArgs& a) {
  using A = Acc<In>;
  auto* total = static_cast<A*>(a.workspace);
  void* temp = total + 16;  // keeps CUB's storage 128-byte aligned
  size_t temp_bytes = 0;
  cudaError_t err = cub::DeviceReduce::Reduce(nullptr, temp_bytes, static_cast<const In*>(a.x), total, a.n,
                                              AccumulatingPlus<A>{}, A(0), a.stream);
  if (err != cudaSuccess) return err;
  if (temp_bytes > kCubBytes) return cudaErrorInvalidValue;
  err = cub::DeviceReduce::Reduce(temp, temp_bytes, static_cast<const In*>(a.x), total, a.n, AccumulatingPlus<A>{},
                                  A(0), a.stream);
  if (err != cudaSuccess) return err;
  cast_kernel<<<1, 1, 0, a.stream>>>(total, static_cast<Out<In>*>(a.out));
  return cudaGetLastError();
}

}  // namespace fastreduce::ladder
