"""Analytic estimate: roofline compute plus busiest-endpoint bandwidth.  A lower bound of the event model.

Shape legend: G GPUs, B minibatches, P slots.

Per GPU g (bytes off the diagonal only; port = links x link rate x payload efficiency; copy = what
the communication SMs move, ``schedules.comm_model``, with pushed bytes weighted by their cost there;
start = launch + router + top-k; compute_g = ``cost.ffn_roofline_s`` of g's rows per slot plus the
shared expert, on all SMs, weights read once):

    fused:  max over g of  start + max(compute_g, max(sent_g / port, received_g / port,
                                                 driven_g / copy) + latency if g moves anything) + barrier
    bulk:   max over g of  start + max(dsent_g / port, drecv_g / min(port, copy)) + latency
                           + compute_g
                           + launch + max(csent_g / min(port, copy), crecv_g / port) + latency + barrier

The event model can only add to these (padding, waves, smaller minibatches, shared bandwidth,
waiting on peers), and the tests check that it never falls below them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import ffn_roofline_s
from .gemm_cost import ffn_roofline_terms
from .hardware import Profile
from .rates import hbm_peak
from .schedules import normalize_schedule

#: The bound's terms, each alone on a GPU, and what each names in a verdict.
TERMS = {
    "compute": "compute (tensor cores)",
    "hbm": "HBM bandwidth",
    "copy": "the communication SMs' copy rate",
    "send_port": "the NVLink send ports",
    "recv_port": "the NVLink receive ports",
    "signal": "per-round completion signalling",
    "fill": "the first round's fill, then the experts' work",
    "fixed": "fixed costs (launch, router, barrier)",
}


@dataclass(frozen=True)
class Estimate:
    """Analytic layer time and its parts, in seconds; per_gpu arrays are (G,)."""

    schedule: str
    time_s: float
    compute_s: np.ndarray
    comm_s: np.ndarray  # busiest endpoint of each GPU (dispatch + combine together)
    busiest_gpu: int
    terms: dict = None  # {term name: (G,) seconds}: the bound's parts, each alone (``TERMS``)

    @property
    def time_us(self) -> float:
        return self.time_s * 1e6


def gpu_bytes(dispatch_bytes: np.ndarray, combine_bytes: np.ndarray) -> dict[str, np.ndarray]:
    """(G,) per-GPU byte totals from (G, B, G) matrices, diagonals excluded."""
    d = dispatch_bytes.sum(axis=1).astype(np.float64)
    c = combine_bytes.sum(axis=1).astype(np.float64)
    np.fill_diagonal(d, 0.0)
    np.fill_diagonal(c, 0.0)
    return {
        "dispatch_sent": d.sum(axis=1), "dispatch_recv": d.sum(axis=0),  # d[src, dst]
        "combine_sent": c.sum(axis=0), "combine_recv": c.sum(axis=1),  # c[owner, expert gpu]
    }


def compute_roofline_s(rows_slot: np.ndarray, slot_rank: np.ndarray, shared_rows: int, num_gpus: int, *,
                       hidden: int, width: int, shared_width: int, profile: Profile, weight_dtype: str,
                       act_dtype: str) -> np.ndarray:
    """(G,) roofline seconds of each GPU's routed slots plus its shared expert."""
    kw = dict(profile=profile, weight_dtype=weight_dtype, act_dtype=act_dtype)
    shared = ffn_roofline_s([shared_rows], hidden, shared_width, **kw) if shared_width and shared_rows else 0.0
    c, w, a = ffn_roofline_terms(rows_slot, hidden, width, **kw)  # (P,) each
    compute = np.bincount(slot_rank, weights=c, minlength=num_gpus)
    hbm = np.bincount(slot_rank, weights=w + a, minlength=num_gpus) / hbm_peak(profile)
    return np.maximum(compute, hbm) + shared


def estimate(schedule: str, *, compute_s: np.ndarray, dispatch_bytes: np.ndarray, combine_bytes: np.ndarray,
             profile: Profile, copy_bytes_per_s: float, start_s: float | np.ndarray | None = None,
             copy_coefs: tuple[float, float] = (1.0, 1.0), barrier_s: float = 0.0, work=None,
             port_coefs: tuple[float, float] = (1.0, 1.0), signals_s: tuple[float, float] = (0.0, 0.0),
             rounds: int = 1, modes: tuple[str, str] = ("pull", "push")) -> Estimate:
    """The analytic bound for ``schedule`` from per-GPU roofline compute (G,) and the byte matrices.

    ``copy_bytes_per_s``: what the communication SMs move (``schedules.comm_model``);
    ``start_s``: the fixed cost before anything moves (default: one launch); ``copy_coefs``: copy-SM
    bytes per byte pulled and pushed; ``port_coefs``: port bytes per payload byte of dispatch and of
    combine (the protocol of each); ``signals_s``: the completion signalling of one round of each,
    paid ``rounds`` times (dispatch) and at least once (combine) by a GPU that moves anything; a
    ``schedules.LayerWork`` gives all of these, and the closing barrier.
    """
    schedule = normalize_schedule(schedule)
    b = gpu_bytes(dispatch_bytes, combine_bytes)
    port = profile.port_bytes_per_s
    copy = copy_bytes_per_s
    lat = profile.link_latency_s
    L = profile.kernel_launch_s
    barrier = barrier_s
    if work is not None:
        start_s, copy_coefs, barrier = work.start_s, (work.pull_copy_coef, work.push_copy_coef), work.barrier_s
        port_coefs = (work.dispatch_port_coef, work.combine_port_coef)
        signals_s, rounds = (work.dispatch_signal_s, work.combine_signal_s), work.num_minibatches
        modes = (work.dispatch_mode, work.combine_mode)
    start = L if start_s is None else start_s
    pc, qc = copy_coefs
    dp, cp = port_coefs
    for k in ("dispatch_sent", "dispatch_recv"):
        b[k] = b[k] * dp
    for k in ("combine_sent", "combine_recv"):
        b[k] = b[k] * cp
    moves = (b["dispatch_recv"] + b["dispatch_sent"] + b["combine_sent"] + b["combine_recv"]) > 0
    # bytes each GPU's communication SMs copy: dispatch at the receiver if pulled, at the sender if pushed
    d_driven = (b["dispatch_recv"] if modes[0] == "pull" else b["dispatch_sent"]) * pc / dp
    c_driven = (b["combine_sent"] if modes[1] == "push" else b["combine_recv"]) * qc / cp
    signal = (rounds * signals_s[0] * (b["dispatch_recv"] > 0) + signals_s[1] * (b["combine_recv"] > 0))
    if schedule == "fused":
        sent = b["dispatch_sent"] + b["combine_sent"]
        recv = b["dispatch_recv"] + b["combine_recv"]
        driven = d_driven + c_driven
        comm = np.maximum.reduce([sent / port, recv / port, driven / copy, signal])
        per_gpu = start + np.maximum(compute_s, comm + lat * moves) + barrier
        terms = {"copy": driven / copy, "send_port": sent / port, "recv_port": recv / port, "signal": signal}
    else:
        dis = np.maximum.reduce([b["dispatch_sent"] / port, b["dispatch_recv"] / port, d_driven / copy])
        com = np.maximum.reduce([b["combine_sent"] / port, b["combine_recv"] / port, c_driven / copy])
        comm = dis + com
        per_gpu = (start + dis + lat * (b["dispatch_recv"] + b["dispatch_sent"] > 0) + compute_s
                   + L + com + lat * (b["combine_sent"] + b["combine_recv"] > 0) + barrier)
        per_gpu = per_gpu + signals_s[0] * (b["dispatch_recv"] > 0) + signals_s[1] * (b["combine_recv"] > 0)
        terms = {"copy": (d_driven + c_driven) / copy,
                 "signal": signals_s[0] * (b["dispatch_recv"] > 0) + signals_s[1] * (b["combine_recv"] > 0),
                 "send_port": (b["dispatch_sent"] + b["combine_sent"]) / port,
                 "recv_port": (b["dispatch_recv"] + b["combine_recv"]) / port}
    g = int(np.argmax(per_gpu))
    G = len(per_gpu)
    terms = {"compute": np.broadcast_to(compute_s, (G,)).astype(np.float64), **terms,
             "fixed": np.broadcast_to(np.asarray(start, np.float64) + barrier, (G,)).copy()}
    return Estimate(schedule, float(per_gpu[g]), compute_s, comm, g, terms)


def phase_bounds_s(schedule: str, dispatch_bytes: np.ndarray, combine_bytes: np.ndarray, profile: Profile,
                   copy_bytes_per_s: float, copy_coefs: tuple[float, float] = (1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """(G,) lower bounds of each GPU's dispatch and of its combine alone, in seconds: its bytes
    off the diagonal at the port rate (sent, received) or the copy rate of the communication SMs
    (the copies it drives, weighted by ``copy_coefs``: pulls in dispatch, pushes in combine), plus
    one latency if it moves any. The same terms as ``estimate``, one phase at a time (the analytic
    table's dispatch and combine)."""
    normalize_schedule(schedule)
    b = gpu_bytes(dispatch_bytes, combine_bytes)
    port, copy, lat = profile.port_bytes_per_s, copy_bytes_per_s, profile.link_latency_s
    pc, qc = copy_coefs
    dis = np.maximum.reduce([b["dispatch_sent"] / port, b["dispatch_recv"] / port, b["dispatch_recv"] * pc / copy])
    com = np.maximum.reduce([b["combine_sent"] / port, b["combine_recv"] / port, b["combine_sent"] * qc / copy])
    return dis + lat * (dis > 0), com + lat * (com > 0)


def rack_terms(profile: Profile, config, tokens_per_gpu: int, *, comm_sms: int | None = None,
               dispatch_dtype: str = "bf16", comm_work: tuple | None = None, start_s: float | None = None,
               dispatch_mode: str = "pull", combine_mode: str = "push") -> dict:
    """The rack model's keyword arguments of ``estimate`` for a workload of ``config`` at
    ``tokens_per_gpu``: the communication SMs' copy rate (``schedules.comm_model``; default SMs from
    the profile's ``megakernel.comm_sms``, default work ``schedules.default_comm_work``), the copy
    cost per byte pulled and pushed, the fixed start (``schedules.layer_start_s``, unless given:
    it reads only the GPU side of the profile, so sweeps cache it), the barrier, and each phase's
    protocol (``schedules.protocol_terms``)."""
    from .cost import normalize_dtype
    from .schedules import comm_model, default_comm_work, layer_start_s, protocol_terms

    ad = normalize_dtype(dispatch_dtype)
    n = profile.rack.comm_sms if comm_sms is None else comm_sms
    cm = comm_model(profile, n, ad, config.hidden_size, default_comm_work(ad) if comm_work is None else comm_work)
    start = layer_start_s(profile, config, tokens_per_gpu) if start_s is None else start_s
    pt = protocol_terms(profile, dispatch_mode, combine_mode)
    return dict(copy_bytes_per_s=cm.copy_bytes_per_s, start_s=start,
                copy_coefs=(1.0, cm.push_coef), barrier_s=profile.rack.layer_barrier_s,
                port_coefs=(pt["dispatch_port_coef"], pt["combine_port_coef"]),
                signals_s=(pt["dispatch_signal_s"], pt["combine_signal_s"]), modes=(dispatch_mode, combine_mode))


def estimate_workload(workload, system, *, schedule: str = "fused", comm_sms: int | None = None,
                      dtype: str = "bf16", weight_dtype: str | None = None, dispatch_dtype: str | None = None,
                      include_shared: bool = True, comm_work: tuple | None = None, dispatch_mode: str = "pull",
                      combine_mode: str = "push") -> Estimate:
    """The analytic bound straight from a built ``workload.Workload``: no SimPy, under a millisecond on NVL72.

    For sweeps: build the workload once, then vary system, schedule, comm SMs and dtypes here.
    """
    from .cost import normalize_dtype, row_bytes
    from .hardware import load_profile

    p = load_profile(system)
    cfg = workload.config
    wd, ad = normalize_dtype(weight_dtype or dtype), normalize_dtype(dispatch_dtype or dtype)
    comp = compute_roofline_s(
        workload.rows_slot, workload.placement.slot_rank, workload.tokens_per_gpu if include_shared else 0,
        workload.num_gpus, hidden=cfg.hidden_size, width=cfg.intermediate_size,
        shared_width=cfg.shared_intermediate_size, profile=p, weight_dtype=wd, act_dtype=ad)
    t = workload.traffic_mb
    return estimate(schedule, compute_s=comp, dispatch_bytes=t * row_bytes(cfg.hidden_size, ad),
                    combine_bytes=t * row_bytes(cfg.hidden_size, "bf16"), profile=p, rounds=workload.num_minibatches,
                    **rack_terms(p, cfg, workload.tokens_per_gpu, comm_sms=comm_sms, dispatch_dtype=ad,
                                 comm_work=comm_work, dispatch_mode=dispatch_mode, combine_mode=combine_mode))
