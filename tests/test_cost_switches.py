"""The cost model's switches: the launches' L2 hits at the shared-read table (cost.USE_L2_SHARED_READ)
and that table past 2S programs (USE_L2_MANY_READERS), the sustained-clock ratio of the MMA terms
(USE_SUSTAINED_CLOCKS), the L2 reads by bytes in flight (USE_L2_READ_DEPTH), the megakernel tasks' HBM
reads by depth and by cohort (USE_TASK_DEEP_READ): their defaults (USE_L2_SHARED_READ on since run AH;
USE_SUSTAINED_CLOCKS, USE_L2_READ_DEPTH and USE_TASK_DEEP_READ since runs AW-AY; USE_L2_MANY_READERS
off); each changes only the terms it names when on and the profile has its table, and nothing where
the profile has none. The tables that the removed switches read are still calibrated and loaded, and
read by nothing (``test_recorded_tables_are_not_read``). The tests of the mechanics start from every
switch off (the ``_all_off`` fixture)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.simulator import cost, load_profile, task_cost
from megamoe.simulator.hardware import validate

SRC = "synthetic (tests/test_cost_switches.py)"
RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "validation_2026-12-01_run26"


def _num(v, unit):
    return {"value": v, "unit": unit, "source": SRC}


def _table(unit, over, pts):
    return {"unit": unit, "over": over, "points": pts, "source": SRC}


#: the shared-read table: rate = 2e12 x (1 + log2 P / 4) x (1 + log2 g / 8): bilinear in log2 P,
#: log2 g is exact on it
def _l2(P, g):
    return 2e12 * (1 + np.log2(P) / 4) * (1 + np.log2(g) / 8)


def _load_step(P):
    return 4e-7 * (1 + np.log2(P) / 8)


def _reduce_step(P):
    return 6e-7 * (1 + np.log2(P) / 16)


def _profile(tables: bool = True):
    d = load_profile("h200").to_dict()
    km = {"l2_bandwidth_bytes_per_s": _num(7.8e12, "bytes/s"), "serial_load_step_s": _num(4e-7, "s"),
          "serial_reduce_step_s": _num(6e-7, "s")}
    if tables:
        km["l2_shared_read"] = _table("bytes/s", ["programs", "sharing_group"],
                                      [[P, g, float(_l2(P, g))] for P in (16, 64, 256) for g in (1, 4, 16)])
        km["serial_load_step"] = _table("s", ["programs"], [[P, float(_load_step(P))] for P in (1, 16, 128)])
        km["serial_reduce_step"] = _table("s", ["programs"], [[P, float(_reduce_step(P))] for P in (1, 16, 128)])
        km["hbm_deep_read"] = _deep_table()
        km["sustained_mma"] = _table("fraction", ["busy_s"], [list(p) for p in SUSTAINED_POINTS])
        km["serial_reduce_width"] = _table("s", ["width"], [list(p) for p in REDUCE_WIDTH_POINTS])
    d["kernel_model"] = km
    return validate(d)


#: the sustained-clock table (busy seconds, average ratio from idle): work done W(t) = t x ratio is
#: 0.01, 0.09, 0.24 at 10, 100, 300 ms, so the marginal ratio is 1 up to 10 ms, 8/9 to 100 ms, 0.75 after
SUSTAINED_POINTS = ((0.01, 1.0), (0.1, 0.9), (0.3, 0.8))
#: the top-1 pass by row width (s): 0.4 us at 128 and 1.0 at 256 (around the scalar serial_reduce_step_s, 0.6 us)
REDUCE_WIDTH_POINTS = ((128.0, 4e-7), (256.0, 1e-6))


#: the deep readers' table: a product of linear functions of log2 programs, depth, group and bytes
#: (multilinear interpolation in log2 is exact on it), over programs 16, 32, 132 (one per SM), depths
#: 48, 96, 192 KiB, groups 1, 4, bytes 256 KiB, 1 MiB, 4 MiB
DEEP_AXES = ["programs_in_flight", "bytes_in_flight", "sharing_group", "bytes_per_program"]
DEEP_GRID = ((16, 32, 132), (48 << 10, 96 << 10, 192 << 10), (1, 4), (256 << 10, 1 << 20, 4 << 20))


def _deep(P, d, g, b):
    return 5e11 * np.log2(P) * (1 + np.log2(d / 49152) / 4) * (1 + np.log2(g) / 8) * (1 + np.log2(b / 262144) / 8)


def _deep_table():
    return _table("bytes/s", DEEP_AXES, [[P, d, g, b, float(_deep(P, d, g, b))] for P in DEEP_GRID[0]
                                         for d in DEEP_GRID[1] for g in DEEP_GRID[2] for b in DEEP_GRID[3]])


def _gemm_stage():
    """A grouped GEMM 1 launch: experts of 1, 3 and 10 row blocks, 16 N tiles each, GROUP_M 8."""
    be = (1, 3, 10)
    nt = 16
    ob = {"a": 16 * 7168 * 2.0, "b": 2 * 64 * 7168 * 2.0, "out": 16 * 64 * 2.0}
    return dict(name="gemm1", kernel="_k", active_programs=sum(be) * nt,
                tile=dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, GROUP_M=8), bytes_per_tile=sum(ob.values()),
                flops_per_tile=2 * 16 * 128 * 7168, operand_bytes_per_tile=ob, row_blocks_per_expert=be,
                tiles_per_expert=tuple(b * nt for b in be), work_tile={"m": 16, "n": 128, "depth": 7168})


def _router_stage():
    return dict(name="router", kernel="_r", active_programs=32, tile=dict(BLOCK_T=16, num_warps=4),
                bytes_per_tile=4096.0, flops_per_tile=0.0, serial_steps={"load": 56, "reduce": 8})


SWITCHES = ("USE_L2_SHARED_READ", "USE_SUSTAINED_CLOCKS", "USE_L2_READ_DEPTH", "USE_TASK_DEEP_READ",
            "USE_L2_MANY_READERS", "USE_TASK_PROLOGUE", "USE_SUSTAINED_DUTY",
            "USE_WINDOW_ROOFLINE", "USE_TASK_STREAM_SHARE", "USE_REDUCE_STEP_BY_WIDTH", "USE_SHALLOW_DEEP_READ")
DEFAULTS = {name: getattr(cost, name) for name in SWITCHES}  # at import, before any test patches them
#: the switches that read a table of their own (USE_TASK_DEEP_READ's cohorts read the HBM grid where the
#: profile has no deep table)
TABLE_SWITCHES = tuple(n for n in SWITCHES if n not in ("USE_TASK_DEEP_READ", "USE_TASK_PROLOGUE", "USE_WINDOW_ROOFLINE",
                                                          "USE_TASK_STREAM_SHARE"))


@pytest.fixture(autouse=True)
def _all_off(monkeypatch):
    for name in SWITCHES:
        monkeypatch.setattr(cost, name, False)


def test_switch_defaults():
    """Run AH validated the launches' shared-read L2 hits, runs AW-AY the sustained clocks, the L2
    read depth and the tasks' deep reads together; run BA kept USE_L2_MANY_READERS off; the tasks'
    prologue is on from runs BA-BB's trace and re-predictions; the sustained fall by MMA duty from run
    BF's duty graphs and re-predictions; the window roofline from re-predictions of nine runs; the
    tasks' stream share off after run BI held it out level; the top-k passes by row width on after run BL
    held it out; the shallow deep reads off until a validation holds them out. These are all of the module's
    switches."""
    assert DEFAULTS == {"USE_L2_SHARED_READ": True, "USE_SUSTAINED_CLOCKS": True, "USE_L2_READ_DEPTH": True,
                        "USE_TASK_DEEP_READ": True, "USE_L2_MANY_READERS": False, "USE_TASK_PROLOGUE": True,
                        "USE_SUSTAINED_DUTY": True, "USE_WINDOW_ROOFLINE": True, "USE_TASK_STREAM_SHARE": False,
                        "USE_REDUCE_STEP_BY_WIDTH": True, "USE_SHALLOW_DEEP_READ": False}
    assert sorted(k for k in vars(cost) if k.startswith("USE_")) == sorted(SWITCHES)


def test_many_readers_off_reads_the_table_at_most_at_its_old_edge(monkeypatch):
    """A shared-read table measured to 3S: on, 330 and 396 programs read past 2S (and clamp at 3S);
    off, every count past 2S reads the 2S row, as a profile whose table ends at 2S reads it; below
    2S both agree."""
    d = _profile().to_dict()
    S = _profile().num_sms
    progs = (S // 8, S, 2 * S, 3 * S)
    d["kernel_model"]["l2_shared_read"] = _table("bytes/s", ["programs", "sharing_group"],
                                                 [[P, g, float(_l2(P, g))] for P in progs for g in (1, 4, 16)])
    p = validate(d)
    monkeypatch.setattr(cost, "USE_L2_MANY_READERS", True)
    assert cost.l2_shared_rate(p, 3 * S, 4) == pytest.approx(_l2(3 * S, 4))
    assert cost.l2_shared_rate(p, 10 * S, 4) == pytest.approx(_l2(3 * S, 4))
    between = cost.l2_shared_rate(p, 2.5 * S, 1)
    assert _l2(2 * S, 1) < between < _l2(3 * S, 1)
    low = cost.l2_shared_rate(p, S, 4)
    monkeypatch.setattr(cost, "USE_L2_MANY_READERS", False)
    assert cost.l2_shared_rate(p, 3 * S, 4) == pytest.approx(_l2(2 * S, 4))
    assert cost.l2_shared_rate(p, 2.5 * S, 1) == pytest.approx(_l2(2 * S, 1))
    assert cost.l2_shared_rate(p, S, 4) == low
    rates = cost.l2_shared_rate(p, np.array([S, 3 * S]), 1)  # arrays: each capped
    assert rates == pytest.approx([_l2(S, 1), _l2(2 * S, 1)])


def test_launch_shared_read_leaves_the_task_plans(monkeypatch):
    """USE_L2_SHARED_READ prices a launch's hits only: a task plan's L2 hits keep
    l2_bandwidth_bytes_per_s."""
    p = _profile()
    plan = _task_plan()
    off = task_cost.task_costs(plan, p, num_programs=264)
    assert (off["l2_bytes"] > 0).any()
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)
    assert np.array_equal(task_cost.task_costs(plan, p, num_programs=264)["memory_P_s"], off["memory_P_s"])


def test_shared_read_rate_and_serial_steps_read_as_documented(monkeypatch):
    """The shared-read table at its points, bilinear in log2, clamped; the L2 re-read rate off or
    without the table. The serial steps are the one-program scalars whether or not the profile has
    the per-program-count tables (recorded, not read)."""
    p = _profile()
    assert cost.l2_shared_rate(p, 64, 4) == pytest.approx(_l2(64, 4))  # a grid point
    assert cost.l2_shared_rate(p, 32, 8) == pytest.approx(_l2(32, 8))  # bilinear in log2: exact here
    assert cost.l2_shared_rate(p, 1024, 64) == pytest.approx(_l2(256, 16))  # clamped at the edges
    assert cost.l2_shared_rate(_profile(tables=False), 64, 4) is None
    assert cost.l2_hit_rate(p, 64, 4) == 7.8e12  # off: the L2 re-read rate, table or not
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)
    assert cost.l2_hit_rate(p, 64, 4) == pytest.approx(_l2(64, 4))
    assert cost.l2_hit_rate(_profile(tables=False), 64, 4) == 7.8e12  # on, but no table
    assert p.kernel.serial_load_steps and p.kernel.serial_reduce_steps
    assert cost.serial_step_s(p, "load") == 4e-7 and cost.serial_step_s(p, "reduce") == 6e-7
    r = cost.predict_stage(_router_stage(), p)
    assert r.serial_us == pytest.approx((56 * 4e-7 + 8 * 6e-7) * 1e6)  # 32 programs at once: the scalars
    with pytest.raises(ValueError, match="'load' or 'reduce'"):
        cost.serial_step_s(p, "scan")


def test_l2_switch_prices_only_the_grouped_gemms_l2_hits(monkeypatch):
    p = _profile()
    g, r = _gemm_stage(), _router_stage()
    off_g, off_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    P = g["active_programs"]
    hit = P * g["bytes_per_tile"] - cost.dram_bytes(g)
    hbm = cost.launch_read_s(p, cost.dram_bytes(g), P, 264)
    intake = cost.sm_ingest_s(P, g["bytes_per_tile"], p)
    assert off_g.memory_us == pytest.approx(max(hbm, hit / 7.8e12, intake) * 1e6)
    assert intake >= hit / 7.8e12  # at one rate the SMs' intake is never below the L2-hit term
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)
    on_g, on_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    # by hand: n = 224 programs in flight (of 264 slots); weight hits of the 3-block expert in a
    # group of 3, of the 10-block one 7 per N tile in its group of 8 and 1 in its group of 2;
    # row hits 15 per row block, in groups of min(16, 224 // min(8, blocks)) = 16
    n, a, b, nt = 224, g["operand_bytes_per_tile"]["a"], g["operand_bytes_per_tile"]["b"], 16
    want = (nt * 2 * b / _l2(n, 3) + nt * 7 * b / _l2(n, 8) + nt * 1 * b / _l2(n, 2)
            + (1 + 3 + 10) * 15 * a / _l2(n, 16))
    assert (nt * (2 + 7 + 1) * b + 14 * 15 * a) == pytest.approx(hit)  # the hits split without a rest
    assert cost.stage_l2_hit_s(g, hit, n, p) == pytest.approx(want)
    assert on_g.memory_us == pytest.approx(max(hbm, want, intake) * 1e6)  # the intake keeps its rate
    g_small = dict(g, tile=dict(g["tile"], num_warps=8))  # 1 program per SM: 224 programs in 2 waves, 132 in flight
    assert cost.predict_stage(g_small, p).memory_us * 1e-6 >= cost.stage_l2_hit_s(g_small, hit, 132, p)
    for f in ("compute_us", "serial_us", "launch_us", "overhead_us", "waves", "occupancy"):
        assert getattr(on_g, f) == getattr(off_g, f), f
    assert on_r == off_r  # no L2 hits: the router launch is untouched
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", False)
    assert cost.predict_stage(g, p) == off_g


def _task_plan():
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 4}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
             "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = np.array([64] * 8 + [0] * (cfg.num_experts - 8))  # 4 row blocks per expert: weight tiles re-read
    return task_plan(cfg, counts, 64, tiles, num_programs=264)


def test_switches_on_without_tables_predict_as_today(monkeypatch):
    """A profile without the new tables: the table switches on predict exactly what they predict off,
    launch plans and task plans."""
    q = _profile(tables=False)
    plan = _task_plan()
    stages = [_gemm_stage(), _router_stage()]
    off = (cost.predict_launch_plan(stages, q), task_cost.predict_task_plan(plan, q, num_programs=264))
    for name in TABLE_SWITCHES:
        monkeypatch.setattr(cost, name, True)
    assert (cost.predict_launch_plan(stages, q), task_cost.predict_task_plan(plan, q, num_programs=264)) == off


def _repredicted(rows, profile):
    from megamoe.repredict import repredict_rows

    out, _ = repredict_rows(rows, profile)
    return json.dumps([{k: r.get(k) for k in ("predicted_us", "predicted_fixed_us", "predicted_stages", "dominant")}
                       for r in out], sort_keys=True, default=str)


@pytest.mark.skipif(not (RUN / "profile.json").exists(), reason="stored run 26 not in this checkout")
def test_stored_rows_repredict_identically_with_the_switches_off(monkeypatch):
    """Stored rows of H200 run 26 (multi and megakernel, the router-heavy and L2-heavy ones)
    re-predicted with its profile: the same with the switches on (its profile has no tables), and
    with the tables added while the switches are off."""
    rows = [json.loads(line) for line in (RUN / "validation_2026-12-01.jsonl").read_text().splitlines() if line.strip()]
    pick = {("deepseek-v3", 512, "zipf"), ("qwen3-30b-a3b", 64, "zipf"), ("deepseek-v3", 64, "concentrated")}
    rows = [r for r in rows if (r["preset"], r["T"], r["routing"]) in pick and r.get("profile") == "h200-calibrated"]
    assert len(rows) >= 4
    base = load_profile(str(RUN / "profile.json"))
    want = _repredicted(rows, base)
    d = base.to_dict()
    extra = _profile().data["kernel_model"]
    d["kernel_model"].update({k: extra[k] for k in ("l2_shared_read", "serial_load_step", "serial_reduce_step",
                                                     "hbm_deep_read", "sustained_mma", "serial_reduce_width")})
    with_tables = validate(d)
    assert _repredicted(rows, with_tables) == want  # switches off: the tables are not read
    for name in TABLE_SWITCHES:
        monkeypatch.setattr(cost, name, True)
    assert _repredicted(rows, base) == want  # on, but the profile has no tables
    assert _repredicted(rows, with_tables) != want  # on, with tables: they are read


RUN53 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "validation_2026-12-02_run53"
#: the kernel_model tables a calibration records that the cost model does not read (those of the
#: removed switches, simulator/README.md "Removed switches", with gemm_reuse_<form>; mma_pointer never was)
RECORDED_NOT_READ = ("hbm_read_tma", "serial_load_step", "serial_reduce_step", "serial_chain_step", "mma_pointer")


@pytest.mark.skipif(not (RUN53 / "profile.json").exists(), reason="stored run 53 not in this checkout")
def test_recorded_tables_are_not_read(monkeypatch):
    """Run 53's profile has every recorded table (the TMA reader's HBM grid, the reuse tables, the
    serial steps by programs): its rows, both paths, decode and prefill, pointer and TMA weights,
    re-predict with the switches at their defaults exactly as with those tables taken out of the
    profile and the SM's shared memory (sm_shared_memory_bytes, not read either) set to 1 KiB."""
    rows = [json.loads(line) for line in (RUN53 / "validation_2026-12-02.jsonl").read_text().splitlines() if line.strip()]
    pick = {("qwen3-30b-a3b", T, "zipf") for T in (1, 64, 4096)} | {("deepseek-v3", 512, "zipf")}
    rows = [r for r in rows if r.get("phase") == "measurement" and (r["preset"], r["T"], r["routing"]) in pick]
    assert len(rows) == 2 * len(pick)
    full = load_profile(str(RUN53 / "profile.json"))
    d = full.to_dict()
    km = d["kernel_model"]
    gone = [k for k in km if k in RECORDED_NOT_READ or k.startswith("gemm_reuse_")]
    assert {"hbm_read_tma", "serial_load_step", "gemm_reuse_tma_ab_persistent"} <= set(gone)
    for k in gone:
        del km[k]
    km["sm_shared_memory_bytes"] = _num(1024, "bytes")
    stripped = validate(d)
    assert stripped.kernel.hbm_tma_rate == () and stripped.kernel.gemm_reuse == () and full.kernel.gemm_reuse
    for name, on in DEFAULTS.items():
        monkeypatch.setattr(cost, name, on)
    assert _repredicted(rows, full) == _repredicted(rows, stripped)


# --------------------------------------------------------------------------- the deep readers' table
def _deep_profile(base=None):
    d = (base or load_profile("h200")).to_dict()
    d.setdefault("kernel_model", {})["hbm_deep_read"] = _deep_table()
    return validate(d)


def test_deep_rate_reads_as_documented():
    """deep_read_rate: the table at its points, multilinear in log2 between them (exact on the
    synthetic table), clamped at its edges, and above its programs (one per SM) at least the grid's
    rate of the same programs; deep_stream_rate: the marginal rate between the two largest reads
    (hbm_stream_rate's rule) at each node. deep_table_covers: the table there and a depth above its
    shallowest reader's."""
    p = _deep_profile()
    f = cost.deep_read_rate
    assert f(p, 32, 96 << 10, 4, 1 << 20) == pytest.approx(_deep(32, 96 << 10, 4, 1 << 20))  # a point
    assert f(p, 64, 64 << 10, 2, 512 << 10) == pytest.approx(_deep(64, 64 << 10, 2, 512 << 10))  # between
    assert f(p, 8, 1 << 20, 16, 64 << 20) == pytest.approx(_deep(16, 192 << 10, 4, 4 << 20))  # clamped
    above = f(p, 264, 96 << 10, 1, 1 << 20)  # two programs per SM: at least the grid's rate at 264
    assert above == pytest.approx(max(_deep(132, 96 << 10, 1, 1 << 20), cost.hbm_rate(p, 264, 1 << 20)))
    assert f(p, 528, 96 << 10, 4, 1 << 20) >= 4 * cost.hbm_rate(p, 132, 1 << 20) - 1e-3
    t1, t2 = (132 * b / _deep(132, 96 << 10, 4, b) for b in (1 << 20, 4 << 20))
    marginal = max(132 * (3 << 20) / (t2 - t1), _deep(132, 96 << 10, 4, 4 << 20))
    assert cost.deep_stream_rate(p, 132, 96 << 10, 4) == pytest.approx(marginal)
    assert cost.deep_table_covers(p, (48 << 10) + 1) and not cost.deep_table_covers(p, 48 << 10)
    assert not cost.deep_table_covers(p, 0.0)
    assert not cost.deep_table_covers(load_profile("h200"), 128 << 10)  # no table


# --------------------------------------------------------------------------- sustained clocks
def test_sustained_ratio_reads_as_documented():
    """The mean ratio over a busy window: the work of the table's piecewise-linear W(t) over the
    window's seconds; past the last point at the last segment's slope; 1 without the table."""
    p = _profile()
    r = cost.sustained_ratio
    assert r(p, 0.005) == 1.0 and r(p, 0.01) == pytest.approx(1.0)  # the short regime
    assert r(p, 0.1) == pytest.approx(0.9) and r(p, 0.3) == pytest.approx(0.8)  # the points: averages from idle
    assert r(p, 0.02) == pytest.approx((0.01 + 0.01 * 8 / 9) / 0.02)
    assert r(p, 0.2, 0.1) == pytest.approx(0.75) and r(p, 0.05, 2.0) == pytest.approx(0.75)  # the last part, and past it
    assert r(p, 0.2, 0.2) == pytest.approx(0.75)  # half inside, half past the table: one slope
    ratios = [r(p, 0.02, before) for before in (0.0, 0.01, 0.05, 0.09, 0.2, 1.0)]
    assert all(a >= b - 1e-12 for a, b in zip(ratios, ratios[1:])) and ratios[0] > ratios[-1]  # later: no faster
    assert r(p, 0.0, 1.0) == 1.0 and r(_profile(tables=False), 0.3, 1.0) == 1.0
    assert cost.busy_window_s(2e-3) == (0.0, 2e-3)  # a single call from idle
    assert cost.busy_window_s(2e-3, 4, 14) == pytest.approx((0.028, 0.008))


def _compute_bound_stage():
    """A prefill-sized GEMM launch: one expert of 4096 rows (32 row blocks) x 4096 columns (16 N tiles of
    256), 7168 deep, 8 warps, GROUP_M 8: its tiles re-read from L2, MMA-bound."""
    ob = {"a": 128 * 7168 * 2.0, "b": 256 * 7168 * 2.0, "out": 128 * 256 * 2.0}
    return dict(name="gemm2", kernel="_k", active_programs=512,
                tile=dict(BLOCK_M=128, BLOCK_N=256, num_warps=8, GROUP_M=8), bytes_per_tile=sum(ob.values()),
                flops_per_tile=2.0 * 128 * 256 * 7168, operand_bytes_per_tile=ob, row_blocks_per_expert=(32,),
                tiles_per_expert=(512,))


def test_sustained_switch_scales_only_the_mma_terms(monkeypatch):
    """On, with the table: each stage's compute term divided by the busy window's ratio, nothing
    else; a memory-bound stage keeps its time; the window starts later with more calls before it,
    so the same plan predicts slower (not faster) as they grow; off, or no table: as before."""
    p, q = _profile(), _profile(tables=False)
    stages = [_compute_bound_stage(), _gemm_stage(), _router_stage()]
    off = cost.predict_launch_plan(stages, p, calls_per_graph=4, calls_before=30)
    call_s = off["time_us"] * 1e-6
    assert "sustained_ratio" not in off
    assert cost.predict_launch_plan(stages, p, calls_per_graph=4) == off  # calls_before alone changes nothing
    off_q = cost.predict_launch_plan(stages, q, calls_per_graph=4, calls_before=30)
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    assert cost.predict_launch_plan(stages, q, calls_per_graph=4, calls_before=30) == off_q  # no table
    on = cost.predict_launch_plan(stages, p, calls_per_graph=4, calls_before=30)
    before_s, busy_s = cost.busy_window_s(call_s, 4, 30)
    ratio = cost.sustained_ratio(p, busy_s, before_s)
    assert on["sustained_ratio"] == ratio < 1 and on["fixed_us"] == off["fixed_us"]
    for a, b in zip(off["stages"], on["stages"]):
        assert b["compute_us"] == pytest.approx(a["compute_us"] / ratio)
        for k in ("memory_us", "serial_us", "launch_us", "overhead_us", "waves", "memory_term"):
            assert a[k] == b[k], k
    gemm, small, router = zip(off["stages"], on["stages"])
    assert gemm[0]["bound"] == "compute" and gemm[1]["time_us"] > gemm[0]["time_us"]
    assert small[0]["bound"] == "memory" and small[0]["compute_us"] / ratio < small[0]["memory_us"]
    assert small[1]["time_us"] == small[0]["time_us"] and router[1] == router[0]  # memory- and serial-bound: kept
    times = [cost.predict_launch_plan(stages, p, calls_per_graph=4, calls_before=n)["time_us"] for n in (0, 2, 10, 30, 300)]
    assert times == sorted(times) and times[-1] > times[0]


def test_sustained_switch_scales_only_the_tasks_compute(monkeypatch):
    """A task plan under the switch: its tasks' compute times divided by the ratio of the makespan's
    busy window, scheduled again; memory and serial terms as before."""
    p = _profile()
    plan = _task_plan()
    off = task_cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000)
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    on = task_cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000)
    before_s, busy_s = cost.busy_window_s(off["time_us"] * 1e-6, 8, 3000)
    ratio = cost.sustained_ratio(p, busy_s, before_s)
    assert on["sustained_ratio"] == ratio < 1
    c = task_cost.task_costs(plan, p, num_programs=264)
    want = task_cost._schedule_tasks({**c, "compute_s": c["compute_s"] / ratio}, p, 8)
    assert {k: v for k, v in on.items() if k != "sustained_ratio"} == want
    assert on["time_us"] >= off["time_us"] and on["dram_bytes"] == off["dram_bytes"]
    assert task_cost.predict_task_plan(plan, p, num_programs=264) != off  # a shorter window: a smaller change
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", False)
    assert task_cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000) == off


#: the duty table (matmuls' share of a long graph, fraction of the back-to-back fall), H200 run BF's shape
DUTY_POINTS = ((0.5, 0.125), (0.75, 0.625))


def _duty_profile(rate: float = 8e14):
    d = _profile().to_dict()
    d["kernel_model"]["sustained_duty"] = _table("fraction", ["duty"], [list(q) for q in DUTY_POINTS])
    d["kernel_model"]["mma_sustained_flops_per_s"] = _num(rate, "flop/s")
    return validate(d)


def test_duty_fall_and_mma_duty_read_as_documented():
    """duty_fall: the table's points, linear between (0, 0), them and (1, 1), clamped to [0, 1] in
    duty; 1 without the table. mma_duty: FLOPs over time x the dense short-launch rate, at most 1;
    None without that rate or for no time."""
    p = _duty_profile()
    f = cost.duty_fall
    assert f(p, 0.0) == 0.0 and f(p, 1.0) == 1.0 and f(p, 2.0) == 1.0 and f(p, -1.0) == 0.0
    assert f(p, 0.5) == pytest.approx(0.125) and f(p, 0.75) == pytest.approx(0.625)
    assert f(p, 0.25) == pytest.approx(0.0625) and f(p, 0.875) == pytest.approx(0.8125)
    assert f(_profile(), 0.3) == 1.0
    assert cost.mma_duty(p, 4e11, 1e-3) == pytest.approx(0.5) and cost.mma_duty(p, 1e13, 1e-3) == 1.0
    assert cost.mma_duty(p, 4e11, 0.0) is None and cost.mma_duty(_duty_profile(0.0), 4e11, 1e-3) is None


def test_duty_switch_shrinks_the_fall_by_the_calls_mma_duty(monkeypatch):
    """USE_SUSTAINED_DUTY on (with USE_SUSTAINED_CLOCKS): the busy window's fall 1 - ratio times
    duty_fall at the call's duty, its FLOPs (stage_flops) over its time as calibrated x the dense
    rate; a launch plan and a task plan alike; a lower dense rate (a higher duty) keeps more of the
    fall; the duty switch alone changes nothing."""
    p = _duty_profile()
    stages = [_compute_bound_stage(), _gemm_stage(), _router_stage()]
    kw = dict(calls_per_graph=4, calls_before=30)
    monkeypatch.setattr(cost, "USE_SUSTAINED_DUTY", True)
    assert "sustained_ratio" not in cost.predict_launch_plan(stages, p, **kw)  # the clocks switch off
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    monkeypatch.setattr(cost, "USE_SUSTAINED_DUTY", False)
    whole = cost.predict_launch_plan(stages, p, **kw)
    monkeypatch.setattr(cost, "USE_SUSTAINED_DUTY", True)
    on = cost.predict_launch_plan(stages, p, **kw)
    plain = cost.predict_launch_plan(stages, p)  # no window: the call's own time as calibrated
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", False)
    call_s = cost.predict_launch_plan(stages, p, **kw)["time_us"] * 1e-6
    flops = sum(cost.stage_flops(s) for s in stages)
    assert flops == pytest.approx(2.0 * 128 * 256 * 7168 * 512 + sum(cost.stage_flops(s) for s in stages[1:]))
    duty = cost.mma_duty(p, flops, call_s)
    assert 0 < duty < 1
    want = 1.0 - (1.0 - whole["sustained_ratio"]) * cost.duty_fall(p, duty)
    assert on["sustained_ratio"] == pytest.approx(want) and whole["sustained_ratio"] < want < 1.0
    assert on["time_us"] < whole["time_us"] and plain["time_us"] <= on["time_us"]
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    busier = cost.predict_launch_plan(stages, _duty_profile(rate=4e14), **kw)
    assert busier["sustained_ratio"] < on["sustained_ratio"]
    plan = _task_plan()
    t_whole, t_on = [], []
    for flag, acc in ((False, t_whole), (True, t_on)):
        monkeypatch.setattr(cost, "USE_SUSTAINED_DUTY", flag)
        acc.append(task_cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000))
    assert t_whole[0]["sustained_ratio"] <= t_on[0]["sustained_ratio"] <= 1.0


RUN46 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "validation_2026-12-02_run46"
#: run AT's bench_sustained figures merged into run 46's profile (benchmarks/sustained_profile.py)
RUN46_SUSTAINED = RUN46.parent / "repredict_sustained_2026-12-02_run46" / "profile.json"


@pytest.mark.skipif(not RUN46_SUSTAINED.exists(), reason="stored run 46 not in this checkout")
def test_sustained_switch_on_stored_rows_of_run46(monkeypatch):
    """Run 46's rows with run AT's bench table: off, as with run 46's own profile (no table); on,
    DeepSeek-V3's prefill rows (graphs of 8-24 ms calls after warm-up and earlier replays) predict
    slower, T = 16384 more than T = 512's short calls, whose ratio is nearer 1; decode untouched."""
    from megamoe.repredict import repredict_rows

    pick = {("deepseek-v3", T, "uniform", b) for T in (1, 512, 4096, 16384) for b in ("multi", "megakernel")}
    rows = [json.loads(line) for line in (RUN46 / "validation_2026-12-02.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("phase") == "measurement" and (r["preset"], r["T"], r["routing"], r["backend"]) in pick]
    assert len(rows) == len(pick)
    base, table = load_profile(str(RUN46 / "profile.json")), load_profile(str(RUN46_SUSTAINED))
    want = _repredicted(rows, base)
    assert _repredicted(rows, table) == want  # off: the table is not read
    off, _ = repredict_rows(rows, base)
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    assert _repredicted(rows, base) == want  # on, no table
    out, _ = repredict_rows(rows, table)
    by = {(r["T"], r["backend"]): r for r in out}
    was = {(r["T"], r["backend"]): r for r in off}
    for b in ("multi", "megakernel"):
        assert by[(1, b)]["predicted_us"] == pytest.approx(was[(1, b)]["predicted_us"], rel=1e-9)
        assert by[(16384, b)]["predicted_us"] > was[(16384, b)]["predicted_us"] * 1.05
        # (both reach the table's lowest ratio, 0.859 with run AT's table: equal to float rounding, which session 17's
        # megakernel tiles at T = 512 tipped)
        assert by[(16384, b)]["predicted_sustained_ratio"] <= by[(512, b)]["predicted_sustained_ratio"] * (1 + 1e-12)
        assert by[(512, b)]["predicted_sustained_ratio"] < 1


def test_the_validation_window_starts_after_the_warm_up_and_the_earlier_replays(monkeypatch):
    """graph_time_us runs 2 eager calls, one untimed replay and the timed ones back to back; its
    median replay of 5 is the third: 2 + NI x 3 calls before it (NI = 8: 26); predict_config with
    the row's reps reads the ratio of that window, without reps the timed graph's from idle."""
    from megamoe.kernels.bench import WARMUP_CALLS, calls_before_timed_replay
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig

    assert WARMUP_CALLS == 2
    assert calls_before_timed_replay(8, 5) == 26 and calls_before_timed_replay(2, 5) == 8
    assert calls_before_timed_replay(4, 4) == 2 + 4 * 2.5 and calls_before_timed_replay(1, 1) == 2
    p = _profile()
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    counts = np.full(cfg.num_experts, 4096 * cfg.top_k // cfg.num_experts)
    kw = dict(device_name="NVIDIA H200", calls_per_graph=4, triton_version="3.6.0")
    off = predict_config(cfg, counts, 4096, "multi", p, reps=5, **kw)
    assert off == predict_config(cfg, counts, 4096, "multi", p, **kw) and "predicted_sustained_ratio" not in off
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    on = predict_config(cfg, counts, 4096, "multi", p, reps=5, **kw)
    idle = predict_config(cfg, counts, 4096, "multi", p, **kw)
    call_s = off["predicted_us"] * 1e-6
    assert on["predicted_sustained_ratio"] == pytest.approx(cost.sustained_ratio(p, 4 * call_s, 14 * call_s))
    assert idle["predicted_sustained_ratio"] == pytest.approx(cost.sustained_ratio(p, 4 * call_s))
    assert on["predicted_us"] >= idle["predicted_us"] >= off["predicted_us"]


# --------------------------------------------------------------------------- L2 reads by bytes in flight
def test_l2_reader_depth_is_the_shared_read_steps_reader():
    """L2_SHARED_READER_DEPTH_BYTES is what the l2_shared step's reader keeps in flight: its launcher's
    default stages less one (16-row mma.sync tiles, kernels/plan.gemm_shared_bytes' rule) of the
    calibrate step's 64 x 128 bf16 weight tiles (the tile microbench.json records)."""
    import inspect

    pytest.importorskip("triton")
    from megamoe.calibrate import microbench_shared as ms

    stages = inspect.signature(ms.l2_shared_read).parameters["num_stages"].default
    assert (stages - 1) * 64 * 128 * 2 == cost.L2_SHARED_READER_DEPTH_BYTES
    mb = RUN46 / "microbench.json"
    if mb.exists():
        assert json.loads(mb.read_text())["measurements"]["l2_shared"]["tile"] == [64, 128]


def test_l2_read_depth_readers_and_intake_rate(monkeypatch):
    """Off: the table's programs are the programs in flight and the intake is l2_bandwidth. On: a
    program deeper than the reader counts depth / 48 KiB readers (none shallower: as off); the
    intake's aggregate rate is at least l2_bandwidth, the table's at those readers and group 1 above
    it; a profile without the table keeps l2_bandwidth."""
    p, bare = _profile(), _profile(tables=False)
    d = cost.L2_SHARED_READER_DEPTH_BYTES
    assert cost.l2_readers(132, 3 * d) == 132 and cost.l2_intake_rate(p, 132, 3 * d) == 7.8e12
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", True)
    assert cost.l2_readers(132, d) == 132 and cost.l2_readers(132, 0) == 132
    assert cost.l2_readers(64, 3 * d) == pytest.approx(192)
    assert cost.l2_intake_rate(p, 64, 3 * d) == pytest.approx(max(7.8e12, _l2(192, 1)))
    assert cost.l2_intake_rate(p, 16, 2 * d) == 7.8e12  # the table's 32 readers: below l2_bandwidth
    assert cost.l2_intake_rate(p, 132, d) == 7.8e12  # not deeper than the reader
    assert cost.l2_intake_rate(bare, 64, 3 * d) == 7.8e12


def test_l2_read_depth_prices_only_deep_launches_l2_terms(monkeypatch):
    """On: a launch whose buffers hold 3 readers' bytes reads its L2-hit bytes at the table's rate for
    3 x its programs in flight and the SMs' intake at the table's rate there (above l2_bandwidth);
    compute, HBM, waves untouched. A launch at the reader's depth, or without shared_bytes, as off."""
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)  # its default: the launches' hits at the table
    p = _profile()
    d = cost.L2_SHARED_READER_DEPTH_BYTES
    deep, shallow = {**_gemm_stage(), "shared_bytes": 3 * d}, {**_gemm_stage(), "shared_bytes": d}
    off = {k: cost.predict_stage(s, p) for k, s in (("deep", deep), ("shallow", shallow), ("none", _gemm_stage()))}
    hit = 224 * deep["bytes_per_tile"] - cost.dram_bytes(deep)
    l2_off = cost.stage_l2_hit_s(deep, hit, 224, p)
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", True)
    on = {k: cost.predict_stage(s, p) for k, s in (("deep", deep), ("shallow", shallow), ("none", _gemm_stage()))}
    assert on["shallow"] == off["shallow"] and on["none"] == off["none"]
    # by hand: the same split of the hits (sharing groups of 224 in flight) as off, each part at the
    # table's rate for 3 x 224 = 672 programs
    table = cost.l2_shared_rate
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", False)
    monkeypatch.setattr(cost, "l2_shared_rate", lambda prof, P, g: table(prof, 3 * np.asarray(P), g))
    want_l2 = cost.stage_l2_hit_s(deep, hit, 224, p)
    monkeypatch.setattr(cost, "l2_shared_rate", table)
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", True)
    assert cost.stage_l2_hit_s(deep, hit, 224, p) == pytest.approx(want_l2) and want_l2 < l2_off
    # the intake: the table at 672 readers is clamped at its 256 (6.0 TB/s), below l2_bandwidth (7.8):
    # as off; with an l2_bandwidth of 4 TB/s, the table's 6.0
    assert cost.stage_intake_s(deep, 224, 224, p) == cost.sm_ingest_s(224, deep["bytes_per_tile"], p)
    low = dataclasses.replace(p, kernel=dataclasses.replace(p.kernel, l2_bandwidth_bytes_per_s=4e12))
    want_in = cost.sm_ingest_s(224, deep["bytes_per_tile"], low, float(_l2(256, 1)))
    assert cost.stage_intake_s(deep, 224, 224, low) == pytest.approx(want_in)
    assert want_in < cost.sm_ingest_s(224, deep["bytes_per_tile"], low)
    hbm = cost.launch_read_s(p, cost.dram_bytes(deep), 224, 264)
    want_in = cost.sm_ingest_s(224, deep["bytes_per_tile"], p)
    assert on["deep"].memory_us == pytest.approx(max(hbm, want_l2, want_in) * 1e6)
    for f in ("compute_us", "serial_us", "launch_us", "overhead_us", "waves", "occupancy"):
        assert getattr(on["deep"], f) == getattr(off["deep"], f), f


def test_l2_read_depth_prices_only_the_tasks_l2_hits(monkeypatch):
    """A task plan: off, or on at read_depth 0 / the reader's, as today; on with deep programs, the
    tasks' L2-hit bytes at l2_intake_rate (faster here), their DRAM and compute terms untouched."""
    p = _profile()
    p = dataclasses.replace(p, kernel=dataclasses.replace(p.kernel, l2_bandwidth_bytes_per_s=4e12))
    plan = _task_plan()
    deep = 4 * cost.L2_SHARED_READER_DEPTH_BYTES
    off = task_cost.task_costs(plan, p, num_programs=132)
    assert task_cost.task_costs(plan, p, num_programs=132, read_depth=deep)["memory_P_s"].tolist() == off["memory_P_s"].tolist()
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", True)
    for depth in (0.0, float(cost.L2_SHARED_READER_DEPTH_BYTES)):
        assert task_cost.task_costs(plan, p, num_programs=132, read_depth=depth)["memory_P_s"].tolist() == off["memory_P_s"].tolist()
    on = task_cost.task_costs(plan, p, num_programs=132, read_depth=deep)
    np.testing.assert_array_equal(on["compute_s"], off["compute_s"])
    np.testing.assert_array_equal(on["dram_bytes"], off["dram_bytes"])
    assert (on["memory_P_s"] <= off["memory_P_s"]).all()
    rate = cost.l2_intake_rate(p, 132, deep)
    assert rate == pytest.approx(_l2(256, 1)) and rate > 4e12  # 528 readers: the table's edge
    assert off["l2_bound"].any()
    # the L2-bound tasks at l2_bytes x resident / the rate; the others keep their DRAM time
    b = off["l2_bound"]
    np.testing.assert_allclose(on["memory_P_s"][b], np.maximum(off["l2_bytes"][b] * 132 / rate,
                                                               on["memory_P_s"][b]))
    assert (on["memory_P_s"][b] < off["memory_P_s"][b]).all()
    np.testing.assert_array_equal(on["memory_P_s"][~b], off["memory_P_s"][~b])


# --------------------------------------------------------------------------- the megakernel tasks' reads by depth and cohort
def _cohort_plan(m: int, *, weight_bytes: float = 1 << 20, num_programs: int = 132) -> dict:
    """A task plan (``task_costs``'s dict form) of one top-k task, then ``m`` GEMM 1 tasks that all wait
    for it (the cohort it releases), each reading ``weight_bytes`` of its own weights (no L2 hits)."""
    from megamoe.reference.tiles import KINDS

    n = m + 1
    kind = np.array([KINDS.index("router_topk")] + [KINDS.index("gemm1")] * m, np.int8)
    z = np.zeros(n)
    return {"kinds": list(KINDS), "kind": kind, "expert": np.array([-1] + list(range(m))), "block": np.arange(n),
            "rows": np.ones(n), "tile_m": np.array([0] + [16] * m), "tile_n": np.array([0] + [64] * m),
            "depth": np.array([64] + [2048] * m), "weight_bytes": np.array([0.0] + [float(weight_bytes)] * m),
            "in_bytes": z, "out_bytes": z, "flops": z, "weight_id": np.array([-1] + list(range(m))),
            "signal_ptr": np.array([0] + [1] * n), "signal_counter": np.array([0]),
            "wait_ptr": np.array([0, 0] + list(range(1, m + 1))), "wait_counter": np.zeros(m, np.int64),
            "wait_target": np.ones(m, np.int64), "counter_target": np.array([1]), "counts": np.ones(m),
            "tiles": {"router": {"BLOCK_H": 64}}, "num_programs": num_programs, "num_tokens": 1, "topk_passes": 1}


def test_task_read_curves_read_the_deep_table_only_where_it_covers_the_depth(monkeypatch):
    """task_read_curves: off, the grid's curve whatever weight_depth says; on, the GEMM kinds whose
    weight depth the deep table covers (above its 48 KiB reader) stream at deep_stream_rate(n, depth, 1)
    and start together at deep_read_rate; shallower kinds, kinds without a depth and a profile without
    the table keep the grid's."""
    p = _deep_profile()
    plan = _cohort_plan(8)
    kind, kinds = plan["kind"].astype(np.int64), plan["kinds"]
    deep = {"gemm1": 160 << 10, "gemm2": 80 << 10}
    curve, stream, one = task_cost.task_read_curves(p, kind, kinds, 132, deep)
    assert curve.tolist() == [0] * kind.size and stream.shape == (1, 132)
    np.testing.assert_array_equal(stream[0], cost.hbm_stream_rate(p, np.arange(1, 133, dtype=np.float64)))
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    curve, stream, one = task_cost.task_read_curves(p, kind, kinds, 132, deep)
    assert curve.tolist() == [0] + [1] * 8 and stream.shape == (2, 132)  # no gemm2 tasks: no curve for it
    assert stream[1][47] == pytest.approx(cost.deep_stream_rate(p, 48, 160 << 10, 1))
    assert one[1](48, 1 << 20) == pytest.approx(cost.deep_read_rate(p, 48, 160 << 10, 1, 1 << 20))
    assert one[0](48, 1 << 20) == pytest.approx(cost.hbm_rate(p, 48, 1 << 20))
    for wd in ({"gemm1": 48 << 10}, {"router_topk": 160 << 10}, None):
        assert task_cost.task_read_curves(p, kind, kinds, 132, wd)[0].tolist() == [0] * kind.size
    assert task_cost.task_read_curves(load_profile("h200"), kind, kinds, 132, deep)[0].tolist() == [0] * kind.size


@pytest.mark.parametrize("m", [48, 132], ids=["48-few-programs", "132-every-sm"])
def test_a_cohort_released_together_reads_at_the_one_shot_rate(monkeypatch, m):
    """m GEMM 1 tasks released by one top-k task onto idle programs: off, the first placed sees 1 program
    busy and the last m, each at the grid's marginal rate for those; on, every one of them reads its
    bytes at the one-shot rate of m programs (the deep table at its depth), so they end together at
    top-k end + handoff + b / (deep_read_rate(m, d, 1, b) / m) + the task's fixed cost."""
    p = _deep_profile()
    plan = _cohort_plan(m)
    d, b = 160 << 10, float(1 << 20)
    off = task_cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    assert off == task_cost.predict_task_plan(plan, p)  # off: weight_depth is not read
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    on = task_cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    km = p.kernel
    topk_end = off["span_us"]["router_topk"][1]
    assert on["span_us"]["router_topk"] == off["span_us"]["router_topk"]
    task = b / (cost.deep_read_rate(p, m, d, 1, b) / m) + km.task_overhead_s + km.ticket_s
    start = topk_end + km.flag_handoff_s * 1e6  # the cohort's tasks on other programs than the top-k's
    assert on["span_us"]["gemm1"][0] == pytest.approx(topk_end)  # the top-k's own program: no handoff
    assert on["span_us"]["gemm1"][1] == pytest.approx(start + task * 1e6)
    # without the deep table: the same cohort at the grid's one-shot rate of m programs
    q = load_profile("h200")
    q_on = task_cost.predict_task_plan(plan, q)
    grid = b / (float(cost.hbm_rate(q, m, b)) / m) + q.kernel.task_overhead_s + q.kernel.ticket_s
    assert q_on["span_us"]["gemm1"][1] == pytest.approx(q_on["span_us"]["router_topk"][1]
                                                       + q.kernel.flag_handoff_s * 1e6 + grid * 1e6)


def test_tasks_that_start_apart_are_no_cohort(monkeypatch):
    """More tasks than programs: the ones placed as programs free up stream at the deep table's marginal
    rate for the programs busy (no cohort of one); a cohort's L2-hit part keeps the grid's curve, so
    tasks whose weights hit in L2 are not charged a one-shot ramp on their L2 bytes."""
    p = _deep_profile()
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    plan = _cohort_plan(12, num_programs=4)  # 4 programs: the top-k's and 3 idle, 12 GEMM 1 tasks
    d, b = 160 << 10, float(1 << 20)
    on = task_cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    km = p.kernel
    fixed = km.task_overhead_s + km.ticket_s
    first = b / (cost.deep_read_rate(p, 4, d, 1, b) / 4) + fixed  # the cohort: 4 programs released together
    later = b / (cost.deep_stream_rate(p, 4, d, 1) / 4) + fixed  # then back to back with 4 busy
    start = on["span_us"]["router_topk"][1] + km.flag_handoff_s * 1e6
    assert on["span_us"]["gemm1"][1] == pytest.approx(start + (first + 2 * later) * 1e6)
    c = task_cost.task_costs(plan, p, num_programs=4, weight_depth={"gemm1": d})
    np.testing.assert_array_equal(c["memory_P_s"], np.maximum(c["dram_P_s"], c["l2_P_s"]))


def test_megakernel_weight_depth_is_the_deep_readers_depth():
    """scale.megakernel_weight_depth: the megakernel's GEMM loops' weight buffers as the hbm_deep step
    counts its readers' (microbench_deep.deep_read_depth's gemm_shared_bytes with no A bytes): Qwen3-30B-A3B
    T = 64 (64 x 128 x 64 gated GEMM 1 and 128 x 64 GEMM 2 tiles, 5 stages of wgmma: 5 buffers)."""
    from megamoe.kernels.plan import gemm_shared_bytes
    from megamoe.predict import megakernel_weight_depth

    mk = {"num_stages": 5, "tiles": {"gemm1": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64},
                                     "gemm2": {"BLOCK_N": 128, "BLOCK_K": 64}}}
    assert megakernel_weight_depth(mk) == {"gemm1": 5 * 2 * 128 * 64 * 2, "gemm2": 5 * 128 * 64 * 2}
    mk16 = {"num_stages": 4, "tiles": {"gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
                                       "gemm2": {"BLOCK_N": 128, "BLOCK_K": 128}}}
    deep_reader = gemm_shared_bytes({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 4}, 0.0, 2.0, 2)
    assert megakernel_weight_depth(mk16)["gemm1"] == deep_reader == 3 * 2 * 64 * 128 * 2  # mma.sync: stages - 1


def test_task_prologue_adds_its_round_trips_to_the_routed_gemm_tasks_compute_only(monkeypatch):
    """USE_TASK_PROLOGUE: each GEMM 1 / GEMM 2 task's compute term grows by TASK_ROUND_TRIPS of its kind
    x the profile's ticket_s; its memory terms and every other kind's terms do not change."""
    from megamoe.reference.tiles import TASK_ROUND_TRIPS

    d = _profile().to_dict()
    d["kernel_model"]["ticket_s"] = _num(6.5e-7, "s")
    p = validate(d)
    plan = _task_plan()
    off = task_cost.task_costs(plan, p, num_programs=264)
    assert np.array_equal(off["compute_s"], task_cost.task_costs(plan, _profile(), num_programs=264)["compute_s"])
    monkeypatch.setattr(cost, "USE_TASK_PROLOGUE", True)
    on = task_cost.task_costs(plan, p, num_programs=264)
    kinds = off["kinds"]
    ticket = cost._km(p).ticket_s
    assert ticket > 0
    for k in kinds:
        m = off["kind"] == kinds.index(k)
        if not m.any():
            continue
        want = off["compute_s"][m] + (TASK_ROUND_TRIPS.get(k, 0) * ticket if k in TASK_ROUND_TRIPS else 0.0)
        assert on["compute_s"][m] == pytest.approx(want, rel=1e-12, abs=0.0), k
    assert set(TASK_ROUND_TRIPS) <= set(kinds) and all(v > 0 for v in TASK_ROUND_TRIPS.values())
    for key in ("memory_P_s", "dram_P_s", "l2_P_s", "serial_s", "pre_s"):
        assert np.array_equal(on[key], off[key]), key


# --------------------------------------------------------------------------- the window roofline
def _skewed_stage(blocks=(8,) + (1,) * 8, nt=16, warps=8):
    """A grouped GEMM 1 launch of 64-row tiles over 7168: experts of ``blocks`` row blocks (default one
    of 8, whose weight tiles its 8 row blocks share, then 8 of one, each tile of theirs read from DRAM),
    ``nt`` N tiles each, GROUP_M 8."""
    ob = {"a": 64 * 7168 * 2.0, "b": 2 * 128 * 7168 * 2.0, "out": 64 * 128 * 2.0}
    return dict(name="gemm1", kernel="_k", active_programs=sum(blocks) * nt,
                tile=dict(BLOCK_M=64, BLOCK_N=128, num_warps=warps, GROUP_M=8), bytes_per_tile=sum(ob.values()),
                flops_per_tile=2 * 64 * 256 * 7168, operand_bytes_per_tile=ob, row_blocks_per_expert=blocks,
                tiles_per_expert=tuple(b * nt for b in blocks), work_tile={"m": 64, "n": 256, "depth": 7168})


def _tiny_stage():
    a, b, out = 1000.0, 10000.0, 10.0
    return dict(name="g", kernel="_k", active_programs=6, tile=dict(GROUP_M=2), bytes_per_tile=a + b + out,
                flops_per_tile=1.0, operand_bytes_per_tile={"a": a, "b": b, "out": out},
                row_blocks_per_expert=(2, 0, 1), tiles_per_expert=(4, 0, 2)), (a, b, out)


def test_launch_order_dram_follows_the_kernels_program_order():
    """Experts of 2 and 1 row blocks, 2 columns, GROUP_M 2: the kernel's order is (col 0, block 0),
    (0, 1), (1, 0), (1, 1) for the first group, (0, 2), (1, 2) for the second; a program reads its rows
    at column 0 and its weight tile where its block is its expert's first in the group, in all
    grouped_dram_bytes' count."""
    st, (a, b, out) = _tiny_stage()
    want = np.array([a + b, a, b, 0.0, a + b, b]) + out
    assert cost.launch_order_dram(st) == pytest.approx(want)
    assert want.sum() == pytest.approx(cost.grouped_dram_bytes((2, 1), (4, 2), a, b, out, 2))
    assert cost.launch_order_dram(dict(st, operand_bytes_per_tile=None)) is None  # no grouped L2 model
    assert cost.launch_order_dram(dict(st, tiles_per_expert=(4, 0, 3))) is None  # experts differ in columns


def test_window_shares_slide_over_the_programs_in_flight():
    """Windows of 2 programs in flight at each of the 6 positions (circular): a position's DRAM share is
    its window's DRAM bytes / (2 x all of them), its L2 share likewise; every share sums to 1; a launch
    that fits in one wave has none."""
    st, (a, b, out) = _tiny_stage()
    d = cost.launch_order_dram(st)
    h = (a + b + out) - d
    sh = cost.window_shares(st, 2)
    assert len(sh) == 6
    win = lambda v: (v + np.roll(v, -1)) / (2 * v.sum())  # noqa: E731
    assert [x[0] for x in sh] == pytest.approx([1 / 6] * 6)
    assert [x[1] for x in sh] == pytest.approx(win(d))
    assert [x[2] for x in sh] == pytest.approx(win(h))
    assert [sum(x[k] for x in sh) for k in range(3)] == pytest.approx([1.0, 1.0, 1.0])
    assert cost.window_shares(st, 6) == () and cost.window_shares(st, 8) == ()


def test_window_roofline_keeps_a_skewed_launchs_parts_apart(monkeypatch):
    """The heavy expert's programs (weights shared by 8 row blocks) and the light experts' (every
    weight tile from DRAM) are not in flight together: on, the launch takes the sum over the window's
    positions of its largest term share, more than its largest whole-launch term; the terms themselves
    are unchanged."""
    p = _profile()
    st = _skewed_stage()
    off = cost.predict_stage(st, p)
    assert off.window_shares == () and off.windows_us == 0.0
    assert off.time_us == pytest.approx(max(off.compute_us, off.memory_us, off.serial_us) + off.launch_us
                                        + off.overhead_us)
    monkeypatch.setattr(cost, "USE_WINDOW_ROOFLINE", True)
    on = cost.predict_stage(st, p)
    for f in ("compute_us", "memory_us", "serial_us", "launch_us", "overhead_us", "waves", "memory_term"):
        assert getattr(on, f) == getattr(off, f), f
    slots = p.num_sms * cost.occupancy(p, 8)
    assert on.waves == 2 and slots < st["active_programs"] and on.window_shares
    hbm, l2, intake = on.memory_terms_us
    assert max(hbm, l2, intake) == pytest.approx(on.memory_us)
    want = sum(max(fp * on.compute_us, fd * hbm, fl * l2, fp * intake) for fp, fd, fl in on.window_shares)
    assert on.windows_us == pytest.approx(want)
    assert want > 1.05 * max(off.compute_us, off.memory_us)  # the two parts do not hide each other
    assert on.time_us == pytest.approx(want + on.launch_us + on.overhead_us)
    assert on.to_dict()["windows_us"] == pytest.approx(want)


def test_window_roofline_leaves_even_and_single_wave_launches(monkeypatch):
    """A launch whose every window holds the same mix (32 experts of one row block), a launch of one
    wave and the router stage (no grouped L2 model) predict the same on and off."""
    p = _profile()
    stages = [_skewed_stage(blocks=(1,) * 32), _skewed_stage(blocks=(1,) * 8), _router_stage()]
    off = [cost.predict_stage(s, p) for s in stages]
    monkeypatch.setattr(cost, "USE_WINDOW_ROOFLINE", True)
    on = [cost.predict_stage(s, p) for s in stages]
    assert on[0].waves > 1 and on[0].window_shares
    assert on[0].time_us == pytest.approx(off[0].time_us, rel=1e-9)
    assert on[1] == off[1] and on[1].waves == 1
    assert on[2] == off[2]


def test_window_roofline_keeps_the_sustained_clocks(monkeypatch):
    """With USE_SUSTAINED_CLOCKS the plan's compute terms are divided by the ratio after the stages are
    priced: the windows' compute shares follow (windows_us from the scaled compute term). Three times
    the FLOPs, so that the heavy expert's part is bound by its MMA."""
    p = _profile()
    st = dict(_skewed_stage(), flops_per_tile=3 * _skewed_stage()["flops_per_tile"])
    monkeypatch.setattr(cost, "USE_WINDOW_ROOFLINE", True)
    s0 = cost.predict_stage(st, p)
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    slow = cost.predict_launch_plan([st], p, calls_per_graph=8, calls_before=2000)
    ratio = slow["sustained_ratio"]
    assert ratio < 0.99
    s1 = slow["stages"][0]
    assert s1["compute_us"] == pytest.approx(s0.compute_us / ratio)
    hbm, l2, intake = s0.memory_terms_us
    want = sum(max(fp * s0.compute_us / ratio, fd * hbm, fl * l2, fp * intake) for fp, fd, fl in s0.window_shares)
    assert s1["windows_us"] == pytest.approx(want) and want > s0.windows_us


# --------------------------------------------------------------------------- the tasks' share over their lives
def test_lifetime_share_averages_a_programs_rate_over_the_tasks_life():
    """HBM saturated by one program (h = n / R): task A runs [0, 2] us, B [0, 1] us, so A streams with
    two programs for its first half (a share of 2) and alone for its second (4): 1 / mean(1 / h) = 1/3;
    B, two programs all its life: 1/2. A task waiting on a counter (not yet started) counts for nothing."""
    h = np.array([[0.25, 0.5, 0.75, 1.0]])  # (C = 1, R = 4)
    got = task_cost.lifetime_h(np.array([0.0, 0.0]), np.array([2e-6, 1e-6]), h, np.zeros(2, np.int64))
    assert got == pytest.approx([1 / 3, 1 / 2])
    got = task_cost.lifetime_h(np.array([0.0, 0.0, 3e-6]), np.array([2e-6, 1e-6, 4e-6]), h, np.zeros(3, np.int64))
    assert got == pytest.approx([1 / 3, 1 / 2, 1 / 4])  # the third starts after both: alone


@pytest.mark.skipif(not (RUN53 / "profile.json").exists(), reason="stored run 53 not in this checkout")
def test_stream_share_speeds_up_a_partial_last_wave(monkeypatch):
    """Run 53's Mixtral-8x7B T = 8 Zipf megakernel row (448 GEMM 1 tasks on 132 programs: 3.4 waves,
    memory-bound), the other switches at their defaults: with USE_TASK_STREAM_SHARE the last wave's 52
    tasks stream at the share of the programs still reading, so the prediction drops by more than 4%
    (+12% -> +6% against the measurement); off, the single-pass schedule's exactly. The uniform row
    (784 tasks: a last wave of 124) moves by less than 1.5%."""
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig

    for name, on in DEFAULTS.items():
        monkeypatch.setattr(cost, name, on)
    monkeypatch.setattr(cost, "USE_TASK_STREAM_SHARE", False)
    rows = {r["routing"]: r for r in map(json.loads, (RUN53 / "validation_2026-12-02.jsonl").read_text().splitlines())
            if r.get("phase") == "measurement" and r["preset"] == "mixtral-8x7b" and r["T"] == 8
            and r["backend"] == "megakernel"}
    prof = load_profile(str(RUN53 / "profile.json"))

    def pred(r):
        return predict_config(MoEConfig.preset(r["preset"]), r["counts"], 8, "megakernel", prof, device_name=r["gpu"],
                              calls_per_graph=int(r["calls_per_graph"]), triton_version=r.get("triton"),
                              reps=r.get("reps"))["predicted_us"]

    off = {k: pred(rows[k]) for k in ("zipf", "uniform")}
    monkeypatch.setattr(cost, "USE_TASK_STREAM_SHARE", True)
    on = {k: pred(rows[k]) for k in ("zipf", "uniform")}
    assert on["zipf"] < 0.96 * off["zipf"]
    assert abs(on["zipf"] - rows["zipf"]["measured_us"]) < abs(off["zipf"] - rows["zipf"]["measured_us"])
    assert abs(on["uniform"] / off["uniform"] - 1) < 0.015
    monkeypatch.setattr(cost, "USE_TASK_STREAM_SHARE", False)
    assert pred(rows["zipf"]) == off["zipf"]


def test_reduce_width_table_loads_and_reads_at_a_width():
    """kernel_model.serial_reduce_width loads sorted by width; read linear in log2 width between its
    points and clamped at its ends; None without the table; the selection width is E padded to a
    power of two, at least 16 (BLOCK_E)."""
    p = _profile()
    assert p.kernel.serial_reduce_width == REDUCE_WIDTH_POINTS
    assert _profile(tables=False).kernel.serial_reduce_width == ()
    assert cost.reduce_step_at_width(_profile(tables=False), 128) is None
    assert cost.reduce_step_at_width(p, 128) == pytest.approx(4e-7)
    assert cost.reduce_step_at_width(p, 256) == pytest.approx(1e-6)
    assert cost.reduce_step_at_width(p, 181.02) == pytest.approx(7e-7, rel=1e-4)  # sqrt(128 x 256): halfway
    assert cost.reduce_step_at_width(p, 16) == pytest.approx(4e-7)  # clamped below
    assert cost.reduce_step_at_width(p, 1024) == pytest.approx(1e-6)  # and above
    assert [cost.selection_width(e) for e in (1, 8, 60, 64, 128, 129, 256)] == [16, 16, 64, 64, 128, 256, 256]
    d = p.to_dict()
    d["kernel_model"]["serial_reduce_width"]["points"] = [[128, 4e-7], [128, 5e-7]]
    with pytest.raises(Exception, match="width twice"):
        validate(d)


def test_reduce_step_by_width_prices_the_topk_passes(monkeypatch):
    """USE_REDUCE_STEP_BY_WIDTH on: a router_topk task's serial time falls by its passes x (the scalar
    step - the table's step at BLOCK_E = 128), Qwen3-30B-A3B's 128 experts, K = 8 passes; the other
    tasks' serial terms stay; off, or without the table, nothing changes; serial_step_s without a width
    is the scalar either way."""
    p, q = _profile(), _profile(tables=False)
    plan = _task_plan()
    kinds = list(task_cost._plan_arrays(plan)["kinds"])
    off = task_cost.task_costs(plan, p, num_programs=264)
    assert task_cost.task_costs(plan, q, num_programs=264)["serial_s"].tolist() == off["serial_s"].tolist()
    monkeypatch.setattr(cost, "USE_REDUCE_STEP_BY_WIDTH", True)
    on = task_cost.task_costs(plan, p, num_programs=264)
    topk = off["kind"] == kinds.index("router_topk")
    assert topk.any()
    passes = plan.topk_passes
    assert passes == 8
    assert np.allclose(off["serial_s"][topk] - on["serial_s"][topk], passes * (6e-7 - 4e-7), rtol=0, atol=1e-15)
    assert on["serial_s"][~topk].tolist() == off["serial_s"][~topk].tolist()
    assert task_cost.task_costs(plan, q, num_programs=264)["serial_s"].tolist() == off["serial_s"].tolist()
    assert cost.serial_step_s(p, "reduce") == pytest.approx(6e-7)
    assert cost.serial_step_s(p, "reduce", 256) == pytest.approx(1e-6)
    monkeypatch.setattr(cost, "USE_REDUCE_STEP_BY_WIDTH", False)
    assert cost.serial_step_s(p, "reduce", 256) == pytest.approx(6e-7)


def test_reduce_step_by_width_prices_each_routing_and_the_routers_select(monkeypatch):
    """With tiles["router"]["EACH"] each GEMM 1 task's pre-step is its passes at the width's step; a
    multi-launch router stage without a route_select time prices its "select" steps at BLOCK_E's step
    and its other reductions at the scalar."""
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    p = _profile()
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 1, "BLOCK_H": 64, "SPLIT": 4, "EACH": 1},
             "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128},
             "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = np.array([1] * 8 + [0] * (cfg.num_experts - 8))
    plan = task_plan(cfg, counts, 1, tiles, num_programs=132)
    if not plan.tiles["router"].get("EACH"):
        pytest.skip("EACH does not apply to this plan")
    g1 = task_cost._plan_arrays(plan)["kind"] == list(task_cost._plan_arrays(plan)["kinds"]).index("gemm1")
    off = task_cost.task_costs(plan, p, num_programs=132)["pre_s"]
    monkeypatch.setattr(cost, "USE_REDUCE_STEP_BY_WIDTH", True)
    on = task_cost.task_costs(plan, p, num_programs=132)["pre_s"]
    assert np.allclose(off[g1] - on[g1], plan.topk_passes * (6e-7 - 4e-7), rtol=0, atol=1e-15)
    assert on[~g1].tolist() == off[~g1].tolist()
    stage = dict(_router_stage(), tile=dict(BLOCK_T=16, BLOCK_E=256, num_warps=4),
                 serial_steps={"load": 56, "reduce": 2, "select": 8})
    monkeypatch.setattr(cost, "USE_REDUCE_STEP_BY_WIDTH", False)
    s_off = cost.predict_stage(stage, p).serial_us
    monkeypatch.setattr(cost, "USE_REDUCE_STEP_BY_WIDTH", True)
    s_on = cost.predict_stage(stage, p).serial_us
    waves = cost.predict_stage(stage, p).waves
    assert s_on - s_off == pytest.approx(waves * 8 * (1e-6 - 6e-7) * 1e6)


def _shallow_profile():
    """_profile's tables with the deep readers' table measured from 32 KiB (calibrate's hbm_deep step since
    session 17): the same function of depth, so the 32 KiB reader reads 12.5% slower than the 48 KiB one."""
    d = _profile().to_dict()
    pts = [[P, dd, g, b, float(_deep(P, dd, g, b))] for P in DEEP_GRID[0] for dd in (32 << 10, *DEEP_GRID[1])
           for g in DEEP_GRID[2] for b in DEEP_GRID[3]]
    d["kernel_model"]["hbm_deep_read"] = _table("bytes/s", DEEP_AXES, pts)
    return validate(d)


def test_shallow_deep_read_prices_tasks_below_the_grids_reader(monkeypatch):
    """USE_SHALLOW_DEEP_READ: with a 32 KiB reader in the deep table, depths from it up to the hbm grid's
    reader (HBM_GRID_READER_DEPTH_BYTES) read the table, not the grid; off, or with a table that starts at
    the grid's reader (every profile before session 17), exactly as before: the grid below and at 48 KiB,
    the table above. Under the shallowest reader the grid still prices the read."""
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    shallow, old = _shallow_profile(), _profile()
    grid = cost.HBM_GRID_READER_DEPTH_BYTES
    assert grid == 48 << 10
    for on in (False, True):
        monkeypatch.setattr(cost, "USE_SHALLOW_DEEP_READ", on)
        assert [cost.deep_table_covers(old, d) for d in (16 << 10, 32 << 10, grid, 64 << 10)] == [False, False, False,
                                                                                                True]
        assert [cost.deep_table_covers(shallow, d) for d in (16 << 10, 32 << 10, 40 << 10, grid, 64 << 10)] == [
            False, on, on, False, True]
    # what it changes: a task plan whose GEMM tasks keep 32 KiB in flight reads slower, the deep table's 32 KiB point
    plan = _task_plan()
    depth = {"gemm1": 32 << 10, "gemm2": 32 << 10}
    monkeypatch.setattr(cost, "USE_SHALLOW_DEEP_READ", False)
    off = task_cost.predict_task_plan(plan, shallow, num_programs=264, weight_depth=depth)["time_us"]
    assert off == task_cost.predict_task_plan(plan, old, num_programs=264, weight_depth=depth)["time_us"]
    monkeypatch.setattr(cost, "USE_SHALLOW_DEEP_READ", True)
    on = task_cost.predict_task_plan(plan, shallow, num_programs=264, weight_depth=depth)["time_us"]
    assert on != off
    assert task_cost.predict_task_plan(plan, old, num_programs=264, weight_depth=depth)["time_us"] == off
