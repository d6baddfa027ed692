"""The multi-launch path's router and align, side by side in one run (issue 10).

    python benchmarks/bench_router.py [--presets a,b] [--tokens 512,4096,16384] [--reps 10] [--out DIR]

For each preset and T, CUDA-graph times (``kernels.bench.graph_time_us``) of
  - ``walk``: the routing programs walking H themselves, 32 tokens each (no logits launch; the
    path before the prefill logits launch, ``plan.router_launch(split=0)``),
  - ``walk_h128``, ``walk_h256``: the same walk in fewer, wider steps of H (``router_launch(split=0,
    block_h=...)``: 16 and 8 steps of Qwen3-30B-A3B's 2048 where ``walk`` takes 32 of 64 columns;
    issue 10's hypothesis: the step count, not the bytes, sets the walk's time); only up to
    WALK_MAX_E experts (over 128, two pipeline buffers of the E x 256 weight tile pass Hopper's
    227 KiB of shared memory),
  - ``oldsel``: the default's launches with the routing program's earlier selection (4 or 8
    warps, K maxima), beside the default's (configs.router_warps, router_bitonic; the picks must agree),
  - ``tiles``: a split-H logits launch of 128-token tiles (``configs.router_logits_tile``,
    ``configs.prefill_router_split``), then the routing programs summing its partials (the default
    where ``configs.router_prefill``: more than ROUTER_PREFILL_WALK_STEPS walking steps),
  - ``default``: what the layer runs (the static plan's router: the decode split at decode, tiles or
    the walk at prefill),
each alone and followed by the align (scan and scatter), beside the whole layer (multi-launch, the
default router) in the same run: router + align as a share of the layer with that router (the default's measured; the
others derived, the layer less the default's router + align plus their own: ``derived`` names them). The top-k
experts of ``walk`` and ``tiles``, of ``oldsel`` and the default, and of each ``walk_hNN`` and the default are
compared (they sum the same fp32 products in another order: a pick may differ only where two
scores tie to float32 rounding; the count of such tokens is printed). Needs a CUDA GPU. With --out
writes DIR/router.jsonl, a row per (preset, T), with provenance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the wider steps of the walk timed beside ``walk``'s (configs.router_block_h), as candidates "walk_h<BLOCK_H>"
WALK_BLOCK_H = (128, 256)
#: experts up to which they are timed (the routing program's BLOCK_E): the walk keeps two pipeline buffers
#: of (32 + BLOCK_E) x BLOCK_H bf16, at 256 columns 160 KiB over 128 experts and 288 KiB over 256, past
#: Hopper's 227 KiB (compiled for sm_90 by Triton 3.9 without a GPU; there, over 128 experts at 4 warps,
#: 255 registers and 6 spill stores at 256 columns, 168 registers and none at 128, 166 at 64)
WALK_MAX_E = 128


def run_case(name: str, T: int, reps: int) -> dict:
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe_forward
    from megamoe.kernels.align import launch_align
    from megamoe.kernels.moe import align_buffers, static_plan_for
    from megamoe.kernels.plan import router_launch
    from megamoe.kernels.routing import launch_router

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    E, K, H = cfg.num_experts, cfg.top_k, cfg.hidden_size
    dev = torch.device("cuda")
    NI = kb.inputs_per_graph(T)
    xs = [torch.randn(T, H, device=dev, dtype=torch.bfloat16) for _ in range(NI)]
    sp = static_plan_for(cfg, T, torch.bfloat16, dev)  # the layer's plan: its row blocks and align sizes
    bm = sp.gemm["gemm1"]["BLOCK_M"]
    launches = {"walk": router_launch(T, E, H, K, cfg.n_group, split=0),
                "tiles": router_launch(T, E, H, K, cfg.n_group, num_sms=sp.num_sms, tiles=True),
                # what the layer runs (moe.py's static plan): the decode split below ROUTER_PREFILL_BLOCKS blocks
                "default": sp.router,
                # the default's launches with the routing program's earlier selection: the warps a
                # walking program keeps (4 up to 128 experts, else 8) and K maxima (configs.router_warps /
                # router_bitonic now)
                "oldsel": router_launch(T, E, H, K, cfg.n_group, num_sms=sp.num_sms, bitonic=False,
                                        warps=cfgs.router_warps(0, sp.router["BLOCK_E"], walks=True))}
    wide = [f"walk_h{bh}" for bh in WALK_BLOCK_H if launches["walk"]["BLOCK_E"] <= WALK_MAX_E]
    for tag in wide:  # the walk in fewer, wider steps: its warps and tokens as walk's
        launches[tag] = router_launch(T, E, H, K, cfg.n_group, split=0, block_h=int(tag[len("walk_h"):]))
    row = {"preset": name, "T": T, "reps": reps,
           "tiles_launch": {k: launches["tiles"][k] for k in ("logits_grid", "LOGITS_T", "BLOCK_H", "SPLIT")},
           "walk_launches": {t: {k: launches[t][k] for k in ("BLOCK_H", "num_warps", "BLOCK_T")}
                             for t in ("walk", *wide)}}
    picks = {}
    for tag, rl in launches.items():
        meta, hist, block_t = align_buffers(T, K, E, bm, dev)
        topk_idx = torch.empty((T, K), device=dev, dtype=torch.int32)
        topk_w = torch.empty((T, K), device=dev, dtype=torch.float32)
        sgate = torch.empty((T,), device=dev, dtype=torch.float32) if w.shared_gate is not None else None

        def route(x, rl=rl, meta=meta, hist=hist, block_t=block_t, topk_idx=topk_idx, topk_w=topk_w, sgate=sgate):
            launch_router(x, w, cfg, topk_idx, topk_w, hist, sgate, block_t, launch=rl)

        def route_align(x, rl=rl, meta=meta, hist=hist, block_t=block_t, topk_idx=topk_idx, topk_w=topk_w,
                        sgate=sgate):
            if not launch_router(x, w, cfg, topk_idx, topk_w, hist, sgate, block_t, meta=meta, block_m=bm,
                                 launch=rl):
                launch_align(topk_idx, hist, E, block_t, bm, meta, launch=sp.align)

        row[f"{tag}_router_us"] = kb.graph_time_us(route, xs, reps)
        row[f"{tag}_router_align_us"] = kb.graph_time_us(route_align, xs, reps)
        route(xs[0])
        torch.cuda.synchronize()
        picks[tag] = topk_idx.sort(dim=1).values.clone()
    row["tokens_picking_differently"] = int((picks["walk"] != picks["tiles"]).any(dim=1).sum())
    # the same partials in the same order: the two selections must pick the same experts for every token
    row["oldsel_tokens_picking_differently"] = int((picks["oldsel"] != picks["default"]).any(dim=1).sum())
    for tag in wide:  # the same products summed in other steps: ties to float32 rounding may differ
        row[f"{tag}_tokens_picking_differently"] = int((picks[tag] != picks["default"]).any(dim=1).sum())
    row["select_launch"] = {k: launches["default"][k] for k in ("num_warps", "BITONIC", "SPLIT")}
    row["layer_us"] = kb.graph_time_us(lambda x: moe_forward(x, w, cfg, backend="multi"), xs, reps)
    # the layer with another router: derived, the layer less the default's router + align plus the other's
    row["layer_default_us"] = row["layer_us"]
    others = ("walk", "tiles", "oldsel", *wide)
    for o in others:
        row[f"layer_{o}_us"] = row["layer_us"] - row["default_router_align_us"] + row[f"{o}_router_align_us"]
    row["derived"] = [f"layer_{o}_us" for o in others]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="qwen3-30b-a3b,deepseek-v3,mixtral-8x7b,gpt-oss-120b,qwen3-235b-a22b")
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for router.jsonl")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_router: needs a CUDA GPU", file=sys.stderr)
        return 2
    from megamoe.kernels.bench import fmt_num, provenance

    prov = provenance()
    print(f"# {prov}")
    out = Path(args.out) / "router.jsonl" if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.presets.split(","):
        for T in (int(t) for t in args.tokens.split(",")):
            r = {**run_case(name, T, args.reps), **prov}
            tags = ("default", "oldsel", "walk", *(t for t in r["walk_launches"] if t != "walk"), "tiles")
            share = {k: 100 * r[f"{k}_router_align_us"] / r[f"layer_{k}_us"] for k in tags}
            differ = "".join(f", {t}/default {r[f'{t}_tokens_picking_differently']}" for t in tags if t.startswith("walk_h"))
            print(f"{name:16s} {T:6d}  router alone / + align (share of the layer), us: "
                  + " | ".join(f"{k} {fmt_num(r[f'{k}_router_us'], '7.1f')} / {fmt_num(r[f'{k}_router_align_us'], '7.1f')}"
                               f" ({share[k]:4.1f}%)" for k in tags)
                  + f" | layer {fmt_num(r['layer_us'], '9.1f')} us | default {r['select_launch']} | tokens picking "
                  f"differently: walk/tiles {r['tokens_picking_differently']}, oldsel/default "
                  f"{r['oldsel_tokens_picking_differently']}{differ}", flush=True)
            if out:
                with out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
