"""``megamoe validate`` on a GPU: measure the grid, each configuration predicted before it is measured.

Shape legend: T tokens, E experts, K top-k, H hidden, NI inputs captured per CUDA graph.

Compile ahead (``megamoe.warm``); then per configuration, T-major: route NI steered inputs, write
the prediction row (phase "prediction"), time NI calls as a CUDA-graph replay and write the row
again (phase "measurement" or "failed"); then the report. Guards: ``--budget``, a watchdog per
configuration (exit 4), a lost CUDA context (exit 3); ``--resume`` skips configurations with an
outcome and records one with only its prediction row as failed. See docs/validation.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import warm
from .deadline import Budget, Watchdog, command_start
from .grid import Configuration, calls_per_graph, configurations, key_of
from .layers import CudaLayer, WeightCache, has_cuda, make_layer
from .predict import predict_config
from .report import load_outcomes, write_report
from .repredict import multi_configs

COMPARE_PROFILES = "h200"
REPORT_RESERVE_S = 15.0  # seconds kept back from the budget for the report and the summary
GRACE_S = 20.0  # seconds past the budget the watchdog lets one configuration run
UNWARMED_S = 30.0  # seconds added to a configuration's estimate when its kernels are not compiled yet
CONFIG_TIMEOUT_S = 150.0  # seconds one configuration may take before the watchdog ends the run
WARM_SHARE = 0.5  # of the budget, at most, for compiling ahead
WARM_MAX_S = 900.0  # seconds of compiling ahead without a budget
CONTEXT_LOST_EXIT = 3  # the exit code when the CUDA context was lost


def predict_all(cfg, counts, T: int, backend: str, profiles: list, *, device_name: str, calls: int,
                reps: int | None = None, variants: dict | None = None, gemm: dict | None = None,
                shared_gemm: dict | None = None) -> dict:
    """The row's prediction fields: the first profile's at the top level and every profile's under
    ``predictions[name]``; each of ``variants`` ({label: cost switches}) with the first profile
    under ``predictions[f"{name}+{label}"]``. A prediction that raises gets ``{"failure": ...}``.
    ``counts`` go into the row too. ``gemm`` / ``shared_gemm``: the multi-launch entries that run
    (predict_config's)."""
    from .repredict import switches

    out: dict = {"predictions": {}, "counts": [int(c) for c in counts]}
    runs = [(p.name, p, {}) for p in profiles]
    if profiles:
        runs += [(f"{profiles[0].name}+{label}", profiles[0], s) for label, s in (variants or {}).items()]
    for i, (name, p, settings) in enumerate(runs):
        try:
            with switches(settings):
                pr = predict_config(cfg, counts, T, backend, p, device_name=device_name, calls_per_graph=calls,
                                    reps=reps, gemm=gemm, shared_gemm=shared_gemm)
        except Exception as exc:  # noqa: BLE001 - the measurement is still worth having
            out["predictions"][name] = {"failure": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        out["predictions"][name] = {k: pr[k] for k in ("predicted_us", "predicted_fixed_us", "dominant",
                                                       "dominant_term") if k in pr}
        if i == 0:
            out.update(pr)
    return out


# --------------------------------------------------------------------------- rows
def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


class RowWriter:
    """Appends JSON rows to one file, flushed at once; safe to call from the watchdog's thread."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, row: dict) -> None:
        line = json.dumps(row, default=_json_default) + "\n"
        if not self._lock.acquire(timeout=5.0):
            return
        try:
            with self.path.open("a") as f:
                f.write(line)
                f.flush()
        finally:
            self._lock.release()


def row_files(out: Path) -> list[Path]:
    return sorted(Path(out).glob("validation_*.jsonl"))


def previous_outcomes(out: Path) -> dict[str, dict]:
    """key -> the last row of each configuration in ``out``'s validation_*.jsonl files."""
    last: dict[str, dict] = {}
    for p in row_files(out):
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut short when a run was killed
                continue
            if isinstance(r, dict) and "preset" in r and "T" in r:
                last[key_of(r)] = r
    return last


# --------------------------------------------------------------------------- the run
@dataclass
class RunState:
    """What the run has done, for the progress lines, the summary and the watchdog."""

    total: int
    measured: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)
    not_reached: list = dataclasses.field(default_factory=list)
    resumed: int = 0
    stop_reason: str | None = None
    current: Configuration | None = None
    current_row: dict | None = None
    warm_s: float = 0.0
    warm_status: dict = dataclasses.field(default_factory=dict)
    durations: dict = dataclasses.field(default_factory=dict)  # (T, backend) -> seconds of the last one

    def done(self) -> int:
        return len(self.measured) + len(self.failed)

    def estimate(self, c: Configuration) -> float:
        """Seconds the configuration will take: the last one at this T and backend, else 1.5 x the
        slowest so far (at least 2 s); plus UNWARMED_S if its kernels were not compiled ahead."""
        est = self.durations.get((c.T, c.backend))
        if est is None:
            est = max(2.0, 1.5 * max(self.durations.values(), default=2.0))
        if self.warm_status and self.warm_status.get(c.key) != "ok":
            est += UNWARMED_S
        return est


def _profiles(args) -> list:
    """The profiles that predict: --profile (or --system) first, then --compare-profiles, each once."""
    from megamoe.simulator import load_profile

    out = [load_profile(args.profile or args.system)]
    for spec in (s.strip() for s in (args.compare_profiles or "").split(",")):
        if spec:
            p = load_profile(spec)
            if p.name not in {q.name for q in out}:
                out.append(p)
    return out


def _fmt_us(v) -> str:
    return f"{v:10.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>10}"


def progress_line(state: RunState, budget: Budget, c: Configuration, row: dict, profiles: list) -> str:
    n = state.done() + state.resumed
    head = f"{budget.stamp()} {n:>3}/{state.total} {c.preset:<14} T={c.T:<6} {c.routing:<12} {c.backend:<10}"
    if row.get("phase") == "failed":
        return f"{head} FAILED: {row.get('failure', '?')[:200]}"
    s = f"{head} pred {_fmt_us(row.get('predicted_us'))} us"
    for p in profiles[1:]:
        s += f" ({p.name} {_fmt_us(row['predictions'].get(p.name, {}).get('predicted_us')).strip()})"
    s += f"  meas {_fmt_us(row.get('measured_us'))} us"
    if isinstance(row.get("error"), float):
        s += f"  err {row['error']:+.1%}"
    if "rel_diff_vs_multi" in row:
        s += f"  vs multi {row['rel_diff_vs_multi']:.1e}"
    return s + f"  ({row.get('seconds', 0.0):.1f} s)"


def measure_grid(args, layer: CudaLayer | None = None) -> int:
    """The GPU run. ``layer``: the device side (default CUDA if present, else the interpreter).
    Returns 0 or CONTEXT_LOST_EXIT; the watchdog exits from its own thread."""
    import datetime as dt

    budget = Budget(args.budget, start=command_start())  # the seconds spent importing count too
    if layer is None:
        layer = make_layer("cuda" if has_cuda() else "interpreter")
    profiles = _profiles(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    writer = RowWriter(out / f"validation_{dt.date.today().isoformat()}.jsonl")
    presets = [m.strip() for m in args.models.split(",") if m.strip()]
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    routings = [r.strip() for r in args.routings.split(",") if r.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    configs = configurations(presets, tokens, routings, backends)
    state = RunState(total=len(configs))
    prior = previous_outcomes(out) if args.resume else {}
    prov = layer.provenance()
    dev_name = prov["gpu"]
    reps = args.reps
    log = _log

    for c in configs:  # a resumed configuration whose process ended during it: failed, not retried
        r = prior.get(c.key)
        if r is not None and r.get("phase") == "prediction":
            r = {**r, "phase": "failed", "failure": "interrupted: an earlier run ended during this configuration "
                 "(hang, crash or time limit); not retried"}
            writer.write(r)
            prior[c.key] = r
    todo = [c for c in configs if c.key not in prior]
    state.resumed = len(configs) - len(todo)
    log(f"megamoe validate: {len(configs)} configurations ({len(presets)} presets x {len(tokens)} T x "
        f"{len(routings)} routings x {len(backends)} backends), {len(todo)} to run"
        + (f" ({state.resumed} done in an earlier run)" if state.resumed else "")
        + f"; budget {'none' if args.budget is None else f'{args.budget:.0f} s'}; profiles "
        + ", ".join(p.name for p in profiles) + f"; {dev_name}, torch {prov.get('torch')}, triton {prov.get('triton')}")

    def finish(notes=()) -> dict:
        """The report from every row in ``out`` (this run's and earlier ones'), and the summary."""
        measured, failed = load_outcomes(out)
        summary = run_summary(state, budget, measured, failed, profiles, out)
        from .repredict import switch_note

        sw_note = switch_note(getattr(args, "cost_switches", None) or {}, "this run's predictions")
        for label, settings in (getattr(args, "variants", None) or {}).items():
            sw_note += switch_note({**(getattr(args, "cost_switches", None) or {}), **settings},
                                   f"the variant {profiles[0].name}+{label} (also predicted before each measurement)")
        write_report(measured, out, notes=[*notes, *sw_note, *summary["notes"]], failures=failed, run=summary)
        for line in summary["lines"]:
            print(line, flush=True)
        return summary

    def on_fire(what: str) -> None:  # the watchdog's thread: the main one is stuck in the GPU
        c, row = state.current, state.current_row
        if c is not None:
            timeout = args.config_timeout
            row = {**(row or {}), **c.fields(), **prov, "phase": "failed",
                   "failure": f"no result after {timeout:.0f} s or past the budget (a GPU hang or a compile "
                              "too slow for the budget); the watchdog ended the run"}
            writer.write(row)
            state.failed.append(row)
        state.stop_reason = f"watchdog: {what} did not finish"
        ended = {key_of(r) for r in state.measured + state.failed}
        state.not_reached = [t for t in todo if t.key not in ended and t != c]
        finish()

    watchdog = Watchdog(on_fire, name="megamoe validate")
    old_term = _exit_on_sigterm()
    try:
        if args.warm and todo:
            t = time.monotonic()
            span = WARM_MAX_S if args.budget is None else min(WARM_SHARE * args.budget, budget.left() - REPORT_RESERVE_S)
            deadline = t + max(0.0, span)
            jobs = warm.plan_jobs(todo, lambda preset, T: layer.job_bytes(layer.config(preset), T))
            state.warm_status = warm.run_jobs(
                jobs, folder=out / "warm", layer_kind=layer.kind, seed=args.seed, procs=args.warm_procs,
                memory_bytes=0.9 * layer.free_memory(), deadline=deadline, config_timeout_s=args.config_timeout,
                log=lambda s: log(f"{budget.stamp()} warm: {s}"))
            state.warm_s = time.monotonic() - t
            ok = sum(v == "ok" for v in state.warm_status.values())
            log(f"{budget.stamp()} warm-up: {ok}/{len(state.warm_status)} configurations compiled in "
                f"{state.warm_s:.0f} s (statuses in {out / 'warm' / 'warm_status.json'})")
        code = _measure_all(todo, args, layer, profiles, writer, state, budget, watchdog, prov, reps)
    except BaseException as exc:  # Ctrl-C or a bug: still the report from what was measured
        state.stop_reason = {KeyboardInterrupt: "interrupted (Ctrl-C)", SystemExit: "terminated (SIGTERM)"}.get(
            type(exc), f"error: {exc!r}"[:300])
        finish()
        raise
    finally:
        watchdog.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    finish()
    return code


def _exit_on_sigterm():
    """Make SIGTERM raise SystemExit(143) in the main thread; returns the replaced handler (None off
    the main thread)."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _measure_all(todo, args, layer, profiles, writer, state, budget, watchdog, prov, reps) -> int:
    import numpy as np

    weights = WeightCache(layer, args.seed, 0.6 * layer.free_memory())
    dev_name = prov["gpu"]
    group_key, group = None, None
    for i, c in enumerate(todo):
        if state.stop_reason:
            state.not_reached.append(c)
            continue
        est = state.estimate(c)
        if not budget.allows(est, reserve_s=REPORT_RESERVE_S):
            state.stop_reason = (f"budget: {budget.left():.0f} s left, the next configuration ({c.key}) was "
                                 f"estimated at {est:.0f} s and {REPORT_RESERVE_S:.0f} s are kept for the report")
            _log(f"{budget.stamp()} {state.stop_reason}; {len(todo) - i} configuration(s) not started")
            state.not_reached.append(c)
            continue
        t0 = time.monotonic()
        row = {**c.fields(), "profile": profiles[0].name, "reps": reps, **prov}
        state.current, state.current_row = c, row
        watchdog.arm(min(args.config_timeout, max(budget.left(), 0.0) + GRACE_S), c.key)
        try:
            warm_says = state.warm_status.get(c.key, "")
            if warm_says.startswith(("crashed", "hung")):
                raise RuntimeError(f"not measured: in the compile-ahead this configuration {warm_says}")
            if group_key != (c.preset, c.T, c.routing):
                group_key, group = (c.preset, c.T, c.routing), None
                layer.free()
                cfg, w = weights.get(c.preset)
                ni = calls_per_graph(c.T)
                xs, ws = layer.inputs(cfg, w, c.T, c.routing, args.seed, ni)
                idx = layer.routing(xs[0], ws, cfg)
                counts = np.bincount(idx.reshape(-1).astype(np.int64), minlength=cfg.num_experts)
                group = {"cfg": cfg, "xs": xs, "ws": ws, "counts": counts, "ni": ni, "y": {}}
            cfg, xs, ws, counts = group["cfg"], group["xs"], group["ws"], group["counts"]
            row.update(calls_per_graph=group["ni"], experts_touched=int((counts > 0).sum()),
                       max_over_mean_load=float(counts.max() / max(counts.mean(), 1e-9)))
            if c.backend == "multi":  # the GEMM entries this row runs, and where they come from
                row.update(multi_configs(cfg, c.T, gpu=dev_name, triton_version=prov.get("triton")))
            row.update(predict_all(cfg, counts, c.T, c.backend, profiles, device_name=dev_name,
                                   calls=group["ni"], reps=reps, variants=getattr(args, "variants", None),
                                   gemm=row.get("gemm_config"), shared_gemm=row.get("shared_gemm_config")))
            if getattr(args, "cost_switches", None):
                row["cost_switches"] = dict(args.cost_switches)
            if getattr(args, "variants", None):
                row["cost_variants"] = {k: dict(v) for k, v in args.variants.items()}
            writer.write({**row, "phase": "prediction"})  # before anything is timed
            idle = float(getattr(args, "idle_before", 0.0) or 0.0)
            if idle > 0:
                row["idle_before_s"] = idle
                layer.idle(idle)
            row["measured_us"] = layer.time_us(cfg, ws, xs, c.backend, reps)
            if getattr(layer, "last_clock", None):  # a diagnostic: the clock the layer ran at
                row["measured_clock"] = layer.last_clock
            if c.backend == "multi" and getattr(args, "stages", True):
                row["measured_stages_us"] = layer.stage_us(cfg, ws, xs, reps, row["measured_us"], idle_s=idle)
            y = layer.forward(xs[0], ws, cfg, c.backend)
            group["y"][c.backend] = y
            ref = group["y"].get("multi") if c.backend != "multi" else None
            if ref is not None:
                row["rel_diff_vs_multi"] = layer.rel_diff(y, ref)
            m = row["measured_us"]
            if isinstance(row.get("predicted_us"), float):
                row["error"] = (row["predicted_us"] - m) / m
            for p in row["predictions"].values():
                if "predicted_us" in p:
                    p["error"] = (p["predicted_us"] - m) / m
            row["phase"] = "measurement"
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is a row, not the end
            row.update(phase="failed", failure=f"{type(exc).__name__}: {exc}"[:1000],
                       traceback=traceback.format_exc(limit=6)[-2000:])
        row["seconds"] = round(time.monotonic() - t0, 2)
        watchdog.disarm()
        writer.write(row)
        state.current, state.current_row = None, None
        (state.measured if row["phase"] == "measurement" else state.failed).append(row)
        state.durations[(c.T, c.backend)] = row["seconds"]
        print(progress_line(state, budget, c, row, profiles), flush=True)
        if row["phase"] == "failed":
            group_key = None if group is None else group_key
            if not layer.alive():
                state.stop_reason = (f"the CUDA context was lost at {c.key} ({row['failure'][:200]}); "
                                     "rerun with --resume to go on in a fresh process")
                _log(f"{budget.stamp()} {state.stop_reason}")
                state.not_reached.extend(todo[i + 1:])
                return CONTEXT_LOST_EXIT
            layer.free()
    return 0


def run_summary(state: RunState, budget: Budget, measured: list, failed: list, profiles: list, out: Path) -> dict:
    """Counts, errors per profile and backend, what stopped the run, the files: as data and as lines."""
    import statistics

    lines = [f"megamoe validate: {len(state.measured)} measured, {len(state.failed)} failed, {len(state.not_reached)} "
             f"not reached of {state.total} configurations in {budget.elapsed():.0f} s (compile-ahead "
             f"{state.warm_s:.0f} s)" + (f"; {state.resumed} from earlier runs" if state.resumed else "")]
    per_profile: dict = {}
    for p in profiles:
        errs: dict[str, list] = {}
        for r in measured:
            e = r.get("predictions", {}).get(p.name, {}).get("error")
            if e is None and p is profiles[0] and "predictions" not in r and r.get("predicted_us"):
                e = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
            if e is not None:
                errs.setdefault(r.get("backend", "multi"), []).append(abs(e))
        allv = [v for vs in errs.values() for v in vs]
        if allv:
            per_profile[p.name] = {"configurations": len(allv), "median_abs_error": statistics.median(allv),
                                   "by_backend": {b: statistics.median(v) for b, v in sorted(errs.items())}}
            lines.append(f"  {p.name:<18} median |pred - meas| / meas {statistics.median(allv):6.1%} over {len(allv)} ("
                         + ", ".join(f"{b} {statistics.median(v):.1%}" for b, v in sorted(errs.items())) + ")")
    diffs = [r["rel_diff_vs_multi"] for r in measured if "rel_diff_vs_multi" in r]
    if diffs:
        lines.append(f"  megakernel output vs multi-launch: largest relative difference {max(diffs):.1e} over {len(diffs)}")
    for r in failed[:8]:
        lines.append(f"  failed: {key_of(r)}: {str(r.get('failure', '?'))[:160]}")
    if len(failed) > 8:
        lines.append(f"  ... and {len(failed) - 8} more failed (report.md)")
    notes = []
    if state.stop_reason:
        notes.append(f"stopped early: {state.stop_reason}")
        lines.append(f"  stopped early: {state.stop_reason}")
    if state.not_reached:
        notes.append(f"{len(state.not_reached)} configuration(s) not reached, first {state.not_reached[0].key}")
    lines.append(f"  rows: {', '.join(str(p) for p in row_files(out))}; report: {out / 'report.md'}, {out / 'scatter.png'}")
    return {"measured": len(state.measured), "failed": len(state.failed), "not_reached": [c.key for c in state.not_reached],
            "resumed": state.resumed, "total": state.total, "elapsed_s": round(budget.elapsed(), 1),
            "warm_s": round(state.warm_s, 1), "stop_reason": state.stop_reason, "by_profile": per_profile,
            "max_rel_diff_vs_multi": max(diffs) if diffs else None, "notes": notes, "lines": lines}



def _log(s: str) -> None:
    print(s, file=sys.stderr, flush=True)
