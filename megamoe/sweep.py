"""``megamoe sweep``: run the simulator over a grid of choices and plot the trade-offs.

Every axis takes a comma-separated list; the grid is their product. Each point is one
``megamoe.simulator.simulate`` call (or the analytic estimate alone, with ``--analytic``), so a
sweep reports exactly what ``megamoe simulate`` would for the same arguments.

Writes ``sweep.csv`` (one row per point: the inputs, layer time, analytic bound, breakdown,
imbalance) and ``sweep.png`` (layer time against the first axis with more than one value, one
line per combination of the others) into ``--out``. Points run in parallel processes with
``--jobs``; progress is shown on the terminal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

#: Sweepable axes: CLI flag -> (simulate() keyword, parser of one value).
AXES = {
    "model": ("config", str),
    "system": ("system", str),
    "tokens-per-gpu": ("tokens_per_gpu", int),
    "routing": ("routing", str),
    "placement": ("placement", str),
    "schedule": ("schedule", str),
    "comm-sms": ("comm_sms", int),
    "minibatch": ("minibatch", int),
    "dtype": ("dtype", str),
    "gpus": ("gpus", int),
}
DEFAULTS = {
    "model": "deepseek-v3",
    "system": "gb200-nvl72",
    "tokens-per-gpu": "128,512,2048,4096",
    "routing": "uniform,skewed",
    "placement": "contiguous,eplb",
    "schedule": "bulk,fused",
}


class SweepError(ValueError):
    """A sweep axis has a bad value; the message names the axis."""


def parse_axis(flag: str, text: str) -> list:
    _, conv = AXES[flag]
    out = []
    for item in (s.strip() for s in str(text).split(",")):
        if not item:
            raise SweepError(f"--{flag}: empty item in {text!r}")
        try:
            out.append(conv(item))
        except ValueError:
            raise SweepError(f"--{flag}: {item!r} is not a valid {conv.__name__}") from None
    return out


def grid(axes: dict[str, list]) -> list[dict]:
    """The product of the axes as a list of {flag: value} points, in a stable order."""
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def run_point(point: dict, analytic: bool = False, seed: int = 0) -> dict:
    """One simulator call; returns a flat row (inputs, times in us, breakdown, imbalance)."""
    from megamoe.simulator import simulate

    kw = {AXES[k][0]: v for k, v in point.items()}
    overrides = {}
    if "gpus" in kw:
        overrides["num_gpus"] = kw.pop("gpus")
    t0 = time.perf_counter()
    if analytic:
        kw["analytic_only"] = True
    res = simulate(**kw, seed=seed, overrides=overrides or None)
    row = dict(point)
    row["layer_time_us"] = res.layer_time_us
    row["analytic_us"] = res.analytic_us
    for k, v in res.breakdown_us.items():
        row[f"{k}_us"] = v
    for k, v in res.imbalance.items():
        row[f"imbalance_{k}"] = v
    row["wall_s"] = time.perf_counter() - t0
    return row


def run_sweep(axes: dict[str, list], *, analytic: bool = False, seed: int = 0, jobs: int = 1,
              progress: bool = True) -> list[dict]:
    """Run every point of the grid; rows come back in grid order."""
    points = grid(axes)
    from rich.progress import Progress

    rows: list[dict | None] = [None] * len(points)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("simulating", total=len(points))
        if jobs <= 1:
            for i, p in enumerate(points):
                rows[i] = run_point(p, analytic, seed)
                bar.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(run_point, p, analytic, seed): i for i, p in enumerate(points)}
                for fut in futures:
                    rows[futures[fut]] = fut.result()
                    bar.advance(task)
    return rows  # type: ignore[return-value]


def plot(rows: list[dict], axes: dict[str, list], path: Path) -> Path | None:
    """Layer time against the first axis with several values; a line per combination of the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    varying = [k for k, v in axes.items() if len(v) > 1]
    if not varying:
        return None
    x_axis, others = varying[0], varying[1:]
    numeric_x = AXES[x_axis][1] is int
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for combo in itertools.product(*(axes[o] for o in others)):
        sel = [r for r in rows if all(r[o] == c for o, c in zip(others, combo))]
        label = ", ".join(f"{o}={c}" for o, c in zip(others, combo)) or "layer time"
        xs = [r[x_axis] for r in sel]
        ax.plot(xs if numeric_x else range(len(xs)), [r["layer_time_us"] for r in sel], marker="o", label=label)
        if not numeric_x:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    if numeric_x and len(axes[x_axis]) > 2 and min(axes[x_axis]) > 0:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    fixed = ", ".join(f"{k}={v[0]}" for k, v in axes.items() if len(v) == 1)
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(f"Predicted MoE layer time ({fixed})" if fixed else
                                          "Predicted MoE layer time", 90)), fontsize=10)
    ax.set_xlabel(x_axis)
    ax.set_ylabel("layer time (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (_, conv) in AXES.items():
        default = DEFAULTS.get(flag)
        parser.add_argument(f"--{flag}", default=default,
                            help=f"comma-separated {conv.__name__} values" + (f" (default {default})" if default else ""))
    parser.add_argument("--analytic", action="store_true", help="analytic estimate only (milliseconds a point)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="parallel processes")
    parser.add_argument("--out", default="sweep-out", help="folder for sweep.csv and sweep.png")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")


def run(args: argparse.Namespace) -> int:
    import sys

    axes = {}
    try:
        for flag in AXES:
            val = getattr(args, flag.replace("-", "_"))
            if val is not None:
                axes[flag] = parse_axis(flag, val)
    except SweepError as exc:
        print(f"megamoe sweep: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"megamoe sweep: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        rows = run_sweep(axes, analytic=args.analytic, seed=args.seed, jobs=args.jobs,
                         progress=sys.stderr.isatty())
    except ValueError as exc:  # bad model, system, routing ... named by the simulator
        print(f"megamoe sweep: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    df.to_csv(out / "sweep.csv", index=False)
    png = plot(rows, axes, out / "sweep.png")
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        from megamoe.cli import make_console

        console = make_console()
        show = [c for c in df.columns if c in AXES or c in ("layer_time_us", "analytic_us")]
        console.print(df[show].to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
        console.print(f"wrote {out / 'sweep.csv'}" + (f" and {png}" if png else ""))
    return 0
