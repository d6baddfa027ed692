"""``megamoe calibrate --out DIR``: measure the cost model's numbers with microbenchmarks (GPU only).

Shape legend: P programs, S SMs, R rounds, N rows, H row width.

Runs the kernels of ``megamoe.kernels.microbench`` (never the MoE kernels) and writes
``DIR/profile.json``: the base profile (``--base``, default ``h200``) with every measured number
replaced and a ``kernel_model`` section holding the curves (``simulator/cost.py`` reads them), each
with its unit and the source "measured by megamoe calibrate on <gpu> <date>", and
``DIR/microbench.json`` with the raw measurements. ``--system DIR/profile.json`` (simulate) and
``--profile DIR/profile.json`` (validate) use it. Timings are CUDA-graph replays (medians of a few
replays) or CUDA events around one long launch; the whole run should take about a minute on an
H200, mostly compiling the microbenchmark kernels (not yet run there).

Steps, in this order (``sync`` last: its spin kernels need every program resident and are the ones
that could hang); ``profile.json`` is rewritten after each, so a run cut short keeps what it
measured. ``--budget SECONDS`` plans the steps: a step runs in full if it and the quick form of every
later step fit (``STEP_COST_S``, rough figures), in its quick form if that fits, otherwise it is
skipped and the base profile's numbers stay (``calibration.not_measured`` names it). A step that
raises is recorded (``calibration.errors``) and the others go on; a step that does not end in
``STEP_TIMEOUT_S`` is taken for a hang and the watchdog ends the process (exit code 4).

Measured:
    launch gap, graph cost    graphs of 1, 8, 16, 64 empty kernels after the clocks are warmed, each
                              size's median over LAUNCH_ROUNDS rounds: replay time = fixed + N x gap
    hbm_read                  P in {1 .. 8S} programs x {16 KiB .. 4 MiB} each, one launch from a cold L2:
                              the best of the pointer-load readers (plain loads, the GEMM loop's
                              cp.async); hbm_read_tma: the same grid by the GEMM loop reading its
                              weight tiles through a TMA descriptor (Hopper+; skipped without TMA),
                              recorded, not read by the cost model
    l2 bandwidth              8S programs re-reading 16 MiB (L2-resident)
    mma                       tile shapes (BM 16/64/128, BN, warps) x depth, L2-resident operands,
                              8S programs; occupancy from the compiled kernels' registers and
                              shared memory
    gemm                      the same tile shapes x depth in a dense 4096 x 4096 x depth GEMM of
                              HBM-resident operands, in every tile-loop form the kernels run
                              (reference.tiles.GEMM_LOOP_FORMS; kernels/microbench_gemm.py): the
                              rate of a tile loop as a GEMM runs it
    gemm_reuse                grouped GEMMs of E experts whose weight tiles are each read by r in
                              {1, 2, 4, 8, 16} row blocks (kernels/microbench_gemm.reuse_gemm, the
                              dense step's tile loops, weights well beyond L2: from HBM), for the
                              prefill GEMMs' loop forms and tiles (GEMM_REUSE_CASES) at two depths:
                              kernel_model.gemm_reuse_<form>, recorded, not read by the cost model
    mma_fp8                   the same tile shapes x depth, e4m3 x e4m3 with fp32 accumulation,
                              operands held on chip (``mma_resident``), 8S programs: the cost
                              model's fp8 rates (without it, the bf16 ones x the fp8/bf16 peak ratio)
    flag handoff              a token passed R times round-robin over P programs (slope in R)
    grid barrier              R barriers of P programs (slope in R)
    ticket                    one program taking N tickets (slope in N): the atomic round trip
    sm_copy                   gather of N rows of H = 7168 bf16 by 1 .. S copying SMs
    serial steps              one program: R dependent load+dot steps; R dependent top-1 passes
                              over 16 rows of 128 and of 256 fp32 scores: their median
                              (serial_reduce_step_s) and each width's, kernel_model.serial_reduce_width
    l2_shared                 P in {S/8, S/2, S, 2S, 3S} programs sweeping one 8 MiB L2-resident set of
                              weight tiles (the GEMM loop's loads), groups of g in {1, 2, 4, 8, 16}
                              consecutive programs reading the same tile at the same step
                              (kernels/microbench_shared.py): aggregate bytes/s by (P, g),
                              kernel_model.l2_shared_read
    hbm_deep                  P in {S/8, S/4, S/2, S} programs (one per SM) streaming weights from a
                              cold L2 through GEMM 1's tile loops, each keeping 48, 96, 128 or 192 KiB
                              of weight tiles in flight (kernels/microbench_deep.py: the hbm step's
                              reader, then 16 x 64 x 128 and 16 x 128 x 128 gated tiles at 3-4
                              stages), groups of g in {1, 2, 4} consecutive programs reading the same
                              tiles at once, 256 KiB to 4 MiB each: bytes/s, kernel_model.hbm_deep_read
                              (read behind cost.USE_TASK_DEEP_READ; quick: S/4 and S, 48 and 128 KiB,
                              g 1 and 4, 256 KiB and 4 MiB)
    select                    one routing program's selection (kernels/microbench_route.py: the
                              multi-launch router's _route_block on random fp32 logits) of each
                              preset's router family, BLOCK_E, K and groups, as the routing programs
                              of 16-, 32- and 64-token batches run it (their BLOCK_T, warps, top-k way;
                              quick: 64): seconds per block from the slope in R blocks, kernel_model.route_select
    serial_programs           the serial steps with P in {1, 16, 64, S, 2S} programs at once, each
                              its own token rows and the same router weights: seconds per load+dot
                              step (kernel_model.serial_load_step), per top-1 pass
                              (serial_reduce_step), and per step of a dependent chain whose next
                              address comes from the last load (serial_chain_step); all three
                              recorded, not read by the cost model
    sustained                 after SUSTAINED_PAUSE_S idle, one CUDA graph of N back-to-back dense
                              bf16 8192^3 matmuls (torch.matmul, cuBLAS: the hardware's figure, as
                              the mma step's dense GEMM) for N busy about 5, 20, 60, 150, 300 ms
                              (quick: 20, 60, 300), one replay each, then the shortest again (the
                              pause's recovery): the average rate over each graph / the best of them
                              against its seconds, kernel_model.sustained_mma (read behind
                              cost.USE_SUSTAINED_CLOCKS), and the rate of each graph's last part
                              (between two graph lengths, recorded)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

from megamoe.reference.config import ROUTERS
from megamoe.reference.tiles import GEMM_LOOP_FORMS, gemm_loop_form_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for profile.json and microbench.json")
    parser.add_argument("--base", default="h200", help="profile whose non-measured fields are kept (default h200)")
    parser.add_argument("--reps", type=int, default=5, help="graph replays per timing (median)")
    parser.add_argument("--quick", action="store_true", help="fewer points in every step (about half the time)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="wall-time limit (default none): later steps run in their quick form, or are skipped "
                             "(their base-profile numbers kept), when the budget is near")


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
    return _event_median(fn, reps)


def _event_median(fn, reps: int, before=None) -> float:
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
    """Median seconds of one fn() with nothing of its data in L2.

    Per repetition the GPU is first kept busy (``torch.cuda._sleep``, about 1 ms) while the host
    queues a read of ``flush_bytes`` (which evicts L2), the start event, fn and the end event:
    the events then time fn alone, from a cold L2 and without the host's launch latency. (Replaying
    a graph of a few reads instead would serve the small ones from L2: their few MiB stay there
    from one replay to the next.) The flush reads (a max over the buffer), so the lines it leaves
    are clean: a zero-fill (runs up to J) left L2 full of dirty lines whose write-back then
    slowed the timed kernel's first reads."""
    import torch

    scratch = torch.ones(flush_bytes // 4, device="cuda", dtype=torch.int32)
    sink = torch.empty((), device="cuda", dtype=torch.int32)
    sleep = getattr(torch.cuda, "_sleep", None)

    def flush():
        if sleep is not None:
            sleep(2_000_000)
        torch.amax(scratch, dim=0, out=sink)

    return _event_median(fn, reps, flush)


def _slope(xs, ts) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ts over xs."""
    n = len(xs)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx
    return mt - b * mx, b


# --------------------------------------------------------------------------- measurements
#: empty kernels per graph in the launch step (8: the graphs megamoe validate times hold 8 layer calls)
LAUNCH_GRAPH_SIZES = (1, 8, 16, 64)
#: rounds over LAUNCH_GRAPH_SIZES, each size's median taken: the first graph replays of a calibration ran
#: while the GPU left its idle clocks (run AK: 1 kernel 24.4 us, 16 kernels 12.2 us; the fit's intercept,
#: the graph fixed cost, came out 7.7-17.1 us over runs AK, AJ, AM, AN)
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
    a, b = _slope(list(ns), ts)
    return {"graph_fixed_s": max(a, 0.0), "launch_gap_s": b, "points": list(zip(ns, ts)),
            "rounds": [list(r) for r in rounds]}


def measure_launch(reps: int) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    x = torch.zeros(1, device="cuda")
    warm_clocks()
    rounds = [[graph_seconds(lambda i, n=n: [mb.empty(x) for _ in range(n)], inner=1, reps=max(reps, 9))
               for n in LAUNCH_GRAPH_SIZES] for _ in range(LAUNCH_ROUNDS)]
    return launch_fit(LAUNCH_GRAPH_SIZES, rounds)


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
    """Streaming-read rate over (programs, bytes per program), each point one launch timed from a
    cold L2 (``flushed_seconds``): the best of the plain-load reader and the GEMM-loop reader
    (``stream_tile`` at 3 and 4 pipeline stages), so the table is what a well-built kernel reaches
    (H200 run F, 2026-12-01: the plain-load reader alone peaked at 2.97 TB/s, where the MoE GEMMs
    stream at 4.5). "points_tma": the same grid read by the GEMM loop with its weight tiles through
    a TMA descriptor (``stream_tile_tma``, the same stages), apart: the rate the cost model gives
    stages and tasks whose weights come through TMA (validation over-predicted some TMA megakernel
    configurations by 18-20%: the hypothesis that a TMA-fed stream pulls more per program). Left
    out ("tma_skipped") on a GPU without TMA, or wholly if one of its points fails. The L2 rate from
    a graph of launches re-reading 16 MiB."""
    import torch

    from megamoe.kernels import microbench as mb

    progs = [1, 16, S, 4 * S] if quick else [1, 4, 16, S // 4, S // 2, S, 2 * S, 4 * S, 8 * S]
    sizes = [64 << 10, 1 << 20] if quick else [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    stages = (4,) if quick else (3, 4)
    block = 1024  # bf16 values per load: 2 KiB
    x = torch.ones(max(progs) * max(sizes) // 2, device="cuda", dtype=torch.bfloat16)
    # a single launch timed between events carries its own overhead (run G: 5.8 us for one
    # program reading 16 KiB): measured on an empty kernel the same way and taken off each point
    t_empty = flushed_seconds(lambda: mb.empty(x), reps=reps)
    tma_skipped = None if mb.tma_available(x.device) else "no TMA on this GPU (compute capability below 9.0)"

    def rate_point(P, b, t):  # a point of a table: the launch's overhead taken off its best time
        return [P, b, P * b / max(t - t_empty, 0.5 * t, 1e-7)]

    pts, pts_tma, best = [], [], []
    for P in progs:
        for b in sizes:
            elems = b // 2
            t_plain = flushed_seconds(lambda P=P, elems=elems: mb.stream_read(x, P, elems, block=block), reps=reps)
            ts = {"plain": t_plain}
            for st in stages:
                ts[f"tile_s{st}"] = flushed_seconds(lambda P=P, b=b, st=st: mb.stream_tile(x, P, b, num_stages=st),
                                                    reps=reps)
            tma = {}
            for st in stages if tma_skipped is None else ():
                try:
                    tma[f"tma_s{st}"] = flushed_seconds(lambda P=P, b=b, st=st: mb.stream_tile_tma(x, P, b, num_stages=st),
                                                        reps=reps)
                except Exception as exc:  # noqa: BLE001 - the main table does not need the TMA reader
                    tma_skipped = f"{type(exc).__name__}: {exc}"[:300]
                    tma = {}
                    break
            name = min(ts, key=ts.get)  # the main table: the pointer-load readers only, as before
            pts.append(rate_point(P, b, ts[name]))
            row = {"programs": P, "bytes": b, "best": name, **{k: P * b / v for k, v in ts.items()}}
            if tma:
                name_tma = min(tma, key=tma.get)
                pts_tma.append(rate_point(P, b, tma[name_tma]))
                row.update(best_tma=name_tma, **{k: P * b / v for k, v in tma.items()})
            best.append(row)
    # L2: 8S programs re-reading the same 16 MiB (plain loads), and 2S programs each cycling 1 MiB
    # of GEMM-loop loads through its own 128 KiB of a 16 MiB footprint (the grouped GEMMs' operand
    # re-reads: H200 run H measured 3.86 TB/s with the plain reader alone, where the GEMMs move
    # more through L2): the better of the two
    P, elems = 8 * S, (16 << 20) // (8 * S) // 2 // block * block
    t = max(graph_seconds(lambda i: mb.stream_read(x, P, elems, block=block, offset=0), inner=8, reps=reps) - gap_s, 1e-7)
    l2 = {"plain": P * elems * 2 / t}
    Pt, per, wrap = 2 * S, 1 << 20, 128 << 10
    for st in stages:
        tt = max(graph_seconds(lambda i, st=st: mb.stream_tile(x, Pt, per, num_stages=st, wrap_bytes=wrap,
                                                                wrap_programs=128), inner=8, reps=reps) - gap_s, 1e-7)
        l2[f"tile_s{st}"] = Pt * per / tt
    out = {"points": pts, "readers": best, "launch_overhead_s": t_empty, "l2_bytes_per_s": max(l2.values()),
           "l2_readers": l2}
    if tma_skipped is None:
        out["points_tma"] = pts_tma
    else:  # a partial TMA grid would not load (the points must fill a grid): no table ("readers" keeps what ran)
        out["tma_skipped"] = tma_skipped
    return out


MMA_SHAPES = ((16, 64, 4, 128), (16, 128, 4, 128), (32, 64, 4, 128), (64, 64, 4, 64), (64, 128, 4, 64),
              (128, 128, 8, 64), (128, 256, 8, 64))
#: the on-chip mma step's shapes: MMA_SHAPES and the tuned multi-launch GEMM 1 tiles of under 128 rows
#: that none of them is: 32 x (2 x 128) at 8 warps (DeepSeek-V3 T = 512, Mixtral-8x7B T = 64), which read
#: the 16 x 128 x 4 entry on a tie with 64 x 128 x 4 (cost._nearest_shape), 64 x (2 x 128) at 4 warps
#: (Qwen3-30B-A3B T = 512) and 16 x (2 x 128) at 4 (T = 64); BLOCK_K 64 keeps four stages within shared
#: memory. Not in the dense-GEMM steps: their tables price 128-row tiles only (cost.GEMM_TABLE_MIN_ROWS)
MMA_TABLE_SHAPES = MMA_SHAPES + ((16, 256, 4, 64), (32, 256, 8, 64), (64, 256, 4, 64))


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
    """Tensor rate per SM by tile shape and depth: the best of the operands held on chip
    (``mma_resident``: the tensor cores alone) and P = 8S programs over Q = 16 L2-resident operand
    copies at 3 and 4 pipeline stages ("points"), and the L2-fed pointer-load kernel alone
    ("points_pointer": the rate of tiles without TMA; runs F and G, H200: 243-275 TFLOP/s at
    128x128, where the TMA GEMM 1 runs at 557 and the megakernel's pointer tiles at about 270 in
    run L); the dense bf16 GEMM's sustained rate (cuBLAS), which caps the table."""
    import torch

    from megamoe.kernels import microbench as mb

    depths = (1024,) if quick else (256, 1024, 4096)
    shapes = MMA_SHAPES[::3] if quick else MMA_TABLE_SHAPES
    P, Q = 8 * S, 16
    pts, ptr_pts, occ, failed = [], [], {}, {}
    for bm, bn, w, bk in shapes:
        extra = (bm, bn, w, bk) not in MMA_SHAPES
        if extra:  # one of the small tiles' shapes: its failure drops that shape alone; not in the occupancy
            try:
                got = _mma_shape_points(mb, torch, bm, bn, w, bk, depths, P, Q, S, reps, gap_s, quick, occ=None)
            except Exception as exc:  # noqa: BLE001 - the other shapes' table still stands
                failed[f"{bm}x{bn}x{w}"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
        else:
            got = _mma_shape_points(mb, torch, bm, bn, w, bk, depths, P, Q, S, reps, gap_s, quick, occ=occ)
        pts.extend(got[0])
        ptr_pts.extend(got[1])
    # the rate a large dense bf16 GEMM sustains (cuBLAS, 8192^3: a microbenchmark, not our kernels)
    n = 4096 if quick else 8192
    a, b = (torch.randn((n, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    t = graph_seconds(lambda i: torch.matmul(a, b), inner=2, reps=reps)
    out = {"points": pts, "points_pointer": ptr_pts, "occupancy": {w: int(statistics.median(v)) for w, v in occ.items()},
           "dense_flops_per_s": 2.0 * n ** 3 / t}
    if failed:
        out["failed_shapes"] = failed
    return out


def _mma_shape_points(mb, torch, bm, bn, w, bk, depths, P, Q, S, reps, gap_s, quick, occ) -> tuple[list, list]:
    """``measure_mma``'s points of one tile shape over ``depths``: ([bm, bn, w, d, best rate], [..., the
    L2-fed rate]); the compiled kernels' occupancy into ``occ`` (by warps) unless it is None."""
    pts, ptr_pts = [], []
    c = torch.empty((P, bm, bn), device="cuda", dtype=torch.bfloat16)
    for d in depths:
        a = torch.randn((Q, bm, d), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((Q, d, bn), device="cuda", dtype=torch.bfloat16)
        rate = 0.0
        # the tensor cores alone (operands on chip), at the same depth
        ar, br = a[0, :, :bk].contiguous(), b[0, :bk, :].contiguous()
        _, k = mb.mma_resident(ar, br, P, d // bk, num_warps=w, out=c)
        t = max(graph_seconds(lambda i, ar=ar, br=br, w=w, c=c, d=d, bk=bk:
                              mb.mma_resident(ar, br, P, d // bk, num_warps=w, out=c), inner=4, reps=reps) - gap_s,
                1e-7)
        rate = max(rate, P * 2.0 * bm * bn * d / t / S)
        fed = 0.0  # operands by pointer loads (cp.async) from L2, as kernels without TMA get them
        for st in ((3,) if quick else (3, 4)):
            _, k = mb.mma(a, b, P, block_k=bk, num_warps=w, num_stages=st, out=c)
            t = max(graph_seconds(lambda i, a=a, b=b, bk=bk, w=w, c=c, st=st:
                                  mb.mma(a, b, P, block_k=bk, num_warps=w, num_stages=st, out=c),
                                  inner=4, reps=reps) - gap_s, 1e-7)
            fed = max(fed, P * 2.0 * bm * bn * d / t / S)
            rate = max(rate, fed)
            o = _occupancy(k, w) if occ is not None else None
            if o is not None:
                occ.setdefault(w, []).append(o)
        pts.append([bm, bn, w, d, rate])
        ptr_pts.append([bm, bn, w, d, fed])
    return pts, ptr_pts


def measure_mma_fp8(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """FP8 tensor rate per SM (e4m3 x e4m3, fp32 accumulate) by tile shape and depth, at the bf16
    step's shapes and depths: operands held on chip (``mma_resident``: the tensor cores alone), 8S
    programs. The L2-fed variant is left out: its B tile is N-contiguous, which FP8 wgmma cannot
    take without a transpose the MoE GEMMs do not do."""
    import torch

    from megamoe.kernels import microbench as mb

    depths = (1024,) if quick else (256, 1024, 4096)
    shapes = MMA_SHAPES[::3] if quick else MMA_SHAPES
    P = 8 * S
    pts = []
    for bm, bn, w, bk in shapes:
        c = torch.empty((P, bm, bn), device="cuda", dtype=torch.float32)
        a = torch.randn((bm, bk), device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn((bk, bn), device="cuda").to(torch.float8_e4m3fn)
        for d in depths:
            mb.mma_resident(a, b, P, d // bk, num_warps=w, out=c)
            t = max(graph_seconds(lambda i, w=w, c=c, d=d, bk=bk, a=a, b=b:
                                  mb.mma_resident(a, b, P, d // bk, num_warps=w, out=c), inner=4, reps=reps) - gap_s,
                    1e-7)
            pts.append([bm, bn, w, d, P * 2.0 * bm * bn * d / t / S])
    return {"points": pts}


#: the dense GEMM microbenchmark's rows and columns (kernels/microbench_gemm.py): a 4096 x 4096
#: output is 7.75 waves of 128 x 128 tiles on 132 SMs, operands of 2-32 MB each (HBM, not L2)
GEMM_MN = 4096
#: its pipeline stages by warps (the MoE kernels': 3 at 8 warps (prefill tiles), 4 below)
GEMM_STAGES = {4: 4, 8: 3}


#: the dense GEMM's loop forms (reference.tiles.GEMM_LOOP_FORMS) as the profile's sources say them
GEMM_FORMS = {name: gemm_loop_form_text(name) for name in GEMM_LOOP_FORMS}
# a gated form's table row is its whole tile, gate and up: BLOCK_N = twice each accumulator's
# columns (the launch plan's GEMM 1 work tile), so a shape of MMA_SHAPES runs as two BN / 2 halves


#: the dense-GEMM step's depths: 16384 since session 14, so that the tables cover the deepest GEMMs the presets
#: run (Mixtral-8x7B's GEMM 2, 14336) instead of clamping them at 4096's rate (the megakernel's Mixtral GEMM 2
#: tasks ran at 3.87 TFLOP/s per SM in H200 run BA's trace, the 128 x 128 TMA table read 3.61 at 4096)
GEMM_DEPTHS = (256, 1024, 4096, 16384)


def measure_gemm(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Tensor rate per SM of each ``MMA_SHAPES`` tile loop in a dense bf16 GEMM, C (4096, 4096) =
    A (4096, depth) @ W (4096, depth)^T in grouped order, operands from HBM
    (kernels/microbench_gemm.py), for each loop form of microbench_gemm.LOADS: "points_<form>"
    (one tile per program or persistent programs, S of them; operands by pointer loads or
    through TMA). A GEMM, not the MoE kernels: no gather, no routing, no epilogue but the store."""
    import torch

    from megamoe.kernels.microbench_gemm import LOADS, dense_gemm

    depths = (1024,) if quick else GEMM_DEPTHS
    shapes = MMA_SHAPES[::3] if quick else MMA_SHAPES
    n = GEMM_MN
    out = {f"points_{form}": [] for form in LOADS}
    failed: dict[str, str] = {}
    c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    c_half = torch.empty((n, n // 2), device="cuda", dtype=torch.bfloat16)  # the gated forms' output
    for d in depths:
        a = torch.randn((n, d), device="cuda", dtype=torch.bfloat16)
        w = torch.randn((n, d), device="cuda", dtype=torch.bfloat16)
        for bm, bn, warps, bk in shapes:
            for form, gated in ((f, v.gated) for f, v in LOADS.items()):
                if form in failed:
                    continue
                # gated: two accumulators of bn / 2 columns (w read as gate rows, then up rows), the
                # GEMM 1 tile loop's stages (4 at 8 warps, as tuned)
                stages = GEMM_STAGES[warps] + (1 if gated and warps == 8 else 0)
                kw = dict(block_m=bm, block_n=bn // 2 if gated else bn, block_k=bk, num_warps=warps,
                          num_stages=stages, loads=form, programs=S, out=c_half if gated else c)
                try:
                    t = max(graph_seconds(lambda i, kw=kw, a=a, w=w: dense_gemm(a, w, **kw), inner=2, reps=reps)
                            - gap_s, 1e-7)
                except Exception as exc:  # noqa: BLE001 - one loop form failing keeps the others' tables
                    failed[form] = f"{type(exc).__name__}: {exc}"[:300]
                    continue
                out[f"points_{form}"].append([bm, bn, warps, d, 2.0 * n * n * d / t / S])
    for form, why in failed.items():  # a table with some shapes missing would misprice them: none at all
        out.pop(f"points_{form}")
        out.setdefault("failed", {})[form] = why
    return out


#: the reuse step's cases (kernels/microbench_gemm.reuse_gemm): (loop form, BLOCK_M, BLOCK_N of the
#: table row (gated: gate + up columns, two BLOCK_N / 2 accumulators), warps, BLOCK_K, output
#: columns N of each expert, depths K (the first: the quick form's)). The multi-launch prefill
#: GEMMs' own tiles (DeepSeek-V3: GEMM 1 tma_persistent_gated 128 x (2 x 128), 7168 deep, 2048
#: columns; GEMM 2 tma_ab_persistent 128 x 256, 2048 deep, 7168 columns), the TMA-weights loop at
#: both tile widths, and the pointer loop (a tile per program) at 64 x 128, 4 warps, in GEMM 2's
#: shape and GEMM 1's gated one. Weights per expert: 7168 x depth (or 4096 x depth), bf16
GEMM_REUSE_CASES = (
    ("tma_ab_persistent", 128, 256, 8, 64, 7168, (2048, 7168)),
    ("tma_ab_persistent", 128, 128, 8, 64, 7168, (2048, 7168)),
    ("tma_persistent", 128, 256, 8, 64, 7168, (2048, 7168)),
    ("tma_persistent", 128, 128, 8, 64, 7168, (2048, 7168)),
    ("tma_persistent_gated", 128, 256, 8, 64, 2048, (7168, 2048)),
    ("pointer", 64, 128, 4, 64, 7168, (2048, 7168)),
    ("pointer_gated", 64, 128, 4, 64, 2048, (7168, 2048)),
)
#: row blocks per expert measured (r: row blocks reading each weight tile); quick: three of them
GEMM_REUSE_ROW_BLOCKS = (1, 2, 4, 8, 16)
GEMM_REUSE_ROW_BLOCKS_QUICK = (1, 2, 8)
#: the reuse step's weights are at least this many times the GPU's L2 (cold: every weight tile
#: comes from HBM once per group of row blocks that reads it)
GEMM_REUSE_L2_TIMES = 8
#: and its grid of r = 1 at least this many waves of the SMs
GEMM_REUSE_MIN_WAVES = 6
#: whole waves are not worth more experts than this
GEMM_REUSE_MAX_EXPERTS = 128


def reuse_experts(S: int, n_tiles: int, expert_bytes: int, l2_bytes: int) -> int:
    """Experts of a reuse case: enough that their weights are GEMM_REUSE_L2_TIMES x L2 and r = 1
    fills GEMM_REUSE_MIN_WAVES waves of S programs, rounded up to whole waves where that takes at
    most GEMM_REUSE_MAX_EXPERTS (S // gcd(S, N tiles) experts per whole number of waves, at any
    power-of-two r; an H200's 132 SMs: 33 experts of 28 or 56 N tiles, 7 or 14 waves at r = 1; 66
    of GEMM 1's 16, 8 waves)."""
    import math

    need = max(math.ceil(GEMM_REUSE_L2_TIMES * max(l2_bytes, 1) / expert_bytes),
               math.ceil(GEMM_REUSE_MIN_WAVES * S / n_tiles), 1)
    unit = S // math.gcd(S, n_tiles)
    whole = unit * math.ceil(need / unit)
    return whole if whole <= GEMM_REUSE_MAX_EXPERTS else need


def measure_gemm_reuse(reps: int, S: int, gap_s: float, quick: bool = False, l2_bytes: int | None = None) -> dict:
    """Tensor rate per SM of grouped GEMMs whose weight tiles are each read by r row blocks
    (kernels/microbench_gemm.reuse_gemm, the dense step's tile loops): per GEMM_REUSE_CASES case and
    depth, E experts (``reuse_experts``: weights >> L2, from HBM) of r BLOCK_M rows each, r in
    GEMM_REUSE_ROW_BLOCKS -> "points_<form>": [[BLOCK_M, BLOCK_N, warps, depth, r, flop/s per SM],
    ...] (flop: 2 x rows x weight rows x depth, gated forms counting gate and up), persistent
    forms on S programs. Why (run AJ, 36): DeepSeek-V3's GEMM 2 at T = 4096 (1.56 row blocks per
    expert) measured ~43.8 us per tile against 25.6 from the dense table, whose 4096 x 4096 GEMM
    reads each weight tile for 32 row blocks."""
    import torch

    from megamoe.kernels.microbench_gemm import LOADS, reuse_gemm

    if l2_bytes is None:
        l2_bytes = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or (50 << 20)
    rbs = GEMM_REUSE_ROW_BLOCKS_QUICK if quick else GEMM_REUSE_ROW_BLOCKS
    out: dict = {}
    failed: dict[str, str] = {}
    failed_shapes: set[tuple] = set()  # (form, BLOCK_M, BLOCK_N, warps) of the failed cases
    experts: dict[str, int] = {}
    for form, bm, bn, warps, bk, n_out, depths in GEMM_REUSE_CASES:
        gated = LOADS[form].gated
        acc_n = bn // 2 if gated else bn  # gated: two accumulators of bn / 2 columns
        n_w = 2 * n_out if gated else n_out  # each expert's weight rows
        stages = GEMM_STAGES[warps] + (1 if gated and warps == 8 else 0)  # as the dense step's
        key = f"{form} {bm}x{bn}x{warps}"
        for d in (depths[:1] if quick else depths):
            if key in failed:
                break
            E = reuse_experts(S, n_out // acc_n, n_w * d * 2, l2_bytes)
            experts[f"{key} depth {d}"] = E
            w = torch.randn((E, n_w, d), device="cuda", dtype=torch.bfloat16)
            a = torch.randn((E * max(rbs) * bm, d), device="cuda", dtype=torch.bfloat16)
            c = torch.empty((E * max(rbs) * bm, n_out), device="cuda", dtype=torch.bfloat16)
            for r in rbs:
                M = E * r * bm
                kw = dict(row_blocks=r, block_m=bm, block_n=acc_n, block_k=bk, num_warps=warps, num_stages=stages,
                          loads=form, programs=S, out=c[:M])
                try:
                    t = max(graph_seconds(lambda i, kw=kw, a=a[:M], w=w: reuse_gemm(a, w, **kw), inner=2, reps=reps)
                            - gap_s, 1e-7)
                except Exception as exc:  # noqa: BLE001 - one case failing keeps the others' points
                    failed[key] = f"{type(exc).__name__}: {exc}"[:300]
                    failed_shapes.add((form, bm, bn, warps))
                    break
                out.setdefault(f"points_{form}", []).append([bm, bn, warps, d, r, 2.0 * M * n_w * d / t / S])
            del w, a, c
            torch.cuda.empty_cache()
    for form, bm, bn, warps in failed_shapes:  # a shape with some points missing would not fill its grid: drop it
        pts = [p for p in out.get(f"points_{form}", []) if (p[0], p[1], p[2]) != (bm, bn, warps)]
        if pts:
            out[f"points_{form}"] = pts
        else:
            out.pop(f"points_{form}", None)
    if failed:
        out["failed"] = failed
    out["experts"] = experts
    return out


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


#: the serial step's (BLOCK_H, BLOCK_E) shapes: the router's load + dot step at BLOCK_H, a top-1 pass over
#: 16 rows of BLOCK_E fp32 scores (the width); "reduce" keeps one figure per shape, in this order
#: ("widths" names them; microbench.json files written before it was recorded: this order)
SERIAL_SHAPES = ((64, 128), (32, 256))


def measure_serial(reps: int) -> dict:
    import torch

    from megamoe.kernels import microbench as mb

    load, red = [], []
    steps = (4, 64)
    for bh, be in SERIAL_SHAPES:
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
            "load": load, "reduce": red, "widths": [be for _, be in SERIAL_SHAPES]}


def serial_width_points(serial: dict) -> list:
    """[[width, s per top-1 pass], ...] of the serial step's per-width passes (``measure_serial``'s "reduce",
    one per SERIAL_SHAPES width; "widths" where recorded, else SERIAL_SHAPES' order), widths once each,
    a pass that timed at or below zero left out; [] where the step has none."""
    red = serial.get("reduce") or []
    widths = serial.get("widths") or [be for _, be in SERIAL_SHAPES][:len(red)]
    pts = {}
    for w, t in zip(widths, red):
        if t > 0:
            pts.setdefault(float(w), []).append(float(t))
    return [[w, statistics.median(ts)] for w, ts in sorted(pts.items())]


#: batches whose routing programs the select step times (quick: SELECT_TOKENS_QUICK): 16 tokens, one block of 16
#: (configs.router_block_t); 32, one block of 32; 64, two (where the routing programs of many blocks take
#: another top-k, configs.router_bitonic)
SELECT_TOKENS = (16, 32, 64)
SELECT_TOKENS_QUICK = (64,)


def select_cases(quick: bool = False) -> list[tuple]:
    """(key, config, tokens) for the select step: each distinct routing program of the presets
    (microbench_route.select_key of a batch of SELECT_TOKENS) once."""
    from megamoe.kernels.microbench_route import select_key
    from megamoe.reference import PRESETS, MoEConfig

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

    from megamoe.kernels import microbench_route as mr

    rounds = (2, 16)
    pts = []
    for key, cfg, tokens in select_cases(quick):
        E, bt = cfg.num_experts, mr.select_launch(cfg, tokens)["BLOCK_T"]
        lg = torch.randn((max(rounds) * bt, E), device="cuda", dtype=torch.float32)
        rb = torch.randn(E, device="cuda") * 0.01 if cfg.router_bias else None
        sb = torch.randn(E, device="cuda") * 0.01 if cfg.score_bias else None
        ts = [graph_seconds(lambda i, r=r, lg=lg, cfg=cfg, bt=bt, tokens=tokens, rb=rb, sb=sb:
                            mr.route_select(lg[:r * bt], cfg, tokens, r, rb=rb, sb=sb), inner=4, reps=reps) for r in rounds]
        pts.append([*key, max(_slope(rounds, ts)[1], 1e-9)])
    return {"points": pts}


#: the shared-read step's working set: 8 MiB of 64 x 128 bf16 tiles (512 tiles: the 3S = 396 groups
#: of one program each on the H200 still read apart), read 1 MiB per program per launch
L2_SHARED_SET_BYTES = 8 << 20
L2_SHARED_PER_PROGRAM = 1 << 20
L2_SHARED_GROUPS = (1, 2, 4, 8, 16)


def l2_shared_programs(S: int, quick: bool = False) -> list[int]:
    """The program counts of the shared-read step: S/8, S/2, S, 2S, 3S (quick: S/2 and S). 3S: the
    readers that 8-warp GEMM programs keeping 144-200 KiB in flight, one per SM, are worth
    (cost.l2_readers: 400-550 of the 48 KiB reader), which the table clamped at 2S before."""
    return sorted({max(1, S // 2), S} if quick else {max(1, S // 8), max(1, S // 2), S, 2 * S, 3 * S})


def measure_l2_shared(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Aggregate L2 read rate of P programs sharing one L2-resident working set, groups of g
    consecutive programs reading the same tile at the same step (``l2_shared_read``: the GEMM
    loop's pipelined load + dot, 4 stages as the L2 step's best reader): "points" [P, g, bytes/s].
    Graphs of 8 launches (the set warm in L2 from the warm-up launches), the launch gap taken off.
    Tests the hypothesis that programs reading the same weight tiles at once (grouped GEMM order)
    get more from L2 than programs re-reading their own data (l2_bandwidth_bytes_per_s)."""
    import torch

    from megamoe.kernels import microbench_shared as ms

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


#: the hbm_deep step's readers (kernels/microbench_deep.deep_read, 16-row tiles, 4 warps): (BLOCK_N,
#: BLOCK_K, num_stages, gated), keeping deep_read_depth bytes of weight tiles in flight: 32 KiB (the decode
#: megakernel's GEMM 2 tasks of 64 x 128 at 3 stages, Mixtral-8x7B T = 8 before run BN; read behind
#: cost.USE_SHALLOW_DEEP_READ; full step only), 48 KiB (the hbm
#: step's reader: stream_tile's 64 x 128 at 4 stages, one tile a step), 96 KiB (GEMM 1's 16 x 64 x 128
#: loop at 4 stages: qwen3-30b-a3b T = 1), 128 KiB (16 x 128 x 128 at 3 stages: qwen3-30b-a3b T = 64),
#: 192 KiB (the same at 4 stages). sm_90 compile (Triton 3.9): each one's shared memory is its depth and
#: a 4 KiB A tile (200,704 bytes at 192 KiB: one program per SM; 53,248 at 48 KiB)
HBM_DEEP_READERS = ((64, 128, 3, False), (64, 128, 4, False), (64, 128, 4, True), (128, 128, 3, True),
                    (128, 128, 4, True))
HBM_DEEP_READERS_QUICK = ((64, 128, 4, False), (128, 128, 3, True))
#: sharing groups (g consecutive programs reading the same tiles at once) and bytes each program reads
HBM_DEEP_GROUPS = (1, 2, 4)
HBM_DEEP_GROUPS_QUICK = (1, 4)
HBM_DEEP_SIZES = (256 << 10, 1 << 20, 4 << 20)
HBM_DEEP_SIZES_QUICK = (256 << 10, 4 << 20)


def hbm_deep_programs(S: int, quick: bool = False) -> list[int]:
    """The program counts of the hbm_deep step: S/8, S/4, S/2, S (quick: S/4 and S); at most S, so
    that the GPU runs one program per SM (H200: 16, 33, 66, 132)."""
    return sorted({max(1, S // 4), S} if quick else {max(1, S // 8), max(1, S // 4), max(1, S // 2), S})


def measure_hbm_deep(reps: int, S: int, quick: bool = False) -> dict:
    """HBM read rate of programs that keep more in flight than the hbm step's reader: per reader of
    HBM_DEEP_READERS (its depth D: deep_read_depth), P programs of ``hbm_deep_programs`` (<= S: one
    per SM), groups of g consecutive programs reading the same tiles at once, b bytes each, one
    launch timed from a cold L2 (``flushed_seconds``, the hbm step's), its launch overhead (an empty
    kernel timed the same way) taken off as there -> "points": [[P, D, g, b, P x b / s], ...]
    (g > 1: g x the DRAM bytes/s). A reader that fails (compile, shared memory) leaves its depth out
    ("failed") so that the others still fill a grid; "shared_bytes": the compiler's shared memory per
    reader (its depth and the A tile). Why: the hbm grid's reader keeps 48 KB in flight, the
    multi-launch GEMMs' programs 72-196 KB (simulator/README.md, findings of 2026-12-02)."""
    import torch

    from megamoe.kernels import microbench as mb
    from megamoe.kernels import microbench_deep as md

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


#: the program counts of the serial_programs step (S and 2S added from the GPU's SMs)
SERIAL_PROGRAMS = (1, 16, 64)


def measure_serial_programs(reps: int, S: int, quick: bool = False) -> dict:
    """The serial steps with P programs running them at once: the slope in R (steps 4 and 64) of
    P programs each running R load + dot steps over its own 16 token rows and the shared router
    weights (``serial_load_many``, the router's loop: "load"), the same as a dependent chain
    (chain=True: each step's column block read from a table at an address that depends on the last
    tile loaded: "chain"), and R top-1 passes over its own rows (``serial_reduce_many``: "reduce"),
    each the median over the serial step's two tile shapes -> "load", "chain", "reduce": [[P, s
    per step], ...]. At P = 1 the load and reduce figures are the serial step's kernels'."""
    import torch

    from megamoe.kernels import microbench_shared as ms

    progs = sorted({1, 16, S} if quick else {*SERIAL_PROGRAMS, S, 2 * S})
    steps = (4, 64)
    bt = 16
    per = {"load": {}, "chain": {}, "reduce": {}}
    for bh, be in ((64, 128), (32, 256)):
        w = torch.randn((max(steps) * bh, be), device="cuda", dtype=torch.bfloat16)
        x = torch.randn((max(progs) * bt, max(steps) * bh), device="cuda", dtype=torch.bfloat16)
        v = torch.randn((max(progs) * bt, be), device="cuda", dtype=torch.float32)
        nxt = {s: ms.chain_table(s, "cuda") for s in steps}
        for P in progs:
            xp, vp = x[:P * bt], v[:P * bt]
            o = torch.empty((P * bt, be), device="cuda", dtype=torch.float32)
            oi = torch.empty(P * bt, device="cuda", dtype=torch.int32)
            for name, chain in (("load", False), ("chain", True)):
                ts = [graph_seconds(lambda i, s=s, P=P, xp=xp, o=o, chain=chain, bh=bh, w=w, nx=nxt[s]:
                                    ms.serial_load_many(xp, w, P, s, block_h=bh, chain=chain, nxt=nx, out=o),
                                    inner=4, reps=reps) for s in steps]
                per[name].setdefault(P, []).append(_slope(steps, ts)[1])
            ts = [graph_seconds(lambda i, s=s, P=P, vp=vp, oi=oi: ms.serial_reduce_many(vp, P, s, out=oi),
                                inner=4, reps=reps) for s in steps]
            per["reduce"].setdefault(P, []).append(_slope(steps, ts)[1])
    return {k: [[P, statistics.median(vs)] for P, vs in sorted(d.items())] for k, d in per.items()}


#: the sustained step's busy durations (s): graphs of back-to-back matmuls about this long (the
#: validation's graphs: 1-50 ms; run AT's bench_sustained: 797 TFLOP/s over 22 ms, 748 over 94, 705 over
#: 300). The shortest is 5 ms, not less: a replay's fixed cost is no clock effect, and run AT's graph of
#: one matmul (1.4 ms) read 2.2% below its graph of four (5.5 ms), ~31 us more than a quarter of it
SUSTAINED_BUSY_S = (0.005, 0.02, 0.06, 0.15, 0.3)
SUSTAINED_BUSY_S_QUICK = (0.02, 0.06, 0.3)
#: seconds idle before each replay (run AT's bench_sustained: after 1.5 s its three replays of each
#: graph agreed within 1%, the 300 ms one at 297.7-300.8 ms); the full step checks it (``recovery``)
SUSTAINED_PAUSE_S = 1.5
#: rows = columns = depth of the sustained step's matmuls (the mma step's dense GEMM, run AT's bench)
SUSTAINED_SIZE = 8192


#: the sustained step's duty-cycled graphs (full form only): (fraction of the graph's time in the
#: matmuls, seconds of the graph). Each matmul is followed by HBM reads (sums of a large buffer, few SMs'
#: worth of arithmetic) for the rest: whether the clock falls as far when the tensor cores work only part
#: of the time (the validation's layers run their MMA at 0.5-0.8 of the dense GEMM's rate)
SUSTAINED_DUTY = ((0.5, 0.3), (0.75, 0.3))
#: elements (bf16) of the buffer the duty graphs' reads sum: 512 MiB, ~0.12 ms a sum at 4.4 TB/s
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
    """Seconds of one ``replay()`` between CUDA events, after the GPU sat idle ``pause_s`` seconds
    (its clocks back where a short launch finds them); ``clock``, a dict, gets the SM clock and power
    sampled during the replay (kernels.telemetry; empty without NVML)."""
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
    """The sustained step's figures from ``timed`` ([[matmuls N, seconds, SM clock after], ...], N
    ascending; each matmul ``flops``): "rates" [[N, s, flop/s]]; "reference_flops_per_s", the best
    average rate (the short-launch rate; the shortest graph carries the replay's fixed cost, ~30 us
    in run AT); "points" [[s, rate / reference]] (kernel_model.sustained_mma); "marginal"
    [[s of the shorter graph, s of the longer, flop/s of the extra matmuls]] (the rate of the longer
    graph's last part); with ``recheck`` (the shortest graph timed again after the longest),
    "recovery": its first seconds / the recheck's (1: the pause restored the clocks)."""
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
    """A dense bf16 GEMM's rate by how long it has run: per busy duration of SUSTAINED_BUSY_S (quick:
    SUSTAINED_BUSY_S_QUICK) a CUDA graph of N back-to-back SUSTAINED_SIZE^3 matmuls (``matmul_graph``,
    N from the per-matmul time of a short graph at working clocks), one replay after SUSTAINED_PAUSE_S
    idle (``idle_replay_seconds``), shortest first, with the SM clock after it; the full form times
    the shortest graph once more after the longest (``recovery``) -> ``sustained_fit``. One replay a
    point (``reps`` unused): the pauses are the step's time (full ~9.7 s, quick ~4.9 s on an H200), and
    run AT's three replays of each graph agreed within 1%. Why: the H200 lowers its SM clock under
    sustained dense MMA (run AT: 1,515 MHz after 300 ms), while the MMA tables come from short launches."""
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
    """The duty graphs' figures from ``timed`` ([[duty, matmuls N, reads per matmul k, seconds, mean
    SM clock MHz or None], ...]): per graph its seconds, the matmuls' share of them and their rate
    (the graph's time less N x k reads at ``per_read_s``, the reads' time at working clocks: HBM-bound,
    so the SM clock's fall hardly moves it) over ``reference_flops_per_s``."""
    out = []
    for duty, count, k, t, mhz in timed:
        mm_s = max(t - count * k * per_read_s, 1e-9)
        out.append({"duty": float(duty), "seconds": float(t), "matmuls": int(count), "reads_per_matmul": int(k),
                    "matmul_share": mm_s / t, "rate_ratio": count * flops / mm_s / reference_flops_per_s,
                    "sm_clock_mhz_mean": mhz})
    return out


def duty_points(su: dict) -> list[list[float]]:
    """kernel_model.sustained_duty's points from the sustained step's figures ``su``: per duty graph
    [its matmuls' share of the time, (1 - their rate ratio) / (1 - the average ratio of matmuls back
    to back over as many seconds)] (that average read on ``su["points"]`` as the cost model reads
    them, cost.sustained_table_ratio), clipped to [0, 1]; graphs whose back-to-back fall is under 1%
    (no fall to share) or whose share is not strictly between 0 and 1 are left out."""
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


# --------------------------------------------------------------------------- the profile
def build_profile(base: dict, m: dict, prov: dict) -> dict:
    """The calibrated profile: ``base`` (profile JSON) with the measured numbers of ``m``.

    ``m`` may lack steps (budget spent, or a step failed): their numbers stay the base profile's
    (the loader derives the kernel model's defaults from them) and ``calibration.not_measured``
    names them."""
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

    missing = [k for k in STEPS if k not in m]
    d["name"] = f"{base['name']}-calibrated"
    d["description"] = (f"{base['description']}; single-GPU numbers measured by megamoe calibrate ({prov['date']})"
                        + (f"; not measured (base values kept): {', '.join(missing)}" if missing else ""))
    d["gpu"]["num_sms"] = {"value": prov["num_sms"], "unit": "count", "source": src}
    if prov.get("l2_bytes"):
        d["gpu"]["l2_bytes"] = num(prov["l2_bytes"], "bytes")
    km = {}
    if "launch" in m:
        d["gpu"]["kernel_launch_s"] = num(m["launch"]["launch_gap_s"], "s")
        km["launch_gap_s"] = num(m["launch"]["launch_gap_s"], "s")
        km["graph_fixed_s"] = num(m["launch"]["graph_fixed_s"], "s")
    if "sync" in m:
        d["gpu"]["grid_sync_s"] = num(m["sync"]["grid_barrier_s"], "s")
        km["flag_handoff_s"] = num(m["sync"]["flag_handoff_s"], "s")
        km["grid_barrier_s"] = num(m["sync"]["grid_barrier_s"], "s")
        km["ticket_s"] = num(max(m["sync"]["ticket_s"], 0.0), "s")
    if "serial" in m:
        km["serial_load_step_s"] = num(max(m["serial"]["serial_load_step_s"], 0.0), "s")
        km["serial_reduce_step_s"] = num(max(m["serial"]["serial_reduce_step_s"], 0.0), "s")
        if serial_width_points(m["serial"]):
            km["serial_reduce_width"] = table("s", ["width"], serial_width_points(m["serial"]),
                                              "seconds per dependent top-1 pass of one program over 16 rows of "
                                              "width fp32 scores (the row's BLOCK_E; serial_reduce_step_s is their "
                                              "median); read behind cost.USE_REDUCE_STEP_BY_WIDTH")
    if "hbm" in m:
        read_peak = max(p[2] for p in m["hbm"]["points"])
        d["hbm"]["bandwidth_bytes_per_s"] = num(read_peak, "bytes/s")
        d["hbm"]["efficiency"] = {"value": 1.0, "unit": "fraction",
                                  "source": src + " (the measured rate is the achievable one)"}
        km["l2_bandwidth_bytes_per_s"] = num(m["hbm"]["l2_bytes_per_s"], "bytes/s")
        km["hbm_read"] = table("bytes/s", ["programs_in_flight", "bytes_per_program"], m["hbm"]["points"])
        if m["hbm"].get("points_tma"):
            km["hbm_read_tma"] = table("bytes/s", ["programs_in_flight", "bytes_per_program"], m["hbm"]["points_tma"],
                                       "the GEMM-loop reader with its weight tiles through a TMA descriptor "
                                       "(stream_tile_tma, the tile reader's stages): read for TMA-fed weights")
    if "mma" in m:
        occ = m["mma"]["occupancy"] or {4: 2, 8: 1}
        if m["mma"].get("points_pointer"):  # a diagnosis the cost model does not read (hardware._KM_TABLES)
            km["mma_pointer"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"],
                                      m["mma"]["points_pointer"],
                                      "L2-fed tiles by pointer loads (cp.async), 3 and 4 stages; recorded, not read")
        if m["mma"].get("dense_flops_per_s"):
            km["mma_sustained_flops_per_s"] = num(m["mma"]["dense_flops_per_s"], "flop/s")
        km["mma"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], m["mma"]["points"],
                          "bf16, L2-resident operands, 8 programs per SM launched")
        km["occupancy"] = table("programs per SM", ["num_warps"], sorted([int(w), o] for w, o in occ.items()),
                                "from the mma microbench kernels' registers and shared memory")
    if "gemm" in m:
        src_g = f"dense {GEMM_MN} x {GEMM_MN} x depth bf16 GEMM of these tiles, grouped order, operands from HBM"
        for form, what in GEMM_FORMS.items():
            if f"points_{form}" in m["gemm"]:
                km[f"gemm_{form}"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"],
                                           m["gemm"][f"points_{form}"], f"{src_g}; {what}")
    if "gemm_reuse" in m:
        from megamoe.simulator.hardware import GEMM_REUSE_AXES

        src_r = ("grouped bf16 GEMM of these tiles, E experts' weights (well beyond L2, from HBM) each read by "
                 "row_blocks row blocks, grouped order (kernels/microbench_gemm.reuse_gemm); recorded, not "
                 "read by the cost model")
        for form, what in GEMM_FORMS.items():
            if m["gemm_reuse"].get(f"points_{form}"):
                km[f"gemm_reuse_{form}"] = table("flop/s per SM", list(GEMM_REUSE_AXES),
                                                 m["gemm_reuse"][f"points_{form}"], f"{src_r}; {what}")
    if "mma_fp8" in m:
        km["mma_fp8"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], m["mma_fp8"]["points"],
                              "e4m3 x e4m3, fp32 accumulate, operands on chip, 8 programs per SM launched")
    if "l2_shared" in m:
        km["l2_shared_read"] = table("bytes/s", ["programs", "sharing_group"], m["l2_shared"]["points"],
                                     "P programs sweeping one L2-resident working set of weight tiles by the GEMM "
                                     "loop's loads, groups of g consecutive programs reading the same tile at once; "
                                     "read behind cost.USE_L2_SHARED_READ")
    if m.get("hbm_deep", {}).get("points"):
        from megamoe.simulator.hardware import HBM_DEEP_AXES

        km["hbm_deep_read"] = table("bytes/s", list(HBM_DEEP_AXES), m["hbm_deep"]["points"],
                                    "P programs (one per SM) streaming weight tiles from a cold L2 through GEMM 1's "
                                    "tile loops (kernels/microbench_deep.py), each keeping bytes_in_flight of weight "
                                    "tiles in its pipeline buffers, groups of g consecutive programs reading the same "
                                    "tiles at once; bytes/s the programs read (g x the DRAM rate); read behind "
                                    "cost.USE_TASK_DEEP_READ")
    if m.get("sustained", {}).get("points"):
        su = m["sustained"]
        km["sustained_mma"] = table("fraction", ["busy_s"], su["points"],
                                    f"cuBLAS {su.get('size', SUSTAINED_SIZE)}^3 bf16 matmuls back to back in one CUDA "
                                    f"graph after {su.get('pause_s', SUSTAINED_PAUSE_S):g} s idle: the average rate "
                                    "over the graph's busy_s seconds / the best graph's "
                                    f"({su['reference_flops_per_s'] / 1e12:.1f} TFLOP/s, the short-launch rate); "
                                    "read behind cost.USE_SUSTAINED_CLOCKS")
        if duty_points(su):
            km["sustained_duty"] = table("fraction", ["duty"], duty_points(su),
                                         "matmuls a share of a long graph's time (HBM reads between): the fall of "
                                         "their rate over the fall of matmuls back to back for as long; read behind "
                                         "cost.USE_SUSTAINED_DUTY")
    if "select" in m:
        km["route_select"] = table("s", ["router", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC"], m["select"]["points"],
                                   "seconds of one routing program's selection per block of BLOCK_T tokens "
                                   "(kernels/microbench_route.py: routing._route_block on random fp32 logits); "
                                   "router: 1 + its code, routing.ROUTER_CODES (microbench_route.select_key)")
    if "serial_programs" in m:
        sp = m["serial_programs"]

        def steps_table(key, note):  # a step that timed at or below zero: the table leaves its point out
            pts = [[P, t] for P, t in sp[key] if t > 0]
            if pts:
                km[f"serial_{key}_step"] = table("s", ["programs"], pts, note)

        steps_table("load", "seconds per router load + dot step, P programs at once (own rows, shared weights); "
                            "recorded, not read")
        steps_table("reduce", "seconds per dependent top-1 pass, P programs at once; recorded, not read")
        steps_table("chain", "seconds per step of a dependent chain (each step's address from the last load), "
                             "P programs at once; recorded, not read")
    if "copy" in m:
        copy_pts = m["copy"]["points"]
        near16 = min(copy_pts, key=lambda p: abs(p[0] - 16))
        d["sm"]["copy_bytes_per_s"] = num(near16[1], "bytes/s")
        km["sm_copy"] = table("bytes/s per SM", ["copying_sms"], copy_pts, "gather of 7168-wide bf16 rows")
    d["kernel_model"] = km
    d["calibration"] = {**prov, "measured": [k for k in STEPS if k in m], "not_measured": missing}
    return d


def provenance() -> dict:
    """GPU, versions, date and the code's commit (kernels.bench.git_state: HEAD and a dirty flag, or
    MEGAMOE_COMMIT on a copied tree), as every results row records them."""
    import torch
    import triton

    from megamoe.kernels.bench import git_state

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            **git_state(), "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
            "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "num_sms": int(props.multi_processor_count), "l2_bytes": int(getattr(props, "L2_cache_size", 0))}


def _best_by_shape(points) -> list:
    """[((BM, BN, warps), best rate over depth)] of a tile table's points, by shape."""
    best = {}
    for bm, bn, w, _d, r in points:
        best[(bm, bn, w)] = max(best.get((bm, bn, w), 0.0), r)
    return sorted(best.items())


def reuse_summary(reuse: dict, S: int) -> list[str]:
    """The gemm_reuse step's lines: per loop form, shape and depth, the whole GPU's TFLOP/s at each
    row blocks per expert r, e.g. "gemm reuse tma_ab_persistent 128x256 8 warps depth 2048,
    r = 1/2/4/8/16  310.2 420.5 ... TFLOP/s"."""
    lines = []
    for form in GEMM_FORMS:
        pts = reuse.get(f"points_{form}", [])
        for shape in sorted({tuple(int(x) for x in p[:4]) for p in pts}):
            rates = sorted((int(p[4]), p[5]) for p in pts if tuple(int(x) for x in p[:4]) == shape)
            bm, bn, w, d = shape
            lines.append(f"gemm reuse {form} {bm}x{bn} {w} warps depth {d}, r = "
                         + "/".join(str(r) for r, _ in rates) + "  "
                         + " ".join(f"{v * S / 1e12:.1f}" for _, v in rates) + " TFLOP/s")
    return lines


def hbm_deep_summary(deep: dict) -> list[str]:
    """The hbm_deep step's lines: per depth and sharing group, TB/s at each program count for the
    largest bytes per program, e.g. "HBM deep read, 128 KiB in flight, g = 1, 4 MiB each, 16/33/66/132
    programs  0.80 1.60 3.00 4.40 TB/s"."""
    pts = deep.get("points", [])
    if not pts:
        return []
    b = max(p[3] for p in pts)
    progs = sorted({int(p[0]) for p in pts})
    lines = []
    for d in sorted({p[1] for p in pts}):
        for g in sorted({int(p[2]) for p in pts}):
            rates = {int(p[0]): p[4] for p in pts if p[1] == d and int(p[2]) == g and p[3] == b}
            lines.append(f"HBM deep read, {int(d) >> 10:>3} KiB in flight, g = {g}, {int(b) >> 10} KiB each, "
                         + "/".join(map(str, progs)) + " programs  "
                         + " ".join(f"{rates.get(P, 0.0) / 1e12:.2f}" for P in progs) + " TB/s")
    return lines


def sustained_summary(su: dict) -> list[str]:
    """The sustained step's lines: per graph its seconds, average rate and ratio to the best, and the
    rate of its last part, e.g. "dense bf16 GEMM from idle, 300 ms   704.6 TFLOP/s x0.884, last 206
    ms 684.8"."""
    last = {round(t1, 9): (t1 - t0, r) for t0, t1, r in su.get("marginal", [])}
    lines = []
    for (_, t, r), (_, ratio) in zip(su.get("rates", []), su.get("points", [])):
        line = f"{f'dense bf16 GEMM from idle, {t * 1e3:.0f} ms':<36} {r / 1e12:8.1f} TFLOP/s x{ratio:.3f}"
        if round(t, 9) in last:
            dt, mr = last[round(t, 9)]
            line += f", last {dt * 1e3:.0f} ms {mr / 1e12:.1f}"
        lines.append(line)
    if "recovery" in su:
        lines.append(f"{'dense bf16 GEMM, shortest graph again':<36} {su['recovery']:8.3f} of its first time's rate")
    for d in su.get("duty", []):
        mhz = d.get("sm_clock_mhz_mean")
        label = f"dense GEMM {d['duty']:.0%} of {d['seconds'] * 1e3:.0f} ms"
        lines.append(f"{label:<36} x{d['rate_ratio']:.3f} of the short rate (matmuls {d['matmul_share']:.0%} of the time)"
                     + (f", SM clock mean {mhz:.0f} MHz" if mhz else ""))
    return lines


def summary(m: dict, prof: dict) -> str:
    """The measured figures as a small table (steps not measured are left out)."""
    km = prof["kernel_model"]
    lines = ["what                                 figure"]

    def add(label, key, scale, unit, fmt="8.2f"):
        if key in km:
            lines.append(f"{label:<36} {km[key]['value'] * scale:{fmt}} {unit}")

    add("launch gap in a CUDA graph", "launch_gap_s", 1e6, "us")
    add("graph replay fixed cost", "graph_fixed_s", 1e6, "us")
    if "hbm" in m:
        lines.append(f"{'streaming read, best':<36} {prof['hbm']['bandwidth_bytes_per_s']['value'] / 1e12:8.2f} TB/s")
    if "hbm_read_tma" in km:
        tma_peak = max(p[2] for p in km["hbm_read_tma"]["points"])
        lines.append(f"{'streaming read, TMA reader, best':<36} {tma_peak / 1e12:8.2f} TB/s")
    add("L2 re-read", "l2_bandwidth_bytes_per_s", 1e-12, "TB/s")
    add("dense bf16 GEMM, sustained", "mma_sustained_flops_per_s", 1e-12, "TFLOP/s")
    add("flag handoff", "flag_handoff_s", 1e6, "us")
    add("grid barrier", "grid_barrier_s", 1e6, "us")
    add("ticket (one program)", "ticket_s", 1e9, "ns", "8.1f")
    add("serial load+dot step", "serial_load_step_s", 1e9, "ns", "8.1f")
    add("serial top-1 pass", "serial_reduce_step_s", 1e9, "ns", "8.1f")
    for w, t in serial_width_points(m.get("serial", {})):
        lines.append(f"{f'serial top-1 pass, {int(w)} wide':<36} {t * 1e9:8.1f} ns")
    S = prof["gpu"]["num_sms"]["value"]
    for step, key, label in (("mma", "points", "mma {} {} warps, whole GPU     "),
                             *(("gemm", f"points_{form}", f"gemm {form:<17} {{}} {{}} warps ") for form in GEMM_FORMS),
                             ("mma_fp8", "points", "mma fp8 {} {} warps, whole GPU ")):
        for (bm, bn, w), r in _best_by_shape(m.get(step, {}).get(key, [])):
            lines.append(label.format(f"{bm:>3}x{bn:<3}", w) + f" {r * S / 1e12:8.1f} TFLOP/s")
    lines.extend(reuse_summary(m.get("gemm_reuse", {}), S))
    groups = sorted({int(g) for _, g, _ in m.get("l2_shared", {}).get("points", [])})
    for P in sorted({int(p) for p, _, _ in m.get("l2_shared", {}).get("points", [])}):
        rates = {int(g): r for p, g, r in m["l2_shared"]["points"] if int(p) == P}
        lines.append(f"L2 shared read, {P:>3} programs, g = " + "/".join(str(g) for g in groups) + "  "
                     + " ".join(f"{rates.get(g, 0.0) / 1e12:.2f}" for g in groups) + " TB/s")
    lines.extend(hbm_deep_summary(m.get("hbm_deep", {})))
    for *key, t in m.get("select", {}).get("points", []):
        r, be, k, ng, bt, way = (int(x) for x in key)
        lines.append(f"{f'route select, {ROUTERS[r - 1]} E<={be} K={k} groups {ng}, {bt} tokens, ' + ('bitonic' if way == 2 else 'maxima'):<64} {t * 1e6:8.2f} us")
    for key, label in (("load", "serial load+dot step"), ("reduce", "serial top-1 pass"), ("chain", "serial chain step")):
        for P, t in m.get("serial_programs", {}).get(key, []):
            lines.append(f"{label + f', {int(P)} programs':<36} {t * 1e9:8.1f} ns")
    lines.extend(sustained_summary(m.get("sustained", {})))
    for n, r in m.get("copy", {}).get("points", []):
        lines.append(f"gather copy, {int(n):>3} SMs, per SM          {r / 1e9:8.1f} GB/s")
    missing = prof.get("calibration", {}).get("not_measured", [])
    if missing:
        lines.append(f"not measured (the base profile's numbers kept): {', '.join(missing)}")
    return "\n".join(lines)


#: the steps in run order; sync last: its spin kernels (every program resident) are the ones that could hang
STEPS = ("launch", "hbm", "mma", "gemm", "gemm_reuse", "mma_fp8", "copy", "serial", "select", "l2_shared",
         "hbm_deep", "serial_programs", "sustained", "sync")
#: rough seconds of each step on an H200 with a cold Triton cache, (full, --quick): compiles dominate.
#: Guesses, used only to plan a --budget: a step runs in full if it and the quick form of every later
#: step fit, in its quick form if that fits, otherwise not at all
#: (full, quick) seconds per step, for the budget's plan: about twice what H200 runs AJ and AM took in
#: full (calibrate.log: launch 1.6-1.8, hbm 7.7-10.5, mma 6.4-9.1, gemm 21, gemm_reuse 13.7, mma_fp8 1.9-2.6,
#: copy 0.6, serial 0.7-1.2, l2_shared 0.4-0.6, serial_programs 1.4-2.1, sync 0.6-1.0). Run AM's budget of
#: 150 s ran gemm quick under the older, threefold figures, and its validation priced the multi path's GEMMs
#: from the quick tables (multi 7.9% median against 4.9% re-predicted with run AJ's full tables).
STEP_COST_S = {"launch": (4.0, 4.0), "hbm": (20.0, 8.0), "mma": (18.0, 8.0), "gemm": (50.0, 18.0),
               "gemm_reuse": (36.0, 15.0), "mma_fp8": (6.0, 4.0), "copy": (3.0, 2.0),
               "serial": (4.0, 3.0), "select": (18.0, 9.0), "l2_shared": (3.0, 2.0), "hbm_deep": (5.0, 3.0),
               "serial_programs": (5.0, 3.0), "sustained": (20.0, 6.0), "sync": (4.0, 3.0)}
#: ("select": 15.6 s in H200 run AT, 17 cases; "hbm_deep": 2.3 s in run AU, full; run AW: gemm 27.6 s and
#: gemm_reuse 13.0 s in one sweep, select 16.8, sustained 9.7; run AY, two sweeps: gemm 24.2, gemm_reuse 15.0; later sweeps only time)
#: ("sustained": not yet run on a GPU; its pauses and graphs, 6 x 1.5 s + 0.54 s (quick 3 x 1.5 s + 0.38 s),
#: and about 0.2 s of buffers, captures and the per-matmul timing: about 9.7 s, quick 4.9 s)
STEP_TIMEOUT_S = 120.0  # one step longer than this is taken for a hang (the watchdog ends the run)
RESERVE_S = 5.0  # kept back from the budget for writing the profile


def plan_step(name: str, left_s: float, quick: bool) -> str | None:
    """"full", "quick" or None (skip) for step ``name`` with ``left_s`` seconds of budget left."""
    later = STEPS[STEPS.index(name) + 1:]
    rest = sum(STEP_COST_S[k][1] for k in later)
    full, fast = STEP_COST_S[name]
    if not quick and left_s >= full + rest + RESERVE_S:
        return "full"
    if left_s >= fast + RESERVE_S:
        return "quick"
    return None


#: sweeps of the gemm and gemm_reuse steps, each point's median rate kept. Why: run AW (49) measured
#: every loop form's 128 x 256 tile at depth 1024 at 0.84-0.89x the 13 calibrations before it (3.78
#: against 4.18-4.48 per-SM TFLOP/s, the same shape consecutive in the sweep: a transient clock dip),
#: and Qwen3-30B-A3B's prefill rows came out 8-11% slower in the prediction. Run AY (51) kept the best
#: of two sweeps: the points' best / worst reached 1.06 in the gemm step and 1.17 in gemm_reuse, and
#: the best rates priced the megakernel's Qwen3-30B-A3B prefill rows 16-20% fast; the median of three
#: drops one dip either way. A later sweep costs only its timing (the first compiles the kernels).
GEMM_PASSES = 3


def median_of_passes(measure, passes: int) -> dict:
    """``measure()`` run ``passes`` times; each "points_*" table's point (every field but the last,
    the rate, as its key) keeps the median of its rates (the upper median of an even count); the
    other fields are the first sweep's, and "pass_spread" says per table the largest ratio of a
    point's best rate to its worst."""
    runs = [measure() for _ in range(max(1, int(passes)))]
    out = dict(runs[0])
    spread = {}
    for key, pts in runs[0].items():
        if not key.startswith("points_") or not isinstance(pts, list):
            continue
        seen: dict[tuple, list] = {}
        for run in runs:
            for p in run.get(key, ()):
                seen.setdefault(tuple(p[:-1]), []).append(list(p))
        mid = {k: sorted(v, key=lambda p: p[-1])[len(v) // 2] for k, v in seen.items()}
        out[key] = [mid[tuple(p[:-1])] for p in pts]  # the first sweep's order
        spread[key] = max((max(p[-1] for p in v) / min(p[-1] for p in v) for v in seen.values()
                           if min(p[-1] for p in v) > 0), default=1.0)
    if passes > 1:
        out["passes"] = len(runs)
        out["pass_spread"] = spread
    return out


def _measure(name: str, reps: int, S: int, gap_s: float, quick: bool) -> dict:
    if name == "launch":
        return measure_launch(reps)
    if name == "sync":
        return measure_sync(reps, S, quick)
    if name == "hbm":
        return measure_hbm(reps, S, gap_s, quick)
    if name == "mma":
        return measure_mma(reps, S, gap_s, quick)
    if name == "gemm":
        return median_of_passes(lambda: measure_gemm(reps, S, gap_s, quick), GEMM_PASSES)
    if name == "gemm_reuse":
        return median_of_passes(lambda: measure_gemm_reuse(reps, S, gap_s, quick), GEMM_PASSES)
    if name == "mma_fp8":
        return measure_mma_fp8(reps, S, gap_s, quick)
    if name == "copy":
        return measure_copy(reps, S, quick)
    if name == "serial":
        return measure_serial(reps)
    if name == "select":
        return measure_select(reps, quick)
    if name == "l2_shared":
        return measure_l2_shared(reps, S, gap_s, quick)
    if name == "hbm_deep":
        return measure_hbm_deep(reps, S, quick)
    if name == "serial_programs":
        return measure_serial_programs(reps, S, quick)
    if name == "sustained":
        return measure_sustained(reps, quick)
    raise ValueError(f"unknown step {name!r}")


def _cuda_alive() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any failure: the context is gone
        return False


def run(args: argparse.Namespace) -> int:
    """Measure every step that the budget allows; profile.json and microbench.json are rewritten
    after each step, so a run cut short (budget, watchdog, kill) leaves the steps it finished."""
    from .deadline import Budget, Watchdog, command_start

    if args.budget is not None and not args.budget > 0:
        print(f"megamoe calibrate: --budget must be a positive number of seconds, got {args.budget}", file=sys.stderr)
        return 2
    if args.reps < 1:
        print(f"megamoe calibrate: --reps must be >= 1, got {args.reps}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as exc:
        print(f"megamoe calibrate: needs torch and triton: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("megamoe calibrate: needs a CUDA GPU (the microbenchmarks time the device)", file=sys.stderr)
        return 2
    from megamoe.simulator.hardware import ProfileError, load_profile, validate

    budget = Budget(args.budget, start=command_start())  # the seconds spent importing count too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = load_profile(args.base).to_dict()
    prov = provenance()
    S = prov["num_sms"]
    m: dict = {}
    errors: dict = {}
    skipped: dict = {}

    def log(msg: str) -> None:
        print(f"calibrate {budget.stamp()} {msg}", file=sys.stderr, flush=True)

    def write(step: str | None = None) -> dict:
        prov["wall_s"] = round(budget.elapsed(), 1)
        prof = build_profile(base, m, prov)
        try:
            validate(prof, origin="calibrated profile")  # the loader must accept what we write
        except ProfileError as exc:
            if step not in m:
                raise
            errors[step] = f"its numbers do not make a valid profile: {exc}"[:500]  # drop them, keep the rest
            log(f"{step}: {errors[step]}")
            del m[step]
            prof = build_profile(base, m, prov)
            validate(prof, origin="calibrated profile")
        prof["calibration"]["errors"] = dict(errors)
        prof["calibration"]["skipped"] = dict(skipped)
        (out / "microbench.json").write_text(json.dumps({"provenance": prov, "measurements": m, "errors": errors,
                                                          "skipped": skipped}, indent=1, default=str))
        (out / "profile.json").write_text(json.dumps(prof, indent=1))
        return prof

    log(f"{prov['gpu']}, {S} SMs, torch {prov['torch']}, triton {prov['triton']}; budget "
        f"{'none' if args.budget is None else f'{args.budget:.0f} s'}{', --quick' if args.quick else ''}; "
        f"steps {', '.join(STEPS)}")
    watchdog = Watchdog(lambda what: log(f"{what}: no result; profile.json holds the steps before it"),
                        name="megamoe calibrate")
    try:
        for name in STEPS:
            mode = plan_step(name, budget.left(), args.quick)
            if mode is None:
                skipped[name] = f"budget: {budget.left():.0f} s left"
                log(f"{name}: skipped ({skipped[name]}); the base profile's numbers stay")
                continue
            gap_s = m["launch"]["launch_gap_s"] if "launch" in m else base["gpu"]["kernel_launch_s"]["value"]
            log(f"{name}: start ({mode})")
            t = time.perf_counter()
            watchdog.arm(min(STEP_TIMEOUT_S, max(budget.left(), 0.0) + 15.0), f"calibrate step {name}")
            try:
                m[name] = _measure(name, args.reps, S, gap_s, mode == "quick")
                if mode == "quick" and not args.quick:
                    skipped[name] = "measured in its quick form (budget)"
            except Exception as exc:  # noqa: BLE001 - the other steps are still worth having
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
                log(f"{name}: FAILED: {errors[name]}")
                if not _cuda_alive():
                    log("the CUDA context was lost: no further steps")
                    break
            finally:
                watchdog.disarm()
            write(name)
            log(f"{name}: done in {time.perf_counter() - t:.1f} s")
    finally:
        watchdog.close()
    prof = write()
    print(summary(m, prof))
    print(f"wrote {out / 'profile.json'} and {out / 'microbench.json'} ({prov['wall_s']} s; measured "
          f"{', '.join(prof['calibration']['measured']) or 'nothing'})")
    return 0 if m else 1
