"""An eager call's Triton launches, recorded once and replayed: the host side of a layer call
without Triton's per-call argument binding.

Launching a Triton kernel from Python binds and specializes every argument and checks every
global the kernel reads, each call; for the megakernel (about 90 arguments) that is most of an
eager call's host time. A layer call of a fixed shape makes the same launches each time, with the
same buffers, except for x and y. So ``record(x, run)`` runs ``run()`` once while watching it:
- every Triton launch it makes (``JITFunction.run``, the path of ``kernel[grid](...)``) is kept as
  (compiled kernel, grid, its arguments in signature order), x and y replaced by slots;
- a torch dispatch mode sees every torch op; anything but allocation and views (a fill, a copy, a
  host read, a library GEMM) is GPU work the launches alone would not repeat, and the call gets
  no tape;
- a launch argument that views x's or y's memory without being x or y (a slice, a TMA descriptor
  over it) would keep the recorded call's memory, so it too gives no tape.
``Tape.replay(x)`` then makes y and runs each compiled kernel's launcher with the kept
arguments. The caller keys tapes by everything that fixes the launches (moe.py ``_layer``).
"""

from __future__ import annotations

import inspect
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import JITFunction

#: torch ops a recorded call may make: allocation and views, no work on the device
ALLOWED_OPS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
    "aten::unsqueeze", "aten::squeeze.dim", "aten::t", "aten::transpose.int", "aten::permute", "aten::expand",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::slice.Tensor", "aten::select.int",
})

_X, _Y = object(), object()  # slot markers in a step's arguments


class Refused(Exception):
    """Why a recorded call gives no tape."""


class Tape:
    """The launches of one recorded call; ``replay(x)`` -> y, a fresh (T, H) tensor like x."""

    def __init__(self, steps: list, y_shape: tuple, x_aligned: bool):
        self.steps = steps  # (runner, arguments with slots, x positions, y positions)
        self.y_shape = y_shape
        self.x_aligned = x_aligned  # the recorded x was 16-byte aligned: so must each replayed x be
        self.owner = self.config = None  # set by the caller: what the tape was recorded for

    def fits(self, x: torch.Tensor) -> bool:
        """Whether x may stand in the recorded x's place: contiguous and, where the kernels were
        specialized for it, 16-byte aligned."""
        return x.is_contiguous() and (not self.x_aligned or x.data_ptr() % 16 == 0)

    def replay(self, x: torch.Tensor, stream: int) -> torch.Tensor:
        y = torch.empty(self.y_shape, device=x.device, dtype=x.dtype)
        for runner, vals, xs, ys in self.steps:
            args = list(vals)
            for i in xs:
                args[i] = x
            for i in ys:
                args[i] = y
            runner(*args, stream=stream)
        return y


class _Ops(TorchDispatchMode):
    """Notes the first torch op outside ALLOWED_OPS."""

    def __init__(self):
        super().__init__()
        self.bad = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.bad is None and func.name() not in ALLOWED_OPS:
            self.bad = func.name()
        return func(*args, **(kwargs or {}))


_active: dict = {}  # thread id -> the launches its recording has seen
_lock = threading.Lock()
_ORIGINAL_RUN = JITFunction.run  # put back when no thread records
_jit_run = JITFunction.run  # what a recorded launch runs (a test's fake stands in here without a GPU)


def _recording_run(self, *args, grid, warmup, **kwargs):
    kernel = _jit_run(self, *args, grid=grid, warmup=warmup, **kwargs)
    seen = _active.get(threading.get_ident())
    if seen is not None and not warmup:
        seen.append((self, grid, args, kwargs, kernel))
    return kernel


def record(x: torch.Tensor, run) -> tuple[torch.Tensor, Tape | None, str | None]:
    """(y, its tape or None, why not) of ``run()``, the call on x that returns y."""
    seen: list = []
    ops = _Ops()
    with _lock:
        if not _active:
            JITFunction.run = _recording_run
        _active[threading.get_ident()] = seen
    try:
        with ops:
            y = run()
    finally:
        with _lock:
            del _active[threading.get_ident()]
            if not _active:
                JITFunction.run = _ORIGINAL_RUN
    if ops.bad is not None:
        return y, None, f"the call ran {ops.bad}"
    try:
        steps = [_step(x, y, *s) for s in seen]
    except Refused as e:
        return y, None, str(e)
    if not any(ys for *_, ys in steps):
        return y, None, "no launch wrote y"
    return y, Tape(steps, tuple(y.shape), x.data_ptr() % 16 == 0), None


def _step(x, y, fn: JITFunction, grid, args, kwargs, kernel):
    if callable(grid) or kernel is None or not hasattr(kernel, "__getitem__"):
        raise Refused(f"{fn.__name__}: a grid function or no compiled kernel")
    names = fn.signature.parameters
    bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    vals = list(bound.arguments.values())
    if any(v is inspect.Parameter.empty for v in vals):
        raise Refused(f"{fn.__name__}: an argument without a value")
    xs, ys = [], []
    for i, v in enumerate(vals):
        if v is x or v is y:
            (xs if v is x else ys).append(i)
            vals[i] = None
        elif _overlaps(v, x) or _overlaps(v, y):
            raise Refused(f"{fn.__name__}: argument {list(names)[i]} views x or y")
    grid = tuple(grid) + (1,) * (3 - len(grid))
    return kernel[grid], tuple(vals), tuple(xs), tuple(ys)


def _overlaps(v, t: torch.Tensor) -> bool:
    """Whether v (a tensor, or a TMA descriptor's base) lies in t's memory."""
    base = getattr(v, "base", v)
    if not isinstance(base, torch.Tensor) or base.device != t.device:
        return False
    lo, n = t.data_ptr(), t.numel() * t.element_size()
    b = base.data_ptr()
    return b < lo + n and lo < b + max(base.numel() * base.element_size(), 1)
