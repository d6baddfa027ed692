"""Prefill and mid-batch grouped GEMMs on one GPU: each GEMM candidate against the current path,
the PyTorch pipeline, the ideal grouped GEMM and the floor, in one run.

    python benchmarks/bench_prefill.py --out DIR [--presets a,b] [--tokens 512,4096,16384]
        [--variants current tma64 tma128 tma256] [--reps 10] [--budget 200] [--no-warm]

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.

Candidates (kernels.configs.candidate_entry): "current" is the layer as moe_forward runs it today
(the shipped tuned entry of the T bucket); "tmaNN" the "tma_persistent" GEMMs at BLOCK_M NN (TMA
weight tiles, one program per SM); "tma128:num_stages=3,g2.BLOCK_N=128" with overrides. Each
candidate runs the whole layer (router, align, GEMMs, combine) through ``_forward`` with a static
plan built from its entry.

Per (preset, T) row, all in this run on one GPU:
    numerics   every candidate's output on S sampled tokens against the float64 reference
               (megamoe.numerics.reference_on_tokens, computed once per row), bf16 tolerance
    timing     every candidate, and the PyTorch pipeline (kernels.bench.torch_moe: sort,
               torch._grouped_mm twice), as CUDA-graph replays of NI fresh inputs, median per call
               (kernels.bench.graph_time_us)
    ideal      cuBLAS bmm over E experts of ceil(T*K/E) rows (kernels.bench.ideal_grouped_rate):
               ours_over_ideal_rate = routed FLOPs / our time / that rate (the issue's measure)
    floor      max(FLOPs / matmul rate, bytes / streaming-read rate), both measured first
Rows go to DIR/prefill.jsonl as they are made (provenance: GPU, versions, commit, date); a table
per row is printed. Before timing, ``--warm`` (the default) runs every (preset, T) job once in its
own process, side by side, so Triton's compiles (which dominate a fresh GPU machine) fill the
on-disk cache in parallel; ``--budget`` seconds from the start bounds the run (rows not started by
then are skipped and said so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
TOKENS = (512, 4096, 16384)
VARIANTS = ("current", "tma64", "tma128", "tma256")


def _plan(cfg, T: int, variant: str, x):
    """The static plan of candidate ``variant`` for x (T, H) on its device and dtype."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe as kmoe

    entry = cfgs.candidate_entry(variant, interpret=x.device.type == "cpu")
    return kmoe.static_plan_for(cfg, T, x.dtype, x.device, True, gemm=entry)


def _warm(name: str, T: int, variants: list[str]) -> str:
    """Run every candidate's layer once for this preset and T (compiling into Triton's cache)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    done = []
    for v in variants:
        try:
            kmoe._forward(x, w, cfg, True, plan=_plan(cfg, T, v, x))
            done.append(v)
        except Exception as exc:  # noqa: BLE001 - the measuring process reports it again
            done.append(f"{v}: {type(exc).__name__}")
    torch.cuda.synchronize()
    del w, x
    torch.cuda.empty_cache()
    return f"{name} T={T}: " + ", ".join(done)


def warm_all(jobs: list[tuple[str, int]], variants: list[str], procs: int, timeout_s: float) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    t0 = time.time()
    with ctx.Pool(procs) as pool:
        pending = [(j, pool.apply_async(_warm, (*j, variants))) for j in jobs]
        for j, res in pending:
            try:
                print(f"# warmed {res.get(timeout=max(1.0, timeout_s - (time.time() - t0)))}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"# warm-up of {j} failed: {type(exc).__name__}: {exc}", flush=True)


def bench_row(name: str, cfg, w, T: int, ceil: dict, variants: list[str], *, reps: int, sample: int,
              with_torch: bool, with_ideal: bool, device: str = "cuda") -> dict:
    """One (preset, T) row (module docstring). ``device`` "cpu": the interpreter in float32, for
    the tests (they replace the CUDA-graph timer); "cuda": bfloat16."""
    import numpy as np
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.numerics import reference_on_tokens
    from megamoe.reference import normalized_error, tolerance_for
    from megamoe.reference.sizes import ffn_flops

    H = cfg.hidden_size
    dtype = "bfloat16" if device == "cuda" else "float32"
    gen = torch.Generator(device=device).manual_seed(1000 + T)
    xs = [torch.randn(T, H, device=device, dtype=getattr(torch, dtype), generator=gen)
          for _ in range(kb.inputs_per_graph(T))]
    d = kmoe.moe_forward_details(xs[0], w, cfg)
    touched = int((d["counts"] > 0).sum().item())
    flops, byt = kb.floor_terms(cfg, T, touched)
    floor_us = max(flops / ceil["matmul_flops_per_s"], byt / ceil["read_bytes_per_s"]) * 1e6
    routed_flops = ffn_flops(T * cfg.top_k, H, cfg.intermediate_size)
    rows = np.sort(np.random.default_rng(T).choice(T, size=min(sample, T), replace=False))
    y_ref, _ = reference_on_tokens(xs[0][rows], w, cfg)
    tmax, trms = tolerance_for(dtype)
    row = {"preset": name, "T": T, "experts_touched": touched, "flops": flops, "bytes": byt, "floor_us": floor_us,
           "routed_flops": routed_flops, "sampled_tokens": len(rows), "dtype": dtype, "limit_max": tmax,
           "limit_rms": trms}
    if with_ideal:
        ideal = kb.ideal_grouped_rate(cfg, T)
        row.update(ideal_tflops=ideal / 1e12, ideal_us=routed_flops / ideal * 1e6)
    if with_torch:
        try:
            row["torch_us"] = kb.graph_time_us(lambda a: kb.torch_moe(a, w, cfg), xs, max(5, reps // 2))
        except Exception as exc:  # noqa: BLE001 - record why, keep going
            row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    cands = {}
    for v in variants:
        c = {}
        try:
            sp = _plan(cfg, T, v, xs[0])
            c["config"] = sp.gemm
            y = kmoe._forward(xs[0], w, cfg, True, plan=sp)
            err = normalized_error(y[rows].double().cpu().numpy(), y_ref)
            c.update(err_max=err.max_err, err_rms=err.rms_err, ok=bool(err.max_err <= tmax and err.rms_err <= trms))
            us = kb.graph_time_us(lambda a, sp=sp: kmoe._forward(a, w, cfg, True, plan=sp), xs, reps)
            c.update(us=us, over_floor=us / floor_us, routed_tflops=routed_flops / (us * 1e-6) / 1e12)
            if "ideal_tflops" in row:
                c["over_ideal_rate"] = c["routed_tflops"] / row["ideal_tflops"]
            if "torch_us" in row:
                c["speedup_vs_torch"] = row["torch_us"] / us
        except Exception as exc:  # noqa: BLE001 - one failed candidate must not lose the others
            c["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cands[v] = c
        torch.cuda.empty_cache()
    row["candidates"] = cands
    base = cands.get("current", {}).get("us")
    timed = {v: c["us"] for v, c in cands.items() if "us" in c and c.get("ok")}
    if timed:
        best = min(timed, key=timed.get)
        row.update(best=best, best_us=timed[best])
        if base:
            row["best_speedup_vs_current"] = base / timed[best]
    del xs
    return row


def fmt_row(r: dict) -> list[str]:
    from megamoe.kernels.bench import fmt_num as f

    out = [f"{r['preset']} T={r['T']}: floor {f(r['floor_us'], '.1f')} us, ideal {f(r.get('ideal_us'), '.1f')} us "
           f"({f(r.get('ideal_tflops'), '.0f')} TFLOP/s), torch {f(r.get('torch_us'), '.1f')} us"]
    base = r["candidates"].get("current", {}).get("us")
    for v, c in r["candidates"].items():
        if "error" in c:
            out.append(f"    {v:<28} failed: {c['error'][:200]}")
            continue
        out.append(f"    {v:<28} {f(c['us'], '10.1f')} us  /floor {f(c['over_floor'], '5.2f')}  /ideal-rate "
                   f"{f(c.get('over_ideal_rate'), '5.2f')}  x torch {f(c.get('speedup_vs_torch'), '5.2f')}  "
                   f"x current {f(base / c['us'] if base else None, '5.2f')}  err {c['err_max']:.1e}"
                   f"{'' if c['ok'] else '  NUMERICS FAIL'}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for prefill.jsonl")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS),
                   help="candidates: current, tmaNN, tmaNN:key=value,... (kernels.configs.candidate_entry)")
    p.add_argument("--reps", type=int, default=10, help="graph replays per timing (median)")
    p.add_argument("--sample", type=int, default=4, help="tokens checked against the float64 reference per row")
    p.add_argument("--budget", type=float, default=200.0, help="start no row after this many seconds")
    p.add_argument("--no-warm", action="store_true", help="skip the parallel compile-ahead")
    p.add_argument("--warm-procs", type=int, default=0, help="compile-ahead processes (default: one per job, "
                                                             "at most 12 and the cores less two)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-ideal", action="store_true")
    args = p.parse_args(argv)
    from megamoe.kernels import configs as cfgs
    from megamoe.reference import PRESETS as KNOWN

    presets = [s for s in args.presets.split(",") if s]
    tokens = [int(t) for t in args.tokens.split(",") if t]
    bad = [s for s in presets if s not in KNOWN]
    if bad:
        p.error(f"unknown preset(s) {bad}")
    for v in args.variants:
        try:
            cfgs.candidate_entry(v)
        except cfgs.KernelConfigError as exc:
            p.error(str(exc))

    import torch

    from megamoe.kernels import bench as kb

    if not torch.cuda.is_available():
        print("bench_prefill needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "prefill.jsonl"
    prov = kb.provenance()
    print(f"# {prov}", flush=True)
    print(f"# candidates: {args.variants}", flush=True)
    if not args.no_warm:
        jobs = [(n, T) for n in presets for T in tokens]
        procs = args.warm_procs or max(1, min(len(jobs), 12, (os.cpu_count() or 4) - 2))
        warm_all(jobs, args.variants, procs, args.budget)
        print(f"# warm-up done in {time.time() - t0:.0f} s ({procs} processes)", flush=True)
    ceil = kb.measure_ceilings()
    print(f"# ceilings: read {ceil['read_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['matmul_flops_per_s'] / 1e12:.0f} "
          f"TFLOP/s", flush=True)
    n_rows = 0
    for name in presets:
        if time.time() - t0 > args.budget:
            print(f"# budget spent: skipping {name}", flush=True)
            continue
        cfg = kb.bench_config(name)
        w = kb.random_device_weights(cfg)
        for T in tokens:
            if time.time() - t0 > args.budget:
                print(f"# budget spent: skipping {name} T={T}", flush=True)
                continue
            try:
                r = bench_row(name, cfg, w, T, ceil, args.variants, reps=args.reps, sample=args.sample,
                              with_torch=not args.no_torch, with_ideal=not args.no_ideal)
            except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
                print(f"# {name} T={T} failed: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
                continue
            r.update(prov)
            r.update({f"ceiling_{k}": v for k, v in ceil.items()})
            with rows_path.open("a") as fh:
                fh.write(json.dumps(r) + "\n")
            n_rows += 1
            print("\n".join(fmt_row(r)), flush=True)
            print(f"#   {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        del w
        torch.cuda.empty_cache()
    print(f"# {n_rows} rows in {rows_path}, {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
