"""The tuner: GEMM configs timed on this GPU against the model's choice, written to the tuned JSON
kernels/configs/<gpu>__<dtype>__triton-<v>.json only where a candidate beats that choice.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, BM tile rows (BLOCK_M).

Per (shape, T bucket): every GEMM 1 and GEMM 2 config of ``configs.candidates`` (and the model's
own) is timed alone as CUDA-graph replays; the best pair of one BM is the tuner's best. The caller
passes the model's entry (``megamoe tune``: the cost model's choice; the kernels never price
anything). The best is kept (written) only where it is at least KEEP_MARGIN faster than the model's
entry as measured here; otherwise the model's choice stands and a tuned entry of that bucket is
dropped. The timer is an argument (``gpu_timer`` on a GPU; tests pass a fake one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from . import configs as cfgs

#: the fraction by which the tuner's best must beat the model's entry, as measured, to be kept
KEEP_MARGIN = 0.02

#: timer(gemm, config) -> us of one launch of that GEMM ("gemm1" or "gemm2") with that config
Timer = Callable[[str, dict], float]


class BudgetSpent(Exception):
    """The time budget ran out in the middle of a (shape, T bucket): its timings are dropped."""


def gemm_launches(cfg, w, T: int, buffers: dict | None = None) -> Callable[[str, dict], Callable[[], None]]:
    """launch_of(gemm, config) -> a function that launches that GEMM ("gemm1" or "gemm2") alone with
    that config, on random x (T, H) routed by the layer's router (on the weights' device and dtype).
    ``buffers``: filled with what the launches write, {"act": {BLOCK_M: (P_max, I)}, "out": {split:
    (split x T x K, H)}} (GEMM 2 reads the act of GEMM 1 of the same BLOCK_M)."""
    import torch
    import triton

    from .align import launch_align
    from .grouped_gemm import launch_gemm1, launch_gemm2
    from .routing import launch_router

    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    dev, dt, i32 = w.router_weight.device, w.router_weight.dtype, torch.int32
    x = torch.randn(T, H, device=dev, dtype=dt)
    block_t = cfgs.router_block_t(T, E)
    C = triton.cdiv(T, block_t)
    topk_idx = torch.empty((T, K), device=dev, dtype=i32)
    topk_w = torch.empty((T, K), device=dev, dtype=torch.float32)
    hist = torch.empty((C, E), device=dev, dtype=i32)
    launch_router(x, w, cfg, topk_idx, topk_w, hist, None, block_t)
    metas, outs = {}, {}
    if buffers is not None:
        buffers.update(act={}, out=outs)

    def meta_for(bm):
        if bm not in metas:
            P_max = cfgs.max_padded_rows(T * K, E, bm)
            meta = {k: torch.empty(n, device=dev, dtype=i32) for k, n in (
                ("chunk_base", (C, E)), ("counts", (E,)), ("padded_offsets", (E + 1,)), ("padded_token", (P_max,)),
                ("padded_pair", (P_max,)), ("block_expert", (P_max // bm,)), ("pair_dest", (T * K,)))}
            launch_align(topk_idx, hist, E, block_t, bm, meta)
            metas[bm] = (meta, torch.randn((P_max, I), device=dev, dtype=dt), P_max // bm)
            if buffers is not None:
                buffers["act"][bm] = metas[bm][1]
        return metas[bm]

    def out_for(split):
        if split not in outs:
            outs[split] = torch.empty((split * T * K, H), device=dev, dtype=torch.float32 if split > 1 else dt)
        return outs[split]

    def launch_of(gemm: str, c: dict) -> Callable[[], None]:
        meta, act, nm = meta_for(c["BLOCK_M"])
        if gemm == "gemm1":
            return lambda: launch_gemm1(x, w.gate_up, w.gate_up_bias, act, meta, topk_w, c,
                                        activation=cfg.activation, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit,
                                        scale_input=cfg.weight_on_input, dense=False, num_m=nm)
        sk = c.get("SPLIT_K", 1)
        out = out_for(sk)
        return lambda: launch_gemm2(act, w.down, w.down_bias, out, meta, None if cfg.weight_on_input else topk_w, c,
                                    T=T, K=K, KS=K, dense=False, atomic=False, num_m=nm, split=sk)

    return launch_of


def gpu_timer(cfg, w, T: int, reps: int = 10) -> Timer:
    """A timer of the layer's grouped GEMMs at T on this GPU (``gemm_launches``): each GEMM launched
    alone 4 times in a CUDA graph, median of ``reps`` replays."""
    from .measure import graph_time_us

    launch_of = gemm_launches(cfg, w, T)

    def timer(gemm: str, c: dict) -> float:
        f = launch_of(gemm, c)
        return graph_time_us(lambda _a: f(), [None] * 4, max(5, reps))

    return timer


def _label(c: dict) -> str:
    v = "" if c["variant"] == "pointer" else (" tma" + (" flat" if c["FLATTEN"] else ""))
    return (f"BM={c['BLOCK_M']} BN={c['BLOCK_N']} BK={c['BLOCK_K']} w{c['num_warps']} s{c['num_stages']}"
            + (f" split{c['SPLIT_K']}" if c["SPLIT_K"] > 1 else "") + v)


def tune_shape(E: int, H: int, I: int, K: int, T: int, model_entry: dict, timer: Timer, *, log=print,
               label: str = "", deadline: float | None = None, dtype: str = "bfloat16") -> dict:
    """Time the candidates and the model's entry for one shape at T -> {"best": entry, "best_us",
    "model_us", "failed": [labels]} (us: gemm1 + gemm2, each alone). ``deadline``: time.time()
    past which it raises BudgetSpent."""
    model = cfgs.check_entry(model_entry, f"{label} model entry")
    cands = cfgs.candidates(E, H, I, K, T, dtype=dtype)
    res, failed = {}, []
    for g in ("gemm1", "gemm2"):
        todo = {json.dumps(c, sort_keys=True): c for c in [*cands[g], model[g]]}
        for i, (key, c) in enumerate(todo.items(), 1):
            if deadline is not None and time.time() > deadline:
                raise BudgetSpent(f"{label}: budget spent at {g} candidate {i}/{len(todo)}")
            try:
                res[g, key] = us = float(timer(g, c))
                log(f"  {label} {g} candidate {i}/{len(todo)} {_label(c)}: {us:.1f} us")
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is skipped, named
                failed.append(f"{g} {_label(c)}: {type(exc).__name__}")
                log(f"  {label} {g} candidate {i}/{len(todo)} {_label(c)}: failed ({type(exc).__name__})")
    best = None
    for bm in sorted({c["BLOCK_M"] for g in ("gemm1", "gemm2") for c in cands[g]}):
        pair = []
        for g in ("gemm1", "gemm2"):
            ok = [(us, key) for (gg, key), us in res.items() if gg == g and json.loads(key)["BLOCK_M"] == bm]
            pair.append(min(ok) if ok else None)
        if pair[0] and pair[1] and (best is None or pair[0][0] + pair[1][0] < best[0]):
            best = (pair[0][0] + pair[1][0], json.loads(pair[0][1]), json.loads(pair[1][1]))
    mk = [res.get((g, json.dumps(model[g], sort_keys=True))) for g in ("gemm1", "gemm2")]
    if best is None or None in mk:
        raise RuntimeError(f"{label}: {'no candidate pair' if best is None else 'the model entry'} ran "
                           f"({'; '.join(failed) or 'no failures recorded'})")
    return {"best": {"gemm1": best[1], "gemm2": best[2]}, "best_us": best[0], "model_us": mk[0] + mk[1],
            "failed": failed}


def keeps(best_us: float, model_us: float, margin: float = KEEP_MARGIN) -> bool:
    """Whether the tuner's best (us) beats the model's entry (us) by at least ``margin``."""
    return best_us <= model_us * (1.0 - margin)


def verdict(best_us: float, model_us: float, margin: float = KEEP_MARGIN) -> str:
    """The line ``megamoe tune`` prints for one (shape, T bucket)."""
    rel = (best_us / model_us - 1.0) * 100.0
    if keeps(best_us, model_us, margin):
        return f"kept: {best_us:.1f} us vs the model's {model_us:.1f} ({rel:+.1f}%)"
    return f"the model's choice stands: within {margin * 100:.0f}% ({best_us:.1f} us vs the model's {model_us:.1f})"


def record(path: Path, gpu: str, dtype: str, triton_version: str, key: str, T: int, entry: dict | None,
           date: str | None = None) -> None:
    """Set (``entry``, measured at ``date``, ISO 8601, default now) or drop (None) the tuned entry
    of ``key`` at T's bucket in file ``path``, checked by the loader before it replaces the file."""
    data = json.loads(path.read_text()) if path.exists() else {"gpu": gpu, "dtype": dtype, "triton": triton_version,
                                                                 "configs": {}}
    b = str(cfgs.bucket_of(T))
    if entry is not None:
        data["configs"].setdefault(key, {})[b] = entry
        data.setdefault("dates", {}).setdefault(key, {})[b] = date or datetime.now(UTC).isoformat(
            timespec="seconds")
    elif b in data["configs"].get(key, {}):
        for table in (data["configs"], data.get("dates", {})):
            table.get(key, {}).pop(b, None)
            if key in table and not table[key]:
                del table[key]
    else:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    cfgs.load_file(tmp)
    tmp.replace(path)
    cfgs._tuned.cache_clear()
    from .moe import clear_caches  # plans kept by earlier calls name the old entries

    clear_caches()


class _GpuTimers:
    """timers(name, cfg, T) -> gpu_timer on random weights of preset ``name`` (made once, kept: the
    four default presets' layers take about 31 GB)."""

    def __init__(self):
        self.weights = {}

    def __call__(self, name: str, cfg, T: int) -> Timer:
        from .measure import random_device_weights

        if name not in self.weights:
            self.weights[name] = random_device_weights(cfg)
        return gpu_timer(cfg, self.weights[name], T)


def _checked(check: Callable, name: str, cfg, w, T: int, entry: dict) -> dict:
    """``check``'s report, or {"ok": False, "error": ...} where the check itself raised."""
    try:
        return check(name, cfg, w, T, entry)
    except Exception as exc:  # noqa: BLE001 - a layer that cannot run with the entry fails its check, named
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def tune(presets, tokens, log=print, budget_s: float = 480.0, *, model_entries: Callable | None = None,
         timers: Callable | None = None, gpu: str | None = None, triton_version: str | None = None,
         path: Path | None = None, on_row: Callable | None = None, skip: Callable | None = None,
         check: Callable | None = None) -> Path:
    """Tune every (preset, T) against the model's entry and update the tuned JSON (``path``, default
    this GPU's): a bucket's entry is written where the best beats the model's entry by KEEP_MARGIN,
    dropped where it does not. ``model_entries(name, T)`` -> (entry, predicted us or None) (default:
    select_config's entry without a tuned file); ``timers(name, cfg, T)`` -> Timer (default: this
    GPU's); ``on_row(row)``: each (preset, T)'s comparison as it finishes; ``skip(name, T)``: True
    for those already done. ``check(name, cfg, weights, T, entry)`` -> {"ok": bool, ...}: the layer's
    numerics with an entry (weights: the timers' ``weights[name]`` if they keep them); the best entry
    is kept only if its check is ok. T-major; stops at the first (preset, T) that would start past
    ``budget_s``, and drops one the budget ends in the middle of."""
    from .measure import bench_config

    if timers is None:
        import torch
        import triton

        gpu, triton_version, timers = gpu or torch.cuda.get_device_name(0), triton_version or triton.__version__, \
            _GpuTimers()
    path = path or cfgs.config_path(gpu, "bfloat16", triton_version)
    deadline = time.time() + budget_s
    layers = {name: bench_config(name) for name in presets}
    for T in tokens:  # T-major: a run the budget cuts short has every preset at the smaller T
        for name, cfg in layers.items():
            if skip and skip(name, T):
                continue
            if time.time() > deadline:
                log(f"tuning budget of {budget_s:.0f} s spent: stopping before {name} T={T}")
                return path
            E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
            key = cfgs.shape_key(E, H, I, K)
            model, predicted = (model_entries(name, T) if model_entries
                                else (cfgs.untuned_config(E, H, I, K, T, gpu=gpu), None))
            log(f"{name} T={T} ({key}): timing the candidates and the model's entry")
            try:
                r = tune_shape(E, H, I, K, T, model, timers(name, cfg, T), log=log, label=f"{name} T={T}",
                               deadline=deadline)
            except BudgetSpent as exc:
                log(f"tuning budget of {budget_s:.0f} s spent: {exc}; nothing written for it")
                return path
            kept = keeps(r["best_us"], r["model_us"])
            line = verdict(r["best_us"], r["model_us"])
            numerics = {}
            if check is not None:
                w = getattr(timers, "weights", {}).get(name)
                numerics["model_numerics"] = _checked(check, name, cfg, w, T, model)
                if not numerics["model_numerics"]["ok"]:
                    log(f"{name} T={T}: the model's entry fails the float64 reference check: "
                        f"{numerics['model_numerics']}")
                if kept:
                    numerics["best_numerics"] = _checked(check, name, cfg, w, T, r["best"])
                    if not numerics["best_numerics"]["ok"]:
                        kept = False
                        line = f"not kept: the best entry fails the float64 reference check: {numerics['best_numerics']}"
            log(f"{name} T={T}: {line}")
            record(path, gpu, "bfloat16", triton_version, key, T, r["best"] if kept else None)
            if on_row:
                on_row({"preset": name, "T": T, "bucket": cfgs.bucket_of(T), "shape": key, "gpu": gpu,
                        "triton": triton_version, "model_entry": cfgs.check_entry(model, "model entry"),
                        "model_predicted_us": predicted, "model_measured_us": r["model_us"],
                        "best_entry": r["best"], "best_us": r["best_us"], "ratio": r["model_us"] / r["best_us"],
                        "kept": kept, "failed": r["failed"], **numerics})
    return path
