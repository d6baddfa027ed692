"""The fused one-sided EP step (kernels/ep_fused.py: pulls, expert tiles and push-backs in one launch per rank).

Emulated ranks (every rank's symmetric buffers in this process, poisoned first) on the ``device`` fixture:
CPU tensors under the Triton interpreter here (one program takes every ticket), one GPU's memory with
the compiled kernel there. Checked against the float64 expert-parallel layer of the reference, bitwise
against the phased path on the same GEMM tiles (SymmetricStep without ``fused``, backend "kernels"; a
slot's pairs sit in its tiles by peer step here, by source there, the same order on rank 0 only, and
every rank's y sums every computing rank's rows: the interpreter's dot, NumPy's matmul, may round a
row by its place in the tile, so with R > 1 the CPU compares within a few fp32 ulps, a GPU bitwise),
bitwise from run to run and across program counts; the padded pair layout the pulls write against
reference.ep_tasks.place_pairs; bad slot counts named.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels_ep_symmetric import CASES, CFG, _buffers, _inputs, _tensors

from megamoe.reference import assert_close
from megamoe.reference.ep import ep_experts_forward, pull_rows
from megamoe.reference.ep_tasks import check_ticket_order, pair_positions, place_pairs

pytestmark = pytest.mark.interpret


def _run(device, name, max_rows, *, fused=True, num_programs=None, steps=None, poison=True):
    from megamoe.kernels.ep_symmetric import ep_moe_experts_emulated

    w, xs, slots, tw, placement, shards = _inputs(name, device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(len(xs), max(1, max(x.shape[0] for x in xs)), device)
    ys = ep_moe_experts_emulated(xt, slots, twt, shards, bufs, max_rows=max_rows, backend="kernels", fused=fused,
                                 num_programs=num_programs, steps_out=steps)
    return ys, (w, xs, slots, tw, placement)


@pytest.mark.parametrize("name,max_rows", [c[:2] for c in CASES], ids=[c[0] for c in CASES])
def test_fused_matches_reference_and_phased_path(device, name, max_rows):
    ys, (w, xs, slots, tw, placement) = _run(device, name, max_rows)
    phased, _ = _run(device, name, max_rows, fused=False)
    ref = ep_experts_forward(xs, slots, tw, placement.slot_expert, placement.slot_rank, w, CFG, transport="pull",
                             max_rows=max_rows)
    for r, y in enumerate(ys):
        assert y.shape == (xs[r].shape[0], CFG.hidden_size)
        assert torch.isfinite(y.float()).all(), f"rank {r}: a row was left unwritten (poisoned buffers)"
        assert_close(y.double().cpu().numpy(), ref[r], device.dtype, f"fused EP, rank {r} of {name}")
        if len(ys) == 1 or device.name == "cuda":
            assert torch.equal(y, phased[r]), (f"rank {r} of {name}: fused differs from the phased path by "
                                               f"{(y.float() - phased[r].float()).abs().max().item():.3g}")
        else:  # the interpreter's dot (NumPy's matmul) may round a row by its place in the tile
            torch.testing.assert_close(y, phased[r], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,max_rows", [("four-rr", 3), ("three-eplb", None)])
def test_fused_is_bitwise_across_programs_and_calls(device, name, max_rows):
    """The same y from 1 program, the default grid and a second call on the same buffers (epochs advance)."""
    from megamoe.kernels.ep_symmetric import ep_moe_experts_emulated

    a, _ = _run(device, name, max_rows, num_programs=1)
    b, _ = _run(device, name, max_rows)
    w, xs, slots, tw, placement, shards = _inputs(name, device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(len(xs), max(1, max(x.shape[0] for x in xs)), device)
    first = ep_moe_experts_emulated(xt, slots, twt, shards, bufs, max_rows=max_rows, backend="kernels", fused=True)
    again = ep_moe_experts_emulated(xt, slots, twt, shards, bufs, max_rows=max_rows, backend="kernels", fused=True)
    for r in range(len(a)):
        assert torch.equal(a[r], b[r]) and torch.equal(first[r], again[r]) and torch.equal(a[r], first[r])
    assert all(int(bf.epoch[0]) == 2 and int(bf.epoch[1]) == 2 for bf in bufs)


def test_pulls_write_the_planned_pair_layout(device):
    """After the launch, each rank's padded rows are reference.ep_tasks.place_pairs' (its plan checked first)."""
    steps = []
    _, (w, xs, slots, tw, placement) = _run(device, "four-rr", 3, steps=steps)
    R = len(xs)
    P = placement.slot_rank.size
    sched_sends = [s.send for s in steps]
    pull = steps[0].plan
    idx_send = [np.asarray(slots[r], np.int64)[sched_sends[r].send_token] for r in range(R)]
    pos_send = [pair_positions(np.asarray(slots[r], np.int64), P)[sched_sends[r].send_token] for r in range(R)]
    recv_idx, recv_pos = pull_rows(pull, idx_send), pull_rows(pull, pos_send)
    for r, s in enumerate(steps):
        check_ticket_order(s.fused_plan)
        want_row, want_pair = place_pairs(s.fused_plan, pull, recv_idx[r], recv_pos[r], placement.slot_rank)
        n = s.fused_plan.num_padded
        assert np.array_equal(s.fused_buffers.padded_row[:n].cpu().numpy(), want_row), f"rank {r}"
        assert np.array_equal(s.fused_buffers.padded_pair[:n].cpu().numpy(), want_pair), f"rank {r}"


def test_fused_needs_matching_slot_counts(device):
    from megamoe.kernels.ep import EPInputError
    from megamoe.kernels.ep_symmetric import SymmetricStep

    w, xs, slots, tw, placement, shards = _inputs("two-ranks", device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(2, max(x.shape[0] for x in xs), device)
    traffic = np.stack([s.send_counts for s in
                        (SymmetricStep(bufs[r], shards[r], xt[r], slots[r], twt[r], lambda c: np.stack([c, c]))
                         .send for r in (0,))] * 2)
    with pytest.raises(EPInputError, match="fused=True needs slot_counts"):
        SymmetricStep(bufs[0], shards[0], xt[0], slots[0], twt[0], traffic, fused=True, backend="kernels")
    bad = np.zeros((2, placement.slot_rank.size), np.int64)
    with pytest.raises(EPInputError, match="slot_counts row 0"):
        SymmetricStep(bufs[0], shards[0], xt[0], slots[0], twt[0], traffic, fused=True, backend="kernels",
                      slot_counts=bad)
    with pytest.raises(EPInputError, match="backend must be 'kernels'"):
        SymmetricStep(bufs[0], shards[0], xt[0], slots[0], twt[0], traffic, fused=True, backend="torch",
                      slot_counts=bad)


def test_trace_summary_reads_the_ticket_rows(device):
    """trace_summary on a hand-made trace: per kind counts, mean waits and work, spans (us); a bad shape named;
    a trace on the CPU refused by name (the timer is PTX)."""
    from megamoe.kernels.ep import EPInputError
    from megamoe.kernels.ep_fused import launch_fused, trace_summary

    steps = []
    _run(device, "two-ranks", 1, steps=steps)
    plan = steps[0].fused_plan
    n = plan.num_tasks
    taken = np.arange(n, dtype=np.int64) * 1000 + 5000  # ticket t taken at 5 + t us, waits 0.5 us, works 2 us
    trace = np.stack([np.zeros(n, np.int64), taken, taken + 500, taken + 2500], axis=1)
    s = trace_summary(plan, trace)
    assert s["span"] == pytest.approx((n - 1) + 2.5)
    for k, cnt in plan.tasks_per_kind().items():
        if cnt:
            assert s[k]["n"] == cnt and s[k]["wait"] == pytest.approx(0.5) and s[k]["work"] == pytest.approx(2.0)
    with pytest.raises(EPInputError, match="trace must have shape"):
        trace_summary(plan, trace[:-1])
    if device.name == "cpu":
        st = steps[0]
        with pytest.raises(EPInputError, match="trace must be an int64"):
            launch_fused(plan, st.tiles, st.fused_buffers, st.shard, st.buffers, st._pulls_dev, st._pushes_dev,
                         int(st.plan.recv_rows[0]), trace=torch.zeros((n, 4), dtype=torch.int64))


def test_fused_on_cpu_needs_the_interpreter(device, monkeypatch):
    """CPU tensors without TRITON_INTERPRET: a clear error before any launch, not a crash in the kernel."""
    from megamoe.kernels import ep_symmetric
    from megamoe.kernels.ep import EPInputError

    if device.name != "cpu":
        pytest.skip("a CPU case")
    w, xs, slots, tw, placement, shards = _inputs("two-ranks", device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(2, max(x.shape[0] for x in xs), device)
    monkeypatch.setattr(ep_symmetric, "_interpreting", lambda: False)
    with pytest.raises(EPInputError, match="TRITON_INTERPRET=1"):
        ep_symmetric.ep_moe_experts_emulated(xt, slots, twt, shards, bufs, backend="kernels", fused=True)
