// CPU reductions over the dense (outer, len, inner) view, with the same op
// abstraction as the CUDA kernels. Work is cut into fixed-size pieces, never
// by thread count, so results do not depend on the number of threads.
#include <ATen/Parallel.h>

#include <vector>

#include "common.h"

namespace fastreduce {
namespace {

constexpr int64_t kLeaf = 128;           // elements folded sequentially before a pairwise step
constexpr int64_t kFullChunk = 1 << 16;  // slice of a full reduction per parallel task

// Pairwise (cascade) fold: error grows with log(n) rather than n.
template <typename Op, typename In, typename Acc = typename Op::acc_t>
Acc fold_contiguous(const In* x, int64_t n) {
  if (n <= kLeaf) {
    Acc acc = Op::identity();
    for (int64_t i = 0; i < n; ++i) acc = Op::combine(acc, static_cast<Acc>(x[i]));
    return acc;
  }
  const int64_t half = n / 2;
  return Op::combine(fold_contiguous<Op>(x, half), fold_contiguous<Op>(x + half, n - half));
}

template <ReduceKind K, typename In>
void reduce_typed(const In* x, int64_t outer, int64_t len, int64_t inner, void* output) {
  using T = ReduceTypes<K, In>;
  using Op = typename T::op_t;
  using Acc = typename T::acc_t;
  using Out = typename T::out_t;
  auto* out = static_cast<Out*>(output);
  const Acc scale = static_cast<Acc>(1.0 / static_cast<double>(len));
  auto finish = [&](Acc acc) { return static_cast<Out>(Op::finalize(acc, scale)); };

  if (inner == 1 && outer == 1) {
    const int64_t chunks = (len + kFullChunk - 1) / kFullChunk;
    std::vector<Acc> partial(chunks);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t start = c * kFullChunk;
        partial[c] = fold_contiguous<Op>(x + start, std::min(kFullChunk, len - start));
      }
    });
    Acc acc = Op::identity();
    for (Acc p : partial) acc = Op::combine(acc, p);
    out[0] = finish(acc);
  } else if (inner == 1) {
    at::parallel_for(0, outer, std::max<int64_t>(1, kFullChunk / std::max<int64_t>(len, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t o = begin; o < end; ++o) out[o] = finish(fold_contiguous<Op>(x + o * len, len));
                     });
  } else {
    // Columns: each task owns a strip of columns and walks the rows in blocks
    // of kLeaf, folding each block before adding it to the running total.
    const int64_t strips = (inner + kLeaf - 1) / kLeaf;
    at::parallel_for(0, outer * strips, 1, [&](int64_t begin, int64_t end) {
      std::vector<Acc> total(kLeaf), block(kLeaf);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t o = task / strips;
        const int64_t c0 = (task % strips) * kLeaf;
        const int64_t width = std::min(kLeaf, inner - c0);
        std::fill(total.begin(), total.end(), Op::identity());
        for (int64_t r0 = 0; r0 < len; r0 += kLeaf) {
          std::fill(block.begin(), block.end(), Op::identity());
          for (int64_t r = r0; r < std::min(len, r0 + kLeaf); ++r) {
            const In* row = x + (o * len + r) * inner + c0;
            for (int64_t c = 0; c < width; ++c) block[c] = Op::combine(block[c], static_cast<Acc>(row[c]));
          }
          for (int64_t c = 0; c < width; ++c) total[c] = Op::combine(total[c], block[c]);
        }
        for (int64_t c = 0; c < width; ++c) out[o * inner + c0 + c] = finish(total[c]);
      }
    });
  }
}

}  // namespace

void reduce_cpu(ReduceKind kind, const at::Tensor& input, int64_t outer, int64_t len, int64_t inner,
                at::Tensor& out) {
  const DType dtype = to_dtype(input.scalar_type(), "reduce");
  visit_reduction<c10::Half, c10::BFloat16>(kind, dtype, false, [&](auto k, auto tag) {
    using In = typename decltype(tag)::type;
    reduce_typed<decltype(k)::value, In>(input.const_data_ptr<In>(), outer, len, inner, out.data_ptr());
    return true;
  });
}

}  // namespace fastreduce
