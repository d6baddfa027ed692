"""The cost model's prediction of megakernel variants against the default, before a GPU run times them.

    python benchmarks/predict_variants.py --profile benchmarks/results/h200/validation/profile.json \
        [--variants reach,ptrw] --tokens 1,8 [--presets a,b] [--calls 8] [--routing uniform|concentrated] [--fp8 weights+act]

For each preset and T: a uniform random routing (seed 0; ``--routing concentrated``: every token on
experts 0..K-1, as bench_megakernel.py's zeroed router gives), the default config
(kernels.megakernel_config.megakernel_config) and each named variant of megakernel_variants.py, their task
plans (reference.tiles.task_plan) priced by simulator.task_cost.predict_task_plan with the profile (a
calibrated profile.json or a profile name; ``--variants``: default, those bench_megakernel.py times at
that T), ``--calls`` layer calls per CUDA graph (as megamoe
validate times them). No GPU: the printed lines are the prediction to hold the GPU run against.
"""

from __future__ import annotations

import argparse

import numpy as np
from megakernel_variants import variant_configs, variant_names

PRESETS = ("qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b")


def predict(cfg, counts, T: int, mk: dict, profile, calls: int, fp8: str | None = None) -> float:
    """The cost model's time of the megakernel config ``mk``: ``megamoe.predict.predict_config``, the
    price every other tool gives a megakernel row; ``fp8`` ("weights" / "weights+act"): the same plan
    with its weight bytes e4m3 with their block scales (and its activation bytes one a code, the MMA
    rate fp8's, with "weights+act"), at the same pipeline depths in those bytes."""
    from megamoe.predict import megakernel_read_depth, megakernel_task_plan, megakernel_weight_depth, predict_config
    from megamoe.reference.tiles import task_plan
    from megamoe.simulator.cost import weight_bytes_per_element
    from megamoe.simulator.task_cost import predict_task_plan

    if not fp8:
        return predict_config(cfg, counts, T, "megakernel", profile, device_name=profile.name,
                              calls_per_graph=calls, mk=mk)["predicted_us"]
    act8 = fp8 == "weights+act"
    w8 = weight_bytes_per_element("fp8_e4m3")
    bf16, warps, loads = megakernel_task_plan(cfg, counts, T, device_name=profile.name, profile=profile, mk=mk)
    plan = task_plan(cfg, counts, T, mk["tiles"], act_bytes=1 if act8 else 2, weight_bytes=w8,
                     num_programs=bf16.num_programs)
    return predict_task_plan(plan, profile, num_warps=warps, calls_per_graph=calls, weight_loads=loads,
                             dtype="fp8" if act8 else "bf16", read_depth=megakernel_read_depth(mk),
                             weight_depth=megakernel_weight_depth(mk, w8))["time_us"]


def main(argv=None) -> int:
    from megamoe.kernels import bench as kb
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.simulator.hardware import load_profile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="h200")
    p.add_argument("--variants", default=None, help="comma-separated names of megakernel_variants.VARIANTS "
                                                       "(default: the ones timed at each T, variant_names)")
    p.add_argument("--tokens", default="1,8")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--routing", choices=("uniform", "concentrated"), default="uniform")
    p.add_argument("--fp8", choices=("weights", "weights+act"), default=None,
                   help="the FP8 megakernel (bench_megakernel.py --fp8) and its FP8 variants")
    a = p.parse_args(argv)
    prof = load_profile(a.profile)
    rng = np.random.default_rng(0)
    for name in a.presets.split(","):
        cfg = kb.bench_config(name)  # the preset as bench_megakernel.py times it (DeepSeek-V3: routed experts)
        for T in (int(t) for t in a.tokens.split(",")):
            if a.routing == "concentrated":
                counts = np.zeros(cfg.num_experts, dtype=np.int64)
                counts[:cfg.top_k] = T
            else:
                idx = np.stack([rng.choice(cfg.num_experts, cfg.top_k, replace=False) for _ in range(T)])
                counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
            base = mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                          cfg.shared_intermediate_size, T, num_sms=prof.num_sms, fp8=a.fp8)
            names = a.variants.split(",") if a.variants else list(variant_names(T, a.fp8))
            runs = variant_configs(base, names)
            us = {v: predict(cfg, counts, T, mk, prof, a.calls, a.fp8) for v, mk in runs}
            d = us["default"]
            print(f"{name} T={T} {a.routing}: default {d:.1f} us" + "".join(f", {v} {u:.1f} ({u / d:.2f})"
                                                             for v, u in us.items() if v != "default"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
