"""Synchronisation inside one persistent Triton kernel: flag handoff, grid barrier, tickets (issue 7).

    python benchmarks/bench_sync.py [--out DIR] [--reps 5]

Runs only the handoff, barrier and ticket microbenchmarks of ``megamoe.calibrate.microbench`` (global
int32 counters, ``tl.atomic_add(..., sem="release")`` after ``tl.debug_barrier()``, spins on
``tl.atomic_add(ptr, 0, sem="acquire")``) and prints the figures; with ``--out`` also writes
``DIR/sync.json`` with the raw points and provenance. Needs a CUDA GPU; about 10 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for sync.json")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_sync: needs a CUDA GPU", file=sys.stderr)
        return 2
    from megamoe.calibrate import measure_launch, measure_sync, provenance

    prov = provenance()
    S = prov["num_sms"]
    sync = measure_sync(args.reps, S)
    launch = measure_launch(args.reps)
    print(f"{prov['gpu']}, triton {prov['triton']}, torch {prov['torch']}, {prov['date']}")
    for h in sync["handoff"]:
        print(f"flag handoff, {h['programs']:>4} programs: {h['s_per_handoff'] * 1e6:6.3f} us per handoff")
    for b in sync["barrier"]:
        print(f"grid barrier, {b['programs']:>4} programs: {b['s_per_barrier'] * 1e6:6.3f} us per barrier")
    for t in sync["ticket"]:
        print(f"ticket,       {t['programs']:>4} programs: {t['s_per_ticket'] * 1e9:6.1f} ns per ticket")
    print(f"empty kernel in a CUDA graph:      {launch['launch_gap_s'] * 1e6:6.3f} us per kernel "
          f"(+ {launch['graph_fixed_s'] * 1e6:.2f} us per replay)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sync.json").write_text(json.dumps({"provenance": prov, "sync": sync, "launch": launch}, indent=1))
        print(f"wrote {out / 'sync.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
