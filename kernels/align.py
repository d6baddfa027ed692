"""Align: sort the (token, slot) pairs by expert and pad each expert to BLOCK_M rows, on the device.

Shape legend: T tokens, E experts, K top-k, C token chunks (the router's blocks of BLOCK_T tokens),
P padded rows, B = P // BLOCK_M blocks, P_max / B_max their bounds (fixed for T: no host sync).

Produces ``reference.dispatch.plan_dispatch(topk_idx, E, BLOCK_M)``'s padded view: counts (E,),
padded_offsets (E+1,), padded_token / padded_pair (P_max,) (token / pair t*K+k of each padded row,
-1 in padding rows), block_expert (B_max,) (-1 past the last block), pair_dest (T*K,), all int32.
After the router's hist (C, E): _scan_experts_kernel (chunk_base, counts), _layout_kernel (offsets,
block_expert, padding rows), _scatter_pairs_kernel (row = padded_offsets[e] + chunk_base[c, e] +
rank in chunk). The kernels trust the routing: K distinct ids in [0, E) per token (checks.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .jit_keys import settle
from .plan import align_blocks, align_launch  # noqa: F401 - align_blocks: kept importable from here

#: token blocks with at most this many (token, slot, expert) cells are aligned with 3-D one-hot tensors
ONE_SHOT = tl.constexpr(4096)


@triton.jit
def _finish_offsets(counts, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr,
                    padded_token_ptr, padded_pair_ptr,
                    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_PAD: tl.constexpr):
    """From counts (BLOCK_E,): store counts, padded offsets, block_expert, padding rows; -> first padded rows."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    incl = tl.cumsum(padded, axis=0)
    start = incl - padded
    tl.store(counts_ptr + offs_e, counts, mask=e_mask)
    tl.store(padded_off_ptr + offs_e, start, mask=e_mask)
    total = tl.sum(padded, axis=0)
    tl.store(padded_off_ptr + E, total)
    # block b's expert: the number of experts ending at or before row b*BLOCK_M
    end_masked = tl.where(e_mask, incl, 2147483647)
    for b0 in range(0, B_MAX, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        row = offs_b * BLOCK_M
        be = tl.sum(tl.where(end_masked[None, :] <= row[:, None], 1, 0), axis=1)
        be = tl.where(row < total, be, -1)
        tl.store(block_expert_ptr + offs_b, be, mask=offs_b < B_MAX)
    # padding rows of each expert: [start + count, start + padded)
    offs_j = tl.arange(0, BLOCK_PAD)
    pad_row = (start + counts)[:, None] + offs_j[None, :]
    pm = e_mask[:, None] & (offs_j[None, :] < (padded - counts)[:, None])
    neg = tl.full((BLOCK_E, BLOCK_PAD), -1, tl.int32)
    tl.store(padded_token_ptr + pad_row, neg, mask=pm)
    tl.store(padded_pair_ptr + pad_row, neg, mask=pm)
    return start


@triton.jit
def _align_one(idx, valid, counts, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr,
               padded_token_ptr, padded_pair_ptr, pair_dest_ptr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The align of a batch of one token: what _finish_offsets and _scatter_block store, from the ranks
    of its picks. idx (BLOCK_K,) its distinct experts, valid (BLOCK_K,) the K picks, counts (BLOCK_E,)
    its histogram. Block b is the picked expert of rank b (config "align_one", T = 1)."""
    offs_k = tl.arange(0, BLOCK_K)
    key = tl.where(valid, idx, 2147483647)
    n = tl.sum(valid.to(tl.int32), axis=0)
    rank = tl.sum((key[None, :] < key[:, None]).to(tl.int32), axis=1)  # picks with a lower expert
    start = rank * BLOCK_M
    below = tl.sum((key[None, :] < offs_e[:, None]).to(tl.int32), axis=1)  # (BLOCK_E,)
    tl.store(counts_ptr + offs_e, counts, mask=e_mask)
    tl.store(padded_off_ptr + offs_e, below * BLOCK_M, mask=e_mask)
    tl.store(padded_off_ptr + E, n * BLOCK_M)
    tl.store(block_expert_ptr + offs_k, tl.full((BLOCK_K,), -1, tl.int32), mask=(offs_k >= n) & (offs_k < B_MAX))
    tl.store(block_expert_ptr + rank, idx, mask=valid)
    tl.store(padded_token_ptr + start, offs_k * 0, mask=valid)
    tl.store(padded_pair_ptr + start, offs_k, mask=valid)
    tl.store(pair_dest_ptr + offs_k, start, mask=valid)
    offs_j = tl.arange(0, BLOCK_M)  # the padding rows of each pick's block: [start + 1, start + BLOCK_M)
    pad = start[:, None] + offs_j[None, :]
    pm = valid[:, None] & (offs_j[None, :] > 0)
    neg = tl.full((BLOCK_K, BLOCK_M), -1, tl.int32)
    tl.store(padded_token_ptr + pad, neg, mask=pm)
    tl.store(padded_pair_ptr + pad, neg, mask=pm)


@triton.jit
def _scatter_block(idx, offs_t, t_mask, base, offs_e, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
                   K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """Write the padded rows of a token block: idx (BLOCK_T, BLOCK_K) (-1 masked), base (BLOCK_E,)."""
    offs_k = tl.arange(0, BLOCK_K)
    if BLOCK_T * BLOCK_K * BLOCK_E <= ONE_SHOT:  # every slot at once: two reductions in all
        hit = (idx[:, :, None] == offs_e[None, None, :]) & t_mask[:, None, None]  # (T, K, E)
        onehot = tl.sum(hit.to(tl.int32), axis=1)
        rank = tl.cumsum(onehot, axis=0) - onehot
        dest = tl.sum(tl.where(hit, (rank + base[None, :])[:, None, :], 0), axis=2)  # (T, K)
        m = t_mask[:, None] & (offs_k < K)[None, :]
        p = offs_t[:, None] * K + offs_k[None, :]
        tl.store(padded_token_ptr + dest, offs_t[:, None] + offs_k[None, :] * 0, mask=m)
        tl.store(padded_pair_ptr + dest, p, mask=m)
        tl.store(pair_dest_ptr + p, dest, mask=m)
    else:
        # onehot[t, e]: token t picked e (at most once); exclusive cumsum over tokens = rank in block
        onehot = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
        for k in tl.static_range(K):
            ik = tl.sum(tl.where(offs_k[None, :] == k, idx, 0), axis=1)
            onehot += tl.where((offs_e[None, :] == ik[:, None]) & t_mask[:, None], 1, 0)
        rank = tl.cumsum(onehot, axis=0) - onehot
        dest_te = rank + base[None, :]
        for k in tl.static_range(K):
            ik = tl.sum(tl.where(offs_k[None, :] == k, idx, 0), axis=1)
            dest = tl.sum(tl.where(offs_e[None, :] == ik[:, None], dest_te, 0), axis=1)
            p = offs_t * K + k
            tl.store(padded_token_ptr + dest, offs_t, mask=t_mask)
            tl.store(padded_pair_ptr + dest, p, mask=t_mask)
            tl.store(pair_dest_ptr + p, dest, mask=t_mask)


@triton.jit
def _chunk_prefix(hist_ptr, chunk_base_ptr, C, E, offs_e, e_mask, BLOCK_C: tl.constexpr):
    """chunk_base (C, E): experts offs_e's exclusive prefix over hist's C chunks; returns their counts."""
    running = tl.zeros(offs_e.shape, tl.int32)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        m = (offs_c < C)[:, None] & e_mask[None, :]
        h = tl.load(hist_ptr + offs_c[:, None] * E + offs_e[None, :], mask=m, other=0)
        excl = tl.cumsum(h, axis=0) - h + running[None, :]
        tl.store(chunk_base_ptr + offs_c[:, None] * E + offs_e[None, :], excl, mask=m)
        running += tl.sum(h, axis=0)
    return running


@triton.jit
def _scan(
    hist_ptr, chunk_base_ptr, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr, padded_pair_ptr,
    C, E, B_MAX,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_PAD: tl.constexpr,
):
    """The scan (one program): chunk bases, counts, padded offsets, block_expert, padding rows."""
    offs_e = tl.arange(0, BLOCK_E)
    e_mask = offs_e < E
    running = _chunk_prefix(hist_ptr, chunk_base_ptr, C, E, offs_e, e_mask, BLOCK_C)
    _finish_offsets(running, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr,
                    padded_token_ptr, padded_pair_ptr, BLOCK_M, BLOCK_E, BLOCK_B, BLOCK_PAD)


@triton.jit(do_not_specialize=["C"])
def _scan_experts_kernel(hist_ptr, chunk_base_ptr, counts_ptr, C, E,
                         BLOCK_EX: tl.constexpr, BLOCK_C: tl.constexpr):
    """The multi-launch scan, one program per BLOCK_EX experts: chunk_base and counts."""
    offs_e = tl.program_id(0) * BLOCK_EX + tl.arange(0, BLOCK_EX)
    e_mask = offs_e < E
    running = _chunk_prefix(hist_ptr, chunk_base_ptr, C, E, offs_e, e_mask, BLOCK_C)
    tl.store(counts_ptr + offs_e, running, mask=e_mask)


@triton.jit(do_not_specialize=["B_MAX"])
def _layout_kernel(counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr, padded_pair_ptr, E, B_MAX,
                   BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr):
    """The multi-launch padded layout, BLOCK_B row blocks a program: offsets, block_expert, padding rows."""
    offs_e = tl.arange(0, BLOCK_E)
    e_mask = offs_e < E
    counts = tl.load(counts_ptr + offs_e, mask=e_mask, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    incl = tl.cumsum(padded, axis=0)
    start = incl - padded
    total = tl.sum(padded, axis=0)
    if tl.program_id(0) == 0:
        tl.store(padded_off_ptr + offs_e, start, mask=e_mask)
        tl.store(padded_off_ptr + E, total)
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row = offs_b * BLOCK_M
    end_masked = tl.where(e_mask, incl, 2147483647)
    be = tl.sum(tl.where(end_masked[None, :] <= row[:, None], 1, 0), axis=1)
    live = row < total
    tl.store(block_expert_ptr + offs_b, tl.where(live, be, -1), mask=offs_b < B_MAX)
    # the rows of block b past its expert's pairs: [start[e] + counts[e], (b + 1) BLOCK_M)
    fill = tl.sum(tl.where(offs_e[None, :] == be[:, None], (start + counts)[None, :], 0), axis=1)
    rows = row[:, None] + tl.arange(0, BLOCK_M)[None, :]
    pm = live[:, None] & (rows >= fill[:, None])
    neg = tl.full((BLOCK_B, BLOCK_M), -1, tl.int32)
    tl.store(padded_token_ptr + rows, neg, mask=pm)
    tl.store(padded_pair_ptr + rows, neg, mask=pm)


@triton.jit
def _hist_layout(hist_ptr, G, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    """The padded layout from the top-k tasks' histograms hist (G, E), not stored (ALIGN_EACH):
    (counts, first padded row, padded end of each expert (BLOCK_E,), e_mask, row blocks B)."""
    offs_e = tl.arange(0, BLOCK_E)
    e_mask = offs_e < E
    counts = tl.zeros((BLOCK_E,), tl.int32)
    for c0 in range(0, G, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        m = (offs_c < G)[:, None] & e_mask[None, :]
        counts += tl.sum(tl.load(hist_ptr + offs_c[:, None] * E + offs_e[None, :], mask=m, other=0), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    incl = tl.cumsum(padded, axis=0)
    return counts, incl - padded, incl, e_mask, tl.sum(padded, axis=0) // BLOCK_M


@triton.jit
def _expert_of_block(b, incl, e_mask, BLOCK_M: tl.constexpr):
    """The expert whose padded range holds row block b (as _finish_offsets' block_expert)."""
    return tl.sum(tl.where(e_mask & (incl <= b * BLOCK_M), 1, 0), axis=0)


@triton.jit
def _place_block(b, e, counts, start, topk_idx_ptr, TK, padded_token_ptr, padded_pair_ptr,
                 K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr):
    """Row block b's padded rows from the routing alone (ALIGN_EACH): expert e's pairs ranked
    [b BLOCK_M - start[e], + BLOCK_M) in pair order, -1 past its count (block_expert not stored).
    topk_idx (T*K,) int32 = TK pairs (<= BLOCK_P); counts, start (BLOCK_E,) from _hist_layout."""
    offs_e = tl.arange(0, BLOCK_E)
    r0 = b * BLOCK_M - tl.sum(tl.where(offs_e == e, start, 0), axis=0)  # the block's first rank within e
    n_e = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
    offs_p = tl.arange(0, BLOCK_P)
    idx = tl.load(topk_idx_ptr + offs_p, mask=offs_p < TK, other=-1)
    hit = (idx == e).to(tl.int32)
    rank = tl.cumsum(hit, axis=0) - hit
    sel = (hit > 0) & (rank >= r0) & (rank < r0 + BLOCK_M)
    dest = b * BLOCK_M + rank - r0
    tl.store(padded_token_ptr + dest, offs_p // K, mask=sel)
    tl.store(padded_pair_ptr + dest, offs_p, mask=sel)
    offs_j = tl.arange(0, BLOCK_M)
    pad = offs_j >= n_e - r0
    neg = tl.full((BLOCK_M,), -1, tl.int32)
    tl.store(padded_token_ptr + b * BLOCK_M + offs_j, neg, mask=pad)
    tl.store(padded_pair_ptr + b * BLOCK_M + offs_j, neg, mask=pad)


@triton.jit
def _given_block(topk_idx_ptr, pid, T, E, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Token block pid of a routing made elsewhere, returned as routing._route_block returns it."""
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    t_mask = offs_t < T
    out_mask = t_mask[:, None] & (offs_k[None, :] < K)
    idx = tl.load(topk_idx_ptr + offs_t[:, None] * K + offs_k[None, :], mask=out_mask, other=-1)
    counts = _block_counts(idx, t_mask, offs_k, offs_e, K, BLOCK_T, BLOCK_E, BLOCK_K)
    return idx, out_mask, counts, offs_t, t_mask, offs_e, offs_e < E


@triton.jit
def _block_counts(idx, t_mask, offs_k, offs_e, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """Pairs per expert (BLOCK_E,) of a block of expert ids idx (BLOCK_T, BLOCK_K), -1 in unused slots."""
    if BLOCK_T * BLOCK_K * BLOCK_E <= ONE_SHOT:
        hit = (idx[:, :, None] == offs_e[None, None, :]) & t_mask[:, None, None]
        counts = tl.sum(tl.sum(hit.to(tl.int32), axis=1), axis=0)
    else:
        counts = tl.zeros((BLOCK_E,), tl.int32)
        for k in tl.static_range(K):
            ik = tl.sum(tl.where(offs_k[None, :] == k, idx, 0), axis=1)
            counts += tl.sum(tl.where((offs_e[None, :] == ik[:, None]) & t_mask[:, None], 1, 0), axis=0)
    return counts


@triton.jit
def _scatter_chunk(
    topk_idx_ptr, chunk_base_ptr, padded_off_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr, c,
    T, E,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The padded rows of chunk c's pairs (after the scan)."""
    idx, _m, _counts, offs_t, t_mask, offs_e, e_mask = _given_block(topk_idx_ptr, c, T, E, K, BLOCK_T, BLOCK_E,
                                                                    BLOCK_K)
    base = tl.load(chunk_base_ptr + c * E + offs_e, mask=e_mask, other=0) + \
        tl.load(padded_off_ptr + offs_e, mask=e_mask, other=0)
    _scatter_block(idx, offs_t, t_mask, base, offs_e, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
                   K, BLOCK_T, BLOCK_E, BLOCK_K)


@triton.jit
def _pair_ranks(topk_idx_ptr, first, n, offs_p, BLOCK_J: tl.constexpr):
    """Experts, mask and ranks (each (BLOCK_P,)) of pairs offs_p of the chunk whose n pairs start at
    pair ``first`` of topk_idx (T*K,): a rank is the number of the chunk's earlier pairs with its expert."""
    offs_j = tl.arange(0, BLOCK_J)
    chunk = tl.load(topk_idx_ptr + first + offs_j, mask=offs_j < n, other=-1)
    m = offs_p < n
    e = tl.load(topk_idx_ptr + first + offs_p, mask=m, other=-1)
    same = (chunk[None, :] == e[:, None]) & (offs_j[None, :] < offs_p[:, None])
    return e, m, tl.sum(same.to(tl.int32), axis=1)


@triton.jit(do_not_specialize=["T"])
def _scatter_pairs_kernel(
    topk_idx_ptr, chunk_base_ptr, padded_off_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
    T, E,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr,
):
    """The multi-launch scatter, program (c, s): pairs [s BLOCK_P, (s + 1) BLOCK_P) of chunk c; each
    pair's padded row is chunk_base[c, e] + padded_offsets[e] + its rank (_pair_ranks)."""
    c = tl.program_id(0)
    first = c * (BLOCK_T * K)
    n = tl.minimum(BLOCK_T * K, T * K - first)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    e, m, rank = _pair_ranks(topk_idx_ptr, first, n, offs_p, BLOCK_J)
    dest = tl.load(chunk_base_ptr + c * E + e, mask=m, other=0) + tl.load(padded_off_ptr + e, mask=m, other=0) + rank
    p = first + offs_p
    tl.store(padded_token_ptr + dest, p // K, mask=m)
    tl.store(padded_pair_ptr + dest, p, mask=m)
    tl.store(pair_dest_ptr + p, dest, mask=m)


@triton.jit(do_not_specialize=["T"])
def _hist_kernel(topk_idx_ptr, hist_ptr, T, E, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """hist (C, E): pairs per expert in each chunk of BLOCK_T tokens, for a routing made elsewhere."""
    c = tl.program_id(0)
    _idx, _m, counts, _t, _tm, offs_e, e_mask = _given_block(topk_idx_ptr, c, T, E, K, BLOCK_T, BLOCK_E, BLOCK_K)
    tl.store(hist_ptr + c * E + offs_e, counts, mask=e_mask)


def launch_hist(topk_idx, hist, num_experts: int, block_t: int, *, launch: dict | None = None) -> None:
    """hist (C, E) int32 from topk_idx (T, K) int32 (see _hist_kernel); ``launch``: plan.align_launch's
    sizes for these C, K, E and block_t (its hist_grid, BLOCK_E, BLOCK_K and num_warps)."""
    T, K = topk_idx.shape
    if T == 0:
        return
    al = launch or align_launch(hist.shape[0], K, num_experts, block_t, 16, 1)
    _hist_kernel[al["hist_grid"]](topk_idx, hist, T, num_experts, K=K, BLOCK_T=block_t,
                                  BLOCK_E=al["BLOCK_E"], BLOCK_K=al["BLOCK_K"], num_warps=al["num_warps"])


def launch_align(topk_idx, hist, num_experts: int, block_t: int, block_m: int, meta: dict, *,
                 launch: dict | None = None) -> None:
    """Fill the metadata tensors in ``meta`` from topk_idx and hist; ``launch``: plan.align_launch's sizes."""
    T, K = topk_idx.shape
    E = num_experts
    if T == 0:
        return
    C = hist.shape[0]
    B_max = meta["block_expert"].shape[0]
    al = launch or align_launch(C, K, E, block_t, block_m, B_max)
    _scan_experts_kernel[al["scan_grid"]](hist, meta["chunk_base"], meta["counts"], C, E,
                                          BLOCK_EX=al["BLOCK_EX"], BLOCK_C=al["BLOCK_CS"], num_warps=al["num_warps"])
    _layout_kernel[al["layout_grid"]](
        meta["counts"], meta["padded_offsets"], meta["block_expert"], meta["padded_token"], meta["padded_pair"],
        E, B_max, BLOCK_M=al["BLOCK_M"], BLOCK_E=al["BLOCK_E"], BLOCK_B=al["BLOCK_B"], num_warps=al["num_warps"],
    )
    launch_scatter(topk_idx, meta, E, al)


def launch_scatter(topk_idx, meta: dict, num_experts: int, al: dict) -> None:
    """meta's padded_token, padded_pair and pair_dest from topk_idx (T, K) int32, chunk_base, padded_offsets."""
    T, K = topk_idx.shape
    _scatter_pairs_kernel[al["scatter_grid"]](
        topk_idx, meta["chunk_base"], meta["padded_offsets"], meta["padded_token"], meta["padded_pair"],
        meta["pair_dest"], T, num_experts, K=K, BLOCK_T=al["BLOCK_T"], BLOCK_P=al["BLOCK_P"], BLOCK_J=al["BLOCK_J"],
        num_warps=al["scatter_warps"],
    )


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
