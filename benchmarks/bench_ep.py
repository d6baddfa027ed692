"""Expert parallelism on one multi-GPU host: dispatch/combine bandwidth and layer time, against the model.

    source benchmarks/device.sh   # on a copied tree on the GPU machine (MEGAMOE_COMMIT set first)
    python benchmarks/bench_ep.py --ranks 2,4,8 --tokens 128,512,2048,8192 --routing uniform,skewed \
        --placement contiguous,eplb --out ep.jsonl

Shape legend: R ranks (GPUs), T tokens per rank, E experts, P slots, K top-k, H hidden.

For each R (one spawn of R processes over NCCL, one per visible GPU; ``megamoe.ep.launch`` sets
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) and each case
(preset, T, routing, placement):

    workload     the simulator's ``build_workload`` (routing drawn by the simulator, slot ids from its
                 placement, EPLB included): the same tokens are predicted and measured
    prediction   ``simulate_workload`` on the ``hgx-h200`` profile with num_gpus = R, bulk-synchronous
                 schedule (what an all-to-all baseline is), routed experts only; written as a
                 ``"kind": "prediction"`` row before anything is measured
    check        reference.ep's schedule traffic equals the workload's (the simulator's) traffic
    measured     per rank: dispatch = all_to_all_single of the x rows (bf16, N x H), combine = the
                 partial rows back; layer = ``kernels.ep.ep_moe_experts`` whole (host planning,
                 counts, three dispatch exchanges, local experts with moe_experts, combine); each the
                 median over reps of the slowest rank's time (barrier, then host timers around
                 synchronized CUDA work); bandwidth = bytes leaving the busiest rank / its time;
                 bitwise determinism of two layer calls
With ``--nccl-channels a,b`` each R runs once per NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS value
(NCCL's SMs per collective: the baseline's stand-in for communication SMs).

``--transport all_to_all,symmetric`` (the default: both in one spawn) also measures the one-sided
layer (``kernels.ep_symmetric``: torch symmetric memory allocated once per spawn for the largest T,
pulls and push-backs by the copy kernel behind ready flags), one row per case and transport:
    dispatch     pack + signal + pull of x, topk_idx and topk_weights rows (host planning excluded)
    combine      push-back + signal + wait + the per-token sum (the call's first phases run untimed)
    layer        ``ep_moe_experts_symmetric`` whole (counts all-gathered, as the baseline exchanges them)
    checks       bitwise determinism, and bitwise equality with the all-to-all layer's y
``fused`` (in the default too) measures ``ep_moe_experts_symmetric(..., fused=True)``: each rank's pulls,
local experts and push-backs as one launch (kernels/ep_fused.py), one row per case with the layer time
(dispatch and combine are inside the launch: no separate figures) and the same checks; its prediction,
``predict_fused`` on the same profile (simulator.ep_task_cost, the same plans), is written as
a ``"schedule": "fused_ep"`` prediction row before any measurement and copied into the measured row.
``--copy-programs a,b`` sweeps the copy kernel's programs (its communication SMs; default 4 per SM), and
the fused launch's programs (default one per SM).
It needs CUDA symmetric memory: ``--cpu-smoke`` measures it only with ``--ranks 1`` (the rank's
buffers emulated, its kernels under TRITON_INTERPRET=1), a check of the script.

Rows are JSON lines with provenance (``kernels.bench.provenance``: GPU, versions, commit, dirty, date).
``--dry-run`` prints the cases and exits; ``--predict-only`` writes the prediction rows (CPU) and prints,
per case, the fused layer's prediction beside the bulk-synchronous one:

    python benchmarks/bench_ep.py --predict-only --transport fused --ranks 2,4,8 --tokens 128,2048 \
        --routing uniform,skewed --placement contiguous --max-rows auto,none --out FILE

The fused prediction: every rank's plan as kernels/ep_symmetric.py's fused step builds it
(reference.ep.plan_pull: bf16 rows, topk_idx + topk_weights + positions as metadata, copies of at most
max_rows rows; reference.ep_tasks.plan_fused_ep with the GEMM tiles kernels/ep_fused.fused_tiles_of picks
for an H200 in bfloat16), priced by simulator.ep_task_cost.predict_ep_layer, plus the same layer start as
the bulk row (schedules.layer_start_s). ``--max-rows``: none (one copy per peer), an integer, or auto (the
fused step's default, reference.ep_tasks.auto_max_rows: one wave of copies fills the launch's programs).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROUTINGS = ("uniform", "skewed", "zipf:1.2", "hot:2:0.5")
TRANSPORTS = ("all_to_all", "symmetric", "fused")
PLACEMENTS = ("contiguous", "round_robin", "eplb")
SYSTEM = "hgx-h200"


def _ints(text: str) -> list[int]:
    try:
        v = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return v


def _names(allowed):
    def parse(text: str) -> list[str]:
        v = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in v if s not in allowed and s.split(":")[0] not in {a.split(":")[0] for a in allowed}]
        if not v or bad:
            raise argparse.ArgumentTypeError(f"{bad or text!r}: choose from {', '.join(allowed)}")
        return v
    return parse


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
    p.add_argument("--ranks", type=_ints, default=None, help="world sizes, e.g. 2,4,8 (default: all visible GPUs)")
    p.add_argument("--tokens", type=_ints, default=[128, 512, 2048, 8192], help="tokens per rank")
    p.add_argument("--routing", type=_names(ROUTINGS), default=["uniform", "skewed"],
                   help="simulator routings (workload.parse_routing)")
    p.add_argument("--placement", type=_names(PLACEMENTS), default=["contiguous", "eplb"])
    p.add_argument("--nccl-channels", type=_ints, default=None, help="NCCL channel counts to sweep (default: NCCL's)")
    p.add_argument("--transport", type=_names(TRANSPORTS), default=list(TRANSPORTS),
                   help="all_to_all (NCCL) and/or symmetric (one-sided, torch symmetric memory)")
    p.add_argument("--copy-programs", type=_ints, default=None,
                   help="the symmetric transport's copy-kernel programs to sweep (default: 4 per SM)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=SYSTEM, help="simulator profile for the prediction")
    p.add_argument("--out", default=None, help="JSON-lines file (default benchmarks/results/ep_<date>.jsonl; a kept result goes to results/<gpu>/<question>/)")
    p.add_argument("--timeout-s", type=float, default=540.0, help="per spawn of R processes")
    p.add_argument("--dry-run", action="store_true", help="print the cases, run nothing")
    p.add_argument("--predict-only", action="store_true", help="write the prediction rows only (no GPU)")
    p.add_argument("--max-rows", type=_max_rows, default=["auto"],
                   help="--predict-only's fused predictions: rows per copy, none, auto or N (a list)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the measuring code on the CPU (gloo, torch experts, a layer shrunk to H=64, I=32): "
                        "a check of this script, not a measurement")
    return p


def cases(args, R: int) -> list[dict]:
    extra = {"shrunk": True} if args.cpu_smoke else {}
    return [{"preset": args.preset, "ranks": R, "tokens_per_rank": T, "routing": r, "placement": pl, "seed": args.seed,
             **extra} for T in args.tokens for r in args.routing for pl in args.placement]


def workload(case: dict):
    from megamoe.kernels.bench import bench_config
    from megamoe.simulator.workload import build_workload

    cfg = bench_config(case["preset"])
    if case.get("shrunk"):
        cfg = cfg.replace(hidden_size=64, intermediate_size=32)
    T = case["tokens_per_rank"]
    return cfg, build_workload(cfg, case["ranks"], T, case["routing"], case["placement"], minibatch=T,
                               seed=case["seed"])


def schedule(wl):
    """reference.ep's plans for the workload, and whether their traffic is the simulator's."""
    import numpy as np

    from megamoe.reference.ep import plan_ep

    R, T = wl.num_gpus, wl.tokens_per_gpu
    sched = plan_ep([wl.slot_topk_idx[r * T:(r + 1) * T] for r in range(R)], wl.placement.slot_rank, R)
    return sched, bool(np.array_equal(sched.traffic(), wl.traffic_mb.sum(axis=1)))


def predict(case: dict, system: str = SYSTEM) -> dict:
    """The prediction row for one case (simulator, bulk-synchronous, routed experts only)."""
    from megamoe.simulator.hardware import load_profile, override
    from megamoe.simulator.simulate import simulate_workload

    cfg, wl = workload(case)
    _, same = schedule(wl)
    r = simulate_workload(wl, override(load_profile(system), gpus=case["ranks"]), schedule="bulk",
                          include_shared=False, dtype="bf16", seed=case["seed"])
    b = r.breakdown_us
    return {"kind": "prediction", **case, "system": system, "schedule": "bulk",
            "predicted_layer_us": r.layer_time_us, "predicted_dispatch_us": b.get("dispatch"),
            "predicted_combine_us": b.get("combine"), "predicted_expert_us": b.get("expert_compute"),
            "analytic_us": r.analytic_us, "imbalance": r.imbalance, "schedule_matches_simulator": same,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


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

    sched, _ = schedule(wl)
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


def predict_fused(case: dict, max_rows="auto", system: str = SYSTEM) -> dict:
    """One row: the fused EP layer's prediction (copies of at most ``max_rows`` rows: none, auto or N; auto
    as the fused step cuts them by default) and the bulk-synchronous one for the same case."""
    from megamoe.simulator.ep_task_cost import predict_ep_layer
    from megamoe.simulator.hardware import load_profile, override
    from megamoe.simulator.schedules import layer_start_s

    bulk = predict(case, system)
    cfg, wl = workload(case)
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


def _shard(cfg, wl, rank: int, R: int, device, seed: int):
    """Random bf16 weights of this rank's slots only, made on its GPU (a whole layer need not fit)."""
    import torch

    from megamoe.kernels.ep import EPShard
    from megamoe.reference.ep import local_slots

    slots = local_slots(wl.placement.slot_rank, rank)
    H, I = cfg.hidden_size, cfg.intermediate_size
    g = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    gu = torch.randn((slots.size, 2 * I, H), device=device, dtype=torch.bfloat16, generator=g).mul_(H ** -0.5)
    dn = torch.randn((slots.size, H, I), device=device, dtype=torch.bfloat16, generator=g).mul_(I ** -0.5)
    return EPShard(rank=rank, num_ranks=R, slot_rank=wl.placement.slot_rank.astype("int64"), slots=slots,
                   gate_up=gu, down=dn, gate_up_bias=None, down_bias=None, activation=cfg.activation,
                   alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)


def _slowest_median_s(fn, reps: int, device, setup=None) -> float:
    """Median over reps of the slowest rank's seconds for fn() (barrier before, CUDA synchronized);
    with ``setup``, fn(setup()) with setup() run untimed before the barrier."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    call = fn if setup is None else (lambda: fn(setup()))
    call()  # warm
    times = []
    for _ in range(reps):
        arg = None if setup is None else setup()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn() if setup is None else fn(arg)
        sync()
        t = torch.tensor([time.perf_counter() - t0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return statistics.median(times)


def _worker(rank: int, R: int, job: dict) -> None:
    import torch
    import torch.distributed as dist

    from megamoe.kernels.bench import git_state, provenance
    from megamoe.kernels.ep import TRANSPORT_ENV, ep_moe_experts, exchange

    cuda = job["device"] == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    prov = None
    if rank == 0:
        prov = provenance() if cuda else {"gpu": None, "torch": torch.__version__, **git_state(),
                                          "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    one_sided = [t for t in job["transports"] if t in ("symmetric", "fused")]
    bufs = _symmetric_buffers(job) if one_sided else None
    for case, pred in zip(job["cases"], job["predictions"]):
        cfg, wl = workload(case)
        sched, same = schedule(wl)
        T, H, K = case["tokens_per_rank"], cfg.hidden_size, cfg.top_k
        shard = _shard(cfg, wl, rank, R, dev, case["seed"])
        g = torch.Generator(device=dev).manual_seed(case["seed"] * 7919 + rank)
        x = torch.randn((T, H), device=dev, dtype=torch.bfloat16, generator=g)
        tw = torch.softmax(torch.randn((T, K), device=dev, generator=g), dim=-1)
        topk = wl.slot_topk_idx[rank * T:(rank + 1) * T]
        y1 = ep_moe_experts(x, topk, tw, shard, transport="all_to_all")
        traffic = sched.traffic()
        off = traffic.copy()
        off[range(R), range(R)] = 0
        busiest_bytes = int(max(off.sum(axis=1).max(), off.sum(axis=0).max())) * H * 2
        reps = job["reps"]
        base = {"kind": "measured", **case, **(prov or {}), "num_gpus_visible": torch.cuda.device_count(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                "backend": "nccl" if cuda else "gloo", "nccl_channels": job["channels"],
                "transport_env": {k: os.environ.get(k) for k in TRANSPORT_ENV}, "dtype": "bfloat16",
                "busiest_rank_offrank_bytes": busiest_bytes, "traffic_rows": traffic.tolist(),
                "schedule_matches_simulator": same, "reps": reps,
                "prediction": {k: pred.get(k) for k in ("system", "predicted_layer_us", "predicted_dispatch_us",
                                                        "predicted_combine_us", "predicted_expert_us")}}
        if "all_to_all" in job["transports"]:
            y2 = ep_moe_experts(x, topk, tw, shard, transport="all_to_all")
            det = torch.tensor([int(torch.equal(y1, y2))], device=dev)
            dist.all_reduce(det, op=dist.ReduceOp.MIN)
            sp, rp = sched.send[rank], sched.recv[rank]
            send_splits, recv_splits = sp.send_counts.tolist(), rp.recv_counts.tolist()
            rows = x[torch.from_numpy(sp.send_token).to(dev)]
            back = torch.empty((rp.num_recv, H), device=dev, dtype=torch.bfloat16)  # combine's partial rows
            times = (_slowest_median_s(partial(exchange, rows, send_splits, recv_splits, "all_to_all"), reps, dev),
                     _slowest_median_s(partial(exchange, back, recv_splits, send_splits, "all_to_all"), reps, dev),
                     _slowest_median_s(partial(ep_moe_experts, x, topk, tw, shard, transport="all_to_all"), reps, dev))
            if rank == 0:
                _emit(job, R, case, pred, base, times, {"transport": "all_to_all", "bitwise_deterministic":
                                                        bool(det.item())})
        for transport in one_sided:
            for programs in job["copy_programs"]:
                measure = _measure_symmetric if transport == "symmetric" else _measure_fused
                times, checks = measure(bufs, shard, x, topk, tw, traffic, y1, programs, reps, dev)
                if rank == 0:
                    extra = {"prediction_fused": job["predictions_fused"].get(_case_key(case))} if transport == "fused" \
                        else {}
                    _emit(job, R, case, pred, base, times,
                          {"transport": transport, "copy_programs": programs, **checks, **extra,
                           "symmetric_max_tokens": bufs.layout.max_tokens, "symmetric_bytes": bufs.layout.total_bytes})


def _symmetric_buffers(job: dict):
    """This rank's symmetric buffers, once per spawn: room for the largest T of the job's cases."""
    import torch

    from megamoe.kernels.ep_symmetric import SymmetricBuffers

    cfg, _ = workload(job["cases"][0])  # one preset per run: H and K are the same in every case
    T = max(c["tokens_per_rank"] for c in job["cases"])
    if job["device"] == "cpu":  # --cpu-smoke, one rank: its buffers emulated, the kernels interpreted
        return SymmetricBuffers.emulated(1, T, cfg.hidden_size, cfg.top_k, torch.bfloat16)[0]
    return SymmetricBuffers.allocate(T, cfg.hidden_size, cfg.top_k, torch.bfloat16)


def _measure_symmetric(bufs, shard, x, topk, tw, traffic, y_a2a, programs, reps: int, dev):
    """(dispatch_s, combine_s, layer_s) of the one-sided layer, and its checks against itself and all_to_all.

    Dispatch: a call's pack + pull (its planning untimed). Combine: a call's push + finish, its first
    phases run untimed. Every rep is synchronized and barriered, so a rank never repacks a send buffer
    that a peer still pulls from, even when a rep runs only part of a call (the flags' epochs stay
    in step: every rank runs the same phases)."""
    import torch
    import torch.distributed as dist

    from megamoe.kernels.ep_symmetric import SymmetricStep, ep_moe_experts_symmetric

    def step():
        return SymmetricStep(bufs, shard, x, topk, tw, traffic, num_programs=programs)

    def dispatch(s):
        s.pack()
        s.pull()

    def computed():
        s = step()
        for phase in ("pack", "pull", "compute"):
            getattr(s, phase)()
        return s

    def combine(s):
        s.push()
        s.finish()

    layer = partial(ep_moe_experts_symmetric, x, topk, tw, shard, bufs, num_programs=programs)
    y1, y2 = layer(), layer()
    ok = torch.tensor([int(torch.equal(y1, y2)), int(torch.equal(y1, y_a2a))], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    times = (_slowest_median_s(dispatch, reps, dev, setup=step), _slowest_median_s(combine, reps, dev, setup=computed),
             _slowest_median_s(layer, reps, dev))
    return times, {"bitwise_deterministic": bool(ok[0].item()), "bitwise_equal_all_to_all": bool(ok[1].item())}


def _measure_fused(bufs, shard, x, topk, tw, traffic, y_a2a, programs, reps: int, dev):
    """(None, None, layer_s) of the fused one-sided layer (its dispatch and combine run inside one launch), and
    its checks against itself and all_to_all; ``programs``: the fused launch's (None: one per SM)."""
    import torch
    import torch.distributed as dist

    from megamoe.kernels.ep_symmetric import ep_moe_experts_symmetric

    layer = partial(ep_moe_experts_symmetric, x, topk, tw, shard, bufs, num_programs=programs, fused=True)
    y1, y2 = layer(), layer()
    ok = torch.tensor([int(torch.equal(y1, y2)), int(torch.equal(y1, y_a2a))], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return (None, None, _slowest_median_s(layer, reps, dev)), {"bitwise_deterministic": bool(ok[0].item()),
                                                               "bitwise_equal_all_to_all": bool(ok[1].item())}


def _case_key(case: dict) -> str:
    return json.dumps(case, sort_keys=True)


def _emit(job: dict, R: int, case: dict, pred: dict, base: dict, times, extra: dict) -> None:
    """Rank 0: one measured row (times: dispatch, combine, layer seconds; None where not separate) to the
    file and a line to stdout."""
    dispatch_s, combine_s, layer_s = times

    def us(s):
        return None if s is None else s * 1e6

    busiest = base["busiest_rank_offrank_bytes"]
    row = {**base, **extra, "dispatch_us": us(dispatch_s), "combine_us": us(combine_s), "layer_us": layer_s * 1e6,
           "dispatch_bytes_per_s": busiest / dispatch_s if dispatch_s else None,
           "combine_bytes_per_s": busiest / combine_s if combine_s else None}
    if pred.get("predicted_layer_us"):
        row["layer_ratio"] = row["layer_us"] / pred["predicted_layer_us"]
    fused_pred = (extra.get("prediction_fused") or {}).get("predicted_layer_us")
    if fused_pred:
        row["layer_ratio_fused"] = row["layer_us"] / fused_pred
    with open(job["out"], "a") as f:
        f.write(json.dumps(row) + "\n")
    more = f", equal to all_to_all {row['bitwise_equal_all_to_all']}" if "bitwise_equal_all_to_all" in row else ""
    def f1(v):
        return "-" if v is None else f"{v:.1f}"

    print(f"R={R} T={case['tokens_per_rank']} {case['routing']}/{case['placement']} {row['transport']}: dispatch "
          f"{f1(row['dispatch_us'])} us, combine {f1(row['combine_us'])} us, layer {row['layer_us']:.1f} us "
          f"(predicted {pred.get('predicted_layer_us') or float('nan'):.1f}), det {row['bitwise_deterministic']}{more}",
          flush=True)


def line(row: dict) -> str:
    span = row["slowest_span_us"]
    ends = ", ".join(f"{k} {span[k][1]:.1f}" for k in ("pull", "gemm1", "gemm2", "push") if k in span)
    b = row["bulk"]
    return (f"{row['preset']} R={row['ranks']} T={row['tokens_per_rank']} {row['routing']}/{row['placement']} "
            f"max_rows={row['max_rows']}: fused {row['predicted_layer_us']:.1f} us (launch "
            f"{row['terms_us']['fused']:.1f} on rank {row['slowest_rank']}, ends: {ends or 'no tasks'}) | bulk "
            f"{b['predicted_layer_us']:.1f} us (dispatch {b['predicted_dispatch_us']:.1f}, expert "
            f"{b['predicted_expert_us']:.1f}, combine {b['predicted_combine_us']:.1f})")


def _write(out: Path, row: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.reps < 1:
        print("bench_ep: --reps must be >= 1", file=sys.stderr)
        return 2
    ranks = args.ranks
    if ranks is None and (args.dry_run or args.predict_only):
        ranks = [2, 4, 8]
    out = Path(args.out) if args.out else (Path(__file__).resolve().parent / "results"
                                           / f"ep_{_dt.date.today().isoformat()}.jsonl")
    transports = list(dict.fromkeys(args.transport))
    if args.dry_run:
        for R in ranks:
            for c in cases(args, R):
                print(json.dumps(c))
        print(f"bench_ep: would write {out}, transports {', '.join(transports)}", file=sys.stderr)
        return 0
    if args.predict_only:
        for R in ranks:
            for c in cases(args, R):
                _write(out, predict(c, args.system))
                if "fused" in transports:
                    for mr in args.max_rows:
                        row = predict_fused(c, mr, args.system)
                        print(line(row), flush=True)
                        _write(out, row)
        return 0
    import torch

    n = torch.cuda.device_count()
    if args.cpu_smoke:
        n = max(ranks or [2])
    elif n < 2:
        print(f"bench_ep: needs at least 2 visible GPUs, found {n}", file=sys.stderr)
        return 2
    ranks = ranks or [n]
    if max(ranks) > n:
        print(f"bench_ep: --ranks {ranks} asks for more than the {n} visible GPUs", file=sys.stderr)
        return 2
    from megamoe.ep import launch

    for R in ranks:
        cs = cases(args, R)
        preds = []
        for c in cs:  # every prediction of this R is written before its first measurement
            try:
                preds.append(predict(c, args.system))
            except ImportError as e:  # simpy missing: measure anyway, say why there is no prediction
                preds.append({"kind": "prediction", **c, "error": f"{type(e).__name__}: {e}"})
            _write(out, preds[-1])
        fused_preds = {}
        if "fused" in transports and not (args.cpu_smoke and R > 1):  # the fused launch's too, before measuring
            for c in cs:
                try:
                    fused_preds[_case_key(c)] = predict_fused(c, system=args.system)
                except ImportError as e:
                    fused_preds[_case_key(c)] = {"kind": "prediction", "schedule": "fused_ep", **c,
                                                 "error": f"{type(e).__name__}: {e}"}
                _write(out, fused_preds[_case_key(c)])
        for i, ch in enumerate(args.nccl_channels or [None]):
            if ch is not None:
                os.environ["NCCL_MIN_NCHANNELS"] = os.environ["NCCL_MAX_NCHANNELS"] = str(ch)
            # the one-sided transport uses no NCCL channels (but the counts' all-gather): measured once;
            # on CPU processes there is no symmetric memory, so only one rank (its buffers emulated)
            ts = transports if i == 0 and not (args.cpu_smoke and R > 1) else [t for t in transports
                                                                                if t not in ("symmetric", "fused")]
            if len(ts) < len(transports) and i == 0:
                print(f"bench_ep: R={R}: the symmetric and fused transports need CUDA symmetric memory (on CPU "
                      f"processes, R = 1 only): not measured", file=sys.stderr)
            if not ts:
                continue
            job = {"cases": cs, "predictions": preds, "predictions_fused": fused_preds, "reps": args.reps, "out": str(out), "channels": ch,
                   "device": "cpu" if args.cpu_smoke else "cuda", "transports": ts,
                   "copy_programs": args.copy_programs or [None]}
            launch(_worker, R, (job,), backend="gloo" if args.cpu_smoke else "nccl", timeout_s=args.timeout_s)
    print(f"bench_ep: rows in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
