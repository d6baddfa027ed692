"""The megakernel against the multi-launch path, PyTorch and the floor on one GPU, in one run.

    python benchmarks/bench_megakernel.py --out DIR [--presets a,b] [--tokens 1,8,64] [--variants]
    python benchmarks/bench_megakernel.py --out DIR --fp8 weights --presets qwen3-30b-a3b --tokens 1,8 \\
        --variants --variant-tokens 1,8 --warm

Per (preset, T, routing) row, all measured in this run: both backends checked against the float64
reference on sampled tokens (megamoe.numerics), then timed as CUDA-graph replays (kernels.bench's
graph_time_us: NI fresh inputs per graph, median over replays); the plain PyTorch pipeline the
same way; the floor from the ceilings measured first (streaming read, bf16 matmul). Routing
"uniform" is the preset's router on random inputs; "concentrated" zeroes the router weight, so
every token picks the same K experts. ``--variants`` also times the named megakernel variants of
megakernel_variants.py at ``--variant-tokens`` (numerics checked) and records each. Rows go to DIR/megakernel.jsonl as they are made (with GPU,
versions, commit, date); a table is printed last.

``--fp8 weights`` / ``--fp8 weights+act``: the rows run FP8 (e4m3 weights with 128 x 128 block
scales, quantized on the GPU from the same bf16 weights as ``megamoe bench --dtype fp8``:
kernels/fp8_weights.py; with FP8 activations too): ``megakernel_us`` and ``multi_us`` are the
FP8 megakernel and the FP8 multi-launch path, checked against the reference's FP8 layer
(tolerance ``fp8_e4m3``), and the bf16 megakernel on the bf16 weights is timed in the same row
(``bf16_megakernel_us``; ``bf16_over_fp8`` = its time / the FP8 megakernel's, the speedup); the
floor counts e4m3 weight bytes; no PyTorch pipeline. ``--variants`` then times FP8_VARIANTS
(FP8A_VARIANTS with FP8 activations) at every variant T.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megakernel_variants import VARIANTS, variant_configs, variant_names, warm, warm_jobs  # noqa: E402

#: --fp8 -> kernels.bench's dtype name (its floor terms and matmul rate)
FP8_DTYPES = {None: "bf16", "weights": "fp8", "weights+act": "fp8-act"}


def _rows_out(path: Path, row: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def parse_args(argv=None) -> argparse.Namespace:
    from megamoe.kernels import bench as kb

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--presets", default=",".join(kb.PRESETS))
    p.add_argument("--tokens", default="1,8,64,512,4096,16384")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--variants", action="store_true")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--budget", type=float, default=520.0, help="stop starting new rows after this many seconds")
    p.add_argument("--warm", action="store_true", help="compile every kernel first, in parallel processes")
    p.add_argument("--variant-tokens", default="1", help="T at which --variants are timed (uniform and, at 8, 64 and 512, concentrated routing)")
    p.add_argument("--variant-names", default="", help="comma-separated megakernel_variants.VARIANTS to time "
                   "with --variants instead of the default ones per T (variant_names)")
    p.add_argument("--trace-cases", default="", help="preset:T cases whose traced kernel the warm-up compiles "
                   "too (for megakernel_trace.py run next)")
    p.add_argument("--fp8", choices=["weights", "weights+act"], default=None,
                   help="FP8 rows: e4m3 weights with block scales (and FP8 activations), the FP8 megakernel and "
                        "multi-launch path beside the bf16 megakernel")
    args = p.parse_args(argv)
    bad = [s for s in args.presets.split(",") if s not in kb.PRESETS]
    if bad:
        p.error(f"unknown preset(s) {bad}; presets: {', '.join(kb.PRESETS)}")
    bad = [s for s in args.variant_names.split(",") if s and s not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; variants: {', '.join(VARIANTS)}")
    return args


def run_backend(row: dict, key: str, forward, xs, check, reps: int) -> None:
    """Check ``forward``'s output on xs[0] (``check(y)`` -> NumericsReport), then time it; into row's
    ``{key}_err_max``, ``{key}_ok``, ``{key}_us``, or ``{key}_error`` where it raised."""
    from megamoe.kernels import bench as kb

    try:
        rep = check(forward(xs[0]))
        row[f"{key}_err_max"] = rep.error.max_err
        row[f"{key}_ok"] = bool(rep.ok)
        row[f"{key}_us"] = kb.graph_time_us(forward, xs, reps)
    except Exception as exc:  # noqa: BLE001 - record and go on
        row[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:400]
        print(f"# {row['preset']} T={row['T']} {row['routing']} {key} failed: {row[f'{key}_error']}", flush=True)


def main(argv=None) -> int:
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.fp8_weights import to_fp8
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.numerics import check_numerics, sampled_reference

    args = parse_args(argv)
    fp8 = args.fp8
    fp8_act = fp8 == "weights+act"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "megakernel.jsonl"
    prov = kb.provenance()
    print(f"# {prov}", flush=True)
    t0 = time.time()
    tokens = [int(t) for t in args.tokens.split(",")]
    vtokens = {int(t) for t in args.variant_tokens.split(",")} if args.variants else set()
    names = tuple(n for n in args.variant_names.split(",") if n) or None
    if args.warm:
        traced = [(c.split(":")[0], int(c.split(":")[1])) for c in args.trace_cases.split(",") if c]
        jobs = warm_jobs(args.presets.split(","), tokens, sorted(vtokens), traced, fp8=fp8, names=names)
        warm(jobs, args.budget / 2, log=lambda m: print(m, flush=True))
        print(f"# warm-up done in {time.time() - t0:.0f} s", flush=True)
    ceil = kb.measure_ceilings()
    print(f"# ceilings: read {ceil['read_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['matmul_flops_per_s'] / 1e12:.0f} "
          f"TFLOP/s", flush=True)
    dtype = FP8_DTYPES[fp8]
    mm_kind, mm_rate = kb.floor_matmul_rate(ceil, dtype)
    table = []
    for name in args.presets.split(","):
        cfg = kb.bench_config(name)
        w = kb.random_device_weights(cfg)
        wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
        w8 = to_fp8(w) if fp8 else None  # on the GPU, from the same bf16 weights (the router stays bf16)
        wz8 = type(w8)(**{**w8.arrays(), "router_weight": wz.router_weight}) if fp8 else None
        for T in tokens:
            for routing, ww, ww8 in (("uniform", w, w8), ("concentrated", wz, wz8)):
                if routing == "concentrated" and T not in (8, 64, 512):
                    continue
                if time.time() - t0 > args.budget:
                    print(f"# budget spent: skipping {name} T={T} {routing}", flush=True)
                    continue
                ni = kb.inputs_per_graph(T)
                gen = torch.Generator(device="cuda").manual_seed(1000 + T)
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=gen)
                      for _ in range(ni)]
                d = kmoe.moe_forward_details(xs[0], ww, cfg)
                touched = int((d["counts"] > 0).sum().item())
                flops, byt = kb.floor_terms(cfg, T, touched, dtype)
                floor_us = max(flops / mm_rate if mm_rate else 0.0, byt / ceil["read_bytes_per_s"]) * 1e6
                row = {"preset": name, "T": T, "routing": routing, "experts_touched": touched, "floor_us": floor_us,
                       "fp8": fp8, "floor_matmul": mm_kind if mm_rate else None,
                       **prov, **{f"ceiling_{k}": v for k, v in ceil.items()}}
                ours = ww8 if fp8 else ww  # the weights of the rows' megakernel and multi-launch path
                refs = {}  # the float64 reference on the sampled tokens, once per weights for every check of the row

                def check(y, x=xs[0], wts=ours, cfg=cfg, d=d, refs=refs):
                    if "ours" not in refs:
                        refs["ours"] = sampled_reference(x, wts, cfg, sample=8, fp8_activations=fp8_act if fp8 else None)
                    return check_numerics(x, y, wts, cfg, dtype="fp8_e4m3" if fp8 else "bfloat16", sample=8,
                                          topk_idx=d["topk_idx"], fp8_activations=fp8_act if fp8 else None,
                                          reference=refs["ours"])

                for backend in ("megakernel", "multi"):
                    run_backend(row, backend, lambda a, b=backend, wts=ours, cfg=cfg: kmoe.moe_forward(
                        a, wts, cfg, backend=b, check=False, fp8_activations=fp8_act if fp8 else None), xs, check,
                        args.reps)
                if fp8:  # the bf16 megakernel beside it: the speedup FP8 weights give
                    run_backend(row, "bf16_megakernel", lambda a, ww=ww, cfg=cfg: kmoe.moe_forward(
                        a, ww, cfg, backend="megakernel", check=False), xs,
                        lambda y, x=xs[0], ww=ww, cfg=cfg, d=d: check_numerics(
                            x, y, ww, cfg, dtype="bfloat16", sample=8, topk_idx=d["topk_idx"]), args.reps)
                    if "bf16_megakernel_us" in row and "megakernel_us" in row:
                        row["bf16_over_fp8"] = row["bf16_megakernel_us"] / row["megakernel_us"]
                backend_ok = "megakernel_us" in row
                base = megakernel_config(cfg, T, torch.bfloat16, xs[0].device, fp8=fp8)
                if backend_ok:
                    row["megakernel_config"] = base
                    y1 = kmoe.moe_forward(xs[1], ours, cfg, backend="megakernel",
                                          fp8_activations=fp8_act if fp8 else None)
                    same = all(torch.equal(y1, kmoe.moe_forward(xs[1], ours, cfg, backend="megakernel",
                                                                fp8_activations=fp8_act if fp8 else None))
                               for _ in range(5))
                    row["megakernel_bitwise_repeat"] = same
                if not args.no_torch and not fp8 and routing == "uniform":
                    try:
                        row["torch_us"] = kb.graph_time_us(lambda a, ww=ww, cfg=cfg: kb.torch_moe(a, ww, cfg), xs,
                                                           max(5, args.reps // 2))
                    except Exception as exc:  # noqa: BLE001
                        row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
                if backend_ok and T in vtokens:  # both routings: a variant's gain may be one routing's loss
                    row["variants"] = []
                    for vname, mk in variant_configs(base, names or variant_names(T, fp8))[1:]:
                        try:
                            y = megakernel_forward(xs[0], ours, cfg, mk=mk, fp8=fp8)
                            rep = check(y)
                            us = kb.graph_time_us(lambda a, mk=mk, wts=ours, cfg=cfg: megakernel_forward(
                                a, wts, cfg, mk=mk, fp8=fp8), xs, args.reps)
                            row["variants"].append({"name": vname, "why": VARIANTS[vname][1], "mk": mk, "us": us,
                                                    "ok": bool(rep.ok), "err_max": rep.error.max_err})
                        except Exception as exc:  # noqa: BLE001
                            row["variants"].append({"name": vname, "mk": mk, "error": f"{type(exc).__name__}: {exc}"[:200]})
                    print("    variants: " + "  ".join(f"{v['name']} {v['us']:.1f}" if "us" in v else f"{v['name']} failed"
                                                    for v in row["variants"]), flush=True)
                _rows_out(rows_path, row)
                table.append(row)
                print(fmt_row(row), flush=True)
                del xs
        del w, wz, w8, wz8
        torch.cuda.empty_cache()
    print(f"# {len(table)} rows in {rows_path}, {time.time() - t0:.0f} s", flush=True)
    return 0


def fmt_row(row: dict) -> str:
    """One printed line of a row (bf16 rows: the megakernel, multi-launch and PyTorch; FP8 rows:
    the FP8 megakernel, the FP8 multi-launch path and the bf16 megakernel, with the speedup)."""
    nan = float("nan")
    mk, multi = row.get("megakernel_us", nan), row.get("multi_us", nan)
    best_v = min((v["us"] for v in row.get("variants", []) if "us" in v and v.get("ok")), default=None)
    s = (f"{row['preset']:<16}{row['T']:>6} {row['routing']:<13} floor {row['floor_us']:9.1f}  mk {mk:9.1f}"
         f"  multi {multi:9.1f}")
    if row.get("fp8"):
        s += (f"  bf16-mk {row.get('bf16_megakernel_us', nan):9.1f}  bf16/fp8 {row.get('bf16_over_fp8', nan):5.2f}"
              f"  fp8 {row['fp8']}")
    else:
        s += f"  torch {row.get('torch_us', nan):9.1f}"
    s += (f"  mk/floor {mk / row['floor_us']:5.2f}  multi/mk {multi / mk:5.2f}"
          f"  ok {row.get('megakernel_ok')}/{row.get('multi_ok')}")
    if row.get("fp8"):
        s += f"/{row.get('bf16_megakernel_ok')}"
    return s + (f"  best variant {best_v:.1f}" if best_v else "")


if __name__ == "__main__":
    sys.exit(main())
