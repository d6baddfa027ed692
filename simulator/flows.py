"""Max-min fair bandwidth sharing between concurrent transfers (progressive filling, numba).

Shape legend: F flows, R shared resources, W resources of a flow at most, N nonzeros of the flow x
resource incidence. The incidence is held two ways:
    rows   ``res`` (F, W) int64, ``coef`` (F, W) float64: flow f's resources in the order given,
           padded with resource R (a scratch slot past the real ones) and coefficient 0
    index  the resource -> flow lists of the *started* flows, ascending ids (``FlowIndex``,
           updated as flows start and end, so a step never rebuilds it)

A flow f moves at a rate x_f (bytes/s of its own total). It loads resource r with ``coef`` x_f,
where coef is the fraction of the flow's bytes that cross r (1 for the flow's own port; b_s/total
for each remote port of a many-to-one coflow). The allocation is max-min fair: raise every unfrozen
flow's rate together until some resource is full, freeze the flows through it, repeat
(progressive filling, ``fill``). ``maxmin_rates`` is the same filling on a CSR incidence and an
active mask (the tests hold it to a plain round-by-round twin).

The kernels ``Fabric`` (``entities``) steps with are here too: ``start_flows`` and ``end_flows``
(flows start and end), ``advance`` (deliveries over a step) and ``step_rates`` (the index takes in and lets go of flows,
the rates of those that can move, the milestone pairs reached, the time to the next event). They
run over the started flows only, so a step costs what is moving, not what is registered; sums run
in ascending flow order, so the rates do not depend on how many flows are registered or idle.
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


def dense_rows(ptr: np.ndarray, res: np.ndarray, coef: np.ndarray, num_resources: int):
    """The CSR incidence (ptr (F+1,), res (N,), coef (N,)) as padded rows (F, W): res, coef."""
    nnz = np.diff(ptr)
    F, W = nnz.size, int(nnz.max()) if nnz.size else 0
    rows = np.repeat(np.arange(F), nnz)
    cols = np.arange(res.size) - ptr[rows]
    res_w = np.full((F, W), num_resources, np.int64)
    coef_w = np.zeros((F, W))
    res_w[rows, cols], coef_w[rows, cols] = res, coef
    return res_w, coef_w


class FlowIndex:
    """Resource -> flow lists of the started flows: resource r's list is ``flow[ptr[r]:ptr[r] + count[r]]``
    (ascending ids) with the coefficients beside it in ``coef``; ``ptr`` leaves room for every
    registered flow of r. ``mark`` (F,) int8 is the fill's scratch (0 outside a step)."""

    def __init__(self, res_w: np.ndarray, coef_w: np.ndarray, num_resources: int):
        R = num_resources
        real = res_w[res_w < R]
        self.ptr = np.zeros(R + 1, np.int64)
        np.cumsum(np.bincount(real, minlength=R), out=self.ptr[1:])
        self.count = np.zeros(R, np.int64)
        self.flow = np.zeros(real.size, np.int64)
        self.coef = np.zeros(real.size)
        self.mark = np.zeros(res_w.shape[0], np.int8)

    @property
    def arrays(self) -> tuple:
        return self.ptr, self.count, self.flow, self.coef, self.mark


@njit(cache=True)
def index_add(flows, res_w, coef_w, iptr, icount, iflow, icoef):
    """Put ``flows`` (K,) into the lists of their resources (kept ascending)."""
    R = icount.size
    for i in range(flows.size):
        f = flows[i]
        for k in range(res_w.shape[1]):
            r = res_w[f, k]
            if r >= R:
                continue
            lo = iptr[r]
            p = lo + icount[r]
            while p > lo and iflow[p - 1] > f:
                iflow[p] = iflow[p - 1]
                icoef[p] = icoef[p - 1]
                p -= 1
            iflow[p] = f
            icoef[p] = coef_w[f, k]
            icount[r] += 1


@njit(cache=True)
def index_remove(flows, res_w, iptr, icount, iflow, icoef):
    """Take ``flows`` (K,) out of the lists of their resources."""
    R = icount.size
    for i in range(flows.size):
        f = flows[i]
        for k in range(res_w.shape[1]):
            r = res_w[f, k]
            if r >= R:
                continue
            lo = iptr[r]
            hi = lo + icount[r]
            p = lo
            while iflow[p] != f:
                p += 1
            for q in range(p, hi - 1):
                iflow[q] = iflow[q + 1]
                icoef[q] = icoef[q + 1]
            icount[r] -= 1


@njit(cache=True)
def fill(cap, res_w, coef_w, run, iptr, icount, iflow, icoef, mark, rate):
    """Max-min fair rates of the flows ``run`` (K,) (ascending ids, all in the index), written into
    ``rate`` (F,) bytes/s; returns load (R,) bytes/s. cap: (R,) bytes/s.

    Progressive filling with incremental bookkeeping: the fill level rises by the smallest headroom
    rem_r / w_r over the open resources; resources that fill up freeze their flows (through the
    index: flows of the list not in ``run`` are passed over), whose weights leave w, and leave the
    open list. Each round fills at least one resource: O(nnz of ``run`` + R + rounds x open
    resources + the lists of the resources that fill). Sums run in the order of ``run``, so a flow's
    rate does not depend on which idle flows exist.
    """
    K = run.size
    R = cap.size
    W = res_w.shape[1]
    w = np.zeros(R + 1)
    for i in range(K):
        f = run[i]
        mark[f] = 1  # running, not frozen
        for k in range(W):
            w[res_w[f, k]] += coef_w[f, k]
    rl = np.nonzero(w[:R] > 1e-12)[0]  # open resources, compacted as they fill
    n_open = rl.size
    rem = cap.copy()
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
        n = 0
        for i in range(n_open):
            r = rl[i]
            if w[r] > 1e-12 and rem[r] <= _SAT * cap[r]:
                for c in range(iptr[r], iptr[r] + icount[r]):
                    f = iflow[c]
                    if mark[f] != 1 or icoef[c] <= 0.0:
                        continue
                    mark[f] = 2  # frozen
                    rate[f] = level
                    n_left -= 1
                    for k in range(W):
                        w[res_w[f, k]] -= coef_w[f, k]
            elif w[r] > 1e-12:
                rl[n] = r
                n += 1
        n_open = n
    load = np.zeros(R + 1)
    for i in range(K):
        f = run[i]
        if mark[f] != 2:  # pragma: no cover - only flows that touch no resource
            rate[f] = level
        mark[f] = 0
        for k in range(W):
            load[res_w[f, k]] += coef_w[f, k] * rate[f]
    return load[:R]


@njit(cache=True)
def start_flows(fids, now, start_s, total, active, fp_ptr, fp_mid, ms_wait):
    """Start flows ``fids`` (K,) at ``now``: their ``start_s``, and ``active`` for those with bytes;
    count down ``ms_wait`` (M,), the idle flows of each milestone, through the flow -> milestone
    CSR (fp_ptr, fp_mid). Returns the flows with bytes, those without, the milestones whose last
    idle flow this was, and the first flow started before or twice (-1: none; else a caller's bug)."""
    pairs = 0
    for i in range(fids.size):
        f = fids[i]
        if start_s[f] == start_s[f]:  # not NaN
            return fids[:0], fids[:0], fids[:0], f
        start_s[f] = now
        pairs += fp_ptr[f + 1] - fp_ptr[f]
    moving = np.empty(fids.size, np.int64)
    empty = np.empty(fids.size, np.int64)
    armed = np.empty(pairs, np.int64)
    n_m = n_e = n_a = 0
    for i in range(fids.size):
        f = fids[i]
        if total[f] > 0:
            active[f] = True
            moving[n_m] = f
            n_m += 1
        else:
            empty[n_e] = f
            n_e += 1
        for j in range(fp_ptr[f], fp_ptr[f + 1]):
            m = fp_mid[j]
            ms_wait[m] -= 1
            if ms_wait[m] == 0:
                armed[n_a] = m
                n_a += 1
    return moving[:n_m], empty[:n_e], armed[:n_a], -1


@njit(cache=True)
def end_flows(flows, now, latency, delayed, delivered, total, active, ended, rate, end_s, fg_ptr, fg, grp_left,
              grp_end):
    """End ``flows`` (K,) at ``now``, plus their ``latency`` (F,) if ``delayed``: delivered = total, not
    active, ended, rate 0, end_s; count down their groups (fg_ptr, fg: flow -> group CSR;
    grp_left, grp_end: each group's flows not ended and last end). Returns the groups that have no
    flow left now, ascending."""
    full = np.empty(fg.size, np.int64)
    n = 0
    for i in range(flows.size):
        f = flows[i]
        delivered[f] = total[f]
        active[f] = False
        ended[f] = True
        rate[f] = 0.0
        end_s[f] = now + latency[f] if delayed else now
    for i in range(flows.size):
        f = flows[i]
        for j in range(fg_ptr[f], fg_ptr[f + 1]):
            g = fg[j]
            if end_s[f] > grp_end[g]:
                grp_end[g] = end_s[f]
            grp_left[g] -= 1
            if grp_left[g] == 0:
                full[n] = g
                n += 1
    return np.sort(full[:n])


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
def step_rates(flows, started, ended, delivered, limit, total, tol, rate, cap, res_w, coef_w,
               iptr, icount, iflow, icoef, mark, ms_flow, ms_bytes, ms_tol, ms_starts, ms_done):
    """One step of the fabric. The index takes in the flows ``started`` and lets go of those ``ended``
    since the last step; then the max-min fair rates of ``flows`` (K,) (started, not done, ascending
    ids): those more than ``tol`` below their limit share the resources (``fill``), the rest wait
    (rate 0). Writes them into ``rate`` (F,).

    ms_flow, ms_bytes, ms_tol: (M,) milestone pairs (flow, bytes it must have delivered, within
    tol), grouped by milestone, each group starting at ``ms_starts``; ``ms_done`` (M,) bool: the
    pairs reached before. A pair is reached once its flow has delivered its bytes; a milestone fires
    when its last pair is reached, and is due when its last open pair would be at the new rates.
    Returns load (R,) bytes/s, (M,) bool the pairs reached now, the groups (positions in ms_starts)
    whose milestone fires now, the number of flows that may move, the number that do (rate > 0),
    and the time in s until the next flow reaches its limit or total, or the next milestone that is
    not firing is due (inf: none; never below 0).
    """
    index_add(started, res_w, coef_w, iptr, icount, iflow, icoef)
    index_remove(ended, res_w, iptr, icount, iflow, icoef)
    hit = np.zeros(ms_flow.size, np.bool_)
    for j in range(ms_flow.size):
        if not ms_done[j]:
            hit[j] = delivered[ms_flow[j]] >= ms_bytes[j] - ms_tol[j]
    n = 0
    run = np.empty(flows.size, np.int64)
    for i in range(flows.size):
        f = flows[i]
        rate[f] = 0.0
        if delivered[f] < limit[f] - tol[f]:
            run[n] = f
            n += 1
    run = run[:n]
    load = fill(cap, res_w, coef_w, run, iptr, icount, iflow, icoef, mark, rate) if n else np.zeros(cap.size)
    moving = 0
    dt = np.inf
    for i in range(n):
        f = run[i]
        if rate[f] > 0:
            moving += 1
            t = (min(limit[f], total[f]) - delivered[f]) / rate[f]
            if t < dt:
                dt = t
    fired = np.empty(ms_starts.size, np.int64)
    n_fired = 0
    for s in range(ms_starts.size):
        hi = ms_starts[s + 1] if s + 1 < ms_starts.size else ms_flow.size
        due = -np.inf
        left = False  # an open pair not reached now
        reached = False  # a pair reached now
        for j in range(ms_starts[s], hi):
            if hit[j]:
                reached = True
            if hit[j] or ms_done[j]:
                continue
            left = True
            f = ms_flow[j]
            t = (ms_bytes[j] - delivered[f]) / rate[f] if rate[f] > 0 else np.inf
            if t > due:
                due = t
        if left and due < dt:
            dt = due
        if reached and not left:
            fired[n_fired] = s
            n_fired += 1
    return load, hit, fired[:n_fired], n, moving, max(dt, 0.0) if n else np.inf


def maxmin_rates(cap, ptr, res, coef, active):
    """Max-min fair rates.  cap: (R,) bytes/s; ptr/res/coef: CSR incidence; active: (F,) bool.

    Returns rate: (F,) bytes/s (0 for inactive flows) and load: (R,) bytes/s used (``fill`` on the
    active flows).
    """
    cap = np.asarray(cap, np.float64)
    ptr, res, coef = np.asarray(ptr, np.int64), np.asarray(res, np.int64), np.asarray(coef, np.float64)
    res_w, coef_w = dense_rows(ptr, res, coef, cap.size)
    idx = FlowIndex(res_w, coef_w, cap.size)
    run = np.nonzero(np.asarray(active, np.bool_))[0].astype(np.int64)
    index_add(run, res_w, coef_w, *idx.arrays[:4])
    rate = np.zeros(res_w.shape[0])
    load = fill(cap, res_w, coef_w, run, *idx.arrays, rate)
    return rate, load
