"""The routing program's selection as calibrate times it and the cost model prices it: the microbenchmark
(megamoe/calibrate/microbench_route.py) under the interpreter, its table in a calibrated profile, and the router
stage priced from the table where its key matches, from the dependent reductions where not."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig

pytestmark = pytest.mark.interpret


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"])
def test_route_select_routes_every_block(name, device):
    """R blocks of BT tokens in one program: every token gets K distinct experts in range (softmax_topk:
    torch.topk's); the launcher refuses logits of another shape, naming the shape it wants."""
    from megamoe.calibrate.microbench_route import route_select

    if device.name != "cpu":
        pytest.skip("the interpreter's test (calibrate times it on the GPU)")
    cfg = MoEConfig.preset(name)
    E, K, bt = cfg.num_experts, cfg.top_k, 16
    g = torch.Generator().manual_seed(3)
    logits = torch.randn((3 * bt, E), generator=g)
    rb = torch.randn(E, generator=g) * 0.01 if cfg.router_bias else None
    sb = torch.randn(E, generator=g) * 0.01 if cfg.score_bias else None
    idx = route_select(logits, cfg, bt, 3, rb=rb, sb=sb, check=True)  # a 16-token batch's routing program
    assert idx.shape == (3 * bt, K) and int(idx.min()) >= 0 and int(idx.max()) < E
    assert all(len(set(row.tolist())) == K for row in idx)
    with pytest.raises(ValueError, match=rf"must be \({2 * bt}, {E}\)"):
        route_select(logits, cfg, bt, 2)


def test_select_cases_cover_the_presets_once():
    """One case per distinct key; DeepSeek-V3's grouped router and Qwen3's plain one both there, with
    the routers' 1-based family numbers (a profile table's values are positive)."""
    from megamoe.calibrate import select_cases
    from megamoe.calibrate.microbench_route import select_key

    cases = select_cases()
    keys = [k for k, _, _ in cases]
    assert len(keys) == len(set(keys)) and all(k[0] >= 1 for k in keys)
    assert select_key(MoEConfig.preset("deepseek-v3"), 32) in keys and select_key(MoEConfig.preset("qwen3-30b-a3b"), 16) in keys
    assert {k[4] for k in keys} == {16, 32} and {k[4] for k, _, _ in select_cases(quick=True)} == {32}
    # DeepSeek-V3's routing programs of one block (the fused align) and of many (the bitonic top-k) both
    ds = MoEConfig.preset("deepseek-v3")
    one, many = select_key(ds, 32), select_key(ds, 64)
    assert one[:5] == many[:5] and (one[5], many[5]) == (1.0, 2.0) and many in keys


def _router_stage(cfg, T):
    from megamoe.kernels.plan import launch_plan

    counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
    lp = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    return next(s for s in lp.stages if s.name == "router").to_dict()


def test_the_router_stage_reads_the_measured_selection(tmp_path):
    """A profile with a route_select point for DeepSeek-V3's routing program prices its router stage's
    serial term as that time (plus its other steps); without the point (Qwen3-30B-A3B), as topk_passes
    serial reduce steps, as before the table."""
    from megamoe.calibrate.microbench_route import select_key
    from megamoe.reference.tiles import topk_passes
    from megamoe.simulator.cost import predict_stage, route_select_s, serial_step_s
    from megamoe.simulator.hardware import load_profile

    ds, qw = MoEConfig.preset("deepseek-v3"), MoEConfig.preset("qwen3-30b-a3b")
    base = load_profile("h200").to_dict()
    st_ds, st_qw = _router_stage(ds, 64), _router_stage(qw, 64)
    key = select_key(ds, 64)
    base["kernel_model"] = {**base.get("kernel_model", {}), "route_select": {
        "unit": "s", "over": ["router", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC"], "points": [[*key, 5e-5]],
        "source": "test"}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(base))
    p, p0 = load_profile(str(path)), load_profile("h200")
    assert route_select_s(p, st_ds["tile"]) == 5e-5 and route_select_s(p, st_qw["tile"]) is None
    assert route_select_s(p0, st_ds["tile"]) is None
    with_table, without = predict_stage(st_ds, p), predict_stage(st_ds, p0)
    passes = topk_passes(ds) * serial_step_s(p0, "reduce")
    assert with_table.serial_us - without.serial_us == pytest.approx((5e-5 - passes) * 1e6)
    assert predict_stage(st_qw, p).serial_us == predict_stage(st_qw, p0).serial_us


def test_a_walking_routing_program_is_not_priced_from_the_table(tmp_path):
    """The table times routing programs that sum a logits launch's partials, at their warps; Qwen3-30B-A3B's
    prefill routing programs walk H at other warps (configs.router_warps(walks=True)): their stage carries
    no key, so a table point for the same sizes prices its decode stage only."""
    from megamoe.calibrate.microbench_route import select_key
    from megamoe.simulator.cost import route_select_s
    from megamoe.simulator.hardware import load_profile

    qw = MoEConfig.preset("qwen3-30b-a3b")
    base = load_profile("h200").to_dict()
    base["kernel_model"] = {**base.get("kernel_model", {}), "route_select": {
        "unit": "s", "over": ["router", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC"],
        "points": [[*select_key(qw, 64), 7e-6]], "source": "test"}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(base))
    p = load_profile(str(path))
    decode, prefill = _router_stage(qw, 64), _router_stage(qw, 4096)
    assert decode["tile"]["BLOCK_T"] == prefill["tile"]["BLOCK_T"] == 32
    assert route_select_s(p, decode["tile"]) == 7e-6 and route_select_s(p, prefill["tile"]) is None
