"""An eager call's Triton launches, recorded once and replayed: the host side of a layer call
without Triton's per-call argument binding (under TRITON_INTERPRET=1 the same recording, each
launch then run again by the interpreter: the CPU tests replay what a GPU replays).

Launching a Triton kernel from Python binds and specializes every argument and checks every
global the kernel reads, each call; for the megakernel (about 90 arguments) that is most of an
eager call's host time. A layer call of a fixed shape makes the same launches each time, with the
same buffers, except for x and y. So ``record(x, run)`` runs ``run()`` once while watching it:
- every Triton launch it makes (``JITFunction.run``, the path of ``kernel[grid](...)``) is kept as
  (compiled kernel, grid, its arguments in signature order), the per-call tensors (``inputs``: x,
  and for ``moe_experts`` the routing, the weights and the check's flag) and y replaced by slots;
- a torch dispatch mode sees every torch op; anything but allocation and views (a fill, a copy, a
  host read, a library GEMM) is GPU work the launches alone would not repeat, and the call gets
  no tape;
- a launch argument that views part of a per-call tensor (x, y, or another of the caller's
  ``inputs``) without being it (a slice) would keep the recorded call's memory, so it too gives no
  tape; a TMA descriptor over a whole input is remade over the new one at each replay.
``Tape.replay(inputs)`` then makes y and runs each compiled kernel's launcher with the kept
arguments. The caller keys tapes by everything that fixes the launches (moe.py ``_taped``).

Where Triton's CUDA launcher is the one of Triton 3.6 (``_direct``), a replay calls the kernel's
compiled C launcher itself, its arguments expanded once when recorded: a TMA descriptor's
CUtensorMap is filled once (over a per-call tensor, again only when that tensor's address
changes: a caller passing the same weights each call fills none), and the per-launch Python
of Triton's runner (stream lookup, launch metadata, scratch, the argument expansion) is skipped.
With a launch hook set (a profiler), or any other Triton, the kernel's own runner takes the launch.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import fields, is_dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from triton import knobs
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

#: torch ops a recorded call may make: allocation and views, no work on the device
ALLOWED_OPS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
    "aten::unsqueeze", "aten::squeeze.dim", "aten::t", "aten::transpose.int", "aten::permute", "aten::expand",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::slice.Tensor", "aten::select.int",
})

class Refused(Exception):
    """Why a recorded call gives no tape."""


Y = -1  # the slot of the call's output


class Tape:
    """The launches of one recorded call; ``replay(inputs)`` -> y, a fresh tensor like the first input."""

    def __init__(self, steps: list, y_shape: tuple, aligned: tuple):
        self.steps = steps  # per launch (direct launch or None, the kernel's own runner): each (inputs, y, stream)
        self.y_shape = y_shape
        self.aligned = aligned  # per input: it was 16-byte aligned when recorded (Triton specialized on it)
        self.owner = self.config = None  # set by the caller: what the tape was recorded for

    def fits(self, inputs: tuple) -> bool:
        """Whether these inputs may stand in the recorded ones' place: contiguous and, where the
        kernels were specialized for it, 16-byte aligned."""
        for t, a in zip(inputs, self.aligned):
            if t is not None and not (t.is_contiguous() and (not a or t.data_ptr() % 16 == 0)):
                return False
        return True

    def replay(self, inputs: tuple, stream: int) -> torch.Tensor:
        x = inputs[0]  # contiguous (fits), of the recorded shape: y is like it where the shapes agree
        y = torch.empty_like(x) if x.shape == self.y_shape else torch.empty(self.y_shape, device=x.device,
                                                                            dtype=x.dtype)
        hooked = _hooked()
        for direct, runner in self.steps:
            (runner if hooked or direct is None else direct)(inputs, y, stream)
        return y


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler watching launches): a call in Triton's hook chain, or a plain hook."""
    rt = knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True)) or (leave is not None and getattr(leave, "calls", True)))


def _runner(run, vals: tuple, slots: tuple, descs: tuple):
    """A launch through the kernel's own runner ``run(*args, stream=)``: the kept arguments with
    this call's tensors in their slots and its descriptors remade."""
    def launch(inputs, y, stream):
        args = list(vals)
        for i, k in slots:
            args[i] = y if k == Y else inputs[k]
        for i, k, shape, kind, rest in descs:  # a TMA descriptor over a whole input: the same over this one
            args[i] = kind(base=inputs[k].view(shape), **rest)
        run(*args, stream=stream)

    return launch


def _triton36():
    """Triton 3.6's per-descriptor argument expansion (``make_tensordesc_arg``), or None where the
    installed Triton's CUDA launcher is another (``_direct`` then declines)."""
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:
        return None
    expand = getattr(nv, "make_tensordesc_arg", None)
    launcher = getattr(nv, "CudaLauncher", None)
    if (getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO" or expand is None or launcher is None
            or list(inspect.signature(launcher.__call__).parameters)[:6] != ["self", "gridX", "gridY", "gridZ", "stream", "function"]):
        return None
    return expand


_EXPAND = _triton36()


def _direct(kernel, grid: tuple, vals: tuple, slots: tuple, descs: tuple):
    """A launch straight into the compiled kernel's C launcher (Triton 3.6: the launcher
    ``kernel.run.launch`` wraps when the kernel takes descriptors, else that launch itself), the
    arguments expanded as Triton's wrapper expands them, once; None where that cannot be done."""
    expand = _EXPAND
    if expand is None:
        return None
    run = getattr(kernel, "run", None)
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None  # per-launch scratch (or no launcher of Triton's): the runner launches it
    launch = getattr(run, "launch", None)
    code = getattr(launch, "__code__", None)
    if code is None:  # the C launcher itself: no descriptor argument
        c_launch, indices, metas = launch, frozenset(), ()
    else:
        free = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
        if set(free) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
            return None
        c_launch, indices, metas = free["launcher"], free["tensordesc_indices"], free["tensordesc_meta"]
    if not callable(c_launch):
        return None
    flat, at, expanded = [], {}, {}  # the arguments expanded; per argument its place; per descriptor (meta, length)
    for i, v in enumerate(vals):
        at[i] = len(flat)
        if i in indices:
            meta = metas[len(expanded)]
            flat.extend(expand(v, meta))
            expanded[i] = (meta, len(flat) - at[i])
        else:
            flat.append(v)
    if any(i not in expanded for i, *_ in descs):
        return None  # a descriptor the launcher does not expand
    tensors = tuple((at[i], k) for i, k in slots)
    remade = tuple((at[i], expanded[i][1], k, shape, kind, rest, expanded[i][0]) for i, k, shape, kind, rest in descs)
    for p, n, *_ in remade:  # expanded anew at each replay: nothing of the recorded call's tensor kept
        flat[p:p + n] = [None] * n
    gx, gy, gz = grid
    head = (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None, kernel.packed_metadata,
            None, None, None)  # the function, its launch flags, no scratch, metadata, no launch hooks

    last = [None] * len(remade)  # per remade descriptor: (address, dtype, its expansion) of the last replay

    def launch_direct(inputs, y, stream):
        args = list(flat)
        for p, k in tensors:
            args[p] = y if k == Y else inputs[k]
        for j, (p, n, k, shape, kind, rest, meta) in enumerate(remade):
            t = inputs[k]
            hit = last[j]
            if hit is not None and hit[0] == t.data_ptr() and hit[1] is t.dtype:
                args[p:p + n] = hit[2]
                continue
            e = expand(kind(base=t.view(shape), **rest), meta)
            args[p:p + n] = e
            # the shape and strides are the tape's own, so the address and dtype fix the expansion;
            # kept only where it holds no tensor (a CUtensorMap and integers), so it keeps none alive
            last[j] = None if any(isinstance(a, torch.Tensor) for a in e) else (t.data_ptr(), t.dtype, e)
        c_launch(gx, gy, gz, stream, *head, *args)

    return launch_direct


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
KINDS = (JITFunction, InterpretedFunction)  # a GPU's compiled kernels, the interpreter's (TRITON_INTERPRET=1)
_ORIGINAL = {kind: kind.run for kind in KINDS}  # put back when no thread records
_launch = dict(_ORIGINAL)  # what a recorded launch runs, per kind (a test's fake stands in without a GPU)


def _recording(kind):
    def run(self, *args, grid, warmup, **kwargs):
        seen = _active.get(threading.get_ident())
        if seen is None:  # another thread's launch, while this one records
            return _launch[kind](self, *args, grid=grid, warmup=warmup, **kwargs)
        with _disable_current_modes():  # the launch's own torch work (the interpreter's copies) is the launch's
            kernel = _launch[kind](self, *args, grid=grid, warmup=warmup, **kwargs)
        if not warmup:
            seen.append((self, grid, args, kwargs, kernel))
        return kernel

    return run


def record(inputs: tuple, run) -> tuple[torch.Tensor, Tape | None, str | None]:
    """(y, its tape or None, why not) of ``run()``, the call that returns y. ``inputs``: the
    tensors (or None) that change from call to call, x first; every other launch argument is kept."""
    seen: list = []
    ops = _Ops()
    with _lock:
        if not _active:
            for kind in KINDS:
                kind.run = _recording(kind)
        _active[threading.get_ident()] = seen
    try:
        with ops:
            y = run()
    finally:
        with _lock:
            del _active[threading.get_ident()]
            if not _active:
                for kind in KINDS:
                    kind.run = _ORIGINAL[kind]
    if ops.bad is not None:
        return y, None, f"the call ran {ops.bad}"
    try:
        steps = [_step(inputs, y, *s) for s in seen]
    except Refused as e:
        return y, None, str(e)
    if not any(wrote for _, wrote in steps):
        return y, None, "no launch wrote y"
    aligned = tuple(t is not None and t.data_ptr() % 16 == 0 for t in inputs)
    return y, Tape([step for step, _ in steps], tuple(y.shape), aligned), None


def _step(inputs: tuple, y, fn, grid, args, kwargs, kernel):
    name = fn.fn.__name__
    interpreted = isinstance(fn, InterpretedFunction)
    if callable(grid) or not (interpreted or hasattr(kernel, "__getitem__")):
        raise Refused(f"{name}: a grid function or no compiled kernel")
    sig = inspect.signature(fn.fn)
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    vals = list(bound.arguments.values())
    if any(v is inspect.Parameter.empty for v in vals):
        raise Refused(f"{name}: an argument without a value")
    live = [(k, t) for k, t in enumerate(inputs) if t is not None] + [(Y, y)]
    slots, descs = [], []
    for i, v in enumerate(vals):
        k = next((k for k, t in live if v is t), None)
        if k is not None:
            slots.append((i, k))
            vals[i] = None
            continue
        base = getattr(v, "base", None) if is_dataclass(v) else None
        whole = next((k for k, t in live if isinstance(base, torch.Tensor) and base.data_ptr() == t.data_ptr()
                      and base.numel() == t.numel() and base.is_contiguous() and t.is_contiguous()), None)
        if whole is not None and whole != Y:  # kept as its other fields: the tape holds no per-call tensor
            descs.append((i, whole, tuple(base.shape), type(v), {f.name: getattr(v, f.name) for f in fields(v)
                                                                  if f.name != "base"}))
        elif any(_overlaps(v, t) for _, t in live):
            raise Refused(f"{name}: argument {list(sig.parameters)[i]} views a per-call tensor in part")
    grid = tuple(grid) + (1,) * (3 - len(grid))
    slots, descs = tuple(slots), tuple(descs)
    direct = None
    if not interpreted:
        runner = kernel[grid]  # loads the kernel: its function and launcher exist from here on
        direct = _direct(kernel, grid, tuple(vals), slots, descs)  # expands the recorded descriptors once
    for i, *_ in descs:
        vals[i] = None  # remade at each replay
    vals = tuple(vals)
    step = (direct, _runner(_interpreted(fn, grid) if interpreted else runner, vals, slots, descs))
    return step, any(k == Y for _, k in slots)


def _interpreted(fn, grid):
    """The interpreter's runner of ``fn`` on ``grid``: the kernel run again, program by program."""
    def runner(*args, stream=None):
        _ORIGINAL[InterpretedFunction](fn, *args, grid=grid, warmup=False)

    return runner


def _overlaps(v, t: torch.Tensor) -> bool:
    """Whether v (a tensor, or a TMA descriptor's base) lies in t's memory."""
    base = getattr(v, "base", v)
    if not isinstance(base, torch.Tensor) or base.device != t.device:
        return False
    lo, n = t.data_ptr(), t.numel() * t.element_size()
    b = base.data_ptr()
    return b < lo + n and lo < b + max(base.numel() * base.element_size(), 1)
