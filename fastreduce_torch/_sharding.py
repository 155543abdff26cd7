"""Registers the DTensor sharding rules (distributed.py) only once
torch.distributed.tensor is imported: importing it costs about 0.45 s, and a
DTensor can only reach the operators after it has been imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

DTENSOR_MODULE = "torch.distributed.tensor"
RULES_MODULE = "fastreduce_torch.distributed"


def rules():
    """fastreduce_torch.distributed when DTensors exist in this process, else None."""
    return sys.modules.get(RULES_MODULE)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds torch.distributed.tensor as usual, and imports the rules as soon
    as that module has run."""

    def find_spec(self, name, path, target=None):
        if name != DTENSOR_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            importlib.import_module(RULES_MODULE)

        spec.loader.exec_module = exec_module
        return spec


def register_when_dtensor_imported() -> None:
    if not torch.distributed.is_available():
        return
    if DTENSOR_MODULE in sys.modules:
        importlib.import_module(RULES_MODULE)
    else:
        sys.meta_path.insert(0, _RegisterAfterImport())
