"""Recorded launches (kernels/tape.py): what a tape keeps, when a call gets none, and on a GPU that
replayed eager calls give what fresh calls give, bitwise.

Without a GPU a stand-in for Triton's launch path (a kernel that writes y = 2 x + b on the CPU)
takes the recorded launches, so the recording rules are tested here too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes
from triton.runtime.jit import JITFunction

from megamoe.kernels import tape


def _axpb(x_ptr, b_ptr, y_ptr, n, SCALE=2):  # a kernel's signature: tensors, an int, a constexpr default
    pass


def _rows(desc, y_ptr, n):  # a kernel reading through a TMA descriptor: y = desc's first n elements
    pass


class _Compiled:
    """A compiled kernel's stand-in: ``[grid]`` gives a runner that computes y = SCALE * x + b
    (``_axpb``) or copies a descriptor's rows (``_rows``)."""

    launches = 0

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        def axpb(x, b, y, n, scale, stream=None):
            _Compiled.launches += 1
            with _disable_current_modes():
                y[:n] = scale * x[:n] + b[:n]

        def rows(desc, y, n, stream=None):
            _Compiled.launches += 1
            with _disable_current_modes():
                y[:n] = desc.base.reshape(-1)[:n]

        return axpb if self.name == "_axpb" else rows


def _fake_run(self, *args, grid, warmup, **kwargs):
    bound = self.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in self.signature.parameters})
    bound.apply_defaults()
    compiled = _Compiled(self.fn.__name__)
    compiled[grid](*bound.arguments.values())
    return compiled


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setitem(tape._launch, JITFunction, _fake_run)
    return JITFunction(_axpb)


def test_replay_swaps_x_and_y_and_keeps_the_rest(kernel):
    b = torch.randn(7)
    x = torch.randn(7)

    def run(x=x):
        y = torch.empty(7)
        kernel[(1,)](x, b, y, 7, num_warps=4)
        return y

    y, tp, why = tape.record((x,), run)
    assert why is None and tp is not None
    assert torch.equal(y, 2 * x + b)
    assert JITFunction.run is tape._ORIGINAL[JITFunction], "the launch path is put back after recording"
    x2 = torch.randn(7)
    before = _Compiled.launches
    y2 = tp.replay((x2,), stream=0)
    assert _Compiled.launches == before + 1
    assert y2 is not y and torch.equal(y2, 2 * x2 + b), "a fresh y from the new x, b kept"


def test_every_input_is_a_slot_and_a_descriptor_over_a_whole_one_is_remade(kernel):
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = JITFunction(_rows)
    x, b = torch.randn(8), torch.randn(8)

    def run(x=x, b=b):
        y = torch.empty(8)
        kernel[(1,)](x, b, y, 8)
        rows[(1,)](TensorDescriptor.from_tensor(b.view(2, 4), [2, 4]), y, 4)  # y[:4] = b[:4]
        return y

    y, tp, why = tape.record((x, b), run)
    assert why is None and torch.equal(y, torch.cat([b[:4], 2 * x[4:] + b[4:]]))
    x2, b2 = torch.randn(8), torch.randn(8)
    y2 = tp.replay((x2, b2), stream=0)
    assert torch.equal(y2, torch.cat([b2[:4], 2 * x2[4:] + b2[4:]])), "b2 read through a descriptor remade over it"


def test_a_tape_keeps_none_of_the_recorded_calls_tensors(kernel):
    """Per-call tensors (and a descriptor's base among them) are slots: once the caller drops the
    recorded call's x and b, nothing of them stays alive in the tape (moe_experts' weights are such)."""
    import gc
    import weakref

    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = JITFunction(_rows)

    def record():
        x, b = torch.randn(8), torch.randn(8)

        def run():
            y = torch.empty(8)
            kernel[(1,)](x, b, y, 8)
            rows[(1,)](TensorDescriptor.from_tensor(b.view(2, 4), [2, 4]), y, 4)
            return y

        _, tp, why = tape.record((x, b), run)
        assert why is None
        return tp, weakref.ref(x), weakref.ref(b)

    tp, x_ref, b_ref = record()
    gc.collect()
    assert x_ref() is None and b_ref() is None, "the tape kept a recorded per-call tensor alive"
    x2, b2 = torch.randn(8), torch.randn(8)
    assert torch.equal(tp.replay((x2, b2), stream=0), torch.cat([b2[:4], 2 * x2[4:] + b2[4:]]))


def test_a_torch_op_beside_the_launches_gives_no_tape(kernel):
    x = torch.randn(5)

    def run():
        y = torch.empty(5)
        kernel[(1,)](x, x, y, 5)
        y.mul_(3)  # work the launches alone would not repeat
        return y

    y, tp, why = tape.record((x,), run)
    assert tp is None and "aten::mul_" in why
    assert torch.allclose(y, 3 * (2 * x + x))


def test_an_argument_viewing_x_gives_no_tape(kernel):
    x = torch.randn(8)

    def run():
        y = torch.empty(4)
        kernel[(1,)](x[4:], x, y, 4)  # a view of x: the replay would read the recorded x
        return y

    _, tp, why = tape.record((x,), run)
    assert tp is None and "x_ptr views a per-call tensor in part" in why


def test_a_grid_function_or_no_launch_gives_no_tape(kernel):
    x = torch.randn(3)
    _, tp, why = tape.record((x,), lambda: torch.empty(3))
    assert tp is None and why == "no launch wrote y"

    def run():
        y = torch.empty(3)
        kernel[lambda meta: (1,)](x, x, y, 3)
        return y

    _, tp, why = tape.record((x,), run)
    assert tp is None and "grid function" in why


def test_fits_asks_what_the_recorded_inputs_were_specialized_for():
    tp = tape.Tape([], (4, 8), aligned=(True, False))
    x = torch.zeros(40)
    assert tp.fits((x[:32].view(4, 8), None))
    assert not tp.fits((x[1:33].view(4, 8), None)), "4 bytes off a 16-byte boundary"
    assert tp.fits((x[:32].view(4, 8), x[1:33])), "the second input was not aligned when recorded"
    assert not tp.fits((torch.zeros(8, 4).t(), None))


@pytest.mark.parametrize("backend", ["megakernel", "multi"])
def test_replayed_eager_calls_are_fresh_calls(backend, device):
    """Eager calls on fresh x each time: the third and later replay a tape (on a GPU the compiled
    kernels' launchers, under the interpreter the kernels run again), bitwise a fresh call's y."""
    from megamoe.kernels import moe
    from megamoe.reference import MoEConfig, random_weights

    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2, num_shared_experts=1,
                    shared_intermediate_size=16, name="tape")
    w = random_weights(cfg, seed=3).to_torch(device.name, device.torch_dtype())
    rng = np.random.default_rng(5)
    moe.clear_caches()
    tokens = (1, 7) if device.name == "cpu" else (1, 7, 64)
    for T in tokens:
        for _ in range(4):
            x = device.tensor(rng.standard_normal((T, cfg.hidden_size)))
            y = moe.moe_forward(x, w, cfg, backend=backend)
            fresh = moe._layer(x, w, cfg, True, backend)
            assert torch.equal(y, fresh), f"T={T}"
    tapes = [v for v in moe._tapes.values() if type(v) is tape.Tape]
    assert len(tapes) == len(tokens), f"a tape per T: {list(moe._tapes.values())}"
    moe.clear_caches()


@pytest.mark.parametrize("backend", ["megakernel", "multi"])
def test_replayed_moe_experts_calls_take_every_tensor_anew(backend, device):
    """moe_experts calls on fresh x, routing and weights each time: the replays give a plain call's
    y bitwise, and a bad routing in a replayed call is still reported with its token and slot."""
    from megamoe.kernels import KernelInputError, check_routing, moe
    from megamoe.kernels.moe import moe_experts

    E, H, I, K, T = 8, 64, 32, 2, 5
    rng = np.random.default_rng(9)
    dt = device.torch_dtype()
    moe.clear_caches()
    for call in range(5):
        x = device.tensor(rng.standard_normal((T, H)))
        gu = device.tensor(rng.standard_normal((E, 2 * I, H)) / 8)
        dn = device.tensor(rng.standard_normal((E, H, I)) / 6)
        idx = torch.as_tensor(np.stack([rng.permutation(E)[:K] for _ in range(T)]), device=device.name)
        tw = torch.as_tensor(rng.uniform(0.1, 1.0, (T, K)), dtype=torch.float32, device=device.name)
        y = moe_experts(x, idx, tw, gu, dn, backend=backend)
        plain = moe._experts(x, idx.to(torch.int32), tw, gu, dn, None, None, "silu_gated", 1.702, 7.0, True,
                             backend, True)
        assert y.dtype == dt and torch.equal(y, plain), f"call {call}"
    assert sum(type(v) is tape.Tape for v in moe._tapes.values()) == 1
    bad = idx.clone()
    bad[3, 1] = E  # out of range
    with pytest.raises(KernelInputError, match=r"topk_idx\[3, 1\] = 8 \(token 3, slot 1\)"):
        moe_experts(x, bad, tw, gu, dn, backend=backend)
        check_routing(device.name)  # a GPU reports it later
    moe.clear_caches()


def _fake_fill(desc, meta):  # a descriptor's expansion, as Triton 3.6 expands it: (map, shape, strides)
    return [("map", desc.base, meta), *desc.shape, *desc.strides]


def _wrap_like_triton36(launcher, tensordesc_indices, tensordesc_meta):
    """A launcher wrapped as Triton 3.6 wraps a kernel's C launcher when it takes descriptors:
    a closure over these three names expanding each descriptor argument at every call."""
    def inner(*args):
        out, j = list(args[:13]), 0
        for i, a in enumerate(args[13:]):
            if i in tensordesc_indices:
                out.extend(_fake_fill(a, tensordesc_meta[j]))
                j += 1
            else:
                out.append(a)
        return launcher(*out)

    return inner


class _Launcher36:
    """Triton 3.6's CudaLauncher in outline: __call__(grid, stream, function, *args) -> launch(...)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, launch):
        self.launch = launch

    def __call__(self, gx, gy, gz, stream, function, *args):
        self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)


def _rows2(desc, b_ptr, y_ptr, n, SCALE=3):  # y = SCALE * x + b, x read through the descriptor
    pass


def _record_rows2(monkeypatch, launch, fill):
    """A call of _rows2 over a descriptor of x recorded, its launches through ``launch`` (a fake of
    ``JITFunction.run``) and descriptors expanded by ``fill`` -> (y, tape, why not, x, b)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setitem(tape._launch, JITFunction, launch)
    monkeypatch.setattr(tape, "_EXPAND", fill)
    rows = JITFunction(_rows2)
    x, b = torch.randn(8), torch.randn(8)

    def call():
        y = torch.empty(8)
        rows[(2,)](TensorDescriptor.from_tensor(x.view(2, 4), [2, 4]), b, y, 8)
        return y

    y, tp, why = tape.record((x,), call)
    return y, tp, why, x, b


def test_a_direct_launch_hands_the_c_launcher_what_tritons_runner_hands_it(monkeypatch):
    """Where Triton's launcher is 3.6's, a replay calls the compiled C launcher itself with the
    arguments expanded when recorded (a descriptor over a per-call tensor expanded anew): the same
    arguments Triton's own path gives it, and the kernel's effect on the new x."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    calls = []

    def c_launch(gx, gy, gz, stream, function, coop, pdl, gs, ps, meta, lmeta, enter, exit_, *args):
        (_, base, _), _, _, _, _, b, y, n, scale = args  # _rows2(desc over x, b, y, n, SCALE): y = SCALE * x + b
        calls.append(((gx, gy, gz, stream, function, meta), args))
        with _disable_current_modes():
            y[:n] = scale * base.reshape(-1)[:n] + b[:n]

    class Compiled:
        function, packed_metadata = "fn", "packed"
        run = _Launcher36(_wrap_like_triton36(c_launch, {0}, [{"swizzle": 0}]))

        def __getitem__(self, grid):
            def runner(*args, stream=None):
                self.run(*grid, stream, self.function, self.packed_metadata, None, None, None, *args)

            return runner

    def fake_run(self, *args, grid, warmup, **kwargs):
        compiled = Compiled()
        bound = self.signature.bind(*args)
        bound.apply_defaults()
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*bound.arguments.values(), stream=0)
        return compiled

    y, tp, why, x, b = _record_rows2(monkeypatch, fake_run, _fake_fill)
    assert why is None and torch.equal(y, 3 * x + b)
    (direct, _), = tp.steps
    assert direct is not None, "Triton 3.6's launcher: the replay launches directly"
    x2 = torch.randn(8)
    y2 = tp.replay((x2,), stream=7)
    assert torch.equal(y2, 3 * x2 + b), "the descriptor expanded anew over x2"
    head, args = calls[-1]
    assert head == (2, 1, 1, 7, "fn", "packed")
    y3 = torch.empty(8)
    Compiled()[(2, 1, 1)](TensorDescriptor.from_tensor(x2.view(2, 4), [2, 4]), b, y3, 8, 3, stream=7)
    runner_args = calls[-1][1]
    assert len(args) == len(runner_args) and args[0][1].data_ptr() == runner_args[0][1].data_ptr() == x2.data_ptr()
    assert [a for a in args[1:] if not isinstance(a, torch.Tensor)] == [a for a in runner_args[1:]
                                                                         if not isinstance(a, torch.Tensor)]
    assert args[5] is b and args[6] is y2


def test_a_descriptor_over_a_per_call_tensor_is_filled_again_only_at_a_new_address(monkeypatch):
    """A direct replay fills a per-call tensor's descriptor again only when the tensor's address
    changes (moe_experts' weights, the same each call); the expansion it keeps holds no tensor."""
    import gc
    import weakref


    fills, seen = [], []

    def fill(desc, meta):  # as Triton 3.6 fills one with its metadata: a map of the address, no tensor
        fills.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr()), *desc.shape, *desc.strides]

    def c_launch(gx, gy, gz, stream, function, coop, pdl, gs, ps, meta, lmeta, enter, exit_, *args):
        seen.append(args[0][1])

    class Compiled:
        function, packed_metadata = "fn", "packed"
        run = _Launcher36(_wrap_like_triton36(c_launch, {0}, [{"swizzle": 0}]))

        def __getitem__(self, grid):  # a compiled kernel's launch: the recorded call's effect is not read here
            return lambda *args, stream=None: None

    _, tp, why, _, _ = _record_rows2(monkeypatch, lambda self, *a, grid, warmup, **kw: Compiled(), fill)
    assert why is None and tp.steps[0][0] is not None
    fills.clear()
    w = torch.randn(8)
    for _ in range(3):
        tp.replay((w,), stream=0)
    assert fills == [w.data_ptr()] and seen[-3:] == [w.data_ptr()] * 3, "filled once for three replays over w"
    w2 = torch.randn(8)
    tp.replay((w2,), stream=0)
    assert fills[-1] == w2.data_ptr() and seen[-1] == w2.data_ptr(), "a new address: filled again"
    ref = weakref.ref(w2)
    del w2
    gc.collect()
    assert ref() is None, "the kept expansion holds no tensor"


def test_a_launch_hook_sends_the_replay_through_tritons_runner(kernel, monkeypatch):
    """With a launch hook set (a profiler watching launches) a replay takes the kernel's own
    runner, which calls the hook; a direct launch would skip it."""
    x, b = torch.randn(5), torch.randn(5)

    def run():
        y = torch.empty(5)
        kernel[(1,)](x, b, y, 5)
        return y

    _, tp, _ = tape.record((x,), run)
    used = []
    tp.steps = [(lambda *a: used.append("direct"), lambda *a: used.append("runner"))]
    tp.replay((x,), stream=0)
    monkeypatch.setattr(tape.knobs.runtime, "launch_enter_hook", lambda *a: None)
    tp.replay((x,), stream=0)
    assert used == ["direct", "runner"]


def test_the_tapes_kept_drop_the_least_recently_replayed_first(kernel, monkeypatch):
    """TAPE_MAX_KEPT tapes at most: a replay makes its tape the most recently used, so a newer shape
    drops the tape that has gone unused longest, not the one recorded first."""
    from megamoe.kernels import moe

    b = torch.randn(6)

    def call(key):
        x = torch.randn(6)

        def run():
            y = torch.empty(6)
            kernel[(1,)](x, b, y, 6)
            return y

        return moe._taped((x,), (key,), run)

    monkeypatch.setitem(tape._ORIGINAL, JITFunction, _fake_run)  # the plain calls launch the stand-in too
    monkeypatch.setattr(JITFunction, "run", _fake_run)
    moe.clear_caches()
    monkeypatch.setattr(moe, "TAPE_MAX_KEPT", 2)
    for key in ("a", "a", "b", "b", "a"):  # a: plain, recorded; b: plain, recorded; a replayed
        call(key)
    call("c")  # a third shape: one of the two tapes goes
    kept = {k[0][0] for k, v in moe._tapes.items() if type(v) is tape.Tape}
    assert kept == {"a"}, f"the replayed tape stays, the unused one goes: {list(moe._tapes)}"
    moe.clear_caches()
