"""layer_norm, rms_norm and the fused residual add + norms (add_layer_norm,
add_rms_norm) against float64 references and torch, forward and backward,
every option; gradcheck, opcheck, compile, autocast, modules, patch and
CUDA graphs. Softmax: test_softmax.py; cross-entropy: test_losses.py."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import (DEVICES, TOLERANCE, close_to_reference, error_vs_reference, offset_view, requires_cuda,
                      side_stream_then_graph)

LOW = [torch.float32, torch.float16, torch.bfloat16]
WIDTHS = [1, 31, 33, 200, 768, 1025, 4096, 70000]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", WIDTHS)
def test_layer_norm_forward(device, dtype, n):
    rows = 3 if n > 10000 else 17
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    w = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    out, mean, rstd = torch.ops.fastreduce.layer_norm(x, [n], w, b, 1e-5)
    ref_out, ref_mean, ref_rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    assert out.shape == ref_out.shape and mean.shape == ref_mean.shape and mean.dtype == ref_mean.dtype
    reference = F.layer_norm(x.double(), [n], w.double(), b.double(), 1e-5)
    error_vs_reference(out, ref_out, reference)
    torch.testing.assert_close(mean.double(), ref_mean.double(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rstd.double(), ref_rstd.double(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_shapes_and_affine_options(device):
    x = torch.randn(2, 3, 4, 5, device=device)
    # 40 wide: whole 16-byte packs on the GPU; 5, 20 and 60: element-wise.
    for x, shape in ((x, [5]), (x, [4, 5]), (x, [3, 4, 5]), (torch.randn(6, 5, 8, device=device), [5, 8])):
        for with_weight, with_bias in ((True, True), (False, False), (True, False), (False, True)):
            w = torch.randn(shape, device=device) if with_weight else None
            b = torch.randn(shape, device=device) if with_bias else None
            ours = torch.ops.fastreduce.layer_norm(x, shape, w, b, 1e-5)
            theirs = torch.ops.aten.native_layer_norm(x, shape, w, b, 1e-5)
            for a, t in zip(ours, theirs):
                assert a.shape == t.shape
                torch.testing.assert_close(a, t, rtol=1e-4, atol=1e-5)
    nc = torch.randn(5, 8, device=device).t()
    torch.testing.assert_close(fr.layer_norm(nc, 5), F.layer_norm(nc, [5]), rtol=1e-4, atol=1e-5)






@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = torch.randn(3, 4, 6, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: fr.layer_norm(x, [4, 6], w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: fr.layer_norm(x, 6), (x,))


def layer_norm_against_torch(x, w, b, outputs=3):
    """The first `outputs` of our layer_norm's (out, mean, rstd) against
    float64 and torch's."""
    n = x.shape[-1]
    reference = torch.ops.aten.native_layer_norm(x.double(), [n], w.double(), b.double(), 1e-5)
    ours = torch.ops.fastreduce.layer_norm(x, [n], w, b)
    theirs = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    for k in range(outputs):
        # float statistics may miss by an ulp of their size, whatever the
        # order of the sums (a mean of 1475: 1.2e-4).
        floor = None
        if k > 0 and ours[k].dtype == torch.float32:
            floor = max(1e-5, torch.finfo(torch.float32).eps * reference[k].abs().max().item())
        error_vs_reference(ours[k], theirs[k], reference[k], floor)


def add_layer_norm_against_torch(x, w, b):
    """add_layer_norm's h exactly x + residual, and its output against
    float64 and torch's layer_norm of h."""
    n = x.shape[-1]
    residual = torch.randn_like(x)
    out, h = fr.add_layer_norm(x, residual, n, w, b)
    assert torch.equal(h, x + residual)
    error_vs_reference(out, F.layer_norm(h, [n], w, b), F.layer_norm(h.double(), [n], w.double(), b.double()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [768, 12000, 12001, 32768, 40000, 262144])
def test_rows_far_from_zero(device, dtype, n):
    # Rows whose mean is far above their spread, a ramp, and a first element
    # 300 deviations out (on the GPU, 768: warp rows; 12000: a block's
    # registers; 12001: loose rows, read twice but float16 layer_norm's;
    # 32768: two-byte ones in a block of 1024 threads, float ones and the
    # add's in a cluster; 40000 and 262144: rows across a cluster): neither the mean
    # nor the output may round at the scale of the values. With a residual,
    # h = x + residual is the row.
    x = (1000 + torch.randn(6, n, device=device)).to(dtype)
    x[1] = torch.linspace(-50, 3000, n)
    x[2, 0] = 1300  # sums of deviations from the first element would cancel to noise here
    w = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    layer_norm_against_torch(x, w, b, outputs=2)  # out, mean
    add_layer_norm_against_torch(x, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [768, 1000, 12000, 12001, 16384, 32768, 40000, 262144])
def test_statistics_whatever_the_first_value(device, dtype, n):
    # On the GPU a row's deviations from its first value are summed in one
    # reduction while the mean lies within sqrt(8) deviations of that value,
    # and a second pass over the deviations from the mean decides otherwise:
    # rows whose first value lies 0 to 300 deviations out, on both sides of
    # the bound, through every row kernel (768: warp rows, staged for half
    # types; 1000: not whole packs; 12000 and 16384: a block, floats read
    # twice; 12001: loose rows read twice; 32768: two-byte ones a block of
    # 1024 threads; 40000 and 262144: clusters).
    spreads = [0.0, 1.0, 2.6, 3.0, -3.0, 10.0, 300.0]
    x = 500 + torch.randn(len(spreads), n, device=device)
    x[:, 0] = 500 + torch.tensor(spreads, device=device)
    x = x.to(dtype)
    w = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    layer_norm_against_torch(x, w, b)
    add_layer_norm_against_torch(x, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [768, 1000, 12000, 12001, 32768, 262144])
def test_rows_with_values_far_out(device, dtype, n):
    # Single values 10^3-10^4 deviations out (the massive activations of
    # LLMs' hidden states), first, mid-row, last, or many of 300: every
    # square after one in a float lane of the CPU's sum rounds at its scale.
    x = torch.randn(5, n, device=device)
    x[0, 0] = 1e4
    x[1, n // 2] = -1e4
    x[2, n - 1] = 1e3
    x[3, 5::97] = 300.0
    x = x.to(dtype)
    w = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    layer_norm_against_torch(x, w, b)
    error_vs_reference(fr.rms_norm(x, n, w), F.rms_norm(x, [n], w), F.rms_norm(x.double(), [n], w.double()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [260, 768, 1000, 1600, 2049, 4096, 8191, 8192, 32768, 65536])
@pytest.mark.parametrize("eps", [0.0, 1e-5, 1.0])
def test_rows_whose_squares_overflow(device, dtype, n, eps):
    # Values of 1e30: the sum of squared deviations overflows float, so the
    # variance is inf and rstd 0, and layer_norm's output is the bias, with
    # and without the fused add, through each kernel's row width (a variance
    # of inf - inf clamped to 0 gave rstd 1 / sqrt(eps) on CUDA). torch's CPU
    # kernel gives the bias at some widths and NaN at others (768, 4096):
    # ours is compared with it where it is not NaN, and with the bias
    # everywhere.
    x = (torch.randn(4, n, dtype=torch.float64) * 1e30).to(dtype)
    r = torch.randn(4, n).to(dtype)
    w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    on = [t.to(device) for t in (x, r, w, b)]
    out, h = fr.add_layer_norm(*on[:2], n, *on[2:], eps)
    torch.testing.assert_close(h.cpu(), x + r)
    for ours, rows in ((fr.layer_norm(on[0], n, on[2], on[3], eps), x), (out, x + r)):
        assert torch.equal(ours.cpu(), b.expand_as(x))
        theirs = F.layer_norm(rows, [n], w, b, eps)
        if not theirs.isnan().any():
            assert torch.equal(ours.cpu(), theirs)
    # rms_norm's sum of squares overflows too: rstd 0 and an output of 0, as torch's.
    for ours in (fr.rms_norm(on[0], n, on[2], eps), fr.add_rms_norm(*on[:2], n, on[2], eps)[0]):
        assert torch.equal(ours.cpu().abs(), torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [768, 2000, 70000])
def test_backward_matches_torch(device, n):
    rows = {768: 64, 2000: 2500, 70000: 3}[n]  # 2000: several rows per partial row on the GPU
    x = torch.randn(rows, n, device=device, requires_grad=True)
    w = torch.randn(n, device=device, requires_grad=True)
    b = torch.randn(n, device=device, requires_grad=True)
    g = torch.randn(rows, n, device=device)
    ours = torch.autograd.grad(fr.layer_norm(x, n, w, b), (x, w, b), g)
    theirs = torch.autograd.grad(F.layer_norm(x, [n], w, b), (x, w, b), g)
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a, t, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x = torch.randn(4, 6, device=device)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        fr.layer_norm(x, 5)
    with pytest.raises(RuntimeError, match="'weight' has shape"):
        fr.layer_norm(x, 6, torch.randn(5, device=device))


def samples(device):
    x = torch.randn(3, 8, device=device)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    ops = torch.ops.fastreduce
    return [
        (ops.layer_norm.default, (x, [8], w, b, 1e-5), {}),
        (ops.layer_norm.default, (x, [8], None, None, 1e-5), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in samples(device):
        torch.library.opcheck(op, args, kwargs)


class Block(torch.nn.Module):
    """A GPT-2 style block: pre-norm causal self-attention and an MLP."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = fr.causal_softmax(q @ k.transpose(-1, -2), (c // self.heads) ** -0.5)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_gpt2_block_fullgraph(device):
    block = Block().to(device)
    assert fr.patch(block) == 2
    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(2, 9, 32, device=device, requires_grad=True)
    out = compiled(x)
    torch.testing.assert_close(out, block(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert x.grad is not None and block.ln1.weight.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_modules_and_patch(device):
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.LayerNorm(8, bias=False))
    ref = ref.to(device)
    ours = fr.nn.LayerNorm(8).to(device)
    assert set(ours.state_dict()) == set(torch.nn.LayerNorm(8).state_dict())
    weights = ref[1].weight
    assert fr.patch(ref) == 2 and isinstance(ref[1], fr.nn.LayerNorm) and ref[1].weight is weights
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(ref[1](x), F.layer_norm(x, [8], ref[1].weight, ref[1].bias))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("n", [768, 2000])
def test_layer_norm_parameter_gradients_deterministic(n):
    x = torch.randn(4096, n, device="cuda", requires_grad=True)
    w = torch.randn(n, device="cuda", requires_grad=True)
    b = torch.randn(n, device="cuda", requires_grad=True)
    g = torch.randn(4096, n, device="cuda")
    first = torch.autograd.grad(fr.layer_norm(x, n, w, b), (w, b), g)
    second = torch.autograd.grad(fr.layer_norm(x, n, w, b), (w, b), g)
    assert all(torch.equal(a, c) for a, c in zip(first, second))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, rows, n", [(dtype, rows, n) for dtype in LOW
                                             for rows, n in [(3000, 4096), (5000, 1024), (2500, 1030), (700, 96),
                                                             (9000, 1600)]]
                         + [(torch.float64, 3000, 768)])
def test_parameter_gradients_folded_in_one_launch(dtype, rows, n):
    # The weight and bias gradients' partial rows, both folded by one launch
    # that follows the kernel storing them: from the register kernels in a
    # full wave of blocks at (3000, 4096) and (5000, 1024), element-wise
    # columns at 1030, warps at 96, 8 blocks a SM at 1600; float64 rows of
    # 768 also. Checked against float64 (float64: against torch), run to
    # run, on a side stream and replayed from a CUDA graph.
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    g = torch.randn(rows, n, device="cuda").to(dtype)

    def grads(f, *inputs):
        return torch.autograd.grad(f(*inputs), inputs, g.to(inputs[0].dtype))

    ours = grads(lambda *a: fr.layer_norm(a[0], n, a[1], a[2]), x, w, b)
    theirs = grads(lambda *a: F.layer_norm(a[0], [n], a[1], a[2]), x, w, b)
    reference = grads(lambda *a: F.layer_norm(a[0], [n], a[1], a[2]),
                      *[t.detach().double().requires_grad_() for t in (x, w, b)])
    rms = grads(lambda *a: fr.rms_norm(a[0], n, a[1]), x, w)[1]
    rms_torch = grads(lambda *a: F.rms_norm(a[0], [n], a[1]), x, w)[1]
    rms_exact = grads(lambda *a: F.rms_norm(a[0], [n], a[1]), *[t.detach().double().requires_grad_() for t in (x, w)])
    if dtype == torch.float64:
        for mine, exact in zip(ours + (rms,), reference + (rms_exact[1],)):
            torch.testing.assert_close(mine, exact)
    else:
        for mine, torch_own, exact in zip(ours + (rms,), theirs + (rms_torch,), reference + (rms_exact[1],)):
            error_vs_reference(mine, torch_own, exact)

    step = lambda: grads(lambda *a: fr.layer_norm(a[0], n, a[1], a[2]), x, w, b)  # noqa: E731
    on_side_stream, captured = side_stream_then_graph(step)
    for first, *others in zip(ours, step(), on_side_stream, captured):
        assert all(torch.equal(first, other) for other in others)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, n", [(64, 96), (3000, 4096), (9000, 1600), (64, 20000)])
def test_parameter_gradients_in_the_parameters_dtype(device, dtype, rows, n):
    # Half parameters and float32 ones beside half input (one dtype for both,
    # as torch requires): each gradient in its parameter's dtype, written so by
    # the launch that folds the partial
    # rows of the dx kernel (warp rows at 96, block rows at 4096 and 1600) or
    # of the separate pass over rows too long for registers (20000). Against
    # float64, within the rounding of the parameter's dtype.
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype).requires_grad_()
    g = torch.randn(rows, n, device=device).to(dtype)
    rounding = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}

    def check(ours, exact, param):
        assert ours.dtype == param.dtype
        torch.testing.assert_close(ours.double(), exact, rtol=rounding[param.dtype],
                                   atol=rounding[param.dtype] * exact.abs().max().item())

    as_double = lambda *ts: [t.detach().double().requires_grad_() for t in ts]  # noqa: E731
    for w_dtype, b_dtype in [(dtype, dtype), (torch.float32, torch.float32)]:
        w = torch.randn(n, device=device).to(w_dtype).requires_grad_()
        b = torch.randn(n, device=device).to(b_dtype).requires_grad_()
        dw, db = torch.autograd.grad(fr.layer_norm(x, n, w, b), (w, b), g)
        x64, w64, b64 = as_double(x, w, b)
        exact = torch.autograd.grad(F.layer_norm(x64, [n], w64, b64), (w64, b64), g.double())
        check(dw, exact[0], w)
        check(db, exact[1], b)
        (dw,) = torch.autograd.grad(fr.rms_norm(x, n, w), (w,), g)
        (exact,) = torch.autograd.grad(F.rms_norm(x64, [n], w64), (w64,), g.double())
        check(dw, exact, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
def test_unaligned_rows_and_gradients(device, dtype):
    # Storage offset 1 and widths not a multiple of the vector size: the
    # element-wise paths; an offset gradient with an aligned input: mixed.
    base = torch.randn(64 * 96 + 1, device=device).to(dtype)
    x = base[1:].view(64, 96)
    ln = torch.ops.fastreduce.layer_norm(x, [96], None, None, 1e-5)[0]
    torch.testing.assert_close(ln, F.layer_norm(x, [96]))
    y = torch.randn(64, 96, device=device).to(dtype).requires_grad_()
    g = torch.randn(64 * 96 + 1, device=device).to(dtype)[1:].view(64, 96)
    ours = torch.autograd.grad(fr.layer_norm(y, 96), y, g)[0]
    theirs = torch.autograd.grad(F.layer_norm(y, [96]), y, g)[0]
    torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
def test_more_rows_than_one_wave(dtype):
    # Tens of thousands of short rows: many more blocks than are resident at once.
    x = (torch.randn(40000, 96, device="cuda") * 3 + 1).to(dtype)
    w = torch.randn(96, device="cuda").to(dtype)
    b = torch.randn(96, device="cuda").to(dtype)
    reference = F.layer_norm(x.double(), [96], w.double(), b.double())
    error_vs_reference(fr.layer_norm(x, 96, w, b), F.layer_norm(x, [96], w, b), reference)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW + [torch.float64])
@pytest.mark.parametrize("n", [1025, 1600, 2049, 4095, 4096, 6144, 8191, 8192, 12000, 65536, 65537, 262144])
def test_long_rows(dtype, n):
    # Rows past 1024 run one block per row with the row in registers (16-byte
    # packs up to 8192 floats or 16384 halves; odd widths up to those as
    # loose rows, packs from each row's first boundary, doubles element-wise
    # up to 2048), a cluster of 2-16 blocks per row beyond on Hopper (12000
    # floats: 2; 262144 floats: 16), the shared-memory kernels otherwise
    # (65537, odd doubles past 2048). 6144 floats: 48 KiB of dynamic shared
    # memory, past the limit with the static. float64 rows past a block's
    # registers: clusters exchanging 16-byte pairs of doubles.
    x = (torch.randn(6, n, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    g = torch.randn(6, n, device="cuda")

    def grads(f, *inputs):
        out = f(*inputs)
        return (out,) + torch.autograd.grad(out, inputs, g.to(out.dtype))

    as_double = [t.detach().double().requires_grad_() for t in (x, w, b)]
    for ours, theirs, reference in zip(grads(lambda *a: fr.layer_norm(a[0], n, a[1], a[2]), x, w, b),
                                       grads(lambda *a: F.layer_norm(a[0], [n], a[1], a[2]), x, w, b),
                                       grads(lambda *a: F.layer_norm(a[0], [n], a[1], a[2]), *as_double)):
        error_vs_reference(ours, theirs, reference)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [12000, 65536, 262144])
@pytest.mark.parametrize("affine", [False, True])
def test_wide_rms_rows(dtype, n, affine):
    # rms_norm's forward and backward across a cluster of blocks (12000
    # floats: 2, 65536 bf16: 4, 262144 bf16: 16), with and without a weight.
    x = (torch.randn(5, n, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(n, device="cuda").to(dtype).requires_grad_() if affine else None
    g = torch.randn(5, n, device="cuda")
    leaves = [t for t in (x, w) if t is not None]

    def grads(f, *inputs):
        out = f(*inputs)
        return (out,) + torch.autograd.grad(out, inputs, g.to(out.dtype))

    def with_weight(norm):
        return (lambda t, v: norm(t, v)) if affine else (lambda t: norm(t, None))

    as_double = [t.detach().double().requires_grad_() for t in leaves]
    for ours, theirs, reference in zip(grads(with_weight(lambda t, v: fr.rms_norm(t, n, v)), *leaves),
                                       grads(with_weight(lambda t, v: F.rms_norm(t, [n], v)), *leaves),
                                       grads(with_weight(lambda t, v: F.rms_norm(t, [n], v)), *as_double)):
        error_vs_reference(ours, theirs, reference)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [40000, 262144])
@pytest.mark.parametrize("with_weight, with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_wide_float_layer_norm_rows_each_parameter(device, n, with_weight, with_bias):
    # Float rows across a cluster on Hopper (40000: 4 blocks at eight packs a
    # thread; 262144: 16, backward too), forward and backward with each
    # combination of weight and bias.
    x = torch.randn(4, n, device=device) * 3 + 1
    w = torch.randn(n, device=device) if with_weight else None
    b = torch.randn(n, device=device) if with_bias else None
    g = torch.randn(4, n, device=device)
    outputs_and_grads_match(lambda t, v, c: fr.layer_norm(t, n, v, c), lambda t, v, c: F.layer_norm(t, [n], v, c),
                            (x, w, b), (g,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [520, 768, 776, 1000, 1024, 1288, 1536, 1600, 1792, 16392, 20000, 24576, 32760, 32768])
@pytest.mark.parametrize("kind, with_weight, with_bias", [("layer", False, False), ("layer", True, False),
                                                        ("layer", False, True), ("layer", True, True),
                                                        ("rms", False, False), ("rms", True, False)])
def test_half_rows_in_registers_each_parameter(device, dtype, n, kind, with_weight, with_bias):
    # Two-byte rows without a residual held in registers on the GPU, loading
    # the parameters pack by pack: three to seven 16-byte packs a lane
    # (513-1792 wide) a warp a row (520, 776, 1000, 1288: the last pack group
    # short of the warp; 768 and 1536: layer_norm's three and rms_norm's six
    # packs, rows of exactly that many compiled with no pack guarded), and
    # rows of 16385-32768 one block of up to 1024 threads a row at four
    # packs a thread (16392, 20000 and 32760: the last warp short of the
    # row; 16384 is read twice, wider rows go to clusters). Forward and
    # backward with each combination of weight and bias (rms_norm: the
    # weight).
    rows = 45 if n <= 1792 else 5
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    w = torch.randn(n, device=device).to(dtype) if with_weight else None
    b = torch.randn(n, device=device).to(dtype) if with_bias else None
    g = torch.randn(rows, n, device=device).to(dtype)
    if kind == "layer":
        outputs_and_grads_match(lambda t, v, c: fr.layer_norm(t, n, v, c), lambda t, v, c: F.layer_norm(t, [n], v, c),
                                (x, w, b), (g,))
    else:
        outputs_and_grads_match(lambda t, v: fr.rms_norm(t, n, v), lambda t, v: F.rms_norm(t, [n], v), (x, w), (g,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [2056, 4096, 4104, 6000, 8192, 8200, 12000, 16384])
@pytest.mark.parametrize("with_weight, with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_half_layer_norm_rows_a_block_each_parameter(device, dtype, n, with_weight, with_bias):
    # Two-byte rows of 1793-16384 run a block a row in registers on the GPU;
    # with both parameters (and no residual) a kernel compiled for them
    # (2056, 4104, 6000, 8200, 12000: the last pack group short of the
    # block); bf16 rows past 8192 are read twice instead (the sums, then the
    # output from L2).
    # Forward and backward with each combination of weight and bias.
    rows = 7
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    w = torch.randn(n, device=device).to(dtype) if with_weight else None
    b = torch.randn(n, device=device).to(dtype) if with_bias else None
    g = torch.randn(rows, n, device=device).to(dtype)
    outputs_and_grads_match(lambda t, v, c: fr.layer_norm(t, n, v, c), lambda t, v, c: F.layer_norm(t, [n], v, c),
                            (x, w, b), (g,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [4096, 4104, 6000, 8192, 8200, 12000, 16384])
@pytest.mark.parametrize("with_weight", [False, True])
def test_half_rms_rows_of_one_block_read_twice(device, dtype, n, with_weight):
    # Two-byte rms_norm rows of 4097-16384 without a residual are read twice
    # on the GPU (past 8192 asking L2 to keep the row), as layer_norm's bf16
    # ones past 8192 (the test above); 4096 stays in registers. 4104, 6000,
    # 8200 and 12000 leave the last pack group short of the block. Forward
    # and backward, with and without the weight.
    rows = 7
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    w = torch.randn(n, device=device).to(dtype) if with_weight else None
    g = torch.randn(rows, n, device=device).to(dtype)
    outputs_and_grads_match(lambda t, v: fr.rms_norm(t, n, v), lambda t, v: F.rms_norm(t, [n], v), (x, w), (g,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [8184, 8192, 8200, 12000, 16384, 16388, 20000, 24576, 32764, 32768])
@pytest.mark.parametrize("kind, with_weight, with_bias", [("layer", False, False), ("layer", True, False),
                                                          ("layer", False, True), ("layer", True, True),
                                                          ("rms", False, False), ("rms", True, False)])
def test_float_rows_of_one_block(device, n, kind, with_weight, with_bias):
    # float rows of 8192-16384 without a residual are read twice on the GPU
    # (L2 asked to keep the row; eight packs a thread past 8192); 8184 stays
    # in registers. rms_norm's rows of 16385-32768 take one block of up to
    # 1024 threads at eight packs, layer_norm's clusters. 8200, 12000, 16388,
    # 20000 and 32764 leave the last pack group short of the block. Forward
    # and backward with each combination of the parameters.
    rows = 7
    x = torch.randn(rows, n, device=device) * 3 + 1
    w = torch.randn(n, device=device) if with_weight else None
    b = torch.randn(n, device=device) if with_bias else None
    g = torch.randn(rows, n, device=device)
    if kind == "layer":
        outputs_and_grads_match(lambda t, v, c: fr.layer_norm(t, n, v, c),
                                lambda t, v, c: F.layer_norm(t, [n], v, c), (x, w, b), (g,))
    else:
        outputs_and_grads_match(lambda t, v: fr.rms_norm(t, n, v), lambda t, v: F.rms_norm(t, [n], v), (x, w), (g,))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("rows, n, dtype", [(300, 16384, torch.bfloat16), (200, 12000, torch.float32),
                                            (300, 65536, torch.bfloat16), (40, 262144, torch.bfloat16)])
def test_wide_rows_walked_with_prefetch(kind, rows, n, dtype):
    # More rows than row groups: a block (16384 bf16) or a cluster of 2, 4
    # or 16 blocks (on Hopper) walks several rows, staging the next row's x
    # and dy while it reduces this one's, the weight and bias gradients summed
    # on the way.
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
    g = torch.randn(rows, n, device="cuda").to(dtype)
    leaves = (x, w, b) if kind == "layer" else (x, w)

    def ours(*t):
        return fr.layer_norm(t[0], n, *t[1:]) if kind == "layer" else fr.rms_norm(t[0], n, t[1])

    def theirs(*t):
        return F.layer_norm(t[0], [n], *t[1:]) if kind == "layer" else F.rms_norm(t[0], [n], t[1])

    def grads(f, *inputs):
        out = f(*inputs)
        return (out,) + torch.autograd.grad(out, inputs, g.to(out.dtype))

    as_double = [t.detach().double().requires_grad_() for t in leaves]
    for mine, torch_s, reference in zip(grads(ours, *leaves), grads(theirs, *leaves), grads(theirs, *as_double)):
        error_vs_reference(mine, torch_s, reference)


def torch_norm(kind, x, r, n, w, b):
    """torch's outputs of `kind` (layer, rms, add_layer, add_rms): (out, h) with the add, (out,) without."""
    h = x + r if kind.startswith("add") else x
    out = F.layer_norm(h, [n], w, b) if kind.endswith("layer") else F.rms_norm(h, [n], w)
    return (out, h) if kind.startswith("add") else (out,)


def our_norm(kind, x, r, n, w, b):
    """fastreduce's outputs of `kind`, as torch_norm returns them."""
    if kind == "add_layer":
        return fr.add_layer_norm(x, r, n, w, b)
    if kind == "add_rms":
        return fr.add_rms_norm(x, r, n, w)
    return (fr.layer_norm(x, n, w, b) if kind == "layer" else fr.rms_norm(x, n, w),)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["layer", "rms", "add_layer", "add_rms"])
@pytest.mark.parametrize("n, dtype", [(16384, torch.float32), (32768, torch.bfloat16), (65536, torch.float32),
                                      (262144, torch.bfloat16), (262144, torch.float32), (8192, torch.float64),
                                      (524288, torch.bfloat16), (40000, torch.float32), (100000, torch.float32),
                                      (40000, torch.float64), (20000, torch.bfloat16), (100000, torch.bfloat16),
                                      (131072, torch.float32), (32768, torch.float32), (65536, torch.bfloat16),
                                      (151936, torch.bfloat16), (163840, torch.float16), (80000, torch.float32),
                                      (40000, torch.bfloat16), (45000, torch.bfloat16)])
def test_forward_of_more_cluster_rows_than_a_wave(kind, n, dtype):
    # More rows than a wave of clusters holds (on Hopper), in clusters of 2
    # to 16 blocks: without the fused add, the pipelined walk (8 packs a
    # thread, 64-512 threads a block in clusters of 8 or more: two-byte rows
    # of 32769-524288, float rows of 16385-262144; 5 packs in 8 blocks of 512
    # at 151936 and 163840, in 16 of 256 at 80000 floats, in 8 of 128 and
    # 160 at 40000 and 45000 two-byte; two-byte rows of 16385-32768 (20000,
    # 32768) and rms_norm's float ones take one block of up to 1024 threads
    # instead; 16 blocks of 512 at 524288 bf16 and 262144 floats); with the
    # add, or for doubles, the lanes kernel (4 packs a thread; 8 for 524288
    # bf16 and for float and
    # double rows past 32768 and 16384, which load the next row during each
    # row's exchange unless they add); 20000, 40000 and 100000: rows short of
    # their clusters' packs.
    # Outputs, h and the statistics against torch and a float64 reference.
    rows = 2**23 // n + 3
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype)
    r = torch.randn(rows, n, device="cuda").to(dtype)
    w = torch.randn(n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)

    if kind == "layer":
        out, mean, rstd = torch.ops.fastreduce.layer_norm(x, [n], w, b, 1e-5)
        _, ref_mean, ref_rstd = torch.ops.aten.native_layer_norm(x.double(), [n], w.double(), b.double(), 1e-5)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-4, atol=1e-5)
        ours = (out,)
    else:
        ours = our_norm(kind, x, r, n, w, b)
    for mine, torch_s, reference in zip(ours, torch_norm(kind, x, r, n, w, b),
                                        torch_norm(kind, x.double(), r.double(), n, w.double(), b.double())):
        error_vs_reference(mine, torch_s, reference)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["layer", "rms", "add_layer", "add_rms"])
@pytest.mark.parametrize("params", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, rows", [(20000, 300), (65536, 300), (151936, 40), (262144, 35)])
def test_walking_cluster_rows_with_every_parameter_combination(kind, params, dtype, n, rows):
    # Rows of 20000-262144 take clusters of 2-16 blocks (20000 without the
    # add, but for layer_norm's float rows: one block a row), which walk
    # several rows each (on Hopper; the pipelined kernel without the add, the
    # lanes kernel's walks with it) with the weight and bias they hold in shared
    # memory: every combination of the two, against torch and a float64
    # reference.
    if kind.endswith("rms") and params in ("bias", "both"):
        pytest.skip("rms_norm has no bias")
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype)
    r = torch.randn(rows, n, device="cuda").to(dtype)
    w = torch.randn(n, device="cuda").to(dtype) if params in ("weight", "both") else None
    b = torch.randn(n, device="cuda").to(dtype) if params in ("bias", "both") else None

    def double(t):
        return None if t is None else t.double()

    for mine, torch_s, reference in zip(our_norm(kind, x, r, n, w, b), torch_norm(kind, x, r, n, w, b),
                                        torch_norm(kind, x.double(), r.double(), n, double(w), double(b))):
        error_vs_reference(mine, torch_s, reference)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["layer", "rms", "add_layer", "add_rms"])
@pytest.mark.parametrize("params", ["none", "weight", "bias", "both"])
def test_backward_of_float_rows_in_eight_pack_clusters(kind, params):
    # Float rows of 262144 take clusters of 16 blocks at eight packs a
    # thread (Hopper); with a weight or bias each cluster walks a chunk of
    # rows (37: more than a wave of clusters, not a multiple of it), summing
    # the parameter gradients on the way. Every gradient, h's included,
    # against torch and a float64 reference.
    if kind.endswith("rms") and params in ("bias", "both"):
        pytest.skip("rms_norm has no bias")
    rows, n = 37, 262144
    x = torch.randn(rows, n, device="cuda") * 3 + 1
    r = torch.randn(rows, n, device="cuda") if kind.startswith("add") else None
    w = torch.randn(n, device="cuda") if params in ("weight", "both") else None
    b = torch.randn(n, device="cuda") if params in ("bias", "both") else None
    g = (torch.randn(rows, n, device="cuda"), torch.randn(rows, n, device="cuda"))
    outputs_and_grads_match(lambda t, u, v, c: our_norm(kind, t, u, n, v, c),
                            lambda t, u, v, c: torch_norm(kind, t, u, n, v, c), (x, r, w, b), g)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_wide_rows_than_resident_clusters(dtype):
    # Wide rows run in clusters of blocks (Hopper): 600 rows of 65536 are
    # many more clusters than are resident at once.
    n = 65536
    x = (torch.randn(600, n, device="cuda") * 3 + 1).to(dtype)
    w = torch.randn(n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    error_vs_reference(fr.layer_norm(x, n, w, b), F.layer_norm(x, [n], w, b),
                       F.layer_norm(x.double(), [n], w.double(), b.double()))
    error_vs_reference(fr.rms_norm(x, n, w, 1e-6), F.rms_norm(x, [n], w, 1e-6),
                       F.rms_norm(x.double(), [n], w.double(), 1e-6))


# 1, 33: element-wise rows; 200, 768: warp rows; 1500, 4096: block rows in
# registers; 20000: past the registers (shared memory or streamed).
RMS_WIDTHS = [1, 33, 200, 768, 1500, 4095, 4096, 20000]


def default_eps(dtype):
    """rms_norm's eps=None: float32's epsilon, float64's for float64 input (as torch)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rms_reference(x, shape, weight, eps):
    dims = tuple(range(-len(shape), 0))
    eps = default_eps(x.dtype) if eps is None else eps
    h = x.double()
    out = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    return out * weight.double() if weight is not None else out


def grads_of(fn, inputs, grad_outputs):
    """Gradients of fn(*inputs) (a tensor or a tuple) for the inputs that need them."""
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    return outputs, torch.autograd.grad(outputs, wanted, grad_outputs[: len(outputs)], allow_unused=True)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) if t is not None else None for t in tensors]


def outputs_and_grads_match(ours, theirs, inputs, grad_outputs):
    """ours(*inputs)'s outputs and gradients (None inputs left out) against theirs and theirs in float64."""
    mine, torch_own = grads_of(ours, leaves(*inputs), grad_outputs), grads_of(theirs, leaves(*inputs), grad_outputs)
    as_double = [t.double() if t is not None else None for t in inputs]
    exact = grads_of(theirs, leaves(*as_double), [g.double() for g in grad_outputs])
    for a, b, c in zip(mine[0] + mine[1], torch_own[0] + torch_own[1], exact[0] + exact[1]):
        error_vs_reference(a, b, c)


# ---- rms_norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", RMS_WIDTHS)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_forward_and_backward(device, dtype, n, with_weight):
    rows = 3 if n > 4096 else 37
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype)
    w = (torch.randn(n, device=device) + 1).to(dtype) if with_weight else None
    g = torch.randn(rows, n, device=device).to(dtype)
    x_, w_ = leaves(x, w)
    (out,), grads = grads_of(lambda x, w: fr.rms_norm(x, n, w), (x_, w_), (g,))
    assert out.dtype == dtype and out.shape == x.shape
    x64, w64 = leaves(x.double(), w.double() if w is not None else None)
    (ref,), ref_grads = grads_of(lambda x, w: rms_reference(x, [n], w, default_eps(dtype)),
                                     (x64, w64), (g.double(),))
    close_to_reference(out, ref)
    torch.testing.assert_close(out, F.rms_norm(x, [n], w), rtol=TOLERANCE[dtype] * 4, atol=TOLERANCE[dtype] * 4)
    _, torch_grads = grads_of(lambda x, w: F.rms_norm(x, [n], w), leaves(x, w), (g,))
    for ours, reference, theirs in zip(grads, ref_grads, torch_grads):
        close_to_reference(ours, reference, theirs=theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_eps_shapes_and_layouts(device):
    x = torch.randn(2, 3, 4, 5, device=device)
    for shape in ([5], [4, 5], [3, 4, 5]):
        for eps in (None, 1e-3):
            w = torch.randn(shape, device=device)
            torch.testing.assert_close(fr.rms_norm(x, shape, w, eps), F.rms_norm(x, shape, w, eps))
    tiny = torch.full((2, 4), 1e-3, device=device)  # the default eps matters here
    torch.testing.assert_close(fr.rms_norm(tiny, 4), F.rms_norm(tiny, [4]))
    torch.testing.assert_close(fr.rms_norm(tiny.half(), 4), F.rms_norm(tiny.half(), [4]))
    transposed = torch.randn(64, 40, device=device).t()
    torch.testing.assert_close(fr.rms_norm(transposed, 64), F.rms_norm(transposed, [64]))
    shifted = offset_view(torch.randn(9, 48, device=device), 1)
    torch.testing.assert_close(fr.rms_norm(shifted, 48), F.rms_norm(shifted, [48]))
    out, rstd = torch.ops.fastreduce.rms_norm(x, [4, 5], None, None)
    assert rstd.shape == (2, 3, 1, 1)
    assert fr.rms_norm(torch.randn(0, 8, device=device), 8).shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_float_weight_with_half_input(device, dtype):
    x = torch.randn(16, 256, device=device).to(dtype)
    w = torch.randn(256, device=device, requires_grad=True)
    x_ = x.clone().requires_grad_(True)
    out = fr.rms_norm(x_, 256, w)
    assert out.dtype == dtype
    close_to_reference(out, rms_reference(x, [256], w.detach(), default_eps(dtype)))
    out.backward(torch.ones_like(out))
    assert w.grad.dtype == torch.float32 and x_.grad.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [8, 16, 40, 64, 72, 128, 200, 256, 264, 384, 456, 512])
def test_short_rows_several_a_warp(device, dtype, n):
    # Head-size rows (a 16-byte pack a lane: two-byte rows up to 256, float
    # up to 128; three packs a lane for two-byte rows of 257-384, two up to
    # 512, some lanes idle at 264 and 456): 1-32 lanes a row, several rows a
    # warp, up to four packs a lane in flight; row counts that
    # leave the last warp's segments and steps partly empty, every parameter
    # combination (kernels compiled for every one given, and for the
    # residual; float32 ones beside two-byte rows too), a row of inf and
    # one of NaN, the fused adds. Against torch (and aten's statistics) and
    # float64.
    rows = 997
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    x[5, 3], x[700, 0] = float("inf"), float("nan")
    w, b = torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    finite[[5, 700]] = False
    for weight, bias in [(w, b), (w, None), (None, b), (None, None)]:
        out, mean, rstd = torch.ops.fastreduce.layer_norm(x, [n], weight, bias, 1e-5)
        ref_out, ref_mean, ref_rstd = torch.ops.aten.native_layer_norm(x, [n], weight, bias, 1e-5)
        exact = F.layer_norm(x.double(), [n], None if weight is None else weight.double(),
                             None if bias is None else bias.double(), 1e-5)
        assert torch.equal(out.isnan(), ref_out.isnan())
        error_vs_reference(out[finite], ref_out[finite], exact[finite])
        torch.testing.assert_close(mean[finite].double(), ref_mean[finite].double(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(rstd[finite].double(), ref_rstd[finite].double(), rtol=1e-2, atol=1e-2)
    for weight in (w, None):
        out = fr.rms_norm(x, n, weight, 1e-6)
        ref_out = F.rms_norm(x, [n], weight, 1e-6)
        exact = F.rms_norm(x.double(), [n], None if weight is None else weight.double(), 1e-6)
        assert torch.equal(out.isnan(), ref_out.isnan())
        error_vs_reference(out[finite], ref_out[finite], exact[finite])
    if dtype != torch.float32:  # float32 parameters: float math, rounded to dtype once
        out = fr.layer_norm(x, n, w.float(), b.float(), 1e-5)
        ref_out = F.layer_norm(x.float(), [n], w.float(), b.float(), 1e-5).to(dtype)
        exact = F.layer_norm(x.double(), [n], w.double(), b.double(), 1e-5)
        error_vs_reference(out[finite], ref_out[finite], exact[finite])
        out = fr.rms_norm(x, n, w.float(), 1e-6)
        ref_out = F.rms_norm(x.float(), [n], w.float(), 1e-6).to(dtype)
        exact = F.rms_norm(x.double(), [n], w.double(), 1e-6)
        error_vs_reference(out[finite], ref_out[finite], exact[finite])
    r = torch.randn(rows, n, device=device).to(dtype)
    h = x + r  # torch's add, rounded once
    for weight, bias in [(w, b), (w, None), (None, b), (None, None)]:
        wide = [None if t is None else t.double() for t in (weight, bias)]
        for out, h_out, ref_out, exact in [
            (*fr.add_layer_norm(x, r, n, weight, bias, 1e-5), F.layer_norm(h, [n], weight, bias, 1e-5),
             F.layer_norm(h.double(), [n], *wide, 1e-5)),
            (*fr.add_rms_norm(x, r, n, weight, 1e-6), F.rms_norm(h, [n], weight, 1e-6),
             F.rms_norm(h.double(), [n], wide[0], 1e-6)),
        ]:
            torch.testing.assert_close(h_out, h, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(out.isnan(), ref_out.isnan())
            error_vs_reference(out[finite], ref_out[finite], exact[finite])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [8, 40, 64, 72, 128, 256])
@pytest.mark.parametrize("rows", [5, 997, 70001])
def test_short_rows_backward(device, dtype, n, rows):
    # The backward of those rows: several a warp, each block's lanes summing
    # their columns' parameter gradients into one partial row (70001 rows:
    # many rows a block). Every parameter combination, and the fused add's
    # residual gradient, float32 parameters too; against torch and float64.
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    r = torch.randn(rows, n, device=device).to(dtype)
    g, g_res = torch.randn(rows, n, device=device).to(dtype), torch.randn(rows, n, device=device).to(dtype)
    w, b = torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)
    mixed = [(w.float(), b.float())] if dtype != torch.float32 else []
    for weight, bias in [(w, b), (w, None), (None, b), (None, None)] + mixed:
        inputs = [t for t in (x, weight, bias) if t is not None]
        # float64 on the CPU: torch 2.11's CUDA backward fails on a bias
        # without a weight ("invalid gradient at index 2"); nor does torch mix
        # float32 parameters into half rows.
        mine, wide, theirs = leaves(*inputs), leaves(*(t.cpu().double() for t in inputs)), leaves(*inputs)

        def params(ts):
            ts = list(ts[1:])
            return (ts.pop(0) if weight is not None else None), (ts.pop(0) if bias is not None else None)

        grads = torch.autograd.grad(fr.layer_norm(mine[0], n, *params(mine)), mine, g)
        exact = torch.autograd.grad(F.layer_norm(wide[0], [n], *params(wide)), wide, g.cpu().double())
        skip_torch = (weight is not None and weight.dtype != dtype) or (
            weight is None and bias is not None and device == "cuda")
        torch_grads = ([None] * len(inputs) if skip_torch
                       else torch.autograd.grad(F.layer_norm(theirs[0], [n], *params(theirs)), theirs, g))
        for ours_g, exact_g, theirs_g in zip(grads, exact, torch_grads):
            close_to_reference(ours_g, exact_g.to(device), theirs=theirs_g)
    for weight in (w, None):
        inputs = [t for t in (x, r, weight) if t is not None]
        mine, wide = leaves(*inputs), leaves(*(t.double() for t in inputs))
        out, h = fr.add_rms_norm(mine[0], mine[1], n, mine[2] if weight is not None else None)
        grads = torch.autograd.grad((out, h), mine, (g, g_res))
        h64 = wide[0] + wide[1]
        h64 = h64 + (h64.to(dtype).double() - h64).detach()  # the rounded sum the op normalises
        out64 = F.rms_norm(h64, [n], wide[2] if weight is not None else None)
        exact = torch.autograd.grad((out64, h64), wide, (g.double(), g_res.double()))
        for ours_g, exact_g in zip(grads, exact):
            close_to_reference(ours_g, exact_g)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n, layout, rows", [(1025, "odd", 19), (4095, "odd", 19), (4095, "odd", 5), (8191, "odd", 19),
                                             (12001, "odd", 7), (16383, "odd", 19), (4096, "offset", 19),
                                             (6000, "offset", 19), (4096, "weight_offset", 19),
                                             (8200, "weight_offset", 19), (4095, "bias_offset", 19),
                                             (12001, "bias_offset", 7)])
def test_rows_not_whole_packs_every_option(device, dtype, n, layout, rows):
    # Rows past a warp that are not whole 16-byte packs: odd widths (each row
    # starting at another place in its pack), an input at storage offset 1
    # (every row alike), parameters at offset 1 beside aligned rows, or the
    # bias at offset 3 beside an aligned weight (their shifts a different
    # number of words: layer_norm's forward shifts each alone). CUDA
    # reads them in packs from each row's first boundary, the forwards
    # without a residual of 4097-16384 (bf16 layer_norm's past 8192) read
    # twice, four or eight packs a thread. Every parameter
    # combination, float32 parameters beside half rows, and the fused adds
    # with their residual gradient, forward and backward against float64.
    # Five rows of 4095: fewer than the classes of rows that start alike (8),
    # so the parameter gradients take the separate pass.
    x = (torch.randn(rows, n, device=device) * 3 + 1).to(dtype)
    r = torch.randn(rows, n, device=device).to(dtype)
    g, g_res = torch.randn(rows, n, device=device).to(dtype), torch.randn(rows, n, device=device).to(dtype)
    w, b = torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)
    if layout == "offset":
        x, r, g, g_res = (offset_view(t, 1) for t in (x, r, g, g_res))
    if layout == "weight_offset":
        w, b = offset_view(w, 1), offset_view(b, 1)
    if layout == "bias_offset":
        b = offset_view(b, 3)
    mixed = [(w.float(), b.float())] if dtype != torch.float32 else []
    for weight, bias in [(w, b), (w, None), (None, b), (None, None)] + mixed:
        inputs = [t for t in (x, weight, bias) if t is not None]
        mine, wide = leaves(*inputs), leaves(*(t.cpu().double() for t in inputs))

        def params(ts):
            ts = list(ts[1:])
            return (ts.pop(0) if weight is not None else None), (ts.pop(0) if bias is not None else None)

        out = fr.layer_norm(mine[0], n, *params(mine))
        out64 = F.layer_norm(wide[0], [n], *params(wide))
        close_to_reference(out, out64.to(device))
        grads = torch.autograd.grad(out, mine, g)
        exact = torch.autograd.grad(out64, wide, g.cpu().double())
        for ours_g, exact_g in zip(grads, exact):
            close_to_reference(ours_g, exact_g.to(device))
        if bias is None:
            out = fr.rms_norm(mine[0], n, params(mine)[0])
            out64 = F.rms_norm(wide[0], [n], params(wide)[0], torch.finfo(torch.float32).eps)
            close_to_reference(out, out64.to(device))
            grads = torch.autograd.grad(out, mine, g)
            exact = torch.autograd.grad(out64, wide, g.cpu().double())
            for ours_g, exact_g in zip(grads, exact):
                close_to_reference(ours_g, exact_g.to(device))
    for weight, bias in [(w, b), (None, None)]:
        inputs = [t for t in (x, r, weight, bias) if t is not None]
        mine, wide = leaves(*inputs), leaves(*(t.double() for t in inputs))
        for kind in ("layer", "rms"):
            h64 = wide[0] + wide[1]
            h64 = h64 + (h64.to(dtype).double() - h64).detach()  # the rounded sum the op normalises
            if kind == "layer":
                out, h = fr.add_layer_norm(mine[0], mine[1], n, *mine[2:])
                out64 = F.layer_norm(h64, [n], *wide[2:])
            else:
                out, h = fr.add_rms_norm(mine[0], mine[1], n, *mine[2:3])
                out64 = F.rms_norm(h64, [n], *wide[2:3], eps=torch.finfo(torch.float32).eps)
            close_to_reference(out, out64)
            grads = torch.autograd.grad((out, h), mine[:3] if kind == "rms" else mine, (g, g_res))
            exact = torch.autograd.grad((out64, h64), wide[:3] if kind == "rms" else wide,
                                        (g.double(), g_res.double()))
            for ours_g, exact_g in zip(grads, exact):
                close_to_reference(ours_g, exact_g)


def half_ulp(exact, dtype):
    """Half a unit in the last place of `dtype` at each exact value (normal range)."""
    mantissa = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    exponent = torch.floor(torch.log2(exact.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.exp2(exponent - mantissa) / 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [77, 96, 1024, 1600, 4096, 20000])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_float32_parameters_beside_half_input_round_once(device, dtype, n, norm):
    # float32 weight and bias with half rows (autocast leaves rms_norm's so):
    # the parameters are applied as they are, so the output and the input
    # gradient are the exact values rounded once, within half a unit in the
    # last place and float32's error (rounded to the rows' dtype first, they
    # were up to a unit off). Every parameter combination, forward and
    # backward; widths of each kernel shape (several rows a warp, a warp a
    # row packed and not, a block a row, a cluster a row).
    rows, eps = (4 if n > 10000 else 64), 1e-5
    centered, fused = norm.endswith("layer_norm"), norm.startswith("add")
    data = {"x": (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype)}
    if fused:
        data["r"] = torch.randn(rows, n, device=device).to(dtype)
    g = torch.randn(rows, n, device=device).to(dtype)

    def ours(t):
        if fused and centered:
            return fr.add_layer_norm(t["x"], t["r"], n, t.get("w"), t.get("b"), eps)[0]
        if fused:
            return fr.add_rms_norm(t["x"], t["r"], n, t.get("w"), eps)[0]
        if centered:
            return fr.layer_norm(t["x"], n, t.get("w"), t.get("b"), eps)
        return fr.rms_norm(t["x"], n, t.get("w"), eps)

    def exact(t):  # the rows the op normalises: x + r rounded to dtype, as torch's add (not its gradient)
        h = t["x"]
        if fused:
            h = h + t["r"]
            h = h + (h.to(dtype).double() - h).detach()
        return F.layer_norm(h, [n], t.get("w"), t.get("b"), eps) if centered else F.rms_norm(h, [n], t.get("w"), eps)

    for with_weight, with_bias in [(True, True), (True, False), (False, True)] if centered else [(True, False)]:
        params = {"w": torch.randn(n, device=device) * 0.3 + 1} if with_weight else {}
        if with_bias:
            params["b"] = torch.randn(n, device=device) * 0.3
        mine = {k: v.detach().clone().requires_grad_() for k, v in {**data, **params}.items()}
        wide = {k: v.detach().double().requires_grad_() for k, v in mine.items()}
        out, reference = ours(mine), exact(wide)
        assert out.dtype == dtype
        assert ((out.double() - reference).abs() <= half_ulp(reference, dtype) * 1.001 + 1e-6).all()
        grads = dict(zip(mine, torch.autograd.grad(out, list(mine.values()), g)))
        exact_grads = dict(zip(wide, torch.autograd.grad(reference, list(wide.values()), g.double())))
        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) cancels: float32's
        # error is relative to the row's terms, not to dx.
        dx, exact_dx = grads["x"], exact_grads["x"]
        slack = 2e-5 * exact_dx.abs().amax(-1, keepdim=True) + 1e-6
        assert dx.dtype == dtype
        assert ((dx.double() - exact_dx).abs() <= half_ulp(exact_dx, dtype) * 1.001 + slack).all()
        for name in params:
            assert grads[name].dtype == torch.float32
            torch.testing.assert_close(grads[name].double(), exact_grads[name], rtol=1e-4,
                                       atol=1e-4 * exact_grads[name].abs().max().item())


# ---- fused residual add + norm


def add_norm_reference(kind, x, r, shape, w, b, eps):
    """The unfused computation: h rounded to the input dtype as torch's add."""
    h = (x + r).double() if x.dtype != torch.float64 else x + r
    if kind == "layer":
        return F.layer_norm(h, shape, w, b, eps), h
    return rms_reference(h, shape, w, eps), h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [264, 512, 520, 744, 1064, 1288, 1536, 1600, 1792])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_half_add_norm_rows_a_warp_staged_residual(device, dtype, n, kind):
    # Two-byte rows with the fused add of five to seven 16-byte packs a lane
    # (1025-1792 wide), and rms_norm's of two and three (257-768), run a warp
    # a row on the GPU with the residual staged in shared memory (264, 520,
    # 744, 1064, 1288, 1600: the last pack group short of the warp; 45 rows:
    # the last block short of its four warps). Every weight and bias option,
    # forward and backward.
    check_add_norm(device, dtype, 45, n, kind)


def torch_add_norm(kind, x, r, shape, w, b, eps):
    """torch's own unfused computation in the inputs' dtype."""
    h = x + r
    return (F.layer_norm(h, shape, w, b, eps) if kind == "layer" else F.rms_norm(h, shape, w, eps)), h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1, 33, 768, 1000, 1500, 4096, 8192, 12000, 16384, 20000, 65536, 262144])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_forward_and_backward(device, dtype, n, kind):
    # On the GPU, 8192 (two-byte and float) and two-byte 12000 and 16384 run
    # the forward read twice, h written by the first read and read back.
    check_add_norm(device, dtype, 3 if n > 4096 else 29, n, kind)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1000, 4096, 8192])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_backward_walking_rows(dtype, n, kind):
    # Each warp (1000 wide, 5000 rows) or block (700 rows) of the backward
    # walks several rows, summing the parameter gradients on the way and
    # adding each row's residual gradient to its dx, two-byte rows from
    # their shared-memory stage (with the next row's x and dy staged too in
    # blocks where the SM has room: all but float32 8192).
    check_add_norm("cuda", dtype, 5000 if n <= 1024 else 700, n, kind)


def check_add_norm(device, dtype, rows, n, kind):
    """The fused add + norm, every weight and bias option, forward and backward
    (a gradient into both outputs) against float64 and torch."""
    shape = [n]
    x = torch.randn(rows, n, device=device).to(dtype)
    r = (torch.randn(rows, n, device=device) * 2).to(dtype)
    options = list(itertools.product([True, False], repeat=2)) if kind == "layer" else [(True, False), (False, False)]
    for with_weight, with_bias in options:
        w = torch.randn(n, device=device).to(dtype) if with_weight else None
        b = torch.randn(n, device=device).to(dtype) if with_bias else None
        g_out = torch.randn(rows, n, device=device).to(dtype)
        g_res = torch.randn(rows, n, device=device).to(dtype)
        if kind == "layer":
            fn = lambda x, r, w, b: fr.add_layer_norm(x, r, shape, w, b, 1e-5)  # noqa: E731
        else:
            fn = lambda x, r, w, b: fr.add_rms_norm(x, r, shape, w, 1e-6)  # noqa: E731
        inputs = leaves(x, r, w, b)
        (out, h), grads = grads_of(fn, inputs, (g_out, g_res))
        ref_inputs = leaves(*(t.double() if t is not None else None for t in (x, r, w, b)))
        eps = 1e-5 if kind == "layer" else 1e-6
        (ref_out, ref_h), ref_grads = grads_of(
            lambda x, r, w, b: add_norm_reference(kind, x, r, shape, w, b, eps),
            ref_inputs, (g_out.double(), g_res.double()))
        torch.testing.assert_close(h, (x.float() + r.float()).to(dtype), rtol=0, atol=0)
        # The norm of the rounded h: compare with the reference on that h.
        expected, _ = add_norm_reference(kind, h.double(), torch.zeros_like(h, dtype=torch.float64), shape,
                                         w.double() if w is not None else None,
                                         b.double() if b is not None else None, eps)
        close_to_reference(out, expected)
        assert len(grads) == len(ref_grads)
        _, torch_grads = grads_of(lambda x, r, w, b: torch_add_norm(kind, x, r, shape, w, b, eps),
                                  leaves(x, r, w, b), (g_out, g_res))
        for ours, reference, theirs in zip(grads, ref_grads, torch_grads):
            close_to_reference(ours, reference, theirs=theirs)
        torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)  # d input = d residual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_mixed_dtypes_promote_like_add(device, kind):
    """A float32 residual stream beside bfloat16 sublayer outputs (autocast)."""
    x = torch.randn(6, 64, device=device).bfloat16()
    r = torch.randn(6, 64, device=device)
    w = torch.randn(64, device=device)
    fn = fr.add_layer_norm if kind == "layer" else fr.add_rms_norm
    inputs = leaves(x, r, w)
    (out, h), grads = grads_of(lambda x, r, w: fn(x, r, 64, w), inputs, (torch.ones(6, 64, device=device),) * 2)
    (ref_out, ref_h), ref_grads = grads_of(lambda x, r, w: torch_add_norm(kind, x, r, [64], w, None, 1e-5
                                                                          if kind == "layer" else None),
                                           leaves(x, r, w), (torch.ones(6, 64, device=device),) * 2)
    assert out.dtype == h.dtype == torch.float32
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(out, ref_out)
    for ours, theirs in zip(grads, ref_grads):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_only_one_output_used(device):
    x, r = leaves(torch.randn(5, 64, device=device), torch.randn(5, 64, device=device))
    out, h = fr.add_rms_norm(x, r, 64)
    out.sum().backward()  # h unused: its gradient is zero
    x2, r2 = leaves(x.detach(), r.detach())
    F.rms_norm(x2 + r2, [64]).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    x3, r3 = leaves(x.detach(), r.detach())
    fr.add_layer_norm(x3, r3, 64)[1].pow(2).sum().backward()  # only h used
    torch.testing.assert_close(x3.grad, 2 * (x + r).detach())


# ---- gradcheck, opcheck, compile, autocast, modules


@pytest.mark.parametrize("device", DEVICES)
def test_rms_and_add_norm_gradcheck(device):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)

    x, r, w, b = t(3, 4, 6), t(3, 4, 6), t(6), t(6)
    assert torch.autograd.gradcheck(lambda x, w: fr.rms_norm(x, 6, w), (x, w))
    assert torch.autograd.gradcheck(lambda x: fr.rms_norm(x, [4, 6]), (x,))
    assert torch.autograd.gradcheck(lambda x, r, w, b: fr.add_layer_norm(x, r, 6, w, b), (x, r, w, b))
    assert torch.autograd.gradcheck(lambda x, r, w: fr.add_rms_norm(x, r, 6, w), (x, r, w))


def rms_and_add_norm_samples(device):
    x = torch.randn(4, 24, device=device, requires_grad=True)
    r = torch.randn(4, 24, device=device, requires_grad=True)
    w = torch.randn(24, device=device, requires_grad=True)
    b = torch.randn(24, device=device, requires_grad=True)
    ops = torch.ops.fastreduce
    return [
        (ops.rms_norm.default, (x, [24], w, None), {}),
        (ops.rms_norm.default, (x, [24], None, 1e-3), {}),
        (ops.add_layer_norm.default, (x, r, [24], w, b, 1e-5), {}),
        (ops.add_layer_norm.default, (x, r, [24], None, None, 1e-5), {}),
        (ops.add_rms_norm.default, (x, r, [24], w, None), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_rms_and_add_norm_opcheck(device):
    for op, args, kwargs in rms_and_add_norm_samples(device):
        torch.library.opcheck(op, args, kwargs)


class LlamaBlock(torch.nn.Module):
    """Pre-norm residual stream with RMSNorm and a cross-entropy head."""

    def __init__(self, width=32, vocab=50):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.mix, self.mlp = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x, target):
        y, h = fr.add_rms_norm(self.mix(self.norm1(x)), x, x.shape[-1], self.norm2.weight)
        h = h + self.mlp(y)
        return fr.cross_entropy(self.head(h).flatten(0, -2), target.flatten(), label_smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_and_backward(device):
    block = LlamaBlock().to(device)
    assert fr.patch(block) == 2
    x = torch.randn(2, 9, 32, device=device, requires_grad=True)
    target = torch.randint(0, 50, (2, 9), device=device)
    eager = block(x, target)
    (eager_grad,) = torch.autograd.grad(eager, x)
    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    out = compiled(x, target)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    (grad,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_output_dtypes(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast is bfloat16")
    x = torch.randn(4, 16, device=device)
    w = torch.randn(16, device=device)
    with torch.autocast(device, dtype=dtype):
        cases = [(fr.rms_norm(x.to(dtype), 16, w), F.rms_norm(x.to(dtype), [16], w))]
    for ours, theirs in cases:
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_module_and_patch(device):
    ref = torch.nn.RMSNorm(12, eps=1e-4).to(device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    ours = fr.nn.RMSNorm(12, eps=1e-4).to(device)
    ours.load_state_dict(ref.state_dict())
    assert set(ours.state_dict()) == set(ref.state_dict())
    x = torch.randn(3, 12, device=device)
    torch.testing.assert_close(ours(x), ref(x))
    model = torch.nn.Sequential(torch.nn.RMSNorm(12), torch.nn.RMSNorm(12, elementwise_affine=False),
                                torch.nn.LayerNorm(12)).to(device)
    expected = model(x)
    assert fr.patch(model) == 3
    assert type(model[0]) is fr.nn.RMSNorm and type(model[1]) is fr.nn.RMSNorm
    torch.testing.assert_close(model(x), expected)


@requires_cuda
@pytest.mark.cuda
def test_cuda_graph_capture_and_determinism():
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    logits = torch.randn(256, 5000, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 5000, (256,), device="cuda")

    def step():
        out, h = fr.add_rms_norm(x, r, 1024, w)
        loss = fr.cross_entropy(logits, target, label_smoothing=0.1)
        (dw,) = torch.autograd.grad(out.float().square().sum(), w)
        return out, h, loss, dw

    expected, captured = side_stream_then_graph(step)
    for a, b in zip(captured, expected):
        assert torch.equal(a, b)  # bitwise: the same kernels, no atomics
