"""``megamoe validate``: run the real kernel and the simulator on the same launch plan, and compare.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, S sampled tokens.

This is the one place that reads both the kernels and the simulator. Per (model, T):

1. the kernel runs the layer (``megamoe.kernels.moe_forward``) and reports its routing;
2. numerics: its output against the float64 reference on S sampled tokens (``megamoe.numerics``);
3. the kernels' launch plan for that routing (``megamoe.kernels.launch_plan``: grid, tiles, bytes
   and FLOPs per program) goes, as plain data, to the simulator's launch model
   (``megamoe.simulator.launch.predict_launch_plan``), which predicts each launch's time;
4. on a GPU the layer is timed as a CUDA-graph replay, and each kernel's own time is read from
   the torch profiler, so prediction and measurement are compared launch by launch.

The prediction is made twice: from the ``h200`` profile as written (datasheet and earlier
measurements) and with the HBM and matmul rates measured in this run. Without a GPU the kernels
run under ``TRITON_INTERPRET=1`` on a shrunken layer in float32: numerics and predictions only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_MODELS = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3"
DEFAULT_TOKENS = "1,64,512,4096"
CPU_SHAPE = dict(hidden_size=48, intermediate_size=40)  # interpreter: small, not tile multiples


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def measured_overrides(ceilings: dict, system: str = "h200") -> dict:
    """Profile overrides from rates measured in this run: HBM = the streaming-read rate; the bf16
    peak rescaled so that the profile's efficiency at the largest tile gives the measured matmul rate."""
    from megamoe.simulator import load_profile
    from megamoe.simulator.timing import gemm_efficiency

    p = load_profile(system)
    top = p.gemm_efficiency[-1][0]
    eff_top = float(gemm_efficiency([top], p.gemm_efficiency)[0])
    return {"hbm_bandwidth": ceilings["read_bytes_per_s"], "hbm_efficiency": 1.0,
            "bf16_flops": ceilings["matmul_flops_per_s"] / eff_top}


def profile_kernels(fn, x, reps: int = 5) -> dict[str, float]:
    """Median-free mean CUDA time (us) per Triton kernel name over ``reps`` calls of fn(x)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(x)
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if t:
            out[ev.key] = out.get(ev.key, 0.0) + t / reps
    return out


def validate_one(model: str, T: int, *, seed: int = 0, sample: int = 16, system: str = "h200",
                 ceilings: dict | None = None, reps: int = 50) -> dict:
    """One (model, T) row: numerics, prediction, and on a GPU the measurement."""
    import torch

    from megamoe import kernels
    from megamoe.numerics import check_numerics
    from megamoe.reference import MoEConfig, random_weights
    from megamoe.simulator.launch import predict_launch_plan

    gpu = _has_cuda()
    cfg = MoEConfig.preset(model)
    if gpu:
        from megamoe.kernels.bench import random_device_weights

        dtype, tdtype, device = "bfloat16", torch.bfloat16, "cuda"
        w = random_device_weights(cfg, seed)
        dev_name = torch.cuda.get_device_name(0)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        cfg = cfg.replace(**CPU_SHAPE, shared_intermediate_size=56 * cfg.num_shared_experts,
                          num_experts=min(cfg.num_experts, 16),
                          **({"n_group": min(cfg.n_group, 4), "topk_group": min(cfg.topk_group, 2)}
                             if cfg.n_group > 1 else {}),
                          top_k=min(cfg.top_k, 4))
        dtype, tdtype, device = "float32", torch.float32, "cpu"
        w = random_weights(cfg, seed).to_torch(device="cpu", dtype=torch.float32)
        dev_name = "cpu-interpreter"
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn((T, cfg.hidden_size), generator=gen, device=device, dtype=tdtype)
    details = kernels.moe_forward_details(x, w, cfg)
    y = kernels.moe_forward(x, w, cfg)
    num = check_numerics(x, y, w, cfg, dtype=dtype, sample=sample, seed=seed, topk_idx=details["topk_idx"])
    plan = kernels.launch_plan(cfg, topk_idx=details["topk_idx"].cpu().numpy(), dtype=dtype, device_name=dev_name)
    stages = [s.to_dict() for s in plan.stages]
    row = {"model": cfg.name, "T": T, "E": cfg.num_experts, "H": cfg.hidden_size, "I": cfg.intermediate_size,
           "dtype": dtype, "device": dev_name, "numerics": num.to_dict(),
           "experts_touched": int((plan.counts and sum(1 for c in plan.counts if c)) or 0),
           "plan_flops": plan.total_flops, "plan_bytes": plan.total_bytes, "launches": plan.num_launches}
    pred = predict_launch_plan(stages, system)
    row["predicted_us"] = pred["time_us"]
    row["predicted_stages"] = pred["stages"]
    if gpu:
        from megamoe.kernels.bench import graph_time_us

        xs = [torch.randn((T, cfg.hidden_size), generator=gen, device=device, dtype=tdtype) for _ in range(8)]
        row["measured_us"] = graph_time_us(lambda a: kernels.moe_forward(a, w, cfg), xs, reps)
        row["ratio_measured_over_predicted"] = row["measured_us"] / row["predicted_us"]
        if ceilings:
            pm = predict_launch_plan(stages, system, overrides=measured_overrides(ceilings, system))
            row["predicted_measured_rates_us"] = pm["time_us"]
            row["ratio_measured_over_predicted_measured_rates"] = row["measured_us"] / pm["time_us"]
            row["predicted_measured_rates_stages"] = pm["stages"]
        per_kernel = profile_kernels(lambda a: kernels.moe_forward(a, w, cfg), x)
        by_kernel: dict[str, dict] = {}
        for st, p in zip(stages, row.get("predicted_measured_rates_stages", pred["stages"])):
            k = by_kernel.setdefault(st["kernel"], {"predicted_us": 0.0, "measured_us": None})
            k["predicted_us"] += p["time_us"]
        for name, us in per_kernel.items():
            for kname, k in by_kernel.items():
                if kname in name:
                    k["measured_us"] = (k["measured_us"] or 0.0) + us
        row["per_kernel"] = by_kernel
        del w
        torch.cuda.empty_cache()
    return row


def predict_bench_row(row: dict, *, system: str = "h200", seed: int = 0) -> dict:
    """The simulator's prediction for a row that ``megamoe bench`` measured, without a GPU.

    The bench routed random tokens with random router weights (logits ~ N(0, 1)); the same
    distribution is drawn here with ``seed``, so the launch plan is statistically equivalent to the
    measured one, not identical (decode rows, where few experts are touched, vary most). Returns
    the measured time, the predictions with the profile and with the rates the bench measured in
    its run, and whether the plan's GEMM tiles are the ones the bench ran.
    """
    import numpy as np

    from megamoe.kernels.bench import bench_config
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import select_experts
    from megamoe.simulator.launch import predict_launch_plan

    cfg = bench_config(row["preset"])
    T = int(row["T"])
    rng = np.random.default_rng(seed)
    bias = 0.05 * rng.standard_normal(cfg.num_experts) if cfg.score_bias else None
    idx, _ = select_experts(rng.standard_normal((T, cfg.num_experts)), cfg, score_bias=bias)
    plan = launch_plan(cfg, topk_idx=idx, dtype="bfloat16", device_name=row.get("gpu", "NVIDIA H200"),
                       triton_version=row.get("triton"), deterministic=bool(row.get("deterministic", True)))
    stages = [st.to_dict() for st in plan.stages]
    g1 = plan.stage("gemm1").tile if any(st.name == "gemm1" for st in plan.stages) else {}
    same_tiles = all(g1.get(k) == v for k, v in row.get("config", {}).get("gemm1", {}).items())
    full = predict_launch_plan(stages, system)
    pred = full["time_us"]
    out = {"preset": row["preset"], "T": T, "measured_us": row["ours_us"], "predicted_us": pred,
           "ratio": row["ours_us"] / pred, "same_tiles": same_tiles,
           "gpu": row.get("gpu"), "triton": row.get("triton"), "date": row.get("date"), "commit": row.get("commit")}
    if "stage_us" in row:  # the bench's per-stage split: router+align, gemm1, gemm2, combine
        groups: dict[str, float] = {}
        for st in full["stages"]:
            key = "router+align" if st["name"].startswith(("router", "align")) else st["name"].split("_")[0]
            key = key.replace("shared", "gemm") if key not in row["stage_us"] else key
            groups[key] = groups.get(key, 0.0) + st["time_us"]
        out["stages"] = {k: {"measured_us": v, "predicted_us": groups.get(k)} for k, v in row["stage_us"].items()}
    if "ceiling_read_bytes_per_s" in row:
        ov = measured_overrides({"read_bytes_per_s": row["ceiling_read_bytes_per_s"],
                                 "matmul_flops_per_s": row["ceiling_matmul_flops_per_s"]}, system)
        out["predicted_measured_rates_us"] = predict_launch_plan(stages, system, overrides=ov)["time_us"]
        out["ratio_measured_rates"] = row["ours_us"] / out["predicted_measured_rates_us"]
    return out


def format_row(r: dict) -> str:
    n = r["numerics"]
    s = (f"{r['model']:<15} T={r['T']:<6} err max {n['max_err']:.2e} rms {n['rms_err']:.2e} "
         f"{'ok ' if n['ok'] else 'BAD'} predicted {r['predicted_us']:9.1f} us")
    if "measured_us" in r:
        s += f"  measured {r['measured_us']:9.1f} us  meas/pred {r['ratio_measured_over_predicted']:.2f}"
        if "predicted_measured_rates_us" in r:
            s += f" (with today's rates: pred {r['predicted_measured_rates_us']:.1f}, " \
                 f"{r['ratio_measured_over_predicted_measured_rates']:.2f})"
    return s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated presets (default {DEFAULT_MODELS})")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"comma-separated T (default {DEFAULT_TOKENS}; "
                        "without a GPU capped at 64)")
    parser.add_argument("--system", default="h200", help="simulator profile of the GPU the kernel runs on")
    parser.add_argument("--sample", type=int, default=16, help="tokens checked against the float64 reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="append rows as JSON lines to this file")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--from-bench", metavar="JSONL", default=None,
                        help="no kernel run: predict the rows a `megamoe bench` run measured and compare")


def bench_row_problem(r: dict) -> str | None:
    """What makes a bench row unusable for ``--from-bench`` (None if nothing): checked for every row
    before any prediction."""
    import math

    from megamoe.reference import PRESETS

    if r.get("preset") not in PRESETS:
        return f"preset {r.get('preset')!r} is not a preset ({', '.join(PRESETS)})"
    T = r.get("T")
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        return f"T={T!r} must be a whole number of tokens >= 1"
    us = r["ours_us"]
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
        return f"ours_us={us!r} must be a positive time in us"
    for k in ("ceiling_read_bytes_per_s", "ceiling_matmul_flops_per_s"):
        v = r.get(k, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return f"{k}={v!r} must be a positive rate"
    return None


def run_from_bench(path: Path, args: argparse.Namespace) -> int:
    """Compare the simulator's launch model with measured bench rows (deterministic mode)."""
    if not path.exists():
        print(f"megamoe validate: --from-bench file {str(path)!r} does not exist", file=sys.stderr)
        return 2
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            print(f"megamoe validate: {path}:{n}: not JSON ({exc.msg})", file=sys.stderr)
            return 2
        if isinstance(r, dict) and "ours_us" in r and r.get("deterministic", True):
            bad = bench_row_problem(r)
            if bad:
                print(f"megamoe validate: {path}:{n}: {bad}", file=sys.stderr)
                return 2
            rows.append(r)
    if not rows:
        print(f"megamoe validate: {path} holds no bench rows with 'ours_us'", file=sys.stderr)
        return 2
    from megamoe.simulator import ProfileError, load_profile

    try:
        load_profile(args.system)
    except ProfileError as exc:
        print(f"megamoe validate: --system: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    for r in rows:
        c = predict_bench_row(r, system=args.system, seed=args.seed)
        if args.json:
            print(json.dumps(c))
        else:
            extra = (f"  with the run's rates: {c['predicted_measured_rates_us']:9.1f} us "
                     f"(meas/pred {c['ratio_measured_rates']:.2f})" if "ratio_measured_rates" in c else "")
            print(f"{c['preset']:<16} T={c['T']:<6} measured {c['measured_us']:9.1f} us  predicted "
                  f"{c['predicted_us']:9.1f} us (meas/pred {c['ratio']:.2f}){extra}"
                  f"{'' if c['same_tiles'] else '  [tiles differ from the run]'}")
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(c) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    from megamoe.reference import PRESETS

    if args.from_bench:
        return run_from_bench(Path(args.from_bench), args)

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in PRESETS]
    if bad:
        print(f"megamoe validate: unknown model(s) {bad}; presets: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        print(f"megamoe validate: --tokens must be comma-separated integers, got {args.tokens!r}", file=sys.stderr)
        return 2
    if any(t < 0 for t in tokens):
        print(f"megamoe validate: --tokens must be >= 0, got {tokens}", file=sys.stderr)
        return 2
    if args.sample < 1:
        print(f"megamoe validate: --sample must be >= 1 token, got {args.sample}", file=sys.stderr)
        return 2
    if not 0 <= args.seed < 2**32:
        print(f"megamoe validate: --seed must be in [0, 2^32), got {args.seed}", file=sys.stderr)
        return 2
    gpu = _has_cuda()
    if not gpu:  # before triton is imported: the interpreter is chosen at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"megamoe validate: needs torch and triton (pip install -e '.[gpu]'): {exc}", file=sys.stderr)
        return 2
    if not gpu:
        tokens = sorted({min(t, 64) for t in tokens})
        print("no GPU: kernels run under TRITON_INTERPRET=1 on shrunken layers in float32 "
              "(numerics and predictions only)", file=sys.stderr)
    ceilings = None
    if gpu:
        from megamoe.kernels.bench import measure_ceilings, provenance

        ceilings = measure_ceilings()
        prov = provenance()
    else:
        prov = {}
    failed = 0
    out = Path(args.out) if args.out else None
    for m in models:
        for T in tokens:
            r = validate_one(m, T, seed=args.seed, sample=args.sample, system=args.system, ceilings=ceilings)
            r.update(prov)
            if ceilings:
                r["ceilings"] = ceilings
            failed += not r["numerics"]["ok"]
            print(json.dumps(r) if args.json else format_row(r), flush=True)
            if out:
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    if failed:
        print(f"megamoe validate: {failed} row(s) outside the {'bfloat16' if gpu else 'float32'} tolerance",
              file=sys.stderr)
    return 1 if failed else 0
