"""A launch plan to seconds on one GPU: each launch's roofline of compute, memory and serial terms.

Shape legend: P programs of a launch, S SMs, o programs resident per SM, g a group of programs
(an expert's), BM/BN tile rows/columns.

A launch (``predict_stage``), P working programs in groups g (experts) of n_g programs:

    slots     = S x o(warps)   waves = ceil(P / slots)
    share     = min(o, ceil(min(P, slots) / S))        (programs sharing one SM's tensor cores)
    program_g = flops / (mma(tile, rows_g) / share)
    compute   = max(waves x mean program time, longest program)     (a wave lasts its longest tile)
    memory    = the largest of three terms (MEMORY_TERMS):
                hbm        the first wave's DRAM bytes at hbm(min(P, slots), DRAM bytes / P), the later
                           waves' at hbm_stream(min(P, slots)) (``launch_read_s``; DRAM bytes: the L2
                           model of grouped tile order, ``dram_bytes``)
                l2         L2-hit bytes at the shared-read table for their sharing group (``stage_l2_hit_s``)
                sm_intake  ceil(P / S) programs' bytes at an SM's share of the L2 intake rate (``sm_ingest_s``)
    serial    = waves x (load steps x serial_load_step_s + reductions x serial_reduce_step_s)
    windows   = the sum over the sliding window of programs in flight of each window's largest
                term share (``window_shares``)
    time      = launch_gap + max(compute, memory, serial, windows) + waves x task_overhead

A plan of launches is their sum plus the CUDA graph's fixed cost per call, its MMA terms divided by
the sustained-clock ratio over the plan's busy window (``clocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..reference.tiles import tile_ids
from .clocks import sustained_scale
from .depth_rates import l2_intake_rate, l2_readers, l2_shared_rate
from .hardware import Profile, load_profile, override
from .rates import (
    _km,
    grouped_dram_bytes,
    launch_read_s,
    mma_rate_per_sm,
    occupancy,
    route_select_s,
    serial_step_s,
    sm_ingest_s,
    waves_s,
)

#: the validation report's name of each bound a stage or task can have ("wait": a kind on the critical path)
BOUND_TERMS = {"compute": "MMA rate (the tile loop's dense-GEMM / mma table)",
               "serial": "dependent serial steps (serial_load_step_s, serial_reduce_step_s)",
               "launch": "launch gap and graph fixed cost", "wait": "waits on counters and flag handoffs"}
#: the report's name of each memory term (StagePrediction.memory_term; a task's: "l2" or "hbm")
MEMORY_TERMS = {"hbm": "HBM streaming (DRAM bytes at the calibrated read curve, hbm_read)",
                "l2": "L2-hit bytes at the calibrated L2 rate (a launch's: the shared-read table "
                      "l2_shared_read where calibrated; otherwise l2_bandwidth_bytes_per_s)",
                "sm_intake": "the SMs' intake (an SM's share of the L2 rate, sm_ingest_s)"}


def term_name(bound: str, memory_term: str | None = None) -> str:
    """The report's name of the model term behind a bound (BOUND_TERMS, MEMORY_TERMS)."""
    if bound == "memory":
        return MEMORY_TERMS.get(memory_term or "hbm", MEMORY_TERMS["hbm"])
    return BOUND_TERMS.get(bound, bound)


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
    #: the memory terms (hbm, l2, sm_intake) in us and the sliding window's shares
    #: of the launch's programs, DRAM bytes and L2-hit bytes ((f_programs, f_dram, f_l2), ...) along the
    #: program order (``window_shares``); empty: the launch's terms overlap over the whole launch
    memory_terms_us: tuple = ()
    window_shares: tuple = ()

    @property
    def windows_us(self) -> float:
        """The launch's compute and memory terms as its window of programs in flight meets them
        (``window_shares``): the sum over the window's positions of the largest of its shares of
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


#: positions of the sliding window summed into one entry of ``window_shares`` (keeps the entries few)
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
    At l2_bandwidth_bytes_per_s where the profile has no shared-read table; else, for a stage with the grouped L2 model's fields, the hits of expert e
    (be row blocks, n = tiles / be N tiles, GROUP_M = gm) split as ``grouped_dram_bytes`` counts
    them: weight tiles, n x (be - ceil(be / gm)) x b, read by the row blocks of one group at once
    (groups of gm, the last of be mod gm), and gathered rows, be x (n - 1) x a, each row block read
    by its N tiles in flight together, min(n, in_flight // min(gm, be)) of them; each part at the
    table's rate for ``in_flight`` programs and its group. Other stages' hits (and any rest): the
    table at group 1."""
    km = _km(profile)
    if hit_bytes <= 0:
        return 0.0
    if not km.l2_shared_rate:
        return hit_bytes / km.l2_bandwidth_bytes_per_s if km.l2_bandwidth_bytes_per_s > 0 else 0.0
    n_fl = max(1, int(in_flight))
    n_rd = l2_readers(n_fl, stage.get("shared_bytes"))  # the table's programs, by bytes in flight
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
    if len(mem) == 3:
        shares = window_shares(stage, slots)
        if shares:
            extra = {"memory_terms_us": (mem["hbm"] * 1e6, mem["l2"] * 1e6, mem["sm_intake"] * 1e6),
                     "window_shares": shares}
    return StagePrediction(stage["name"], P, compute_s * 1e6, memory_s * 1e6, launch_us, serial_s * 1e6,
                           waves * km.task_overhead_s * 1e6, waves, occ, memory_term, **extra)


def stage_flops(stage: dict) -> float:
    """A launch-plan stage's FLOPs: flops_per_tile x its tiles (the per-expert tile counts where the
    stage publishes them, else one tile a program)."""
    tpe = stage.get("tiles_per_expert")
    tiles = float(sum(tpe)) if tpe is not None else float(stage.get("active_programs", 0))
    return float(stage.get("flops_per_tile", 0.0)) * tiles


def resolve_profile(system: str | Profile, overrides: dict | None = None) -> Profile:
    """The profile named (or given) as ``system``, with ``hardware.override`` fields applied."""
    p = load_profile(system) if not isinstance(system, Profile) else system
    return override(p, **overrides) if overrides else p


def predict_launch_plan(stages: list[dict], system: str | Profile = "h200", *, dtype: str = "bf16",
                        overrides: dict | None = None, calls_per_graph: int = 1, calls_before: float = 0.0) -> dict:
    """Every launch of a plan, in order.  -> {"time_us", "stages": [...], "fixed_us", "system"}
    (and "sustained_ratio" where the sustained clocks scaled it, ``clocks``).

    ``overrides``: ``hardware.override`` fields (e.g. rates measured beside the plan).
    ``calls_per_graph``: layers per CUDA-graph replay the measurement divides by (the graph's fixed
    cost is shared among them). ``calls_before``: calls run back to back before the timed replay
    (``clocks.busy_window_s``; 0: from idle clocks).
    """
    p = resolve_profile(system, overrides)
    preds = [predict_stage(s, p, dtype=dtype) for s in stages]
    fixed_us = _km(p).graph_fixed_s * 1e6 / max(1, calls_per_graph) if stages else 0.0
    out = {}
    ratio = sustained_scale(p, (sum(s.time_us for s in preds) + fixed_us) * 1e-6, calls_per_graph, calls_before,
                             sum(stage_flops(s) for s in stages))
    if ratio is not None:  # the MMA terms at the clocks of the busy window (the call's time as calibrated)
        preds = [replace(s, compute_us=s.compute_us / ratio) for s in preds]
        out["sustained_ratio"] = ratio
    return {"time_us": sum(s.time_us for s in preds) + fixed_us, "fixed_us": fixed_us,
            "stages": [s.to_dict() for s in preds], "system": p.name, **out}
