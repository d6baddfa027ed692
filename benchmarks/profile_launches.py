"""Where the multi-launch layer's time goes, launch by launch, beside the cost model's price of each launch.

    python benchmarks/profile_launches.py [--presets a,b] [--tokens 512,4096] [--calls 5]
        [--profile PROFILE.json] [--out DIR]

For each preset and T (uniform routing from random bf16 weights, ``kernels.bench.random_device_weights``):
the kernels of ``moe_forward(backend="multi")`` under ``torch.profiler`` (CUDA activity, eager calls
after three warm-up calls), each kernel's GPU time per layer call, summed by kernel name over its
launches (the routed and shared GEMMs share a kernel); beside it the launch plan of the same routing
(``plan.launch_plan``) priced by the cost model (``simulator.cost.predict_launch_plan``, the stages
of each kernel summed) with ``--profile`` (a calibrated profile, e.g. a stored run's; predicted before
the kernels run; default the ``h200`` profile as written). Kernel times exclude the launch gaps a
CUDA graph has between them, and the model's stage times include one gap each: compare the big
stages, and read small ones with that in mind. Needs a CUDA GPU. With --out: DIR/launches.jsonl, a
row per (preset, T) with provenance.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def _kernel_times(fn, x, calls: int) -> dict:
    """{kernel name: GPU us per call} of ``calls`` eager calls of fn(x), under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    out = defaultdict(float)
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            us = getattr(e, "device_time", None)
            if us is None:
                us = getattr(e, "cuda_time", 0.0)
            out[e.name] += us / calls
    return dict(out)


def predicted_by_kernel(lp, profile) -> tuple[dict, dict]:
    """({kernel name: us}, the whole prediction): the cost model's price of launch plan lp's stages
    (``simulator.cost.predict_launch_plan``), summed by kernel as the profiler sums launches."""
    from megamoe.simulator import cost

    pred = cost.predict_launch_plan([s.to_dict() for s in lp.stages], profile)
    out = defaultdict(float)
    for s, p in zip(lp.stages, pred["stages"]):
        out[s.kernel] += p["time_us"]
    return dict(out), pred


def run_case(name: str, T: int, calls: int, profile) -> dict:
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe_forward, moe_forward_details
    from megamoe.kernels.grouped_gemm import device_sms
    from megamoe.kernels.plan import launch_plan

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    d = moe_forward_details(x, w, cfg)
    lp = launch_plan(cfg, T, topk_idx=d["topk_idx"].cpu().numpy(), dtype="bfloat16",
                     device_name=torch.cuda.get_device_name(0), num_sms=device_sms(x.device))
    predicted, pred = predicted_by_kernel(lp, profile)
    measured = _kernel_times(lambda a: moe_forward(a, w, cfg, backend="multi"), x, calls)
    return {"preset": name, "T": T, "calls": calls, "profile": pred["system"],
            "stages": [s.name for s in lp.stages], "kernels": {s.name: s.kernel for s in lp.stages},
            "measured_us": measured, "predicted_us": predicted,
            "measured_total_us": sum(measured.values()), "predicted_total_us": pred["time_us"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="deepseek-v3,qwen3-30b-a3b,mixtral-8x7b")
    ap.add_argument("--tokens", default="64,512,4096,16384")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--profile", default="h200", help="a system name or a calibrated profile JSON")
    ap.add_argument("--out", default=None, help="folder for launches.jsonl")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("profile_launches: needs a CUDA GPU", file=sys.stderr)
        return 2
    from megamoe.kernels.bench import fmt_num, provenance
    from megamoe.simulator.hardware import load_profile

    profile = load_profile(args.profile)
    prov = provenance()
    print(f"# {prov}; model profile {profile.name} ({args.profile})")
    out = Path(args.out) / "launches.jsonl" if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.presets.split(","):
        for T in (int(t) for t in args.tokens.split(",")):
            r = {**run_case(name, T, args.calls, profile), **prov}
            print(f"{name} T={T}: kernels {r['measured_total_us']:.1f} us a call, model {r['predicted_total_us']:.1f} "
                  f"(with its launch gaps and graph cost)")
            names = list(dict.fromkeys(list(r["predicted_us"]) + list(r["measured_us"])))
            for k in names:
                m, p = r["measured_us"].get(k), r["predicted_us"].get(k)
                err = f"{100 * (p - m) / m:+6.1f}%" if m and p is not None else "      -"
                print(f"    {k[:48]:48s} measured {fmt_num(m, '9.1f')}  model {fmt_num(p, '9.1f')}  {err}", flush=True)
            if out:
                with out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
