"""The cost model's switches for the shared-read, many-program serial and weight-reuse tables
(cost.USE_L2_SHARED_READ, USE_L2_SHARED_READ_TASKS, USE_L2_SHARED_INTAKE, USE_SERIAL_STEP_TABLES,
USE_GEMM_REUSE_TABLE), the tasks' streaming intake (USE_TASK_STREAM_INTAKE), the launches' shared
memory and weight streams (USE_SHARED_MEMORY_OCCUPANCY, USE_WEIGHT_STREAMS), the deep readers' HBM
table (USE_DEEP_READ_TABLE), the sustained-clock ratio of the MMA terms (USE_SUSTAINED_CLOCKS), the
L2 reads by bytes in flight (USE_L2_READ_DEPTH), the megakernel tasks' HBM reads by depth and by cohort
(USE_TASK_DEEP_READ):
their defaults (USE_L2_SHARED_READ on since run AH; USE_SUSTAINED_CLOCKS, USE_L2_READ_DEPTH and
USE_TASK_DEEP_READ since runs AW-AY; the others off); each changes only the terms it
names when on and the profile has its table, and nothing where the profile has none. The tests of
the mechanics start from every switch off (the ``_all_off`` fixture)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.simulator import cost, load_profile
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
    d["kernel_model"] = km
    return validate(d)


#: the sustained-clock table (busy seconds, average ratio from idle): work done W(t) = t x ratio is
#: 0.01, 0.09, 0.24 at 10, 100, 300 ms, so the marginal ratio is 1 up to 10 ms, 8/9 to 100 ms, 0.75 after
SUSTAINED_POINTS = ((0.01, 1.0), (0.1, 0.9), (0.3, 0.8))


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


SWITCHES = ("USE_L2_SHARED_READ", "USE_L2_SHARED_READ_TASKS", "USE_L2_SHARED_INTAKE", "USE_SERIAL_STEP_TABLES",
            "USE_GEMM_REUSE_TABLE", "USE_TASK_STREAM_INTAKE", "USE_SHARED_MEMORY_OCCUPANCY", "USE_WEIGHT_STREAMS",
            "USE_DEEP_READ_TABLE", "USE_SUSTAINED_CLOCKS", "USE_L2_READ_DEPTH", "USE_TASK_DEEP_READ",
            "USE_L2_MANY_READERS", "USE_TASK_REUSE_TABLE")
DEFAULTS = {name: getattr(cost, name) for name in SWITCHES}  # at import, before any test patches them
#: the switches that read a table of their own (USE_TASK_STREAM_INTAKE reads the L2 rate every profile has;
#: the shared-memory and weight-stream switches read the stage and the profile's HBM grid; USE_TASK_DEEP_READ's
#: cohorts read the HBM grid where the profile has no deep table)
TABLE_SWITCHES = tuple(n for n in SWITCHES if n not in ("USE_TASK_STREAM_INTAKE", "USE_SHARED_MEMORY_OCCUPANCY",
                                                         "USE_WEIGHT_STREAMS", "USE_TASK_DEEP_READ"))


@pytest.fixture(autouse=True)
def _all_off(monkeypatch):
    for name in SWITCHES:
        monkeypatch.setattr(cost, name, False)


def test_switch_defaults():
    """Run AH validated the launches' shared-read L2 hits, runs AW-AY the sustained clocks, the L2
    read depth and the tasks' deep reads together; the others stay off."""
    assert DEFAULTS == {"USE_L2_SHARED_READ": True, "USE_L2_SHARED_READ_TASKS": False,
                        "USE_L2_SHARED_INTAKE": False, "USE_SERIAL_STEP_TABLES": False,
                        "USE_GEMM_REUSE_TABLE": False, "USE_TASK_STREAM_INTAKE": False,
                        "USE_SHARED_MEMORY_OCCUPANCY": False, "USE_WEIGHT_STREAMS": False,
                        "USE_DEEP_READ_TABLE": False, "USE_SUSTAINED_CLOCKS": True,
                        "USE_L2_READ_DEPTH": True, "USE_TASK_DEEP_READ": True, "USE_L2_MANY_READERS": False,
                        "USE_TASK_REUSE_TABLE": False}


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
    l2_bandwidth_bytes_per_s unless USE_L2_SHARED_READ_TASKS is on."""
    p = _profile()
    plan = _task_plan()
    off = cost.task_costs(plan, p, num_programs=264)
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)
    assert np.array_equal(cost.task_costs(plan, p, num_programs=264)["memory_P_s"], off["memory_P_s"])
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ_TASKS", True)
    assert not np.array_equal(cost.task_costs(plan, p, num_programs=264)["memory_P_s"], off["memory_P_s"])


def test_shared_read_rate_and_step_tables_read_as_documented(monkeypatch):
    p = _profile()
    assert cost.l2_shared_rate(p, 64, 4) == pytest.approx(_l2(64, 4))  # a grid point
    assert cost.l2_shared_rate(p, 32, 8) == pytest.approx(_l2(32, 8))  # bilinear in log2: exact here
    assert cost.l2_shared_rate(p, 1024, 64) == pytest.approx(_l2(256, 16))  # clamped at the edges
    assert cost.l2_shared_rate(_profile(tables=False), 64, 4) is None
    # off: the scalars and the L2 re-read rate, table or not
    assert cost.serial_step_s(p, "load", 128) == 4e-7 and cost.serial_step_s(p, "reduce", 16) == 6e-7
    assert cost.l2_hit_rate(p, 64, 4) == 7.8e12
    monkeypatch.setattr(cost, "USE_SERIAL_STEP_TABLES", True)
    monkeypatch.setattr(cost, "USE_L2_SHARED_READ", True)
    assert cost.serial_step_s(p, "load", 4) == pytest.approx(_load_step(4))
    assert cost.serial_step_s(p, "reduce", 1000) == pytest.approx(_reduce_step(128))  # clamped
    assert cost.l2_hit_rate(p, 64, 4) == pytest.approx(_l2(64, 4))
    q = _profile(tables=False)  # on, but no tables: the scalars
    assert cost.serial_step_s(q, "load", 64) == 4e-7 and cost.l2_hit_rate(q, 64, 4) == 7.8e12
    with pytest.raises(ValueError, match="'load' or 'reduce'"):
        cost.serial_step_s(p, "scan", 1)


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


def test_intake_switch_prices_only_the_sms_intake(monkeypatch):
    p = _profile()
    g, r = _gemm_stage(), _router_stage()
    off_g, off_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    monkeypatch.setattr(cost, "USE_L2_SHARED_INTAKE", True)
    on_g, on_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    # by hand: 224 programs in flight; per program a at its row group (16 for every expert), b at
    # its weight group (1, 3, 8), the output at 1, each at the table's rate / 132; the mean over the
    # tiles (16, 48, 160), two waves of programs on the 132 SMs
    n, ob = 224, g["operand_bytes_per_tile"]
    t_e = [132 * (ob["a"] / _l2(n, 16) + ob["b"] / _l2(n, gw) + ob["out"] / _l2(n, 1)) for gw in (1, 3, 8)]
    want = 2 * np.dot([16, 48, 160], t_e) / 224
    assert cost.stage_intake_s(g, 224, n, p) == pytest.approx(want)
    hbm = cost.launch_read_s(p, cost.dram_bytes(g), 224, 264)
    hit = 224 * g["bytes_per_tile"] - cost.dram_bytes(g)
    assert on_g.memory_us == pytest.approx(max(hbm, hit / 7.8e12, want) * 1e6)  # the L2-hit term keeps its rate
    assert on_g.memory_us != off_g.memory_us
    for f in ("compute_us", "serial_us", "launch_us", "overhead_us", "waves", "occupancy"):
        assert getattr(on_g, f) == getattr(off_g, f), f
    assert on_r.serial_us == off_r.serial_us and on_r.compute_us == off_r.compute_us
    # the task plans have no intake term: untouched
    plan = _task_plan()
    monkeypatch.setattr(cost, "USE_L2_SHARED_INTAKE", False)
    t_off = cost.predict_task_plan(plan, p, num_programs=264)
    monkeypatch.setattr(cost, "USE_L2_SHARED_INTAKE", True)
    assert cost.predict_task_plan(plan, p, num_programs=264) == t_off


def test_serial_switch_prices_only_the_serial_steps(monkeypatch):
    p = _profile()
    g, r = _gemm_stage(), _router_stage()
    off_g, off_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    assert off_r.serial_us == pytest.approx((56 * 4e-7 + 8 * 6e-7) * 1e6)
    monkeypatch.setattr(cost, "USE_SERIAL_STEP_TABLES", True)
    on_g, on_r = cost.predict_stage(g, p), cost.predict_stage(r, p)
    assert on_r.serial_us == pytest.approx((56 * _load_step(32) + 8 * _reduce_step(32)) * 1e6)  # 32 programs at once
    assert on_r.serial_us > off_r.serial_us
    for f in ("compute_us", "memory_us", "launch_us", "overhead_us", "memory_term"):
        assert getattr(on_r, f) == getattr(off_r, f), f
    assert on_g == off_g  # no serial steps


def _task_plan():
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 4}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
             "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = np.array([64] * 8 + [0] * (cfg.num_experts - 8))  # 4 row blocks per expert: weight tiles re-read
    return task_plan(cfg, counts, 64, tiles, num_programs=264)


def test_switches_change_only_their_task_terms(monkeypatch):
    """task_costs: the L2 switch changes the memory time of tasks with L2-hit bytes only; the
    serial switch the serial time of the router and align kinds only; each leaves the rest."""
    p = _profile()
    plan = _task_plan()
    off = cost.task_costs(plan, p, num_programs=264)
    kinds = off["kinds"]
    serial_kind = np.isin(off["kind"], [kinds.index(k) for k in cost.SERIAL_KINDS if k in kinds])
    assert (off["l2_bytes"] > 0).any() and serial_kind.any()
    with monkeypatch.context() as mp:
        mp.setattr(cost, "USE_L2_SHARED_READ_TASKS", True)
        on = cost.task_costs(plan, p, num_programs=264)
    changed = on["memory_P_s"] != off["memory_P_s"]
    assert changed.any() and not (changed & (off["l2_bytes"] == 0)).any()
    for k in ("compute_s", "serial_s", "dram_bytes", "l2_bytes"):
        assert np.array_equal(on[k], off[k]), k
    with monkeypatch.context() as mp:
        mp.setattr(cost, "USE_SERIAL_STEP_TABLES", True)
        on = cost.task_costs(plan, p, num_programs=264)
    changed = on["serial_s"] != off["serial_s"]
    assert changed.any() and not (changed & ~serial_kind).any()
    for k in ("compute_s", "memory_P_s", "dram_bytes", "l2_bytes"):
        assert np.array_equal(on[k], off[k]), k
    # the router_logits tasks run at once on min(their count, resident programs)
    m = off["kind"] == kinds.index("router_logits")
    conc = min(int(m.sum()), on["resident"])
    steps = np.ceil(off["arrays"]["depth"][m] / plan.tiles["router"]["BLOCK_H"])
    assert on["serial_s"][m] == pytest.approx(steps * _load_step(conc))


def test_sharing_counts_same_key_tasks_in_the_window():
    keys = np.array([5, 5, -1, 5, 7, 5, 7])
    assert cost._sharing(keys, 2).tolist() == [2, 2, 0, 1, 1, 1, 1]  # tickets within 1 of each other
    assert cost._sharing(keys, 3).tolist() == [2, 3, 0, 3, 2, 2, 2]  # within 2
    assert cost._sharing(keys, 100).tolist() == [4, 4, 0, 4, 2, 4, 2]


def test_switches_on_without_tables_predict_as_today(monkeypatch):
    """A profile without the new tables: the table switches on predict exactly what they predict off,
    launch plans and task plans."""
    q = _profile(tables=False)
    plan = _task_plan()
    stages = [_gemm_stage(), _router_stage()]
    off = (cost.predict_launch_plan(stages, q), cost.predict_task_plan(plan, q, num_programs=264))
    for name in TABLE_SWITCHES:
        monkeypatch.setattr(cost, name, True)
    assert (cost.predict_launch_plan(stages, q), cost.predict_task_plan(plan, q, num_programs=264)) == off


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
                                                     "hbm_deep_read", "sustained_mma")})
    with_tables = validate(d)
    assert _repredicted(rows, with_tables) == want  # switches off: the tables are not read
    for name in TABLE_SWITCHES:
        monkeypatch.setattr(cost, name, True)
    assert _repredicted(rows, base) == want  # on, but the profile has no tables
    assert _repredicted(rows, with_tables) != want  # on, with tables: they are read


# --------------------------------------------------------------------------- the reuse table
REUSE_AXES = ["BLOCK_M", "BLOCK_N", "num_warps", "depth", "row_blocks"]


def _reuse(d, r):
    """The synthetic reuse table: linear in log2 depth and log2 row blocks (bilinear is exact on it)."""
    return 1e12 * (1 + np.log2(r) / 4) * (1 + np.log2(d / 1024) / 8)


def _reuse_profile(base=None, scale=1.0):
    """``base`` (default h200's) with gemm_reuse_tma_ab_persistent: 128 x 256, 8 warps, depths 1024
    and 4096, r in 1, 2, 8, rate scale x _reuse(d, r); and gemm_reuse_pointer at 64 x 128, 4 warps."""
    d = (base or load_profile("h200")).to_dict()
    km = d.setdefault("kernel_model", {})
    km["gemm_reuse_tma_ab_persistent"] = _table("flop/s per SM", REUSE_AXES, [
        [128, 256, 8, dp, r, scale * float(_reuse(dp, r))] for dp in (1024, 4096) for r in (1, 2, 8)])
    km["gemm_reuse_pointer"] = _table("flop/s per SM", REUSE_AXES, [
        [64, 128, 4, 2048, r, scale * 0.5 * float(_reuse(2048, r))] for r in (1, 4)])
    return validate(d)


def test_reuse_rate_reads_as_documented():
    p = _reuse_profile()
    f = cost.gemm_reuse_rate
    assert f(p, "tma_ab_persistent", 128, 256, 1024, 8, 2) == pytest.approx(_reuse(1024, 2))  # a grid point
    assert f(p, "tma_ab_persistent", 128, 256, 2048, 8, 4) == pytest.approx(_reuse(2048, 4))  # bilinear in log2
    assert f(p, "tma_ab_persistent", 128, 256, 16384, 8, 64) == pytest.approx(_reuse(4096, 8))  # clamped
    assert f(p, "tma_ab_persistent", 128, 256, 512, 8, 1) == pytest.approx(_reuse(1024, 1))
    np.testing.assert_allclose(f(p, "tma_ab_persistent", 128, 256, 1024, 8, np.array([1.0, 2.0, 3.0])),
                               _reuse(1024, np.array([1.0, 2.0, 3.0])))  # arrays of row blocks
    # the nearest shape; the GEMM_LOADS fallbacks (flat -> its loop; GEMM 1's TMA loop -> tma_persistent,
    # of which none is measured here)
    assert f(p, "tma_ab_persistent", 128, 128, 1024, 8, 2) == f(p, "tma_ab_persistent", 128, 256, 1024, 8, 2)
    assert f(p, "tma_ab_persistent_flat", 128, 256, 1024, 8, 2) == pytest.approx(_reuse(1024, 2))
    assert f(p, "tma_persistent_gated", 128, 256, 1024, 8, 2) is None
    # tiles under REUSE_TABLE_MIN_ROWS rows (64-row pointer tiles): not read, as the dense tables
    # (bound by their own operand traffic, which the memory term counts); read where the floor is 0
    assert cost.REUSE_TABLE_MIN_ROWS == cost.GEMM_TABLE_MIN_ROWS == 128
    assert f(p, "pointer_gated", 64, 128, 2048, 4, 2) is None
    # none for "any", tiles below the table's smallest BLOCK_M, profiles without a table
    assert f(p, "any", 128, 256, 1024, 8, 2) is None
    assert f(p, "pointer", 32, 128, 2048, 4, 2) is None
    assert f(load_profile("h200"), "tma_ab_persistent", 128, 256, 1024, 8, 2) is None


def test_reuse_rate_below_the_row_floor_reads_where_allowed(monkeypatch):
    """With REUSE_TABLE_MIN_ROWS 0 the 64-row pointer table is read (nearest shape, the GEMM_LOADS
    fallback pointer_gated -> pointer); tiles under the table's own smallest BLOCK_M still are not."""
    p = _reuse_profile()
    monkeypatch.setattr(cost, "REUSE_TABLE_MIN_ROWS", 0)
    assert cost.gemm_reuse_rate(p, "pointer_gated", 64, 128, 2048, 4, 2) == pytest.approx(0.5 * _reuse(2048, 2))
    assert cost.gemm_reuse_rate(p, "pointer", 32, 128, 2048, 4, 2) is None


def _reuse_stage(loads="tma_ab_persistent"):
    """A grouped GEMM 2 launch of 128 x 256 tiles, experts of 1, 3 and 10 row blocks, 28 N tiles."""
    be, nt, K = (1, 3, 10), 28, 2048
    ob = {"a": 128 * K * 2.0, "b": 256 * K * 2.0, "out": 128 * 256 * 2.0}
    return dict(name="gemm2", kernel="_k", active_programs=sum(be) * nt,
                tile=dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, GROUP_M=8, variant="tma_persistent"),
                bytes_per_tile=sum(ob.values()), flops_per_tile=2 * 128 * 256 * K, operand_bytes_per_tile=ob,
                row_blocks_per_expert=be, tiles_per_expert=tuple(b * nt for b in be),
                work_tile={"m": 128, "n": 256, "depth": K}, loads=loads, mma_dtype="bf16")


def test_reuse_switch_caps_each_experts_rate_and_nothing_else(monkeypatch):
    """Off: the table is not read. On: each expert's rate is min(the dense path's, the reuse table's
    at its row blocks), the waves over the experts as before; the memory, serial, launch terms
    stay; a table above the dense rate everywhere changes nothing; fp8 stages, 16-row tiles and
    stages without row blocks per expert keep their rate; the task plans are untouched."""
    p, q = _reuse_profile(scale=0.1), load_profile("h200")  # scale 0.1: below the dense rate at small r
    g = _reuse_stage()
    off = cost.predict_stage(g, p)
    assert off == cost.predict_stage(g, q)  # off: as without the table
    plan = _task_plan()
    t_off = cost.predict_task_plan(plan, p, num_programs=264)
    monkeypatch.setattr(cost, "USE_GEMM_REUSE_TABLE", True)
    on = cost.predict_stage(g, p)
    dense = cost.mma_rate_per_sm(p, 128, 256, 2048, 8, loads="tma_ab_persistent")
    rate = np.minimum(dense, 0.1 * _reuse(2048, np.array([1.0, 3.0, 8.0])))  # 10 row blocks: clamped at 8
    assert rate[0] < dense  # the 1-row-block expert is capped
    occ = cost.occupancy(p, 8)
    slots, P = 132 * occ, g["active_programs"]
    share = min(occ, -(-min(P, slots) // 132))  # programs sharing an SM's tensor cores
    want = cost.waves_s(np.array([28.0, 84.0, 280.0]), g["flops_per_tile"] / (rate / share), slots)
    assert on.compute_us == pytest.approx(want * 1e6) and on.compute_us > off.compute_us
    for fld in ("memory_us", "serial_us", "launch_us", "overhead_us", "waves", "occupancy", "memory_term"):
        assert getattr(on, fld) == getattr(off, fld), fld
    assert cost.predict_stage(g, _reuse_profile(scale=1e3)) == off  # never above the dense path's rate
    assert cost.predict_stage(g, q) == off  # on, no table
    assert cost.predict_stage(dict(g, mma_dtype="fp8"), p) == cost.predict_stage(dict(g, mma_dtype="fp8"), q)
    no_rb = {k: v for k, v in g.items() if k not in ("row_blocks_per_expert", "tiles_per_expert")}
    assert cost.predict_stage(no_rb, p) == cost.predict_stage(no_rb, q)
    assert cost.predict_stage(_gemm_stage(), p) == cost.predict_stage(_gemm_stage(), q)  # 16-row tiles
    assert cost.predict_task_plan(plan, p, num_programs=264) == t_off


RUN36 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "validation_2026-12-02_run36"
#: run 36's rows re-predicted with its profile by HEAD's code before the reuse term (commit 193f1ce):
#: (preset, T, routing, backend) -> (predicted_us, gemm2 us)
#: (the multi totals since the prefill router's logits launch, configs.router_prefill, and the align's scan over
#: experts and layout over row blocks: DeepSeek-V3 7867.1 and 23398.6, Qwen3-30B-A3B 332.3 before; since the
#: scatter a program per 32 pairs, align._scatter_pairs_kernel, one reduce step a wave of its 8x more programs
#: instead of K = 8 a wave: 7797.5, 23102.3 and 333.3 before, its stage 5.84 -> 2.44, 11.28 -> 7.88, 5.84 -> 1.08 us)
RUN36_HEAD = {("deepseek-v3", 4096, "uniform", "multi"): (7794.1234610877555, 2327.820689913437),
              ("deepseek-v3", 16384, "uniform", "multi"): (23098.905297257832, 6654.077891065244),
              ("qwen3-30b-a3b", 512, "uniform", "multi"): (328.5322006044422, 102.44359110751975),
              ("deepseek-v3", 4096, "uniform", "megakernel"): (9543.892441301952, 3358.7768206443006)}


def _run36_reuse_profile(base, low: float):
    """Run 36's profile with reuse tables for its prefill GEMMs' loops (GEMM 1 tma_persistent_gated,
    GEMM 2 tma_ab_persistent, 128 x 256, 8 warps) at ``low`` x the dense table's rate at r = 1,
    rising to 1.2 x (above it: the cap leaves the experts of 8+ row blocks alone)."""
    d = base.to_dict()
    frac = {1: low, 2: (1 + low) / 2, 4: 0.95, 8: 1.2, 16: 1.2}
    for form in ("tma_persistent_gated", "tma_ab_persistent"):
        d["kernel_model"][f"gemm_reuse_{form}"] = _table("flop/s per SM", REUSE_AXES, [
            [128, 256, 8, dp, r, f * float(cost.mma_rate_per_sm(base, 128, 256, dp, 8, loads=form))]
            for dp in (2048, 7168) for r, f in frac.items()])
    return validate(d)


@pytest.mark.skipif(not (RUN36 / "profile.json").exists(), reason="stored run 36 not in this checkout")
def test_reuse_switch_on_stored_rows_of_run36(monkeypatch):
    """Off (with or without a reuse table): run 36's rows re-predict as HEAD's code did. On, with a
    synthetic table whose r = 1 rate is half the dense table's: DeepSeek-V3 T = 4096 multi (~1.56
    row blocks per expert) is predicted slower, its GEMM 2 too; the megakernel row (task plans:
    not priced by the term) is unchanged."""
    from megamoe.repredict import repredict_rows

    rows = [json.loads(line) for line in (RUN36 / "validation_2026-12-02.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("phase") == "measurement" and r.get("profile") == "h200-calibrated"
            and (r["preset"], r["T"], r["routing"], r["backend"]) in RUN36_HEAD]
    assert len(rows) == len(RUN36_HEAD)
    base = load_profile(str(RUN36 / "profile.json"))
    with_table = _run36_reuse_profile(base, 0.5)

    def predicted(profile):
        out, _ = repredict_rows(rows, profile)
        return {(r["preset"], r["T"], r["routing"], r["backend"]): (r["predicted_us"], r["predicted_stages"]["gemm2"]["us"])
                for r in out}

    off = predicted(base)
    for key, (total, g2) in RUN36_HEAD.items():
        assert off[key] == (pytest.approx(total, rel=1e-12), pytest.approx(g2, rel=1e-12)), key
    assert predicted(with_table) == off  # switch off: the table is not read
    monkeypatch.setattr(cost, "USE_GEMM_REUSE_TABLE", True)
    assert predicted(base) == off  # on, no table
    on = predicted(with_table)
    ds = ("deepseek-v3", 4096, "uniform", "multi")
    assert on[ds][0] > off[ds][0] * 1.02 and on[ds][1] > off[ds][1]
    mk = ("deepseek-v3", 4096, "uniform", "megakernel")
    assert on[mk] == off[mk]


# --------------------------------------------------------------------------- the tasks' streaming intake
def _concentrated_plan(profile):
    """Qwen3-30B-A3B at T = 64 with every token on experts 0..7 (48 GEMM 1 tasks for 132 programs:
    H200 run AJ's largest error, run AL's trace), as megamoe validate plans it."""
    from megamoe.reference import MoEConfig
    from megamoe.scale import megakernel_task_plan

    counts = np.zeros(128, np.int64)
    counts[:8] = 64
    return megakernel_task_plan(MoEConfig.preset("qwen3-30b-a3b"), counts, 64, device_name="NVIDIA H200",
                                profile=profile)


@pytest.mark.skipif(not (RUN36 / "profile.json").exists(), reason="stored run 36 not in this checkout")
def test_task_stream_intake_lifts_only_few_programs_streaming(monkeypatch):
    """Off: a task plan's streaming rate is the grid's. On: with n programs busy, at least
    n x min(L2 rate / S, the grid's rate at the resident programs / n), never below the grid, equal
    to it at the resident programs; Qwen3-30B-A3B T = 64 concentrated (48 GEMM 1 tasks streaming)
    gets faster GEMM 1 tasks, the launches are untouched."""
    p = load_profile(str(RUN36 / "profile.json"))
    km = p.kernel
    n = np.arange(1, 133, dtype=np.float64)
    grid = np.asarray(cost.hbm_stream_rate(p, n))
    np.testing.assert_array_equal(cost.task_stream_rate(p, n, 132), grid)
    plan, warps, loads = _concentrated_plan(p)
    off = cost.predict_task_plan(plan, p, num_warps=warps, weight_loads=loads)
    stage = _gemm_stage()
    st_off = cost.predict_stage(stage, p)
    monkeypatch.setattr(cost, "USE_TASK_STREAM_INTAKE", True)
    on_rate = np.asarray(cost.task_stream_rate(p, n, 132))
    want = np.maximum(grid, np.minimum(n * km.l2_bandwidth_bytes_per_s / 132, float(cost.hbm_stream_rate(p, 132))))
    np.testing.assert_allclose(on_rate, want)
    assert (on_rate >= grid).all() and on_rate[-1] == pytest.approx(grid[-1])
    assert on_rate[47] / 48 == pytest.approx(km.l2_bandwidth_bytes_per_s / 132)  # 48 busy: the SM's intake binds
    on = cost.predict_task_plan(plan, p, num_warps=warps, weight_loads=loads)
    g1_off, g1_on = off["span_us"]["gemm1"], on["span_us"]["gemm1"]
    assert g1_on[0] == pytest.approx(g1_off[0]) and g1_on[1] < g1_off[1] - 2.0
    assert on["time_us"] < off["time_us"]
    assert on["span_us"]["router_topk"] == off["span_us"]["router_topk"]  # the serial kinds keep their times
    assert cost.predict_stage(stage, p) == st_off


# --------------------------------------------------------------------------- shared memory and weight streams
def _decode_gemm1(row_blocks, *, shared_bytes=139264, P=None):
    """A multi-launch GEMM 1 at decode: 16 x 128 tiles (gate and up), 6 N tiles per expert,
    GROUP_M 8, 4 warps, experts of ``row_blocks`` row blocks; ``shared_bytes`` per program
    (plan.gemm_shared_bytes of 16 x 128 x 128 at 3 stages)."""
    nt = 6
    ob = {"a": 16 * 2048 * 2.0, "b": 2 * 128 * 2048 * 2.0, "out": 16 * 128 * 2.0}
    return dict(name="gemm1", kernel="_k", active_programs=sum(row_blocks) * nt,
                tile=dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=4, GROUP_M=8),
                bytes_per_tile=sum(ob.values()), flops_per_tile=2 * 16 * 256 * 2048, operand_bytes_per_tile=ob,
                row_blocks_per_expert=tuple(row_blocks), tiles_per_expert=tuple(b * nt for b in row_blocks),
                work_tile={"m": 16, "n": 256, "depth": 2048}, shared_bytes=shared_bytes, loads="pointer_gated")


def test_shared_memory_caps_programs_per_sm(monkeypatch):
    """Off: the occupancy table by warps (h200: 2 programs at 4 warps). On: at most the SM's shared
    memory over a program's buffers and the per-block reserve, at least 1; a stage without
    shared_bytes keeps the table's; the profile's sm_shared_memory_bytes is what divides."""
    p = load_profile("h200")
    assert p.kernel.sm_shared_memory_bytes == 228 * 1024
    assert "assumption" in p.kernel.sources["sm_shared_memory_bytes"]
    big, small = _decode_gemm1([4] * 11), _decode_gemm1([4] * 11, shared_bytes=73728)  # 264 programs
    table = cost.occupancy(p, 4)
    assert table == 2
    assert cost.launch_occupancy(p, big) == cost.launch_occupancy(p, small) == table
    off = cost.predict_stage(big, p)
    monkeypatch.setattr(cost, "USE_SHARED_MEMORY_OCCUPANCY", True)
    assert cost.launch_occupancy(p, big) == 1  # 139,264 + 1,024 bytes: one fits in 228 KiB
    assert cost.launch_occupancy(p, small) == 2  # three would fit: the table's 2 stays
    assert cost.launch_occupancy(p, {**big, "shared_bytes": None}) == table
    assert cost.launch_occupancy(p, {**big, "shared_bytes": 300 * 1024}) == 1  # never below one
    on = cost.predict_stage(big, p)
    assert (off.occupancy, off.waves) == (2, 1) and (on.occupancy, on.waves) == (1, 2)
    d = p.to_dict()
    d.setdefault("kernel_model", {})["sm_shared_memory_bytes"] = {"value": 2 * 140288, "unit": "bytes", "source": SRC}
    assert cost.launch_occupancy(validate(d), big) == 2


def test_weight_streams_count_the_distinct_tiles_in_flight(monkeypatch):
    """On: a grouped launch's HBM time is at least its weight tiles as distinct streams. Experts of one
    row block share nothing: the term is the weights' share of the launch's own read and the stage
    is unchanged. Experts of 4 row blocks (one GROUP_M group): 4 programs read each tile at once,
    so the 132 programs in flight (one per SM) are 33 streams, priced by hand below."""
    p = load_profile(str(RUN36 / "profile.json")) if (RUN36 / "profile.json").exists() else load_profile("h200")
    monkeypatch.setattr(cost, "USE_SHARED_MEMORY_OCCUPANCY", True)  # one program per SM: 132 in flight
    alone = _decode_gemm1([1] * 44)  # 264 programs, 264 distinct tiles
    shared = _decode_gemm1([4] * 11)  # 264 programs, 66 distinct tiles
    off = (cost.predict_stage(alone, p), cost.predict_stage(shared, p))
    assert cost.weight_stream_read_s(shared, 132, p) == 0.0  # the switch off: no term
    monkeypatch.setattr(cost, "USE_WEIGHT_STREAMS", True)
    b = shared["operand_bytes_per_tile"]["b"]
    want = cost.launch_read_s(p, 66 * b, 66, 33)
    assert cost.weight_stream_read_s(shared, 132, p) == pytest.approx(want)
    assert cost.weight_stream_read_s(alone, 132, p) == pytest.approx(cost.launch_read_s(p, 264 * b, 264, 132))
    assert cost.weight_stream_read_s(_router_stage(), 132, p) == 0.0  # no grouped GEMM fields
    on = (cost.predict_stage(alone, p), cost.predict_stage(shared, p))
    assert on[0] == off[0]  # nobody shares: the launch's own read (weights and rows) already covers it
    assert on[1].memory_us == pytest.approx(max(off[1].memory_us, want * 1e6))
    assert on[1].memory_us > off[1].memory_us  # 33 streams read HBM slower than 132 programs do


# --------------------------------------------------------------------------- the deep readers' table
def _deep_profile(base=None):
    d = (base or load_profile("h200")).to_dict()
    d.setdefault("kernel_model", {})["hbm_deep_read"] = _deep_table()
    return validate(d)


def test_deep_rate_reads_as_documented(monkeypatch):
    """deep_read_rate: the table at its points, multilinear in log2 between them (exact on the
    synthetic table), clamped at its edges, and above its programs (one per SM) at least the grid's
    rate of the same programs; deep_stream_rate: the marginal rate between the two largest reads
    (hbm_stream_rate's rule) at each node. deep_reads: only with the switch on, the table there and
    a depth above its shallowest reader's."""
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
    assert not cost.deep_reads(p, 128 << 10)  # the switch off
    monkeypatch.setattr(cost, "USE_DEEP_READ_TABLE", True)
    assert cost.deep_reads(p, (48 << 10) + 1) and not cost.deep_reads(p, 48 << 10) and not cost.deep_reads(p, 0.0)
    assert not cost.deep_reads(load_profile("h200"), 128 << 10)  # no table


def test_deep_switch_prices_only_deep_launches(monkeypatch):
    """On: a GEMM launch whose programs keep more than 48 KiB of weights in flight (Qwen3-30B-A3B
    T = 64's GEMM 1: 128 KiB) reads HBM at the deep table, its programs in flight those the SM's
    shared memory holds (one per SM, 132, not the occupancy table's 264), its waves and compute as
    off; with USE_SHARED_MEMORY_OCCUPANCY too, the same read. Unchanged: a launch at or below the
    grid's reader's depth, one without shared_bytes (FP8, small launches), the router, and any
    launch where the profile has no table."""
    p, q = _deep_profile(), load_profile("h200")
    deep = _decode_gemm1([1] * 44)  # 264 programs, 139,264 bytes of buffers: 128 KiB of weights
    shallow = _decode_gemm1([1] * 44, shared_bytes=52000)  # 48,941 bytes of weights: the grid's reader
    stages = [deep, shallow, {**deep, "shared_bytes": None}, _router_stage()]
    off_p, off_q = ([cost.predict_stage(st, x) for st in stages] for x in (p, q))
    monkeypatch.setattr(cost, "USE_DEEP_READ_TABLE", True)
    on_p, on_q = ([cost.predict_stage(st, x) for st in stages] for x in (p, q))
    assert on_q == off_q and on_p[1:] == off_p[1:]
    depth = cost.stage_read_depth(deep)
    assert depth == pytest.approx(128 << 10)
    dram = cost.dram_bytes(deep)
    want = cost.launch_read_s(p, dram, 264, 132, depth=depth)
    b = dram / 264  # two waves of 132: the first one-shot, the second streaming
    assert want == pytest.approx(132 * b / cost.deep_read_rate(p, 132, depth, 1, b)
                                 + 132 * b / cost.deep_stream_rate(p, 132, depth, 1))
    assert on_p[0].memory_term == off_p[0].memory_term == "hbm"
    assert on_p[0].memory_us == pytest.approx(want * 1e6) and want * 1e6 != pytest.approx(off_p[0].memory_us)
    assert (on_p[0].occupancy, on_p[0].waves, on_p[0].compute_us) == (off_p[0].occupancy, off_p[0].waves,
                                                                     off_p[0].compute_us) == (2, 1, off_p[0].compute_us)
    monkeypatch.setattr(cost, "USE_SHARED_MEMORY_OCCUPANCY", True)
    both = cost.predict_stage(deep, p)
    assert both.occupancy == 1 and both.waves == 2
    assert cost.launch_read_s(p, dram, 264, 132 * both.occupancy, depth=depth) == want  # the reads agree


def test_deep_switch_prices_weight_streams_at_the_tables_sharing_group(monkeypatch):
    """With USE_WEIGHT_STREAMS: the distinct weight tiles of experts of 4 row blocks (66 for 264
    programs) are read by the 132 programs in flight in groups of 4 at the deep table's g = 4
    rate (g x the DRAM rate), where the grid would count 33 streams; nobody sharing: group 1."""
    p = _deep_profile()
    monkeypatch.setattr(cost, "USE_WEIGHT_STREAMS", True)
    monkeypatch.setattr(cost, "USE_DEEP_READ_TABLE", True)
    shared, alone = _decode_gemm1([4] * 11), _decode_gemm1([1] * 44)
    depth = cost.stage_read_depth(shared)
    b = shared["operand_bytes_per_tile"]["b"]
    want = 132 * b / cost.deep_read_rate(p, 132, depth, 4, b) + 132 * b / cost.deep_stream_rate(p, 132, depth, 4)
    assert cost.weight_stream_read_s(shared, 132, p, depth=depth) == pytest.approx(want)
    assert cost.weight_stream_read_s(shared, 132, p) == pytest.approx(cost.launch_read_s(p, 66 * b, 66, 33))  # no depth
    assert cost.weight_stream_read_s(alone, 132, p, depth=depth) == pytest.approx(
        cost.launch_read_s(p, 264 * b, 264, 132, depth=depth))
    st = cost.predict_stage(shared, p)
    read = cost.launch_read_s(p, cost.dram_bytes(shared), 264, 132, depth=depth)
    assert st.memory_term == "hbm" and st.memory_us == pytest.approx(max(read, want) * 1e6)


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
    off = cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000)
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", True)
    on = cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000)
    before_s, busy_s = cost.busy_window_s(off["time_us"] * 1e-6, 8, 3000)
    ratio = cost.sustained_ratio(p, busy_s, before_s)
    assert on["sustained_ratio"] == ratio < 1
    c = cost.task_costs(plan, p, num_programs=264)
    want = cost._schedule_tasks({**c, "compute_s": c["compute_s"] / ratio}, p, 8)
    assert {k: v for k, v in on.items() if k != "sustained_ratio"} == want
    assert on["time_us"] >= off["time_us"] and on["dram_bytes"] == off["dram_bytes"]
    assert cost.predict_task_plan(plan, p, num_programs=264) != off  # a shorter window: a smaller change
    monkeypatch.setattr(cost, "USE_SUSTAINED_CLOCKS", False)
    assert cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000) == off


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
        assert by[(16384, b)]["predicted_sustained_ratio"] <= by[(512, b)]["predicted_sustained_ratio"] < 1


def test_the_validation_window_starts_after_the_warm_up_and_the_earlier_replays(monkeypatch):
    """graph_time_us runs 2 eager calls, one untimed replay and the timed ones back to back; its
    median replay of 5 is the third: 2 + NI x 3 calls before it (NI = 8: 26); predict_config with
    the row's reps reads the ratio of that window, without reps the timed graph's from idle."""
    from megamoe.kernels.bench import WARMUP_CALLS, calls_before_timed_replay
    from megamoe.reference import MoEConfig
    from megamoe.scale import predict_config

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
    from megamoe.kernels import microbench_shared as ms

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
    off = cost.task_costs(plan, p, num_programs=132)
    assert cost.task_costs(plan, p, num_programs=132, read_depth=deep)["memory_P_s"].tolist() == off["memory_P_s"].tolist()
    monkeypatch.setattr(cost, "USE_L2_READ_DEPTH", True)
    for depth in (0.0, float(cost.L2_SHARED_READER_DEPTH_BYTES)):
        assert cost.task_costs(plan, p, num_programs=132, read_depth=depth)["memory_P_s"].tolist() == off["memory_P_s"].tolist()
    on = cost.task_costs(plan, p, num_programs=132, read_depth=deep)
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
    """task_read_curves: off, the grid's two curves (pointer, TMA) whatever weight_depth says; on, the
    GEMM kinds whose weight depth the deep table covers (above its 48 KiB reader) stream at
    deep_stream_rate(n, depth, 1) and start together at deep_read_rate; shallower kinds, kinds without
    a depth and a profile without the table keep the grid's."""
    p = _deep_profile()
    plan = _cohort_plan(8)
    kind, kinds = plan["kind"].astype(np.int64), plan["kinds"]
    tma = np.zeros(kind.size, bool)
    deep = {"gemm1": 160 << 10, "gemm2": 80 << 10}
    curve, stream, one = cost.task_read_curves(p, kind, kinds, tma, 132, deep)
    assert curve.tolist() == [0] * kind.size and stream.shape == (2, 132)
    np.testing.assert_allclose(stream[0], cost.task_stream_rate(p, np.arange(1, 133), 132))
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    curve, stream, one = cost.task_read_curves(p, kind, kinds, tma, 132, deep)
    assert curve.tolist() == [0] + [2] * 8 and stream.shape == (3, 132)  # no gemm2 tasks: no curve for it
    assert stream[2][47] == pytest.approx(cost.deep_stream_rate(p, 48, 160 << 10, 1))
    assert one[2](48, 1 << 20) == pytest.approx(cost.deep_read_rate(p, 48, 160 << 10, 1, 1 << 20))
    assert one[0](48, 1 << 20) == pytest.approx(cost.hbm_rate(p, 48, 1 << 20))
    for wd in ({"gemm1": 48 << 10}, {"router_topk": 160 << 10}, None):
        assert cost.task_read_curves(p, kind, kinds, tma, 132, wd)[0].tolist() == [0] * kind.size
    assert cost.task_read_curves(load_profile("h200"), kind, kinds, tma, 132, deep)[0].tolist() == [0] * kind.size


@pytest.mark.parametrize("m", [48, 132], ids=["48-few-programs", "132-every-sm"])
def test_a_cohort_released_together_reads_at_the_one_shot_rate(monkeypatch, m):
    """m GEMM 1 tasks released by one top-k task onto idle programs: off, the first placed sees 1 program
    busy and the last m, each at the grid's marginal rate for those; on, every one of them reads its
    bytes at the one-shot rate of m programs (the deep table at its depth), so they end together at
    top-k end + handoff + b / (deep_read_rate(m, d, 1, b) / m) + the task's fixed cost."""
    p = _deep_profile()
    plan = _cohort_plan(m)
    d, b = 160 << 10, float(1 << 20)
    off = cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    assert off == cost.predict_task_plan(plan, p)  # off: weight_depth is not read
    monkeypatch.setattr(cost, "USE_TASK_DEEP_READ", True)
    on = cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    km = p.kernel
    topk_end = off["span_us"]["router_topk"][1]
    assert on["span_us"]["router_topk"] == off["span_us"]["router_topk"]
    task = b / (cost.deep_read_rate(p, m, d, 1, b) / m) + km.task_overhead_s + km.ticket_s
    start = topk_end + km.flag_handoff_s * 1e6  # the cohort's tasks on other programs than the top-k's
    assert on["span_us"]["gemm1"][0] == pytest.approx(topk_end)  # the top-k's own program: no handoff
    assert on["span_us"]["gemm1"][1] == pytest.approx(start + task * 1e6)
    # without the deep table: the same cohort at the grid's one-shot rate of m programs
    q = load_profile("h200")
    q_on = cost.predict_task_plan(plan, q)
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
    on = cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    km = p.kernel
    fixed = km.task_overhead_s + km.ticket_s
    first = b / (cost.deep_read_rate(p, 4, d, 1, b) / 4) + fixed  # the cohort: 4 programs released together
    later = b / (cost.deep_stream_rate(p, 4, d, 1) / 4) + fixed  # then back to back with 4 busy
    start = on["span_us"]["router_topk"][1] + km.flag_handoff_s * 1e6
    assert on["span_us"]["gemm1"][1] == pytest.approx(start + (first + 2 * later) * 1e6)
    c = cost.task_costs(plan, p, num_programs=4, weight_depth={"gemm1": d})
    np.testing.assert_array_equal(c["memory_P_s"], np.maximum(c["dram_P_s"], c["l2_P_s"]))


def test_megakernel_weight_depth_is_the_deep_readers_depth():
    """scale.megakernel_weight_depth: the megakernel's GEMM loops' weight buffers as the hbm_deep step
    counts its readers' (microbench_deep.deep_read_depth's gemm_shared_bytes with no A bytes): Qwen3-30B-A3B
    T = 64 (64 x 128 x 64 gated GEMM 1 and 128 x 64 GEMM 2 tiles, 5 stages of wgmma: 5 buffers)."""
    from megamoe.kernels.plan import gemm_shared_bytes
    from megamoe.scale import megakernel_weight_depth

    mk = {"num_stages": 5, "tiles": {"gemm1": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64},
                                     "gemm2": {"BLOCK_N": 128, "BLOCK_K": 64}}}
    assert megakernel_weight_depth(mk) == {"gemm1": 5 * 2 * 128 * 64 * 2, "gemm2": 5 * 128 * 64 * 2}
    mk16 = {"num_stages": 4, "tiles": {"gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
                                       "gemm2": {"BLOCK_N": 128, "BLOCK_K": 128}}}
    deep_reader = gemm_shared_bytes({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 4}, 0.0, 2.0, 2)
    assert megakernel_weight_depth(mk16)["gemm1"] == deep_reader == 3 * 2 * 64 * 128 * 2  # mma.sync: stages - 1


def test_task_reuse_table_caps_only_the_routed_gemm_tasks(monkeypatch):
    """USE_TASK_REUSE_TABLE: the megakernel's routed GEMM tasks (128-row tiles, one row block per
    expert, pointer loads) at most the reuse table's rate at r = 1 (the pointer form's table, its
    only depth); a table far above the dense rate changes nothing; other kinds never change."""
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 4}, "gemm1": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64},
             "gemm2": {"BLOCK_N": 64, "BLOCK_K": 64}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 64},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    plan = task_plan(cfg, np.array([128] * 8 + [0] * (cfg.num_experts - 8)), 128, tiles, num_programs=132)
    slow, fast = _reuse_profile(scale=1e-3), _reuse_profile(scale=1e3)
    off = cost.task_costs(plan, slow, num_programs=132)
    kinds = off["kinds"]
    routed = np.isin(off["kind"], [kinds.index(k) for k in ("gemm1", "gemm2")])
    assert routed.any() and (~routed).any()
    monkeypatch.setattr(cost, "USE_TASK_REUSE_TABLE", True)
    on = cost.task_costs(plan, slow, num_programs=132)
    assert (on["compute_s"][routed] > off["compute_s"][routed]).all()
    assert np.array_equal(on["compute_s"][~routed], off["compute_s"][~routed])
    rate = np.asarray(on["arrays"]["flops"], dtype=np.float64)[routed] / on["compute_s"][routed]
    assert rate == pytest.approx(1e-3 * 0.5 * float(_reuse(2048, 1)))
    assert np.array_equal(cost.task_costs(plan, fast, num_programs=132)["compute_s"], off["compute_s"])
