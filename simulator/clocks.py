"""The SM clock under sustained tensor-core work: a plan's MMA terms over its busy window.

The calibrated MMA tables come from short launches at the clocks of an idle GPU; work that keeps the
tensor cores busy for milliseconds runs at a lower clock. ``kernel_model.sustained_mma`` (calibrate's
sustained step) gives the average rate over busy seconds from idle, ``kernel_model.sustained_duty``
how much of that fall a call sees at its MMA duty (its FLOPs over its time at the dense rate).
Memory, serial and launch terms are not scaled (HBM has its own clock). docs/cost-model.md has the
evidence.
"""

from __future__ import annotations

import numpy as np

from .hardware import Profile
from .rates import _km


def busy_window_s(call_s: float, calls_per_graph: int = 1, calls_before: float = 0.0) -> tuple[float, float]:
    """(seconds busy before the timed calls, seconds of the timed calls) of a prediction whose call
    takes ``call_s``: ``calls_before`` calls of it back to back from idle clocks, then the
    ``calls_per_graph`` calls of the replay the measurement times. Defaults: one call from idle (a
    single-call prediction). ``megamoe validate``'s rows: ``kernels.bench.calls_before_timed_replay``
    (the warm-up calls and the replays before the median one, all back to back)."""
    return max(calls_before, 0.0) * call_s, max(calls_per_graph, 1) * call_s


def sustained_ratio(profile: Profile, busy_s: float, before_s: float = 0.0) -> float:
    """The mean MMA rate over seconds [before_s, before_s + busy_s] of back-to-back work started from
    idle clocks, as a fraction of the short-launch rate the tables were measured at; 1.0 without
    kernel_model.sustained_mma or for an empty window.

    The table's points (t_i, r_i) are average ratios over [0, t_i]: the work done by t is read as
    W(t) = t x r(t), linear between (0, 0) and the points (each segment's slope is the measured rate
    of the graph's last part, between two graph lengths), past the last point at the last segment's
    slope (the clock stays where it fell); the window's ratio is (W(b) - W(a)) / (b - a), at most 1."""
    return sustained_table_ratio(_km(profile).sustained_mma, busy_s, before_s)


def sustained_table_ratio(tab, busy_s: float, before_s: float = 0.0) -> float:
    """``sustained_ratio`` read on the points ``tab`` ((busy seconds, average ratio from idle), ...)
    themselves (calibrate's duty points read the step's own points before a profile exists)."""
    if not tab or not busy_s > 0:
        return 1.0
    ts = np.array([0.0] + [t for t, _ in tab])
    ws = np.array([0.0] + [t * r for t, r in tab])
    slope = float((ws[-1] - ws[-2]) / (ts[-1] - ts[-2]))
    tail = min(slope, 1.0) if slope > 0 else tab[-1][1]  # a last segment that did no work: its average

    def work(t: float) -> float:
        return float(np.interp(t, ts, ws)) if t <= ts[-1] else float(ws[-1] + (t - ts[-1]) * tail)

    a = max(float(before_s), 0.0)
    return float(min(1.0, max((work(a + busy_s) - work(a)) / busy_s, 1e-3)))


def duty_fall(profile: Profile, duty: float) -> float:
    """The fraction of the sustained fall that a call keeping its tensor cores busy ``duty`` of its
    time sees: kernel_model.sustained_duty's points, linear between (0, 0) and (1, 1) (no MMA: no fall;
    matmuls back to back: the whole of it); 1.0 without the table."""
    tab = _km(profile).sustained_duty
    if not tab:
        return 1.0
    xs = [0.0] + [float(d) for d, _ in tab if 0.0 < d < 1.0] + [1.0]
    ys = [0.0] + [min(max(float(g), 0.0), 1.0) for d, g in tab if 0.0 < d < 1.0] + [1.0]
    return float(np.interp(min(max(float(duty), 0.0), 1.0), xs, ys))


def mma_duty(profile: Profile, flops: float, call_s: float) -> float | None:
    """A call's MMA duty: its ``flops`` over ``call_s`` at the dense GEMM's short-launch rate
    (kernel_model.mma_sustained_flops_per_s), at most 1; None without that rate or time."""
    rate = _km(profile).mma_sustained_flops_per_s
    if not (rate > 0 and call_s > 0):
        return None
    return min(max(float(flops), 0.0) / (call_s * rate), 1.0)


def sustained_scale(profile: Profile, call_s: float, calls_per_graph: int, calls_before: float,
                     flops: float | None = None) -> float | None:
    """``sustained_ratio`` over the busy window of a call of ``call_s`` (``busy_window_s``) where
    the profile has the table, else None (nothing scaled); its fall scaled by ``duty_fall`` at the
    call's ``mma_duty`` of ``flops`` (where given)."""
    if not _km(profile).sustained_mma:
        return None
    before_s, busy_s = busy_window_s(call_s, calls_per_graph, calls_before)
    ratio = sustained_ratio(profile, busy_s, before_s)
    duty = mma_duty(profile, flops, call_s) if flops is not None else None
    if duty is not None:
        ratio = 1.0 - (1.0 - ratio) * duty_fall(profile, duty)
    return ratio
