"""Dense GEMM microbenchmark for ``megamoe calibrate``: the tensor rate of a tile loop as a GEMM runs it.

Shape legend: M rows, N columns, K depth, BM/BN/BK tile sizes, S SMs.

    _dense_gemm_kernel  C (M, N) = A (M, K) @ W (N, K)^T, one BM x BN tile per program in grouped
                        order (GROUP_M row blocks share a column band, as the MoE GEMMs walk their
                        tiles), A and W in HBM (W K-contiguous, as the experts' weights are stored),
                        the K loop pipelined over ``num_stages``. ``TMA``: W's tiles come through a
                        tensor descriptor (the weight loads of grouped_gemm's "tma_persistent"
                        GEMMs), ``TMA_A`` A's too (their GEMM 2); otherwise by pointer loads
                        (cp.async: the megakernel and the pointer GEMMs). ``PERSISTENT``: one
                        program per SM walks tiles pid, pid + programs, ... (the persistent GEMMs
                        and, through its tickets, the megakernel); otherwise one tile per program.
                        ``GATED``: GEMM 1's tile, gate and up accumulators over one A tile.
                        ``FLAT``: the persistent walk as ``tl.range(..., flatten=True)``, which
                        fuses it with each tile's K loop into one pipelined loop (the persistent
                        GEMMs' config FLATTEN).
                        ``GROUPED``: W holds E experts' matrices and row block m reads expert
                        m // R's: each weight tile is used by R row blocks (``reuse_gemm``).
    dense_gemm          the dense GEMM (calibrate step "gemm": kernel_model.gemm_<form>).
    reuse_gemm          a grouped GEMM of E experts with R row blocks each, weights >> L2 (calibrate
                        step "gemm_reuse": kernel_model.gemm_reuse_<form>): the rate of a tile loop
                        whose weight tiles stream from HBM for few row blocks' MMAs.

Why it exists (H200 runs L and M, NOTES-gpu-runs.md): the tile table ``mma`` times the tensor cores
on operands already on chip, capped at a dense cuBLAS GEMM's rate, and the MoE kernels' prefill
tiles ran 14-24% slower than the model read from it; an L2-fed pointer-load kernel without operand
reuse measured 205-333 TFLOP/s at 128 x 128, below the megakernel's own tiles (459). A dense GEMM
of the same tile loop has what both lack: operands streamed from HBM with the L2 reuse of a
grouped tile order, the pipelined loads competing with the MMAs, waves of tiles and their stores.
It is not an MoE kernel: no gather, no routing, no epilogue but the store.

Why ``reuse_gemm`` (H200 runs AH and AJ, 34 and 36): the dense GEMM reads each weight tile for 32 row
blocks of 128 (GROUP_M 8 of them at once), and its rate under-predicted DeepSeek-V3's GEMM 2 at T =
4096 by 18-30% (~43.8 us per tile measured, ~25.6 from the dense table), where each expert has
~1.56 row blocks; at T = 16384 (~4.5) it was within a few percent. With one or two row blocks per
weight tile the loop pulls each tile from HBM for little MMA work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.tiles import GEMM_LOOP_FORMS
from .grouped_gemm import _tile_ids


@triton.jit
def _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tile, M, N, K, R, TMA: tl.constexpr, TMA_A: tl.constexpr,
                GATED: tl.constexpr, GROUPED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile ``tile`` of C = A @ W^T in grouped order; M, N, K multiples of the tile sizes. GATED:
    W is (2N, K), gate rows then up rows, and the tile is GEMM 1's: two accumulators over the same
    A tile, C = silu(A @ Wg^T) * (A @ Wu^T). GROUPED: W is E experts' matrices one after the other
    ((E*N, K), gated (E*2N, K)) and row block m is expert m // R's (R row blocks per expert, as
    the grouped GEMMs' padded rows): each weight tile is read by R row blocks; otherwise R is unused."""
    pid_m, pid_n = _tile_ids(tile, M // BLOCK_M, N // BLOCK_N, GROUP_M)  # the MoE GEMMs' grouped order
    if GROUPED:
        if GATED:
            w_row = (pid_m // R) * (2 * N) + pid_n * BLOCK_N  # expert pid_m // R's gate rows, then its up rows
        else:
            w_row = (pid_m // R) * N + pid_n * BLOCK_N
    else:
        w_row = pid_n * BLOCK_N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + (w_row + tl.arange(0, BLOCK_N)).to(tl.int64)[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, K // BLOCK_K):
        if TMA_A:
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
        else:
            a = tl.load(a_ptrs)
        if TMA:
            b = w_desc.load([w_row, kt * BLOCK_K]).T
        else:
            b = tl.load(w_ptrs)
        acc = tl.dot(a, b, acc)
        if GATED:
            if TMA:
                b_u = w_desc.load([w_row + N, kt * BLOCK_K]).T
            else:
                b_u = tl.load(w_ptrs + N.to(tl.int64) * K)
            acc_u = tl.dot(a, b_u, acc_u)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_u
    tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def _dense_gemm_kernel(a_ptr, a_desc, w_ptr, w_desc, c_ptr, M, N, K, R, PERSISTENT: tl.constexpr, TMA: tl.constexpr,
                       TMA_A: tl.constexpr, GATED: tl.constexpr, FLAT: tl.constexpr, GROUPED: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One tile per program, or (PERSISTENT) tiles pid, pid + programs, ... as the persistent
    GEMMs walk theirs. K is specialized (its divisibility by 16 lets the row loads vectorize into
    cp.async: H200 run N, with K unspecialized, measured 37-160 TFLOP/s of scalar loads).
    GROUPED (``reuse_gemm``): every R row blocks their own expert's weights (``_dense_tile``)."""
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), (M // BLOCK_M) * (N // BLOCK_N), tl.num_programs(0), flatten=FLAT):
            _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tile, M, N, K, R, TMA, TMA_A, GATED, GROUPED, BLOCK_M,
                        BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tl.program_id(0), M, N, K, R, TMA, TMA_A, GATED, GROUPED,
                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


#: the loop forms measured -> (persistent, W by TMA, A by TMA, gated, flattened): reference.tiles.GEMM_LOOP_FORMS
LOADS = GEMM_LOOP_FORMS


def dense_gemm(a: torch.Tensor, w: torch.Tensor, *, block_m: int, block_n: int, block_k: int, num_warps: int,
               num_stages: int, loads: str = "pointer", programs: int | None = None, group_m: int = 8,
               out: torch.Tensor | None = None, check: bool = False):
    """C = a (M, K) @ w (N, K)^T by the tile loop above -> (C (M, N) in a's dtype, compiled kernel);
    a gated form (LOADS) takes w as (2N, K), gate rows then up rows, and gives
    silu(a @ wg^T) * (a @ wu^T), N columns. M, N, K must be multiples of block_m, block_n,
    block_k. ``loads`` (a key of LOADS): one tile per program or persistent programs, weights (and
    rows) through tensor descriptors (Hopper and newer) or by pointer loads; ``programs``: the
    persistent grid (default: the SM count, at most the tiles). ``check`` compares with torch (the
    interpreter tests)."""
    if loads not in LOADS:
        raise ValueError(f"loads must be one of {sorted(LOADS)}, got {loads!r}")
    M, K = a.shape
    N, Kw = w.shape
    if Kw != K:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and w (N, K) = {tuple(w.shape)}: K differs")
    if LOADS[loads].gated and N % 2:
        raise ValueError(f"a gated form takes w as (2N, K), gate rows then up rows: got {N} rows")
    c, k = _launch(a, w, 1, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                   num_stages=num_stages, loads=loads, programs=programs, group_m=group_m, out=out, grouped=False)
    if check:
        _check(c, a, w, LOADS[loads].gated, "dense_gemm")
    return c, k


def reuse_gemm(a: torch.Tensor, w: torch.Tensor, *, row_blocks: int, block_m: int, block_n: int, block_k: int,
               num_warps: int, num_stages: int, loads: str = "pointer", programs: int | None = None,
               group_m: int = 8, out: torch.Tensor | None = None, check: bool = False):
    """A grouped GEMM whose every weight tile is read by exactly ``row_blocks`` (r) row blocks:
    E experts, expert e's rows a[e r BM : (e + 1) r BM] times its own w[e] (N, K) (gated forms:
    (2N, K), gate rows then up rows) -> (C (E r BM, N), compiled kernel). The same tile loop as
    ``dense_gemm`` (GROUPED: row block m reads expert m // r's weights), in the grouped GEMMs'
    tile order (GROUP_M row blocks sweep a column band, crossing experts where r < GROUP_M, as
    the padded rows of grouped_gemm do). With E x N x K weights well beyond L2 the weights stream
    from HBM, each tile used for r row blocks' MMAs: the rate of a grouped GEMM of r row blocks
    per expert (calibrate step "gemm_reuse"). a: (E r BM, K); w: (E, N, K) (or (E, 2N, K));
    N, K multiples of block_n, block_k; the other arguments as ``dense_gemm``'s."""
    if loads not in LOADS:
        raise ValueError(f"loads must be one of {sorted(LOADS)}, got {loads!r}")
    if int(row_blocks) < 1:
        raise ValueError(f"row_blocks must be >= 1, got {row_blocks}")
    if w.dim() != 3:
        raise ValueError(f"w must be (E, N, K): one weight matrix per expert, got shape {tuple(w.shape)}")
    E, NW, Kw = w.shape
    M, K = a.shape
    if Kw != K:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and w (E, N, K) = {tuple(w.shape)}: K differs")
    if M != E * int(row_blocks) * block_m:
        raise ValueError(f"a must have E x row_blocks x block_m = {E} x {row_blocks} x {block_m} rows, got {M}")
    if LOADS[loads].gated and NW % 2:
        raise ValueError(f"a gated form takes each expert's w as (2N, K), gate rows then up rows: got {NW} rows")
    w2 = w.contiguous().view(E * NW, K)
    c, k = _launch(a, w2, int(row_blocks), block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                   num_stages=num_stages, loads=loads, programs=programs, group_m=group_m, out=out, grouped=True,
                   n_rows=NW)
    if check:
        rows = int(row_blocks) * block_m
        for e in range(E):
            _check(c[e * rows:(e + 1) * rows], a[e * rows:(e + 1) * rows], w[e], LOADS[loads].gated,
                   f"reuse_gemm expert {e}")
    return c, k


def _launch(a, w, r: int, *, block_m, block_n, block_k, num_warps, num_stages, loads, programs, group_m, out,
            grouped: bool, n_rows: int | None = None):
    """Launch _dense_gemm_kernel: a (M, K), w (rows, K) (grouped: experts of ``n_rows`` rows each,
    r row blocks per expert) -> (C (M, N), compiled kernel)."""
    persistent, tma, tma_a, gated, flat = LOADS[loads]
    M, K = a.shape
    N = n_rows if grouped else w.shape[0]
    if gated:
        N //= 2
    for name, v, b in (("M", M, block_m), ("N", N, block_n), ("K", K, block_k)):
        if v % b:
            raise ValueError(f"{name} = {v} must be a multiple of its block {b}")
    a, w = a.contiguous(), w.contiguous()
    c = out if out is not None else torch.empty((M, N), device=a.device, dtype=a.dtype)
    if tuple(c.shape) != (M, N):
        raise ValueError(f"out must be (M, N) = {(M, N)}, got {tuple(c.shape)}")
    w_desc = a_desc = None
    if tma or tma_a:
        from triton.tools.tensor_descriptor import TensorDescriptor

        w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k]) if tma else None
        a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k]) if tma_a else None
    tiles = (M // block_m) * (N // block_n)
    if persistent:
        if programs is None:
            programs = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 3
        grid = (max(1, min(int(programs), tiles)),)
    else:
        grid = (tiles,)
    k = _dense_gemm_kernel[grid](a, a_desc, w, w_desc, c, M, N, K, r, PERSISTENT=persistent, TMA=tma, TMA_A=tma_a,
                                 GATED=gated, FLAT=flat, GROUPED=grouped, BLOCK_M=block_m, BLOCK_N=block_n,
                                 BLOCK_K=block_k, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return c, k


def _check(c, a, w, gated: bool, what: str) -> None:
    """c against torch: a @ w^T, or gated silu(a @ wg^T) * (a @ wu^T)."""
    want = a.float() @ w.float().T
    if gated:
        n = want.shape[1] // 2
        g, u = want[:, :n], want[:, n:]
        want = g * torch.sigmoid(g) * u
    if not torch.allclose(c.float(), want, rtol=2e-2, atol=2e-2):
        raise AssertionError(f"{what}: max |error| {float((c.float() - want).abs().max()):.3g}")
