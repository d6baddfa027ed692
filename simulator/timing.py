"""Pure timing functions: bytes and FLOPs to seconds.  No SimPy, no state.

Shape legend: n experts (or expert slots) on one GPU, H hidden, I expert width.

The expert GEMM model is tile-level, not a bare roofline. For one stage of a grouped GEMM
(gate/up: [M, H] x [H, 2I]; down: [M, I] x [I, H]) over experts with M_e rows each:

    tm_e       = min(tile_m, max(min_tile_m, next power of two >= M_e))   (small-batch tiles)
    tiles_e    = ceil(M_e / tm_e) * ceil(N / tn)                (padding rows compute too)
    tile_s_e   = 2 * tm_e * tn * K / (peak / S_gpu * eff(M_e))
    tn         = tile_n or tile_n / 2 (>= 64), whichever gives the shorter compute_s (a tuned config)
    compute_s  = max(ceil(sum tiles / S_used) * mean tile_s,    (waves over the SMs in use;
                     longest tile)                              a wave lasts its longest tile)
    hbm_s      = (weights of touched experts + activations in and out) / HBM rate
    stage_s    = max(compute_s, hbm_s)

eff(M) is the profile's efficiency curve over rows per expert (piecewise linear in log2 rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .hardware import Profile

#: Activation / weight element formats: bytes per element and the extra bytes of block scales.
DTYPES = ("bf16", "fp8")
FP8_BLOCK = 128  # fp8 values carry one float32 scale per 128 elements (DeepEP / DeepSeek format)
_CONFIG_DTYPE = {"bfloat16": "bf16", "float16": "bf16", "float32": "bf16", "fp8_e4m3": "fp8"}


def normalize_dtype(name: str) -> str:
    """'bf16' | 'fp8' from a short or a MoEConfig.weight_dtype name."""
    if name in DTYPES:
        return name
    if name in _CONFIG_DTYPE:
        return _CONFIG_DTYPE[name]
    raise ValueError(f"dtype must be one of {DTYPES} (or {sorted(_CONFIG_DTYPE)}), got {name!r}")


def row_bytes(width: int, dtype: str) -> int:
    """Bytes of one row of ``width`` elements: bf16 2/elem; fp8 1/elem + a float32 per 128."""
    if dtype == "bf16":
        return 2 * width
    if dtype == "fp8":
        return width + 4 * math.ceil(width / FP8_BLOCK)
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def transfer_s(num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """alpha-beta time of one message: latency + bytes / bandwidth (0 bytes: 0 s)."""
    return 0.0 if num_bytes <= 0 else latency_s + num_bytes / bandwidth_bytes_per_s


def gemm_efficiency(rows, curve: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Fraction of tensor peak at ``rows`` rows per expert: (n,) -> (n,)."""
    xs = np.log2([p[0] for p in curve])
    ys = np.array([p[1] for p in curve])
    r = np.log2(np.maximum(np.asarray(rows, dtype=np.float64), 1.0))
    return np.interp(r, xs, ys)


def tile_widths(profile: Profile) -> tuple[int, ...]:
    """Tile widths a tuned kernel may pick: the profile's, and half of it if that is >= 64."""
    return (profile.tile_n, profile.tile_n // 2) if profile.tile_n // 2 >= 64 else (profile.tile_n,)


def tile_rows(rows, profile: Profile) -> np.ndarray:
    """(n,) tile height per expert: the next power of two >= rows, within [min_tile_m, tile_m]."""
    r = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    p2 = 1 << np.ceil(np.log2(r)).astype(np.int64)
    return np.clip(p2, profile.min_tile_m, profile.tile_m)


@dataclass(frozen=True)
class GemmCost:
    """Cost of GEMM work on one GPU.  Times in s, FLOPs useful (no padding), bytes of HBM traffic."""

    time_s: float
    compute_s: float
    hbm_s: float
    flops: float
    padded_flops: float
    hbm_bytes: float
    tiles: int

    def __add__(self, other: GemmCost) -> GemmCost:
        return GemmCost(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple:
        return (self.time_s, self.compute_s, self.hbm_s, self.flops, self.padded_flops, self.hbm_bytes, self.tiles)


ZERO_COST = GemmCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)


def stage_cost(rows, n_cols: int, k_dim: int, *, profile: Profile, num_sms: int, peak_flops_per_s: float,
               weight_bytes_per_elem: float, in_row_bytes: float, out_row_bytes: float,
               read_weights: bool = True, hbm_bytes_per_s: float | None = None) -> GemmCost:
    """One grouped-GEMM stage: rows (n,) per expert, [M_e, k_dim] x [k_dim, n_cols] each."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows > 0]
    if rows.size == 0:
        return ZERO_COST
    tm = tile_rows(rows, profile)  # (n,)
    eff = gemm_efficiency(rows, profile.gemm_efficiency)
    sm_rate = peak_flops_per_s / profile.num_sms
    best = None
    for tn in tile_widths(profile):  # a tuned kernel picks the tile width that finishes first
        tiles = (-(-rows // tm)) * (-(-n_cols // tn))  # (n,)
        tile_s = 2.0 * tm * tn * k_dim / (sm_rate * eff)  # (n,)
        total_tiles = int(tiles.sum())
        mean_tile_s = float((tiles * tile_s).sum()) / total_tiles
        compute_s = max(math.ceil(total_tiles / num_sms) * mean_tile_s, float(tile_s.max()))
        if best is None or compute_s < best[0]:
            best = (compute_s, total_tiles, 2.0 * float((tiles * tm).sum()) * tn * k_dim)
    compute_s, total_tiles, padded = best
    weights = float(rows.size) * n_cols * k_dim * weight_bytes_per_elem if read_weights else 0.0
    acts = float(rows.sum()) * (in_row_bytes + out_row_bytes)
    hbm_bytes = weights + acts
    hbm_rate = profile.hbm_effective_bytes_per_s if hbm_bytes_per_s is None else hbm_bytes_per_s
    hbm_s = hbm_bytes / hbm_rate
    flops = 2.0 * float(rows.sum()) * n_cols * k_dim
    return GemmCost(max(compute_s, hbm_s), compute_s, hbm_s, flops, padded, hbm_bytes, total_tiles)


def compute_dtype(weight_dtype: str, act_dtype: str) -> str:
    """Tensor-core format: fp8 only when both operands are fp8."""
    return "fp8" if weight_dtype == "fp8" and act_dtype == "fp8" else "bf16"


def ffn_cost(rows, hidden: int, width: int, *, profile: Profile, num_sms: int, weight_dtype: str,
             act_dtype: str, read_weights: bool = True, hbm_bytes_per_s: float | None = None,
             stage_sync_s: float = 0.0) -> GemmCost:
    """Gated expert FFN on one GPU: gate/up [H -> 2I], SiLU*up fused, down [I -> H].

    rows: (n,) rows per expert (0 = untouched, no weights read). The input rows are in
    ``act_dtype``, the intermediate too (fp8 re-quantized, as DeepSeek does), the output bf16.
    ``stage_sync_s`` is paid once between the two stages if any row exists.
    """
    wb = 1.0 if weight_dtype == "fp8" else 2.0
    peak = profile.tensor_flops_per_s[compute_dtype(weight_dtype, act_dtype)]
    kw = dict(profile=profile, num_sms=num_sms, peak_flops_per_s=peak, weight_bytes_per_elem=wb,
              read_weights=read_weights, hbm_bytes_per_s=hbm_bytes_per_s)
    s1 = stage_cost(rows, 2 * width, hidden, in_row_bytes=row_bytes(hidden, act_dtype),
                    out_row_bytes=row_bytes(width, act_dtype), **kw)
    s2 = stage_cost(rows, hidden, width, in_row_bytes=row_bytes(width, act_dtype),
                    out_row_bytes=row_bytes(hidden, "bf16"), **kw)
    total = s1 + s2
    if total.tiles and stage_sync_s:
        total = GemmCost(total.time_s + stage_sync_s, *total.astuple()[1:])
    return total


def ffn_roofline_s(rows, hidden: int, width: int, *, profile: Profile, weight_dtype: str, act_dtype: str) -> float:
    """Lower bound of ``ffn_cost`` on the whole GPU: useful FLOPs at peak x eff(rows), weights read once.

    Each expert's FLOPs at eff(M_e), summed, against its HBM bytes; the tile model's padding, wave
    quantization and per-minibatch weight re-reads can only add to it (eff never falls as rows grow).
    """
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows > 0]
    if rows.size == 0:
        return 0.0
    wb = 1.0 if weight_dtype == "fp8" else 2.0
    peak = profile.tensor_flops_per_s[compute_dtype(weight_dtype, act_dtype)]
    eff = gemm_efficiency(rows, profile.gemm_efficiency)
    flops_e = 2.0 * rows * 3.0 * hidden * width
    compute_s = float((flops_e / (peak * eff)).sum())
    weights = rows.size * 3.0 * hidden * width * wb
    acts = float(rows.sum()) * (row_bytes(hidden, act_dtype) + 2 * row_bytes(width, act_dtype) + row_bytes(hidden, "bf16"))
    return max(compute_s, (weights + acts) / profile.hbm_effective_bytes_per_s)
