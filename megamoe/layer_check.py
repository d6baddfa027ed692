"""One MoE layer checked: the kernel's output against the float64 reference on sampled tokens, its
launch plan priced by the simulator (on a GPU also timed); and a ``megamoe bench`` row predicted.

Shape legend: T tokens, E experts, H hidden, I expert width.
"""

from __future__ import annotations

import os

from .grid import shrink_for_interpreter
from .report import stage_group


def measured_overrides(ceilings: dict, system: str = "h200") -> dict:
    """Profile overrides from this run's rates: HBM = the streaming-read rate; the bf16 (and fp8)
    peak rescaled so the profile's efficiency at the largest tile gives the measured matmul rate."""
    from megamoe.simulator import load_profile
    from megamoe.simulator.cost import gemm_efficiency

    p = load_profile(system)
    top = p.gemm_efficiency[-1][0]
    eff_top = float(gemm_efficiency([top], p.gemm_efficiency)[0])
    out = {"hbm_bandwidth": ceilings["read_bytes_per_s"], "hbm_efficiency": 1.0,
           "bf16_flops": ceilings["matmul_flops_per_s"] / eff_top}
    if ceilings.get("fp8_matmul_flops_per_s"):
        out["fp8_flops"] = max(ceilings["fp8_matmul_flops_per_s"] / eff_top, out["bf16_flops"])
    return out


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


def validate_one(model: str, T: int, *, gpu: bool, seed: int = 0, sample: int = 16, system: str = "h200",
                 ceilings: dict | None = None, reps: int = 50) -> dict:
    """One (model, T) row: numerics, prediction, and on a GPU (``gpu``) the measurement; without
    one the layer is shrunk and runs under TRITON_INTERPRET=1 in float32."""
    import torch

    from megamoe import kernels
    from megamoe.numerics import check_numerics
    from megamoe.reference import MoEConfig, random_weights
    from megamoe.simulator.cost import predict_launch_plan

    cfg = MoEConfig.preset(model)
    if gpu:
        from megamoe.kernels.bench import random_device_weights

        dtype, tdtype, device = "bfloat16", torch.bfloat16, "cuda"
        w = random_device_weights(cfg, seed)
        dev_name = torch.cuda.get_device_name(0)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        cfg = shrink_for_interpreter(cfg)
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


def recorded_gemm(row: dict) -> dict | None:
    """The GEMM entries a bf16 multi-launch ``megamoe bench`` row ran (its "config"), checked; None
    for a megakernel row or one without them (it is then priced with today's select_config)."""
    from megamoe.kernels.configs import KernelConfigError, check_entry

    config = row.get("config")
    if row.get("backend", "multi") != "multi" or not isinstance(config, dict):
        return None
    try:
        return check_entry(config, "the bench row's config")
    except KernelConfigError:
        return None


def predict_bench_row(row: dict, *, system: str = "h200", seed: int = 0) -> dict:
    """The simulator's prediction for a ``megamoe bench`` row, without a GPU: routing drawn as the
    bench's (logits ~ N(0, 1), ``seed``), so the plan is statistically equivalent, not identical.
    Returns the measured time, predictions with the profile and with the run's rates, and whether
    the GEMM tiles match; fp8 rows (``row["dtype"]``) get the FP8 launch plan."""
    import numpy as np

    from megamoe.kernels.bench import DTYPES, bench_config
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import select_experts
    from megamoe.simulator.cost import predict_launch_plan

    cfg = bench_config(row["preset"])
    T = int(row["T"])
    rng = np.random.default_rng(seed)
    bias = 0.05 * rng.standard_normal(cfg.num_experts) if cfg.score_bias else None
    idx, _ = select_experts(rng.standard_normal((T, cfg.num_experts)), cfg, score_bias=bias)
    fp8 = DTYPES[row.get("dtype", "bf16")]
    gemm = recorded_gemm(row) if fp8 is None else None
    plan = launch_plan(cfg, topk_idx=idx, dtype="bfloat16", device_name=row.get("gpu", "NVIDIA H200"),
                       triton_version=row.get("triton"), deterministic=bool(row.get("deterministic", True)), fp8=fp8,
                       gemm=gemm)
    stages = [st.to_dict() for st in plan.stages]
    g1 = plan.stage("gemm1").tile if any(st.name == "gemm1" for st in plan.stages) else {}
    same_tiles = all(g1.get(k) == v for k, v in row.get("config", {}).get("gemm1", {}).items())
    full = predict_launch_plan(stages, system)
    pred = full["time_us"]
    main = max(full["stages"], key=lambda s: s["time_us"]) if full["stages"] else {"name": "-", "bound": "launch"}
    out = {"preset": row["preset"], "T": T, "dtype": row.get("dtype", "bf16"), "measured_us": row["ours_us"],
           "predicted_us": pred,
           "dominant": f"{main['name']}:{main['bound']}", "predicted_fixed_us": full["fixed_us"],
           "ratio": row["ours_us"] / pred, "same_tiles": same_tiles,
           "gpu": row.get("gpu"), "triton": row.get("triton"), "date": row.get("date"), "commit": row.get("commit"),
           "gemm_from": "the row" if gemm is not None else "select_config today"}
    if "stage_us" in row:  # the bench's per-stage split: router+align, gemm1, gemm2, combine
        groups: dict[str, float] = {}
        for st in full["stages"]:
            key = stage_group(st["name"])
            if key:
                groups[key] = groups.get(key, 0.0) + st["time_us"]
        out["stages"] = {k: {"measured_us": v, "predicted_us": groups.get(k)} for k, v in row["stage_us"].items()}
    if "ceiling_read_bytes_per_s" in row:
        ov = measured_overrides({"read_bytes_per_s": row["ceiling_read_bytes_per_s"],
                                 "matmul_flops_per_s": row["ceiling_matmul_flops_per_s"],
                                 "fp8_matmul_flops_per_s": row.get("ceiling_fp8_matmul_flops_per_s")}, system)
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
