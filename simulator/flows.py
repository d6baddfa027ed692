"""Max-min fair bandwidth sharing between concurrent transfers (progressive filling, numba).

Shape legend: F flows (here: coflows, see below), R shared resources, N nonzeros of the flow x
resource incidence (CSR: ``ptr`` (F+1,), ``res`` (N,), ``coef`` (N,)).

A flow f moves at a rate x_f (bytes/s of its own total). It loads resource r with ``coef`` x_f,
where coef is the fraction of the flow's bytes that cross r (1 for the flow's own port; b_s/total
for each remote port of a many-to-one coflow). The allocation is max-min fair: raise every unfrozen
flow's rate together until some resource is full, freeze the flows through it, repeat
(progressive filling). ``Fabric`` in ``entities`` calls ``maxmin_rates_of`` on the flows that can
move whenever a flow starts or ends; its cost grows with those flows, not with all registered ones.
``maxmin_rates_py`` is the plain round-by-round algorithm that the tests hold it to.
"""

from __future__ import annotations

import sys

import numpy as np

# numba's CPU target, on its first compile or cache load, imports numba.np.arraymath, whose BLAS probe
# imports scipy.linalg (about 0.5 s of a 1.5 s ``megamoe simulate``) only to choose np.vdot's fallback,
# which nothing here uses. Import arraymath once with the probe failing, then undo the block, so a
# later ``import scipy.linalg`` (and numba's linear algebra, which checks again when it compiles) works.
if "scipy.linalg.cython_blas" not in sys.modules:
    sys.modules["scipy.linalg.cython_blas"] = None  # type: ignore[assignment]
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules["scipy.linalg.cython_blas"]
from numba import njit  # noqa: E402

_SAT = 1e-9  # a resource with less than this fraction of its capacity left is full


@njit(cache=True)
def maxmin_rates_of(cap, ptr, res, coef, flows):
    """Max-min fair rates of the flows ``flows`` (K,) int64, ascending ids; every other flow is idle.

    cap: (R,) bytes/s; ptr/res/coef: CSR incidence of all F flows. Returns rate: (K,) bytes/s, the
    rate of each flow in ``flows``, and load: (R,) bytes/s used.

    Progressive filling with incremental bookkeeping: the fill level rises by the smallest
    headroom rem_r / w_r over the open resources; resources that fill up freeze their flows
    (found through a resource -> flow index of ``flows`` alone, built here), whose weights leave w,
    and leave the open list. Each round fills at least one resource: O(nnz of ``flows`` + R +
    rounds x open resources), whatever the number of idle flows. Sums run in the order of
    ``flows``, so a flow's rate does not depend on which idle flows exist.
    """
    K = flows.size
    R = cap.size
    w = np.zeros(R)
    cptr = np.zeros(R + 1, np.int64)
    for i in range(K):
        f = flows[i]
        for j in range(ptr[f], ptr[f + 1]):
            w[res[j]] += coef[j]
            cptr[res[j] + 1] += 1
    for r in range(R):
        cptr[r + 1] += cptr[r]
    cflow = np.empty(cptr[R], np.int64)  # resource -> positions in ``flows``
    ccoef = np.empty(cptr[R])
    fill = cptr[:-1].copy()
    for i in range(K):
        f = flows[i]
        for j in range(ptr[f], ptr[f + 1]):
            r = res[j]
            cflow[fill[r]] = i
            ccoef[fill[r]] = coef[j]
            fill[r] += 1
    rate = np.zeros(K)
    load = np.zeros(R)
    rl = np.nonzero(w > 1e-12)[0]  # open resources, compacted as they fill
    n_open = rl.size
    rem = cap.copy()
    frozen = np.zeros(K, np.bool_)
    level = 0.0
    n_left = K
    while n_left > 0 and n_open > 0:
        inc = np.inf
        for i in range(n_open):
            r = rl[i]
            if w[r] > 1e-12:
                v = rem[r] / w[r]
                if v < inc:
                    inc = v
        if inc == np.inf:  # live flows that touch no open resource: callers never make them
            break
        if inc < 0.0:
            inc = 0.0
        level += inc
        for i in range(n_open):
            r = rl[i]
            rem[r] -= inc * w[r]
        k = 0
        for i in range(n_open):
            r = rl[i]
            if w[r] > 1e-12 and rem[r] <= _SAT * cap[r]:
                for c in range(cptr[r], cptr[r + 1]):
                    i_f = cflow[c]
                    if frozen[i_f] or ccoef[c] <= 0.0:
                        continue
                    frozen[i_f] = True
                    rate[i_f] = level
                    n_left -= 1
                    f = flows[i_f]
                    for j in range(ptr[f], ptr[f + 1]):
                        w[res[j]] -= coef[j]
            elif w[r] > 1e-12:
                rl[k] = r
                k += 1
        n_open = k
    for i in range(K):
        if not frozen[i]:  # pragma: no cover - only flows that touch no resource
            rate[i] = level
        f = flows[i]
        for j in range(ptr[f], ptr[f + 1]):
            load[res[j]] += coef[j] * rate[i]
    return rate, load


@njit(cache=True)
def advance(flows, dt, delivered, rate, limit, total, tol):
    """Move ``flows`` (K,) on by ``dt`` s at their rates, in place: delivered += rate x dt, stopping at
    each flow's limit or total. Returns (K,) bool: which of them are within ``tol`` bytes of their total."""
    done = np.zeros(flows.size, np.bool_)
    for i in range(flows.size):
        f = flows[i]
        if dt > 0:
            d = delivered[f] + rate[f] * dt
            stop = min(limit[f], total[f])
            delivered[f] = d if d < stop else stop
        done[i] = delivered[f] >= total[f] - tol[f]
    return done


@njit(cache=True)
def step_rates(flows, delivered, limit, total, tol, rate, cap, ptr, res, coef, ms_flow, ms_bytes, ms_starts):
    """Max-min fair rates of ``flows`` (K,) (started, not done, ascending ids): those more than ``tol``
    below their limit share the resources, the rest wait (rate 0). Writes them into ``rate`` (F,).

    ms_flow, ms_bytes: (M,) open milestone pairs (flow, bytes it must have delivered), grouped by
    milestone, each group starting at ``ms_starts``; a milestone is due when its last pair is.
    Returns load (R,) bytes/s, the number of flows that may move, the number that do (rate > 0),
    and the time in s until the next flow reaches its limit or total, or the next milestone is due
    (inf: none; never below 0).
    """
    n = 0
    run = np.empty(flows.size, np.int64)
    for i in range(flows.size):
        f = flows[i]
        rate[f] = 0.0
        if delivered[f] < limit[f] - tol[f]:
            run[n] = f
            n += 1
    run = run[:n]
    if n == 0:
        return np.zeros(cap.size), 0, 0, np.inf
    r, load = maxmin_rates_of(cap, ptr, res, coef, run)
    moving = 0
    dt = np.inf
    for i in range(n):
        f = run[i]
        rate[f] = r[i]
        if r[i] > 0:
            moving += 1
            t = (min(limit[f], total[f]) - delivered[f]) / r[i]
            if t < dt:
                dt = t
    for s in range(ms_starts.size):  # a milestone is due when the last of its open pairs is reached
        hi = ms_starts[s + 1] if s + 1 < ms_starts.size else ms_flow.size
        due = -np.inf
        for j in range(ms_starts[s], hi):
            f = ms_flow[j]
            t = (ms_bytes[j] - delivered[f]) / rate[f] if rate[f] > 0 else np.inf
            if t > due:
                due = t
        if due < dt:
            dt = due
    return load, n, moving, max(dt, 0.0)


def maxmin_rates(cap, ptr, res, coef, active):
    """Max-min fair rates.  cap: (R,) bytes/s; ptr/res/coef: CSR incidence; active: (F,) bool.

    Returns rate: (F,) bytes/s (0 for inactive flows) and load: (R,) bytes/s used
    (``maxmin_rates_of`` on the active flows).
    """
    flows = np.nonzero(np.asarray(active, np.bool_))[0].astype(np.int64)
    rate = np.zeros(np.asarray(ptr).size - 1)
    rate[flows], load = maxmin_rates_of(np.asarray(cap, np.float64), np.asarray(ptr, np.int64),
                                        np.asarray(res, np.int64), np.asarray(coef, np.float64), flows)
    return rate, load


def maxmin_rates_py(cap, flows: list[dict[int, float]]) -> np.ndarray:
    """Plain-Python progressive filling on a list of {resource: coef} flows; tests compare against it."""
    cap = np.asarray(cap, float)
    rem = cap.copy()
    rate = np.zeros(len(flows))
    unfrozen = set(range(len(flows)))
    while unfrozen:
        w = np.zeros(cap.size)
        for f in unfrozen:
            for r, c in flows[f].items():
                w[r] += c
        mask = w > 0
        inc = float(np.min(rem[mask] / w[mask]))
        rem -= inc * w
        full = {r for r in np.nonzero(mask & (rem <= _SAT * cap))[0]}
        for f in list(unfrozen):
            rate[f] += inc
            if any(r in full and c > 0 for r, c in flows[f].items()):
                unfrozen.discard(f)
    return rate
