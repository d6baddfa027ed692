"""The one-sided copy kernel (kernels/ep_pull.py) against reference.ep.pull_rows / push_rows, bitwise.

On the ``device`` fixture: CPU tensors under the Triton interpreter here (tests/conftest.py sets
TRITON_INTERPRET=1 without a GPU), CUDA tensors of one GPU on a GPU machine. The "peers" are separate
tensors of this process, their base addresses a table of data_ptr()s as symmetric memory would give.
Routings and placements are tests/test_reference_ep_pull.py's scenarios (R = 1..4, idle ranks, T = 0).
Every receive / combine buffer starts poisoned (NaN), so a row the kernel leaves unwritten shows; the
comparison is of the bits (integer views), so bf16 on a GPU goes through the NumPy reference too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_reference_ep_pull import SCENARIOS, _scenario

from megamoe.reference import InputError
from megamoe.reference.ep import all_to_all_rows, plan_ep, plan_pull, pull_rows, push_rows

pytestmark = pytest.mark.interpret

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's bits as a NumPy integer array (NaN-safe, bf16-safe)."""
    t = t.detach().contiguous()
    if t.is_floating_point():
        t = t.view(_BITS[t.element_size()])
    return t.cpu().numpy()


def _dtypes(device):
    return [device.dtype, device.half]


def _traffic(name: str) -> np.ndarray:
    _, xs, slots, _, placement, _ = _scenario(name)
    return plan_ep(slots, placement.slot_rank, len(xs)).traffic()


def _rows(rng, n: int, H: int, device, dtype) -> torch.Tensor:
    return device.tensor(rng.standard_normal((int(n), H)), dtype)


def _poisoned(n: int, H: int, device, dtype) -> torch.Tensor:
    return torch.full((int(n), H), float("nan"), dtype=device.torch_dtype(dtype), device=device.name)


#: every scenario once, the row caps taken in turn (None: no cap; 1 and 3: copies split into pieces)
@pytest.mark.parametrize("name,max_rows", [(s[0], (None, 1, 3)[i % 3]) for i, s in enumerate(SCENARIOS)])
def test_pull_and_push_equal_the_reference(rng, device, name, max_rows):
    """Every destination's pulls and every rank's push-backs: bitwise reference.ep.pull_rows / push_rows."""
    from megamoe.kernels.ep_pull import pull_rows_triton, push_rows_triton

    traffic = _traffic(name)
    R = traffic.shape[0]
    for dtype, H in zip(_dtypes(device), (24, 40)):
        ps = plan_pull(traffic, H, 2, max_rows=max_rows)
        sends = [_rows(rng, n, H, device, dtype) for n in ps.send_rows]
        want = pull_rows(ps, [_bits(s) for s in sends])
        assert all(np.array_equal(w, a) for w, a in zip(want, all_to_all_rows([_bits(s) for s in sends], traffic)))
        for d in range(R):
            recv = pull_rows_triton(ps, d, sends, _poisoned(ps.recv_rows[d], H, device, dtype))
            assert recv.shape == (ps.recv_rows[d], H)
            np.testing.assert_array_equal(_bits(recv), want[d], err_msg=f"{dtype} rank {d}")
            fresh = pull_rows_triton(ps, d, sends)  # recv allocated by the call
            assert fresh.dtype == sends[0].dtype and np.array_equal(_bits(fresh), want[d])
        partials = [_rows(rng, n, H, device, dtype) for n in ps.recv_rows]
        want_back = push_rows(ps, [_bits(p) for p in partials])
        combine = [_poisoned(n, H, device, dtype) for n in ps.send_rows]
        for c in range(R):
            assert push_rows_triton(ps, c, partials[c], combine)[c] is combine[c]
        for s in range(R):
            np.testing.assert_array_equal(_bits(combine[s]), want_back[s], err_msg=f"{dtype} combine of {s}")


def test_idle_ranks_and_no_tokens(device):
    """Ranks with nothing to pull get an empty receive buffer; T = 0 everywhere moves nothing."""
    from megamoe.kernels.ep_pull import pull_rows_triton, push_rows_triton

    ps = plan_pull(_traffic("four-empty"), 24, 2)
    assert ps.num_pulls == 0
    sends = [_poisoned(0, 24, device, None) for _ in range(4)]
    for d in range(4):
        assert pull_rows_triton(ps, d, sends).shape == (0, 24)
        push_rows_triton(ps, d, _poisoned(0, 24, device, None), sends)
    ps = plan_pull(_traffic("four-one-rank"), 24, 2, max_rows=2)  # every slot on rank 3
    assert ps.recv_rows[:3].tolist() == [0, 0, 0] and ps.recv_rows[3] > 0
    rng = np.random.default_rng(3)
    sends = [_rows(rng, n, 24, device, None) for n in ps.send_rows]
    want = pull_rows(ps, [_bits(s) for s in sends])
    for d in range(4):
        np.testing.assert_array_equal(_bits(pull_rows_triton(ps, d, sends)), want[d])


def test_one_push_writes_only_its_rows(rng, device):
    """A rank's push-back touches exactly the rows of each combine buffer whose send rows it pulled."""
    from megamoe.kernels.ep_pull import push_rows_triton

    ps = plan_pull(_traffic("four-rr"), 24, 2, max_rows=3)
    partials = [_rows(rng, n, 24, device, None) for n in ps.recv_rows]
    want = push_rows(ps, [_bits(p) for p in partials])
    for c in range(4):
        combine = [_poisoned(n, 24, device, None) for n in ps.send_rows]
        push_rows_triton(ps, c, partials[c], combine)
        send_off = np.cumsum(ps.traffic, axis=1) - ps.traffic  # [s, c]: c's rows in s's send buffer
        for s in range(4):
            mine = np.zeros(int(ps.send_rows[s]), bool)
            mine[send_off[s, c]:send_off[s, c] + ps.traffic[s, c]] = True
            got = combine[s].cpu()
            assert torch.isnan(got[~torch.from_numpy(mine)]).all(), (c, s)
            np.testing.assert_array_equal(_bits(got)[mine], want[s][mine])


@pytest.mark.parametrize("num_programs", [1, 5])  # one program walks all; several, one past the copies
def test_the_grid_does_not_change_the_bits(rng, device, num_programs):
    """One program or many (tiles dealt round-robin across copies): the same receive buffers."""
    from megamoe.kernels.ep_pull import pull_rows_triton

    ps = plan_pull(_traffic("three-eplb"), 40, 2, max_rows=1)
    sends = [_rows(rng, n, 40, device, device.half) for n in ps.send_rows]
    want = pull_rows(ps, [_bits(s) for s in sends])
    for d in range(3):
        got = pull_rows_triton(ps, d, sends, num_programs=num_programs)
        np.testing.assert_array_equal(_bits(got), want[d])


def test_column_blocks_and_partial_tiles(rng, device, monkeypatch):
    """Rows wider than a column block (H = 40 over blocks of 16: two full, one masked) and row blocks
    that end inside a copy (copies of 5 rows in blocks of 2)."""
    from megamoe.kernels import ep_pull

    monkeypatch.setattr(ep_pull, "MAX_BLOCK_W", 16)
    monkeypatch.setattr(ep_pull, "TILE_ELEMENTS", 32)
    ps = plan_pull(_traffic("two-ranks"), 40, 4, max_rows=5)
    assert ps.pull_rows.max() == 5
    sends = [_rows(rng, n, 40, device, None) for n in ps.send_rows]
    want = pull_rows(ps, [_bits(s) for s in sends])
    for d in range(2):
        got = ep_pull.pull_rows_triton(ps, d, sends, _poisoned(ps.recv_rows[d], 40, device, None), num_programs=3)
        np.testing.assert_array_equal(_bits(got), want[d])


def test_symmetric_sized_buffers_and_metadata_rows(rng, device):
    """Buffers of ``buffer_rows`` rows (one symmetric allocation per kind): rows past a rank's share
    are left alone; topk_idx (int64) and topk_weights rows move with the same schedule."""
    from megamoe.kernels.ep_pull import pull_rows_triton

    ps = plan_pull(_traffic("three-random"), 24, 2, max_rows=4)
    B = ps.buffer_rows
    sends = [_rows(rng, B, 24, device, None) for _ in range(3)]
    want = pull_rows(ps, [_bits(s)[:n] for s, n in zip(sends, ps.send_rows)])
    idx = [torch.from_numpy(rng.integers(0, 9, (B, 2))).to(device.name) for _ in range(3)]
    want_idx = pull_rows(ps, [i.cpu().numpy()[:n] for i, n in zip(idx, ps.send_rows)])
    for d in range(3):
        recv = pull_rows_triton(ps, d, sends, _poisoned(B, 24, device, None))
        n = int(ps.recv_rows[d])
        np.testing.assert_array_equal(_bits(recv)[:n], want[d])
        assert torch.isnan(recv[n:].cpu()).all()
        got = pull_rows_triton(ps, d, idx)
        assert got.dtype == torch.int64 and np.array_equal(got.cpu().numpy(), want_idx[d])


def test_bad_inputs_are_named(device, monkeypatch):
    from megamoe.kernels.ep_pull import pull_rows_triton, push_rows_triton

    ps = plan_pull(np.array([[1, 2], [3, 4]]), 8, 2)  # send rows [3, 7], receive rows [4, 6]
    t = device.torch_dtype()

    def z(n, H=8, dtype=t):
        return torch.zeros((n, H), dtype=dtype, device=device.name)

    sends = [z(3), z(7)]
    with pytest.raises(InputError, match="pull must be a reference.ep.PullSchedule"):
        pull_rows_triton(ps.traffic, 0, sends)
    for bad in (-1, 2):
        with pytest.raises(InputError, match=rf"need 0 <= rank < num_ranks, got rank={bad}, num_ranks=2"):
            pull_rows_triton(ps, bad, sends)
    with pytest.raises(InputError, match="rank must be an integer, got True"):
        pull_rows_triton(ps, True, sends)
    with pytest.raises(InputError, match="need one send buffer per rank: got 1 for 2 ranks"):
        pull_rows_triton(ps, 0, sends[:1])
    other = torch.float16 if t != torch.float16 else torch.float32
    with pytest.raises(InputError, match=f"send buffer of rank 1 is {other}, the other buffers are {t}: dtype mismatch"):
        pull_rows_triton(ps, 0, [z(3), z(7, dtype=other)])
    with pytest.raises(InputError, match=r"send buffer of rank 1 has rows of shape \[6\] \(H=6\), the other buffers "
                                         r"\[8\] \(H=8\)"):
        pull_rows_triton(ps, 0, [z(3), z(7, 6)])
    with pytest.raises(InputError, match="send buffer of rank 1 has 6 rows, the schedule needs 7"):
        pull_rows_triton(ps, 0, [z(3), z(6)])
    with pytest.raises(InputError, match="receive buffer of rank 1 has 5 rows, the schedule needs 6"):
        pull_rows_triton(ps, 1, sends, z(5))
    with pytest.raises(InputError, match=r"receive buffer of rank 0 has rows of shape \[16\] \(H=16\)"):
        pull_rows_triton(ps, 0, sends, z(4, 16))
    with pytest.raises(InputError, match="receive buffer of rank 0 is torch.int64"):
        pull_rows_triton(ps, 0, sends, z(4, dtype=torch.int64))
    with pytest.raises(InputError, match="send buffer of rank 0 must be contiguous"):
        pull_rows_triton(ps, 0, [z(16, 3).t(), z(7)])
    with pytest.raises(InputError, match="send buffer of rank 1 must be a torch.Tensor, got ndarray"):
        pull_rows_triton(ps, 0, [z(3), np.zeros((7, 8))])
    with pytest.raises(InputError, match="num_programs must be an integer >= 1, got 0"):
        pull_rows_triton(ps, 0, sends, num_programs=0)
    with pytest.raises(InputError, match="partial buffer of rank 1 has 5 rows, the schedule needs 6"):
        push_rows_triton(ps, 1, z(5), sends)
    with pytest.raises(InputError, match="combine buffer of rank 0 has 2 rows, the schedule needs 3"):
        push_rows_triton(ps, 1, z(6), [z(2), z(7)])
    with pytest.raises(InputError, match="need one combine buffer per rank: got 3 for 2 ranks"):
        push_rows_triton(ps, 1, z(6), [z(3), z(7), z(7)])
    with pytest.raises(InputError, match="combine buffer of rank 1 has rows of shape"):
        push_rows_triton(ps, 1, z(6), [z(3), z(7, 4)])
    if device.name == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(InputError, match="only with TRITON_INTERPRET=1"):
            pull_rows_triton(ps, 0, sends)


def test_pulls_wait_for_each_peers_ready_flag(rng, device):
    """launch_copies with a ReadyWait: each program polls a peer's flag before its first copy from it; a flag
    below the epoch is polled spin_limit times, then recorded (peer + 1, the value read, kind 1) and the copies
    still run (the caller raises); flags at or past the epoch pass at once."""
    from megamoe.kernels.ep_pull import ReadyWait, copy_table, launch_copies

    ps = plan_pull(_traffic("three-random"), 24, 2, max_rows=2)
    d = 2
    sends = [_rows(rng, n, 24, device, None) for n in ps.send_rows]
    want = pull_rows(ps, [_bits(s) for s in sends])[d]
    peers = torch.tensor([s.data_ptr() for s in sends], dtype=torch.int64, device=device.name)
    mine = copy_table(ps, push=False)[ps.pulls(d)]
    assert set(mine[:, 0].tolist()) >= {0, 2}  # rank 2 pulls from rank 0 and from itself

    def pull(flags: list[int]):
        recv = _poisoned(ps.recv_rows[d], 24, device, None)
        status = torch.zeros(3, dtype=torch.int64, device=device.name)
        ready = ReadyWait(torch.tensor(flags, dtype=torch.int64, device=device.name),
                          torch.tensor([5], dtype=torch.int64, device=device.name), 4, status)
        launch_copies(mine, recv, peers, push=False, aligned=False, num_programs=2, ready=ready)
        return recv, status.tolist()

    recv, status = pull([5, 5, 6])
    assert status == [0, 0, 0] and np.array_equal(_bits(recv), want)
    recv, status = pull([4, 9, 5])  # rank 0 is a call behind
    assert status == [1, 4, 1] and np.array_equal(_bits(recv), want)
