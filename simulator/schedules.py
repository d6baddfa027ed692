"""Schedules: the SimPy processes of one MoE layer, bulk-synchronous or fused, and the work they run.

Shape legend: G GPUs, B minibatches per GPU, P expert slots, n communication SMs.

Both schedules read a ``LayerWork`` (durations of compute jobs and bytes of transfers, computed up
front by ``build_layer_work`` from a workload and a profile) and run on a ``Fabric`` (max-min shared
ports, copy SMs and HBM; compute jobs are HBM flows there, so copies beside a GEMM can slow it).
Every communication flow is one GPU's copy from or to one peer, so a slow peer slows only the flows
that touch it. Each copy loads both endpoints' ports and HBM.

Both start with the fixed per-layer cost (a launch and the router / top-k on every GPU) and end with
the owner's reduction (each token's partial sums from every expert GPU, weighted, into its output)
and a cross-GPU barrier.

bulk_synchronous (DeepEP-style kernels, one after another on every GPU):
    dispatch kernel: GPU g pulls its rows from every peer; it ends when g's incoming and outgoing
    dispatch copies are done -> grouped GEMMs (gate/up, down) and the shared expert on all SMs ->
    combine kernel: g pushes partial sums back; the owner reduces once all of its partials are in.
fused (one persistent megakernel, as Mixture-of-Kittens):
    ``comm_sms`` SMs pull the rows of each minibatch from every peer in slot order (per peer, one
    minibatch after another, at most ``buffer_minibatches`` minibatches ahead of the compute); the
    other SMs start with the shared expert (it needs no remote rows), then compute each local slot
    as soon as its rows have landed from every peer (with the profile's completion signalling:
    once the whole minibatch has landed and been signalled, the round's fill); a slot's finished
    partial sums may be pushed back at once (a push can only send what has been computed), while
    later slots compute. Each owner reduces a minibatch once all of its partials are in (and
    signalled). Dispatch and combine are each pulled or pushed (``MODES``): whose communication
    SMs drive the copy, its protocol bytes on the ports, its signalling per round.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import simpy

from .cost import normalize_dtype
from .entities import Fabric, Span

SCHEDULES = ("bulk", "fused")
#: every name a schedule may be given by -> its canonical name (``normalize_schedule``)
SCHEDULE_ALIASES = {"fused": "fused", "bulk": "bulk", "megakernel": "fused", "bulk_synchronous": "bulk",
                    "bulk-synchronous": "bulk"}
#: Events closer together than this fraction of the analytic bound are handled together (``Fabric``).
RESOLUTION = 1e-3
COMM_WORK = ("quantize", "transpose", "stash")
MODES = ("pull", "push")


def check_mode(name: str, mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {MODES}, got {mode!r}")
    return mode


def protocol_terms(profile, dispatch_mode: str = "pull", combine_mode: str = "push") -> dict:
    """Port bytes per payload byte and per-round signalling of each phase from the profile's
    ``protocol`` section (none: the link's own payload efficiency, no signalling)."""
    pr = profile.protocol
    if pr is None:
        return dict(dispatch_port_coef=1.0, combine_port_coef=1.0, dispatch_signal_s=0.0, combine_signal_s=0.0)
    e = profile.payload_efficiency
    return dict(dispatch_port_coef=e / pr.efficiency(dispatch_mode), combine_port_coef=e / pr.efficiency(combine_mode),
                dispatch_signal_s=pr.signal_s(dispatch_mode), combine_signal_s=pr.signal_s(combine_mode))


def normalize_schedule(name: str) -> str:
    try:
        return SCHEDULE_ALIASES[name]
    except KeyError:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULE_ALIASES)}, got {name!r}") from None


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


def _then(env, events: list, fn) -> None:
    """Call ``fn()`` once every event in ``events`` has fired."""
    ev = when_all(env, events)
    if ev.triggered:
        fn()
    else:
        ev.callbacks.append(lambda _e: fn())


@dataclass(frozen=True)
class LayerWork:
    """Inputs of the processes, all in seconds or bytes.

    slot_rank: (P,) GPU of each slot; job_s: (P, B) compute of each slot per minibatch on the
    schedule's compute SMs (its share of the GPU's grouped GEMM, tile model, alone on the GPU);
    job_hbm_bytes: (P, B) its HBM traffic; shared_s, shared_hbm_bytes: (G,) the shared expert;
    pull_bytes: (P, B, G) bytes slot p's GPU pulls from each src for p (diagonal: local, not moved);
    push_bytes: (P, B, G) bytes of partial sums it pushes to each owner once p is done;
    reduce_s, reduce_hbm_bytes: (G, B) the owner's reduction of a minibatch; start_s: (G,) launch
    + router before anything moves; barrier_s: the layer's closing barrier; launch_s: one kernel
    launch; sync_s: a grid barrier after each fused minibatch; pull_copy_coef, push_copy_coef:
    copy-SM bytes charged per byte moved; pull_hbm_coef: receiver HBM bytes per byte dispatched (2
    with a stash); buffer_minibatches: minibatches the fused receive / send buffers hold;
    dispatch_mode, combine_mode: ``"pull"`` or ``"push"`` (``MODES``: whose communication SMs drive
    the copy), with the port bytes per payload byte and the completion signalling of each round.
    """

    slot_rank: np.ndarray
    job_s: np.ndarray
    job_hbm_bytes: np.ndarray
    shared_s: np.ndarray
    shared_hbm_bytes: np.ndarray
    pull_bytes: np.ndarray
    push_bytes: np.ndarray
    reduce_s: np.ndarray
    reduce_hbm_bytes: np.ndarray
    start_s: np.ndarray
    barrier_s: float
    launch_s: float
    sync_s: float
    routed_launches: int  # kernel launches of the routed grouped GEMMs (bulk)
    shared_launches: int
    pull_copy_coef: float = 1.0
    push_copy_coef: float = 1.0
    pull_hbm_coef: float = 1.0
    buffer_minibatches: int = 2
    dispatch_mode: str = "pull"  # the receiver's communication SMs read the rows ("push": the sender writes)
    combine_mode: str = "push"  # the expert GPU's communication SMs write the partial sums ("pull": the owner reads)
    dispatch_port_coef: float = 1.0  # port bytes per dispatched byte (protocol overhead beyond the link's own)
    combine_port_coef: float = 1.0
    dispatch_signal_s: float = 0.0  # completion signalling of one round's dispatch
    combine_signal_s: float = 0.0  # and of its combine

    @property
    def num_gpus(self) -> int:
        return self.shared_s.shape[0]

    @property
    def num_minibatches(self) -> int:
        return self.job_s.shape[1]

    def dispatch_bytes(self) -> np.ndarray:
        """(G src, B, G dst) bytes pulled, diagonal included."""
        G, B = self.num_gpus, self.num_minibatches
        out = np.zeros((G, B, G))
        for d in range(G):
            out[:, :, d] = self.pull_bytes[self.slot_rank == d].sum(axis=0).T
        return out

    def combine_bytes(self) -> np.ndarray:
        """(G owner, B, G expert GPU) bytes pushed back, diagonal included."""
        G, B = self.num_gpus, self.num_minibatches
        out = np.zeros((G, B, G))
        for d in range(G):
            out[:, :, d] = self.push_bytes[self.slot_rank == d].sum(axis=0).T
        return out


@dataclass(frozen=True)
class CommModel:
    """What the communication SMs of one GPU can move: ``copy_bytes_per_s`` of pulled rows (the
    profile's curve at the per-SM rate on pulled rows, message cost and work besides copying
    included), and what one byte costs there: 1 per byte pulled, ``push_coef`` per byte pushed
    (pushed rows carry no extra work); ``pull_hbm_coef``: driver HBM bytes per byte pulled."""

    copy_bytes_per_s: float
    per_sm_pull_bytes_per_s: float
    push_coef: float
    pull_hbm_coef: float


def check_comm_work(comm_work) -> tuple:
    """``comm_work`` as a tuple; ValueError naming what is not in ``COMM_WORK``."""
    if isinstance(comm_work, str):
        comm_work = (comm_work,)
    bad = sorted(set(comm_work) - set(COMM_WORK))
    if bad:
        raise ValueError(f"comm_work must be among {COMM_WORK}, got {bad}")
    return tuple(comm_work)


def default_comm_work(dispatch_dtype: str) -> tuple:
    """What communication SMs do besides copying in a forward pass: quantize rows pulled as fp8."""
    return ("quantize",) if normalize_dtype(dispatch_dtype) == "fp8" else ()


def comm_model(profile, num_sms: int, dispatch_dtype: str, hidden: int, comm_work=()) -> CommModel:
    """Per-SM rate on a row of m bytes: s(m) = m / (message_s + m / r + m * sum(1 / work rates)),
    r = ``sm.copy_bytes_per_s``; GPU rate: ``hardware.comm_sm_curve(n, s(m_pull), port, p)``."""
    from .cost import row_bytes
    from .hardware import comm_sm_curve

    rk, r = profile.rack, profile.sm_copy_bytes_per_s
    comm_work = check_comm_work(comm_work)
    rates = {"quantize": rk.quantize_bytes_per_s, "transpose": rk.transpose_bytes_per_s,
             "stash": rk.stash_bytes_per_s}
    extra = sum(1.0 / rates[k] for k in set(comm_work))
    m_pull, m_push = row_bytes(hidden, dispatch_dtype), row_bytes(hidden, "bf16")
    s_pull = m_pull / (rk.message_s + m_pull / r + m_pull * extra)
    s_push = m_push / (rk.message_s + m_push / r)
    cap = float(comm_sm_curve(max(num_sms, 1), s_pull, profile.port_bytes_per_s, rk.saturation_exponent))
    return CommModel(cap, s_pull, s_pull / s_push, 2.0 if "stash" in comm_work else 1.0)


def layer_start_s(profile, config, tokens_per_gpu: int) -> float:
    """Fixed cost before anything moves: one launch, the router GEMM [Tg, H] x [H, E] (tile model,
    bf16, all SMs) and the profile's top-k / bookkeeping time (``megakernel.router_topk_s``)."""
    from megamoe.reference.sizes import dtype_bytes, row_bytes

    from .cost import stage_cost

    H, E = config.hidden_size, config.num_experts
    router = stage_cost([tokens_per_gpu], E, H, profile=profile, num_sms=profile.num_sms,
                        peak_flops_per_s=profile.tensor_flops_per_s["bf16"],
                        weight_bytes_per_elem=float(dtype_bytes("bf16")), in_row_bytes=float(row_bytes(H, "bf16")),
                        out_row_bytes=float(row_bytes(E, "fp32"))).time_s
    return profile.kernel_launch_s + profile.rack.router_topk_s + router


def build_layer_work(w, p, *, schedule: str, comm_sms: int, weight_dtype: str, dispatch_dtype: str,
                     include_shared: bool = True, comm_work=(), dispatch_mode: str = "pull",
                     combine_mode: str = "push") -> tuple[LayerWork, dict]:
    """The ``LayerWork`` of a ``workload.Workload`` on a profile, and per-GPU totals (flops, HBM bytes, rows).

    Compute per GPU and minibatch is one grouped GEMM over its slots (``cost.ffn_cost`` on the
    compute SMs; fused: both GEMMs' tiles of a round as one stream of the persistent kernel, its last
    wave partial once per round), shared among the slots by their FLOPs and bytes (tiles of ready slots fill the SMs
    together). Weights: a slot reads its weights in a minibatch unless they stay in L2 from an
    earlier one (all touched weights of the GPU fit in ``megakernel.l2_weight_fraction`` of L2).
    One GPU moves nothing: it runs one minibatch and gives its communication SMs to the compute.
    """
    from megamoe.reference.sizes import ffn_flops, ffn_params, weight_bytes_per_element

    from .cost import compute_dtype, ffn_cost, ffn_row_bytes, row_bytes

    cfg, rk = w.config, p.rack
    G, H, I = w.num_gpus, cfg.hidden_size, cfg.intermediate_size
    fused = normalize_schedule(schedule) == "fused"
    rows_mb = w.rows_slot_mb
    pull, push = w.pull_slot_mb, w.push_slot_mb
    if G == 1:
        rows_mb, pull, push = rows_mb.sum(axis=1, keepdims=True), pull.sum(1, keepdims=True), push.sum(1, keepdims=True)
        comm_sms = 0
    P, B = rows_mb.shape
    sms = p.num_sms - comm_sms if fused else p.num_sms
    if sms < 1:
        raise ValueError(f"comm_sms={comm_sms} leaves no compute SMs of {p.num_sms}")
    wb = weight_bytes_per_element(weight_dtype)  # fp8: with its 128 x 128 block scales
    hbm = p.hbm_effective_bytes_per_s
    peak = p.tensor_flops_per_s[compute_dtype(weight_dtype, dispatch_dtype)]
    kw = dict(profile=p, num_sms=sms, weight_dtype=weight_dtype, act_dtype=dispatch_dtype, one_stream=fused)
    wbytes = ffn_params(H, I) * wb
    act_row = ffn_row_bytes(H, I, dispatch_dtype)
    job_s, job_hbm = np.zeros((P, B)), np.zeros((P, B))
    flops, hbm_g, rows = np.zeros(G), np.zeros(G), np.zeros(G, np.int64)
    for g in range(G):
        sl = np.nonzero(w.placement.slot_rank == g)[0]
        r = rows_mb[sl]  # (n, B)
        rows[g] = r.sum()
        touched = r > 0
        resident = fused and np.count_nonzero(touched.any(axis=1)) * wbytes <= rk.l2_weight_fraction * p.l2_bytes
        reads = touched & ~(np.cumsum(touched, axis=1) > 1) if resident else touched  # (n, B) weights read
        parts = range(B) if fused else [None]
        for m in parts:
            rm = r.sum(axis=1) if m is None else r[:, m]
            rd = reads.any(axis=1) if m is None else reads[:, m]
            if not rm.any():
                continue
            if rd[rm > 0].all() or not rd.any():
                c = ffn_cost(rm, H, I, read_weights=bool(rd.any()), **kw)
                t, hb = c.time_s, c.hbm_bytes
            else:  # some slots read weights, some find them in L2
                c = ffn_cost(rm, H, I, read_weights=False, **kw)
                hb = c.hbm_bytes + wbytes * np.count_nonzero(rd & (rm > 0))
                t = max(c.time_s, hb / hbm)
            flops[g] += c.flops
            hbm_g[g] += hb
            b_j = rm * act_row + rd * (rm > 0) * wbytes  # (n,) each slot's bytes
            share = np.maximum(ffn_flops(rm, H, I) / peak, b_j / hbm)
            mm = 0 if m is None else m
            job_s[sl, mm] = t * share / share.sum()
            job_hbm[sl, mm] = hb * b_j / b_j.sum()
    shared_s, shared_hbm = np.zeros(G), np.zeros(G)
    if include_shared and cfg.num_shared_experts:
        c = ffn_cost([w.tokens_per_gpu], H, cfg.shared_intermediate_size, **kw)
        shared_s[:], shared_hbm[:] = c.time_s, c.hbm_bytes
        flops += c.flops
        hbm_g += c.hbm_bytes
    # the owner's reduction per minibatch: read every partial sum (and the shared expert's), write y
    Tg = w.tokens_per_gpu
    mb = Tg if G == 1 else w.minibatch
    tok_m = np.minimum(mb, Tg - mb * np.arange(B)).astype(np.float64)  # (B,)
    partial_rows = np.zeros((G, B))
    for d in range(G):
        partial_rows[:, :] += push[w.placement.slot_rank == d].sum(axis=0).T
    rb = row_bytes(H, "bf16")
    red_bytes = partial_rows * rb + tok_m[None, :] * rb * (2.0 if shared_s.any() else 1.0)
    red_bytes[partial_rows.sum(axis=1) == 0] *= 0.0  # an owner whose tokens go nowhere reduces nothing
    cm = comm_model(p, comm_sms, dispatch_dtype, H, comm_work)
    work = LayerWork(
        slot_rank=w.placement.slot_rank, job_s=job_s, job_hbm_bytes=job_hbm, shared_s=shared_s,
        shared_hbm_bytes=shared_hbm, pull_bytes=pull * float(row_bytes(H, dispatch_dtype)),
        push_bytes=push * float(rb), reduce_s=red_bytes / hbm, reduce_hbm_bytes=red_bytes,
        start_s=np.full(G, layer_start_s(p, cfg, Tg)), barrier_s=rk.layer_barrier_s,
        launch_s=p.kernel_launch_s, sync_s=p.grid_sync_s if fused else 0.0, routed_launches=2, shared_launches=2,
        pull_copy_coef=1.0, push_copy_coef=cm.push_coef, pull_hbm_coef=cm.pull_hbm_coef,
        buffer_minibatches=rk.buffer_minibatches, dispatch_mode=check_mode("dispatch", dispatch_mode),
        combine_mode=check_mode("combine", combine_mode), **protocol_terms(p, dispatch_mode, combine_mode))
    return work, {"flops": flops, "hbm_bytes": hbm_g, "rows": rows, "compute_sms": sms, "comm_sms": comm_sms,
                  "copy_bytes_per_s": cm.copy_bytes_per_s, "per_sm_pull_bytes_per_s": cm.per_sm_pull_bytes_per_s}


@dataclass(frozen=True)
class Capacities:
    """Per-GPU capacities in bytes/s: NVLink port (each direction), copy SMs (pure copy), HBM."""

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


def _peer_flows(fabric: Fabric, lay: Layout, g: int, per_peer: np.ndarray, label: str, *, pull: bool,
                copy_coef: float, hbm_coef: float = 1.0, limited: bool = False, copy_at_peer: bool = False,
                port_coef: float = 1.0) -> dict[int, int]:
    """GPU g moves ``per_peer`` (G,) bytes from (``pull``) or to each peer: one flow per peer with
    bytes. Returns {peer: flow id}. A flow loads g's port (receive when pulling, send when pushing,
    ``port_coef`` port bytes per byte), the communication SMs of g (or of the peer, ``copy_at_peer``:
    the other side drives the copy) and g's HBM, and the peer's opposite port and HBM."""
    peers = np.nonzero(per_peer > 0)[0]
    peers = peers[peers != g]
    if not peers.size:
        return {}
    n = peers.size
    own = lay.recv(g) if pull else lay.send(g)
    theirs = lay.send(peers) if pull else lay.recv(peers)
    copy = lay.copy(peers) if copy_at_peer else np.full(n, lay.copy(g))
    res = np.column_stack([np.full(n, own), copy, np.full(n, lay.hbm(g)), theirs, lay.hbm(peers)])
    coef = np.tile([port_coef, copy_coef, hbm_coef, port_coef, 1.0], (n, 1))
    ids = fabric.add_many(res, coef, per_peer[peers], [f"{label} GPU {h}" for h in peers], limited=limited)
    return dict(zip(peers.tolist(), ids.tolist()))


def _dispatch_kw(work: LayerWork) -> dict:
    """How a dispatch flow (registered at its receiver) loads the fabric."""
    return dict(copy_coef=work.pull_copy_coef, hbm_coef=work.pull_hbm_coef, copy_at_peer=work.dispatch_mode == "push",
                port_coef=work.dispatch_port_coef)


def _combine_kw(work: LayerWork) -> dict:
    """How a combine flow (registered at the expert GPU that computed it) loads the fabric."""
    return dict(copy_coef=work.push_copy_coef, copy_at_peer=work.combine_mode == "pull", port_coef=work.combine_port_coef)


def _later(env: simpy.Environment, events: list, delay_s: float) -> simpy.Event:
    """An event ``delay_s`` after every one of ``events`` has fired (a round's completion signalling)."""
    ev = when_all(env, events)
    if delay_s <= 0:
        return ev
    out = env.event()

    def fire(_e=None):
        env.timeout(delay_s).callbacks.append(lambda _t: out.succeed())

    if ev.triggered:
        fire()
    else:
        ev.callbacks.append(fire)
    return out


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
    copies: list = None  # (gpu, track, name, flow ids, bytes key): spans of copies, read off the fabric after the run

    def copy_spans(self, fabric: Fabric) -> None:
        """Turn ``copies`` into spans: first start to last end of each group's flows."""
        for g, track, name, fids, key in self.copies or []:
            fids = np.asarray(fids, np.int64)
            if not fids.size:
                continue
            st = fabric.start_s[fids]
            if np.isnan(st).all():
                continue
            self.spans.append(Span(g, track, name, float(np.nanmin(st)), float(np.nanmax(fabric.end_s[fids])),
                                   {key: float(fabric.total[fids].sum())}))


def _run_job(env, fabric, fid, log, g, name, extra_s=0.0, args=None):
    """Process: one compute job on GPU g (a flow), then ``extra_s`` of barrier/launch time."""
    t0 = env.now
    if fid is not None:
        yield fabric.start(fid)
    if extra_s:
        yield env.timeout(extra_s)
    log.compute_busy_s[g] += env.now - t0
    log.spans.append(Span(g, "compute", name, t0, env.now, args or {}))


def _reduce_and_end(env, fabric, lay, work, log, g, wait: list, m_list, R):
    """Process: reductions of minibatches in ``m_list`` on owner g as their partials land, then the barrier."""
    ends = []
    for m in m_list:
        ev = env.event()
        ends.append(ev)

        def red(m=m, ev=ev):
            def proc():
                if R[g][m] is not None:
                    yield from _run_job(env, fabric, R[g][m], log, g, f"reduce mb{m}")
                ev.succeed()
            env.process(proc())

        _then(env, wait[m], red)

    def fin():
        yield when_all(env, ends)
        if work.barrier_s:
            t0 = env.now
            yield env.timeout(work.barrier_s)
            log.spans.append(Span(g, "compute", "layer barrier", t0, env.now, {}))
        log.end_s[g] = env.now

    env.process(fin())


def bulk_synchronous(env: simpy.Environment, fabric: Fabric, lay: Layout, work: LayerWork) -> RunLog:
    """Register the flows and start the processes of the bulk-synchronous schedule."""
    G = work.num_gpus
    disp = work.dispatch_bytes().sum(axis=1)  # (G src, G dst)
    comb = work.combine_bytes().sum(axis=1)  # (G owner, G expert gpu)
    D = [_peer_flows(fabric, lay, g, disp[:, g], f"dispatch to GPU {g} from", pull=True, **_dispatch_kw(work))
         for g in range(G)]
    C = [_peer_flows(fabric, lay, g, comb[:, g], f"combine from GPU {g} to", pull=False, **_combine_kw(work))
         for g in range(G)]
    L = work.launch_s
    routed_s = np.bincount(work.slot_rank, weights=work.job_s.sum(axis=1), minlength=G)
    routed_hbm = np.bincount(work.slot_rank, weights=work.job_hbm_bytes.sum(axis=1), minlength=G)
    launches = work.routed_launches * L * (routed_s > 0) + work.shared_launches * L * (work.shared_s > 0)
    gemm_s = routed_s + work.shared_s
    J = [_job_flow(fabric, lay, g, gemm_s[g], routed_hbm[g] + work.shared_hbm_bytes[g], f"GEMMs on GPU {g}")
         for g in range(G)]
    R = [[_job_flow(fabric, lay, g, work.reduce_s[g].sum(), work.reduce_hbm_bytes[g].sum(), f"reduce on GPU {g}")]
         for g in range(G)]
    log = RunLog([], np.zeros(G), np.zeros(G), [])
    d_in = [fabric.all_done(D[g].values()) for g in range(G)]
    d_out = [fabric.all_done([D[h][g] for h in range(G) if g in D[h]]) for g in range(G)]
    c_out = [fabric.all_done(C[g].values()) for g in range(G)]
    c_in = [fabric.all_done([C[h][g] for h in range(G) if g in C[h]]) for g in range(G)]
    computed = [env.event() for _ in range(G)]  # g's own partial sums exist

    def gpu(g: int):
        yield env.timeout(work.start_s[g])
        fabric.start_many(list(D[g].values()))
        log.copies.append((g, "dispatch", "dispatch", list(D[g].values()), "bytes_in"))
        yield when_all(env, [d_in[g], d_out[g]])
        if work.dispatch_signal_s and D[g]:
            yield env.timeout(work.dispatch_signal_s)
        yield from _run_job(env, fabric, J[g], log, g, "grouped GEMMs + shared expert", launches[g],
                            {"routed_us": routed_s[g] * 1e6, "shared_us": work.shared_s[g] * 1e6})
        computed[g].succeed()
        yield env.timeout(L)
        fabric.start_many(list(C[g].values()))
        log.copies.append((g, "combine", "combine", list(C[g].values()), "bytes_out"))

    for g in range(G):
        env.process(gpu(g))
        c_sig = _later(env, [c_in[g]], work.combine_signal_s if comb[:, g].sum() - comb[g, g] > 0 else 0.0)
        _reduce_and_end(env, fabric, lay, work, log, g, [[c_sig, c_out[g], computed[g]]], [0], R)
    return log


def fused(env: simpy.Environment, fabric: Fabric, lay: Layout, work: LayerWork) -> RunLog:
    """Register the flows and start the processes of the fused megakernel schedule."""
    G, B = work.num_gpus, work.num_minibatches
    slots = [np.nonzero(work.slot_rank == g)[0] for g in range(G)]
    # per (g, m): pull flows per peer, and one milestone per local slot with rows (its rows have landed)
    D, C, ready = [], [], []
    for g in range(G):
        Dg, Cg, rg = [], [], []
        for m in range(B):
            pb = work.pull_bytes[slots[g], m, :]  # (n, G) in slot order
            flows = _peer_flows(fabric, lay, g, pb.sum(axis=0), f"pull mb{m} to GPU {g} from", pull=True,
                                **_dispatch_kw(work))
            cum = np.cumsum(pb, axis=0)
            peers = np.array(sorted(flows), np.int64)
            fl = np.array([flows[h] for h in peers], np.int64)
            ms = {}
            for i, p in enumerate(slots[g]):
                if work.job_s[p, m] > 0 and peers.size:
                    ms[int(p)] = fabric.milestone(fl, cum[i, peers])
            Dg.append(flows)
            rg.append(ms)
            Cg.append(_peer_flows(fabric, lay, g, work.push_bytes[slots[g], m, :].sum(axis=0),
                                  f"push mb{m} from GPU {g} to", pull=False, limited=True, **_combine_kw(work)))
        D.append(Dg)
        C.append(Cg)
        ready.append(rg)
    J = {(int(p), m): _job_flow(fabric, lay, int(work.slot_rank[p]), work.job_s[p, m], work.job_hbm_bytes[p, m],
                                f"slot {p} mb{m}") for p in range(work.slot_rank.size) for m in range(B)}
    S = [_job_flow(fabric, lay, g, work.shared_s[g], work.shared_hbm_bytes[g], f"shared expert on GPU {g}")
         for g in range(G)]
    R = [[_job_flow(fabric, lay, g, work.reduce_s[g, m], work.reduce_hbm_bytes[g, m], f"reduce mb{m} GPU {g}")
          for m in range(B)] for g in range(G)]
    log = RunLog([], np.zeros(G), np.zeros(G), [])
    depth = max(1, int(work.buffer_minibatches))
    computed = [[env.event() for _ in range(B)] for _ in range(G)]  # g's compute of minibatch m is done
    pushed = [[fabric.all_done(C[g][m].values()) for m in range(B)] for g in range(G)]  # g's pushes of m are done
    landed = [[fabric.all_done([C[h][m][g] for h in range(G) if g in C[h][m]]) for m in range(B)]
              for g in range(G)]  # every partial sum of g's minibatch m has arrived
    # with completion signalling, a round's rows are known to have landed once all of them have and
    # the round's completion has been signalled (without it, each slot's rows as they land)
    round_in = [[fabric.all_done(D[g][m].values()) if work.dispatch_signal_s and D[g][m] else None for m in range(B)]
                for g in range(G)]
    if work.combine_signal_s:  # ... and has been signalled
        pushed = [[_later(env, [e], work.combine_signal_s) for e in row] for row in pushed]
        landed = [[_later(env, [landed[g][m]], work.combine_signal_s) if any(g in C[h][m] for h in range(G))
                   else landed[g][m] for m in range(B)] for g in range(G)]

    def start_pulls(g: int, m: int):
        def go(h):
            f = D[g][m][h]
            fabric.start(f)

        # per peer, minibatch after minibatch; and at most ``depth`` minibatches ahead of the compute
        gate = [computed[g][m - depth]] if m >= depth else []
        log.copies.append((g, "dispatch", f"pull mb{m}", list(D[g][m].values()), "bytes"))
        if not gate and not m:
            fabric.start_many(list(D[g][m].values()))
            return
        for h in D[g][m]:
            prev = [_later(env, [fabric.done(D[g][m - 1][h])], dsig)] if m and h in D[g][m - 1] else []
            _then(env, gate + prev, lambda h=h: go(h))

    dsig = work.dispatch_signal_s
    signalled = [[None] * B for _ in range(G)]

    def compute(g: int):
        yield env.timeout(work.start_s[g])
        for m in range(B):
            start_pulls(g, m)
            if round_in[g][m] is not None:
                signalled[g][m] = _later(env, [round_in[g][m]], dsig)
        if S[g] is not None:
            yield from _run_job(env, fabric, S[g], log, g, "shared expert")
        for m in range(B):
            if m >= depth:  # the send buffer holds ``depth`` minibatches of results
                yield pushed[g][m - depth]
            started = False
            t0 = env.now
            for p in slots[g]:
                p = int(p)
                if J[(p, m)] is None:
                    continue
                if p in ready[g][m]:
                    yield fabric.milestone_event(ready[g][m][p])
                    if signalled[g][m] is not None:
                        yield signalled[g][m]
                yield from _run_job(env, fabric, J[(p, m)], log, g, f"slot {p} mb{m}",
                                    args={"alone_us": work.job_s[p, m] * 1e6})
                peers = [h for h in np.nonzero(work.push_bytes[p, m] > 0)[0].tolist() if h != g]  # all in C[g][m]
                if peers:
                    fabric.raise_limit([C[g][m][h] for h in peers], work.push_bytes[p, m, peers])
                if not started:
                    fabric.start_many(list(C[g][m].values()))
                    started = True
            if not started:
                fabric.start_many(list(C[g][m].values()))
            log.copies.append((g, "combine", f"push mb{m}", list(C[g][m].values()), "bytes"))
            if work.sync_s and env.now > t0:
                yield env.timeout(work.sync_s)
            computed[g][m].succeed()

    for g in range(G):
        env.process(compute(g))
    for g in range(G):
        _reduce_and_end(env, fabric, lay, work, log, g, [[landed[g][m], computed[g][m]] for m in range(B)], range(B), R)
    return log


def run_schedule(schedule: str, work: LayerWork, caps: Capacities, latency_s: float, resolution_s: float = 0.0):
    """Run one layer; returns (RunLog, Fabric, Layout).

    The cyclic GC is off meanwhile: the layer makes next to no cyclic garbage, but enough objects to
    start collections that walk everything alive (numba's and numpy's objects too), about a tenth of
    a run."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run_schedule(schedule, work, caps, latency_s, resolution_s)
    finally:
        if collecting:
            gc.enable()


def _run_schedule(schedule: str, work: LayerWork, caps: Capacities, latency_s: float, resolution_s: float):
    env = simpy.Environment()
    G = work.num_gpus
    lay = Layout(G)
    fabric = Fabric(env, np.zeros(0), latency_s, resolution_s)
    fn = bulk_synchronous if normalize_schedule(schedule) == "bulk" else fused
    log = fn(env, fabric, lay, work)
    fabric.set_capacity(np.concatenate([np.full(2 * G, caps.port_bytes_per_s), np.full(G, caps.copy_bytes_per_s),
                                        np.full(G, caps.hbm_bytes_per_s), np.asarray(lay.caps, dtype=np.float64)]))
    fabric.sample_width = 4 * G
    env.run()
    log.copy_spans(fabric)
    if fabric.active.any():  # pragma: no cover - a bug, not an input error
        raise RuntimeError("simulation ended with flows still moving")
    return log, fabric, lay
