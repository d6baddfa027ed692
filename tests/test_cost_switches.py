"""The cost model's switches for the shared-read and many-program serial tables
(cost.USE_L2_SHARED_READ, USE_L2_SHARED_READ_TASKS, USE_L2_SHARED_INTAKE, USE_SERIAL_STEP_TABLES):
their defaults (USE_L2_SHARED_READ on since run AH, the others off); each changes only the terms it
names when on and the profile has its table, and nothing where the profile has none. The tests of
the mechanics start from every switch off (the ``_all_off`` fixture)."""

from __future__ import annotations

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
    d["kernel_model"] = km
    return validate(d)


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


SWITCHES = ("USE_L2_SHARED_READ", "USE_L2_SHARED_READ_TASKS", "USE_L2_SHARED_INTAKE", "USE_SERIAL_STEP_TABLES")
DEFAULTS = {name: getattr(cost, name) for name in SWITCHES}  # at import, before any test patches them


@pytest.fixture(autouse=True)
def _all_off(monkeypatch):
    for name in SWITCHES:
        monkeypatch.setattr(cost, name, False)


def test_switch_defaults():
    """Run AH validated the launches' shared-read L2 hits; the tasks', the intake's and the serial
    tables' switches stay off."""
    assert DEFAULTS == {"USE_L2_SHARED_READ": True, "USE_L2_SHARED_READ_TASKS": False,
                        "USE_L2_SHARED_INTAKE": False, "USE_SERIAL_STEP_TABLES": False}


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
    """A profile without the new tables: both switches on predict exactly what they predict off,
    launch plans and task plans."""
    q = _profile(tables=False)
    plan = _task_plan()
    stages = [_gemm_stage(), _router_stage()]
    off = (cost.predict_launch_plan(stages, q), cost.predict_task_plan(plan, q, num_programs=264))
    for name in SWITCHES:
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
    d["kernel_model"].update({k: extra[k] for k in ("l2_shared_read", "serial_load_step", "serial_reduce_step")})
    with_tables = validate(d)
    assert _repredicted(rows, with_tables) == want  # switches off: the tables are not read
    for name in SWITCHES:
        monkeypatch.setattr(cost, name, True)
    assert _repredicted(rows, base) == want  # on, but the profile has no tables
    assert _repredicted(rows, with_tables) != want  # on, with tables: they are read
