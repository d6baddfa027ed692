"""Microbenchmark of L2 reads that many programs make at once (``megamoe calibrate`` step ``l2_shared``).

Shape legend: P programs, g sharing group, T tiles of the working set, BM/BN/BK tile sizes.

``_l2_shared_read_kernel``: P programs sweep one L2-resident set of T weight tiles through the
GEMM load + dot loop; program p starts at tile (p // g) x spread, so a group reads the same tile at
the same step and groups read different tiles. ``check=True`` compares with torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .microbench import _check, _k_steps


# --------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["k_tiles", "num_tiles", "group", "spread"])
def _l2_shared_read_kernel(w_ptr, a_ptr, out_ptr, k_tiles, num_tiles, group, spread,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program p reads tiles (start + kt) mod num_tiles for kt < k_tiles, start = (p // group) x
    spread, each a contiguous (BLOCK_N, BLOCK_K) block of w, into acc += a @ tile^T."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    start = (pid // group) * spread
    w = w_ptr + offs_n[None, :] * BLOCK_K + offs_k[:, None]
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(k_tiles):
        t = ((start + kt) % num_tiles).to(tl.int64)
        acc = tl.dot(a, tl.load(w + t * (BLOCK_N * BLOCK_K)), acc)
    tl.store(out_ptr + pid.to(tl.int64) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def l2_shared_layout(num_tiles: int, programs: int, group: int) -> tuple[int, int]:
    """(groups, spread): ceil(P / g) groups start ``spread`` = num_tiles // groups tiles apart.
    ValueError where the working set has fewer tiles than groups."""
    if programs < 1 or group < 1:
        raise ValueError(f"programs and group must be >= 1, got {programs} and {group}")
    groups = -(-programs // group)
    if num_tiles < groups:
        raise ValueError(f"{groups} groups of {group} programs need at least {groups} tiles, the working set has "
                         f"{num_tiles}")
    return groups, num_tiles // groups


def l2_shared_read(w: torch.Tensor, programs: int, group: int, bytes_per_program: int, *, num_warps: int = 4,
                   num_stages: int = 4, block_m: int = 16, check: bool = False) -> torch.Tensor:
    """``programs`` programs each read ``bytes_per_program`` of w (T, BN, BK), groups of ``group``
    reading the same tile at once -> (programs, BM, BN) fp32."""
    if w.dim() != 3:
        raise ValueError(f"w must be (tiles, BLOCK_N, BLOCK_K), got shape {list(w.shape)}")
    T, bn, bk = w.shape
    tile = bn * bk * w.element_size()
    k_tiles = _k_steps(bytes_per_program, tile, f"one {bn} x {bk} tile")
    _, spread = l2_shared_layout(T, programs, group)
    a = torch.ones((block_m, bk), device=w.device, dtype=w.dtype)
    out = torch.empty((programs, block_m, bn), device=w.device, dtype=torch.float32)
    _l2_shared_read_kernel[(programs,)](w, a, out, k_tiles, T, group, spread, BLOCK_M=block_m, BLOCK_N=bn,
                                        BLOCK_K=bk, num_warps=num_warps, num_stages=num_stages)
    if check:  # program p: the row sums of tiles (start_p + kt) mod T, kt < k_tiles
        rsum = w.float().sum(dim=2)  # (T, BN)
        p = torch.arange(programs, device=w.device)
        idx = ((p // group) * spread)[:, None] + torch.arange(k_tiles, device=w.device)[None, :]
        want = rsum[idx % T].sum(dim=1)  # (P, BN)
        _check(torch.allclose(out, want[:, None, :].expand_as(out), rtol=1e-3, atol=1e-2), "l2_shared_read")
    return out
