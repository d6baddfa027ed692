"""How the FP8 GEMMs' tiles are sized from a bf16 entry: ``fp8_entry``, the one place.

Shape legend: H hidden, I expert width, BM/BN/BK tile sizes, KB = 128 (FP8_BLOCK: a weight scale
block, an activation group).

Pure Python, read by plan.py. Families (docs/kernels.md): pointer (fp8_gemm.py; non-persistent
entries and Llama 4's GEMM 1), fp8a (fp8_act_tma.py; config key "FP8A") and fp8w (fp8w_tma.py;
"SWAP_AB") at "tma_persistent" entries with 16-byte e4m3 row strides (``fp8_tma_ok``). Choices
under study: ``FP8Options``, passed in (plan.static_plan's ``fp8_options``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..reference.sizes import FP8_BLOCK, dtype_bytes
from .thresholds import Thresholds

FP8_MODES = (None, "weights", "weights+act")

_TH = Thresholds("fp8")  # configs/thresholds.json: each value's unit and evidence
#: shared memory the FP8 GEMMs' pipeline stages may take, bytes
FP8_SMEM_BUDGET_BYTES = _TH["FP8_SMEM_BUDGET_BYTES"]
#: row tiles of the pointer FP8 GEMMs at most
FP8_MAX_BLOCK_M = _TH["FP8_MAX_BLOCK_M"]
#: row tiles, pipeline stages and GEMM 2 column tiles of the fp8a GEMMs at most (without a tile set)
FP8A_MAX_BLOCK_M = _TH["FP8A_MAX_BLOCK_M"]
FP8A_STAGES = _TH["FP8A_STAGES"]
FP8A_MAX_BLOCK_N2 = _TH["FP8A_MAX_BLOCK_N2"]
#: the fp8a tile set at the bf16 entries of FP8A_DEFAULT_TILES_MIN_M rows or more (the prefill buckets)
FP8A_DEFAULT_TILES = _TH["FP8A_DEFAULT_TILES"]
FP8A_DEFAULT_TILES_MIN_M = _TH["FP8A_DEFAULT_TILES_MIN_M"]
#: row tiles and K tile of the fp8w GEMMs at most
FP8W_TMA_MAX_BLOCK_M = _TH["FP8W_TMA_MAX_BLOCK_M"]
FP8W_TMA_BLOCK_K = _TH["FP8W_TMA_BLOCK_K"]
#: whether the fp8w GEMMs swap their MMA operands by default, and their column tiles at most when swapped
FP8W_TMA_SWAP_AB = _TH["FP8W_TMA_SWAP_AB"]
FP8W_TMA_SWAP_MAX_BLOCK_N = _TH["FP8W_TMA_SWAP_MAX_BLOCK_N"]
_TH.close()

#: 128-row tile sets of the fp8a GEMMs: name -> the keys set on {"gemm1", "gemm2"} (docs/kernels.md)
FP8A_TILE_CANDIDATES = {
    "m128": {"gemm1": {"BLOCK_M": 128, "PIPE": 0}, "gemm2": {"BLOCK_M": 128, "BLOCK_N": 128, "PIPE": 1}},
    "m128c": {"gemm1": {"BLOCK_M": 128, "PIPE": 0}, "gemm2": {"BLOCK_M": 128, "BLOCK_N": 256, "PIPE": 2}},
}
#: the tile-set name for "no set": the 64-row fp8a tiles everywhere
FP8A_NO_CANDIDATE = "m64"


@dataclass(frozen=True)
class FP8Options:
    """The FP8 GEMMs' choices a benchmark may vary (defaults: what the layer runs). fp8a_tiles: a
    name of FP8A_TILE_CANDIDATES or FP8A_NO_CANDIDATE (None: the default); swap_ab: fp8w's SWAP_AB."""

    fp8a_tiles: str | None = None
    swap_ab: bool = FP8W_TMA_SWAP_AB

    def __post_init__(self):
        if self.fp8a_tiles not in (None, FP8A_NO_CANDIDATE, *FP8A_TILE_CANDIDATES):
            raise ValueError(f"unknown fp8a tile set {self.fp8a_tiles!r}; known: "
                             f"{[FP8A_NO_CANDIDATE, *sorted(FP8A_TILE_CANDIDATES)]} or None (the default)")


DEFAULT_OPTIONS = FP8Options()


def fp8a_tiles_for(entry: dict, x_once: bool = True, options: FP8Options = DEFAULT_OPTIONS) -> str | None:
    """The fp8a tile set for bf16 ``entry`` (None: the 64-row tiles): ``options.fp8a_tiles``, else
    FP8A_DEFAULT_TILES from FP8A_DEFAULT_TILES_MIN_M rows; never unless x is quantized once."""
    if not x_once:
        return None
    name = options.fp8a_tiles or (FP8A_DEFAULT_TILES if entry["gemm1"]["BLOCK_M"] >= FP8A_DEFAULT_TILES_MIN_M
                                  else None)
    return None if name == FP8A_NO_CANDIDATE else name


def fp8a_tiles(name: str) -> dict:
    """FP8A_TILE_CANDIDATES[name] (a copy), checked: both GEMMs set the same BLOCK_M."""
    if name not in FP8A_TILE_CANDIDATES:
        raise ValueError(f"unknown fp8a tile candidate {name!r}; known: {sorted(FP8A_TILE_CANDIDATES)}")
    c = FP8A_TILE_CANDIDATES[name]
    if c["gemm1"].get("BLOCK_M") != c["gemm2"].get("BLOCK_M"):
        raise ValueError(f"fp8a tile candidate {name!r}: both GEMMs share BLOCK_M (the align pads to it), got {c}")
    return {g: dict(c[g]) for g in ("gemm1", "gemm2")}


def _fp8a_candidate(g1: dict, g2: dict, name: str) -> None:
    """Set tile set ``name`` on fp8a entries g1, g2 in place, stages within FP8_SMEM_BUDGET_BYTES."""
    over = fp8a_tiles(name)
    for g, o, n_w in ((g1, over["gemm1"], 2), (g2, over["gemm2"], 1)):
        g.update(o)
        stage = g["BLOCK_M"] * g["BLOCK_K"] + n_w * g["BLOCK_N"] * g["BLOCK_K"]
        g["num_stages"] = max(1, min(o.get("num_stages", FP8A_STAGES), FP8_SMEM_BUDGET_BYTES // stage))


def fp8_tma_ok(g: dict, depth: int | None) -> bool:
    """Whether bf16 GEMM config ``g`` becomes a persistent FP8 GEMM (TMA-able, no split-K)."""
    return (g.get("variant") == "tma_persistent" and g.get("SPLIT_K", 1) == 1 and depth is not None
            and depth % 16 == 0)


def fp8_entry(entry: dict, fp8: str | None, dtype: str = "bfloat16", *, depths: tuple[int, int] | None = None,
              x_once: bool = True, options: FP8Options = DEFAULT_OPTIONS) -> dict:
    """A {"gemm1", "gemm2"} entry as the FP8 GEMMs take it, from bf16 ``entry``.

    Pointer GEMMs: BLOCK_K = FP8_BLOCK (BLOCK_N too in GEMM 1 with FP8 activations), no split-K in
    GEMM 1. A "tma_persistent" GEMM (``fp8_tma_ok`` on ``depths`` = (H, I)) stays persistent as
    fp8a (FP8 activations; GEMM 1 only where ``x_once``) or fp8w (weight-only), within the module's
    limits; num_stages cut to FP8_SMEM_BUDGET_BYTES."""
    if fp8 is None:
        return entry
    xb = dtype_bytes(dtype)
    H, I = depths or (None, None)
    act = fp8 == "weights+act"
    v1 = "tma_persistent" if fp8_tma_ok(entry["gemm1"], H) and (x_once or not act) else "pointer"
    v2 = "tma_persistent" if fp8_tma_ok(entry["gemm2"], I) else "pointer"
    both = v1 == v2 == "tma_persistent"
    bm = min(entry["gemm1"]["BLOCK_M"],
             (FP8A_MAX_BLOCK_M if act else FP8W_TMA_MAX_BLOCK_M) if both else FP8_MAX_BLOCK_M)
    bk_tma = FP8_BLOCK if act else FP8W_TMA_BLOCK_K
    g1 = dict(entry["gemm1"], BLOCK_M=bm, BLOCK_K=bk_tma if v1 == "tma_persistent" else FP8_BLOCK, SPLIT_K=1,
              variant=v1)
    if act:
        g1["BLOCK_N"] = FP8_BLOCK
    g2 = dict(entry["gemm2"], BLOCK_M=bm, BLOCK_K=bk_tma if v2 == "tma_persistent" else FP8_BLOCK, variant=v2)
    for g in (g1, g2):
        if g["variant"] != "tma_persistent":
            continue
        if act:
            g.update(FP8A=1, PIPE=1, num_stages=max(g["num_stages"], FP8A_STAGES))
        else:
            g["SWAP_AB"] = int(options.swap_ab)
            if options.swap_ab:
                g["BLOCK_N"] = min(g["BLOCK_N"], FP8W_TMA_SWAP_MAX_BLOCK_N)
    if act and v2 == "tma_persistent":
        g2["BLOCK_N"] = min(max(2, 1 << (int(g2["BLOCK_N"]) - 1).bit_length()), FP8A_MAX_BLOCK_N2)
    a2 = 1 if act else xb
    for g, a_bytes, n_w in ((g1, xb, 2), (g2, a2, 1)):
        w_tile = n_w * g["BLOCK_N"] * g["BLOCK_K"]
        stage = g["BLOCK_M"] * g["BLOCK_K"] * a_bytes + w_tile
        converted = w_tile * xb if g["variant"] == "tma_persistent" and not act else 0
        g["num_stages"] = max(1, min(g["num_stages"], (FP8_SMEM_BUDGET_BYTES - converted) // stage))
    tiles = fp8a_tiles_for(entry, x_once, options) if act and both else None
    if tiles:
        _fp8a_candidate(g1, g2, tiles)
    return {"gemm1": g1, "gemm2": g2}
