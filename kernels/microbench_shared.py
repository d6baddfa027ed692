"""Microbenchmarks of reads that many programs make at once (``megamoe calibrate`` steps
``l2_shared`` and ``serial_programs``): numbers for the cost model, never the MoE kernels.

Shape legend: P programs, g sharing group (programs reading the same tile at once), T tiles of the
working set, BM/BN/BK tile sizes, BT/BH/BE the router's token rows, reduction block and experts.

    _l2_shared_read_kernel   P programs sweep one L2-resident working set of T weight tiles
                             (BN x BK, K-contiguous, as ``microbench._stream_tile_kernel`` reads
                             them) through the GEMM tiles' pipelined load + dot loop; program p
                             starts at tile (p // g) x spread, so the g programs of a group (grouped
                             order, consecutive program ids as GROUP_M row blocks) read the same
                             tile at the same step and the groups read different tiles: the L2
                             rate against programs and sharing group (g = 1: nobody shares at once)
    _serial_load_many_kernel P programs each run ``steps`` router steps: acc += x_p[:, c] (BT, BH)
                             @ w[c] (BH, BE), x_p its own token rows, w shared by every program (the
                             router's weights); CHAIN=False: c = the step (the router's loop, as
                             ``microbench._serial_load_kernel`` at P = 1); CHAIN=True: c is read
                             from a "next" table at an index that depends on the last tile loaded
                             (a dependent chain: no step's loads can start before the last's end)
    _serial_reduce_many_kernel  P programs each run ``steps`` dependent top-1 passes over their
                             own (BT, BE) rows (``microbench._serial_reduce_kernel`` at P = 1)

The launchers check what the kernels computed against torch (``check=True``): under
``TRITON_INTERPRET=1`` on tiny sizes the tests check them; only ``megamoe calibrate`` times them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .microbench import _check, _reduce_passes


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


@triton.jit(do_not_specialize=["steps", "stride_x"])
def _serial_load_many_kernel(x_ptr, w_ptr, nxt_ptr, out_ptr, steps, stride_x, CHAIN: tl.constexpr,
                             BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program p: acc += x[p BT : (p + 1) BT, c BH : (c + 1) BH] @ w[c BH : (c + 1) BH] for
    ``steps`` column blocks c: 0, 1, ... (CHAIN False) or 0, nxt[0], nxt[nxt[0]], ... (CHAIN True:
    the index read also depends on the x tile just loaded, through a term that is 0 for finite
    values)."""
    pid = tl.program_id(0)
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    offs_e = tl.arange(0, BLOCK_E)
    xrow = x_ptr + (pid.to(tl.int64) * BLOCK_T + offs_t)[:, None] * stride_x
    acc = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)
    c = pid * 0
    for s in range(steps):
        if not CHAIN:
            c = s
        xt = tl.load(xrow + (c * BLOCK_H + offs_h)[None, :])
        wt = tl.load(w_ptr + (c * BLOCK_H + offs_h)[:, None] * BLOCK_E + offs_e[None, :])
        acc = tl.dot(xt, wt, acc)
        if CHAIN:
            z = tl.sum(tl.sum(xt.to(tl.float32), axis=1), axis=0)
            c = tl.load(nxt_ptr + (c + (z != z).to(tl.int32)) % steps)  # z != z: NaN only
    tl.store(out_ptr + (pid.to(tl.int64) * BLOCK_T + offs_t)[:, None] * BLOCK_E + offs_e[None, :], acc)


@triton.jit(do_not_specialize=["steps"])
def _serial_reduce_many_kernel(v_ptr, out_ptr, steps, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program p: ``steps`` dependent (row max, lowest column holding it) passes over its own
    (BLOCK_T, BLOCK_E) rows, each masking the column it found; stores the picked columns' sum."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    v = tl.load(v_ptr + rows[:, None] * BLOCK_E + tl.arange(0, BLOCK_E)[None, :])
    tl.store(out_ptr + rows, _reduce_passes(v, steps, BLOCK_T, BLOCK_E))


# --------------------------------------------------------------------------- launchers (with checks)
def l2_shared_layout(num_tiles: int, programs: int, group: int) -> tuple[int, int]:
    """(groups, spread): the ceil(P / g) groups start ``spread`` = num_tiles // groups tiles apart,
    so that no two groups read the same tile at the same step. ValueError where the working set
    has fewer tiles than groups (they would share tiles at once beyond g)."""
    if programs < 1 or group < 1:
        raise ValueError(f"programs and group must be >= 1, got {programs} and {group}")
    groups = -(-programs // group)
    if num_tiles < groups:
        raise ValueError(f"{groups} groups of {group} programs need at least {groups} tiles, the working set has "
                         f"{num_tiles}")
    return groups, num_tiles // groups


def l2_shared_read(w: torch.Tensor, programs: int, group: int, bytes_per_program: int, *, num_warps: int = 4,
                   num_stages: int = 4, block_m: int = 16, check: bool = False) -> torch.Tensor:
    """``programs`` programs each read ``bytes_per_program`` of the working set w (T, BN, BK) (T
    contiguous weight tiles), groups of ``group`` consecutive programs reading the same tile at the
    same step (``_l2_shared_read_kernel``) -> (programs, BM, BN) fp32."""
    if w.dim() != 3:
        raise ValueError(f"w must be (tiles, BLOCK_N, BLOCK_K), got shape {list(w.shape)}")
    T, bn, bk = w.shape
    tile = bn * bk * w.element_size()
    k_tiles = bytes_per_program // tile
    if k_tiles < 1 or k_tiles * tile != bytes_per_program:
        raise ValueError(f"bytes_per_program={bytes_per_program} must be a positive multiple of {tile} "
                         f"(one {bn} x {bk} tile)")
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


def chain_table(steps: int, device, *, seed: int = 0) -> torch.Tensor:
    """(steps,) int32: one cycle over 0 .. steps - 1 from 0 (next[c] = the column block after c),
    in a shuffled order, so that a chain of ``steps`` steps from 0 visits every block once."""
    g = torch.Generator().manual_seed(seed)
    order = [0] + (torch.randperm(steps - 1, generator=g) + 1).tolist() if steps > 1 else [0]
    nxt = [0] * steps
    for i, c in enumerate(order):
        nxt[c] = order[(i + 1) % steps]
    return torch.tensor(nxt, dtype=torch.int32, device=device)


def serial_load_many(x: torch.Tensor, w: torch.Tensor, programs: int, steps: int, *, block_h: int,
                     chain: bool = False, nxt: torch.Tensor | None = None, num_warps: int = 4,
                     out: torch.Tensor | None = None, check: bool = False) -> torch.Tensor:
    """``programs`` programs each x_p (BT, steps x BH) @ w[:steps x BH] (BE wide) in ``steps``
    dependent steps, x_p rows p BT .. (p + 1) BT of x (programs x BT, >= steps x BH), w shared
    -> (programs x BT, BE) fp32. ``chain``: the blocks in the order of ``nxt`` (default
    ``chain_table(steps)``), each index read depending on the last tile loaded."""
    BE = w.shape[1]
    BT = x.shape[0] // programs
    if BT * programs != x.shape[0] or x.shape[1] < steps * block_h or w.shape[0] < steps * block_h:
        raise ValueError(f"x {list(x.shape)} must hold {programs} blocks of rows and w {list(w.shape)} "
                         f">= {steps} x {block_h} rows")
    if x.stride(1) != 1 or w.stride(1) != 1 or w.stride(0) != BE:
        raise ValueError("x needs contiguous rows, w must be contiguous")
    if chain and nxt is None:
        nxt = chain_table(steps, x.device)
    if nxt is None:
        nxt = torch.zeros(1, dtype=torch.int32, device=x.device)
    res = out if out is not None else torch.empty((programs * BT, BE), device=x.device, dtype=torch.float32)
    _serial_load_many_kernel[(programs,)](x, w, nxt, res, steps, x.stride(0), CHAIN=chain, BLOCK_T=BT,
                                          BLOCK_H=block_h, BLOCK_E=BE, num_warps=num_warps)
    if check:
        if chain:  # every block once: the chain from 0 must cover them all
            seen, c = set(), 0
            for _ in range(steps):
                seen.add(c)
                c = int(nxt[c])
            _check(len(seen) == steps, "serial_load_many (the next table is not one cycle)")
        want = x[:, :steps * block_h].float() @ w[:steps * block_h].float()
        _check(torch.allclose(res, want, rtol=2e-2, atol=2e-2), "serial_load_many")
    return res


def serial_reduce_many(v: torch.Tensor, programs: int, steps: int, *, num_warps: int = 4,
                       out: torch.Tensor | None = None, check: bool = False) -> torch.Tensor:
    """``programs`` programs each run ``steps`` top-1 passes over their rows p BT .. (p + 1) BT of v
    (programs x BT, BE) fp32 -> (programs x BT,) int32: the sum of the picked columns per row."""
    BT = v.shape[0] // programs
    BE = v.shape[1]
    if BT * programs != v.shape[0]:
        raise ValueError(f"v {list(v.shape)} must hold {programs} blocks of rows")
    res = out if out is not None else torch.empty(programs * BT, device=v.device, dtype=torch.int32)
    _serial_reduce_many_kernel[(programs,)](v, res, steps, BLOCK_T=BT, BLOCK_E=BE, num_warps=num_warps)
    if check and steps <= BE:
        want = torch.topk(v, steps, dim=1).indices.sum(dim=1).to(torch.int32)
        _check(bool(torch.equal(res, want)), "serial_reduce_many")
    return res
