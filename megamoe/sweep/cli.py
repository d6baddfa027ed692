"""``megamoe sweep SPEC.toml | --FLAG V1,V2 ... --out DIR``: run a grid on Dask into Parquet;
``megamoe sweep --best DIR``: rank its results. A bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys

from .spec import OPTIONS, PROFILE_FLAGS

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
    b.add_argument("--objective", default="layer_time_us", help="numeric column to minimize (layer_time_us, "
                   "exposed_comm_us, ...); where tokens-per-gpu varies, points are ranked within each token count")
    b.add_argument("--top", type=int, default=10, help="how many points (per token count where it varies; default 10)")
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
    """The SPEC dict the flags describe: only the options given; the others keep simulate's defaults."""
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
    if not given:
        raise SpecError("nothing to sweep: give a SPEC file or the grid as flags, e.g. --tokens-per-gpu 128,1024 "
                        "--placement contiguous,eplb")
    fixed, grid = {}, {}
    for name, text in given.items():
        items = [i for i in text.split(",")]
        if any(not i.strip() for i in items):
            raise SpecError(f"--{name}: empty item in {text!r}")
        vals = [_value(i) for i in items]
        if len(vals) == 1:
            fixed[name] = vals[0]
        else:
            grid[name] = vals
    return {"fixed": fixed, "grid": grid}


def defaults_note(spec) -> str:
    """The options a flag-built sweep leaves at simulate's defaults, as one line."""
    left = [f"{n}={o.default}" for n, o in OPTIONS.items() if o.default is not None and n not in spec.columns
            and n not in _BOOL_FLAGS]
    return "fixed at simulate's defaults: " + ", ".join(left) if left else ""


#: A Dask scheduler address: [protocol://]host:port.
ADDRESS = re.compile(r"([a-z]+://)?[^\s/:]+(:\d+)|[a-z]+://\S+")


def _flags_given(args: argparse.Namespace) -> list[str]:
    names = [n for n in [*OPTIONS, *PROFILE_FLAGS] if getattr(args, n.replace("-", "_"), None) is not None]
    return [f"--{n}" for n in names] + (["--set"] if args.set else [])


def _error(msg: str) -> int:
    print(f"megamoe sweep: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from . import SweepError, as_spec, best, check_dependencies, check_out, check_workers, load_results
    from .spec import SpecError

    try:
        if args.best:
            if args.spec or _flags_given(args) or args.dry_run or args.retry_failed:
                given = [args.spec or "", *_flags_given(args), *(["--dry-run"] if args.dry_run else []),
                         *(["--retry-failed"] if args.retry_failed else [])]
                raise SweepError(f"--best ranks the results already in {args.best!r} and runs nothing: drop "
                                 f"{' '.join(g for g in given if g)} (or drop --best to run a sweep)")
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
        check_workers(args.workers, args.scheduler)
        if args.scheduler is not None and not ADDRESS.fullmatch(args.scheduler):
            raise SweepError(f"--scheduler {args.scheduler!r}: give a Dask scheduler address, e.g. tcp://host:8786")
        if args.retry_failed:
            from .store import Store

            if not out.is_dir() or Store(out).read().empty:
                raise SweepError(f"--retry-failed: {str(out)!r} holds no results of an earlier run; give that run's "
                                 "--out (or drop --retry-failed to start a sweep)")
    except (SpecError, SweepError) as exc:
        return _error(str(exc))
    if not args.spec and not args.quiet and defaults_note(spec):
        print(f"megamoe sweep: {defaults_note(spec)}", file=sys.stderr)
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
        errs = df["error"].dropna() if "error" in df else df.iloc[:0]
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

    from . import input_columns, varied_columns, with_defaults

    console = console or make_console()
    ins = varied_columns(df) or input_columns(df)[:4]
    cols = [*ins, "layer_time_us", "exposed_comm_us", "expert_compute_us", "load_imbalance_wait_us"]
    if objective not in cols:
        cols.append(objective)
    cols = [c for c in dict.fromkeys(cols) if c in top.columns]
    per = top.attrs.get("ranked_within")
    head = f"best {len(top)} of {len(df)} points by {objective}"
    if per:
        head += (f" (up to {top.attrs['top']} per {per}, ranked within each: a layer's time grows with its batch, "
                 "so across batches the smallest would always win)")
    console.print(head + ":", markup=False)
    console.print(with_defaults(top)[cols].to_string(index=False, float_format=lambda v: f"{v:,.1f}"), markup=False)
