// CPU reductions over the dense (outer, len, inner) view, with the same op
// abstraction as the CUDA kernels. Floating types run on at::vec vectors
// (float16/bfloat16 widened to float block by block); integer types on
// independent scalar lanes the compiler vectorizes. Work is cut into
// fixed-size pieces, never by thread count, so results do not depend on the
// number of threads.
#include <ATen/Parallel.h>

#include <array>
#include <vector>

#include "common.h"
#include "cpu_vec.h"

namespace fastreduce {
namespace {

using cpu::Vec;
using cpu::VecOp;

constexpr int64_t kBlock = 4096;         // elements folded into vector lanes before they join the total
constexpr int64_t kFullChunk = 1 << 16;  // slice of a full reduction per parallel task
constexpr int64_t kStrip = 64;           // columns one task keeps in registers

// Integers fold on 32 scalar lanes, which the compiler vectorizes; floating
// types on at::vec vectors.
template <typename Op, typename Acc>
Acc fold_lanes(const Acc* x, int64_t n) {
  if constexpr (std::is_floating_point_v<Acc>) {
    return cpu::fold_vectors<Op>(x, n);
  } else {
    std::array<Acc, 32> lanes;
    lanes.fill(Op::identity());
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int l = 0; l < 32; ++l) lanes[l] = Op::combine(lanes[l], x[i + l]);
    return cpu::combine_all<Op>(x + i, n - i, cpu::combine_all<Op>(lanes.data(), 32));
  }
}

// Folds n contiguous inputs block by block (error grows with the block
// count, not n); each block is widened to the accumulator type first.
template <typename Op, typename In>
typename Op::acc_t fold_contiguous(const In* x, int64_t n) {
  using Acc = typename Op::acc_t;
  thread_local std::vector<Acc> buffer;
  Acc acc = Op::identity();
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t count = std::min(kBlock, n - start);
    const Acc* values;
    if constexpr (std::is_same_v<In, Acc>) {
      values = x + start;
    } else {
      buffer.resize(kBlock);
      at::vec::convert(x + start, buffer.data(), count);
      values = buffer.data();
    }
    acc = Op::combine(acc, fold_lanes<Op>(values, count));
  }
  return acc;
}

// Columns [c0, c0 + width) of rows [0, len) folded into `total`: rows are
// added whole-vector by whole-vector, in blocks of rows that join the total
// one at a time.
template <typename Op, typename In>
void fold_columns(const In* x, int64_t len, int64_t inner, int64_t c0, int64_t width, typename Op::acc_t* total) {
  using Acc = typename Op::acc_t;
  std::array<Acc, kStrip> block, row;
  std::fill(total, total + width, Op::identity());
  for (int64_t r0 = 0; r0 < len; r0 += 128) {
    block.fill(Op::identity());
    for (int64_t r = r0; r < std::min(len, r0 + 128); ++r) {
      const In* source = x + r * inner + c0;
      if constexpr (std::is_floating_point_v<Acc>) {
        const Acc* values;
        if constexpr (std::is_same_v<In, Acc>) {
          values = source;
        } else {
          at::vec::convert(source, row.data(), width);
          values = row.data();
        }
        using V = Vec<Acc>;
        int64_t c = 0;
        for (; c + V::size() <= width; c += V::size())
          VecOp<Op>::combine(V::loadu(block.data() + c), V::loadu(values + c)).store(block.data() + c);
        for (; c < width; ++c) block[c] = Op::combine(block[c], values[c]);
      } else {
        for (int64_t c = 0; c < width; ++c) block[c] = Op::combine(block[c], static_cast<Acc>(source[c]));
      }
    }
    for (int64_t c = 0; c < width; ++c) total[c] = Op::combine(total[c], block[c]);
  }
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
    out[0] = finish(cpu::combine_all<Op>(partial.data(), chunks));
  } else if (inner == 1) {
    at::parallel_for(0, outer, std::max<int64_t>(1, kFullChunk / std::max<int64_t>(len, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t o = begin; o < end; ++o) out[o] = finish(fold_contiguous<Op>(x + o * len, len));
                     });
  } else {
    // Columns: each task owns a strip of columns of one outer slice.
    const int64_t strips = (inner + kStrip - 1) / kStrip;
    at::parallel_for(0, outer * strips, 1, [&](int64_t begin, int64_t end) {
      std::array<Acc, kStrip> total;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t o = task / strips;
        const int64_t c0 = (task % strips) * kStrip;
        const int64_t width = std::min(kStrip, inner - c0);
        fold_columns<Op>(x + o * len * inner, len, inner, c0, width, total.data());
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
