"""``megamoe bench --tune``: a search of the GEMM configs per shape and T bucket, written to
kernels/configs/<gpu>__<dtype>__triton-<v>.json.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .measure import bench_config, graph_time_us, random_device_weights


def _candidates(rows_per_expert: float) -> tuple[list[dict], list[dict]]:
    """(gemm1 candidates, gemm2 candidates) for a T bucket; a pair must share BLOCK_M."""
    def c(bm, bn, bk, nw, ns, sk=1):
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns, SPLIT_K=sk)

    if rows_per_expert <= 4:
        shapes = ((32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (32, 256, 4, 4), (128, 128, 4, 3),
                  (64, 64, 4, 5), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (32, 128, 4, 4, 2), (32, 128, 4, 4, 4),
                  (128, 128, 4, 3, 2), (128, 128, 4, 3, 4), (64, 256, 4, 3, 2))
        return [c(16, *t) for t in shapes], [c(16, *t) for t in shapes]
    if rows_per_expert <= 64:
        shapes = ((64, 128, 4, 3), (32, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3))
        bms = (16, 32, 64)
        return [c(bm, *t) for bm in bms for t in shapes], [c(bm, *t) for bm in bms for t in shapes]
    s1 = ((128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4))
    s2 = ((256, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 4), (256, 64, 8, 4))
    return [c(bm, *t) for bm in (64, 128) for t in s1], [c(bm, *t) for bm in (64, 128) for t in s2]


def tune_shape(cfg, w, T: int, reps: int = 10, log=print) -> dict:
    """Best (gemm1, gemm2) for this shape at T: each GEMM timed alone per BLOCK_M as CUDA-graph replays."""
    import torch
    import triton

    from . import configs as cfgs
    from .align import launch_align
    from .grouped_gemm import launch_gemm1, launch_gemm2
    from .routing import launch_router

    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    c1, c2 = _candidates(T * K / E)
    g1s = {json.dumps(a, sort_keys=True): a for a in c1}
    g2s = {json.dumps(b, sort_keys=True): b for b in c2}
    dev = x.device
    i32 = torch.int32
    block_t = cfgs.router_block_t(T, E)
    C = triton.cdiv(T, block_t)
    topk_idx = torch.empty((T, K), device=dev, dtype=i32)
    topk_w = torch.empty((T, K), device=dev, dtype=torch.float32)
    hist = torch.empty((C, E), device=dev, dtype=i32)
    launch_router(x, w, cfg, topk_idx, topk_w, hist, None, block_t)
    metas = {}
    for bm in sorted({a["BLOCK_M"] for a in g1s.values()}):
        P_max = cfgs.max_padded_rows(T * K, E, bm)
        meta = {k: torch.empty(n, device=dev, dtype=i32) for k, n in (
            ("chunk_base", (C, E)), ("counts", (E,)), ("padded_offsets", (E + 1,)), ("padded_token", (P_max,)),
            ("padded_pair", (P_max,)), ("block_expert", (P_max // bm,)), ("pair_dest", (T * K,)))}
        launch_align(topk_idx, hist, E, block_t, bm, meta)
        act = torch.randn((P_max, I), device=dev, dtype=torch.bfloat16)
        metas[bm] = (meta, act, P_max // bm)
    outs = {}

    def in_graph_ms(f):
        """ms per launch of f, as the layer runs it: 4 launches captured in a CUDA graph, median of replays."""
        return graph_time_us(lambda _a: f(), [None] * 4, max(5, reps)) / 1e3

    def out_for(split):
        if split not in outs:
            outs[split] = torch.empty((split * T * K, H), device=dev,
                                      dtype=torch.float32 if split > 1 else torch.bfloat16)
        return outs[split]

    def t1(c):
        meta, act, nm = metas[c["BLOCK_M"]]
        f = lambda: launch_gemm1(x, w.gate_up, w.gate_up_bias, act, meta, topk_w, c,  # noqa: E731
                                 activation=cfg.activation, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit,
                                 scale_input=cfg.weight_on_input, dense=False, num_m=nm)
        return in_graph_ms(f)

    def t2(c):
        meta, act, nm = metas[c["BLOCK_M"]]
        sk = c.get("SPLIT_K", 1)
        out = out_for(sk)
        f = lambda: launch_gemm2(act, w.down, w.down_bias, out, meta, None if cfg.weight_on_input else topk_w, c,  # noqa: E731
                                 T=T, K=K, KS=K, dense=False, atomic=False, num_m=nm, split=sk)
        return in_graph_ms(f)

    res1, res2 = {}, {}
    for k, c in g1s.items():
        try:
            res1[k] = t1(c)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
            log(f"    gemm1 {c} failed: {type(exc).__name__}")
    for k, c in g2s.items():
        try:
            res2[k] = t2(c)
        except Exception as exc:  # noqa: BLE001
            log(f"    gemm2 {c} failed: {type(exc).__name__}")
    best = None
    for bm in metas:
        b1 = min(((v, k) for k, v in res1.items() if g1s[k]["BLOCK_M"] == bm), default=None)
        b2 = min(((v, k) for k, v in res2.items() if g2s[k]["BLOCK_M"] == bm), default=None)
        if b1 and b2 and (best is None or b1[0] + b2[0] < best[0]):
            best = (b1[0] + b2[0], g1s[b1[1]], g2s[b2[1]], b1[0], b2[0])
    if best is None:
        raise RuntimeError(f"no config ran for {cfg.name} T={T}")
    log(f"    T={T}: gemm1 {best[3]*1e3:.1f} us {best[1]}  gemm2 {best[4]*1e3:.1f} us {best[2]}")
    return {"gemm1": best[1], "gemm2": best[2]}


def tune(presets, tokens, log=print, budget_s: float = 480.0) -> Path:
    """Tune every (preset shape, T bucket) and write the tuned JSON (merged with what is there)."""
    import torch
    import triton

    from . import configs as cfgs

    gpu = torch.cuda.get_device_name(0)
    path = cfgs.config_path(gpu, "bfloat16", triton.__version__)
    data = {"gpu": gpu, "dtype": "bfloat16", "triton": triton.__version__, "configs": {}}
    if path.exists():
        data = json.loads(path.read_text())
    t0 = time.time()
    for name in presets:
        cfg = bench_config(name)
        w = random_device_weights(cfg)
        key = cfgs.shape_key(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
        log(f"tuning {name} ({key})")
        for T in tokens:
            if time.time() - t0 > budget_s:
                log(f"  tuning budget of {budget_s:.0f} s spent: stopping before {name} T={T}")
                break
            entry = tune_shape(cfg, w, T, log=log)
            data["configs"].setdefault(key, {})[str(cfgs.bucket_of(T))] = entry
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        del w
        torch.cuda.empty_cache()
    cfgs._tuned.cache_clear()
    cfgs.load_file(path)  # fail loudly now if what was written is malformed
    return path
