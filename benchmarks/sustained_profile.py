"""A copy of a profile with ``kernel_model.sustained_mma`` from a ``bench_sustained.py`` run, for
post-hoc re-predictions of stored validation rows under ``cost.USE_SUSTAINED_CLOCKS``.

    python benchmarks/sustained_profile.py SUSTAINED.jsonl PROFILE.json OUT.json [--min-ms 4] [--run AT]
    megamoe validate --report DIR --repredict OUT.json --switch USE_SUSTAINED_CLOCKS=on --out DIR2

The rows (one per graph of N back-to-back cuBLAS matmuls, each replayed after an idle pause; median
seconds) go through the calibrate step's own fit (``megamoe.calibrate.sustained_fit``: the average
rate over each graph / the best graph's, against its seconds). Graphs shorter than ``--min-ms`` are
left out: a replay's fixed cost is no clock effect (run AT: the one-matmul graph, 1.4 ms, read 2.2%
below the four-matmul one). The table's source names the bench run and says it is not the calibrate
step's; the rest of the profile is PROFILE's, unchanged (its name gets "+sustained-bench").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def sustained_table(rows: list[dict], *, min_s: float, source: str) -> tuple[dict, dict]:
    """(kernel_model.sustained_mma, the fit) from bench_sustained rows ({"matmuls", "seconds",
    "size", "sm_clock_mhz_after", "pause_s"})."""
    from megamoe.calibrate import sustained_fit

    keep = sorted((r for r in rows if r["seconds"] >= min_s), key=lambda r: r["matmuls"])
    if not keep:
        raise ValueError(f"no graph of at least {min_s * 1e3:g} ms in the rows")
    sizes = {int(r["size"]) for r in keep}
    if len(sizes) != 1:
        raise ValueError(f"the rows mix matmul sizes {sorted(sizes)}")
    n = sizes.pop()
    clock = [(r.get("sm_clock_mhz_after") or [None])[-1] for r in keep]
    fit = sustained_fit(2.0 * n ** 3, [[r["matmuls"], r["seconds"], c] for r, c in zip(keep, clock)])
    table = {"unit": "fraction", "over": ["busy_s"], "points": fit["points"], "source": source,
             "note": (f"cuBLAS {n}^3 bf16 matmuls back to back in one CUDA graph after {keep[0].get('pause_s', '?')} s "
                      f"idle (graphs of {', '.join(str(r['matmuls']) for r in keep)} matmuls): the average rate over "
                      f"the graph / the best graph's ({fit['reference_flops_per_s'] / 1e12:.1f} TFLOP/s); read "
                      "behind cost.USE_SUSTAINED_CLOCKS")}
    return table, fit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sustained", help="bench_sustained.py's sustained.jsonl")
    p.add_argument("profile", help="the profile.json to copy")
    p.add_argument("out", help="the copy with kernel_model.sustained_mma")
    p.add_argument("--min-ms", type=float, default=4.0, help="graphs shorter than this are left out (default 4)")
    p.add_argument("--run", default=None, help="the run's name for the source (e.g. 'H200 run AT')")
    args = p.parse_args(argv)
    from megamoe.simulator.hardware import validate

    rows = [json.loads(line) for line in Path(args.sustained).read_text().splitlines() if line.strip()]
    first = rows[0] if rows else {}
    run = args.run or f"{first.get('gpu', '?')} {str(first.get('date', '?'))[:10]}"
    source = (f"benchmarks/bench_sustained.py, {run} ({args.sustained}; commit {first.get('commit', '?')}): "
              "not the calibrate step sustained; merged by benchmarks/sustained_profile.py for post-hoc re-predictions")
    table, fit = sustained_table(rows, min_s=args.min_ms * 1e-3, source=source)
    d = json.loads(Path(args.profile).read_text())
    d.setdefault("kernel_model", {})["sustained_mma"] = table
    d["name"] = f"{d['name']}+sustained-bench"
    validate(d, origin=args.out)  # the loader takes it
    Path(args.out).write_text(json.dumps(d, indent=1))
    for (n, t, r), (_, ratio) in zip(fit["rates"], fit["points"]):
        print(f"{n:4d} matmuls {t * 1e3:8.2f} ms  {r / 1e12:7.1f} TFLOP/s  ratio {ratio:.4f}")
    for t0, t1, r in fit["marginal"]:
        print(f"  {t0 * 1e3:7.2f} -> {t1 * 1e3:7.2f} ms: the extra matmuls at {r / 1e12:7.1f} TFLOP/s "
              f"({r / fit['reference_flops_per_s']:.4f})")
    print(f"wrote {args.out} (profile {d['name']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
