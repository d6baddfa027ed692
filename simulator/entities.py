"""Passive entities of the event model: the shared fabric (ports, copy SMs, HBM) and a span recorder.

Shape legend: G GPUs, B minibatches, F registered flows.

Resources of the fabric, each a capacity in bytes/s (``schedules.resource_layout`` numbers them):
    send port of GPU g      (links x link bandwidth x payload efficiency)
    receive port of GPU g
    copy SMs of GPU g       (communication SMs x per-SM copy rate)
    HBM of GPU g            (HBM bandwidth x efficiency)
    one private cap per compute job (its HBM bytes / its time alone)
A communication flow is a *coflow*: what one GPU's communication SMs move for one minibatch and one
phase, e.g. GPU g pulling the minibatch-m rows of all other GPUs (dispatch). It loads its driver's
port, copy SMs and HBM fully and each peer's port with that peer's share of its bytes; all
its parts advance together, as a megakernel's copy loop interleaves peers. A compute job is a flow
of its HBM bytes through its GPU's HBM and its private cap: alone it takes exactly its tile-model
time; when copies use the same HBM it can take longer. Rates are max-min fair (``flows``),
recomputed whenever a flow starts or ends; SimPy sees one event per flow end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .flows import maxmin_rates


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

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, latency_s: float = 0.0):
        self.env = env
        self.latency_s = float(latency_s)  # default latency of a flow that moves bytes (alpha of alpha-beta)
        self.cap = np.asarray(capacity, dtype=np.float64)
        self._lat: list[float] = []
        self._res: list[np.ndarray] = []
        self._coef: list[np.ndarray] = []
        self._total: list[float] = []
        self.labels: list[str] = []
        self._frozen = False
        self._pending = False
        self._version = 0
        self.samples: list[tuple[float, np.ndarray]] = []  # (time, load[:sample_width]) after every change
        self.sample_width: int | None = None  # how many leading resources ``samples`` keeps (None: all)
        self.recomputes = 0

    # ------------------------------------------------------------ registration (before the run)
    def add(self, resources: np.ndarray, coefs: np.ndarray, total_bytes: float, label: str = "",
            latency_s: float | None = None) -> int:
        """Register a flow; returns its id.  resources: (n,) int, coefs: (n,) fractions of its bytes;
        ``latency_s`` is added to its end (None: the fabric's)."""
        if self._frozen:
            raise RuntimeError("Fabric.add after the first start")
        self._lat.append(self.latency_s if latency_s is None else float(latency_s))
        self._res.append(np.asarray(resources, np.int64))
        self._coef.append(np.asarray(coefs, np.float64))
        self._total.append(float(total_bytes))
        self.labels.append(label)
        return len(self._total) - 1

    def _freeze(self) -> None:
        F = len(self._total)
        self.ptr = np.zeros(F + 1, np.int64)
        np.cumsum([r.size for r in self._res], out=self.ptr[1:])
        self.res = np.concatenate(self._res) if F else np.zeros(0, np.int64)
        self.coef = np.concatenate(self._coef) if F else np.zeros(0)
        self.total = np.asarray(self._total)
        self.latency = np.asarray(self._lat)
        self._tol = 1e-9 * self.total + 1e-6  # bytes left that count as done (rounding of rate x time)
        self.remaining = self.total.copy()
        self.rate = np.zeros(F)
        self.load = np.zeros(self.cap.size)
        self.resource_bytes = np.zeros(self.cap.size)
        self.resource_busy_s = np.zeros(self.cap.size)
        self.active = np.zeros(F, np.bool_)
        self._done: dict[int, simpy.Event] = {}
        self.start_s = np.full(F, np.nan)
        self.end_s = np.full(F, np.nan)
        self._t = self.env.now
        self._frozen = True

    # ------------------------------------------------------------ the run
    def done(self, fid: int) -> simpy.Event:
        """The event that fires when flow ``fid`` has delivered its last byte (plus the latency)."""
        if not self._frozen:
            self._freeze()
        ev = self._done.get(fid)
        if ev is None:
            ev = self._done[fid] = self.env.event()
        return ev

    def start(self, fid: int) -> simpy.Event:
        """Start flow ``fid`` now; returns ``done(fid)``."""
        ev = self.done(fid)
        if not np.isnan(self.start_s[fid]):
            raise RuntimeError(f"flow {fid} ({self.labels[fid]}) started twice")
        self.start_s[fid] = self.env.now
        if self.total[fid] <= 0:
            self.end_s[fid] = self.env.now
            ev.succeed()
            return ev
        self._advance()
        self.active[fid] = True
        self._schedule_recompute()
        return ev

    def _schedule_recompute(self) -> None:
        if not self._pending:  # one recompute per instant, after every start at this instant
            self._pending = True
            ev = self.env.event()
            ev.callbacks.append(self._recompute)
            ev.succeed()

    def _advance(self) -> None:
        dt = self.env.now - self._t
        if dt > 0:
            self.remaining -= self.rate * dt  # rate is 0 for flows not moving
            self.resource_bytes += self.load * dt
            self.resource_busy_s += (self.load > 0) * dt
        self._t = self.env.now

    def _finish_done(self) -> None:
        done = np.nonzero(self.active & (self.remaining <= self._tol))[0]
        for f in done:
            self.active[f] = False
            self.remaining[f] = 0.0
            self.rate[f] = 0.0
            self.end_s[f] = self.env.now + self.latency[f]
            ev = self.done(f)
            if self.latency[f] > 0:
                self.env.timeout(self.latency[f]).callbacks.append(lambda _e, ev=ev: ev.succeed())
            else:
                ev.succeed()

    def _recompute(self, _event=None) -> None:
        self._pending = False
        self._advance()
        self._finish_done()
        self.recomputes += 1
        self._version += 1
        if not self.active.any():
            self.rate[:] = 0.0
            self.load[:] = 0.0
            self.samples.append((self.env.now, self.load[: self.sample_width].copy()))
            return
        self.rate, self.load = maxmin_rates(self.cap, self.ptr, self.res, self.coef, self.active)
        self.samples.append((self.env.now, self.load[: self.sample_width].copy()))
        act = self.active & (self.rate > 0)
        if not act.any():
            raise RuntimeError("active flows but no rate: a flow touches no resource with capacity")
        dt = float(np.min(self.remaining[act] / self.rate[act]))
        version = self._version
        timer = self.env.timeout(max(dt, 0.0))
        timer.callbacks.append(lambda _ev, v=version: self._on_timer(v))

    def _on_timer(self, version: int) -> None:
        if version != self._version or self._pending:
            return  # a start or end since then recomputed the rates
        self._recompute()
