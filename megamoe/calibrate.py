"""``megamoe calibrate --out DIR``: measure the cost model's numbers with microbenchmarks (GPU only).

Shape legend: P programs, S SMs, R rounds, N rows, H row width.

Runs the kernels of ``megamoe.kernels.microbench`` (never the MoE kernels) and writes
``DIR/profile.json``: the base profile (``--base``, default ``h200``) with every measured number
replaced and a ``kernel_model`` section holding the curves (``simulator/cost.py`` reads them), each
with its unit and the source "measured by megamoe calibrate on <gpu> <date>", and
``DIR/microbench.json`` with the raw measurements. ``--system DIR/profile.json`` (simulate) and
``--profile DIR/profile.json`` (validate) use it. Timings are CUDA-graph replays (medians of a few
replays) or CUDA events around one long launch; the whole run takes about a minute on an H200.

Measured:
    launch gap, graph cost    graphs of 1, 16, 64 empty kernels: replay time = fixed + N x gap
    hbm_read                  P in {1 .. 8S} programs x {16 KiB .. 4 MiB} each, fresh data per launch
    l2 bandwidth              8S programs re-reading 16 MiB (L2-resident)
    mma                       tile shapes (BM 16/64/128, BN, warps) x depth, L2-resident operands,
                              8S programs; occupancy from the compiled kernels' registers and
                              shared memory
    flag handoff              a token passed R times round-robin over P programs (slope in R)
    grid barrier              R barriers of P programs (slope in R)
    ticket                    one program taking N tickets (slope in N): the atomic round trip
    sm_copy                   gather of N rows of H = 7168 bf16 by 1 .. S copying SMs
    serial steps              one program: R dependent load+dot steps; R dependent top-1 passes
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for profile.json and microbench.json")
    parser.add_argument("--base", default="h200", help="profile whose non-measured fields are kept (default h200)")
    parser.add_argument("--reps", type=int, default=5, help="graph replays per timing (median)")
    parser.add_argument("--quick", action="store_true", help="fewer points (a smoke test of the run)")


# --------------------------------------------------------------------------- timing helpers
def graph_seconds(fn, *, inner: int = 4, reps: int = 5) -> float:
    """Median seconds of ONE replay of a CUDA graph holding fn(0), ..., fn(inner - 1), divided by inner."""
    import torch

    for i in range(min(inner, 2)):
        fn(i)  # compile, warm
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(inner):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        st.record()
        g.replay()
        en.record()
        en.synchronize()
        ts.append(st.elapsed_time(en) * 1e-3 / inner)
    del g
    return statistics.median(ts)


def event_seconds(fn, *, reps: int = 5) -> float:
    """Median seconds of fn() between CUDA events (for single long launches that reset themselves)."""
    import torch

    fn()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        st.record()
        fn()
        en.record()
        en.synchronize()
        ts.append(st.elapsed_time(en) * 1e-3)
    return statistics.median(ts)


def _slope(xs, ts) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ts over xs."""
    n = len(xs)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx
    return mt - b * mx, b


# --------------------------------------------------------------------------- measurements
def measure_launch(reps: int) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    x = torch.zeros(1, device="cuda")
    ns = [1, 16, 64]
    ts = [graph_seconds(lambda i, n=n: [mb.empty(x) for _ in range(n)], inner=1, reps=max(reps, 9)) for n in ns]
    a, b = _slope(ns, ts)
    return {"graph_fixed_s": max(a, 0.0), "launch_gap_s": b, "points": list(zip(ns, ts))}


def measure_sync(reps: int, S: int, quick: bool = False) -> dict:
    """Flag handoff, grid barrier and ticket costs (also what ``benchmarks/bench_sync.py`` prints)."""
    from megamoe.kernels import microbench as mb

    out = {"handoff": [], "barrier": [], "ticket": []}
    rounds = (256, 2048)
    for P in ((S,) if quick else (S, 4 * S)):
        ts = [event_seconds(lambda r=r, P=P: mb.handoff(r, P, "cuda"), reps=reps) for r in rounds]
        out["handoff"].append({"programs": P, "s_per_handoff": _slope(rounds, ts)[1], "points": list(zip(rounds, ts))})
    rounds = (16, 128)
    for P in ((S,) if quick else (S, 2 * S)):
        ts = [event_seconds(lambda r=r, P=P: mb.barrier(r, P, "cuda"), reps=reps) for r in rounds]
        out["barrier"].append({"programs": P, "s_per_barrier": _slope(rounds, ts)[1], "points": list(zip(rounds, ts))})
    nt = (1000, 8000)
    for P in (1, S):
        ts = [event_seconds(lambda n=n, P=P: mb.tickets(n, P, "cuda"), reps=reps) for n in nt]
        out["ticket"].append({"programs": P, "s_per_ticket": _slope(nt, ts)[1], "points": list(zip(nt, ts))})
    out["flag_handoff_s"] = statistics.median(h["s_per_handoff"] for h in out["handoff"])
    out["grid_barrier_s"] = out["barrier"][0]["s_per_barrier"]
    out["ticket_s"] = out["ticket"][0]["s_per_ticket"]  # one program's atomic round trip per ticket
    return out


def measure_hbm(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    progs = [1, 16, S, 4 * S] if quick else [1, 4, 16, S // 4, S // 2, S, 2 * S, 4 * S, 8 * S]
    sizes = [64 << 10, 1 << 20] if quick else [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    block = 1024  # bf16 values per load: 2 KiB
    total_max = max(progs) * max(sizes)
    span = 2 * total_max + (256 << 20)
    x = torch.ones(span // 2, device="cuda", dtype=torch.bfloat16)
    pts = []
    for P in progs:
        for b in sizes:
            elems = b // 2
            total = P * elems
            step = max(total, (128 << 20) // 2)  # fresh data each launch: past L2

            def run(i, P=P, elems=elems, total=total, step=step):
                off = (i * step) % max(x.numel() - total, 1)
                mb.stream_read(x, P, elems, block=block, offset=off - off % block)

            t = max(graph_seconds(run, inner=4, reps=reps) - gap_s, 1e-7)
            pts.append([P, b, P * b / t])
    # L2: 8S programs re-reading the same 16 MiB
    P, elems = 8 * S, (16 << 20) // (8 * S) // 2 // block * block
    t = max(graph_seconds(lambda i: mb.stream_read(x, P, elems, block=block, offset=0), inner=8, reps=reps) - gap_s, 1e-7)
    return {"points": pts, "l2_bytes_per_s": P * elems * 2 / t}


MMA_SHAPES = ((16, 64, 4, 128), (16, 128, 4, 128), (32, 64, 4, 128), (64, 64, 4, 64), (64, 128, 4, 64),
              (128, 128, 8, 64), (128, 256, 8, 64))


def _occupancy(kernel, warps: int) -> int | None:
    """Programs per SM from a compiled kernel's registers and shared memory (None if unknown)."""
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(0)
        regs = int(getattr(kernel, "n_regs", 0))
        smem = int(getattr(kernel.metadata, "shared", 0))
        by_regs = 65536 // max(1, regs * 32 * warps) if regs else 32
        by_smem = int(props.get("max_shared_mem", 232448)) // max(1, smem + 1024) if smem else 32
        return max(1, min(by_regs, by_smem, 64 // warps, 32))
    except Exception:  # noqa: BLE001 - the driver API differs between Triton versions
        return None


def measure_mma(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    depths = (1024,) if quick else (256, 1024, 4096)
    shapes = MMA_SHAPES[::3] if quick else MMA_SHAPES
    P = 8 * S
    pts, occ = [], {}
    for bm, bn, w, bk in shapes:
        c = torch.empty((P, bm, bn), device="cuda", dtype=torch.bfloat16)
        for d in depths:
            a = torch.randn((bm, d), device="cuda", dtype=torch.bfloat16)
            b = torch.randn((d, bn), device="cuda", dtype=torch.bfloat16)
            _, k = mb.mma(a, b, P, block_k=bk, num_warps=w, out=c)
            t = max(graph_seconds(lambda i, a=a, b=b, bk=bk, w=w, c=c: mb.mma(a, b, P, block_k=bk, num_warps=w, out=c),
                                  inner=4, reps=reps) - gap_s, 1e-7)
            pts.append([bm, bn, w, d, P * 2.0 * bm * bn * d / t / S])
            o = _occupancy(k, w)
            if o is not None:
                occ.setdefault(w, []).append(o)
    return {"points": pts, "occupancy": {w: int(statistics.median(v)) for w, v in occ.items()}}


def measure_copy(reps: int, S: int, quick: bool = False) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    H, N = 7168, 8192
    src = torch.randn((N, H), device="cuda", dtype=torch.bfloat16)
    idx = torch.randperm(N, device="cuda").to(torch.int32)
    dst = torch.empty_like(src)
    pts = []
    for n in ((1, 16, S) if quick else (1, 2, 4, 8, 16, 32, S // 2, S)):
        t = event_seconds(lambda n=n: mb.gather_copy(src, idx, n, out=dst), reps=reps)
        pts.append([n, N * H * 2 / t / n])
    return {"points": pts, "row_bytes": H * 2}


def measure_serial(reps: int) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    load, red = [], []
    steps = (4, 64)
    for bh, be in ((64, 128), (32, 256)):
        w = torch.randn((max(steps) * bh, be), device="cuda", dtype=torch.bfloat16)
        x = torch.randn((16, max(steps) * bh), device="cuda", dtype=torch.bfloat16)
        xs = {s: x[:, :s * bh].contiguous() for s in steps}  # (16, s*BH): the kernel's row stride
        ts = [graph_seconds(lambda i, s=s, xs=xs, w=w, bh=bh: mb.serial_load(xs[s], w[:s * bh], s, block_h=bh), inner=4, reps=reps)
              for s in steps]
        load.append(_slope(steps, ts)[1])
        v = torch.randn((16, be), device="cuda", dtype=torch.float32)
        ts = [graph_seconds(lambda i, s=s, v=v: mb.serial_reduce(v, s), inner=4, reps=reps) for s in steps]
        red.append(_slope(steps, ts)[1])
    return {"serial_load_step_s": statistics.median(load), "serial_reduce_step_s": statistics.median(red),
            "load": load, "reduce": red}


# --------------------------------------------------------------------------- the profile
def build_profile(base: dict, m: dict, prov: dict) -> dict:
    """The calibrated profile: ``base`` (profile JSON) with the measured numbers of ``m``."""
    import copy

    src = f"measured by megamoe calibrate on {prov['gpu']} {prov['date']}"
    d = copy.deepcopy(base)

    def num(v, unit):
        return {"value": float(v), "unit": unit, "source": src}

    def table(unit, over, pts, note=None):
        t = {"unit": unit, "over": over, "points": [[float(x) for x in p] for p in pts], "source": src}
        if note:
            t["note"] = note
        return t

    read_peak = max(p[2] for p in m["hbm"]["points"])
    d["name"] = f"{base['name']}-calibrated"
    d["description"] = f"{base['description']}; single-GPU numbers measured by megamoe calibrate ({prov['date']})"
    d["gpu"]["num_sms"] = {"value": prov["num_sms"], "unit": "count", "source": src}
    d["gpu"]["kernel_launch_s"] = num(m["launch"]["launch_gap_s"], "s")
    d["gpu"]["grid_sync_s"] = num(m["sync"]["grid_barrier_s"], "s")
    if prov.get("l2_bytes"):
        d["gpu"]["l2_bytes"] = num(prov["l2_bytes"], "bytes")
    d["hbm"]["bandwidth_bytes_per_s"] = num(read_peak, "bytes/s")
    d["hbm"]["efficiency"] = {"value": 1.0, "unit": "fraction", "source": src + " (the measured rate is the achievable one)"}
    copy_pts = m["copy"]["points"]
    near16 = min(copy_pts, key=lambda p: abs(p[0] - 16))
    d["sm"]["copy_bytes_per_s"] = num(near16[1], "bytes/s")
    occ = m["mma"]["occupancy"] or {4: 2, 8: 1}
    d["kernel_model"] = {
        "launch_gap_s": num(m["launch"]["launch_gap_s"], "s"),
        "graph_fixed_s": num(m["launch"]["graph_fixed_s"], "s"),
        "flag_handoff_s": num(m["sync"]["flag_handoff_s"], "s"),
        "grid_barrier_s": num(m["sync"]["grid_barrier_s"], "s"),
        "ticket_s": num(max(m["sync"]["ticket_s"], 0.0), "s"),
        "serial_load_step_s": num(max(m["serial"]["serial_load_step_s"], 0.0), "s"),
        "serial_reduce_step_s": num(max(m["serial"]["serial_reduce_step_s"], 0.0), "s"),
        "l2_bandwidth_bytes_per_s": num(m["hbm"]["l2_bytes_per_s"], "bytes/s"),
        "hbm_read": table("bytes/s", ["programs_in_flight", "bytes_per_program"], m["hbm"]["points"]),
        "mma": table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], m["mma"]["points"],
                     "bf16, L2-resident operands, 8 programs per SM launched"),
        "occupancy": table("programs per SM", ["num_warps"], sorted([w, o] for w, o in occ.items()),
                           "from the mma microbench kernels' registers and shared memory"),
        "sm_copy": table("bytes/s per SM", ["copying_sms"], copy_pts, "gather of 7168-wide bf16 rows"),
    }
    d["calibration"] = prov
    return d


def provenance() -> dict:
    import subprocess

    import torch
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent.parent, timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        commit = "unknown"
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit, "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
            "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "num_sms": int(props.multi_processor_count), "l2_bytes": int(getattr(props, "L2_cache_size", 0))}


def summary(m: dict, prof: dict) -> str:
    km = prof["kernel_model"]
    mma = m["mma"]["points"]
    best = {}
    for bm, bn, w, _d, r in mma:
        best[(bm, bn, w)] = max(best.get((bm, bn, w), 0.0), r)
    lines = ["what                                 figure",
             f"launch gap in a CUDA graph           {km['launch_gap_s']['value'] * 1e6:8.2f} us",
             f"graph replay fixed cost              {km['graph_fixed_s']['value'] * 1e6:8.2f} us",
             f"streaming read, best                 {prof['hbm']['bandwidth_bytes_per_s']['value'] / 1e12:8.2f} TB/s",
             f"L2 re-read                           {km['l2_bandwidth_bytes_per_s']['value'] / 1e12:8.2f} TB/s",
             f"flag handoff                         {km['flag_handoff_s']['value'] * 1e6:8.2f} us",
             f"grid barrier                         {km['grid_barrier_s']['value'] * 1e6:8.2f} us",
             f"ticket (one program)                 {km['ticket_s']['value'] * 1e9:8.1f} ns",
             f"serial load+dot step                 {km['serial_load_step_s']['value'] * 1e9:8.1f} ns",
             f"serial top-1 pass                    {km['serial_reduce_step_s']['value'] * 1e9:8.1f} ns"]
    S = prof["gpu"]["num_sms"]["value"]
    for (bm, bn, w), r in sorted(best.items()):
        lines.append(f"mma {bm:>3}x{bn:<3} {w} warps, whole GPU      {r * S / 1e12:8.1f} TFLOP/s")
    for n, r in m["copy"]["points"]:
        lines.append(f"gather copy, {int(n):>3} SMs, per SM          {r / 1e9:8.1f} GB/s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"megamoe calibrate: needs torch and triton: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("megamoe calibrate: needs a CUDA GPU (the microbenchmarks time the device)", file=sys.stderr)
        return 2
    from megamoe.simulator.hardware import load_profile, validate

    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    S = prov["num_sms"]
    m = {}
    steps = [("launch", lambda: measure_launch(args.reps)),
             ("sync", lambda: measure_sync(args.reps, S, args.quick)),
             ("hbm", lambda: measure_hbm(args.reps, S, m["launch"]["launch_gap_s"], args.quick)),
             ("mma", lambda: measure_mma(args.reps, S, m["launch"]["launch_gap_s"], args.quick)),
             ("copy", lambda: measure_copy(args.reps, S, args.quick)),
             ("serial", lambda: measure_serial(args.reps))]
    for name, fn in steps:
        t = time.perf_counter()
        m[name] = fn()
        print(f"calibrate: {name} done in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    prov["wall_s"] = round(time.perf_counter() - t0, 1)
    base = load_profile(args.base).to_dict()
    prof = build_profile(base, m, prov)
    validate(prof, origin="calibrated profile")  # the loader must accept what we write
    (out / "microbench.json").write_text(json.dumps({"provenance": prov, "measurements": m}, indent=1, default=str))
    (out / "profile.json").write_text(json.dumps(prof, indent=1))
    print(summary(m, prof))
    print(f"wrote {out / 'profile.json'} and {out / 'microbench.json'} ({prov['wall_s']} s)")
    return 0
