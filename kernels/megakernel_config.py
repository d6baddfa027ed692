"""The persistent megakernel's config: its tiles (reference.tiles' form), warps, stages, programs
per SM and the two load options, chosen from the layer's shape, T and the GPU's SM count.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width, P programs.

Pure Python, like configs.py. A config is a dict::

    {"tiles": {"router": ..., "gemm1": ..., "gemm2": ..., "shared": ..., "combine": ..., "order": ...},
     "num_warps": int, "num_stages": int, "occupancy": int, "tma_weights": bool,
     "routed_only": bool, "single_token": bool}

The hand-set thresholds are data with their source (configs/megakernel.json); the choices and
their evidence: docs/megakernel.md.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ..reference.sizes import FP8_BLOCK
from ..reference.tiles import align_each_takes
from .configs import _pow2, decode_router_split, router_block_h, router_block_t

#: the hand-set thresholds: name -> {"value", "unit", "source"} (the measurement that set it)
THRESHOLDS_PATH = Path(__file__).parent / "configs" / "megakernel.json"
_THRESHOLD_NAMES = ("route_each_max_experts", "align_each_max_t", "bitonic_topk_max_tokens", "bitonic_topk_max_keys",
                    "fp8_wide_shared_max_stages", "stage_bytes", "gemm2_max_block_k", "gemm2_wide_min_t",
                    "gemm2_wide_block_n", "split_max_t", "split_steps", "topk16_max_experts", "tma_weight_tile_bytes")


def load_thresholds(path: Path = THRESHOLDS_PATH) -> dict[str, int]:
    """name -> value of the megakernel's thresholds file (exactly _THRESHOLD_NAMES), else ValueError."""
    d = json.loads(Path(path).read_text())
    if set(d) != set(_THRESHOLD_NAMES):
        raise ValueError(f"{path}: want exactly the keys {sorted(_THRESHOLD_NAMES)}, got {sorted(d)}")
    out = {}
    for k, v in d.items():
        if not (isinstance(v, dict) and set(v) == {"value", "unit", "source"} and isinstance(v["value"], int)
                and not isinstance(v["value"], bool) and v["value"] > 0 and v["unit"] and v["source"]):
            raise ValueError(f"{path}: {k!r} must be {{'value': a positive int, 'unit': ..., 'source': ...}}, got {v!r}")
        out[k] = v["value"]
    return out


_T = load_thresholds()
#: T = 1: every GEMM 1 task routes the token itself (tiles["router"]["EACH"]) up to this many experts
ROUTE_EACH_MAX_EXPERTS = _T["route_each_max_experts"]
#: the most tokens at which the default config takes tiles["router"]["ALIGN_EACH"]
ALIGN_EACH_MAX_T = _T["align_each_max_t"]
#: the bitonic top-k (routing._route_block's BITONIC) for top-k tasks of at most this many tokens
BITONIC_TOPK_MAX_TOKENS = _T["bitonic_topk_max_tokens"]
#: ... and at most this many keys (tokens x BLOCK_E) per task
BITONIC_TOPK_MAX_KEYS = _T["bitonic_topk_max_keys"]
#: pipeline stages at most of the weight-only FP8 megakernel with 64-row tiles and a 128-column shared GEMM 1
FP8_WIDE_SHARED_MAX_STAGES = _T["fp8_wide_shared_max_stages"]
#: shared memory the decode megakernel's pipeline stages may take, bytes
STAGE_BYTES = _T["stage_bytes"]
#: the deepest GEMM 2 step a decode megakernel takes, elements
GEMM2_MAX_BLOCK_K = _T["gemm2_max_block_k"]
#: above this T (to MEGAKERNEL_SPLIT_MAX_T) GEMM 2 tiles are GEMM2_WIDE_BLOCK_N columns wide
GEMM2_WIDE_MIN_T = _T["gemm2_wide_min_t"]
GEMM2_WIDE_BLOCK_N = _T["gemm2_wide_block_n"]
#: the router's logits split over H up to this many tokens, in ranges of at most MEGAKERNEL_SPLIT_STEPS BLOCK_H steps
MEGAKERNEL_SPLIT_MAX_T = _T["split_max_t"]
MEGAKERNEL_SPLIT_STEPS = _T["split_steps"]
#: with that split at 16+ token blocks, top-k tasks of 16 tokens up to this many experts (4 above)
MEGAKERNEL_TOPK16_MAX_E = _T["topk16_max_experts"]
#: the smallest weight tile (BLOCK_N x BLOCK_K bf16 bytes) whose TMA copies the megakernel takes
TMA_WEIGHT_TILE_BYTES = _T["tma_weight_tile_bytes"]
#: how weight-only FP8 converts e4m3 codes, in both backends (fp8_gemm.convert_code's names)
FP8_CONVERT_DEFAULT = "bits"
#: whether the FP8 megakernel's routed GEMM tasks read their e4m3 weight tiles through TMA, per FP8 mode
FP8_TMA_WEIGHTS = {"weights": False, "weights+act": True}


def _fit(n_cols: int, row_tiles: float, programs: int, choices: tuple[int, ...]) -> int:
    """The column tile in ``choices`` whose tiles fill the programs' waves best (widest within 5%)."""
    def eff(bn):
        tiles = max(1, round(row_tiles)) * -(-n_cols // bn)
        return tiles / (-(-tiles // programs) * programs)

    best = max(eff(bn) for bn in choices)
    return next(bn for bn in choices if eff(bn) >= 0.95 * best)


def route_each(mk: dict) -> dict:
    """A T = 1 config with tiles["router"]["EACH"] = 1 (unchanged unless single-token with a split router)."""
    if not (mk.get("single_token") and mk["tiles"]["router"]["SPLIT"] > 1):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"]["EACH"] = 1
    return mk


def align_each(mk: dict, T: int, H: int, K: int) -> dict:
    """A config with tiles["router"]["ALIGN_EACH"] = 1 where ALIGN_EACH_MAX_T and
    reference.tiles.align_each_takes allow it."""
    if T > ALIGN_EACH_MAX_T or not align_each_takes(T, H, K, mk["tiles"]):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"]["ALIGN_EACH"] = 1
    return mk


def megakernel_config(E: int, H: int, I: int, K: int, Is: int, T: int, *, num_sms: int,
                      interpret: bool = False, routing_given: bool = False, fp8: str | None = None) -> dict:
    """The megakernel's tiles (reference.tiles' form), warps, stages and programs per SM.

    ``fp8`` ("weights" / "weights+act"): the FP8 tiles' constraints (BLOCK_K 128; BLOCK_N 128 in
    GEMM 1 with FP8 activations). Decode (T <= 64): one row block per expert, column tiles that fill
    the programs' waves. Prefill: 128-row tiles of 128 columns."""
    mk = _megakernel_config(E, H, I, K, Is, T, num_sms=num_sms, interpret=interpret)
    if fp8 is None and not routing_given and E <= ROUTE_EACH_MAX_EXPERTS:
        mk = route_each(mk)
    if fp8 is not None:  # FP8 GEMM tiles: a weight scale block per K step; FP8 activations: whole 128-column groups
        t = mk["tiles"]
        for part in ("gemm1", "gemm2", "shared"):
            t[part]["BLOCK_K"] = FP8_BLOCK
        if fp8 == "weights+act":
            t["gemm1"]["BLOCK_N"] = t["shared"]["BLOCK_N1"] = FP8_BLOCK
        if not interpret and t["gemm1"]["BLOCK_M"] <= 64:  # decode: the stages within STAGE_BYTES, e4m3 weights
            mk["num_stages"] = decode_stages(decode_stage_bytes(t, bool(Is), weight_bytes=1), least=2)
            if fp8 == "weights" and Is and t["gemm1"]["BLOCK_M"] == 64 and t["shared"]["BLOCK_N1"] >= 128:
                mk["num_stages"] = min(mk["num_stages"], FP8_WIDE_SHARED_MAX_STAGES)
        mk["tma_weights"] = FP8_TMA_WEIGHTS[fp8]
    if routing_given:  # no logits to compute: top-k tasks only read the routing and count
        r = mk["tiles"]["router"]
        r["SPLIT"] = 1
        if T == 1:  # one token: every GEMM 1 task reads its K picks itself, not waiting for the top-k task
            r.update(TOPK_T=1, EACH=1)
        elif T <= ALIGN_EACH_MAX_T:  # small top-k tasks side by side, then GEMM 1 tasks place their rows
            r["BLOCK_T"] = r["TOPK_T"] = given_topk_tokens(T)
        else:
            r["TOPK_T"] = r["BLOCK_T"]
    return align_each(mk, T, H, K)


def given_topk_tokens(T: int) -> int:
    """Tokens per top-k task of a routing given at 1 < T <= ALIGN_EACH_MAX_T: one to 16 tokens, four
    beyond (at most 16 tasks side by side; one task aligning every token is the serial step that
    docs/megakernel.md traces)."""
    return 1 if T <= 16 else 4


def bitonic_topk_fits(tokens: int, block_e: int) -> bool:
    """Whether a top-k task of ``tokens`` rows over BLOCK_E experts takes the bitonic top-k."""
    return tokens <= BITONIC_TOPK_MAX_TOKENS and tokens * block_e <= BITONIC_TOPK_MAX_KEYS


def decode_stage_bytes(tiles: dict, shared: bool, *, weight_bytes: int = 2, act_bytes: int = 2) -> int:
    """Shared memory of one pipeline stage of the largest GEMM task (A tile and weight tiles)."""
    g1, g2, sh = tiles["gemm1"], tiles["gemm2"], tiles["shared"]
    bm = g1["BLOCK_M"]
    return max(bm * g1["BLOCK_K"] * act_bytes + 2 * g1["BLOCK_K"] * g1["BLOCK_N"] * weight_bytes,
               bm * g2["BLOCK_K"] * act_bytes + g2["BLOCK_K"] * g2["BLOCK_N"] * weight_bytes,
               (sh["BLOCK_M"] * sh["BLOCK_K"] * act_bytes + 2 * sh["BLOCK_K"] * sh["BLOCK_N1"] * weight_bytes)
               if shared else 0)


def deep_gemm2_block_k(tiles: dict, shared: bool, *, weight_bytes: int = 2, act_bytes: int = 2) -> int:
    """GEMM 2's BLOCK_K for a decode megakernel (BLOCK_M <= 64): the deepest power of two up to
    GEMM2_MAX_BLOCK_K that keeps the stage count the largest task's stage sets."""
    t = {k: dict(v) for k, v in tiles.items()}
    base = decode_stages(decode_stage_bytes(t, shared, weight_bytes=weight_bytes, act_bytes=act_bytes))
    best = k = t["gemm2"]["BLOCK_K"]
    while 2 * k <= GEMM2_MAX_BLOCK_K:
        k *= 2
        t["gemm2"]["BLOCK_K"] = k
        if decode_stages(decode_stage_bytes(t, shared, weight_bytes=weight_bytes, act_bytes=act_bytes)) < base:
            break
        best = k
    return best


def decode_stages(stage_bytes: int, *, least: int = 3, most: int = 6) -> int:
    """Pipeline stages of the decode megakernel: as many as fit in STAGE_BYTES, ``least`` to ``most``."""
    return max(least, min(most, 1 + STAGE_BYTES // stage_bytes))


def _interpret_config(T: int, bt: int, block_h: int, split: int, combine: dict) -> dict:
    """Tiny tiles, as the multi-launch path's interpreter configs; top-k groups of 4 (1 at T = 1)."""
    topk_t = (1 if T == 1 else 4) if split > 1 else bt
    return {"tiles": {"router": {"BLOCK_T": bt, "BLOCK_H": block_h, "SPLIT": max(split, 1), "TOPK_T": topk_t},
                      "gemm1": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32},
                      "gemm2": {"BLOCK_N": 16, "BLOCK_K": 32},
                      "shared": {"BLOCK_M": 16, "BLOCK_N1": 16, "BLOCK_N2": 16, "BLOCK_K": 32},
                      "combine": combine,
                      "order": {"GROUP_M": 2}},
            "num_warps": 4, "num_stages": 1, "occupancy": 1}


def _decode_tiles(E: int, H: int, I: int, K: int, Is: int, T: int, bm: int, blocks: float, P: int) -> tuple:
    """(tiles of GEMM 1, GEMM 2 and the shared MLP, warps, stages) for BLOCK_M <= 64."""
    bn1 = _fit(I, blocks, P, (128, 64, 32))
    bn2 = _fit(H, blocks, P, (128, 64, 32))
    bk = 128 if bm == 16 else 64
    if bm == 16:  # no 32-column tiles at decode: their 8 KiB weight tiles are too small for TMA copies
        bn1, bn2 = max(bn1, 64), max(bn2, 64)
    sbn1 = _fit(Is, -(-T // bm), P, (128, 64, 32)) if Is else 64
    sbn2 = _fit(H, -(-T // bm), P, (128, 64, 32)) if Is else 64
    if GEMM2_WIDE_MIN_T < T <= MEGAKERNEL_SPLIT_MAX_T:
        bn2 = GEMM2_WIDE_BLOCK_N
    tiles = {"gemm1": {"BLOCK_M": bm, "BLOCK_N": bn1, "BLOCK_K": bk}, "gemm2": {"BLOCK_N": bn2, "BLOCK_K": bk},
             "shared": {"BLOCK_M": bm, "BLOCK_N1": sbn1, "BLOCK_K": bk}}
    tiles["gemm2"]["BLOCK_K"] = deep_gemm2_block_k(tiles, bool(Is)) if bm == 16 else bk
    tiles["shared"]["BLOCK_N2"] = sbn2
    warps = 8 if bm == 64 else 4  # 64-row blocks: GEMM 1's two 64 x 128 accumulators over 8 warps
    return tiles, warps, decode_stages(decode_stage_bytes(tiles, bool(Is)))


def _megakernel_config(E: int, H: int, I: int, K: int, Is: int, T: int, *, num_sms: int, interpret: bool) -> dict:
    from .plan import combine_launch

    bt = router_block_t(T, E)
    block_h = router_block_h(E, H, interpret=interpret)
    split = decode_router_split(T, E, H, interpret=interpret)
    cl = combine_launch(T, H)
    combine = {"BLOCK_T": cl["BLOCK_T"], "BLOCK_H": cl["BLOCK_H"]}
    if interpret:
        return _interpret_config(T, bt, block_h, split, combine)
    P = num_sms
    if split == 0 and T <= MEGAKERNEL_SPLIT_MAX_T and H >= 1024:  # 16 token blocks: each walked all of H
        steps = -(-H // block_h)
        split = max(4, -(-steps // MEGAKERNEL_SPLIT_STEPS))
    if -(-T // bt) <= 4 and H >= 1024:  # decode: router weights over many programs, ~48 KB of weights each
        split = max(split, min(64, H // block_h, -(-E * H * 2 // (48 << 10))))
    if T <= 16:
        bm = 16
    elif T <= 64 or 1.5 * T * K / E <= 64:
        bm = 64
    else:
        bm = 128
    touched = E * (1 - (1 - K / E) ** T)  # experts a uniform routing of T tokens touches, expected
    blocks = max(touched, T * K / bm)
    if bm <= 64:
        tiles, warps, stages = _decode_tiles(E, H, I, K, Is, T, bm, blocks, P)
    else:
        bn2 = GEMM2_WIDE_BLOCK_N if T <= MEGAKERNEL_SPLIT_MAX_T else 128
        tiles = {"gemm1": {"BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 64}, "gemm2": {"BLOCK_N": bn2, "BLOCK_K": 64},
                 "shared": {"BLOCK_M": bm, "BLOCK_N1": 128, "BLOCK_N2": 128, "BLOCK_K": 64}}
        warps, stages = 8, 3
    # top-k tasks: as many rows as tokens at decode, past 16 tokens groups of 4 (16 with a split router)
    topk_t = (1 if T <= 8 else _pow2(T) if T <= 16 else 4) if split > 1 else bt
    if split > 1 and -(-T // bt) >= 16 and E <= MEGAKERNEL_TOPK16_MAX_E:
        topk_t = 16
    tiles = {"router": {"BLOCK_T": bt, "BLOCK_H": block_h, "SPLIT": max(split, 1), "TOPK_T": topk_t}, **tiles,
             "combine": combine, "order": {"GROUP_M": 8}}
    return {"routed_only": not Is, "single_token": T == 1, "tiles": tiles, "num_warps": warps, "num_stages": stages,
            "occupancy": 1,
            "tma_weights": megakernel_tma_weights(tiles["gemm1"]["BLOCK_N"], tiles["gemm2"]["BLOCK_N"],
                                                  tiles["gemm1"]["BLOCK_K"])}


def megakernel_weight_loads(mk: dict) -> str:
    """The cost model's name of how the GEMM tasks load weights: "tma" or "pointer"."""
    return "tma" if mk.get("tma_weights") else "pointer"


def megakernel_tma_weights(bn1: int, bn2: int, bk: int) -> bool:
    """Whether the routed GEMM tasks read weights through TMA ("tma_weights"): both GEMMs' weight
    tiles at least TMA_WEIGHT_TILE_BYTES."""
    return min(bn1, bn2) * bk * 2 >= TMA_WEIGHT_TILE_BYTES
