"""The calibration step ``sustained``: a dense GEMM's rate by how long it has run from idle clocks,
and at a duty (matmuls a share of the time).
"""

from __future__ import annotations

import time

from .timing import graph_seconds

#: the sustained step's busy durations (s): graphs of back-to-back matmuls about this long
SUSTAINED_BUSY_S = (0.005, 0.02, 0.06, 0.15, 0.3)
SUSTAINED_BUSY_S_QUICK = (0.02, 0.06, 0.3)
#: seconds idle before each replay (the clocks recover; the full step checks it: ``recovery``)
SUSTAINED_PAUSE_S = 1.5
#: rows = columns = depth of the sustained step's matmuls (the mma step's dense GEMM)
SUSTAINED_SIZE = 8192


#: the duty-cycled graphs (full form only): (share of the graph's time in matmuls, seconds), each
#: matmul followed by HBM reads for the rest
SUSTAINED_DUTY = ((0.5, 0.3), (0.75, 0.3))
#: elements (bf16) of the buffer the duty graphs' reads sum (512 MiB)
SUSTAINED_READ_ELEMS = 1 << 28


def matmul_graph(a, b, c, count: int, between=None):
    """A CUDA graph of ``count`` back-to-back ``torch.matmul(a, b, out=c)`` (cuBLAS), each followed
    by ``between()`` where given, its workspace made by one eager call on the capture's stream first."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.matmul(a, b, out=c)
        if between is not None:
            between()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(count):
            torch.matmul(a, b, out=c)
            if between is not None:
                between()
    return g


def idle_replay_seconds(replay, pause_s: float, clock: dict | None = None) -> float:
    """Seconds of one ``replay()`` between CUDA events after ``pause_s`` idle; ``clock`` (a dict)
    gets the SM clock and power sampled meanwhile (empty without NVML)."""
    import torch

    from megamoe.kernels.telemetry import sampled

    torch.cuda.synchronize()
    time.sleep(pause_s)
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with sampled(clock):
        st.record()
        replay()
        en.record()
        en.synchronize()
    return st.elapsed_time(en) * 1e-3


def sm_clock_mhz() -> int | None:
    """The SM clock NVML reports now (torch.cuda.clock_rate, MHz), or None where NVML is missing."""
    import torch

    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001 - pynvml missing or refused: the rates stand alone
        return None


def sustained_counts(per_matmul_s: float, busy_s) -> list[int]:
    """Matmuls per graph for each busy duration of ``busy_s`` at ``per_matmul_s`` a matmul (at least
    one; durations that round to the same count give one graph)."""
    return sorted({max(1, round(d / per_matmul_s)) for d in busy_s})


def sustained_fit(flops: float, timed, recheck=None) -> dict:
    """Figures from ``timed`` ([[matmuls N, s, SM clock], ...], N ascending; ``flops`` per matmul):
    "rates" [[N, s, flop/s]], "reference_flops_per_s" (best average rate), "points" [[s, rate /
    reference]], "marginal" [[s short, s long, flop/s of the extra matmuls]]; with ``recheck``
    (the shortest graph again), "recovery" = first s / recheck s."""
    rates = [[int(n), float(t), n * flops / t] for n, t, *_ in timed]
    ref = max(r for *_, r in rates)
    out = {"rates": rates, "reference_flops_per_s": ref, "points": [[t, r / ref] for _, t, r in rates],
           "marginal": [[t0, t1, (n1 - n0) * flops / (t1 - t0)]
                        for (n0, t0, _), (n1, t1, _) in zip(rates, rates[1:]) if t1 > t0],
           "sm_clock_mhz_after": [x[2] if len(x) > 2 else None for x in timed]}
    if recheck is not None:
        out["recheck"] = list(recheck)
        out["recovery"] = rates[0][1] / float(recheck[1])
    return out


def measure_sustained(reps: int, quick: bool = False) -> dict:
    """A dense bf16 GEMM's rate by how long it has run: per SUSTAINED_BUSY_S duration a graph of N
    SUSTAINED_SIZE^3 matmuls replayed once after SUSTAINED_PAUSE_S idle, shortest first (full form:
    the shortest again last) -> ``sustained_fit``. ``reps`` is unused."""
    import torch

    n = SUSTAINED_SIZE
    a, b = (torch.randn((n, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    per = graph_seconds(lambda i: torch.matmul(a, b, out=c), inner=2, reps=3)
    counts = sustained_counts(per, SUSTAINED_BUSY_S_QUICK if quick else SUSTAINED_BUSY_S)
    timed, clocks = [], []
    for count in counts + ([] if quick else [counts[0]]):
        g = matmul_graph(a, b, c, count)
        clk: dict = {}
        t = idle_replay_seconds(g.replay, SUSTAINED_PAUSE_S, clk)
        timed.append([count, t, sm_clock_mhz()])
        clocks.append(clk.get("sm_clock_mhz", {}).get("mean"))
        del g
    out = sustained_fit(2.0 * n ** 3, timed[:len(counts)], None if quick else timed[-1])
    out.update(size=n, pause_s=SUSTAINED_PAUSE_S, per_matmul_s=per, sm_clock_mhz_mean=clocks[:len(counts)])
    if not quick:
        out["duty"] = measure_duty(a, b, c, per, out["reference_flops_per_s"])
    return out


def duty_fit(flops: float, per_read_s: float, timed, reference_flops_per_s: float) -> list[dict]:
    """Per duty graph of ``timed`` ([[duty, N, reads per matmul k, s, mean SM MHz or None], ...]):
    its seconds, the matmuls' share and their rate (time less N x k x ``per_read_s``) over
    ``reference_flops_per_s``."""
    out = []
    for duty, count, k, t, mhz in timed:
        mm_s = max(t - count * k * per_read_s, 1e-9)
        out.append({"duty": float(duty), "seconds": float(t), "matmuls": int(count), "reads_per_matmul": int(k),
                    "matmul_share": mm_s / t, "rate_ratio": count * flops / mm_s / reference_flops_per_s,
                    "sm_clock_mhz_mean": mhz})
    return out


def duty_points(su: dict) -> list[list[float]]:
    """kernel_model.sustained_duty points from ``su``: per duty graph [matmul share, (1 - rate ratio)
    / (1 - back-to-back ratio over as many seconds)] clipped to [0, 1]; graphs with under 1%
    back-to-back fall or a share not inside (0, 1) are left out."""
    from megamoe.simulator.cost import sustained_table_ratio

    pts = tuple(tuple(float(x) for x in q) for q in sorted(su.get("points") or []))
    if not pts:
        return []
    out = []
    for d in su.get("duty", []):
        t, share = float(d["seconds"]), float(d["matmul_share"])
        if not (t > 0 and 0.0 < share < 1.0):
            continue
        full = sustained_table_ratio(pts, t)
        if 1.0 - full < 0.01:
            continue
        out.append([share, min(max((1.0 - min(float(d["rate_ratio"]), 1.0)) / (1.0 - full), 0.0), 1.0)])
    return sorted(out)


def measure_duty(a, b, c, per_matmul_s: float, reference_flops_per_s: float) -> list[dict]:
    """SUSTAINED_DUTY's graphs: matmuls each followed by sums of a SUSTAINED_READ_ELEMS buffer for
    (1 - duty) / duty of a matmul's time, one replay after SUSTAINED_PAUSE_S idle -> ``duty_fit``."""
    import torch

    buf = torch.randn(SUSTAINED_READ_ELEMS, device="cuda", dtype=torch.bfloat16)
    acc = torch.empty((), device="cuda", dtype=torch.float32)
    per_read = graph_seconds(lambda i: torch.sum(buf, dim=0, dtype=torch.float32, out=acc), inner=4, reps=3)
    timed = []
    for duty, busy in SUSTAINED_DUTY:
        k = max(1, round(per_matmul_s * (1.0 - duty) / duty / per_read))

        def reads(k=k):
            for _ in range(k):
                torch.sum(buf, dim=0, dtype=torch.float32, out=acc)

        count = max(1, round(busy / (per_matmul_s + k * per_read)))
        g = matmul_graph(a, b, c, count, between=reads)
        clk: dict = {}
        t = idle_replay_seconds(g.replay, SUSTAINED_PAUSE_S, clk)
        timed.append([duty, count, k, t, clk.get("sm_clock_mhz", {}).get("mean")])
        del g
    return duty_fit(2.0 * a.shape[0] * a.shape[1] * b.shape[1], per_read, timed, reference_flops_per_s)
