"""Weight-only FP8 at prefill, before and after the persistent GEMMs: one process, one GPU, bf16 beside them.

    python benchmarks/bench_fp8w.py --out DIR [--presets qwen3-30b-a3b,deepseek-v3] [--tokens 4096,16384]
        [--reps 10] [--sample 4] [--budget 420]

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, S sampled tokens.

Per (preset, T) row (kernels.bench.bench_config's layer: DeepSeek-V3's routed experts, as `megamoe bench`),
on the same NI fresh bf16 inputs and the same weights (bf16, and e4m3 with 128 x 128 block scales
quantized from them on the GPU, kernels.fp8_weights.to_fp8):
    variants   VARIANTS: "bf16" the tuned bf16 layer; "fp8w_pointer" weight-only FP8 through fp8_gemm's
               64-row pointer GEMMs (the tuned entry made "pointer"); "fp8w_tma" the persistent TMA GEMMs
               with the block scale folded into the weights (the default; SWAP_AB as
               fp8_plan.FP8W_TMA_SWAP_AB); "fp8w_tma_b" the same with SWAP_AB off (FP8Options(swap_ab=False):
               the folded weights as wgmma's B operand from shared memory)
    numerics   every FP8 variant's output on S sampled tokens against the reference's weight-only FP8
               layer (megamoe.numerics.reference_on_tokens, computed once per row), TOLERANCES["fp8_e4m3"]
    timing     the whole layer and its prefixes (router+align, GEMM 1, GEMM 2, combine: kernels.bench's
               BREAKDOWN_STOPS / stage_split), CUDA-graph replays of the NI inputs, median per call
               (kernels.bench.graph_time_us); speedups against bf16 and against fp8w_pointer
Each variant's static plan is built from its entry and FP8Options (``variant_plan``) and run through
kernels.moe._forward, so what runs is the launch plan's. Rows go to DIR/fp8w.jsonl as they are made
(provenance: GPU, versions, commit, date), a table per row is printed; ``--budget`` seconds from the
start bounds the run (rows not started by then are skipped and said so).
"""

from __future__ import annotations

import argparse
import os
import sys

from fp8_prefill_rows import fmt_rows, fp8_check, row_start, run_rows, timed

PRESETS = ("qwen3-30b-a3b", "deepseek-v3")
TOKENS = (4096, 16384)
#: variant -> (FP8 mode, weight-only persistent GEMMs, SWAP_AB (None: fp8_plan.FP8W_TMA_SWAP_AB))
VARIANTS = {"bf16": (None, False, None), "fp8w_pointer": ("weights", False, None),
            "fp8w_tma": ("weights", True, None), "fp8w_tma_b": ("weights", True, False)}


def variant_plan(cfg, T: int, variant: str, x, gemm: dict | None = None):
    """The static plan of ``variant`` (VARIANTS) for x (T, H) on its device and dtype; ``gemm``: the
    {"gemm1", "gemm2"} entry to start from instead of the tuned one (the tests' interpreter tiles)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels import plan
    from megamoe.kernels.fp8_plan import FP8Options

    fp8, tma, swap = VARIANTS[variant]
    dtype, dev = kmoe.DTYPES[x.dtype], kmoe.device_name(x.device)
    if fp8 is not None and not tma:  # the pointer FP8 GEMMs: the same entry, not persistent
        if gemm is None:
            gemm = cfgs.select_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, T, gpu=dev,
                                      dtype=dtype, triton_version=plan._triton_version(),
                                      interpret=dev == "cpu-interpreter")
        gemm = {g: dict(c, variant="pointer", FLATTEN=0) for g, c in gemm.items()}
    return plan.static_plan(cfg, T, dtype=dtype, device_name=dev, num_sms=kmoe.device_sms(x.device), fp8=fp8,
                            gemm=gemm, fp8_options=FP8Options() if swap is None else FP8Options(swap_ab=swap))


def bench_row(name: str, cfg, weights: dict, T: int, variants: list[str], *, reps: int, sample: int,
              device: str = "cuda", gemm: dict | None = None) -> dict:
    """One (preset, T) row (module docstring); ``weights``: {"bf16": ..., "fp8": ...} device weights.
    ``device`` "cpu": the interpreter in float32, for the tests (they replace the CUDA-graph timer),
    with ``gemm`` the entry every variant starts from (variant_plan); "cuda": bfloat16, tuned entries."""
    import torch

    from megamoe.kernels import moe as kmoe

    xs, rows, y_ref, row = row_start(name, cfg, T, weights["fp8"], device=device, seed=1000 + T, sample=sample,
                                     fp8_activations=False)
    cands = {}
    for v in variants:
        fp8 = VARIANTS[v][0]
        w = weights["bf16" if fp8 is None else "fp8"]
        c = {}
        try:
            sp = variant_plan(cfg, T, v, xs[0], gemm)
            c["config"] = sp.gemm

            def run(a, sp=sp, w=w, stop=None):
                return kmoe._forward(a, w, cfg, True, stop, plan=sp, fp8_activations=False)

            if fp8 is not None:
                c.update(fp8_check(run(xs[0]), rows, y_ref, row))
            c.update(timed(run, xs, reps, row["routed_flops"]))
        except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the others
            c["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cands[v] = c
        if device == "cuda":
            torch.cuda.empty_cache()
    for v, c in cands.items():
        for base in ("bf16", "fp8w_pointer"):
            b = cands.get(base, {}).get("us")
            if "us" in c and b and v != base:
                c[f"speedup_vs_{base}"] = b / c["us"]
    row["candidates"] = cands
    del xs
    return row


def fmt_row(r: dict) -> list[str]:
    return fmt_rows(r, "fp8w_pointer", "pointer")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for fp8w.jsonl")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--reps", type=int, default=10, help="graph replays per timing (median)")
    p.add_argument("--sample", type=int, default=4, help="tokens checked against the FP8 reference per row")
    p.add_argument("--budget", type=float, default=420.0, help="start no row after this many seconds")
    args = p.parse_args(argv)
    from megamoe.reference import PRESETS as KNOWN

    presets = [s for s in args.presets.split(",") if s]
    tokens = [int(t) for t in args.tokens.split(",") if t]
    variants = [v for v in args.variants.split(",") if v]
    bad = [s for s in presets if s not in KNOWN] + [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown preset(s) or variant(s) {bad}; variants: {', '.join(VARIANTS)}")

    return run_rows("bench_fp8w", presets, tokens, variants, bench_row, fmt_row, reps=args.reps, sample=args.sample,
                    budget=args.budget, out=args.out, file_name="fp8w.jsonl")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
