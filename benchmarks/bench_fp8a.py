"""FP8 weights and activations at prefill: the fp8a GEMMs' default tiles and their 128-row tile candidates, bf16 beside them.

    python benchmarks/bench_fp8a.py --out DIR [--presets qwen3-30b-a3b,deepseek-v3] [--tokens 4096,16384]
        [--variants bf16,fp8a,fp8a_m128,...] [--reps 10] [--sample 4] [--budget 180]

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, S sampled tokens.

Per (preset, T) row (kernels.bench.bench_config's layer: DeepSeek-V3's routed experts, as `megamoe bench`),
on the same NI fresh bf16 inputs and the same weights (bf16, and e4m3 with 128 x 128 block scales
quantized from them on the GPU, kernels.fp8_weights.to_fp8):
    variants   VARIANTS: "bf16" the tuned bf16 layer; "fp8a" FP8 weights and activations as they run by
               default (fp8_act_tma's persistent GEMMs; fp8_plan.FP8A_DEFAULT_TILES at the 128-row prefill
               entries); "fp8a_<name>" the same with tile set <name> of fp8_plan.FP8A_TILE_CANDIDATES
               (FP8Options(fp8a_tiles=name)), "fp8a_m64" with the 64-row tiles (fp8_plan.FP8A_NO_CANDIDATE)
    numerics   every FP8 variant's output on S sampled tokens against the reference's FP8 layer with FP8
               activations (megamoe.numerics.reference_on_tokens, computed once per row),
               TOLERANCES["fp8_e4m3"]; each candidate's whole output against fp8a's on the same input
               ("bitwise_vs_fp8a": the same codes and the same sums per K step in the same order, so equal
               unless a tile's products or roundings differ; "max_abs_vs_fp8a" either way)
    timing     the whole layer and its prefixes (router+align, GEMM 1, GEMM 2, combine: kernels.bench's
               BREAKDOWN_STOPS / stage_split), CUDA-graph replays of the NI inputs, median per call
               (kernels.bench.graph_time_us); speedups against bf16 and against fp8a, whole layer and per GEMM
Each variant's static plan is built with its FP8Options (``variant_plan``) and run through
kernels.moe._forward, so what runs is the launch plan's. Rows go to DIR/fp8a.jsonl as they are made
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


def _variants() -> dict:
    """variant -> (FP8 mode, FP8Options.fp8a_tiles: a tile set of fp8_plan.FP8A_TILE_CANDIDATES,
    fp8_plan.FP8A_NO_CANDIDATE, or None for the default)."""
    from megamoe.kernels.fp8_plan import FP8A_NO_CANDIDATE, FP8A_TILE_CANDIDATES

    return {"bf16": (None, None), "fp8a": ("weights+act", None),
            **{f"fp8a_{name}": ("weights+act", name) for name in (FP8A_NO_CANDIDATE, *FP8A_TILE_CANDIDATES)}}


VARIANTS = _variants()


def variant_plan(cfg, T: int, variant: str, x, gemm: dict | None = None):
    """The static plan of ``variant`` (VARIANTS) for x (T, H) on its device and dtype; ``gemm``: the
    {"gemm1", "gemm2"} entry to start from instead of the tuned one (the tests' interpreter tiles).
    A tile candidate needs a layer that quantizes x once (plan.quantizes_x; not Llama 4's)."""
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels import plan
    from megamoe.kernels.fp8_plan import FP8A_NO_CANDIDATE, FP8Options
    from megamoe.kernels.plan import quantizes_x

    fp8, tiles = VARIANTS[variant]
    if tiles and tiles != FP8A_NO_CANDIDATE and not quantizes_x(cfg, fp8):
        raise ValueError(f"{variant}: the fp8a tile candidates need x quantized once (this layer scales x by the "
                         "routing weight before quantizing it)")
    sp = plan.static_plan(cfg, T, dtype=kmoe.DTYPES[x.dtype], device_name=kmoe.device_name(x.device),
                          num_sms=kmoe.device_sms(x.device), fp8=fp8, gemm=gemm,
                          fp8_options=FP8Options(fp8a_tiles=tiles))
    if fp8 and not all(sp.gemm[g].get("FP8A") for g in ("gemm1", "gemm2")):
        raise ValueError(f"{variant}: the plan's GEMMs are not fp8_act_tma's ({sp.gemm}): no 'tma_persistent' entry")
    return sp


def bench_row(name: str, cfg, weights: dict, T: int, variants: list[str], *, reps: int, sample: int,
              device: str = "cuda", gemm: dict | None = None) -> dict:
    """One (preset, T) row (module docstring); ``weights``: {"bf16": ..., "fp8": ...} device weights.
    ``device`` "cpu": the interpreter in float32, for the tests (they replace the CUDA-graph timer),
    with ``gemm`` the entry every variant starts from (variant_plan); "cuda": bfloat16, tuned entries."""
    import torch

    from megamoe.kernels import moe as kmoe

    xs, rows, y_ref, row = row_start(name, cfg, T, weights["fp8"], device=device, seed=2000 + T, sample=sample,
                                     fp8_activations=True)
    cands, y_fp8a = {}, None
    for v in variants:
        fp8, tiles = VARIANTS[v]
        w = weights["bf16" if fp8 is None else "fp8"]
        c = {"tiles": tiles}
        try:
            sp = variant_plan(cfg, T, v, xs[0], gemm)
            c["config"] = sp.gemm

            def run(a, sp=sp, w=w, stop=None, fp8=fp8):
                return kmoe._forward(a, w, cfg, True, stop, plan=sp, fp8_activations=fp8 is not None)

            if fp8 is not None:
                y = run(xs[0])
                c.update(fp8_check(y, rows, y_ref, row))
                if v == "fp8a":
                    y_fp8a = y
                elif y_fp8a is not None:
                    c.update(bitwise_vs_fp8a=bool(torch.equal(y, y_fp8a)),
                             max_abs_vs_fp8a=float((y.float() - y_fp8a.float()).abs().max()))
                del y
            c.update(timed(run, xs, reps, row["routed_flops"]))
        except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the others
            c["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cands[v] = c
        if device == "cuda":
            torch.cuda.empty_cache()
    _speedups(cands)
    row["candidates"] = cands
    del xs, y_fp8a
    return row


def _speedups(cands: dict) -> None:
    """Each timed variant's speedup against bf16 and fp8a (whole layer), and against fp8a per GEMM stage."""
    for v, c in cands.items():
        for base in ("bf16", "fp8a"):
            b = cands.get(base, {}).get("us")
            if "us" in c and b and v != base:
                c[f"speedup_vs_{base}"] = b / c["us"]
        base = cands.get("fp8a", {}).get("stage_us")
        if "stage_us" in c and base and v not in ("bf16", "fp8a"):  # (None where a stage came out <= 0 us)
            c["gemm_speedup_vs_fp8a"] = {g: base[g] / c["stage_us"][g] if min(base[g], c["stage_us"][g]) > 0
                                         else None for g in ("gemm1", "gemm2")}


def _vs_fp8a(c: dict) -> str:
    """A candidate's output against fp8a's, for its printed line."""
    if "bitwise_vs_fp8a" not in c:
        return ""
    return "  = fp8a" if c["bitwise_vs_fp8a"] else f"  vs fp8a {c['max_abs_vs_fp8a']:.1e}"


def fmt_row(r: dict) -> list[str]:
    return fmt_rows(r, "fp8a", "fp8a", _vs_fp8a)


def parse_args(argv=None):
    """The command line, checked: known presets and variants, positive token counts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for fp8a.jsonl")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--reps", type=int, default=10, help="graph replays per timing (median)")
    p.add_argument("--sample", type=int, default=4, help="tokens checked against the FP8 reference per row")
    p.add_argument("--budget", type=float, default=180.0, help="start no row after this many seconds")
    args = p.parse_args(argv)
    from megamoe.reference import PRESETS as KNOWN

    args.presets = [s for s in args.presets.split(",") if s]
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [s for s in args.presets if s not in KNOWN] + [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown preset(s) or variant(s) {bad}; variants: {', '.join(VARIANTS)}")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        p.error(f"--tokens wants comma-separated integers, got {args.tokens!r}")
    if not args.tokens or min(args.tokens) < 1 or args.reps < 1 or args.sample < 1:
        p.error("--tokens, --reps and --sample want positive values")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    return run_rows("bench_fp8a", args.presets, args.tokens, args.variants, bench_row, fmt_row, reps=args.reps,
                    sample=args.sample, budget=args.budget, out=args.out, file_name="fp8a.jsonl")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
