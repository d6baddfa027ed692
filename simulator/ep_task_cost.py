"""The fused expert-parallel launch's task plan to seconds on one GPU of a multi-GPU host.

Shape legend: n tasks of one rank's plan (pull / gemm1 / gemm2 / push, in ticket order), R ranks,
P programs of the persistent launch, S SMs, Pres resident programs (min(P, S x occupancy(num_warps))),
m link copies running at once in one direction (pulls: this GPU's receive side; pushes: its send side),
T_r tokens of rank r.

``reference.ep_tasks.plan_fused_ep`` lists one rank's fused launch (kernels/ep_fused.py runs it as it
is); this module prices the same tasks and schedules them as ``simulator.task_cost`` schedules the
single-GPU megakernel's: the plan is handed to ``task_cost.task_costs`` in that module's plan format,
so the GEMM tiles get its roofline term for term, the copies get a link term added in series, and
``task_cost.schedule_costs`` (its list scheduler) places them. Nothing is priced twice here.

Per task (``ep_task_costs``, vectorized; every rate from ``cost`` / ``hardware``):

    gemm1, gemm2  task_cost's GEMM tile as it is: gemm1 is the megakernel's gated "gemm1" kind (tile
                  BM x 2 BN1 over depth H), gemm2 its "gemm2" kind (BM x BN2 over I); compute =
                  flops / (mma_rate_per_sm(tile) / programs per SM) plus the task's dependent round
                  trips; memory = weight slice + rows read + rows written
                  (less L2 hits: weight slices keyed by (slot, GEMM, column tile), rows by (GEMM, row
                  block)) at the HBM stream rate per program (hbm_stream_rate(Pres) / Pres), corrected
                  for the programs busy when the task starts; duration = max(compute, memory)
    pull, push    hbm:  in_bytes + out_bytes through task_costs' same memory term (a copy is a task
                        that moves bytes and computes nothing): the local rows read / written
                  link: where link_bytes > 0 only, link_latency_s + link_bytes / r(m) with
                        r(m) = comm_copy_bytes_per_s(min(m, S)) / m: the GPU's NVLink port in one
                        direction (links_per_gpu x per-link bandwidth x payload_efficiency,
                        Profile.port_bytes_per_s) shared by the m programs copying that way at once,
                        each program at most the per-SM copy rate sm.copy_bytes_per_s (the rack
                        model's soft minimum of the two, hardware.comm_sm_curve)
                  duration = hbm + link (in series, task_costs' ``pre_s`` slot: a copy program's
                  loads and stores share one loop, so the sum is the conservative reading)
    every task    + task_overhead_s + ticket_s (task_cost's fixed cost per task)

m, the copies sharing the port: first min(link copies of the kind, Pres) (all of them at once, as
the pulls are: they are the first tickets), then STREAM_SHARE_PASSES times the mean of r(m(t)) over
each copy's lifetime on the previous schedule (``lifetime_h`` over the copies of its direction),
damped by STREAM_SHARE_STEP.

Schedule (``predict_fused_ep``): ``task_cost.schedule_costs``: the tickets in order over the Pres
resident programs (default P = S x occupancy(num_warps), task_cost's); a task starts when its
program is free and every (counter, target) it waits on is reached (the end of the target-th
signalling task) plus one flag handoff (kernel_model.flag_handoff_s; none when that task ran on the
same program); the launch cost (kernel_model.launch_gap_s + graph_fixed_s) is added once.

Assumptions (each a way the prediction can be wrong):
  * the peers' side of a copy is not modelled: each pull reads a peer's send port and HBM, each push
    writes a peer's receive port, assumed not to be the bottleneck (symmetric traffic: every rank
    pulls and pushes about as much as it serves); ``predict_ep_layer`` takes the slowest rank's view
  * a copy moves contiguous rows (one copy per peer chunk), so the rack model's per-row message cost
    (comm.message_s) is not charged; copies of this rank's own rows (peer step 0) use no link and
    no copy-rate cap, only HBM
  * the copies and the GEMM tiles share HBM only through task_cost's busy-programs correction; the
    port is shared only among copies of one direction
  * sm.copy_bytes_per_s is an assumption of the profile (a rack fit carried over to Hopper): where
    few programs copy, the pulls' and pushes' time is inversely proportional to it

What the plan decides, not the model: a gemm1 tile waits for every pull of its row block's peer steps,
a push to peer step q for every gemm2 tile over a pair of q's rows (reference/ep_tasks.py), and a
copy is one task on one program however many rows it moves (plan_pull's max_rows cuts them).

``predict_ep_layer``: the layer around R ranks' launches (the kernels before and after them, its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..reference.ep import PullSchedule
from ..reference.ep_tasks import EP_KINDS, GEMM1, GEMM2, PULL, PUSH, FusedEPPlan
from ..reference.tiles import KINDS
from .hardware import Profile
from .launch_cost import resolve_profile
from .rates import _km, launch_read_s, occupancy, transfer_s
from .task_cost import schedule_costs, task_costs

#: list-scheduling passes after the first that move each copy's link rate to its lifetime's mean
STREAM_SHARE_PASSES = 4
#: the weight of each pass's lifetime rate against the rate the pass before priced at (damping)
STREAM_SHARE_STEP = 0.5

#: the kind list of the plan handed to ``task_costs``: the megakernel's (its "gemm1" / "gemm2" are
#: what it prices as GEMM tiles; its other kinds must be named even with no task), then the copies
COST_KINDS = tuple(KINDS) + ("pull", "push")
#: EP_KINDS index -> COST_KINDS index
_TO_COST = np.array([COST_KINDS.index(k) for k in EP_KINDS], np.int64)


def lifetime_h(start: np.ndarray, end: np.ndarray, h_curves: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """Each task's busy-programs correction over its whole lifetime on a timeline (start, end (n,) s):
    1 / the time average over [start_i, end_i] of 1 / h[curve_i, n(t) - 1], n(t) the tasks executing
    at t (started and not ended: a program waiting on a counter reads nothing), h_curves (C, R) as
    ``task_cost.task_costs`` gives them. 1 / h is a program's share of the read rate (relative to every resident
    program streaming), so its time average is the rate the task's bytes progress at while the
    programs around it start and stop. -> (n,)."""
    n = start.size
    if n == 0:
        return np.zeros(0)
    R = h_curves.shape[1]
    t = np.unique(np.concatenate([start, end]))
    d = np.zeros(t.size)
    np.add.at(d, np.searchsorted(t, start), 1.0)
    np.add.at(d, np.searchsorted(t, end), -1.0)
    busy = np.clip(np.cumsum(d)[:-1], 1, R).astype(np.int64)  # tasks executing on [t_k, t_k+1)
    inv = 1.0 / np.maximum(h_curves, 1e-30)  # (C, R): a program's share of the rate
    acc = np.concatenate([np.zeros((inv.shape[0], 1)), np.cumsum(inv[:, busy - 1] * np.diff(t), axis=1)], axis=1)
    c = np.asarray(curve, dtype=np.int64)
    lo, hi = np.searchsorted(t, start), np.searchsorted(t, end)
    span = end - start
    mean = np.where(span > 0, (acc[c, hi] - acc[c, lo]) / np.where(span > 0, span, 1.0), inv[c, 0])
    return 1.0 / mean



def _check_plan(plan) -> FusedEPPlan:
    if not isinstance(plan, FusedEPPlan):
        raise ValueError(f"plan must be a reference.ep_tasks.FusedEPPlan (plan_fused_ep), got {type(plan).__name__}")
    return plan


def _check_count(name: str, v, default: int | None = None) -> int:
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def cost_plan(plan: FusedEPPlan, num_programs: int) -> dict:
    """The plan in ``task_cost``'s plan format (``task_cost._plan_arrays`` reads it): kinds COST_KINDS,
    the GEMM tasks' expert = their local slot, block = their row block, tile and depth as the
    megakernel's GEMM tiles, weight_id per (slot, GEMM, column tile); the copies carry no tile."""
    plan = _check_plan(plan)
    n = plan.num_tasks
    gemm = (plan.kind == GEMM1) | (plan.kind == GEMM2)
    g1, g2 = plan.kind == GEMM1, plan.kind == GEMM2
    expert = np.full(n, -1, np.int64)
    expert[gemm] = plan.block_slot[plan.arg[gemm]]
    tiles = max(plan.n1, plan.n2)
    return {
        "kinds": list(COST_KINDS), "tiles": {"router": {}}, "num_programs": int(num_programs), "num_tokens": 0,
        "kind": _TO_COST[plan.kind], "expert": expert, "block": np.where(gemm, plan.arg, -1),
        "rows": plan.rows, "tile_m": np.where(gemm, plan.block_m, 1),
        "tile_n": np.select([g1, g2], [2 * plan.block_n1, plan.block_n2], 1),
        "depth": np.select([g1, g2], [plan.hidden_size, plan.intermediate_size], 1),
        "weight_bytes": plan.weight_bytes, "in_bytes": plan.in_bytes, "out_bytes": plan.out_bytes,
        "flops": plan.flops, "weight_id": np.where(plan.weight_id >= 0, plan.weight_id * tiles + plan.tile, -1),
        "signal_ptr": plan.signal_ptr, "signal_counter": plan.signal_counter, "wait_ptr": plan.wait_ptr,
        "wait_counter": plan.wait_counter, "wait_target": plan.wait_target, "counter_target": plan.counter_target,
        "counts": plan.pair_counts.sum(axis=0),
    }


def link_rate(profile: Profile, copying) -> np.ndarray:
    """Bytes/s ONE program moves over NVLink while ``copying`` programs (arrays broadcast, >= 1) copy in
    the same direction: the port shared among them, each at most the per-SM copy rate
    (Profile.comm_copy_bytes_per_s of the SMs they occupy, one program per SM while they fit)."""
    m = np.maximum(np.asarray(copying, dtype=np.float64), 1.0)
    return np.asarray(profile.comm_copy_bytes_per_s(np.minimum(m, profile.num_sms)), dtype=np.float64) / m


def _link_s(profile: Profile, link_bytes: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """(n,) latency + bytes / rate of each copy with link bytes (``cost.transfer_s``), 0 elsewhere."""
    return np.array([transfer_s(float(b), float(r), profile.link_latency_s) for b, r in zip(link_bytes, rate)])


def ep_task_costs(plan, profile: Profile | str = "hgx-h200", *, num_programs: int | None = None, num_warps: int = 4,
                  dtype: str = "bf16", weight_loads: str = "pointer") -> dict:
    """Per-task cost terms of one rank's fused launch (module docstring), arrays of n in ticket order.

    Returns {"kind" (EP_KINDS codes), "kinds" (EP_KINDS), "compute_s", "hbm_s" (the memory term with
    every resident program streaming; the schedule corrects it for the programs busy), "link_s" (at
    ``copying`` programs sharing the port), "link_rate" (bytes/s per program), "copying" (m),
    "link_bytes", "fixed_s", "programs", "resident", "costs" (``task_costs``' dict of the plan;
    ``predict_fused_ep`` schedules it with link_s added to its ``pre_s``)}.
    """
    plan = _check_plan(plan)
    p = resolve_profile(profile)
    warps = _check_count("num_warps", num_warps)
    P = _check_count("num_programs", num_programs, p.num_sms * occupancy(p, warps))
    c = task_costs(cost_plan(plan, P), p, num_programs=P, num_warps=warps, dtype=dtype, weight_loads=weight_loads)
    resident = c["resident"]
    link_bytes = plan.link_bytes.astype(np.float64)
    copying = np.ones(plan.num_tasks)
    for k in (PULL, PUSH):  # every link copy of a direction at once, at most the resident programs
        m = (plan.kind == k) & (link_bytes > 0)
        copying[m] = min(int(m.sum()), resident)
    rate = link_rate(p, copying)
    return {"kind": plan.kind, "kinds": EP_KINDS, "compute_s": c["compute_s"], "hbm_s": c["memory_P_s"],
            "link_s": _link_s(p, link_bytes, rate), "link_rate": rate, "copying": copying, "link_bytes": link_bytes,
            "fixed_s": c["fixed_s"], "programs": P, "resident": resident, "costs": c}


def _share_link(p: Profile, plan: FusedEPPlan, ec: dict, link: np.ndarray, out: dict) -> np.ndarray:
    """``link`` (n,) moved STREAM_SHARE_STEP of the way to each copy's link part at the mean
    per-program rate r(m(t)) over its lifetime on the schedule ``out`` (m(t): the copies of its
    direction executing at t)."""
    link = link.copy()
    r = link_rate(p, np.arange(1, ec["resident"] + 1))
    h = (r[0] / r)[None, :]  # lifetime_h's form: a copy's rate with m copying is r(1) / h[m - 1]
    for k in (PULL, PUSH):
        idx = np.nonzero((plan.kind == k) & (ec["link_bytes"] > 0))[0]
        if idx.size:
            life = lifetime_h(out["_start"][idx], out["_end"][idx], h, np.zeros(idx.size, np.int64))
            link[idx] += STREAM_SHARE_STEP * (_link_s(p, ec["link_bytes"][idx], r[0] / life) - link[idx])
    return link


def predict_fused_ep(plan, profile: Profile | str = "hgx-h200", *, num_programs: int | None = None,
                     num_warps: int = 4, dtype: str = "bf16", weight_loads: str = "pointer",
                     calls_per_graph: int = 1, overrides: dict | None = None) -> dict:
    """The time of one rank's fused EP launch (a ``FusedEPPlan``) on one GPU (module docstring).

    Returns {"time_s" (makespan + launch), "makespan_s", "launch_s", "start_s" / "end_s" ((n,) from the
    first ticket, ticket order), "busy_s" {kind: sum of its durations}, "span_s" {kind: (first start,
    last end)} (kinds with tasks), "critical_path_s" {kind or "handoff": s} (the chain of tasks and
    waits that ends last; sums to the makespan), "link_bytes", "dram_bytes", "programs",
    "resident_programs", "tasks", "rank", "system"}.
    """
    plan = _check_plan(plan)
    p = resolve_profile(profile, overrides)
    ec = ep_task_costs(plan, p, num_programs=num_programs, num_warps=num_warps, dtype=dtype,
                       weight_loads=weight_loads)
    c, link = ec["costs"], ec["link_s"]
    out = schedule_costs({**c, "pre_s": c["pre_s"] + link}, p, calls_per_graph, timeline=True)
    for _ in range(STREAM_SHARE_PASSES if (ec["link_bytes"] > 0).any() else 0):  # the copies that overlap
        link = _share_link(p, plan, ec, link, out)
        out = schedule_costs({**c, "pre_s": c["pre_s"] + link}, p, calls_per_graph, timeline=True)
    start, end = out["_start"], out["_end"]
    dur = end - start
    kind = plan.kind
    busy = {k: float(dur[kind == i].sum()) for i, k in enumerate(EP_KINDS)}
    span = {k: (float(start[kind == i].min()), float(end[kind == i].max())) for i, k in enumerate(EP_KINDS)
            if (kind == i).any()}
    crit = {k: out["critical_path_us"][COST_KINDS[_TO_COST[i]]] * 1e-6 for i, k in enumerate(EP_KINDS)}
    crit["handoff"] = out["critical_path_us"]["handoff"] * 1e-6
    launch_s = (out["launch_us"] + out["fixed_us"]) * 1e-6
    return {"time_s": out["time_us"] * 1e-6, "makespan_s": out["makespan_us"] * 1e-6, "launch_s": launch_s,
            "start_s": start, "end_s": end, "busy_s": busy, "span_s": span, "critical_path_s": crit,
            "link_bytes": float(ec["link_bytes"].sum()), "dram_bytes": out["dram_bytes"], "programs": ec["programs"],
            "resident_programs": ec["resident"], "tasks": plan.num_tasks, "rank": plan.rank, "system": p.name}


def predict_ep_layer(plans: Sequence[FusedEPPlan], pull: PullSchedule, tokens_per_rank,
                     profile: Profile | str = "hgx-h200", *, num_programs: int | None = None,
                     num_warps: int | Sequence[int] = 4, dtype: str = "bf16", weight_loads: str = "pointer",
                     overrides: dict | None = None) -> dict:
    """The routed experts' expert-parallel layer over R ranks, each running its fused launch.

    plans: the R ranks' ``FusedEPPlan`` (rank r at index r) of the one-sided schedule ``pull``
    (``reference.ep.plan_pull``: its send rows and row bytes size the kernels around the launch);
    tokens_per_rank: T_r, an int or R of them; num_warps: one for every rank or one each.

    The layer is the kernels of kernels/ep_symmetric.py's fused step, each rank's in stream order,
    the ranks meeting at the flags (so each phase takes its slowest rank):

        pack      gather rank r's send rows (x, topk_idx, topk_weights, positions): their
                  dispatch bytes read and written (2 x send_rows x dispatch_row_bytes) over HBM
        ready     signal READY: one kernel, one link latency (the release reaches the peers)
        fused     ``predict_fused_ep`` of every rank; the slowest
        landed    signal LANDED (one kernel, one link latency), then wait for every peer's (one kernel)
        combine   the per-token sum: the combine buffer's send_rows partial rows read, T_r rows
                  written (combine_row_bytes each) over HBM

    Each small kernel costs one launch (kernel_model.launch_gap_s, as the fused launch's) plus its bytes
    at ``cost.launch_read_s`` over one program per SM; a single rank has no link latency to pay.
    The router and the layer's start are not included (the caller adds them where a comparison needs
    them). Returns {"time_s", "terms_s" {pack, ready, fused, landed, combine}, "slowest_rank",
    "fused_time_s" (R,), "ranks" (each rank's ``predict_fused_ep`` result), "system"}.
    """
    if not isinstance(pull, PullSchedule):
        raise ValueError(f"pull must be a reference.ep.PullSchedule (plan_pull), got {type(pull).__name__}")
    R = pull.num_ranks
    plans = list(plans) if isinstance(plans, (list, tuple)) else None
    if plans is None or len(plans) != R:
        raise ValueError(f"plans must be a list of the {R} ranks' FusedEPPlan (one per rank of pull), "
                         f"got {'a ' + type(plans).__name__ if plans is None else len(plans)}")
    for r, plan in enumerate(plans):
        _check_plan(plan)
        if plan.rank != r or plan.num_ranks != R:
            raise ValueError(f"plans[{r}] is rank {plan.rank} of {plan.num_ranks}; expected rank {r} of {R}")
    tokens = np.broadcast_to(np.asarray(tokens_per_rank), (R,)) if np.ndim(tokens_per_rank) == 0 else \
        np.asarray(tokens_per_rank)
    if tokens.shape != (R,) or tokens.dtype.kind not in "iu" or (tokens < 0).any():
        raise ValueError(f"tokens_per_rank must be an integer >= 0 or {R} of them, got {tokens_per_rank!r}")
    warps = [num_warps] * R if np.ndim(num_warps) == 0 else list(num_warps)
    if len(warps) != R:
        raise ValueError(f"num_warps must be one integer or {R} of them, got {num_warps!r}")
    p = resolve_profile(profile, overrides)
    ranks = [predict_fused_ep(plan, p, num_programs=num_programs, num_warps=w, dtype=dtype, weight_loads=weight_loads)
             for plan, w in zip(plans, warps)]
    fused = np.array([r["time_s"] for r in ranks])
    launch = _km(p).launch_gap_s
    S = p.num_sms

    def over_hbm(nbytes) -> float:  # one small kernel: a launch and its bytes (max over the ranks)
        return launch + max(launch_read_s(p, float(b), S, S) for b in nbytes)

    flag = launch + (p.link_latency_s if R > 1 else 0.0)
    send = pull.send_rows.astype(np.float64)
    terms = {"pack": over_hbm(2 * send * pull.dispatch_row_bytes), "ready": flag, "fused": float(fused.max()),
             "landed": flag + launch, "combine": over_hbm((send + tokens) * pull.combine_row_bytes)}
    return {"time_s": float(sum(terms.values())), "terms_s": terms, "slowest_rank": int(np.argmax(fused)),
            "fused_time_s": fused, "ranks": ranks, "system": p.name}


__all__ = ["COST_KINDS", "cost_plan", "ep_task_costs", "link_rate", "predict_ep_layer", "predict_fused_ep"]
