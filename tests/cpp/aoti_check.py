"""AOTInductor from C++: exports a small model that calls fastreduce's
operators, compiles it into a package with aoti_compile_and_package, runs the
package in the C++ program aoti_run (LibTorch and libfastreduce_ops only), and
compares its outputs with eager Python. ctest runs it:
    python aoti_check.py PATH/TO/aoti_run
"""

import os
import subprocess
import sys
import tempfile

import torch

import fastreduce_torch as fr


class Head(torch.nn.Module):
    """A pre-norm block's norms and softmax, a reduction and the loss."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.norm = fr.nn.RMSNorm(hidden)
        self.final = fr.nn.LayerNorm(hidden)
        self.proj = torch.nn.Linear(hidden, vocab)

    def forward(self, x, residual, target):
        h = self.norm(x)
        normed, residual = fr.add_layer_norm(h, residual, (x.shape[-1],), self.final.weight, self.final.bias)
        logits = self.proj(normed)
        probs = fr.softmax(logits, -1)
        loss = fr.cross_entropy(logits, target, label_smoothing=0.1)
        return probs, fr.sum(residual, 0), fr.amax(logits, 1), loss


def main(runner: str) -> int:
    torch.manual_seed(0)
    model = Head(64, 100).eval()
    inputs = (torch.randn(32, 64), torch.randn(32, 64), torch.randint(100, (32,)))
    with torch.no_grad():
        expected = model(*inputs)
    with tempfile.TemporaryDirectory() as tmp:
        exported = torch.export.export(model, inputs)
        package = torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(tmp, "head.pt2"))
        torch.save(list(inputs), os.path.join(tmp, "inputs.pt"))
        subprocess.run([runner, package, os.path.join(tmp, "inputs.pt"), os.path.join(tmp, "outputs.pt")],
                       check=True)
        outputs = torch.load(os.path.join(tmp, "outputs.pt"))
    assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
    for name, got, want in zip(("probs", "residual sum", "amax", "loss"), outputs, expected):
        torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}")
        print(f"{name}: {tuple(got.shape)} matches eager")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
