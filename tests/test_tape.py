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


class _Compiled:
    """A compiled kernel's stand-in: ``[grid]`` gives a runner that computes y = SCALE * x + b."""

    launches = 0

    def __getitem__(self, grid):
        def runner(x, b, y, n, scale, stream=None):
            _Compiled.launches += 1
            with _disable_current_modes():
                y[:n] = scale * x[:n] + b[:n]

        return runner


def _fake_run(self, *args, grid, warmup, **kwargs):
    bound = self.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in self.signature.parameters})
    bound.apply_defaults()
    _Compiled()[grid](*bound.arguments.values())
    return _Compiled()


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(tape, "_jit_run", _fake_run)
    return JITFunction(_axpb)


def test_replay_swaps_x_and_y_and_keeps_the_rest(kernel):
    b = torch.randn(7)
    x = torch.randn(7)

    def run(x=x):
        y = torch.empty(7)
        kernel[(1,)](x, b, y, 7, num_warps=4)
        return y

    y, tp, why = tape.record(x, run)
    assert why is None and tp is not None
    assert torch.equal(y, 2 * x + b)
    assert JITFunction.run is tape._ORIGINAL_RUN, "the launch path is put back after recording"
    x2 = torch.randn(7)
    before = _Compiled.launches
    y2 = tp.replay(x2, stream=0)
    assert _Compiled.launches == before + 1
    assert y2 is not y and torch.equal(y2, 2 * x2 + b), "a fresh y from the new x, b kept"


def test_a_torch_op_beside_the_launches_gives_no_tape(kernel):
    x = torch.randn(5)

    def run():
        y = torch.empty(5)
        kernel[(1,)](x, x, y, 5)
        y.mul_(3)  # work the launches alone would not repeat
        return y

    y, tp, why = tape.record(x, run)
    assert tp is None and "aten::mul_" in why
    assert torch.allclose(y, 3 * (2 * x + x))


def test_an_argument_viewing_x_gives_no_tape(kernel):
    x = torch.randn(8)

    def run():
        y = torch.empty(4)
        kernel[(1,)](x[4:], x, y, 4)  # a view of x: the replay would read the recorded x
        return y

    _, tp, why = tape.record(x, run)
    assert tp is None and "x_ptr views x or y" in why


def test_a_grid_function_or_no_launch_gives_no_tape(kernel):
    x = torch.randn(3)
    _, tp, why = tape.record(x, lambda: torch.empty(3))
    assert tp is None and why == "no launch wrote y"

    def run():
        y = torch.empty(3)
        kernel[lambda meta: (1,)](x, x, y, 3)
        return y

    _, tp, why = tape.record(x, run)
    assert tp is None and "grid function" in why


def test_fits_asks_what_the_recorded_x_was_specialized_for():
    tp = tape.Tape([], (4, 8), x_aligned=True)
    x = torch.zeros(40)
    assert tp.fits(x[:32].view(4, 8))
    assert not tp.fits(x[1:33].view(4, 8)), "4 bytes off a 16-byte boundary"
    assert not tp.fits(torch.zeros(8, 4).t())
    assert tape.Tape([], (4, 8), x_aligned=False).fits(x[1:33].view(4, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["megakernel", "multi"])
def test_replayed_eager_calls_are_fresh_calls(backend):
    """Eager calls on fresh x each time: the third and later replay a tape, bitwise a fresh call's y."""
    from megamoe.kernels import moe
    from megamoe.reference import MoEConfig, random_weights

    cfg = MoEConfig(hidden_size=256, intermediate_size=128, num_experts=16, top_k=4, name="tape")
    w = random_weights(cfg, seed=3).to_torch("cuda", torch.bfloat16)
    rng = np.random.default_rng(5)
    moe.clear_caches()
    for T in (1, 7, 64):
        for _ in range(4):
            x = torch.tensor(rng.standard_normal((T, cfg.hidden_size)), dtype=torch.bfloat16, device="cuda")
            y = moe.moe_forward(x, w, cfg, backend=backend)
            fresh = moe._layer(x, w, cfg, True, backend)
            assert torch.equal(y, fresh), f"T={T}"
    tapes = [v for v in moe._tapes.values() if type(v) is tape.Tape]
    assert len(tapes) == 3, f"a tape per T: {list(moe._tapes.values())}"
    moe.clear_caches()
