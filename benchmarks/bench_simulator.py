"""Speed of the simulator on the issue's reference case (a benchmark, not a test).

Scenario: DeepSeek-V3's MoE layer on a GB200 NVL72 (72 GPUs), 4096 tokens per GPU, skewed routing,
contiguous placement, fused and bulk schedules, seed 0. Targets: event model <= 2 s, analytic
estimate <= 10 ms (issue 3); ``megamoe simulate`` with no arguments <= 1.5 s wall from the command
line, imports included (issue 8), on this 2-core machine. The command is timed as the environment
runs it (``cli_wall_s``; this machine sets PYTHONDONTWRITEBYTECODE=1, so no module is read from
bytecode) and as an installed package runs it, bytecode written by a first run
(``cli_wall_s_bytecode``). Besides: the event model of a sweep point at 512-token minibatches
(``sweep_point``: 8 minibatches, the slowest event-model points of ``benchmarks/bench_sweep.py``).

Times are medians of ``--repeats`` runs after a warm-up that compiles the numba functions. The
workload build (routing, placement, the reference's dispatch plan and rank traffic) is timed apart
from the event model, stage by stage. Appends one JSON line per run to
benchmarks/results/cpu/simulator_speed/simulator_speed.jsonl with date, machine, versions and the code (HEAD commit, dirty
flag, hash of git diff HEAD: ``megamoe.kernels.bench.git_state``).

    python benchmarks/bench_simulator.py [--repeats 3] [--out benchmarks/results/cpu/simulator_speed/simulator_speed.jsonl]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODEL, SYSTEM, TOKENS, ROUTING, PLACEMENT, SEED = "deepseek-v3", "gb200-nvl72", 4096, "skewed", "contiguous", 0


def _median_time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _rank_traffic_sorted(topk_idx, token_rank, expert_rank, num_ranks):
    """A vectorized candidate for reference.rank_traffic(dedup=True): sort each token's destination
    ranks and count the first of each run (timed here to support the request to the reference)."""
    dst = np.sort(expert_rank[topk_idx], axis=1)
    first = np.ones(dst.shape, bool)
    first[:, 1:] = dst[:, 1:] != dst[:, :-1]
    src = np.broadcast_to(token_rank[:, None], dst.shape)
    return np.bincount((src * num_ranks + dst)[first], minlength=num_ranks * num_ranks).reshape(num_ranks, num_ranks)


def _provenance() -> dict:
    import networkx
    import numba
    import simpy

    from megamoe.kernels.bench import git_state
    from megamoe.results import machine

    code = git_state()  # HEAD commit, dirty flag, hash of git diff HEAD
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "simpy": simpy.__version__,
                     "numba": numba.__version__, "networkx": networkx.__version__},
        "git_commit": code["commit"], "dirty": code["dirty"], "diff_sha256": code["diff_sha256"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/cpu/simulator_speed/simulator_speed.jsonl")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # other jobs on the 2 cores slow every figure below

    from megamoe.reference import MoEConfig, plan_dispatch, rank_traffic
    from megamoe.simulator import build_workload, estimate_workload, load_profile, simulate, simulate_workload
    from megamoe.simulator.placement import assign_slots, make_placement
    from megamoe.simulator.simulate import default_minibatch
    from megamoe.simulator.workload import make_topk, minibatch_count, slot_traffic

    # the command line, a fresh process each time, imports included: as the environment runs it, and
    # with bytecode written (a first run writes it), as after ``pip install -e .``
    exe = Path(sys.executable).with_name("megamoe")
    cmd = [str(exe), "simulate"] if exe.exists() else [sys.executable, "-m", "megamoe.cli", "simulate"]
    # (the two alternate run by run: this machine's speed drifts by a third over minutes)
    runs = max(args.repeats, 5)
    env_bc = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, capture_output=True, check=True, env=env_bc)
    t_cli, t_cli_bc = [], []
    for _ in range(runs):
        for env, times in ((None, t_cli), (env_bc, t_cli_bc)):
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=env)
            times.append(time.perf_counter() - t)

    simulate(MODEL, "hgx-h200", 64)  # warm-up: numba compile or cache load
    cfg = MoEConfig.preset(MODEL)
    prof = load_profile(SYSTEM)
    G, Tg = prof.num_gpus, TOKENS
    mb = default_minibatch(Tg, prof)

    # the workload, stage by stage
    t_route, topk = _median_time(lambda: make_topk(cfg, G * Tg, ROUTING, SEED), args.repeats)
    token_rank = np.repeat(np.arange(G), Tg)
    pl = make_placement(PLACEMENT, cfg.num_experts, G)
    t_slots, slot_topk = _median_time(lambda: assign_slots(topk, token_rank, pl), args.repeats)
    t_plan, _ = _median_time(lambda: plan_dispatch(slot_topk, pl.num_slots), args.repeats)
    _, nmb = minibatch_count(Tg, mb)
    src_v = token_rank * nmb + (np.arange(G * Tg) % Tg) // mb
    t_traffic, ref = _median_time(lambda: rank_traffic(slot_topk, src_v, pl.slot_rank, G * nmb), 1)
    t_fast, fast = _median_time(lambda: _rank_traffic_sorted(slot_topk, src_v, pl.slot_rank, G * nmb), args.repeats)
    assert np.array_equal(ref, fast), "the vectorized candidate disagrees with reference.rank_traffic"
    t_counts, counts = _median_time(lambda: slot_traffic(slot_topk, pl.slot_rank, G, Tg, mb, nmb), args.repeats)
    assert np.array_equal(counts[1].reshape(G * nmb, G), ref[:, :G]), "slot_traffic disagrees with rank_traffic"
    t_workload, w = _median_time(lambda: build_workload(cfg, G, Tg, ROUTING, PLACEMENT, minibatch=mb, seed=SEED), 1)

    rows = []
    for schedule in ("fused", "bulk"):
        t_event, r = _median_time(lambda s=schedule: simulate_workload(w, prof, schedule=s), args.repeats)
        t_analytic, e = _median_time(lambda s=schedule: estimate_workload(w, prof, schedule=s), 20)
        rows.append({
            "schedule": schedule, "event_model_s": t_event, "event_model_sim_only_s": r.stats["event_model_s"],
            "analytic_s": t_analytic, "layer_time_us": r.layer_time_us, "analytic_us": e.time_us,
            "flows": r.stats["flows"], "rate_recomputes": r.stats["rate_recomputes"],
        })
    # a sweep point of the event model at 512-token minibatches (8 per GPU)
    mb_sweep = 512
    w_sweep = build_workload(cfg, G, Tg, ROUTING, PLACEMENT, minibatch=mb_sweep, seed=SEED)
    t_sweep, r = _median_time(lambda: simulate_workload(w_sweep, prof, schedule="fused"), args.repeats)
    sweep = {"minibatch": mb_sweep, "num_minibatches": w_sweep.num_minibatches, "schedule": "fused",
             "simulate_workload_s": t_sweep, "event_model_sim_only_s": r.stats["event_model_s"],
             "layer_time_us": r.layer_time_us, "flows": r.stats["flows"], "rate_recomputes": r.stats["rate_recomputes"]}
    record = {
        "benchmark": "simulator_speed",
        "scenario": {"model": MODEL, "system": SYSTEM, "num_gpus": G, "tokens_per_gpu": Tg, "routing": ROUTING,
                     "placement": PLACEMENT, "minibatch": mb, "num_minibatches": nmb, "seed": SEED,
                     "pairs": int(topk.size)},
        "workload_s": {"total": t_workload, "routing": t_route, "assign_slots": t_slots,
                       "reference_plan_dispatch": t_plan, "reference_rank_traffic": t_traffic,
                       "vectorized_rank_traffic_candidate": t_fast, "slot_traffic_used": t_counts},
        "cli_wall_s": {"median": statistics.median(t_cli), "min": min(t_cli), "runs_s": t_cli,
                       "command": "megamoe simulate", "runs": runs,
                       "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")},
        "cli_wall_s_bytecode": {"median": statistics.median(t_cli_bc), "min": min(t_cli_bc), "runs_s": t_cli_bc,
                                "command": "megamoe simulate", "runs": runs, "PYTHONDONTWRITEBYTECODE": None},
        "results": rows,
        "sweep_point": sweep,
        "targets": {"event_model_s": 2.0, "analytic_s": 0.010, "cli_wall_s": 1.5},
        "repeats": args.repeats,
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
        **_provenance(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
