"""The cost model's primitives and launches: from a launch plan or rows per expert to seconds on one GPU.

Shape legend: P programs of a launch (or of the persistent kernel), S SMs, o programs resident per
SM, n programs in flight, BM/BN/BK tile rows/columns/depth, E experts.

Everything that computes a GEMM's (or any kernel's) time in megamoe calls the primitives here (the
persistent megakernel's task plan too: ``task_cost`` prices it from them); the profile
(``hardware.Profile``, its ``kernel`` section calibrated by ``megamoe calibrate``) holds every
number they use:

    o(warps)          = occupancy table of the profile (programs per SM by num_warps)
    mma(BM, BN, BK)   = per-SM tensor rate of that tile shape (calibrated table, nearest shape,
                        log-interpolated in depth; without one: peak / S x gemm_efficiency(BM));
                        fp8: the calibrated fp8 table, else the bf16 one x the fp8/bf16 peak ratio
    hbm(n, b)         = aggregate streaming-read rate with n programs in flight reading b bytes
                        each (calibrated grid kernel_model.hbm_read, bilinear in log n, log b;
                        without one: HBM rate x min(1, n / S)): a launch, its programs starting
                        together. Weights read through TMA descriptors price at the same grid (the
                        TMA reader's kernel_model.hbm_read_tma is recorded, not read)
    hbm_stream(n)     = the same grid's marginal rate between its two largest b: programs that
                        keep streaming (the persistent megakernel's tasks, back to back)

A launch (``predict_stage``), P working programs in groups g (experts) of n_g programs:

    slots     = S x o(warps)   waves = ceil(P / slots)
    share     = min(o, ceil(min(P, slots) / S))        (programs sharing one SM's tensor cores)
    program_g = flops / (mma(tile, rows_g) / share)
    compute   = max(waves x mean program time, longest program)     (a wave lasts its longest tile)
    memory    = the first wave's DRAM bytes / hbm(min(P, slots), DRAM bytes / P) + the later waves'
                / hbm_stream(min(P, slots))  (``launch_read_s``; DRAM bytes: L2 model of grouped
                tile order, ``dram_bytes``), and L2-hit bytes / L2 rate where calibrated,
                and the SMs' intake: ceil(P / S) programs' bytes at an SM's share of the L2 rate
                (``sm_ingest_s``: few waves of large tiles, two on some SMs, one on others); the
                largest of the three is the stage's ``memory_term`` (MEMORY_TERMS)
    serial    = waves x (load steps x serial_load_step_s + reductions x serial_reduce_step_s)
    time      = launch_gap + max(compute, memory, serial) + waves x task_overhead
                (USE_WINDOW_ROOFLINE: also the sum over the sliding window of programs in flight of
                each window's largest term share, in the max)

A plan of launches is their sum plus the CUDA graph's fixed cost per call.

A task plan of the persistent megakernel (``reference.tiles.TaskPlan``) is priced by
``task_cost.predict_task_plan`` from the same primitives; the switches below that name its
tasks are read there, at call time, as ``cost.USE_*``.

Switches (``USE_*``): each hypothesis is added off, and turned on once GPU runs that predict with it
before they measure (``megamoe validate --variant``) find it better. Each reads its table only where
the profile has it (a profile without it predicts as with the switch off). Those that held-out runs or
re-predictions of stored rows found no better were removed with their code (simulator/README.md,
"Removed switches"):

    USE_L2_SHARED_READ      (on after run AH; held out by run AJ: 5.3% / 21.7%) a launch's L2-hit bytes at
                            kernel_model.l2_shared_read (P programs, sharing group g: programs
                            reading the same tile at once) instead of l2_bandwidth_bytes_per_s:
                            its weight hits at g = min(GROUP_M, row blocks), its row hits at
                            g = min(N tiles, in flight // that) (``stage_l2_hit_s``)
    USE_L2_READ_DEPTH       a launch's or task's L2 reads (its L2-hit bytes and the SMs' intake) by the
                            bytes its programs keep in flight: programs deeper than the l2_shared step's
                            reader (L2_SHARED_READER_DEPTH_BYTES) read the shared-read table at the
                            readers they are worth, in_flight x depth / the reader's depth
                            (``l2_readers``: Little's law, the table's programs axis is bytes in flight),
                            clamped at its edge; the intake's per-SM rate at least l2_bandwidth / S
                            (``l2_intake_rate``). Depth: a launch's ``shared_bytes``, the megakernel's
                            ``read_depth`` (its GEMM tasks' pipeline buffers)
    USE_TASK_DEEP_READ      the megakernel's GEMM tasks' DRAM bytes (``task_cost.task_read_curves``): streaming at the
                            deep readers' table (kernel_model.hbm_deep_read) at the weight bytes their
                            kind's loop keeps in flight (``weight_depth``) and the programs busy, where the
                            table covers that depth; and a cohort (consecutive tickets released at the same
                            instant onto idle programs: GEMM 1 after the top-k) at the one-shot rate of the
                            programs then reading, at its tasks' bytes (deep table, else the hbm grid), not
                            at the marginal rate for the few programs busy as its first tasks are placed.
                            The tasks' L2-hit part keeps the grid's busy-programs curve
    USE_L2_MANY_READERS     the shared-read table (kernel_model.l2_shared_read) read at its programs past
                            2S where the profile measured them (calibrate's l2_shared step: up to 3S);
                            off (the default): at most 2S, the table's old edge (``l2_shared_rate``)
    USE_TASK_PROLOGUE       a megakernel routed GEMM task's compute term plus its dependent round trips
                            (reference.tiles.TASK_ROUND_TRIPS, from the kernel's code) at the calibrated
                            atomic round trip ticket_s: the waits, row-index loads and signal around the
                            K loop that the dense-GEMM tables do not time
    USE_WINDOW_ROOFLINE     a grouped GEMM launch's terms overlapped only within its window of programs
                            in flight (``window_shares``): the sum over the window's positions (``slots``
                            consecutive programs sliding along the launch order) of the largest of the
                            window's shares of the compute, DRAM, L2-hit and intake terms, where that
                            exceeds the largest whole-launch term (``StagePrediction.windows_us``);
                            skewed routings put the HBM-bound light experts and the compute- or
                            L2-bound heavy ones in different parts of the launch
    USE_TASK_STREAM_SHARE   a megakernel task's DRAM bytes at its share of the read rate over its whole life
                            (the programs executing around it, time-averaged, by re-running the list
                            schedule) instead of the share for the programs busy at its start: a phase's
                            last, partial wave streams faster as the other programs finish
    USE_SHALLOW_DEEP_READ   (off) USE_TASK_DEEP_READ's deep table also for GEMM tasks keeping less in flight than
                            the hbm grid's reader (HBM_GRID_READER_DEPTH_BYTES), where the profile measured a
                            shallower reader (calibrate's hbm_deep step: 32 KiB since session 17;
                            ``deep_table_covers``), not the grid's 48 KiB rate
    USE_REDUCE_STEP_BY_WIDTH  (on after run BL) a top-k selection's dependent passes at the calibrated
                            top-1 pass for their row width (kernel_model.serial_reduce_width,
                            ``reduce_step_at_width``), not the median of the 128- and 256-wide passes
    USE_SUSTAINED_CLOCKS    a plan's MMA (compute) terms divided by the sustained-clock ratio
                            (kernel_model.sustained_mma, calibrate step sustained: a dense cuBLAS
                            GEMM's average rate over busy seconds from idle / its short-launch rate)
                            over the plan's busy window (``sustained_ratio``, ``busy_window_s``):
                            ``calls_before`` calls of the predicted call time run back to back, then
                            the ``calls_per_graph`` calls the measurement times (defaults 0 and 1: one
                            call from idle). Memory, serial, launch terms unscaled (HBM has its own
                            clock). Launch and task plans only; the rack model's GEMMs as calibrated

The rack schedules' grouped GEMMs (``stage_cost``, ``ffn_cost``) build the same launch from rows
per expert (tile height adapted to small row counts, a tuned tile width) and call the same
primitives; ``ffn_roofline_s`` is their lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..reference.sizes import ffn_flops, ffn_params, long_dtype, row_bytes, weight_bytes_per_element
from ..reference.tiles import route_select_key, tile_ids
from .hardware import GEMM_LOADS, KernelModel, Profile, load_profile

#: Activation / weight element formats the rack model takes (16-bit and wider formats run as bf16).
DTYPES = ("bf16", "fp8")
#: tile order of the grouped GEMMs when a plan does not say (Triton's GROUP_M of our configs)
DEFAULT_GROUP_M = 8


def normalize_dtype(name: str) -> str:
    """'bf16' | 'fp8' from a short or a MoEConfig.weight_dtype name."""
    if name in DTYPES:
        return name
    try:
        return "fp8" if long_dtype(name) == "fp8_e4m3" else "bf16"
    except ValueError:
        raise ValueError(f"dtype must be one of {DTYPES} (or a MoEConfig weight_dtype), got {name!r}") from None


def compute_dtype(weight_dtype: str, act_dtype: str) -> str:
    """Tensor-core format: fp8 only when both operands are fp8."""
    return "fp8" if weight_dtype == "fp8" and act_dtype == "fp8" else "bf16"


def transfer_s(num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """alpha-beta time of one message: latency + bytes / bandwidth (0 bytes: 0 s)."""
    return 0.0 if num_bytes <= 0 else latency_s + num_bytes / bandwidth_bytes_per_s


# --------------------------------------------------------------------------- primitives
def _km(profile: Profile) -> KernelModel:
    if profile.kernel is None:
        raise ValueError(f"profile {profile.name!r} has no kernel model (load it with hardware.load_profile)")
    return profile.kernel


def gemm_efficiency(rows, curve: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Fraction of tensor peak at ``rows`` rows per expert: (n,) -> (n,) (piecewise linear in log2)."""
    xs = np.log2([p[0] for p in curve])
    ys = np.array([p[1] for p in curve])
    r = np.log2(np.maximum(np.asarray(rows, dtype=np.float64), 1.0))
    return np.interp(r, xs, ys)


def occupancy(profile: Profile, num_warps: int) -> int:
    """Programs resident per SM for tiles of ``num_warps`` warps (the profile's table, the entry at
    the largest warp count <= num_warps)."""
    occ = _km(profile).occupancy
    best = occ[0][1]
    for w, o in occ:
        if w <= num_warps:
            best = o
    return max(1, int(best))


#: the dense-GEMM tables price tiles of at least this many rows. Below, the dense GEMM of the
#: microbenchmark is bound by its own operand traffic, which the cost model already counts in its
#: memory term: there the on-chip table gives the tensor rate. H200 run O: 134-205 TFLOP/s at 16
#: and 32 rows; at 64 rows 343-538, where a 64 x 128 tile's 43 flop per operand byte would need
#: 11.6 TB/s of operands at 500 TFLOP/s, more than L2 gives (7.9). Was 64 until run X; re-predicting
#: the stored rows of runs X, W, U, S and Q with 128, the multi path's median |error|: 7.9% -> 7.9%,
#: 6.2 -> 6.1, 6.4 -> 6.0, 6.9 -> 6.5, 6.6 -> 6.5 (Qwen3-30B-A3B T = 512 Zipf +17% -> +2%); DeepSeek-V3
#: T = 64 Zipf megakernel -12% -> -15% (re-predictions with the SMs' intake term, not predictions)
GEMM_TABLE_MIN_ROWS = 128


#: how the megakernel's GEMM tasks load their operands (hardware.GEMM_LOADS), by its weight loads
#: ("pointer": cp.async; "tma": descriptors, config "tma_weights"; rows by pointer either way), in
#: persistent programs that walk the tickets; GEMM 1 tasks with gate and up accumulators, the others one
MEGAKERNEL_LOADS = {"pointer": {"gated": "pointer_persistent_gated", "other": "pointer_persistent"},
                    "tma": {"gated": "tma_persistent_gated", "other": "tma_persistent"}}
#: the megakernel's task kinds with gate and up accumulators
GATED_KINDS = ("gemm1", "shared_gemm1", "expert_slice")
#: the megakernel's GEMM task kinds: their gathered rows are an operand an L2 model can re-hit
GEMM_KINDS = ("gemm1", "gemm2", "shared_gemm1", "shared_gemm2", "expert_slice")


#: the model terms a prediction's time can be bound by, as the validation report names them: a
#: stage's or task's bound ("compute", "serial", "launch"; "wait": a megakernel kind on the
#: critical path through its waits) and, for "memory", which memory term (StagePrediction.memory_term;
#: a task's "l2" where its L2-hit bytes set its memory time, else "hbm")
BOUND_TERMS = {"compute": "MMA rate (the tile loop's dense-GEMM / mma table)",
               "serial": "dependent serial steps (serial_load_step_s, serial_reduce_step_s)",
               "launch": "launch gap and graph fixed cost", "wait": "waits on counters and flag handoffs"}
MEMORY_TERMS = {"hbm": "HBM streaming (DRAM bytes at the calibrated read curve, hbm_read)",
                "l2": "L2-hit bytes at the calibrated L2 rate (a launch's: the shared-read table "
                      "l2_shared_read where calibrated; otherwise l2_bandwidth_bytes_per_s)",
                "sm_intake": "the SMs' intake (an SM's share of the L2 rate, sm_ingest_s)"}


def term_name(bound: str, memory_term: str | None = None) -> str:
    """The report's name of the model term behind a bound (BOUND_TERMS, MEMORY_TERMS)."""
    if bound == "memory":
        return MEMORY_TERMS.get(memory_term or "hbm", MEMORY_TERMS["hbm"])
    return BOUND_TERMS.get(bound, bound)


def _of_kinds(kind: np.ndarray, kinds: list, names) -> np.ndarray:
    """(n,) bool: the tasks (kind codes into ``kinds``, a plan's list) of a kind in ``names``
    (names the plan does not have match nothing: a stored plan of older kinds)."""
    return np.isin(kind, [kinds.index(k) for k in names if k in kinds])


def mma_rate_per_sm(profile: Profile, block_m, block_n, depth, num_warps, rows=None, *, dtype: str = "bf16",
                    loads: str = "any"):
    """Tensor FLOP/s of one SM running tiles (BM x BN, reduction ``depth``) at full occupancy, for
    ``dtype`` "bf16" or "fp8" (e4m3 x e4m3, fp32 accumulate).

    Arrays broadcast. Calibrated: the table's nearest (BM, BN, warps) shape in log distance, its
    rate interpolated in log2(depth), at most ``mma_sustained_flops_per_s`` / SMs (a large dense
    GEMM's measured rate: the table's on-chip bursts run at clocks a real GEMM does not keep); fp8 reads the measured fp8 table (``kernel_model.mma_fp8``)
    where the profile has one, otherwise the bf16 table scaled by the fp8/bf16 peak ratio. Without
    a bf16 table: the peak per SM x gemm_efficiency read at the tile height BM (the launch model's
    reading, which matched the H200 runs; the rack model used to read it at rows per expert).
    ``rows`` (rows per expert) is accepted for a future curve over it and unused today.
    ``loads``: how the kernel brings its operands, a key of hardware.GEMM_LOADS ("pointer": the
    pointer GEMMs, one tile per program; "pointer_persistent": the megakernel; "tma_persistent" /
    "tma_ab_persistent": GEMM 1 / GEMM 2 of the persistent TMA GEMMs, ...): bf16 then reads the
    dense-GEMM table of that tile loop (``kernel_model.gemm_<loads>``, kernels/microbench_gemm.py:
    operands from HBM, a grouped tile order, waves and stores) where the profile has it, or its
    fallback; "any" (the rack model) and profiles without one read the on-chip table. (The L2-fed pointer table ``mma_pointer`` is
    recorded, not read: H200 run M measured it at 205-333 TFLOP/s at 128 x 128, below the
    megakernel's own tiles, 459, and reading it doubled the prefill predictions.)"""
    if loads != "any" and loads not in GEMM_LOADS:
        raise ValueError(f"loads must be 'any' or one of {sorted(GEMM_LOADS)}, got {loads!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    km = _km(profile)
    bm = np.asarray(block_m, dtype=np.float64)
    if dtype == "fp8" and km.mma_fp8:
        return _table_rate(km.mma_fp8, bm, block_n, depth, num_warps)
    if not km.mma:  # the efficiency curve read at the tile height, as the H200 runs fit best
        return profile.tensor_flops_per_s[dtype] / profile.num_sms * gemm_efficiency(bm, profile.gemm_efficiency)
    scale = profile.tensor_flops_per_s[dtype] / profile.tensor_flops_per_s["bf16"]
    rate = _table_rate(km.mma, bm, block_n, depth, num_warps)
    gemm = km.gemm_table(loads) if loads != "any" else ()
    if gemm:  # tiles of GEMM_TABLE_MIN_ROWS+ rows: the dense GEMM's rate (below, it is bound by its operand traffic)
        rate = np.where(bm >= GEMM_TABLE_MIN_ROWS, _table_rate(gemm, bm, block_n, depth, num_warps), rate)
        rate = rate if np.ndim(rate) else float(rate)
    if km.mma_sustained_flops_per_s > 0:  # on-chip bursts capped at what a large dense GEMM sustains
        rate = np.minimum(rate, km.mma_sustained_flops_per_s / profile.num_sms)
        rate = rate if np.ndim(rate) else float(rate)
    return rate * scale


def _nearest_shape(shapes: np.ndarray, block_m, block_n, num_warps) -> np.ndarray:
    """Index into ``shapes`` ((n, 3): BLOCK_M, BLOCK_N, warps) of the calibrated tile shape nearest
    each query (arrays broadcast): squared log2 distance, warps weighted a quarter."""
    bm, bn, w = (np.asarray(v, dtype=np.float64)[..., None] for v in (block_m, block_n, num_warps))
    dist = np.log2(bm / shapes[:, 0]) ** 2 + np.log2(bn / shapes[:, 1]) ** 2 + 0.25 * np.log2(w / shapes[:, 2]) ** 2
    return np.argmin(dist, axis=-1)


def _table_rate(table: tuple, block_m, block_n, depth, num_warps):
    """A calibrated mma table ((BM, BN, warps, depth, flop/s per SM), ...) read at the nearest
    (BM, BN, warps) shape in log distance, interpolated in log2(depth); a float for scalar inputs."""
    bm = np.asarray(block_m, dtype=np.float64)
    bn = np.asarray(block_n, dtype=np.float64)
    dp = np.maximum(np.asarray(depth, dtype=np.float64), 1.0)
    w = np.asarray(num_warps, dtype=np.float64)
    bm, bn, dp, w = np.broadcast_arrays(bm, bn, dp, w)
    tab = np.asarray(table)  # (m, 5)
    shapes = np.unique(tab[:, :3], axis=0)
    pick = _nearest_shape(shapes, bm, bn, w)
    out = np.empty(bm.shape)
    for j, sh in enumerate(shapes):
        m = pick == j
        if not m.any():
            continue
        rows_j = tab[np.all(tab[:, :3] == sh, axis=1)]
        rows_j = rows_j[np.argsort(rows_j[:, 3])]
        out[m] = np.interp(np.log2(dp[m]), np.log2(rows_j[:, 3]), rows_j[:, 4])
    return out if out.ndim else float(out)


def hbm_rate(profile: Profile, programs_in_flight, bytes_per_program):
    """Aggregate streaming-read bytes/s with ``programs_in_flight`` programs each reading
    ``bytes_per_program`` (kernel_model.hbm_read; arrays broadcast; bilinear in log-log, clamped at
    the grid's edges)."""
    km = _km(profile)
    return _loglog_grid(km.hbm_programs, km.hbm_bytes, km.hbm_rate, programs_in_flight, bytes_per_program)


def _loglog_grid(rows, cols, table, x, y):
    """table (len(rows), len(cols)) at (x, y) (arrays broadcast): linear in log2 of both
    coordinates, along y within each row, then between the rows; clamped at the grid's edges."""
    ns = np.log2(np.asarray(rows, dtype=np.float64))
    bs = np.log2(np.asarray(cols, dtype=np.float64))
    rate = np.asarray(table, dtype=np.float64)  # (n, m)
    n = np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0))
    b = np.log2(np.maximum(np.asarray(y, dtype=np.float64), 1.0))
    n, b = np.broadcast_arrays(n, b)
    along_b = np.stack([np.interp(b, bs, rate[i]) for i in range(rate.shape[0])], axis=-1)  # (..., n)
    if ns.size == 1:
        out = along_b[..., 0]
    else:
        i = np.clip(np.searchsorted(ns, n) - 1, 0, ns.size - 2)
        f = np.clip((n - ns[i]) / (ns[i + 1] - ns[i]), 0.0, 1.0)
        lo = np.take_along_axis(along_b, i[..., None], -1)[..., 0]
        hi = np.take_along_axis(along_b, (i + 1)[..., None], -1)[..., 0]
        out = lo + f * (hi - lo)
    return out if out.ndim else float(out)


def hbm_stream_rate(profile: Profile, programs_in_flight):
    """Aggregate bytes/s of programs that keep streaming (a persistent kernel's tasks, back to back):
    the marginal rate of the calibrated grid between its two largest bytes per program,
    n (b2 - b1) / (t2 - t1) with t = n b / hbm_rate(n, b), so the one-shot launch's ramp (programs
    starting together, first loads in flight) is not charged to every task (linear in log2 n).
    A grid with one bytes column: its rates."""
    km = _km(profile)
    bs = np.asarray(km.hbm_bytes, dtype=np.float64)
    ns = np.asarray(km.hbm_programs, dtype=np.float64)
    rate = np.asarray(km.hbm_rate, dtype=np.float64)
    if bs.size < 2:
        col = rate[:, 0]
    else:
        t1, t2 = ns * bs[-2] / rate[:, -2], ns * bs[-1] / rate[:, -1]
        col = np.where(t2 > t1, ns * (bs[-1] - bs[-2]) / np.maximum(t2 - t1, 1e-30), rate[:, -1])
        col = np.maximum(col, rate[:, -1])  # never below the one-shot rate of the same programs
    n = np.log2(np.maximum(np.asarray(programs_in_flight, dtype=np.float64), 1.0))
    out = np.interp(n, np.log2(ns), col)
    return out if np.ndim(out) else float(out)


def hbm_peak(profile: Profile) -> float:
    """The highest streaming-read rate in the profile's table (the floor's rate)."""
    return float(np.max(_km(profile).hbm_rate))


#: whether a launch's L2-hit bytes price at the shared-read table (kernel_model.l2_shared_read:
#: aggregate L2 bytes/s of P programs reading the same tiles in groups of g at once,
#: kernels/microbench_shared.py) for their sharing group (``stage_l2_hit_s``) where a profile has
#: it, instead of l2_bandwidth_bytes_per_s (the hypothesis of H200 run 33: DeepSeek-V3 T = 512
#: Zipf's GEMM 1 moves ~8.7 TB/s through L2, above the 7.8 of programs re-reading their own data).
#: On after run AH (34), its table's first calibration: its 108 stored rows re-predicted with its
#: profile, median |error| 5.9% -> 5.1% (multi 5.4 -> 5.0, GEMM 1 stage median |error| 8.0 -> 5.4),
#: max 21.7% -> 21.7%; run AG's profile has no table (unchanged). What moved is not the hypothesis
#: above: the prefill GEMMs of 8 warps (one program per SM, 132 in flight) read the table at
#: 132 programs, 6.3 TB/s at every group, below the 7.8 of l2_bandwidth_bytes_per_s, and
#: Mixtral-8x7B / DeepSeek-V3 T >= 4096 multi went from -3..-12% to -11..+6%; DeepSeek-V3 T = 512
#: Zipf stays +14%. The switch does not price the SMs' intake (``sm_ingest_s``). Held out by run AJ
#: (36), predicted before measured: 5.3% median, 21.7% max (multi 4.9%), against run AH's 5.9%
#: without it.
USE_L2_SHARED_READ = True
#: whether the shared-read table is read past 2S programs where a profile measured it there (calibrate's
#: l2_shared step takes 3S since run BA: the 8-warp GEMMs' 144-200 KiB in flight are worth 400-550 of
#: its 48 KiB readers, ``l2_readers``; the table used to end at 2S = 264 programs, 8.35 TB/s on H200
#: run AZ, where DeepSeek-V3 T = 512 Zipf's GEMMs moved ~9-10 TB/s and were over-predicted by 15-24%
#: in every run, multi and megakernel). Off: the programs read at most at 2S, as a profile ending there
#: reads them. Off since run BA (53), which measured 9.9 TB/s at 3S (8.5 at 2S) and held both out,
#: predicted before each measurement: on 6.1% median / 18.5% max / 5 outside 15%, off 5.6% / 19.2% / 4.
#: On fixed DeepSeek-V3 T = 512 Zipf's megakernel row (+12.6% -> +2.6%) but under-priced the 4-warp
#: launches of 64-row tiles whose deep buffers (98-164 KiB, one program per SM by shared memory) read
#: as 400+ readers: Qwen3-30B-A3B T = 64-512 concentrated / Zipf, multi -2..0% -> -9..-14%.
USE_L2_MANY_READERS = False
#: the table's programs edge that USE_L2_MANY_READERS off keeps (x SMs)
L2_READERS_OLD_EDGE = 2


def l2_shared_rate(profile: Profile, programs, group):
    """Aggregate L2 read bytes/s of ``programs`` programs reading shared tiles in groups of
    ``group`` at once (kernel_model.l2_shared_read; arrays broadcast; bilinear in log2 programs and
    log2 group, clamped at the table's edges; USE_L2_MANY_READERS off: programs at most
    L2_READERS_OLD_EDGE x SMs), or None where the profile has no table."""
    km = _km(profile)
    if not km.l2_shared_rate:
        return None
    if not USE_L2_MANY_READERS:
        programs = np.minimum(np.asarray(programs, dtype=np.float64), L2_READERS_OLD_EDGE * profile.num_sms)
    return _loglog_grid(km.l2_shared_programs, km.l2_shared_groups, km.l2_shared_rate, programs, group)


def l2_hit_rate(profile: Profile, programs, group):
    """The rate L2-hit bytes price at: the shared-read table at (programs, group) where
    ``USE_L2_SHARED_READ`` is on and the profile has the table, else l2_bandwidth_bytes_per_s."""
    km = _km(profile)
    if USE_L2_SHARED_READ and km.l2_shared_rate:
        return l2_shared_rate(profile, programs, group)
    return km.l2_bandwidth_bytes_per_s


#: bytes of weight tiles one program of the l2_shared step's reader keeps in flight
#: (kernels/microbench_shared.l2_shared_read as megamoe.calibrate.measure_l2_shared runs it: 64 x 128
#: bf16 tiles, 4 stages, 16-row mma.sync tiles, so num_stages - 1 = 3 buffers of 16 KiB, as
#: kernels/plan.gemm_shared_bytes counts a program's buffers; tests/test_cost_switches.py ties the two)
L2_SHARED_READER_DEPTH_BYTES = 48 << 10
#: whether a launch's or a megakernel task's L2 reads price by the bytes their programs keep in flight
#: (``l2_readers``). The shared-read table (and l2_bandwidth_bytes_per_s, 2S programs of the same
#: 48 KiB reader) measure 4-warp readers of 48 KiB: 6.3 TB/s at one per SM, 8.4 at two (H200 runs
#: AH-AT: linear in programs up to S, about 48 GB/s a program, i.e. latency-bound, ~1 us for 48 KiB).
#: The GEMMs of 8 warps keep 144-200 KiB in flight at one program per SM (DeepSeek-V3 T = 512 GEMM 1:
#: 147,456 bytes of buffers; the decode / prefill megakernel 160-200 KiB) and moved ~9 TB/s through L2
#: (run AT: multi GEMM 1 8.87 GB in 1,008 us; the megakernel ~9.3 GB in ~1,050 us), where the model
#: read 6.3 (hits) and 7.8 (the SMs' intake). On since runs AW-AY (49-51), held out with the other two of USE_L2_READ_DEPTH, USE_TASK_DEEP_READ, USE_SUSTAINED_CLOCKS: the
#: three together, predicted before each measurement, median 5.2% against 6.8% without (run AY), 5.1%
#: against 6.1% (run AW, re-predicted); max 21-28% either way (NOTES-gpu-runs.md, thirteenth session).
USE_L2_READ_DEPTH = True


def l2_readers(in_flight, depth) -> float:
    """The shared-read table's programs that ``in_flight`` programs each keeping ``depth`` bytes of
    operand tiles in flight are worth: in_flight x depth / L2_SHARED_READER_DEPTH_BYTES where
    ``USE_L2_READ_DEPTH`` is on and depth is above the reader's; else in_flight (as without it)."""
    n = max(1.0, float(in_flight))
    d = float(depth or 0.0)
    if not (USE_L2_READ_DEPTH and d > L2_SHARED_READER_DEPTH_BYTES):
        return n
    return n * d / L2_SHARED_READER_DEPTH_BYTES


def l2_intake_rate(profile: Profile, in_flight, depth) -> float:
    """Aggregate bytes/s the SMs take in from L2 (``sm_ingest_s``'s per-SM rate x S): l2_bandwidth_bytes_per_s,
    and where ``USE_L2_READ_DEPTH`` on deeper programs than the reader's (``l2_readers``) and the
    profile has the shared-read table, at least the table's rate at those readers and group 1."""
    km = _km(profile)
    base = km.l2_bandwidth_bytes_per_s
    n = float(in_flight)
    eq = l2_readers(n, depth)
    if eq == max(1.0, n) or not km.l2_shared_rate:
        return base
    return max(base, float(l2_shared_rate(profile, eq, 1)))


#: whether a top-k selection's dependent passes (the megakernel's router_topk tasks and, with
#: tiles["router"]["EACH"], each GEMM 1 task's routing, ``task_cost.task_costs``; the multi-launch
#: router's "select" steps where the profile has no route_select time for its key, ``predict_stage``)
#: price at the profile's top-1 pass for their row width (kernel_model.serial_reduce_width at the
#: experts E padded to a power of two, at least 16: the kernels' BLOCK_E; ``reduce_step_at_width``)
#: instead of serial_reduce_step_s, the median of calibrate's 128- and 256-wide passes (H200 run 53:
#: 0.40 and 0.96 us, median 0.68), where the profile has the table; otherwise as before. The other
#: dependent reductions (align scan / scatter / layout, ALIGN_EACH's, the fused router's align) keep the
#: scalar. Why: the megakernel trace of run 39 (Qwen3-30B-A3B T = 64 concentrated) timed its 128-wide
#: passes at ~0.39 us each against the 0.68 priced, and that model's decode megakernel rows are
#: over-predicted in every run (T = 1 +6..+15%, T = 8 Zipf +10..+17%, T = 64 concentrated +10..+15%).
#: On since H200 run BL (64) held it out: median 4.3 -> 4.2% over 108 configurations, megakernel rows
#: 5.4 -> 4.7%, the same one row outside 15% (NOTES-gpu-runs.md, simulator/README.md).
USE_REDUCE_STEP_BY_WIDTH = True


def reduce_step_at_width(profile: Profile, width: float) -> float | None:
    """Seconds of one top-1 pass over rows of ``width`` scores: kernel_model.serial_reduce_width,
    linear in log2 width between its points, clamped at its first and last; None without the table."""
    tab = _km(profile).serial_reduce_width
    if not tab:
        return None
    xs = [math.log2(float(w)) for w, _ in tab]
    return float(np.interp(math.log2(max(float(width), 1.0)), xs, [float(t) for _, t in tab]))


def selection_width(num_experts: int) -> int:
    """The width of a top-k selection's score rows: the experts padded to a power of two, at least 16
    (the routers' and the megakernel's BLOCK_E, kernels/plan.router_launch, kernels/megakernel)."""
    return max(16, 1 << max(int(num_experts) - 1, 0).bit_length())


def serial_step_s(profile: Profile, kind: str, width: float | None = None) -> float:
    """Seconds of one serial step of ``kind`` "load" (the router's load + dot step) or "reduce"
    (a dependent row reduction): kernel_model.serial_load_step_s / serial_reduce_step_s, one
    program's step, however many programs run such chains at once (the tables by programs,
    serial_load_step / serial_reduce_step, are recorded, not read). ``width``: a "reduce" that is a
    top-k selection's pass over rows of that many scores (BLOCK_E), read at
    kernel_model.serial_reduce_width where ``USE_REDUCE_STEP_BY_WIDTH`` is on and the profile has it."""
    km = _km(profile)
    if kind not in ("load", "reduce"):
        raise ValueError(f"kind must be 'load' or 'reduce', got {kind!r}")
    if kind == "load":
        return km.serial_load_step_s
    if USE_REDUCE_STEP_BY_WIDTH and width:
        at = reduce_step_at_width(profile, width)
        if at is not None:
            return at
    return km.serial_reduce_step_s


def route_select_s(profile: Profile, tile: dict) -> float | None:
    """Seconds of one routing program's selection (a router stage's ``tile``: ROUTER code, BLOCK_E, K,
    N_GROUP, BLOCK_T, BITONIC; reference.tiles.route_select_key) from the profile's measured
    kernel_model.route_select, or None where it has no point for that key (then the stage's "select"
    reductions are priced by the serial reduce step)."""
    key = route_select_key(*(tile.get(k, -2) for k in ("ROUTER", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC")))
    n = len(key)
    for p in _km(profile).route_select:
        if len(p) == n + 1 and tuple(p[:n]) == key:
            return float(p[n])
    return None


#: whether the megakernel's GEMM tasks (``GEMM_KINDS``) price their DRAM bytes by the bytes their
#: programs keep in flight and by how they start (``task_cost.task_read_curves``, ``task_cost._schedule_tasks``):
#: (a) tasks whose kind keeps more weight bytes in flight than the hbm grid's reader (``weight_depth``:
#: the megakernel's pipeline buffers of that kind's weight tiles, megamoe/scale.py
#: megakernel_weight_depth) stream at the deep readers' table (kernel_model.hbm_deep_read; its marginal
#: rate, ``deep_stream_rate``, at the programs busy, sharing group 1: DRAM bytes are already counted
#: once per weight slice) instead of the grid's marginal rate, where the profile has the table;
#: (b) a cohort, two or more consecutive tickets released at the same instant by the same waits onto
#: idle programs (GEMM 1's tasks after the top-k, GEMM 2's after GEMM 1), reads at the one-shot rate
#: of the programs then reading (the cohort and those already busy) at its tasks' bytes each
#: (``deep_read_rate``, or the grid's ``hbm_rate`` where the deep table does not cover the depth),
#: not at the marginal rate of programs that keep streaming, nor at the rate for the few programs
#: busy when its first tasks are placed. Why (simulator/README.md, issue 8's outliers): H200 run AT,
#: Qwen3-30B-A3B T = 64 megakernel, concentrated +16% (48 GEMM 1 tasks at the grid reader's
#: 48 GB/s a program; the megakernel keeps 160 KiB of weight tiles in flight) and Zipf -16% (132
#: tasks that start together after the top-k priced as if streaming). On since runs AW-AY (49-51), held out with the other two of USE_L2_READ_DEPTH, USE_TASK_DEEP_READ, USE_SUSTAINED_CLOCKS: the
#: three together, predicted before each measurement, median 5.2% against 6.8% without (run AY), 5.1%
#: against 6.1% (run AW, re-predicted); max 21-28% either way (NOTES-gpu-runs.md, thirteenth session).
USE_TASK_DEEP_READ = True


#: whether a launch or task plan's MMA (compute) terms run at the sustained-clock ratio
#: (kernel_model.sustained_mma, calibrate step sustained) over the plan's busy window
#: (``busy_window_s``), where the profile has the table: each stage's compute_us, each task's
#: compute_s divided by ``sustained_ratio``; memory terms (HBM has its own clock, which the SM clock's
#: fall does not lower), serial steps, launch gaps and fixed costs unscaled. Why: H200 run AT
#: (benchmarks/bench_sustained.py, cuBLAS 8192^3 bf16 in one CUDA graph after 1.5 s idle) 777-797
#: TFLOP/s over 1.4-22 ms at 1,980 MHz, 748 over 94 ms, 705 over 300 ms with the SM clock at 1,515 MHz
#: after; the calibrated MMA tables come from short launches, and validation's long prefill rows
#: (graphs of several 8-24 ms calls) ran 11-16% slower than predicted (simulator/README.md). On since runs
#: AW-AY (49-51), held out with the other two of USE_L2_READ_DEPTH, USE_TASK_DEEP_READ, USE_SUSTAINED_CLOCKS:
#: the three together, predicted before each measurement, median 5.2% against 6.8% without (run AY),
#: 5.1% against 6.1% (run AW, re-predicted); max 21-28% either way (NOTES-gpu-runs.md, thirteenth session).
USE_SUSTAINED_CLOCKS = True

#: whether a megakernel routed GEMM task's compute term carries its prologue and signal: the dependent
#: round trips reference.tiles.TASK_ROUND_TRIPS counts in the kernel's code (GEMM 1 four, GEMM 2 three),
#: each at the calibrated atomic round trip (kernel_model.ticket_s, 0.65 us on the H200), in series with
#: the task's MMA on its SM and not with its HBM streaming (other programs keep HBM busy meanwhile). Why:
#: H200 run BA's trace at T = 4096 (megakernel_trace_2026-12-02_run53): the tasks ran 2.4-2.5 us (GEMM 2)
#: and 4.4-5.5 us (GEMM 1) longer than the dense-GEMM tables price their loops, at 0.4 us between tasks (the
#: ticket), and the megakernel's Qwen3-30B-A3B prefill rows were under-predicted by 14-17% in every run.
#: Re-predicting runs AZ, BA and BB (stored rows, not predictions) moved the median 5.7 -> 5.4%, 5.6 -> 5.3%,
#: 5.3 -> 4.8%; held out first by run BC (NOTES-gpu-runs.md, fourteenth session).
USE_TASK_PROLOGUE = True

#: whether a megakernel task's DRAM bytes stream at its share of the read rate over its whole life instead
#: of the share for the programs busy when it starts (task_cost.lifetime_h, task_cost._schedule_shared):
#: the list schedule is run again (STREAM_SHARE_PASSES, damped by STREAM_SHARE_STEP), each task's
#: busy-programs correction h read as 1 / the time average of 1 / h(n(t)) over [start, end] of the previous
#: pass, n(t) the tasks executing at t (a program holding a ticket while it waits on a counter reads
#: nothing); a cohort's tasks keep their one-shot rate (USE_TASK_DEEP_READ), the L2-hit part its grid curve.
#: Why: with the share frozen at a task's start, a phase's last, partial wave of memory-bound tasks is
#: priced at the share of all R programs streaming, though most programs have finished (or wait on its
#: counters) for most of its life and each remaining program streams faster (the deep table: ~35 GB/s a
#: program at 132 busy, ~75 at 52). Decode rows with a partial GEMM wave were over-predicted in every run
#: 53-56: Mixtral-8x7B T = 8 Zipf megakernel +12..+13% (448 GEMM 1 tasks = 3.4 waves: the layer streams
#: 1.41 GB at 4.3 TB/s measured, 3.8 priced), Qwen3-30B-A3B T = 8 Zipf +10..+13% (192 = 1.45 waves).
#: Re-predicting runs 53-56 (stored rows, not predictions), pooled: median 5.2 -> 5.0%, outside 10% 82 -> 78,
#: outside 15% 11 -> 11, max 19.6 -> 19.6% (Mixtral T = 8 Zipf -> +6%, concentrated +6 -> -1%; Qwen3 T = 8
#: Zipf -> +6.5..+9%); it pushes DeepSeek-V3 T = 1 concentrated (run 55) and Qwen3-30B-A3B T = 512
#: concentrated (run 54) from -8.8 / -9.2 to -10.1%, rows already under-predicted. With this session's other
#: switches on (USE_SUSTAINED_DUTY with run BF's table grafted in, USE_WINDOW_ROOFLINE), runs BA-BG pooled:
#: median 4.6 -> 4.6%, outside 10% 90 -> 83, outside 15% 6 -> 4, max 16.6 -> 15.9% (re-predictions). On from
#: run BI, which held out the off variant: on 4.8% / 21.8% (megakernel 4.9%), off 4.8% / 21.4% (megakernel 4.8%),
#: no gain where predicted before measured; off again (its four extra scheduling passes cost prediction time).
USE_TASK_STREAM_SHARE = False


#: whether the sustained fall (USE_SUSTAINED_CLOCKS) is scaled by the call's MMA duty: its FLOPs over
#: (its time x the dense GEMM's short-launch rate, kernel_model.mma_sustained_flops_per_s), read on the
#: calibrated duty table (kernel_model.sustained_duty, ``duty_fall``): 1 - ratio becomes (1 - ratio) x
#: duty_fall(duty). Why: H200 run BF's calibration ran cuBLAS 8192^3 matmuls for 50% and 74% of a 300 ms
#: graph (HBM reads between) and their rate fell 0.016 and 0.075 where back to back it fell 0.124; and
#: the same run's SM clock, sampled over every validation row's replays (kernels/telemetry.py), stayed at
#: 0.83-0.98 of 1,980 MHz in Mixtral-8x7B's megakernel rows (MMA at about 0.67 of the dense rate) whose
#: prediction assumed 0.85 and came out 12-15% slow, while the multi-launch rows fell to 0.76-0.83.
#: Re-predicted (stored rows, not predictions): run BF's own profile rebuilt with the table 5.2% / 15.3% ->
#: 4.8% / 13.0% (median / max), 19 -> 12 rows outside 10%; runs BA-BD with BF's table grafted in 5.3 / 4.8 /
#: 5.8 / 5.2% -> 4.4 / 4.8 / 4.8 / 4.8%, outside 15% 4 / 1 / 3 / 3 -> 1 / 0 / 1 / 0. On from run BG, which holds
#: out the off variant (a profile without the table is priced as before: duty_fall 1).
USE_SUSTAINED_DUTY = True


def duty_fall(profile: Profile, duty: float) -> float:
    """The fraction of the sustained fall that a call keeping its tensor cores busy ``duty`` of its
    time sees: kernel_model.sustained_duty's points, linear between (0, 0) and (1, 1) (no MMA: no fall;
    matmuls back to back: the whole of it); 1.0 without the table."""
    tab = _km(profile).sustained_duty
    if not tab:
        return 1.0
    xs = [0.0] + [float(d) for d, _ in tab if 0.0 < d < 1.0] + [1.0]
    ys = [0.0] + [min(max(float(g), 0.0), 1.0) for d, g in tab if 0.0 < d < 1.0] + [1.0]
    return float(np.interp(min(max(float(duty), 0.0), 1.0), xs, ys))


def mma_duty(profile: Profile, flops: float, call_s: float) -> float | None:
    """A call's MMA duty: its ``flops`` over ``call_s`` at the dense GEMM's short-launch rate
    (kernel_model.mma_sustained_flops_per_s), at most 1; None without that rate or time."""
    rate = _km(profile).mma_sustained_flops_per_s
    if not (rate > 0 and call_s > 0):
        return None
    return min(max(float(flops), 0.0) / (call_s * rate), 1.0)


#: whether a grouped GEMM launch's terms overlap only within its window of programs in flight
#: (``window_shares``, ``StagePrediction.windows_us``) instead of over the whole launch: the programs
#: start in launch order, at most ``slots`` of them at once, so the programs sharing the tensor cores,
#: HBM, L2 and the SMs' intake at any moment are a window of ``slots`` consecutive ones sliding along
#: the launch; the launch takes at least the sum over the window's positions of the largest of the
#: window's shares of the compute, DRAM, L2-hit and intake terms (never less than the largest
#: whole-launch term, what the switch off gives; the same where every window holds the same mix).
#: A skewed routing puts experts of many row blocks (their weight tiles read from DRAM once per GROUP_M
#: row blocks, the rest L2 hits: compute- or intake-bound) and experts of one row block (every program
#: a weight tile of its own from DRAM: HBM-bound) in different parts of the launch, which then do not
#: hide each other, whereas the whole-launch roofline lets the heavy experts' MMA hide the light
#: experts' DRAM reads. No number is fitted: the shares come from the launch's own program order
#: (``launch_order_dram``, ``kernels.grouped_gemm._tile_ids``) and the existing terms. Why: DeepSeek-V3
#: T = 512 concentrated, multi (5 experts of 484-512 rows, ~92 of 1-34), under-predicted in every run
#: (runs 53-56 -7.6 / -11.3 / -10.5 / -12.5%): its GEMM 1 priced 1,613-1,642 us by the SMs' intake
#: against 2,039-2,046 measured (6.4 GB of DRAM, 7.2 GB of L2 hits); by windows 2,083-2,168 us. Runs
#: 53-56's stored rows re-predicted with their own profiles (re-predictions, not predictions): median
#: |error| pooled 5.22% -> 4.97%, rows outside 10% 82 -> 78, outside 15% 11 -> 11 (per run 53 / 54 /
#: 55 / 56: 5.26 -> 5.11, 4.84 -> 4.74, 5.84 -> 5.77, 5.19 -> 5.02%; outside 10% 21 -> 21, 19 -> 18,
#: 20 -> 19, 22 -> 20); that row +3.7..+5.5%, DeepSeek-V3 T = 64 concentrated multi -4.9..-5.8% ->
#: +1.8..+2.7% (GEMM 1 737-754 us against 736-748 measured), T = 4096 concentrated -7.9..+5.1% ->
#: -2.8..+7.0%; no row pushed past 10%. Runs 46-52 likewise: pooled 5.51% -> 5.51%, outside 10%
#: 90 -> 88. Discrete waves (a barrier between waves) instead of the sliding window over-priced the
#: few-wave launches (DeepSeek-V3 T = 64 concentrated +5.4..+6.3%). It only raises a launch's time, so
#: it cannot fix an over-prediction (DeepSeek-V3 T = 512 Zipf); the megakernel's tasks are priced one
#: by one already (``task_cost``); the rack model's ``stage_cost`` is left as it is.
#: With USE_SUSTAINED_DUTY on and run BF's duty table (grafted into runs BA-BD; re-predictions): runs BA-BD
#: and BF pooled 4.8% -> 4.6%, outside 10% 73 -> 66. On from run BG, which holds out the off variant.
USE_WINDOW_ROOFLINE = True


def busy_window_s(call_s: float, calls_per_graph: int = 1, calls_before: float = 0.0) -> tuple[float, float]:
    """(seconds busy before the timed calls, seconds of the timed calls) of a prediction whose call
    takes ``call_s``: ``calls_before`` calls of it back to back from idle clocks, then the
    ``calls_per_graph`` calls of the replay the measurement times. Defaults: one call from idle (a
    single-call prediction). ``megamoe validate``'s rows: ``kernels.bench.calls_before_timed_replay``
    (the warm-up calls and the replays before the median one, all back to back)."""
    return max(calls_before, 0.0) * call_s, max(calls_per_graph, 1) * call_s


def sustained_ratio(profile: Profile, busy_s: float, before_s: float = 0.0) -> float:
    """The mean MMA rate over seconds [before_s, before_s + busy_s] of back-to-back work started from
    idle clocks, as a fraction of the short-launch rate the tables were measured at; 1.0 without
    kernel_model.sustained_mma or for an empty window.

    The table's points (t_i, r_i) are average ratios over [0, t_i]: the work done by t is read as
    W(t) = t x r(t), linear between (0, 0) and the points (each segment's slope is the measured rate
    of the graph's last part, between two graph lengths), past the last point at the last segment's
    slope (the clock stays where it fell); the window's ratio is (W(b) - W(a)) / (b - a), at most 1."""
    return sustained_table_ratio(_km(profile).sustained_mma, busy_s, before_s)


def sustained_table_ratio(tab, busy_s: float, before_s: float = 0.0) -> float:
    """``sustained_ratio`` read on the points ``tab`` ((busy seconds, average ratio from idle), ...)
    themselves (calibrate's duty points read the step's own points before a profile exists)."""
    if not tab or not busy_s > 0:
        return 1.0
    ts = np.array([0.0] + [t for t, _ in tab])
    ws = np.array([0.0] + [t * r for t, r in tab])
    slope = float((ws[-1] - ws[-2]) / (ts[-1] - ts[-2]))
    tail = min(slope, 1.0) if slope > 0 else tab[-1][1]  # a last segment that did no work: its average

    def work(t: float) -> float:
        return float(np.interp(t, ts, ws)) if t <= ts[-1] else float(ws[-1] + (t - ts[-1]) * tail)

    a = max(float(before_s), 0.0)
    return float(min(1.0, max((work(a + busy_s) - work(a)) / busy_s, 1e-3)))


def _sustained_scale(profile: Profile, call_s: float, calls_per_graph: int, calls_before: float,
                     flops: float | None = None) -> float | None:
    """``sustained_ratio`` over the busy window of a call of ``call_s`` (``busy_window_s``) where
    USE_SUSTAINED_CLOCKS is on and the profile has the table, else None (nothing scaled); its fall
    scaled by ``duty_fall`` at the call's ``mma_duty`` of ``flops`` where USE_SUSTAINED_DUTY is on."""
    if not (USE_SUSTAINED_CLOCKS and _km(profile).sustained_mma):
        return None
    before_s, busy_s = busy_window_s(call_s, calls_per_graph, calls_before)
    ratio = sustained_ratio(profile, busy_s, before_s)
    duty = mma_duty(profile, flops, call_s) if (USE_SUSTAINED_DUTY and flops is not None) else None
    if duty is not None:
        ratio = 1.0 - (1.0 - ratio) * duty_fall(profile, duty)
    return ratio


def stage_flops(stage: dict) -> float:
    """A launch-plan stage's FLOPs: flops_per_tile x its tiles (the per-expert tile counts where the
    stage publishes them, else one tile a program)."""
    tpe = stage.get("tiles_per_expert")
    tiles = float(sum(tpe)) if tpe is not None else float(stage.get("active_programs", 0))
    return float(stage.get("flops_per_tile", 0.0)) * tiles


#: bytes of weight tiles one program of the hbm step's reader keeps in flight (stream_tile's 64 x 128 bf16
#: tiles at 4 stages, 3 buffers of 16 KiB, as kernels/plan.gemm_shared_bytes counts them): what the hbm grid
#: (hbm_rate, hbm_stream_rate) prices every read at, and the deep table's shallowest reader before session 17
HBM_GRID_READER_DEPTH_BYTES = 48 << 10
#: whether the deep table also prices GEMM tasks shallower than the grid's reader (``deep_table_covers``).
#: Why: H200 run BM's trace, Mixtral-8x7B T = 8: GEMM 2's tasks, 32 KiB of weights in flight a program, read at
#: 2.8 TB/s where GEMM 1's (128 KiB) read at 4.4 and the model priced both near the grid's 48 KiB rate; run BN
#: measured those tasks 64 KiB deep 5% faster (variant k2deep) where the model predicted no change. Off until a
#: validation run holds it out (it needs a profile whose hbm_deep step measured the 32 KiB reader)
USE_SHALLOW_DEEP_READ = False


def deep_table_covers(profile: Profile, depth: float) -> bool:
    """Whether the profile has the deep readers' table and it prices ``depth`` (weight bytes a program
    keeps in flight): above the hbm grid's reader (HBM_GRID_READER_DEPTH_BYTES; at it the grid prices
    the read) and above the table's shallowest reader; with ``USE_SHALLOW_DEEP_READ`` also from a
    shallower reader than the grid's, where the profile measured one, up to the grid's depth."""
    km = _km(profile)
    if not (km.hbm_deep_rate and depth):
        return False
    lo = km.hbm_deep_depths[0]
    if depth > max(lo, HBM_GRID_READER_DEPTH_BYTES):
        return True
    return bool(USE_SHALLOW_DEEP_READ and lo <= depth < HBM_GRID_READER_DEPTH_BYTES)


def _log2_interp(axes: tuple, table, point) -> float:
    """``table`` (len(axes[0]), ..., len(axes[-1])) at ``point`` (one coordinate per axis):
    multilinear in log2 of every coordinate, clamped at each axis's ends."""
    vals = np.asarray(table, dtype=np.float64)
    for ax, x in zip(axes, point):  # reduce the leading axis each time
        xs = np.log2(np.asarray(ax, dtype=np.float64))
        v = math.log2(max(float(x), 1e-300))
        if xs.size == 1:
            vals = vals[0]
            continue
        i = int(np.clip(np.searchsorted(xs, v) - 1, 0, xs.size - 2))
        f = float(np.clip((v - xs[i]) / (xs[i + 1] - xs[i]), 0.0, 1.0))
        vals = vals[i] + f * (vals[i + 1] - vals[i])
    return float(vals)


def _deep_grid_rate(profile: Profile, programs, depth, group, bytes_per_program) -> float:
    km = _km(profile)
    axes = (km.hbm_deep_programs, km.hbm_deep_depths, km.hbm_deep_groups, km.hbm_deep_bytes)
    return _log2_interp(axes, km.hbm_deep_rate, (max(float(programs), 1.0), depth, max(float(group), 1.0),
                                                 max(float(bytes_per_program), 1.0)))


def _deep_grid_stream(profile: Profile, programs, depth, group) -> float:
    """The deep table's marginal rate between its two largest bytes per program at every grid
    node (``hbm_stream_rate``'s rule, never below the one-shot rate of the largest), interpolated
    at (programs, depth, group) as ``_log2_interp``."""
    km = _km(profile)
    rate = np.asarray(km.hbm_deep_rate, dtype=np.float64)  # (n, d, g, m)
    bs = np.asarray(km.hbm_deep_bytes, dtype=np.float64)
    if bs.size < 2:
        col = rate[..., 0]
    else:
        ns = np.asarray(km.hbm_deep_programs, dtype=np.float64)[:, None, None]
        t1, t2 = ns * bs[-2] / rate[..., -2], ns * bs[-1] / rate[..., -1]
        col = np.where(t2 > t1, ns * (bs[-1] - bs[-2]) / np.maximum(t2 - t1, 1e-30), rate[..., -1])
        col = np.maximum(col, rate[..., -1])
    axes = (km.hbm_deep_programs, km.hbm_deep_depths, km.hbm_deep_groups)
    return _log2_interp(axes, col, (max(float(programs), 1.0), depth, max(float(group), 1.0)))


def deep_read_rate(profile: Profile, programs, depth, group, bytes_per_program) -> float:
    """Bytes/s that ``programs`` programs in flight read, each keeping ``depth`` weight bytes in flight
    and reading ``bytes_per_program``, in groups of ``group`` reading the same tiles at once (g x the
    DRAM rate): the deep table (kernel_model.hbm_deep_read), multilinear in log2 of the four, clamped
    at its edges. Above its largest programs (one per SM: the table has no SM with two such programs)
    at least g x the hbm grid's rate at programs / g (``hbm_rate``), a shallower reader of the same
    programs."""
    km = _km(profile)
    r = _deep_grid_rate(profile, programs, depth, group, bytes_per_program)
    if programs > km.hbm_deep_programs[-1]:
        g = max(float(group), 1.0)
        r = max(r, g * float(hbm_rate(profile, programs / g, bytes_per_program)))
    return r


def deep_stream_rate(profile: Profile, programs, depth, group) -> float:
    """``deep_read_rate`` of programs that keep streaming back to back: the deep table's
    marginal rate between its two largest bytes per program, never below the one-shot rate of the
    largest; above the table's programs at least g x ``hbm_stream_rate`` at programs / g."""
    km = _km(profile)
    r = _deep_grid_stream(profile, programs, depth, group)
    if programs > km.hbm_deep_programs[-1]:
        g = max(float(group), 1.0)
        r = max(r, g * float(hbm_stream_rate(profile, programs / g)))
    return r


def launch_read_s(profile: Profile, dram_bytes: float, programs: int, in_flight: int, *, scale: float = 1.0) -> float:
    """HBM time of one launch of ``programs`` programs reading ``dram_bytes`` in all (dram_bytes /
    programs each), at most ``in_flight`` of them resident (the launch's slots). The first wave's
    n = min(programs, in_flight) programs start together: a one-shot read, hbm_rate(n, b). The
    programs of later waves start one by one as earlier ones end, while the others keep streaming,
    so their bytes go at the marginal rate of n programs in flight, hbm_stream_rate(n) (the rate the
    megakernel's back-to-back tasks read at), without the one-shot's ramp again. One wave: the
    one-shot read alone. ``scale`` multiplies both rates (a job sharing HBM with copies)."""
    if dram_bytes <= 0 or programs <= 0:
        return 0.0
    n = max(1, min(int(programs), int(in_flight)))
    b = dram_bytes / programs
    first = n * b
    t = first / (scale * float(hbm_rate(profile, n, b)))
    if programs > n:
        t += (dram_bytes - first) / (scale * float(hbm_stream_rate(profile, n)))
    return t


def sm_copy_rate(profile: Profile, copying_sms) -> float:
    """Bytes/s ONE SM copies when ``copying_sms`` SMs copy together (linear in log2 SMs)."""
    pts = _km(profile).sm_copy
    xs = np.log2([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    return float(np.interp(math.log2(max(copying_sms, 1)), xs, ys))


def waves_s(programs, program_s, slots: int) -> float:
    """Time of groups of ``programs`` (g,) each lasting ``program_s`` (g,) on ``slots`` program
    slots: max(ceil(total / slots) x mean program time, longest program)."""
    n = np.atleast_1d(np.asarray(programs, dtype=np.float64))
    t = np.broadcast_to(np.asarray(program_s, dtype=np.float64), n.shape)
    total = float(n.sum())
    if total <= 0:
        return 0.0
    mean = float((n * t).sum()) / total
    return max(math.ceil(total / max(slots, 1)) * mean, float(t[n > 0].max()))


def sm_ingest_s(programs: int, bytes_per_program: float, profile: Profile, rate: float | None = None) -> float:
    """The time the SMs take to take in ``programs`` programs' operands, each reading
    ``bytes_per_program``: every byte a program loads reaches its SM through L2, and an SM takes in
    at most its share of the L2 rate (kernel_model.l2_bandwidth_bytes_per_s / SMs), whether the
    bytes hit in L2 or come from HBM; programs sharing an SM share it, so the SMs work through
    ceil(programs / SMs) programs' bytes each (``waves_s`` over the SMs). It binds where a launch
    has few waves of large tiles: the aggregate rates see the bytes, not how unevenly the SMs get
    them (H200 runs U and W, the multi-launch path at T = 64 with every token on the same experts:
    Qwen3-30B-A3B's 192 GEMM 1 tiles of 1.06 MB on 132 SMs, two on most SMs). 0 without an L2 rate.
    ``rate``: the aggregate L2 rate the SMs share (default l2_bandwidth_bytes_per_s; ``l2_intake_rate``)."""
    km = _km(profile)
    if km.l2_bandwidth_bytes_per_s <= 0 or programs <= 0 or bytes_per_program <= 0:
        return 0.0
    per_sm = (km.l2_bandwidth_bytes_per_s if rate is None else rate) / profile.num_sms
    return waves_s(programs, bytes_per_program / per_sm, profile.num_sms)


def grouped_dram_bytes(blocks_e, tiles_e, a: float, b: float, out: float, group_m: int) -> float:
    """DRAM bytes of a grouped GEMM in grouped tile order (GROUP_M row blocks sweep the N tiles):
    the rows a of a row block read once, the weight tile b once per N tile per group, out written
    once per program. blocks_e (E,) row blocks, tiles_e (E,) programs per expert."""
    be = np.asarray(blocks_e, dtype=np.float64)
    te = np.asarray(tiles_e, dtype=np.float64)
    m = (be > 0) & (te > 0)
    be, te = be[m], te[m]
    if be.size == 0:
        return 0.0
    n_tiles = te / be
    total = (be * a * np.minimum(n_tiles, 1.0)).sum()
    total += (n_tiles * np.ceil(be / max(1, group_m)) * b).sum()
    total += (te * out).sum()
    return float(total)


# --------------------------------------------------------------------------- launches
STAGE_KEYS = ("name", "active_programs", "tile", "bytes_per_tile", "flops_per_tile")


@dataclass(frozen=True)
class StagePrediction:
    name: str
    programs: int
    compute_us: float
    memory_us: float
    launch_us: float
    serial_us: float = 0.0
    overhead_us: float = 0.0
    waves: int = 0
    occupancy: int = 1
    #: which memory term is the largest (MEMORY_TERMS): "hbm" (the DRAM bytes at the read curve),
    #: "l2" (the L2-hit bytes at the L2 rate) or "sm_intake" (the SMs' intake, sm_ingest_s)
    memory_term: str = "hbm"
    #: USE_WINDOW_ROOFLINE: the memory terms (hbm, l2, sm_intake) in us and the sliding window's shares
    #: of the launch's programs, DRAM bytes and L2-hit bytes ((f_programs, f_dram, f_l2), ...) along the
    #: program order (``window_shares``); empty: the launch's terms overlap over the whole launch
    memory_terms_us: tuple = ()
    window_shares: tuple = ()

    @property
    def windows_us(self) -> float:
        """The launch's compute and memory terms as its window of programs in flight meets them
        (USE_WINDOW_ROOFLINE): the sum over the window's positions of the largest of its shares of
        each term; 0 without window shares."""
        if not self.window_shares or not self.memory_terms_us:
            return 0.0
        hbm, l2, intake = self.memory_terms_us
        return float(sum(max(fp * self.compute_us, fd * hbm, fl * l2, fp * intake) for fp, fd, fl in self.window_shares))

    @property
    def time_us(self) -> float:
        return max(self.compute_us, self.memory_us, self.serial_us, self.windows_us) + self.launch_us + self.overhead_us

    @property
    def bound(self) -> str:
        if self.programs == 0:
            return "launch"
        terms = {"compute": self.compute_us, "memory": self.memory_us, "serial": self.serial_us}
        return max(terms, key=terms.get)

    def to_dict(self) -> dict:
        return {"name": self.name, "programs": self.programs, "compute_us": self.compute_us,
                "memory_us": self.memory_us, "serial_us": self.serial_us, "launch_us": self.launch_us,
                "overhead_us": self.overhead_us, "waves": self.waves, "occupancy": self.occupancy,
                "time_us": self.time_us, "bound": self.bound, "memory_term": self.memory_term,
                **({"windows_us": self.windows_us} if self.window_shares else {})}


def dram_bytes(stage: dict) -> float:
    """DRAM bytes of one launch: the L2 model of grouped tile order where the stage publishes
    ``operand_bytes_per_tile`` and ``row_blocks_per_expert``, else bytes_per_tile x programs."""
    P = int(stage["active_programs"])
    ob, rb = stage.get("operand_bytes_per_tile"), stage.get("row_blocks_per_expert")
    tpe = stage.get("tiles_per_expert")
    if not ob or rb is None or tpe is None:
        return P * float(stage["bytes_per_tile"])
    group = max(1, int(stage["tile"].get("GROUP_M", 1)))
    return grouped_dram_bytes(rb, tpe, float(ob["a"]), float(ob["b"]), float(ob["out"]), group)


def launch_order_dram(stage: dict) -> np.ndarray | None:
    """(P,) DRAM bytes of each program of a grouped GEMM launch, in launch order
    (``kernels.grouped_gemm._tile_ids``: the routed row blocks in expert order, GROUP_M of them at a time
    sweeping the N tiles (columns), each column over the group's row blocks). A program reads from DRAM
    its output, its row block's rows if it is the block's first column, and its weight tile if its row
    block is the first of its expert in the group (``grouped_dram_bytes``' count, by the kernel's global
    groups). None where the stage lacks the grouped L2 model's fields or its experts differ in columns."""
    ob, rb, tpe = stage.get("operand_bytes_per_tile"), stage.get("row_blocks_per_expert"), stage.get("tiles_per_expert")
    if not ob or rb is None or tpe is None:
        return None
    be = np.asarray(rb, dtype=np.int64)
    te = np.asarray(tpe, dtype=np.int64)
    keep = (be > 0) & (te > 0)
    if not keep.any() or np.any(te[keep] % be[keep]):
        return None
    cols = set((te[keep] // be[keep]).tolist())
    if len(cols) != 1:
        return None
    ncol = cols.pop()
    expert = np.repeat(np.arange(be.size)[keep], be[keep])  # the expert of each routed row block
    M = expert.size
    if M * ncol != int(stage["active_programs"]):
        return None
    gm = max(1, int(stage["tile"].get("GROUP_M", 1)))
    a, b, out = float(ob["a"]), float(ob["b"]), float(ob["out"])
    m = np.arange(M)
    first = np.ones(M, dtype=bool)  # the block is its expert's first in its group
    first[1:] = (expert[1:] != expert[:-1]) | (m[1:] % gm == 0)
    blk, col = tile_ids(np.arange(M * ncol), M, ncol, gm)  # each program's row block and column, in launch order
    return out + a * (col == 0) + b * first[blk]


#: positions of the sliding window summed into one entry of ``window_shares`` (the window's programs /
#: this many, at least 1): only keeps the entries few; not a fitted number
WINDOW_STEPS = 16


def window_shares(stage: dict, slots: int) -> tuple:
    """((f_programs, f_dram, f_l2), ...): a grouped GEMM launch's programs, DRAM bytes and L2-hit bytes
    as the window of its ``slots`` programs in flight slides along the launch order
    (``launch_order_dram``; a program's other bytes, bytes_per_tile less its DRAM bytes, hit in L2).
    The window at position x holds programs x .. x + slots - 1 (circular, so every program is in the
    same number of windows); the window time at x, the largest of the terms' shares of that window,
    is spent once per program that leaves it, so an entry's share of a term is its windows' share of
    that term / slots: f_programs = 1 / P a position, f_dram = window DRAM bytes / (slots x DRAM bytes),
    f_l2 likewise; WINDOW_STEPS consecutive positions to an entry. Each share sums to 1 over the
    entries; a launch whose windows all hold the same mix gets every term at its whole-launch value.
    () where ``launch_order_dram`` has none or the launch fits in one wave (P <= slots)."""
    P = int(stage["active_programs"])
    n = int(slots)
    if P <= n or n < 1:
        return ()
    dram = launch_order_dram(stage)
    if dram is None:
        return ()
    hits = np.maximum(float(stage["bytes_per_tile"]) - dram, 0.0)

    def win(v):  # the circular window sums of v over n consecutive programs, at each position
        c = np.concatenate([[0.0], np.cumsum(np.concatenate([v, v[:n]]))])
        return c[n:n + P] - c[:P]

    step = max(1, n // WINDOW_STEPS)
    pos = np.arange(P) // step
    progs = np.bincount(pos).astype(np.float64) / P
    out = [progs]
    for v in (dram, hits):
        tot = float(v.sum())
        out.append(np.bincount(pos, weights=win(v)) / (n * tot) if tot > 0 else progs)
    return tuple(zip(*(x.tolist() for x in out)))


def stage_l2_hit_s(stage: dict, hit_bytes: float, in_flight: int, profile: Profile) -> float:
    """Seconds of a launch's L2-hit bytes (``hit_bytes``: its programs' bytes less ``dram_bytes``).
    At l2_bandwidth_bytes_per_s, unless ``USE_L2_SHARED_READ`` is on and the profile has the
    shared-read table: then, for a stage with the grouped L2 model's fields, the hits of expert e
    (be row blocks, n = tiles / be N tiles, GROUP_M = gm) split as ``grouped_dram_bytes`` counts
    them: weight tiles, n x (be - ceil(be / gm)) x b, read by the row blocks of one group at once
    (groups of gm, the last of be mod gm), and gathered rows, be x (n - 1) x a, each row block read
    by its N tiles in flight together, min(n, in_flight // min(gm, be)) of them; each part at the
    table's rate for ``in_flight`` programs and its group. Other stages' hits (and any rest): the
    table at group 1."""
    km = _km(profile)
    if hit_bytes <= 0:
        return 0.0
    if not (USE_L2_SHARED_READ and km.l2_shared_rate):
        return hit_bytes / km.l2_bandwidth_bytes_per_s if km.l2_bandwidth_bytes_per_s > 0 else 0.0
    n_fl = max(1, int(in_flight))
    n_rd = l2_readers(n_fl, stage.get("shared_bytes"))  # the table's programs (USE_L2_READ_DEPTH: by bytes in flight)
    ob, rb, tpe = stage.get("operand_bytes_per_tile"), stage.get("row_blocks_per_expert"), stage.get("tiles_per_expert")
    t, counted = 0.0, 0.0
    if ob and rb is not None and tpe is not None:
        gm = max(1, int(stage["tile"].get("GROUP_M", 1)))
        be = np.asarray(rb, dtype=np.float64)
        te = np.asarray(tpe, dtype=np.float64)
        keep = (be > 0) & (te > 0)
        be, te = be[keep], te[keep]
        if be.size:
            nt = te / be
            a, b = float(ob["a"]), float(ob["b"])
            full, rem = np.floor(be / gm), np.mod(be, gm)
            w_full = nt * full * (gm - 1) * b  # hits of the full groups' weight tiles
            w_rem = nt * np.maximum(rem - 1, 0) * b  # of the last, shorter group
            g_a = np.clip(np.minimum(nt, n_fl // np.minimum(gm, be)), 1, None)
            a_hits = be * np.maximum(nt - 1, 0) * a
            rate = lambda g: np.asarray(l2_shared_rate(profile, n_rd, g), dtype=np.float64)  # noqa: E731
            t = float((w_full / rate(gm)).sum() + (w_rem / rate(np.maximum(rem, 1))).sum()
                      + (a_hits / rate(g_a)).sum())
            counted = float(w_full.sum() + w_rem.sum() + a_hits.sum())
    rest = hit_bytes - counted
    if rest > 1e-6 * hit_bytes:
        t += rest / float(l2_shared_rate(profile, n_rd, 1))
    return t


def stage_intake_s(stage: dict, programs: int, in_flight: int, profile: Profile) -> float:
    """The SMs' intake of a launch of ``programs`` programs (``sm_ingest_s``), each reading the stage's
    bytes_per_tile, at ``l2_intake_rate`` for ``in_flight`` programs and the stage's ``shared_bytes``."""
    return sm_ingest_s(programs, float(stage["bytes_per_tile"]), profile,
                       l2_intake_rate(profile, in_flight, stage.get("shared_bytes")))


def _work_tile(stage: dict) -> tuple[int, int, float]:
    """(rows, columns, depth) of one program's MMA work."""
    tile = stage["tile"]
    wt = stage.get("work_tile")
    if wt:
        return int(wt["m"]), int(wt["n"]), float(wt["depth"])
    bm = int(tile.get("BLOCK_M", tile.get("BLOCK_T", 1)))
    bn = int(tile.get("BLOCK_N", tile.get("BLOCK_E", 1)))
    flops = float(stage["flops_per_tile"])
    return bm, bn, flops / max(2.0 * bm * bn, 1.0)


def predict_stage(stage: dict, profile: Profile, *, dtype: str = "bf16") -> StagePrediction:
    """One launch's time on one GPU of ``profile`` (module docstring). The tensor rate is that of
    the stage's ``mma_dtype`` where the plan states one (FP8 launch plans do), else of ``dtype``."""
    missing = [k for k in STAGE_KEYS if k not in stage]
    if missing:
        raise ValueError(f"launch-plan stage {stage.get('name', '?')!r} lacks {missing}; expected keys {STAGE_KEYS}")
    P = int(stage["active_programs"])
    if P < 0:
        raise ValueError(f"stage {stage['name']!r}: active_programs must be >= 0, got {P}")
    km = _km(profile)
    S = profile.num_sms
    launch_us = km.launch_gap_s * 1e6
    if P == 0:
        return StagePrediction(stage["name"], 0, 0.0, 0.0, launch_us)
    tile = stage["tile"]
    warps = int(tile.get("num_warps", 4))
    occ = occupancy(profile, warps)
    slots = S * occ
    waves = math.ceil(P / slots)
    flops = float(stage["flops_per_tile"])
    loads = stage.get("loads") or ("tma" if tile.get("variant") == "tma_persistent" else "pointer")
    compute_s = 0.0
    if flops > 0:
        bm, bn, depth = _work_tile(stage)
        tpe, rb = stage.get("tiles_per_expert"), stage.get("row_blocks_per_expert")
        if tpe is not None and rb is not None and sum(tpe):
            n_g = np.asarray(tpe, dtype=np.float64)
            rows_g = np.maximum(np.asarray(rb, dtype=np.float64) * bm, 1.0)
            keep = n_g > 0
            n_g, rows_g = n_g[keep], rows_g[keep]
        else:
            n_g, rows_g = np.array([float(P)]), np.array([float(bm)])
        share = min(occ, math.ceil(min(P, slots) / S))  # programs sharing one SM's tensor cores
        mma_dtype = stage.get("mma_dtype") or dtype
        rate = mma_rate_per_sm(profile, bm, bn, depth, warps, rows_g, dtype=mma_dtype, loads=loads)
        rate = rate / share
        compute_s = waves_s(n_g, flops / np.asarray(rate), slots)
    dram = dram_bytes(stage)
    mem = {"hbm": launch_read_s(profile, dram, P, slots)}
    if km.l2_bandwidth_bytes_per_s > 0:
        hit = max(0.0, P * float(stage["bytes_per_tile"]) - dram)
        mem["l2"] = stage_l2_hit_s(stage, hit, min(P, slots), profile)
        mem["sm_intake"] = stage_intake_s(stage, P, min(P, slots), profile)
    memory_term = max(mem, key=mem.get)  # ties: the first (hbm)
    memory_s = mem[memory_term]
    steps = stage.get("serial_steps") or {}
    select_s = route_select_s(profile, tile) if steps.get("select") else None
    if select_s is None:  # no measured selection for this router: its dependent reductions
        select_s = float(steps.get("select", 0)) * serial_step_s(profile, "reduce", tile.get("BLOCK_E"))
    serial_s = waves * (float(steps.get("load", 0)) * serial_step_s(profile, "load")
                        + float(steps.get("reduce", 0)) * serial_step_s(profile, "reduce") + select_s)
    extra = {}
    if USE_WINDOW_ROOFLINE and len(mem) == 3:
        shares = window_shares(stage, slots)
        if shares:
            extra = {"memory_terms_us": (mem["hbm"] * 1e6, mem["l2"] * 1e6, mem["sm_intake"] * 1e6),
                     "window_shares": shares}
    return StagePrediction(stage["name"], P, compute_s * 1e6, memory_s * 1e6, launch_us, serial_s * 1e6,
                           waves * km.task_overhead_s * 1e6, waves, occ, memory_term, **extra)


def resolve_profile(system: str | Profile, overrides: dict | None = None) -> Profile:
    from .hardware import override

    p = load_profile(system) if not isinstance(system, Profile) else system
    return override(p, **overrides) if overrides else p


def predict_launch_plan(stages: list[dict], system: str | Profile = "h200", *, dtype: str = "bf16",
                        overrides: dict | None = None, calls_per_graph: int = 1, calls_before: float = 0.0) -> dict:
    """Every launch of a plan, in order.  -> {"time_us", "stages": [...], "fixed_us", "system"}
    (and "sustained_ratio" where USE_SUSTAINED_CLOCKS scaled it).

    ``overrides``: ``hardware.override`` fields (e.g. the rates measured in the same run).
    ``calls_per_graph``: layers per CUDA-graph replay the measurement divides by (the graph's fixed
    cost is shared among them). ``calls_before``: calls run back to back before the timed replay
    (read only by USE_SUSTAINED_CLOCKS, ``busy_window_s``; 0: from idle clocks).
    """
    p = resolve_profile(system, overrides)
    preds = [predict_stage(s, p, dtype=dtype) for s in stages]
    fixed_us = _km(p).graph_fixed_s * 1e6 / max(1, calls_per_graph) if stages else 0.0
    out = {}
    ratio = _sustained_scale(p, (sum(s.time_us for s in preds) + fixed_us) * 1e-6, calls_per_graph, calls_before,
                             sum(stage_flops(s) for s in stages))
    if ratio is not None:  # the MMA terms at the clocks of the busy window (the call's time as calibrated)
        preds = [replace(s, compute_us=s.compute_us / ratio) for s in preds]
        out["sustained_ratio"] = ratio
    return {"time_us": sum(s.time_us for s in preds) + fixed_us, "fixed_us": fixed_us,
            "stages": [s.to_dict() for s in preds], "system": p.name, **out}


# --------------------------------------------------------------------------- grouped GEMMs of the rack model
def tile_widths(profile: Profile) -> tuple[int, ...]:
    """Tile widths a tuned kernel may pick: the profile's, and half of it if that is >= 64."""
    return (profile.tile_n, profile.tile_n // 2) if profile.tile_n // 2 >= 64 else (profile.tile_n,)


def tile_rows(rows, profile: Profile) -> np.ndarray:
    """(n,) tile height per expert: the next power of two >= rows, within [min_tile_m, tile_m]."""
    r = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    p2 = 1 << np.ceil(np.log2(r)).astype(np.int64)
    return np.clip(p2, profile.min_tile_m, profile.tile_m)


def _warps(tm) -> np.ndarray:
    """num_warps the rack model assumes for a tile height (8 for 128-row tiles, 4 below)."""
    return np.where(np.asarray(tm) >= 128, 8, 4)


@dataclass(frozen=True)
class GemmCost:
    """Cost of GEMM work on one GPU.  Times in s, FLOPs useful (no padding), bytes of HBM traffic."""

    time_s: float
    compute_s: float
    hbm_s: float
    flops: float
    padded_flops: float
    hbm_bytes: float
    tiles: int

    def __add__(self, other: GemmCost) -> GemmCost:
        return GemmCost(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple:
        return (self.time_s, self.compute_s, self.hbm_s, self.flops, self.padded_flops, self.hbm_bytes, self.tiles)


ZERO_COST = GemmCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)


def stage_cost(rows, n_cols: int, k_dim: int, *, profile: Profile, num_sms: int, peak_flops_per_s: float,
               weight_bytes_per_elem: float, in_row_bytes: float, out_row_bytes: float,
               read_weights: bool = True, hbm_bytes_per_s: float | None = None,
               mma_dtype: str = "bf16") -> GemmCost:
    """One grouped-GEMM stage on ``num_sms`` SMs: rows (n,) per expert, [M_e, k_dim] x [k_dim, n_cols].

    The launch the rack model assumes: tiles of tile_rows(M_e) x tn (tn the faster of the tuned
    widths), occupancy by warps, waves over the slots, the per-SM rate ``mma_rate_per_sm`` of
    ``mma_dtype`` (scaled to ``peak_flops_per_s`` over that dtype's peak), DRAM bytes of grouped
    tile order, and the HBM rate of the programs in flight (``hbm_bytes_per_s`` caps it, for jobs
    sharing HBM with copies)."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows > 0]
    if rows.size == 0:
        return ZERO_COST
    tm = tile_rows(rows, profile)  # (n,)
    warps = _warps(tm)
    occ = np.array([occupancy(profile, int(w)) for w in warps])
    base_peak = profile.tensor_flops_per_s[mma_dtype]
    best = None
    for tn in tile_widths(profile):  # a tuned kernel picks the tile width that finishes first
        blocks = -(-rows // tm)
        tiles = blocks * (-(-n_cols // tn))  # (n,)
        slots = num_sms * int(occ.min())
        share = np.minimum(occ, math.ceil(min(int(tiles.sum()), slots) / num_sms))
        rate = (mma_rate_per_sm(profile, tm, tn, k_dim, warps, rows, dtype=mma_dtype)
                * (peak_flops_per_s / base_peak) / share)
        tile_s = 2.0 * tm * tn * k_dim / rate  # (n,)
        compute_s = waves_s(tiles, tile_s, slots)
        if best is None or compute_s < best[0]:
            best = (compute_s, tn, blocks, tiles, slots)
    compute_s, tn, blocks, tiles, slots = best
    total_tiles = int(tiles.sum())
    padded = 2.0 * float((tiles * tm).sum()) * tn * k_dim
    acts = float(rows.sum()) * (in_row_bytes + out_row_bytes)
    weights = float(rows.size) * n_cols * k_dim * weight_bytes_per_elem if read_weights else 0.0
    regroup = 0.0
    if read_weights:  # grouped tile order re-reads a weight tile once per group of row blocks
        w_tile = tn * k_dim * weight_bytes_per_elem
        regroup = grouped_dram_bytes(blocks, tiles, 0.0, w_tile, 0.0, DEFAULT_GROUP_M) - weights
        regroup = max(0.0, regroup)
    hbm_bytes = weights + regroup + acts
    scale = 1.0 if hbm_bytes_per_s is None else hbm_bytes_per_s / hbm_peak(profile)
    hbm_s = launch_read_s(profile, hbm_bytes, total_tiles, slots, scale=scale)
    flops = 2.0 * float(rows.sum()) * n_cols * k_dim
    return GemmCost(max(compute_s, hbm_s), compute_s, hbm_s, flops, padded, hbm_bytes, total_tiles)


def ffn_row_bytes(hidden: int, width: int, act_dtype: str) -> int:
    """HBM bytes one row moves through ``ffn_cost``'s two stages: its input (``act_dtype``), the
    intermediate written and read back (``act_dtype``) and its bf16 output."""
    return row_bytes(hidden, act_dtype) + 2 * row_bytes(width, act_dtype) + row_bytes(hidden, "bf16")


def ffn_cost(rows, hidden: int, width: int, *, profile: Profile, num_sms: int, weight_dtype: str,
             act_dtype: str, read_weights: bool = True, hbm_bytes_per_s: float | None = None,
             stage_sync_s: float = 0.0) -> GemmCost:
    """Gated expert FFN on one GPU: gate/up [H -> 2I], SiLU*up fused, down [I -> H].

    rows: (n,) rows per expert (0 = untouched, no weights read). The input rows are in
    ``act_dtype``, the intermediate too (fp8 re-quantized, as DeepSeek does), the output bf16.
    ``stage_sync_s`` is paid once between the two stages if any row exists.
    """
    wb = weight_bytes_per_element(weight_dtype)  # fp8: with its 128 x 128 block scales
    cd = compute_dtype(weight_dtype, act_dtype)
    kw = dict(profile=profile, num_sms=num_sms, peak_flops_per_s=profile.tensor_flops_per_s[cd],
              weight_bytes_per_elem=wb, read_weights=read_weights, hbm_bytes_per_s=hbm_bytes_per_s, mma_dtype=cd)
    s1 = stage_cost(rows, 2 * width, hidden, in_row_bytes=row_bytes(hidden, act_dtype),
                    out_row_bytes=row_bytes(width, act_dtype), **kw)
    s2 = stage_cost(rows, hidden, width, in_row_bytes=row_bytes(width, act_dtype),
                    out_row_bytes=row_bytes(hidden, "bf16"), **kw)
    total = s1 + s2
    if total.tiles and stage_sync_s:
        total = GemmCost(total.time_s + stage_sync_s, *total.astuple()[1:])
    return total


def ffn_roofline_s(rows, hidden: int, width: int, *, profile: Profile, weight_dtype: str, act_dtype: str) -> float:
    """Lower bound of ``ffn_cost`` on the whole GPU: useful FLOPs at the best per-SM rate any of the
    rack model's tiles gets, weights read once, at the highest HBM rate of the profile."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows > 0]
    if rows.size == 0:
        return 0.0
    wb = weight_bytes_per_element(weight_dtype)  # fp8: with its 128 x 128 block scales
    cd = compute_dtype(weight_dtype, act_dtype)
    tm = tile_rows(rows, profile)
    rate = np.zeros(rows.size)
    for tn in tile_widths(profile):
        for k in (hidden, width):
            rate = np.maximum(rate, mma_rate_per_sm(profile, tm, tn, k, _warps(tm), rows, dtype=cd))
    compute_s = float((ffn_flops(rows, hidden, width) / (profile.num_sms * rate)).sum())
    weights = rows.size * ffn_params(hidden, width) * wb
    acts = float(rows.sum()) * ffn_row_bytes(hidden, width, act_dtype)
    return max(compute_s, (weights + acts) / hbm_peak(profile))
