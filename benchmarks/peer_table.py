"""megamoe against a same-run peer (vLLM's Triton fused-MoE kernels), the floor and the cost model, in one GPU run.

    python benchmarks/peer_table.py --peer benchmarks/peer_vllm.py --out DIR [--budget-s 480]
        [--presets a,b] [--tokens 1,8,64] [--profile h100] [--reps 20] [--no-warm]
    python benchmarks/peer_table.py --smoke --peer tests/data/fake_peer.py --out DIR   # CPU, interpreter

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, NI inputs per CUDA graph.

Rows (preset, T, routing): the presets x T, "uniform" routing (the preset's router on random inputs)
and "concentrated" at T in CONCENTRATED_T (the router's weight zeroed: every token on the same K
experts). Decode rows (T <= DECODE_MAX_T) run first across the presets, then prefill preset by
preset; a preset's weights are freed after its last row. Per row, all in this run on one GPU:

    routing    the layer's router on each of NI inputs (``kernels.peer.routings``): the same
               (x, topk_weights, topk_ids) are given to every routed-experts column
    multi, megakernel   megamoe's ``moe_experts`` on each backend (the megakernel at T <=
               MEGAKERNEL_MAX_T, or where ``auto`` picks it); ``auto`` the backend megamoe picks
    layer      ``moe_forward`` with ``auto``, its own router included (the whole layer)
    predicted  the cost model's price of the layer on ``auto``'s backend (megamoe.predict, the
               profile named after the GPU: ``h100`` where it exists, else ``h200``; --profile)
    peer       the peer as shipped: with the hooks of benchmarks/peer_vllm.py, vLLM's own config
               for this GPU with its alignment done before the graph (as its CUDA op would be);
               peer_inline: its ``fused_experts`` with everything in the graph; peer_configs:
               each config it ships for the Hopper GPUs (the best of them: peer_hopper_us)
    floor      max(FLOPs / matmul rate, bytes / streaming-read rate), both measured first

The peer file defines ``fused_experts`` (kernels/peer.py) and may define the hooks (HOOKS)
``shipped_config(T, E, I, H, K) -> (config, source)``, ``other_configs(T, E, I, H, K) -> {label:
config}``, ``prepare(topk_ids, config, E) -> state`` (made before the graph) and ``run(x, w13, w2,
topk_weights, topk_ids, config, state) -> y``; without them the peer column is ``fused_experts``.

Every column's output on SAMPLE tokens of the first input is compared with the float64 reference
(routed experts: ``kernels.peer.routed_reference`` on the given routing; the layer:
``megamoe.numerics.reference_on_tokens``) by the normalized error; a column off by more than the
dtype's tolerance is reported wrong and not timed. Times: CUDA-graph replays of NI calls, median of
--reps replays (``graph_time_us``). Rows go to DIR/peer.jsonl as they finish (GPU, versions,
commit, date) and DIR/peer_table.md is rewritten after each: the table, the geometric mean of best
peer / best megamoe, T = 1 best / floor per preset. ``--warm`` (default): every (preset, T) runs
once first in processes of their own, side by side, so that Triton's compiles fill its disk cache.
``--smoke``: tiny layers on the CPU under TRITON_INTERPRET=1 in float32, wall-clock times and
stand-in ceilings (no figure of it is a measurement): the whole path, for the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)
#: T at which the concentrated rows (every token on the same K experts) are measured
CONCENTRATED_T = (8, 64)
#: rows at T up to this run first, across the presets
DECODE_MAX_T = 64
#: the largest T the megakernel column is timed at (beyond it only where ``auto`` picks it)
MEGAKERNEL_MAX_T = 512
#: tokens of a row's first input checked against the float64 reference
SAMPLE = 4
#: CUDA-graph replays per timing, at least, for a table that counts (the median's)
MIN_REPS = 20
#: the share of --budget-s the compile-ahead may take at most
WARM_SHARE = 0.45
#: stand-in ceilings of --smoke, bytes/s and FLOP/s (no GPU: its floor is not a measurement)
SMOKE_CEILINGS = {"read_bytes_per_s": 1e10, "matmul_flops_per_s": 1e11}
#: --smoke's tokens, inputs per timing and layer sizes (hidden, expert width, at most experts, at most top-k)
SMOKE_TOKENS = (1, 8)
SMOKE_INPUTS = 2
SMOKE_SIZES = (32, 16, 8, 2)
#: the hooks of a peer file that give the as-shipped and other-config columns (benchmarks/peer_vllm.py)
HOOKS = ("shipped_config", "other_configs", "prepare", "run")
#: the issue's decode target: best megamoe at T = 1 <= FLOOR_FACTOR x floor + FLOOR_SLACK_US
FLOOR_FACTOR, FLOOR_SLACK_US = 1.25, 3.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for peer.jsonl and peer_table.md")
    p.add_argument("--peer", required=True, help="a Python file defining fused_experts(x, w13, w2, topk_weights, "
                   "topk_ids) (benchmarks/peer_vllm.py for vLLM's kernels)")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default=None, help=f"comma-separated T (default {','.join(map(str, TOKENS))})")
    p.add_argument("--reps", type=int, default=None, help=f"CUDA-graph replays per timing (median; default {MIN_REPS}, "
                   "1 with --smoke)")
    p.add_argument("--budget-s", type=float, default=480.0, help="no row starts after this many seconds")
    p.add_argument("--profile", default=None, help="the cost model's profile (default: the GPU's, e.g. h100, "
                   "else h200)")
    p.add_argument("--no-warm", dest="warm", action="store_false", help="compile as the rows run")
    p.add_argument("--smoke", action="store_true", help="tiny layers on the CPU under the interpreter (tests)")
    args = p.parse_args(argv)
    from megamoe.reference import PRESETS as KNOWN

    bad = [s for s in args.presets.split(",") if s not in KNOWN]
    if bad:
        p.error(f"unknown preset(s) {bad}; presets: {', '.join(KNOWN)}")
    try:
        args.token_list = [int(t) for t in (args.tokens or ",".join(
            map(str, SMOKE_TOKENS if args.smoke else TOKENS))).split(",") if t]
    except ValueError:
        p.error(f"--tokens must be comma-separated whole numbers, got {args.tokens!r}")
    if not args.token_list or min(args.token_list) < 1:
        p.error(f"--tokens must list token counts >= 1, got {args.tokens!r}")
    args.reps = args.reps or (1 if args.smoke else MIN_REPS)
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    if args.reps < MIN_REPS and not args.smoke:
        print(f"# --reps {args.reps}: a median of fewer than {MIN_REPS} replays; the table's rule is {MIN_REPS} "
              f"or more", flush=True)
    args.preset_list = args.presets.split(",")
    return args


# --------------------------------------------------------------------------- what runs, in which order
def plan_rows(presets, tokens) -> list[tuple[str, int, str]]:
    """(preset, T, routing) in run order: decode (T <= DECODE_MAX_T) T by T across the presets,
    uniform then concentrated; then prefill preset by preset."""
    def at(p, T):
        return [(p, T, "uniform")] + ([(p, T, "concentrated")] if T in CONCENTRATED_T else [])

    decode = [r for T in sorted(t for t in tokens if t <= DECODE_MAX_T) for p in presets for r in at(p, T)]
    prefill = [r for p in presets for T in sorted(t for t in tokens if t > DECODE_MAX_T) for r in at(p, T)]
    return decode + prefill


def layer_config(name: str, smoke: bool):
    """The preset as benchmarked (routed experts only), or its tiny --smoke version."""
    from megamoe.kernels import bench as kb

    cfg = kb.bench_config(name)
    if not smoke:
        return cfg
    H, I, E_max, K_max = SMOKE_SIZES
    E = min(cfg.num_experts, E_max)
    groups = min(cfg.n_group, E // 4)
    return cfg.replace(hidden_size=H, intermediate_size=I, num_experts=E, top_k=min(cfg.top_k, K_max),
                       n_group=max(groups, 1), topk_group=min(cfg.topk_group, max(groups // 2, 1)))


def make_weights(cfg, smoke: bool):
    """(uniform-routing weights, the same with the router's weight zeroed: concentrated routing)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.reference import random_weights

    w = random_weights(cfg, seed=0).to_torch("cpu", torch.float32) if smoke else kb.random_device_weights(cfg)
    wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    return w, wz


def make_inputs(cfg, T: int, n: int, smoke: bool) -> list:
    import torch

    dev, dt = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    gen = torch.Generator(device=dev).manual_seed(1000 + T)
    return [torch.randn(T, cfg.hidden_size, device=dev, dtype=dt, generator=gen) for _ in range(n)]


def _raises(exc: Exception):
    def fn(_):
        raise exc

    return fn


def columns(cfg, w, ins: list, T: int, auto: str, peer, info: dict | None = None) -> dict:
    """{column: (fn, inputs, reference "experts" or "layer")}: every variant the row times, each
    called as fn(inputs[i]). ``ins``: (x, topk_weights, topk_ids) per input; ``peer``: its module;
    ``info`` gets "peer_shipped" (the peer's config as shipped and where it came from). A peer hook
    that raises gives a "peer" column that raises the same (recorded as the row's peer_error)."""
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.peer import peer_output

    E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    gu, dn = w.gate_up, w.down

    def experts(backend):
        return lambda a: kmoe.moe_experts(a[0], a[2], a[1], gu, dn, backend=backend, check=False)

    cols = {"multi": (experts("multi"), ins, "experts")}
    if T <= MEGAKERNEL_MAX_T or auto == "megakernel":
        cols["megakernel"] = (experts("megakernel"), ins, "experts")
    cols["layer"] = (lambda a: kmoe.moe_forward(a[0], w, cfg, backend="auto", check=False), ins, "layer")
    cols["peer_inline"] = (lambda a: peer_output(peer.fused_experts, a[0], gu, dn, a[1], a[2]), ins, "experts")
    if not all(hasattr(peer, h) for h in HOOKS):
        return cols
    try:
        shipped, source = peer.shipped_config(T, E, I, H, K)
        if info is not None:
            info["peer_shipped"] = [shipped, source]
        confs = {"peer": shipped, **{f"cfg:{k}": c for k, c in peer.other_configs(T, E, I, H, K).items()}}
        for key, c in confs.items():
            prepared = [(x, tw, ti, peer.prepare(ti, c, E)) for x, tw, ti in ins]

            def run(a, c=c):
                return peer_output(lambda *q: peer.run(*q, c, a[3]), a[0], gu, dn, a[1], a[2])

            cols[key] = (run, prepared, "experts")
    except Exception as exc:  # noqa: BLE001 - the peer's failure, reported in its column
        cols = {k: v for k, v in cols.items() if k in ("multi", "megakernel", "layer", "peer_inline")}
        cols["peer"] = (_raises(RuntimeError(f"peer hook raised {type(exc).__name__}: {exc}"[:500])), ins, "experts")
    return cols


# --------------------------------------------------------------------------- one row
def measure_row(spec, cfg, w, peer, ctx: dict) -> dict:
    """One (preset, T, routing) row: every column checked, then timed; the floor, the prediction
    and the ratios. ``ctx``: ceil, timer, reps, smoke, profile, device_name."""
    import numpy as np

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.peer import checked_time, routed_reference, routings
    from megamoe.numerics import reference_on_tokens

    name, T, routing = spec
    ni = SMOKE_INPUTS if ctx["smoke"] else kb.inputs_per_graph(T)
    ins = routings(make_inputs(cfg, T, ni, ctx["smoke"]), w, cfg)
    x0, tw0, ti0 = ins[0]
    counts = np.bincount(ti0.reshape(-1).cpu().numpy().astype(np.int64), minlength=cfg.num_experts)
    touched = int((counts > 0).sum())
    flops, byt = kb.floor_terms(cfg, T, touched, "bf16")
    ceil = ctx["ceil"]
    floor_us = max(flops / ceil["matmul_flops_per_s"], byt / ceil["read_bytes_per_s"]) * 1e6
    rows = np.sort(np.random.default_rng(T).choice(T, size=min(SAMPLE, T), replace=False))
    refs = {"experts": routed_reference(x0, ti0, tw0, w.gate_up, w.down, cfg, rows),
            "layer": reference_on_tokens(x0[rows], w, cfg)[0]}
    dtype = str(x0.dtype).replace("torch.", "")
    auto = kmoe.resolve_backend("auto", cfg, T, x0.dtype, x0.device)
    row = {"preset": name, "T": T, "routing": routing, "experts_touched": touched, "flops": flops, "bytes": byt,
           "floor_us": floor_us, "auto": auto, "calls_per_graph": ni, "reps": ctx["reps"], "dtype": dtype,
           "sampled_tokens": len(rows)}
    configs = {}
    for key, (fn, inputs, ref) in columns(cfg, w, ins, T, auto, peer, row).items():
        got = checked_time(key, fn, inputs, refs[ref], rows, dtype, ctx["reps"], ctx["timer"])
        if key.startswith("cfg:"):
            configs[key[4:]] = {k[len(key) + 1:]: v for k, v in got.items()}
        else:
            row.update(got)
    if configs:
        row["peer_configs"] = configs
    row.update(predicted(cfg, counts, T, auto, ni, ctx))
    return derive(row)


def predicted(cfg, counts, T: int, backend: str, ni: int, ctx: dict) -> dict:
    """The cost model's price of the layer on ``backend`` (``megamoe.predict.predict_config``)."""
    from megamoe.predict import predict_config

    try:
        pr = predict_config(cfg, counts, T, backend, ctx["profile"], device_name=ctx["device_name"],
                            calls_per_graph=ni, reps=ctx["reps"])
        return {"predicted_us": pr["predicted_us"], "predicted_dominant": pr.get("dominant")}
    except Exception as exc:  # noqa: BLE001 - the measurement is still worth having
        return {"predicted_error": f"{type(exc).__name__}: {exc}"[:400]}


def derive(row: dict) -> dict:
    """The row's ratios: best megamoe (of its routed-experts backends), best peer (as shipped or
    any Hopper config; the inline peer where the file has no hooks), and the checks' summary."""
    ours = {b: row[f"{b}_us"] for b in ("multi", "megakernel") if f"{b}_us" in row}
    cfgs = {k: v["us"] for k, v in row.get("peer_configs", {}).items() if "us" in v}
    if cfgs:
        row["peer_hopper_label"] = min(cfgs, key=cfgs.get)
        row["peer_hopper_us"] = cfgs[row["peer_hopper_label"]]
    peers = [row[k] for k in ("peer_us", "peer_hopper_us") if k in row] or (
        [row["peer_inline_us"]] if "peer_inline_us" in row else [])
    if ours:
        row["best_backend"] = min(ours, key=ours.get)
        row["best_us"] = ours[row["best_backend"]]
        row["best_over_floor"] = row["best_us"] / row["floor_us"]
        row["auto_us"] = ours.get(row["auto"])
    if ours and peers:
        row["peer_best_us"] = min(peers)
        row["peer_over_best"] = row["peer_best_us"] / row["best_us"]
    if "predicted_us" in row and "layer_us" in row:
        row["predicted_over_layer"] = row["predicted_us"] / row["layer_us"]
    errs = [v for k, v in row.items() if k.endswith("_err_max")]
    errs += [v["err_max"] for v in row.get("peer_configs", {}).values() if "err_max" in v]
    row["err_max"] = max(errs, default=None)
    bad = [k[:-3] for k, v in row.items() if k.endswith("_ok") and not v]
    bad += [f"peer {k}" for k, v in row.get("peer_configs", {}).items() if v.get("ok") is False or "error" in v]
    failed = [k[:-6] for k in row if k.endswith("_error") and k != "predicted_error"]
    row["all_ok"] = not bad and not failed
    row["failed"] = sorted(set(bad + failed))
    return row


# --------------------------------------------------------------------------- the table
def _us(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}")


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"


HEADER = ["preset", "T", "routing", "floor us", "multi us", "megakernel us", "auto", "layer us (auto, router)",
          "predicted us", "peer us (as shipped)", "peer us (all in graph)", "peer us (best Hopper config)",
          "best peer / best megamoe", "best / floor", "max err", "checks"]


def table_row(r: dict) -> list[str]:
    hop = r.get("peer_hopper_us")
    return [r["preset"], str(r["T"]), r["routing"], _us(r["floor_us"]), _us(r.get("multi_us")),
            _us(r.get("megakernel_us")), r["auto"], _us(r.get("layer_us")), _us(r.get("predicted_us")),
            _us(r.get("peer_us")), _us(r.get("peer_inline_us")),
            "-" if hop is None else f"{_us(hop)} ({r['peer_hopper_label']})",
            _x(r.get("peer_over_best")), _x(r.get("best_over_floor")),
            "-" if r.get("err_max") is None else f"{r['err_max']:.1e}",
            "ok" if r["all_ok"] else "FAILED: " + ", ".join(r["failed"])]


def summary(rows: list[dict]) -> list[str]:
    """The geometric mean of best peer / best megamoe, the rows where the peer is faster, T = 1
    best / floor per preset against the decode target, and the model's error on the layer."""
    out = []
    ratios = [(r["peer_over_best"], r) for r in rows if r.get("peer_over_best")]
    if ratios:
        g = math.exp(statistics.fmean(math.log(v) for v, _ in ratios))
        slower = [f"{r['preset']} T={r['T']} {r['routing']} ({v:.2f})" for v, r in ratios if v < 1]
        out.append(f"Geomean best peer / best megamoe: {g:.2f} over {len(ratios)} rows (min "
                   f"{min(v for v, _ in ratios):.2f}); megamoe slower in {len(slower)}"
                   + (f": {', '.join(slower)}." if slower else "."))
    for r in rows:
        if r["T"] == 1 and r["routing"] == "uniform" and r.get("best_us"):
            limit = FLOOR_FACTOR * r["floor_us"] + FLOOR_SLACK_US
            out.append(f"T = 1 {r['preset']}: best {r['best_us']:.1f} us = {r['best_over_floor']:.2f} x floor "
                       f"(target <= {FLOOR_FACTOR} x floor + {FLOOR_SLACK_US:g} us = {limit:.1f}: "
                       f"{'met' if r['best_us'] <= limit else 'not met'}).")
    errs = [abs(r["predicted_over_layer"] - 1) * 100 for r in rows if r.get("predicted_over_layer")]
    if errs:
        out.append(f"The cost model on the whole layer (auto's backend): median |error| {statistics.median(errs):.1f}%, "
                   f"max {max(errs):.1f}% over {len(errs)} rows.")
    bad = [f"{r['preset']} T={r['T']} {r['routing']}: {', '.join(r['failed'])}" for r in rows if not r["all_ok"]]
    if bad:
        out.append("Failed or wrong columns (not timed): " + "; ".join(bad) + ".")
    return out


def markdown(rows: list[dict], prov: dict, ceil: dict, profile: str, peer_file: str) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    head = (f"{prov['gpu']}, torch {prov['torch']}, triton {prov['triton']}, commit {str(prov['commit'])[:12]}"
            f"{' (dirty)' if prov.get('dirty') else ''}, {prov['date']}. Ceilings in the same run: read "
            f"{ceil['read_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceil['matmul_flops_per_s'] / 1e12:.0f} "
            f"TFLOP/s. Peer: {peer_file}. Predictions: profile {profile}, the layer on auto's backend. Routed "
            f"experts with routing given (the same tensors for every column) but the layer column (router "
            f"included); CUDA-graph replays, median. Peer as shipped: its own config for this GPU, its "
            f"preparation (vLLM's alignment) before the graph; all in graph: its fused_experts, preparation "
            f"included; best Hopper config: the fastest of the configs it ships for Hopper GPUs. Best peer: the "
            f"faster of as shipped and best Hopper config; best megamoe: the faster routed-experts backend.")
    return "\n".join([head, "", *lines, "", *summary(rows), ""])


# --------------------------------------------------------------------------- compile ahead
def warm_job(name: str, T: int, peer_file: str, smoke: bool = False) -> str:
    """Run every column of (name, T), both routings where the table has them, once (in a process of its own)."""
    import torch

    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.peer import load_peer_module, routings

    try:
        peer = load_peer_module(peer_file)
        cfg = layer_config(name, smoke)
        for ww in make_weights(cfg, smoke)[: 2 if T in CONCENTRATED_T else 1]:
            ins = routings(make_inputs(cfg, T, 1, smoke), ww, cfg)
            x = ins[0][0]
            auto = kmoe.resolve_backend("auto", cfg, T, x.dtype, x.device)
            for fn, inputs, _ in columns(cfg, ww, ins, T, auto, peer).values():
                fn(inputs[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return f"{name} T={T}"
    except Exception as exc:  # noqa: BLE001 - the measuring process meets it again and records it
        return f"{name} T={T} {type(exc).__name__}: {str(exc)[:200]}"


#: of the GPU's memory, the share the compile-ahead's processes may fill with weights
WARM_MEMORY_SHARE = 0.6


def warm(specs, peer_file: str, timeout_s: float, log=print, smoke: bool = False, processes: int = 14) -> None:
    """``warm_job`` for each (preset, T) of the rows in a spawn pool (megakernel_variants.warm: at
    once as many as WARM_MEMORY_SHARE of the GPU's memory holds, by the weights of each job's preset)."""
    import torch
    from megakernel_variants import warm as warm_pool
    from megakernel_variants import weight_gib

    jobs = list(dict.fromkeys((p, T, peer_file, smoke) for p, T, _ in specs))
    gpu_gib = math.inf if smoke else WARM_MEMORY_SHARE * torch.cuda.mem_get_info()[1] / 2**30
    warm_pool(jobs, timeout_s, processes, log, gpu_gib, job_fn=warm_job, gib_of=lambda j: weight_gib(j[0]))


# --------------------------------------------------------------------------- the run
def context(args, t0: float) -> dict:
    """ceil, timer, reps, smoke, profile, device_name and the rows' provenance of this run."""
    import datetime as _dt

    import torch
    import triton

    from megamoe.kernels import bench as kb
    from megamoe.kernels.peer import wall_time_us
    from megamoe.simulator import ProfileError, load_profile

    if args.smoke:
        prov = {"gpu": "cpu-interpreter", "torch": torch.__version__, "triton": triton.__version__,
                **kb.git_state(), "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    else:
        prov = kb.provenance()
    names = [args.profile] if args.profile else [
        *(m.group(0).lower() for m in re.finditer(r"\b[A-Z]{1,2}\d{2,4}\b", prov["gpu"])), "h200"]
    profile = None
    for n in names:
        try:
            profile = load_profile(n)
            break
        except ProfileError as exc:
            if args.profile:
                raise SystemExit(f"peer_table.py: --profile {args.profile!r}: {exc}") from None
    return {"prov": prov, "smoke": args.smoke, "reps": args.reps, "profile": profile,
            "timer": wall_time_us if args.smoke else kb.graph_time_us,
            "device_name": "cpu-interpreter" if args.smoke else prov["gpu"], "t0": t0}


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels.peer import PeerError, load_peer_module

    try:
        peer = load_peer_module(args.peer)
    except PeerError as exc:
        print(f"peer_table.py: error: {exc}", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("peer_table.py: needs a CUDA GPU (or --smoke for the CPU path)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, md_path = out / "peer.jsonl", out / "peer_table.md"
    ctx = context(args, t0)
    print(f"# {ctx['prov']}", flush=True)
    specs = plan_rows(args.preset_list, args.token_list)
    if args.warm and not args.smoke:
        warm(specs, args.peer, WARM_SHARE * args.budget_s, log=lambda m: print(m, flush=True))
    ctx["ceil"] = SMOKE_CEILINGS if args.smoke else kb.measure_ceilings()
    ceil = ctx["ceil"]
    print(f"# ceilings: read {ceil['read_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
          f"{ceil['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s; profile {ctx['profile'].name}; {len(specs)} rows "
          f"({time.time() - t0:.0f} s)", flush=True)
    last = {p: i for i, (p, _, _) in enumerate(specs)}
    held, done = {}, []
    for i, spec in enumerate(specs):
        name, T, routing = spec
        if time.time() - t0 > args.budget_s:
            print(f"# budget spent ({args.budget_s:.0f} s): skipping {name} T={T} {routing}", flush=True)
            continue
        print(f"# [{i + 1}/{len(specs)}] {name} T={T} {routing} ({time.time() - t0:.0f} s)", flush=True)
        try:
            if name not in held:
                cfg = layer_config(name, args.smoke)
                held[name] = (cfg, *make_weights(cfg, args.smoke))
            cfg, w, wz = held[name]
            row = measure_row(spec, cfg, w if routing == "uniform" else wz, peer, ctx)
        except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            row = derive({"preset": name, "T": T, "routing": routing, "floor_us": None, "auto": "-",
                          "row_error": f"{type(exc).__name__}: {exc}"[:600]})
        row.update({**ctx["prov"], "peer_file": Path(args.peer).name, "profile": ctx["profile"].name,
                    **{f"ceiling_{k}": v for k, v in ceil.items()}})
        with rows_path.open("a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        done.append(row)
        print("  " + " | ".join(table_row(row)), flush=True)
        md_path.write_text(markdown(done, ctx["prov"], ceil, ctx["profile"].name, Path(args.peer).name))
        if last[name] == i:
            held.pop(name, None)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    print(md_path.read_text() if done else "# no rows", flush=True)
    print(f"# {len(done)} rows in {rows_path}, {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
