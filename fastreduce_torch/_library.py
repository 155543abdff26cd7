"""Loads libfastreduce_ops, the operator library, after checking that it was
built for the installed torch.

libfastreduce_ops and _C use torch's C++ ABI, which changes between releases
(and between CPU and CUDA builds of one release): loaded under another torch
they fail on missing symbols at best and crash at worst. setup.py records the
torch it built against in _build_info.py; this compares before anything loads.
"""

import os

import torch


def check_torch(built: str, running: str) -> None:
    if built != running:
        raise ImportError(
            f"fastreduce_torch was built against torch {built}, but torch {running} is installed. "
            "Its compiled operators use torch's C++ ABI, which differs between torch builds: rebuild "
            "fastreduce_torch against this torch (`pip install --no-build-isolation --force-reinstall "
            f"--no-deps .` in its source tree, or `make install`), or install torch {built}."
        )


def check_installed_torch() -> None:
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:
        raise ImportError(
            "fastreduce_torch is not built: run `make install` (or `pip install --no-build-isolation -e .`) "
            "in its source tree"
        ) from None
    check_torch(TORCH_VERSION, str(torch.__version__))


check_installed_torch()
path = os.path.join(os.path.dirname(__file__), "libfastreduce_ops.so")
torch.ops.load_library(path)
