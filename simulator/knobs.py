"""The megakernel's two knobs found for a layer: communication SMs n and the minibatch.

Shape legend: G GPUs, S SMs per GPU, n communication SMs, B rounds (minibatches), P slots.

For every (n, minibatch) of a grid, a bound that costs well under a millisecond a point: per GPU

    start + max(compute(n), HBM(minibatch), copy(n), ports, signalling(minibatch)) + barrier

compute(n) the FLOPs at the best tile rate on the S - n compute SMs; HBM(minibatch) the weights
read once per round in which a slot has rows (once in all if the GPU's touched weights stay in L2,
as the event model does) and the activations; copy, ports and signalling as ``analytic.estimate``;
with completion signalling, fill(n, minibatch): the first round's rows at the port or copy rate and
its signal before the routed experts' work (a round computes once all of its rows are in).
The event model then runs on the few best points by the bound, and the fastest of them wins.
Each point carries the term that binds it.

    r = optimize("deepseek-v3", "gb200-nvl72", 4096)
    r["best"], r["runner_up"], r["curves"]
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from .analytic import estimate, rack_terms
from .cost import normalize_dtype, row_bytes
from .gemm_cost import ffn_roofline_parts
from .hardware import Profile
from .rates import hbm_peak
from .workload import MAX_MINIBATCHES, Workload, slot_traffic

KNOBS = ("comm-sms", "minibatch")
COMM_STEP = 4  # communication SMs between grid points
CONFIRM = 3  # points the event model runs besides the bound
BUDGET_S = 16.0  # seconds of search: no event-model run that would end later starts (at the slowest rate so far)
MAX_ROUNDS = 32  # the search's smallest minibatch splits a GPU's tokens into this many rounds
TIE = 5e-3  # bounds closer than this fraction rank by fewer rounds (the event model runs those faster)


def comm_grid(profile: Profile) -> list[int]:
    """Communication SMs to try: every ``COMM_STEP`` up to half the SMs, and the profile's default."""
    S = profile.num_sms
    g = set(range(COMM_STEP, max(S // 2, COMM_STEP) + 1, COMM_STEP)) | {profile.rack.comm_sms}
    return sorted(n for n in g if 1 <= n < S)


def minibatch_grid(tokens_per_gpu: int) -> list[int]:
    """Tokens per GPU per round to try: powers of two and their halfway points (x 1.5) up to Tg, in
    at most ``MAX_ROUNDS`` rounds."""
    lo = max(1, -(-tokens_per_gpu // min(MAX_MINIBATCHES, MAX_ROUNDS)))
    g = {tokens_per_gpu}
    k = 16
    while k < tokens_per_gpu:
        g |= {k, k * 3 // 2}
        k *= 2
    return sorted(m for m in g if lo <= m <= tokens_per_gpu)


def rebatch(w: Workload, minibatch: int) -> Workload:
    """The same routed tokens split into rounds of ``minibatch`` tokens per GPU."""
    nmb = -(-w.tokens_per_gpu // minibatch)
    rows, traffic, pull, push = slot_traffic(w.slot_topk_idx, w.placement.slot_rank, w.num_gpus, w.tokens_per_gpu,
                                             minibatch, nmb)
    return dataclasses.replace(w, minibatch=minibatch, rows_slot_mb=rows, traffic_mb=traffic, pull_slot_mb=pull,
                               push_slot_mb=push)


def minibatch_curve(workload, profile, minibatches, **simulate_kw) -> list[dict]:
    """The event model at each of ``minibatches`` (tokens per GPU per round) on the same routed
    tokens: per point the layer time, the binding term and the split of ``rounds.round_terms`` (microseconds)."""
    from .simulate import simulate_workload

    out = []
    for mb in minibatches:
        r = simulate_workload(rebatch(workload, int(mb)), profile, **simulate_kw)
        t = r.rounds
        out.append({"minibatch": int(mb), "rows_per_round": r.inputs["minibatch_rows_mean"], "rounds": t["rounds"],
                    "layer_us": r.layer_time_us, "bound_by": r.verdict.get("bound_by"),
                    **{k[:-2] + "_us": t[k] * 1e6 for k in ("start_s", "shared_s", "fill_s", "routed_compute_s",
                                                             "gaps_s", "drain_s", "signalling_s")},
                    "down_waves_per_round": float(np.mean(t["down_waves"])),
                    "gate_up_waves_per_round": float(np.mean(t["gate_up_waves"]))})
    return out


class RoundBound:
    """The bound of one workload (one minibatch) at any number of communication SMs."""

    def __init__(self, w: Workload, p: Profile, *, weight_dtype: str, dispatch_dtype: str, include_shared: bool,
                 comm_work, dispatch_mode: str, combine_mode: str, start_s: float):
        cfg, G = w.config, w.num_gpus
        H, I = cfg.hidden_size, cfg.intermediate_size
        kw = dict(profile=p, weight_dtype=weight_dtype, act_dtype=dispatch_dtype)
        self.flops_s, byts, self.routed_s = np.zeros(G), np.zeros(G), np.zeros(G)
        sh = (ffn_roofline_parts([w.tokens_per_gpu], H, cfg.shared_intermediate_size, **kw)
              if include_shared and cfg.num_shared_experts else (0.0, 0.0, 0.0))
        l2 = p.rack.l2_weight_fraction * p.l2_bytes
        for g in range(G):
            r = w.rows_slot_mb[w.placement.slot_rank == g]  # (n, B)
            f, wts, acts = ffn_roofline_parts(r.sum(axis=1), H, I, **kw)
            touched = r > 0
            slots = np.count_nonzero(touched.any(axis=1))
            reads = touched.sum() if slots * (wts / max(slots, 1)) > l2 else slots  # weights read per round unless in L2
            self.flops_s[g] = f + sh[0]
            byts[g] = wts / max(slots, 1) * reads + acts + sh[1] + sh[2]
            self.routed_s[g] = max(f, (wts / max(slots, 1) * reads + acts) / hbm_peak(p))
        self.hbm_s = byts / hbm_peak(p)
        self.w, self.p, self.S = w, p, p.num_sms
        self.kw = dict(dispatch_dtype=dispatch_dtype, comm_work=comm_work, start_s=start_s,
                       dispatch_mode=dispatch_mode, combine_mode=combine_mode)
        t = w.traffic_mb
        self.dis = t * row_bytes(H, dispatch_dtype)
        self.com = t * row_bytes(H, "bf16")
        first = self.dis[:, 0, :].copy()  # (G src, G dst) the first round's rows
        np.fill_diagonal(first, 0.0)
        self.first_in = first.sum(axis=0)  # (G,) bytes each GPU receives before its first round may compute

    def at(self, n: int) -> tuple[float, str, dict]:
        """(bound seconds, binding term, {term: (G,) seconds}) with n communication SMs."""
        p = self.p
        scale = self.S / (self.S - n) if self.w.num_gpus > 1 else 1.0
        comp = self.flops_s * scale
        rt = rack_terms(p, self.w.config, self.w.tokens_per_gpu, comm_sms=n, **self.kw)
        # with completion signalling a round computes once all of its rows have landed: the first
        # round's rows, then the routed experts' work
        dsig = rt["signals_s"][0]
        per_byte = max(rt["port_coefs"][0] / p.port_bytes_per_s,  # the receiver's port, and its copy SMs if it pulls
                       1.0 / rt["copy_bytes_per_s"] if rt["modes"][0] == "pull" else 0.0)
        fill = self.first_in * per_byte + dsig if dsig else np.zeros_like(comp)
        fill = fill * (self.first_in > 0)
        e = estimate("fused", compute_s=np.maximum.reduce([comp, self.hbm_s, fill + self.routed_s * scale]),
                     dispatch_bytes=self.dis, combine_bytes=self.com, profile=p, rounds=self.w.num_minibatches, **rt)
        terms = {**e.terms, "compute": comp, "hbm": self.hbm_s, "fill": fill + self.routed_s * scale}
        g = e.busiest_gpu
        term = max((k for k in terms if k != "fixed"), key=lambda k: terms[k][g])
        return e.time_s, term, terms


@dataclasses.dataclass
class Point:
    comm_sms: int
    minibatch: int  # tokens per GPU per round
    rows_per_round: float  # rows a GPU receives per round, mean (Mixture-of-Kittens' minibatch)
    bound_us: float
    bound_term: str
    event_us: float | None = None
    event_term: str | None = None
    verdict: str | None = None

    @property
    def time_us(self) -> float:
        return self.bound_us if self.event_us is None else self.event_us


def optimize(workload: Workload, profile: Profile, *, knobs=KNOBS, dtype: str = "bf16",
             weight_dtype: str | None = None, dispatch_dtype: str | None = None, include_shared: bool = True,
             comm_work=None, dispatch_mode: str = "pull", combine_mode: str = "push", confirm: int = CONFIRM,
             curve_events: int = 0, comm_sms: int | None = None, minibatch: int | None = None, log=None,
             budget_s: float = BUDGET_S) -> dict:
    """Search ``knobs`` (a subset of ``KNOBS``; the others stay at ``comm_sms`` / ``minibatch`` or the
    profile's defaults) for ``workload`` on ``profile``. The bound ranks every point; the event model
    runs the ``confirm`` best, then walks from the best it has found to a faster grid neighbour while
    ``budget_s`` lasts, then runs ``curve_events`` neighbours of the best on each curve.

    Returns {best, runner_up, points, curves: {comm_sms: [Point], minibatch: [Point]}, wall_s,
    bound_s_per_point}."""
    from .schedules import layer_start_s
    from .simulate import round_rows, simulate_workload

    bad = sorted(set(knobs) - set(KNOBS))
    if bad or not knobs:
        raise ValueError(f"--optimize takes some of {', '.join(KNOBS)}, got {', '.join(bad) or 'nothing'}")
    t0 = time.perf_counter()
    p, w = profile, workload
    if p.num_gpus < 2:
        raise ValueError("--optimize needs a rack of at least 2 GPUs: one GPU has no communication SMs")
    wd, ad = normalize_dtype(weight_dtype or dtype), normalize_dtype(dispatch_dtype or dtype)
    n0 = p.rack.comm_sms if comm_sms is None else comm_sms
    m0 = min(w.tokens_per_gpu, p.rack.minibatch_tokens) if minibatch is None else minibatch
    ns = comm_grid(p) if "comm-sms" in knobs else [n0]
    ms = minibatch_grid(w.tokens_per_gpu) if "minibatch" in knobs else [m0]
    start = layer_start_s(p, w.config, w.tokens_per_gpu)
    opts = dict(weight_dtype=wd, dispatch_dtype=ad, include_shared=include_shared, comm_work=comm_work,
                dispatch_mode=dispatch_mode, combine_mode=combine_mode)
    loads, pts = {}, {}
    t_b, n_b = 0.0, 0
    for m in ms:
        wm = w if m == w.minibatch else rebatch(w, m)
        loads[m] = wm
        rows = round_rows(wm)["minibatch_rows_mean"]
        tb = time.perf_counter()
        rb = RoundBound(wm, p, start_s=start, **opts)
        for n in ns:
            t, term, _ = rb.at(n)
            pts[(n, m)] = Point(n, m, rows, t * 1e6, term)
        t_b += time.perf_counter() - tb
        n_b += len(ns)
    lo = min(q.bound_us for q in pts.values())
    ranked = sorted(pts.values(), key=lambda q: (int(np.log(q.bound_us / lo) / np.log1p(TIE)), -q.minibatch,
                                                 q.bound_us))

    per_round_s = [0.0]  # the slowest event run so far, in seconds per round

    def run(q: Point, guard: bool = True) -> None:
        """The event model on q, unless (``guard``) it would end past the budget at the slowest rate so far."""
        if q.event_us is not None:
            return
        rounds = loads[q.minibatch].num_minibatches
        if guard and time.perf_counter() - t0 + per_round_s[0] * rounds > budget_s:
            return
        t_run = time.perf_counter()
        r = simulate_workload(loads[q.minibatch], p, schedule="fused", comm_sms=q.comm_sms, dtype=dtype,
                              weight_dtype=weight_dtype, dispatch_dtype=dispatch_dtype, include_shared=include_shared,
                              comm_work=comm_work, dispatch_mode=dispatch_mode, combine_mode=combine_mode)
        per_round_s[0] = max(per_round_s[0], (time.perf_counter() - t_run) / rounds)
        q.event_us, q.event_term, q.verdict = r.layer_time_us, r.verdict["bound_by"], r.verdict["line"]
        if log:
            log(f"event model: {q.comm_sms} comm SMs, {q.minibatch}-token rounds: {q.event_us / 1e3:,.3f} ms")

    for i, q in enumerate(ranked[:max(1, confirm)]):
        run(q, guard=i > 1)  # the best two by the bound always run: a best and a runner-up

    def best_run() -> Point:
        return min((q for q in pts.values() if q.event_us is not None), key=lambda q: q.event_us)

    # walk from the best confirmed point to a better neighbour on either knob's grid (the bound
    # cannot see how rounds pipeline), while the time budget lasts
    seen = set()
    walk_s = budget_s * (0.75 if curve_events else 1.0)  # the rest for the curves' neighbours
    while time.perf_counter() - t0 < walk_s:
        b = best_run()
        if (b.comm_sms, b.minibatch) in seen:
            break
        seen.add((b.comm_sms, b.minibatch))
        i, j = ns.index(b.comm_sms), ms.index(b.minibatch)
        for n, m in ((ns[i - 1] if i else None, b.minibatch), (ns[i + 1] if i + 1 < len(ns) else None, b.minibatch),
                     (b.comm_sms, ms[j - 1] if j else None), (b.comm_sms, ms[j + 1] if j + 1 < len(ms) else None)):
            if n is not None and m is not None and time.perf_counter() - t0 < walk_s:
                run(pts[(n, m)], guard=True)
    best = best_run()
    for key, grid, at in (("comm_sms", ns, lambda x: (x, best.minibatch)), ("minibatch", ms, lambda x: (best.comm_sms, x))):
        i = grid.index(best.comm_sms if key == "comm_sms" else best.minibatch)
        for x in grid[max(0, i - curve_events):i + curve_events + 1]:
            if time.perf_counter() - t0 < budget_s:
                run(pts[at(x)])
    done = sorted((q for q in pts.values() if q.event_us is not None), key=lambda q: q.event_us)
    best = done[0]
    return {"best": best, "runner_up": done[1] if len(done) > 1 else None, "points": ranked,
            "curves": {"comm_sms": [pts[(n, best.minibatch)] for n in ns],
                       "minibatch": [pts[(best.comm_sms, m)] for m in ms]},
            "wall_s": time.perf_counter() - t0, "bound_s_per_point": t_b / max(n_b, 1)}


def plot_curves(result: dict, path: str | Path, title: str = "") -> Path:
    """Two panels: layer time against communication SMs (at the best minibatch) and against the
    minibatch (at the best communication SMs); the bound as a line, the event model as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    best = result["best"]
    for ax, key, x_of, label in ((axes[0], "comm_sms", lambda q: q.comm_sms, "communication SMs"),
                                 (axes[1], "minibatch", lambda q: q.minibatch, "minibatch (tokens per GPU per round)")):
        c = result["curves"][key]
        ax.plot([x_of(q) for q in c], [q.bound_us / 1e3 for q in c], "-", color="0.6", label="bound")
        ev = [q for q in c if q.event_us is not None]
        ax.plot([x_of(q) for q in ev], [q.event_us / 1e3 for q in ev], "o", label="event model")
        for q in c:
            ax.annotate(q.bound_term, (x_of(q), q.bound_us / 1e3), fontsize=6, rotation=60, color="0.4")
        ax.axvline(x_of(best), ls=":", color="k")
        ax.set_xlabel(label)
        ax.set_ylabel("layer time (ms)")
        if key == "minibatch":
            ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle(title or f"best: {best.comm_sms} comm SMs, {best.minibatch}-token rounds, "
                          f"{best.time_us / 1e3:,.3f} ms")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
