"""The one cost model (simulator/cost.py, and simulator/task_cost.py for the task plan): properties of the launch
and task-plan predictions.

Expected values come from hand-worked cases and from properties any sane model has (monotone in
bytes, never below its roofline, dependent tasks serialise), never from the code under test.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from megamoe.reference import MoEConfig
from megamoe.reference.tiles import task_plan
from megamoe.simulator import load_profile
from megamoe.simulator.cost import (
    ffn_cost,
    ffn_roofline_s,
    hbm_rate,
    launch_read_s,
    mma_rate_per_sm,
    predict_launch_plan,
    predict_stage,
    sm_ingest_s,
)
from megamoe.simulator.hardware import ProfileError, validate
from megamoe.simulator.task_cost import predict_task_plan, task_costs

TILES = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 2}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64},
         "gemm2": {"BLOCK_N": 64, "BLOCK_K": 64}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 64},
         "combine": {"BLOCK_T": 4, "BLOCK_H": 256}, "order": {"GROUP_M": 4}}
CFG = MoEConfig.preset("qwen3-30b-a3b").replace(hidden_size=512, intermediate_size=256, num_experts=16, top_k=4)


def _plan(T=40, P=8, counts=None, cfg=CFG):
    counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts) if counts is None else counts
    return task_plan(cfg, counts, T, TILES, num_programs=P)


def _calibrated(**km):
    """h200 with a tiny kernel_model section (as megamoe calibrate writes one)."""
    d = copy.deepcopy(load_profile("h200").to_dict())
    src = "test"
    d["kernel_model"] = {
        "hbm_read": {"unit": "bytes/s", "over": ["programs_in_flight", "bytes_per_program"], "source": src,
                     "points": [[1, 1e4, 1e9], [1, 1e7, 2e10], [132, 1e4, 1e12], [132, 1e7, 4e12]]},
        "mma": {"unit": "flop/s per SM", "over": ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], "source": src,
                "points": [[16, 64, 4, 256, 1e12], [16, 64, 4, 4096, 2e12], [128, 128, 8, 4096, 5e12]]},
        "flag_handoff_s": {"value": 6e-7, "unit": "s", "source": src},
        **km,
    }
    return validate(d, "test profile")


def test_calibrated_section_loads_and_bad_one_is_named():
    p = _calibrated()
    assert p.kernel.calibrated and p.kernel.flag_handoff_s == 6e-7
    assert not load_profile("gb200-nvl72").kernel.calibrated  # rack profiles: derived defaults
    d = copy.deepcopy(p.to_dict())
    d["kernel_model"]["mma"]["points"][0] = [16, 64, 4]
    with pytest.raises(ProfileError, match=r"kernel_model.mma.points\[0\] must be 5 positive numbers"):
        validate(d)
    d = copy.deepcopy(p.to_dict())
    d["kernel_model"]["hbm_read"]["points"].pop()
    with pytest.raises(ProfileError, match="must fill a grid"):
        validate(d)


def test_curves_interpolate_between_their_points():
    p = _calibrated()
    assert hbm_rate(p, 132, 1e7) == pytest.approx(4e12)
    assert 1e12 < hbm_rate(p, 132, 1e5) < 4e12  # between the bytes points
    assert hbm_rate(p, 5000, 1e9) == pytest.approx(4e12)  # clamped at the grid's edge
    assert mma_rate_per_sm(p, 16, 64, 256, 4) == pytest.approx(1e12)
    assert mma_rate_per_sm(p, 16, 64, 1024, 4) == pytest.approx(1.5e12)  # half way in log2(depth)
    assert mma_rate_per_sm(p, 128, 256, 4096, 8) == pytest.approx(5e12)  # nearest shape


@pytest.mark.parametrize("profile", ["h200", "calibrated"])
def test_launch_is_monotone_in_bytes_and_flops(profile):
    p = load_profile("h200") if profile == "h200" else _calibrated()
    base = dict(name="g", active_programs=200, tile=dict(BLOCK_M=16, num_warps=4), bytes_per_tile=1e5,
                flops_per_tile=2 * 16 * 64 * 1024)
    t = [predict_stage(dict(base, bytes_per_tile=b), p).time_us for b in (1e4, 1e5, 1e6, 1e7)]
    assert t == sorted(t) and t[-1] > t[0]
    f = [predict_stage(dict(base, flops_per_tile=x), p).time_us for x in (1e6, 1e8, 1e10)]
    assert f == sorted(f) and f[-1] > f[0]


def test_few_waves_of_large_tiles_wait_for_the_busiest_sms():
    """The SMs' intake (cost.sm_ingest_s): 1.5 x S tiles of 1 MB put two tiles on half the SMs,
    so the launch lasts at least 2 MB at an SM's share of the L2 rate, though the aggregate rates
    see only 1.5 x S MB (hand-worked: S = 132, L2 7.9 TB/s, per SM 59.8 GB/s, 2 MB -> 35.1 us);
    without an L2 rate (the h200 profile as written) the term is absent."""
    p = _calibrated(l2_bandwidth_bytes_per_s={"value": 7.9e12, "unit": "bytes/s", "source": "test"})
    S = p.num_sms
    st = dict(name="g", active_programs=S * 3 // 2, tile=dict(BLOCK_M=16, num_warps=4), bytes_per_tile=1e6,
              flops_per_tile=1.0)
    pr = predict_stage(st, p)
    assert pr.memory_us >= 2 * 1e6 / (7.9e12 / S) * 1e6 * (1 - 1e-9)
    assert abs(sm_ingest_s(S * 3 // 2, 1e6, p) - 2e6 / (7.9e12 / S)) < 1e-12
    assert sm_ingest_s(S, 1e6, p) == pytest.approx(1e6 / (7.9e12 / S))  # one tile per SM
    assert sm_ingest_s(S * 3 // 2, 1e6, load_profile("h200")) == 0.0


def test_a_stage_names_the_memory_term_it_is_bound_by():
    """StagePrediction.memory_term: the largest of the DRAM read, the L2 hits and the SMs' intake
    (cost.MEMORY_TERMS), the same value memory_us holds; "hbm" without an L2 rate."""
    from megamoe.simulator.cost import MEMORY_TERMS, term_name

    p = _calibrated(l2_bandwidth_bytes_per_s={"value": 7.9e12, "unit": "bytes/s", "source": "test"})
    S = p.num_sms
    st = dict(name="g", active_programs=S * 3 // 2, tile=dict(BLOCK_M=16, num_warps=4), bytes_per_tile=1e6,
              flops_per_tile=1.0)
    pr = predict_stage(st, p)  # 198 MB from DRAM at <= 4 TB/s outlast two 1 MB tiles at an SM's 60 GB/s
    assert pr.memory_term == "hbm" and pr.to_dict()["memory_term"] == "hbm"
    assert pr.memory_us == pytest.approx(launch_read_s(p, S * 3 // 2 * 1e6, S * 3 // 2, S * 2) * 1e6)
    # the same tiles re-reading 8 experts' weights: few DRAM bytes, two tiles on half the SMs
    # (24 row blocks of one N tile each, GROUP_M 8: each weight tile from DRAM 3 times, 21 times from L2)
    grouped = dict(st, active_programs=192, tile=dict(BLOCK_M=16, num_warps=4, GROUP_M=8),
                   operand_bytes_per_tile={"a": 1e4, "b": 9.89e5, "out": 1e3}, tiles_per_expert=[24] * 8,
                   row_blocks_per_expert=[24] * 8)
    pr = predict_stage(grouped, p)
    assert pr.memory_term == "sm_intake" and pr.memory_us == pytest.approx(sm_ingest_s(192, 1e6, p) * 1e6)
    assert predict_stage(st, load_profile("h200")).memory_term == "hbm"
    assert term_name("memory", "sm_intake") == MEMORY_TERMS["sm_intake"] and term_name("serial").startswith("dependent")


def test_later_waves_of_a_launch_stream_past_the_one_shot_ramp():
    """cost.launch_read_s: the first wave of n programs is a one-shot read, the later waves'
    bytes go at the marginal rate of n programs in flight. Hand-worked on a grid whose 132-program
    row reads 2 TB/s at 1 MB and 3 TB/s at 4 MB per program: one-shot of 132 x 4 MB = 176 us;
    marginal rate 132 x 3 MB / (176 - 66 us) = 3.6 TB/s, so three waves take 176 + 1056 MB / 3.6
    TB/s = 469.3 us (one-shot rate throughout: 528 us)."""
    pts = [[1, 1e6, 2e10], [1, 4e6, 2.5e10], [132, 1e6, 2e12], [132, 4e6, 3e12]]
    p = _calibrated(hbm_read={"unit": "bytes/s", "over": ["programs_in_flight", "bytes_per_program"],
                              "source": "test", "points": pts})
    S = p.num_sms
    assert launch_read_s(p, S * 4e6, S, S) == pytest.approx(176e-6)  # one wave: the one-shot read
    assert launch_read_s(p, 3 * S * 4e6, 3 * S, S) == pytest.approx(176e-6 + 1056e6 / 3.6e12)
    assert launch_read_s(p, 3 * S * 4e6, 3 * S, S) < 3 * S * 4e6 / 3e12
    t = [launch_read_s(p, 3 * S * b, 3 * S, S) for b in (1e4, 1e5, 1e6, 1e7)]
    assert t == sorted(t) and t[0] > 0
    assert launch_read_s(p, 0.0, 3 * S, S) == 0.0


@pytest.mark.parametrize("rows", [[1], [8] * 8, [300, 5, 0, 9000], [4096] * 4])
def test_rack_ffn_never_below_its_roofline(rows):
    for p in (load_profile("h200"), _calibrated(), load_profile("gb200-nvl72")):
        c = ffn_cost(rows, 2048, 768, profile=p, num_sms=p.num_sms, weight_dtype="bf16", act_dtype="bf16")
        assert c.time_s >= ffn_roofline_s(rows, 2048, 768, profile=p, weight_dtype="bf16", act_dtype="bf16") * (1 - 1e-12)


def test_one_program_takes_the_sum_of_task_times():
    plan = _plan(P=1)
    p = load_profile("h200")
    r = predict_task_plan(plan, p, num_programs=1)
    c = task_costs(plan, p, num_programs=1)
    # one program: every task runs alone (h[0]: no other program streams) and never waits on another
    dur = np.maximum.reduce([c["compute_s"], c["memory_P_s"] * c["h"][0], c["serial_s"]]) + c["fixed_s"]
    assert r["makespan_us"] == pytest.approx(dur.sum() * 1e6)
    assert sum(r["busy_us"].values()) == pytest.approx(r["makespan_us"])
    assert r["critical_path_us"]["handoff"] == 0.0


def test_more_programs_never_slower_than_one_and_critical_path_sums_to_makespan():
    p = load_profile("h200")
    one = predict_task_plan(_plan(P=1), p)
    many = predict_task_plan(_plan(P=64), p)
    assert many["makespan_us"] < one["makespan_us"]
    assert sum(many["critical_path_us"].values()) == pytest.approx(many["makespan_us"])


def test_dependent_chain_serialises():
    """GEMM 2 of a row block waits for all its GEMM 1 tiles, the combine for every GEMM 2 tile: with
    ample programs the makespan is at least the chain router -> gemm1 -> gemm2 -> combine, plus a
    handoff at each wait."""
    p = load_profile("h200")
    plan = _plan(T=4, P=512)
    r = predict_task_plan(plan, p)
    c = task_costs(plan, p, num_programs=512)
    kinds = c["kinds"]
    dur = np.maximum.reduce([c["compute_s"], c["memory_P_s"] * c["h"].min(), c["serial_s"]]) + c["fixed_s"]
    chain = sum(float(np.min(dur[c["kind"] == kinds.index(k)])) for k in ("router_topk", "gemm1", "gemm2", "combine"))
    assert r["makespan_us"] >= (chain + 3 * p.kernel.flag_handoff_s) * 1e6 * (1 - 1e-9)
    assert r["critical_path_us"]["handoff"] > 0


def test_task_plan_monotone_in_bytes_and_l2_hits_help():
    p = load_profile("h200")
    plan = _plan(P=16)
    d = plan.to_dict()
    base = predict_task_plan(d, p)["time_us"]
    d2 = dict(d, weight_bytes=[w * 4 for w in d["weight_bytes"]])
    assert predict_task_plan(d2, p)["time_us"] > base
    # no repeated weight ids: every weight read goes to DRAM
    d3 = dict(d, weight_id=list(range(len(d["weight_id"]))))
    r3 = predict_task_plan(d3, p)
    assert r3["l2_hit_bytes"] <= predict_task_plan(d, p)["l2_hit_bytes"]
    assert r3["time_us"] >= base * (1 - 1e-12)


def test_task_plan_is_fast_enough_for_a_large_layer():
    cfg = MoEConfig.preset("deepseek-v3")
    T = 4096
    counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
    tiles = dict(TILES, gemm1={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, gemm2={"BLOCK_N": 64, "BLOCK_K": 64})
    plan = task_plan(cfg, counts, T, tiles, num_programs=264)
    assert plan.num_tasks > 50_000  # a real-size plan; the run itself must just finish (no timing asserted)
    r = predict_task_plan(plan, "h200")
    assert r["tasks"] == plan.num_tasks and r["time_us"] > 0


FP8_TABLE = {"unit": "flop/s per SM", "over": ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], "source": "test",
             "points": [[16, 64, 4, 256, 3e12], [128, 128, 8, 4096, 1.6e13]]}


def test_fp8_table_is_validated_like_the_bf16_one():
    p = _calibrated(mma_fp8=copy.deepcopy(FP8_TABLE))
    assert p.kernel.mma_fp8 == ((16.0, 64.0, 4.0, 256.0, 3e12), (128.0, 128.0, 8.0, 4096.0, 1.6e13))
    d = copy.deepcopy(p.to_dict())
    d["kernel_model"]["mma_fp8"]["points"][1] = [128, 128, 8, 4096, -1.0]
    with pytest.raises(ProfileError, match=r"kernel_model.mma_fp8.points\[1\] must be 5 positive numbers"):
        validate(d)
    d = copy.deepcopy(p.to_dict())
    d["kernel_model"]["mma_fp8"]["over"] = ["BLOCK_M", "BLOCK_N", "depth"]
    with pytest.raises(ProfileError, match=r"kernel_model.mma_fp8.over must be"):
        validate(d)
    d = copy.deepcopy(p.to_dict())
    d["kernel_model"]["mma_fp8"]["unit"] = "flop/s"
    with pytest.raises(ProfileError, match="mma_fp8"):
        validate(d)


def test_fp8_rates_use_the_measured_table_or_the_peak_ratio():
    """Measured fp8 points are read as they are; without them fp8 = bf16 x (fp8 peak / bf16 peak),
    in the launch model and the rack model's grouped GEMMs alike."""
    bare = _calibrated()
    ratio = bare.tensor_flops_per_s["fp8"] / bare.tensor_flops_per_s["bf16"]
    assert mma_rate_per_sm(bare, 16, 64, 256, 4, dtype="fp8") == pytest.approx(1e12 * ratio)
    p = _calibrated(mma_fp8=copy.deepcopy(FP8_TABLE))
    assert mma_rate_per_sm(p, 16, 64, 256, 4, dtype="fp8") == pytest.approx(3e12)
    assert mma_rate_per_sm(p, 128, 256, 4096, 8, dtype="fp8") == pytest.approx(1.6e13)  # nearest shape
    assert mma_rate_per_sm(p, 16, 64, 256, 4) == pytest.approx(1e12)  # bf16 unchanged
    with pytest.raises(ValueError, match="dtype must be one of"):
        mma_rate_per_sm(p, 16, 64, 256, 4, dtype="fp16")
    # the rack model's grouped GEMMs: an fp8 table 3x the bf16 one (every shape and depth) against
    # the peak ratio's 2x: compute time in the ratio of the rates, tile choices unchanged
    triple = dict(FP8_TABLE, points=[[*r[:4], 3 * r[4]] for r in bare.to_dict()["kernel_model"]["mma"]["points"]])
    p3 = _calibrated(mma_fp8=triple)
    kw = dict(num_sms=132, weight_dtype="fp8", act_dtype="fp8")
    rows = [16] * 64 + [300] * 8
    slow, fast = (ffn_cost(rows, 7168, 2048, profile=q, **kw).compute_s for q in (bare, p3))
    assert fast == pytest.approx(slow * ratio / 3, rel=1e-9)
    assert ffn_roofline_s(rows, 7168, 2048, profile=p3, weight_dtype="fp8", act_dtype="fp8") <= \
        ffn_cost(rows, 7168, 2048, profile=p3, **kw).time_s
    # weight-only FP8 multiplies in bf16: the fp8 table does not apply
    w8 = dict(num_sms=132, weight_dtype="fp8", act_dtype="bf16")
    assert ffn_cost(rows, 7168, 2048, profile=p, **w8).compute_s == pytest.approx(
        ffn_cost(rows, 7168, 2048, profile=bare, **w8).compute_s)


def test_megakernel_gemm_tasks_read_the_table_of_their_weight_loads():
    """predict_task_plan(weight_loads=...): the megakernel's 128-row GEMM tasks (the dense tables
    price tiles of GEMM_TABLE_MIN_ROWS rows or more) read the dense-GEMM table of their loop form
    (cost.MEGAKERNEL_LOADS): persistent pointer loads, or TMA weights; GEMM 1 the gated table,
    GEMM 2 the other. A slower table gives a slower compute time; an unknown load kind is refused
    by name."""
    from megamoe.simulator.cost import GEMM_TABLE_MIN_ROWS, MEGAKERNEL_LOADS

    bm = GEMM_TABLE_MIN_ROWS
    tiles = {**TILES, "gemm1": {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 64}}
    counts = np.zeros(CFG.num_experts, np.int64)
    counts[:4] = 512 * CFG.top_k // 4  # 4 experts, 512 rows each: several GEMM tasks each
    plan = task_plan(CFG, counts, 512, tiles, num_programs=8)

    def table(rate):
        return {"unit": "flop/s per SM", "over": ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], "source": "test",
                "points": [[bm, 64, 4, 256, rate], [bm, 128, 4, 256, rate], [bm, 64, 4, 4096, rate],
                           [bm, 128, 4, 4096, rate]]}

    fast, slow = 4e12, 1e12
    p = _calibrated(**{f"gemm_{MEGAKERNEL_LOADS['pointer'][k]}": table(fast) for k in ("gated", "other")},
                    **{f"gemm_{MEGAKERNEL_LOADS['tma'][k]}": table(slow) for k in ("gated", "other")})
    cp = task_costs(plan, p, weight_loads="pointer")
    ct = task_costs(plan, p, weight_loads="tma")
    g = np.isin(cp["kind"], [cp["kinds"].index("gemm1"), cp["kinds"].index("gemm2")])
    assert g.any() and np.allclose(ct["compute_s"][g], cp["compute_s"][g] * fast / slow)
    with pytest.raises(ValueError, match="weight_loads must be one of"):
        task_costs(plan, p, weight_loads="ldmatrix")


# --------------------------------------------------------------------------- the TMA reader's HBM table (recorded)
def _tma_stages(cfg, T):
    """The launch plan of ``cfg`` at T tokens (uniform routing) as stage dicts, and the same with
    its GEMM stages in TMA loop forms (weights through descriptors)."""
    from megamoe.kernels.plan import launch_plan

    counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
    plan = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    stages = [s.to_dict() for s in plan.stages]
    tma = [dict(s, loads="tma_persistent_gated" if "gated" in s["loads"] else "tma_ab_persistent") if s.get("loads")
           else s for s in stages]
    return stages, tma


def _predictions(p):
    """Launch plans (pointer and TMA GEMM stages) and task plans (pointer and TMA weights) on ``p``."""
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    out = []
    for T in (1, 64, 512):
        for stages in _tma_stages(cfg, T):
            r = predict_launch_plan(stages, p)
            out.append([r["time_us"]] + [s["memory_us"] for s in r["stages"]])
    same = np.zeros(CFG.num_experts, np.int64)
    same[:CFG.top_k] = 64  # every token on the same experts
    for plan in (_plan(T=40, P=8), _plan(T=64, P=264, counts=same)):
        for wl in ("pointer", "tma"):
            r = predict_task_plan(plan, p, weight_loads=wl)
            out.append([r["time_us"], r["dram_bytes"], *sorted(r["critical_path_us"].items())])
    return out


def test_the_tma_table_is_recorded_not_read():
    """kernel_model.hbm_read_tma loads (a grid, checked as the others) and is not read: launch plans
    with pointer and TMA loop forms and task plans with pointer and TMA weights predict as without
    it, here with a TMA table twice as fast as the main one (docs/cost-model.md: why it is not read)."""
    pts = [[1, 1e4, 1e9], [1, 1e7, 2e10], [132, 1e4, 1e12], [132, 1e7, 4e12]]
    p2 = _calibrated(hbm_read_tma={"unit": "bytes/s", "over": ["programs_in_flight", "bytes_per_program"],
                                   "source": "test", "points": [[n, b, 2 * r] for n, b, r in pts]})
    assert p2.kernel.hbm_tma_rate and p2.kernel.sources["hbm_read_tma"] == "test"
    assert _predictions(p2) == _predictions(_calibrated())
    d = copy.deepcopy(p2.to_dict())
    d["kernel_model"]["hbm_read_tma"]["points"].pop()
    with pytest.raises(ProfileError, match="hbm_read_tma.points must fill a grid"):
        validate(d)


def test_gemm1_tasks_that_route_the_token_pay_its_selection_first():
    """tiles["router"]["EACH"] (T = 1): each GEMM 1 task carries the top-k's selection passes before
    its K loop (task_costs "pre_s") and every other task none, and the prediction differs from the
    plan whose GEMM 1 waits for the top-k task; without the switch, no pre_s."""
    from megamoe.simulator.cost import serial_step_s

    p = _calibrated()
    counts = np.bincount(np.arange(CFG.top_k), minlength=CFG.num_experts)
    each = {**TILES, "router": {**TILES["router"], "EACH": 1, "TOPK_T": 1}}
    off = {**TILES, "router": {**TILES["router"], "TOPK_T": 1}}
    plan_on, plan_off = (task_plan(CFG, counts, 1, t, num_programs=8) for t in (each, off))
    c_on, c_off = task_costs(plan_on, p), task_costs(plan_off, p)
    g1 = c_on["kind"] == c_on["kinds"].index("gemm1")
    assert g1.any() and not c_off["pre_s"].any() and not c_on["pre_s"][~g1].any()
    assert np.allclose(c_on["pre_s"][g1], plan_on.topk_passes * serial_step_s(p, "reduce"))
    assert predict_task_plan(plan_on, p)["time_us"] != predict_task_plan(plan_off, p)["time_us"]
