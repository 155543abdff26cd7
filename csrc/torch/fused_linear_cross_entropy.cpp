// fused_linear_cross_entropy: the cross-entropy of hidden @ weight.T + bias
// without the (tokens, vocab) logits. Rows go through in chunks whose logits
// fit a budget: each chunk's logits come from ATen's matmul (cuBLAS on
// CUDA), and, when gradients are wanted, one pass of fastreduce's
// cross-entropy gives the chunk's row losses and writes their gradient over
// the logits, which goes straight into grad_hidden and grad_weight by
// matmul. Device-generic: every step is a dispatcher op or a cross-entropy
// helper that picks the device. Without a bias the bias gradient is an empty
// tensor (schemas return no optional tensors).
#include <tuple>

#include <c10/util/SmallVector.h>

#include "../kernels/ceil_div.h"
#include "common.h"
#include "dispatch.h"

namespace fastreduce {
namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";
// A chunk's logits, their gradient written over them, are the op's extra
// memory: a quarter of the float32 logits it replaces (two chunks of bf16
// logits), within [32 MiB, 512 MiB] (soft-capping adds its temporaries).
// Each chunk after the first reads and rewrites all of grad_weight (its
// addmm), and fewer rows make slower GEMMs, so fewer chunks are faster (H200,
// bf16, 1792 tokens, hidden 1024, vocabulary 51872: a step in 1 / 2 / 4
// chunks 872 / 966 / 1138 µs). Rows are spread evenly over the chunks: no
// short last chunk paying a whole pass over grad_weight.
constexpr int64_t kMinChunkBytes = int64_t{1} << 25;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 29;
// cuBLAS runs a GEMM whose rows are an odd number of elements apart, or
// whose output rows are an odd number of elements long, on kernels several
// times slower (GPT-2's vocabulary of 50257, BART's 50265; H200, bf16,
// hidden 1024, (4096, 50265): linear + cross-entropy forward and backward
// 11.4 ms in torch, 2.6 ms at 50304). A chunk's logit rows start a multiple
// of kRowPitch classes apart, and every GEMM over the classes takes them in
// multiples of kGemmClasses, then the few left (class_parts).
constexpr int64_t kRowPitch = 64;
constexpr int64_t kGemmClasses = 8;

// A range of classes one GEMM covers; `onto`: its rows add onto the part
// before (the gradient's GEMMs).
struct ClassPart {
  int64_t first, count;
  bool onto;
};

// The few classes past the last multiple of kGemmClasses first: the larger
// part then adds to them inside its GEMM (one rounding). Empty parts left out.
c10::SmallVector<ClassPart, 2> class_parts(int64_t classes) {
  const int64_t whole = classes / kGemmClasses * kGemmClasses;
  c10::SmallVector<ClassPart, 2> parts;
  if (whole < classes) parts.push_back({whole, classes - whole, false});
  if (whole > 0) parts.push_back({0, whole, whole < classes});
  return parts;
}

struct Problem {
  int64_t rows, chunk;
  bool sum;  // reduction sum (mean divides by the kept rows; none keeps each row)
  bool none;
};

Problem check(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
              const std::optional<at::Tensor>& bias, c10::string_view reduction, double label_smoothing,
              std::optional<double> softcap) {
  const auto type = hidden.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16, kOp,
              ": unsupported dtype ", to_text(type), " for argument 'hidden'; expected a floating dtype");
  TORCH_CHECK(hidden.dim() == 2, kOp, ": argument 'hidden' must be (N, H), got shape ", to_text(hidden.sizes()));
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1), kOp,
              ": argument 'weight' must be (V, H) with H = ", to_text(hidden.size(1)), ", got shape ",
              to_text(weight.sizes()));
  TORCH_CHECK(weight.scalar_type() == type, kOp, ": argument 'weight' is ", to_text(weight.scalar_type()),
              " but 'hidden' is ", to_text(type), " (as F.linear, both must match)");
  TORCH_CHECK(target.scalar_type() == at::kLong, kOp, ": argument 'target' must hold int64 class indices, got ",
              to_text(target.scalar_type()));
  TORCH_CHECK(target.dim() == 1 && target.size(0) == hidden.size(0), kOp, ": argument 'target' must have shape (",
              to_text(hidden.size(0)), ",), got ", to_text(target.sizes()));
  check_same_device(weight, hidden, kOp, "weight", "hidden");
  check_same_device(target, hidden, kOp, "target", "hidden");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), kOp, ": argument 'bias' must have shape (",
                to_text(weight.size(0)), ",), got ", to_text(bias->sizes()));
    TORCH_CHECK(bias->scalar_type() == type, kOp, ": argument 'bias' is ", to_text(bias->scalar_type()),
                " but 'hidden' is ", to_text(type));
    check_same_device(*bias, hidden, kOp, "bias", "hidden");
  }
  TORCH_CHECK(reduction == "none" || reduction == "mean" || reduction == "sum", kOp, ": argument 'reduction' is '",
              std::string(reduction), "'; expected 'none', 'mean' or 'sum'");
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, kOp,
              ": argument 'label_smoothing' must be in [0, 1]");
  TORCH_CHECK(!softcap.has_value() || *softcap > 0.0, kOp, ": argument 'softcap' must be positive");
  TORCH_CHECK(weight.size(0) > 0 || hidden.size(0) == 0, kOp, ": argument 'weight' has no classes");
  const int64_t classes = std::max<int64_t>(weight.size(0), 1);
  const int64_t rows = std::max<int64_t>(hidden.size(0), 1);
  const int64_t float32_logits = rows * classes * int64_t{sizeof(float)};
  const int64_t budget = std::clamp<int64_t>(float32_logits / 4, kMinChunkBytes, kMaxChunkBytes);
  const int64_t most = std::clamp<int64_t>(budget / (classes * hidden.element_size()), 1, rows);
  const int64_t chunks = ceil_div(rows, most);
  return {hidden.size(0), ceil_div(rows, chunks), reduction == "sum", reduction == "none"};
}

// The chunk's logits, soft-capped as Gemma 2 does (in the logits' dtype),
// and where `derivative` is given, d softcap tanh(z / softcap) / dz at them
// (undefined without soft-capping). The derivative is 1 / cosh^2 of the
// logits before the cap, not 1 - tanh^2 of the capped ones: in a half
// dtype, tanh rounds near 1, and 1 - tanh^2 of a saturated logit is all
// rounding (float16 logits of up to 2.8e4, cap 30, tests/fuzz.py case
// 41848: grad_weight 13.6% of its largest from float64 so, 0.18% as
// 1 / cosh^2; transformers' autograd of the same cap, 13.7%). In float32
// for float16 logits: cosh^2 overflows float16 past z / softcap = 6.2, where
// the derivative (1.6e-5 and less) is still a float16 number (case 335250:
// grad_hidden 4% of its largest from float64 so).
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        std::optional<double> softcap, at::Tensor* derivative) {
  const int64_t classes = weight.size(0), pitch = ceil_div(classes, kRowPitch) * kRowPitch;
  at::Tensor logits = at::empty({h.size(0), pitch}, h.options()).narrow(1, 0, classes);
  const bool biased = bias.has_value() && bias->defined();
  for (const auto& [first, count, onto] : class_parts(classes)) {  // disjoint columns: `onto` is the gradients'
    at::Tensor out = logits.narrow(1, first, count);
    const at::Tensor w = weight.narrow(0, first, count).t();
    if (biased) at::addmm_out(out, bias->narrow(0, first, count), h, w);
    else at::mm_out(out, h, w);
  }
  if (!softcap.has_value()) return logits;
  logits.div_(*softcap);
  if (derivative)
    *derivative = at::cosh(logits.scalar_type() == at::kHalf ? logits.to(at::kFloat) : logits).square_().reciprocal_();
  return logits.tanh_().mul_(*softcap);
}

// The three gradients, filled chunk by chunk: a chunk's logit gradient gives
// its rows of grad_hidden and adds into grad_weight and grad_bias.
struct Gradients {
  at::Tensor hidden, weight, bias;  // bias: accumulated in the accumulator type; undefined without one

  Gradients(const at::Tensor& h, const at::Tensor& w, bool has_bias, at::ScalarType acc)
      : hidden(at::empty_like(h, at::MemoryFormat::Contiguous)),
        weight(h.size(0) > 0 ? at::empty_like(w, at::MemoryFormat::Contiguous)
                             : at::zeros_like(w, at::MemoryFormat::Contiguous)),
        bias(has_bias ? at::zeros({w.size(0)}, w.options().dtype(acc)) : at::Tensor()) {}

  // The chunk's logit gradient (of the capped logits: `capped` holds
  // d softcap tanh(z / softcap) / dz, or is undefined) into the three gradients.
  void add_chunk(const at::Tensor& grad, const at::Tensor& capped, const at::Tensor& h, const at::Tensor& w,
                 int64_t start) {
    if (capped.defined()) grad.mul_(capped);
    at::Tensor rows = hidden.narrow(0, start, grad.size(0));
    for (const auto& [first, count, onto] : class_parts(grad.size(1))) {
      const at::Tensor g = grad.narrow(1, first, count), wk = w.narrow(0, first, count);
      if (onto) rows.addmm_(g, wk);
      else at::mm_out(rows, g, wk);
      at::Tensor dw = weight.narrow(0, first, count);
      if (start == 0) at::mm_out(dw, g.t(), h);  // the first chunk writes it: no zero fill, no read
      else dw.addmm_(g.t(), h);
    }
    if (bias.defined()) bias += grad.sum(0, false, bias.scalar_type());
  }

  // The bias gradient in the parameter's dtype, or an empty tensor.
  at::Tensor bias_or_empty() const { return bias.defined() ? bias.to(weight.scalar_type()) : weight.new_empty({0}); }
};

// Runs body(start, rows, h, logits, target, derivative) for each chunk of
// rows; `derivative` (chunk_logits) is undefined unless `gradients`.
template <typename Body>
void for_each_chunk(const Problem& p, const at::Tensor& hidden, const at::Tensor& weight,
                    const std::optional<at::Tensor>& bias, const at::Tensor& target, std::optional<double> softcap,
                    bool gradients, Body&& body) {
  for (int64_t start = 0; start < p.rows; start += p.chunk) {
    const int64_t n = std::min(p.chunk, p.rows - start);
    const at::Tensor h = hidden.narrow(0, start, n);
    at::Tensor derivative;
    at::Tensor logits = chunk_logits(h, weight, bias, softcap, gradients ? &derivative : nullptr);
    body(start, n, h, logits, target.narrow(0, start, n), derivative);
  }
}

at::Tensor reduce_loss(const at::Tensor& rows, const at::Tensor& target, const Problem& p, int64_t ignore_index) {
  if (p.none) return rows;
  const at::Tensor total = rows.sum();
  if (p.sum) return total;
  return total / (target != ignore_index).sum().to(rows.scalar_type());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> backend::fused_linear_cross_entropy(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    c10::string_view reduction, int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
  const Problem p = check(hidden, weight, target, bias, reduction, label_smoothing, softcap);
  at::Tensor lse = at::empty({p.rows}, hidden.options().dtype(acc_type(hidden)));
  at::Tensor losses = at::empty({p.rows}, lse.options());
  for_each_chunk(p, hidden, weight, bias, target, softcap, /*gradients=*/false,
                 [&](int64_t start, int64_t n, const at::Tensor&, at::Tensor& logits, const at::Tensor& t,
                     const at::Tensor&) {
    const at::Tensor chunk_lse = std::get<1>(call_cross_entropy(logits, t, "none", ignore_index, label_smoothing));
    lse.narrow(0, start, n).copy_(chunk_lse);
    losses.narrow(0, start, n).copy_(cross_entropy_row_losses(logits, t, chunk_lse, ignore_index, label_smoothing));
  });
  return {reduce_loss(losses, target, p, ignore_index), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backend::fused_linear_cross_entropy_with_grads(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    c10::string_view reduction, int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
  const Problem p = check(hidden, weight, target, bias, reduction, label_smoothing, softcap);
  TORCH_CHECK(!p.none, kOp, ": gradients in the forward need reduction 'mean' or 'sum'");
  at::Tensor lse = at::empty({p.rows}, hidden.options().dtype(acc_type(hidden)));
  at::Tensor losses = at::empty({p.rows}, lse.options());
  Gradients grads(hidden, weight, bias.has_value() && bias->defined(), lse.scalar_type());
  // d loss / d row loss, for every chunk: 1 / (rows kept) for mean.
  const at::Tensor scale =
      p.sum ? at::Tensor() : (target != ignore_index).sum().to(lse.scalar_type()).reciprocal();
  const at::Tensor targets = target.contiguous();
  for_each_chunk(p, hidden, weight, bias, targets, softcap, /*gradients=*/true,
                 [&](int64_t start, int64_t n, const at::Tensor& h, at::Tensor& logits, const at::Tensor& t,
                     const at::Tensor& capped) {
    at::Tensor chunk_lse = lse.narrow(0, start, n), chunk_losses = losses.narrow(0, start, n);
    // The chunk's row losses and their gradient, written over the logits.
    // A sum: the scale holds the mean's 1 / kept over every chunk.
    cross_entropy_with_grad_rows(logits, t, scale, false, chunk_lse, chunk_losses, at::Tensor(), logits,
                                 ignore_index, label_smoothing, kOp);
    grads.add_chunk(logits, capped, h, weight, start);
  });
  return {reduce_loss(losses, target, p, ignore_index), lse, grads.hidden, grads.weight, grads.bias_or_empty()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backend::fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, c10::string_view reduction, int64_t ignore_index,
    double label_smoothing, std::optional<double> softcap) {
  const Problem p = check(hidden, weight, target, bias, reduction, label_smoothing, softcap);
  TORCH_CHECK(grad_loss.numel() == (p.none ? p.rows : 1), kOp, "_backward: argument 'grad_loss' has ",
              to_text(grad_loss.numel()), " elements, expected one per row for reduction 'none', else one");
  TORCH_CHECK(lse.numel() == p.rows, kOp, "_backward: argument 'lse' needs one element per row");
  at::Tensor per_row = grad_loss.to(lse.scalar_type()).reshape({-1});
  if (!p.none) {
    if (!p.sum) per_row = per_row / (target != ignore_index).sum().to(per_row.scalar_type());
    per_row = per_row.expand({p.rows});
  }
  Gradients grads(hidden, weight, bias.has_value() && bias->defined(), lse.scalar_type());
  for_each_chunk(p, hidden, weight, bias, target, softcap, /*gradients=*/true,
                 [&](int64_t start, int64_t n, const at::Tensor& h, at::Tensor& logits, const at::Tensor& t,
                     const at::Tensor& capped) {
    cross_entropy_backward_into(per_row.narrow(0, start, n), std::nullopt, logits, t, lse.narrow(0, start, n), "none",
                                ignore_index, label_smoothing, logits);
    grads.add_chunk(logits, capped, h, weight, start);
  });
  return {grads.hidden, grads.weight, grads.bias_or_empty()};
}

}  // namespace fastreduce
