// sum_variant: the kernel ladder's entry point. The name is looked up in the
// ladder table; CUDA tensors run that rung, CPU tensors (which have one
// implementation) get the CPU sum after the same checks.
#include <sstream>
#include <string_view>

#include "../ladder/table.h"
#include "common.h"
#include "kernels.h"
#include "ops.h"

namespace fastreduce {

namespace {

int find_rung(std::string_view variant) {
  for (int i = 0; i < kLadderSize; ++i)
    if (variant == kLadder[i].name) return i;
  std::ostringstream names;
  for (int i = 0; i < kLadderSize; ++i) names << (i ? ", " : "") << kLadder[i].name;
  TORCH_CHECK(false, "sum_variant: unknown variant '", std::string(variant), "' for argument 'variant'; known: ", names.str());
}

}  // namespace

at::Tensor backend::sum_variant(const at::Tensor& self, c10::string_view variant) {
  const int rung = find_rung(std::string_view(variant.data(), variant.size()));
  const auto type = self.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kInt,
              "sum_variant: unsupported dtype ", to_text(type),
              " for argument 'self'; the ladder runs float32, bfloat16 and int32");
  if (!self.is_cuda()) return backend::sum(self, at::OptionalIntArrayRef(), false, std::nullopt);
  const at::Tensor flat = self.contiguous().view(-1);
  at::Tensor out = at::empty({}, self.options().dtype(type == at::kInt ? at::kLong : type));
  if (flat.numel() == 0) return out.zero_();  // no grid to launch (some rungs size theirs from n)
  ladder_stub(flat.device().type(), rung, flat, out);
  return out;
}

at::Tensor backend::read_probe(const at::Tensor& self) {
  TORCH_CHECK(self.is_cuda(), "_read_probe: argument 'self' must be a CUDA tensor");
  TORCH_CHECK(self.is_contiguous() && self.nbytes() % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(self.const_data_ptr()) % 16 == 0,
              "_read_probe: argument 'self' must be contiguous, 16-byte aligned, a multiple of 16 bytes");
  at::Tensor flag = at::empty({}, self.options().dtype(at::kInt));
  read_probe_stub(self.device().type(), self, flag);
  return flag;
}

}  // namespace fastreduce
