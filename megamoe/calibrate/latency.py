"""Calibration steps that measure latencies: the launch gap, flag handoff / grid barrier / ticket,
one program's serial steps, and the routing program's selection.
"""

from __future__ import annotations

import statistics

from .timing import event_seconds, graph_seconds, slope

#: empty kernels per graph in the launch step
LAUNCH_GRAPH_SIZES = (1, 8, 16, 64)
#: rounds over LAUNCH_GRAPH_SIZES, each size's median taken
LAUNCH_ROUNDS = 3
#: seconds of matrix products before the launch step, so that it starts at working clocks
CLOCK_WARM_S = 0.3


def warm_clocks(seconds: float = CLOCK_WARM_S) -> None:
    """Keep the GPU busy with bf16 matrix products for about ``seconds`` (it leaves its idle clocks)."""
    import time

    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def launch_fit(ns, rounds) -> dict:
    """The launch step's figures from ``rounds`` (each a replay time in seconds per graph size of
    ``ns``): per size the median over the rounds, then graph replay = fixed + N x gap by least squares."""
    ts = [statistics.median(r[i] for r in rounds) for i in range(len(ns))]
    a, b = slope(list(ns), ts)
    return {"graph_fixed_s": max(a, 0.0), "launch_gap_s": b, "points": list(zip(ns, ts)),
            "rounds": [list(r) for r in rounds]}


def measure_launch(reps: int) -> dict:
    """Graphs of 1, 8, 16, 64 empty kernels after the clocks are warmed: ``launch_fit`` of their replays."""
    import torch

    from . import microbench as mb

    x = torch.zeros(1, device="cuda")
    warm_clocks()
    rounds = [[graph_seconds(lambda i, n=n: [mb.empty(x) for _ in range(n)], inner=1, reps=max(reps, 9))
               for n in LAUNCH_GRAPH_SIZES] for _ in range(LAUNCH_ROUNDS)]
    return launch_fit(LAUNCH_GRAPH_SIZES, rounds)


def measure_sync(reps: int, S: int, quick: bool = False) -> dict:
    """Flag handoff, grid barrier and ticket costs (also what ``benchmarks/bench_sync.py`` prints)."""
    from . import microbench as mb

    out = {"handoff": [], "barrier": [], "ticket": []}
    rounds = (256, 2048)
    for P in ((S,) if quick else (S, 4 * S)):
        ts = [event_seconds(lambda r=r, P=P: mb.handoff(r, P, "cuda"), reps=reps) for r in rounds]
        out["handoff"].append({"programs": P, "s_per_handoff": slope(rounds, ts)[1], "points": list(zip(rounds, ts))})
    rounds = (16, 128)
    for P in ((S,) if quick else (S, 2 * S)):
        ts = [event_seconds(lambda r=r, P=P: mb.barrier(r, P, "cuda"), reps=reps) for r in rounds]
        out["barrier"].append({"programs": P, "s_per_barrier": slope(rounds, ts)[1], "points": list(zip(rounds, ts))})
    nt = (1000, 8000)
    for P in (1, S):
        ts = [event_seconds(lambda n=n, P=P: mb.tickets(n, P, "cuda"), reps=reps) for n in nt]
        out["ticket"].append({"programs": P, "s_per_ticket": slope(nt, ts)[1], "points": list(zip(nt, ts))})
    out["flag_handoff_s"] = statistics.median(h["s_per_handoff"] for h in out["handoff"])
    out["grid_barrier_s"] = out["barrier"][0]["s_per_barrier"]
    out["ticket_s"] = out["ticket"][0]["s_per_ticket"]  # one program's atomic round trip per ticket
    return out


#: the serial step's (BLOCK_H, BLOCK_E) shapes: load + dot at BLOCK_H, a top-1 pass over 16 x BLOCK_E
SERIAL_SHAPES = ((64, 128), (32, 256))


def measure_serial(reps: int) -> dict:
    """One program's dependent steps, the slope in R of R steps: the router's load + dot step and a
    top-1 pass over 16 rows, per SERIAL_SHAPES shape; their medians are the profile's scalars."""
    import torch

    from . import microbench as mb

    load, red = [], []
    steps = (4, 64)
    for bh, be in SERIAL_SHAPES:
        w = torch.randn((max(steps) * bh, be), device="cuda", dtype=torch.bfloat16)
        x = torch.randn((16, max(steps) * bh), device="cuda", dtype=torch.bfloat16)
        xs = {s: x[:, :s * bh].contiguous() for s in steps}  # (16, s*BH): the kernel's row stride
        ts = [graph_seconds(lambda i, s=s, xs=xs, w=w, bh=bh: mb.serial_load(xs[s], w[:s * bh], s, block_h=bh), inner=4, reps=reps)
              for s in steps]
        load.append(slope(steps, ts)[1])
        v = torch.randn((16, be), device="cuda", dtype=torch.float32)
        ts = [graph_seconds(lambda i, s=s, v=v: mb.serial_reduce(v, s), inner=4, reps=reps) for s in steps]
        red.append(slope(steps, ts)[1])
    return {"serial_load_step_s": statistics.median(load), "serial_reduce_step_s": statistics.median(red),
            "load": load, "reduce": red, "widths": [be for _, be in SERIAL_SHAPES]}


def serial_width_points(serial: dict) -> list:
    """[[width, s per top-1 pass], ...] from ``measure_serial``'s "reduce" (widths from "widths", else
    SERIAL_SHAPES' order), each width once, passes at or below zero left out; [] where none."""
    red = serial.get("reduce") or []
    widths = serial.get("widths") or [be for _, be in SERIAL_SHAPES][:len(red)]
    pts = {}
    for w, t in zip(widths, red):
        if t > 0:
            pts.setdefault(float(w), []).append(float(t))
    return [[w, statistics.median(ts)] for w, ts in sorted(pts.items())]


#: batch sizes (tokens) whose routing programs the select step times
SELECT_TOKENS = (16, 32, 64)
SELECT_TOKENS_QUICK = (64,)


def select_cases(quick: bool = False) -> list[tuple]:
    """(key, config, tokens) for the select step: each distinct routing program of the presets
    (microbench_route.select_key of a batch of SELECT_TOKENS) once."""
    from megamoe.reference import PRESETS, MoEConfig

    from .microbench_route import select_key

    out, seen = [], set()
    for name in PRESETS:
        cfg = MoEConfig.preset(name)
        for tokens in (SELECT_TOKENS_QUICK if quick else SELECT_TOKENS):
            key = select_key(cfg, tokens)
            if key not in seen:
                seen.add(key)
                out.append((key, cfg, tokens))
    return out


def measure_select(reps: int, quick: bool = False) -> dict:
    """Seconds of one routing program's selection per block of BLOCK_T tokens (slope in R blocks of
    2 and 16, random logits, the family's biases as small random values): "points" [key..., s]."""
    import torch

    from . import microbench_route as mr

    rounds = (2, 16)
    pts = []
    for key, cfg, tokens in select_cases(quick):
        E, bt = cfg.num_experts, mr.select_launch(cfg, tokens)["BLOCK_T"]
        lg = torch.randn((max(rounds) * bt, E), device="cuda", dtype=torch.float32)
        rb = torch.randn(E, device="cuda") * 0.01 if cfg.router_bias else None
        sb = torch.randn(E, device="cuda") * 0.01 if cfg.score_bias else None
        ts = [graph_seconds(lambda i, r=r, lg=lg, cfg=cfg, bt=bt, tokens=tokens, rb=rb, sb=sb:
                            mr.route_select(lg[:r * bt], cfg, tokens, r, rb=rb, sb=sb), inner=4, reps=reps) for r in rounds]
        pts.append([*key, max(slope(rounds, ts)[1], 1e-9)])
    return {"points": pts}
