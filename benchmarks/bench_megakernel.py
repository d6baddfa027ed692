"""The megakernel against the multi-launch path, PyTorch and the floor on one GPU, in one run.

    python benchmarks/bench_megakernel.py --out DIR [--presets a,b] [--tokens 1,8,64] [--variants]

Per (preset, T, routing) row, all measured in this run: both backends checked against the float64
reference on sampled tokens (megamoe.numerics), then timed as CUDA-graph replays (kernels.bench's
graph_time_us: NI fresh inputs per graph, median over replays); the plain PyTorch pipeline the
same way; the floor from the ceilings measured first (streaming read, bf16 matmul). Routing
"uniform" is the preset's router on random inputs; "concentrated" zeroes the router weight, so
every token picks the same K experts. ``--variants`` also times the named megakernel variants of
megakernel_variants.py at ``--variant-tokens`` (numerics checked) and records each. Rows go to DIR/megakernel.jsonl as they are made (with GPU,
versions, commit, date); a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megakernel_variants import MID_VARIANTS, T1_VARIANTS, VARIANTS, variant_configs, warm, warm_jobs  # noqa: E402


def _rows_out(path: Path, row: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def main(argv=None) -> int:
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.numerics import check_numerics

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
    p.add_argument("--trace-cases", default="", help="preset:T cases whose traced kernel the warm-up compiles "
                   "too (for megakernel_trace.py run next)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "megakernel.jsonl"
    prov = kb.provenance()
    print(f"# {prov}", flush=True)
    t0 = time.time()
    tokens = [int(t) for t in args.tokens.split(",")]
    vtokens = {int(t) for t in args.variant_tokens.split(",")} if args.variants else set()
    if args.warm:
        traced = [(c.split(":")[0], int(c.split(":")[1])) for c in args.trace_cases.split(",") if c]
        jobs = warm_jobs(args.presets.split(","), tokens, sorted(vtokens), traced)
        warm(jobs, args.budget / 2, log=lambda m: print(m, flush=True))
        print(f"# warm-up done in {time.time() - t0:.0f} s", flush=True)
    ceil = kb.measure_ceilings()
    print(f"# ceilings: read {ceil['read_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['matmul_flops_per_s'] / 1e12:.0f} "
          f"TFLOP/s", flush=True)
    table = []
    for name in args.presets.split(","):
        cfg = kb.bench_config(name)
        w = kb.random_device_weights(cfg)
        wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
        for T in tokens:
            for routing, ww in (("uniform", w), ("concentrated", wz)):
                if routing == "concentrated" and T not in (8, 64, 512):
                    continue
                if time.time() - t0 > args.budget:
                    print(f"# budget spent: skipping {name} T={T} {routing}", flush=True)
                    continue
                ni = 8 if T <= 512 else (4 if T <= 4096 else 2)
                gen = torch.Generator(device="cuda").manual_seed(1000 + T)
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=gen)
                      for _ in range(ni)]
                d = kmoe.moe_forward_details(xs[0], ww, cfg)
                touched = int((d["counts"] > 0).sum().item())
                flops, byt = kb.floor_terms(cfg, T, touched)
                floor_us = max(flops / ceil["matmul_flops_per_s"], byt / ceil["read_bytes_per_s"]) * 1e6
                row = {"preset": name, "T": T, "routing": routing, "experts_touched": touched, "floor_us": floor_us,
                       **prov, **{f"ceiling_{k}": v for k, v in ceil.items()}}
                for backend in ("megakernel", "multi"):
                    try:
                        y = kmoe.moe_forward(xs[0], ww, cfg, backend=backend)
                        rep = check_numerics(xs[0], y, ww, cfg, dtype="bfloat16", sample=8, topk_idx=d["topk_idx"])
                        row[f"{backend}_err_max"] = rep.error.max_err
                        row[f"{backend}_ok"] = bool(rep.ok)
                        row[f"{backend}_us"] = kb.graph_time_us(
                            lambda a, b=backend, ww=ww, cfg=cfg: kmoe.moe_forward(a, ww, cfg, backend=b, check=False), xs, args.reps)
                    except Exception as exc:  # noqa: BLE001 - record and go on
                        row[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:400]
                        print(f"# {name} T={T} {routing} {backend} failed: {row[f'{backend}_error']}", flush=True)
                backend_ok = "megakernel_us" in row
                if backend_ok:
                    mk = megakernel_config(cfg, T, torch.bfloat16, xs[0].device)
                    row["megakernel_config"] = mk
                    y1 = kmoe.moe_forward(xs[1], ww, cfg, backend="megakernel")
                    same = all(torch.equal(y1, kmoe.moe_forward(xs[1], ww, cfg, backend="megakernel"))
                               for _ in range(5))
                    row["megakernel_bitwise_repeat"] = same
                if not args.no_torch and routing == "uniform":
                    try:
                        row["torch_us"] = kb.graph_time_us(lambda a, ww=ww, cfg=cfg: kb.torch_moe(a, ww, cfg), xs,
                                                           max(5, args.reps // 2))
                    except Exception as exc:  # noqa: BLE001
                        row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
                if backend_ok and T in vtokens:  # both routings: a variant's gain may be one routing's loss
                    row["variants"] = []
                    base = megakernel_config(cfg, T, torch.bfloat16, xs[0].device)
                    for vname, mk in variant_configs(base, T1_VARIANTS if T == 1 else MID_VARIANTS)[1:]:
                        try:
                            y = megakernel_forward(xs[0], ww, cfg, mk=mk)
                            rep = check_numerics(xs[0], y, ww, cfg, dtype="bfloat16", sample=8, topk_idx=d["topk_idx"])
                            us = kb.graph_time_us(lambda a, mk=mk, ww=ww, cfg=cfg: megakernel_forward(a, ww, cfg, mk=mk),
                                                  xs, args.reps)
                            row["variants"].append({"name": vname, "why": VARIANTS[vname][1], "mk": mk, "us": us,
                                                    "ok": bool(rep.ok), "err_max": rep.error.max_err})
                        except Exception as exc:  # noqa: BLE001
                            row["variants"].append({"name": vname, "mk": mk, "error": f"{type(exc).__name__}: {exc}"[:200]})
                    print("    variants: " + "  ".join(f"{v['name']} {v['us']:.1f}" if "us" in v else f"{v['name']} failed"
                                                    for v in row["variants"]), flush=True)
                _rows_out(rows_path, row)
                table.append(row)
                best_v = min((v["us"] for v in row.get("variants", []) if "us" in v and v.get("ok")), default=None)
                print(f"{name:<16}{T:>6} {routing:<13} floor {floor_us:9.1f}  mk {row.get('megakernel_us', float('nan')):9.1f}"
                      f"  multi {row.get('multi_us', float('nan')):9.1f}  torch {row.get('torch_us', float('nan')):9.1f}"
                      f"  mk/floor {row.get('megakernel_us', float('nan')) / floor_us:5.2f}"
                      f"  multi/mk {row.get('multi_us', float('nan')) / row.get('megakernel_us', float('nan')):5.2f}"
                      f"  ok {row.get('megakernel_ok')}/{row.get('multi_ok')}"
                      + (f"  best variant {best_v:.1f}" if best_v else ""), flush=True)
                del xs
        del w, wz
        torch.cuda.empty_cache()
    print(f"# {len(table)} rows in {rows_path}, {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
