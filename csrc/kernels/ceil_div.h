// Integer division rounded up: grid sizes, tile and chunk counts.
#pragma once

#include <cstdint>

namespace fastreduce {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fastreduce
