"""Named megakernel variants and the parallel compile-ahead shared by the megakernel benchmarks.

A variant is a function of the default config (``kernels.megakernel.megakernel_config``) that
changes one choice, so that one GPU run times each choice against the default side by side
(bench_megakernel.py ``--variants``, megakernel_trace.py ``--variants``).

``warm(warm_jobs(...))`` compiles ahead into Triton's on-disk cache: each job (preset, T, what to
run) runs in its own process, so the 15-30 s compiles of the megakernel run side by side on the
GPU machine's cores; the measuring process then finds every kernel compiled.
"""

from __future__ import annotations

import copy

#: bf16 weights of one layer above this many GiB: at most HEAVY_JOBS such processes at once
HEAVY_GIB = 12.0
HEAVY_JOBS = 3


def _set(**kw):
    def f(mk):
        mk = copy.deepcopy(mk)
        mk.update(kw)
        return mk
    return f


def _bn(scale: float):
    def f(mk):
        mk = copy.deepcopy(mk)
        for g in ("gemm1", "gemm2"):
            mk["tiles"][g]["BLOCK_N"] = int(min(128, max(32, mk["tiles"][g]["BLOCK_N"] * scale)))
        return mk
    return f


def _order(**kw):
    def f(mk):
        mk = copy.deepcopy(mk)
        mk["tiles"]["order"].update(kw)
        return mk
    return f


def _wide(mk):
    """stream-K with 128-column GEMM tiles (segments balance the programs, not the tile count)."""
    mk = copy.deepcopy(mk)
    mk["tiles"]["order"]["STREAM_K"] = 1
    for g in ("gemm1", "gemm2"):
        mk["tiles"][g]["BLOCK_N"] = 128
    per_stage = max(mk["tiles"]["gemm1"]["BLOCK_M"] * mk["tiles"]["gemm1"]["BLOCK_K"] * 2
                    + 2 * mk["tiles"]["gemm1"]["BLOCK_K"] * 128 * 2, 1)
    mk["num_stages"] = max(2, min(mk["num_stages"], (200 << 10) // per_stage))
    return mk


def _fp8_fast(block_n: int | None = None, max_stages: int = 6):
    """fp8fast (bit-move conversion, scales a K step ahead), optionally with GEMM tiles of block_n
    columns, and as many pipeline stages as the decode stage budget (configs.STAGE_BYTES) holds of
    e4m3 weights, up to max_stages (configs.decode_stages stops at 6)."""
    def f(mk):
        from megamoe.kernels import configs as cfgs

        mk = copy.deepcopy(mk)
        mk.update(fp8_convert="bits", fp8_scale_prefetch=True)
        t = mk["tiles"]
        if block_n:
            for g in ("gemm1", "gemm2"):
                t[g]["BLOCK_N"] = block_n
        if block_n or max_stages != 6:  # the shared MLP's tiles count whether or not the preset has one
            per_stage = cfgs.decode_stage_bytes(t, True, weight_bytes=1)
            mk["num_stages"] = max(2, min(max_stages, 1 + cfgs.STAGE_BYTES // per_stage))
        return mk
    return f


#: name -> (change, why); the default config is always measured as "default"
VARIANTS = {
    "tiles": (_order(STREAM_K=0), "GEMM tasks as whole tiles (no stream-K segments)"),
    "sk": (_order(STREAM_K=1), "stream-K GEMM segments, one per program"),
    "sk_wide": (_wide, "stream-K with 128-column GEMM tiles"),
    "rank": (_set(topk_rank=True), "top-k tasks rank every expert at once (one reduction, not K maxima)"),
    "pfwait": (_set(prefetch_wait=True), "a GEMM 2 task that must wait for its GEMM 1 prefetches its weights into L2 first"),
    "stages3": (_set(num_stages=3), "3 pipeline stages"),
    "stages4": (_set(num_stages=4), "4 pipeline stages"),
    "stages6": (_set(num_stages=6), "6 pipeline stages"),
    "occ2": (_set(occupancy=2), "two programs per SM (where registers and shared memory allow)"),
    "next": (_set(next_ticket=True), "take the next ticket as a task starts, not after it ends"),
    # FP8 weights (bench_megakernel.py --fp8): the e4m3 -> bf16 conversion and the scale loads of the K loop
    "fp8bits": (_set(fp8_convert="bits"), "FP8: e4m3 -> bf16 by bit moves and one bf16x2 multiply (inline PTX), "
                                          "not Triton's cast (two F2F per pair on the conversion pipe)"),
    "fp8pf": (_set(fp8_scale_prefetch=True), "FP8: the next K step's weight scales loaded during this one"),
    "fp8fast": (_fp8_fast(), "FP8: fp8bits and fp8pf together"),
    "fp8fast_st": (_fp8_fast(max_stages=10), "FP8: fp8fast with the stages the decode budget holds of e4m3 "
                                             "weights, up to 10 (bytes in flight per program as bf16's)"),
    "fp8fast_bn128": (_fp8_fast(block_n=128), "FP8: fp8fast with 128-column GEMM tiles (twice the bytes per K "
                                              "step of a 64-column tile)"),
}
#: the variants timed at T = 1 and at T > 1 (each is a 15-30 s compile)
T1_VARIANTS = ("rank", "pfwait", "sk", "stages4")
MID_VARIANTS = ("pfwait", "sk")
#: the variants timed with FP8 weights (bench_megakernel.py --fp8 ... --variants), at every variant T
FP8_VARIANTS = ("fp8bits", "fp8pf", "fp8fast", "fp8fast_st", "fp8fast_bn128")


def variant_configs(base: dict, names=None) -> list[tuple[str, dict]]:
    """[(name, config)] for the default and each named variant that differs from it."""
    out = [("default", base)]
    for n in (names or VARIANTS):
        mk = VARIANTS[n][0](base)
        if mk != base and all(mk != m for _, m in out):
            out.append((n, mk))
    return out


def _warm_job(name: str, T: int, what: str) -> str:
    """Run once, so that Triton compiles it: ``what`` = "backends" (both backends, both routings),
    a variant name, or "trace:<variant>" (the traced kernel of "default" or a variant)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.reference.tiles import task_layout

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    try:
        if what == "backends":
            wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
            for backend in ("megakernel", "multi"):
                for ww in (w, wz):
                    kmoe.moe_forward(x, ww, cfg, backend=backend)
        else:
            trace = what.startswith("trace:")
            vname = what.split(":", 1)[1] if trace else what
            base = megakernel_config(cfg, T, torch.bfloat16, x.device)
            mk = base if vname == "default" else dict(variant_configs(base, [vname])).get(vname)
            if mk is not None:
                tr = torch.zeros((task_layout(cfg, T, mk["tiles"]).max_tasks, 3), device="cuda",
                                 dtype=torch.int64) if trace else None
                megakernel_forward(x, w, cfg, mk=mk, trace=tr)
        torch.cuda.synchronize()
        return f"{name}:{T} {what}"
    except Exception as exc:  # noqa: BLE001 - the measuring process meets it again and records it
        return f"{name}:{T} {what} {type(exc).__name__}"


def warm_jobs(presets, tokens, variant_tokens=(), trace_cases=(), trace_variants=()) -> list:
    """(preset, T, what) jobs: both backends at every (preset, T); each variant (MID_VARIANTS past
    T = 1) at variant_tokens;
    the traced default and trace_variants at the (preset, T) of trace_cases."""
    jobs = [(n, T, "backends") for n in presets for T in tokens]
    jobs += [(n, T, v) for n in presets for T in variant_tokens for v in (T1_VARIANTS if T == 1 else MID_VARIANTS)]
    jobs += [(n, T, f"trace:{v}") for n, T in trace_cases for v in ("default", *trace_variants)]
    return jobs


def weight_gib(name: str) -> float:
    from megamoe.kernels import bench as kb
    from megamoe.reference.sizes import expert_bytes

    cfg = kb.bench_config(name)
    return cfg.num_experts * expert_bytes(cfg, "bfloat16") / 2**30


def warm(jobs: list[tuple[str, int, str]], timeout_s: float, processes: int = 14, log=print) -> None:
    """Run each job of ``warm_jobs`` in a process of a spawn pool (one job per process: a fresh
    process for each, so that one compile's memory goes with it); heavy presets (weights over
    HEAVY_GIB) at most HEAVY_JOBS at once, so the GPU's memory holds them."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    t0 = time.time()
    heavy = [j for j in jobs if weight_gib(j[0]) > HEAVY_GIB]
    light = [j for j in jobs if j not in heavy]
    with ctx.Pool(min(processes, len(jobs)), maxtasksperchild=1) as pool:
        pending = [pool.apply_async(_warm_job, j) for j in light]
        running_heavy = []
        queue = list(heavy)
        while queue or running_heavy or pending:
            while queue and len(running_heavy) < HEAVY_JOBS:
                running_heavy.append(pool.apply_async(_warm_job, queue.pop(0)))
            for r in [r for r in pending + running_heavy if r.ready()]:
                try:
                    log(f"# warmed {r.get()} ({time.time() - t0:.0f} s)")
                except Exception as exc:  # noqa: BLE001
                    log(f"# warm-up failed: {type(exc).__name__}: {exc}")
                (pending if r in pending else running_heavy).remove(r)
            if time.time() - t0 > timeout_s:
                log(f"# warm-up: time limit {timeout_s:.0f} s reached; the rest compiles as it runs")
                pool.terminate()
                return
            time.sleep(0.5)
