"""Re-predict several stored validation runs at once, each with its own calibrated profile, and
print each run's error statistics and the rows that stay furthest off.

    python benchmarks/repredict_runs.py [--runs 53,54,55,56 | --runs DIR,DIR] [--switch NAME=on ...]
                                        [--worst 10] [--rows deepseek-v3:512:zipf:multi ...]

This is how a cost-model change is tried on measurements already made (every run's rows were
predicted before they were measured; these re-predictions are not). A change that looks better
here still has to be held out by a fresh GPU run (``megamoe validate --variant``) before its
figures are quoted. A run is a folder of validation rows and the profile.json calibrated with them,
named by its path or by its number (a ``validation_*_run<N>`` folder anywhere under
benchmarks/results). ``--switch`` sets ``simulator.cost.CostOptions`` fields (megamoe/repredict.py).
Reads only; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_RUNS = "53,54,55,56"


def run_dir(run: str | Path) -> Path:
    """The folder of validation run ``run``: a folder path, or a run number (a validation_<date>_run<N>
    folder anywhere under benchmarks/results)."""
    if Path(run).is_dir():
        return Path(run)
    hits = sorted(RESULTS.rglob(f"validation_*_run{run}"))
    if not hits:
        raise SystemExit(f"no results/validation_*_run{run} folder; the runs stored: "
                         + ", ".join(sorted(p.name.rsplit("_run", 1)[-1] for p in RESULTS.rglob("validation_*_run*"))))
    return hits[-1]


def errors(rows: list[dict]) -> dict[tuple, float]:
    """{(preset, T, routing, backend): (predicted - measured) / measured}."""
    return {(r["preset"], int(r["T"]), r["routing"], r["backend"]): (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
            for r in rows}


def repredicted(run: str | Path, settings: dict[str, bool], profile_file: str = "profile.json") -> dict[tuple, float]:
    """Errors of run ``run``'s rows predicted again with its own profile (``profile_file`` in the run's
    folder, where it has one, else profile.json) under ``settings``."""
    from megamoe.report import load_rows
    from megamoe.repredict import repredict_rows, switches
    from megamoe.simulator.hardware import load_profile

    d = run_dir(run)
    with switches(settings):
        prof = d / profile_file if (d / profile_file).exists() else d / "profile.json"
        rows, _ = repredict_rows(load_rows(d), load_profile(prof))
    return errors(rows)


def summary(err: dict[tuple, float]) -> str:
    a = [abs(v) for v in err.values()]
    by = {b: [abs(v) for k, v in err.items() if k[-1] == b] for b in ("megakernel", "multi")}
    parts = [f"median {100 * statistics.median(a):.1f}%", f"max {100 * max(a):.1f}%",
             f"outside 15% {sum(x > 0.15 for x in a)}", f"outside 10% {sum(x > 0.10 for x in a)}"]
    parts += [f"{b} {100 * statistics.median(v):.1f}%" for b, v in by.items() if v]
    return ", ".join(parts) + f" ({len(a)} rows)"


def main(argv=None) -> None:
    from megamoe.repredict import parse_switches

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=DEFAULT_RUNS,
                    help=f"run numbers or folders, comma-separated (default {DEFAULT_RUNS})")
    ap.add_argument("--switch", action="append", default=[], help="NAME=on|off (a CostOptions field) for the re-prediction")
    ap.add_argument("--worst", type=int, default=10, help="rows listed per run, furthest off first")
    ap.add_argument("--profile-file", default="profile.json",
                    help="the profile file in each run's folder (runs without it: profile.json), e.g. "
                         "profile_rebuilt.json: the run's microbench.json through a later build_profile")
    ap.add_argument("--rows", nargs="*", default=[], help="preset:T:routing:backend rows to list in every run")
    args = ap.parse_args(argv)
    settings = parse_switches(args.switch)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    base = {run: repredicted(run, {}, args.profile_file) for run in runs}
    new = {run: repredicted(run, settings, args.profile_file) for run in runs} if settings else base
    label = ", ".join(f"{k}={'on' if v else 'off'}" for k, v in settings.items()) or "the defaults"
    for run in runs:
        print(f"run {run}: defaults: {summary(base[run])}")
        if settings:
            print(f"run {run}: {label}: {summary(new[run])}")
        for k in sorted(new[run], key=lambda k: -abs(new[run][k]))[:args.worst]:
            print(f"    {':'.join(map(str, k)):44s} {100 * base[run][k]:+6.1f}% -> {100 * new[run][k]:+6.1f}%")
    for spec in args.rows:
        p, t, rt, b = spec.split(":")
        k = (p, int(t), rt, b)
        print(spec, " ".join(f"run{run} {100 * base[run].get(k, float('nan')):+.1f}->{100 * new[run].get(k, float('nan')):+.1f}"
                             for run in runs))
    if len(runs) > 1:
        pooled_b = {(run,) + k: v for run in runs for k, v in base[run].items()}
        pooled_n = {(run,) + k: v for run in runs for k, v in new[run].items()}
        print(f"pooled: defaults: {summary(pooled_b)}")
        if settings:
            print(f"pooled: {label}: {summary(pooled_n)}")


if __name__ == "__main__":
    main()
