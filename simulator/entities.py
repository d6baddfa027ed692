"""Passive entities of the event model: the shared fabric (ports, copy SMs, HBM) and a span recorder.

Shape legend: G GPUs, B minibatches, F registered flows, M milestone pairs.

Resources of the fabric, each a capacity in bytes/s (``schedules.Layout`` numbers them):
    send port of GPU g      (links x link bandwidth x payload efficiency)
    receive port of GPU g
    copy SMs of GPU g       (pure-copy throughput of its communication SMs, ``Profile.comm_copy_bytes_per_s``)
    HBM of GPU g            (HBM bandwidth x efficiency)
    one private cap per compute job (its HBM bytes / its time alone)
A communication flow is what one GPU's communication SMs move from (or to) one peer for one
minibatch and one phase. It loads its driver's port, copy SMs and HBM, and the peer's opposite port
and HBM; a flow's coefficient on a resource is what one of its bytes costs there (on the copy SMs
more than 1: per-message cost and the work besides copying). A compute job is a flow of its HBM
bytes through its GPU's HBM and its private cap: alone it takes exactly its tile-model time.

Rates are max-min fair (``flows``) over the flows that can move: started, not done, and not held at
their *limit* (bytes they may have delivered so far: a push can only send what has been computed).
Milestones are events that fire once some flows have each delivered given byte counts (an expert's
rows have landed from every peer). The fabric steps from event to event; with ``resolution_s`` > 0
it never steps by less than that, so events closer together are handled together, up to
``resolution_s`` late (never early: the model can only get slower by it).

A step costs what the flows *started and not done* cost (``_act``; the numba kernels of ``flows``
run over those, and the resource -> flow index holds only those), not what every registered flow
would: a layer of many minibatches registers all its flows up front but runs a few at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .flows import FlowIndex, advance, dense_rows, end_flows, start_flows, step_rates


@dataclass
class Span:
    """One interval on a timeline track (for the Perfetto trace and the breakdown)."""

    gpu: int
    track: str  # "compute", "dispatch", "combine"
    name: str
    start_s: float
    end_s: float
    args: dict = field(default_factory=dict)


class Fabric:
    """Flow-level max-min fair sharing of ``capacity`` (R,) bytes/s among registered flows."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, latency_s: float = 0.0,
                 resolution_s: float = 0.0):
        self.env = env
        self.latency_s = float(latency_s)  # default latency of a flow that moves bytes (alpha of alpha-beta)
        self.resolution_s = float(resolution_s)
        self.cap = np.asarray(capacity, dtype=np.float64)
        self._lat: list[float] = []
        self._res: list[np.ndarray] = []
        self._coef: list[np.ndarray] = []
        self._total: list[float] = []
        self._limit0: list[float] = []
        self.labels: list[str] = []
        self._grp: list[np.ndarray] = []
        self._grp_ev: list[simpy.Event] = []
        self._ms_flow: list[np.ndarray] = []
        self._ms_bytes: list[np.ndarray] = []
        self._frozen = False
        self._pending = False
        self._version = 0
        self.samples: list[tuple[float, np.ndarray]] = []  # (time, load[:sample_width]) after every change
        self.sample_width: int | None = None  # how many leading resources ``samples`` keeps (None: all)
        self.recomputes = 0

    # ------------------------------------------------------------ registration (before the run)
    def add(self, resources, coefs, total_bytes: float, label: str = "", latency_s: float | None = None,
            limited: bool = False) -> int:
        """Register a flow; returns its id.  resources: (n,) int, coefs: (n,) bytes charged per byte
        moved; ``latency_s`` is added to its end (None: the fabric's); ``limited``: it may deliver
        nothing until ``raise_limit`` allows it."""
        if self._frozen:
            raise RuntimeError("Fabric.add after the first start")
        self._lat.append(self.latency_s if latency_s is None else float(latency_s))
        self._res.append(np.asarray(resources, np.int64))
        self._coef.append(np.asarray(coefs, np.float64))
        self._total.append(float(total_bytes))
        self._limit0.append(0.0 if limited else float(total_bytes))
        self.labels.append(label)
        return len(self._total) - 1

    def add_many(self, resources: np.ndarray, coefs: np.ndarray, totals: np.ndarray, labels: list[str],
                 limited: bool = False) -> np.ndarray:
        """Register F flows at once: resources, coefs (F, n); totals (F,). Returns their ids (F,)."""
        if self._frozen:
            raise RuntimeError("Fabric.add_many after the first start")
        F0 = len(self._total)
        res = np.asarray(resources, np.int64)
        cf = np.asarray(coefs, np.float64)
        self._res.extend(list(res))
        self._coef.extend(list(cf))
        tot = np.asarray(totals, np.float64).tolist()
        self._total.extend(tot)
        self._limit0.extend([0.0] * len(tot) if limited else tot)
        self._lat.extend([self.latency_s] * len(tot))
        self.labels.extend(labels)
        return np.arange(F0, F0 + len(tot))

    def all_done(self, fids) -> simpy.Event:
        """An event that fires once every flow in ``fids`` has ended (register before the run)."""
        if self._frozen:
            raise RuntimeError("Fabric.all_done after the first start")
        fids = np.asarray(list(fids), np.int64)
        ev = self.env.event()
        if fids.size == 0:
            ev.succeed()
            return ev
        self._grp.append(fids)
        self._grp_ev.append(ev)
        return ev

    def milestone(self, fids, delivered_bytes) -> int:
        """Register a milestone: it fires once every flow ``fids[i]`` has delivered ``delivered_bytes[i]``."""
        if self._frozen:
            raise RuntimeError("Fabric.milestone after the first start")
        self._ms_flow.append(np.asarray(fids, np.int64))
        self._ms_bytes.append(np.asarray(delivered_bytes, np.float64))
        return len(self._ms_flow) - 1

    def _freeze(self) -> None:
        F = len(self._total)
        self.ptr = np.zeros(F + 1, np.int64)
        np.cumsum([r.size for r in self._res], out=self.ptr[1:])
        self.res = np.concatenate(self._res) if F else np.zeros(0, np.int64)
        self.coef = np.concatenate(self._coef) if F else np.zeros(0)
        self.total = np.asarray(self._total, dtype=np.float64)
        self.latency = np.asarray(self._lat)
        self._nz_flow = np.repeat(np.arange(F), np.diff(self.ptr))
        # groups: an event when every flow of a group has ended (flow -> groups as CSR)
        ng = len(self._grp)
        gsize = np.array([a.size for a in self._grp], np.int64)
        gf = np.concatenate(self._grp) if ng else np.zeros(0, np.int64)
        gid = np.repeat(np.arange(ng), gsize)
        order = np.argsort(gf, kind="stable")
        self._fg_ptr = np.zeros(F + 1, np.int64)
        np.cumsum(np.bincount(gf, minlength=F), out=self._fg_ptr[1:])
        self._fg = gid[order]
        self._grp_left = gsize.copy()
        self._grp_end = np.zeros(ng)
        self._grp_events = self._grp_ev
        self._tol = 1e-9 * self.total + 1e-6  # bytes left that count as done (rounding of rate x time)
        self.delivered = np.zeros(F)
        self.limit = np.asarray(self._limit0, dtype=np.float64)
        self.rate = np.zeros(F)  # 0 for every flow outside ``_act``
        self._frozen = True
        self.set_capacity(self.cap)
        self.active = np.zeros(F, np.bool_)  # started and not done
        self._act = np.zeros(0, np.int64)  # the same, as ascending ids: every step runs over these
        self._act_new: list[np.ndarray] = []  # started since the last step, merged into ``_act`` there
        self._ended_new: list[np.ndarray] = []  # ended since the last step, out of the index there
        self._ended = np.zeros(F, np.bool_)
        self._done: dict[int, simpy.Event] = {}
        self.start_s = np.full(F, np.nan)
        self.end_s = np.full(F, np.nan)
        # milestones: pairs (flow, bytes) grouped contiguously by milestone
        n = len(self._ms_flow)
        self._ms_ptr = np.zeros(n + 1, np.int64)
        np.cumsum([a.size for a in self._ms_flow], out=self._ms_ptr[1:])
        self._ms_f = np.concatenate(self._ms_flow) if n else np.zeros(0, np.int64)
        self._ms_b = np.concatenate(self._ms_bytes) if n else np.zeros(0)
        self._ms_events = [self.env.event() for _ in range(n)]
        self._ms_mid = np.repeat(np.arange(n), np.diff(self._ms_ptr))
        self._t = self.env.now
        # Pairs of zero bytes are reached now: a milestone of such pairs alone fires now. A milestone
        # is *armed* once every flow of its other pairs has started: before that it can neither fire
        # nor be next (an idle flow delivers nothing), so only the open pairs of armed milestones
        # (``_live``) are checked and timed.
        self._ms_zero = self.delivered[self._ms_f] >= self._ms_b - self._tol[self._ms_f]
        wait = np.nonzero(~self._ms_zero)[0]  # flow -> milestones of its pairs not reached yet (CSR)
        self._ms_wait = np.bincount(self._ms_mid[wait], minlength=n)  # per milestone: pairs whose flow is idle
        self._ms_fired = (np.diff(self._ms_ptr) > 0) & (self._ms_wait == 0)
        for m in np.nonzero(self._ms_fired)[0].tolist():
            self._ms_events[m].succeed()
        self._fp_ptr = np.zeros(F + 1, np.int64)
        np.cumsum(np.bincount(self._ms_f[wait], minlength=F), out=self._fp_ptr[1:])
        self._fp_mid = self._ms_mid[wait[np.argsort(self._ms_f[wait], kind="stable")]]
        self._index_live(np.zeros(0, np.int64))
        self._arm_new = np.nonzero((self._ms_wait == 0) & ~self._ms_fired)[0].tolist()

    def set_capacity(self, capacity) -> None:
        """Set the resources' capacities (R,) bytes/s; before the run starts."""
        self.cap = np.asarray(capacity, dtype=np.float64)
        self.load = np.zeros(self.cap.size)
        if self._frozen:  # the flows' rows (F, W) (resources, coefficients) and the index of started flows
            self._rows = dense_rows(self.ptr, self.res, self.coef, self.cap.size)
            self._index = FlowIndex(*self._rows, self.cap.size)

    @property
    def remaining(self) -> np.ndarray:
        return self.total - self.delivered

    @property
    def resource_bytes(self) -> np.ndarray:
        """(R,) bytes that have crossed each resource so far (coefficient x bytes delivered)."""
        return np.bincount(self.res, weights=self.coef * self.delivered[self._nz_flow], minlength=self.cap.size)

    # ------------------------------------------------------------ the run
    def done(self, fid: int) -> simpy.Event:
        """The event that fires when flow ``fid`` has delivered its last byte (plus the latency)."""
        if not self._frozen:
            self._freeze()
        ev = self._done.get(fid)
        if ev is None:
            ev = self._done[fid] = self.env.event()
            if self._ended[fid]:
                ev.succeed()
        return ev

    def milestone_event(self, mid: int) -> simpy.Event:
        if not self._frozen:
            self._freeze()
        return self._ms_events[mid]

    def start(self, fid: int) -> simpy.Event:
        """Start flow ``fid`` now; returns ``done(fid)``."""
        ev = self.done(fid)
        self.start_many([fid])
        return ev

    def start_many(self, fids) -> None:
        """Start several flows at this instant (rates change at the next recompute, this instant)."""
        if not self._frozen:
            self._freeze()
        moving, empty, armed, twice = start_flows(np.asarray(fids, np.int64), self.env.now, self.start_s, self.total,
                                                  self.active, self._fp_ptr, self._fp_mid, self._ms_wait)
        if twice >= 0:
            raise RuntimeError(f"flow {twice} ({self.labels[twice]}) started twice")
        if empty.size:  # nothing to move: done at once
            self._end(empty, delayed=False)
        if armed.size:
            self._arm_new.extend(armed.tolist())
        if moving.size:
            self._act_new.append(moving)
            self._schedule_recompute()

    def raise_limit(self, fids, extra_bytes) -> None:
        """Let flows ``fids`` deliver ``extra_bytes`` more (capped at their totals)."""
        if not self._frozen:
            self._freeze()
        self._advance()
        fids = np.asarray(fids, np.int64)
        np.add.at(self.limit, fids, np.asarray(extra_bytes, np.float64))
        self.limit[fids] = np.minimum(self.limit[fids], self.total[fids])
        if self.active[fids].any():
            self._schedule_recompute()

    def _schedule_recompute(self) -> None:
        if not self._pending:  # one recompute per instant, after every start at this instant
            self._pending = True
            ev = self.env.event()
            ev.callbacks.append(self._recompute)
            ev.succeed()

    def _advance(self) -> np.ndarray:
        """Move the flows on at their rates to now (only ``_act`` has rates; flows that reach their
        end or limit inside the step stop there). Returns which of ``_act`` are done, (A,) bool."""
        dt = self.env.now - self._t
        self._t = self.env.now
        return advance(self._act, dt, self.delivered, self.rate, self.limit, self.total, self._tol)

    def _succeed(self, ev: simpy.Event, delay: float) -> None:
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _e, ev=ev: ev.succeed())
        else:
            ev.succeed()

    def _end(self, flows: np.ndarray, delayed: bool) -> None:
        """End ``flows`` now, one latency later where ``delayed``: their done events, then those of the
        groups they complete (at the group's last end)."""
        full = end_flows(flows, self.env.now, self.latency, delayed, self.delivered, self.total,
                         self.active, self._ended, self.rate, self.end_s, self._fg_ptr, self._fg, self._grp_left,
                         self._grp_end)
        for f in flows.tolist():
            ev = self._done.get(f)
            if ev is not None:
                self._succeed(ev, self.latency[f] if delayed else 0.0)
        for g in full.tolist():
            self._succeed(self._grp_events[g], self._grp_end[g] - self.env.now)

    def _finish_done(self, is_done: np.ndarray) -> None:
        """End the flows of ``_act`` marked in ``is_done`` (A,) bool, now."""
        if not is_done.any():
            return
        a = self._act
        done = a[is_done]
        self._act = a[~is_done]
        self._ended_new.append(done)
        self._end(done, delayed=True)

    # ------------------------------------------------------------ milestones
    def _arm(self) -> None:
        """Add the open pairs of the milestones armed since the last step to ``_live`` (each milestone's
        pairs together)."""
        mids = np.asarray(self._arm_new, np.int64)
        self._arm_new = []
        mids = mids[~self._ms_fired[mids]]
        if not mids.size:
            return
        pairs = _csr_rows(self._ms_ptr, mids)
        self._index_live(np.concatenate([self._live[~self._live_done], pairs[~self._ms_zero[pairs]]]))

    def _index_live(self, live: np.ndarray) -> None:
        """Make ``live`` the live pairs: their flows, bytes, tolerances and milestones, where each
        milestone's pairs begin, and which are reached (none yet)."""
        self._live = live
        self._live_f, self._live_b, self._live_mid = self._ms_f[live], self._ms_b[live], self._ms_mid[live]
        self._live_tol = self._tol[self._live_f]
        mids = self._live_mid
        self._live_starts = np.concatenate([[0], np.nonzero(mids[1:] != mids[:-1])[0] + 1]) if mids.size else _NONE
        self._live_done = np.zeros(live.size, np.bool_)
        self._live_reached = 0

    def _reach(self, hit: np.ndarray, fired: np.ndarray) -> None:
        """The live pairs marked in ``hit`` are reached; the milestones ``fired`` (positions in
        ``_live_starts``) have no pair left open: fire those, one link latency later (rows have landed
        one latency after their bytes left). Reached pairs stay in ``_live`` until they are half of it."""
        for m in sorted(self._live_mid[self._live_starts[fired]].tolist()):
            self._ms_fired[m] = True
            self._succeed(self._ms_events[m], self.latency_s)
        n = int(np.count_nonzero(hit))
        if n:
            self._live_done |= hit
            self._live_reached += n
            if 2 * self._live_reached > self._live.size:
                self._index_live(self._live[~self._live_done])

    # ------------------------------------------------------------ the step
    def _recompute(self, _event=None) -> None:
        self._pending = False
        started = _NONE
        if self._act_new:  # flows started since the last step (rate 0 so far: nothing to advance)
            started = np.sort(np.concatenate(self._act_new))
            self._act = np.insert(self._act, np.searchsorted(self._act, started), started)
            self._act_new = []
        self._finish_done(self._advance())
        ended = np.concatenate(self._ended_new) if self._ended_new else _NONE
        self._ended_new = []
        if self._arm_new:
            self._arm()
        self.recomputes += 1
        self._version += 1
        self.load, hit, fired, n_run, n_moving, dt = step_rates(
            self._act, started, ended, self.delivered, self.limit, self.total, self._tol, self.rate, self.cap,
            *self._rows, *self._index.arrays, self._live_f, self._live_b, self._live_tol, self._live_starts,
            self._live_done)
        self._reach(hit, fired)
        self.samples.append((self.env.now, self.load[: self.sample_width].copy()))
        if not n_run:
            return
        if not n_moving:
            raise RuntimeError("active flows but no rate: a flow touches no resource with capacity")
        version = self._version
        timer = self.env.timeout(max(dt, self.resolution_s))
        timer.callbacks.append(lambda _ev, v=version: self._on_timer(v))

    def _on_timer(self, version: int) -> None:
        if version != self._version or self._pending:
            return  # a start or end since then recomputed the rates
        self._recompute()


_NONE = np.zeros(0, np.int64)


def _csr_rows(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions of the entries of CSR rows ``rows`` (in that order): concatenated ranges ptr[r]:ptr[r + 1]."""
    lo, hi = ptr[rows], ptr[rows + 1]
    n = hi - lo
    return np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())
