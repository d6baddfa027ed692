"""What the FP8 prefill benchmarks share (bench_fp8w.py: weight-only FP8, bench_fp8a.py: FP8 activations too).

Shape legend: T tokens, H hidden, S sampled tokens, NI inputs per CUDA graph (kernels.bench.inputs_per_graph).

A row is one (preset, T): NI fresh inputs, the reference's FP8 layer on S sampled tokens of the first
(computed once, ``row_start``), then per variant its check against that reference (``fp8_check``) and its
times, whole layer and stage by stage (``timed``). ``run_rows`` makes the rows of every preset and T
within a time budget, the same bf16 weights and their e4m3 quantization (on the GPU) for every variant,
and writes each row as it is made.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def row_start(name: str, cfg, T: int, fp8_weights, *, device: str, seed: int, sample: int,
              fp8_activations: bool) -> tuple:
    """(xs, rows, y_ref, row): NI inputs (T, H) drawn with ``seed`` (bfloat16 on "cuda", float32 under the
    interpreter), the S sorted rows checked (drawn with T as the seed), the reference's FP8 layer on them
    (``fp8_activations`` as reference.moe_forward's), and the row's fixed fields: preset, T, the routed
    GEMMs' FLOPs, S and the fp8_e4m3 tolerance."""
    import numpy as np
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.numerics import reference_on_tokens
    from megamoe.reference import tolerance_for
    from megamoe.reference.sizes import ffn_flops

    H = cfg.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    xs = [torch.randn(T, H, device=device, dtype=dt, generator=gen) for _ in range(kb.inputs_per_graph(T))]
    rows = np.sort(np.random.default_rng(T).choice(T, size=min(sample, T), replace=False))
    y_ref, _ = reference_on_tokens(xs[0][rows], fp8_weights, cfg, fp8_activations=fp8_activations)
    tmax, trms = tolerance_for("fp8_e4m3")
    row = {"preset": name, "T": T, "routed_flops": ffn_flops(T * cfg.top_k, H, cfg.intermediate_size),
           "sampled_tokens": len(rows), "limit_max": tmax, "limit_rms": trms}
    return xs, rows, y_ref, row


def fp8_check(y, rows, y_ref, row: dict) -> dict:
    """A variant's output y (T, H) on the row's sampled tokens against the reference: err_max, err_rms, ok
    (within the row's limits)."""
    from megamoe.reference import normalized_error

    err = normalized_error(y[rows].double().cpu().numpy(), y_ref)
    return {"err_max": err.max_err, "err_rms": err.rms_err,
            "ok": bool(err.max_err <= row["limit_max"] and err.rms_err <= row["limit_rms"])}


def timed(run, xs, reps: int, routed_flops: float) -> dict:
    """``run(a, stop=None)``'s CUDA-graph time over xs (kernels.bench.graph_time_us) and its stages (the
    prefixes up to each of kernels.bench.BREAKDOWN_STOPS, stage_split): us, stage_us, routed_tflops."""
    from megamoe.kernels import bench as kb

    us = kb.graph_time_us(run, xs, reps)
    prefix = {stop: kb.graph_time_us(lambda a, stop=stop: run(a, stop=stop), xs, reps) for stop in kb.BREAKDOWN_STOPS}
    return {"us": us, "stage_us": kb.stage_split(prefix, us), "routed_tflops": routed_flops / (us * 1e-6) / 1e12}


def fmt_rows(r: dict, base: str, label: str, extra=None) -> list[str]:
    """A row as printed lines: its header, then a line per variant (its time, its speedups against bf16 and
    against variant ``base``, shown as ``label``, its GEMM stages and the rest, its check; ``extra(c)``: more
    text for a variant's line), or the variant's error."""
    from megamoe.kernels.bench import fmt_num as f

    out = [f"{r['preset']} T={r['T']} (routed {r['routed_flops'] / 1e9:.0f} GFLOP, {r['sampled_tokens']} tokens "
           f"checked against the FP8 reference)"]
    for v, c in r["candidates"].items():
        if "error" in c:
            out.append(f"    {v:<14} failed: {c['error'][:300]}")
            continue
        st = c["stage_us"]
        num = "" if "ok" not in c else (f"  err max {c['err_max']:.1e} rms {c['err_rms']:.1e}"
                                         + ("" if c["ok"] else "  NUMERICS FAIL"))
        out.append(f"    {v:<14} {f(c['us'], '9.1f')} us  x bf16 {f(c.get('speedup_vs_bf16'), '5.2f')}  "
                   f"x {label} {f(c.get(f'speedup_vs_{base}'), '5.2f')}  gemm1 {f(st['gemm1'], '8.1f')}  "
                   f"gemm2 {f(st['gemm2'], '8.1f')}  rest {f(st['router+align'] + st['combine'], '6.1f')}{num}"
                   + (extra(c) if extra else ""))
    return out


def run_rows(tool: str, presets, tokens, variants, bench_row, fmt_row, *, reps: int, sample: int, budget: float,
             out: str, file_name: str) -> int:
    """The rows of every preset and T (``bench_row(name, cfg, weights, T, variants, reps=, sample=)``, weights
    {"bf16": the preset's random device weights, "fp8": kernels.fp8_weights.to_fp8 of them}), each written
    to out/file_name with provenance as it is made and printed (``fmt_row``); no row started after ``budget``
    seconds (said so). A row that fails is said and skipped. Returns the exit code (2 without a CUDA GPU)."""
    import sys

    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels.fp8_weights import to_fp8

    if not torch.cuda.is_available():
        print(f"{tool} needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    rows_path = Path(out) / file_name
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    prov = kb.provenance()
    print(f"# {prov}", flush=True)
    print(f"# variants: {list(variants)}", flush=True)
    n_rows = 0
    for name in presets:
        if time.time() - t0 > budget:
            print(f"# budget spent: skipping {name}", flush=True)
            continue
        cfg = kb.bench_config(name)
        weights = {"bf16": kb.random_device_weights(cfg)}
        weights["fp8"] = to_fp8(weights["bf16"])  # on the GPU, from the same bf16 weights
        for T in tokens:
            if time.time() - t0 > budget:
                print(f"# budget spent: skipping {name} T={T}", flush=True)
                continue
            try:
                r = bench_row(name, cfg, weights, T, list(variants), reps=reps, sample=sample)
            except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
                print(f"# {name} T={T} failed: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
                continue
            r.update(prov)
            with rows_path.open("a") as fh:
                fh.write(json.dumps(r) + "\n")
            n_rows += 1
            print("\n".join(fmt_row(r)), flush=True)
            print(f"#   {time.time() - t0:.0f} s", flush=True)
        del weights
        torch.cuda.empty_cache()
    print(f"# {n_rows} rows in {rows_path}, {time.time() - t0:.0f} s", flush=True)
    return 0
