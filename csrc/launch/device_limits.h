// What the launchers read about the current device, queried once per device
// (each query is a driver call on every op otherwise).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

namespace fastreduce {

struct DeviceLimits {
  int shared_per_block = 0;  // with the opt-in
  int shared_per_sm = 0;
  bool cluster_launch = false;
};

// The current device's limits, or the error that kept them from being read.
inline cudaError_t device_limits(DeviceLimits& limits) {
  constexpr int kDevicesMax = 64;
  static std::array<std::atomic<bool>, kDevicesMax> ready{};
  static std::array<DeviceLimits, kDevicesMax> cached{};
  static std::mutex mutex;
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (device < kDevicesMax && ready[device].load(std::memory_order_acquire)) {
    limits = cached[device];
    return cudaSuccess;
  }
  int per_block = 0, per_sm = 0, clusters = 0;
  for (auto [value, attribute] : {std::pair{&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin},
                                  std::pair{&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
                                  std::pair{&clusters, cudaDevAttrClusterLaunch}})
    if (const cudaError_t err = cudaDeviceGetAttribute(value, attribute, device); err != cudaSuccess) return err;
  limits = {per_block, per_sm, clusters != 0};
  if (device < kDevicesMax) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!ready[device].load(std::memory_order_relaxed)) {  // written once: readers never see a write
      cached[device] = limits;
      ready[device].store(true, std::memory_order_release);
    }
  }
  return cudaSuccess;
}

}  // namespace fastreduce
