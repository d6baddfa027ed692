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
#: GiB of weights the warm-up's processes may hold on the GPU at once (an H200 has 131 GiB)
WARM_GPU_GIB = 100.0


def _set(**kw):
    def f(mk):
        mk = copy.deepcopy(mk)
        mk.update(kw)
        return mk
    return f


def _route_each(mk):
    """T = 1 with a split router: every GEMM 1 task routes the token itself (tiles["router"]["EACH"];
    megakernel_config.route_each), where the default leaves it off (more than ROUTE_EACH_MAX_EXPERTS
    experts); other configs unchanged."""
    from megamoe.kernels import megakernel_config as mkc

    return mkc.route_each(mk)


def _router_off(key: str):
    """The config without the router switch ``key`` (tiles["router"]["EACH"] or ["ALIGN_EACH"])."""
    def f(mk):
        mk = copy.deepcopy(mk)
        mk["tiles"]["router"].pop(key, None)
        return mk
    return f


#: name -> (change, why): the alternative of each choice the default config makes by a threshold,
#: so that a GPU the thresholds were not measured on can time both; "default" is always measured
VARIANTS = {
    "reach": (_route_each, "T = 1: every GEMM 1 task routes the token itself from the logits' partials, not "
                           "waiting for the top-k task's align and signal"),
    "noreach": (_router_off("EACH"), "T = 1: the top-k task routes the token and signals the GEMM 1 tasks"),
    "noaeach": (_router_off("ALIGN_EACH"), "the align as scan and scatter tasks, not each GEMM 1 task placing its "
                                           "block's rows from the top-k tasks' histograms and the routing"),
    "tmaw": (_set(tma_weights=True), "the routed GEMM tasks' weight tiles through TMA descriptors (bulk copies)"),
    "ptrw": (_set(tma_weights=False), "the routed GEMM tasks' weight tiles by cp.async pointer loads"),
}
#: the variants timed at T = 1, at 1 < T < 512, and from T = 512 on
T1_VARIANTS = ("reach", "noreach", "tmaw", "ptrw")
MID_VARIANTS = ("noaeach", "tmaw", "ptrw")
PREFILL_VARIANTS = ("ptrw",)
#: the variants timed with FP8 weights (bench_megakernel.py --fp8 weights --variants), and with FP8
#: activations too (--fp8 weights+act)
FP8_VARIANTS = ("tmaw",)
FP8A_VARIANTS = ("ptrw",)


def variant_names(T: int, fp8: str | None = None) -> tuple[str, ...]:
    """The variants bench_megakernel.py --variants times at T (and its warm-up compiles)."""
    if fp8:
        return FP8_VARIANTS if fp8 == "weights" else FP8A_VARIANTS
    return T1_VARIANTS if T == 1 else (MID_VARIANTS if T < 512 else PREFILL_VARIANTS)


def variant_configs(base: dict, names=None) -> list[tuple[str, dict]]:
    """[(name, config)] for the default and each named variant that differs from it (``names`` None:
    every variant; an empty list: the default alone, as megakernel_trace.py asks without --variants)."""
    out = [("default", base)]
    names = None if names is None else [n for n in names if n != "default"]  # "default": always first
    unknown = [n for n in (names or ()) if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown megakernel variant(s) {', '.join(map(repr, unknown))}; "
                         f"expected names from: {', '.join(sorted(VARIANTS))}")
    for n in (VARIANTS if names is None else names):
        mk = VARIANTS[n][0](base)
        if mk != base and all(mk != m for _, m in out):
            out.append((n, mk))
    return out


def _warm_job(name: str, T: int, what: str, fp8: str | None = None) -> str:
    """Run once, so that Triton compiles it: ``what`` = "backends" (both backends, both routings;
    with ``fp8`` both FP8 backends and the bf16 megakernel), a variant name (of the FP8 megakernel
    with ``fp8``), or "trace:<variant>" (the traced kernel of "default" or a variant)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.fp8_weights import to_fp8
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward, num_programs, trace_rows
    from megamoe.reference.tiles import task_layout

    cfg = kb.bench_config(name)
    w = kb.random_device_weights(cfg)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    fp8_act = fp8 == "weights+act" if fp8 else None
    try:
        if what == "backends":
            wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
            if fp8:
                for ww in (w, wz):
                    kmoe.moe_forward(x, ww, cfg, backend="megakernel")  # the bf16 megakernel of the row
                w = to_fp8(w)
                wz = type(w)(**{**w.arrays(), "router_weight": wz.router_weight})
            for backend in ("megakernel", "multi"):
                for ww in (w, wz):
                    kmoe.moe_forward(x, ww, cfg, backend=backend, fp8_activations=fp8_act)
        else:
            trace = what.startswith("trace:")
            vname = what.split(":", 1)[1] if trace else what
            if fp8:
                w = to_fp8(w)
            base = megakernel_config(cfg, T, torch.bfloat16, x.device, fp8=fp8)
            mk = base if vname == "default" else dict(variant_configs(base, [vname])).get(vname)
            if mk is not None:
                tr = torch.zeros((trace_rows(cfg, T, mk, num_programs(x.device, task_layout(cfg, T, mk["tiles"]),
                                                                   mk["occupancy"]))[0], 3),
                                 device="cuda", dtype=torch.int64) if trace else None
                megakernel_forward(x, w, cfg, mk=mk, trace=tr, fp8=fp8)
        torch.cuda.synchronize()
        return f"{name}:{T} {what}" + (f" fp8:{fp8}" if fp8 else "")
    except Exception as exc:  # noqa: BLE001 - the measuring process meets it again and records it
        return f"{name}:{T} {what}" + (f" fp8:{fp8}" if fp8 else "") + f" {type(exc).__name__}"


def warm_jobs(presets, tokens, variant_tokens=(), trace_cases=(), trace_variants=(), fp8: str | None = None,
              names=None) -> list:
    """(preset, T, what, fp8) jobs: both backends at every (preset, T); each variant of
    ``variant_names`` (or of ``names``, where given) at variant_tokens; the traced default and
    trace_variants at the (preset, T) of trace_cases (bf16). ``fp8``: the rows' and variants' FP8
    mode (bench_megakernel.py --fp8)."""
    jobs = [(n, T, "backends", fp8) for n in presets for T in tokens]
    jobs += [(n, T, v, fp8) for n in presets for T in variant_tokens for v in (names or variant_names(T, fp8))]
    jobs += [(n, T, f"trace:{v}", None) for n, T in trace_cases for v in ("default", *trace_variants)]
    return jobs


#: an FP8 job holds the bf16 weights, their e4m3 copy (half their bytes) and to_fp8's float32
#: slices (fp8_weights.CHUNK_ELEMS: 1 GiB each, a few at once) while it quantizes
FP8_JOB_EXTRA_GIB = 4.0


def weight_gib(name: str, fp8: str | None = None) -> float:
    """GiB of weights a warm-up job of the preset holds on the GPU (its bf16 layer; FP8 jobs more)."""
    from megamoe.kernels import bench as kb
    from megamoe.reference.sizes import expert_bytes

    cfg = kb.bench_config(name)
    gib = cfg.num_experts * expert_bytes(cfg, "bfloat16") / 2**30
    return 1.5 * gib + FP8_JOB_EXTRA_GIB if fp8 else gib


def can_start(job: tuple[float, bool], running: list[tuple[float, bool]], processes: int,
              gpu_gib: float = WARM_GPU_GIB) -> bool:
    """Whether a warm-up job, (GiB it holds, heavy: its preset's bf16 layer over HEAVY_GIB), may start
    beside the running ones: a free process, at most HEAVY_JOBS heavy ones, and all their GiB within
    ``gpu_gib`` (a job alone always starts)."""
    gib, heavy = job
    if len(running) >= processes:
        return False
    if heavy and sum(h for _, h in running) >= HEAVY_JOBS:
        return False
    return not running or sum(g for g, _ in running) + gib <= gpu_gib


def warm(jobs: list[tuple], timeout_s: float, processes: int = 14, log=print, gpu_gib: float = WARM_GPU_GIB, *,
         job_fn=None, gib_of=None) -> None:
    """Run each job of ``warm_jobs`` in a process of a spawn pool (one job per process: a fresh
    process for each, so that one compile's memory goes with it), in order, each started when
    ``can_start``: the weights it holds (``weight_gib``) fit beside the running jobs' within
    ``gpu_gib``, and heavy presets (bf16 layer over HEAVY_GIB) at most HEAVY_JOBS at once.
    ``job_fn`` (default this module's job) runs ``job_fn(*job)``; ``gib_of(job)``: the GiB it holds
    (default from its preset, job[0], and FP8 mode, job[3:])."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    t0 = time.time()
    job_fn = job_fn or _warm_job
    gib_of = gib_of or (lambda j: weight_gib(j[0], *j[3:]))
    need = {j: (gib_of(j), weight_gib(j[0]) > HEAVY_GIB) for j in jobs}
    queue = sorted(jobs, key=lambda j: need[j][1])  # light first (stable: in order)
    running: dict = {}  # AsyncResult -> (GiB, heavy)
    with ctx.Pool(min(processes, len(jobs)), maxtasksperchild=1) as pool:
        while queue or running:
            for j in list(queue):
                if can_start(need[j], list(running.values()), processes, gpu_gib):
                    running[pool.apply_async(job_fn, j)] = need[j]
                    queue.remove(j)
            for r in [r for r in running if r.ready()]:
                try:
                    log(f"# warmed {r.get()} ({time.time() - t0:.0f} s)")
                except Exception as exc:  # noqa: BLE001
                    log(f"# warm-up failed: {type(exc).__name__}: {exc}")
                del running[r]
            if time.time() - t0 > timeout_s:
                log(f"# warm-up: time limit {timeout_s:.0f} s reached; the rest compiles as it runs")
                pool.terminate()
                return
            time.sleep(0.5)
