"""layer_norm, softmax and causal_softmax against torch, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import fastreduce_torch as fr
from conftest import DEVICES, requires_cuda, side_stream_then_graph

LOW = [torch.float32, torch.float16, torch.bfloat16]
WIDTHS = [1, 31, 33, 200, 768, 1025, 4096, 70000]


def error_vs_reference(ours, theirs, reference):
    """Our error against float64 must stay within twice torch's own (plus a floor)."""
    ours_err = (ours.double() - reference).abs().max().item()
    theirs_err = (theirs.double() - reference).abs().max().item()
    floor = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[ours.dtype]
    assert ours_err <= 2 * theirs_err + floor, (ours_err, theirs_err)


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
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1, 33, 1024, 1500, 5000, 70000])
def test_softmax(device, dtype, n):
    x = (torch.randn(5, n, device=device) * 4).to(dtype)
    reference = torch.softmax(x.double(), -1)
    error_vs_reference(fr.softmax(x), torch.softmax(x, -1), reference)
    y = torch.randn(4, 6, 7, device=device)
    for dim in (0, 1, -1):
        torch.testing.assert_close(fr.softmax(y, dim), torch.softmax(y, dim))
    assert fr.softmax(x, dtype=torch.float32).dtype == torch.float32


def causal_reference(scores, scale):
    t = scores.shape[-1]
    upper = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax((scale * scores).masked_fill(upper, float("-inf")), -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("t", [1, 7, 64, 257])
def test_causal_softmax(device, dtype, t):
    scores = torch.randn(2, 3, t, t, device=device).to(dtype)
    scale = 0.125
    ours = fr.causal_softmax(scores, scale)
    error_vs_reference(ours, causal_reference(scores, scale), causal_reference(scores.double(), scale))
    assert bool((ours.triu(1) == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_causal_softmax_reads_only_lower_triangle(device):
    scores = torch.randn(3, 65, 65, device=device)
    upper = torch.ones(65, 65, dtype=torch.bool, device=device).triu(1)
    poisoned = scores.masked_fill(upper, float("nan"))
    ours = fr.causal_softmax(poisoned, 0.5)
    assert not ours.isnan().any()
    torch.testing.assert_close(ours, causal_reference(scores, 0.5))
    assert bool((ours.triu(1) == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = torch.randn(3, 4, 6, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: fr.layer_norm(x, [4, 6], w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: fr.layer_norm(x, 6), (x,))
    assert torch.autograd.gradcheck(lambda x: fr.softmax(x, 1), (x,))
    s = torch.randn(2, 5, 5, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: fr.causal_softmax(s, 0.7), (s,))


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
    s = torch.randn(2, 33, 33, device=device, requires_grad=True)
    gs = torch.randn(2, 33, 33, device=device)
    torch.testing.assert_close(torch.autograd.grad(fr.causal_softmax(s, 0.3), s, gs)[0],
                               torch.autograd.grad(causal_reference(s, 0.3), s, gs)[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(fr.softmax(x, 0), x, g)[0],
                               torch.autograd.grad(torch.softmax(x, 0), x, g)[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x = torch.randn(4, 6, device=device)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        fr.layer_norm(x, 5)
    with pytest.raises(RuntimeError, match="'weight' has shape"):
        fr.layer_norm(x, 6, torch.randn(5, device=device))
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        fr.softmax(x.int())
    with pytest.raises(IndexError):
        fr.softmax(x, 2)
    with pytest.raises(RuntimeError, match=r"\(\.\.\., T, T\)"):
        fr.causal_softmax(torch.randn(3, 4, 5, device=device))


def samples(device):
    x = torch.randn(3, 8, device=device)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    s = torch.randn(2, 6, 6, device=device)
    ops = torch.ops.fastreduce
    return [
        (ops.layer_norm.default, (x, [8], w, b, 1e-5), {}),
        (ops.layer_norm.default, (x, [8], None, None, 1e-5), {}),
        (ops.softmax.default, (x, 0), {"dtype": None}),
        (ops.softmax.default, (x.half(), -1), {"dtype": torch.float32}),
        (ops.causal_softmax.default, (s, 0.5), {}),
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
    torch.testing.assert_close(fr.nn.Softmax(dim=1)(x), torch.softmax(x, 1))


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
    torch.testing.assert_close(fr.softmax(x), torch.softmax(x, -1))
    ln = torch.ops.fastreduce.layer_norm(x, [96], None, None, 1e-5)[0]
    torch.testing.assert_close(ln, F.layer_norm(x, [96]))
    y = torch.randn(64, 96, device=device).to(dtype).requires_grad_()
    g = torch.randn(64 * 96 + 1, device=device).to(dtype)[1:].view(64, 96)
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    ours = torch.autograd.grad(fr.softmax(y), y, g)[0]
    theirs = torch.autograd.grad(torch.softmax(y, -1), y, g)[0]
    torch.testing.assert_close(ours, theirs, **tolerance)
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
    error_vs_reference(fr.softmax(x), torch.softmax(x, -1), torch.softmax(x.double(), -1))
    scores = (torch.randn(4, 40, 80, 80, device="cuda") * 4).to(dtype)  # 12800 rows of 1 to 80 entries
    error_vs_reference(fr.causal_softmax(scores, 0.3), causal_reference(scores, 0.3),
                       causal_reference(scores.double(), 0.3))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1025, 1600, 2049, 4096, 6144, 8192, 12000])
def test_long_rows(dtype, n):
    # Rows past 1024 run one block per row with the row in registers (16-byte
    # packs up to 8192 floats or 16384 halves, element-wise up to 2048), the
    # shared-memory kernels beyond: 2049 and 12000 floats take those. 6144
    # floats: 48 KiB of dynamic shared memory, past the limit with the static.
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
    for ours, theirs, reference in zip(grads(fr.softmax, x), grads(lambda t: torch.softmax(t, -1), x),
                                       grads(lambda t: torch.softmax(t, -1), as_double[0])):
        error_vs_reference(ours, theirs, reference)


@requires_cuda
@pytest.mark.cuda
def test_long_causal_rows_read_only_lower_triangle():
    t = 1100
    scores = torch.randn(2, t, t, device="cuda")
    upper = torch.ones(t, t, dtype=torch.bool, device="cuda").triu(1)
    poisoned = scores.masked_fill(upper, float("nan")).requires_grad_()
    ours = fr.causal_softmax(poisoned, 0.5)
    torch.testing.assert_close(ours, causal_reference(scores, 0.5))
    assert bool((ours.triu(1) == 0).all())
    g = torch.randn(2, t, t, device="cuda").masked_fill(upper, float("nan"))
    dx = torch.autograd.grad(ours, poisoned, g)[0]
    reference = scores.clone().requires_grad_()
    expected = torch.autograd.grad(causal_reference(reference, 0.5), reference, g.nan_to_num(0.0))[0]
    torch.testing.assert_close(dx, expected, rtol=1e-4, atol=1e-6)
    assert bool((dx.triu(1) == 0).all())
