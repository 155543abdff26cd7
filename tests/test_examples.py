"""The GPT-2 example runs end to end (small, on the CPU; on CUDA too when present)."""

import os
import subprocess
import sys

import pytest

from conftest import DEVICES

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "gpt2.py")


@pytest.mark.parametrize("device", DEVICES)
def test_gpt2_example(device):
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--device", device, "--layers", "2", "--width", "64", "--heads", "4", "--vocab", "512",
         "--shapes", "2x32", "--steps", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "patched 5 LayerNorms" in result.stdout
    for precision in ("float32", "bfloat16", "float16"):  # each row is printed after its checks passed
        assert f"| {precision} |" in result.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_llama_example_same_loss_curve(device):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import llama

    result = llama.main(["--device", device, "--layers", "2", "--width", "64", "--heads", "4", "--vocab", "300",
                         "--batch", "2", "--seq", "16", "--steps", "3", "--precision", "float32"])
    assert len(result["ours_losses"]) == 3
    for a, b in zip(result["torch_losses"], result["ours_losses"]):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)
    assert result["torch_losses"][-1] < result["torch_losses"][0]  # it trains
    # Under autocast: bfloat16 sublayer outputs meet the float32 residual stream.
    low = llama.main(["--device", device, "--layers", "2", "--width", "64", "--heads", "4", "--vocab", "300",
                      "--batch", "2", "--seq", "16", "--steps", "2", "--precision", "bfloat16"])
    for a, b in zip(low["torch_losses"], low["ours_losses"]):
        assert abs(a - b) <= 2e-2 * abs(a), (a, b)


def test_hf_llama_example_losses_agree():
    pytest.importorskip("transformers")
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "hf_llama.py")
    result = subprocess.run([sys.executable, example, "--device", "cpu", "--steps", "3"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = [line.split("|") for line in result.stdout.splitlines() if line.startswith("| ") and "impl" not in line]
    losses = {row[1].strip(): row[6].strip() for row in rows}
    assert {"transformers", "fastreduce"} <= set(losses)
    first = [float(v) for v in losses["transformers"].split(",")]
    for impl, values in losses.items():
        for a, b in zip(first, (float(v) for v in values.split(","))):
            assert abs(a - b) <= 1e-4 * abs(a), (impl, a, b)
