"""The calibrated rates one GPU's work runs at: tensor cores, HBM, L2, serial steps.

Shape legend: P programs of a launch, S SMs, o programs resident per SM, n programs in flight,
BM/BN/BK tile rows/columns/depth, E experts.

Every number comes from the profile (``hardware.Profile``, its ``kernel`` section calibrated by
``megamoe calibrate``); docs/cost-model.md says what each term is and why it is there.

    o(warps)          occupancy table of the profile (programs per SM by num_warps)
    mma(BM, BN, BK)   per-SM tensor rate of that tile shape (calibrated table, nearest shape,
                      log-interpolated in depth; without one: peak / S x gemm_efficiency(BM))
    hbm(n, b)         aggregate one-shot read rate of n programs reading b bytes each (kernel_model.hbm_read)
    hbm_stream(n)     the same grid's marginal rate: programs that keep streaming
"""

from __future__ import annotations

import math

import numpy as np

from ..reference.sizes import long_dtype
from ..reference.tiles import route_select_key
from .hardware import GEMM_LOADS, KernelModel, Profile

#: Activation / weight element formats the rack model takes (16-bit and wider formats run as bf16).
DTYPES = ("bf16", "fp8")


def normalize_dtype(name: str) -> str:
    """'bf16' | 'fp8' from a short or a MoEConfig.weight_dtype name."""
    if name in DTYPES:
        return name
    try:
        return "fp8" if long_dtype(name) == "fp8_e4m3" else "bf16"
    except ValueError:
        raise ValueError(f"dtype must be one of {DTYPES} (or a MoEConfig weight_dtype), got {name!r}") from None


def compute_dtype(weight_dtype: str, act_dtype: str) -> str:
    """Tensor-core format: fp8 only when both operands are fp8."""
    return "fp8" if weight_dtype == "fp8" and act_dtype == "fp8" else "bf16"


def transfer_s(num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """alpha-beta time of one message: latency + bytes / bandwidth (0 bytes: 0 s)."""
    return 0.0 if num_bytes <= 0 else latency_s + num_bytes / bandwidth_bytes_per_s


def _km(profile: Profile) -> KernelModel:
    if profile.kernel is None:
        raise ValueError(f"profile {profile.name!r} has no kernel model (load it with hardware.load_profile)")
    return profile.kernel


def gemm_efficiency(rows, curve: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Fraction of tensor peak at ``rows`` rows per expert: (n,) -> (n,) (piecewise linear in log2)."""
    xs = np.log2([p[0] for p in curve])
    ys = np.array([p[1] for p in curve])
    r = np.log2(np.maximum(np.asarray(rows, dtype=np.float64), 1.0))
    return np.interp(r, xs, ys)


def occupancy(profile: Profile, num_warps: int) -> int:
    """Programs resident per SM for tiles of ``num_warps`` warps (the profile's table, the entry at
    the largest warp count <= num_warps)."""
    occ = _km(profile).occupancy
    best = occ[0][1]
    for w, o in occ:
        if w <= num_warps:
            best = o
    return max(1, int(best))


#: the fewest tile rows the dense-GEMM tables price (below, the on-chip mma table gives the rate)
GEMM_TABLE_MIN_ROWS = 128


def mma_rate_per_sm(profile: Profile, block_m, block_n, depth, num_warps, rows=None, *, dtype: str = "bf16",
                    loads: str = "any"):
    """Tensor FLOP/s of one SM running tiles (BM x BN, reduction ``depth``) at full occupancy, for
    ``dtype`` "bf16" or "fp8" (e4m3 x e4m3, fp32 accumulate).

    Arrays broadcast. Calibrated: the table's nearest (BM, BN, warps) shape in log distance, its
    rate interpolated in log2(depth), at most ``mma_sustained_flops_per_s`` / SMs (a large dense
    GEMM's measured rate: the table's on-chip bursts run at clocks a real GEMM does not keep); fp8
    reads the measured fp8 table (``kernel_model.mma_fp8``) where the profile has one, otherwise the
    bf16 table scaled by the fp8/bf16 peak ratio. Without a bf16 table: the peak per SM x
    gemm_efficiency read at the tile height BM. ``rows`` (rows per expert) is accepted and unused.
    ``loads``: how the kernel brings its operands, a key of hardware.GEMM_LOADS ("pointer": the
    pointer GEMMs, one tile per program; "pointer_persistent": the megakernel; "tma_persistent" /
    "tma_ab_persistent": GEMM 1 / GEMM 2 of the persistent TMA GEMMs, ...): bf16 then reads the
    dense-GEMM table of that tile loop (``kernel_model.gemm_<loads>``, megamoe/calibrate/microbench_gemm.py:
    operands from HBM, a grouped tile order, waves and stores) where the profile has it, or its
    fallback; "any" (the rack model) and profiles without one read the on-chip table. The L2-fed
    pointer table ``mma_pointer`` is recorded, not read."""
    if loads != "any" and loads not in GEMM_LOADS:
        raise ValueError(f"loads must be 'any' or one of {sorted(GEMM_LOADS)}, got {loads!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    km = _km(profile)
    bm = np.asarray(block_m, dtype=np.float64)
    if dtype == "fp8" and km.mma_fp8:
        return _table_rate(km.mma_fp8, bm, block_n, depth, num_warps)
    if not km.mma:  # the efficiency curve read at the tile height
        return profile.tensor_flops_per_s[dtype] / profile.num_sms * gemm_efficiency(bm, profile.gemm_efficiency)
    scale = profile.tensor_flops_per_s[dtype] / profile.tensor_flops_per_s["bf16"]
    rate = _table_rate(km.mma, bm, block_n, depth, num_warps)
    gemm = km.gemm_table(loads) if loads != "any" else ()
    if gemm:  # tiles of GEMM_TABLE_MIN_ROWS+ rows: the dense GEMM's rate (below, it is bound by its operand traffic)
        rate = np.where(bm >= GEMM_TABLE_MIN_ROWS, _table_rate(gemm, bm, block_n, depth, num_warps), rate)
        rate = rate if np.ndim(rate) else float(rate)
    if km.mma_sustained_flops_per_s > 0:  # on-chip bursts capped at what a large dense GEMM sustains
        rate = np.minimum(rate, km.mma_sustained_flops_per_s / profile.num_sms)
        rate = rate if np.ndim(rate) else float(rate)
    return rate * scale


def _nearest_shape(shapes: np.ndarray, block_m, block_n, num_warps) -> np.ndarray:
    """Index into ``shapes`` ((n, 3): BLOCK_M, BLOCK_N, warps) of the calibrated tile shape nearest
    each query (arrays broadcast): squared log2 distance, warps weighted a quarter."""
    bm, bn, w = (np.asarray(v, dtype=np.float64)[..., None] for v in (block_m, block_n, num_warps))
    dist = np.log2(bm / shapes[:, 0]) ** 2 + np.log2(bn / shapes[:, 1]) ** 2 + 0.25 * np.log2(w / shapes[:, 2]) ** 2
    return np.argmin(dist, axis=-1)


def _table_rate(table: tuple, block_m, block_n, depth, num_warps):
    """A calibrated mma table ((BM, BN, warps, depth, flop/s per SM), ...) read at the nearest
    (BM, BN, warps) shape in log distance, interpolated in log2(depth); a float for scalar inputs."""
    bm = np.asarray(block_m, dtype=np.float64)
    bn = np.asarray(block_n, dtype=np.float64)
    dp = np.maximum(np.asarray(depth, dtype=np.float64), 1.0)
    w = np.asarray(num_warps, dtype=np.float64)
    bm, bn, dp, w = np.broadcast_arrays(bm, bn, dp, w)
    tab = np.asarray(table)  # (m, 5)
    shapes = np.unique(tab[:, :3], axis=0)
    pick = _nearest_shape(shapes, bm, bn, w)
    out = np.empty(bm.shape)
    for j, sh in enumerate(shapes):
        m = pick == j
        if not m.any():
            continue
        rows_j = tab[np.all(tab[:, :3] == sh, axis=1)]
        rows_j = rows_j[np.argsort(rows_j[:, 3])]
        out[m] = np.interp(np.log2(dp[m]), np.log2(rows_j[:, 3]), rows_j[:, 4])
    return out if out.ndim else float(out)


def hbm_rate(profile: Profile, programs_in_flight, bytes_per_program):
    """Aggregate streaming-read bytes/s with ``programs_in_flight`` programs each reading
    ``bytes_per_program`` (kernel_model.hbm_read; arrays broadcast; bilinear in log-log, clamped at
    the grid's edges)."""
    km = _km(profile)
    return _loglog_grid(km.hbm_programs, km.hbm_bytes, km.hbm_rate, programs_in_flight, bytes_per_program)


def _loglog_grid(rows, cols, table, x, y):
    """table (len(rows), len(cols)) at (x, y) (arrays broadcast): linear in log2 of both
    coordinates, along y within each row, then between the rows; clamped at the grid's edges."""
    ns = np.log2(np.asarray(rows, dtype=np.float64))
    bs = np.log2(np.asarray(cols, dtype=np.float64))
    rate = np.asarray(table, dtype=np.float64)  # (n, m)
    n = np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0))
    b = np.log2(np.maximum(np.asarray(y, dtype=np.float64), 1.0))
    n, b = np.broadcast_arrays(n, b)
    along_b = np.stack([np.interp(b, bs, rate[i]) for i in range(rate.shape[0])], axis=-1)  # (..., n)
    if ns.size == 1:
        out = along_b[..., 0]
    else:
        i = np.clip(np.searchsorted(ns, n) - 1, 0, ns.size - 2)
        f = np.clip((n - ns[i]) / (ns[i + 1] - ns[i]), 0.0, 1.0)
        lo = np.take_along_axis(along_b, i[..., None], -1)[..., 0]
        hi = np.take_along_axis(along_b, (i + 1)[..., None], -1)[..., 0]
        out = lo + f * (hi - lo)
    return out if out.ndim else float(out)


def hbm_stream_rate(profile: Profile, programs_in_flight):
    """Aggregate bytes/s of programs that keep streaming (a persistent kernel's tasks, back to back):
    the marginal rate of the calibrated grid between its two largest bytes per program,
    n (b2 - b1) / (t2 - t1) with t = n b / hbm_rate(n, b), so the one-shot launch's ramp (programs
    starting together, first loads in flight) is not charged to every task (linear in log2 n).
    A grid with one bytes column: its rates."""
    km = _km(profile)
    bs = np.asarray(km.hbm_bytes, dtype=np.float64)
    ns = np.asarray(km.hbm_programs, dtype=np.float64)
    rate = np.asarray(km.hbm_rate, dtype=np.float64)
    if bs.size < 2:
        col = rate[:, 0]
    else:
        t1, t2 = ns * bs[-2] / rate[:, -2], ns * bs[-1] / rate[:, -1]
        col = np.where(t2 > t1, ns * (bs[-1] - bs[-2]) / np.maximum(t2 - t1, 1e-30), rate[:, -1])
        col = np.maximum(col, rate[:, -1])  # never below the one-shot rate of the same programs
    n = np.log2(np.maximum(np.asarray(programs_in_flight, dtype=np.float64), 1.0))
    out = np.interp(n, np.log2(ns), col)
    return out if np.ndim(out) else float(out)


def hbm_peak(profile: Profile) -> float:
    """The highest streaming-read rate in the profile's table (the floor's rate)."""
    return float(np.max(_km(profile).hbm_rate))


def launch_read_s(profile: Profile, dram_bytes: float, programs: int, in_flight: int, *, scale: float = 1.0) -> float:
    """HBM time of one launch of ``programs`` programs reading ``dram_bytes`` in all (dram_bytes /
    programs each), at most ``in_flight`` of them resident (the launch's slots). The first wave's
    n = min(programs, in_flight) programs start together: a one-shot read, hbm_rate(n, b). The
    programs of later waves start one by one as earlier ones end, while the others keep streaming,
    so their bytes go at the marginal rate of n programs in flight, hbm_stream_rate(n) (the rate the
    megakernel's back-to-back tasks read at), without the one-shot's ramp again. One wave: the
    one-shot read alone. ``scale`` multiplies both rates (a job sharing HBM with copies)."""
    if dram_bytes <= 0 or programs <= 0:
        return 0.0
    n = max(1, min(int(programs), int(in_flight)))
    b = dram_bytes / programs
    first = n * b
    t = first / (scale * float(hbm_rate(profile, n, b)))
    if programs > n:
        t += (dram_bytes - first) / (scale * float(hbm_stream_rate(profile, n)))
    return t


def sm_copy_rate(profile: Profile, copying_sms) -> float:
    """Bytes/s ONE SM copies when ``copying_sms`` SMs copy together (linear in log2 SMs)."""
    pts = _km(profile).sm_copy
    xs = np.log2([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    return float(np.interp(math.log2(max(copying_sms, 1)), xs, ys))


def waves_s(programs, program_s, slots: int) -> float:
    """Time of groups of ``programs`` (g,) each lasting ``program_s`` (g,) on ``slots`` program
    slots: max(ceil(total / slots) x mean program time, longest program)."""
    n = np.atleast_1d(np.asarray(programs, dtype=np.float64))
    t = np.broadcast_to(np.asarray(program_s, dtype=np.float64), n.shape)
    total = float(n.sum())
    if total <= 0:
        return 0.0
    mean = float((n * t).sum()) / total
    return max(math.ceil(total / max(slots, 1)) * mean, float(t[n > 0].max()))


def sm_ingest_s(programs: int, bytes_per_program: float, profile: Profile, rate: float | None = None) -> float:
    """The time the SMs take to take in ``programs`` programs' operands, each reading
    ``bytes_per_program``: every byte a program loads reaches its SM through L2, and an SM takes in
    at most its share of the L2 rate (kernel_model.l2_bandwidth_bytes_per_s / SMs), whether the
    bytes hit in L2 or come from HBM; programs sharing an SM share it, so the SMs work through
    ceil(programs / SMs) programs' bytes each (``waves_s`` over the SMs). It binds where a launch
    has few waves of large tiles: the aggregate rates see the bytes, not how unevenly the SMs get
    them. 0 without an L2 rate.
    ``rate``: the aggregate L2 rate the SMs share (default l2_bandwidth_bytes_per_s; ``l2_intake_rate``)."""
    km = _km(profile)
    if km.l2_bandwidth_bytes_per_s <= 0 or programs <= 0 or bytes_per_program <= 0:
        return 0.0
    per_sm = (km.l2_bandwidth_bytes_per_s if rate is None else rate) / profile.num_sms
    return waves_s(programs, bytes_per_program / per_sm, profile.num_sms)


def grouped_dram_bytes(blocks_e, tiles_e, a: float, b: float, out: float, group_m: int) -> float:
    """DRAM bytes of a grouped GEMM in grouped tile order (GROUP_M row blocks sweep the N tiles):
    the rows a of a row block read once, the weight tile b once per N tile per group, out written
    once per program. blocks_e (E,) row blocks, tiles_e (E,) programs per expert."""
    be = np.asarray(blocks_e, dtype=np.float64)
    te = np.asarray(tiles_e, dtype=np.float64)
    m = (be > 0) & (te > 0)
    be, te = be[m], te[m]
    if be.size == 0:
        return 0.0
    n_tiles = te / be
    total = (be * a * np.minimum(n_tiles, 1.0)).sum()
    total += (n_tiles * np.ceil(be / max(1, group_m)) * b).sum()
    total += (te * out).sum()
    return float(total)


def reduce_step_at_width(profile: Profile, width: float) -> float | None:
    """Seconds of one top-1 pass over rows of ``width`` scores: kernel_model.serial_reduce_width,
    linear in log2 width between its points, clamped at its first and last; None without the table."""
    tab = _km(profile).serial_reduce_width
    if not tab:
        return None
    xs = [math.log2(float(w)) for w, _ in tab]
    return float(np.interp(math.log2(max(float(width), 1.0)), xs, [float(t) for _, t in tab]))


def selection_width(num_experts: int) -> int:
    """The width of a top-k selection's score rows: the experts padded to a power of two, at least 16
    (the routers' and the megakernel's BLOCK_E, kernels/plan.router_launch, kernels/megakernel)."""
    return max(16, 1 << max(int(num_experts) - 1, 0).bit_length())


def serial_step_s(profile: Profile, kind: str, width: float | None = None) -> float:
    """Seconds of one serial step of ``kind`` "load" (the router's load + dot step) or "reduce"
    (a dependent row reduction): kernel_model.serial_load_step_s / serial_reduce_step_s, one
    program's step, however many programs run such chains at once (the tables by programs,
    serial_load_step / serial_reduce_step, are recorded, not read). ``width``: a "reduce" that is a
    top-k selection's pass over rows of that many scores (BLOCK_E), read at
    kernel_model.serial_reduce_width where the profile has it."""
    km = _km(profile)
    if kind not in ("load", "reduce"):
        raise ValueError(f"kind must be 'load' or 'reduce', got {kind!r}")
    if kind == "load":
        return km.serial_load_step_s
    if width:
        at = reduce_step_at_width(profile, width)
        if at is not None:
            return at
    return km.serial_reduce_step_s


def route_select_s(profile: Profile, tile: dict) -> float | None:
    """Seconds of one routing program's selection (a router stage's ``tile``: ROUTER code, BLOCK_E, K,
    N_GROUP, BLOCK_T, BITONIC; reference.tiles.route_select_key) from the profile's measured
    kernel_model.route_select, or None where it has no point for that key (then the stage's "select"
    reductions are priced by the serial reduce step)."""
    key = route_select_key(*(tile.get(k, -2) for k in ("ROUTER", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC")))
    n = len(key)
    for p in _km(profile).route_select:
        if len(p) == n + 1 and tuple(p[:n]) == key:
            return float(p[n])
    return None
