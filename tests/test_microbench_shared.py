"""The shared-read and many-program serial microbenchmarks (kernels/microbench_shared.py) compute
what they claim, under the interpreter at tiny sizes (never timed)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.interpret


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_l2_shared_read_sweeps_the_set_in_groups(dtype):
    """Program p reads tiles (p // g) x spread + kt mod T (checked against torch): groups of g read
    the same tiles, the groups start apart; wraps past the set's end; refuses bad sizes."""
    from megamoe.kernels import microbench_shared as ms

    torch.manual_seed(0)
    w = torch.randn(12, 16, 16).to(dtype)
    tile = 16 * 16 * w.element_size()
    for P, g in ((1, 1), (5, 1), (6, 2), (7, 4), (12, 1), (3, 8)):
        out = ms.l2_shared_read(w, P, g, 5 * tile, num_stages=1, check=True)
        for p in range(P):  # the programs of one group read the same tiles: the same sums
            assert torch.equal(out[p], out[p - p % g])
    out = ms.l2_shared_read(w, 4, 1, 15 * tile, num_stages=1, check=True)  # 15 tiles of 12: a wrap
    assert not torch.allclose(out[0], out[1])  # groups read different tiles
    assert ms.l2_shared_layout(12, 6, 2) == (3, 4)
    with pytest.raises(ValueError, match="13 groups of 1 programs need at least 13 tiles"):
        ms.l2_shared_read(w, 13, 1, tile)
    with pytest.raises(ValueError, match="positive multiple"):
        ms.l2_shared_read(w, 2, 1, tile + 2)
    with pytest.raises(ValueError, match="tiles, BLOCK_N, BLOCK_K"):
        ms.l2_shared_read(w.reshape(12 * 16, 16), 2, 1, tile)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_serial_load_many_runs_the_router_loop_and_the_chain(dtype):
    """P programs each x_p @ w over ``steps`` column blocks of a wider x (its row stride), in
    order or along the next table (a cycle: every block once), both equal to torch's product."""
    from megamoe.kernels import microbench_shared as ms

    torch.manual_seed(1)
    x = torch.randn(3 * 16, 6 * 32).to(dtype)
    w = torch.randn(6 * 32, 16).to(dtype)
    for steps in (1, 5, 6):
        a = ms.serial_load_many(x, w, 3, steps, block_h=32, check=True)
        b = ms.serial_load_many(x, w, 3, steps, block_h=32, chain=True, check=True)
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)
    nxt = ms.chain_table(7, "cpu", seed=3)
    c, seen = 0, []
    for _ in range(7):
        seen.append(c)
        c = int(nxt[c])
    assert sorted(seen) == list(range(7)) and c == 0  # one cycle through every block, back to 0
    broken = torch.tensor([1, 0, 3, 2, 4, 5], dtype=torch.int32)  # two cycles and fixed points
    with pytest.raises(AssertionError, match="not one cycle"):
        ms.serial_load_many(x, w, 3, 6, block_h=32, chain=True, nxt=broken, check=True)
    with pytest.raises(ValueError, match="must hold 5 blocks of rows"):
        ms.serial_load_many(x, w, 5, 2, block_h=32)


def test_serial_reduce_many_picks_each_programs_top_k():
    """P programs each sum the columns of their rows' top-k (checked against torch.topk), each
    program over its own rows only."""
    from megamoe.kernels import microbench_shared as ms

    torch.manual_seed(2)
    v = torch.randn(3 * 16, 32)
    out = ms.serial_reduce_many(v, 3, 5, check=True)
    assert torch.equal(out[16:32], ms.serial_reduce_many(v[16:32].contiguous(), 1, 5))  # each program its own rows
