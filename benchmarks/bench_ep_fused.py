"""Each rank's part of the one-sided EP layer on ONE GPU, its ranks emulated: the fused launch against the phases.

    source benchmarks/device.sh   # on a copied tree on the GPU machine (MEGAMOE_COMMIT set first)
    python benchmarks/bench_ep_fused.py --out DIR --preset qwen3-30b-a3b --ranks 2,4,8 --tokens 128,1024

Shape legend: R emulated ranks, T tokens per rank, H hidden, K top-k.

Every rank's symmetric buffers live in this GPU's memory (``SymmetricBuffers.emulated``), so a "peer"
read or write is a local HBM access: this measures what one rank's launch does with the rows once they
can be read (the overlap of its copies, expert tiles and push-backs, and the host syncs the phases
need), not NVLink. Workload, placement and weights are bench_ep.py's (the simulator's routing, random
bf16 weights per slot). For each case, every rank packs (untimed), then for each rank in turn, timed
with CUDA events, the middle of its call:

    phased   pull (three copy launches) + compute (host sync, plan_receive, moe_experts on the local
             pairs, the partial sum) + push (a copy launch) + the LANDED signal
    fused    the one launch of kernels/ep_fused.py (pulls, pair placement, GEMM tiles, push-backs)
             + the LANDED signal, copies cut by reference.ep_tasks.auto_max_rows (the fused default)
    fused_uncut  the same with one copy per peer (each copy one task on one program)

then every rank finishes (untimed). ``--trace``: one more call of each fused path with every task's
%globaltimer stamps (kernels.ep_fused.trace_summary: per kind, the mean wait before a task's work, the
mean work, the first start and the last end), per rank, printed and in the row's "trace". A row per (case, path) with each rank's median over --reps and the
slowest rank's; checks: every path's y bitwise the first path's on every rank (the same GEMM tiles),
bitwise from call to call, finite. The fused plan's task counts and bytes are recorded beside the times, and,
where ``simulator.ep_task_cost`` is present, its prediction for the same plan on the ``h200`` profile
(peer bytes as local HBM traffic), made before the timing.
``--cpu-smoke``: a layer shrunk to H=64, I=32 under the interpreter, one rep: a check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_ep import _shard, workload  # the benchmark beside this script (its folder is sys.path[0])


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for rows.jsonl")
    p.add_argument("--preset", default="qwen3-30b-a3b")
    p.add_argument("--ranks", type=_ints, default=[2, 4, 8])
    p.add_argument("--tokens", type=_ints, default=[128, 1024])
    p.add_argument("--routing", default="uniform")
    p.add_argument("--placement", default="contiguous")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paths", default="phased,fused,fused_uncut",
                   help="phased, fused (copies cut by reference.ep_tasks.auto_max_rows), fused_uncut (one copy per peer)")
    p.add_argument("--trace", action="store_true",
                   help="after the timing, one traced call of each fused path: per-kind waits and work per rank")
    p.add_argument("--budget", type=float, default=0.0, help="seconds: start no case past this (0: no limit)")
    p.add_argument("--cpu-smoke", action="store_true", help="shrunk layer under TRITON_INTERPRET=1, one rep")
    return p


def _predict(plans, programs: int) -> dict:
    """The cost model's fused-launch times of these plans (simulator.ep_task_cost), made before the timing:
    on the ``h200`` profile with every peer byte moved as local HBM traffic (what the emulation does), and
    on ``hgx-h200`` as planned (NVLink), for reference."""
    import dataclasses

    import numpy as np

    from megamoe.simulator.ep_task_cost import predict_fused_ep

    local = [dataclasses.replace(p, in_bytes=p.in_bytes + p.link_bytes, link_bytes=np.zeros_like(p.link_bytes))
             for p in plans]
    here = [predict_fused_ep(p, "h200", num_programs=programs) for p in local]
    nvl = [predict_fused_ep(p, "hgx-h200", num_programs=programs)["time_s"] * 1e6 for p in plans]
    us = [h["time_s"] * 1e6 for h in here]
    spans = [{k: [a * 1e6, b * 1e6] for k, (a, b) in h["span_s"].items()} for h in here]
    return {"predicted_fused_us": us, "predicted_fused_slowest_us": max(us), "predicted_spans_us": spans,
            "predicted_hgx_h200_fused_us": nvl}


PATHS = ("phased", "fused", "fused_uncut")


def run_case(case: dict, reps: int, dev, paths=PATHS, trace: bool = False) -> list[dict]:
    import numpy as np
    import torch

    from megamoe.kernels.ep_symmetric import SymmetricBuffers, SymmetricStep
    from megamoe.reference.ep import plan_send
    from megamoe.reference.ep_tasks import slot_pair_counts

    cfg, wl = workload(case)
    R, T, H, K = case["ranks"], case["tokens_per_rank"], cfg.hidden_size, cfg.top_k
    shards = [_shard(cfg, wl, r, R, dev, case["seed"]) for r in range(R)]
    dt = shards[0].gate_up.dtype
    if dev.type == "cpu":  # the interpreter's dot needs float32
        shards = [type(s)(**{**vars(s), "gate_up": s.gate_up.float(), "down": s.down.float()}) for s in shards]
        dt = torch.float32
    g = torch.Generator(device=dev).manual_seed(case["seed"] * 7919)
    xs = [torch.randn((T, H), device=dev, dtype=dt, generator=g) for _ in range(R)]
    tws = [torch.softmax(torch.randn((T, K), device=dev, generator=g), dim=-1) for _ in range(R)]
    topk = [wl.slot_topk_idx[r * T:(r + 1) * T] for r in range(R)]
    traffic = np.stack([plan_send(topk[r], shards[r].slot_rank, R, r).send_counts for r in range(R)])
    slots = np.stack([slot_pair_counts(topk[r], shards[r].num_slots) for r in range(R)])
    bufs = SymmetricBuffers.emulated(R, T, H, K, dt, device=dev)
    cuda = dev.type == "cuda"

    def call(path: str, times: list | None, traces: list | None = None):
        fused = path != "phased"
        max_rows = T * R if path == "fused_uncut" else None  # a copy never holds more than T rows
        steps = [SymmetricStep(bufs[r], shards[r], xs[r], topk[r], tws[r], traffic, backend="kernels", fused=fused,
                               slot_counts=slots if fused else None, max_rows=max_rows) for r in range(R)]
        for s in steps:
            s.pack()
            if traces is not None:
                s.trace = torch.zeros((s.fused_plan.num_tasks, 4), dtype=torch.int64, device=dev)
        for r, s in enumerate(steps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                a.record()
            t0 = time.perf_counter()
            s.pull()
            s.compute()
            s.push()
            if cuda:
                b.record()
                torch.cuda.synchronize()
                us = a.elapsed_time(b) * 1e3
            else:
                us = (time.perf_counter() - t0) * 1e6
            if times is not None:
                times[r].append(us)
        ys = [s.finish() for s in steps]
        if traces is not None:
            from megamoe.kernels.ep_fused import trace_summary

            traces.extend(trace_summary(s.fused_plan, s.trace) for s in steps)
        return ys, steps

    from megamoe.kernels.ep_fused import fused_programs

    rows = []
    ys = {}
    for path in paths:
        fused = path != "phased"
        y1, steps = call(path, None)  # warm (compiles)
        y2, _ = call(path, None)
        pred = _predict([s.fused_plan for s in steps], fused_programs(dev)) if fused else None
        times = [[] for _ in range(R)]
        for _ in range(reps):
            call(path, times)
        med = [statistics.median(t) for t in times]
        ys[path] = y1
        row = {"kind": "measured", **case, "path": path, "emulated_ranks_on_one_gpu": True, "rank_us": med,
               "slowest_rank_us": max(med), "mean_rank_us": sum(med) / R, "reps": reps,
               "bitwise_deterministic": all(torch.equal(a, b) for a, b in zip(y1, y2)),
               "finite": all(bool(torch.isfinite(y.float()).all()) for y in y1), "traffic_rows": traffic.tolist()}
        if fused and trace and cuda:
            summaries = []
            call(path, None, summaries)
            row["trace"] = summaries
        if fused:
            plans = [s.fused_plan for s in steps]
            row.update(tasks=[p.tasks_per_kind() for p in plans], tiles=steps[0].tiles, max_rows=steps[0].plan.max_rows,
                       peer_bytes=[float(p.link_bytes.sum()) for p in plans],
                       weight_bytes=[float(s.shard.gate_up.nbytes + s.shard.down.nbytes) for s in steps], **pred)
        rows.append(row)
    first = ys[paths[0]]
    for row in rows:
        other = ys[row["path"]]
        row.update(bitwise_equal_to=paths[0], bitwise_equal=all(torch.equal(a, b) for a, b in zip(first, other)),
                   max_abs_diff=max([float((a.float() - b.float()).abs().max()) for a, b in zip(first, other)
                                     if a.numel()] or [0.0]))
    return rows


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.reps < 1:
        print("bench_ep_fused: --reps must be >= 1", file=sys.stderr)
        return 2
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from megamoe.kernels.bench import git_state, provenance

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("bench_ep_fused: no CUDA device (use --cpu-smoke on a CPU machine)", file=sys.stderr)
        return 2
    prov = provenance() if dev.type == "cuda" else {"gpu": None, "torch": torch.__version__, **git_state()}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "rows.jsonl"
    paths = tuple(p for p in args.paths.split(",") if p)
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        print(f"bench_ep_fused: unknown path(s) {bad or args.paths!r}; known: {', '.join(PATHS)}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    extra = {"shrunk": True} if args.cpu_smoke else {}
    for R in args.ranks:
        for T in args.tokens:
            if args.budget and time.perf_counter() - t_start > args.budget:
                print(f"# budget spent: skipping R={R} T={T}", flush=True)
                continue
            case = {"preset": args.preset, "ranks": R, "tokens_per_rank": T, "routing": args.routing,
                    "placement": args.placement, "seed": args.seed, **extra}
            rows = run_case(case, 1 if args.cpu_smoke else args.reps, dev, paths, args.trace)
            for row in rows:
                row.update(prov)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                pred = row.get("predicted_fused_slowest_us")
                print(f"R={R} T={T} {row['path']:11s} max_rows {row.get('max_rows', '-')!s:>4}  slowest rank "
                      f"{row['slowest_rank_us']:9.1f} us  mean {row['mean_rank_us']:9.1f} us" +
                      (f"  predicted {pred:8.1f}" if pred else "") +
                      f"  det {row['bitwise_deterministic']} finite {row['finite']} =={row['bitwise_equal_to']} "
                      f"{row['bitwise_equal']} (max diff {row['max_abs_diff']:.3g})", flush=True)
                for r, tr in enumerate(row.get("trace", [])):
                    print(f"    rank {r}: span {tr['span']:8.1f} us  " + "  ".join(
                        f"{k} n {v['n']} wait {v['wait']:.1f} work {v['work']:.1f} [{v['start']:.1f}, {v['end']:.1f}]"
                        for k, v in tr.items() if k != "span"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
