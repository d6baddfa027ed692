"""Shared fixtures: fixed seeds, small configs, and the GPU marker."""

from __future__ import annotations

import os

import numpy as np
import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    # Triton picks the interpreter when its kernels are defined, so this must precede any
    # import of triton or of megamoe.kernels in the test process.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator; each test draws its own fresh inputs from it."""
    return np.random.default_rng(20261129)
