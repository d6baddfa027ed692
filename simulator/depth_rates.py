"""Rates that depend on the bytes a reader keeps in flight: the L2 shared-read table and the deep
readers' HBM table.

Shape legend: P programs, S SMs, n programs in flight, g programs reading the same tile at once.

The calibrated readers keep a fixed depth of operand tiles in flight (L2_SHARED_READER_DEPTH_BYTES,
HBM_GRID_READER_DEPTH_BYTES); a program keeping more in flight reads as the readers it is worth
(Little's law: the tables' programs axis is bytes in flight). docs/cost-model.md has the evidence.
"""

from __future__ import annotations

import math

import numpy as np

from .hardware import Profile
from .rates import _km, _loglog_grid, hbm_rate, hbm_stream_rate

#: the shared-read table's largest programs read, in SMs (the table's programs clamp there, x S)
L2_READERS_EDGE = 2


def l2_shared_rate(profile: Profile, programs, group):
    """Aggregate L2 read bytes/s of ``programs`` programs reading shared tiles in groups of
    ``group`` at once (kernel_model.l2_shared_read; arrays broadcast; bilinear in log2 programs and
    log2 group, clamped at the table's edges, programs at most L2_READERS_EDGE x S), or None where
    the profile has no table."""
    km = _km(profile)
    if not km.l2_shared_rate:
        return None
    programs = np.minimum(np.asarray(programs, dtype=np.float64), L2_READERS_EDGE * profile.num_sms)
    return _loglog_grid(km.l2_shared_programs, km.l2_shared_groups, km.l2_shared_rate, programs, group)


#: bytes of weight tiles one program of the l2_shared step's reader keeps in flight
L2_SHARED_READER_DEPTH_BYTES = 48 << 10


def l2_readers(in_flight, depth) -> float:
    """The shared-read table's programs that ``in_flight`` programs each keeping ``depth`` bytes of
    operand tiles in flight are worth: in_flight x depth / L2_SHARED_READER_DEPTH_BYTES where depth
    is above the reader's, else in_flight."""
    n = max(1.0, float(in_flight))
    d = float(depth or 0.0)
    if d <= L2_SHARED_READER_DEPTH_BYTES:
        return n
    return n * d / L2_SHARED_READER_DEPTH_BYTES


def l2_intake_rate(profile: Profile, in_flight, depth) -> float:
    """Aggregate bytes/s the SMs take in from L2 (``sm_ingest_s``'s per-SM rate x S): l2_bandwidth_bytes_per_s,
    and for programs deeper than the reader's (``l2_readers``) where the profile has the
    shared-read table, at least the table's rate at those readers and group 1."""
    km = _km(profile)
    base = km.l2_bandwidth_bytes_per_s
    n = float(in_flight)
    eq = l2_readers(n, depth)
    if eq == max(1.0, n) or not km.l2_shared_rate:
        return base
    return max(base, float(l2_shared_rate(profile, eq, 1)))


#: bytes of weight tiles one program of the hbm grid's reader keeps in flight (the grid prices reads at it)
HBM_GRID_READER_DEPTH_BYTES = 48 << 10


def deep_table_covers(profile: Profile, depth: float) -> bool:
    """Whether the profile has the deep readers' table and it prices ``depth`` (weight bytes a program
    keeps in flight): above the hbm grid's reader (HBM_GRID_READER_DEPTH_BYTES; at it the grid prices
    the read) and above the table's shallowest reader."""
    km = _km(profile)
    if not (km.hbm_deep_rate and depth):
        return False
    return bool(depth > max(km.hbm_deep_depths[0], HBM_GRID_READER_DEPTH_BYTES))


def _log2_interp(axes: tuple, table, point) -> float:
    """``table`` (len(axes[0]), ..., len(axes[-1])) at ``point`` (one coordinate per axis):
    multilinear in log2 of every coordinate, clamped at each axis's ends."""
    vals = np.asarray(table, dtype=np.float64)
    for ax, x in zip(axes, point):  # reduce the leading axis each time
        xs = np.log2(np.asarray(ax, dtype=np.float64))
        v = math.log2(max(float(x), 1e-300))
        if xs.size == 1:
            vals = vals[0]
            continue
        i = int(np.clip(np.searchsorted(xs, v) - 1, 0, xs.size - 2))
        f = float(np.clip((v - xs[i]) / (xs[i + 1] - xs[i]), 0.0, 1.0))
        vals = vals[i] + f * (vals[i + 1] - vals[i])
    return float(vals)


def _deep_grid_rate(profile: Profile, programs, depth, group, bytes_per_program) -> float:
    km = _km(profile)
    axes = (km.hbm_deep_programs, km.hbm_deep_depths, km.hbm_deep_groups, km.hbm_deep_bytes)
    return _log2_interp(axes, km.hbm_deep_rate, (max(float(programs), 1.0), depth, max(float(group), 1.0),
                                                 max(float(bytes_per_program), 1.0)))


def _deep_grid_stream(profile: Profile, programs, depth, group) -> float:
    """The deep table's marginal rate between its two largest bytes per program at every grid
    node (``hbm_stream_rate``'s rule, never below the one-shot rate of the largest), interpolated
    at (programs, depth, group) as ``_log2_interp``."""
    km = _km(profile)
    rate = np.asarray(km.hbm_deep_rate, dtype=np.float64)  # (n, d, g, m)
    bs = np.asarray(km.hbm_deep_bytes, dtype=np.float64)
    if bs.size < 2:
        col = rate[..., 0]
    else:
        ns = np.asarray(km.hbm_deep_programs, dtype=np.float64)[:, None, None]
        t1, t2 = ns * bs[-2] / rate[..., -2], ns * bs[-1] / rate[..., -1]
        col = np.where(t2 > t1, ns * (bs[-1] - bs[-2]) / np.maximum(t2 - t1, 1e-30), rate[..., -1])
        col = np.maximum(col, rate[..., -1])
    axes = (km.hbm_deep_programs, km.hbm_deep_depths, km.hbm_deep_groups)
    return _log2_interp(axes, col, (max(float(programs), 1.0), depth, max(float(group), 1.0)))


def deep_read_rate(profile: Profile, programs, depth, group, bytes_per_program) -> float:
    """Bytes/s that ``programs`` programs in flight read, each keeping ``depth`` weight bytes in flight
    and reading ``bytes_per_program``, in groups of ``group`` reading the same tiles at once (g x the
    DRAM rate): the deep table (kernel_model.hbm_deep_read), multilinear in log2 of the four, clamped
    at its edges. Above its largest programs (one per SM: the table has no SM with two such programs)
    at least g x the hbm grid's rate at programs / g (``hbm_rate``), a shallower reader of the same
    programs."""
    km = _km(profile)
    r = _deep_grid_rate(profile, programs, depth, group, bytes_per_program)
    if programs > km.hbm_deep_programs[-1]:
        g = max(float(group), 1.0)
        r = max(r, g * float(hbm_rate(profile, programs / g, bytes_per_program)))
    return r


def deep_stream_rate(profile: Profile, programs, depth, group) -> float:
    """``deep_read_rate`` of programs that keep streaming back to back: the deep table's
    marginal rate between its two largest bytes per program, never below the one-shot rate of the
    largest; above the table's programs at least g x ``hbm_stream_rate`` at programs / g."""
    km = _km(profile)
    r = _deep_grid_stream(profile, programs, depth, group)
    if programs > km.hbm_deep_programs[-1]:
        g = max(float(group), 1.0)
        r = max(r, g * float(hbm_stream_rate(profile, programs / g)))
    return r
