"""The whole MoE layer in one persistent Triton launch: the megakernel.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width, C router
chunks, B routed row blocks (B_max their bound), KS = K (+1 with a shared MLP), P programs.

P programs (SMs x occupancy) run every task of ``reference.tiles.task_plan`` in ticket order (the
kinds, waits and why any P finishes: docs/megakernel.md). The kernel computes the same plan on the
device (the fixed part from ``task_layout`` as ``LAYOUT_WORDS``, the routed row blocks from its own
counts), so the cost model reads exactly the order that runs.

Synchronization: int32 counters in one sync buffer (``SYNC_WORDS`` then logits[C], g1[B_max],
shared1[Ms]); a finished task signals with a CTA barrier then a release atomic add, a waiting task
spins on an acquire read then a CTA barrier; the last program out zeroes the sync words for the
next call (or CUDA-graph replay).

The tasks run the multi-launch path's tile helpers (the same numbers); the combine sums a token's
KS rows in a fixed order. FP8: FP8 tiles, BLOCK_K = 128.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..reference import InputError
from ..reference.config import MoEConfig
from ..reference.sizes import FP8_BLOCK
from ..reference.tiles import KINDS, SYNC_STRIDE, TaskLayout, scan_block, task_layout
from . import megakernel_config as mkc
from . import workspace
from .align import (
    _align_one,
    _expert_of_block,
    _finish_offsets,
    _given_block,
    _hist_layout,
    _place_block,
    _scan,
    _scatter_block,
    _scatter_chunk,
    align_blocks,
)
from .fp8_gemm import _gemm1_fp8_tile, _gemm1_fp8_xq_tile, _gemm2_fp8_tile, convert_code
from .fp8_tma_tiles import _gemm1_fp8_tmaw_tile, _gemm2_fp8_tmaw_tile, _quantize_x_rows
from .grouped_gemm import (
    ACT_CODES,
    _combine_tile,
    _descriptor,
    _gemm1_tile,
    _gemm1_tma_tile,
    _gemm2_tile,
    _gemm2_tmaw_tile,
    _tile_ids,
)
from .jit_keys import settle
from .routing import ROUTER_CODES, _route_block, _router_partial

SW = tl.constexpr(SYNC_STRIDE)  # int32 words between two sync words: word i of SYNC_WORDS is at SW * i
KB = tl.constexpr(FP8_BLOCK)  # values per FP8 scale block (weights: KB x KB; activations: KB per row)
# each kind's code (its index in KINDS), for the record
K_LOGITS, K_TOPK, K_SCAN, K_SCATTER, K_SH1, K_G1, K_SH2, K_G2, K_COMB = (
    tl.constexpr(KINDS.index(k)) for k in ("router_logits", "router_topk", "align_scan", "align_scatter",
                                           "shared_gemm1", "gemm1", "shared_gemm2", "gemm2", "combine"))
# the record's words: a count per kind, then GEMM 1 and GEMM 2 tiles finished per expert
NK = tl.constexpr(len(KINDS))
R_G1, R_G2 = tl.constexpr(len(KINDS)), tl.constexpr(len(KINDS) + 1)

#: the int32 layout words (``layout_words``), in this order
LAYOUT_WORDS = ("nprog", "max_tasks", "s0", "f_topk", "f_scan", "f_scatter", "f_sh1", "ms", "off_logits", "off_g1",
                "off_sh1", "sync_n", "g", "b_max")
#: the constexpr groups of the kernel, each a tuple in this order (``build_launch`` makes them)
TILE_FIELDS = ("N1", "N2", "NS1", "NS2", "NCH", "BM", "BN1", "BK1", "BN2", "BK2", "S_BM", "S_BN1", "S_BN2", "S_BK",
               "C_BT", "C_BH", "GROUP_M", "EVEN_K1", "EVEN_K2", "S_EVEN_K1", "S_EVEN_K2")
ROUTE_FIELDS = ("SPLIT", "ROUTER", "K", "NORM", "N_GROUP", "TOPK_GROUP", "PER_GROUP", "MASK_NEG_INF", "HAS_RB",
                "HAS_SB", "HAS_SG", "R_BT", "R_TT", "R_BE", "R_BH", "R_BK", "R_BG", "BITONIC")
ALIGN_FIELDS = ("FUSED", "BLOCK_B", "BLOCK_PAD", "BLOCK_C", "GIVEN", "ROUTE_EACH", "ALIGN_EACH", "A_BP")
EXPERT_FIELDS = ("ACT", "HAS_GUB", "HAS_DNB", "SCALE_INPUT", "G2_SCALE", "SHARED", "KS", "IEEE")
FP8_FIELDS = ("FP8", "FP8_A", "CVT", "XQ", "TMA_W")
TOOL_FIELDS = ("RECORD", "TRACE")
CONSTEXPR_GROUPS = {"TILES": TILE_FIELDS, "ROUTE": ROUTE_FIELDS, "ALIGN": ALIGN_FIELDS, "EXPERT": EXPERT_FIELDS,
                    "FP8S": FP8_FIELDS, "TOOLS": TOOL_FIELDS}


@triton.jit
def _wait(ptr, target):
    """Spin until the counter at ptr reaches target (acquire), then line the CTA up behind it."""
    v = tl.atomic_add(ptr, 0, sem="acquire")
    while v < target:
        v = tl.atomic_add(ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _signal(ptr):
    """Every thread's stores of this task done (barrier), then one release increment."""
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release")


@triton.jit
def _now(TRACE: tl.constexpr):
    """The GPU's global nanosecond timer (TRACE only: inline PTX, which the interpreter lacks)."""
    if TRACE:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)
    else:
        return 0


@triton.jit
def _record(stats_ptr, KIND: tl.constexpr, e, E, RECORD: tl.constexpr):
    """Tests only: count a task of kind KIND, or a GEMM 1 / GEMM 2 tile of expert e (R_G1 / R_G2)."""
    if RECORD:
        if KIND < NK:
            tl.atomic_add(stats_ptr + KIND, 1)
        if KIND == R_G1:
            tl.atomic_add(stats_ptr + NK + e, 1)
        if KIND == R_G2:
            tl.atomic_add(stats_ptr + NK + E + e, 1)


@triton.jit(do_not_specialize=["T"])
def _megakernel(
    # inputs and weights
    x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, gu_ptr, gub_ptr, dn_ptr, dnb_ptr, sgu_ptr, sdn_ptr,
    # router and align metadata
    part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr, sgate_ptr, hist_ptr, chunk_base_ptr,
    counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
    # intermediates, output, the sync words, the layout words (LAYOUT_WORDS), the tests' record, the trace
    act_ptr, act_s_ptr, pairs_ptr, y_ptr, sync_ptr, lay_ptr, stats_ptr, trace_ptr,
    # TMA descriptors of the routed weights (TMA_W): gate_up as (E*2I, H), down as (E*H, I)
    gu_desc, dn_desc,
    # FP8: block scales of the weights, scales of the e4m3 activations (FP8_A)
    gus_ptr, dns_ptr, sgus_ptr, sdns_ptr, act_sc_ptr, act_s_sc_ptr, stride_guse, stride_gusn, stride_dnse,
    stride_dnsn, stride_sgusn, stride_sdnsn, stride_acs, stride_assc,
    # XQ: x's e4m3 codes (T, H) and scales (T, ceil(H / 128)), written by the router tasks
    xq_ptr, xs_ptr, stride_xs,
    # sizes and strides
    T, H, E, I, Is, stride_xt, stride_rw, stride_gue, stride_gun, stride_gub, stride_dne, stride_dnn, stride_dnb,
    scaling, alpha, limit, H_PER,
    # constexpr groups: TILE_FIELDS, ROUTE_FIELDS, ALIGN_FIELDS, EXPERT_FIELDS, FP8_FIELDS, TOOL_FIELDS
    TILES: tl.constexpr, ROUTE: tl.constexpr, ALIGN: tl.constexpr, EXPERT: tl.constexpr, FP8S: tl.constexpr,
    TOOLS: tl.constexpr,
):
    # tiles: GEMM 1 / GEMM 2 N tiles per row block, shared MLP N tiles, combine H blocks; tile shapes
    N1: tl.constexpr = TILES[0]
    N2: tl.constexpr = TILES[1]
    NS1: tl.constexpr = TILES[2]
    NS2: tl.constexpr = TILES[3]
    NCH: tl.constexpr = TILES[4]
    BM: tl.constexpr = TILES[5]
    BN1: tl.constexpr = TILES[6]
    BK1: tl.constexpr = TILES[7]
    BN2: tl.constexpr = TILES[8]
    BK2: tl.constexpr = TILES[9]
    S_BM: tl.constexpr = TILES[10]
    S_BN1: tl.constexpr = TILES[11]
    S_BN2: tl.constexpr = TILES[12]
    S_BK: tl.constexpr = TILES[13]
    C_BT: tl.constexpr = TILES[14]
    C_BH: tl.constexpr = TILES[15]
    GROUP_M: tl.constexpr = TILES[16]
    EVEN_K1: tl.constexpr = TILES[17]
    EVEN_K2: tl.constexpr = TILES[18]
    S_EVEN_K1: tl.constexpr = TILES[19]
    S_EVEN_K2: tl.constexpr = TILES[20]
    # router (routing._route_block's constexprs)
    SPLIT: tl.constexpr = ROUTE[0]
    ROUTER: tl.constexpr = ROUTE[1]
    K: tl.constexpr = ROUTE[2]
    NORM: tl.constexpr = ROUTE[3]
    N_GROUP: tl.constexpr = ROUTE[4]
    TOPK_GROUP: tl.constexpr = ROUTE[5]
    PER_GROUP: tl.constexpr = ROUTE[6]
    MASK_NEG_INF: tl.constexpr = ROUTE[7]
    HAS_RB: tl.constexpr = ROUTE[8]
    HAS_SB: tl.constexpr = ROUTE[9]
    HAS_SG: tl.constexpr = ROUTE[10]
    R_BT: tl.constexpr = ROUTE[11]
    R_TT: tl.constexpr = ROUTE[12]
    R_BE: tl.constexpr = ROUTE[13]
    R_BH: tl.constexpr = ROUTE[14]
    R_BK: tl.constexpr = ROUTE[15]
    R_BG: tl.constexpr = ROUTE[16]
    BITONIC: tl.constexpr = ROUTE[17]
    # align: FUSED, block sizes, a routing given, the router switches EACH and ALIGN_EACH
    FUSED: tl.constexpr = ALIGN[0]
    BLOCK_B: tl.constexpr = ALIGN[1]
    BLOCK_PAD: tl.constexpr = ALIGN[2]
    BLOCK_C: tl.constexpr = ALIGN[3]
    GIVEN: tl.constexpr = ALIGN[4]
    ROUTE_EACH: tl.constexpr = ALIGN[5]
    ALIGN_EACH: tl.constexpr = ALIGN[6]
    A_BP: tl.constexpr = ALIGN[7]
    # experts
    ACT: tl.constexpr = EXPERT[0]
    HAS_GUB: tl.constexpr = EXPERT[1]
    HAS_DNB: tl.constexpr = EXPERT[2]
    SCALE_INPUT: tl.constexpr = EXPERT[3]
    G2_SCALE: tl.constexpr = EXPERT[4]
    SHARED: tl.constexpr = EXPERT[5]
    KS: tl.constexpr = EXPERT[6]
    IEEE: tl.constexpr = EXPERT[7]
    # FP8 weights, FP8_A activations, CVT, XQ (x quantized once), TMA_W (weights through TMA)
    FP8: tl.constexpr = FP8S[0]
    FP8_A: tl.constexpr = FP8S[1]
    CVT: tl.constexpr = FP8S[2]
    XQ: tl.constexpr = FP8S[3]
    TMA_W: tl.constexpr = FP8S[4]
    RECORD: tl.constexpr = TOOLS[0]
    TRACE: tl.constexpr = TOOLS[1]

    # the layout words (LAYOUT_WORDS)
    NPROG = tl.load(lay_ptr + 0)
    MAX_TASKS = tl.load(lay_ptr + 1)
    S0 = tl.load(lay_ptr + 2)
    F_TOPK = tl.load(lay_ptr + 3)
    F_SCAN = tl.load(lay_ptr + 4)
    F_SCATTER = tl.load(lay_ptr + 5)
    F_SH1 = tl.load(lay_ptr + 6)
    MS = tl.load(lay_ptr + 7)
    OFF_LOGITS = tl.load(lay_ptr + 8)
    OFF_G1 = tl.load(lay_ptr + 9)
    OFF_SH1 = tl.load(lay_ptr + 10)
    SYNC_N = tl.load(lay_ptr + 11)
    G = tl.load(lay_ptr + 12)
    B_MAX = tl.load(lay_ptr + 13)

    pid = tl.program_id(0)
    p_begin = _now(TRACE)
    if ALIGN_EACH:  # the layout from the histograms, read by this program's first dynamic task and kept
        a_have = pid * 0
        a_nb = pid * 0
        a_cnt = tl.zeros((R_BE,), tl.int32)
        a_start = tl.zeros((R_BE,), tl.int32)
        a_incl = tl.zeros((R_BE,), tl.int32)
        a_emask = tl.arange(0, R_BE) < E
    t = tl.atomic_add(sync_ptr + SW * 0, 1, sem="relaxed")  # ticket
    while t < MAX_TASKS:
        stop = 0
        t_begin = _now(TRACE)
        if t < S0:  # ------------------------------------------------ the fixed part
            if t < F_TOPK:  # router_logits (c, s)
                if SPLIT > 0:
                    c = t // SPLIT
                    _router_partial(x_ptr, rw_ptr, sgw_ptr, part_ptr, sg_part_ptr, c, t % SPLIT, T, H, E, stride_xt,
                                    stride_rw, H_PER, HAS_SG, IEEE, R_BT, R_BE, R_BH)
                    if XQ:  # x's FP8 groups that start in this task's H range, for the GEMM 1 tasks
                        _quantize_x_rows(x_ptr, xq_ptr, xs_ptr, c * R_BT, T, (t % SPLIT) * H_PER,
                                         (t % SPLIT + 1) * H_PER, H, stride_xt, H, stride_xs, KB, R_BT)
                    _signal(sync_ptr + OFF_LOGITS + c)
                    _record(stats_ptr, K_LOGITS, 0, E, RECORD)
            elif t < F_SCAN:  # router_topk (group g of R_TT tokens)
                g = t - F_TOPK
                if SPLIT > 0:
                    _wait(sync_ptr + OFF_LOGITS + (g * R_TT) // R_BT, SPLIT)
                t_seen = _now(TRACE)  # TRACE: the first top-k task's phases (trace_rows)
                if GIVEN:  # a routing made elsewhere (moe_experts): read it and count
                    top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _given_block(
                        topk_idx_ptr, g, T, E, K, R_TT, R_BE, R_BK)
                else:
                    top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _route_block(
                        x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr,
                        sgate_ptr, g, T, H, E, stride_xt, stride_rw, scaling, SPLIT, ROUTER, K, NORM, N_GROUP,
                        TOPK_GROUP, PER_GROUP, MASK_NEG_INF, HAS_RB, HAS_SB, HAS_SG, IEEE, R_TT, R_BE, R_BH, R_BK,
                        R_BG, BITONIC)
                if XQ and SPLIT == 0:  # (no logits tasks) x's FP8 groups of this task's tokens
                    _quantize_x_rows(x_ptr, xq_ptr, xs_ptr, g * R_TT, T, 0, H, H, stride_xt, H, stride_xs, KB, R_TT)
                t_routed = _now(TRACE)
                if FUSED:  # one chunk holds every token: align here, then the layout is known
                    if ROUTE_EACH:  # one token: from its picks' ranks, as the GEMM 1 tasks align it
                        _align_one(tl.reshape(top_idx, (R_BK,)), tl.reshape(out_mask, (R_BK,)), cnt, offs_e, e_mask,
                                   E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                                   padded_pair_ptr, pair_dest_ptr, BM, R_BK)
                    else:
                        start = _finish_offsets(cnt, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr,
                                                block_expert_ptr, padded_token_ptr, padded_pair_ptr, BM, R_BE, BLOCK_B,
                                                BLOCK_PAD)
                        _scatter_block(tl.where(out_mask, top_idx, -1), offs_t, t_mask, start, offs_e,
                                       padded_token_ptr, padded_pair_ptr, pair_dest_ptr, K, R_TT, R_BE, R_BK)
                    _signal(sync_ptr + SW * 2)  # topk
                    tl.atomic_add(sync_ptr + SW * 3, 1, sem="release")  # scan
                else:
                    tl.store(hist_ptr + g * E + offs_e, cnt, mask=e_mask)
                    _signal(sync_ptr + SW * 2)
                if TRACE:  # (logits seen, routed, aligned and signalled) of top-k task 0
                    if g == 0:
                        ph = trace_ptr + 3 * (MAX_TASKS + NPROG)
                        tl.store(ph, t_seen)
                        tl.store(ph + 1, t_routed)
                        tl.store(ph + 2, _now(TRACE))
                _record(stats_ptr, K_TOPK, 0, E, RECORD)
            elif t < F_SCATTER:  # align_scan
                _wait(sync_ptr + SW * 2, G)
                _scan(hist_ptr, chunk_base_ptr, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                      padded_pair_ptr, G, E, B_MAX, BM, R_BE, BLOCK_C, BLOCK_B, BLOCK_PAD)
                _signal(sync_ptr + SW * 3)
                _record(stats_ptr, K_SCAN, 0, E, RECORD)
            elif t < F_SH1:  # align_scatter (c)
                _wait(sync_ptr + SW * 3, 1)
                _scatter_chunk(topk_idx_ptr, chunk_base_ptr, padded_off_ptr, padded_token_ptr, padded_pair_ptr,
                               pair_dest_ptr, t - F_SCATTER, T, E, K, R_TT, R_BE, R_BK)
                _signal(sync_ptr + SW * 4)  # scatter
                _record(stats_ptr, K_SCATTER, 0, E, RECORD)
            else:  # shared_gemm1 (m, n)
                if SHARED:
                    m, n = _tile_ids(t - F_SH1, MS, NS1, GROUP_M)
                    if FP8:
                        _gemm1_fp8_tile(x_ptr, sgu_ptr, sgus_ptr, None, act_s_ptr, act_s_sc_ptr, None, None, None, m,
                                        n, t * 0, T, Is, H, stride_xt, 0, H, 0, stride_sgusn, 0, Is, stride_assc,
                                        alpha, limit, 0, False, False, True, FP8_A, IEEE, KB, S_BM, S_BN1, S_BK, CVT)
                    else:
                        _gemm1_tile(x_ptr, sgu_ptr, None, act_s_ptr, None, None, None, None, m, n, t * 0, t * 0, 0,
                                    tl.cdiv(H, S_BK), T, Is, H, 0, stride_xt, 0, H, 0, Is, alpha, limit,
                                    0, False, False, True, S_EVEN_K1, IEEE, 1, S_BM, S_BN1, S_BK)
                    _signal(sync_ptr + OFF_SH1 + m)
                    _record(stats_ptr, K_SH1, 0, E, RECORD)
        else:  # ------------------------------------------------------- after the routed row blocks
            if ROUTE_EACH:  # one token: K row blocks of one row, whatever the routing (align._align_one)
                nb = t * 0 + K
            elif ALIGN_EACH:  # the layout from every group's histogram row, read by this program once (no scan task)
                if a_have == 0:
                    _wait(sync_ptr + SW * 2, G)  # topk
                    a_cnt, a_start, a_incl, a_emask, a_nb = _hist_layout(hist_ptr, G, E, BM, R_BE, BLOCK_C)
                    a_have = pid * 0 + 1
                nb = a_nb
            else:
                _wait(sync_ptr + SW * 3, 1)  # the layout (scan)
                nb = tl.load(padded_off_ptr + E) // BM
            kt1 = tl.cdiv(H, BK1)
            kt2 = tl.cdiv(I, BK2)
            b_sh2 = S0 + nb * N1
            b_g2 = b_sh2 + MS * NS2
            b_comb = b_g2 + nb * N2
            if ROUTE_EACH:  # a GEMM 1 task routes the token itself from the logits' partials (the values the
                # top-k task stores, stored again) or reads the routing given, not waiting for the top-k task
                if t < b_sh2:
                    if GIVEN:
                        top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _given_block(
                            topk_idx_ptr, t * 0, T, E, K, R_TT, R_BE, R_BK)
                    else:
                        _wait(sync_ptr + OFF_LOGITS, SPLIT)
                        top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _route_block(
                            x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr,
                            sgate_ptr, t * 0, T, H, E, stride_xt, stride_rw, scaling, SPLIT, ROUTER, K, NORM, N_GROUP,
                            TOPK_GROUP, PER_GROUP, MASK_NEG_INF, HAS_RB, HAS_SB, HAS_SG, IEEE, R_TT, R_BE, R_BH,
                            R_BK, R_BG, BITONIC)
                    _align_one(tl.reshape(top_idx, (R_BK,)), tl.reshape(out_mask, (R_BK,)), cnt, offs_e, e_mask,
                               E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                               padded_pair_ptr, pair_dest_ptr, BM, R_BK)
                    tl.debug_barrier()  # this program's layout stores before its loads of them
                else:
                    _wait(sync_ptr + SW * 3, 1)  # the top-k task's layout (scan)
            if t < b_sh2:  # gemm1 tile (b, n)
                if not FUSED and not ALIGN_EACH:
                    _wait(sync_ptr + SW * 4, G)  # every group's rows are in place (FUSED: the layout wait did)
                b, n = _tile_ids(t - S0, nb, N1, GROUP_M)
                if ALIGN_EACH:  # this block's rows from the routing (every N tile of the block writes the same)
                    e = _expert_of_block(b, a_incl, a_emask, BM)
                    _place_block(b, e, a_cnt, a_start, topk_idx_ptr, T * K, padded_token_ptr, padded_pair_ptr, K,
                                 BM, R_BE, A_BP)
                    tl.debug_barrier()  # this program's row stores before the tile's loads of them
                else:
                    e = tl.load(block_expert_ptr + b)
                if FP8 and TMA_W:
                    _gemm1_fp8_tmaw_tile(xq_ptr if XQ else x_ptr, xs_ptr, gu_desc, gus_ptr, gub_ptr, act_ptr,
                                         act_sc_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr, b, n, e, T, I,
                                         H, H if XQ else stride_xt, stride_xs, stride_guse, stride_gusn,
                                         stride_gub, I, stride_acs, alpha, limit, ACT, HAS_GUB, SCALE_INPUT,
                                         False, FP8_A, XQ, IEEE, KB, BM, BN1, BK1, CVT)
                elif FP8:
                    _gemm1_fp8_xq_tile(xq_ptr if XQ else x_ptr, xs_ptr, gu_ptr, gus_ptr, gub_ptr, act_ptr,
                                       act_sc_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr, b, n, e, T, I, H,
                                       H if XQ else stride_xt, stride_xs, stride_gue, stride_gun, stride_guse,
                                       stride_gusn, stride_gub, I, stride_acs, alpha, limit, ACT, HAS_GUB,
                                       SCALE_INPUT, False, FP8_A, XQ, IEEE, KB, BM, BN1, BK1, CVT)
                elif TMA_W:
                    _gemm1_tma_tile(x_ptr, gu_desc, gub_ptr, act_ptr, padded_token_ptr, padded_pair_ptr,
                                    topk_w_ptr, b, n, e, T, I, H, stride_xt, stride_gub, I, alpha, limit, ACT,
                                    HAS_GUB, SCALE_INPUT, False, EVEN_K1, IEEE, BM, BN1, BK1)
                else:
                    _gemm1_tile(x_ptr, gu_ptr, gub_ptr, act_ptr, None, padded_token_ptr, padded_pair_ptr,
                                topk_w_ptr, b, n, e, t * 0, 0, kt1, T, I, H, 0, stride_xt, stride_gue, stride_gun,
                                stride_gub, I, alpha, limit, ACT, HAS_GUB, SCALE_INPUT, False, EVEN_K1, IEEE, 1,
                                BM, BN1, BK1)
                _signal(sync_ptr + OFF_G1 + b)
                _record(stats_ptr, R_G1, e, E, RECORD)
                _record(stats_ptr, K_G1, 0, E, RECORD)
            elif t < b_g2:  # shared_gemm2 (m, n)
                if SHARED:
                    m, n = _tile_ids(t - b_sh2, MS, NS2, GROUP_M)
                    _wait(sync_ptr + OFF_SH1 + m, NS1)
                    if HAS_SG:
                        _wait(sync_ptr + SW * 2, G)  # the shared gate of every token
                    if FP8:
                        _gemm2_fp8_tile(act_s_ptr, act_s_sc_ptr, sdn_ptr, sdns_ptr, None, pairs_ptr, None, sgate_ptr,
                                        m, n, t * 0, t * 0, 0, tl.cdiv(Is, S_BK), T, H, Is, Is, stride_assc, 0, Is, 0,
                                        stride_sdnsn, 0, H, K, KS, False, HAS_SG, True, False, FP8_A, IEEE, 1, KB,
                                        S_BM, S_BN2, S_BK, CVT)
                    else:
                        _gemm2_tile(act_s_ptr, sdn_ptr, None, pairs_ptr, None, sgate_ptr, m, n, t * 0, t * 0, 0,
                                    tl.cdiv(Is, S_BK), T, H, Is, Is, 0, Is, 0, H, K, KS, False, HAS_SG, True, False,
                                    S_EVEN_K2, IEEE, 1, S_BM, S_BN2, S_BK)
                    _signal(sync_ptr + SW * 5)  # g2
                    _record(stats_ptr, K_SH2, 0, E, RECORD)
            elif t < b_comb:  # gemm2 tile (b, n)
                b, n = _tile_ids(t - b_g2, nb, N2, GROUP_M)
                if ALIGN_EACH:  # no task stores block_expert then: the expert from the layout
                    e = _expert_of_block(b, a_incl, a_emask, BM)
                else:
                    e = tl.load(block_expert_ptr + b)
                _wait(sync_ptr + OFF_G1 + b, N1)
                if FP8 and TMA_W:
                    _gemm2_fp8_tmaw_tile(act_ptr, act_sc_ptr, dn_desc, dns_ptr, dnb_ptr, pairs_ptr,
                                         padded_pair_ptr, topk_w_ptr, b, n, e, T, H, I, I, stride_acs,
                                         stride_dnse, stride_dnsn, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE,
                                         False, False, FP8_A, IEEE, KB, BM, BN2, BK2, CVT)
                elif FP8:
                    _gemm2_fp8_tile(act_ptr, act_sc_ptr, dn_ptr, dns_ptr, dnb_ptr, pairs_ptr, padded_pair_ptr,
                                    topk_w_ptr, b, n, e, t * 0, 0, kt2, T, H, I, I, stride_acs, stride_dne,
                                    stride_dnn, stride_dnse, stride_dnsn, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE,
                                    False, False, FP8_A, IEEE, 1, KB, BM, BN2, BK2, CVT)
                elif TMA_W:
                    _gemm2_tmaw_tile(act_ptr, dn_desc, dnb_ptr, pairs_ptr, padded_pair_ptr, topk_w_ptr, b, n, e,
                                     T, H, I, I, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE, False, False, EVEN_K2,
                                     IEEE, BM, BN2, BK2)
                else:
                    _gemm2_tile(act_ptr, dn_ptr, dnb_ptr, pairs_ptr, padded_pair_ptr, topk_w_ptr, b, n, e, t * 0,
                                0, kt2, T, H, I, I, stride_dne, stride_dnn, stride_dnb, H, K, KS, HAS_DNB,
                                G2_SCALE, False, False, EVEN_K2, IEEE, 1, BM, BN2, BK2)
                _signal(sync_ptr + SW * 5)
                _record(stats_ptr, R_G2, e, E, RECORD)
                _record(stats_ptr, K_G2, 0, E, RECORD)
            elif t < b_comb + tl.cdiv(T, C_BT) * NCH:  # combine (token block, H block)
                _wait(sync_ptr + SW * 5, nb * N2 + MS * NS2)
                j = t - b_comb
                _combine_tile(pairs_ptr, y_ptr, j // NCH, j % NCH, T, H, KS, 1, C_BT, C_BH)
                _record(stats_ptr, K_COMB, 0, E, RECORD)
            else:
                stop = 1
        if TRACE:  # (program, start ns, end ns) of every ticket run, for where-the-time-goes
            if stop == 0:
                tl.store(trace_ptr + 3 * t, pid.to(tl.int64))
                tl.store(trace_ptr + 3 * t + 1, t_begin)
                tl.store(trace_ptr + 3 * t + 2, _now(TRACE))
        if stop:
            t = MAX_TASKS
        else:
            t = tl.atomic_add(sync_ptr + SW * 0, 1, sem="relaxed")
    # the last program out leaves the sync words zeroed for the next call
    tl.debug_barrier()
    if TRACE:  # (program, first ticket asked, last ticket done) of every program, past the tasks' rows
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid), pid.to(tl.int64))
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid) + 1, p_begin)
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid) + 2, _now(TRACE))
    gone = tl.atomic_add(sync_ptr + SW * 1, 1, sem="acq_rel")  # exited
    if gone == NPROG - 1:
        offs = tl.arange(0, 1024)
        for i in range(0, SYNC_N, 1024):
            tl.store(sync_ptr + i + offs, 0, mask=i + offs < SYNC_N)


# --------------------------------------------------------------------------- host side
_SYNC: dict = {}
_LAYOUT: dict = {}
_CAPTURED: list = []


def trace_rows(config, T: int, mk: dict, nprog: int) -> tuple[int, int]:
    """(rows of the int64 (rows, 3) ``trace`` buffer, MAX_TASKS): row t < MAX_TASKS is ticket t's
    (program, start ns, end ns); row MAX_TASKS + p is program p's (p, first ticket asked, exit);
    row MAX_TASKS + NPROG the first top-k task's (logits seen, routed, aligned and signalled) ns."""
    mt = task_layout(config, T, mk["tiles"]).max_tasks
    return mt + nprog + 1, mt


def sync_buffer(device: torch.device, words: int) -> torch.Tensor:
    """The zeroed int32 sync words on this device and stream, kept between calls (a capture that
    needs more gets a buffer of its own)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _SYNC.get(key)
    if buf is None or buf.numel() < words:
        fresh = torch.zeros(max(words, 1024), device=device, dtype=torch.int32)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return fresh
        _SYNC[key] = buf = fresh
    return buf


def release_sync_buffer(device: torch.device, stream: int) -> torch.Tensor | None:
    """Take the sync words of ``stream`` (a raw CUDA stream handle) out of the kept ones and return
    them: for a CUDA graph captured on that stream, which must own them (and keep them alive) so
    that no later call on a stream given the same handle shares them."""
    return _SYNC.pop((str(device), stream), None)


def layout_words(lay: TaskLayout, nprog: int) -> tuple[int, ...]:
    """The kernel's layout words (LAYOUT_WORDS) for ``lay`` on ``nprog`` programs."""
    f = lay.first
    return (nprog, lay.max_tasks, lay.s0, f["router_topk"], f["align_scan"], f["align_scatter"],
            f["shared_gemm1"], lay.shared_m_blocks, lay.off_logits, lay.off_g1, lay.off_shared1, lay.sync_words,
            lay.topk_groups, lay.b_max)


def layout_buffer(device: torch.device, words: tuple[int, ...]) -> torch.Tensor:
    """The layout words as an int32 tensor on ``device``, made once per distinct layout and kept
    (a layout first met inside a capture gets a tensor for that graph)."""
    key = (str(device), words)
    buf = _LAYOUT.get(key)
    if buf is None:
        host = torch.tensor(words, dtype=torch.int32)
        if device.type == "cuda":
            host = host.pin_memory()
            buf = (torch.empty_like(host, device=device).copy_(host, non_blocking=True), host)
            if torch.cuda.is_current_stream_capturing():
                _CAPTURED.append(buf)  # the pinned source outlives the graph's copy
                return buf[0]
        else:
            buf = (host, host)
        _LAYOUT[key] = buf
    return buf[0]


def num_programs(device: torch.device, layout: TaskLayout, occupancy: int) -> int:
    """P: SMs x occupancy on a GPU, 3 under the interpreter; never more than there are tasks."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        p = sms * occupancy
    else:
        p = 3
    return max(1, min(p, layout.max_tasks))


def megakernel_config(config, T: int, dtype: torch.dtype, device: torch.device, *, routing_given: bool = False,
                      fp8: str | None = None) -> dict:
    """Tiles, warps and stages of the megakernel for this call (megakernel_config.megakernel_config)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    return mkc.megakernel_config(config.num_experts, config.hidden_size, config.intermediate_size, config.top_k,
                                 config.shared_intermediate_size, T, num_sms=sms,
                                 interpret=device.type == "cpu", routing_given=routing_given, fp8=fp8)


def check_fp8_tiles(mk: dict, fp8: str | None) -> None:
    """FP8 tiles need BLOCK_K = 128 (and BLOCK_N1 = 128 with FP8 activations); an error names the key."""
    if fp8 is None:
        return
    t = mk["tiles"]
    want = [("gemm1", "BLOCK_K", FP8_BLOCK), ("gemm2", "BLOCK_K", FP8_BLOCK), ("shared", "BLOCK_K", FP8_BLOCK)]
    if fp8 == "weights+act":
        want += [("gemm1", "BLOCK_N", FP8_BLOCK), ("shared", "BLOCK_N1", FP8_BLOCK)]
    for part, key, v in want:
        if t[part].get(key, 0) != v:
            raise ValueError(f"FP8 ({fp8}) megakernel tiles need tiles[{part!r}][{key!r}] = {v}, got {t[part].get(key)!r}")


def fp8_convert_code(gpu: bool) -> int:
    """CVT of weight-only FP8 (megakernel_config.FP8_CONVERT_DEFAULT) on a GPU or under the interpreter."""
    return convert_code(mkc.FP8_CONVERT_DEFAULT, gpu, "megakernel_config.FP8_CONVERT_DEFAULT")


def _check_layout(lay: TaskLayout, routing) -> None:
    """EACH routes the token from a split router's logits, or reads a routing made elsewhere."""
    if lay.route_each and routing is None and lay.split <= 1:
        raise InputError("tiles['router']['EACH']=1 without a routing given needs a split router (SPLIT > 1): "
                         f"got {lay.split} router range(s)")
    if lay.route_each and routing is not None and lay.split > 1:  # no logits to read: the routing is given
        raise InputError("a routing given takes no router logits: tiles['router']['SPLIT'] must be 1 "
                         "(megakernel_config(..., routing_given=True) sets it)")


def _buffers(x, config, lay: TaskLayout, bm: int, fp8: str | None, routing, shared: bool, sgw) -> dict:
    """The kernel's metadata and intermediate buffers on x's device (None where the layer has no use)."""
    T, H = x.shape
    E, K, I, Is = config.num_experts, config.top_k, config.intermediate_size, config.shared_intermediate_size
    f32, i32, e4m3 = torch.float32, torch.int32, torch.float8_e4m3fn
    G, split, P_max = lay.topk_groups, lay.split, lay.b_max * bm
    fp8_a = fp8 == "weights+act"
    adt = e4m3 if fp8_a else x.dtype
    xq_on = fp8_a and not config.weight_on_input

    def new(*shape, dtype=i32, when=True):
        return torch.empty(shape, device=x.device, dtype=dtype) if when else None

    b = dict(topk_idx=new(T, K), topk_w=new(T, K, dtype=f32))
    if routing is not None:
        b["topk_idx"], b["topk_w"] = routing
    b.update(
        sgate=new(T, dtype=f32, when=sgw is not None), part=new(split, T, E, dtype=f32, when=split > 1),
        sg_part=new(split, T, dtype=f32, when=split > 1 and sgw is not None), hist=new(G, E), chunk_base=new(G, E),
        counts=new(E), padded_off=new(E + 1), padded_token=new(P_max), padded_pair=new(P_max),
        block_expert=new(lay.b_max), pair_dest=new(T * K), act=new(P_max, I, dtype=adt),
        act_s=new(T, Is, dtype=adt, when=shared),
        act_sc=new(P_max, triton.cdiv(I, FP8_BLOCK), dtype=f32, when=fp8_a),
        act_s_sc=new(T, triton.cdiv(Is, FP8_BLOCK), dtype=f32, when=fp8_a and shared),
        xq=new(T, H, dtype=e4m3, when=xq_on), xs=new(T, triton.cdiv(H, FP8_BLOCK), dtype=f32, when=xq_on),
        pairs=new(T * (K + int(shared)), H, dtype=x.dtype),
    )
    return b


def _constexprs(x, weights, config, mk: dict, lay: TaskLayout, *, fp8, on_gpu: bool, record: bool, trace,
                given: bool, tma: bool) -> dict:
    """The kernel's constexpr groups (TILE_FIELDS, ROUTE_FIELDS, ...), warps and stages."""
    T, H = x.shape
    E, K, I, Is = config.num_experts, config.top_k, config.intermediate_size, config.shared_intermediate_size
    shared = config.num_shared_experts > 0
    tiles = mk["tiles"]
    r, g1, g2, sh, cb = tiles["router"], tiles["gemm1"], tiles["gemm2"], tiles["shared"], tiles["combine"]
    G, split = lay.topk_groups, lay.split
    r_tt = lay.topk_t  # tokens per top-k task
    block_e = max(16, triton.next_power_of_2(E))
    al = align_blocks(E, g1["BLOCK_M"], lay.b_max)
    sgw = weights.shared_gate
    fp8_a = fp8 == "weights+act"
    tile = dict(N1=lay.n1, N2=lay.n2, NS1=max(lay.ns1, 1), NS2=max(lay.ns2, 1), NCH=triton.cdiv(H, cb["BLOCK_H"]),
                BM=g1["BLOCK_M"], BN1=g1["BLOCK_N"], BK1=g1["BLOCK_K"], BN2=g2["BLOCK_N"], BK2=g2["BLOCK_K"],
                S_BM=sh["BLOCK_M"], S_BN1=sh["BLOCK_N1"], S_BN2=sh["BLOCK_N2"], S_BK=sh["BLOCK_K"],
                C_BT=cb["BLOCK_T"], C_BH=cb["BLOCK_H"], GROUP_M=tiles["order"]["GROUP_M"],
                EVEN_K1=H % g1["BLOCK_K"] == 0, EVEN_K2=I % g2["BLOCK_K"] == 0, S_EVEN_K1=H % sh["BLOCK_K"] == 0,
                S_EVEN_K2=(Is % sh["BLOCK_K"] == 0) if shared else True)
    route = dict(SPLIT=split if split > 1 else 0, ROUTER=ROUTER_CODES[config.router], K=K,
                 NORM=bool(config.norm_topk_prob), N_GROUP=config.n_group, TOPK_GROUP=config.topk_group,
                 PER_GROUP=E // config.n_group, MASK_NEG_INF=config.group_mask == "neg_inf",
                 HAS_RB=weights.router_bias is not None, HAS_SB=weights.score_bias is not None, HAS_SG=sgw is not None,
                 R_BT=r["BLOCK_T"], R_TT=r_tt, R_BE=block_e, R_BH=r["BLOCK_H"], R_BK=max(2, triton.next_power_of_2(K)),
                 R_BG=max(2, triton.next_power_of_2(config.n_group)), BITONIC=mkc.bitonic_topk_fits(r_tt, block_e))
    align = dict(FUSED=G == 1, BLOCK_B=al["BLOCK_B"], BLOCK_PAD=al["BLOCK_PAD"], BLOCK_C=scan_block(G), GIVEN=given,
                 ROUTE_EACH=lay.route_each, ALIGN_EACH=lay.align_each,
                 A_BP=triton.next_power_of_2(max(T * K, 16)) if lay.align_each else 16)
    expert = dict(ACT=ACT_CODES[config.activation], HAS_GUB=weights.gate_up_bias is not None,
                  HAS_DNB=weights.down_bias is not None, SCALE_INPUT=config.weight_on_input,
                  G2_SCALE=not config.weight_on_input, SHARED=shared, KS=K + int(shared), IEEE=x.dtype == torch.float32)
    fp8s = dict(FP8=fp8 is not None, FP8_A=fp8_a, CVT=fp8_convert_code(on_gpu) if fp8 == "weights" else 0,
                XQ=fp8_a and not config.weight_on_input, TMA_W=tma)
    tools = dict(RECORD=record, TRACE=trace is not None)
    groups = dict(zip(CONSTEXPR_GROUPS, (tile, route, align, expert, fp8s, tools)))
    assert all(tuple(d) == CONSTEXPR_GROUPS[n] for n, d in groups.items()), "a constexpr group out of its order"
    return {**{n: tuple(d.values()) for n, d in groups.items()}, "num_warps": mk["num_warps"],
            "num_stages": mk["num_stages"]}


def constexpr_values(kwargs: dict) -> dict:
    """The constexprs of a launch's kwargs (``build_launch``) by name, its groups unpacked."""
    return {f: v for n, fields in CONSTEXPR_GROUPS.items() for f, v in zip(fields, kwargs[n])}


def build_launch(x: torch.Tensor, weights, config, mk: dict, *, record: bool = False, out: torch.Tensor | None = None,
                 trace: torch.Tensor | None = None, nprog: int | None = None, sync: torch.Tensor | None = None,
                 routing: tuple | None = None, fp8: str | None = None, gpu: bool | None = None):
    """The megakernel's launch as data: (grid, args, kwargs, y, stats), buffers on x's device; the
    arguments are ``megakernel_forward``'s (``gpu=True``: the GPU's constexprs without a GPU)."""
    T, H = x.shape
    E = config.num_experts
    shared = config.num_shared_experts > 0
    dev = x.device
    on_gpu = dev.type == "cuda" if gpu is None else gpu
    y = torch.empty((T, H), device=dev, dtype=x.dtype) if out is None else out
    tiles = mk["tiles"]
    sgw = weights.shared_gate
    rw, gu, dn = weights.router_weight, weights.gate_up, weights.down
    gub, dnb = weights.gate_up_bias, weights.down_bias
    tma_w = weight_descriptors(mk, gu, dn, tiles["gemm1"], tiles["gemm2"], fp8=fp8)
    lay, nprog, kwargs = _static_launch(x, weights, config, mk, fp8=fp8, on_gpu=on_gpu, record=record, trace=trace,
                                        routing=routing, nprog=nprog, tma=tma_w[0] is not None)

    def make():
        return dict(_buffers(x, config, lay, tiles["gemm1"]["BLOCK_M"], fp8, None, shared, sgw), mk=mk)

    kept = type(mk) is KeptConfig  # the workspace holds mk, so its id names it while kept
    b = workspace.get(("megakernel", id(mk), config, T, x.dtype, fp8, sgw is not None), dev, make) if kept else make()
    if routing is not None:
        b = dict(b, topk_idx=routing[0], topk_w=routing[1])
    if trace is not None:
        need = trace_rows(config, T, mk, nprog)[0]
        if trace.dtype != torch.int64 or trace.numel() < 3 * need:
            raise ValueError(f"megakernel trace: an int64 buffer of at least ({need}, 3) is needed (trace_rows), "
                             f"got {tuple(trace.shape)} {trace.dtype}")
    sync = sync_buffer(dev, lay.sync_words) if sync is None else sync
    stats = torch.zeros(len(KINDS) + 2 * E, device=dev, dtype=torch.int32) if record else None
    scales = (weights.gate_up_scale_inv, weights.down_scale_inv) if fp8 else (None, None)
    s_scales = (weights.shared_gate_up_scale_inv, weights.shared_down_scale_inv) if fp8 and shared else (None, None)

    def st(t, d=0):  # a stride, 0 for an absent tensor
        return 0 if t is None else t.stride(d)

    xq_on = b["xq"] is not None
    args = (
        x, rw, weights.router_bias, weights.score_bias, sgw, gu, gub, dn, dnb, weights.shared_gate_up,
        weights.shared_down,
        b["part"], b["sg_part"], b["topk_idx"], b["topk_w"], b["sgate"], b["hist"], b["chunk_base"],
        b["counts"], b["padded_off"], b["block_expert"], b["padded_token"], b["padded_pair"], b["pair_dest"],
        b["act"], b["act_s"], b["pairs"], y, sync, layout_buffer(dev, layout_words(lay, nprog)), stats, trace, *tma_w,
        *scales, *s_scales, b["act_sc"], b["act_s_sc"], st(scales[0]), st(scales[0], 1), st(scales[1]),
        st(scales[1], 1), st(s_scales[0]), st(s_scales[1]), st(b["act_sc"]), st(b["act_s_sc"]),
        b["xq"] if xq_on else x, b["xs"] if xq_on else x, st(b["xs"]),  # (x: placeholders, unread)
        T, H, E, config.intermediate_size, config.shared_intermediate_size, x.stride(0), st(rw), gu.stride(0),
        gu.stride(1), st(gub), dn.stride(0), dn.stride(1), st(dnb),
        float(config.routed_scaling_factor), float(config.swiglu_alpha), float(config.swiglu_limit), lay.h_per,
    )
    return (nprog,), args, kwargs, y, stats


_statics: dict = {}  # _static_launch's key -> (mk, its result)


def _static_launch(x, weights, config, mk: dict, *, fp8, on_gpu: bool, record: bool, trace, routing, nprog,
                   tma: bool) -> tuple[TaskLayout, int, dict]:
    """(task layout, programs, constexpr kwargs) of a launch: everything but the tensors, checked
    and made once per (config, T, dtype, device, mk, options, which optional weights are given)
    where mk is a ``KeptConfig``, else each call."""
    given = tuple(getattr(weights, f, None) is not None
                  for f in ("router_bias", "score_bias", "shared_gate", "gate_up_bias", "down_bias"))
    key = (id(mk), config, x.shape[0], x.dtype, x.device, fp8, on_gpu, record, trace is not None,
           routing is not None, nprog, tma, given)
    kept = type(mk) is KeptConfig
    hit = _statics.get(key) if kept else None
    if hit is not None and hit[0] is mk:
        return hit[1]
    T, tiles = x.shape[0], mk["tiles"]
    lay = task_layout(config, T, tiles)
    _check_layout(lay, routing)
    check_fp8_tiles(mk, fp8)
    n = num_programs(x.device, lay, mk["occupancy"]) if nprog is None else nprog
    kwargs = _constexprs(x, weights, config, mk, lay, fp8=fp8, on_gpu=on_gpu, record=record, trace=trace,
                         given=routing is not None, tma=tma)
    if kept:
        if len(_statics) >= 1024:
            _statics.clear()
        _statics[key] = (mk, (lay, n, kwargs))
    return lay, n, kwargs


def weight_descriptors(mk: dict, gate_up, down, g1: dict, g2: dict, *, fp8: str | None) -> tuple:
    """(gate_up descriptor, down descriptor) for config "tma_weights", else (None, None): gate_up
    as (E*2I, H) in (BLOCK_N1, BLOCK_K1) blocks, down as (E*H, I) in (BLOCK_N2, BLOCK_K2) blocks."""
    if not mk.get("tma_weights"):
        return None, None
    if not (gate_up.is_contiguous() and down.is_contiguous()
            and (gate_up.shape[-1] * gate_up.element_size()) % 16 == 0
            and (down.shape[-1] * down.element_size()) % 16 == 0):
        return None, None
    return (_descriptor(gate_up, gate_up.shape[0] * gate_up.shape[1], g1["BLOCK_N"], g1["BLOCK_K"]),
            _descriptor(down, down.shape[0] * down.shape[1], g2["BLOCK_N"], g2["BLOCK_K"]))


def megakernel_experts(x, topk_idx, topk_w, gate_up, down, gate_up_bias, down_bias, activation: str, alpha: float,
                       limit: float) -> torch.Tensor:
    """The routed experts for a routing made elsewhere, in one launch (moe.moe_experts checks the
    inputs). topk_idx (T, K) int32, topk_w (T, K) fp32; gate_up (E, 2I, H), down (E, H, I) -> y (T, H)."""
    cfg, w = experts_layer(gate_up, down, gate_up_bias, down_bias, topk_idx.shape[1], activation, alpha, limit)
    return megakernel_forward(x, w, cfg, routing=(topk_idx, topk_w))


def experts_layer(gate_up, down, gate_up_bias, down_bias, K: int, activation: str, alpha: float, limit: float):
    """(config, weights) of the routed experts alone, as ``megakernel_forward`` takes them with a
    routing given: no router, no shared MLP."""
    from types import SimpleNamespace

    E, I2, H = gate_up.shape
    cfg = _experts_config(H, I2 // 2, E, K, activation, float(alpha), float(limit))
    w = SimpleNamespace(router_weight=None, router_bias=None, score_bias=None, shared_gate=None, gate_up=gate_up,
                        gate_up_bias=gate_up_bias, down=down, down_bias=down_bias, shared_gate_up=None,
                        shared_down=None)
    return cfg, w


@lru_cache(maxsize=256)
def _experts_config(H: int, I: int, E: int, K: int, activation: str, alpha: float, limit: float) -> MoEConfig:
    """The MoEConfig of routed experts alone (megakernel_experts), made once per shape."""
    return MoEConfig(hidden_size=H, intermediate_size=I, num_experts=E, top_k=K, activation=activation,
                     swiglu_alpha=alpha, swiglu_limit=limit, name="moe_experts")


class KeptConfig(dict):
    """A megakernel config made by ``default_config`` and never changed after: launch data and
    workspaces are kept per such config (a config given by a caller may change between calls, so
    its launch data is made afresh each call)."""


@lru_cache(maxsize=1024)
def default_config(config, T: int, dtype: torch.dtype, device: torch.device, routing_given: bool,
                   fp8: str | None) -> KeptConfig:
    """``megakernel_config``'s answer, made once per call shape (a ``KeptConfig``: not to be changed)."""
    return KeptConfig(megakernel_config(config, T, dtype, device, routing_given=routing_given, fp8=fp8))


def megakernel_forward(x: torch.Tensor, weights, config, *, mk: dict | None = None, record: bool = False,
                       out: torch.Tensor | None = None, trace: torch.Tensor | None = None,
                       routing: tuple | None = None, nprog: int | None = None, fp8: str | None = None):
    """y (T, H) in x's dtype: the layer in one launch (inputs checked by moe.py).

    ``mk``: a megakernel config instead of the default. ``record``: also return the tasks run
    ({kind: count, "gemm1_per_expert", "gemm2_per_expert"}) and the kernel's resources. ``out``: y's
    buffer. ``trace`` (GPU only): an int64 (trace_rows(...)[0], 3) tensor of task stamps.
    ``routing``: (topk_idx (T, K) int32, topk_w (T, K) fp32) made elsewhere. ``nprog``: programs
    instead of SMs x occupancy. ``fp8``: None, "weights" or "weights+act"."""
    T = x.shape[0]
    if T == 0:
        y = torch.empty(tuple(x.shape), device=x.device, dtype=x.dtype) if out is None else out
        return (y, {k: 0 for k in KINDS}) if record else y
    mk = mk or default_config(config, T, x.dtype, x.device, routing is not None, fp8)
    grid, args, kwargs, y, stats = build_launch(x, weights, config, mk, record=record, out=out, trace=trace,
                                                routing=routing, nprog=nprog, fp8=fp8)
    kern = _megakernel[grid](*args, **kwargs)
    if not record:
        return y
    s = stats.cpu()
    E = config.num_experts
    nprog = grid[0]
    ran = {k: int(s[i]) for i, k in enumerate(KINDS)}
    nk = len(KINDS)
    ran["gemm1_per_expert"] = s[nk:nk + E].tolist()
    ran["gemm2_per_expert"] = s[nk + E:nk + 2 * E].tolist()
    ran["programs"] = nprog
    for a in ("n_regs", "n_spills"):
        ran[a] = getattr(kern, a, None)
    ran["shared_bytes"] = getattr(getattr(kern, "metadata", None), "shared", None)
    return y, ran


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
