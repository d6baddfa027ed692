"""Predicted MoE layer times for the issue's scenario grid (issue 3, "Done when").

DeepSeek-V3 and Kimi K2 on a GB200 NVL72, 128 and 4096 tokens per GPU, uniform vs skewed routing
(skewed: by-expert imbalance 10.9, TensorRT-LLM's DeepSeek-R1 figure without load balancing),
contiguous vs EPLB placement (E + E/8 slots), bulk-synchronous vs fused (the profile's defaults:
40 communication SMs, 4096-token minibatches, as the published megakernel), bf16, seed 0. Then two
trade-off sweeps on DeepSeek-V3 at 4096 tokens, skewed, EPLB, fused: minibatch size and
communication SMs; and fp8 for the same case.

Writes benchmarks/results/gb200-nvl72/scenarios/simulator_scenarios.md (tables) and .jsonl (one record per run).

    python benchmarks/simulator_scenarios.py [--quick]   # --quick: 128 tokens only
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

SYSTEM = "gb200-nvl72"
MODELS = ("deepseek-v3", "kimi-k2")
ROUTINGS = ("uniform", "skewed")
PLACEMENTS = ("contiguous", "eplb")
SCHEDULES = ("bulk", "fused")


def _row(r, part: str = "grid") -> dict:
    i, b = r.inputs, r.breakdown_us
    return {
        "part": part, "model": i["model"], "tokens_per_gpu": i["tokens_per_gpu"], "routing": i["routing"],
        "placement": i["placement"], "slots": i["num_slots"], "schedule": i["schedule"], "comm_sms": i["comm_sms"],
        "minibatch": i["minibatch"], "dtype": i["weight_dtype"], "layer_us": r.layer_time_us, "analytic_us": r.analytic_us,
        "expert_compute_us": b["expert_compute"], "imbalance_wait_us": b["load_imbalance_wait"],
        "exposed_comm_us": b["exposed_communication"], "dispatch_us": b["dispatch"], "combine_us": b["combine"],
        "imb_gpu": r.imbalance["by_gpu"], "imb_expert": r.imbalance["by_expert"], "imb_slot": r.imbalance["by_slot"],
    }


def _md(rows, cols) -> str:
    head = "| " + " | ".join(c for c, _ in cols) + " |\n|" + "|".join("---" for _ in cols) + "|\n"
    return head + "".join("| " + " | ".join(f(r) for _, f in cols) + " |\n" for r in rows)


COLS = [
    ("model", lambda r: r["model"]), ("tokens/GPU", lambda r: str(r["tokens_per_gpu"])),
    ("routing", lambda r: r["routing"]), ("placement", lambda r: f"{r['placement']} ({r['slots']})"),
    ("schedule", lambda r: r["schedule"]), ("layer us", lambda r: f"**{r['layer_us']:,.0f}**"),
    ("analytic us", lambda r: f"{r['analytic_us']:,.0f}"), ("compute us", lambda r: f"{r['expert_compute_us']:,.0f}"),
    ("imbalance wait us", lambda r: f"{r['imbalance_wait_us']:,.0f}"),
    ("exposed comm us", lambda r: f"{r['exposed_comm_us']:,.0f}"),
    ("imb GPU / expert / slot", lambda r: f"{r['imb_gpu']:.2f} / {r['imb_expert']:.2f} / {r['imb_slot']:.2f}"),
]
SWEEP_COLS = [
    ("sweep", lambda r: r["part"]), ("schedule", lambda r: r["schedule"]), ("minibatch", lambda r: str(r["minibatch"])), ("comm SMs", lambda r: str(r["comm_sms"])),
    ("dtype", lambda r: r["dtype"]), ("layer us", lambda r: f"**{r['layer_us']:,.0f}**"),
    ("analytic us", lambda r: f"{r['analytic_us']:,.0f}"), ("compute us", lambda r: f"{r['expert_compute_us']:,.0f}"),
    ("exposed comm us", lambda r: f"{r['exposed_comm_us']:,.0f}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="128 tokens per GPU only")
    ap.add_argument("--out", default="benchmarks/results/gb200-nvl72/scenarios/simulator_scenarios")
    args = ap.parse_args()

    from megamoe.reference import MoEConfig
    from megamoe.simulator import build_workload, load_profile, simulate_workload
    from megamoe.simulator.simulate import default_minibatch

    prof = load_profile(SYSTEM)
    G = prof.num_gpus
    t0 = time.perf_counter()
    grid = []
    for model in MODELS:
        cfg = MoEConfig.preset(model)
        for tokens in ((128,) if args.quick else (128, 4096)):
            for routing in ROUTINGS:
                for placement in PLACEMENTS:
                    w = build_workload(cfg, G, tokens, routing, placement, minibatch=default_minibatch(tokens, prof),
                                       seed=0)
                    for schedule in SCHEDULES:
                        grid.append(_row(simulate_workload(w, prof, schedule=schedule, seed=0)))
                    print(f"{model} {tokens} {routing} {placement}: "
                          + ", ".join(f"{r['schedule']} {r['layer_us']:,.0f} us" for r in grid[-2:]), flush=True)
    sweeps = []
    if not args.quick:
        cfg = MoEConfig.preset("deepseek-v3")
        for mb in (512, 1024, 2048, 4096):
            w = build_workload(cfg, G, 4096, "skewed", "eplb", minibatch=mb, seed=0)
            sweeps.append(_row(simulate_workload(w, prof, schedule="fused", seed=0), "minibatch sweep"))
            if mb == prof.rack.minibatch_tokens:
                for sms in (8, 16, 24, 32, 64, 96):
                    sweeps.append(_row(simulate_workload(w, prof, schedule="fused", comm_sms=sms, seed=0), "comm SM sweep"))
                sweeps.append(_row(simulate_workload(w, prof, schedule="fused", dtype="fp8", seed=0), "fp8"))
                sweeps.append(_row(simulate_workload(w, prof, schedule="bulk", dtype="fp8", seed=0), "fp8"))
    order = {"minibatch sweep": 0, "comm SM sweep": 1, "fp8": 2}
    sweeps.sort(key=lambda r: (order[r["part"]], r["minibatch"], r["comm_sms"], r["schedule"]))
    elapsed = time.perf_counter() - t0

    from megamoe.kernels.bench import git_state

    code = git_state()  # HEAD commit, dirty flag, hash of git diff HEAD
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    commit = code["commit"] + ("+uncommitted changes" if code["dirty"] else "")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".jsonl").open("w") as f:
        for r in grid + sweeps:
            f.write(json.dumps({"system": SYSTEM, "git_commit": code["commit"], "dirty": code["dirty"],
                                "diff_sha256": code["diff_sha256"], "date": date, **r}) + "\n")
    md = [f"# Predicted MoE layer times on {SYSTEM} (megamoe simulator)\n",
          f"Generated by `benchmarks/simulator_scenarios.py` at commit {commit[:12]} in {elapsed:.0f} s. bf16 weights and "
          f"dispatch, bf16 combine, shared expert included, {prof.rack.comm_sms} communication SMs (fused; bulk's "
          f"dispatch and combine kernels use as many), minibatch {prof.rack.minibatch_tokens} tokens (at most Tg), "
          "seed 0. skewed = Zipf popularity calibrated to a by-expert imbalance of 10.9 "
          "(TensorRT-LLM, DeepSeek-R1 without load balancing). EPLB uses this batch's own expert loads. "
          "Imbalance = (max - mean) / mean of token-expert pairs. `compute`, `imbalance wait` and "
          "`exposed comm` add up to the layer time. Blackwell GEMM efficiencies are assumptions carried over "
          "from H200 measurements; the communication SMs' per-SM rate is fitted to one published megakernel point "
          "(benchmarks/rack_calibration.py; see simulator/profiles/gb200-nvl72.json).\n",
          _md(grid, COLS)]
    if sweeps:
        md += ["\n## Trade-offs: DeepSeek-V3, 4096 tokens/GPU, skewed routing, EPLB, fused\n",
               f"Minibatch size ({prof.rack.comm_sms} comm SMs), then communication SMs ({prof.rack.minibatch_tokens}"
               "-token minibatches), then fp8 weights and dispatch with quantize on the communication SMs (fused, "
               "then bulk).\n", _md(sweeps, SWEEP_COLS)]
    out.with_suffix(".md").write_text("\n".join(md))
    print(f"wrote {out.with_suffix('.md')} and .jsonl in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
