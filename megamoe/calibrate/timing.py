"""Timing of the calibration microbenchmarks: CUDA-graph replays, CUDA events, a cold L2."""

from __future__ import annotations

import statistics


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


def event_seconds(fn, *, reps: int = 5, before=None) -> float:
    """Median seconds of fn() between two CUDA events over ``reps`` runs after one warm-up;
    ``before()`` (if given) is queued ahead of each start event."""
    import torch

    fn()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        if before is not None:
            before()
        st.record()
        fn()
        en.record()
        en.synchronize()
        ts.append(st.elapsed_time(en) * 1e-3)
    return statistics.median(ts)


def flushed_seconds(fn, *, reps: int = 5, flush_bytes: int = 256 << 20) -> float:
    """Median seconds of one fn() with nothing of its data in L2: per repetition the GPU sleeps
    (~1 ms) while the host queues an L2-evicting read of ``flush_bytes``, the events and fn, so the
    events time fn alone from a cold L2."""
    import torch

    scratch = torch.ones(flush_bytes // 4, device="cuda", dtype=torch.int32)
    sink = torch.empty((), device="cuda", dtype=torch.int32)
    sleep = getattr(torch.cuda, "_sleep", None)

    def flush():
        if sleep is not None:
            sleep(2_000_000)
        torch.amax(scratch, dim=0, out=sink)

    return event_seconds(fn, reps=reps, before=flush)


def slope(xs, ts) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ts over xs."""
    n = len(xs)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx
    return mt - b * mx, b
