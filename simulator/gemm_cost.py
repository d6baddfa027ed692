"""The rack model's grouped GEMMs: a launch built from rows per expert, priced by the same rates.

Shape legend: E experts (n of them with rows), H hidden, I expert width, S SMs, BM/BN tile rows/columns.

The launch the rack model assumes: tiles of tile_rows(M_e) x BN (BN the faster of the tuned widths),
occupancy by warps, waves over the slots, the per-SM MMA rate, DRAM bytes of grouped tile order, and
the HBM rate of the programs in flight. ``ffn_roofline_s`` is its lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..reference.sizes import ffn_flops, ffn_params, row_bytes, weight_bytes_per_element
from .hardware import Profile
from .rates import compute_dtype, grouped_dram_bytes, hbm_peak, launch_read_s, mma_rate_per_sm, occupancy, waves_s

#: tile order of the grouped GEMMs when a plan does not say (Triton's GROUP_M of our configs)
DEFAULT_GROUP_M = 8


def tile_widths(profile: Profile) -> tuple[int, ...]:
    """Tile widths a tuned kernel may pick: the profile's, and half of it if that is >= 64."""
    return (profile.tile_n, profile.tile_n // 2) if profile.tile_n // 2 >= 64 else (profile.tile_n,)


def tile_rows(rows, profile: Profile) -> np.ndarray:
    """(n,) tile height per expert: the next power of two >= rows, within [min_tile_m, tile_m]."""
    r = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    p2 = 1 << np.ceil(np.log2(r)).astype(np.int64)
    return np.clip(p2, profile.min_tile_m, profile.tile_m)


def _warps(tm) -> np.ndarray:
    """num_warps the rack model assumes for a tile height (8 for 128-row tiles, 4 below)."""
    return np.where(np.asarray(tm) >= 128, 8, 4)


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
    stream: tuple = field(default=None, repr=False, compare=False)  # (tiles (n,), tile_s (n,), program slots)

    def __add__(self, other: GemmCost) -> GemmCost:
        return GemmCost(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple:
        return (self.time_s, self.compute_s, self.hbm_s, self.flops, self.padded_flops, self.hbm_bytes, self.tiles)


ZERO_COST = GemmCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)


def _stage_tiles(rows, n_cols: int, k_dim: int, profile: Profile, num_sms: int, peak_flops_per_s: float,
                 mma_dtype: str) -> tuple:
    """(compute_s, tn, blocks, tiles, tile_s, slots) of a stage's tiles at the tile width that finishes first."""
    tm = tile_rows(rows, profile)  # (n,)
    warps = _warps(tm)
    occ = np.array([occupancy(profile, int(w)) for w in warps])
    base_peak = profile.tensor_flops_per_s[mma_dtype]
    best = None
    for tn in tile_widths(profile):  # a tuned kernel picks the tile width that finishes first
        blocks = -(-rows // tm)
        tiles = blocks * (-(-n_cols // tn))  # (n,)
        slots = num_sms * int(occ.min())
        share = np.minimum(occ, math.ceil(min(int(tiles.sum()), slots) / num_sms))
        rate = (mma_rate_per_sm(profile, tm, tn, k_dim, warps, rows, dtype=mma_dtype)
                * (peak_flops_per_s / base_peak) / share)
        tile_s = np.broadcast_to(2.0 * tm * tn * k_dim / rate, tiles.shape)  # (n,)
        compute_s = waves_s(tiles, tile_s, slots)
        if best is None or compute_s < best[0]:
            best = (compute_s, tn, blocks, tiles, tile_s, slots)
    return best


def stage_cost(rows, n_cols: int, k_dim: int, *, profile: Profile, num_sms: int, peak_flops_per_s: float,
               weight_bytes_per_elem: float, in_row_bytes: float, out_row_bytes: float,
               read_weights: bool = True, hbm_bytes_per_s: float | None = None,
               mma_dtype: str = "bf16") -> GemmCost:
    """One grouped-GEMM stage on ``num_sms`` SMs: rows (n,) per expert, [M_e, k_dim] x [k_dim, n_cols].

    The launch the rack model assumes: tiles of tile_rows(M_e) x tn (tn the faster of the tuned
    widths), occupancy by warps, waves over the slots, the per-SM rate ``mma_rate_per_sm`` of
    ``mma_dtype`` (scaled to ``peak_flops_per_s`` over that dtype's peak), DRAM bytes of grouped
    tile order, and the HBM rate of the programs in flight (``hbm_bytes_per_s`` caps it, for jobs
    sharing HBM with copies). ``GemmCost.stream`` keeps the tiles for ``ffn_cost(one_stream=True)``."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows > 0]
    if rows.size == 0:
        return ZERO_COST
    compute_s, tn, blocks, tiles, tile_s, slots = _stage_tiles(rows, n_cols, k_dim, profile, num_sms,
                                                               peak_flops_per_s, mma_dtype)
    tm = tile_rows(rows, profile)
    total_tiles = int(tiles.sum())
    padded = 2.0 * float((tiles * tm).sum()) * tn * k_dim
    acts = float(rows.sum()) * (in_row_bytes + out_row_bytes)
    weights = float(rows.size) * n_cols * k_dim * weight_bytes_per_elem if read_weights else 0.0
    regroup = 0.0
    if read_weights:  # grouped tile order re-reads a weight tile once per group of row blocks
        w_tile = tn * k_dim * weight_bytes_per_elem
        regroup = grouped_dram_bytes(blocks, tiles, 0.0, w_tile, 0.0, DEFAULT_GROUP_M) - weights
        regroup = max(0.0, regroup)
    hbm_bytes = weights + regroup + acts
    scale = 1.0 if hbm_bytes_per_s is None else hbm_bytes_per_s / hbm_peak(profile)
    hbm_s = launch_read_s(profile, hbm_bytes, total_tiles, slots, scale=scale)
    flops = 2.0 * float(rows.sum()) * n_cols * k_dim
    return GemmCost(max(compute_s, hbm_s), compute_s, hbm_s, flops, padded, hbm_bytes, total_tiles,
                    (tiles, tile_s, slots))


def one_stream_s(first: GemmCost, second: GemmCost) -> float:
    """Compute time of two stages' tiles run as one stream on the same program slots (a persistent
    kernel's task queue: the second stage's tiles fill the first one's last wave): the waves of all
    the tiles, and at least one first-stage tile followed by the second stage's own waves (a
    second-stage tile needs its row block's first-stage tiles); never more than the two stages one
    after the other (the queue may run them so)."""
    (t1, s1, slots), (t2, s2, _) = first.stream, second.stream
    stream = waves_s(np.concatenate([t1, t2]), np.concatenate([s1, s2]), slots)
    return min(max(stream, float(s1.max()) + waves_s(t2, s2, slots)), first.compute_s + second.compute_s)


def ffn_row_bytes(hidden: int, width: int, act_dtype: str) -> int:
    """HBM bytes one row moves through ``ffn_cost``'s two stages: its input (``act_dtype``), the
    intermediate written and read back (``act_dtype``) and its bf16 output."""
    return row_bytes(hidden, act_dtype) + 2 * row_bytes(width, act_dtype) + row_bytes(hidden, "bf16")


def ffn_cost(rows, hidden: int, width: int, *, profile: Profile, num_sms: int, weight_dtype: str,
             act_dtype: str, read_weights: bool = True, hbm_bytes_per_s: float | None = None,
             stage_sync_s: float = 0.0, one_stream: bool = False) -> GemmCost:
    """Gated expert FFN on one GPU: gate/up [H -> 2I], SiLU*up fused, down [I -> H].

    rows: (n,) rows per expert (0 = untouched, no weights read). The input rows are in
    ``act_dtype``, the intermediate too (fp8 re-quantized, as DeepSeek does), the output bf16.
    ``stage_sync_s`` is paid once between the two stages if any row exists. ``one_stream``: both
    stages' tiles run as one stream on the same SMs (``one_stream_s``; a persistent kernel), else
    one launch after the other, each with its own last wave.
    """
    wb = weight_bytes_per_element(weight_dtype)  # fp8: with its 128 x 128 block scales
    cd = compute_dtype(weight_dtype, act_dtype)
    kw = dict(profile=profile, num_sms=num_sms, peak_flops_per_s=profile.tensor_flops_per_s[cd],
              weight_bytes_per_elem=wb, read_weights=read_weights, hbm_bytes_per_s=hbm_bytes_per_s, mma_dtype=cd)
    s1 = stage_cost(rows, 2 * width, hidden, in_row_bytes=row_bytes(hidden, act_dtype),
                    out_row_bytes=row_bytes(width, act_dtype), **kw)
    s2 = stage_cost(rows, hidden, width, in_row_bytes=row_bytes(width, act_dtype),
                    out_row_bytes=row_bytes(hidden, "bf16"), **kw)
    total = s1 + s2
    if one_stream and s1.tiles and s2.tiles:
        compute_s = one_stream_s(s1, s2)
        total = GemmCost(max(compute_s, s1.hbm_s + s2.hbm_s), compute_s, *total.astuple()[2:])
    if total.tiles and stage_sync_s:
        total = GemmCost(total.time_s + stage_sync_s, *total.astuple()[1:])
    return total


def ffn_roofline_terms(rows, hidden: int, width: int, *, profile: Profile, weight_dtype: str,
                       act_dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per expert (n,) of rows (n,): tensor seconds on the whole GPU at the best per-SM rate any of the
    rack model's tiles gets, weight bytes (read once) and activation bytes; zeros where rows are 0."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros((3, rows.size))
    on = rows > 0
    r = rows[on]
    if r.size == 0:
        return out[0], out[1], out[2]
    wb = weight_bytes_per_element(weight_dtype)  # fp8: with its 128 x 128 block scales
    cd = compute_dtype(weight_dtype, act_dtype)
    tm = tile_rows(r, profile)
    rate = np.zeros(r.size)
    for tn in tile_widths(profile):
        for k in (hidden, width):
            rate = np.maximum(rate, mma_rate_per_sm(profile, tm, tn, k, _warps(tm), r, dtype=cd))
    out[0, on] = ffn_flops(r, hidden, width) / (profile.num_sms * rate)
    out[1, on] = ffn_params(hidden, width) * wb
    out[2, on] = r * ffn_row_bytes(hidden, width, act_dtype)
    return out[0], out[1], out[2]


def ffn_roofline_parts(rows, hidden: int, width: int, *, profile: Profile, weight_dtype: str,
                       act_dtype: str) -> tuple[float, float, float]:
    """(tensor seconds on the whole GPU, weight bytes, activation bytes) of ``ffn_roofline_s``: useful
    FLOPs at the best per-SM rate any of the rack model's tiles gets, weights read once."""
    c, w, a = ffn_roofline_terms(rows, hidden, width, profile=profile, weight_dtype=weight_dtype, act_dtype=act_dtype)
    return float(c.sum()), float(w.sum()), float(a.sum())


def ffn_roofline_s(rows, hidden: int, width: int, *, profile: Profile, weight_dtype: str, act_dtype: str) -> float:
    """Lower bound of ``ffn_cost`` on the whole GPU: useful FLOPs at the best per-SM rate any of the
    rack model's tiles gets, weights read once, at the highest HBM rate of the profile."""
    compute_s, weights, acts = ffn_roofline_parts(rows, hidden, width, profile=profile, weight_dtype=weight_dtype,
                                                  act_dtype=act_dtype)
    return max(compute_s, (weights + acts) / hbm_peak(profile))
