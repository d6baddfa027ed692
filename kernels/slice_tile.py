"""One expert_slice task of the megakernel: an expert's MLP on a slice of its width, GEMM 1 and
GEMM 2 in one tile function (reference/tiles.py, "With I sliced").

Shape legend: T tokens, K top-k, KS = K (+1 with a shared MLP) rows per token in the pair buffer,
H hidden, I expert width, S = SLICE columns of I per task (padded to BLOCK_C, a power of two).

For row block b of expert e and slice c (columns [c S, c S + S) of I):
    z_g, z_u = x[rows] @ gate_up[e, slice]^T, x[rows] @ gate_up[e, I + slice]^T     (fp32, over H)
    h = act(z_g, z_u) (input scale, biases, activation: grouped_gemm._act_values), rounded to the
        weights' dtype as the two-GEMM path stores it
    h scaled by the routing weight (before the rounding; linear, so the same sum as scaling GEMM 2's)
    for every BLOCK_N block of H:  o = h @ down[e, :, slice]^T  (fp32), stored at row
        c*T*KS + t*KS + k of the fp32 pair buffer; slice 0's task then adds the down bias (times the
        routing weight) to its rows, so the loop over H holds no load but the weights'
The combine (_combine_slabs_tile) then sums each token's slabs and slots in a fixed order: the
partial products of the slices add up to GEMM 2's sum over I, bitwise the same run to run.

Why: at decode a GEMM 2 tile must wait for every GEMM 1 tile of its row block, and the two phases
split the programs' streams in two with a bubble between them. A slice task needs nothing but the
routing, so every program streams one slice's gate, up and down weights (3 S H elements) back to
back, and S is chosen (configs.slice_width) so that the slices of the touched experts fill the
programs' waves. The price is the fp32 partials, T K slabs x H, that the combine reads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .grouped_gemm import _act_values, _gemm1_rows, _gemm2_rows, _mma


@triton.jit
def _expert_slice_tile(
    x_ptr, gu_ptr, gub_ptr, dn_ptr, dnb_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    b, c, e, T, H, I, stride_xt, stride_gue, stride_gun, stride_gub, stride_dne, stride_dnn, stride_dnb,
    alpha, limit,
    K: tl.constexpr, KS: tl.constexpr, ACT: tl.constexpr, HAS_GUB: tl.constexpr, HAS_DNB: tl.constexpr,
    SCALE_INPUT: tl.constexpr, G2_SCALE: tl.constexpr, EVEN_K: tl.constexpr, EVEN_S: tl.constexpr,
    EVEN_N: tl.constexpr, DOWN_T: tl.constexpr, TMA_S: tl.constexpr, gu_desc, dn_desc,
    IEEE: tl.constexpr, SLICE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Row block b (of expert e), slice c of I: both GEMMs of the slice (module docstring).
    EVEN_K: H % BLOCK_K == 0; EVEN_S: I % SLICE == 0 (no slice runs past I); EVEN_N: H % BLOCK_N == 0.
    The down weights: (E, H, I) as stored (element (e, h, i) at e stride_dne + h stride_dnn + i: a
    slice reads S-element pieces of each H row) or, DOWN_T, a (E, I, H) copy (at e stride_dne +
    i stride_dnn + h: a slice reads S whole rows; config "slice_down_t"). The unit strides are
    written as such: Triton 3.6 does not specialize an argument equal to 1, and the copies need to
    know which dimension is contiguous to vectorize.
    TMA_S (config "slice_tma", I % SLICE == 0): the weights through TMA descriptors that see each
    slice as a block of exactly SLICE rows (slice_descriptors): gate_up as (E 2I/S, S, H) in
    (1, BLOCK_C, BLOCK_K) boxes, the down weights as (E I/S, S, H) (DOWN_T) or (E H, I/S, S) in
    (1, BLOCK_C, BLOCK_N) / (BLOCK_N, 1, BLOCK_C) boxes. The rows (columns) past S are out of
    bounds and come in as zeros without a memory access, where the cp.async loads zero-fill
    BLOCK_C - S lanes of every copy and take their share of the copies' rate."""
    rows, tok, row_mask = _gemm1_rows(padded_token_ptr, b, T, False, BLOCK_M)
    j = tl.arange(0, BLOCK_C)
    offs_c = c * SLICE + j
    if EVEN_S:
        c_mask = j < SLICE
    else:
        c_mask = (j < SLICE) & (offs_c < I)
    offs_bc = tl.where(c_mask, offs_c, 0)  # in-bounds weight rows; masked lanes load nothing
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * stride_xt + offs_k[None, :]
    wg_ptrs = gu_ptr + e.to(tl.int64) * stride_gue + offs_bc[None, :] * stride_gun + offs_k[:, None]
    wu_ptrs = wg_ptrs + I * stride_gun
    acc_g = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    ns = I // SLICE  # slices per expert (TMA_S: exact)
    for kt in range(0, tl.cdiv(H, BLOCK_K)):
        if TMA_S:
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < H - kt * BLOCK_K)[None, :], other=0.0)
            bg = tl.reshape(gu_desc.load([e * 2 * ns + c, 0, kt * BLOCK_K]), (BLOCK_C, BLOCK_K)).T
            bu = tl.reshape(gu_desc.load([e * 2 * ns + ns + c, 0, kt * BLOCK_K]), (BLOCK_C, BLOCK_K)).T
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            bg = tl.load(wg_ptrs, mask=c_mask[None, :], other=0.0)
            bu = tl.load(wu_ptrs, mask=c_mask[None, :], other=0.0)
        else:
            k_mask = offs_k < H - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            bg = tl.load(wg_ptrs, mask=k_mask[:, None] & c_mask[None, :], other=0.0)
            bu = tl.load(wu_ptrs, mask=k_mask[:, None] & c_mask[None, :], other=0.0)
        acc_g = _mma(a, bg, acc_g, IEEE)
        acc_u = _mma(a, bu, acc_u, IEEE)
        a_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    h = _act_values(acc_g, acc_u, rows, row_mask, e, offs_bc, I, gub_ptr, stride_gub, padded_pair_ptr, topk_w_ptr,
                    alpha, limit, ACT, HAS_GUB, SCALE_INPUT)
    _, row_mask2, tok2, slot, srow = _gemm2_rows(padded_pair_ptr, b, T, K, False, BLOCK_M)
    if G2_SCALE:  # the routing weight scales h once, not each H block's sums: no load in the loop below
        sc = tl.load(topk_w_ptr + srow, mask=row_mask2, other=0.0)
        h = h * sc[:, None]
    h = tl.where(c_mask[None, :], h, 0.0).to(dn_ptr.dtype.element_ty)
    orow = (c * T * KS + tok2 * KS + slot).to(tl.int64)  # slab c's rows
    offs_nb = tl.arange(0, BLOCK_N)
    # offs_c, not offs_bc (tl.where would hide its contiguity, which the (E, H, I) layout's loads
    # run along, and turn the copies into scalar loads); the mask keeps lanes past the slice from loading
    if DOWN_T:
        w_base = dn_ptr + e.to(tl.int64) * stride_dne + offs_c[:, None] * stride_dnn
    else:
        w_base = dn_ptr + e.to(tl.int64) * stride_dne + offs_c[:, None]
    for n in range(0, tl.cdiv(H, BLOCK_N)):
        offs_n = n * BLOCK_N + offs_nb
        # in bounds by the wrap (offs_n % H) as GEMM 2's tiles are; EVEN_N: nothing to wrap, and a
        # (E, I, H) copy's rows stay contiguous (the modulo hides it)
        if EVEN_N:
            offs_w = offs_n
        else:
            offs_w = offs_n % H
        if TMA_S:
            if DOWN_T:  # zero past H (the descriptor's last dimension)
                w = tl.reshape(dn_desc.load([e * ns + c, 0, n * BLOCK_N]), (BLOCK_C, BLOCK_N))
            else:  # rows past H are the next expert's (or zero past the last): the store masks them
                w = tl.reshape(dn_desc.load([e * H + n * BLOCK_N, c, 0]), (BLOCK_N, BLOCK_C)).T
        elif DOWN_T:
            w = tl.load(w_base + offs_w[None, :], mask=c_mask[:, None], other=0.0)
        else:
            w = tl.load(w_base + offs_w[None, :] * stride_dnn, mask=c_mask[:, None], other=0.0)
        acc = _mma(h, w, tl.zeros((BLOCK_M, BLOCK_N), tl.float32), IEEE)
        tl.store(out_ptr + orow[:, None] * H + offs_n[None, :], acc,
                 mask=row_mask2[:, None] & (offs_n < H)[None, :])
    if HAS_DNB:  # the down bias (times the routing weight), once per pair: slab 0's task adds it
        if c == 0:
            tl.debug_barrier()  # this task's slab rows are written
            for n in range(0, tl.cdiv(H, BLOCK_N)):
                offs_n = n * BLOCK_N + offs_nb
                m = row_mask2[:, None] & (offs_n < H)[None, :]
                bias = tl.load(dnb_ptr + e * stride_dnb + offs_n, mask=offs_n < H, other=0.0).to(tl.float32)
                if G2_SCALE:
                    bias = bias[None, :] * sc[:, None]
                else:
                    bias = bias[None, :] + tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                ptrs = out_ptr + orow[:, None] * H + offs_n[None, :]
                tl.store(ptrs, tl.load(ptrs, mask=m, other=0.0) + bias, mask=m)


@triton.jit
def _combine_slabs_tile(src_ptr, y_ptr, pid_t, pid_h, T, H, KS: tl.constexpr, SLABS: tl.constexpr,
                        KS0: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """The combine of expert_slice slabs: y rows of token block pid_t, columns of H block pid_h, the
    sum of the SLABS x (KS - KS0) routed partial rows of each token loaded as one (BLOCK_R, BLOCK_H)
    tile and reduced at once (a fixed reduction tree: bitwise the same run to run), then the last
    KS0 slots of slab 0 (the shared MLP's) added. One tile, not a loop over slabs: at decode the
    rows come from L2 and a loop would wait on each slab's loads in turn."""
    KR: tl.constexpr = KS - KS0
    r = tl.arange(0, BLOCK_R)
    r_off = (r // KR).to(tl.int64) * T * KS + r % KR  # slab s, slot k -> row s*T*KS + k (+ t*KS)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    for i in range(0, BLOCK_T):
        t = pid_t * BLOCK_T + i
        if t < T:
            ptrs = src_ptr + (r_off + t * KS)[:, None] * H + offs_h[None, :]
            acc = tl.sum(tl.load(ptrs, mask=(r < SLABS * KR)[:, None] & h_mask[None, :], other=0.0), axis=0)
            for k in tl.static_range(KR, KS):
                acc += tl.load(src_ptr + (t * KS + k).to(tl.int64) * H + offs_h, mask=h_mask, other=0.0)
            tl.store(y_ptr + t.to(tl.int64) * H + offs_h, acc.to(y_ptr.dtype.element_ty), mask=h_mask)
