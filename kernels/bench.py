"""``megamoe bench``: the fused MoE layer against its floor, the ideal grouped GEMM and PyTorch, on a GPU.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, m rows per expert.

Per (preset, T, dtype) row: the ceilings (ceilings.py), the floor (``ceilings.floor_terms``), ours
(moe_forward timed by ``measure.graph_time_us``) and the PyTorch pipeline (torch_moe.py). ``--peer
FILE``: another implementation's routed experts beside megamoe's (``moe_experts``), same routing and
weights, both checked against the float64 reference (peer.py); bf16 rows.
``--dtype bf16,fp8,fp8-act`` (``DTYPES``). Rows are printed and appended as JSON lines with their
provenance to benchmarks/results/kernels_<date>.jsonl or --out; ``--tune`` tunes first (tune.py).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from .ceilings import (  # noqa: F401 - re-exported: `megamoe bench`'s pieces, as the scripts import them
    DTYPES,
    MATMUL_N,
    floor_matmul_rate,
    floor_terms,
    fp8_matmul_rate,
    ideal_grouped_rate,
    measure_ceilings,
)
from .measure import (  # noqa: F401
    BREAKDOWN_STOPS,
    WARMUP_CALLS,
    bench_config,
    calls_before_timed_replay,
    graph_time_us,
    inputs_per_graph,
    random_device_weights,
    stage_split,
)
from .peer import PeerError, load_peer, peer_columns
from .provenance import REPO, ProvenanceError, git_state, provenance  # noqa: F401
from .torch_moe import torch_moe, torch_route  # noqa: F401
from .tune import tune

PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")
TOKENS = (1, 8, 64, 512, 4096, 16384)


# --------------------------------------------------------------------------- one row
def bench_row(name: str, cfg, w, T: int, ceil: dict, *, reps: int, with_torch: bool = True,
              with_ideal: bool = True, deterministic: bool = True, breakdown: bool = False,
              backend: str = "auto", dtype: str = "bf16", peer=None) -> dict:
    """One row: ``w`` the weights of ``dtype`` (a ``DTYPES`` name). FP8 rows leave out the bf16-only figures.
    ``peer``: a peer's ``fused_experts`` (peer.py), timed beside megamoe's routed experts (bf16 rows)."""
    import torch

    from ..reference.sizes import ffn_flops
    from . import moe as kmoe

    H = cfg.hidden_size
    fp8 = DTYPES[dtype]
    if fp8 is not None and not w.is_fp8:
        raise ValueError(f"dtype {dtype} needs FP8 weights (fp8_weights.to_fp8), got float ones")
    fp8_act = fp8 == "weights+act"
    ni = inputs_per_graph(T)
    gen = torch.Generator(device="cuda").manual_seed(1000 + T)
    xs = [torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ni)]
    touched = []
    for x in xs[:4]:
        d = kmoe.moe_forward_details(x, w, cfg)
        touched.append(int((d["counts"] > 0).sum().item()))
    et = sum(touched) / len(touched)
    kmoe.check_inputs(xs[0], w, cfg)
    ran = kmoe.resolve_backend(backend, cfg, T, xs[0].dtype, xs[0].device, fp8=fp8)  # FP8: backend_fp8's table
    if fp8 is None:
        config = kmoe.kernel_config(cfg, T, torch.bfloat16, xs[0].device)
    elif ran == "multi":
        config = kmoe.static_plan_for(cfg, T, xs[0].dtype, xs[0].device, deterministic, fp8=fp8).gemm
    else:
        from .megakernel import megakernel_config

        config = megakernel_config(cfg, T, xs[0].dtype, xs[0].device, fp8=fp8)
    import triton

    sources = config_sources(cfg, T, ran=ran, backend=backend, gpu=kmoe.device_name(xs[0].device),
                             triton_version=triton.__version__, fp8=fp8, interpret=xs[0].device.type == "cpu")
    ours = graph_time_us(lambda x: kmoe.moe_forward(x, w, cfg, deterministic=deterministic, check=False,
                                                    backend=ran, fp8_activations=fp8_act), xs, reps)
    flops, byt = floor_terms(cfg, T, et, dtype)
    mm_kind, mm_rate = floor_matmul_rate(ceil, dtype)
    floor_us = max(flops / mm_rate, byt / ceil["read_bytes_per_s"]) * 1e6 if mm_rate else None
    row = {
        "preset": name, "T": T, "dtype": dtype, "experts_touched": et, "flops": flops, "bytes": byt,
        "floor_us": floor_us, "floor_matmul": mm_kind, "ours_us": ours,
        "ours_over_floor": ours / floor_us if floor_us else None,
        "ours_tflops": flops / (ours * 1e-6) / 1e12, "deterministic": deterministic, "backend": ran,
        "config": config, **sources,
    }
    if floor_us is None:
        row["floor_error"] = f"no {mm_kind} matmul rate: {ceil.get('fp8_matmul_error', 'not measured')}"[:300]
    if fp8 is not None:
        with_torch = with_ideal = False
    if with_torch:
        try:
            tt = graph_time_us(lambda x: torch_moe(x, w, cfg), xs, max(5, reps // 2))
            row.update(torch_us=tt, speedup_vs_torch=tt / ours)
        except Exception as exc:  # noqa: BLE001 - record why, keep going
            row.update(torch_us=None, torch_error=f"{type(exc).__name__}: {exc}"[:300])
    if with_ideal and T >= 512:
        ideal = ideal_grouped_rate(cfg, T)
        routed_flops = ffn_flops(T * cfg.top_k, H, cfg.intermediate_size)
        row.update(ideal_tflops=ideal / 1e12, ours_routed_tflops=routed_flops / (ours * 1e-6) / 1e12,
                   ours_over_ideal_rate=routed_flops / (ours * 1e-6) / ideal)
    if breakdown and ran == "multi":  # CUDA-graph times of the pipeline's prefixes; differences are the stages
        prefix = {stop: graph_time_us(lambda x, stop=stop: kmoe._forward(x, w, cfg, deterministic, stop,
                                                                         fp8_activations=fp8_act), xs, reps)
                  for stop in BREAKDOWN_STOPS}
        row.update(stage_us=stage_split(prefix, ours))
    if peer is not None and fp8 is None:
        row.update(peer_columns(cfg, w, xs, ran, reps, peer))
    del xs
    return row


def config_sources(cfg, T: int, *, ran: str, backend: str, gpu: str, triton_version: str, fp8: str | None = None,
                   interpret: bool = False) -> dict:
    """Where a row's configs come from (configs.SOURCES): ``config_source`` of the launch configs that
    ran (the megakernel's: megakernel_config's rules, "heuristic"), and for ``backend`` "auto"
    ``backend_source`` of the backend ``ran``."""
    from . import configs as cfgs

    shape = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, T)
    kw = dict(gpu=gpu, dtype="bfloat16", triton_version=triton_version)
    out = {"config_source": "heuristic" if ran == "megakernel" else cfgs.config_source(*shape, **kw, interpret=interpret)}
    if backend == "auto":
        out["backend_source"] = cfgs.backend_source(*shape, **kw, fp8=fp8)
    return out


def fmt_sources(r: dict) -> str:
    """The printed row's last column: "model", or with backend "auto" "model; multi by tuned"."""
    s = r.get("config_source", "-")
    if "backend_source" in r:
        s += f"; {r.get('backend', '?')} by {r['backend_source']}"
    return s


def fmt_num(v, spec: str) -> str:
    """``v`` formatted with ``spec``, or "-" in the same width where it is not a number."""
    return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(len(format(0.0, spec)))


def fmt_row(r: dict) -> str:
    def f(k, spec):
        return fmt_num(r.get(k), spec)

    return (f"{r['preset']:<16}{r['T']:>6} {r.get('dtype', 'bf16'):>7} {f('floor_us', '10.1f')} {f('ours_us', '10.1f')} "
            f"{f('ours_over_floor', '6.2f')} {f('speedup_vs_bf16', '6.2f')} {f('torch_us', '10.1f')} "
            f"{f('speedup_vs_torch', '6.2f')} "
            f"{f('experts_us', '10.1f')} {f('peer_us', '9.1f')} {f('speedup_vs_peer', '6.2f')} "
            f"{f('ours_over_ideal_rate', '6.2f')} "
            f"{f('ours_tflops', '7.1f')}  {fmt_sources(r)}")


HEADER = (f"{'preset':<16}{'T':>6} {'dtype':>7} {'floor us':>10} {'ours us':>10} {'o/fl':>6} {'xbf16':>6} {'torch us':>10} "
          f"{'xtorch':>6} {'experts us':>10} {'peer us':>9} {'xpeer':>6} {'o/idl':>6} {'TFLOP/s':>7}  configs from")


def dtype_rows(run_one, dtypes, emit, log=print) -> None:
    """The rows of one (preset, T, combine mode), in ``dtypes`` order, each handed to ``emit``; one
    that raises is logged and left out. fp8 rows get ``bf16_us`` and ``speedup_vs_bf16``."""
    bf16 = None
    for dt in dtypes:
        try:
            r = run_one(dt)
        except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
            log(f"{dt} failed: {type(exc).__name__}: {str(exc)[:500]}")
            continue
        if DTYPES[dt] is None:
            bf16 = r
        elif bf16 is not None:
            r.update(bf16_us=bf16["ours_us"], bf16_backend=bf16["backend"])
            if bf16["backend"] == r["backend"]:
                r["speedup_vs_bf16"] = bf16["ours_us"] / r["ours_us"]
        emit(r)


# --------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated preset names")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts T")
    p.add_argument("--reps", type=int, default=30, help="graph replays per timing (median)")
    p.add_argument("--tune", action="store_true", help="search GEMM configs first and write kernels/configs/*.json")
    p.add_argument("--tune-budget", type=float, default=480.0, help="seconds of tuning at most")
    p.add_argument("--tune-tokens", default=None, help="token counts to tune (default: --tokens)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch pipeline")
    p.add_argument("--fast-combine", action="store_true", help="also time the atomic (non-deterministic) combine")
    p.add_argument("--backend", default="auto", choices=("auto", "megakernel", "multi"),
                   help="moe_forward's backend (rows record the one that ran; default auto)")
    p.add_argument("--dtype", default="bf16",
                   help=f"comma-separated weight formats, of {', '.join(DTYPES)} (default bf16): fp8 = e4m3 weights "
                        f"with 128 x 128 block scales, fp8-act = the same with FP8 activations")
    p.add_argument("--breakdown", action="store_true", help="also time router+align, gemm1, gemm2, combine apart")
    p.add_argument("--out", default=None, help="JSON-lines file to append rows to")
    p.add_argument("--peer", default=None, metavar="FILE",
                   help="a Python file defining fused_experts(x, w13, w2, topk_weights, topk_ids) (megamoe's layouts): "
                        "timed beside megamoe's routed experts on the same routing and weights, its output checked "
                        "against the float64 reference (docs/kernels.md, 'Comparing with a peer')")


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (None if nothing), checked before torch is imported."""
    from ..reference import PRESETS as KNOWN

    bad = [s for s in args.presets.split(",") if s and s not in KNOWN]
    if bad:
        return f"unknown preset(s) {bad}; presets: {', '.join(KNOWN)}"
    for opt, text in (("--tokens", args.tokens), ("--tune-tokens", args.tune_tokens)):
        if text is None:
            continue
        try:
            ts = [int(v) for v in text.split(",") if v]
        except ValueError:
            return f"{opt} must be comma-separated whole numbers, got {text!r}"
        if not ts or any(t < 1 for t in ts):
            return f"{opt} must list token counts >= 1, got {text!r}"
    if args.reps < 1:
        return f"--reps must be >= 1, got {args.reps}"
    dts = [d for d in args.dtype.split(",") if d]
    bad = [d for d in dts if d not in DTYPES]
    if bad or not dts:
        return f"--dtype: unknown dtype(s) {bad or [args.dtype]}; choices: {', '.join(DTYPES)}"
    if len(set(dts)) != len(dts):
        return f"--dtype lists a dtype twice: {args.dtype!r}"
    return None


def run(args: argparse.Namespace) -> int:
    bad = check_args(args)
    if bad:
        print(f"megamoe bench: error: {bad}", file=sys.stderr)
        return 2
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"megamoe bench: needs torch and triton on a CUDA GPU (pip install -e '.[gpu]'): {exc}", file=sys.stderr)
        return 2
    try:
        peer = load_peer(args.peer) if args.peer else None
    except PeerError as exc:
        print(f"megamoe bench: error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("megamoe bench needs a CUDA GPU", file=sys.stderr)
        return 2
    presets = [s for s in args.presets.split(",") if s]
    tokens = [int(s) for s in args.tokens.split(",") if s]
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / (
        f"kernels_{_dt.date.today().isoformat()}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    print(f"# {prov}", flush=True)
    if args.tune:
        tt = [int(v) for v in args.tune_tokens.split(",")] if args.tune_tokens else tokens
        path = tune(presets, tt, budget_s=args.tune_budget)
        print(f"# tuned configs written to {path}", flush=True)
    dtypes = [d for d in DTYPES if d in args.dtype.split(",")]  # bf16 first: the fp8 rows' speedup needs it
    ceil = measure_ceilings()
    fp8_mm = ceil.get("fp8_matmul_flops_per_s")
    print(f"# ceilings: read {ceil['read_bytes_per_s']/1e12:.2f} TB/s, bf16 matmul "
          f"{ceil['matmul_flops_per_s']/1e12:.0f} TFLOP/s, fp8 matmul "
          + (f"{fp8_mm/1e12:.0f} TFLOP/s" if fp8_mm else f"not measured ({ceil.get('fp8_matmul_error')})"), flush=True)
    print(HEADER, flush=True)
    rows = []
    n_total, n_done, t0 = len(presets) * len(tokens), 0, time.time()
    from .fp8_weights import to_fp8

    def emit(r: dict) -> None:
        r.update(prov)
        r.update({f"ceiling_{k}": v for k, v in ceil.items()})
        rows.append(r)
        with out.open("a") as fh:
            fh.write(json.dumps(r) + "\n")

    for name in presets:
        cfg = bench_config(name)
        ws = {"bf16": random_device_weights(cfg)}
        if any(DTYPES[d] for d in dtypes):
            ws["fp8"] = to_fp8(ws["bf16"])  # on the GPU, from the same bf16 weights
        if "bf16" not in dtypes:
            del ws["bf16"]
        for T in tokens:
            modes = [True, False] if args.fast_combine else [True]
            for det in modes:
                def one(dt, det=det, T=T, name=name, cfg=cfg, ws=ws):
                    return bench_row(name, cfg, ws["bf16" if DTYPES[dt] is None else "fp8"], T, ceil, reps=args.reps,
                                     with_torch=not args.no_torch and det, deterministic=det,
                                     breakdown=args.breakdown, backend=args.backend, dtype=dt,
                                     peer=peer if det else None)

                def show(r, det=det):
                    emit(r)
                    print(fmt_row(r) + ("" if det else "  (atomic)"), flush=True)
                    if r.get("peer_error") or r.get("experts_error"):
                        print(f"    peer: {r.get('peer_error') or ''} experts: {r.get('experts_error') or 'ok'}",
                              flush=True)
                    if "stage_us" in r:
                        print("    stages us: " + ", ".join(f"{k} {v:.1f}" for k, v in r["stage_us"].items()),
                              flush=True)

                dtype_rows(one, dtypes, show, log=lambda msg, name=name, T=T: print(f"# {name} T={T} {msg}", flush=True))
            n_done += 1
            print(f"#   progress {n_done}/{n_total}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    print(f"# rows appended to {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="megamoe bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
