"""softmax and causal_softmax against torch and float64, forward and backward."""

import pytest
import torch

import fastreduce_torch as fr
from conftest import DEVICES, error_vs_reference, requires_cuda

LOW = [torch.float32, torch.float16, torch.bfloat16]


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [8, 16, 40, 64, 72, 128, 200, 256])
def test_short_rows_several_a_warp(device, dtype, n):
    # Head-size rows (a 16-byte pack a lane: two-byte rows up to 256, float
    # up to 128): 1-32 lanes a row, several rows a warp, four a lane in
    # flight, 997 rows leaving the last warp partly empty. Rows of -inf, NaN,
    # +inf, a value past 2^24 (natural units), ties and a far outlier, in the
    # same warps as plain rows; forward and backward against torch and float64.
    rows = 997
    x = (torch.randn(rows, n, device=device) * 3).to(dtype)
    x[3] = float("-inf")
    x[5, n // 2] = float("nan")
    x[7, n - 1] = float("inf")
    x[9, 0] = 6e4 if dtype == torch.float16 else 2.0**25
    x[11] = x[11, 0]
    x[13, 0] = -200.0
    ours, theirs = fr.softmax(x, -1), torch.softmax(x, -1)
    assert torch.equal(ours.isnan(), theirs.isnan())
    finite = ~theirs.isnan().any(-1)
    assert int(finite.sum()) == rows - 3
    error_vs_reference(ours[finite], theirs[finite], torch.softmax(x[finite].double(), -1))
    x = x[finite].clone().requires_grad_(True)
    g = torch.randn_like(x)
    wide = x.detach().double().requires_grad_(True)
    exact = torch.autograd.grad(torch.softmax(wide, -1), wide, g.double())[0]
    error_vs_reference(torch.autograd.grad(fr.softmax(x, -1), x, g)[0],
                       torch.autograd.grad(torch.softmax(x, -1), x, g)[0], exact)


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
    assert torch.autograd.gradcheck(lambda x: fr.softmax(x, 1), (x,))
    s = torch.randn(2, 5, 5, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: fr.causal_softmax(s, 0.7), (s,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [768, 2000, 70000])
def test_backward_matches_torch(device, n):
    rows = {768: 64, 2000: 2500, 70000: 3}[n]
    x = torch.randn(rows, n, device=device, requires_grad=True)
    g = torch.randn(rows, n, device=device)
    s = torch.randn(2, 33, 33, device=device, requires_grad=True)
    gs = torch.randn(2, 33, 33, device=device)
    torch.testing.assert_close(torch.autograd.grad(fr.causal_softmax(s, 0.3), s, gs)[0],
                               torch.autograd.grad(causal_reference(s, 0.3), s, gs)[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(fr.softmax(x, 0), x, g)[0],
                               torch.autograd.grad(torch.softmax(x, 0), x, g)[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x = torch.randn(4, 6, device=device)
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        fr.softmax(x.int())
    with pytest.raises(IndexError):
        fr.softmax(x, 2)
    with pytest.raises(RuntimeError, match=r"\(\.\.\., T, T\)"):
        fr.causal_softmax(torch.randn(3, 4, 5, device=device))


def samples(device):
    x = torch.randn(3, 8, device=device)
    s = torch.randn(2, 6, 6, device=device)
    ops = torch.ops.fastreduce
    return [
        (ops.softmax.default, (x, 0), {"dtype": None}),
        (ops.softmax.default, (x.half(), -1), {"dtype": torch.float32}),
        (ops.causal_softmax.default, (s, 0.5), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in samples(device):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_module(device):
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(fr.nn.Softmax(dim=1)(x), torch.softmax(x, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
def test_unaligned_rows_and_gradients(device, dtype):
    # Storage offset 1 and widths not a multiple of the vector size: the
    # element-wise paths; an offset gradient with an aligned input: mixed.
    base = torch.randn(64 * 96 + 1, device=device).to(dtype)
    x = base[1:].view(64, 96)
    torch.testing.assert_close(fr.softmax(x), torch.softmax(x, -1))
    y = torch.randn(64, 96, device=device).to(dtype).requires_grad_()
    g = torch.randn(64 * 96 + 1, device=device).to(dtype)[1:].view(64, 96)
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    ours = torch.autograd.grad(fr.softmax(y), y, g)[0]
    theirs = torch.autograd.grad(torch.softmax(y, -1), y, g)[0]
    torch.testing.assert_close(ours, theirs, **tolerance)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
def test_more_rows_than_one_wave(dtype):
    # Tens of thousands of short rows: many more blocks than are resident at once.
    x = (torch.randn(40000, 96, device="cuda") * 3 + 1).to(dtype)
    error_vs_reference(fr.softmax(x), torch.softmax(x, -1), torch.softmax(x.double(), -1))
    scores = (torch.randn(4, 40, 80, 80, device="cuda") * 4).to(dtype)  # 12800 rows of 1 to 80 entries
    error_vs_reference(fr.causal_softmax(scores, 0.3), causal_reference(scores, 0.3),
                       causal_reference(scores.double(), 0.3))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("n, dtype", [(16384, torch.float32), (32768, torch.bfloat16), (65536, torch.float16),
                                      (262144, torch.bfloat16), (262144, torch.float32), (8192, torch.float64),
                                      (262144, torch.float16), (524288, torch.bfloat16), (20000, torch.bfloat16),
                                      (100000, torch.float32), (131072, torch.float32), (32768, torch.float32),
                                      (50257, torch.bfloat16), (50257, torch.float32), (151936, torch.bfloat16),
                                      (151937, torch.bfloat16), (80000, torch.float32), (200003, torch.float32),
                                      (80000, torch.bfloat16), (45000, torch.bfloat16)])
def test_forward_of_more_cluster_rows_than_a_wave(n, dtype):
    # More rows than a wave of clusters holds (on Hopper), in clusters of 2
    # to 16 blocks: the pipelined walk (8 packs a thread, 64-256 threads a
    # block in clusters of 8 or more: two-byte rows of 16385-524288, float
    # rows of 16385-262144; two-byte rows past 131072 in 8 blocks of 512
    # threads, at 5 packs a thread at 151936 and 151937, float rows of
    # 65537-81920 in 16 of 256 at 5 packs (80000), two-byte rows of 8 blocks
    # at 5 packs where more clusters stay resident (80000 in 256 threads,
    # 45000 in 160);
    # rows past 16 blocks of 256 in 16 of 512: 262144 and 200003 floats,
    # 524288 bf16; part of a cluster idle at 100000), 4 packs a thread at
    # 16384 floats; rows that are not whole packs at 50257, 151937 and 200003.
    rows = 2**23 // n + 3
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype)
    error_vs_reference(fr.softmax(x), torch.softmax(x, -1), torch.softmax(x.double(), -1))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1025, 1600, 2049, 4096, 6144, 8192, 12000, 16392, 20000, 32760, 32768, 65536, 65537,
                               100000, 262144])
def test_long_rows(dtype, n):
    # Rows past 1024 run one block per row with the row in registers (two-
    # byte forwards of 16385-32768 in blocks of up to 1024 threads: 16392,
    # 20000 and 32760 leave the last warp short of the row), a cluster of
    # blocks or the shared-memory kernels beyond (as layer_norm's,
    # test_norms.py); two-byte backwards past 16384 the pipelined walk
    # (20000 and 100000: part of a cluster idle; 262144: 512-thread blocks).
    x = (torch.randn(6, n, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    g = torch.randn(6, n, device="cuda")

    def grads(f, *inputs):
        out = f(*inputs)
        return (out,) + torch.autograd.grad(out, inputs, g.to(out.dtype))

    as_double = x.detach().double().requires_grad_()
    for ours, theirs, reference in zip(grads(fr.softmax, x), grads(lambda t: torch.softmax(t, -1), x),
                                       grads(lambda t: torch.softmax(t, -1), as_double)):
        error_vs_reference(ours, theirs, reference)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [2049, 4095, 8191, 16383, 50257])
@pytest.mark.parametrize("input_offset, gradient_offset", [(0, 0), (0, 1), (1, 0)])
def test_rows_that_are_not_whole_packs(dtype, n, input_offset, gradient_offset):
    # Odd widths: each row is read as whole 16-byte packs from its first
    # 16-byte boundary, the few elements before and after them one by one
    # (one block, or a cluster at 16383 bf16 and 50257). The rows' maxima,
    # +inf, -inf and NaN among those loose elements; forward and backward.
    # An input or gradient one element off the output's offset: one element
    # a thread, or the shared-memory kernels (staged from their own packs).
    rows = 12
    x = (torch.randn(rows * n + input_offset, device="cuda") * 3).to(dtype)[input_offset:].view(rows, n)
    x[0, 0] = 40.0  # head elements hold the maximum
    x[1, -1] = 40.0  # the tail's last
    x[2, :3] = 40.0
    x[3, -5:] = 40.0
    x[4, -1] = float("-inf")
    x[5, :2] = float("-inf")
    x[6, 0] = -200.0  # first value far below the rest (two-byte rows: the second pass)
    x[7, -1] = float("inf")  # torch: the whole row NaN
    x[8, 1] = float("nan")
    x[9, -2] = float("nan")
    x = x.requires_grad_()
    g = torch.randn(rows * n + gradient_offset, device="cuda").to(dtype)[gradient_offset:].view(rows, n)
    results = []
    for f, t in ((fr.softmax, x), (lambda t: torch.softmax(t, -1), x),
                 (lambda t: torch.softmax(t, -1), x.detach().double().requires_grad_())):
        y = f(t)
        results.append((y, torch.autograd.grad(y, t, g.to(y.dtype))[0]))
    nan_rows = [7, 8, 9]
    for ours, theirs in zip(results[0], results[1]):
        assert ours[nan_rows].isnan().all() and theirs[nan_rows].isnan().all()
    finite = [r for r in range(rows) if r not in nan_rows]
    for what, ours, theirs, reference in zip(("y", "dx"), *results):
        error_vs_reference(ours[finite], theirs[finite], reference[finite], what=what)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [12000, 32768, 65536, 262144])
def test_wide_rows_of_huge_logits(dtype, n):
    # A row maximum past 2^24 takes a second maximum: a third exchange between
    # the blocks of a cluster, reusing the first one's inbox.
    # Around 2^25 float32 steps by 4 (the top few share the row), bfloat16
    # by 2^17 (every entry the same: each block's sum counts).
    x = (2.0**25 + torch.randn(6, n, device="cuda") * 8).to(dtype)
    error_vs_reference(fr.softmax(x, -1), torch.softmax(x, -1), torch.softmax(x.double(), -1))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n", [(300, 65536), (40, 262144)])
def test_walked_rows_of_huge_and_plain_logits(dtype, rows, n):
    # Two-byte rows of 65536 and 262144 walk (a wave of clusters of 4 and
    # 16, each taking several rows): bf16 rows past 2^24 make three
    # exchanges, the others two, so a cluster's rows alternate between the
    # two counts (half tops out at 65504: its rows make two each).
    x = (torch.randn(rows, n, device="cuda") * 8).to(dtype)
    x[::2] += 2.0**25 if dtype == torch.bfloat16 else 6e4
    error_vs_reference(fr.softmax(x, -1), torch.softmax(x, -1), torch.softmax(x.double(), -1))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [12000, 32768, 40000, 40001, 262144])
def test_wide_rows_whose_blocks_differ(dtype, n):
    # Rows across a cluster (40000, 40001, 262144) or one block (12000; 32768
    # two-byte in 1024 threads) whose parts
    # differ: blocks hundreds below the row's maximum (ramps), half a row of
    # -inf (a block with no finite maximum), and rows torch makes NaN (all
    # -inf, a NaN, a +inf).
    x = (torch.randn(7, n, device="cuda") * 3).to(dtype)
    x[0] = torch.linspace(-400, 20, n)
    x[1, : n // 2] = float("-inf")
    x[2] = float("-inf")
    x[3, n // 3] = float("nan")
    x[4, n - 1] = float("inf")
    x[5] = torch.linspace(20, -400, n)
    ours, theirs = fr.softmax(x, -1), torch.softmax(x, -1)
    assert ours[2:5].isnan().all() and theirs[2:5].isnan().all()
    finite = [0, 1, 5, 6]
    error_vs_reference(ours[finite], theirs[finite], torch.softmax(x[finite].double(), -1))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows, n", [(16, 768), (16, 1024), (16, 1600), (16, 8192), (16, 65536), (40, 262144),
                                     (40, 20000), (40, 32768), (40, 100000), (16, 8191), (40, 50257)])
def test_rows_whatever_their_first_value(dtype, rows, n):
    # Two-byte rows, and the pipelined walk's rows (two-byte past 16384,
    # float 16385-131072), take their exponentials against the row's first
    # value, unless their sum is over 2^96, or the first value is not
    # finite or past 2^24: then the row again against its maximum. Rows of
    # each kind, in warp rows, block rows (two-byte 20000 and 32768 in up to
    # 1024 threads), clusters and walked clusters (float 20000 and 32768,
    # 65536, 100000, 262144; part of a cluster idle at 20000 and 100000), and
    # rows that are not whole packs (8191, 50257).
    x = (torch.randn(rows, n, device="cuda") * 3).to(dtype)
    # The rows' maxima are 9-16 (the largest of 768-262144 draws).
    x[0::8, 0] = -200.0  # the exponentials overflow: the second pass
    x[1::8, 0] = -45.0  # up to 61 below (88 in base 2): one reduction
    x[2::8, 0] = -62.0  # 71-78 below (102-113): the second pass, sums finite
    x[3::8, 0] = 80.0  # the maximum itself, far above the rest
    x[4::8, 0] = float("-inf")
    x[5::8, 0] = 6e4 if dtype == torch.float16 else 2.0**25  # past 2^24 (bf16, float32)
    x[6::8, 0] = float("nan")
    x[7::8, 0] = -55.0  # 65 below every other value (94 in base 2), whose
    x[7::8, 1:] = 10.0  # exponentials sum past 2^96: the second pass
    ours, theirs = fr.softmax(x, -1), torch.softmax(x, -1)
    nan_rows = torch.arange(rows, device="cuda") % 8 == 6
    assert ours[nan_rows].isnan().all() and theirs[nan_rows].isnan().all()
    finite = ~nan_rows
    error_vs_reference(ours[finite], theirs[finite], torch.softmax(x[finite].double(), -1))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_wide_rows_than_resident_clusters(dtype):
    # As test_norms.py's: 600 rows of 65536, many more clusters than resident.
    x = (torch.randn(600, 65536, device="cuda") * 3).to(dtype).requires_grad_()
    g = torch.randn(600, 65536, device="cuda").to(dtype)
    as_double = x.detach().double().requires_grad_()
    results = []
    for f, t in ((fr.softmax, x), (lambda t: torch.softmax(t, -1), x), (lambda t: torch.softmax(t, -1), as_double)):
        y = f(t)
        results.append((y, torch.autograd.grad(y, t, g.to(y.dtype))[0]))
    for ours, theirs, reference in zip(*results):
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
