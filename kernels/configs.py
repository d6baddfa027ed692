"""Launch configurations of the MoE kernels: a measured override, the cost model's table, a heuristic.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.

Pure Python. Where an entry comes from (``config_source``), in this order:

1. "tuned": ``configs/<gpu>__<dtype>__triton-<version>.json`` (``megamoe tune``: an entry measured
   on this GPU that beat the model's choice), at the exact T bucket;
2. "model": ``configs/model/<profile>__<dtype>.json`` (``megamoe configure``: the cost model's choice
   over ``candidates``), the profile named for the device in ``configs/model/families.json``;
3. a tuned entry of the nearest bucket, then "heuristic": ``default_config``.

``select_backend`` reads the "backend" tables in the same order. A tuned file holds::

    {"gpu": "NVIDIA H200", "dtype": "bfloat16", "triton": "3.6.0",
     "configs": {"E128_H2048_I768_K8": {"1": {"gemm1": {...}, "gemm2": {...}}, "64": {...}}}}

keyed by shape and token bucket (``T_BUCKETS``, nearest in log T). Each GEMM config has exactly
``GEMM_KEYS`` (plus ``GEMM_OPTIONAL``); both GEMMs share BLOCK_M. ``"variant"``: ``"pointer"`` or
``"tma_persistent"`` (16-byte row strides, else ``resolve_variants`` falls back).
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from functools import cache
from pathlib import Path

from .thresholds import Thresholds

CONFIG_DIR = Path(__file__).parent / "configs"
T_BUCKETS = (1, 8, 64, 512, 4096, 16384)
GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
#: optional keys and their defaults: SPLIT_K, variant (the kernel family), FLATTEN (one pipelined loop)
GEMM_OPTIONAL = {"SPLIT_K": 1, "variant": "pointer", "FLATTEN": 0}
#: the optional keys that are switches (0 or 1), not positive sizes
GEMM_SWITCHES = ("FLATTEN",)
VARIANTS = ("pointer", "tma_persistent")
#: persistent programs where the SM count is not read from a device: the interpreter and an H200
INTERPRETER_SMS = 3
DEFAULT_SMS = 132
FILE_KEYS = ("gpu", "dtype", "triton", "configs")
#: optional top-level keys: "backend" {shape key: {bucket: "megakernel" | "multi"}} for backend="auto",
#: and "dates" {shape key: {bucket: ISO 8601}}, when each tuned entry was measured (none: before any row)
FILE_OPTIONAL = ("backend", "backend_fp8", "dates")
#: the model tables' own top-level keys: "source" (how the table was made) and "predicted_us"
#: {shape key: {bucket: {"multi", "megakernel", "gemms": us, "price": {...}}}} (the chosen entry's predictions)
MODEL_FILE_OPTIONAL = ("source", "predicted_us")
MODEL_DIR = CONFIG_DIR / "model"
#: where a config came from (``config_source``)
SOURCES = ("tuned", "model", "heuristic")
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
    return _nearest(T_BUCKETS, T)


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


def load_file(path: Path, *, model: bool = False) -> dict:
    """Read and check one tuned file (``model``: a model table, which may also hold
    MODEL_FILE_OPTIONAL); returns {shape_key: {bucket: entry}}."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise KernelConfigError(f"{path}: cannot read tuned configs: {exc}") from None
    allowed = set(FILE_KEYS) | set(FILE_OPTIONAL) | (set(MODEL_FILE_OPTIONAL) if model else set())
    if not isinstance(d, dict) or not set(FILE_KEYS) <= set(d) <= allowed:
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise KernelConfigError(f"{path}: top-level keys must be {list(FILE_KEYS)} (optionally {sorted(allowed - set(FILE_KEYS))}), "
                                f"got {got}")
    out = {}
    for sk, buckets in d["configs"].items():
        if not re.fullmatch(r"E\d+_H\d+_I\d+_K\d+", sk):
            raise KernelConfigError(f"{path}: bad shape key {sk!r} (want like 'E128_H2048_I768_K8')")
        out[sk] = {}
        for b, entry in buckets.items():
            if not b.isdigit() or int(b) not in T_BUCKETS:
                raise KernelConfigError(f"{path}: {sk}: bucket {b!r} is not one of {T_BUCKETS}")
            out[sk][int(b)] = check_entry(entry, f"{path}: {sk}[{b}]")
    for sk, buckets in d.get("dates", {}).items():
        for b, when in buckets.items():
            if b not in d["configs"].get(sk, {}):
                raise KernelConfigError(f"{path}: dates: {sk}[{b}] dates no entry")
            try:
                datetime.fromisoformat(when)
            except (TypeError, ValueError):
                raise KernelConfigError(f"{path}: dates: {sk}[{b}] = {when!r} is not an ISO 8601 date") from None
    return out


@cache
def _tuned(gpu: str, dtype: str, triton_version: str) -> dict:
    p = config_path(gpu, dtype, triton_version)
    return load_file(p) if p.exists() else {}


def _tuned_by(gpu: str, dtype: str, triton_version: str, date: str) -> dict:
    """The tuned table as it was at ``date`` (ISO 8601): the entries measured by then (an entry
    without a date predates every stored row)."""
    p = config_path(gpu, dtype, triton_version)
    if not p.exists():
        return {}
    dates = json.loads(p.read_text()).get("dates", {})
    when = datetime.fromisoformat(date)
    return {sk: kept for sk, buckets in _tuned(gpu, dtype, triton_version).items()
            if (kept := {b: e for b, e in buckets.items()
                         if str(b) not in dates.get(sk, {}) or datetime.fromisoformat(dates[sk][str(b)]) <= when})}


def model_path(profile: str, dtype: str) -> Path:
    """The cost model's table for a profile and dtype: ``configs/model/<profile>__<dtype>.json``."""
    return MODEL_DIR / f"{slug(profile)}__{dtype}.json"


@cache
def families() -> dict[str, str]:
    """{device name (as torch reports it): profile name of its model table} (``model/families.json``)."""
    p = MODEL_DIR / "families.json"
    try:
        d = json.loads(p.read_text())["devices"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise KernelConfigError(f"{p}: want {{\"devices\": {{device name: profile}}}}: {exc}") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise KernelConfigError(f"{p}: 'devices' must map device names to profile names, got {d!r}")
    return d


def family_of(gpu: str) -> str | None:
    """The profile whose model table configures device ``gpu`` (None: no table for it)."""
    return families().get(gpu)


def _model_file(gpu: str, dtype: str) -> Path | None:
    """The model table configuring ``gpu`` for ``dtype`` (None: none exists)."""
    prof = family_of(gpu)
    p = model_path(prof, dtype) if prof else None
    return p if p and p.exists() else None


@cache
def _model(gpu: str, dtype: str) -> dict:
    p = _model_file(gpu, dtype)
    return load_file(p, model=True) if p else {}


def model_prediction(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str = "bfloat16") -> dict | None:
    """The model table's ``predicted_us`` of this shape at T's nearest bucket on ``gpu`` (None: no table)."""
    p = _model_file(gpu, dtype)
    if not p:
        return None
    table = json.loads(p.read_text()).get("predicted_us", {}).get(shape_key(E, H, I, K))
    if not table:
        return None
    return table[str(_nearest({int(b): b for b in table}, T))]


def _nearest(table: dict, T: int):
    """The bucket of ``table`` nearest T in log scale (the smaller on a tie)."""
    return min(table, key=lambda b: (abs(math.log(b) - math.log(max(T, 1))), b))


def _lookup(E: int, H: int, I: int, K: int, T: int, gpu: str, dtype: str, triton_version: str,
            tuned_of, model_of) -> tuple:
    """(value, source): the tuned table's at T's bucket, else the model table's (nearest bucket),
    else the tuned table's nearest bucket, else (None, "heuristic")."""
    key = shape_key(E, H, I, K)
    tuned = tuned_of(gpu, dtype, triton_version).get(key) or {}
    b = bucket_of(T)
    if b in tuned:
        return tuned[b], "tuned"
    model = model_of(gpu, dtype).get(key)
    if model:
        return model[_nearest(model, T)], "model"
    if tuned:
        return tuned[_nearest(tuned, T)], "tuned"
    return None, "heuristic"


def untuned_config(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str = "bfloat16") -> dict:
    """The entry ``select_config`` gives where no tuned file exists: the model table's, else the
    heuristic (variants resolved): the choice ``megamoe tune`` must beat."""
    entry, _ = _lookup(E, H, I, K, T, gpu, dtype, "", lambda *a: {}, _model)
    return resolve_variants({k: dict(v) for k, v in (entry or default_config(E, H, I, K, T)).items()}, H, I, dtype)


def config_without_model(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                         interpret: bool = False, made: str | None = None) -> dict:
    """The entry ``select_config`` gives with no model table (variants resolved): the tuned one of
    this GPU, dtype and Triton (T's bucket, else the nearest; ``made``: as the table was at that
    ISO 8601 date), else the heuristic. What a stored measurement that did not record its entry
    ran, where it was made before the model tables."""
    entry = None
    if not interpret:
        tuned = _tuned if made is None else (lambda *a: _tuned_by(*a, made))
        entry, _ = _lookup(E, H, I, K, T, gpu, dtype, triton_version, tuned, lambda *a: {})
    entry = entry or default_config(E, H, I, K, T, interpret=interpret)
    return resolve_variants({k: dict(v) for k, v in entry.items()}, H, I, dtype)


def config_source(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                  interpret: bool = False) -> str:
    """Where ``select_config``'s entry comes from: "tuned", "model" or "heuristic" (SOURCES)."""
    if interpret:
        return "heuristic"
    return _lookup(E, H, I, K, T, gpu, dtype, triton_version, _tuned, _model)[1]


def default_config(E: int, H: int, I: int, K: int, T: int, *, interpret: bool = False) -> dict:
    """A heuristic entry when nothing is tuned: small row blocks at decode, 128-row tiles at prefill."""
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
        g1 = g2 = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    elif bm == 64:
        g1 = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
        g2 = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        g1 = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
        g2 = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    return {"gemm1": {**GEMM_OPTIONAL, **g1}, "gemm2": {**GEMM_OPTIONAL, **g2}}


#: (BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT_K]) of the tuner's candidates, by rows per expert
#: (T x K / E): decode (<= 4, BLOCK_M 16), middle (<= 64, BLOCK_M 16 to 64), prefill (BLOCK_M 64 and 128)
_DECODE_SHAPES = ((32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (32, 256, 4, 4), (128, 128, 4, 3),
                  (64, 64, 4, 5), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (32, 128, 4, 4, 2), (32, 128, 4, 4, 4),
                  (128, 128, 4, 3, 2), (128, 128, 4, 3, 4), (64, 256, 4, 3, 2))
_MIDDLE_SHAPES = ((64, 128, 4, 3), (32, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3))
_PREFILL_SHAPES = {"gemm1": ((128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4)),
                   "gemm2": ((256, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 4), (256, 64, 8, 4))}


def candidates(E: int, H: int, I: int, K: int, T: int, *, dtype: str = "bfloat16") -> dict[str, list[dict]]:
    """{"gemm1": [...], "gemm2": [...]}: the GEMM configs ``megamoe tune`` times and ``megamoe configure``
    predicts for this shape at T, complete (GEMM_OPTIONAL filled), without duplicates, the heuristic's
    own among them; an entry pairs a gemm1 and a gemm2 of the same BLOCK_M. Prefill adds the
    "tma_persistent" variant (BLOCK_M 64 and 128, FLATTEN 0 and 1) where TMA can read the operands."""
    def c(bm, bn, bk, nw, ns, sk=1):
        return dict(GEMM_OPTIONAL, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns,
                    SPLIT_K=sk)

    rows = T * K / max(E, 1)
    out = {}
    for g, depth in (("gemm1", H), ("gemm2", I)):
        if rows <= 4:
            cands = [c(16, *t) for t in _DECODE_SHAPES]
        elif rows <= 64:
            cands = [c(bm, *t) for bm in (16, 32, 64) for t in _MIDDLE_SHAPES]
        else:
            cands = [c(bm, *t) for bm in (64, 128) for t in _PREFILL_SHAPES[g]]
            if tma_ok(depth, dtype):
                cands += [dict(tma_config(g, bm), FLATTEN=f) for bm in (64, 128) for f in (0, 1)]
        cands.append(default_config(E, H, I, K, T)[g])
        seen, out[g] = set(), []
        for cand in cands:
            key = json.dumps(check_gemm_config(cand, f"candidates {g}"), sort_keys=True)
            if key not in seen:
                seen.add(key)
                out[g].append(json.loads(key))
    return out


def select_config(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                  interpret: bool = False) -> dict:
    """The entry for this shape and T (variants resolved), from the first of: tuned, model table,
    heuristic (the module docstring's order; ``config_source`` says which)."""
    if not interpret:
        entry, _ = _lookup(E, H, I, K, T, gpu, dtype, triton_version, _tuned, _model)
        if entry:
            return resolve_variants({k: dict(v) for k, v in entry.items()}, H, I, dtype)
    return resolve_variants(default_config(E, H, I, K, T, interpret=interpret), H, I, dtype)


_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def tma_ok(depth: int, dtype: str) -> bool:
    """Whether rows of ``depth`` elements of ``dtype`` can be read through a TMA descriptor (16-byte strides)."""
    return depth * _ELEMENT_BYTES.get(dtype, 2) % 16 == 0


def resolve_variants(entry: dict, H: int, I: int, dtype: str) -> dict:
    """``entry`` with every GEMM's variant: "tma_persistent" only where TMA can read its operands."""
    out = {}
    for name, depth in (("gemm1", H), ("gemm2", I)):
        g = {**GEMM_OPTIONAL, **entry[name]}
        if g["variant"] == "tma_persistent" and not tma_ok(depth, dtype):
            g["variant"], g["FLATTEN"] = "pointer", 0
        out[name] = g
    return out


def tma_config(gemm: str, block_m: int, *, interpret: bool = False) -> dict:
    """A "tma_persistent" GEMM config for row tiles of ``block_m`` (64, 128 or 256)."""
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
    """The {"gemm1", "gemm2"} entry a benchmark candidate names: "current" -> None (the tuned one),
    "tmaNN" -> tma_entry(NN); overrides after a colon: ``"tma128:num_stages=3,g1.BLOCK_N=64"``."""
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
#: H columns per step of a walking routing program at prefill (WALK_WIDE_MIN_T, WALK_WIDE_MAX_E)
WALK_WIDE_BLOCK_H = _TH["WALK_WIDE_BLOCK_H"]
WALK_WIDE_MIN_T = _TH["WALK_WIDE_MIN_T"]
WALK_WIDE_MAX_E = _TH["WALK_WIDE_MAX_E"]
#: token blocks from which the router's logits are a launch of their own (past ROUTER_PREFILL_WALK_STEPS)
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
    """Warps of the multi-launch routing program (``walks``: it walks H itself)."""
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
    """H ranges the decode router's logits are split into (0: none), about 8 steps each."""
    C = -(-T // router_block_t(T, E)) if T else 0
    if interpret:  # tests: split the one-block batches (T <= 16) in two, keep the rest whole
        return 2 if C == 1 and H >= 32 else 0
    if C >= 16 or H < 1024:
        return 0
    block_h = router_block_h(E, H)
    return max(2, min(64, -(-H // (8 * block_h))))  # about 8 steps each (docs/kernels.md)


def router_prefill(T: int, E: int, H: int, *, interpret: bool = False) -> bool:
    """Whether the multi-launch router at T tokens takes the prefill logits launch."""
    C = -(-T // router_block_t(T, E)) if T else 0
    if interpret:
        return C >= 2
    return C >= ROUTER_PREFILL_BLOCKS and -(-H // router_block_h(E, H)) > ROUTER_PREFILL_WALK_STEPS


def router_logits_tile(T: int, E: int, H: int, *, interpret: bool = False,
                       tiles: bool | None = None) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_H) of the multi-launch router's split-H logits launch (decode: the routing
    block; prefill: ROUTER_PREFILL_T x ROUTER_PREFILL_H within ROUTER_PREFILL_ACC_BYTES)."""
    if not (router_prefill(T, E, H, interpret=interpret) if tiles is None else tiles):
        return router_block_t(T, E), router_block_h(E, H, interpret=interpret)
    if interpret:
        return 16, router_block_h(E, H, interpret=True)
    return min(ROUTER_PREFILL_T, max(16, ROUTER_PREFILL_ACC_BYTES // (4 * max(16, pow2(E))))), ROUTER_PREFILL_H


def prefill_router_split(T: int, E: int, H: int, *, interpret: bool = False, num_sms: int = DEFAULT_SMS) -> int:
    """H ranges of the prefill logits launch: split until tiles x ranges fill num_sms programs, each
    range keeping ROUTER_PREFILL_MIN_STEPS steps, at least 1."""
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


_pow2 = pow2  # megakernel_config's name for it


#: where no tuned table says otherwise, backend="auto" takes the megakernel up to this T (0: never)
MEGAKERNEL_MAX_T = 0


def select_backend(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                   fp8: str | None = None) -> str:
    """"megakernel" or "multi" for backend="auto": the ``backend`` tables (``backend_fp8`` for FP8
    weights, tuned only) in select_config's order, else the megakernel for T <= MEGAKERNEL_MAX_T
    (float weights) or "multi"."""
    return _backend_lookup(E, H, I, K, T, gpu, dtype, triton_version, fp8)[0]


def backend_source(E: int, H: int, I: int, K: int, T: int, *, gpu: str, dtype: str, triton_version: str,
                   fp8: str | None = None) -> str:
    """Where ``select_backend``'s choice comes from: "tuned", "model" or "heuristic"."""
    return _backend_lookup(E, H, I, K, T, gpu, dtype, triton_version, fp8)[1]


def _backend_lookup(E, H, I, K, T, gpu, dtype, triton_version, fp8) -> tuple[str, str]:
    model_of = (lambda g, d: _model_backends(g, d)) if fp8 is None else (lambda g, d: {})
    name, source = _lookup(E, H, I, K, T, gpu, dtype, triton_version,
                           lambda g, d, v: _backends(g, d, v, fp8), model_of)
    if name is None:
        return ("megakernel" if fp8 is None and T <= MEGAKERNEL_MAX_T else "multi"), "heuristic"
    return name, source


@cache
def _model_backends(gpu: str, dtype: str) -> dict:
    p = _model_file(gpu, dtype)
    return _backend_table(p, None) if p else {}


@cache
def _backends(gpu: str, dtype: str, triton_version: str, fp8: str | None = None) -> dict:
    p = config_path(gpu, dtype, triton_version)
    return _backend_table(p, fp8) if p.exists() else {}


def _backend_table(p: Path, fp8: str | None) -> dict:
    """{shape key: {bucket: backend}} of file ``p``'s "backend" (or ``backend_fp8[fp8]``) table."""
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
