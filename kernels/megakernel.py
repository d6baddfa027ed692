"""The whole MoE layer in one persistent Triton launch: the megakernel.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width, C router
chunks, B routed row blocks (B_max their bound), KS = K (+1 with a shared MLP), P programs.

One launch of P programs (P = SMs x occupancy on a GPU) runs every task of
``reference.tiles.task_plan`` in ticket order: each program takes the next ticket from a global
counter, runs that task, and takes another, until the tickets run out. The task kinds, what they
wait for and what they signal are in reference/tiles.py; this kernel computes the same function
on the device (the fixed part from ``task_layout``, passed in; the routed row blocks from the
counts it computes itself), so the simulator's cost model reads exactly the order that runs.

Synchronization: int32 counters in one sync buffer (``SYNC_WORDS`` then logits[C], g1[B_max],
shared1[Ms]). A task that finishes runs a CTA barrier, then one release atomic add on its
counter; a task that waits spins on an acquire atomic read of its counter, then a CTA barrier.
A task only waits on counters signalled by lower tickets, and a program holding a ticket is
running, so by induction every wait ends: any P works (resident or not), and one program taking
every ticket in order finishes the layer, which is how the Triton interpreter runs it in CI.
The last program to leave (an exit counter) zeroes the sync words, so the next call, a CUDA-graph
replay included, starts clean with no host or memset op.

The tile code is the multi-launch path's (grouped_gemm._gemm1_tile / _gemm2_tile / _combine_tile,
routing._route_block / _router_partial, align._scan / _scatter_chunk / _finish_offsets), so both
backends compute the same numbers; the combine sums the KS rows of a token in a fixed order, so
the output is bitwise identical from run to run.

FP8 (``fp8="weights"`` / ``"weights+act"``): the GEMM tasks run fp8_gemm.py's tiles (e4m3 weights,
block scales in the fp32 accumulation; with FP8 activations GEMM 1 quantizes x and h per 128
columns and GEMM 2 reads the codes), so the FP8 megakernel computes what the FP8 multi-launch
path computes; its tiles take BLOCK_K = 128 (and 128-column GEMM 1 tiles with FP8 activations).

Differences from the multi-launch path, by design:
- no launch boundaries: shared-expert tiles run while the router and the align still work, GEMM 2
  tiles of a row block start as soon as that block's GEMM 1 tiles are done;
- tasks only for routed rows that exist (from the device's counts), and at T <= 64 one row block
  per expert (BLOCK_M = 64 covers every row an expert can get), so concentrated routing reads each
  expert's weights once;
- optionally (tiles["gemm1"]["SLICE"], configs.apply_slices; off: H200 runs AA and AB measured it
  slower) expert_slice tasks in place of the GEMM 1 and GEMM 2 tiles (slice_tile.py): no task waits
  for another GEMM task, the partial sums of the slices go to fp32 slabs that the combine adds up;
  config "slice_tma" reads each slice through TMA descriptors as a box of exactly SLICE rows
  (slice_descriptors; runs AE: no faster than by pointers).

Other layouts, off by default, each a switch of the task plan (reference/tiles.py TILE_SWITCHES) that
the plan, this kernel and the cost model read alike:
- tiles["combine"]["IN_G2"] (variant "fcomb"; routed experts only): no combine tasks; the GEMM 2
  tile that completes a column block (a counter per block at layout.off_comb) sums that block's
  slots for every token, in slot order (run AF: a shorter traced span, no faster call);
- tiles["router"]["EACH"] (variant "reach"; one token, a split router): every GEMM 1 task routes the
  token itself from the logits' partials (routing._route_block, align._align_one, the values the
  top-k task stores, stored again) instead of waiting for the top-k task: the default at T = 1 up to
  configs.ROUTE_EACH_MAX_EXPERTS experts since H200 run AI (1-3% faster on four presets).

- tiles["router"]["ALIGN_EACH"] (2 <= T <= configs.ALIGN_EACH_MAX_T with more than one top-k task;
  variant "noaeach" turns it off): no align_scan and align_scatter tasks; each program's first task
  past the static ones waits for every top-k task and reads the layout from their histograms
  (align._hist_layout, kept for its later tasks), and each GEMM 1 task places its row block's rows
  from the routing (align._place_block: its expert's pairs ranked in token order), so GEMM 1 starts
  after the top-k tasks, not after a scan and a scatter (H200 run AL's trace, Qwen3-30B-A3B T = 64
  concentrated: those took 8.5 us).

``trace`` (GPU only, ``trace_rows``): %globaltimer stamps of every task, every program's first
ticket and exit, and the first top-k task's phases, for benchmarks/megakernel_trace.py.
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from ..reference import InputError
from ..reference.sizes import FP8_BLOCK
from ..reference.tiles import KINDS, SYNC_STRIDE, SYNC_WORDS, TaskLayout, scan_block, task_layout, topk_tokens
from . import configs as cfgs
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
from .configs import FP8_CONVERT_DEFAULT
from .fp8_gemm import _gemm1_fp8_tile, _gemm1_fp8_xq_tile, _gemm2_fp8_tile, convert_code
from .fp8_tma_tiles import _gemm1_fp8_tmaw_tile, _gemm2_fp8_tmaw_tile, _quantize_x_rows
from .grouped_gemm import (
    ACT_CODES,
    _act_epilogue,
    _combine_tile,
    _descriptor,
    _gemm1_acc,
    _gemm1_tile,
    _gemm1_tma_tile,
    _gemm2_acc,
    _gemm2_epilogue,
    _gemm2_tile,
    _gemm2_tmaw_tile,
    _tile_ids,
)
from .prefetch import _prefetch_rows
from .prefetch import available as prefetch_available
from .prefetch import rows_ok as prefetch_rows_ok
from .routing import ROUTER_CODES, _route_block, _router_partial
from .slice_tile import _combine_slabs_tile, _expert_slice_tile
from .stream_k import _arrive, _piece_k, _seg_bounds, _seg_tiles, _slot, _store_piece, _sum_pieces

W_TICKET, W_EXITED, W_TOPK, W_SCAN, W_SCATTER, W_G2 = (SYNC_WORDS.index(w) for w in
                                                       ("ticket", "exited", "topk", "scan", "scatter", "g2"))
KB = tl.constexpr(FP8_BLOCK)  # values per FP8 scale block (weights: KB x KB; activations: KB per row)
# each kind's code (its index in KINDS), for the record
K_LOGITS, K_TOPK, K_SCAN, K_SCATTER, K_SH1, K_G1, K_SLICE, K_SH2, K_G2, K_COMB = (
    tl.constexpr(KINDS.index(k)) for k in ("router_logits", "router_topk", "align_scan", "align_scatter",
                                           "shared_gemm1", "gemm1", "expert_slice", "shared_gemm2", "gemm2",
                                           "combine"))
# the record's words: a count per kind, then GEMM 1 and GEMM 2 tiles finished per expert
NK = tl.constexpr(len(KINDS))
R_G1, R_G2 = tl.constexpr(len(KINDS)), tl.constexpr(len(KINDS) + 1)


@triton.jit
def _pause(BACKOFF: tl.constexpr):
    """Sleep about BACKOFF ns between polls (GPU only: inline PTX; 0 = spin)."""
    if BACKOFF > 0:
        tl.inline_asm_elementwise(f"nanosleep.u32 {BACKOFF}; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _wait(ptr, target, BACKOFF: tl.constexpr):
    """Spin until the counter at ptr reaches target (acquire), then line the CTA up behind it."""
    v = tl.atomic_add(ptr, 0, sem="acquire")
    while v < target:
        _pause(BACKOFF)
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
    """Tests only: KIND < NK counts a task of that kind (its KINDS code); R_G1 / R_G2 a GEMM 1 /
    GEMM 2 tile of expert e finished (at NK + e / NK + E + e)."""
    if RECORD:
        if KIND < NK:
            tl.atomic_add(stats_ptr + KIND, 1)
        if KIND == R_G1:
            tl.atomic_add(stats_ptr + NK + e, 1)
        if KIND == R_G2:
            tl.atomic_add(stats_ptr + NK + E + e, 1)


@triton.jit(do_not_specialize=["T", "G", "B_MAX", "NPROG", "MAX_TASKS", "S0", "F_TOPK", "F_SCAN", "F_SCATTER",
                               "F_SH1", "MS", "OFF_G1", "OFF_SH1", "SYNC_N", "OFF_T1", "OFF_T2"])
def _megakernel(
    # inputs and weights
    x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, gu_ptr, gub_ptr, dn_ptr, dnb_ptr, sgu_ptr, sdn_ptr,
    # router and align metadata
    part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr, sgate_ptr, hist_ptr, chunk_base_ptr,
    counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr,
    # intermediates and output
    act_ptr, act_s_ptr, pairs_ptr, y_ptr, sync_ptr, stats_ptr, trace_ptr, ws1_ptr, ws2_ptr,
    # TMA descriptors of the routed weights (TMA_W): gate_up as (E*2I, H), down as (E*H, I)
    gu_desc, dn_desc,
    # FP8 (FP8: e4m3 weights): block scales of the weights, scales of the e4m3 activations (FP8_A)
    gus_ptr, dns_ptr, sgus_ptr, sdns_ptr, act_sc_ptr, act_s_sc_ptr, stride_guse, stride_gusn, stride_dnse,
    stride_dnsn, stride_sgusn, stride_sdnsn, stride_acs, stride_assc,
    # XQ: x's e4m3 codes (T, H) and scales (T, ceil(H / 128)), written by the router tasks
    xq_ptr, xs_ptr, stride_xs,
    # sizes and strides
    T, H, E, I, Is, G, B_MAX, stride_xt, stride_rw, stride_gue, stride_gun, stride_gub, stride_dne, stride_dnn,
    stride_dnb, scaling, alpha, limit, H_PER,
    # the task layout (reference.tiles.task_layout)
    NPROG, MAX_TASKS, S0, F_TOPK, F_SCAN, F_SCATTER, F_SH1, MS, OFF_LOGITS, OFF_G1, OFF_SH1, SYNC_N, OFF_T1, OFF_T2,
    OFF_COMB,
    N1: tl.constexpr, N2: tl.constexpr, NS1: tl.constexpr, NS2: tl.constexpr, NCH: tl.constexpr,
    # router
    SPLIT: tl.constexpr, ROUTER: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, N_GROUP: tl.constexpr,
    TOPK_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, MASK_NEG_INF: tl.constexpr, HAS_RB: tl.constexpr,
    HAS_SB: tl.constexpr, HAS_SG: tl.constexpr, IEEE: tl.constexpr, R_BT: tl.constexpr, R_TT: tl.constexpr,
    R_BE: tl.constexpr,
    R_BH: tl.constexpr, R_BK: tl.constexpr, R_BG: tl.constexpr, FUSED: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    # experts
    ACT: tl.constexpr, HAS_GUB: tl.constexpr, HAS_DNB: tl.constexpr, SCALE_INPUT: tl.constexpr, G2_SCALE: tl.constexpr,
    SHARED: tl.constexpr, KS: tl.constexpr, BM: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr,
    BN2: tl.constexpr, BK2: tl.constexpr, S_BM: tl.constexpr, S_BN1: tl.constexpr, S_BN2: tl.constexpr,
    S_BK: tl.constexpr, EVEN_K1: tl.constexpr, EVEN_K2: tl.constexpr, S_EVEN_K1: tl.constexpr,
    S_EVEN_K2: tl.constexpr, C_BT: tl.constexpr, C_BH: tl.constexpr, GROUP_M: tl.constexpr,
    RECORD: tl.constexpr, TRACE: tl.constexpr, SW: tl.constexpr, BACKOFF: tl.constexpr, GIVEN: tl.constexpr,
    # take the next ticket as a task starts (config "next_ticket"; off by default: run E measured it slower)
    NEXT: tl.constexpr,
    # stream-K GEMM segments, one per program (tiles["order"]["STREAM_K"]; kernels/stream_k.py)
    SK: tl.constexpr,
    # FP8 weights (fp8_gemm.py's tiles; BLOCK_K = 128), FP8_A: activations too; CVT: how weight-only
    # FP8 converts the codes (config "fp8_convert": 0 Triton's cast, 1 / 2 bit moves, fp8_gemm._e4m3_to),
    # SPF: the weight (and activation) scales loaded a K step ahead (config "fp8_scale_prefetch")
    FP8: tl.constexpr, FP8_A: tl.constexpr, CVT: tl.constexpr, SPF: tl.constexpr,
    # FP8_A with TMA_W: the GEMM tasks' products as weights x rows (config "fp8_swap_ab";
    # fp8_tma_tiles._fp8a_swapped: an e4m3 wgmma where a 16-row product would be an fp16 mma.sync);
    # 2: its sums promoted to fp32 every 32 products (config "fp8_precise_acc")
    F8SWAP: tl.constexpr,
    # FP8_A (not SCALE_INPUT): x quantized once, by the router tasks (config "fp8_x_once";
    # fp8_tma_tiles._quantize_x_rows), not in every K step of every GEMM 1 task
    XQ: tl.constexpr,
    # a GEMM 2 task that must wait for its GEMM 1 prefetches its weight tile into L2 first (config
    # "prefetch_wait"; prefetch.py), NCHUNK threads per program
    PF_WAIT: tl.constexpr, NCHUNK: tl.constexpr,
    # top-k by ranking every expert at once (config "topk_rank"), or by a bitonic top-k (config
    # "topk_bitonic"; routing._route_block)
    RANK: tl.constexpr, BITONIC: tl.constexpr,
    # the routed GEMM tasks' weight tiles through TMA descriptors (config "tma_weights"; whole tiles,
    # e4m3 ones with FP8: fp8_tma_tiles.py): bulk copies, not a program's cp.async stream
    TMA_W: tl.constexpr,
    # a batch of one token aligns from its picks' ranks (config "align_one"; align._align_one)
    ALIGN1: tl.constexpr,
    # expert_slice tasks of SLICE columns of I (tiles["gemm1"]["SLICE"]; 0: GEMM 1 and GEMM 2 tiles;
    # slice_tile.py): N1 slices, no GEMM 2 task, the pair buffer fp32 slabs (C_SLABS of them, the
    # last C_KS0 slots in slab 0 only, the routed ones summed as one tile of C_BR rows); EVEN_S: I % SLICE == 0
    SLICE: tl.constexpr, EVEN_S: tl.constexpr, EVEN_N2: tl.constexpr, DOWN_T: tl.constexpr, C_SLABS: tl.constexpr, C_KS0: tl.constexpr, C_BR: tl.constexpr,
    TMA_S: tl.constexpr, C_IN_G2: tl.constexpr, ROUTE_EACH: tl.constexpr,
    # no scan and scatter tasks: every dynamic task reads the layout from the top-k tasks' histograms,
    # each GEMM 1 task places its block's rows from the routing's T*K pairs (A_BP lanes; tiles["router"]["ALIGN_EACH"])
    ALIGN_EACH: tl.constexpr, A_BP: tl.constexpr,
):
    pid = tl.program_id(0)
    p_begin = _now(TRACE)
    if ALIGN_EACH:  # the layout from the histograms, read by this program's first dynamic task and kept
        a_have = pid * 0
        a_nb = pid * 0
        a_cnt = tl.zeros((R_BE,), tl.int32)
        a_start = tl.zeros((R_BE,), tl.int32)
        a_incl = tl.zeros((R_BE,), tl.int32)
        a_emask = tl.arange(0, R_BE) < E
    t = tl.atomic_add(sync_ptr + SW * 0, 1, sem="relaxed")  # W_TICKET
    while t < MAX_TASKS:
        stop = 0
        t_begin = _now(TRACE)
        if NEXT:  # take the next ticket now: the atomic's round trip overlaps this task
            t_next = tl.atomic_add(sync_ptr + SW * 0, 1, sem="relaxed")
        else:
            t_next = t
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
                    _wait(sync_ptr + OFF_LOGITS + (g * R_TT) // R_BT, SPLIT, BACKOFF)
                t_seen = _now(TRACE)  # TRACE: the first top-k task's phases (trace_rows)
                if GIVEN:  # a routing made elsewhere (moe_experts): read it and count
                    top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _given_block(
                        topk_idx_ptr, g, T, E, K, R_TT, R_BE, R_BK)
                else:
                    top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _route_block(
                        x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr,
                        sgate_ptr, g, T, H, E, stride_xt, stride_rw, scaling, SPLIT, ROUTER, K, NORM, N_GROUP,
                        TOPK_GROUP, PER_GROUP, MASK_NEG_INF, HAS_RB, HAS_SB, HAS_SG, IEEE, R_TT, R_BE, R_BH, R_BK,
                        R_BG, RANK, BITONIC)
                if XQ and SPLIT == 0:  # (no logits tasks) x's FP8 groups of this task's tokens
                    _quantize_x_rows(x_ptr, xq_ptr, xs_ptr, g * R_TT, T, 0, H, H, stride_xt, H, stride_xs, KB, R_TT)
                t_routed = _now(TRACE)
                if FUSED:  # one chunk holds every token: align here, then the layout is known
                    if ALIGN1:  # one token: from its picks' ranks (align._align_one)
                        _align_one(tl.reshape(top_idx, (R_BK,)), tl.reshape(out_mask, (R_BK,)), cnt, offs_e, e_mask,
                                   E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                                   padded_pair_ptr, pair_dest_ptr, BM, R_BK)
                    else:
                        start = _finish_offsets(cnt, offs_e, e_mask, E, B_MAX, counts_ptr, padded_off_ptr,
                                                block_expert_ptr, padded_token_ptr, padded_pair_ptr, BM, R_BE, BLOCK_B,
                                                BLOCK_PAD)
                        _scatter_block(tl.where(out_mask, top_idx, -1), offs_t, t_mask, start, offs_e,
                                       padded_token_ptr, padded_pair_ptr, pair_dest_ptr, K, R_TT, R_BE, R_BK)
                    _signal(sync_ptr + SW * 2)  # W_TOPK
                    tl.atomic_add(sync_ptr + SW * 3, 1, sem="release")  # W_SCAN
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
                _wait(sync_ptr + SW * 2, G, BACKOFF)
                _scan(hist_ptr, chunk_base_ptr, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                      padded_pair_ptr, G, E, B_MAX, BM, R_BE, BLOCK_C, BLOCK_B, BLOCK_PAD)
                _signal(sync_ptr + SW * 3)
                _record(stats_ptr, K_SCAN, 0, E, RECORD)
            elif t < F_SH1:  # align_scatter (c)
                _wait(sync_ptr + SW * 3, 1, BACKOFF)
                _scatter_chunk(topk_idx_ptr, chunk_base_ptr, padded_off_ptr, padded_token_ptr, padded_pair_ptr,
                               pair_dest_ptr, t - F_SCATTER, T, E, K, R_TT, R_BE, R_BK)
                _signal(sync_ptr + SW * 4)  # W_SCATTER
                _record(stats_ptr, K_SCATTER, 0, E, RECORD)
            else:  # shared_gemm1 (m, n)
                if SHARED:
                    m, n = _tile_ids(t - F_SH1, MS, NS1, GROUP_M)
                    if FP8:
                        _gemm1_fp8_tile(x_ptr, sgu_ptr, sgus_ptr, None, act_s_ptr, act_s_sc_ptr, None, None, None, m,
                                        n, t * 0, T, Is, H, stride_xt, 0, H, 0, stride_sgusn, 0, Is, stride_assc,
                                        alpha, limit, 0, False, False, True, FP8_A, IEEE, KB, S_BM, S_BN1, S_BK, CVT,
                                        SPF)
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
                    _wait(sync_ptr + SW * 2, G, BACKOFF)  # W_TOPK
                    a_cnt, a_start, a_incl, a_emask, a_nb = _hist_layout(hist_ptr, G, E, BM, R_BE, BLOCK_C)
                    a_have = pid * 0 + 1
                nb = a_nb
            else:
                _wait(sync_ptr + SW * 3, 1, BACKOFF)  # the layout (W_SCAN)
                nb = tl.load(padded_off_ptr + E) // BM
            kt1 = tl.cdiv(H, BK1)
            kt2 = tl.cdiv(I, BK2)
            if SLICE > 0:  # expert_slice tasks: no GEMM 2 tasks (reference.tiles.TaskLayout.segments)
                q1 = nb * N1
                q2 = nb * 0
            elif SK:  # stream-K: one segment per program (reference.tiles.num_segments)
                u1_all = (nb * N1 * kt1).to(tl.int64)
                u2_all = (nb * N2 * kt2).to(tl.int64)
                q1 = tl.maximum(1, tl.minimum(NPROG, u1_all))
                q2 = tl.maximum(1, tl.minimum(NPROG, u2_all))
            else:  # one task per tile: the tile code alone (no segment loop: H200 run J measured the
                # segment loop over single tiles 4-17% slower than this)
                q1 = nb * N1
                q2 = nb * N2
            b_sh2 = S0 + q1
            b_g2 = b_sh2 + MS * NS2
            b_comb = b_g2 + q2
            if ROUTE_EACH:  # tiles["router"]["EACH"]: a GEMM 1 task routes the token itself from the logits'
                # partials (the values the top-k task stores, stored again), not waiting for the top-k task
                if t < b_sh2:
                    _wait(sync_ptr + OFF_LOGITS, SPLIT, BACKOFF)
                    top_idx, out_mask, cnt, offs_t, t_mask, offs_e, e_mask = _route_block(
                        x_ptr, rw_ptr, rb_ptr, sb_ptr, sgw_ptr, part_ptr, sg_part_ptr, topk_idx_ptr, topk_w_ptr,
                        sgate_ptr, t * 0, T, H, E, stride_xt, stride_rw, scaling, SPLIT, ROUTER, K, NORM, N_GROUP,
                        TOPK_GROUP, PER_GROUP, MASK_NEG_INF, HAS_RB, HAS_SB, HAS_SG, IEEE, R_TT, R_BE, R_BH, R_BK,
                        R_BG, RANK, BITONIC)
                    _align_one(tl.reshape(top_idx, (R_BK,)), tl.reshape(out_mask, (R_BK,)), cnt, offs_e, e_mask,
                               E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr, padded_token_ptr,
                               padded_pair_ptr, pair_dest_ptr, BM, R_BK)
                    tl.debug_barrier()  # this program's layout stores before its loads of them
                else:
                    _wait(sync_ptr + SW * 3, 1, BACKOFF)  # the top-k task's layout (W_SCAN)
            if t < b_sh2:  # gemm1 segment q: its pieces of tiles (b, n); or expert_slice (b, c)
                if not FUSED and not ALIGN_EACH:
                    _wait(sync_ptr + SW * 4, G, BACKOFF)  # every group's rows are in place (FUSED: the layout wait did)
                if SLICE > 0:
                    b, c = _tile_ids(t - S0, nb, N1, GROUP_M)
                    e = tl.load(block_expert_ptr + b)
                    _expert_slice_tile(x_ptr, gu_ptr, gub_ptr, dn_ptr, dnb_ptr, pairs_ptr, padded_token_ptr,
                                       padded_pair_ptr, topk_w_ptr, b, c, e, T, H, I, stride_xt, stride_gue,
                                       stride_gun, stride_gub, stride_dne, stride_dnn, stride_dnb, alpha, limit, K, KS,
                                       ACT, HAS_GUB, HAS_DNB, SCALE_INPUT, G2_SCALE, EVEN_K1, EVEN_S, EVEN_N2, DOWN_T,
                                       TMA_S, gu_desc, dn_desc, IEEE, SLICE, BM, BN1, BK1, BN2)
                    _signal(sync_ptr + SW * 5)  # W_G2
                    _record(stats_ptr, R_G1, e, E, RECORD)
                    _record(stats_ptr, K_SLICE, 0, E, RECORD)
                elif SK:
                    q = t - S0
                    u0, u1 = _seg_bounds(q, q1, u1_all)
                    j_lo, j_hi = _seg_tiles(u0, u1, kt1)
                    for j in range(j_lo, j_hi):
                        b, n = _tile_ids(j, nb, N1, GROUP_M)
                        e = tl.load(block_expert_ptr + b)
                        k_lo, k_hi = _piece_k(u0, u1, j, kt1)
                        acc_g, acc_u, rows, row_mask, offs_n, offs_bn = _gemm1_acc(
                            x_ptr, gu_ptr, padded_token_ptr, b, n, e, k_lo, k_hi, T, I, H, stride_xt, stride_gue,
                            stride_gun, False, EVEN_K1, IEEE, BM, BN1, BK1)
                        done = (k_lo == 0) & (k_hi == kt1)
                        if not done:  # a piece: store it; the piece that completes the tile sums them all
                            slot = _slot(q, j, q1, u1_all, kt1)
                            _store_piece(ws1_ptr, slot, acc_g, BM, BN1, 2, 0)
                            _store_piece(ws1_ptr, slot, acc_u, BM, BN1, 2, 1)
                            done = _arrive(sync_ptr + OFF_T1, j, q1, u1_all, kt1)
                            if done:
                                acc_g = _sum_pieces(ws1_ptr, j, q1, u1_all, kt1, 0, BM, BN1, 2)
                                acc_u = _sum_pieces(ws1_ptr, j, q1, u1_all, kt1, 1, BM, BN1, 2)
                        if done:
                            _act_epilogue(acc_g, acc_u, rows, row_mask, e, offs_n, offs_bn, I, gub_ptr, stride_gub,
                                          padded_pair_ptr, topk_w_ptr, act_ptr, I, alpha, limit, ACT, HAS_GUB,
                                          SCALE_INPUT)
                            _signal(sync_ptr + OFF_G1 + b)
                            _record(stats_ptr, R_G1, e, E, RECORD)
                else:
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
                                             False, FP8_A, XQ, IEEE, KB, BM, BN1, BK1, CVT, F8SWAP)
                    elif FP8:
                        _gemm1_fp8_xq_tile(xq_ptr if XQ else x_ptr, xs_ptr, gu_ptr, gus_ptr, gub_ptr, act_ptr,
                                           act_sc_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr, b, n, e, T, I, H,
                                           H if XQ else stride_xt, stride_xs, stride_gue, stride_gun, stride_guse,
                                           stride_gusn, stride_gub, I, stride_acs, alpha, limit, ACT, HAS_GUB,
                                           SCALE_INPUT, False, FP8_A, XQ, IEEE, KB, BM, BN1, BK1, CVT, SPF)
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
                if SLICE == 0:
                    _record(stats_ptr, K_G1, 0, E, RECORD)
            elif t < b_g2:  # shared_gemm2 (m, n)
                if SHARED:
                    m, n = _tile_ids(t - b_sh2, MS, NS2, GROUP_M)
                    _wait(sync_ptr + OFF_SH1 + m, NS1, BACKOFF)
                    if HAS_SG:
                        _wait(sync_ptr + SW * 2, G, BACKOFF)  # the shared gate of every token
                    if FP8:
                        _gemm2_fp8_tile(act_s_ptr, act_s_sc_ptr, sdn_ptr, sdns_ptr, None, pairs_ptr, None, sgate_ptr,
                                        m, n, t * 0, t * 0, 0, tl.cdiv(Is, S_BK), T, H, Is, Is, stride_assc, 0, Is, 0,
                                        stride_sdnsn, 0, H, K, KS, False, HAS_SG, True, False, FP8_A, IEEE, 1, KB,
                                        S_BM, S_BN2, S_BK, CVT, SPF)
                    else:
                        _gemm2_tile(act_s_ptr, sdn_ptr, None, pairs_ptr, None, sgate_ptr, m, n, t * 0, t * 0, 0,
                                    tl.cdiv(Is, S_BK), T, H, Is, Is, 0, Is, 0, H, K, KS, False, HAS_SG, True, False,
                                    S_EVEN_K2, IEEE, 1, S_BM, S_BN2, S_BK)
                    _signal(sync_ptr + SW * 5)  # W_G2
                    _record(stats_ptr, K_SH2, 0, E, RECORD)
            elif t < b_comb:  # gemm2 segment q: its pieces of tiles (b, n)
                if SLICE == 0:  # (sliced: no GEMM 2 tasks)
                    if SK:
                        q = t - b_g2
                        u0, u1 = _seg_bounds(q, q2, u2_all)
                        j_lo, j_hi = _seg_tiles(u0, u1, kt2)
                        for j in range(j_lo, j_hi):
                            b, n = _tile_ids(j, nb, N2, GROUP_M)
                            e = tl.load(block_expert_ptr + b)
                            _wait(sync_ptr + OFF_G1 + b, N1, BACKOFF)
                            k_lo, k_hi = _piece_k(u0, u1, j, kt2)
                            acc, row_mask, tok, slot2, srow, offs_n, offs_bn = _gemm2_acc(
                                act_ptr, dn_ptr, padded_pair_ptr, b, n, e, k_lo, k_hi, T, H, I, I, stride_dne, stride_dnn,
                                K, False, EVEN_K2, IEEE, BM, BN2, BK2)
                            done = (k_lo == 0) & (k_hi == kt2)
                            if not done:
                                _store_piece(ws2_ptr, _slot(q, j, q2, u2_all, kt2), acc, BM, BN2, 1, 0)
                                done = _arrive(sync_ptr + OFF_T2, j, q2, u2_all, kt2)
                                if done:
                                    acc = _sum_pieces(ws2_ptr, j, q2, u2_all, kt2, 0, BM, BN2, 1)
                            if done:
                                _gemm2_epilogue(acc, row_mask, tok, slot2, srow, e, q * 0, offs_n, offs_bn, T, H, dnb_ptr,
                                                stride_dnb, topk_w_ptr, pairs_ptr, H, KS, HAS_DNB, G2_SCALE, False, 1)
                                _signal(sync_ptr + SW * 5)
                                _record(stats_ptr, R_G2, e, E, RECORD)
                    else:
                        b, n = _tile_ids(t - b_g2, nb, N2, GROUP_M)
                        if ALIGN_EACH:  # no task stores block_expert then: the expert from the layout
                            e = _expert_of_block(b, a_incl, a_emask, BM)
                        else:
                            e = tl.load(block_expert_ptr + b)
                        if PF_WAIT:  # about to wait for GEMM 1: the down weights do not depend on it
                            if tl.atomic_add(sync_ptr + OFF_G1 + b, 0, sem="relaxed") < N1:
                                _prefetch_rows(dn_ptr, e, n * BN2, tl.minimum(BN2, H - n * BN2), H, I, True, NCHUNK)
                        _wait(sync_ptr + OFF_G1 + b, N1, BACKOFF)
                        if FP8 and TMA_W:
                            _gemm2_fp8_tmaw_tile(act_ptr, act_sc_ptr, dn_desc, dns_ptr, dnb_ptr, pairs_ptr,
                                                 padded_pair_ptr, topk_w_ptr, b, n, e, T, H, I, I, stride_acs,
                                                 stride_dnse, stride_dnsn, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE,
                                                 False, False, FP8_A, IEEE, KB, BM, BN2, BK2, CVT, F8SWAP)
                        elif FP8:
                            _gemm2_fp8_tile(act_ptr, act_sc_ptr, dn_ptr, dns_ptr, dnb_ptr, pairs_ptr, padded_pair_ptr,
                                            topk_w_ptr, b, n, e, t * 0, 0, kt2, T, H, I, I, stride_acs, stride_dne,
                                            stride_dnn, stride_dnse, stride_dnsn, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE,
                                            False, False, FP8_A, IEEE, 1, KB, BM, BN2, BK2, CVT, SPF)
                        elif TMA_W:
                            _gemm2_tmaw_tile(act_ptr, dn_desc, dnb_ptr, pairs_ptr, padded_pair_ptr, topk_w_ptr, b, n, e,
                                             T, H, I, I, stride_dnb, H, K, KS, HAS_DNB, G2_SCALE, False, False, EVEN_K2,
                                             IEEE, BM, BN2, BK2)
                        else:
                            _gemm2_tile(act_ptr, dn_ptr, dnb_ptr, pairs_ptr, padded_pair_ptr, topk_w_ptr, b, n, e, t * 0,
                                        0, kt2, T, H, I, I, stride_dne, stride_dnn, stride_dnb, H, K, KS, HAS_DNB,
                                        G2_SCALE, False, False, EVEN_K2, IEEE, 1, BM, BN2, BK2)
                        if C_IN_G2:  # the last tile of column block n sums its slots for every token
                            tl.debug_barrier()  # every thread's pair rows stored
                            if tl.atomic_add(sync_ptr + OFF_COMB + n, 1, sem="acq_rel") == nb - 1:
                                tl.debug_barrier()
                                for tb in range(0, tl.cdiv(T, C_BT)):
                                    _combine_tile(pairs_ptr, y_ptr, tb, n, T, H, KS, 1, C_BT, BN2)
                        else:
                            _signal(sync_ptr + SW * 5)
                        _record(stats_ptr, R_G2, e, E, RECORD)
                    _record(stats_ptr, K_G2, 0, E, RECORD)
            elif t < b_comb + tl.cdiv(T, C_BT) * NCH * (1 - C_IN_G2):  # combine (token block, H block)
                if SLICE > 0:
                    _wait(sync_ptr + SW * 5, nb * N1 + MS * NS2, BACKOFF)
                else:
                    _wait(sync_ptr + SW * 5, nb * N2 + MS * NS2, BACKOFF)
                j = t - b_comb
                if SLICE > 0:
                    _combine_slabs_tile(pairs_ptr, y_ptr, j // NCH, j % NCH, T, H, KS, C_SLABS, C_KS0, C_BT, C_BR,
                                        C_BH)
                else:
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
        elif NEXT:
            t = t_next
        else:
            t = tl.atomic_add(sync_ptr + SW * 0, 1, sem="relaxed")
    # the last program out leaves the sync words zeroed for the next call
    tl.debug_barrier()
    if TRACE:  # (program, first ticket asked, last ticket done) of every program, past the tasks' rows
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid), pid.to(tl.int64))
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid) + 1, p_begin)
        tl.store(trace_ptr + 3 * (MAX_TASKS + pid) + 2, _now(TRACE))
    gone = tl.atomic_add(sync_ptr + SW * 1, 1, sem="acq_rel")  # W_EXITED
    if gone == NPROG - 1:
        offs = tl.arange(0, 1024)
        for i in range(0, SYNC_N, 1024):
            tl.store(sync_ptr + i + offs, 0, mask=i + offs < SYNC_N)


# --------------------------------------------------------------------------- host side
_SYNC: dict = {}


def trace_rows(config, T: int, mk: dict, nprog: int) -> tuple[int, int]:
    """(rows of the int64 (rows, 3) ``trace`` buffer, MAX_TASKS): row t < MAX_TASKS is ticket t's
    (program, start ns, end ns); row MAX_TASKS + p is program p's (p, first ticket asked, exit);
    row MAX_TASKS + NPROG the first top-k task's (logits seen, routed, aligned and signalled) ns."""
    mt = task_layout(config, T, mk["tiles"]).max_tasks_for(nprog)
    return mt + nprog + 1, mt


def sync_buffer(device: torch.device, words: int) -> torch.Tensor:
    """The zeroed int32 sync words of the megakernel on this device and stream (kept between
    calls: every launch leaves them zeroed). Inside a CUDA-graph capture a buffer too small is
    allocated for the graph alone (its zero-fill is then part of the graph)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _SYNC.get(key)
    if buf is None or buf.numel() < words:
        fresh = torch.zeros(max(words, 1024), device=device, dtype=torch.int32)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return fresh
        _SYNC[key] = buf = fresh
    return buf


def num_programs(device: torch.device, layout: TaskLayout, occupancy: int) -> int:
    """P: SMs x occupancy on a GPU, 3 under the interpreter (program 0 takes every ticket, the
    others see none left: the exit and reset path runs too); never more than there are tasks."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        p = sms * occupancy
    else:
        p = 3
    return max(1, min(p, layout.max_tasks))


def megakernel_config(config, T: int, dtype: torch.dtype, device: torch.device, *, routing_given: bool = False,
                      fp8: str | None = None) -> dict:
    """Tiles, warps and stages of the megakernel for this call (configs.megakernel_config)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    return cfgs.megakernel_config(config.num_experts, config.hidden_size, config.intermediate_size, config.top_k,
                                  config.shared_intermediate_size, T, num_sms=sms,
                                  interpret=device.type == "cpu", routing_given=routing_given, fp8=fp8)


def check_fp8_tiles(mk: dict, fp8: str | None) -> None:
    """FP8 GEMM tiles take BLOCK_K = 128 (one weight scale block per K step), FP8 activations whole
    128-column groups in GEMM 1 (BLOCK_N1 = 128), and no stream-K segments (their pieces would split
    a row's quantization); an error names the key."""
    if fp8 is None:
        return
    t = mk["tiles"]
    want = [("gemm1", "BLOCK_K", FP8_BLOCK), ("gemm2", "BLOCK_K", FP8_BLOCK), ("shared", "BLOCK_K", FP8_BLOCK),
            ("order", "STREAM_K", 0)]
    if fp8 == "weights+act":
        want += [("gemm1", "BLOCK_N", FP8_BLOCK), ("shared", "BLOCK_N1", FP8_BLOCK)]
    for part, key, v in want:
        if t[part].get(key, 0) != v:
            raise ValueError(f"FP8 ({fp8}) megakernel tiles need tiles[{part!r}][{key!r}] = {v}, got {t[part].get(key)!r}")


def fp8_convert_code(mk: dict, gpu: bool) -> int:
    """CVT for the config's "fp8_convert" (fp8_gemm.FP8_CONVERT; absent: FP8_CONVERT_DEFAULT) on a GPU
    or under the interpreter; an unknown value is an error that names the key."""
    return convert_code(mk.get("fp8_convert", FP8_CONVERT_DEFAULT), gpu, "megakernel config 'fp8_convert'")


def build_launch(x: torch.Tensor, weights, config, mk: dict, *, record: bool = False, out: torch.Tensor | None = None,
                 trace: torch.Tensor | None = None, nprog: int | None = None, sync: torch.Tensor | None = None,
                 routing: tuple | None = None, fp8: str | None = None, gpu: bool | None = None):
    """The megakernel's launch as data: (grid, args, kwargs, y, stats), buffers allocated on x's
    device (``megakernel_forward`` runs it; benchmarks/compile_report.py compiles it without a
    GPU, so ``nprog`` and ``sync`` can be given instead of read off the device, and ``gpu=True``
    picks the GPU's constexprs where they differ from the interpreter's). ``routing``:
    (topk_idx (T, K) int32, topk_w (T, K) fp32) made elsewhere; the router's tasks then only count.
    ``fp8``: None, "weights" (e4m3 weights with block scales, activations in x's dtype) or
    "weights+act" (GEMM 1 quantizes x and h per 128 columns; GEMM 2 reads e4m3 activations)."""
    T, H = x.shape
    E, K, I = config.num_experts, config.top_k, config.intermediate_size
    Is = config.shared_intermediate_size
    shared = config.num_shared_experts > 0
    KS = K + (1 if shared else 0)
    dev, dt = x.device, x.dtype
    on_gpu = dev.type == "cuda" if gpu is None else gpu
    f32, i32 = torch.float32, torch.int32
    y = torch.empty((T, H), device=dev, dtype=dt) if out is None else out
    tiles = mk["tiles"]
    lay = task_layout(config, T, tiles)
    if routing is not None and lay.route_each:  # its GEMM 1 tasks would route the token again, over the given routing
        raise InputError("tiles['router']['EACH']=1 (GEMM 1 tasks route the token themselves from the logits) "
                         "cannot take a routing made elsewhere; leave EACH out (megakernel_config(..., "
                         "routing_given=True) does)")
    r, g1, g2, sh, cb = tiles["router"], tiles["gemm1"], tiles["gemm2"], tiles["shared"], tiles["combine"]
    G, split, bm = lay.topk_groups, lay.split, g1["BLOCK_M"]
    P_max = lay.b_max * bm
    topk_idx, topk_w = routing if routing is not None else (torch.empty((T, K), device=dev, dtype=i32),
                                                              torch.empty((T, K), device=dev, dtype=f32))
    sgw = weights.shared_gate
    sgate = torch.empty((T,), device=dev, dtype=f32) if sgw is not None else None
    part = torch.empty((split, T, E), device=dev, dtype=f32) if split > 1 else None
    sg_part = torch.empty((split, T), device=dev, dtype=f32) if split > 1 and sgw is not None else None
    hist = torch.empty((G, E), device=dev, dtype=i32)
    chunk_base = torch.empty((G, E), device=dev, dtype=i32)
    counts = torch.empty((E,), device=dev, dtype=i32)
    padded_off = torch.empty((E + 1,), device=dev, dtype=i32)
    padded_token = torch.empty((P_max,), device=dev, dtype=i32)
    padded_pair = torch.empty((P_max,), device=dev, dtype=i32)
    block_expert = torch.empty((lay.b_max,), device=dev, dtype=i32)
    pair_dest = torch.empty((T * K,), device=dev, dtype=i32)
    check_fp8_tiles(mk, fp8)
    fp8_a = fp8 == "weights+act"
    adt = torch.float8_e4m3fn if fp8_a else dt
    act = torch.empty((P_max, I), device=dev, dtype=adt)
    act_s = torch.empty((T, Is), device=dev, dtype=adt) if shared else None
    act_sc = torch.empty((P_max, triton.cdiv(I, FP8_BLOCK)), device=dev, dtype=f32) if fp8_a else None
    act_s_sc = torch.empty((T, triton.cdiv(Is, FP8_BLOCK)), device=dev, dtype=f32) if fp8_a and shared else None
    xq_on = fp8_a and bool(mk.get("fp8_x_once", False)) and not config.weight_on_input
    xq = torch.empty((T, H), device=dev, dtype=torch.float8_e4m3fn) if xq_on else None
    xs = torch.empty((T, triton.cdiv(H, FP8_BLOCK)), device=dev, dtype=f32) if xq_on else None
    gus, dns = weights.gate_up_scale_inv if fp8 else None, weights.down_scale_inv if fp8 else None
    sgus = weights.shared_gate_up_scale_inv if fp8 and shared else None
    sdns = weights.shared_down_scale_inv if fp8 and shared else None
    sl = lay.slice  # expert_slice tasks: fp32 slabs of partial sums, one per slice
    pairs = torch.empty((lay.n1 * T * KS, H) if sl else (T * KS, H), device=dev, dtype=f32 if sl else dt)
    nprog = num_programs(dev, lay, mk["occupancy"]) if nprog is None else nprog
    if trace is not None:
        need = trace_rows(config, T, mk, nprog)[0]
        if trace.dtype != torch.int64 or trace.numel() < 3 * need:
            raise ValueError(f"megakernel trace: an int64 buffer of at least ({need}, 3) is needed (trace_rows), "
                             f"got {tuple(trace.shape)} {trace.dtype}")
    # the tiles' piece counters (stream-K) follow the sync words: each is reset by the piece that
    # completes its tile, so the exit reset covers only the sync words
    off_t1 = lay.sync_words
    off_t2 = off_t1 + lay.b_max * lay.n1
    words = off_t2 + lay.b_max * lay.n2 if lay.streamed else lay.sync_words
    sync = sync_buffer(dev, words) if sync is None else sync
    stats = torch.zeros(len(KINDS) + 2 * E, device=dev, dtype=i32) if record else None
    # stream-K's fp32 pieces: two workspace tiles per segment (its first and last piece); none otherwise
    ws1 = torch.empty((2 * nprog, 2, bm, g1["BLOCK_N"]), device=dev, dtype=f32) if lay.streamed else None
    ws2 = torch.empty((2 * nprog, bm, g2["BLOCK_N"]), device=dev, dtype=f32) if lay.streamed else None
    al = align_blocks(E, bm, lay.b_max)
    block_e = max(16, triton.next_power_of_2(E))
    rw = weights.router_weight
    gu, dn = weights.gate_up, weights.down
    down_t = bool(sl and mk.get("slice_down_t"))
    if down_t:  # the slices read whole rows of a (E, I, H) copy of the down weights (slice_tile's DOWN_T)
        dn = transposed_down(dn)
    gub, dnb = weights.gate_up_bias, weights.down_bias
    f = lay.first
    r_tt = topk_tokens(tiles) if split > 1 else r["BLOCK_T"]  # tokens per top-k task
    if sl:
        tma_w = slice_descriptors(mk, gu, dn, sl, g1, g2, down_t=down_t, fp8=fp8)
    else:
        tma_w = weight_descriptors(mk, gu, dn, g1, g2, streamed=lay.streamed, fp8=fp8)
    args = (
        x, rw, weights.router_bias, weights.score_bias, sgw, gu, gub, dn, dnb, weights.shared_gate_up,
        weights.shared_down,
        part, sg_part, topk_idx, topk_w, sgate, hist, chunk_base,
        counts, padded_off, block_expert, padded_token, padded_pair, pair_dest,
        act, act_s, pairs, y, sync, stats, trace, ws1, ws2, *tma_w,
        gus, dns, sgus, sdns, act_sc, act_s_sc, 0 if gus is None else gus.stride(0), 0 if gus is None else gus.stride(1), 0 if dns is None else dns.stride(0), 0 if dns is None else dns.stride(1),
        0 if sgus is None else sgus.stride(0), 0 if sdns is None else sdns.stride(0),
        0 if act_sc is None else act_sc.stride(0), 0 if act_s_sc is None else act_s_sc.stride(0),
        xq if xq_on else x, xs if xq_on else x, 0 if xs is None else xs.stride(0),  # (x: placeholders, unread)
        T, H, E, I, Is, G, lay.b_max, x.stride(0), 0 if rw is None else rw.stride(0), gu.stride(0), gu.stride(1),
        0 if gub is None else gub.stride(0), dn.stride(0), dn.stride(1), 0 if dnb is None else dnb.stride(0),
        float(config.routed_scaling_factor), float(config.swiglu_alpha), float(config.swiglu_limit), lay.h_per,
        nprog, lay.max_tasks_for(nprog), lay.s0, f["router_topk"], f["align_scan"], f["align_scatter"],
        f["shared_gemm1"], lay.shared_m_blocks, lay.off_logits, lay.off_g1, lay.off_shared1, lay.sync_words, off_t1,
        off_t2, max(lay.off_comb, 0),
    )
    kwargs = dict(
        N1=lay.n1, N2=lay.n2, NS1=max(lay.ns1, 1), NS2=max(lay.ns2, 1), NCH=triton.cdiv(H, cb["BLOCK_H"]),
        SPLIT=split if split > 1 else 0, ROUTER=ROUTER_CODES[config.router], K=K, NORM=bool(config.norm_topk_prob),
        N_GROUP=config.n_group, TOPK_GROUP=config.topk_group, PER_GROUP=E // config.n_group,
        MASK_NEG_INF=config.group_mask == "neg_inf", HAS_RB=weights.router_bias is not None,
        HAS_SB=weights.score_bias is not None, HAS_SG=sgw is not None, IEEE=dt == torch.float32,
        R_BT=r["BLOCK_T"], R_TT=r_tt, R_BE=block_e, R_BH=r["BLOCK_H"], R_BK=max(2, triton.next_power_of_2(K)),
        R_BG=max(2, triton.next_power_of_2(config.n_group)), FUSED=G == 1, BLOCK_B=al["BLOCK_B"],
        BLOCK_PAD=al["BLOCK_PAD"], BLOCK_C=scan_block(G),
        ACT=ACT_CODES[config.activation], HAS_GUB=gub is not None, HAS_DNB=dnb is not None,
        SCALE_INPUT=config.weight_on_input, G2_SCALE=not config.weight_on_input, SHARED=shared, KS=KS, BM=bm, BN1=g1["BLOCK_N"], BK1=g1["BLOCK_K"],
        BN2=g2["BLOCK_N"], BK2=g2["BLOCK_K"], S_BM=sh["BLOCK_M"], S_BN1=sh["BLOCK_N1"], S_BN2=sh["BLOCK_N2"],
        S_BK=sh["BLOCK_K"], EVEN_K1=H % g1["BLOCK_K"] == 0, EVEN_K2=I % g2["BLOCK_K"] == 0,
        S_EVEN_K1=H % sh["BLOCK_K"] == 0, S_EVEN_K2=(Is % sh["BLOCK_K"] == 0) if shared else True,
        C_BT=cb["BLOCK_T"], C_BH=cb["BLOCK_H"], GROUP_M=tiles["order"]["GROUP_M"], RECORD=record,
        TRACE=trace is not None, GIVEN=routing is not None, SW=SYNC_STRIDE, BACKOFF=mk.get("backoff_ns", 0) if dev.type == "cuda" else 0,
        NEXT=bool(mk.get("next_ticket", False)), SK=lay.streamed, FP8=fp8 is not None, FP8_A=fp8_a,
        CVT=fp8_convert_code(mk, on_gpu) if fp8 == "weights" else 0, SPF=bool(mk.get("fp8_scale_prefetch", False)) and fp8 is not None,
        F8SWAP=(2 if mk.get("fp8_precise_acc") else 1) if fp8_a and mk.get("fp8_swap_ab") else 0, XQ=xq_on,
        PF_WAIT=bool(mk.get("prefetch_wait", False)) and not lay.streamed and prefetch_available(dev)
        and prefetch_rows_ok(dn), NCHUNK=32 * mk["num_warps"],
        RANK=bool(mk.get("topk_rank", False)) and cfgs.rank_topk_fits(r_tt, block_e),
        BITONIC=bool(mk.get("topk_bitonic", False)) and cfgs.bitonic_topk_fits(r_tt, block_e),
        TMA_W=tma_w[0] is not None and not sl, TMA_S=tma_w[0] is not None and bool(sl),
        C_IN_G2=lay.off_comb >= 0, ROUTE_EACH=lay.route_each, ALIGN_EACH=lay.align_each,
        A_BP=triton.next_power_of_2(max(T * K, 16)) if lay.align_each else 16,
        # (route_each: the top-k task aligns as the GEMM 1 tasks do, so that every writer of the layout
        # writes the same words)
        ALIGN1=(bool(mk.get("align_one", False)) or lay.route_each) and G == 1 and r_tt == 1 and routing is None,
        SLICE=sl, EVEN_S=I % sl == 0 if sl else True, EVEN_N2=H % g2["BLOCK_N"] == 0, DOWN_T=down_t, C_SLABS=lay.n1 if sl else 1, C_KS0=int(shared) if sl else 0,
        C_BR=triton.next_power_of_2(lay.n1 * K) if sl else 1,
        num_warps=mk["num_warps"], num_stages=mk["num_stages"],
    )
    return (nprog,), args, kwargs, y, stats


_DOWN_T: dict = {}


def transposed_down(down: torch.Tensor) -> torch.Tensor:
    """A (E, I, H) contiguous copy of the down weights (E, H, I), made on the first call for this
    tensor and kept (config "slice_down_t": each expert_slice task then reads S whole rows, not an
    S-element piece of each of H rows). It costs the down weights' memory again; inside a CUDA-graph
    capture it must already exist (a copy would be captured into every replay): call once eagerly first."""
    held = _DOWN_T.get("down")
    if held is not None and held[0]() is down and held[1] == down._version:  # the same tensor, unmodified
        return held[2]
    if down.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("megakernel config 'slice_down_t': the (E, I, H) copy of the down weights is made "
                           "on the first eager call; run the layer once before capturing it in a CUDA graph")
    t = down.transpose(1, 2).contiguous()
    _DOWN_T["down"] = (weakref.ref(down), down._version, t)  # one layer's copy at a time
    return t


def weight_descriptors(mk: dict, gate_up, down, g1: dict, g2: dict, *, streamed: bool, fp8: str | None) -> tuple:
    """(gate_up descriptor, down descriptor) for config "tma_weights" (whole tiles of bf16/fp16/fp32
    weights, or of e4m3 ones with ``fp8``: fp8_tma_tiles.py; contiguous weights whose rows are
    16-byte multiples, as TMA needs), else (None, None). gate_up (E, 2I, H) is seen as (E*2I, H) in
    (BLOCK_N1, BLOCK_K1) blocks, down (E, H, I) as (E*H, I) in (BLOCK_N2, BLOCK_K2) blocks;
    zero-filled past the ends."""
    if not mk.get("tma_weights") or streamed:
        return None, None
    if not (gate_up.is_contiguous() and down.is_contiguous()
            and (gate_up.shape[-1] * gate_up.element_size()) % 16 == 0
            and (down.shape[-1] * down.element_size()) % 16 == 0):
        return None, None
    return (_descriptor(gate_up, gate_up.shape[0] * gate_up.shape[1], g1["BLOCK_N"], g1["BLOCK_K"]),
            _descriptor(down, down.shape[0] * down.shape[1], g2["BLOCK_N"], g2["BLOCK_K"]))


def slice_descriptors(mk: dict, gate_up, down, S: int, g1: dict, g2: dict, *, down_t: bool, fp8: str | None) -> tuple:
    """(gate_up descriptor, down descriptor) of the TMA expert_slice tasks (config "slice_tma";
    slice_tile's TMA_S), else (None, None): each slice a block of exactly S rows, so the copy engine
    zero-fills the padded width without reading memory. gate_up (E, 2I, H) as (E 2I/S, S, H) in
    (1, BLOCK_C, BLOCK_K) boxes; down as (E I/S, S, H) in (1, BLOCK_C, BLOCK_N) boxes when it is the
    (E, I, H) copy (down_t), else (E, H, I) as (E H, I/S, S) in (BLOCK_N, 1, BLOCK_C) boxes. Needs
    I % S == 0, contiguous bf16/fp16/fp32 weights and 16-byte strides (TMA's rules)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not mk.get("slice_tma") or fp8 is not None:
        return None, None
    E, H = gate_up.shape[0], gate_up.shape[2]
    I = gate_up.shape[1] // 2
    es = gate_up.element_size()
    if I % S or not (gate_up.is_contiguous() and down.is_contiguous()) or (S * es) % 16 or (H * es) % 16:
        return None, None
    bc, bk, bn = g1["BLOCK_N"], g1["BLOCK_K"], g2["BLOCK_N"]
    gu = TensorDescriptor.from_tensor(gate_up.view(E * 2 * I // S, S, H), [1, bc, bk])
    if down_t:
        dn = TensorDescriptor.from_tensor(down.view(E * I // S, S, H), [1, bc, bn])
    else:
        dn = TensorDescriptor.from_tensor(down.view(E * H, I // S, S), [bn, 1, bc])
    return gu, dn


def megakernel_experts(x, topk_idx, topk_w, gate_up, down, gate_up_bias, down_bias, activation: str, alpha: float,
                       limit: float) -> torch.Tensor:
    """The routed experts for a routing made elsewhere, in one launch (moe.moe_experts with
    backend="megakernel"; inputs checked and the routing sanitized there). topk_idx (T, K) int32,
    topk_w (T, K) fp32; gate_up (E, 2I, H), down (E, H, I) -> y (T, H)."""
    from types import SimpleNamespace

    from ..reference.config import MoEConfig

    T, H = x.shape
    E, I = gate_up.shape[0], gate_up.shape[1] // 2
    K = topk_idx.shape[1]
    cfg = MoEConfig(hidden_size=H, intermediate_size=I, num_experts=E, top_k=K, activation=activation,
                    swiglu_alpha=alpha, swiglu_limit=limit, name="moe_experts")
    w = SimpleNamespace(router_weight=None, router_bias=None, score_bias=None, shared_gate=None, gate_up=gate_up,
                        gate_up_bias=gate_up_bias, down=down, down_bias=down_bias, shared_gate_up=None,
                        shared_down=None)
    return megakernel_forward(x, w, cfg, routing=(topk_idx, topk_w))


def megakernel_forward(x: torch.Tensor, weights, config, *, mk: dict | None = None, record: bool = False,
                       out: torch.Tensor | None = None, trace: torch.Tensor | None = None,
                       routing: tuple | None = None, nprog: int | None = None, fp8: str | None = None):
    """y (T, H) in x's dtype: the layer in one launch (inputs checked by moe.py).

    ``mk``: a megakernel config (``megakernel_config``'s form) to use instead of the default.
    ``record``: also return the tasks the kernel ran, as a dict {kind: count, "gemm1_per_expert":
    [E], "gemm2_per_expert": [E]} (tests) and the compiled kernel's registers, spills and shared
    memory. ``out``: write y there (T, H), e.g. a poisoned buffer. ``trace`` (GPU only): an int64
    (trace_rows(...)[0], 3) tensor that receives (program, start ns, end ns) of every task run, each
    program's first ticket and exit, and the first top-k task's phases (trace_rows). ``routing``:
    (topk_idx, topk_w) made elsewhere (see megakernel_experts). ``nprog``: launch that many programs
    instead of SMs x occupancy (tests: the stream-K segments follow the programs). ``fp8``: None,
    "weights" or "weights+act" (see build_launch; moe.py checks the FP8 weights and picks it)."""
    T = x.shape[0]
    if T == 0:
        y = torch.empty(tuple(x.shape), device=x.device, dtype=x.dtype) if out is None else out
        return (y, {k: 0 for k in KINDS}) if record else y
    mk = mk or megakernel_config(config, T, x.dtype, x.device, routing_given=routing is not None, fp8=fp8)
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
