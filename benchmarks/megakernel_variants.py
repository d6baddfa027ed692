"""Named megakernel variants and the parallel compile-ahead shared by the megakernel benchmarks.

A variant is a function of the default config (``kernels.megakernel.megakernel_config``) that
changes one choice, so that one GPU run times each choice against the default side by side
(bench_megakernel.py ``--variants``, megakernel_trace.py ``--variants``).

``warm(warm_jobs(...))`` compiles ahead into Triton's on-disk cache: each job (preset, T, what to
run) runs in its own process, so the 15-30 s compiles of the megakernel run side by side on the
GPU machine's cores; the measuring process then finds every kernel compiled.
"""

from __future__ import annotations

import copy

#: bf16 weights of one layer above this many GiB: at most HEAVY_JOBS such processes at once
HEAVY_GIB = 12.0
HEAVY_JOBS = 3
#: GiB of weights the warm-up's processes may hold on the GPU at once (an H200 has 131 GiB)
WARM_GPU_GIB = 100.0


def _set(**kw):
    def f(mk):
        mk = copy.deepcopy(mk)
        mk.update(kw)
        return mk
    return f


def _bn(scale: float):
    def f(mk):
        mk = copy.deepcopy(mk)
        for g in ("gemm1", "gemm2"):
            mk["tiles"][g]["BLOCK_N"] = int(min(128, max(32, mk["tiles"][g]["BLOCK_N"] * scale)))
        return mk
    return f


def _order(**kw):
    def f(mk):
        mk = copy.deepcopy(mk)
        mk["tiles"]["order"].update(kw)
        return mk
    return f


def _rows(bm: int):
    """Row blocks of bm rows (GEMM 1, GEMM 2, the shared MLP); BLOCK_K 128 below 64 rows (the
    decode tiles'), 64 from there; stages refitted to shared memory (configs.decode_stages, the
    shared MLP's stage counted whether or not the preset has one)."""
    def f(mk):
        from megamoe.kernels.configs import decode_stage_bytes, decode_stages

        mk = copy.deepcopy(mk)
        t = mk["tiles"]
        t["gemm1"]["BLOCK_M"] = t["shared"]["BLOCK_M"] = bm
        for g in ("gemm1", "gemm2", "shared"):
            t[g]["BLOCK_K"] = 128 if bm < 64 else 64
        mk["num_stages"] = decode_stages(decode_stage_bytes(t, True))
        return mk
    return f


def _gemm_tiles(n1: int, n2: int | None, k: int, tma: bool):
    """GEMM 1 tiles of n1 columns and BLOCK_K k (GEMM 2 too with n2; None keeps its tiles), weights
    through TMA or cp.async, stages refitted to shared memory (configs.decode_stages). Narrower
    GEMM 1 tiles make more tasks than programs at decode (Qwen3-30B-A3B T = 1: 192 of 32 columns
    against 96 of 64 on 132 programs), so the GEMM 2 tasks of the first experts start while the
    last GEMM 1 tiles stream; BLOCK_K 256 keeps a 32-column weight tile at the 16 KiB that TMA copies want."""
    def f(mk):
        from megamoe.kernels.configs import decode_stage_bytes, decode_stages

        mk = copy.deepcopy(mk)
        t = mk["tiles"]
        t["gemm1"].update(BLOCK_N=n1, BLOCK_K=k)
        if n2:
            t["gemm2"].update(BLOCK_N=n2, BLOCK_K=k)
        mk.update(tma_weights=tma, num_stages=decode_stages(decode_stage_bytes(t, True)))
        return mk
    return f


def _gemm2_deep(mk):
    """GEMM 2's BLOCK_K as deep as the stage count allows (configs.deep_gemm2_block_k), at decode
    (BLOCK_M <= 64; prefill tiles unchanged): GEMM 2 tasks keep as many weight bytes in flight as GEMM 1's."""
    from megamoe.kernels.configs import deep_gemm2_block_k

    t = mk["tiles"]
    if t["gemm1"]["BLOCK_M"] > 64 or t["gemm1"].get("SLICE"):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["gemm2"]["BLOCK_K"] = deep_gemm2_block_k(mk["tiles"], not mk.get("routed_only", True))
    return mk


def _gemm2_wide(mk):
    """GEMM 2 tiles of 256 columns (half the tasks, each re-reading its rows half as often; stages refitted
    at decode): H200 run BM's traces, Qwen3-30B-A3B T = 64's 2,032 GEMM 2 tasks of 196 KB at 7.2 us each and
    Mixtral-8x7B T = 512's 128 x 128 tasks reading their 3.7 MB of rows beside 3.7 MB of weights."""
    from megamoe.kernels.configs import decode_stage_bytes, decode_stages

    if mk["tiles"]["gemm1"].get("SLICE"):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["gemm2"]["BLOCK_N"] = 256
    if mk["tiles"]["gemm1"]["BLOCK_M"] <= 64:
        mk["num_stages"] = decode_stages(decode_stage_bytes(mk["tiles"], not mk.get("routed_only", True)))
    return mk


def _topk_tokens(n: int):
    """Top-k tasks of n tokens each (tiles.router.TOPK_T): at T = 8 the default is one task of 8
    rows taking K dependent maxima; n <= 2 spreads them over programs as bitonic top-ks, at the
    cost of a separate align (scan, scatter) and its handoffs."""
    def f(mk):
        mk = copy.deepcopy(mk)
        mk["tiles"]["router"]["TOPK_T"] = n
        return mk
    return f


def _topk_groups(n: int):
    """Top-k tasks of n tokens where the router is split and n divides its token block (the kernel
    takes no other; unchanged elsewhere): fewer, larger groups for the align's one scan task to sum."""
    def f(mk):
        r = mk["tiles"]["router"]
        if r["SPLIT"] <= 1 or r["BLOCK_T"] % n:
            return mk
        return _topk_tokens(n)(mk)
    return f


def _router_split(n: int):
    """The decode router's logits over n ranges of H (tiles.router.SPLIT; whole BLOCK_H steps, so
    reference.tiles.router_ranges may give fewer): more, shorter logits tasks before the top-k task
    (H200 run AB's trace, Qwen3-30B-A3B T = 1: 11 tasks of 48 KB, 2.3 us each, then 3.2 us of top-k)."""
    def f(mk):
        mk = copy.deepcopy(mk)
        if mk["tiles"]["router"]["SPLIT"] > 1:
            mk["tiles"]["router"]["SPLIT"] = n
        return mk
    return f


def _router_split_blocks(n: int, topk_t: int = 4):
    """Where the default router walks all of H in each token block's top-k task (no SPLIT: T >= 512,
    16+ blocks of 32 tokens), its logits over n ranges of H as at decode, then top-k tasks of
    ``topk_t`` tokens summing the ranges' partials (H200 run BG's trace, Qwen3-30B-A3B T = 512: 16 top-k
    tasks of 19.7 us each, the align done at 37.7 us while the other 116 programs wait in GEMM 1)."""
    def f(mk):
        r = mk["tiles"]["router"]
        if r["SPLIT"] > 1 or r["BLOCK_T"] % topk_t:
            return mk
        mk = copy.deepcopy(mk)
        mk["tiles"]["router"].update(SPLIT=n, TOPK_T=topk_t)
        return mk
    return f


def _prefill(mk):
    """The prefill tiles (configs._megakernel_config's past 64 rows): 128-row blocks, 128-column
    tiles, BLOCK_K 64, 8 warps, 3 stages."""
    mk = copy.deepcopy(mk)
    t = mk["tiles"]
    t["gemm1"].update(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
    t["gemm2"].update(BLOCK_N=128, BLOCK_K=64)
    t["shared"].update(BLOCK_M=128, BLOCK_N1=128, BLOCK_N2=128, BLOCK_K=64)
    mk.update(num_warps=8, num_stages=3)
    return mk


#: shared memory each of two programs per SM may give its pipeline stages (an H200 SM has 228 KiB)
OCC2_STAGE_BYTES = 100 << 10


def _occ2(block_n: int | None):
    """Two programs per SM: BLOCK_K 64 (half a decode stage's bytes), as many stages as
    OCC2_STAGE_BYTES holds (2 to 6), optionally GEMM tiles of block_n columns (more tiles for the
    twice as many programs). bench_stream.py (run N): two streaming programs per SM pull 10-15% more."""
    def f(mk):
        from megamoe.kernels import configs as cfgs

        mk = copy.deepcopy(mk)
        t = mk["tiles"]
        for g in ("gemm1", "gemm2", "shared"):
            t[g]["BLOCK_K"] = 64
        if block_n:
            for g in ("gemm1", "gemm2"):
                t[g]["BLOCK_N"] = block_n
        per_stage = cfgs.decode_stage_bytes(t, True)
        mk.update(occupancy=2, num_stages=max(2, min(6, OCC2_STAGE_BYTES // per_stage)))
        return mk
    return f


def _wide(mk):
    """stream-K with 128-column GEMM tiles (segments balance the programs, not the tile count)."""
    mk = copy.deepcopy(mk)
    mk["tiles"]["order"]["STREAM_K"] = 1
    for g in ("gemm1", "gemm2"):
        mk["tiles"][g]["BLOCK_N"] = 128
    per_stage = max(mk["tiles"]["gemm1"]["BLOCK_M"] * mk["tiles"]["gemm1"]["BLOCK_K"] * 2
                    + 2 * mk["tiles"]["gemm1"]["BLOCK_K"] * 128 * 2, 1)
    mk["num_stages"] = max(2, min(mk["num_stages"], (200 << 10) // per_stage))
    return mk


def _fp8_fast(block_n: int | None = None, max_stages: int = 6, convert: str = "bits", prefetch: bool = True):
    """fp8fast (bit-move conversion, scales a K step ahead; ``convert="cast"``: the prefetch alone),
    optionally with GEMM tiles of block_n columns, and as many pipeline stages as the decode stage
    budget (configs.STAGE_BYTES) holds of e4m3 weights, up to max_stages (configs.decode_stages stops at 6)."""
    def f(mk):
        from megamoe.kernels import configs as cfgs

        mk = copy.deepcopy(mk)
        mk.update(fp8_convert=convert, fp8_scale_prefetch=prefetch)
        t = mk["tiles"]
        if block_n:
            for g in ("gemm1", "gemm2"):
                t[g]["BLOCK_N"] = block_n
        if block_n or max_stages != 6:  # the shared MLP's tiles count whether or not the preset has one
            per_stage = cfgs.decode_stage_bytes(t, True, weight_bytes=1)
            mk["num_stages"] = cfgs.decode_stages(per_stage, least=2, most=max_stages)
        return mk
    return f


def _slices(mk):
    """expert_slice tasks (configs.apply_slices: the decode config's ``slice_tiles``)."""
    from megamoe.kernels.configs import apply_slices

    return apply_slices(mk)


def _slices_t(mk):
    """expert_slice tasks reading a (E, I, H) copy of the down weights (config "slice_down_t")."""
    mk = _slices(mk)
    if mk["tiles"]["gemm1"].get("SLICE"):
        mk = {**mk, "slice_down_t": True}
    return mk


def _slices_tma(down_t: bool):
    """TMA expert_slice tasks (configs.apply_slices(tma=True): a width that divides I, the slices'
    padded lanes zero-filled by the copy engine), the down weights as stored or as the (E, I, H) copy."""
    def f(mk):
        from megamoe.kernels.configs import apply_slices

        mk = apply_slices(mk, tma=True)
        if down_t and mk["tiles"]["gemm1"].get("SLICE"):
            mk = {**mk, "slice_down_t": True}
        return mk
    return f


def _combine_in_g2(mk):
    """The combine in GEMM 2's tiles (tiles["combine"]["IN_G2"]): the last tile of each column block
    sums its slots; routed experts only (the config is unchanged where the layer has a shared MLP,
    expert_slice tasks or stream-K: the launch would refuse it)."""
    mk = copy.deepcopy(mk)
    t = mk["tiles"]
    if not t["gemm1"].get("SLICE") and not t["order"].get("STREAM_K") and mk.get("routed_only"):
        t["combine"]["IN_G2"] = 1
    return mk


def _route_each(mk):
    """T = 1 with a split router: every GEMM 1 task routes the token itself from the logits' partials
    (tiles["router"]["EACH"]; configs.route_each) instead of waiting for the top-k task (run AF's
    trace: its align and signal take 1.8 us, then the GEMM 1 tasks see it); other configs
    unchanged. The default up to configs.ROUTE_EACH_MAX_EXPERTS experts since run AH."""
    from megamoe.kernels import configs as cfgs

    return cfgs.route_each(mk)


def _route_once(mk):
    """The top-k task routes the token and signals the GEMM 1 tasks (tiles["router"]["EACH"] = 0):
    what "reach" is measured against where it is the default."""
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"].pop("EACH", None)
    return mk


def _no_align_each(mk):
    """The scan and scatter tasks, not GEMM 1 tasks placing their own rows (tiles["router"]["ALIGN_EACH"]
    off: the default from T = 2 to configs.ALIGN_EACH_MAX_T since this session)."""
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"].pop("ALIGN_EACH", None)
    return mk


def _slices_t_split(n: int):
    """slice_t with the decode router's logits over n ranges of H (both halves of the T = 1 layer's
    gap in one config: the router's chain and the weights' streaming)."""
    def f(mk):
        return _router_split(n)(_slices_t(mk))
    return f


def _no_slices(mk):
    """GEMM 1 and GEMM 2 tiles where the default takes expert_slice tasks: the two-GEMM decode tiles
    (the config before apply_slices: SLICE 0, GEMM 1's BLOCK_N, the combine's BLOCK_H and the stages
    as ``slice_tiles`` found them)."""
    st = mk.get("two_gemm")
    return copy.deepcopy(st) if st else mk


#: name -> (change, why); the default config is always measured as "default"
VARIANTS = {
    "tiles": (_order(STREAM_K=0), "GEMM tasks as whole tiles (no stream-K segments)"),
    "sk": (_order(STREAM_K=1), "stream-K GEMM segments, one per program"),
    "sk_wide": (_wide, "stream-K with 128-column GEMM tiles"),
    "rank": (_set(topk_rank=True), "top-k tasks rank every expert at once (one reduction, not K maxima)"),
    "bitonic": (_set(topk_bitonic=True), "top-k tasks take a bitonic top-k (tl.topk: two cross-warp steps, not K maxima)"),
    "maxima": (_set(topk_bitonic=False), "top-k tasks take K dependent maxima (the bitonic top-k off)"),
    "pfwait": (_set(prefetch_wait=True), "a GEMM 2 task that must wait for its GEMM 1 prefetches its weights into L2 first"),
    "bm16": (_rows(16), "16-row blocks (an expert with more rows streams its weights once per block; L2 may share them)"),
    "bm32": (_rows(32), "32-row blocks"),
    "bm128": (_prefill, "the prefill tiles: 128-row blocks, 128 x 64 steps, 8 warps, 3 stages"),
    "w8": (_set(num_warps=8), "8 warps (the GEMM 1 tile's two accumulators over twice the threads)"),
    "w4": (_set(num_warps=4), "4 warps"),
    "stages3": (_set(num_stages=3), "3 pipeline stages"),
    "stages4": (_set(num_stages=4), "4 pipeline stages"),
    "stages6": (_set(num_stages=6), "6 pipeline stages"),
    "n32k256": (_gemm_tiles(32, None, 256, True), "32-column GEMM 1 tiles, BLOCK_K 256 (16 KiB weight copies), TMA "
                "weights: more GEMM 1 tasks than programs at decode"),
    "n32": (_gemm_tiles(32, None, 128, False), "32-column GEMM 1 tiles, BLOCK_K 128, cp.async weights"),
    "n64tma": (_gemm_tiles(64, 64, 128, True), "64-column GEMM tiles, BLOCK_K 128, TMA weights (16 KiB copies)"),
    "n64g1": (_gemm_tiles(64, None, 128, True), "64-column GEMM 1 tiles only (GEMM 2's as the default), BLOCK_K 128, "
              "TMA weights: twice the GEMM 1 tasks where few experts are touched, without n64tma's GEMM 2 change"),
    "n32k256all": (_gemm_tiles(32, 32, 256, True), "32-column GEMM 1 and GEMM 2 tiles, BLOCK_K 256, TMA weights"),
    "rsplit16": (_router_split(16), "the decode router's logits over 16 ranges of H"),
    "rsplit32": (_router_split(32), "the decode router's logits over 32 ranges of H (one BLOCK_H step each at H 2048)"),
    "rsplitb4": (_router_split_blocks(4), "T >= 512: the router's logits over 4 ranges of H, top-k tasks of 4 tokens "
                 "(the default: each 32-token block's top-k task walks all of H)"),
    "rsplitb8": (_router_split_blocks(8), "T >= 512: the router's logits over 8 ranges of H, top-k tasks of 4 tokens"),
    "slice": (_slices, "expert_slice tasks: GEMM 1's slice of I and its share of GEMM 2 in one task, fp32 "
              "partials summed by the combine (no GEMM 2 wait, no phase boundary)"),
    "slice_t": (_slices_t, "expert_slice tasks whose down weights are a (E, I, H) copy: each task reads whole "
                           "rows (the stored (E, H, I) gives it 96-240-byte pieces of every H row)"),
    "slice_tma": (_slices_tma(False), "TMA expert_slice tasks: each slice a box of exactly S rows (a width that "
                  "divides I), its padded lanes zero-filled by the copy engine, not by cp.async"),
    "slice_tma_w8": (lambda mk: {**_slices_tma(False)(mk), "num_warps": 8},
                     "slice_tma at 8 warps (128-wide slices hold 255 registers at 4)"),
    "slice_t_tma": (_slices_tma(True), "TMA expert_slice tasks reading the (E, I, H) copy of the down weights"),
    "reach": (_route_each, "T = 1: every GEMM 1 task routes the token itself from the logits' partials, not "
                           "waiting for the top-k task's align and signal"),
    "noreach": (_route_once, "T = 1: the top-k task routes the token and signals the GEMM 1 tasks (not each "
                             "GEMM 1 task routing it itself)"),
    "fcomb": (_combine_in_g2, "the combine in GEMM 2's tiles: the last tile of each column block sums its "
                              "slots for every token (no combine tasks, no wait for all of GEMM 2)"),
    "slice_t_r32": (_slices_t_split(32), "slice_t with the router's logits over 32 ranges of H"),
    "two_gemm": (_no_slices, "GEMM 1 and GEMM 2 tiles, not expert_slice tasks"),
    "noaeach": (_no_align_each, "the align as scan and scatter tasks, not each GEMM 1 task placing its block's rows "
                                "from the top-k tasks' histograms and the routing"),
    "align1": (_set(align_one=True), "T = 1: the align from the token's picks' ranks (align._align_one), no scan over "
               "the experts"),
    "k2deep": (_gemm2_deep, "decode: GEMM 2's BLOCK_K as deep as the stage count allows (up to 256), so that its "
                            "tasks keep GEMM 1's weight bytes in flight"),
    "g2wide": (_gemm2_wide, "GEMM 2 tiles of 256 columns: half the tasks, each re-reading its rows half as often"),
    "topk1": (_topk_tokens(1), "top-k tasks of one token (bitonic top-k; the align as scan and scatter tasks)"),
    "topk8": (_topk_groups(8), "top-k tasks of 8 tokens (T = 512's split router: 64 groups for the scan to sum, not 128)"),
    "topk16": (_topk_groups(16), "top-k tasks of 16 tokens (32 groups for the scan)"),
    "topk32": (_topk_groups(32), "top-k tasks of a whole 32-token block (16 groups for the scan, 16 scatter tasks)"),
    "topk2": (_topk_tokens(2), "top-k tasks of two tokens (bitonic top-k; the align as scan and scatter tasks)"),
    "tmaw": (_set(tma_weights=True), "the routed GEMM tasks' weight tiles through TMA descriptors (bulk copies), "
                                      "not cp.async"),
    "occ2": (_set(occupancy=2), "two programs per SM (where registers and shared memory allow)"),
    "occ2s": (_occ2(None), "two programs per SM, BLOCK_K 64, the stages 100 KiB holds"),
    "occ2_bn32": (_occ2(32), "two programs per SM, BLOCK_K 64, 32-column GEMM tiles, the stages 100 KiB holds"),
    "next": (_set(next_ticket=True), "take the next ticket as a task starts, not after it ends"),
    # FP8 weights (bench_megakernel.py --fp8): the e4m3 -> bf16 conversion and the scale loads of the K loop
    "fp8cast": (_set(fp8_convert="cast"), "FP8: e4m3 -> bf16 by Triton's cast (two F2F per pair on the conversion pipe)"),
    "fp8bits": (_set(fp8_convert="bits"), "FP8: e4m3 -> bf16 by bit moves and one bf16x2 multiply (inline PTX), "
                                          "not Triton's cast (two F2F per pair on the conversion pipe)"),
    "fp8tma": (_set(tma_weights=True), "FP8: the routed GEMM tasks' e4m3 weight tiles through TMA descriptors "
               "(kernels/fp8_tma_tiles.py), not cp.async"),
    "fp8swap": (_set(tma_weights=True, fp8_x_once=False, fp8_swap_ab=True), "FP8 activations: fp8tma with the "
                "products as weights x rows (an e4m3 wgmma; 16 rows x weights is an fp16 mma.sync on sm_90), x "
                "quantized in every K step (run BP)"),
    "fp8xq": (_set(tma_weights=True, fp8_x_once=True), "FP8 activations: fp8tma with x quantized once by the router "
              "tasks, the GEMM 1 tasks loading its codes (no quantization in their K steps; the default since run BU)"),
    "fp8xstep": (_set(fp8_x_once=False), "FP8 activations: x quantized in every K step of every GEMM 1 task (the "
                 "default before run BU)"),
    "fp8ptr": (_set(tma_weights=False), "FP8 activations: the e4m3 weight tiles by cp.async pointer loads, not TMA "
               "(x quantized once)"),
    "fp8xqswap": (_set(tma_weights=True, fp8_x_once=True, fp8_swap_ab=True), "FP8 activations: fp8xq and fp8swap "
                  "together"),
    "fp8xqswapp": (_set(tma_weights=True, fp8_x_once=True, fp8_swap_ab=True, fp8_precise_acc=True),
                   "FP8 activations: fp8xqswap with the e4m3 wgmma's sums promoted to fp32 every 32 products"),
    "fp8pf": (_set(fp8_scale_prefetch=True), "FP8: the next K step's weight scales loaded during this one"),
    "fp8fast": (_fp8_fast(), "FP8: fp8bits and fp8pf together"),
    "fp8fast_st": (_fp8_fast(max_stages=10), "FP8: fp8fast with the stages the decode budget holds of e4m3 "
                                             "weights, up to 10 (bytes in flight per program as bf16's)"),
    "fp8st": (_fp8_fast(max_stages=10, prefetch=False), "FP8: bit moves (the default) with the stages the decode "
                                                        "budget holds of e4m3 weights, up to 10"),
    "fp8fast_bn128": (_fp8_fast(block_n=128), "FP8: fp8fast with 128-column GEMM tiles (twice the bytes per K "
                                              "step of a 64-column tile)"),
    "fp8pf_bn128": (_fp8_fast(block_n=128, convert="cast"), "FP8: fp8pf with 128-column GEMM tiles (with FP8 "
                                                            "activations, where there is no conversion)"),
}
#: the variants timed at T = 1 and at T > 1 (each is a 15-30 s compile). At T = 8-64, stream-K
#: segments: the only layout whose GEMM tasks follow the device's counts (one segment per program
#: whatever the routing), where every token on the same experts leaves the default 48 GEMM 1 tasks
#: for 132 programs (Qwen3-30B-A3B T = 64, run AJ: 2.9x the floor); predicted 0.80-0.99x the default
#: there, 0.98-1.01x uniform (NOTES-gpu-runs.md, after run AJ)
T1_VARIANTS = ("reach", "noreach")
MID_VARIANTS = ("sk",)
#: ... and from T = 512 on (where the megakernel ran 0.6-0.8x the multi path, same tiles: runs L, O)
PREFILL_VARIANTS = ("tmaw", "bm128")
#: the variants timed with FP8 weights (bench_megakernel.py --fp8 weights --variants), at every variant T
FP8_VARIANTS = ("fp8tma", "fp8cast", "fp8st", "fp8fast", "fp8fast_bn128")
#: with FP8 activations too (--fp8 weights+act): the products are e4m3 x e4m3, so the conversion
#: option does nothing there (the kernel takes CVT 0), and GEMM 1's 128-column tiles leave no room
#: for more stages; the scale prefetch and GEMM 2's tiles remain
FP8A_VARIANTS = ("fp8xstep", "fp8ptr", "fp8xqswap", "fp8xqswapp", "fp8pf", "fp8pf_bn128")


def variant_names(T: int, fp8: str | None = None) -> tuple[str, ...]:
    """The variants bench_megakernel.py --variants times at T (and its warm-up compiles)."""
    if fp8:
        return FP8_VARIANTS if fp8 == "weights" else FP8A_VARIANTS
    return T1_VARIANTS if T == 1 else (MID_VARIANTS if T < 512 else PREFILL_VARIANTS)


def _fit_router_switches(mk: dict) -> dict:
    """A variant that gives the layer expert_slice tasks or stream-K segments leaves the default's
    tiles["router"]["EACH"] and ["ALIGN_EACH"] out (reference.tiles.fit_router_switches): GEMM 1 tasks
    route the token or place their rows themselves only with GEMM 1 and GEMM 2 tiles (task_layout
    refuses the rest; run AJ's trace of "sk" met that)."""
    from megamoe.reference.tiles import fit_router_switches

    tiles = fit_router_switches(mk["tiles"])
    return mk if tiles is mk["tiles"] else {**copy.deepcopy(mk), "tiles": copy.deepcopy(tiles)}


def variant_configs(base: dict, names=None) -> list[tuple[str, dict]]:
    """[(name, config)] for the default and each named variant that differs from it (``names`` None:
    every variant; an empty list: the default alone, as megakernel_trace.py asks without --variants)."""
    out = [("default", base)]
    names = None if names is None else [n for n in names if n != "default"]  # "default": always first
    unknown = [n for n in (names or ()) if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown megakernel variant(s) {', '.join(map(repr, unknown))}; "
                         f"expected names from: {', '.join(sorted(VARIANTS))}")
    for n in (VARIANTS if names is None else names):
        mk = _fit_router_switches(VARIANTS[n][0](base))
        if mk != base and all(mk != m for _, m in out):
            out.append((n, mk))
    return out


def _warm_job(name: str, T: int, what: str, fp8: str | None = None) -> str:
    """Run once, so that Triton compiles it: ``what`` = "backends" (both backends, both routings;
    with ``fp8`` both FP8 backends and the bf16 megakernel), a variant name (of the FP8 megakernel
    with ``fp8``), or "trace:<variant>" (the traced kernel of "default" or a variant)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.fp8_weights import to_fp8
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward, num_programs, trace_rows
    from megamoe.reference.tiles import task_layout

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    fp8_act = fp8 == "weights+act" if fp8 else None
    try:
        if what == "backends":
            wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
            if fp8:
                for ww in (w, wz):
                    kmoe.moe_forward(x, ww, cfg, backend="megakernel")  # the bf16 megakernel of the row
                w = to_fp8(w)
                wz = type(w)(**{**w.arrays(), "router_weight": wz.router_weight})
            for backend in ("megakernel", "multi"):
                for ww in (w, wz):
                    kmoe.moe_forward(x, ww, cfg, backend=backend, fp8_activations=fp8_act)
        else:
            trace = what.startswith("trace:")
            vname = what.split(":", 1)[1] if trace else what
            if fp8:
                w = to_fp8(w)
            base = megakernel_config(cfg, T, torch.bfloat16, x.device, fp8=fp8)
            mk = base if vname == "default" else dict(variant_configs(base, [vname])).get(vname)
            if mk is not None:
                tr = torch.zeros((trace_rows(cfg, T, mk, num_programs(x.device, task_layout(cfg, T, mk["tiles"]),
                                                                   mk["occupancy"]))[0], 3),
                                 device="cuda", dtype=torch.int64) if trace else None
                megakernel_forward(x, w, cfg, mk=mk, trace=tr, fp8=fp8)
        torch.cuda.synchronize()
        return f"{name}:{T} {what}" + (f" fp8:{fp8}" if fp8 else "")
    except Exception as exc:  # noqa: BLE001 - the measuring process meets it again and records it
        return f"{name}:{T} {what}" + (f" fp8:{fp8}" if fp8 else "") + f" {type(exc).__name__}"


def warm_jobs(presets, tokens, variant_tokens=(), trace_cases=(), trace_variants=(), fp8: str | None = None,
              names=None) -> list:
    """(preset, T, what, fp8) jobs: both backends at every (preset, T); each variant of
    ``variant_names`` (or of ``names``, where given) at variant_tokens; the traced default and
    trace_variants at the (preset, T) of trace_cases (bf16). ``fp8``: the rows' and variants' FP8
    mode (bench_megakernel.py --fp8)."""
    jobs = [(n, T, "backends", fp8) for n in presets for T in tokens]
    jobs += [(n, T, v, fp8) for n in presets for T in variant_tokens for v in (names or variant_names(T, fp8))]
    jobs += [(n, T, f"trace:{v}", None) for n, T in trace_cases for v in ("default", *trace_variants)]
    return jobs


#: an FP8 job holds the bf16 weights, their e4m3 copy (half their bytes) and to_fp8's float32
#: slices (fp8_weights.CHUNK_ELEMS: 1 GiB each, a few at once) while it quantizes
FP8_JOB_EXTRA_GIB = 4.0


def weight_gib(name: str, fp8: str | None = None) -> float:
    """GiB of weights a warm-up job of the preset holds on the GPU (its bf16 layer; FP8 jobs more)."""
    from megamoe.kernels import bench as kb
    from megamoe.reference.sizes import expert_bytes

    cfg = kb.bench_config(name)
    gib = cfg.num_experts * expert_bytes(cfg, "bfloat16") / 2**30
    return 1.5 * gib + FP8_JOB_EXTRA_GIB if fp8 else gib


def can_start(job: tuple[float, bool], running: list[tuple[float, bool]], processes: int,
              gpu_gib: float = WARM_GPU_GIB) -> bool:
    """Whether a warm-up job, (GiB it holds, heavy: its preset's bf16 layer over HEAVY_GIB), may start
    beside the running ones: a free process, at most HEAVY_JOBS heavy ones, and all their GiB within
    ``gpu_gib`` (a job alone always starts)."""
    gib, heavy = job
    if len(running) >= processes:
        return False
    if heavy and sum(h for _, h in running) >= HEAVY_JOBS:
        return False
    return not running or sum(g for g, _ in running) + gib <= gpu_gib


def warm(jobs: list[tuple], timeout_s: float, processes: int = 14, log=print, gpu_gib: float = WARM_GPU_GIB) -> None:
    """Run each job of ``warm_jobs`` in a process of a spawn pool (one job per process: a fresh
    process for each, so that one compile's memory goes with it), in order, each started when
    ``can_start``: the weights it holds (``weight_gib``) fit beside the running jobs' within
    ``gpu_gib``, and heavy presets (bf16 layer over HEAVY_GIB) at most HEAVY_JOBS at once."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    t0 = time.time()
    need = {j: (weight_gib(j[0], *j[3:]), weight_gib(j[0]) > HEAVY_GIB) for j in jobs}
    queue = sorted(jobs, key=lambda j: need[j][1])  # light first (stable: in order)
    running: dict = {}  # AsyncResult -> (GiB, heavy)
    with ctx.Pool(min(processes, len(jobs)), maxtasksperchild=1) as pool:
        while queue or running:
            for j in list(queue):
                if can_start(need[j], list(running.values()), processes, gpu_gib):
                    running[pool.apply_async(_warm_job, j)] = need[j]
                    queue.remove(j)
            for r in [r for r in running if r.ready()]:
                try:
                    log(f"# warmed {r.get()} ({time.time() - t0:.0f} s)")
                except Exception as exc:  # noqa: BLE001
                    log(f"# warm-up failed: {type(exc).__name__}: {exc}")
                del running[r]
            if time.time() - t0 > timeout_s:
                log(f"# warm-up: time limit {timeout_s:.0f} s reached; the rest compiles as it runs")
                pool.terminate()
                return
            time.sleep(0.5)
