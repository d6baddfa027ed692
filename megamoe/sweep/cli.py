"""``megamoe sweep``: run a SPEC's grid on Dask into Parquet, or rank the results of one.

    megamoe sweep SPEC.toml --out DIR [--workers N | --scheduler ADDRESS] [--retry-failed]
    megamoe sweep --tokens-per-gpu 128,1024 --placement contiguous,eplb --out DIR   # the grid as flags
    megamoe sweep --best DIR [--objective layer_time_us|exposed_comm_us] [--top N]

Without a SPEC, each option flag takes a comma-separated list (one value: fixed; several: a grid
axis) and ``--set KEY=V1,V2`` sweeps a profile field; options not given take the old defaults grid
(DEFAULT_GRID). Every error that can be found before running (bad SPEC, ``--out`` a file, a missing
dependency) is one line on stderr and exit code 2; failing points are recorded and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from .spec import OPTIONS, PROFILE_FLAGS

#: The grid of a bare ``megamoe sweep`` (no SPEC), as in earlier versions.
DEFAULT_GRID = {"tokens-per-gpu": "128,512,2048,4096", "routing": "uniform,skewed",
                "placement": "contiguous,eplb", "schedule": "bulk,fused"}
_BOOL_FLAGS = ("analytic", "no-shared")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("spec", nargs="?", metavar="SPEC", help="TOML file with [fixed] and [grid] tables of simulate options")
    a("--out", default="sweep-out", help="output folder: results.parquet and sweep.png (default sweep-out)")
    a("--workers", type=int, help="LocalCluster worker processes (default: CPU count; 0: in this process)")
    a("--jobs", type=int, dest="workers", help=argparse.SUPPRESS)  # the old name
    a("--scheduler", metavar="ADDRESS", help="run on an existing Dask cluster (tcp://host:8786)")
    a("--retry-failed", action="store_true", help="run again the points that failed last time")
    a("--dry-run", action="store_true", help="check the SPEC and count the points, run nothing")
    a("--no-plot", action="store_true", help="do not write sweep.png")
    a("--json", action="store_true", help="print this sweep's rows as JSON lines")
    a("--quiet", action="store_true", help="no progress")
    b = parser.add_argument_group("ranking results")
    b.add_argument("--best", metavar="DIR", help="print the best points of a finished (or partial) sweep in DIR")
    b.add_argument("--objective", default="layer_time_us", help="column to minimize (layer_time_us, exposed_comm_us)")
    b.add_argument("--top", type=int, default=10, help="how many points (default 10)")
    g = parser.add_argument_group("the grid as flags (instead of a SPEC): comma-separated values")
    for name, opt in OPTIONS.items():
        if name in _BOOL_FLAGS:
            g.add_argument(f"--{name}", action="store_true", default=None, help=opt.help)
        else:
            g.add_argument(f"--{name}", metavar="V1,V2", help=opt.help)
    for name in PROFILE_FLAGS:
        g.add_argument(f"--{name}", metavar="V1,V2", help="profile override, in the profile's unit")
    g.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2", help="sweep any profile field")


def _value(text: str):
    """One comma-separated item as TOML would read it: int, float, true/false, else a string."""
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def spec_from_flags(args: argparse.Namespace) -> dict:
    """The SPEC dict the flags describe; DEFAULT_GRID fills the options not given."""
    from .spec import SpecError

    given: dict[str, str] = {}
    for name in [*OPTIONS, *PROFILE_FLAGS]:
        v = getattr(args, name.replace("-", "_"), None)
        if v is not None:
            given[name] = "true" if v is True else str(v)
    for s in args.set:
        key, eq, vals = s.partition("=")
        if not eq:
            raise SpecError(f"--set expects KEY=V1,V2, got {s!r}")
        given[key.strip()] = vals
    fixed, grid = {}, {}
    for name, text in {**DEFAULT_GRID, **given}.items():
        items = [i for i in text.split(",")]
        if any(not i.strip() for i in items):
            raise SpecError(f"--{name}: empty item in {text!r}")
        vals = [_value(i) for i in items]
        if len(vals) == 1:
            fixed[name] = vals[0]
        else:
            grid[name] = vals
    return {"fixed": fixed, "grid": grid}


def _flags_given(args: argparse.Namespace) -> list[str]:
    names = [n for n in [*OPTIONS, *PROFILE_FLAGS] if getattr(args, n.replace("-", "_"), None) is not None]
    return [f"--{n}" for n in names] + (["--set"] if args.set else [])


def _error(msg: str) -> int:
    print(f"megamoe sweep: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from . import SweepError, as_spec, best, check_dependencies, check_out, load_results
    from .spec import SpecError

    try:
        if args.best:
            check_dependencies(("pandas", "pyarrow"))
            from pathlib import Path

            if not Path(args.best).is_dir():
                raise SweepError(f"--best {args.best!r} is not a folder")
            if args.top < 1:
                raise SweepError(f"--top must be >= 1, got {args.top}")
            df = load_results(args.best)
            if df.empty:
                raise SweepError(f"no results in {args.best!r}")
            top = best(df, args.objective, args.top)
            _print_best(top, df, args.objective)
            return 0
        if args.spec and _flags_given(args):
            raise SpecError(f"give the grid in SPEC or as flags, not both ({', '.join(_flags_given(args))})")
        spec = as_spec(args.spec if args.spec else spec_from_flags(args))
        check_dependencies(tuple(n for n in ("dask", "distributed", "pyarrow", "pandas", "matplotlib")
                                 if not (args.no_plot and n == "matplotlib")))
        out = check_out(args.out)
        if args.workers is not None and args.workers < 0:
            raise SweepError(f"--workers must be >= 0, got {args.workers}")
    except (SpecError, SweepError) as exc:
        return _error(str(exc))
    if args.dry_run:
        from .store import Store

        pts = spec.points()
        done = Store(out).done(args.retry_failed) if out.is_dir() else set()
        new = sum(p.point_id not in done for p in pts)
        print(f"{len(pts)} points, {len(pts) - new} already in {out}, {new} to run")
        return 0
    from . import run_sweep

    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        df = run_sweep(spec, out, workers=args.workers, scheduler=args.scheduler, retry_failed=args.retry_failed,
                       progress=not args.quiet, plot=not args.no_plot)
    except OSError as exc:  # e.g. the scheduler cannot be reached
        return _error(str(exc))
    finally:
        signal.signal(signal.SIGTERM, old)
    c = df.attrs.get("counts", {})
    if args.json:
        for r in df.to_dict(orient="records"):
            print(json.dumps(r, default=str))
    else:
        from megamoe.cli import make_console

        console = make_console()
        ok = df[df["error"].isna()] if "error" in df else df
        if not ok.empty:
            _print_best(best(ok, "layer_time_us", 5), ok, "layer_time_us", console)
        errs = df["error"].dropna()
        if len(errs):
            console.print(f"{len(errs)} points failed, e.g. {errs.iloc[0]}", markup=False)
        plot_note = " and sweep.png" if (out / "sweep.png").exists() and not args.no_plot else ""
        console.print(f"wrote {out / 'results.parquet'}{plot_note}: {c.get('ran', 0)} points run, "
                      f"{c.get('skipped', 0)} already there, {c.get('failed', 0)} failed", markup=False)
    if c.get("interrupted"):
        print(f"megamoe sweep: interrupted; {c.get('ran', 0)} points saved, rerun the same command to resume",
              file=sys.stderr)
        return 130
    return 0


def _raise_interrupt(signum, frame):  # SIGTERM stops a sweep as Ctrl-C does: finished batches are kept
    raise KeyboardInterrupt


def _print_best(top, df, objective: str, console=None) -> None:
    from megamoe.cli import make_console

    from . import input_columns

    console = console or make_console()
    ins = [c for c in input_columns(df) if df[c].astype(str).nunique() > 1] or input_columns(df)[:4]
    cols = [*ins, "layer_time_us", "exposed_comm_us", "expert_compute_us", "load_imbalance_wait_us"]
    if objective not in cols:
        cols.append(objective)
    cols = [c for c in dict.fromkeys(cols) if c in top.columns]
    console.print(f"best {len(top)} of {len(df)} points by {objective}:", markup=False)
    console.print(top[cols].to_string(index=False, float_format=lambda v: f"{v:,.1f}"), markup=False)
