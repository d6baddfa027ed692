"""The public entry: simulate one MoE layer on a system and say where the time goes.

Shape legend: T tokens, E experts, P slots, K top-k, H hidden, I expert width, G GPUs, B minibatches.

Scenario (defaults = ``megamoe simulate`` with no arguments): DeepSeek-V3's MoE layer on a GB200
NVL72, 4096 tokens per GPU, skewed routing (by-expert imbalance 10.9), contiguous placement, the
fused schedule with the profile's 40 communication SMs and 4096-token minibatches, bf16, seed 0.

    r = simulate("deepseek-v3", "gb200-nvl72", 4096, routing="skewed", schedule="fused")
    r.layer_time_us, r.breakdown_us, r.analytic_us, r.to_json(), r.write_trace("layer.json")

``simulate_workload`` reuses one routed workload for several schedules; ``simulate_single_gpu_kernel``
predicts one GPU's expert kernel from explicit rows per expert (the validation hook).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from megamoe.reference import MoEConfig

from .analytic import Estimate, compute_roofline_s, estimate, gpu_bytes
from .cost import ffn_cost, normalize_dtype, row_bytes
from .hardware import Profile, load_profile, override, plausibility_warnings
from .rounds import round_terms
from .schedules import (
    RESOLUTION,
    Capacities,
    build_layer_work,
    check_comm_work,
    default_comm_work,
    normalize_schedule,
    run_schedule,
)
from .topology import uniform_link_bytes
from .verdict import verdict
from .workload import (
    BUILD_BYTES_PER_PAIR,
    Workload,
    available_memory_bytes,
    build_workload,
    estimate_build,
    resolve_routing,
)

MEMORY_SHARE = 0.8  # the size guard refuses a workload needing more than this share of free memory
LONG_RUN_S = 5.0  # estimated builds longer than this report progress
#: Keys of ``breakdown_us`` that add up to the layer time.
ADDITIVE = ("expert_compute", "load_imbalance_wait", "exposed_communication")


def default_minibatch(tokens_per_gpu: int, system: str | Path | Profile = "gb200-nvl72") -> int:
    """Tokens per minibatch when none is given: the profile's ``megakernel.minibatch_tokens`` (at most Tg)."""
    return min(int(tokens_per_gpu), load_profile(system).rack.minibatch_tokens)


def tokens_for_rows(rows: int, config: MoEConfig, tokens_per_gpu: int) -> int:
    """Tokens per GPU per round whose rows a GPU receives as ``rows`` per round on average: every
    GPU sends each of its tokens' K expert rows, so a GPU receives K rows per token per round
    (T = K x minibatch, Mixture-of-Kittens' count); at least 1, at most Tg."""
    if isinstance(rows, bool) or int(rows) != rows or rows < 1:
        raise ValueError(f"minibatch_rows must be a whole number of rows >= 1, got {rows!r}")
    return int(min(max(1, round(rows / config.top_k)), tokens_per_gpu))


def round_rows(workload: Workload) -> dict:
    """The minibatch as Mixture-of-Kittens counts it: rows each GPU receives per round (its slots'
    rows, local ones included), nominal (K x tokens per round) and as routed (mean and max over
    GPUs and rounds)."""
    per = np.zeros((workload.num_gpus, workload.num_minibatches))
    np.add.at(per, workload.placement.slot_rank, workload.rows_slot_mb)
    return {"minibatch_rows_nominal": workload.minibatch * workload.config.top_k,
            "minibatch_rows_mean": float(per.mean()), "minibatch_rows_max": int(per.max())}


def default_comm_sms(system: str | Path | Profile = "gb200-nvl72") -> int:
    """Communication SMs when none are given: the profile's ``megakernel.comm_sms``."""
    return load_profile(system).rack.comm_sms


def check_comm_sms(comm_sms: int | None, profile: Profile) -> int:
    """The communication SM count to use (default: the profile's ``megakernel.comm_sms``); ValueError
    unless it is in [1, S - 1]."""
    c = profile.rack.comm_sms if comm_sms is None else comm_sms
    if isinstance(c, bool) or int(c) != c or not 1 <= c < profile.num_sms:
        raise ValueError(f"comm_sms must be a whole number in [1, {profile.num_sms - 1}] for {profile.name} "
                         f"({profile.num_sms} SMs: at least one copies, one computes), got {comm_sms!r}")
    return int(c)


def check_request(cfg: MoEConfig, p: Profile, tokens_per_gpu, *, routing, placement, comm_sms, minibatch, seed,
                  num_slots, comm_work=None) -> list[str]:
    """Refuse an unusable request before any work (ValueError naming the value and what is allowed);
    return notes for the user: a clamped default skew, implausible profile numbers, a long build."""
    if isinstance(tokens_per_gpu, bool) or int(tokens_per_gpu) != tokens_per_gpu or tokens_per_gpu < 1:
        raise ValueError(f"tokens_per_gpu must be a whole number >= 1, got {tokens_per_gpu!r}")
    if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be a whole number in [0, 2^32), got {seed!r}")
    if minibatch is not None and (isinstance(minibatch, bool) or int(minibatch) != minibatch or minibatch < 1):
        raise ValueError(f"minibatch must be a whole number of tokens >= 1 (or left out for the default), "
                         f"got {minibatch!r}")
    if num_slots is not None and placement != "eplb":
        raise ValueError(f"num_slots (--slots {num_slots}) applies to the eplb placement only; placement "
                         f"{placement!r} has one slot per expert")
    E, G = cfg.num_experts, p.num_gpus
    if num_slots is not None and (isinstance(num_slots, bool) or int(num_slots) != num_slots or num_slots < E
                                  or num_slots % G):
        raise ValueError(f"eplb: num_slots={num_slots} must be >= num_experts={E} and a multiple of num_gpus={G}")
    check_comm_sms(comm_sms, p)
    if comm_work is not None:
        check_comm_work(comm_work)
    _, note = resolve_routing(routing, cfg)
    notes = [note] if note else []
    notes += [f"warning: {w}" for w in plausibility_warnings(p)]
    est = estimate_build(cfg, p.num_gpus, int(tokens_per_gpu), routing)
    avail = available_memory_bytes()
    if est["bytes"] > MEMORY_SHARE * avail:
        fit = int(MEMORY_SHARE * avail / (cfg.top_k * p.num_gpus * BUILD_BYTES_PER_PAIR))
        raise ValueError(
            f"tokens_per_gpu={tokens_per_gpu}: {p.num_gpus} GPUs x {tokens_per_gpu} tokens x top-{cfg.top_k} = "
            f"{est['pairs']:.3g} token-expert pairs need about {est['bytes'] / 1e9:,.0f} GB to build and this "
            f"machine has {avail / 1e9:,.0f} GB free; at most about {max(fit, 1):,} tokens per GPU fit")
    if est["seconds"] > LONG_RUN_S:
        notes.append(f"a large workload: {est['pairs']:,} token-expert pairs, about {est['seconds']:,.0f} s and "
                     f"{est['bytes'] / 1e9:.2g} GB to build on a 2-core machine; progress follows")
    return notes


@dataclass
class SimResult:
    """What one simulated layer took.  Times in microseconds, bytes in bytes."""

    inputs: dict
    layer_time_us: float
    breakdown_us: dict
    analytic_us: float
    imbalance: dict
    per_gpu: dict  # name -> list of G numbers
    per_link: list  # [{src, dst, bytes, utilization}]
    totals: dict
    stats: dict
    verdict: dict = field(default_factory=dict)  # ``verdict.verdict``: what bounds the layer
    rounds: dict = field(default_factory=dict)  # ``rounds.round_terms``: the split of the last GPU's time, per round
    _spans: list = field(default_factory=list, repr=False)
    _samples: list = field(default_factory=list, repr=False)
    _link_frac: dict = field(default_factory=dict, repr=False)

    def to_dict(self, *, links: bool = True) -> dict:
        d = {k: getattr(self, k) for k in ("inputs", "layer_time_us", "breakdown_us", "analytic_us",
                                            "imbalance", "totals", "per_gpu", "stats")}
        d["additive_breakdown_keys"] = list(ADDITIVE)
        d["overlapping_breakdown_keys"] = [k for k in self.breakdown_us if k not in ADDITIVE]
        d["verdict"] = self.verdict
        d["rounds"] = self.rounds
        if links:
            d["per_link"] = self.per_link
        return d

    def to_json(self, *, links: bool = True, indent: int | None = 2) -> str:
        """Strict JSON: a non-finite number is written as null, never as Infinity or NaN."""
        return json.dumps(_plain(self.to_dict(links=links)), indent=indent, allow_nan=False)

    def write_trace(self, path: str | Path) -> Path:
        """A Chrome-trace / Perfetto JSON timeline (open in ui.perfetto.dev)."""
        from .trace import chrome_trace

        path = Path(path)
        path.write_text(json.dumps(chrome_trace(self)))
        return path


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return round(float(x), 6) if np.isfinite(x) else None
    return x


# ---------------------------------------------------------------------------- work from a workload
@dataclass(frozen=True)
class Options:
    schedule: str
    comm_sms: int
    weight_dtype: str
    dispatch_dtype: str
    include_shared: bool = True
    comm_work: tuple = ()
    dispatch_mode: str = "pull"
    combine_mode: str = "push"


def simulate_workload(workload: Workload, system: str | Path | Profile, *, schedule: str = "fused",
                      comm_sms: int | None = None, dtype: str = "bf16", weight_dtype: str | None = None,
                      dispatch_dtype: str | None = None, include_shared: bool = True,
                      seed: int | None = None, comm_work: tuple | None = None,
                      resolution: float = RESOLUTION, dispatch_mode: str = "pull",
                      combine_mode: str = "push") -> SimResult:
    """Run the event model and the analytic bound on a built workload.

    ``comm_work``: what communication SMs do besides copying (``schedules.COMM_WORK``; default:
    quantize when rows are pulled as fp8); ``resolution``: events closer than this fraction of the
    analytic bound are handled together, up to that late (0: exact, slower on a full rack);
    ``dispatch_mode``, ``combine_mode``: ``"pull"`` or ``"push"`` (``schedules.MODES``)."""
    t_start = time.perf_counter()
    p = load_profile(system)
    if p.num_gpus != workload.num_gpus:
        raise ValueError(f"workload is for {workload.num_gpus} GPUs, system {p.name!r} has {p.num_gpus}")
    cfg = workload.config
    o = Options(
        schedule=normalize_schedule(schedule),
        comm_sms=check_comm_sms(comm_sms, p),
        weight_dtype=normalize_dtype(weight_dtype or dtype),
        dispatch_dtype=normalize_dtype(dispatch_dtype or dtype),
        include_shared=include_shared,
        comm_work=default_comm_work(dispatch_dtype or dtype) if comm_work is None else check_comm_work(comm_work),
        dispatch_mode=dispatch_mode, combine_mode=combine_mode,
    )
    work, acc = build_layer_work(workload, p, schedule=o.schedule, comm_sms=o.comm_sms, weight_dtype=o.weight_dtype,
                                 dispatch_dtype=o.dispatch_dtype, include_shared=o.include_shared,
                                 comm_work=o.comm_work, dispatch_mode=o.dispatch_mode, combine_mode=o.combine_mode)
    G = p.num_gpus
    dispatch_bytes, combine_bytes = work.dispatch_bytes(), work.combine_bytes()
    comp_lb = compute_roofline_s(
        workload.rows_slot, workload.placement.slot_rank, workload.tokens_per_gpu if o.include_shared else 0, G,
        hidden=cfg.hidden_size, width=cfg.intermediate_size, shared_width=cfg.shared_intermediate_size,
        profile=p, weight_dtype=o.weight_dtype, act_dtype=o.dispatch_dtype)
    est: Estimate = estimate(o.schedule, compute_s=comp_lb, dispatch_bytes=dispatch_bytes,
                             combine_bytes=combine_bytes, profile=p, copy_bytes_per_s=acc["copy_bytes_per_s"],
                             work=work)
    caps = Capacities(p.port_bytes_per_s, acc["copy_bytes_per_s"], p.hbm_effective_bytes_per_s)
    t_sim = time.perf_counter()
    log, fabric, _ = run_schedule(o.schedule, work, caps, p.link_latency_s, resolution * est.time_s)
    cap = fabric.cap
    t_sim = time.perf_counter() - t_sim

    layer_s = float(log.end_s.max())
    busy = log.compute_busy_s
    b = gpu_bytes(dispatch_bytes, combine_bytes)

    def phase_span(track: str) -> float:
        spans = [s for s in log.spans if s.track == track]
        if not spans:
            return 0.0
        per = {}
        for s in spans:
            lo, hi = per.get(s.gpu, (s.start_s, s.end_s))
            per[s.gpu] = (min(lo, s.start_s), max(hi, s.end_s))
        return max(hi - lo for lo, hi in per.values())

    breakdown = {
        "dispatch": phase_span("dispatch") * 1e6,
        "expert_compute": float(busy.mean()) * 1e6,
        "combine": phase_span("combine") * 1e6,
        "exposed_communication": (layer_s - float(busy.max())) * 1e6,
        "load_imbalance_wait": float(busy.max() - busy.mean()) * 1e6,
    }
    R = fabric.resource_bytes
    span_s = max(layer_s, 1e-30)
    per_gpu = {
        "end_us": log.end_s * 1e6,
        "compute_busy_us": busy * 1e6,
        "rows": acc["rows"],
        "flops": acc["flops"],
        "hbm_bytes": acc["hbm_bytes"],
        "dispatch_sent_bytes": b["dispatch_sent"], "dispatch_recv_bytes": b["dispatch_recv"],
        "combine_sent_bytes": b["combine_sent"], "combine_recv_bytes": b["combine_recv"],
        "nvlink_sent_bytes": R[:G], "nvlink_recv_bytes": R[G:2 * G],
        "send_port_utilization": R[:G] / (cap[:G] * span_s),
        "recv_port_utilization": R[G:2 * G] / (cap[G:2 * G] * span_s),
        "copy_sm_utilization": R[2 * G:3 * G] / (cap[2 * G:3 * G] * span_s),
        "hbm_utilization": R[3 * G:4 * G] / (cap[3 * G:4 * G] * span_s),
    }
    total_bytes = (dispatch_bytes.sum(axis=1) + combine_bytes.sum(axis=1).T)  # [src, dst]
    lb, link_bw, chip_frac = uniform_link_bytes(p, total_bytes)
    per_link = []
    for (u, v), nbytes in lb.items():
        bw = link_bw[(u, v)] * p.payload_efficiency
        per_link.append({"src": f"{u[0]}{u[1]}", "dst": f"{v[0]}{v[1]}", "bytes": nbytes,
                         "utilization": nbytes / (bw * span_s)})
    T = workload.tokens_per_gpu * G
    inputs = {
        "model": cfg.name, "system": p.name, "num_gpus": G, "tokens_per_gpu": workload.tokens_per_gpu,
        "routing": workload.routing, "placement": workload.placement.policy,
        "num_slots": workload.placement.num_slots, "schedule": o.schedule, "comm_sms": acc["comm_sms"],
        "compute_sms": acc["compute_sms"], "comm_work": list(o.comm_work),
        "minibatch": workload.minibatch if work.num_minibatches > 1 or G > 1 else workload.tokens_per_gpu,
        "num_minibatches": work.num_minibatches, **round_rows(workload),
        "dispatch_mode": o.dispatch_mode, "combine_mode": o.combine_mode,
        "weight_dtype": o.weight_dtype, "dispatch_dtype": o.dispatch_dtype, "combine_dtype": "bf16",
        "include_shared": o.include_shared, "seed": seed,
    }
    totals = {
        "tokens": T, "pairs": int(workload.topk_idx.size), "pairs_computed": int(acc["rows"].sum()),
        "nvlink_bytes_sent": float(R[:G].sum()), "nvlink_bytes_received": float(R[G:2 * G].sum()),
        "flops": float(acc["flops"].sum()),
        "busiest_gpu_flops": float(acc["flops"].max()),
        "analytic_busiest_gpu": est.busiest_gpu,
        "analytic_compute_us": float(est.compute_s.max() * 1e6), "analytic_comm_us": float(est.comm_s.max() * 1e6),
    }
    frac = {f"{c[0]}{c[1]}": f for c, f in chip_frac.items()}
    stats = {"flows": int(fabric.total.size) if hasattr(fabric, "total") else 0,
             "rate_recomputes": fabric.recomputes, "event_model_s": t_sim,
             "total_s": time.perf_counter() - t_start}
    port_u = float(max(per_gpu["send_port_utilization"].max(), per_gpu["recv_port_utilization"].max()))
    hbm_s = acc["hbm_bytes"] / p.hbm_effective_bytes_per_s
    v = verdict({**est.terms, "compute": busy, "hbm": hbm_s, "fill": first_round_wait_s(log.spans, work) + busy},
                layer_s=layer_s, busy_s=busy, port_utilization=port_u,
                copy_utilization=float(per_gpu["copy_sm_utilization"].max()) if G > 1 else None)
    rows_mb = workload.rows_slot_mb
    if rows_mb.shape[1] != work.num_minibatches:  # one GPU runs all its tokens as one round
        rows_mb = rows_mb.sum(axis=1, keepdims=True)
    rounds = round_terms(log.spans, log.end_s, rows_mb, workload.placement.slot_rank, cfg, p,
                         compute_sms=acc["compute_sms"], signal_s=work.dispatch_signal_s + work.combine_signal_s)
    return SimResult(inputs=inputs, layer_time_us=layer_s * 1e6, breakdown_us=breakdown, analytic_us=est.time_us,
                     imbalance=workload.imbalance(), per_gpu=per_gpu, per_link=per_link, totals=totals, stats=stats,
                     verdict=v, rounds=rounds, _spans=log.spans, _samples=fabric.samples, _link_frac=frac)


def first_round_wait_s(spans, work) -> np.ndarray:
    """(G,) how long each GPU's compute SMs waited, after the fixed start and the shared expert, for
    the rows of their first routed job (the first round's fill; 0 for a GPU with no routed job)."""
    G = work.num_gpus
    ready = np.asarray(work.start_s, np.float64).copy()
    first = np.full(G, np.inf)
    for sp in spans:
        if sp.track != "compute":
            continue
        if sp.name == "shared expert":
            ready[sp.gpu] = max(ready[sp.gpu], sp.end_s)
        elif sp.name.startswith(("slot", "grouped GEMMs")):
            first[sp.gpu] = min(first[sp.gpu], sp.start_s)
    return np.where(np.isfinite(first), np.maximum(first - ready, 0.0), 0.0)


def resolve_system(system: str | Path | Profile, overrides: dict | None = None) -> Profile:
    p = load_profile(system)
    return override(p, **overrides) if overrides else p


def simulate(config: str | Path | MoEConfig = "deepseek-v3", system: str | Path | Profile = "gb200-nvl72",
             tokens_per_gpu: int = 4096, *, routing: str = "skewed", placement: str = "contiguous",
             schedule: str = "fused", comm_sms: int | None = None, minibatch: int | None = None,
             dtype: str = "bf16", weight_dtype: str | None = None, dispatch_dtype: str | None = None,
             seed: int = 0, num_slots: int | None = None, include_shared: bool = True,
             overrides: dict | None = None, analytic_only: bool = False,
             comm_work: tuple | None = None, log=None, minibatch_rows: int | None = None,
             dispatch_mode: str = "pull", combine_mode: str = "push") -> SimResult:
    """Simulate one MoE layer.  ``config``: a preset name, config.json path or MoEConfig;
    ``system``: a profile name, profile JSON path or Profile; ``overrides``: ``hardware.override`` fields.
    ``analytic_only``: skip the event model; ``layer_time_us`` is then the analytic bound.
    ``minibatch``: tokens each GPU sends per pipelined round; or ``minibatch_rows``: the rows each
    GPU receives per round, as Mixture-of-Kittens counts its minibatch (``tokens_for_rows``);
    ``dispatch_mode``, ``combine_mode``: ``"pull"`` or ``"push"`` (default as Mixture-of-Kittens).

    Every argument is checked before any work (``check_request``: ValueError naming the value).
    ``log(line)``, if given, receives notes (a clamped default skew, implausible profile numbers,
    the size of a long build) and, for long builds, progress; the notes also land in
    ``inputs["notes"]``.
    """
    cfg = config if isinstance(config, MoEConfig) else MoEConfig.load(config)
    p = resolve_system(system, overrides)
    notes = check_request(cfg, p, tokens_per_gpu, routing=routing, placement=placement, comm_sms=comm_sms,
                          minibatch=minibatch, seed=seed, num_slots=num_slots, comm_work=comm_work)
    long_run = any(n.startswith("a large workload") for n in notes)
    for n in notes:
        if log:
            log(n)
    if minibatch is not None and minibatch_rows is not None:
        raise ValueError("give the minibatch in tokens (minibatch) or in rows received (minibatch_rows), not both")
    if minibatch_rows is not None:
        minibatch = tokens_for_rows(minibatch_rows, cfg, tokens_per_gpu)
    mb = default_minibatch(int(tokens_per_gpu), p) if minibatch is None else minibatch
    t0 = time.perf_counter()
    w = build_workload(cfg, p.num_gpus, tokens_per_gpu, routing, placement, minibatch=mb, seed=seed,
                       num_slots=num_slots, num_nodes=p.num_nodes, progress=log if long_run else None)
    t_work = time.perf_counter() - t0
    if long_run and log:
        log(f"workload built in {t_work:,.1f} s; {'analytic bound' if analytic_only else 'event model'} next")
    if analytic_only:
        r = analytic_result(w, p, schedule=schedule, comm_sms=comm_sms, dtype=dtype, weight_dtype=weight_dtype,
                            dispatch_dtype=dispatch_dtype, include_shared=include_shared, seed=seed,
                            workload_s=t_work, comm_work=comm_work, dispatch_mode=dispatch_mode,
                            combine_mode=combine_mode)
    else:
        r = simulate_workload(w, p, schedule=schedule, comm_sms=comm_sms, dtype=dtype, weight_dtype=weight_dtype,
                              dispatch_dtype=dispatch_dtype, include_shared=include_shared, seed=seed,
                              comm_work=comm_work, dispatch_mode=dispatch_mode, combine_mode=combine_mode)
        r.stats["workload_s"] = t_work
    if notes:
        r.inputs["notes"] = notes
    return r


def analytic_result(workload: Workload, system: str | Path | Profile, *, schedule: str = "fused",
                    comm_sms: int | None = None, dtype: str = "bf16", weight_dtype: str | None = None,
                    dispatch_dtype: str | None = None, include_shared: bool = True, seed: int | None = None,
                    workload_s: float = 0.0, comm_work: tuple | None = None, dispatch_mode: str = "pull",
                    combine_mode: str = "push") -> SimResult:
    """A ``SimResult`` from the analytic bound alone (milliseconds on NVL72): for quick sweeps.

    ``layer_time_us`` = ``analytic_us``; the breakdown splits it the same way as the event model's
    (mean roofline compute + the busiest GPU's extra + the rest); ``dispatch`` and ``combine`` are
    each phase's own bound (``analytic.phase_bounds_s``: the busiest GPU's bytes at its port or
    copy rate, plus latency), not first-to-last spans; per-link data are left empty.
    """
    from .analytic import estimate_workload, phase_bounds_s, rack_terms

    t0 = time.perf_counter()
    p = load_profile(system)
    comm = check_comm_sms(comm_sms, p)
    ad = normalize_dtype(dispatch_dtype or dtype)
    terms = rack_terms(p, workload.config, workload.tokens_per_gpu, comm_sms=comm, dispatch_dtype=ad,
                       comm_work=comm_work)
    e = estimate_workload(workload, p, schedule=schedule, comm_sms=comm, dtype=dtype, weight_dtype=weight_dtype,
                          dispatch_dtype=dispatch_dtype, include_shared=include_shared, comm_work=comm_work,
                          dispatch_mode=dispatch_mode, combine_mode=combine_mode)
    c = e.compute_s
    b = gpu_bytes(workload.traffic_mb, workload.traffic_mb)
    t = e.time_s
    H = workload.config.hidden_size
    dis_s, com_s = phase_bounds_s(normalize_schedule(schedule), workload.traffic_mb * row_bytes(H, ad),
                                  workload.traffic_mb * row_bytes(H, "bf16"), p, terms["copy_bytes_per_s"],
                                  terms["copy_coefs"])
    breakdown = {"dispatch": float(dis_s.max()) * 1e6, "expert_compute": float(c.mean()) * 1e6,
                 "combine": float(com_s.max()) * 1e6,
                 "exposed_communication": (t - float(c.max())) * 1e6, "load_imbalance_wait": float(c.max() - c.mean()) * 1e6}
    inputs = {"model": workload.config.name, "system": p.name, "num_gpus": p.num_gpus,
              "tokens_per_gpu": workload.tokens_per_gpu, "routing": workload.routing,
              "placement": workload.placement.policy, "num_slots": workload.placement.num_slots,
              "schedule": normalize_schedule(schedule), "comm_sms": comm,
              "minibatch": workload.minibatch, "num_minibatches": workload.num_minibatches, **round_rows(workload),
              "dispatch_mode": dispatch_mode, "combine_mode": combine_mode,
              "weight_dtype": normalize_dtype(weight_dtype or dtype), "dispatch_dtype": normalize_dtype(dispatch_dtype or dtype),
              "combine_dtype": "bf16", "include_shared": include_shared, "seed": seed, "analytic_only": True}
    per_gpu = {"compute_roofline_us": c * 1e6, "comm_bound_us": e.comm_s * 1e6, "rows": workload.gpu_load(),
               "dispatch_sent_tokens": b["dispatch_sent"], "dispatch_recv_tokens": b["dispatch_recv"]}
    return SimResult(inputs=inputs, layer_time_us=e.time_us, breakdown_us=breakdown, analytic_us=e.time_us,
                     imbalance=workload.imbalance(), per_gpu=per_gpu, per_link=[], verdict=verdict(e.terms, layer_s=t),
                     totals={"tokens": workload.tokens_per_gpu * p.num_gpus, "pairs": int(workload.topk_idx.size)},
                     stats={"workload_s": workload_s, "total_s": time.perf_counter() - t0, "analytic_only": True})


def simulate_single_gpu_kernel(rows_per_expert, config: str | MoEConfig, system: str | Path | Profile = "h200", *,
                               dtype: str = "bf16", num_tokens: int | None = None, include_shared: bool = False,
                               launches: int = 2, num_sms: int | None = None) -> dict:
    """Predict one GPU's expert work from explicit rows per expert (E,) with the simulator's own tile model.

    This is the idealized megakernel GEMM the rack model uses; to predict the launches the Triton
    kernels really make, give their launch plan to ``cost.predict_launch_plan`` (what
    ``megamoe validate`` does). Here: the
    routed experts' gate/up and down grouped GEMMs on all SMs (or ``num_sms``), plus ``launches``
    kernel launches and, if asked, the shared expert on ``num_tokens`` rows. Returns times in us and
    the FLOPs and HBM bytes the model counted.
    """
    cfg = config if isinstance(config, MoEConfig) else MoEConfig.load(config)
    p = load_profile(system)
    rows = np.asarray(rows_per_expert, dtype=np.int64)
    if rows.ndim != 1 or (rows < 0).any():
        raise ValueError(f"rows_per_expert must be a 1-D array of counts >= 0, got shape {list(rows.shape)}")
    dt = normalize_dtype(dtype)
    kw = dict(profile=p, num_sms=num_sms or p.num_sms, weight_dtype=dt, act_dtype=dt)
    c = ffn_cost(rows, cfg.hidden_size, cfg.intermediate_size, **kw)
    if include_shared and cfg.num_shared_experts:
        if not num_tokens:
            raise ValueError("include_shared needs num_tokens")
        c = c + ffn_cost([num_tokens], cfg.hidden_size, cfg.shared_intermediate_size, **kw)
    from .cost import ffn_roofline_s

    roof = ffn_roofline_s(rows, cfg.hidden_size, cfg.intermediate_size, profile=p, weight_dtype=dt, act_dtype=dt)
    return {"time_us": (c.time_s + launches * p.kernel_launch_s) * 1e6, "compute_us": c.compute_s * 1e6,
            "hbm_us": c.hbm_s * 1e6, "roofline_us": roof * 1e6, "flops": c.flops, "padded_flops": c.padded_flops,
            "hbm_bytes": c.hbm_bytes, "tiles": c.tiles, "system": p.name}
