"""Dense GEMM microbenchmark for ``megamoe calibrate``: the tensor rate of a tile loop as a GEMM runs it.

Shape legend: M rows, N columns, K depth, BM/BN/BK tile sizes, S SMs.

``_dense_gemm_kernel``: C (M, N) = A (M, K) @ W (N, K)^T in grouped tile order from HBM, the K
loop pipelined. Constexpr forms: ``TMA`` (W through a tensor descriptor), ``TMA_A`` (A too),
``PERSISTENT`` (one program per SM walks the tiles), ``GATED`` (GEMM 1's gate and up tile),
``FLAT`` (the persistent walk flattened with the K loop). ``dense_gemm`` is the launcher.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from megamoe.kernels.grouped_gemm import _tile_ids
from megamoe.reference.tiles import GEMM_LOOP_FORMS


@triton.jit
def _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tile, M, N, K, TMA: tl.constexpr, TMA_A: tl.constexpr,
                GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr):
    """Tile ``tile`` of C = A @ W^T in grouped order. GATED: W is (2N, K), gate rows then up rows,
    C = silu(A @ Wg^T) * (A @ Wu^T)."""
    pid_m, pid_n = _tile_ids(tile, M // BLOCK_M, N // BLOCK_N, GROUP_M)  # the MoE GEMMs' grouped order
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
def _dense_gemm_kernel(a_ptr, a_desc, w_ptr, w_desc, c_ptr, M, N, K, PERSISTENT: tl.constexpr, TMA: tl.constexpr,
                       TMA_A: tl.constexpr, GATED: tl.constexpr, FLAT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One tile per program, or (PERSISTENT) tiles pid, pid + programs, .... K is specialized
    (divisible by 16, the row loads vectorize)."""
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), (M // BLOCK_M) * (N // BLOCK_N), tl.num_programs(0), flatten=FLAT):
            _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tile, M, N, K, TMA, TMA_A, GATED, BLOCK_M,
                        BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _dense_tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, tl.program_id(0), M, N, K, TMA, TMA_A, GATED,
                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


#: the loop forms measured -> (persistent, W by TMA, A by TMA, gated, flattened): reference.tiles.GEMM_LOOP_FORMS
LOADS = GEMM_LOOP_FORMS


def dense_gemm(a: torch.Tensor, w: torch.Tensor, *, block_m: int, block_n: int, block_k: int, num_warps: int,
               num_stages: int, loads: str = "pointer", programs: int | None = None, group_m: int = 8,
               out: torch.Tensor | None = None, check: bool = False):
    """C = a (M, K) @ w (N, K)^T -> (C (M, N) in a's dtype, compiled kernel); a gated form takes w
    (2N, K) and gives silu(a @ wg^T) * (a @ wu^T). M, N, K multiples of the block sizes.
    ``loads``: a key of LOADS; ``programs``: the persistent grid (default min(SMs, tiles))."""
    if loads not in LOADS:
        raise ValueError(f"loads must be one of {sorted(LOADS)}, got {loads!r}")
    M, K = a.shape
    N, Kw = w.shape
    if Kw != K:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and w (N, K) = {tuple(w.shape)}: K differs")
    if LOADS[loads].gated and N % 2:
        raise ValueError(f"a gated form takes w as (2N, K), gate rows then up rows: got {N} rows")
    c, k = _launch(a, w, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                   num_stages=num_stages, loads=loads, programs=programs, group_m=group_m, out=out)
    if check:
        _check(c, a, w, LOADS[loads].gated, "dense_gemm")
    return c, k


def _launch(a, w, *, block_m, block_n, block_k, num_warps, num_stages, loads, programs, group_m, out):
    """Launch _dense_gemm_kernel: a (M, K), w (N or 2N, K) -> (C (M, N), compiled kernel)."""
    persistent, tma, tma_a, gated, flat = LOADS[loads]
    M, K = a.shape
    N = w.shape[0]
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
    k = _dense_gemm_kernel[grid](a, a_desc, w, w_desc, c, M, N, K, PERSISTENT=persistent, TMA=tma, TMA_A=tma_a,
                                 GATED=gated, FLAT=flat, BLOCK_M=block_m, BLOCK_N=block_n,
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
