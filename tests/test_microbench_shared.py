"""The shared-read microbenchmark (megamoe/calibrate/microbench_shared.py) computes what it claims,
under the interpreter at tiny sizes (never timed)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.interpret


def test_l2_shared_read_sweeps_the_set_in_groups():
    """Program p reads tiles (p // g) x spread + kt mod T (checked against torch): groups of g read
    the same tiles, the groups start apart; wraps past the set's end; refuses bad sizes."""
    from megamoe.calibrate import microbench_shared as ms

    torch.manual_seed(0)
    w = torch.randn(12, 16, 16).to(torch.float16)  # the bf16 weights' stand-in
    tile = 16 * 16 * w.element_size()
    for P, g in ((5, 1), (6, 2), (3, 8)):  # no sharing, groups that divide P, a group larger than P
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
