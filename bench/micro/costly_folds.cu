// The costly folds (var_mean, logsumexp, argmax; reduce_kernels.cuh) beside
// sum and aminmax: full reductions (the split-rows kernel) at 1 to 4 blocks
// an SM, as many as are resident, and unsplit rows (the rows kernel) at 8 to
// 128 vectors a thread, a block a row or a team of lanes (a warp, 16, 8 or
// 4; reduce_plan.cuh's kRowVecs). Prints µs and GB/s of the input, two
// rounds; `full`: the full reductions only; `bytes`: sums and 2-norms of
// 64 MiB as bfloat16 and float32, their rounds as trees too.
// bash bench/micro/run.sh costly_folds
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "../../csrc/kernels/selection_ops.h"
#include "../../csrc/kernels/statistic_ops.h"
#include "../../csrc/launch/reduce_plan.cuh"
#include "probe.cuh"

using namespace fastreduce;
using namespace fastreduce::reduce_plan;
using bf16 = __nv_bfloat16;

struct Rows {
  Timer& timer;
  const char* dtype;
  int64_t rows, len;
  size_t elem;
  const void* x;
  void* out;
};

template <typename Sink>
Sink sink_of(const Rows& r) {
  if constexpr (std::is_pointer_v<Sink>) {
    return static_cast<Sink>(r.out);
  } else {
    using Out = decltype(Sink::first);
    return Sink{static_cast<Out>(r.out), static_cast<Out>(r.out) + r.rows};
  }
}

// Rows of `threads` a block (kTeam 0) or of a team of kTeam lanes.
template <typename Op, typename In, typename Sink, int kTeam>
void time_rows(const Rows& r, const char* name, const Op& op, int threads) {
  const auto kernel = reduce_rows_kernel<Op, In, Sink, kTeam>;
  const int block = kTeam == 0 ? threads : kRowThreads;
  const int64_t grid = kTeam == 0 ? r.rows : ceil_div(r.rows, int64_t(kRowThreads / kTeam));
  const Sink sink = sink_of<Sink>(r);
  const float us = r.timer.median_us([&] {
    CHECK((launch_kernel(kernel, grid, block, 0, nullptr, After::Stream, static_cast<const In*>(r.x), r.rows, r.len,
                         sink, op)));
  });
  const int vecs = int(r.len / (16 / r.elem) / (kTeam == 0 ? threads : kTeam));
  const double gbs = double(r.rows) * r.len * r.elem / (us * 1e3);
  std::printf("| %s | %s | (%lld, %lld) | %d | %s %d | %d | %.2f | %.0f |\n", name, r.dtype, (long long)r.rows,
              (long long)r.len, vecs, kTeam == 0 ? "block of" : "team of", kTeam == 0 ? threads : kTeam,
              registers(kernel), us, gbs);
}

// float32 var_mean rows in reduce_moment_rows_kernel's blocks (512 threads,
// three an SM), as the plan runs rows of 512 threads or more.
void moment_rows(const Rows& r) {
  using Op = VarOp<float>;
  const auto kernel = reduce_moment_rows_kernel<Op, float, PairSink<float>>;
  const PairSink<float> sink = sink_of<PairSink<float>>(r);
  const Op op = Op::make({}, r.len);
  const float us = r.timer.median_us([&] {
    CHECK((launch_kernel(kernel, r.rows, kMomentRowThreads, 0, nullptr, After::Stream, static_cast<const float*>(r.x),
                         r.rows, r.len, sink, op)));
  });
  std::printf("| var_mean | %s | (%lld, %lld) | %d | moment rows of %d | %d | %.2f | %.0f |\n", r.dtype,
              (long long)r.rows, (long long)r.len, int(r.len / 4 / kMomentRowThreads), kMomentRowThreads,
              registers(kernel), us, double(r.rows) * r.len * r.elem / (us * 1e3));
}

// The op at 4 to 128 vectors a thread (teams of at least 4 lanes).
template <typename Op, typename In, typename Sink>
void op_rows(const Rows& r, const char* name, const Op& op, int most = 128) {
  const int64_t vecs = r.len / (16 / r.elem);
  for (int per_thread = 4; per_thread <= most; per_thread *= 2) {
    const int64_t threads = vecs / per_thread;
    if (threads > kRowThreads || threads < 4) continue;
    if (threads >= 64) time_rows<Op, In, Sink, 0>(r, name, op, int(threads));
    else if (threads == 32) time_rows<Op, In, Sink, 32>(r, name, op, 32);
    else if (threads == 16) time_rows<Op, In, Sink, 16>(r, name, op, 16);
    else if (threads == 8) time_rows<Op, In, Sink, 8>(r, name, op, 8);
    else if (threads == 4) time_rows<Op, In, Sink, 4>(r, name, op, 4);
  }
}

// A full reduction (reduce_split_rows_kernel: one row over a grid of
// kAllThreads-thread blocks, the last to finish folding their partials) at
// 1 to 4 blocks an SM, as many as are resident.
template <typename Op, typename In, typename Sink>
void time_full(const Rows& r, const char* name, const Op& op) {
  using Acc = typename Op::acc_t;
  int sm_count;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const auto kernel = reduce_split_rows_kernel<Op, In, Sink>;
  const int resident = std::min(std::max(resident_blocks(kernel, kAllThreads), 1), 4);
  Acc* partials;
  unsigned int* arrivals;
  CHECK(cudaMalloc(&partials, sizeof(Acc) * sm_count * resident));
  CHECK(cudaMalloc(&arrivals, sizeof(unsigned int)));
  CHECK(cudaMemset(arrivals, 0, sizeof(unsigned int)));
  const Sink sink = sink_of<Sink>(r);
  for (int per_sm = 1; per_sm <= resident; ++per_sm) {
    const int blocks = per_sm * sm_count;
    const float us = r.timer.median_us([&] {
      CHECK((launch_kernel(kernel, dim3(blocks), kAllThreads, 0, nullptr, After::Stream, static_cast<const In*>(r.x),
                           r.len, partials, arrivals, sink, op)));
    });
    const int vecs = int(r.len / (16 / r.elem) / (int64_t(blocks) * kAllThreads));
    std::printf("| %s | %s | (%lld,) | %d | %d blocks of %d | %d | %.2f | %.0f |\n", name, r.dtype, (long long)r.len,
                vecs, blocks, kAllThreads, registers(kernel), us, double(r.len) * r.elem / (us * 1e3));
  }
  CHECK(cudaFree(arrivals));
  CHECK(cudaFree(partials));
}

template <typename In>
void whole(Timer& timer, const char* dtype, int64_t len) {
  In* x;
  void* out;
  CHECK(cudaMalloc(&x, len * sizeof(In)));
  CHECK(cudaMalloc(&out, 2 * sizeof(double)));
  fill_uniform<<<1024, 256>>>(x, len, 7, -2.0f, 4.0f);
  const Rows r{timer, dtype, 1, len, sizeof(In), x, out};
  const ReduceParams params{};
  using V = SelectValue<In>;
  for (int round = 0; round < 2; ++round) {
    time_full<SumOp<float>, In, float*>(r, "sum", {});
    time_full<VarOp<float>, In, PairSink<In>>(r, "var_mean", VarOp<float>::make(params, len));
    time_full<LogSumExpOp<float>, In, In*>(r, "logsumexp", LogSumExpOp<float>::make(params, len));
    time_full<MinMaxOp<V>, In, PairSink<In>>(r, "aminmax", {});
    time_full<ArgExtremumOp<V, true>, In, int64_t*>(r, "argmax", {});
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(x));
}

// A sum and a 2-norm whose rounds add as a tree for every input type (SumOp
// and MeanOp take one for float32 only).
template <typename Base>
struct InTree : Base {
  template <typename In, int N>
  FR_HOST_DEVICE float fold_tree(float acc, const In (&round)[N], int64_t index) const {
    float part[N];
    for (int k = 0; k < N; ++k) part[k] = Base::fold(0.0f, round[k], index + k);
    for (int width = N / 2; width > 0; width /= 2)
      for (int k = 0; k < width; ++k) part[k] += part[k + width];
    return acc + part[0];
  }
};
using Norm2 = NormOp<float, NormOrder::Two>;

// 64 MiB as 2^25 bfloat16 and as 2^24 float32: sums and 2-norms, their
// rounds folded as the ops do and as trees, whole and in rows of 8192.
template <typename In>
void bytes(Timer& timer, const char* dtype, int64_t len) {
  In* x;
  void* out;
  CHECK(cudaMalloc(&x, len * sizeof(In)));
  CHECK(cudaMalloc(&out, 2 * sizeof(double) * (len / 8192)));
  fill_uniform<<<1024, 256>>>(x, len, 7, -2.0f, 4.0f);
  const Rows whole_row{timer, dtype, 1, len, sizeof(In), x, out};
  const Rows rows{timer, dtype, len / 8192, 8192, sizeof(In), x, out};
  for (int round = 0; round < 2; ++round) {
    time_full<SumOp<float>, In, float*>(whole_row, "sum", {});
    time_full<InTree<SumOp<float>>, In, float*>(whole_row, "sum (tree)", {});
    time_full<Norm2, In, float*>(whole_row, "norm", {});
    time_full<InTree<Norm2>, In, float*>(whole_row, "norm (tree)", {});
    time_rows<SumOp<float>, In, float*, 0>(rows, "sum", {}, 256);
    time_rows<InTree<SumOp<float>>, In, float*, 0>(rows, "sum (tree)", {}, 256);
    time_rows<Norm2, In, float*, 0>(rows, "norm", {}, 256);
    time_rows<InTree<Norm2>, In, float*, 0>(rows, "norm (tree)", {}, 256);
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(x));
}

template <typename In>
void shape(Timer& timer, const char* dtype, int64_t rows, int64_t len) {
  In* x;
  void* out;
  CHECK(cudaMalloc(&x, rows * len * sizeof(In)));
  CHECK(cudaMalloc(&out, 2 * rows * sizeof(double)));
  fill_uniform<<<1024, 256>>>(x, rows * len, 7, -2.0f, 4.0f);
  const Rows r{timer, dtype, rows, len, sizeof(In), x, out};
  const ReduceParams params{};
  using V = SelectValue<In>;
  for (int round = 0; round < 2; ++round) {
    if constexpr (!std::numeric_limits<In>::is_integer) {
      op_rows<SumOp<float>, In, float*>(r, "sum", {}, 8);
      op_rows<VarOp<float>, In, PairSink<In>>(r, "var_mean", VarOp<float>::make(params, len));
      op_rows<LogSumExpOp<float>, In, In*>(r, "logsumexp", LogSumExpOp<float>::make(params, len));
    }
    op_rows<ArgExtremumOp<V, true>, In, int64_t*>(r, "argmax", {});
    if constexpr (std::is_same_v<In, float>)
      if (len >= 4 * kMomentRowThreads) moment_rows(r);
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(x));
}

int main(int argc, char** argv) {
  Timer timer;
  std::printf(
      "| op | dtype | shape | vectors a thread | threads a row | registers | µs | GB/s |\n"
      "|---|---|---|---|---|---|---|---|\n");
  const std::string section = argc > 1 ? argv[1] : "";
  if (section.empty() || section == "full") {
    whole<bf16>(timer, "bfloat16", 1 << 25);
    whole<float>(timer, "float32", 1 << 25);
    whole<bf16>(timer, "bfloat16", 1 << 27);
  }
  if (section == "full") return 0;
  if (section == "bytes") {
    bytes<bf16>(timer, "bfloat16", 1 << 25);
    bytes<float>(timer, "float32", 1 << 24);
    return 0;
  }
  if (section == "float") {
    shape<float>(timer, "float32", 2048, 32768);
    shape<float>(timer, "float32", 1024, 32768);
    shape<float>(timer, "float32", 4096, 16384);
    shape<float>(timer, "float32", 8192, 8192);
    shape<float>(timer, "float32", 16384, 4096);
    shape<float>(timer, "float32", 32768, 2048);
    shape<float>(timer, "float32", 65536, 1024);
    shape<float>(timer, "float32", 131072, 512);
    shape<float>(timer, "float32", 262144, 256);
    return 0;
  }
  if (section == "short") {
    shape<bf16>(timer, "bfloat16", 65536, 1024);
    shape<bf16>(timer, "bfloat16", 131072, 512);
    shape<float>(timer, "float32", 65536, 1024);
    shape<float>(timer, "float32", 131072, 512);
    return 0;
  }
  shape<bf16>(timer, "bfloat16", 8192, 8192);
  shape<bf16>(timer, "bfloat16", 2048, 32768);
  shape<bf16>(timer, "bfloat16", 1024, 32768);
  shape<bf16>(timer, "bfloat16", 528, 65536);
  shape<bf16>(timer, "bfloat16", 32768, 2048);
  shape<bf16>(timer, "bfloat16", 16384, 4096);
  shape<bf16>(timer, "bfloat16", 4096, 16384);
  shape<bf16>(timer, "bfloat16", 65536, 2048);
  shape<float>(timer, "float32", 8192, 8192);
  shape<float>(timer, "float32", 32768, 2048);
  shape<float>(timer, "float32", 2048, 32768);
  shape<float>(timer, "float32", 1024, 32768);
  shape<float>(timer, "float32", 16384, 4096);
  shape<__half>(timer, "float16", 8192, 8192);
  shape<int16_t>(timer, "int16", 8192, 8192);
  shape<int32_t>(timer, "int32", 8192, 8192);
}
