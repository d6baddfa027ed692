"""Launch configurations of the MoE kernels: tuned JSON beside this file, heuristics otherwise.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.

Pure Python (no torch, no triton), so that ``plan.py`` and the simulator read the same choice the
kernels launch with.

A tuned file ``configs/<gpu>__<dtype>__triton-<version>.json`` holds::

    {"gpu": "NVIDIA H200", "dtype": "bfloat16", "triton": "3.6.0",
     "configs": {"E128_H2048_I768_K8": {"1": {"gemm1": {...}, "gemm2": {...}}, "64": {...}}}}

keyed by shape and by the token-count bucket (``T_BUCKETS``); a lookup takes the nearest bucket
(in log T). Each GEMM config has exactly the keys of ``GEMM_KEYS`` (and optionally those of
``GEMM_OPTIONAL``); both GEMMs share BLOCK_M (the align kernels pad experts to it). Unknown keys or
a disagreeing BLOCK_M are errors, loudly.

A GEMM config's ``"variant"`` picks the kernel family (grouped_gemm.py): ``"pointer"`` (the
default: one program per tile, weights through pointer loads) or ``"tma_persistent"`` (weights
through TMA tensor descriptors, one program per SM walking the routed tiles; prefill, no split-K).
TMA needs 16-byte row strides: where a GEMM's reduction length times the element size is not a
multiple of 16 bytes, ``select_config`` falls back to "pointer" for that GEMM (``resolve_variants``).
"""

from __future__ import annotations

import copy
import json
import math
import re
from functools import cache
from pathlib import Path

from ..reference.sizes import FP8_BLOCK
from ..reference.tiles import align_each_takes, route_each_takes
from .thresholds import Thresholds

CONFIG_DIR = Path(__file__).parent / "configs"
T_BUCKETS = (1, 8, 64, 512, 4096, 16384)
GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
#: optional keys and their defaults: SPLIT_K > 1 splits the reduction over programs (decode);
#: variant: the kernel family (module docstring); FLATTEN (0 / 1, "tma_persistent" only): the
#: persistent walk over tiles flattened with each tile's K loop into one pipelined loop
#: (``tl.range(..., flatten=True)``: the next tile's loads start during this tile's epilogue)
GEMM_OPTIONAL = {"SPLIT_K": 1, "variant": "pointer", "FLATTEN": 0}
#: the optional keys that are switches (0 or 1), not positive sizes
GEMM_SWITCHES = ("FLATTEN",)
VARIANTS = ("pointer", "tma_persistent")
#: persistent programs where the SM count is not read from a device: the interpreter (a few, so
#: that tests see programs walking several tiles) and an H200 (launch_plan without a device)
INTERPRETER_SMS = 3
DEFAULT_SMS = 132
FILE_KEYS = ("gpu", "dtype", "triton", "configs")
#: optional top-level keys: "backend" {shape key: {bucket: "megakernel" | "multi"}} for backend="auto"
FILE_OPTIONAL = ("backend", "backend_fp8")
#: the FP8 modes "backend_fp8" keys its tables by (moe.fp8_mode's names)
FP8_MODES = ("weights", "weights+act")


class KernelConfigError(ValueError):
    """A tuned-config file or entry is malformed; the message names the file and key."""


def shape_key(E: int, H: int, I: int, K: int) -> str:
    return f"E{E}_H{H}_I{I}_K{K}"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")


def config_path(gpu: str, dtype: str, triton_version: str) -> Path:
    return CONFIG_DIR / f"{slug(gpu)}__{dtype}__triton-{triton_version}.json"


def pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def bucket_of(T: int) -> int:
    """The tuned bucket nearest T in log scale (T=0 and 1 give 1)."""
    lt = math.log(max(T, 1))
    return min(T_BUCKETS, key=lambda b: (abs(math.log(b) - lt), b))


def check_gemm_config(cfg: dict, where: str) -> dict:
    if not isinstance(cfg, dict):
        raise KernelConfigError(f"{where}: a GEMM config must be an object, got {cfg!r}")
    unknown = sorted(set(cfg) - set(GEMM_KEYS) - set(GEMM_OPTIONAL))
    missing = sorted(set(GEMM_KEYS) - set(cfg))
    if unknown or missing:
        raise KernelConfigError(f"{where}: unknown keys {unknown}, missing keys {missing}; the kernel takes "
                                f"{list(GEMM_KEYS)} and optionally {list(GEMM_OPTIONAL)}")
    for k, v in cfg.items():
        if k == "variant":
            if v not in VARIANTS:
                raise KernelConfigError(f"{where}: variant must be one of {list(VARIANTS)}, got {v!r}")
            continue
        if k in GEMM_SWITCHES:
            if isinstance(v, bool) or v not in (0, 1):
                raise KernelConfigError(f"{where}: {k} must be 0 or 1, got {v!r}")
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KernelConfigError(f"{where}: {k} must be a positive integer, got {v!r}")
    if cfg.get("variant") == "tma_persistent" and cfg.get("SPLIT_K", 1) != 1:
        raise KernelConfigError(f"{where}: variant 'tma_persistent' has no split-K, got SPLIT_K={cfg['SPLIT_K']}")
    if cfg.get("FLATTEN", 0) and cfg.get("variant", "pointer") != "tma_persistent":
        raise KernelConfigError(f"{where}: FLATTEN=1 flattens a persistent loop: it needs variant "
                                f"'tma_persistent', got {cfg.get('variant', 'pointer')!r}")
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if cfg[k] & (cfg[k] - 1) or cfg[k] < 16:
            raise KernelConfigError(f"{where}: {k}={cfg[k]} must be a power of two >= 16")
    return {**GEMM_OPTIONAL, **cfg}


def check_entry(entry: dict, where: str) -> dict:
    if not isinstance(entry, dict) or set(entry) != {"gemm1", "gemm2"}:
        raise KernelConfigError(f"{where}: an entry must have exactly the keys ['gemm1', 'gemm2'], got {entry!r}")
    g1 = check_gemm_config(entry["gemm1"], where + ".gemm1")
    g2 = check_gemm_config(entry["gemm2"], where + ".gemm2")
    if g1["BLOCK_M"] != g2["BLOCK_M"]:
        raise KernelConfigError(f"{where}: gemm1 and gemm2 must share BLOCK_M, got {g1['BLOCK_M']} and {g2['BLOCK_M']}")
    return {"gemm1": g1, "gemm2": g2}


def load_file(path: Path) -> dict:
    """Read and check one tuned file; returns {shape_key: {bucket: entry}}."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise KernelConfigError(f"{path}: cannot read tuned configs: {exc}") from None
    if not isinstance(d, dict) or not set(FILE_KEYS) <= set(d) <= set(FILE_KEYS) | set(FILE_OPTIONAL):
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise KernelConfigError(f"{path}: top-level keys must be {list(FILE_KEYS)}, got {got}")
    out = {}
    for sk, buckets in d["configs"].items():
        if not re.fullmatch(r"E\d+_H\d+_I\d+_K\d+", sk):
            raise KernelConfigError(f"{path}: bad shape key {sk!r} (want like 'E128_H2048_I768_K8')")
        out[sk] = {}
        for b, entry in buckets.items():
            if not b.isdigit() or int(b) not in T_BUCKETS:
                raise KernelConfigError(f"{path}: {sk}: bucket {b!r} is not one of {T_BUCKETS}")
            out[sk][int(b)] = check_entry(entry, f"{path}: {sk}[{b}]")
    return out


@cache
def _tuned(gpu: str, dtype: str, triton_version: str) -> dict:
    p = config_path(gpu, dtype, triton_version)
    return load_file(p) if p.exists() else {}


def default_config(E: int, H: int, I: int, K: int, T: int, *, interpret: bool = False) -> dict:
    """A heuristic entry when nothing is tuned: small row blocks and narrow column tiles for decode
    (weight streaming over many programs), 128-row tiles for prefill."""
    if interpret:  # tiny tiles; split-K on odd T so that the tests run both paths
        c = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1, SPLIT_K=2 if T % 3 == 1 else 1)
        return {"gemm1": dict(c), "gemm2": dict(c)}
    rows = 1.5 * T * K / max(E, 1)  # a busy expert has more than the mean
    if rows <= 16:
        bm = 16
    elif rows <= 32:
        bm = 32
    elif rows <= 96:
        bm = 64
    else:
        bm = 128
    if bm <= 32:
        g1 = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
        g2 = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    elif bm == 64:
        g1 = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
        g2 = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        g1 = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
        g2 = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    g1 = {**GEMM_OPTIONAL, **g1}
    g2 = {**GEMM_OPTIONAL, **g2}
    return {"gemm1": g1, "gemm2": g2}


def select_config(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                  interpret: bool = False) -> dict:
    """The entry the kernels launch with for this shape and T: tuned if present, else the heuristic
    (each GEMM's variant resolved for this H, I and dtype: ``resolve_variants``)."""
    if not interpret:
        tuned = _tuned(gpu, dtype, triton_version).get(shape_key(E, H, I, K))
        if tuned:
            b = bucket_of(T)
            if b not in tuned:
                b = min(tuned, key=lambda x: abs(math.log(x) - math.log(max(T, 1))))
            return resolve_variants({k: dict(v) for k, v in tuned[b].items()}, H, I, dtype)
    return resolve_variants(default_config(E, H, I, K, T, interpret=interpret), H, I, dtype)


_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def tma_ok(depth: int, dtype: str) -> bool:
    """Whether rows of ``depth`` elements of ``dtype`` can be read through a TMA descriptor (16-byte strides)."""
    return depth * _ELEMENT_BYTES.get(dtype, 2) % 16 == 0


def resolve_variants(entry: dict, H: int, I: int, dtype: str) -> dict:
    """``entry`` with every GEMM's variant key set: "tma_persistent" only where TMA can read its
    operands (GEMM 1 reduces over H, GEMM 2 over I), "pointer" otherwise."""
    out = {}
    for name, depth in (("gemm1", H), ("gemm2", I)):
        g = {**GEMM_OPTIONAL, **entry[name]}
        if g["variant"] == "tma_persistent" and not tma_ok(depth, dtype):
            g["variant"], g["FLATTEN"] = "pointer", 0
        out[name] = g
    return out


def tma_config(gemm: str, block_m: int, *, interpret: bool = False) -> dict:
    """A "tma_persistent" GEMM config for row tiles of ``block_m`` (64, 128 or 256).

    Sized so that both accumulators fit the registers (GEMM 1 keeps gate and up: 2 x BM x BN fp32
    over the warps, about 128 per thread) and the stages fit Hopper's 227 KB of shared memory (per
    stage: A BM x BK plus B (2 x) BN x BK, bf16): 40-48 KB a stage, 3-4 stages. The interpreter's
    tiles are tiny, as its other configs."""
    if block_m not in (16, 64, 128, 256):
        raise ValueError(f"tma_config: block_m must be 64, 128 or 256 (16 in the interpreter), got {block_m}")
    if interpret:
        c = dict(BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    elif gemm == "gemm1":  # (BLOCK_N, warps, stages); the gate and up tiles make it 2 x BLOCK_N wide
        bn, nw, ns = {64: (128, 4, 4), 128: (128, 8, 4), 256: (64, 8, 4)}[block_m]
        c = dict(BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, num_warps=nw, num_stages=ns)
    else:
        bn, nw, ns = {64: (128, 4, 4), 128: (256, 8, 3), 256: (128, 8, 4)}[block_m]
        c = dict(BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, num_warps=nw, num_stages=ns)
    return {**GEMM_OPTIONAL, **c, "variant": "tma_persistent"}


def tma_entry(block_m: int, *, interpret: bool = False) -> dict:
    """Both GEMMs of the "tma_persistent" variant at BLOCK_M ``block_m`` (a candidate for a T bucket)."""
    return {"gemm1": tma_config("gemm1", block_m, interpret=interpret),
            "gemm2": tma_config("gemm2", block_m, interpret=interpret)}


def candidate_entry(name: str, *, interpret: bool = False) -> dict | None:
    """The {"gemm1", "gemm2"} entry a benchmark candidate names: "current" -> None (the tuned
    table's entry, what moe_forward runs today), "tmaNN" -> tma_entry(NN); after a colon,
    comma-separated overrides, for both GEMMs (``num_stages=3``) or one (``g2.BLOCK_N=128``):
    ``"tma128:num_stages=3,g1.BLOCK_N=64"``. The result is checked as a tuned entry is."""
    base, _, extra = name.partition(":")
    if base == "current":
        if extra:
            raise KernelConfigError(f"candidate {name!r}: 'current' takes no overrides")
        return None
    if not (base.startswith("tma") and base[3:].isdigit()):
        raise KernelConfigError(f"candidate {name!r}: want 'current' or 'tmaNN' (NN = 64, 128, 256), "
                                "with optional ':key=value,...' overrides")
    try:
        entry = tma_entry(int(base[3:]), interpret=interpret)
    except ValueError as exc:
        raise KernelConfigError(f"candidate {name!r}: {exc}") from None
    for item in filter(None, extra.split(",")):
        key, eq, val = item.partition("=")
        if not eq or not val.isdigit():
            raise KernelConfigError(f"candidate {name!r}: override {item!r} is not key=integer")
        gemms, key = ((["gemm" + key[1]], key[3:]) if key[:3] in ("g1.", "g2.") else (["gemm1", "gemm2"], key))
        for g in gemms:
            entry[g][key] = int(val)
    return check_entry(entry, f"candidate {name!r}")


def router_block_t(T: int, E: int) -> int:
    """Tokens per routing program, which is also the align kernels' chunk."""
    return 16 if T <= 16 else 32


_TH = Thresholds("router")  # configs/thresholds.json: each value's unit and evidence
#: scores of the routing block one thread holds at most (sizes the routing program's warps)
ROUTER_SCORES_PER_THREAD = _TH["ROUTER_SCORES_PER_THREAD"]
#: the routing program's warps at most
ROUTER_MAX_WARPS = _TH["ROUTER_MAX_WARPS"]
#: the routing program's warps where it walks H itself: (over 128 experts, up to 128)
ROUTER_WALK_WARPS = _TH["ROUTER_WALK_WARPS"]
#: widest score row (BLOCK_E) whose top-k takes K maxima; wider ones take the bitonic top-k
ROUTER_MAXIMA_MAX_E = _TH["ROUTER_MAXIMA_MAX_E"]
#: H columns per step of a walking routing program at prefill (from WALK_WIDE_MIN_T tokens, up to
#: WALK_WIDE_MAX_E experts)
WALK_WIDE_BLOCK_H = _TH["WALK_WIDE_BLOCK_H"]
WALK_WIDE_MIN_T = _TH["WALK_WIDE_MIN_T"]
WALK_WIDE_MAX_E = _TH["WALK_WIDE_MAX_E"]
#: token blocks from which the router's logits are a prefill launch of their own, where a routing
#: program would walk more than ROUTER_PREFILL_WALK_STEPS steps of H
ROUTER_PREFILL_BLOCKS = _TH["ROUTER_PREFILL_BLOCKS"]
ROUTER_PREFILL_WALK_STEPS = _TH["ROUTER_PREFILL_WALK_STEPS"]
#: tokens and H columns per program step of that launch
ROUTER_PREFILL_T = _TH["ROUTER_PREFILL_T"]
ROUTER_PREFILL_H = _TH["ROUTER_PREFILL_H"]
#: bytes of that launch's fp32 (tokens, BLOCK_E) accumulator at most (fewer tokens past it)
ROUTER_PREFILL_ACC_BYTES = _TH["ROUTER_PREFILL_ACC_BYTES"]
#: BLOCK_H steps per H range of a prefill split at least
ROUTER_PREFILL_MIN_STEPS = _TH["ROUTER_PREFILL_MIN_STEPS"]
_TH.close()


def router_warps(block_t: int, block_e: int, walks: bool = False) -> int:
    """Warps of the multi-launch router's routing program: from the partials of a logits launch,
    ROUTER_SCORES_PER_THREAD; walking H itself (``walks``: its loop of loads and MMAs is the program's
    time), ROUTER_WALK_WARPS."""
    if walks:
        return ROUTER_WALK_WARPS[block_e <= 128]
    want = -(-block_t * block_e // (32 * ROUTER_SCORES_PER_THREAD))
    return max(4, min(ROUTER_MAX_WARPS, pow2(want)))


def router_bitonic(block_e: int, k: int, chunks: int) -> bool:
    """Whether the routing programs of ``chunks`` token blocks take the bitonic top-k (ROUTER_MAXIMA_MAX_E)."""
    return k > 1 and block_e > ROUTER_MAXIMA_MAX_E and chunks > 1


def router_block_h(E: int, H: int, *, interpret: bool = False) -> int:
    """H columns per step of the router's logit loop (the interpreter: fewer, larger steps)."""
    if interpret:
        return max(16, min(128, pow2(H)))
    return 64 if max(16, pow2(E)) <= 128 else 32


def walk_block_h(T: int, E: int, H: int, *, interpret: bool = False) -> int:
    """H columns per step of a multi-launch routing program that walks H itself (no logits launch):
    WALK_WIDE_BLOCK_H at prefill (T >= WALK_WIDE_MIN_T, at most WALK_WIDE_MAX_E experts), else
    router_block_h."""
    if not interpret and T >= WALK_WIDE_MIN_T and max(16, pow2(E)) <= WALK_WIDE_MAX_E:
        return WALK_WIDE_BLOCK_H
    return router_block_h(E, H, interpret=interpret)


def decode_router_split(T: int, E: int, H: int, *, interpret: bool = False) -> int:
    """H ranges the decode router's logits are split into (0: none; the megakernel's router tasks
    and the multi-launch path below ROUTER_PREFILL_BLOCKS token blocks). Decode has one or two token
    blocks, and one program walking all of H for them is a serial chain; split it over ~8 steps each."""
    C = -(-T // router_block_t(T, E)) if T else 0
    if interpret:  # tests: split the one-block batches (T <= 16) in two, keep the rest whole
        return 2 if C == 1 and H >= 32 else 0
    if C >= 16 or H < 1024:
        return 0
    block_h = router_block_h(E, H)
    return max(2, min(64, -(-H // (8 * block_h))))  # about 8 steps each (docs/kernels.md)


def router_prefill(T: int, E: int, H: int, *, interpret: bool = False) -> bool:
    """Whether the multi-launch router at T tokens takes the prefill logits launch (the interpreter:
    whatever the walk's length)."""
    C = -(-T // router_block_t(T, E)) if T else 0
    if interpret:
        return C >= 2
    return C >= ROUTER_PREFILL_BLOCKS and -(-H // router_block_h(E, H)) > ROUTER_PREFILL_WALK_STEPS


def router_logits_tile(T: int, E: int, H: int, *, interpret: bool = False,
                       tiles: bool | None = None) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_H) of the multi-launch router's split-H logits launch: the routing block and
    router_block_h at decode; ROUTER_PREFILL_T x ROUTER_PREFILL_H with ``tiles`` (default
    router_prefill; fewer tokens where the (tokens, experts) fp32 tile would pass
    ROUTER_PREFILL_ACC_BYTES; the interpreter: 16 x its router_block_h, small tiles)."""
    if not (router_prefill(T, E, H, interpret=interpret) if tiles is None else tiles):
        return router_block_t(T, E), router_block_h(E, H, interpret=interpret)
    if interpret:
        return 16, router_block_h(E, H, interpret=True)
    return min(ROUTER_PREFILL_T, max(16, ROUTER_PREFILL_ACC_BYTES // (4 * max(16, pow2(E))))), ROUTER_PREFILL_H


def prefill_router_split(T: int, E: int, H: int, *, interpret: bool = False, num_sms: int = DEFAULT_SMS) -> int:
    """H ranges of the prefill logits launch (router_logits_tile's 128-token tiles): split until the
    tiles x ranges fill num_sms programs, each range keeping ROUTER_PREFILL_MIN_STEPS steps, at least 1
    (the interpreter: 2 ranges where H has 2 steps)."""
    bt, bh = router_logits_tile(T, E, H, interpret=interpret, tiles=True)
    steps = -(-H // bh)
    if interpret:
        return min(2, steps)
    return max(1, min(num_sms // -(-T // bt), steps // ROUTER_PREFILL_MIN_STEPS))


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """P_max: the most padded rows any routing of num_pairs pairs can need (a multiple of block_m)."""
    if num_pairs == 0:
        return 0
    touched = min(num_experts, num_pairs)
    return -(-(num_pairs + touched * (block_m - 1)) // block_m) * block_m


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fit(n_cols: int, row_tiles: float, programs: int, choices: tuple[int, ...]) -> int:
    """The column tile in ``choices`` (widest first) whose tiles fill the programs' waves best:
    the widest within 5% of the best wave efficiency tiles / (waves x programs)."""
    def eff(bn):
        tiles = max(1, round(row_tiles)) * -(-n_cols // bn)
        return tiles / (-(-tiles // programs) * programs)

    best = max(eff(bn) for bn in choices)
    return next(bn for bn in choices if eff(bn) >= 0.95 * best)


#: expert_slice tasks (reference/tiles.py "With I sliced", kernels/slice_tile.py) up to this T
#: by default; 0 until an H200 run measures them against the two-GEMM tasks (variant "slice")
SLICE_MAX_T = 0
#: the widest slice (its padded width, GEMM 1's BLOCK_N, is a power of two up to this)
SLICE_MAX = 128


def slice_width(I: int, blocks: float, programs: int, other_columns: int = 0, exact: bool = False) -> int:
    """Columns of I per expert_slice task: the widest multiple of 8 in [16, SLICE_MAX] whose
    slices of ``blocks`` row blocks fill the programs' waves within 3% of the best width's, the
    work beside them counted as slices of as many bytes (``other_columns``: the shared MLP's
    width, whose tasks stream the same H-long weight rows). Qwen3-30B-A3B at T = 1 (8 blocks, I
    768, 132 programs): 48 (128 tasks); gpt-oss-120b (4 blocks, I 2880): 88 (132 tasks).
    ``exact``: widths that divide I only (the TMA slices see the weights as (slices, S, H) blocks);
    0 when none does."""
    def eff(w):
        tasks = max(1, round(blocks)) * -(-I // w) + other_columns / w
        return tasks / (-(-tasks // programs) * programs)

    widths = [w for w in range(16, min(SLICE_MAX, max(16, -(-I // 8) * 8)) + 1, 8) if not exact or I % w == 0]
    if not widths:
        return 0
    best = max(eff(w) for w in widths)
    return max(w for w in widths if eff(w) >= 0.97 * best)


#: elements of the combine's (slab rows x BLOCK_H) fp32 tile with expert_slice tasks (64 a thread at 4 warps)
SLICE_COMBINE_TILE = 8192


def slice_tiles(I: int, H: int, T: int, K: int, blocks: float, programs: int, other_columns: int,
                combine_block_t: int, exact: bool = False) -> dict:
    """What the sliced layout changes in a decode config: SLICE, GEMM 1's BLOCK_N (the slice's padded
    width) and the combine's BLOCK_H, narrowed so that its tasks, which read K x slices fp32 rows a
    token as one tile (slice_tile._combine_slabs_tile), spread over the programs and the tile stays
    within SLICE_COMBINE_TILE elements (at least 16 columns)."""
    w = slice_width(I, blocks, programs, other_columns, exact)
    if w == 0:
        return {}
    per = H * -(-T // combine_block_t) / programs
    rows = _pow2(K * -(-I // w))
    bh = max(16, min(1024, 1 << max(0, int(per).bit_length() - 1), max(1, SLICE_COMBINE_TILE // rows)))
    return {"SLICE": w, "BLOCK_N": _pow2(w), "combine_BLOCK_H": bh}


def apply_slices(mk: dict, tma: bool = False) -> dict:
    """A decode config (``megakernel_config``) with its ``slice_tiles`` applied: expert_slice tasks
    instead of GEMM 1 and GEMM 2 tiles, stages refitted (decode_stages); unchanged without them.
    ``tma``: the TMA slices (config "slice_tma", ``slice_tiles_tma``: a width that divides I, the
    weights read as (slices, S, H) blocks whose rows past S are zero-filled by the copy engine, not
    loaded; H200 run AD: cp.async slices of 48 columns padded to 64 streamed 26 GB/s a program, about
    48/64 of the TMA tiles' 34: the zero-filled lanes take the copies' bandwidth); unchanged
    where no width divides I."""
    st = mk.get("slice_tiles_tma" if tma else "slice_tiles")
    if not st or mk["tiles"]["gemm1"].get("SLICE"):
        return mk
    two_gemm = mk
    mk = copy.deepcopy(mk)
    if tma:
        mk["slice_tma"] = True
    mk["two_gemm"] = copy.deepcopy(two_gemm)  # what variant "two_gemm" measures against
    t = mk["tiles"]
    t["gemm1"].update(SLICE=st["SLICE"], BLOCK_N=st["BLOCK_N"])
    t["combine"]["BLOCK_H"] = st["combine_BLOCK_H"]
    mk["num_stages"] = decode_stages(decode_stage_bytes(t, True))
    return mk


#: T = 1: every GEMM 1 task routes the token itself (tiles["router"]["EACH"], variant "reach"; the
#: default up to this many experts). H200 run AH, T = 1, us, the top-k task's routing / each task's:
#: Qwen3-30B-A3B 33.5 / 32.7, gpt-oss-120b 74.6 / 72.9 (E = 128); DeepSeek-V3 (E = 256, grouped
#: selection) 200.7 / 209.5: its selection's registers spill in every GEMM 1 task (73 STL, sm_90).
ROUTE_EACH_MAX_EXPERTS = 128


def route_each(mk: dict) -> dict:
    """A T = 1 config whose GEMM 1 tasks route the token themselves from the logits' partials
    (tiles["router"]["EACH"] = 1) instead of waiting for the top-k task's align and signal (H200
    run AF's trace: 1.8 us, then a handoff); unchanged unless the config is single-token with a
    split router, two-GEMM tiles and whole tiles (what the kernel's EACH branch takes)."""
    if not (mk.get("single_token") and mk["tiles"]["router"]["SPLIT"] > 1 and route_each_takes(mk["tiles"])):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"]["EACH"] = 1
    return mk


#: the most tokens at which the default config takes ALIGN_EACH (the decode buckets, where the align
#: chain is a large share of the layer; measured at T = 8 and 64)
ALIGN_EACH_MAX_T = 64


def align_each(mk: dict, T: int, H: int, K: int) -> dict:
    """A config whose GEMM 1 tasks place their own row block's rows from the routing, with no scan
    and scatter tasks (tiles["router"]["ALIGN_EACH"] = 1; H200 run AL's trace, Qwen3-30B-A3B T = 64
    concentrated: the scan and the scatter took 8.5 us between the top-k tasks and GEMM 1);
    unchanged where reference.tiles.align_each_takes says it cannot apply (one top-k task, more than
    ALIGN_EACH_MAX_PAIRS pairs, expert_slice tasks, stream-K, EACH)."""
    if T > ALIGN_EACH_MAX_T or not align_each_takes(T, H, K, mk["tiles"]):
        return mk
    mk = copy.deepcopy(mk)
    mk["tiles"]["router"]["ALIGN_EACH"] = 1
    return mk


def megakernel_config(E: int, H: int, I: int, K: int, Is: int, T: int, *, num_sms: int,
                      interpret: bool = False, routing_given: bool = False, fp8: str | None = None) -> dict:
    """The megakernel's tiles (reference.tiles' form), warps, stages and programs per SM.

    ``fp8`` ("weights" / "weights+act"): the FP8 tiles' constraints (BLOCK_K 128; BLOCK_N 128 in
    GEMM 1 with FP8 activations; no stream-K). Decode (T <= 64): row blocks that hold every row an expert can get (BLOCK_M 16 up to T = 16,
    64 up to T = 64), so each touched expert's weights stream once whatever the routing; column
    tiles that fill the programs' waves (touched experts x N tiles close to a multiple of P). Prefill:
    128-row tiles of 128 columns."""
    mk = _megakernel_config(E, H, I, K, Is, T, num_sms=num_sms, interpret=interpret)
    if fp8 is not None:  # expert_slice tasks are bf16 only
        mk.pop("slice_tiles", None)
        mk.pop("slice_tiles_tma", None)
    elif T <= SLICE_MAX_T:
        mk = apply_slices(mk)
    if fp8 is None and not routing_given and E <= ROUTE_EACH_MAX_EXPERTS:
        mk = route_each(mk)
    if fp8 is not None:  # FP8 GEMM tiles: a weight scale block per K step; FP8 activations: whole 128-column groups
        t = mk["tiles"]
        for part in ("gemm1", "gemm2", "shared"):
            t[part]["BLOCK_K"] = FP8_BLOCK
        t["order"]["STREAM_K"] = 0
        if fp8 == "weights+act":
            t["gemm1"]["BLOCK_N"] = t["shared"]["BLOCK_N1"] = FP8_BLOCK
        if not interpret and t["gemm1"]["BLOCK_M"] <= 64:  # decode: the stages within STAGE_BYTES, e4m3 weights
            mk["num_stages"] = decode_stages(decode_stage_bytes(t, bool(Is), weight_bytes=1), least=2)
            if fp8 == "weights" and Is and t["gemm1"]["BLOCK_M"] == 64 and t["shared"]["BLOCK_N1"] >= 128:
                mk["num_stages"] = min(mk["num_stages"], FP8_WIDE_SHARED_MAX_STAGES)
        mk["tma_weights"] = FP8_TMA_WEIGHTS[fp8]
        mk["fp8_swap_ab"] = FP8_SWAP_AB and fp8 == "weights+act"
        mk["fp8_x_once"] = FP8_X_ONCE and fp8 == "weights+act"
    if routing_given:  # no logits to compute: one task per token block reads the routing and counts
        r = mk["tiles"]["router"]
        r.update(SPLIT=1, TOPK_T=r["BLOCK_T"])
    return align_each(mk, T, H, K)


#: the rank top-k (routing._route_block's RANK: tokens x experts^2 compares at once) only where a
#: task's block is this small (a (1, 128, 128) block at T = 1 is 16K; a 16-token block would be 256K)
RANK_TOPK_MAX_COMPARES = 1 << 16


def rank_topk_fits(tokens: int, block_e: int) -> bool:
    """Whether a top-k task of ``tokens`` rows over BLOCK_E experts may rank them all at once."""
    return tokens * block_e * block_e <= RANK_TOPK_MAX_COMPARES


#: the bitonic top-k (routing._route_block's BITONIC: tl.topk over a top-k task's keys) only for
#: tasks of at most this many tokens: fewer rows than the 4 warps of a decode program, whose
#: row maxima cross warps (shared memory and barriers, which the bitonic top-k mostly avoids). With
#: a row per warp the maxima stay in their warp, and sm_90 compiles of the bitonic top-k spilled
#: (Qwen3-30B-A3B T = 8: 1320 stack bytes, none without it; Triton 3.6, compile_report.py)
BITONIC_TOPK_MAX_TOKENS = 2
#: ... and at most this many keys per task: BLOCK_E up to 512 at T = 1 (Kimi K2's 384 experts), 256
#: at T = 2 (Kimi K2 at T = 2, 1024 keys, compiled to 34744 stack bytes against 512 without it)
BITONIC_TOPK_MAX_KEYS = 1 << 9


def bitonic_topk_fits(tokens: int, block_e: int) -> bool:
    """Whether a top-k task of ``tokens`` rows over BLOCK_E experts may take the bitonic top-k."""
    return tokens <= BITONIC_TOPK_MAX_TOKENS and tokens * block_e <= BITONIC_TOPK_MAX_KEYS


#: weight-only FP8's e4m3 conversion in both backends (fp8_gemm.FP8_CONVERT): H200 run O, the
#: megakernel at Qwen3-30B-A3B T = 1, 46.2 us with Triton's cast, 36.4 with the bit moves, whose
#: values are the cast's for every finite code (tests/test_kernels_fp8.py, on the H200 in run P)
FP8_CONVERT_DEFAULT = "bits"

#: the FP8 megakernel's routed GEMM tasks read their e4m3 weight tiles through TMA descriptors
#: (fp8_tma_tiles.py; megakernel variant "fp8tma"), not cp.async, per FP8 mode. H200 run BO, Qwen3-30B-A3B:
#: weight-only 1.01-1.02x the pointer tiles' time (off); with FP8 activations 0.95-0.98x, and on with
#: FP8_X_ONCE, the pair measured together (run BU, below)
FP8_TMA_WEIGHTS = {"weights": False, "weights+act": True}

#: with FP8 activations and TMA weights, the GEMM tasks compute weights x rows (fp8_tma_tiles._fp8a_swapped;
#: variant "fp8swap"): an e4m3 wgmma (the weight tile fills its M of 64) where 16 rows x weights is an
#: mma.sync that Triton 3.6 runs in fp16 on sm_90. Off: faster but outside the FP8 tolerance at T = 8 on the
#: H200. Run BP (x quantized per step): T = 1 89.2 -> 77.3 us, T = 8 245.0 -> 225.8 with max error 1.0e-2
#: against 3.9e-3; run BU (x quantized once, variant "fp8xqswap"): T = 1 40.2 -> 35.6, T = 8 127.0 -> 122.5 with
#: 1.01e-2 (fails); with the sums promoted to fp32 every 32 products ("fp8xqswapp") 42.6 and 131.9 with
#: 9.0e-3: the tensor cores' e4m3 accumulation is not the main cause of the swap's error
FP8_SWAP_AB = False

#: with FP8 activations, x is quantized once per call by the router tasks (fp8_tma_tiles._quantize_x_rows;
#: variant "fp8xq"), not in every K step of every GEMM 1 task (run BO's default: 89.2 us at Qwen3-30B-A3B T = 1
#: where the multi-launch path, x quantized once by a launch of its own, took 51.8). Bitwise the same layer
#: (interpreter tests; on the H200 the same error against the reference). H200 run BU, Qwen3-30B-A3B, us,
#: per-step quantization / once (with TMA weights) / the bf16 megakernel / the FP8-activation multi-launch path:
#: T = 1 87.3 / 40.2 / 33.1 / 50.5; T = 8 243.3 / 127.0 / 151.4 / 102.0; every token on the same experts
#: 71.9 / 41.1 / 36.9 / 48.5
FP8_X_ONCE = True

#: the weight-only FP8 megakernel's stages at most where 64-row tiles meet a shared MLP whose GEMM 1 tile is
#: 128 columns wide. Compiled for sm_90 (benchmarks/compile_audit.py, session 18; Triton 3.9 here, no GPU):
#: Kimi-K2 and DeepSeek-V3 at T = 400 and 512 took 327,680 bytes of shared memory at 4 stages, past the
#: H200's 232,448 a block (OutOfResources at launch: backend="megakernel" with weight-only FP8), and 229,376
#: at 3. decode_stage_bytes counts 49,152 bytes a stage there (e4m3 weights); the excess, 98,304 bytes, is the
#: router tasks' pipelined weight tiles (3 x 32 x 512 bf16 for Kimi-K2's 384 experts, read from the TTGIR:
#: the persistent loop's pipelined buffers are allocated for the whole kernel, so they sit beside the GEMM
#: stages; Llama-4-Maverick's are 3 x 32 x 64, and it took 229,376 at 4 stages with the same GEMM tiles).
#: decode_stage_bytes budgets the GEMM stages alone; counting the router's pipeline there would make this
#: cap a rule, and would move measured configs (not done without a GPU run that times them).
#: tests/test_router_compile.py compiles one such case
FP8_WIDE_SHARED_MAX_STAGES = 3

#: shared memory the decode megakernel's pipeline stages may take, bytes
STAGE_BYTES = 160 << 10


def decode_stage_bytes(tiles: dict, shared: bool, *, weight_bytes: int = 2, act_bytes: int = 2) -> int:
    """Shared memory of one pipeline stage of the megakernel's largest GEMM task: the A tile and
    its weight tiles (GEMM 1 and the shared MLP's GEMM 1: gate and up)."""
    g1, g2, sh = tiles["gemm1"], tiles["gemm2"], tiles["shared"]
    bm = g1["BLOCK_M"]
    return max(bm * g1["BLOCK_K"] * act_bytes + 2 * g1["BLOCK_K"] * g1["BLOCK_N"] * weight_bytes,
               bm * g2["BLOCK_K"] * act_bytes + g2["BLOCK_K"] * g2["BLOCK_N"] * weight_bytes,
               (sh["BLOCK_M"] * sh["BLOCK_K"] * act_bytes + 2 * sh["BLOCK_K"] * sh["BLOCK_N1"] * weight_bytes)
               if shared else 0)


#: the deepest GEMM 2 step a decode megakernel takes: the TMA box's largest dimension (256 elements)
GEMM2_MAX_BLOCK_K = 256

#: from this T on (to MEGAKERNEL_SPLIT_MAX_T), the megakernel's GEMM 2 tiles are GEMM2_WIDE_BLOCK_N columns wide:
#: half the tasks, each re-reading its rows half as often. H200 run BN (variant "g2wide", us, 128 / 256 columns):
#: Mixtral-8x7B T = 512 1,125.0 / 1,061.4, every token on the same experts 663.6 / 578.3; Qwen3-30B-A3B T = 512
#: 360.0 / 336.9; at T = 64 Mixtral-8x7B 686.5 / 681.5 and 215.9 / 212.4 (within the spread: left at 64 and below)
GEMM2_WIDE_MIN_T = 64
GEMM2_WIDE_BLOCK_N = 256


def deep_gemm2_block_k(tiles: dict, shared: bool, *, weight_bytes: int = 2, act_bytes: int = 2) -> int:
    """GEMM 2's BLOCK_K for a decode megakernel (BLOCK_M <= 64): the deepest power of two, from
    its BLOCK_K up to GEMM2_MAX_BLOCK_K, whose stage keeps the stage count that the largest task's
    stage sets (decode_stages of decode_stage_bytes). Stages are sized by GEMM 1's gate and up tiles,
    so a GEMM 2 task with the same BLOCK_K keeps half of GEMM 1's weight bytes in flight or less
    (Mixtral-8x7B T = 8: 32 KiB a program against 128; H200 run BM's trace: GEMM 2's 448 tasks read
    822 MB in 292 us, 2.8 TB/s, GEMM 1's 4.4). The default up to 16 tokens (BLOCK_M 16) since H200 run
    BN (variant "k2deep", us, 128 / 256 deep): Mixtral-8x7B T = 8 583.7 / 552.2, every token on the same
    experts 186.1 / 177.2, T = 1 178.0 / 177.8; DeepSeek-V3 routed T = 1 200.6 / 192.6, T = 8 1,075.1 /
    1,061.0, 188.5 / 183.5 (Qwen3-30B-A3B T = 1 keeps 128: 256 would cost a stage). Unmeasured at T = 64."""
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
    """Pipeline stages of the decode megakernel: as many as fit in STAGE_BYTES, ``least`` to
    ``most`` (a program streams about stages - 1 of them ahead; H200 run E: gpt-oss-120b T = 1
    98.0 us at 3 stages, 78.6 at 6; Qwen3-30B 37.6 at 3, 37.2-40.2 at 4-6)."""
    return max(least, min(most, 1 + STAGE_BYTES // stage_bytes))


#: the megakernel's router logits split over H up to this many tokens (16 blocks of 32), where
#: decode_router_split stops (the multi-launch path's extra launch there is the prefill logits launch):
#: ranges of at most MEGAKERNEL_SPLIT_STEPS steps of BLOCK_H, at least 4, top-k tasks of 4 tokens. H200 run
#: BH (T = 512, us, walking / 4 ranges / 8 ranges): Qwen3-30B-A3B 373.3 / 365.4 / 365.3, every token on the
#: same experts 154.3 / 145.7 / 144.6; gpt-oss-120b 1,613.6 / 1,606.8 / 1,607.4, 272.2 / 266.6 / 263.7;
#: Mixtral-8x7B 1,161.8 / 1,116.3 / 1,116.8, 656.6 / 652.7 / 663.6; DeepSeek-V3 routed 5,285.1 / 5,183.7 /
#: 5,171.5, 933.6 / 831.1 / 810.4 (run BG's trace: Qwen3-30B-A3B's 16 top-k tasks walked H for 19.7 us each)
MEGAKERNEL_SPLIT_MAX_T = 512
MEGAKERNEL_SPLIT_STEPS = 32
#: with that split at 16 token blocks, top-k tasks of 16 tokens (32 groups), not 4 (128): the align's one scan
#: task sums every group's histogram (H200 run BJ's trace, Qwen3-30B-A3B T = 512: 19 us over 128 groups, about 7
#: over 16 in run BG). Run BK, us, top-k tasks of 4 / 8 / 16 / 32 tokens: Qwen3-30B-A3B 359.8 / 354.0 / 352.7 /
#: 369.8, every token on the same experts 145.9 / 140.9 / 139.3 / 158.2; Mixtral-8x7B 1,101.5 / 1,128.2 / 1,098.7 /
#: 1,140.0, 654.1 / 650.6 / 646.7 / 661.1. Up to 128 experts: DeepSeek-V3's 256-expert grouped selection was not
#: reached by the run (its top-k tasks of 4 tokens stay)
MEGAKERNEL_TOPK16_MAX_E = 128


def _megakernel_config(E: int, H: int, I: int, K: int, Is: int, T: int, *, num_sms: int, interpret: bool) -> dict:
    from .plan import combine_launch

    bt = router_block_t(T, E)
    block_h = router_block_h(E, H, interpret=interpret)
    split = decode_router_split(T, E, H, interpret=interpret)
    cl = combine_launch(T, H)
    combine = {"BLOCK_T": cl["BLOCK_T"], "BLOCK_H": cl["BLOCK_H"]}
    if interpret:  # tiny tiles, as the multi-launch path's interpreter configs; top-k groups of 4 (1 at T = 1)
        topk_t = (1 if T == 1 else 4) if split > 1 else bt
        return {"tiles": {"router": {"BLOCK_T": bt, "BLOCK_H": block_h, "SPLIT": max(split, 1), "TOPK_T": topk_t},
                          "gemm1": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32},
                          "gemm2": {"BLOCK_N": 16, "BLOCK_K": 32},
                          "shared": {"BLOCK_M": 16, "BLOCK_N1": 16, "BLOCK_N2": 16, "BLOCK_K": 32},
                          "combine": combine,
                          "order": {"GROUP_M": 2, "STREAM_K": 0}},
                "num_warps": 4, "num_stages": 1, "occupancy": 1, "next_ticket": True}
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
        bn1 = _fit(I, blocks, P, (128, 64, 32))  # 16 filled the waves but streamed slower (H200 traces, runs 2-3)
        bn2 = _fit(H, blocks, P, (128, 64, 32))
        bk = 128 if bm == 16 else 64
        if bm == 16:
            # decode: no 32-column tiles, whose 8 KiB weight tiles are too small for TMA copies.
            # H200 run U, T = 1 (us): gpt-oss-120b 32-column tiles by cp.async 77.1, 64-column tiles
            # through TMA 73.1; Qwen3-235B-A22B 106.1 against 95.1 (32-column tiles through TMA
            # with BLOCK_K 256: 82.2 and 92.6); Qwen3-30B-A3B's 64 / 128 columns unchanged (33.8)
            bn1, bn2 = max(bn1, 64), max(bn2, 64)
        sbn1 = _fit(Is, -(-T // bm), P, (128, 64, 32)) if Is else 64
        sbn2 = _fit(H, -(-T // bm), P, (128, 64, 32)) if Is else 64
        if GEMM2_WIDE_MIN_T < T <= MEGAKERNEL_SPLIT_MAX_T:
            bn2 = GEMM2_WIDE_BLOCK_N
        tiles = {"gemm1": {"BLOCK_M": bm, "BLOCK_N": bn1, "BLOCK_K": bk}, "gemm2": {"BLOCK_N": bn2, "BLOCK_K": bk},
                 "shared": {"BLOCK_M": bm, "BLOCK_N1": sbn1, "BLOCK_K": bk}}
        bk2 = deep_gemm2_block_k(tiles, bool(Is)) if bm == 16 else bk
        tiles["gemm2"]["BLOCK_K"] = bk2
        # 8 warps with 64-row blocks: H200 run Q, T = 512, against 4: Qwen3-30B-A3B 388 us against
        # 445 (uniform), 179 against 233 (every token on the same experts); gpt-oss-120b 1,636
        # against 1,686, 321 against 401; run R, T = 64: Qwen3-30B 320.6 against 343.1, 51.9
        # against 58.0; gpt-oss-120b 1,303.7 against 1,319.8, 85.1 against 85.6. GEMM 1's two
        # 64 x 128 accumulators take 128 registers a thread at 4 warps (45 spill stores in the compile)
        warps = 8 if bm == 64 else 4
        stages = decode_stages(decode_stage_bytes(tiles, bool(Is)))
    else:
        bn1 = bn2 = sbn1 = sbn2 = 128
        bk, warps, stages = 64, 8, 3
        bk2 = bk
        if T <= MEGAKERNEL_SPLIT_MAX_T:
            bn2 = GEMM2_WIDE_BLOCK_N
    # decode: top-k tasks select over as few rows as there are tokens (one at T = 1), not BLOCK_T;
    # past 16 tokens, groups of 4 spread the selection over programs
    # (top-k tasks of one token up to T = 8: H200 run V, Qwen3-30B-A3B T = 8, 157.2 us against 159.2
    # with one task of 8 rows, 40.5 against 42.2 with every token on the same experts; gpt-oss-120b
    # and Qwen3-235B-A22B within 0.5%)
    topk_t = (1 if T <= 8 else _pow2(T) if T <= 16 else 4) if split > 1 else bt
    if split > 1 and -(-T // bt) >= 16 and E <= MEGAKERNEL_TOPK16_MAX_E:  # T = 512: fewer groups for the scan
        topk_t = 16
    # decode: the expert_slice layout this config would take (apply_slices)
    # whether the layer is routed experts only (no shared MLP): what the combine in GEMM 2's tiles
    # (tiles["combine"]["IN_G2"], variant "fcomb") needs
    extra = {"routed_only": not Is, "single_token": T == 1}
    if bm == 16:
        extra["slice_tiles"] = slice_tiles(I, H, T, K, blocks, P, Is, combine["BLOCK_T"])
        extra["slice_tiles_tma"] = slice_tiles(I, H, T, K, blocks, P, Is, combine["BLOCK_T"], exact=True)
    return {**extra, "tiles": {"router": {"BLOCK_T": bt, "BLOCK_H": block_h, "SPLIT": max(split, 1), "TOPK_T": topk_t},
                      "gemm1": {"BLOCK_M": bm, "BLOCK_N": bn1, "BLOCK_K": bk},
                      "gemm2": {"BLOCK_N": bn2, "BLOCK_K": bk2},
                      "shared": {"BLOCK_M": bm, "BLOCK_N1": sbn1, "BLOCK_N2": sbn2, "BLOCK_K": bk},
                      "combine": combine,
                      # whole tiles: stream-K segments (kernels/stream_k.py, variant "sk") measured
                      # slower on the H200 (run I: Qwen3-30B-A3B T = 1 50.6 us against 38.9)
                      "order": {"GROUP_M": 8, "STREAM_K": 0}},
            "num_warps": warps, "num_stages": stages, "occupancy": 1,
            # the next ticket after a task ends: H200 runs D and E measured tickets taken as a task
            # starts slower (NOTES-gpu-runs.md)
            "next_ticket": False,
            # GEMM 2 tasks prefetch their weights into L2 while they wait for GEMM 1 (megakernel
            # variant "pfwait"; H200 run M, T = 1: Qwen3-30B 38.3 us against 36.6: off). (A wider
            # prefetch of GEMM 2 tiles into half of L2 by every waiting task, GEMM 1 reading
            # evict_first, measured slower on every preset in run N and was removed after run Y.)
            "prefetch_wait": False,
            # top-k tasks rank every expert at once instead of K dependent maxima (variant "rank":
            # H200 run M measured it slower, Qwen3-30B T = 1 40.8 us against 36.6: off)
            "topk_rank": False,
            # top-k tasks of 1-2 tokens take a bitonic top-k (tl.topk) instead of K dependent maxima
            # (configs.bitonic_topk_fits; H200 run O, T = 1: Qwen3-30B 36.2 us against 37.5,
            # gpt-oss-120b 77.2 against 77.9; variant "maxima" turns it off)
            "topk_bitonic": True,
            # a batch of one token aligns from its picks' ranks, not by scans over the experts
            # (variant "align1", align._align_one; H200 run Y, T = 1: Qwen3-30B-A3B 32.8 us against
            # 33.1, gpt-oss-120b 73.8 against 73.3, DeepSeek-V3 197.6 against 199.2, within the
            # spread: off)
            "align_one": False,
            # FP8 weights: e4m3 -> bf16 by bit moves ("bits", fp8_gemm._e4m3_to) or by Triton's cast
            # ("cast": two scalar F2F per pair of codes on the conversion pipe; H200 run O, Qwen3-30B
            # T = 1: 46.2 us, bits 36.4; variant "fp8cast"); the weight scales of the next K step
            # loaded during this one (variant "fp8pf": 47.2 us there, off)
            "fp8_convert": FP8_CONVERT_DEFAULT,
            "fp8_scale_prefetch": False,
            # the routed GEMM tasks' weights through TMA descriptors, not cp.async (variant "tmaw"):
            # megakernel_tma_weights
            "tma_weights": megakernel_tma_weights(bn1, bn2, bk)}


#: the smallest weight tile (BLOCK_N x BLOCK_K bf16 bytes) whose TMA copies the megakernel takes
TMA_WEIGHT_TILE_BYTES = 16 << 10


def megakernel_weight_loads(mk: dict) -> str:
    """How a megakernel config's GEMM tasks load their weights, as the cost model names it
    (simulator.cost.MEGAKERNEL_LOADS): "tma" with config "tma_weights", else "pointer" (expert_slice
    tasks read theirs by pointer loads)."""
    return "tma" if mk.get("tma_weights") and not mk["tiles"]["gemm1"].get("SLICE") else "pointer"


def megakernel_tma_weights(bn1: int, bn2: int, bk: int) -> bool:
    """Whether the megakernel's routed GEMM tasks read their weights through TMA descriptors
    (config "tma_weights"): where their weight tiles, GEMM 1's and GEMM 2's, are at least
    TMA_WEIGHT_TILE_BYTES. H200 run T (us, cp.async / TMA): Qwen3-30B-A3B T = 1 35.9 / 33.5 (64- and
    128-column tiles of 128), T = 8 160.9 / 159.1, T = 64 321.0 / 315.0 and every token on the same
    experts 52.0 / 48.8, T = 512 382.6 / 368.1 and 181.4 / 157.5; gpt-oss-120b T = 8-512 1-15%
    faster, but T = 1 77.2 / 82.1 with 32-column tiles (8 KiB copies). Run V, 128-row blocks:
    Qwen3-30B-A3B T = 4096 1,152.9 / 1,050.8."""
    return min(bn1, bn2) * bk * 2 >= TMA_WEIGHT_TILE_BYTES


#: where no tuned table says otherwise: the megakernel up to this T. 0 (auto = multi-launch) since
#: the 2026-12-01 H200 runs measured the megakernel 1.05-1.45x slower than the multi-launch path on
#: uniform routing at every T in 1..512 (benchmarks/NOTES-gpu-runs.md, runs 8-9)
MEGAKERNEL_MAX_T = 0


def select_backend(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                   fp8: str | None = None) -> str:
    """"megakernel" or "multi" for backend="auto": the tuned file's ``backend`` table (shape key ->
    {bucket: name}, written by benchmarks/pick_backend.py from same-run rows of both backends) where it
    has this shape, else the megakernel for T <= MEGAKERNEL_MAX_T. ``fp8`` ("weights" / "weights+act"):
    the FP8 layer's table of that mode (``backend_fp8``, from bench_megakernel.py --fp8 rows), else the
    multi-launch path (the FP8 megakernel is chosen only where a run measured it faster)."""
    table = _backends(gpu, dtype, triton_version, fp8).get(shape_key(E, H, I, K))
    if table:
        return table[min(table, key=lambda b: (abs(math.log(b) - math.log(max(T, 1))), b))]
    return "megakernel" if fp8 is None and T <= MEGAKERNEL_MAX_T else "multi"


@cache
def _backends(gpu: str, dtype: str, triton_version: str, fp8: str | None = None) -> dict:
    p = config_path(gpu, dtype, triton_version)
    if not p.exists():
        return {}
    d = json.loads(p.read_text())
    where = "backend"
    if fp8 is None:
        d = d.get("backend", {})
    else:
        modes = d.get("backend_fp8", {})
        bad = sorted(set(modes) - set(FP8_MODES))
        if bad or fp8 not in FP8_MODES:
            raise KernelConfigError(f"{p}: backend_fp8 modes must be of {list(FP8_MODES)}, got {bad or [fp8]}")
        d, where = modes.get(fp8, {}), f"backend_fp8[{fp8!r}]"
    out = {}
    for sk, buckets in d.items():
        for b, name in buckets.items():
            if not b.isdigit() or int(b) not in T_BUCKETS or name not in ("megakernel", "multi"):
                raise KernelConfigError(f"{p}: {where}[{sk!r}][{b!r}] = {name!r}: want a bucket of {T_BUCKETS} "
                                        "and 'megakernel' or 'multi'")
            out.setdefault(sk, {})[int(b)] = name
    return out
