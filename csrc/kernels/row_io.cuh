// Row I/O shared by the row kernels (layer_norm, rms_norm, softmax,
// cross-entropy): which threads share a row, and how a row gets from global
// memory to them. Three ways:
// - in registers as the 16-byte packs it was read in (RowThreads,
//   load_packs): one warp per row (rows up to 1024), one block per row
//   (up to 512 threads of 4 packs: 8192 floats, 16384 bf16) or, on Hopper,
//   one cluster of blocks per row (up to 16 blocks of 8 packs a thread),
//   every load in flight before the first reduction;
// - staged in the warp's slice of shared memory with cp.async (short rows);
// - one block per row, cached in shared memory as the accumulator type when
//   it fits, streamed from global memory on each pass otherwise (Row).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "block_reduce.cuh"
#include "cluster_exchange.cuh"
#include "row_math.cuh"

namespace fastreduce {

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Element j of a pack in the accumulator type: bfloat16 from the 32-bit word
// it shares with its neighbour (a shift or a mask), not a 16-bit extract and
// a shift.
template <typename T, int N, typename A = opmath_t<T>>
__device__ __forceinline__ A element(const VecN<T, N>& pack, int j) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    uint32_t word;
    memcpy(&word, &pack.elem[j & ~1], sizeof(word));
    return __uint_as_float(j % 2 ? word & 0xffff0000u : word << 16);
  } else {
    return static_cast<A>(pack.elem[j]);
  }
}

// 16 bytes of two- or four-byte elements held as four 32-bit words, as the
// pipelined softmax holds two rows' shares: typed as packs of two-byte
// fields, each loaded word is split into its halves as soon as it lands,
// which makes every load of the next row wait (NOTES.md). Element j in the
// accumulator type, and kVec values rounded to T (as static_cast) as words.
template <typename T>
__device__ __forceinline__ float word_element(const uint4& words, int j) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "two- or four-byte elements");
  const uint32_t w[4] = {words.x, words.y, words.z, words.w};
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[j]);
  } else {
    const uint32_t word = w[j / 2];
    const bool high = j % 2;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(high ? word & 0xffff0000u : word << 16);
    } else {
      // The word as a half pair: the conversion reads its register half, no shift.
      __half2 pair;
      memcpy(&pair, &word, sizeof(word));
      return high ? __high2float(pair) : __low2float(pair);
    }
  }
}
// The element in a word's low bytes (RowShares' head and spare words).
template <typename T>
__device__ __forceinline__ float low_element(uint32_t word) {
  return word_element<T>(uint4{word, 0, 0, 0}, 0);
}
template <typename T>
__device__ __forceinline__ uint4 words_of(const float (&v)[16 / sizeof(T)]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (sizeof(T) == 4) {
      w[k] = __float_as_uint(v[k]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      memcpy(&w[k], &pair, sizeof(uint32_t));
    } else {
      const __half2 pair = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      memcpy(&w[k], &pair, sizeof(uint32_t));
    }
  }
  return {w[0], w[1], w[2], w[3]};
}

// Every element of a pack, as element().
template <typename T, int N, typename A = opmath_t<T>>
__device__ __forceinline__ void widen(const VecN<T, N>& pack, A (&out)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = element(pack, j);
}

// L2 priorities for kernels that read a row twice (cross-entropy's with-
// gradient kernel, norm_forward_reread_kernel): the first read asks L2 to
// keep the row (evict_last; the norms' only past 8192 wide), the second and
// the outputs' writes go first (streaming), so the second read finds the row
// in L2 while the other SMs stream theirs. Only 16-byte packs carry the hints.
__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t policy = 0;
#if __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

template <typename P>
__device__ __forceinline__ P load_keeping_in_l2(const P* p, uint64_t policy) {
#if __CUDA_ARCH__ >= 800
  if constexpr (sizeof(P) == 16) {
    uint4 v;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    P out;
    memcpy(&out, &v, sizeof(P));
    return out;
  }
#endif
  return *p;
}

// A store asking L2 to keep the line (the fused add's h, read back by the
// same block: norm_forward_reread_kernel).
template <typename P>
__device__ __forceinline__ void store_keeping_in_l2(P* p, const P& value, uint64_t policy) {
#if __CUDA_ARCH__ >= 800
  if constexpr (sizeof(P) == 16) {
    uint4 v;
    memcpy(&v, &value, sizeof(P));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                 :
                 : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
                 : "memory");
    return;
  }
#endif
  *p = value;
}

template <typename P>
__device__ __forceinline__ P load_streaming(const P* p) {
  if constexpr (sizeof(P) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    P out;
    memcpy(&out, &v, sizeof(P));
    return out;
  }
  return *p;
}

template <typename P>
__device__ __forceinline__ void store_streaming(P* p, const P& value) {
  if constexpr (sizeof(P) == 16) {
    uint4 v;
    memcpy(&v, &value, sizeof(P));
    __stcs(reinterpret_cast<uint4*>(p), v);
  } else {
    *p = value;
  }
}

// ---- Rows that are not whole 16-byte packs (odd widths), in buffers whose
// rows start equally far from a 16-byte boundary: each row is read as the
// same number of whole packs from its first 16-byte boundary on, and the
// fewer than 2 kVec elements around them (its head before that boundary,
// its tail after the packs) one each by the row's first threads. Odd
// vocabularies and hidden sizes (50257, 4095) are so not read one element
// at a time.

// Elements of the row starting at `row` before its first 16-byte boundary.
template <int kVec, typename T>
__device__ __forceinline__ int row_head(const T* row) {
  return kVec == 1 ? 0 : (kVec - static_cast<int>(reinterpret_cast<uintptr_t>(row) / sizeof(T) % kVec)) % kVec;
}

// Whole packs in every row of n >= kVec elements, whatever its head.
template <int kVec>
__host__ __device__ constexpr int64_t loose_row_packs(int64_t n) {
  return (n - kVec + 1) / kVec;
}

// The loose element that the row's thread `rank` holds, if `held`: the
// first ranks take the head's, the next ones the tail's.
struct LooseElement {
  int64_t index;
  bool held;
};
template <int kVec>
__device__ __forceinline__ LooseElement loose_element(int64_t rank, int head, int64_t packs, int64_t n) {
  return {rank < head ? rank : rank + packs * kVec, rank < n - packs * kVec};
}

// Where a thread's share of a row of n elements lies: `packs` whole packs
// from element `head` on, and its loose element. Without kLoose, the row is
// whole packs from its start (head 0, no loose elements).
template <int kVec, bool kLoose>
struct PackedRow {
  int head;
  int packs;
  LooseElement loose;
  template <typename T>
  __device__ PackedRow(const T* row, int n, int rank)
      : head(kLoose ? row_head<kVec>(row) : 0),
        packs(kLoose ? static_cast<int>(loose_row_packs<kVec>(n)) : n / kVec),
        loose(kLoose ? loose_element<kVec>(rank, head, packs, n) : LooseElement{0, false}) {}
  // The row's packs, from `row` (the row's first element) on.
  template <typename T>
  __device__ const VecN<T, kVec>* packs_of(const T* row) const {
    return reinterpret_cast<const VecN<T, kVec>*>(row + head);
  }
  template <typename T>
  __device__ VecN<T, kVec>* packs_of(T* row) const {
    return reinterpret_cast<VecN<T, kVec>*>(row + head);
  }
  // The loose element of `row` in the accumulator type, 0 where none is held.
  template <typename T, typename A = opmath_t<T>>
  __device__ A loose_of(const T* row) const {
    return kLoose && loose.held ? static_cast<A>(row[loose.index]) : A(0);
  }
  // Its bits in the low bytes of a word (word_element's element 0), 0 where
  // none is held: unconverted, so that nothing waits for the load where the
  // pipelined walks issue it (converted there, two-byte softmax (8192,
  // 50257) forward took 465 µs; 440 so, H200).
  template <typename T>
  __device__ uint32_t loose_bits_of(const T* row) const {
    using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
    return kLoose && loose.held ? reinterpret_cast<const Bits*>(row)[loose.index] : 0u;
  }
};

// ---- One block per row, the row staged in shared memory when it fits.

// A row, read from its shared-memory copy when there is one.
template <typename T, typename A>
struct Row {
  const T* global;
  const A* cache;
  __device__ __forceinline__ A operator[](int64_t i) const { return cache ? cache[i] : static_cast<A>(global[i]); }
};

// A block row's stage in shared memory: its n accumulators, shifted by up
// to 7 so that its 16-byte packs land on whole VecN<A, kVec>, in 32-byte
// aligned slots (launch_block_rows sizes them with this too).
__host__ __device__ constexpr int64_t stage_slot_bytes(int64_t n, int64_t acc_size) {
  return ((n + 8) * acc_size + 31) / 32 * 32;
}
template <typename A>
__device__ __forceinline__ A* stage_slot(int slot, int64_t n) {
  extern __shared__ __align__(32) unsigned char stage_bytes[];
  return reinterpret_cast<A*>(stage_bytes + slot * stage_slot_bytes(n, sizeof(A)));
}

// Copies row[0, n) into the stage `slot` (if not null) and returns the view
// of it. Ends with a barrier. The row is read in 16-byte packs from its
// first 16-byte boundary, the elements around them one each by the first
// threads (PackedRow's loose elements), wherever it starts: odd widths too.
template <typename T, typename A>
__device__ Row<T, A> stage_row(const T* row, int64_t n, A* slot) {
  if (slot == nullptr) {
    __syncthreads();
    return {row, nullptr};
  }
  constexpr int kVec = Vec16<T>::kSize;
  const int before_boundary = row_head<kVec>(row);
  const int head = before_boundary < n ? before_boundary : static_cast<int>(n);
  A* const cache = slot + (kVec - head) % kVec;
  const int64_t packs = (n - head) / kVec;
  const auto* in = reinterpret_cast<const Vec16<T>*>(row + head);
  auto* out = reinterpret_cast<VecN<A, kVec>*>(cache + head);
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const Vec16<T> p = in[i];
    VecN<A, kVec> converted;
#pragma unroll
    for (int k = 0; k < kVec; ++k) converted.elem[k] = static_cast<A>(p.elem[k]);
    out[i] = converted;
  }
  const LooseElement loose = loose_element<kVec>(threadIdx.x, head, packs, n);
  if (loose.held) cache[loose.index] = static_cast<A>(row[loose.index]);
  __syncthreads();
  return {row, cache};
}

// Slot `slot` of the block's dynamic shared memory, laid out as 16-byte
// aligned slots of n elements of E (the launchers size it the same way).
template <typename E>
__device__ __forceinline__ E* row_cache(int slot, int64_t n) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t stride = (n * sizeof(E) + 15) / 16 * 16;
  return reinterpret_cast<E*>(shared_bytes + slot * stride);
}

// The dynamic shared memory this launch was given, in bytes.
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

// Rows of up to 1024 elements run one warp each, eight warps per block.
constexpr int kWarpRowsPerBlock = 8;

// The calling warp's row, or -1 past the last row (the whole warp leaves).
__device__ __forceinline__ int64_t warp_row(int64_t rows) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  return row < rows ? row : -1;
}

// ---- Kernels with the row in registers as it was read: thread `rank` of
// the `count` that share a row holds packs rank, rank + count, ... of kVec
// elements of T (n a multiple of kVec), converted to A where used, and
// issues all of its loads of a row before the first reduction.

// Threads per row of the block-per-row register kernels at most: 4 packs
// each covers 8192 floats or 16384 bf16.
constexpr int kRowThreadsMax = 512;
// Rows of up to 32768 in one block of kWideRowThreads threads at 32
// elements each (kWideRowPacks<T> packs; 64 registers a thread at most), not
// a cluster of kRowThreadsMax-thread blocks, whose exchange cost the H100
// 4-8% there (norms.cu, softmax.cu).
constexpr int kWideRowThreads = 1024;
template <typename T>
constexpr int kWideRowPacks = 32 / Vec16<T>::kSize;

// A launch in clusters of blocks (sm_90) gives each cluster one row: the
// cluster's size and this block's place in it (1 and 0 without clusters).
__device__ __forceinline__ int cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
#else
  return 1;
#endif
}
__device__ __forceinline__ int cluster_block_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

// The threads that share a row: one warp (kWarpRows), the whole block, or
// every block of a cluster (block rows launched in clusters). In a cluster,
// every block makes the same exchanges, at least one (the first waits for
// the barrier that publishes the inboxes: cluster_exchange.cuh).
template <bool kWarpRows>
struct RowThreads {
  int64_t row;  // -1 past the last row (kernels that walk several rows set it)
  int rank, count;
  __device__ explicit RowThreads(int64_t rows)
      : row(kWarpRows ? warp_row(rows) : int64_t(blockIdx.x / cluster_blocks())),
        rank(kWarpRows ? threadIdx.x % kWarpSize : cluster_block_rank() * blockDim.x + threadIdx.x),
        count(kWarpRows ? kWarpSize : cluster_blocks() * blockDim.x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (in_cluster()) cluster::open_inboxes();
#endif
  }
  __device__ int group(int p) const { return p * count + rank; }
  // The p-th pack's place among the packs this block holds of the row (the
  // same as group(p) unless a cluster shares the row).
  __device__ int local(int p) const { return kWarpRows ? group(p) : p * int(blockDim.x) + int(threadIdx.x); }
  template <typename Op, typename A>
  __device__ A allreduce(A value) const {
    return allreduce<Op>(value, [] {});
  }
  // The same, calling during() while the value is in flight between the
  // blocks of a cluster (after the row's own reduction elsewhere): a walking
  // kernel's loads of its next row overlap the exchange so.
  template <typename Op, typename A, typename During>
  __device__ A allreduce(A value, During&& during) const {
    if constexpr (kWarpRows) {
      value = warp_allreduce<Op>(value);
    } else {
      __shared__ A scratch[kWarpSize];
      value = block_allreduce<Op>(value, scratch);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (in_cluster()) {
        // The cluster's registers, not count and rank over blockDim: walks
        // hide those from the compiler, which would divide them every row.
        const int blocks = cluster_blocks(), turn = exchanges_++;
        cluster::push(value, turn, blocks, cluster_block_rank());
        during();
        return cluster::combine<Op>(cluster::collect<A>(turn), blocks);
      }
#endif
    }
    during();
    return value;
  }

 private:
  __device__ bool in_cluster() const { return !kWarpRows && count != int(blockDim.x); }
  mutable int exchanges_ = 0;
};

// ---- Short rows (up to a 16-byte pack a lane, or a few): kLanes lanes a
// row, kWarpSize / kLanes rows a warp at a time, kShortRowSteps packs a lane
// loaded before the first reduction (norms and softmax, forward and
// backward). Blocks of kShortRowWarps warps: 1-2 µs ahead of eight for
// layer_norm's forward at 128-512 wide (bench/micro/head_rows.cu).
constexpr int kShortRowSteps = 4;
constexpr int kShortRowWarps = 4;
// A warp's rows at kPacks packs a lane: kShortRowSteps / kPacks a lane, one
// where kPacks > 2.
template <int kLanes, int kPacks = 1>
constexpr int kShortRowsPerWarp = (kWarpSize / kLanes) * (kPacks > 2 ? 1 : kShortRowSteps / kPacks);

// A lane's place among them: the warp's kRows rows are consecutive, taken
// kSegments at a time (step k's rows: row(k) for each segment of kLanes
// lanes), the lane's packs q at column(q) of its row.
template <int kLanes, int kPacks = 1>
struct ShortRowLane {
  static constexpr int kSegments = kWarpSize / kLanes;
  static constexpr int kRows = kShortRowsPerWarp<kLanes, kPacks>;
  static constexpr int kSteps = kRows / kSegments;
  int lane;
  int64_t warp_rows;  // the warp's first row
  __device__ ShortRowLane()
      : lane(threadIdx.x % kWarpSize),
        warp_rows((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kWarpSize * kRows) {}
  __device__ int column(int q = 0) const { return lane % kLanes + q * kLanes; }
  __device__ int64_t row(int k) const { return warp_rows + k * kSegments + lane / kLanes; }
};

template <bool kWarpRows>
constexpr int kRowThreadsBound = kWarpRows ? kWarpRowsPerBlock * kWarpSize : kRowThreadsMax;

// *pack if `in_row`, zeros otherwise; a 16-byte pack selected as whole
// 32-bit words: a select of its 16-bit fields puts each in a register of its
// own (a zeroing and a merge an element before its conversion).
template <typename Pack>
__device__ __forceinline__ Pack load_or_zero(const Pack* pack, bool in_row) {
  if constexpr (sizeof(Pack) == 16) {
    uint32_t words[4] = {};
    if (in_row) {
      const uint4 v = *reinterpret_cast<const uint4*>(pack);
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
    }
    Pack out;
    memcpy(&out, words, sizeof(Pack));
    return out;
  } else {
    return in_row ? *pack : Pack{};
  }
}

// packs[p] = the thread's p-th pack of `row` if it is one of the first
// `whole`, zeros otherwise: predicated loads in one straight line. kWords:
// selected as 32-bit words (load_or_zero), which the norm forwards of one
// row gain from and the walking ones lose to (NOTES.md). kFull: the row is
// exactly kPacks packs a thread, so no load is predicated.
template <bool kWords = false, bool kFull = false, bool kWarpRows, int kPacks, typename Pack>
__device__ __forceinline__ void load_packs(const RowThreads<kWarpRows>& threads, const Pack* row, int whole,
                                           Pack (&packs)[kPacks]) {
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const bool in_row = kFull || threads.group(p) < whole;
    if constexpr (kWords) packs[p] = load_or_zero(row + threads.group(p), in_row);
    else packs[p] = in_row ? row[threads.group(p)] : Pack{};
  }
}

// A thread's shares of one row of each of kInputs tensors: kPacks 16-byte
// packs of each, held as words (word_element), the bits of its loose
// element of each (PackedRow; 0 where it holds none), and the first word of
// the first tensor's packs (the shift of layer_norm's sums and softmax's
// exponentials), loaded with them so that the row's sums need not wait for
// it.
template <int kInputs, int kPacks>
struct RowShares {
  uint4 words[kInputs][kPacks];
  uint32_t spare[kInputs];  // PackedRow::loose_bits_of
  uint32_t head;
};

// The walk of the pipelined kernels (cluster k takes rows k, k + G, ... of
// `inputs`, rows of n elements of 16-byte packs `stride` elements apart,
// loose rows with kLoose):
// each thread holds its shares of a row (RowShares), and step(row, shares,
// fetch_next) computes and writes that row, calling fetch_next while its
// sums are in flight between the blocks. The first call loads the following
// row's shares beside the current ones; later calls (a second exchange) do
// nothing.
template <int kPacks, bool kLoose = false, typename T, int kInputs, typename Step>
__device__ __forceinline__ void walk_pipelined(RowThreads<false>& threads, int64_t rows, int64_t n, int64_t stride,
                                               const T* const (&inputs)[kInputs], Step&& step) {
  using Shares = RowShares<kInputs, kPacks>;
  const auto load = [&](int64_t row, Shares& shares) {
    const PackedRow<16 / sizeof(T), kLoose> layout(inputs[0] + row * stride, static_cast<int>(n), threads.rank);
#pragma unroll
    for (int i = 0; i < kInputs; ++i) {
      const T* const input = inputs[i] + row * stride;
      load_packs(threads, reinterpret_cast<const uint4*>(layout.packs_of(input)), layout.packs, shares.words[i]);
      shares.spare[i] = layout.loose_bits_of(input);
    }
    shares.head = *reinterpret_cast<const uint32_t*>(layout.packs_of(inputs[0] + row * stride));
  };
  const int64_t row_groups = gridDim.x / cluster_blocks();
  Shares shares, next;
  load(threads.row, shares);
  for (;;) {
    // Addresses recomputed each row: hoisted out of the loop they would hold
    // a register pair per pack.
    asm volatile("" : "+r"(threads.rank), "+r"(threads.count));
    const int64_t row = threads.row, following = row + row_groups;
    bool fetched = false;
    step(row, static_cast<const Shares&>(shares), [&] {
      if (fetched) return;
      fetched = true;
      if (following < rows) load(following, next);
    });
    if (following >= rows) break;
    threads.row = following;
    shares = next;
  }
}

// The sum of exp2(scale2 * x - shift) over a thread's share of a walked
// row: its packs among the row's `groups` (RowShares' words) and its loose
// element `spare` where it holds one (the pipelined softmax's and
// cross-entropy's exponentials against the row's first value).
template <typename T, int kPacks>
__device__ __forceinline__ float shifted_exp_sum(const RowThreads<false>& threads, const uint4 (&packs)[kPacks],
                                                 int groups, bool loose, float spare, float scale2, float shift) {
  float sum = 0;
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (threads.group(p) < groups)
#pragma unroll
      for (int j = 0; j < 16 / int(sizeof(T)); ++j) sum += exp2_acc(scale2 * word_element<T>(packs[p], j) - shift);
  if (loose) sum += exp2_acc(scale2 * spare - shift);
  return sum;
}

// load_packs for a row of which only the first `valid` elements are read
// (causal rows): the one pack that `valid` cuts is read element-wise after.
template <bool kWarpRows, int kPacks, typename T, int kVec>
__device__ __forceinline__ void load_valid_packs(const RowThreads<kWarpRows>& threads, const T* row, int valid,
                                                 VecN<T, kVec> (&packs)[kPacks]) {
  load_packs(threads, reinterpret_cast<const VecN<T, kVec>*>(row), valid / kVec, packs);
  if (valid % kVec == 0) return;
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (threads.group(p) == valid / kVec)
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (threads.group(p) * kVec + j < valid) packs[p].elem[j] = row[threads.group(p) * kVec + j];
}

// ---- Forward kernels for short rows: one warp per row, the row staged in
// the warp's slice of shared memory with cp.async. No registers are held
// while the loads are in flight, so occupancy is set by shared memory (48-64
// warps per SM) instead of by a row in registers (16-24): three times the
// bytes in flight.
// Loops go over groups of kVec elements: 16-byte packs when every row of
// every buffer is 16-byte aligned and n a multiple of the pack, else 1.

// 16 bytes from global to shared memory without a register on the way: past
// L1 (.cg), or through it (kThroughL1, .ca) for data every block reads
// (parameters), which past L1 would send all of them to the same few L2 lines.
template <bool kThroughL1 = false>
__device__ __forceinline__ void copy16_async(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (kThroughL1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
#else
  *static_cast<uint4*>(shared) = *static_cast<const uint4*>(global);
#endif
}

__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// The copies issued since the last commit become one group; waiting for all
// but the newest kPending groups lets a later group (the next row's) fly on.
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait_async_copies_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// A thread's packs of two rows (those of its groups below `whole`: x's and
// dy's in the backwards) copied into its own slots (slot local(p)) of
// `stage_x` and `stage_dy`, and read back once they landed (after
// wait_async_copies): a kernel walking rows stages the next row while it
// writes this one. Each thread reads back only what it copied, so no barrier.
template <int kPacks, bool kWarpRows, typename Pack>
__device__ __forceinline__ void stage_packs(const RowThreads<kWarpRows>& threads, int whole, const Pack* x,
                                            Pack* stage_x, const Pack* dy, Pack* stage_dy) {
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (threads.group(p) >= whole) continue;
    copy16_async(&stage_x[threads.local(p)], &x[threads.group(p)]);
    copy16_async(&stage_dy[threads.local(p)], &dy[threads.group(p)]);
  }
}
template <bool kWarpRows, int kPacks, typename Pack>
__device__ __forceinline__ void load_staged_packs(const RowThreads<kWarpRows>& threads, const Pack* stage, int whole,
                                                  Pack (&packs)[kPacks]) {
#pragma unroll
  for (int p = 0; p < kPacks; ++p) packs[p] = threads.group(p) < whole ? stage[threads.local(p)] : Pack{};
}

// Copies row[0, count) into the warp's `stage` and returns once every lane's
// copies have landed: whole packs asynchronously, the rest element-wise.
template <int kVec, typename T>
__device__ __forceinline__ void stage_warp_row(T* stage, const T* row, int count) {
  const int lane = threadIdx.x % kWarpSize;
  int done = 0;
  if constexpr (kVec > 1) {
    done = count / kVec * kVec;
    for (int i = lane * kVec; i < done; i += kWarpSize * kVec) copy16_async(stage + i, row + i);
  }
  for (int i = done + lane; i < count; i += kWarpSize) stage[i] = row[i];
  wait_async_copies();
  __syncwarp();
}

// f(stage[i]) for the lane's elements i < count (count <= the row length):
// whole groups without per-element checks, then the one partial group of a
// causal row. Offsets within a row are int: short rows only.
template <int kVec, typename A, typename T, typename F>
__device__ __forceinline__ void for_each_staged(const T* stage, int count, F&& f) {
  const int lane = threadIdx.x % kWarpSize;
  const int groups = count / kVec;
  for (int g = lane; g < groups; g += kWarpSize) {
    const VecN<T, kVec> pack = reinterpret_cast<const VecN<T, kVec>*>(stage)[g];
#pragma unroll
    for (int j = 0; j < kVec; ++j) f(static_cast<A>(pack.elem[j]));
  }
  if (lane == groups % kWarpSize)
    for (int i = groups * kVec; i < count; ++i) f(static_cast<A>(stage[i]));
}

// out[i .. i + kVec) = f(i, v) for the lane's groups of [0, n), where v holds
// stage[i .. i + kVec) and f rewrites it in place. Stores are kVec wide.
template <int kVec, typename A, typename T, typename F>
__device__ __forceinline__ void map_staged(const T* stage, T* out, int n, F&& f) {
  for (int first = (threadIdx.x % kWarpSize) * kVec; first < n; first += kWarpSize * kVec) {
    const VecN<T, kVec> pack = *reinterpret_cast<const VecN<T, kVec>*>(stage + first);
    A v[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = static_cast<A>(pack.elem[j]);
    f(first, v);
    VecN<T, kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) result.elem[j] = static_cast<T>(v[j]);
    *reinterpret_cast<VecN<T, kVec>*>(out + first) = result;
  }
}

// kVec parameters from `params` (aligned as a pack of the rows' kVec
// elements), in loads of up to 16 bytes: float32 parameters beside a
// two-byte row's 16-byte pack take two.
template <int kVec, typename P>
__device__ __forceinline__ VecN<P, kVec> load_param_pack(const P* params) {
  using Piece = VecN<P, (sizeof(P) * kVec > 16 ? 16 / sizeof(P) : kVec)>;
  constexpr int kPieces = kVec / Piece::kSize;
  VecN<P, kVec> pack;
#pragma unroll
  for (int k = 0; k < kPieces; ++k)
    reinterpret_cast<Piece*>(pack.elem)[k] = reinterpret_cast<const Piece*>(params)[k];
  return pack;
}

// Words [kFirst, kFirst + kLeft) from `base` (16-byte aligned) into w, in
// the widest aligned loads that touch no other word.
template <int kFirst, int kLeft>
__device__ __forceinline__ void load_words(const uint32_t* base, uint32_t* w) {
  if constexpr (kLeft > 0) {
    if constexpr (kFirst % 4 == 0 && kLeft >= 4) {
      const uint4 b = __ldg(reinterpret_cast<const uint4*>(base + kFirst));
      w[0] = b.x, w[1] = b.y, w[2] = b.z, w[3] = b.w;
      load_words<kFirst + 4, kLeft - 4>(base, w + 4);
    } else if constexpr (kFirst % 2 == 0 && kLeft >= 2) {
      const uint2 b = __ldg(reinterpret_cast<const uint2*>(base + kFirst));
      w[0] = b.x, w[1] = b.y;
      load_words<kFirst + 2, kLeft - 2>(base, w + 2);
    } else {
      w[0] = __ldg(base + kFirst);
      load_words<kFirst + 1, kLeft - 1>(base, w + 1);
    }
  }
}

// The 16-byte blocks that kCount parameters starting `shift` bytes into
// `blocks` touch (0 <= shift < 16, kWords = shift / 4), read-only, as
// words; take(out) the parameters' words, taken kWords along and shifted
// by the rest; pack_of(out) the parameters. Of the block past the last only
// the parameters' own bytes are read: whole, it would reach past the end of
// a parameter row that ends off a 16-byte boundary. A row's packs are whole
// packs apart, so every pack a block reads of a parameter row has the same
// shift (ShiftedParams).
template <typename P, int kCount, int kWords>
struct ShiftedWords {
  static constexpr int kBlocks = kCount * sizeof(P) / 16;
  static_assert(kBlocks * 16 == kCount * sizeof(P), "whole 16-byte packs");
  static constexpr int kOut = 4 * kBlocks;
  uint32_t w[kOut + 4]{};
  int bits;
  __device__ ShiftedWords(const uint4* blocks, int shift) : bits(8 * (shift % 4)) {
#pragma unroll
    for (int k = 0; k < kBlocks; ++k) {
      const uint4 b = __ldg(blocks + k);
      w[4 * k] = b.x, w[4 * k + 1] = b.y, w[4 * k + 2] = b.z, w[4 * k + 3] = b.w;
    }
    const uint32_t* const last = reinterpret_cast<const uint32_t*>(blocks + kBlocks);
    load_words<0, kWords>(last, w + kOut);
    // Two-byte parameters half a word off: the half word that ends them.
    if (sizeof(P) == 2 && bits != 0)
      w[kOut + kWords] = __ldg(reinterpret_cast<const unsigned short*>(last + kWords));
  }
  // As words: where a branch picks kWords, its paths merge 32-bit words,
  // not the 16-bit fields of a two-byte pack (a byte permute each).
  __device__ void take(uint32_t (&out)[kOut]) const {
#pragma unroll
    for (int k = 0; k < kOut; ++k) out[k] = __funnelshift_r(w[k + kWords], w[k + kWords + 1], bits);
  }
  static __device__ VecN<P, kCount> pack_of(const uint32_t (&out)[kOut]) {
    VecN<P, kCount> pack;
    memcpy(&pack, out, sizeof(pack));
    return pack;
  }
};

// kCount parameters starting kWords words (shift bytes) into the 16-byte
// `blocks`. float32 parameters of a float32 row's pack (one block) lie whole
// words off, so only their own words are read: layer_norm's two blocks each
// of weight and bias held 64 registers and cost 3-7% (H200, float32 (8192,
// 4095) 71.0 -> 68.1 µs, (16384, 1601) 60.0 -> 55.6; NOTES). Beside a
// two-byte row's pack (two blocks) reading only the words was 1-3% slower,
// and two-byte parameters may lie half a word off: those take the blocks.
template <typename P, int kCount, int kWords>
__device__ __forceinline__ VecN<P, kCount> shifted_pack(const uint4* blocks, int shift) {
  using Words = ShiftedWords<P, kCount, kWords>;
  uint32_t out[Words::kOut];
  if constexpr (sizeof(P) == 4 && Words::kBlocks == 1) {
    load_words<kWords, Words::kOut>(reinterpret_cast<const uint32_t*>(blocks), out);
  } else {
    Words(blocks, shift).take(out);
  }
  return Words::pack_of(out);
}

// Calls f(std::integral_constant<int, shift / 4>) (shift in bytes, below
// 16): a branch, taken the same way by every thread of a block where the
// shift is the block's; selects or an index by a variable cost more.
template <typename F>
__device__ __forceinline__ void with_word_shift(int shift, F&& f) {
  const int words = shift / 4;
  if (words == 0) f(std::integral_constant<int, 0>{});
  else if (words == 1) f(std::integral_constant<int, 1>{});
  else if (words == 2) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 3>{});
}

// kCount parameters from `from` on, wherever it lies (load_param_pack's
// unaligned sibling: a loose row's packs start at any column). One element
// load each cost 16 times a pack's L1 wavefronts (a warp's loads 16 bytes
// apart) and the instructions: layer_norm's forward ran 1.4x its aligned
// width's (NOTES).
template <typename P, int kCount>
__device__ __forceinline__ VecN<P, kCount> load_shifted(const P* from) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(from);
  const int shift = static_cast<int>(address & 15);
  VecN<P, kCount> pack;
  with_word_shift(shift, [&](auto along) {
    pack = shifted_pack<P, kCount, decltype(along)::value>(reinterpret_cast<const uint4*>(address & ~uintptr_t(15)),
                                                          shift);
  });
  return pack;
}

// A parameter row read at a loose row's packs (columns head + kVec * g):
// the blocks of its first pack and their shift, the same for every pack, so
// the branch on the shift is taken once a row, not once a pack.
struct ShiftedParams {
  const uint4* blocks;
  int shift;
  template <typename P>
  __device__ ShiftedParams(const P* params, int head) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(params) + head * sizeof(P);  // params may be null
    blocks = reinterpret_cast<const uint4*>(address & ~uintptr_t(15));
    shift = static_cast<int>(address & 15);
  }
  // The pack at group g (kCount parameters kCount * g on).
  template <typename P, int kCount, int kWords>
  __device__ VecN<P, kCount> at(int g) const {
    return shifted_pack<P, kCount, kWords>(blocks + int64_t(g) * ShiftedWords<P, kCount, kWords>::kBlocks, shift);
  }
};

// Calls write(weight_at, bias_at), each giving the kVec parameters of a
// loose row's pack group g (columns head + kVec * g on, ShiftedParams): one
// branch on the shift a row where weight and bias agree in whole words
// (parameters of one 16-byte aligned allocation always do), else one a pack
// and parameter. `weighted` and `biased` say which the caller reads.
template <typename P, int kVec, typename Write>
__device__ __forceinline__ void with_loose_params(const P* weight, const P* bias, int head, bool weighted,
                                                  bool biased, Write&& write) {
  const ShiftedParams weights(weight, head), biases(bias, head);
  if (!weighted || !biased || weights.shift / 4 == biases.shift / 4) {
    with_word_shift(weighted ? weights.shift : biases.shift, [&](auto words) {
      constexpr int kWords = decltype(words)::value;
      write([&](int g) { return weights.at<P, kVec, kWords>(g); },
            [&](int g) { return biases.at<P, kVec, kWords>(g); });
    });
  } else {
    write([&](int g) { return load_shifted<P, kVec>(weight + head + g * kVec); },
          [&](int g) { return load_shifted<P, kVec>(bias + head + g * kVec); });
  }
}

// v[j] = op(v[j], params[first + j]) for a group, read as kVec-wide loads.
template <int kVec, typename A, typename P, typename Op>
__device__ __forceinline__ void apply_params(const P* params, int64_t first, A (&v)[kVec], Op op) {
  const VecN<P, kVec> pack = load_param_pack<kVec>(params + first);
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = op(v[j], static_cast<A>(pack.elem[j]));
}

// Eight blocks of eight warps per SM (32 registers): 64 warps, so up to
// 132 * 64 rows are in flight at once and (8192, 768) runs as one wave rather
// than 1.3 (40 registers: 48 warps per SM). Double would spill at 32.
template <typename T>
constexpr int kStagedMinBlocks = sizeof(T) <= 4 ? 8 : 4;

}  // namespace fastreduce
