// The C++ API (include/fastreduce/fastreduce.h) from a program that links
// LibTorch and libfastreduce_ops only: results against torch's operators in
// float64 on random data, gradients through the C++ autograd, autocast, and
// argument errors. Every test runs on the CPU, and on CUDA when there is one.
#include <ATen/autocast_mode.h>
#include <fastreduce/fastreduce.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

std::vector<torch::Device> devices() {
  std::vector<torch::Device> out{torch::kCPU};
  if (torch::cuda::is_available()) out.emplace_back(torch::kCUDA);
  return out;
}

torch::TensorOptions f64(torch::Device device) { return torch::dtype(torch::kFloat64).device(device); }

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tol = 1e-10) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(torch::allclose(actual.to(torch::kFloat64), expected.to(torch::kFloat64), tol, tol))
      << "largest difference " << (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
}

TEST(Reductions, MatchTorch) {
  for (auto device : devices()) {
    torch::manual_seed(1);
    // transposed and offset: neither contiguous nor at the start of its storage
    const torch::Tensor x = torch::randn({40, 33, 31}, f64(device)).transpose(0, 2).slice(1, 1);
    expect_close(fastreduce::sum(x), x.sum());
    expect_close(fastreduce::sum(x, {{1}}, true), x.sum(std::vector<int64_t>{1}, true));
    expect_close(fastreduce::sum(x, {{0, 2}}), x.sum(std::vector<int64_t>{0, 2}));
    expect_close(fastreduce::sum(x, {{-1}}, false, torch::kFloat32), x.sum(std::vector<int64_t>{-1}, false, torch::kFloat32), 1e-5);
    expect_close(fastreduce::mean(x, {{2}}), x.mean(std::vector<int64_t>{2}));
    expect_close(fastreduce::prod(x.slice(0, 0, 3) * 0.5 + 1, {{0}}), (x.slice(0, 0, 3) * 0.5 + 1).prod(0));
    expect_close(fastreduce::amax(x, {1}), x.amax({1}));
    expect_close(fastreduce::amin(x), x.amin());
    const torch::Tensor ints = torch::randint(-50, 50, {1 << 20 | 3}, torch::dtype(torch::kInt32).device(device));
    const torch::Tensor total = fastreduce::sum(ints);
    EXPECT_EQ(total.scalar_type(), torch::kInt64);
    EXPECT_EQ(total.item<int64_t>(), ints.sum().item<int64_t>());
  }
}

TEST(Reductions, FamilyMatchesTorch) {
  for (auto device : devices()) {
    torch::manual_seed(2);
    const torch::Tensor x = (torch::randn({40, 33, 31}, f64(device)) + 100).transpose(0, 2).slice(1, 1);
    const std::vector<int64_t> dim{1};
    expect_close(fastreduce::var(x, dim), x.var(dim));
    // torch's overloads with a correction (not the bool `unbiased` ones)
    const auto correction = [](double c) { return std::optional<at::Scalar>(c); };
    expect_close(fastreduce::std(x, dim, 0.0, true), at::std(x, dim, correction(0.0), true));
    auto [spread, mean] = fastreduce::var_mean(x, dim, 2.0);
    auto [torch_spread, torch_mean] = at::var_mean(x, dim, correction(2.0), false);
    expect_close(spread, torch_spread);
    expect_close(mean, torch_mean);
    expect_close(std::get<0>(fastreduce::std_mean(x)), std::get<0>(at::std_mean(x, std::nullopt, correction(1.0), false)));
    expect_close(fastreduce::logsumexp(x, dim), x.logsumexp(dim));
    expect_close(fastreduce::norm(x, 3, dim), torch::linalg_vector_norm(x, 3, dim, false, std::nullopt));
    EXPECT_TRUE(torch::equal(fastreduce::argmax(x, 2), x.argmax(2)));
    EXPECT_TRUE(torch::equal(fastreduce::argmin(x), x.argmin()));
    auto [low, high] = fastreduce::aminmax(x, 0, true);
    auto [torch_low, torch_high] = torch::aminmax(x, 0, true);
    EXPECT_TRUE(torch::equal(low, torch_low) && torch::equal(high, torch_high));
    EXPECT_TRUE(torch::equal(fastreduce::any(x > 102.5, dim), (x > 102.5).any(1)));
    EXPECT_TRUE(torch::equal(fastreduce::all(x > 97.5), (x > 97.5).all()));
    const auto norms = fastreduce::foreach_norm({x, x.select(0, 1)});
    expect_close(norms[1], torch::linalg_vector_norm(x.select(0, 1), 2, std::nullopt, false, std::nullopt));
    // gradients through the C++ autograd
    const torch::Tensor leaf = x.detach().requires_grad_();
    const torch::Tensor twin = x.detach().requires_grad_();
    fastreduce::std(leaf, dim).sum().backward();
    twin.std(dim).sum().backward();
    expect_close(leaf.grad(), twin.grad());
  }
}

TEST(Norms, ForwardAndBackwardMatchTorch) {
  for (auto device : devices()) {
    torch::manual_seed(2);
    const int64_t hidden = 33;
    const torch::Tensor x0 = torch::randn({7, 5, hidden}, f64(device)) * 3 + 1;
    const torch::Tensor w0 = torch::randn({hidden}, f64(device)), b0 = torch::randn({hidden}, f64(device));
    const torch::Tensor dy = torch::randn({7, 5, hidden}, f64(device));
    for (bool with_weight : {false, true}) {
      for (bool with_bias : {false, true}) {
        auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(); };
        torch::Tensor xa = leaf(x0), wa = leaf(w0), ba = leaf(b0), xb = leaf(x0), wb = leaf(w0), bb = leaf(b0);
        const auto wa_opt = with_weight ? std::optional<torch::Tensor>(wa) : std::nullopt;
        const auto ba_opt = with_bias ? std::optional<torch::Tensor>(ba) : std::nullopt;
        const auto wb_opt = with_weight ? std::optional<torch::Tensor>(wb) : std::nullopt;
        const auto bb_opt = with_bias ? std::optional<torch::Tensor>(bb) : std::nullopt;
        const torch::Tensor ya = fastreduce::layer_norm(xa, {hidden}, wa_opt, ba_opt, 1e-5);
        const torch::Tensor yb = torch::layer_norm(xb, {hidden}, wb_opt, bb_opt, 1e-5);
        expect_close(ya, yb);
        ya.backward(dy);
        yb.backward(dy);
        expect_close(xa.grad(), xb.grad(), 1e-9);
        if (with_weight) expect_close(wa.grad(), wb.grad(), 1e-9);
        if (with_bias) expect_close(ba.grad(), bb.grad(), 1e-9);
      }
      torch::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
      torch::Tensor wa = w0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
      const auto wa_opt = with_weight ? std::optional<torch::Tensor>(wa) : std::nullopt;
      const auto wb_opt = with_weight ? std::optional<torch::Tensor>(wb) : std::nullopt;
      const torch::Tensor ya = fastreduce::rms_norm(xa, {hidden}, wa_opt);
      const torch::Tensor yb = torch::rms_norm(xb, {hidden}, wb_opt);
      expect_close(ya, yb);
      ya.backward(dy);
      yb.backward(dy);
      expect_close(xa.grad(), xb.grad(), 1e-9);
      if (with_weight) expect_close(wa.grad(), wb.grad(), 1e-9);
    }
  }
}

TEST(Norms, FusedResidualAdd) {
  for (auto device : devices()) {
    torch::manual_seed(3);
    const torch::Tensor x = torch::randn({9, 48}, f64(device)), r = torch::randn({9, 48}, f64(device));
    const torch::Tensor w = torch::randn({48}, f64(device)), b = torch::randn({48}, f64(device));
    auto [ln, ln_sum] = fastreduce::add_layer_norm(x, r, {48}, w, b);
    expect_close(ln_sum, x + r);
    expect_close(ln, torch::layer_norm(x + r, {48}, w, b));
    auto [rms, rms_sum] = fastreduce::add_rms_norm(x, r, {48}, w, 1e-6);
    expect_close(rms_sum, x + r);
    expect_close(rms, torch::rms_norm(x + r, {48}, w, 1e-6));
  }
}

TEST(Softmax, MatchesTorch) {
  for (auto device : devices()) {
    torch::manual_seed(4);
    const torch::Tensor x = torch::randn({6, 31, 1000}, f64(device));
    expect_close(fastreduce::softmax(x), torch::softmax(x, -1));
    expect_close(fastreduce::softmax(x, 1), torch::softmax(x, 1));
    const torch::Tensor scores = torch::randn({2, 3, 17, 17}, f64(device));
    const torch::Tensor upper = torch::ones({17, 17}, torch::dtype(torch::kBool).device(device)).triu(1);
    expect_close(fastreduce::causal_softmax(scores, 0.25), torch::softmax((scores * 0.25).masked_fill(upper, -INFINITY), -1));
  }
}

TEST(CrossEntropy, MatchesTorchWithOptions) {
  for (auto device : devices()) {
    torch::manual_seed(5);
    const torch::Tensor logits0 = torch::randn({37, 257}, f64(device)) * 4;
    torch::Tensor target = torch::randint(257, {37}, torch::dtype(torch::kInt64).device(device));
    target.index_put_({torch::indexing::Slice(0, 5)}, -1);
    for (std::string reduction : {"mean", "sum", "none"}) {
      for (double smoothing : {0.0, 0.1}) {
        torch::Tensor a = logits0.clone().requires_grad_(), b = logits0.clone().requires_grad_();
        const torch::Tensor la = fastreduce::cross_entropy(a, target, reduction, -1, smoothing);
        const int64_t mode = reduction == "mean" ? at::Reduction::Mean : reduction == "sum" ? at::Reduction::Sum
                                                                                              : at::Reduction::None;
        const torch::Tensor lb = torch::cross_entropy_loss(b, target, {}, mode, -1, smoothing);
        expect_close(la, lb);
        // An incoming gradient other than 1 (mean and sum: their gradient comes
        // from the forward and is scaled in the backward).
        (la * 2.5).sum().backward();
        (lb * 2.5).sum().backward();
        expect_close(a.grad(), b.grad());
      }
    }
    auto [loss, lse] = fastreduce::cross_entropy_with_lse(logits0, target, "none", -1);
    expect_close(lse, torch::logsumexp(logits0, 1));
  }
}

TEST(Autocast, CrossEntropyRunsInFloat32OnTheCpu) {
  const torch::Tensor logits = torch::randn({8, 40}), target = torch::randint(40, {8});
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const torch::Tensor loss = fastreduce::cross_entropy(logits.to(torch::kBFloat16), target);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  expect_close(loss, torch::cross_entropy_loss(logits.to(torch::kBFloat16).to(torch::kFloat32), target), 1e-5);
}

TEST(Errors, NameTheArgument) {
  const torch::Tensor x = torch::randn({4, 8});
  try {
    fastreduce::layer_norm(x, {8}, torch::randn({7}));
    FAIL() << "a weight of the wrong shape was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("'weight'"), std::string::npos) << e.what();
  }
  try {
    fastreduce::cross_entropy(x, torch::zeros({4}), "mean");
    FAIL() << "a float target was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("'target'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fastreduce::cross_entropy(x, torch::zeros({4}, torch::kInt64), "average"), c10::Error);
}

}  // namespace
