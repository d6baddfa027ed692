"""Grouped GEMMs of the MoE layer and the combine, as Triton kernels.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width (Is for the shared MLP),
P_max padded rows (see align.py), KS = K (+1 with a shared MLP): rows per token in the pair buffer.

GEMM 1: act (P_max, I) = activation(x[rows] @ gate_up[e]^T (+ bias)), rows optionally scaled by
the routing weight first (Llama 4). GEMM 2: act[rows] @ down[e]^T (+ bias) times the routing
weight (or shared gate), at row t*KS + k of the pair buffer (T*KS, H), or (ATOMIC) added to y32
(T, H) fp32. DENSE: the shared MLP (slot K). SPLIT_K > 1: GEMM 1's fp32 partials (S, P_max, 2I)
finished by _act_kernel, GEMM 2's split s in its own slab. _combine_kernel: y[t] = the fp32 sum
over slabs and slots in a fixed order. "tma_persistent": persistent programs, TMA descriptors.
"""

from __future__ import annotations

from functools import cache

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import configs as cfgs
from .jit_keys import settle
from .plan import act_launch, combine_launch, gemm_grid

ACT_CODES = {"silu_gated": 0, "clamped_swiglu": 1}


@triton.jit
def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def _act_values(acc_g, acc_u, rows, row_mask, e, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr, topk_w_ptr,
                alpha, limit, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr):
    """Input scale, biases and activation of the gate/up sums (fp32) -> h (fp32)."""
    if SCALE_INPUT:
        pair = tl.load(padded_pair_ptr + rows)
        sc = tl.load(topk_w_ptr + pair, mask=row_mask, other=0.0)
        acc_g = acc_g * sc[:, None]
        acc_u = acc_u * sc[:, None]
    if HAS_BIAS:
        acc_g += tl.load(bias_ptr + e * stride_be + offs_bn).to(tl.float32)[None, :]
        acc_u += tl.load(bias_ptr + e * stride_be + N + offs_bn).to(tl.float32)[None, :]
    if ACT == 0:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
    else:
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = (u + 1.0) * g * tl.sigmoid(alpha * g)
    return h


@triton.jit
def _act_epilogue(acc_g, acc_u, rows, row_mask, e, offs_n, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr,
                  topk_w_ptr, out_ptr, stride_ot, alpha, limit,
                  ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr):
    """Input scale, biases and activation of the gate/up sums (fp32), stored in the activation dtype."""
    h = _act_values(acc_g, acc_u, rows, row_mask, e, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr, topk_w_ptr,
                    alpha, limit, ACT, HAS_BIAS, SCALE_INPUT)
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (offs_n < N)[None, :])


@triton.jit
def _k_range(pid, KD, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """(tile index, first K tile, end K tile) of this program; split s is the fastest pid digit."""
    k_tiles = tl.cdiv(KD, BLOCK_K)
    if SPLIT_K > 1:
        s = pid % SPLIT_K
        per = tl.cdiv(k_tiles, SPLIT_K)
        k_lo = s * per
        k_hi = tl.minimum(k_tiles, k_lo + per)
        return pid // SPLIT_K, s, k_lo, k_hi
    return pid, pid * 0, pid * 0, k_tiles


@triton.jit
def _program_tile(pid0, num_m, N, KD, block_expert_ptr, DENSE: tl.constexpr, SPLIT_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """A GEMM program's (row block, N tile, expert, split, K tiles); expert -1: nothing to do."""
    pid, s, k_lo, k_hi = _k_range(pid0, KD, BLOCK_K, SPLIT_K)
    pid_m, pid_n = _tile_ids(pid, num_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    if DENSE:
        e = pid * 0
    else:
        e = tl.load(block_expert_ptr + pid_m)
    return pid_m, pid_n, e, s, k_lo, k_hi


@triton.jit
def _gemm1_rows(padded_token_ptr, pid_m, T, DENSE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row block pid_m of GEMM 1: (padded rows, token of each row, row mask); DENSE: rows are tokens."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if DENSE:
        tok = rows
        row_mask = rows < T
    else:
        tok = tl.load(padded_token_ptr + rows)
        row_mask = tok >= 0
    tok = tl.where(row_mask, tok, 0)
    return rows, tok, row_mask


@triton.jit
def _gemm1_tile_start(x_ptr, padded_token_ptr, pid_m, pid_n, k0, T, N, stride_xt, DENSE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """GEMM 1 tile (pid_m, pid_n)'s start: (rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs)."""
    rows, tok, row_mask = _gemm1_rows(padded_token_ptr, pid_m, T, DENSE, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * stride_xt + (k0 + offs_k)[None, :]
    return rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs


@triton.jit
def _gemm2_tile_start(a_ptr, padded_pair_ptr, pid_m, pid_n, e, k0, T, N, stride_at, K: tl.constexpr,
                      DENSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """GEMM 2 tile (pid_m of expert e, pid_n)'s start: (row_mask, tok, slot, srow, offs_n, offs_bn,
    offs_k, a_row, a_ptrs, row_a, row_w); a_ptr None: rows read through a descriptor."""
    rows, row_mask, tok, slot, srow = _gemm2_rows(padded_pair_ptr, pid_m, T, K, DENSE, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_row = tl.where(row_mask, rows, 0).to(tl.int64)
    if a_ptr is None:  # (a placeholder: Triton 3.6 returns no None)
        a_ptrs = a_row
    else:
        a_ptrs = a_ptr + a_row[:, None] * stride_at + (k0 + offs_k)[None, :]
    row_a = pid_m * BLOCK_M
    row_w = e * N + pid_n * BLOCK_N
    return row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, a_row, a_ptrs, row_a, row_w


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b (fp32; IEEE: exact float32 products, the interpreter's float32 tests)."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _gemm1_acc(
    x_ptr, w_ptr, padded_token_ptr, pid_m, pid_n, e, k_lo, k_hi, T, N, KD, stride_xt, stride_we, stride_wn,
    DENSE: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GEMM 1's fp32 gate and up sums of one tile over K tiles [k_lo, k_hi) (every GEMM 1 path)."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, k_lo * BLOCK_K, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    wg_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_bn[None, :] * stride_wn + (k_lo * BLOCK_K + offs_k)[:, None]
    wu_ptrs = wg_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(k_lo, k_hi):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            bg = tl.load(wg_ptrs)
            bu = tl.load(wu_ptrs)
        else:
            k_mask = offs_k < KD - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            bg = tl.load(wg_ptrs, mask=k_mask[:, None], other=0.0)
            bu = tl.load(wu_ptrs, mask=k_mask[:, None], other=0.0)
        acc_g = _mma(a, bg, acc_g, IEEE)
        acc_u = _mma(a, bu, acc_u, IEEE)
        a_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    return acc_g, acc_u, rows, row_mask, offs_n, offs_bn


@triton.jit
def _gemm1_tile(
    x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, P, stride_xt, stride_we, stride_wn, stride_be, stride_ot,
    alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 1 tile: row block pid_m, N tile pid_n, K tiles [k_lo, k_hi) (also the megakernel's)."""
    acc_g, acc_u, rows, row_mask, offs_n, offs_bn = _gemm1_acc(
        x_ptr, w_ptr, padded_token_ptr, pid_m, pid_n, e, k_lo, k_hi, T, N, KD, stride_xt, stride_we, stride_wn,
        DENSE, EVEN_K, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
    if SPLIT_K > 1:  # fp32 partial sums (SPLIT_K, P, 2N); _act_kernel finishes them
        m = row_mask[:, None] & (offs_n < N)[None, :]
        pp = part_ptr + (s.to(tl.int64) * P + rows)[:, None] * (2 * N) + offs_n[None, :]
        tl.store(pp, acc_g, mask=m)
        tl.store(pp + N, acc_u, mask=m)
    else:
        _act_epilogue(acc_g, acc_u, rows, row_mask, e, offs_n, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr,
                      topk_w_ptr, out_ptr, stride_ot, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT)


@triton.jit(do_not_specialize=["T", "num_m", "P"])
def _gemm1_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr, topk_w_ptr,
    T, N, KD, num_m, P, stride_xt, stride_we, stride_wn, stride_be, stride_ot,
    alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n, e, s, k_lo, k_hi = _program_tile(tl.program_id(0), num_m, N, KD, block_expert_ptr, DENSE,
                                                   SPLIT_K, BLOCK_N, BLOCK_K, GROUP_M)
    if e < 0:
        return
    _gemm1_tile(x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
                pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, P, stride_xt, stride_we, stride_wn, stride_be, stride_ot,
                alpha, limit, ACT, HAS_BIAS, SCALE_INPUT, DENSE, EVEN_K, IEEE, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit(do_not_specialize=["T", "num_m", "P"])
def _act_kernel(
    part_ptr, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr, topk_w_ptr,
    T, N, num_m, P, stride_be, stride_ot, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """GEMM 1's epilogue after a split-K: sum the SPLIT_K partials in order, then _act_epilogue."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if DENSE:
        e = pid * 0
        row_mask = rows < T
    else:
        e = tl.load(block_expert_ptr + pid_m)
        if e < 0:
            return
        row_mask = tl.load(padded_token_ptr + rows) >= 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    m = row_mask[:, None] & (offs_n < N)[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in tl.static_range(SPLIT_K):
        pp = part_ptr + (s * P + rows.to(tl.int64))[:, None] * (2 * N) + offs_n[None, :]
        acc_g += tl.load(pp, mask=m, other=0.0)
        acc_u += tl.load(pp + N, mask=m, other=0.0)
    _act_epilogue(acc_g, acc_u, rows, row_mask, e, offs_n, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr,
                  topk_w_ptr, out_ptr, stride_ot, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT)


@triton.jit
def _gemm2_rows(padded_pair_ptr, pid_m, T, K: tl.constexpr, DENSE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row block pid_m of GEMM 2: (padded rows, row mask, token, slot, scale row); DENSE: slot K."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if DENSE:
        row_mask = rows < T
        tok = tl.where(row_mask, rows, 0)
        slot = K
        srow = tok
    else:
        pair = tl.load(padded_pair_ptr + rows)
        row_mask = pair >= 0
        pair = tl.where(row_mask, pair, 0)
        tok = pair // K
        slot = pair % K
        srow = pair
    return rows, row_mask, tok, slot, srow


@triton.jit
def _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, s, offs_n, offs_bn, T, N, bias_ptr, stride_be, scale_ptr,
                    out_ptr, stride_ot, KS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
                    ATOMIC: tl.constexpr, SPLIT_K: tl.constexpr):
    """GEMM 2's epilogue: bias, routing weight (or shared gate), store to the pair buffer or add to y32."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + e * stride_be + offs_bn).to(tl.float32)
        if SPLIT_K > 1:
            bias = tl.where(s == 0, bias, 0.0)  # added once, by the first split
        acc += bias[None, :]
    if HAS_SCALE:
        sc = tl.load(scale_ptr + srow, mask=row_mask, other=0.0)
        acc = acc * sc[:, None]
    mask = row_mask[:, None] & (offs_n < N)[None, :]
    if ATOMIC:
        ptrs = out_ptr + tok.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        # split s writes its own (T*KS, N) slab; the combine sums slabs and slots in a fixed order
        orow = s.to(tl.int64) * T * KS + tok.to(tl.int64) * KS + slot
        ptrs = out_ptr + orow[:, None] * stride_ot + offs_n[None, :]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm2_acc(
    a_ptr, w_ptr, padded_pair_ptr, pid_m, pid_n, e, k_lo, k_hi, T, N, KD, stride_at, stride_we, stride_wn,
    K: tl.constexpr, DENSE: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GEMM 2's fp32 sums of one tile over K tiles [k_lo, k_hi) (every GEMM 2 path)."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, _, a_ptrs, _, _ = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, k_lo * BLOCK_K, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_bn[None, :] * stride_wn + (k_lo * BLOCK_K + offs_k)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(k_lo, k_hi):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            b = tl.load(w_ptrs)
        else:
            k_mask = offs_k < KD - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        acc = _mma(a, b, acc, IEEE)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc, row_mask, tok, slot, srow, offs_n, offs_bn


@triton.jit
def _gemm2_tile(
    a_ptr, w_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, stride_at, stride_we, stride_wn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 2 tile: row block pid_m, N tile pid_n, K tiles [k_lo, k_hi) (also the megakernel's)."""
    acc, row_mask, tok, slot, srow, offs_n, offs_bn = _gemm2_acc(
        a_ptr, w_ptr, padded_pair_ptr, pid_m, pid_n, e, k_lo, k_hi, T, N, KD, stride_at, stride_we, stride_wn,
        K, DENSE, EVEN_K, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, s, offs_n, offs_bn, T, N, bias_ptr, stride_be, scale_ptr,
                    out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, SPLIT_K)


@triton.jit(do_not_specialize=["T", "num_m"])
def _gemm2_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, scale_ptr,
    T, N, KD, num_m, stride_at, stride_we, stride_wn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n, e, s, k_lo, k_hi = _program_tile(tl.program_id(0), num_m, N, KD, block_expert_ptr, DENSE,
                                                   SPLIT_K, BLOCK_N, BLOCK_K, GROUP_M)
    if e < 0:
        return
    _gemm2_tile(a_ptr, w_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, stride_at, stride_we, stride_wn, stride_be, stride_ot,
                K, KS, HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, EVEN_K, IEEE, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)


# --------------------------------------------------------------------------- variant "tma_persistent"
@triton.jit
def _routed_blocks(padded_off_ptr, T, E, DENSE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row blocks that hold rows (every token block when DENSE), read on the device."""
    # one branch each, no early return (the code after a constexpr branch's return is compiled too)
    if DENSE:
        n = tl.cdiv(T, BLOCK_M)
    else:
        n = tl.load(padded_off_ptr + E) // BLOCK_M
    return n


@triton.jit
def _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile t of a persistent GEMM's queue: (row block, N tile, expert) in grouped order."""
    pid_m, pid_n = _tile_ids(t, num_m, num_n, GROUP_M)
    if DENSE:
        e = t * 0
    else:
        e = tl.load(block_expert_ptr + pid_m)
    return pid_m, pid_n, e


@triton.jit
def _gemm1_tma_tile(
    x_ptr, w_desc, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_be, stride_ot, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 1 tile as _gemm1_tile (no split-K), gate and up tiles through w_desc."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    row_g = e * (2 * N) + pid_n * BLOCK_N
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        bg = w_desc.load([row_g, kt * BLOCK_K])
        bu = w_desc.load([row_g + N, kt * BLOCK_K])
        acc_g = _mma(a, bg.T, acc_g, IEEE)
        acc_u = _mma(a, bu.T, acc_u, IEEE)
        a_ptrs += BLOCK_K
    _act_epilogue(acc_g, acc_u, rows, row_mask, e, offs_n, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr,
                  topk_w_ptr, out_ptr, stride_ot, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm1_tma_kernel(
    x_ptr, w_desc, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr,
    topk_w_ptr, T, N, KD, E, stride_xt, stride_be, stride_ot, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Persistent GEMM 1 in grouped order; FLATTEN: the walk and K loops as one pipelined loop."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm1_tma_tile(x_ptr, w_desc, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
                        pid_m, pid_n, e, T, N, KD, stride_xt, stride_be, stride_ot, alpha, limit,
                        ACT, HAS_BIAS, SCALE_INPUT, DENSE, EVEN_K, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gemm2_tma_tile(
    a_desc, w_desc, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 2 tile as _gemm2_tile (no split-K), both operands through descriptors."""
    row_mask, tok, slot, srow, offs_n, offs_bn, _, _, _, row_a, row_w = _gemm2_tile_start(
        None, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, 0, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = a_desc.load([row_a, kt * BLOCK_K])
        b = w_desc.load([row_w, kt * BLOCK_K])
        acc = _mma(a, b.T, acc, IEEE)
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


@triton.jit
def _gemm2_tmaw_tile(
    a_ptr, w_desc, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_at, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 2 tile as _gemm2_tile (no split-K): weights through w_desc, rows by pointer."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, _, a_ptrs, _, row_w = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        b = w_desc.load([row_w, kt * BLOCK_K])
        acc = _mma(a, b.T, acc, IEEE)
        a_ptrs += BLOCK_K
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm2_tma_kernel(
    a_desc, w_desc, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr, scale_ptr,
    T, N, KD, E, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Persistent GEMM 2, walking its tiles as _gemm1_tma_kernel does (FLATTEN likewise)."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm2_tma_tile(a_desc, w_desc, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                        pid_m, pid_n, e, T, N, KD, stride_be, stride_ot, K, KS,
                        HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _combine_tile(src_ptr, y_ptr, pid_t, pid_h, T, H,
                  KS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """y rows of token block pid_t, columns of H block pid_h: the fixed-order sum of the slots."""
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    m = (offs_t < T)[:, None] & (offs_h < H)[None, :]
    base = offs_t.to(tl.int64)[:, None] * (KS * H) + offs_h[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_H), tl.float32)
    for s in tl.static_range(SPLIT):
        for k in tl.static_range(KS):
            acc += tl.load(src_ptr + base + (s * T * KS + k) * H, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_t.to(tl.int64)[:, None] * H + offs_h[None, :], acc.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T"])
def _combine_kernel(
    src_ptr, y_ptr, T, H,
    KS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    _combine_tile(src_ptr, y_ptr, tl.program_id(0), tl.program_id(1), T, H, KS, SPLIT, BLOCK_T, BLOCK_H)


def _ieee(t) -> bool:
    return str(t.dtype) == "torch.float32"


def device_sms(device) -> int:
    """SMs of ``device`` (the persistent launches' programs); configs.INTERPRETER_SMS on the CPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return cfgs.INTERPRETER_SMS
    return _cuda_sms(device.index)


@cache
def _cuda_sms(index) -> int:
    import torch

    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()
                                            ).multi_processor_count


def _descriptor(t, rows: int, block_rows: int, block_k: int):
    """A TMA descriptor over contiguous ``t`` seen as (rows, last dim), blocks (block_rows, block_k)."""
    return TensorDescriptor.from_tensor(t.view(rows, t.shape[-1]), [block_rows, block_k])


def gemm1_launch(x, w, bias, out, part, meta, topk_w, cfg: dict, *, activation: str, alpha: float, limit: float,
                 scale_input: bool, dense: bool, num_m: int, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of GEMM 1's main launch, for cfg's variant (configs.VARIANTS)."""
    T, KD = x.shape
    N = w.shape[1] // 2
    BN, BK = cfg["BLOCK_N"], cfg["BLOCK_K"]
    common = dict(ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, SCALE_INPUT=scale_input, DENSE=dense,
                  EVEN_K=KD % BK == 0, IEEE=_ieee(x), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=BN, BLOCK_K=BK,
                  GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    bstride = 0 if bias is None else bias.stride(0)
    if cfg["variant"] == "tma_persistent":
        grid = gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(x.device))
        args = (x, _descriptor(w, w.shape[0] * 2 * N, BN, BK), bias, out, meta.get("padded_token"),
                meta.get("padded_pair"), meta.get("block_expert"), meta.get("padded_offsets"), topk_w,
                T, N, KD, w.shape[0], x.stride(0), bstride, out.stride(0), float(alpha), float(limit))
        return _gemm1_tma_kernel, grid, args, dict(common, FLATTEN=bool(cfg["FLATTEN"]))
    args = (x, w, bias, out, part, meta.get("padded_token"), meta.get("padded_pair"), meta.get("block_expert"),
            topk_w, T, N, KD, num_m, out.shape[0], x.stride(0), w.stride(0), w.stride(1), bstride, out.stride(0),
            float(alpha), float(limit))
    return _gemm1_kernel, gemm_grid(num_m, N, cfg), args, dict(common, SPLIT_K=cfg.get("SPLIT_K", 1))


def launch_gemm1(x, w, bias, out, meta, topk_w, cfg: dict, *, activation: str, alpha: float, limit: float,
                 scale_input: bool, dense: bool, num_m: int, act: dict | None = None,
                 num_sms: int | None = None, part=None) -> None:
    """act (rows, N) = activation(x[rows] @ w[e]^T ...), w (E, 2N, H). SPLIT_K > 1: fp32 partials
    (``part`` (SPLIT_K, rows, 2N) if made beforehand), then _act_kernel with ``act``
    (plan.act_launch's; default computed). ``num_sms``: a persistent launch's programs (default:
    the device's SMs)."""
    import torch

    T, KD = x.shape
    N = w.shape[1] // 2
    if num_m == 0:
        return
    cfg = {**cfgs.GEMM_OPTIONAL, **cfg}
    split = cfg["SPLIT_K"]
    P = out.shape[0]
    if split > 1 and part is None:
        part = torch.empty((split, P, 2 * N), device=x.device, dtype=torch.float32)
    kernel, grid, args, kwargs = gemm1_launch(x, w, bias, out, part, meta, topk_w, cfg, activation=activation,
                                              alpha=alpha, limit=limit, scale_input=scale_input, dense=dense,
                                              num_m=num_m, num_sms=num_sms)
    kernel[grid](*args, **kwargs)
    if split > 1:
        al = act or act_launch(N, cfg["BLOCK_M"], num_m)
        _act_kernel[al["grid"]](
            part, bias, out, meta.get("padded_token"), meta.get("padded_pair"), meta.get("block_expert"), topk_w,
            T, N, num_m, P, 0 if bias is None else bias.stride(0), out.stride(0), float(alpha), float(limit),
            ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, SCALE_INPUT=scale_input, DENSE=dense,
            SPLIT_K=split, BLOCK_M=al["BLOCK_M"], BLOCK_N=al["BLOCK_N"], num_warps=al["num_warps"],
        )


def gemm2_launch(act, w, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int, dense: bool, atomic: bool,
                 num_m: int, split: int = 1, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of GEMM 2's launch, for cfg's variant (configs.VARIANTS)."""
    KD = act.shape[1]
    N = w.shape[1]
    BN, BK = cfg["BLOCK_N"], cfg["BLOCK_K"]
    common = dict(K=K, KS=KS, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, DENSE=dense, ATOMIC=atomic,
                  IEEE=_ieee(act), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"],
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    bstride = 0 if bias is None else bias.stride(0)
    if cfg["variant"] == "tma_persistent":
        if split != 1:
            raise ValueError(f"the tma_persistent GEMM 2 has no split-K, got split={split}")
        grid = gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(act.device))
        args = (_descriptor(act, act.shape[0], cfg["BLOCK_M"], BK), _descriptor(w, w.shape[0] * N, BN, BK), bias,
                out, meta.get("padded_pair"), meta.get("block_expert"), meta.get("padded_offsets"), scale,
                T, N, KD, w.shape[0], bstride, out.stride(0))
        return _gemm2_tma_kernel, grid, args, dict(common, FLATTEN=bool(cfg["FLATTEN"]))
    args = (act, w, bias, out, meta.get("padded_pair"), meta.get("block_expert"), scale, T, N, KD, num_m,
            act.stride(0), w.stride(0), w.stride(1), bstride, out.stride(0))
    return _gemm2_kernel, gemm_grid(num_m, N, cfg, split), args, dict(common, EVEN_K=KD % BK == 0, SPLIT_K=split)


def launch_gemm2(act, w, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int, dense: bool,
                 atomic: bool, num_m: int, split: int = 1, num_sms: int | None = None) -> None:
    """out rows (pair buffer (split*T*KS, N) or y32 (T, N)) from act @ w[e]^T (+bias) * scale;
    w: (E, N, I). ``split`` (the routed GEMM 2's SPLIT_K, which the buffer was sized for);
    ``num_sms`` as for launch_gemm1."""
    if num_m == 0:
        return
    kernel, grid, args, kwargs = gemm2_launch(act, w, bias, out, meta, scale, {**cfgs.GEMM_OPTIONAL, **cfg}, T=T,
                                              K=K, KS=KS, dense=dense, atomic=atomic, num_m=num_m, split=split,
                                              num_sms=num_sms)
    kernel[grid](*args, **kwargs)


def launch_combine(src, y, KS: int, split: int = 1, *, launch: dict | None = None) -> None:
    """y (T, H) = the fp32 sum over split slabs and KS rows of src, fixed order."""
    T, H = y.shape
    if T == 0:
        return
    cl = launch or combine_launch(T, H)
    _combine_kernel[cl["grid"]](src, y, T, H, KS=KS, SPLIT=split, BLOCK_T=cl["BLOCK_T"], BLOCK_H=cl["BLOCK_H"],
                                num_warps=cl["num_warps"])


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
