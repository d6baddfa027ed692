"""The megakernel's FP8 GEMM tiles with the weights through TMA descriptors (config "tma_weights").

Shape legend: T tokens, E experts, H hidden, I expert width (N: a GEMM's output width, KD: its
depth), KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP).

They compute exactly what fp8_gemm's pointer tiles compute (_gemm1_fp8_xq_tile with XQ off,
_gemm2_fp8_tile without split-K), per 128-deep K step kt:

    FP8_A:      acc += dot(a8, w8) * sa[:, None] * sw[None, :]    (e4m3 x e4m3, fp32)
    weights:    acc += dot(a, bf16(w8)) * sw[None, :]             (fp8_common._e4m3_to, CVT)

with the same per-column weight scales (fp8_common._band_scale: one uniform load per scale block the
tile touches, the values the pointer tiles gather per column), so the two are interchangeable per
task. What differs is how the e4m3 weight tile gets into shared memory: one bulk copy of a
(BLOCK_N, KB) box per K step (zero past KD; rows past N read the next rows, which the stores
mask), not a program's cp.async stream of 16-byte pieces. The rows (x, or GEMM 1's h written in
this launch through the generic proxy) stay pointer loads, as grouped_gemm._gemm2_tmaw_tile's.

Why: at decode the layer is the weights' bytes, FP8 halves them, and bulk copies stream them with
fewer instructions than cp.async (docs/kernels.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fp8_common import _band_scale, _e4m3_to, _fp8a_part, _gate_up_tma_step, _gemm1_fp8_epilogue, _quantize_groups
from .grouped_gemm import _gemm1_tile_start, _gemm2_epilogue, _gemm2_tile_start


@triton.jit
def _fp8_step(a, b, sa, sw, FP8_A: tl.constexpr, IEEE: tl.constexpr, CVT: tl.constexpr):
    """One K step's scaled product of rows a (BM, KB) and the weight tile b (KB, BN): FP8_A, a
    holds e4m3 codes with row scales sa; else a in the activation dtype and b converted to it."""
    if FP8_A:
        return _fp8a_part(a, b, sa, sw)
    elif IEEE:
        return tl.dot(a, _e4m3_to(b, a.dtype, CVT), input_precision="ieee") * sw[None, :]
    else:
        return tl.dot(a, _e4m3_to(b, a.dtype, CVT)) * sw[None, :]


@triton.jit
def _quantize_x_rows(x_ptr, xq_ptr, xs_ptr, t0, T, h_lo, h_hi, H, stride_xt, stride_qt, stride_st,
                     KB: tl.constexpr, BLOCK_T: tl.constexpr):
    """x's e4m3 codes and scales for tokens t0 .. t0 + BLOCK_T - 1, the KB-column groups that start in
    [h_lo, h_hi) (XQ: a router task's share, so that every group of every token is quantized once
    per call): codes into xq (T, H), one scale per group into xs (T, ceil(H / KB)), as the GEMM 1
    tiles would quantize them in their K steps (the row block's x in fp32, zero past H)."""
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


#: with SWAP 2, the e4m3 wgmma's sums are added into fp32 after every this many products of the K step
#: (tl.dot's max_num_imprecise_acc): one k32 wgmma. Triton's default on sm_90 (2^30) lets the tensor cores
#: accumulate a whole 128-deep step in their reduced-precision e4m3 accumulation
PRECISE_ACC_K = tl.constexpr(32)


@triton.jit
def _fp8a_swapped(b, aq, sa, sw, PRECISE: tl.constexpr):
    """One K step of FP8 activations with the operands swapped: dot(b, aq.T) of the e4m3 weight tile
    b (BN, KB) and codes aq (BM, KB), fp32 (BN, BM), times the row scales sa (BM,) then the column
    scales sw (BN,): _fp8a_part's product transposed, scaled in its order. With BM < 64 rows the
    weights fill wgmma's M of 64 (an e4m3 wgmma, both operands K-major in shared memory), where
    dot(aq, b) of 16 rows is an mma.sync that Triton 3.6 runs in fp16 on sm_90 (every code
    converted, the products four times the instructions). PRECISE: the wgmma's sums promoted to
    fp32 every PRECISE_ACC_K products (the megakernel's "fp8_precise_acc")."""
    if PRECISE:
        p = tl.dot(b, aq.T, max_num_imprecise_acc=PRECISE_ACC_K)
    else:
        p = tl.dot(b, aq.T)
    return p * sa[None, :] * sw[:, None]


@triton.jit
def _gemm1_fp8_tmaw_tile(
    x_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse, stride_wsn, stride_be, stride_ot, stride_os, alpha,
    limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, XQ: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, SWAP: tl.constexpr,
):
    """One GEMM 1 tile (row block pid_m of expert e, N tile pid_n): the e4m3 gate and up tiles
    (BLOCK_N, KB) through w_desc over gate_up as (E*2N, KD), their scales ws (E, ceil(2N / KB),
    ceil(KD / KB)); x rows by pointers (FP8_A: quantized per K step, h quantized into out / outs
    by fp8_gemm's epilogue). BLOCK_K == KB; FP8_A: BLOCK_N == KB. XQ (FP8_A, not SCALE_INPUT):
    x_ptr holds x's codes (T, KD) and xs_ptr their scales (T, ceil(KD / KB)) (_quantize_x_rows: the
    codes the K steps would compute), loaded instead of quantized in every K step. SWAP (FP8_A; 1, or 2
    with the sums promoted to fp32 every PRECISE_ACC_K products): the products as (BLOCK_N, BLOCK_M)
    (_fp8a_swapped), transposed once for the epilogue."""
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
    acc_gt = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)  # SWAP: the transposed sums
    acc_ut = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
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
        if SWAP:
            acc_gt += _fp8a_swapped(bg, a, sa, sg, SWAP == 2)
            acc_ut += _fp8a_swapped(bu, a, sa, su, SWAP == 2)
        else:
            acc_g += _fp8_step(a, bg.T, sa, sg, FP8_A, IEEE, CVT)
            acc_u += _fp8_step(a, bu.T, sa, su, FP8_A, IEEE, CVT)
        a_ptrs += BLOCK_K
    if SWAP:
        acc_g = acc_gt.T
        acc_u = acc_ut.T
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, SWAP: tl.constexpr,
):
    """One GEMM 2 tile (no split-K): the e4m3 down tiles (BLOCK_N, KB) through w_desc over down as
    (E*N, KD) with their scales ws (E, ceil(N / KB), ceil(KD / KB)); the activation rows by
    pointers (FP8_A: e4m3 codes with their scales as_ptr (rows, ceil(KD / KB))). BLOCK_K == KB.
    SWAP (FP8_A) as _gemm1_fp8_tmaw_tile's."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, a_row, a_ptrs, _, row_w = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(N, KB) - 1
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)  # SWAP: the transposed sum
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        b = w_desc.load([row_w, kt * BLOCK_K])
        sw = _band_scale(ws_e, pid_n * BLOCK_N, last, kt, stride_wsn, KB, BLOCK_N)
        sa = tl.zeros((BLOCK_M,), tl.float32)
        if FP8_A:
            sa = tl.load(as_ptr + a_row * stride_as + kt, mask=row_mask, other=0.0)
        if SWAP:
            acc_t += _fp8a_swapped(b, a, sa, sw, SWAP == 2)
        else:
            acc += _fp8_step(a, b.T, sa, sw, FP8_A, IEEE, CVT)
        a_ptrs += BLOCK_K
    if SWAP:
        acc = acc_t.T
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)
