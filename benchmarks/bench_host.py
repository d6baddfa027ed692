"""Host time of eager calls (no CUDA graph): moe_forward, bind(...)(x) and moe_experts (issue 38, item 3).

    python benchmarks/bench_host.py [--out FILE.jsonl] [--presets qwen3-30b-a3b,deepseek-v3]
        [--tokens 1,8,64,4096] [--backends multi,megakernel] [--calls 200] [--budget-s 420]
        [--entries moe_forward,bind,bind_graphs,moe_experts]
    TRITON_INTERPRET=1 python benchmarks/bench_host.py --smoke      # the CPU: tiny sizes, the code runs

Per (preset, T, backend, entry), after warm-up calls (compiles), medians over ``--calls`` calls of:
- ``enqueue_us``: wall time of the Python call alone, the GPU idle before it (synchronize, time the
  call, no sync inside the timing): the host time an eager caller pays per layer;
- ``wall_us``: the call then ``torch.cuda.synchronize()``;
- ``gpu_us``: CUDA events around the call;
- ``enqueue_us_runner`` (not for ``bind_graphs``): ``enqueue_us`` again, in the same run, with the
  launches of the tapes the row's call replays sent through Triton's runner instead of straight into
  each kernel's C launcher (``direct_launches`` of them launch directly): what the direct launch saves;
- ``tape_replays``: tapes replayed by one call after the warm-up (0: the timed calls launch through
  Triton, or replay a CUDA graph); ``tape_recordings`` and ``tape_refusals`` (why, each reason once):
  the warm-up's recordings (``watch_tapes``); ``kept_hits``: whether that call found what an earlier
  call kept for its signature (``moe._calls``: 1 for ``moe_forward`` and ``bind`` once warm, 0 for
  ``moe_experts``, which keeps none).
Entries: ``moe_forward`` (the whole layer: router, experts, shared MLP where the preset has one),
``bind`` (the closure of ``bind(weights, config)``), ``bind_graphs`` (``bind(..., graphs=True)``:
a CUDA graph per T replayed, T <= moe.GRAPH_MAX_TOKENS) and ``moe_experts`` (routed experts,
routing given, ``check=True``). For ``moe_experts`` also the proof that it never waits for the
GPU: with ``torch.cuda._sleep`` queued first, the call returns while the sleep still runs
(``returned_during_sleep``), and a bad routing is raised later, by ``check_routing``
(``bad_routing_raised_by``, ``bad_routing_message``). Each row's output is checked against the
float64 reference (``err_max`` / ``err_rms``, normalized; rows 0 and T-1, on the routing the
kernels used) and against a call with every cache dropped (``same_as_uncached``: bitwise). Last,
per backend a cProfile top-20 of 200 eager T = 1 ``moe_forward`` calls, and of 200 ``moe_experts``
calls, of the first preset. Rows
go to the JSONL file as they finish (with the GPU, versions, commit and date) and print as a
table. About 5 minutes on an H100, compiles included (no case starts after ``--budget-s``); exit
status 1 if any row failed a check.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE_CALLS = 200  # eager T = 1 moe_forward calls profiled
SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep before the no-wait proof, GPU clock cycles (about 0.1 s)


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_calls(fn, dev, calls: int) -> dict:
    """Medians (us) of enqueue, wall with sync and (CUDA) GPU time over ``calls`` calls of ``fn()``."""
    import torch

    enq, wall, gpu = [], [], []
    for _ in range(calls):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        enq.append(time.perf_counter() - t0)
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        wall.append(time.perf_counter() - t0)
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            gpu.append(a.elapsed_time(b) * 1e-3)
    med = lambda v: round(statistics.median(v) * 1e6, 2) if v else None  # noqa: E731
    return {"enqueue_us": med(enq), "wall_us": med(wall), "gpu_us": med(gpu), "calls": calls}


def reference_rows(x, w, cfg, topk_idx, topk_w, rows) -> tuple:
    """float64 (routed, shared) parts of y at ``rows`` from the reference's expert FFNs on the given
    routing and its shared MLP (zeros without one)."""
    import numpy as np

    from megamoe.kernels.peer import routed_reference
    from megamoe.reference import MoEWeights, shared_forward

    def f64(t):
        return None if t is None else t.detach().double().cpu().numpy()

    xs = f64(x[list(rows)])
    routed = routed_reference(x, topk_idx, topk_w, w.gate_up, w.down, cfg, list(rows),
                              gate_up_bias=w.gate_up_bias, down_bias=w.down_bias)
    shared = np.zeros_like(xs)
    if cfg.num_shared_experts:
        sw = MoEWeights(router_weight=None, gate_up=None, down=None, shared_gate_up=f64(w.shared_gate_up),
                        shared_down=f64(w.shared_down), shared_gate=f64(w.shared_gate))
        shared = shared_forward(xs, sw, cfg)
    return routed, shared


def make_case(cfg, w, T: int, dev, dtype) -> dict:
    """One T's inputs, the kernels' routing of them and the reference's rows 0 and T-1 (made once,
    for every backend and entry)."""
    import torch

    from megamoe.kernels import moe_forward_details

    g = torch.Generator(device=dev.type).manual_seed(T)
    x = torch.randn((T, cfg.hidden_size), device=dev, dtype=dtype, generator=g)
    if not T:
        z = torch.zeros((0, cfg.top_k), device=dev)
        return {"x": x, "idx": z.int(), "tw": z.float(), "rows": [], "ref": None}
    det = moe_forward_details(x, w, cfg)
    rows = sorted({0, T - 1})
    ref = reference_rows(x, w, cfg, det["topk_idx"], det["topk_weights"], rows)
    return {"x": x, "idx": det["topk_idx"], "tw": det["topk_weights"], "rows": rows, "ref": ref}


def check_output(y, case: dict, *, shared: bool) -> dict:
    """Normalized error of y's rows 0 and T-1 against the case's reference rows (+ its shared MLP)."""
    from megamoe.reference import normalized_error, tolerance_for

    if case["ref"] is None:
        return {"err_max": 0.0, "err_rms": 0.0, "err_ok": True}
    routed, sh = case["ref"]
    rep = normalized_error(y[case["rows"]].double().cpu().numpy(), routed + sh if shared else routed)
    tmax, trms = tolerance_for(str(y.dtype).removeprefix("torch."))
    return {"err_max": rep.max_err, "err_rms": rep.rms_err, "err_ok": rep.max_err <= tmax and rep.rms_err <= trms}


def no_wait_proof(call, dev) -> dict:
    """Whether ``call()`` returns while a GPU sleep queued before it still runs (CUDA only)."""
    import torch

    if dev.type != "cuda":
        return {"returned_during_sleep": None}
    _sync(dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    mark = torch.cuda.Event()
    mark.record()
    t0 = time.perf_counter()
    call()
    host = time.perf_counter() - t0
    during = not mark.query()
    _sync(dev)
    return {"returned_during_sleep": during, "host_us_behind_sleep": round(host * 1e6, 2)}


def deferred_error(call_bad, dev) -> dict:
    """A bad routing's KernelInputError: raised by the call (CPU) or by check_routing (GPU), and where."""
    from megamoe.kernels import KernelInputError, check_routing

    try:
        call_bad()
    except KernelInputError as exc:
        return {"bad_routing_raised_by": "the call", "bad_routing_message": str(exc)}
    try:
        check_routing(dev)
    except KernelInputError as exc:
        return {"bad_routing_raised_by": "check_routing", "bad_routing_message": str(exc)}
    return {"bad_routing_raised_by": None, "bad_routing_message": None}


def uncached(fn):
    """fn() with every eager cache dropped first and after (a fresh call's output)."""
    from megamoe.kernels import moe

    moe.clear_caches()
    try:
        return fn()
    finally:
        moe.clear_caches()


def smoke_config(name: str):
    """A tiny config of ``name``'s kind (its router, activation and shared MLP) for the interpreter."""
    from megamoe.reference import MoEConfig

    cfg = MoEConfig.preset(name)
    n_group = min(cfg.n_group, 4)
    return cfg.replace(hidden_size=32, intermediate_size=16, num_experts=8, top_k=min(cfg.top_k, 3),
                       n_group=n_group, topk_group=min(cfg.topk_group, n_group),
                       shared_intermediate_size=16 if cfg.num_shared_experts else 0)


def make_weights(cfg, dev, dtype, seed: int = 0):
    """Random weights on ``dev``: made on a GPU (a DeepSeek-V3 layer is 22 GB), else from the reference."""
    from megamoe.reference import random_weights

    if dev.type == "cuda":
        from megamoe.kernels.measure import random_device_weights

        return random_device_weights(cfg, seed)
    return random_weights(cfg, seed=seed).to_torch(str(dev), dtype)


#: the entries a case times, in this order unless --entries names others
ENTRIES = ("moe_forward", "bind", "bind_graphs", "moe_experts")


def rows_for(name, cfg, w, case: dict, backend, dev, calls, log, warmup: int = 3,
             entries: tuple = ENTRIES) -> list[dict]:
    """The rows of one (preset, T, backend), one per entry of ``entries`` in that order (an entry
    may come twice: each time is its own row)."""
    import torch

    from megamoe.kernels import bind, moe_experts, moe_forward

    x, idx, tw = case["x"], case["idx"], case["tw"]
    T = x.shape[0]
    base = {"preset": name, "T": T, "backend": backend, "dtype": str(x.dtype).removeprefix("torch.")}
    f = bind(w, cfg, backend=backend)
    fg = bind(w, cfg, backend=backend, graphs=True)

    def experts(ids):
        return moe_experts(x, ids, tw, w.gate_up, w.down, w.gate_up_bias, w.down_bias, activation=cfg.activation,
                           alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit, backend=backend)

    calls_of = {"moe_forward": lambda: moe_forward(x, w, cfg, backend=backend), "bind": lambda: f(x),
                "bind_graphs": lambda: fg(x), "moe_experts": lambda: experts(idx)}
    out = []
    for entry in entries:
        fn = calls_of[entry]
        row = {**base, "entry": entry}
        try:
            t0 = time.perf_counter()
            with watch_tapes() as seen:
                for _ in range(warmup):  # compiles, fills the caches
                    fn()
            _sync(dev)
            row["warmup_s"] = round(time.perf_counter() - t0, 2)
            with watch_tapes() as timed:
                fn()
            row.update(tape_recordings=seen["recorded"], tape_refusals=seen["refused"], tape_replays=timed["replays"],
                       kept_hits=timed["kept"])
            row.update(time_calls(fn, dev, calls))
            if entry != "bind_graphs":
                row.update(runner_ab(fn, dev, calls, timed["tapes"]))
            y = fn()
            plain = calls_of["bind"] if entry == "bind_graphs" else fn  # a graph's y against a plain call's
            row["same_as_uncached"] = bool(torch.equal(y, uncached(plain)))
            row.update(check_output(y, case, shared=entry != "moe_experts"))
            if entry == "moe_experts" and T:
                row.update(no_wait_proof(fn, dev))
                bad = idx.clone()
                bad[T - 1, 0] = cfg.num_experts + 3
                row.update(deferred_error(lambda bad=bad: experts(bad), dev))
        except Exception as exc:  # noqa: BLE001 - an entry that cannot run is a row saying why
            row["error"] = f"{type(exc).__name__}: {exc}"
        log(row)
        out.append(row)
    return out


@contextlib.contextmanager
def watch_tapes():
    """What the eager calls made inside do with recorded launches (kernels/tape.py): ``recorded``
    (tapes made), ``refused`` (why a recording was refused, each reason once), ``replays``,
    ``tapes`` (the tapes replayed, each once) and ``kept`` (calls that found their kept call
    signature or bound plan, ``moe._calls``).
    A row's ``tape_replays`` (per timed call, from one call after the warm-up) says whether its
    timings are of replayed launches; ``tape_refusals`` says why not, where the warm-up's
    recordings were refused."""
    from megamoe.kernels import moe, tape

    seen = {"recorded": 0, "refused": [], "replays": 0, "tapes": [], "kept": 0}
    record, replay, kept_call = moe.record, tape.Tape.replay, moe._kept_call

    def watched_record(inputs, run):
        y, tp, why = record(inputs, run)
        if tp is not None:
            seen["recorded"] += 1
        elif why not in seen["refused"]:
            seen["refused"].append(why)
        return y, tp, why

    def watched_replay(self, inputs, stream):
        seen["replays"] += 1
        if not any(t is self for t in seen["tapes"]):
            seen["tapes"].append(self)
        return replay(self, inputs, stream)

    def watched_kept_call(key, weights, config):
        hit = kept_call(key, weights, config)
        seen["kept"] += hit is not None
        return hit

    moe.record, tape.Tape.replay, moe._kept_call = watched_record, watched_replay, watched_kept_call
    try:
        yield seen
    finally:
        moe.record, tape.Tape.replay, moe._kept_call = record, replay, kept_call


def runner_ab(fn, dev, calls: int, tapes: list) -> dict:
    """The same calls with the launches of ``tapes`` (those the row's call replays, ``watch_tapes``)
    sent through Triton's runner instead of straight into the compiled C launchers
    (kernels/tape.py): ``enqueue_us_runner``, side by side with the row's ``enqueue_us``;
    ``direct_launches``: the launches of those tapes that launch directly (0: no tape replayed, or
    none launches directly, and the two times measure the same path)."""
    saved = [t.steps for t in tapes]
    direct = sum(d is not None for t in tapes for d, _ in t.steps)
    for t in tapes:
        t.steps = [(None, runner) for _, runner in t.steps]
    try:
        return {"enqueue_us_runner": time_calls(fn, dev, calls)["enqueue_us"], "direct_launches": direct}
    finally:
        for t, steps in zip(tapes, saved):
            t.steps = steps


def profile_top(cfg, w, dev, dtype, backend: str, calls: int = PROFILE_CALLS, entry: str = "moe_forward") -> str:
    """cProfile's top 20 (cumulative) of ``calls`` eager T = 1 calls of ``entry`` ("moe_forward" or
    "moe_experts", on one token's K distinct experts)."""
    import torch

    from megamoe.kernels import moe_experts, moe_forward

    x = torch.randn((1, cfg.hidden_size), device=dev, dtype=dtype)
    idx = torch.randperm(cfg.num_experts)[:cfg.top_k].view(1, -1).to(device=dev, dtype=torch.int32)
    tw = torch.rand((1, cfg.top_k), device=dev)

    def call():
        if entry == "moe_experts":
            return moe_experts(x, idx, tw, w.gate_up, w.down, backend=backend)
        return moe_forward(x, w, cfg, backend=backend)

    for _ in range(3):
        call()
    _sync(dev)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    _sync(dev)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(20)
    return buf.getvalue()


def _provenance(dev) -> dict:
    if dev.type == "cuda":
        from megamoe.kernels.provenance import provenance

        return provenance()
    import platform

    import torch
    import triton

    from megamoe.kernels.provenance import git_state

    return {"gpu": None, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "triton": triton.__version__, **git_state(), "device": "cpu-interpreter"}


HEADER = (f"{'preset':<15}{'T':>6} {'backend':<11}{'entry':<12}{'enqueue us':>11}{'runner us':>11}{'wall us':>10}{'gpu us':>9}"
          f"{'err max':>10} {'uncached':<9}{'no wait':<8}{'replays':>8}{'kept':>5}")


def fmt(r: dict) -> str:
    def n(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    nowait = {True: "yes", False: "NO", None: "-"}[r.get("returned_during_sleep")]
    return (f"{r['preset']:<15}{r['T']:>6} {r['backend']:<11}{r['entry']:<12}{n(r.get('enqueue_us')):>11}"
            f"{n(r.get('enqueue_us_runner')):>11}{n(r.get('wall_us')):>10}{n(r.get('gpu_us')):>9}{n(r.get('err_max'), '.2e'):>10} "
            f"{str(r.get('same_as_uncached', '-')):<9}{nowait:<8}{n(r.get('tape_replays'), 'd'):>8}"
            f"{n(r.get('kept_hits'), 'd'):>5}"
            + "".join(f"  (recording refused: {why})" for why in r.get("tape_refusals") or ()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSONL file the rows are appended to "
                                                "(default benchmarks/results/eager_host_<date>.jsonl)")
    ap.add_argument("--presets", default="qwen3-30b-a3b,deepseek-v3")
    ap.add_argument("--tokens", default="1,8,64,4096")
    ap.add_argument("--backends", default="multi,megakernel")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per measurement")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before (the first compiles)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds")
    ap.add_argument("--entries", default=",".join(ENTRIES),
                    help="the entries each case times, in this order; one may come twice (its rows in turn)")
    ap.add_argument("--smoke", action="store_true", help="tiny configs under TRITON_INTERPRET=1 on the CPU")
    args = ap.parse_args(argv)
    entries = tuple(e for e in args.entries.split(",") if e)
    bad = [e for e in entries if e not in ENTRIES]
    if bad or not entries:
        ap.error(f"--entries: want names from {', '.join(ENTRIES)}, got {args.entries!r}")
    import torch

    if args.smoke:
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            print("bench_host --smoke: set TRITON_INTERPRET=1 before starting it", file=sys.stderr)
            return 2
        dev, dtype = torch.device("cpu"), torch.float32
    elif torch.cuda.is_available():
        dev, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    else:
        print("bench_host: needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    from megamoe.reference import MoEConfig

    presets = [p for p in args.presets.split(",") if p]
    tokens = [int(t) for t in args.tokens.split(",") if t]
    backends = [b for b in args.backends.split(",") if b]
    prov = _provenance(dev)
    day = (prov.get("date") or time.strftime("%Y-%m-%d"))[:10]
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"eager_host_{day}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"# {prov}", flush=True)
    print(HEADER, flush=True)
    rows, t0 = [], time.time()

    def log(r: dict) -> None:
        r.update(prov)
        rows.append(r)
        with out.open("a") as fh:
            fh.write(json.dumps(r) + "\n")
        print(fmt(r), flush=True)

    cases = [(p, T, b) for p in presets for T in tokens for b in backends]
    first_w, done = None, 0
    for i, name in enumerate(presets):
        cfg = smoke_config(name) if args.smoke else MoEConfig.preset(name)
        w = make_weights(cfg, dev, dtype)
        if i == 0:
            first_w = (cfg, w)
        for T in tokens:
            case = None
            for b in backends:
                if time.time() - t0 > args.budget_s:
                    print(f"# budget of {args.budget_s:.0f} s spent: {name} T={T} {b} not run", flush=True)
                    continue
                try:
                    case = case or make_case(cfg, w, T, dev, dtype)
                    rows_for(name, cfg, w, case, b, dev, args.calls, log, args.warmup, entries)
                except Exception as exc:  # noqa: BLE001 - a case that cannot run is a row saying why
                    log({"preset": name, "T": T, "backend": b, "entry": "all", "error": f"{type(exc).__name__}: {exc}"})
                done += 1
                print(f"#   progress {done}/{len(cases)}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        if i:
            del w
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    cfg, w = first_w
    for b in backends:
        for entry in ("moe_forward", "moe_experts"):
            n = PROFILE_CALLS if not args.smoke else 2
            text = profile_top(cfg, w, dev, dtype, b, calls=n, entry=entry)
            log({"preset": presets[0], "T": 1, "backend": b, "entry": "cprofile" if entry == "moe_forward"
                 else "cprofile_moe_experts", "calls": n, "top20": text})
            print(f"{presets[0]} T=1 {b} {entry}:\n{text}", flush=True)
    print(f"# {len(rows)} rows appended to {out}", flush=True)
    bad = [r for r in rows if r.get("error") or r.get("same_as_uncached") is False or r.get("err_ok") is False
           or r.get("returned_during_sleep") is False or (r.get("entry") == "moe_experts" and r["T"]
                                                          and r.get("bad_routing_raised_by") is None)]
    for r in bad:
        print(f"# FAILED: {fmt(r)} {r.get('error') or ''}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
