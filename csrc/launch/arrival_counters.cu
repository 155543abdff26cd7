#include "arrival_counters.h"

#include <mutex>
#include <unordered_map>

namespace fastreduce {
namespace {

constexpr int64_t kCounters = int64_t(1) << 18;  // 1 MiB a device
// Zero when the module loads, on every device; each use returns them to zero.
__device__ unsigned int counters[kCounters];

struct DeviceCounters {
  unsigned int* base = nullptr;
  int64_t handed_out = 0;
  std::unordered_map<cudaStream_t, int64_t> of_stream;
};

}  // namespace

unsigned int* arrival_counters(cudaStream_t stream, int64_t count) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  int device = 0;
  if (count > kMaxArrivalCounters || cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      cudaGetDevice(&device) != cudaSuccess)
    return nullptr;
  static std::mutex mutex;
  static std::unordered_map<int, DeviceCounters> devices;
  const std::lock_guard<std::mutex> lock(mutex);
  DeviceCounters& d = devices[device];
  if (d.base == nullptr && cudaGetSymbolAddress(reinterpret_cast<void**>(&d.base), counters) != cudaSuccess) {
    d.base = nullptr;
    return nullptr;
  }
  if (capture == cudaStreamCaptureStatusNone) {
    if (const auto found = d.of_stream.find(stream); found != d.of_stream.end()) return d.base + found->second;
    if (d.handed_out + kMaxArrivalCounters > kCounters) return nullptr;
    const int64_t first = d.handed_out;
    d.of_stream.emplace(stream, first);
    d.handed_out += kMaxArrivalCounters;
    return d.base + first;
  }
  if (d.handed_out + count > kCounters) return nullptr;
  d.handed_out += count;
  return d.base + d.handed_out - count;
}

}  // namespace fastreduce
