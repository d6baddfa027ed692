"""The megakernel's FP8 GEMM tiles with the weights through TMA descriptors (config "tma_weights").

Shape legend: T tokens, E experts, H hidden, I expert width (N: a GEMM's output width, KD: its
depth), KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP).

They compute what fp8_gemm's pointer tiles compute, in the same order (interchangeable per task),
the e4m3 weight tile as one (BLOCK_N, KB) TMA copy per K step; the rows stay pointer loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fp8_common import _band_scale, _fp8_step, _gate_up_tma_step, _gemm1_fp8_epilogue, _quantize_groups
from .grouped_gemm import _gemm1_tile_start, _gemm2_epilogue, _gemm2_tile_start
from .jit_keys import settle


@triton.jit
def _quantize_x_rows(x_ptr, xq_ptr, xs_ptr, t0, T, h_lo, h_hi, H, stride_xt, stride_qt, stride_st,
                     KB: tl.constexpr, BLOCK_T: tl.constexpr):
    """x's e4m3 codes into xq (T, H) and scales into xs (T, ceil(H / KB)) for tokens
    t0 .. t0 + BLOCK_T - 1 and the KB-column groups starting in [h_lo, h_hi), as the GEMM 1 tiles
    would quantize them (zero past H)."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    t64 = offs_t.to(tl.int64)
    offs_k = tl.arange(0, KB)
    for g in range(tl.cdiv(h_lo, KB), tl.minimum(tl.cdiv(h_hi, KB), tl.cdiv(H, KB))):
        cols = g * KB + offs_k
        m = t_mask[:, None] & (cols < H)[None, :]
        a = tl.load(x_ptr + t64[:, None] * stride_xt + cols[None, :], mask=m, other=0.0)
        q, sc = _quantize_groups(a.to(tl.float32))
        tl.store(xq_ptr + t64[:, None] * stride_qt + cols[None, :], q, mask=m)
        tl.store(xs_ptr + t64 * stride_st + g, sc, mask=t_mask)


@triton.jit
def _gemm1_fp8_tmaw_tile(
    x_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse, stride_wsn, stride_be, stride_ot, stride_os, alpha,
    limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, XQ: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr,
):
    """One GEMM 1 tile: e4m3 gate and up tiles through w_desc over gate_up as (E*2N, KD), x rows by
    pointers (XQ: x's codes and scales); as fp8_gemm's pointer tile otherwise."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    row_g = e * (2 * N) + pid_n * BLOCK_N
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(2 * N, KB) - 1
    if FP8_A and SCALE_INPUT:  # Llama 4: the routing weight scales the row before it is quantized
        pair = tl.load(padded_pair_ptr + rows)
        in_sc = tl.load(topk_w_ptr + pair, mask=row_mask, other=0.0)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        bg, bu, sg, su = _gate_up_tma_step(w_desc, ws_e, row_g, pid_n * BLOCK_N, kt, N, last, stride_wsn, KB,
                                           BLOCK_N, BLOCK_K)
        sa = tl.zeros((BLOCK_M,), tl.float32)
        if FP8_A and XQ:
            sa = tl.load(xs_ptr + tok.to(tl.int64) * stride_xs + kt, mask=row_mask, other=0.0)
        elif FP8_A:
            a32 = a.to(tl.float32)
            if SCALE_INPUT:
                a32 = a32 * in_sc[:, None]
            a, sa = _quantize_groups(a32)
        acc_g += _fp8_step(a, bg.T, sa, sg, FP8_A, IEEE, CVT)
        acc_u += _fp8_step(a, bu.T, sa, su, FP8_A, IEEE, CVT)
        a_ptrs += BLOCK_K
    _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT, HAS_BIAS, SCALE_INPUT, FP8_A)


@triton.jit
def _gemm2_fp8_tmaw_tile(
    a_ptr, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_at, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr,
):
    """One GEMM 2 tile (no split-K): e4m3 down tiles through w_desc over down as (E*N, KD); as
    fp8_gemm's pointer tile otherwise."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, a_row, a_ptrs, _, row_w = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(N, KB) - 1
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        b = w_desc.load([row_w, kt * BLOCK_K])
        sw = _band_scale(ws_e, pid_n * BLOCK_N, last, kt, stride_wsn, KB, BLOCK_N)
        sa = tl.zeros((BLOCK_M,), tl.float32)
        if FP8_A:
            sa = tl.load(as_ptr + a_row * stride_as + kt, mask=row_mask, other=0.0)
        acc += _fp8_step(a, b.T, sa, sw, FP8_A, IEEE, CVT)
        a_ptrs += BLOCK_K
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
