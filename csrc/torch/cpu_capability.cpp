// The CPU kernels for the CPU at hand, as ATen picks its own: where torch runs
// its AVX-512 kernels (at::get_cpu_capability(), which honours
// ATEN_CPU_CAPABILITY), this library loads the AVX-512 copies of csrc/cpu
// from beside itself, and their registrations replace the base build's
// (device_stub.h's ranks). They are a library of their own (CMakeLists.txt)
// so that their copies of inline functions, compiled for AVX-512, stay
// hidden in it: one library holding both copies could hand an AVX2 machine
// the AVX-512 one. Without the library the base kernels serve.
#if defined(FASTREDUCE_CPU_AVX512_LIBRARY)

#include <ATen/Version.h>
#include <dlfcn.h>

#include <string>

namespace fastreduce {
namespace {

std::string beside_this_library(const char* name) {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&beside_this_library), &info) == 0 || info.dli_fname == nullptr) return name;
  const std::string self = info.dli_fname;
  const auto slash = self.rfind('/');
  return slash == std::string::npos ? name : self.substr(0, slash + 1) + name;
}

const bool avx512_kernels_loaded = [] {
  if (at::get_cpu_capability() != "AVX512") return false;
  return dlopen(beside_this_library(FASTREDUCE_CPU_AVX512_LIBRARY).c_str(), RTLD_NOW | RTLD_LOCAL) != nullptr;
}();

}  // namespace
}  // namespace fastreduce

#endif
