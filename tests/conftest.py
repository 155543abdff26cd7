import atexit
import os
import shutil
import tempfile

# torch.compile's disk caches key a graph by the operators in it, not by the
# private operators their autograd calls (pytorch/pytorch#144344): a cache an
# older build wrote would replay that build's contracts. Each run compiles
# into a directory of its own.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastreduce-inductor-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import pytest
import torch

import fastreduce_torch  # registers the operators

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The sanitizer runs (scripts/gpu_check.sh) turn the caching allocator off,
# and a CUDA graph capture cannot allocate without it.
WITHOUT_CACHING_ALLOCATOR = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
GRAPHS_NEED_THE_CACHING_ALLOCATOR = "a CUDA graph captures allocations only through the caching allocator"
captures_graphs = pytest.mark.skipif(WITHOUT_CACHING_ALLOCATOR, reason=GRAPHS_NEED_THE_CACHING_ALLOCATOR)

# The AVX-512 copies of the CPU kernels (x86-64 builds; csrc/torch/cpu_capability.cpp).
AVX512_CPU_KERNELS = os.path.join(os.path.dirname(fastreduce_torch.__file__), "libfastreduce_cpu_avx512.so")

# Every device-parametrized test runs on the CPU everywhere and on CUDA where
# a GPU is present; the CUDA copies carry the `cuda` mark.
DEVICES = ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.cuda])]


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")
    # A custom operator's output that aliases an input or another output: an
    # error in opcheck and torch.compile, as from torch 2.12 (a warning before).
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "error_on_custom_op_aliasing"):
        functorch_config.error_on_custom_op_aliasing = True


def pytest_make_parametrize_id(config, val, argname):
    """dtypes by name in test ids ("float32", not "dtype0"), so that `-k` selects
    them (scripts/gpu_check.sh's sanitizer steps do)."""
    return str(val).removeprefix("torch.") if isinstance(val, torch.dtype) else None


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def random_tensor(shape, dtype=torch.float32, device="cpu", low=-100, high=100):
    """Random data of any dtype: normal floats, uniform integers, coin-flip bools."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(low, info.min), min(high, info.max) + 1, shape, device=device, dtype=dtype)


def offset_view(x: torch.Tensor, offset: int) -> torch.Tensor:
    """The same values as ``x`` at storage offset ``offset`` (breaks 16-byte alignment)."""
    flat = torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)
    view = flat[offset:].view(x.shape)
    view.copy_(x)
    return view


def side_stream_then_graph(step):
    """What ``step()`` (a tuple of CUDA tensors) gives on a side stream, then
    captured in a CUDA graph and replayed once: both, after a synchronize."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        on_side_stream = step()  # also the warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    if WITHOUT_CACHING_ALLOCATOR:
        pytest.skip(GRAPHS_NEED_THE_CACHING_ALLOCATOR)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    return on_side_stream, tuple(t.clone() for t in captured)


# Within-rounding checks against float64 references, per dtype.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}


def max_error(ours, reference):
    return (ours.double() - reference).abs().max().item() if ours.numel() else 0.0


def close_to_reference(ours, reference, scale=1.0, theirs=None):
    """Within the dtype's rounding of the float64 reference (relative to the
    reference's own size), or within twice torch's own error `theirs` where
    the problem is ill-conditioned (one-element rows)."""
    bound = TOLERANCE[ours.dtype] * max(scale, reference.abs().max().item() if reference.numel() else 0.0)
    if theirs is not None:
        bound = max(bound, 2 * max_error(theirs, reference))
    err = max_error(ours, reference)
    assert err <= bound, (err, bound)


def error_vs_reference(ours, theirs, reference, floor=None, what=""):
    """Our error against float64 must stay within twice torch's own (plus a
    floor: by default one for the dtype); `what` names the tensor on failure."""
    ours_err = (ours.double() - reference).abs().max().item()
    theirs_err = (theirs.double() - reference).abs().max().item()
    if floor is None:
        floor = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[ours.dtype]
    assert ours_err <= 2 * theirs_err + floor, (what, ours_err, theirs_err)
