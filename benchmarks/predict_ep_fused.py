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
import datetime as _dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ep  # noqa: E402

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


def fused_tiles(P_r: int, H: int, I: int, pairs: int) -> dict:
    """kernels/ep_fused.fused_tiles' pick for an H200 in bfloat16 (Triton 3.6.0, the GPU image's)."""
    from megamoe.kernels.ep_fused import fused_tiles_of

    return fused_tiles_of(P_r, H, I, pairs, gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0",
                          interpret=False)


def fused_plans(cfg, wl, max_rows, programs: int):
    """(pull schedule, the R ranks' FusedEPPlan, their tiles, the max_rows used) of a workload."""
    import numpy as np

    from megamoe.reference.ep import local_slots, plan_pull
    from megamoe.reference.ep_tasks import META_BYTES_PER_PICK, auto_max_rows, plan_fused_ep, slot_pair_counts

    sched, _ = bench_ep.schedule(wl)
    R, T = wl.num_gpus, wl.tokens_per_gpu
    H, I, K = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    slot_rank = wl.placement.slot_rank.astype(np.int64)
    P = slot_rank.size
    if max_rows == "auto":
        max_rows = auto_max_rows(sched.traffic(), programs)
    pull = plan_pull(sched, H, 2, max_rows=None if max_rows == "none" else max_rows, meta_bytes=K * META_BYTES_PER_PICK)
    counts = np.stack([slot_pair_counts(wl.slot_topk_idx[r * T:(r + 1) * T], P) for r in range(R)])
    plans, tiles = [], []
    for r in range(R):
        slots = local_slots(slot_rank, r)
        t = fused_tiles(slots.size, H, I, int(counts[:, slots].sum()))
        plans.append(plan_fused_ep(pull, r, counts, slot_rank, top_k=K, hidden_size=H, intermediate_size=I,
                                   block_m=t["BM"], block_n1=t["BN1"], block_n2=t["BN2"], act_bytes=2,
                                   weight_bytes=2.0))
        tiles.append(t)
    return pull, plans, tiles, max_rows


def predict(case: dict, max_rows, system: str = SYSTEM) -> dict:
    """One row: the fused EP layer's prediction and bench_ep's bulk-synchronous one for the same case."""
    from megamoe.simulator.ep_task_cost import predict_ep_layer
    from megamoe.simulator.hardware import load_profile, override
    from megamoe.simulator.schedules import layer_start_s

    bulk = bench_ep.predict(case, system)
    cfg, wl = bench_ep.workload(case)
    p = override(load_profile(system), gpus=case["ranks"])
    programs = p.num_sms  # kernels/ep_fused.launch_fused: one program per SM
    pull, plans, tiles, used = fused_plans(cfg, wl, max_rows, programs)
    layer = predict_ep_layer(plans, pull, case["tokens_per_rank"], p, num_programs=programs,
                             num_warps=[t["num_warps"] for t in tiles])
    start = layer_start_s(p, cfg, case["tokens_per_rank"])
    slow = layer["ranks"][layer["slowest_rank"]]
    us = 1e6
    fused_us = (layer["time_s"] + start) * us
    return {"kind": "prediction", "schedule": "fused_ep", **case, "system": system, "max_rows": used,
            "programs": programs, "tiles": tiles, "predicted_layer_us": fused_us,
            "terms_us": {"start": start * us, **{k: v * us for k, v in layer["terms_s"].items()}},
            "fused_launch_us": [t * us for t in layer["fused_time_s"]], "slowest_rank": layer["slowest_rank"],
            "slowest_tasks": plans[layer["slowest_rank"]].tasks_per_kind(),
            "slowest_busy_us": {k: v * us for k, v in slow["busy_s"].items()},
            "slowest_span_us": {k: [a * us, b * us] for k, (a, b) in slow["span_s"].items()},
            "slowest_critical_path_us": {k: v * us for k, v in slow["critical_path_s"].items()},
            "slowest_link_bytes": slow["link_bytes"],
            "bulk": {k: bulk.get(k) for k in ("predicted_layer_us", "predicted_dispatch_us", "predicted_combine_us",
                                              "predicted_expert_us", "schedule_matches_simulator")},
            "fused_over_bulk": fused_us / bulk["predicted_layer_us"] if bulk.get("predicted_layer_us") else None,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


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
                row = predict(case, mr, args.system)
                print(line(row), flush=True)
                if out is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with open(out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
