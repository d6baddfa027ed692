"""``megamoe calibrate --out DIR``: run the steps the budget allows and write the profile after each.

Writes ``DIR/profile.json`` and ``DIR/microbench.json`` after every step. A step that raises is
recorded (``calibration.errors``); one that outlives ``STEP_TIMEOUT_S`` ends the process (exit 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from megamoe.layers import cuda_alive as _cuda_alive

from .compute import measure_gemm, measure_mma, measure_mma_fp8
from .latency import measure_launch, measure_select, measure_serial, measure_sync
from .memory import measure_copy, measure_hbm, measure_hbm_deep, measure_l2_shared
from .plan import STEPS, plan_step
from .profile import build_profile, provenance
from .summary import summary
from .sustained import measure_sustained


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``megamoe calibrate``'s options."""
    parser.add_argument("--out", required=True, help="folder for profile.json and microbench.json")
    parser.add_argument("--base", default="h200", help="profile whose non-measured fields are kept (default h200)")
    parser.add_argument("--reps", type=int, default=5, help="graph replays per timing (median)")
    parser.add_argument("--quick", action="store_true", help="fewer points in every step (about half the time)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="wall-time limit (default none): later steps run in their quick form, or are skipped "
                             "(their base-profile numbers kept), when the budget is near")


STEP_TIMEOUT_S = 120.0  # seconds: one step longer than this is taken for a hang (the watchdog ends the run)
#: sweeps of the gemm step, each point's median rate kept (a transient clock dip in one sweep drops out)
GEMM_PASSES = 3


def median_of_passes(measure, passes: int) -> dict:
    """``measure()`` run ``passes`` times: each "points_*" point (keyed by every field but the
    rate) keeps the median rate (upper median of an even count); other fields are the first sweep's;
    "pass_spread": per table the largest best / worst rate of a point."""
    runs = [measure() for _ in range(max(1, int(passes)))]
    out = dict(runs[0])
    spread = {}
    for key, pts in runs[0].items():
        if not key.startswith("points_") or not isinstance(pts, list):
            continue
        seen: dict[tuple, list] = {}
        for run in runs:
            for p in run.get(key, ()):
                seen.setdefault(tuple(p[:-1]), []).append(list(p))
        mid = {k: sorted(v, key=lambda p: p[-1])[len(v) // 2] for k, v in seen.items()}
        out[key] = [mid[tuple(p[:-1])] for p in pts]  # the first sweep's order
        spread[key] = max((max(p[-1] for p in v) / min(p[-1] for p in v) for v in seen.values()
                           if min(p[-1] for p in v) > 0), default=1.0)
    if passes > 1:
        out["passes"] = len(runs)
        out["pass_spread"] = spread
    return out


def _measure(name: str, reps: int, S: int, gap_s: float, quick: bool) -> dict:
    """Step ``name``'s measurements (``gap_s``: the launch gap taken off graph replays)."""
    steps = {
        "launch": lambda: measure_launch(reps),
        "sync": lambda: measure_sync(reps, S, quick),
        "hbm": lambda: measure_hbm(reps, S, gap_s, quick),
        "mma": lambda: measure_mma(reps, S, gap_s, quick),
        "gemm": lambda: median_of_passes(lambda: measure_gemm(reps, S, gap_s, quick), GEMM_PASSES),
        "mma_fp8": lambda: measure_mma_fp8(reps, S, gap_s, quick),
        "copy": lambda: measure_copy(reps, S, quick),
        "serial": lambda: measure_serial(reps),
        "select": lambda: measure_select(reps, quick),
        "l2_shared": lambda: measure_l2_shared(reps, S, gap_s, quick),
        "hbm_deep": lambda: measure_hbm_deep(reps, S, quick),
        "sustained": lambda: measure_sustained(reps, quick),
    }
    if name not in steps:
        raise ValueError(f"unknown step {name!r}")
    return steps[name]()



def run(args: argparse.Namespace) -> int:
    """Measure every step that the budget allows; profile.json and microbench.json are rewritten
    after each step, so a run cut short (budget, watchdog, kill) leaves the steps it finished."""
    from megamoe.deadline import Budget, Watchdog, command_start

    if args.budget is not None and not args.budget > 0:
        print(f"megamoe calibrate: --budget must be a positive number of seconds, got {args.budget}", file=sys.stderr)
        return 2
    if args.reps < 1:
        print(f"megamoe calibrate: --reps must be >= 1, got {args.reps}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as exc:
        print(f"megamoe calibrate: needs torch and triton: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("megamoe calibrate: needs a CUDA GPU (the microbenchmarks time the device)", file=sys.stderr)
        return 2
    from megamoe.simulator.hardware import ProfileError, load_profile, validate

    budget = Budget(args.budget, start=command_start())  # the seconds spent importing count too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = load_profile(args.base).to_dict()
    prov = provenance()
    S = prov["num_sms"]
    m: dict = {}
    errors: dict = {}
    skipped: dict = {}

    def log(msg: str) -> None:
        print(f"calibrate {budget.stamp()} {msg}", file=sys.stderr, flush=True)

    def write(step: str | None = None) -> dict:
        prov["wall_s"] = round(budget.elapsed(), 1)
        prof = build_profile(base, m, prov)
        try:
            validate(prof, origin="calibrated profile")  # the loader must accept what we write
        except ProfileError as exc:
            if step not in m:
                raise
            errors[step] = f"its numbers do not make a valid profile: {exc}"[:500]  # drop them, keep the rest
            log(f"{step}: {errors[step]}")
            del m[step]
            prof = build_profile(base, m, prov)
            validate(prof, origin="calibrated profile")
        prof["calibration"]["errors"] = dict(errors)
        prof["calibration"]["skipped"] = dict(skipped)
        (out / "microbench.json").write_text(json.dumps({"provenance": prov, "measurements": m, "errors": errors,
                                                          "skipped": skipped}, indent=1, default=str))
        (out / "profile.json").write_text(json.dumps(prof, indent=1))
        return prof

    log(f"{prov['gpu']}, {S} SMs, torch {prov['torch']}, triton {prov['triton']}; budget "
        f"{'none' if args.budget is None else f'{args.budget:.0f} s'}{', --quick' if args.quick else ''}; "
        f"steps {', '.join(STEPS)}")
    watchdog = Watchdog(lambda what: log(f"{what}: no result; profile.json holds the steps before it"),
                        name="megamoe calibrate")
    try:
        for name in STEPS:
            mode = plan_step(name, budget.left(), args.quick)
            if mode is None:
                skipped[name] = f"budget: {budget.left():.0f} s left"
                log(f"{name}: skipped ({skipped[name]}); the base profile's numbers stay")
                continue
            gap_s = m["launch"]["launch_gap_s"] if "launch" in m else base["gpu"]["kernel_launch_s"]["value"]
            log(f"{name}: start ({mode})")
            t = time.perf_counter()
            watchdog.arm(min(STEP_TIMEOUT_S, max(budget.left(), 0.0) + 15.0), f"calibrate step {name}")
            try:
                m[name] = _measure(name, args.reps, S, gap_s, mode == "quick")
                if mode == "quick" and not args.quick:
                    skipped[name] = "measured in its quick form (budget)"
            except Exception as exc:  # noqa: BLE001 - the other steps are still worth having
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
                log(f"{name}: FAILED: {errors[name]}")
                if not _cuda_alive():
                    log("the CUDA context was lost: no further steps")
                    break
            finally:
                watchdog.disarm()
            write(name)
            log(f"{name}: done in {time.perf_counter() - t:.1f} s")
    finally:
        watchdog.close()
    prof = write()
    print(summary(m, prof))
    print(f"wrote {out / 'profile.json'} and {out / 'microbench.json'} ({prov['wall_s']} s; measured "
          f"{', '.join(prof['calibration']['measured']) or 'nothing'})")
    return 0 if m else 1
