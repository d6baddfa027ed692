"""The fused expert-parallel layer's predicted time beside bench_ep.py's bulk-synchronous prediction (CPU, seconds).

    python benchmarks/predict_ep_fused.py --preset qwen3-30b-a3b --ranks 2,4,8 --tokens 128,2048 \
        --routing uniform,skewed [--placement contiguous] [--max-rows auto,none] [--out FILE]

Shape legend: R ranks, T tokens per rank, P slots, P_r slots of one rank, K top-k, H hidden, I expert width.

For each case (preset, R, T, routing, placement, max_rows) on the ``--system`` profile (hgx-h200):

    workload  bench_ep.workload: the simulator's build_workload and its placement's slot ids, so both
              predictions below see the same tokens as a bench_ep.py run of the same case
    bulk      bench_ep.predict: the "prediction" row bench_ep.py writes (simulate_workload, the
              bulk-synchronous schedule, routed experts only); its layer time counts the layer's start
              (a launch, the router GEMM, top-k) and the closing barrier
    fused     every rank's plan, as kernels/ep_symmetric.py's fused step builds it: reference.ep.plan_pull
              (bf16 rows, topk_idx + topk_weights + positions as metadata, copies of at most max_rows
              rows), slot_pair_counts, reference.ep_tasks.plan_fused_ep with the GEMM tiles
              kernels/ep_fused.fused_tiles picks (kernels.configs.select_config for P_r local slots, one
              pick per pair, T = the rank's pairs, "NVIDIA H200", bfloat16, Triton 3.6.0), num_programs = SMs
              (launch_fused's default); simulator.ep_task_cost.predict_ep_layer; plus the same layer
              start as the bulk row (schedules.layer_start_s), so the two layer times compare

``--max-rows``: none (one copy per peer, plan_pull's default), an integer, or auto (the fused step's
default, reference.ep_tasks.auto_max_rows: ceil(the most rows a rank receives / programs)), so one wave
of copies fills the launch's programs (the per-program copy
rate is capped, simulator/ep_task_cost.py). Prints one line per case; ``--out`` appends JSON lines
(``"kind": "prediction", "schedule": "fused_ep"``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench_ep  # the benchmark beside this script (its folder is the script's sys.path[0])

SYSTEM = bench_ep.SYSTEM


def _max_rows(text: str) -> list:
    out = []
    for s in (x.strip() for x in text.split(",") if x.strip()):
        if s in ("none", "auto"):
            out.append(s)
        elif s.isdigit() and int(s) > 0:
            out.append(int(s))
        else:
            raise argparse.ArgumentTypeError(f"max rows must be none, auto or a positive integer, got {s!r}")
    if not out:
        raise argparse.ArgumentTypeError(f"expected none, auto or positive integers, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-30b-a3b", help="model preset (kernels.bench.bench_config)")
    p.add_argument("--ranks", type=bench_ep._ints, default=[2, 4, 8], help="world sizes, e.g. 2,4,8")
    p.add_argument("--tokens", type=bench_ep._ints, default=[128, 2048], help="tokens per rank")
    p.add_argument("--routing", type=bench_ep._names(bench_ep.ROUTINGS), default=["uniform", "skewed"])
    p.add_argument("--placement", type=bench_ep._names(bench_ep.PLACEMENTS), default=["contiguous"])
    p.add_argument("--max-rows", type=_max_rows, default=["auto"], help="rows per copy: none, auto or N (a list)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=SYSTEM, help="simulator profile")
    p.add_argument("--out", default=None, help="append JSON lines here")
    return p


def line(row: dict) -> str:
    span = row["slowest_span_us"]
    ends = ", ".join(f"{k} {span[k][1]:.1f}" for k in ("pull", "gemm1", "gemm2", "push") if k in span)
    b = row["bulk"]
    return (f"{row['preset']} R={row['ranks']} T={row['tokens_per_rank']} {row['routing']}/{row['placement']} "
            f"max_rows={row['max_rows']}: fused {row['predicted_layer_us']:.1f} us (launch "
            f"{row['terms_us']['fused']:.1f} on rank {row['slowest_rank']}, ends: {ends or 'no tasks'}) | bulk "
            f"{b['predicted_layer_us']:.1f} us (dispatch {b['predicted_dispatch_us']:.1f}, expert "
            f"{b['predicted_expert_us']:.1f}, combine {b['predicted_combine_us']:.1f})")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out) if args.out else None
    for R in args.ranks:
        for case in bench_ep.cases(argparse.Namespace(preset=args.preset, tokens=args.tokens, routing=args.routing,
                                                      placement=args.placement, seed=args.seed, cpu_smoke=False), R):
            for mr in args.max_rows:
                row = bench_ep.predict_fused(case, mr, args.system)
                print(line(row), flush=True)
                if out is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with open(out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
