"""Calibration steps that measure memory rates: HBM streaming reads (plain and deep readers), L2
re-reads and shared reads, and the SMs' gather copy.
"""

from __future__ import annotations

from .timing import event_seconds, flushed_seconds, graph_seconds


def measure_hbm(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Streaming-read rate over (programs, bytes per program), one launch per point from a cold L2
    (``flushed_seconds``): the best of the plain-load and the GEMM-loop reader (3 and 4 stages);
    plus the L2 re-read rate (``measure_l2``)."""
    import torch

    from . import microbench as mb

    progs = [1, 16, S, 4 * S] if quick else [1, 4, 16, S // 4, S // 2, S, 2 * S, 4 * S, 8 * S]
    sizes = [64 << 10, 1 << 20] if quick else [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    stages = (4,) if quick else (3, 4)
    block = 1024  # bf16 values per load: 2 KiB
    x = torch.ones(max(progs) * max(sizes) // 2, device="cuda", dtype=torch.bfloat16)
    t_empty = flushed_seconds(lambda: mb.empty(x), reps=reps)
    pts, best = [], []
    for P in progs:
        for b in sizes:
            elems = b // 2
            ts = {"plain": flushed_seconds(lambda P=P, elems=elems: mb.stream_read(x, P, elems, block=block),
                                           reps=reps)}
            for st in stages:
                ts[f"tile_s{st}"] = flushed_seconds(lambda P=P, b=b, st=st: mb.stream_tile(x, P, b, num_stages=st),
                                                    reps=reps)
            name = min(ts, key=ts.get)
            pts.append([P, b, P * b / max(ts[name] - t_empty, 0.5 * ts[name], 1e-7)])
            best.append({"programs": P, "bytes": b, "best": name, **{k: P * b / v for k, v in ts.items()}})
    return {"points": pts, "readers": best, "launch_overhead_s": t_empty, **measure_l2(reps, S, gap_s, x, stages)}


def measure_l2(reps: int, S: int, gap_s: float, x, stages) -> dict:
    """L2 re-read rate: the better of 8S programs re-reading 16 MiB of ``x`` and 2S programs each
    cycling GEMM-loop loads through its own 128 KiB of a 16 MiB footprint."""
    from . import microbench as mb

    block = 1024
    P, elems = 8 * S, (16 << 20) // (8 * S) // 2 // block * block
    t = max(graph_seconds(lambda i: mb.stream_read(x, P, elems, block=block, offset=0), inner=8, reps=reps) - gap_s, 1e-7)
    l2 = {"plain": P * elems * 2 / t}
    Pt, per, wrap = 2 * S, 1 << 20, 128 << 10
    for st in stages:
        tt = max(graph_seconds(lambda i, st=st: mb.stream_tile(x, Pt, per, num_stages=st, wrap_bytes=wrap,
                                                                wrap_programs=128), inner=8, reps=reps) - gap_s, 1e-7)
        l2[f"tile_s{st}"] = Pt * per / tt
    return {"l2_bytes_per_s": max(l2.values()), "l2_readers": l2}


def measure_copy(reps: int, S: int, quick: bool = False) -> dict:
    """Gather of N rows of H = 7168 bf16 by n copying SMs: "points" [n, bytes/s per SM]."""
    import torch

    from . import microbench as mb

    H, N = 7168, 8192
    src = torch.randn((N, H), device="cuda", dtype=torch.bfloat16)
    idx = torch.randperm(N, device="cuda").to(torch.int32)
    dst = torch.empty_like(src)
    pts = []
    for n in ((1, 16, S) if quick else (1, 2, 4, 8, 16, 32, S // 2, S)):
        t = event_seconds(lambda n=n: mb.gather_copy(src, idx, n, out=dst), reps=reps)
        pts.append([n, N * H * 2 / t / n])
    return {"points": pts, "row_bytes": H * 2}


#: the shared-read step's working set (64 x 128 bf16 tiles), bytes per program per launch, groups
L2_SHARED_SET_BYTES = 8 << 20
L2_SHARED_PER_PROGRAM = 1 << 20
L2_SHARED_GROUPS = (1, 2, 4, 8, 16)


def l2_shared_programs(S: int, quick: bool = False) -> list[int]:
    """The shared-read step's program counts: S/8, S/2, S, 2S, 3S (quick: S/2 and S)."""
    return sorted({max(1, S // 2), S} if quick else {max(1, S // 8), max(1, S // 2), S, 2 * S, 3 * S})


def measure_l2_shared(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Aggregate L2 read rate of P programs sharing one L2-resident working set in groups of g
    consecutive programs reading the same tile at once (``l2_shared_read``, 4 stages): "points"
    [P, g, bytes/s], from graphs of 8 launches less the launch gap."""
    import torch

    from . import microbench_shared as ms

    bn, bk = 64, 128
    w = torch.randn((L2_SHARED_SET_BYTES // (bn * bk * 2), bn, bk), device="cuda", dtype=torch.bfloat16)
    per = L2_SHARED_PER_PROGRAM
    groups = (1, 8) if quick else L2_SHARED_GROUPS
    pts = []
    for P in l2_shared_programs(S, quick):
        for g in groups:
            t = max(graph_seconds(lambda i, P=P, g=g: ms.l2_shared_read(w, P, g, per), inner=8, reps=reps) - gap_s,
                    1e-7)
            pts.append([P, g, P * per / t])
    return {"points": pts, "set_bytes": L2_SHARED_SET_BYTES, "bytes_per_program": per, "tile": [bn, bk]}


#: the hbm_deep step's readers (deep_read, 16-row tiles): (BLOCK_N, BLOCK_K, num_stages, gated), keeping
#: 32, 48, 96, 128 and 192 KiB in flight (deep_read_depth)
HBM_DEEP_READERS = ((64, 128, 3, False), (64, 128, 4, False), (64, 128, 4, True), (128, 128, 3, True),
                    (128, 128, 4, True))
HBM_DEEP_READERS_QUICK = ((64, 128, 4, False), (128, 128, 3, True))
#: sharing groups (g consecutive programs reading the same tiles at once) and bytes each program reads
HBM_DEEP_GROUPS = (1, 2, 4)
HBM_DEEP_GROUPS_QUICK = (1, 4)
HBM_DEEP_SIZES = (256 << 10, 1 << 20, 4 << 20)
HBM_DEEP_SIZES_QUICK = (256 << 10, 4 << 20)


def hbm_deep_programs(S: int, quick: bool = False) -> list[int]:
    """The hbm_deep step's program counts: S/8, S/4, S/2, S (quick: S/4 and S): one per SM at most."""
    return sorted({max(1, S // 4), S} if quick else {max(1, S // 8), max(1, S // 4), max(1, S // 2), S})


def measure_hbm_deep(reps: int, S: int, quick: bool = False) -> dict:
    """HBM read rate of programs keeping more in flight than the hbm step's reader: per reader of
    HBM_DEEP_READERS (depth D = deep_read_depth), P programs (<= S), groups of g, b bytes each, one
    launch from a cold L2 less an empty launch's overhead -> "points" [[P, D, g, b, P x b / s], ...].
    A reader that fails is listed in "failed"; "shared_bytes": the compiler's shared memory per reader."""
    import torch

    from . import microbench as mb
    from . import microbench_deep as md

    readers = HBM_DEEP_READERS_QUICK if quick else HBM_DEEP_READERS
    groups = HBM_DEEP_GROUPS_QUICK if quick else HBM_DEEP_GROUPS
    sizes = HBM_DEEP_SIZES_QUICK if quick else HBM_DEEP_SIZES
    progs = hbm_deep_programs(S, quick)
    w = torch.ones(max(progs) * max(sizes) // 2, device="cuda", dtype=torch.bfloat16)  # P regions at most
    ones = torch.ones((16, max(r[1] for r in readers)), device="cuda", dtype=torch.bfloat16)  # the loops' A
    t_empty = flushed_seconds(lambda: mb.empty(w), reps=reps)
    pts, failed, shared = [], {}, {}
    for bn, bk, st, gated in readers:
        depth = md.deep_read_depth(bn, bk, st, gated=gated)
        name = f"{bn}x{bk}x{st}{' gated' if gated else ''}"
        res = torch.empty((max(progs), 16, bn), device="cuda", dtype=torch.float32)
        kw = dict(block_n=bn, block_k=bk, num_stages=st, gated=gated, a=ones[:, :bk].contiguous(), out=res)
        mine = []
        try:
            _, k = md.deep_read(w, 1, sizes[0], **kw)  # compile; the compiler's shared memory
            shared[name] = int(getattr(getattr(k, "metadata", None), "shared", 0) or 0)
            for P in progs:
                for g in groups:
                    for b in sizes:
                        t = flushed_seconds(lambda P=P, g=g, b=b, kw=kw: md.deep_read(w, P, b, group=g, **kw),
                                            reps=reps)
                        mine.append([P, depth, g, b, P * b / max(t - t_empty, 0.5 * t, 1e-7)])
        except Exception as exc:  # noqa: BLE001 - a reader that fails leaves the others' grid whole
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        pts.extend(mine)
    out = {"points": pts, "launch_overhead_s": t_empty, "shared_bytes": shared,
           "readers": {f"{bn}x{bk}x{st}{' gated' if gated else ''}": md.deep_read_depth(bn, bk, st, gated=gated)
                       for bn, bk, st, gated in readers}}
    if failed:
        out["failed"] = failed
    return out
