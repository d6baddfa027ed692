"""Max-min fair bandwidth sharing between concurrent transfers (progressive filling, numba).

Shape legend: F flows (here: coflows, see below), R shared resources, N nonzeros of the flow x
resource incidence (CSR: ``ptr`` (F+1,), ``res`` (N,), ``coef`` (N,)).

A flow f moves at a rate x_f (bytes/s of its own total). It loads resource r with ``coef`` x_f,
where coef is the fraction of the flow's bytes that cross r (1 for the flow's own port; b_s/total
for each remote port of a many-to-one coflow). The allocation is max-min fair: raise every unfrozen
flow's rate together until some resource is full, freeze the flows through it, repeat
(progressive filling). ``Fabric`` in ``entities`` calls this whenever a flow starts or ends.
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
def incidence_by_resource(num_resources, ptr, res, coef):
    """The resource -> (flow, coef) index (CSC) of a CSR flow x resource incidence: cptr (R+1,), cflow, ccoef."""
    F = ptr.size - 1
    cptr = np.zeros(num_resources + 1, np.int64)
    for j in range(res.size):
        cptr[res[j] + 1] += 1
    for r in range(num_resources):
        cptr[r + 1] += cptr[r]
    cflow = np.empty(res.size, np.int64)
    ccoef = np.empty(res.size)
    fill = cptr[:-1].copy()
    for f in range(F):
        for j in range(ptr[f], ptr[f + 1]):
            r = res[j]
            cflow[fill[r]] = f
            ccoef[fill[r]] = coef[j]
            fill[r] += 1
    return cptr, cflow, ccoef


@njit(cache=True)
def maxmin_rates_indexed(cap, ptr, res, coef, active, cptr, cflow, ccoef):
    """``maxmin_rates`` with the resource -> flow index given (``incidence_by_resource`` of all flows,
    active or not: the fabric builds it once per run)."""
    F = ptr.size - 1
    R = cap.size
    rate = np.zeros(F)
    load = np.zeros(R)
    act = np.nonzero(active)[0]
    w = np.zeros(R)
    for f in act:
        for j in range(ptr[f], ptr[f + 1]):
            w[res[j]] += coef[j]
    rl = np.nonzero(w > 1e-12)[0]  # open resources, compacted as they fill
    n_open = rl.size
    rem = cap.copy()
    frozen = ~active.copy()
    level = 0.0
    n_left = act.size
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
                    f = cflow[c]
                    if frozen[f] or ccoef[c] <= 0.0:
                        continue
                    frozen[f] = True
                    rate[f] = level
                    n_left -= 1
                    for j in range(ptr[f], ptr[f + 1]):
                        w[res[j]] -= coef[j]
            elif w[r] > 1e-12:
                rl[k] = r
                k += 1
        n_open = k
    for f in act:
        if not frozen[f]:  # pragma: no cover - only flows that touch no resource
            rate[f] = level
        for j in range(ptr[f], ptr[f + 1]):
            load[res[j]] += coef[j] * rate[f]
    return rate, load


@njit(cache=True)
def maxmin_rates(cap, ptr, res, coef, active):
    """Max-min fair rates.  cap: (R,) bytes/s; ptr/res/coef: CSR incidence; active: (F,) bool.

    Returns rate: (F,) bytes/s (0 for inactive flows) and load: (R,) bytes/s used.

    Progressive filling with incremental bookkeeping: the fill level rises by the smallest
    headroom rem_r / w_r over the open resources; resources that fill up freeze their flows
    (found through a resource -> flow index), whose weights leave w, and leave the open list.
    Each round fills at least one resource: O(nnz + rounds x open resources).
    """
    cptr, cflow, ccoef = incidence_by_resource(cap.size, ptr, res, coef)
    return maxmin_rates_indexed(cap, ptr, res, coef, active, cptr, cflow, ccoef)


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
