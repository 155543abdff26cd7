// One entry point's kernels by device, as ATen's DispatchStub: each backend
// registers its function once, where it defines it, and the
// device-independent op code calls the stub with the device of its input. A build without CUDA registers no CUDA kernels, so a CUDA
// call says so instead of linking against stand-ins.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fastreduce {

template <typename Signature>
class DeviceStub;

template <typename R, typename... Args>
class DeviceStub<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  constexpr explicit DeviceStub(const char* name) : name_(name) {}

  R operator()(c10::DeviceType device, Args... args) const {
    const Fn fn = device == c10::DeviceType::CUDA ? cuda_ : device == c10::DeviceType::CPU ? cpu_ : nullptr;
    TORCH_CHECK(fn != nullptr, name_, ": no kernel for device type ", c10::DeviceTypeName(device),
                device == c10::DeviceType::CUDA ? " (fastreduce was built without CUDA: FASTREDUCE_CUDA=0)" : "");
    return fn(std::forward<Args>(args)...);
  }

  // A CPU kernel of a higher rank replaces one of a lower rank, whichever
  // registers first.
  bool set(c10::DeviceType device, Fn fn, int rank = 0) {
    if (device == c10::DeviceType::CUDA) {
      cuda_ = fn;
    } else if (rank >= cpu_rank_) {
      cpu_ = fn;
      cpu_rank_ = rank;
    }
    return true;
  }

 private:
  const char* name_;
  Fn cpu_ = nullptr;
  Fn cuda_ = nullptr;
  int cpu_rank_ = 0;
};

// The rank of the CPU kernels compiled here: the AVX-512 copies of csrc/cpu
// (a library of their own, cpu_capability.cpp) over the base build's.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kCpuKernelRank = 1;
#else
constexpr int kCpuKernelRank = 0;
#endif

// In a header: the stub every backend and caller shares.
#define FASTREDUCE_DECLARE_STUB(stub, signature) extern DeviceStub<signature> stub
// In one source file.
#define FASTREDUCE_DEFINE_STUB(stub, signature) DeviceStub<signature> stub(#stub)
// In a backend's source file, at namespace scope: `device` is CPU or CUDA.
#define FASTREDUCE_REGISTER_KERNEL(stub, device, fn) \
  static const bool stub##_##device##_registered = stub.set(c10::DeviceType::device, fn, kCpuKernelRank)

}  // namespace fastreduce
