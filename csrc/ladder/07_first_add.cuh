// Rung 7: first add during the global load (reduce3).
// Against rung 6: each thread loads two elements and adds them before the
// tree, so a block covers 512 elements with 256 threads and half as many
// blocks (and partials) are needed. Two loads in flight per thread.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename In>
cudaError_t first_add(const RungArgs& a) {
  return run_tree<256, 2, SequentialTree, In>(a);
}

}  // namespace fastreduce::ladder
