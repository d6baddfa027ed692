"""Shared fixtures: fixed seeds, the kernel device, and the GPU marker."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: The checkout's root. Its folders ``reference/``, ``simulator/`` and ``kernels/`` install as
#: ``megamoe.*``; under their bare names they would shadow installed distributions (PyPI's
#: ``kernels``, which transformers imports). ``python -m pytest`` puts the working directory first on
#: ``sys.path``, so the root is taken off it here, before any test imports anything: the tests see the
#: installed package only, whichever way pytest was started.
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
for _name in ("reference", "simulator", "kernels"):
    _mod = sys.modules.get(_name)
    if _mod is not None and str(getattr(_mod, "__file__", "") or "").startswith(str(ROOT)):
        del sys.modules[_name]

import numpy as np  # noqa: E402
import pytest  # noqa: E402


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


@dataclass(frozen=True)
class KernelDevice:
    """Where the Triton kernels run in this test process, and in which dtypes.

    ``cpu``: the Triton interpreter (no GPU), float32 and float16 (its bfloat16 dot is wrong);
    ``cuda``: the GPU, bfloat16 and float16 (float32 is refused there).
    """

    name: str  # "cpu" or "cuda"
    dtype: str  # the main dtype: float32 under the interpreter, bfloat16 on CUDA
    half: str = "float16"

    def torch_dtype(self, dtype: str | None = None):
        import torch

        return getattr(torch, dtype or self.dtype)

    def tensor(self, a, dtype: str | None = None):
        """A NumPy array (or tensor) on this device in ``dtype`` (default: the main dtype)."""
        import torch

        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
        return t.to(self.name).to(self.torch_dtype(dtype)) if t.is_floating_point() else t.to(self.name)


#: One device per process: the interpreter is chosen when triton is imported, so a GPU machine
#: runs the kernel tests on CUDA and a CPU machine under the interpreter, never both.
KERNEL_DEVICES = [KernelDevice("cuda", "bfloat16")] if HAS_CUDA else [KernelDevice("cpu", "float32")]


@pytest.fixture(params=KERNEL_DEVICES, ids=lambda d: "cuda" if d.name == "cuda" else "interpret")
def device(request) -> KernelDevice:
    """The kernel tests' device: CUDA where there is a GPU, else the CPU under TRITON_INTERPRET=1."""
    return request.param


#: the most test processes ``-n auto`` starts (each holds its own torch, Triton and interpreter state)
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process per core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def pytest_sessionstart(session):
    """Print the versions this run resolved (also under -q), so a log says what it tested against."""
    from importlib.metadata import PackageNotFoundError, version

    names = ("megamoe", "numpy", "torch", "triton", "transformers", "kernels", "simpy", "numba", "dask", "pandas")
    found = []
    for n in names:
        try:
            found.append(f"{n} {version(n)}")
        except PackageNotFoundError:
            found.append(f"{n} absent")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("resolved: " + ", ".join(found))
