"""Schedules: the SimPy processes of one MoE layer, bulk-synchronous or fused.

Shape legend: G GPUs, B minibatches per GPU, P expert slots.

Both schedules read a ``LayerWork`` (durations of compute jobs and bytes of transfers, computed up
front by pure timing functions) and run on a ``Fabric`` (max-min shared ports, copy SMs and HBM;
compute jobs are HBM flows there, so copies that use HBM beside a GEMM can slow it).

bulk_synchronous (DeepEP-style kernels, one after another on every GPU):
    dispatch kernel: GPU g pulls its rows from every peer (one flow); it ends when g's incoming
    and outgoing dispatch traffic are both done -> grouped GEMMs (gate/up, down) and the shared
    expert on all SMs -> combine kernel: g pushes partial sums back (one flow); the layer ends on
    g when g's outgoing and incoming combine traffic are done.
fused (one persistent megakernel, as Mixture-of-Kittens / ParallelKittens):
    ``comm_sms`` SMs pull minibatch m+1 while the other SMs compute minibatch m; the compute SMs
    start with the shared expert (it needs no remote rows), then run minibatch m's expert tiles as
    soon as its rows have arrived, and hand the result to the communication SMs, which push it
    back while the next minibatch computes. Pulls of one GPU go one minibatch after another;
    pushes run beside them and share the same copy SMs and ports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from .entities import Fabric, Span

SCHEDULES = ("bulk", "fused")
_ALIASES = {"bulk": "bulk", "bulk_synchronous": "bulk", "bulk-synchronous": "bulk", "fused": "fused",
            "megakernel": "fused"}


def normalize_schedule(name: str) -> str:
    try:
        return _ALIASES[name]
    except KeyError:
        raise ValueError(f"schedule must be one of {sorted(_ALIASES)}, got {name!r}") from None


def when_all(env: simpy.Environment, events: list) -> simpy.Event:
    """An event that fires when every one of ``events`` has (SimPy's AllOf re-checks all of them
    on every trigger, quadratic in their number; this counts down)."""
    done = env.event()
    left = [len(events)]

    def tick(_ev):
        left[0] -= 1
        if left[0] == 0:
            done.succeed()

    for ev in events:
        if ev.processed:
            left[0] -= 1
        else:
            ev.callbacks.append(tick)
    if left[0] == 0:
        done.succeed()
    return done


@dataclass(frozen=True)
class LayerWork:
    """Inputs of the processes, all in seconds or bytes.

    job_s: (G, B) routed-expert compute per minibatch on the schedule's compute SMs, alone on the
    GPU (tile model); job_hbm_bytes: (G, B) its HBM traffic; shared_s, shared_hbm_bytes: (G,) the
    shared expert; launch_s: one kernel launch; sync_s: a grid barrier after each fused job;
    dispatch_bytes: (G, B, G) [src, minibatch, dst]; combine_bytes: (G, B, G) [owner, minibatch,
    expert GPU] (the combine moves from the expert GPU back to the owner). Diagonals stay local.
    """

    job_s: np.ndarray
    job_hbm_bytes: np.ndarray
    shared_s: np.ndarray
    shared_hbm_bytes: np.ndarray
    launch_s: float
    sync_s: float
    routed_launches: int  # kernel launches of the routed grouped GEMMs (bulk)
    shared_launches: int
    dispatch_bytes: np.ndarray
    combine_bytes: np.ndarray

    @property
    def num_gpus(self) -> int:
        return self.job_s.shape[0]

    @property
    def num_minibatches(self) -> int:
        return self.job_s.shape[1]


@dataclass(frozen=True)
class Capacities:
    """Per-GPU capacities in bytes/s: NVLink port (each direction), copy SMs, HBM."""

    port_bytes_per_s: float
    copy_bytes_per_s: float
    hbm_bytes_per_s: float


class Layout:
    """Resource numbering: send, recv, copy, HBM for G GPUs, then one cap per compute job."""

    def __init__(self, G: int):
        self.G = G
        self.caps: list[float] = []

    def send(self, g):
        return g

    def recv(self, g):
        return self.G + g

    def copy(self, g):
        return 2 * self.G + g

    def hbm(self, g):
        return 3 * self.G + g

    def private(self, capacity: float) -> int:
        self.caps.append(capacity)
        return 4 * self.G + len(self.caps) - 1


def _copy_flow(fabric: Fabric, lay: Layout, g: int, per_peer: np.ndarray, label: str, *, pull: bool) -> int:
    """GPU g's copy SMs move ``per_peer`` (G,) bytes: pulled from each peer (``pull``) or pushed to
    it. g's own port (receive when pulling, send when pushing), copy SMs and HBM carry all of it;
    each peer's opposite port its share. (The peers' HBM reads and writes are left out: each is at
    most that peer's port rate, a tenth of its HBM, and they would double the solver's work.)"""
    b = per_peer.astype(np.float64).copy()
    b[g] = 0.0
    total = b.sum()
    if total <= 0:
        return fabric.add([lay.copy(g)], [1.0], 0.0, label)
    peers = np.nonzero(b)[0]
    share = b[peers] / total
    own, theirs = (lay.recv(g), lay.send(peers)) if pull else (lay.send(g), lay.recv(peers))
    res = np.concatenate([[own, lay.copy(g), lay.hbm(g)], theirs])
    return fabric.add(res, np.concatenate([[1.0, 1.0, 1.0], share]), total, label)


def _pull_flow(fabric: Fabric, lay: Layout, g: int, inbound: np.ndarray, label: str) -> int:
    return _copy_flow(fabric, lay, g, inbound, label, pull=True)


def _push_flow(fabric: Fabric, lay: Layout, g: int, outbound: np.ndarray, label: str) -> int:
    return _copy_flow(fabric, lay, g, outbound, label, pull=False)


def _job_flow(fabric: Fabric, lay: Layout, g: int, seconds: float, hbm_bytes: float, label: str) -> int | None:
    """A compute job: its HBM bytes through g's HBM, capped so that alone it takes ``seconds``."""
    if seconds <= 0:
        return None
    if hbm_bytes <= 0:  # pragma: no cover - every job reads weights
        raise ValueError(f"{label}: a compute job with time but no HBM bytes")
    return fabric.add([lay.hbm(g), lay.private(hbm_bytes / seconds)], [1.0, 1.0], hbm_bytes, label, latency_s=0.0)


@dataclass
class RunLog:
    spans: list
    end_s: np.ndarray  # (G,) when the layer is done on each GPU
    compute_busy_s: np.ndarray  # (G,) time the compute SMs spent in jobs


def _run_job(env, fabric, fid, log, g, name, extra_s=0.0, args=None):
    """Process: one compute job on GPU g (a flow), then ``extra_s`` of barrier/launch time."""
    t0 = env.now
    if fid is not None:
        yield fabric.start(fid)
    if extra_s:
        yield env.timeout(extra_s)
    log.compute_busy_s[g] += env.now - t0
    log.spans.append(Span(g, "compute", name, t0, env.now, args or {}))


def bulk_synchronous(env: simpy.Environment, fabric: Fabric, lay: Layout, work: LayerWork) -> RunLog:
    """Register the flows and start the processes of the bulk-synchronous schedule."""
    G = work.num_gpus
    disp = work.dispatch_bytes.sum(axis=1)  # (G src, G dst)
    comb = work.combine_bytes.sum(axis=1)  # (G owner, G expert gpu)
    D = [_pull_flow(fabric, lay, g, disp[:, g], f"dispatch to GPU {g}") for g in range(G)]
    C = [_push_flow(fabric, lay, g, comb[:, g], f"combine from GPU {g}") for g in range(G)]
    L = work.launch_s
    routed_s = work.job_s.sum(axis=1)
    launches = work.routed_launches * L * (routed_s > 0) + work.shared_launches * L * (work.shared_s > 0)
    gemm_s = routed_s + work.shared_s
    J = [_job_flow(fabric, lay, g, gemm_s[g], work.job_hbm_bytes[g].sum() + work.shared_hbm_bytes[g],
                   f"GEMMs on GPU {g}") for g in range(G)]
    log = RunLog([], np.zeros(G), np.zeros(G))

    def exchange(g: int, flows, matrix, phase: str, key: str):
        """GPU g's copy of one all-to-all phase; done when its own flow and every flow feeding it end."""
        t0 = env.now
        fabric.start(flows[g])
        feeds = [fabric.done(flows[h]) for h in range(G) if h != g and matrix[g, h] > 0]
        yield when_all(env, [fabric.done(flows[g]), *feeds])
        log.spans.append(Span(g, phase, phase, t0, env.now, {key: float(fabric.total[flows[g]])}))

    def gpu(g: int):
        yield env.timeout(L)
        yield from exchange(g, D, disp, "dispatch", "bytes_in")
        yield from _run_job(env, fabric, J[g], log, g, "grouped GEMMs + shared expert", launches[g],
                            {"routed_us": routed_s[g] * 1e6, "shared_us": work.shared_s[g] * 1e6})
        yield env.timeout(L)
        yield from exchange(g, C, comb, "combine", "bytes_out")
        log.end_s[g] = env.now

    for g in range(G):
        env.process(gpu(g))
    return log


def fused(env: simpy.Environment, fabric: Fabric, lay: Layout, work: LayerWork) -> RunLog:
    """Register the flows and start the processes of the fused megakernel schedule."""
    G, B = work.num_gpus, work.num_minibatches
    D = [[_pull_flow(fabric, lay, g, work.dispatch_bytes[:, m, g], f"dispatch mb{m} to GPU {g}") for m in range(B)]
         for g in range(G)]
    C = [[_push_flow(fabric, lay, g, work.combine_bytes[:, m, g], f"combine mb{m} from GPU {g}") for m in range(B)]
         for g in range(G)]
    J = [[_job_flow(fabric, lay, g, work.job_s[g, m], work.job_hbm_bytes[g, m], f"experts mb{m} on GPU {g}")
          for m in range(B)] for g in range(G)]
    S = [_job_flow(fabric, lay, g, work.shared_s[g], work.shared_hbm_bytes[g], f"shared expert on GPU {g}")
         for g in range(G)]
    log = RunLog([], np.zeros(G), np.zeros(G))
    L = work.launch_s

    def pulls(g: int):
        yield env.timeout(L)
        for m in range(B):
            t0 = env.now
            yield fabric.start(D[g][m])
            log.spans.append(Span(g, "dispatch", f"pull mb{m}", t0, env.now, {"bytes": float(fabric.total[D[g][m]])}))

    def push(g: int, m: int):
        t0 = env.now
        yield fabric.start(C[g][m])
        log.spans.append(Span(g, "combine", f"push mb{m}", t0, env.now, {"bytes": float(fabric.total[C[g][m]])}))

    def compute(g: int):
        yield env.timeout(L)
        if S[g] is not None:
            yield from _run_job(env, fabric, S[g], log, g, "shared expert")
        for m in range(B):
            yield fabric.done(D[g][m])
            if J[g][m] is not None:
                yield from _run_job(env, fabric, J[g][m], log, g, f"experts mb{m}", work.sync_s,
                                    {"alone_us": work.job_s[g, m] * 1e6})
            env.process(push(g, m))

    def finish(g: int):
        # done on g when every push that brings g's results back, and g's own pushes, have landed
        evs = [fabric.done(C[h][m]) for h in range(G) for m in range(B)
               if h == g or work.combine_bytes[g, m, h] > 0]
        evs += [fabric.done(D[g][B - 1])]
        yield when_all(env, evs)
        log.end_s[g] = env.now

    for g in range(G):
        env.process(pulls(g))
        env.process(compute(g))
        env.process(finish(g))
    return log


def run_schedule(schedule: str, work: LayerWork, caps: Capacities, latency_s: float):
    """Run one layer; returns (RunLog, Fabric, Layout)."""
    env = simpy.Environment()
    G = work.num_gpus
    lay = Layout(G)
    fabric = Fabric(env, np.zeros(0), latency_s)
    fn = bulk_synchronous if normalize_schedule(schedule) == "bulk" else fused
    log = fn(env, fabric, lay, work)
    fabric.cap = np.concatenate([np.full(2 * G, caps.port_bytes_per_s), np.full(G, caps.copy_bytes_per_s),
                                 np.full(G, caps.hbm_bytes_per_s), np.asarray(lay.caps, dtype=np.float64)])
    fabric.sample_width = 4 * G
    env.run()
    if fabric.active.any():  # pragma: no cover - a bug, not an input error
        raise RuntimeError("simulation ended with flows still moving")
    return log, fabric, lay
