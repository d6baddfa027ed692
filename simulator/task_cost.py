"""The persistent megakernel's task plan to seconds on one GPU: per-task costs and list scheduling.

Shape legend: P programs of the persistent kernel, S SMs, R programs resident (min(P, S x o(warps))),
n programs busy, E experts.

A task plan of the persistent megakernel (``predict_task_plan``, ``reference.tiles.TaskPlan``): P
programs take tickets in order (list scheduling over a heap of program-free times); a task starts
when its program is free and every counter it waits on has reached its target (the time the
target-th signalling task ended) plus one flag handoff (none when that task ran on the same program). Its duration is the same roofline per
program: max(flops / (mma / share), DRAM bytes / (hbm_stream(n) / n), serial) + task_overhead + ticket,
with share = P / S programs per SM, n the programs busy when it starts, and DRAM bytes its weight
slice and gathered rows unless the same weight_id (or row block) was read within the last
``l2_resident_fraction x L2`` bytes of weight traffic (an L2 hit).

The terms (``task_costs``, one entry per task, vectorized):

    compute   flops / (mma(tile, rows of its expert) / share), the tile-loop table of its weight loads
              (``MEGAKERNEL_LOADS``), plus its dependent round trips x ticket_s; divided by the
              sustained-clock ratio (``clocks``; ``predict_task_plan`` schedules again)
    memory    DRAM bytes / (stream(R) / R) x h(n), h the busy-programs correction of its read curve
              (``task_read_curves``: the grid's, or the deep readers' by weight depth, and a
              cohort's one-shot rate), and L2-hit bytes at the L2 intake rate by the programs'
              read depth (``depth_rates.l2_intake_rate``) on the grid's curve
    serial    the router and align kinds' dependent load / reduce steps (``SERIAL_KINDS``)
    pre       a GEMM 1 task's own routing or alignment before its K loop (tiles["router"] EACH,
              ALIGN_EACH)
    duration  max(compute, memory, serial) + task_overhead + ticket + pre

``_schedule_tasks`` places them in ticket order on the R resident programs; the plan's time is the
makespan plus the launch gap and the CUDA graph's fixed cost per call.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from ..reference.tiles import TASK_ROUND_TRIPS, scan_block
from .clocks import sustained_scale
from .depth_rates import deep_read_rate, deep_stream_rate, deep_table_covers, l2_intake_rate
from .hardware import Profile, load_profile
from .launch_cost import resolve_profile
from .rates import _km, hbm_rate, hbm_stream_rate, mma_rate_per_sm, occupancy, selection_width, serial_step_s

#: how the megakernel's GEMM tasks load their operands (hardware.GEMM_LOADS), by its weight loads
#: ("pointer": cp.async; "tma": descriptors, config "tma_weights"; rows by pointer either way), in
#: persistent programs that walk the tickets; GEMM 1 tasks with gate and up accumulators, the others one
MEGAKERNEL_LOADS = {"pointer": {"gated": "pointer_persistent_gated", "other": "pointer_persistent"},
                    "tma": {"gated": "tma_persistent_gated", "other": "tma_persistent"}}
#: the megakernel's task kinds with gate and up accumulators
GATED_KINDS = ("gemm1", "shared_gemm1", "expert_slice")
#: the megakernel's GEMM task kinds: their gathered rows are an operand an L2 model can re-hit
GEMM_KINDS = ("gemm1", "gemm2", "shared_gemm1", "shared_gemm2", "expert_slice")

_PLAN_ARRAYS = ("kind", "expert", "block", "rows", "tile_m", "tile_n", "depth", "weight_bytes", "in_bytes",
                "out_bytes", "flops", "weight_id", "signal_ptr", "signal_counter", "wait_ptr", "wait_counter", "wait_target",
                "counter_target", "counts")
#: serial per-task work of the router and align kinds (assumption: one dependent load step per
#: BLOCK_H of the reduction, one row reduction per top-k pass / scanned chunk / scattered slot)
SERIAL_KINDS = ("router_logits", "router_topk", "align_scan", "align_scatter")


def _of_kinds(kind: np.ndarray, kinds: list, names) -> np.ndarray:
    """(n,) bool: the tasks (kind codes into ``kinds``, a plan's list) of a kind in ``names``
    (names the plan does not have match nothing: a stored plan of older kinds)."""
    return np.isin(kind, [kinds.index(k) for k in names if k in kinds])


def _plan_arrays(plan) -> dict:
    if isinstance(plan, dict):
        d = {k: np.asarray(plan[k]) for k in _PLAN_ARRAYS}
        d.update(kinds=list(plan["kinds"]), tiles=plan["tiles"], num_programs=int(plan["num_programs"]),
                 num_tokens=int(plan["num_tokens"]), topk_passes=int(plan.get("topk_passes", 0)))
        return d
    from ..reference.tiles import KINDS

    d = {k: np.asarray(getattr(plan, k)) for k in _PLAN_ARRAYS}
    d.update(kinds=list(KINDS), tiles=plan.tiles, num_programs=int(plan.num_programs),
             num_tokens=int(plan.num_tokens), topk_passes=int(plan.topk_passes))
    return d


def _l2_hits(keys: np.ndarray, stream_bytes: np.ndarray, window: float) -> np.ndarray:
    """(n,) bool: task i's operand with key keys[i] (-1: none) was read by an earlier ticket with
    the same key, fewer than ``window`` bytes of ``stream_bytes`` (in ticket order) ago."""
    n = keys.size
    hit = np.zeros(n, bool)
    valid = keys >= 0
    if not valid.any() or window <= 0:
        return hit
    cum = np.cumsum(stream_bytes)
    idx = np.nonzero(valid)[0]
    order = idx[np.lexsort((idx, keys[idx]))]  # by key, then ticket
    same = keys[order][1:] == keys[order][:-1]
    cur, prev = order[1:][same], order[:-1][same]
    hit[cur] = (cum[cur] - stream_bytes[cur] - cum[prev]) < window
    return hit


def task_read_curves(p: Profile, kind: np.ndarray, kinds: list, resident: int,
                     weight_depth: dict | None = None) -> tuple[np.ndarray, np.ndarray, list]:
    """The HBM rates a task plan's tasks read at: (curve (n,) int, the curve of each task; stream (C, R)
    float, curve c's aggregate bytes/s with 1..R programs busy streaming back to back; one_shot, C
    functions (programs, bytes each) -> aggregate bytes/s of that many programs starting together).
    Curve 0: the grid's (``hbm_stream_rate``, ``hbm_rate``); one more curve per weight depth of the GEMM kinds that the deep table covers (``weight_depth`` {kind: weight
    bytes a program keeps in flight}, ``deep_table_covers``): ``deep_stream_rate`` / ``deep_read_rate``
    at that depth, group 1."""
    R = max(1, int(resident))
    nn = np.arange(1, R + 1, dtype=np.float64)
    curve = np.zeros(kind.size, np.int64)
    stream = [np.asarray(hbm_stream_rate(p, nn), dtype=np.float64)]
    one_shot = [lambda n, b: float(hbm_rate(p, n, b))]
    by_depth: dict = {}
    for k, d in sorted((weight_depth or {}).items()):
        if k not in kinds or k not in GEMM_KINDS or not deep_table_covers(p, d):
            continue
        m = kind == kinds.index(k)
        if not m.any():
            continue
        if d not in by_depth:
            by_depth[d] = len(stream)
            stream.append(np.array([deep_stream_rate(p, x, d, 1) for x in nn]))
            one_shot.append(lambda n, b, d=d: deep_read_rate(p, n, d, 1, b))
        curve[m] = by_depth[d]
    return curve, np.stack(stream), one_shot


def _serial_terms(p: Profile, a: dict, kind: np.ndarray, kinds: list, counts: np.ndarray,
                  resident: int) -> tuple[np.ndarray, np.ndarray]:
    """(serial_s, pre_s) (n,) of a task plan's arrays ``a``: the router and align kinds' dependent load /
    reduce steps (SERIAL_KINDS), and a GEMM 1 task's own routing or alignment before its K loop."""
    n = kind.size
    serial_s = np.zeros(n)
    r = a["tiles"]["router"]
    K = int(counts.sum() // max(a["num_tokens"], 1)) if a["num_tokens"] else 0
    load_s, reduce_s = serial_step_s(p, "load"), serial_step_s(p, "reduce")
    # a top-k selection's passes, over rows of the experts' scores padded to BLOCK_E
    pass_s = serial_step_s(p, "reduce", selection_width(counts.size))
    for k in SERIAL_KINDS:
        m = kind == kinds.index(k)
        if not m.any():
            continue
        if k in ("router_logits", "router_topk"):
            steps = np.ceil(a["depth"][m] / r["BLOCK_H"])
            passes = a["topk_passes"] or K  # the selection's dependent reductions (reference.tiles.topk_passes)
            serial_s[m] = steps * load_s + (passes if k == "router_topk" else 0) * pass_s
        elif k == "align_scan":  # depth: the histogram rows (top-k groups) it scans, scan_block per step
            g = np.maximum(a["depth"][m], 1)
            blk = np.array([scan_block(int(x)) for x in g], dtype=np.float64)
            serial_s[m] = (np.ceil(g / blk) + 2) * reduce_s
        else:
            serial_s[m] = K * reduce_s
    # tiles["router"]["EACH"]: each GEMM 1 task routes the token itself before its K loop (the top-k
    # task's selection passes, in series with the task's streaming, not overlapped with it)
    pre_s = np.zeros(n)
    if a["tiles"]["router"].get("EACH") and "gemm1" in kinds:
        m = kind == kinds.index("gemm1")
        pre_s[m] = (a["topk_passes"] or K) * pass_s
    # tiles["router"]["ALIGN_EACH"]: each GEMM 1 task ranks the routing's pairs and places its block's
    # rows (two reductions) before its K loop; a program's first one also sums the top-k tasks' G
    # histogram rows (the scan's steps), which the program keeps for its later tasks
    if a["tiles"]["router"].get("ALIGN_EACH") and "gemm1" in kinds:
        g1 = np.nonzero(kind == kinds.index("gemm1"))[0]
        G = max(1, int((kind == kinds.index("router_topk")).sum()))
        pre_s[g1] += 2 * reduce_s
        pre_s[g1[:resident]] += (np.ceil(G / scan_block(G)) + 2) * reduce_s
    return serial_s, pre_s


def task_costs(plan, profile: Profile | str = "h200", *, num_programs: int | None = None, num_warps: int = 4,
               dtype: str = "bf16", weight_loads: str = "pointer", read_depth: float = 0.0,
               weight_depth: dict | None = None) -> dict:
    """Per-task cost terms of a task plan (vectorized): compute_s, dram bytes, the HBM rate at P
    programs in flight, serial_s, fixed_s, and the L2 hits. See ``predict_task_plan``."""
    p = load_profile(profile) if not isinstance(profile, Profile) else profile
    km = _km(p)
    a = _plan_arrays(plan)
    kinds = a["kinds"]
    P = int(num_programs or a["num_programs"])
    if P < 1:
        raise ValueError(f"num_programs must be >= 1, got {P}")
    S = p.num_sms
    resident = min(P, S * occupancy(p, num_warps))
    share = max(1.0, resident / S)
    kind = a["kind"].astype(np.int64)
    n = kind.size
    counts = a["counts"].astype(np.int64)
    expert = a["expert"].astype(np.int64)
    rows_e = np.where(expert >= 0, counts[np.clip(expert, 0, max(counts.size - 1, 0))] if counts.size else 1,
                      np.maximum(a["num_tokens"], 1))
    flops = a["flops"].astype(np.float64)
    # the megakernel's GEMM tasks: rows by pointer, weights as ``weight_loads`` says, in persistent programs
    if weight_loads not in MEGAKERNEL_LOADS:
        raise ValueError(f"weight_loads must be one of {sorted(MEGAKERNEL_LOADS)}, got {weight_loads!r}")
    forms = MEGAKERNEL_LOADS[weight_loads]
    gated = _of_kinds(kind, kinds, GATED_KINDS)
    rate = np.empty(n)
    for sel, loads in ((gated, forms["gated"]), (~gated, forms["other"])):
        if sel.any():
            rate[sel] = mma_rate_per_sm(p, np.maximum(a["tile_m"][sel], 1), np.maximum(a["tile_n"][sel], 1),
                                        np.maximum(a["depth"][sel], 1), num_warps, np.maximum(rows_e[sel], 1),
                                        dtype=dtype, loads=loads)
    rate = rate / share
    compute_s = np.where(flops > 0, flops / np.asarray(rate, dtype=np.float64) if n else 0.0, 0.0)
    trips = np.zeros(n)  # the routed GEMM tasks' dependent round trips, in series with their MMA
    for k, r in TASK_ROUND_TRIPS.items():
        if k in kinds:
            trips[kind == kinds.index(k)] = r
    compute_s = compute_s + np.where(flops > 0, trips * km.ticket_s, 0.0)
    window = km.l2_resident_fraction * p.l2_bytes
    wb = a["weight_bytes"].astype(np.float64)
    ib = a["in_bytes"].astype(np.float64)
    w_hit = _l2_hits(a["weight_id"].astype(np.int64), wb, window)
    gemm = _of_kinds(kind, kinds, GEMM_KINDS)
    row_key = np.where(gemm, kind * (1 << 40) + a["block"].astype(np.int64), -1)
    i_hit = _l2_hits(row_key, ib, window)
    dram = np.where(w_hit, 0.0, wb) + np.where(i_hit, 0.0, ib) + a["out_bytes"].astype(np.float64)
    l2 = np.where(w_hit, wb, 0.0) + np.where(i_hit, ib, 0.0)
    # tasks stream back to back inside one launch: the marginal (streaming) rate, not a cold
    # one-shot launch's (hbm_stream_rate)
    curve, stream, one_shot = task_read_curves(p, kind, kinds, resident, weight_depth)
    rate_R = stream[:, -1]  # each curve's rate with every resident program streaming
    mem_P = dram * resident / rate_R[curve]  # one task's memory time, `resident` streaming
    l2_bound = np.zeros(n, bool)  # the task's L2-hit bytes at the L2 rate outlast its DRAM bytes
    mem_l2_P = np.zeros(n)  # its L2-hit bytes' time, `resident` streaming
    if km.l2_bandwidth_bytes_per_s > 0:
        # the programs' bytes in flight (read_depth) read the shared-read table
        mem_l2 = l2 * resident / l2_intake_rate(p, resident, read_depth)
        l2_bound = mem_l2 > mem_P
        mem_l2_P = mem_l2
    serial_s, pre_s = _serial_terms(p, a, kind, kinds, counts, resident)
    # the busy-programs correction of the memory term: mem(n) = max(dram_P x h[curve, n], l2_P x h[0, n])
    # (the L2 part keeps the grid's curve); a cohort's DRAM part at cohort_h(curve, n, its DRAM bytes)
    # instead (``_schedule_tasks``)
    nn = np.arange(1, resident + 1, dtype=np.float64)
    h_curves = (nn / resident) * rate_R[:, None] / stream
    memo: dict = {}

    def cohort_h(c: int, n: int, b: float) -> float:
        key = (c, n, round(b))
        if key not in memo:
            memo[key] = (n / resident) * float(rate_R[c]) / max(one_shot[c](n, max(b, 1.0)), 1e-30)
        return memo[key]
    return {"kind": kind, "kinds": kinds, "compute_s": compute_s, "memory_P_s": np.maximum(mem_P, mem_l2_P),
            "dram_P_s": mem_P, "l2_P_s": mem_l2_P, "serial_s": serial_s,
            "pre_s": pre_s,
            "fixed_s": km.task_overhead_s + km.ticket_s, "dram_bytes": dram, "l2_bytes": l2, "h": h_curves[0],
            "h_curves": h_curves, "curve": curve, "cohort_h": cohort_h,
            "cohort": gemm, "l2_bound": l2_bound,
            "programs": P, "resident": resident, "arrays": a}


def predict_task_plan(plan, profile: Profile | str = "h200", *, num_programs: int | None = None,
                      num_warps: int = 4, dtype: str = "bf16", calls_per_graph: int = 1,
                      overrides: dict | None = None, weight_loads: str = "pointer", calls_before: float = 0.0,
                      read_depth: float = 0.0, weight_depth: dict | None = None) -> dict:
    """The persistent megakernel's time for a task plan (``reference.tiles.TaskPlan`` or its
    ``to_dict()``): list scheduling of its tasks, in ticket order, on P programs (module docstring).

    Returns {"time_us", "makespan_us", "launch_us", "fixed_us", "programs", "resident_programs",
    "tasks", "busy_us": {kind: program-us}, "span_us": {kind: [first start, last end] us from the
    first ticket, as benchmarks/megakernel_trace.py prints a GPU trace}, "critical_path_us": {kind or "handoff": us},
    "bound_tasks": {kind: {"compute", "memory", "serial": tasks}}, "l2_bound_tasks": {kind: tasks of
    its memory-bound ones whose L2-hit bytes at the L2 rate set their memory time}, "dram_bytes", "l2_hit_bytes",
    "system"}. ``busy_us`` sums task durations (program time); the critical path is the chain of
    tasks (and handoffs) that ends last, so its terms sum to the makespan. ``weight_loads``: how
    the GEMM tasks load their weights, "pointer" or "tma" (MEGAKERNEL_LOADS: the tile-loop tables
    read). ``calls_before``: calls run back to back before the timed replay (``clocks.busy_window_s``:
    the tasks' compute times divided by ``sustained_ratio``
    over the window of the makespan as calibrated, then scheduled again; "sustained_ratio" in the result).
    ``read_depth``: bytes of operand tiles a program keeps in flight (its GEMM tasks' pipeline buffers;
    ``l2_intake_rate``; 0: the calibrated reader's). ``weight_depth``:
    {GEMM kind: weight bytes one program keeps in flight in that kind's loop} (read only by
    ``task_read_curves``; a kind left out: the grid's reader).
    """
    p = resolve_profile(profile, overrides)
    c = task_costs(plan, p, num_programs=num_programs, num_warps=num_warps, dtype=dtype, weight_loads=weight_loads,
                   read_depth=read_depth, weight_depth=weight_depth)
    return schedule_costs(c, p, calls_per_graph, calls_before)


def schedule_costs(c: dict, p: Profile, calls_per_graph: int = 1, calls_before: float = 0.0,
                   timeline: bool = False) -> dict:
    """``predict_task_plan``'s result from task costs ``c`` (``task_costs``, or a caller's costs in its
    format, as simulator/ep_task_cost.py gives them): ``_schedule_tasks``, then where the
    profile has the sustained-clock table, the tasks' MMA at the clocks of the busy window, scheduled again.
    ``timeline``: the result also carries "_start" / "_end" / "_h" (``_schedule_tasks``)."""
    out = _schedule_tasks(c, p, calls_per_graph, timeline)
    ratio = sustained_scale(p, out["time_us"] * 1e-6, calls_per_graph, calls_before,
                             float(np.sum(c["arrays"]["flops"], dtype=np.float64)))
    if ratio is not None:  # the tasks' MMA at the clocks of the busy window, scheduled again
        if ratio < 1:
            out = _schedule_tasks({**c, "compute_s": c["compute_s"] / ratio}, p, calls_per_graph, timeline)
        out["sustained_ratio"] = ratio
    return out


def _schedule_tasks(c: dict, p: Profile, calls_per_graph: int, timeline: bool = False) -> dict:
    """``predict_task_plan``'s result from the task costs ``c`` (``task_costs``): list scheduling in
    ticket order on the resident programs. ``timeline``: the result carries "_start" / "_end" (s, (n,)),
    and "_h" (n,), the correction each task's DRAM part was priced at."""
    km = _km(p)
    a = c["arrays"]
    kind = c["kind"]
    n = kind.size
    R = c["resident"]
    comp, ser = c["compute_s"], c["serial_s"]
    h_curves, curve_l = c["h_curves"], c["curve"].tolist()
    fixed = c["fixed_s"]
    handoff = km.flag_handoff_s
    wptr = a["wait_ptr"].astype(np.int64).tolist()
    wc = a["wait_counter"].astype(np.int64).tolist()
    wt = a["wait_target"].astype(np.int64).tolist()
    sptr = a["signal_ptr"].astype(np.int64).tolist()
    sig = a["signal_counter"].astype(np.int64).tolist()
    ncount = int(a["counter_target"].size)
    finishes: list[list] = [[] for _ in range(ncount)]
    reached: dict = {}
    comp_l, dramP_l, l2P_l, ser_l = comp.tolist(), c["dram_P_s"].tolist(), c["l2_P_s"].tolist(), ser.tolist()
    pre_l = c["pre_s"].tolist()
    h_of = h_curves.tolist()  # by curve: the busy-programs correction (task_read_curves)
    cohort_h, in_cohort = c["cohort_h"], c["cohort"].tolist()
    dram_l = c["dram_bytes"].tolist()
    target_l = a["counter_target"].astype(np.int64).tolist()
    cohort_left, cohort_n = 0, 0  # tasks still to place of the cohort being released, its programs reading
    h_used = [0.0] * n  # the busy-programs correction each task's DRAM part was priced at

    def release(j: int):  # the time task j's waits are all met (no handoff), None while one is not yet known
        t = 0.0
        for w in range(wptr[j], wptr[j + 1]):
            key = (wc[w], wt[w])
            got = reached.get(key)
            if got is None:
                fs = finishes[wc[w]]
                if len(fs) < max(wt[w], target_l[wc[w]]):
                    return None  # signals still to come: not known before the tasks between are placed
                got = reached[key] = sorted(fs)[wt[w] - 1] if wt[w] > 0 else (0.0, -1)  # final: all signals in
            t = max(t, got[0])
        return t
    start = [0.0] * n
    end = [0.0] * n
    pred = [-1] * n  # the task whose end decided this one's start (-1: the launch)
    prog = [0] * n  # the program that ran each task
    by_wait = [False] * n
    heap = [(0.0, q, -1) for q in range(R)]  # (free time, program, last task)
    free_sorted = [0.0] * R
    for i in range(n):
        t_free, q, last = heapq.heappop(heap)
        del free_sorted[bisect.bisect_left(free_sorted, t_free)]
        ready, crit = 0.0, -1
        for j in range(wptr[i], wptr[i + 1]):
            key = (wc[j], wt[j])
            got = reached.get(key)
            if got is None:
                fs = finishes[wc[j]]
                if len(fs) < wt[j]:
                    raise ValueError(f"task {i} waits for counter {wc[j]} = {wt[j]} but only {len(fs)} earlier "
                                     "tasks signal it: not a valid ticket order")
                got = sorted(fs)[wt[j] - 1] if wt[j] > 0 else (0.0, -1)
                reached[key] = got
            hand = 0.0 if got[1] < 0 or prog[got[1]] == q else handoff  # own signal: no handoff
            if got[0] + hand > ready:
                ready, crit = got[0] + hand, got[1]
        if ready > t_free:
            s0, pred[i], by_wait[i] = ready, crit, True
        else:
            s0, pred[i] = t_free, last
        busy = R - bisect.bisect_right(free_sorted, s0)  # other programs still working at s0
        h_i = h_of[curve_l[i]][min(busy, R - 1)]  # the DRAM part: its curve, at the programs busy at its start
        h_l2 = h_of[0][min(busy, R - 1)]  # the L2-hit part: the grid's curve, at the programs busy at its start
        if cohort_h is not None and in_cohort[i] and by_wait[i]:
            if cohort_left <= 0:  # a new release: its consecutive tickets freed at the same instant onto idle programs
                t_rel = release(i)
                idle = bisect.bisect_right(free_sorted, t_rel) + 1
                m = 1
                while m < idle and i + m < n and in_cohort[i + m] and release(i + m) == t_rel:
                    m += 1
                cohort_left = m if m >= 2 else 0
                cohort_n = min(R, m + R - idle)  # the cohort and the programs already busy
            if cohort_left > 0:
                cohort_left -= 1
                h_i = cohort_h(curve_l[i], cohort_n, dram_l[i])
        elif cohort_left > 0 and not by_wait[i]:
            cohort_left = 0
        h_used[i] = h_i
        dur = max(comp_l[i], dramP_l[i] * h_i, l2P_l[i] * h_l2, ser_l[i]) + fixed + pre_l[i]
        e = s0 + dur
        start[i], end[i], prog[i] = s0, e, q
        for j in range(sptr[i], sptr[i + 1]):
            finishes[sig[j]].append((e, i))
        heapq.heappush(heap, (e, q, i))
        bisect.insort(free_sorted, e)
    start_a, end_a = np.asarray(start), np.asarray(end)
    out = _summary(c, p, calls_per_graph, start_a, end_a, pred, by_wait)
    if timeline:
        out.update(_start=start_a, _end=end_a, _h=np.asarray(h_used))
    return out


def _summary(c: dict, p: Profile, calls_per_graph: int, start_a: np.ndarray, end_a: np.ndarray, pred: list,
             by_wait: list) -> dict:
    """``predict_task_plan``'s result from a schedule: each task's start and end (s, (n,)), the task whose
    end decided its start (``pred``, -1: the launch) and whether that was a wait (``by_wait``)."""
    km = _km(p)
    kind, kinds = c["kind"], c["kinds"]
    n = kind.size
    comp, memP, ser = c["compute_s"], c["memory_P_s"], c["serial_s"]
    dur_a = end_a - start_a
    busy_us = {k: float(dur_a[kind == j].sum() * 1e6) for j, k in enumerate(kinds)}
    crit_us = {k: 0.0 for k in kinds}
    crit_us["handoff"] = 0.0
    makespan = float(end_a.max()) if n else 0.0
    i = int(np.argmax(end_a)) if n else -1
    while i >= 0:
        crit_us[kinds[kind[i]]] += float(dur_a[i]) * 1e6
        j = pred[i]
        gap = start_a[i] - (end_a[j] if j >= 0 else 0.0)
        if gap > 0:
            crit_us["handoff" if by_wait[i] else kinds[kind[i]]] += float(gap) * 1e6
        i = j
    # the bound at every resident program busy: h = 1 on every curve
    which = np.argmax(np.stack([comp, memP, ser]), axis=0) if n else np.zeros(0, int)
    bound = {k: {b: int(((kind == j) & (which == bi)).sum()) for bi, b in enumerate(("compute", "memory", "serial"))}
             for j, k in enumerate(kinds) if (kind == j).any()}
    l2b = c["l2_bound"] & (which == 1)  # memory-bound tasks whose L2-hit bytes set the memory time
    l2_tasks = {k: int((l2b & (kind == j)).sum()) for j, k in enumerate(kinds) if (l2b & (kind == j)).any()}
    span_us = {k: [float(start_a[kind == j].min() * 1e6), float(end_a[kind == j].max() * 1e6)]
               for j, k in enumerate(kinds) if (kind == j).any()}
    launch_us = km.launch_gap_s * 1e6
    fixed_us = km.graph_fixed_s * 1e6 / max(1, calls_per_graph)
    return {"time_us": makespan * 1e6 + launch_us + fixed_us, "makespan_us": makespan * 1e6, "span_us": span_us,
            "launch_us": launch_us, "fixed_us": fixed_us, "programs": c["programs"], "resident_programs": c["resident"],
            "tasks": n, "busy_us": busy_us, "critical_path_us": crit_us, "bound_tasks": bound,
            "l2_bound_tasks": l2_tasks,
            "dram_bytes": float(c["dram_bytes"].sum()), "l2_hit_bytes": float(c["l2_bytes"].sum()),
            "system": p.name}
