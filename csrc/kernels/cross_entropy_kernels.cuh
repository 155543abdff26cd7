// Fused cross-entropy over (rows, classes) logits and one class index per
// row, as torch.nn.functional.cross_entropy (ignore_index, label smoothing):
//   loss = lse - (1 - eps) * x[target] - eps / classes * sum(x), with lse = max + log(sum exp(x - max)),
// taken as (max - x[target]) + log(...) so that huge logits do not cancel.
// The forward reads each row once, keeping an online log-sum-exp (running
// max, rescaled sum) per thread, and never writes probabilities; the
// backward reads the row once more and writes the gradient
//   dx = (g + g_lse) * softmax(x) - g * ((1 - eps) * [j == target] + eps / classes)
// The forward and backward kernels run one block per row: vocabulary rows
// are long (50k-256k), rows are many. The forward_backward kernel does both
// when the gradient is known in the forward (the loss's own, scaled later),
// its blocks looping over rows that they keep on chip between the two reads:
// in shared memory (the longest split over a cluster of blocks), or in the
// registers of a cluster (the pipelined kernel: rows past one block).
#pragma once

#include <limits>
#include <type_traits>

#include "cross_entropy_target.h"
#include "row_io.cuh"
#include "row_math.cuh"

namespace fastreduce {

enum class LossReduction : int { None = 0, Mean = 1, Sum = 2 };

constexpr int kCrossEntropyThreads = 256;
// The with-gradient kernel's blocks, which loop over rows.
constexpr int kCrossEntropyResidentThreads = 1024;

// Rows are read as row_io.cuh's loose rows: `packs` whole 16-byte packs in
// every row from its first 16-byte boundary on, the classes around them one
// by one (none when every row starts aligned and is whole packs).
template <typename T>
struct CrossEntropyArgs {
  const T* logits;
  const int64_t* target;
  int64_t rows, classes, row_stride, ignore_index;  // row_stride: of the logits and the gradient
  opmath_t<T> smoothing;
  int64_t packs;
};

// f(c, x[c] as a one-class pack) for the calling thread's loose class
// (row_io.cuh), if it has one.
template <int kVec, typename T, typename F>
__device__ __forceinline__ void for_own_loose(const CrossEntropyArgs<T>& a, const T* x, int head, F&& f) {
  const LooseElement loose = loose_element<kVec>(threadIdx.x, head, a.packs, a.classes);
  if (loose.held) f(loose.index, VecN<T, 1>{{x[loose.index]}});
}

// Online log-sum-exp: the largest logit, the sum of exp(x - max), and the
// plain sum of the logits (label smoothing).
template <typename A>
struct LseState {
  A max, sum, total;
};

// Folds one group of logits into `state`: the sum is rescaled only when the
// group raises the max. A max of -inf (every logit so far -inf, a masked
// vocabulary) shifts by 0 so the terms stay exp2(-inf) = 0, not NaN. A NaN
// logit makes the max NaN, and so the row's lse, loss and gradient, as
// torch's (a max that dropped it would lose it where the other terms of a
// merge are 0).
template <int kVec, typename T, typename A>
__device__ __forceinline__ void absorb(LseState<A>& state, const VecN<T, kVec>& pack) {
  A u[kVec];
  widen(pack, u);
  A top = state.max;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    state.total += u[j];
    top = max_or_nan(top, u[j]);
  }
  if (!(top <= state.max)) {
    state.sum *= exp_shifted(state.max, top);
    state.max = top;
  }
  const A shift = state.max == -std::numeric_limits<A>::infinity() ? A(0) : state.max;
#pragma unroll
  for (int j = 0; j < kVec; ++j) state.sum += exp_shifted(u[j], shift);
}

template <typename A>
__device__ __forceinline__ LseState<A> merge(const LseState<A>& a, const LseState<A>& b) {
  const A top = max_or_nan(a.max, b.max);
  if (top == -std::numeric_limits<A>::infinity()) return {top, A(0), a.total + b.total};
  return {top, a.sum * exp_shifted(a.max, top) + b.sum * exp_shifted(b.max, top), a.total + b.total};
}

// Every thread gets the block's merged state (fixed order: reproducible).
template <typename A>
__device__ LseState<A> block_merge(LseState<A> state) {
  __shared__ LseState<A> scratch[kWarpSize];
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    state = merge(state, LseState<A>{__shfl_xor_sync(kFullMask, state.max, offset),
                                     __shfl_xor_sync(kFullMask, state.sum, offset),
                                     __shfl_xor_sync(kFullMask, state.total, offset)});
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) scratch[warp] = state;
  __syncthreads();
  state = scratch[0];
  for (int w = 1; w < int(blockDim.x / kWarpSize); ++w) state = merge(state, scratch[w]);
  return state;
}

// f(i, load(i)) for the calling thread's packs i in [first, end), a stride
// of blockDim.x apart, kUnroll loads in flight before the first f.
template <int kUnroll, typename Load, typename F>
__device__ __forceinline__ void for_own_packs(int64_t first, int64_t end, Load&& load, F&& f) {
  const int64_t stride = blockDim.x;
  for (int64_t base = first; base < end; base += kUnroll * stride) {
    decltype(load(base)) p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < end) p[u] = load(base + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < end) f(base + u * stride, p[u]);
  }
}

// f(c, pack) over the row's packs, four loads in flight per thread, and its
// loose classes (one-class packs); c: the class of the pack's first element.
template <int kVec, typename T, typename F>
__device__ __forceinline__ void for_each_pack(const CrossEntropyArgs<T>& a, const T* x, F&& f) {
  const int head = row_head<kVec>(x);
  const auto* packs = reinterpret_cast<const VecN<T, kVec>*>(x + head);
  for_own_packs<4>(threadIdx.x, a.packs, [&](int64_t i) { return packs[i]; },
                   [&](int64_t i, const VecN<T, kVec>& pack) { f(head + i * kVec, pack); });
  for_own_loose<kVec>(a, x, head, f);
}

// The row's merged log-sum-exp state: every thread of the block gets it.
template <typename T, int kVec, typename A = opmath_t<T>>
__device__ __forceinline__ LseState<A> row_state(const CrossEntropyArgs<T>& a, const T* x) {
  LseState<A> state{-std::numeric_limits<A>::infinity(), A(0), A(0)};
  for_each_pack<kVec>(a, x, [&](int64_t, const auto& pack) { absorb(state, pack); });
  return block_merge(state);
}

// A row holding +inf has lse +inf, as torch.logsumexp (its log_sum, and so
// the loss and gradient, stay NaN); an all -inf row gives -inf.
template <typename A>
__device__ __forceinline__ A row_lse(const LseState<A>& state) {
  return isinf(state.max) ? state.max : state.max + log(state.sum);
}

// The row's loss (accumulator type; 0 for ignored rows, NaN for a target
// outside [0, classes)) from its state and the target's logit. Without
// smoothing the sum of the logits is left out: 0 * -inf would make a masked
// vocabulary NaN.
template <typename T, typename A>
__device__ __forceinline__ A row_loss_of(const CrossEntropyArgs<T>& a, A target_logit, const LseState<A>& state,
                                         int64_t t) {
  if (t == a.ignore_index) return A(0);
  if (t < 0 || t >= a.classes) return std::numeric_limits<A>::quiet_NaN();
  const A log_sum = log(state.sum);
  return (A(1) - a.smoothing) * ((state.max - target_logit) + log_sum) +
         (a.smoothing == A(0) ? A(0) : a.smoothing * ((state.max - state.total / static_cast<A>(a.classes)) + log_sum));
}

// x[t] where t is one of the classes [first, end) (0 otherwise).
template <typename T>
__device__ __forceinline__ opmath_t<T> logit_of(const T* x, int64_t t, int64_t first, int64_t end) {
  return t >= first && t < end ? static_cast<opmath_t<T>>(x[t]) : opmath_t<T>(0);
}

// x[t] where t is a class of the row's packs [first, first + count) or,
// with `loose`, one of its loose classes (0 otherwise).
template <int kVec, typename T>
__device__ __forceinline__ opmath_t<T> logit_of_share(const CrossEntropyArgs<T>& a, const T* x, int64_t head, int64_t t,
                                                      int64_t first, int64_t count, bool loose) {
  const int64_t packed_end = head + a.packs * kVec;
  if (t >= head && t < packed_end) return logit_of(x, t, head + first * kVec, head + (first + count) * kVec);
  return loose ? logit_of(x, t, int64_t(0), a.classes) : opmath_t<T>(0);
}

// A block's part of a row split over a cluster: its log-sum-exp state and
// the target's logit if the block holds it (0 otherwise): 16 bytes in float.
template <typename A>
struct RowPart {
  LseState<A> state;
  A target_logit;
};

// The row's state and target logit from every block's part, merged in block
// order (the same bits in every block), through distributed shared memory.
template <typename A>
__device__ RowPart<A> cluster_merge(const RowPart<A>& part, int turn, int blocks, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const RowPart<A>* parts = cluster::gather(part, turn, blocks, rank);
  RowPart<A> row = parts[0];
  for (int b = 1; b < blocks; ++b) row = {merge(row.state, parts[b].state), row.target_logit + parts[b].target_logit};
  return row;
#else
  return part;
#endif
}

// The divisor of the summed row losses, on every thread of the block: for a
// mean the rows not ignored (none: 0, and the mean 0 / 0 = NaN, as torch),
// for a sum 1.
template <typename T, typename A = opmath_t<T>>
__device__ A block_loss_divisor(const CrossEntropyArgs<T>& a, bool mean, A* scratch) {
  if (!mean) return A(1);
  A kept = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) kept += a.target[r] != a.ignore_index;
  return block_allreduce<SumOp<A>>(kept, scratch);
}

// One row's gradient, dx_j = soft * exp(x_j - lse) - g * (eps / classes +
// (1 - eps) [j == t]), a pack at a time.
template <typename A>
struct RowGradient {
  A shift, soft, smooth, hit;
  int64_t t;
  template <typename T>
  __device__ RowGradient(const CrossEntropyArgs<T>& a, int64_t target, A g, A soft_, A lse)
      // exp(x - lse) of a +inf row is NaN, as torch's softmax there (not 0).
      : shift(isinf(lse) && lse > A(0) ? std::numeric_limits<A>::quiet_NaN() : lse),
        soft(soft_),
        smooth(g * a.smoothing / static_cast<A>(a.classes)),
        hit(target_hit(g, a.smoothing, a.classes, smooth)),
        t(target) {}
  // The gradient of the row's pack whose first class is c. The target is
  // looked for once a pack (a 64-bit compare an element took a third of the
  // loop's instructions); its pack subtracts `hit` through a select on every
  // element, which keeps `value` in registers (value[place] -= hit would not).
  template <typename T, int kVec>
  __device__ __forceinline__ VecN<T, kVec> pack(int64_t c, const VecN<T, kVec>& x) const {
    A value[kVec];
    widen(x, value);
#pragma unroll
    for (int j = 0; j < kVec; ++j) value[j] = soft * exp_shifted(value[j], shift) - smooth;
    const uint64_t place = static_cast<uint64_t>(t - c);  // the target's index in the pack, if below kVec
    if (place < kVec) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) value[j] -= j == static_cast<int>(place) ? hit : A(0);
    }
    VecN<T, kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) result.elem[j] = static_cast<T>(value[j]);
    return result;
  }
};

// The row's gradient written to `dx`, which may be `x` itself (in place):
// each element is read, then written, by one thread.
template <int kVec, typename T, typename A>
__device__ __forceinline__ void write_row_gradient(const CrossEntropyArgs<T>& a, const T* x, T* dx, int64_t t, A g,
                                                   A soft, A lse) {
  const RowGradient<A> gradient(a, t, g, soft, lse);
  for_each_pack<kVec>(a, x, [&](int64_t c, const auto& pack) {
    *reinterpret_cast<std::decay_t<decltype(pack)>*>(dx + c) = gradient.pack(c, pack);
  });
}

// Writes lse[row] and the row's loss.
template <typename T, int kVec>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_forward_kernel(CrossEntropyArgs<T> a, opmath_t<T>* __restrict__ lse,
                                 opmath_t<T>* __restrict__ row_loss) {
  const int64_t row = blockIdx.x;
  const T* x = a.logits + row * a.row_stride;
  const auto state = row_state<T, kVec>(a, x);
  if (threadIdx.x != 0) return;
  const int64_t t = a.target[row];
  lse[row] = row_lse(state);
  row_loss[row] = row_loss_of(a, logit_of(x, t, 0, a.classes), state, t);
}

// Where the with-gradient kernel's blocks leave the reduced loss (`loss`
// null: they do not reduce it): each block sums its rows' losses in
// `block_sums`, and the last to finish, counted at `*arrivals` (zero, and
// left zero), folds them in block order.
template <typename T>
struct LossFold {
  T* loss;
  opmath_t<T>* block_sums;
  unsigned int* arrivals;
};

// Each block's sum of its rows' losses (thread 0's) into fold.loss, which
// the last block to finish divides by `divisor`: in block order.
template <typename T, typename A>
__device__ void fold_loss(const LossFold<T>& fold, A block_loss, A divisor, A* scratch) {
  if (!fold.loss) return;
  if (threadIdx.x == 0) fold.block_sums[blockIdx.x] = block_loss;
  if (!last_to_arrive(fold.arrivals, gridDim.x)) return;
  A total = 0;
  for (int64_t b = threadIdx.x; b < gridDim.x; b += blockDim.x) total += load_from_other_block(fold.block_sums + b);
  total = block_allreduce<SumOp<A>>(total, scratch);
  if (threadIdx.x == 0) *fold.loss = static_cast<T>(total / divisor);
}

// The forward and the gradient of grad_scale * (the summed row losses) in
// one kernel (grad_scale null: 1), written over the logits when grad_input
// is the logits. Two passes over memory instead of a forward's and a
// backward's three, when the second read of a row stays on chip: its first
// `cached_packs` packs are copied to shared memory asynchronously (no
// registers held while they fly), the rest read with the L2 priorities
// above, and the launcher sizes the grid so that the rows in flight fit.
// Rows too long for one block's shared memory may instead be split (kSplit)
// over a cluster of blocks, each caching its share of the packs whole; the
// blocks' states and the target's logit meet in distributed shared memory
// (float accumulators: 16 bytes a block). Blocks (or clusters) loop over
// rows; each thread reads back only the packs it cached, so rows follow one
// another without a barrier. With `prefetch`, a slot takes the block's next
// row as soon as its gradient is out: that row's read overlaps this row's
// writes. For a `mean`, every block first counts the rows not ignored and
// divides the gradient by it: no launches before this one. Row losses go to
// `row_loss` (unless null) and into the loss (LossFold): none after it
// either.
template <typename T, int kVec, bool kSplit>
__global__ void __launch_bounds__(kCrossEntropyResidentThreads)
    cross_entropy_forward_backward_kernel(CrossEntropyArgs<T> a, const opmath_t<T>* __restrict__ grad_scale,
                                          bool mean, opmath_t<T>* __restrict__ lse,
                                          opmath_t<T>* __restrict__ row_loss, LossFold<T> fold, T* grad_input,
                                          int64_t cached_packs, bool prefetch) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  constexpr int kUnroll = sizeof(T) == 4 ? 4 : 2;  // as deep as 1024 threads allow without spilling
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ A scratch[kWarpSize];
  Pack* cache = reinterpret_cast<Pack*>(shared_bytes);
  const uint64_t keep = l2_keep_policy();
  // This block's share of each row: packs [first, first + count).
  static_assert(!kSplit || sizeof(RowPart<A>) == 16, "a block's part travels as 16 bytes");
  const int blocks_per_row = kSplit ? cluster_blocks() : 1, rank = kSplit ? cluster_block_rank() : 0;
  const int64_t row_packs = a.packs, share = (row_packs + blocks_per_row - 1) / blocks_per_row;
  const int64_t first = !kSplit ? 0 : rank * share < row_packs ? rank * share : row_packs;
  const int64_t count = !kSplit ? row_packs : row_packs - first < share ? row_packs - first : share;
  const int64_t stride = blockDim.x, tid = threadIdx.x;
  const int64_t cached = sizeof(Pack) != 16 ? 0 : cached_packs < count ? cached_packs : count;
  const int64_t tail_first = tid < cached ? tid + (cached - tid + stride - 1) / stride * stride : tid;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kSplit) cluster::open_inboxes();
#endif
  const A divisor = block_loss_divisor(a, mean, scratch);
  const A row_scale = (grad_scale ? *grad_scale : A(1)) / divisor;  // inf when no row is kept: every row's is 0
  A block_loss = 0;  // thread 0's of the row's first block, over its rows in order
  const int64_t first_row = blockIdx.x / blocks_per_row, row_step = gridDim.x / blocks_per_row;
  const auto packs_of = [&](int64_t row) {
    const T* x = a.logits + row * a.row_stride;
    return reinterpret_cast<const Pack*>(x + row_head<kVec>(x)) + first;
  };
  const auto cache_row = [&](int64_t row) {
    if constexpr (sizeof(Pack) == 16)
      for (int64_t i = tid; i < cached; i += stride) copy16_async(cache + i, packs_of(row) + i);
  };
  if (prefetch && first_row < a.rows) cache_row(first_row);
  int turn = 0;
  for (int64_t row = first_row; row < a.rows; row += row_step) {
    const T* x = a.logits + row * a.row_stride;
    const int head = row_head<kVec>(x);
    const auto* packs = packs_of(row);
    const auto* next_packs = prefetch && row + row_step < a.rows ? packs_of(row + row_step) : nullptr;
    if (!prefetch) cache_row(row);
    LseState<A> state{-std::numeric_limits<A>::infinity(), A(0), A(0)};
    const auto absorb_pack = [&](int64_t, const auto& p) { absorb(state, p); };
    for_own_packs<kUnroll>(tail_first, count, [&](int64_t i) { return load_keeping_in_l2(packs + i, keep); },
                           absorb_pack);
    if (rank == 0) for_own_loose<kVec>(a, x, head, absorb_pack);  // the first block of a split row takes them
    wait_async_copies();
    for_own_packs<kUnroll>(tid, cached, [&](int64_t i) { return cache[i]; }, absorb_pack);
    RowPart<A> part{block_merge(state), A(0)};
    const int64_t t = a.target[row];
    // x[t] is read by the block whose share holds it (by the threads that
    // pass the part on), before the barrier after which its threads write
    // their share (in place: over x).
    if (tid < blocks_per_row) part.target_logit = logit_of_share<kVec>(a, x, head, t, first, count, rank == 0);
    if constexpr (kSplit) part = cluster_merge(part, turn++, blocks_per_row, rank);
    const A lse_row = row_lse(part.state);
    if (tid == 0 && rank == 0) {
      if (lse) lse[row] = lse_row;
      const A loss_row = row_loss_of(a, part.target_logit, part.state, t);
      if (row_loss) row_loss[row] = loss_row;
      block_loss += loss_row;
    }
    __syncthreads();
    const A g = t == a.ignore_index ? A(0) : row_scale;
    const RowGradient<A> gradient(a, t, g, g, lse_row);
    T* dx = grad_input + row * a.row_stride;
    auto* out = reinterpret_cast<Pack*>(dx + head) + first;
    const auto write_gradient = [&](int64_t i, const Pack& p) {
      store_streaming(out + i, gradient.pack(head + (first + i) * kVec, p));
    };
    if (rank == 0)
      for_own_loose<kVec>(a, x, head, [&](int64_t c, const VecN<T, 1>& p) { dx[c] = gradient.pack(c, p).elem[0]; });
    // The tail first: its second read comes from L2 before the next row's reads pass through it.
    for_own_packs<kUnroll>(tail_first, count, [&](int64_t i) { return load_streaming(packs + i); }, write_gradient);
    for_own_packs<kUnroll>(tid, cached, [&](int64_t i) { return cache[i]; }, [&](int64_t i, const Pack& p) {
      write_gradient(i, p);
      if constexpr (sizeof(Pack) == 16)
        if (next_packs) copy16_async(cache + i, next_packs + i);
    });
  }
  fold_loss(fold, block_loss, divisor, scratch);
}

// Element j of pack p of a thread's packs held as words (word_element),
// for p and j known only at run time: selected, not indexed, so that the
// packs stay in registers.
template <typename T, int kPacks>
__device__ __forceinline__ float element_at(const uint4 (&packs)[kPacks], int p, int j) {
  uint4 pack = packs[0];
#pragma unroll
  for (int q = 1; q < kPacks; ++q) pack = q == p ? packs[q] : pack;
  constexpr int kPerWord = 4 / sizeof(T);
  const int w = j / kPerWord;
  const uint32_t word = w == 0 ? pack.x : w == 1 ? pack.y : w == 2 ? pack.z : pack.w;
  return low_element<T>(j % kPerWord ? word >> 16 : word);
}

// cross_entropy_forward_backward_kernel for rows past one block's registers,
// laid out as softmax_forward_pipelined_kernel's: clusters walk their rows,
// holding kPacks 16-byte packs a thread as the words they read, and load the
// next row while this row's sum is in flight between the blocks, so the
// logits are read once and the gradient written once with nothing staged.
// One exchange a row, as the softmax's: the exponentials against the row's
// first logit (a sum of at most kShiftedSumMax bounds each), which the
// gradient recomputes. The thread holding the target's logit (rank 0 where
// none does) makes the row's loss; a block folds its threads' losses at the
// end. Rows that the shift cannot take (a logit far above the first, inf or
// NaN: rare) are read again from memory and taken against their largest
// logit. kLoose: rows that are not whole packs (PackedRow). The outputs and
// the loss fold are those of the kernel above.
template <typename T, int kPacks, bool kLoose>
__global__ void __launch_bounds__(kRowThreadsMax)
    cross_entropy_forward_backward_pipelined_kernel(CrossEntropyArgs<T> a, const float* __restrict__ grad_scale,
                                                    bool mean, float* __restrict__ lse,
                                                    float* __restrict__ row_loss, LossFold<T> fold, T* grad_input) {
  static_assert(std::is_same_v<opmath_t<T>, float>, "two- or four-byte logits");
  constexpr int kVec = Vec16<T>::kSize;
  using A = float;
  using Pack = uint4;  // kVec logits as words (word_element)
  const A log2e = static_cast<A>(kLog2e);
  __shared__ A scratch[kWarpSize];
  RowThreads<false> threads(a.rows);
  const int classes = static_cast<int>(a.classes);
  const int64_t row_groups = gridDim.x / cluster_blocks();
  // The gradient's factors of a kept row (once the rows are counted), and
  // this thread's losses, its rows in order.
  A divisor = 0, soft_scale = 0, smooth = 0, hit = 0, thread_loss = 0;
  bool counted = false;
  // Each row's target is loaded a row ahead (loaded where it is used: H200,
  // bf16 (1024, 262144) 282 -> 299 µs, (4096, 151936) 807 -> 875).
  int64_t next_target = a.target[threads.row];
  const auto step = [&](int64_t row, const auto& shares, auto&& fetch_next) {
    const Pack(&packs)[kPacks] = shares.words[0];
    const T* const x = a.logits + row * a.row_stride;
    T* const dx = grad_input + row * a.row_stride;
    const PackedRow<kVec, kLoose> layout(x, classes, threads.rank);
    const int groups = layout.packs;
    const bool loose = kLoose && layout.loose.held;
    const A spare = low_element<T>(shares.spare[0]);
    const int64_t t = next_target;
    if (row + row_groups < a.rows) next_target = a.target[row + row_groups];
    // The target's logit, taken in a branch that the other warps skip
    // (selected from every element, it cost 4 of 18 instructions an element:
    // bf16 (4096, 128256) 626 µs against the pipelined softmax's 528, H200).
    // Pack p holds classes head + (p * count + rank) * kVec onwards.
    const int64_t past_head = t - layout.head - threads.rank * int64_t(kVec);
    int target_pack = -1;
    if (past_head >= 0 && past_head < int64_t(kPacks) * threads.count * kVec &&
        t < layout.head + int64_t(groups) * kVec) {
      const int group = static_cast<int>(past_head / kVec);
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (group == p * threads.count) target_pack = p;
    }
    const bool packed_target = target_pack >= 0;
    const bool holds_target = packed_target || (loose && layout.loose.index == t);  // the loose class: spare
    A target_logit = spare;
    if (__builtin_expect(packed_target, 0))
      target_logit = element_at<T>(packs, target_pack, static_cast<int>(past_head % kVec));
    // The row's loss: the target's holder's, rank 0's where no thread holds
    // it (a target outside the classes: NaN).
    const bool makes_loss = holds_target || (threads.rank == 0 && (t < 0 || t >= a.classes));
    const A first = low_element<T>(shares.head);
    const A shift = log2e * first;
    const A mine = shifted_exp_sum<T>(threads, packs, groups, loose, spare, log2e, shift);
    const A exps = threads.template allreduce<SumOp<A>>(mine, fetch_next);
    if (!counted) {  // here, the next row's loads in flight
      // A mean's rows not ignored, counted by the whole cluster (one block's
      // threads alone took bf16 (8192, 32000) from 300 to 346 µs, H200).
      divisor = A(1);
      if (mean) {
        A kept = 0;
        for (int64_t r = threads.rank; r < a.rows; r += threads.count) kept += a.target[r] != a.ignore_index;
        divisor = threads.template allreduce<SumOp<A>>(kept);
      }
      soft_scale = (grad_scale ? *grad_scale : A(1)) / divisor;  // inf when no row is kept: every row's is 0
      smooth = soft_scale * a.smoothing / static_cast<A>(a.classes);
      hit = target_hit(soft_scale, a.smoothing, a.classes, smooth);
      counted = true;
    }
    A total = 0;  // the logits' plain sum: label smoothing's term of the loss
    if (a.smoothing != A(0)) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (threads.group(p) < groups)
#pragma unroll
          for (int j = 0; j < kVec; ++j) total += word_element<T>(packs[p], j);
      if (loose) total += spare;
      total = threads.template allreduce<SumOp<A>>(total);
    }
    const bool kept = t != a.ignore_index;
    const auto record = [&](const LseState<A>& state) {
      if (threads.rank == 0 && lse) lse[row] = row_lse(state);
      if (makes_loss) {
        const A loss = row_loss_of(a, target_logit, state, t);
        if (row_loss) row_loss[row] = loss;
        thread_loss += loss;
      }
    };
    // The same in every block of the cluster, so all make the same exchanges.
    if (fma_shift_in_range(shift) && exps <= A(kShiftedSumMax)) {  // false for inf and NaN
      // The sum against `first` itself: the shift's rounding (exact by an fma) taken out.
      if (threads.rank == 0 || makes_loss) record({first, exps * exp2_acc(-fmaf(first, log2e, -shift)), total});
      // exps is in [1/2, 2^96]: the fast division's range.
      const A soft = kept ? __fdividef(soft_scale, exps) : A(0), row_smooth = kept ? smooth : A(0);
      Pack* const out = reinterpret_cast<Pack*>(layout.packs_of(dx));
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (threads.group(p) >= groups) continue;
        A result[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          result[j] = soft * exp2_acc(log2e * word_element<T>(packs[p], j) - shift) - row_smooth;
        out[threads.group(p)] = words_of<T>(result);
      }
      if (loose) dx[layout.loose.index] = static_cast<T>(soft * exp2_acc(log2e * spare - shift) - row_smooth);
      // The target's class written again, by the thread that wrote it.
      if (holds_target && kept)
        dx[t] = static_cast<T>(soft * exp2_acc(log2e * target_logit - shift) - row_smooth - hit);
    } else {
      const VecN<T, kVec>* const in = layout.packs_of(x);
      const auto for_each = [&](auto&& f) {
#pragma unroll 1
        for (int k = threads.rank; k < groups; k += threads.count) {
          A u[kVec];
          widen(in[k], u);
#pragma unroll
          for (int j = 0; j < kVec; ++j) f(u[j]);
        }
        if (loose) f(spare);
      };
      A top = -std::numeric_limits<A>::infinity();
      for_each([&](A v) { top = max_or_nan(top, v); });
      top = threads.template allreduce<MaxOp<A>>(top);
      const A top_shift = top == -std::numeric_limits<A>::infinity() ? A(0) : top;  // as absorb's
      A sum = 0;
      for_each([&](A v) { sum += exp_shifted(v, top_shift); });
      const LseState<A> state{top, threads.template allreduce<SumOp<A>>(sum), total};
      record(state);
      const A g = kept ? soft_scale : A(0);
      const RowGradient<A> gradient(a, t, g, g, row_lse(state));
      VecN<T, kVec>* const out = layout.packs_of(dx);
#pragma unroll 1
      for (int k = threads.rank; k < groups; k += threads.count)
        out[k] = gradient.pack(layout.head + int64_t(k) * kVec, in[k]);
      if (loose)
        dx[layout.loose.index] = gradient.pack(layout.loose.index, VecN<T, 1>{{x[layout.loose.index]}}).elem[0];
    }
  };
  walk_pipelined<kPacks, kLoose>(threads, a.rows, classes, a.row_stride, {a.logits}, step);
  if (fold.loss) fold_loss(fold, block_allreduce<SumOp<A>>(thread_loss, scratch), divisor, scratch);
}

// reduction None: out[r] = row_loss[r] in T (any grid). Mean/Sum: one block
// writes the sum over rows (divided by the rows not ignored for Mean: 0/0 =
// NaN when every row is ignored, as torch).
template <typename T>
__global__ void cross_entropy_reduce_kernel(CrossEntropyArgs<T> a, const opmath_t<T>* __restrict__ row_loss,
                                            LossReduction reduction, T* __restrict__ out) {
  using A = opmath_t<T>;
  if (reduction == LossReduction::None) {
    for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < a.rows; r += int64_t(gridDim.x) * blockDim.x)
      out[r] = static_cast<T>(row_loss[r]);
    return;
  }
  __shared__ A scratch[kWarpSize];
  A total = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) total += row_loss[r];
  total = block_allreduce<SumOp<A>>(total, scratch);
  const A divisor = block_loss_divisor(a, reduction == LossReduction::Mean, scratch);
  if (threadIdx.x == 0) *out = static_cast<T>(total / divisor);
}

// The per-row loss gradient for Mean and Sum: one scalar, divided by the rows
// not ignored for Mean.
template <typename T>
__global__ void cross_entropy_grad_scale_kernel(CrossEntropyArgs<T> a, const T* __restrict__ grad_loss,
                                                LossReduction reduction, opmath_t<T>* __restrict__ scale) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const A divisor = block_loss_divisor(a, reduction == LossReduction::Mean, scratch);
  if (threadIdx.x == 0) *scale = static_cast<A>(*grad_loss) / divisor;
}

// `grad_loss`: per row (None) or null with `scale` holding the scalar;
// `grad_lse` may be null. `grad_input` may be the logits themselves (in
// place): each element is read, then written, by one thread.
template <typename T, int kVec>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_backward_kernel(CrossEntropyArgs<T> a, const T* __restrict__ grad_loss,
                                  const opmath_t<T>* __restrict__ scale, const opmath_t<T>* __restrict__ grad_lse,
                                  const opmath_t<T>* __restrict__ lse, T* grad_input) {
  using A = opmath_t<T>;
  const int64_t row = blockIdx.x;
  const int64_t t = a.target[row];
  const A g = t == a.ignore_index ? A(0) : grad_loss ? static_cast<A>(grad_loss[row]) : *scale;
  write_row_gradient<kVec>(a, a.logits + row * a.row_stride, grad_input + row * a.row_stride, t, g,
                           g + (grad_lse ? grad_lse[row] : A(0)), lse[row]);
}

}  // namespace fastreduce
