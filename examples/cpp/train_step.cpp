// One training step of a tiny pre-norm MLP language-model head in LibTorch,
// with fastreduce's RMSNorm, fused residual add + RMSNorm and cross-entropy:
// no Python anywhere. Prints the loss of each step and checks it against the
// same step computed with torch's own operators.
#include <fastreduce/fastreduce.h>
#include <torch/torch.h>

#include <cstdio>

namespace {

struct Model {
  torch::Tensor embed, w_in, w_out, norm1, norm2, head;
};

Model make_model(int64_t vocab, int64_t hidden, torch::Device device) {
  torch::manual_seed(0);
  auto param = [&](torch::Tensor t) { return t.to(device).requires_grad_(); };
  return {param(torch::randn({vocab, hidden}) * 0.1), param(torch::randn({hidden, 4 * hidden}) * 0.05),
          param(torch::randn({4 * hidden, hidden}) * 0.05), param(torch::ones({hidden})),
          param(torch::ones({hidden})), param(torch::randn({hidden, vocab}) * 0.05)};
}

// fused: fastreduce's operators; otherwise the torch functions they replace.
torch::Tensor loss_of(const Model& m, const torch::Tensor& tokens, const torch::Tensor& targets, bool fused) {
  const int64_t hidden = m.embed.size(1);
  const torch::Tensor x = m.embed.index_select(0, tokens);
  const torch::Tensor h = fused ? fastreduce::rms_norm(x, {hidden}, m.norm1)
                                : torch::rms_norm(x, {hidden}, m.norm1);
  const torch::Tensor mlp = torch::gelu(h.matmul(m.w_in)).matmul(m.w_out);
  torch::Tensor normed;
  if (fused) {
    normed = std::get<0>(fastreduce::add_rms_norm(mlp, x, {hidden}, m.norm2));
  } else {
    normed = torch::rms_norm(mlp + x, {hidden}, m.norm2);
  }
  const torch::Tensor logits = normed.matmul(m.head);
  return fused ? fastreduce::cross_entropy(logits, targets) : torch::cross_entropy_loss(logits, targets);
}

}  // namespace

int main() {
  const int64_t vocab = 96, hidden = 64, tokens = 128;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Model fast = make_model(vocab, hidden, device), reference = make_model(vocab, hidden, device);
  const torch::Tensor batch = torch::randint(vocab, {tokens + 1}).to(device);
  const torch::Tensor inputs = batch.slice(0, 0, tokens), targets = batch.slice(0, 1);

  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    double losses[2];
    for (bool fused : {true, false}) {
      Model& m = fused ? fast : reference;
      torch::Tensor loss = loss_of(m, inputs, targets, fused);
      loss.backward();
      torch::NoGradGuard no_grad;
      for (torch::Tensor* p : {&m.embed, &m.w_in, &m.w_out, &m.norm1, &m.norm2, &m.head}) {
        p->sub_(p->grad() * 0.5);
        p->mutable_grad().zero_();
      }
      losses[fused ? 0 : 1] = loss.item<double>();
    }
    std::printf("step %d  loss %.6f  (torch %.6f)\n", step, losses[0], losses[1]);
    worst = std::max(worst, std::abs(losses[0] - losses[1]));
  }
  std::printf("device %s, largest difference from torch %.2e\n", device.str().c_str(), worst);
  return worst < 1e-4 ? 0 : 1;
}
