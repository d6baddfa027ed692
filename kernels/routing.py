"""Router: logits, every router kind's top-k, and the per-block expert histogram, in one Triton kernel.

Shape legend: T tokens, E routed experts, K top-k, H hidden, C token blocks (chunks) of BLOCK_T tokens.

One program routes BLOCK_T tokens: logits = x @ router_weight^T (+ router_bias) in fp32, top-k by
the router's selection score (reference/routing.py; ties to the lower index) -> topk_idx (T, K)
int32, topk_weights (T, K) fp32, hist (C, E) int32 (pairs per expert per block, every block
written) and shared_gate (T,) fp32 = sigmoid(x . shared_gate_w) where the config has one. ROUTER:
0 softmax_topk, 1 topk_softmax, 2 sigmoid_grouped_topk (sigmoid + score_bias, groups masked),
3 sigmoid_top1_input.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..reference.config import ROUTERS
from .align import _finish_offsets, _scatter_block
from .jit_keys import settle
from .plan import align_blocks, router_launch

ROUTER_CODES = {r: i for i, r in enumerate(ROUTERS)}  # the kernels' ROUTER constexpr; the plan's router tiles
_align_blocks = lru_cache(maxsize=1024)(align_blocks)  # read-only dicts, one per (E, block_m, B_max)


@triton.jit
def _argmax_lowest(v, cols, BLOCK: tl.constexpr):
    """Row max of v (R, BLOCK) and the lowest column holding it."""
    m = tl.max(v, axis=1)
    i = tl.min(tl.where(v == m[:, None], cols, BLOCK), axis=1)
    return m, i


#: below every selection key (a picked or masked-out column)
_NO_KEY = tl.constexpr(-0x7FFFFFFFFFFFFFFF)


@triton.jit
def _sel_key(v, cols, BLOCK: tl.constexpr):
    """int64 keys whose max is v's max (fp32), ties to the lowest column."""
    bits = tl.where(v == 0.0, 0.0, v).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (BLOCK - 1 - cols).to(tl.int64)


@triton.jit
def _key_col(key, BLOCK: tl.constexpr):
    """The column a key of _sel_key names."""
    return (BLOCK - 1 - (key & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def _key_value(key):
    """The fp32 value a key of _sel_key holds."""
    ordered = (key >> 32).to(tl.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


# The top-k of _route_block from _sel_key's keys -> top_idx (BLOCK_T, BLOCK_K) int32 best first,
# top_val (BLOCK_T, BLOCK_K) fp32 (zero past K), picked (BLOCK_T, BLOCK_E) int32.
@triton.jit
def _topk_maxima(key, src, ROUTER: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """K dependent row maxima, each masking the column it found (K cross-warp reductions)."""
    cols = tl.arange(0, BLOCK_E)[None, :]
    kcols = tl.arange(0, BLOCK_K)[None, :]
    top_idx = tl.zeros((BLOCK_T, BLOCK_K), tl.int32)
    top_val = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    picked = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
    for k in tl.static_range(K):  # one max per pick: the best score, ties to the lowest column
        best = tl.max(key, axis=1)
        i = _key_col(best, BLOCK_E)
        chosen = cols == i[:, None]
        if ROUTER == 2:  # the weight is the unbiased score, not the selection score
            val = tl.sum(tl.where(chosen, src, 0.0), axis=1)
        else:
            val = _key_value(best)
        top_idx = tl.where(kcols == k, i[:, None], top_idx)
        top_val = tl.where(kcols == k, val[:, None], top_val)
        picked = tl.where(chosen, 1, picked)
        key = tl.where(chosen, _NO_KEY, key)
    return top_idx, top_val, picked


@triton.jit
def _topk_bitonic(key, src, ROUTER: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """The BLOCK_K best keys of each row by tl.topk (bitonic), picked = keys at or above the K-th."""
    kcols = tl.arange(0, BLOCK_K)[None, :]
    best = tl.topk(key, BLOCK_K, dim=1)  # (BLOCK_T, BLOCK_K), best first; BLOCK_K: a power of 2, >= 2
    top_idx = tl.where(kcols < K, _key_col(best, BLOCK_E), 0)
    if ROUTER == 2:  # the weight is the unbiased score at that column
        top_val = tl.where(kcols < K, tl.gather(src, top_idx, axis=1), 0.0)
    else:
        top_val = tl.where(kcols < K, _key_value(best), 0.0)
    kth = tl.min(tl.where(kcols < K, best, 0x7FFFFFFFFFFFFFFF), axis=1)  # the K-th best key
    picked = (key >= kth[:, None]).to(tl.int32)
    return top_idx, top_val, picked


@triton.jit
def _logits_range(x_ptr, w_ptr, sgw_ptr, offs_t, t_mask, offs_e, e_mask, h_lo, h_hi, H, stride_xt, stride_we,
                  HAS_SG: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """Logits (BLOCK_T, BLOCK_E) fp32 and shared-gate dots (BLOCK_T,) fp32 of x's columns [h_lo, h_hi)."""
    acc = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)
    sg_acc = tl.zeros((BLOCK_T,), tl.float32)
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt
    for h0 in range(h_lo, h_hi, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_mask = offs_h < H
        xt = tl.load(x_rows + offs_h[None, :], mask=t_mask[:, None] & h_mask[None, :], other=0.0)
        wt = tl.load(w_ptr + offs_e[None, :] * stride_we + offs_h[:, None],
                     mask=e_mask[None, :] & h_mask[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(xt, wt, acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, wt, acc)
        if HAS_SG:
            sgw = tl.load(sgw_ptr + offs_h, mask=h_mask, other=0.0)
            sg_acc += tl.sum(xt.to(tl.float32) * sgw.to(tl.float32)[None, :], axis=1)
    return acc, sg_acc


@triton.jit
def _router_partial(
    x_ptr, w_ptr, sgw_ptr, part_ptr, sg_part_ptr, pid, sp,
    T, H, E, stride_xt, stride_we, H_PER_SPLIT,
    HAS_SG: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Split-H partial logits of token tile pid over H range sp (part (SPLIT, T, E) fp32,
    sg_part (SPLIT, T) fp32)."""
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, BLOCK_E)
    t_mask = offs_t < T
    e_mask = offs_e < E
    h_lo = sp * H_PER_SPLIT
    acc, sg_acc = _logits_range(x_ptr, w_ptr, sgw_ptr, offs_t, t_mask, offs_e, e_mask, h_lo, h_lo + H_PER_SPLIT, H,
                                stride_xt, stride_we, HAS_SG, IEEE, BLOCK_T, BLOCK_E, BLOCK_H)
    base = sp.to(tl.int64) * T
    tl.store(part_ptr + (base + offs_t)[:, None] * E + offs_e[None, :], acc,
             mask=t_mask[:, None] & e_mask[None, :])
    if HAS_SG:
        tl.store(sg_part_ptr + base + offs_t, sg_acc, mask=t_mask)


@triton.jit(do_not_specialize=["T"])
def _router_logits_kernel(
    x_ptr, w_ptr, sgw_ptr, part_ptr, sg_part_ptr,
    T, H, E, stride_xt, stride_we, H_PER_SPLIT,
    HAS_SG: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Program (c, s): the partial logits of token tile c over H range s."""
    _router_partial(x_ptr, w_ptr, sgw_ptr, part_ptr, sg_part_ptr, tl.program_id(0), tl.program_id(1),
                    T, H, E, stride_xt, stride_we, H_PER_SPLIT, HAS_SG, IEEE, BLOCK_T, BLOCK_E, BLOCK_H)


@triton.jit
def _route_block(
    x_ptr, w_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr, sgate_ptr, pid,
    T, H, E, stride_xt, stride_we, scaling,
    SPLIT: tl.constexpr, ROUTER: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr,
    N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, MASK_NEG_INF: tl.constexpr,
    HAS_RB: tl.constexpr, HAS_SB: tl.constexpr, HAS_SG: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr, BITONIC: tl.constexpr,
):
    """Route token block pid: logits (or the sum of SPLIT partials), top-k (K maxima, or tl.topk
    with BITONIC: the same picks), weights, shared gate. Returns (top_idx, out_mask, counts,
    offs_t, t_mask, offs_e, e_mask) for the caller's histogram or align."""
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, BLOCK_E)
    t_mask = offs_t < T
    e_mask = offs_e < E
    cols = offs_e[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)
    sg_acc = tl.zeros((BLOCK_T,), tl.float32)
    if SPLIT > 0:  # decode: the split-H partials of _router_logits_kernel, summed in a fixed order
        for sp in tl.static_range(SPLIT):
            acc += tl.load(part_ptr + (sp * T + offs_t)[:, None] * E + offs_e[None, :],
                           mask=t_mask[:, None] & e_mask[None, :], other=0.0)
            if HAS_SG:
                sg_acc += tl.load(sg_part_ptr + sp * T + offs_t, mask=t_mask, other=0.0)
    else:
        acc, sg_acc = _logits_range(x_ptr, w_ptr, sgw_ptr, offs_t, t_mask, offs_e, e_mask, 0, H, H, stride_xt,
                                    stride_we, HAS_SG, IEEE, BLOCK_T, BLOCK_E, BLOCK_H)
    logits = acc
    if HAS_RB:
        logits += tl.load(rb_ptr + offs_e, mask=e_mask, other=0.0).to(tl.float32)[None, :]
    neg_inf = float("-inf")

    if ROUTER == 2:
        src = tl.sigmoid(logits)  # the weights come from the unbiased sigmoid
        b = src
        if HAS_SB:
            b = src + tl.load(sb_ptr + offs_e, mask=e_mask, other=0.0).to(tl.float32)[None, :]
        b = tl.where(e_mask[None, :], b, neg_inf)
        if N_GROUP > 1:
            grp = offs_e // PER_GROUP
            offs_g = tl.arange(0, BLOCK_G)
            # a constexpr test
            if BLOCK_E == PER_GROUP * N_GROUP and BLOCK_G == N_GROUP:
                # every group at once: (BLOCK_T, N_GROUP, PER_GROUP) keys, two maxima per group
                k3 = tl.reshape(_sel_key(b, cols, BLOCK_E), (BLOCK_T, N_GROUP, PER_GROUP))
                k1 = tl.max(k3, axis=2)
                k2 = tl.max(tl.where(k3 == k1[:, :, None], _NO_KEY, k3), axis=2)
                gscore = _key_value(k1) + _key_value(k2)
            else:
                gscore = tl.full((BLOCK_T, BLOCK_G), neg_inf, tl.float32)
                for g in tl.static_range(N_GROUP):
                    v = tl.where((grp == g)[None, :], b, neg_inf)
                    m1, i1 = _argmax_lowest(v, cols, BLOCK_E)
                    m2 = tl.max(tl.where(cols == i1[:, None], neg_inf, v), axis=1)
                    gscore = tl.where(offs_g[None, :] == g, (m1 + m2)[:, None], gscore)
            gscore = tl.where(offs_g[None, :] < N_GROUP, gscore, neg_inf)
            gkey = _sel_key(gscore, offs_g[None, :], BLOCK_G)
            keep = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
            for _j in tl.static_range(TOPK_GROUP):
                gi = _key_col(tl.max(gkey, axis=1), BLOCK_G)
                keep = tl.where(grp[None, :] == gi[:, None], 1, keep)
                gkey = tl.where(offs_g[None, :] == gi[:, None], _NO_KEY, gkey)
            if MASK_NEG_INF:
                b = tl.where(keep != 0, b, neg_inf)
            else:
                b = tl.where(keep != 0, b, 0.0)
            b = tl.where(e_mask[None, :], b, neg_inf)
        sel = b
    else:
        src = logits
        sel = tl.where(e_mask[None, :], logits, neg_inf)

    kcols = tl.arange(0, BLOCK_K)[None, :]
    key = _sel_key(sel, cols, BLOCK_E)
    if BITONIC and K > 1:  # (one pick: the maxima's single max)
        top_idx, top_val, picked = _topk_bitonic(key, src, ROUTER, K, BLOCK_E, BLOCK_K)
    else:
        top_idx, top_val, picked = _topk_maxima(key, src, ROUTER, K, BLOCK_T, BLOCK_E, BLOCK_K)
    counts = tl.sum(tl.where(t_mask[:, None], picked, 0), axis=0)

    k_mask = kcols < K
    if ROUTER == 0 or ROUTER == 1:
        m0 = tl.max(tl.where(k_mask, top_val, neg_inf), axis=1)
        num = tl.where(k_mask, tl.exp(top_val - m0[:, None]), 0.0)
        if ROUTER == 0 and not NORM:
            den = tl.sum(tl.where(e_mask[None, :], tl.exp(logits - m0[:, None]), 0.0), axis=1)
        else:
            den = tl.sum(num, axis=1)
        wts = num / den[:, None]
    elif ROUTER == 2:
        wts = tl.where(k_mask, top_val, 0.0)
        if NORM:
            wts = wts / (tl.sum(wts, axis=1)[:, None] + 1e-20)
        wts = wts * scaling
    else:
        wts = tl.sigmoid(top_val)

    out_mask = t_mask[:, None] & k_mask
    out_off = offs_t[:, None] * K + kcols
    tl.store(topk_idx_ptr + out_off, top_idx, mask=out_mask)
    tl.store(topk_w_ptr + out_off, wts, mask=out_mask)
    if HAS_SG:
        tl.store(sgate_ptr + offs_t, tl.sigmoid(sg_acc), mask=t_mask)
    return top_idx, out_mask, counts, offs_t, t_mask, offs_e, e_mask


@triton.jit(do_not_specialize=["T", "B_MAX"])
def _router_kernel(
    x_ptr, w_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr,
    topk_idx_ptr, topk_w_ptr, hist_ptr, sgate_ptr,
    counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr, B_MAX,
    T, H, E, stride_xt, stride_we,
    scaling, SPLIT: tl.constexpr, FUSE_ALIGN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_PAD: tl.constexpr, ROUTER: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr,
    N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, MASK_NEG_INF: tl.constexpr,
    HAS_RB: tl.constexpr, HAS_SB: tl.constexpr, HAS_SG: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr, BITONIC: tl.constexpr,
):
    pid = tl.program_id(0)
    top_idx, out_mask, counts, offs_t, t_mask, offs_e, e_mask = _route_block(
        x_ptr, w_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr, sgate_ptr, pid,
        T, H, E, stride_xt, stride_we, scaling, SPLIT, ROUTER, K, NORM, N_GROUP, TOPK_GROUP, PER_GROUP,
        MASK_NEG_INF, HAS_RB, HAS_SB, HAS_SG, IEEE, BLOCK_T, BLOCK_E, BLOCK_H, BLOCK_K, BLOCK_G, BITONIC)
    if FUSE_ALIGN:  # one program holds every token: align here (align.py's scan and scatter)
        start = _finish_offsets(counts, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr,
                                padded_token_ptr, padded_pair_ptr, BLOCK_M, BLOCK_E, BLOCK_B, BLOCK_PAD)
        idx_v = tl.where(out_mask, top_idx, -1)
        _scatter_block(idx_v, offs_t, t_mask, start, offs_e, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
                       K, BLOCK_T, BLOCK_E, BLOCK_K)
    else:
        tl.store(hist_ptr + pid * E + offs_e, counts, mask=e_mask)


def launch_router(x, weights, config, topk_idx, topk_w, hist, sgate, block_t: int, split: int = 0,
                  meta: dict | None = None, block_m: int = 16, *, launch: dict | None = None,
                  part: tuple | None = None) -> bool:
    """Fill topk_idx (T, K) int32, topk_w (T, K) fp32, hist (C, E) int32 and sgate (T,) fp32 (if gated).

    ``launch``: plan.router_launch's sizes. With ``meta`` and one token block the router program
    also aligns: returns True if it did. ``part``: the split-H partials (SPLIT, T, E) fp32 and
    (SPLIT, T) fp32 or None (gated), made beforehand (default: fresh)."""
    T, H = x.shape
    E, K = config.num_experts, config.top_k
    if T == 0:
        return False
    rl = launch or router_launch(T, E, H, K, config.n_group, interpret=x.device.type == "cpu", split=split)
    if rl["BLOCK_T"] != block_t:
        raise ValueError(f"launch_router: block_t={block_t} disagrees with the plan's BLOCK_T={rl['BLOCK_T']}")
    C = rl["C"]
    split = rl["SPLIT"]
    sgw = weights.shared_gate
    ieee = x.dtype == torch.float32
    part, sg_part = (part or (None, None)) if split > 0 else (None, None)
    if split > 0:
        if part is None:
            part = torch.empty((split, T, E), device=x.device, dtype=torch.float32)
            sg_part = torch.empty((split, T), device=x.device, dtype=torch.float32) if sgw is not None else None
        _router_logits_kernel[rl["logits_grid"]](
            x, weights.router_weight, sgw, part, sg_part, T, H, E, x.stride(0), weights.router_weight.stride(0),
            rl["H_PER_SPLIT"], HAS_SG=sgw is not None, IEEE=ieee, BLOCK_T=rl["LOGITS_T"], BLOCK_E=rl["BLOCK_E"],
            BLOCK_H=rl["BLOCK_H"], num_warps=rl["logits_warps"],
        )
    fuse = meta is not None and C == 1
    m = meta if fuse else {}
    B_max = m["block_expert"].shape[0] if fuse else 1
    bl = _align_blocks(E, block_m, B_max)
    _router_kernel[rl["grid"]](
        x, weights.router_weight, weights.router_bias, weights.score_bias, sgw, part, sg_part,
        topk_idx, topk_w, hist, sgate,
        m.get("counts"), m.get("padded_offsets"), m.get("block_expert"), m.get("padded_token"),
        m.get("padded_pair"), m.get("pair_dest"), B_max,
        T, H, E, x.stride(0), weights.router_weight.stride(0),
        float(config.routed_scaling_factor), SPLIT=split, FUSE_ALIGN=fuse, BLOCK_M=block_m,
        BLOCK_B=bl["BLOCK_B"], BLOCK_PAD=bl["BLOCK_PAD"], ROUTER=ROUTER_CODES[config.router], K=K,
        NORM=bool(config.norm_topk_prob), N_GROUP=config.n_group, TOPK_GROUP=config.topk_group,
        PER_GROUP=E // config.n_group, MASK_NEG_INF=config.group_mask == "neg_inf",
        HAS_RB=weights.router_bias is not None, HAS_SB=weights.score_bias is not None,
        HAS_SG=sgw is not None, IEEE=ieee,
        BLOCK_T=rl["BLOCK_T"], BLOCK_E=rl["BLOCK_E"], BLOCK_H=rl["BLOCK_H"], BLOCK_K=rl["BLOCK_K"],
        BLOCK_G=rl["BLOCK_G"], BITONIC=rl["BITONIC"], num_warps=rl["num_warps"],
    )
    return fuse


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
