"""Microbenchmark of weight streaming by deep programs (``megamoe calibrate`` step ``hbm_deep``).

Shape legend: P programs, S SMs, g sharing group, BM/BN/BK tile sizes, D bytes a program keeps in
flight (its pipeline buffers).

``_deep_read_kernel``: P programs stream weight rows from HBM through the GEMM tiles' pipelined
load + dot loop, one BN x BK tile per K step or two (GATED: gate and up rows); program p reads
region p // g, so a group reads the same tile at the same step. ``deep_read`` launches it and
checks it against torch with ``check=True``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from megamoe.kernels.plan import gemm_shared_bytes

from .microbench import _check, _k_steps


# --------------------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["k_tiles", "group"])
def _deep_read_kernel(w_ptr, a_ptr, out_ptr, k_tiles, group, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GATED: tl.constexpr):
    """Program p reads region p // group of w: (1 + GATED) x BLOCK_N rows of k_tiles x BLOCK_K
    values (gate rows, then up rows) into acc += a @ tile^T, so out[p] holds the rows' sums."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    kd = k_tiles * BLOCK_K  # values per weight row
    rows = BLOCK_N * (2 if GATED else 1)
    w = w_ptr + (pid // group).to(tl.int64) * rows * kd + offs_n[None, :].to(tl.int64) * kd + offs_k[:, None]
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if GATED:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for kt in range(k_tiles):
            acc = tl.dot(a, tl.load(w + kt * BLOCK_K), acc)
            acc_up = tl.dot(a, tl.load(w + BLOCK_N * kd + kt * BLOCK_K), acc_up)
        acc += acc_up
    else:
        for kt in range(k_tiles):
            acc = tl.dot(a, tl.load(w + kt * BLOCK_K), acc)
    tl.store(out_ptr + pid.to(tl.int64) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


# --------------------------------------------------------------------------- launcher (with its check)
def deep_read_depth(block_n: int, block_k: int, num_stages: int, *, gated: bool = False, block_m: int = 16,
                    elem_bytes: int = 2) -> int:
    """Weight bytes one ``_deep_read_kernel`` program keeps in flight (``plan.gemm_shared_bytes``
    with no A bytes): (num_stages - 1) x (1 + gated) x BN x BK x elem_bytes for 16-row tiles."""
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_stages": num_stages}
    return gemm_shared_bytes(cfg, 0.0, float(elem_bytes), 2 if gated else 1)


def deep_read(w: torch.Tensor, programs: int, bytes_per_program: int, *, group: int = 1, block_n: int = 64,
              block_k: int = 128, num_stages: int = 4, gated: bool = False, block_m: int = 16, num_warps: int = 4,
              a: torch.Tensor | None = None, out: torch.Tensor | None = None, check: bool = False):
    """``programs`` programs each stream ``bytes_per_program`` of w (flat), groups of ``group``
    reading the same region (ceil(programs / group) regions back to back) -> ((programs, BM, BN)
    fp32 row sums, compiled kernel). ``a``: the (BM, BK) ones multiplied by (made here if None)."""
    if programs < 1 or group < 1:
        raise ValueError(f"programs and group must be >= 1, got {programs} and {group}")
    tiles = 2 if gated else 1
    step = tiles * block_n * block_k * w.element_size()  # bytes of one K step
    k_tiles = _k_steps(bytes_per_program, step, f"{tiles} x {block_n} x {block_k} x {w.element_size()} bytes")
    regions = -(-programs // group)
    if regions * bytes_per_program > w.numel() * w.element_size():
        raise ValueError(f"deep_read: {regions} regions of {bytes_per_program} bytes read past the end of w "
                         f"({w.numel() * w.element_size()} bytes)")
    if a is None:
        a = torch.ones((block_m, block_k), device=w.device, dtype=w.dtype)
    elif tuple(a.shape) != (block_m, block_k) or a.dtype != w.dtype or not a.is_contiguous():
        raise ValueError(f"a must be a contiguous {w.dtype} ({block_m}, {block_k}), got {a.dtype} {list(a.shape)}")
    if out is None:
        res = torch.empty((programs, block_m, block_n), device=w.device, dtype=torch.float32)
    elif out.dtype != torch.float32 or out.dim() != 3 or tuple(out.shape[1:]) != (block_m, block_n) \
            or out.shape[0] < programs or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous fp32 (>= {programs}, {block_m}, {block_n}), got "
                         f"{out.dtype} {list(out.shape)}")
    else:
        res = out[:programs]
    k = _deep_read_kernel[(programs,)](w, a, res, k_tiles, group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                       GATED=gated, num_warps=num_warps, num_stages=num_stages)
    if check:  # program p: a @ (region p // group's K tiles summed, gate and up added)^T
        kd = k_tiles * block_k
        reg = w.reshape(-1)[:regions * tiles * block_n * kd].view(regions, tiles, block_n, k_tiles, block_k).float()
        folded = reg.sum(dim=(1, 3))  # (regions, BN, BK)
        want = a.float()[None] @ folded.transpose(1, 2)  # (regions, BM, BN)
        _check(torch.allclose(res, want[torch.arange(programs, device=w.device) // group], rtol=1e-3, atol=1e-2),
               "deep_read")
    return res, k
