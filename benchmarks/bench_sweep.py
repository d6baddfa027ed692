"""Speed of ``megamoe sweep`` at scale (a benchmark, not a test).

Targets (issue 11), on this project's 2-core machine with a LocalCluster of 2 workers:
* event: 1000 event-model points of the default NVL72 DeepSeek-V3 layer (4096 tokens per GPU) in
  20 minutes or less. Grid: 4 placements x 5 routings x 5 minibatch sizes (100 workloads) x
  2 schedules x 5 communication-SM counts.
* analytic: 100,000 analytic points in 60 s or less. Grid: 5 token counts x 5 routings x
  4 placements (100 workloads) x 2 schedules x 10 communication-SM counts x 2 dtypes x 5 link and
  5 HBM bandwidths (25 system variants).

Each part runs from an empty output folder, so the figure includes the cluster start, numba's
compile in every worker, the workload builds, writing Parquet and the plot: the wall time a user
waits for ``megamoe sweep SPEC --out DIR``. Where the time goes is read off the rows: the sum of
``workload_s`` (workload builds) and of ``wall_s`` (the points, builds included) over the workers.
Appends one JSON line per part to benchmarks/results/cpu/sweep_speed/sweep_speed.jsonl with date, machine, versions
and git commit.

    python benchmarks/bench_sweep.py [--part event|analytic|both] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

ROUTINGS = ["uniform", "skewed", "skewed:4", "zipf:1.0", "hot:0.3"]
PLACEMENTS = ["contiguous", "round_robin", "random", "eplb"]
SPECS = {
    "event": {
        "fixed": {"model": "deepseek-v3", "system": "gb200-nvl72", "tokens-per-gpu": 4096},
        "grid": {"placement": PLACEMENTS, "routing": ROUTINGS, "minibatch": [512, 1024, 2048, 4096, "auto"],
                 "schedule": ["fused", "bulk"], "comm-sms": [8, 12, 16, 24, 32]},
    },
    "analytic": {
        "fixed": {"model": "deepseek-v3", "system": "gb200-nvl72", "analytic": True},
        "grid": {"tokens-per-gpu": [128, 512, 1024, 2048, 4096], "routing": ROUTINGS, "placement": PLACEMENTS,
                 "schedule": ["fused", "bulk"], "comm-sms": [4, 6, 8, 10, 12, 16, 20, 24, 32, 48],
                 "dtype": ["bf16", "fp8"], "link-bandwidth": [25e9, 37.5e9, 50e9, 75e9, 100e9],
                 "hbm-bandwidth": [4e12, 6e12, 8e12, 10e12, 12e12]},
    },
}
TARGET_S = {"event": 1200.0, "analytic": 60.0}


def _provenance() -> dict:
    import dask
    import distributed
    import numba
    import numpy
    import pandas
    import pyarrow
    import simpy

    from megamoe.results import machine

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "megamoe", "simulator"], capture_output=True,
                                    text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", None
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "versions": {"python": platform.python_version(), "numpy": numpy.__version__, "simpy": simpy.__version__,
                         "numba": numba.__version__, "dask": dask.__version__, "distributed": distributed.__version__,
                         "pyarrow": pyarrow.__version__, "pandas": pandas.__version__},
            "git_commit": commit, "uncommitted_changes": dirty}


def bench(part: str, workers: int, out: Path | None) -> dict:
    from megamoe.sweep import parse_spec, run_sweep

    spec = parse_spec(SPECS[part])
    with tempfile.TemporaryDirectory() as tmp:
        folder = out or Path(tmp) / part
        t0 = time.perf_counter()
        df = run_sweep(spec, folder, workers=workers, progress=True)
        wall = time.perf_counter() - t0
    n = len(df)
    ok = int(df["error"].isna().sum())
    return {
        "benchmark": "sweep_speed", "part": part, "points": n, "points_ok": ok, "points_failed": n - ok,
        "workers": workers, "wall_s": wall, "points_per_s": n / wall, "target_s": TARGET_S[part],
        "met": wall <= TARGET_S[part],
        "worker_time_s": {"points_incl_builds": float(df["wall_s"].sum()), "workload_builds": float(df["workload_s"].sum()),
                          "workloads_built": int((df["workload_s"] > 0).sum()),
                          "per_point_excl_builds_us": float((df["wall_s"] - df["workload_s"]).median() * 1e6)},
        "overhead_s": wall - float(df["wall_s"].sum()) / workers,  # cluster start, scheduling, writing, the plot
        "spec": SPECS[part],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("event", "analytic", "both"), default="both")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="write the sweep here instead of a temporary folder")
    ap.add_argument("--results", type=Path, default=Path(__file__).with_name("results") / "cpu" / "sweep_speed" / "sweep_speed.jsonl")
    args = ap.parse_args()
    prov = _provenance()
    for part in (("analytic", "event") if args.part == "both" else (args.part,)):
        row = {**bench(part, args.workers, args.keep / part if args.keep else None), **prov}
        w = row["worker_time_s"]
        print(f"{part}: {row['points']} points ({row['points_failed']} failed) in {row['wall_s']:.1f} s "
              f"with {args.workers} workers = {row['points_per_s']:,.0f} points/s (target {row['target_s']:.0f} s: "
              f"{'met' if row['met'] else 'MISSED'}); worker time {w['points_incl_builds']:.1f} s, of which "
              f"{w['workload_builds']:.1f} s building {w['workloads_built']} workloads; median point "
              f"{w['per_point_excl_builds_us']:,.0f} us; overhead {row['overhead_s']:.1f} s", flush=True)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with args.results.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
