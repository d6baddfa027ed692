"""``megamoe validate``: run the real kernel and the simulator on the same launch plan, and compare.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, S sampled tokens.

This is the one place that reads both the kernels and the simulator. Three runs:

- on a GPU (``megamoe validate --profile DIR/profile.json --out DIR2``): presets x T x routing x
  backend, each configuration predicted from the calibrated profile (and from ``h200`` as
  written) before it is measured; compile-ahead, budget, watchdog and resume in
  ``megamoe.scale``; the report (``write_report``: report.json, report.md, scatter.png) at the end;
- ``--report DIR_or_jsonl`` (no GPU): the same report from stored rows; with ``--repredict PROFILE``
  the stored measurements predicted again with another profile (megamoe/repredict.py), with
  ``--switch USE_NAME=on|off`` a cost-model switch set for that re-prediction only;
- without a GPU, or with ``--numerics`` on one: per (model, T), the kernel runs the layer, its
  output is checked against the float64 reference on S sampled tokens (``megamoe.numerics``),
  and the kernels' launch plan (``megamoe.kernels.launch_plan``) goes, as plain data, to the
  simulator's launch model (``megamoe.simulator.cost.predict_launch_plan``). Without a GPU the
  kernels run under ``TRITON_INTERPRET=1`` on a shrunken layer in float32: numerics and
  predictions only. On a GPU the layer is also timed and each kernel's time read from the torch
  profiler, with the prediction made twice: from the ``h200`` profile and with the HBM and
  matmul rates measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .scale import (
    BACKENDS,
    COMPARE_PROFILES,
    CONFIG_TIMEOUT_S,
    ROUTINGS,
    SCALE_PRESETS,
    SCALE_TOKENS,
    shrink_for_interpreter,
)

DEFAULT_MODELS = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3"
DEFAULT_TOKENS = "1,64,512,4096"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def measured_overrides(ceilings: dict, system: str = "h200") -> dict:
    """Profile overrides from rates measured in this run: HBM = the streaming-read rate; the bf16
    peak rescaled so that the profile's efficiency at the largest tile gives the measured matmul
    rate, and the fp8 peak the same way from the FP8 matmul rate where the run measured one."""
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


def validate_one(model: str, T: int, *, seed: int = 0, sample: int = 16, system: str = "h200",
                 ceilings: dict | None = None, reps: int = 50) -> dict:
    """One (model, T) row: numerics, prediction, and on a GPU the measurement."""
    import torch

    from megamoe import kernels
    from megamoe.numerics import check_numerics
    from megamoe.reference import MoEConfig, random_weights
    from megamoe.simulator.cost import predict_launch_plan

    gpu = _has_cuda()
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


def predict_bench_row(row: dict, *, system: str = "h200", seed: int = 0) -> dict:
    """The simulator's prediction for a row that ``megamoe bench`` measured, without a GPU.

    The bench routed random tokens with random router weights (logits ~ N(0, 1)); the same
    distribution is drawn here with ``seed``, so the launch plan is statistically equivalent to the
    measured one, not identical (decode rows, where few experts are touched, vary most). Returns
    the measured time, the predictions with the profile and with the rates the bench measured in
    its run, and whether the plan's GEMM tiles are the ones the bench ran. Rows of ``--dtype fp8``
    or ``fp8-act`` (``row["dtype"]``; bf16 without it) get the FP8 launch plan.
    """
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
    plan = launch_plan(cfg, topk_idx=idx, dtype="bfloat16", device_name=row.get("gpu", "NVIDIA H200"),
                       triton_version=row.get("triton"), deterministic=bool(row.get("deterministic", True)), fp8=fp8)
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
           "gpu": row.get("gpu"), "triton": row.get("triton"), "date": row.get("date"), "commit": row.get("commit")}
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


GPU_RUN_HELP = f"""\
The GPU run (a CUDA GPU and no --numerics): every configuration preset x T x routing x backend,
each predicted (row written) before it is measured (row written again), into
DIR/validation_<date>.jsonl, then DIR/report.md, report.json and scatter.png.

Default configuration set: presets {SCALE_PRESETS} x T {','.join(map(str, SCALE_TOKENS))}
x routings {','.join(ROUTINGS)} x backends {','.join(BACKENDS)} = 108 configurations, T-major (all
presets at T=1, then T=8, ...), so a budget that runs out still leaves every preset measured at the
smaller T (T <= 4096 alone is 90). Three presets rather than five because a megakernel
configuration compiles in 15-30 s: Qwen3-30B-A3B (small experts), Mixtral-8x7B (8 large experts)
and DeepSeek-V3 (grouped sigmoid routing and a shared expert). On an H200 with a cold Triton cache:
about 2 min of compile-ahead on 16 cores, then about 1-2 min of measuring.

--budget S: no configuration starts unless its estimate ends 15 s before S (the report's share);
the compile-ahead (--warm, on by default) takes at most half of S. A configuration that raises is a
row with phase "failed" and its error; one that hangs is ended by the watchdog (--config-timeout,
exit code 4); a lost CUDA context ends the run (exit code 3). Either way the report is written,
and --resume in the same --out goes on with what is left in a fresh process.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = GPU_RUN_HELP
    parser.add_argument("--models", default=None, help=f"comma-separated presets (default: GPU run {SCALE_PRESETS}; "
                        f"CPU or --numerics {DEFAULT_MODELS})")
    parser.add_argument("--tokens", default=None, help="comma-separated T (default: GPU run "
                        f"{','.join(map(str, SCALE_TOKENS))}; CPU or --numerics {DEFAULT_TOKENS}, without a GPU capped at 64)")
    parser.add_argument("--routings", default=",".join(ROUTINGS), help=f"GPU run: routings (default {','.join(ROUTINGS)})")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"GPU run: backends (default {','.join(BACKENDS)})")
    parser.add_argument("--profile", default=None, help="calibrated profile JSON (megamoe calibrate); overrides --system "
                        "as the profile whose predictions the report judges")
    parser.add_argument("--compare-profiles", default=COMPARE_PROFILES, help="GPU run: comma-separated profiles that "
                        f"also predict every configuration, recorded beside it (default {COMPARE_PROFILES}; '' for none)")
    parser.add_argument("--stages", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU run: also time the multi-launch path's stages (prefixes of the pipeline) for the "
                             "report's per-stage errors")
    parser.add_argument("--reps", type=int, default=5, help="GPU run: CUDA-graph replays per configuration (median)")
    parser.add_argument("--idle-before", type=float, default=0.0, metavar="SECONDS",
                        help="GPU run: leave the GPU idle this long before each configuration's layer timing (and "
                             "each stage prefix's), so that it starts from the idle clocks the cost model's sustained "
                             "ratio assumes (calibrate's sustained step pauses 1.5 s); default 0, back to back")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="GPU run: wall-time limit from the start (default none); see below")
    parser.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU run: compile every configuration's kernels first, in parallel processes (default on)")
    parser.add_argument("--warm-procs", type=int, default=None,
                        help="GPU run: compile-ahead processes at once (default: the CPU count)")
    parser.add_argument("--config-timeout", type=float, default=CONFIG_TIMEOUT_S, metavar="SECONDS",
                        help=f"GPU run: a configuration running longer is taken for a hang (default {CONFIG_TIMEOUT_S:.0f})")
    parser.add_argument("--resume", action="store_true", help="GPU run: skip the configurations --out already has an "
                        "outcome for")
    parser.add_argument("--scale", action="store_true", help="run the GPU run's loop even without a GPU (interpreter, "
                        "shrunken layers, meaningless times): a smoke test of its machinery")
    parser.add_argument("--numerics", action="store_true", help="on a GPU: the per-(model, T) numerics-and-timing "
                        "rows instead of the predicted-vs-measured run")
    parser.add_argument("--report", metavar="DIR_OR_JSONL", default=None,
                        help="no GPU: rebuild report.md, report.json and scatter.png from stored rows (into --out or beside them)")
    parser.add_argument("--system", default="h200", help="simulator profile of the GPU the kernel runs on")
    parser.add_argument("--repredict", metavar="PROFILE", default=None,
                        help="with --report: predict the stored rows again with this profile (name or profile.json), "
                             "offline, from the counts the rows carry; the report says so (megamoe/repredict.py)")
    parser.add_argument("--switch", action="append", default=[], metavar="USE_NAME=on|off",
                        help="with --repredict: set a cost-model switch (simulator/cost.py USE_*) for this "
                             "re-prediction; in the GPU run (or --scale): for its predictions, made before each "
                             "measurement (rows carry cost_switches); repeatable; the report's note lists them")
    parser.add_argument("--variant", action="append", default=[], metavar="USE_A=on[,USE_B=off...]",
                        help="in the GPU run (or --scale): one more prediction per row, made before the measurement "
                             "with the first profile and these cost switches on top of --switch, stored under "
                             "predictions['<profile>+<label>'] so that the report gives its statistics too: several "
                             "model variants held out by one measurement; repeatable")
    parser.add_argument("--counts-from", metavar="DIR_OR_JSONL", default=None,
                        help="with --repredict: rows without counts (rebuilt from a log) take the counts and "
                             "calls_per_graph of the same configuration in these stored rows (a run of the same "
                             "seeds, presets and routings: the routings are deterministic)")
    parser.add_argument("--sample", type=int, default=16, help="tokens checked against the float64 reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="GPU run / --report: output folder; otherwise append rows as "
                        "JSON lines to this file")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--from-bench", metavar="JSONL", default=None,
                        help="no kernel run: predict the rows a `megamoe bench` run measured and compare")


def scale_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the GPU run's options (None if nothing), before any GPU work."""
    from megamoe.reference import PRESETS
    from megamoe.simulator import ProfileError, load_profile

    bad = [m.strip() for m in args.models.split(",") if m.strip() and m.strip() not in PRESETS]
    if bad:
        return f"unknown model(s) {bad}; presets: {', '.join(PRESETS)}"
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        return f"--tokens must be comma-separated integers, got {args.tokens!r}"
    if not tokens or any(t < 1 for t in tokens):
        return f"--tokens must list token counts >= 1 for the GPU run, got {args.tokens!r}"
    for opt, given, allowed in (("--routings", args.routings, ROUTINGS), ("--backends", args.backends, BACKENDS)):
        names = [r.strip() for r in given.split(",") if r.strip()]
        if not names or any(r not in allowed for r in names):
            return f"{opt} must be a comma-separated subset of {','.join(allowed)}, got {given!r}"
    if args.reps < 1:
        return f"--reps must be >= 1, got {args.reps}"
    if args.budget is not None and not args.budget > 0:
        return f"--budget must be a positive number of seconds, got {args.budget}"
    if not args.config_timeout > 0:
        return f"--config-timeout must be positive, got {args.config_timeout}"
    if args.warm_procs is not None and args.warm_procs < 1:
        return f"--warm-procs must be >= 1, got {args.warm_procs}"
    for spec in [args.profile or args.system, *(s.strip() for s in (args.compare_profiles or "").split(","))]:
        if spec:
            try:
                load_profile(spec)
            except ProfileError as exc:
                return f"profile: {exc}"
    return None


def bench_row_problem(r: dict) -> str | None:
    """What makes a bench row unusable for ``--from-bench`` (None if nothing): checked for every row
    before any prediction."""
    import math

    from megamoe.kernels.bench import DTYPES
    from megamoe.reference import PRESETS

    if r.get("preset") not in PRESETS:
        return f"preset {r.get('preset')!r} is not a preset ({', '.join(PRESETS)})"
    if r.get("dtype", "bf16") not in DTYPES:
        return f"dtype={r.get('dtype')!r} is not one of megamoe bench's ({', '.join(DTYPES)})"
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
            print(f"{c['preset']:<16} T={c['T']:<6} {c['dtype']:<7} measured {c['measured_us']:9.1f} us  predicted "
                  f"{c['predicted_us']:9.1f} us (meas/pred {c['ratio']:.2f}){extra}"
                  f"{'' if c['same_tiles'] else '  [tiles differ from the run]'}")
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(c) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    from megamoe.reference import PRESETS

    if args.counts_from and not args.repredict:
        print("megamoe validate: --counts-from needs --repredict PROFILE", file=sys.stderr)
        return 2
    if args.counts_from and not Path(args.counts_from).exists():
        print(f"megamoe validate: --counts-from {args.counts_from!r} does not exist", file=sys.stderr)
        return 2
    if getattr(args, "variant", None) and (args.repredict or args.report or not (_has_cuda() or args.scale)):
        print("megamoe validate: --variant is for the GPU run (or --scale), whose predictions come before its "
              "measurements; to re-predict stored rows with other switches, run --repredict once per --switch set",
              file=sys.stderr)
        return 2
    if getattr(args, "switch", None) and not (args.repredict or _has_cuda() or args.scale):
        print("megamoe validate: --switch needs --repredict PROFILE or the GPU run (or --scale)", file=sys.stderr)
        return 2
    if args.repredict and not args.report:
        print("megamoe validate: --repredict needs --report DIR (the stored rows to predict again)", file=sys.stderr)
        return 2
    if args.report:
        src = Path(args.report)
        if not src.exists():
            print(f"megamoe validate: --report {str(src)!r} does not exist", file=sys.stderr)
            return 2
        rows, failed = load_outcomes(src)
        from .report_rows import scan, summary

        unusable = summary(*scan(_row_files(src)))
        for line in unusable:
            print(f"megamoe validate: {line}", file=sys.stderr)
        if not rows:
            print(f"megamoe validate: {src} holds no rows with predicted_us and measured_us", file=sys.stderr)
            return 2
        out = Path(args.out) if args.out else (src if src.is_dir() else src.parent)
        notes = tuple(unusable)
        if args.repredict:
            from megamoe.simulator.hardware import load_profile

            from .repredict import parse_switches, repredict_rows, switch_note, switches

            try:
                settings = parse_switches(getattr(args, "switch", None))
            except ValueError as e:
                print(f"megamoe validate: {e}", file=sys.stderr)
                return 2
            profile = load_profile(args.repredict)
            borrowed = 0
            if args.counts_from:
                rows, borrowed = borrow_counts(rows, args.counts_from)
            with switches(settings):
                rows, skipped = repredict_rows(rows, profile)
            if not rows:
                print(f"megamoe validate: no row of {src} carries counts (rows written since run K do): nothing "
                      "to predict again", file=sys.stderr)
                return 2
            out = Path(args.out) if args.out else out / f"repredicted-{profile.name}"
            notes = (f"Re-predicted offline with profile {profile.name} from the stored measurements' routings "
                     f"({len(rows)} rows; {skipped} without counts left out): not predictions made before the "
                     "measurements.",) + ((f"{borrowed} rows took their counts from {args.counts_from} (the same "
                                           "configurations' routings)",) if borrowed else ()) + \
                switch_note(settings, "this re-prediction") + tuple(unusable)
        write_report(rows, out, failures=failed, notes=notes)
        return 0
    if args.from_bench:
        return run_from_bench(Path(args.from_bench), args)
    scale = (_has_cuda() or args.scale) and not args.numerics
    args.models = args.models or (SCALE_PRESETS if scale else DEFAULT_MODELS)
    args.tokens = args.tokens or (",".join(map(str, SCALE_TOKENS)) if scale else DEFAULT_TOKENS)
    if scale:
        bad = scale_args_problem(args)
        if bad:
            print(f"megamoe validate: {bad}", file=sys.stderr)
            return 2
        if not _has_cuda():  # --scale on the CPU: before triton is imported
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from .scale import run_scale

        args.out = args.out or "validate-out"
        from .repredict import parse_switches, parse_variants, switches

        try:
            args.cost_switches = parse_switches(getattr(args, "switch", None))
            args.variants = parse_variants(getattr(args, "variant", None))
        except ValueError as e:
            print(f"megamoe validate: {e}", file=sys.stderr)
            return 2
        with switches(args.cost_switches):  # the predictions, made before each measurement, with these switches
            return run_scale(args)

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


OUTLIER = 0.15  # |pred - meas| / meas beyond which the report lists a configuration
#: the multi-launch stages as the GPU runs measure them (CUDA-graph times of the pipeline's
#: prefixes, kernels.bench.stage_split: megamoe bench --breakdown and validate's GPU run), each with
#: the plan's stages it holds (by name prefix)
STAGE_GROUPS = {"router+align": ("router", "align"), "gemm1": ("quantize_x", "gemm1"), "gemm2": ("gemm2", "shared"),
                "combine": ("combine",)}


def stage_group(name: str) -> str | None:
    """The measured stage group (STAGE_GROUPS) of a launch-plan stage, None if none holds it."""
    return next((g for g, pre in STAGE_GROUPS.items() if name.startswith(pre)), None)


def stage_errors(rows: list[dict]) -> dict:
    """Per measured stage group of the multi-launch rows that carry ``measured_stages_us``: the
    signed errors (predicted - measured) / measured of the group's summed predicted stages, and
    their median, median |error| and max |error|. Groups under 2 us measured are left out (a
    difference of two graph times is noise there)."""
    import numpy as np

    errs: dict[str, list] = {g: [] for g in STAGE_GROUPS}
    for r in rows:
        meas, pred = r.get("measured_stages_us"), r.get("predicted_stages")
        if not meas or not pred:
            continue
        sums: dict[str, float] = {}
        for name, v in pred.items():
            g = stage_group(name)
            if g:
                sums[g] = sums.get(g, 0.0) + float(v["us"])
        for g, m in meas.items():
            if g in sums and m >= 2.0:
                errs[g].append(((sums[g] - m) / m, r))
    out = {}
    for g, es in errs.items():
        if not es:
            continue
        e = np.array([x for x, _ in es])
        worst = max(es, key=lambda x: abs(x[0]))
        out[g] = {"configurations": int(e.size), "median_error": float(np.median(e)),
                  "median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.abs(e).max()),
                  "worst": {k: worst[1][k] for k in ("preset", "T", "routing")} | {"error": worst[0]}}
    return out


# --------------------------------------------------------------------------- the report
def _row_files(src: Path) -> list[Path]:
    if not src.is_dir():
        return [src]
    return sorted(src.glob("validation_*.jsonl")) or sorted(src.glob("*.jsonl"))


def _last_rows(src: str | Path) -> tuple[dict, dict]:
    """({key: last row with predicted_us and measured_us}, {key: last row}) of a jsonl file or of
    every validation_*.jsonl (else *.jsonl) in a folder. Lines that are not JSON objects (one cut
    short when a run was killed) are skipped."""
    from .report_rows import row_problem

    measured: dict = {}
    last: dict = {}
    for p in _row_files(Path(src)):
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(r, dict) or "T" not in r or row_problem(r):  # counted by report_rows.scan
                continue
            r.setdefault("routing", "uniform")
            r.setdefault("backend", "multi")
            r.setdefault("preset", r.get("model"))
            key = (r["preset"], r["T"], r["routing"], r["backend"])
            last[key] = r
            if r.get("predicted_us") is not None and r.get("measured_us") is not None:
                measured[key] = r
    return measured, last


def load_rows(src: str | Path) -> list[dict]:
    """Measured rows from a jsonl file or every validation_*.jsonl / *.jsonl in a folder: the last
    row per (preset, T, routing, backend) that has both predicted_us and measured_us."""
    return list(_last_rows(src)[0].values())


def borrow_counts(rows: list[dict], src: str | Path) -> tuple[list[dict], int]:
    """(rows, how many took counts): each row without ``counts`` gets the counts and calls_per_graph
    of the same (preset, T, routing, backend) among the measured rows of ``src``, where it has them.
    For rows rebuilt from a log (run AC's), whose routings are those of every run with the same
    seeds: runs U, W, X and Z hold identical counts for all 108 configurations."""
    other = {(o["preset"], o["T"], o["routing"], o["backend"]): o for o in load_rows(src) if "counts" in o}
    out, n = [], 0
    for r in rows:
        o = other.get((r["preset"], r["T"], r["routing"], r["backend"]))
        if "counts" not in r and o is not None:
            r = {**r, "counts": o["counts"], "calls_per_graph": o.get("calls_per_graph", 1), "counts_from": str(src)}
            n += 1
        out.append(r)
    return out, n


def load_outcomes(src: str | Path) -> tuple[list[dict], list[dict]]:
    """(measured rows as ``load_rows``, failed rows): a configuration failed when it has no
    measured row and its last row is a failure, or only its prediction (the run ended during it)."""
    measured, last = _last_rows(src)
    failed = []
    for key, r in last.items():
        if key in measured or r.get("phase") not in ("failed", "prediction"):
            continue
        if r.get("phase") == "prediction":
            r = {**r, "phase": "failed", "failure": "no measurement row: the run ended during this configuration"}
        failed.append(r)
    return list(measured.values()), failed


def _stage_gaps(r: dict) -> dict:
    """{group: (predicted us, measured us, the group's largest predicted plan stage)} of a multi row
    that carries both ``predicted_stages`` and ``measured_stages_us`` (STAGE_GROUPS); {} otherwise."""
    meas, pred = r.get("measured_stages_us"), r.get("predicted_stages")
    if not meas or not pred:
        return {}
    sums: dict[str, float] = {}
    top: dict[str, str] = {}
    for name, v in pred.items():
        g = stage_group(name)
        if g:
            sums[g] = sums.get(g, 0.0) + float(v["us"])
            if g not in top or float(v["us"]) > float(pred[top[g]]["us"]):
                top[g] = name
    return {g: (sums[g], float(m), top[g]) for g, m in meas.items() if g in sums}


def _term_of(stage: dict, r: dict, name: str) -> str:
    """The model term behind the predicted stage (or task kind) ``name`` of row ``r``: its own
    ``term`` where the prediction recorded one (rows predicted since this field), else named from
    its bound, or from the row's ``dominant`` ("part:bound") where that is the same part; rows
    predicted before the memory terms were told apart say only "memory"."""
    from megamoe.simulator.cost import term_name

    if stage.get("term"):
        return stage["term"]
    bound = stage.get("bound")
    dom, _, dom_bound = (r.get("dominant") or "").partition(":")
    if bound is None and dom == name and dom_bound:
        bound = dom_bound
    if bound is None:
        return "a term this row does not record"
    if bound == "memory":
        return "memory traffic (HBM, L2 hits or the SMs' intake: this row does not record which)"
    return term_name(bound)


def likely_cause(r: dict) -> str:
    """Why a configuration is off, as far as the row can tell.

    A multi-launch row with measured stages (``measured_stages_us``): the stage group whose
    predicted-vs-measured gap (us, the sign of the layer's error first) is largest, its plan stage
    with the most predicted time and the model term that stage is bound by. Otherwise (the
    megakernel is one launch; rows rebuilt from a log have no stages) it says there are no
    per-stage figures and names the prediction's dominant part and term: the critical path's
    largest task kind (megakernel) or the longest stage (multi), from ``predicted_stages`` or
    ``dominant``."""
    err = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
    side = "over-predicted" if err > 0 else "under-predicted"
    gaps = _stage_gaps(r)
    # a stage measured at or below zero: the graphs of the pipeline's prefixes disagree with the
    # whole layer's (the layer timed faster than its own prefix), so that difference is noise, not a stage
    noise = {g: v for g, v in gaps.items() if v[1] <= 0}
    gaps = {g: v for g, v in gaps.items() if v[1] > 0}
    said = ""
    if noise:
        said = "; " + ", ".join(f"{g} measured {v[1]:.1f} us" for g, v in noise.items()) + (
            " (the whole layer's graph timed faster than its prefix's: the prefixes' timings disagree with it "
            "by that much, so this row's stage split is noise there)")
    if gaps:
        same = {g: v for g, v in gaps.items() if (v[0] - v[1]) * err > 0} or gaps
        g = max(same, key=lambda k: abs(same[k][0] - same[k][1]))
        p, m, stage = same[g]
        return (f"{side}: largest stage gap {g}, predicted {p:.1f} us against {m:.1f} measured ({(p - m) / m:+.0%}); "
                f"its stage {stage} is priced by {_term_of(r['predicted_stages'][stage], r, stage)}{said}")
    why = ("no per-stage figures in this row (one persistent launch)" if r.get("backend") == "megakernel"
           else "no per-stage figures in this row") + said
    pred = r.get("predicted_stages") or {}
    if pred:
        main = max(pred, key=lambda k: float(pred[k]["us"]))
        total = sum(float(v["us"]) for v in pred.values())
        part = "critical path" if r.get("backend") == "megakernel" else "stages"
        return (f"{side}; {why}; the prediction's {part}: mostly {main} ({float(pred[main]['us']):.0f} of "
                f"{total:.0f} us), priced by {_term_of(pred[main], r, main)}")
    dom = r.get("dominant")
    if dom:
        from megamoe.simulator.cost import term_name

        name, _, bound = dom.partition(":")
        term = r.get("dominant_term") or (
            "memory traffic (this row does not record which term)" if bound == "memory" else term_name(bound or "wait"))
        return f"{side}; {why}; the prediction's dominant part is {name}, priced by {term}"
    return f"{side}; {why} and no prediction detail (a row rebuilt from a log: re-predict it for the dominant term)"


def _abs_err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def report_stats(rows: list[dict]) -> dict:
    """Errors of the rows' own predictions (``predicted_us``: the profile the run was given) overall
    and by backend, of every profile the rows also hold (``predictions``), and the outliers."""
    import numpy as np

    err = np.array([_abs_err(r["predicted_us"], r["measured_us"]) for r in rows])
    out = {"configurations": len(rows), "median_abs_error": float(np.median(err)) if err.size else None,
           "max_abs_error": float(err.max()) if err.size else None, "by_backend": {},
           "profiles": sorted({r["profile"] for r in rows if r.get("profile")}), "by_profile": {}}
    for b in sorted({r["backend"] for r in rows}):
        e = np.array([_abs_err(r["predicted_us"], r["measured_us"]) for r in rows if r["backend"] == b])
        out["by_backend"][b] = {"configurations": int(e.size), "median_abs_error": float(np.median(e)),
                                "max_abs_error": float(e.max())}
    per: dict[str, dict[str, list]] = {}
    for r in rows:
        for name, p in (r.get("predictions") or {}).items():
            if isinstance(p.get("predicted_us"), (int, float)):
                per.setdefault(name, {}).setdefault(r["backend"], []).append(_abs_err(p["predicted_us"], r["measured_us"]))
    for name, by in sorted(per.items()):
        e = np.array([v for vs in by.values() for v in vs])
        out["by_profile"][name] = {"configurations": int(e.size), "median_abs_error": float(np.median(e)),
                                   "max_abs_error": float(e.max()), "outside_15pct": int((e > OUTLIER).sum()),
                                   "by_backend": {b: float(np.median(v)) for b, v in sorted(by.items())}}
    out["outside_15pct"] = sorted(
        ({"preset": r["preset"], "T": r["T"], "routing": r["routing"], "backend": r["backend"],
          "predicted_us": r["predicted_us"], "measured_us": r["measured_us"],
          "error": (r["predicted_us"] - r["measured_us"]) / r["measured_us"], "likely_cause": likely_cause(r)}
         for r in rows if abs(r["predicted_us"] - r["measured_us"]) > OUTLIER * r["measured_us"]),
        key=lambda x: -abs(x["error"]))
    out["stages"] = stage_errors(rows)
    return out


def write_report(rows: list[dict], out: Path, *, notes=(), failures=(), run: dict | None = None) -> dict:
    """report.json, report.md and scatter.png in ``out`` from measured ``rows``; ``failures``
    (rows with phase "failed") are listed with their errors, ``run`` (the GPU run's summary) is
    kept in report.json. Returns the statistics."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    st = report_stats(rows)
    st["notes"] = list(notes)
    st["failed"] = [{"preset": f.get("preset"), "T": f.get("T"), "routing": f.get("routing"), "backend": f.get("backend"),
                     "failure": f.get("failure")} for f in failures]
    if run is not None:
        st["run"] = {k: v for k, v in run.items() if k != "lines"}
    (out / "report.json").write_text(json.dumps(st, indent=1, default=str))
    head = [f"# Predicted vs measured: {st['configurations']} configurations"
            + (f" ({len(failures)} more failed)" if failures else ""), ""]
    if rows:
        own = ", ".join(st["profiles"]) or "the run's profile"
        head.append(f"median |pred - meas| / meas = {st['median_abs_error']:.1%}, max = {st['max_abs_error']:.1%} ({own})")
        for b, s in st["by_backend"].items():
            head.append(f"- {b}: {s['configurations']} configurations, median {s['median_abs_error']:.1%}, "
                        f"max {s['max_abs_error']:.1%}")
        for name, s in st["by_profile"].items():
            head.append(f"- profile {name}: median {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over "
                        f"{s['configurations']}, {s['outside_15pct']} outside {OUTLIER:.0%} ("
                        + ", ".join(f"{b} {v:.1%}" for b, v in s["by_backend"].items()) + ")")
    head += [f"- note: {n}" for n in notes]
    lines = head + ["", f"## Outside {OUTLIER:.0%}", "",
                    "| preset | T | routing | backend | predicted us | measured us | error | likely cause |",
                    "|---|---|---|---|---|---|---|---|"]
    for o in st["outside_15pct"]:
        lines.append(f"| {o['preset']} | {o['T']} | {o['routing']} | {o['backend']} | {o['predicted_us']:.1f} | "
                     f"{o['measured_us']:.1f} | {o['error']:+.1%} | {o['likely_cause']} |")
    if st["stages"]:
        lines += ["", "## Multi-launch stages, predicted vs measured", "",
                  "Measured: CUDA-graph times of the pipeline's prefixes (router and align; + GEMM 1; + GEMM 2 and "
                  "the shared MLP), their differences; the combine is the layer less the GEMM 2 prefix. "
                  "Error: (predicted - measured) / measured.", "",
                  "| stage | configurations | median error | median abs | max abs | worst at |", "|---|---|---|---|---|---|"]
        for g, e in st["stages"].items():
            w = e["worst"]
            lines.append(f"| {g} | {e['configurations']} | {e['median_error']:+.1%} | {e['median_abs_error']:.1%} | "
                         f"{e['max_abs_error']:.1%} | {w['preset']} T={w['T']} {w['routing']} ({w['error']:+.1%}) |")
    lines += clock_lines(rows)
    if failures:
        lines += ["", "## Failed", "", "| preset | T | routing | backend | error |", "|---|---|---|---|---|"]
        for f in st["failed"]:
            msg = str(f["failure"]).replace("|", "/").replace("\n", " ")[:300]
            lines.append(f"| {f['preset']} | {f['T']} | {f['routing']} | {f['backend']} | {msg} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    if rows:
        _scatter(rows, out / "scatter.png")
    print("\n".join(head))
    print(f"{len(st['outside_15pct'])} configuration(s) outside {OUTLIER:.0%}; see {out / 'report.md'}, {out / 'scatter.png'}")
    return st


#: rows whose clock the report lists: the long ones, where the cost model lowers the MMA rate
CLOCK_MIN_T = 512


def clock_lines(rows: list[dict]) -> list[str]:
    """The report's section on the SM clock the layers ran at (rows' ``measured_clock``, sampled
    over the timed replays by kernels.telemetry) beside the fraction of the short-launch MMA rate
    the cost model assumed (``predicted_sustained_ratio``): the clock's mean over the run's highest
    clock is the fall the measurement saw. Nothing for rows without the clock (runs before it)."""
    sel = [r for r in rows if (r.get("measured_clock") or {}).get("sm_clock_mhz") and int(r["T"]) >= CLOCK_MIN_T]
    if not sel:
        return []
    top = max(r["measured_clock"]["sm_clock_mhz"]["max"] for r in sel)
    out = ["", "## SM clock during the timed replays", "",
           f"Sampled by NVML every few ms over each row's timed replays (kernels/telemetry.py); clock ratio = "
           f"mean / {top:.0f} MHz (the highest sampled in these rows). The model's ratio is the mean MMA rate it "
           "assumed over the measured replay's busy window as a fraction of the short-launch rate "
           "(cost.USE_SUSTAINED_CLOCKS; rate falls less than clock where memory terms bound).", "",
           "| preset | T | routing | backend | error | model's ratio | clock mean MHz | min | clock ratio | power W |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(sel, key=lambda r: (r["preset"], int(r["T"]), r["routing"], r["backend"])):
        c = r["measured_clock"]["sm_clock_mhz"]
        ratio = r.get("predicted_sustained_ratio")
        pw = (r["measured_clock"].get("power_w") or {}).get("mean")
        err = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
        out.append(f"| {r['preset']} | {r['T']} | {r['routing']} | {r['backend']} | {err:+.1%} | "
                   + (f"{ratio:.3f}" if isinstance(ratio, float) else "-")
                   + f" | {c['mean']:.0f} | {c['min']:.0f} | {c['mean'] / top:.3f} | "
                   + (f"{pw:.0f}" if pw is not None else "-") + " |")
    return out


def _scatter(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    colours = {"multi": "tab:blue", "megakernel": "tab:orange"}
    values = []
    for b in sorted({r["backend"] for r in rows}):
        sel = [r for r in rows if r["backend"] == b]
        own = sorted({r["profile"] for r in sel if r.get("profile")})
        ax.scatter([r["measured_us"] for r in sel], [r["predicted_us"] for r in sel], s=14,
                   c=colours.get(b, "tab:gray"), label=f"{b} ({len(sel)})" + (f", {', '.join(own)}" if own else ""),
                   alpha=0.8)
        values += [v for r in sel for v in (r["measured_us"], r["predicted_us"])]
        # the other profiles' predictions of the same measurements: hollow markers
        # (not the cost-switch variants, "<profile>+<label>": the report's lines give their statistics)
        others = sorted({n for r in sel for n in (r.get("predictions") or {})
                         if n != r.get("profile") and "+" not in n})
        for name, marker in zip(others, "^sDv"):
            pts = [(r["measured_us"], r["predictions"][name]["predicted_us"]) for r in sel
                   if isinstance(r["predictions"].get(name, {}).get("predicted_us"), (int, float))]
            if pts:
                ax.scatter(*zip(*pts), s=16, marker=marker, facecolors="none", edgecolors=colours.get(b, "tab:gray"),
                           alpha=0.7, label=f"{b}, {name}")
                values += [v for pt in pts for v in pt]
    lo = min(v for v in values if v > 0) * 0.7
    hi = max(values) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.plot([lo, hi], [lo * (1 + OUTLIER), hi * (1 + OUTLIER)], "k:", lw=0.6)
    ax.plot([lo, hi], [lo * (1 - OUTLIER), hi * (1 - OUTLIER)], "k:", lw=0.6, label=f"+-{OUTLIER:.0%}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured us", ylabel="predicted us",
           title="one MoE layer on one GPU: cost model vs measurement")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
