// Rung 6: sequential addressing (reduce2).
// Against rung 5: the tree halves from the top (thread t adds s[t + stride]),
// so consecutive threads touch consecutive words: no bank conflicts. Half the
// threads are idle from the first step on: loads, not adds, are the limit.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename In>
cudaError_t sequential(const RungArgs& a) {
  return run_tree<256, 1, SequentialTree, In>(a);
}

}  // namespace fastreduce::ladder
