"""The cost model's terms that read the profile's measured tables, on synthetic profiles whose
tables are exact functions (so a reading can be worked by hand): the launches' L2 hits at the
shared-read table, the L2 reads by bytes in flight, the megakernel tasks' HBM reads by depth and by
cohort, the tasks' dependent round trips, the sliding-window roofline, the sustained clocks and the
MMA duty, the top-k passes by row width; and that the tables a calibration records but the model does
not read change nothing (``test_recorded_tables_are_not_read``, on a stored H200 profile:
tests/data/cost/README.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.simulator import cost, ep_task_cost, launch_cost, load_profile, task_cost
from megamoe.simulator.hardware import validate

SRC = "synthetic (tests/test_cost_terms.py)"
STORED = Path(__file__).resolve().parent / "data" / "cost" / "h200"
#: every table ``_profile`` adds
TABLES = ("l2_shared_read", "serial_load_step", "serial_reduce_step", "hbm_deep_read", "sustained_mma",
          "serial_reduce_width")


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


def _profile(tables: bool = True, without: tuple = ()):
    """h200's profile with a synthetic kernel model: the L2 and serial scalars, and with ``tables`` the
    tables of TABLES but those named in ``without``."""
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
        for k in without:
            del km[k]
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


# --------------------------------------------------------------------------- the L2 shared-read table
def test_l2_shared_rate_reads_the_table_up_to_2S_programs():
    """A shared-read table measured to 3S: every count past 2S (L2_READERS_EDGE) reads the 2S row, as a
    profile whose table ends at 2S reads it; below, bilinear in log2; arrays are each capped."""
    d = _profile().to_dict()
    S = _profile().num_sms
    progs = (S // 8, S, 2 * S, 3 * S)
    d["kernel_model"]["l2_shared_read"] = _table("bytes/s", ["programs", "sharing_group"],
                                                 [[P, g, float(_l2(P, g))] for P in progs for g in (1, 4, 16)])
    p = validate(d)
    assert cost.L2_READERS_EDGE == 2
    assert cost.l2_shared_rate(p, 3 * S, 4) == pytest.approx(_l2(2 * S, 4))
    assert cost.l2_shared_rate(p, 2.5 * S, 1) == pytest.approx(_l2(2 * S, 1))
    assert cost.l2_shared_rate(p, S, 4) == pytest.approx(_l2(S, 4))
    rates = cost.l2_shared_rate(p, np.array([S, 3 * S]), 1)
    assert rates == pytest.approx([_l2(S, 1), _l2(2 * S, 1)])


def test_shared_read_rate_and_serial_steps_read_as_documented():
    """The shared-read table at its points, bilinear in log2, clamped; None without it. The serial steps
    are the one-program scalars whether or not the profile has the per-program-count tables (recorded,
    not read)."""
    p = _profile()
    assert cost.l2_shared_rate(p, 64, 4) == pytest.approx(_l2(64, 4))  # a grid point
    assert cost.l2_shared_rate(p, 32, 8) == pytest.approx(_l2(32, 8))  # bilinear in log2: exact here
    assert cost.l2_shared_rate(p, 1024, 64) == pytest.approx(_l2(256, 16))  # clamped at the edges
    assert cost.l2_shared_rate(_profile(tables=False), 64, 4) is None
    assert p.kernel.serial_load_steps and p.kernel.serial_reduce_steps
    assert cost.serial_step_s(p, "load") == 4e-7 and cost.serial_step_s(p, "reduce") == 6e-7
    r = cost.predict_stage(_router_stage(), p)
    assert r.serial_us == pytest.approx((56 * 4e-7 + 8 * 6e-7) * 1e6)  # 32 programs at once: the scalars
    with pytest.raises(ValueError, match="'load' or 'reduce'"):
        cost.serial_step_s(p, "scan")


def test_task_plans_l2_hits_keep_the_l2_rate():
    """The shared-read table prices a launch's hits only: a task plan's L2 hits (at read depth 0) keep
    l2_bandwidth_bytes_per_s, table or not."""
    plan = _task_plan()
    with_table = task_cost.task_costs(plan, _profile(), num_programs=264)
    assert (with_table["l2_bytes"] > 0).any()
    without = task_cost.task_costs(plan, _profile(without=("l2_shared_read",)), num_programs=264)
    assert np.array_equal(with_table["memory_P_s"], without["memory_P_s"])


def test_grouped_gemms_l2_hits_read_the_shared_read_table():
    """A grouped GEMM launch's L2 hits, split by sharing group as grouped_dram_bytes counts them, each
    part at the table's rate for the programs in flight; without the table at l2_bandwidth. Only the
    memory term moves; the router launch (no L2 hits) is the same either way."""
    p, bare = _profile(), _profile(without=("l2_shared_read",))
    g, r = _gemm_stage(), _router_stage()
    plain_g = cost.predict_stage(g, bare)
    P = g["active_programs"]
    hit = P * g["bytes_per_tile"] - cost.dram_bytes(g)
    hbm = cost.launch_read_s(p, cost.dram_bytes(g), P, 264)
    intake = cost.sm_ingest_s(P, g["bytes_per_tile"], p)
    assert plain_g.memory_us == pytest.approx(max(hbm, hit / 7.8e12, intake) * 1e6)
    assert intake >= hit / 7.8e12  # at one rate the SMs' intake is never below the L2-hit term
    on_g = cost.predict_stage(g, p)
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
        assert getattr(on_g, f) == getattr(plain_g, f), f
    assert cost.predict_stage(r, p) == cost.predict_stage(r, bare)


def _task_plan():
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 4}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
             "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = np.array([64] * 8 + [0] * (cfg.num_experts - 8))  # 4 row blocks per expert: weight tiles re-read
    return task_plan(cfg, counts, 64, tiles, num_programs=264)


def _repredicted(rows, profile):
    from megamoe.repredict import repredict_rows

    out, _ = repredict_rows(rows, profile)
    return json.dumps([{k: r.get(k) for k in ("predicted_us", "predicted_fixed_us", "predicted_stages", "dominant")}
                       for r in out], sort_keys=True, default=str)


def _stored_rows() -> list[dict]:
    rows = [json.loads(line) for line in (STORED / "validation.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 8
    return rows


def test_stored_rows_repredict_as_pinned():
    """Eight stored H200 rows (Qwen3-30B-A3B T = 1, 64, 4096 and DeepSeek-V3 T = 512, Zipf, both paths)
    re-predicted with their run's profile give the pinned times to the last bits (pinned_us.json, written
    when the cost model's switches were folded in: any change to a default-path term shows here)."""
    from megamoe.repredict import repredict_rows

    pinned = json.loads((STORED / "pinned_us.json").read_text())
    out, skipped = repredict_rows(_stored_rows(), load_profile(str(STORED / "profile.json")))
    assert skipped == 0
    got = {f"{r['preset']}:{r['T']}:{r['routing']}:{r['backend']}": r["predicted_us"] for r in out}
    assert got == pytest.approx(pinned, rel=1e-12, abs=0.0)


#: the kernel_model tables a calibration records that the cost model does not read
RECORDED_NOT_READ = ("hbm_read_tma", "serial_load_step", "serial_reduce_step", "serial_chain_step", "mma_pointer")


def test_recorded_tables_are_not_read():
    """A stored H200 profile with every recorded table (the TMA reader's HBM grid, the reuse tables, the
    serial steps by programs) and eight of its rows, both paths, decode and prefill: they re-predict
    exactly as with those tables taken out of the profile and the SM's shared memory
    (sm_shared_memory_bytes, not read either) set to 1 KiB."""
    rows = _stored_rows()
    full = load_profile(str(STORED / "profile.json"))
    d = full.to_dict()
    km = d["kernel_model"]
    gone = [k for k in km if k in RECORDED_NOT_READ or k.startswith("gemm_reuse_")]
    assert {"hbm_read_tma", "serial_load_step", "gemm_reuse_tma_ab_persistent"} <= set(gone)
    for k in gone:
        del km[k]
    km["sm_shared_memory_bytes"] = _num(1024, "bytes")
    stripped = validate(d)
    assert stripped.kernel.hbm_tma_rate == () and stripped.kernel.gemm_reuse == () and full.kernel.gemm_reuse
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
    (hbm_stream_rate's rule) at each node. deep_table_covers: the table there and a depth above both
    its shallowest reader's and the hbm grid's reader's."""
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
    d = p.to_dict()  # a table measured from a 32 KiB reader: still only above the grid's 48 KiB reader
    d["kernel_model"]["hbm_deep_read"] = _table("bytes/s", DEEP_AXES, [
        [P, dd, g, b, float(_deep(P, dd, g, b))] for P in DEEP_GRID[0] for dd in (32 << 10, *DEEP_GRID[1])
        for g in DEEP_GRID[2] for b in DEEP_GRID[3]])
    shallow = validate(d)
    assert [cost.deep_table_covers(shallow, x) for x in (32 << 10, 48 << 10, 64 << 10)] == [False, False, True]


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


def test_sustained_clocks_scale_only_the_mma_terms():
    """With the table: each stage's compute term divided by the busy window's ratio, nothing else; a
    memory-bound stage keeps its time; the window starts later with more calls before it, so the same
    plan predicts slower (not faster) as they grow; without the table: no ratio."""
    p, bare = _profile(), _profile(without=("sustained_mma",))
    stages = [_compute_bound_stage(), _gemm_stage(), _router_stage()]
    off = cost.predict_launch_plan(stages, bare, calls_per_graph=4, calls_before=30)
    call_s = off["time_us"] * 1e-6
    assert "sustained_ratio" not in off
    assert cost.predict_launch_plan(stages, bare, calls_per_graph=4) == off  # calls_before alone changes nothing
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


def test_sustained_clocks_scale_only_the_tasks_compute():
    """A task plan: its tasks' compute times divided by the ratio of the makespan's busy window,
    scheduled again; memory and serial terms as without the table."""
    p, bare = _profile(), _profile(without=("sustained_mma",))
    plan = _task_plan()
    off = task_cost.predict_task_plan(plan, bare, num_programs=264, calls_per_graph=8, calls_before=3000)
    assert "sustained_ratio" not in off
    on = task_cost.predict_task_plan(plan, p, num_programs=264, calls_per_graph=8, calls_before=3000)
    before_s, busy_s = cost.busy_window_s(off["time_us"] * 1e-6, 8, 3000)
    ratio = cost.sustained_ratio(p, busy_s, before_s)
    assert on["sustained_ratio"] == ratio < 1
    c = task_cost.task_costs(plan, p, num_programs=264)
    want = task_cost._schedule_tasks({**c, "compute_s": c["compute_s"] / ratio}, p, 8)
    assert {k: v for k, v in on.items() if k != "sustained_ratio"} == want
    assert on["time_us"] >= off["time_us"] and on["dram_bytes"] == off["dram_bytes"]
    assert task_cost.predict_task_plan(plan, p, num_programs=264) != on  # a shorter window: a smaller change


#: the duty table (matmuls' share of a long graph, fraction of the back-to-back fall)
DUTY_POINTS = ((0.5, 0.125), (0.75, 0.625))


def _duty_profile(rate: float = 8e14, duty: bool = True):
    d = _profile().to_dict()
    if duty:
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


def test_the_duty_table_shrinks_the_fall_by_the_calls_mma_duty():
    """The busy window's fall 1 - ratio times duty_fall at the call's duty, its FLOPs (stage_flops) over
    its time as calibrated x the dense rate; a launch plan and a task plan alike; a lower dense rate (a
    higher duty) keeps more of the fall; without the sustained table the duty table changes nothing."""
    p, whole_p = _duty_profile(), _duty_profile(duty=False)
    stages = [_compute_bound_stage(), _gemm_stage(), _router_stage()]
    kw = dict(calls_per_graph=4, calls_before=30)
    d = p.to_dict()
    del d["kernel_model"]["sustained_mma"]
    assert "sustained_ratio" not in cost.predict_launch_plan(stages, validate(d), **kw)
    whole = cost.predict_launch_plan(stages, whole_p, **kw)
    on = cost.predict_launch_plan(stages, p, **kw)
    plain = cost.predict_launch_plan(stages, p)  # no window: the call's own time as calibrated
    call_s = cost.predict_launch_plan(stages, validate(d), **kw)["time_us"] * 1e-6
    flops = sum(cost.stage_flops(s) for s in stages)
    assert flops == pytest.approx(2.0 * 128 * 256 * 7168 * 512 + sum(cost.stage_flops(s) for s in stages[1:]))
    duty = cost.mma_duty(p, flops, call_s)
    assert 0 < duty < 1
    want = 1.0 - (1.0 - whole["sustained_ratio"]) * cost.duty_fall(p, duty)
    assert on["sustained_ratio"] == pytest.approx(want) and whole["sustained_ratio"] < want < 1.0
    assert on["time_us"] < whole["time_us"] and plain["time_us"] <= on["time_us"]
    busier = cost.predict_launch_plan(stages, _duty_profile(rate=4e14), **kw)
    assert busier["sustained_ratio"] < on["sustained_ratio"]
    plan = _task_plan()
    t_whole, t_on = (task_cost.predict_task_plan(plan, q, num_programs=264, calls_per_graph=8, calls_before=3000)
                     for q in (whole_p, p))
    assert t_whole["sustained_ratio"] <= t_on["sustained_ratio"] <= 1.0


def test_the_validation_window_starts_after_the_warm_up_and_the_earlier_replays():
    """graph_time_us runs 2 eager calls, one untimed replay and the timed ones back to back; its
    median replay of 5 is the third: 2 + NI x 3 calls before it (NI = 8: 26); predict_config with
    the row's reps reads the ratio of that window, without reps the timed graph's from idle."""
    from megamoe.kernels.bench import WARMUP_CALLS, calls_before_timed_replay
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig

    assert WARMUP_CALLS == 2
    assert calls_before_timed_replay(8, 5) == 26 and calls_before_timed_replay(2, 5) == 8
    assert calls_before_timed_replay(4, 4) == 2 + 4 * 2.5 and calls_before_timed_replay(1, 1) == 2
    p, bare = _profile(), _profile(without=("sustained_mma",))
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    counts = np.full(cfg.num_experts, 4096 * cfg.top_k // cfg.num_experts)
    kw = dict(device_name="NVIDIA H200", calls_per_graph=4, triton_version="3.6.0")
    off = predict_config(cfg, counts, 4096, "multi", bare, reps=5, **kw)
    assert off == predict_config(cfg, counts, 4096, "multi", bare, **kw) and "predicted_sustained_ratio" not in off
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
    calibrate step's 64 x 128 bf16 weight tiles."""
    import inspect

    pytest.importorskip("triton")
    from megamoe.calibrate import microbench_shared as ms

    stages = inspect.signature(ms.l2_shared_read).parameters["num_stages"].default
    assert (stages - 1) * 64 * 128 * 2 == cost.L2_SHARED_READER_DEPTH_BYTES


def test_l2_read_depth_readers_and_intake_rate():
    """A program deeper than the reader counts depth / 48 KiB readers (none shallower); the intake's
    aggregate rate is at least l2_bandwidth, the table's at those readers and group 1 above it; a
    profile without the table keeps l2_bandwidth."""
    p, bare = _profile(), _profile(tables=False)
    d = cost.L2_SHARED_READER_DEPTH_BYTES
    assert cost.l2_readers(132, d) == 132 and cost.l2_readers(132, 0) == 132 and cost.l2_readers(0, None) == 1
    assert cost.l2_readers(64, 3 * d) == pytest.approx(192)
    assert cost.l2_intake_rate(p, 64, 3 * d) == pytest.approx(max(7.8e12, _l2(192, 1)))
    assert cost.l2_intake_rate(p, 16, 2 * d) == 7.8e12  # the table's 32 readers: below l2_bandwidth
    assert cost.l2_intake_rate(p, 132, d) == 7.8e12  # not deeper than the reader
    assert cost.l2_intake_rate(bare, 64, 3 * d) == 7.8e12


def test_l2_read_depth_prices_only_deep_launches_l2_terms(monkeypatch):
    """A launch whose buffers hold 3 readers' bytes reads its L2-hit bytes at the table's rate for 3 x its
    programs in flight and the SMs' intake at the table's rate there (where above l2_bandwidth); compute,
    HBM, waves untouched. A launch at the reader's depth prices as one without shared_bytes."""
    p = _profile()
    d = cost.L2_SHARED_READER_DEPTH_BYTES
    deep, shallow, none = {**_gemm_stage(), "shared_bytes": 3 * d}, {**_gemm_stage(), "shared_bytes": d}, _gemm_stage()
    got = {k: cost.predict_stage(s, p) for k, s in (("deep", deep), ("shallow", shallow), ("none", none))}
    assert got["shallow"] == got["none"]
    hit = 224 * deep["bytes_per_tile"] - cost.dram_bytes(deep)
    shallow_l2 = cost.stage_l2_hit_s(none, hit, 224, p)
    # by hand: the same split of the hits (sharing groups of 224 in flight), each part at the table's
    # rate for 3 x 224 = 672 programs
    table = launch_cost.l2_shared_rate
    monkeypatch.setattr(launch_cost, "l2_shared_rate", lambda prof, P, g: table(prof, 3 * np.asarray(P), g))
    want_l2 = cost.stage_l2_hit_s(none, hit, 224, p)
    monkeypatch.setattr(launch_cost, "l2_shared_rate", table)
    assert cost.stage_l2_hit_s(deep, hit, 224, p) == pytest.approx(want_l2) and want_l2 < shallow_l2
    # the intake: the table at 672 readers is clamped at its 256 (6.0 TB/s), below l2_bandwidth (7.8):
    # l2_bandwidth; with an l2_bandwidth of 4 TB/s, the table's 6.0
    assert cost.stage_intake_s(deep, 224, 224, p) == cost.sm_ingest_s(224, deep["bytes_per_tile"], p)
    low = dataclasses.replace(p, kernel=dataclasses.replace(p.kernel, l2_bandwidth_bytes_per_s=4e12))
    want_in = cost.sm_ingest_s(224, deep["bytes_per_tile"], low, float(_l2(256, 1)))
    assert cost.stage_intake_s(deep, 224, 224, low) == pytest.approx(want_in)
    assert want_in < cost.sm_ingest_s(224, deep["bytes_per_tile"], low)
    hbm = cost.launch_read_s(p, cost.dram_bytes(deep), 224, 264)
    want_in = cost.sm_ingest_s(224, deep["bytes_per_tile"], p)
    assert got["deep"].memory_us == pytest.approx(max(hbm, want_l2, want_in) * 1e6)
    for f in ("compute_us", "serial_us", "launch_us", "overhead_us", "waves", "occupancy"):
        assert getattr(got["deep"], f) == getattr(got["none"], f), f


def test_l2_read_depth_prices_only_the_tasks_l2_hits():
    """A task plan at read_depth 0 or the reader's prices its L2 hits at l2_bandwidth; with deep
    programs at l2_intake_rate (faster here), their DRAM and compute terms untouched."""
    p = _profile()
    p = dataclasses.replace(p, kernel=dataclasses.replace(p.kernel, l2_bandwidth_bytes_per_s=4e12))
    plan = _task_plan()
    deep = 4 * cost.L2_SHARED_READER_DEPTH_BYTES
    base = task_cost.task_costs(plan, p, num_programs=132)
    at_reader = task_cost.task_costs(plan, p, num_programs=132, read_depth=float(cost.L2_SHARED_READER_DEPTH_BYTES))
    assert at_reader["memory_P_s"].tolist() == base["memory_P_s"].tolist()
    on = task_cost.task_costs(plan, p, num_programs=132, read_depth=deep)
    np.testing.assert_array_equal(on["compute_s"], base["compute_s"])
    np.testing.assert_array_equal(on["dram_bytes"], base["dram_bytes"])
    assert (on["memory_P_s"] <= base["memory_P_s"]).all()
    rate = cost.l2_intake_rate(p, 132, deep)
    assert rate == pytest.approx(_l2(256, 1)) and rate > 4e12  # 528 readers: the table's edge
    assert base["l2_bound"].any()
    # the L2-bound tasks at l2_bytes x resident / the rate; the others keep their DRAM time
    b = base["l2_bound"]
    np.testing.assert_allclose(on["memory_P_s"][b], np.maximum(base["l2_bytes"][b] * 132 / rate,
                                                               on["memory_P_s"][b]))
    assert (on["memory_P_s"][b] < base["memory_P_s"][b]).all()
    np.testing.assert_array_equal(on["memory_P_s"][~b], base["memory_P_s"][~b])


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


def test_task_read_curves_read_the_deep_table_only_where_it_covers_the_depth():
    """task_read_curves: the GEMM kinds whose weight depth the deep table covers (above its 48 KiB
    reader) stream at deep_stream_rate(n, depth, 1) and start together at deep_read_rate; shallower
    kinds, kinds without a depth and a profile without the table keep the grid's."""
    p = _deep_profile()
    plan = _cohort_plan(8)
    kind, kinds = plan["kind"].astype(np.int64), plan["kinds"]
    deep = {"gemm1": 160 << 10, "gemm2": 80 << 10}
    curve, stream, one = task_cost.task_read_curves(p, kind, kinds, 132, deep)
    assert curve.tolist() == [0] + [1] * 8 and stream.shape == (2, 132)  # no gemm2 tasks: no curve for it
    np.testing.assert_array_equal(stream[0], cost.hbm_stream_rate(p, np.arange(1, 133, dtype=np.float64)))
    assert stream[1][47] == pytest.approx(cost.deep_stream_rate(p, 48, 160 << 10, 1))
    assert one[1](48, 1 << 20) == pytest.approx(cost.deep_read_rate(p, 48, 160 << 10, 1, 1 << 20))
    assert one[0](48, 1 << 20) == pytest.approx(cost.hbm_rate(p, 48, 1 << 20))
    for wd in ({"gemm1": 48 << 10}, {"router_topk": 160 << 10}, None):
        assert task_cost.task_read_curves(p, kind, kinds, 132, wd)[0].tolist() == [0] * kind.size
    assert task_cost.task_read_curves(load_profile("h200"), kind, kinds, 132, deep)[0].tolist() == [0] * kind.size


@pytest.mark.parametrize("m", [48, 132], ids=["48-few-programs", "132-every-sm"])
def test_a_cohort_released_together_reads_at_the_one_shot_rate(m):
    """m GEMM 1 tasks released by one top-k task onto idle programs each read their bytes at the one-shot
    rate of m programs (the deep table at its depth), so they end together at top-k end + handoff +
    b / (deep_read_rate(m, d, 1, b) / m) + the task's fixed cost; without the deep table, at the grid's
    one-shot rate."""
    p = _deep_profile()
    plan = _cohort_plan(m)
    d, b = 160 << 10, float(1 << 20)
    on = task_cost.predict_task_plan(plan, p, weight_depth={"gemm1": d})
    km = p.kernel
    topk_end = on["span_us"]["router_topk"][1]
    task = b / (cost.deep_read_rate(p, m, d, 1, b) / m) + km.task_overhead_s + km.ticket_s
    start = topk_end + km.flag_handoff_s * 1e6  # the cohort's tasks on other programs than the top-k's
    assert on["span_us"]["gemm1"][0] == pytest.approx(topk_end)  # the top-k's own program: no handoff
    assert on["span_us"]["gemm1"][1] == pytest.approx(start + task * 1e6)
    q = load_profile("h200")
    q_on = task_cost.predict_task_plan(plan, q)
    grid = b / (float(cost.hbm_rate(q, m, b)) / m) + q.kernel.task_overhead_s + q.kernel.ticket_s
    assert q_on["span_us"]["gemm1"][1] == pytest.approx(q_on["span_us"]["router_topk"][1]
                                                       + q.kernel.flag_handoff_s * 1e6 + grid * 1e6)


def test_tasks_that_start_apart_are_no_cohort():
    """More tasks than programs: the ones placed as programs free up stream at the deep table's marginal
    rate for the programs busy (no cohort of one); a cohort's L2-hit part keeps the grid's curve, so
    tasks whose weights hit in L2 are not charged a one-shot ramp on their L2 bytes."""
    p = _deep_profile()
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


def test_task_prologue_adds_its_round_trips_to_the_routed_gemm_tasks_compute_only():
    """Each GEMM 1 / GEMM 2 task's compute term carries TASK_ROUND_TRIPS of its kind x the profile's
    ticket_s (against a profile whose ticket is 0); its memory terms and every other kind's terms do
    not change."""
    from megamoe.reference.tiles import TASK_ROUND_TRIPS

    d = _profile().to_dict()
    d["kernel_model"]["ticket_s"] = _num(6.5e-7, "s")
    p = validate(d)
    plan = _task_plan()
    base = task_cost.task_costs(plan, _profile(), num_programs=264)
    assert cost._km(_profile()).ticket_s == 0
    on = task_cost.task_costs(plan, p, num_programs=264)
    kinds = base["kinds"]
    ticket = cost._km(p).ticket_s
    for k in kinds:
        m = base["kind"] == kinds.index(k)
        if not m.any():
            continue
        want = base["compute_s"][m] + (TASK_ROUND_TRIPS.get(k, 0) * ticket if k in TASK_ROUND_TRIPS else 0.0)
        assert on["compute_s"][m] == pytest.approx(want, rel=1e-12, abs=0.0), k
    assert set(TASK_ROUND_TRIPS) <= set(kinds) and all(v > 0 for v in TASK_ROUND_TRIPS.values())
    for key in ("memory_P_s", "dram_P_s", "l2_P_s", "serial_s", "pre_s"):
        assert np.array_equal(on[key], base[key]), key


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


def test_window_roofline_keeps_a_skewed_launchs_parts_apart():
    """The heavy expert's programs (weights shared by 8 row blocks) and the light experts' (every
    weight tile from DRAM) are not in flight together: the launch takes the sum over the window's
    positions of its largest term share, more than its largest whole-launch term."""
    p = _profile()
    st = _skewed_stage()
    on = cost.predict_stage(st, p)
    slots = p.num_sms * cost.occupancy(p, 8)
    assert on.waves == 2 and slots < st["active_programs"] and on.window_shares
    hbm, l2, intake = on.memory_terms_us
    assert max(hbm, l2, intake) == pytest.approx(on.memory_us)
    want = sum(max(fp * on.compute_us, fd * hbm, fl * l2, fp * intake) for fp, fd, fl in on.window_shares)
    assert on.windows_us == pytest.approx(want)
    assert want > 1.05 * max(on.compute_us, on.memory_us)  # the two parts do not hide each other
    assert on.time_us == pytest.approx(want + on.launch_us + on.overhead_us)
    assert on.to_dict()["windows_us"] == pytest.approx(want)


def test_window_roofline_leaves_even_and_single_wave_launches():
    """A launch whose every window holds the same mix (32 experts of one row block) takes its
    whole-launch roofline; a launch of one wave and the router stage (no grouped L2 model) have no
    windows."""
    p = _profile()
    even, single, router = (cost.predict_stage(s, p) for s in
                            (_skewed_stage(blocks=(1,) * 32), _skewed_stage(blocks=(1,) * 8), _router_stage()))
    assert even.waves > 1 and even.window_shares
    assert even.time_us == pytest.approx(max(even.compute_us, even.memory_us, even.serial_us) + even.launch_us
                                         + even.overhead_us, rel=1e-9)
    assert single.waves == 1 and single.window_shares == () and single.windows_us == 0.0
    assert router.window_shares == ()


def test_window_roofline_keeps_the_sustained_clocks():
    """The plan's compute terms are divided by the sustained ratio after the stages are priced: the
    windows' compute shares follow (windows_us from the scaled compute term). Three times the FLOPs, so
    that the heavy expert's part is bound by its MMA."""
    p = _profile()
    st = dict(_skewed_stage(), flops_per_tile=3 * _skewed_stage()["flops_per_tile"])
    s0 = cost.predict_stage(st, p)
    slow = cost.predict_launch_plan([st], p, calls_per_graph=8, calls_before=2000)
    ratio = slow["sustained_ratio"]
    assert ratio < 0.99
    s1 = slow["stages"][0]
    assert s1["compute_us"] == pytest.approx(s0.compute_us / ratio)
    hbm, l2, intake = s0.memory_terms_us
    want = sum(max(fp * s0.compute_us / ratio, fd * hbm, fl * l2, fp * intake) for fp, fd, fl in s0.window_shares)
    assert s1["windows_us"] == pytest.approx(want) and want > s0.windows_us


def test_lifetime_share_averages_a_programs_rate_over_the_tasks_life():
    """ep_task_cost.lifetime_h, HBM saturated by one program (h = n / R): task A runs [0, 2] us, B [0, 1]
    us, so A streams with two programs for its first half (a share of 2) and alone for its second (4):
    1 / mean(1 / h) = 1/3; B, two programs all its life: 1/2. A task not yet started counts for nothing."""
    h = np.array([[0.25, 0.5, 0.75, 1.0]])  # (C = 1, R = 4)
    got = ep_task_cost.lifetime_h(np.array([0.0, 0.0]), np.array([2e-6, 1e-6]), h, np.zeros(2, np.int64))
    assert got == pytest.approx([1 / 3, 1 / 2])
    got = ep_task_cost.lifetime_h(np.array([0.0, 0.0, 3e-6]), np.array([2e-6, 1e-6, 4e-6]), h, np.zeros(3, np.int64))
    assert got == pytest.approx([1 / 3, 1 / 2, 1 / 4])  # the third starts after both: alone


# --------------------------------------------------------------------------- the top-k passes by row width
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


def test_topk_passes_price_at_their_row_width():
    """A router_topk task's serial time is its passes x the table's step at BLOCK_E = 128 (Qwen3-30B-A3B's
    128 experts, K = 8 passes), not the scalar; the other tasks' serial terms are the scalar's either way;
    serial_step_s without a width is the scalar."""
    p, q = _profile(), _profile(without=("serial_reduce_width",))
    plan = _task_plan()
    kinds = list(task_cost._plan_arrays(plan)["kinds"])
    scalar = task_cost.task_costs(plan, q, num_programs=264)
    on = task_cost.task_costs(plan, p, num_programs=264)
    topk = scalar["kind"] == kinds.index("router_topk")
    assert topk.any() and plan.topk_passes == 8
    assert np.allclose(scalar["serial_s"][topk] - on["serial_s"][topk], 8 * (6e-7 - 4e-7), rtol=0, atol=1e-15)
    assert on["serial_s"][~topk].tolist() == scalar["serial_s"][~topk].tolist()
    assert cost.serial_step_s(p, "reduce") == pytest.approx(6e-7)
    assert cost.serial_step_s(p, "reduce", 256) == pytest.approx(1e-6)
    assert cost.serial_step_s(q, "reduce", 256) == pytest.approx(6e-7)


def test_each_routing_and_the_routers_select_price_at_the_row_width():
    """With tiles["router"]["EACH"] each GEMM 1 task's pre-step is its passes at the width's step; a
    multi-launch router stage without a route_select time prices its "select" steps at BLOCK_E's step
    and its other reductions at the scalar."""
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    p, q = _profile(), _profile(without=("serial_reduce_width",))
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 1, "BLOCK_H": 64, "SPLIT": 4, "EACH": 1},
             "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128},
             "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = np.array([1] * 8 + [0] * (cfg.num_experts - 8))
    plan = task_plan(cfg, counts, 1, tiles, num_programs=132)
    assert plan.tiles["router"].get("EACH")
    g1 = task_cost._plan_arrays(plan)["kind"] == list(task_cost._plan_arrays(plan)["kinds"]).index("gemm1")
    scalar = task_cost.task_costs(plan, q, num_programs=132)["pre_s"]
    on = task_cost.task_costs(plan, p, num_programs=132)["pre_s"]
    assert np.allclose(scalar[g1] - on[g1], plan.topk_passes * (6e-7 - 4e-7), rtol=0, atol=1e-15)
    assert on[~g1].tolist() == scalar[~g1].tolist()
    stage = dict(_router_stage(), tile=dict(BLOCK_T=16, BLOCK_E=256, num_warps=4),
                 serial_steps={"load": 56, "reduce": 2, "select": 8})
    s_on, s_scalar = cost.predict_stage(stage, p), cost.predict_stage(stage, q)
    assert s_on.serial_us - s_scalar.serial_us == pytest.approx(s_on.waves * 8 * (1e-6 - 6e-7) * 1e6)
